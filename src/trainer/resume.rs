//! Setup, checkpoints and resume: the [`LoopState`] a checkpoint stores; the run directory,
//! the last checkpoint's loop state checked against this trainer's config (seed, batch size,
//! shuffle, dataset length, renderer) and loaded; `config.json`; the reference sampler;
//! saving checkpoints; the summary of a finished run.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use tracing::Instrument;

use crate::backend::PolicyBackend;
use crate::error::{Error, Result};
use crate::report::{CheckpointRecord, Progress, ProgressMode, RunDir};
use crate::reward::RewardFn;
use crate::types::CheckpointRef;

use super::{GrpoTrainer, RunSummary, StepMetrics, prefetch};

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
    /// The batches sampled ahead that the checkpoint saved (`max_steps_off_policy > 0`): a
    /// file relative to the run directory (`prefetched/<name>.json`), `None` when there
    /// were none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefetched: Option<String>,
}

impl<B: PolicyBackend, R: RewardFn> GrpoTrainer<B, R> {
    /// Creates the run directory (resuming from its last checkpoint if it has one), writes
    /// `config.json` (on a resume `config.resume-NNNNNN.json` instead, the original kept),
    /// and creates the reference sampler. Idempotent.
    pub(crate) async fn setup(&mut self) -> Result<()> {
        if self.set_up {
            return Ok(());
        }
        if let Some(dir) = &self.config.log_dir {
            let mut run_dir = RunDir::create(dir)?;
            self.backend.use_run_dir(run_dir.path());
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
                if let (Some(old), Some(new)) = (&state.renderer, &self.config.renderer_name)
                    && old != new
                {
                    return Err(Error::config(
                        "renderer_name",
                        format!(
                            "the run in {} was trained with renderer `{old}`, this trainer renders with `{new}`; resuming would change the prompts and the tokens trained on",
                            run_dir.path().display()
                        ),
                    ));
                }
                let prefetched = match &state.prefetched {
                    Some(file) if rec.step < self.total_steps => {
                        prefetch::load(&run_dir.path().join(file), rec.step, self.total_steps)?
                    }
                    _ => Vec::new(),
                };
                self.backend.load_state(&rec.backend).await?;
                self.prefetched = prefetched.into();
                self.state = LoopState {
                    next_step: rec.step,
                    shuffle: Some(self.config.shuffle),
                    dataset_len: Some(len),
                    renderer: self.config.renderer_name.clone(),
                    prefetched: None,
                    ..state
                };
                if rec.step >= self.total_steps {
                    // A finished run: its rows (the final eval's included) stay as they are.
                    tracing::info!(checkpoint = %rec.name, step = rec.step, "the run is already complete");
                    self.finished = Some(rec);
                } else {
                    tracing::info!(checkpoint = %rec.name, step = rec.step, "resuming");
                    // What the killed run did past its checkpoint is done again: drop it.
                    run_dir.truncate_metrics_from(rec.step)?;
                    run_dir.drop_samples_from(rec.step)?;
                }
            } else {
                // No checkpoint: a run killed before its first one starts over from step 0,
                // so whatever it recorded goes.
                run_dir.truncate_metrics_from(0)?;
                run_dir.drop_samples_from(0)?;
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
            #[cfg(feature = "tensorboard")]
            if self.config.tensorboard && self.finished.is_none() {
                let sink = crate::report::TensorBoardSink::create(run_dir.path())?;
                self.metrics_sinks.insert(0, Box::new(sink));
            }
            self.run_dir = Some(run_dir);
        }
        if !self.metrics_sinks.is_empty() {
            let mut doc = self.config_document()?;
            crate::report::redact_secrets(&mut doc);
            for sink in &mut self.metrics_sinks {
                sink.start(&doc, self.state.next_step)?;
            }
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

    /// `config.json`'s content: the config, plus the run metadata under `"run"`.
    fn config_document(&self) -> Result<serde_json::Value> {
        let mut doc = serde_json::to_value(&self.config)
            .map_err(|e| Error::config("config", format!("cannot serialize to JSON: {e}")))?;
        if let (Some(meta), Some(obj)) = (&self.run_metadata, doc.as_object_mut()) {
            obj.insert("run".into(), meta.clone());
        }
        Ok(doc)
    }

    /// Saves backend state + loop state as `name` and records it in `checkpoints.jsonl`.
    pub(crate) async fn save_checkpoint(&mut self, name: &str) -> Result<Option<CheckpointRef>> {
        if self.run_dir.is_none() {
            return Ok(None);
        }
        let backend = self
            .backend
            .save_state(&format!("{}-{name}", self.state.run_id))
            .instrument(tracing::info_span!("save_checkpoint", name))
            .await?;
        // The batches sampled ahead go with the checkpoint: a resume trains on them as the
        // uninterrupted run would (re-sampling would use another policy).
        let mut state = self.state.clone();
        if let Some(dir) = &self.run_dir
            && !self.prefetched.is_empty()
        {
            let path = dir.prefetched_path(name);
            prefetch::save(&path, self.prefetched.iter())?;
            state.prefetched = Some(format!("{}/{name}.json", crate::report::PREFETCHED_DIR));
        }
        let loop_state = serde_json::to_value(&state)
            .map_err(|e| Error::Backend(format!("serializing the loop state: {e}")))?;
        let rec = CheckpointRecord {
            step: self.state.next_step,
            name: name.to_string(),
            backend: backend.clone(),
            loop_state,
        };
        // The metrics sent so far are made durable before the checkpoint a resume starts from.
        self.flush_sinks()?;
        if let Some(dir) = self.run_dir.as_mut() {
            dir.append_checkpoint(&rec)?;
        }
        self.redraw_plot();
        Ok(Some(backend))
    }

    /// Redraws `reward.png`/`.svg` mid-run (after an evaluation or a checkpoint), so that a
    /// run that crashes later still has a current plot. A failure is only logged: a plot is
    /// not worth stopping training for (the end of [`run`](Self::run) reports it).
    pub(crate) fn redraw_plot(&self) {
        if let Some(dir) = &self.run_dir
            && let Err(e) = dir.plot()
        {
            tracing::warn!(error = %e, "redrawing the reward plot failed");
        }
    }

    /// The summary of a finished run (its last checkpoint at `total_steps`), read back from
    /// `metrics.jsonl` and `checkpoints.jsonl`; nothing is touched but the plot.
    pub(crate) fn finished_summary(&self, summary: &mut RunSummary) -> Result<()> {
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
        Ok(())
    }
}
