//! The run directory: config redaction, metrics, checkpoints, samples, plots, progress.

use std::collections::BTreeMap;
use std::fs;

use rlvr::report::{
    CheckpointRecord, Progress, ProgressMode, RunDir, SampleRecord, redact_secrets,
};
use rlvr::{
    Error,
    renderer::ParseTermination,
    types::{CheckpointRef, StopReason},
};
use serde_json::{Value, json};

type Row = BTreeMap<String, Value>;

fn row(step: u64, reward: f64) -> Row {
    let mut r = Row::new();
    r.insert("step".into(), json!(step));
    r.insert("env/all/reward/total".into(), json!(reward));
    r
}

fn steps(rows: &[Row]) -> Vec<Option<u64>> {
    rows.iter()
        .map(|r| r.get("step").and_then(Value::as_u64))
        .collect()
}

// ---------------------------------------------------------------------------------------------
// config.json
// ---------------------------------------------------------------------------------------------

#[derive(serde::Serialize)]
struct Backend {
    base_url: String,
    api_key: Option<String>,
}

#[derive(serde::Serialize)]
struct Config {
    model: String,
    max_tokens: u32,
    tokenizer: String,
    backend: Backend,
    unset_token: Option<String>,
    extra: Value,
}

#[test]
fn config_is_written_pretty_and_redacted() {
    let dir = tempfile::tempdir().unwrap();
    let run = RunDir::create(dir.path().join("run")).unwrap();
    let config = Config {
        model: "tiny".into(),
        max_tokens: 256,
        tokenizer: "qwen".into(),
        backend: Backend {
            base_url: "http://127.0.0.1:1".into(),
            api_key: Some("tml-SECRET-1".into()),
        },
        unset_token: None,
        extra: json!({
            "hooks": [{"HF_TOKEN": "hf_SECRET_2"}, {"name": "ok"}],
            "db": {"password": {"nested": "SECRET-3"}, "clientSecret": "SECRET-4"},
        }),
    };
    run.write_config(&config).unwrap();
    let text = fs::read_to_string(run.path().join("config.json")).unwrap();
    assert!(
        !text.contains("SECRET"),
        "a secret leaked into config.json:\n{text}"
    );
    assert!(
        text.contains("\n  \"backend\""),
        "config.json is pretty-printed"
    );
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["backend"]["api_key"], "[redacted]");
    assert_eq!(v["backend"]["base_url"], "http://127.0.0.1:1");
    assert_eq!(v["max_tokens"], 256);
    assert_eq!(v["tokenizer"], "qwen");
    assert_eq!(v["unset_token"], Value::Null, "an unset secret stays null");
    assert_eq!(v["extra"]["hooks"][0]["HF_TOKEN"], "[redacted]");
    assert_eq!(v["extra"]["hooks"][1]["name"], "ok");
    assert_eq!(v["extra"]["db"]["password"], "[redacted]");
    assert_eq!(v["extra"]["db"]["clientSecret"], "[redacted]");
    // Rewriting replaces the file whole, leaving no temporary file behind.
    run.write_config(&json!({"model": "other"})).unwrap();
    let v: Value =
        serde_json::from_str(&fs::read_to_string(run.path().join("config.json")).unwrap()).unwrap();
    assert_eq!(v, json!({"model": "other"}));
    let names: Vec<_> = fs::read_dir(run.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(names, ["config.json"]);
}

#[test]
fn redaction_leaves_non_secrets_alone() {
    let mut v = json!({"tokens_per_step": 3, "keyboard": "x", "list": [1, {"token": 5}]});
    redact_secrets(&mut v);
    assert_eq!(
        v,
        json!({"tokens_per_step": 3, "keyboard": "x", "list": [1, {"token": "[redacted]"}]})
    );
}

// ---------------------------------------------------------------------------------------------
// metrics.jsonl
// ---------------------------------------------------------------------------------------------

#[test]
fn metrics_append_read_truncate() {
    let dir = tempfile::tempdir().unwrap();
    let mut run = RunDir::create(dir.path()).unwrap();
    assert!(run.read_metrics().unwrap().is_empty(), "no file yet");
    for s in 0..5 {
        run.append_metrics(&row(s, s as f64 / 10.0)).unwrap();
    }
    let mut summary = Row::new();
    summary.insert("final/reward".into(), json!(0.9));
    run.append_metrics(&summary).unwrap();

    let text = fs::read_to_string(run.metrics_path()).unwrap();
    assert_eq!(text.lines().count(), 6);
    assert!(text.ends_with('\n'));
    let rows = run.read_metrics().unwrap();
    assert_eq!(rows.len(), 6);
    assert_eq!(rows[3], row(3, 0.3));

    // Resume from step 3: rows 3 and 4 go, the step-less summary row stays, a backup is kept.
    run.truncate_metrics_from(3).unwrap();
    let rows = run.read_metrics().unwrap();
    assert_eq!(steps(&rows), [Some(0), Some(1), Some(2), None]);
    let backup = run.path().join("metrics.jsonl.pre_resume_000003");
    assert_eq!(fs::read_to_string(&backup).unwrap(), text);

    // Nothing to drop: no rewrite, no new backup.
    run.truncate_metrics_from(10).unwrap();
    assert!(!run.path().join("metrics.jsonl.pre_resume_000010").exists());
    assert_eq!(run.read_metrics().unwrap().len(), 4);

    // Appending continues after the kept rows; reopening the directory keeps everything.
    run.append_metrics(&row(3, 0.7)).unwrap();
    let reopened = RunDir::create(dir.path()).unwrap();
    assert_eq!(
        steps(&reopened.read_metrics().unwrap()),
        [Some(0), Some(1), Some(2), None, Some(3)]
    );
}

#[test]
fn truncate_on_missing_file_is_a_no_op() {
    let dir = tempfile::tempdir().unwrap();
    let mut run = RunDir::create(dir.path()).unwrap();
    run.truncate_metrics_from(0).unwrap();
    assert!(!run.metrics_path().exists());
}

#[test]
fn truncate_rejects_a_non_integer_step() {
    let dir = tempfile::tempdir().unwrap();
    let mut run = RunDir::create(dir.path()).unwrap();
    fs::write(
        run.metrics_path(),
        "{\"step\":0}\n{\"step\":\"one\"}\n{\"step\":2}\n",
    )
    .unwrap();
    match run.truncate_metrics_from(1).unwrap_err() {
        Error::Data {
            file,
            location_kind,
            location,
            message,
        } => {
            assert_eq!(file, run.metrics_path());
            assert_eq!((location_kind, location), ("line", 2));
            assert!(message.contains("step"), "{message}");
        }
        other => panic!("unexpected error {other}"),
    }
    // The file is untouched.
    assert_eq!(
        fs::read_to_string(run.metrics_path()).unwrap(),
        "{\"step\":0}\n{\"step\":\"one\"}\n{\"step\":2}\n"
    );
}

#[test]
fn torn_last_line_is_reported_on_read_and_repaired_on_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("metrics.jsonl");
    fs::write(
        &path,
        "{\"step\":0,\"x\":1}\n{\"step\":1,\"x\":2}\n{\"step\":2,\"x\"",
    )
    .unwrap();

    // A RunDir made before the crash (no repair since) reports the torn line when reading.
    let stale = {
        fs::rename(&path, dir.path().join("hold")).unwrap();
        let r = RunDir::create(dir.path()).unwrap();
        fs::rename(dir.path().join("hold"), &path).unwrap();
        r
    };
    let err = stale.read_metrics().unwrap_err();
    let text = err.to_string();
    assert!(text.contains("metrics.jsonl"), "{text}");
    assert!(text.contains("line 3"), "{text}");
    assert!(text.contains("torn"), "{text}");

    // Opening repairs it: the torn line is dropped, complete rows are kept.
    let mut run = RunDir::create(dir.path()).unwrap();
    assert_eq!(
        fs::read_to_string(&path).unwrap(),
        "{\"step\":0,\"x\":1}\n{\"step\":1,\"x\":2}\n"
    );
    assert_eq!(steps(&run.read_metrics().unwrap()), [Some(0), Some(1)]);
    run.append_metrics(&row(2, 0.5)).unwrap();
    assert_eq!(
        steps(&run.read_metrics().unwrap()),
        [Some(0), Some(1), Some(2)]
    );
}

#[test]
fn complete_last_record_without_newline_is_kept() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("metrics.jsonl");
    fs::write(&path, "{\"step\":0}\n{\"step\":1}").unwrap();
    let mut run = RunDir::create(dir.path()).unwrap();
    assert_eq!(
        fs::read_to_string(&path).unwrap(),
        "{\"step\":0}\n{\"step\":1}\n"
    );
    run.append_metrics(&row(2, 0.0)).unwrap();
    assert_eq!(
        steps(&run.read_metrics().unwrap()),
        [Some(0), Some(1), Some(2)]
    );
}

#[test]
fn append_repairs_a_line_torn_after_open() {
    let dir = tempfile::tempdir().unwrap();
    let mut run = RunDir::create(dir.path()).unwrap();
    run.append_metrics(&row(0, 0.1)).unwrap();
    // Another writer crashed mid-line after this RunDir was opened.
    let mut text = fs::read_to_string(run.metrics_path()).unwrap();
    text.push_str("{\"step\":1,\"env/all/rew");
    fs::write(run.metrics_path(), text).unwrap();
    run.append_metrics(&row(1, 0.2)).unwrap();
    assert_eq!(run.read_metrics().unwrap(), vec![row(0, 0.1), row(1, 0.2)]);
}

#[test]
fn malformed_middle_line_names_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let run = RunDir::create(dir.path()).unwrap();
    fs::write(run.metrics_path(), "{\"step\":0}\n\n[1,2]\n{\"step\":3}\n").unwrap();
    match run.read_metrics().unwrap_err() {
        Error::Data {
            file,
            location_kind,
            location,
            ..
        } => {
            assert_eq!(file, run.metrics_path());
            assert_eq!((location_kind, location), ("line", 3));
        }
        other => panic!("unexpected error {other}"),
    }
}

// ---------------------------------------------------------------------------------------------
// checkpoints.jsonl
// ---------------------------------------------------------------------------------------------

fn checkpoint(step: u64, name: &str) -> CheckpointRecord {
    CheckpointRecord {
        step,
        name: name.into(),
        backend: CheckpointRef {
            name: name.into(),
            path: format!("tinker://run-1/weights/{name}"),
        },
        loop_state: json!({"cursor": step * 8, "rng": [1, 2, 3], "cumulative_tokens": {"sampled": 100}}),
    }
}

#[test]
fn checkpoints_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let mut run = RunDir::create(dir.path()).unwrap();
    assert_eq!(run.last_checkpoint().unwrap(), None);
    let a = checkpoint(10, "000010");
    let b = checkpoint(20, "000020");
    let c = checkpoint(25, "final");
    for rec in [&a, &b, &c] {
        run.append_checkpoint(rec).unwrap();
    }
    assert_eq!(run.last_checkpoint().unwrap(), Some(c.clone()));
    assert_eq!(run.read_checkpoints().unwrap(), vec![a, b.clone(), c]);
    let text = fs::read_to_string(run.checkpoints_path()).unwrap();
    assert_eq!(text.lines().count(), 3);
    let first: Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
    assert_eq!(first["step"], 10);
    assert_eq!(first["backend"]["path"], "tinker://run-1/weights/000010");

    // A crash while appending the last record: reopening keeps the one before it.
    fs::write(
        run.checkpoints_path(),
        format!(
            "{}{}",
            text.lines()
                .take(2)
                .map(|l| format!("{l}\n"))
                .collect::<String>(),
            "{\"step\":25,\"na"
        ),
    )
    .unwrap();
    let run = RunDir::create(dir.path()).unwrap();
    assert_eq!(run.last_checkpoint().unwrap(), Some(b));
}

// ---------------------------------------------------------------------------------------------
// samples
// ---------------------------------------------------------------------------------------------

fn sample(problem: &str, group: usize, completion: &str, reward: f64) -> SampleRecord {
    let mut components = BTreeMap::new();
    components.insert("correct".to_string(), reward);
    components.insert("format<ok>".to_string(), 1.0);
    SampleRecord {
        problem_id: problem.into(),
        group,
        prompt: format!("User: Is 3 < 4 & \"5\" > 'x' for {problem}?\n\nAssistant:"),
        completion: completion.into(),
        reward,
        advantage: reward - 0.5,
        components,
        stop_reason: if reward > 0.0 {
            StopReason::Stop
        } else {
            StopReason::Length
        },
        termination: if reward > 0.0 {
            ParseTermination::StopSequence
        } else {
            ParseTermination::Malformed
        },
        tokens: completion.len(),
        policy_version: group as u64 + 4,
        staleness: group as u64,
    }
}

#[test]
fn samples_jsonl_and_html() {
    let dir = tempfile::tempdir().unwrap();
    let run = RunDir::create(dir.path()).unwrap();
    let samples = vec![
        sample("gsm8k-7", 0, "<script>alert(1)</script> \\boxed{4}", 1.0),
        sample("gsm8k-9", 1, "I think & hope it is 5", 0.0),
        sample("gsm8k-7", 0, "it's 3 </pre>", 0.0),
    ];
    run.write_samples(12, &samples).unwrap();

    let jsonl = run.path().join("samples/000012.jsonl");
    assert_eq!(jsonl, run.samples_path(12));
    let back: Vec<SampleRecord> = fs::read_to_string(&jsonl)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(back, samples);
    let first: Value =
        serde_json::from_str(fs::read_to_string(&jsonl).unwrap().lines().next().unwrap()).unwrap();
    assert_eq!(first["stop_reason"], "stop");
    assert_eq!(first["termination"], "stop_sequence");
    assert_eq!(first["policy_version"], 4);
    assert_eq!(first["staleness"], 0);
    // Files written before the policy version was recorded still read (as version 0).
    let mut old = first.clone();
    let obj = old.as_object_mut().unwrap();
    obj.remove("policy_version");
    obj.remove("staleness");
    let old: SampleRecord = serde_json::from_value(old).unwrap();
    assert_eq!((old.policy_version, old.staleness), (0, 0));

    let html = fs::read_to_string(run.path().join("samples/000012.html")).unwrap();
    assert!(html.starts_with("<!DOCTYPE html>"));
    assert!(html.contains("<style>"), "inline CSS");
    assert!(
        !html.contains("<link") && !html.contains("src="),
        "self-contained"
    );
    // Escaped, never raw.
    assert!(!html.contains("<script>"));
    assert!(html.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
    assert!(html.contains("it&#39;s 3 &lt;/pre&gt;"));
    assert!(html.contains("3 &lt; 4 &amp; &quot;5&quot; &gt; &#39;x&#39;"));
    assert!(html.contains("format&lt;ok&gt;"));
    // Grouped by problem, in order of first appearance; both gsm8k-7 samples in one section.
    let g7 = html.find("problem gsm8k-7").unwrap();
    let g9 = html.find("problem gsm8k-9").unwrap();
    assert!(g7 < g9);
    let second_g7_sample = html.find("it&#39;s 3").unwrap();
    assert!(
        second_g7_sample < g9,
        "the second gsm8k-7 sample is listed under its group"
    );
    assert_eq!(html.matches("<section class=\"group\">").count(), 2);
    // The prompt is shown once per group when its samples share it.
    assert_eq!(html.matches("for gsm8k-7?").count(), 1);
    // The fields are all shown.
    for needle in [
        "reward <b>1</b>",
        "advantage <b>0.500</b>",
        "advantage <b>-0.500</b>",
        "stop <b>length</b>",
        "termination <b>malformed</b>",
        "termination <b>stop_sequence</b>",
        "tokens <b>",
        "correct <b>",
        "policy <b>4</b></span>",
        "policy <b>5</b> (1 stale)",
    ] {
        assert!(html.contains(needle), "missing {needle:?}");
    }

    // Step numbers are zero-padded to six digits; an empty step still writes both files.
    run.write_samples(3, &[]).unwrap();
    assert_eq!(
        fs::read_to_string(run.path().join("samples/000003.jsonl")).unwrap(),
        ""
    );
    assert!(run.path().join("samples/000003.html").exists());
}

// ---------------------------------------------------------------------------------------------
// plots
// ---------------------------------------------------------------------------------------------

/// Width and height from a PNG's IHDR chunk, after checking the signature.
#[cfg(feature = "plot")]
fn png_size(bytes: &[u8]) -> (u32, u32) {
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "PNG signature");
    assert_eq!(&bytes[12..16], b"IHDR");
    let w = u32::from_be_bytes(bytes[16..20].try_into().unwrap());
    let h = u32::from_be_bytes(bytes[20..24].try_into().unwrap());
    (w, h)
}

#[cfg(feature = "plot")]
#[test]
fn plots_are_produced() {
    use rlvr::report::{PLOT_HEIGHT, PLOT_WIDTH};
    let dir = tempfile::tempdir().unwrap();
    let mut run = RunDir::create(dir.path()).unwrap();

    // No metrics yet: an empty chart is still drawn.
    run.plot().unwrap();
    assert!(run.path().join("reward.png").exists());

    for s in 0..30u64 {
        let mut r = row(
            s,
            0.2 + 0.02 * s as f64 + if s % 3 == 0 { 0.1 } else { 0.0 },
        );
        if s % 10 == 0 {
            r.insert(
                "test/env/all/correct".into(),
                json!(0.15 + 0.015 * s as f64),
            );
        }
        run.append_metrics(&r).unwrap();
    }
    run.plot().unwrap();

    let png = fs::read(run.path().join("reward.png")).unwrap();
    assert_eq!(png_size(&png), (PLOT_WIDTH, PLOT_HEIGHT));
    assert!(png.len() > 5_000, "a drawn chart, not a blank image");

    let svg = fs::read_to_string(run.path().join("reward.svg")).unwrap();
    assert!(
        svg.starts_with("<svg") || svg.starts_with("<?xml"),
        "{}",
        &svg[..40]
    );
    assert!(svg.contains("train reward (env/all/reward/total)"));
    assert!(svg.contains("test accuracy (test/env/all/correct)"));
    assert!(svg.contains("<polyline"), "line series drawn");
    assert!(
        !svg.contains("rlvr-dejavu-sans"),
        "SVG names public font families"
    );

    // No temporary files left behind.
    let leftovers: Vec<_> = fs::read_dir(run.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.starts_with('.'))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

#[cfg(feature = "plot")]
#[test]
fn plot_accepts_any_test_correct_key() {
    let dir = tempfile::tempdir().unwrap();
    let mut run = RunDir::create(dir.path()).unwrap();
    for s in 0..3u64 {
        let mut r = row(s, 0.5);
        r.insert("test/env/gsm8k/correct".into(), json!(0.25));
        run.append_metrics(&r).unwrap();
    }
    run.plot().unwrap();
    let svg = fs::read_to_string(run.path().join("reward.svg")).unwrap();
    assert!(svg.contains("test accuracy (test/env/gsm8k/correct)"));
}

// ---------------------------------------------------------------------------------------------
// progress
// ---------------------------------------------------------------------------------------------

#[test]
fn progress_modes_never_fail() {
    // Under `cargo test` stdout is captured by the harness, not a terminal; Bars mode then
    // draws nothing (indicatif hides itself) but must still work.
    assert_eq!(Progress::new(3).mode(), ProgressMode::detect());
    for mode in [ProgressMode::Hidden, ProgressMode::Bars] {
        let progress = Progress::with_mode(3, mode);
        assert_eq!(progress.mode(), mode);
        progress.set_start(1);
        let bar = progress.phase("sampling", 4);
        bar.inc(2);
        bar.set_message("reward 0.25".into());
        bar.finish();
        progress.println("a note");
        progress.step_done(1, "reward 0.25");
        progress.finish();
    }
}

/// A `Write` that appends to a shared buffer.
#[derive(Clone, Default)]
struct Shared(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Shared {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn progress_lines_mode_prints_one_line_per_step() {
    let out = Shared::default();
    let progress = Progress::lines_to(20, out.clone());
    assert_eq!(progress.mode(), ProgressMode::Lines);
    let bar = progress.phase("sampling", 8);
    bar.inc(8);
    bar.set_message("reward 0.10".into());
    bar.finish();
    progress.step_done(0, "reward 0.10 correct 0.05");
    progress.println("evaluating");
    progress.step_done(1, "reward 0.20");
    progress.finish();
    let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3, "{text}");
    assert!(lines[0].starts_with("step 1/20 ["), "{text}");
    assert!(lines[0].ends_with("] reward 0.10 correct 0.05"), "{text}");
    assert_eq!(lines[1], "evaluating");
    assert!(lines[2].starts_with("step 2/20 [") && lines[2].ends_with("reward 0.20"));
}

// ---------------------------------------------------------------------------------------------
// Metrics sinks and TensorBoard event files
// ---------------------------------------------------------------------------------------------

/// Trainer runs over the scripted backend that send their metrics to sinks.
mod sinks {
    use std::collections::{BTreeMap, HashMap};
    use std::path::Path;
    use std::sync::{Arc, Mutex};

    use crate::common::scripted::{ByteRenderer, Scripted, ScriptedBackend};
    use rlvr::dataset::Problem;
    use rlvr::report::{MetricsSink, RunDir};
    use rlvr::{Dataset, GrpoTrainer, TrainerConfig};

    /// Problem "a" (answer "x") gets "x" and "z"; "b" (answer "y") gets "y" twice.
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
        .into();
        ScriptedBackend::new(script)
    }

    fn problems() -> Arc<dyn Dataset> {
        Arc::new(vec![
            Problem::new("p0", "a", "x"),
            Problem::new("p1", "b", "y"),
        ])
    }

    fn reward(p: &Problem, text: &str) -> f64 {
        if text == p.answer { 1.0 } else { 0.0 }
    }

    fn config(dir: &Path, steps: u64) -> TrainerConfig {
        TrainerConfig::builder()
            .batch_size(2)
            .group_size(2)
            .shuffle(false)
            .max_tokens(8)
            .progress(false)
            .max_steps(steps)
            .eval_every(2)
            .save_every(2)
            .tensorboard(true)
            .log_dir(dir)
            .build()
            .unwrap()
    }

    async fn run(
        dir: &Path,
        steps: u64,
        sink: Option<Recorder>,
    ) -> rlvr::Result<rlvr::trainer::RunSummary> {
        let mut trainer = GrpoTrainer::new(
            backend(),
            reward as fn(&Problem, &str) -> f64,
            Arc::new(ByteRenderer),
            problems(),
            config(dir, steps),
        )?
        .with_eval_dataset(Arc::new(vec![Problem::new("e0", "a", "x")]));
        if let Some(sink) = sink {
            trainer = trainer.with_metrics_sink(sink);
        }
        trainer.run().await
    }

    /// What a sink was called with.
    #[derive(Debug, Clone, PartialEq)]
    enum Call {
        Start(serde_json::Value, u64),
        Log(u64, BTreeMap<String, f64>),
        Flush,
    }

    /// Records its calls; fails the `log_metrics` of step `fail_at`.
    #[derive(Clone, Default)]
    struct Recorder {
        calls: Arc<Mutex<Vec<Call>>>,
        fail_at: Option<u64>,
    }

    impl MetricsSink for Recorder {
        fn start(&mut self, config: &serde_json::Value, first_step: u64) -> rlvr::Result<()> {
            self.calls
                .lock()
                .unwrap()
                .push(Call::Start(config.clone(), first_step));
            Ok(())
        }
        fn log_metrics(&mut self, step: u64, metrics: &BTreeMap<String, f64>) -> rlvr::Result<()> {
            if self.fail_at == Some(step) {
                return Err(rlvr::Error::Io {
                    op: "sending metrics to",
                    path: "tracker".into(),
                    source: std::io::Error::other("the tracker is down"),
                });
            }
            self.calls
                .lock()
                .unwrap()
                .push(Call::Log(step, metrics.clone()));
            Ok(())
        }
        fn flush(&mut self) -> rlvr::Result<()> {
            self.calls.lock().unwrap().push(Call::Flush);
            Ok(())
        }
    }

    /// Every numeric metric of `metrics.jsonl`: (tag, step) → its values as `f32`, in file
    /// order.
    fn jsonl_scalars(dir: &Path) -> BTreeMap<(String, i64), Vec<f32>> {
        let mut out: BTreeMap<(String, i64), Vec<f32>> = BTreeMap::new();
        for row in RunDir::create(dir).unwrap().read_metrics().unwrap() {
            let step = row["step"].as_i64().unwrap();
            for (k, v) in &row {
                if let (true, Some(v)) = (k != "step", v.as_f64()) {
                    out.entry((k.clone(), step)).or_default().push(v as f32);
                }
            }
        }
        out
    }

    /// The event files of `dir`, in name order (the order TensorBoard reads them in).
    #[cfg(feature = "tensorboard")]
    fn event_files(dir: &Path) -> Vec<std::path::PathBuf> {
        let mut files: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| {
                p.file_name()
                    .unwrap()
                    .to_str()
                    .unwrap()
                    .starts_with(rlvr::report::TENSORBOARD_FILE_PREFIX)
            })
            .collect();
        files.sort();
        files
    }

    /// Every scalar of the event files of `dir`, read back with
    /// [`read_tensorboard_events`](rlvr::report::read_tensorboard_events) (both checksums
    /// of every record checked), and the config texts with their steps.
    #[cfg(feature = "tensorboard")]
    #[allow(clippy::type_complexity)]
    fn tb_scalars(
        dir: &Path,
    ) -> (
        BTreeMap<(String, i64), Vec<f32>>,
        Vec<(i64, serde_json::Value)>,
    ) {
        let mut scalars: BTreeMap<(String, i64), Vec<f32>> = BTreeMap::new();
        let mut configs = Vec::new();
        for file in event_files(dir) {
            let events = rlvr::report::read_tensorboard_events(&file).unwrap();
            assert_eq!(
                events[0].file_version.as_deref(),
                Some("brain.Event:2"),
                "{}",
                file.display()
            );
            for e in &events {
                for (tag, v) in &e.scalars {
                    scalars.entry((tag.clone(), e.step)).or_default().push(*v);
                }
                for (tag, text) in &e.texts {
                    assert_eq!(tag, rlvr::report::TENSORBOARD_CONFIG_TAG);
                    configs.push((e.step, config_of_text(text)));
                }
            }
        }
        (scalars, configs)
    }

    /// The JSON of the config text (a Markdown code block: every line indented by 4).
    fn config_of_text(text: &str) -> serde_json::Value {
        let json: String = text
            .lines()
            .map(|l| l.strip_prefix("    ").unwrap_or(l).to_string() + "\n")
            .collect();
        serde_json::from_str(&json).unwrap()
    }

    fn config_json(dir: &Path, name: &str) -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(dir.join(name)).unwrap()).unwrap()
    }

    /// A run that saved `000002` and logged step 2, then crashed (its `final` record
    /// dropped), resumed to 4 steps: the event files of both processes.
    async fn crashed_and_resumed(dir: &Path) {
        run(dir, 3, None).await.unwrap();
        let ck = dir.join("checkpoints.jsonl");
        let text = std::fs::read_to_string(&ck).unwrap();
        std::fs::write(&ck, text.lines().next().unwrap().to_string() + "\n").unwrap();
        let summary = run(dir, 4, None).await.unwrap();
        assert_eq!(summary.start_step, 2);
    }

    #[tokio::test]
    async fn a_sink_gets_every_row_of_metrics_jsonl() {
        let dir = tempfile::tempdir().unwrap();
        let sink = Recorder::default();
        run(dir.path(), 3, Some(sink.clone())).await.unwrap();
        let calls = sink.calls.lock().unwrap().clone();
        let Call::Start(config, 0) = &calls[0] else {
            panic!("{calls:?}")
        };
        assert_eq!(*config, config_json(dir.path(), "config.json"));
        let logged: Vec<(u64, BTreeMap<String, f64>)> = calls
            .iter()
            .filter_map(|c| match c {
                Call::Log(step, m) => Some((*step, m.clone())),
                _ => None,
            })
            .collect();
        let rows: Vec<(u64, BTreeMap<String, f64>)> = RunDir::create(dir.path())
            .unwrap()
            .read_metrics()
            .unwrap()
            .into_iter()
            .map(|row| {
                let step = row["step"].as_u64().unwrap();
                let m = row
                    .into_iter()
                    .filter(|(k, _)| k != "step")
                    .map(|(k, v)| (k, v.as_f64().unwrap()))
                    .collect();
                (step, m)
            })
            .collect();
        assert_eq!(logged, rows, "the same steps, the same values");
        // Flushed before each checkpoint (`000002` after step 1's row, `final`) and at the end.
        let shape: Vec<String> = calls
            .iter()
            .map(|c| match c {
                Call::Start(_, s) => format!("start {s}"),
                Call::Log(s, _) => format!("log {s}"),
                Call::Flush => "flush".into(),
            })
            .collect();
        assert_eq!(
            shape,
            [
                "start 0", "log 0", "log 1", "flush", "log 2", "log 3", "flush", "flush"
            ]
        );
    }

    #[tokio::test]
    async fn a_failing_sink_stops_the_run() {
        let dir = tempfile::tempdir().unwrap();
        let sink = Recorder {
            fail_at: Some(1),
            ..Recorder::default()
        };
        let err = run(dir.path(), 3, Some(sink)).await.unwrap_err();
        assert!(err.to_string().contains("the tracker is down"), "{err}");
        // Step 1's row reached metrics.jsonl before the sink failed; no checkpoint followed.
        assert_eq!(
            RunDir::create(dir.path())
                .unwrap()
                .read_metrics()
                .unwrap()
                .len(),
            2
        );
        assert!(!dir.path().join("checkpoints.jsonl").exists());
    }

    #[test]
    fn tensorboard_needs_a_run_directory() {
        let err = TrainerConfig::builder()
            .tensorboard(true)
            .build()
            .unwrap_err();
        assert!(
            matches!(&err, rlvr::Error::Config { field, .. } if field == "tensorboard"),
            "{err}"
        );
    }

    #[cfg(feature = "tensorboard")]
    #[tokio::test]
    async fn tensorboard_holds_every_metric_of_metrics_jsonl() {
        let dir = tempfile::tempdir().unwrap();
        run(dir.path(), 3, None).await.unwrap();
        assert_eq!(event_files(dir.path()).len(), 1);
        let (scalars, configs) = tb_scalars(dir.path());
        let want = jsonl_scalars(dir.path());
        assert!(want.contains_key(&("test/env/all/reward/total".to_string(), 3)));
        assert!(want.contains_key(&("env/all/reward/total".to_string(), 2)));
        assert_eq!(
            scalars, want,
            "every metric at its step, with its f32 value"
        );
        assert_eq!(configs, [(0, config_json(dir.path(), "config.json"))]);
    }

    #[cfg(feature = "tensorboard")]
    #[tokio::test]
    async fn a_resume_leaves_each_step_once_in_the_event_files() {
        let dir = tempfile::tempdir().unwrap();
        crashed_and_resumed(dir.path()).await;
        // Both processes' files: the crashed run's keeps steps 0 and 1 only.
        let files = event_files(dir.path());
        assert_eq!(files.len(), 2);
        let crashed = files
            .iter()
            .map(|f| rlvr::report::read_tensorboard_events(f).unwrap())
            .find(|events| events.iter().any(|e| e.step == 0 && !e.scalars.is_empty()))
            .unwrap();
        assert!(crashed.iter().all(|e| e.step < 2), "{crashed:?}");
        let (scalars, configs) = tb_scalars(dir.path());
        assert_eq!(scalars, jsonl_scalars(dir.path()));
        assert_eq!(
            configs,
            [
                (0, config_json(dir.path(), "config.json")),
                (2, config_json(dir.path(), "config.resume-000002.json"))
            ]
        );
    }

    /// TensorBoard's own reader (`EventAccumulator`, Python) finds every metric of
    /// `metrics.jsonl` at its step with its value, and the config text. Opt-in: set
    /// `RLVR_TENSORBOARD_PYTHON` to a Python with the `tensorboard` package (`.ci/run` does).
    #[cfg(feature = "tensorboard")]
    #[tokio::test]
    async fn tensorboard_reads_the_event_files() {
        let Some(python) = std::env::var_os("RLVR_TENSORBOARD_PYTHON") else {
            eprintln!(
                "skipped: set RLVR_TENSORBOARD_PYTHON to a Python with the `tensorboard` \
                 package to read the event files with TensorBoard's own reader"
            );
            return;
        };
        let dir = tempfile::tempdir().unwrap();
        crashed_and_resumed(dir.path()).await;
        let out = std::process::Command::new(python)
            .arg("-c")
            .arg(READ_WITH_TENSORBOARD)
            .arg(dir.path())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let got: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let mut scalars: BTreeMap<(String, i64), Vec<f32>> = BTreeMap::new();
        for s in got["scalars"].as_array().unwrap() {
            let tag = s[0].as_str().unwrap().to_string();
            let step = s[1].as_i64().unwrap();
            scalars
                .entry((tag, step))
                .or_default()
                .push(s[2].as_f64().unwrap() as f32);
        }
        assert_eq!(scalars, jsonl_scalars(dir.path()));
        let texts: Vec<(i64, serde_json::Value)> = got["texts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| {
                assert_eq!(t[0], rlvr::report::TENSORBOARD_CONFIG_TAG);
                (
                    t[1].as_i64().unwrap(),
                    config_of_text(t[2].as_str().unwrap()),
                )
            })
            .collect();
        assert_eq!(
            texts,
            [
                (0, config_json(dir.path(), "config.json")),
                (2, config_json(dir.path(), "config.resume-000002.json"))
            ]
        );
    }

    /// Prints the scalars `[tag, step, value]` and the text summaries `[tag, step, text]`
    /// that TensorBoard's `EventAccumulator` reads from the directory `argv[1]`, as JSON.
    const READ_WITH_TENSORBOARD: &str = r#"
import json, sys
from tensorboard.backend.event_processing import event_accumulator
acc = event_accumulator.EventAccumulator(sys.argv[1], size_guidance={"scalars": 0, "tensors": 0})
acc.Reload()
tags = acc.Tags()
scalars = [[t, e.step, e.value] for t in tags["scalars"] for e in acc.Scalars(t)]
texts = [[t, e.step, e.tensor_proto.string_val[0].decode("utf-8")] for t in tags["tensors"] for e in acc.Tensors(t)]
json.dump({"scalars": scalars, "texts": texts}, sys.stdout)
"#;
}
