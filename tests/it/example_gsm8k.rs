//! The `gsm8k` example run as a user runs it: the compiled example binary (cargo builds
//! examples for `cargo test`; `cargo test --test it` alone does not, so build it with
//! `cargo build --example gsm8k` first). Each test is skipped with a message when the
//! binary is not there — except under CI (`CI` set to anything but `""`, `0` or `false`),
//! where a missing binary fails the test instead of silently skipping it.
//!
//! Nothing here touches the network: the Tinker key is removed from the environment, the
//! hub is put in offline mode, and the local runs use the tiny Qwen3 fixture and the GSM8K
//! fixture files.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// `target/<profile>/examples/gsm8k`, next to this test's `target/<profile>/deps/`.
fn example_binary() -> Option<PathBuf> {
    example_binary_named("gsm8k")
}

/// `target/<profile>/examples/<name>` (`None`, with a message, when it is not built and CI
/// is not set).
pub(crate) fn example_binary_named(name: &str) -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let profile_dir = exe.parent()?.parent()?;
    let bin = profile_dir
        .join("examples")
        .join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    if bin.is_file() {
        Some(bin)
    } else if in_ci() {
        panic!(
            "the example binary {} is not built (cargo build --example {name}); \
             CI is set, so this test fails instead of skipping",
            bin.display()
        );
    } else {
        eprintln!(
            "skipped: the example binary {} is not built (cargo build --example {name})",
            bin.display()
        );
        None
    }
}

/// Whether we run under CI (`CI=true`, as CI services set it).
fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !matches!(v.trim(), "" | "0" | "false" | "FALSE"))
}

/// Runs the example in `cwd` with a clean environment: no Tinker settings, hub offline.
pub(crate) fn run(bin: &Path, cwd: &Path, args: &[&str]) -> Output {
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

pub(crate) fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

pub(crate) fn fixtures() -> PathBuf {
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

#[test]
fn bad_settings_are_reported_before_any_model_is_loaded() {
    let Some(bin) = example_binary() else { return };
    let cwd = tempfile::tempdir().unwrap();
    // The model does not exist either, but the data is read first.
    let missing = cwd.path().join("no-such-data");
    let data = fixtures().join("gsm8k");
    let data = data.to_str().unwrap();
    let cases: [(Vec<&str>, &str); 6] = [
        (
            vec![
                "--model",
                "no-such-model",
                "--data",
                missing.to_str().unwrap(),
            ],
            "no-such-data",
        ),
        (
            vec!["--model", "no-such-model", "--group-size", "0"],
            "group_size",
        ),
        (
            vec!["--model", "no-such-model", "--loss", "l2"],
            "unknown loss `l2`",
        ),
        // The renderer is settled before the model is loaded: an unknown name fails...
        (
            vec![
                "--model",
                "no-such-model",
                "--data",
                data,
                "--renderer",
                "nope",
            ],
            "unknown renderer `nope`",
        ),
        // ...and so does a model the cookbook's table does not list, without --renderer
        // (never a silent role-colon).
        (
            vec!["--model", "no-such-model", "--data", data],
            "Pass --renderer NAME",
        ),
        (
            vec!["--local", "--model", "acme/unlisted-7B", "--data", data],
            "no recommended renderer is known for model `acme/unlisted-7B`",
        ),
    ];
    for (args, needle) in cases {
        let out = run(&bin, cwd.path(), &args);
        let stderr = text(&out.stderr);
        assert!(!out.status.success(), "{args:?}");
        assert!(
            stderr.contains(needle),
            "{args:?}: no `{needle}` in: {stderr}"
        );
    }
    if !cfg!(feature = "cuda") {
        let out = run(&bin, cwd.path(), &["--model", "m", "--cuda"]);
        assert!(!out.status.success());
        assert!(
            text(&out.stderr).contains("--features cuda"),
            "{}",
            text(&out.stderr)
        );
    }
}

/// The tiny Qwen3 fixture (a 64-character vocabulary) with room for GSM8K's few-shot prompt:
/// its `max_position_embeddings` (128) is raised, which only lengthens the RoPE tables.
pub(crate) fn tiny_model(dir: &Path) -> PathBuf {
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

pub(crate) fn metrics_rows(run_dir: &Path) -> Vec<serde_json::Value> {
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
        // A model directory is not in the cookbook's table: the renderer is named.
        "--renderer",
        "role_colon",
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
        [" reward ", " degenerate ", " datums ", " time "]
            .iter()
            .all(|w| stdout.contains(w)),
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
    // config.json describes the run: model, backend, renderer and dataset under "run".
    let config_text = std::fs::read_to_string(run_dir.join("config.json")).unwrap();
    let config: serde_json::Value = serde_json::from_str(&config_text).unwrap();
    assert_eq!(config["run"]["model"], model.to_str().unwrap(), "{config}");
    assert_eq!(config["run"]["backend"], "local", "{config}");
    assert_eq!(config["run"]["renderer"], "role_colon", "{config}");
    assert_eq!(config["renderer_name"], "role_colon", "{config}");
    assert!(
        config["run"]["dataset"]
            .as_str()
            .unwrap()
            .starts_with("gsm8k")
    );
    assert_eq!(config["batch_size"], 2);
    // The local backend's checkpoints live in the run directory.
    let records = std::fs::read_to_string(run_dir.join("checkpoints.jsonl")).unwrap();
    let last: serde_json::Value = serde_json::from_str(records.lines().last().unwrap()).unwrap();
    assert_eq!(last["name"], "final");
    let saved = PathBuf::from(last["backend"]["path"].as_str().unwrap());
    assert!(
        saved.starts_with(run_dir.join("checkpoints")) && saved.is_dir(),
        "{last}"
    );

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
    // The resume kept config.json and recorded its own config next to it.
    assert_eq!(
        std::fs::read_to_string(run_dir.join("config.json")).unwrap(),
        config_text
    );
    let resumed: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(run_dir.join("config.resume-000001.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(resumed["max_steps"], 2, "{resumed}");

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

/// A minimal Tinker-compatible server for one run of the example: sessions, one LoRA model,
/// futures answered at once, sampling that answers `\boxed{72}` (right for the first GSM8K
/// fixture problem) on even samples and `\boxed{7}` on odd ones, so every group is mixed and
/// the loop really trains.
mod fake_tinker {
    use std::sync::{Arc, Mutex};

    use axum::body::Bytes;
    use axum::extract::State;
    use axum::http::{HeaderMap, Uri};
    use axum::response::{IntoResponse, Response};
    use prost::Message;
    use rlvr::backend::tinker::proto;
    use serde_json::{Value, json};

    pub const KEY: &str = "tml-fake-example-key";

    #[derive(Default)]
    pub struct Fake {
        /// `[right, wrong]` completions (token ids, ending in the stop sequence).
        pub answers: [Vec<i32>; 2],
        /// Endpoint of every request, in arrival order.
        pub log: Vec<String>,
        futures: Vec<Response>,
        /// Datums received by `forward_backward`.
        pub datums: usize,
    }

    pub type Shared = Arc<Mutex<Fake>>;

    fn json_response(v: Value) -> Response {
        ([("content-type", "application/json")], v.to_string()).into_response()
    }

    impl Fake {
        fn promise(&mut self, result: Response) -> Response {
            self.futures.push(result);
            json_response(json!({"request_id": format!("f{}", self.futures.len() - 1)}))
        }

        fn forward_backward(&mut self, body: &[u8]) -> Response {
            let req = proto::ForwardBackwardRequest::decode(body).unwrap();
            self.datums += req.data.len();
            let (mut data, mut offsets) = (Vec::new(), vec![0i64]);
            for d in &req.data {
                let len: usize = d
                    .model_input
                    .iter()
                    .map(|c| match &c.chunk {
                        Some(proto::chunk::Chunk::EncodedText(t)) => t.tokens.len() / 4,
                        _ => 0,
                    })
                    .sum();
                data.extend(proto::f32_le(&vec![-0.5; len]));
                offsets.push(data.len() as i64);
            }
            let out = crate::common::logprobs_output(
                data,
                &offsets,
                req.data.len(),
                &[("loss:sum", 0.25)],
            );
            let bytes = out.encode_to_vec();
            self.promise(([("content-type", "application/x-protobuf")], bytes).into_response())
        }

        fn json(&mut self, path: &str, b: &Value) -> Response {
            match path {
                "client/config" => json_response(json!({
                    "pjwt_auth_enabled": false,
                    "proto_compress_fwdbwd": false,
                    "fwdbwd_max_chunk_len": 1024,
                })),
                "create_session" => json_response(json!({"session_id": "s"})),
                "session_heartbeat" => json_response(json!({})),
                "create_model" => {
                    let r = json_response(json!({"model_id": "s:train:0"}));
                    self.promise(r)
                }
                "get_info" => json_response(json!({
                    "model_id": "s:train:0",
                    "model_data": {"arch": "qwen3", "model_name": b["model_id"]},
                    "is_lora": true,
                })),
                "optim_step" => self.promise(json_response(json!({"metrics": {}}))),
                "save_weights_for_sampler" => {
                    let r = json_response(json!({
                        "path": "tinker://s:train:0/sampler_weights/x",
                        "sampling_session_id": format!("s:sample:{}", b["sampling_session_seq_id"]),
                    }));
                    self.promise(r)
                }
                "save_weights" => {
                    let path =
                        format!("tinker://s:train:0/weights/{}", b["path"].as_str().unwrap());
                    self.promise(json_response(json!({"path": path})))
                }
                "asample" => {
                    let n = b["num_samples"].as_u64().unwrap() as usize;
                    let sequences = (0..n)
                        .map(|i| {
                            let tokens = self.answers[i % 2].clone();
                            proto::SampledSequence {
                                stop_reason: proto::StopReason::Stop as i32,
                                logprobs: Some(proto::f32_le(&vec![-0.25; tokens.len()]).into()),
                                tokens: proto::i32_le(tokens).into(),
                                topk_sampled_logprobs: None,
                            }
                        })
                        .collect();
                    let resp = proto::SampleResponse {
                        sequences,
                        ..Default::default()
                    };
                    self.promise(
                        (
                            [("content-type", "application/x-protobuf")],
                            resp.encode_to_vec(),
                        )
                            .into_response(),
                    )
                }
                "retrieve_future" => {
                    let id = b["request_id"].as_str().unwrap();
                    let i: usize = id.trim_start_matches('f').parse().unwrap();
                    std::mem::replace(
                        &mut self.futures[i],
                        json_response(json!({"error": "taken"})),
                    )
                }
                p if p.starts_with("sessions/") && p.ends_with("/finish") => {
                    json_response(json!({}))
                }
                _ => (
                    axum::http::StatusCode::NOT_FOUND,
                    "{\"detail\": \"Not Found\"}",
                )
                    .into_response(),
            }
        }
    }

    async fn handle(
        State(st): State<Shared>,
        uri: Uri,
        headers: HeaderMap,
        body: Bytes,
    ) -> Response {
        let path = uri.path().trim_start_matches("/api/v1/").to_string();
        if headers.get("x-api-key").and_then(|v| v.to_str().ok()) != Some(KEY) {
            return (
                axum::http::StatusCode::UNAUTHORIZED,
                "{\"detail\": \"bad key\"}",
            )
                .into_response();
        }
        let mut st = st.lock().unwrap();
        st.log.push(path.clone());
        if path == "forward_backward" {
            return st.forward_backward(&body);
        }
        let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        st.json(&path, &v)
    }

    /// Starts the server on 127.0.0.1; returns its URL.
    pub async fn start(st: Shared) -> String {
        let app = axum::Router::new().fallback(handle).with_state(st);
        let addr = crate::common::serve(app).await;
        format!("http://{addr}")
    }
}

/// Runs the example for one step of one group of four against the fake Tinker server, in
/// `cwd` with `args` (plus the data, the server and the run directory `cwd/run`). The base
/// model's tokenizer (a character tokenizer over printable ASCII and "\n") is written to
/// `cwd/<model_dir>`: the Tinker backend loads a tokenizer from the directory the model name
/// names (relative to the working directory) without the hub.
async fn run_on_fake_tinker(
    cwd: &Path,
    model_dir: &str,
    args: &[&str],
) -> (Output, fake_tinker::Shared) {
    let model_dir = cwd.join(model_dir);
    std::fs::create_dir_all(&model_dir).unwrap();
    let mut vocab = vec!["<eos>".to_string(), "\n".to_string()];
    vocab.extend((' '..='~').map(String::from));
    let tok = rlvr::backend::local::char_tokenizer(&vocab, Some(0)).unwrap();
    tok.inner()
        .save(model_dir.join("tokenizer.json"), false)
        .unwrap();
    std::fs::write(
        model_dir.join("tokenizer_config.json"),
        r#"{"eos_token": "<eos>"}"#,
    )
    .unwrap();
    let encode = |s: &str| -> Vec<i32> {
        tok.encode(s)
            .unwrap()
            .into_iter()
            .map(|t| t as i32)
            .collect()
    };
    let fake: fake_tinker::Shared = Default::default();
    fake.lock().unwrap().answers = [
        encode(" So \\boxed{72}\n\nUser:"),
        encode(" So \\boxed{7}\n\nUser:"),
    ];
    let url = fake_tinker::start(fake.clone()).await;

    let run_dir = cwd.join("run");
    let data = fixtures().join("gsm8k");
    let mut all: Vec<&str> = args.to_vec();
    all.extend([
        "--base-url",
        url.as_str(),
        "--data",
        data.to_str().unwrap(),
        "--steps",
        "1",
        "--batch-size",
        "1",
        "--group-size",
        "4",
        "--log-dir",
        run_dir.to_str().unwrap(),
    ]);
    let out = tokio::process::Command::new(example_binary().unwrap())
        .args(all)
        .current_dir(cwd)
        .env("TINKER_API_KEY", fake_tinker::KEY)
        .env_remove("TINKER_BASE_URL")
        .env_remove("RUST_LOG")
        .env("HF_HUB_OFFLINE", "1")
        .env("RUST_BACKTRACE", "0")
        .output()
        .await
        .unwrap();
    (out, fake)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn it_trains_on_a_tinker_compatible_server() {
    if example_binary().is_none() {
        return;
    }
    let cwd = tempfile::tempdir().unwrap();
    // The "base model" is a directory holding its tokenizer; not a model the cookbook's table
    // lists, so the renderer is named.
    let model_dir = cwd.path().join("char-model");
    let args = [
        "--model",
        model_dir.to_str().unwrap(),
        "--renderer",
        "role_colon",
    ];
    let (out, fake) = run_on_fake_tinker(cwd.path(), "char-model", &args).await;
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    assert!(stdout.contains("step 1/1"), "{stdout}");
    let run_dir = cwd.path().join("run");

    // Half the samples are right: one mixed group, four datums, one update.
    let row = &metrics_rows(&run_dir)[0];
    assert_eq!(row["env/all/reward/total"], 0.5, "{row}");
    assert_eq!(row["train/datums"], 4.0, "{row}");
    assert_eq!(row["optim/updates"], 1.0, "{row}");
    let fake = fake.lock().unwrap();
    assert_eq!(fake.datums, 4);
    let log = &fake.log;
    let pos = |p: &str| log.iter().position(|l| l == p);
    for p in [
        "create_session",
        "create_model",
        "asample",
        "forward_backward",
        "optim_step",
        "save_weights",
    ] {
        assert!(pos(p).is_some(), "no {p} in {log:?}");
    }
    assert!(pos("forward_backward") < pos("optim_step"), "{log:?}");
    // The session is finished at the end.
    assert!(log.last().unwrap().ends_with("/finish"), "{log:?}");
}

fn config_json(run_dir: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(run_dir.join("config.json")).unwrap()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_renderer_defaults_to_the_models_recommended_one() {
    if example_binary().is_none() {
        return;
    }
    let cwd = tempfile::tempdir().unwrap();
    // No --model: the tutorial's Qwen/Qwen3.5-9B-Base, whose recommended renderer is
    // role_colon.
    let (out, _) = run_on_fake_tinker(cwd.path(), "Qwen/Qwen3.5-9B-Base", &[]).await;
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "{}\n{stderr}", text(&out.stdout));
    assert!(!stderr.contains("is not recommended"), "{stderr}");
    let config = config_json(&cwd.path().join("run"));
    assert_eq!(config["renderer_name"], "role_colon", "{config}");
    assert_eq!(config["run"]["renderer"], "role_colon", "{config}");
    assert_eq!(config["run"]["model"], "Qwen/Qwen3.5-9B-Base", "{config}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renderer_the_model_is_not_recommended_for_warns() {
    if example_binary().is_none() {
        return;
    }
    let cwd = tempfile::tempdir().unwrap();
    // Qwen/Qwen3-8B is listed with qwen3 / qwen3_disable_thinking: role_colon is used, with
    // the cookbook's warning.
    let args = ["--model", "Qwen/Qwen3-8B", "--renderer", "role_colon"];
    let (out, _) = run_on_fake_tinker(cwd.path(), "Qwen/Qwen3-8B", &args).await;
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "{}\n{stderr}", text(&out.stdout));
    for needle in [
        "WARN",
        "Renderer 'role_colon' is not recommended for model 'Qwen/Qwen3-8B'",
        "Recommended renderer(s): 'qwen3', 'qwen3_disable_thinking'",
        "silently degrade training quality",
    ] {
        assert!(stderr.contains(needle), "no `{needle}` in: {stderr}");
    }
    let config = config_json(&cwd.path().join("run"));
    assert_eq!(config["renderer_name"], "role_colon", "{config}");
    assert_eq!(config["run"]["renderer"], "role_colon", "{config}");
}

/// The quickstart's `--cuda` in a build without the `cuda` feature stops at once and names
/// the feature.
#[test]
fn quickstart_cuda_without_the_feature_names_it() {
    if cfg!(feature = "cuda") {
        return;
    }
    let Some(bin) = example_binary_named("quickstart") else {
        return;
    };
    let cwd = tempfile::tempdir().unwrap();
    let out = run(&bin, cwd.path(), &["--cuda", "--log-dir", "run"]);
    assert!(!out.status.success());
    let stderr = text(&out.stderr);
    assert!(stderr.contains("--features cuda"), "{stderr}");
    assert!(
        !cwd.path().join("run").exists(),
        "a run directory was created"
    );
}
