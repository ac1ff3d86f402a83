//! [`GrpoTrainer`]: the trainer, its constructor and builders, and the loops ([`run`] and
//! [`step`] → `train_step`) that call the phases in order.
//!
//! [`run`]: GrpoTrainer::run
//! [`step`]: GrpoTrainer::step

use std::collections::{BTreeMap, VecDeque};
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Instant;

use tracing::Instrument;

use crate::backend::PolicyBackend;
use crate::dataset::Dataset;
use crate::error::{Error, Result};
use crate::loss::CustomLoss;
use crate::renderer::Renderer;
use crate::report::{CheckpointRecord, MetricsSink, Progress, ProgressMode, RunDir};
use crate::reward::{GraderPool, RewardFn};

use super::datums::chunk_bounds;
use super::sample::Rollout;
use super::{
    EnvBuilder, Evaluator, LoopState, ProblemEnvBuilder, RunSummary, StepMetrics, TrainerConfig,
    advantages, datums, dynamic, grade, sample, train,
};

/// The GRPO trainer over a backend `B` and a reward `R`.
///
/// ```no_run
/// # async fn demo<B: rlvr::PolicyBackend>(backend: B, renderer: std::sync::Arc<dyn rlvr::Renderer>,
/// #     train: std::sync::Arc<dyn rlvr::Dataset>) -> rlvr::Result<()> {
/// use rlvr::{GrpoTrainer, TrainerConfig};
/// let reward = |p: &rlvr::dataset::Problem, text: &str| if text.contains(&p.answer) { 1.0 } else { 0.0 };
/// let config = TrainerConfig::builder().max_steps(10).log_dir("runs/demo").build()?;
/// let mut trainer = GrpoTrainer::new(backend, reward, renderer, train, config)?;
/// let summary = trainer.run().await?;
/// println!("{:?}", summary.last_step.map(|m| m.reward_mean));
/// # Ok(()) }
/// ```
pub struct GrpoTrainer<B: PolicyBackend, R: RewardFn> {
    pub(super) backend: B,
    /// The reward lives in the default env builder ([`ProblemEnvBuilder`]).
    pub(super) reward: PhantomData<Arc<R>>,
    pub(super) renderer: Arc<dyn Renderer>,
    pub(super) dataset: Arc<dyn Dataset>,
    pub(super) eval_dataset: Option<Arc<dyn Dataset>>,
    pub(super) evaluators: Vec<Box<dyn Evaluator<B::Sampler>>>,
    /// Makes the environments of every rollout: a [`ProblemEnvBuilder`] over the renderer
    /// and the reward unless [`with_env_builder`](Self::with_env_builder) gave another.
    pub(super) env_builder: Arc<dyn EnvBuilder>,
    /// Whether `env_builder` is the caller's (streamed minibatches are for the default).
    pub(super) custom_env: bool,
    /// The run's bounded grader pool (used by the default env builder).
    pub(super) grader_pool: Arc<GraderPool>,
    pub(super) config: TrainerConfig,
    pub(super) state: LoopState,
    pub(super) total_steps: u64,
    pub(super) sampler: Option<B::Sampler>,
    pub(super) reference: Option<B::Sampler>,
    pub(super) run_dir: Option<RunDir>,
    pub(super) progress: Progress,
    pub(super) set_up: bool,
    pub(super) prefetched: VecDeque<Rollout>,
    /// The last checkpoint when the run directory holds a finished run (its step is at or
    /// past `total_steps`): [`run`](Self::run) then only reports it.
    pub(super) finished: Option<CheckpointRecord>,
    /// What the caller said about the run, stored under `"run"` in `config.json`.
    pub(super) run_metadata: Option<serde_json::Value>,
    /// Where the metrics rows go besides `metrics.jsonl`: the TensorBoard sink
    /// (`config.tensorboard`, added by `setup`) and the caller's.
    pub(super) metrics_sinks: Vec<Box<dyn MetricsSink>>,
    /// The loss the update runs instead of `config.loss` ([`with_custom_loss`](Self::with_custom_loss)).
    pub(super) custom_loss: Option<Arc<dyn CustomLoss>>,
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
                ));
            }
            _ => config.renderer_name = Some(renderer_name),
        }
        if dataset.is_empty() {
            return Err(Error::config("dataset", "the training dataset is empty"));
        }
        let dataset_len = dataset.len() as u64;
        let per_epoch = (dataset.len() / config.batch_size).max(1) as u64;
        let reward: Arc<R> = reward.into();
        let grader_pool = Arc::new(config.grader_pool());
        let env_builder: Arc<dyn EnvBuilder> = Arc::new(
            ProblemEnvBuilder::new(Arc::clone(&renderer), reward, config.reward_timeout())
                .with_pool(Arc::clone(&grader_pool)),
        );
        let total_steps = config
            .max_steps
            .unwrap_or(per_epoch.saturating_mul(config.num_epochs as u64));
        Ok(GrpoTrainer {
            backend,
            reward: PhantomData,
            renderer,
            dataset,
            eval_dataset: None,
            evaluators: Vec::new(),
            env_builder,
            custom_env: false,
            grader_pool,
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
            metrics_sinks: Vec::new(),
            custom_loss: None,
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
    /// # fn demo<B: rlvr::PolicyBackend, R: rlvr::RewardFn>(t: rlvr::GrpoTrainer<B, R>) {
    /// let t = t.with_run_metadata(serde_json::json!({
    ///     "model": "Qwen/Qwen3-0.6B", "backend": "local", "renderer": "role_colon", "dataset": "gsm8k",
    /// }));
    /// # }
    /// ```
    pub fn with_run_metadata(mut self, metadata: serde_json::Value) -> Self {
        self.run_metadata = Some(metadata);
        self
    }

    /// Sends every metrics row to `sink` too (an experiment tracker, a database...): see
    /// [`MetricsSink`] for when each of its methods is called. Rows go to `metrics.jsonl`
    /// first, then to the sinks in the order they were added. Works with or without a run
    /// directory.
    ///
    /// ```no_run
    /// # fn demo<B: rlvr::PolicyBackend, R: rlvr::RewardFn>(t: rlvr::GrpoTrainer<B, R>) {
    /// use std::collections::BTreeMap;
    /// struct Print;
    /// impl rlvr::report::MetricsSink for Print {
    ///     fn log_metrics(&mut self, step: u64, m: &BTreeMap<String, f64>) -> rlvr::Result<()> {
    ///         println!("{step}: {} metrics", m.len());
    ///         Ok(())
    ///     }
    /// }
    /// let t = t.with_metrics_sink(Print);
    /// # }
    /// ```
    pub fn with_metrics_sink(mut self, sink: impl MetricsSink + 'static) -> Self {
        self.metrics_sinks.push(Box::new(sink));
        self
    }

    /// Adds a custom evaluator, run with the built-in evaluation.
    pub fn with_evaluator(mut self, evaluator: impl Evaluator<B::Sampler> + 'static) -> Self {
        self.evaluators.push(Box::new(evaluator));
        self
    }

    /// Rolls out through environments made by `builder` instead of the default
    /// [`ProblemEnvBuilder`] (single-turn problems: renderer + reward), for training and
    /// evaluation. Use it for multi-turn tasks (tool use, dialogue); the reward passed to
    /// [`new`](Self::new) is then unused unless the builder uses it.
    pub fn with_env_builder(mut self, builder: Arc<dyn EnvBuilder>) -> Self {
        self.env_builder = builder;
        self.custom_env = true;
        self
    }

    /// Trains with `loss`, a [`CustomLoss`] computed on this machine, instead of the
    /// config's built-in [`loss`](TrainerConfig::loss): every minibatch of the update runs
    /// [`forward_backward_custom`](crate::loss::forward_backward_custom) (a forward pass,
    /// the loss here, a backward pass) where it would run `forward_backward`. The loss reads
    /// the datums as the built-in losses do (`target_tokens`, the sampler's `logprobs`,
    /// `advantages` after the KL penalty and the
    /// [`loss_aggregation`](TrainerConfig::loss_aggregation) scaling). Its metrics land under
    /// `optim/` like the built-in losses' (`optim/loss:sum` is the custom loss,
    /// `optim/surrogate_loss:sum` the backend's cross-entropy).
    ///
    /// Fails with [`Error::Config`] when the config streams minibatches
    /// ([`stream_minibatches`](TrainerConfig::stream_minibatches)): a custom loss needs the
    /// forward pass's result before its backward pass, where streaming submits each
    /// minibatch's `forward_backward` during the rollout.
    ///
    /// A GSPO step on a tiny random model:
    ///
    /// ```
    /// # #[cfg(feature = "local")]
    /// # {
    /// use std::sync::Arc;
    /// use rlvr::backend::local::{char_tokenizer, LocalBackend, LocalOptions, Qwen3Config};
    /// use rlvr::{dataset::Problem, loss::Gspo, types::LoraConfig};
    /// use rlvr::{GrpoTrainer, PolicyBackend, RoleColon, TrainerConfig};
    ///
    /// let vocab: Vec<String> = "_0123456789+=?: \nUA".chars().map(String::from).collect();
    /// let config = Qwen3Config::new(vocab.len(), 16, 24, 1, 2, 1, 8, 64);
    /// let opts = LocalOptions::default().seed(1).lora(LoraConfig::new(4));
    /// let backend = LocalBackend::random(config, char_tokenizer(&vocab, Some(0))?, opts)?;
    /// let renderer = Arc::new(RoleColon::new(backend.tokenizer().clone()));
    /// let problems: Arc<dyn rlvr::Dataset> = Arc::new(vec![Problem::new("p", "2+3=?", "5")]);
    /// let reward = |_: &Problem, text: &str| text.len() as f64;
    /// let config = TrainerConfig::builder()
    ///     .batch_size(1).group_size(4).max_tokens(4).progress(false).build()?;
    /// let mut trainer = GrpoTrainer::new(backend, reward, renderer, problems, config)?
    ///     .with_custom_loss(Gspo::default())?;
    /// let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    /// let m = rt.block_on(trainer.step())?;
    /// if m.datums > 0 {
    ///     assert!(m.values["optim/loss:sum"].is_finite());
    ///     assert!(m.values.contains_key("optim/gspo/ratio:mean"));
    /// }
    /// # }
    /// # Ok::<(), rlvr::Error>(())
    /// ```
    pub fn with_custom_loss(mut self, loss: impl CustomLoss + 'static) -> Result<Self> {
        if self.config.stream_minibatches {
            return Err(Error::config(
                "stream_minibatches",
                "cannot be combined with a custom loss, which needs each minibatch's forward \
                 pass before its backward pass; turn streaming off",
            ));
        }
        self.custom_loss = Some(Arc::new(loss));
        Ok(self)
    }

    /// The run's bounded grader pool (`grader_threads`, `max_consecutive_reward_hangs`),
    /// which the default env builder grades on; give it to a custom
    /// [`ProblemEnvBuilder`] with [`with_pool`](ProblemEnvBuilder::with_pool) to share it.
    pub fn grader_pool(&self) -> Arc<GraderPool> {
        Arc::clone(&self.grader_pool)
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

    /// Phases 1 and 2 for step `step`'s batch with `sampler` (policy version `version`):
    /// sample, then grade; with dynamic sampling, further rounds while fewer than
    /// `batch_size` groups with differing rewards are in (see [`dynamic`]).
    pub(super) async fn rollout(
        &self,
        sampler: &B::Sampler,
        step: u64,
        version: u64,
    ) -> Result<Rollout> {
        let params = self.sampling_params(self.config.max_tokens, self.config.temperature);
        let group_size = self.config.group_size;
        let max_rounds = self.config.dynamic_sampling_rounds;
        let mut rollout = Rollout {
            step,
            groups: Vec::new(),
            kept: (max_rounds > 0).then(Vec::new),
            rounds: 0,
            time_sampling: 0.0,
            time_grading: 0.0,
        };
        for round in 0..=max_rounds {
            let problems = self.round_batch(step, round)?;
            let t = Instant::now();
            let bar = self.progress.phase("sampling", problems.len() as u64);
            let sampled = sample::sample(
                sampler,
                self.env_builder.as_ref(),
                &problems,
                group_size,
                &params,
                dynamic::round_seed(self.config.seed, round),
                step,
                &bar,
            )
            .instrument(tracing::info_span!("sampling", step, round))
            .await?;
            bar.finish();
            rollout.time_sampling += t.elapsed().as_secs_f64();
            let t = Instant::now();
            let bar = self
                .progress
                .phase("grading", problems.len().saturating_mul(group_size) as u64);
            let groups = grade::grade(
                sampler,
                sampled,
                &params,
                self.config.max_turns,
                self.renderer.as_ref(),
                version,
                &bar,
            )
            .instrument(tracing::info_span!("grading", step, round))
            .await?;
            bar.finish();
            rollout.time_grading += t.elapsed().as_secs_f64();
            rollout.rounds = round;
            let base = rollout.groups.len();
            rollout.groups.extend(groups);
            let Some(kept) = rollout.kept.as_mut() else {
                break;
            };
            let mixed: Vec<bool> = rollout.groups[base..]
                .iter()
                .map(|g| !advantages::is_degenerate(&g.rewards()))
                .collect();
            let need = self.config.batch_size.saturating_sub(kept.len());
            kept.extend(dynamic::select(&mixed, need).into_iter().map(|g| base + g));
            if kept.len() >= self.config.batch_size {
                break;
            }
        }
        Ok(rollout)
    }

    pub(super) async fn ensure_sampler(&mut self) -> Result<()> {
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

    /// One step, phase by phase: sample → grade → advantages → datums → train → log.
    pub(super) async fn train_step(
        &mut self,
        step: u64,
        extra: BTreeMap<String, f64>,
    ) -> Result<StepMetrics> {
        let t_total = Instant::now();
        self.ensure_sampler().await?;
        // The batch: prefetched by an earlier step (off-policy) or sampled now.
        let ahead = match self.prefetched.front() {
            Some(r) if r.step == step => self.prefetched.pop_front(),
            _ => {
                self.prefetched.clear();
                None
            }
        };
        let Some(sampler) = self.sampler.as_ref() else {
            return Err(Error::Backend("no sampler".into()));
        };
        // Streaming applies to the default env builder and a batch not sampled ahead.
        let streaming = self.config.stream_minibatches && ahead.is_none() && !self.custom_env;
        let (rollout, advantages, mut datums, submitted) = if streaming {
            // Phases 1-4 per group, each minibatch's forward_backward submitted early.
            let s = self
                .stream_rollout(sampler, step)
                .instrument(tracing::info_span!("stream_rollout", step))
                .await?;
            (s.rollout, s.advantages, s.datums, Some(s.fb))
        } else {
            // 1. sample, 2. grade.
            let rollout = match ahead {
                Some(r) => r,
                None => self.rollout(sampler, step, step).await?,
            };
            // 3. advantages, over the groups the step trains on.
            let trained = rollout.trained();
            let advantages = advantages::group_advantages(&trained, self.config.advantage_scaling);
            // 4. datums.
            let datums = datums::build(
                &trained,
                &advantages,
                &self.config,
                self.reference.as_ref(),
                step,
            )
            .await?;
            drop(trained);
            let advantages = rollout.spread_advantages(advantages);
            (rollout, advantages, datums, None)
        };

        // 5. train, with the next batches sampled meanwhile when off-policy.
        let t_train = Instant::now();
        let prefetch_steps = self.prefetch_steps(step);
        let calls = chunk_bounds(datums.train_data.len(), self.config.num_substeps).len() as u64;
        let train_bar = self.progress.phase("training", calls);
        let update = train::update(
            &self.backend,
            &mut datums.train_data,
            submitted,
            &self.config,
            self.custom_loss.as_deref(),
            &train_bar,
        )
        .instrument(tracing::info_span!("train_step", step));
        let prefetch = async {
            let all = futures::future::join_all(
                prefetch_steps
                    .iter()
                    .map(|&s| self.rollout(sampler, s, step)),
            )
            .await;
            all.into_iter().collect::<Result<Vec<_>>>()
        };
        let (outcome, prefetched) = futures::join!(update, prefetch);
        train_bar.finish();
        let outcome = outcome?;
        self.prefetched.extend(prefetched?);
        let time_training = t_train.elapsed().as_secs_f64();
        if outcome.is_some() {
            // New weights, new sampler.
            self.sampler = Some(self.backend.sampler().await?);
        }

        // 6. log.
        self.log_step(
            step,
            extra,
            &rollout,
            &advantages,
            &datums,
            outcome.as_ref(),
            time_training,
            t_total,
        )
    }

    pub(super) fn has_eval(&self) -> bool {
        self.config.eval_every > 0 && (self.eval_dataset.is_some() || !self.evaluators.is_empty())
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
            self.finished_summary(&mut summary)?;
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
        self.flush_sinks()?;
        if let Some(dir) = &self.run_dir {
            dir.plot()?;
        }
        self.progress.finish();
        Ok(summary)
    }
}
