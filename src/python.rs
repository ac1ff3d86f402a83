//! Pieces of Python semantics the renderers depend on, byte for byte: `str.strip()` and
//! regex `\s` whitespace, `json.loads` acceptance, truthiness, `str()` / `repr()` of JSON
//! values and iteration over a value. One copy for every family (the cookbook's renderers
//! are Python, so their whitespace, `repr` and JSON rules are the same everywhere).

use serde_json::Value;

use crate::error::{Error, Result};

/// Python's `str.isspace()` for one character (= what `str.strip()` and regex `\s` take):
/// Unicode White_Space plus the information separators U+001C..U+001F.
pub(crate) fn is_py_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// Python's `str.strip()` without arguments.
pub(crate) fn py_strip(s: &str) -> &str {
    s.trim_matches(is_py_space)
}

/// Python's `str.lstrip()` without arguments.
pub(crate) fn py_lstrip(s: &str) -> &str {
    s.trim_start_matches(is_py_space)
}

/// Python's `str.rstrip()` without arguments.
pub(crate) fn py_rstrip(s: &str) -> &str {
    s.trim_end_matches(is_py_space)
}

/// The character class of Python's `\s` (str patterns), for the `regex` crate.
pub(crate) const PY_SPACE_CLASS: &str = r"[\s\x1C-\x1F]";

/// Python truthiness of a JSON value (`None`, `False`, `0`, `0.0`, `""`, `[]`, `{}` are falsy).
pub(crate) fn py_truthy(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64().is_some_and(|f| f != 0.0),
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
    }
}

/// What Python's `for x in value` yields for a JSON value: list items, a string's characters,
/// a dict's keys; [`Error::Renderer`] for values that are not iterable.
pub(crate) fn py_iter(v: &Value, what: &str) -> Result<Vec<Value>> {
    Ok(match v {
        Value::Array(a) => a.clone(),
        Value::String(s) => s.chars().map(|c| Value::String(c.to_string())).collect(),
        Value::Object(o) => o.keys().map(|k| Value::String(k.clone())).collect(),
        other => {
            return Err(Error::Renderer(format!(
                "{what}: {} is not iterable",
                py_repr(other)
            )));
        }
    })
}

/// Python's `str(value)` for a JSON value: a string as is, anything else as [`py_repr`]
/// (`True`, `None`, `1.5`, `['a', 1]`).
pub(crate) fn py_str(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => py_repr(other),
    }
}

/// Python's `repr(value)` for a JSON value as `json.loads` returns it (`None`, `True`,
/// `'text'`, `[1, 2]`, `{'a': 1.5}`).
pub(crate) fn py_repr(v: &Value) -> String {
    let mut out = String::new();
    write_repr(&mut out, v);
    out
}

fn write_repr(out: &mut String, v: &Value) {
    match v {
        Value::Null => out.push_str("None"),
        Value::Bool(true) => out.push_str("True"),
        Value::Bool(false) => out.push_str("False"),
        Value::Number(n) => out.push_str(&py_number_repr(n)),
        Value::String(s) => out.push_str(&py_str_repr(s)),
        Value::Array(a) => {
            out.push('[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_repr(out, x);
            }
            out.push(']');
        }
        Value::Object(o) => {
            out.push('{');
            for (i, (k, x)) in o.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                out.push_str(&py_str_repr(k));
                out.push_str(": ");
                write_repr(out, x);
            }
            out.push('}');
        }
    }
}

/// Python's `repr` of a number `json.loads` produced: an int in decimal, a float as
/// `float.__repr__`.
pub(crate) fn py_number_repr(n: &serde_json::Number) -> String {
    match n.as_f64().filter(|_| n.is_f64()) {
        Some(f) => python_float_repr(f),
        None => n.to_string(),
    }
}

/// Whether `str.isprintable()` would be false for `c` (approximated without Unicode tables:
/// controls, separators other than the space, the common format characters, surrogates and
/// private use; unassigned code points count as printable here).
fn not_printable(c: char) -> bool {
    let u = c as u32;
    matches!(u,
        0x00..=0x1f | 0x7f..=0xa0 | 0xad | 0x600..=0x605 | 0x61c | 0x6dd | 0x70f | 0x890..=0x891
        | 0x8e2 | 0x1680 | 0x180e | 0x2000..=0x200f | 0x2028..=0x202f | 0x205f..=0x2064
        | 0x2066..=0x206f | 0x3000 | 0xe000..=0xf8ff | 0xfeff | 0xfff9..=0xfffb
        | 0x110bd | 0x110cd | 0x13430..=0x1343f | 0x1bca0..=0x1bca3 | 0x1d173..=0x1d17a
        | 0xe0001 | 0xe0020..=0xe007f | 0xf0000..=0x10ffff)
}

/// Python's `repr(str)`: single quotes unless the text has a `'` and no `"`; non-printable
/// characters escaped as `\xNN`, `\uNNNN` or `\UNNNNNNNN`.
pub(crate) fn py_str_repr(s: &str) -> String {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    let mut out = String::with_capacity(s.len() + 2);
    out.push(quote);
    for c in s.chars() {
        match c {
            c if c == quote || c == '\\' => {
                out.push('\\');
                out.push(c);
            }
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            c if not_printable(c) => {
                let u = c as u32;
                if u <= 0xff {
                    out.push_str(&format!("\\x{u:02x}"));
                } else if u <= 0xffff {
                    out.push_str(&format!("\\u{u:04x}"));
                } else {
                    out.push_str(&format!("\\U{u:08x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push(quote);
    out
}

/// Whether Python's `json.loads(text)` accepts `text` (the reason when not).
///
/// Python's decoder, not serde's: `NaN`, `Infinity` and `-Infinity` are values, numbers of
/// any size are, lone surrogate escapes are, nesting is not limited to 128 levels; control
/// characters inside strings are not (strict mode), nor is anything after the value but
/// `" \t\n\r"`.
pub(crate) fn json_loads_check(text: &str) -> std::result::Result<(), String> {
    let mut p = JsonCheck {
        s: text.as_bytes(),
        pos: 0,
    };
    p.ws();
    p.value(0)?;
    p.ws();
    if p.pos != p.s.len() {
        return Err(format!("Extra data: char {}", p.pos));
    }
    Ok(())
}

/// Deeper than this is rejected (Python raises `RecursionError` somewhere near 1000 levels).
const MAX_DEPTH: usize = 10_000;

struct JsonCheck<'a> {
    s: &'a [u8],
    pos: usize,
}

impl JsonCheck<'_> {
    fn peek(&self) -> Option<u8> {
        self.s.get(self.pos).copied()
    }

    fn ws(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.pos += 1;
        }
    }

    fn err<T>(&self, what: &str) -> std::result::Result<T, String> {
        Err(format!("{what}: char {}", self.pos))
    }

    fn literal(&mut self, word: &str) -> bool {
        if self.s[self.pos..].starts_with(word.as_bytes()) {
            self.pos += word.len();
            true
        } else {
            false
        }
    }

    fn value(&mut self, depth: usize) -> std::result::Result<(), String> {
        if depth > MAX_DEPTH {
            return self.err("maximum nesting depth exceeded");
        }
        match self.peek() {
            Some(b'"') => self.string(),
            Some(b'{') => self.object(depth),
            Some(b'[') => self.array(depth),
            Some(b'n') if self.literal("null") => Ok(()),
            Some(b't') if self.literal("true") => Ok(()),
            Some(b'f') if self.literal("false") => Ok(()),
            Some(b'N') if self.literal("NaN") => Ok(()),
            Some(b'I') if self.literal("Infinity") => Ok(()),
            Some(b'-') if self.literal("-Infinity") => Ok(()),
            Some(b'-' | b'0'..=b'9') => self.number(),
            _ => self.err("Expecting value"),
        }
    }

    fn digits(&mut self) -> usize {
        let start = self.pos;
        while matches!(self.peek(), Some(b'0'..=b'9')) {
            self.pos += 1;
        }
        self.pos - start
    }

    fn number(&mut self) -> std::result::Result<(), String> {
        if self.peek() == Some(b'-') {
            self.pos += 1;
        }
        match self.peek() {
            Some(b'0') => self.pos += 1,
            Some(b'1'..=b'9') => {
                self.digits();
            }
            _ => return self.err("Expecting value"),
        }
        // A '.' or exponent marker not followed by digits is left unconsumed, as by Python's
        // scanner (`1.` is `1` then extra data / a missing delimiter, which fails there).
        let before_fraction = self.pos;
        if self.peek() == Some(b'.') {
            self.pos += 1;
            if self.digits() == 0 {
                self.pos = before_fraction;
            }
        }
        let before_exponent = self.pos;
        if matches!(self.peek(), Some(b'e' | b'E')) {
            self.pos += 1;
            if matches!(self.peek(), Some(b'+' | b'-')) {
                self.pos += 1;
            }
            if self.digits() == 0 {
                self.pos = before_exponent;
            }
        }
        Ok(())
    }

    fn string(&mut self) -> std::result::Result<(), String> {
        self.pos += 1; // opening quote
        loop {
            match self.peek() {
                None => return self.err("Unterminated string"),
                Some(b'"') => {
                    self.pos += 1;
                    return Ok(());
                }
                Some(b'\\') => {
                    self.pos += 1;
                    match self.peek() {
                        Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => {
                            self.pos += 1
                        }
                        Some(b'u') => {
                            self.pos += 1;
                            for _ in 0..4 {
                                if !self.peek().is_some_and(|b| b.is_ascii_hexdigit()) {
                                    return self.err("Invalid \\uXXXX escape");
                                }
                                self.pos += 1;
                            }
                        }
                        _ => return self.err("Invalid \\escape"),
                    }
                }
                Some(b) if b < 0x20 => return self.err("Invalid control character"),
                Some(_) => self.pos += 1,
            }
        }
    }

    fn object(&mut self, depth: usize) -> std::result::Result<(), String> {
        self.pos += 1;
        self.ws();
        if self.peek() == Some(b'}') {
            self.pos += 1;
            return Ok(());
        }
        loop {
            if self.peek() != Some(b'"') {
                return self.err("Expecting property name enclosed in double quotes");
            }
            self.string()?;
            self.ws();
            if self.peek() != Some(b':') {
                return self.err("Expecting ':' delimiter");
            }
            self.pos += 1;
            self.ws();
            self.value(depth + 1)?;
            self.ws();
            match self.peek() {
                Some(b'}') => {
                    self.pos += 1;
                    return Ok(());
                }
                Some(b',') => {
                    self.pos += 1;
                    self.ws();
                }
                _ => return self.err("Expecting ',' delimiter"),
            }
        }
    }

    fn array(&mut self, depth: usize) -> std::result::Result<(), String> {
        self.pos += 1;
        self.ws();
        if self.peek() == Some(b']') {
            self.pos += 1;
            return Ok(());
        }
        loop {
            self.value(depth + 1)?;
            self.ws();
            match self.peek() {
                Some(b']') => {
                    self.pos += 1;
                    return Ok(());
                }
                Some(b',') => {
                    self.pos += 1;
                    self.ws();
                }
                _ => return self.err("Expecting ',' delimiter"),
            }
        }
    }
}

/// Python's `repr(float)` (shortest round-trip, `1.0` keeps its `.0`, exponent form past
/// 1e16).
pub fn python_float_repr(f: f64) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 {
            "Infinity".into()
        } else {
            "-Infinity".into()
        };
    }
    let abs = f.abs();
    if abs != 0.0 && !(1e-4..1e16).contains(&abs) {
        // Rust's `{:e}` is shortest round-trip too: 1e16 -> "1e16"; Python writes "1e+16".
        let s = format!("{f:e}");
        let (mant, exp) = s.split_once('e').unwrap_or((&s, "0"));
        let exp: i32 = exp.parse().unwrap_or(0);
        let sign = if exp < 0 { '-' } else { '+' };
        return format!("{mant}e{sign}{:02}", exp.abs());
    }
    let s = format!("{f}");
    if s.contains('.') { s } else { format!("{s}.0") }
}

// ---------------------------------------------------------------------------------------------
// Dates (`datetime.strftime`, pylatexenc's `\today`)
// ---------------------------------------------------------------------------------------------

pub(crate) const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
#[cfg(feature = "chat-template")]
const WEEKDAYS: [&str; 7] = [
    "Sunday",
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
];

#[cfg(feature = "chat-template")]
/// Python's `datetime.strftime` (C locale) of the UTC time `unix_seconds`, for the common
/// directives (`%Y %y %m %d %e %j %H %I %M %S %p %a %A %b %B %h %Z %z %%`, and glibc's
/// `%-d`-style unpadded forms).
pub(crate) fn strftime(format: &str, unix_seconds: i64) -> std::result::Result<String, String> {
    use std::fmt::Write as _;
    let days = unix_seconds.div_euclid(86_400);
    let secs = unix_seconds.rem_euclid(86_400);
    let (year, month, day) = civil_from_days(days);
    let (hour, minute, second) = (secs / 3600, secs % 3600 / 60, secs % 60);
    let weekday = (days + 4).rem_euclid(7) as usize; // 1970-01-01 was a Thursday.
    let yday = days - days_from_civil(year, 1, 1) + 1;
    let hour12 = if hour % 12 == 0 { 12 } else { hour % 12 };
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let mut spec = chars.next().ok_or("strftime format ends with `%`")?;
        let unpadded = spec == '-';
        if unpadded {
            spec = chars.next().ok_or("strftime format ends with `%-`")?;
        }
        let num = |out: &mut String, v: i64, width: usize| {
            if unpadded {
                let _ = write!(out, "{v}");
            } else {
                let _ = write!(out, "{v:0width$}");
            }
        };
        match spec {
            'Y' => {
                let _ = write!(out, "{year}");
            }
            'y' => num(&mut out, year.rem_euclid(100), 2),
            'm' => num(&mut out, month, 2),
            'd' => num(&mut out, day, 2),
            'e' => {
                let _ = write!(out, "{day:>2}");
            }
            'j' => num(&mut out, yday, 3),
            'H' => num(&mut out, hour, 2),
            'I' => num(&mut out, hour12, 2),
            'M' => num(&mut out, minute, 2),
            'S' => num(&mut out, second, 2),
            'p' => out.push_str(if hour < 12 { "AM" } else { "PM" }),
            'a' => out.push_str(&WEEKDAYS[weekday][..3]),
            'A' => out.push_str(WEEKDAYS[weekday]),
            'b' | 'h' => out.push_str(&MONTHS[(month - 1) as usize][..3]),
            'B' => out.push_str(MONTHS[(month - 1) as usize]),
            'Z' => out.push_str("UTC"),
            'z' => out.push_str("+0000"),
            '%' => out.push('%'),
            other => return Err(format!("strftime directive `%{other}` is not supported")),
        }
    }
    Ok(out)
}

/// (year, month, day) of a day count since 1970-01-01 (Howard Hinnant's algorithm).
pub(crate) fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(feature = "chat-template")]
/// Days since 1970-01-01 of a civil date.
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = if month > 2 { month - 3 } else { month + 9 };
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_loads_acceptance_matches_python() {
        for ok in [
            "{}",
            " [1, -2.5e+3, true, false, null] ",
            "NaN",
            "-Infinity",
            "[Infinity]",
            "1e400",
            r#""\ud800""#,
            r#"{"a": {"b": [{}]}, "a": 1}"#,
            "\"é😀\"",
            "0",
            "-0.0E-1",
            "-0",
            "5",
            "[1e5, 2.5e-3]",
        ] {
            assert!(json_loads_check(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "{",
            "[1,]",
            "{\"a\":1,}",
            "01",
            "1.",
            "1e",
            "-",
            ".5",
            "+1",
            "\"a\tb\"",
            r#""\x""#,
            r#""\u12g4""#,
            "{a: 1}",
            "[1] x",
            "nul",
            "\u{feff}{}",
            "inf",
            "nan",
            "{'a': 1}",
            "{\"a\" 1}",
            "[1.]",
            "[1e]",
            "{\"a\": 1.e5}",
        ] {
            assert!(json_loads_check(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn repr_and_strip_match_python() {
        let v: Value =
            serde_json::from_str(r#"[1, 2.0, "it's", "a\"b'c", null, true, {"k": [1e20]}]"#)
                .unwrap();
        assert_eq!(
            py_repr(&v),
            r#"[1, 2.0, "it's", 'a"b\'c', None, True, {'k': [1e+20]}]"#
        );
        assert_eq!(py_str(&Value::String("x'y".into())), "x'y");
        assert_eq!(py_str_repr("tab\tnl\n\u{1}é"), "'tab\\tnl\\n\\x01é'");
        assert_eq!(py_strip("\u{1c} a b\u{3000}\n"), "a b");
        assert_eq!(py_strip("\u{1c} a \u{1f}\n"), "a");
        assert_eq!(py_lstrip("\u{a0}x "), "x ");
        assert_eq!(py_rstrip(" x\u{3000}"), " x");
        assert_eq!(py_str_repr("a\nb\\"), "'a\\nb\\\\'");
        assert_eq!(
            py_repr(&serde_json::json!({"a": [1, 2.5, true, null], "b": "it's"})),
            "{'a': [1, 2.5, True, None], 'b': \"it's\"}"
        );
        assert_eq!(py_str(&serde_json::json!(1.0)), "1.0");
        assert_eq!(py_str(&serde_json::json!(false)), "False");
        assert!(!py_truthy(&serde_json::json!(0.0)));
        assert!(py_truthy(&serde_json::json!([0])));
    }
}
