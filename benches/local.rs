//! Throughput of the local candle backend.
//!
//! ```text
//! cargo bench --bench local                      # criterion, the benchmark config
//! cargo bench --bench local -- --compare [--config bench|realistic] [--threads N] [--iters N]
//!                                          [--tune-allocator]
//! cargo bench --features cuda --bench local -- --compare --cuda   # on CUDA device 0
//! ```
//!
//! Two configurations (Qwen3 architecture, f32, random weights, seed 0, tied embeddings):
//!
//! - `bench`: vocabulary 512, hidden 128, MLP 384, 4 layers, 4 heads / 2 KV heads (head
//!   dim 32): 855k parameters. Training batches of 16 × 256 tokens; sampling of 64 new
//!   tokens after a 32-token prompt, batches of 1, 8 and 64.
//! - `realistic`: vocabulary 32,768, hidden 1024, MLP 3072, 2 layers, 16 heads / 8 KV heads
//!   (head dim 64): 59M parameters. Training batches of 4 × 512 tokens; sampling of 128 new
//!   tokens, batch 64.
//!
//! - `train/full` and `train/lora8`: one `forward_backward` (cross-entropy) + `optim_step`,
//!   full-parameter and LoRA rank 8. Throughput in tokens.
//! - `sample/nB`: a 32-token prompt, new tokens per sequence (no stop), temperature 1, `B`
//!   sequences in one batch. Throughput in generated tokens.
//! - `gemm/peak` (`--compare` only): one 2048 × 2048 × 2048 f32 product with the `gemm`
//!   crate (the kernels the backend uses) on `--threads` threads, in FLOP/s.
//!
//! `--compare` prints one line per benchmark (`name tokens/s` as the median of `--iters`
//! timed iterations after one warm-up, and for training the model FLOPs per token), the
//! format of `benches/pytorch_local.py`, followed by the process's minor page faults and
//! system CPU seconds per timed iteration (`getrusage`); `benches/compare.sh` runs both and
//! prints the ratios. `--tune-allocator` sets `LocalOptions::tune_allocator` (off by
//! default, as in the library).

use std::time::Instant;

use criterion::{Criterion, Throughput, criterion_group};
use rlvr::backend::local::{LocalBackend, LocalDevice, LocalOptions, Qwen3Config, char_tokenizer};
use rlvr::types::LoraConfig;
use rlvr::{
    PolicyBackend, Sampler,
    types::{AdamParams, Datum, LossFn, ModelInput, SamplingParams, TensorData},
};

const PROMPT: usize = 32;

/// A benchmark configuration.
#[derive(Clone, Copy)]
struct Bench {
    name: &'static str,
    vocab: usize,
    hidden: usize,
    mlp: usize,
    layers: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    batch: usize,
    seq: usize,
    new_tokens: u32,
    sample_batches: &'static [usize],
}

const BENCH: Bench = Bench {
    name: "bench",
    vocab: 512,
    hidden: 128,
    mlp: 384,
    layers: 4,
    heads: 4,
    kv_heads: 2,
    head_dim: 32,
    batch: 16,
    seq: 256,
    new_tokens: 64,
    sample_batches: &[1, 8, 64],
};

const REALISTIC: Bench = Bench {
    name: "realistic",
    vocab: 32_768,
    hidden: 1024,
    mlp: 3072,
    layers: 2,
    heads: 16,
    kv_heads: 8,
    head_dim: 64,
    batch: 4,
    seq: 512,
    new_tokens: 128,
    sample_batches: &[64],
};

impl Bench {
    fn config(&self) -> Qwen3Config {
        Qwen3Config::new(
            self.vocab,
            self.hidden,
            self.mlp,
            self.layers,
            self.heads,
            self.kv_heads,
            self.head_dim,
            1024,
        )
        .with_tied_embeddings(true)
        .with_rope_theta(10_000.0)
    }

    fn backend(&self, opts: LocalOptions) -> LocalBackend {
        // One character per token; no EOS, so sampling always runs to `max_tokens`.
        let vocab: Vec<String> = (0..self.vocab as u32)
            .map(|i| char::from_u32(0x100 + i).unwrap().to_string())
            .collect();
        let tokenizer = char_tokenizer(&vocab, None).unwrap();
        LocalBackend::random(self.config(), tokenizer, opts.seed(0)).unwrap()
    }

    /// A deterministic pseudo-random token stream (xorshift).
    fn tokens(&self, n: usize, seed: u64) -> Vec<u32> {
        let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x % self.vocab as u64) as u32
            })
            .collect()
    }

    fn batch(&self) -> Vec<Datum> {
        (0..self.batch)
            .map(|i| {
                let t = self.tokens(self.seq + 1, i as u64 + 1);
                Datum::new(ModelInput::from_tokens(t[..self.seq].to_vec()))
                    .with_input(
                        "target_tokens",
                        TensorData::i64(t[1..].iter().map(|&x| x as i64).collect()),
                    )
                    .with_input("weights", TensorData::f32(vec![1.0; self.seq]))
            })
            .collect()
    }

    /// Model FLOPs per trained token: 2 per weight of every matrix product (the tied
    /// unembedding included) and 4·t·heads·head_dim per layer for the attention (full
    /// `t × t` scores, as both sides compute them) in the forward pass; the backward pass
    /// twice that, less the weight gradients of a frozen base (LoRA).
    fn train_flops_per_token(&self, full: bool) -> f64 {
        let (h, q, kv) = (
            self.hidden,
            self.heads * self.head_dim,
            self.kv_heads * self.head_dim,
        );
        let per_layer = h * q * 2 + h * kv * 2 + 3 * h * self.mlp;
        let n = (self.layers * per_layer + self.vocab * h) as f64;
        let attn = (self.layers * 4 * self.seq * q) as f64;
        let weights = if full { 6.0 } else { 4.0 };
        weights * n + 3.0 * attn
    }
}

fn adam() -> AdamParams {
    AdamParams {
        learning_rate: 1e-4,
        ..AdamParams::default()
    }
}

fn train_step(rt: &tokio::runtime::Runtime, backend: &LocalBackend, data: &[Datum]) {
    rt.block_on(async {
        let fb = backend
            .forward_backward(data.to_vec(), LossFn::CrossEntropy)
            .await
            .unwrap();
        let opt = backend.optim_step(adam()).await.unwrap();
        fb.await.unwrap();
        opt.await.unwrap();
    })
}

fn modes() -> [(&'static str, LocalOptions); 2] {
    [
        ("full", LocalOptions::default().full_finetune()),
        ("lora8", LocalOptions::default().lora(LoraConfig::new(8))),
    ]
}

fn train(c: &mut Criterion) {
    let b = BENCH;
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut group = c.benchmark_group("train");
    group.sample_size(10);
    group.throughput(Throughput::Elements((b.batch * b.seq) as u64));
    for (name, opts) in modes() {
        let backend = b.backend(opts);
        let data = b.batch();
        group.bench_function(name, |bench| {
            bench.iter(|| train_step(&rt, &backend, &data))
        });
    }
    group.finish();
}

fn sample(c: &mut Criterion) {
    let b = BENCH;
    let rt = tokio::runtime::Runtime::new().unwrap();
    let backend = b.backend(LocalOptions::default().lora(LoraConfig::new(8)));
    let sampler = rt.block_on(backend.sampler()).unwrap();
    let prompt = ModelInput::from_tokens(b.tokens(PROMPT, 99));
    let mut group = c.benchmark_group("sample");
    group.sample_size(10);
    for &n in &b.sample_batches[..2] {
        group.throughput(Throughput::Elements(n as u64 * b.new_tokens as u64));
        let params = SamplingParams::default().max_tokens(b.new_tokens).seed(1);
        group.bench_function(format!("n{n}"), |bench| {
            bench.iter(|| {
                let out = rt.block_on(sampler.sample(&prompt, n, &params)).unwrap();
                assert!(out.iter().all(|s| s.tokens.len() == b.new_tokens as usize));
            })
        });
    }
    group.finish();
}

criterion_group!(benches, train, sample);

/// Minor page faults and system CPU seconds of the whole process so far.
fn usage() -> (f64, f64) {
    // SAFETY: `getrusage` writes the struct it is given.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    let sys = u.ru_stime.tv_sec as f64 + u.ru_stime.tv_usec as f64 * 1e-6;
    (u.ru_minflt as f64, sys)
}

/// [`median_secs`], and the minor page faults and system CPU seconds per timed iteration.
fn timed(iters: usize, mut f: impl FnMut()) -> (f64, String) {
    let mut before = (0.0, 0.0);
    let mut n = 0;
    let secs = median_secs(iters, || {
        if n == 1 {
            before = usage();
        }
        n += 1;
        f()
    });
    let after = usage();
    let k = (n - 1).max(1) as f64;
    let per = format!(
        "{:.0} faults/iter {:.3} sys-s/iter",
        (after.0 - before.0) / k,
        (after.1 - before.1) / k
    );
    (secs, per)
}

/// The median of `iters` timings of `f` (seconds) after one untimed run.
fn median_secs(iters: usize, mut f: impl FnMut()) -> f64 {
    f();
    let mut ts: Vec<f64> = (0..iters.max(1))
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .collect();
    ts.sort_by(|a, b| a.total_cmp(b));
    let n = ts.len();
    if n % 2 == 1 {
        ts[n / 2]
    } else {
        (ts[n / 2 - 1] + ts[n / 2]) / 2.0
    }
}

/// FLOP/s of one `n × n × n` f32 product with the `gemm` crate on `threads` threads.
fn gemm_peak(n: usize, threads: usize, iters: usize) -> f64 {
    let a: Vec<f32> = (0..n * n).map(|i| (i % 7) as f32 * 0.1).collect();
    let b: Vec<f32> = (0..n * n).map(|i| (i % 5) as f32 * 0.1).collect();
    let mut c = vec![0f32; n * n];
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap();
    let parallelism = if threads > 1 {
        gemm::Parallelism::Rayon(threads)
    } else {
        gemm::Parallelism::None
    };
    let secs = pool.install(|| {
        median_secs(iters, || unsafe {
            // SAFETY: a, b, c are n × n row-major matrices.
            gemm::gemm(
                n,
                n,
                n,
                c.as_mut_ptr(),
                1,
                n as isize,
                false,
                a.as_ptr(),
                1,
                n as isize,
                b.as_ptr(),
                1,
                n as isize,
                0.0,
                1.0,
                false,
                false,
                false,
                parallelism,
            )
        })
    });
    2.0 * (n * n * n) as f64 / secs
}

fn compare(args: &[String]) {
    let value = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let b = match value("--config").as_deref() {
        None | Some("bench") => BENCH,
        Some("realistic") => REALISTIC,
        Some(other) => panic!("unknown --config {other} (bench or realistic)"),
    };
    let threads: Option<usize> = value("--threads").map(|t| t.parse().expect("--threads N"));
    let iters: usize = value("--iters").map_or(5, |t| t.parse().expect("--iters N"));
    let only: Option<String> = value("--only");
    let wants = |name: &str| only.as_deref().is_none_or(|o| name.starts_with(o));
    let cuda = args.iter().any(|a| a == "--cuda");
    let tune = args.iter().any(|a| a == "--tune-allocator");
    let with_settings = |o: LocalOptions| {
        let o = o.tune_allocator(tune);
        let o = if cuda {
            o.device(LocalDevice::Cuda(0))
        } else {
            o
        };
        match threads {
            Some(n) => o.threads(n),
            None => o,
        }
    };
    let n_threads =
        threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    println!(
        "rlvr local, config {}, threads {}{}{}",
        b.name,
        threads.map_or("default".to_string(), |n| format!("{n}")),
        if cuda { ", CUDA device 0" } else { "" },
        if tune { ", allocator tuned" } else { "" }
    );
    // The `gemm` crate's peak is the CPU's: not measured for a CUDA run.
    if wants("gemm") && !cuda {
        println!(
            "gemm/peak {:.3e} flop/s",
            gemm_peak(2048, n_threads, iters.min(5))
        );
    }
    let rt = tokio::runtime::Runtime::new().unwrap();
    for (name, opts) in modes() {
        let name = format!("train/{name}");
        if !wants(&name) {
            continue;
        }
        let backend = b.backend(with_settings(opts));
        let data = b.batch();
        let (secs, per) = timed(iters, || train_step(&rt, &backend, &data));
        let flops = b.train_flops_per_token(name == "train/full");
        println!(
            "{name} {:.1} tokens/s {flops:.4e} flop/token {per}",
            (b.batch * b.seq) as f64 / secs
        );
    }
    let backend = b.backend(with_settings(
        LocalOptions::default().lora(LoraConfig::new(8)),
    ));
    let sampler = rt.block_on(backend.sampler()).unwrap();
    let prompt = ModelInput::from_tokens(b.tokens(PROMPT, 99));
    for &n in b.sample_batches {
        let name = format!("sample/n{n}");
        if !wants(&name) {
            continue;
        }
        let params = SamplingParams::default().max_tokens(b.new_tokens).seed(1);
        let (secs, per) = timed(iters, || {
            let out = rt.block_on(sampler.sample(&prompt, n, &params)).unwrap();
            assert!(out.iter().all(|s| s.tokens.len() == b.new_tokens as usize));
        });
        println!(
            "{name} {:.1} tokens/s {per}",
            (n * b.new_tokens as usize) as f64 / secs
        );
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.iter().any(|a| a == "--compare") {
        compare(&args);
        return;
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
