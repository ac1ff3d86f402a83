//! GRPO on competition math — the cookbook's `math_rl` recipe in Rust.
//!
//! ```text
//! # Offline, out of the box: the cookbook's arithmetic environment on the embedded tiny model
//! cargo run --release --example math -- --dataset arithmetic
//! # MATH (12,000 problems, the cookbook's split) on Tinker, evaluated on MATH-500 every 10 steps:
//! TINKER_API_KEY=tml-... cargo run --release --example math -- --dataset math --eval-every 10
//! # DeepMath on the local backend with any Qwen3-architecture model, the math-verify grader:
//! cargo run --release --example math -- --dataset deepmath --model Qwen/Qwen3-0.6B \
//!     --renderer role_colon --grader math_verify --batch-size 4 --group-size 4
//! ```
//!
//! `--dataset` is one of `math` (EleutherAI/hendrycks_math minus MATH-500), `math500`,
//! `deepmath` (zwhe99/DeepMath-103K), `polaris` (POLARIS-Project/Polaris-Dataset-53K), `dapo`
//! (BytedTsinghua-SIA/DAPO-Math-17k), `gsm8k` (openai/gsm8k with the `MathEnv` prompt) or
//! `arithmetic` (synthetic, offline). The datasets download from the Hugging Face hub into its
//! cache, or load from `--data` (a file or a directory in the hub's layout). Prompts are the
//! cookbook `MathEnv`'s (question + " Write your answer in \boxed{} format.", with the
//! strawberry few-shot exchange where the cookbook's dataset builder adds it), graded by
//! `rlvr::reward::MathAnswer` with `--grader best|sympy|math_verify` (the cookbook's `MathEnv`
//! reward, 1 / 0.9 / 0 / −0.1). The other flags are the `gsm8k` example's.
//!
//! Without `TINKER_API_KEY` and `--model`, `--dataset arithmetic` trains the embedded tiny
//! model `examples/tiny-arithmetic` (made by `examples/make_tiny_model.rs`) on the CPU with
//! settings tuned for it; the training reward rises within a minute. The other datasets need a
//! real model: Tinker, or `--model`.

#[path = "shared/renderer.rs"]
mod shared;

/// The allocator of this binary (see examples/gsm8k.rs).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, bail};
use clap::{Parser, ValueEnum};
use rlvr::backend::local::{LocalBackend, LocalDevice, LocalOptions};
use rlvr::backend::tinker::{TinkerClient, TinkerConfig};
use rlvr::dataset::{
    AdditionProblems, DapoMath, DeepMath, Gsm8kOptions, Math, Math500, Polaris, Problem, Split,
};
use rlvr::hub::HubOptions;
use rlvr::reward::{LastInteger, MathAnswer, MathGrader, Response, Reward, RewardError};
use rlvr::types::{LoraConfig, LossFn};
use rlvr::{
    Dataset, GrpoTrainer, Gsm8k, PolicyBackend, RewardFn, TrainerConfig, trainer::EvalConfig,
};

/// The base model on Tinker (the cookbook's `math_rl` default).
const TINKER_MODEL: &str = "Qwen/Qwen3.5-9B";

/// The embedded model of the offline arithmetic run.
const TINY_MODEL: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/tiny-arithmetic");

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum DatasetName {
    Math,
    Math500,
    Deepmath,
    Polaris,
    Dapo,
    Arithmetic,
    Gsm8k,
}

#[derive(Parser, Debug)]
#[command(
    about = "GRPO on competition math (the cookbook's math_rl recipe), on Tinker or the local backend"
)]
struct Args {
    /// The training set.
    #[arg(long, value_enum, default_value_t = DatasetName::Math)]
    dataset: DatasetName,
    /// The answer grader: best (rlvr's), sympy or math_verify (the cookbook's two).
    #[arg(long, default_value = "best", value_parser = parse_grader)]
    grader: MathGrader,
    /// Base model: a Tinker model name (default Qwen/Qwen3.5-9B), or for the local backend a
    /// Hugging Face model directory or hub id (default for `--dataset arithmetic` without
    /// Tinker: the embedded tiny model).
    #[arg(long)]
    model: Option<String>,
    /// Renderer (chat format) by name; default: the model's recommended renderer.
    #[arg(long, value_name = "NAME")]
    renderer: Option<String>,
    /// Use the local backend even when TINKER_API_KEY is set.
    #[arg(long)]
    local: bool,
    /// Tinker server URL (default: TINKER_BASE_URL, else the official service).
    #[arg(long)]
    base_url: Option<String>,
    /// Local backend: run on CUDA device 0 (needs the `cuda` feature).
    #[arg(long)]
    cuda: bool,
    /// LoRA rank (default 32; 8 for the embedded model).
    #[arg(long)]
    lora_rank: Option<u32>,
    /// Training steps (default 10; 60 for the embedded model).
    #[arg(long)]
    steps: Option<u64>,
    /// Problems per step.
    #[arg(long, default_value_t = 16)]
    batch_size: usize,
    /// Samples per problem (the GRPO group).
    #[arg(long, default_value_t = 8)]
    group_size: usize,
    /// Most tokens per sample (default 1024; 32 for the embedded model).
    #[arg(long)]
    max_tokens: Option<u32>,
    /// Sampling temperature.
    #[arg(long, default_value_t = 1.0)]
    temperature: f32,
    /// Adam learning rate (default 4e-5; 2e-3 for the embedded model).
    #[arg(long)]
    lr: Option<f64>,
    /// Loss: importance_sampling, ppo, cispo or dro.
    #[arg(long, default_value = "importance_sampling", value_parser = LossFn::from_name)]
    loss: LossFn,
    /// Seed (data order when shuffling, sampling).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Shuffle the training set (rlvr's fixed order for the seed; the cookbook shuffles the
    /// hub datasets too, with another generator).
    #[arg(long)]
    shuffle: bool,
    /// The dataset from local files instead of the hub: a file (MATH-500, DeepMath, Polaris,
    /// DAPO) or a directory in the hub's layout (MATH, DeepMath, GSM8K).
    #[arg(long)]
    data: Option<PathBuf>,
    /// MATH-500 from a local file (`test.jsonl`) instead of the hub: the held-out set of
    /// `--dataset math` and the evaluation set.
    #[arg(long)]
    math500: Option<PathBuf>,
    /// Evaluate every N steps and at the end (0: never): on MATH-500 (GSM8K test for
    /// `gsm8k`), or for `arithmetic` on problems past the training batches (default 0; 10 for
    /// the embedded model).
    #[arg(long)]
    eval_every: Option<u64>,
    /// Problems per evaluation.
    #[arg(long, default_value_t = 128)]
    eval_problems: usize,
    /// Save a checkpoint every N steps (a final one is always saved).
    #[arg(long, default_value_t = 5)]
    save_every: u64,
    /// Run directory (default: runs/math-<dataset>-<UTC time>).
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

fn parse_grader(name: &str) -> Result<MathGrader, String> {
    name.parse().map_err(|e: rlvr::Error| e.to_string())
}

/// The reward of the run: the boxed answer for the math datasets, the last integer for
/// `arithmetic` (the cookbook's `ArithmeticEnv`).
enum EnvReward {
    Math(MathAnswer),
    Arithmetic(LastInteger),
}

#[rlvr::async_trait]
impl RewardFn for EnvReward {
    async fn grade(&self, problem: &Problem, response: &Response) -> Result<Reward, RewardError> {
        match self {
            EnvReward::Math(r) => r.grade(problem, response).await,
            EnvReward::Arithmetic(r) => r.grade(problem, response).await,
        }
    }
}

/// Where the run trains.
enum Backend {
    Tinker,
    Local { model: String, embedded: bool },
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    let tinker_key = std::env::var_os("TINKER_API_KEY").is_some_and(|k| !k.is_empty());
    let backend = match (tinker_key && !args.local, &args.model) {
        (true, _) => Backend::Tinker,
        (false, Some(model)) => Backend::Local {
            model: model.clone(),
            embedded: false,
        },
        (false, None) if args.dataset == DatasetName::Arithmetic => Backend::Local {
            model: TINY_MODEL.to_string(),
            embedded: true,
        },
        (false, None) => bail!(
            "no backend to train on. Either
  - set TINKER_API_KEY=tml-... to train on Tinker, or
  - pass --model <dir or hub id> of a Qwen3-architecture model for the local backend.
For an offline run that needs neither: cargo run --release --example math -- --dataset arithmetic"
        ),
    };
    if args.cuda && !cfg!(feature = "cuda") {
        bail!(
            "--cuda needs the `cuda` feature: cargo run --release --features cuda --example math"
        );
    }
    let embedded = matches!(backend, Backend::Local { embedded: true, .. });
    // The embedded model's settings (see examples/tiny-arithmetic/README.md).
    let steps = args.steps.unwrap_or(if embedded { 60 } else { 10 });
    let lora_rank = args.lora_rank.unwrap_or(if embedded { 8 } else { 32 });
    let max_tokens = args.max_tokens.unwrap_or(if embedded { 32 } else { 1024 });
    let lr = args.lr.unwrap_or(if embedded { 2e-3 } else { 4e-5 });
    let eval_every = args.eval_every.unwrap_or(if embedded { 10 } else { 0 });

    // Settings and data first, so that mistakes show before any model is created.
    let name = format!("math-{}", dataset_name(args.dataset));
    let log_dir = match &args.resume {
        Some(dir) if !dir.join(rlvr::report::CHECKPOINTS_FILE).is_file() => {
            bail!(
                "cannot resume: {} holds no checkpoints.jsonl",
                dir.display()
            )
        }
        Some(dir) => dir.clone(),
        None => args.log_dir.clone().unwrap_or_else(|| {
            Path::new("runs").join(rlvr::report::run_name(&name, std::time::SystemTime::now()))
        }),
    };
    let config = TrainerConfig::builder()
        .max_steps(steps)
        .batch_size(args.batch_size)
        .group_size(args.group_size)
        .max_tokens(max_tokens)
        .temperature(args.temperature)
        .learning_rate(lr)
        .adam_beta1(0.9)
        .adam_beta2(0.95)
        .loss(args.loss)
        .seed(args.seed)
        .shuffle(args.shuffle)
        .eval_every(eval_every)
        .eval(EvalConfig {
            max_problems: Some(args.eval_problems),
            ..EvalConfig::default()
        })
        .save_every(args.save_every)
        .log_dir(&log_dir)
        .tensorboard(args.tensorboard)
        .dynamic_sampling_rounds(args.dynamic_sampling_rounds)
        .build()?;
    let reward = match args.dataset {
        DatasetName::Arithmetic => EnvReward::Arithmetic(LastInteger::default()),
        _ => EnvReward::Math(MathAnswer::new(args.grader)),
    };
    let (train_set, test_set) = load(&args, steps, eval_every > 0).await?;
    println!(
        "{}: {} training problems{}; grader {}",
        dataset_name(args.dataset),
        train_set.len(),
        test_set
            .as_ref()
            .map(|t| format!(", {} evaluation problems", t.len()))
            .unwrap_or_default(),
        match args.dataset {
            DatasetName::Arithmetic => "last integer".to_string(),
            _ => args.grader.to_string(),
        }
    );

    let model_name = match &backend {
        Backend::Local { model, .. } => model.clone(),
        Backend::Tinker => args
            .model
            .clone()
            .unwrap_or_else(|| TINKER_MODEL.to_string()),
    };
    let renderer = match (&args.renderer, embedded) {
        (None, true) => "role_colon".to_string(),
        _ => shared::choose_renderer(&model_name, args.renderer.as_deref())?,
    };
    let run = serde_json::json!({
        "model": model_name,
        "backend": match backend { Backend::Tinker => "tinker", Backend::Local { .. } => "local" },
        "renderer": renderer,
        "dataset": dataset_name(args.dataset),
        "grader": args.grader.as_str(),
    });

    match backend {
        Backend::Tinker => {
            let mut tinker = TinkerConfig::from_env()?;
            if let Some(url) = &args.base_url {
                tinker = tinker.base_url(url);
            }
            let client = TinkerClient::connect(tinker).await?;
            let backend = client
                .create_lora_training(&model_name, LoraConfig::new(lora_rank))
                .await?;
            let result = train(backend, reward, &renderer, config, train_set, test_set, run).await;
            let closed = client.close().await;
            result?;
            Ok(closed?)
        }
        Backend::Local { model, .. } => {
            let device = if args.cuda {
                LocalDevice::Cuda(0)
            } else {
                LocalDevice::Cpu
            };
            let options = LocalOptions::default()
                .tune_allocator(true)
                .lora(LoraConfig::new(lora_rank))
                .seed(args.seed)
                .device(device)
                .checkpoint_dir(log_dir.join("checkpoints"));
            let backend = if Path::new(&model).is_dir() {
                LocalBackend::from_dir(&model, options)?
            } else {
                LocalBackend::from_pretrained(&model, options).await?
            };
            train(backend, reward, &renderer, config, train_set, test_set, run).await
        }
    }
}

fn dataset_name(d: DatasetName) -> &'static str {
    match d {
        DatasetName::Math => "math",
        DatasetName::Math500 => "math500",
        DatasetName::Deepmath => "deepmath",
        DatasetName::Polaris => "polaris",
        DatasetName::Dapo => "dapo",
        DatasetName::Arithmetic => "arithmetic",
        DatasetName::Gsm8k => "gsm8k",
    }
}

type Shared = Arc<dyn Dataset>;

/// The training set and, with `--eval-every`, the evaluation set.
async fn load(args: &Args, steps: u64, eval: bool) -> anyhow::Result<(Shared, Option<Shared>)> {
    let hub = HubOptions::default();
    let data = args.data.as_deref();
    let math500 = || async {
        anyhow::Ok(match &args.math500 {
            Some(path) => Math500::from_file(path)?,
            None => Math500::download(&hub).await.context(
                "downloading MATH-500 (pass --math500 <test.jsonl> to use a local file)",
            )?,
        })
    };
    let from_hub = |what: &str| format!("downloading {what} (pass --data to use local files)");
    let train: Shared = match args.dataset {
        DatasetName::Arithmetic => {
            // The cookbook's 100 batches; evaluation on the batches after them.
            let batches = (steps as usize).max(100);
            let train = AdditionProblems::new(args.batch_size, batches)?;
            let test = AdditionProblems::new(args.batch_size, batches + 8)?;
            let held_out: Vec<Problem> = (batches * args.batch_size..test.len())
                .map(|i| test.get(i))
                .collect::<rlvr::Result<_>>()?;
            return Ok((Arc::new(train), eval.then(|| Arc::new(held_out) as Shared)));
        }
        DatasetName::Math => {
            let test = math500().await?;
            let train = match data {
                Some(dir) => Math::from_dir(dir)?.excluding(&test),
                None => Math::download(&hub)
                    .await
                    .with_context(|| from_hub("MATH"))?,
            };
            return Ok((shared(train), eval.then(|| Arc::new(test) as Shared)));
        }
        DatasetName::Math500 => shared(math500().await?),
        DatasetName::Deepmath => shared(match data {
            Some(p) if p.is_dir() => DeepMath::from_dir(p)?,
            Some(p) => DeepMath::from_file(p)?,
            None => DeepMath::download(&hub)
                .await
                .with_context(|| from_hub("DeepMath-103K"))?,
        }),
        DatasetName::Polaris => shared(match data {
            Some(p) => Polaris::from_file(p)?,
            None => Polaris::download(&hub)
                .await
                .with_context(|| from_hub("Polaris-53K"))?,
        }),
        DatasetName::Dapo => shared(match data {
            Some(p) => DapoMath::from_file(p)?,
            None => DapoMath::download(&hub)
                .await
                .with_context(|| from_hub("DAPO-Math-17k"))?,
        }),
        DatasetName::Gsm8k => {
            let options = Gsm8kOptions::math_env();
            let train = match data {
                Some(dir) => Gsm8k::from_dir(dir, Split::Train)?,
                None => Gsm8k::download(Split::Train, &hub)
                    .await
                    .with_context(|| from_hub("GSM8K"))?,
            };
            let test = match (eval, data) {
                (false, _) => None,
                (true, Some(dir)) => {
                    Some(Gsm8k::from_dir(dir, Split::Test)?.with_options(options.clone()))
                }
                (true, None) => Some(
                    Gsm8k::download(Split::Test, &hub)
                        .await?
                        .with_options(options.clone()),
                ),
            };
            return Ok((
                shared(train.with_options(options)),
                test.map(|t| Arc::new(t) as Shared),
            ));
        }
    };
    let test = match eval {
        true => Some(Arc::new(math500().await?) as Shared),
        false => None,
    };
    Ok((train, test))
}

/// The dataset as the trainer takes it (the trainer shuffles it with `--shuffle`).
fn shared<D: Dataset + 'static>(dataset: D) -> Shared {
    Arc::new(dataset)
}

/// The loop, the same on every backend.
async fn train<B: PolicyBackend>(
    backend: B,
    reward: EnvReward,
    renderer: &str,
    config: TrainerConfig,
    train_set: Shared,
    test_set: Option<Shared>,
    run: serde_json::Value,
) -> anyhow::Result<()> {
    let renderer = rlvr::renderer::by_name(renderer, backend.tokenizer().clone())
        .with_context(|| format!("renderer `{renderer}` over the model's tokenizer"))?;
    let log_dir = config.log_dir.clone().unwrap_or_default();
    let mut trainer =
        GrpoTrainer::new(backend, reward, renderer, train_set, config)?.with_run_metadata(run);
    if let Some(test_set) = test_set {
        trainer = trainer.with_eval_dataset(test_set);
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
