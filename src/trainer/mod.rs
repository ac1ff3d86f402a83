//! The GRPO trainer. One step is six phases, each a function in a file named for it
//! (`docs/architecture.md` walks one step through them):
//!
//! 1. sample (`sample.rs`): the step's batch of problems (deterministic shuffle by seed,
//!    reshuffled per epoch), one group of environments per problem — a single-turn problem
//!    is a [`ProblemEnv`] — and each group's first turn sampled (one `sample` call of
//!    `group_size` completions per prompt, all prompts concurrently);
//! 2. grade (`grade.rs`): every environment fed its action: the response parsed and graded
//!    with the reward under a timeout (a failure, timeout or panic counts as reward 0 and is
//!    counted in `reward_errors/...`); multi-turn environments continue until done;
//! 3. advantages (`advantages.rs`): `A_i = R_i − mean(R_group)` (optionally scaled); groups
//!    whose rewards are all equal are skipped by default;
//! 4. datums (`datums.rs`): one datum per completion, the optional
//!    reference-KL penalty folded in;
//! 5. train (`train.rs`): `forward_backward` submitted, then `optim_step` submitted before
//!    the gradients are awaited (per substep / minibatch); then a new sampler for the
//!    updated weights;
//! 6. log (`log.rs`): a metrics row (`metrics.jsonl`), the cumulative counters, the samples.
//!
//! `grpo.rs` holds the trainer, its constructor and builders, and the loops that call the
//! phases in order; `dynamic.rs` holds DAPO's dynamic sampling (the extra rounds' problems
//! and seeds, which groups are kept); `stream.rs` runs phases 1–4 per group for streamed minibatches,
//! `eval.rs` evaluates, `resume.rs` sets up and resumes.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::types::CheckpointRef;

mod advantages;
pub(crate) mod config;
mod datums;
mod dynamic;
mod env;
mod eval;
mod grade;
pub(crate) mod grpo;
mod log;
mod metrics;
mod prefetch;
mod resume;
mod rollout;
mod sample;
mod stream;
mod train;

pub(crate) use config::TrainerConfig;
pub use config::{
    AdvantageScaling, EvalConfig, LossAggregation, MAX_BATCH_SIZE, MAX_GROUP_SIZE,
    TrainerConfigBuilder,
};
pub use env::{Env, EnvBuilder, Observation, ProblemEnv, ProblemEnvBuilder, StepResult};
pub use eval::Evaluator;
pub(crate) use grpo::GrpoTrainer;
pub use metrics::StepMetrics;
pub use resume::LoopState;
pub use rollout::{Completion, Group, Turn};

/// What [`GrpoTrainer::run`] did.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RunSummary {
    /// The step the run started at (> 0 when it resumed).
    pub start_step: u64,
    /// Steps this call ran.
    pub steps_run: u64,
    /// Total steps of the run.
    pub total_steps: u64,
    /// The metrics of the last step run.
    pub last_step: Option<StepMetrics>,
    /// The final evaluation's metrics (`test/...`), if any.
    pub final_eval: Option<BTreeMap<String, f64>>,
    /// The final checkpoint, if one was saved.
    pub final_checkpoint: Option<CheckpointRef>,
    /// The run directory, if any.
    pub run_dir: Option<PathBuf>,
}
