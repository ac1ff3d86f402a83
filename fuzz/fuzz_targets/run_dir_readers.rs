//! The run-directory readers used on resume (`metrics.jsonl`, `checkpoints.jsonl`): arbitrary
//! file contents give rows or an error, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rlvr::report::RunDir;

fuzz_target!(|data: &[u8]| {
    // First byte: the step a resume truncates from; the rest: both files.
    let (step, body) = match data.split_first() {
        Some((s, rest)) => (u64::from(*s), rest),
        None => (0, data),
    };
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(dir.path().join("metrics.jsonl"), body).expect("write");
    std::fs::write(dir.path().join("checkpoints.jsonl"), body).expect("write");
    if let Ok(mut run) = RunDir::create(dir.path()) {
        let _ = run.read_metrics();
        let _ = run.read_checkpoints();
        let _ = run.last_checkpoint();
        let _ = run.truncate_metrics_from(step);
        let _ = run.read_metrics();
    }
});
