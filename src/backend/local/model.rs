//! The Qwen3 decoder in candle: weights, LoRA-aware forward pass, KV cache.
//!
//! The forward pass has two flavours. [`Mode::Train`] uses only composed tensor operations
//! (softmax as `exp / sum`, RMSNorm and RoPE from elementary ops) because candle's fused
//! kernels have no backward pass and would silently stop gradients (DESIGN.md §7).
//! [`Mode::Infer`] uses candle's fused kernels where they exist (sampling, no gradients).
//! Both compute the same function; the tests compare them.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor, D};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::config::Qwen3Config;
use crate::error::{Error, Result};

/// Wraps a candle error with context.
pub(crate) fn be(context: &str) -> impl Fn(candle_core::Error) -> Error + '_ {
    move |e| Error::Backend(format!("{context}: {e}"))
}

/// Which implementation of the non-linear ops to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Composed ops only: every parameter gets its gradient.
    Train,
    /// candle's fused kernels (no backward).
    Infer,
}

/// The linear projections of one decoder layer, by their Hugging Face suffix.
pub(crate) const ATTN_PROJ: [&str; 4] = [
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
];
/// The MLP projections of one decoder layer.
pub(crate) const MLP_PROJ: [&str; 3] = ["mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"];
/// The name of the unembedding.
pub(crate) const LM_HEAD: &str = "lm_head";

/// The weights of a Qwen3 model, by Hugging Face tensor name (`model.layers.0.mlp.up_proj.weight`).
///
/// Tensors are candle tensors: cheap to clone (reference counted), and either plain tensors
/// (a frozen base) or the tensors of `Var`s (full fine-tuning).
#[derive(Clone)]
pub(crate) struct Weights {
    map: BTreeMap<String, Tensor>,
}

/// The name and shape of every tensor of a model with `cfg` (the LM head only when untied).
pub(crate) fn weight_shapes(cfg: &Qwen3Config) -> Vec<(String, Vec<usize>)> {
    let h = cfg.hidden_size;
    let d = cfg.head_dim();
    let q = cfg.num_attention_heads * d;
    let kv = cfg.num_key_value_heads * d;
    let i = cfg.intermediate_size;
    let mut v = vec![(
        "model.embed_tokens.weight".to_string(),
        vec![cfg.vocab_size, h],
    )];
    for l in 0..cfg.num_hidden_layers {
        let p = format!("model.layers.{l}");
        v.push((format!("{p}.input_layernorm.weight"), vec![h]));
        v.push((format!("{p}.self_attn.q_proj.weight"), vec![q, h]));
        v.push((format!("{p}.self_attn.k_proj.weight"), vec![kv, h]));
        v.push((format!("{p}.self_attn.v_proj.weight"), vec![kv, h]));
        v.push((format!("{p}.self_attn.o_proj.weight"), vec![h, q]));
        v.push((format!("{p}.self_attn.q_norm.weight"), vec![d]));
        v.push((format!("{p}.self_attn.k_norm.weight"), vec![d]));
        v.push((format!("{p}.post_attention_layernorm.weight"), vec![h]));
        v.push((format!("{p}.mlp.gate_proj.weight"), vec![i, h]));
        v.push((format!("{p}.mlp.up_proj.weight"), vec![i, h]));
        v.push((format!("{p}.mlp.down_proj.weight"), vec![h, i]));
    }
    v.push(("model.norm.weight".to_string(), vec![h]));
    if !cfg.tie_word_embeddings {
        v.push(("lm_head.weight".to_string(), vec![cfg.vocab_size, h]));
    }
    v
}

/// `n` samples of N(0, std²) from a seeded ChaCha stream (Box–Muller).
pub(crate) fn normal_vec(rng: &mut ChaCha8Rng, n: usize, std: f64) -> Vec<f32> {
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        let u1: f64 = rng.random::<f64>().max(f64::MIN_POSITIVE);
        let u2: f64 = rng.random::<f64>();
        let r = (-2.0 * u1.ln()).sqrt();
        let t = 2.0 * std::f64::consts::PI * u2;
        out.push((r * t.cos() * std) as f32);
        if out.len() < n {
            out.push((r * t.sin() * std) as f32);
        }
    }
    out
}

impl Weights {
    /// Wraps a name → tensor map (checked against `cfg`).
    pub(crate) fn from_map(cfg: &Qwen3Config, map: BTreeMap<String, Tensor>) -> Result<Self> {
        for (name, shape) in weight_shapes(cfg) {
            match map.get(&name) {
                None => return Err(Error::Backend(format!("weight `{name}` is missing"))),
                Some(t) if t.dims() != shape.as_slice() => {
                    return Err(Error::Backend(format!(
                        "weight `{name}` has shape {:?}, expected {shape:?}",
                        t.dims()
                    )))
                }
                Some(_) => {}
            }
        }
        Ok(Weights { map })
    }

    /// Random weights: N(0, initializer_range²) for matrices, ones for norms (as transformers).
    pub(crate) fn random(cfg: &Qwen3Config, seed: u64, device: &Device) -> Result<Self> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut map = BTreeMap::new();
        for (name, shape) in weight_shapes(cfg) {
            let n: usize = shape.iter().product();
            let t = if name.ends_with("norm.weight") {
                Tensor::ones(shape.as_slice(), DType::F32, device)
            } else {
                Tensor::from_vec(
                    normal_vec(&mut rng, n, cfg.initializer_range),
                    shape.as_slice(),
                    device,
                )
            }
            .map_err(be("initialising weights"))?;
            map.insert(name, t);
        }
        Ok(Weights { map })
    }

    /// Loads the weights of a Hugging Face directory (`model.safetensors`, or the shards
    /// listed by `model.safetensors.index.json`, or every `*.safetensors`), memory-mapped.
    pub(crate) fn load(dir: &Path, cfg: &Qwen3Config, device: &Device) -> Result<Self> {
        let files = safetensors_files(dir)?;
        // SAFETY: the files are memory-mapped read-only; like every mmap user we rely on them
        // not being modified while mapped (candle copies each tensor out on `get`).
        let vb =
            unsafe { candle_nn::VarBuilder::from_mmaped_safetensors(&files, DType::F32, device) }
                .map_err(|e| {
                Error::Backend(format!("mapping safetensors in {}: {e}", dir.display()))
            })?;
        let mut map = BTreeMap::new();
        for (name, shape) in weight_shapes(cfg) {
            if !vb.contains_tensor(&name) {
                return Err(Error::Backend(format!(
                    "{}: weight `{name}` is missing from the safetensors files",
                    dir.display()
                )));
            }
            let t = vb
                .get(shape.as_slice(), &name)
                .map_err(|e| Error::Backend(format!("{}: `{name}`: {e}", dir.display())))?;
            map.insert(name, t);
        }
        Ok(Weights { map })
    }

    /// A tensor by name.
    pub(crate) fn get(&self, name: &str) -> Result<&Tensor> {
        self.map
            .get(name)
            .ok_or_else(|| Error::Backend(format!("weight `{name}` is missing")))
    }

    /// Every tensor by name.
    pub(crate) fn map(&self) -> &BTreeMap<String, Tensor> {
        &self.map
    }

    /// A deep copy, detached from any graph or `Var`.
    pub(crate) fn snapshot(&self) -> Result<Self> {
        let mut map = BTreeMap::new();
        for (k, t) in &self.map {
            map.insert(k.clone(), t.detach().copy().map_err(be("copying weights"))?);
        }
        Ok(Weights { map })
    }
}

/// The safetensors files of a Hugging Face model directory.
pub(crate) fn safetensors_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let single = dir.join("model.safetensors");
    if single.is_file() {
        return Ok(vec![single]);
    }
    let index = dir.join("model.safetensors.index.json");
    if index.is_file() {
        let text = std::fs::read_to_string(&index).map_err(|e| Error::io("reading", &index, e))?;
        let v: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| Error::data_line(&index, e.line(), e.to_string()))?;
        let map = v
            .get("weight_map")
            .and_then(|m| m.as_object())
            .ok_or_else(|| Error::data_line(&index, 0, "no `weight_map` object in the index"))?;
        let mut files: Vec<PathBuf> = Vec::new();
        for (name, file) in map {
            let file = file.as_str().ok_or_else(|| {
                Error::data_line(&index, 0, format!("weight_map.{name} is not a file name"))
            })?;
            let p = dir.join(file);
            if !files.contains(&p) {
                files.push(p);
            }
        }
        return Ok(files);
    }
    let rd = std::fs::read_dir(dir).map_err(|e| Error::io("listing", dir, e))?;
    let mut files: Vec<PathBuf> = rd
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(Error::Backend(format!(
            "{}: no *.safetensors weights found",
            dir.display()
        )));
    }
    Ok(files)
}

/// LoRA adapters: for a linear weight `W` ([out, in]) named `name`, `A` ([r, in]) and `B`
/// ([out, r]); the adapted layer computes `x Wᵀ + scale · (x Aᵀ) Bᵀ`.
#[derive(Clone)]
pub(crate) struct Adapters {
    /// `alpha / rank`.
    pub scale: f64,
    /// Module name (`model.layers.0.self_attn.q_proj`, `lm_head`) → (A, B).
    pub map: HashMap<String, (Tensor, Tensor)>,
}

impl Adapters {
    /// A deep, detached copy.
    pub(crate) fn snapshot(&self) -> Result<Self> {
        let mut map = HashMap::new();
        for (k, (a, b)) in &self.map {
            map.insert(
                k.clone(),
                (
                    a.detach().copy().map_err(be("copying adapters"))?,
                    b.detach().copy().map_err(be("copying adapters"))?,
                ),
            );
        }
        Ok(Adapters {
            scale: self.scale,
            map,
        })
    }

    /// The weights with every adapter merged in: `W + scale · B A`.
    pub(crate) fn merge_into(&self, w: &Weights, cfg: &Qwen3Config) -> Result<Weights> {
        let mut map = w.map.clone();
        for (module, (a, b)) in &self.map {
            let delta = (b.matmul(a).map_err(be("merging adapters"))? * self.scale)
                .map_err(be("merging adapters"))?;
            let name = if module == LM_HEAD && cfg.tie_word_embeddings {
                // A tied model gets an explicit (untied) LM head once the head is adapted.
                "model.embed_tokens.weight".to_string()
            } else {
                format!("{module}.weight")
            };
            let base = w.get(&name)?;
            let merged = (base + delta).map_err(be("merging adapters"))?;
            let target = if module == LM_HEAD {
                "lm_head.weight".to_string()
            } else {
                name
            };
            map.insert(target, merged);
        }
        Ok(Weights { map })
    }
}

/// Rotary embedding tables (`cos`, `sin`: [max_positions, head_dim / 2]).
pub(crate) struct Rope {
    cos: Tensor,
    sin: Tensor,
    max: usize,
}

impl Rope {
    /// Tables for `cfg` (computed in f32 like transformers' default rotary embedding).
    pub(crate) fn new(cfg: &Qwen3Config, device: &Device) -> Result<Self> {
        let d = cfg.head_dim();
        let base = cfg.rope_theta();
        let inv: Vec<f32> = (0..d / 2)
            .map(|i| (1.0 / base.powf((2 * i) as f64 / d as f64)) as f32)
            .collect();
        let max = cfg.max_position_embeddings;
        let mut cos = Vec::with_capacity(max * d / 2);
        let mut sin = Vec::with_capacity(max * d / 2);
        for p in 0..max {
            for &f in &inv {
                let a = p as f32 * f;
                cos.push(a.cos());
                sin.push(a.sin());
            }
        }
        Ok(Rope {
            cos: Tensor::from_vec(cos, (max, d / 2), device).map_err(be("rope"))?,
            sin: Tensor::from_vec(sin, (max, d / 2), device).map_err(be("rope"))?,
            max,
        })
    }

    /// The longest supported sequence.
    pub(crate) fn max_positions(&self) -> usize {
        self.max
    }

    /// Applies the rotation to `x` ([b, heads, t, d]) for positions `offset..offset + t`.
    fn apply(&self, x: &Tensor, offset: usize, mode: Mode) -> candle_core::Result<Tensor> {
        let (_b, _h, t, d) = x.dims4()?;
        let cos = self.cos.narrow(0, offset, t)?;
        let sin = self.sin.narrow(0, offset, t)?;
        match mode {
            Mode::Infer => candle_nn::rotary_emb::rope(&x.contiguous()?, &cos, &sin),
            Mode::Train => {
                let cos = Tensor::cat(&[&cos, &cos], 1)?; // [t, d]
                let sin = Tensor::cat(&[&sin, &sin], 1)?;
                let x1 = x.narrow(3, 0, d / 2)?;
                let x2 = x.narrow(3, d / 2, d / 2)?;
                let rot = Tensor::cat(&[&x2.neg()?, &x1], 3)?;
                x.broadcast_mul(&cos)? + rot.broadcast_mul(&sin)?
            }
        }
    }
}

/// Per-layer key/value cache: ([b, kv_heads, t, d], [b, kv_heads, t, d]).
#[derive(Clone, Default)]
pub(crate) struct KvCache {
    layers: Vec<Option<(Tensor, Tensor)>>,
}

impl KvCache {
    /// An empty cache for `n_layers` layers.
    pub(crate) fn new(n_layers: usize) -> Self {
        KvCache {
            layers: vec![None; n_layers],
        }
    }

    /// Repeats a batch-1 cache `n` times along the batch.
    pub(crate) fn expand(&mut self, n: usize) -> Result<()> {
        for (k, v) in self.layers.iter_mut().flatten() {
            *k = k
                .repeat((n, 1, 1, 1))
                .map_err(be("expanding the KV cache"))?;
            *v = v
                .repeat((n, 1, 1, 1))
                .map_err(be("expanding the KV cache"))?;
        }
        Ok(())
    }

    /// Keeps only the batch rows `rows` (in that order).
    pub(crate) fn select(&mut self, rows: &[u32]) -> Result<()> {
        let Some(Some((k0, _))) = self.layers.first() else {
            return Ok(());
        };
        let idx = Tensor::new(rows, k0.device()).map_err(be("selecting KV rows"))?;
        for (k, v) in self.layers.iter_mut().flatten() {
            *k = k.index_select(&idx, 0).map_err(be("selecting KV rows"))?;
            *v = v.index_select(&idx, 0).map_err(be("selecting KV rows"))?;
        }
        Ok(())
    }
}

/// A Qwen3 model: configuration, weights, optional adapters, rotary tables.
pub(crate) struct Model<'a> {
    pub cfg: &'a Qwen3Config,
    pub weights: &'a Weights,
    pub adapters: Option<&'a Adapters>,
    pub rope: &'a Rope,
}

fn rms_norm(x: &Tensor, w: &Tensor, eps: f64, mode: Mode) -> candle_core::Result<Tensor> {
    match mode {
        Mode::Infer => candle_nn::ops::rms_norm(&x.contiguous()?, w, eps as f32),
        Mode::Train => {
            let var = x.sqr()?.mean_keepdim(D::Minus1)?;
            let denom = (var + eps)?.sqrt()?;
            x.broadcast_div(&denom)?.broadcast_mul(w)
        }
    }
}

/// Softmax over the last dimension.
fn softmax(x: &Tensor, mode: Mode) -> candle_core::Result<Tensor> {
    match mode {
        Mode::Infer => candle_nn::ops::softmax_last_dim(&x.contiguous()?),
        Mode::Train => {
            let m = x.max_keepdim(D::Minus1)?.detach();
            let e = x.broadcast_sub(&m)?.exp()?;
            let s = e.sum_keepdim(D::Minus1)?;
            e.broadcast_div(&s)
        }
    }
}

impl Model<'_> {
    fn linear(&self, x: &Tensor, module: &str) -> candle_core::Result<Tensor> {
        let w = self
            .weights
            .map
            .get(&format!("{module}.weight"))
            .ok_or_else(|| candle_core::Error::Msg(format!("weight `{module}.weight` missing")))?;
        self.linear_with(x, w, module)
    }

    fn linear_with(&self, x: &Tensor, w: &Tensor, module: &str) -> candle_core::Result<Tensor> {
        let dims = x.dims().to_vec();
        let (last, lead) = dims
            .split_last()
            .ok_or_else(|| candle_core::Error::Msg("linear on a scalar".into()))?;
        let rows: usize = lead.iter().product();
        let x2 = x.reshape((rows, *last))?;
        let mut y = x2.matmul(&w.t()?)?;
        if let Some((a, b)) = self.adapters.and_then(|ad| ad.map.get(module)) {
            let scale = self.adapters.map(|a| a.scale).unwrap_or(1.0);
            let low = x2.matmul(&a.t()?)?.matmul(&b.t()?)?;
            y = (y + (low * scale)?)?;
        }
        let out = w.dim(0)?;
        let mut shape = lead.to_vec();
        shape.push(out);
        y.reshape(shape)
    }

    fn w(&self, name: &str) -> candle_core::Result<&Tensor> {
        self.weights
            .map
            .get(name)
            .ok_or_else(|| candle_core::Error::Msg(format!("weight `{name}` missing")))
    }

    /// Logits for `ids` ([b, t] u32) at positions `offset..offset + t`, given the cache (which
    /// is extended). With `last_only`, only the last position's logits ([b, 1, V]).
    pub(crate) fn forward(
        &self,
        ids: &Tensor,
        offset: usize,
        mut cache: Option<&mut KvCache>,
        mode: Mode,
        last_only: bool,
    ) -> Result<Tensor> {
        self.forward_inner(ids, offset, &mut cache, mode, last_only)
            .map_err(be("forward pass"))
    }

    fn forward_inner(
        &self,
        ids: &Tensor,
        offset: usize,
        cache: &mut Option<&mut KvCache>,
        mode: Mode,
        last_only: bool,
    ) -> candle_core::Result<Tensor> {
        let cfg = self.cfg;
        let (b, t) = ids.dims2()?;
        if offset + t > self.rope.max_positions() {
            return Err(candle_core::Error::Msg(format!(
                "sequence of {} tokens exceeds max_position_embeddings = {}",
                offset + t,
                self.rope.max_positions()
            )));
        }
        let h = cfg.hidden_size;
        let nh = cfg.num_attention_heads;
        let nkv = cfg.num_key_value_heads;
        let hd = cfg.head_dim();
        let eps = cfg.rms_norm_eps;
        let embed = self.w("model.embed_tokens.weight")?;
        let mut x = embed
            .index_select(&ids.flatten_all()?, 0)?
            .reshape((b, t, h))?;
        let total = offset + t;
        let mask = if t > 1 {
            let m: Vec<f32> = (0..t)
                .flat_map(|i| {
                    (0..total).map(move |j| {
                        if j > offset + i {
                            f32::NEG_INFINITY
                        } else {
                            0.0
                        }
                    })
                })
                .collect();
            Some(Tensor::from_vec(m, (t, total), ids.device())?)
        } else {
            None
        };
        let scale = 1.0 / (hd as f64).sqrt();
        for l in 0..cfg.num_hidden_layers {
            let p = format!("model.layers.{l}");
            let residual = x.clone();
            let xn = rms_norm(
                &x,
                self.w(&format!("{p}.input_layernorm.weight"))?,
                eps,
                mode,
            )?;
            let q = self.linear(&xn, &format!("{p}.self_attn.q_proj"))?;
            let k = self.linear(&xn, &format!("{p}.self_attn.k_proj"))?;
            let v = self.linear(&xn, &format!("{p}.self_attn.v_proj"))?;
            let q = q.reshape((b, t, nh, hd))?;
            let k = k.reshape((b, t, nkv, hd))?;
            let v = v.reshape((b, t, nkv, hd))?.transpose(1, 2)?.contiguous()?;
            let q = rms_norm(
                &q,
                self.w(&format!("{p}.self_attn.q_norm.weight"))?,
                eps,
                mode,
            )?
            .transpose(1, 2)?
            .contiguous()?;
            let k = rms_norm(
                &k,
                self.w(&format!("{p}.self_attn.k_norm.weight"))?,
                eps,
                mode,
            )?
            .transpose(1, 2)?
            .contiguous()?;
            let q = self.rope.apply(&q, offset, mode)?;
            let k = self.rope.apply(&k, offset, mode)?;
            let (k, v) = match cache.as_deref_mut() {
                Some(c) => {
                    let slot = c
                        .layers
                        .get_mut(l)
                        .ok_or_else(|| candle_core::Error::Msg("KV cache too short".into()))?;
                    let (k, v) = match slot.take() {
                        Some((pk, pv)) => {
                            (Tensor::cat(&[&pk, &k], 2)?, Tensor::cat(&[&pv, &v], 2)?)
                        }
                        None => (k, v),
                    };
                    *slot = Some((k.clone(), v.clone()));
                    (k, v)
                }
                None => (k, v),
            };
            let (k, v) = if nh != nkv {
                let rep = nh / nkv;
                let kt = k.dim(2)?;
                let k = k
                    .unsqueeze(2)?
                    .expand((b, nkv, rep, kt, hd))?
                    .reshape((b, nh, kt, hd))?;
                let v = v
                    .unsqueeze(2)?
                    .expand((b, nkv, rep, kt, hd))?
                    .reshape((b, nh, kt, hd))?;
                (k, v)
            } else {
                (k, v)
            };
            let mut att = (q.matmul(&k.t()?.contiguous()?)? * scale)?;
            if let Some(m) = &mask {
                att = att.broadcast_add(m)?;
            }
            let att = softmax(&att, mode)?;
            let y = att
                .matmul(&v)?
                .transpose(1, 2)?
                .contiguous()?
                .reshape((b, t, nh * hd))?;
            let y = self.linear(&y, &format!("{p}.self_attn.o_proj"))?;
            x = (residual + y)?;
            let residual = x.clone();
            let xn = rms_norm(
                &x,
                self.w(&format!("{p}.post_attention_layernorm.weight"))?,
                eps,
                mode,
            )?;
            let gate = self.linear(&xn, &format!("{p}.mlp.gate_proj"))?;
            let up = self.linear(&xn, &format!("{p}.mlp.up_proj"))?;
            let act = gate.silu()?; // candle's silu has a backward pass
            let y = self.linear(&(act * up)?, &format!("{p}.mlp.down_proj"))?;
            x = (residual + y)?;
        }
        let x = if last_only && t > 1 {
            x.narrow(1, t - 1, 1)?
        } else {
            x
        };
        let x = rms_norm(&x, self.w("model.norm.weight")?, eps, mode)?;
        let head = if cfg.tie_word_embeddings {
            embed
        } else {
            self.w("lm_head.weight")?
        };
        self.linear_with(&x, head, LM_HEAD)
    }
}
