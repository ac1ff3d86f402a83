//! The Qwen3 decoder in candle: weights, LoRA-aware forward pass, KV cache.
//!
//! The forward pass has three flavours. [`Mode::Train`] uses only ops with a backward pass:
//! this crate's fused CPU kernels ([`super::fused`], [`super::matmul`]), each one node of the
//! autograd graph with its own backward, else composed candle ops, because candle's fused
//! kernels have no backward pass and would silently stop gradients (DESIGN.md §7).
//! [`Mode::Infer`] uses candle's fused kernels where they exist (sampling, no gradients).
//! [`Mode::Composed`] is the training path from composed candle ops, the reference of the
//! tests. All compute the same function; the tests compare them.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use candle_core::{D, DType, Device, Tensor};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::config::Qwen3Config;
use super::{fused, matmul};
use crate::error::{Error, Result};

/// Wraps a candle error with context.
pub(crate) fn be(context: &str) -> impl Fn(candle_core::Error) -> Error + '_ {
    move |e| Error::Backend(format!("{context}: {e}"))
}

/// Which implementation of the non-linear ops to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Ops with a backward pass: the fused kernels of [`super::fused`] on the CPU (the
    /// attention softmax, RMSNorm, RoPE, SwiGLU), composed candle ops elsewhere. Every
    /// parameter gets its gradient.
    Train,
    /// candle's fused kernels (no backward), and this crate's SwiGLU (the same values).
    Infer,
    /// Composed candle ops only: the training path before the fused kernels, kept as the
    /// reference they are tested against.
    #[cfg_attr(not(test), allow(dead_code))]
    Composed,
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
    let mut v = vec![(EMBED.to_string(), vec![cfg.vocab_size, h])];
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
                    )));
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

    /// The same tensors (shared storage, no copy) outside gradient tracking: operations on
    /// them record no graph.
    pub(crate) fn detached(&self) -> Self {
        Weights {
            map: self
                .map
                .iter()
                .map(|(k, t)| (k.clone(), t.detach()))
                .collect(),
        }
    }

    /// A deep, detached copy in the decoding layout (see [`into_decoding`](Self::into_decoding)):
    /// a full fine-tuning sampler's snapshot.
    pub(crate) fn decoding_copy(&self, cfg: &Qwen3Config) -> Result<Self> {
        let mut map = BTreeMap::new();
        for (k, t) in &self.map {
            let copy = if transposed_for_decoding(k, t) {
                transposed(t)?
            } else {
                t.detach().copy().map_err(be("copying weights"))?
            };
            map.insert(k.clone(), copy);
        }
        Weights { map }.with_decoding_head(cfg)
    }

    /// These weights in the decoding layout, made one tensor at a time (a frozen LoRA base:
    /// the backend keeps this one copy for training and sampling). On the CPU every
    /// projection matrix (`[out, in]`, all 2-D weights but the embedding) is stored
    /// transposed: the same `[out, in]` tensor, with strides `(1, out)`. `x · wᵀ` then reads
    /// `wᵀ` row-major, the layout in which the `gemm` kernels take it as it is; with the
    /// row-major layout they gather the whole matrix, value by value, into a packed copy at
    /// every product, about 40% of a batch-64 decoding step of a 32k-vocabulary model. A
    /// tied LM head gets such a copy of the embedding as `lm_head.weight` (the embedding
    /// keeps its rows for the lookup). The values are the same; products of the two layouts
    /// agree up to float reassociation (the kernels sum in another order). Off the CPU: as is.
    pub(crate) fn into_decoding(self, cfg: &Qwen3Config) -> Result<Self> {
        let mut map = BTreeMap::new();
        for (k, t) in self.map {
            let t = if transposed_for_decoding(&k, &t) {
                transposed(&t)?
            } else {
                t
            };
            map.insert(k, t);
        }
        Weights { map }.with_decoding_head(cfg)
    }

    /// A tied head's decoding copy (`lm_head.weight`), if missing.
    fn with_decoding_head(mut self, cfg: &Qwen3Config) -> Result<Self> {
        if cfg.tie_word_embeddings
            && !self.map.contains_key("lm_head.weight")
            && let Some(embed) = self.map.get(EMBED).filter(|e| e.device().is_cpu())
        {
            let head = transposed(embed)?;
            self.map.insert("lm_head.weight".to_string(), head);
        }
        Ok(self)
    }
}

/// The embedding's name (a lookup table, never transposed).
pub(crate) const EMBED: &str = "model.embed_tokens.weight";

/// Whether `name` is stored transposed in the decoding layout ([`Weights::into_decoding`]):
/// a projection matrix on the CPU.
fn transposed_for_decoding(name: &str, t: &Tensor) -> bool {
    t.device().is_cpu() && t.rank() == 2 && name != EMBED
}

/// A detached, transposed copy of the matrix `t`, viewed back as `t`'s shape.
fn transposed(t: &Tensor) -> Result<Tensor> {
    t.detach()
        .t()
        .and_then(|t| t.contiguous())
        .and_then(|t| t.t())
        .map_err(be("transposing weights"))
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
    /// The same tensors (shared storage, no copy) outside gradient tracking.
    pub(crate) fn detached(&self) -> Self {
        Adapters {
            scale: self.scale,
            map: self
                .map
                .iter()
                .map(|(k, (a, b))| (k.clone(), (a.detach(), b.detach())))
                .collect(),
        }
    }

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
                EMBED.to_string()
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

    /// Applies the rotation to `x` ([b, heads, 1, d]) with one position per batch row
    /// (`positions`: u32 [b]).
    fn apply_rows(
        &self,
        x: &Tensor,
        positions: &Tensor,
        mode: Mode,
    ) -> candle_core::Result<Tensor> {
        let (b, _h, t, d) = x.dims4()?;
        if t != 1 {
            candle_core::bail!("per-row rotary positions need one token per row, got {t}");
        }
        let cos = self.cos.index_select(positions, 0)?; // [b, d/2]
        let sin = self.sin.index_select(positions, 0)?;
        match mode {
            Mode::Infer => candle_nn::rotary_emb::rope(
                &x.contiguous()?,
                &cos.reshape((b, 1, d / 2))?,
                &sin.reshape((b, 1, d / 2))?,
            ),
            Mode::Train | Mode::Composed => {
                let cos = Tensor::cat(&[&cos, &cos], 1)?.reshape((b, 1, 1, d))?;
                let sin = Tensor::cat(&[&sin, &sin], 1)?.reshape((b, 1, 1, d))?;
                let x1 = x.narrow(3, 0, d / 2)?;
                let x2 = x.narrow(3, d / 2, d / 2)?;
                let rot = Tensor::cat(&[&x2.neg()?, &x1], 3)?;
                x.broadcast_mul(&cos)? + rot.broadcast_mul(&sin)?
            }
        }
    }

    /// The `cos` and `sin` tables of positions `0..t` (`[t, d / 2]` each).
    pub(super) fn tables(&self, t: usize) -> candle_core::Result<(Tensor, Tensor)> {
        Ok((self.cos.narrow(0, 0, t)?, self.sin.narrow(0, 0, t)?))
    }

    /// Applies the rotation to `x` ([b, heads, t, d]) for positions `offset..offset + t`.
    pub(super) fn apply(
        &self,
        x: &Tensor,
        offset: usize,
        mode: Mode,
    ) -> candle_core::Result<Tensor> {
        let (_b, _h, t, d) = x.dims4()?;
        let cos = self.cos.narrow(0, offset, t)?;
        let sin = self.sin.narrow(0, offset, t)?;
        match mode {
            Mode::Infer => candle_nn::rotary_emb::rope(&x.contiguous()?, &cos, &sin),
            Mode::Train if x.device().is_cpu() => fused::rope(x, &cos, &sin),
            Mode::Train | Mode::Composed => {
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

/// Per-layer key/value cache: preallocated buffers ([b, kv_heads, capacity, d]) written in
/// place, so a decoding step copies only the new position; a full buffer doubles.
#[derive(Clone)]
pub(crate) struct KvCache {
    layers: Vec<Option<(Tensor, Tensor)>>,
    capacity: usize,
}

impl KvCache {
    /// An empty cache for `n_layers` layers with room for `capacity` positions (it grows).
    pub(crate) fn new(n_layers: usize, capacity: usize) -> Self {
        KvCache {
            layers: vec![None; n_layers],
            capacity,
        }
    }

    /// Stacks batch-1 caches into one cache of `capacity` slots: `parts` are (cache, number
    /// of cached positions, rows); each is repeated for its rows and left-padded with zeros
    /// so that its positions end at slot `end`.
    pub(crate) fn stack(
        parts: &[(&KvCache, usize, usize)],
        end: usize,
        capacity: usize,
    ) -> Result<Self> {
        let n_layers = parts.first().map(|p| p.0.layers.len()).unwrap_or(0);
        let mut layers = Vec::with_capacity(n_layers);
        for l in 0..n_layers {
            let mut ks = Vec::with_capacity(parts.len());
            let mut vs = Vec::with_capacity(parts.len());
            for (cache, len, n) in parts {
                let Some(Some((k, v))) = cache.layers.get(l) else {
                    return Err(Error::Backend("stacking an unfilled KV cache".into()));
                };
                let place = |t: &Tensor| -> candle_core::Result<Tensor> {
                    let (_, h, _, d) = t.dims4()?;
                    let mut pieces = Vec::with_capacity(3);
                    if end > *len {
                        pieces.push(Tensor::zeros((1, h, end - len, d), t.dtype(), t.device())?);
                    }
                    pieces.push(t.narrow(2, 0, *len)?);
                    if capacity > end {
                        pieces.push(Tensor::zeros(
                            (1, h, capacity - end, d),
                            t.dtype(),
                            t.device(),
                        )?);
                    }
                    Tensor::cat(&pieces, 2)?.repeat((*n, 1, 1, 1))
                };
                ks.push(place(k).map_err(be("stacking KV caches"))?);
                vs.push(place(v).map_err(be("stacking KV caches"))?);
            }
            let k = Tensor::cat(&ks, 0).map_err(be("stacking KV caches"))?;
            let v = Tensor::cat(&vs, 0).map_err(be("stacking KV caches"))?;
            layers.push(Some((k, v)));
        }
        Ok(KvCache { layers, capacity })
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

    /// Writes `k`, `v` ([b, kv_heads, t, d]) of layer `l` at `offset`; returns the cached keys
    /// and values of positions `0..offset + t` (views into the buffers).
    fn append(
        &mut self,
        l: usize,
        k: &Tensor,
        v: &Tensor,
        offset: usize,
    ) -> candle_core::Result<(Tensor, Tensor)> {
        let (b, h, t, d) = k.dims4()?;
        let slot = self
            .layers
            .get_mut(l)
            .ok_or_else(|| candle_core::Error::Msg("KV cache has too few layers".into()))?;
        // Grow (doubling) when full, so the capacity never has to be the worst case.
        if let Some((kb, _)) = slot.as_ref() {
            let cap = kb.dim(2)?;
            if offset + t > cap {
                let new_cap = (offset + t).max(2 * cap);
                let grow = |old: &Tensor| -> candle_core::Result<Tensor> {
                    let z = Tensor::zeros((b, h, new_cap, d), old.dtype(), old.device())?;
                    z.slice_set(old, 2, 0)?;
                    Ok(z)
                };
                if let Some((kb, vb)) = slot.take() {
                    *slot = Some((grow(&kb)?, grow(&vb)?));
                }
            }
        }
        if slot.is_none() {
            let z = Tensor::zeros(
                (b, h, self.capacity.max(offset + t), d),
                k.dtype(),
                k.device(),
            )?;
            *slot = Some((z.clone(), z.copy()?));
        }
        let (kb, vb) = slot
            .as_ref()
            .ok_or_else(|| candle_core::Error::Msg("KV cache slot".into()))?;
        kb.slice_set(&k.contiguous()?, 2, offset)?;
        vb.slice_set(&v.contiguous()?, 2, offset)?;
        Ok((kb.narrow(2, 0, offset + t)?, vb.narrow(2, 0, offset + t)?))
    }
}

/// Per-row decoding state for a batch whose rows sit at different positions: each row feeds
/// one token, written to the same cache slot, with its own rotary position and an additive
/// attention mask over the slots (`-inf` on the left padding of shorter prompts).
pub(crate) struct RowPositions {
    /// Rotary position of each row's token (u32 [b]).
    pub positions: Tensor,
    /// Additive mask over cache slots `0..=slot` (f32 [b, slot + 1]), if any row is padded.
    pub mask: Option<Tensor>,
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
        Mode::Train if x.device().is_cpu() => fused::rms_norm(x, w, eps),
        Mode::Train | Mode::Composed => {
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
        Mode::Train | Mode::Composed => {
            let m = x.max_keepdim(D::Minus1)?.detach();
            let e = x.broadcast_sub(&m)?.exp()?;
            let s = e.sum_keepdim(D::Minus1)?;
            e.broadcast_div(&s)
        }
    }
}

impl Model<'_> {
    pub(super) fn linear(
        &self,
        x: &Tensor,
        module: &str,
        mode: Mode,
    ) -> candle_core::Result<Tensor> {
        let w = self
            .weights
            .map
            .get(&format!("{module}.weight"))
            .ok_or_else(|| candle_core::Error::Msg(format!("weight `{module}.weight` missing")))?;
        self.linear_with(x, w, module, mode)
    }

    /// `x · wᵀ` (plus the module's adapter, if any) over the last dimension of `x`: one node
    /// of the graph, adapter included (no reshapes or transposes around the products);
    /// [`Mode::Composed`] composes the adapted layer from plain products.
    pub(super) fn linear_with(
        &self,
        x: &Tensor,
        w: &Tensor,
        module: &str,
        mode: Mode,
    ) -> candle_core::Result<Tensor> {
        match self.adapters.and_then(|ad| ad.map.get(module)) {
            Some((a, b)) => {
                let scale = self.adapters.map(|a| a.scale).unwrap_or(1.0);
                // The rank-r activations are scaled, not the [rows, out] product.
                if mode == Mode::Composed {
                    matmul::linear(x, w)? + matmul::linear(&(matmul::linear(x, a)? * scale)?, b)?
                } else {
                    // One graph node.
                    matmul::lora_linear(x, w, a, b, scale)
                }
            }
            None => matmul::linear(x, w),
        }
    }

    /// `softmax(scale · scores + masks)` with candle ops (`scores`: [b, nkv, rep·t, kt]).
    fn masked_softmax(
        &self,
        scores: Tensor,
        scale: f64,
        mask: Option<&Tensor>,
        rows: Option<&RowPositions>,
        (b, nkv, rep, t, kt): (usize, usize, usize, usize, usize),
        mode: Mode,
    ) -> candle_core::Result<Tensor> {
        let mut att = (scores * scale)?;
        if let Some(m) = mask {
            att = att
                .reshape((b, nkv, rep, t, kt))?
                .broadcast_add(m)?
                .reshape((b, nkv, rep * t, kt))?;
        }
        if let Some(m) = rows.and_then(|r| r.mask.as_ref()) {
            att = att.broadcast_add(&m.reshape((b, 1, 1, kt))?)?;
        }
        softmax(&att, mode)
    }

    pub(super) fn w(&self, name: &str) -> candle_core::Result<&Tensor> {
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
        let out = if last_only {
            Logits::LastOnly
        } else {
            Logits::All
        };
        self.forward_inner(ids, offset, &mut cache, mode, out, None)
            .map_err(be("forward pass"))
    }

    /// Logits for `ids` ([b, t] u32) at positions `0..t`, without a cache, one row per token:
    /// [b·t, V] (row `i·t + j` is batch row `i`, position `j`). The training path: the
    /// logits, the largest tensor of a step, are the product itself, with no reshape (whose
    /// backward pass would cost two more passes over their gradient).
    pub(crate) fn forward_flat(&self, ids: &Tensor, mode: Mode) -> Result<Tensor> {
        self.forward_inner(ids, 0, &mut None, mode, Logits::Flat, None)
            .map_err(be("forward pass"))
    }

    /// One decoding step for rows at different positions: `ids` ([b, 1]) is written to cache
    /// slot `slot`; logits [b, 1, V].
    pub(crate) fn forward_rows(
        &self,
        ids: &Tensor,
        slot: usize,
        rows: &RowPositions,
        cache: &mut KvCache,
        mode: Mode,
    ) -> Result<Tensor> {
        self.forward_inner(ids, slot, &mut Some(cache), mode, Logits::All, Some(rows))
            .map_err(be("decoding step"))
    }

    fn forward_inner(
        &self,
        ids: &Tensor,
        offset: usize,
        cache: &mut Option<&mut KvCache>,
        mode: Mode,
        out: Logits,
        rows: Option<&RowPositions>,
    ) -> candle_core::Result<Tensor> {
        let cfg = self.cfg;
        let (b, t) = ids.dims2()?;
        if rows.is_none() && offset + t > self.rope.max_positions() {
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
        let embed = self.w(EMBED)?;
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
            let q = self.linear(&xn, &format!("{p}.self_attn.q_proj"), mode)?;
            let k = self.linear(&xn, &format!("{p}.self_attn.k_proj"), mode)?;
            let v = self.linear(&xn, &format!("{p}.self_attn.v_proj"), mode)?;
            let q_norm = self.w(&format!("{p}.self_attn.q_norm.weight"))?;
            let k_norm = self.w(&format!("{p}.self_attn.k_norm.weight"))?;
            // [b, heads, t, hd]; the per-head RMSNorm does not care about the layout.
            let (q, k, v) = if mode == Mode::Composed {
                let q = q.reshape((b, t, nh, hd))?;
                let k = k.reshape((b, t, nkv, hd))?;
                (
                    rms_norm(&q, q_norm, eps, mode)?
                        .transpose(1, 2)?
                        .contiguous()?,
                    rms_norm(&k, k_norm, eps, mode)?
                        .transpose(1, 2)?
                        .contiguous()?,
                    v.reshape((b, t, nkv, hd))?.transpose(1, 2)?.contiguous()?,
                )
            } else {
                (
                    rms_norm(&fused::split_heads(&q, nh)?, q_norm, eps, mode)?,
                    rms_norm(&fused::split_heads(&k, nkv)?, k_norm, eps, mode)?,
                    fused::split_heads(&v, nkv)?,
                )
            };
            let (q, k) = match rows {
                Some(r) => (
                    self.rope.apply_rows(&q, &r.positions, mode)?,
                    self.rope.apply_rows(&k, &r.positions, mode)?,
                ),
                None => (
                    self.rope.apply(&q, offset, mode)?,
                    self.rope.apply(&k, offset, mode)?,
                ),
            };
            let (k, v) = match cache.as_deref_mut() {
                Some(c) => c.append(l, &k, &v, offset)?,
                None => (k, v),
            };
            // Grouped-query attention without repeating K/V: the `rep` query heads that
            // share a K/V head are stacked along the query axis ([b, nkv, rep·t, d]).
            let rep = nh / nkv;
            let kt = k.dim(2)?;
            let qg = q.reshape((b, nkv, rep * t, hd))?;
            let fused = mode == Mode::Train && rows.is_none() && qg.device().is_cpu();
            // [b, nkv, rep·t, hd]
            let y = if fused {
                // Products, scale, causal mask and softmax as one node.
                fused::causal_attention(&qg, &k, &v, scale, t, offset)?
            } else {
                let scores = matmul::matmul(&qg, &k.t()?)?;
                let att = self.masked_softmax(
                    scores,
                    scale,
                    mask.as_ref(),
                    rows,
                    (b, nkv, rep, t, kt),
                    mode,
                )?;
                matmul::matmul(&att, &v)?
            };
            let y = if mode == Mode::Composed {
                y.reshape((b, nh, t, hd))?
                    .transpose(1, 2)?
                    .contiguous()?
                    .reshape((b, t, nh * hd))?
            } else {
                fused::merge_heads(&y, t)?
            };
            let y = self.linear(&y, &format!("{p}.self_attn.o_proj"), mode)?;
            x = (residual + y)?;
            let residual = x.clone();
            let xn = rms_norm(
                &x,
                self.w(&format!("{p}.post_attention_layernorm.weight"))?,
                eps,
                mode,
            )?;
            let gate = self.linear(&xn, &format!("{p}.mlp.gate_proj"), mode)?;
            let up = self.linear(&xn, &format!("{p}.mlp.up_proj"), mode)?;
            let act = match mode {
                // One pass each way (falls back to the composed form off the CPU).
                Mode::Train | Mode::Infer => fused::swiglu(&gate, &up)?,
                // candle's silu has a backward pass.
                Mode::Composed => (gate.silu()? * up)?,
            };
            let y = self.linear(&act, &format!("{p}.mlp.down_proj"), mode)?;
            x = (residual + y)?;
        }
        let x = if out == Logits::LastOnly && t > 1 {
            x.narrow(1, t - 1, 1)?
        } else {
            x
        };
        let x = rms_norm(&x, self.w("model.norm.weight")?, eps, mode)?;
        // A tied head is the embedding, or its copy in a decoding layout
        // ([`Weights::decoding_copy`]).
        let head = match self.weights.map.get("lm_head.weight") {
            Some(head) => head,
            None if cfg.tie_word_embeddings => embed,
            None => self.w("lm_head.weight")?,
        };
        match out {
            Logits::Flat => self.linear_with(&x.reshape((b * t, h))?, head, LM_HEAD, mode),
            Logits::All | Logits::LastOnly => self.linear_with(&x, head, LM_HEAD, mode),
        }
    }
}

/// Which logits [`Model::forward_inner`] returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Logits {
    /// Every position's, [b, t, V].
    All,
    /// The last position's, [b, 1, V].
    LastOnly,
    /// Every position's, one row per token: [b·t, V].
    Flat,
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Var;

    /// The samplers' weight layout gives the same logits up to float reassociation (the
    /// kernels take other paths for the other layout; relative error ≤ 1e-5) for a prefill
    /// and a cached decoding step, on a tied and an untied model; its projections are
    /// stored transposed, and a tied head gets its own transposed copy.
    #[test]
    fn the_decoding_layout_gives_the_same_logits() {
        let dev = Device::Cpu;
        for tied in [false, true] {
            let cfg = Qwen3Config::new(53, 32, 48, 2, 4, 2, 8, 64).with_tied_embeddings(tied);
            let rope = Rope::new(&cfg, &dev).unwrap();
            let weights = Weights::random(&cfg, 5, &dev).unwrap();
            let decoding = weights.decoding_copy(&cfg).unwrap();
            let q = decoding.map["model.layers.0.self_attn.q_proj.weight"].clone();
            assert_eq!(q.dims(), [32, 32]);
            assert_eq!(q.layout().stride(), [1, 32], "stored transposed");
            assert!(decoding.map.contains_key("lm_head.weight"), "tied: {tied}");
            assert_eq!(decoding.map["lm_head.weight"].layout().stride(), [1, 53]);
            let embed = &decoding.map["model.embed_tokens.weight"];
            assert_eq!(
                embed.layout().stride(),
                [32, 1],
                "the embedding keeps its rows"
            );
            let logits = |w: &Weights| {
                let model = Model {
                    cfg: &cfg,
                    weights: w,
                    adapters: None,
                    rope: &rope,
                };
                let ids = Tensor::new(&[[3u32, 9, 27, 4, 50], [1, 2, 3, 4, 5]], &dev).unwrap();
                let mut cache = KvCache::new(cfg.num_hidden_layers, 8);
                let prefill = model
                    .forward(&ids, 0, Some(&mut cache), Mode::Infer, false)
                    .unwrap();
                let next = Tensor::new(&[[7u32], [11]], &dev).unwrap();
                let step = model
                    .forward(&next, 5, Some(&mut cache), Mode::Infer, true)
                    .unwrap();
                let flat = |t: Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
                (flat(prefill), flat(step))
            };
            let ((p0, s0), (p1, s1)) = (logits(&weights), logits(&decoding));
            for (a, b) in [(p0, p1), (s0, s1)] {
                assert_eq!(a.len(), b.len());
                let scale = a.iter().fold(0f32, |m, x| m.max(x.abs()));
                let err = a
                    .iter()
                    .zip(&b)
                    .fold(0f32, |m, (x, y)| m.max((x - y).abs()));
                assert!(err <= 1e-5 * scale, "tied: {tied}: {err} of {scale}");
            }
        }
    }

    /// Every parameter's gradient (full fine-tuning weights, and LoRA adapters on a frozen
    /// base) through the training path equals the composed reference's (relative error of
    /// each tensor, max-norm, ≤ 1e-4), on random weights and inputs.
    #[test]
    fn fused_training_path_gradients_equal_the_composed_path() {
        let dev = Device::Cpu;
        let cfg = Qwen3Config::new(37, 32, 48, 2, 4, 2, 8, 64).with_tied_embeddings(false);
        let rope = Rope::new(&cfg, &dev).unwrap();
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let (b, t) = (3, 11);
        let ids: Vec<u32> = (0..b * t).map(|_| rng.random_range(0..37u32)).collect();
        let ids = Tensor::from_vec(ids, (b, t), &dev).unwrap();
        let target =
            Tensor::from_vec(normal_vec(&mut rng, b * t * 37, 1.0), (b, t, 37), &dev).unwrap();
        let max_rel = |a: &Tensor, r: &Tensor| {
            let d = (a - r).unwrap().abs().unwrap().max_all().unwrap();
            let s = r.abs().unwrap().max_all().unwrap();
            d.to_scalar::<f32>().unwrap() / s.to_scalar::<f32>().unwrap().max(1e-30)
        };
        let base = Weights::random(&cfg, 3, &dev).unwrap();
        // Full fine-tuning: every weight a variable; then LoRA on every projection.
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
        for (name, shape) in weight_shapes(&cfg) {
            if shape.len() != 2 || name == "model.embed_tokens.weight" {
                continue;
            }
            let module = name.trim_end_matches(".weight").to_string();
            let a = Var::from_vec(normal_vec(&mut rng, 4 * shape[1], 0.3), (4, shape[1]), &dev)
                .unwrap();
            let bm = Var::from_vec(normal_vec(&mut rng, shape[0] * 4, 0.3), (shape[0], 4), &dev)
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
            let model = Model {
                cfg: &cfg,
                weights,
                adapters,
                rope: &rope,
            };
            let grads = |mode| {
                let logits = model.forward(&ids, 0, None, mode, false).unwrap();
                let loss = (logits * &target).unwrap().sum_all().unwrap();
                loss.backward().unwrap()
            };
            let (g1, g2) = (grads(Mode::Train), grads(Mode::Composed));
            assert!(!params.is_empty());
            for (name, v) in &params {
                let a = g1
                    .get(v.as_tensor())
                    .unwrap_or_else(|| panic!("{name}: no gradient"));
                let r = g2
                    .get(v.as_tensor())
                    .unwrap_or_else(|| panic!("{name}: no reference"));
                let e = max_rel(a, r);
                assert!(e <= 1e-4, "{name}: relative error {e}");
            }
        }
    }

    /// The training path's flat logits are the same values as `forward`'s, one row per token.
    #[test]
    fn flat_logits_are_forward_logits_one_row_per_token() {
        let dev = Device::Cpu;
        let cfg = Qwen3Config::new(29, 32, 48, 2, 4, 2, 8, 64);
        let rope = Rope::new(&cfg, &dev).unwrap();
        let weights = Weights::random(&cfg, 5, &dev).unwrap();
        let model = Model {
            cfg: &cfg,
            weights: &weights,
            adapters: None,
            rope: &rope,
        };
        let ids: Vec<u32> = (0..2 * 9).map(|i| (i * 7 + 1) % 29).collect();
        let ids = Tensor::from_vec(ids, (2, 9), &dev).unwrap();
        for mode in [Mode::Train, Mode::Infer] {
            let flat = model.forward_flat(&ids, mode).unwrap();
            let all = model.forward(&ids, 0, None, mode, false).unwrap();
            assert_eq!(flat.dims(), [18, 29]);
            let a: Vec<f32> = flat.flatten_all().unwrap().to_vec1().unwrap();
            let b: Vec<f32> = all.flatten_all().unwrap().to_vec1().unwrap();
            assert_eq!(a, b, "{mode:?}");
        }
    }
}
