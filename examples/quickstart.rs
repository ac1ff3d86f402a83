//! The offline quickstart: GRPO on the embedded tiny model, on CPU, in a few minutes.
//!
//! ```text
//! cargo run --release --example quickstart
//! ```
//!
//! Loads `examples/tiny-wordproblems` (a tiny Qwen3-architecture model this crate trained
//! itself, see `examples/make_tiny_model.rs`), puts LoRA adapters on it with the local candle
//! backend, and trains it with the real `GrpoTrainer` on synthetic grade-school word problems,
//! graded by the `\boxed{}` answer checker. The held-out accuracy (sampling at temperature 1)
//! is measured before and after; the run directory gets `metrics.jsonl`, samples and
//! `reward.png`. No network, no API key.
//!
//! The embedded model was fine-tuned to answer in one of two styles that differ in their
//! first token: about one time in five it shows its work (`7 + 5 = 12. The answer is
//! \boxed{12}.`, almost always right), otherwise it guesses (`The answer is \boxed{7}.`,
//! wrong). GRPO only has to learn to prefer the first style: held-out accuracy goes from
//! about 0.2 to about 0.97 in 60 steps (figures in `docs/performance.md`).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use clap::{Parser, ValueEnum};
use rlvr::backend::local::{LocalBackend, LocalDevice, LocalOptions};
use rlvr::dataset::word_problems::WordProblems;
use rlvr::types::LoraConfig;
use rlvr::{BoxedAnswer, Dataset, PolicyBackend, RoleColon, types::LossFn};
use rlvr::{GrpoTrainer, TrainerConfig, trainer::EvalConfig};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum RewardKind {
    /// 1 for a correct boxed answer, else 0.
    Correctness,
    /// The cookbook's format-aware reward (1.0 / 0.9 / 0.0 / −0.1).
    FormatAware,
}

#[derive(Parser, Debug)]
#[command(
    about = "Offline GRPO quickstart on the embedded tiny model (CPU; --cuda with the `cuda` feature)"
)]
struct Args {
    /// Model directory (config.json, model.safetensors, tokenizer.json).
    #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/tiny-wordproblems"))]
    model: PathBuf,
    /// Run directory (default: `runs/quickstart-<unix time>`). An existing run directory
    /// with checkpoints is resumed.
    #[arg(long)]
    log_dir: Option<PathBuf>,
    /// GRPO steps.
    #[arg(long, default_value_t = 60)]
    steps: u64,
    /// Problems per step.
    #[arg(long, default_value_t = 16)]
    batch_size: usize,
    /// Samples per problem (the GRPO group).
    #[arg(long, default_value_t = 8)]
    group_size: usize,
    /// Adam learning rate of the LoRA adapters (the tiny model needs far more than the
    /// 4e-5 used for billion-parameter models; at 5e-3 the stop sequence can collapse late
    /// in the run, 2e-3 was stable over every seed we tried).
    #[arg(long, default_value_t = 2e-3)]
    lr: f64,
    /// LoRA rank (0: full-parameter fine-tuning instead of LoRA).
    #[arg(long, default_value_t = 8)]
    lora_rank: u32,
    /// Training sampling temperature.
    #[arg(long, default_value_t = 1.0)]
    temperature: f32,
    /// Most tokens per completion.
    #[arg(long, default_value_t = 32)]
    max_tokens: u32,
    /// Reward function.
    #[arg(long, value_enum, default_value_t = RewardKind::FormatAware)]
    reward: RewardKind,
    /// Evaluate on held-out problems every this many steps (and at the end).
    #[arg(long, default_value_t = 10)]
    eval_every: u64,
    /// Held-out problems per evaluation.
    #[arg(long, default_value_t = 200)]
    eval_problems: usize,
    /// Samples per held-out problem (temperature `--eval-temperature`).
    #[arg(long, default_value_t = 2)]
    eval_samples: usize,
    /// Evaluation temperature (1.0: the accuracy of the sampling policy; 0: greedy).
    #[arg(long, default_value_t = 1.0)]
    eval_temperature: f32,
    /// Save a checkpoint every this many steps (and `final` at the end), so that a run
    /// that is killed resumes from its last checkpoint (run the same command with the same
    /// `--log-dir`) losing at most this many steps. 0: only at the end.
    #[arg(long, default_value_t = 5)]
    save_every: u64,
    /// Seed of the data order, the samples and the adapters.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Seed of the word-problem set; must match the model's (its test split is held out).
    #[arg(long, default_value_t = 0)]
    data_seed: u64,
    /// Size of the held-out test split the model was made with.
    #[arg(long, default_value_t = 1000)]
    test_size: usize,
    /// Threads of the local backend (default: one per CPU). The run is the same on any
    /// number of threads.
    #[arg(long)]
    threads: Option<usize>,
    /// Run the model on CUDA device 0 (needs the `cuda` feature).
    #[arg(long)]
    cuda: bool,
    /// Also write the metrics as a TensorBoard event file in the run directory
    /// (`tensorboard --logdir <run>`, `wandb sync --sync-tensorboard <run>`).
    #[arg(long)]
    tensorboard: bool,
    /// DAPO's dynamic sampling: at most N extra rounds of groups per step while fewer than
    /// batch-size groups with differing rewards are in (0: off).
    #[arg(long, default_value_t = 0, value_name = "N")]
    dynamic_sampling_rounds: usize,
}

fn main() -> Result<()> {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .init();
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?
        .block_on(run(args))
}

async fn run(args: Args) -> Result<()> {
    let start = Instant::now();
    if args.cuda && !cfg!(feature = "cuda") {
        bail!(
            "--cuda needs the `cuda` feature: \
             cargo run --release --features cuda --example quickstart -- --cuda"
        );
    }
    let log_dir = args.log_dir.clone().unwrap_or_else(|| {
        let secs = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        PathBuf::from(format!("runs/quickstart-{secs}"))
    });

    // This program only trains, so it lets the backend tune the process's allocator
    // (`tune_allocator`: freed tensor memory is reused instead of page-faulted afresh).
    let options = if args.lora_rank == 0 {
        LocalOptions::default().full_finetune()
    } else {
        LocalOptions::default().lora(LoraConfig {
            seed: Some(args.seed),
            ..LoraConfig::new(args.lora_rank)
        })
    }
    .tune_allocator(true);
    // Checkpoints (adapters + optimizer state) live in the run directory.
    let mut options = options
        .seed(args.seed)
        .checkpoint_dir(log_dir.join("checkpoints"));
    if let Some(n) = args.threads {
        options = options.threads(n);
    }
    if args.cuda {
        options = options.device(LocalDevice::Cuda(0));
    }
    let backend = LocalBackend::from_dir(&args.model, options)
    .with_context(|| {
        format!(
            "loading the model from {} (regenerate it with `cargo run --release --example make_tiny_model`)",
            args.model.display()
        )
    })?;
    let renderer = Arc::new(RoleColon::new(backend.tokenizer().clone()));

    let all = WordProblems::new(args.data_seed, WordProblems::space_size())?;
    let (train, test) = all.split(args.test_size)?;
    println!(
        "model {} | {} train / {} held-out word problems | LoRA rank {} | lr {:e}",
        args.model.display(),
        train.len(),
        test.len(),
        args.lora_rank,
        args.lr
    );

    let config = TrainerConfig::builder()
        .batch_size(args.batch_size)
        .group_size(args.group_size)
        .max_tokens(args.max_tokens)
        .temperature(args.temperature)
        .learning_rate(args.lr)
        .loss(LossFn::ImportanceSampling)
        .seed(args.seed)
        .max_steps(args.steps)
        .eval_every(args.eval_every)
        .eval(EvalConfig {
            temperature: args.eval_temperature,
            max_tokens: Some(args.max_tokens),
            group_size: args.eval_samples,
            max_problems: Some(args.eval_problems),
        })
        .save_every(args.save_every)
        .log_dir(&log_dir)
        .tensorboard(args.tensorboard)
        .dynamic_sampling_rounds(args.dynamic_sampling_rounds)
        .build()?;
    let reward = match args.reward {
        RewardKind::Correctness => BoxedAnswer::correctness(),
        RewardKind::FormatAware => BoxedAnswer::format_aware(),
    };
    let test: Arc<dyn Dataset> = Arc::new(test);
    let mut trainer = GrpoTrainer::new(backend, reward, renderer, Arc::new(train), config)?
        .with_eval_dataset(test);
    let summary = trainer.run().await?;

    // The story of the run, from its metrics.
    let metrics_path = log_dir.join("metrics.jsonl");
    let text = std::fs::read_to_string(&metrics_path)
        .with_context(|| format!("reading {}", metrics_path.display()))?;
    let mut rewards = Vec::new();
    let mut evals = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let row: serde_json::Value = serde_json::from_str(line)
            .with_context(|| format!("{} line {}", metrics_path.display(), i + 1))?;
        let step = row["step"].as_u64().unwrap_or(0);
        if let Some(r) = row["env/all/reward/total"].as_f64() {
            rewards.push((step, r));
        }
        if let Some(c) = row["test/env/all/correct"].as_f64() {
            evals.push((step, c));
        }
    }
    let tail: Vec<f64> = rewards.iter().rev().take(3).map(|(_, r)| *r).collect();
    let tail_mean = tail.iter().sum::<f64>() / tail.len().max(1) as f64;
    println!();
    match (evals.first(), evals.last()) {
        (Some(first_eval), Some(last_eval)) => println!(
            "held-out accuracy (T={}, {} problems x {}): step {} {:.3} -> step {} {:.3}",
            args.eval_temperature,
            args.eval_problems,
            args.eval_samples,
            first_eval.0,
            first_eval.1,
            last_eval.0,
            last_eval.1
        ),
        _ => println!("no held-out evaluation (--eval-every 0)"),
    }
    if let (Some(first), Some(last)) = (rewards.first(), rewards.last()) {
        println!(
            "training reward: step {} {:.3} -> step {} {:.3} (mean of the last {}: {:.3})",
            first.0,
            first.1,
            last.0,
            last.1,
            tail.len(),
            tail_mean
        );
    }
    println!(
        "{} steps in {:.0} s; run directory {} (metrics.jsonl, samples/, reward.png)",
        summary.steps_run,
        start.elapsed().as_secs_f64(),
        log_dir.display()
    );
    Ok(())
}
