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
use super::model::{be, Adapters, ATTN_PROJ, LM_HEAD, MLP_PROJ};
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
