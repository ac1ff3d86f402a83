//! Helpers shared by the local backend's kernel tests.

use candle_core::backprop::GradStore;
use candle_core::{Device, Tensor};

/// Deterministic pseudo-random values in `[-half, half]` (xorshift, 2,001 levels).
pub(crate) fn uniform(shape: &[usize], seed: u64, half: f32) -> Tensor {
    let n: usize = shape.iter().product();
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let step = 1000.0 / half;
    let v: Vec<f32> = (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % 2001) as f32 / step - half
        })
        .collect();
    Tensor::from_vec(v, shape, &Device::Cpu).expect("a tensor of its own shape")
}

/// The largest absolute difference relative to the largest magnitude of `b`.
pub(crate) fn max_rel(a: &Tensor, b: &Tensor) -> f32 {
    let d = (a - b).and_then(|d| d.abs()).and_then(|d| d.max_all());
    let s = b.abs().and_then(|s| s.max_all());
    let (Ok(d), Ok(s)) = (
        d.and_then(|d| d.to_scalar::<f32>()),
        s.and_then(|s| s.to_scalar::<f32>()),
    ) else {
        return f32::INFINITY;
    };
    d / s.max(1e-30)
}

/// The gradients of `sum(y ⊙ target)`: what the kernel tests compare between a fused op
/// and its composed form (a fixed random `target` weights every output element).
pub(crate) fn weighted_grads(y: &Tensor, target: &Tensor) -> GradStore {
    (y * target)
        .and_then(|p| p.sum_all())
        .and_then(|s| s.backward())
        .expect("the gradients of a weighted sum")
}

/// The bit patterns of an f32 tensor's values, for tests that require the same bits.
pub(crate) fn f32_bits(t: &Tensor) -> Vec<u32> {
    t.flatten_all()
        .and_then(|t| t.to_vec1::<f32>())
        .expect("an f32 tensor")
        .into_iter()
        .map(f32::to_bits)
        .collect()
}
