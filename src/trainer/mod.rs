//! The GRPO trainer: rollouts, group advantages, datum assembly, the pipelined train step,
//! evaluation, checkpoints and resume, and the run directory.
//!
//! One step (see `docs/training.md`):
//!
//! 1. take the step's batch of problems (deterministic shuffle by seed, reshuffled per epoch);
//! 2. render every prompt and sample `group_size` completions of each, all prompts
//!    concurrently (one `sample` call per prompt);
//! 3. parse each completion and grade it with the reward under a timeout (a failure, timeout
//!    or panic counts as reward 0 and is counted in `reward_errors/...`);
//! 4. advantages `A_i = R_i − mean(R_group)` (optionally scaled); groups whose rewards are all
//!    equal are skipped by default;
//! 5. one datum per completion ([`build_datum`]), the optional reference-KL penalty folded in;
//! 6. `forward_backward` submitted, then `optim_step` submitted before the gradients are
//!    awaited (per substep / minibatch);
//! 7. a new sampler for the updated weights; a metrics row (`metrics.jsonl`).

use std::collections::{BTreeMap, VecDeque};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use serde::{Deserialize, Serialize};
use tracing::Instrument;

use crate::backend::{Pending, PolicyBackend, Sampler};
use crate::dataset::{Dataset, Problem};
use crate::error::{Error, Result};
use crate::renderer::Renderer;
use crate::report::{CheckpointRecord, Progress, ProgressMode, RunDir, SampleRecord};
use crate::reward::RewardFn;
use crate::types::{
    CheckpointRef, ForwardBackwardOutput, ModelInput, OptimStepOutput, SamplingParams,
};

mod config;
mod data;
mod env;
mod eval;
mod metrics;
mod rollout;

pub use config::{
    AdvantageScaling, EvalConfig, TrainerConfig, TrainerConfigBuilder, MAX_BATCH_SIZE,
    MAX_GROUP_SIZE,
};
pub use data::{
    apply_kl_penalty, build_datum, chunk_bounds, compute_advantages, is_degenerate, TrainDatum,
};
pub use env::{Env, EnvBuilder, Observation, ProblemEnv, ProblemEnvBuilder, StepResult};
pub use eval::Evaluator;
pub use metrics::StepMetrics;
pub use rollout::{Completion, Group, Turn};

/// State of the loop that a checkpoint stores (besides the backend's weights and optimizer).
///
/// Every random choice of the loop (data order, sampling seeds) is a function of the seed
/// and the step index, so `next_step` is the whole data cursor and RNG state.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LoopState {
    /// The next step to run (= number of steps done).
    pub next_step: u64,
    /// The seed of the data order and the sampling seeds.
    pub seed: u64,
    /// Position in the stream of training problems (`next_step · batch_size`).
    pub data_cursor: u64,
    /// A random id of the run, prefixed to the backend's checkpoint names so that runs
    /// sharing a checkpoint store (the local backend's cache directory) never overwrite each
    /// other's `000020` or `final`.
    #[serde(default)]
    pub run_id: String,
    /// Cumulative counters (`tokens/sampled`, `tokens/trained`, `reward_errors/total`,
    /// `train/datums`, `train/updates`).
    pub cumulative: BTreeMap<String, f64>,
    /// Whether the data order is shuffled (checked on resume; `None` in checkpoints written
    /// before it was recorded).
    #[serde(default)]
    pub shuffle: Option<bool>,
    /// The training dataset's length (checked on resume: another length changes the data
    /// order; `None` in checkpoints written before it was recorded).
    #[serde(default)]
    pub dataset_len: Option<u64>,
    /// The renderer's registry name (checked on resume: another renderer changes the tokens
    /// the policy was trained on; `None` in checkpoints written before it was recorded).
    #[serde(default)]
    pub renderer: Option<String>,
}

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

/// What a streaming rollout produced: the rollout, the datums in submission order, their
/// submitted `forward_backward`s, and the KL penalty's running sums.
#[derive(Default)]
struct Streamed {
    rollout: Option<Rollout>,
    advantages: Vec<Vec<f64>>,
    train_data: Vec<TrainDatum>,
    fb: Vec<(std::ops::Range<usize>, Pending<ForwardBackwardOutput>)>,
    masked_truncated: usize,
    kl_sum: f64,
    kl_tokens: f64,
}

/// A batch of graded groups, with the time it took.
struct Rollout {
    step: u64,
    groups: Vec<Group>,
    time_sampling: f64,
    time_grading: f64,
}

/// The GRPO trainer over a backend `B` and a reward `R`.
///
/// ```no_run
/// # async fn demo<B: rlvr::PolicyBackend>(backend: B, renderer: std::sync::Arc<dyn rlvr::Renderer>,
/// #     train: std::sync::Arc<dyn rlvr::Dataset>) -> rlvr::Result<()> {
/// use rlvr::trainer::{GrpoTrainer, TrainerConfig};
/// let reward = |p: &rlvr::Problem, text: &str| if text.contains(&p.answer) { 1.0 } else { 0.0 };
/// let config = TrainerConfig::builder().max_steps(10).log_dir("runs/demo").build()?;
/// let mut trainer = GrpoTrainer::new(backend, reward, renderer, train, config)?;
/// let summary = trainer.run().await?;
/// println!("{:?}", summary.last_step.map(|m| m.reward_mean));
/// # Ok(()) }
/// ```
pub struct GrpoTrainer<B: PolicyBackend, R: RewardFn> {
    backend: B,
    reward: Arc<R>,
    renderer: Arc<dyn Renderer>,
    dataset: Arc<dyn Dataset>,
    eval_dataset: Option<Arc<dyn Dataset>>,
    evaluators: Vec<Box<dyn Evaluator<B::Sampler>>>,
    env_builder: Option<Arc<dyn EnvBuilder>>,
    config: TrainerConfig,
    state: LoopState,
    total_steps: u64,
    sampler: Option<B::Sampler>,
    reference: Option<B::Sampler>,
    run_dir: Option<RunDir>,
    progress: Progress,
    set_up: bool,
    prefetched: VecDeque<Rollout>,
    /// The last checkpoint when the run directory holds a finished run (its step is at or
    /// past `total_steps`): [`run`](Self::run) then only reports it.
    finished: Option<CheckpointRecord>,
    /// What the caller said about the run, stored under `"run"` in `config.json`.
    run_metadata: Option<serde_json::Value>,
}

impl<B: PolicyBackend, R: RewardFn> std::fmt::Debug for GrpoTrainer<B, R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrpoTrainer")
            .field("config", &self.config)
            .field("state", &self.state)
            .field("total_steps", &self.total_steps)
            .finish_non_exhaustive()
    }
}

/// SplitMix64 of three words: per-(step, prompt) sampling seeds, in `0..2^31`.
///
/// The seeds are sent to the backend as given, and sampling engines behind some
/// Tinker-compatible servers take only 32-bit seeds (JAX refuses larger ones), so the
/// trainer keeps the top 31 bits of the mix: a non-negative `int32` every server accepts.
fn mix(a: u64, b: u64, c: u64) -> u64 {
    let mut z = a ^ b.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ c.wrapping_mul(0xD6E8_FEB8_6659_FD93);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    (z ^ (z >> 31)) >> 33
}

/// Seed domain of evaluation sampling (keeps it apart from training sampling).
const EVAL_DOMAIN: u64 = 0x4556_414c;

impl<B: PolicyBackend, R: RewardFn> GrpoTrainer<B, R> {
    /// A trainer over `backend`, grading with `reward`, rendering with `renderer`, training
    /// on `dataset`. The config's [`renderer_name`](TrainerConfig::renderer_name) is set to
    /// the renderer's [`name`](Renderer::name), so `config.json` records it. Fails with
    /// [`Error::Config`] when the config is invalid, names another renderer, or the dataset
    /// is empty.
    pub fn new(
        backend: B,
        reward: impl Into<Arc<R>>,
        renderer: Arc<dyn Renderer>,
        dataset: Arc<dyn Dataset>,
        mut config: TrainerConfig,
    ) -> Result<Self> {
        config.validate()?;
        let renderer_name = renderer.name().to_owned();
        match &config.renderer_name {
            Some(named) if *named != renderer_name => {
                return Err(Error::config(
                    "renderer_name",
                    format!(
                        "the config names renderer `{named}`, but the trainer was given `{renderer_name}`"
                    ),
                ))
            }
            _ => config.renderer_name = Some(renderer_name),
        }
        if dataset.is_empty() {
            return Err(Error::config("dataset", "the training dataset is empty"));
        }
        let dataset_len = dataset.len() as u64;
        let per_epoch = (dataset.len() / config.batch_size).max(1) as u64;
        let total_steps = config
            .max_steps
            .unwrap_or(per_epoch.saturating_mul(config.num_epochs as u64));
        Ok(GrpoTrainer {
            backend,
            reward: reward.into(),
            renderer,
            dataset,
            eval_dataset: None,
            evaluators: Vec::new(),
            env_builder: None,
            state: LoopState {
                seed: config.seed,
                shuffle: Some(config.shuffle),
                dataset_len: Some(dataset_len),
                renderer: config.renderer_name.clone(),
                ..LoopState::default()
            },
            config,
            total_steps,
            sampler: None,
            reference: None,
            run_dir: None,
            progress: Progress::with_mode(0, ProgressMode::Hidden),
            set_up: false,
            prefetched: VecDeque::new(),
            finished: None,
            run_metadata: None,
        })
    }

    /// Adds a held-out dataset, evaluated every `eval_every` steps and at the end
    /// (`test/...` metrics).
    pub fn with_eval_dataset(mut self, dataset: Arc<dyn Dataset>) -> Self {
        self.eval_dataset = Some(dataset);
        self
    }

    /// Attaches a description of the run (model name, backend kind, renderer, dataset...),
    /// written under `"run"` in `config.json` next to the config's own fields (secrets
    /// redacted like the config's).
    ///
    /// ```no_run
    /// # fn demo<B: rlvr::PolicyBackend, R: rlvr::RewardFn>(t: rlvr::trainer::GrpoTrainer<B, R>) {
    /// let t = t.with_run_metadata(serde_json::json!({
    ///     "model": "Qwen/Qwen3-0.6B", "backend": "local", "renderer": "role_colon", "dataset": "gsm8k",
    /// }));
    /// # }
    /// ```
    pub fn with_run_metadata(mut self, metadata: serde_json::Value) -> Self {
        self.run_metadata = Some(metadata);
        self
    }

    /// `config.json`'s content: the config, plus the run metadata under `"run"`.
    fn config_document(&self) -> Result<serde_json::Value> {
        let mut doc = serde_json::to_value(&self.config)
            .map_err(|e| Error::config("config", format!("cannot serialize to JSON: {e}")))?;
        if let (Some(meta), Some(obj)) = (&self.run_metadata, doc.as_object_mut()) {
            obj.insert("run".into(), meta.clone());
        }
        Ok(doc)
    }

    /// Adds a custom evaluator, run with the built-in evaluation.
    pub fn with_evaluator(mut self, evaluator: impl Evaluator<B::Sampler> + 'static) -> Self {
        self.evaluators.push(Box::new(evaluator));
        self
    }

    /// Rolls out through environments made by `builder` instead of the built-in single-turn
    /// problem rollout (renderer + reward), for training and evaluation. Use it for
    /// multi-turn tasks (tool use, dialogue); the reward passed to [`new`](Self::new) is then
    /// unused unless the builder uses it.
    pub fn with_env_builder(mut self, builder: Arc<dyn EnvBuilder>) -> Self {
        self.env_builder = Some(builder);
        self
    }

    /// Runs the episodes of every problem through the env builder, all groups concurrently.
    #[allow(clippy::too_many_arguments)]
    async fn env_groups(
        &self,
        builder: &dyn EnvBuilder,
        sampler: &B::Sampler,
        problems: &[Arc<Problem>],
        group_size: usize,
        params: &SamplingParams,
        seed: u64,
        step: u64,
        version: u64,
        bar: &crate::report::PhaseBar,
    ) -> Result<Vec<Group>> {
        let max_turns = self.config.max_turns;
        let renderer = self.renderer.as_ref();
        let futures = problems.iter().enumerate().map(|(g, problem)| async move {
            let envs = builder.make_envs(Arc::clone(problem), group_size)?;
            let group_seed = mix(seed, step, g as u64);
            let (prompt, completions) = env::run_group(
                sampler,
                envs,
                params,
                group_seed,
                |i, t| mix(group_seed, i as u64 + 1, t as u64),
                max_turns,
                renderer,
            )
            .await?;
            bar.inc(group_size as u64);
            Ok(Group {
                problem: Arc::clone(problem),
                prompt,
                policy_version: version,
                completions,
            })
        });
        futures::future::join_all(futures)
            .await
            .into_iter()
            .collect()
    }

    /// The backend.
    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// The configuration.
    pub fn config(&self) -> &TrainerConfig {
        &self.config
    }

    /// The loop state (next step, cumulative counters).
    pub fn state(&self) -> &LoopState {
        &self.state
    }

    /// The number of steps [`run`](Self::run) trains for.
    pub fn total_steps(&self) -> u64 {
        self.total_steps
    }

    /// Consumes the trainer, returning the backend.
    pub fn into_backend(self) -> B {
        self.backend
    }

    /// Creates the run directory (resuming from its last checkpoint if it has one), writes
    /// `config.json` (on a resume `config.resume-NNNNNN.json` instead, the original kept),
    /// and creates the reference sampler. Idempotent.
    async fn setup(&mut self) -> Result<()> {
        if self.set_up {
            return Ok(());
        }
        if let Some(dir) = &self.config.log_dir {
            let mut run_dir = RunDir::create(dir)?;
            if let Some(rec) = run_dir.last_checkpoint()? {
                let state: LoopState =
                    serde_json::from_value(rec.loop_state.clone()).map_err(|e| {
                        Error::Checkpoint {
                            path: run_dir
                                .path()
                                .join("checkpoints.jsonl")
                                .display()
                                .to_string(),
                            message: format!("loop_state of `{}`: {e}", rec.name),
                        }
                    })?;
                if state.seed != self.config.seed {
                    return Err(Error::config(
                        "seed",
                        format!(
                            "the run in {} used seed {}, the config says {}; resuming would change the data order",
                            run_dir.path().display(),
                            state.seed,
                            self.config.seed
                        ),
                    ));
                }
                if state.data_cursor != rec.step.saturating_mul(self.config.batch_size as u64) {
                    return Err(Error::config(
                        "batch_size",
                        format!(
                            "the run in {} consumed {} problems in {} steps, which does not match batch_size {}; resuming would change the data order",
                            run_dir.path().display(),
                            state.data_cursor,
                            rec.step,
                            self.config.batch_size
                        ),
                    ));
                }
                if let Some(shuffle) = state.shuffle.filter(|s| *s != self.config.shuffle) {
                    return Err(Error::config(
                        "shuffle",
                        format!(
                            "the run in {} used shuffle = {shuffle}, the config says {}; resuming would change the data order",
                            run_dir.path().display(),
                            self.config.shuffle
                        ),
                    ));
                }
                let len = self.dataset.len() as u64;
                if let Some(old) = state.dataset_len.filter(|n| *n != len) {
                    return Err(Error::config(
                        "dataset",
                        format!(
                            "the run in {} trained on {old} problems, this dataset has {len}; resuming would change the data order",
                            run_dir.path().display()
                        ),
                    ));
                }
                if let (Some(old), Some(new)) = (&state.renderer, &self.config.renderer_name) {
                    if old != new {
                        return Err(Error::config(
                            "renderer_name",
                            format!(
                                "the run in {} was trained with renderer `{old}`, this trainer renders with `{new}`; resuming would change the prompts and the tokens trained on",
                                run_dir.path().display()
                            ),
                        ));
                    }
                }
                self.backend.load_state(&rec.backend).await?;
                self.state = LoopState {
                    next_step: rec.step,
                    shuffle: Some(self.config.shuffle),
                    dataset_len: Some(len),
                    renderer: self.config.renderer_name.clone(),
                    ..state
                };
                if rec.step >= self.total_steps {
                    // A finished run: its rows (the final eval's included) stay as they are.
                    tracing::info!(checkpoint = %rec.name, step = rec.step, "the run is already complete");
                    self.finished = Some(rec);
                } else {
                    tracing::info!(checkpoint = %rec.name, step = rec.step, "resuming");
                    run_dir.truncate_metrics_from(rec.step)?;
                }
            }
            if self.state.run_id.is_empty() {
                self.state.run_id = format!("{:08x}", rand::random::<u32>());
            }
            // config.json describes the run as started; a resume keeps it and records its
            // own config next to it (config.resume-NNNNNN.json).
            let doc = self.config_document()?;
            let config_path = run_dir.path().join(crate::report::CONFIG_FILE);
            if self.finished.is_some() {
                // A finished run: nothing to record.
            } else if self.state.next_step > 0 && config_path.is_file() {
                run_dir.write_resume_config(self.state.next_step, &doc)?;
            } else {
                run_dir.write_config(&doc)?;
            }
            self.run_dir = Some(run_dir);
        }
        let mode = if self.config.progress {
            ProgressMode::detect()
        } else {
            ProgressMode::Hidden
        };
        self.progress = Progress::with_mode(self.total_steps, mode);
        self.progress.set_start(self.state.next_step);
        if self.config.kl_penalty_coef > 0.0 && self.reference.is_none() {
            self.reference = Some(self.backend.reference_sampler().await?);
        }
        self.set_up = true;
        Ok(())
    }

    /// The problems of step `step`'s batch.
    fn batch(&self, step: u64) -> Result<Vec<Arc<Problem>>> {
        data::batch_indices(
            self.dataset.len(),
            self.config.batch_size,
            step,
            self.config.seed,
            self.config.shuffle,
        )?
        .into_iter()
        .map(|i| self.dataset.get(i).map(Arc::new))
        .collect()
    }

    fn sampling_params(&self, max_tokens: u32, temperature: f32) -> SamplingParams {
        SamplingParams {
            max_tokens: Some(max_tokens),
            temperature,
            stop: Some(self.renderer.stop()),
            ..SamplingParams::default()
        }
    }

    /// Samples and grades step `step`'s batch with `sampler` (policy version `version`).
    async fn rollout(&self, sampler: &B::Sampler, step: u64, version: u64) -> Result<Rollout> {
        let problems = self.batch(step)?;
        if let Some(builder) = &self.env_builder {
            let params = self.sampling_params(self.config.max_tokens, self.config.temperature);
            let t = Instant::now();
            let bar = self.progress.phase(
                "rollout",
                problems.len().saturating_mul(self.config.group_size) as u64,
            );
            let groups = self
                .env_groups(
                    builder.as_ref(),
                    sampler,
                    &problems,
                    self.config.group_size,
                    &params,
                    self.config.seed,
                    step,
                    version,
                    &bar,
                )
                .instrument(tracing::info_span!("rollout", step))
                .await?;
            bar.finish();
            return Ok(Rollout {
                step,
                groups,
                time_sampling: t.elapsed().as_secs_f64(),
                time_grading: 0.0,
            });
        }
        let prompts: Vec<ModelInput> = problems
            .iter()
            .map(|p| self.renderer.generation_prompt(&p.messages))
            .collect::<Result<_>>()?;
        let params = self.sampling_params(self.config.max_tokens, self.config.temperature);
        let seed = self.config.seed;
        let t = Instant::now();
        let bar = self.progress.phase("sampling", prompts.len() as u64);
        let sequences = rollout::sample_all(
            sampler,
            &prompts,
            self.config.group_size,
            &params,
            |i| Some(mix(seed, step, i as u64)),
            &bar,
        )
        .instrument(tracing::info_span!("sampling", step))
        .await?;
        bar.finish();
        let time_sampling = t.elapsed().as_secs_f64();
        let t = Instant::now();
        let bar = self.progress.phase(
            "grading",
            prompts.len().saturating_mul(self.config.group_size) as u64,
        );
        let groups = rollout::grade_all(
            &self.reward,
            self.renderer.as_ref(),
            &problems,
            prompts,
            sequences,
            self.config.reward_timeout(),
            version,
            &bar,
        )
        .instrument(tracing::info_span!("grading", step))
        .await;
        bar.finish();
        Ok(Rollout {
            step,
            groups,
            time_sampling,
            time_grading: t.elapsed().as_secs_f64(),
        })
    }

    /// Streaming rollout: every group is sampled and graded concurrently, and as soon as a
    /// minibatch's worth of groups (`ceil(batch_size / num_minibatches)`) has been graded,
    /// its datums are built (KL penalty per minibatch) and its `forward_backward` is
    /// submitted while the other groups are still sampling. Skipped groups still take their
    /// slot in a minibatch, as in the cookbook.
    async fn stream_rollout(&self, sampler: &B::Sampler, step: u64) -> Result<Streamed> {
        use futures::stream::{FuturesUnordered, StreamExt};
        let problems = self.batch(step)?;
        let prompts: Vec<ModelInput> = problems
            .iter()
            .map(|p| self.renderer.generation_prompt(&p.messages))
            .collect::<Result<_>>()?;
        let params = self.sampling_params(self.config.max_tokens, self.config.temperature);
        let seed = self.config.seed;
        let g_size = self.config.group_size;
        let timeout = self.config.reward_timeout();
        let n_groups = problems.len();
        let per_mb = n_groups.div_ceil(self.config.num_minibatches).max(1);
        let t = Instant::now();
        let bar = self
            .progress
            .phase("rollout", n_groups.saturating_mul(1 + g_size) as u64);
        let mut pending: FuturesUnordered<_> = problems
            .iter()
            .zip(&prompts)
            .enumerate()
            .map(|(g, (problem, prompt))| {
                let bar = &bar;
                let params = &params;
                async move {
                    let seqs = rollout::sample_all(
                        sampler,
                        std::slice::from_ref(prompt),
                        g_size,
                        params,
                        |_| Some(mix(seed, step, g as u64)),
                        bar,
                    )
                    .await?;
                    let mut groups = rollout::grade_all(
                        &self.reward,
                        self.renderer.as_ref(),
                        std::slice::from_ref(problem),
                        vec![prompt.clone()],
                        seqs,
                        timeout,
                        step,
                        bar,
                    )
                    .await;
                    groups
                        .pop()
                        .map(|group| (g, group))
                        .ok_or_else(|| Error::Backend("grading returned no group".into()))
                }
            })
            .collect();
        let mut groups: Vec<Option<Group>> = vec![None; n_groups];
        let mut advantages: Vec<Vec<f64>> = vec![Vec::new(); n_groups];
        let mut out = Streamed::default();
        let mut minibatch: Vec<TrainDatum> = Vec::new();
        let mut slots = 0usize;
        let mut arrived = 0usize;
        while let Some(next) = pending.next().await {
            let (g, group) = next?;
            let rewards = group.rewards();
            let adv = compute_advantages(
                std::slice::from_ref(&rewards),
                self.config.advantage_scaling,
            )
            .pop()
            .unwrap_or_default();
            if !is_degenerate(&rewards) || self.config.keep_degenerate_groups {
                for (c, &a) in group.completions.iter().zip(&adv) {
                    if self.config.mask_truncated && rollout::truncated(c) {
                        out.masked_truncated += 1;
                        continue;
                    }
                    minibatch.extend(data::trajectory_datums(&c.turns, a)?);
                }
            }
            advantages[g] = adv;
            groups[g] = Some(group);
            slots += 1;
            arrived += 1;
            if (slots == per_mb || arrived == n_groups) && !minibatch.is_empty() {
                let mut mb = std::mem::take(&mut minibatch);
                if self.config.kl_penalty_coef > 0.0 {
                    let reference = self
                        .reference
                        .as_ref()
                        .ok_or_else(|| Error::Backend("no reference sampler".into()))?;
                    let base = reference_logprobs(reference, &mb).await?;
                    let avg = apply_kl_penalty(
                        &mut mb,
                        &base,
                        self.config.kl_penalty_coef,
                        self.config.kl_discount_factor,
                    )?;
                    let tokens: f64 = mb.iter().flat_map(|d| &d.mask).map(|&m| f64::from(m)).sum();
                    out.kl_sum += avg * tokens;
                    out.kl_tokens += tokens;
                }
                let start = out.train_data.len();
                let datums = mb.iter().map(|d| d.datum.clone()).collect();
                let submitted = self
                    .backend
                    .forward_backward(datums, self.config.loss)
                    .await?;
                out.train_data.extend(mb);
                out.fb.push((start..out.train_data.len(), submitted));
            }
            if slots == per_mb {
                slots = 0;
            }
        }
        drop(pending);
        bar.finish();
        out.rollout = Some(Rollout {
            step,
            groups: groups.into_iter().flatten().collect(),
            time_sampling: t.elapsed().as_secs_f64(),
            time_grading: 0.0,
        });
        out.advantages = advantages;
        Ok(out)
    }

    async fn ensure_sampler(&mut self) -> Result<()> {
        if self.sampler.is_none() {
            self.sampler = Some(self.backend.sampler().await?);
        }
        Ok(())
    }

    /// Runs one training step and returns its metrics (also appended to `metrics.jsonl`
    /// when there is a run directory). Evaluation and checkpoints belong to
    /// [`run`](Self::run).
    pub async fn step(&mut self) -> Result<StepMetrics> {
        self.setup().await?;
        let step = self.state.next_step;
        self.train_step(step, BTreeMap::new())
            .instrument(tracing::info_span!("step", step))
            .await
    }

    /// Rollout → advantages → datums → pipelined update → new sampler → metrics row.
    async fn train_step(&mut self, step: u64, extra: BTreeMap<String, f64>) -> Result<StepMetrics> {
        let t_total = Instant::now();
        self.ensure_sampler().await?;
        // The batch: prefetched by an earlier step (off-policy) or sampled now.
        let rollout = match self.prefetched.front() {
            Some(r) if r.step == step => self.prefetched.pop_front(),
            _ => {
                self.prefetched.clear();
                None
            }
        };
        let Some(sampler) = self.sampler.as_ref() else {
            return Err(Error::Backend("no sampler".into()));
        };
        // Streaming applies to the built-in rollout of a batch not sampled ahead.
        let streaming =
            self.config.stream_minibatches && rollout.is_none() && self.env_builder.is_none();
        let mut kl_policy_base = None;
        let mut time_kl = None;
        let (rollout, advantages, train_data, masked_truncated, submitted) = if streaming {
            let s = self
                .stream_rollout(sampler, step)
                .instrument(tracing::info_span!("stream_rollout", step))
                .await?;
            if s.kl_tokens > 0.0 {
                kl_policy_base = Some(s.kl_sum / s.kl_tokens);
            }
            let rollout = s
                .rollout
                .ok_or_else(|| Error::Backend("streaming rollout produced nothing".into()))?;
            (
                rollout,
                s.advantages,
                s.train_data,
                s.masked_truncated,
                Some(s.fb),
            )
        } else {
            let rollout = match rollout {
                Some(r) => r,
                None => self.rollout(sampler, step, step).await?,
            };
            let rewards: Vec<Vec<f64>> = rollout.groups.iter().map(Group::rewards).collect();
            let advantages = compute_advantages(&rewards, self.config.advantage_scaling);
            let mut train_data: Vec<TrainDatum> = Vec::new();
            let mut masked_truncated = 0usize;
            for ((group, adv), r) in rollout.groups.iter().zip(&advantages).zip(&rewards) {
                if is_degenerate(r) && !self.config.keep_degenerate_groups {
                    continue;
                }
                for (c, &a) in group.completions.iter().zip(adv) {
                    if self.config.mask_truncated && rollout::truncated(c) {
                        masked_truncated += 1;
                        continue;
                    }
                    train_data.extend(data::trajectory_datums(&c.turns, a)?);
                }
            }
            // Reference KL penalty over the whole batch.
            if self.config.kl_penalty_coef > 0.0 && !train_data.is_empty() {
                let t = Instant::now();
                let Some(reference) = self.reference.as_ref() else {
                    return Err(Error::Backend("no reference sampler".into()));
                };
                let base = reference_logprobs(reference, &train_data)
                    .instrument(tracing::info_span!("kl_vs_base", step))
                    .await?;
                kl_policy_base = Some(apply_kl_penalty(
                    &mut train_data,
                    &base,
                    self.config.kl_penalty_coef,
                    self.config.kl_discount_factor,
                )?);
                time_kl = Some(t.elapsed().as_secs_f64());
            }
            (rollout, advantages, train_data, masked_truncated, None)
        };

        let mut values = extra;
        values.extend(metrics::trajectory_metrics(&rollout.groups, ""));
        if let Some(e) = metrics::sampler_entropy(&rollout.groups) {
            values.insert("optim/entropy".into(), e);
        }
        let staleness: Vec<f64> = rollout
            .groups
            .iter()
            .map(|g| step.saturating_sub(g.policy_version) as f64)
            .collect();
        if self.config_off_policy() > 0 {
            values.insert("async/staleness_mean".into(), data::mean(&staleness));
            values.insert(
                "async/staleness_min".into(),
                staleness.iter().copied().reduce(f64::min).unwrap_or(0.0),
            );
            values.insert(
                "async/staleness_max".into(),
                staleness.iter().copied().fold(0.0, f64::max),
            );
        }
        let degenerate = rollout
            .groups
            .iter()
            .filter(|g| is_degenerate(&g.rewards()))
            .count();
        if self.config.log_samples {
            if let Some(dir) = &self.run_dir {
                let records = self.sample_records(step, &rollout.groups, &advantages);
                dir.write_samples(step, &records)?;
            }
        }
        let n_groups = rollout.groups.len().max(1) as f64;
        values.insert("train/frac_degenerate".into(), degenerate as f64 / n_groups);
        values.insert(
            "train/groups_skipped".into(),
            if self.config.keep_degenerate_groups {
                0.0
            } else {
                degenerate as f64
            },
        );
        if self.config.mask_truncated {
            values.insert("train/masked_truncated".into(), masked_truncated as f64);
        }
        if let Some(avg) = kl_policy_base {
            values.insert("kl_policy_base".into(), avg);
        }
        if let Some(t) = time_kl {
            values.insert("time/kl_vs_base".into(), t);
        }

        let trained_tokens: usize = train_data.iter().map(|d| d.mask.len()).sum();
        values.insert("train/datums".into(), train_data.len() as f64);

        // The update, with the next batches sampled meanwhile when off-policy.
        let t_train = Instant::now();
        let adam = self.config.adam();
        // Never more batches ahead than steps left (any `max_steps_off_policy` is safe).
        let ahead = self
            .config_off_policy()
            .min(self.total_steps.saturating_sub(step.saturating_add(1)));
        let prefetch_steps: Vec<u64> = (1..=ahead)
            .map(|k| step + k)
            .filter(|s| *s < self.total_steps && !self.prefetched.iter().any(|r| r.step == *s))
            .collect();
        let calls = chunk_bounds(train_data.len(), self.config.num_substeps).len() as u64;
        let train_bar = self.progress.phase("training", calls);
        let update = async {
            if let Some(fb) = submitted {
                // Streaming: every forward_backward is already submitted.
                if fb.is_empty() {
                    return Ok(None);
                }
                let opt = self.backend.optim_step(adam).await?;
                finish_update(fb, vec![opt], train_data.len(), &train_bar)
                    .await
                    .map(Some)
            } else if train_data.is_empty() {
                Ok(None)
            } else {
                train(
                    &self.backend,
                    &train_data,
                    self.config.loss,
                    adam,
                    self.config.num_substeps,
                    self.config.num_minibatches,
                    &train_bar,
                )
                .await
                .map(Some)
            }
        }
        .instrument(tracing::info_span!("train_step", step));
        let prefetch = async {
            let mut out = Vec::new();
            let all = futures::future::join_all(
                prefetch_steps
                    .iter()
                    .map(|&s| self.rollout(sampler, s, step)),
            )
            .await;
            for r in all {
                out.push(r?);
            }
            Ok::<_, Error>(out)
        };
        let (outcome, prefetched) = futures::join!(update, prefetch);
        train_bar.finish();
        let outcome = outcome?;
        self.prefetched.extend(prefetched?);
        let time_training = t_train.elapsed().as_secs_f64();

        if let Some(out) = &outcome {
            let pairs: Vec<(Vec<f32>, Vec<f32>, Vec<f32>)> = train_data
                .iter()
                .zip(&out.train_logprobs)
                .filter_map(|(d, lp)| {
                    lp.as_ref()
                        .map(|lp| (d.mask.clone(), d.sampled_logprobs.clone(), lp.clone()))
                })
                .collect();
            if let Some((v1, v2)) = metrics::kl_sample_train(&pairs) {
                values.insert("optim/kl_sample_train_v1".into(), v1);
                values.insert("optim/kl_sample_train_v2".into(), v2);
            }
            for (k, v) in &out.loss_metrics {
                values.insert(format!("optim/{k}"), *v);
            }
            for (k, v) in &out.optim_metrics {
                values.insert(format!("optim/{k}"), *v);
            }
            values.insert("optim/updates".into(), out.updates as f64);
            // New weights, new sampler.
            self.sampler = Some(self.backend.sampler().await?);
        } else {
            values.insert("optim/updates".into(), 0.0);
        }

        let sampled_tokens = values
            .get("env/all/total_ac_tokens")
            .copied()
            .unwrap_or(0.0);
        let failures = values.get("reward_errors/total").copied().unwrap_or(0.0);
        for (k, v) in [
            ("tokens/sampled", sampled_tokens),
            ("tokens/trained", trained_tokens as f64),
            ("reward_errors/total", failures),
            ("train/datums", train_data.len() as f64),
            ("train/updates", if outcome.is_some() { 1.0 } else { 0.0 }),
        ] {
            *self.state.cumulative.entry(k.to_string()).or_insert(0.0) += v;
        }
        values.insert("tokens/sampled".into(), sampled_tokens);
        values.insert("tokens/trained".into(), trained_tokens as f64);
        for (k, v) in &self.state.cumulative {
            if let Some(kind) = k.strip_prefix("tokens/") {
                values.insert(format!("tokens/cumulative/{kind}"), *v);
            }
        }
        values.insert("progress/batch".into(), step as f64);
        values.insert(
            "progress/done_frac".into(),
            (step + 1) as f64 / self.total_steps.max(1) as f64,
        );
        values.insert("optim/lr".into(), self.config.learning_rate);
        values.insert("time/sampling".into(), rollout.time_sampling);
        values.insert("time/grading".into(), rollout.time_grading);
        values.insert("time/train_step".into(), time_training);
        values.insert("time/total".into(), t_total.elapsed().as_secs_f64());

        self.state.next_step = step + 1;
        self.state.data_cursor = self
            .state
            .next_step
            .saturating_mul(self.config.batch_size as u64);
        self.write_row(step, &values)?;
        let m = StepMetrics::from_values(step, values);
        self.progress.step_done(step, &m.summary_line());
        Ok(m)
    }

    /// The step's completions as [`SampleRecord`]s (prompt and completion decoded with the
    /// backend's tokenizer; the parsed text when decoding fails), with the policy version
    /// that sampled each group and its staleness at `step`.
    fn sample_records(
        &self,
        step: u64,
        groups: &[Group],
        advantages: &[Vec<f64>],
    ) -> Vec<SampleRecord> {
        let tok = self.backend.tokenizer();
        let mut out = Vec::new();
        for (g, (group, adv)) in groups.iter().zip(advantages).enumerate() {
            let prompt = tok.decode(&group.prompt.to_tokens()).unwrap_or_else(|_| {
                group
                    .problem
                    .messages
                    .iter()
                    .map(|m| format!("{}: {}", m.role, m.content.to_display_string("\n")))
                    .collect::<Vec<_>>()
                    .join("\n")
            });
            for (c, &a) in group.completions.iter().zip(adv) {
                out.push(SampleRecord {
                    problem_id: group.problem.id.clone(),
                    group: g,
                    prompt: prompt.clone(),
                    completion: tok.decode(&c.tokens()).unwrap_or_else(|_| c.text.clone()),
                    reward: c.reward,
                    advantage: a,
                    components: c.components.clone(),
                    stop_reason: c.stop_reason,
                    termination: c.termination,
                    tokens: c.num_tokens(),
                    policy_version: group.policy_version,
                    staleness: step.saturating_sub(group.policy_version),
                });
            }
        }
        out
    }

    fn config_off_policy(&self) -> u64 {
        self.config.max_steps_off_policy
    }

    fn write_row(&mut self, step: u64, values: &BTreeMap<String, f64>) -> Result<()> {
        if let Some(dir) = self.run_dir.as_mut() {
            let mut row: BTreeMap<String, serde_json::Value> = values
                .iter()
                .map(|(k, v)| (k.clone(), serde_json::Value::from(*v)))
                .collect();
            row.insert("step".into(), serde_json::Value::from(step));
            dir.append_metrics(&row)?;
        }
        Ok(())
    }

    /// Evaluates the current policy: the eval dataset (`test/...` metrics) and every custom
    /// evaluator (`{name}/...`). Empty when there is nothing to evaluate.
    pub async fn evaluate(&mut self) -> Result<BTreeMap<String, f64>> {
        self.setup().await?;
        self.ensure_sampler().await?;
        let Some(sampler) = self.sampler.as_ref() else {
            return Err(Error::Backend("no sampler".into()));
        };
        let step = self.state.next_step;
        let t = Instant::now();
        let mut out = BTreeMap::new();
        if let Some(ds) = &self.eval_dataset {
            let n = self
                .config
                .eval
                .max_problems
                .map_or(ds.len(), |m| m.min(ds.len()));
            let problems: Vec<Arc<Problem>> = (0..n)
                .map(|i| ds.get(i).map(Arc::new))
                .collect::<Result<_>>()?;
            let params = self.sampling_params(
                self.config
                    .eval
                    .max_tokens
                    .unwrap_or(self.config.max_tokens),
                self.config.eval.temperature,
            );
            let seed = self.config.seed ^ EVAL_DOMAIN;
            let group_size = self.config.eval.group_size;
            // Units: one per sampling request and one per graded completion.
            let units = if self.env_builder.is_some() {
                n.saturating_mul(group_size)
            } else {
                n.saturating_mul(1 + group_size)
            };
            let bar = self.progress.phase("eval", units as u64);
            let groups = if let Some(builder) = &self.env_builder {
                self.env_groups(
                    builder.as_ref(),
                    sampler,
                    &problems,
                    group_size,
                    &params,
                    seed,
                    step,
                    step,
                    &bar,
                )
                .instrument(tracing::info_span!("eval_rollout", step))
                .await?
            } else {
                let prompts: Vec<ModelInput> = problems
                    .iter()
                    .map(|p| self.renderer.generation_prompt(&p.messages))
                    .collect::<Result<_>>()?;
                let sequences = rollout::sample_all(
                    sampler,
                    &prompts,
                    group_size,
                    &params,
                    |i| Some(mix(seed, step, i as u64)),
                    &bar,
                )
                .instrument(tracing::info_span!("eval_sampling", step))
                .await?;
                rollout::grade_all(
                    &self.reward,
                    self.renderer.as_ref(),
                    &problems,
                    prompts,
                    sequences,
                    self.config.reward_timeout(),
                    step,
                    &bar,
                )
                .instrument(tracing::info_span!("eval_grading", step))
                .await
            };
            bar.finish();
            out.extend(metrics::trajectory_metrics(&groups, "test/"));
        }
        for e in &self.evaluators {
            let m = e
                .evaluate(sampler, step)
                .instrument(tracing::info_span!("evaluator", name = e.name()))
                .await?;
            for (k, v) in m {
                out.insert(format!("{}/{k}", e.name()), v);
            }
        }
        if !out.is_empty() {
            out.insert("time/run_evals".into(), t.elapsed().as_secs_f64());
        }
        Ok(out)
    }

    fn has_eval(&self) -> bool {
        self.config.eval_every > 0 && (self.eval_dataset.is_some() || !self.evaluators.is_empty())
    }

    /// Saves backend state + loop state as `name` and records it in `checkpoints.jsonl`.
    async fn save_checkpoint(&mut self, name: &str) -> Result<Option<CheckpointRef>> {
        if self.run_dir.is_none() {
            return Ok(None);
        }
        let backend = self
            .backend
            .save_state(&format!("{}-{name}", self.state.run_id))
            .instrument(tracing::info_span!("save_checkpoint", name))
            .await?;
        let loop_state = serde_json::to_value(&self.state)
            .map_err(|e| Error::Backend(format!("serializing the loop state: {e}")))?;
        let rec = CheckpointRecord {
            step: self.state.next_step,
            name: name.to_string(),
            backend: backend.clone(),
            loop_state,
        };
        if let Some(dir) = self.run_dir.as_mut() {
            dir.append_checkpoint(&rec)?;
        }
        self.redraw_plot();
        Ok(Some(backend))
    }

    /// Redraws `reward.png`/`.svg` mid-run (after an evaluation or a checkpoint), so that a
    /// run that crashes later still has a current plot. A failure is only logged: a plot is
    /// not worth stopping training for (the end of [`run`](Self::run) reports it).
    fn redraw_plot(&self) {
        if let Some(dir) = &self.run_dir {
            if let Err(e) = dir.plot() {
                tracing::warn!(error = %e, "redrawing the reward plot failed");
            }
        }
    }

    /// Runs every remaining step: evaluation every `eval_every` steps (before the step's
    /// update, merged into its row) and once more at the end (its own row at
    /// `step = total_steps`), checkpoints every `save_every` steps and `final` at the end.
    /// With a run directory that already holds checkpoints, continues from the last one; when
    /// that checkpoint is at `total_steps` the run is complete: nothing is trained or
    /// truncated, and the summary is read back from `metrics.jsonl` and `checkpoints.jsonl`
    /// (`steps_run = 0`; the plot is redrawn).
    pub async fn run(&mut self) -> Result<RunSummary> {
        self.setup().await?;
        let start = self.state.next_step;
        let mut summary = RunSummary {
            start_step: start,
            total_steps: self.total_steps,
            run_dir: self.run_dir.as_ref().map(|d| d.path().to_path_buf()),
            ..RunSummary::default()
        };
        if start >= self.total_steps {
            if let (Some(rec), Some(dir)) = (&self.finished, &self.run_dir) {
                // A finished run: report what it recorded, touch nothing but the plot.
                let rows = dir.read_metrics()?;
                let values_of = |step: u64| {
                    rows.iter()
                        .rev()
                        .find(|r| r.get("step").and_then(serde_json::Value::as_u64) == Some(step))
                        .map(|r| {
                            r.iter()
                                .filter(|(k, _)| k.as_str() != "step")
                                .filter_map(|(k, v)| v.as_f64().map(|v| (k.clone(), v)))
                                .collect::<BTreeMap<String, f64>>()
                        })
                };
                let last = self.total_steps.saturating_sub(1);
                summary.last_step = values_of(last).map(|v| StepMetrics::from_values(last, v));
                summary.final_eval = values_of(self.total_steps);
                summary.final_checkpoint = Some(rec.backend.clone());
                dir.plot()?;
            }
            return Ok(summary);
        }
        for step in start..self.total_steps {
            let mut extra = BTreeMap::new();
            if self.has_eval() && step % self.config.eval_every == 0 {
                extra = self.evaluate().await?;
            }
            let evaluated = !extra.is_empty();
            let m = self
                .train_step(step, extra)
                .instrument(tracing::info_span!("step", step))
                .await?;
            if evaluated {
                // The eval row is written: a crash from here on still leaves its plot.
                self.redraw_plot();
            }
            tracing::info!(
                step,
                reward = m.reward_mean,
                degenerate = m.frac_degenerate,
                datums = m.datums,
                "step done"
            );
            summary.steps_run += 1;
            summary.last_step = Some(m);
            let done = step + 1;
            if self.config.save_every > 0
                && done % self.config.save_every == 0
                && done < self.total_steps
            {
                self.save_checkpoint(&format!("{done:06}")).await?;
            }
        }
        if self.has_eval() {
            let m = self.evaluate().await?;
            self.write_row(self.total_steps, &m)?;
            if let Some(acc) = m.get("test/env/all/correct") {
                self.progress
                    .println(&format!("final eval: test/env/all/correct {acc:.3}"));
            }
            summary.final_eval = Some(m);
        }
        summary.final_checkpoint = self.save_checkpoint("final").await?;
        if let Some(dir) = &self.run_dir {
            dir.plot()?;
        }
        self.progress.finish();
        Ok(summary)
    }
}

/// Reference log-probabilities of each datum's targets (position-aligned with the mask).
async fn reference_logprobs<S: Sampler>(
    reference: &S,
    data: &[TrainDatum],
) -> Result<Vec<Vec<f32>>> {
    let futures = data.iter().map(|d| async move {
        let mut full = d.datum.model_input.to_tokens();
        let targets = d
            .datum
            .input("target_tokens")
            .and_then(|t| t.as_i64())
            .ok_or_else(|| Error::Backend("datum without int64 target_tokens".into()))?;
        if let Some(&last) = targets.last() {
            full.push(last as u32);
        }
        let lps = reference
            .compute_logprobs(&ModelInput::from_tokens(full))
            .await?;
        // Entry 0 has no prefix; entries 1.. line up with the targets.
        Ok(lps.into_iter().skip(1).map(|l| l.unwrap_or(0.0)).collect())
    });
    futures::future::join_all(futures)
        .await
        .into_iter()
        .collect()
}

/// What one pipelined update returned.
struct TrainOutcome {
    /// The learner's log-probabilities per datum (when the backend returned them).
    train_logprobs: Vec<Option<Vec<f32>>>,
    /// Summed `forward_backward` metrics (`loss:sum`...).
    loss_metrics: BTreeMap<String, f64>,
    /// The last `optim_step`'s metrics.
    optim_metrics: BTreeMap<String, f64>,
    /// Optimizer steps taken.
    updates: usize,
}

/// Submits every `forward_backward` and `optim_step` of the update in order (datums cut into
/// `num_substeps` chunks, each chunk into `num_minibatches` forward/backward calls followed
/// by one optimizer step), then awaits the results in order.
async fn train<B: PolicyBackend>(
    backend: &B,
    data: &[TrainDatum],
    loss: crate::types::LossFn,
    adam: crate::types::AdamParams,
    num_substeps: usize,
    num_minibatches: usize,
    bar: &crate::report::PhaseBar,
) -> Result<TrainOutcome> {
    let mut fb: Vec<(std::ops::Range<usize>, Pending<ForwardBackwardOutput>)> = Vec::new();
    let mut opt: Vec<Pending<OptimStepOutput>> = Vec::new();
    for chunk in chunk_bounds(data.len(), num_substeps) {
        for mb in chunk_bounds(chunk.len(), num_minibatches) {
            let range = chunk.start + mb.start..chunk.start + mb.end;
            let datums = data[range.clone()]
                .iter()
                .map(|d| d.datum.clone())
                .collect();
            fb.push((range, backend.forward_backward(datums, loss).await?));
        }
        opt.push(backend.optim_step(adam).await?);
    }
    finish_update(fb, opt, data.len(), bar).await
}

/// Awaits submitted `forward_backward`s (with the datum range each covered) and
/// `optim_step`s, in submission order.
async fn finish_update(
    fb: Vec<(std::ops::Range<usize>, Pending<ForwardBackwardOutput>)>,
    opt: Vec<Pending<OptimStepOutput>>,
    n_data: usize,
    bar: &crate::report::PhaseBar,
) -> Result<TrainOutcome> {
    let mut train_logprobs = vec![None; n_data];
    let mut loss_metrics = BTreeMap::new();
    for (range, pending) in fb {
        let range = range.start.min(n_data)..range.end.min(n_data);
        let out = pending.await?;
        for (slot, o) in train_logprobs[range].iter_mut().zip(&out.loss_fn_outputs) {
            *slot = o
                .get("logprobs")
                .and_then(|t| t.as_f32())
                .map(<[f32]>::to_vec);
        }
        for (k, v) in out.metrics {
            *loss_metrics.entry(k).or_insert(0.0) += v;
        }
    }
    let updates = opt.len();
    let mut optim_metrics = BTreeMap::new();
    for pending in opt {
        optim_metrics = pending.await?.metrics;
        bar.inc(1);
    }
    Ok(TrainOutcome {
        train_logprobs,
        loss_metrics,
        optim_metrics,
        updates,
    })
}
