//! Phase 4, datums: pure datum assembly (one completion or episode -> its datums),
//! chunking, KL shaping, and the phase function that turns a graded, advantaged batch into
//! the datums sent to the backend.
//!
//! Everything but [`build`]'s reference log-probabilities is deterministic and free of I/O,
//! so it can be checked by hand.

use std::time::Instant;

use tracing::Instrument;

use crate::backend::Sampler;
use crate::error::{Error, Result};
use crate::types::{Datum, ModelInput, TokenId};

use super::advantages::is_degenerate;
use super::config::{LossAggregation, TrainerConfig};
use super::rollout::{Group, truncated};

/// What the datums phase hands to training: the datums in submission order, and what the
/// log phase reports about them.
#[derive(Default)]
pub(crate) struct Datums {
    /// The datums, group by group, completion by completion.
    pub train_data: Vec<TrainDatum>,
    /// Truncated completions left out (`mask_truncated`).
    pub masked_truncated: usize,
    /// The mean `sampled − reference` log-probability over action tokens (KL penalty on).
    pub kl_policy_base: Option<f64>,
    /// Seconds spent on the reference log-probabilities (`time/kl_vs_base`).
    pub time_kl: Option<f64>,
}

/// The datums of one group: none when the group is degenerate and not kept; a truncated
/// completion is left out (and counted in `masked`) when `mask_truncated` is on.
pub(crate) fn group_datums(
    group: &Group,
    advantages: &[f64],
    config: &TrainerConfig,
    masked: &mut usize,
) -> Result<Vec<TrainDatum>> {
    let mut out = Vec::new();
    if is_degenerate(&group.rewards()) && !config.keep_degenerate_groups {
        return Ok(out);
    }
    for (c, &a) in group.completions.iter().zip(advantages) {
        if config.mask_truncated && truncated(c) {
            *masked += 1;
            continue;
        }
        out.extend(trajectory_datums(&c.turns, a)?);
    }
    Ok(out)
}

/// Weights every datum's loss terms as `aggregation` asks (see [`LossAggregation`]), by
/// scaling its advantages: `batch` is what `TokenMean` normalises over.
pub(crate) fn aggregate(batch: &mut [TrainDatum], aggregation: LossAggregation) {
    if aggregation == LossAggregation::Sum {
        return;
    }
    let batch_tokens: f64 = batch
        .iter()
        .flat_map(|d| &d.mask)
        .map(|&m| f64::from(m))
        .sum();
    for d in batch.iter_mut() {
        let w = aggregation.weight(f64::from(d.completion_tokens), batch_tokens) as f32;
        if let Some(adv) = d.datum.advantages_mut() {
            for a in adv {
                *a *= w;
            }
        }
    }
}

/// Phase 4 of a step: the datums of every group (see [`group_datums`]), then the
/// reference-KL penalty over the whole batch when `kl_penalty_coef > 0`.
pub(crate) async fn build<S: Sampler>(
    groups: &[Group],
    advantages: &[Vec<f64>],
    config: &TrainerConfig,
    reference: Option<&S>,
    step: u64,
) -> Result<Datums> {
    let mut out = Datums::default();
    for (group, adv) in groups.iter().zip(advantages) {
        let data = group_datums(group, adv, config, &mut out.masked_truncated)?;
        out.train_data.extend(data);
    }
    if config.kl_penalty_coef > 0.0 && !out.train_data.is_empty() {
        let t = Instant::now();
        let reference = reference.ok_or_else(|| Error::Backend("no reference sampler".into()))?;
        let avg = kl_penalty(reference, &mut out.train_data, config)
            .instrument(tracing::info_span!("kl_vs_base", step))
            .await?;
        out.kl_policy_base = Some(avg);
        out.time_kl = Some(t.elapsed().as_secs_f64());
    }
    aggregate(&mut out.train_data, config.loss_aggregation);
    Ok(out)
}

/// The reference-KL penalty folded into `data`'s advantages; returns `kl_policy_base`.
pub(crate) async fn kl_penalty<S: Sampler>(
    reference: &S,
    data: &mut [TrainDatum],
    config: &TrainerConfig,
) -> Result<f64> {
    let base = reference_logprobs(reference, data).await?;
    apply_kl_penalty(
        data,
        &base,
        config.kl_penalty_coef,
        config.kl_discount_factor,
    )
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
            .target_tokens()
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

/// A datum with the local-only action mask that goes with it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct TrainDatum {
    /// What is sent to `forward_backward` (the trainer moves it into the request: after a
    /// step's update it is empty).
    pub datum: Datum,
    /// 1 on positions whose target is a sampled token, 0 on prompt positions (never sent).
    pub mask: Vec<f32>,
    /// The sampler's log-probabilities, position-aligned (0 on prompt positions).
    pub sampled_logprobs: Vec<f32>,
    /// The action tokens of the whole completion this datum is part of (of all its datums,
    /// for an episode cut into several), for [`LossAggregation::SequenceMean`].
    pub completion_tokens: f32,
}

/// Builds the training datum of one completion (cookbook §b.5, with real shifted targets).
///
/// With the full sequence `S = prompt + sampled` of length N:
/// `model_input = S[..N-1]`, `target_tokens = S[1..]`, and `logprobs` / `advantages` are 0
/// on positions whose target is a prompt token and the sampler's logprob / `advantage` on
/// positions whose target is a sampled token. Position p predicts token p+1, so the last
/// prompt position carries the first sampled token. The model input is one text chunk.
/// Returns `None` when nothing was sampled
/// (or the prompt is empty, so the first sampled token has no position predicting it).
#[cfg(test)]
pub(crate) fn build_datum(
    prompt: &ModelInput,
    sampled: &[TokenId],
    sampled_logprobs: &[f32],
    advantage: f64,
) -> Result<Option<TrainDatum>> {
    if sampled_logprobs.len() != sampled.len() {
        return Err(Error::Backend(format!(
            "sampler returned {} tokens but {} logprobs",
            sampled.len(),
            sampled_logprobs.len()
        )));
    }
    let prompt_len = prompt.len();
    if sampled.is_empty() || prompt_len == 0 {
        return Ok(None);
    }
    let ob_len = prompt_len - 1;
    let prompt_tokens = prompt.to_tokens();
    let mut input_tokens = prompt_tokens.clone();
    input_tokens.extend_from_slice(&sampled[..sampled.len() - 1]);
    let model_input = ModelInput::from_tokens(input_tokens);
    let targets: Vec<i64> = prompt_tokens[1..]
        .iter()
        .chain(sampled)
        .map(|&t| i64::from(t))
        .collect();
    let n = ob_len + sampled.len();
    let mut logprobs = vec![0.0f32; ob_len];
    logprobs.extend_from_slice(sampled_logprobs);
    let mut advantages = vec![0.0f32; ob_len];
    advantages.extend(std::iter::repeat_n(advantage as f32, sampled.len()));
    let mut mask = vec![0.0f32; ob_len];
    mask.extend(std::iter::repeat_n(1.0f32, sampled.len()));
    debug_assert_eq!(targets.len(), n);
    debug_assert_eq!(model_input.len(), n);
    let datum = Datum::new(model_input)
        .with_target_tokens(targets)
        .with_logprobs(logprobs.clone())
        .with_advantages(advantages);
    let completion_tokens = sampled.len() as f32;
    Ok(Some(TrainDatum {
        datum,
        mask,
        sampled_logprobs: logprobs,
        completion_tokens,
    }))
}

/// Builds the datums of a (possibly multi-turn) episode (cookbook §b.5): the turns are
/// concatenated while each observation extends the sequence so far (observation tokens get
/// mask 0, advantage 0, logprob 0; action tokens the sampler's logprobs and `advantage`);
/// an observation that does not extend it starts a new datum. With one turn this is exactly
/// `build_datum` (a test reference).
pub(crate) fn trajectory_datums(
    turns: &[super::rollout::Turn],
    advantage: f64,
) -> Result<Vec<TrainDatum>> {
    let mut out = Vec::new();
    // The running full sequence: tokens, logprob, advantage, mask per position. Sized for
    // every turn's observation and sample, the most it holds (one turn's exactly).
    let len: usize = turns
        .iter()
        .map(|t| t.observation.len() + t.sequence.tokens.len())
        .sum();
    let mut tokens: Vec<TokenId> = Vec::with_capacity(len);
    let mut lps: Vec<f32> = Vec::with_capacity(len);
    let mut advs: Vec<f32> = Vec::with_capacity(len);
    let mut mask: Vec<f32> = Vec::with_capacity(len);
    let emit =
        |tokens: &[TokenId], lps: &[f32], advs: &[f32], mask: &[f32], out: &mut Vec<TrainDatum>| {
            // Needs at least one action token and a position predicting it.
            if tokens.len() < 2 || !mask[1..].iter().any(|&m| m > 0.0) {
                return;
            }
            let n = tokens.len();
            let logprobs = lps[1..].to_vec();
            let datum = Datum::new(ModelInput::from_tokens(tokens[..n - 1].to_vec()))
                .with_target_tokens(tokens[1..].iter().map(|&t| i64::from(t)).collect())
                .with_logprobs(logprobs.clone())
                .with_advantages(advs[1..].to_vec());
            out.push(TrainDatum {
                datum,
                mask: mask[1..].to_vec(),
                sampled_logprobs: logprobs,
                completion_tokens: 0.0,
            });
        };
    for turn in turns {
        let seq = &turn.sequence;
        if seq.logprobs.len() != seq.tokens.len() {
            return Err(Error::Backend(format!(
                "sampler returned {} tokens but {} logprobs",
                seq.tokens.len(),
                seq.logprobs.len()
            )));
        }
        let ob = turn.observation.to_tokens();
        let delta = if ob.len() >= tokens.len() && ob[..tokens.len()] == tokens[..] {
            &ob[tokens.len()..]
        } else {
            emit(&tokens, &lps, &advs, &mask, &mut out);
            tokens.clear();
            lps.clear();
            advs.clear();
            mask.clear();
            &ob[..]
        };
        tokens.extend_from_slice(delta);
        lps.extend(std::iter::repeat_n(0.0, delta.len()));
        advs.extend(std::iter::repeat_n(0.0, delta.len()));
        mask.extend(std::iter::repeat_n(0.0, delta.len()));
        tokens.extend_from_slice(&seq.tokens);
        lps.extend_from_slice(&seq.logprobs);
        advs.extend(std::iter::repeat_n(advantage as f32, seq.tokens.len()));
        mask.extend(std::iter::repeat_n(1.0, seq.tokens.len()));
    }
    emit(&tokens, &lps, &advs, &mask, &mut out);
    // Every datum of the episode carries the episode's action-token count.
    let tokens: f32 = out.iter().flat_map(|d| &d.mask).sum();
    for d in &mut out {
        d.completion_tokens = tokens;
    }
    Ok(out)
}

/// Cuts `n` items into `k` contiguous chunks at `floor(linspace(0, n, k+1))` (the cookbook's
/// `split_list`): 5 into 2 gives sizes [2, 3]. `k` is clamped to `1..=n`; `n = 0` gives no
/// chunk.
pub(crate) fn chunk_bounds(n: usize, k: usize) -> Vec<std::ops::Range<usize>> {
    if n == 0 {
        return Vec::new();
    }
    let k = k.clamp(1, n);
    let edges: Vec<usize> = (0..=k).map(|i| i * n / k).collect();
    edges.windows(2).map(|w| w[0]..w[1]).collect()
}

/// Applies the reference-KL penalty (cookbook §b.7) to the datums' advantages in place and
/// returns `kl_policy_base`, the mean of `sampled_lp − reference_lp` over action tokens.
///
/// `reference_logprobs[i][t]` is the reference log-probability of datum i's target t.
pub(crate) fn apply_kl_penalty(
    data: &mut [TrainDatum],
    reference_logprobs: &[Vec<f32>],
    coef: f64,
    discount: f64,
) -> Result<f64> {
    if data.len() != reference_logprobs.len() {
        return Err(Error::Backend(format!(
            "{} datums but {} reference logprob rows",
            data.len(),
            reference_logprobs.len()
        )));
    }
    let mut diffs: Vec<Vec<f64>> = Vec::with_capacity(data.len());
    let (mut sum, mut count) = (0.0f64, 0.0f64);
    for (d, base) in data.iter().zip(reference_logprobs) {
        if base.len() != d.mask.len() {
            return Err(Error::Backend(format!(
                "reference logprobs have {} positions, the datum {}",
                base.len(),
                d.mask.len()
            )));
        }
        let row: Vec<f64> = d
            .mask
            .iter()
            .zip(&d.sampled_logprobs)
            .zip(base)
            .map(|((&m, &lp), &b)| f64::from(m) * (f64::from(lp) - f64::from(b)))
            .collect();
        sum += row.iter().sum::<f64>();
        count += d.mask.iter().map(|&m| f64::from(m)).sum::<f64>();
        diffs.push(row);
    }
    let avg = if count > 0.0 { sum / count } else { 0.0 };
    for (d, row) in data.iter_mut().zip(diffs) {
        let mut kl_adv: Vec<f64> = d
            .mask
            .iter()
            .zip(&row)
            .map(|(&m, &dt)| coef * f64::from(m) * (avg - dt))
            .collect();
        if discount > 0.0 {
            let mut acc = 0.0;
            for v in kl_adv.iter_mut().rev() {
                acc = *v + discount * acc;
                *v = acc;
            }
        }
        if let Some(adv) = d.datum.advantages_mut() {
            for (a, &k) in adv.iter_mut().zip(&kl_adv) {
                *a = (f64::from(*a) + k) as f32;
            }
        }
    }
    Ok(avg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_follow_floor_linspace() {
        let sizes = |n, k| {
            chunk_bounds(n, k)
                .iter()
                .map(|r| r.len())
                .collect::<Vec<_>>()
        };
        assert_eq!(sizes(5, 2), vec![2, 3]);
        assert_eq!(sizes(4, 1), vec![4]);
        assert_eq!(sizes(2, 5), vec![1, 1]);
        assert!(chunk_bounds(0, 3).is_empty());
    }

    #[test]
    fn kl_penalty_matches_hand_computation() {
        let prompt = ModelInput::from_tokens(vec![1, 2]);
        let mut data = vec![
            build_datum(&prompt, &[3, 4], &[-1.0, -2.0], 0.5)
                .unwrap()
                .unwrap(),
            build_datum(&prompt, &[5], &[-0.5], -0.5).unwrap().unwrap(),
        ];
        // Reference logprobs per target position (prompt position first).
        let base = vec![vec![-9.0, -1.5, -1.0], vec![-9.0, -1.5]];
        // d = [0, 0.5, -1.0] and [0, 1.0]; avg over 3 action tokens = 0.5 / 3.
        let avg = apply_kl_penalty(&mut data, &base, 0.1, 0.0).unwrap();
        assert!((avg - 0.5 / 3.0).abs() < 1e-12);
        let adv0 = data[0].datum.advantages().unwrap().to_vec();
        let want0 = [0.0, 0.5 + 0.1 * (avg - 0.5), 0.5 + 0.1 * (avg + 1.0)];
        for (a, w) in adv0.iter().zip(want0) {
            assert!((f64::from(*a) - w).abs() < 1e-6, "{adv0:?} vs {want0:?}");
        }
        let adv1 = data[1].datum.advantages().unwrap().to_vec();
        assert!((f64::from(adv1[1]) - (-0.5 + 0.1 * (avg - 1.0))).abs() < 1e-6);
        assert_eq!(adv1[0], 0.0);
    }

    #[test]
    fn kl_discount_sums_future_terms() {
        let prompt = ModelInput::from_tokens(vec![1]);
        let mut data = vec![
            build_datum(&prompt, &[2, 3], &[-1.0, -1.0], 0.0)
                .unwrap()
                .unwrap(),
        ];
        // d = [0, 1]: avg 0.5; kl_adv = [0.5, -0.5] · coef 1; discounted with 0.5: [0.25, -0.5].
        let base = vec![vec![-1.0, -2.0]];
        apply_kl_penalty(&mut data, &base, 1.0, 0.5).unwrap();
        let adv = data[0].datum.advantages().unwrap().to_vec();
        assert_eq!(adv, vec![0.25, -0.5]);
    }

    fn turn(ob: Vec<TokenId>, ac: Vec<TokenId>, lp: Vec<f32>) -> super::super::rollout::Turn {
        super::super::rollout::Turn {
            observation: ModelInput::from_tokens(ob),
            sequence: crate::types::SampledSequence {
                tokens: ac,
                logprobs: lp,
                stop_reason: crate::types::StopReason::Stop,
                sequence_id: None,
            },
        }
    }

    #[test]
    fn one_turn_trajectory_is_build_datum() {
        let t = turn(vec![1, 2, 3], vec![4, 5], vec![-0.5, -0.25]);
        let one = trajectory_datums(std::slice::from_ref(&t), 2.0).unwrap();
        let direct = build_datum(&t.observation, &[4, 5], &[-0.5, -0.25], 2.0)
            .unwrap()
            .unwrap();
        assert_eq!(one, vec![direct]);
    }

    #[test]
    fn multi_turn_merges_extensions_and_splits_otherwise() {
        // Turn 2's observation extends turn 1's sequence by [6]: one datum.
        let turns = vec![
            turn(vec![1, 2], vec![3], vec![-1.0]),
            turn(vec![1, 2, 3, 6], vec![7, 8], vec![-2.0, -3.0]),
        ];
        let d = trajectory_datums(&turns, 0.5).unwrap();
        assert_eq!(d.len(), 1);
        let d = &d[0];
        assert_eq!(d.datum.model_input.to_tokens(), vec![1, 2, 3, 6, 7]);
        assert_eq!(d.datum.target_tokens().unwrap(), &[2, 3, 6, 7, 8]);
        assert_eq!(d.datum.logprobs().unwrap(), &[0.0, -1.0, 0.0, -2.0, -3.0]);
        assert_eq!(d.datum.advantages().unwrap(), &[0.0, 0.5, 0.0, 0.5, 0.5]);
        assert_eq!(d.mask, vec![0.0, 1.0, 0.0, 1.0, 1.0]);
        // A re-rendered observation that is not an extension starts a new datum.
        let turns = vec![
            turn(vec![1, 2], vec![3], vec![-1.0]),
            turn(vec![9, 3], vec![4], vec![-1.0]),
        ];
        let d = trajectory_datums(&turns, 1.0).unwrap();
        assert_eq!(d.len(), 2);
        assert_eq!(d[1].datum.model_input.to_tokens(), vec![9, 3]);
        assert_eq!(d[1].datum.target_tokens().unwrap(), &[3, 4]);
    }

    #[test]
    fn datum_rejects_mismatched_logprobs() {
        let prompt = ModelInput::from_tokens(vec![1]);
        assert!(build_datum(&prompt, &[2, 3], &[-1.0], 0.0).is_err());
        assert!(build_datum(&prompt, &[], &[], 0.0).unwrap().is_none());
    }
}
