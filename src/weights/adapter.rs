//! LoRA adapters as the exporters take them: Tinker's download format, or a checkpoint of
//! rlvr's local backend, both read into Tinker's naming.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::tensors::{OwnedTensor, read_all, weights_error};
use crate::error::{Error, Result};

/// The tensors file of an adapter directory (Tinker's download and PEFT's format alike).
pub const ADAPTER_WEIGHTS: &str = "adapter_model.safetensors";
/// The config file of an adapter directory.
pub const ADAPTER_CONFIG: &str = "adapter_config.json";

/// The LoRA `alpha` of the local backend's adapters (scale `alpha / rank`).
const LOCAL_LORA_ALPHA: u32 = 32;

/// A LoRA adapter in Tinker's naming: `base_model.model.<module>.lora_A.weight` ([rank, in])
/// and `….lora_B.weight` ([out, rank]) for each adapted linear layer of the text model, the
/// output head as `base_model.model.model.unembed_tokens` (Tinker) or
/// `base_model.model.lm_head` (the local backend, whose head adapter never touches the input
/// embeddings), with `lora_alpha` and `r` from its config.
///
/// Read it from a directory with [`LoraAdapter::load`]; [`build_lora_adapter`] and
/// [`build_hf_model`] take the directory.
///
/// [`build_lora_adapter`]: super::build_lora_adapter
/// [`build_hf_model`]: super::build_hf_model
#[derive(Debug, Clone)]
pub struct LoraAdapter {
    pub(crate) tensors: BTreeMap<String, OwnedTensor>,
    pub(crate) alpha: serde_json::Number,
    pub(crate) rank: serde_json::Number,
    /// peft's rsLoRA: the product is scaled by `alpha / sqrt(r)`.
    pub(crate) rslora: bool,
    pub(crate) source: PathBuf,
}

impl LoraAdapter {
    /// Reads an adapter directory: Tinker's (`adapter_model.safetensors` +
    /// `adapter_config.json` with `lora_alpha` and `r`, as `weights.download` leaves it), or a
    /// LoRA checkpoint of the local backend (`meta.json` + `params.safetensors`, alpha 32).
    ///
    /// ```
    /// # fn main() -> rlvr::Result<()> {
    /// let dir = tempfile::tempdir().unwrap();
    /// let err = rlvr::weights::LoraAdapter::load(dir.path()).unwrap_err();
    /// assert!(err.to_string().contains("adapter_model.safetensors"), "{err}");
    /// # Ok(()) }
    /// ```
    pub fn load(dir: impl AsRef<Path>) -> Result<LoraAdapter> {
        let dir = dir.as_ref();
        let meta = dir.join("meta.json");
        if meta.is_file() && !dir.join(ADAPTER_WEIGHTS).exists() {
            return load_local(dir, &meta);
        }
        let weights = dir.join(ADAPTER_WEIGHTS);
        if !weights.is_file() {
            return Err(weights_error(
                dir,
                format!(
                    "not an adapter directory: no {ADAPTER_WEIGHTS} (a Tinker adapter) and no \
                     meta.json (a local-backend checkpoint)"
                ),
            ));
        }
        let config_path = dir.join(ADAPTER_CONFIG);
        let config = read_json(&config_path)?;
        let number = |key: &str| -> Result<serde_json::Number> {
            match config.get(key) {
                Some(serde_json::Value::Number(n)) => Ok(n.clone()),
                Some(other) => Err(weights_error(
                    &config_path,
                    format!("`{key}` must be a number, got {other}"),
                )),
                None => Err(weights_error(
                    &config_path,
                    format!("adapter config missing required key: `{key}`"),
                )),
            }
        };
        let alpha = number("lora_alpha")?;
        let rank = number("r")?;
        // peft options that change what the tensors mean, and that no exporter here
        // reproduces: refused rather than misread.
        let set = |key: &str| match config.get(key) {
            None | Some(serde_json::Value::Null) | Some(serde_json::Value::Bool(false)) => false,
            Some(serde_json::Value::Object(o)) => !o.is_empty(),
            Some(serde_json::Value::String(s)) => s != "none",
            Some(_) => true,
        };
        for key in [
            "use_dora",
            "fan_in_fan_out",
            "rank_pattern",
            "alpha_pattern",
            "lora_bias",
            "bias",
            "use_qalora",
        ] {
            if set(key) {
                return Err(Error::Unsupported(format!(
                    "{}: `{key}` = {}: only plain LoRA adapters (one rank and alpha, no DoRA, \
                     no bias, weights stored [out, in]) are read",
                    config_path.display(),
                    config[key]
                )));
            }
        }
        let adapter = LoraAdapter {
            tensors: read_all(&weights)?,
            alpha,
            rank,
            rslora: config.get("use_rslora").and_then(|v| v.as_bool()) == Some(true),
            source: dir.to_path_buf(),
        };
        adapter.check()?;
        Ok(adapter)
    }

    /// The scale of `B A`: `lora_alpha / r` (`lora_alpha / sqrt(r)` for a peft adapter with
    /// `use_rslora`).
    pub fn scaling(&self) -> f64 {
        let (a, r) = (
            self.alpha.as_f64().unwrap_or(f64::NAN),
            self.rank.as_f64().unwrap_or(f64::NAN),
        );
        if self.rslora { a / r.sqrt() } else { a / r }
    }

    /// The rank `r`.
    pub fn rank(&self) -> usize {
        self.rank.as_u64().unwrap_or(0) as usize
    }

    /// The adapted weights (model weight names as the adapter spells them, `….weight`), each
    /// with its `lora_A` and `lora_B` tensor names, in name order.
    pub(crate) fn pairs(&self) -> Vec<(String, String, String)> {
        self.tensors
            .keys()
            .filter(|k| k.contains(".lora_A"))
            .map(|k| {
                let n = k.replace(".lora_A", "");
                let a = n.replace(".weight", ".lora_A.weight");
                let b = n.replace(".weight", ".lora_B.weight");
                (n, a, b)
            })
            .collect()
    }

    pub(crate) fn tensor(&self, name: &str) -> Result<&OwnedTensor> {
        self.tensors.get(name).ok_or_else(|| {
            weights_error(&self.source, format!("adapter tensor `{name}` is missing"))
        })
    }

    fn check(&self) -> Result<()> {
        if self.rank.as_u64().unwrap_or(0) == 0 {
            return Err(weights_error(
                &self.source,
                format!(
                    "adapter rank `r` must be a positive integer, got {}",
                    self.rank
                ),
            ));
        }
        for (n, a, b) in self.pairs() {
            let (ta, tb) = (self.tensor(&a)?, self.tensor(&b)?);
            let ok = match (ta.shape.as_slice(), tb.shape.as_slice()) {
                ([ra, _], [_, rb]) => ra == rb && *ra == self.rank(),
                ([ea, ra, _], [eb, _, rb]) => ra == rb && (ea == eb || *ea == 1 || *eb == 1),
                _ => false,
            };
            if !ok {
                return Err(weights_error(
                    &self.source,
                    format!(
                        "`{n}`: lora_A {:?} and lora_B {:?} are not a LoRA pair of rank {} \
                         ([r, in] and [out, r])",
                        ta.shape, tb.shape, self.rank
                    ),
                ));
            }
        }
        Ok(())
    }
}

fn read_json(path: &Path) -> Result<serde_json::Value> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::io("reading", path, e))?;
    serde_json::from_str(&text).map_err(|e| Error::data_line(path, e.line(), e.to_string()))
}

/// A LoRA checkpoint of the local backend: `params.safetensors` holds
/// `<module>.lora_A` / `<module>.lora_B` with the model's own module names (`lm_head` for
/// the output head).
fn load_local(dir: &Path, meta_path: &Path) -> Result<LoraAdapter> {
    let meta = read_json(meta_path)?;
    match meta.get("mode").and_then(|m| m.as_str()) {
        Some("lora") => {}
        Some("full") => {
            return Err(weights_error(
                dir,
                "a full fine-tuning checkpoint has no adapter; export it with \
                 `rlvr::weights::export_full_checkpoint`",
            ));
        }
        other => {
            return Err(weights_error(
                meta_path,
                format!("`mode` must be \"lora\" or \"full\", got {other:?}"),
            ));
        }
    }
    let rank = meta
        .get("lora_config")
        .and_then(|c| c.get("rank"))
        .and_then(|r| r.as_u64())
        .ok_or_else(|| weights_error(meta_path, "`lora_config.rank` is missing"))?;
    let params = read_all(&dir.join("params.safetensors"))?;
    let mut tensors = BTreeMap::new();
    for (name, t) in params {
        let Some((module, which)) = name.rsplit_once('.') else {
            continue;
        };
        if which != "lora_A" && which != "lora_B" {
            continue;
        }
        tensors.insert(format!("base_model.model.{module}.{which}.weight"), t);
    }
    let adapter = LoraAdapter {
        tensors,
        alpha: LOCAL_LORA_ALPHA.into(),
        rank: rank.into(),
        rslora: false,
        source: dir.to_path_buf(),
    };
    adapter.check()?;
    Ok(adapter)
}
