//! [`TrainerConfig`]: every knob of the GRPO loop, with the tutorial's defaults.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::reward::{DEFAULT_MAX_CONSECUTIVE_HANGS, GraderPool, MAX_GRADER_THREADS};
use crate::types::{AdamParams, LossFn};

/// The largest `batch_size` (problems per step) a config may ask for: far beyond any real
/// run, and small enough that every per-step count fits comfortably.
pub const MAX_BATCH_SIZE: usize = 1 << 20;
/// The largest `group_size` / `eval.group_size` (completions per problem) a config may ask
/// for.
pub const MAX_GROUP_SIZE: usize = 1 << 16;

/// How group-centred advantages are scaled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AdvantageScaling {
    /// `A = R − mean(R_group)` only (the cookbook's choice, following Dr. GRPO).
    #[default]
    None,
    /// Divide by the standard deviation of the group's rewards (the original GRPO).
    Group,
    /// Divide by the standard deviation of all rewards of the batch.
    Batch,
}

/// How each datum's per-token loss terms are weighted before they are summed (`loss:sum`):
/// the normaliser of the policy-gradient objective. With `ℓ_{i,t}` the loss term of token `t`
/// of completion `i` (`|o_i|` action tokens), the objective is `Σ_i Σ_t c_i ℓ_{i,t}` with
///
/// | variant | `c_i` | from |
/// |---|---|---|
/// | `Sum` | 1 | the cookbook and Tinker's losses as they are (default) |
/// | `SequenceMean` | `1 / \|o_i\|` | the GRPO paper's per-sequence mean |
/// | `TokenMean` | `1 / Σ_j \|o_j\|` over the step's batch | DAPO's token-level loss |
/// | `Constant(C)` | `1 / C` | Dr. GRPO's constant normaliser (e.g. `max_tokens`) |
///
/// Applied by scaling the datums' advantages (after the KL penalty is folded in), which is
/// exact for importance sampling, PPO and CISPO (positively homogeneous in the advantage), on
/// Tinker and on the local backend alike; with DRO (not proportional to the advantage) only
/// `Sum` is accepted. `TokenMean`'s
/// batch is the step's datums; with `stream_minibatches`, each minibatch's (the later ones are
/// not sampled yet when one goes out). `TokenMean` and `Constant` scale a whole step by one
/// number, which Adam's update all but ignores (only `adam_eps` sees it); `SequenceMean`
/// changes the weighting between completions.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LossAggregation {
    /// Every token term counts once.
    #[default]
    Sum,
    /// Each completion's terms divided by its number of action tokens.
    SequenceMean,
    /// Every term divided by the batch's number of action tokens.
    TokenMean,
    /// Every term divided by a constant (> 0).
    Constant(f64),
}

impl LossAggregation {
    /// The weight `c_i` of a completion of `tokens` action tokens in a batch of
    /// `batch_tokens`.
    pub fn weight(self, tokens: f64, batch_tokens: f64) -> f64 {
        match self {
            LossAggregation::Sum => 1.0,
            LossAggregation::SequenceMean => 1.0 / tokens.max(1.0),
            LossAggregation::TokenMean => 1.0 / batch_tokens.max(1.0),
            LossAggregation::Constant(c) => 1.0 / c,
        }
    }
}

/// Sampling settings of the evaluation pass.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct EvalConfig {
    /// Temperature (default 1.0 like the cookbook; 0 is greedy).
    pub temperature: f32,
    /// Most tokens per completion (`None`: the training `max_tokens`).
    pub max_tokens: Option<u32>,
    /// Completions per problem (default 1).
    pub group_size: usize,
    /// Evaluate only the first `n` problems of the eval dataset (`None`: all).
    pub max_problems: Option<usize>,
}

impl Default for EvalConfig {
    fn default() -> Self {
        EvalConfig {
            temperature: 1.0,
            max_tokens: None,
            group_size: 1,
            max_problems: None,
        }
    }
}

/// Configuration of a [`GrpoTrainer`](super::GrpoTrainer) run.
///
/// Defaults follow the cookbook's first-RL tutorial: 16 problems per step, 8 samples per
/// problem, 256 tokens, Adam at 4e-5 with β = (0.9, 0.95), the `importance_sampling` loss,
/// temperature 1.0. Build one with [`TrainerConfig::builder`] (validated) or deserialize it
/// (every field optional); [`validate`](Self::validate) reports the first bad field.
///
/// ```
/// use rlvr::TrainerConfig;
/// let config = TrainerConfig::builder().batch_size(4).group_size(2).max_steps(3).build().unwrap();
/// assert_eq!((config.batch_size, config.group_size, config.max_tokens), (4, 2, 256));
/// let parsed: TrainerConfig = serde_json::from_str(r#"{"learning_rate": 1e-5}"#).unwrap();
/// assert_eq!(parsed.batch_size, 16);
/// assert!(TrainerConfig::builder().group_size(0).build().is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct TrainerConfig {
    /// Problems (groups) per step (at most [`MAX_BATCH_SIZE`]).
    pub batch_size: usize,
    /// Completions sampled per problem (the GRPO group; at most [`MAX_GROUP_SIZE`]).
    pub group_size: usize,
    /// Most tokens per completion.
    pub max_tokens: u32,
    /// Sampling temperature for training rollouts.
    pub temperature: f32,
    /// Adam learning rate (constant).
    pub learning_rate: f64,
    /// Adam β1.
    pub adam_beta1: f64,
    /// Adam β2.
    pub adam_beta2: f64,
    /// Adam ε (the cookbook trainer passes 1e-8).
    pub adam_eps: f64,
    /// Decoupled weight decay (0: off).
    pub weight_decay: f64,
    /// Global gradient-norm clip (0: off).
    pub grad_clip_norm: f64,
    /// The policy-gradient loss and its parameters.
    pub loss: LossFn,
    /// Seed of the data order and of the sampling seeds.
    pub seed: u64,
    /// Shuffle the training set (reshuffled every epoch); `false` walks it in order.
    pub shuffle: bool,
    /// Passes over the training set when `max_steps` is not set.
    pub num_epochs: usize,
    /// Number of steps (`None`: `num_epochs · len / batch_size`, at least 1).
    pub max_steps: Option<u64>,
    /// Keep groups whose rewards are all equal (their advantages are 0). Off by default,
    /// like the tutorial: they add no gradient but cost training compute. Refused with
    /// [`dynamic_sampling_rounds`](Self::dynamic_sampling_rounds), which replaces such groups.
    pub keep_degenerate_groups: bool,
    /// DAPO's dynamic sampling: at most this many extra rounds of `batch_size` groups per
    /// step, sampled while fewer than `batch_size` groups with differing rewards are in (0:
    /// off, the default). The step trains on the first `batch_size` such groups in (round,
    /// group) order, or on all of them when the last round still leaves the batch short.
    /// Extra rounds draw their problems from a second seeded pass over the dataset, so the
    /// main data order is unchanged and a resumed run samples the same groups. Refused with
    /// `keep_degenerate_groups`.
    pub dynamic_sampling_rounds: usize,
    /// Scaling of the centred advantages.
    pub advantage_scaling: AdvantageScaling,
    /// How the per-token loss terms are normalised ([`LossAggregation`]; default `Sum`).
    pub loss_aggregation: LossAggregation,
    /// Give truncated completions (stopped by `max_tokens`) no gradient. Their reward still
    /// counts in the group mean.
    pub mask_truncated: bool,
    /// Seconds a reward function may take per completion before it counts as a failure.
    pub reward_timeout_s: f64,
    /// The most OS threads the run's rewards run on, hung ones included (0: automatic,
    /// [`GraderPool::default_threads`], `max(64, 2 × cores)`; at most
    /// [`MAX_GRADER_THREADS`]). A grade waits for a free thread; a reward that times out
    /// keeps its thread until it returns.
    pub grader_threads: usize,
    /// Reward timeouts in a row that stop the run with
    /// [`Error::RewardHung`](crate::Error::RewardHung) (0: never; default
    /// [`DEFAULT_MAX_CONSECUTIVE_HANGS`] = 16). Any grade that finishes in time resets the
    /// count.
    pub max_consecutive_reward_hangs: usize,
    /// Datum chunks per step, each with its own `forward_backward` + `optim_step`.
    pub num_substeps: usize,
    /// `forward_backward` calls per optimizer step (gradients accumulate across them).
    pub num_minibatches: usize,
    /// Stream minibatches: submit each minibatch's `forward_backward` as soon as its groups
    /// are graded, while the rest of the batch is still sampling (needs `num_substeps = 1`
    /// and group-local advantages).
    pub stream_minibatches: bool,
    /// Most policy turns of one episode (multi-turn environments).
    pub max_turns: usize,
    /// Batches sampled ahead while the trainer trains (0: on-policy). Batch `i` may then come
    /// from the policy of up to this many updates before. Never more than the steps left are
    /// sampled ahead, so any value is safe.
    pub max_steps_off_policy: u64,
    /// Reference-model KL penalty folded into the advantages (0: off).
    pub kl_penalty_coef: f64,
    /// Discount of the KL penalty over later tokens (0: per-token only).
    pub kl_discount_factor: f64,
    /// Evaluate every this many steps and at the end (0: never; needs an eval dataset).
    pub eval_every: u64,
    /// Sampling settings of evaluation.
    pub eval: EvalConfig,
    /// Save a checkpoint every this many steps and at the end (0: only at the end).
    pub save_every: u64,
    /// Run directory (`None`: nothing is written).
    pub log_dir: Option<PathBuf>,
    /// Write the step's completions under `samples/` (`NNNNNN.jsonl` + `.html`).
    pub log_samples: bool,
    /// How many groups of each step `samples/` holds: the first ones of the step, in batch
    /// order, every completion of each (like the cookbook's `num_groups_to_log`, 4). `None`:
    /// every group. Decoding and escaping every completion of a large batch each step costs
    /// more client CPU than the rest of a remote step, hence the default `Some(4)`.
    pub log_sample_groups: Option<usize>,
    /// Show progress bars (plain lines when stdout is not a terminal).
    pub progress: bool,
    /// Also write the metrics as a TensorBoard event file in the run directory
    /// ([`TensorBoardSink`](crate::report::TensorBoardSink), which TensorBoard and W&B
    /// read); needs `log_dir` and the `tensorboard` feature. Off by default; a resume may
    /// turn it on or off.
    pub tensorboard: bool,
    /// The registry name of the renderer the run uses
    /// ([`Renderer::name`](crate::Renderer::name), e.g. `"llama3"`), so that the run
    /// directory's `config.json` records it. Normally left unset:
    /// [`GrpoTrainer::new`](super::GrpoTrainer::new) fills it in from the renderer it is given
    /// (and refuses a config that names another one). Resuming a run whose checkpoint was
    /// trained with another renderer is refused.
    pub renderer_name: Option<String>,
}

impl Default for TrainerConfig {
    fn default() -> Self {
        TrainerConfig {
            batch_size: 16,
            group_size: 8,
            max_tokens: 256,
            temperature: 1.0,
            learning_rate: 4e-5,
            adam_beta1: 0.9,
            adam_beta2: 0.95,
            adam_eps: 1e-8,
            weight_decay: 0.0,
            grad_clip_norm: 0.0,
            loss: LossFn::ImportanceSampling,
            seed: 0,
            shuffle: true,
            num_epochs: 1,
            max_steps: None,
            keep_degenerate_groups: false,
            dynamic_sampling_rounds: 0,
            advantage_scaling: AdvantageScaling::None,
            loss_aggregation: LossAggregation::Sum,
            mask_truncated: false,
            reward_timeout_s: 30.0,
            grader_threads: 0,
            max_consecutive_reward_hangs: DEFAULT_MAX_CONSECUTIVE_HANGS,
            num_substeps: 1,
            num_minibatches: 1,
            stream_minibatches: false,
            max_turns: 32,
            max_steps_off_policy: 0,
            kl_penalty_coef: 0.0,
            kl_discount_factor: 0.0,
            eval_every: 20,
            eval: EvalConfig::default(),
            save_every: 20,
            log_dir: None,
            log_samples: true,
            log_sample_groups: Some(4),
            progress: true,
            tensorboard: false,
            renderer_name: None,
        }
    }
}

fn check(ok: bool, field: &str, message: impl FnOnce() -> String) -> Result<()> {
    if ok {
        Ok(())
    } else {
        Err(Error::config(field, message()))
    }
}

impl TrainerConfig {
    /// A builder starting from the defaults.
    pub fn builder() -> TrainerConfigBuilder {
        TrainerConfigBuilder {
            config: TrainerConfig::default(),
        }
    }

    /// The optimizer parameters of one step.
    pub fn adam(&self) -> AdamParams {
        AdamParams {
            learning_rate: self.learning_rate,
            beta1: self.adam_beta1,
            beta2: self.adam_beta2,
            eps: self.adam_eps,
            weight_decay: self.weight_decay,
            grad_clip_norm: self.grad_clip_norm,
        }
    }

    /// The reward timeout as a [`Duration`]. Never panics: a value too large for a
    /// `Duration` (which [`validate`](Self::validate) refuses) saturates to the largest one,
    /// and a negative or NaN one (also refused) gives zero.
    pub fn reward_timeout(&self) -> Duration {
        match Duration::try_from_secs_f64(self.reward_timeout_s) {
            Ok(d) => d,
            Err(_) if self.reward_timeout_s > 0.0 => Duration::MAX,
            Err(_) => Duration::ZERO,
        }
    }

    /// The bounded pool the run's rewards run on: [`grader_threads`](Self::grader_threads)
    /// threads (0: automatic), stopping after
    /// [`max_consecutive_reward_hangs`](Self::max_consecutive_reward_hangs) timeouts in a row.
    ///
    /// ```
    /// use rlvr::TrainerConfig;
    /// let config = TrainerConfig::builder().grader_threads(8).max_consecutive_reward_hangs(4).build().unwrap();
    /// let pool = config.grader_pool();
    /// assert_eq!((pool.threads(), pool.max_consecutive_hangs()), (8, 4));
    /// ```
    pub fn grader_pool(&self) -> GraderPool {
        GraderPool::new(self.grader_threads, self.max_consecutive_reward_hangs)
    }

    /// Checks every field; the error names the first bad one.
    pub fn validate(&self) -> Result<()> {
        check(
            (1..=MAX_BATCH_SIZE).contains(&self.batch_size),
            "batch_size",
            || format!("must be in 1..={MAX_BATCH_SIZE}, got {}", self.batch_size),
        )?;
        check(self.group_size >= 2, "group_size", || {
            format!(
                "must be at least 2, got {}: GRPO needs at least 2 samples per problem to \
                 compute group-relative advantages (with 1, every group is degenerate and \
                 nothing is learned)",
                self.group_size
            )
        })?;
        check(self.group_size <= MAX_GROUP_SIZE, "group_size", || {
            format!("must be at most {MAX_GROUP_SIZE}, got {}", self.group_size)
        })?;
        check(self.max_tokens > 0, "max_tokens", || {
            "must be at least 1".into()
        })?;
        check(
            self.log_sample_groups != Some(0),
            "log_sample_groups",
            || "must be at least 1 (None: every group; log_samples = false writes none)".into(),
        )?;
        check(
            self.temperature.is_finite() && self.temperature >= 0.0,
            "temperature",
            || format!("must be a finite number ≥ 0, got {}", self.temperature),
        )?;
        check(
            self.learning_rate.is_finite() && self.learning_rate > 0.0,
            "learning_rate",
            || format!("must be a finite number > 0, got {}", self.learning_rate),
        )?;
        for (name, b) in [
            ("adam_beta1", self.adam_beta1),
            ("adam_beta2", self.adam_beta2),
        ] {
            check((0.0..1.0).contains(&b), name, || {
                format!("must be in [0, 1), got {b}")
            })?;
        }
        check(
            self.adam_eps.is_finite() && self.adam_eps > 0.0,
            "adam_eps",
            || format!("must be > 0, got {}", self.adam_eps),
        )?;
        check(
            self.weight_decay.is_finite() && self.weight_decay >= 0.0,
            "weight_decay",
            || format!("must be ≥ 0, got {}", self.weight_decay),
        )?;
        check(
            self.grad_clip_norm.is_finite() && self.grad_clip_norm >= 0.0,
            "grad_clip_norm",
            || format!("must be ≥ 0, got {}", self.grad_clip_norm),
        )?;
        match self.loss {
            LossFn::CrossEntropy => {
                return Err(Error::config(
                    "loss",
                    "cross_entropy is a supervised loss; use importance_sampling, ppo, cispo or dro",
                ));
            }
            LossFn::ImportanceSampling => {}
            LossFn::Ppo {
                clip_low_threshold: lo,
                clip_high_threshold: hi,
            }
            | LossFn::Cispo {
                clip_low_threshold: lo,
                clip_high_threshold: hi,
            } => check(
                hi.is_finite() && (0.0..=1.0).contains(&lo) && hi >= 1.0,
                "loss.clip_low_threshold",
                || format!("ratio bounds must satisfy 0 ≤ low ≤ 1 ≤ high, got ({lo}, {hi})"),
            )?,
            LossFn::Dro { beta } => check(beta.is_finite() && beta >= 0.0, "loss.beta", || {
                format!("must be ≥ 0, got {beta}")
            })?,
        }
        check(self.num_epochs > 0, "num_epochs", || {
            "must be at least 1".into()
        })?;
        check(self.max_steps != Some(0), "max_steps", || {
            "must be at least 1 (or unset)".into()
        })?;
        check(
            self.reward_timeout_s > 0.0
                && Duration::try_from_secs_f64(self.reward_timeout_s).is_ok(),
            "reward_timeout_s",
            || {
                format!(
                    "must be a finite number of seconds > 0, got {}",
                    self.reward_timeout_s
                )
            },
        )?;
        check(
            self.grader_threads <= MAX_GRADER_THREADS,
            "grader_threads",
            || {
                format!(
                    "must be at most {MAX_GRADER_THREADS} (0: automatic), got {}",
                    self.grader_threads
                )
            },
        )?;
        check(self.max_turns > 0, "max_turns", || {
            "must be at least 1".into()
        })?;
        check(
            self.loss_aggregation == LossAggregation::Sum
                || !matches!(self.loss, LossFn::Dro { .. } | LossFn::CrossEntropy),
            "loss_aggregation",
            || {
                format!(
                    "{:?} scales the advantages, which weights the loss exactly only for \
                     importance_sampling, ppo and cispo; {} is not proportional to them",
                    self.loss_aggregation,
                    self.loss.name()
                )
            },
        )?;
        if let LossAggregation::Constant(c) = self.loss_aggregation {
            check(c.is_finite() && c > 0.0, "loss_aggregation", || {
                format!("the constant normaliser must be finite and > 0, got {c}")
            })?;
        }
        check(
            self.dynamic_sampling_rounds == 0 || !self.keep_degenerate_groups,
            "dynamic_sampling_rounds",
            || {
                "cannot be used with keep_degenerate_groups: dynamic sampling replaces the \
                 groups whose rewards are all equal instead of training on them"
                    .into()
            },
        )?;
        check(
            (self.dynamic_sampling_rounds as u64)
                .checked_add(1)
                .and_then(|r| r.checked_mul(self.batch_size as u64))
                .is_some(),
            "dynamic_sampling_rounds",
            || {
                format!(
                    "{} rounds of {} groups overflow",
                    self.dynamic_sampling_rounds, self.batch_size
                )
            },
        )?;
        check(self.num_substeps > 0, "num_substeps", || {
            "must be at least 1".into()
        })?;
        check(self.num_minibatches > 0, "num_minibatches", || {
            "must be at least 1".into()
        })?;
        if self.stream_minibatches {
            check(self.num_substeps == 1, "stream_minibatches", || {
                format!(
                    "needs num_substeps = 1 (got {}); streaming makes one optimizer step per batch",
                    self.num_substeps
                )
            })?;
            check(
                self.advantage_scaling != AdvantageScaling::Batch,
                "stream_minibatches",
                || {
                    "needs group-local advantages; advantage_scaling = batch needs the whole batch first".into()
                },
            )?;
        }
        check(
            self.kl_penalty_coef.is_finite() && self.kl_penalty_coef >= 0.0,
            "kl_penalty_coef",
            || format!("must be ≥ 0, got {}", self.kl_penalty_coef),
        )?;
        check(
            (0.0..=1.0).contains(&self.kl_discount_factor),
            "kl_discount_factor",
            || format!("must be in [0, 1], got {}", self.kl_discount_factor),
        )?;
        check(
            self.eval.temperature.is_finite() && self.eval.temperature >= 0.0,
            "eval.temperature",
            || format!("must be a finite number ≥ 0, got {}", self.eval.temperature),
        )?;
        check(
            (1..=MAX_GROUP_SIZE).contains(&self.eval.group_size),
            "eval.group_size",
            || {
                format!(
                    "must be in 1..={MAX_GROUP_SIZE}, got {}",
                    self.eval.group_size
                )
            },
        )?;
        check(self.eval.max_tokens != Some(0), "eval.max_tokens", || {
            "must be at least 1 (or unset)".into()
        })?;
        check(
            !self.tensorboard || cfg!(feature = "tensorboard"),
            "tensorboard",
            || "needs rlvr's `tensorboard` feature".into(),
        )?;
        check(
            !self.tensorboard || self.log_dir.is_some(),
            "tensorboard",
            || "needs a run directory (`log_dir`) to write its event file in".into(),
        )?;
        Ok(())
    }
}

/// Builds a validated [`TrainerConfig`]; every setter names the field it sets.
#[derive(Debug, Clone)]
pub struct TrainerConfigBuilder {
    config: TrainerConfig,
}

macro_rules! setters {
    ($($(#[$doc:meta])* $name:ident : $ty:ty),* $(,)?) => {
        $(
            $(#[$doc])*
            pub fn $name(mut self, value: $ty) -> Self {
                self.config.$name = value;
                self
            }
        )*
    };
}

impl TrainerConfigBuilder {
    setters! {
        /// Problems per step.
        batch_size: usize,
        /// Completions per problem.
        group_size: usize,
        /// Most tokens per completion.
        max_tokens: u32,
        /// Sampling temperature.
        temperature: f32,
        /// Adam learning rate.
        learning_rate: f64,
        /// Adam β1.
        adam_beta1: f64,
        /// Adam β2.
        adam_beta2: f64,
        /// Adam ε.
        adam_eps: f64,
        /// Weight decay.
        weight_decay: f64,
        /// Gradient-norm clip.
        grad_clip_norm: f64,
        /// The loss.
        loss: LossFn,
        /// Seed.
        seed: u64,
        /// Shuffle the training data.
        shuffle: bool,
        /// Passes over the data.
        num_epochs: usize,
        /// Keep all-equal groups.
        keep_degenerate_groups: bool,
        /// Most extra sampling rounds per step of DAPO's dynamic sampling (0: off; see
        /// [`TrainerConfig::dynamic_sampling_rounds`]).
        dynamic_sampling_rounds: usize,
        /// Advantage scaling.
        advantage_scaling: AdvantageScaling,
        /// Loss normalisation.
        loss_aggregation: LossAggregation,
        /// Mask truncated completions.
        mask_truncated: bool,
        /// Reward timeout in seconds.
        reward_timeout_s: f64,
        /// Most grading threads (0: automatic).
        grader_threads: usize,
        /// Reward timeouts in a row that stop the run (0: never).
        max_consecutive_reward_hangs: usize,
        /// Optimizer steps per training step.
        num_substeps: usize,
        /// `forward_backward` calls per optimizer step.
        num_minibatches: usize,
        /// Stream minibatches while sampling.
        stream_minibatches: bool,
        /// Most turns per episode.
        max_turns: usize,
        /// Batches sampled ahead while training.
        max_steps_off_policy: u64,
        /// KL penalty coefficient.
        kl_penalty_coef: f64,
        /// KL discount factor.
        kl_discount_factor: f64,
        /// Evaluation period in steps (0: off).
        eval_every: u64,
        /// Evaluation sampling settings.
        eval: EvalConfig,
        /// Checkpoint period in steps (0: only at the end).
        save_every: u64,
        /// Write per-step samples.
        log_samples: bool,
        /// Groups per step in `samples/` (`None`: every group).
        log_sample_groups: Option<usize>,
        /// Show progress bars.
        progress: bool,
        /// Write a TensorBoard event file in the run directory (see
        /// [`TrainerConfig::tensorboard`]).
        tensorboard: bool,
    }

    /// Number of steps.
    pub fn max_steps(mut self, steps: u64) -> Self {
        self.config.max_steps = Some(steps);
        self
    }

    /// The renderer's registry name (normally filled in by
    /// [`GrpoTrainer::new`](super::GrpoTrainer::new); see
    /// [`TrainerConfig::renderer_name`]).
    pub fn renderer_name(mut self, name: impl Into<String>) -> Self {
        self.config.renderer_name = Some(name.into());
        self
    }

    /// Run directory.
    pub fn log_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.config.log_dir = Some(dir.into());
        self
    }

    /// The validated configuration.
    pub fn build(self) -> Result<TrainerConfig> {
        self.config.validate()?;
        Ok(self.config)
    }
}

#[cfg(test)]
mod tests;
