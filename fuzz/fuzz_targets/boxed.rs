//! `extract_boxed` and `answers_equivalent` on arbitrary text: never panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rlvr::reward::{answers_equivalent, extract_boxed};

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let boxed = extract_boxed(&text);
    // Split the input in two for a (given, truth) pair.
    let mid = text
        .char_indices()
        .nth(text.chars().count() / 2)
        .map_or(0, |(i, _)| i);
    let (a, b) = text.split_at(mid);
    let _ = answers_equivalent(a, b);
    let _ = answers_equivalent(b, a);
    if let Some(given) = boxed {
        let _ = answers_equivalent(&given, b);
    }
});
