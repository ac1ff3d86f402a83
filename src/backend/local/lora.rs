//! LoRA adapters (Tinker's `lora_config`) over a frozen Qwen3 base.
//!
//! For a linear layer `W` ([out, in]) the adapter adds `(alpha / rank) · B A` with `A` ([rank,
//! in]) drawn uniformly in ±1/√in from a seeded ChaCha stream (PEFT's Kaiming-uniform bound)
//! and `B` ([out, rank]) zero, so the initial policy equals the base. `alpha` is 32, the value
//! PEFT examples and Tinker use, so the effective scale is `32 / rank`.

use std::collections::HashMap;

use candle_core::{DType, Device, Tensor, Var};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::config::Qwen3Config;
use super::model::{ATTN_PROJ, Adapters, LM_HEAD, MLP_PROJ, be};
use crate::error::{Error, Result};
use crate::types::LoraConfig;

/// LoRA `alpha`; the adapter output is scaled by `alpha / rank`.
pub const LORA_ALPHA: f64 = 32.0;

/// The seed used when `LoraConfig::seed` is `None`.
pub(crate) const DEFAULT_LORA_SEED: u64 = 0;

/// The modules a `LoraConfig` adapts, with their (out, in) sizes, in a fixed order.
pub(crate) fn adapted_modules(cfg: &Qwen3Config, lora: &LoraConfig) -> Vec<(String, usize, usize)> {
    let h = cfg.hidden_size;
    let q = cfg.num_attention_heads * cfg.head_dim();
    let kv = cfg.num_key_value_heads * cfg.head_dim();
    let i = cfg.intermediate_size;
    let mut v = Vec::new();
    for l in 0..cfg.num_hidden_layers {
        if lora.train_attn {
            let sizes = [(q, h), (kv, h), (kv, h), (h, q)];
            for (name, (o, n)) in ATTN_PROJ.iter().zip(sizes) {
                v.push((format!("model.layers.{l}.{name}"), o, n));
            }
        }
        if lora.train_mlp {
            let sizes = [(i, h), (i, h), (h, i)];
            for (name, (o, n)) in MLP_PROJ.iter().zip(sizes) {
                v.push((format!("model.layers.{l}.{name}"), o, n));
            }
        }
    }
    if lora.train_unembed {
        v.push((LM_HEAD.to_string(), cfg.vocab_size, h));
    }
    v
}

/// Fresh trainable adapters: the `Var`s by name (`<module>.lora_A`, `<module>.lora_B`) and
/// the [`Adapters`] view over them.
pub(crate) fn init_adapters(
    cfg: &Qwen3Config,
    lora: &LoraConfig,
    device: &Device,
) -> Result<(Vec<(String, Var)>, Adapters)> {
    if lora.rank == 0 {
        return Err(Error::config("lora_config.rank", "must be positive"));
    }
    let modules = adapted_modules(cfg, lora);
    if modules.is_empty() {
        return Err(Error::config(
            "lora_config",
            "train_attn, train_mlp and train_unembed are all false: nothing to train",
        ));
    }
    let r = lora.rank as usize;
    let mut rng = ChaCha8Rng::seed_from_u64(lora.seed.unwrap_or(DEFAULT_LORA_SEED));
    let mut vars = Vec::new();
    let mut map = HashMap::new();
    for (module, out, inp) in modules {
        let bound = 1.0 / (inp as f32).sqrt();
        let a: Vec<f32> = (0..r * inp)
            .map(|_| rng.random_range(-bound..bound))
            .collect();
        let a = Var::from_tensor(&Tensor::from_vec(a, (r, inp), device).map_err(be("lora init"))?)
            .map_err(be("lora init"))?;
        let b = Var::zeros((out, r), DType::F32, device).map_err(be("lora init"))?;
        map.insert(
            module.clone(),
            (a.as_tensor().clone(), b.as_tensor().clone()),
        );
        vars.push((format!("{module}.lora_A"), a));
        vars.push((format!("{module}.lora_B"), b));
    }
    Ok((
        vars,
        Adapters {
            scale: LORA_ALPHA / r as f64,
            map,
        },
    ))
}

/// What [`adapters_from`] makes: the LoRA configuration, the trainable variables by name,
/// and the adapters' view over them.
pub(crate) type LoadedAdapters = (LoraConfig, Vec<(String, Var)>, Adapters);

/// The local backend's module name for an adapted weight of `adapter` (`n` as
/// [`LoraAdapter`] names it, `base_model.model.<module>.weight`): Tinker's
/// `model.unembed_tokens` and PEFT's `lm_head` are the output head.
fn local_module(n: &str) -> &str {
    let m = n.strip_prefix("base_model.model.").unwrap_or(n);
    let m = m.strip_suffix(".weight").unwrap_or(m);
    if m == "model.unembed_tokens" {
        LM_HEAD
    } else {
        m
    }
}

/// Adapters that start from `adapter` (a PEFT adapter — rlvr's or peft's —, Tinker's
/// download format, or a local LoRA checkpoint): the [`LoraConfig`] its modules and rank
/// make (`seed` for the modules it lacks, which start as fresh adapters with `B = 0`), and
/// the adapters with its `A` and `B`, `B` rescaled from the adapter's scale to this backend's
/// `32 / rank`. `base` holds the base model's weights, to check the full tensors peft saves
/// beside a tied output head (`…lm_head.base_layer.weight`) against.
pub(crate) fn adapters_from(
    cfg: &Qwen3Config,
    adapter: &crate::weights::LoraAdapter,
    seed: Option<u64>,
    base: &dyn Fn(&str) -> Option<Tensor>,
    device: &Device,
) -> Result<LoadedAdapters> {
    let source = adapter.source.display().to_string();
    let unsupported = |m: String| Error::Unsupported(format!("{source}: {m}"));
    let pairs = adapter.pairs();
    let modules: Vec<(&str, &str, &str)> = pairs
        .iter()
        .map(|(n, a, b)| (local_module(n), a.as_str(), b.as_str()))
        .collect();
    let is_attn = |m: &str| ATTN_PROJ.iter().any(|p| m.ends_with(p));
    let is_mlp = |m: &str| MLP_PROJ.iter().any(|p| m.ends_with(p));
    let rank = adapter.rank();
    let lora = LoraConfig {
        rank: u32::try_from(rank).map_err(|_| unsupported(format!("rank {rank}")))?,
        seed,
        train_attn: modules.iter().any(|(m, _, _)| is_attn(m)),
        train_mlp: modules.iter().any(|(m, _, _)| is_mlp(m)),
        train_unembed: modules.iter().any(|(m, _, _)| *m == LM_HEAD),
    };
    let (vars, adapters) = init_adapters(cfg, &lora, device)?;
    let shapes: HashMap<String, (usize, usize)> = adapted_modules(cfg, &lora)
        .into_iter()
        .map(|(m, o, i)| (m, (o, i)))
        .collect();
    // From the adapter's scale to ours: B_ours = B · scale_adapter / scale_ours.
    let factor = adapter.scaling() / adapters.scale;
    let var = |name: String| {
        vars.iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v)
            .ok_or_else(|| Error::Backend(format!("no adapter variable `{name}`")))
    };
    for (module, a_key, b_key) in &modules {
        let Some(&(out, inp)) = shapes.get(*module) else {
            return Err(unsupported(format!(
                "adapted module `{module}` is not a linear layer of this Qwen3 model \
                 (the local backend adapts q/k/v/o_proj, gate/up/down_proj and lm_head)"
            )));
        };
        let load = |key: &str, shape: (usize, usize), scale: f64| -> Result<Tensor> {
            let t = adapter.tensor(key)?;
            if t.shape != [shape.0, shape.1] {
                return Err(Error::Weights {
                    path: adapter.source.clone(),
                    message: format!(
                        "`{key}` has shape {:?}, the model's `{module}` needs {:?}",
                        t.shape,
                        [shape.0, shape.1]
                    ),
                });
            }
            let v = crate::weights::tensors::to_f32(&adapter.source, key, t.dtype, &t.data)?;
            let v: Vec<f32> = v.into_iter().map(|x| (x as f64 * scale) as f32).collect();
            Tensor::from_vec(v, shape, device).map_err(be("loading the adapter"))
        };
        let a = load(a_key, (rank, inp), 1.0)?;
        let b = load(b_key, (out, rank), factor)?;
        var(format!("{module}.lora_A"))?
            .set(&a)
            .map_err(be("loading the adapter"))?;
        var(format!("{module}.lora_B"))?
            .set(&b)
            .map_err(be("loading the adapter"))?;
    }
    // Full tensors peft saved beside the pairs (`save_embedding_layers`, `modules_to_save`):
    // only the base model's own values are accepted, since they are not adapters.
    for (key, t) in &adapter.tensors {
        if key.contains(".lora_A") || key.contains(".lora_B") {
            continue;
        }
        let name = key
            .strip_prefix("base_model.model.")
            .unwrap_or(key)
            .replace(".base_layer.", ".");
        let same = base(&name).is_some_and(|w| {
            let v = crate::weights::tensors::to_f32(&adapter.source, key, t.dtype, &t.data);
            match (v, w.flatten_all().and_then(|w| w.to_vec1::<f32>())) {
                (Ok(v), Ok(w)) => v == w,
                _ => false,
            }
        });
        if !same {
            return Err(unsupported(format!(
                "`{key}` is a full tensor, not a LoRA pair, and differs from the base model's \
                 `{name}`; only adapters over an unchanged base are loaded"
            )));
        }
    }
    Ok((lora, vars, adapters))
}
