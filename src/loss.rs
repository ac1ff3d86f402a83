//! Custom losses over the learner's log-probabilities, run as the Tinker SDK's
//! `TrainingClient.forward_backward_custom` runs them, on any [`PolicyBackend`].
//!
//! A [`CustomLoss`] maps every datum's per-token log-probabilities `lp` to a scalar `C` and
//! its gradient `∂C/∂lp`. [`forward_backward_custom`] then
//!
//! 1. runs a forward pass with loss `cross_entropy` (each datum's `target_tokens`, and its
//!    `weights` or zeros) to get `lp`;
//! 2. calls the loss on the original data and `lp`;
//! 3. runs a `forward_backward` with loss `cross_entropy`, the same `target_tokens` and
//!    `weights = −∂C/∂lp`: the backend's cross-entropy `−Σ w·lp` then has gradient
//!    `Σ ∂C/∂lp · ∂lp/∂θ = ∂C/∂θ`.
//!
//! Shipped losses: [`ImportanceSamplingLoss`] and [`PpoLoss`] (the built-in
//! [`LossFn`]s written as custom losses), [`Gspo`] and [`DrGrpo`]. They read each datum's
//! `logprobs` (the sampler's, 0 on prompt positions) and `advantages` (0 on prompt
//! positions), as the trainer builds them.

use std::collections::BTreeMap;

use crate::backend::api::PolicyBackend;
use crate::error::{Error, Result};
use crate::types::{Datum, ForwardBackwardOutput, LossFn, LossInput};

/// What a [`CustomLoss`] returns: the loss, its gradient with respect to every
/// log-probability, and metrics.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CustomLossOutput {
    /// The loss `C` (reported as `loss:sum`).
    pub loss: f64,
    /// `∂C/∂lp`: one vector per datum, each of that datum's log-probabilities' length.
    pub grads: Vec<Vec<f32>>,
    /// Metrics merged into the result's (keys with a `:reduction` suffix, e.g.
    /// `gspo/clip_frac:mean`).
    pub metrics: BTreeMap<String, f64>,
}

/// A loss computed on this machine from the learner's per-token log-probabilities.
///
/// `logprobs[i]` are datum `i`'s log-probabilities of its `target_tokens`; the loss returns
/// its value and `∂loss/∂logprobs` (same shapes). Run it with [`forward_backward_custom`].
///
/// ```
/// use std::collections::BTreeMap;
/// use rlvr::loss::{CustomLoss, CustomLossOutput};
/// use rlvr::types::{Datum, ModelInput};
///
/// /// Negative mean log-probability of each sequence, summed over sequences.
/// struct MeanNll;
///
/// impl CustomLoss for MeanNll {
///     fn loss(&self, _data: &[Datum], logprobs: &[Vec<f32>]) -> rlvr::Result<CustomLossOutput> {
///         let mut out = CustomLossOutput::default();
///         for lp in logprobs {
///             let n = lp.len().max(1) as f32;
///             out.loss -= lp.iter().map(|&x| x as f64).sum::<f64>() / n as f64;
///             out.grads.push(vec![-1.0 / n; lp.len()]);
///         }
///         Ok(out)
///     }
/// }
///
/// let data = vec![Datum::new(ModelInput::from_tokens(vec![1, 2]))];
/// let out = MeanNll.loss(&data, &[vec![-1.0, -3.0]])?;
/// assert_eq!(out.loss, 2.0);
/// assert_eq!(out.grads, vec![vec![-0.5, -0.5]]);
/// # Ok::<(), rlvr::Error>(())
/// ```
pub trait CustomLoss: Send + Sync {
    /// The loss of `data` given the learner's `logprobs` (one vector per datum) and its
    /// gradient with respect to `logprobs`.
    fn loss(&self, data: &[Datum], logprobs: &[Vec<f32>]) -> Result<CustomLossOutput>;
}

/// Runs `loss` on `data` as the Tinker SDK's `forward_backward_custom` does: a forward pass,
/// the loss and its gradient here, then a `cross_entropy` `forward_backward` with
/// `weights = −∂loss/∂logprobs`. Gradients accumulate until the next `optim_step`.
///
/// Every datum needs `target_tokens`; only `target_tokens` and `weights` are sent to the
/// backend, the loss sees every input. The result is the backward pass's, with
/// `loss:sum` = the custom loss, `surrogate_loss:sum` = the backend's cross-entropy, and the
/// loss's metrics. It returns once the backward pass has run, so an `optim_step` submitted
/// afterwards sees its gradients. On Tinker the requests are the SDK's (seq ids, bodies,
/// `X-SDK-Method: TrainingClient.forward_backward_custom`). The two passes are two
/// submissions: other operations submitted on the same backend while it runs (from another
/// task) may run between them, where the SDK reserves both slots, so submit nothing else
/// until it returns.
///
/// Errors: an [`Error::Config`] for a datum without `target_tokens`, an
/// [`Error::CustomLoss`] naming the datum when the loss returns gradients of the wrong
/// number or length or a non-finite value, and the backend's errors.
pub async fn forward_backward_custom<B: PolicyBackend>(
    backend: &B,
    data: Vec<Datum>,
    loss: &dyn CustomLoss,
) -> Result<ForwardBackwardOutput> {
    crate::backend::IN_CUSTOM_LOSS
        .scope((), run_custom(backend, data, loss))
        .await
}

async fn run_custom<B: PolicyBackend>(
    backend: &B,
    data: Vec<Datum>,
    loss: &dyn CustomLoss,
) -> Result<ForwardBackwardOutput> {
    if data.is_empty() {
        return Err(Error::config("data", "no data provided"));
    }
    // The forward pass sees only target_tokens and weights (zeros when absent), as the SDK's
    // `_get_custom_loss_forward_data` sends.
    let mut forward_data = Vec::with_capacity(data.len());
    for (i, d) in data.iter().enumerate() {
        let targets = d.loss_input(LossInput::TARGET_TOKENS).ok_or_else(|| {
            Error::config(
                format!("data[{i}].loss_fn_inputs.target_tokens"),
                "missing; a custom loss needs it",
            )
        })?;
        let weights = match d.loss_input(LossInput::WEIGHTS) {
            Some(w) => w.clone(),
            None => crate::types::TensorData::f32(vec![0.0; targets.len()]),
        };
        forward_data.push(
            Datum::new(d.model_input.clone())
                .with_input(LossInput::TARGET_TOKENS.name(), targets.clone())
                .with_input(LossInput::WEIGHTS.name(), weights),
        );
    }
    let forward = backend
        .forward(forward_data.clone(), LossFn::CrossEntropy)
        .await?
        .await?;
    let mut logprobs = Vec::with_capacity(data.len());
    for i in 0..data.len() {
        let lp = forward.logprobs(i).ok_or_else(|| {
            Error::Backend(format!(
                "forward pass returned no float32 `logprobs` for datum {i}"
            ))
        })?;
        logprobs.push(lp.to_vec());
    }
    let out = loss.loss(&data, &logprobs)?;
    if !out.loss.is_finite() {
        return Err(Error::CustomLoss {
            datum: None,
            message: format!("the loss is {}", out.loss),
        });
    }
    if out.grads.len() != data.len() {
        return Err(Error::CustomLoss {
            datum: Some(out.grads.len().min(data.len())),
            message: format!(
                "returned gradients for {} data, expected {}",
                out.grads.len(),
                data.len()
            ),
        });
    }
    for (i, ((g, lp), d)) in out
        .grads
        .iter()
        .zip(&logprobs)
        .zip(forward_data.iter_mut())
        .enumerate()
    {
        if g.len() != lp.len() {
            return Err(Error::CustomLoss {
                datum: Some(i),
                message: format!(
                    "gradient has {} values, but there are {} log-probabilities",
                    g.len(),
                    lp.len()
                ),
            });
        }
        if let Some(t) = g.iter().position(|x| !x.is_finite()) {
            return Err(Error::CustomLoss {
                datum: Some(i),
                message: format!("gradient at token {t} is {}", g[t]),
            });
        }
        // The backend's cross-entropy is −Σ w·lp: weights −∂C/∂lp give it gradient ∂C/∂θ.
        let weights = g.iter().map(|&x| -x).collect();
        *d = std::mem::take(d).with_weights(weights);
    }
    let mut result = backend
        .forward_backward(forward_data, LossFn::CrossEntropy)
        .await?
        .await?;
    let surrogate = result.metrics.remove("loss:sum");
    result.metrics.extend(out.metrics);
    result.metrics.insert("loss:sum".to_string(), out.loss);
    if let Some(s) = surrogate {
        result.metrics.insert("surrogate_loss:sum".to_string(), s);
    }
    Ok(result)
}

/// One datum's learner logprobs, sampler logprobs and advantages.
type PolicyRow<'a> = (&'a [f32], &'a [f32], &'a [f32]);

/// Every datum's [`PolicyRow`], checked to have one length.
fn policy_inputs<'a>(
    name: &str,
    data: &'a [Datum],
    logprobs: &'a [Vec<f32>],
) -> Result<Vec<PolicyRow<'a>>> {
    if data.len() != logprobs.len() {
        return Err(Error::CustomLoss {
            datum: Some(data.len().min(logprobs.len())),
            message: format!(
                "`{name}` got {} data but {} log-probability vectors",
                data.len(),
                logprobs.len()
            ),
        });
    }
    let mut v = Vec::with_capacity(data.len());
    for (i, (d, lp)) in data.iter().zip(logprobs).enumerate() {
        let get = |input: LossInput| -> Result<&'a [f32]> {
            let x = d
                .loss_input(input)
                .and_then(|t| t.as_f32())
                .ok_or_else(|| {
                    Error::config(
                        format!("data[{i}].loss_fn_inputs.{}", input.name()),
                        format!("missing or not float32; `{name}` needs it"),
                    )
                })?;
            if x.len() != lp.len() {
                return Err(Error::CustomLoss {
                    datum: Some(i),
                    message: format!(
                        "`{}` has {} values, but there are {} log-probabilities",
                        input.name(),
                        x.len(),
                        lp.len()
                    ),
                });
            }
            Ok(x)
        };
        v.push((
            lp.as_slice(),
            get(LossInput::LOGPROBS)?,
            get(LossInput::ADVANTAGES)?,
        ));
    }
    Ok(v)
}

fn check_thresholds(name: &str, lo: f64, hi: f64) -> Result<()> {
    if !(lo.is_finite() && hi.is_finite() && lo <= hi) {
        return Err(Error::config(
            format!("{name}.clip_low_threshold"),
            format!("needs finite ratio bounds with low <= high, got {lo} and {hi}"),
        ));
    }
    Ok(())
}

/// PPO's clipped term `min(r·A, clip(r, lo, hi)·A)` and its derivative in `log r`; the
/// flag says whether the clipped branch was taken.
fn ppo_term(r: f64, a: f64, lo: f64, hi: f64) -> (f64, f64, bool) {
    let unclipped = r * a;
    let clipped = r.clamp(lo, hi) * a;
    if unclipped <= clipped {
        (unclipped, unclipped, false)
    } else {
        (clipped, 0.0, true)
    }
}

/// Token-level PPO sums: (Σ term, ∂Σterm/∂lp per datum, clipped count, counted tokens).
fn ppo_sums(inputs: &[PolicyRow<'_>], lo: f64, hi: f64) -> (f64, Vec<Vec<f64>>, usize, usize) {
    let (mut total, mut clipped, mut counted) = (0.0, 0, 0);
    let mut grads = Vec::with_capacity(inputs.len());
    for (lp, q, adv) in inputs {
        let mut g = Vec::with_capacity(lp.len());
        for ((&lp, &q), &a) in lp.iter().zip(q.iter()).zip(adv.iter()) {
            let r = (lp as f64 - q as f64).exp();
            let (term, d, c) = ppo_term(r, a as f64, lo, hi);
            total += term;
            g.push(d);
            if a != 0.0 {
                counted += 1;
                clipped += usize::from(c);
            }
        }
        grads.push(g);
    }
    (total, grads, clipped, counted)
}

fn scaled(grads: Vec<Vec<f64>>, k: f64) -> Vec<Vec<f32>> {
    grads
        .into_iter()
        .map(|g| g.into_iter().map(|x| (k * x) as f32).collect())
        .collect()
}

/// The built-in importance-sampling loss as a custom loss:
/// `L = −Σ_i Σ_t r_t·A_t`, `r_t = exp(lp_t − lp_sampler_t)`, summed over every token of every
/// datum (as [`LossFn::ImportanceSampling`]).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ImportanceSamplingLoss;

impl CustomLoss for ImportanceSamplingLoss {
    fn loss(&self, data: &[Datum], logprobs: &[Vec<f32>]) -> Result<CustomLossOutput> {
        let inputs = policy_inputs("importance_sampling", data, logprobs)?;
        // Unbounded clip range: the plain ratio term.
        let (total, grads, _, _) = ppo_sums(&inputs, f64::NEG_INFINITY, f64::INFINITY);
        Ok(CustomLossOutput {
            loss: -total,
            grads: scaled(grads, -1.0),
            metrics: BTreeMap::new(),
        })
    }
}

/// The built-in PPO loss as a custom loss (Schulman et al. 2017, "Proximal Policy
/// Optimization Algorithms"):
/// `L = −Σ_i Σ_t min(r_t·A_t, clip(r_t, lo, hi)·A_t)`, `r_t = exp(lp_t − lp_sampler_t)`,
/// summed over every token (as [`LossFn::Ppo`]). Metric `ppo/clip_frac:mean`: the fraction
/// of tokens with a nonzero advantage whose clipped term was taken.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PpoLoss {
    /// Lower ratio bound `lo` (0.8 by default).
    pub clip_low_threshold: f64,
    /// Upper ratio bound `hi` (1.2 by default).
    pub clip_high_threshold: f64,
}

impl Default for PpoLoss {
    fn default() -> Self {
        PpoLoss {
            clip_low_threshold: 0.8,
            clip_high_threshold: 1.2,
        }
    }
}

/// `−Σ min(r·A, clip(r, lo, hi)·A) / normalizer` over every action token (PPO, and Dr. GRPO
/// with its constant normaliser), with `<name>/clip_frac:mean`.
fn clipped_objective(
    name: &str,
    data: &[Datum],
    logprobs: &[Vec<f32>],
    lo: f64,
    hi: f64,
    normalizer: f64,
) -> Result<CustomLossOutput> {
    check_thresholds(name, lo, hi)?;
    let inputs = policy_inputs(name, data, logprobs)?;
    let (total, grads, clipped, counted) = ppo_sums(&inputs, lo, hi);
    let mut metrics = BTreeMap::new();
    if counted > 0 {
        metrics.insert(
            format!("{name}/clip_frac:mean"),
            clipped as f64 / counted as f64,
        );
    }
    Ok(CustomLossOutput {
        loss: -total / normalizer,
        grads: scaled(grads, -1.0 / normalizer),
        metrics,
    })
}

impl CustomLoss for PpoLoss {
    fn loss(&self, data: &[Datum], logprobs: &[Vec<f32>]) -> Result<CustomLossOutput> {
        let (lo, hi) = (self.clip_low_threshold, self.clip_high_threshold);
        clipped_objective("ppo", data, logprobs, lo, hi, 1.0)
    }
}

/// Dr. GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training: A Critical
/// Perspective"): the PPO-clip objective summed over tokens and divided by a constant
/// instead of each response's length `|o_i|`:
///
/// `L = −(1/N) Σ_i Σ_t min(r_t·A_t, clip(r_t, lo, hi)·A_t)`, `r_t = exp(lp_t − lp_sampler_t)`.
///
/// The paper's objective averages over the `G` responses of a group and divides by a
/// constant length (its code: the generation budget), so `N = G × max_tokens` reproduces it
/// for one group; for a batch of groups, `N = batch size × max_tokens`. Dr. GRPO's other
/// change, advantages not divided by the group's standard deviation, is the advantage
/// computation's (the trainer's), not the loss's. Metric `dr_grpo/clip_frac:mean`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DrGrpo {
    /// The constant `N` (> 0).
    pub normalizer: f64,
    /// Lower ratio bound `lo` (0.8 by [`DrGrpo::new`], the paper's ε = 0.2).
    pub clip_low_threshold: f64,
    /// Upper ratio bound `hi` (1.2 by [`DrGrpo::new`]).
    pub clip_high_threshold: f64,
}

impl DrGrpo {
    /// Dr. GRPO with normaliser `normalizer` and ratio bounds (0.8, 1.2).
    pub fn new(normalizer: f64) -> Self {
        DrGrpo {
            normalizer,
            clip_low_threshold: 0.8,
            clip_high_threshold: 1.2,
        }
    }
}

impl CustomLoss for DrGrpo {
    fn loss(&self, data: &[Datum], logprobs: &[Vec<f32>]) -> Result<CustomLossOutput> {
        let n = self.normalizer;
        if !(n.is_finite() && n > 0.0) {
            return Err(Error::config(
                "dr_grpo.normalizer",
                format!("must be finite and positive, got {n}"),
            ));
        }
        let (lo, hi) = (self.clip_low_threshold, self.clip_high_threshold);
        clipped_objective("dr_grpo", data, logprobs, lo, hi, n)
    }
}

/// GSPO (Zheng et al. 2025, "Group Sequence Policy Optimization"): PPO clipping on a
/// sequence-level, length-normalised importance ratio.
///
/// For datum `i` with action tokens `o_i` (positions whose advantage or sampler logprob is
/// nonzero: the trainer's datums put 0 in both on prompt positions):
///
/// `s_i = exp((1/|o_i|) Σ_{t∈o_i} (lp_t − lp_sampler_t))`, `A_i` = the mean advantage over
/// `o_i` (the sequence's advantage, which the trainer repeats on every action token), and
///
/// `L = −Σ_i min(s_i·A_i, clip(s_i, 1 − ε_low, 1 + ε_high)·A_i)`.
///
/// The paper averages over the `G` sequences of a group (`1/G Σ_i`); this sums over the
/// data, as every built-in loss does, so divide the advantages (or the learning rate) by `G`
/// for the paper's scale. A datum without action tokens adds nothing. The paper's ranges are
/// `ε_low = 3e-4`, `ε_high = 4e-4` ([`Gspo::default`]). Metrics `gspo/clip_frac:mean` (the
/// fraction of sequences with nonzero advantage whose clipped term was taken) and
/// `gspo/ratio:mean` (the mean `s_i`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Gspo {
    /// `ε_low`: the sequence ratio is clipped below at `1 − ε_low`.
    pub clip_low: f64,
    /// `ε_high`: the sequence ratio is clipped above at `1 + ε_high`.
    pub clip_high: f64,
}

impl Default for Gspo {
    fn default() -> Self {
        Gspo {
            clip_low: 3e-4,
            clip_high: 4e-4,
        }
    }
}

impl CustomLoss for Gspo {
    fn loss(&self, data: &[Datum], logprobs: &[Vec<f32>]) -> Result<CustomLossOutput> {
        let (lo, hi) = (1.0 - self.clip_low, 1.0 + self.clip_high);
        check_thresholds("gspo", lo, hi)?;
        let inputs = policy_inputs("gspo", data, logprobs)?;
        let (mut total, mut clipped, mut counted, mut ratios, mut sequences) = (0.0, 0, 0, 0.0, 0);
        let mut grads = Vec::with_capacity(inputs.len());
        for (lp, q, adv) in &inputs {
            let action: Vec<bool> = q
                .iter()
                .zip(adv.iter())
                .map(|(&q, &a)| q != 0.0 || a != 0.0)
                .collect();
            let n = action.iter().filter(|&&m| m).count();
            if n == 0 {
                grads.push(vec![0.0f32; lp.len()]);
                continue;
            }
            let (mut log_s, mut a) = (0.0, 0.0);
            for t in (0..lp.len()).filter(|&t| action[t]) {
                log_s += lp[t] as f64 - q[t] as f64;
                a += adv[t] as f64;
            }
            let s = (log_s / n as f64).exp();
            let a = a / n as f64;
            let (term, d, c) = ppo_term(s, a, lo, hi);
            total += term;
            ratios += s;
            sequences += 1;
            if a != 0.0 {
                counted += 1;
                clipped += usize::from(c);
            }
            // ∂s/∂lp_t = s/|o_i| on action tokens; the loss is −term.
            let g = -d / n as f64;
            grads.push(
                action
                    .iter()
                    .map(|&m| if m { g as f32 } else { 0.0 })
                    .collect(),
            );
        }
        let mut metrics = BTreeMap::new();
        if counted > 0 {
            metrics.insert(
                "gspo/clip_frac:mean".to_string(),
                clipped as f64 / counted as f64,
            );
        }
        if sequences > 0 {
            metrics.insert("gspo/ratio:mean".to_string(), ratios / sequences as f64);
        }
        Ok(CustomLossOutput {
            loss: -total,
            grads,
            metrics,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::ModelInput;

    fn datum(q: Vec<f32>, adv: Vec<f32>) -> Datum {
        let n = q.len();
        Datum::new(ModelInput::from_tokens(vec![1; n]))
            .with_target_tokens(vec![2; n])
            .with_logprobs(q)
            .with_advantages(adv)
    }

    /// Central differences of `loss` in every logprob agree with its gradient.
    fn check_fd(loss: &dyn CustomLoss, data: &[Datum], lp: &[Vec<f32>]) {
        let out = loss.loss(data, lp).unwrap();
        for i in 0..lp.len() {
            for t in 0..lp[i].len() {
                let h = 1e-3f32;
                let mut p = lp.to_vec();
                p[i][t] += h;
                let up = loss.loss(data, &p).unwrap().loss;
                p[i][t] -= 2.0 * h;
                let down = loss.loss(data, &p).unwrap().loss;
                let fd = (up - down) / (2.0 * h as f64);
                let g = out.grads[i][t] as f64;
                assert!(
                    (fd - g).abs() < 1e-3 * (1.0 + g.abs()),
                    "{i},{t}: {fd} vs {g}"
                );
            }
        }
    }

    #[test]
    fn gradients_match_finite_differences() {
        let data = vec![
            datum(vec![0.0, -1.0, -2.0], vec![0.0, 1.0, 1.0]),
            datum(vec![0.0, -0.5, -0.7, -0.2], vec![0.0, -0.5, -0.5, -0.5]),
        ];
        let lp = vec![vec![-3.0, -0.9, -2.05], vec![-2.0, -0.6, -0.5, -0.25]];
        check_fd(&ImportanceSamplingLoss, &data, &lp);
        check_fd(&PpoLoss::default(), &data, &lp);
        check_fd(&DrGrpo::new(7.0), &data, &lp);
        check_fd(
            &Gspo {
                clip_low: 0.2,
                clip_high: 0.3,
            },
            &data,
            &lp,
        );
    }

    #[test]
    fn bad_inputs_are_typed_errors() {
        let data = vec![datum(vec![0.0, -1.0], vec![0.0, 1.0])];
        let e = Gspo::default().loss(&data, &[vec![-1.0]]).unwrap_err();
        assert!(matches!(e, Error::CustomLoss { datum: Some(0), .. }), "{e}");
        let bare = vec![Datum::new(ModelInput::from_tokens(vec![1]))];
        let e = PpoLoss::default().loss(&bare, &[vec![-1.0]]).unwrap_err();
        assert!(matches!(e, Error::Config { .. }), "{e}");
        let e = DrGrpo::new(0.0).loss(&data, &[vec![0.0, 0.0]]).unwrap_err();
        assert!(matches!(e, Error::Config { .. }), "{e}");
    }
}
