//! The competition-math grader's speed on the agreement fixture, one thread: every pair of
//! `tests/fixtures/math_grader/pairs.jsonl` graded by each [`MathGrader`] mode, after a
//! warm-up pass. Prints per mode the total, pairs per second and the p50 / p99 / max latency
//! per pair, then the slowest of several gradings of inputs built to explode; `--json` prints the same as one JSON object (what `benches/math_grader.sh`
//! reads to set the figures beside the Python graders').
//!
//! ```text
//! cargo bench --bench math_grader -- [--json] [--limit N] [--fixture PATH]
//! ```

use std::time::{Duration, Instant};

use rlvr::reward::{MathGrader, grade_math_answer};

fn main() {
    let mut json = false;
    let mut limit = usize::MAX;
    let mut fixture = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/math_grader/pairs.jsonl"
    )
    .to_string();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--json" => json = true,
            "--limit" => {
                limit = args
                    .next()
                    .and_then(|n| n.parse().ok())
                    .unwrap_or(usize::MAX)
            }
            "--fixture" => fixture = args.next().unwrap_or(fixture),
            // `cargo bench` passes `--bench` to every target.
            "--bench" => {}
            other => {
                eprintln!("unknown argument {other}");
                std::process::exit(2);
            }
        }
    }
    let text =
        std::fs::read_to_string(&fixture).unwrap_or_else(|e| panic!("reading {fixture}: {e}"));
    let all: Vec<(String, String)> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|line| {
            let v: serde_json::Value =
                serde_json::from_str(line).unwrap_or_else(|e| panic!("{fixture}: {e}"));
            let field = |k: &str| v[k].as_str().unwrap_or_default().to_string();
            (field("given"), field("truth"))
        })
        .collect();
    // `--limit N`: N pairs evenly spaced over the file (it is sorted by kind), the same pairs
    // as `benches/math_grader.py --limit N`.
    let pairs: Vec<(String, String)> = if limit < all.len() {
        (0..limit)
            .map(|i| all[i * all.len() / limit].clone())
            .collect()
    } else {
        all
    };

    let mut report = serde_json::Map::new();
    report.insert("pairs".into(), pairs.len().into());
    for grader in MathGrader::ALL {
        // Warm-up: the lazily built tables and the caches.
        for (given, truth) in &pairs {
            std::hint::black_box(grade_math_answer(given, truth, grader));
        }
        let mut latencies = Vec::with_capacity(pairs.len());
        let start = Instant::now();
        let mut accepted = 0usize;
        for (given, truth) in &pairs {
            let t = Instant::now();
            accepted += usize::from(std::hint::black_box(grade_math_answer(
                std::hint::black_box(given),
                std::hint::black_box(truth),
                grader,
            )));
            latencies.push(t.elapsed());
        }
        let total = start.elapsed();
        latencies.sort_unstable();
        let pct = |p: f64| -> Duration {
            latencies
                .get(((latencies.len() as f64 - 1.0) * p).round() as usize)
                .copied()
                .unwrap_or_default()
        };
        let us = |d: Duration| d.as_secs_f64() * 1e6;
        let per_sec = pairs.len() as f64 / total.as_secs_f64();
        if !json {
            println!(
                "{:<12} {:>6} pairs in {:>8.2} ms: {:>10.0} pairs/s, p50 {:>7.2} µs, p99 {:>7.2} µs, max {:>8.2} µs ({accepted} accepted)",
                grader.as_str(),
                pairs.len(),
                total.as_secs_f64() * 1e3,
                per_sec,
                us(pct(0.5)),
                us(pct(0.99)),
                us(pct(1.0)),
            );
        }
        report.insert(
            grader.as_str().into(),
            serde_json::json!({
                "total_s": total.as_secs_f64(),
                "pairs_per_s": per_sec,
                "p50_us": us(pct(0.5)),
                "p99_us": us(pct(0.99)),
                "max_us": us(pct(1.0)),
                "accepted": accepted,
            }),
        );
    }
    // Inputs built to explode (the same as tests/it/math_grader.rs): the slowest of 5
    // gradings against a few short answers, both ways round, in every mode.
    let mut explosive = serde_json::Map::new();
    for (name, input) in explosive_inputs() {
        let mut worst = Duration::ZERO;
        for grader in MathGrader::ALL {
            for other in ["1", r"\frac{1}{2}", "x"] {
                for _ in 0..5 {
                    let t = Instant::now();
                    std::hint::black_box(grade_math_answer(&input, other, grader));
                    std::hint::black_box(grade_math_answer(other, &input, grader));
                    worst = worst.max(t.elapsed() / 2);
                }
            }
        }
        if !json {
            println!(
                "explosive {name:<28} worst {:>9.1} µs",
                worst.as_secs_f64() * 1e6
            );
        }
        explosive.insert(name.into(), (worst.as_secs_f64() * 1e6).into());
    }
    report.insert("explosive_worst_us".into(), explosive.into());
    if json {
        println!("{}", serde_json::Value::Object(report));
    }
}

/// Inputs built to explode: huge powers and factorials, deep nesting, a megabyte of text.
fn explosive_inputs() -> Vec<(&'static str, String)> {
    vec![
        ("10^{10^{10}}", r"10^{10^{10}}".to_string()),
        ("100000!", "100000!".to_string()),
        ("(10^{10^{10}})!", r"(10^{10^{10}})!".to_string()),
        ("power tower of 2s", r"2^{2^{2^{2^{2^{2}}}}}".to_string()),
        ("e^{e^{e^{100}}}", r"e^{e^{e^{100}}}".to_string()),
        (
            "10,000 nested braces",
            format!("{}1{}", "{".repeat(10_000), "}".repeat(10_000)),
        ),
        (
            "10,000 nested parens",
            format!("{}1{}", "(".repeat(10_000), ")".repeat(10_000)),
        ),
        (
            "10,000 nested \\frac",
            format!("{}1{}", r"\frac{1}{".repeat(10_000), "}".repeat(10_000)),
        ),
        (
            "10,000 nested \\sqrt",
            format!("{}2{}", r"\sqrt{".repeat(10_000), "}".repeat(10_000)),
        ),
        ("1 MB sum 1+1+...", "1+".repeat(500_000) + "1"),
        ("1 MB of digits", "9".repeat(1_000_000)),
        ("100 KB of letters", "x".repeat(100_000)),
        ("4 KB of letters", "x".repeat(4_000)),
        // As deep as fits under the 4 KiB input limit: the depth limits must stop these.
        (
            "2,000 nested braces",
            format!("{}1{}", "{".repeat(2_000), "}".repeat(2_000)),
        ),
        (
            "2,000 nested parens",
            format!("{}1{}", "(".repeat(2_000), ")".repeat(2_000)),
        ),
        (
            "400 nested \\frac",
            format!("{}1{}", r"\frac{1}{".repeat(400), "}".repeat(400)),
        ),
        (
            "500 nested \\sqrt",
            format!("{}2{}", r"\sqrt{".repeat(500), "}".repeat(500)),
        ),
        (
            "1,000 nested powers",
            "2^{".repeat(1_000) + "2" + &"}".repeat(1_000),
        ),
    ]
}
