//! The embedded candle backend: numerical fidelity against Hugging Face transformers,
//! gradients, sampling, stop rules, ordering, checkpoints, export.

use std::path::PathBuf;

use crate::local_common::*;
use rlvr::backend::local::{LocalBackend, LocalOptions, LocalSampler, Qwen3Config};
use rlvr::{
    PolicyBackend, Sampler,
    tokenizer::Tokenizer,
    types::{Datum, LossFn, ModelInput, SamplingParams, StopCondition, StopReason, TensorData},
};

#[tokio::test]
async fn logits_match_transformers() {
    check_against_transformers(&LocalOptions::default(), 1e-4).await;
}

#[tokio::test]
async fn every_trainable_tensor_gets_a_gradient() {
    for name in ["untied", "tied"] {
        // LoRA: B starts at zero, so A's gradient is zero on the first pass; after one step
        // every adapter tensor must receive a non-zero gradient.
        let b = backend(name, LocalOptions::default().lora(lora(4)));
        b.forward_backward(training_data(), LossFn::ImportanceSampling)
            .await
            .unwrap()
            .await
            .unwrap();
        b.optim_step(adam()).await.unwrap().await.unwrap();
        b.forward_backward(training_data(), LossFn::ImportanceSampling)
            .await
            .unwrap()
            .await
            .unwrap();
        let params = b.trainable_parameters().await.unwrap();
        // 7 adapted projections per layer × 2 layers + the head, each with A and B.
        assert_eq!(params.len(), 2 * (7 * 2 + 1));
        let norms = b.gradient_norms().await.unwrap();
        for (p, _) in &params {
            let n = norms.get(p).copied().unwrap_or(0.0);
            assert!(n > 0.0, "{name} LoRA: `{p}` got no gradient");
        }

        // Full fine-tuning: every weight, norms included.
        let b = backend(name, LocalOptions::default().full_finetune());
        b.forward_backward(training_data(), LossFn::ImportanceSampling)
            .await
            .unwrap()
            .await
            .unwrap();
        let params = b.trainable_parameters().await.unwrap();
        let expected = 1 + 2 * 11 + 1 + usize::from(name == "untied");
        assert_eq!(params.len(), expected);
        let norms = b.gradient_norms().await.unwrap();
        for (p, _) in &params {
            let n = norms.get(p).copied().unwrap_or(0.0);
            assert!(n > 0.0, "{name} full: `{p}` got no gradient");
        }
    }
}

#[tokio::test]
async fn lora_starts_at_the_base_and_moves_after_a_step() {
    let b = backend("untied", LocalOptions::default().lora(lora(4)));
    let before = probe(&b).await;
    let reference = b.reference_sampler().await.unwrap();
    let ids = &hf_case("untied").input_ids[0];
    let base = reference.compute_logprobs_blocking(ids).unwrap();
    for (t, l) in before.iter().enumerate() {
        assert!((base[t + 1].unwrap() - l).abs() < 1e-5);
    }
    b.forward_backward(training_data(), LossFn::ImportanceSampling)
        .await
        .unwrap()
        .await
        .unwrap();
    b.optim_step(adam()).await.unwrap().await.unwrap();
    let after = probe(&b).await;
    assert!(
        max_abs_diff(&before, &after) > 1e-4,
        "the step changed nothing"
    );
    // The reference sampler still samples from the base.
    let base2 = b
        .reference_sampler()
        .await
        .unwrap()
        .compute_logprobs_blocking(ids)
        .unwrap();
    assert_eq!(base, base2);
}

async fn trained(name: &str, opts: LocalOptions) -> LocalBackend {
    let b = backend(name, opts);
    train_step(&b).await;
    b
}

#[tokio::test]
async fn sampler_logprobs_equal_trainer_logprobs() {
    for opts in lora_and_full() {
        let b = trained("untied", opts).await;
        let seqs = check_sampler_against_trainer(&b, 1e-4).await;
        // compute_logprobs agrees too.
        let sampler = b.sampler().await.unwrap();
        for s in &seqs {
            let mut all = SAMPLE_PROMPT.to_vec();
            all.extend(&s.tokens);
            let c = sampler
                .compute_logprobs(&ModelInput::from_tokens(all))
                .await
                .unwrap();
            assert_eq!(c[0], None);
            let c: Vec<f32> = c[SAMPLE_PROMPT.len()..]
                .iter()
                .map(|x| x.unwrap())
                .collect();
            assert!(max_abs_diff(&c, &s.logprobs) < 1e-4);
        }
    }
}

#[tokio::test]
async fn greedy_is_deterministic_and_seeds_reproduce() {
    let b = backend("untied", LocalOptions::default());
    let s = b.sampler().await.unwrap();
    let prompt = ModelInput::from_tokens(vec![2, 3, 4]);
    let never = StopCondition::Strings(vec![]);
    let greedy = SamplingParams::default()
        .temperature(0.0)
        .max_tokens(10)
        .stop(never.clone());
    let a = s.sample(&prompt, 3, &greedy).await.unwrap();
    let b2 = s.sample(&prompt, 1, &greedy).await.unwrap();
    assert!(a.iter().all(|x| x.tokens == a[0].tokens));
    assert_eq!(a[0].tokens, b2[0].tokens);
    // Greedy picks the arg-max of the logits.
    let logits = s.logits_blocking(&[2, 3, 4]).unwrap();
    let last = logits.last().unwrap();
    let argmax = (0..last.len())
        .max_by(|&i, &j| last[i].total_cmp(&last[j]))
        .unwrap();
    assert_eq!(a[0].tokens[0] as usize, argmax);

    let seeded = SamplingParams::default()
        .max_tokens(10)
        .seed(42)
        .stop(never);
    let x = s.sample(&prompt, 4, &seeded).await.unwrap();
    let y = s.sample(&prompt, 4, &seeded).await.unwrap();
    assert_eq!(x, y);
    // top-k 1 is greedy whatever the temperature; the logprob stays the untruncated one.
    let topk = seeded.clone().top_k(1).temperature(1.0);
    let z = s.sample(&prompt, 2, &topk).await.unwrap();
    assert_eq!(z[0].tokens, a[0].tokens);
    assert!(max_abs_diff(&z[0].logprobs, &a[0].logprobs) < 1e-5);
    // A tiny top-p is greedy as well.
    let w = s
        .sample(&prompt, 2, &seeded.clone().top_p(1e-6))
        .await
        .unwrap();
    assert_eq!(w[1].tokens, a[0].tokens);
}

fn first_index(v: &[u32], t: u32) -> usize {
    v.iter().position(|&x| x == t).unwrap()
}

#[tokio::test]
async fn stop_rules_and_stop_reasons() {
    let b = backend("untied", LocalOptions::default());
    let s: LocalSampler = b.sampler().await.unwrap();
    let tok: Tokenizer = b.tokenizer().clone();
    let prompt = ModelInput::from_tokens(vec![10, 20, 30]);
    let greedy = SamplingParams::default().temperature(0.0).max_tokens(16);
    let free = s
        .sample(
            &prompt,
            1,
            &greedy.clone().stop(StopCondition::Strings(vec![])),
        )
        .await
        .unwrap()
        .remove(0);
    assert_eq!(free.stop_reason, StopReason::Length);
    assert_eq!(free.tokens.len(), 16);

    // A stop token: the sequence ends with it, included.
    let t = free.tokens[4];
    let i = first_index(&free.tokens, t);
    let got = s
        .sample(
            &prompt,
            2,
            &greedy.clone().stop(StopCondition::Tokens(vec![t])),
        )
        .await
        .unwrap();
    for g in &got {
        assert_eq!(g.stop_reason, StopReason::Stop);
        assert_eq!(g.tokens, free.tokens[..=i]);
        assert_eq!(g.logprobs, free.logprobs[..=i]);
    }

    // A stop string spanning two tokens: the sequence ends with the token completing it.
    let text = tok.decode(&free.tokens[5..7]).unwrap();
    let full = tok.decode(&free.tokens).unwrap();
    let end = full.find(&text).unwrap() + text.len();
    let got = s
        .sample(
            &prompt,
            1,
            &greedy
                .clone()
                .stop(StopCondition::Strings(vec![text.clone()])),
        )
        .await
        .unwrap()
        .remove(0);
    assert_eq!(got.stop_reason, StopReason::Stop);
    let decoded = tok.decode(&got.tokens).unwrap();
    assert!(
        decoded.ends_with(&text),
        "{decoded:?} should end with {text:?}"
    );
    assert_eq!(decoded.len(), end);

    // max_tokens.
    let got = s
        .sample(
            &prompt,
            1,
            &greedy
                .clone()
                .max_tokens(3)
                .stop(StopCondition::Strings(vec![])),
        )
        .await
        .unwrap()
        .remove(0);
    assert_eq!((got.tokens.len(), got.stop_reason), (3, StopReason::Length));

    // EOS stops when no stop condition is given: make free.tokens[6] the EOS.
    let eos = free.tokens[6];
    let i = first_index(&free.tokens, eos);
    let cfg = Qwen3Config::from_file(fixture("untied").join("config.json")).unwrap();
    let cfg = cfg.with_eos(None);
    let tok2 = Tokenizer::from_file(fixture("untied").join("tokenizer.json"))
        .unwrap()
        .with_eos(Some(eos));
    let dir = tempfile::tempdir().unwrap();
    // Export the same weights with the new EOS and reload them.
    b.export_hf(dir.path().join("m")).await.unwrap();
    std::fs::write(
        dir.path().join("m/config.json"),
        serde_json::to_string(&cfg).unwrap(),
    )
    .unwrap();
    std::fs::write(
        dir.path().join("m/tokenizer_config.json"),
        serde_json::json!({"eos_token": tok2.inner().id_to_token(eos).unwrap()}).to_string(),
    )
    .unwrap();
    let b3 = LocalBackend::from_dir(dir.path().join("m"), LocalOptions::default()).unwrap();
    assert_eq!(b3.tokenizer().eos_token_id(), Some(eos));
    let got = b3
        .sampler()
        .await
        .unwrap()
        .sample(&prompt, 1, &greedy)
        .await
        .unwrap()
        .remove(0);
    assert_eq!(got.stop_reason, StopReason::Stop);
    assert_eq!(got.tokens, free.tokens[..=i]);
    // ... and `Strings([])` never stops.
    let got = b3
        .sampler()
        .await
        .unwrap()
        .sample(
            &prompt,
            1,
            &greedy.clone().stop(StopCondition::Strings(vec![])),
        )
        .await
        .unwrap()
        .remove(0);
    assert_eq!(got.tokens, free.tokens);
}

#[tokio::test]
async fn bad_sampling_inputs_are_rejected() {
    let b = backend("untied", LocalOptions::default());
    let s = b.sampler().await.unwrap();
    let p = ModelInput::from_tokens(vec![1, 2]);
    for bad in [
        SamplingParams::default().temperature(-1.0),
        SamplingParams::default().top_p(0.0),
        SamplingParams::default().top_k(0),
    ] {
        assert!(s.sample(&p, 1, &bad).await.is_err());
    }
    let err = s
        .sample(
            &ModelInput::from_tokens(vec![1, 999]),
            1,
            &SamplingParams::default(),
        )
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("999"), "{err}");
    assert!(
        s.sample(&ModelInput::new(), 1, &SamplingParams::default())
            .await
            .is_err()
    );
}

#[tokio::test]
async fn pipelined_submission_equals_sequential() {
    for opts in lora_and_full() {
        let a = backend("untied", opts.clone());
        for _ in 0..2 {
            let fb = a
                .forward_backward(training_data(), LossFn::ImportanceSampling)
                .await
                .unwrap();
            let step = a.optim_step(adam()).await.unwrap();
            let s = a.sampler().await.unwrap();
            fb.await.unwrap();
            step.await.unwrap();
            drop(s);
        }
        let b = backend("untied", opts);
        for _ in 0..2 {
            b.forward_backward(training_data(), LossFn::ImportanceSampling)
                .await
                .unwrap()
                .await
                .unwrap();
            b.optim_step(adam()).await.unwrap().await.unwrap();
        }
        assert_eq!(probe(&a).await, probe(&b).await);
    }
}

#[tokio::test]
async fn save_then_load_resumes_bit_identically() {
    for opts in lora_and_full() {
        let dir = tempfile::tempdir().unwrap();
        let opts = opts.checkpoint_dir(dir.path());
        let a = trained("untied", opts.clone()).await;
        let ckpt = a.save_state("step1").await.unwrap();
        assert!(
            PathBuf::from(&ckpt.path)
                .join("params.safetensors")
                .is_file()
        );
        for _ in 0..2 {
            a.forward_backward(training_data(), LossFn::ImportanceSampling)
                .await
                .unwrap()
                .await
                .unwrap();
            a.optim_step(adam()).await.unwrap().await.unwrap();
        }
        let b = backend("untied", opts.clone());
        b.load_state(&ckpt).await.unwrap();
        for _ in 0..2 {
            b.forward_backward(training_data(), LossFn::ImportanceSampling)
                .await
                .unwrap()
                .await
                .unwrap();
            b.optim_step(adam()).await.unwrap().await.unwrap();
        }
        assert_eq!(probe(&a).await, probe(&b).await);
        // Saving again under the same name replaces the checkpoint; no temp dirs remain.
        a.save_state("step1").await.unwrap();
        let names: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
            .collect();
        assert_eq!(names, vec!["step1".to_string()]);
        assert!(a.save_state("../escape").await.is_err());
    }
    // A LoRA checkpoint does not load into a full fine-tune.
    let dir = tempfile::tempdir().unwrap();
    let a = backend("untied", LocalOptions::default().checkpoint_dir(dir.path()));
    let ckpt = a.save_state("x").await.unwrap();
    let b = backend("untied", LocalOptions::default().full_finetune());
    assert!(b.load_state(&ckpt).await.is_err());
}

#[tokio::test]
async fn export_writes_a_loadable_merged_model() {
    for opts in lora_and_full() {
        for name in ["untied", "tied"] {
            let b = trained(name, opts.clone()).await;
            let dir = tempfile::tempdir().unwrap();
            let out = dir.path().join("export");
            b.export_hf(&out).await.unwrap();
            let ids = &hf_case(name).input_ids[1];
            let want = b.sampler().await.unwrap().logits_blocking(ids).unwrap();
            let re = LocalBackend::from_dir(&out, LocalOptions::default()).unwrap();
            let got = re.sampler().await.unwrap().logits_blocking(ids).unwrap();
            for (g, w) in got.iter().zip(&want) {
                assert!(max_abs_diff(g, w) < 1e-4);
            }
            assert_eq!(re.tokenizer().eos_token_id(), b.tokenizer().eos_token_id());
        }
    }
}

#[tokio::test]
async fn random_models_are_seeded() {
    let vocab: Vec<String> = ["<eos>", "a", "b", "c"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let tok = rlvr::backend::local::char_tokenizer(&vocab, Some(0)).unwrap();
    assert_eq!(tok.encode("abca").unwrap(), vec![1, 2, 3, 1]);
    assert_eq!(tok.decode(&[1, 2, 0]).unwrap(), "ab<eos>");
    let cfg = Qwen3Config::new(4, 16, 24, 1, 2, 1, 8, 32);
    let logits = |seed: u64| {
        let b = LocalBackend::random(cfg.clone(), tok.clone(), LocalOptions::default().seed(seed))
            .unwrap();
        async move {
            b.sampler()
                .await
                .unwrap()
                .logits_blocking(&[1, 2, 3])
                .unwrap()
        }
    };
    assert_eq!(logits(1).await, logits(1).await);
    assert_ne!(logits(1).await, logits(2).await);
}

#[tokio::test]
async fn sharded_checkpoints_load_like_single_files() {
    let src = fixture("untied");
    let tensors =
        candle_core::safetensors::load(src.join("model.safetensors"), &candle_core::Device::Cpu)
            .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut names: Vec<&String> = tensors.keys().collect();
    names.sort();
    let mut shards: [std::collections::HashMap<String, candle_core::Tensor>; 2] =
        Default::default();
    let mut weight_map = serde_json::Map::new();
    for (i, n) in names.iter().enumerate() {
        let k = i % 2;
        shards[k].insert((*n).clone(), tensors[*n].clone());
        weight_map.insert(
            (*n).clone(),
            format!("model-0000{}-of-00002.safetensors", k + 1).into(),
        );
    }
    for (k, shard) in shards.iter().enumerate() {
        candle_core::safetensors::save(
            shard,
            dir.path()
                .join(format!("model-0000{}-of-00002.safetensors", k + 1)),
        )
        .unwrap();
    }
    std::fs::write(
        dir.path().join("model.safetensors.index.json"),
        serde_json::json!({"metadata": {}, "weight_map": weight_map}).to_string(),
    )
    .unwrap();
    for f in ["config.json", "tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(src.join(f), dir.path().join(f)).unwrap();
    }
    let ids = &hf_case("untied").input_ids[0];
    let a = backend("untied", LocalOptions::default());
    let b = LocalBackend::from_dir(dir.path(), LocalOptions::default()).unwrap();
    assert_eq!(
        a.sampler().await.unwrap().logits_blocking(ids).unwrap(),
        b.sampler().await.unwrap().logits_blocking(ids).unwrap()
    );

    // A missing tensor is named.
    std::fs::write(
        dir.path().join("model.safetensors.index.json"),
        serde_json::json!({"weight_map": {"model.norm.weight": "model-00001-of-00002.safetensors"}})
            .to_string(),
    )
    .unwrap();
    let err = LocalBackend::from_dir(dir.path(), LocalOptions::default())
        .unwrap_err()
        .to_string();
    assert!(err.contains("model.embed_tokens.weight"), "{err}");
}

#[test]
fn bad_configs_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("config.json");
    std::fs::write(&p, "{\"vocab_size\": 10,\n \"hidden_size\": }").unwrap();
    let err = Qwen3Config::from_file(&p).unwrap_err().to_string();
    assert!(
        err.contains("config.json") && err.contains("line 2"),
        "{err}"
    );
    let mut c = Qwen3Config::new(16, 8, 8, 1, 3, 2, 4, 16);
    let err = c.validate().unwrap_err().to_string();
    assert!(err.contains("num_key_value_heads"), "{err}");
    c = Qwen3Config::new(16, 8, 8, 1, 2, 2, 4, 16);
    c.validate().unwrap();
    // transformers 4 spelling of the RoPE base.
    let c: Qwen3Config = serde_json::from_str(
        r#"{"vocab_size":16,"hidden_size":8,"intermediate_size":8,"num_hidden_layers":1,
            "num_attention_heads":2,"num_key_value_heads":1,"rope_theta":1234.0,"eos_token_id":3}"#,
    )
    .unwrap();
    assert_eq!((c.rope_theta(), c.head_dim()), (1234.0, 4));
    assert_eq!(c.eos_token_ids(), vec![3]);
    // Other architectures and unsupported features are named.
    for (extra, field) in [
        (r#""model_type": "qwen3_next""#, "model_type"),
        (r#""use_sliding_window": true"#, "use_sliding_window"),
        (
            r#""rope_scaling": {"type": "yarn", "factor": 4.0}"#,
            "rope_scaling",
        ),
    ] {
        let text = format!(
            r#"{{"vocab_size":16,"hidden_size":8,"intermediate_size":8,"num_hidden_layers":1,
                "num_attention_heads":2,"num_key_value_heads":1, {extra}}}"#
        );
        let c: Qwen3Config = serde_json::from_str(&text).unwrap();
        let err = c.validate().unwrap_err().to_string();
        assert!(err.contains(field), "{err}");
    }
}

#[tokio::test]
async fn bad_training_data_is_named() {
    let b = backend("untied", LocalOptions::default());
    let mut d = training_data();
    d[1] = d[1].clone().with_advantages(vec![0.0; 3]);
    let err = b
        .forward_backward(d, LossFn::ImportanceSampling)
        .await
        .unwrap()
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("data[1]") && err.contains("advantages"),
        "{err}"
    );
    let mut d = training_data();
    let n = d[0].model_input.len();
    d[0].loss_fn_inputs
        .insert("target_tokens".into(), TensorData::i64(vec![70; n]));
    let err = b
        .forward_backward(d, LossFn::ImportanceSampling)
        .await
        .unwrap()
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("data[0]") && err.contains("70"), "{err}");
    // The backend keeps working after an error.
    b.forward_backward(training_data(), LossFn::ImportanceSampling)
        .await
        .unwrap()
        .await
        .unwrap();
}

#[tokio::test]
async fn loss_sum_is_the_sum_over_datums() {
    let b = backend("untied", LocalOptions::default());
    let data = training_data();
    let mut parts = 0.0;
    for d in &data {
        parts += b
            .forward(vec![d.clone()], LossFn::ImportanceSampling)
            .await
            .unwrap()
            .await
            .unwrap()
            .metrics["loss:sum"];
    }
    let all = b
        .forward(data, LossFn::ImportanceSampling)
        .await
        .unwrap()
        .await
        .unwrap();
    assert!((all.metrics["loss:sum"] - parts).abs() < 1e-4);
    assert_eq!(all.loss_fn_outputs.len(), 2);
}

#[tokio::test]
async fn forward_equals_forward_backward() {
    // `forward` runs without gradient tracking and with the fused kernels; its outputs must
    // be those of the training path. LoRA (after a step, so adapters are non-zero) and full
    // fine-tuning, tied and untied heads.
    for (name, opts) in [
        ("untied", LocalOptions::default().lora(lora(4))),
        ("tied", LocalOptions::default().lora(lora(4))),
        ("untied", LocalOptions::default().full_finetune()),
    ] {
        let b = trained(name, opts).await;
        for loss in [LossFn::ImportanceSampling, LossFn::CrossEntropy] {
            let data: Vec<Datum> = if loss == LossFn::CrossEntropy {
                hf_case(name)
                    .input_ids
                    .iter()
                    .map(|ids| ce_datum(ids))
                    .collect()
            } else {
                training_data()
            };
            let f = b.forward(data.clone(), loss).await.unwrap().await.unwrap();
            let fb = b.forward_backward(data, loss).await.unwrap().await.unwrap();
            assert_eq!(f.loss_fn_outputs.len(), fb.loss_fn_outputs.len());
            for (x, y) in f.loss_fn_outputs.iter().zip(&fb.loss_fn_outputs) {
                let d = max_abs_diff(
                    x["logprobs"].as_f32().unwrap(),
                    y["logprobs"].as_f32().unwrap(),
                );
                assert!(d < 1e-5, "{name} {loss:?}: logprobs differ by {d}");
            }
            for (k, v) in &fb.metrics {
                let w = f.metrics[k];
                assert!(
                    (v - w).abs() <= 1e-5 * v.abs().max(1.0),
                    "{name} {loss:?}: {k} {v} vs {w}"
                );
            }
        }
    }
}

#[tokio::test]
async fn a_dedicated_thread_pool_computes_the_same() {
    // The default pool (one thread per CPU), 1, 2 and 3 threads: the same training step and
    // the same samples, bit for bit.
    let seeded = SamplingParams::default()
        .max_tokens(8)
        .seed(3)
        .stop(StopCondition::Strings(vec![]));
    let prompt = ModelInput::from_tokens(vec![2, 3, 4]);
    let mut runs = Vec::new();
    for opts in [
        LocalOptions::default().lora(lora(4)),
        LocalOptions::default().lora(lora(4)).threads(1),
        LocalOptions::default().lora(lora(4)).threads(2),
        LocalOptions::default().full_finetune().threads(1),
        LocalOptions::default().full_finetune().threads(3),
    ] {
        let b = trained("untied", opts).await;
        let s = b.sampler().await.unwrap();
        runs.push((
            probe(&b).await,
            s.sample(&prompt, 4, &seeded).await.unwrap(),
        ));
    }
    for (i, run) in runs.iter().enumerate().skip(1) {
        let base = if i < 3 { &runs[0] } else { &runs[3] };
        assert_eq!(run.0, base.0, "run {i}");
        assert_eq!(run.1.len(), 4);
        for (x, y) in run.1.iter().zip(&base.1) {
            assert_eq!(x.tokens, y.tokens, "run {i}");
            assert_eq!(x.logprobs, y.logprobs, "run {i}");
        }
    }
    let err = LocalBackend::from_dir(fixture("untied"), LocalOptions::default().threads(0))
        .unwrap_err()
        .to_string();
    assert!(err.contains("threads"), "{err}");
}

#[tokio::test]
async fn split_batches_give_the_same_gradients() {
    let data: Vec<Datum> = (0..5)
        .map(|k| {
            let toks: Vec<u32> = (0..(6 + 3 * k))
                .map(|i| ((i * 5 + k) % 60 + 2) as u32)
                .collect();
            is_datum(&toks, k as usize)
        })
        .collect();
    let mut results = Vec::new();
    // One datum per pass (64 logits) versus everything in one pass.
    for budget in [64, 1 << 24] {
        let b = backend(
            "untied",
            LocalOptions::default()
                .max_batch_logits(budget)
                .lora(lora(4)),
        );
        let out = b
            .forward_backward(data.clone(), LossFn::ImportanceSampling)
            .await
            .unwrap()
            .await
            .unwrap();
        b.optim_step(adam()).await.unwrap().await.unwrap();
        let out2 = b
            .forward_backward(data.clone(), LossFn::ImportanceSampling)
            .await
            .unwrap()
            .await
            .unwrap();
        results.push((out, b.gradient_norms().await.unwrap(), out2));
    }
    let (a, b) = (&results[0], &results[1]);
    assert!((a.0.metrics["loss:sum"] - b.0.metrics["loss:sum"]).abs() < 1e-4);
    for (x, y) in a.0.loss_fn_outputs.iter().zip(&b.0.loss_fn_outputs) {
        let (x, y) = (
            x["logprobs"].as_f32().unwrap(),
            y["logprobs"].as_f32().unwrap(),
        );
        assert!(max_abs_diff(x, y) < 1e-5);
    }
    for (k, v) in &a.1 {
        assert!(
            (v - b.1[k]).abs() <= 1e-4 * v.max(1.0),
            "{k}: {v} vs {}",
            b.1[k]
        );
    }
    assert!((a.2.metrics["loss:sum"] - b.2.metrics["loss:sum"]).abs() < 1e-3);
}

#[cfg(feature = "hub")]
mod hub {
    use super::*;
    use axum::body::Body;
    use axum::extract::State;
    use axum::http::{HeaderMap, StatusCode, Uri};
    use axum::response::Response;
    use rlvr::hub::{Hub, HubOptions, HubRepo};
    use std::collections::HashMap;
    use std::sync::Arc;

    /// URL path → file content; answers like the hub's `resolve` endpoint.
    async fn serve(
        State(files): State<Arc<HashMap<String, Vec<u8>>>>,
        uri: Uri,
        headers: HeaderMap,
    ) -> Response {
        let Some(content) = files.get(uri.path()) else {
            return Response::builder()
                .status(StatusCode::NOT_FOUND)
                .header("x-error-code", "EntryNotFound")
                .body(Body::from("Entry not found"))
                .unwrap();
        };
        let len = content.len();
        let range = headers
            .get("range")
            .and_then(|v| v.to_str().ok())
            .and_then(|r| r.strip_prefix("bytes="))
            .and_then(|r| r.split_once('-'))
            .map(|(a, b)| {
                let a: usize = a.parse().unwrap();
                let b: usize = b.parse::<usize>().unwrap_or(len - 1).min(len - 1);
                (a, b)
            })
            .unwrap_or((0, len - 1));
        Response::builder()
            .status(StatusCode::PARTIAL_CONTENT)
            .header("etag", format!("\"{len:08x}{}\"", uri.path().len()))
            .header("x-repo-commit", "0123456789abcdef0123456789abcdef01234567")
            .header("accept-ranges", "bytes")
            .header(
                "content-range",
                format!("bytes {}-{}/{len}", range.0, range.1),
            )
            .body(Body::from(content[range.0..=range.1].to_vec()))
            .unwrap()
    }

    #[tokio::test]
    async fn from_hub_downloads_and_loads_a_model() {
        let mut files = HashMap::new();
        for f in [
            "config.json",
            "model.safetensors",
            "tokenizer.json",
            "tokenizer_config.json",
        ] {
            files.insert(
                format!("/test-org/tiny-qwen3/resolve/main/{f}"),
                std::fs::read(fixture("untied").join(f)).unwrap(),
            );
        }
        let app = axum::Router::new()
            .fallback(serve)
            .with_state(Arc::new(files));
        let addr = crate::common::serve(app).await;
        let cache = tempfile::tempdir().unwrap();
        let hub = Hub::new(
            &HubOptions::default()
                .with_endpoint(format!("http://{addr}"))
                .with_cache_dir(cache.path())
                .with_offline(false),
        )
        .unwrap();
        let b = LocalBackend::from_pretrained_with(
            &hub,
            &HubRepo::model("test-org/tiny-qwen3"),
            LocalOptions::default(),
        )
        .await
        .unwrap();
        let case = hf_case("untied");
        let got = b
            .sampler()
            .await
            .unwrap()
            .logits_blocking(&case.input_ids[0])
            .unwrap();
        assert!(max_abs_diff(&got[3], &case.logits[0][3]) < 1e-4);
        assert_eq!(b.tokenizer().eos_token_id(), Some(1));

        let err = LocalBackend::from_pretrained_with(
            &hub,
            &HubRepo::model("test-org/missing"),
            LocalOptions::default(),
        )
        .await
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("test-org/missing") && err.contains("config.json"),
            "{err}"
        );
    }
}

/// A random model wide enough (hidden size 256) that candle's CPU matrix product gives a row
/// a different result in the last bits depending on how many rows are multiplied with it.
fn wide_random_backend(opts: LocalOptions) -> LocalBackend {
    let vocab: Vec<String> = (0..512).map(|i| format!("t{i}")).collect();
    let tokenizer = rlvr::backend::local::char_tokenizer(&vocab, None).unwrap();
    let config = Qwen3Config::new(512, 256, 512, 2, 4, 2, 64, 256);
    LocalBackend::random(config, tokenizer, opts).unwrap()
}

#[tokio::test]
async fn concurrent_requests_are_bit_identical_to_solo_runs() {
    // By default each `sample` call is decoded on its own, so what it returns cannot depend
    // on which other requests happen to arrive at the same time.
    let b = wide_random_backend(LocalOptions::default().full_finetune());
    let s = b.sampler().await.unwrap();
    let never = StopCondition::Strings(vec![]);
    let reqs: Vec<(ModelInput, usize, SamplingParams)> = vec![
        (
            ModelInput::from_tokens(vec![3, 4, 5]),
            1,
            SamplingParams::default()
                .max_tokens(10)
                .temperature(0.0)
                .stop(never.clone()),
        ),
        (
            ModelInput::from_tokens((1..30).collect()),
            5,
            SamplingParams::default()
                .max_tokens(10)
                .seed(2)
                .stop(never.clone()),
        ),
        (
            ModelInput::from_tokens(vec![9, 9]),
            3,
            SamplingParams::default()
                .max_tokens(10)
                .seed(3)
                .top_k(20)
                .stop(never),
        ),
    ];
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
    let together =
        futures::future::join_all(reqs.iter().map(|(p, n, sp)| s.sample(p, *n, sp))).await;
    for ((p, n, sp), got) in reqs.iter().zip(together) {
        let got = got.unwrap();
        let solo = s.sample_blocking(&p.to_tokens(), *n, sp).unwrap();
        assert_eq!(got.len(), *n);
        for (g, o) in got.iter().zip(&solo) {
            assert_eq!(g.tokens, o.tokens);
            assert_eq!(
                bits(&g.logprobs),
                bits(&o.logprobs),
                "prompt {:?}",
                p.to_tokens()
            );
            assert_eq!(g.stop_reason, o.stop_reason);
        }
    }
}

#[tokio::test]
async fn concurrent_requests_are_batched_and_match_solo_runs() {
    let b = trained(
        "untied",
        LocalOptions::default()
            .lora(lora(4))
            .batch_concurrent_requests(true),
    )
    .await;
    let s = b.sampler().await.unwrap();
    let never = StopCondition::Strings(vec![]);
    // Prompts of different lengths, different parameters and stop rules.
    let reqs: Vec<(ModelInput, usize, SamplingParams)> = vec![
        (
            ModelInput::from_tokens(vec![5, 9, 17, 33, 2, 8, 40]),
            3,
            SamplingParams::default()
                .max_tokens(9)
                .seed(1)
                .stop(never.clone()),
        ),
        (
            ModelInput::from_tokens(vec![11]),
            2,
            SamplingParams::default()
                .max_tokens(14)
                .temperature(0.0)
                .stop(never.clone()),
        ),
        (
            ModelInput::from_tokens(vec![3, 4, 5]),
            4,
            SamplingParams::default()
                .max_tokens(6)
                .seed(2)
                .top_k(5)
                .stop(StopCondition::Tokens(vec![7, 8, 9, 10, 11, 12])),
        ),
        (
            ModelInput::from_tokens(vec![1, 2]),
            0,
            SamplingParams::default(),
        ),
    ];
    let together =
        futures::future::join_all(reqs.iter().map(|(p, n, sp)| s.sample(p, *n, sp))).await;
    for ((p, n, sp), got) in reqs.iter().zip(together) {
        let got = got.unwrap();
        let solo = s.sample_blocking(&p.to_tokens(), *n, sp).unwrap();
        assert_eq!(got.len(), *n);
        for (g, o) in got.iter().zip(&solo) {
            assert_eq!(g.tokens, o.tokens);
            assert_eq!(g.stop_reason, o.stop_reason);
            assert!(max_abs_diff(&g.logprobs, &o.logprobs) < 1e-5);
            // And both equal the trainer's logprobs.
            let mut all = p.to_tokens();
            all.extend(&g.tokens);
            let c = s
                .compute_logprobs(&ModelInput::from_tokens(all))
                .await
                .unwrap();
            let c: Vec<f32> = c[p.len()..].iter().map(|x| x.unwrap()).collect();
            assert!(max_abs_diff(&c, &g.logprobs) < 1e-4);
        }
    }
    // A bad request fails alone.
    let bad = SamplingParams::default().top_p(2.0);
    let good = SamplingParams::default().max_tokens(3).seed(5);
    let p = ModelInput::from_tokens(vec![4, 5]);
    let (x, y) = futures::join!(s.sample(&p, 1, &bad), s.sample(&p, 2, &good));
    assert!(x.is_err());
    assert_eq!(y.unwrap().len(), 2);
}

#[tokio::test]
async fn long_generations_grow_the_cache() {
    // More tokens than the initial decoding room of the KV cache.
    let vocab: Vec<String> = ["<eos>", "a", "b", "c"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let tok = rlvr::backend::local::char_tokenizer(&vocab, Some(0)).unwrap();
    let cfg = Qwen3Config::new(4, 16, 24, 1, 2, 1, 8, 400);
    let b = LocalBackend::random(cfg, tok, LocalOptions::default()).unwrap();
    let s = b.sampler().await.unwrap();
    let out = s
        .sample_blocking(
            &[1, 2, 3],
            2,
            &SamplingParams::default()
                .seed(9)
                .stop(StopCondition::Strings(vec![])),
        )
        .unwrap();
    // No max_tokens: up to the context limit.
    assert_eq!(out[0].tokens.len(), 400 - 3);
    assert_eq!(out[0].stop_reason, StopReason::Length);
    let mut all = vec![1, 2, 3];
    all.extend(&out[1].tokens);
    let c = s.compute_logprobs_blocking(&all).unwrap();
    let c: Vec<f32> = c[3..].iter().map(|x| x.unwrap()).collect();
    assert!(max_abs_diff(&c, &out[1].logprobs) < 1e-4);
}
