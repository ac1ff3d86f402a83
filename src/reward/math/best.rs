//! Our own grader: accepts every mathematically correct rewriting of the reference answer and
//! nothing else.
//!
//! Conventions (the debatable ones):
//! * **decoration is ignored**: `\text{…}` units after a number, `^\circ`/`\degree` (degrees
//!   are compared as plain numbers, so `30^\circ` = `30` but ≠ `\frac{\pi}{6}`), `\$`, `\%`
//!   (`50\%` = `50`; also = `0.5` = `\frac12` when only one side carries the percent sign),
//!   `\left`/`\right`, spacing, `\displaystyle`, `\dfrac`/`\tfrac`;
//! * **`var = value` is the value**: `x = 5` = `5`; `y = 2x + 3` = `2x + 3`; two equations are
//!   equal when `l₁ − r₁ = k·(l₂ − r₂)` for a constant `k ≠ 0`;
//! * **a one-variable inequality is its interval**: `x \le 3` = `(-\infty, 3]`,
//!   `1 < x \le 2` = `(1, 2]`, `x \in [1, 2]` = `[1, 2]`;
//! * **solution lists are unordered**: a bare list `1, 2` (or `1 \text{ and } 2`), a set
//!   `\{1, 2\}` and `\pm`-expansions compare as sets (duplicates ignored), so `\pm 2` =
//!   `2, -2` = `\{-2, 2\}`; a parenthesised tuple is ordered and is never equal to a set or a
//!   bare list with more than one element;
//! * `(a, b)` equals the open interval `(a, b)`; a union is compared after merging
//!   overlapping/adjacent intervals with numeric ends (`(1,2) \cup [2,3)` = `(1,3)`), in any
//!   order; closed/open ends must agree except at ±∞;
//! * an `n × 1` or `1 × n` matrix equals the `n`-tuple;
//! * numbers are exact: `0.5` = `\frac12`, `0.\overline{3}` = `\frac13`, but `3.14` ≠ `\pi`
//!   and `0.333` ≠ `\frac13`; `\frac{1}{\sqrt2}` = `\frac{\sqrt2}{2}`;
//! * text answers compare case- and space-insensitively; a multiple-choice letter `(A)`,
//!   `\text{(A)}`, `A` are equal;
//! * `\log` is base 10, `e` is Euler's number and `i` the imaginary unit.

use super::expr::{
    Budget, Constant, Expr, Func, Interval, Rational, RelOp, Relation, Value, proportional,
    scalar_equal,
};
use super::latex::{ParseOptions, normalize_text, parse_latex_opts};

/// Whether `given` is a mathematically correct rewriting of `truth`.
pub fn best_equal(given: &str, truth: &str) -> bool {
    let limit = Budget::default().max_input_len;
    if given.len() > limit || truth.len() > limit {
        return given.trim() == truth.trim();
    }
    let (g, t) = (Prepared::new(given), Prepared::new(truth));
    if g.text.is_empty() || t.text.is_empty() || !balanced(&g.text) || !balanced(&t.text) {
        return false;
    }
    if !g.units.is_empty() && !t.units.is_empty() && g.units != t.units {
        return false;
    }
    if g.text == t.text {
        return true;
    }
    // A base-n numeral with its base subscript dropped (`1010` for `1010_{2}`): the question
    // names the base, like a unit. (Not the other way round: `10_{2}` is 2, not the `10` of a
    // decimal truth.)
    if same_digits(&g, &t) {
        return true;
    }
    // A parenthesised single value is a 1-tuple, not a set element.
    if (g.paren_single && t.is_set) || (t.paren_single && g.is_set) {
        return false;
    }
    let parse = |p: &Prepared, radians: bool| {
        let opts = ParseOptions {
            degrees_to_radians: radians,
            ..ParseOptions::default()
        };
        parse_latex_opts(&p.text, &opts).ok()
    };
    let (ga, ta) = (parse(&g, false), parse(&t, false));
    let (Some(ga), Some(ta)) = (ga, ta) else {
        // Unparsable answers: compare as text.
        return !g.key.is_empty() && g.key == t.key;
    };
    let (gp, tp) = (ga.percent || g.percent, ta.percent || t.percent);
    let gu: Vec<String> = g
        .units
        .iter()
        .cloned()
        .chain(units_key(&ga.units))
        .collect();
    let tu: Vec<String> = t
        .units
        .iter()
        .cloned()
        .chain(units_key(&ta.units))
        .collect();
    if !gu.is_empty() && !tu.is_empty() && gu != tu {
        return false;
    }
    if (has_text(&ga.value) || has_text(&ta.value)) && !g.key.is_empty() && g.key == t.key {
        return true;
    }
    let same = |a: &Value, b: &Value| value_eq_ctx(a, b, g.and_joined, t.and_joined) == Some(true);
    if same(&ga.value, &ta.value) {
        return true;
    }
    // Degrees: a degree mark on one side may also be read as radians (`30^\circ` = `π/6`).
    if (ga.degrees || ta.degrees || g.degree_word || t.degree_word)
        && let (Some(gr), Some(tr)) = (parse(&g, true), parse(&t, true))
    {
        let gv = if g.degree_word {
            scale(&gr.value, &degree_factor())
        } else {
            Some(gr.value)
        };
        let tv = if t.degree_word {
            scale(&tr.value, &degree_factor())
        } else {
            Some(tr.value)
        };
        if let (Some(gv), Some(tv)) = (gv, tv)
            && same(&gv, &tv)
        {
            return true;
        }
    }
    // A percent sign on one side only: also read it as a factor 1/100.
    if gp != tp {
        let hundredth = Expr::div(Expr::int(1), Expr::int(100));
        let (gv, tv) = if gp {
            (scale(&ga.value, &hundredth), Some(ta.value.clone()))
        } else {
            (Some(ga.value.clone()), scale(&ta.value, &hundredth))
        };
        if let (Some(gv), Some(tv)) = (gv, tv)
            && same(&gv, &tv)
        {
            return true;
        }
    }
    false
}

fn degree_factor() -> Expr {
    Expr::div(Expr::Const(Constant::Pi), Expr::int(180))
}

/// A scalar answer times `k`.
fn scale(v: &Value, k: &Expr) -> Option<Value> {
    match v {
        Value::Scalar(e) => Some(Value::Scalar(Expr::mul(vec![e.clone(), k.clone()]))),
        _ => None,
    }
}

fn has_text(v: &Value) -> bool {
    match v {
        Value::Text(_) => true,
        Value::List(items) | Value::Set(items) | Value::Tuple(items) => items.iter().any(has_text),
        _ => false,
    }
}

/// Whether `{}` and `()`/`[]` nest properly (a malformed answer is never accepted).
fn balanced(s: &str) -> bool {
    let mut braces = 0i64;
    let mut prev_backslash = false;
    for c in s.chars() {
        if !prev_backslash {
            match c {
                '{' => braces += 1,
                '}' => {
                    braces -= 1;
                    if braces < 0 {
                        return false;
                    }
                }
                _ => {}
            }
        }
        prev_backslash = c == '\\' && !prev_backslash;
    }
    braces == 0
}

/// An answer string prepared for parsing: wrappers, answer prefixes and trailing unit words
/// removed (and remembered).
struct Prepared {
    text: String,
    /// Text comparison key.
    key: String,
    /// Normalised unit words found at the end (`cm`, `square units`, …).
    units: Vec<String>,
    percent: bool,
    degree_word: bool,
    /// `( x )` with no comma inside.
    paren_single: bool,
    /// `\{ … \}`.
    is_set: bool,
    /// Joined with "and" (for lists of inequalities: an intersection).
    and_joined: bool,
    /// The digits (upper-cased) and base of a whole-answer numeral `digits_{base}`.
    numeral: Option<(String, u32)>,
    /// The answer is a bare run of ASCII letters and digits (upper-cased).
    bare: Option<String>,
}

/// `a` is a bare digit string equal to the digits of `b`'s base-n numeral.
fn same_digits(a: &Prepared, b: &Prepared) -> bool {
    match (&a.bare, &b.numeral, &a.numeral) {
        (Some(d), Some((digits, _)), None) => d == digits,
        _ => false,
    }
}

/// Words that are units (dropped, but two different units never match).
const UNIT_WORDS: &[&str] = &[
    "cm",
    "mm",
    "km",
    "m",
    "meter",
    "meters",
    "metre",
    "metres",
    "centimeter",
    "centimeters",
    "millimeter",
    "millimeters",
    "kilometer",
    "kilometers",
    "inch",
    "inches",
    "in",
    "foot",
    "feet",
    "ft",
    "yard",
    "yards",
    "yd",
    "mile",
    "miles",
    "mi",
    "second",
    "seconds",
    "sec",
    "s",
    "minute",
    "minutes",
    "min",
    "hour",
    "hours",
    "hr",
    "hrs",
    "day",
    "days",
    "week",
    "weeks",
    "month",
    "months",
    "year",
    "years",
    "liter",
    "liters",
    "litre",
    "litres",
    "l",
    "ml",
    "milliliter",
    "milliliters",
    "gallon",
    "gallons",
    "kg",
    "g",
    "gram",
    "grams",
    "kilogram",
    "kilograms",
    "pound",
    "pounds",
    "lb",
    "lbs",
    "ounce",
    "ounces",
    "oz",
    "unit",
    "units",
    "square units",
    "square unit",
    "cubic units",
    "sq units",
    "square feet",
    "square inches",
    "square meters",
    "square cm",
    "cubic inches",
    "cubic feet",
    "cubic cm",
    "cubic meters",
    "mph",
    "cents",
    "cent",
    "people",
    "students",
    "apples",
    "ways",
    "times",
    "points",
    "marbles",
    "books",
    "pages",
    "miles per hour",
];

fn unit_key(u: &str) -> String {
    let u = u.trim().to_lowercase();
    let canon = match u.as_str() {
        "meter" | "meters" | "metre" | "metres" => "m",
        "centimeter" | "centimeters" => "cm",
        "millimeter" | "millimeters" => "mm",
        "kilometer" | "kilometers" => "km",
        "inch" | "inches" | "in" => "in",
        "foot" | "feet" | "ft" => "ft",
        "yard" | "yards" | "yd" => "yd",
        "mile" | "miles" | "mi" => "mi",
        "second" | "seconds" | "sec" | "s" => "s",
        "minute" | "minutes" | "min" => "min",
        "hour" | "hours" | "hr" | "hrs" => "h",
        "liter" | "liters" | "litre" | "litres" | "l" => "l",
        "milliliter" | "milliliters" | "ml" => "ml",
        "gram" | "grams" | "g" => "g",
        "kilogram" | "kilograms" | "kg" => "kg",
        "pound" | "pounds" | "lb" | "lbs" => "lb",
        "unit" | "units" => "units",
        "square unit" | "square units" | "sq units" => "units^2",
        "cubic units" => "units^3",
        other => {
            for (prefix, power) in [("square ", 2), ("sq ", 2), ("cubic ", 3)] {
                if let Some(rest) = other.strip_prefix(prefix) {
                    return format!("{}^{power}", unit_key(rest));
                }
            }
            if let Some((base, power)) = other.split_once('^') {
                return format!(
                    "{}^{}",
                    unit_key(base),
                    power.trim_matches(|c| c == '{' || c == '}')
                );
            }
            other.trim_end_matches('s')
        }
    };
    canon.to_string()
}

fn units_key(units: &[String]) -> Vec<String> {
    units.iter().map(|u| unit_key(u)).collect()
}

impl Prepared {
    fn new(s: &str) -> Prepared {
        let mut text = clean(s);
        let (mut percent, mut degree_word) = (false, false);
        let mut units = Vec::new();
        let trimmed = text.trim();
        let bare = (!trimmed.is_empty()
            && trimmed.len() <= 40
            && trimmed.bytes().all(|b| b.is_ascii_alphanumeric()))
        .then(|| trimmed.to_ascii_uppercase());
        // Whole-answer base-n numeral `1010_2`, `FF_{16}`.
        let mut numeral = None;
        if let Some((v, digits, base)) = base_n(&text) {
            text = v;
            numeral = Some((digits, base));
        }
        // Trailing words: units, percent, degrees, dollars.
        if let Some((head, word, power)) = trailing_word(&text) {
            let w = word.to_lowercase();
            let w = w.trim();
            let consumed = if w == "percent" || w == "per cent" {
                percent = true;
                true
            } else if w == "degrees" || w == "degree" || w == "deg" {
                degree_word = true;
                true
            } else if w == "dollars" || w == "dollar" {
                true
            } else if UNIT_WORDS.contains(&w) || w.starts_with("square ") || w.starts_with("cubic ")
            {
                units.push(if power.is_empty() {
                    w.to_string()
                } else {
                    format!("{w}^{power}")
                });
                true
            } else {
                false
            };
            if consumed {
                text = head.to_string();
            }
        }
        let units = units_key(&units);
        let t = text.trim();
        let paren_single = t.starts_with('(')
            && t.ends_with(')')
            && !t.contains(',')
            && t.matches('(').count() == 1;
        let is_set = t.starts_with("\\{") || t.starts_with("\\left\\{");
        let lower = text.to_lowercase();
        let and_joined =
            lower.contains("and") || lower.contains("\\wedge") || lower.contains("\\land");
        let key = text_key(&text);
        Prepared {
            text,
            key,
            units,
            percent,
            degree_word,
            paren_single,
            is_set,
            and_joined,
            numeral,
            bare,
        }
    }
}

/// `head`, `word`, `power` for an answer ending in a plain word (`12 inches`, `5\text{ cm}^2`)
/// after a number-like head.
fn trailing_word(s: &str) -> Option<(&str, String, String)> {
    let t = s.trim_end();
    // Plain trailing words.
    let bytes = t.as_bytes();
    let mut k = t.len();
    while k > 0 && (bytes[k - 1].is_ascii_alphabetic() || bytes[k - 1] == b' ') {
        k -= 1;
    }
    let word = t[k..].trim();
    let head = t[..k].trim_end();
    if !word.is_empty()
        && word.len() >= 2
        && t[k..].starts_with(' ')
        && head
            .chars()
            .last()
            .is_some_and(|c| c.is_ascii_digit() || c == '}' || c == ')')
    {
        return Some((head, word.to_string(), String::new()));
    }
    None
}

/// A whole-answer numeral in base 2–36 written `digits_{base}`: its value in decimal, its
/// digits (upper-cased) and its base.
fn base_n(s: &str) -> Option<(String, String, u32)> {
    let (digits, base) = s.trim().split_once('_')?;
    let base = base.replace("\\text", "").replace("\\mathrm", "");
    let base = base
        .trim()
        .trim_start_matches('{')
        .trim_end_matches('}')
        .trim();
    let base: u32 = base.parse().ok()?;
    if !(2..=36).contains(&base) || base == 10 || digits.is_empty() || digits.len() > 40 {
        return None;
    }
    let digits = digits.trim();
    if !digits.bytes().all(|b| b.is_ascii_alphanumeric()) {
        return None;
    }
    let v = num_bigint::BigInt::parse_bytes(digits.as_bytes(), base)?;
    Some((v.to_string(), digits.to_ascii_uppercase(), base))
}

/// Strips `\boxed{…}`, `$`, `\displaystyle` wrappers, answer prefixes (`\text{The answer is }`)
/// and a trailing full stop.
fn clean(s: &str) -> String {
    let mut s = s.trim().to_string();
    loop {
        let before = s.clone();
        if let Some(inner) = s.strip_prefix("\\boxed{").and_then(|x| x.strip_suffix('}')) {
            s = inner.trim().to_string();
        }
        if let Some(inner) = s.strip_prefix('$').and_then(|x| x.strip_suffix('$')) {
            s = inner.trim().to_string();
        }
        for p in ["\\displaystyle", "\\therefore"] {
            if let Some(inner) = s.strip_prefix(p) {
                s = inner.trim().to_string();
            }
        }
        if let Some(rest) = strip_answer_prefix(&s) {
            s = rest;
        }
        if let Some(inner) = s.strip_suffix('.')
            && (!inner.ends_with(|c: char| c.is_ascii_digit()) || !inner.contains('.'))
        {
            s = inner.trim().to_string();
        }
        // `f(x) = …` names the answer like `f = …`.
        let b = s.as_bytes();
        if b.len() > 5
            && b[0].is_ascii_alphabetic()
            && b[1] == b'('
            && b[2].is_ascii_alphabetic()
            && b[3] == b')'
        {
            let rest = s[4..].trim_start();
            if rest.starts_with('=') && !rest[1..].contains('=') {
                s = format!("{}{}", &s[..1], rest);
            }
        }
        if s == before {
            break;
        }
    }
    s
}

fn strip_answer_prefix(s: &str) -> Option<String> {
    let lower = s.to_lowercase();
    for w in ["\\text{", "\\textbf{", "\\mathrm{", "\\mbox{"] {
        if let Some(rest) = lower.strip_prefix(w) {
            let close = rest.find('}')?;
            let inner = rest[..close].trim().trim_end_matches(':').trim();
            if matches!(
                inner,
                "the answer is" | "answer" | "the final answer is" | "final answer" | "answer is"
            ) {
                return Some(s[w.len() + close + 1..].trim().to_string());
            }
        }
    }
    for p in ["the answer is ", "final answer: ", "answer: "] {
        if lower.starts_with(p) {
            return Some(s[p.len()..].trim().to_string());
        }
    }
    None
}

/// Text key of an answer: `\text`-like wrappers, braces, spaces and case removed.
fn text_key(s: &str) -> String {
    let mut out = s.to_string();
    for w in [
        "\\textbf", "\\text", "\\mathrm", "\\mbox", "\\textit", "\\left", "\\right",
    ] {
        out = out.replace(w, "");
    }
    out.chars()
        .filter(|c| !c.is_whitespace() && *c != '{' && *c != '}')
        .collect::<String>()
        .to_lowercase()
}

/// [`value_equal`] where a list of inequalities is an intersection when its side was joined
/// with "and" (else a union).
fn value_eq_ctx(given: &Value, truth: &Value, g_and: bool, t_and: bool) -> Option<bool> {
    let g = inequality_list(given, g_and).unwrap_or_else(|| given.clone());
    let t = inequality_list(truth, t_and).unwrap_or_else(|| truth.clone());
    value_eq(&g, &t, 0)
}

/// A bare list of one-variable inequalities as the union (or intersection) of their intervals.
fn inequality_list(v: &Value, and: bool) -> Option<Value> {
    let Value::List(items) = v else { return None };
    let mut sets: Vec<Vec<Interval>> = Vec::new();
    for it in items {
        let Value::Relation(r) = it else { return None };
        if r.ops.iter().any(|o| matches!(o, RelOp::Eq | RelOp::Ne)) {
            return None;
        }
        sets.push(relation_interval(r)?);
    }
    let result = if and {
        let mut acc = sets.first()?.clone();
        for s in &sets[1..] {
            acc = intersect(&acc, s)?;
        }
        acc
    } else {
        merge(sets.into_iter().flatten().collect())
    };
    Some(match result.len() {
        1 => Value::Interval(result.into_iter().next()?),
        _ => Value::Union(result.into_iter().map(Value::Interval).collect()),
    })
}

/// Intersection of two merged interval lists with numeric ends.
fn intersect(a: &[Interval], b: &[Interval]) -> Option<Vec<Interval>> {
    let mut out = Vec::new();
    for x in a {
        for y in b {
            let (xl, xh, yl, yh) = (
                end_value(&x.lo)?,
                end_value(&x.hi)?,
                end_value(&y.lo)?,
                end_value(&y.hi)?,
            );
            let (lo, lo_closed) = if xl > yl || (xl == yl && !x.lo_closed) {
                (&x.lo, x.lo_closed)
            } else {
                (&y.lo, y.lo_closed)
            };
            let (hi, hi_closed) = if xh < yh || (xh == yh && !x.hi_closed) {
                (&x.hi, x.hi_closed)
            } else {
                (&y.hi, y.hi_closed)
            };
            let (l, h) = (xl.max(yl), xh.min(yh));
            if l < h || (l == h && lo_closed && hi_closed) {
                out.push(Interval {
                    lo: lo.clone(),
                    hi: hi.clone(),
                    lo_closed,
                    hi_closed,
                });
            }
        }
    }
    Some(merge(out))
}

/// Answer shapes after normalisation.
enum Shape {
    Scalar(Expr),
    Ordered(Vec<Value>),
    Unordered(Vec<Value>),
    Intervals(Vec<Interval>),
    Equation(Expr),
    Matrix(Vec<Vec<Expr>>),
    Text(String),
    Other,
}

fn value_eq(a: &Value, b: &Value, depth: usize) -> Option<bool> {
    if depth > 32 {
        return None;
    }
    if let (Some(x), Some(y)) = (choice_letter(a), choice_letter(b)) {
        return Some(x == y);
    }
    // Two equations compare as equations (`x = 1` ≠ `y = 1`), never by their values.
    if let (Some(x), Some(y)) = (equation(a), equation(b)) {
        return proportional(&x, &y);
    }
    let (sa, sb) = (shape(a), shape(b));
    let eq = |x: &Value, y: &Value| value_eq(x, y, depth + 1) == Some(true);
    match (&sa, &sb) {
        (Shape::Scalar(x), Shape::Scalar(y)) => scalar_equal(x, y),
        (Shape::Equation(x), Shape::Equation(y)) => proportional(x, y),
        (Shape::Ordered(x), Shape::Ordered(y)) => {
            Some(x.len() == y.len() && x.iter().zip(y).all(|(p, q)| eq(p, q)))
        }
        (Shape::Unordered(x), Shape::Unordered(y)) => Some(same_set(x, y, &eq)),
        (Shape::Unordered(x), Shape::Scalar(_)) if x.len() == 1 => value_eq(&x[0], b, depth + 1),
        (Shape::Scalar(_), Shape::Unordered(y)) if y.len() == 1 => value_eq(a, &y[0], depth + 1),
        (Shape::Intervals(x), Shape::Intervals(y)) => {
            Some(x.len() == y.len() && x.iter().zip(y).all(|(p, q)| interval_eq(p, q)))
        }
        (Shape::Matrix(x), Shape::Matrix(y)) => Some(
            x.len() == y.len()
                && x.iter().zip(y).all(|(r, s)| {
                    r.len() == s.len()
                        && r.iter()
                            .zip(s)
                            .all(|(p, q)| scalar_equal(p, q) == Some(true))
                }),
        ),
        (Shape::Matrix(m), Shape::Ordered(v)) | (Shape::Ordered(v), Shape::Matrix(m)) => {
            let flat: Vec<&Expr> = if m.len() == 1 {
                m[0].iter().collect()
            } else if m.iter().all(|r| r.len() == 1) {
                m.iter().filter_map(|r| r.first()).collect()
            } else {
                return Some(false);
            };
            Some(
                flat.len() == v.len()
                    && flat.iter().zip(v).all(
                        |(p, q)| matches!(q, Value::Scalar(e) if scalar_equal(p, e) == Some(true)),
                    ),
            )
        }
        (Shape::Text(x), Shape::Text(y)) => Some(x == y),
        (Shape::Intervals(_), Shape::Ordered(_)) => match tuple_as_interval(b) {
            Some(iv) => value_eq(a, &iv, depth + 1),
            None => Some(false),
        },
        (Shape::Ordered(_), Shape::Intervals(_)) => match tuple_as_interval(a) {
            Some(iv) => value_eq(&iv, b, depth + 1),
            None => Some(false),
        },
        _ => Some(false),
    }
}

/// A multiple-choice letter: `A`, `(A)`, `\text{(A)}`, `\textbf{A}`.
fn choice_letter(v: &Value) -> Option<char> {
    let one = |s: &str| -> Option<char> {
        let s = s
            .trim()
            .trim_start_matches('(')
            .trim_end_matches(')')
            .trim();
        let mut it = s.chars();
        match (it.next(), it.next()) {
            (Some(c), None) if c.is_ascii_alphabetic() => Some(c.to_ascii_lowercase()),
            _ => None,
        }
    };
    match v {
        Value::Text(t) => one(t),
        Value::Scalar(Expr::Sym(s)) => {
            let c = one(s)?;
            // Only capital letters as bare symbols: `x` stays a variable.
            s.chars().next().filter(char::is_ascii_uppercase).map(|_| c)
        }
        _ => None,
    }
}

/// Largest collection compared element by element (quadratic); larger ones must consist of
/// exact numbers (compared sorted) or are undecided.
const MAX_PAIRWISE: usize = 64;

fn same_set(x: &[Value], y: &[Value], eq: &dyn Fn(&Value, &Value) -> bool) -> bool {
    let numbers = |v: &[Value]| -> Option<Vec<Rational>> {
        v.iter()
            .map(|e| match e {
                Value::Scalar(Expr::Num(r)) => Some(r.clone()),
                _ => None,
            })
            .collect()
    };
    if let (Some(mut a), Some(mut b)) = (numbers(x), numbers(y)) {
        a.sort();
        a.dedup();
        b.sort();
        b.dedup();
        return a == b;
    }
    if x.len() > MAX_PAIRWISE || y.len() > MAX_PAIRWISE {
        return false;
    }
    let dedup = |v: &[Value]| -> Vec<Value> {
        let mut out: Vec<Value> = Vec::new();
        for item in v {
            if !out.iter().any(|o| eq(o, item)) {
                out.push(item.clone());
            }
        }
        out
    };
    let (x, y) = (dedup(x), dedup(y));
    x.len() == y.len()
        && x.iter().all(|p| y.iter().any(|q| eq(p, q)))
        && y.iter().all(|q| x.iter().any(|p| eq(p, q)))
}

fn is_infinite(e: &Expr) -> bool {
    e.has_infinity()
}

fn interval_eq(p: &Interval, q: &Interval) -> bool {
    let ends = scalar_eq_or_same(&p.lo, &q.lo) && scalar_eq_or_same(&p.hi, &q.hi);
    let lo_ok = p.lo_closed == q.lo_closed || is_infinite(&p.lo);
    let hi_ok = p.hi_closed == q.hi_closed || is_infinite(&p.hi);
    ends && lo_ok && hi_ok
}

fn scalar_eq_or_same(a: &Expr, b: &Expr) -> bool {
    a == b || scalar_equal(a, b) == Some(true)
}

/// `l = r` as `l − r`.
fn equation(v: &Value) -> Option<Expr> {
    match v {
        Value::Relation(Relation { terms, ops }) => match (terms.as_slice(), ops.as_slice()) {
            ([Value::Scalar(l), Value::Scalar(r)], [RelOp::Eq]) => {
                Some(Expr::sub(l.clone(), r.clone()))
            }
            _ => None,
        },
        _ => None,
    }
}

/// `sym = value` → the value.
fn strip_var_eq(v: &Value) -> Option<&Value> {
    match v {
        Value::Relation(Relation { terms, ops }) => match (terms.as_slice(), ops.as_slice()) {
            ([Value::Scalar(Expr::Sym(_)), value], [RelOp::Eq]) => Some(value),
            _ => None,
        },
        _ => None,
    }
}

fn neg_inf() -> Expr {
    Expr::neg(Expr::Const(Constant::Infinity))
}

/// A relation in one bare variable as an interval (`x < 3`, `1 \le x < 2`, `x \in [a, b]`).
fn relation_interval(r: &Relation) -> Option<Vec<Interval>> {
    let sym = |v: &Value| matches!(v, Value::Scalar(Expr::Sym(_)));
    let scal = |v: &Value| match v {
        Value::Scalar(e) if !matches!(e, Expr::Sym(_)) => Some(e.clone()),
        _ => None,
    };
    let inf = Expr::Const(Constant::Infinity);
    match (r.terms.as_slice(), r.ops.as_slice()) {
        ([x, set], [RelOp::In]) if sym(x) => intervals_of(set),
        ([Value::Scalar(Expr::Func(Func::Abs, a)), c], [op])
            if a.len() == 1 && matches!(a[0], Expr::Sym(_)) =>
        {
            // `|x| < c`, `|x| \ge c`.
            let c = scal(c)?;
            let closed = matches!(op, RelOp::Le | RelOp::Ge);
            match op {
                RelOp::Lt | RelOp::Le => Some(vec![Interval {
                    lo: Expr::neg(c.clone()),
                    hi: c,
                    lo_closed: closed,
                    hi_closed: closed,
                }]),
                RelOp::Gt | RelOp::Ge => Some(vec![
                    Interval {
                        lo: neg_inf(),
                        hi: Expr::neg(c.clone()),
                        lo_closed: false,
                        hi_closed: closed,
                    },
                    Interval {
                        lo: c,
                        hi: inf,
                        lo_closed: closed,
                        hi_closed: false,
                    },
                ]),
                _ => None,
            }
        }
        ([x, c], [RelOp::Ne]) if sym(x) => {
            let c = scal(c)?;
            Some(vec![
                Interval {
                    lo: neg_inf(),
                    hi: c.clone(),
                    lo_closed: false,
                    hi_closed: false,
                },
                Interval {
                    lo: c,
                    hi: inf,
                    lo_closed: false,
                    hi_closed: false,
                },
            ])
        }
        ([x, c], [op]) if sym(x) => {
            let c = scal(c)?;
            Some(vec![match op {
                RelOp::Lt => Interval {
                    lo: neg_inf(),
                    hi: c,
                    lo_closed: false,
                    hi_closed: false,
                },
                RelOp::Le => Interval {
                    lo: neg_inf(),
                    hi: c,
                    lo_closed: false,
                    hi_closed: true,
                },
                RelOp::Gt => Interval {
                    lo: c,
                    hi: inf,
                    lo_closed: false,
                    hi_closed: false,
                },
                RelOp::Ge => Interval {
                    lo: c,
                    hi: inf,
                    lo_closed: true,
                    hi_closed: false,
                },
                _ => return None,
            }])
        }
        ([c, x], [op]) if sym(x) => {
            let flipped = match op {
                RelOp::Lt => RelOp::Gt,
                RelOp::Le => RelOp::Ge,
                RelOp::Gt => RelOp::Lt,
                RelOp::Ge => RelOp::Le,
                _ => return None,
            };
            relation_interval(&Relation {
                terms: vec![x.clone(), c.clone()],
                ops: vec![flipped],
            })
        }
        ([a, x, b], [o1, o2]) if sym(x) => {
            let (a, b) = (scal(a)?, scal(b)?);
            let lt = |o: &RelOp| matches!(o, RelOp::Lt | RelOp::Le);
            let gt = |o: &RelOp| matches!(o, RelOp::Gt | RelOp::Ge);
            let closed = |o: &RelOp| matches!(o, RelOp::Le | RelOp::Ge);
            if lt(o1) && lt(o2) {
                Some(vec![Interval {
                    lo: a,
                    hi: b,
                    lo_closed: closed(o1),
                    hi_closed: closed(o2),
                }])
            } else if gt(o1) && gt(o2) {
                Some(vec![Interval {
                    lo: b,
                    hi: a,
                    lo_closed: closed(o2),
                    hi_closed: closed(o1),
                }])
            } else {
                None
            }
        }
        _ => None,
    }
}

/// The intervals of an interval-like value, merged and sorted when the ends are numbers.
fn intervals_of(v: &Value) -> Option<Vec<Interval>> {
    let mut out = Vec::new();
    match v {
        Value::Interval(i) => out.push(i.clone()),
        Value::Union(parts) => {
            for p in parts {
                out.extend(intervals_of(p)?);
            }
        }
        Value::Relation(r) => out.extend(relation_interval(r)?),
        Value::Tuple(_) => match tuple_as_interval(v)? {
            Value::Interval(i) => out.push(i),
            _ => return None,
        },
        _ => return None,
    }
    Some(merge(out))
}

/// Numeric value of an interval end (±∞ included).
fn end_value(e: &Expr) -> Option<f64> {
    if *e == Expr::Const(Constant::Infinity) {
        return Some(f64::INFINITY);
    }
    if *e == neg_inf() {
        return Some(f64::NEG_INFINITY);
    }
    let b = super::expr::Budget::default();
    let v = e.eval(&|_| num_complex::Complex64::new(f64::NAN, 0.0), &b)?;
    (v.im.abs() < 1e-12 && v.re.is_finite()).then_some(v.re)
}

fn merge(mut v: Vec<Interval>) -> Vec<Interval> {
    if v.len() < 2 {
        return v;
    }
    let keys: Option<Vec<(f64, f64)>> = v
        .iter()
        .map(|i| Some((end_value(&i.lo)?, end_value(&i.hi)?)))
        .collect();
    let Some(keys) = keys else { return v };
    let mut idx: Vec<usize> = (0..v.len()).collect();
    idx.sort_by(|&a, &b| keys[a].0.total_cmp(&keys[b].0));
    let mut out: Vec<(Interval, f64)> = Vec::new();
    for k in idx {
        let cur = v[k].clone();
        let (lo, hi) = keys[k];
        if let Some((last, last_hi)) = out.last_mut() {
            let touch = lo < *last_hi
                || (scalar_eq_or_same(&cur.lo, &last.hi) && (cur.lo_closed || last.hi_closed));
            if touch {
                if hi > *last_hi || (hi == *last_hi && cur.hi_closed) {
                    last.hi = cur.hi.clone();
                    last.hi_closed = cur.hi_closed || (hi == *last_hi && last.hi_closed);
                    *last_hi = hi;
                }
                continue;
            }
        }
        out.push((cur, hi));
    }
    v = out.into_iter().map(|(i, _)| i).collect();
    v
}

fn shape(v: &Value) -> Shape {
    if let Some(inner) = strip_var_eq(v) {
        // `x = 5` is 5, `x = 1, 2`… handled by the list case.
        return shape(inner);
    }
    match v {
        Value::Scalar(e) => Shape::Scalar(e.clone()),
        // `(a, b)` is also an open interval: see `tuple_as_interval`.
        Value::Tuple(items) => Shape::Ordered(items.clone()),
        Value::Interval(_) | Value::Union(_) => {
            intervals_of(v).map_or(Shape::Other, Shape::Intervals)
        }
        Value::Set(items) | Value::List(items) => Shape::Unordered(
            items
                .iter()
                .map(|x| strip_var_eq(x).cloned().unwrap_or_else(|| x.clone()))
                .flat_map(flatten_pm)
                .collect(),
        ),
        Value::PlusMinus(a, b) => Shape::Unordered(vec![(**a).clone(), (**b).clone()]),
        Value::EmptySet => Shape::Unordered(Vec::new()),
        Value::Relation(r) => {
            if let Some(iv) = relation_interval(r) {
                return Shape::Intervals(merge(iv));
            }
            match (r.terms.as_slice(), r.ops.as_slice()) {
                ([Value::Scalar(l), Value::Scalar(rhs)], [RelOp::Eq]) => {
                    Shape::Equation(Expr::sub(l.clone(), rhs.clone()))
                }
                _ => Shape::Other,
            }
        }
        Value::Matrix(m) => Shape::Matrix(m.clone()),
        Value::Text(t) => Shape::Text(normalize_text(t)),
    }
}

fn flatten_pm(v: Value) -> Vec<Value> {
    match v {
        Value::PlusMinus(a, b) => vec![*a, *b],
        other => vec![other],
    }
}

/// Tuples of two against intervals: `(a, b)` is also the open interval.
fn tuple_as_interval(v: &Value) -> Option<Value> {
    match v {
        Value::Tuple(items) if items.len() == 2 => match (&items[0], &items[1]) {
            (Value::Scalar(lo), Value::Scalar(hi)) => Some(Value::Interval(Interval {
                lo: lo.clone(),
                hi: hi.clone(),
                lo_closed: false,
                hi_closed: false,
            })),
            _ => None,
        },
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::best_equal;

    #[test]
    fn accepts_rewritings() {
        let yes = [
            (r"(x-1)(x+1)", r"x^2-1"),
            (r"\sqrt{12}", r"2\sqrt{3}"),
            (
                r"\frac{-1 \pm \sqrt5}{2}",
                r"\frac{-1+\sqrt5}{2}, \frac{-1-\sqrt5}{2}",
            ),
            (r"10\%", "0.1"),
            (
                r"\begin{bmatrix}1 & 2\end{bmatrix}",
                r"\begin{pmatrix}1 & 2\end{pmatrix}",
            ),
            (r"\frac{1+i}{\sqrt2}", r"\frac{\sqrt2}{2}+\frac{\sqrt2}{2}i"),
            (r"e^{i\pi}", "-1"),
            (r"\frac{\log 8}{\log 2}", "3"),
            (r"[2, \infty)", r"x \ge 2"),
            (r"(-\infty, 1) \cup (1, \infty)", r"x \neq 1"),
            (r"\{1, 2, 3\}", r"\{3, 2, 1\}"),
            (r"\varnothing", r"\emptyset"),
            (r"\$1{,}000", "1000"),
            (r"0.\overline{142857}", r"\frac17"),
            (r"\frac{2}{4}", r"\frac12"),
            (r"3\sqrt{2}+\sqrt{8}", r"5\sqrt2"),
            (r"\dfrac{x+1}{2}", r"\frac{1}{2}x+\frac12"),
            (r"(3, -\frac{1}{2})", r"\left(3, -0.5\right)"),
            (r"\text{(B)}", "B"),
            (r"y = 3x + 1", r"3x - y + 1 = 0"),
            (r"2^{-1}", "0.5"),
            (r"\sqrt[3]{54}", r"3\sqrt[3]{2}"),
            (r"\binom{5}{2}", "10"),
            (r"\tan\frac{\pi}{4}", "1"),
        ];
        // A base subscript may be dropped from the given answer.
        for (g, t) in [
            ("1010", "1010_{2}"),
            ("FF", r"FF_{16}"),
            ("10", "1010_2"),
            ("71", r"71_{\text{8}}"),
        ] {
            assert!(best_equal(g, t), "should accept {g} for {t}");
        }
        for (g, t) in [
            ("1011", "1010_{2}"),
            ("1010_{3}", "1010_{2}"),
            ("11", "1010_2"),
            ("10_{2}", "10"),
        ] {
            assert!(!best_equal(g, t), "should reject {g} for {t}");
        }
        for (g, t) in yes {
            assert!(best_equal(g, t), "should accept {g} for {t}");
            assert!(best_equal(t, g), "should accept {t} for {g}");
        }
    }

    #[test]
    fn rejects_wrong_answers() {
        let no = [
            ("3.14", r"\pi"),
            ("3.1415926535897932", r"\pi"),
            ("0.333", r"\frac13"),
            ("1.414", r"\sqrt2"),
            ("(2, 1)", "(1, 2)"),
            ("(1, 2)", r"\{1, 2\}"),
            ("[1, 2)", "[1, 2]"),
            ("(1, 2]", "(1, 2)"),
            (r"\{1\}", r"\{1, 2\}"),
            ("1", "1, 2"),
            ("x+1", "x-1"),
            (r"\sqrt{x^2}", "x"),
            ("30", r"\frac{\pi}{6}"),
            (r"5\text{ mm}", r"5\text{ cm}"),
            ("y = 1", "x = 1"),
            (r"2\sqrt[3]{4}", r"\sqrt[3]{24}"),
            (r"\frac{1}{2}", r"\frac{1}{3}"),
            ("-2", "2"),
            (r"\pm 2", "2"),
            (r"x > 2", r"x \ge 2"),
            ("", "0"),
            ("{", "{"),
            (r"\infty", r"-\infty"),
            ("10^{10^{10}}", "10^{10^{10}}+1"),
        ];
        for (g, t) in no {
            assert!(!best_equal(g, t), "should reject {g} for {t}");
        }
    }
}

#[cfg(test)]
mod doc_examples {
    #[test]
    fn example_1() {
        use crate::reward::math::best::best_equal;
        assert!(best_equal(r"\dfrac{\sqrt{2}}{2}", r"\frac{1}{\sqrt2}"));
        assert!(best_equal(r"x = 5", "5"));
        assert!(best_equal(r"\{3, 1\}", "1, 3"));
        assert!(best_equal(r"30^\circ", r"\frac{\pi}{6}"));
        assert!(!best_equal("3.14", r"\pi"));
        assert!(!best_equal("(2, 1)", "(1, 2)"));
        assert!(!best_equal("[1, 2)", "[1, 2]"));
        assert!(!best_equal(r"5 \text{ mm}", r"5 \text{ cm}"));
    }
}
