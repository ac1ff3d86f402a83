//! Emulation of the cookbook sympy grader's last step on plain text.
//!
//! The cookbook's `are_equal_under_sympy(gt, given)` builds `f"({gt})-({given})"`, rejects it
//! with `should_allow_eval` (more than two distinct letters once `sqrt`/`frac` are removed,
//! `^{`, `^(`, `^12`, `^1^`), parses it with sympy's `parse_expr` (standard transformations +
//! `implicit_multiplication_application`, after `^` → `**`) and accepts when
//! `simplify(diff) == 0`. Its input is lower-cased text from `_normalize` (pylatexenc output:
//! `sqrt`, `pi`, `(a)/(b)`).
//!
//! What `parse_expr` does with that text, as verified against sympy 1.14:
//! * Python tokens: numbers follow Python's grammar (`2e3` and `1.5` are floats — kept exact
//!   here —, `2j` is `2i`, `05` is the two tokens `0`,`5`, `2.5.5` is `2.5·.5`);
//! * names known to sympy stay: `pi` (π), `oo` (∞), `sqrt`, `ln`, `csc`, `frac` (fractional
//!   part), `re`, `im`; `e` and `i` are plain symbols (Euler's number is `E`, the unit `I`, but
//!   the text is lower case); a multi-letter unknown name is split into letters and digit runs
//!   (`pix` = `p·i·x`, `x2` = `2x`, `sqrt2` = `s·q·r·t·2`), except names with `_` and Greek
//!   letter names (`mu`, `nu`, `xi`);
//! * juxtaposition multiplies at the precedence of `*` (`1/2(3)` = 3/2, `(2)3` = 6, `x(x+1)`);
//!   `!` is factorial on the preceding atom (`2**3!` = 64), `!!` the double factorial;
//! * anything else (`,` tuples, `=`, `<`, brackets, unknown characters, `nan`, `zoo`) fails,
//!   which the cookbook's `try/except` turns into "not equal".

pub use super::expr::ParseError;
use super::expr::{Budget, Constant, Expr, Func, Rational, scalar_equal_with};
use super::sympy::should_allow_eval;
use num_bigint::BigInt;
use num_integer::Integer;
use num_traits::{One, Zero};

#[cfg(test)]
/// Parses Python-like text as sympy's `parse_expr` with `standard_transformations +
/// implicit_multiplication_application` would (`^` is read as `**`, as after the cookbook's
/// replacement).
pub fn parse_python(s: &str) -> Result<Expr, ParseError> {
    parse_python_with(s, &Budget::default())
}

/// [`parse_python`] with an explicit budget.
pub fn parse_python_with(s: &str, budget: &Budget) -> Result<Expr, ParseError> {
    if s.len() > budget.max_input_len {
        return Err(ParseError::TooLong(s.len()));
    }
    let s = s.replace('^', "**");
    let toks = tokenize(&s)?;
    if toks.is_empty() {
        return Err(ParseError::Empty);
    }
    let mut p = Parser {
        toks,
        pos: 0,
        depth: 0,
        budget,
    };
    let e = p.expr()?;
    if p.pos < p.toks.len() {
        return Err(p.unexpected());
    }
    Ok(e)
}

/// `are_equal_under_sympy(a, b)` of the cookbook: `should_allow_eval("(a)-(b)")`, parse, then
/// "simplifies to 0" decided by [`scalar_equal`](super::expr::scalar_equal). The cookbook
/// calls it as `(ground_truth, given)`.
pub fn sympy_equal(a: &str, b: &str) -> bool {
    if a.len() + b.len() + 5 > Budget::default().max_input_len {
        return false;
    }
    let expr = format!("({a})-({b})");
    if !should_allow_eval(&expr) {
        return false;
    }
    let budget = Budget::default();
    match parse_python_with(&expr, &budget) {
        Ok(d) => scalar_equal_with(&d, &Expr::int(0), &budget) == Some(true),
        Err(_) => false,
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    /// A number already converted (floats exactly, `j` suffix → imaginary).
    Num(Expr),
    Name(String),
    Op(&'static str),
}

const OPS: &[&str] = &["**", "//", "+", "-", "*", "/", "%", "(", ")"];

/// Python's number tokenizer (the first alternative that matches, as Python's regex does).
fn number_at(c: &[char], i: usize) -> Option<(usize, Expr)> {
    let digits = |mut j: usize| -> usize {
        // [0-9](?:_?[0-9])*
        if !c.get(j).is_some_and(char::is_ascii_digit) {
            return j;
        }
        j += 1;
        loop {
            if c.get(j).is_some_and(char::is_ascii_digit) {
                j += 1;
            } else if c.get(j) == Some(&'_') && c.get(j + 1).is_some_and(char::is_ascii_digit) {
                j += 2;
            } else {
                return j;
            }
        }
    };
    let exponent = |j: usize| -> usize {
        if matches!(c.get(j), Some('e') | Some('E')) {
            let k = if matches!(c.get(j + 1), Some('+') | Some('-')) {
                j + 2
            } else {
                j + 1
            };
            let end = digits(k);
            if end > k {
                return end;
            }
        }
        j
    };
    let text = |a: usize, b: usize| -> String { c[a..b].iter().filter(|&&ch| ch != '_').collect() };
    // Pointfloat / Expfloat (with optional j).
    let int_end = digits(i);
    let mut float_end = None;
    if int_end > i && c.get(int_end) == Some(&'.') {
        let frac_end = digits(int_end + 1);
        float_end = Some(exponent(frac_end));
    } else if int_end == i && c.get(i) == Some(&'.') {
        let frac_end = digits(i + 1);
        if frac_end > i + 1 {
            float_end = Some(exponent(frac_end));
        }
    } else if int_end > i {
        let e = exponent(int_end);
        if e > int_end {
            float_end = Some(e);
        }
    }
    let (end, value) = if let Some(fe) = float_end {
        (fe, parse_float(&text(i, fe))?)
    } else if int_end > i {
        // Imagnumber of an integer, else Decnumber: `0` runs only (`05` is `0`, `5`).
        if matches!(c.get(int_end), Some('j') | Some('J')) {
            (int_end, parse_float(&text(i, int_end))?)
        } else if c[i] == '0' {
            let mut j = i + 1;
            while c.get(j) == Some(&'0') || (c.get(j) == Some(&'_') && c.get(j + 1) == Some(&'0')) {
                j += if c[j] == '_' { 2 } else { 1 };
            }
            (j, Expr::int(0))
        } else {
            (
                int_end,
                Expr::Num(Rational::from_int(text(i, int_end).parse::<BigInt>().ok()?)),
            )
        }
    } else {
        return None;
    };
    if matches!(c.get(end), Some('j') | Some('J')) {
        return Some((end + 1, Expr::mul(vec![value, Expr::Const(Constant::I)])));
    }
    Some((end, value))
}

/// A decimal literal (`1.5`, `2e3`, `.5`, `5.`) as an exact rational, if not absurdly large.
fn parse_float(s: &str) -> Option<Expr> {
    let (mant, exp) = match s.find(['e', 'E']) {
        Some(k) => (&s[..k], s[k + 1..].parse::<i64>().ok()?),
        None => (s, 0),
    };
    let (int, frac) = mant.split_once('.').unwrap_or((mant, ""));
    let digits = format!("{int}{frac}");
    let n: BigInt = if digits.is_empty() {
        BigInt::zero()
    } else {
        digits.parse().ok()?
    };
    let e10 = exp.checked_sub(i64::try_from(frac.len()).ok()?)?;
    if e10.unsigned_abs() > 400 {
        return None; // beyond f64 like sympy's Float; treat as unparsable
    }
    let p = num_traits::pow::Pow::pow(BigInt::from(10), u32::try_from(e10.unsigned_abs()).ok()?);
    let r = if e10 >= 0 {
        Rational::new(n * p, BigInt::one())
    } else {
        Rational::new(n, p)
    };
    r.map(Expr::Num)
}

fn tokenize(s: &str) -> Result<Vec<Tok>, ParseError> {
    let c: Vec<char> = s.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    'outer: while i < c.len() {
        let ch = c[i];
        if ch.is_whitespace() {
            i += 1;
            continue;
        }
        if ch.is_ascii_digit() || ch == '.' {
            match number_at(&c, i) {
                Some((end, v)) => {
                    out.push(Tok::Num(v));
                    i = end;
                    continue;
                }
                None => {
                    return Err(ParseError::Unexpected {
                        pos: i,
                        found: ch.to_string(),
                    });
                }
            }
        }
        if ch.is_alphabetic() || ch == '_' {
            let st = i;
            while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                i += 1;
            }
            let name: String = c[st..i].iter().collect();
            split_name(&name, &mut out);
            continue;
        }
        if ch == '!' {
            // sympy's factorial_notation: `!` factorial, `!!` double factorial, more: an error.
            let st = i;
            while c.get(i) == Some(&'!') {
                i += 1;
            }
            match i - st {
                1 => out.push(Tok::Op("!")),
                2 => out.push(Tok::Op("!!")),
                _ => {
                    return Err(ParseError::Unexpected {
                        pos: st,
                        found: "!!!".into(),
                    });
                }
            }
            continue;
        }
        for op in OPS {
            if op
                .chars()
                .enumerate()
                .all(|(k, oc)| c.get(i + k) == Some(&oc))
            {
                out.push(Tok::Op(op));
                i += op.len();
                continue 'outer;
            }
        }
        return Err(ParseError::Unexpected {
            pos: i,
            found: ch.to_string(),
        });
    }
    Ok(out)
}

/// Names sympy's namespace resolves to something other than a `Symbol` (within the texts that
/// pass `should_allow_eval`).
enum Known {
    Value(Expr),
    Function(&'static str),
    Unsupported,
}

fn known(name: &str) -> Option<Known> {
    Some(match name {
        "pi" => Known::Value(Expr::Const(Constant::Pi)),
        "oo" => Known::Value(Expr::Const(Constant::Infinity)),
        "sqrt" => Known::Function("sqrt"),
        "ln" => Known::Function("ln"),
        "csc" => Known::Function("csc"),
        "frac" => Known::Function("frac"),
        "re" => Known::Function("re"),
        "im" => Known::Function("im"),
        "nan" | "zoo" | "li" | "ff" | "rf" | "jn" | "yn" | "fu" | "gff" | "fft" | "ntt" | "eye"
        | "hn1" | "hn2" => Known::Unsupported,
        _ => return None,
    })
}

const GREEK: &[&str] = &[
    "alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa",
    "lambda", "mu", "nu", "xi", "omicron", "pi", "rho", "sigma", "tau", "upsilon", "phi", "chi",
    "psi", "omega",
];

struct Parser<'a> {
    toks: Vec<Tok>,
    pos: usize,
    depth: usize,
    budget: &'a Budget,
}

type PResult<T> = Result<T, ParseError>;

impl Parser<'_> {
    fn peek(&self) -> Option<&Tok> {
        self.toks.get(self.pos)
    }
    fn is_op(&self, op: &str) -> bool {
        matches!(self.peek(), Some(Tok::Op(o)) if *o == op)
    }
    fn unexpected(&self) -> ParseError {
        ParseError::Unexpected {
            pos: self.pos,
            found: self
                .peek()
                .map_or_else(|| "end of input".to_string(), |t| format!("{t:?}")),
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

    fn expr(&mut self) -> PResult<Expr> {
        self.enter()?;
        let mut terms = vec![self.term()?];
        loop {
            if self.is_op("+") {
                self.pos += 1;
                terms.push(self.term()?);
            } else if self.is_op("-") {
                self.pos += 1;
                terms.push(Expr::neg(self.term()?));
            } else {
                break;
            }
        }
        self.depth -= 1;
        Ok(Expr::add(terms))
    }

    fn starts_atom(&self) -> bool {
        matches!(
            self.peek(),
            Some(Tok::Num(_)) | Some(Tok::Name(_)) | Some(Tok::Op("("))
        )
    }

    fn term(&mut self) -> PResult<Expr> {
        let mut acc = self.factor()?;
        loop {
            let op = match self.peek() {
                Some(Tok::Op(o @ ("*" | "/" | "//" | "%"))) => *o,
                _ if self.starts_atom() => "",
                _ => break,
            };
            if !op.is_empty() {
                self.pos += 1;
            }
            let rhs = self.factor()?;
            acc = match op {
                "/" => Expr::div(acc, rhs),
                "//" | "%" => {
                    let (Some(a), Some(b)) = (acc.as_rational(), rhs.as_rational()) else {
                        // Symbolic: `a // b` = floor(a/b), `a % b` = a − b·floor(a/b).
                        let fl = Expr::func(Func::Floor, vec![Expr::div(acc.clone(), rhs.clone())]);
                        acc = if op == "//" {
                            fl
                        } else {
                            Expr::sub(acc, Expr::mul(vec![rhs, fl]))
                        };
                        continue;
                    };
                    let q = a
                        .div(b)
                        .ok_or(ParseError::Unsupported("division by zero".into()))?;
                    let fl = Rational::from_int(q.numer().div_floor(q.denom()));
                    if op == "//" {
                        Expr::Num(fl)
                    } else {
                        Expr::Num(a.sub(&b.mul(&fl)))
                    }
                }
                _ => Expr::mul(vec![acc, rhs]),
            };
        }
        Ok(acc)
    }

    fn factor(&mut self) -> PResult<Expr> {
        self.enter()?;
        let r = if self.is_op("-") {
            self.pos += 1;
            Expr::neg(self.factor()?)
        } else if self.is_op("+") {
            self.pos += 1;
            self.factor()?
        } else {
            self.power()?
        };
        self.depth -= 1;
        Ok(r)
    }

    fn power(&mut self) -> PResult<Expr> {
        let base = self.postfix()?;
        if self.is_op("**") {
            self.pos += 1;
            let e = self.factor()?;
            return Ok(Expr::pow(base, e));
        }
        Ok(base)
    }

    fn postfix(&mut self) -> PResult<Expr> {
        let mut a = self.atom()?;
        loop {
            if self.is_op("!") {
                self.pos += 1;
                a = Expr::func(Func::Factorial, vec![a]);
            } else if self.is_op("!!") {
                self.pos += 1;
                a = double_factorial(a)?;
            } else {
                return Ok(a);
            }
        }
    }

    fn atom(&mut self) -> PResult<Expr> {
        self.enter()?;
        let r = self.atom_inner();
        self.depth -= 1;
        r
    }

    fn atom_inner(&mut self) -> PResult<Expr> {
        match self.peek().cloned() {
            Some(Tok::Num(v)) => {
                self.pos += 1;
                Ok(v)
            }
            Some(Tok::Op("(")) => {
                self.pos += 1;
                let e = self.expr()?;
                if !self.is_op(")") {
                    return Err(self.unexpected());
                }
                self.pos += 1;
                Ok(e)
            }
            Some(Tok::Name(n)) => {
                self.pos += 1;
                match known(&n) {
                    Some(Known::Value(v)) => Ok(v),
                    Some(Known::Unsupported) => Err(ParseError::Unsupported(n)),
                    Some(Known::Function(f)) => {
                        if !self.is_op("(") {
                            return Err(ParseError::Unsupported(format!("bare function {f}")));
                        }
                        self.pos += 1;
                        let arg = self.expr()?;
                        if !self.is_op(")") {
                            return Err(self.unexpected());
                        }
                        self.pos += 1;
                        apply(f, arg)
                    }
                    None => Ok(Expr::sym(&n)),
                }
            }
            _ => Err(self.unexpected()),
        }
    }
}

fn apply(f: &str, a: Expr) -> PResult<Expr> {
    Ok(match f {
        "sqrt" => Expr::sqrt(a),
        "ln" => Expr::func(Func::Ln, vec![a]),
        "csc" => Expr::func(Func::Csc, vec![a]),
        _ => match (f, a.as_rational()) {
            ("frac", Some(r)) => {
                Expr::Num(r.sub(&Rational::from_int(r.numer().div_floor(r.denom()))))
            }
            ("re", Some(_)) => a,
            ("im", Some(_)) => Expr::int(0),
            _ => return Err(ParseError::Unsupported(f.to_string())),
        },
    })
}

fn double_factorial(a: Expr) -> PResult<Expr> {
    let n = a
        .as_rational()
        .and_then(Rational::to_i64)
        .ok_or(ParseError::Unsupported("n!!".into()))?;
    if !(0..=2000).contains(&n) {
        return Err(ParseError::Unsupported("n!!".into()));
    }
    let mut acc = BigInt::one();
    let mut k = n;
    while k > 1 {
        acc *= k;
        k -= 2;
    }
    Ok(Expr::Num(Rational::from_int(acc)))
}

/// sympy's `split_symbols`: an unknown multi-letter name becomes its letters and digit runs
/// (juxtaposed, so multiplied, the last one binding to a following `**`), unless it is a known
/// name, contains `_` or is a Greek letter name.
fn split_name(n: &str, out: &mut Vec<Tok>) {
    if known(n).is_some() || n.chars().count() == 1 || n.contains('_') || GREEK.contains(&n) {
        out.push(Tok::Name(n.to_string()));
        return;
    }
    let chars: Vec<char> = n.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        if chars[i].is_ascii_digit() {
            let st = i;
            while i < chars.len() && chars[i].is_ascii_digit() {
                i += 1;
            }
            let s: String = chars[st..i].iter().collect();
            let v = s
                .parse::<BigInt>()
                .map(|b| Expr::Num(Rational::from_int(b)))
                .unwrap_or_else(|_| Expr::int(0));
            out.push(Tok::Num(v));
        } else {
            out.push(Tok::Name(chars[i].to_string()));
            i += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn same(a: &str, b: &str) {
        assert_eq!(
            parse_python(a).unwrap(),
            parse_python(b).unwrap(),
            "{a} vs {b}"
        );
    }

    #[test]
    fn sympy_parse_quirks() {
        same("05", "0");
        same("2.5.5", "1.25");
        same("x2", "2*x");
        same("pi2", "2*p*i");
        same("2pi", "2*pi");
        same("1/2(3)", "3/2");
        same("6/2(1+2)", "9");
        same("-2**2", "-4");
        same("2**-1", "1/2");
        same("2**3!", "64");
        same("3!!", "3");
        same("(2)3", "6");
        same("2e3", "2000");
        same("2e", "2*e");
        same("2j", "2*x/x*sqrt(-1)");
        same("sqrt2", "2*s*q*r*t");
        same("ab**2", "a*b**2");
        same("ee", "e**2");
        same("1_000", "1000");
        assert!(parse_python("(1,2)").is_err());
        assert!(parse_python("x=2").is_err());
    }

    #[test]
    fn equal() {
        assert!(sympy_equal("x^2+2x+1", "(x+1)^2"));
        assert!(!sympy_equal("sqrt(x^2)", "x"));
        assert!(sympy_equal("sqrt(x)sqrt(x)", "x"));
        assert!(!sympy_equal("oo", "oo"));
        assert!(!sympy_equal("1/0", "1/0"));
        assert!(sympy_equal("3/2", "1.5"));
    }
}

#[cfg(test)]
mod doc_examples {
    #[test]
    fn example_1() {
        use crate::reward::math::sympy::should_allow_eval;
        assert!(should_allow_eval("(sqrt(2)x)-(y)"));
        assert!(!should_allow_eval("(abc)-(1)"));
        assert!(!should_allow_eval("(2^{3})-(8)"));
        assert!(!should_allow_eval("(2^10)-(1024)"));
    }
    #[test]
    fn example_2() {
        use crate::reward::math::pytext::parse_python;
        assert_eq!(
            parse_python("1/2(3)").unwrap(),
            parse_python("3/2").unwrap()
        );
        assert_eq!(
            parse_python("sqrt(8)").unwrap(),
            parse_python("2sqrt(2)").unwrap()
        );
    }
    #[test]
    fn example_3() {
        use crate::reward::math::pytext::sympy_equal;
        assert!(sympy_equal("1/2", "0.5"));
        assert!(sympy_equal("2sqrt(2)", "sqrt(8)"));
        assert!(!sympy_equal("pi", "3.14"));
        assert!(!sympy_equal("(1,2)", "(1,2)")); // tuples cannot be subtracted
    }
}
