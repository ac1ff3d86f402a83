//! Throughput of the local candle backend on a fixed small configuration.
//!
//! ```text
//! cargo bench --bench local
//! ```
//!
//! The model: Qwen3 architecture, vocabulary 512, hidden 128, MLP 384, 4 layers, 4 heads /
//! 2 KV heads (head dim 32), tied embeddings: 855k parameters, random weights (seed 0).
//!
//! - `train/full` and `train/lora8`: one `forward_backward` (cross-entropy, 16 sequences of
//!   256 tokens) + `optim_step`, full-parameter and LoRA rank 8. Throughput in tokens.
//! - `sample/n1` and `sample/n8`: a 32-token prompt, 64 new tokens per sequence (no stop),
//!   temperature 1, one or eight sequences in one batch. Throughput in generated tokens.
//!
//! `benches/pytorch_local.py` runs the same configuration in PyTorch; `docs/benchmarks.md`
//! has the figures side by side.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use rlvr::backend::local::{char_tokenizer, LocalBackend, LocalOptions, Qwen3Config};
use rlvr::types::LoraConfig;
use rlvr::{
    AdamParams, Datum, LossFn, ModelInput, PolicyBackend, Sampler, SamplingParams, TensorData,
};

const VOCAB: usize = 512;
const BATCH: usize = 16;
const SEQ: usize = 256;
const PROMPT: usize = 32;
const NEW_TOKENS: u32 = 64;

fn config() -> Qwen3Config {
    Qwen3Config::new(VOCAB, 128, 384, 4, 4, 2, 32, 1024)
        .with_tied_embeddings(true)
        .with_rope_theta(10_000.0)
}

fn backend(opts: LocalOptions) -> LocalBackend {
    // One character per token; no EOS, so sampling always runs to `max_tokens`.
    let vocab: Vec<String> = (0..VOCAB as u32)
        .map(|i| char::from_u32(0x100 + i).unwrap().to_string())
        .collect();
    let tokenizer = char_tokenizer(&vocab, None).unwrap();
    LocalBackend::random(config(), tokenizer, opts.seed(0)).unwrap()
}

/// A deterministic pseudo-random token stream (xorshift).
fn tokens(n: usize, seed: u64) -> Vec<u32> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % VOCAB as u64) as u32
        })
        .collect()
}

fn batch() -> Vec<Datum> {
    (0..BATCH)
        .map(|i| {
            let t = tokens(SEQ + 1, i as u64 + 1);
            Datum::new(ModelInput::from_tokens(t[..SEQ].to_vec()))
                .with_input(
                    "target_tokens",
                    TensorData::i64(t[1..].iter().map(|&x| x as i64).collect()),
                )
                .with_input("weights", TensorData::f32(vec![1.0; SEQ]))
        })
        .collect()
}

fn train(c: &mut Criterion) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut group = c.benchmark_group("train");
    group.sample_size(10);
    group.throughput(Throughput::Elements((BATCH * SEQ) as u64));
    let adam = AdamParams {
        learning_rate: 1e-4,
        ..AdamParams::default()
    };
    for (name, opts) in [
        ("full", LocalOptions::default().full_finetune()),
        ("lora8", LocalOptions::default().lora(LoraConfig::new(8))),
    ] {
        let backend = backend(opts);
        let data = batch();
        group.bench_function(name, |b| {
            b.iter(|| {
                rt.block_on(async {
                    let fb = backend
                        .forward_backward(data.clone(), LossFn::CrossEntropy)
                        .await
                        .unwrap();
                    let opt = backend.optim_step(adam).await.unwrap();
                    fb.await.unwrap();
                    opt.await.unwrap();
                })
            })
        });
    }
    group.finish();
}

fn sample(c: &mut Criterion) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let backend = backend(LocalOptions::default().lora(LoraConfig::new(8)));
    let sampler = rt.block_on(backend.sampler()).unwrap();
    let prompt = ModelInput::from_tokens(tokens(PROMPT, 99));
    let mut group = c.benchmark_group("sample");
    group.sample_size(10);
    for n in [1usize, 8] {
        group.throughput(Throughput::Elements(n as u64 * NEW_TOKENS as u64));
        let params = SamplingParams::default().max_tokens(NEW_TOKENS).seed(1);
        group.bench_function(format!("n{n}"), |b| {
            b.iter(|| {
                let out = rt.block_on(sampler.sample(&prompt, n, &params)).unwrap();
                assert!(out.iter().all(|s| s.tokens.len() == NEW_TOKENS as usize));
            })
        });
    }
    group.finish();
}

criterion_group!(benches, train, sample);
criterion_main!(benches);
