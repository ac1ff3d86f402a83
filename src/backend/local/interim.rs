//! INTERIM stand-ins for task D2's `loss.rs` / `optim.rs` (same interface), used until the
//! `d2-optim` branch is merged; then this file is deleted. Only cross-entropy and
//! importance sampling, plain AdamW without clipping.

pub(crate) mod loss {
    use std::collections::BTreeMap;

    use candle_core::Tensor;

    use crate::error::{Error, Result};
    use crate::types::LossFn;

    fn be(e: candle_core::Error) -> Error {
        Error::Backend(e.to_string())
    }

    /// Per-token inputs of a loss.
    pub(crate) struct TokenInputs {
        pub target_logprobs: Tensor,
        pub sampler_logprobs: Option<Tensor>,
        pub advantages: Option<Tensor>,
        pub weights: Option<Tensor>,
    }

    pub(crate) fn loss_value(
        loss: &LossFn,
        t: &TokenInputs,
    ) -> Result<(Tensor, BTreeMap<String, f64>)> {
        let lp = &t.target_logprobs;
        let l = match loss {
            LossFn::CrossEntropy => {
                let w = t
                    .weights
                    .as_ref()
                    .ok_or_else(|| Error::Backend("weights".into()))?;
                (lp * w)
                    .map_err(be)?
                    .sum_all()
                    .map_err(be)?
                    .neg()
                    .map_err(be)?
            }
            _ => {
                let q = t
                    .sampler_logprobs
                    .as_ref()
                    .ok_or_else(|| Error::Backend("logprobs".into()))?;
                let a = t
                    .advantages
                    .as_ref()
                    .ok_or_else(|| Error::Backend("advantages".into()))?;
                let r = (lp - q).map_err(be)?.exp().map_err(be)?;
                (r * a)
                    .map_err(be)?
                    .sum_all()
                    .map_err(be)?
                    .neg()
                    .map_err(be)?
            }
        };
        Ok((l, BTreeMap::new()))
    }
}

pub(crate) mod optim {
    use std::collections::{BTreeMap, HashMap};

    use candle_core::backprop::GradStore;
    use candle_core::{Tensor, Var};

    use crate::error::{Error, Result};
    use crate::types::AdamParams;

    fn be(e: candle_core::Error) -> Error {
        Error::Backend(e.to_string())
    }

    #[derive(Default)]
    pub(crate) struct GradAccumulator {
        grads: HashMap<String, Tensor>,
    }

    impl GradAccumulator {
        pub fn new() -> Self {
            Self::default()
        }
        pub fn add(&mut self, store: &GradStore, params: &[(String, Var)]) -> Result<()> {
            for (name, v) in params {
                if let Some(g) = store.get(v.as_tensor()) {
                    let g = g.detach();
                    let new = match self.grads.remove(name) {
                        Some(old) => (old + g).map_err(be)?,
                        None => g.copy().map_err(be)?,
                    };
                    self.grads.insert(name.clone(), new);
                }
            }
            Ok(())
        }
        pub fn get(&self, name: &str) -> Option<&Tensor> {
            self.grads.get(name)
        }
    }

    #[derive(Default)]
    pub(crate) struct AdamW {
        step: u64,
        m: HashMap<String, Tensor>,
        v: HashMap<String, Tensor>,
    }

    impl AdamW {
        pub fn new() -> Self {
            Self::default()
        }
        pub fn step(
            &mut self,
            params: &[(String, Var)],
            acc: &mut GradAccumulator,
            p: &AdamParams,
        ) -> Result<BTreeMap<String, f64>> {
            self.step += 1;
            let t = self.step as i32;
            let bc1 = 1.0 - p.beta1.powi(t);
            let bc2 = 1.0 - p.beta2.powi(t);
            for (name, var) in params {
                let Some(g) = acc.grads.get(name) else {
                    continue;
                };
                let m = match self.m.get(name) {
                    Some(m) => ((m * p.beta1).map_err(be)? + (g * (1.0 - p.beta1)).map_err(be)?)
                        .map_err(be)?,
                    None => (g * (1.0 - p.beta1)).map_err(be)?,
                };
                let g2 = g.sqr().map_err(be)?;
                let v = match self.v.get(name) {
                    Some(v) => ((v * p.beta2).map_err(be)? + (g2 * (1.0 - p.beta2)).map_err(be)?)
                        .map_err(be)?,
                    None => (g2 * (1.0 - p.beta2)).map_err(be)?,
                };
                let mh = (&m / bc1).map_err(be)?;
                let vh = (&v / bc2).map_err(be)?;
                let upd = (mh / (vh.sqrt().map_err(be)? + p.eps).map_err(be)?).map_err(be)?;
                let w = var.as_tensor();
                let decayed = (w * (1.0 - p.learning_rate * p.weight_decay)).map_err(be)?;
                let new = (decayed - (upd * p.learning_rate).map_err(be)?).map_err(be)?;
                var.set(&new).map_err(be)?;
                self.m.insert(name.clone(), m);
                self.v.insert(name.clone(), v);
            }
            acc.grads.clear();
            Ok(BTreeMap::new())
        }
        pub fn state_tensors(&self) -> HashMap<String, Tensor> {
            let mut out = HashMap::new();
            for (k, t) in &self.m {
                out.insert(format!("m.{k}"), t.clone());
            }
            for (k, t) in &self.v {
                out.insert(format!("v.{k}"), t.clone());
            }
            if let Ok(s) = Tensor::new(&[self.step as f64], &candle_core::Device::Cpu) {
                out.insert("step".into(), s);
            }
            out
        }
        pub fn load_state_tensors(&mut self, state: HashMap<String, Tensor>) -> Result<()> {
            self.m.clear();
            self.v.clear();
            for (k, t) in state {
                if let Some(n) = k.strip_prefix("m.") {
                    self.m.insert(n.to_string(), t);
                } else if let Some(n) = k.strip_prefix("v.") {
                    self.v.insert(n.to_string(), t);
                } else if k == "step" {
                    self.step = t
                        .to_vec1::<f64>()
                        .map_err(be)?
                        .first()
                        .copied()
                        .unwrap_or(0.0) as u64;
                }
            }
            Ok(())
        }
    }
}
