//! Crash-resume proof on the local backend: a quickstart-shaped training (the embedded tiny
//! model, LoRA, synthetic word problems, the format-aware boxed reward) runs in a child
//! process that is killed with `SIGKILL` at planned points — while sampling, grading and
//! training, and in the middle of writing `metrics.jsonl`, the samples, a checkpoint
//! directory, `checkpoints.jsonl` and (off-policy) the batches sampled ahead — and resumed
//! each time with the same command. At the end:
//!
//! - `metrics.jsonl` holds each step exactly once, and each row equals the row of an
//!   uninterrupted run with the same seed (timings aside);
//! - `samples/` holds each step once, byte-identical to the uninterrupted run's;
//! - no file is torn or half-written, no temporary is left over;
//! - the final weights are bit-identical to the uninterrupted run's;
//!
//! on policy, and with `max_steps_off_policy` 2 (checkpoints save the batches sampled ahead)
//! together with DAPO's dynamic sampling (`dynamic_sampling_rounds` 2: the extra rounds are
//! sampled again after a resume, or come back with the batch sampled ahead).
//!
//! The child is this test binary itself, filtered to `crash_resume::crash_child` (ignored
//! unless the parent starts it). It announces phases through `tracing` span events on stdout
//! and, through a write hook, every file write — pausing 20 ms in the middle of it, so that a
//! kill lands inside. Both the subscriber and the hook are process-wide: only that child,
//! which runs nothing else, sets them.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::mpsc;
use std::time::Duration;

use rand::{Rng, SeedableRng};
use rlvr::backend::local::{LocalBackend, LocalOptions};
use rlvr::dataset::word_problems::WordProblems;
use rlvr::types::LoraConfig;
use rlvr::{BoxedAnswer, PolicyBackend, RoleColon, types::LossFn};
use rlvr::{GrpoTrainer, TrainerConfig};

const CHILD: &str = "RLVR_CRASH_CHILD";
const CHILD_DIR: &str = "RLVR_CRASH_DIR";
const CHILD_OFF_POLICY: &str = "RLVR_CRASH_OFF_POLICY";
const CHILD_DYNAMIC: &str = "RLVR_CRASH_DYNAMIC_ROUNDS";
const CHILD_HOOK: &str = "RLVR_CRASH_HOOK";

const STEPS: u64 = 10;
const SAVE_EVERY: u64 = 2;

fn model_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/tiny-wordproblems")
}

/// The child: one life of the training run in `RLVR_CRASH_DIR` (resumed if it has a
/// checkpoint). Does nothing unless started by a parent test.
#[test]
#[ignore = "the child process of the crash_resume tests (they start it)"]
fn crash_child() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    let dir = PathBuf::from(std::env::var(CHILD_DIR).expect("RLVR_CRASH_DIR"));
    let off_policy: u64 = std::env::var(CHILD_OFF_POLICY)
        .expect("RLVR_CRASH_OFF_POLICY")
        .parse()
        .expect("off-policy steps");
    let dynamic_rounds: usize = std::env::var(CHILD_DYNAMIC)
        .expect("RLVR_CRASH_DYNAMIC_ROUNDS")
        .parse()
        .expect("dynamic sampling rounds");
    if std::env::var_os(CHILD_HOOK).is_some() {
        rlvr::__private::set_write_hook(announce_and_pause);
    }
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new("rlvr=info"))
        .with_span_events(tracing_subscriber::fmt::format::FmtSpan::NEW)
        .with_ansi(false)
        .without_time()
        .with_writer(std::io::stdout)
        .init();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async move {
        let options = LocalOptions::default()
            .lora(LoraConfig {
                seed: Some(0),
                ..LoraConfig::new(8)
            })
            .seed(0)
            .threads(1)
            .checkpoint_dir(dir.join("checkpoints"));
        let backend = LocalBackend::from_dir(model_dir(), options).expect("tiny model");
        let renderer = Arc::new(RoleColon::new(backend.tokenizer().clone()));
        let all = WordProblems::new(0, WordProblems::space_size()).expect("problems");
        let (train, _) = all.split(1000).expect("split");
        let config = TrainerConfig::builder()
            .batch_size(4)
            .group_size(4)
            .max_tokens(32)
            .temperature(1.0)
            .learning_rate(2e-3)
            .loss(LossFn::ImportanceSampling)
            .seed(0)
            .max_steps(STEPS)
            .max_steps_off_policy(off_policy)
            .dynamic_sampling_rounds(dynamic_rounds)
            .save_every(SAVE_EVERY)
            .log_dir(&dir)
            .build()
            .expect("config");
        let mut trainer = GrpoTrainer::new(
            backend,
            BoxedAnswer::format_aware(),
            renderer,
            Arc::new(train),
            config,
        )
        .expect("trainer");
        trainer.run().await.expect("run");
    });
    println!("@@done");
}

/// The write hook of the child: announce the write, then pause inside it.
fn announce_and_pause(what: &str, path: &Path) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "@@write {what} {}", path.display());
    let _ = out.flush();
    drop(out);
    std::thread::sleep(Duration::from_millis(20));
}

/// Where a kill lands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Target {
    Sampling,
    Grading,
    Training,
    /// Mid-append of a `metrics.jsonl` row.
    MetricsRow,
    /// Mid-write of `samples/NNNNNN.jsonl` or `.html`.
    Samples,
    /// A checkpoint directory written but not yet renamed into place.
    CheckpointDir,
    /// Mid-append of a `checkpoints.jsonl` record.
    CheckpointRecord,
    /// Mid-write of `prefetched/NAME.json` (off-policy only).
    Prefetched,
}

impl Target {
    /// Whether a line of the child's output announces this target.
    fn matches(self, line: &str) -> bool {
        let span = |name: &str| new_span(line).is_some_and(|(n, _)| n == name);
        let write = |what: &str, pred: &dyn Fn(&str) -> bool| {
            line.strip_prefix(&format!("@@write {what} "))
                .is_some_and(pred)
        };
        match self {
            Target::Sampling => span("sampling"),
            Target::Grading => span("grading"),
            Target::Training => span("train_step"),
            Target::MetricsRow => write("append", &|p| p.ends_with("metrics.jsonl")),
            Target::Samples => write("atomic", &|p| p.contains("/samples/")),
            Target::CheckpointDir => write("checkpoint", &|_| true),
            Target::CheckpointRecord => write("append", &|p| p.ends_with("checkpoints.jsonl")),
            Target::Prefetched => write("atomic", &|p| p.contains("/prefetched/")),
        }
    }

    /// How long after the announcement the kill comes: anywhere in a phase, or inside the
    /// write's 20 ms pause.
    fn max_delay_ms(self) -> u64 {
        match self {
            Target::Sampling | Target::Grading | Target::Training => 120,
            _ => 15,
        }
    }
}

/// The innermost span of a span-creation line (`INFO step{step=3}:sampling{step=3}: rlvr::trainer: new`):
/// its name and its `step` field, if any.
fn new_span(line: &str) -> Option<(&str, Option<u64>)> {
    let body = line.strip_suffix(": new")?.trim_start();
    let (_level, rest) = body.split_once(' ')?;
    let spans = rest.split(": ").next()?;
    let last = spans.rsplit("}:").next()?;
    let (name, fields) = last.split_once('{')?;
    let step = fields
        .split_once("step=")
        .and_then(|(_, v)| v.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|v| v.parse().ok());
    Some((name, step))
}

enum Life {
    Killed { target: Target, step: u64 },
    Finished,
}

/// What the lives reported repairing: torn last lines, left-over temporaries.
#[derive(Debug, Default)]
struct Repairs {
    torn_lines: usize,
    temporaries: usize,
}

/// Starts one life of the child in `dir`; kills it at the first `target` announced at a
/// step ≥ `min_step` (after a random delay), or lets it finish when `target` is `None`.
fn life(
    dir: &Path,
    (off_policy, dynamic_rounds): (u64, usize),
    plan: Option<(Target, u64)>,
    rng: &mut impl Rng,
    repairs: &mut Repairs,
) -> Life {
    let exe = std::env::current_exe().expect("test binary");
    let mut child = Command::new(exe)
        .args([
            // `crash_resume::crash_child`: this test binary holds every integration test.
            crate::common::isolate::test_name(module_path!(), "crash_child").as_str(),
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, "1")
        .env(CHILD_DIR, dir)
        .env(CHILD_OFF_POLICY, off_policy.to_string())
        .env(CHILD_DYNAMIC, dynamic_rounds.to_string())
        .env(CHILD_HOOK, "1")
        .env("RAYON_NUM_THREADS", "1")
        .env("CANDLE_NUM_THREADS", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn the child");
    let stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = mpsc::channel::<String>();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut step = 0u64;
    let mut done = false;
    let mut outcome = None;
    while let Ok(line) = rx.recv_timeout(Duration::from_secs(300)) {
        if let Some((_, Some(s))) = new_span(&line) {
            step = s;
        }
        if line == "@@done" {
            done = true;
        }
        if line.contains("torn last line") || line.contains("lacked its newline") {
            repairs.torn_lines += 1;
        }
        if line.contains("removed a temporary left by a killed writer") {
            repairs.temporaries += 1;
        }
        if let Some((target, min_step)) = plan
            && step >= min_step
            && target.matches(&line)
        {
            let delay = rng.random_range(0..=target.max_delay_ms());
            std::thread::sleep(Duration::from_millis(delay));
            child.kill().expect("SIGKILL the child");
            outcome = Some(Life::Killed { target, step });
            break;
        }
    }
    let status = child.wait().expect("wait for the child");
    drop(rx);
    let _ = reader.join();
    match outcome {
        Some(killed) => killed,
        None => {
            assert!(
                status.success() && done,
                "the child ended without finishing ({status}); plan {plan:?}"
            );
            Life::Finished
        }
    }
}

/// `metrics.jsonl` rows by step, each step exactly once, the timing keys left out.
fn metrics_by_step(dir: &Path) -> BTreeMap<u64, BTreeMap<String, serde_json::Value>> {
    let text = std::fs::read_to_string(dir.join("metrics.jsonl")).expect("metrics.jsonl");
    assert!(text.ends_with('\n'), "metrics.jsonl ends mid-line");
    let mut rows = BTreeMap::new();
    for (i, line) in text.lines().enumerate() {
        let mut row: BTreeMap<String, serde_json::Value> = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("metrics.jsonl line {}: {e}", i + 1));
        let step = row["step"].as_u64().expect("step");
        row.retain(|k, _| !k.starts_with("time/"));
        assert!(
            rows.insert(step, row).is_none(),
            "step {step} appears twice in metrics.jsonl"
        );
    }
    rows
}

/// The final checkpoint's parameters: name → (dtype, shape, bytes).
fn final_params(dir: &Path) -> BTreeMap<String, (String, Vec<usize>, Vec<u8>)> {
    let text = std::fs::read_to_string(dir.join("checkpoints.jsonl")).expect("checkpoints.jsonl");
    let last: serde_json::Value =
        serde_json::from_str(text.lines().last().expect("a checkpoint")).expect("record");
    assert_eq!(last["name"], "final");
    let path =
        PathBuf::from(last["backend"]["path"].as_str().expect("path")).join("params.safetensors");
    let bytes = std::fs::read(&path).expect("params.safetensors");
    let tensors = safetensors::SafeTensors::deserialize(&bytes).expect("safetensors");
    tensors
        .tensors()
        .into_iter()
        .map(|(name, view)| {
            (
                name,
                (
                    format!("{:?}", view.dtype()),
                    view.shape().to_vec(),
                    view.data().to_vec(),
                ),
            )
        })
        .collect()
}

/// Every file under `dir`: no leftover temporary, every JSON / JSONL file whole, every
/// safetensors file readable.
fn assert_nothing_half_written(dir: &Path) {
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).expect("read_dir") {
            let path = entry.expect("entry").path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            assert!(
                !name.contains(".tmp-"),
                "left-over temporary {}",
                path.display()
            );
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            let bytes = std::fs::read(&path).expect("read");
            if name.ends_with(".jsonl") {
                assert!(
                    bytes.is_empty() || bytes.ends_with(b"\n"),
                    "{} is torn",
                    path.display()
                );
                for (i, line) in bytes.split(|b| *b == b'\n').enumerate() {
                    if !line.is_empty() {
                        serde_json::from_slice::<serde_json::Value>(line)
                            .unwrap_or_else(|e| panic!("{} line {}: {e}", path.display(), i + 1));
                    }
                }
            } else if name.ends_with(".json") {
                serde_json::from_slice::<serde_json::Value>(&bytes)
                    .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            } else if name.ends_with(".safetensors") {
                safetensors::SafeTensors::deserialize(&bytes)
                    .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            }
        }
    }
}

fn samples(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(dir.join("samples"))
        .expect("samples/")
        .map(|e| {
            let p = e.expect("entry").path();
            (
                p.file_name().unwrap().to_string_lossy().into_owned(),
                std::fs::read(&p).expect("sample file"),
            )
        })
        .collect()
}

fn crash_resume(off_policy: u64, dynamic_rounds: usize) {
    let run = (off_policy, dynamic_rounds);
    let root = tempfile::tempdir().expect("tempdir");
    let reference = root.path().join("reference");
    let crashed = root.path().join("crashed");
    let seed: u64 = std::env::var("RLVR_CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20261202 + off_policy + 10 * dynamic_rounds as u64);
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);

    // The uninterrupted run.
    let mut repairs = Repairs::default();
    assert!(matches!(
        life(&reference, run, None, &mut rng, &mut repairs),
        Life::Finished
    ));

    // The plan: every target three times, at steps spread over the run (non-decreasing, so
    // the run cannot finish before the last kill).
    let mut targets = vec![
        Target::Sampling,
        Target::Grading,
        Target::Training,
        Target::MetricsRow,
        Target::Samples,
        Target::CheckpointDir,
        Target::CheckpointRecord,
    ];
    if off_policy > 0 {
        targets.push(Target::Prefetched);
    }
    let rounds = 3;
    let kills = targets.len() * rounds;
    let mut plan = Vec::new();
    for i in 0..kills {
        let target = targets[i % targets.len()];
        let min_step = (i as u64 * (STEPS - 2)) / kills as u64;
        plan.push((target, min_step));
    }
    let mut landed: BTreeMap<Target, BTreeSet<u64>> = BTreeMap::new();
    for &(target, min_step) in &plan {
        match life(
            &crashed,
            run,
            Some((target, min_step)),
            &mut rng,
            &mut repairs,
        ) {
            Life::Killed { target, step } => {
                landed.entry(target).or_default().insert(step);
            }
            Life::Finished => {
                panic!("the run finished before the kill planned at {target:?} step ≥ {min_step}")
            }
        }
    }
    let total_kills: usize = plan.len();
    eprintln!(
        "off-policy {off_policy}, dynamic sampling {dynamic_rounds}: {total_kills} kills (seed {seed}), steps by phase: {landed:?}"
    );
    assert!(total_kills >= 20);
    assert_eq!(landed.len(), targets.len(), "every phase was hit");

    // The last life finishes the run.
    assert!(matches!(
        life(&crashed, run, None, &mut rng, &mut repairs),
        Life::Finished
    ));
    eprintln!("repairs: {repairs:?}");
    // The kills landed inside writes: torn lines were repaired, temporaries swept.
    assert!(
        repairs.torn_lines > 0 && repairs.temporaries > 0,
        "{repairs:?}"
    );

    // Each step exactly once, equal to the uninterrupted run.
    let want = metrics_by_step(&reference);
    if dynamic_rounds > 0 {
        // The run did sample extra rounds (and resumed through them).
        let extra: f64 = want
            .values()
            .map(|r| {
                r["dynamic_sampling/rounds"]
                    .as_f64()
                    .expect("dynamic_sampling/rounds")
            })
            .sum();
        assert!(extra > 0.0, "no step needed an extra round");
    }
    let got = metrics_by_step(&crashed);
    assert_eq!(
        got.keys().copied().collect::<Vec<_>>(),
        (0..STEPS).collect::<Vec<_>>(),
        "metrics.jsonl must hold each step exactly once"
    );
    for (step, row) in &want {
        assert_eq!(
            &got[step], row,
            "step {step}'s metrics differ from the uninterrupted run"
        );
    }
    // The same samples, step by step.
    let (want_samples, got_samples) = (samples(&reference), samples(&crashed));
    assert_eq!(
        got_samples.keys().collect::<Vec<_>>(),
        want_samples.keys().collect::<Vec<_>>()
    );
    for (name, bytes) in &want_samples {
        assert!(
            &got_samples[name] == bytes,
            "samples/{name} differs from the uninterrupted run"
        );
    }
    // Nothing torn, nothing left over.
    assert_nothing_half_written(&crashed);
    // The same final weights, bit for bit.
    let (want_params, got_params) = (final_params(&reference), final_params(&crashed));
    assert_eq!(want_params.len(), got_params.len());
    for (name, want) in &want_params {
        assert!(
            got_params.get(name) == Some(want),
            "parameter {name} differs from the uninterrupted run"
        );
    }
}

#[test]
fn killed_on_policy_run_resumes_to_the_same_weights() {
    crash_resume(0, 0);
}

/// Off-policy (two steps sampled ahead, saved with the checkpoints) with DAPO's dynamic
/// sampling: the most state a resume has to restore, in one run.
#[test]
fn killed_off_policy_dynamic_sampling_run_resumes_to_the_same_weights() {
    crash_resume(2, 2);
}
