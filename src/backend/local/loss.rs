//! The training objectives of the local backend, on candle tensors.
//!
//! Every loss is a function of the learner's per-token log-probabilities `lp_θ` (which carry
//! the gradient) and of per-token inputs taken from the datums: the sampler's log-probs `lp_q`,
//! the advantages `A` and the weights `w`. Token losses are **summed** over all tokens given
//! (no mean), as on Tinker (`reference/cookbook-semantics.md` §e):
//!
//! | loss | value |
//! |---|---|
//! | `cross_entropy` | `−Σ w·lp` |
//! | `importance_sampling` | `−Σ r·A`, `r = exp(lp − lp_q)` |
//! | `ppo` | `−Σ min(r·A, clip(r, lo, hi)·A)` |
//! | `cispo` | `−Σ sg[clip(r, lo, hi)]·lp·A` |
//! | `dro` | `−Σ [lp·A − ½β(lp − lp_q)²]` |
//!
//! The losses use composed candle operations only, so the gradient reaches `lp_θ`; and,
//! through [`target_logprobs`] (a fused kernel with its own backward pass for f32 logits on
//! the CPU), the logits.
#![cfg_attr(not(test), allow(dead_code))]

use std::collections::BTreeMap;

use candle_core::{D, DType, Tensor};

use crate::error::{Error, Result};
use crate::types::{LossFn, LossInput};

/// Wraps a candle error into the crate's error, saying what was being computed.
fn be(what: &'static str) -> impl Fn(candle_core::Error) -> Error {
    move |e| Error::Backend(format!("{what}: {e}"))
}

/// The per-token inputs of a loss, all of shape `[T]` (the tokens of every datum of a
/// `forward_backward` call, concatenated, or of one datum).
pub(crate) struct TokenInputs {
    /// `lp_θ`: the learner's log-probabilities of the target tokens, differentiable.
    pub target_logprobs: Tensor,
    /// `lp_q`: the sampler's log-probabilities ([`LossInput::LOGPROBS`]).
    pub sampler_logprobs: Option<Tensor>,
    /// `A`: the advantages ([`LossInput::ADVANTAGES`]).
    pub advantages: Option<Tensor>,
    /// `w`: the per-token weights ([`LossInput::WEIGHTS`]).
    pub weights: Option<Tensor>,
}

/// Computes the loss `loss` (a scalar tensor to call `backward()` on) and its metrics.
///
/// Metrics carry a `:reduction` suffix: always `loss:sum`; for `ppo` and `cispo` also
/// `<loss>/clip_frac:mean`, the fraction of tokens with a non-zero advantage whose ratio was
/// clipped (for `ppo`: whose gradient the clipping removed), present only when there is at
/// least one such token. The metrics describe the tokens of this call; call it once on the
/// concatenated tokens of all datums to get whole-batch figures.
///
/// Fails with [`Error::Config`] naming the input (`loss_fn_inputs.advantages`...) when an
/// input the loss needs is missing or does not have `target_logprobs`' shape.
pub(crate) fn loss_value(
    loss: &LossFn,
    t: &TokenInputs,
) -> Result<(Tensor, BTreeMap<String, f64>)> {
    let mut metrics = BTreeMap::new();
    let total = compute(loss, t, Some(&mut metrics))?;
    let value = total
        .to_dtype(DType::F64)
        .and_then(|x| x.to_vec0::<f64>())
        .map_err(be("loss value"))?;
    metrics.insert("loss:sum".to_string(), value);
    Ok((total, metrics))
}

/// The loss alone, as [`loss_value`] computes it, without the metrics: nothing is read back
/// from the device. For per-datum backward passes whose metrics are computed elsewhere.
pub(crate) fn loss_tensor(loss: &LossFn, t: &TokenInputs) -> Result<Tensor> {
    compute(loss, t, None)
}

/// The summed loss; fills `metrics` (except `loss:sum`) when given.
fn compute(
    loss: &LossFn,
    t: &TokenInputs,
    metrics: Option<&mut BTreeMap<String, f64>>,
) -> Result<Tensor> {
    let lp = &t.target_logprobs;
    if lp.rank() != 1 {
        return Err(Error::Backend(format!(
            "loss `{}`: target log-probabilities must be 1-D [T], got shape {:?}",
            loss.name(),
            lp.dims()
        )));
    }
    let input = |input: LossInput, x: &Option<Tensor>| -> Result<Tensor> {
        let name = input.name();
        let x = x.as_ref().ok_or_else(|| {
            Error::config(
                format!("loss_fn_inputs.{name}"),
                format!("missing; `{}` needs it", loss.name()),
            )
        })?;
        if x.dims() != lp.dims() {
            return Err(Error::config(
                format!("loss_fn_inputs.{name}"),
                format!(
                    "has shape {:?}, but there are {} target log-probabilities",
                    x.dims(),
                    lp.elem_count()
                ),
            ));
        }
        // Inputs are constants: never let a gradient flow into them.
        x.detach()
            .to_dtype(lp.dtype())
            .and_then(|x| x.to_device(lp.device()))
            .map_err(be("loss input"))
    };
    let per_token: Tensor = match *loss {
        LossFn::CrossEntropy => {
            let w = input(LossInput::WEIGHTS, &t.weights)?;
            lp.mul(&w)
                .and_then(|x| x.neg())
                .map_err(be("cross_entropy"))?
        }
        LossFn::ImportanceSampling => {
            let lpq = input(LossInput::LOGPROBS, &t.sampler_logprobs)?;
            let adv = input(LossInput::ADVANTAGES, &t.advantages)?;
            ratio(lp, &lpq)?
                .mul(&adv)
                .and_then(|x| x.neg())
                .map_err(be("importance_sampling"))?
        }
        LossFn::Ppo {
            clip_low_threshold: lo,
            clip_high_threshold: hi,
        } => {
            check_bounds(loss, lo, hi)?;
            let lpq = input(LossInput::LOGPROBS, &t.sampler_logprobs)?;
            let adv = input(LossInput::ADVANTAGES, &t.advantages)?;
            let (per_token, clipped) = ppo_terms(lp, &lpq, &adv, lo, hi).map_err(be("ppo"))?;
            if let Some(m) = metrics
                && let Some(f) = clip_fraction(&clipped, &adv)?
            {
                m.insert("ppo/clip_frac:mean".to_string(), f);
            }
            per_token
        }
        LossFn::Cispo {
            clip_low_threshold: lo,
            clip_high_threshold: hi,
        } => {
            check_bounds(loss, lo, hi)?;
            let lpq = input(LossInput::LOGPROBS, &t.sampler_logprobs)?;
            let adv = input(LossInput::ADVANTAGES, &t.advantages)?;
            let r = ratio(lp, &lpq)?.detach();
            let clipped_r = r.clamp(lo, hi).map_err(be("cispo"))?;
            let clipped = r
                .ne(&clipped_r)
                .and_then(|m| m.to_dtype(lp.dtype()))
                .map_err(be("cispo"))?;
            if let Some(m) = metrics
                && let Some(f) = clip_fraction(&clipped, &adv)?
            {
                m.insert("cispo/clip_frac:mean".to_string(), f);
            }
            clipped_r
                .mul(lp)
                .and_then(|x| x.mul(&adv))
                .and_then(|x| x.neg())
                .map_err(be("cispo"))?
        }
        LossFn::Dro { beta } => {
            if !beta.is_finite() {
                return Err(Error::config("loss_fn_config.beta", "must be finite"));
            }
            let lpq = input(LossInput::LOGPROBS, &t.sampler_logprobs)?;
            let adv = input(LossInput::ADVANTAGES, &t.advantages)?;
            // −[lp·A − ½β(lp − lp_q)²] = ½β(lp − lp_q)² − lp·A
            lp.sub(&lpq)
                .and_then(|d| d.sqr())
                .and_then(|d| d.affine(0.5 * beta, 0.0))
                .and_then(|q| q.sub(&lp.mul(&adv)?))
                .map_err(be("dro"))?
        }
    };
    per_token.sum_all().map_err(be("loss sum"))
}

/// `r = exp(lp − lp_q)`, differentiable in `lp`.
fn ratio(lp: &Tensor, lpq: &Tensor) -> Result<Tensor> {
    lp.sub(lpq).and_then(|d| d.exp()).map_err(be("ratio"))
}

fn check_bounds(loss: &LossFn, lo: f64, hi: f64) -> Result<()> {
    if !(lo.is_finite() && hi.is_finite() && lo <= hi) {
        return Err(Error::config(
            "loss_fn_config.clip_low_threshold",
            format!(
                "`{}` needs finite ratio bounds with clip_low_threshold <= clip_high_threshold, got {lo} and {hi}",
                loss.name()
            ),
        ));
    }
    Ok(())
}

/// PPO's per-token loss `−min(r·A, clip(r)·A)` and a 0/1 mask of the tokens where the clipped
/// term is the smaller one (and so carries no gradient).
///
/// Written with an explicit selection rather than `minimum(clamp(..))` so the gradient is
/// exactly `−r·A` where the unclipped term is selected (ties included) and 0 elsewhere: candle's
/// `minimum`/`clamp` split the gradient in half on ties.
fn ppo_terms(
    lp: &Tensor,
    lpq: &Tensor,
    adv: &Tensor,
    lo: f64,
    hi: f64,
) -> candle_core::Result<(Tensor, Tensor)> {
    let r = lp.sub(lpq)?.exp()?;
    let unclipped = r.mul(adv)?;
    let clipped = r.detach().clamp(lo, hi)?.mul(adv)?;
    let use_unclipped = unclipped.detach().le(&clipped)?;
    let objective = use_unclipped.where_cond(&unclipped, &clipped)?;
    let clip_mask = use_unclipped.to_dtype(lp.dtype())?.affine(-1.0, 1.0)?;
    Ok((objective.neg()?, clip_mask))
}

/// The mean of `mask` over tokens whose advantage is not zero (`None` when there are none).
fn clip_fraction(mask: &Tensor, adv: &Tensor) -> Result<Option<f64>> {
    let mask = mask
        .to_dtype(DType::F64)
        .and_then(|m| m.to_vec1::<f64>())
        .map_err(be("clip fraction"))?;
    let adv = adv
        .to_dtype(DType::F64)
        .and_then(|a| a.to_vec1::<f64>())
        .map_err(be("clip fraction"))?;
    let (mut n, mut clipped) = (0usize, 0.0f64);
    for (m, a) in mask.iter().zip(&adv) {
        if *a != 0.0 {
            n += 1;
            clipped += m;
        }
    }
    Ok((n > 0).then(|| clipped / n as f64))
}

/// Log-probabilities of `targets` under `logits`, differentiable in `logits`.
///
/// `logits` is `[T, V]`, `targets` is `[T]` (`u32` or `i64`) with every id below `V`; the
/// result is `[T]` in the logits' dtype (half-precision logits are computed in `f32`).
/// f32 logits on the CPU go through one fused kernel with its own backward pass
/// ([`super::fused::token_logprobs`]: no `[T, V]` log-softmax is made); otherwise
/// log-softmax is composed from elementary ops, `x − m − log Σ exp(x − m)` with the row max
/// `m` detached, so the gradient reaches the logits (candle's fused softmax has no backward).
pub(crate) fn target_logprobs(logits: &Tensor, targets: &Tensor) -> Result<Tensor> {
    let (t, v) = logits.dims2().map_err(|_| {
        Error::Backend(format!(
            "target_logprobs: logits must be [T, V], got shape {:?}",
            logits.dims()
        ))
    })?;
    if targets.dims() != [t] {
        return Err(Error::Backend(format!(
            "target_logprobs: targets must be [{t}] to match the logits, got shape {:?}",
            targets.dims()
        )));
    }
    // Check the ids on the host: an out-of-range id must be an error, not a kernel fault.
    let ids: Vec<i64> = match targets.dtype() {
        DType::U32 => targets
            .to_vec1::<u32>()
            .map_err(be("target ids"))?
            .into_iter()
            .map(i64::from)
            .collect(),
        DType::I64 => targets.to_vec1::<i64>().map_err(be("target ids"))?,
        other => {
            return Err(Error::Backend(format!(
                "target_logprobs: targets must be u32 or i64, got {other:?}"
            )));
        }
    };
    if let Some((pos, id)) = ids
        .iter()
        .enumerate()
        .find(|&(_, &id)| id < 0 || id >= v as i64)
    {
        return Err(Error::Backend(format!(
            "target_logprobs: target token {id} at position {pos} is outside the vocabulary of {v}"
        )));
    }
    let x = match logits.dtype() {
        DType::F16 | DType::BF16 => logits.to_dtype(DType::F32).map_err(be("logits"))?,
        _ => logits.clone(),
    };
    if x.device().is_cpu() && x.dtype() == DType::F32 {
        // The ids were checked to be in `0..v` above, and `v` is a tensor dimension.
        let ids = ids.iter().map(|&id| id as u32).collect();
        return super::fused::token_logprobs(&x, ids).map_err(be("target_logprobs"));
    }
    composed_target_logprobs(&x, targets).map_err(be("target_logprobs"))
}

/// [`target_logprobs`] from elementary candle ops (`x` f32 or f64, `[T, V]`): the path off
/// the CPU and for f64, and the reference the fused kernel is tested against.
fn composed_target_logprobs(x: &Tensor, targets: &Tensor) -> candle_core::Result<Tensor> {
    let max = x.max_keepdim(D::Minus1)?.detach();
    let shifted = x.broadcast_sub(&max)?;
    let lse = shifted.exp()?.sum_keepdim(D::Minus1)?.log()?;
    let idx = targets.to_dtype(DType::U32)?.unsqueeze(1)?.contiguous()?;
    let picked = shifted.gather(&idx, 1)?;
    picked.sub(&lse)?.squeeze(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};

    fn t64(v: &[f64]) -> Tensor {
        Tensor::new(v, &Device::Cpu).unwrap()
    }

    /// Runs `loss` on `lp` (a variable), returning the value, the gradient w.r.t. lp and the
    /// metrics.
    fn run(
        loss: LossFn,
        lp: &[f64],
        lpq: Option<&[f64]>,
        adv: Option<&[f64]>,
        w: Option<&[f64]>,
    ) -> (f64, Vec<f64>, BTreeMap<String, f64>) {
        let var = Var::new(lp, &Device::Cpu).unwrap();
        let inputs = TokenInputs {
            target_logprobs: var.as_tensor().clone(),
            sampler_logprobs: lpq.map(t64),
            advantages: adv.map(t64),
            weights: w.map(t64),
        };
        let (l, m) = loss_value(&loss, &inputs).unwrap();
        let grads = l.backward().unwrap();
        let g = grads
            .get(var.as_tensor())
            .unwrap()
            .to_vec1::<f64>()
            .unwrap();
        (l.to_vec0::<f64>().unwrap(), g, m)
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-12 * (1.0 + a.abs().max(b.abs()))
    }

    fn assert_all_close(got: &[f64], want: &[f64], what: &str) {
        assert_eq!(got.len(), want.len(), "{what}: lengths");
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            assert!(close(*g, *w), "{what}[{i}]: got {g}, want {w}");
        }
    }

    const LP: [f64; 6] = [-0.5, -1.2, -0.1, -2.0, -0.7, -3.0];
    const LPQ: [f64; 6] = [-0.6, -1.0, -0.1, -2.5, -0.2, -0.0];
    const ADV: [f64; 6] = [1.0, -0.5, 2.0, 0.75, -1.5, 0.0];

    fn ratios() -> Vec<f64> {
        LP.iter().zip(&LPQ).map(|(a, b)| (a - b).exp()).collect()
    }

    #[test]
    fn cross_entropy_value_and_gradient() {
        let w = [1.0, 0.0, 0.5, 1.0, 2.0, 0.0];
        let (v, g, m) = run(LossFn::CrossEntropy, &LP, None, None, Some(&w));
        let want: f64 = -LP.iter().zip(&w).map(|(l, w)| l * w).sum::<f64>();
        assert!(close(v, want), "{v} vs {want}");
        assert_eq!(m.get("loss:sum"), Some(&v));
        let gw: Vec<f64> = w.iter().map(|w| -w).collect();
        assert_all_close(&g, &gw, "grad");
    }

    #[test]
    fn importance_sampling_value_and_gradient() {
        let (v, g, _) = run(
            LossFn::ImportanceSampling,
            &LP,
            Some(&LPQ),
            Some(&ADV),
            None,
        );
        let r = ratios();
        let want: f64 = -r.iter().zip(&ADV).map(|(r, a)| r * a).sum::<f64>();
        assert!(close(v, want), "{v} vs {want}");
        let gw: Vec<f64> = r.iter().zip(&ADV).map(|(r, a)| -r * a).collect();
        assert_all_close(&g, &gw, "grad");
    }

    #[test]
    fn ppo_value_gradient_and_clip_fraction() {
        let (lo, hi) = (0.8, 1.2);
        let loss = LossFn::Ppo {
            clip_low_threshold: lo,
            clip_high_threshold: hi,
        };
        // r = [1.105 (inside), 0.819 (inside), 1 (inside), 1.649 (above, A>0: clipped),
        //      0.607 (below, A<0: clipped), 0.0498 (below, A=0)]
        let r = ratios();
        let (v, g, m) = run(loss, &LP, Some(&LPQ), Some(&ADV), None);
        let mut want = 0.0;
        let mut gw = Vec::new();
        for (r, a) in r.iter().zip(&ADV) {
            let un = r * a;
            let cl = r.clamp(lo, hi) * a;
            want -= un.min(cl);
            gw.push(if un <= cl { -r * a } else { 0.0 });
        }
        assert!(close(v, want), "{v} vs {want}");
        assert_all_close(&g, &gw, "grad");
        assert_eq!(gw[3], 0.0);
        assert_eq!(gw[4], 0.0);
        // 2 of the 5 tokens with A ≠ 0 are clipped.
        assert!(close(m["ppo/clip_frac:mean"], 0.4));
    }

    #[test]
    fn ppo_keeps_the_gradient_where_the_unclipped_term_is_smaller() {
        // r above hi with A < 0, and r below lo with A > 0: the unclipped term is the minimum,
        // so the gradient is −r·A even though r is outside the bounds.
        let lp = [0.5, -0.5];
        let lpq = [0.0, 0.0];
        let adv = [-1.0, 2.0];
        let (v, g, m) = run(LossFn::ppo(), &lp, Some(&lpq), Some(&adv), None);
        let r = [0.5f64.exp(), (-0.5f64).exp()];
        assert!(close(v, -(r[0] * adv[0] + r[1] * adv[1])));
        assert_all_close(&g, &[-r[0] * adv[0], -r[1] * adv[1]], "grad");
        assert_eq!(m["ppo/clip_frac:mean"], 0.0);
    }

    #[test]
    fn ppo_on_policy_equals_importance_sampling() {
        let adv = [1.0, -2.0, 0.5];
        let lp = [-0.3, -1.0, -2.0];
        let (v1, g1, _) = run(LossFn::ppo(), &lp, Some(&lp), Some(&adv), None);
        let (v2, g2, _) = run(LossFn::ImportanceSampling, &lp, Some(&lp), Some(&adv), None);
        assert!(close(v1, v2));
        assert_all_close(&g1, &g2, "grad");
        assert_all_close(&g1, &[-1.0, 2.0, -0.5], "grad");
    }

    #[test]
    fn cispo_value_and_gradient() {
        let (lo, hi) = (0.9, 1.2);
        let loss = LossFn::Cispo {
            clip_low_threshold: lo,
            clip_high_threshold: hi,
        };
        let r = ratios();
        let (v, g, m) = run(loss, &LP, Some(&LPQ), Some(&ADV), None);
        let mut want = 0.0;
        let mut gw = Vec::new();
        for ((r, a), lp) in r.iter().zip(&ADV).zip(&LP) {
            let c = r.clamp(lo, hi);
            want -= c * lp * a;
            gw.push(-c * a);
        }
        assert!(close(v, want), "{v} vs {want}");
        assert_all_close(&g, &gw, "grad");
        // Clipped among A ≠ 0: r=0.819 (<0.9), 1.649, 0.607 → 3 of 5.
        assert!(close(m["cispo/clip_frac:mean"], 0.6));
    }

    #[test]
    fn cispo_defaults_only_clip_above_four() {
        let lp = [2.0, -3.0];
        let lpq = [0.0, 0.0];
        let adv = [1.0, 1.0];
        let (_, g, m) = run(LossFn::cispo(), &lp, Some(&lpq), Some(&adv), None);
        assert_all_close(&g, &[-4.0, -(-3.0f64).exp()], "grad");
        assert!(close(m["cispo/clip_frac:mean"], 0.5));
    }

    #[test]
    fn dro_value_and_gradient() {
        let beta = 0.3;
        let (v, g, m) = run(LossFn::Dro { beta }, &LP, Some(&LPQ), Some(&ADV), None);
        let mut want = 0.0;
        let mut gw = Vec::new();
        for ((lp, q), a) in LP.iter().zip(&LPQ).zip(&ADV) {
            want -= lp * a - 0.5 * beta * (lp - q).powi(2);
            gw.push(-(a - beta * (lp - q)));
        }
        assert!(close(v, want), "{v} vs {want}");
        assert_all_close(&g, &gw, "grad");
        assert!(!m.keys().any(|k| k.contains("clip")));
    }

    #[test]
    fn f32_inputs_are_accepted_for_f64_logprobs_and_vice_versa() {
        let var = Var::new(&[-0.5f32, -1.0], &Device::Cpu).unwrap();
        let inputs = TokenInputs {
            target_logprobs: var.as_tensor().clone(),
            sampler_logprobs: Some(t64(&[-0.5, -1.0])),
            advantages: Some(t64(&[1.0, 2.0])),
            weights: None,
        };
        let (l, m) = loss_value(&LossFn::ImportanceSampling, &inputs).unwrap();
        assert_eq!(l.dtype(), DType::F32);
        assert!((m["loss:sum"] + 3.0).abs() < 1e-6);
    }

    fn err_of(loss: LossFn, inputs: TokenInputs) -> String {
        match loss_value(&loss, &inputs) {
            Ok(_) => panic!("expected an error"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn missing_or_misshaped_inputs_are_named() {
        let lp = || t64(&[-1.0, -2.0]);
        let e = err_of(
            LossFn::CrossEntropy,
            TokenInputs {
                target_logprobs: lp(),
                sampler_logprobs: None,
                advantages: None,
                weights: None,
            },
        );
        assert!(
            e.contains("loss_fn_inputs.weights") && e.contains("cross_entropy"),
            "{e}"
        );
        let e = err_of(
            LossFn::ppo(),
            TokenInputs {
                target_logprobs: lp(),
                sampler_logprobs: None,
                advantages: Some(lp()),
                weights: None,
            },
        );
        assert!(
            e.contains("loss_fn_inputs.logprobs") && e.contains("ppo"),
            "{e}"
        );
        let e = err_of(
            LossFn::dro(),
            TokenInputs {
                target_logprobs: lp(),
                sampler_logprobs: Some(lp()),
                advantages: None,
                weights: None,
            },
        );
        assert!(e.contains("loss_fn_inputs.advantages"), "{e}");
        let e = err_of(
            LossFn::ImportanceSampling,
            TokenInputs {
                target_logprobs: lp(),
                sampler_logprobs: Some(t64(&[0.0, 0.0, 0.0])),
                advantages: Some(lp()),
                weights: None,
            },
        );
        assert!(
            e.contains("loss_fn_inputs.logprobs") && e.contains("[3]"),
            "{e}"
        );
        let e = err_of(
            LossFn::Cispo {
                clip_low_threshold: 2.0,
                clip_high_threshold: 1.0,
            },
            TokenInputs {
                target_logprobs: lp(),
                sampler_logprobs: Some(lp()),
                advantages: Some(lp()),
                weights: None,
            },
        );
        assert!(e.contains("clip_low_threshold"), "{e}");
    }

    /// Naive per-row log-softmax in f64.
    fn naive_logprobs(logits: &[Vec<f64>], targets: &[u32]) -> Vec<f64> {
        logits
            .iter()
            .zip(targets)
            .map(|(row, &t)| {
                let z: f64 = row.iter().map(|x| x.exp()).sum();
                row[t as usize] - z.ln()
            })
            .collect()
    }

    #[test]
    fn target_logprobs_match_a_naive_computation_and_have_gradients() {
        let rows: Vec<Vec<f64>> = (0..5)
            .map(|i| {
                (0..7)
                    .map(|j| ((i * 7 + j) as f64 * 0.37).sin() * 3.0)
                    .collect()
            })
            .collect();
        let targets = [0u32, 6, 3, 3, 1];
        let flat: Vec<f64> = rows.iter().flatten().copied().collect();
        let logits = Var::from_vec(flat, (5, 7), &Device::Cpu).unwrap();
        let tg = Tensor::new(&targets, &Device::Cpu).unwrap();
        let lp = target_logprobs(logits.as_tensor(), &tg).unwrap();
        assert_eq!(lp.dims(), [5]);
        let got = lp.to_vec1::<f64>().unwrap();
        assert_all_close(&got, &naive_logprobs(&rows, &targets), "logprobs");

        // d Σ lp / d logits[t, v] = 1[v = target_t] − softmax(logits[t])[v]
        let grads = lp.sum_all().unwrap().backward().unwrap();
        let g = grads
            .get(logits.as_tensor())
            .unwrap()
            .to_vec2::<f64>()
            .unwrap();
        for (t, row) in rows.iter().enumerate() {
            let z: f64 = row.iter().map(|x| x.exp()).sum();
            for (v, x) in row.iter().enumerate() {
                let want = f64::from(u8::from(v as u32 == targets[t])) - x.exp() / z;
                assert!(close(g[t][v], want), "grad[{t}][{v}] {} vs {want}", g[t][v]);
                assert!(g[t][v] != 0.0);
            }
        }
    }

    #[test]
    fn target_logprobs_are_stable_for_large_logits_and_accept_i64_and_f32() {
        let logits = Tensor::new(
            &[[1000.0f32, 999.0, 0.0], [-1000.0, -1001.0, -999.0]],
            &Device::Cpu,
        )
        .unwrap();
        let tg = Tensor::new(&[1i64, 2], &Device::Cpu).unwrap();
        let lp = target_logprobs(&logits, &tg)
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        let want0 = -1.0 - (1.0f64 + (-1.0f64).exp()).ln();
        let want1 = -(1.0f64 + (-1.0f64).exp() + (-2.0f64).exp()).ln();
        assert!((lp[0] as f64 - want0).abs() < 1e-5, "{lp:?}");
        assert!((lp[1] as f64 - want1).abs() < 1e-5, "{lp:?}");
    }

    #[test]
    fn target_logprobs_reject_bad_targets() {
        let logits = Tensor::zeros((2, 3), DType::F32, &Device::Cpu).unwrap();
        let out_of_range = Tensor::new(&[0u32, 3], &Device::Cpu).unwrap();
        let e = target_logprobs(&logits, &out_of_range)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("position 1") && e.contains("vocabulary of 3"),
            "{e}"
        );
        let wrong_len = Tensor::new(&[0u32], &Device::Cpu).unwrap();
        assert!(target_logprobs(&logits, &wrong_len).is_err());
        let negative = Tensor::new(&[0i64, -1], &Device::Cpu).unwrap();
        assert!(target_logprobs(&logits, &negative).is_err());
        let float = Tensor::new(&[0f32, 1.0], &Device::Cpu).unwrap();
        assert!(target_logprobs(&logits, &float).is_err());
    }

    #[test]
    fn loss_tensor_is_loss_value_without_metrics() {
        for loss in [
            LossFn::ImportanceSampling,
            LossFn::ppo(),
            LossFn::cispo(),
            LossFn::dro(),
        ] {
            let inputs = TokenInputs {
                target_logprobs: t64(&LP),
                sampler_logprobs: Some(t64(&LPQ)),
                advantages: Some(t64(&ADV)),
                weights: None,
            };
            let (a, _) = loss_value(&loss, &inputs).unwrap();
            let b = loss_tensor(&loss, &inputs).unwrap();
            assert_eq!(
                a.to_vec0::<f64>().unwrap().to_bits(),
                b.to_vec0::<f64>().unwrap().to_bits()
            );
        }
        let missing = TokenInputs {
            target_logprobs: t64(&LP),
            sampler_logprobs: None,
            advantages: None,
            weights: None,
        };
        assert!(loss_tensor(&LossFn::CrossEntropy, &missing).is_err());
    }

    /// The fused kernel (f32 on the CPU) against the composed form: values and gradients,
    /// relative error ≤ 1e-4, with a row-splitting size and logits of a wide range.
    #[test]
    fn fused_target_logprobs_match_the_composed_form() {
        use super::super::test_util::{max_rel, uniform};
        for (t, v, half) in [(5, 7, 3.0), (37, 1000, 20.0), (3, 40_000, 8.0)] {
            let logits = Var::from_tensor(&uniform(&[t, v], 21, half)).unwrap();
            let ids: Vec<u32> = (0..t as u32).map(|i| (i * 7919 + 3) % v as u32).collect();
            let tg = Tensor::new(ids.as_slice(), &Device::Cpu).unwrap();
            let w = uniform(&[t], 22, 2.0);
            let run = |lp: Tensor| {
                let g = (&lp * &w).unwrap().sum_all().unwrap().backward().unwrap();
                (lp.detach(), g.get(logits.as_tensor()).unwrap().clone())
            };
            let (y1, g1) = run(target_logprobs(logits.as_tensor(), &tg).unwrap());
            let (y2, g2) = run(composed_target_logprobs(logits.as_tensor(), &tg).unwrap());
            assert_eq!(y1.dims(), [t]);
            assert!(max_rel(&y1, &y2) <= 1e-4, "[{t}, {v}]: values");
            assert!(max_rel(&g1, &g2) <= 1e-4, "[{t}, {v}]: gradients");
        }
    }
}
