//! The `gsm8k` example run as a user runs it: the compiled example binary (cargo builds
//! examples for `cargo test`; `cargo test --test example_gsm8k` alone does not, so build it
//! with `cargo build --example gsm8k` first). Each test is skipped with a message when the
//! binary is not there.
//!
//! Nothing here touches the network: the Tinker key is removed from the environment, the
//! hub is put in offline mode, and the local runs use the tiny Qwen3 fixture and the GSM8K
//! fixture files.
#![cfg(all(
    feature = "tinker",
    feature = "local",
    feature = "hub",
    feature = "parquet"
))]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// `target/<profile>/examples/gsm8k`, next to this test's `target/<profile>/deps/`.
fn example_binary() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let profile_dir = exe.parent()?.parent()?;
    let bin = profile_dir
        .join("examples")
        .join(format!("gsm8k{}", std::env::consts::EXE_SUFFIX));
    if bin.is_file() {
        Some(bin)
    } else {
        eprintln!(
            "skipped: the example binary {} is not built (cargo build --example gsm8k)",
            bin.display()
        );
        None
    }
}

/// Runs the example in `cwd` with a clean environment: no Tinker settings, hub offline.
fn run(bin: &Path, cwd: &Path, args: &[&str]) -> Output {
    Command::new(bin)
        .args(args)
        .current_dir(cwd)
        .env_remove("TINKER_API_KEY")
        .env_remove("TINKER_BASE_URL")
        .env("HF_HUB_OFFLINE", "1")
        .env("HF_HUB_CACHE", cwd.join("hf-cache"))
        .env("RUST_BACKTRACE", "0")
        .output()
        .expect("starting the example")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

#[test]
fn without_a_key_or_a_model_it_explains_both_options_and_fails() {
    let Some(bin) = example_binary() else { return };
    let cwd = tempfile::tempdir().unwrap();
    for args in [&[][..], &["--local"][..], &["--steps", "3"][..]] {
        let out = run(&bin, cwd.path(), args);
        let stderr = text(&out.stderr);
        assert!(!out.status.success(), "{args:?} succeeded: {stderr}");
        for needle in [
            "TINKER_API_KEY",
            "--model",
            "TINKER_BASE_URL",
            "cargo run --release --example quickstart",
        ] {
            assert!(
                stderr.contains(needle),
                "{args:?}: no `{needle}` in: {stderr}"
            );
        }
        // Nothing was started, so no run directory was created.
        assert!(!cwd.path().join("runs").exists());
    }
}

#[test]
fn local_without_a_model_explains_even_with_a_tinker_key() {
    let Some(bin) = example_binary() else { return };
    let cwd = tempfile::tempdir().unwrap();
    // With a key but `--local` and no `--model`: the same explanation, no request is made.
    let out = Command::new(&bin)
        .args(["--local"])
        .current_dir(cwd.path())
        .env("TINKER_API_KEY", "tml-not-a-real-key")
        .env("TINKER_BASE_URL", "http://127.0.0.1:9")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("--model"),
        "{}",
        text(&out.stderr)
    );
}

/// The tiny Qwen3 fixture (a 64-character vocabulary) with room for GSM8K's few-shot prompt:
/// its `max_position_embeddings` (128) is raised, which only lengthens the RoPE tables.
fn tiny_model(dir: &Path) -> PathBuf {
    let src = fixtures().join("qwen3-tiny/untied");
    let dst = dir.join("tiny-qwen3");
    std::fs::create_dir_all(&dst).unwrap();
    for f in [
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ] {
        std::fs::copy(src.join(f), dst.join(f)).unwrap();
    }
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    config["max_position_embeddings"] = 4096.into();
    std::fs::write(dst.join("config.json"), config.to_string()).unwrap();
    dst
}

fn metrics_rows(run_dir: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(run_dir.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn it_trains_on_the_local_backend_and_resumes() {
    let Some(bin) = example_binary() else { return };
    let cwd = tempfile::tempdir().unwrap();
    let model = tiny_model(cwd.path());
    let data = fixtures().join("gsm8k");
    let common = [
        "--model",
        model.to_str().unwrap(),
        "--data",
        data.to_str().unwrap(),
        "--batch-size",
        "2",
        "--group-size",
        "2",
        "--max-tokens",
        "4",
        "--lora-rank",
        "2",
        "--eval-every",
        "1",
        "--eval-problems",
        "2",
    ];
    let run_dir = cwd.path().join("run");

    let mut first: Vec<&str> = common.to_vec();
    first.extend(["--steps", "1", "--log-dir", run_dir.to_str().unwrap()]);
    let out = run(&bin, cwd.path(), &first);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    assert!(stdout.contains("step 1/1"), "{stdout}");
    assert!(
        stdout.contains("reward") && stdout.contains("datums"),
        "{stdout}"
    );
    let rows = metrics_rows(&run_dir);
    // Step 0 (with its evaluation) and the final evaluation's row at step 1.
    assert_eq!(rows[0]["step"], 0);
    assert!(rows[0]["env/all/reward/total"].is_number(), "{}", rows[0]);
    assert!(rows[0]["test/env/all/correct"].is_number(), "{}", rows[0]);
    assert_eq!(rows.last().unwrap()["step"], 1);
    for f in ["config.json", "checkpoints.jsonl", "samples/000000.jsonl"] {
        assert!(run_dir.join(f).is_file(), "{f} missing");
    }
    // The local backend's checkpoints live in the run directory.
    assert!(run_dir.join("checkpoints/final").is_dir());

    // `--resume` with one more step runs only step 1.
    let mut resume: Vec<&str> = common.to_vec();
    resume.extend(["--steps", "2", "--resume", run_dir.to_str().unwrap()]);
    let out = run(&bin, cwd.path(), &resume);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    assert!(stdout.contains("step 2/2"), "{stdout}");
    assert!(!stdout.contains("step 1/2"), "{stdout}");
    let steps: Vec<u64> = metrics_rows(&run_dir)
        .iter()
        .map(|r| r["step"].as_u64().unwrap())
        .collect();
    assert_eq!(steps, [0, 1, 2], "{steps:?}");

    // Resuming a directory that is not a run is refused.
    let mut bad: Vec<&str> = common.to_vec();
    let empty = cwd.path().join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    bad.extend(["--resume", empty.to_str().unwrap()]);
    let out = run(&bin, cwd.path(), &bad);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("no checkpoints.jsonl"),
        "{}",
        text(&out.stderr)
    );
}
