//! Trained weights out of a run: a PEFT adapter, a merged Hugging Face model.
//!
//! ```text
//! # The quickstart's run (its base model is the embedded examples/tiny-wordproblems):
//! cargo run --release --example weights -- export runs/quickstart-... --peft out/peft
//! cargo run --release --example weights -- export runs/quickstart-... --merged out/model
//! # Another base model, another checkpoint of the run:
//! cargo run --release --example weights -- export runs/gsm8k-... --base ~/models/Qwen3-0.6B \
//!     --checkpoint 000020 --merged out/model
//! # A Tinker checkpoint down to disk, then as a merged model:
//! TINKER_API_KEY=tml-... cargo run --release --example weights -- download \
//!     tinker://<run>/weights/final out/adapter
//! cargo run --release --example weights -- convert out/adapter --base Qwen/Qwen3-8B --merged out/model
//! # An adapter directory (Tinker's download format or a local-backend checkpoint) directly:
//! cargo run --release --example weights -- convert <adapter dir> --base <model dir> --peft out/peft
//! ```
//!
//! `export` reads the run's `checkpoints.jsonl` and takes its latest checkpoint (or
//! `--checkpoint NAME`). A LoRA checkpoint becomes a PEFT adapter (`--peft`, what vLLM's
//! `--lora-modules` and `peft.PeftModel.from_pretrained` load) and/or a merged model
//! (`--merged`, what `AutoModelForCausalLM.from_pretrained` loads); a full fine-tuning
//! checkpoint becomes a merged model. The output directories must not exist. See
//! docs/weights.md.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use clap::{Args, Parser, Subcommand};
use rlvr::backend::tinker::{DownloadOptions, TinkerConfig, download_weights};
use rlvr::hub::{Hub, HubOptions, HubRepo};
use rlvr::report::{CheckpointRecord, RunDir};
use rlvr::weights;

#[derive(Parser)]
#[command(about = "Export trained weights: PEFT adapters and merged Hugging Face models")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Export a checkpoint of a run directory.
    Export {
        /// The run directory (with checkpoints.jsonl).
        run: PathBuf,
        /// The checkpoint's name (default: the latest).
        #[arg(long)]
        checkpoint: Option<String>,
        #[command(flatten)]
        out: Outputs,
    },
    /// Download a checkpoint from Tinker (TINKER_API_KEY; TINKER_BASE_URL for another
    /// server): `tinker://<run>/weights/<name>` (save_state) or
    /// `tinker://<run>/external_weights/<name>` (save_weights_external).
    Download {
        /// The checkpoint's `tinker://` path.
        tinker_path: String,
        /// The directory to write its files into.
        out: PathBuf,
        /// Decrypt an export encrypted to your own age key (`AGE-SECRET-KEY-1…`).
        #[arg(long, env = "RLVR_AGE_IDENTITY", hide_env_values = true)]
        age_identity: Option<String>,
        /// No progress bar.
        #[arg(long)]
        quiet: bool,
    },
    /// Convert an adapter directory (Tinker's download format, or a local-backend LoRA
    /// checkpoint).
    Convert {
        /// The adapter directory.
        adapter: PathBuf,
        #[command(flatten)]
        out: Outputs,
    },
}

#[derive(Args)]
struct Outputs {
    /// The base model: a Hugging Face model directory, or a hub id (`Qwen/Qwen3-0.6B`,
    /// downloaded into the hub cache). Default: the quickstart's embedded model.
    #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/tiny-wordproblems"))]
    base: String,
    /// Write a PEFT adapter directory here.
    #[arg(long)]
    peft: Option<PathBuf>,
    /// Write a merged Hugging Face model directory here.
    #[arg(long)]
    merged: Option<PathBuf>,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Export {
            run,
            checkpoint,
            out,
        } => {
            let record = find_checkpoint(&run, checkpoint.as_deref())?;
            let dir = PathBuf::from(&record.backend.path);
            println!(
                "checkpoint `{}` (step {}) at {}",
                record.name,
                record.step,
                dir.display()
            );
            write(&dir, &out)
        }
        Command::Convert { adapter, out } => write(&adapter, &out),
        Command::Download {
            tinker_path,
            out,
            age_identity,
            quiet,
        } => {
            let config = TinkerConfig::from_env().context("TINKER_API_KEY")?;
            let mut options = DownloadOptions::default().progress(!quiet);
            if let Some(key) = age_identity {
                options = options.age_identity(key);
            }
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()?;
            let dir = runtime.block_on(download_weights(&config, &tinker_path, &out, &options))?;
            println!("downloaded {tinker_path} into {}", dir.display());
            Ok(())
        }
    }
}

fn find_checkpoint(run: &Path, name: Option<&str>) -> anyhow::Result<CheckpointRecord> {
    if !run.join(rlvr::report::CHECKPOINTS_FILE).is_file() {
        bail!(
            "{}: not a run directory with checkpoints (no checkpoints.jsonl)",
            run.display()
        );
    }
    let dir = RunDir::create(run).with_context(|| format!("opening run {}", run.display()))?;
    let records = dir
        .read_checkpoints()
        .with_context(|| format!("reading {}", dir.checkpoints_path().display()))?;
    let found = match name {
        Some(n) => records.into_iter().rev().find(|r| r.name == n),
        None => records.into_iter().last(),
    };
    match (found, name) {
        (Some(r), _) => Ok(r),
        (None, Some(n)) => bail!(
            "no checkpoint `{n}` in {}",
            dir.checkpoints_path().display()
        ),
        (None, None) => bail!("no checkpoint in {}", dir.checkpoints_path().display()),
    }
}

fn write(checkpoint: &Path, out: &Outputs) -> anyhow::Result<()> {
    if out.peft.is_none() && out.merged.is_none() {
        bail!("nothing to write: pass --peft <dir> and/or --merged <dir>");
    }
    let full = is_full(checkpoint)?;
    let base = base_dir(&out.base)?;
    if let Some(peft) = &out.peft {
        if full {
            bail!("a full fine-tuning checkpoint has no adapter: use --merged");
        }
        weights::build_lora_adapter(&base, checkpoint, peft)?;
        println!("PEFT adapter: {}", peft.display());
    }
    if let Some(merged) = &out.merged {
        if full {
            weights::export_full_checkpoint(checkpoint, &base, merged)?;
        } else {
            weights::build_hf_model(&base, checkpoint, merged)?;
        }
        println!("merged model: {}", merged.display());
    }
    Ok(())
}

/// `base` as a directory: itself, or the hub snapshot of the model it names.
fn base_dir(base: &str) -> anyhow::Result<PathBuf> {
    let path = PathBuf::from(base);
    if path.is_dir() {
        return Ok(path);
    }
    if path.is_absolute() || base.starts_with('.') || base.split('/').count() != 2 {
        bail!("--base {base}: no such directory (and not a hub id like `Qwen/Qwen3-0.6B`)");
    }
    let hub = Hub::new(&HubOptions::default())?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let dir = runtime
        .block_on(hub.model_snapshot(&HubRepo::model(base)))
        .with_context(|| format!("downloading {base}"))?;
    println!("base model {base}: {}", dir.display());
    Ok(dir)
}

/// Whether `dir` is a full fine-tuning checkpoint of the local backend.
fn is_full(dir: &Path) -> anyhow::Result<bool> {
    let meta = dir.join("meta.json");
    if !meta.is_file() {
        return Ok(false);
    }
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&meta)?)
        .with_context(|| format!("reading {}", meta.display()))?;
    Ok(v["mode"] == "full")
}
