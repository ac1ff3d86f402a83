//! Trained weights out of rlvr: a LoRA adapter as a PEFT adapter directory
//! ([`build_lora_adapter`]), merged into its base model as a Hugging Face model directory
//! ([`build_hf_model`]), and a full fine-tuning checkpoint of the local backend as a model
//! directory ([`export_full_checkpoint`]).
//!
//! The first two reproduce tinker-cookbook 0.6.1's `weights.build_lora_adapter` and
//! `weights.build_hf_model` (its default shard-by-shard strategy) for Qwen3-style dense
//! models and Qwen3.5 dense models: the same key names, shapes, dtypes, `adapter_config.json`,
//! output shard names and index, and the same merged values — `W + (alpha/r) · B A`, computed
//! in f32 as PyTorch does (the scaled `B` rounded to f32, the product accumulated with fused
//! multiply-adds in rank order, the sum rounded back to the weight's dtype). An adapter is read
//! from Tinker's download format or from a LoRA checkpoint of the local backend
//! ([`LoraAdapter::load`]).
//!
//! Every output is written into a hidden temporary directory beside `output_path` and renamed
//! into place when complete: a failure or a kill leaves no directory that looks finished. The
//! merge maps one input shard at a time, so its memory is that of the largest shard.
//!
//! ```
//! # fn main() -> rlvr::Result<()> {
//! let dir = tempfile::tempdir().unwrap();
//! let out = dir.path().join("peft");
//! // No base model there: a typed error naming the directory, and no output.
//! let err = rlvr::weights::build_lora_adapter(dir.path(), dir.path(), &out).unwrap_err();
//! assert!(matches!(err, rlvr::Error::Weights { .. }), "{err}");
//! assert!(!out.exists());
//! # Ok(()) }
//! ```

mod adapter;
pub(crate) mod tensors;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use safetensors::tensor::Dtype;

pub use adapter::{ADAPTER_CONFIG, ADAPTER_WEIGHTS, LoraAdapter};
use tensors::{Mapped, Out, OwnedTensor, from_f32, header_shapes, to_f32, weights_error};

use crate::error::{Error, Result};

/// The largest output shard, as the cookbook's `ShardWriter` cuts them (10 GiB).
const MAX_SHARD_BYTES: usize = 10 * (1 << 30);

/// Writes `adapter_path`'s LoRA adapter as a PEFT adapter directory at `output_path`
/// (`adapter_model.safetensors` + `adapter_config.json`), the form vLLM (`--lora-modules`),
/// SGLang and `peft.PeftModel.from_pretrained` load on the base model. `base_model` is the
/// base model's Hugging Face directory (its `config.json` and safetensors headers decide the
/// key names); its path is written as `base_model_name_or_path`.
///
/// Equal to tinker-cookbook 0.6.1's `weights.build_lora_adapter` for Qwen3-style dense and
/// Qwen3.5 dense models: `base_model.model.` + the model's parameter name for every adapted
/// layer, Tinker's `unembed_tokens` as `lm_head` (or `embed_tokens` where the embeddings are
/// tied), Qwen3.5's split `in_proj_q/k/v` kept split; tensors unchanged.
///
/// Errors ([`Error::Weights`], naming the file): `output_path` exists, the adapter or base
/// model is missing or malformed, the model family is one rlvr does not convert (MoE
/// experts, GPT-OSS, DeepSeek, Nemotron, Kimi: use the cookbook).
pub fn build_lora_adapter(
    base_model: impl AsRef<Path>,
    adapter_path: impl AsRef<Path>,
    output_path: impl AsRef<Path>,
) -> Result<()> {
    let (base_dir, out) = (base_model.as_ref(), output_path.as_ref());
    let (adapter, base, profile) = open_inputs(base_dir, adapter_path.as_ref(), out)?;
    let remaps = profile.name_remaps(&base);
    let mut peft: BTreeMap<String, &OwnedTensor> = BTreeMap::new();
    let mut target_modules = BTreeSet::new();
    for (n, a, b) in adapter.pairs() {
        refuse_experts(&adapter, &n)?;
        let target = remap(&n, &remaps);
        let module = target.strip_suffix(".weight").unwrap_or(&target);
        let key_a = format!("base_model.model.{module}.lora_A.weight");
        let key_b = format!("base_model.model.{module}.lora_B.weight");
        if peft.contains_key(&key_a) {
            return Err(weights_error(
                &adapter.source,
                format!(
                    "Duplicate PEFT key: `{key_a}`: two adapter weights map to the same target"
                ),
            ));
        }
        peft.insert(key_a, adapter.tensor(&a)?);
        peft.insert(key_b, adapter.tensor(&b)?);
        target_modules.insert(module.rsplit('.').next().unwrap_or(module).to_string());
    }
    if peft.is_empty() {
        return Err(weights_error(
            &adapter.source,
            "No LoRA weights found in adapter (no `.lora_A` tensors)",
        ));
    }
    let config = serde_json::json!({
        "peft_type": "LORA",
        "auto_mapping": null,
        "base_model_name_or_path": base_dir.to_string_lossy(),
        "bias": "none",
        "fan_in_fan_out": false,
        "inference_mode": true,
        "init_lora_weights": true,
        "lora_alpha": adapter.alpha,
        "lora_dropout": 0.0,
        "modules_to_save": null,
        "r": adapter.rank,
        "rank_pattern": {},
        "alpha_pattern": {},
        "target_modules": target_modules,
        "task_type": "CAUSAL_LM",
    });
    crate::fsio::write_dir_atomically(out, |tmp| {
        tensors::write(&tmp.join(ADAPTER_WEIGHTS), peft)?;
        write_json(&tmp.join(ADAPTER_CONFIG), &config, true)
    })
}

/// Merges `adapter_path`'s LoRA adapter into the base model at `base_model` (a Hugging Face
/// directory) and writes the merged model directory at `output_path`: the weights (one output
/// shard per input shard, `model.safetensors` or `model-0000i-of-0000n.safetensors` with
/// `model.safetensors.index.json`, each tensor in its base dtype), `config.json`, the
/// tokenizer and processor files and any `*.py` model code, copied from the base. Loads with
/// `AutoModelForCausalLM.from_pretrained` and serves as any model does.
///
/// Equal, tensor for tensor, to tinker-cookbook 0.6.1's `weights.build_hf_model` (default
/// strategy) for Qwen3-style dense and Qwen3.5 dense models (Qwen3.5's split `in_proj_q/k/v`
/// adapters merge into row slices of the fused `in_proj_qkv`). A local-backend adapter of the
/// output head on a model with tied embeddings unties them (`lm_head.weight` is written and
/// `tie_word_embeddings` set to false), as the local backend trained it.
///
/// Errors as [`build_lora_adapter`], and an adapter weight without a matching model weight or
/// with the wrong shape.
pub fn build_hf_model(
    base_model: impl AsRef<Path>,
    adapter_path: impl AsRef<Path>,
    output_path: impl AsRef<Path>,
) -> Result<()> {
    let (base_dir, out) = (base_model.as_ref(), output_path.as_ref());
    let (adapter, base, profile) = open_inputs(base_dir, adapter_path.as_ref(), out)?;
    let plan = plan_merge(&adapter, &base, &profile)?;
    crate::fsio::write_dir_atomically(out, |tmp| write_merged(&base, plan, tmp))
}

/// Writes a full fine-tuning checkpoint of the local backend (`meta.json` with `"mode":
/// "full"`, `params.safetensors`) as a Hugging Face model directory at `output_path`: the base
/// model's files (as [`build_hf_model`] copies them) with every trained tensor in place of the
/// base one (f32, the dtype it was trained in).
///
/// Errors ([`Error::Weights`]): `output_path` exists, the checkpoint is a LoRA one (use
/// [`build_hf_model`]), a trained tensor has no counterpart in the base model or another
/// shape.
pub fn export_full_checkpoint(
    checkpoint: impl AsRef<Path>,
    base_model: impl AsRef<Path>,
    output_path: impl AsRef<Path>,
) -> Result<()> {
    let (ckpt, out) = (checkpoint.as_ref(), output_path.as_ref());
    refuse_existing(out)?;
    let meta_path = ckpt.join("meta.json");
    let text =
        std::fs::read_to_string(&meta_path).map_err(|e| Error::io("reading", &meta_path, e))?;
    let meta: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| Error::data_line(&meta_path, e.line(), e.to_string()))?;
    if meta.get("mode").and_then(|m| m.as_str()) != Some("full") {
        return Err(weights_error(
            ckpt,
            "not a full fine-tuning checkpoint (`mode` is not \"full\"); a LoRA checkpoint \
             exports with `build_lora_adapter` or `build_hf_model`",
        ));
    }
    let base = BaseModel::open(base_model.as_ref())?;
    let params = tensors::read_all(&ckpt.join("params.safetensors"))?;
    let mut plan = MergePlan::default();
    for (name, t) in params {
        match base.shapes.get(&name) {
            Some(shape) if *shape == t.shape => {
                plan.replace.insert(name, t);
            }
            Some(shape) => {
                return Err(weights_error(
                    ckpt,
                    format!(
                        "trained tensor `{name}` has shape {:?}, the base model's {shape:?}",
                        t.shape
                    ),
                ));
            }
            None if name == "lm_head.weight" && base.tied_embeddings() => {
                let embed = base.embed_key().ok_or_else(|| {
                    weights_error(&base.dir, "tied embeddings but no `embed_tokens` weight")
                })?;
                plan.untie = Some(embed);
                plan.replace.insert(name, t);
            }
            None => {
                return Err(weights_error(
                    ckpt,
                    format!("trained tensor `{name}` is not in the base model"),
                ));
            }
        }
    }
    crate::fsio::write_dir_atomically(out, |tmp| write_merged(&base, plan, tmp))
}

/// The checks and inputs both builders start from: `out` must not exist; the adapter, the
/// base model and its family.
fn open_inputs(
    base: &Path,
    adapter: &Path,
    out: &Path,
) -> Result<(LoraAdapter, BaseModel, Profile)> {
    refuse_existing(out)?;
    let adapter = LoraAdapter::load(adapter)?;
    let base = BaseModel::open(base)?;
    let profile = Profile::detect(&base)?;
    Ok((adapter, base, profile))
}

fn refuse_existing(out: &Path) -> Result<()> {
    if out.exists() {
        return Err(weights_error(out, "output path already exists"));
    }
    Ok(())
}

fn refuse_experts(adapter: &LoraAdapter, name: &str) -> Result<()> {
    if name.contains(".experts") {
        return Err(Error::Unsupported(format!(
            "{}: `{name}` is a mixture-of-experts adapter; rlvr exports dense models only \
             (tinker-cookbook's `weights` module converts MoE adapters)",
            adapter.source.display()
        )));
    }
    Ok(())
}

fn write_json(path: &Path, value: &serde_json::Value, newline: bool) -> Result<()> {
    let mut text = serde_json::to_string_pretty(value)
        .map_err(|e| weights_error(path, format!("serializing: {e}")))?;
    if newline {
        text.push('\n');
    }
    std::fs::write(path, text).map_err(|e| Error::io("writing", path, e))
}

/// A base model directory: its config and every weight's shape (from the safetensors
/// headers), and its shard files in the order the merge reads them.
struct BaseModel {
    dir: PathBuf,
    config: serde_json::Value,
    shapes: BTreeMap<String, Vec<usize>>,
    shards: Vec<String>,
}

impl BaseModel {
    fn open(dir: &Path) -> Result<BaseModel> {
        let config_path = dir.join("config.json");
        if !config_path.is_file() {
            return Err(weights_error(
                dir,
                "no config.json: not a Hugging Face model directory",
            ));
        }
        let text = std::fs::read_to_string(&config_path)
            .map_err(|e| Error::io("reading", &config_path, e))?;
        let config: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| Error::data_line(&config_path, e.line(), e.to_string()))?;
        let mut files: Vec<String> = std::fs::read_dir(dir)
            .map_err(|e| Error::io("listing", dir, e))?
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".safetensors"))
            .collect();
        files.sort();
        if files.is_empty() {
            return Err(weights_error(dir, "no .safetensors files found"));
        }
        let mut shapes = BTreeMap::new();
        for f in &files {
            shapes.extend(header_shapes(&dir.join(f))?);
        }
        let index = dir.join("model.safetensors.index.json");
        let shards = if index.is_file() {
            let text =
                std::fs::read_to_string(&index).map_err(|e| Error::io("reading", &index, e))?;
            let v: serde_json::Value = serde_json::from_str(&text)
                .map_err(|e| Error::data_line(&index, e.line(), e.to_string()))?;
            let map = v
                .get("weight_map")
                .and_then(|m| m.as_object())
                .ok_or_else(|| weights_error(&index, "no `weight_map` object"))?;
            let set: BTreeSet<String> = map
                .values()
                .filter_map(|s| s.as_str().map(str::to_string))
                .collect();
            for s in &set {
                if s.contains(['/', '\\']) || s.starts_with('.') {
                    return Err(weights_error(&index, format!("unsafe shard name `{s}`")));
                }
            }
            set.into_iter().collect()
        } else {
            files
        };
        Ok(BaseModel {
            dir: dir.to_path_buf(),
            config,
            shapes,
            shards,
        })
    }

    fn has_lm_prefix(&self) -> bool {
        self.shapes
            .keys()
            .any(|k| k.starts_with("model.language_model."))
    }

    fn tied_embeddings(&self) -> bool {
        let tied = |c: &serde_json::Value| c.get("tie_word_embeddings").and_then(|t| t.as_bool());
        tied(&self.config)
            .or_else(|| self.config.get("text_config").and_then(tied))
            .unwrap_or(false)
    }

    fn embed_key(&self) -> Option<String> {
        [
            "model.embed_tokens.weight",
            "model.language_model.embed_tokens.weight",
        ]
        .into_iter()
        .find(|k| self.shapes.contains_key(*k))
        .map(str::to_string)
    }
}

/// The model families the exporters handle, detected as the cookbook does.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Profile {
    /// Standard dense models (Qwen3, Llama, …): the cookbook's default profile.
    Default,
    /// Qwen3.5 (`model_type` `qwen3_5`): vision-language layout, split QKV adapters.
    Qwen3_5,
}

impl Profile {
    fn detect(base: &BaseModel) -> Result<Profile> {
        let model_type = base
            .config
            .get("model_type")
            .and_then(|t| t.as_str())
            .unwrap_or("");
        let arch = |needle: &str| {
            base.config
                .get("architectures")
                .and_then(|a| a.as_array())
                .is_some_and(|a| {
                    a.iter()
                        .any(|x| x.as_str().is_some_and(|s| s.contains(needle)))
                })
        };
        let other = if arch("GptOss") {
            Some("GPT-OSS")
        } else if model_type == "deepseek_v3" {
            Some("DeepSeek V3")
        } else if arch("NemotronH") {
            Some("Nemotron-H")
        } else if model_type == "kimi_k25" {
            Some("Kimi K2.5")
        } else {
            None
        };
        if let Some(family) = other {
            return Err(Error::Unsupported(format!(
                "{}: {family} models (`model_type` {model_type:?}) need the cookbook's \
                 model-specific merge; rlvr exports Qwen3-style dense and Qwen3.5 dense models",
                base.dir.display()
            )));
        }
        Ok(if model_type == "qwen3_5" || model_type == "qwen3_5_moe" {
            Profile::Qwen3_5
        } else {
            Profile::Default
        })
    }

    /// The cookbook's `build_name_remaps` / `build_qwen3_5_name_remaps`: `(old, new)`
    /// replacements applied in order to every occurrence.
    fn name_remaps(self, base: &BaseModel) -> Vec<(&'static str, &'static str)> {
        let keys = &base.shapes;
        let mut remaps = vec![("base_model.model.", "")];
        match self {
            Profile::Default => {
                let has_lm_head = keys.contains_key("lm_head.weight")
                    || keys.keys().any(|k| k.ends_with(".lm_head.weight"));
                remaps.push(if has_lm_head {
                    ("model.unembed_tokens", "lm_head")
                } else {
                    ("model.unembed_tokens", "model.embed_tokens")
                });
                if base.has_lm_prefix() {
                    remaps.push(("model.", "model.language_model."));
                }
            }
            Profile::Qwen3_5 => {
                if base.has_lm_prefix() {
                    remaps.push(("model.", "model.language_model."));
                    let top_level = keys
                        .keys()
                        .any(|k| k == "lm_head.weight" || k.starts_with("lm_head."));
                    remaps.push(if top_level {
                        ("model.language_model.unembed_tokens", "lm_head")
                    } else {
                        (
                            "model.language_model.unembed_tokens",
                            "model.language_model.embed_tokens",
                        )
                    });
                } else {
                    remaps.push(("model.unembed_tokens", "lm_head"));
                }
            }
        }
        remaps
    }
}

fn remap(name: &str, remaps: &[(&str, &str)]) -> String {
    remaps
        .iter()
        .fold(name.to_string(), |n, (old, new)| n.replace(old, new))
}

/// One LoRA product to add to a weight: `B_scaled A` into rows `row0..row0 + out`.
struct MergeOp {
    a: Vec<f32>,
    b: Vec<f32>,
    rank: usize,
    out: usize,
    inp: usize,
    row0: usize,
    /// Into a row slice of a fused weight (Qwen3.5's `in_proj_qkv`), not the whole weight.
    sliced: bool,
}

/// What the merge changes: LoRA products by target weight, whole tensors replaced, and the
/// embedding key to untie into a new `lm_head.weight`.
#[derive(Default)]
struct MergePlan {
    ops: BTreeMap<String, Vec<MergeOp>>,
    replace: BTreeMap<String, OwnedTensor>,
    untie: Option<String>,
}

const SPLIT_QKV: [(&str, usize); 3] = [
    (".in_proj_q.weight", 0),
    (".in_proj_k.weight", 1),
    (".in_proj_v.weight", 2),
];

fn plan_merge(adapter: &LoraAdapter, base: &BaseModel, profile: &Profile) -> Result<MergePlan> {
    let remaps = profile.name_remaps(base);
    // `lora_B.float() * scaling`: the Python float scale is rounded to f32 first.
    let scale = adapter.scaling() as f32;
    if !scale.is_finite() {
        return Err(weights_error(
            &adapter.source,
            format!(
                "lora_alpha / r = {} / {} is not finite",
                adapter.alpha, adapter.rank
            ),
        ));
    }
    let mut plan = MergePlan::default();
    for (n, a_key, b_key) in adapter.pairs() {
        refuse_experts(adapter, &n)?;
        let target = remap(&n, &remaps);
        let (ta, tb) = (adapter.tensor(&a_key)?, adapter.tensor(&b_key)?);
        let (rank, inp) = (ta.shape[0], ta.shape[1]);
        let out = tb.shape[0];
        let a = to_f32(&adapter.source, &a_key, ta.dtype, &ta.data)?;
        let b: Vec<f32> = to_f32(&adapter.source, &b_key, tb.dtype, &tb.data)?
            .into_iter()
            .map(|v| v * scale)
            .collect();
        let mut op = MergeOp {
            a,
            b,
            rank,
            out,
            inp,
            row0: 0,
            sliced: false,
        };
        let mut key = target.clone();
        if *profile == Profile::Qwen3_5
            && let Some((suffix, role)) = SPLIT_QKV.iter().find(|(s, _)| target.ends_with(s))
        {
            let fused = format!(
                "{}.in_proj_qkv.weight",
                &target[..target.len() - suffix.len()]
            );
            if base.shapes.contains_key(&fused) {
                let prefix = &n[..n.len() - suffix.len()];
                let rows = |p: &str| -> Result<usize> {
                    let k = format!("{prefix}.in_proj_{p}.lora_B.weight");
                    adapter.tensors.get(&k).map(|t| t.shape[0]).ok_or_else(|| {
                        weights_error(
                            &adapter.source,
                            format!(
                                "Split QKV fusion requires all three in_proj_q/k/v \
                                     adapters for the same layer, but `{k}` is missing"
                            ),
                        )
                    })
                };
                let (q, k) = (rows("q")?, rows("k")?);
                op.row0 = [0, q, q + k][*role];
                op.sliced = true;
                key = fused;
            }
        }
        match base.shapes.get(&key) {
            Some(shape) => check_shape(&key, shape, &op, &adapter.source)?,
            None if key == "lm_head.weight" && base.tied_embeddings() => {
                let embed = base.embed_key().ok_or_else(|| {
                    weights_error(&base.dir, "tied embeddings but no `embed_tokens` weight")
                })?;
                check_shape(&key, &base.shapes[&embed], &op, &adapter.source)?;
                plan.untie = Some(embed);
            }
            None => {
                return Err(weights_error(
                    &adapter.source,
                    format!(
                        "Adapter weight `{n}` mapped to `{key}`, which does not exist in the \
                         model state dict of {}",
                        base.dir.display()
                    ),
                ));
            }
        }
        plan.ops.entry(key).or_default().push(op);
    }
    Ok(plan)
}

fn check_shape(key: &str, shape: &[usize], op: &MergeOp, source: &Path) -> Result<()> {
    let fits = match shape {
        [rows, cols] if op.sliced => *cols == op.inp && op.row0 + op.out <= *rows,
        [rows, cols] => *cols == op.inp && op.out == *rows,
        _ => false,
    };
    if !fits {
        return Err(weights_error(
            source,
            format!(
                "Shape mismatch for `{key}`: the adapter makes [{}, {}] at row {}, the model \
                 weight is {shape:?}",
                op.out, op.inp, op.row0
            ),
        ));
    }
    Ok(())
}

/// `values[row0 + i, j] = round(values[row0 + i, j] + Σ_k b[i, k] a[k, j])`, the sum
/// accumulated with fused multiply-adds in `k` order (what PyTorch's CPU `B @ A` gives at
/// LoRA ranks), `round` to `dtype` after each product as `apply_merged_weight` does. Rows are
/// independent: large products are split over the machine's threads (the result does not
/// depend on how).
fn apply_op(values: &mut [f32], cols: usize, op: &MergeOp, dtype: Dtype) {
    let rows = &mut values[op.row0 * cols..(op.row0 + op.out) * cols];
    let work = op.out * op.inp * op.rank;
    let threads = if work < (1 << 22) {
        1
    } else {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    };
    let per = op.out.div_ceil(threads).max(1);
    let run = |first: usize, chunk: &mut [f32]| {
        let mut acc = vec![0f32; op.inp];
        for (i, row) in chunk.chunks_mut(cols).enumerate() {
            let r = first + i;
            delta_row(&op.b[r * op.rank..(r + 1) * op.rank], &op.a, &mut acc);
            for (w, d) in row.iter_mut().zip(&acc) {
                *w = round_to(dtype, *w + d);
            }
        }
    };
    if threads == 1 {
        run(0, rows);
        return;
    }
    std::thread::scope(|scope| {
        for (t, chunk) in rows.chunks_mut(per * cols).enumerate() {
            let run = &run;
            scope.spawn(move || run(t * per, chunk));
        }
    });
}

fn round_to(dtype: Dtype, v: f32) -> f32 {
    match dtype {
        Dtype::BF16 => half::bf16::from_f32(v).to_f32(),
        Dtype::F16 => half::f16::from_f32(v).to_f32(),
        _ => v,
    }
}

fn delta_row(b_row: &[f32], a: &[f32], acc: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("fma") {
            // SAFETY: the CPU has FMA (checked just above).
            unsafe { delta_row_fma(b_row, a, acc) };
            return;
        }
    }
    delta_row_generic(b_row, a, acc);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "fma")]
fn delta_row_fma(b_row: &[f32], a: &[f32], acc: &mut [f32]) {
    delta_row_generic(b_row, a, acc);
}

#[inline(always)]
fn delta_row_generic(b_row: &[f32], a: &[f32], acc: &mut [f32]) {
    let n = acc.len();
    acc.fill(0.0);
    for (k, bk) in b_row.iter().enumerate() {
        for (s, x) in acc.iter_mut().zip(&a[k * n..(k + 1) * n]) {
            *s = bk.mul_add(*x, *s);
        }
    }
}

/// The shard loop: each input shard mapped, its changed tensors merged, written as output
/// shard(s) cut at 10 GiB; then the index (several shards), config, code and tokenizer files.
fn write_merged(base: &BaseModel, mut plan: MergePlan, tmp: &Path) -> Result<()> {
    let mut written: Vec<(PathBuf, Vec<String>)> = Vec::new();
    let mut total_size = 0usize;
    for shard in &base.shards {
        let path = base.dir.join(shard);
        let mapped = Mapped::open(&path)?;
        let st = mapped.tensors()?;
        let mut names = st.names();
        names.sort();
        let mut pending: Vec<(String, Out<'_>)> = Vec::new();
        let mut pending_size = 0usize;
        for name in names {
            let view = st
                .tensor(name)
                .map_err(|e| weights_error(&path, e.to_string()))?;
            let mut outs = Vec::new();
            if let Some(t) = plan.replace.remove(name) {
                outs.push((name.to_string(), Out::Owned(t)));
            } else if let Some(ops) = plan.ops.remove(name) {
                outs.push((
                    name.to_string(),
                    Out::Owned(merge_tensor(&path, name, &view, &ops)?),
                ));
            } else {
                outs.push((name.to_string(), Out::Borrowed(view.clone())));
            }
            if plan.untie.as_deref() == Some(name) {
                plan.untie = None;
                let head = "lm_head.weight".to_string();
                let t = match (plan.replace.remove(&head), plan.ops.remove(&head)) {
                    (Some(t), _) => t,
                    (None, Some(ops)) => merge_tensor(&path, name, &view, &ops)?,
                    (None, None) => OwnedTensor::from_view(&view),
                };
                outs.push((head, Out::Owned(t)));
            }
            for (key, t) in outs {
                let size = t.byte_len();
                if !pending.is_empty() && pending_size + size > MAX_SHARD_BYTES {
                    written.push(flush(tmp, written.len(), &mut pending)?);
                    pending_size = 0;
                }
                pending_size += size;
                total_size += size;
                pending.push((key, t));
            }
        }
        if !pending.is_empty() {
            written.push(flush(tmp, written.len(), &mut pending)?);
        }
    }
    let left: Vec<&String> = plan.ops.keys().chain(plan.replace.keys()).collect();
    if !left.is_empty() {
        return Err(weights_error(
            &base.dir,
            format!("weights not found in any shard: {left:?}"),
        ));
    }
    let total = written.len();
    let mut weight_map = BTreeMap::new();
    for (i, (tmp_path, keys)) in written.into_iter().enumerate() {
        let name = if total == 1 {
            "model.safetensors".to_string()
        } else {
            format!("model-{:05}-of-{total:05}.safetensors", i + 1)
        };
        std::fs::rename(&tmp_path, tmp.join(&name))
            .map_err(|e| Error::io("renaming", &tmp_path, e))?;
        for k in keys {
            weight_map.insert(k, name.clone());
        }
    }
    if total > 1 {
        let index = serde_json::json!({
            "metadata": {"total_size": total_size},
            "weight_map": weight_map,
        });
        write_json(&tmp.join("model.safetensors.index.json"), &index, false)?;
    }
    let config_src = base.dir.join("config.json");
    let untied = plan_untied(&weight_map, base);
    if untied {
        let mut config = base.config.clone();
        if let Some(o) = config.as_object_mut() {
            o.insert("tie_word_embeddings".into(), false.into());
            if let Some(t) = o.get_mut("text_config").and_then(|t| t.as_object_mut()) {
                t.insert("tie_word_embeddings".into(), false.into());
            }
        }
        write_json(&tmp.join("config.json"), &config, false)?;
    } else {
        copy(&config_src, &tmp.join("config.json"))?;
    }
    let mut code: Vec<PathBuf> = std::fs::read_dir(&base.dir)
        .map_err(|e| Error::io("listing", &base.dir, e))?
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "py") && p.is_file())
        .collect();
    code.sort();
    for src in code {
        if let Some(name) = src.file_name() {
            let dst = tmp.join(name);
            if !dst.exists() {
                copy(&src, &dst)?;
            }
        }
    }
    for name in crate::tokenizer::TOKENIZER_AND_PROCESSOR_FILES {
        let src = base.dir.join(name);
        if src.is_file() {
            copy(&src, &tmp.join(name))?;
        }
    }
    Ok(())
}

/// Whether the output has an `lm_head.weight` the base (tied) did not.
fn plan_untied(weight_map: &BTreeMap<String, String>, base: &BaseModel) -> bool {
    weight_map.contains_key("lm_head.weight") && !base.shapes.contains_key("lm_head.weight")
}

fn copy(src: &Path, dst: &Path) -> Result<()> {
    std::fs::copy(src, dst)
        .map(|_| ())
        .map_err(|e| Error::io("copying", src, e))
}

fn merge_tensor(
    path: &Path,
    name: &str,
    view: &safetensors::tensor::TensorView<'_>,
    ops: &[MergeOp],
) -> Result<OwnedTensor> {
    let dtype = view.dtype();
    let mut values = to_f32(path, name, dtype, view.data())?;
    let cols = view.shape().get(1).copied().unwrap_or(1);
    for op in ops {
        apply_op(&mut values, cols, op, dtype);
    }
    Ok(OwnedTensor {
        dtype,
        shape: view.shape().to_vec(),
        data: from_f32(dtype, &values),
    })
}

fn flush(
    tmp: &Path,
    index: usize,
    pending: &mut Vec<(String, Out<'_>)>,
) -> Result<(PathBuf, Vec<String>)> {
    let path = tmp.join(format!("shard-{:05}.tmp.safetensors", index + 1));
    let keys: Vec<String> = pending.iter().map(|(k, _)| k.clone()).collect();
    let items: Vec<(String, &Out<'_>)> = pending.iter().map(|(k, t)| (k.clone(), t)).collect();
    tensors::write(&path, items)?;
    pending.clear();
    Ok((path, keys))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The threaded product (large ops) equals the row-by-row one, bit for bit.
    #[test]
    fn threaded_products_equal_serial_ones() {
        let (out, inp, rank, cols) = (600, 520, 16, 520);
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 40) as f32 / (1u64 << 24) as f32 - 0.5
        };
        let a: Vec<f32> = (0..rank * inp).map(|_| next()).collect();
        let b: Vec<f32> = (0..out * rank).map(|_| next()).collect();
        let base: Vec<f32> = (0..(out + 7) * cols).map(|_| next()).collect();
        let op = MergeOp {
            a,
            b,
            rank,
            out,
            inp,
            row0: 7,
            sliced: true,
        };
        assert!(op.out * op.inp * op.rank >= 1 << 22, "the threaded path");
        for dtype in [Dtype::F32, Dtype::BF16] {
            let mut threaded = base.clone();
            apply_op(&mut threaded, cols, &op, dtype);
            let mut serial = base.clone();
            let mut acc = vec![0f32; inp];
            for i in 0..out {
                delta_row(&op.b[i * rank..(i + 1) * rank], &op.a, &mut acc);
                for (w, d) in serial[(7 + i) * cols..(8 + i) * cols].iter_mut().zip(&acc) {
                    *w = round_to(dtype, *w + d);
                }
            }
            assert!(threaded == serial, "{dtype:?}");
            assert_eq!(
                threaded[..7 * cols],
                base[..7 * cols],
                "rows before the slice"
            );
        }
    }
}
