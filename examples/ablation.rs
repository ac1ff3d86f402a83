//! The algorithm ablation: the offline quickstart task trained with each of the crate's
//! algorithm options over several seeds, one table.
//!
//! ```text
//! cargo run --release --example ablation
//! cargo run --release --example ablation -- --algorithms grpo,dapo --seeds 0,1,2,3,4
//! ```
//!
//! Every run is the quickstart's (the embedded tiny model, LoRA rank 8, 16 problems × 8
//! samples a step, 60 steps, learning rate 2e-3, the format-aware `\boxed{}` reward) with
//! only the algorithm changed:
//!
//! | name | what changes |
//! |---|---|
//! | `grpo` | nothing: importance sampling, advantages centred per group, token terms summed |
//! | `dapo` | dynamic sampling (up to 4 extra rounds), token-mean aggregation, clip-higher PPO (0.8, 1.28), soft overlong punishment over the last 8 of 32 tokens |
//! | `dr-grpo` | PPO-clip (0.8, 1.2) with a constant normaliser (batch × group × `max_tokens`) |
//! | `gspo` | the sequence-level ratio with its clipping ([`rlvr::loss::Gspo`], run as a custom loss) |
//! | `ppo` | PPO-clip (0.8, 1.2) |
//! | `cispo` | CISPO (0, 4) |
//!
//! The held-out accuracy (200 problems × 2 samples at temperature 1) is measured every
//! `--eval-every` steps and at the end. Per algorithm the table gives the steps to reach
//! `--target` held-out accuracy (the first evaluation at or above it; "—" when a seed never
//! does), the final accuracy, the wall time of the run (training and evaluations) and the
//! completion tokens sampled for training. `<out>/ablation.md` and `<out>/ablation.json` keep
//! the table and every run's figures; each run's directory holds its `metrics.jsonl`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use clap::Parser;
use rlvr::backend::local::{LocalBackend, LocalOptions};
use rlvr::dataset::word_problems::WordProblems;
use rlvr::loss::Gspo;
use rlvr::reward::OverlongPenalty;
use rlvr::trainer::{EvalConfig, LossAggregation, TrainerConfigBuilder};
use rlvr::types::{LoraConfig, LossFn};
use rlvr::{BoxedAnswer, Dataset, GrpoTrainer, PolicyBackend, RewardFn, RoleColon, TrainerConfig};
use serde::Serialize;

/// The algorithms, by the names `--algorithms` takes.
const ALGORITHMS: [&str; 6] = ["grpo", "dapo", "dr-grpo", "gspo", "ppo", "cispo"];

#[derive(Parser, Debug)]
#[command(about = "GRPO, DAPO, Dr. GRPO, GSPO, PPO and CISPO on the offline quickstart task")]
struct Args {
    /// Algorithms to run, comma-separated (grpo, dapo, dr-grpo, gspo, ppo, cispo).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "grpo,dapo,dr-grpo,gspo,ppo,cispo"
    )]
    algorithms: Vec<String>,
    /// Seeds (data order, samples, adapters), comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "0,1,2")]
    seeds: Vec<u64>,
    /// Model directory.
    #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/tiny-wordproblems"))]
    model: PathBuf,
    /// Where the runs and the table go (default: `runs/ablation-<unix time>`).
    #[arg(long)]
    out: Option<PathBuf>,
    /// GRPO steps per run.
    #[arg(long, default_value_t = 60)]
    steps: u64,
    /// Problems per step.
    #[arg(long, default_value_t = 16)]
    batch_size: usize,
    /// Samples per problem.
    #[arg(long, default_value_t = 8)]
    group_size: usize,
    /// Adam learning rate of the LoRA adapters.
    #[arg(long, default_value_t = 2e-3)]
    lr: f64,
    /// Most tokens per completion (DAPO's overlong punishment covers its last quarter).
    #[arg(long, default_value_t = 32)]
    max_tokens: u32,
    /// Optimizer steps per batch (`num_substeps`; above 1 the later updates are off-policy
    /// and the clipped losses' clipping comes into play).
    #[arg(long, default_value_t = 1)]
    substeps: usize,
    /// Evaluate every this many steps (and at the end).
    #[arg(long, default_value_t = 2)]
    eval_every: u64,
    /// Held-out problems per evaluation.
    #[arg(long, default_value_t = 200)]
    eval_problems: usize,
    /// Samples per held-out problem (temperature 1).
    #[arg(long, default_value_t = 2)]
    eval_samples: usize,
    /// The held-out accuracy whose first crossing is reported.
    #[arg(long, default_value_t = 0.9)]
    target: f64,
    /// Threads of the local backend (default: one per CPU).
    #[arg(long)]
    threads: Option<usize>,
}

/// One run's figures.
#[derive(Debug, Clone, Serialize)]
struct RunResult {
    algorithm: String,
    seed: u64,
    /// (step, held-out accuracy) of every evaluation.
    evals: Vec<(u64, f64)>,
    /// The first evaluation step at or above the target.
    steps_to_target: Option<u64>,
    final_accuracy: f64,
    wall_s: f64,
    tokens_sampled: f64,
    /// Extra dynamic-sampling rounds over the run (DAPO only).
    extra_rounds: f64,
}

fn main() -> Result<()> {
    let args = Args::parse();
    for a in &args.algorithms {
        if !ALGORITHMS.contains(&a.as_str()) {
            bail!(
                "unknown algorithm `{a}` (--algorithms); known: {}",
                ALGORITHMS.join(", ")
            );
        }
    }
    if args.seeds.is_empty() {
        bail!("--seeds is empty");
    }
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
    let out = args.out.clone().unwrap_or_else(|| {
        let secs = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        PathBuf::from(format!("runs/ablation-{secs}"))
    });
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let mut results = Vec::new();
    for algorithm in &args.algorithms {
        for &seed in &args.seeds {
            let r = run_one(
                &args,
                algorithm,
                seed,
                &out.join(format!("{algorithm}-seed{seed}")),
            )
            .await
            .with_context(|| format!("{algorithm}, seed {seed}"))?;
            println!(
                "{:<8} seed {seed}: steps to {}: {:>4}, final {:.3}, {:.0} s, {:.0} tokens",
                r.algorithm,
                args.target,
                r.steps_to_target
                    .map_or_else(|| "—".to_string(), |s| s.to_string()),
                r.final_accuracy,
                r.wall_s,
                r.tokens_sampled
            );
            results.push(r);
        }
    }
    let table = table(&args, &results);
    println!("\n{table}");
    std::fs::write(out.join("ablation.md"), &table)?;
    std::fs::write(
        out.join("ablation.json"),
        serde_json::to_string_pretty(&serde_json::json!({
            "machine": machine(),
            "args": format!("{args:?}"),
            "runs": results,
        }))?,
    )?;
    println!("runs and table in {}", out.display());
    Ok(())
}

/// The trainer settings of `algorithm` on top of the quickstart's.
fn algorithm_config(args: &Args, algorithm: &str, b: TrainerConfigBuilder) -> TrainerConfigBuilder {
    match algorithm {
        "dapo" => b
            .dynamic_sampling_rounds(4)
            .loss_aggregation(LossAggregation::TokenMean)
            .loss(LossFn::Ppo {
                clip_low_threshold: 0.8,
                clip_high_threshold: 1.28,
            }),
        "dr-grpo" => b
            .loss(LossFn::ppo())
            .loss_aggregation(LossAggregation::Constant(
                (args.batch_size * args.group_size) as f64 * f64::from(args.max_tokens),
            )),
        "ppo" => b.loss(LossFn::ppo()),
        "cispo" => b.loss(LossFn::cispo()),
        // grpo; gspo's loss is set on the trainer.
        _ => b.loss(LossFn::ImportanceSampling),
    }
}

async fn run_one(args: &Args, algorithm: &str, seed: u64, dir: &Path) -> Result<RunResult> {
    if dir.exists() {
        std::fs::remove_dir_all(dir).with_context(|| format!("clearing {}", dir.display()))?;
    }
    let start = Instant::now();
    let mut options = LocalOptions::default()
        .lora(LoraConfig {
            seed: Some(seed),
            ..LoraConfig::new(8)
        })
        .tune_allocator(true)
        .seed(seed);
    if let Some(n) = args.threads {
        options = options.threads(n);
    }
    let backend = LocalBackend::from_dir(&args.model, options)
        .with_context(|| format!("loading the model from {}", args.model.display()))?;
    let renderer = Arc::new(RoleColon::new(backend.tokenizer().clone()));
    let (train, test) = WordProblems::new(0, WordProblems::space_size())?.split(1000)?;
    let base = TrainerConfig::builder()
        .batch_size(args.batch_size)
        .group_size(args.group_size)
        .max_tokens(args.max_tokens)
        .temperature(1.0)
        .learning_rate(args.lr)
        .num_substeps(args.substeps)
        .seed(seed)
        .max_steps(args.steps)
        .eval_every(args.eval_every)
        .eval(EvalConfig {
            temperature: 1.0,
            max_tokens: Some(args.max_tokens),
            group_size: args.eval_samples,
            max_problems: Some(args.eval_problems),
        })
        .save_every(0)
        .progress(false)
        .log_dir(dir);
    let config = algorithm_config(args, algorithm, base).build()?;
    let test: Arc<dyn Dataset> = Arc::new(test);
    let format_aware = BoxedAnswer::format_aware();
    if algorithm == "dapo" {
        let reward = OverlongPenalty::new(
            format_aware,
            args.max_tokens as usize,
            (args.max_tokens / 4) as usize,
        )?;
        train_run(backend, reward, renderer, train, test, config, None).await?;
    } else {
        let custom = (algorithm == "gspo").then(Gspo::default);
        train_run(backend, format_aware, renderer, train, test, config, custom).await?;
    }
    let wall_s = start.elapsed().as_secs_f64();
    summarize(args, algorithm, seed, dir, wall_s)
}

async fn train_run<R: RewardFn + 'static>(
    backend: LocalBackend,
    reward: R,
    renderer: Arc<RoleColon>,
    train: WordProblems,
    test: Arc<dyn Dataset>,
    config: TrainerConfig,
    gspo: Option<Gspo>,
) -> Result<()> {
    let mut trainer = GrpoTrainer::new(backend, reward, renderer, Arc::new(train), config)?
        .with_eval_dataset(test);
    if let Some(loss) = gspo {
        trainer = trainer.with_custom_loss(loss)?;
    }
    trainer.run().await?;
    Ok(())
}

/// The figures of a finished run, from its `metrics.jsonl`.
fn summarize(
    args: &Args,
    algorithm: &str,
    seed: u64,
    dir: &Path,
    wall_s: f64,
) -> Result<RunResult> {
    let path = dir.join("metrics.jsonl");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let (mut evals, mut tokens, mut extra) = (Vec::new(), 0.0, 0.0);
    for (i, line) in text.lines().enumerate() {
        let row: serde_json::Value = serde_json::from_str(line)
            .with_context(|| format!("{} line {}", path.display(), i + 1))?;
        let step = row["step"].as_u64().unwrap_or(0);
        if let Some(c) = row["test/env/all/correct"].as_f64() {
            evals.push((step, c));
        }
        tokens += row["tokens/sampled"].as_f64().unwrap_or(0.0);
        extra += row["dynamic_sampling/rounds"].as_f64().unwrap_or(0.0);
    }
    let Some(&(_, final_accuracy)) = evals.last() else {
        bail!("{} has no held-out evaluation", path.display());
    };
    Ok(RunResult {
        algorithm: algorithm.to_string(),
        seed,
        steps_to_target: evals
            .iter()
            .find(|(_, c)| *c >= args.target)
            .map(|(s, _)| *s),
        evals,
        final_accuracy,
        wall_s,
        tokens_sampled: tokens,
        extra_rounds: extra,
    })
}

fn mean_sd(v: &[f64]) -> (f64, f64) {
    let n = v.len() as f64;
    let mean = v.iter().sum::<f64>() / n;
    let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0).max(1.0);
    (mean, var.sqrt())
}

/// The markdown table: one row per algorithm, in `--algorithms` order.
fn table(args: &Args, results: &[RunResult]) -> String {
    let mut by_algo: BTreeMap<&str, Vec<&RunResult>> = BTreeMap::new();
    for r in results {
        by_algo.entry(r.algorithm.as_str()).or_default().push(r);
    }
    let mut s = format!(
        "| algorithm | steps to {} held-out (per seed) | final held-out | wall s | tokens sampled |\n|---|---|---:|---:|---:|\n",
        args.target
    );
    for a in &args.algorithms {
        let Some(runs) = by_algo.get(a.as_str()) else {
            continue;
        };
        let steps: Vec<String> = runs
            .iter()
            .map(|r| {
                r.steps_to_target
                    .map_or_else(|| "—".to_string(), |s| s.to_string())
            })
            .collect();
        let acc = mean_sd(&runs.iter().map(|r| r.final_accuracy).collect::<Vec<_>>());
        let wall = mean_sd(&runs.iter().map(|r| r.wall_s).collect::<Vec<_>>());
        let tokens = mean_sd(&runs.iter().map(|r| r.tokens_sampled).collect::<Vec<_>>());
        s.push_str(&format!(
            "| {a} | {} | {:.3} ± {:.3} | {:.0} ± {:.0} | {:.0} ± {:.0} |\n",
            steps.join(", "),
            acc.0,
            acc.1,
            wall.0,
            wall.1,
            tokens.0,
            tokens.1
        ));
    }
    s.push_str(&format!(
        "\n{} seeds each ({}); mean ± sample standard deviation. {}\n",
        args.seeds.len(),
        args.seeds
            .iter()
            .map(|s| s.to_string())
            .collect::<Vec<_>>()
            .join(", "),
        machine()
    ));
    s
}

/// The CPU this ran on.
fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|s| s.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    format!("{cpu}, {threads} CPUs")
}
