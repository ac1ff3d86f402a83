//! GSM8K answer parsing: `extract_gsm8k_final_answer` on arbitrary text and
//! `Gsm8k::from_jsonl` on arbitrary file contents never panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rlvr::{dataset::extract_gsm8k_final_answer, Gsm8k};
use rlvr::Dataset;

fuzz_target!(|data: &[u8]| {
    let _ = extract_gsm8k_final_answer(&String::from_utf8_lossy(data));
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("train.jsonl");
    std::fs::write(&path, data).expect("write");
    if let Ok(ds) = Gsm8k::from_jsonl(&path) {
        for i in 0..ds.len() {
            let _ = ds.get(i);
        }
    }
});
