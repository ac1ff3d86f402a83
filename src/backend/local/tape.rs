//! The training pass of the local backend written out by hand: a forward pass that keeps
//! the activations its backward pass needs, and that backward pass, layer by layer in
//! reverse, for `f32` models on the CPU.
//!
//! candle's autograd gives each node's gradient a fresh zero tensor and adds every
//! contribution into it (`zeros + g`, a pass over memory and a fresh allocation per node),
//! and the embedding's gradient is a zero `[V, h]` tensor, a copy of it with the rows added,
//! then the sum with the head's gradient: four fresh `[V, h]` tensors per step. On a 59M
//! parameter model that was about a fifth of a training step, most of it in the kernel
//! faulting in and zeroing fresh pages. Here each gradient is the product that makes it,
//! sums are formed only where two paths meet (the residual stream, the projections that
//! share an input, a tied embedding), and the embedding's rows are added in place into the
//! head's gradient.
//!
//! The kernels are the ones the autograd path runs (the fused ops of [`super::fused`] and the
//! products of [`super::matmul`], through their `*_grads` functions), so the gradients equal
//! that path's up to the order in which contributions are summed (tested: every parameter,
//! full and LoRA, tied and untied heads). The loss itself (from the target tokens'
//! log-probabilities on) stays on candle's autograd: it is small.

use candle_core::backprop::GradStore;
use candle_core::{CpuStorage, DType, InplaceOp2, Layout, Tensor};

use super::fused;
use super::matmul;
use super::model::{EMBED, LM_HEAD, Mode, Model};
use super::pool::recycle;

/// Whether the hand-written pass runs `model`: every weight and adapter `f32` on the CPU.
pub(crate) fn applies(model: &Model<'_>) -> bool {
    let fits = |t: &Tensor| t.device().is_cpu() && t.dtype() == DType::F32;
    model.weights.map().values().all(fits)
        && model
            .adapters
            .is_none_or(|ad| ad.map.values().all(|(a, b)| fits(a) && fits(b)))
}

/// What one decoder layer's backward pass needs from its forward pass.
struct Layer {
    /// The layer's input (the residual stream), `[b, t, h]`.
    x: Tensor,
    /// `input_layernorm(x)`.
    xn1: Tensor,
    /// Query and key heads before their RMSNorm, `[b, heads, t, d]`.
    qs: Tensor,
    ks: Tensor,
    /// Queries after RoPE as the attention reads them, `[b, kv_heads, rep · t, d]`.
    qg: Tensor,
    /// Keys after RoPE and values, `[b, kv_heads, t, d]`.
    kr: Tensor,
    vs: Tensor,
    /// Attention weights, `[b, kv_heads, rep · t, t]`.
    att: Tensor,
    /// The attention's output with its heads merged, `[b, t, heads · d]`.
    y: Tensor,
    /// The residual stream after attention.
    x_mid: Tensor,
    /// `post_attention_layernorm(x_mid)`, the MLP's gate and up projections, `silu(gate) ⊙ up`.
    xn2: Tensor,
    gate: Tensor,
    up: Tensor,
    act: Tensor,
}

impl Layer {
    /// Every activation, for [`recycle`] once the layer's backward pass is done.
    fn tensors(&self) -> [&Tensor; 14] {
        [
            &self.x,
            &self.xn1,
            &self.qs,
            &self.ks,
            &self.qg,
            &self.kr,
            &self.vs,
            &self.att,
            &self.y,
            &self.x_mid,
            &self.xn2,
            &self.gate,
            &self.up,
            &self.act,
        ]
    }
}

/// The activations of one [`forward`] pass.
pub(crate) struct Tape {
    ids: Vec<u32>,
    b: usize,
    t: usize,
    layers: Vec<Layer>,
    /// The last layer's output, before the final norm, `[b, t, h]`.
    x_last: Tensor,
    /// The final norm's output as the head reads it, `[b · t, h]`.
    xf: Tensor,
    /// The name of the head's weight (`lm_head.weight`, or the embedding when tied).
    head: &'static str,
}

/// The logits `[b · t, V]` of `ids` (`[b, t]` u32, positions `0..t`) and the activations of
/// the pass. `model` holds detached weights (no autograd graph is recorded); the values are
/// those of [`Model::forward_flat`] in [`Mode::Train`].
pub(crate) fn forward(model: &Model<'_>, ids: &Tensor) -> candle_core::Result<(Tensor, Tape)> {
    let cfg = model.cfg;
    let (b, t) = ids.dims2()?;
    if t > model.rope.max_positions() {
        candle_core::bail!(
            "sequence of {t} tokens exceeds max_position_embeddings = {}",
            model.rope.max_positions()
        );
    }
    let (h, nh, nkv, hd) = (
        cfg.hidden_size,
        cfg.num_attention_heads,
        cfg.num_key_value_heads,
        cfg.head_dim(),
    );
    let rep = nh / nkv;
    let eps = cfg.rms_norm_eps;
    let scale = 1.0 / (hd as f64).sqrt();
    let flat_ids = ids.flatten_all()?;
    let mut x = model
        .w(EMBED)?
        .index_select(&flat_ids, 0)?
        .reshape((b, t, h))?;
    let mut layers = Vec::with_capacity(cfg.num_hidden_layers);
    let linear = |x: &Tensor, module: &str| model.linear(x, module, Mode::Train);
    for l in 0..cfg.num_hidden_layers {
        let p = format!("model.layers.{l}");
        let xn1 = fused::rms_norm(&x, model.w(&format!("{p}.input_layernorm.weight"))?, eps)?;
        let q = linear(&xn1, &format!("{p}.self_attn.q_proj"))?;
        let k = linear(&xn1, &format!("{p}.self_attn.k_proj"))?;
        let v = linear(&xn1, &format!("{p}.self_attn.v_proj"))?;
        let qs = fused::split_heads(&q, nh)?;
        let ks = fused::split_heads(&k, nkv)?;
        let vs = fused::split_heads(&v, nkv)?;
        let qn = fused::rms_norm(&qs, model.w(&format!("{p}.self_attn.q_norm.weight"))?, eps)?;
        let kn = fused::rms_norm(&ks, model.w(&format!("{p}.self_attn.k_norm.weight"))?, eps)?;
        let qr = model.rope.apply(&qn, 0, Mode::Train)?;
        let kr = model.rope.apply(&kn, 0, Mode::Train)?;
        let qg = qr.reshape((b, nkv, rep * t, hd))?;
        let (yh, att) = fused::causal_attention_parts(&qg, &kr, &vs, scale, t, 0)?;
        let y = fused::merge_heads(&yh, t)?;
        let x_mid = fused::add(&x, &linear(&y, &format!("{p}.self_attn.o_proj"))?)?;
        let xn2 = fused::rms_norm(
            &x_mid,
            model.w(&format!("{p}.post_attention_layernorm.weight"))?,
            eps,
        )?;
        let gate = linear(&xn2, &format!("{p}.mlp.gate_proj"))?;
        let up = linear(&xn2, &format!("{p}.mlp.up_proj"))?;
        let act = fused::swiglu(&gate, &up)?;
        let next = fused::add(&x_mid, &linear(&act, &format!("{p}.mlp.down_proj"))?)?;
        layers.push(Layer {
            x,
            xn1,
            qs,
            ks,
            qg,
            kr,
            vs,
            att,
            y,
            x_mid,
            xn2,
            gate,
            up,
            act,
        });
        x = next;
    }
    let xf = fused::rms_norm(&x, model.w("model.norm.weight")?, eps)?.reshape((b * t, h))?;
    let head = if model.weights.map().contains_key("lm_head.weight") || !cfg.tie_word_embeddings {
        "lm_head.weight"
    } else {
        EMBED
    };
    let logits = model.linear_with(&xf, model.w(head)?, LM_HEAD, Mode::Train)?;
    let tape = Tape {
        ids: flat_ids.to_vec1::<u32>()?,
        b,
        t,
        layers,
        x_last: x,
        xf,
        head,
    };
    Ok((logits, tape))
}

/// Gradients by parameter: the tensors of `keys` (the model whose trainable tensors are
/// `Var`s) that track gradients get theirs; sums where several paths meet.
struct Grads<'k, 'm> {
    keys: &'k Model<'m>,
    store: GradStore,
}

impl Grads<'_, '_> {
    /// Whether the weight `name` is trained.
    fn wants(&self, name: &str) -> bool {
        self.keys
            .weights
            .map()
            .get(name)
            .is_some_and(Tensor::track_op)
    }

    fn add(&mut self, key: &Tensor, g: Tensor) -> candle_core::Result<()> {
        let sum = match self.store.remove(key) {
            Some(prev) => {
                let sum = fused::add(&prev, &g)?;
                recycle([&prev, &g]);
                sum
            }
            None => g,
        };
        self.store.insert(key, sum);
        Ok(())
    }

    fn add_weight(&mut self, name: &str, g: Option<Tensor>) -> candle_core::Result<()> {
        if let (Some(g), Some(key)) = (g, self.keys.weights.map().get(name)) {
            let key = key.clone();
            self.add(&key, g)?;
        }
        Ok(())
    }
}

impl Tape {
    /// The gradients of every trained tensor of `keys` given `dlogits` = ∂L/∂logits, for the
    /// pass [`forward`] made with `model` (the same weights, detached). `dlogits`, the
    /// largest tensor of the step, is dropped once the head is done. The buffers of the
    /// activations, of `dlogits` and of the intermediate gradients go back to the backend's
    /// [pool](super::pool) as soon as they are done with (a layer's once its backward pass
    /// is), so that the layers below reuse them.
    pub(crate) fn backward(
        self,
        model: &Model<'_>,
        keys: &Model<'_>,
        dlogits: Tensor,
    ) -> candle_core::Result<GradStore> {
        let cfg = model.cfg;
        let (b, t) = (self.b, self.t);
        let (h, nh, nkv, hd) = (
            cfg.hidden_size,
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            cfg.head_dim(),
        );
        let eps = cfg.rms_norm_eps as f32;
        let scale = (1.0 / (hd as f64).sqrt()) as f32;
        let mut grads = Grads {
            keys,
            store: GradStore::default(),
        };
        let (cos, sin) = model.rope.tables(t)?;

        // The head, then the final norm.
        let dxf = linear_backward(model, &mut grads, &self.xf, self.head, LM_HEAD, &dlogits)?;
        recycle([&dlogits]);
        drop(dlogits);
        let w_norm = "model.norm.weight";
        let (dx, dw) = fused::rms_norm_grads(
            &self.x_last,
            model.w(w_norm)?,
            &dxf.reshape((b, t, h))?,
            eps,
            true,
            grads.wants(w_norm),
        )?;
        grads.add_weight(w_norm, dw)?;
        let mut dx = need(dx)?;
        recycle([&dxf, &self.xf, &self.x_last]);

        for (l, layer) in self.layers.iter().enumerate().rev() {
            let p = format!("model.layers.{l}");
            let module = |m: &str| format!("{p}.{m}");
            let weight = |m: &str| format!("{p}.{m}.weight");
            // MLP: next = x_mid + down(silu(gate) ⊙ up).
            let m = module("mlp.down_proj");
            let dact = linear_backward(
                model,
                &mut grads,
                &layer.act,
                &weight("mlp.down_proj"),
                &m,
                &dx,
            )?;
            let (dgate, dup) = fused::swiglu_grads(&layer.gate, &layer.up, &dact)?;
            let m = module("mlp.gate_proj");
            let dxn2_gate = linear_backward(
                model,
                &mut grads,
                &layer.xn2,
                &weight("mlp.gate_proj"),
                &m,
                &dgate,
            )?;
            let m = module("mlp.up_proj");
            let dxn2_up = linear_backward(
                model,
                &mut grads,
                &layer.xn2,
                &weight("mlp.up_proj"),
                &m,
                &dup,
            )?;
            let dxn2 = fused::add(&dxn2_gate, &dxn2_up)?;
            recycle([&dxn2_gate, &dxn2_up]);
            let name = weight("post_attention_layernorm");
            let (dn, dw) = fused::rms_norm_grads(
                &layer.x_mid,
                model.w(&name)?,
                &dxn2,
                eps,
                true,
                grads.wants(&name),
            )?;
            grads.add_weight(&name, dw)?;
            let dn = need(dn)?;
            let dmid = fused::add(&dx, &dn)?;
            recycle([&dn]);

            // Attention: x_mid = x + o_proj(attention(q, k, v)).
            let m = module("self_attn.o_proj");
            let dy = linear_backward(
                model,
                &mut grads,
                &layer.y,
                &weight("self_attn.o_proj"),
                &m,
                &dmid,
            )?;
            let dyh = fused::split_heads(&dy, nh)?.reshape((b, nkv, (nh / nkv) * t, hd))?;
            let (dqg, dk, dv) = fused::causal_attention_grads(
                &layer.qg, &layer.kr, &layer.vs, &layer.att, &dyh, scale,
            )?;
            let dqn = fused::rope_grad(&dqg.reshape((b, nh, t, hd))?, &cos, &sin)?;
            let dkn = fused::rope_grad(&dk, &cos, &sin)?;
            let mut dheads = Vec::with_capacity(3);
            let mut dnormed = Vec::with_capacity(2);
            for (norm, input, d) in [
                ("self_attn.q_norm", &layer.qs, &dqn),
                ("self_attn.k_norm", &layer.ks, &dkn),
            ] {
                let name = weight(norm);
                let (ds, dw) = fused::rms_norm_grads(
                    input,
                    model.w(&name)?,
                    d,
                    eps,
                    true,
                    grads.wants(&name),
                )?;
                grads.add_weight(&name, dw)?;
                let ds = need(ds)?;
                dheads.push(fused::merge_heads(&ds, t)?);
                dnormed.push(ds);
            }
            dheads.push(fused::merge_heads(&dv, t)?);
            let mut dxn1: Option<Tensor> = None;
            for (proj, d) in ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"]
                .into_iter()
                .zip(&dheads)
            {
                let g = linear_backward(
                    model,
                    &mut grads,
                    &layer.xn1,
                    &weight(proj),
                    &module(proj),
                    d,
                )?;
                dxn1 = Some(match dxn1 {
                    Some(sum) => {
                        let new = fused::add(&sum, &g)?;
                        recycle([&sum, &g]);
                        new
                    }
                    None => g,
                });
            }
            let dxn1 = need(dxn1)?;
            let name = weight("input_layernorm");
            let (dn, dw) = fused::rms_norm_grads(
                &layer.x,
                model.w(&name)?,
                &dxn1,
                eps,
                true,
                grads.wants(&name),
            )?;
            grads.add_weight(&name, dw)?;
            let dn = need(dn)?;
            let dx_in = fused::add(&dmid, &dn)?;
            // Everything of this layer but its input's gradient is done with.
            recycle(layer.tensors());
            recycle([
                &dx, &dact, &dgate, &dup, &dxn2, &dmid, &dy, &dyh, &dqg, &dk, &dv, &dqn, &dkn,
                &dxn1, &dn,
            ]);
            recycle(dheads.iter().chain(&dnormed));
            dx = dx_in;
        }

        // The embedding: each token's row of `dx`, summed per id in token order, added to
        // the head's gradient when tied (in place) or to zeros.
        if grads.wants(EMBED) {
            let dx = dx.reshape((b * t, h))?;
            let mut order: Vec<u32> = Vec::new();
            let mut slot = std::collections::HashMap::new();
            let local: Vec<u32> = self
                .ids
                .iter()
                .map(|&id| {
                    *slot.entry(id).or_insert_with(|| {
                        order.push(id);
                        order.len() as u32 - 1
                    })
                })
                .collect();
            let rows = Tensor::zeros((order.len(), h), DType::F32, dx.device())?.index_add(
                &Tensor::new(local, dx.device())?,
                &dx,
                0,
            )?;
            let key = keys.w(EMBED)?.clone();
            let base = match grads.store.remove(&key) {
                Some(head) => head,
                None => Tensor::zeros(keys.w(EMBED)?.dims(), DType::F32, dx.device())?,
            };
            base.inplace_op2(&rows, &AddRows(order))?;
            grads.store.insert(&key, base);
            recycle([&rows]);
        }
        recycle([&dx]);
        Ok(grads.store)
    }
}

/// The backward pass of the projection `module` (weight `name`, its adapter if any) whose
/// forward pass read `x`: gives the weight or the adapter its gradient (when trained) and
/// returns `dx`.
fn linear_backward(
    model: &Model<'_>,
    grads: &mut Grads<'_, '_>,
    x: &Tensor,
    name: &str,
    module: &str,
    grad: &Tensor,
) -> candle_core::Result<Tensor> {
    let w = model.w(name)?;
    let adapter = model
        .adapters
        .and_then(|ad| ad.map.get(module).map(|ab| (ad.scale, ab)));
    let key_adapter = grads
        .keys
        .adapters
        .and_then(|ad| ad.map.get(module).cloned());
    match (adapter, key_adapter) {
        (Some((scale, (a, b))), Some((ka, kb))) => {
            let wanted = (true, ka.track_op(), kb.track_op());
            let (dx, da, db) = matmul::lora_linear_grads(x, w, a, b, scale as f32, grad, wanted)?;
            if let Some(da) = da {
                grads.add(&ka, da)?;
            }
            if let Some(db) = db {
                grads.add(&kb, db)?;
            }
            need(dx)
        }
        _ => {
            let (dx, dw) = matmul::linear_grads(x, w, grad, true, grads.wants(name))?;
            grads.add_weight(name, dw)?;
            need(dx)
        }
    }
}

fn need(g: Option<Tensor>) -> candle_core::Result<Tensor> {
    g.ok_or_else(|| candle_core::Error::Msg("an input gradient was not computed".into()))
}

/// `dst[ids[i]] += rows[i]` in place (`dst` `[V, h]`, `rows` `[ids.len(), h]`; every id once).
struct AddRows(Vec<u32>);

impl InplaceOp2 for AddRows {
    fn name(&self) -> &'static str {
        "rlvr-add-rows"
    }

    fn cpu_fwd(
        &self,
        s1: &mut CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> candle_core::Result<()> {
        let dst = super::buffers::contiguous_f32_mut(s1, l1, "add rows")?;
        let rows = super::buffers::contiguous_f32(s2, l2, "add rows")?;
        let h = l1.dims().last().copied().unwrap_or(0);
        if h == 0 || rows.len() != self.0.len() * h {
            candle_core::bail!("add rows: {:?} rows for {} ids", l2.dims(), self.0.len());
        }
        for (&id, row) in self.0.iter().zip(rows.chunks(h)) {
            let start = id as usize * h;
            let Some(d) = dst.get_mut(start..start + h) else {
                candle_core::bail!("add rows: id {id} outside {:?}", l1.dims());
            };
            for (d, &r) in d.iter_mut().zip(row) {
                *d += r;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, HashMap};

    use candle_core::{Device, Var};
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    use super::super::config::Qwen3Config;
    use super::super::model::{Adapters, Rope, Weights, normal_vec, weight_shapes};
    use super::super::test_util::max_rel;
    use super::*;

    /// Every trained tensor's gradient from the hand-written pass equals candle's autograd
    /// on the fused training path (relative error ≤ 1e-4), for `Σ wᵢ · log p(targetᵢ)` with
    /// random ids, targets and weights: full fine-tuning and LoRA (every projection and the
    /// head), tied and untied embeddings, a repeated token in the batch.
    #[test]
    fn every_gradient_equals_the_autograd_path() {
        let dev = Device::Cpu;
        let v = 37;
        for tied in [true, false] {
            let cfg = Qwen3Config::new(v, 32, 48, 2, 4, 2, 8, 64).with_tied_embeddings(tied);
            let rope = Rope::new(&cfg, &dev).unwrap();
            let mut rng = ChaCha8Rng::seed_from_u64(11);
            let (b, t) = (3, 13);
            let mut ids: Vec<u32> = (0..b * t).map(|_| rng.random_range(0..v as u32)).collect();
            ids[5] = ids[20];
            let ids = Tensor::from_vec(ids, (b, t), &dev).unwrap();
            let targets: Vec<u32> = (0..b * t).map(|_| rng.random_range(0..v as u32)).collect();
            let token_w = Tensor::from_vec(normal_vec(&mut rng, b * t, 1.0), b * t, &dev).unwrap();
            let base = Weights::random(&cfg, 5, &dev).unwrap();
            let vars: BTreeMap<String, Var> = base
                .map()
                .iter()
                .map(|(n, w)| (n.clone(), Var::from_tensor(w).unwrap()))
                .collect();
            let full = Weights::from_map(
                &cfg,
                vars.iter()
                    .map(|(n, v)| (n.clone(), v.as_tensor().clone()))
                    .collect(),
            )
            .unwrap();
            let mut lora_vars = Vec::new();
            let mut map = HashMap::new();
            let mut modules: Vec<(String, Vec<usize>)> = weight_shapes(&cfg)
                .into_iter()
                .filter(|(n, s)| s.len() == 2 && n != EMBED && n != "lm_head.weight")
                .map(|(n, s)| (n.trim_end_matches(".weight").to_string(), s))
                .collect();
            modules.push((LM_HEAD.to_string(), vec![v, 32]));
            for (module, shape) in modules {
                let a = Var::from_vec(normal_vec(&mut rng, 4 * shape[1], 0.3), (4, shape[1]), &dev)
                    .unwrap();
                let bm =
                    Var::from_vec(normal_vec(&mut rng, shape[0] * 4, 0.3), (shape[0], 4), &dev)
                        .unwrap();
                map.insert(
                    module.clone(),
                    (a.as_tensor().clone(), bm.as_tensor().clone()),
                );
                lora_vars.push((format!("{module}.a"), a));
                lora_vars.push((format!("{module}.b"), bm));
            }
            let adapters = Adapters { scale: 2.0, map };
            type Case<'a> = (&'a Weights, Option<&'a Adapters>, Vec<(String, Var)>);
            let cases: [Case<'_>; 2] = [
                (&full, None, vars.into_iter().collect()),
                (&base, Some(&adapters), lora_vars),
            ];
            for (weights, adapters, params) in cases {
                let what = format!("tied {tied}, lora {}", adapters.is_some());
                let keys = Model {
                    cfg: &cfg,
                    weights,
                    adapters,
                    rope: &rope,
                };
                assert!(applies(&keys));
                // candle's autograd on the fused training path.
                let logits = keys.forward_flat(&ids, Mode::Train).unwrap();
                let lp = fused::token_logprobs(&logits, targets.clone()).unwrap();
                let want = (lp * &token_w)
                    .unwrap()
                    .sum_all()
                    .unwrap()
                    .backward()
                    .unwrap();
                // The hand-written pass on the detached weights.
                let (dw, da) = (weights.detached(), adapters.map(Adapters::detached));
                let model = Model {
                    cfg: &cfg,
                    weights: &dw,
                    adapters: da.as_ref(),
                    rope: &rope,
                };
                let (logits2, tape) = forward(&model, &ids).unwrap();
                assert_eq!(max_rel(&logits2, &logits), 0.0, "{what}: the same logits");
                let (_, saved) = fused::token_logprobs_saved(&logits2, targets.clone()).unwrap();
                let dlogits = saved.grad(&logits2, &token_w).unwrap();
                let got = tape.backward(&model, &keys, dlogits).unwrap();
                for (name, var) in &params {
                    let r = want
                        .get(var.as_tensor())
                        .unwrap_or_else(|| panic!("{what}, {name}: no reference gradient"));
                    let g = got
                        .get(var.as_tensor())
                        .unwrap_or_else(|| panic!("{what}, {name}: no gradient"));
                    assert_eq!(g.dims(), var.dims(), "{what}, {name}");
                    let e = max_rel(g, r);
                    assert!(e <= 1e-4, "{what}, {name}: relative error {e}");
                }
                assert_eq!(
                    got.get_ids().count(),
                    params.len(),
                    "{what}: a gradient for each trained tensor, nothing else"
                );
            }
        }
    }
}
