//! The cookbook's `grade_answer_math_verify(given, truth)`: wrap each string in `$…$`,
//! `math_verify.parse` each, then `math_verify.verify(given_parsed, truth_parsed)` — the
//! *given* answer is passed as math-verify's gold, the truth as its target.
//!
//! `parse` returns up to two items: the first extracted value that converts, and the
//! string of the first extraction tried (its normalised LaTeX). `verify` accepts when any
//! (gold, target) pair matches: value against value by math-verify's comparison rules,
//! string against string by equality.

use num_bigint::BigInt;
use num_complex::Complex64;
use num_traits::{Signed, ToPrimitive, Zero};

mod normalize;
mod parse;

use crate::python::{is_py_space as py_isspace, py_strip};
use normalize::{BoxedMode, normalize_latex};
use parse::{Rel, Sx, V, latex2sympy, symbol_name, value_only_symbols};

/// One item of `parse`'s answer.
#[derive(Debug, Clone)]
pub enum Item {
    /// A converted value.
    Value(V),
    /// The fallback string.
    Str(String),
}

/// `grade_answer_math_verify(given, truth)`. Inputs over 4 KiB are not equal to
/// anything (math-verify's own 5-second parse timeout gives up on most of them).
pub(crate) fn grade_math_verify(given: &str, truth: &str) -> bool {
    if given.len() > MAX_INPUT || truth.len() > MAX_INPUT {
        return false;
    }
    let g = parse(&wrap(given));
    let t = parse(&wrap(truth));
    verify_items(&g, &t)
}

/// The longest input parsed, in bytes.
const MAX_INPUT: usize = 4_096;

fn wrap(s: &str) -> String {
    if !s.starts_with('$') && !s.ends_with('$') {
        format!("${s}$")
    } else {
        s.to_string()
    }
}

/// `verify(gold, target)` on parsed lists.
pub fn verify_items(gold: &[Item], target: &[Item]) -> bool {
    for g in gold {
        for t in target {
            let ok = match (g, t) {
                (Item::Value(a), Item::Value(b)) => expr_eq(a, b, 0),
                (Item::Str(a), Item::Str(b)) => {
                    let (a, b) = (py_strip(a), py_strip(b));
                    !a.is_empty() && !b.is_empty() && a == b
                }
                _ => false,
            };
            if ok {
                return true;
            }
        }
    }
    false
}

// ---------------------------------------------------------------------------
// Extraction (math_verify.parse with the default Latex + Expr configs)
// ---------------------------------------------------------------------------

#[derive(Debug, Clone)]
enum Cand {
    /// LaTeX environments: (content, percent, boxed_group).
    Latex(Vec<(String, bool, bool)>),
    /// A plain number: (number string, percent).
    Number(String, bool),
    /// A plain arithmetic expression.
    Expr(String),
}

/// Nesting depth of brackets (`(` after `-` not counted) from which math-verify's ANTLR prediction (exponential in the
/// depth of parentheses) hits `parse`'s 5 s timeout, which makes `parse` return `[]`.
const PAREN_TIMEOUT_DEPTH: usize = 25;

fn paren_depth(w: &str) -> usize {
    let (mut d, mut m) = (0usize, 0usize);
    let mut prev = 0u8;
    for b in w.bytes() {
        let p = prev;
        prev = b;
        match b {
            b'(' if p == b'-' => d += 1,
            b'(' | b'[' | b'{' => {
                d += 1;
                m = m.max(d);
            }
            b')' | b']' | b'}' => d = d.saturating_sub(1),
            _ => {}
        }
    }
    m
}

/// `math_verify.parse(pred)`.
pub fn parse(w: &str) -> Vec<Item> {
    if paren_depth(w) >= PAREN_TIMEOUT_DEPTH {
        return Vec::new();
    }
    let mut pg: AnchoredGroups = anchored_groups(w);
    if w.contains("\\boxed{") {
        match pg.iter_mut().find(|g| g.0 == 50) {
            Some(g) => g.1.extend(boxed_candidates(w)),
            None => pg.push((50, boxed_candidates(w))),
        }
    }
    let mut g300 = latex_env_matches(w);
    g300.extend(expr_matches(w));
    pg.push((300, g300));
    pg.sort_by_key(|g| g.0);
    let groups: Vec<Vec<(usize, usize, Cand)>> = pg.into_iter().map(|g| g.1).collect();

    let mut fallback: Option<String> = None;
    for mut g in groups {
        // rightmost end first, then leftmost start (stable)
        g.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        for (_, _, c) in g {
            if let Cand::Number(n, _) = &c
                && !n.is_ascii()
            {
                return Vec::new();
            }
            let (val, s) = extract(&c);
            if fallback.is_none() && !s.is_empty() {
                fallback = Some(s);
            }
            if let Some(v) = val {
                let mut out = vec![Item::Value(v)];
                if let Some(f) = fallback {
                    out.push(Item::Str(f));
                }
                return out;
            }
        }
    }
    fallback.map(|f| vec![Item::Str(f)]).unwrap_or_default()
}

fn extract(c: &Cand) -> (Option<V>, String) {
    match c {
        Cand::Latex(groups) => {
            let mut vals = Vec::new();
            let mut strs = Vec::new();
            for (content, pct, boxed) in groups {
                let mode = if *boxed {
                    BoxedMode::Last
                } else {
                    BoxedMode::All
                };
                let norm = normalize_latex(content, mode);
                let v = parse_latex_cached(&norm).and_then(|v| {
                    if *pct {
                        match v {
                            V::S(s) => Some(V::S(Sx::Pct(Box::new(s)))),
                            _ => None,
                        }
                    } else {
                        Some(v)
                    }
                });
                strs.push(norm);
                vals.push(v);
            }
            if vals.len() > 1 && vals.iter().all(Option::is_some) {
                let mut all = Vec::new();
                for v in vals.into_iter().flatten() {
                    match v {
                        V::Set(xs) => all.extend(xs),
                        v => all.push(v),
                    }
                }
                return (Some(V::Set(all)), strs.join(" and "));
            }
            let s = strs.into_iter().next().unwrap_or_default();
            (vals.into_iter().next().flatten(), s)
        }
        Cand::Number(n, pct) => {
            let v = number_value(n).map(|x| if *pct { Sx::Pct(Box::new(x)) } else { x });
            (v.map(V::S), n.clone())
        }
        Cand::Expr(e) => {
            let text = e.replace('\n', " ").replace('^', "**");
            (py_arith(&text).map(V::S), e.clone())
        }
    }
}

fn number_value(n: &str) -> Option<Sx> {
    if n.contains('.') {
        let x = n.parse::<f64>().ok()?;
        let _ = x;
        latex2sympy(n, true).and_then(|v| match v {
            V::S(s) => Some(s),
            _ => None,
        })
    } else {
        Some(Sx::Int(n.parse::<BigInt>().ok()?))
    }
}

/// `parse_latex_cached`: latex2sympy, then the last equation of a chain when that fails.
fn parse_latex_cached(latex: &str) -> Option<V> {
    let is_real = !should_treat_as_complex(latex);
    if let Some(v) = latex2sympy(latex, is_real) {
        return Some(v);
    }
    if !latex.contains(',') && !latex.contains(';') {
        let parts = split_eq(latex);
        if parts.len() > 2 {
            let last = parts[parts.len() - 1];
            return latex2sympy(last, !should_treat_as_complex(last));
        }
    }
    None
}

/// `(?<!\\|\<|\!|\>)=` split.
fn split_eq(s: &str) -> Vec<&str> {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut last = 0;
    for i in 0..b.len() {
        if b[i] == b'=' && !(i > 0 && matches!(b[i - 1], b'\\' | b'<' | b'!' | b'>')) {
            out.push(&s[last..i]);
            last = i + 1;
        }
    }
    out.push(&s[last..]);
    out
}

/// math-verify's `should_treat_as_complex`: the string names ℂ, a standalone `i` (`\bi\b`:
/// `2 i`, `1+i`, `\frac{3}{2}i`, but not `2i` or `3i+1`), `\i`, `\imath`, `\text{i}`, or a
/// matrix/complex operator. Such a string is parsed with non-real symbols.
fn should_treat_as_complex(s: &str) -> bool {
    const LITERALS: &[&str] = &[
        "\\mathbb{C}",
        "\\text{i}",
        "\\mathrm{i}",
        "\\det",
        "\\operatorname{tr}",
        "\\operatorname{rank}",
        "\\text{rank}",
        "\\arg{",
        "\\Re{",
        "\\Im{",
        "\\operatorname{Re}",
        "\\operatorname{Im}",
        "\\text{Re}",
        "\\text{Im}",
    ];
    if LITERALS.iter().any(|l| s.contains(l)) {
        return true;
    }
    // Python's `\b` with Unicode word characters.
    let word = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || c == '_');
    let at_boundary_word = |pat: &str, need_left: bool| {
        s.match_indices(pat).any(|(k, m)| {
            let before = s[..k].chars().next_back();
            let after = s[k + m.len()..].chars().next();
            (!need_left || !word(before)) && !word(after)
        })
    };
    // `\bi\b`, `\\i\b`, `\\imath\b`
    at_boundary_word("i", true)
        || at_boundary_word("\\imath", false)
        || at_boundary_word("\\i", false)
}

// --- LaTeX environment scanning (make_latex_env_pattern, plain context) ---

fn is_s(c: char) -> bool {
    py_isspace(c)
}

/// Tries the environment alternatives at byte `p`; returns (content, end).
fn env_at(w: &str, p: usize, plain: bool) -> Option<(String, usize)> {
    let b = w.as_bytes();
    if p >= b.len() || !w.is_char_boundary(p) {
        return None;
    }
    let prev = if p > 0 {
        w[..p].chars().next_back()
    } else {
        None
    };
    // 1. $$ … $$
    if w[p..].starts_with("$$") && prev != Some('\\') {
        let mut q = p + 2;
        loop {
            if q > p + 2 && b[q..].starts_with(b"$$") && b[q - 1] != b'\\' {
                return Some((w[p + 2..q].to_string(), q + 2));
            }
            if q >= b.len() {
                break;
            }
            if b[q] == b'$' && b.get(q + 1) == Some(&b'$') {
                break;
            }
            q += 1;
        }
    }
    // 2. \[ … \]
    if w[p..].starts_with("\\[") && prev != Some('\\') {
        let mut q = p + 2;
        while q < b.len() {
            if q > p + 2 && b[q..].starts_with(b"\\]") && b[q - 1] != b'\\' {
                return Some((w[p + 2..q].to_string(), q + 2));
            }
            if b[q..].starts_with(b"\\]") {
                break;
            }
            q += 1;
        }
    }
    // 3. $ … $
    if b[p] == b'$'
        && prev != Some('\\')
        && !prev.is_some_and(|c| c.is_numeric() && c.is_ascii_digit() || c.is_numeric())
    {
        let mut q = p + 1;
        while q < b.len() {
            if q > p + 1 && b[q] == b'$' && b[q - 1] != b'\\' {
                return Some((w[p + 1..q].to_string(), q + 1));
            }
            if b[q] == b'\n' || (b[q] == b'$' && q == p + 1) {
                break;
            }
            q += 1;
        }
    }
    // 4. \( … \)
    if w[p..].starts_with("\\(") && prev != Some('\\') {
        let mut q = p + 2;
        while q < b.len() {
            if q > p + 2 && b[q..].starts_with(b"\\)") && b[q - 1] != b'\\' {
                return Some((w[p + 2..q].to_string(), q + 2));
            }
            if b[q] == b'\n' || b[q..].starts_with(b"\\)") {
                break;
            }
            q += 1;
        }
    }
    // 5. \s[ … ]\s
    if let Some(c) = w[p..].chars().next()
        && is_s(c)
    {
        let o = p + c.len_utf8();
        if b.get(o) == Some(&b'[') {
            let mut q = o + 1;
            while q < b.len() {
                if q > o + 1 && b[q] == b']' && w[q + 1..].chars().next().is_some_and(is_s) {
                    let e = q + 1 + w[q + 1..].chars().next().map_or(0, char::len_utf8);
                    return Some((w[o + 1..q].to_string(), e));
                }
                if matches!(b[q], b'\n' | b']' | b'[') {
                    break;
                }
                q += 1;
            }
        }
    }
    // 6. -?\frac{num}{num}
    if plain {
        let q = if b[p] == b'-' { p + 1 } else { p };
        if w[q..].starts_with("\\frac{") {
            let r = q + 6;
            if let Some(e1) = simple_number(w, r)
                && w[e1..].starts_with("}{")
                && let Some(e2) = simple_number(w, e1 + 2)
                && b.get(e2) == Some(&b'}')
            {
                return Some((w[p..e2 + 1].to_string(), e2 + 1));
            }
        }
    }
    None
}

/// `-?\d+(?:[.,]\d+)?` at `p`; returns the end.
fn simple_number(w: &str, p: usize) -> Option<usize> {
    let b = w.as_bytes();
    let mut i = p;
    if b.get(i) == Some(&b'-') {
        i += 1;
    }
    let s = i;
    while i < b.len() && b[i].is_ascii_digit() {
        i += 1;
    }
    if i == s {
        return None;
    }
    if i + 1 < b.len() && (b[i] == b'.' || b[i] == b',') && b[i + 1].is_ascii_digit() {
        i += 1;
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
    }
    Some(i)
}

/// `\s*(?:\\?%|[Pp]ercent|[Pp]ercentage|[Pp]ct)?` at `p`: (end, percent?).
fn percent_suffix(w: &str, p: usize) -> (usize, bool) {
    let mut q = p;
    for c in w[p..].chars() {
        if is_s(c) {
            q += c.len_utf8();
        } else {
            break;
        }
    }
    for lit in ["\\%", "%", "Percent", "percent", "Pct", "pct"] {
        if w[q..].starts_with(lit) {
            return (q + lit.len(), true);
        }
    }
    (q, false)
}

fn skip_s(w: &str, p: usize) -> usize {
    let mut q = p;
    for c in w[p..].chars() {
        if is_s(c) {
            q += c.len_utf8();
        } else {
            break;
        }
    }
    q
}

/// The environment pattern with its up to five `, and`/`or`-joined followers, at `p`.
fn env_chain_at(w: &str, p: usize) -> Option<(usize, Cand)> {
    {
        if let Some((content, e)) = env_at(w, p, true) {
            let (mut end, pct) = percent_suffix(w, e);
            let mut groups = vec![(content, pct, false)];
            for _ in 0..5 {
                let q = skip_s(w, end);
                let mut r = None;
                for sep in [",and", "and", ",or", "or", ","] {
                    if w[q..].starts_with(sep) {
                        r = Some(q + sep.len());
                        break;
                    }
                }
                let Some(r) = r else { break };
                let r = skip_s(w, r);
                if r >= w.len() {
                    break;
                }
                match env_at(w, r, true) {
                    Some((c2, e2)) => {
                        let (e3, pct2) = percent_suffix(w, e2);
                        groups.push((c2, pct2, false));
                        end = e3;
                    }
                    None => break,
                }
            }
            return Some((end, Cand::Latex(groups)));
        }
    }
    None
}

fn latex_env_matches(w: &str) -> Vec<(usize, usize, Cand)> {
    let mut out = Vec::new();
    let mut p = 0;
    while p < w.len() {
        if !w.is_char_boundary(p) {
            p += 1;
            continue;
        }
        if let Some((end, c)) = env_chain_at(w, p) {
            out.push((p, end, c));
            p = end.max(p + 1);
        } else {
            p += 1;
        }
    }
    out
}

/// Anchored LaTeX matches: `prefix` found by regex, then lazily up to `window` chars
/// before the environment (`window` 0: right at the prefix end).
fn anchored_latex(
    w: &str,
    prefix: &regex::Regex,
    window: usize,
    hope: bool,
) -> Vec<(usize, usize, Cand)> {
    let mut out = Vec::new();
    let mut from = 0;
    while from <= w.len() {
        let Some(m) = prefix.find_at(w, from) else {
            break;
        };
        let mut found = None;
        let mut q = m.end();
        for _ in 0..=window {
            if let Some((end, c)) = env_chain_at(w, q) {
                let mut end = end;
                if hope {
                    let mut r = end;
                    if w[r..].starts_with('.') {
                        r += 1;
                    }
                    if let Some(c) = w[r..].chars().next().filter(|c| is_s(*c)) {
                        r += c.len_utf8();
                    }
                    if !w[r..].starts_with("I hope") {
                        break;
                    }
                    end = r + 6;
                }
                found = Some((m.start(), end, c));
                break;
            }
            match w[q..].chars().next() {
                Some(c) => q += c.len_utf8(),
                None => break,
            }
        }
        match found {
            Some(f) => {
                from = f.1.max(m.start() + 1);
                out.push(f);
            }
            None => from = m.start() + 1,
        }
        while from < w.len() && !w.is_char_boundary(from) {
            from += 1;
        }
    }
    out
}

fn boxed_candidates(w: &str) -> Vec<(usize, usize, Cand)> {
    let mut out = Vec::new();
    // an inline/display env whose content holds \boxed{…}
    for m in latex_env_matches(w) {
        if let Cand::Latex(groups) = &m.2
            && groups.iter().any(|(c, _, _)| {
                c.contains("\\boxed{") && c[c.find("\\boxed{").unwrap_or(0)..].contains('}')
            })
        {
            out.push(m);
        }
    }
    // \boxed{.+} (greedy to the last `}`)
    if let Some(s) = w.find("\\boxed{")
        && let Some(e) = w.rfind('}')
        && e > s + 7
    {
        out.push((
            s,
            e + 1,
            Cand::Latex(vec![(w[s..=e].to_string(), false, true)]),
        ));
    }
    out
}

// --- plain number / expression regexes ---

struct ExprRes {
    expr: regex::Regex,
    num: regex::Regex,
    /// priority, regex over expr-or-number, needs the `(?!\s*=)` check
    anchored: Vec<(u32, regex::Regex, bool)>,
    latex_prefixes: Vec<(u32, regex::Regex, usize, bool)>,
}

fn expr_res() -> &'static ExprRes {
    use std::sync::OnceLock;
    static RES: OnceLock<ExprRes> = OnceLock::new();
    RES.get_or_init(|| {
        let s = crate::python::PY_SPACE_CLASS;
        let ops = r"\+\-\*×/\^\(\)÷";
        let all = format!(r"[\d\.{s}{ops}]");
        let expr = format!(r"(?P<expr>-?\(?-?\d{all}*[{ops}]{all}+\)?)");
        let prefix = format!(r"(?:^|{s}|=)(?:\*\*)?");
        let suffix = format!(r"(?:\*\*)?(?:\.|,|:|{s}|\)|\$|$)");
        let cur = regex::escape("$€£¥₹₽₪₩₫฿₡₢₣₤₥₦₧₨₩₪₫₭₮₯₰₱₲₳₴₵₶₷₸₹₺₻₼₽₾₿");
        let number = format!(
            r"(?:(?P<i1>-?[1-9]\d{{0,2}}(?:[ ,]\d{{3}})+)(?P<d1>\.\d+)?|(?P<i2>-?\d+)(?P<d2>[.,]\d+)|(?P<d3>\.\d+)|(?P<i3>-?\d+))(?P<pct>{s}*(?:%|[Pp]ercent|{s}*[Pp]ercentage|{s}*[Pp]ct))?"
        );
        let mk = |p: &str| regex::Regex::new(p).unwrap_or_else(|_| regex::Regex::new("$^").expect("trivial"));
        let ewa = format!("{prefix}{expr}{suffix}");
        let nwa = format!("{prefix}[{cur}]?{number}");
        let eon = format!("(?:{ewa}|{nwa})");
        let anchored = vec![
            (0, mk(&format!(r"(?i:final answer is):?{s}*{eon}\.?{s}?I hope")), false),
            (50, mk(&format!(r"(?i:final answer.{{0,100}}?){s}+is:?{eon}")), false),
            (100, mk(&format!(r"(?i:answer):(?:.{{0,100}}={s}*|.{{0,50}}?){eon}")), true),
            (200, mk(&format!(r"(?i:answer)(?:.{{0,100}}={s}*|.{{0,50}}?){eon}")), true),
        ];
        let latex_prefixes = vec![
            (0, mk(&format!(r"(?i:final answer is):?{s}*")), 0, true),
            (50, mk(&format!(r"(?s)(?i:final answer.{{0,100}}?){s}+is:?{s}*")), 0, false),
            (100, mk(r"(?i:answer):"), 50, false),
            (200, mk(r"(?i:answer)"), 50, false),
        ];
        ExprRes { expr: mk(&ewa), num: mk(&nwa), anchored, latex_prefixes }
    })
}

fn number_cand(c: &regex::Captures) -> Cand {
    let int = ["i1", "i2", "i3"]
        .iter()
        .find_map(|k| c.name(k))
        .map_or("", |x| x.as_str());
    let dec = ["d1", "d2", "d3"]
        .iter()
        .find_map(|k| c.name(k))
        .map_or("", |x| x.as_str());
    let int: String = int.chars().filter(|&ch| ch != ',' && ch != ' ').collect();
    let int = if int.trim_start_matches('0').is_empty() {
        "0".to_string()
    } else {
        int.trim_start_matches('0').to_string()
    };
    let dec = dec.replace(',', ".");
    Cand::Number(format!("{int}{dec}"), c.name("pct").is_some())
}

/// The answer-anchored groups (priorities 0, 50, 100, 200), LaTeX and plain.
/// Candidate matches grouped by the priority of their anchored pattern.
type AnchoredGroups = Vec<(u32, Vec<(usize, usize, Cand)>)>;

fn anchored_groups(w: &str) -> AnchoredGroups {
    let res = expr_res();
    let mut out: AnchoredGroups = Vec::new();
    let lower = w.to_lowercase();
    if !lower.contains("answer") {
        return out;
    }
    for (prio, pre, window, hope) in &res.latex_prefixes {
        let v = anchored_latex(w, pre, *window, *hope);
        out.push((*prio, v));
    }
    for (prio, re, look) in &res.anchored {
        let mut v = Vec::new();
        for c in re.captures_iter(w) {
            let Some(m) = c.get(0) else { continue };
            if *look {
                let rest = w[m.end()..].trim_start_matches(py_isspace);
                if rest.starts_with('=') {
                    continue;
                }
            }
            let cand = match c.name("expr") {
                Some(e) => Cand::Expr(e.as_str().to_string()),
                None => number_cand(&c),
            };
            v.push((m.start(), m.end(), cand));
        }
        if let Some(g) = out.iter_mut().find(|g| g.0 == *prio) {
            g.1.extend(v);
        }
    }
    out
}

fn expr_matches(w: &str) -> Vec<(usize, usize, Cand)> {
    let res = expr_res();
    let (expr_re, num_re) = (&res.expr, &res.num);
    let mut out = Vec::new();
    for c in expr_re.captures_iter(w) {
        let (Some(m), Some(e)) = (c.get(0), c.name("expr")) else {
            continue;
        };
        out.push((m.start(), m.end(), Cand::Expr(e.as_str().to_string())));
    }
    for c in num_re.captures_iter(w) {
        let Some(m) = c.get(0) else { continue };
        out.push((m.start(), m.end(), number_cand(&c)));
    }
    out
}

/// sympy `parse_expr` on `[\d.\s+\-*/()]` text (`**` for powers).
fn py_arith(s: &str) -> Option<Sx> {
    struct Pp<'a> {
        b: &'a [u8],
        i: usize,
        d: usize,
    }
    impl Pp<'_> {
        fn ws(&mut self) {
            while self.i < self.b.len() && self.b[self.i].is_ascii_whitespace() {
                self.i += 1;
            }
        }
        fn peek(&mut self) -> Option<u8> {
            self.ws();
            self.b.get(self.i).copied()
        }
        fn sum(&mut self) -> Option<Sx> {
            self.d += 1;
            if self.d > 100 {
                return None;
            }
            let mut l = self.term()?;
            while let Some(c) = self.peek() {
                if c == b'+' || c == b'-' {
                    self.i += 1;
                    let r = self.term()?;
                    l = if c == b'+' {
                        Sx::Add(vec![l, r])
                    } else {
                        Sx::Add(vec![l, Sx::Mul(vec![Sx::Int((-1).into()), r])])
                    };
                } else {
                    break;
                }
            }
            self.d -= 1;
            Some(l)
        }
        fn term(&mut self) -> Option<Sx> {
            let mut l = self.unary()?;
            loop {
                match self.peek() {
                    Some(b'*') if self.b.get(self.i + 1) != Some(&b'*') => {
                        self.i += 1;
                        let r = self.unary()?;
                        l = Sx::Mul(vec![l, r]);
                    }
                    Some(b'/') => {
                        self.i += 1;
                        let r = self.unary()?;
                        l = Sx::Mul(vec![
                            l,
                            Sx::Pow(Box::new(r), Box::new(Sx::Int((-1).into()))),
                        ]);
                    }
                    _ => break,
                }
            }
            Some(l)
        }
        fn unary(&mut self) -> Option<Sx> {
            match self.peek() {
                Some(b'-') => {
                    self.i += 1;
                    let x = self.unary()?;
                    Some(Sx::Mul(vec![Sx::Int((-1).into()), x]))
                }
                Some(b'+') => {
                    self.i += 1;
                    self.unary()
                }
                _ => self.power(),
            }
        }
        fn power(&mut self) -> Option<Sx> {
            let base = self.atom()?;
            if self.peek() == Some(b'*') && self.b.get(self.i + 1) == Some(&b'*') {
                self.i += 2;
                let e = self.unary()?;
                return Some(Sx::Pow(Box::new(base), Box::new(e)));
            }
            Some(base)
        }
        fn atom(&mut self) -> Option<Sx> {
            match self.peek()? {
                b'(' => {
                    self.i += 1;
                    let e = self.sum()?;
                    if self.peek()? != b')' {
                        return None;
                    }
                    self.i += 1;
                    Some(e)
                }
                c if c.is_ascii_digit() || c == b'.' => {
                    let s = self.i;
                    while self.i < self.b.len()
                        && (self.b[self.i].is_ascii_digit() || self.b[self.i] == b'.')
                    {
                        self.i += 1;
                    }
                    let t = std::str::from_utf8(&self.b[s..self.i]).ok()?;
                    if t.matches('.').count() > 1 || t == "." {
                        return None;
                    }
                    if t.contains('.') {
                        latex2sympy(t, true)
                            .and_then(|v| if let V::S(x) = v { Some(x) } else { None })
                    } else {
                        if t.len() > 1 && t.starts_with('0') && t.bytes().any(|c| c != b'0') {
                            return None; // leading zeros are a Python syntax error
                        }
                        Some(Sx::Int(t.parse().ok()?))
                    }
                }
                _ => None,
            }
        }
    }
    let mut p = Pp {
        b: s.as_bytes(),
        i: 0,
        d: 0,
    };
    let e = p.sum()?;
    p.ws();
    (p.i == s.len()).then_some(e)
}

// ---------------------------------------------------------------------------
// Numeric evaluation
// ---------------------------------------------------------------------------

fn hash(s: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in s.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

fn sym_value(name: &str, point: u64) -> Complex64 {
    let h = hash(name) ^ point.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    let x = (h % 100_000) as f64 / 100_000.0;
    // math-verify's symbols are real, not positive: half the points are negative, so that
    // what sympy cannot simplify for a real symbol (√(4x²) = 2x) is not equal here either.
    let sign = if point.is_multiple_of(2) { 1.0 } else { -1.0 };
    Complex64::new(sign * (0.37 + 1.9 * x), 0.0)
}

fn big_f64(n: &BigInt) -> f64 {
    n.to_f64().unwrap_or(f64::NAN)
}

fn ratio_f64(p: &BigInt, q: &BigInt) -> f64 {
    let (pb, qb) = (p.bits(), q.bits());
    if pb < 1000 && qb < 1000 {
        return big_f64(p) / big_f64(q);
    }
    let shift = pb.max(qb).saturating_sub(900);
    big_f64(&(p >> shift)) / big_f64(&(q >> shift))
}

/// Numeric value at evaluation point `pt` (symbols get fixed pseudo-random values).
fn eval(x: &Sx, pt: u64, depth: usize) -> Option<Complex64> {
    if depth > 200 {
        return None;
    }
    let d = depth + 1;
    let r = |v: f64| Some(Complex64::new(v, 0.0));
    match x {
        Sx::Int(n) => r(big_f64(n)),
        Sx::Rat(p, q) | Sx::Float(p, q) => r(ratio_f64(p, q)),
        Sx::Sym(s) => Some(sym_value(s, pt)),
        Sx::E => r(std::f64::consts::E),
        Sx::Pi => r(std::f64::consts::PI),
        Sx::EulerGamma => r(0.577_215_664_901_532_9),
        Sx::I => Some(Complex64::new(0.0, 1.0)),
        Sx::Inf => r(f64::INFINITY),
        Sx::NegInf => r(f64::NEG_INFINITY),
        Sx::Zoo | Sx::Nan => None,
        Sx::Add(xs) => {
            let mut s = Complex64::new(0.0, 0.0);
            for x in xs {
                s += eval(x, pt, d)?;
            }
            Some(s)
        }
        Sx::Mul(xs) => {
            let mut s = Complex64::new(1.0, 0.0);
            for x in xs {
                s *= eval(x, pt, d)?;
            }
            Some(s)
        }
        Sx::Pow(b, e) => {
            let bv = eval(b, pt, d)?;
            let ev = eval(e, pt, d)?;
            if ev.im == 0.0 && ev.re.fract() == 0.0 && ev.re.abs() < 1e6 {
                if bv == Complex64::new(0.0, 0.0) && ev.re < 0.0 {
                    return None;
                }
                return Some(bv.powi(ev.re as i32));
            }
            if bv.im == 0.0 && bv.re >= 0.0 && ev.im == 0.0 {
                return r(bv.re.powf(ev.re));
            }
            Some(bv.powc(ev))
        }
        Sx::Pct(x) => Some(eval(x, pt, d)? / 100.0),
        Sx::Fn(name, args) => {
            let a: Vec<Complex64> = args.iter().map(|x| eval(x, pt, d)).collect::<Option<_>>()?;
            let a0 = *a.first()?;
            let v = match name.as_str() {
                "sin" => a0.sin(),
                "cos" => a0.cos(),
                "tan" => a0.tan(),
                "cot" => 1.0 / a0.tan(),
                "sec" => 1.0 / a0.cos(),
                "csc" => 1.0 / a0.sin(),
                "asin" => a0.asin(),
                "acos" => a0.acos(),
                "atan" => a0.atan(),
                "acot" => (1.0 / a0).atan(),
                "asec" => (1.0 / a0).acos(),
                "acsc" => (1.0 / a0).asin(),
                "sinh" => a0.sinh(),
                "cosh" => a0.cosh(),
                "tanh" => a0.tanh(),
                "asinh" => a0.asinh(),
                "acosh" => a0.acosh(),
                "atanh" => a0.atanh(),
                "exp" => a0.exp(),
                "log" => a0.ln() / a.get(1)?.ln(),
                "Abs" => Complex64::new(a0.norm(), 0.0),
                "floor" => Complex64::new(a0.re.floor(), 0.0),
                "ceiling" => Complex64::new(a0.re.ceil(), 0.0),
                "factorial" => {
                    if a0.im == 0.0 && a0.re >= 0.0 && a0.re.fract() == 0.0 && a0.re <= 170.0 {
                        Complex64::new((1..=a0.re as u64).map(|k| k as f64).product(), 0.0)
                    } else {
                        // sympy's factorial of a non-integer or a symbol is Γ(z + 1).
                        Some(super::expr::gamma(a0 + 1.0)).filter(|v| v.is_finite())?
                    }
                }
                "binomial" => {
                    let (n, k) = (a0.re, a.get(1)?.re);
                    if k.fract() != 0.0 || !(0.0..=170.0).contains(&k) {
                        return None;
                    }
                    let mut v = 1.0;
                    for j in 0..k as u64 {
                        v *= (n - j as f64) / (j as f64 + 1.0);
                    }
                    Complex64::new(v, 0.0)
                }
                "Max" => Complex64::new(
                    a.iter().map(|z| z.re).fold(f64::NEG_INFINITY, f64::max),
                    0.0,
                ),
                "Min" => Complex64::new(a.iter().map(|z| z.re).fold(f64::INFINITY, f64::min), 0.0),
                "Mod" => Complex64::new(a0.re.rem_euclid(a.get(1)?.re), 0.0),
                "gcd" | "lcm" => {
                    let mut acc: Option<i128> = None;
                    for z in &a {
                        if z.im != 0.0 || z.re.fract() != 0.0 || z.re.abs() > 1e15 {
                            return None;
                        }
                        let v = z.re as i128;
                        acc = Some(match acc {
                            None => v.abs(),
                            Some(x) => {
                                let g = gcd_i(x, v);
                                if name == "gcd" {
                                    g
                                } else if g == 0 {
                                    0
                                } else {
                                    (x / g * v).abs()
                                }
                            }
                        });
                    }
                    Complex64::new(acc? as f64, 0.0)
                }
                _ => {
                    // undefined function: a fixed pseudo-random smooth function
                    let h = (hash(name) % 1000) as f64 / 1000.0 + 0.5;
                    let s: Complex64 = a.iter().enumerate().map(|(k, z)| z * (k as f64 + h)).sum();
                    (s * h).sin() + h
                }
            };
            Some(v)
        }
    }
}

fn gcd_i(a: i128, b: i128) -> i128 {
    let (mut a, mut b) = (a.abs(), b.abs());
    while b != 0 {
        let t = a % b;
        a = b;
        b = t;
    }
    a
}

/// A real approximation of a constant scalar (used for interval emptiness).
pub fn approx_real(x: &Sx) -> Option<f64> {
    if has_symbols(x) {
        return None;
    }
    let v = eval(x, 0, 0)?;
    (v.im.abs() < 1e-12).then_some(v.re)
}

fn has_symbols(x: &Sx) -> bool {
    match x {
        Sx::Sym(_) => true,
        Sx::Add(xs) | Sx::Mul(xs) => xs.iter().any(has_symbols),
        Sx::Fn(n, xs) => n.starts_with('\u{2}') || xs.iter().any(has_symbols),
        Sx::Pow(a, b) => has_symbols(a) || has_symbols(b),
        Sx::Pct(a) => has_symbols(a),
        _ => false,
    }
}

fn close(a: Complex64, b: Complex64) -> bool {
    close_tol(a, b, 1e-9)
}

fn close_tol(a: Complex64, b: Complex64, tol: f64) -> bool {
    if !(a.re.is_finite() && a.im.is_finite() && b.re.is_finite() && b.im.is_finite()) {
        return a == b;
    }
    let d = (a - b).norm();
    d <= tol * (1.0 + a.norm().max(b.norm()))
}

/// `simplify(a - b) == 0` / `(a - b).evalf() == 0`, numerically.
fn numerically_equal(a: &Sx, b: &Sx) -> bool {
    numerically_equal_tol(a, b, 1e-9)
}

fn numerically_equal_tol(a: &Sx, b: &Sx, tol: f64) -> bool {
    if is_matrix(a) || is_matrix(b) {
        return false;
    }
    let mut any = false;
    for pt in 0..4u64 {
        match (eval(a, pt, 0), eval(b, pt, 0)) {
            (Some(x), Some(y)) => {
                if !close_tol(x, y, tol) {
                    return false;
                }
                any = true;
            }
            _ => return false,
        }
    }
    any
}

fn is_matrix(x: &Sx) -> bool {
    matches!(x, Sx::Fn(n, _) if n == "\u{1}matrix")
}

// ---------------------------------------------------------------------------
// Comparison (math_verify.grader.sympy_expr_eq and friends)
// ---------------------------------------------------------------------------

fn is_relation(v: &V) -> bool {
    match v {
        V::R(..) => true,
        V::And(xs) => !xs.is_empty() && xs.iter().all(|x| matches!(x, V::R(..))),
        _ => false,
    }
}

fn is_equation(v: &V) -> bool {
    match v {
        V::R(Rel::Eq, ..) => true,
        V::And(xs) => !xs.is_empty() && xs.iter().all(|x| matches!(x, V::R(Rel::Eq, ..))),
        _ => false,
    }
}

fn is_assignment(v: &V) -> bool {
    match v {
        V::R(Rel::Eq, l, _) => value_only_symbols(l),
        V::And(xs) => {
            !xs.is_empty()
                && xs.iter().all(|x| matches!(x, V::R(Rel::Eq, ..)))
                && matches!(&xs[0], V::R(_, l, _) if value_only_symbols(l))
        }
        _ => false,
    }
}

fn first_rel(v: &V) -> &V {
    match v {
        V::And(xs) => xs.first().unwrap_or(v),
        v => v,
    }
}

fn last_rel(v: &V) -> &V {
    match v {
        V::And(xs) => xs.last().map_or(v, last_rel),
        v => v,
    }
}

fn lhs(v: &V) -> Option<&V> {
    match v {
        V::R(_, l, _) => Some(l),
        _ => None,
    }
}

fn rhs(v: &V) -> Option<&V> {
    match v {
        V::R(_, _, r) => Some(r),
        _ => None,
    }
}

fn is_set_like(v: &V) -> bool {
    matches!(
        v,
        V::Set(_) | V::Tuple(_) | V::Interval { .. } | V::SetOp(..) | V::Named(_) | V::Empty
    )
}

fn is_sympy_set(v: &V) -> bool {
    matches!(
        v,
        V::Set(_) | V::Interval { .. } | V::SetOp(..) | V::Named(_) | V::Empty
    )
}

/// `sympy_expr_eq(gold, pred)` with math-verify's defaults (strict, no set↔relation for pred).
pub fn expr_eq(gold: &V, pred: &V, depth: usize) -> bool {
    if depth > 50 {
        return false;
    }
    let d = depth + 1;
    let ga = is_assignment(gold);
    let pa = is_assignment(pred);
    let ge = is_equation(gold);
    let pe = is_equation(pred);
    let mut gold = gold.clone();
    let mut pred = pred.clone();
    if ga && let (Some(l), Some(r)) = (lhs(first_rel(&gold)), rhs(last_rel(&gold))) {
        gold = V::R(Rel::Eq, Box::new(l.clone()), Box::new(r.clone()));
    }
    if pa && let (Some(l), Some(r)) = (lhs(first_rel(&pred)), rhs(last_rel(&pred))) {
        pred = V::R(Rel::Eq, Box::new(l.clone()), Box::new(r.clone()));
    }
    if pe && !ge {
        if let Some(r) = rhs(last_rel(&pred)) {
            pred = r.clone();
        }
    } else if ga
        && !pe
        && let Some(r) = rhs(last_rel(&gold))
    {
        gold = r.clone();
    }
    if is_relation(&gold)
        && is_sympy_set(&pred)
        && let Some(s) = relation_as_set(&gold)
    {
        gold = s;
    }
    // sympy_str_eq: nan / zoo raise
    if matches!(gold, V::S(Sx::Nan | Sx::Zoo)) {
        return false;
    }
    if structurally_equal(&gold, &pred) {
        return true;
    }
    if is_relation(&gold) && is_relation(&pred) {
        return compare_relational(&gold, &pred, d);
    }
    if is_set_like(&gold) || is_set_like(&pred) {
        return compare_sets(&gold, &pred, d);
    }
    let (V::S(g), V::S(p)) = (&gold, &pred) else {
        return false;
    };
    if matches!(g, Sx::Sym(_)) || matches!(p, Sx::Sym(_)) {
        return compare_symbols(g, p);
    }
    if is_matrix(g) && is_matrix(p) {
        return matrix_eq(g, p);
    }
    if numeric_eq(g, p) {
        return true;
    }
    symbolic_eq(g, p)
}

fn structurally_equal(a: &V, b: &V) -> bool {
    match (a, b) {
        (V::Set(x), V::Set(y)) => {
            // FiniteSet equality ignores order and duplicates
            x.iter().all(|e| y.iter().any(|f| structurally_equal(e, f)))
                && y.iter().all(|e| x.iter().any(|f| structurally_equal(e, f)))
        }
        (V::S(x), V::S(y)) => sx_struct_eq(x, y),
        _ => a == b,
    }
}

fn sx_struct_eq(a: &Sx, b: &Sx) -> bool {
    match (a, b) {
        (Sx::Float(p, q), Sx::Int(n)) | (Sx::Int(n), Sx::Float(p, q)) => {
            q == &BigInt::from(1) && p == n
        }
        (Sx::Float(p, q), Sx::Rat(r, s)) | (Sx::Rat(r, s), Sx::Float(p, q)) => {
            // binary-exact floats equal the rational
            p == r
                && q == s
                && q.trailing_zeros()
                    .is_some_and(|z| (q >> z) == BigInt::from(1))
        }
        _ => a == b,
    }
}

fn matrix_rows(m: &Sx) -> Vec<Vec<Sx>> {
    match m {
        Sx::Fn(_, rows) => rows
            .iter()
            .map(|r| match r {
                Sx::Fn(_, xs) => xs.clone(),
                _ => vec![],
            })
            .collect(),
        _ => vec![],
    }
}

fn matrix_eq(a: &Sx, b: &Sx) -> bool {
    let (ra, rb) = (matrix_rows(a), matrix_rows(b));
    if ra.len() != rb.len() || ra.iter().zip(&rb).any(|(x, y)| x.len() != y.len()) {
        return false;
    }
    let elementwise = ra
        .iter()
        .flatten()
        .zip(rb.iter().flatten())
        .all(|(x, y)| numeric_eq(x, y));
    elementwise
        || ra
            .iter()
            .flatten()
            .zip(rb.iter().flatten())
            .all(|(x, y)| numerically_equal(x, y))
}

fn atomic_number(x: &Sx) -> bool {
    matches!(
        x,
        Sx::Int(_) | Sx::Rat(..) | Sx::Float(..) | Sx::Inf | Sx::NegInf | Sx::Zoo | Sx::Nan
    )
}

fn pct_inner(x: &Sx) -> Option<&Sx> {
    match x {
        Sx::Pct(i) => Some(i),
        _ => None,
    }
}

fn atomic_or_pct(x: &Sx, f: fn(&Sx) -> bool) -> bool {
    f(x) || pct_inner(x).is_some_and(f)
}

fn is_float(x: &Sx) -> bool {
    matches!(x, Sx::Float(..))
}

fn is_int(x: &Sx) -> bool {
    matches!(x, Sx::Int(_))
}

fn round6(x: &Sx) -> Option<i128> {
    if has_symbols(x) {
        return None;
    }
    let v = eval(x, 0, 0)?;
    if v.im.abs() > 1e-12 || !v.re.is_finite() {
        return None;
    }
    let r = (v.re * 1e6).round();
    (r.abs() < 1e30).then_some(r as i128)
}

#[derive(PartialEq)]
enum Rounded {
    Int(BigInt),
    Float(i128),
}

fn round6_typed(x: &Sx) -> Option<Rounded> {
    if let Some((p, q)) = exact_eval(x, 0)
        && q == BigInt::from(1)
    {
        return Some(Rounded::Int(p));
    }
    round6(x).map(Rounded::Float)
}

/// Exact rational value when sympy's automatic evaluation gives a Rational.
fn exact_eval(x: &Sx, d: usize) -> Option<(BigInt, BigInt)> {
    if d > 60 {
        return None;
    }
    let norm = |p: BigInt, q: BigInt| -> Option<(BigInt, BigInt)> {
        if q.is_zero() {
            return None;
        }
        let g = num_integer::Integer::gcd(&p, &q);
        let (mut p, mut q) = (p / &g, q / &g);
        if q.is_negative() {
            p = -p;
            q = -q;
        }
        Some((p, q))
    };
    match x {
        Sx::Int(n) => Some((n.clone(), BigInt::from(1))),
        Sx::Rat(p, q) => Some((p.clone(), q.clone())),
        Sx::Pct(i) => {
            let (p, q) = exact_eval(i, d + 1)?;
            norm(p, q * 100)
        }
        Sx::Add(xs) => {
            let (mut p, mut q) = (BigInt::from(0), BigInt::from(1));
            for t in xs {
                let (a, b) = exact_eval(t, d + 1)?;
                let np = p * &b + a * &q;
                let nq = q * b;
                (p, q) = norm(np, nq)?;
                if p.bits() > 4096 || q.bits() > 4096 {
                    return None;
                }
            }
            Some((p, q))
        }
        Sx::Mul(xs) => {
            let (mut p, mut q) = (BigInt::from(1), BigInt::from(1));
            for t in xs {
                let (a, b) = exact_eval(t, d + 1)?;
                (p, q) = norm(p * a, q * b)?;
                if p.bits() > 4096 || q.bits() > 4096 {
                    return None;
                }
            }
            Some((p, q))
        }
        Sx::Pow(b, e) => {
            let (bp, bq) = exact_eval(b, d + 1)?;
            let (ep, eq) = exact_eval(e, d + 1)?;
            if eq != BigInt::from(1) {
                return None;
            }
            let k = ep.to_i64()?;
            if (bp.bits() + bq.bits()).max(1) * k.unsigned_abs() > 4096 {
                return None;
            }
            let (p, q) = (
                num_traits::pow(bp, k.unsigned_abs() as usize),
                num_traits::pow(bq, k.unsigned_abs() as usize),
            );
            if k >= 0 { norm(p, q) } else { norm(q, p) }
        }
        _ => None,
    }
}

fn exact_rational(x: &Sx) -> Option<(BigInt, BigInt)> {
    match x {
        Sx::Int(n) => Some((n.clone(), BigInt::from(1))),
        Sx::Rat(p, q) => Some((p.clone(), q.clone())),
        Sx::Pct(i) => {
            let (p, q) = exact_rational(i)?;
            Some((p, q * 100))
        }
        _ => None,
    }
}

/// `sympy_numeric_eq` for scalars.
fn numeric_eq(a: &Sx, b: &Sx) -> bool {
    if atomic_or_pct(a, atomic_number) || atomic_or_pct(b, atomic_number) {
        if atomic_or_pct(a, is_float) || atomic_or_pct(b, is_float) {
            // `a.round(6) == b.round(6)`: an exact integer stays an Integer, which never
            // equals a rounded Float.
            return match (round6_typed(a), round6_typed(b)) {
                (Some(x), Some(y)) => x == y,
                _ => false,
            };
        }
        if atomic_or_pct(a, is_int) && atomic_or_pct(b, is_int) {
            let x = pct_inner(a).unwrap_or(a);
            let y = pct_inner(b).unwrap_or(b);
            return x == y;
        }
        if let (Some((p, q)), Some((r, s))) = (exact_rational(a), exact_rational(b)) {
            return p * s == r * q;
        }
        if matches!(a, Sx::Inf | Sx::NegInf) || matches!(b, Sx::Inf | Sx::NegInf) {
            return a == b || (eval(a, 0, 0).is_some() && eval(a, 0, 0) == eval(b, 0, 0));
        }
        if let Some(v) = float_arith_eq(a, b) {
            return v;
        }
        if let Some(v) = exact_eq(a, b) {
            return v;
        }
        return !has_symbols(a) && !has_symbols(b) && numerically_equal(a, b);
    }
    if let Some(v) = float_arith_eq(a, b) {
        return v;
    }
    if let Some(v) = exact_eq(a, b) {
        return v;
    }
    // (a - b).evalf(chop) == 0: only without free symbols
    !has_symbols(a) && !has_symbols(b) && numerically_equal(a, b)
}

/// Two float-free expressions that sympy's automatic evaluation turns into rationals
/// (`\frac{1}{10^{20}}`, `2^{100}+1`) are equal only when the rationals are.
fn exact_eq(a: &Sx, b: &Sx) -> Option<bool> {
    if contains_float(a) || contains_float(b) {
        return None;
    }
    Some(exact_eval(a, 0)? == exact_eval(b, 0)?)
}

/// A number as sympy's automatic evaluation leaves it: exact rational, or a 53-bit Float.
#[derive(Clone)]
enum Folded {
    Exact(BigInt, BigInt),
    Float(f64),
}

impl Folded {
    fn to_f64(&self) -> f64 {
        match self {
            Folded::Float(x) => *x,
            Folded::Exact(p, q) => exact_f64(p, q),
        }
    }
}

/// `p/q` correctly rounded when both fit 53 bits (else closely).
fn exact_f64(p: &BigInt, q: &BigInt) -> f64 {
    if q == &BigInt::from(1) {
        // Rust's float parsing rounds correctly (num-bigint's conversion may not).
        return if p.bits() < 2000 {
            p.to_string().parse().unwrap_or(f64::NAN)
        } else {
            f64::NAN
        };
    }
    ratio_f64(p, q)
}

/// Folds a number-only expression of integers, rationals and Floats with `+ × ^integer` the
/// way sympy evaluates it: exact while no Float is involved, then in 53-bit (IEEE double)
/// arithmetic, an exact operand rounded to 53 bits first. `None` for anything else.
fn fold_float_arith(x: &Sx, d: usize) -> Option<Folded> {
    if d > 60 {
        return None;
    }
    let combine = |xs: &[Sx], add: bool| -> Option<Folded> {
        let mut acc: Option<Folded> = None;
        for t in xs {
            let v = fold_float_arith(t, d + 1)?;
            acc = Some(match (acc, v) {
                (None, v) => v,
                (Some(Folded::Exact(a, b)), Folded::Exact(c, e)) => {
                    let sum = if add {
                        Sx::Add(vec![rat_sx(a, b), rat_sx(c, e)])
                    } else {
                        Sx::Mul(vec![rat_sx(a, b), rat_sx(c, e)])
                    };
                    let (p, q) = exact_eval(&sum, 0)?;
                    Folded::Exact(p, q)
                }
                (Some(a), v) => {
                    let (x, y) = (a.to_f64(), v.to_f64());
                    Folded::Float(if add { x + y } else { x * y })
                }
            });
        }
        acc
    };
    match x {
        Sx::Int(n) => Some(Folded::Exact(n.clone(), BigInt::from(1))),
        Sx::Rat(p, q) => Some(Folded::Exact(p.clone(), q.clone())),
        Sx::Float(p, q) => Some(Folded::Float(ratio_f64(p, q))),
        Sx::Add(xs) => combine(xs, true),
        Sx::Mul(xs) => combine(xs, false),
        Sx::Pct(i) => combine(
            &[(**i).clone(), Sx::Rat(BigInt::from(1), BigInt::from(100))],
            false,
        ),
        Sx::Pow(b, e) => {
            let Folded::Exact(ep, eq) = fold_float_arith(e, d + 1)? else {
                return None;
            };
            if eq != BigInt::from(1) {
                return None;
            }
            match fold_float_arith(b, d + 1)? {
                Folded::Exact(..) => exact_eval(x, d + 1).map(|(p, q)| Folded::Exact(p, q)),
                Folded::Float(f) => {
                    let k = ep.to_i32().filter(|k| k.unsigned_abs() <= 1024)?;
                    Some(Folded::Float(f.powi(k)))
                }
            }
        }
        _ => None,
    }
}

fn rat_sx(p: BigInt, q: BigInt) -> Sx {
    if q == BigInt::from(1) {
        Sx::Int(p)
    } else {
        Sx::Rat(p, q)
    }
}

/// Equality of two Float-containing number-only expressions as math-verify decides it:
/// `simplify(a - b) == 0` (the 53-bit results are equal) or `(a - b).evalf(chop=True) == 0`
/// (the difference is below 2⁻⁴⁹ in absolute value). So `60.2 \times 10^{22}` ≠
/// `6.02 \times 10^{23}` (different roundings), `1.2 \times 10^{-20}` = `1.3 \times 10^{-20}`.
/// `None` when an expression is not of that kind.
fn float_arith_eq(a: &Sx, b: &Sx) -> Option<bool> {
    if !contains_float(a) && !contains_float(b) {
        return None;
    }
    let (x, y) = (
        fold_float_arith(a, 0)?.to_f64(),
        fold_float_arith(b, 0)?.to_f64(),
    );
    if !x.is_finite() || !y.is_finite() {
        return None;
    }
    Some(x == y || (x - y).abs() < 2f64.powi(-49))
}

fn symbolic_eq(a: &Sx, b: &Sx) -> bool {
    if let Some(v) = float_arith_eq(a, b) {
        return v;
    }
    if let Some(v) = exact_eq(a, b) {
        return v;
    }
    if contains_float(a) || contains_float(b) {
        // simplify keeps float residues: only an (almost) exact match is zero
        return numerically_equal_tol(a, b, 1e-13);
    }
    numerically_equal(a, b)
}

fn contains_float(x: &Sx) -> bool {
    match x {
        Sx::Float(..) => true,
        Sx::Add(xs) | Sx::Mul(xs) | Sx::Fn(_, xs) => xs.iter().any(contains_float),
        Sx::Pow(a, b) => contains_float(a) || contains_float(b),
        Sx::Pct(a) => contains_float(a),
        _ => false,
    }
}

fn symbol_concat(x: &Sx) -> Option<String> {
    match x {
        Sx::Mul(xs) => {
            let mut s = String::new();
            for a in xs {
                match a {
                    Sx::Sym(n) => s.push_str(symbol_name(n)),
                    Sx::E => s.push('e'),
                    _ => return None,
                }
            }
            Some(s)
        }
        _ => None,
    }
}

fn compare_symbols(g: &Sx, p: &Sx) -> bool {
    // Names as sympy prints them (real and non-real symbols alike).
    let named = |x: &Sx| match x {
        Sx::Sym(n) => Sx::Sym(symbol_name(n).to_string()),
        other => other.clone(),
    };
    let (g, p) = (&named(g), &named(p));
    if let Sx::Sym(n) = g
        && n.to_lowercase() == "e"
        && *p == Sx::E
    {
        return true;
    }
    if let Sx::Sym(n) = p
        && n.to_lowercase() == "e"
        && *g == Sx::E
    {
        return true;
    }
    if let (Sx::Sym(n), Some(c)) = (g, symbol_concat(p)) {
        return n.to_lowercase() == c.to_lowercase();
    }
    if let (Sx::Sym(n), Some(c)) = (p, symbol_concat(g)) {
        return n.to_lowercase() == c.to_lowercase();
    }
    if let (Sx::Sym(a), Sx::Sym(b)) = (g, p) {
        let a = if a.chars().count() > 1 {
            a.to_lowercase()
        } else {
            a.clone()
        };
        let b = if b.chars().count() > 1 {
            b.to_lowercase()
        } else {
            b.clone()
        };
        return a == b;
    }
    // str(gold) == str(pred): a symbol named like a printed number
    match (g, p) {
        (Sx::Sym(n), Sx::Int(i)) | (Sx::Int(i), Sx::Sym(n)) => *n == i.to_string(),
        _ => false,
    }
}

fn rel_diff(v: &V) -> Option<Sx> {
    match v {
        V::R(_, l, r) => match (&**l, &**r) {
            (V::S(a), V::S(b)) => Some(Sx::Add(vec![
                a.clone(),
                Sx::Mul(vec![Sx::Int((-1).into()), b.clone()]),
            ])),
            _ => None,
        },
        _ => None,
    }
}

fn inverse(r: Rel) -> Rel {
    match r {
        Rel::Lt => Rel::Gt,
        Rel::Gt => Rel::Lt,
        Rel::Le => Rel::Ge,
        Rel::Ge => Rel::Le,
        Rel::Eq => Rel::Eq,
        Rel::Ne => Rel::Ne,
    }
}

fn compare_relational(g: &V, p: &V, d: usize) -> bool {
    match (g, p) {
        (V::And(a), V::And(b)) => {
            a.len() == b.len()
                && a.iter()
                    .zip(b)
                    .all(|(x, y)| compare_relational(x, y, d + 1))
        }
        (V::R(go, ..), V::R(po, ..)) => {
            let (Some(gd), Some(pd)) = (rel_diff(g), rel_diff(p)) else {
                return false;
            };
            if go == po && expr_eq(&V::S(gd.clone()), &V::S(pd.clone()), d) {
                return true;
            }
            if inverse(*go) == *po && *go != Rel::Ne {
                let neg = Sx::Mul(vec![Sx::Int((-1).into()), pd.clone()]);
                if expr_eq(&V::S(gd.clone()), &V::S(neg), d) {
                    return true;
                }
            }
            // solve-and-compare, approximated: equations proportional by a constant
            if *go == Rel::Eq && *po == Rel::Eq && has_symbols(&gd) {
                return proportional(&gd, &pd);
            }
            false
        }
        _ => false,
    }
}

fn proportional(a: &Sx, b: &Sx) -> bool {
    let mut ratio: Option<Complex64> = None;
    for pt in 0..4u64 {
        let (Some(x), Some(y)) = (eval(a, pt, 0), eval(b, pt, 0)) else {
            return false;
        };
        if y.norm() < 1e-12 {
            return false;
        }
        let r = x / y;
        if r.norm() < 1e-12 {
            return false;
        }
        match ratio {
            None => ratio = Some(r),
            Some(q) if close(q, r) => {}
            _ => return false,
        }
    }
    true
}

/// `relation.as_set()` for one-variable relations with constant bounds.
fn relation_as_set(v: &V) -> Option<V> {
    fn one(v: &V) -> Option<(f64, f64, bool, bool, Sx, Sx)> {
        let V::R(op, l, r) = v else { return None };
        let (V::S(l), V::S(r)) = (&**l, &**r) else {
            return None;
        };
        let (var_left, c) = match (l, r) {
            (Sx::Sym(_), c) if !has_symbols(c) => (true, c.clone()),
            (c, Sx::Sym(_)) if !has_symbols(c) => (false, c.clone()),
            _ => return None,
        };
        let op = if var_left { *op } else { inverse(*op) };
        let inf = (f64::INFINITY, Sx::Inf);
        let ninf = (f64::NEG_INFINITY, Sx::NegInf);
        let cv = approx_real(&c)?;
        Some(match op {
            Rel::Lt => (ninf.0, cv, true, true, ninf.1, c),
            Rel::Le => (ninf.0, cv, true, false, ninf.1, c),
            Rel::Gt => (cv, inf.0, true, true, c, inf.1),
            Rel::Ge => (cv, inf.0, false, true, c, inf.1),
            _ => return None,
        })
    }
    match v {
        V::R(Rel::Ne, l, r) => {
            let c = match (&**l, &**r) {
                (V::S(Sx::Sym(_)), V::S(c)) | (V::S(c), V::S(Sx::Sym(_))) if !has_symbols(c) => {
                    c.clone()
                }
                _ => return None,
            };
            Some(V::SetOp(
                'u',
                Box::new(V::Interval {
                    lo: Sx::NegInf,
                    hi: c.clone(),
                    lo_open: true,
                    hi_open: true,
                }),
                Box::new(V::Interval {
                    lo: c,
                    hi: Sx::Inf,
                    lo_open: true,
                    hi_open: true,
                }),
            ))
        }
        V::R(..) => {
            let (_, _, lo_open, hi_open, lo, hi) = one(v)?;
            Some(V::Interval {
                lo,
                hi,
                lo_open,
                hi_open,
            })
        }
        V::And(xs) if xs.len() == 2 => {
            let a = one(&xs[0])?;
            let b = one(&xs[1])?;
            let (lo, lo_open, lov) = if a.0 >= b.0 {
                (a.4.clone(), a.2, a.0)
            } else {
                (b.4.clone(), b.2, b.0)
            };
            let (hi, hi_open, hiv) = if a.1 <= b.1 {
                (a.5.clone(), a.3, a.1)
            } else {
                (b.5.clone(), b.3, b.1)
            };
            if lov > hiv {
                return Some(V::Empty);
            }
            Some(V::Interval {
                lo,
                hi,
                lo_open,
                hi_open,
            })
        }
        _ => None,
    }
}

fn set_len(v: &V) -> usize {
    match v {
        V::Set(xs) => {
            let mut n = 0;
            for (i, x) in xs.iter().enumerate() {
                if !xs[..i].iter().any(|y| structurally_equal(x, y)) {
                    n += 1;
                }
            }
            n
        }
        V::Tuple(xs) => xs.len(),
        _ => 0,
    }
}

fn dedup(xs: &[V]) -> Vec<V> {
    let mut out: Vec<V> = Vec::new();
    for x in xs {
        if !out.iter().any(|y| structurally_equal(x, y)) {
            out.push(x.clone());
        }
    }
    out
}

fn sort_key(v: &V) -> (u8, f64, String) {
    let inner = match v {
        V::R(Rel::Eq, _, r) if is_assignment(v) => &**r,
        v => v,
    };
    match inner {
        V::S(s) => match approx_real(s) {
            Some(x) => (0, x, String::new()),
            None => (1, 0.0, format!("{s:?}")),
        },
        other => (2, 0.0, format!("{other:?}")),
    }
}

fn ordered(xs: &[V]) -> Vec<V> {
    let mut v = dedup(xs);
    v.sort_by(|a, b| {
        let (ka, kb) = (sort_key(a), sort_key(b));
        ka.0.cmp(&kb.0)
            .then(ka.1.partial_cmp(&kb.1).unwrap_or(std::cmp::Ordering::Equal))
            .then(ka.2.cmp(&kb.2))
    });
    v
}

fn deep_compare(g: &V, p: &V, d: usize) -> bool {
    if set_len(g) != set_len(p) {
        return false;
    }
    let (ga, pa): (Vec<V>, Vec<V>) = match (g, p) {
        (V::Set(a), V::Set(b)) => (ordered(a), ordered(b)),
        (V::Set(a), V::Tuple(b)) => (ordered(a), ordered(b)),
        (V::Tuple(a), V::Set(b)) => (a.clone(), b.clone()),
        (V::Tuple(a), V::Tuple(b)) => (a.clone(), b.clone()),
        _ => return false,
    };
    ga.len() == pa.len() && ga.iter().zip(&pa).all(|(x, y)| expr_eq(x, y, d))
}

/// Canonical union of real intervals and points, when everything is numeric.
fn real_set(v: &V) -> Option<Vec<(f64, f64, bool, bool)>> {
    let mut parts = match v {
        V::Set(xs) => {
            let mut out = Vec::new();
            for x in xs {
                let V::S(s) = x else { return None };
                let r = approx_real(s)?;
                out.push((r, r, false, false));
            }
            out
        }
        V::Interval {
            lo,
            hi,
            lo_open,
            hi_open,
        } => {
            vec![(approx_real(lo)?, approx_real(hi)?, *lo_open, *hi_open)]
        }
        V::Empty => vec![],
        V::SetOp('u', a, b) => {
            let mut x = real_set(a)?;
            x.extend(real_set(b)?);
            x
        }
        V::Named('R') => vec![(f64::NEG_INFINITY, f64::INFINITY, true, true)],
        V::SetOp('-', a, b) => {
            let base = real_set(a)?;
            let V::Set(pts) = &**b else { return None };
            let mut cur = base;
            for p in pts {
                let V::S(s) = p else { return None };
                let r = approx_real(s)?;
                let mut next = Vec::new();
                for iv in cur {
                    if r > iv.0 && r < iv.1 {
                        next.push((iv.0, r, iv.2, true));
                        next.push((r, iv.1, true, iv.3));
                    } else if r == iv.0 && !iv.2 {
                        next.push((iv.0, iv.1, true, iv.3));
                    } else if r == iv.1 && !iv.3 {
                        next.push((iv.0, iv.1, iv.2, true));
                    } else {
                        next.push(iv);
                    }
                }
                cur = next;
            }
            cur
        }
        _ => return None,
    };
    parts.sort_by(|a, b| {
        a.0.partial_cmp(&b.0)
            .unwrap_or(std::cmp::Ordering::Equal)
            .then(b.2.cmp(&a.2).reverse())
    });
    // merge
    let mut out: Vec<(f64, f64, bool, bool)> = Vec::new();
    for p in parts {
        if let Some(last) = out.last_mut() {
            let touches = p.0 < last.1 || (p.0 == last.1 && !(p.2 && last.3));
            if touches {
                if p.1 > last.1 || (p.1 == last.1 && !p.3) {
                    last.1 = p.1;
                    last.3 = p.3;
                }
                if p.0 == last.0 && !p.2 {
                    last.2 = false;
                }
                continue;
            }
        }
        out.push(p);
    }
    Some(out)
}

fn compare_sets(g: &V, p: &V, d: usize) -> bool {
    let a = if is_set_like(g) {
        g.clone()
    } else {
        V::Set(vec![g.clone()])
    };
    let b = if is_set_like(p) {
        p.clone()
    } else {
        V::Set(vec![p.clone()])
    };
    if let (
        V::Interval {
            lo: l1,
            hi: h1,
            lo_open: o1,
            hi_open: c1,
        },
        V::Interval {
            lo: l2,
            hi: h2,
            lo_open: o2,
            hi_open: c2,
        },
    ) = (&a, &b)
    {
        return o1 == o2
            && c1 == c2
            && expr_eq(&V::S(l1.clone()), &V::S(l2.clone()), d)
            && expr_eq(&V::S(h1.clone()), &V::S(h2.clone()), d);
    }
    if structurally_equal(&a, &b) {
        return true;
    }
    if is_sympy_set(&a)
        && is_sympy_set(&b)
        && let (Some(x), Some(y)) = (real_set(&a), real_set(&b))
        && x.len() == y.len()
        && x.iter().zip(&y).all(|(s, t)| {
            let eq = |u: f64, v: f64| {
                u == v
                    || (u.is_finite() && v.is_finite() && (u - v).abs() <= 1e-12 * (1.0 + u.abs()))
            };
            eq(s.0, t.0)
                && eq(s.1, t.1)
                && (s.2 == t.2 || s.0.is_infinite())
                && (s.3 == t.3 || s.1.is_infinite())
        })
    {
        return true;
    }
    let fin = |v: &V| matches!(v, V::Set(_) | V::Tuple(_));
    if fin(&a) && fin(&b) {
        return deep_compare(&a, &b, d);
    }
    if let V::Interval {
        lo,
        hi,
        lo_open: true,
        hi_open: true,
    } = &a
        && fin(&b)
        && set_len(&b) == 2
    {
        return deep_compare(&V::Tuple(vec![V::S(lo.clone()), V::S(hi.clone())]), &b, d);
    }
    if let V::Interval {
        lo,
        hi,
        lo_open: true,
        hi_open: true,
    } = &b
        && fin(&a)
        && set_len(&a) == 2
    {
        return deep_compare(&a, &V::Tuple(vec![V::S(lo.clone()), V::S(hi.clone())]), d);
    }
    false
}

#[allow(dead_code)]
fn is_neg(x: &BigInt) -> bool {
    x.is_negative() && !x.is_zero()
}

#[cfg(test)]
mod tests {
    use super::grade_math_verify as mv;

    #[test]
    fn a_standalone_i_makes_the_symbols_non_real() {
        // `2 i` (standalone `i`) is parsed with non-real symbols, `2i` with real ones.
        assert!(!mv("2 i", "2i"));
        assert!(!mv(r"\frac{1}{2}+\frac{3}{2}i", r"\frac{1+3i}{2}"));
        assert!(mv("3+4i", "4i+3"));
        assert!(mv("1+i", "i+1"));
    }

    #[test]
    fn functions_take_a_function_as_their_argument() {
        assert!(mv(r"\ln\sqrt{2}", r"\frac{1}{2}\ln 2"));
        assert!(mv(r"\ln e^3", "3"));
        assert!(mv(r"{8 \choose 3}", r"\binom{8}{3}"));
    }

    #[test]
    fn floats_are_53_bit() {
        assert!(!mv(r"60.2 \times 10^{22}", r"6.02 \times 10^{23}"));
        assert!(mv(r"60.2 \times 10^{22}", r"602 \times 10^{21}"));
        assert!(mv(r"2.5 \times 10^{23}", r"25 \times 10^{22}"));
        assert!(!mv(r"1.1 \times 10^{2}", r"11 \times 10"));
        assert!(mv(r"1.2 \times 10^{-20}", r"1.3 \times 10^{-20}"));
        assert!(mv(r"4.1 \times 10^{-3}", r"41 \times 10^{-4}"));
    }
}
