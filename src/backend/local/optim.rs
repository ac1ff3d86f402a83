//! Gradient accumulation and the AdamW optimizer of the local backend.
//!
//! [`GradAccumulator`] sums the gradients of the trainable parameters over any number of
//! `forward_backward` calls; [`AdamW::step`] consumes them the way `torch.optim.AdamW`
//! (single-tensor path, `amsgrad=False`) does after `torch.nn.utils.clip_grad_norm_`:
//!
//! ```text
//! n = ‖(‖g_1‖, …, ‖g_k‖)‖₂                          (reported as `grad_norm`, before clipping)
//! g ← g · min(1, c / (n + 1e-6))                    (only when grad_clip_norm c > 0)
//! t ← t + 1                                         (per parameter)
//! p ← p · (1 − lr·wd)                               (decoupled weight decay)
//! m ← m + (1 − β1)·(g − m)
//! v ← β2·v + (1 − β2)·g²
//! p ← p − lr/(1 − β1ᵗ) · m / (√v / √(1 − β2ᵗ) + ε)
//! ```
//!
//! Parameters that received no gradient are left untouched (no decay, no step), as torch does
//! for parameters whose `.grad` is `None`.
//!
//! `f32` parameters on the CPU are updated in place, in three element-wise passes (the first
//! moment, the second moment, the parameter) that do the same `f32` operations in the same
//! order as the composed tensor ops of other devices and dtypes, so both give the same bits
//! (tested). The composed form made a dozen fresh parameter-sized tensors per parameter:
//! about a fifth of a training step of a 59M-parameter model on two threads went to
//! allocating them, faulting their pages in and zeroing them.
#![cfg_attr(not(test), allow(dead_code))]

use std::collections::{BTreeMap, BTreeSet, HashMap};

use candle_core::backprop::GradStore;
use candle_core::{CpuStorage, DType, Device, InplaceOp2, InplaceOp3, Layout, Tensor, Var};
use rayon::prelude::*;

use crate::error::{Error, Result};
use crate::types::AdamParams;

/// Wraps a candle error into the crate's error, saying what was being computed.
fn be(what: &'static str) -> impl Fn(candle_core::Error) -> Error {
    move |e| Error::Backend(format!("{what}: {e}"))
}

/// The dtype gradients and optimizer moments are kept in for parameters of dtype `dt`
/// (half-precision parameters get `f32` state).
fn state_dtype(dt: DType) -> DType {
    match dt {
        DType::F16 | DType::BF16 => DType::F32,
        other => other,
    }
}

/// Sums gradients of named parameters across `forward_backward` calls until an optimizer step.
#[derive(Debug, Default)]
pub(crate) struct GradAccumulator {
    grads: BTreeMap<String, Tensor>,
}

impl GradAccumulator {
    /// An empty accumulator.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds the gradients in `grads` of the parameters `params` to the running sums.
    ///
    /// Parameters without a gradient in `grads` are left as they are. All or nothing: on error
    /// (a gradient whose shape differs from its parameter's, a name given twice) nothing is
    /// added. The buffers of the sums replaced and of the gradients summed go back to the
    /// backend's [pool](super::pool) (`grads` is consumed: nothing reads them again).
    pub fn add(&mut self, grads: GradStore, params: &[(String, Var)]) -> Result<()> {
        let mut seen = BTreeSet::new();
        let mut updates = Vec::new();
        let mut done = Vec::new();
        for (name, var) in params {
            if !seen.insert(name.as_str()) {
                return Err(Error::Backend(format!(
                    "trainable parameter `{name}` is listed twice"
                )));
            }
            let Some(g) = grads.get(var.as_tensor()) else {
                continue;
            };
            if g.dims() != var.dims() {
                return Err(Error::Backend(format!(
                    "gradient of `{name}` has shape {:?}, the parameter {:?}",
                    g.dims(),
                    var.dims()
                )));
            }
            let g = g
                .detach()
                .to_dtype(state_dtype(var.dtype()))
                .map_err(be("gradient"))?;
            let sum = match self.grads.get(name) {
                // On the backend's pool (candle's `add` would split a large sum over its own
                // pool, whose threads then spin on the cores the next pass needs).
                Some(prev) => {
                    let sum = super::fused::add(prev, &g).map_err(be("gradient accumulation"))?;
                    done.extend([prev.clone(), g]);
                    sum
                }
                None => g,
            };
            updates.push((name.clone(), sum));
        }
        self.grads.extend(updates);
        drop(grads);
        super::pool::recycle(&done);
        Ok(())
    }

    /// Forgets every accumulated gradient (their buffers go back to the backend's
    /// [pool](super::pool)).
    pub fn clear(&mut self) {
        super::pool::recycle(self.grads.values());
        self.grads.clear();
    }

    /// Whether no gradient has been accumulated.
    pub fn is_empty(&self) -> bool {
        self.grads.is_empty()
    }

    /// The accumulated gradient of `name`, if any.
    pub fn get(&self, name: &str) -> Option<&Tensor> {
        self.grads.get(name)
    }

    /// The names among `params` that have no accumulated gradient, in `params`' order.
    pub fn missing(&self, params: &[(String, Var)]) -> Vec<String> {
        params
            .iter()
            .filter(|(name, _)| !self.grads.contains_key(name))
            .map(|(name, _)| name.clone())
            .collect()
    }

    /// The L2 norm of each accumulated gradient, by parameter name.
    pub fn norms(&self) -> Result<BTreeMap<String, f64>> {
        let norms = self.tensor_norms()?;
        Ok(self.grads.keys().cloned().zip(norms).collect())
    }

    /// The global L2 norm of the accumulated gradients (the norm of the per-tensor norms, as
    /// `torch.nn.utils.clip_grad_norm_` computes it); 0 when there are none.
    pub fn global_norm(&self) -> Result<f64> {
        Ok(self
            .tensor_norms()?
            .iter()
            .map(|n| n * n)
            .sum::<f64>()
            .sqrt())
    }

    /// The L2 norm of every accumulated gradient in name order, each reduced in its own
    /// dtype on its own device, read back in one transfer per device.
    fn tensor_norms(&self) -> Result<Vec<f64>> {
        let sums: Vec<Tensor> = self
            .grads
            .values()
            .map(|g| {
                let sq = super::fused::sqr(g)?;
                let sum = sq.sum_all()?.to_dtype(DType::F64);
                super::pool::recycle([&sq]);
                sum
            })
            .collect::<candle_core::Result<_>>()
            .map_err(be("gradient norm"))?;
        let mut out = vec![0.0; sums.len()];
        let mut remaining: Vec<usize> = (0..sums.len()).collect();
        while let Some(&first) = remaining.first() {
            let dev = sums[first].device().clone();
            let (here, rest): (Vec<usize>, Vec<usize>) = remaining
                .iter()
                .partition(|&&i| sums[i].device().same_device(&dev));
            let stacked = here.iter().map(|&i| sums[i].clone()).collect::<Vec<_>>();
            let values = Tensor::stack(&stacked, 0)
                .and_then(|t| t.to_vec1::<f64>())
                .map_err(be("gradient norm"))?;
            for (i, v) in here.into_iter().zip(values) {
                out[i] = v.sqrt();
            }
            remaining = rest;
        }
        Ok(out)
    }
}

/// Adam moments of one parameter.
#[derive(Debug, Clone)]
struct ParamState {
    /// Number of updates this parameter received.
    step: u64,
    /// First moment `m`.
    exp_avg: Tensor,
    /// Second moment `v`.
    exp_avg_sq: Tensor,
}

/// Names of the tensors in [`AdamW::state_tensors`].
const STEPS_KEY: &str = "steps";
const STEP_PREFIX: &str = "step.";
const EXP_AVG_PREFIX: &str = "exp_avg.";
const EXP_AVG_SQ_PREFIX: &str = "exp_avg_sq.";

/// AdamW with decoupled weight decay and global-norm gradient clipping, as
/// `torch.optim.AdamW` (see the module documentation for the update).
#[derive(Debug, Default)]
pub(crate) struct AdamW {
    state: BTreeMap<String, ParamState>,
    steps: u64,
}

impl AdamW {
    /// An optimizer with no state (moments start at zero).
    pub fn new() -> Self {
        Self::default()
    }

    /// Number of completed [`step`](Self::step) calls.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// Applies one update to `params` with the gradients accumulated in `acc`, then clears
    /// `acc`.
    ///
    /// Returns the metrics `grad_norm` (global norm before clipping), `learning_rate`,
    /// `params_updated` and `params_without_grad` (parameters skipped because no gradient was
    /// accumulated for them; [`GradAccumulator::missing`] names them before the step).
    ///
    /// Errors leave the parameters and the optimizer state untouched: invalid `p` (`acc` is
    /// kept, so the step can be retried), a gradient for a name not in `params`, a state whose
    /// shape differs from its parameter's, or a non-finite gradient norm (`acc` is cleared:
    /// those gradients cannot be used).
    pub fn step(
        &mut self,
        params: &[(String, Var)],
        acc: &mut GradAccumulator,
        p: &AdamParams,
    ) -> Result<BTreeMap<String, f64>> {
        validate(p)?;
        let result = self.try_step(params, acc, p);
        acc.clear();
        result
    }

    fn try_step(
        &mut self,
        params: &[(String, Var)],
        acc: &GradAccumulator,
        p: &AdamParams,
    ) -> Result<BTreeMap<String, f64>> {
        let names: BTreeSet<&str> = params.iter().map(|(n, _)| n.as_str()).collect();
        if let Some(stray) = acc.grads.keys().find(|n| !names.contains(n.as_str())) {
            return Err(Error::Backend(format!(
                "a gradient was accumulated for `{stray}`, which is not a trainable parameter"
            )));
        }
        let grad_norm = acc.global_norm()?;
        if !grad_norm.is_finite() {
            return Err(Error::Backend(format!(
                "the gradient norm is {grad_norm}; the optimizer step was skipped and the gradients discarded"
            )));
        }
        let clip_coef = if p.grad_clip_norm > 0.0 {
            (p.grad_clip_norm / (grad_norm + 1e-6)).min(1.0)
        } else {
            1.0
        };

        // Check every parameter and compute the composed updates first, then write, so an
        // error changes nothing.
        let mut updates = Vec::new();
        let mut in_place = Vec::new();
        let mut skipped = 0usize;
        for (name, var) in params {
            let Some(g) = acc.grads.get(name) else {
                skipped += 1;
                continue;
            };
            let prev = self.state.get(name);
            if let Some(state) = in_place_state(var, g, prev)? {
                in_place.push((name, var, g, state));
                continue;
            }
            let (param, state) = update_one(var, g, prev, clip_coef, p).map_err(|e| match e {
                Error::Backend(m) => Error::Backend(format!("AdamW update of `{name}`: {m}")),
                other => other,
            })?;
            updates.push((name, var, param, state));
        }
        let updated = updates.len() + in_place.len();
        for (name, var, param, state) in updates {
            var.set(&param).map_err(be("AdamW parameter write"))?;
            self.state.insert(name.clone(), state);
        }
        for (name, var, g, mut state) in in_place {
            state.step += 1;
            update_in_place(var, g, &state, clip_coef, p)
                .map_err(|e| Error::Backend(format!("AdamW update of `{name}`: {e}")))?;
            self.state.insert(name.clone(), state);
        }
        self.steps += 1;
        let mut metrics = BTreeMap::new();
        metrics.insert("grad_norm".to_string(), grad_norm);
        metrics.insert("learning_rate".to_string(), p.learning_rate);
        metrics.insert("params_updated".to_string(), updated as f64);
        metrics.insert("params_without_grad".to_string(), skipped as f64);
        Ok(metrics)
    }

    /// The optimizer state as named tensors, for a safetensors file: `steps` (`i64` scalar on
    /// the CPU) and, per parameter `<name>`, `step.<name>` (`i64` scalar on the CPU),
    /// `exp_avg.<name>` and `exp_avg_sq.<name>` (on the parameter's device).
    pub fn state_tensors(&self) -> HashMap<String, Tensor> {
        let mut out = HashMap::new();
        out.insert(STEPS_KEY.to_string(), cpu_scalar(self.steps));
        for (name, s) in &self.state {
            out.insert(format!("{STEP_PREFIX}{name}"), cpu_scalar(s.step));
            out.insert(format!("{EXP_AVG_PREFIX}{name}"), s.exp_avg.clone());
            out.insert(format!("{EXP_AVG_SQ_PREFIX}{name}"), s.exp_avg_sq.clone());
        }
        out
    }

    /// Replaces the state with one produced by [`state_tensors`](Self::state_tensors).
    ///
    /// Fails (leaving the current state) on an unknown name, a parameter with only part of its
    /// state, moments of different shapes or of a non-float dtype, or a malformed step.
    pub fn load_state_tensors(&mut self, t: HashMap<String, Tensor>) -> Result<()> {
        let bad = |key: &str, msg: String| Error::Checkpoint {
            path: format!("optimizer state `{key}`"),
            message: msg,
        };
        let scalar_step = |key: &str, x: &Tensor| -> Result<u64> {
            let v = x
                .to_dtype(DType::I64)
                .and_then(|x| x.to_vec0::<i64>())
                .map_err(|e| bad(key, format!("expected an integer scalar: {e}")))?;
            u64::try_from(v).map_err(|_| bad(key, format!("negative step {v}")))
        };
        let mut steps = None;
        let mut parts: BTreeMap<String, [Option<Tensor>; 3]> = BTreeMap::new();
        for (key, tensor) in t {
            if key == STEPS_KEY {
                steps = Some(scalar_step(&key, &tensor)?);
                continue;
            }
            let (name, slot) = if let Some(n) = key.strip_prefix(STEP_PREFIX) {
                (n, 0)
            } else if let Some(n) = key.strip_prefix(EXP_AVG_PREFIX) {
                (n, 1)
            } else if let Some(n) = key.strip_prefix(EXP_AVG_SQ_PREFIX) {
                (n, 2)
            } else {
                return Err(bad(&key, "unknown optimizer state name".to_string()));
            };
            parts.entry(name.to_string()).or_default()[slot] = Some(tensor);
        }
        let steps = steps.ok_or_else(|| bad(STEPS_KEY, "missing".to_string()))?;
        let mut state = BTreeMap::new();
        for (name, [step, m, v]) in parts {
            let missing = |what: &str| bad(&format!("{what}{name}"), "missing".to_string());
            let step = step.ok_or_else(|| missing(STEP_PREFIX))?;
            let m = m.ok_or_else(|| missing(EXP_AVG_PREFIX))?;
            let v = v.ok_or_else(|| missing(EXP_AVG_SQ_PREFIX))?;
            let step = scalar_step(&format!("{STEP_PREFIX}{name}"), &step)?;
            if m.dims() != v.dims() || m.dtype() != v.dtype() || !m.dtype().is_float() {
                return Err(bad(
                    &name,
                    format!(
                        "moments must be float tensors of one shape, got {:?} {:?} and {:?} {:?}",
                        m.dtype(),
                        m.dims(),
                        v.dtype(),
                        v.dims()
                    ),
                ));
            }
            state.insert(
                name,
                ParamState {
                    step,
                    exp_avg: m,
                    exp_avg_sq: v,
                },
            );
        }
        self.state = state;
        self.steps = steps;
        Ok(())
    }
}

/// A step count as an `i64` scalar tensor on the CPU.
fn cpu_scalar(step: u64) -> Tensor {
    // Allocating one element on the CPU has no failure mode; a step count beyond i64 is not
    // reachable.
    Tensor::new(i64::try_from(step).unwrap_or(i64::MAX), &Device::Cpu)
        .expect("allocating a CPU scalar cannot fail")
}

fn validate(p: &AdamParams) -> Result<()> {
    let field = |name: &str| format!("adam_params.{name}");
    if !(p.learning_rate.is_finite() && p.learning_rate >= 0.0) {
        return Err(Error::config(
            field("learning_rate"),
            format!("must be finite and >= 0, got {}", p.learning_rate),
        ));
    }
    for (name, b) in [("beta1", p.beta1), ("beta2", p.beta2)] {
        if !(0.0..1.0).contains(&b) {
            return Err(Error::config(
                field(name),
                format!("must be in [0, 1), got {b}"),
            ));
        }
    }
    for (name, x) in [
        ("eps", p.eps),
        ("weight_decay", p.weight_decay),
        ("grad_clip_norm", p.grad_clip_norm),
    ] {
        if !(x.is_finite() && x >= 0.0) {
            return Err(Error::config(
                field(name),
                format!("must be finite and >= 0, got {x}"),
            ));
        }
    }
    Ok(())
}

/// The new value of one parameter and its new state, computed in the state dtype with the
/// operation order of torch's CPU kernels (`lerp_`, `addcmul_`, `addcdiv_`).
fn update_one(
    var: &Var,
    grad: &Tensor,
    prev: Option<&ParamState>,
    clip_coef: f64,
    p: &AdamParams,
) -> Result<(Tensor, ParamState)> {
    let dev = var.device();
    let sdt = state_dtype(var.dtype());
    let param = var
        .as_detached_tensor()
        .to_dtype(sdt)
        .map_err(be("parameter"))?;
    let (step, m, v) = match prev {
        Some(s) => {
            if s.exp_avg.dims() != var.dims() {
                return Err(Error::Backend(format!(
                    "optimizer state has shape {:?}, the parameter {:?}",
                    s.exp_avg.dims(),
                    var.dims()
                )));
            }
            let load = |t: &Tensor| t.to_device(dev).and_then(|t| t.to_dtype(sdt));
            (
                s.step,
                load(&s.exp_avg).map_err(be("optimizer state"))?,
                load(&s.exp_avg_sq).map_err(be("optimizer state"))?,
            )
        }
        None => {
            let z = param.zeros_like().map_err(be("optimizer state"))?;
            (0, z.clone(), z)
        }
    };
    let step = step + 1;
    let compute = || -> candle_core::Result<(Tensor, Tensor, Tensor)> {
        let g = grad.to_device(dev)?.to_dtype(sdt)?;
        let g = if clip_coef < 1.0 {
            g.affine(clip_coef, 0.0)?
        } else {
            g
        };
        let param = if p.weight_decay != 0.0 {
            param.affine(1.0 - p.learning_rate * p.weight_decay, 0.0)?
        } else {
            param.clone()
        };
        // m.lerp_(g, 1 − β1) = m + (1 − β1)·(g − m)
        let m = m.add(&g.sub(&m)?.affine(1.0 - p.beta1, 0.0)?)?;
        // v.mul_(β2).addcmul_(g, g, value = 1 − β2)
        let v = v
            .affine(p.beta2, 0.0)?
            .add(&g.affine(1.0 - p.beta2, 0.0)?.mul(&g)?)?;
        let bc1 = 1.0 - p.beta1.powf(step as f64);
        let bc2_sqrt = (1.0 - p.beta2.powf(step as f64)).sqrt();
        let step_size = p.learning_rate / bc1;
        let bc2_sqrt = Tensor::new(bc2_sqrt, dev)?.to_dtype(sdt)?;
        let denom = v.sqrt()?.broadcast_div(&bc2_sqrt)?.affine(1.0, p.eps)?;
        // param.addcdiv_(m, denom, value = −step_size)
        let param = param.add(&m.affine(-step_size, 0.0)?.div(&denom)?)?;
        Ok((param.to_dtype(var.dtype())?, m, v))
    };
    let (param, m, v) = compute().map_err(be("AdamW"))?;
    Ok((
        param,
        ParamState {
            step,
            exp_avg: m,
            exp_avg_sq: v,
        },
    ))
}

/// The state to update in place for `var` (its moments, zeros for a first step), or `None`
/// when the parameter takes the composed path: not an `f32` CPU parameter with an `f32`
/// contiguous gradient and moments, each in its own storage.
fn in_place_state(var: &Var, g: &Tensor, prev: Option<&ParamState>) -> Result<Option<ParamState>> {
    let fits = |t: &Tensor| {
        t.device().is_cpu()
            && t.dtype() == DType::F32
            && t.dims() == var.dims()
            && t.is_contiguous()
    };
    if !fits(var.as_tensor()) || !fits(g) || shares_storage(g, var.as_tensor()) {
        return Ok(None);
    }
    let state = match prev {
        Some(s) => {
            let (m, v) = (&s.exp_avg, &s.exp_avg_sq);
            let alone = [var.as_tensor(), g, v]
                .iter()
                .all(|t| !shares_storage(m, t))
                && [var.as_tensor(), g].iter().all(|t| !shares_storage(v, t));
            if !(fits(m) && fits(v) && alone) {
                return Ok(None);
            }
            s.clone()
        }
        None => {
            let zeros = || Tensor::zeros(var.dims(), DType::F32, &Device::Cpu);
            ParamState {
                step: 0,
                exp_avg: zeros().map_err(be("optimizer state"))?,
                exp_avg_sq: zeros().map_err(be("optimizer state"))?,
            }
        }
    };
    Ok(Some(state))
}

/// Whether two tensors are views of one storage (an in-place write to one would change the
/// other).
fn shares_storage(a: &Tensor, b: &Tensor) -> bool {
    let (sa, _) = a.storage_and_layout();
    let pa: *const candle_core::Storage = &*sa;
    drop(sa);
    let (sb, _) = b.storage_and_layout();
    std::ptr::eq(pa, &*sb)
}

/// One AdamW update of an `f32` CPU parameter and its moments in place (`state.step` already
/// counts it), with the `f32` operations of [`update_one`] in its order: `affine(a, b)` is
/// `x · a + b` with `a` and `b` rounded to `f32`, `+ 0.0` included (it turns `-0` into `+0`).
fn update_in_place(
    var: &Var,
    g: &Tensor,
    state: &ParamState,
    clip_coef: f64,
    p: &AdamParams,
) -> candle_core::Result<()> {
    let clip = (clip_coef < 1.0).then_some(clip_coef as f32);
    state.exp_avg.inplace_op2(
        g,
        &FirstMoment {
            keep: (1.0 - p.beta1) as f32,
            clip,
        },
    )?;
    state.exp_avg_sq.inplace_op2(
        g,
        &SecondMoment {
            beta2: p.beta2 as f32,
            one_minus_beta2: (1.0 - p.beta2) as f32,
            clip,
        },
    )?;
    let bc1 = 1.0 - p.beta1.powf(state.step as f64);
    let bc2_sqrt = (1.0 - p.beta2.powf(state.step as f64)).sqrt();
    var.as_tensor().inplace_op3(
        &state.exp_avg,
        &state.exp_avg_sq,
        &ParamStep {
            decay: (p.weight_decay != 0.0)
                .then_some((1.0 - p.learning_rate * p.weight_decay) as f32),
            neg_step_size: (-(p.learning_rate / bc1)) as f32,
            bc2_sqrt: bc2_sqrt as f32,
            eps: p.eps as f32,
        },
    )
}

/// Elements per rayon task of the in-place passes.
const CHUNK: usize = 1 << 14;

fn f32_mut<'a>(s: &'a mut CpuStorage, l: &Layout) -> candle_core::Result<&'a mut [f32]> {
    super::buffers::contiguous_f32_mut(s, l, "AdamW in place")
}

fn f32_ref<'a>(s: &'a CpuStorage, l: &Layout) -> candle_core::Result<&'a [f32]> {
    super::buffers::contiguous_f32(s, l, "AdamW in place")
}

/// The gradient as the composed path sees it: `g.affine(c, 0)` when clipped.
#[inline]
fn clipped(g: f32, clip: Option<f32>) -> f32 {
    match clip {
        Some(c) => g * c + 0.0,
        None => g,
    }
}

/// `m ← m + ((g − m)·(1 − β1) + 0)`.
struct FirstMoment {
    keep: f32,
    clip: Option<f32>,
}

impl InplaceOp2 for FirstMoment {
    fn name(&self) -> &'static str {
        "adamw-first-moment"
    }

    fn cpu_fwd(
        &self,
        s1: &mut CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> candle_core::Result<()> {
        let (m, g) = (f32_mut(s1, l1)?, f32_ref(s2, l2)?);
        m.par_chunks_mut(CHUNK)
            .zip(g.par_chunks(CHUNK))
            .for_each(|(m, g)| {
                for (m, &g) in m.iter_mut().zip(g) {
                    let g = clipped(g, self.clip);
                    *m = *m + ((g - *m) * self.keep + 0.0);
                }
            });
        Ok(())
    }
}

/// `v ← (v·β2 + 0) + (g·(1 − β2) + 0)·g`.
struct SecondMoment {
    beta2: f32,
    one_minus_beta2: f32,
    clip: Option<f32>,
}

impl InplaceOp2 for SecondMoment {
    fn name(&self) -> &'static str {
        "adamw-second-moment"
    }

    fn cpu_fwd(
        &self,
        s1: &mut CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> candle_core::Result<()> {
        let (v, g) = (f32_mut(s1, l1)?, f32_ref(s2, l2)?);
        v.par_chunks_mut(CHUNK)
            .zip(g.par_chunks(CHUNK))
            .for_each(|(v, g)| {
                for (v, &g) in v.iter_mut().zip(g) {
                    let g = clipped(g, self.clip);
                    *v = (*v * self.beta2 + 0.0) + (g * self.one_minus_beta2 + 0.0) * g;
                }
            });
        Ok(())
    }
}

/// `p ← p_d + (m·(−lr/bc1) + 0) / ((√v / √bc2)·1 + ε)`, `p_d = p·(1 − lr·wd) + 0` with
/// weight decay, else `p`.
struct ParamStep {
    decay: Option<f32>,
    neg_step_size: f32,
    bc2_sqrt: f32,
    eps: f32,
}

impl InplaceOp3 for ParamStep {
    fn name(&self) -> &'static str {
        "adamw-param-step"
    }

    fn cpu_fwd(
        &self,
        s1: &mut CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> candle_core::Result<()> {
        let (p, m, v) = (f32_mut(s1, l1)?, f32_ref(s2, l2)?, f32_ref(s3, l3)?);
        p.par_chunks_mut(CHUNK)
            .zip(m.par_chunks(CHUNK).zip(v.par_chunks(CHUNK)))
            .for_each(|(p, (m, v))| {
                for ((p, &m), &v) in p.iter_mut().zip(m).zip(v) {
                    let decayed = match self.decay {
                        Some(d) => *p * d + 0.0,
                        None => *p,
                    };
                    let denom = (v.sqrt() / self.bc2_sqrt) * 1.0 + self.eps;
                    *p = decayed + (m * self.neg_step_size + 0.0) / denom;
                }
            });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::f32_bits;
    use super::*;
    use serde_json::Value;

    const REFERENCE: &str = include_str!("../../../tests/fixtures/adamw_reference.json");

    fn reference() -> Value {
        serde_json::from_str(REFERENCE).unwrap()
    }

    fn floats(v: &Value) -> Vec<f64> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap())
            .collect()
    }

    fn shape(r: &Value, name: &str) -> Vec<usize> {
        r["shapes"][name]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as usize)
            .collect()
    }

    /// The parameters `a`, `b`, `c` at their initial values.
    fn initial_params(r: &Value, dt: DType) -> Vec<(String, Var)> {
        ["a", "b", "c"]
            .iter()
            .map(|&n| {
                let t = Tensor::from_vec(floats(&r["initial"][n]), shape(r, n), &Device::Cpu)
                    .unwrap()
                    .to_dtype(dt)
                    .unwrap();
                (n.to_string(), Var::from_tensor(&t).unwrap())
            })
            .collect()
    }

    /// A `GradStore` in which the gradient of each named parameter is `grads[name]`: the
    /// backward pass of `Σ_k sum(p_k ⊙ G_k)`.
    fn grad_store(params: &[(String, Var)], grads: &BTreeMap<String, Vec<f64>>) -> GradStore {
        let mut loss: Option<Tensor> = None;
        for (name, var) in params {
            let Some(g) = grads.get(name) else { continue };
            let g = Tensor::from_vec(g.clone(), var.dims(), &Device::Cpu)
                .unwrap()
                .to_dtype(var.dtype())
                .unwrap();
            let term = var.as_tensor().mul(&g).unwrap().sum_all().unwrap();
            loss = Some(match loss {
                Some(l) => l.add(&term).unwrap(),
                None => term,
            });
        }
        loss.unwrap().backward().unwrap()
    }

    fn step_grads(r: &Value, step: usize) -> BTreeMap<String, Vec<f64>> {
        r["grads"][step]
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, v)| (k.clone(), floats(v)))
            .collect()
    }

    fn adam_params(c: &Value) -> AdamParams {
        AdamParams {
            learning_rate: c["learning_rate"].as_f64().unwrap(),
            beta1: c["beta1"].as_f64().unwrap(),
            beta2: c["beta2"].as_f64().unwrap(),
            eps: c["eps"].as_f64().unwrap(),
            weight_decay: c["weight_decay"].as_f64().unwrap(),
            grad_clip_norm: c["grad_clip_norm"].as_f64().unwrap(),
        }
    }

    fn values(var: &Var) -> Vec<f64> {
        var.as_tensor()
            .flatten_all()
            .unwrap()
            .to_dtype(DType::F64)
            .unwrap()
            .to_vec1::<f64>()
            .unwrap()
    }

    /// Runs every configuration of the torch reference in `dt` and returns the largest
    /// absolute difference of parameters and of the relative difference of grad norms.
    fn compare_with_torch(dt: DType, key: &str) -> (f64, f64) {
        let r = reference();
        let (mut max_param, mut max_norm) = (0.0f64, 0.0f64);
        for cfg in r["configs"].as_array().unwrap() {
            let name = cfg["name"].as_str().unwrap();
            let p = adam_params(cfg);
            let params = initial_params(&r, dt);
            let mut opt = AdamW::new();
            let mut acc = GradAccumulator::new();
            for (step, want) in cfg[key].as_array().unwrap().iter().enumerate() {
                let grads = step_grads(&r, step);
                acc.add(grad_store(&params, &grads), &params).unwrap();
                let missing = acc.missing(&params);
                let m = opt.step(&params, &mut acc, &p).unwrap();
                assert!(acc.is_empty());
                assert_eq!(m["learning_rate"], p.learning_rate);
                assert_eq!(m["params_without_grad"], missing.len() as f64, "{name}");
                assert_eq!(m["params_updated"], grads.len() as f64, "{name}");
                let wn = want["grad_norm"].as_f64().unwrap();
                max_norm = max_norm.max((m["grad_norm"] - wn).abs() / wn);
                for (pname, var) in &params {
                    let got = values(var);
                    let exp = floats(&want["params"][pname.as_str()]);
                    for (g, e) in got.iter().zip(&exp) {
                        let d = (g - e).abs();
                        assert!(
                            d.is_finite(),
                            "{name} step {} {pname}: {g} vs {e}",
                            step + 1
                        );
                        max_param = max_param.max(d);
                    }
                }
            }
            // `c` never had a gradient: untouched (no weight decay either) and no state.
            assert_eq!(values(&params[2].1), floats(&cfg[key][0]["params"]["c"]));
            assert_eq!(opt.steps(), 4);
        }
        (max_param, max_norm)
    }

    /// The in-place `f32` CPU update gives the bits of the composed one (`update_one`): the
    /// parameter and both moments, over three steps, with and without clipping and decay, on
    /// a tensor of several rayon chunks.
    #[test]
    fn the_in_place_update_gives_the_bits_of_the_composed_one() {
        use rand::SeedableRng;
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        let (rows, cols) = (33, 2_000);
        let n = rows * cols;
        let mut random = || {
            Tensor::from_vec(
                crate::backend::local::model::normal_vec(&mut rng, n, 1.0),
                (rows, cols),
                &Device::Cpu,
            )
            .unwrap()
        };
        for (clip, wd) in [(0.0, 0.0), (0.05, 0.1), (1e6, 0.01)] {
            let p = AdamParams {
                learning_rate: 1e-2,
                beta1: 0.9,
                beta2: 0.95,
                eps: 1e-8,
                weight_decay: wd,
                grad_clip_norm: clip,
            };
            let init = random();
            let fast = vec![("w".to_string(), Var::from_tensor(&init).unwrap())];
            let composed = Var::from_tensor(&init.copy().unwrap()).unwrap();
            let (mut opt, mut acc) = (AdamW::new(), GradAccumulator::new());
            let mut state: Option<ParamState> = None;
            for step in 0..3 {
                let g = random();
                let mut store = GradStore::default();
                store.insert(fast[0].1.as_tensor(), g.clone());
                acc.add(store, &fast).unwrap();
                let norm = acc.global_norm().unwrap();
                let clip_coef = if clip > 0.0 {
                    (clip / (norm + 1e-6)).min(1.0)
                } else {
                    1.0
                };
                assert_eq!(clip_coef < 1.0, clip == 0.05);
                let taken = in_place_state(&fast[0].1, &g, opt.state.get("w")).unwrap();
                assert!(taken.is_some(), "the in-place path is taken");
                opt.step(&fast, &mut acc, &p).unwrap();
                let (param, next) =
                    update_one(&composed, &g, state.as_ref(), clip_coef, &p).unwrap();
                composed.set(&param).unwrap();
                let live = &opt.state["w"];
                let what = format!("clip {clip}, wd {wd}, step {}", step + 1);
                assert_eq!(live.step, next.step, "{what}");
                assert!(
                    f32_bits(fast[0].1.as_tensor()) == f32_bits(composed.as_tensor()),
                    "param, {what}"
                );
                assert!(
                    f32_bits(&live.exp_avg) == f32_bits(&next.exp_avg),
                    "exp_avg, {what}"
                );
                assert!(
                    f32_bits(&live.exp_avg_sq) == f32_bits(&next.exp_avg_sq),
                    "exp_avg_sq, {what}"
                );
                state = Some(next);
            }
        }
    }

    #[test]
    fn matches_torch_adamw_in_f64() {
        let (dp, dn) = compare_with_torch(DType::F64, "f64");
        eprintln!("f64: max |Δparam| {dp:e}, max rel Δgrad_norm {dn:e}");
        assert!(dp < 1e-13, "largest parameter difference {dp:e}");
        assert!(dn < 1e-13, "largest relative grad-norm difference {dn:e}");
    }

    #[test]
    fn matches_torch_adamw_in_f32() {
        let (dp, dn) = compare_with_torch(DType::F32, "f32");
        eprintln!("f32: max |Δparam| {dp:e}, max rel Δgrad_norm {dn:e}");
        assert!(dp < 1e-6, "largest parameter difference {dp:e}");
        assert!(dn < 1e-6, "largest relative grad-norm difference {dn:e}");
    }

    /// Two steps of the `weight_decay` configuration in `dt`, then returns the parameters
    /// and the optimizer.
    fn two_steps(r: &Value, dt: DType) -> (Vec<(String, Var)>, AdamW, AdamParams) {
        let p = adam_params(&r["configs"][1]);
        let params = initial_params(r, dt);
        let mut opt = AdamW::new();
        let mut acc = GradAccumulator::new();
        for step in 0..2 {
            acc.add(grad_store(&params, &step_grads(r, step)), &params)
                .unwrap();
            opt.step(&params, &mut acc, &p).unwrap();
        }
        (params, opt, p)
    }

    fn copy_params(params: &[(String, Var)]) -> Vec<(String, Var)> {
        params
            .iter()
            .map(|(n, v)| {
                (
                    n.clone(),
                    Var::from_tensor(&v.as_tensor().copy().unwrap()).unwrap(),
                )
            })
            .collect()
    }

    fn bits(params: &[(String, Var)]) -> Vec<Vec<u32>> {
        params
            .iter()
            .map(|(_, v)| {
                v.as_tensor()
                    .flatten_all()
                    .unwrap()
                    .to_vec1::<f32>()
                    .unwrap()
                    .iter()
                    .map(|x| x.to_bits())
                    .collect()
            })
            .collect()
    }

    /// Steps 3 and 4 of the reference gradients on `params` with `opt`.
    fn two_more_steps(r: &Value, params: &[(String, Var)], opt: &mut AdamW, p: &AdamParams) {
        let mut acc = GradAccumulator::new();
        for step in 2..4 {
            acc.add(grad_store(params, &step_grads(r, step)), params)
                .unwrap();
            opt.step(params, &mut acc, p).unwrap();
        }
    }

    #[test]
    fn state_round_trip_resumes_bit_identically() {
        let r = reference();
        let (params, mut opt, p) = two_steps(&r, DType::F32);
        let state = opt.state_tensors();
        // steps + (step, m, v) for a and b; c never had a gradient.
        assert_eq!(state.len(), 7, "{:?}", state.keys().collect::<Vec<_>>());
        assert_eq!(state["steps"].to_vec0::<i64>().unwrap(), 2);
        assert_eq!(state["step.a"].to_vec0::<i64>().unwrap(), 2);
        assert_eq!(state["step.b"].to_vec0::<i64>().unwrap(), 1);

        // Through a safetensors file, as the backend's checkpoints do.
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("optimizer.safetensors");
        candle_core::safetensors::save(&state, &file).unwrap();
        let loaded = candle_core::safetensors::load(&file, &Device::Cpu).unwrap();
        let mut resumed = AdamW::new();
        resumed.load_state_tensors(loaded).unwrap();
        assert_eq!(resumed.steps(), 2);

        let resumed_params = copy_params(&params);
        two_more_steps(&r, &params, &mut opt, &p);
        two_more_steps(&r, &resumed_params, &mut resumed, &p);
        assert_eq!(bits(&params), bits(&resumed_params));
        // Both continued the reference trajectory.
        let want = &r["configs"][1]["f32"][3]["params"]["a"];
        for (g, w) in values(&params[0].1).iter().zip(floats(want)) {
            assert!((g - w).abs() < 1e-6);
        }
        // A fresh optimizer (moments lost) would have diverged.
        let (fresh_params, _, _) = two_steps(&r, DType::F32);
        two_more_steps(&r, &fresh_params, &mut AdamW::new(), &p);
        assert_ne!(bits(&params), bits(&fresh_params));
    }

    #[test]
    fn malformed_state_is_rejected_and_the_old_state_kept() {
        let r = reference();
        let (_, opt, _) = two_steps(&r, DType::F32);
        let good = opt.state_tensors();
        let mut target = AdamW::new();
        target.load_state_tensors(good.clone()).unwrap();
        type Corrupt = Box<dyn Fn(&mut HashMap<String, Tensor>)>;
        let cases: Vec<(&str, Corrupt)> = vec![
            (
                "exp_avg_sq.a",
                Box::new(|s| {
                    s.remove("exp_avg_sq.a");
                }),
            ),
            (
                "steps",
                Box::new(|s| {
                    s.remove("steps");
                }),
            ),
            (
                "bogus",
                Box::new(|s| {
                    s.insert("bogus".into(), Tensor::new(1i64, &Device::Cpu).unwrap());
                }),
            ),
            (
                "step.b",
                Box::new(|s| {
                    s.insert("step.b".into(), Tensor::new(-1i64, &Device::Cpu).unwrap());
                }),
            ),
            (
                "a",
                Box::new(|s| {
                    s.insert(
                        "exp_avg.a".into(),
                        Tensor::zeros(5, DType::F32, &Device::Cpu).unwrap(),
                    );
                }),
            ),
        ];
        for (needle, corrupt) in cases {
            let mut bad = good.clone();
            corrupt(&mut bad);
            let e = AdamW::new()
                .load_state_tensors(bad)
                .unwrap_err()
                .to_string();
            assert!(e.contains(needle), "{needle}: {e}");
        }
        assert_eq!(target.steps(), 2);
        assert_eq!(target.state_tensors().len(), good.len());
    }

    #[test]
    fn state_of_another_shape_fails_the_step_without_changes() {
        let r = reference();
        let (_, opt, p) = two_steps(&r, DType::F32);
        let mut state = opt.state_tensors();
        for k in ["exp_avg.a", "exp_avg_sq.a"] {
            state.insert(
                k.into(),
                Tensor::zeros((3, 2), DType::F32, &Device::Cpu).unwrap(),
            );
        }
        let mut opt = AdamW::new();
        opt.load_state_tensors(state).unwrap();
        let params = initial_params(&r, DType::F32);
        let before = bits(&params);
        let mut acc = GradAccumulator::new();
        acc.add(grad_store(&params, &step_grads(&r, 0)), &params)
            .unwrap();
        let e = opt.step(&params, &mut acc, &p).unwrap_err().to_string();
        assert!(e.contains("`a`") && e.contains("shape"), "{e}");
        assert_eq!(bits(&params), before);
        assert_eq!(opt.steps(), 2);
    }

    #[test]
    fn two_adds_equal_one_add_of_the_summed_loss() {
        let r = reference();
        let p = adam_params(&r["configs"][2]); // clipping active + weight decay
        let g1 = step_grads(&r, 0);
        let g2 = step_grads(&r, 1);
        let mut sum = g1.clone();
        for (k, v) in &g2 {
            let e = sum.entry(k.clone()).or_insert_with(|| vec![0.0; v.len()]);
            for (a, b) in e.iter_mut().zip(v) {
                *a += b;
            }
        }
        for dt in [DType::F64, DType::F32] {
            let split = initial_params(&r, dt);
            let joint = copy_params(&split);
            let mut acc = GradAccumulator::new();
            acc.add(grad_store(&split, &g1), &split).unwrap();
            acc.add(grad_store(&split, &g2), &split).unwrap();
            let n_split = acc.global_norm().unwrap();
            let m_split = AdamW::new().step(&split, &mut acc, &p).unwrap();

            acc.add(grad_store(&joint, &sum), &joint).unwrap();
            let n_joint = acc.global_norm().unwrap();
            let m_joint = AdamW::new().step(&joint, &mut acc, &p).unwrap();

            let tol = if dt == DType::F64 { 1e-15 } else { 1e-6 };
            assert!(
                (n_split - n_joint).abs() <= tol * n_joint,
                "{n_split} vs {n_joint}"
            );
            assert_eq!(m_split["grad_norm"], n_split);
            assert_eq!(m_joint["grad_norm"], n_joint);
            for ((_, a), (_, b)) in split.iter().zip(&joint) {
                for (x, y) in values(a).iter().zip(values(b)) {
                    assert!((x - y).abs() <= tol, "{dt:?}: {x} vs {y}");
                }
            }
        }
    }

    #[test]
    fn accumulator_norms_missing_and_errors() {
        let r = reference();
        let params = initial_params(&r, DType::F64);
        let mut acc = GradAccumulator::new();
        assert_eq!(acc.global_norm().unwrap(), 0.0);
        assert_eq!(acc.missing(&params), ["a", "b", "c"]);
        let grads = step_grads(&r, 1); // only `a`
        acc.add(grad_store(&params, &grads), &params).unwrap();
        assert_eq!(acc.missing(&params), ["b", "c"]);
        let norm_a: f64 = grads["a"].iter().map(|x| x * x).sum::<f64>().sqrt();
        let norms = acc.norms().unwrap();
        assert_eq!(norms.len(), 1);
        assert!((norms["a"] - norm_a).abs() < 1e-14);
        assert!((acc.global_norm().unwrap() - norm_a).abs() < 1e-14);
        assert_eq!(
            acc.get("a")
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1::<f64>()
                .unwrap(),
            grads["a"]
        );

        // A name listed twice, or a gradient of another shape: nothing is added.
        let a_before = acc
            .get("a")
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f64>()
            .unwrap();
        let store = grad_store(&params, &grads);
        let twice = vec![params[0].clone(), params[0].clone()];
        let e = acc.add(store, &twice).unwrap_err().to_string();
        assert!(e.contains("`a`") && e.contains("twice"), "{e}");
        let mut wrong = grad_store(&params, &step_grads(&r, 0)); // a and b
        wrong.insert(
            params[1].1.as_tensor(),
            Tensor::zeros(5, DType::F64, &Device::Cpu).unwrap(),
        );
        let e = acc.add(wrong, &params).unwrap_err().to_string();
        assert!(e.contains("`b`") && e.contains("[5]"), "{e}");
        let a_after = acc
            .get("a")
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f64>()
            .unwrap();
        assert_eq!(
            a_before, a_after,
            "the gradient of `a` was not added either"
        );
        assert_eq!(acc.missing(&params), ["b", "c"]);

        acc.clear();
        assert!(acc.is_empty());
    }

    #[test]
    fn invalid_params_stray_gradients_and_non_finite_norms_are_errors() {
        let r = reference();
        let params = initial_params(&r, DType::F64);
        let before: Vec<Vec<f64>> = params.iter().map(|(_, v)| values(v)).collect();
        let mut opt = AdamW::new();
        let mut acc = GradAccumulator::new();
        acc.add(grad_store(&params, &step_grads(&r, 0)), &params)
            .unwrap();
        for (field, p) in [
            (
                "beta1",
                AdamParams {
                    beta1: 1.0,
                    ..AdamParams::default()
                },
            ),
            (
                "beta2",
                AdamParams {
                    beta2: -0.1,
                    ..AdamParams::default()
                },
            ),
            (
                "learning_rate",
                AdamParams {
                    learning_rate: f64::NAN,
                    ..AdamParams::default()
                },
            ),
            (
                "eps",
                AdamParams {
                    eps: -1.0,
                    ..AdamParams::default()
                },
            ),
            (
                "weight_decay",
                AdamParams {
                    weight_decay: f64::INFINITY,
                    ..AdamParams::default()
                },
            ),
            (
                "grad_clip_norm",
                AdamParams {
                    grad_clip_norm: -1.0,
                    ..AdamParams::default()
                },
            ),
        ] {
            let e = opt.step(&params, &mut acc, &p).unwrap_err().to_string();
            assert!(e.contains(&format!("adam_params.{field}")), "{e}");
            assert!(
                !acc.is_empty(),
                "a rejected configuration keeps the gradients"
            );
        }

        // Gradients of a parameter the step is not given.
        let e = opt
            .step(&params[1..], &mut acc, &AdamParams::default())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("`a`") && e.contains("not a trainable parameter"),
            "{e}"
        );
        assert!(acc.is_empty());

        let mut nan = step_grads(&r, 0);
        nan.get_mut("b").unwrap()[2] = f64::NAN;
        acc.add(grad_store(&params, &nan), &params).unwrap();
        let e = opt
            .step(&params, &mut acc, &AdamParams::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains("gradient norm is NaN"), "{e}");
        assert!(acc.is_empty());

        let after: Vec<Vec<f64>> = params.iter().map(|(_, v)| values(v)).collect();
        assert_eq!(before, after);
        assert_eq!(opt.steps(), 0);
        assert_eq!(opt.state_tensors().len(), 1);
    }

    #[test]
    fn a_step_without_gradients_changes_nothing_but_counts() {
        let r = reference();
        let params = initial_params(&r, DType::F32);
        let before = bits(&params);
        let mut opt = AdamW::new();
        let p = AdamParams {
            weight_decay: 0.5,
            ..AdamParams::default()
        };
        let m = opt.step(&params, &mut GradAccumulator::new(), &p).unwrap();
        assert_eq!(m["grad_norm"], 0.0);
        assert_eq!(m["params_without_grad"], 3.0);
        assert_eq!(bits(&params), before);
        assert_eq!(opt.steps(), 1);
    }

    /// The whole training path on a toy model: logits = X·W + b, `target_logprobs`,
    /// `cross_entropy` through `loss_value`, accumulation over two "datums", AdamW.
    #[test]
    fn cross_entropy_training_through_the_whole_path_lowers_the_loss() {
        use crate::backend::local::loss::{TokenInputs, loss_value, target_logprobs};
        use crate::types::LossFn;

        let dev = Device::Cpu;
        let (t, d, v) = (6usize, 4usize, 5usize);
        let x: Vec<f32> = (0..t * d).map(|i| ((i as f32) * 0.61).cos()).collect();
        let x = Tensor::from_vec(x, (t, d), &dev).unwrap();
        let targets = Tensor::new(&[1u32, 4, 0, 2, 2, 3], &dev).unwrap();
        let weights = Tensor::new(&[0.0f32, 1.0, 1.0, 0.5, 1.0, 1.0], &dev).unwrap();
        let params = vec![
            (
                "w".to_string(),
                Var::zeros((d, v), DType::F32, &dev).unwrap(),
            ),
            ("b".to_string(), Var::zeros(v, DType::F32, &dev).unwrap()),
        ];
        let loss_of = |rows: std::ops::Range<usize>| {
            let xs = x.narrow(0, rows.start, rows.len()).unwrap();
            let logits = xs
                .matmul(params[0].1.as_tensor())
                .unwrap()
                .broadcast_add(params[1].1.as_tensor())
                .unwrap();
            let lp = target_logprobs(&logits, &targets.narrow(0, rows.start, rows.len()).unwrap())
                .unwrap();
            let inputs = TokenInputs {
                target_logprobs: lp,
                sampler_logprobs: None,
                advantages: None,
                weights: Some(weights.narrow(0, rows.start, rows.len()).unwrap()),
            };
            loss_value(&LossFn::CrossEntropy, &inputs).unwrap()
        };
        let p = AdamParams {
            learning_rate: 0.1,
            ..AdamParams::default()
        };
        let mut opt = AdamW::new();
        let mut acc = GradAccumulator::new();
        let mut losses = Vec::new();
        for _ in 0..20 {
            // Two forward_backward calls (two datums) before one optimizer step.
            let (l1, m1) = loss_of(0..2);
            let (l2, m2) = loss_of(2..6);
            acc.add(l1.backward().unwrap(), &params).unwrap();
            acc.add(l2.backward().unwrap(), &params).unwrap();
            assert!(acc.missing(&params).is_empty());
            assert!(acc.norms().unwrap().values().all(|n| *n > 0.0));
            losses.push(m1["loss:sum"] + m2["loss:sum"]);
            opt.step(&params, &mut acc, &p).unwrap();
        }
        // At zero weights every token has log-prob −ln 5; the weights sum to 4.5.
        assert!((losses[0] - 4.5 * 5f64.ln()).abs() < 1e-5, "{}", losses[0]);
        assert!(
            losses.windows(2).all(|w| w[1] < w[0]),
            "the loss must fall at every step: {losses:?}"
        );
        assert!(losses[19] < 0.5 * losses[0], "{losses:?}");
    }
}
