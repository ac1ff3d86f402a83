//! Vectorised `exp` and the row kernels of the training path built on it.
//!
//! The softmaxes of attention and of the target tokens' log-probabilities and the SwiGLU
//! gate call `exp` once per element: through the C library's scalar `expf` that was ≈ 10 %
//! of a training step, and the row sums behind them were one chain of dependent additions
//! per row. Here `exp` is a branch-free polynomial the compiler vectorises, and sums and
//! maxima run in [`LANES`] independent lanes combined in a fixed order.
//!
//! Every kernel is compiled twice — for the baseline instruction set and for AVX2, chosen
//! at run time — from the same source, with no fused multiply-adds in either (Rust never
//! contracts `a * b + c`), so both give the same bits: their results depend neither on the
//! CPU's vector width nor on the number of threads.

/// `eˣ` within 2 units in the last place (tested on every 997th `f32` of [−104, 89]; `+∞`
/// above ≈ 88.72, `0` below ≈ −103.97, subnormal results in between, NaN for NaN):
/// Cody–Waite range reduction by `ln 2` and Cephes' degree-5 polynomial.
#[inline(always)]
pub(crate) fn exp(x: f32) -> f32 {
    const LN2_HI: f32 = 0.693_359_4; // 0.693359375: few bits, so `n · LN2_HI` is exact
    const LN2_LO: f32 = -2.121_944_4e-4;
    // 1.5 · 2²³: adding it to |t| < 2²² rounds t to an integer held in the low mantissa bits.
    const SHIFTER: f32 = 12_582_912.0;
    // Beyond these the result is ∞ or 0 anyway; the bounds keep 2ⁿ's exponent in range.
    let x = x.clamp(-104.0, 89.0);
    let t = x * std::f32::consts::LOG2_E + SHIFTER;
    let n = t - SHIFTER;
    let r = (x - n * LN2_HI) - n * LN2_LO;
    let p = ((((1.987_569_2e-4 * r + 1.398_199_9e-3) * r + 8.333_452e-3) * r + 4.166_579_6e-2) * r
        + 1.666_666_5e-1)
        * r
        + 0.5;
    let p = p * (r * r) + r + 1.0;
    // n ∈ [-150, 128]: 2ⁿ as two powers of two with normal exponents, so that overflow,
    // underflow and subnormal results are rounded once, by the last multiplication.
    let n = (t.to_bits() as i32).wrapping_sub(SHIFTER.to_bits() as i32);
    let n1 = n >> 1;
    let pow2 = |e: i32| f32::from_bits(((e + 127) as u32) << 23);
    p * pow2(n1) * pow2(n - n1)
}

/// Independent accumulators per sum or maximum (two AVX2 registers).
pub(crate) const LANES: usize = 16;

/// Lane accumulators folded left to right.
#[inline(always)]
fn fold(acc: [f32; LANES], init: f32, f: impl Fn(f32, f32) -> f32) -> f32 {
    acc.into_iter().fold(init, f)
}

/// Compiles each kernel for the baseline instruction set and for AVX2 and picks one at
/// run time (see the module's documentation: both give the same bits).
macro_rules! kernels {
    ($(
        $(#[$doc:meta])*
        pub(crate) fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)? $body:block
    )*) => {
        mod baseline {
            #[allow(unused_imports)]
            use super::*;
            $(
                #[inline(always)]
                pub(super) fn $name($($arg: $ty),*) $(-> $ret)? $body
            )*
        }

        #[cfg(target_arch = "x86_64")]
        mod avx2 {
            $(
                #[target_feature(enable = "avx2")]
                pub(super) unsafe fn $name($($arg: $ty),*) $(-> $ret)? {
                    super::baseline::$name($($arg),*)
                }
            )*
        }

        $(
            $(#[$doc])*
            pub(crate) fn $name($($arg: $ty),*) $(-> $ret)? {
                #[cfg(target_arch = "x86_64")]
                if std::arch::is_x86_feature_detected!("avx2") {
                    // SAFETY: the CPU has AVX2.
                    return unsafe { avx2::$name($($arg),*) };
                }
                baseline::$name($($arg),*)
            }
        )*
    };
}

kernels! {
    /// The maximum of `x` (`-∞` when empty; NaN values are skipped, as `f32::max` does).
    pub(crate) fn max(x: &[f32]) -> f32 {
        let mut acc = [f32::NEG_INFINITY; LANES];
        let chunks = x.chunks_exact(LANES);
        let rest = chunks.remainder();
        for c in chunks {
            for (a, &v) in acc.iter_mut().zip(c) {
                *a = a.max(v);
            }
        }
        rest.iter().fold(fold(acc, f32::NEG_INFINITY, f32::max), |m, &v| m.max(v))
    }

    /// `Σ aᵢ · bᵢ` over the shorter of the two.
    pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
        let n = a.len().min(b.len());
        let (a, b) = (&a[..n], &b[..n]);
        let mut acc = [0f32; LANES];
        let (ac, bc) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
        let (ar, br) = (ac.remainder(), bc.remainder());
        for (ca, cb) in ac.zip(bc) {
            for ((s, &x), &y) in acc.iter_mut().zip(ca).zip(cb) {
                *s += x * y;
            }
        }
        ar.iter().zip(br).fold(fold(acc, 0.0, |s, a| s + a), |s, (&x, &y)| s + x * y)
    }

    /// `Σ exp(x − m)`.
    pub(crate) fn exp_sum(x: &[f32], m: f32) -> f32 {
        let mut acc = [0f32; LANES];
        let chunks = x.chunks_exact(LANES);
        let rest = chunks.remainder();
        for c in chunks {
            for (a, &v) in acc.iter_mut().zip(c) {
                *a += exp(v - m);
            }
        }
        rest.iter().fold(fold(acc, 0.0, |s, a| s + a), |s, &v| s + exp(v - m))
    }

    /// `softmax(scale · x)` in place (at least one value).
    pub(crate) fn softmax_in_place(x: &mut [f32], scale: f32) {
        let mut acc = [f32::NEG_INFINITY; LANES];
        let chunks = x.chunks_exact(LANES);
        let rest = chunks.remainder();
        for c in chunks {
            for (a, &v) in acc.iter_mut().zip(c) {
                *a = a.max(v * scale);
            }
        }
        let m = rest
            .iter()
            .fold(fold(acc, f32::NEG_INFINITY, f32::max), |m, &v| m.max(v * scale));
        let mut acc = [0f32; LANES];
        let mut xs = x.chunks_exact_mut(LANES);
        for c in &mut xs {
            for (a, o) in acc.iter_mut().zip(c) {
                let e = exp(*o * scale - m);
                *o = e;
                *a += e;
            }
        }
        let mut sum = fold(acc, 0.0, |s, a| s + a);
        for o in xs.into_remainder() {
            let e = exp(*o * scale - m);
            *o = e;
            sum += e;
        }
        let inv = 1.0 / sum;
        for o in x.iter_mut() {
            *o *= inv;
        }
    }

    /// `y = exp(x − m) · scale`, element by element.
    pub(crate) fn exp_scaled(y: &mut [f32], x: &[f32], m: f32, scale: f32) {
        for (o, &v) in y.iter_mut().zip(x) {
            *o = exp(v - m) * scale;
        }
    }

    /// SwiGLU, `y = silu(g) · u` with `silu(g) = g / (1 + e^{−g})`.
    pub(crate) fn swiglu(y: &mut [f32], g: &[f32], u: &[f32]) {
        for ((o, &gv), &uv) in y.iter_mut().zip(g).zip(u) {
            *o = gv / (1.0 + exp(-gv)) * uv;
        }
    }

    /// SwiGLU's gradients given `r` = ∂L/∂y: `dg = r · u · (σ · (1 − silu) + silu)`,
    /// `du = r · silu`, with `σ = 1 / (1 + e^{−g})` and `silu = g / (1 + e^{−g})` (as
    /// candle composes them).
    pub(crate) fn swiglu_grads(dg: &mut [f32], du: &mut [f32], g: &[f32], u: &[f32], r: &[f32]) {
        for ((((dgv, duv), &gv), &uv), &rv) in
            dg.iter_mut().zip(du.iter_mut()).zip(g).zip(u).zip(r)
        {
            let d = 1.0 + exp(-gv);
            let (s, silu) = (1.0 / d, gv / d);
            *duv = rv * silu;
            *dgv = rv * uv * (s * (1.0 - silu) + silu);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Distance in units in the last place between two finite `f32` of the same sign.
    fn ulps(a: f32, b: f32) -> u32 {
        (a.to_bits() as i64 - b.to_bits() as i64).unsigned_abs() as u32
    }

    #[test]
    fn exp_is_within_two_ulps_everywhere() {
        // Every 997th float from −104 to 89 (both signs, all exponents): ≈ 4M values.
        let mut worst = (0u32, 0f32);
        let (lo, hi) = ((-104f32).to_bits(), 89f32.to_bits());
        for bits in (0..=lo).step_by(997).chain((0..=hi).step_by(997)) {
            let x = f32::from_bits(bits);
            let want = (x as f64).exp() as f32;
            let got = exp(x);
            let d = ulps(got, want);
            if d > worst.0 {
                worst = (d, x);
            }
        }
        assert!(worst.0 <= 2, "{} ulps at x = {}", worst.0, worst.1);
    }

    #[test]
    fn exp_edges() {
        assert_eq!(exp(0.0), 1.0);
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp(-200.0), 0.0);
        assert_eq!(exp(f32::INFINITY), f32::INFINITY);
        assert_eq!(exp(100.0), f32::INFINITY);
        assert!(ulps(exp(88.72), (88.72f32 as f64).exp() as f32) <= 2);
        assert!(exp(f32::NAN).is_nan());
        // Subnormal results.
        let x = -100.0f32;
        assert!(ulps(exp(x), (x as f64).exp() as f32) <= 2);
        assert!(exp(x) > 0.0 && exp(x) < f32::MIN_POSITIVE);
    }

    fn data(n: usize, seed: u32) -> Vec<f32> {
        let mut s = seed.wrapping_mul(2_654_435_761).max(1);
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                (s as f32 / u32::MAX as f32 - 0.5) * 20.0
            })
            .collect()
    }

    /// Every kernel against a plain f64 computation, at lengths around the lane count
    /// (remainders), and the baseline and AVX2 builds bit for bit.
    #[test]
    fn kernels_match_plain_f64_and_each_other() {
        for n in [1, 3, 15, 16, 17, 33, 100, 1000] {
            let (x, u, r) = (data(n, 1), data(n, 2), data(n, 3));
            let m64 = x.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(v as f64));
            assert_eq!(max(&x) as f64, m64);
            let m = m64 as f32;
            let d64: f64 = x.iter().zip(&u).map(|(&a, &b)| a as f64 * b as f64).sum();
            let d_abs: f64 = x
                .iter()
                .zip(&u)
                .map(|(&a, &b)| (a as f64 * b as f64).abs())
                .sum();
            assert!((dot(&x, &u) as f64 - d64).abs() <= 1e-6 * d_abs, "{n}");
            let s64: f64 = x.iter().map(|&v| (v as f64 - m64).exp()).sum();
            assert!((exp_sum(&x, m) as f64 / s64 - 1.0).abs() < 1e-5, "{n}");
            let mut y = vec![0f32; n];
            y.copy_from_slice(&x);
            softmax_in_place(&mut y, 0.5);
            let z: f64 = x.iter().map(|&v| (0.5 * v as f64 - 0.5 * m64).exp()).sum();
            for (&yv, &xv) in y.iter().zip(&x) {
                let want = (0.5 * xv as f64 - 0.5 * m64).exp() / z;
                assert!(
                    (yv as f64 - want).abs() <= 1e-6 * want.max(1e-30) + 1e-12,
                    "{n}"
                );
            }
            exp_scaled(&mut y, &x, m, 0.25);
            for (&yv, &xv) in y.iter().zip(&x) {
                let want = ((xv - m) as f64).exp() * 0.25;
                assert!((yv as f64 - want).abs() <= 1e-6 * want, "{n}");
            }
            swiglu(&mut y, &x, &u);
            let (mut dg, mut du) = (vec![0f32; n], vec![0f32; n]);
            swiglu_grads(&mut dg, &mut du, &x, &u, &r);
            for i in 0..n {
                let (g, uu, rr) = (x[i] as f64, u[i] as f64, r[i] as f64);
                let s = 1.0 / (1.0 + (-g).exp());
                let close = |a: f32, b: f64| (a as f64 - b).abs() <= 1e-5 * b.abs().max(1.0);
                assert!(close(y[i], g * s * uu), "{n}");
                assert!(close(du[i], rr * g * s), "{n}");
                assert!(close(dg[i], rr * uu * (s * (1.0 - g * s) + g * s)), "{n}");
            }
            #[cfg(target_arch = "x86_64")]
            if std::arch::is_x86_feature_detected!("avx2") {
                // SAFETY: the CPU has AVX2.
                unsafe {
                    assert_eq!(avx2::exp_sum(&x, m), baseline::exp_sum(&x, m));
                    let (mut a, mut b) = (vec![0f32; n], vec![0f32; n]);
                    a.copy_from_slice(&x);
                    b.copy_from_slice(&x);
                    avx2::softmax_in_place(&mut a, 0.5);
                    baseline::softmax_in_place(&mut b, 0.5);
                    assert_eq!(a, b);
                    avx2::swiglu(&mut a, &x, &u);
                    baseline::swiglu(&mut b, &x, &u);
                    assert_eq!(a, b);
                }
            }
        }
    }
}
