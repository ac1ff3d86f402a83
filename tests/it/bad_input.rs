//! Bad input a user can give, and the error they see (the table in `docs/reliability.md`):
//! every case is a typed `Err`, never a panic, and the run directory holds nothing
//! half-written afterwards.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;

use crate::common::scripted::{ByteRenderer, Scripted, ScriptedBackend};
use async_trait::async_trait;
use rlvr::{
    Dataset, Error, RewardFn,
    dataset::Problem,
    reward::{Response, Reward, RewardError},
};
use rlvr::{GrpoTrainer, TrainerConfig, trainer::EvalConfig};

/// Reward 1 when the text equals the answer.
struct Exact;

#[async_trait]
impl RewardFn for Exact {
    async fn grade(&self, problem: &Problem, response: &Response) -> Result<Reward, RewardError> {
        Ok(Reward::new(if response.text == problem.answer {
            1.0
        } else {
            0.0
        }))
    }
}

fn problems() -> Arc<dyn Dataset> {
    Arc::new(vec![
        Problem::new("p0", "a", "x"),
        Problem::new("p1", "b", "y"),
    ])
}

fn backend() -> ScriptedBackend {
    let script: HashMap<String, Vec<Scripted>> = [
        (
            "a>".to_string(),
            vec![
                Scripted::new("x", &[-0.5, -0.25]),
                Scripted::new("z", &[-1.0, -0.125]),
            ],
        ),
        ("b>".to_string(), vec![Scripted::new("y", &[-0.5, -0.5])]),
    ]
    .into_iter()
    .collect();
    ScriptedBackend::new(script)
}

fn base_config() -> rlvr::trainer::TrainerConfigBuilder {
    TrainerConfig::builder()
        .batch_size(2)
        .group_size(2)
        .shuffle(false)
        .max_tokens(8)
        .progress(false)
        .eval_every(0)
}

fn trainer(backend: ScriptedBackend, config: TrainerConfig) -> GrpoTrainer<ScriptedBackend, Exact> {
    GrpoTrainer::new(backend, Exact, Arc::new(ByteRenderer), problems(), config).unwrap()
}

/// Every file under `dir` (relative path → bytes), to compare a run directory before and
/// after a failure.
fn snapshot(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            let meta = std::fs::symlink_metadata(&path).unwrap();
            let rel = path.strip_prefix(dir).unwrap().display().to_string();
            if meta.is_dir() {
                stack.push(path);
            } else if meta.file_type().is_symlink() {
                out.insert(rel, b"<symlink>".to_vec());
            } else {
                out.insert(rel, std::fs::read(&path).unwrap());
            }
        }
    }
    out
}

/// No temporary file (`.NAME.tmp-…`) is left anywhere under `dir`, and every `.jsonl`
/// / `.json` file parses completely.
fn assert_nothing_half_written(dir: &Path) {
    for (rel, bytes) in snapshot(dir) {
        assert!(!rel.contains(".tmp-"), "temporary file left behind: {rel}");
        if bytes == b"<symlink>" {
            continue;
        }
        if rel.ends_with(".jsonl") {
            let text = std::str::from_utf8(&bytes).unwrap();
            assert!(text.is_empty() || text.ends_with('\n'), "{rel} is torn");
            for line in text.lines() {
                serde_json::from_str::<serde_json::Value>(line)
                    .unwrap_or_else(|e| panic!("{rel}: bad line {line:?}: {e}"));
            }
        } else if rel.ends_with(".json") {
            serde_json::from_slice::<serde_json::Value>(&bytes)
                .unwrap_or_else(|e| panic!("{rel} is not whole JSON: {e}"));
        }
    }
}

#[test]
fn group_size_below_two_is_refused() {
    for g in [0, 1] {
        let err = base_config().group_size(g).build().unwrap_err();
        println!("group_size {g}: {err}");
        assert!(
            matches!(err, Error::Config { ref field, .. } if field == "group_size"),
            "{err}"
        );
        assert_eq!(
            err.to_string(),
            format!(
                "invalid configuration: `group_size`: must be at least 2, got {g}: GRPO needs at \
                 least 2 samples per problem to compute group-relative advantages (with 1, every \
                 group is degenerate and nothing is learned)"
            )
        );
    }
    // A config read from JSON (not through the builder) is checked by the trainer.
    let config: TrainerConfig = serde_json::from_str(r#"{"group_size": 1}"#).unwrap();
    let err = GrpoTrainer::new(backend(), Exact, Arc::new(ByteRenderer), problems(), config)
        .err()
        .unwrap();
    assert!(
        matches!(err, Error::Config { ref field, .. } if field == "group_size"),
        "{err}"
    );
    // One completion per problem is fine for evaluation.
    base_config()
        .eval(EvalConfig {
            group_size: 1,
            ..EvalConfig::default()
        })
        .build()
        .unwrap();
}

#[test]
fn empty_dataset_file_is_refused_before_anything_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let train = dir.path().join("train.jsonl");
    std::fs::write(&train, "").unwrap();
    let run_dir = dir.path().join("run");
    let result = rlvr::Gsm8k::from_jsonl(&train);
    let err = match result {
        Err(e) => e,
        Ok(ds) => GrpoTrainer::new(
            backend(),
            Exact,
            Arc::new(ByteRenderer),
            Arc::new(ds),
            base_config().log_dir(&run_dir).build().unwrap(),
        )
        .err()
        .unwrap(),
    };
    println!("empty dataset: {err}");
    assert_eq!(
        err.to_string(),
        "invalid configuration: `dataset`: the training dataset is empty"
    );
    assert!(!run_dir.exists(), "nothing is created for a refused run");
}

#[test]
fn malformed_dataset_rows_name_the_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let good = r#"{"question": "Q?", "answer": "work\n#### 4"}"#;
    for (name, text, expected) in [
        (
            "not_json.jsonl",
            format!("{good}\n{{\"question\": \"Q\", \n"),
            "line 2: invalid JSON: EOF while parsing a value at line 1 column 18",
        ),
        (
            "no_marker.jsonl",
            format!("{good}\n{{\"question\": \"Q\", \"answer\": \"the answer is 4\"}}\n"),
            "line 2: field `answer` has no `####` final answer",
        ),
    ] {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        let err = rlvr::Gsm8k::from_jsonl(&path).unwrap_err();
        println!("{name}: {err}");
        assert!(matches!(err, Error::Data { .. }), "{err}");
        let shown = err.to_string();
        assert!(shown.starts_with(&path.display().to_string()), "{shown}");
        assert!(shown.contains(expected), "{name}: {shown}");
    }
}

#[cfg(feature = "parquet")]
#[test]
fn malformed_parquet_rows_name_the_file_and_row() {
    use arrow_array::{ArrayRef, RecordBatch, StringArray};
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, questions: Vec<Option<&str>>, answers: Vec<&str>| {
        let path = dir.path().join(name);
        let batch = RecordBatch::try_from_iter(vec![
            (
                "question",
                Arc::new(StringArray::from(questions)) as ArrayRef,
            ),
            ("answer", Arc::new(StringArray::from(answers)) as ArrayRef),
        ])
        .unwrap();
        let file = std::fs::File::create(&path).unwrap();
        let mut w = parquet::arrow::ArrowWriter::try_new(file, batch.schema(), None).unwrap();
        w.write(&batch).unwrap();
        w.close().unwrap();
        path
    };
    for (path, expected) in [
        (
            write(
                "null.parquet",
                vec![Some("Q"), None],
                vec!["#### 1", "#### 2"],
            ),
            "row 2: `question` is null",
        ),
        (
            write(
                "no_marker.parquet",
                vec![Some("Q"), Some("R")],
                vec!["#### 1", "2"],
            ),
            "row 2: field `answer` has no `####` final answer",
        ),
    ] {
        let err = rlvr::Gsm8k::from_parquet(&path).unwrap_err();
        println!("{}: {err}", path.display());
        assert!(matches!(err, Error::Data { .. }), "{err}");
        assert!(err.to_string().contains(expected), "{err}");
    }
    // Not a parquet file at all.
    let path = dir.path().join("text.parquet");
    std::fs::write(&path, "{\"question\": \"Q\"}\n").unwrap();
    let err = rlvr::Gsm8k::from_parquet(&path).unwrap_err();
    println!("{}: {err}", path.display());
    assert!(matches!(err, Error::Data { .. }), "{err}");
    assert!(
        err.to_string()
            .contains("row 0: not a readable parquet file"),
        "{err}"
    );
}

#[tokio::test]
async fn unwritable_log_dir_fails_before_sampling() {
    // Root can write anywhere, so "unwritable" is a path under a regular file: creating the
    // directory fails with ENOTDIR for every user.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("not-a-dir");
    std::fs::write(&file, "x").unwrap();
    let b = backend();
    let mut t = trainer(
        b.clone(),
        base_config()
            .max_steps(1)
            .log_dir(file.join("run"))
            .build()
            .unwrap(),
    );
    let err = t.run().await.unwrap_err();
    println!("unwritable log dir: {err}");
    assert!(
        matches!(
            err,
            Error::Io {
                op: "creating directory",
                ..
            }
        ),
        "{err}"
    );
    assert!(
        err.to_string().ends_with("Not a directory (os error 20)"),
        "{err}"
    );
    assert!(
        b.events().is_empty(),
        "nothing was sampled: {:?}",
        b.events()
    );
    assert_eq!(std::fs::read(&file).unwrap(), b"x");
}

#[cfg(unix)]
#[tokio::test]
async fn full_disk_while_logging_stops_the_run_with_an_io_error() {
    // `/dev/full` answers every write with ENOSPC. `metrics.jsonl` is made a link to it: the
    // first row cannot be written, as on a full disk. (Atomic whole-file writes go through a
    // temporary file with a fresh name, which cannot be pointed at `/dev/full`; a real full
    // file system needs a mount, which the tests do not do.)
    if !Path::new("/dev/full").exists() {
        eprintln!("no /dev/full: skipped");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    std::fs::create_dir(&run).unwrap();
    std::os::unix::fs::symlink("/dev/full", run.join("metrics.jsonl")).unwrap();
    let mut t = trainer(
        backend(),
        base_config()
            .max_steps(2)
            .save_every(1)
            .log_dir(&run)
            .build()
            .unwrap(),
    );
    let err = tokio::time::timeout(std::time::Duration::from_secs(60), t.run())
        .await
        .expect("the run stops instead of hanging")
        .unwrap_err();
    println!("full disk: {err}");
    assert!(matches!(err, Error::Io { .. }), "{err}");
    assert!(
        err.to_string()
            .ends_with("No space left on device (os error 28)"),
        "{err}"
    );
    assert_nothing_half_written(&run);
    // The step whose row could not be logged was not checkpointed: a resume redoes it.
    let checkpoints = std::fs::read_to_string(run.join("checkpoints.jsonl")).unwrap_or_default();
    assert!(checkpoints.is_empty(), "{checkpoints}");
}

#[tokio::test]
async fn resume_with_changed_flags_is_refused_and_the_run_directory_is_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let config = || base_config().max_steps(2).save_every(1).log_dir(dir.path());
    trainer(backend(), config().seed(3).build().unwrap())
        .run()
        .await
        .unwrap();
    let before = snapshot(dir.path());
    assert!(before.contains_key("checkpoints.jsonl"));
    let len2: Arc<dyn Dataset> = problems();
    let len3: Arc<dyn Dataset> = Arc::new(vec![
        Problem::new("p0", "a", "x"),
        Problem::new("p1", "b", "y"),
        Problem::new("p2", "a", "x"),
    ]);
    for (field, changed, dataset, needle) in [
        (
            "seed",
            config().seed(4).max_steps(4),
            len2.clone(),
            "used seed 3, the config says 4",
        ),
        (
            "batch_size",
            config().seed(3).batch_size(1).max_steps(4),
            len2.clone(),
            "consumed 4 problems in 2 steps, which does not match batch_size 1",
        ),
        (
            "shuffle",
            config().seed(3).shuffle(true).max_steps(4),
            len2.clone(),
            "used shuffle = false, the config says true",
        ),
        (
            "dataset",
            config().seed(3).max_steps(4),
            len3,
            "trained on 2 problems, this dataset has 3",
        ),
    ] {
        let err = GrpoTrainer::new(
            backend(),
            Exact,
            Arc::new(ByteRenderer),
            dataset,
            changed.build().unwrap(),
        )
        .unwrap()
        .run()
        .await
        .unwrap_err();
        println!("resume, changed {field}: {err}");
        assert!(
            matches!(err, Error::Config { field: ref f, .. } if f == field),
            "{err}"
        );
        assert!(err.to_string().contains(needle), "{err}");
        assert!(
            err.to_string()
                .ends_with("resuming would change the data order")
        );
        assert_eq!(
            snapshot(dir.path()),
            before,
            "a refused resume writes nothing"
        );
    }
    // Other flags (here the learning rate and the step count) may change on a resume; the
    // new config is recorded next to the original.
    trainer(
        backend(),
        config()
            .seed(3)
            .max_steps(3)
            .learning_rate(1e-4)
            .build()
            .unwrap(),
    )
    .run()
    .await
    .unwrap();
    assert!(dir.path().join("config.resume-000002.json").is_file());
    assert_nothing_half_written(dir.path());
}

#[cfg(feature = "local")]
#[test]
fn tokenizer_larger_than_the_model_is_refused() {
    use rlvr::backend::local::{LocalBackend, LocalOptions, Qwen3Config, char_tokenizer};
    let vocab: Vec<String> = (0..32).map(|i| format!("t{i}")).collect();
    let tokenizer = char_tokenizer(&vocab, Some(0)).unwrap();
    let config = Qwen3Config::new(16, 8, 8, 1, 2, 1, 4, 64);
    let err = LocalBackend::random(config, tokenizer, LocalOptions::default())
        .err()
        .unwrap();
    println!("tokenizer/model mismatch: {err}");
    assert_eq!(
        err.to_string(),
        "invalid configuration: `vocab_size`: the tokenizer has 32 tokens but the model only 16"
    );
}

#[cfg(feature = "tinker")]
#[tokio::test]
async fn wrong_api_key_is_a_401_error_that_is_not_retried() {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use rlvr::backend::tinker::{TinkerClient, TinkerConfig};

    // A server that refuses every credential, as Tinker does for a wrong key.
    let calls = Arc::new(AtomicUsize::new(0));
    let seen = Arc::clone(&calls);
    let app = axum::Router::new().fallback(move || {
        let seen = Arc::clone(&seen);
        async move {
            seen.fetch_add(1, Ordering::SeqCst);
            (
                axum::http::StatusCode::UNAUTHORIZED,
                axum::Json(serde_json::json!({"detail": "Invalid API key"})),
            )
        }
    });
    let addr = crate::common::serve(app).await;
    let config = TinkerConfig::new("tml-wrong-key")
        .unwrap()
        .base_url(format!("http://{addr}"));
    let err = tokio::time::timeout(
        std::time::Duration::from_secs(60),
        TinkerClient::connect(config),
    )
    .await
    .expect("a refused key fails fast")
    .err()
    .unwrap();
    println!("wrong API key: {err}");
    assert!(matches!(err, Error::Http { status: 401, .. }), "{err}");
    assert!(!err.to_string().contains("tml-wrong-key"), "{err}");
    assert_eq!(calls.load(Ordering::SeqCst), 1, "a 401 is not retried");
}
