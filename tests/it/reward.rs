//! The boxed-answer grader (extraction, equivalence, both reward modes), closures as
//! reward functions, and grading with a timeout.
//! Reference: reference/cookbook-semantics.md §c (ProblemEnv), §d.3, §d.4.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use rlvr::{BoxedAnswer, dataset::Problem, renderer::ParseTermination};
use rlvr::{
    RewardFn,
    reward::{
        GradeStats, Response, Reward, RewardError, answers_equivalent, extract_boxed,
        grade_with_timeout,
    },
};

// ------------------------------------------------------------------------------------------
// Extraction
// ------------------------------------------------------------------------------------------

fn boxed(text: &str) -> Option<String> {
    extract_boxed(text)
}

#[test]
fn extracts_simple_and_nested_boxes() {
    assert_eq!(boxed(r"The answer is \boxed{42}").as_deref(), Some("42"));
    assert_eq!(
        boxed(r"\boxed{\frac{1}{2}}").as_deref(),
        Some(r"\frac{1}{2}")
    );
    assert_eq!(boxed(r"\boxed{a{b}c}").as_deref(), Some("a{b}c"));
    assert_eq!(
        boxed(r"\boxed{\left(3, \frac{\pi}{2}\right)}").as_deref(),
        Some(r"\left(3, \frac{\pi}{2}\right)")
    );
    // Content is returned verbatim, spaces included.
    assert_eq!(boxed(r"\boxed{ 7 }").as_deref(), Some(" 7 "));
}

#[test]
fn last_box_wins() {
    assert_eq!(boxed(r"\boxed{1} and \boxed{2}").as_deref(), Some("2"));
    assert_eq!(
        boxed(r"first \boxed{\frac{1}{2}}, then \boxed{3}.").as_deref(),
        Some("3")
    );
    // A box inside a box: the outer one closes last.
    assert_eq!(
        boxed(r"\boxed{\boxed{1}+2}").as_deref(),
        Some(r"\boxed{1}+2")
    );
    // Braced boxes take precedence over the brace-less fallback.
    assert_eq!(boxed(r"\boxed{5} or \boxed 6").as_deref(), Some("5"));
}

#[test]
fn brace_less_fallback() {
    assert_eq!(boxed(r"\boxed 7").as_deref(), Some("7"));
    assert_eq!(boxed(r"so \boxed   abc12 done").as_deref(), Some("abc12"));
    // The first match, as the cookbook's `re.search`.
    assert_eq!(boxed(r"\boxed 1 then \boxed 2").as_deref(), Some("1"));
    // Only [a-zA-Z0-9]+ is taken.
    assert_eq!(boxed(r"\boxed 3.5").as_deref(), Some("3"));
    // Needs whitespace; `\boxed7` and `\boxed {7}` are not boxes.
    assert_eq!(boxed(r"\boxed7"), None);
    assert_eq!(boxed(r"\boxed {7}"), None);
}

#[test]
fn empty_and_missing_boxes() {
    assert_eq!(boxed(r"\boxed{}").as_deref(), Some(""));
    assert_eq!(boxed("no boxed answer here"), None);
    assert_eq!(boxed(""), None);
    assert_eq!(boxed(r"\fbox{3}"), None);
    assert_eq!(boxed(r"{3}"), None);
}

#[test]
fn unbalanced_input_returns_what_is_recoverable() {
    // A stray `}` anywhere: no box at all (the cookbook raises "Unmatched }").
    assert_eq!(boxed(r"\boxed{5}}"), None);
    assert_eq!(boxed(r"}\boxed{5}"), None);
    assert_eq!(boxed(r"\boxed{5} }"), None);
    assert_eq!(boxed(r"}}} \boxed{\frac{1}{2}} }"), None);
    // An unclosed box never forms.
    assert_eq!(boxed(r"\boxed{5"), None);
    assert_eq!(boxed(r"\boxed{\frac{1}{2}"), None);
    assert_eq!(boxed(r"\boxed{1} \boxed{2").as_deref(), Some("1"));
    assert_eq!(boxed("{{{{"), None);
    assert_eq!(boxed("}}}}"), None);
    assert_eq!(boxed(r"\boxed{"), None);
    assert_eq!(boxed(r"\boxed}"), None);
    // Multi-byte text around the braces.
    assert_eq!(boxed("Ответ: \\boxed{λ²} ✓").as_deref(), Some("λ²"));
}

// ------------------------------------------------------------------------------------------
// Equivalence
// ------------------------------------------------------------------------------------------

/// Every row of the "Checked results" table of §d.4 except the sympy-symbolic
/// `2\sqrt{2}` vs `\sqrt{8}` (no symbolic algebra here).
#[test]
fn cookbook_checked_results() {
    let rows: &[(&str, &str, bool)] = &[
        ("17.0", "17", true),
        ("1,000", "1000", true),
        (r"\frac{1}{2}", "0.5", true),
        ("0.25", r"\frac{1}{4}", true),
        (
            r"(3,\frac{\pi}{2})",
            r"\left( 3, \frac{\pi}{2} \right)",
            true,
        ),
        (r"\$18", "18", true),
        (r"18\text{ dollars}", "18", true),
        ("18 dollars", "18", false),
        ("x=5", "5", true),
        (r"50\%", "50", true),
        (r"\text{(A)}", "A", true),
        ("2/4", "1/2", false),
    ];
    for &(given, truth, expected) in rows {
        assert_eq!(
            answers_equivalent(given, truth),
            expected,
            "grade_answer({given:?}, {truth:?})"
        );
    }
}

/// The cookbook's own unit tests for `grade_answer`.
#[test]
fn cookbook_unit_tests() {
    assert!(answers_equivalent("42", "42"));
    assert!(answers_equivalent("0.5", r"\frac{1}{2}"));
    assert!(!answers_equivalent("43", "42"));
}

#[test]
fn numeric_rules() {
    let yes: &[(&str, &str)] = &[
        // commas, money, percent
        ("1,234,567", "1234567"),
        ("$1,000.50", "1000.5"),
        (r"\$ 18", "18"),
        ("$18$", "18"),
        ("50%", "50"),
        (r"1{,}000", "1000"),
        (r"1\,000", "1000"),
        // decimals
        ("17.", "17"),
        ("17.00", "17"),
        ("-3.0", "-3"),
        ("- 3", "-3"),
        ("\u{2212}3", "-3"),
        ("+3", "3"),
        (".5", "0.5"),
        ("0.50", ".5"),
        ("1e3", "1000"),
        // fractions vs decimals, all spellings
        (r"\frac14", "0.25"),
        ("0.25", r"\frac14"),
        ("3/4", "0.75"),
        (r"\dfrac{3}{4}", "0.75"),
        (r"\tfrac{3}{4}", "0.75"),
        (r"\frac{6}{4}", "1.5"),
        (r"-\frac{1}{2}", "-0.5"),
        (r"\frac{-1}{2}", "-0.5"),
        (r"\frac{2}{4}", "2/4"),
        (r"\frac{1}{2}", r"\dfrac12"),
        ("-1/2", r"\frac{-1}{2}"),
        ("7 3/4", "7.75"),
        // wrappers, units, spacing
        (r"\text{5}", "5"),
        (r"\textbf{5}", "5"),
        (r"\mbox{5}", "5"),
        (r"12\mathrm{cm}", "12"),
        // formatting macros and math delimiters
        (r"\mathbf{5}", "5"),
        (r"\boldsymbol{5}", "5"),
        (r"\mathit{5}", "5"),
        (r"\mathrm{5}", "5"),
        (r"\textbf{5}", "5"),
        (r"{\bf 5}", "5"),
        (r"\bf 5", "5"),
        (r"\mathbf 5", "5"),
        (r"\mathbf{-\frac{1}{2}}", "-0.5"),
        (r"(\mathbf{1}, \boldsymbol{2})", "(1,2)"),
        (r"\mathbf{18}\text{ dollars}", "18"),
        (r"\(42\)", "42"),
        (r"\[42\]", "42"),
        (r"\[ \mathbf{42} \]", "42"),
        ("$42$", "42"),
        ("$$42$$", "42"),
        (r"\(\frac{1}{2}\)", "0.5"),
        (r"12 \text{cm}", "12"),
        ("5 hours", "5"),
        ("12 inches", "12"),
        ("3 meters^2", "3"),
        (r"90^\circ", "90"),
        (r"90^{\circ}", "90"),
        ("90°", "90"),
        (r"\left(5\right)", "5"),
        ("  42 \n", "42"),
        ("{42}", "42"),
        ("x = 5", "5"),
        ("ab=5", "5"),
        // empty groups and a box inside the box
        ("370{}", "370"),
        ("{}370", "370"),
        ("370{ }", "370"),
        (r"\boxed{7}", "7"),
        // radicals, in canonical form
        (r"2\sqrt{2}", r"\sqrt{8}"),
        (r"\sqrt{18}", r"3\sqrt{2}"),
        (r"-\sqrt{12}", r"-2\sqrt3"),
        (r"\sqrt{4}", r"2\sqrt{1}"),
    ];
    for &(given, truth) in yes {
        assert!(
            answers_equivalent(given, truth),
            "{given:?} should equal {truth:?}"
        );
    }
    let no: &[(&str, &str)] = &[
        ("5.1", "5"),
        ("5", "5.1"),
        // unreduced fractions are not accepted, against a fraction or an integer
        ("2/4", "1/2"),
        (r"\frac{2}{4}", r"\frac{1}{2}"),
        ("10/2", "5"),
        ("5", "10/2"),
        // bare words are not units
        ("18 dollars", "18"),
        ("18 apples", "18"),
        // scale words are not numbers (the cookbook: `1*10^6` is not an integer string)
        ("2 million", "2000000"),
        ("1.5 million", "1500000"),
        // radicals: an integer reference needs an integer answer
        (r"\sqrt{4}", "2"),
        (r"2\sqrt{2}", r"\sqrt{2}"),
        (r"\sqrt{3}", r"\sqrt{2}"),
        // left side too long for an `x=` prefix
        ("abc=5", "5"),
        ("y=2x+1", "1"),
        // percent signs are dropped, not applied
        ("50%", "0.5"),
        // numbers differ
        ("1,000", "100"),
        ("0.333", r"\frac13"),
        ("-5", "5"),
        ("1/0", "0"),
        // empty or missing answers
        ("", ""),
        ("", "5"),
        ("   ", "5"),
        (r"\text{}", ""),
        // symbolic beyond radicals (sympy in the cookbook; unsupported here)
        ("x+1", "1+x"),
        // formatting does not hide a different value; empty wrappers stay empty
        (r"\mathbf{6}", "5"),
        (r"\(\)", ""),
        (r"\mathbf{}", ""),
        (r"\mathbf{5", "5"),
    ];
    for &(given, truth) in no {
        assert!(
            !answers_equivalent(given, truth),
            "{given:?} should not equal {truth:?}"
        );
    }
}

#[test]
fn strings_and_tuples() {
    assert!(answers_equivalent("A", "a"));
    assert!(answers_equivalent(r"\text{Monday}", "monday"));
    assert!(answers_equivalent(r"\sqrt3", r"\sqrt{3}"));
    assert!(answers_equivalent(r"\frac{\pi}2", r"\frac{\pi}{2}"));
    assert!(!answers_equivalent("Tuesday", "Monday"));
    // tuples compared element-wise, numerically
    assert!(answers_equivalent("(1, 2)", "(1,2)"));
    assert!(answers_equivalent("(0.5, 2)", r"(\frac{1}{2}, 2.0)"));
    assert!(answers_equivalent("[1,3)", "[1, 3)"));
    assert!(answers_equivalent("(5)", "5"));
    assert!(!answers_equivalent("(1,2)", "[1,2]"));
    assert!(!answers_equivalent("(1,2)", "(1,2,3)"));
    assert!(!answers_equivalent("(1,2)", "(2,1)"));
    assert!(!answers_equivalent("1,2", "(1,2)"));
}

#[test]
fn huge_numbers_fall_back_to_strings() {
    let big = "9".repeat(50);
    assert!(answers_equivalent(&big, &big));
    assert!(!answers_equivalent(&big, &"9".repeat(49)));
    assert!(!answers_equivalent("1e400", "1e401"));
}

// ------------------------------------------------------------------------------------------
// Reward modes
// ------------------------------------------------------------------------------------------

fn components(r: &Reward) -> (f64, f64) {
    (r.components["correct"], r.components["format"])
}

#[test]
fn format_aware_rewards() {
    use ParseTermination::*;
    let g = BoxedAnswer::format_aware();
    assert_eq!(g.format_coef(), 0.1);
    // (text, termination, total, correct, format)
    let rows: &[(&str, ParseTermination, f64, f64, f64)] = &[
        // correct and well formatted
        (r"2+2 is \boxed{4}", StopSequence, 1.0, 1.0, 1.0),
        (r"\boxed{4.0}", StopSequence, 1.0, 1.0, 1.0),
        // correct, bad format: EOS is not well formed by default; nor is truncation
        (r"2+2 is \boxed{4}", Eos, 0.9, 1.0, 0.0),
        (r"2+2 is \boxed{4} and", Malformed, 0.9, 1.0, 0.0),
        // wrong, well formatted
        (r"\boxed{5}", StopSequence, 0.0, 0.0, 1.0),
        (r"\boxed{}", StopSequence, 0.0, 0.0, 1.0),
        // wrong and bad format
        (r"\boxed{5}", Malformed, -0.1, 0.0, 0.0),
        // no box: format 0 whatever the termination, and never correct
        ("4", StopSequence, -0.1, 0.0, 0.0),
        ("4", Eos, -0.1, 0.0, 0.0),
    ];
    for &(text, term, total, correct, format) in rows {
        let r = g.score("4", text, term);
        assert!(
            (r.total - total).abs() < 1e-12,
            "{text:?} {term:?}: total {} != {total}",
            r.total
        );
        assert_eq!(components(&r), (correct, format), "{text:?} {term:?}");
        assert_eq!(r.components.len(), 2);
    }
}

#[test]
fn format_options() {
    let g = BoxedAnswer::format_aware().require_stop_sequence(false);
    let r = g.score("4", r"\boxed{4}", ParseTermination::Eos);
    assert_eq!((r.total, components(&r)), (1.0, (1.0, 1.0)));
    let r = g.score("4", r"\boxed{4}", ParseTermination::Malformed);
    assert!((r.total - 0.9).abs() < 1e-12);

    let g = BoxedAnswer::format_aware().with_format_coef(0.5);
    let r = g.score("4", r"\boxed{3}", ParseTermination::Malformed);
    assert!((r.total + 0.5).abs() < 1e-12);
    let r = g.score("4", r"\boxed{4}", ParseTermination::Eos);
    assert!((r.total - 0.5).abs() < 1e-12);
}

#[test]
fn correctness_rewards_are_plain_one_or_zero() {
    use ParseTermination::*;
    let g = BoxedAnswer::correctness();
    let rows: &[(&str, ParseTermination, f64, f64, f64)] = &[
        (r"\boxed{1,000}", StopSequence, 1.0, 1.0, 1.0),
        (r"\boxed{1000}", Eos, 1.0, 1.0, 0.0),
        (r"\boxed{1000} and", Malformed, 1.0, 1.0, 0.0),
        (r"\boxed{999}", StopSequence, 0.0, 0.0, 1.0),
        ("1000", StopSequence, 0.0, 0.0, 0.0),
        ("1000", Malformed, 0.0, 0.0, 0.0),
    ];
    for &(text, term, total, correct, format) in rows {
        let r = g.score("1000", text, term);
        assert_eq!(r.total, total, "{text:?} {term:?}");
        assert_eq!(components(&r), (correct, format), "{text:?} {term:?}");
    }
}

fn response(text: &str, termination: ParseTermination) -> Response {
    Response {
        text: text.to_string(),
        termination,
        tokens: vec![],
    }
}

#[tokio::test]
async fn boxed_answer_is_a_reward_fn() {
    let problem = Problem::new("gsm8k/test/0", "What is 2+2?", "4");
    let grader = BoxedAnswer::format_aware();
    let r = grader
        .grade(
            &problem,
            &response(r"So \boxed{4}", ParseTermination::StopSequence),
        )
        .await
        .unwrap();
    assert_eq!(r.total, 1.0);
    assert_eq!(components(&r), (1.0, 1.0));
    // Also usable as a trait object.
    let dynamic: Arc<dyn RewardFn> = Arc::new(BoxedAnswer::correctness());
    let r = dynamic
        .grade(&problem, &response(r"\boxed{5}", ParseTermination::Eos))
        .await
        .unwrap();
    assert_eq!(r.total, 0.0);
}

#[tokio::test]
async fn closures_are_reward_fns() {
    let problem = Problem::new("p", "What is 2+2?", "4");
    let exact = |p: &Problem, text: &str| if text.trim() == p.answer { 1.0 } else { 0.0 };
    let r = exact
        .grade(&problem, &response(" 4 ", ParseTermination::StopSequence))
        .await
        .unwrap();
    assert_eq!(r, Reward::new(1.0));
    assert!(r.components.is_empty());
    let r = exact
        .grade(&problem, &response("5", ParseTermination::StopSequence))
        .await
        .unwrap();
    assert_eq!(r.total, 0.0);
    // A closure built on the public helpers.
    let boxed_closure = |p: &Problem, text: &str| {
        extract_boxed(text).map_or(0.0, |a| {
            f64::from(u8::from(answers_equivalent(&a, &p.answer)))
        })
    };
    let r = boxed_closure
        .grade(&problem, &response(r"\boxed{4.0}", ParseTermination::Eos))
        .await
        .unwrap();
    assert_eq!(r.total, 1.0);
}

// ------------------------------------------------------------------------------------------
// Grading with a timeout
// ------------------------------------------------------------------------------------------

/// Guards every timeout test: a test that hangs fails instead.
async fn within<T>(fut: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(60), fut)
        .await
        .expect("test took over 60 s: grade_with_timeout did not stop waiting")
}

fn two_plus_two() -> Arc<Problem> {
    Arc::new(Problem::new("p", "What is 2+2?", "4"))
}

struct AsyncFailing;

#[async_trait]
impl RewardFn for AsyncFailing {
    async fn grade(&self, _: &Problem, _: &Response) -> Result<Reward, RewardError> {
        tokio::task::yield_now().await;
        Err(RewardError::Failed("judge unavailable".into()))
    }
}

/// An async reward that uses the runtime's timer.
struct AsyncSleeping(Duration);

#[async_trait]
impl RewardFn for AsyncSleeping {
    async fn grade(&self, _: &Problem, response: &Response) -> Result<Reward, RewardError> {
        tokio::time::sleep(self.0).await;
        Ok(Reward::new(response.text.len() as f64))
    }
}

// The current-thread runtime is the strict case: a blocking reward run on the runtime's
// own thread would keep the timeout from ever firing.
#[tokio::test(flavor = "current_thread")]
async fn sleeping_closure_times_out() {
    let sleepy = |_: &Problem, _: &str| -> f64 {
        std::thread::sleep(Duration::from_secs(10));
        1.0
    };
    let result = within(grade_with_timeout(
        Arc::new(sleepy),
        two_plus_two(),
        response("4", ParseTermination::StopSequence),
        Duration::from_millis(100),
    ))
    .await;
    assert_eq!(
        result,
        Err(RewardError::Timeout(Duration::from_millis(100)))
    );
}

#[tokio::test(flavor = "current_thread")]
async fn endless_loop_times_out_and_the_runtime_keeps_running() {
    static SPINS: AtomicUsize = AtomicUsize::new(0);
    static STOP: AtomicUsize = AtomicUsize::new(0);
    // Loops until told to stop (so the test does not leave a core spinning).
    let endless = |_: &Problem, _: &str| -> f64 {
        while STOP.load(Ordering::Relaxed) == 0 {
            SPINS.fetch_add(1, Ordering::Relaxed);
            std::thread::sleep(Duration::from_millis(1));
        }
        1.0
    };
    let ticker = tokio::spawn(async {
        for _ in 0..3 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        "ticked"
    });
    let result = within(grade_with_timeout(
        Arc::new(endless),
        two_plus_two(),
        response("4", ParseTermination::StopSequence),
        Duration::from_millis(100),
    ))
    .await;
    STOP.store(1, Ordering::Relaxed);
    assert!(matches!(result, Err(RewardError::Timeout(_))), "{result:?}");
    assert!(
        SPINS.load(Ordering::Relaxed) > 0,
        "the reward was never run"
    );
    assert_eq!(within(ticker).await.unwrap(), "ticked");
}

#[tokio::test]
async fn panicking_closure_is_reported() {
    let panicky = |_: &Problem, text: &str| -> f64 { panic!("grader exploded on {text:?}") };
    let result = within(grade_with_timeout(
        Arc::new(panicky),
        two_plus_two(),
        response("4", ParseTermination::StopSequence),
        Duration::from_secs(30),
    ))
    .await;
    assert_eq!(
        result,
        Err(RewardError::Panicked(r#"grader exploded on "4""#.into()))
    );
    let static_msg = |_: &Problem, _: &str| -> f64 { panic!("static message") };
    let result = within(grade_with_timeout(
        Arc::new(static_msg),
        two_plus_two(),
        response("4", ParseTermination::StopSequence),
        Duration::from_secs(30),
    ))
    .await;
    assert_eq!(result, Err(RewardError::Panicked("static message".into())));
}

#[tokio::test]
async fn async_reward_errors_and_successes_pass_through() {
    let result = within(grade_with_timeout(
        Arc::new(AsyncFailing),
        two_plus_two(),
        response("4", ParseTermination::StopSequence),
        Duration::from_secs(30),
    ))
    .await;
    assert_eq!(result, Err(RewardError::Failed("judge unavailable".into())));

    let result = within(grade_with_timeout(
        Arc::new(BoxedAnswer::format_aware()),
        two_plus_two(),
        response(r"\boxed{4}", ParseTermination::StopSequence),
        Duration::from_secs(30),
    ))
    .await;
    assert_eq!(result.map(|r| r.total), Ok(1.0));
}

#[tokio::test(flavor = "current_thread")]
async fn async_rewards_can_use_timers_on_a_current_thread_runtime() {
    let result = within(grade_with_timeout(
        Arc::new(AsyncSleeping(Duration::from_millis(5))),
        two_plus_two(),
        response("four", ParseTermination::StopSequence),
        Duration::from_secs(30),
    ))
    .await;
    assert_eq!(result, Ok(Reward::new(4.0)));
    let dynamic: Arc<dyn RewardFn> = Arc::new(AsyncSleeping(Duration::from_secs(30)));
    let result = within(grade_with_timeout(
        dynamic,
        two_plus_two(),
        response("four", ParseTermination::StopSequence),
        Duration::from_millis(50),
    ))
    .await;
    assert_eq!(result, Err(RewardError::Timeout(Duration::from_millis(50))));
}

#[test]
fn a_hung_grader_does_not_block_runtime_shutdown() {
    static RELEASE: AtomicUsize = AtomicUsize::new(0);
    // Blocks until released: with `spawn_blocking`, dropping the runtime would wait for it.
    let hung = |_: &Problem, _: &str| -> f64 {
        while RELEASE.load(Ordering::Relaxed) == 0 {
            std::thread::sleep(Duration::from_millis(5));
        }
        1.0
    };
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let result = runtime.block_on(grade_with_timeout(
            Arc::new(hung),
            two_plus_two(),
            response("4", ParseTermination::StopSequence),
            Duration::from_millis(50),
        ));
        drop(runtime);
        done_tx.send(result).unwrap();
    });
    let outcome = done_rx.recv_timeout(Duration::from_secs(60));
    RELEASE.store(1, Ordering::Relaxed);
    let result = outcome.expect("dropping the runtime waited for the hung grader");
    assert!(matches!(result, Err(RewardError::Timeout(_))), "{result:?}");
}

#[test]
fn outside_a_runtime_is_an_error_not_a_panic() {
    let result = futures::executor::block_on(grade_with_timeout(
        Arc::new(BoxedAnswer::correctness()),
        two_plus_two(),
        response(r"\boxed{4}", ParseTermination::StopSequence),
        Duration::from_secs(1),
    ));
    assert!(
        matches!(&result, Err(RewardError::Failed(m)) if m.contains("Tokio runtime")),
        "{result:?}"
    );
}

#[test]
fn grade_stats_count_each_outcome() {
    let mut stats = GradeStats::default();
    assert_eq!(stats.error_rate(), 0.0);
    stats.record(&Ok(Reward::new(1.0)));
    stats.record(&Ok(Reward::new(0.0)));
    stats.record(&Err(RewardError::Failed("x".into())));
    stats.record(&Err(RewardError::Timeout(Duration::from_secs(1))));
    stats.record(&Err(RewardError::Panicked("p".into())));
    assert_eq!(
        stats,
        GradeStats {
            ok: 2,
            failed: 1,
            timed_out: 1,
            panicked: 1
        }
    );
    assert_eq!((stats.total(), stats.errors()), (5, 3));
    assert!((stats.error_rate() - 0.6).abs() < 1e-12);
    let mut sum = GradeStats::default();
    sum.merge(&stats);
    sum.merge(&stats);
    assert_eq!((sum.ok, sum.total()), (4, 10));
}

/// DAPO's soft overlong punishment: 0 up to `L_max − L_cache` tokens, then a line down to −1
/// at `L_max` (eq. 13 of the DAPO paper), −1 beyond; added to the inner reward's total and
/// reported as `overlong_penalty`; the inner reward's errors pass through.
#[tokio::test]
async fn overlong_penalty_follows_dapo() {
    use rlvr::reward::OverlongPenalty;
    let exact = |p: &Problem, t: &str| if t == p.answer { 1.0 } else { 0.0 };
    let r = OverlongPenalty::new(exact, 16, 4).unwrap();
    let problem = Problem::new("p", "q", "4");
    // (tokens, penalty): L_max 16, L_cache 4, so the ramp is over 13..=16.
    for (n, want) in [
        (0, 0.0),
        (12, 0.0),
        (13, -0.25),
        (14, -0.5),
        (16, -1.0),
        (40, -1.0),
    ] {
        let mut resp = response("4", ParseTermination::StopSequence);
        resp.tokens = vec![7; n];
        let got = r.grade(&problem, &resp).await.unwrap();
        assert_eq!(got.components["overlong_penalty"], want, "{n} tokens");
        assert_eq!(got.total, 1.0 + want, "{n} tokens");
    }
    let half = OverlongPenalty::new(exact, 16, 4)
        .unwrap()
        .with_factor(0.5)
        .unwrap();
    assert_eq!(half.penalty(14), -0.25);
    assert!(OverlongPenalty::new(exact, 16, 0).is_err());
    assert!(OverlongPenalty::new(exact, 16, 17).is_err());
    assert!(
        OverlongPenalty::new(exact, 16, 4)
            .unwrap()
            .with_factor(-1.0)
            .is_err()
    );
    struct Failing;
    #[async_trait::async_trait]
    impl RewardFn for Failing {
        async fn grade(&self, _: &Problem, _: &Response) -> Result<Reward, RewardError> {
            Err(RewardError::Failed("judge down".into()))
        }
    }
    let e = OverlongPenalty::new(Failing, 16, 4)
        .unwrap()
        .grade(&problem, &response("4", ParseTermination::StopSequence))
        .await;
    assert_eq!(e, Err(RewardError::Failed("judge down".into())));
}
