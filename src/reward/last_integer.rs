//! The reward of the cookbook's `arithmetic` environment: the last integer of the response
//! against the reference answer ([`LastInteger`], [`extract_last_integer`]).

use std::sync::LazyLock;

use async_trait::async_trait;
use regex::Regex;

use crate::dataset::Problem;
use crate::renderer::ParseTermination;
use crate::reward::boxed::{problem_env_reward, well_formed};
use crate::reward::{Response, Reward, RewardError, RewardFn};

/// Python's `-?\d+` on a `str`: `\d` is any Unicode decimal digit (category Nd), as in the
/// `regex` crate.
static INTEGER: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"-?\d+").expect("static regex is valid"));

/// One Unicode decimal digit (category Nd).
static DECIMAL_DIGIT: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^\d$").expect("static regex is valid"));

/// Python's `int()` refuses longer digit strings (`sys.get_int_max_str_digits()`).
const MAX_DIGITS: usize = 4300;

/// The last integer of `text`, as the cookbook's arithmetic environment reads it: every `,` is
/// removed, then the last match of `-?\d+` is the answer. The value comes back in canonical
/// form — ASCII digits, no leading zeros, `-` only before a nonzero value — so `"-007"` gives
/// `"-7"` and `"-0"` gives `"0"`.
///
/// Digits are Unicode decimal digits, as for Python's `\d` and `int()` (`"٤٢"` is 42). A match
/// of more than 4,300 digits gives `None` (Python's `int()` raises on it).
///
/// ```
/// use rlvr::reward::extract_last_integer;
///
/// assert_eq!(extract_last_integer("4 + 5 = 9").as_deref(), Some("9"));
/// assert_eq!(extract_last_integer("It is 1,234.").as_deref(), Some("1234"));
/// assert_eq!(extract_last_integer("-012 then x-3").as_deref(), Some("-3"));
/// assert_eq!(extract_last_integer("no digits"), None);
/// ```
pub fn extract_last_integer(text: &str) -> Option<String> {
    let without_commas = text.replace(',', "");
    let found = INTEGER.find_iter(&without_commas).last()?;
    canonical(found.as_str())
}

/// A reference answer as an integer in canonical form: the whole text (surrounding
/// whitespace aside) must be one `-?\d+`.
fn reference_integer(truth: &str) -> Option<String> {
    let trimmed = truth.trim();
    let m = INTEGER.find(trimmed)?;
    (m.start() == 0 && m.end() == trimmed.len())
        .then(|| canonical(trimmed))
        .flatten()
}

/// A match of `-?\d+` in canonical form (`None` beyond [`MAX_DIGITS`] digits).
fn canonical(integer: &str) -> Option<String> {
    let (negative, digits) = match integer.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, integer),
    };
    if digits.chars().count() > MAX_DIGITS {
        return None;
    }
    let mut value = String::with_capacity(digits.len() + 1);
    for c in digits.chars() {
        let d = digit_value(c)?;
        if value.is_empty() && d == 0 {
            continue;
        }
        value.push(char::from(b'0' + d));
    }
    if value.is_empty() {
        return Some("0".to_string());
    }
    if negative {
        value.insert(0, '-');
    }
    Some(value)
}

/// The value of a Unicode decimal digit. Unicode encodes every decimal digit in runs of ten,
/// 0 to 9 in order (runs may abut), so the value is the distance from the start of the
/// maximal run of digits that holds `c`, modulo 10.
fn digit_value(c: char) -> Option<u8> {
    if c.is_ascii_digit() {
        return Some(c as u8 - b'0');
    }
    let is_digit = |c: char| DECIMAL_DIGIT.is_match(c.encode_utf8(&mut [0u8; 4]));
    if !is_digit(c) {
        return None;
    }
    let mut offset = 0u32;
    let mut code = c as u32;
    // The longest run (the mathematical digits, U+1D7CE..U+1D7FF) has 50 digits.
    while offset < 64 {
        let Some(prev) = code.checked_sub(1).and_then(char::from_u32) else {
            break;
        };
        if !is_digit(prev) {
            break;
        }
        offset += 1;
        code -= 1;
    }
    u8::try_from(offset % 10).ok()
}

/// How [`LastInteger`] turns `correct` and `format` into the total.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scoring {
    Correctness,
    FormatAware,
}

/// The reward of the cookbook's `ArithmeticEnv` (paired with
/// [`AdditionProblems`](crate::dataset::AdditionProblems)): the response is right when its last
/// integer ([`extract_last_integer`]) equals [`Problem::answer`] as an integer.
///
/// Components, each 0 or 1:
/// - `correct`: the last integer equals the reference answer (`"-0"` equals `"0"`, leading
///   zeros do not matter; a reference that is not an integer is never matched);
/// - `format`: the response is well formed — it ended with the renderer's stop sequence
///   ([`ParseTermination::StopSequence`], or any clean end with
///   [`require_stop_sequence(false)`](Self::require_stop_sequence)). The environment's
///   `check_format` accepts any text, so only the ending counts.
///
/// The total: [`format_aware`](Self::format_aware) (the default, `ProblemEnv`'s reward)
/// `format_coef · (format − 1) + correct` with `format_coef = 0.1`, so 1.0 / 0.9 / 0.0 / −0.1;
/// [`correctness`](Self::correctness) `correct` alone.
///
/// ```
/// use rlvr::renderer::ParseTermination;
/// use rlvr::reward::LastInteger;
///
/// let grader = LastInteger::default();
/// assert_eq!(grader.score("91", "44 + 47 = 91", ParseTermination::StopSequence).total, 1.0);
/// assert_eq!(grader.score("91", "91, no: 90", ParseTermination::StopSequence).total, 0.0);
/// let truncated = grader.score("91", "It is 91", ParseTermination::Malformed);
/// assert!((truncated.total - 0.9).abs() < 1e-12);
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LastInteger {
    scoring: Scoring,
    format_coef: f64,
    require_stop_sequence: bool,
}

impl Default for LastInteger {
    fn default() -> Self {
        Self::format_aware()
    }
}

impl LastInteger {
    /// `ProblemEnv`'s reward: 1.0 / 0.9 / 0.0 / −0.1 (see the type docs).
    pub fn format_aware() -> Self {
        LastInteger {
            scoring: Scoring::FormatAware,
            format_coef: 0.1,
            require_stop_sequence: true,
        }
    }

    /// Plain correctness: 1 when the last integer is right, else 0 (`format` still reported).
    pub fn correctness() -> Self {
        LastInteger {
            scoring: Scoring::Correctness,
            ..Self::format_aware()
        }
    }

    /// Sets the format coefficient (default 0.1; used only by
    /// [`format_aware`](Self::format_aware)).
    pub fn with_format_coef(mut self, format_coef: f64) -> Self {
        self.format_coef = format_coef;
        self
    }

    /// Whether only a stop-sequence ending is well formed (default `true`); with `false`, an
    /// EOS ending is well formed too.
    pub fn require_stop_sequence(mut self, required: bool) -> Self {
        self.require_stop_sequence = required;
        self
    }

    /// Grades `text` (the parsed response) that ended with `termination` against the reference
    /// answer `truth`.
    pub fn score(&self, truth: &str, text: &str, termination: ParseTermination) -> Reward {
        let correct = match (reference_integer(truth), extract_last_integer(text)) {
            (Some(t), Some(g)) => t == g,
            _ => false,
        };
        problem_env_reward(
            correct,
            well_formed(termination, self.require_stop_sequence),
            self.format_coef,
            self.scoring == Scoring::FormatAware,
        )
    }

    /// The format coefficient.
    pub fn format_coef(&self) -> f64 {
        self.format_coef
    }
}

#[async_trait]
impl RewardFn for LastInteger {
    async fn grade(&self, problem: &Problem, response: &Response) -> Result<Reward, RewardError> {
        Ok(self.score(&problem.answer, &response.text, response.termination))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_semantics() {
        let last = |t: &str| extract_last_integer(t);
        assert_eq!(last("1,000,000").as_deref(), Some("1000000"));
        assert_eq!(last("--5").as_deref(), Some("-5"));
        assert_eq!(last("a-0").as_deref(), Some("0"));
        assert_eq!(last("000").as_deref(), Some("0"));
        assert_eq!(last("3.5").as_deref(), Some("5"));
        assert_eq!(last("x = 1e3").as_deref(), Some("3"));
        // Unicode decimal digits: Arabic-Indic, fullwidth, mathematical double-struck.
        assert_eq!(last("\u{664}\u{662}").as_deref(), Some("42"));
        assert_eq!(last("\u{ff19}\u{ff11}").as_deref(), Some("91"));
        assert_eq!(last("\u{1d7e1}\u{1d7d9}").as_deref(), Some("91"));
        // Superscripts and other numerics are not decimal digits.
        assert_eq!(last("x\u{b2}"), None);
        assert_eq!(
            last(&"7".repeat(MAX_DIGITS)).map(|s| s.len()),
            Some(MAX_DIGITS)
        );
        assert_eq!(last(&"7".repeat(MAX_DIGITS + 1)), None);
    }

    #[test]
    fn scores() {
        let g = LastInteger::default();
        let s = |truth: &str, text: &str| g.score(truth, text, ParseTermination::StopSequence);
        assert_eq!(s("91", "The answer is 0091").total, 1.0);
        assert_eq!(s("0", "-0").total, 1.0);
        assert_eq!(s("91", "").total, 0.0);
        assert_eq!(s("x", "x").total, 0.0);
        assert_eq!(s("9 1", "1").total, 0.0);
        let eos = g.score("5", "5", ParseTermination::Eos);
        assert_eq!(eos.components["format"], 0.0);
        let eos = g
            .require_stop_sequence(false)
            .score("5", "5", ParseTermination::Eos);
        assert_eq!(eos.total, 1.0);
        let plain = LastInteger::correctness().score("5", "5", ParseTermination::Malformed);
        assert_eq!(plain.total, 1.0);
        assert_eq!(plain.components["format"], 0.0);
    }
}
