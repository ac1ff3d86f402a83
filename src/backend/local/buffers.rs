//! Output buffers and raw views of candle CPU storage, shared by the hand-written kernels
//! ([`super::fused`], [`super::matmul`], [`super::optim`]).

use std::mem::MaybeUninit;

use candle_core::{CpuStorage, Layout, Tensor};

/// `len` values for an op to write, not zeroed: zeroing a whole output first ran on the
/// calling thread alone, over memory the threads then wrote again. Ops hand each chunk to
/// [`zeroed`] in the task that fills it (in cache, on every thread); products, which
/// overwrite without reading, get it as it is. Debug builds fill it with NaN, so that a value
/// left unwritten shows in the tests. A large buffer comes from the backend's
/// [pool](super::pool) when one of its buffers fits (its old values are not cleared: the
/// same contract).
pub(crate) fn uninit(len: usize) -> Vec<MaybeUninit<f32>> {
    let mut v = super::pool::take(len).unwrap_or_else(|| Vec::with_capacity(len));
    if cfg!(debug_assertions) {
        // All bits set: an f32 NaN. One `memset`, where `resize` writes value by value in an
        // unoptimized build.
        // SAFETY: the capacity is at least `len`; any bytes are a valid `MaybeUninit<f32>`.
        unsafe { v.as_mut_ptr().write_bytes(0xFF, len) };
    }
    // SAFETY: `MaybeUninit` values need no initialisation; the capacity is at least `len`.
    unsafe { v.set_len(len) };
    v
}

/// A chunk of an [`uninit`] output, zeroed.
pub(crate) fn zeroed(chunk: &mut [MaybeUninit<f32>]) -> &mut [f32] {
    // 0.0 is all bits clear: one `memset` whatever the optimisation level.
    // SAFETY: writes `chunk.len()` values inside `chunk`.
    unsafe { chunk.as_mut_ptr().write_bytes(0, chunk.len()) };
    // SAFETY: every value was just written.
    unsafe { assume_written(chunk) }
}

/// A chunk of an [`uninit`] output as values once written.
///
/// # Safety
/// Every value of `chunk` must have been written.
pub(crate) unsafe fn assume_written(chunk: &mut [MaybeUninit<f32>]) -> &mut [f32] {
    // SAFETY: `MaybeUninit<f32>` has `f32`'s layout; the caller promises every value is
    // initialised.
    unsafe { &mut *(chunk as *mut [MaybeUninit<f32>] as *mut [f32]) }
}

/// The values of an [`uninit`] output once written.
///
/// # Safety
/// Every value of `v` must have been written.
pub(crate) unsafe fn written(v: Vec<MaybeUninit<f32>>) -> Vec<f32> {
    let mut v = std::mem::ManuallyDrop::new(v);
    // SAFETY: same allocation, length and capacity; `MaybeUninit<f32>` has `f32`'s layout,
    // and the caller promises every value is initialised.
    unsafe { Vec::from_raw_parts(v.as_mut_ptr().cast::<f32>(), v.len(), v.capacity()) }
}

/// Whether `t` is an f32 tensor on the CPU (what the hand-written kernels take).
pub(crate) fn f32_cpu(t: &Tensor) -> bool {
    t.device().is_cpu() && t.dtype() == candle_core::DType::F32
}

pub(crate) fn contiguous_f32<'a>(
    s: &'a CpuStorage,
    l: &Layout,
    what: &str,
) -> candle_core::Result<&'a [f32]> {
    let CpuStorage::F32(v) = s else {
        candle_core::bail!("{what}: f32 only");
    };
    let Some((a, b)) = l.contiguous_offsets() else {
        candle_core::bail!("{what}: the input must be contiguous");
    };
    Ok(&v[a..b])
}

/// [`contiguous_f32`] for an in-place op's destination.
pub(crate) fn contiguous_f32_mut<'a>(
    s: &'a mut CpuStorage,
    l: &Layout,
    what: &str,
) -> candle_core::Result<&'a mut [f32]> {
    let CpuStorage::F32(v) = s else {
        candle_core::bail!("{what}: f32 only");
    };
    let Some((a, b)) = l.contiguous_offsets() else {
        candle_core::bail!("{what}: the input must be contiguous");
    };
    Ok(&mut v[a..b])
}
