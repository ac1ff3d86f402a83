//! The run directory: config redaction, metrics, checkpoints, samples, plots, progress.

use std::collections::BTreeMap;
use std::fs;

use rlvr::report::{
    redact_secrets, CheckpointRecord, Progress, ProgressMode, RunDir, SampleRecord,
};
use rlvr::{
    renderer::ParseTermination,
    types::{CheckpointRef, StopReason},
    Error,
};
use serde_json::{json, Value};

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
