//! The competition-math grader: LaTeX answers compared as mathematics, in three modes.
//!
//! [`grade_math_answer`] takes the content of the response's last `\boxed{}` and the
//! reference answer and says whether they are equivalent, by the rules of a
//! [`MathGrader`]:
//!
//! - [`MathGrader::Sympy`] — the cookbook's `grade_answer` (its default `"sympy"` grader):
//!   the MATH normalisation of strings first, then element-wise comparison of tuples and
//!   intervals, with exact rules for integers and fractions, and "the difference simplifies
//!   to zero" for the rest.
//! - [`MathGrader::MathVerify`] — the cookbook's `grade_answer_math_verify` (Hugging Face
//!   `math-verify`): the answer parsed from LaTeX into an expression, a set, an interval, a
//!   relation or a matrix, then compared as such.
//! - [`MathGrader::Best`] (the default) — ours: every rewriting that is mathematically right
//!   is accepted, every wrong answer rejected.
//!
//! No Python and no computer-algebra system run here: answers are parsed into a small
//! expression tree, compared exactly (rationals, radicals) where possible and by evaluation
//! at several points otherwise. Every step is bounded, so any input, however large or deeply
//! nested, gets a verdict within milliseconds. `docs/grading.md` measures the agreement of
//! each mode with the Python references, and what each accepts.
//!
//! [`MathAnswer`] is the [`RewardFn`] on top: the cookbook `MathEnv` reward.
//!
//! ```
//! use rlvr::reward::{grade_math_answer, MathGrader};
//!
//! assert!(grade_math_answer(r"\pi/3", r"\frac{\pi}{3}", MathGrader::Best));
//! assert!(grade_math_answer("1+x", "x+1", MathGrader::Best));
//! assert!(!grade_math_answer("3.14", r"\pi", MathGrader::Best));
//! ```

use std::fmt;
use std::str::FromStr;
use std::time::{Duration, Instant};

use async_trait::async_trait;

use crate::dataset::Problem;
use crate::error::{Error, Result};
use crate::renderer::ParseTermination;
use crate::reward::boxed::{extract_boxed, problem_env_reward, well_formed};
use crate::reward::{Response, Reward, RewardError, RewardFn};

mod best;
mod expr;
mod latex;
mod math_verify;
mod pytext;
mod sympy;

/// Which rules decide whether two math answers are equivalent.
///
/// ```
/// use rlvr::reward::MathGrader;
///
/// assert_eq!("math_verify".parse::<MathGrader>().unwrap(), MathGrader::MathVerify);
/// assert_eq!(MathGrader::default(), MathGrader::Best);
/// assert_eq!(MathGrader::Sympy.to_string(), "sympy");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum MathGrader {
    /// The cookbook's `grade_answer` (`grader="sympy"`, the `MathEnv` default).
    Sympy,
    /// The cookbook's `grade_answer_math_verify` (`grader="math_verify"`).
    MathVerify,
    /// rlvr's own grader: what is mathematically right, whatever its notation.
    #[default]
    Best,
}

impl MathGrader {
    /// Every mode, in declaration order.
    pub const ALL: [MathGrader; 3] = [MathGrader::Sympy, MathGrader::MathVerify, MathGrader::Best];

    /// The mode's name: `sympy`, `math_verify` (the cookbook's names) or `best`.
    pub fn as_str(self) -> &'static str {
        match self {
            MathGrader::Sympy => "sympy",
            MathGrader::MathVerify => "math_verify",
            MathGrader::Best => "best",
        }
    }
}

impl fmt::Display for MathGrader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for MathGrader {
    type Err = Error;

    /// Parses `sympy`, `math_verify` (or `math-verify`) or `best`.
    fn from_str(name: &str) -> Result<Self> {
        match name {
            "sympy" => Ok(MathGrader::Sympy),
            "math_verify" | "math-verify" => Ok(MathGrader::MathVerify),
            "best" => Ok(MathGrader::Best),
            other => Err(Error::config(
                "grader",
                format!("unknown math grader `{other}` (expected best, sympy or math_verify)"),
            )),
        }
    }
}

/// Whether `given` (the content of a response's last `\boxed{}`) is equivalent to
/// `ground_truth` by the rules of `grader`.
///
/// Never panics, whatever the input; every call returns within milliseconds (inputs too
/// large or too deep to decide are "not equivalent").
///
/// ```
/// use rlvr::reward::{grade_math_answer, MathGrader};
///
/// // The cookbook's grader keeps unreduced fractions apart on purpose; ours does not.
/// assert!(!grade_math_answer(r"\frac{2}{4}", r"\frac{1}{2}", MathGrader::Sympy));
/// assert!(grade_math_answer(r"\frac{2}{4}", r"\frac{1}{2}", MathGrader::Best));
/// assert!(grade_math_answer(r"(3,\infty)\cup(-\infty,-2)", r"(-\infty,-2)\cup(3,\infty)", MathGrader::Best));
/// ```
pub fn grade_math_answer(given: &str, ground_truth: &str, grader: MathGrader) -> bool {
    match grader {
        MathGrader::Sympy => sympy::grade_sympy(given, ground_truth),
        MathGrader::MathVerify => math_verify::grade_math_verify(given, ground_truth),
        MathGrader::Best => best::best_equal(given, ground_truth),
    }
}

/// Grades competition-math responses: the last `\boxed{…}` against [`Problem::answer`] with
/// a [`MathGrader`], scored as the cookbook's `MathEnv`.
///
/// Every grade reports two components, each 0 or 1:
/// - `correct`: a box was found ([`extract_boxed`](crate::reward::extract_boxed)) and
///   [`grade_math_answer`] accepts its content (graded even when the response was
///   truncated);
/// - `format`: the response is well formed and a box was found. Well formed means it ended
///   with the renderer's stop sequence (the cookbook's `require_stop_sequence_for_format=True`),
///   or with [`require_stop_sequence(false)`](Self::require_stop_sequence) any clean ending.
///
/// The total is `format_coef · (format − 1) + correct` (`format_coef` 0.1 by default):
/// 1.0, 0.9, 0.0 or −0.1. A grade that outlives the timeout (1 s by default, as the
/// cookbook's `safe_grade`) counts as wrong, as in the cookbook.
///
/// ```
/// use rlvr::renderer::ParseTermination;
/// use rlvr::reward::{MathAnswer, MathGrader};
///
/// let reward = MathAnswer::default();
/// assert_eq!(reward.grader(), MathGrader::Best);
/// let r = reward.score(r"\frac{\pi}{3}", r"So \boxed{\pi/3}", ParseTermination::StopSequence);
/// assert_eq!(r.total, 1.0);
/// let r = reward.score("7", r"So \boxed{8}", ParseTermination::Eos);
/// assert!((r.total + 0.1).abs() < 1e-12);
/// assert_eq!((r.components["correct"], r.components["format"]), (0.0, 0.0));
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MathAnswer {
    grader: MathGrader,
    format_coef: f64,
    require_stop_sequence: bool,
    timeout: Duration,
}

impl Default for MathAnswer {
    /// [`MathGrader::Best`], `format_coef` 0.1, stop sequence required, 1 s timeout.
    fn default() -> Self {
        MathAnswer::new(MathGrader::Best)
    }
}

impl MathAnswer {
    /// The `MathEnv` reward with `grader` and the cookbook's defaults (`format_coef` 0.1,
    /// stop sequence required, 1 s timeout).
    pub fn new(grader: MathGrader) -> Self {
        MathAnswer {
            grader,
            format_coef: 0.1,
            require_stop_sequence: true,
            timeout: Duration::from_secs(1),
        }
    }

    /// The same reward with another grader.
    pub fn with_grader(mut self, grader: MathGrader) -> Self {
        self.grader = grader;
        self
    }

    /// Sets the format coefficient (default 0.1; 0 scores correctness alone).
    pub fn with_format_coef(mut self, format_coef: f64) -> Self {
        self.format_coef = format_coef;
        self
    }

    /// Whether only a stop-sequence ending is well formed (default `true`); with `false`,
    /// an EOS ending is well formed too.
    pub fn require_stop_sequence(mut self, required: bool) -> Self {
        self.require_stop_sequence = required;
        self
    }

    /// Sets the time one answer may take to grade (default 1 s); past it the answer counts
    /// as wrong.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The grader.
    pub fn grader(&self) -> MathGrader {
        self.grader
    }

    /// The format coefficient.
    pub fn format_coef(&self) -> f64 {
        self.format_coef
    }

    /// The grading timeout.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Grades `text` (the parsed response content) that ended with `termination` against
    /// the reference answer `truth`. Synchronous and infallible; [`RewardFn::grade`] calls
    /// it.
    pub fn score(&self, truth: &str, text: &str, termination: ParseTermination) -> Reward {
        let boxed = extract_boxed(text);
        let correct = boxed.as_deref().is_some_and(|given| {
            // Grading is bounded (milliseconds at worst), so the timeout is checked after
            // the fact: a verdict that came too late is discarded, as the cookbook's
            // `safe_grade` discards one that its thread delivers after the timeout.
            let start = Instant::now();
            let verdict = grade_math_answer(given, truth, self.grader);
            if start.elapsed() > self.timeout {
                tracing::warn!(
                    "timeout grading {given:?} against {truth:?} ({} grader, {:?})",
                    self.grader,
                    self.timeout
                );
                return false;
            }
            verdict
        });
        let format = well_formed(termination, self.require_stop_sequence) && boxed.is_some();
        problem_env_reward(correct, format, self.format_coef, true)
    }
}

#[async_trait]
impl RewardFn for MathAnswer {
    async fn grade(
        &self,
        problem: &Problem,
        response: &Response,
    ) -> std::result::Result<Reward, RewardError> {
        Ok(self.score(&problem.answer, &response.text, response.termination))
    }
}
