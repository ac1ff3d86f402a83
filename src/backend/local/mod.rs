//! Embedded local backend (candle): a Qwen3-architecture model trained in-process, with LoRA
//! adapters (the base frozen and shared with every sampler) or full-parameter fine-tuning.
//!
//! Operations run on one dedicated worker thread, in submission order, like Tinker's
//! per-model sequencing: `optim_step` submitted before the result of `forward_backward` is
//! awaited runs after it. Samplers are snapshots and sample on tokio's blocking pool,
//! concurrently with training; concurrent `sample` calls on one sampler are each decoded as
//! their own batch of `num_samples` rows (or together, as one batch, with
//! [`LocalOptions::batch_concurrent_requests`]): one after another when a call's work is
//! large enough for all the backend's threads, else side by side, one call per thread (see
//! Threads below).
//!
//! Determinism: on the CPU a `sample` call's tokens and logprobs are a function of the
//! weights, the prompt and the sampling parameters (seed included), bit for bit, so a resumed
//! training run reproduces an uninterrupted one. Batching concurrent requests gives that up:
//! candle's matrix product (the `gemm` crate) sums a row's products in an order that depends
//! on how many rows are multiplied together (with a hidden size of 256 already one row alone
//! and the same row among two differ in the last bits), so a request's logprobs, and
//! occasionally its tokens, would depend on which other requests happened to arrive within
//! the same millisecond.
//!
//! Numerics: f32; the training path uses kernels of its own with a backward pass (the
//! attention, RMSNorm, RoPE, SwiGLU, the projections with their adapters, the target
//! tokens' log-probabilities; candle's fused ones have none). On the CPU in f32 its
//! backward pass is written out layer by layer (`tape.rs`: no autograd graph, no zero
//! tensor and add per node; the loss from the log-probabilities on stays on candle's
//! autograd), elsewhere candle's autograd runs the same ops; the sampling path uses
//! candle's fused kernels; AdamW updates f32 CPU parameters in place;
//! logits match Hugging Face transformers' Qwen3 within 1e-4 (tested on a committed fixture).
//! LoRA uses `alpha = 32` ([`LORA_ALPHA`]), `A` Kaiming-uniform (seeded), `B = 0`.
//!
//! Memory layout: samplers read their projection matrices stored transposed (each
//! `[out, in]` weight with strides `(1, out)`), the layout in which the `gemm` kernels use a
//! decoding step's weights as they are instead of repacking every matrix at every token. A
//! LoRA backend keeps its frozen base in that layout only (training reads it too); a full
//! fine-tuning sampler's snapshot is made in it; a tied model's samplers carry one more
//! matrix, the embedding transposed as the LM head. Exported models are row-major as usual.
//!
//! Threads: the backend runs its training operations and its samplers' decoding on a rayon
//! pool of its own, of [`LocalOptions::threads`] threads (default: one per CPU the process
//! may run on), and needs no environment variable. Matrix products go through the `gemm`
//! kernels with the backend's own policy (not candle's, which reads `RAYON_NUM_THREADS` and
//! `/proc/cpuinfo` on every product and splits even the smallest ones): a product is split
//! between the pool's threads only when it has at least 2²¹ multiply-adds per thread, so a
//! decoding step of a small model stays on one thread while a training step's large
//! products use them all. Likewise a `sample` call or a `forward_backward` whose MLP
//! product is below that size runs on a one-thread pool of the backend's (the other
//! threads' wake-ups and spinning would cost more than they save); the backend has one
//! such pool per thread, and concurrent small `sample` calls (a step's groups) are decoded
//! side by side on them, so a small model's sampling uses every CPU at coarse grain
//! instead of one. Each call is still decoded alone, on one thread, so its result does not
//! depend on which pool ran it nor on what ran beside it. The training path's
//! fused kernels (attention softmax, RMSNorm, RoPE) split rows between threads only when
//! there are enough of them. None of this changes a result: every element of a product is
//! the same sum in the same order whatever the number of threads, and the fused kernels
//! compute each row alone, so a seed gives the same run on 1 thread as on 8.
//!
//! candle splits large element-wise operations (≥ 64k values) over a pool of its own whose
//! threads spin-wait at a barrier after each one, sized by `CANDLE_NUM_THREADS` (else
//! `RAYON_NUM_THREADS`, else the number of physical cores); that split does not change
//! results either. The training pass's sums and element-wise passes are the backend's own,
//! on its pool, so that candle's spinning does not take the cores from the pass's
//! products.
//!
//! Memory: the training pass's large buffers (activations, attention weights, logits,
//! gradients) are the same every step; the backend keeps them in a pool of its own and
//! hands them out again instead of having the C allocator map fresh memory, which the
//! kernel page-faults and zero-fills, every step (with glibc's default settings, up to a
//! sixth of a full fine-tuning step). Each backend has its own pool, used by its own threads
//! only; it keeps at most what one `forward_backward` took from it, and is freed with the
//! backend. [`tune_allocator`] (process-wide, off by default, see
//! [`LocalOptions::tune_allocator`]) is no longer needed for that.
//!
//! ```
//! # tokio::runtime::Runtime::new().unwrap().block_on(async {
//! use rlvr::backend::local::{LocalBackend, LocalOptions, Qwen3Config};
//! use rlvr::{tokenizer::Tokenizer, types::{ModelInput, SamplingParams}, PolicyBackend, Sampler};
//!
//! // A character-level tokenizer and a tiny random Qwen3.
//! let mut vocab = vec!["<eos>".to_string()];
//! vocab.extend(" abcdefghijklmnopqrstuvwxyz".chars().map(String::from));
//! let tokenizer = rlvr::backend::local::char_tokenizer(&vocab, Some(0)).unwrap();
//! let config = Qwen3Config::new(vocab.len(), 16, 32, 1, 2, 1, 8, 64).with_eos(Some(0));
//! let backend = LocalBackend::random(config, tokenizer, LocalOptions::default()).unwrap();
//! let sampler = backend.sampler().await.unwrap();
//! let out = sampler
//!     .sample(&ModelInput::from_tokens(vec![3, 4]), 2, &SamplingParams::default().max_tokens(5).seed(1))
//!     .await
//!     .unwrap();
//! assert_eq!(out.len(), 2);
//! assert!(out[0].tokens.len() <= 5);
//! # });
//! ```

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, mpsc};

use async_trait::async_trait;
use candle_core::{Device, Tensor, Var};

mod buffers;
mod config;
mod fused;
mod lora;
mod loss;
mod matmul;
mod model;
mod optim;
mod pool;
#[cfg(feature = "hub")]
mod pretrained;
mod sampler;
mod tape;
#[cfg(test)]
mod test_util;
mod vmath;

pub use config::Qwen3Config;
pub use lora::LORA_ALPHA;
pub use sampler::LocalSampler;

use crate::backend::{Pending, PolicyBackend};
use crate::error::{Error, Result};
use crate::tokenizer::Tokenizer;
use crate::types::{
    AdamParams, CheckpointRef, Datum, ForwardBackwardOutput, LoraConfig, LossFn, LossInput,
    OptimStepOutput, TensorData, TokenId,
};
use model::{Adapters, Mode, Model, Rope, Weights, be};
use sampler::Shared;

/// The device the local backend computes on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LocalDevice {
    /// The CPU (f32).
    #[default]
    Cpu,
    /// A CUDA GPU by ordinal (needs the `cuda` feature).
    Cuda(usize),
}

impl LocalDevice {
    fn to_candle(self) -> Result<Device> {
        match self {
            LocalDevice::Cpu => Ok(Device::Cpu),
            LocalDevice::Cuda(i) => {
                Device::new_cuda(i).map_err(|e| Error::Unsupported(format!("CUDA device {i}: {e}")))
            }
        }
    }
}

/// Options of a [`LocalBackend`] (build with [`Default`] and the builder methods).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct LocalOptions {
    /// LoRA adapters to train (`None`: full-parameter fine-tuning, every weight trainable).
    pub lora: Option<LoraConfig>,
    /// Seed of random weights ([`LocalBackend::random`]).
    pub seed: u64,
    /// Where to compute.
    pub device: LocalDevice,
    /// Directory of `save_state` checkpoints, used as given.
    ///
    /// `None`: `<log_dir>/checkpoints` when a [`GrpoTrainer`](crate::GrpoTrainer) with a run
    /// directory drives the backend ([`PolicyBackend::use_run_dir`]); otherwise a new
    /// directory for each backend instance,
    /// `<cache>/rlvr/local-checkpoints/<seconds since 1970>-<process id>-<random>`, where
    /// `<cache>` is `$XDG_CACHE_HOME`, else `~/.cache`, else the temporary directory. Like
    /// Tinker's checkpoints, which belong to their training run, two backends (in one
    /// process or two) saving the same name never overwrite each other. Resuming is not
    /// affected: [`load_state`](crate::PolicyBackend::load_state) reads the path recorded in
    /// the [`CheckpointRef`], whichever backend instance (or process) saved it. Nothing is
    /// deleted automatically; pass a directory inside the run's own output (as the `gsm8k`
    /// example does) to keep a run's checkpoints with it.
    pub checkpoint_dir: Option<PathBuf>,
    /// Most logits (datums × padded length × vocabulary) computed in one training forward
    /// pass; a `forward_backward` over more is split into several passes whose gradients are
    /// summed (at least one datum per pass). Default 2²⁴ (64 MiB of f32 logits).
    pub max_batch_logits: usize,
    /// Threads of the backend's own rayon pool, which runs its training operations and its
    /// samplers' decoding (`None`: one per CPU the process may run on,
    /// [`std::thread::available_parallelism`]). Must be at least 1. With more than one, the
    /// backend also keeps as many one-thread pools, on which work too small to split (a small
    /// model's `sample` calls) runs, concurrent calls side by side. Results do not depend on
    /// it (see the [module documentation](self)); on a machine busy with other work, fewer
    /// threads than CPUs can be faster.
    pub threads: Option<usize>,
    /// Whether a sampler decodes concurrent [`sample`](crate::Sampler::sample) calls (those
    /// queued within about a millisecond of each other) together in one batch. Default
    /// `false`.
    ///
    /// Batching is faster when many groups are sampled at once (one matrix product per layer
    /// for all their rows instead of one per group), but it is not deterministic: which
    /// requests end up in the same batch depends on timing, and the batch's shape (its
    /// number of rows, and the left padding of shorter prompts) changes the order of the
    /// floating-point sums in the matrix products and the attention. A request's logprobs
    /// then differ from a solo run in the last bits, and, through them, a sampled token can
    /// occasionally differ too. With `false` (the default) every `sample` call is decoded as
    /// its own batch of `num_samples` rows, so its tokens and logprobs depend only on the
    /// weights, the prompt and the [`SamplingParams`](crate::types::SamplingParams) (seed included),
    /// and a resumed run reproduces an uninterrupted one bit for bit on the CPU.
    pub batch_concurrent_requests: bool,
    /// Whether creating the backend (on the CPU) calls [`tune_allocator`], which changes the
    /// **whole process's** C allocator settings so that large blocks stay in its heap and are
    /// reused. Process-wide: every thread started after it shares one malloc arena, and the
    /// process keeps its peak heap instead of returning freed memory to the system — right
    /// for a program that only trains, wrong for a library to do unasked. Default `false`:
    /// the allocator is left as it is. The backend reuses its training step's large buffers
    /// itself either way (see the [module documentation](self)); what this adds is the same
    /// for the rest: candle's own tensors, the samplers' caches, the caller's allocations.
    /// The examples turn it on.
    pub tune_allocator: bool,
    /// A LoRA adapter to start from ("train on Tinker, evaluate locally"): a PEFT adapter
    /// directory (written by [`crate::weights::build_lora_adapter`] or by `peft`'s
    /// `save_pretrained`), a Tinker adapter as `weights.download` leaves it, or a LoRA
    /// checkpoint of this backend. Its rank and adapted modules replace [`lora`](Self::lora)'s
    /// (whose `seed` is kept); its `B` is rescaled to this backend's `32 / rank`. Plain LoRA
    /// only (rsLoRA scaling is read; DoRA, biases, per-module ranks are refused), on this
    /// model's q/k/v/o, gate/up/down projections and output head.
    pub adapter: Option<PathBuf>,
    /// Whether the backend's threads reuse buffers from its [pool](pool) (tests compare
    /// with a backend that does not).
    #[cfg(test)]
    pub(crate) buffer_pool: bool,
}

impl Default for LocalOptions {
    fn default() -> Self {
        LocalOptions {
            lora: Some(LoraConfig::default()),
            seed: 0,
            device: LocalDevice::Cpu,
            checkpoint_dir: None,
            max_batch_logits: 1 << 24,
            threads: None,
            batch_concurrent_requests: false,
            tune_allocator: false,
            adapter: None,
            #[cfg(test)]
            buffer_pool: true,
        }
    }
}

impl LocalOptions {
    /// LoRA training with `lora` (builder style).
    pub fn lora(mut self, lora: LoraConfig) -> Self {
        self.lora = Some(lora);
        self
    }
    /// Full-parameter training (builder style).
    pub fn full_finetune(mut self) -> Self {
        self.lora = None;
        self
    }
    /// Sets the seed (builder style).
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }
    /// Sets the checkpoint directory (builder style).
    pub fn checkpoint_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.checkpoint_dir = Some(dir.into());
        self
    }
    /// Sets [`max_batch_logits`](Self::max_batch_logits) (builder style).
    pub fn max_batch_logits(mut self, n: usize) -> Self {
        self.max_batch_logits = n;
        self
    }
    /// Sets the device (builder style).
    pub fn device(mut self, device: LocalDevice) -> Self {
        self.device = device;
        self
    }
    /// Runs the backend on a pool of `n` threads instead of one per CPU
    /// ([`threads`](Self::threads); builder style).
    pub fn threads(mut self, n: usize) -> Self {
        self.threads = Some(n);
        self
    }
    /// Sets [`batch_concurrent_requests`](Self::batch_concurrent_requests): faster sampling
    /// of concurrent requests, at the cost of bit-for-bit reproducibility (builder style).
    pub fn batch_concurrent_requests(mut self, on: bool) -> Self {
        self.batch_concurrent_requests = on;
        self
    }
    /// Starts the LoRA adapters from the adapter directory `dir` ([`adapter`](Self::adapter);
    /// builder style).
    pub fn adapter(mut self, dir: impl Into<PathBuf>) -> Self {
        self.adapter = Some(dir.into());
        self
    }
    /// Sets [`tune_allocator`](Self::tune_allocator) (builder style): `false` leaves the
    /// process's allocator settings alone.
    pub fn tune_allocator(mut self, on: bool) -> Self {
        self.tune_allocator = on;
        self
    }
}

/// The default size of the backend's pool: one thread per CPU this process may run on.
fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// A checkpoint directory of its own for one backend instance (see
/// [`LocalOptions::checkpoint_dir`]); created when the first checkpoint is saved.
fn default_checkpoint_dir() -> PathBuf {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir);
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let instance = format!(
        "{secs}-{}-{:016x}",
        std::process::id(),
        rand::random::<u64>()
    );
    base.join("rlvr").join("local-checkpoints").join(instance)
}

/// Tunes the process's allocator for the local backend's many large, short-lived tensors;
/// returns whether it did. Process-wide. A [`LocalBackend`] calls it when created on the CPU
/// if [`LocalOptions::tune_allocator`] is `true` (it is `false` by default); calling it
/// again changes nothing.
///
/// With glibc's defaults, large buffers are fresh `mmap`s, so every tensor of a training
/// step is page-faulted and zeroed by the kernel and unmapped again when dropped (about a
/// fifth of the CPU time of a small model). This keeps them in the heap instead, so freed
/// memory is reused:
///
/// - allocation threshold for `mmap` raised to 32 MiB, heap trimming only above 1 GiB,
///   64 MiB of padding per heap extension;
/// - no new arena for the threads started from now on, and no `mmap` for single large
///   blocks (`M_ARENA_MAX` 1, `M_MMAP_MAX` 0): new threads share the main arena (or, when
///   other threads made arenas of their own before the call, one of those). The backend's
///   threads would otherwise each get an arena of their own, whose heaps hold at most
///   64 MiB: a block larger than that (a 32k-token vocabulary's `[V, h]` gradient, a 64 MiB
///   chunk of logits) is always a fresh `mmap` there, and a heap emptied by the step is
///   unmapped whole, so the next step faults it in again. Full fine-tuning of a
///   59M-parameter model (vocabulary 32k, 4 × 512 tokens, two threads) took ≈ 0.5 M page
///   faults a step that way, about a sixth of the step.
///
/// The backend no longer needs it for its own training step, whose large buffers it reuses
/// itself (realistic full fine-tuning on two threads: ≈ 154k faults a step without this,
/// 89k with it; LoRA 6k and none; `cargo bench --bench local -- --compare --config
/// realistic --threads 2 --only train [--tune-allocator]`); it still keeps the rest (candle's
/// own tensors, the samplers' caches, the caller's allocations) from being mapped afresh.
///
/// The price is that the process keeps up to its peak heap (≤ 1 GiB more than it uses) for
/// reuse instead of returning it to the system, and that threads share one arena's lock.
/// Threads that allocated before the call keep the arena they have: call it at the top of
/// `main`, before a runtime starts its threads, for every thread to use the main arena. The
/// same can be had without code with `GLIBC_TUNABLES=glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=1073741824:glibc.malloc.top_pad=67108864:glibc.malloc.arena_max=1:glibc.malloc.mmap_max=0`.
///
/// Does nothing (returns `false`) on other C libraries than glibc.
///
/// ```
/// let tuned = rlvr::backend::local::tune_allocator();
/// assert_eq!(tuned, cfg!(all(target_os = "linux", target_env = "gnu")));
/// ```
pub fn tune_allocator() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallopt only changes allocator parameters; glibc serialises it with the
        // arenas' locks, so it is sound at any time.
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20) == 1
                && libc::mallopt(libc::M_TRIM_THRESHOLD, 1 << 30) == 1
                && libc::mallopt(libc::M_TOP_PAD, 64 << 20) == 1
                && libc::mallopt(libc::M_ARENA_MAX, 1) == 1
                && libc::mallopt(libc::M_MMAP_MAX, 0) == 1
        }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}

/// A character-level tokenizer: token `i` is `vocab[i]`; text is encoded character by
/// character (characters not in `vocab` become token 0) and decoded by concatenation.
/// Multi-character entries (`"<eos>"`) are only produced by the model. Meant for tests and
/// toy models.
pub fn char_tokenizer(vocab: &[String], eos: Option<TokenId>) -> Result<Tokenizer> {
    let mut v = serde_json::Map::new();
    for (i, t) in vocab.iter().enumerate() {
        if v.insert(t.clone(), serde_json::Value::from(i)).is_some() {
            return Err(Error::Tokenizer(format!("token `{t}` appears twice")));
        }
    }
    let json = serde_json::json!({
        "version": "1.0",
        "added_tokens": [],
        "normalizer": null,
        "pre_tokenizer": null,
        "post_processor": null,
        "decoder": {"type": "Fuse"},
        "model": {"type": "BPE", "vocab": v, "merges": [], "unk_token": vocab.first().cloned().unwrap_or_default()},
    });
    let tok = Tokenizer::from_bytes(json.to_string().as_bytes())?;
    Ok(tok.with_eos(eos))
}

/// Trainer-side state, owned by the worker thread.
struct State {
    shared: Arc<Shared>,
    /// The model weights: the frozen base (LoRA) or the `Var` tensors (full fine-tuning).
    weights: Arc<Weights>,
    /// The reference (initial) weights for `reference_sampler`.
    reference: Arc<Weights>,
    /// LoRA adapters (views over the trainable `Var`s).
    adapters: Option<Adapters>,
    /// The trainable parameters, by name.
    params: Vec<(String, Var)>,
    lora: Option<LoraConfig>,
    acc: optim::GradAccumulator,
    opt: optim::AdamW,
    /// `None` until the first checkpoint (or [`PolicyBackend::use_run_dir`]) picks one.
    checkpoint_dir: Option<PathBuf>,
    max_batch_logits: usize,
}

type Job = Box<dyn FnOnce(&mut State) + Send>;

/// The embedded candle backend. See the [module documentation](self).
pub struct LocalBackend {
    shared: Arc<Shared>,
    jobs: mpsc::Sender<Job>,
    lora: Option<LoraConfig>,
}

impl std::fmt::Debug for LocalBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalBackend")
            .field("config", &self.shared.cfg)
            .field("lora", &self.lora)
            .finish_non_exhaustive()
    }
}

impl LocalBackend {
    /// Loads a Hugging Face model directory: `config.json`, `tokenizer.json` (+
    /// `tokenizer_config.json` when present) and the safetensors weights (single file or
    /// sharded with `model.safetensors.index.json`).
    pub fn from_dir(dir: impl AsRef<Path>, opts: LocalOptions) -> Result<Self> {
        let dir = dir.as_ref();
        let cfg = Qwen3Config::from_file(dir.join("config.json"))?;
        let mut tokenizer = Tokenizer::from_file(dir.join("tokenizer.json"))?;
        if tokenizer.eos_token_id().is_none() {
            tokenizer = tokenizer.with_eos(cfg.eos_token_ids().first().copied());
        }
        let device = opts.device.to_candle()?;
        let weights = Weights::load(dir, &cfg, &device)?;
        Self::build(cfg, tokenizer, weights, device, opts)
    }

    /// A model with random weights (N(0, `initializer_range`²), seeded by `opts.seed`).
    pub fn random(config: Qwen3Config, tokenizer: Tokenizer, opts: LocalOptions) -> Result<Self> {
        config.validate()?;
        let device = opts.device.to_candle()?;
        let weights = Weights::random(&config, opts.seed, &device)?;
        Self::build(config, tokenizer, weights, device, opts)
    }

    fn build(
        cfg: Qwen3Config,
        tokenizer: Tokenizer,
        weights: Weights,
        device: Device,
        opts: LocalOptions,
    ) -> Result<Self> {
        if tokenizer.vocab_size() > cfg.vocab_size {
            return Err(Error::config(
                "vocab_size",
                format!(
                    "the tokenizer has {} tokens but the model only {}",
                    tokenizer.vocab_size(),
                    cfg.vocab_size
                ),
            ));
        }
        let n = match opts.threads {
            None => default_threads(),
            Some(0) => return Err(Error::config("threads", "must be at least 1")),
            Some(n) => n,
        };
        // The backend's threads take their large buffers from the backend's own pool.
        let buffers = Arc::new(pool::BufferPool::default());
        #[cfg(test)]
        let buffers = opts.buffer_pool.then_some(buffers);
        #[cfg(not(test))]
        let buffers = Some(buffers);
        let new_pool = |n: usize, name: &'static str| {
            let buffers = buffers.clone();
            rayon::ThreadPoolBuilder::new()
                .num_threads(n)
                .thread_name(move |i| format!("{name}-{i}"))
                .start_handler(move |_| {
                    if let Some(b) = &buffers {
                        pool::enter(b.clone())
                    }
                })
                .build()
                .map(Arc::new)
                .map_err(|e| Error::Backend(format!("starting {n} threads: {e}")))
        };
        matmul::tune_gemm();
        if opts.tune_allocator && device.is_cpu() {
            tune_allocator();
        }
        let pool = Some(new_pool(n, "rlvr-local")?);
        let lanes = if n > 1 {
            (0..n)
                .map(|_| new_pool(1, "rlvr-local-lane"))
                .collect::<Result<Vec<_>>>()?
        } else {
            Vec::new()
        };
        let rope = Rope::new(&cfg, &device)?;
        let shared = Arc::new(Shared {
            cfg,
            rope,
            tokenizer,
            device: device.clone(),
            pool,
            lanes,
            batch_requests: opts.batch_concurrent_requests,
        });
        let mut lora_config = opts.lora;
        let (weights, reference, adapters, params) = match (&opts.adapter, &opts.lora) {
            (Some(dir), _) => {
                let adapter = crate::weights::LoraAdapter::load(dir)?;
                let base = |name: &str| {
                    let map = weights.map();
                    map.get(name)
                        .or_else(|| {
                            (name == "lm_head.weight")
                                .then(|| map.get(model::EMBED))
                                .flatten()
                        })
                        .cloned()
                };
                let seed = opts.lora.and_then(|l| l.seed);
                let (lora, params, adapters) =
                    lora::adapters_from(&shared.cfg, &adapter, seed, &base, &device)?;
                lora_config = Some(lora);
                let base = Arc::new(weights.into_decoding(&shared.cfg)?);
                (base.clone(), base, Some(adapters), params)
            }
            (None, Some(lora)) => {
                let (params, adapters) = lora::init_adapters(&shared.cfg, lora, &device)?;
                // One copy of the frozen base, in the samplers' layout, for training too.
                let base = Arc::new(weights.into_decoding(&shared.cfg)?);
                (base.clone(), base, Some(adapters), params)
            }
            (None, None) => {
                // Only samplers read it.
                let reference = Arc::new(weights.decoding_copy(&shared.cfg)?);
                let mut params = Vec::new();
                let mut map = BTreeMap::new();
                for (name, t) in weights.map() {
                    let var = Var::from_tensor(t).map_err(be("creating parameters"))?;
                    map.insert(name.clone(), var.as_tensor().clone());
                    params.push((name.clone(), var));
                }
                (
                    Arc::new(Weights::from_map(&shared.cfg, map)?),
                    reference,
                    None,
                    params,
                )
            }
        };
        let state = State {
            shared: shared.clone(),
            weights,
            reference,
            adapters,
            params,
            lora: lora_config,
            acc: optim::GradAccumulator::new(),
            opt: optim::AdamW::new(),
            checkpoint_dir: opts.checkpoint_dir.clone(),
            max_batch_logits: opts.max_batch_logits,
        };
        let (tx, rx) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("rlvr-local-worker".into())
            .spawn(move || {
                let mut state = state;
                while let Ok(job) = rx.recv() {
                    let shared = state.shared.clone();
                    shared.run(|| job(&mut state));
                }
            })
            .map_err(|e| Error::Backend(format!("starting the worker thread: {e}")))?;
        Ok(LocalBackend {
            shared,
            jobs: tx,
            lora: lora_config,
        })
    }

    /// The model configuration.
    pub fn config(&self) -> &Qwen3Config {
        &self.shared.cfg
    }

    /// The LoRA configuration (`None`: full fine-tuning).
    pub fn lora_config(&self) -> Option<&LoraConfig> {
        self.lora.as_ref()
    }

    /// Queues `f` on the worker; the returned `Pending` resolves with its result.
    fn submit<T: Send + 'static>(
        &self,
        what: &'static str,
        f: impl FnOnce(&mut State) -> Result<T> + Send + 'static,
    ) -> Result<Pending<T>> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let job: Job = Box::new(move |state: &mut State| {
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(state)))
                .unwrap_or_else(|p| {
                    let msg = p
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                        .unwrap_or_else(|| "unknown panic".into());
                    Err(Error::Backend(format!("{what} panicked: {msg}")))
                });
            let _ = tx.send(r);
        });
        self.jobs
            .send(job)
            .map_err(|_| Error::Cancelled(format!("{what}: the local worker has stopped")))?;
        Ok(Pending::new(async move {
            rx.await
                .map_err(|_| Error::Cancelled(format!("{what}: the local worker has stopped")))?
        }))
    }

    /// Writes the current (merged) weights as a Hugging Face directory: `config.json`,
    /// `model.safetensors`, `tokenizer.json`, `tokenizer_config.json`. The directory is
    /// written next to `dir` and renamed into place (an existing `dir` is replaced).
    pub async fn export_hf(&self, dir: impl AsRef<Path>) -> Result<()> {
        let dir = dir.as_ref().to_path_buf();
        self.submit("export", move |s| s.export(&dir))?.await
    }

    /// The L2 norm of every trainable tensor's accumulated gradient (since the last
    /// `optim_step`), by parameter name; parameters without a gradient are absent.
    pub async fn gradient_norms(&self) -> Result<BTreeMap<String, f64>> {
        self.submit("gradient_norms", |s| s.acc.norms())?.await
    }

    /// Names and shapes of the trainable tensors.
    pub async fn trainable_parameters(&self) -> Result<Vec<(String, Vec<usize>)>> {
        self.submit("trainable_parameters", |s| {
            Ok(s.params
                .iter()
                .map(|(n, v)| (n.clone(), v.dims().to_vec()))
                .collect())
        })?
        .await
    }
}

/// Converts a loss input to a 1-D f32 tensor.
fn input_tensor(d: &Datum, input: LossInput, device: &Device) -> Result<Option<Tensor>> {
    match d.loss_input(input) {
        None => Ok(None),
        Some(t) => Tensor::new(t.to_f32_vec(), device)
            .map(Some)
            .map_err(be("loss input")),
    }
}

impl State {
    /// Checks a datum and returns its input tokens and target ids (`None` when empty).
    fn prepare(
        &self,
        index: usize,
        d: &Datum,
        loss: &LossFn,
    ) -> Result<Option<(Vec<TokenId>, Vec<TokenId>)>> {
        d.validate(loss)
            .map_err(|e| Error::config(format!("data[{index}]"), e.to_string()))?;
        let tokens = d.model_input.to_tokens();
        if tokens.is_empty() {
            return Ok(None);
        }
        self.shared
            .check_tokens(&tokens, &format!("data[{index}].model_input"))?;
        let field = || format!("data[{index}].loss_fn_inputs.target_tokens");
        let targets = d
            .target_tokens()
            .ok_or_else(|| Error::config(field(), "missing or not int64"))?;
        let targets = targets
            .iter()
            .enumerate()
            .map(|(i, &t)| {
                TokenId::try_from(t)
                    .ok()
                    .filter(|&t| (t as usize) < self.shared.cfg.vocab_size)
                    .ok_or_else(|| {
                        Error::config(
                            format!("{}[{i}]", field()),
                            format!(
                                "{t} is outside the vocabulary ({})",
                                self.shared.cfg.vocab_size
                            ),
                        )
                    })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Some((tokens, targets)))
    }

    /// The model on the trainable weights and adapters (the `Var`s): the keys of gradients.
    fn trained_model(&self) -> Model<'_> {
        Model {
            cfg: &self.shared.cfg,
            weights: &self.weights,
            adapters: self.adapters.as_ref(),
            rope: &self.shared.rope,
        }
    }

    /// The padded `[b, t_max]` input ids and the `[b · t_max]` targets of `batch`.
    fn batch_ids(
        &self,
        batch: &[(usize, &Datum, Vec<TokenId>, Vec<TokenId>)],
    ) -> Result<(Tensor, Vec<TokenId>)> {
        let b = batch.len();
        let t_max = batch.iter().map(|x| x.2.len()).max().unwrap_or(0);
        let mut ids = vec![0 as TokenId; b * t_max];
        let mut targets = vec![0 as TokenId; b * t_max];
        for (row, (_, _, toks, tgts)) in batch.iter().enumerate() {
            ids[row * t_max..row * t_max + toks.len()].copy_from_slice(toks);
            targets[row * t_max..row * t_max + tgts.len()].copy_from_slice(tgts);
        }
        let ids =
            Tensor::from_vec(ids, (b, t_max), &self.shared.device).map_err(be("input tensor"))?;
        Ok((ids, targets))
    }

    /// The summed loss (differentiable) of a batch of prepared datums, padded on the right
    /// into one forward pass (causal attention never looks at the padding), and each datum's
    /// loss inputs.
    ///
    /// With `model` built from detached weights and `mode` [`Mode::Infer`] (a forward pass
    /// without backward), no autograd graph is recorded and candle's fused kernels are used.
    fn batch_loss(
        &self,
        model: &Model<'_>,
        mode: Mode,
        batch: &[(usize, &Datum, Vec<TokenId>, Vec<TokenId>)],
        loss: &LossFn,
    ) -> Result<(Tensor, Vec<loss::TokenInputs>)> {
        let (ids, targets) = self.batch_ids(batch)?;
        let targets = Tensor::new(targets, &self.shared.device).map_err(be("targets"))?;
        // [b·t_max, V]: one row per token, no reshape of the largest tensor of the step.
        let logits = model.forward_flat(&ids, mode)?;
        let lp_all = loss::target_logprobs(&logits, &targets)?;
        self.batch_losses(batch, &lp_all, loss)
    }

    /// The summed loss of `batch` given the target tokens' log-probabilities `lp_all`
    /// (`[b · t_max]`), and each datum's loss inputs.
    fn batch_losses(
        &self,
        batch: &[(usize, &Datum, Vec<TokenId>, Vec<TokenId>)],
        lp_all: &Tensor,
        loss: &LossFn,
    ) -> Result<(Tensor, Vec<loss::TokenInputs>)> {
        let device = &self.shared.device;
        let b = batch.len();
        let t_max = batch.iter().map(|x| x.2.len()).max().unwrap_or(0);
        let lp_all = lp_all.reshape((b, t_max)).map_err(be("logprobs"))?;
        let mut total: Option<Tensor> = None;
        let mut parts = Vec::with_capacity(b);
        for (row, (index, d, toks, _)) in batch.iter().enumerate() {
            let lp = lp_all
                .get(row)
                .and_then(|r| r.narrow(0, 0, toks.len()))
                .map_err(be("logprobs"))?;
            let inputs = loss::TokenInputs {
                target_logprobs: lp,
                sampler_logprobs: input_tensor(d, LossInput::LOGPROBS, device)?,
                advantages: input_tensor(d, LossInput::ADVANTAGES, device)?,
                weights: input_tensor(d, LossInput::WEIGHTS, device)?,
            };
            let (l, _) = loss::loss_value(loss, &inputs)
                .map_err(|e| Error::config(format!("data[{index}]"), e.to_string()))?;
            total = Some(match total {
                None => l,
                Some(t) => (t + l).map_err(be("summing losses"))?,
            });
            parts.push(inputs);
        }
        let total = total.ok_or_else(|| Error::Backend("empty batch".into()))?;
        Ok((total, parts))
    }

    /// One batch's loss inputs and the gradients of the trainable parameters, through the
    /// hand-written training pass ([`tape`]): `model` holds the weights detached.
    fn tape_batch(
        &self,
        model: &Model<'_>,
        batch: &[(usize, &Datum, Vec<TokenId>, Vec<TokenId>)],
        loss: &LossFn,
    ) -> Result<(Vec<loss::TokenInputs>, candle_core::backprop::GradStore)> {
        let (ids, targets) = self.batch_ids(batch)?;
        let (logits, tape) = tape::forward(model, &ids).map_err(be("forward pass"))?;
        let (lp, saved) =
            fused::token_logprobs_saved(&logits, targets).map_err(be("target_logprobs"))?;
        // The loss on candle's autograd, from the log-probabilities (a leaf) on.
        let lp = Var::from_tensor(&lp).map_err(be("logprobs"))?;
        let (total, parts) = self.batch_losses(batch, lp.as_tensor(), loss)?;
        let dlp = match total
            .backward()
            .map_err(be("backward pass"))?
            .get(lp.as_tensor())
        {
            Some(g) => g.clone(),
            None => lp.zeros_like().map_err(be("backward pass"))?,
        };
        let dlogits = saved.grad(&logits, &dlp).map_err(be("backward pass"))?;
        // Its buffer is the next pass's (dlogits has its own).
        pool::recycle([&logits]);
        drop(logits);
        let grads = tape
            .backward(model, &self.trained_model(), dlogits)
            .map_err(be("backward pass"))?;
        Ok((parts, grads))
    }

    /// Runs `loss` over `data`, accumulating gradients when `backward`. Datums are checked
    /// first (a bad one fails the call before any gradient is accumulated), then run in
    /// padded batches of at most `max_batch_logits` logits. The loss value and metrics are
    /// computed over the concatenated tokens of all datums.
    fn forward(
        &mut self,
        data: &[Datum],
        loss: &LossFn,
        backward: bool,
    ) -> Result<ForwardBackwardOutput> {
        // The largest padded pass decides whether the work is worth several threads.
        let rows = data
            .iter()
            .map(|d| d.model_input.len())
            .max()
            .unwrap_or(0)
            .saturating_mul(data.len());
        let shared = self.shared.clone();
        shared.run_sized(rows, || self.forward_here(data, loss, backward))
    }

    fn forward_here(
        &mut self,
        data: &[Datum],
        loss: &LossFn,
        backward: bool,
    ) -> Result<ForwardBackwardOutput> {
        let mut prepared = Vec::with_capacity(data.len());
        for (i, d) in data.iter().enumerate() {
            if let Some((toks, tgts)) = self.prepare(i, d, loss)? {
                prepared.push((i, d, toks, tgts));
            }
        }
        let v = self.shared.cfg.vocab_size;
        let mut outputs: Vec<BTreeMap<String, TensorData>> = data
            .iter()
            .map(|_| {
                BTreeMap::from([(
                    ForwardBackwardOutput::LOGPROBS.to_string(),
                    TensorData::f32(Vec::new()),
                )])
            })
            .collect();
        let mut parts: Vec<loss::TokenInputs> = Vec::with_capacity(prepared.len());
        // The hand-written training pass, on detached weights.
        let use_tape = backward && tape::applies(&self.trained_model());
        // Without backward: detached weights (no graph is recorded) and the fused kernels.
        let detached = (!backward || use_tape).then(|| {
            (
                self.weights.detached(),
                self.adapters.as_ref().map(Adapters::detached),
            )
        });
        let (model, mode) = match &detached {
            Some((weights, adapters)) => (
                Model {
                    cfg: &self.shared.cfg,
                    weights,
                    adapters: adapters.as_ref(),
                    rope: &self.shared.rope,
                },
                if use_tape { Mode::Train } else { Mode::Infer },
            ),
            None => (
                Model {
                    cfg: &self.shared.cfg,
                    weights: &self.weights,
                    adapters: self.adapters.as_ref(),
                    rope: &self.shared.rope,
                },
                Mode::Train,
            ),
        };
        let mut rest = prepared.as_slice();
        while !rest.is_empty() {
            // The longest prefix whose padded logits fit the budget (at least one datum).
            let mut n = 0;
            let mut t_max = 0;
            while n < rest.len() {
                let t = t_max.max(rest[n].2.len());
                if n > 0 && (n + 1) * t * v > self.max_batch_logits {
                    break;
                }
                t_max = t;
                n += 1;
            }
            let (batch, tail) = rest.split_at(n);
            rest = tail;
            let batch_parts = if use_tape {
                let (batch_parts, grads) = self.tape_batch(&model, batch, loss)?;
                self.acc.add(grads, &self.params)?;
                batch_parts
            } else {
                let (total, batch_parts) = self.batch_loss(&model, mode, batch, loss)?;
                if backward {
                    let grads = total.backward().map_err(be("backward pass"))?;
                    self.acc.add(grads, &self.params)?;
                }
                batch_parts
            };
            for ((index, ..), inputs) in batch.iter().zip(batch_parts) {
                let lp = inputs.target_logprobs.detach();
                let values: Vec<f32> = lp
                    .to_dtype(candle_core::DType::F32)
                    .and_then(|t| t.to_vec1())
                    .map_err(be("logprobs"))?;
                if let Some(out) = outputs.get_mut(*index) {
                    out.insert(
                        ForwardBackwardOutput::LOGPROBS.to_string(),
                        TensorData::f32(values),
                    );
                }
                parts.push(loss::TokenInputs {
                    target_logprobs: lp,
                    ..inputs
                });
            }
        }
        pool::trim();
        let metrics = if parts.is_empty() {
            BTreeMap::from([("loss:sum".to_string(), 0.0)])
        } else {
            let cat = |f: &dyn Fn(&loss::TokenInputs) -> Option<Tensor>| -> Result<Option<Tensor>> {
                let ts: Option<Vec<Tensor>> = parts.iter().map(f).collect();
                ts.map(|ts| Tensor::cat(&ts, 0).map_err(be("concatenating loss inputs")))
                    .transpose()
            };
            let all = loss::TokenInputs {
                target_logprobs: cat(&|p| Some(p.target_logprobs.clone()))?
                    .ok_or_else(|| Error::Backend("no logprobs".into()))?,
                sampler_logprobs: cat(&|p| p.sampler_logprobs.clone())?,
                advantages: cat(&|p| p.advantages.clone())?,
                weights: cat(&|p| p.weights.clone())?,
            };
            let (total, mut metrics) = loss::loss_value(loss, &all)?;
            let total = total
                .to_dtype(candle_core::DType::F64)
                .and_then(|t| t.to_scalar::<f64>())
                .map_err(be("loss value"))?;
            metrics.insert("loss:sum".to_string(), total);
            metrics
        };
        Ok(ForwardBackwardOutput {
            loss_fn_output_type: "ArrayRecord".to_string(),
            loss_fn_outputs: outputs,
            metrics,
        })
    }

    fn sampler(&self) -> Result<LocalSampler> {
        Ok(match &self.adapters {
            // The frozen base is already in the decoding layout (`Weights::into_decoding`).
            Some(a) => LocalSampler::new(
                self.shared.clone(),
                self.weights.clone(),
                Some(Arc::new(a.snapshot()?)),
            ),
            None => LocalSampler::new(
                self.shared.clone(),
                Arc::new(self.weights.decoding_copy(&self.shared.cfg)?),
                None,
            ),
        })
    }

    fn mode_name(&self) -> &'static str {
        if self.lora.is_some() { "lora" } else { "full" }
    }

    fn save(&mut self, name: &str) -> Result<CheckpointRef> {
        if name.is_empty()
            || name == "."
            || name == ".."
            || name.contains(['/', '\\'])
            || name.starts_with('.')
        {
            return Err(Error::config(
                "checkpoint name",
                format!("`{name}` must be a plain, non-hidden file name"),
            ));
        }
        let final_dir = self
            .checkpoint_dir
            .get_or_insert_with(default_checkpoint_dir)
            .join(name);
        let params: HashMap<String, Tensor> = self
            .params
            .iter()
            .map(|(n, v)| (n.clone(), v.as_tensor().clone()))
            .collect();
        let opt_state = self.opt.state_tensors();
        let meta = serde_json::json!({
            "format": "rlvr-local-checkpoint/1",
            "mode": self.mode_name(),
            "lora_config": self.lora,
            "model_config": self.shared.cfg,
        });
        crate::fsio::write_dir_atomically(&final_dir, |tmp| {
            save_tensors(&params, &tmp.join("params.safetensors"))?;
            save_tensors(&opt_state, &tmp.join("optimizer.safetensors"))?;
            write_file(&tmp.join("meta.json"), meta.to_string().as_bytes())
        })?;
        Ok(CheckpointRef {
            name: name.to_string(),
            path: final_dir.display().to_string(),
        })
    }

    fn load(&mut self, ckpt: &CheckpointRef) -> Result<()> {
        let dir = PathBuf::from(&ckpt.path);
        let cerr = |m: String| Error::Checkpoint {
            path: ckpt.path.clone(),
            message: m,
        };
        let meta_path = dir.join("meta.json");
        let text =
            std::fs::read_to_string(&meta_path).map_err(|e| Error::io("reading", &meta_path, e))?;
        let meta: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| Error::data_line(&meta_path, e.line(), e.to_string()))?;
        let mode = meta.get("mode").and_then(|m| m.as_str()).unwrap_or("");
        if mode != self.mode_name() {
            return Err(cerr(format!(
                "saved in `{mode}` mode, but this backend trains in `{}` mode",
                self.mode_name()
            )));
        }
        let device = &self.shared.device;
        let params_path = dir.join("params.safetensors");
        let saved = candle_core::safetensors::load(&params_path, device)
            .map_err(|e| cerr(format!("params.safetensors: {e}")))?;
        // Check everything before changing anything.
        for (name, var) in &self.params {
            match saved.get(name) {
                None => return Err(cerr(format!("parameter `{name}` is missing"))),
                Some(t) if t.dims() != var.dims() => {
                    return Err(cerr(format!(
                        "parameter `{name}` has shape {:?}, expected {:?}",
                        t.dims(),
                        var.dims()
                    )));
                }
                Some(_) => {}
            }
        }
        let opt_path = dir.join("optimizer.safetensors");
        let opt_state = candle_core::safetensors::load(&opt_path, device)
            .map_err(|e| cerr(format!("optimizer.safetensors: {e}")))?;
        let mut opt = optim::AdamW::new();
        opt.load_state_tensors(opt_state)?;
        for (name, var) in &self.params {
            if let Some(t) = saved.get(name) {
                var.set(t).map_err(be("restoring parameters"))?;
            }
        }
        self.opt = opt;
        self.acc = optim::GradAccumulator::new();
        Ok(())
    }

    fn export(&self, dir: &Path) -> Result<()> {
        let mut cfg = self.shared.cfg.clone();
        let weights = match &self.adapters {
            Some(a) => {
                if cfg.tie_word_embeddings && a.map.contains_key(model::LM_HEAD) {
                    cfg.tie_word_embeddings = false;
                }
                a.merge_into(&self.weights, &self.shared.cfg)?
            }
            None => (*self.weights).clone(),
        };
        // Row-major, whatever the layout kept in memory (`Weights::into_decoding`).
        let map: HashMap<String, Tensor> = weights
            .map()
            .iter()
            .filter(|(k, _)| !(cfg.tie_word_embeddings && k.as_str() == "lm_head.weight"))
            .map(|(k, t)| Ok((k.clone(), t.detach().contiguous().map_err(be("exporting"))?)))
            .collect::<Result<_>>()?;
        let mut config_json = serde_json::to_value(&cfg)
            .map_err(|e| Error::Backend(format!("serializing config: {e}")))?;
        if let Some(o) = config_json.as_object_mut() {
            o.insert(
                "architectures".into(),
                serde_json::json!(["Qwen3ForCausalLM"]),
            );
            o.insert("model_type".into(), serde_json::json!("qwen3"));
            o.insert("torch_dtype".into(), serde_json::json!("float32"));
            o.insert("hidden_act".into(), serde_json::json!("silu"));
        }
        let tok = &self.shared.tokenizer;
        let name_of = |id: Option<TokenId>| id.and_then(|i| tok.inner().id_to_token(i));
        let tok_config = serde_json::json!({
            "bos_token": name_of(tok.bos_token_id()),
            "eos_token": name_of(tok.eos_token_id()),
        });
        crate::fsio::write_dir_atomically(dir, |tmp| {
            write_file(
                &tmp.join("config.json"),
                serde_json::to_string_pretty(&config_json)
                    .unwrap_or_default()
                    .as_bytes(),
            )?;
            save_tensors(&map, &tmp.join("model.safetensors"))?;
            let tok_path = tmp.join("tokenizer.json");
            tok.inner()
                .save(&tok_path, false)
                .map_err(|e| Error::Tokenizer(format!("{}: {e}", tok_path.display())))?;
            write_file(
                &tmp.join("tokenizer_config.json"),
                tok_config.to_string().as_bytes(),
            )
        })
    }
}

fn write_file(path: &Path, bytes: &[u8]) -> Result<()> {
    std::fs::write(path, bytes).map_err(|e| Error::io("writing", path, e))
}

fn save_tensors(map: &HashMap<String, Tensor>, path: &Path) -> Result<()> {
    candle_core::safetensors::save(map, path)
        .map_err(|e| Error::Backend(format!("writing {}: {e}", path.display())))
}

#[async_trait]
impl PolicyBackend for LocalBackend {
    type Sampler = LocalSampler;

    fn tokenizer(&self) -> &Tokenizer {
        &self.shared.tokenizer
    }

    async fn forward_backward(
        &self,
        data: Vec<Datum>,
        loss: LossFn,
    ) -> Result<Pending<ForwardBackwardOutput>> {
        self.submit("forward_backward", move |s| s.forward(&data, &loss, true))
    }

    async fn forward(
        &self,
        data: Vec<Datum>,
        loss: LossFn,
    ) -> Result<Pending<ForwardBackwardOutput>> {
        self.submit("forward", move |s| s.forward(&data, &loss, false))
    }

    async fn optim_step(&self, params: AdamParams) -> Result<Pending<OptimStepOutput>> {
        self.submit("optim_step", move |s| {
            let metrics = s.opt.step(&s.params, &mut s.acc, &params)?;
            Ok(OptimStepOutput { metrics })
        })
    }

    async fn sampler(&self) -> Result<LocalSampler> {
        self.submit("sampler", |s| s.sampler())?.await
    }

    async fn reference_sampler(&self) -> Result<LocalSampler> {
        self.submit("reference_sampler", |s| {
            Ok(LocalSampler::new(
                s.shared.clone(),
                s.reference.clone(),
                None,
            ))
        })?
        .await
    }

    async fn save_state(&self, name: &str) -> Result<CheckpointRef> {
        let name = name.to_string();
        self.submit("save_state", move |s| s.save(&name))?.await
    }

    async fn load_state(&self, checkpoint: &CheckpointRef) -> Result<()> {
        let ckpt = checkpoint.clone();
        self.submit("load_state", move |s| s.load(&ckpt))?.await
    }

    fn use_run_dir(&self, run_dir: &Path) {
        let dir = run_dir.join("checkpoints");
        // Queued on the worker, so that it comes before any checkpoint submitted after it.
        // If the worker has stopped, no checkpoint can be written anyway.
        let _ = self.submit("use_run_dir", move |s| {
            s.checkpoint_dir.get_or_insert(dir);
            Ok(())
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_backend_gets_its_own_default_checkpoint_dir() {
        let a = default_checkpoint_dir();
        let b = default_checkpoint_dir();
        assert_ne!(a, b);
        assert_eq!(a.parent(), b.parent());
        assert!(
            a.parent()
                .is_some_and(|p| p.ends_with(Path::new("rlvr").join("local-checkpoints")))
        );
    }

    #[test]
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    fn the_allocator_is_tuned_on_glibc() {
        assert!(tune_allocator());
        // Allocation still works, large buffers included.
        let v = vec![1u8; 48 << 20];
        assert_eq!(v.iter().map(|&x| x as usize).sum::<usize>(), 48 << 20);
    }

    /// Training with the backend's buffers reused (every buffer of 64 values or more in
    /// tests) gives the same losses, log-probabilities and gradients, bit for bit, as
    /// without: full fine-tuning and LoRA, tied and untied heads, several passes per
    /// `forward_backward`, the optimizer's steps in between.
    #[test]
    fn reused_buffers_change_no_result() {
        let vocab: Vec<String> = (0..61u32)
            .map(|i| char::from_u32(0x100 + i).unwrap().to_string())
            .collect();
        let tokenizer = char_tokenizer(&vocab, None).unwrap();
        let data: Vec<Datum> = (0..5u32)
            .map(|i| {
                let t: Vec<u32> = (0..10 + 3 * i).map(|j| (j * 7 + i * 13) % 61).collect();
                let n = t.len() - 1;
                Datum::new(crate::types::ModelInput::from_tokens(t[..n].to_vec()))
                    .with_input(
                        "target_tokens",
                        TensorData::i64(t[1..].iter().map(|&x| x as i64).collect()),
                    )
                    .with_input("weights", TensorData::f32(vec![1.0; n]))
            })
            .collect();
        let adam = AdamParams {
            learning_rate: 1e-2,
            ..AdamParams::default()
        };
        let rt = tokio::runtime::Runtime::new().unwrap();
        for tied in [true, false] {
            for lora in [false, true] {
                let cfg = Qwen3Config::new(61, 32, 48, 2, 4, 2, 8, 64).with_tied_embeddings(tied);
                let run = |pooled: bool| {
                    let mut opts = LocalOptions::default().threads(2).max_batch_logits(61 * 40);
                    opts = if lora {
                        opts.lora(LoraConfig::new(4))
                    } else {
                        opts.full_finetune()
                    };
                    opts.buffer_pool = pooled;
                    let backend =
                        LocalBackend::random(cfg.clone(), tokenizer.clone(), opts).unwrap();
                    rt.block_on(async {
                        let mut seen = Vec::new();
                        for _ in 0..3 {
                            let out = backend
                                .forward_backward(data.clone(), LossFn::CrossEntropy)
                                .await
                                .unwrap()
                                .await
                                .unwrap();
                            seen.push(format!("{:?}", out.loss_fn_outputs));
                            seen.push(format!("{:?}", out.metrics));
                            seen.push(format!("{:?}", backend.gradient_norms().await.unwrap()));
                            backend.optim_step(adam).await.unwrap().await.unwrap();
                        }
                        seen
                    })
                };
                assert_eq!(run(true), run(false), "tied {tied}, lora {lora}");
            }
        }
    }
}
