//! The `math` example run as a user runs it (the compiled example binary; see
//! `example_gsm8k` for how it is found and when a missing binary is skipped). Nothing here
//! touches the network.

use crate::example_gsm8k::{example_binary_named, fixtures, metrics_rows, run, text, tiny_model};

#[test]
fn arithmetic_trains_offline_on_the_embedded_model() {
    let Some(bin) = example_binary_named("math") else {
        return;
    };
    let cwd = tempfile::tempdir().unwrap();
    let log_dir = cwd.path().join("run");
    let out = run(
        &bin,
        cwd.path(),
        &[
            "--dataset",
            "arithmetic",
            "--steps",
            "3",
            "--batch-size",
            "4",
            "--group-size",
            "4",
            "--eval-every",
            "2",
            "--eval-problems",
            "8",
            "--log-dir",
            log_dir.to_str().unwrap(),
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(stdout.contains("grader last integer"), "{stdout}");
    let rows = metrics_rows(&log_dir);
    let steps: Vec<u64> = rows
        .iter()
        .filter_map(|r| r["env/all/reward/total"].as_f64().and(r["step"].as_u64()))
        .collect();
    assert_eq!(steps.len(), 3, "{rows:?}");
    assert!(rows.iter().any(|r| r["test/env/all/correct"].is_number()));
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(log_dir.join("config.json")).unwrap())
            .unwrap();
    assert_eq!(config["run"]["dataset"], "arithmetic");
    assert_eq!(config["run"]["renderer"], "role_colon");
}

#[test]
fn math500_trains_on_a_local_model_with_each_grader() {
    let Some(bin) = example_binary_named("math") else {
        return;
    };
    let cwd = tempfile::tempdir().unwrap();
    let model = tiny_model(cwd.path());
    let math500 = fixtures().join("math_datasets/MATH-500/test.jsonl");
    for grader in ["best", "sympy", "math_verify"] {
        let log_dir = cwd.path().join(grader);
        let out = run(
            &bin,
            cwd.path(),
            &[
                "--dataset",
                "math500",
                "--math500",
                math500.to_str().unwrap(),
                "--model",
                model.to_str().unwrap(),
                "--renderer",
                "role_colon",
                "--grader",
                grader,
                "--steps",
                "1",
                "--batch-size",
                "2",
                "--group-size",
                "2",
                "--max-tokens",
                "4",
                "--log-dir",
                log_dir.to_str().unwrap(),
            ],
        );
        assert!(out.status.success(), "{grader}: {}", text(&out.stderr));
        assert!(text(&out.stdout).contains(&format!("grader {grader}")));
        assert_eq!(metrics_rows(&log_dir).len(), 1);
    }
}

#[test]
fn mistakes_are_explained_before_anything_starts() {
    let Some(bin) = example_binary_named("math") else {
        return;
    };
    let cwd = tempfile::tempdir().unwrap();
    let cases: [(&[&str], &str); 3] = [
        // No Tinker key, no model, a dataset that needs a real model.
        (&["--dataset", "math"], "--dataset arithmetic"),
        (&["--grader", "exact"], "unknown math grader `exact`"),
        (
            &[
                "--dataset",
                "math500",
                "--model",
                "m",
                "--math500",
                "no-such.jsonl",
            ],
            "no-such.jsonl",
        ),
    ];
    for (args, needle) in cases {
        let out = run(&bin, cwd.path(), args);
        let stderr = text(&out.stderr);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(
            stderr.contains(needle),
            "{args:?}: no `{needle}` in: {stderr}"
        );
        assert!(!cwd.path().join("runs").exists());
    }
}
