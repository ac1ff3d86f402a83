//! The backend's own store of large `f32` buffers, reused from one training step to the next.
//!
//! A training step allocates the same large buffers every time (activations, attention
//! weights, logits and their gradients, the weights' gradients: tens to hundreds of MiB on a
//! model with a 32k vocabulary). With glibc's default settings a block above the `mmap`
//! threshold (at most 32 MiB) is a fresh `mmap`, and the heaps of the arenas that worker
//! threads get hold at most 64 MiB and are trimmed when emptied, so every step page-faulted
//! and zero-filled most of its memory again (about 0.5 M faults, a sixth of a full
//! fine-tuning step of a 59M-parameter model on two threads). Instead of changing the
//! process's allocator settings (see [`super::tune_allocator`], opt-in), the backend keeps
//! those buffers itself: its kernels take their output buffers from a [`BufferPool`]
//! ([`super::buffers::uninit`]), and the training pass gives back the buffers of tensors
//! that have reached the end of their life ([`BufferPool::recycle`]: the activations once
//! the backward pass is done with a layer, the gradients once summed or applied).
//!
//! Each backend has its own pool, reached from its own threads: the backend's rayon threads
//! are started with a handle on it ([`enter`]), so the kernels need no extra argument, and
//! threads that are not the backend's (another backend's, the caller's) never see it. A
//! buffer handed out is uninitialised like a fresh one ([`super::buffers::uninit`]'s
//! contract), so results are the same bit for bit whether it is recycled or new.
//!
//! Bound: at the end of each `forward_backward` / `forward` ([`BufferPool::trim`]) the pool
//! keeps at most as many values as that call took from it, largest buffers dropped first;
//! everything is freed with the backend.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::mem::MaybeUninit;
use std::sync::{Arc, Mutex, MutexGuard};

use candle_core::{CpuStorage, InplaceOp1, Layout, Tensor};

/// Buffers below this many values are left to `malloc`, which serves them from its heap
/// cheaply (below glibc's smallest `mmap` threshold, 128 KiB). Unit tests reuse nearly
/// every buffer, to show that reuse changes no result.
pub(crate) const MIN_LEN: usize = if cfg!(test) { 64 } else { 1 << 15 };

/// Free `f32` buffers by capacity, and the demand since the last [`trim`](Self::trim).
#[derive(Debug, Default)]
pub(crate) struct BufferPool {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// Free buffers (length 0) by capacity.
    free: BTreeMap<usize, Vec<Vec<f32>>>,
    /// Values held in `free`.
    held: usize,
    /// Values asked for since the last trim (buffers found or not).
    asked: usize,
}

impl BufferPool {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while the lock was held leaves a consistent free list (every update is a
        // single push or pop); keep using it.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// An empty buffer with room for `len` values: a free one of capacity `len` to
    /// `len + len / 4` (the smallest), else `None`.
    fn take(&self, len: usize) -> Option<Vec<MaybeUninit<f32>>> {
        let mut inner = self.lock();
        inner.asked += len;
        let cap = *inner.free.range(len..=len + len / 4).next()?.0;
        let bucket = inner.free.get_mut(&cap)?;
        let v = bucket.pop()?;
        if bucket.is_empty() {
            inner.free.remove(&cap);
        }
        inner.held -= v.capacity();
        let mut v = std::mem::ManuallyDrop::new(v);
        // SAFETY: same allocation and capacity, length 0; `MaybeUninit<f32>` has `f32`'s
        // layout.
        Some(unsafe { Vec::from_raw_parts(v.as_mut_ptr().cast(), 0, v.capacity()) })
    }

    /// Keeps `v` for reuse (small ones are dropped).
    pub(crate) fn give(&self, mut v: Vec<f32>) {
        if v.capacity() < MIN_LEN {
            return;
        }
        v.clear();
        let mut inner = self.lock();
        inner.held += v.capacity();
        inner.free.entry(v.capacity()).or_default().push(v);
    }

    /// Takes the buffer of each of `tensors` whose life is over for reuse: an `f32` CPU
    /// tensor that spans its whole storage leaves it empty; others are left alone.
    ///
    /// The caller guarantees that nothing reads these tensors, nor any other tensor sharing
    /// their storage (a reshape, a clone), afterwards. Tensors sharing one storage may be
    /// passed together (the second finds it empty).
    pub(crate) fn recycle<'a>(&self, tensors: impl IntoIterator<Item = &'a Tensor>) {
        for t in tensors {
            if !super::buffers::f32_cpu(t) || t.elem_count() < MIN_LEN {
                continue;
            }
            let steal = Steal(RefCell::new(Vec::new()));
            if t.inplace_op1(&steal).is_ok() {
                self.give(steal.0.into_inner());
            }
        }
    }

    /// Drops free buffers, largest first, until the pool holds at most as many values as
    /// were asked of it since the last trim; starts counting again.
    pub(crate) fn trim(&self) {
        let mut inner = self.lock();
        let keep = std::mem::take(&mut inner.asked);
        while inner.held > keep {
            let Some(mut last) = inner.free.last_entry() else {
                break;
            };
            let v = last.get_mut().pop();
            if last.get().is_empty() {
                last.remove();
            }
            inner.held -= v.map_or(0, |v| v.capacity());
        }
    }

    /// Values held free (tests).
    #[cfg(test)]
    pub(crate) fn held(&self) -> usize {
        self.lock().held
    }
}

/// Moves a whole storage's `f32` buffer out (leaving it empty).
struct Steal(RefCell<Vec<f32>>);

impl InplaceOp1 for Steal {
    fn name(&self) -> &'static str {
        "rlvr-recycle"
    }

    fn cpu_fwd(&self, s: &mut CpuStorage, l: &Layout) -> candle_core::Result<()> {
        if let CpuStorage::F32(v) = s {
            let whole =
                l.start_offset() == 0 && l.is_contiguous() && l.shape().elem_count() == v.len();
            if whole {
                *self.0.borrow_mut() = std::mem::take(v);
            }
        }
        Ok(())
    }
}

thread_local! {
    /// The pool of the backend whose thread this is.
    static CURRENT: RefCell<Option<Arc<BufferPool>>> = const { RefCell::new(None) };
}

/// Makes `pool` the one this thread's kernels take their buffers from (for the backend's
/// threads, when they start).
pub(crate) fn enter(pool: Arc<BufferPool>) {
    CURRENT.with(|c| *c.borrow_mut() = Some(pool));
}

/// A free buffer for `len` values from this thread's pool, if it has one; `None` for small
/// buffers.
pub(crate) fn take(len: usize) -> Option<Vec<MaybeUninit<f32>>> {
    if len < MIN_LEN {
        return None;
    }
    CURRENT
        .try_with(|c| c.borrow().as_ref().and_then(|p| p.take(len)))
        .ok()
        .flatten()
}

/// This thread's pool, if it has one.
fn current() -> Option<Arc<BufferPool>> {
    CURRENT.try_with(|c| c.borrow().clone()).ok().flatten()
}

/// Gives `v` back to this thread's pool, if it has one (else drops it).
pub(crate) fn give(v: Vec<f32>) {
    if v.capacity() >= MIN_LEN
        && let Some(p) = current()
    {
        p.give(v);
    }
}

/// [`BufferPool::recycle`] on this thread's pool; does nothing on a thread without one.
pub(crate) fn recycle<'a>(tensors: impl IntoIterator<Item = &'a Tensor>) {
    if let Some(p) = current() {
        p.recycle(tensors);
    }
}

/// [`BufferPool::trim`] on this thread's pool, if it has one.
pub(crate) fn trim() {
    if let Some(p) = current() {
        p.trim();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn a_recycled_buffer_is_handed_out_again_and_the_pool_is_bounded() {
        let pool = BufferPool::default();
        let t = Tensor::zeros(MIN_LEN * 2, candle_core::DType::F32, &Device::Cpu).unwrap();
        let ptr = {
            let (s, _) = t.storage_and_layout();
            match &*s {
                candle_core::Storage::Cpu(CpuStorage::F32(v)) => v.as_ptr() as usize,
                _ => unreachable!(),
            }
        };
        // A part of a storage is not taken.
        pool.recycle([&t.narrow(0, 0, MIN_LEN).unwrap()]);
        assert_eq!(pool.held(), 0);
        let view = t.reshape((2, MIN_LEN)).unwrap();
        pool.recycle([&t, &view]);
        assert_eq!(pool.held(), MIN_LEN * 2);
        // Too large a buffer is not handed out for a small request; the right one is.
        assert!(pool.take(MIN_LEN).is_none());
        let v = pool.take(MIN_LEN * 2 - 10).unwrap();
        assert_eq!((v.len(), v.as_ptr() as usize), (0, ptr));
        assert_eq!(pool.held(), 0);
        // Trim keeps at most what was asked for since the last trim.
        pool.give(unsafe { super::super::buffers::written(v) });
        pool.trim();
        assert_eq!(
            pool.held(),
            MIN_LEN * 2,
            "asked for 3 · MIN_LEN - 10 values"
        );
        pool.trim();
        assert_eq!(pool.held(), 0, "nothing asked for since");
    }
}
