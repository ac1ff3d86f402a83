//! GRPO on GSM8K — the Tinker tutorial's RL loop (`rl_loop.py`) in Rust.
//!
//! Defaults reproduce the tutorial: `Qwen/Qwen3.5-9B-Base` with LoRA rank 32, the model's
//! recommended renderer (the cookbook's model table: role-colon for this base model), 10 steps of 16 problems × 8 samples, 256 tokens, Adam 4e-5 (β 0.9 / 0.95), the
//! `importance_sampling` loss, the plain 0/1 `\boxed{}` grader, GSM8K train in file order
//! with the tutorial's prompt (one-shot prefix + "Provide a numerical answer without units,
//! written inside \boxed{}.").
//!
//! ```text
//! # On Tinker (TINKER_BASE_URL or --base-url for another Tinker-compatible server):
//! TINKER_API_KEY=tml-... cargo run --release --example gsm8k
//! # On the embedded candle backend, with any Qwen3-architecture model (directory or hub id);
//! # --renderer is needed for a model the cookbook's table does not list:
//! cargo run --release --example gsm8k -- --model Qwen/Qwen3-0.6B --renderer role_colon \
//!     --batch-size 4 --group-size 4
//! # Resume an interrupted run (same flags):
//! cargo run --release --example gsm8k -- --resume runs/gsm8k-20260101-120000
//! ```
//!
//! `--renderer NAME` picks another renderer (`rlvr::renderer::names()`); one the table does not
//! recommend for the model is used with a warning, as in the cookbook.
//!
//! Every run writes a run directory (`--log-dir`, default `runs/gsm8k-<UTC time>`):
//! `config.json`, `metrics.jsonl`, `checkpoints.jsonl`, `samples/`, `reward.png`.
//!
//! The binary allocates with `mimalloc` (its `#[global_allocator]` below): the client's
//! many small, short-lived buffers (HTTP headers, token vectors, datums) cost about a
//! fifth of its CPU with glibc's `malloc` (docs/performance.md). A library
//! cannot choose a binary's allocator; your own binary can, with the same two lines (and
//! `mimalloc`'s `v2` feature: docs/tinker.md).

#[path = "shared/renderer.rs"]
mod shared;

/// The allocator of this binary (see the module documentation).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, bail};
use clap::{Parser, ValueEnum};
use rlvr::backend::local::{LocalBackend, LocalDevice, LocalOptions};
use rlvr::backend::tinker::{TinkerClient, TinkerConfig};
use rlvr::{
    BoxedAnswer, PolicyBackend,
    types::{LoraConfig, LossFn},
};
use rlvr::{GrpoTrainer, TrainerConfig, trainer::EvalConfig};
use rlvr::{Gsm8k, dataset::Split};

/// The tutorial's base model on Tinker.
const TINKER_MODEL: &str = "Qwen/Qwen3.5-9B-Base";

const NO_BACKEND: &str = "no backend to train on. Either
  - set TINKER_API_KEY=tml-... (create a key in the Tinker console) to train on Tinker
    (TINKER_BASE_URL or --base-url selects another Tinker-compatible server), or
  - pass --model <dir or hub id> of a Qwen3-architecture Hugging Face model to train on the
    embedded local backend, e.g. --model Qwen/Qwen3-0.6B (CPU; --cuda with the `cuda` feature).
For an offline demo that needs neither: cargo run --release --example quickstart";

#[derive(Parser, Debug)]
#[command(about = "GRPO on GSM8K: the Tinker tutorial's loop, on Tinker or the local backend")]
struct Args {
    /// Base model: a Tinker model name (default Qwen/Qwen3.5-9B-Base), or for the local
    /// backend a Hugging Face model directory or hub id.
    #[arg(long)]
    model: Option<String>,
    /// Renderer (chat format) by name; default: the model's recommended renderer from the
    /// cookbook's model table (needed for a model the table does not list, e.g. a local
    /// directory: `role_colon` for a base model).
    #[arg(long, value_name = "NAME")]
    renderer: Option<String>,
    /// Use the local backend even when TINKER_API_KEY is set (needs --model).
    #[arg(long)]
    local: bool,
    /// Tinker server URL (default: TINKER_BASE_URL, else the official service).
    #[arg(long)]
    base_url: Option<String>,
    /// Local backend: run on CUDA device 0 (needs the `cuda` feature).
    #[arg(long)]
    cuda: bool,
    /// LoRA rank.
    #[arg(long, default_value_t = 32)]
    lora_rank: u32,
    /// Training steps.
    #[arg(long, default_value_t = 10)]
    steps: u64,
    /// Problems per step.
    #[arg(long, default_value_t = 16)]
    batch_size: usize,
    /// Samples per problem (the GRPO group).
    #[arg(long, default_value_t = 8)]
    group_size: usize,
    /// Most tokens per sample.
    #[arg(long, default_value_t = 256)]
    max_tokens: u32,
    /// Sampling temperature.
    #[arg(long, default_value_t = 1.0)]
    temperature: f32,
    /// Adam learning rate.
    #[arg(long, default_value_t = 4e-5)]
    lr: f64,
    /// Loss: importance_sampling, ppo, cispo or dro.
    #[arg(long, default_value = "importance_sampling", value_parser = LossFn::from_name)]
    loss: LossFn,
    /// Seed (data order when shuffling, sampling).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Shuffle the training set (the tutorial walks it in file order).
    #[arg(long)]
    shuffle: bool,
    /// Reward: `correct` (1 if the boxed answer is right, else 0) or `format-aware`
    /// (1 / 0.9 / 0 / -0.1 with a format component).
    #[arg(long, value_enum, default_value_t = RewardMode::Correct)]
    reward: RewardMode,
    /// GSM8K directory (`main/{train,test}-00000-of-00001.parquet` or `{train,test}.jsonl`);
    /// default: download openai/gsm8k from the Hugging Face hub into its cache.
    #[arg(long)]
    data: Option<PathBuf>,
    /// Evaluate on the test split every N steps and at the end (0: never).
    #[arg(long, default_value_t = 0)]
    eval_every: u64,
    /// Test problems per evaluation.
    #[arg(long, default_value_t = 128)]
    eval_problems: usize,
    /// Save a checkpoint every N steps (a final one is always saved).
    #[arg(long, default_value_t = 5)]
    save_every: u64,
    /// Run directory (default: runs/gsm8k-<UTC time>).
    #[arg(long, conflicts_with = "resume")]
    log_dir: Option<PathBuf>,
    /// Also write the metrics as a TensorBoard event file in the run directory
    /// (`tensorboard --logdir <run>`, `wandb sync --sync-tensorboard <run>`).
    #[arg(long)]
    tensorboard: bool,
    /// DAPO's dynamic sampling: at most N extra rounds of groups per step while fewer than
    /// batch-size groups with differing rewards are in (0: off).
    #[arg(long, default_value_t = 0, value_name = "N")]
    dynamic_sampling_rounds: usize,
    /// Resume the run in this existing run directory (pass the same flags as the first run).
    #[arg(long)]
    resume: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum RewardMode {
    Correct,
    FormatAware,
}

// One runtime thread: the client mostly waits on the server, and the rewards run on the
// trainer's grading threads, so a multi-threaded runtime would only add thread hand-offs
// (about a tenth more client CPU per step: docs/performance.md).
#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    // The backend: Tinker when TINKER_API_KEY is set (unless --local), else the local backend
    // on --model.
    let tinker_key = std::env::var_os("TINKER_API_KEY").is_some_and(|k| !k.is_empty());
    let local_model = match (tinker_key && !args.local, args.model.clone()) {
        (true, _) => None,
        (false, Some(model)) => Some(model),
        (false, None) => {
            eprintln!("{NO_BACKEND}");
            std::process::exit(2);
        }
    };
    if args.cuda && !cfg!(feature = "cuda") {
        bail!(
            "--cuda needs the `cuda` feature: cargo run --release --features cuda --example gsm8k"
        );
    }

    // Settings and data first, so that mistakes show before any model is created.
    let log_dir = match &args.resume {
        Some(dir) if !dir.join(rlvr::report::CHECKPOINTS_FILE).is_file() => {
            bail!(
                "cannot resume: {} holds no checkpoints.jsonl",
                dir.display()
            )
        }
        Some(dir) => dir.clone(),
        None => args.log_dir.clone().unwrap_or_else(|| {
            Path::new("runs").join(rlvr::report::run_name(
                "gsm8k",
                std::time::SystemTime::now(),
            ))
        }),
    };
    let config = TrainerConfig::builder()
        .max_steps(args.steps)
        .batch_size(args.batch_size)
        .group_size(args.group_size)
        .max_tokens(args.max_tokens)
        .temperature(args.temperature)
        .learning_rate(args.lr)
        .adam_beta1(0.9)
        .adam_beta2(0.95)
        .loss(args.loss)
        .seed(args.seed)
        .shuffle(args.shuffle)
        .eval_every(args.eval_every)
        .eval(EvalConfig {
            max_problems: Some(args.eval_problems),
            ..EvalConfig::default()
        })
        .save_every(args.save_every)
        .log_dir(&log_dir)
        .tensorboard(args.tensorboard)
        .dynamic_sampling_rounds(args.dynamic_sampling_rounds)
        .build()?;
    let reward = match args.reward {
        RewardMode::Correct => BoxedAnswer::correctness(),
        RewardMode::FormatAware => BoxedAnswer::format_aware(),
    };
    let train_set = load_gsm8k(args.data.as_deref(), Split::Train).await?;
    let test_set = match args.eval_every {
        0 => None,
        _ => Some(load_gsm8k(args.data.as_deref(), Split::Test).await?),
    };

    // The renderer: checked (and warned about) before any model is created.
    let model_name = match &local_model {
        Some(model) => model.as_str(),
        None => args.model.as_deref().unwrap_or(TINKER_MODEL),
    };
    let renderer = shared::choose_renderer(model_name, args.renderer.as_deref())?;

    match local_model {
        None => {
            let mut tinker = TinkerConfig::from_env()?;
            if let Some(url) = &args.base_url {
                tinker = tinker.base_url(url);
            }
            let client = TinkerClient::connect(tinker).await?;
            let model = args.model.as_deref().unwrap_or(TINKER_MODEL);
            let backend = client
                .create_lora_training(model, LoraConfig::new(args.lora_rank))
                .await?;
            let run = run_metadata(model, "tinker", &renderer, args.data.as_deref());
            let result = train(backend, reward, &renderer, config, train_set, test_set, run).await;
            // Finish the Tinker session whether training succeeded or not.
            let closed = client.close().await;
            result?;
            Ok(closed?)
        }
        Some(model) => {
            let device = if args.cuda {
                LocalDevice::Cuda(0)
            } else {
                LocalDevice::Cpu
            };
            // This program only trains: the backend may tune the process's allocator.
            let options = LocalOptions::default()
                .tune_allocator(true)
                .lora(LoraConfig::new(args.lora_rank))
                .seed(args.seed)
                .device(device)
                .checkpoint_dir(log_dir.join("checkpoints"));
            let backend = if Path::new(&model).is_dir() {
                LocalBackend::from_dir(&model, options)?
            } else {
                LocalBackend::from_pretrained(&model, options).await?
            };
            let run = run_metadata(&model, "local", &renderer, args.data.as_deref());
            train(backend, reward, &renderer, config, train_set, test_set, run).await
        }
    }
}

/// What `config.json` records about the run besides the config (under `"run"`).
fn run_metadata(
    model: &str,
    backend: &str,
    renderer: &str,
    data: Option<&Path>,
) -> serde_json::Value {
    serde_json::json!({
        "model": model,
        "backend": backend,
        "renderer": renderer,
        "dataset": match data {
            Some(dir) => format!("gsm8k ({})", dir.display()),
            None => "openai/gsm8k".to_string(),
        },
    })
}

/// The loop itself, the same on every backend: the renderer called `renderer` over the
/// backend's tokenizer, the boxed-answer reward, GSM8K train (and test for evaluation).
async fn train<B: PolicyBackend>(
    backend: B,
    reward: BoxedAnswer,
    renderer: &str,
    config: TrainerConfig,
    train_set: Gsm8k,
    test_set: Option<Gsm8k>,
    run: serde_json::Value,
) -> anyhow::Result<()> {
    let renderer = rlvr::renderer::by_name(renderer, backend.tokenizer().clone())
        .with_context(|| format!("renderer `{renderer}` over the model's tokenizer"))?;
    let log_dir = config.log_dir.clone().unwrap_or_default();
    let mut trainer = GrpoTrainer::new(backend, reward, renderer, Arc::new(train_set), config)?
        .with_run_metadata(run);
    if let Some(test_set) = test_set {
        trainer = trainer.with_eval_dataset(Arc::new(test_set));
    }

    println!("run directory: {}", log_dir.display());
    let summary = trainer.run().await?;
    if let Some(last) = &summary.last_step {
        println!("last step: {}", last.summary_line());
    }
    println!(
        "{} steps run ({} done before); metrics in {}",
        summary.steps_run,
        summary.start_step,
        log_dir.join(rlvr::report::METRICS_FILE).display()
    );
    Ok(())
}

/// GSM8K with the tutorial's prompt: from `--data`, or downloaded from the hub (cached).
async fn load_gsm8k(data: Option<&Path>, split: Split) -> anyhow::Result<Gsm8k> {
    Ok(match data {
        Some(dir) => Gsm8k::from_dir(dir, split)?,
        None => Gsm8k::download(split, &Default::default())
            .await
            .context("downloading openai/gsm8k (pass --data <dir> to use local files)")?,
    })
}
