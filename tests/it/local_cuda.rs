//! The embedded candle backend on a CUDA GPU (feature `cuda`, device 0): the CPU's numbers
//! within float tolerance. Logits against transformers; every trainable tensor gets a
//! gradient (the training path must not go through one of candle's fused CUDA ops, which
//! have no backward pass); training steps move the model as they do on the CPU; the
//! sampler's log-probabilities equal the trainer's; a checkpoint saved on the GPU loads on
//! the CPU.
//!
//! Built only with `--features cuda` (which needs CUDA's `nvcc`); there these tests need a
//! GPU and fail, naming the error, without one.

use crate::local_common::*;
use rlvr::PolicyBackend;
use rlvr::backend::local::{LocalDevice, LocalOptions};

/// How far the GPU's results may be from the CPU's (or transformers'): both compute in f32,
/// in other orders (cuBLAS against gemm, other reductions).
const TOL: f32 = 2e-3;

fn cuda(opts: LocalOptions) -> LocalOptions {
    opts.device(LocalDevice::Cuda(0))
}

#[tokio::test]
async fn cuda_logits_match_transformers() {
    check_against_transformers(&cuda(LocalOptions::default()), TOL).await;
}

#[tokio::test]
async fn cuda_every_trainable_tensor_gets_a_gradient() {
    for opts in lora_and_full() {
        let b = backend("untied", cuda(opts.clone()));
        let norms = gradients_after_a_step(&b).await;
        let params = b.trainable_parameters().await.unwrap();
        assert!(!params.is_empty());
        for (p, _) in &params {
            let n = norms.get(p).copied().unwrap_or(0.0);
            assert!(n > 0.0, "{opts:?}: `{p}` got no gradient on CUDA");
        }
        // The same gradients as on the CPU, tensor by tensor.
        let cpu = gradients_after_a_step(&backend("untied", opts.clone())).await;
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
    for opts in lora_and_full() {
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
    for opts in lora_and_full() {
        let b = backend("untied", cuda(opts));
        train_step(&b).await;
        let seqs = check_sampler_against_trainer(&b, TOL).await;
        // Seeded sampling reproduces on the GPU too.
        let again = check_sampler_against_trainer(&b, TOL).await;
        assert_eq!(seqs, again);
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
