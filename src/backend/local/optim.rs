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

use std::collections::{BTreeMap, BTreeSet, HashMap};

use candle_core::backprop::GradStore;
use candle_core::{DType, Device, Tensor, Var};

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
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) struct GradAccumulator {
    grads: BTreeMap<String, Tensor>,
}

#[cfg_attr(not(test), allow(dead_code))]
impl GradAccumulator {
    /// An empty accumulator.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds the gradients in `grads` of the parameters `params` to the running sums.
    ///
    /// Parameters without a gradient in `grads` are left as they are. All or nothing: on error
    /// (a gradient whose shape differs from its parameter's, a name given twice) nothing is
    /// added.
    pub fn add(&mut self, grads: &GradStore, params: &[(String, Var)]) -> Result<()> {
        let mut seen = BTreeSet::new();
        let mut updates = Vec::new();
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
                Some(prev) => prev.add(&g).map_err(be("gradient accumulation"))?,
                None => g,
            };
            updates.push((name.clone(), sum));
        }
        self.grads.extend(updates);
        Ok(())
    }

    /// Forgets every accumulated gradient.
    pub fn clear(&mut self) {
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
        self.grads
            .iter()
            .map(|(name, g)| Ok((name.clone(), l2_norm(g)?)))
            .collect()
    }

    /// The global L2 norm of the accumulated gradients (the norm of the per-tensor norms, as
    /// `torch.nn.utils.clip_grad_norm_` computes it); 0 when there are none.
    pub fn global_norm(&self) -> Result<f64> {
        let mut sq = 0.0;
        for g in self.grads.values() {
            let n = l2_norm(g)?;
            sq += n * n;
        }
        Ok(sq.sqrt())
    }
}

/// The L2 norm of a tensor, reduced in its own dtype and returned as `f64`.
fn l2_norm(t: &Tensor) -> Result<f64> {
    t.sqr()
        .and_then(|s| s.sum_all())
        .and_then(|s| s.to_dtype(DType::F64))
        .and_then(|s| s.to_vec0::<f64>())
        .map(f64::sqrt)
        .map_err(be("gradient norm"))
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
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) struct AdamW {
    state: BTreeMap<String, ParamState>,
    steps: u64,
}

#[cfg_attr(not(test), allow(dead_code))]
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

        // Compute every new value first, then commit, so an error changes nothing.
        let mut updates = Vec::new();
        let mut skipped = 0usize;
        for (name, var) in params {
            let Some(g) = acc.grads.get(name) else {
                skipped += 1;
                continue;
            };
            let prev = self.state.get(name);
            let (param, state) = update_one(var, g, prev, clip_coef, p).map_err(|e| match e {
                Error::Backend(m) => Error::Backend(format!("AdamW update of `{name}`: {m}")),
                other => other,
            })?;
            updates.push((name, var, param, state));
        }
        let updated = updates.len();
        for (name, var, param, state) in updates {
            var.set(&param).map_err(be("AdamW parameter write"))?;
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
    #[allow(clippy::expect_used)]
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

#[cfg(test)]
mod tests {
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
                acc.add(&grad_store(&params, &grads), &params).unwrap();
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
}
