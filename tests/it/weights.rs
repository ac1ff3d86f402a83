//! `rlvr::weights` against tinker-cookbook 0.6.1's `weights.build_lora_adapter` and
//! `weights.build_hf_model`: `tests/fixtures/weights/<case>/{base,adapter}` are tiny random
//! models and Tinker-format adapters, `peft/` and `merged/` what the cookbook made of them
//! (`make_fixtures.py`). Our outputs must equal them tensor for tensor (bytes of every tensor,
//! dtype, shape), file for file, and the JSON files as JSON.
//!
//! Then the local backend's own checkpoints: a LoRA checkpoint merged, and a full fine-tuning
//! checkpoint exported, load back into the local backend with the trained policy's logits.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use rlvr::Error;
use rlvr::weights::{build_hf_model, build_lora_adapter, export_full_checkpoint};
use safetensors::SafeTensors;

fn cases() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/weights");
    let mut v: Vec<PathBuf> = std::fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("adapter").is_dir())
        .collect();
    v.sort();
    assert!(v.len() >= 4, "fixtures missing under {}", root.display());
    v
}

/// Every tensor of a safetensors file: (dtype, shape, bytes) by name.
fn tensors(path: &Path) -> BTreeMap<String, (String, Vec<usize>, Vec<u8>)> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let st = SafeTensors::deserialize(&bytes).unwrap();
    st.tensors()
        .into_iter()
        .map(|(n, v)| {
            (
                n,
                (
                    format!("{:?}", v.dtype()),
                    v.shape().to_vec(),
                    v.data().to_vec(),
                ),
            )
        })
        .collect()
}

fn json(path: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn files(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// Same files; safetensors equal tensor for tensor, JSON equal as JSON, the rest byte for
/// byte.
fn assert_same_dir(got: &Path, want: &Path, what: &str) {
    assert_eq!(files(got), files(want), "{what}: file names");
    for name in files(want) {
        let (g, w) = (got.join(&name), want.join(&name));
        if name.ends_with(".safetensors") {
            let (tg, tw) = (tensors(&g), tensors(&w));
            assert_eq!(
                tg.keys().collect::<Vec<_>>(),
                tw.keys().collect::<Vec<_>>(),
                "{what}/{name}: tensor names"
            );
            for (k, (dw, sw, bw)) in &tw {
                let (dg, sg, bg) = &tg[k];
                assert_eq!((dg, sg), (dw, sw), "{what}/{name}: `{k}` dtype and shape");
                assert!(
                    bg == bw,
                    "{what}/{name}: `{k}` values differ from the cookbook's"
                );
            }
        } else if name.ends_with(".json") && name != "adapter_config.json" {
            assert_eq!(json(&g), json(&w), "{what}/{name}");
        } else if name != "adapter_config.json" {
            assert_eq!(
                std::fs::read(&g).unwrap(),
                std::fs::read(&w).unwrap(),
                "{what}/{name}"
            );
        }
    }
}

#[test]
fn peft_adapters_equal_the_cookbook_build_lora_adapter() {
    for case in cases() {
        let name = case.file_name().unwrap().to_string_lossy().into_owned();
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("peft");
        build_lora_adapter(case.join("base"), case.join("adapter"), &out).unwrap();
        assert_same_dir(&out, &case.join("peft"), &name);
        // The config, as JSON, with our base path where the generator wrote its own.
        let mut want = json(&case.join("peft/adapter_config.json"));
        want["base_model_name_or_path"] = case.join("base").to_string_lossy().into();
        assert_eq!(json(&out.join("adapter_config.json")), want, "{name}");
        // Python's `json.dumps(indent=2)` + newline, byte for byte (but the path).
        let text = std::fs::read_to_string(out.join("adapter_config.json")).unwrap();
        let reference = std::fs::read_to_string(case.join("peft/adapter_config.json")).unwrap();
        assert_eq!(
            text.replace(
                &*case.join("base").to_string_lossy(),
                &format!("{name}/base")
            ),
            reference,
            "{name}"
        );
    }
}

#[test]
fn merged_models_equal_the_cookbook_build_hf_model() {
    for case in cases() {
        let name = case.file_name().unwrap().to_string_lossy().into_owned();
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("merged");
        build_hf_model(case.join("base"), case.join("adapter"), &out).unwrap();
        assert_same_dir(&out, &case.join("merged"), &name);
        // Nothing else left beside the output.
        assert_eq!(files(dir.path()), vec!["merged".to_string()], "{name}");
    }
}

/// A copy of `case` whose adapter or base is changed by `edit`, for the error cases.
fn edited(case: &Path, edit: impl FnOnce(&Path)) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for sub in ["base", "adapter"] {
        std::fs::create_dir(dir.path().join(sub)).unwrap();
        for f in files(&case.join(sub)) {
            std::fs::copy(case.join(sub).join(&f), dir.path().join(sub).join(&f)).unwrap();
        }
    }
    edit(dir.path());
    dir
}

fn qwen3_case() -> PathBuf {
    cases()
        .into_iter()
        .find(|c| c.ends_with("qwen3-bf16"))
        .unwrap()
}

fn rewrite_adapter(
    dir: &Path,
    f: impl FnOnce(&mut BTreeMap<String, (String, Vec<usize>, Vec<u8>)>),
) {
    let path = dir.join("adapter/adapter_model.safetensors");
    let mut t = tensors(&path);
    f(&mut t);
    write_tensors(&path, &t);
}

fn write_tensors(path: &Path, t: &BTreeMap<String, (String, Vec<usize>, Vec<u8>)>) {
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = t
        .iter()
        .map(|(k, (d, s, b))| {
            let dtype = match d.as_str() {
                "F32" => safetensors::Dtype::F32,
                "BF16" => safetensors::Dtype::BF16,
                other => panic!("{other}"),
            };
            (
                k.clone(),
                safetensors::tensor::TensorView::new(dtype, s.clone(), b).unwrap(),
            )
        })
        .collect();
    safetensors::serialize_to_file(views, None, path).unwrap();
}

#[test]
fn bad_inputs_are_typed_errors_that_write_nothing() {
    let case = qwen3_case();
    let both = |dir: &Path| -> Vec<Error> {
        let mut errs = Vec::new();
        for i in 0..2 {
            let out = dir.join(format!("out{i}"));
            let (base, adapter) = (dir.join("base"), dir.join("adapter"));
            let e = if i == 0 {
                build_lora_adapter(base, adapter, &out)
            } else {
                build_hf_model(base, adapter, &out)
            }
            .expect_err("a bad input must fail");
            assert!(!out.exists(), "{e}: output written");
            let leftovers: Vec<String> = files(dir)
                .into_iter()
                .filter(|n| n.starts_with('.'))
                .collect();
            assert!(leftovers.is_empty(), "{e}: temporaries left: {leftovers:?}");
            errs.push(e);
        }
        errs
    };

    // The output exists: refused, and left as it was.
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("taken");
    std::fs::create_dir(&out).unwrap();
    std::fs::write(out.join("mine"), "keep").unwrap();
    for e in [
        build_lora_adapter(case.join("base"), case.join("adapter"), &out).unwrap_err(),
        build_hf_model(case.join("base"), case.join("adapter"), &out).unwrap_err(),
    ] {
        assert!(e.to_string().contains("already exists"), "{e}");
        assert_eq!(std::fs::read_to_string(out.join("mine")).unwrap(), "keep");
    }

    // No adapter config; `r` missing.
    let d = edited(&case, |d| {
        std::fs::remove_file(d.join("adapter/adapter_config.json")).unwrap()
    });
    for e in both(d.path()) {
        assert!(e.to_string().contains("adapter_config.json"), "{e}");
    }
    let d = edited(&case, |d| {
        std::fs::write(
            d.join("adapter/adapter_config.json"),
            r#"{"lora_alpha": 32}"#,
        )
        .unwrap()
    });
    for e in both(d.path()) {
        assert!(e.to_string().contains("`r`"), "{e}");
    }
    // A lora_B without its lora_A partner shape.
    let d = edited(&case, |d| {
        rewrite_adapter(d, |t| {
            let k = "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight";
            let (dt, _, b) = t.remove(k).unwrap();
            t.insert(k.into(), (dt, vec![b.len() / 4, 1], b));
        })
    });
    for e in both(d.path()) {
        assert!(e.to_string().contains("layers.0.self_attn.q_proj"), "{e}");
    }
    // A mixture-of-experts adapter.
    let d = edited(&case, |d| {
        rewrite_adapter(d, |t| {
            let a = t["base_model.model.model.layers.0.mlp.gate_proj.lora_A.weight"].clone();
            let b = t["base_model.model.model.layers.0.mlp.gate_proj.lora_B.weight"].clone();
            t.insert(
                "base_model.model.model.layers.0.mlp.experts.w1.lora_A.weight".into(),
                a,
            );
            t.insert(
                "base_model.model.model.layers.0.mlp.experts.w1.lora_B.weight".into(),
                b,
            );
        })
    });
    for e in both(d.path()) {
        assert!(matches!(e, Error::Unsupported(_)), "{e}");
        assert!(e.to_string().contains("experts"), "{e}");
    }
    // An adapted module the model does not have (the merge needs it; the adapter does not).
    let d = edited(&case, |d| {
        rewrite_adapter(d, |t| {
            let a = t["base_model.model.model.layers.0.mlp.gate_proj.lora_A.weight"].clone();
            let b = t["base_model.model.model.layers.0.mlp.gate_proj.lora_B.weight"].clone();
            t.insert(
                "base_model.model.model.layers.9.mlp.gate_proj.lora_A.weight".into(),
                a,
            );
            t.insert(
                "base_model.model.model.layers.9.mlp.gate_proj.lora_B.weight".into(),
                b,
            );
        })
    });
    let out = d.path().join("merged");
    let e = build_hf_model(d.path().join("base"), d.path().join("adapter"), &out).unwrap_err();
    assert!(
        e.to_string()
            .contains("model.layers.9.mlp.gate_proj.weight"),
        "{e}"
    );
    assert!(!out.exists());
    // An unsupported family.
    let d = edited(&case, |d| {
        let mut c = json(&d.join("base/config.json"));
        c["model_type"] = "deepseek_v3".into();
        std::fs::write(d.join("base/config.json"), c.to_string()).unwrap();
    });
    for e in both(d.path()) {
        assert!(matches!(e, Error::Unsupported(_)), "{e}");
    }
    // A shard index naming a file outside the model directory.
    let sharded = cases()
        .into_iter()
        .find(|c| c.ends_with("qwen3-f32-tied-sharded"))
        .unwrap();
    let d = edited(&sharded, |d| {
        let p = d.join("base/model.safetensors.index.json");
        let text = std::fs::read_to_string(&p).unwrap();
        std::fs::write(&p, text.replacen("\"model-00001", "\"../model-00001", 1)).unwrap();
    });
    let out = d.path().join("merged");
    let e = build_hf_model(d.path().join("base"), d.path().join("adapter"), &out).unwrap_err();
    assert!(e.to_string().contains("unsafe shard name"), "{e}");
    assert!(!out.exists());
    // A directory that is no model.
    let empty = tempfile::tempdir().unwrap();
    let e = build_hf_model(empty.path(), case.join("adapter"), empty.path().join("o")).unwrap_err();
    assert!(e.to_string().contains("config.json"), "{e}");
}

#[cfg(feature = "local")]
mod local {
    use super::*;
    use crate::local_common::{
        adam, backend, fixture, hf_case, is_datum, lora, max_abs_diff, train_step,
    };
    use rlvr::PolicyBackend;
    use rlvr::backend::local::{LocalBackend, LocalOptions};
    use rlvr::types::LossFn;

    /// A LoRA checkpoint of the local backend (adapters on attention, MLP and the output head)
    /// merged into its base: the merged model's logits are the trained policy's, on the model
    /// with its own `lm_head` and on the one with tied embeddings (which the merge unties).
    #[tokio::test]
    async fn a_merged_local_lora_checkpoint_has_the_trained_logits() {
        for name in ["untied", "tied"] {
            let dir = tempfile::tempdir().unwrap();
            let opts = LocalOptions::default()
                .lora(lora(4))
                .checkpoint_dir(dir.path().join("ckpts"));
            let b = backend(name, opts);
            train_step(&b).await;
            train_step(&b).await;
            let ckpt = b.save_state("s2").await.unwrap();
            let out = dir.path().join("merged");
            build_hf_model(fixture(name), &ckpt.path, &out).unwrap();
            let re = LocalBackend::from_dir(&out, LocalOptions::default()).unwrap();
            let peft = dir.path().join("peft");
            build_lora_adapter(fixture(name), &ckpt.path, &peft).unwrap();
            let config = json(&peft.join("adapter_config.json"));
            assert_eq!(config["r"], 4);
            assert_eq!(config["lora_alpha"], 32);
            assert!(
                config["target_modules"]
                    .as_array()
                    .unwrap()
                    .contains(&"lm_head".into())
            );
            for ids in &hf_case(name).input_ids {
                let want = b.sampler().await.unwrap().logits_blocking(ids).unwrap();
                let got = re.sampler().await.unwrap().logits_blocking(ids).unwrap();
                for (g, w) in got.iter().zip(&want) {
                    let d = max_abs_diff(g, w);
                    assert!(d < 1e-4, "{name}: logits differ by {d}");
                }
            }
        }
    }

    /// A full fine-tuning checkpoint exported over its base: the trained policy's logits.
    #[tokio::test]
    async fn an_exported_full_checkpoint_has_the_trained_logits() {
        let dir = tempfile::tempdir().unwrap();
        let opts = LocalOptions::default()
            .full_finetune()
            .checkpoint_dir(dir.path().join("ckpts"));
        let b = backend("untied", opts);
        train_step(&b).await;
        let ckpt = b.save_state("s1").await.unwrap();
        let out = dir.path().join("model");
        let e = build_hf_model(fixture("untied"), &ckpt.path, &out).unwrap_err();
        assert!(e.to_string().contains("export_full_checkpoint"), "{e}");
        export_full_checkpoint(&ckpt.path, fixture("untied"), &out).unwrap();
        let re = LocalBackend::from_dir(&out, LocalOptions::default()).unwrap();
        let ids = &hf_case("untied").input_ids[0];
        let want = b.sampler().await.unwrap().logits_blocking(ids).unwrap();
        let got = re.sampler().await.unwrap().logits_blocking(ids).unwrap();
        for (g, w) in got.iter().zip(&want) {
            assert!(max_abs_diff(g, w) < 1e-4);
        }
    }

    /// The real consumers (opt-in: `RLVR_TRANSFORMERS_PYTHON` names a Python with torch,
    /// transformers and peft; `.ci/run` sets it to the peer server's venv). A local LoRA
    /// checkpoint (attention, MLP and output-head adapters) — on the qwen3-tiny fixtures and on
    /// the embedded quickstart model —, exported as a PEFT adapter and as a merged model: `PeftModel.from_pretrained` on the base and
    /// `AutoModelForCausalLM.from_pretrained` on the merged directory give the trained
    /// policy's logits (within 1e-4), and the merged directory loads with no missing,
    /// unexpected or mismatched keys.
    #[tokio::test]
    async fn transformers_and_peft_load_the_exports_with_the_trained_logits() {
        let Ok(python) = std::env::var("RLVR_TRANSFORMERS_PYTHON") else {
            eprintln!("RLVR_TRANSFORMERS_PYTHON is not set: transformers/peft check skipped");
            return;
        };
        let script = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/weights/load_with_transformers.py");
        let quickstart = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/tiny-wordproblems");
        for name in ["untied", "tied", "quickstart"] {
            let dir = tempfile::tempdir().unwrap();
            let ckpts = dir.path().join("ckpts");
            let (base_dir, b, ids) = if name == "quickstart" {
                // The embedded quickstart model with the quickstart's LoRA (rank 8), trained a
                // step on its own kind of text.
                let opts = LocalOptions::default().lora(lora(8)).checkpoint_dir(&ckpts);
                let b = LocalBackend::from_dir(&quickstart, opts).unwrap();
                let tok = rlvr::PolicyBackend::tokenizer(&b).clone();
                let ids: Vec<Vec<u32>> = [
                    "Tom has 3 apples and buys 4 more. How many apples does he have?",
                    "A box holds 12 pens. 5 are taken out. How many are left?",
                ]
                .iter()
                .map(|t| tok.encode(t).unwrap())
                .collect();
                for _ in 0..2 {
                    let data = ids
                        .iter()
                        .enumerate()
                        .map(|(i, t)| is_datum(t, i))
                        .collect();
                    b.forward_backward(data, LossFn::ImportanceSampling)
                        .await
                        .unwrap()
                        .await
                        .unwrap();
                    b.optim_step(adam()).await.unwrap().await.unwrap();
                }
                (quickstart.clone(), b, ids)
            } else {
                let opts = LocalOptions::default().lora(lora(4)).checkpoint_dir(&ckpts);
                let b = backend(name, opts);
                train_step(&b).await;
                train_step(&b).await;
                (fixture(name), b, hf_case(name).input_ids)
            };
            let ckpt = b.save_state("s2").await.unwrap();
            let (peft, merged) = (dir.path().join("peft"), dir.path().join("merged"));
            build_lora_adapter(&base_dir, &ckpt.path, &peft).unwrap();
            build_hf_model(&base_dir, &ckpt.path, &merged).unwrap();
            let request = dir.path().join("request.json");
            std::fs::write(
                &request,
                serde_json::json!({
                    "base": base_dir, "peft": peft, "merged": merged, "input_ids": ids,
                })
                .to_string(),
            )
            .unwrap();
            let out = std::process::Command::new(&python)
                .arg(&script)
                .arg(&request)
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            let got: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
            eprintln!("{name}: transformers warnings: {}", got["warnings"]);
            for (k, v) in got["merged_loading_info"].as_object().unwrap() {
                assert!(
                    v.as_array().unwrap().is_empty(),
                    "{name}: merged model loading info `{k}`: {v}"
                );
            }
            let sampler = b.sampler().await.unwrap();
            for which in ["peft", "merged"] {
                let mut worst = 0f32;
                for (i, seq) in ids.iter().enumerate() {
                    let want = sampler.logits_blocking(seq).unwrap();
                    let rows: Vec<Vec<f32>> =
                        serde_json::from_value(got[which][i].clone()).unwrap();
                    assert_eq!(rows.len(), want.len());
                    for (g, w) in rows.iter().zip(&want) {
                        worst = worst.max(max_abs_diff(g, w));
                    }
                }
                eprintln!("{name}: {which}: max |logit difference| {worst:e}");
                assert!(worst <= 1e-4, "{name}: {which} logits differ by {worst}");
            }
        }
    }

    fn peft_made() -> Vec<PathBuf> {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/weights/peft-made");
        let mut v: Vec<PathBuf> = std::fs::read_dir(&root)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        v.sort();
        assert!(v.len() >= 3, "fixtures missing under {}", root.display());
        v
    }

    /// Back in: adapters `peft` made and saved on the qwen3-tiny fixtures (a subset of the
    /// modules; every linear layer and the tied output head; rsLoRA scaling), loaded by the
    /// local backend on its base, give peft's logits.
    #[tokio::test]
    async fn adapters_peft_made_load_with_peft_logits() {
        for dir in peft_made() {
            let want = json(&dir.join("logits.json"));
            let base = want["base"].as_str().unwrap();
            let b = backend(base, LocalOptions::default().adapter(&dir));
            let cfg = json(&dir.join("adapter_config.json"));
            assert_eq!(
                b.lora_config().unwrap().rank as u64,
                cfg["r"].as_u64().unwrap()
            );
            let sampler = b.sampler().await.unwrap();
            let mut worst = 0f32;
            for (i, ids) in want["input_ids"].as_array().unwrap().iter().enumerate() {
                let ids: Vec<u32> = serde_json::from_value(ids.clone()).unwrap();
                let rows: Vec<Vec<f32>> =
                    serde_json::from_value(want["logits"][i].clone()).unwrap();
                let got = sampler.logits_blocking(&ids).unwrap();
                for (g, w) in got.iter().zip(&rows) {
                    worst = worst.max(max_abs_diff(g, w));
                }
            }
            eprintln!("{}: max |logit difference| {worst:e}", dir.display());
            assert!(worst <= 1e-4, "{}: {worst}", dir.display());
        }
    }

    /// A local LoRA checkpoint exported as a PEFT adapter and loaded back: the trained
    /// logits, and training goes on from there.
    #[tokio::test]
    async fn an_exported_adapter_loads_back_and_trains_on() {
        let dir = tempfile::tempdir().unwrap();
        let opts = LocalOptions::default()
            .lora(lora(4))
            .checkpoint_dir(dir.path().join("ckpts"));
        let b = backend("tied", opts);
        train_step(&b).await;
        let ckpt = b.save_state("s1").await.unwrap();
        let peft = dir.path().join("peft");
        build_lora_adapter(fixture("tied"), &ckpt.path, &peft).unwrap();
        let re = backend("tied", LocalOptions::default().adapter(&peft));
        assert_eq!(
            re.lora_config(),
            b.lora_config()
                .map(|l| rlvr::types::LoraConfig { seed: None, ..*l })
                .as_ref()
        );
        let ids = &hf_case("tied").input_ids[0];
        let want = b.sampler().await.unwrap().logits_blocking(ids).unwrap();
        let got = re.sampler().await.unwrap().logits_blocking(ids).unwrap();
        for (g, w) in got.iter().zip(&want) {
            assert!(max_abs_diff(g, w) < 1e-5);
        }
        let (l1, l2) = (train_step(&b).await, train_step(&re).await);
        assert!((l1 - l2).abs() < 1e-3 * l1.abs().max(1.0), "{l1} vs {l2}");
    }

    #[test]
    fn adapters_the_local_backend_cannot_use_are_refused() {
        let src = peft_made()
            .into_iter()
            .find(|d| d.ends_with("all-tied"))
            .unwrap();
        let copy = |edit: &dyn Fn(&Path)| {
            let d = tempfile::tempdir().unwrap();
            for f in files(&src) {
                std::fs::copy(src.join(&f), d.path().join(&f)).unwrap();
            }
            edit(d.path());
            d
        };
        let load = |d: &Path| {
            LocalBackend::from_dir(fixture("tied"), LocalOptions::default().adapter(d))
                .map(|_| ())
                .unwrap_err()
        };
        // DoRA.
        let d = copy(&|d| {
            let mut c = json(&d.join("adapter_config.json"));
            c["use_dora"] = true.into();
            std::fs::write(d.join("adapter_config.json"), c.to_string()).unwrap();
        });
        let e = load(d.path());
        assert!(
            matches!(e, Error::Unsupported(_)) && e.to_string().contains("use_dora"),
            "{e}"
        );
        // A saved full tensor that is not the base's.
        let d = copy(&|d| {
            let p = d.join("adapter_model.safetensors");
            let mut t = tensors(&p);
            let k = "base_model.model.lm_head.base_layer.weight";
            let (dt, sh, mut b) = t.remove(k).unwrap();
            b[0] ^= 0x40;
            t.insert(k.into(), (dt, sh, b));
            write_tensors(&p, &t);
        });
        let e = load(d.path());
        assert!(e.to_string().contains("base_layer"), "{e}");
        // Another model's adapter: wrong shapes, named.
        let other = peft_made()
            .into_iter()
            .find(|d| d.ends_with("qv-untied"))
            .unwrap();
        let e = LocalBackend::from_dir(
            fixture("tied"),
            LocalOptions::default().adapter(cases()[0].join("adapter")),
        )
        .map(|_| ())
        .unwrap_err();
        assert!(e.to_string().contains("shape"), "{e}");
        assert!(
            LocalBackend::from_dir(fixture("untied"), LocalOptions::default().adapter(other))
                .is_ok()
        );
    }
}
