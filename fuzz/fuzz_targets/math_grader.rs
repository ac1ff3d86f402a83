//! `grade_math_answer` in every mode on arbitrary text: never panics, and every verdict
//! comes back quickly (the grader's own budget bounds parsing and evaluation).
#![no_main]

use std::time::{Duration, Instant};

use libfuzzer_sys::fuzz_target;
use rlvr::reward::{grade_math_answer, MathGrader};

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    // Split the input in two for a (given, truth) pair.
    let mid = text
        .char_indices()
        .nth(text.chars().count() / 2)
        .map_or(0, |(i, _)| i);
    let (given, truth) = text.split_at(mid);
    for grader in [MathGrader::Sympy, MathGrader::MathVerify, MathGrader::Best] {
        let start = Instant::now();
        let _ = grade_math_answer(given, truth, grader);
        let _ = grade_math_answer(truth, given, grader);
        // Generous for unoptimised, instrumented fuzz builds: a hang is what this catches.
        assert!(start.elapsed() < Duration::from_secs(1), "{grader:?} took {:?}", start.elapsed());
    }
});
