//! Value types of the grader and the bounded expression engine.
//!
//! [`Expr`] is a scalar expression kept in a canonical, sympy-like form by its constructors
//! ([`Expr::add`], [`Expr::mul`], [`Expr::pow`], …): rational arithmetic is exact, like terms
//! and powers are collected, commutative operands are sorted, and radicals of rationals are
//! reduced and rationalised (`\sqrt8 = 2\sqrt2`, `1/\sqrt2 = \sqrt2/2`). [`Value`] is a whole
//! answer (tuple, interval, set, equation, matrix, text, …).
//!
//! Equality of scalars ([`scalar_equal`]) is exact where both sides reduce to exact numbers or
//! to provably distinct closed forms, and otherwise numeric: the difference is evaluated in
//! complex `f64` at several fixed pseudo-random points. Every operation is bounded by a
//! [`Budget`]; running out gives "undecided" (`None`), never a hang or a panic.

use std::cmp::Ordering;
use std::collections::BTreeSet;
use std::fmt;
use std::time::Instant;

use num_bigint::BigInt;
use num_complex::Complex64;
use num_integer::Integer;
use num_traits::{One, Signed, ToPrimitive, Zero};

/// Error of the LaTeX and Python-text parsers. Parsing never panics; every failure is one of
/// these.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ParseError {
    /// The input was empty (after removing decoration).
    #[error("empty input")]
    Empty,
    /// The input is longer than [`Budget::max_input_len`].
    #[error("input too long ({0} bytes)")]
    TooLong(usize),
    /// Nesting deeper than [`Budget::max_depth`].
    #[error("nesting too deep")]
    TooDeep,
    /// A token that cannot start or continue an expression at this byte offset.
    #[error("unexpected {found:?} at byte {pos}")]
    Unexpected {
        /// Byte offset in the input.
        pos: usize,
        /// What was found (a short excerpt, or "end of input").
        found: String,
    },
    /// A construct the parser recognises but does not support.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// The deadline of the [`Budget`] passed.
    #[error("time budget exhausted")]
    Timeout,
}

/// Limits on every operation of the engine. Exceeding one makes the operation "undecided".
#[derive(Debug, Clone)]
pub struct Budget {
    /// Maximum nesting depth for parsing and evaluation.
    pub max_depth: usize,
    /// Maximum input length in bytes accepted by the parsers.
    pub max_input_len: usize,
    /// Maximum number of numeric evaluation points.
    pub eval_points: usize,
    /// Optional wall-clock deadline.
    pub deadline: Option<Instant>,
}

impl Default for Budget {
    fn default() -> Self {
        Budget {
            max_depth: 40,
            max_input_len: 4 * 1024,
            eval_points: 5,
            deadline: None,
        }
    }
}

impl Budget {
    /// Whether the deadline (if any) has passed.
    pub fn expired(&self) -> bool {
        self.deadline.is_some_and(|d| Instant::now() >= d)
    }
}

/// Largest bit length of an exact integer the engine computes; larger results stay
/// unevaluated (e.g. `10^{10^{10}}` is kept as a power).
pub const MAX_BITS: u64 = 1 << 14;
/// Largest argument of `n!` computed exactly.
pub const MAX_FACTORIAL: u64 = 1000;

/// An exact rational number, always in lowest terms with a positive denominator.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Rational {
    num: BigInt,
    den: BigInt,
}

/// A mathematical constant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum Constant {
    /// π.
    Pi,
    /// Euler's number e.
    E,
    /// The imaginary unit i.
    I,
    /// Positive infinity ∞ (`-∞` is `-1·∞`).
    Infinity,
    /// An undefined value (`1/0`, `∞ − ∞`, `0·∞`, `ln 0`): absorbs every operation, never equal
    /// to anything.
    Undefined,
}

/// A function symbol. Logarithms to a base are stored as `ln(x)/ln(b)`, roots as powers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum Func {
    /// Natural logarithm.
    Ln,
    /// `exp` (only produced when the base is not written as `e^x`; `e^x` is `Pow(E, x)`).
    Exp,
    /// Sine.
    Sin,
    /// Cosine.
    Cos,
    /// Tangent.
    Tan,
    /// Cotangent.
    Cot,
    /// Secant.
    Sec,
    /// Cosecant.
    Csc,
    /// Arcsine.
    Asin,
    /// Arccosine.
    Acos,
    /// Arctangent.
    Atan,
    /// Arccotangent.
    Acot,
    /// Arcsecant.
    Asec,
    /// Arccosecant.
    Acsc,
    /// Hyperbolic sine.
    Sinh,
    /// Hyperbolic cosine.
    Cosh,
    /// Hyperbolic tangent.
    Tanh,
    /// Absolute value.
    Abs,
    /// Factorial `n!` (exact up to [`MAX_FACTORIAL`], Γ(n+1) numerically).
    Factorial,
    /// Floor.
    Floor,
    /// Ceiling.
    Ceil,
    /// Binomial coefficient (two arguments).
    Binomial,
    /// Greatest common divisor (two or more arguments).
    Gcd,
    /// Least common multiple (two or more arguments).
    Lcm,
    /// Minimum (one or more arguments, real).
    Min,
    /// Maximum (one or more arguments, real).
    Max,
}

/// A scalar expression in canonical form (build it with the constructors, not the variants,
/// to keep it canonical).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum Expr {
    /// An exact rational number.
    Num(Rational),
    /// A constant.
    Const(Constant),
    /// A free variable.
    Sym(String),
    /// A sum of two or more terms.
    Add(Vec<Expr>),
    /// A product of two or more factors (a rational coefficient first if ≠ 1).
    Mul(Vec<Expr>),
    /// A power `base ^ exponent`.
    Pow(Box<Expr>, Box<Expr>),
    /// A function application.
    Func(Func, Vec<Expr>),
}

/// A relation operator.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum RelOp {
    /// `=`
    Eq,
    /// `\ne`
    Ne,
    /// `<`
    Lt,
    /// `\le`
    Le,
    /// `>`
    Gt,
    /// `\ge`
    Ge,
    /// `\in`
    In,
    /// `\approx`
    Approx,
}

/// An interval with its ends (`\infty` ends are `Expr::Const(Constant::Infinity)` or its
/// negation).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Interval {
    /// Lower end.
    pub lo: Expr,
    /// Upper end.
    pub hi: Expr,
    /// Whether the lower end is included (`[`).
    pub lo_closed: bool,
    /// Whether the upper end is included (`]`).
    pub hi_closed: bool,
}

/// A (possibly chained) relation `terms[0] ops[0] terms[1] ops[1] terms[2] …`; invariant:
/// `ops.len() + 1 == terms.len()`, at least one op.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Relation {
    /// The operands.
    pub terms: Vec<Value>,
    /// The operators between consecutive operands.
    pub ops: Vec<RelOp>,
}

/// A whole answer.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Value {
    /// A scalar expression.
    Scalar(Expr),
    /// A parenthesised tuple `(a, b, …)` (ordered).
    Tuple(Vec<Value>),
    /// An interval.
    Interval(Interval),
    /// A union of intervals / sets (`\cup`), in written order.
    Union(Vec<Value>),
    /// A set `\{a, b, …\}` in written order (duplicates kept as written).
    Set(Vec<Value>),
    /// An equation or inequality.
    Relation(Relation),
    /// A matrix as rows (a `pmatrix` column vector is `n × 1`).
    Matrix(Vec<Vec<Expr>>),
    /// Text (from `\text{…}` or words), normalised: lower case, single spaces, trimmed.
    Text(String),
    /// The empty set (`\emptyset`, `\varnothing`, `\{\}`).
    EmptySet,
    /// `a ± b` expanded: the value with `+` and the value with `−`.
    PlusMinus(Box<Value>, Box<Value>),
    /// A bare list `1, 2` or `1 \text{ and } 2` (no enclosing brackets), in written order.
    List(Vec<Value>),
}

// ---------------------------------------------------------------------------------------
// Rational
// ---------------------------------------------------------------------------------------

impl Rational {
    /// `num / den`, or `None` if `den == 0`.
    pub fn new(num: BigInt, den: BigInt) -> Option<Rational> {
        if den.is_zero() {
            return None;
        }
        let g = num.gcd(&den);
        let (mut num, mut den) = if g.is_one() || g.is_zero() {
            (num, den)
        } else {
            (num / &g, den / &g)
        };
        if den.is_negative() {
            num = -num;
            den = -den;
        }
        Some(Rational { num, den })
    }
    /// An integer.
    pub fn from_int(n: impl Into<BigInt>) -> Rational {
        Rational {
            num: n.into(),
            den: BigInt::one(),
        }
    }
    /// Zero.
    pub fn zero() -> Rational {
        Rational::from_int(0)
    }
    /// One.
    pub fn one() -> Rational {
        Rational::from_int(1)
    }
    /// The numerator.
    pub fn numer(&self) -> &BigInt {
        &self.num
    }
    /// The (positive) denominator.
    pub fn denom(&self) -> &BigInt {
        &self.den
    }
    /// Whether the denominator is 1.
    pub fn is_integer(&self) -> bool {
        self.den.is_one()
    }
    /// Whether it is 0.
    pub fn is_zero(&self) -> bool {
        self.num.is_zero()
    }
    /// Whether it is 1.
    pub fn is_one(&self) -> bool {
        self.num.is_one() && self.den.is_one()
    }
    /// Whether it is < 0.
    pub fn is_negative(&self) -> bool {
        self.num.is_negative()
    }
    /// Bit length of numerator plus denominator.
    pub fn bits(&self) -> u64 {
        self.num.bits() + self.den.bits()
    }
    /// The integer value as `i64` if it is one and fits.
    pub fn to_i64(&self) -> Option<i64> {
        if self.is_integer() {
            self.num.to_i64()
        } else {
            None
        }
    }
    /// Nearest `f64` (±inf when out of range).
    pub fn to_f64(&self) -> f64 {
        big_ratio_f64(&self.num, &self.den)
    }
    /// `-self`.
    pub fn neg(&self) -> Rational {
        Rational {
            num: -&self.num,
            den: self.den.clone(),
        }
    }
    /// `self + o`.
    pub fn add(&self, o: &Rational) -> Rational {
        if self.den.is_one() && o.den.is_one() {
            return Rational {
                num: &self.num + &o.num,
                den: BigInt::one(),
            };
        }
        if self.den == o.den {
            return Rational::new(&self.num + &o.num, self.den.clone())
                .unwrap_or_else(Rational::zero);
        }
        Rational::new(&self.num * &o.den + &o.num * &self.den, &self.den * &o.den)
            .unwrap_or_else(Rational::zero)
    }
    /// `self - o`.
    pub fn sub(&self, o: &Rational) -> Rational {
        self.add(&o.neg())
    }
    /// `self * o`.
    pub fn mul(&self, o: &Rational) -> Rational {
        if self.den.is_one() && o.den.is_one() {
            return Rational {
                num: &self.num * &o.num,
                den: BigInt::one(),
            };
        }
        Rational::new(&self.num * &o.num, &self.den * &o.den).unwrap_or_else(Rational::zero)
    }
    /// `self / o`, `None` when `o == 0`.
    pub fn div(&self, o: &Rational) -> Option<Rational> {
        Rational::new(&self.num * &o.den, &self.den * &o.num)
    }
    /// `self ^ e` for an integer exponent, `None` when `0^-k` or the result would exceed
    /// [`MAX_BITS`].
    pub fn pow_int(&self, e: i64) -> Option<Rational> {
        if e == 0 {
            return Some(Rational::one());
        }
        if self.num.is_zero() {
            return if e > 0 { Some(Rational::zero()) } else { None };
        }
        let mag = self.num.magnitude().clone();
        let is_unit = mag.is_one() && self.den.is_one();
        let ue = e.unsigned_abs();
        if !is_unit && self.bits().saturating_mul(ue) > MAX_BITS + 64 {
            return None;
        }
        let ue32 = u32::try_from(ue).ok()?;
        let n = num_traits::pow::Pow::pow(&self.num, ue32);
        let d = num_traits::pow::Pow::pow(&self.den, ue32);
        if e > 0 {
            Rational::new(n, d)
        } else {
            Rational::new(d, n)
        }
    }
}

impl Ord for Rational {
    fn cmp(&self, o: &Self) -> Ordering {
        if self.den == o.den {
            return self.num.cmp(&o.num);
        }
        (&self.num * &o.den).cmp(&(&o.num * &self.den))
    }
}
impl PartialOrd for Rational {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}

impl fmt::Display for Rational {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.den.is_one() {
            write!(f, "{}", self.num)
        } else {
            write!(f, "{}/{}", self.num, self.den)
        }
    }
}

/// `n / d` as `f64` even when both are huge.
fn big_ratio_f64(n: &BigInt, d: &BigInt) -> f64 {
    let (nb, db) = (n.bits(), d.bits());
    if nb < 1000 && db < 1000 {
        let (a, b) = (
            n.to_f64().unwrap_or(f64::NAN),
            d.to_f64().unwrap_or(f64::NAN),
        );
        return a / b;
    }
    // Keep the top ~64 bits of each and scale by the power of two.
    let ns = nb.saturating_sub(64);
    let ds = db.saturating_sub(64);
    let a = (n >> ns).to_f64().unwrap_or(f64::NAN);
    let b = (d >> ds).to_f64().unwrap_or(f64::NAN);
    let shift = ns as f64 - ds as f64;
    if shift > 2000.0 {
        return if a.is_sign_negative() {
            f64::NEG_INFINITY
        } else {
            f64::INFINITY
        };
    }
    if shift < -2000.0 {
        return 0.0;
    }
    (a / b) * 2f64.powf(shift)
}

// ---------------------------------------------------------------------------------------
// Expr constructors (canonicalising)
// ---------------------------------------------------------------------------------------

// `neg`, `sub`, `div` are associated constructors like `add`/`mul`; the operator traits are
// implemented below as well.
#[allow(clippy::should_implement_trait)]
impl Expr {
    /// An integer.
    pub fn int(n: i64) -> Expr {
        Expr::Num(Rational::from_int(n))
    }
    /// A free variable.
    pub fn sym(name: &str) -> Expr {
        Expr::Sym(name.to_string())
    }
    /// Canonical sum.
    pub fn add(terms: Vec<Expr>) -> Expr {
        canon::add(terms)
    }
    /// Canonical product.
    pub fn mul(factors: Vec<Expr>) -> Expr {
        canon::mul(factors)
    }
    /// Canonical power.
    pub fn pow(base: Expr, exp: Expr) -> Expr {
        canon::pow(base, exp)
    }
    /// `-x`.
    pub fn neg(x: Expr) -> Expr {
        Expr::mul(vec![Expr::int(-1), x])
    }
    /// `a - b`.
    pub fn sub(a: Expr, b: Expr) -> Expr {
        Expr::add(vec![a, Expr::neg(b)])
    }
    /// `a / b`.
    pub fn div(a: Expr, b: Expr) -> Expr {
        Expr::mul(vec![a, Expr::pow(b, Expr::int(-1))])
    }
    /// `sqrt(x)` = `x^(1/2)`.
    pub fn sqrt(x: Expr) -> Expr {
        Expr::root(x, 2)
    }
    /// `x^(1/n)` (principal root; `n == 0` gives `x^0`… avoid it).
    pub fn root(x: Expr, n: i64) -> Expr {
        match Rational::new(BigInt::one(), BigInt::from(n)) {
            Some(r) => Expr::pow(x, Expr::Num(r)),
            None => Expr::Func(Func::Ln, vec![]), // never produced by the parsers
        }
    }
    /// `log_base(x)` = `ln(x) / ln(base)`.
    pub fn log(x: Expr, base: Expr) -> Expr {
        Expr::div(
            Expr::func(Func::Ln, vec![x]),
            Expr::func(Func::Ln, vec![base]),
        )
    }
    /// Canonical function application (exact values where cheap: `ln 1 = 0`, `|−3| = 3`,
    /// `5! = 120`, …).
    pub fn func(f: Func, args: Vec<Expr>) -> Expr {
        canon::func(f, args)
    }

    /// The rational value if this is an exact number.
    pub fn as_rational(&self) -> Option<&Rational> {
        match self {
            Expr::Num(r) => Some(r),
            _ => None,
        }
    }

    /// The free variables.
    pub fn symbols(&self) -> BTreeSet<String> {
        let mut out = BTreeSet::new();
        let mut stack = vec![self];
        while let Some(e) = stack.pop() {
            match e {
                Expr::Sym(s) => {
                    out.insert(s.clone());
                }
                Expr::Add(v) | Expr::Mul(v) | Expr::Func(_, v) => stack.extend(v.iter()),
                Expr::Pow(b, x) => {
                    stack.push(b);
                    stack.push(x);
                }
                Expr::Num(_) | Expr::Const(_) => {}
            }
        }
        out
    }

    /// Whether ∞ occurs.
    pub fn has_infinity(&self) -> bool {
        let mut stack = vec![self];
        while let Some(e) = stack.pop() {
            match e {
                Expr::Const(Constant::Infinity) => return true,
                Expr::Add(v) | Expr::Mul(v) | Expr::Func(_, v) => stack.extend(v.iter()),
                Expr::Pow(b, x) => {
                    stack.push(b);
                    stack.push(x);
                }
                _ => {}
            }
        }
        false
    }

    /// Distributes products and small integer powers over sums (at most `max_terms` terms;
    /// `None` when that is exceeded).
    pub fn expand(&self, max_terms: usize) -> Option<Expr> {
        canon::expand(self, max_terms, 0)
    }

    /// Numeric value in complex `f64` with each variable given by `var`; `None` when
    /// undefined, infinite, too deep or out of time.
    pub fn eval(&self, var: &dyn Fn(&str) -> Complex64, budget: &Budget) -> Option<Complex64> {
        numeric::eval(self, var, budget, 0)
    }
}

/// Decides `a == b` for scalars.
///
/// `Some(true)`/`Some(false)` when decided: exactly when both sides are exact numbers (or
/// their difference expands to a provably non-zero closed form of radicals, π and e), else
/// numerically at several fixed points (relative + absolute tolerance). `None` when
/// undecided (overflow, NaN, poles at every point, budget exhausted); callers treat it as
/// "not equal".
pub fn scalar_equal(a: &Expr, b: &Expr) -> Option<bool> {
    scalar_equal_with(a, b, &Budget::default())
}

/// [`scalar_equal`] with an explicit budget.
pub fn scalar_equal_with(a: &Expr, b: &Expr, budget: &Budget) -> Option<bool> {
    numeric::equal(a, b, budget)
}

mod canon {
    use super::*;
    use std::collections::BTreeMap;

    fn one() -> Expr {
        Expr::int(1)
    }

    fn undefined() -> Expr {
        Expr::Const(Constant::Undefined)
    }

    fn is_undefined(e: &Expr) -> bool {
        matches!(e, Expr::Const(Constant::Undefined))
    }

    /// Splits a term into (rational coefficient, rest); rest `None` for a pure number.
    fn split_coeff(t: Expr) -> (Rational, Option<Expr>) {
        match t {
            Expr::Num(r) => (r, None),
            Expr::Mul(mut v) if matches!(v.first(), Some(Expr::Num(_))) => {
                let c = match v.remove(0) {
                    Expr::Num(r) => r,
                    _ => Rational::one(),
                };
                let rest = if v.len() == 1 {
                    v.pop().unwrap_or_else(one)
                } else {
                    Expr::Mul(v)
                };
                (c, Some(rest))
            }
            other => (Rational::one(), Some(other)),
        }
    }

    /// `c * rest` without re-canonicalising `rest`.
    fn with_coeff(c: Rational, rest: Expr) -> Expr {
        if c.is_one() {
            return rest;
        }
        if c.is_zero() {
            return Expr::int(0);
        }
        match rest {
            Expr::Mul(v) => {
                let mut out = Vec::with_capacity(v.len() + 1);
                out.push(Expr::Num(c));
                out.extend(v);
                Expr::Mul(out)
            }
            other => Expr::Mul(vec![Expr::Num(c), other]),
        }
    }

    pub(super) fn add(terms: Vec<Expr>) -> Expr {
        if terms.iter().any(is_undefined) {
            return undefined();
        }
        let mut flat = Vec::with_capacity(terms.len());
        for t in terms {
            match t {
                Expr::Add(v) => flat.extend(v),
                other => flat.push(other),
            }
        }
        let mut constant = Rational::zero();
        let mut map: BTreeMap<Expr, Rational> = BTreeMap::new();
        for t in flat {
            let (c, rest) = split_coeff(t);
            match rest {
                None => constant = constant.add(&c),
                Some(r) => {
                    let e = map.entry(r).or_insert_with(Rational::zero);
                    *e = e.add(&c);
                }
            }
        }
        if let Some(c) = map.get(&Expr::Const(Constant::Infinity)) {
            let inf = Expr::Const(Constant::Infinity);
            if c.is_zero() {
                return undefined();
            }
            return with_coeff(
                Rational::from_int(if c.is_negative() { -1 } else { 1 }),
                inf,
            );
        }
        let mut out = Vec::new();
        if !constant.is_zero() {
            out.push(Expr::Num(constant));
        }
        for (rest, c) in map {
            if !c.is_zero() {
                out.push(with_coeff(c, rest));
            } else if rest.has_infinity() {
                // f(∞) − f(∞) is undefined, like ∞ − ∞.
                return undefined();
            }
        }
        match out.len() {
            0 => Expr::int(0),
            1 => out.pop().unwrap_or_else(|| Expr::int(0)),
            _ => Expr::Add(out),
        }
    }

    pub(super) fn mul(factors: Vec<Expr>) -> Expr {
        if factors.iter().any(is_undefined) {
            return undefined();
        }
        let mut flat = Vec::with_capacity(factors.len());
        for f in factors {
            match f {
                Expr::Mul(v) => flat.extend(v),
                other => flat.push(other),
            }
        }
        if flat
            .iter()
            .any(|f| matches!(f, Expr::Num(r) if r.is_zero()))
        {
            return if flat.iter().any(Expr::has_infinity) {
                undefined()
            } else {
                Expr::int(0)
            };
        }
        let mut coeff = Rational::one();
        let mut big_nums: Vec<Expr> = Vec::new();
        let mut groups: BTreeMap<Expr, Vec<Expr>> = BTreeMap::new();
        for f in flat {
            match f {
                Expr::Num(r) => {
                    if r.is_zero() {
                        return Expr::int(0);
                    }
                    if coeff.bits() + r.bits() > MAX_BITS {
                        big_nums.push(Expr::Num(r));
                    } else {
                        coeff = coeff.mul(&r);
                    }
                }
                Expr::Pow(b, e) => groups.entry(*b).or_default().push(*e),
                other => groups.entry(other).or_default().push(one()),
            }
        }
        let mut out: Vec<Expr> = Vec::new();
        for (base, exps) in groups {
            let p = if exps.len() == 1 {
                match exps.into_iter().next() {
                    Some(e) if e == one() => base,
                    Some(e) => pow(base, e),
                    None => continue,
                }
            } else {
                pow(base, add(exps))
            };
            let (c, rest) = split_coeff(p);
            if coeff.bits() + c.bits() > MAX_BITS {
                big_nums.push(Expr::Num(c));
            } else {
                coeff = coeff.mul(&c);
            }
            match rest {
                None => {}
                Some(Expr::Mul(v)) => out.extend(v),
                Some(r) => out.push(r),
            }
        }
        if coeff.is_zero() {
            return Expr::int(0);
        }
        out.sort();
        // ∞ absorbs a coefficient's magnitude and positive constant factors.
        if out.contains(&Expr::Const(Constant::Infinity)) && !coeff.is_zero() {
            coeff = Rational::from_int(if coeff.is_negative() { -1 } else { 1 });
            out.retain(|f| !is_positive_number(f));
        }
        // A rational coefficient times a single sum is distributed (like sympy).
        if big_nums.is_empty()
            && out.len() == 1
            && !coeff.is_one()
            && let Some(Expr::Add(_)) = out.first()
            && let Some(Expr::Add(terms)) = out.pop()
        {
            let c = Expr::Num(coeff);
            return add(terms.into_iter().map(|t| mul(vec![c.clone(), t])).collect());
        }
        let mut res = Vec::with_capacity(out.len() + 1 + big_nums.len());
        if !coeff.is_one() {
            res.push(Expr::Num(coeff));
        }
        res.extend(big_nums);
        res.extend(out);
        match res.len() {
            0 => one(),
            1 => res.pop().unwrap_or_else(one),
            _ => Expr::Mul(res),
        }
    }

    fn raw_pow(b: Expr, e: Expr) -> Expr {
        Expr::Pow(Box::new(b), Box::new(e))
    }

    fn is_positive_number(e: &Expr) -> bool {
        match e {
            Expr::Num(r) => !r.is_negative() && !r.is_zero(),
            Expr::Const(Constant::Pi) | Expr::Const(Constant::E) => true,
            Expr::Pow(b, x) => is_positive_number(b) && matches!(**x, Expr::Num(_)),
            Expr::Mul(v) => v.iter().all(is_positive_number),
            _ => false,
        }
    }

    pub(super) fn pow(base: Expr, exp: Expr) -> Expr {
        if is_undefined(&base) || is_undefined(&exp) {
            return undefined();
        }
        if let Expr::Num(r) = &exp {
            if r.is_zero() {
                return one();
            }
            if r.is_one() {
                return base;
            }
        }
        match (&base, &exp) {
            (Expr::Num(b), _) if b.is_one() => return one(),
            (Expr::Num(b), Expr::Num(e)) if b.is_zero() => {
                return if e.is_negative() {
                    undefined()
                } else {
                    Expr::int(0)
                };
            }
            (Expr::Num(b), Expr::Num(e)) if e.is_integer() => {
                return match e.to_i64().and_then(|k| b.pow_int(k)) {
                    Some(v) => Expr::Num(v),
                    None => raw_pow(base, exp),
                };
            }
            (Expr::Num(b), Expr::Num(e)) => {
                return rational_power(b, e).unwrap_or_else(|| raw_pow(base.clone(), exp.clone()));
            }
            (Expr::Const(Constant::I), Expr::Num(e)) if e.is_integer() => {
                let k = e.numer().mod_floor(&BigInt::from(4)).to_i64().unwrap_or(0);
                return match k {
                    0 => one(),
                    1 => base,
                    2 => Expr::int(-1),
                    _ => mul(vec![Expr::int(-1), base]),
                };
            }
            (Expr::Const(Constant::Infinity), Expr::Num(e)) => {
                return if e.is_negative() { Expr::int(0) } else { base };
            }
            (Expr::Const(Constant::E), Expr::Func(Func::Ln, a)) if a.len() == 1 => {
                return a[0].clone();
            }
            (Expr::Pow(b, e1), _) => {
                // (b^e1)^e = b^(e1·e) for an integer e, or for b > 0 and a real e1 (rational
                // here): for a complex e1 it fails (√((12^(−1−i))²) ≠ 12^(−1−i)).
                let int_exp = matches!(&exp, Expr::Num(r) if r.is_integer());
                if int_exp || (is_positive_number(b) && matches!(**e1, Expr::Num(_))) {
                    return pow((**b).clone(), mul(vec![(**e1).clone(), exp]));
                }
            }
            (Expr::Mul(fs), _) => {
                let int_exp = matches!(&exp, Expr::Num(r) if r.is_integer());
                if int_exp {
                    return mul(fs.iter().map(|f| pow(f.clone(), exp.clone())).collect());
                }
                let (pos, rest): (Vec<Expr>, Vec<Expr>) =
                    fs.iter().cloned().partition(is_positive_number);
                if !pos.is_empty() {
                    let mut out: Vec<Expr> = pos.into_iter().map(|f| pow(f, exp.clone())).collect();
                    if !rest.is_empty() {
                        out.push(raw_pow(mul(rest), exp));
                    }
                    return mul(out);
                }
            }
            _ => {}
        }
        raw_pow(base, exp)
    }

    /// Trial-division factorisation of a small positive integer: (prime, multiplicity) pairs
    /// plus an unfactored cofactor (1 when complete).
    fn factor(n: &BigInt) -> Option<(Vec<(u64, u32)>, BigInt)> {
        let mut m = n.to_u128()?;
        let mut out = Vec::new();
        let mut p: u128 = 2;
        while p <= 10_000 && p * p <= m {
            if m % p == 0 {
                let mut k = 0;
                while m % p == 0 {
                    m /= p;
                    k += 1;
                }
                out.push((p as u64, k));
            }
            p += if p == 2 { 1 } else { 2 };
        }
        if m > 1 && m < 100_000_000 {
            out.push((m as u64, 1));
            m = 1;
        }
        Some((out, BigInt::from(m)))
    }

    /// Exact `b^e` for a rational `b` and a non-integer rational `e`, as
    /// coefficient × prime radicals with exponents in (0, 1).
    fn rational_power(b: &Rational, e: &Rational) -> Option<Expr> {
        if b.is_negative() {
            let minus_one = if e.denom() == &BigInt::from(2) {
                pow(
                    Expr::Const(Constant::I),
                    Expr::Num(Rational::from_int(e.numer().clone())),
                )
            } else {
                raw_pow(Expr::int(-1), Expr::Num(e.clone()))
            };
            let rest = rational_power(&b.neg(), e)?;
            return Some(mul(vec![minus_one, rest]));
        }
        if e.bits() > 64 {
            return None;
        }
        let mut coeff = Rational::one();
        let mut factors = Vec::new();
        for (n, sign) in [(b.numer(), 1i64), (b.denom(), -1i64)] {
            if n.is_one() {
                continue;
            }
            let (primes, cof) = factor(n)?;
            let mut parts: Vec<(BigInt, Rational)> = primes
                .into_iter()
                .map(|(p, k)| (BigInt::from(p), e.mul(&Rational::from_int(k as i64 * sign))))
                .collect();
            if !cof.is_one() {
                parts.push((cof, e.mul(&Rational::from_int(sign))));
            }
            for (p, x) in parts {
                let fl = x.numer().div_floor(x.denom());
                let frac = x.sub(&Rational::from_int(fl.clone()));
                let k = fl.to_i64()?;
                let pr = Rational::from_int(p.clone());
                let c = pr.pow_int(k)?;
                coeff = coeff.mul(&c);
                if coeff.bits() > MAX_BITS {
                    return None;
                }
                if !frac.is_zero() {
                    factors.push(raw_pow(Expr::Num(pr), Expr::Num(frac)));
                }
            }
        }
        factors.sort();
        let mut out = Vec::new();
        if !coeff.is_one() {
            out.push(Expr::Num(coeff));
        }
        out.extend(factors);
        Some(match out.len() {
            0 => one(),
            1 => out.pop().unwrap_or_else(one),
            _ => Expr::Mul(out),
        })
    }

    fn ln_of_rational(r: &Rational) -> Option<Expr> {
        if r.is_negative() || r.is_zero() {
            return None;
        }
        let mut terms = Vec::new();
        for (n, sign) in [(r.numer(), 1i64), (r.denom(), -1i64)] {
            if n.is_one() {
                continue;
            }
            let (primes, cof) = factor(n)?;
            if !cof.is_one() {
                return None;
            }
            for (p, k) in primes {
                terms.push(mul(vec![
                    Expr::int(k as i64 * sign),
                    Expr::Func(Func::Ln, vec![Expr::Num(Rational::from_int(p))]),
                ]));
            }
        }
        if terms.len() == 1
            && let Some(Expr::Func(..)) = terms.first()
        {
            return None; // already ln(prime)
        }
        Some(add(terms))
    }

    /// `sin(kπ/d)` for small `d`, exactly.
    fn sin_pi_multiple(q: &Rational) -> Option<Expr> {
        // Reduce q modulo 2.
        let two = Rational::from_int(2);
        let n = q.div(&two)?;
        let fl = n.numer().div_floor(n.denom());
        let q = q.sub(&Rational::from_int(fl * 2));
        let d = q.denom().to_i64()?;
        if ![1, 2, 3, 4, 6].contains(&d) {
            return None;
        }
        let k = q.numer().to_i64()?; // 0 <= q < 2 so k in 0..2d
        let (sign, k) = if k >= d { (-1, k - d) } else { (1, k) }; // sin(x+π) = -sin x
        // Now angle kπ/d in [0, π).
        let half = || {
            Expr::Num(Rational::new(BigInt::from(1), BigInt::from(2)).unwrap_or_else(Rational::one))
        };
        let v = match (k, d) {
            (0, _) => Expr::int(0),
            (1, 2) => one(),
            (1, 6) | (5, 6) => half(),
            (1, 4) | (3, 4) => mul(vec![half(), pow(Expr::int(2), half())]),
            (1, 3) | (2, 3) => mul(vec![half(), pow(Expr::int(3), half())]),
            _ => return None,
        };
        Some(mul(vec![Expr::int(sign), v]))
    }

    /// `arg / π` when `arg` is a rational multiple of π.
    fn pi_multiple(arg: &Expr) -> Option<Rational> {
        match arg {
            Expr::Num(r) if r.is_zero() => Some(Rational::zero()),
            Expr::Const(Constant::Pi) => Some(Rational::one()),
            Expr::Mul(v) if v.len() == 2 => match (&v[0], &v[1]) {
                (Expr::Num(r), Expr::Const(Constant::Pi)) => Some(r.clone()),
                _ => None,
            },
            _ => None,
        }
    }

    fn factorial(n: u64) -> BigInt {
        let mut acc = BigInt::one();
        for k in 2..=n {
            acc *= k;
        }
        acc
    }

    pub(super) fn func(f: Func, args: Vec<Expr>) -> Expr {
        if args.iter().any(is_undefined) {
            return undefined();
        }
        let a0 = args.first();
        let num0 = a0.and_then(Expr::as_rational);
        match (f, args.len()) {
            (Func::Exp, 1) => {
                return pow(
                    Expr::Const(Constant::E),
                    args.into_iter().next().unwrap_or_else(one),
                );
            }
            (Func::Ln, 1) => {
                if let Some(r) = num0 {
                    if r.is_one() {
                        return Expr::int(0);
                    }
                    if r.is_zero() {
                        return undefined();
                    }
                    if let Some(e) = ln_of_rational(r) {
                        return e;
                    }
                }
                match a0 {
                    Some(Expr::Const(Constant::E)) => return one(),
                    Some(Expr::Pow(b, x))
                        if is_positive_number(b) && matches!(**x, Expr::Num(_)) =>
                    {
                        return mul(vec![(**x).clone(), func(Func::Ln, vec![(**b).clone()])]);
                    }
                    Some(Expr::Mul(v)) if v.iter().all(is_positive_number) => {
                        return add(v.iter().map(|x| func(Func::Ln, vec![x.clone()])).collect());
                    }
                    _ => {}
                }
            }
            (Func::Sin | Func::Cos | Func::Tan | Func::Cot | Func::Sec | Func::Csc, 1) => {
                if let Some(q) = a0.and_then(pi_multiple) {
                    let half = Rational::new(BigInt::from(1), BigInt::from(2))
                        .unwrap_or_else(Rational::one);
                    let s = sin_pi_multiple(&q);
                    let c = sin_pi_multiple(&q.add(&half));
                    let inv = |x: Expr| match &x {
                        Expr::Num(r) if r.is_zero() => None,
                        _ => Some(pow(x, Expr::int(-1))),
                    };
                    let v = match (f, s, c) {
                        (Func::Sin, Some(s), _) => Some(s),
                        (Func::Cos, _, Some(c)) => Some(c),
                        (Func::Tan, Some(s), Some(c)) => inv(c).map(|ic| mul(vec![s, ic])),
                        (Func::Cot, Some(s), Some(c)) => inv(s).map(|is| mul(vec![c, is])),
                        (Func::Sec, _, Some(c)) => inv(c),
                        (Func::Csc, Some(s), _) => inv(s),
                        _ => None,
                    };
                    if let Some(v) = v {
                        return v;
                    }
                }
            }
            (Func::Abs, 1) => {
                if let Some(r) = num0 {
                    return Expr::Num(if r.is_negative() { r.neg() } else { r.clone() });
                }
                if let Some(a) = a0 {
                    if is_positive_number(a) {
                        return a.clone();
                    }
                    if let Expr::Mul(v) = a
                        && let Some(Expr::Num(c)) = v.first()
                    {
                        let c = if c.is_negative() { c.neg() } else { c.clone() };
                        let rest = mul(v[1..].to_vec());
                        return mul(vec![Expr::Num(c), func(Func::Abs, vec![rest])]);
                    }
                }
            }
            (Func::Factorial | Func::Sinh | Func::Cosh, 1)
                if a0 == Some(&Expr::Const(Constant::Infinity)) =>
            {
                return Expr::Const(Constant::Infinity);
            }
            (Func::Factorial, 1) => {
                if let Some(n) = num0.and_then(Rational::to_i64)
                    && (0..=MAX_FACTORIAL as i64).contains(&n)
                {
                    return Expr::Num(Rational::from_int(factorial(n as u64)));
                }
            }
            (Func::Floor | Func::Ceil, 1) => {
                if let Some(r) = num0 {
                    let v = if f == Func::Floor {
                        r.numer().div_floor(r.denom())
                    } else {
                        -((-r.numer()).div_floor(r.denom()))
                    };
                    return Expr::Num(Rational::from_int(v));
                }
            }
            (Func::Binomial, 2) => {
                if let (Some(n), Some(k)) = (
                    num0.and_then(Rational::to_i64),
                    args[1].as_rational().and_then(Rational::to_i64),
                ) && (0..=100_000).contains(&n)
                    && k >= 0
                    && k.min(n - k) <= 2000
                {
                    if k > n {
                        return Expr::int(0);
                    }
                    let k = k.min(n - k);
                    let mut acc = BigInt::one();
                    for j in 0..k {
                        acc = acc * BigInt::from(n - j) / BigInt::from(j + 1);
                    }
                    return Expr::Num(Rational::from_int(acc));
                }
            }
            (Func::Gcd | Func::Lcm, n) if n >= 1 => {
                let ints: Option<Vec<BigInt>> = args
                    .iter()
                    .map(|a| {
                        a.as_rational()
                            .filter(|r| r.is_integer())
                            .map(|r| r.numer().clone())
                    })
                    .collect();
                if let Some(ints) = ints {
                    let mut acc = ints[0].abs();
                    for x in &ints[1..] {
                        acc = if f == Func::Gcd {
                            acc.gcd(x)
                        } else {
                            acc.lcm(x)
                        };
                    }
                    if acc.bits() <= MAX_BITS {
                        return Expr::Num(Rational::from_int(acc));
                    }
                }
            }
            (Func::Min | Func::Max, n) if n >= 1 => {
                let rs: Option<Vec<&Rational>> = args.iter().map(Expr::as_rational).collect();
                if let Some(rs) = rs {
                    let best = if f == Func::Min {
                        rs.iter().min()
                    } else {
                        rs.iter().max()
                    };
                    if let Some(b) = best {
                        return Expr::Num((*b).clone());
                    }
                }
            }
            _ => {}
        }
        Expr::Func(f, args)
    }

    pub(super) fn expand(e: &Expr, max_terms: usize, depth: usize) -> Option<Expr> {
        if depth > 200 {
            return None;
        }
        let terms_of = |x: Expr| match x {
            Expr::Add(v) => v,
            other => vec![other],
        };
        Some(match e {
            Expr::Add(v) => {
                let parts: Option<Vec<Expr>> =
                    v.iter().map(|t| expand(t, max_terms, depth + 1)).collect();
                let r = add(parts?);
                if matches!(&r, Expr::Add(v) if v.len() > max_terms) {
                    return None;
                }
                r
            }
            Expr::Mul(v) => {
                let mut acc: Vec<Expr> = vec![one()];
                for f in v {
                    let ts = terms_of(expand(f, max_terms, depth + 1)?);
                    if acc.len() * ts.len() > max_terms {
                        return None;
                    }
                    let mut next = Vec::with_capacity(acc.len() * ts.len());
                    for a in &acc {
                        for t in &ts {
                            next.push(mul(vec![a.clone(), t.clone()]));
                        }
                    }
                    acc = next;
                }
                add(acc)
            }
            Expr::Pow(b, x) => {
                let b2 = expand(b, max_terms, depth + 1)?;
                let x2 = expand(x, max_terms, depth + 1)?;
                match (&b2, x2.as_rational().and_then(Rational::to_i64)) {
                    (Expr::Add(ts), Some(k)) if (2..=12).contains(&k) => {
                        let mut acc: Vec<Expr> = vec![one()];
                        for _ in 0..k {
                            if acc.len() * ts.len() > max_terms {
                                return None;
                            }
                            let mut next = Vec::new();
                            for a in &acc {
                                for t in ts {
                                    next.push(mul(vec![a.clone(), t.clone()]));
                                }
                            }
                            acc = terms_of(add(next));
                        }
                        add(acc)
                    }
                    _ => pow(b2, x2),
                }
            }
            Expr::Func(f, args) => {
                let a: Option<Vec<Expr>> = args
                    .iter()
                    .map(|t| expand(t, max_terms, depth + 1))
                    .collect();
                func(*f, a?)
            }
            other => other.clone(),
        })
    }
}

/// Lanczos approximation of Γ(z) for complex z (g = 7, n = 9; about 15 digits), with the
/// reflection formula left of 1/2. Not finite at the poles and where it overflows.
pub(super) fn gamma(z: Complex64) -> Complex64 {
    const G: f64 = 7.0;
    const C: [f64; 9] = [
        0.999_999_999_999_809_9,
        676.520_368_121_885_1,
        -1_259.139_216_722_402_8,
        771.323_428_777_653_1,
        -176.615_029_162_140_6,
        12.507_343_278_686_905,
        -0.138_571_095_265_720_12,
        9.984_369_578_019_572e-6,
        1.505_632_735_149_311_6e-7,
    ];
    let pi = std::f64::consts::PI;
    if z.re < 0.5 {
        // Reflection.
        let s = (z * pi).sin();
        return Complex64::new(pi, 0.0) / (s * gamma(Complex64::new(1.0, 0.0) - z));
    }
    let z = z - 1.0;
    let mut x = Complex64::new(C[0], 0.0);
    for (i, c) in C.iter().enumerate().skip(1) {
        x += *c / (z + i as f64);
    }
    let t = z + G + 0.5;
    Complex64::new((2.0 * pi).sqrt(), 0.0) * t.powc(z + 0.5) * (-t).exp() * x
}

mod numeric {
    use super::*;

    fn real(z: Complex64) -> Option<f64> {
        (z.im.abs() <= 1e-12 * z.re.abs().max(1.0)).then_some(z.re)
    }

    fn int_value(z: Complex64) -> Option<f64> {
        let r = real(z)?;
        ((r - r.round()).abs() <= 1e-9 && r.abs() < 9.0e15).then_some(r.round())
    }

    fn gcd_f(mut a: f64, mut b: f64) -> f64 {
        a = a.abs();
        b = b.abs();
        while b > 0.5 {
            let t = a % b;
            a = b;
            b = t;
        }
        a
    }

    fn finite(z: Complex64) -> Option<Complex64> {
        (z.re.is_finite() && z.im.is_finite() && z.norm() < 1e250).then_some(z)
    }

    pub(super) fn eval(
        e: &Expr,
        var: &dyn Fn(&str) -> Complex64,
        b: &Budget,
        d: usize,
    ) -> Option<Complex64> {
        if d > b.max_depth || b.expired() {
            return None;
        }
        let ev = |x: &Expr| eval(x, var, b, d + 1);
        let one = Complex64::new(1.0, 0.0);
        let v = match e {
            Expr::Num(r) => Complex64::new(r.to_f64(), 0.0),
            Expr::Const(Constant::Pi) => Complex64::new(std::f64::consts::PI, 0.0),
            Expr::Const(Constant::E) => Complex64::new(std::f64::consts::E, 0.0),
            Expr::Const(Constant::I) => Complex64::new(0.0, 1.0),
            Expr::Const(Constant::Infinity) | Expr::Const(Constant::Undefined) => return None,
            Expr::Sym(s) => var(s),
            Expr::Add(v) => {
                let mut acc = Complex64::new(0.0, 0.0);
                for t in v {
                    acc += ev(t)?;
                }
                acc
            }
            Expr::Mul(v) => {
                let mut acc = one;
                for t in v {
                    acc *= ev(t)?;
                }
                acc
            }
            Expr::Pow(base, x) => {
                let bv = ev(base)?;
                match x.as_rational() {
                    Some(r) if r.is_integer() && r.numer().bits() < 11 => {
                        let k = r.to_i64()? as i32;
                        if bv == Complex64::new(0.0, 0.0) && k < 0 {
                            return None;
                        }
                        bv.powi(k)
                    }
                    _ => {
                        let xv = ev(x)?;
                        if bv == Complex64::new(0.0, 0.0) {
                            if xv.re > 0.0 {
                                Complex64::new(0.0, 0.0)
                            } else {
                                return None;
                            }
                        } else {
                            bv.powc(xv)
                        }
                    }
                }
            }
            Expr::Func(f, args) => {
                let vals: Option<Vec<Complex64>> = args.iter().map(ev).collect();
                let vals = vals?;
                let a = *vals.first()?;
                match f {
                    Func::Ln => {
                        if a == Complex64::new(0.0, 0.0) {
                            return None;
                        }
                        a.ln()
                    }
                    Func::Exp => a.exp(),
                    Func::Sin => a.sin(),
                    Func::Cos => a.cos(),
                    Func::Tan => a.tan(),
                    Func::Cot => one / a.tan(),
                    Func::Sec => one / a.cos(),
                    Func::Csc => one / a.sin(),
                    Func::Asin => a.asin(),
                    Func::Acos => a.acos(),
                    Func::Atan => a.atan(),
                    Func::Acot => (one / a).atan(),
                    Func::Asec => (one / a).acos(),
                    Func::Acsc => (one / a).asin(),
                    Func::Sinh => a.sinh(),
                    Func::Cosh => a.cosh(),
                    Func::Tanh => a.tanh(),
                    Func::Abs => Complex64::new(a.norm(), 0.0),
                    Func::Factorial => {
                        if let Some(n) = int_value(a) {
                            if n < 0.0 {
                                return None;
                            }
                            if n > 170.0 {
                                return None;
                            }
                        }
                        gamma(a + 1.0)
                    }
                    Func::Floor => Complex64::new(real(a)?.floor(), 0.0),
                    Func::Ceil => Complex64::new(real(a)?.ceil(), 0.0),
                    Func::Binomial => {
                        let k = *vals.get(1)?;
                        gamma(a + 1.0) / (gamma(k + 1.0) * gamma(a - k + 1.0))
                    }
                    Func::Gcd | Func::Lcm => {
                        let mut acc = int_value(a)?;
                        for v in &vals[1..] {
                            let x = int_value(*v)?;
                            acc = if *f == Func::Gcd {
                                gcd_f(acc, x)
                            } else {
                                let g = gcd_f(acc, x);
                                if g == 0.0 { 0.0 } else { (acc * x / g).abs() }
                            };
                        }
                        Complex64::new(acc, 0.0)
                    }
                    Func::Min | Func::Max => {
                        let mut acc = real(a)?;
                        for v in &vals[1..] {
                            let x = real(*v)?;
                            acc = if *f == Func::Min {
                                acc.min(x)
                            } else {
                                acc.max(x)
                            };
                        }
                        Complex64::new(acc, 0.0)
                    }
                }
            }
        };
        finite(v)
    }

    /// Deterministic pseudo-random value of variable `name` at point `k`.
    pub(super) fn point(name: &str, k: usize) -> Complex64 {
        // FNV-1a of the name, mixed with the point index (splitmix64).
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for byte in name.bytes() {
            h ^= u64::from(byte);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        let mut z = h ^ (k as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let mut next = || {
            z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut x = z;
            x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            x ^= x >> 31;
            (x >> 11) as f64 / (1u64 << 53) as f64
        };
        let (u1, u2) = (next(), next());
        let mag = 0.4 + 1.6 * u1;
        match k % 4 {
            0 | 2 => Complex64::new(mag, 0.0),
            // Wide on the negative side, so that √(p²) = p fails where p changes sign.
            1 => Complex64::new(-(0.4 + 30.0 * u1), 0.0),
            _ => Complex64::new(mag, 0.3 + 0.9 * u2),
        }
    }

    /// Whether `e` is a sum of monomials `c · π^j · e^k · i^m · Π p^(f)` (rational `c`, prime
    /// bases `p`, fractional exponents `f ∈ (0,1)`); such a canonical sum is zero only when it
    /// is the number 0.
    fn is_flat(e: &Expr) -> bool {
        fn monomial(m: &Expr) -> bool {
            let factor = |f: &Expr| match f {
                Expr::Num(_) => true,
                Expr::Const(Constant::Pi | Constant::E | Constant::I) => true,
                Expr::Pow(b, x) => match (&**b, &**x) {
                    (Expr::Const(Constant::Pi | Constant::E), Expr::Num(r)) => r.is_integer(),
                    (Expr::Num(p), Expr::Num(r)) => {
                        p.is_integer() && !p.is_negative() && !r.is_integer() && !r.is_negative()
                    }
                    _ => false,
                },
                _ => false,
            };
            match m {
                Expr::Mul(v) => v.iter().all(factor),
                other => factor(other),
            }
        }
        match e {
            Expr::Add(v) => v.iter().all(monomial),
            other => monomial(other),
        }
    }

    pub(super) fn equal(a: &Expr, b: &Expr, budget: &Budget) -> Option<bool> {
        let undefined = |e: &Expr| {
            let mut stack = vec![e];
            while let Some(x) = stack.pop() {
                match x {
                    Expr::Const(Constant::Undefined) => return true,
                    Expr::Add(v) | Expr::Mul(v) | Expr::Func(_, v) => stack.extend(v.iter()),
                    Expr::Pow(b, y) => {
                        stack.push(b);
                        stack.push(y);
                    }
                    _ => {}
                }
            }
            false
        };
        if undefined(a) || undefined(b) {
            return None;
        }
        if a == b {
            return Some(true);
        }
        if budget.expired() {
            return None;
        }
        if a.has_infinity() || b.has_infinity() {
            return None;
        }
        let d = Expr::sub(a.clone(), b.clone());
        if let Expr::Num(r) = &d {
            return Some(r.is_zero());
        }
        if let Some(x) = d.expand(256) {
            if let Expr::Num(r) = &x {
                return Some(r.is_zero());
            }
            if is_flat(&x) {
                return Some(false);
            }
        }
        let syms: Vec<String> = a.symbols().union(&b.symbols()).cloned().collect();
        let npoints = if syms.is_empty() {
            1
        } else {
            budget.eval_points.max(1)
        };
        // An exact number against a closed form that did not reduce to one: the closed form is
        // almost surely irrational, so a number with a large denominator (a long decimal) is an
        // approximation, never equal; otherwise decide numerically with a tight tolerance.
        let mut rel_tol = 1e-10;
        if syms.is_empty()
            && let Some(r) = a.as_rational().or_else(|| b.as_rational())
        {
            if r.denom() > &BigInt::from(1_000_000) {
                return Some(false);
            }
            rel_tol = 1e-12;
        }
        let (mut valid, mut agree) = (0usize, 0usize);
        for k in 0..npoints {
            let var = |name: &str| point(name, k);
            let (Some(va), Some(vb)) = (a.eval(&var, budget), b.eval(&var, budget)) else {
                if budget.expired() {
                    return None;
                }
                continue;
            };
            valid += 1;
            let scale = va.norm().max(vb.norm());
            if (va - vb).norm() <= rel_tol * scale + 1e-12 {
                agree += 1;
            } else {
                return Some(false);
            }
        }
        let needed = if syms.is_empty() {
            1
        } else {
            npoints.div_ceil(2)
        };
        (valid >= needed && agree == valid).then_some(true)
    }
}

impl Expr {
    /// Replaces the variable `name` by `value` everywhere, re-canonicalising (`None` when
    /// deeper than `max_depth`).
    pub fn subs(&self, name: &str, value: &Expr, max_depth: usize) -> Option<Expr> {
        if max_depth == 0 {
            return None;
        }
        let d = max_depth - 1;
        let all = |v: &[Expr]| -> Option<Vec<Expr>> {
            v.iter().map(|x| x.subs(name, value, d)).collect()
        };
        Some(match self {
            Expr::Sym(s) if s == name => value.clone(),
            Expr::Add(v) => Expr::add(all(v)?),
            Expr::Mul(v) => Expr::mul(all(v)?),
            Expr::Pow(b, x) => Expr::pow(b.subs(name, value, d)?, x.subs(name, value, d)?),
            Expr::Func(f, v) => Expr::func(*f, all(v)?),
            other => other.clone(),
        })
    }
}

impl std::ops::Add for Expr {
    type Output = Expr;
    fn add(self, o: Expr) -> Expr {
        Expr::add(vec![self, o])
    }
}
impl std::ops::Sub for Expr {
    type Output = Expr;
    fn sub(self, o: Expr) -> Expr {
        Expr::sub(self, o)
    }
}
impl std::ops::Mul for Expr {
    type Output = Expr;
    fn mul(self, o: Expr) -> Expr {
        Expr::mul(vec![self, o])
    }
}
impl std::ops::Div for Expr {
    type Output = Expr;
    fn div(self, o: Expr) -> Expr {
        Expr::div(self, o)
    }
}
impl std::ops::Neg for Expr {
    type Output = Expr;
    fn neg(self) -> Expr {
        Expr::neg(self)
    }
}

impl fmt::Display for Expr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fn join(f: &mut fmt::Formatter<'_>, v: &[Expr], sep: &str) -> fmt::Result {
            for (i, x) in v.iter().enumerate() {
                if i > 0 {
                    f.write_str(sep)?;
                }
                write!(f, "{x}")?;
            }
            Ok(())
        }
        match self {
            Expr::Num(r) => write!(f, "{r}"),
            Expr::Const(Constant::Pi) => f.write_str("pi"),
            Expr::Const(Constant::E) => f.write_str("E"),
            Expr::Const(Constant::I) => f.write_str("I"),
            Expr::Const(Constant::Infinity) => f.write_str("oo"),
            Expr::Const(Constant::Undefined) => f.write_str("nan"),
            Expr::Sym(s) => f.write_str(s),
            Expr::Add(v) => {
                f.write_str("(")?;
                join(f, v, " + ")?;
                f.write_str(")")
            }
            Expr::Mul(v) => {
                f.write_str("(")?;
                join(f, v, "*")?;
                f.write_str(")")
            }
            Expr::Pow(b, x) => write!(f, "({b})^({x})"),
            Expr::Func(func, v) => {
                write!(f, "{func:?}(")?;
                join(f, v, ", ")?;
                f.write_str(")")
            }
        }
    }
}

/// Whether `a = k·b` for a constant `k ≠ 0` (numerically, at the same points as
/// [`scalar_equal`]); used to compare equations `l₁ = r₁` and `l₂ = r₂` through
/// `l₁ − r₁` and `l₂ − r₂`. `None` when undecided.
pub fn proportional(a: &Expr, b: &Expr) -> Option<bool> {
    let budget = Budget::default();
    if a == b {
        return Some(!matches!(a, Expr::Num(r) if r.is_zero()));
    }
    let syms: Vec<String> = a.symbols().union(&b.symbols()).cloned().collect();
    let mut ratio: Option<Complex64> = None;
    let mut valid = 0;
    for k in 0..budget.eval_points.max(2) {
        let var = |name: &str| numeric::point(name, k);
        let (Some(va), Some(vb)) = (a.eval(&var, &budget), b.eval(&var, &budget)) else {
            continue;
        };
        let (na, nb) = (va.norm(), vb.norm());
        if na < 1e-12 && nb < 1e-12 {
            continue;
        }
        if na < 1e-12 || nb < 1e-12 {
            return Some(false);
        }
        let r = va / vb;
        match ratio {
            None => ratio = Some(r),
            Some(r0) if (r - r0).norm() <= 1e-9 * r0.norm() => {}
            Some(_) => return Some(false),
        }
        valid += 1;
    }
    let needed = if syms.is_empty() { 1 } else { 3 };
    (valid >= needed).then_some(true)
}

#[cfg(test)]
mod doc_examples {
    #[test]
    fn example_1() {
        use crate::reward::math::expr::{Expr, scalar_equal};
        let x = Expr::sym("x");
        let a = Expr::add(vec![x.clone(), Expr::int(1)]);
        let b = Expr::add(vec![Expr::int(1), x]);
        assert_eq!(scalar_equal(&a, &b), Some(true));
    }
    #[test]
    fn example_2() {
        use crate::reward::math::expr::{Expr, proportional};
        let x = Expr::sym("x");
        let a = Expr::add(vec![x.clone(), Expr::int(1)]);
        let b = Expr::add(vec![Expr::mul(vec![Expr::int(-2), x]), Expr::int(-2)]);
        assert_eq!(proportional(&a, &b), Some(true));
    }
}
