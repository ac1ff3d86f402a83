//! The competition-math grader (`rlvr::reward::grade_math_answer`) against the references:
//! the tinker-cookbook's (0.6.1) `grade_answer` (sympy) and `grade_answer_math_verify`
//! (math-verify 0.9), on the verdicts committed in `tests/fixtures/math_grader/pairs.jsonl`
//! and `pairs_seed7.jsonl` (made by `make_pairs.py` next to them, which also sets each pair's
//! mathematical truth by construction). Every remaining difference from a reference must be listed, with its
//! reason, in `docs/grading.md`; `MathGrader::Best` must accept no wrong answer and more right
//! ones than math-verify. Then inputs built to explode, and properties over random input.

use proptest::prelude::*;
use rlvr::reward::{MathAnswer, MathGrader, grade_math_answer};

#[derive(Debug, serde::Deserialize)]
struct Pair {
    given: String,
    truth: String,
    kind: String,
    /// The mathematical truth, by construction.
    equivalent: bool,
    /// The cookbook's `grade_answer`.
    sympy: bool,
    /// The cookbook's `grade_answer_math_verify`.
    math_verify: bool,
}

/// The pairs of both fixture files: `pairs.jsonl` (the generator's default seed) and
/// `pairs_seed7.jsonl` (the same shapes with other numbers, `make_pairs.py --seed 7
/// --preview 1800`).
fn pairs() -> Vec<Pair> {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/math_grader");
    let mut pairs = Vec::new();
    for file in ["pairs.jsonl", "pairs_seed7.jsonl"] {
        let text = std::fs::read_to_string(format!("{dir}/{file}")).expect("fixture");
        for (i, line) in text
            .lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty())
        {
            pairs.push(
                serde_json::from_str(line).unwrap_or_else(|e| panic!("{file} line {}: {e}", i + 1)),
            );
        }
    }
    pairs
}

/// How a pair is written in the differences tables of `docs/grading.md`.
fn doc_cell(s: &str) -> String {
    format!("`{}`", s.replace('|', r"\|"))
}

/// The mode's verdicts against the reference's: agreement at least `min`, and every
/// disagreement listed in `docs/grading.md` (a table row naming both answers).
fn check_agreement(grader: MathGrader, reference: fn(&Pair) -> bool, min: f64) {
    let pairs = pairs();
    assert!(pairs.len() >= 6000, "{} pairs", pairs.len());
    let docs = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/grading.md"))
        .expect("docs/grading.md");
    let mut differences = Vec::new();
    for p in &pairs {
        let ours = grade_math_answer(&p.given, &p.truth, grader);
        if ours != reference(p) {
            differences.push((p, ours));
        }
    }
    let mut unlisted = Vec::new();
    for (p, ours) in &differences {
        println!(
            "{grader}: reference {:5} rlvr {:5} ({}) given {:?} truth {:?}",
            reference(p),
            ours,
            p.kind,
            p.given,
            p.truth
        );
        let (g, t) = (doc_cell(&p.given), doc_cell(&p.truth));
        if !docs
            .lines()
            .any(|l| l.starts_with('|') && l.contains(&g) && l.contains(&t))
        {
            unlisted.push(format!("| {g} | {t} |"));
        }
    }
    let agreement = 1.0 - differences.len() as f64 / pairs.len() as f64;
    println!(
        "{grader}: agreement {:.2} % ({} of {} pairs differ)",
        100.0 * agreement,
        differences.len(),
        pairs.len()
    );
    assert!(agreement >= min, "{grader}: agreement {agreement}");
    assert!(
        unlisted.is_empty(),
        "{grader}: differences missing from docs/grading.md:\n{}",
        unlisted.join("\n")
    );
}

#[test]
fn sympy_mode_agrees_with_the_cookbook_grade_answer() {
    check_agreement(MathGrader::Sympy, |p| p.sympy, 0.99);
}

#[test]
fn math_verify_mode_agrees_with_the_cookbook_grade_answer_math_verify() {
    check_agreement(MathGrader::MathVerify, |p| p.math_verify, 0.99);
}

/// `Best` accepts no wrong answer, accepts every right one that a reference accepts, and
/// more right ones than math-verify.
#[test]
fn best_mode_is_right_where_the_references_are_and_beyond() {
    let pairs = pairs();
    let mut wrong_accepted = Vec::new();
    let mut missed = Vec::new();
    let (mut best, mut math_verify, mut sympy) = (0, 0, 0);
    for p in &pairs {
        let ours = grade_math_answer(&p.given, &p.truth, MathGrader::Best);
        if ours && !p.equivalent {
            wrong_accepted.push(p);
        }
        if p.equivalent {
            best += usize::from(ours);
            math_verify += usize::from(p.math_verify);
            sympy += usize::from(p.sympy);
            if !ours && (p.math_verify || p.sympy) {
                missed.push(p);
            }
            if !ours {
                println!(
                    "Best rejects a right answer ({}): given {:?} truth {:?}",
                    p.kind, p.given, p.truth
                );
            }
        }
    }
    let right = pairs.iter().filter(|p| p.equivalent).count();
    println!(
        "right answers accepted: best {best}, math_verify {math_verify}, sympy {sympy} of {right}"
    );
    assert!(
        wrong_accepted.is_empty(),
        "Best accepts wrong answers: {wrong_accepted:#?}"
    );
    assert!(
        missed.is_empty(),
        "Best rejects right answers a reference accepts: {missed:#?}"
    );
    assert!(best > math_verify && best > sympy);
}

/// Inputs built to explode: huge powers and factorials, deep nesting, a megabyte of text.
/// Each gets a verdict (none of them is equal to anything here) in every mode, both ways
/// round, without a panic or a stack overflow; `benches/math_grader.rs` times them.
#[test]
fn explosive_inputs_get_a_verdict() {
    let deep_braces = format!("{}1{}", "{".repeat(10_000), "}".repeat(10_000));
    let deep_parens = format!("{}1{}", "(".repeat(10_000), ")".repeat(10_000));
    let deep_fracs = format!("{}1{}", r"\frac{1}{".repeat(10_000), "}".repeat(10_000));
    let deep_sqrt = format!("{}2{}", r"\sqrt{".repeat(10_000), "}".repeat(10_000));
    let deep_powers = "2^".repeat(10_000) + "2";
    let megabyte = "1+".repeat(500_000) + "1";
    let long_number = "9".repeat(1_000_000);
    // As deep as fits under the engines' 4 KiB input limit: the parsers' depth limits, not
    // the size limit, must stop these (in debug builds too, on a test thread's 2 MiB stack).
    let deep_braces_4k = format!("{}1{}", "{".repeat(2_000), "}".repeat(2_000));
    let deep_parens_4k = format!("{}1{}", "(".repeat(2_000), ")".repeat(2_000));
    let deep_fracs_4k = format!("{}1{}", r"\frac{1}{".repeat(400), "}".repeat(400));
    let deep_sqrt_4k = format!("{}2{}", r"\sqrt{".repeat(500), "}".repeat(500));
    let deep_text_4k = format!("{}2{}", r"\text{".repeat(500), "}".repeat(500));
    let deep_minus_4k = "-".repeat(4_000) + "1";
    let deep_powers_4k = "2^{".repeat(1_000) + "2" + &"}".repeat(1_000);
    let inputs = [
        r"10^{10^{10}}",
        r"100000!",
        r"2^{2^{2^{2^{2^{2}}}}}",
        r"(10^{10^{10}})!",
        r"\sqrt[100000]{10^{100000}}",
        r"e^{e^{e^{100}}}",
        r"\sin(10^{10^{10}})",
        &deep_braces,
        &deep_parens,
        &deep_fracs,
        &deep_sqrt,
        &deep_powers,
        &megabyte,
        &long_number,
        &deep_braces_4k,
        &deep_parens_4k,
        &deep_fracs_4k,
        &deep_sqrt_4k,
        &deep_text_4k,
        &deep_minus_4k,
        &deep_powers_4k,
    ];
    for (i, input) in inputs.into_iter().enumerate() {
        for grader in MathGrader::ALL {
            for other in ["1", "0", r"\frac{1}{2}", "x"] {
                let verdict = grade_math_answer(input, other, grader);
                // The first seven are huge numbers, equal to none of these; the nested ones
                // may well be (`{{{1}}}` is 1).
                assert!(i >= 7 || !verdict, "{grader}: {input} = {other}");
                let _ = grade_math_answer(other, input, grader);
            }
            let _ = grade_math_answer(input, input, grader);
        }
    }
}

#[test]
fn math_answer_scores_as_the_cookbook_math_env() {
    use rlvr::renderer::ParseTermination::{Eos, StopSequence};
    let reward = MathAnswer::new(MathGrader::Sympy);
    let total = |truth: &str, text: &str, t| reward.score(truth, text, t).total;
    assert_eq!(total("3", r"so \boxed{3}", StopSequence), 1.0);
    assert!((total("3", r"so \boxed{3}", Eos) - 0.9).abs() < 1e-12);
    assert_eq!(total("3", r"so \boxed{4}", StopSequence), 0.0);
    assert!((total("3", "no box", StopSequence) + 0.1).abs() < 1e-12);
    // An unmatched `}` anywhere: no box at all (the cookbook's `ValueError`).
    assert!((total("3", r"\boxed{3}}", StopSequence) + 0.1).abs() < 1e-12);
    let lenient = reward.require_stop_sequence(false).with_format_coef(0.5);
    assert_eq!(lenient.score("3", r"\boxed{3}", Eos).total, 1.0);
    assert_eq!(lenient.score("3", r"\boxed{4}", Eos).total, 0.0);
    assert_eq!(lenient.score("3", "none", Eos).total, -0.5);
}

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(256),
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// Text made of the pieces LaTeX answers are made of.
fn latex_answer() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        Just(r"\frac".to_string()),
        Just(r"\dfrac".to_string()),
        Just(r"\sqrt".to_string()),
        Just(r"\sqrt[".to_string()),
        Just(r"\pi".to_string()),
        Just(r"\infty".to_string()),
        Just(r"\cup".to_string()),
        Just(r"\left(".to_string()),
        Just(r"\right)".to_string()),
        Just(r"\text{".to_string()),
        Just(r"\begin{pmatrix}".to_string()),
        Just(r"\end{pmatrix}".to_string()),
        Just(r"\\".to_string()),
        Just("&".to_string()),
        Just(r"\{".to_string()),
        Just(r"\}".to_string()),
        Just(r"^\circ".to_string()),
        Just(r"\%".to_string()),
        Just(r"\$".to_string()),
        Just(r"\pm".to_string()),
        Just(r"\log_".to_string()),
        Just(r"\sin".to_string()),
        Just(r"\overline{".to_string()),
        Just("{".to_string()),
        Just("}".to_string()),
        Just("(".to_string()),
        Just(")".to_string()),
        Just("[".to_string()),
        Just("]".to_string()),
        Just("^".to_string()),
        Just("_".to_string()),
        Just("=".to_string()),
        Just(",".to_string()),
        Just(".".to_string()),
        Just("/".to_string()),
        Just("-".to_string()),
        Just("+".to_string()),
        Just("*".to_string()),
        Just("!".to_string()),
        Just(" ".to_string()),
        Just("$".to_string()),
        "[0-9]{1,12}",
        "[a-z]{1,3}",
        any::<String>().prop_map(|s| s.chars().take(3).collect()),
    ];
    prop::collection::vec(piece, 0..20).prop_map(|v| v.concat())
}

/// A rational number written in one of the ways models write it.
fn written(num: i64, den: i64, style: u8) -> String {
    let (n, d) = if den < 0 { (-num, -den) } else { (num, den) };
    match style % 4 {
        0 => format!(r"\frac{{{n}}}{{{d}}}"),
        1 => format!("{n}/{d}"),
        2 if n < 0 => format!(r"-\dfrac{{{}}}{{{d}}}", -n),
        2 => format!(r"\dfrac{{{n}}}{{{d}}}"),
        _ => format!(r"\left(\frac{{{}}}{{{}}}\right)", 2 * n, 2 * d),
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn never_panics(given in latex_answer(), truth in latex_answer()) {
        for grader in MathGrader::ALL {
            let _ = grade_math_answer(&given, &truth, grader);
        }
    }

    #[test]
    fn best_is_symmetric(given in latex_answer(), truth in latex_answer()) {
        prop_assert_eq!(
            grade_math_answer(&given, &truth, MathGrader::Best),
            grade_math_answer(&truth, &given, MathGrader::Best)
        );
    }

    /// Equal rationals written differently are equal to `Best`; different ones are not.
    #[test]
    fn best_compares_rationals_by_value(
        a in -1000i64..1000, b in 1i64..1000, c in -1000i64..1000, d in 1i64..1000,
        s in any::<u8>(), t in any::<u8>(),
    ) {
        let (x, y) = (written(a, b, s), written(c, d, t));
        prop_assert_eq!(grade_math_answer(&x, &y, MathGrader::Best), a * d == b * c, "{} vs {}", x, y);
    }

    /// Sums of terms are equal to `Best` in any order.
    #[test]
    fn best_ignores_the_order_of_terms(
        terms in prop::collection::vec(prop_oneof![
            (1u32..20).prop_map(|n| format!("{n}x")),
            (1u32..20).prop_map(|n| format!(r"{n}\sqrt{{2}}")),
            (1u32..20).prop_map(|n| format!(r"\frac{{{n}}}{{3}}")),
            (1u32..20).prop_map(|n| format!("{n}x^{{2}}")),
        ], 1..5),
        seed in any::<u64>(),
    ) {
        let mut shuffled = terms.clone();
        let n = shuffled.len();
        for i in (1..n).rev() {
            shuffled.swap(i, (seed.wrapping_mul(i as u64 + 7) % (i as u64 + 1)) as usize);
        }
        let (x, y) = (terms.join("+"), shuffled.join(" + "));
        prop_assert!(grade_math_answer(&x, &y, MathGrader::Best), "{} vs {}", x, y);
        let z = format!("{y}+1");
        prop_assert!(!grade_math_answer(&x, &z, MathGrader::Best), "{} vs {}", x, z);
    }
}

/// The rewritings `docs/grading.md` says `Best` accepts, and the near-misses it says `Best`
/// rejects.
#[test]
fn best_accepts_the_documented_rewritings() {
    let same = [
        (r"\frac{2}{4}", "0.5"),
        ("1/2", r"\tfrac12"),
        (r"0.\overline{3}", r"\frac13"),
        (r"1{,}000", "1000"),
        (r"2\frac13", "7/3"),
        (r"1.5\times10^{3}", "1500"),
        ("x+1", "1+x"),
        (r"\frac{5}{\sqrt2}", r"\frac{5\sqrt2}{2}"),
        (r"\pi/3", r"\frac{\pi}{3}"),
        (r"\log_2 8", "3"),
        (r"\sin 30^\circ", r"\frac12"),
        (r"5 \text{ cm}", "5"),
        ("x = 5", "5"),
        (r"\left( 1, 2 \right)", "(1,2)"),
        (r"30^\circ", r"\frac{\pi}{6}"),
        (r"50\%", "0.5"),
        (r"50\%", "50"),
        ("1010", "1010_2"),
        (r"\{3,1\}", "1, 3"),
        (r"x=1 \text{ or } x=3", r"\{1, 3\}"),
        (r"(3,\infty)\cup(-\infty,-2)", r"(-\infty,-2)\cup(3,\infty)"),
        (r"\varnothing", r"\emptyset"),
        (r"\{\}", r"\emptyset"),
        (r"x > 3", r"(3, \infty)"),
        (r"1 \pm \sqrt{2}", r"1+\sqrt2, 1-\sqrt2"),
        (r"\begin{pmatrix} 1 \\ 2 \end{pmatrix}", "(1, 2)"),
        ("2y = 4x + 6", "y = 2x + 3"),
        (r"\$18.90", "18.9"),
    ];
    for (given, truth) in same {
        assert!(
            grade_math_answer(given, truth, MathGrader::Best),
            "{given} vs {truth}"
        );
    }
    let different = [
        ("3.14", r"\pi"),
        ("0.33", r"\frac13"),
        (r"5\text{ mm}", r"5\text{ cm}"),
        ("1010_3", "1010_2"),
        ("(2, 1)", "(1, 2)"),
        ("[1,2)", "[1,2]"),
        (r"\{1, 2\}", "(1, 2)"),
        (r"10\sqrt[3]{2}", r"10\sqrt{2}"),
        (r"2^{n-1}", "2^n - 1"),
    ];
    for (given, truth) in different {
        assert!(
            !grade_math_answer(given, truth, MathGrader::Best),
            "{given} vs {truth}"
        );
    }
}

/// Random, deeply composed LaTeX labelled by both cookbook graders
/// (`tests/fixtures/math_grader/probe_pairs.jsonl`, `make_probe_pairs.py`): a probe beyond the
/// fixture's answer shapes. The remaining differences are classes `docs/grading.md` lists
/// (arithmetic on `\infty`, scalars times matrices, surrounding spaces around a `\text` unit).
#[test]
fn both_cookbook_modes_agree_on_random_probes() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/math_grader/probe_pairs.jsonl"
    );
    let text = std::fs::read_to_string(path).expect("fixture");
    let probes: Vec<serde_json::Value> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).expect("json"))
        .collect();
    assert!(probes.len() >= 1000);
    for (grader, key, min) in [
        (MathGrader::Sympy, "sympy", 0.995),
        (MathGrader::MathVerify, "math_verify", 0.985),
    ] {
        let mut differ = 0;
        for p in &probes {
            let (given, truth) = (p["given"].as_str().unwrap(), p["truth"].as_str().unwrap());
            let reference = p[key].as_bool().unwrap();
            if grade_math_answer(given, truth, grader) != reference {
                differ += 1;
                println!("{grader}: reference {reference} given {given:?} truth {truth:?}");
            }
        }
        let agreement = 1.0 - differ as f64 / probes.len() as f64;
        println!(
            "{grader}: {:.2} % of {} probes",
            100.0 * agreement,
            probes.len()
        );
        assert!(agreement >= min, "{grader}: {agreement}");
    }
}
