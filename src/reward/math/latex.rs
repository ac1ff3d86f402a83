//! LaTeX answer parser into [`Value`] / [`Expr`].
//!
//! Conventions (the rendered meaning of the LaTeX wins where it is unambiguous):
//! * `\frac12` and `\sqrt2` take one character (`\sqrt12` is `\sqrt{1}2`), but `2^10` is
//!   `2^{10}` (what every writer means);
//! * `\log` is base 10, `\ln` base e, `\log_b` base b; `e` is Euler's number, `i` the
//!   imaginary unit, other letters are variables (`x_1` is the variable `x_1`);
//! * decoration is dropped: `^\circ`, `\degree`, `\%`, `\$`, `\text{…}` units after a number,
//!   `\left`/`\right`, spacing commands; thousands separators (`1{,}000`, `1,000`, `1\,000`)
//!   are joined;
//! * `(a, b)` is a [`Value::Tuple`] (an open interval is told apart by the grader), `(a, b]`,
//!   `[a, b)`, `[a, b]` are intervals, `\{…\}` a set; a bare `a, b` (or `a \text{ and } b`) a
//!   [`Value::List`];
//! * `\sqrt[n]{x}` of a negative number with odd `n` is the real root.

pub use super::expr::ParseError;
use super::expr::{Budget, Constant, Expr, Func, Interval, Rational, RelOp, Relation, Value};
use num_bigint::BigInt;
use num_traits::{One, Zero};

#[cfg(test)]
/// Parses a whole LaTeX answer (the content of `\boxed{…}`, with or without `$…$`).
pub fn parse_latex(s: &str) -> Result<Value, ParseError> {
    parse_latex_with(s, &Budget::default())
}

/// [`parse_latex`] with an explicit budget.
pub fn parse_latex_with(s: &str, budget: &Budget) -> Result<Value, ParseError> {
    let opts = ParseOptions {
        budget: budget.clone(),
        ..ParseOptions::default()
    };
    parse_latex_opts(s, &opts).map(|p| p.value)
}

/// Options of [`parse_latex_opts`].
#[derive(Debug, Clone, Default)]
pub struct ParseOptions {
    /// Limits.
    pub budget: Budget,
    /// Whether a degree mark outside a function argument converts to radians (`30^\circ` =
    /// `π/6`); when false it is dropped (`30^\circ` = `30`). Inside `\sin`, `\cos`, … a
    /// degree mark always converts (`\sin 30^\circ` = `1/2`).
    pub degrees_to_radians: bool,
}

/// A parsed answer with what the parser dropped as decoration.
#[derive(Debug, Clone)]
pub struct Parsed {
    /// The answer.
    pub value: Value,
    /// Unit texts dropped after numbers (`\text{ cm}` → `"cm"`, with a power as `"cm^2"`).
    pub units: Vec<String>,
    /// Whether a percent sign was dropped.
    pub percent: bool,
    /// Whether a degree mark occurred outside a function argument.
    pub degrees: bool,
}

/// [`parse_latex`] with options, also reporting the dropped decoration.
pub fn parse_latex_opts(s: &str, opts: &ParseOptions) -> Result<Parsed, ParseError> {
    let budget = &opts.budget;
    if s.len() > budget.max_input_len {
        return Err(ParseError::TooLong(s.len()));
    }
    let s = fold_unicode(s);
    let toks = tokenize(&s)?;
    if toks.is_empty() {
        return Err(ParseError::Empty);
    }
    let mut p = Parser {
        toks,
        pos: 0,
        depth: 0,
        abs_depth: 0,
        func_depth: 0,
        budget,
        degrees_to_radians: opts.degrees_to_radians,
        units: Vec::new(),
        percent: false,
        degrees: false,
    };
    let v = p.parse_top()?;
    if p.pos < p.toks.len() {
        return Err(p.unexpected());
    }
    Ok(Parsed {
        value: expand_pm(v, budget.max_depth)?,
        units: p.units,
        percent: p.percent,
        degrees: p.degrees,
    })
}

/// Full-width ASCII forms and vulgar fractions to plain LaTeX.
fn fold_unicode(s: &str) -> std::borrow::Cow<'_, str> {
    if s.is_ascii() {
        return std::borrow::Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        let frac = match c {
            '½' => Some("1}{2"),
            '⅓' => Some("1}{3"),
            '⅔' => Some("2}{3"),
            '¼' => Some("1}{4"),
            '¾' => Some("3}{4"),
            '⅕' => Some("1}{5"),
            '⅖' => Some("2}{5"),
            '⅗' => Some("3}{5"),
            '⅘' => Some("4}{5"),
            '⅙' => Some("1}{6"),
            '⅚' => Some("5}{6"),
            '⅛' => Some("1}{8"),
            '⅜' => Some("3}{8"),
            '⅝' => Some("5}{8"),
            '⅞' => Some("7}{8"),
            _ => None,
        };
        if let Some(f) = frac {
            out.push_str("\\frac{");
            out.push_str(f);
            out.push('}');
        } else if ('\u{ff01}'..='\u{ff5e}').contains(&c) {
            out.push(char::from_u32(c as u32 - 0xff01 + 0x21).unwrap_or(c));
        } else if c == '\u{3000}' {
            out.push(' ');
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

#[cfg(test)]
/// Parses a LaTeX scalar expression (an error when the answer is not a scalar).
pub fn parse_latex_expr(s: &str) -> Result<Expr, ParseError> {
    match parse_latex(s)? {
        Value::Scalar(e) => Ok(e),
        _ => Err(ParseError::Unsupported("not a scalar".into())),
    }
}

/// Name of the marker variable standing for `±` during parsing.
const PM: &str = "\u{b1}";

/// Expands the `±` marker: a scalar containing it becomes [`Value::PlusMinus`].
fn expand_pm(v: Value, depth: usize) -> Result<Value, ParseError> {
    let pm = |e: Expr| -> Result<Value, ParseError> {
        if !e.symbols().contains(PM) {
            return Ok(Value::Scalar(e));
        }
        let plus = e
            .subs(PM, &Expr::int(1), depth)
            .ok_or(ParseError::TooDeep)?;
        let minus = e
            .subs(PM, &Expr::int(-1), depth)
            .ok_or(ParseError::TooDeep)?;
        Ok(Value::PlusMinus(
            Box::new(Value::Scalar(plus)),
            Box::new(Value::Scalar(minus)),
        ))
    };
    let all = |v: Vec<Value>| -> Result<Vec<Value>, ParseError> {
        v.into_iter().map(|x| expand_pm(x, depth)).collect()
    };
    Ok(match v {
        Value::Scalar(e) => pm(e)?,
        Value::Tuple(v) => Value::Tuple(all(v)?),
        Value::Set(v) => Value::Set(all(v)?),
        Value::List(v) => Value::List(all(v)?),
        Value::Union(v) => Value::Union(all(v)?),
        Value::Relation(r) => Value::Relation(Relation {
            terms: all(r.terms)?,
            ops: r.ops,
        }),
        other => other,
    })
}

// ---------------------------------------------------------------------------------------
// Tokens
// ---------------------------------------------------------------------------------------

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    /// Digits with an optional decimal part (`12`, `3.5`, `.5`).
    Num(String),
    Letter(char),
    /// `\name` (letters) or `\c` (one non-letter char).
    Cmd(String),
    Ch(char),
    /// Content of `\text{…}` and friends.
    Text(String),
    Begin(String),
    End(String),
}

#[derive(Debug, Clone)]
struct Token {
    tok: Tok,
    pos: usize,
    space_before: bool,
}

const TEXT_CMDS: &[&str] = &[
    "text",
    "textbf",
    "textit",
    "textrm",
    "textup",
    "texttt",
    "textsf",
    "mbox",
    "hbox",
    "textnormal",
    "textsl",
];
const SKIP_CMDS: &[&str] = &[
    "left",
    "right",
    "big",
    "Big",
    "bigg",
    "Bigg",
    "bigl",
    "bigr",
    "Bigl",
    "Bigr",
    "biggl",
    "biggr",
    "Biggl",
    "Biggr",
    "displaystyle",
    "textstyle",
    "quad",
    "qquad",
    ",",
    ";",
    ":",
    "!",
    " ",
    "$",
    "limits",
    "nolimits",
    "middle",
];

fn tokenize(s: &str) -> Result<Vec<Token>, ParseError> {
    let mut out: Vec<Token> = Vec::new();
    let b: Vec<char> = s.chars().collect();
    // Byte offsets of chars, for error positions.
    let offs: Vec<usize> = s.char_indices().map(|(i, _)| i).collect();
    let mut i = 0;
    let mut space = false;
    let push = |out: &mut Vec<Token>, tok: Tok, pos: usize, space: &mut bool| {
        out.push(Token {
            tok,
            pos,
            space_before: *space,
        });
        *space = false;
    };
    while i < b.len() {
        let c = b[i];
        let pos = offs.get(i).copied().unwrap_or(s.len());
        if c.is_whitespace() || c == '~' {
            space = true;
            i += 1;
            continue;
        }
        if c == '$' {
            i += 1;
            continue;
        }
        if c.is_ascii_digit()
            || (c == '.'
                && (b.get(i + 1).is_some_and(|d| d.is_ascii_digit()) || is_overline_at(&b, i + 1)))
        {
            let mut num = String::new();
            let mut seen_dot = false;
            let mut first_group = true;
            while i < b.len() {
                let d = b[i];
                if d.is_ascii_digit() {
                    num.push(d);
                    i += 1;
                } else if d == '.'
                    && !seen_dot
                    && (b.get(i + 1).is_some_and(|x| x.is_ascii_digit())
                        || is_overline_at(&b, i + 1))
                {
                    seen_dot = true;
                    num.push('.');
                    i += 1;
                } else if let Some(n) = (!seen_dot)
                    .then(|| thousands_sep_at(&b, i, &num, first_group))
                    .flatten()
                {
                    i += n;
                    first_group = false;
                } else {
                    break;
                }
            }
            // Scientific notation `1.5e8`, `2.5E-3` (digits must follow; no letter after).
            if matches!(b.get(i), Some('e') | Some('E')) {
                let k = if matches!(b.get(i + 1), Some('+') | Some('-')) {
                    i + 2
                } else {
                    i + 1
                };
                let mut j = k;
                while b.get(j).is_some_and(char::is_ascii_digit) {
                    j += 1;
                }
                if j > k && !b.get(j).is_some_and(|c| c.is_alphabetic()) {
                    let exp: String = b[i + 1..j].iter().collect();
                    push(&mut out, Tok::Num(num), pos, &mut space);
                    out.push(Token {
                        tok: Tok::Cmd("times".into()),
                        pos,
                        space_before: false,
                    });
                    out.push(Token {
                        tok: Tok::Num("10".into()),
                        pos,
                        space_before: false,
                    });
                    out.push(Token {
                        tok: Tok::Ch('^'),
                        pos,
                        space_before: false,
                    });
                    out.push(Token {
                        tok: Tok::Ch('{'),
                        pos,
                        space_before: false,
                    });
                    if let Some(rest) = exp.strip_prefix('-') {
                        out.push(Token {
                            tok: Tok::Ch('-'),
                            pos,
                            space_before: false,
                        });
                        out.push(Token {
                            tok: Tok::Num(rest.to_string()),
                            pos,
                            space_before: false,
                        });
                    } else {
                        out.push(Token {
                            tok: Tok::Num(exp.trim_start_matches('+').to_string()),
                            pos,
                            space_before: false,
                        });
                    }
                    out.push(Token {
                        tok: Tok::Ch('}'),
                        pos,
                        space_before: false,
                    });
                    i = j;
                    continue;
                }
            }
            push(&mut out, Tok::Num(num), pos, &mut space);
            continue;
        }
        if c.is_ascii_alphabetic() {
            push(&mut out, Tok::Letter(c), pos, &mut space);
            i += 1;
            continue;
        }
        if c == '\\' {
            i += 1;
            let Some(&n) = b.get(i) else {
                return Err(ParseError::Unexpected {
                    pos,
                    found: "\\".into(),
                });
            };
            let name: String = if n.is_ascii_alphabetic() {
                let st = i;
                while i < b.len() && b[i].is_ascii_alphabetic() {
                    i += 1;
                }
                b[st..i].iter().collect()
            } else {
                i += 1;
                n.to_string()
            };
            if name == "\\" {
                push(&mut out, Tok::Cmd("\\".into()), pos, &mut space);
                continue;
            }
            if SKIP_CMDS.contains(&name.as_str()) {
                // `\left.` / `\right.`
                if (name == "left" || name == "right") && b.get(i) == Some(&'.') {
                    i += 1;
                }
                space = true;
                continue;
            }
            if name == "operatorname" || name == "mathrm" || TEXT_CMDS.contains(&name.as_str()) {
                while b.get(i).is_some_and(|c| c.is_whitespace()) {
                    i += 1;
                }
                if b.get(i) == Some(&'*') {
                    i += 1;
                }
                if b.get(i) == Some(&'{') {
                    let (content, next) = brace_group(&b, i)?;
                    i = next;
                    let t = if name == "operatorname" {
                        Tok::Cmd(content.trim().to_string())
                    } else if name == "mathrm" && content.trim().chars().count() <= 1 {
                        // `\mathrm{e}`, `\mathrm{d}`: plain math.
                        out.extend(tokenize(&content)?.into_iter().map(|mut t| {
                            t.pos = pos;
                            t
                        }));
                        continue;
                    } else {
                        Tok::Text(content)
                    };
                    push(&mut out, t, pos, &mut space);
                    continue;
                }
                continue;
            }
            if name == "begin" || name == "end" {
                if b.get(i) == Some(&'{') {
                    let (content, next) = brace_group(&b, i)?;
                    i = next;
                    let t = if name == "begin" {
                        Tok::Begin(content)
                    } else {
                        Tok::End(content)
                    };
                    push(&mut out, t, pos, &mut space);
                    // `\begin{array}{cc}`: skip the column spec.
                    if let Some(Tok::Begin(env)) = out.last().map(|t| &t.tok)
                        && env == "array"
                        && b.get(i) == Some(&'{')
                    {
                        i = brace_group(&b, i)?.1;
                    }
                    continue;
                }
                return Err(ParseError::Unexpected { pos, found: name });
            }
            push(&mut out, Tok::Cmd(name), pos, &mut space);
            continue;
        }
        let mapped: Option<Tok> = match c {
            'π' => Some(Tok::Cmd("pi".into())),
            '∞' => Some(Tok::Cmd("infty".into())),
            '√' => Some(Tok::Cmd("sqrt".into())),
            '≤' | '⩽' => Some(Tok::Cmd("le".into())),
            '≥' | '⩾' => Some(Tok::Cmd("ge".into())),
            '≠' => Some(Tok::Cmd("ne".into())),
            '·' | '⋅' => Some(Tok::Cmd("cdot".into())),
            '×' => Some(Tok::Cmd("times".into())),
            '÷' => Some(Tok::Cmd("div".into())),
            '−' | '–' => Some(Tok::Ch('-')),
            '°' => Some(Tok::Cmd("degree".into())),
            '∪' => Some(Tok::Cmd("cup".into())),
            '±' => Some(Tok::Cmd("pm".into())),
            '∓' => Some(Tok::Cmd("mp".into())),
            '∅' => Some(Tok::Cmd("emptyset".into())),
            '∈' => Some(Tok::Cmd("in".into())),
            '≈' => Some(Tok::Cmd("approx".into())),
            '%' => Some(Tok::Cmd("%".into())),
            '+' | '-' | '*' | '/' | '^' | '_' | '(' | ')' | '[' | ']' | '{' | '}' | ',' | '='
            | '<' | '>' | '!' | '|' | '&' | '\'' | ':' | ';' | '.' => Some(Tok::Ch(c)),
            _ if c.is_alphabetic() => Some(Tok::Letter(c)),
            _ => None,
        };
        match mapped {
            Some(t) => push(&mut out, t, pos, &mut space),
            None => {
                return Err(ParseError::Unexpected {
                    pos,
                    found: c.to_string(),
                });
            }
        }
        i += 1;
    }
    Ok(out)
}

fn is_overline_at(b: &[char], i: usize) -> bool {
    let w: String = b.iter().skip(i).take(9).collect();
    w == "\\overline" || w.starts_with("\\dot{") || w.starts_with("\\bar{")
}

/// At `b[i]`, a thousands separator (`{,}`, `\\,`, `,`) followed by exactly three digits (and
/// then no digit): returns its length. `first_group` is true while no separator was joined
/// yet; the first group must then have 1–3 digits and not be a lone `0`.
fn thousands_sep_at(b: &[char], i: usize, num: &str, first_group: bool) -> Option<usize> {
    if num.is_empty() || (first_group && (num.len() > 3 || num.starts_with('0'))) {
        return None;
    }
    for sep in ["{,}", ",\\!", "{,}\\!", "\\,", "\\!", ","] {
        let n = sep.chars().count();
        if !b.iter().skip(i).take(n).copied().eq(sep.chars()) {
            continue;
        }
        let digits: Vec<char> = b.iter().skip(i + n).take(4).copied().collect();
        if digits.len() >= 3
            && digits[..3].iter().all(char::is_ascii_digit)
            && !digits.get(3).is_some_and(char::is_ascii_digit)
        {
            return Some(n);
        }
    }
    None
}

/// Content of the brace group starting at `b[i] == '{'`, and the index after its `}`.
fn brace_group(b: &[char], i: usize) -> Result<(String, usize), ParseError> {
    let mut depth = 0usize;
    let mut j = i;
    while j < b.len() {
        match b[j] {
            '\\' => {
                j += 2;
                continue;
            }
            '{' => depth += 1,
            '}' => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    return Ok((b[i + 1..j].iter().collect(), j + 1));
                }
            }
            _ => {}
        }
        j += 1;
    }
    Err(ParseError::Unexpected {
        pos: i,
        found: "unbalanced {".into(),
    })
}

// ---------------------------------------------------------------------------------------
// Parser
// ---------------------------------------------------------------------------------------

struct Parser<'a> {
    toks: Vec<Token>,
    pos: usize,
    depth: usize,
    abs_depth: usize,
    /// Nesting inside function arguments (degree marks convert there).
    func_depth: usize,
    budget: &'a Budget,
    degrees_to_radians: bool,
    units: Vec<String>,
    percent: bool,
    degrees: bool,
}

type PResult<T> = Result<T, ParseError>;

fn func_of(name: &str) -> Option<Func> {
    Some(match name {
        "sin" => Func::Sin,
        "cos" => Func::Cos,
        "tan" | "tg" => Func::Tan,
        "cot" | "ctg" => Func::Cot,
        "sec" => Func::Sec,
        "csc" | "cosec" => Func::Csc,
        "arcsin" | "asin" => Func::Asin,
        "arccos" | "acos" => Func::Acos,
        "arctan" | "atan" => Func::Atan,
        "arccot" => Func::Acot,
        "arcsec" => Func::Asec,
        "arccsc" => Func::Acsc,
        "sinh" => Func::Sinh,
        "cosh" => Func::Cosh,
        "tanh" => Func::Tanh,
        "exp" => Func::Exp,
        "gcd" => Func::Gcd,
        "lcm" => Func::Lcm,
        "min" => Func::Min,
        "max" => Func::Max,
        "floor" => Func::Floor,
        "ceil" => Func::Ceil,
        "abs" => Func::Abs,
        _ => return None,
    })
}

fn inverse_of(f: Func) -> Option<Func> {
    Some(match f {
        Func::Sin => Func::Asin,
        Func::Cos => Func::Acos,
        Func::Tan => Func::Atan,
        Func::Cot => Func::Acot,
        Func::Sec => Func::Asec,
        Func::Csc => Func::Acsc,
        _ => return None,
    })
}

const GREEK: &[&str] = &[
    "alpha",
    "beta",
    "gamma",
    "delta",
    "epsilon",
    "varepsilon",
    "zeta",
    "eta",
    "theta",
    "vartheta",
    "iota",
    "kappa",
    "lambda",
    "mu",
    "nu",
    "xi",
    "rho",
    "sigma",
    "tau",
    "upsilon",
    "phi",
    "varphi",
    "chi",
    "psi",
    "omega",
    "Gamma",
    "Delta",
    "Theta",
    "Lambda",
    "Xi",
    "Sigma",
    "Upsilon",
    "Phi",
    "Psi",
    "Omega",
    "ell",
];

fn scalar(v: Value, pos: usize) -> PResult<Expr> {
    match v {
        Value::Scalar(e) => Ok(e),
        other => Err(ParseError::Unexpected {
            pos,
            found: format!("non-scalar {other:?}").chars().take(40).collect(),
        }),
    }
}

fn decimal(s: &str) -> Option<Rational> {
    let (int, frac) = s.split_once('.').unwrap_or((s, ""));
    let digits = format!("{int}{frac}");
    let n: BigInt = if digits.is_empty() {
        BigInt::zero()
    } else {
        digits.parse().ok()?
    };
    let den = num_traits::pow::Pow::pow(BigInt::from(10), u32::try_from(frac.len()).ok()?);
    Rational::new(n, den)
}

impl Parser<'_> {
    fn peek(&self) -> Option<&Tok> {
        self.toks.get(self.pos).map(|t| &t.tok)
    }
    fn peek_at(&self, k: usize) -> Option<&Tok> {
        self.toks.get(self.pos + k).map(|t| &t.tok)
    }
    fn cur_pos(&self) -> usize {
        self.toks
            .get(self.pos)
            .map_or_else(|| self.toks.last().map_or(0, |t| t.pos + 1), |t| t.pos)
    }
    fn unexpected(&self) -> ParseError {
        match self.toks.get(self.pos) {
            Some(t) => ParseError::Unexpected {
                pos: t.pos,
                found: format!("{:?}", t.tok),
            },
            None => ParseError::Unexpected {
                pos: self.cur_pos(),
                found: "end of input".into(),
            },
        }
    }
    fn is_ch(&self, c: char) -> bool {
        self.peek() == Some(&Tok::Ch(c))
    }
    fn is_cmd(&self, name: &str) -> bool {
        matches!(self.peek(), Some(Tok::Cmd(n)) if n == name)
    }
    fn eat_ch(&mut self, c: char) -> bool {
        if self.is_ch(c) {
            self.pos += 1;
            true
        } else {
            false
        }
    }
    fn eat_cmd(&mut self, name: &str) -> bool {
        if self.is_cmd(name) {
            self.pos += 1;
            true
        } else {
            false
        }
    }
    fn expect_ch(&mut self, c: char) -> PResult<()> {
        if self.eat_ch(c) {
            Ok(())
        } else {
            Err(self.unexpected())
        }
    }
    fn enter(&mut self) -> PResult<()> {
        self.depth += 1;
        if self.depth > self.budget.max_depth {
            return Err(ParseError::TooDeep);
        }
        if self.budget.expired() {
            return Err(ParseError::Timeout);
        }
        Ok(())
    }
    fn leave(&mut self) {
        self.depth = self.depth.saturating_sub(1);
    }
    fn at_end(&self) -> bool {
        self.pos >= self.toks.len()
    }

    /// Whether the next token is a list separator (`,`, `;`, `\text{and}`, `\text{or}`).
    fn at_separator(&self) -> bool {
        match self.peek() {
            Some(Tok::Ch(',')) | Some(Tok::Ch(';')) => true,
            Some(Tok::Text(t)) => is_separator_text(t),
            _ => false,
        }
    }

    fn parse_top(&mut self) -> PResult<Value> {
        let mut items = vec![self.parse_relation()?];
        while self.at_separator() {
            self.pos += 1;
            if self.at_end() {
                break;
            }
            items.push(self.parse_relation()?);
        }
        // A trailing full stop.
        self.eat_ch('.');
        Ok(if items.len() == 1 {
            items.pop().unwrap_or(Value::EmptySet)
        } else {
            Value::List(items)
        })
    }

    fn relop(&self) -> Option<(RelOp, usize)> {
        Some(match self.peek()? {
            Tok::Ch('=') => (RelOp::Eq, 1),
            Tok::Ch('<') if self.peek_at(1) == Some(&Tok::Ch('=')) => (RelOp::Le, 2),
            Tok::Ch('>') if self.peek_at(1) == Some(&Tok::Ch('=')) => (RelOp::Ge, 2),
            Tok::Ch('<') => (RelOp::Lt, 1),
            Tok::Ch('>') => (RelOp::Gt, 1),
            Tok::Ch('!') if self.peek_at(1) == Some(&Tok::Ch('=')) => (RelOp::Ne, 2),
            Tok::Cmd(c) => match c.as_str() {
                "le" | "leq" | "leqslant" => (RelOp::Le, 1),
                "ge" | "geq" | "geqslant" => (RelOp::Ge, 1),
                "lt" => (RelOp::Lt, 1),
                "gt" => (RelOp::Gt, 1),
                "ne" | "neq" => (RelOp::Ne, 1),
                "in" => (RelOp::In, 1),
                "approx" => (RelOp::Approx, 1),
                _ => return None,
            },
            _ => return None,
        })
    }

    fn parse_relation(&mut self) -> PResult<Value> {
        let first = self.parse_union()?;
        let mut terms = vec![first];
        let mut ops = Vec::new();
        while let Some((op, n)) = self.relop() {
            self.pos += n;
            ops.push(op);
            terms.push(self.parse_union()?);
        }
        Ok(if ops.is_empty() {
            terms.pop().unwrap_or(Value::EmptySet)
        } else {
            Value::Relation(Relation { terms, ops })
        })
    }

    fn eat_cup(&mut self) -> bool {
        self.eat_cmd("cup") || self.eat_cmd("bigcup") || self.eat_ch_letter('U')
    }

    fn eat_ch_letter(&mut self, c: char) -> bool {
        if self.peek() == Some(&Tok::Letter(c)) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    fn parse_union(&mut self) -> PResult<Value> {
        let mut first = self.parse_sum()?;
        if !matches!(first, Value::Scalar(_)) && self.eat_cmd("setminus") {
            let removed = self.parse_sum()?;
            first = set_minus(first, removed)?;
        }
        let is_cup = self.is_cmd("cup")
            || self.is_cmd("bigcup")
            || (self.peek() == Some(&Tok::Letter('U')) && !matches!(first, Value::Scalar(_)));
        if !is_cup {
            return Ok(first);
        }
        let mut parts = vec![first];
        while self.eat_cup() {
            parts.push(self.parse_sum()?);
        }
        let mut flat = Vec::new();
        for p in parts {
            match p {
                Value::Union(v) => flat.extend(v),
                // `(a, b)` in a union is an open interval.
                Value::Tuple(v) if v.len() == 2 => {
                    let mut it = v.into_iter();
                    let (Some(Value::Scalar(lo)), Some(Value::Scalar(hi))) = (it.next(), it.next())
                    else {
                        return Err(ParseError::Unsupported("union of non-intervals".into()));
                    };
                    flat.push(Value::Interval(Interval {
                        lo,
                        hi,
                        lo_closed: false,
                        hi_closed: false,
                    }));
                }
                other => flat.push(other),
            }
        }
        Ok(Value::Union(flat))
    }

    fn parse_sum(&mut self) -> PResult<Value> {
        self.enter()?;
        let r = self.parse_sum_inner();
        self.leave();
        r
    }

    fn parse_sum_inner(&mut self) -> PResult<Value> {
        let first = self.parse_term()?;
        let mut acc: Option<Vec<Expr>> = None;
        let mut first = Some(first);
        loop {
            let sign: Expr = match self.peek() {
                Some(Tok::Ch('+')) => Expr::int(1),
                Some(Tok::Ch('-')) => Expr::int(-1),
                Some(Tok::Cmd(c)) if c == "pm" => Expr::sym(PM),
                Some(Tok::Cmd(c)) if c == "mp" => Expr::neg(Expr::sym(PM)),
                _ => break,
            };
            let pos = self.cur_pos();
            self.pos += 1;
            let terms = match acc.as_mut() {
                Some(t) => t,
                None => {
                    let f = first.take().ok_or(ParseError::Empty)?;
                    acc.insert(vec![scalar(f, pos)?])
                }
            };
            let t = self.parse_term()?;
            terms.push(Expr::mul(vec![sign, scalar(t, pos)?]));
        }
        match (acc, first) {
            (Some(terms), _) => Ok(Value::Scalar(Expr::add(terms))),
            (None, Some(f)) => Ok(f),
            (None, None) => Err(ParseError::Empty),
        }
    }

    /// Whether the next token can start an implicitly multiplied factor.
    fn starts_factor(&self) -> bool {
        match self.peek() {
            Some(Tok::Num(_)) | Some(Tok::Letter(_)) | Some(Tok::Ch('(')) => true,
            Some(Tok::Ch('|')) => self.abs_depth == 0,
            Some(Tok::Ch('{')) => true,
            Some(Tok::Cmd(c)) => {
                let c = c.as_str();
                matches!(
                    c,
                    "frac"
                        | "dfrac"
                        | "tfrac"
                        | "cfrac"
                        | "sqrt"
                        | "pi"
                        | "infty"
                        | "infin"
                        | "ln"
                        | "log"
                        | "lg"
                        | "binom"
                        | "dbinom"
                        | "tbinom"
                        | "lfloor"
                        | "lceil"
                        | "lvert"
                        | "vert"
                        | "mathbf"
                        | "boldsymbol"
                        | "mathit"
                        | "mathcal"
                        | "mathbb"
                        | "bar"
                        | "hat"
                        | "vec"
                        | "overline"
                ) || func_of(c).is_some()
                    || GREEK.contains(&c)
            }
            Some(Tok::Begin(_)) => false,
            _ => false,
        }
    }

    fn parse_term(&mut self) -> PResult<Value> {
        let start = self.cur_pos();
        let first = self.parse_unary()?;
        let mut acc: Option<Vec<Expr>> = None;
        let mut first = Some(first);
        loop {
            // Units and words after an operand are decoration.
            if let Some(Tok::Text(t)) = self.peek().cloned()
                && !is_separator_text(&t)
            {
                self.pos += 1;
                let word = normalize_text(&t);
                let mult = match word.as_str() {
                    "thousand" => Some(3),
                    "million" => Some(6),
                    "billion" => Some(9),
                    "trillion" => Some(12),
                    _ => None,
                };
                if let (Some(k), Some(f)) = (mult, first.as_ref()) {
                    let e = Expr::mul(vec![
                        scalar(f.clone(), start)?,
                        Expr::pow(Expr::int(10), Expr::int(k)),
                    ]);
                    first = Some(Value::Scalar(e));
                    continue;
                }
                if let (Some(k), Some(terms)) = (mult, acc.as_mut()) {
                    terms.push(Expr::pow(Expr::int(10), Expr::int(k)));
                    continue;
                }
                let power = self.skip_unit_power();
                if word == "%" || word == "percent" {
                    self.percent = true;
                } else if !word.is_empty() {
                    self.units.push(if power.is_empty() {
                        word
                    } else {
                        format!("{word}^{power}")
                    });
                }
                continue;
            }
            // `(a, b) U (c, d)`: a letter U after a non-scalar is a union.
            if matches!(self.peek(), Some(Tok::Letter('U')))
                && matches!(first, Some(ref f) if !matches!(f, Value::Scalar(_)))
            {
                break;
            }
            let (divide, explicit) = match self.peek() {
                Some(Tok::Ch('*')) => (false, true),
                Some(Tok::Cmd(c)) if c == "cdot" || c == "times" || c == "ast" => (false, true),
                Some(Tok::Ch('/')) => (true, true),
                Some(Tok::Cmd(c)) if c == "div" => (true, true),
                _ if self.starts_factor() => (false, false),
                _ => break,
            };
            let pos = self.cur_pos();
            if explicit {
                self.pos += 1;
            }
            let terms = match acc.as_mut() {
                Some(t) => t,
                None => {
                    let f = first.take().ok_or(ParseError::Empty)?;
                    acc.insert(vec![scalar(f, start)?])
                }
            };
            let rhs = scalar(self.parse_unary()?, pos)?;
            terms.push(if divide {
                Expr::pow(rhs, Expr::int(-1))
            } else {
                rhs
            });
        }
        match (acc, first) {
            (Some(f), _) => Ok(Value::Scalar(Expr::mul(f))),
            (None, Some(f)) => Ok(f),
            (None, None) => Err(ParseError::Empty),
        }
    }

    /// Skips a `^2` / `^{3}` after a unit; returns the power's text.
    fn skip_unit_power(&mut self) -> String {
        let mut out = String::new();
        if self.is_ch('^') {
            match self.peek_at(1).cloned() {
                Some(Tok::Num(n)) => {
                    self.pos += 2;
                    out = n;
                }
                Some(Tok::Ch('{')) => {
                    let mut k = self.pos + 2;
                    while k < self.toks.len() && self.toks[k].tok != Tok::Ch('}') {
                        if let Tok::Num(n) = &self.toks[k].tok {
                            out.push_str(n);
                        }
                        k += 1;
                    }
                    self.pos = (k + 1).min(self.toks.len());
                }
                _ => {}
            }
        }
        out
    }

    fn parse_unary(&mut self) -> PResult<Value> {
        self.enter()?;
        let r = self.parse_unary_inner();
        self.leave();
        r
    }

    fn parse_unary_inner(&mut self) -> PResult<Value> {
        let pos = self.cur_pos();
        let sign = match self.peek() {
            Some(Tok::Ch('-')) => Some(Expr::int(-1)),
            Some(Tok::Ch('+')) => Some(Expr::int(1)),
            Some(Tok::Cmd(c)) if c == "pm" => Some(Expr::sym(PM)),
            Some(Tok::Cmd(c)) if c == "mp" => Some(Expr::neg(Expr::sym(PM))),
            _ => None,
        };
        if let Some(s) = sign {
            self.pos += 1;
            let v = self.parse_unary()?;
            // `-\infty` in interval ends, `-(…)` of a scalar.
            return Ok(Value::Scalar(Expr::mul(vec![s, scalar(v, pos)?])));
        }
        self.parse_power()
    }

    /// Exponent after `^`: a group, or a signed single token (a whole number: `2^10`).
    fn parse_exponent(&mut self) -> PResult<Expr> {
        let pos = self.cur_pos();
        if self.is_ch('{') {
            return scalar(self.parse_primary()?, pos);
        }
        let neg = if self.eat_ch('-') {
            true
        } else {
            self.eat_ch('+');
            false
        };
        let e = match self.peek() {
            Some(Tok::Num(_)) | Some(Tok::Letter(_)) => scalar(self.parse_atom_token()?, pos)?,
            _ => scalar(self.parse_primary()?, pos)?,
        };
        Ok(if neg { Expr::neg(e) } else { e })
    }

    /// A number or a letter (with subscript) only.
    fn parse_atom_token(&mut self) -> PResult<Value> {
        let pos = self.cur_pos();
        match self.peek().cloned() {
            Some(Tok::Num(n)) => {
                self.pos += 1;
                Ok(Value::Scalar(Expr::Num(
                    decimal(&n).ok_or(ParseError::Unexpected { pos, found: n })?,
                )))
            }
            Some(Tok::Letter(_)) => self.parse_primary(),
            _ => Err(self.unexpected()),
        }
    }

    fn is_degree_mark(&self) -> bool {
        // `^\circ`, `^{\circ}`
        self.is_ch('^')
            && (self.peek_at(1) == Some(&Tok::Cmd("circ".into()))
                || (self.peek_at(1) == Some(&Tok::Ch('{'))
                    && self.peek_at(2) == Some(&Tok::Cmd("circ".into()))
                    && self.peek_at(3) == Some(&Tok::Ch('}'))))
    }

    fn parse_power(&mut self) -> PResult<Value> {
        let pos = self.cur_pos();
        let mut base = self.parse_primary()?;
        loop {
            let degree = if self.is_degree_mark() {
                self.pos += if self.peek_at(1) == Some(&Tok::Ch('{')) {
                    4
                } else {
                    2
                };
                true
            } else {
                self.eat_cmd("degree") || self.eat_cmd("circ")
            };
            if degree {
                if self.func_depth == 0 {
                    self.degrees = true;
                }
                if self.func_depth > 0 || self.degrees_to_radians {
                    let to_rad = Expr::div(Expr::Const(Constant::Pi), Expr::int(180));
                    base = Value::Scalar(Expr::mul(vec![scalar(base, pos)?, to_rad]));
                }
                continue;
            }
            if self.eat_cmd("%") {
                self.percent = true;
                continue;
            }
            if self.eat_ch('!') {
                if self.is_ch('!') {
                    return Err(ParseError::Unsupported("double factorial".into()));
                }
                base = Value::Scalar(Expr::func(Func::Factorial, vec![scalar(base, pos)?]));
                continue;
            }
            if self.is_ch('\'') {
                return Err(ParseError::Unsupported("prime".into()));
            }
            if self.eat_ch('^') {
                let e = self.parse_exponent()?;
                // Transpose-like `^T` on matrices is not supported.
                base = Value::Scalar(Expr::pow(scalar(base, pos)?, e));
                continue;
            }
            break;
        }
        Ok(base)
    }

    /// A `{…}` group or a single token argument (for `\frac`, `\sqrt`): a multi-digit number
    /// gives only its first digit (`\frac12`).
    fn parse_arg(&mut self) -> PResult<Expr> {
        let pos = self.cur_pos();
        if let Some(Tok::Num(n)) = self.peek().cloned() {
            let mut chars = n.chars();
            if let Some(first) = chars.next() {
                let rest: String = chars.collect();
                if rest.is_empty() || first == '.' {
                    self.pos += 1;
                    return Ok(Expr::Num(
                        decimal(&n).ok_or(ParseError::Unexpected { pos, found: n })?,
                    ));
                }
                self.toks[self.pos].tok = Tok::Num(rest);
                return Ok(Expr::Num(
                    decimal(&first.to_string()).unwrap_or_else(Rational::zero),
                ));
            }
        }
        if self.is_ch('{') {
            return scalar(self.parse_primary()?, pos);
        }
        if let Some(Tok::Letter(_)) = self.peek() {
            let c = self.peek().cloned();
            self.pos += 1;
            if let Some(Tok::Letter(c)) = c {
                return Ok(letter_expr(c));
            }
        }
        scalar(self.parse_primary()?, pos)
    }

    /// Items of a bracketed group up to one of the closers; returns the items and the closer.
    fn parse_items(&mut self, closers: &[Tok]) -> PResult<(Vec<Value>, Tok)> {
        let mut items = Vec::new();
        loop {
            if let Some(t) = self.peek()
                && closers.contains(t)
                && items.is_empty()
            {
                let t = t.clone();
                self.pos += 1;
                return Ok((items, t));
            }
            items.push(self.parse_relation()?);
            match self.peek().cloned() {
                Some(t) if closers.contains(&t) => {
                    self.pos += 1;
                    return Ok((items, t));
                }
                _ if self.at_separator() => {
                    self.pos += 1;
                }
                _ => return Err(self.unexpected()),
            }
        }
    }

    fn parse_primary(&mut self) -> PResult<Value> {
        self.enter()?;
        let r = self.parse_primary_inner();
        self.leave();
        r
    }

    fn parse_primary_inner(&mut self) -> PResult<Value> {
        let pos = self.cur_pos();
        let Some(tok) = self.peek().cloned() else {
            return Err(self.unexpected());
        };
        match tok {
            Tok::Num(n) => {
                self.pos += 1;
                let mut r = decimal(&n).ok_or(ParseError::Unexpected {
                    pos,
                    found: n.clone(),
                })?;
                // Repeating decimal `0.\overline{3}`.
                if n.contains('.')
                    && (self.is_cmd("overline") || self.is_cmd("dot") || self.is_cmd("bar"))
                {
                    self.pos += 1;
                    let rep = self.raw_digits_group()?;
                    r = repeating(&n, &rep).ok_or(ParseError::Unexpected { pos, found: rep })?;
                }
                let v = Expr::Num(r.clone());
                // Mixed numbers: `2\frac{1}{3}`, `7 3/4`.
                if !n.contains('.')
                    && let Some(f) = self.mixed_fraction()?
                {
                    return Ok(Value::Scalar(Expr::Num(r.add(&f))));
                }
                Ok(Value::Scalar(v))
            }
            Tok::Letter(c) => {
                self.pos += 1;
                if self.is_ch('_') {
                    self.pos += 1;
                    let sub = self.raw_subscript()?;
                    return Ok(Value::Scalar(Expr::sym(&format!("{c}_{sub}"))));
                }
                Ok(Value::Scalar(letter_expr(c)))
            }
            Tok::Ch('(') | Tok::Ch('[') => {
                self.pos += 1;
                let closers = [Tok::Ch(')'), Tok::Ch(']')];
                let (mut items, close) = self.parse_items(&closers)?;
                let open_sq = tok == Tok::Ch('[');
                let close_sq = close == Tok::Ch(']');
                match items.len() {
                    0 => Err(ParseError::Unexpected {
                        pos,
                        found: "empty brackets".into(),
                    }),
                    1 if open_sq == close_sq => Ok(items.pop().unwrap_or(Value::EmptySet)),
                    2 if open_sq || close_sq => {
                        let hi = scalar(items.pop().unwrap_or(Value::EmptySet), pos)?;
                        let lo = scalar(items.pop().unwrap_or(Value::EmptySet), pos)?;
                        Ok(Value::Interval(Interval {
                            lo,
                            hi,
                            lo_closed: open_sq,
                            hi_closed: close_sq,
                        }))
                    }
                    _ if !open_sq && !close_sq => Ok(Value::Tuple(items)),
                    _ if open_sq && close_sq => Ok(Value::Tuple(items)),
                    _ => Err(ParseError::Unexpected {
                        pos,
                        found: "mismatched brackets".into(),
                    }),
                }
            }
            Tok::Ch('{') => {
                self.pos += 1;
                if self.eat_ch('}') {
                    // `{}`: an empty group (e.g. `{}^\circ`); treat as nothing.
                    return Err(ParseError::Unexpected {
                        pos,
                        found: "{}".into(),
                    });
                }
                let saved = self.abs_depth;
                self.abs_depth = 0;
                let v = self.parse_top_until('}');
                self.abs_depth = saved;
                let mut v = v?;
                // `{a \over b}`, `{n \choose k}`.
                if self.is_cmd("over") || self.is_cmd("choose") {
                    let over = self.is_cmd("over");
                    self.pos += 1;
                    let d = scalar(self.parse_sum()?, pos)?;
                    let n = scalar(v, pos)?;
                    v = Value::Scalar(if over {
                        Expr::div(n, d)
                    } else {
                        Expr::func(Func::Binomial, vec![n, d])
                    });
                }
                self.expect_ch('}')?;
                Ok(v)
            }
            Tok::Ch('|') => {
                self.pos += 1;
                self.abs_depth += 1;
                let v = self.parse_sum();
                self.abs_depth -= 1;
                let e = scalar(v?, pos)?;
                self.expect_ch('|')?;
                Ok(Value::Scalar(Expr::func(Func::Abs, vec![e])))
            }
            Tok::Text(t) => {
                self.pos += 1;
                let trimmed = t.trim();
                if trimmed.is_empty() {
                    return self.parse_primary();
                }
                // Numbers or math inside `\text{}`.
                if trimmed
                    .chars()
                    .all(|c| c.is_ascii_digit() || ",.-+/ ".contains(c))
                {
                    let inner = parse_latex_with(trimmed, self.budget)?;
                    return Ok(inner);
                }
                Ok(Value::Text(normalize_text(trimmed)))
            }
            Tok::Begin(env) => {
                self.pos += 1;
                self.parse_matrix(&env)
            }
            Tok::Cmd(c) => self.parse_command(&c, pos),
            _ => Err(self.unexpected()),
        }
    }

    /// Parses a list up to (not consuming) the closing char.
    fn parse_top_until(&mut self, close: char) -> PResult<Value> {
        let mut items = vec![self.parse_relation()?];
        while self.at_separator() {
            self.pos += 1;
            if self.is_ch(close) {
                break;
            }
            items.push(self.parse_relation()?);
        }
        Ok(if items.len() == 1 {
            items.pop().unwrap_or(Value::EmptySet)
        } else {
            Value::List(items)
        })
    }

    /// After an integer: a following `\frac{p}{q}` of integers or ` p/q` (with a space) makes a
    /// mixed number; returns the fraction.
    fn mixed_fraction(&mut self) -> PResult<Option<Rational>> {
        let int_tok = |t: Option<&Tok>| match t {
            Some(Tok::Num(n)) if !n.contains('.') => decimal(n),
            _ => None,
        };
        // `7 3/4`
        if self.toks.get(self.pos).is_some_and(|t| t.space_before)
            && let (Some(p), Some(Tok::Ch('/')), Some(q)) = (
                int_tok(self.peek()),
                self.peek_at(1),
                int_tok(self.peek_at(2)),
            )
            && let Some(f) = p.div(&q)
        {
            let after = self.peek_at(3);
            if !matches!(
                after,
                Some(Tok::Letter(_)) | Some(Tok::Ch('(')) | Some(Tok::Ch('^'))
            ) {
                self.pos += 3;
                return Ok(Some(f));
            }
        }
        // `2\frac{1}{3}` / `2\frac13`
        if matches!(self.peek(), Some(Tok::Cmd(c)) if matches!(c.as_str(), "frac" | "dfrac" | "tfrac"))
        {
            let save = self.pos;
            let saved_toks = self.toks.get(self.pos + 1).cloned();
            self.pos += 1;
            if let (Ok(Expr::Num(p)), Ok(Expr::Num(q))) = (self.parse_arg(), self.parse_arg())
                && p.is_integer()
                && q.is_integer()
                && !p.is_negative()
                && let Some(f) = p.div(&q)
            {
                return Ok(Some(f));
            }
            self.pos = save;
            if let Some(t) = saved_toks
                && let Some(slot) = self.toks.get_mut(save + 1)
            {
                *slot = t;
            }
        }
        Ok(None)
    }

    /// `{123}` or a single digit after `\overline`.
    fn raw_digits_group(&mut self) -> PResult<String> {
        let pos = self.cur_pos();
        if self.eat_ch('{') {
            let mut s = String::new();
            while let Some(Tok::Num(n)) = self.peek().cloned() {
                s.push_str(&n);
                self.pos += 1;
            }
            self.expect_ch('}')?;
            if s.chars().all(|c| c.is_ascii_digit()) && !s.is_empty() {
                return Ok(s);
            }
        } else if let Some(Tok::Num(n)) = self.peek().cloned() {
            self.pos += 1;
            return Ok(n);
        }
        Err(ParseError::Unexpected {
            pos,
            found: "repeating digits".into(),
        })
    }

    /// The subscript after `_` as raw text (`x_1`, `a_{10}`, `x_n`).
    fn raw_subscript(&mut self) -> PResult<String> {
        let pos = self.cur_pos();
        match self.peek().cloned() {
            Some(Tok::Num(n)) => {
                self.pos += 1;
                Ok(n)
            }
            Some(Tok::Letter(c)) => {
                self.pos += 1;
                Ok(c.to_string())
            }
            Some(Tok::Ch('{')) => {
                self.pos += 1;
                let mut s = String::new();
                let mut depth = 1usize;
                while let Some(t) = self.peek().cloned() {
                    self.pos += 1;
                    match t {
                        Tok::Ch('{') => depth += 1,
                        Tok::Ch('}') => {
                            depth -= 1;
                            if depth == 0 {
                                return Ok(s);
                            }
                        }
                        _ => {}
                    }
                    match t {
                        Tok::Num(n) => s.push_str(&n),
                        Tok::Letter(c) | Tok::Ch(c) => s.push(c),
                        Tok::Cmd(c) | Tok::Text(c) => s.push_str(&c),
                        _ => {}
                    }
                }
                Err(ParseError::Unexpected {
                    pos,
                    found: "unclosed subscript".into(),
                })
            }
            Some(Tok::Cmd(c)) => {
                self.pos += 1;
                Ok(c)
            }
            _ => Err(self.unexpected()),
        }
    }

    fn parse_matrix(&mut self, env: &str) -> PResult<Value> {
        let pos = self.cur_pos();
        if !matches!(
            env,
            "pmatrix" | "bmatrix" | "matrix" | "vmatrix" | "Bmatrix" | "array" | "smallmatrix"
        ) {
            return Err(ParseError::Unsupported(format!("environment {env}")));
        }
        let mut rows: Vec<Vec<Expr>> = vec![Vec::new()];
        loop {
            match self.peek().cloned() {
                Some(Tok::End(e)) => {
                    self.pos += 1;
                    if e != env {
                        return Err(ParseError::Unexpected {
                            pos,
                            found: format!("\\end{{{e}}}"),
                        });
                    }
                    break;
                }
                Some(Tok::Cmd(c)) if c == "\\" => {
                    self.pos += 1;
                    rows.push(Vec::new());
                }
                Some(Tok::Ch('&')) => {
                    self.pos += 1;
                }
                None => return Err(self.unexpected()),
                _ => {
                    let e = scalar(self.parse_sum()?, pos)?;
                    if let Some(r) = rows.last_mut() {
                        r.push(e);
                    }
                }
            }
        }
        while rows.last().is_some_and(Vec::is_empty) {
            rows.pop();
        }
        let w = rows.first().map_or(0, Vec::len);
        if w == 0 || rows.iter().any(|r| r.len() != w) {
            return Err(ParseError::Unsupported("ragged matrix".into()));
        }
        if env == "vmatrix" {
            return Err(ParseError::Unsupported("determinant".into()));
        }
        Ok(Value::Matrix(rows))
    }

    fn parse_command(&mut self, c: &str, pos: usize) -> PResult<Value> {
        self.pos += 1;
        let s = |e: Expr| Ok(Value::Scalar(e));
        match c {
            "frac" | "dfrac" | "tfrac" | "cfrac" => {
                let a = self.parse_arg()?;
                let b = self.parse_arg()?;
                s(Expr::div(a, b))
            }
            "sqrt" => {
                let mut n = Expr::int(2);
                if self.eat_ch('[') {
                    let v = self.parse_sum()?;
                    n = scalar(v, pos)?;
                    self.expect_ch(']')?;
                }
                let x = self.parse_arg()?;
                // Real odd roots of negative numbers.
                if let (Some(k), Some(r)) =
                    (n.as_rational().and_then(Rational::to_i64), x.as_rational())
                    && r.is_negative()
                    && k % 2 != 0
                {
                    return s(Expr::neg(Expr::root(Expr::Num(r.neg()), k)));
                }
                s(Expr::pow(x, Expr::pow(n, Expr::int(-1))))
            }
            "pi" => s(Expr::Const(Constant::Pi)),
            "infty" | "infin" | "inf" => s(Expr::Const(Constant::Infinity)),
            "emptyset" | "varnothing" | "O" => Ok(Value::EmptySet),
            "{" | "lbrace" => {
                if self.eat_cmd("}") || self.eat_cmd("rbrace") {
                    return Ok(Value::EmptySet);
                }
                let mut items = vec![self.parse_relation()?];
                while self.at_separator() {
                    self.pos += 1;
                    items.push(self.parse_relation()?);
                }
                if !(self.eat_cmd("}") || self.eat_cmd("rbrace")) {
                    return Err(self.unexpected());
                }
                Ok(Value::Set(items))
            }
            "lfloor" | "lceil" => {
                let v = scalar(self.parse_sum()?, pos)?;
                let close = if c == "lfloor" { "rfloor" } else { "rceil" };
                if !self.eat_cmd(close) {
                    return Err(self.unexpected());
                }
                s(Expr::func(
                    if c == "lfloor" {
                        Func::Floor
                    } else {
                        Func::Ceil
                    },
                    vec![v],
                ))
            }
            "lvert" | "vert" | "|" => {
                self.abs_depth += 1;
                let v = self.parse_sum();
                self.abs_depth -= 1;
                let e = scalar(v?, pos)?;
                if !(self.eat_cmd("rvert")
                    || self.eat_cmd("vert")
                    || self.eat_cmd("|")
                    || self.eat_ch('|'))
                {
                    return Err(self.unexpected());
                }
                s(Expr::func(Func::Abs, vec![e]))
            }
            "binom" | "dbinom" | "tbinom" => {
                let a = self.parse_arg()?;
                let b = self.parse_arg()?;
                s(Expr::func(Func::Binomial, vec![a, b]))
            }
            "ln" | "log" | "lg" => {
                let mut base = match c {
                    "ln" => Expr::Const(Constant::E),
                    _ => Expr::int(10),
                };
                if self.eat_ch('_') {
                    base = self.parse_arg()?;
                }
                let power = if self.eat_ch('^') {
                    Some(self.parse_exponent()?)
                } else {
                    None
                };
                let x = self.parse_func_arg()?;
                let v = Expr::log(x, base);
                s(match power {
                    Some(p) => Expr::pow(v, p),
                    None => v,
                })
            }
            "mathbb"
                if matches!(self.peek_at(1), Some(Tok::Letter('R')))
                    && self.is_ch('{')
                    && self.peek_at(2) == Some(&Tok::Ch('}')) =>
            {
                self.pos += 3;
                Ok(Value::Interval(Interval {
                    lo: Expr::neg(Expr::Const(Constant::Infinity)),
                    hi: Expr::Const(Constant::Infinity),
                    lo_closed: false,
                    hi_closed: false,
                }))
            }
            "mathbf" | "boldsymbol" | "mathit" | "mathcal" | "mathbb" | "bar" | "hat" | "vec"
            | "overline" | "widehat" | "tilde" | "bm" | "mathsf" | "mathtt" | "underline"
            | "overrightarrow" => {
                let pos = self.cur_pos();
                if self.is_ch('{') {
                    return self.parse_primary();
                }
                let v = self.parse_arg()?;
                let _ = pos;
                s(v)
            }
            "circ" | "degree" | "%" => Err(ParseError::Unexpected {
                pos,
                found: c.into(),
            }),
            "cdots" | "ldots" | "dots" | "vdots" => Err(ParseError::Unsupported("ellipsis".into())),
            _ if GREEK.contains(&c) => s(Expr::sym(c)),
            _ => {
                if let Some(f) = func_of(c) {
                    let mut power = None;
                    let mut f = f;
                    if self.eat_ch('^') {
                        let p = self.parse_exponent()?;
                        if p == Expr::int(-1) {
                            f = inverse_of(f).ok_or(ParseError::Unsupported("inverse".into()))?;
                        } else {
                            power = Some(p);
                        }
                    }
                    let args = if matches!(f, Func::Gcd | Func::Lcm | Func::Min | Func::Max) {
                        self.parse_call_args()?
                    } else {
                        vec![self.parse_func_arg()?]
                    };
                    let v = Expr::func(f, args);
                    return s(match power {
                        Some(p) => Expr::pow(v, p),
                        None => v,
                    });
                }
                Err(ParseError::Unsupported(format!("\\{c}")))
            }
        }
    }

    /// `(a, b, …)` argument list.
    fn parse_call_args(&mut self) -> PResult<Vec<Expr>> {
        let pos = self.cur_pos();
        if !self.eat_ch('(') {
            return Err(self.unexpected());
        }
        let (items, close) = self.parse_items(&[Tok::Ch(')')])?;
        if close != Tok::Ch(')') {
            return Err(self.unexpected());
        }
        items.into_iter().map(|v| scalar(v, pos)).collect()
    }

    /// The argument of `\sin`, `\log`, …: a parenthesised/braced group, or an implicit product
    /// of simple factors (`\sin 2x`).
    fn parse_func_arg(&mut self) -> PResult<Expr> {
        self.func_depth += 1;
        let r = self.parse_func_arg_inner();
        self.func_depth -= 1;
        r
    }

    fn parse_func_arg_inner(&mut self) -> PResult<Expr> {
        let pos = self.cur_pos();
        if self.is_ch('(') || self.is_ch('{') {
            let v = self.parse_power()?;
            return scalar(v, pos);
        }
        let mut factors = vec![scalar(self.parse_unary()?, pos)?];
        while matches!(self.peek(), Some(Tok::Num(_)) | Some(Tok::Letter(_)))
            || matches!(self.peek(), Some(Tok::Cmd(c)) if c == "pi" || GREEK.contains(&c.as_str()))
        {
            factors.push(scalar(self.parse_power()?, pos)?);
        }
        Ok(Expr::mul(factors))
    }
}

fn is_separator_text(t: &str) -> bool {
    let t = t.trim().to_ascii_lowercase();
    t == "and" || t == "or" || t == ","
}

fn letter_expr(c: char) -> Expr {
    match c {
        'e' => Expr::Const(Constant::E),
        'i' => Expr::Const(Constant::I),
        _ => Expr::sym(&c.to_string()),
    }
}

/// `0.1\overline{6}`: `n` is the written part (`0.1`), `rep` the repeating digits.
fn repeating(n: &str, rep: &str) -> Option<Rational> {
    let (int, frac) = n.split_once('.')?;
    let all = format!("{int}{frac}{rep}");
    let head = format!("{int}{frac}");
    let a: BigInt = all.parse().ok()?;
    let h: BigInt = if head.is_empty() {
        BigInt::zero()
    } else {
        head.parse().ok()?
    };
    let ten = BigInt::from(10);
    let p1 = num_traits::pow::Pow::pow(&ten, u32::try_from(frac.len()).ok()?);
    let p2 = num_traits::pow::Pow::pow(&ten, u32::try_from(rep.len()).ok()?) - BigInt::one();
    Rational::new(a - h, p1 * p2)
}

/// Lower case, single spaces, trimmed.
pub(crate) fn normalize_text(s: &str) -> String {
    s.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .to_lowercase()
}

/// `A \setminus \{p, q\}` for an interval (or union) `A` and numeric points.
fn set_minus(a: Value, removed: Value) -> Result<Value, ParseError> {
    let unsupported = || ParseError::Unsupported("set difference".into());
    let points: Vec<Expr> = match removed {
        Value::Set(items) => items
            .into_iter()
            .map(|v| match v {
                Value::Scalar(e) => Ok(e),
                _ => Err(unsupported()),
            })
            .collect::<Result<_, _>>()?,
        Value::EmptySet => Vec::new(),
        _ => return Err(unsupported()),
    };
    let mut parts: Vec<Interval> = match a {
        Value::Interval(i) => vec![i],
        Value::Union(v) => v
            .into_iter()
            .map(|x| match x {
                Value::Interval(i) => Ok(i),
                _ => Err(unsupported()),
            })
            .collect::<Result<_, _>>()?,
        _ => return Err(unsupported()),
    };
    let b = Budget::default();
    let num = |e: &Expr| -> Option<f64> {
        match e {
            Expr::Const(Constant::Infinity) => Some(f64::INFINITY),
            _ if e.has_infinity() => Some(f64::NEG_INFINITY),
            _ => e
                .eval(&|_| num_complex::Complex64::new(f64::NAN, 0.0), &b)
                .filter(|z| z.im == 0.0)
                .map(|z| z.re),
        }
    };
    let mut sorted: Vec<(f64, Expr)> = points
        .into_iter()
        .map(|p| Ok((num(&p).ok_or_else(unsupported)?, p)))
        .collect::<Result<_, ParseError>>()?;
    sorted.sort_by(|x, y| x.0.total_cmp(&y.0));
    for (pv, p) in sorted {
        let mut next = Vec::new();
        for iv in parts {
            let (lo, hi) = (
                num(&iv.lo).ok_or_else(unsupported)?,
                num(&iv.hi).ok_or_else(unsupported)?,
            );
            if pv > lo && pv < hi {
                next.push(Interval {
                    lo: iv.lo.clone(),
                    hi: p.clone(),
                    lo_closed: iv.lo_closed,
                    hi_closed: false,
                });
                next.push(Interval {
                    lo: p.clone(),
                    hi: iv.hi,
                    lo_closed: false,
                    hi_closed: iv.hi_closed,
                });
            } else if pv == lo && iv.lo_closed {
                next.push(Interval {
                    lo_closed: false,
                    ..iv
                });
            } else if pv == hi && iv.hi_closed {
                next.push(Interval {
                    hi_closed: false,
                    ..iv
                });
            } else {
                next.push(iv);
            }
        }
        parts = next;
    }
    Ok(if parts.len() == 1 {
        Value::Interval(parts.remove(0))
    } else {
        Value::Union(parts.into_iter().map(Value::Interval).collect())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn eq(a: &str, b: &str) -> bool {
        let (x, y) = (parse_latex_expr(a).unwrap(), parse_latex_expr(b).unwrap());
        super::super::expr::scalar_equal(&x, &y) == Some(true)
    }

    #[test]
    fn numbers() {
        assert!(eq("1{,}000", "1000"));
        assert!(eq("1,000,000", "10^6"));
        assert!(eq(r"1\,000", "1000"));
        assert!(eq(r"\frac12", "0.5"));
        assert!(eq(r"2\frac{1}{3}", r"\frac73"));
        assert!(eq("7 3/4", "31/4"));
        assert!(eq(r"0.\overline{3}", r"\frac13"));
        assert!(eq(r"0.1\overline{6}", r"\frac16"));
        assert!(eq(r"\sqrt{8}", r"2\sqrt2"));
        assert!(eq(r"\frac{1}{\sqrt2}", r"\frac{\sqrt2}{2}"));
        assert!(eq(r"\sqrt[3]{-8}", "-2"));
        assert!(eq(r"30^\circ", "30"));
        assert!(eq(r"\$5", "5"));
        assert!(eq(r"50\%", "50"));
        assert!(eq(r"5\text{ cm}^2", "5"));
        assert!(eq(r"\log_2 8", "3"));
        assert!(eq(r"\sin^2 x + \cos^2 x", "1"));
        assert!(eq(r"x(x+1)", "x^2+x"));
        assert!(eq(r"2^10", "1024"));
        assert!(!eq(r"\pi", "3.14"));
        assert!(!eq(r"\sqrt2", "1.4142135623730951"));
        assert!(!eq(r"\ln 2", "0.69314718056"));
        assert!(!eq(r"\frac{\sqrt2}{2}", "0.70710678118654752440"));
        assert!(eq(r"\sin\frac{\pi}{6}", "0.5"));
        assert!(eq(r"\cos 60^\circ", "0.5"));
        assert!(eq(r"e^{\ln 3}", "3"));
        assert!(eq(r"\left( \frac{3}{2} \right)", "1.5"));
    }

    #[test]
    fn values() {
        assert!(matches!(parse_latex("(1, 2]").unwrap(), Value::Interval(_)));
        assert!(matches!(parse_latex("(1, 2)").unwrap(), Value::Tuple(_)));
        assert!(matches!(parse_latex(r"\{1, 2\}").unwrap(), Value::Set(_)));
        assert!(matches!(parse_latex(r"x = 5").unwrap(), Value::Relation(_)));
        assert!(matches!(parse_latex(r"1, 2").unwrap(), Value::List(_)));
        assert!(matches!(
            parse_latex(r"1 \text{ and } 2").unwrap(),
            Value::List(_)
        ));
        assert!(matches!(
            parse_latex(r"(-\infty, 1) \cup (2, \infty)").unwrap(),
            Value::Union(_)
        ));
        assert!(matches!(
            parse_latex(r"\begin{pmatrix} 1 & 2 \\ 3 & 4 \end{pmatrix}").unwrap(),
            Value::Matrix(_)
        ));
        assert!(matches!(
            parse_latex(r"\pm 2").unwrap(),
            Value::PlusMinus(..)
        ));
        assert!(matches!(
            parse_latex(r"\text{Monday}").unwrap(),
            Value::Text(_)
        ));
        assert!(matches!(
            parse_latex(r"\varnothing").unwrap(),
            Value::EmptySet
        ));
    }

    #[test]
    fn hostile() {
        let deep = "(".repeat(10_000) + "1" + &")".repeat(10_000);
        assert!(parse_latex(&deep).is_err());
        let big = "1+".repeat(600_000);
        assert!(parse_latex(&big).is_err());
        assert!(parse_latex(r"\frac{").is_err());
        assert!(parse_latex(r"\sqrt").is_err());
        assert!(parse_latex(r"}").is_err());
    }
}

#[cfg(test)]
mod doc_examples {
    #[test]
    fn example_1() {
        use crate::reward::math::expr::Value;
        use crate::reward::math::latex::parse_latex;
        assert!(matches!(
            parse_latex(r"\left[ 1, \infty \right)").unwrap(),
            Value::Interval(_)
        ));
    }
    #[test]
    fn example_2() {
        use crate::reward::math::expr::scalar_equal;
        use crate::reward::math::latex::parse_latex_expr;
        let a = parse_latex_expr(r"\frac{\sqrt{8}}{2}").unwrap();
        let b = parse_latex_expr(r"\sqrt2").unwrap();
        assert_eq!(a, b);
        assert_eq!(scalar_equal(&a, &b), Some(true));
    }
}
