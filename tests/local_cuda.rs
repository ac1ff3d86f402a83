//! The embedded candle backend on a CUDA GPU (feature `cuda`, device 0): the CPU's numbers
//! within float tolerance. Logits against transformers; every trainable tensor gets a
//! gradient (the training path must not go through one of candle's fused CUDA ops, which
//! have no backward pass); training steps move the model as they do on the CPU; the
//! sampler's log-probabilities equal the trainer's; a checkpoint saved on the GPU loads on
//! the CPU.
//!
//! Built only with `--features cuda` (which needs CUDA's `nvcc`); there these tests need a
//! GPU and fail, naming the error, without one.
#![cfg(feature = "cuda")]

mod local_common;

use local_common::*;
use rlvr::backend::local::{LocalDevice, LocalOptions};
use rlvr::{LossFn, ModelInput, PolicyBackend, Sampler, SamplingParams, StopCondition};

/// How far the GPU's results may be from the CPU's (or transformers'): both compute in f32,
/// in other orders (cuBLAS against gemm, other reductions).
const TOL: f32 = 2e-3;

fn cuda(opts: LocalOptions) -> LocalOptions {
    opts.device(LocalDevice::Cuda(0))
}

#[tokio::test]
async fn cuda_logits_match_transformers() {
    for name in ["untied", "tied"] {
        let case = hf_case(name);
        let b = backend(name, cuda(LocalOptions::default()));
        let sampler = b.sampler().await.unwrap();
        for (ids, want) in case.input_ids.iter().zip(&case.logits) {
            let got = sampler.logits_blocking(ids).unwrap();
            assert_eq!(got.len(), want.len());
            for (g, w) in got.iter().zip(want) {
                let d = max_abs_diff(g, w);
                assert!(
                    d < TOL,
                    "{name}: CUDA logits differ from transformers' by {d}"
                );
            }
            let out = b
                .forward(vec![ce_datum(ids)], LossFn::CrossEntropy)
                .await
                .unwrap()
                .await
                .unwrap();
            let lp = out.loss_fn_outputs[0]["logprobs"].as_f32().unwrap();
            for (t, &l) in lp.iter().enumerate() {
                let want = log_softmax(&want[t])[ids[t + 1] as usize];
                assert!(
                    (l as f64 - want).abs() < TOL as f64,
                    "{name}: CUDA trainer logprob {l} vs transformers {want} at {t}"
                );
            }
        }
    }
}

#[tokio::test]
async fn cuda_every_trainable_tensor_gets_a_gradient() {
    for opts in [
        LocalOptions::default().lora(lora(4)),
        LocalOptions::default().full_finetune(),
    ] {
        let b = backend("untied", cuda(opts.clone()));
        // LoRA's B starts at zero (A's first gradient is zero): one step, then look.
        train_step(&b).await;
        b.forward_backward(training_data(), LossFn::ImportanceSampling)
            .await
            .unwrap()
            .await
            .unwrap();
        let params = b.trainable_parameters().await.unwrap();
        assert!(!params.is_empty());
        let norms = b.gradient_norms().await.unwrap();
        for (p, _) in &params {
            let n = norms.get(p).copied().unwrap_or(0.0);
            assert!(n > 0.0, "{opts:?}: `{p}` got no gradient on CUDA");
        }
        // The same gradients as on the CPU, tensor by tensor.
        let c = backend("untied", opts.clone());
        train_step(&c).await;
        c.forward_backward(training_data(), LossFn::ImportanceSampling)
            .await
            .unwrap()
            .await
            .unwrap();
        let cpu = c.gradient_norms().await.unwrap();
        for (p, n) in &norms {
            let m = cpu[p];
            assert!(
                (n - m).abs() <= 1e-2 * m.abs().max(1e-3),
                "`{p}`: gradient norm {n} on CUDA, {m} on the CPU"
            );
        }
    }
}

#[tokio::test]
async fn cuda_training_follows_the_cpu() {
    for opts in [
        LocalOptions::default().lora(lora(4)),
        LocalOptions::default().full_finetune(),
    ] {
        let g = backend("untied", cuda(opts.clone()));
        let c = backend("untied", opts.clone());
        let before = probe(&g).await;
        for k in 0..3 {
            let (lg, lc) = (train_step(&g).await, train_step(&c).await);
            assert!(
                (lg - lc).abs() <= 1e-3 * lc.abs().max(1.0),
                "{opts:?} step {k}: loss {lg} on CUDA, {lc} on the CPU"
            );
        }
        let (pg, pc) = (probe(&g).await, probe(&c).await);
        assert!(
            max_abs_diff(&before, &pg) > 1e-3,
            "{opts:?}: CUDA training changed nothing"
        );
        let d = max_abs_diff(&pg, &pc);
        assert!(
            d < TOL,
            "{opts:?}: after 3 steps CUDA and CPU differ by {d}"
        );
    }
}

#[tokio::test]
async fn cuda_sampler_logprobs_equal_trainer_logprobs() {
    for opts in [
        LocalOptions::default().lora(lora(4)),
        LocalOptions::default().full_finetune(),
    ] {
        let b = backend("untied", cuda(opts));
        train_step(&b).await;
        let sampler = b.sampler().await.unwrap();
        let prompt = vec![5u32, 9, 17, 33];
        let params = SamplingParams::default()
            .max_tokens(12)
            .seed(3)
            .stop(StopCondition::Strings(vec![]));
        let seqs = sampler
            .sample(&ModelInput::from_tokens(prompt.clone()), 4, &params)
            .await
            .unwrap();
        assert_eq!(seqs.len(), 4);
        for s in &seqs {
            assert_eq!(s.tokens.len(), 12);
            let mut all = prompt.clone();
            all.extend(&s.tokens);
            let out = b
                .forward(vec![ce_datum(&all)], LossFn::CrossEntropy)
                .await
                .unwrap()
                .await
                .unwrap();
            let lp = out.loss_fn_outputs[0]["logprobs"].as_f32().unwrap();
            let d = max_abs_diff(&lp[prompt.len() - 1..], &s.logprobs);
            assert!(d < TOL, "CUDA sampler vs trainer logprobs differ by {d}");
        }
        // Seeded sampling reproduces on the GPU too.
        let again = sampler
            .sample(&ModelInput::from_tokens(prompt.clone()), 4, &params)
            .await
            .unwrap();
        assert_eq!(
            seqs.iter().map(|s| &s.tokens).collect::<Vec<_>>(),
            again.iter().map(|s| &s.tokens).collect::<Vec<_>>()
        );
    }
}

#[tokio::test]
async fn cuda_checkpoints_load_on_the_cpu() {
    let dir = tempfile::tempdir().unwrap();
    let opts = LocalOptions::default()
        .lora(lora(4))
        .checkpoint_dir(dir.path());
    let g = backend("untied", cuda(opts.clone()));
    train_step(&g).await;
    let ckpt = g.save_state("gpu").await.unwrap();
    let c = backend("untied", opts);
    c.load_state(&ckpt).await.unwrap();
    let d = max_abs_diff(&probe(&g).await, &probe(&c).await);
    assert!(
        d < TOL,
        "a CUDA checkpoint loaded on the CPU differs by {d}"
    );
}
