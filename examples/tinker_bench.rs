//! Client-side benchmark driver: `GrpoTrainer` on the Tinker backend against the fake Tinker
//! server of `benches/tinker_client/` (or any server answering `GET /bench/stats`), with the
//! sizes of the Tinker tutorial's loop (16 problems × 8 samples × 256 tokens, role-colon
//! prompts, `importance_sampling`, Adam 4e-5). `benches/tinker_client.sh` runs it beside the
//! Python SDK loop; see `docs/performance.md` ("Tinker client vs the Python SDK loop").
//!
//! ```text
//! cargo run --release --example tinker_bench -- --base-url http://127.0.0.1:8799 \
//!     --tokenizer qwen3/tokenizer.json --data ../shared/data/gsm8k --bench-json rust.json
//! ```
//!
//! Per step it records wall time and the whole process's CPU time (all threads,
//! `CLOCK_PROCESS_CPUTIME_ID`), the server's CPU time (the delta of `cpu_s` in
//! `GET /bench/stats` around the step), and both split into the phases of
//! `benches/tinker_client/seed_loop.py`:
//!
//! * `save`: `save_weights_for_sampler` (the new sampler; rlvr does it at the end of a step),
//! * `sample`: the trainer's `sampling` span (render prompts, 16 sample requests),
//! * `grade`: from the end of sampling to the start of training (grading, advantages, datums),
//! * `train`: the trainer's `train_step` span (forward_backward + optim_step),
//! * `other`: the rest of the step (metrics row, sample dump, bookkeeping).
//!
//! The phase boundaries come from the trainer's tracing spans, seen by a small
//! `tracing_subscriber` layer. `--bench-json FILE` writes
//! `{"steps":[{"warmup","wall_s","cpu_s","sys_s","server_cpu_s","wall":{phase:s},"cpu":{phase:s}}]}`
//! (`sys_s`: the kernel part of `cpu_s`), the shape `benches/tinker_client/summarize.py`
//! reads. The run directory (`--log-dir`, default a temporary directory) is written as in
//! any run: `metrics.jsonl` every step.

/// `mimalloc`, as in `examples/gsm8k.rs` (why: its module documentation). Built with
/// `RUSTFLAGS="--cfg rlvr_glibc_malloc"` (`benches/tinker_client.sh --glibc-malloc`), the
/// binary keeps the C library's `malloc`.
#[cfg(not(rlvr_glibc_malloc))]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Parser;
use rlvr::backend::tinker::{TinkerBackendOptions, TinkerClient, TinkerConfig};
use rlvr::dataset::Problem;
use rlvr::tokenizer::Tokenizer;
use rlvr::types::{LoraConfig, LossFn};
use rlvr::{GrpoTrainer, TrainerConfig};
use rlvr::{Gsm8k, dataset::Split};
use tracing_subscriber::Layer;
use tracing_subscriber::layer::{Context as LayerContext, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;

const PHASES: [&str; 5] = ["save", "sample", "grade", "train", "other"];

#[derive(Parser, Debug)]
#[command(about = "GrpoTrainer on the Tinker backend against a fake Tinker server, timed per step")]
struct Args {
    /// The server (the fake Tinker server of benches/tinker_client/).
    #[arg(long, default_value = "http://127.0.0.1:8799")]
    base_url: String,
    /// The Qwen3 tokenizer.json (the fake server samples from its vocabulary).
    #[arg(long)]
    tokenizer: PathBuf,
    /// GSM8K directory holding `train.jsonl` (or the parquet layout).
    #[arg(long)]
    data: PathBuf,
    /// Measured steps.
    #[arg(long, default_value_t = 10)]
    steps: u64,
    /// Warm-up steps before them (not counted by summarize.py).
    #[arg(long, default_value_t = 1)]
    warmup: u64,
    /// Problems per step.
    #[arg(long, default_value_t = 16)]
    batch_size: usize,
    /// Samples per problem.
    #[arg(long, default_value_t = 8)]
    group_size: usize,
    /// Tokens per sample.
    #[arg(long, default_value_t = 256)]
    max_tokens: u32,
    /// Run directory (default: a fresh temporary directory, removed at the end).
    #[arg(long)]
    log_dir: Option<PathBuf>,
    /// Write the per-step records as JSON (summarize.py's shape) to this file.
    #[arg(long)]
    bench_json: Option<PathBuf>,
}

/// CPU seconds of the whole process (all threads).
fn process_cpu() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; the clock id is a constant.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return f64::NAN;
    }
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

/// System (kernel) CPU seconds of the whole process: the part of [`process_cpu`] spent in
/// system calls (sockets, wake-ups) and page faults.
fn process_sys() -> f64 {
    // SAFETY: an all-zero `rusage` is a valid value of this plain C struct.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `ru` is a valid, writable rusage; RUSAGE_SELF is a constant.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) } != 0 {
        return f64::NAN;
    }
    ru.ru_stime.tv_sec as f64 + ru.ru_stime.tv_usec as f64 * 1e-6
}

/// A moment: wall clock and process CPU.
#[derive(Debug, Clone, Copy)]
struct Mark {
    wall: Instant,
    cpu: f64,
}

impl Mark {
    fn now() -> Mark {
        Mark {
            wall: Instant::now(),
            cpu: process_cpu(),
        }
    }
}

/// One span boundary seen by [`PhaseLayer`]: (span name, opened?, when).
type Event = (&'static str, bool, Mark);

/// Records when the trainer's phase spans open and close.
#[derive(Clone, Default)]
struct PhaseLayer {
    events: Arc<Mutex<Vec<Event>>>,
}

const SPANS: [&str; 4] = [
    "sampling",
    "train_step",
    "stream_rollout",
    "save_for_sampler",
];

impl PhaseLayer {
    fn name(meta: &tracing::Metadata<'_>) -> Option<&'static str> {
        let name = meta.name();
        SPANS.into_iter().find(|s| *s == name)
    }

    fn push(&self, name: &'static str, open: bool) {
        let mark = Mark::now();
        if let Ok(mut events) = self.events.lock() {
            events.push((name, open, mark));
        }
    }

    fn take(&self) -> Vec<Event> {
        self.events
            .lock()
            .map(|mut e| std::mem::take(&mut *e))
            .unwrap_or_default()
    }
}

impl<S> Layer<S> for PhaseLayer
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    fn on_new_span(
        &self,
        attrs: &tracing::span::Attributes<'_>,
        _id: &tracing::span::Id,
        _ctx: LayerContext<'_, S>,
    ) {
        if let Some(name) = Self::name(attrs.metadata()) {
            self.push(name, true);
        }
    }

    fn on_close(&self, id: tracing::span::Id, ctx: LayerContext<'_, S>) {
        if let Some(span) = ctx.span(&id)
            && let Some(name) = Self::name(span.metadata())
        {
            self.push(name, false);
        }
    }
}

/// The tutorial's grader (`grade_answer` in its loop, as in `seed_loop.py`): the last
/// `\boxed{...}` without braces inside, commas removed, equal to the answer. rlvr's
/// `BoxedAnswer` follows the cookbook instead (a stray `}` anywhere means no answer), which
/// on the fake server's random-token completions rejects some right answers and so trains
/// fewer datums than the Python loop; this keeps both sides at the same 64 datums per step.
fn tutorial_grade(problem: &Problem, text: &str) -> f64 {
    let Some(answer) = last_boxed(text) else {
        return 0.0;
    };
    let clean = |s: &str| s.trim().replace(',', "").trim().to_string();
    f64::from(u8::from(clean(answer) == clean(&problem.answer)))
}

/// The group of the last match of the tutorial's `\\boxed\{([^}]+)\}` (`re.findall(...)[-1]`),
/// found with `memchr` rather than a regex engine: a match starts at a `\boxed{` and ends at
/// the first `}` after it, holding at least one character; the next search starts after the
/// match, or one byte after a `\boxed{` that is followed at once by `}`. (The `regex` crate
/// ran a reverse scan back from every `}` of the response: about 12 instructions a byte on
/// the fake server's completions, against well under one here; the test below checks both
/// give the same answer.)
fn last_boxed(text: &str) -> Option<&str> {
    const OPEN: &[u8] = b"\\boxed{";
    static FINDER: std::sync::OnceLock<memchr::memmem::Finder<'static>> =
        std::sync::OnceLock::new();
    let finder = FINDER.get_or_init(|| memchr::memmem::Finder::new(OPEN));
    let bytes = text.as_bytes();
    let (mut from, mut last) = (0, None);
    while let Some(i) = finder.find(&bytes[from..]) {
        let start = from + i + OPEN.len();
        match memchr::memchr(b'}', &bytes[start..]) {
            // No `}` after this `\boxed{`: none after any later one either.
            None => break,
            Some(0) => from += i + 1,
            Some(n) => {
                // `start` follows an ASCII `{` and `start + n` is an ASCII `}`: both are
                // character boundaries.
                last = text.get(start..start + n);
                from = start + n + 1;
            }
        }
    }
    last
}

/// `cpu_s` of the server's `GET /bench/stats` (a plain HTTP/1.0 request of its own, so that
/// the client's connection pool is not touched).
fn server_cpu(base_url: &str) -> Option<f64> {
    let host = base_url
        .trim_start_matches("http://")
        .split('/')
        .next()
        .unwrap_or("127.0.0.1:8799");
    let mut stream = TcpStream::connect(host).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        stream,
        "GET /bench/stats HTTP/1.0\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response).ok()?;
    let body_at = response.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
    let stats: serde_json::Value = serde_json::from_slice(&response[body_at..]).ok()?;
    stats.get("cpu_s")?.as_f64()
}

/// Per-phase (wall, CPU) seconds of one step from its span events, between `start` and `end`.
fn phases(events: &[Event], start: Mark, end: Mark) -> BTreeMap<&'static str, (f64, f64)> {
    let d = |a: Mark, b: Mark| (b.wall.duration_since(a.wall).as_secs_f64(), b.cpu - a.cpu);
    let mut out: BTreeMap<&'static str, (f64, f64)> =
        PHASES.iter().map(|p| (*p, (0.0, 0.0))).collect();
    fn add(out: &mut BTreeMap<&'static str, (f64, f64)>, phase: &'static str, (w, c): (f64, f64)) {
        if let Some(slot) = out.get_mut(phase) {
            slot.0 += w;
            slot.1 += c;
        }
    }
    let mut open: BTreeMap<&'static str, Mark> = BTreeMap::new();
    let mut sampling_end = None;
    for &(name, is_open, mark) in events {
        if is_open {
            open.insert(name, mark);
            if name == "train_step"
                && let Some(sampled) = sampling_end.take()
            {
                add(&mut out, "grade", d(sampled, mark));
            }
            continue;
        }
        let Some(opened) = open.remove(name) else {
            continue;
        };
        match name {
            "sampling" => {
                add(&mut out, "sample", d(opened, mark));
                sampling_end = Some(mark);
            }
            // Streaming: sampling, grading and the first submissions together.
            "stream_rollout" => add(&mut out, "sample", d(opened, mark)),
            "train_step" => add(&mut out, "train", d(opened, mark)),
            "save_for_sampler" => add(&mut out, "save", d(opened, mark)),
            _ => {}
        }
    }
    let total = d(start, end);
    let known: (f64, f64) = out
        .values()
        .fold((0.0, 0.0), |acc, v| (acc.0 + v.0, acc.1 + v.1));
    add(&mut out, "other", (total.0 - known.0, total.1 - known.1));
    out
}

// One runtime thread: the client mostly waits on the server, and the rewards run on the
// trainer's grading threads, so a multi-threaded runtime would only add thread hand-offs
// (about a tenth more client CPU per step: docs/performance.md).
#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let layer = PhaseLayer::default();
    tracing_subscriber::registry()
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_filter(tracing_subscriber::EnvFilter::new(
                    std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()),
                )),
        )
        .with(
            layer
                .clone()
                .with_filter(tracing_subscriber::filter::filter_fn(|meta| {
                    meta.is_span() && PhaseLayer::name(meta).is_some()
                }))
                // A filter function gives no level hint, which would make every `log`
                // record of the dependencies (tokenizers logs each character it normalizes
                // at trace level) reach the subscriber; the phase spans are at INFO.
                .with_filter(tracing_subscriber::filter::LevelFilter::INFO),
        )
        .init();
    let args = Args::parse();
    if server_cpu(&args.base_url).is_none() {
        bail!(
            "no fake Tinker server at {} (GET /bench/stats failed); start \
             benches/tinker_client/fake_tinker_server.py first",
            args.base_url
        );
    }
    let temp;
    let log_dir = match &args.log_dir {
        Some(dir) => dir.clone(),
        None => {
            temp = tempfile::tempdir()?;
            temp.path().join("run")
        }
    };
    let total = args.steps + args.warmup;
    let config = TrainerConfig::builder()
        .max_steps(total)
        .batch_size(args.batch_size)
        .group_size(args.group_size)
        .max_tokens(args.max_tokens)
        .temperature(1.0)
        .learning_rate(4e-5)
        .adam_beta1(0.9)
        .adam_beta2(0.95)
        .loss(LossFn::ImportanceSampling)
        .save_every(0)
        // The tutorial walks GSM8K train in file order.
        .shuffle(false)
        .log_dir(&log_dir)
        .build()?;
    let train_set = Gsm8k::from_dir(&args.data, Split::Train)
        .with_context(|| format!("GSM8K train split in {}", args.data.display()))?;
    let tokenizer = Tokenizer::from_file(&args.tokenizer)
        .with_context(|| format!("tokenizer {}", args.tokenizer.display()))?;

    let tinker = TinkerConfig::new("tml-bench-dummy-key-000000000000")?.base_url(&args.base_url);
    let client = TinkerClient::connect(tinker).await?;
    let backend = client
        .create_lora_training_with(
            "Qwen/Qwen3.5-9B-Base",
            LoraConfig::new(32),
            TinkerBackendOptions {
                tokenizer: Some(tokenizer.clone()),
            },
        )
        .await?;
    let renderer = rlvr::renderer::by_name("role_colon", tokenizer)?;
    let mut trainer = GrpoTrainer::new(
        backend,
        tutorial_grade,
        renderer,
        Arc::new(train_set),
        config,
    )?;

    let mut records = Vec::new();
    let mut walls = Vec::new();
    let mut cpus = Vec::new();
    for step in 0..total {
        let srv0 = server_cpu(&args.base_url);
        layer.take();
        let sys0 = process_sys();
        let start = Mark::now();
        let m = trainer.step().await?;
        let end = Mark::now();
        let sys_s = process_sys() - sys0;
        let srv1 = server_cpu(&args.base_url);
        let ph = phases(&layer.take(), start, end);
        let wall_s = end.wall.duration_since(start.wall).as_secs_f64();
        let cpu_s = end.cpu - start.cpu;
        let server_cpu_s = srv0.zip(srv1).map(|(a, b)| b - a);
        let warmup = step < args.warmup;
        if !warmup {
            walls.push(wall_s);
            cpus.push(cpu_s);
        }
        let tag = if warmup {
            "warm".to_string()
        } else {
            format!("{:4}", step - args.warmup)
        };
        println!(
            "step {tag} | wall {:7.1} ms cpu {:7.1} ms | {} | server cpu {} | datums {} reward {:.3}",
            wall_s * 1e3,
            cpu_s * 1e3,
            PHASES
                .iter()
                .map(|p| format!("{p} {:6.1}/{:6.1}", ph[p].0 * 1e3, ph[p].1 * 1e3))
                .collect::<Vec<_>>()
                .join(" "),
            server_cpu_s.map_or("n/a".into(), |s| format!("{:6.1} ms", s * 1e3)),
            m.datums,
            m.reward_mean,
        );
        records.push(serde_json::json!({
            "step": step,
            "warmup": warmup,
            "wall_s": wall_s,
            "cpu_s": cpu_s,
            "sys_s": sys_s,
            "server_cpu_s": server_cpu_s,
            "wall": PHASES.iter().map(|p| (p.to_string(), serde_json::json!(ph[p].0))).collect::<serde_json::Map<_, _>>(),
            "cpu": PHASES.iter().map(|p| (p.to_string(), serde_json::json!(ph[p].1))).collect::<serde_json::Map<_, _>>(),
            "datums": m.datums,
            "reward": m.reward_mean,
        }));
    }
    client.close().await?;
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
    };
    println!(
        "median over {} steps: wall {:.1} ms, cpu {:.1} ms",
        walls.len(),
        median(&mut walls) * 1e3,
        median(&mut cpus) * 1e3
    );
    if let Some(path) = &args.bench_json {
        let out = serde_json::json!({
            "config": {
                "client": "rlvr",
                "steps": args.steps,
                "warmup": args.warmup,
                "batch_size": args.batch_size,
                "group_size": args.group_size,
                "max_tokens": args.max_tokens,
                "run_dir": log_dir,
            },
            "steps": records,
        });
        std::fs::write(path, serde_json::to_vec_pretty(&out)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::last_boxed;

    /// `re.findall(r"\\boxed\{([^}]+)\}", text)[-1]`, through the regex engine.
    fn by_regex(text: &str) -> Option<&str> {
        let re = regex::Regex::new(r"\\boxed\{([^}]+)\}").expect("pattern");
        re.captures_iter(text)
            .last()
            .and_then(|c| c.get(1))
            .map(|m| m.as_str())
    }

    #[test]
    fn last_boxed_is_the_tutorials_regex() {
        let cases = [
            "",
            "no answer",
            "\\boxed{42}",
            "a \\boxed{1} b \\boxed{2} c",
            "\\boxed{}\\boxed{7}",
            "\\boxed{} \\boxed{",
            "\\boxed{ \\boxed{5}",
            "\\boxed{3} \\boxed{",
            "\\boxed{3} \\boxed{}",
            "\\boxed{1,234}}}",
            "\\boxed\\boxed{9}",
            "\\boxed{é\n}\\boxed{x}",
            "}\\boxed{{}}",
            "\\boxed{a}b}",
            "\\\\boxed{8}",
        ];
        for text in cases {
            assert_eq!(last_boxed(text), by_regex(text), "{text:?}");
        }
        // Every concatenation of up to five of the pattern's pieces and a few other bytes.
        let alphabet = ["\\boxed{", "}", "{", "1", "\\", "b"];
        let mut texts = vec![String::new()];
        for _ in 0..5 {
            let mut next = Vec::new();
            for t in &texts {
                for a in alphabet {
                    next.push(format!("{t}{a}"));
                }
            }
            for t in &next {
                assert_eq!(last_boxed(t), by_regex(t), "{t:?}");
            }
            texts = next;
        }
    }
}
