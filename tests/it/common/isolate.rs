//! Running one test alone in a process of its own.
//!
//! All the integration tests share one process (the `it` binary). A test that needs the
//! process to itself — it counts the process's OS threads, or changes process-wide state that
//! other tests read (renderers registered under built-in names) — starts its first line with
//!
//! ```ignore
//! if !crate::common::isolate::runs_here(module_path!(), "the_test_fn") {
//!     return; // it ran, and passed, in a child process
//! }
//! ```
//!
//! In the test process this starts the test binary again, filtered to exactly that test, with
//! [`ALONE`] naming it; in that child, where nothing else runs, the same call returns `true`
//! and the test body runs.

use std::process::Command;

/// The environment variable that names the one test a child process runs (`module::test`).
pub const ALONE: &str = "RLVR_IT_ALONE";

/// The name libtest knows `test` in `module` by (`module_path!()` without the crate's name):
/// `"it::bounded_graders"`, `"x"` → `"bounded_graders::x"`.
pub fn test_name(module: &str, test: &str) -> String {
    match module.split_once("::") {
        Some((_, path)) => format!("{path}::{test}"),
        None => test.to_owned(),
    }
}

/// `true` in the child process started for this test (run the test's body there); in any
/// other process, runs the test in such a child, passes its output on, asserts that it ran
/// exactly this one test and passed, and returns `false` (the caller returns).
pub fn runs_here(module: &str, test: &str) -> bool {
    let name = test_name(module, test);
    if std::env::var(ALONE).is_ok_and(|v| v == name) {
        return true;
    }
    let exe = std::env::current_exe().expect("the test binary");
    let out = Command::new(exe)
        .args([name.as_str(), "--exact", "--nocapture", "--test-threads=1"])
        .env(ALONE, &name)
        .output()
        .unwrap_or_else(|e| panic!("starting the child process for {name}: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    // Through the harness's capture: shown when the test fails, or with `--nocapture`.
    print!("{stdout}");
    eprint!("{stderr}");
    assert!(
        out.status.success(),
        "{name} failed in its own process ({}): {}",
        out.status,
        child_panic(&stderr)
    );
    assert!(
        stdout.contains("test result: ok. 1 passed;"),
        "the child process did not run {name} (no such test?)"
    );
    false
}

/// The child's panic message (the `panicked at` line and the lines up to its backtrace), so
/// that the parent's failure names the cause even where a CI log keeps only its last lines.
fn child_panic(stderr: &str) -> String {
    let Some(start) = stderr.find("panicked at") else {
        return "no panic message in its stderr".to_owned();
    };
    stderr[start..]
        .lines()
        .take_while(|l| !l.starts_with("stack backtrace:") && !l.starts_with("note: "))
        .take(12)
        .collect::<Vec<_>>()
        .join("\n")
}
