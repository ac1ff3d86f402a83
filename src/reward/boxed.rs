//! The `\boxed{…}` math grader: answer extraction, answer equivalence and the
//! [`BoxedAnswer`] reward function.
//!
//! This follows the tinker-cookbook math environments (`extract_boxed`, `grade_answer` with
//! the default `"sympy"` grader, and `ProblemEnv`'s reward formula) for the answers that
//! grade-school math produces: integers, decimals, fractions, percentages, money, simple
//! units, tuples and short strings. Numbers are compared with exact rational arithmetic.
//! Of the symbolic equivalence that the cookbook delegates to sympy, only integer multiples
//! of square roots are handled (`2\sqrt{2}` == `\sqrt{8}`); other expressions
//! (`\pi/2` vs `\frac{\pi}{2}`, `x+1` vs `1+x`) are equal only when their normalised strings
//! are. `tests/it/grader_agreement.rs` measures the agreement with the cookbook on a generated
//! set of GSM8K responses; `docs/reliability.md` lists the remaining differences.

use std::sync::LazyLock;

use async_trait::async_trait;
use regex::Regex;

use crate::dataset::Problem;
use crate::renderer::ParseTermination;
use crate::reward::{Response, Reward, RewardError, RewardFn};

// ---------------------------------------------------------------------------------------------
// Extraction
// ---------------------------------------------------------------------------------------------

static BOXED_NO_BRACES: LazyLock<Regex> = LazyLock::new(|| {
    // The cookbook's fallback pattern, verbatim.
    Regex::new(r"\\boxed\s+([a-zA-Z0-9]+)").expect("static regex is valid")
});

/// The content of the last `\boxed{…}` in `text`.
///
/// Rules (the cookbook's `extract_boxed`):
/// - Braces are matched with a stack, so nested braces are kept whole:
///   `\boxed{\frac{1}{2}}` → `\frac{1}{2}`, `\boxed{a{b}c}` → `a{b}c`.
/// - A box is recorded when its closing brace is reached, and the **last recorded** box is
///   returned (`\boxed{1} and \boxed{2}` → `2`). For a box nested in a box, the outer one
///   closes last and wins.
/// - The `{` must follow `\boxed` directly; `\fbox` is not recognised.
/// - `\boxed{}` → `Some("")`: a box was written, it is just empty.
/// - Without any braced box, the pattern `\\boxed\s+([a-zA-Z0-9]+)` is tried, so
///   `\boxed 7` → `7`. Where it matches several times the first match is used, as in the
///   cookbook (`re.search`).
/// - Nothing found → `None`.
///
/// **Unbalanced input never panics.** A `}` with no open brace anywhere in the text makes
/// the response unreadable → `None`, even when a box was found before it: `\boxed{5}}`,
/// `}\boxed{5}` and `\boxed{5} }` → `None`. This is the cookbook's verdict (it raises
/// `ValueError("Unmatched }")`, which its rewards score as no answer and a bad format).
/// A `{` that never closes simply never forms a box: `\boxed{5` → `None` (unless the
/// brace-less fallback matches elsewhere).
///
/// ```
/// use rlvr::reward::extract_boxed;
/// assert_eq!(extract_boxed(r"so \boxed{\frac{1}{2}}.").as_deref(), Some(r"\frac{1}{2}"));
/// assert_eq!(extract_boxed(r"\boxed{1} then \boxed{2}").as_deref(), Some("2"));
/// assert_eq!(extract_boxed(r"\boxed 7").as_deref(), Some("7"));
/// assert_eq!(extract_boxed("no box"), None);
/// ```
pub fn extract_boxed(text: &str) -> Option<String> {
    let mut stack: Vec<usize> = Vec::new();
    let mut last: Option<&str> = None;
    // Only the braces matter, and they are ASCII: a vectorised scan for their bytes (each
    // one a char boundary) instead of decoding every char.
    for i in memchr::memchr2_iter(b'{', b'}', text.as_bytes()) {
        match text.as_bytes()[i] {
            b'{' => stack.push(i),
            _ => {
                // A stray `}` makes the whole response unreadable, as in the cookbook
                // (`ValueError("Unmatched }")`): no box, even one found before it.
                let open = stack.pop()?;
                if text[..open].ends_with(r"\boxed") {
                    // `{` and `}` are one byte each, so these are char boundaries.
                    last = Some(&text[open + 1..i]);
                }
            }
        }
    }
    if let Some(content) = last {
        return Some(content.to_string());
    }
    BOXED_NO_BRACES
        .captures(text)
        .and_then(|c| c.get(1))
        .map(|m| m.as_str().to_string())
}

// ---------------------------------------------------------------------------------------------
// Exact rationals
// ---------------------------------------------------------------------------------------------

/// A reduced fraction with a positive denominator. All arithmetic is checked: a number too
/// large for `i128` is simply not treated as a number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Ratio {
    num: i128,
    den: i128,
}

fn gcd(mut a: i128, mut b: i128) -> i128 {
    a = a.abs();
    b = b.abs();
    while b != 0 {
        let t = a % b;
        a = b;
        b = t;
    }
    a
}

impl Ratio {
    fn new(num: i128, den: i128) -> Option<Ratio> {
        if den == 0 {
            return None;
        }
        let g = gcd(num, den).max(1);
        let (mut num, mut den) = (num / g, den / g);
        if den < 0 {
            num = num.checked_neg()?;
            den = den.checked_neg()?;
        }
        Some(Ratio { num, den })
    }
    fn int(n: i128) -> Ratio {
        Ratio { num: n, den: 1 }
    }
    fn is_integer(self) -> bool {
        self.den == 1
    }
    fn neg(self) -> Option<Ratio> {
        Some(Ratio {
            num: self.num.checked_neg()?,
            den: self.den,
        })
    }
    fn add(self, o: Ratio) -> Option<Ratio> {
        let num = self
            .num
            .checked_mul(o.den)?
            .checked_add(o.num.checked_mul(self.den)?)?;
        Ratio::new(num, self.den.checked_mul(o.den)?)
    }
    fn mul(self, o: Ratio) -> Option<Ratio> {
        Ratio::new(self.num.checked_mul(o.num)?, self.den.checked_mul(o.den)?)
    }
    fn div(self, o: Ratio) -> Option<Ratio> {
        if o.num == 0 {
            return None;
        }
        Ratio::new(self.num.checked_mul(o.den)?, self.den.checked_mul(o.num)?)
    }
}

fn pow10(e: u32) -> Option<i128> {
    10i128.checked_pow(e)
}

// ---------------------------------------------------------------------------------------------
// Numbers as written
// ---------------------------------------------------------------------------------------------

/// How a number was written; the cookbook treats the notations differently.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Notation {
    /// Integer, decimal or scientific notation (`5`, `5.0`, `1,000`, `1e3`).
    Decimal,
    /// An integer fraction `a/b` or `\frac{a}{b}`, as written (sign moved to the numerator).
    Fraction { num: i128, den: i128 },
    /// Anything else that has a value: mixed numbers (`7 3/4`), fractions of decimals.
    Other,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Number {
    value: Ratio,
    notation: Notation,
}

impl Number {
    /// The cookbook's `_str_is_int`: written as a decimal and integer-valued (`5`, `5.0`).
    fn is_int_form(&self) -> bool {
        self.notation == Notation::Decimal && self.value.is_integer()
    }
}

static DECIMAL: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"^([0-9]*)(?:\.([0-9]*))?(?:e([+-]?[0-9]+))?$").expect("static regex is valid")
});

/// An unsigned decimal: `12`, `12.50`, `.5`, `17.`, `1e6`, `2.5e-3`.
fn parse_unsigned_decimal(s: &str) -> Option<Ratio> {
    let caps = DECIMAL.captures(s)?;
    let int = caps.get(1).map_or("", |m| m.as_str());
    let frac = caps.get(2).map_or("", |m| m.as_str());
    if int.is_empty() && frac.is_empty() {
        return None;
    }
    let digits = format!("{int}{frac}");
    let mantissa: i128 = if digits.is_empty() {
        0
    } else {
        digits.parse().ok()?
    };
    let mut value = Ratio::new(mantissa, pow10(u32::try_from(frac.len()).ok()?)?)?;
    if let Some(e) = caps.get(3) {
        let e: i32 = e.as_str().parse().ok()?;
        let scale = pow10(e.unsigned_abs())?;
        value = if e >= 0 {
            value.mul(Ratio::int(scale))?
        } else {
            value.div(Ratio::int(scale))?
        };
    }
    Some(value)
}

/// Strips one leading sign (`-`, `+`, or the Unicode minus) and the spaces after it.
fn split_sign(s: &str) -> (bool, &str) {
    let s = s.trim();
    for (prefix, negative) in [("-", true), ("\u{2212}", true), ("+", false)] {
        if let Some(rest) = s.strip_prefix(prefix) {
            return (negative, rest.trim_start());
        }
    }
    (false, s)
}

/// A signed decimal, with its "integer-ness" of notation.
fn parse_signed_decimal(s: &str) -> Option<Ratio> {
    let (neg, rest) = split_sign(s);
    let v = parse_unsigned_decimal(rest)?;
    if neg { v.neg() } else { Some(v) }
}

/// `\frac{A}{B}`, `\frac AB` / `\frac12` (single-character arguments), `\frac{A}B`,
/// `\frac A{B}`. Returns the two arguments.
fn split_latex_frac(s: &str) -> Option<(&str, &str)> {
    let rest = s.strip_prefix(r"\frac")?.trim_start();
    let (a, rest) = take_arg(rest)?;
    let (b, rest) = take_arg(rest.trim_start())?;
    if !rest.trim().is_empty() {
        return None;
    }
    Some((a, b))
}

/// One TeX macro argument: a braced group or a single character.
fn take_arg(s: &str) -> Option<(&str, &str)> {
    if s.starts_with('{') {
        let close = matching_brace(s, 0)?;
        Some((&s[1..close], &s[close + 1..]))
    } else {
        let c = s.chars().next()?;
        if c == '\\' || c == '}' {
            return None;
        }
        Some(s.split_at(c.len_utf8()))
    }
}

/// A fraction `a/b` or `\frac{a}{b}` (no outer sign).
fn parse_fraction(s: &str) -> Option<Number> {
    let (a, b) = if let Some(parts) = split_latex_frac(s) {
        parts
    } else {
        let (a, b) = s.split_once('/')?;
        if b.contains('/') {
            return None;
        }
        (a, b)
    };
    let (a, b) = (a.trim(), b.trim());
    let num = parse_signed_decimal(a)?;
    let den = parse_signed_decimal(b)?;
    let value = num.div(den)?;
    let is_int_text = |t: &str| {
        let (_, digits) = split_sign(t);
        !digits.is_empty() && digits.bytes().all(|c| c.is_ascii_digit())
    };
    let notation = if is_int_text(a) && is_int_text(b) {
        // As written, sign carried by the numerator: `\frac{-1}{2}` == `-1/2`.
        let (mut n, mut d) = (num.num.checked_mul(den.den)?, den.num.checked_mul(num.den)?);
        if d < 0 {
            n = n.checked_neg()?;
            d = d.checked_neg()?;
        }
        Notation::Fraction { num: n, den: d }
    } else {
        Notation::Other
    };
    Some(Number { value, notation })
}

/// A number in any supported notation; `s` is already normalised (lower case, no `$`/`%`).
fn parse_number(s: &str) -> Option<Number> {
    let (neg, rest) = split_sign(s);
    let mut number = if let Some(v) = parse_unsigned_decimal(rest) {
        Number {
            value: v,
            notation: Notation::Decimal,
        }
    } else if let Some(f) = parse_fraction(rest) {
        f
    } else {
        // A mixed number: `7 3/4`, `7 \frac{3}{4}`.
        let (whole, frac) = rest.split_once(' ')?;
        if whole.is_empty() || !whole.bytes().all(|c| c.is_ascii_digit()) {
            return None;
        }
        let whole: i128 = whole.parse().ok()?;
        let frac = parse_fraction(frac.trim())?;
        if frac.value.num < 0 {
            return None;
        }
        Number {
            value: Ratio::int(whole).add(frac.value)?,
            notation: Notation::Other,
        }
    };
    if neg {
        number.value = number.value.neg()?;
        if let Notation::Fraction { num, den } = number.notation {
            number.notation = Notation::Fraction {
                num: num.checked_neg()?,
                den,
            };
        }
    }
    Some(number)
}

// ---------------------------------------------------------------------------------------------
// Normalisation
// ---------------------------------------------------------------------------------------------

/// Byte index of the `}` matching the `{` at byte `open` of `s`.
fn matching_brace(s: &str, open: usize) -> Option<usize> {
    let mut depth = 0usize;
    for (i, c) in s.get(open..)?.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    return Some(open + i);
                }
            }
            _ => {}
        }
    }
    None
}

/// Text macros whose argument is plain text (a wrapper or a unit).
const TEXT_MACROS: [&str; 5] = [r"\text", r"\textbf", r"\textrm", r"\mbox", r"\mathrm"];

/// If the whole of `s` is `\text{…}` (or another text macro), its argument.
fn strip_text_wrapper(s: &str) -> Option<&str> {
    for m in TEXT_MACROS {
        if let Some(rest) = s.strip_prefix(m)
            && rest.starts_with('{')
        {
            let open = m.len();
            if matching_brace(s, open)? + 1 == s.len() {
                return Some(&s[open + 1..s.len() - 1]);
            }
        }
    }
    None
}

/// Drops a trailing `\text{…}` group (a unit, e.g. `18\text{ dollars}`) after some content.
fn strip_right_text_unit(s: &str) -> &str {
    for m in TEXT_MACROS {
        let pattern = format!("{m}{{");
        if let Some(pos) = s.rfind(&pattern) {
            let open = pos + m.len();
            if matching_brace(s, open).map(|c| c + 1) == Some(s.len()) {
                let before = s[..pos].trim_end();
                if !before.is_empty() {
                    return before;
                }
            }
        }
    }
    s
}

/// The unit words the cookbook's `_normalize` deletes (with an optional plural and power).
static TRAILING_UNIT: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"^(.*[0-9])\s*(?:degree|cm|centimeter|meter|mile|second|minute|hour|day|week|month|year|foot|feet|inch|yard)(?:es)?s?(?:\s*\^\s*\{?[0-9]+\}?)?$",
    )
    .expect("static regex is valid")
});

/// Deletes a TeX command when it is not the prefix of a longer command name.
fn delete_command(s: &str, command: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(pos) = rest.find(command) {
        let after = &rest[pos + command.len()..];
        out.push_str(&rest[..pos]);
        if after.starts_with(|c: char| c.is_ascii_alphabetic()) {
            out.push_str(command);
        }
        rest = after;
    }
    out.push_str(rest);
    out
}

/// Removes a `{…}` pair that encloses the whole string, repeatedly.
fn strip_outer_braces(mut s: &str) -> &str {
    while s.starts_with('{') && matching_brace(s, 0).map(|c| c + 1) == Some(s.len()) {
        s = s[1..s.len() - 1].trim();
    }
    s
}

/// The cookbook's `_strip_properly_formatted_commas`: `1,000` → `1000`, but a comma that is
/// not followed by exactly three digits (a tuple comma) stays.
fn strip_thousands_commas(s: &str) -> String {
    static THOUSANDS: LazyLock<Regex> = LazyLock::new(|| {
        Regex::new(r"([0-9]),([0-9]{3})($|[^0-9])").expect("static regex is valid")
    });
    let mut s = s.to_string();
    // Each pass removes at least one comma, so this terminates.
    loop {
        let next = THOUSANDS.replace_all(&s, "$1$2$3").into_owned();
        if next == s {
            return s;
        }
        s = next;
    }
}

/// `\sqrt3` → `\sqrt{3}`, `\frac12` → `\frac{1}{2}` (the cookbook's `_fix_sqrt` /
/// `_fix_fracs`), so that such spellings compare equal as strings.
fn fix_shorthand_args(s: &str) -> String {
    static SQRT: LazyLock<Regex> =
        LazyLock::new(|| Regex::new(r"\\sqrt([^{\\\s])").expect("static regex is valid"));
    static FRAC_FIRST: LazyLock<Regex> =
        LazyLock::new(|| Regex::new(r"\\frac([^{\\\s])").expect("static regex is valid"));
    static FRAC_SECOND: LazyLock<Regex> = LazyLock::new(|| {
        Regex::new(r"\\frac\{([^{}]*)\}([^{\\\s])").expect("static regex is valid")
    });
    let s = SQRT.replace_all(s, r"\sqrt{$1}");
    let s = FRAC_FIRST.replace_all(&s, r"\frac{$1}");
    FRAC_SECOND.replace_all(&s, r"\frac{$1}{$2}").into_owned()
}

/// Removes math delimiters around the whole answer, repeatedly: `\(…\)`, `\[…\]`,
/// `$$…$$`, `$…$`.
fn strip_math_delimiters(mut s: &str) -> &str {
    loop {
        let inner = [(r"\(", r"\)"), (r"\[", r"\]"), ("$$", "$$"), ("$", "$")]
            .into_iter()
            .find_map(|(open, close)| {
                s.strip_prefix(open)
                    .and_then(|r| r.strip_suffix(close))
                    .filter(|_| s.len() >= open.len() + close.len())
            });
        match inner {
            Some(inner) => s = inner.trim(),
            None => return s,
        }
    }
}

/// Formatting macros that take one argument and only change its look: unwrapped anywhere.
/// A `\boxed` inside the extracted answer (`\boxed{\boxed{7}}`) is one too.
const FORMAT_MACROS: [&str; 9] = [
    r"\boxed",
    r"\mathbf",
    r"\boldsymbol",
    r"\mathit",
    r"\mathrm",
    r"\textbf",
    r"\textit",
    r"\mathsf",
    r"\bm",
];

/// Formatting switches (`{\bf 5}`): deleted anywhere.
const FORMAT_SWITCHES: [&str; 3] = [r"\bf", r"\it", r"\rm"];

/// `\mathbf{5}` → `5`, `\boldsymbol 5` → `5`, `{\bf 5}` → `{ 5}`, anywhere in `s`. A
/// macro whose argument is missing or unbalanced is left as written.
fn unwrap_formatting(s: &str) -> String {
    let mut s = s.to_string();
    for m in FORMAT_MACROS {
        let mut out = String::with_capacity(s.len());
        let mut rest = s.as_str();
        while let Some(pos) = rest.find(m) {
            out.push_str(&rest[..pos]);
            let after = &rest[pos + m.len()..];
            if after.starts_with(|c: char| c.is_ascii_alphabetic()) {
                // A longer command name (`\mathbfit`): keep it.
                out.push_str(m);
                rest = after;
                continue;
            }
            match take_arg(after.trim_start()) {
                Some((arg, tail)) => {
                    out.push_str(arg);
                    rest = tail;
                }
                None => {
                    out.push_str(m);
                    rest = after;
                }
            }
        }
        out.push_str(rest);
        s = out;
    }
    for m in FORMAT_SWITCHES {
        s = delete_command(&s, m);
    }
    s
}

/// Deletes empty groups `{}` / `{ }` anywhere, repeatedly: `370{}` → `370` (the cookbook
/// drops every leftover brace at the end of its normalisation).
fn remove_empty_groups(s: &str) -> String {
    static EMPTY: LazyLock<Regex> =
        LazyLock::new(|| Regex::new(r"\{\s*\}").expect("static regex is valid"));
    let mut s = s.to_string();
    // Each pass removes at least one group, so this terminates.
    loop {
        let next = EMPTY.replace_all(&s, "").into_owned();
        if next == s {
            return s;
        }
        s = next;
    }
}

/// Normalises one answer; spaces are collapsed (not removed) so that mixed numbers survive.
fn normalize(answer: &str) -> String {
    let mut s = strip_math_delimiters(answer.trim()).to_string();
    if let Some(inner) = strip_text_wrapper(&s) {
        s = inner.trim().to_string();
    }
    s = s.replace(r"\\", r"\");
    for spacing in [r"\!", r"\,", r"\;", r"\:"] {
        s = s.replace(spacing, "");
    }
    s = s.replace(r"\ ", " ");
    s = s.replace(r"\tfrac", r"\frac").replace(r"\dfrac", r"\frac");
    s = delete_command(&s, r"\left");
    s = delete_command(&s, r"\right");
    for unit in [
        r"^{\circ}",
        r"^\circ",
        r"^ \circ",
        "\u{b0}",
        r"\$",
        r"\%",
        "$",
        "%",
    ] {
        s = s.replace(unit, "");
    }
    s = s.replace("{,}", ",");
    let mut s = s.trim().to_string();
    if let Some(inner) = strip_text_wrapper(&s) {
        s = inner.trim().to_string();
    }
    s = strip_right_text_unit(&s).to_string();
    s = unwrap_formatting(&s).trim().to_string();
    s = remove_empty_groups(&s).trim().to_string();
    // `x=5` → `5` when the left side is at most two characters.
    if let Some((left, right)) = s.split_once('=')
        && !right.contains('=')
        && left.trim().chars().count() <= 2
    {
        s = right.trim().to_string();
    }
    s = s.split_whitespace().collect::<Vec<_>>().join(" ");
    s = s.to_lowercase();
    if let Some(c) = TRAILING_UNIT.captures(&s) {
        s = c[1].trim_end().to_string();
    }
    s = strip_outer_braces(&s).to_string();
    strip_thousands_commas(&s)
}

/// Splits `(a,b)` / `[a,b]` into elements, the cookbook's `split_tuple`: only when the outer
/// characters are brackets and no bracket appears inside.
fn split_tuple(s: &str) -> Vec<&str> {
    const TUPLE: [char; 4] = ['(', ')', '[', ']'];
    let mut chars = s.chars();
    let (first, last) = (chars.next(), chars.next_back());
    if let (Some(first), Some(last)) = (first, last) {
        let inner = &s[first.len_utf8()..s.len() - last.len_utf8()];
        if s.chars().count() > 2
            && TUPLE.contains(&first)
            && TUPLE.contains(&last)
            && !inner.contains(TUPLE)
        {
            return inner.split(',').map(str::trim).collect();
        }
    }
    vec![s]
}

fn without_spaces(s: &str) -> String {
    fix_shorthand_args(&s.chars().filter(|c| !c.is_whitespace()).collect::<String>())
}

/// The largest radicand [`parse_radical`] factors (trial division up to its square root).
const MAX_RADICAND: i128 = 1_000_000_000_000;

/// `c\sqrt{n}` (also `\sqrt{n}`, `-\sqrt{n}`, `c*\sqrt{n}`, `c\cdot\sqrt{n}`) with integers
/// `c` and `n >= 0`, as `(c·k, m)` where `n = k²·m` and `m` has no square factor: the
/// canonical form that makes `2\sqrt{2}` equal `\sqrt{8}` (the cookbook asks sympy).
/// `s` has no spaces and its shorthand arguments are braced.
fn parse_radical(s: &str) -> Option<(i128, i128)> {
    static RADICAL: LazyLock<Regex> = LazyLock::new(|| {
        Regex::new(r"^([+-]?)([0-9]*)(?:\*|\\cdot|\\times)?\\sqrt\{([0-9]+)\}$")
            .expect("static regex is valid")
    });
    let caps = RADICAL.captures(s)?;
    let mut coef: i128 = match caps.get(2).map_or("", |m| m.as_str()) {
        "" => 1,
        digits => digits.parse().ok()?,
    };
    if &caps[1] == "-" {
        coef = coef.checked_neg()?;
    }
    let mut radicand: i128 = caps[3].parse().ok()?;
    if radicand > MAX_RADICAND {
        return None;
    }
    if radicand == 0 || coef == 0 {
        return Some((0, 1));
    }
    let mut k: i128 = 2;
    while k * k <= radicand {
        while radicand % (k * k) == 0 {
            radicand /= k * k;
            coef = coef.checked_mul(k)?;
        }
        k += 1;
    }
    Some((coef, radicand))
}

/// Compares two normalised elements (not tuples).
fn elements_equal(given: &str, truth: &str) -> bool {
    let g = without_spaces(given);
    let t = without_spaces(truth);
    if !g.is_empty() && g == t {
        return true;
    }
    if let (Some(g), Some(t)) = (parse_radical(&g), parse_radical(&t)) {
        return g == t;
    }
    let (Some(g), Some(t)) = (parse_number(given), parse_number(truth)) else {
        return false;
    };
    match (g.notation, t.notation) {
        // Two integer fractions must be written alike: `2/4` is not `1/2`.
        (Notation::Fraction { .. }, Notation::Fraction { .. }) => g.notation == t.notation,
        // An integer against a non-integer notation: `5.1` is not `5`, nor is `10/2`.
        _ if g.is_int_form() != t.is_int_form() => false,
        _ => g.value == t.value,
    }
}

/// Whether the answer `given` is equivalent to the reference answer `truth`.
///
/// A port of the cookbook's default `grade_answer` for the answers grade-school math
/// produces. Both sides go through the same normalisation, in this order:
///
/// 1. Surrounding whitespace is trimmed; math delimiters around the **whole** answer
///    (`\(…\)`, `\[…\]`, `$$…$$`, `$…$`) are removed: `\(42\)` == `42`; a `\text{…}` (also
///    `\textbf`, `\textrm`, `\mbox`, `\mathrm`) wrapping the **whole** answer is unwrapped:
///    `\text{(A)}` → `(A)`.
/// 2. `\\` → `\`; the TeX spacing commands `\!`, `\,`, `\;`, `\:` are deleted (`1\,000`);
///    `\ ` becomes a space.
/// 3. `\dfrac` and `\tfrac` → `\frac`; `\left` and `\right` are deleted.
/// 4. Degrees (`^{\circ}`, `^\circ`, `°`), dollars (`\$`, `$`) and percent signs (`\%`, `%`)
///    are deleted: `\$18` == `18`, `50\%` == `50`. (So `50%` is *not* `0.5`.)
/// 5. `{,}` → `,` (TeX thousands separator).
/// 6. A trailing `\text{…}` unit after some content is dropped: `18\text{ dollars}` == `18`.
///    A bare word is **not** a unit: `18 dollars` ≠ `18`, as in the cookbook, except the
///    cookbook's own unit list (degree, cm, centimeter, meter, mile, second, minute, hour,
///    day, week, month, year, foot, feet, inch, yard; plural and `^2` allowed) after a
///    digit: `5 hours` == `5`.
///    Then formatting macros are unwrapped anywhere: `\mathbf`, `\boldsymbol`, `\mathit`,
///    `\mathrm`, `\textbf`, `\textit`, `\mathsf`, `\bm`, and `\boxed` (a box in the box:
///    `\boxed{\boxed{7}}` grades as `7`) (`\mathbf{5}` == `5`,
///    `\boldsymbol 5` == `5`), and the switches `\bf`, `\it`, `\rm` are deleted
///    (`{\bf 5}` == `5`). (The unit of step 6 is dropped first, so `12\mathrm{cm}` == `12`.)
///    Empty groups `{}` are deleted anywhere: `370{}` == `370`.
/// 7. An `x=` prefix is dropped when the left side has at most two characters: `x=5` == `5`.
/// 8. Whitespace is collapsed, letters are lower-cased, `{…}` around the whole answer is
///    removed, and thousands commas (a comma between a digit and exactly three digits) are
///    deleted: `1,000` == `1000`.
///
/// Then the answers are equal if their normalised strings are equal ignoring spaces (with
/// `\frac12` read as `\frac{1}{2}` and `\sqrt3` as `\sqrt{3}`). Otherwise, if both are
/// bracketed tuples or intervals (`(1,2)`, `[3,4)`, no brackets inside) they are compared
/// element by element: the counts must match and, when the reference has more than one
/// element, so must the outer bracket characters. A single bracketed element is unwrapped:
/// `(A)` == `A`. Each element pair is compared as strings, then as numbers:
///
/// - Numbers are integers, decimals (`17.0`, `.5`, `17.`), scientific notation (`1e3`),
///   fractions (`a/b`, `\frac{a}{b}`, `\frac12`, signs
///   in front or inside), and mixed numbers (`7 3/4`). Values are exact rationals (`i128`
///   numerator and denominator); a number too large for that is compared as a string.
/// - Two integer fractions must be written identically (after moving the sign to the
///   numerator): `2/4` ≠ `1/2`, but `\frac{2}{4}` == `2/4`.
/// - An integer-valued decimal (`5`, `5.0`) never equals a non-integer notation: `5.1` ≠ `5`,
///   and `10/2` ≠ `5` (an unreduced answer, as in the cookbook).
/// - Otherwise the values must be equal: `17.0` == `17`, `\frac{1}{2}` == `0.5`,
///   `0.25` == `\frac14`, `3/2` == `1.5`.
/// - Scale words are not numbers: `1 million` ≠ `1000000` (the cookbook turns the word into
///   `*10^6`, which is not an integer string, so an integer reference rejects it).
/// - Radicals `c\sqrt{n}` (integers `c`, `n`) are compared in canonical form, as sympy
///   would: `2\sqrt{2}` == `\sqrt{8}`; against an integer reference a radical is wrong
///   (`\sqrt{4}` ≠ `2`, as in the cookbook).
///
/// Deliberate differences from the cookbook:
/// - No symbolic algebra beyond radicals: `x+1` vs `1+x` are unequal unless the strings
///   match after normalisation (the cookbook asks sympy).
/// - `\,` is a thousands separator: `1\,234` == `1234` (the cookbook reads it as a space
///   and then as the mixed number `1+234`).
/// - An empty answer is never correct, even against an empty reference.
/// - Unit words are only removed at the end of an answer after a digit (the cookbook deletes
///   them anywhere, even inside other words).
///
/// ```
/// use rlvr::reward::answers_equivalent;
/// assert!(answers_equivalent("1,000", "1000"));
/// assert!(answers_equivalent(r"\frac{1}{2}", "0.5"));
/// assert!(answers_equivalent(r"\$18", "18"));
/// assert!(!answers_equivalent("18 dollars", "18"));
/// assert!(!answers_equivalent("2/4", "1/2"));
/// ```
pub fn answers_equivalent(given: &str, truth: &str) -> bool {
    let g = normalize(given);
    let t = normalize(truth);
    if g.is_empty() {
        return false;
    }
    if without_spaces(&g) == without_spaces(&t) {
        return true;
    }
    let g_elems = split_tuple(&g);
    let t_elems = split_tuple(&t);
    if g_elems.len() != t_elems.len() {
        return false;
    }
    if t_elems.len() > 1
        && (g.chars().next() != t.chars().next() || g.chars().last() != t.chars().last())
    {
        return false;
    }
    g_elems
        .iter()
        .zip(&t_elems)
        .all(|(g, t)| elements_equal(g, t))
}

// ---------------------------------------------------------------------------------------------
// The reward function
// ---------------------------------------------------------------------------------------------

/// How [`BoxedAnswer`] turns `correct` and `format` into the total.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scoring {
    Correctness,
    FormatAware,
}

/// Grades a response by the last `\boxed{…}` in its text against [`Problem::answer`].
///
/// Every grade reports two components, each 0 or 1:
/// - `correct`: a box was found ([`extract_boxed`]) and its content is
///   [equivalent](answers_equivalent) to the reference answer. Graded even when the response
///   was truncated or otherwise malformed, as in the cookbook.
/// - `format`: the response is well formed **and** a box was found. Well formed means it
///   ended with the renderer's stop sequence ([`ParseTermination::StopSequence`]), the
///   cookbook's default `require_stop_sequence_for_format=True`: an EOS-terminated response
///   is *not* well formed. With [`require_stop_sequence(false)`](Self::require_stop_sequence)
///   any clean termination (stop sequence or EOS) counts.
///
/// The total depends on the mode:
/// - [`correctness`](Self::correctness): `correct` (1 or 0), the reward of the cookbook's
///   `rl_loop.py` and tutorial 104.
/// - [`format_aware`](Self::format_aware): `format_coef · (format − 1) + correct` with
///   `format_coef = 0.1`, i.e. 1.0 (correct, well formatted), 0.9 (correct, bad format), 0.0
///   (wrong, well formatted) or −0.1 (wrong, bad format): `ProblemEnv`'s reward, used by the
///   cookbook's `math_rl` recipes.
///
/// ```
/// use rlvr::{renderer::ParseTermination, BoxedAnswer};
/// let grader = BoxedAnswer::format_aware();
/// let r = grader.score("42", r" So \boxed{42}", ParseTermination::StopSequence);
/// assert_eq!(r.total, 1.0);
/// let r = grader.score("42", r" So \boxed{42}", ParseTermination::Malformed);
/// assert!((r.total - 0.9).abs() < 1e-12);
/// assert_eq!((r.components["correct"], r.components["format"]), (1.0, 0.0));
/// assert_eq!(BoxedAnswer::correctness().score("42", "42", ParseTermination::StopSequence).total, 0.0);
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BoxedAnswer {
    scoring: Scoring,
    format_coef: f64,
    require_stop_sequence: bool,
}

impl BoxedAnswer {
    /// Plain correctness: 1 when the boxed answer is right, else 0. The `format`
    /// component is still reported.
    pub fn correctness() -> Self {
        BoxedAnswer {
            scoring: Scoring::Correctness,
            format_coef: 0.1,
            require_stop_sequence: true,
        }
    }

    /// The cookbook's `ProblemEnv` reward: 1.0 / 0.9 / 0.0 / −0.1 (see the type docs).
    pub fn format_aware() -> Self {
        BoxedAnswer {
            scoring: Scoring::FormatAware,
            ..Self::correctness()
        }
    }

    /// Sets the format coefficient (default 0.1; used only by
    /// [`format_aware`](Self::format_aware)).
    pub fn with_format_coef(mut self, format_coef: f64) -> Self {
        self.format_coef = format_coef;
        self
    }

    /// Whether only a stop-sequence termination is well formed (default `true`); with
    /// `false`, an EOS termination is well formed too.
    pub fn require_stop_sequence(mut self, required: bool) -> Self {
        self.require_stop_sequence = required;
        self
    }

    /// The format coefficient.
    pub fn format_coef(&self) -> f64 {
        self.format_coef
    }

    /// Grades `text` (the parsed response content) that ended with `termination` against
    /// the reference answer `truth`. Synchronous and infallible; [`RewardFn::grade`] calls it.
    pub fn score(&self, truth: &str, text: &str, termination: ParseTermination) -> Reward {
        let boxed = extract_boxed(text);
        let correct = boxed
            .as_deref()
            .is_some_and(|answer| answers_equivalent(answer, truth));
        let format = well_formed(termination, self.require_stop_sequence) && boxed.is_some();
        problem_env_reward(
            correct,
            format,
            self.format_coef,
            self.scoring == Scoring::FormatAware,
        )
    }
}

/// Whether a response that ended with `termination` is well formed: it ended with the
/// renderer's stop sequence, or with `require_stop_sequence` false any clean ending (the
/// cookbook's `require_stop_sequence_for_format`).
pub(crate) fn well_formed(termination: ParseTermination, require_stop_sequence: bool) -> bool {
    if require_stop_sequence {
        termination.is_stop_sequence()
    } else {
        termination.is_clean()
    }
}

/// The cookbook `ProblemEnv` reward, `format_coef · (format − 1) + correct` (or `correct`
/// alone without `format_aware`), with its `correct` and `format` components.
pub(crate) fn problem_env_reward(
    correct: bool,
    format: bool,
    format_coef: f64,
    format_aware: bool,
) -> Reward {
    let (correct, format) = (f64::from(u8::from(correct)), f64::from(u8::from(format)));
    let total = if format_aware {
        format_coef * (format - 1.0) + correct
    } else {
        correct
    };
    Reward::new(total)
        .with("correct", correct)
        .with("format", format)
}

#[async_trait]
impl RewardFn for BoxedAnswer {
    async fn grade(&self, problem: &Problem, response: &Response) -> Result<Reward, RewardError> {
        Ok(self.score(&problem.answer, &response.text, response.termination))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn num(s: &str) -> Option<Number> {
        parse_number(&normalize(s))
    }

    #[test]
    fn rationals_reduce_and_check_overflow() {
        assert_eq!(Ratio::new(2, -4), Some(Ratio { num: -1, den: 2 }));
        assert_eq!(Ratio::new(1, 0), None);
        assert_eq!(Ratio::int(i128::MAX).add(Ratio::int(1)), None);
        assert_eq!(Ratio::int(i128::MIN).neg(), None);
    }

    #[test]
    fn parses_notations() {
        let d = |n, d| Ratio::new(n, d).unwrap();
        assert_eq!(num("17.0").unwrap().value, d(17, 1));
        assert!(num("17.0").unwrap().is_int_form());
        assert_eq!(num(".5").unwrap().value, d(1, 2));
        assert_eq!(num("17.").unwrap().value, d(17, 1));
        assert_eq!(num("1e3").unwrap().value, d(1000, 1));
        assert_eq!(num("2.5e-1").unwrap().value, d(1, 4));
        assert_eq!(num("2 million"), None);
        assert_eq!(num("- 5").unwrap().value, d(-5, 1));
        assert_eq!(num("7 3/4").unwrap().value, d(31, 4));
        assert_eq!(
            num(r"-\frac{2}{4}").unwrap().notation,
            Notation::Fraction { num: -2, den: 4 }
        );
        assert_eq!(
            num(r"\frac{2}{-4}").unwrap().notation,
            Notation::Fraction { num: -2, den: 4 }
        );
        assert_eq!(num(r"\frac{1.5}{3}").unwrap().notation, Notation::Other);
        assert_eq!(num("1/0"), None);
        assert_eq!(num("."), None);
        assert_eq!(num("e5"), None);
        assert_eq!(num("abc"), None);
        // Too many digits for i128: not a number (compared as a string instead).
        assert_eq!(num(&"9".repeat(60)), None);
        assert_eq!(num("1e999"), None);
    }

    #[test]
    fn normalizes() {
        assert_eq!(normalize(r" \text{(A)} "), "(a)");
        assert_eq!(normalize(r"18\text{ dollars}"), "18");
        assert_eq!(normalize(r"x = 5"), "5");
        assert_eq!(normalize(r"abc = 5"), "abc = 5");
        assert_eq!(
            normalize(r"\left( 3, \frac{\pi}{2} \right)"),
            r"( 3, \frac{\pi}{2} )"
        );
        assert_eq!(normalize("1,234,567.5"), "1234567.5");
        assert_eq!(normalize("(1,2)"), "(1,2)");
        assert_eq!(normalize(r"90^\circ"), "90");
        assert_eq!(normalize("12 inches"), "12");
        assert_eq!(normalize(r"\leftarrow"), r"\leftarrow");
        assert_eq!(normalize("{5}"), "5");
    }

    /// Random strings over an alphabet of the characters the parsers care about: nothing
    /// panics, equivalence is reflexive (for non-empty answers) and symmetric.
    #[test]
    fn random_inputs_never_panic_and_equivalence_is_symmetric() {
        use rand::{Rng, SeedableRng};
        let alphabet: Vec<&str> = vec![
            "{", "}", r"\boxed", r"\frac", r"\text", r"\left", "(", ")", "[", "]", " ", "1", "2",
            "0", "5", ".", ",", "/", "-", "=", "x", "$", "%", "e", "é", "m", "^", r"\circ",
            "million", "7 3/4",
        ];
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        let random = |rng: &mut rand_chacha::ChaCha8Rng| -> String {
            let len = rng.random_range(0..12);
            (0..len)
                .map(|_| alphabet[rng.random_range(0..alphabet.len())])
                .collect()
        };
        for _ in 0..3000 {
            let a = random(&mut rng);
            let b = random(&mut rng);
            let _ = extract_boxed(&a);
            let _ = extract_boxed(&format!(r"\boxed{{{a}}}{b}"));
            assert_eq!(
                answers_equivalent(&a, &b),
                answers_equivalent(&b, &a),
                "{a:?} vs {b:?}"
            );
            if !normalize(&a).trim().is_empty() {
                assert!(answers_equivalent(&a, &a), "{a:?}");
            }
        }
    }

    #[test]
    fn extraction_handles_multibyte_text() {
        assert_eq!(extract_boxed("é \\boxed{ü}").as_deref(), Some("ü"));
        assert_eq!(extract_boxed("}}}{{{"), None);
    }
}
