//! The cookbook's `sympy` grader (`tinker_cookbook.recipes.math_rl.math_grading.grade_answer`),
//! ported with Python `str` semantics.
//!
//! The pipeline: the MATH-style `normalize_answer` (exact string match after light cleanup),
//! then the "`_normalize`" of PRM800K (units and words dropped, LaTeX turned into text with
//! pylatexenc — see [`latex2text`] —, spaces and braces dropped, lower case), a split of
//! tuples and intervals, and per element: unreduced fractions and integers must match exactly,
//! everything else goes to sympy (`simplify(a - b) == 0`), which is delegated to the engine.
//!
//! Every helper reproduces its Python original character for character, including where the
//! original raises (a raised exception inside `normalize_answer` returns the stripped answer;
//! one inside `_parse_latex` leaves the expression unchanged).

use std::sync::OnceLock;

use regex::Regex;

mod latex2text;
#[rustfmt::skip]
mod latex2text_tables;

use latex2text::{Latex2TextError, latex_to_text, py_decimal, py_isalpha, py_isspace, py_strip};

/// `simplify(parse(a) - parse(b)) == 0` as the cookbook computes it (`are_equal_under_sympy`),
/// from the expression engine.
fn sympy_equal(ground_truth: &str, given: &str) -> bool {
    super::pytext::sympy_equal(ground_truth, given)
}

fn re(cell: &'static OnceLock<Regex>, pat: &str) -> &'static Regex {
    cell.get_or_init(|| Regex::new(pat).unwrap_or_else(|e| panic!("bad built-in regex {pat}: {e}")))
}

/// `re.search("^\\text\{(?P<text>.+?)\}$", s)`: Python's `$` also matches before a final
/// newline, and `.` never matches a newline.
fn text_wrapper(s: &str) -> Option<&str> {
    static RE: OnceLock<Regex> = OnceLock::new();
    re(&RE, r"^\\text\{(.+?)\}\n?\z")
        .captures(s)
        .and_then(|c| c.get(1))
        .map(|m| m.as_str())
}

/// A Python exception raised inside the string pipeline.
#[derive(Debug)]
struct PyRaise;

// ------------------------------------------------------------------------------------------
// Python number parsing
// ------------------------------------------------------------------------------------------

/// CPython's `_PyUnicode_TransformDecimalAndSpaceToASCII`: non-ASCII whitespace becomes a
/// space, non-ASCII decimal digits become ASCII digits; anything else non-ASCII fails.
fn to_ascii_number_text(s: &str) -> Option<String> {
    let mut t = String::with_capacity(s.len());
    for c in s.chars() {
        if (c as u32) < 127 {
            if c == '\0' {
                return None;
            }
            t.push(c);
        } else if py_isspace(c) {
            t.push(' ');
        } else {
            let d = py_decimal(c)?;
            t.push(char::from(b'0' + d as u8));
        }
    }
    Some(t)
}

fn is_c_space(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\n' | '\x0b' | '\x0c' | '\r')
}

/// Python's `float(s)` for a `str`: `None` where it raises `ValueError`.
pub(super) fn py_float(s: &str) -> Option<f64> {
    let mut t = to_ascii_number_text(s)?;
    if t.contains('_') {
        let mut out = String::with_capacity(t.len());
        let mut prev = '\0';
        for c in t.chars() {
            if c == '_' {
                if !prev.is_ascii_digit() {
                    return None;
                }
            } else {
                out.push(c);
                if prev == '_' && !c.is_ascii_digit() {
                    return None;
                }
            }
            prev = c;
        }
        if prev == '_' {
            return None;
        }
        t = out;
    }
    let t = t.trim_matches(is_c_space);
    let b = t.as_bytes();
    let mut i = 0;
    if i < b.len() && (b[i] == b'+' || b[i] == b'-') {
        i += 1;
    }
    let rest = &t[i..];
    let lower = rest.to_ascii_lowercase();
    if lower == "inf" || lower == "infinity" || lower == "nan" {
        return t.parse::<f64>().ok();
    }
    let mut digits = 0;
    while i < b.len() && b[i].is_ascii_digit() {
        i += 1;
        digits += 1;
    }
    if i < b.len() && b[i] == b'.' {
        i += 1;
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
            digits += 1;
        }
    }
    if digits == 0 {
        return None;
    }
    if i < b.len() && (b[i] == b'e' || b[i] == b'E') {
        i += 1;
        if i < b.len() && (b[i] == b'+' || b[i] == b'-') {
            i += 1;
        }
        let start = i;
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
        if i == start {
            return None;
        }
    }
    if i != b.len() {
        return None;
    }
    t.parse::<f64>().ok()
}

/// Python's `int(s)` for a `str` (base 10): the sign and the digits without leading zeros,
/// or `None` where it raises `ValueError` (including CPython's 4300-digit limit).
fn py_int(s: &str) -> Option<(bool, String)> {
    let t = to_ascii_number_text(s)?;
    let t = t.trim_start_matches(is_c_space);
    let (neg, body) = match t.as_bytes().first() {
        Some(b'+') => (false, &t[1..]),
        Some(b'-') => (true, &t[1..]),
        _ => (false, t),
    };
    let mut digits = String::new();
    let mut prev = '\0';
    let mut end = body.len();
    for (k, c) in body.char_indices() {
        if c.is_ascii_digit() {
            digits.push(c);
        } else if c == '_' {
            if !prev.is_ascii_digit() {
                return None;
            }
        } else {
            end = k;
            break;
        }
        prev = c;
    }
    if digits.is_empty() || prev == '_' {
        return None;
    }
    if !body[end..].chars().all(is_c_space) {
        return None;
    }
    if digits.len() > 4300 {
        return None;
    }
    let stripped = digits.trim_start_matches('0');
    let digits = if stripped.is_empty() {
        "0".to_string()
    } else {
        stripped.to_string()
    };
    let neg = neg && digits != "0";
    Some((neg, digits))
}

/// `str(int(x))` for a float `x` that is already integral (exact, any magnitude).
fn integral_f64_to_string(x: f64) -> String {
    if x.abs() < 9.0e15 {
        return format!("{}", x as i64);
    }
    let bits = x.to_bits();
    let neg = bits >> 63 == 1;
    let exp = ((bits >> 52) & 0x7ff) as i32 - 1075;
    let mant = (bits & ((1u64 << 52) - 1)) | (1u64 << 52);
    // base-1e9 little-endian limbs
    let mut limbs: Vec<u64> = vec![mant % 1_000_000_000, mant / 1_000_000_000];
    for _ in 0..exp.max(0) {
        let mut carry = 0u64;
        for l in limbs.iter_mut() {
            let v = *l * 2 + carry;
            *l = v % 1_000_000_000;
            carry = v / 1_000_000_000;
        }
        if carry > 0 {
            limbs.push(carry);
        }
    }
    while limbs.len() > 1 && limbs.last() == Some(&0) {
        limbs.pop();
    }
    let mut s = String::new();
    if neg {
        s.push('-');
    }
    let mut it = limbs.iter().rev();
    if let Some(first) = it.next() {
        s.push_str(&first.to_string());
    }
    for l in it {
        s.push_str(&format!("{l:09}"));
    }
    s
}

/// Python's `round(x)` (ties to even) as a string of the resulting `int`; `None` where Python
/// raises (`inf`: `OverflowError`, `nan`: `ValueError`).
fn py_round_str(x: f64) -> Option<String> {
    if !x.is_finite() {
        return None;
    }
    let r = x.round_ties_even();
    Some(integral_f64_to_string(if r == 0.0 { 0.0 } else { r }))
}

/// `_is_int(x)`: within 1e-7 of `round(x)`.
fn is_int_f(x: f64) -> bool {
    x.is_finite() && (x - x.round_ties_even()).abs() <= 1e-7
}

// ------------------------------------------------------------------------------------------
// normalize_answer (MATH "mathd" normalisation)
// ------------------------------------------------------------------------------------------

fn fix_fracs(string: &str) -> Result<String, PyRaise> {
    let substrs: Vec<&str> = string.split("\\frac").collect();
    let mut new_str = substrs[0].to_string();
    for substr in &substrs[1..] {
        new_str.push_str("\\frac");
        let cs: Vec<char> = substr.chars().collect();
        let Some(&first) = cs.first() else {
            return Err(PyRaise);
        };
        if first == '{' {
            new_str.push_str(substr);
        } else {
            if cs.len() < 2 {
                return Ok(string.to_string());
            }
            let a = cs[0];
            let b = cs[1];
            let post: String = cs[2..].iter().collect();
            if b != '{' {
                new_str.push_str(&format!("{{{a}}}{{{b}}}{post}"));
            } else {
                new_str.push_str(&format!("{{{a}}}{b}{post}"));
            }
        }
    }
    Ok(new_str)
}

fn fix_a_slash_b(string: &str) -> Result<String, PyRaise> {
    let parts: Vec<&str> = string.split('/').collect();
    if parts.len() != 2 {
        return Ok(string.to_string());
    }
    let (Some((an, ad)), Some((bn, bd))) = (py_int(parts[0]), py_int(parts[1])) else {
        return Ok(string.to_string());
    };
    let a = if an { format!("-{ad}") } else { ad };
    let b = if bn { format!("-{bd}") } else { bd };
    if string != format!("{a}/{b}") {
        return Err(PyRaise);
    }
    Ok(format!("\\frac{{{a}}}{{{b}}}"))
}

fn remove_right_units(string: &str) -> Result<String, PyRaise> {
    if string.contains("\\text{ ") {
        let splits: Vec<&str> = string.split("\\text{ ").collect();
        if splits.len() != 2 {
            return Err(PyRaise);
        }
        return Ok(splits[0].to_string());
    }
    Ok(string.to_string())
}

fn fix_sqrt(string: &str) -> String {
    if !string.contains("\\sqrt") {
        return string.to_string();
    }
    let splits: Vec<&str> = string.split("\\sqrt").collect();
    let mut new_string = splits[0].to_string();
    for split in &splits[1..] {
        let mut cs = split.chars();
        match cs.next() {
            Some('{') => {
                new_string.push_str("\\sqrt");
                new_string.push_str(split);
            }
            first => {
                new_string.push_str("\\sqrt{");
                if let Some(a) = first {
                    new_string.push(a);
                }
                new_string.push('}');
                new_string.push_str(cs.as_str());
            }
        }
    }
    new_string
}

fn strip_string(string: &str) -> Result<String, PyRaise> {
    let mut s = string.replace('\n', "");
    replace_str(&mut s, "\\!", "");
    replace_str(&mut s, "\\\\", "\\");
    replace_str(&mut s, "tfrac", "frac");
    replace_str(&mut s, "dfrac", "frac");
    replace_str(&mut s, "\\left", "");
    replace_str(&mut s, "\\right", "");
    replace_str(&mut s, "^{\\circ}", "");
    replace_str(&mut s, "^\\circ", "");
    replace_str(&mut s, "\\$", "");
    s = remove_right_units(&s)?;
    replace_str(&mut s, "\\%", "");
    replace_str(&mut s, " .", " 0.");
    replace_str(&mut s, "{.", "{0.");
    if s.is_empty() {
        return Ok(s);
    }
    if s.starts_with('.') {
        s = format!("0{s}");
    }
    {
        let parts: Vec<&str> = s.split('=').collect();
        if parts.len() == 2 && parts[0].chars().count() <= 2 {
            s = parts[1].to_string();
        }
    }
    s = fix_sqrt(&s);
    replace_char(&mut s, ' ', "");
    s = fix_fracs(&s)?;
    if s == "0.5" {
        s = "\\frac{1}{2}".to_string();
    }
    fix_a_slash_b(&s)
}

/// The cookbook's `normalize_answer` (MATH's normalisation: strips `\text{}`, `\left`,
/// `\right`, degrees, dollars, units after `\text{ `, percent signs, spaces; fixes `\frac12`,
/// `\sqrt2`, `a/b`; drops a short `x =` prefix). Where the Python raises, the stripped answer.
pub fn normalize_answer(answer: &str) -> String {
    let mut answer = py_strip(answer).to_string();
    if let Some(t) = text_wrapper(&answer) {
        answer = py_strip(t).to_string();
    }
    strip_string(&answer).unwrap_or(answer)
}

// ------------------------------------------------------------------------------------------
// _normalize (PRM800K normalisation)
// ------------------------------------------------------------------------------------------

const UNITS: [&str; 16] = [
    "degree",
    "cm",
    "centimeter",
    "meter",
    "mile",
    "second",
    "minute",
    "hour",
    "day",
    "week",
    "month",
    "year",
    "foot",
    "feet",
    "inch",
    "yard",
];

fn unit_regexes() -> &'static [Regex] {
    static RES: OnceLock<Vec<Regex>> = OnceLock::new();
    RES.get_or_init(|| {
        UNITS
            .iter()
            .map(|u| {
                let pat = format!(r"{u}(es)?(s)? *(\^[0-9]+)?");
                Regex::new(&pat).unwrap_or_else(|e| panic!("bad built-in regex {pat}: {e}"))
            })
            .collect()
    })
}

#[cfg(test)]
/// The cookbook's `_parse_latex`: `\tfrac`/`\dfrac` → `\frac`, a space before each `\frac`,
/// pylatexenc's text conversion, then `√ π ∞ ∪ · ×` → `sqrt pi inf U * *`, stripped.
/// `None` where the Python raises.
pub fn parse_latex(expr: &str) -> Option<String> {
    parse_latex_impl(expr).ok()
}

fn parse_latex_impl(expr: &str) -> Result<String, Latex2TextError> {
    let e = expr
        .replace("\\tfrac", "\\frac")
        .replace("\\dfrac", "\\frac")
        .replace("\\frac", " \\frac");
    let t = latex_to_text(&e)?;
    let t = t
        .replace('\u{221a}', "sqrt")
        .replace('\u{3c0}', "pi")
        .replace('\u{221e}', "inf")
        .replace('\u{222a}', "U")
        .replace(['\u{b7}', '\u{d7}'], "*");
    Ok(py_strip(&t).to_string())
}

/// `_strip_properly_formatted_commas`: removes thousands separators (`\d,\d\d\d` followed by
/// the end or a non-digit; `\d` is any Unicode decimal digit), repeated to a fixed point.
pub fn strip_properly_formatted_commas(expr: &str) -> String {
    let mut cur: Vec<char> = expr.chars().collect();
    loop {
        let n = cur.len();
        let dig = |c: char| py_decimal(c).is_some();
        let mut out: Vec<char> = Vec::with_capacity(n);
        let mut i = 0;
        let mut changed = false;
        while i < n {
            let m = i + 5 <= n
                && dig(cur[i])
                && cur[i + 1] == ','
                && dig(cur[i + 2])
                && dig(cur[i + 3])
                && dig(cur[i + 4]);
            if m {
                let after = i + 5;
                // `($|\D)`: `$` (end, or before a final newline) first, else one non-digit
                let consumed = if after == n || (after + 1 == n && cur[after] == '\n') {
                    Some(0)
                } else if !dig(cur[after]) {
                    Some(1)
                } else {
                    None
                };
                if let Some(k) = consumed {
                    out.push(cur[i]);
                    out.extend_from_slice(&cur[i + 2..after + k]);
                    i = after + k;
                    changed = true;
                    continue;
                }
            }
            out.push(cur[i]);
            i += 1;
        }
        if !changed {
            return out.into_iter().collect();
        }
        cur = out;
    }
}

/// `_str_is_int`.
fn str_is_int(x: &str) -> bool {
    py_float(&strip_properly_formatted_commas(x)).is_some_and(is_int_f)
}

/// `str(_str_to_int(x))` (only called where [`str_is_int`] holds).
fn str_to_int_string(x: &str) -> Option<String> {
    let f = py_float(&x.replace(',', ""))?;
    if !f.is_finite() {
        return None;
    }
    let t = f.trunc();
    Some(integral_f64_to_string(if t == 0.0 { 0.0 } else { t }))
}

#[cfg(test)]
/// The cookbook's `_normalize` (PRM800K's answer normalisation): strips `\text{}`, `%`, `$`,
/// unit words, `^\circ`, outer braces; integral floats become integers; LaTeX goes through
/// [`parse_latex`]; mixed numbers `7 3/4` become `7+3/4`; spaces and braces are dropped and
/// the result is lower-cased.
pub fn normalize(expr: &str) -> String {
    normalize_impl(expr).0
}

/// [`normalize`], and whether the LaTeX conversion ran out of work (where the cookbook's
/// whole grade would time out).
fn normalize_impl(expr: &str) -> (String, bool) {
    static RE_CIRC: OnceLock<Regex> = OnceLock::new();
    static RE_COMMA_BANG: OnceLock<Regex> = OnceLock::new();
    static RE_MINUS: OnceLock<Regex> = OnceLock::new();
    static RE_MIXED: OnceLock<Regex> = OnceLock::new();

    let mut e = match text_wrapper(expr) {
        Some(t) => t.to_string(),
        None => expr.to_string(),
    };
    replace_str(&mut e, "\\%", "%");
    replace_str(&mut e, "\\$", "$");
    replace_char(&mut e, '$', "");
    replace_char(&mut e, '%', "");
    replace_str(&mut e, " or ", " , ");
    replace_str(&mut e, " and ", " , ");
    replace_str(&mut e, "million", "*10^6");
    replace_str(&mut e, "billion", "*10^9");
    replace_str(&mut e, "trillion", "*10^12");
    for (unit, r) in UNITS.iter().zip(unit_regexes()) {
        // Each pattern starts with its unit's word: no regex pass without it.
        if e.contains(unit) {
            replace_re(&mut e, r, "");
        }
    }
    replace_re(&mut e, re(&RE_CIRC, r"\^ *\\circ"), "");
    if e.starts_with('{') && e.ends_with('}') && !e.is_empty() {
        let mut cs = e.chars();
        cs.next();
        cs.next_back();
        e = cs.as_str().to_string();
    }
    replace_re(&mut e, re(&RE_COMMA_BANG, r",\\! *"), "");
    if let Some(f) = py_float(&e)
        && is_int_f(f)
        && let Some(s) = py_round_str(f)
    {
        e = s;
    }
    let mut out_of_work = false;
    if e.contains('\\') {
        match parse_latex_impl(&e) {
            Ok(t) => e = t,
            Err(Latex2TextError::TooMuchWork) => out_of_work = true,
            Err(_) => {}
        }
    }
    replace_re(&mut e, re(&RE_MINUS, r"- *"), "-");
    replace_re(&mut e, re(&RE_MIXED, r"([0-9]) +([0-9])"), "${1}+${2}");
    replace_char(&mut e, ' ', "");
    e = e.replace(['{', '}'], "");
    e = e.to_lowercase();
    if str_is_int(&e)
        && let Some(s) = str_to_int_string(&e)
    {
        e = s;
    }
    (e, out_of_work)
}

/// `count_unknown_letters_in_expr`: distinct alphabetic characters once `sqrt` and `frac`
/// are removed.
fn count_unknown_letters(expr: &str) -> usize {
    let e = expr.replace("sqrt", "").replace("frac", "");
    let mut seen: Vec<char> = e.chars().filter(|&c| py_isalpha(c)).collect();
    seen.sort_unstable();
    seen.dedup();
    seen.len()
}

/// `s.replace(from, to)` that allocates only when `from` occurs.
fn replace_str(s: &mut String, from: &str, to: &str) {
    if s.contains(from) {
        *s = s.replace(from, to);
    }
}

/// `s.replace(from, to)` for a char, allocating only when it occurs.
fn replace_char(s: &mut String, from: char, to: &str) {
    if s.contains(from) {
        *s = s.replace(from, to);
    }
}

/// `re.sub(pattern, replacement, s)`, allocating only when the pattern matches.
fn replace_re(s: &mut String, re: &Regex, replacement: &str) {
    if let std::borrow::Cow::Owned(replaced) = re.replace_all(s, replacement) {
        *s = replaced;
    }
}

/// The cookbook's `should_allow_eval`: at most two distinct letters, no `^{`, `^(`, no
/// stacked or multi-digit exponents (sympy might hang on those).
pub fn should_allow_eval(expr: &str) -> bool {
    static RE_A: OnceLock<Regex> = OnceLock::new();
    static RE_B: OnceLock<Regex> = OnceLock::new();
    if count_unknown_letters(expr) > 2 {
        return false;
    }
    if expr.contains("^{") || expr.contains("^(") {
        return false;
    }
    !re(&RE_A, r"\^[0-9]+\^").is_match(expr) && !re(&RE_B, r"\^[0-9][0-9]+").is_match(expr)
}

/// The cookbook's `split_tuple`: the elements of a tuple or interval (`(a,b)`, `[a,b)`, …)
/// whose inside holds no bracket, after removing thousands separators; else the whole string.
pub fn split_tuple(expr: &str) -> Vec<String> {
    let e = strip_properly_formatted_commas(expr);
    let cs: Vec<char> = e.chars().collect();
    if cs.is_empty() {
        return Vec::new();
    }
    let tuple_char = |c: char| matches!(c, '(' | ')' | '[' | ']');
    if cs.len() > 2
        && tuple_char(cs[0])
        && tuple_char(cs[cs.len() - 1])
        && !cs[1..cs.len() - 1].iter().any(|&c| tuple_char(c))
    {
        let inner: String = cs[1..cs.len() - 1].iter().collect();
        return inner.split(',').map(|x| py_strip(x).to_string()).collect();
    }
    vec![e]
}

/// `_is_frac`: `^-?[0-9]+.?/0*[1-9][0-9]*.?$`.
fn is_frac(expr: &str) -> bool {
    static RE: OnceLock<Regex> = OnceLock::new();
    re(&RE, r"^-?[0-9]+.?/0*[1-9][0-9]*.?\n?\z").is_match(expr)
}

fn are_equal_under_sympy(ground_truth: &str, given: &str) -> bool {
    let expr = format!("({ground_truth})-({given})");
    should_allow_eval(&expr) && sympy_equal(ground_truth, given)
}

/// Longest `given` or `truth` (bytes) that [`grade_sympy`] runs the pipeline on; longer
/// inputs are equal only when identical (keeps every verdict within milliseconds).
pub const MAX_INPUT_BYTES: usize = 4096;

/// The cookbook's `grade_answer(given_answer, ground_truth)` (the `sympy` grader): equal after
/// `normalize_answer`, or equal after `_normalize`, or element-wise equal (same tuple shape,
/// same brackets; unreduced fractions and integers must match as strings; the rest equal
/// under sympy's `simplify`).
pub fn grade_sympy(given: &str, truth: &str) -> bool {
    // Identical answers normalise alike: the cookbook's first test accepts them.
    if given == truth {
        return true;
    }
    if given.len() > MAX_INPUT_BYTES || truth.len() > MAX_INPUT_BYTES {
        // Anything this long is not a competition answer (and would take Python seconds);
        // only identical answers (above) are sure to normalise alike.
        return false;
    }
    // pylatexenc's walker is recursive, and so is its emulation here: it follows Python's
    // recursion limit (a few hundred levels), deeper than a 2 MiB thread stack holds in an
    // unoptimised build. Deeply nested answers (rare) are graded on a thread of their own
    // with room for that depth.
    if nesting(given).max(nesting(truth)) <= SHALLOW {
        return grade_sympy_here(given, truth);
    }
    let grade = || grade_sympy_here(given, truth);
    std::thread::scope(|scope| {
        std::thread::Builder::new()
            .name("rlvr-sympy-grade".into())
            .stack_size(DEEP_STACK)
            .spawn_scoped(scope, grade)
            .ok()
            .and_then(|handle| handle.join().ok())
            // No thread (or a panic, which the emulation never raises): not equal.
            .unwrap_or(false)
    })
}

/// Nesting up to which [`grade_sympy`] runs on the caller's stack.
const SHALLOW: usize = 64;

/// The stack of the thread that grades deeper answers: room for the deepest nesting
/// pylatexenc accepts before Python's recursion limit, in a debug build.
const DEEP_STACK: usize = 64 << 20;

/// A bound on the walker's recursion for `s`, counted in one pass: the deepest nesting of
/// `{`, `[` and `(`, plus the number of macros (a macro's argument may be another macro
/// without braces: `\sqrt\sqrt\sqrt2`).
fn nesting(s: &str) -> usize {
    let (mut depth, mut deepest, mut macros) = (0usize, 0usize, 0usize);
    for b in s.bytes() {
        match b {
            b'{' | b'[' | b'(' => depth += 1,
            b'}' | b']' | b')' => depth = depth.saturating_sub(1),
            b'\\' => macros += 1,
            _ => {}
        }
        deepest = deepest.max(depth);
    }
    deepest + macros
}

fn grade_sympy_here(given: &str, truth: &str) -> bool {
    if given.len() > MAX_INPUT_BYTES || truth.len() > MAX_INPUT_BYTES {
        // Only identical answers are sure to normalise alike; anything this long is not a
        // competition answer (and would take Python seconds).
        return given == truth;
    }
    if normalize_answer(truth) == normalize_answer(given) {
        return true;
    }
    let (gt, gt_slow) = normalize_impl(truth);
    let (gv, gv_slow) = normalize_impl(given);
    if gt_slow || gv_slow {
        // pylatexenc would run past the cookbook's timeout: the grade counts as wrong
        return false;
    }
    if gt == gv {
        return true;
    }
    if gv.is_empty() {
        return false;
    }
    let gt_elems = split_tuple(&gt);
    let gv_elems = split_tuple(&gv);
    let first_last_differ =
        gt.chars().next() != gv.chars().next() || gt.chars().next_back() != gv.chars().next_back();
    if (gt_elems.len() > 1 && first_last_differ) || gt_elems.len() != gv_elems.len() {
        return false;
    }
    let mut is_correct = false;
    for (t, g) in gt_elems.iter().zip(gv_elems.iter()) {
        is_correct = if is_frac(t) && is_frac(g) {
            t == g
        } else if str_is_int(t) != str_is_int(g) {
            false
        } else {
            are_equal_under_sympy(t, g)
        };
        if !is_correct {
            break;
        }
    }
    is_correct
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_float() {
        for (s, ok) in [
            ("1", true),
            (" 1_000 ", true),
            ("1__0", false),
            ("_1", false),
            ("1_", false),
            ("inf", true),
            ("-Infinity", true),
            ("nan", true),
            ("1e5", true),
            ("1e", false),
            (".5", true),
            ("5.", true),
            (".", false),
            ("\u{0663}", true),
            ("\u{2003}3\u{2003}", true),
            ("\x1c3", false),
            ("0x10", false),
            ("", false),
        ] {
            assert_eq!(py_float(s).is_some(), ok, "{s:?}");
        }
        assert_eq!(integral_f64_to_string(1e20), "100000000000000000000");
        assert_eq!(
            integral_f64_to_string(-2f64.powi(70)),
            "-1180591620717411303424"
        );
    }

    #[test]
    fn python_int() {
        assert_eq!(py_int(" -007 "), Some((true, "7".into())));
        assert_eq!(py_int("-0"), Some((false, "0".into())));
        assert_eq!(py_int("1_0"), Some((false, "10".into())));
        assert_eq!(py_int("- 1"), None);
        assert_eq!(py_int(""), None);
    }
}

#[cfg(test)]
mod doc_examples {
    #[test]
    fn example_1() {
        use crate::reward::math::sympy::normalize_answer;
        assert_eq!(normalize_answer(r" x = \dfrac12 "), r"\frac{1}{2}");
        assert_eq!(normalize_answer("3/4"), r"\frac{3}{4}");
    }
    #[test]
    fn example_2() {
        use crate::reward::math::sympy::normalize;
        assert_eq!(normalize(r"\frac{1}{2}"), "1/2");
        assert_eq!(normalize("5 cm"), "5");
        assert_eq!(normalize(r"\text{(A)}"), "(a)");
    }
    #[test]
    fn example_3() {
        use crate::reward::math::sympy::should_allow_eval;
        assert!(should_allow_eval("(x+y)-(y+x)"));
        assert!(!should_allow_eval("(2^10)-(1024)"));
    }
    #[test]
    fn example_4() {
        use crate::reward::math::sympy::split_tuple;
        assert_eq!(split_tuple("(1, 2,000)"), vec!["1", "2000"]);
        assert_eq!(split_tuple("x"), vec!["x"]);
    }
    #[test]
    fn example_5() {
        use crate::reward::math::sympy::grade_sympy;
        assert!(grade_sympy(r"\dfrac{1}{2}", r"\frac12"));
        assert!(grade_sympy(r"\text{(B)}", "(b)"));
        assert!(!grade_sympy("2", "3"));
    }
}

/// The string pipeline against the Python, function by function, on every input of
/// `tests/fixtures/math_grader/sympy_strings.jsonl.zst` (made by `make_sympy_strings.py` next to
/// it: the fixture pairs' answers, hand-written answers, random LaTeX, nesting at Python's
/// recursion limit).
#[cfg(test)]
mod python_strings {
    use super::latex2text::latex_to_text;
    use super::{normalize, normalize_answer, parse_latex, should_allow_eval, split_tuple};
    use serde_json::Value;

    /// On a thread with the stack `grade_sympy` gives deeply nested answers: the fixture
    /// nests as deep as Python's recursion limit allows.
    #[test]
    fn string_functions_match_the_python() {
        std::thread::Builder::new()
            .stack_size(super::DEEP_STACK)
            .spawn(check_strings)
            .expect("thread")
            .join()
            .expect("no panic");
    }

    fn check_strings() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/math_grader/sympy_strings.jsonl.zst"
        );
        let raw = zstd::decode_all(std::fs::read(path).expect("fixture").as_slice()).expect("zstd");
        let text = String::from_utf8(raw).expect("utf-8");
        let mut total = 0;
        let mut bad: Vec<String> = Vec::new();
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let d: Value = serde_json::from_str(line).expect("json");
            let x = d["x"].as_str().expect("x");
            total += 1;
            let n = normalize(x);
            // "st" is omitted when it is [_normalize(x)].
            let want_st: Vec<String> = match d["st"].as_array() {
                Some(a) => a
                    .iter()
                    .map(|v| v.as_str().unwrap_or("").to_string())
                    .collect(),
                None => vec![d["n"].as_str().unwrap_or("").to_string()],
            };
            let checks = [
                (
                    "latex2text",
                    format!("{:?}", latex_to_text(x).ok()),
                    format!("{:?}", d["l2t"].as_str()),
                ),
                (
                    "_parse_latex",
                    format!("{:?}", parse_latex(x)),
                    format!("{:?}", d["pl"].as_str()),
                ),
                (
                    "normalize_answer",
                    normalize_answer(x),
                    d["na"].as_str().unwrap_or("").to_string(),
                ),
                (
                    "_normalize",
                    n.clone(),
                    d["n"].as_str().unwrap_or("").to_string(),
                ),
                (
                    "split_tuple",
                    format!("{:?}", split_tuple(&n)),
                    format!("{want_st:?}"),
                ),
                (
                    "should_allow_eval",
                    should_allow_eval(&n).to_string(),
                    d["sae"].as_bool().unwrap_or(false).to_string(),
                ),
            ];
            for (name, got, want) in checks {
                if got != want {
                    bad.push(format!("{name}({x:?}): rlvr {got} python {want}"));
                }
            }
        }
        assert!(total > 5000, "{total} inputs");
        assert!(
            bad.is_empty(),
            "{} mismatches:\n{}",
            bad.len(),
            bad.join("\n")
        );
    }
}
