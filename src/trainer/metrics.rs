//! Metric rows: the cookbook's `env/all/...` trajectory metrics and the step's own counters.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::reward::RewardError;

use super::advantages::{is_degenerate, mean};
use super::rollout::{Group, truncated};

/// The metrics of one training step: the typed common values and the full row.
///
/// `values` is exactly what is written to `metrics.jsonl` (without the `step` key), with
/// the cookbook's key names where one exists (`env/all/reward/total`, `env/all/correct`,
/// `env/all/by_group/frac_mixed`, `optim/entropy`, `time/total`...).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StepMetrics {
    /// The step index (0-based).
    pub step: u64,
    /// Mean reward over every completion (`env/all/reward/total`).
    pub reward_mean: f64,
    /// Mean of the `correct` reward component, when the reward reports one. A completion
    /// whose grading failed (timeout, panic, error) counts as 0, like its reward.
    pub correct: Option<f64>,
    /// Mean of the `format` reward component, when the reward reports one. A completion
    /// whose grading failed counts as 0.
    pub format: Option<f64>,
    /// Fraction of groups whose rewards were all equal (`train/frac_degenerate`; with
    /// dynamic sampling, of every group sampled in the step's rounds).
    pub frac_degenerate: f64,
    /// Datums sent to `forward_backward` (`train/datums`).
    pub datums: usize,
    /// Tokens sampled (`tokens/sampled`).
    pub sampled_tokens: usize,
    /// Completions whose grading failed, timed out or panicked (`reward_errors/total`).
    pub reward_failures: usize,
    /// Seconds spent sampling (`time/sampling`).
    pub time_sampling: f64,
    /// Seconds spent grading (`time/grading`).
    pub time_grading: f64,
    /// Seconds spent in forward/backward + optimizer (`time/train_step`).
    pub time_training: f64,
    /// The whole row.
    pub values: BTreeMap<String, f64>,
}

impl StepMetrics {
    /// A one-line summary: reward, correct/format when present, degenerate fraction, datums,
    /// the step's wall time (`time/total`).
    ///
    /// ```
    /// use rlvr::trainer::StepMetrics;
    /// let mut m = StepMetrics { reward_mean: 0.25, frac_degenerate: 0.5, datums: 12, ..Default::default() };
    /// m.values.insert("time/total".into(), 3.26);
    /// assert_eq!(m.summary_line(), "reward 0.250 degenerate 50% datums 12 time 3.3s");
    /// ```
    pub fn summary_line(&self) -> String {
        let mut s = format!("reward {:.3}", self.reward_mean);
        if let Some(c) = self.correct {
            s.push_str(&format!(" correct {c:.3}"));
        }
        if let Some(f) = self.format {
            s.push_str(&format!(" format {f:.3}"));
        }
        if let Some(t) = self.values.get("test/env/all/correct") {
            s.push_str(&format!(" test {t:.3}"));
        }
        s.push_str(&format!(
            " degenerate {:.0}% datums {}",
            100.0 * self.frac_degenerate,
            self.datums
        ));
        if let Some(t) = self.values.get("time/total") {
            s.push_str(&format!(" time {t:.1}s"));
        }
        if self.reward_failures > 0 {
            s.push_str(&format!(" reward-failures {}", self.reward_failures));
        }
        s
    }

    /// Fills the typed fields from `values`.
    pub(crate) fn from_values(step: u64, values: BTreeMap<String, f64>) -> Self {
        let get = |k: &str| values.get(k).copied();
        StepMetrics {
            step,
            reward_mean: get("env/all/reward/total").unwrap_or(0.0),
            correct: get("env/all/correct"),
            format: get("env/all/format"),
            frac_degenerate: get("train/frac_degenerate").unwrap_or(0.0),
            datums: get("train/datums").unwrap_or(0.0) as usize,
            sampled_tokens: get("tokens/sampled").unwrap_or(0.0) as usize,
            reward_failures: get("reward_errors/total").unwrap_or(0.0) as usize,
            time_sampling: get("time/sampling").unwrap_or(0.0),
            time_grading: get("time/grading").unwrap_or(0.0),
            time_training: get("time/train_step").unwrap_or(0.0),
            values,
        }
    }
}

/// The cookbook's trajectory metrics over `groups`, keyed `{prefix}env/all/...`, plus reward
/// error counts `{prefix}reward_errors/...`.
pub(crate) fn trajectory_metrics(groups: &[Group], prefix: &str) -> BTreeMap<String, f64> {
    let mut m = BTreeMap::new();
    let mut put = |k: &str, v: f64| {
        m.insert(format!("{prefix}{k}"), v);
    };
    let completions: Vec<_> = groups.iter().flat_map(|g| &g.completions).collect();
    let episodes = completions.len() as f64;
    // As the cookbook's `compute_trajectory_metrics`: per turn, the action's tokens and the
    // whole observation's length (the context the turn was sampled from).
    let turns: usize = completions.iter().map(|c| c.turns.len()).sum();
    let ac_tokens: usize = completions.iter().map(|c| c.num_tokens()).sum();
    let ob_tokens: usize = completions
        .iter()
        .flat_map(|c| &c.turns)
        .map(|t| t.observation.len())
        .sum();
    put("env/all/total_episodes", episodes);
    put("env/all/total_turns", turns as f64);
    put("env/all/total_ac_tokens", ac_tokens as f64);
    put("env/all/total_ob_tokens", ob_tokens as f64);
    if episodes > 0.0 {
        put("env/all/turns_per_episode", turns as f64 / episodes);
    }
    if turns > 0 {
        put(
            "env/all/ac_tokens_per_turn",
            ac_tokens as f64 / turns as f64,
        );
        put(
            "env/all/ob_tokens_per_turn",
            ob_tokens as f64 / turns as f64,
        );
    }
    if episodes > 0.0 {
        let rewards: Vec<f64> = completions.iter().map(|c| c.reward).collect();
        put("env/all/reward/total", mean(&rewards));
        let trunc = completions.iter().filter(|c| truncated(c)).count();
        put("env/all/stop/max_tokens", trunc as f64 / episodes);
        let clean = completions
            .iter()
            .filter(|c| c.termination.is_clean())
            .count();
        put("env/all/parse_clean", clean as f64 / episodes);
    }
    // Components: each key averaged over the completions that report it, plus every
    // completion whose grading failed (timed out, panicked, errored), which counts as 0 for
    // every component seen in the batch — as its reward does — so a failing grader cannot
    // make `env/all/correct` look better than the rewards.
    let mut sums: BTreeMap<&str, (f64, usize)> = BTreeMap::new();
    for c in &completions {
        for (k, v) in &c.components {
            let e = sums.entry(k.as_str()).or_insert((0.0, 0));
            e.0 += v;
            e.1 += 1;
        }
    }
    for c in completions.iter().filter(|c| c.reward_error.is_some()) {
        for (k, e) in sums.iter_mut() {
            if !c.components.contains_key(*k) {
                e.1 += 1;
            }
        }
    }
    for (k, (s, n)) in sums {
        put(&format!("env/all/{k}"), s / n as f64);
    }
    if !groups.is_empty() {
        let (mut good, mut bad, mut mixed) = (0usize, 0usize, 0usize);
        for g in groups {
            let r = g.rewards();
            match (is_degenerate(&r), r.first()) {
                (true, Some(&v)) if v >= 0.5 => good += 1,
                (true, Some(_)) => bad += 1,
                _ => mixed += 1,
            }
        }
        let n = groups.len() as f64;
        put("env/all/by_group/frac_all_good", good as f64 / n);
        put("env/all/by_group/frac_all_bad", bad as f64 / n);
        put("env/all/by_group/frac_mixed", mixed as f64 / n);
    }
    let (mut failed, mut timeout, mut panic) = (0usize, 0usize, 0usize);
    for c in &completions {
        match &c.reward_error {
            Some(RewardError::Timeout(_)) => timeout += 1,
            Some(RewardError::Panicked(_)) => panic += 1,
            Some(_) => failed += 1,
            None => {}
        }
    }
    put("reward_errors/total", (failed + timeout + panic) as f64);
    put("reward_errors/failed", failed as f64);
    put("reward_errors/timeout", timeout as f64);
    put("reward_errors/panic", panic as f64);
    m
}

/// `optim/entropy`: minus the mean sampled log-probability over every sampled token.
pub(crate) fn sampler_entropy(groups: &[Group]) -> Option<f64> {
    let (mut s, mut n) = (0.0f64, 0usize);
    // Slice by slice (the same order as `Completion::logprobs`), a plain loop each.
    for c in groups.iter().flat_map(|g| &g.completions) {
        for t in &c.turns {
            for &l in &t.sequence.logprobs {
                s += f64::from(l);
            }
            n += t.sequence.logprobs.len();
        }
    }
    (n > 0).then(|| -s / n as f64)
}

/// `optim/kl_sample_train_v1` and `_v2` from the sampler's and the learner's log-probs over
/// action positions: mean(Δ) and ½·mean(Δ²), Δ = lp_sample − lp_train.
/// `pairs`: (mask, sampler log-probs, learner log-probs) per datum.
pub(crate) fn kl_sample_train<'a>(
    pairs: impl Iterator<Item = (&'a [f32], &'a [f32], &'a [f32])>,
) -> Option<(f64, f64)> {
    let (mut s1, mut s2, mut n) = (0.0f64, 0.0f64, 0.0f64);
    for (mask, sampled, train) in pairs {
        for ((&m, &a), &b) in mask.iter().zip(sampled).zip(train) {
            if m > 0.0 {
                let d = f64::from(a) - f64::from(b);
                s1 += d;
                s2 += d * d;
                n += 1.0;
            }
        }
    }
    (n > 0.0).then(|| (s1 / n, 0.5 * s2 / n))
}
