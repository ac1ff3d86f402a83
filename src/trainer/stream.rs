//! Streamed minibatches (`stream_minibatches`): phases 1–4 per group instead of per batch,
//! and each minibatch's `forward_backward` submitted as soon as its groups are graded, while
//! the other groups are still sampling. The same environments, seeds, advantages and datums
//! as the batch-wise phases; only the timing (and the KL penalty's batch: per minibatch)
//! differs.

use std::time::Instant;

use futures::stream::{FuturesUnordered, StreamExt};

use crate::backend::PolicyBackend;
use crate::error::{Error, Result};
use crate::reward::RewardFn;

use super::advantages::compute_advantages;
use super::datums::{aggregate, group_datums, kl_penalty, Datums, TrainDatum};
use super::grade::{grade_group, RunningReward};
use super::rollout::Group;
use super::sample::{mix, sample_group, Rollout};
use super::train::Submitted;
use super::GrpoTrainer;

/// What a streaming rollout produced: the rollout, its advantages, the datums in submission
/// order, and their submitted `forward_backward`s.
pub(crate) struct Streamed {
    pub rollout: Rollout,
    pub advantages: Vec<Vec<f64>>,
    pub datums: Datums,
    pub fb: Submitted,
}

impl<B: PolicyBackend, R: RewardFn> GrpoTrainer<B, R> {
    /// Streaming rollout: every group is sampled and graded concurrently, and as soon as a
    /// minibatch's worth of groups (`ceil(batch_size / num_minibatches)`) has been graded,
    /// its datums are built (KL penalty per minibatch) and its `forward_backward` is
    /// submitted while the other groups are still sampling. Skipped groups still take their
    /// slot in a minibatch, as in the cookbook.
    pub(crate) async fn stream_rollout(&self, sampler: &B::Sampler, step: u64) -> Result<Streamed> {
        let problems = self.batch(step)?;
        let params = self.sampling_params(self.config.max_tokens, self.config.temperature);
        let seed = self.config.seed;
        let g_size = self.config.group_size;
        let n_groups = problems.len();
        let per_mb = n_groups.div_ceil(self.config.num_minibatches).max(1);
        let t = Instant::now();
        let bar = self
            .progress
            .phase("rollout", n_groups.saturating_mul(1 + g_size) as u64);
        let running = RunningReward::default();
        let builder = self.env_builder.as_ref();
        let mut pending: FuturesUnordered<_> = problems
            .iter()
            .enumerate()
            .map(|(g, problem)| {
                let (bar, params, running) = (&bar, &params, &running);
                async move {
                    let sampled = sample_group(
                        sampler,
                        builder,
                        problem,
                        g_size,
                        params,
                        mix(seed, step, g as u64),
                        bar,
                    )
                    .await?;
                    let group = grade_group(
                        sampler,
                        sampled,
                        params,
                        self.config.max_turns,
                        self.renderer.as_ref(),
                        step,
                        bar,
                        running,
                    )
                    .await?;
                    Ok::<_, Error>((g, group))
                }
            })
            .collect();
        let mut groups: Vec<Option<Group>> = vec![None; n_groups];
        let mut advantages: Vec<Vec<f64>> = vec![Vec::new(); n_groups];
        let mut datums = Datums::default();
        let mut fb: Submitted = Vec::new();
        let (mut kl_sum, mut kl_tokens) = (0.0f64, 0.0f64);
        let mut minibatch: Vec<TrainDatum> = Vec::new();
        let mut slots = 0usize;
        let mut arrived = 0usize;
        while let Some(next) = pending.next().await {
            let (g, group) = next?;
            let adv = compute_advantages(
                std::slice::from_ref(&group.rewards()),
                self.config.advantage_scaling,
            )
            .pop()
            .unwrap_or_default();
            minibatch.extend(group_datums(
                &group,
                &adv,
                &self.config,
                &mut datums.masked_truncated,
            )?);
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
                    let avg = kl_penalty(reference, &mut mb, &self.config).await?;
                    let tokens: f64 = mb.iter().flat_map(|d| &d.mask).map(|&m| f64::from(m)).sum();
                    kl_sum += avg * tokens;
                    kl_tokens += tokens;
                }
                aggregate(&mut mb, self.config.loss_aggregation);
                let start = datums.train_data.len();
                let batch = mb.iter().map(|d| d.datum.clone()).collect();
                let submitted = self
                    .backend
                    .forward_backward(batch, self.config.loss)
                    .await?;
                datums.train_data.extend(mb);
                fb.push((start..datums.train_data.len(), submitted));
            }
            if slots == per_mb {
                slots = 0;
            }
        }
        drop(pending);
        bar.finish();
        if kl_tokens > 0.0 {
            datums.kl_policy_base = Some(kl_sum / kl_tokens);
        }
        Ok(Streamed {
            rollout: Rollout {
                step,
                groups: groups.into_iter().flatten().collect(),
                time_sampling: t.elapsed().as_secs_f64(),
                time_grading: 0.0,
            },
            advantages,
            datums,
            fb,
        })
    }
}
