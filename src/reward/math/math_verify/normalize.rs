//! String-level LaTeX normalisation of math-verify (latex2sympy2_extended 1.11
//! `normalize_latex` with the configuration math-verify's default `LatexExtractionConfig`
//! uses: basic LaTeX clean-up, units, nits, malformed operators, `\boxed` extraction).
//!
//! Python's `re` patterns with look-arounds are emulated by small scanners: at each
//! position the alternatives are tried in order (leftmost-first, as Python does), the
//! look-behind / look-ahead conditions checked by hand around an anchored `regex`.
//! Positions are byte offsets; where Python counts characters (`len`, `str[0]`) the
//! code counts `char`s.

use crate::python::{is_py_space as py_isspace, py_lstrip, py_strip};
use std::sync::OnceLock;

use regex::Regex;

/// Which `\boxed{…}` contents to keep (`NormalizationConfig.boxed`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BoxedMode {
    /// All boxed contents, joined by commas (the default).
    All,
    /// Only the last boxed (and the boxes just before it, separated by `,`/`and`/`or`).
    Last,
}

/// Python's `\w` for `str` patterns (alphanumeric or underscore).
fn py_is_word(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

fn char_before(s: &str, pos: usize) -> Option<char> {
    s[..pos].chars().next_back()
}

fn char_at(s: &str, pos: usize) -> Option<char> {
    s[pos..].chars().next()
}

/// The `\s` class of Python `str` patterns, for use inside our regexes.
const S: &str = crate::python::PY_SPACE_CLASS;

fn re(pattern: &str) -> Regex {
    // Replace each `\s` escape (not `\\s`) by the Python class.
    let mut p = String::with_capacity(pattern.len() + 16);
    let mut chars = pattern.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            match chars.next() {
                Some('s') => p.push_str(S),
                Some(n) => {
                    p.push('\\');
                    p.push(n);
                }
                None => p.push('\\'),
            }
        } else {
            p.push(c);
        }
    }
    // The patterns are constants of this module; a failure is a bug caught by the tests.
    Regex::new(&p).unwrap_or_else(|e| panic!("bad pattern {pattern}: {e}"))
}

macro_rules! lazy_re {
    ($name:ident, $pat:expr) => {
        fn $name() -> &'static Regex {
            static R: OnceLock<Regex> = OnceLock::new();
            R.get_or_init(|| re($pat))
        }
    };
}

// ---------------------------------------------------------------------------
// \boxed extraction
// ---------------------------------------------------------------------------

fn valid_separator(between: &str) -> bool {
    // `\b(and|or)\b|,|;`
    if between.contains(',') || between.contains(';') {
        return true;
    }
    lazy_re!(sep_re, r"\b(?:and|or)\b");
    sep_re().is_match(between)
}

/// `extract_boxed_content`: the contents of `\boxed{…}` / `\fbox{…}`, searched from the
/// right; returns the text unchanged when there is none.
pub fn extract_boxed_content(text: &str, mode: BoxedMode) -> String {
    let bytes = text.as_bytes();
    let mut results: Vec<String> = Vec::new();
    let mut current_pos = text.len();
    let mut last_boxed_start: Option<usize> = None;
    let mut max_pos = text.len();
    loop {
        let boxed_idx = text[..current_pos].rfind("\\boxed");
        let fbox_idx = text[..current_pos].rfind("\\fbox");
        let (start_idx, command_end) = match (boxed_idx, fbox_idx) {
            (None, None) => break,
            (Some(b), None) => (b, b + 6),
            (None, Some(f)) => (f, f + 5),
            (Some(b), Some(f)) => {
                if b > f {
                    (b, b + 6)
                } else {
                    (f, f + 5)
                }
            }
        };
        // Python's `rfind(sub, 0, end)` needs the whole match before `end`; so does ours.
        let mut next = command_end;
        while next < max_pos {
            match char_at(text, next) {
                Some(c) if py_isspace(c) => next += c.len_utf8(),
                _ => break,
            }
        }
        if next >= max_pos {
            break;
        }
        if bytes[next] == b'{' {
            // find_content_boundaries
            let mut depth = 1usize;
            let mut i = next;
            let mut end = None;
            while i + 1 < max_pos {
                i += 1;
                match bytes[i] {
                    b'{' => depth += 1,
                    b'}' => {
                        depth -= 1;
                        if depth == 0 {
                            end = Some(i);
                            break;
                        }
                    }
                    _ => {}
                }
            }
            let Some(content_end) = end else {
                if results.is_empty() {
                    results.push(text[next..].to_string());
                }
                break;
            };
            let content = py_strip(&text[next + 1..content_end]).to_string();
            if mode == BoxedMode::Last
                && let Some(lbs) = last_boxed_start
            {
                let prev = results.last().map(String::as_str).unwrap_or("");
                let between = if content_end < lbs {
                    &text[content_end + 1..lbs]
                } else {
                    ""
                };
                let n = between.chars().count();
                let ok = n < 10 || (content != prev && n < 70 && valid_separator(between));
                if !ok {
                    break;
                }
            }
            if results.last() != Some(&content) {
                results.push(content);
            }
            last_boxed_start = Some(start_idx);
            max_pos = start_idx;
        } else {
            if results.is_empty() {
                results.push(text[next..].to_string());
            }
            break;
        }
        current_pos = start_idx;
    }
    if results.is_empty() {
        return text.to_string();
    }
    results.reverse();
    results.join(",")
}

// ---------------------------------------------------------------------------
// Generic "re.sub with alternatives" scanner
// ---------------------------------------------------------------------------

/// One alternative: returns the end of its match at `pos` and the replacement.
type Alt = fn(&str, usize) -> Option<(usize, String)>;

fn sub_alternatives(text: &str, first: fn(u8) -> bool, alts: &[Alt]) -> String {
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut last = 0;
    let mut pos = 0;
    while pos < bytes.len() {
        if !text.is_char_boundary(pos) || !first(bytes[pos]) {
            pos += 1;
            continue;
        }
        let mut hit = None;
        for alt in alts {
            if let Some(m) = alt(text, pos) {
                hit = Some(m);
                break;
            }
        }
        match hit {
            Some((end, rep)) => {
                out.push_str(&text[last..pos]);
                out.push_str(&rep);
                last = end;
                pos = if end > pos { end } else { pos + 1 };
            }
            None => pos += 1,
        }
    }
    out.push_str(&text[last..]);
    out
}

fn anchored(r: &Regex, text: &str, pos: usize) -> Option<usize> {
    r.find(&text[pos..]).map(|m| pos + m.end())
}

fn is_ascii_letter(c: Option<char>) -> bool {
    matches!(c, Some(c) if c.is_ascii_alphabetic())
}

fn first_char_is_space(b: u8) -> bool {
    // Any non-ASCII lead byte may start a Unicode space.
    b.is_ascii_whitespace() || b == 0x0b || (0x1c..=0x1f).contains(&b) || b >= 0x80
}

// to_remove_regex
lazy_re!(rm_mathrm_th, r"^\\mathrm\{th\}");
lazy_re!(rm_bang, r"^\\!\s*");
lazy_re!(rm_empty_text, r"^\\text\s*\{\s*\}");

fn to_remove(text: &str) -> String {
    let alts: &[Alt] = &[
        |t, p| anchored(rm_mathrm_th(), t, p).map(|e| (e, String::new())),
        |t, p| anchored(rm_bang(), t, p).map(|e| (e, String::new())),
        |t, p| anchored(rm_empty_text(), t, p).map(|e| (e, String::new())),
        |t, p| t[p..].starts_with("\\$").then(|| (p + 2, String::new())),
        |t, p| t[p..].starts_with('$').then(|| (p + 1, String::new())),
        |t, p| {
            let b = t.as_bytes()[p];
            ((b == b'"' || b == b'\'') && char_before(t, p) != Some('\\'))
                .then(|| (p + 1, String::new()))
        },
        |t, p| {
            t[p..]
                .starts_with("\\displaystyle")
                .then(|| (p + 13, String::new()))
        },
    ];
    sub_alternatives(text, |b| matches!(b, b'\\' | b'$' | b'"' | b'\''), alts)
}

// to_replace_regex
lazy_re!(rp_math, r"^\\math(?:rm|it|bf)");
lazy_re!(rp_text, r"^\\text(?:normal|bf|it|rm)");
lazy_re!(rp_frac, r"^\\(?:d|t|c)frac");
lazy_re!(rp_decimal_space, r"^\s\.");
lazy_re!(rp_comma, r"^\s*\{\s*,\s*\}");
lazy_re!(rp_and_or, r"^,?\s*(?:and|or)");
lazy_re!(rp_and_or_text, r"^,?\s*\\text\{\s*(?:and|or)\s*\}");
lazy_re!(rp_bs_space, r"^\\\s");
lazy_re!(rp_dot, r"^,?\\ldots");
lazy_re!(rp_lead_space, r"^\s*");

/// `\s*\bWORD\b` at `pos`.
fn space_word(t: &str, p: usize, word: &str) -> Option<usize> {
    let q = anchored(rp_lead_space(), t, p)?;
    if !t[q..].starts_with(word) {
        return None;
    }
    // \b before the word's first (word) character
    if char_before(t, q).is_some_and(py_is_word) {
        return None;
    }
    let e = q + word.len();
    if char_at(t, e).is_some_and(py_is_word) {
        return None;
    }
    Some(e)
}

/// `replace_in_latex`.
pub fn replace_in_latex(text: &str) -> String {
    fn lit(t: &str, p: usize, s: &str, rep: &str) -> Option<(usize, String)> {
        t[p..]
            .starts_with(s)
            .then(|| (p + s.len(), rep.to_string()))
    }
    let alts: &[Alt] = &[
        |t, p| anchored(rp_math(), t, p).map(|e| (e, "\\text".into())),
        |t, p| anchored(rp_text(), t, p).map(|e| (e, "\\text".into())),
        |t, p| anchored(rp_frac(), t, p).map(|e| (e, "\\frac".into())),
        |t, p| anchored(rp_decimal_space(), t, p).map(|e| (e, " 0.".into())),
        |t, p| lit(t, p, "{.", "{0."),
        |t, p| lit(t, p, "~=", "\\approx"),
        |t, p| anchored(rp_comma(), t, p).map(|e| (e, ",".into())),
        |t, p| {
            if is_ascii_letter(char_before(t, p)) {
                return None;
            }
            let e = anchored(rp_and_or(), t, p)?;
            if is_ascii_letter(char_at(t, e)) {
                return None;
            }
            Some((e, ",".into()))
        },
        |t, p| anchored(rp_and_or_text(), t, p).map(|e| (e, ",".into())),
        |t, p| {
            if char_before(t, p) == Some('\\') {
                return None;
            }
            anchored(rp_bs_space(), t, p).map(|e| (e, " ".into()))
        },
        |t, p| lit(t, p, "infinity", "\\infty"),
        |t, p| anchored(rp_dot(), t, p).map(|e| (e, " ".into())),
        |t, p| space_word(t, p, "percentage").map(|e| (e, "\\%".into())),
        |t, p| lit(t, p, "\\text{percentage}", "%"),
        |t, p| space_word(t, p, "percent").map(|e| (e, "\\%".into())),
        |t, p| lit(t, p, "\\text{percent}", "%"),
        |t, p| space_word(t, p, "pct").map(|e| (e, "\\%".into())),
        |t, p| lit(t, p, "\\text{pct}", "%"),
        |t, p| {
            if char_before(t, p) == Some('\\') || !t[p..].starts_with("inf") {
                return None;
            }
            if t[p + 3..].starts_with("inity") {
                return None;
            }
            Some((p + 3, "\\infty".into()))
        },
        |t, p| lit(t, p, " sqrt", "\\sqrt"),
    ];
    sub_alternatives(
        text,
        |b| {
            matches!(b, b'\\' | b'{' | b'~' | b',' | b'a' | b'o' | b'i' | b'p')
                || first_char_is_space(b)
        },
        alts,
    )
}

/// `\\\\(?=[a-zA-Z])` → `\\`.
fn fix_command_slash(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut last = 0;
    let mut i = 0;
    while i + 2 < b.len() {
        if b[i] == b'\\' && b[i + 1] == b'\\' && b[i + 2].is_ascii_alphabetic() {
            out.push_str(&text[last..i]);
            out.push('\\');
            last = i + 2;
            i += 2;
        } else {
            i += 1;
        }
    }
    out.push_str(&text[last..]);
    out
}

// ---------------------------------------------------------------------------
// units
// ---------------------------------------------------------------------------

const UNITS: &[&str] = &[
    "integerpoint",
    "feet",
    "sue",
    "digit",
    "pound",
    "meal",
    "edge",
    "student",
    "children ticket",
    "multiple",
    "east",
    "degree",
    "mph",
    "kmph",
    "ft",
    "m square",
    " m east",
    "sq m",
    "deg",
    "mile",
    "q .",
    "monkey",
    "prime",
    "ratio",
    "profit of rs",
    "rd",
    "o",
    "gm",
    "p . m",
    "lb",
    "tile",
    "per",
    "dm",
    "lt",
    "gain",
    "ab",
    "way",
    "west",
    "a .",
    "b .",
    "c .",
    "d .",
    "e .",
    "f .",
    "g .",
    "h .",
    "t",
    "h",
    "no change",
    "men",
    "soldier",
    "pie",
    "bc",
    "excess",
    "st",
    "inches",
    "noon",
    "cent",
    "by",
    "gal",
    "kmh",
    "c",
    "acre",
    "rise",
    "a . m",
    "th",
    "π r 2",
    "sq",
    "mark",
    "l",
    "toy",
    "coin",
    "sq . m",
    "gallon",
    "° f",
    "profit",
    "minw",
    "yr",
    "women",
    "am",
    "pm",
    "hr",
    "cu cm",
    "square",
    "v â € ™",
    "are",
    "rupee",
    "rounds",
    "cubic",
    "cc",
    "mtr",
    "s",
    "ohm",
    "number",
    "kmph",
    "day",
    "hour",
    "minute",
    "min",
    "second",
    "man",
    "woman",
    "sec",
    "cube",
    "mt",
    "sq inch",
    "mp",
    "∏ cm ³",
    "hectare",
    "more",
    "sec",
    "unit",
    "cu . m",
    "cm 2",
    "rs .",
    "rs",
    "kg",
    "g",
    "month",
    "km",
    "m",
    "cm",
    "mm",
    "apple",
    "liter",
    "loss",
    "yard",
    "pure",
    "year",
    "increase",
    "decrease",
    "d",
    "less",
    "Surface",
    "litre",
    "pi sq m",
    "s .",
    "metre",
    "meter",
    "inch",
];

fn units_regex() -> &'static Regex {
    static R: OnceLock<Regex> = OnceLock::new();
    R.get_or_init(|| {
        // The unit names are used as regex source, as in Python (`.` is a wildcard there).
        let alts = UNITS.join("|");
        re(&format!(r"(\d|\}}|\s)\s*(?:(?:{alts})(?:s|es)?)\s*$"))
    })
}

lazy_re!(
    unit_superscript,
    r"(\\(?:text|mbox)\{.*?\})(\^\d|\{\^\d\})?$"
);

// ---------------------------------------------------------------------------
// malformed operators
// ---------------------------------------------------------------------------

fn malformed_patterns() -> &'static [(Regex, &'static str)] {
    static R: OnceLock<Vec<(Regex, &'static str)>> = OnceLock::new();
    R.get_or_init(|| {
        vec![
            (re(r"\^\s?\((.*?)\)"), r"^{${1}}"),
            (re(r"sqrt\s?\((.*?)\)"), r"\sqrt{${1}}"),
            (re(r"\\frac\s?(\d)\s?(\d+)"), r"\frac{${1}}{${2}}"),
            (re(r"\\log_\s?(\d)\s?(\d+)"), r"\log_{${1}}{${2}}"),
            (re(r"\\frac\s?\{(.*?)\}\s?(\d)"), r"\frac{${1}}{${2}}"),
            (re(r"\\frac\s?(\d)\s?\{(.*?)\}"), r"\frac{${1}}{${2}}"),
            (re(r"\\sqrt\s?(\d)"), r"\sqrt{${1}}"),
        ]
    })
}

fn fix_malformed_operators(text: &str) -> String {
    let mut s = text.to_string();
    for (r, rep) in malformed_patterns() {
        if r.is_match(&s) {
            s = r.replace_all(&s, *rep).into_owned();
        }
    }
    s.replace(" sqrt", "\\sqrt")
}

/// hendrycks `_fix_sqrt`.
fn fix_sqrt(text: &str) -> String {
    if !text.contains("\\sqrt") {
        return text.to_string();
    }
    let mut parts = text.split("\\sqrt");
    let mut out = parts.next().unwrap_or("").to_string();
    for split in parts {
        let split = py_lstrip(split);
        match split.chars().next() {
            Some(c) if c != '{' && c != '[' => {
                out.push_str("\\sqrt{");
                out.push(c);
                out.push('}');
                out.push_str(&split[c.len_utf8()..]);
            }
            _ => {
                out.push_str("\\sqrt");
                out.push_str(split);
            }
        }
    }
    out
}

/// hendrycks `_fix_fracs`.
fn fix_fracs(text: &str) -> String {
    let mut parts = text.split("\\frac");
    let mut out = parts.next().unwrap_or("").to_string();
    for substr in parts {
        let substr = py_lstrip(substr);
        out.push_str("\\frac");
        let mut chars = substr.chars();
        let first = chars.next();
        if first == Some('{') {
            out.push_str(substr);
            continue;
        }
        let (Some(a), Some(b)) = (first, chars.next()) else {
            return text.to_string();
        };
        let post = chars.as_str();
        if b != '{' {
            out.push('{');
            out.push(a);
            out.push_str("}{");
            out.push(b);
            out.push('}');
            out.push_str(post);
        } else {
            out.push('{');
            out.push(a);
            out.push('}');
            out.push(b);
            out.push_str(post);
        }
    }
    out
}

/// Is `s` exactly `str(int(s))` in Python (canonical decimal integer)?
fn canonical_int(s: &str) -> bool {
    let d = s.strip_prefix('-').unwrap_or(s);
    if d.is_empty() || !d.bytes().all(|b| b.is_ascii_digit()) {
        return false;
    }
    if d.len() > 1 && d.starts_with('0') {
        return false;
    }
    !(s.starts_with('-') && d == "0")
}

/// hendrycks `_fix_a_slash_b`.
fn fix_a_slash_b(text: &str) -> String {
    let parts: Vec<&str> = text.split('/').collect();
    if parts.len() != 2 {
        return text.to_string();
    }
    if canonical_int(parts[0]) && canonical_int(parts[1]) {
        return format!("\\frac{{{}}}{{{}}}", parts[0], parts[1]);
    }
    text.to_string()
}

// ---------------------------------------------------------------------------
// basic latex
// ---------------------------------------------------------------------------

lazy_re!(
    r_left,
    r"\\m?left(\\\{|\{|\\\||\||\[|\(|\\rbracl|\\lgroup|\\lbrace|\\lbrack|\\vert|\\lvert|\\lceil|\\lfloor|\\vert|\\lvert|\\langle|\\llcorner|\\ulcorner)"
);
lazy_re!(
    r_right,
    r"\\m?right(\\\}|\}|\\\||\||\]|\)|\\rbrack|\\rgroup|\\rbrace|\\rbrack|\\vert|\\rvert|\\rceil|\\rfloor|\\vert|\\rvert|\\rangle|\\lrcorner|\\urcorner)"
);
lazy_re!(
    permutation,
    r"\(([a-zA-Z0-9+\-*/\\ ]+?)\)_\{([a-zA-Z0-9+\-*/\\ ]+?)\}"
);

/// `normalize_latex` with math-verify's default extraction configuration
/// (`basic_latex`, `units`, `malformed_operators`, `nits` on, `equations` off) and the
/// given `\boxed` mode.
pub fn normalize_latex(text: &str, boxed: BoxedMode) -> String {
    let mut text = extract_boxed_content(text, boxed);

    // basic_latex
    text = text
        .replace("\\mathrm{T}", "T")
        .replace("\\mathrm{d}", "d")
        .replace("{\\rm d}", "d")
        .replace("\\left[\\begin{matrix}", "\\begin{bmatrix}")
        .replace("\\end{matrix}\\right]", "\\end{bmatrix}");
    text = r_left().replace_all(&text, "${1}").into_owned();
    text = r_right().replace_all(&text, "${1}").into_owned();
    text = permutation()
        .replace_all(&text, r"\frac{(${1})!}{((${1})-(${2}))!}")
        .into_owned();
    text = to_remove(&text);
    text = replace_in_latex(&text);
    text = text.replace(['\n', '\t'], " ");
    if !text.contains("matrix") {
        text = fix_command_slash(&text);
    }

    // units
    let t2 = unit_superscript().replace_all(&text, "").into_owned();
    let t2 = py_strip(&t2);
    if !t2.is_empty() && t2 != text {
        text = t2.to_string();
    }
    for _ in 0..2 {
        let t2 = units_regex().replace_all(&text, "${1}").into_owned();
        if !t2.is_empty() && t2 != text {
            text = t2;
        }
    }

    // nits
    if text.starts_with('.') {
        text.insert(0, '0');
    }
    if text == "0.5" {
        text = "\\frac{1}{2}".to_string();
    }

    // malformed operators
    text = fix_malformed_operators(&text);
    text = fix_sqrt(&text);
    text = fix_fracs(&text);
    text = fix_a_slash_b(&text);

    py_strip(&text).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn basics() {
        assert_eq!(normalize_latex("\\dfrac12", BoxedMode::All), "\\frac{1}{2}");
        assert_eq!(normalize_latex("5\\text{ cm}", BoxedMode::All), "5");
        assert_eq!(normalize_latex("\\boxed{3}", BoxedMode::All), "3");
        assert_eq!(normalize_latex("1 and 2", BoxedMode::All), "1, 2");
    }

    /// `normalize_latex` against latex2sympy2_extended's own, on the strings of
    /// `tests/fixtures/math_grader/math_verify_strings.jsonl.zst` (made by
    /// `make_math_verify_strings.py` next to it): equal on every one, in both boxed modes.
    #[test]
    fn normalize_latex_matches_the_python() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/math_grader/math_verify_strings.jsonl.zst"
        );
        let raw = zstd::decode_all(std::fs::read(path).expect("fixture").as_slice()).expect("zstd");
        let text = String::from_utf8(raw).expect("utf-8");
        let mut checked = 0;
        let mut mismatches = Vec::new();
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let record: serde_json::Value = serde_json::from_str(line).expect("json");
            let s = record["s"].as_str().expect("s");
            for (key, mode) in [("norm", BoxedMode::All), ("norm_last", BoxedMode::Last)] {
                let want = record[key].as_str().expect("normalised");
                let got = normalize_latex(s, mode);
                checked += 1;
                if got != want {
                    mismatches.push(format!("{key} {s:?}: python {want:?}, rlvr {got:?}"));
                }
            }
        }
        assert!(checked > 5000, "{checked}");
        assert!(mismatches.is_empty(), "{}", mismatches.join("\n"));
    }
}
