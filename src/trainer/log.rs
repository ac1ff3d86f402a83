//! Phase 6, log: the step's metrics row (`metrics.jsonl`, the cookbook's key names), the
//! cumulative counters of the loop state, and the step's samples (`log_samples`). What it
//! hands back is the [`StepMetrics`] of the step.

use std::collections::BTreeMap;
use std::time::Instant;

use crate::backend::PolicyBackend;
use crate::error::Result;
use crate::report::SampleRecord;
use crate::reward::RewardFn;

use super::advantages::{is_degenerate, mean};
use super::datums::Datums;
use super::rollout::Group;
use super::sample::Rollout;
use super::train::TrainOutcome;
use super::{GrpoTrainer, StepMetrics, metrics};

impl<B: PolicyBackend, R: RewardFn> GrpoTrainer<B, R> {
    /// Phase 6 of a step: the metrics row of step `step` (`extra`: the evaluation run before
    /// it), the cumulative counters updated, the samples written; then the loop state
    /// advanced, the row appended to `metrics.jsonl` and the progress line printed.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn log_step(
        &mut self,
        step: u64,
        extra: BTreeMap<String, f64>,
        rollout: &Rollout,
        advantages: &[Vec<f64>],
        datums: &Datums,
        outcome: Option<&TrainOutcome>,
        time_training: f64,
        t_total: Instant,
    ) -> Result<StepMetrics> {
        let train_data = &datums.train_data;
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
        if self.config.max_steps_off_policy > 0 {
            values.insert("async/staleness_mean".into(), mean(&staleness));
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
        if self.config.log_samples
            && let Some(dir) = &self.run_dir
        {
            let records = self.sample_records(step, &rollout.groups, advantages);
            dir.write_samples(step, &records)?;
        }
        let n_groups = rollout.groups.len().max(1) as f64;
        values.insert("train/frac_degenerate".into(), degenerate as f64 / n_groups);
        // The groups trained on: the kept ones with dynamic sampling, else every group but
        // the degenerate ones (unless kept on request).
        let trained = match &rollout.kept {
            Some(kept) => kept.len(),
            None if self.config.keep_degenerate_groups => rollout.groups.len(),
            None => rollout.groups.len() - degenerate,
        };
        values.insert(
            "train/groups_skipped".into(),
            (rollout.groups.len() - trained) as f64,
        );
        if self.config.dynamic_sampling_rounds > 0 || rollout.kept.is_some() {
            values.insert("dynamic_sampling/rounds".into(), rollout.rounds as f64);
            values.insert(
                "dynamic_sampling/groups_sampled".into(),
                rollout.groups.len() as f64,
            );
            values.insert("dynamic_sampling/groups_kept".into(), trained as f64);
            values.insert(
                "dynamic_sampling/groups_missing".into(),
                self.config.batch_size.saturating_sub(trained) as f64,
            );
        }
        if self.config.mask_truncated {
            values.insert(
                "train/masked_truncated".into(),
                datums.masked_truncated as f64,
            );
        }
        if let Some(avg) = datums.kl_policy_base {
            values.insert("kl_policy_base".into(), avg);
        }
        if let Some(t) = datums.time_kl {
            values.insert("time/kl_vs_base".into(), t);
        }

        let trained_tokens: usize = train_data.iter().map(|d| d.mask.len()).sum();
        values.insert("train/datums".into(), train_data.len() as f64);

        if let Some(out) = outcome {
            let pairs = train_data
                .iter()
                .zip(&out.train_logprobs)
                .filter_map(|(d, lp)| {
                    lp.as_deref()
                        .map(|lp| (&d.mask[..], &d.sampled_logprobs[..], lp))
                });
            if let Some((v1, v2)) = metrics::kl_sample_train(pairs) {
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
        // Threads of the grader pool still stuck in a reward that timed out.
        values.insert(
            "reward_errors/hung_threads".into(),
            self.grader_pool.hung_threads() as f64,
        );
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
        let logged = self.config.log_sample_groups.unwrap_or(usize::MAX);
        for (g, (group, adv)) in groups.iter().zip(advantages).enumerate().take(logged) {
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

    /// Appends `values` as step `step`'s row of `metrics.jsonl` (when there is a run
    /// directory), then sends it to the metrics sinks.
    pub(crate) fn write_row(&mut self, step: u64, values: &BTreeMap<String, f64>) -> Result<()> {
        if let Some(dir) = self.run_dir.as_mut() {
            let mut row: BTreeMap<String, serde_json::Value> = values
                .iter()
                .map(|(k, v)| (k.clone(), serde_json::Value::from(*v)))
                .collect();
            row.insert("step".into(), serde_json::Value::from(step));
            dir.append_metrics(&row)?;
        }
        for sink in &mut self.metrics_sinks {
            sink.log_metrics(step, values)?;
        }
        Ok(())
    }

    /// Flushes every metrics sink (before a checkpoint is recorded, and at the end).
    pub(crate) fn flush_sinks(&mut self) -> Result<()> {
        for sink in &mut self.metrics_sinks {
            sink.flush()?;
        }
        Ok(())
    }
}
