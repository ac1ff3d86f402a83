//! Phase 1, sample: the step's batch of problems (deterministic order), one group of
//! environments per problem, and the first turn of every group sampled — one `sample` call
//! per group when its environments share their first observation (every single-turn
//! problem), all groups concurrently.
//!
//! A single-turn problem is a [`ProblemEnv`](super::ProblemEnv): there is no other path.
//! What this phase hands to [grading](super::grade) is a [`Sampled`] group per problem:
//! its environments, their first observations and the first turn's actions.

use std::sync::Arc;

use futures::future::join_all;

use crate::backend::{PolicyBackend, Sampler};
use crate::dataset::Problem;
use crate::error::{Error, Result};
use crate::report::PhaseBar;
use crate::reward::RewardFn;
use crate::types::{SampledSequence, SamplingParams};

use super::GrpoTrainer;
use super::env::{Env, EnvBuilder, Observation};
use super::rollout::Group;

/// A batch of graded groups, with the time each phase took.
pub(crate) struct Rollout {
    /// The step whose batch this is.
    pub step: u64,
    /// The graded groups, in batch order: with dynamic sampling, every group sampled for
    /// the step, round after round (`(1 + rounds) · batch_size` of them).
    pub groups: Vec<Group>,
    /// With dynamic sampling, the indices in `groups` of the groups the step trains on (in
    /// order); `None` without it (every group, degenerate ones skipped by the datums phase).
    pub kept: Option<Vec<usize>>,
    /// Extra rounds of dynamic sampling the step ran.
    pub rounds: usize,
    /// Seconds spent in the sample phase.
    pub time_sampling: f64,
    /// Seconds spent in the grade phase.
    pub time_grading: f64,
}

/// One group after the sample phase.
pub(crate) struct Sampled {
    /// The problem.
    pub problem: Arc<Problem>,
    /// Its `group_size` fresh environments.
    pub envs: Vec<Box<dyn Env>>,
    /// Their first observations.
    pub first: Vec<Observation>,
    /// The first turn's action of each env, when the group shared one `sample` call.
    pub actions: Vec<Option<SampledSequence>>,
    /// The group's seed (per-env calls derive theirs from it).
    pub seed: u64,
}

/// SplitMix64 of three words: per-(step, prompt) sampling seeds, in `0..2^31`.
///
/// The seeds are sent to the backend as given, and sampling engines behind some
/// Tinker-compatible servers take only 32-bit seeds (JAX refuses larger ones), so the
/// trainer keeps the top 31 bits of the mix: a non-negative `int32` every server accepts.
pub(crate) fn mix(a: u64, b: u64, c: u64) -> u64 {
    let mut z = a ^ b.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ c.wrapping_mul(0xD6E8_FEB8_6659_FD93);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    (z ^ (z >> 31)) >> 33
}

/// Seed domain of evaluation sampling (keeps it apart from training sampling).
pub(crate) const EVAL_DOMAIN: u64 = 0x4556_414c;

/// The dataset indices of step `step`'s batch: positions `[step·B, (step+1)·B)` of the
/// endless stream made of one permutation per epoch ([`dataset::epoch_indices`](crate::dataset::epoch_indices))
/// or `0..len` repeated without shuffling.
/// Depends only on its arguments, so a resumed run sees the same order.
pub(crate) fn batch_indices(
    len: usize,
    batch_size: usize,
    step: u64,
    seed: u64,
    shuffle: bool,
) -> Result<Vec<usize>> {
    let start = step
        .checked_mul(batch_size as u64)
        .ok_or_else(|| Error::config("max_steps", "step × batch_size overflows"))?;
    stream_indices(len, start, batch_size, seed, shuffle, "max_steps")
}

/// Positions `[start, start + count)` of the endless stream of dataset indices made of one
/// permutation per epoch (`dataset::epoch_indices(len, seed, epoch)`) or `0..len` repeated
/// without shuffling. An overflowing position is an [`Error::Config`] naming `field`.
pub(crate) fn stream_indices(
    len: usize,
    start: u64,
    count: usize,
    seed: u64,
    shuffle: bool,
    field: &str,
) -> Result<Vec<usize>> {
    if len == 0 {
        return Err(Error::config("dataset", "the training dataset is empty"));
    }
    let end = start
        .checked_add(count as u64)
        .ok_or_else(|| Error::config(field, "the position in the data stream overflows"))?;
    let len64 = len as u64;
    let mut out = Vec::with_capacity(count);
    let mut cached: Option<(u64, Vec<usize>)> = None;
    for pos in start..end {
        let epoch = pos / len64;
        let within = (pos % len64) as usize;
        if !shuffle {
            out.push(within);
            continue;
        }
        if cached.as_ref().map(|(e, _)| *e) != Some(epoch) {
            cached = Some((epoch, crate::dataset::epoch_indices(len, seed, epoch)));
        }
        if let Some((_, perm)) = &cached {
            out.push(perm[within]);
        }
    }
    Ok(out)
}

/// Phase 1 of a step: makes the environments of every problem and samples every group's
/// first turn, all groups concurrently. Group `g`'s seed is `mix(seed, step, g)`.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn sample<S: Sampler>(
    sampler: &S,
    builder: &dyn EnvBuilder,
    problems: &[Arc<Problem>],
    group_size: usize,
    params: &SamplingParams,
    seed: u64,
    step: u64,
    bar: &PhaseBar,
) -> Result<Vec<Sampled>> {
    let futures = problems.iter().enumerate().map(|(g, problem)| {
        sample_group(
            sampler,
            builder,
            problem,
            group_size,
            params,
            mix(seed, step, g as u64),
            bar,
        )
    });
    join_all(futures).await.into_iter().collect()
}

/// The sample phase of one group: `group_size` environments of `problem`, their first
/// observations, and — when they all start from the same observation — one `sample` call of
/// `group_size` completions with seed `group_seed`.
pub(crate) async fn sample_group<S: Sampler>(
    sampler: &S,
    builder: &dyn EnvBuilder,
    problem: &Arc<Problem>,
    group_size: usize,
    params: &SamplingParams,
    group_seed: u64,
    bar: &PhaseBar,
) -> Result<Sampled> {
    let mut envs = builder.make_envs(Arc::clone(problem), group_size)?;
    let mut first = Vec::with_capacity(envs.len());
    for env in envs.iter_mut() {
        first.push(env.initial_observation().await?);
    }
    let mut actions: Vec<Option<SampledSequence>> = vec![None; envs.len()];
    if let Some(head) = first.first()
        && first.iter().all(|o| o == head)
    {
        let p = SamplingParams {
            seed: Some(group_seed),
            stop: Some(head.stop.clone()),
            ..params.clone()
        };
        let out = sampler.sample(&head.input, envs.len(), &p).await?;
        if out.len() != envs.len() {
            return Err(Error::Backend(format!(
                "sampler returned {} sequences for {} requested",
                out.len(),
                envs.len()
            )));
        }
        actions = out.into_iter().map(Some).collect();
    }
    bar.inc(1);
    Ok(Sampled {
        problem: Arc::clone(problem),
        envs,
        first,
        actions,
        seed: group_seed,
    })
}

impl Rollout {
    /// The groups the step trains on: the kept ones with dynamic sampling, else all.
    pub(crate) fn trained(&self) -> std::borrow::Cow<'_, [Group]> {
        match &self.kept {
            Some(kept) => kept.iter().map(|&i| self.groups[i].clone()).collect(),
            None => std::borrow::Cow::Borrowed(&self.groups),
        }
    }

    /// `trained`'s advantages (one list per trained group) spread over every group of the
    /// rollout: a group sampled but not kept gets advantage 0 (it has no gradient).
    pub(crate) fn spread_advantages(&self, trained: Vec<Vec<f64>>) -> Vec<Vec<f64>> {
        match &self.kept {
            None => trained,
            Some(kept) => {
                let mut out: Vec<Vec<f64>> = self
                    .groups
                    .iter()
                    .map(|g| vec![0.0; g.completions.len()])
                    .collect();
                for (&i, adv) in kept.iter().zip(trained) {
                    out[i] = adv;
                }
                out
            }
        }
    }
}

impl<B: PolicyBackend, R: RewardFn> GrpoTrainer<B, R> {
    /// The problems of round `round` of step `step`: the step's batch for round 0, else
    /// the extra round's draw from dynamic sampling's second pass
    /// ([`dynamic::extra_indices`](super::dynamic::extra_indices)).
    pub(crate) fn round_batch(&self, step: u64, round: usize) -> Result<Vec<Arc<Problem>>> {
        let (len, b, seed) = (self.dataset.len(), self.config.batch_size, self.config.seed);
        let indices = if round == 0 {
            batch_indices(len, b, step, seed, self.config.shuffle)?
        } else {
            super::dynamic::extra_indices(
                len,
                b,
                self.config.dynamic_sampling_rounds,
                step,
                round,
                seed,
            )?
        };
        indices
            .into_iter()
            .map(|i| self.dataset.get(i).map(Arc::new))
            .collect()
    }

    pub(crate) fn sampling_params(&self, max_tokens: u32, temperature: f32) -> SamplingParams {
        SamplingParams {
            max_tokens: Some(max_tokens),
            temperature,
            stop: Some(self.renderer.stop()),
            ..SamplingParams::default()
        }
    }

    /// The steps to sample ahead during step `step`'s update: up to `max_steps_off_policy`,
    /// never more than the steps left (any `max_steps_off_policy` is safe), none already
    /// sampled.
    pub(crate) fn prefetch_steps(&self, step: u64) -> Vec<u64> {
        let ahead = self
            .config
            .max_steps_off_policy
            .min(self.total_steps.saturating_sub(step.saturating_add(1)));
        (1..=ahead)
            .map(|k| step + k)
            .filter(|s| *s < self.total_steps && !self.prefetched.iter().any(|r| r.step == *s))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_are_deterministic_and_cover_each_epoch() {
        let a = batch_indices(10, 5, 0, 7, true).unwrap();
        let b = batch_indices(10, 5, 1, 7, true).unwrap();
        let mut all: Vec<usize> = a.iter().chain(&b).copied().collect();
        assert_eq!(a, batch_indices(10, 5, 0, 7, true).unwrap());
        all.sort_unstable();
        assert_eq!(all, (0..10).collect::<Vec<_>>());
        // The second epoch is a different permutation.
        let e2: Vec<usize> = [2, 3]
            .iter()
            .flat_map(|&s| batch_indices(10, 5, s, 7, true).unwrap())
            .collect();
        assert_ne!(e2, a.iter().chain(&b).copied().collect::<Vec<_>>());
        assert_eq!(batch_indices(3, 2, 1, 0, false).unwrap(), vec![2, 0]);
        assert!(batch_indices(0, 2, 0, 0, true).is_err());
        // A step near the end of u64 (e.g. from a tampered loop state) is an error, not a
        // panic.
        let last = u64::MAX / 2;
        assert!(matches!(
            batch_indices(3, 2, last, 0, false),
            Err(Error::Config { ref field, .. }) if field == "max_steps"
        ));
    }
}
