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

use super::GrpoTrainer;
use super::advantages::{compute_advantages, is_degenerate};
use super::datums::{Datums, TrainDatum, aggregate, group_datums, kl_penalty};
use super::dynamic::{self, Arrival, decide};
use super::grade::{RunningReward, grade_group};
use super::rollout::Group;
use super::sample::{Rollout, sample_group};
use super::train::Submitted;

/// What a streaming rollout produced: the rollout, its advantages, the datums in submission
/// order, and their submitted `forward_backward`s.
pub(crate) struct Streamed {
    pub rollout: Rollout,
    pub advantages: Vec<Vec<f64>>,
    pub datums: Datums,
    pub fb: Submitted,
}

/// The minibatch being filled and what was submitted so far.
struct Minibatches {
    /// Groups per minibatch: `ceil(batch_size / num_minibatches)`.
    per_mb: usize,
    /// Groups in the minibatch being filled (their slots; a skipped group may hold one).
    slots: usize,
    minibatch: Vec<TrainDatum>,
    datums: Datums,
    fb: Submitted,
    kl_sum: f64,
    kl_tokens: f64,
}

impl<B: PolicyBackend, R: RewardFn> GrpoTrainer<B, R> {
    /// Streaming rollout: every group is sampled and graded concurrently, and as soon as a
    /// minibatch's worth of groups (`ceil(batch_size / num_minibatches)`) has been graded,
    /// its datums are built (KL penalty per minibatch) and its `forward_backward` is
    /// submitted while the other groups are still sampling. Skipped groups still take their
    /// slot in a minibatch, as in the cookbook.
    ///
    /// With dynamic sampling the slots are the kept groups': a group takes one once it is
    /// certainly among the first `batch_size` groups with differing rewards in (round,
    /// group) order ([`dynamic::decide`]) — at once in round 0, in group order in later
    /// rounds as far as the groups still pending allow — so the kept set is the batch-wise
    /// one. Rounds run one after the other, each only when the ones before left the batch
    /// short; the last minibatch goes out when the batch is full or the last round is in.
    pub(crate) async fn stream_rollout(&self, sampler: &B::Sampler, step: u64) -> Result<Streamed> {
        let params = self.sampling_params(self.config.max_tokens, self.config.temperature);
        let seed = self.config.seed;
        let g_size = self.config.group_size;
        let b = self.config.batch_size;
        let max_rounds = self.config.dynamic_sampling_rounds;
        let dynamic = max_rounds > 0;
        let mut mb = Minibatches {
            per_mb: b.div_ceil(self.config.num_minibatches).max(1),
            slots: 0,
            minibatch: Vec::new(),
            datums: Datums::default(),
            fb: Vec::new(),
            kl_sum: 0.0,
            kl_tokens: 0.0,
        };
        let t = Instant::now();
        let running = RunningReward::default();
        let builder = self.env_builder.as_ref();
        let mut groups: Vec<Option<Group>> = Vec::new();
        let mut advantages: Vec<Vec<f64>> = Vec::new();
        let mut kept: Vec<usize> = Vec::new();
        let mut rounds = 0;
        for round in 0..=max_rounds {
            let problems = self.round_batch(step, round)?;
            let n_groups = problems.len();
            let bar = self
                .progress
                .phase("rollout", n_groups.saturating_mul(1 + g_size) as u64);
            let base = groups.len();
            groups.resize_with(base + n_groups, || None);
            advantages.resize_with(base + n_groups, Vec::new);
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
                            dynamic::group_seed(seed, step, round, g),
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
            let need = b.saturating_sub(kept.len());
            let mut arrivals = vec![Arrival::Pending; n_groups];
            while let Some(next) = pending.next().await {
                let (g, group) = next?;
                if !dynamic {
                    // Every group takes its slot, a skipped one included.
                    advantages[g] = self.accept(&group, &mut mb).await?;
                    groups[g] = Some(group);
                    continue;
                }
                arrivals[g] = Arrival::Graded {
                    mixed: !is_degenerate(&group.rewards()),
                };
                groups[base + g] = Some(group);
                for k in decide(&mut arrivals, need) {
                    if let Some(group) = &groups[base + k] {
                        advantages[base + k] = self.accept(group, &mut mb).await?;
                    }
                    kept.push(base + k);
                    if kept.len() == b {
                        // The batch is full: its last minibatch goes out now.
                        self.submit(&mut mb).await?;
                    }
                }
            }
            drop(pending);
            bar.finish();
            rounds = round;
            if !dynamic || kept.len() >= b {
                break;
            }
        }
        // What is left: the last minibatch of a batch without dynamic sampling, or of one
        // the last round left short.
        self.submit(&mut mb).await?;
        if mb.kl_tokens > 0.0 {
            mb.datums.kl_policy_base = Some(mb.kl_sum / mb.kl_tokens);
        }
        // Datums and kept set: in the order they were decided; the rollout lists its kept
        // groups in (round, group) order like the batch-wise one.
        kept.sort_unstable();
        let rollout = Rollout {
            step,
            groups: groups.into_iter().flatten().collect(),
            kept: dynamic.then_some(kept),
            rounds,
            time_sampling: t.elapsed().as_secs_f64(),
            time_grading: 0.0,
        };
        // Sampled but not kept: advantage 0 (no gradient).
        let advantages = match &rollout.kept {
            Some(kept) => {
                let trained = kept.iter().map(|&k| std::mem::take(&mut advantages[k]));
                rollout.spread_advantages(trained.collect())
            }
            None => advantages,
        };
        Ok(Streamed {
            rollout,
            advantages,
            datums: mb.datums,
            fb: mb.fb,
        })
    }

    /// Puts `group`'s datums in the minibatch being filled (a degenerate group's are none
    /// unless kept on request) and takes its slot; a full minibatch is submitted. Returns
    /// the group's advantages.
    async fn accept(&self, group: &Group, mb: &mut Minibatches) -> Result<Vec<f64>> {
        let adv = compute_advantages(
            std::slice::from_ref(&group.rewards()),
            self.config.advantage_scaling,
        )
        .pop()
        .unwrap_or_default();
        mb.minibatch.extend(group_datums(
            group,
            &adv,
            &self.config,
            &mut mb.datums.masked_truncated,
        )?);
        mb.slots += 1;
        if mb.slots == mb.per_mb {
            self.submit(mb).await?;
        }
        Ok(adv)
    }

    /// Submits the minibatch being filled (KL penalty and aggregation over it), if it holds
    /// any datum, and starts the next one.
    async fn submit(&self, mb: &mut Minibatches) -> Result<()> {
        mb.slots = 0;
        if mb.minibatch.is_empty() {
            return Ok(());
        }
        let mut data = std::mem::take(&mut mb.minibatch);
        if self.config.kl_penalty_coef > 0.0 {
            let reference = self
                .reference
                .as_ref()
                .ok_or_else(|| Error::Backend("no reference sampler".into()))?;
            let avg = kl_penalty(reference, &mut data, &self.config).await?;
            let tokens: f64 = data
                .iter()
                .flat_map(|d| &d.mask)
                .map(|&m| f64::from(m))
                .sum();
            mb.kl_sum += avg * tokens;
            mb.kl_tokens += tokens;
        }
        aggregate(&mut data, self.config.loss_aggregation);
        let start = mb.datums.train_data.len();
        let batch = data.iter().map(|d| d.datum.clone()).collect();
        let submitted = self
            .backend
            .forward_backward(batch, self.config.loss)
            .await?;
        mb.datums.train_data.extend(data);
        mb.fb.push((start..mb.datums.train_data.len(), submitted));
        Ok(())
    }
}
