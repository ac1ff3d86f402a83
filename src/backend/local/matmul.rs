//! Matrix products on the CPU through the `gemm` crate, with the backend's own thread policy.
//!
//! candle's CPU matmul decides how many threads to cut each product into from the
//! `RAYON_NUM_THREADS` environment variable (re-reading `/proc/cpuinfo` on every product when
//! it is unset) and parallelises even the smallest products, which makes a decoding step of
//! a small model several times slower on two threads than on one. [`matmul`] calls the same
//! `gemm` kernels directly and decides itself:
//!
//! - a product runs on the *current* rayon pool (the backend's own, see
//!   [`LocalOptions::threads`](super::LocalOptions::threads)) only when it has at least
//!   [`PAR_MIN_WORK`] multiply-adds per thread; smaller ones run on the calling thread;
//! - nothing is read from the environment.
//!
//! A batch of products (attention's, one per sequence and head) runs its products side by
//! side, one thread each, when there are enough of them, and a single large product is cut
//! into one block of result columns (or rows) per thread: either way one fork-join instead
//! of `gemm`'s one or two per product and block of the summed dimension.
//!
//! Determinism: `gemm` splits a product between threads along the rows and columns of the
//! result, never along the summed dimension, and its blocking of the summed dimension does
//! not depend on the number of threads, so every element is the same sum in the same order
//! whatever the thread count, and whether the product was split or not (tested below).
//!
//! Outputs are allocated without zeroing ([`uninit`]): `gemm` overwrites them without
//! reading them.
//!
//! On other devices than the CPU, [`matmul`] is candle's `matmul`.

use super::buffers::{f32_cpu, uninit, written};
use candle_core::{CpuStorage, CustomOp2, Layout, Shape, Tensor};
use rayon::prelude::*;
use std::mem::MaybeUninit;

/// The least number of multiply-adds per thread for which a product is split between
/// threads (below it, waking the other threads costs more than it saves).
pub(crate) const PAR_MIN_WORK: usize = 1 << 21;

/// `a · b` over the last two dimensions, the leading (batch) dimensions of `a` and `b`
/// being equal (no broadcasting). Differentiable: its backward pass is two more products
/// through this function.
pub(crate) fn matmul(a: &Tensor, b: &Tensor) -> candle_core::Result<Tensor> {
    if !a.device().is_cpu() || a.dtype() != candle_core::DType::F32 {
        return a.matmul(b);
    }
    let (ad, bd) = (a.dims(), b.dims());
    if ad.len() < 2 || ad.len() != bd.len() || ad[..ad.len() - 2] != bd[..bd.len() - 2] {
        return a.matmul(b);
    }
    a.apply_op2(b, MatMul)
}

/// The offset of batch element `i` (row-major over `dims`) in a tensor with these strides.
/// Every batch dimension uses its own stride: a dimension of size 1 may carry any stride in
/// candle (its layout still counts as contiguous), so one stride for the merged batch is not
/// enough.
fn batch_offset(dims: &[usize], stride: &[usize], mut i: usize) -> usize {
    let mut offset = 0;
    for (&n, &s) in dims.iter().zip(stride).rev() {
        offset += (i % n) * s;
        i /= n;
    }
    offset
}

struct MatMul;

impl CustomOp2 for MatMul {
    fn name(&self) -> &'static str {
        "rlvr-matmul"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (CpuStorage::F32(a), CpuStorage::F32(b)) = (s1, s2) else {
            candle_core::bail!("rlvr matmul: f32 only");
        };
        let (ad, bd) = (l1.dims(), l2.dims());
        let r = ad.len();
        let (m, k) = (ad[r - 2], ad[r - 1]);
        let n = bd[r - 1];
        if bd[r - 2] != k {
            candle_core::bail!("rlvr matmul: shapes {ad:?} and {bd:?} do not match");
        }
        let batch: usize = ad[..r - 2].iter().product();
        let (sa, sb) = (l1.stride(), l2.stride());
        let mut dst = uninit(batch * m * n);
        let threads = rayon::current_num_threads();
        // The product of batch element `i` into `c`, on `threads` threads.
        let product = |i: usize, c: &mut [MaybeUninit<f32>], threads: usize| {
            let a = &a[l1.start_offset() + batch_offset(&ad[..r - 2], &sa[..r - 2], i)..];
            let b = &b[l2.start_offset() + batch_offset(&bd[..r - 2], &sb[..r - 2], i)..];
            // SAFETY: the layouts describe `m × k` and `k × n` matrices inside `a` and `b`
            // (candle checked them when the tensors were made), `c` holds `m × n` values.
            unsafe {
                gemm_f32(
                    c,
                    a,
                    (sa[r - 2], sa[r - 1]),
                    b,
                    (sb[r - 2], sb[r - 1]),
                    m,
                    n,
                    k,
                    threads,
                )
            };
        };
        let work = m * n * k;
        if m * n == 0 {
            // Nothing to compute (and no chunks to split `dst` into).
        } else if threads > 1
            && batch > 1
            && batch * work >= PAR_MIN_WORK * threads
            && (batch.is_multiple_of(threads) || batch >= 4 * threads)
        {
            // Whole products side by side, one thread each (attention's per-head products):
            // one fork-join for the batch instead of one per product and depth block, and
            // the same bits, a product's sums not depending on its thread count.
            dst.par_chunks_mut(m * n)
                .with_min_len((PAR_MIN_WORK / work.max(1)).max(1))
                .enumerate()
                .for_each(|(i, c)| product(i, c, 1));
        } else {
            for (i, c) in dst.chunks_mut(m * n).enumerate() {
                product(i, c, threads);
            }
        }
        // SAFETY: every batch element's product wrote its `m × n` values.
        let dst = unsafe { written(dst) };
        let mut shape = ad[..r - 2].to_vec();
        shape.extend([m, n]);
        Ok((CpuStorage::F32(dst), Shape::from(shape)))
    }

    fn bwd(
        &self,
        a: &Tensor,
        b: &Tensor,
        _y: &Tensor,
        grad: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>)> {
        let r = a.rank();
        let ga = if a.track_op() {
            Some(matmul(grad, &b.transpose(r - 2, r - 1)?)?)
        } else {
            None
        };
        let gb = if b.track_op() {
            Some(matmul(&a.transpose(r - 2, r - 1)?, grad)?)
        } else {
            None
        };
        Ok((ga, gb))
    }
}

/// `x · wᵀ` for `x` of shape `[..., in]` (any leading dimensions) and a weight `w`
/// (`[out, in]`): `[..., out]`, as one node of the autograd graph. Composing it from
/// [`matmul`] takes a reshape of `x`, a transpose of `w` and a reshape of the product, and
/// candle's backward pass spends a zero tensor and an add on the gradient of every such
/// node. The backward pass computes `dx = g · w` when `x` is tracked and `dw = gᵀ · x`
/// (summed over all rows) only when `w` is (a frozen weight costs no product). Off the CPU
/// or for other dtypes than f32: the composed form.
pub(crate) fn linear(x: &Tensor, w: &Tensor) -> candle_core::Result<Tensor> {
    let (out, inner) = w.dims2()?;
    let dims = x.dims();
    let Some((&last, lead)) = dims.split_last() else {
        candle_core::bail!("linear on a scalar");
    };
    if last != inner {
        candle_core::bail!("linear: input {dims:?}, weight {:?}", w.dims());
    }
    if !f32_cpu(x) || !f32_cpu(w) {
        let rows: usize = lead.iter().product();
        let mut shape = lead.to_vec();
        shape.push(out);
        return x.reshape((rows, inner))?.matmul(&w.t()?)?.reshape(shape);
    }
    x.contiguous()?.apply_op2(w, Linear)
}

struct Linear;

impl CustomOp2 for Linear {
    fn name(&self) -> &'static str {
        "rlvr-linear"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (CpuStorage::F32(x), CpuStorage::F32(w)) = (s1, s2) else {
            candle_core::bail!("rlvr linear: f32 only");
        };
        let Some((start, end)) = l1.contiguous_offsets() else {
            candle_core::bail!("rlvr linear: the input must be contiguous");
        };
        let (out, inner) = l2.shape().dims2()?;
        let dims = l1.dims();
        if dims.last() != Some(&inner) {
            candle_core::bail!("rlvr linear: input {dims:?}, weight {:?}", l2.dims());
        }
        let rows = (end - start) / inner.max(1);
        let ws = l2.stride();
        let mut y = uninit(rows * out);
        // SAFETY: `x` is a contiguous `rows × inner` matrix; `w` an `out × inner` one read
        // through its layout's strides as its transpose (`inner × out`); `y` `rows × out`,
        // all written by the product.
        let y = unsafe {
            gemm_f32(
                &mut y,
                &x[start..end],
                (inner, 1),
                &w[l2.start_offset()..],
                (ws[1], ws[0]),
                rows,
                out,
                inner,
                rayon::current_num_threads(),
            );
            written(y)
        };
        let mut shape = dims[..dims.len() - 1].to_vec();
        shape.push(out);
        Ok((CpuStorage::F32(y), Shape::from(shape)))
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _y: &Tensor,
        grad: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>)> {
        linear_grads(x, w, grad, x.track_op(), w.track_op())
    }
}

/// The gradients of [`linear`] (`y = x · wᵀ`) given `grad` = ∂L/∂y: `dx = grad · w` when
/// `need_x`, `dw = gradᵀ · x` (summed over all rows) when `need_w`.
pub(crate) fn linear_grads(
    x: &Tensor,
    w: &Tensor,
    grad: &Tensor,
    need_x: bool,
    need_w: bool,
) -> candle_core::Result<(Option<Tensor>, Option<Tensor>)> {
    let (out, inner) = w.dims2()?;
    let rows = x.elem_count() / inner.max(1);
    let g = grad.reshape((rows, out))?;
    let gx = if need_x {
        Some(matmul(&g, &w.detach())?.reshape(x.dims())?)
    } else {
        None
    };
    let gw = if need_w {
        Some(matmul(&g.t()?, &x.detach().reshape((rows, inner))?)?)
    } else {
        None
    };
    Ok((gx, gw))
}

/// A LoRA-adapted linear layer on a frozen weight as one graph node:
/// `x · wᵀ + scale · (x · aᵀ) · bᵀ` for `x` `[..., in]`, `w` `[out, in]` (frozen), `a`
/// `[r, in]` and `b` `[out, r]`: `[..., out]`. Composed from [`linear`] it is five nodes
/// (three products, the scaling and the sum), each costing candle's backward pass a zero
/// tensor and an add over its gradient. The backward pass gives `x`, `a` and `b` their
/// gradients (those that are tracked). A trainable `w`, other devices or dtypes: the
/// composed form.
pub(crate) fn lora_linear(
    x: &Tensor,
    w: &Tensor,
    a: &Tensor,
    b: &Tensor,
    scale: f64,
) -> candle_core::Result<Tensor> {
    let (out, inner) = w.dims2()?;
    let (r, a_in) = a.dims2()?;
    let shapes_fit = b.dims() == [out, r] && a_in == inner && x.dims().last() == Some(&inner);
    if w.track_op() || !shapes_fit || ![x, w, a, b].into_iter().all(f32_cpu) {
        return linear(x, w)? + linear(&(linear(x, a)? * scale)?, b)?;
    }
    x.contiguous()?.apply_op3(
        a,
        b,
        LoraLinear {
            w: w.clone(),
            scale: scale as f32,
        },
    )
}

/// `x · wᵀ` for `x` (`rows × inner`, contiguous) and `w` (`out × inner` at strides `ws`).
fn x_wt(x: &[f32], rows: usize, inner: usize, w: &[f32], ws: &[usize], out: usize) -> Vec<f32> {
    let mut y = uninit(rows * out);
    // SAFETY: `x` holds a `rows × inner` matrix, `w` an `out × inner` one at strides `ws`
    // (read as its transpose), `y` `rows × out` values, all written by the product.
    unsafe {
        gemm_f32(
            &mut y,
            x,
            (inner, 1),
            w,
            (ws[1], ws[0]),
            rows,
            out,
            inner,
            rayon::current_num_threads(),
        );
        written(y)
    }
}

/// `x · y + a · b` for matrices `x` `[m, k]`, `y` `[k, n]` (the op's inputs) and the op's
/// `a` `[m, r]`, `b` `[r, n]` (any strides): the second product is accumulated into the
/// first's result by `gemm` (one rounding per element, as a separate product and add).
struct PlusProduct {
    a: Tensor,
    b: Tensor,
}

impl CustomOp2 for PlusProduct {
    fn name(&self) -> &'static str {
        "rlvr-plus-product"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let x = matrix(s1, l1, "rlvr plus product")?;
        let y = matrix(s2, l2, "rlvr plus product")?;
        let (m, k) = l1.shape().dims2()?;
        let (k2, n) = l2.shape().dims2()?;
        let (sa, la) = self.a.storage_and_layout();
        let (sb, lb) = self.b.storage_and_layout();
        let (candle_core::Storage::Cpu(sa), candle_core::Storage::Cpu(sb)) = (&*sa, &*sb) else {
            candle_core::bail!("rlvr plus product: CPU tensors only");
        };
        let a = matrix(sa, la, "rlvr plus product")?;
        let b = matrix(sb, lb, "rlvr plus product")?;
        let (m2, r) = la.shape().dims2()?;
        let (r2, n2) = lb.shape().dims2()?;
        if k2 != k || m2 != m || r2 != r || n2 != n {
            candle_core::bail!(
                "rlvr plus product: shapes {:?} {:?} {:?} {:?}",
                l1.dims(),
                l2.dims(),
                la.dims(),
                lb.dims()
            );
        }
        let threads = rayon::current_num_threads();
        let mut dst = uninit(m * n);
        let (s1, s2, s3, s4) = (l1.stride(), l2.stride(), la.stride(), lb.stride());
        // SAFETY: the layouts describe the four matrices inside their storages (candle
        // checked them when the tensors were made), `dst` holds `m × n` values, all written
        // by the first product.
        let dst = unsafe {
            gemm_f32(
                &mut dst,
                x,
                (s1[0], s1[1]),
                y,
                (s2[0], s2[1]),
                m,
                n,
                k,
                threads,
            );
            let mut dst = written(dst);
            gemm_f32_add(
                &mut dst,
                a,
                (s3[0], s3[1]),
                b,
                (s4[0], s4[1]),
                m,
                n,
                r,
                threads,
            );
            dst
        };
        Ok((CpuStorage::F32(dst), Shape::from((m, n))))
    }
}

/// The f32 data of a 2-D CPU storage from its start offset, and its strides.
fn matrix<'a>(s: &'a CpuStorage, l: &'a Layout, what: &str) -> candle_core::Result<&'a [f32]> {
    let CpuStorage::F32(v) = s else {
        candle_core::bail!("{what}: f32 only");
    };
    if l.dims().len() != 2 {
        candle_core::bail!("{what}: a matrix was expected, got {:?}", l.dims());
    }
    Ok(&v[l.start_offset()..])
}

struct LoraLinear {
    w: Tensor,
    scale: f32,
}

impl candle_core::CustomOp3 for LoraLinear {
    fn name(&self) -> &'static str {
        "rlvr-lora-linear"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let CpuStorage::F32(x) = s1 else {
            candle_core::bail!("rlvr lora linear: f32 only");
        };
        let Some((start, end)) = l1.contiguous_offsets() else {
            candle_core::bail!("rlvr lora linear: the input must be contiguous");
        };
        let a = matrix(s2, l2, "rlvr lora linear")?;
        let b = matrix(s3, l3, "rlvr lora linear")?;
        let (out, inner) = self.w.dims2()?;
        let (r, _) = l2.shape().dims2()?;
        let dims = l1.dims();
        if dims.last() != Some(&inner) || l2.dims() != [r, inner] || l3.dims() != [out, r] {
            candle_core::bail!(
                "rlvr lora linear: input {dims:?}, weight {:?}, adapters {:?} and {:?}",
                self.w.dims(),
                l2.dims(),
                l3.dims()
            );
        }
        let (w_storage, w_layout) = self.w.storage_and_layout();
        let candle_core::Storage::Cpu(CpuStorage::F32(w)) = &*w_storage else {
            candle_core::bail!("rlvr lora linear: the weight must be f32 on the CPU");
        };
        let x = &x[start..end];
        let rows = x.len() / inner.max(1);
        let mut y = x_wt(
            x,
            rows,
            inner,
            &w[w_layout.start_offset()..],
            w_layout.stride(),
            out,
        );
        // As the composed form: ((x · aᵀ) · scale) · bᵀ, added to x · wᵀ.
        let mut low = x_wt(x, rows, inner, a, l2.stride(), r);
        for v in low.iter_mut() {
            *v *= self.scale;
        }
        // y += low · bᵀ, accumulated by the product itself (one rounding per element, as
        // the separate product and add gave): no `[rows, out]` temporary.
        // SAFETY: `low` holds a `rows × r` matrix, `b` an `out × r` one at its strides (read
        // as its transpose), `y` `rows × out` values.
        unsafe {
            gemm_f32_add(
                &mut y,
                &low,
                (r, 1),
                b,
                (l3.stride()[1], l3.stride()[0]),
                rows,
                out,
                r,
                rayon::current_num_threads(),
            )
        };
        let mut shape = dims[..dims.len() - 1].to_vec();
        shape.push(out);
        Ok((CpuStorage::F32(y), Shape::from(shape)))
    }

    fn bwd(
        &self,
        x: &Tensor,
        a: &Tensor,
        b: &Tensor,
        _y: &Tensor,
        grad: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let need = (x.track_op(), a.track_op(), b.track_op());
        lora_linear_grads(x, &self.w, a, b, self.scale, grad, need)
    }
}

/// The gradients of [`lora_linear`] (`y = x · wᵀ + scale · (x · aᵀ) · bᵀ`, `w` frozen) given
/// `grad` = ∂L/∂y: those of `x`, `a` and `b` that `need` asks for, in that order.
pub(crate) fn lora_linear_grads(
    x: &Tensor,
    w: &Tensor,
    a: &Tensor,
    b: &Tensor,
    scale: f32,
    grad: &Tensor,
    need: (bool, bool, bool),
) -> candle_core::Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
    let (out, inner) = w.dims2()?;
    let rows = x.elem_count() / inner.max(1);
    let (tx, ta, tb) = need;
    let (x2, a, b) = (x.detach().reshape((rows, inner))?, a.detach(), b.detach());
    let g = grad.reshape((rows, out))?;
    let scale = f64::from(scale);
    // The gradient of the scaled low-rank activations, scaled back: (g · b) · scale.
    let gl = if tx || ta {
        Some((matmul(&g, &b)? * scale)?)
    } else {
        None
    };
    let gx = match &gl {
        // g · w + gl · a, the second product accumulated into the first.
        Some(gl) if tx => Some(
            g.apply_op2_no_bwd(
                w,
                &PlusProduct {
                    a: gl.clone(),
                    b: a.clone(),
                },
            )?
            .reshape(x.dims())?,
        ),
        _ => None,
    };
    let ga = match &gl {
        Some(gl) if ta => Some(matmul(&gl.t()?, &x2)?),
        _ => None,
    };
    let gb = if tb {
        let low = (matmul(&x2, &a.t()?)? * scale)?;
        Some(matmul(&g.t()?, &low)?)
    } else {
        None
    };
    Ok((gx, ga, gb))
}

/// Sets the `gemm` kernels' one process-wide knob the backend needs; called when a backend
/// starts. A decoding step multiplies a few dozen rows by whole weight matrices, which the
/// kernels (after swapping the operands of a row-major product) read as their left-hand
/// side: split between threads they repacked it only for more than 96 rows (16 × 6), so a
/// batch of 64 rows read the matrix in place, 64 values per 128 KiB column stride of a 32k
/// vocabulary, and 2 threads decoded slower than one. The one-thread setting (8 × 6 = 48
/// rows) serves both. It only changes when the kernels copy, never a result.
pub(crate) fn tune_gemm() {
    static PACKING: std::sync::Once = std::sync::Once::new();
    PACKING.call_once(|| {
        gemm::set_lhs_packing_threshold_multi_thread(
            gemm::get_lhs_packing_threshold_single_thread(),
        )
    });
}

/// `c = a · b` (`c` row-major `m × n`, overwritten, never read; `a`, `b` with (row, column)
/// strides), split between the current pool's `threads` when large enough.
///
/// # Safety
/// `a` must hold an `m × k` matrix at those strides, `b` a `k × n` one, `c` `m × n` values.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn gemm_f32(
    c: &mut [MaybeUninit<f32>],
    a: &[f32],
    a_strides: (usize, usize),
    b: &[f32],
    b_strides: (usize, usize),
    m: usize,
    n: usize,
    k: usize,
    threads: usize,
) {
    debug_assert!(c.len() >= m * n);
    let c = c.as_mut_ptr().cast::<f32>();
    // SAFETY: as the caller promises; `gemm` writes every value of `c` without reading it
    // when told not to read the destination (including `k = 0`: zeros).
    unsafe { gemm_raw(c, false, a, a_strides, b, b_strides, m, n, k, threads) }
}

/// `c ← c + a · b`, as [`gemm_f32`] otherwise (one rounding per element: the same bits as
/// a separate product and an add).
///
/// # Safety
/// As [`gemm_f32`].
#[allow(clippy::too_many_arguments)]
unsafe fn gemm_f32_add(
    c: &mut [f32],
    a: &[f32],
    a_strides: (usize, usize),
    b: &[f32],
    b_strides: (usize, usize),
    m: usize,
    n: usize,
    k: usize,
    threads: usize,
) {
    debug_assert!(c.len() >= m * n);
    // SAFETY: as the caller promises.
    unsafe {
        gemm_raw(
            c.as_mut_ptr(),
            true,
            a,
            a_strides,
            b,
            b_strides,
            m,
            n,
            k,
            threads,
        )
    }
}

/// The one call into `gemm` of [`gemm_f32`] and [`gemm_f32_add`].
///
/// A product large enough for the pool's threads is cut into one block of result columns
/// (or rows) per thread, each computed on one thread, in one fork-join: `gemm`'s own split
/// joins the threads twice per block of the summed dimension (its operand packing, then
/// the products), and on a virtual machine each of those wake-ups is a system call and an
/// interrupt to the other CPU. Blocks are large enough (more than 64 on the split side, at
/// least 4 on the other) for `gemm` to take the whole product's path and block the summed
/// dimension as for it (its depth blocking depends only on the depth, except for products
/// of at most 64 × 64, and products of at most 256 values or of one row or column have
/// kernels of their own): every element is the same sum in the same order either way
/// (tested).
///
/// # Safety
/// `c` must point to `m × n` writable values (initialised when `accumulate`), `a` and `b`
/// as [`gemm_f32`] says.
#[allow(clippy::too_many_arguments)]
unsafe fn gemm_raw(
    c: *mut f32,
    accumulate: bool,
    a: &[f32],
    (a_rs, a_cs): (usize, usize),
    b: &[f32],
    (b_rs, b_cs): (usize, usize),
    m: usize,
    n: usize,
    k: usize,
    threads: usize,
) {
    /// Blocks are aligned to this many columns (or rows): the kernels' widest register
    /// block.
    const ALIGN: usize = 64;
    /// Least size of a block on the split side (`MIN_SPLIT`) and of the other side
    /// (`MIN_OTHER`): `gemm` takes other paths, with other sums, for products of at most
    /// 64 × 64, of at most 256 values, and of one row or column.
    const MIN_SPLIT: usize = ALIGN + 1;
    const MIN_OTHER: usize = 4;
    // The product of a block of `bm × bn` results at `c` (row stride: the whole product's
    // `n`, for blocks of columns too).
    let one = |c: *mut f32, a: *const f32, b: *const f32, bm: usize, bn: usize, par| {
        // SAFETY: as the caller promises, for the block `c`, `a`, `b` point to.
        unsafe {
            gemm::gemm(
                bm,
                bn,
                k,
                c,
                1,
                n as isize,
                accumulate,
                a,
                a_cs as isize,
                a_rs as isize,
                b,
                b_cs as isize,
                b_rs as isize,
                if accumulate { 1.0 } else { 0.0 },
                1.0,
                false,
                false,
                false,
                par,
            )
        }
    };
    if threads <= 1 || m * n * k < PAR_MIN_WORK * threads {
        one(c, a.as_ptr(), b.as_ptr(), m, n, gemm::Parallelism::None);
        return;
    }
    // Columns when there are enough of them, else rows, else `gemm`'s own split.
    let (by_cols, side) = if n >= MIN_SPLIT * 2 && m >= MIN_OTHER {
        (true, n)
    } else if m >= MIN_SPLIT * 2 && n >= MIN_OTHER {
        (false, m)
    } else {
        one(
            c,
            a.as_ptr(),
            b.as_ptr(),
            m,
            n,
            gemm::Parallelism::Rayon(threads),
        );
        return;
    };
    // Blocks of a multiple of 64, as even as that allows, a short last one merged into the
    // one before it.
    let blocks = threads.min(side / MIN_SPLIT);
    let block = side.div_ceil(blocks).next_multiple_of(ALIGN);
    let mut bounds: Vec<usize> = (0..side).step_by(block).chain([side]).collect();
    if bounds.len() > 2 && side - bounds[bounds.len() - 2] < MIN_SPLIT {
        bounds.remove(bounds.len() - 2);
    }
    if bounds.len() <= 2 {
        one(
            c,
            a.as_ptr(),
            b.as_ptr(),
            m,
            n,
            gemm::Parallelism::Rayon(threads),
        );
        return;
    }
    let (c, a, b) = (
        SendPtr(c),
        SendPtr(a.as_ptr().cast_mut()),
        SendPtr(b.as_ptr().cast_mut()),
    );
    bounds.par_windows(2).for_each(|w| {
        let (lo, hi) = (w[0], w[1]);
        let (c, a, b) = (c.get(), a.get(), b.get());
        // SAFETY: the blocks are disjoint parts of `c`'s `m × n` values (columns `lo..hi`
        // at row stride `n`, or rows `lo..hi`), and of the operands' matching rows or
        // columns, all within the matrices the caller vouches for.
        unsafe {
            if by_cols {
                one(
                    c.add(lo),
                    a,
                    b.add(lo * b_cs),
                    m,
                    hi - lo,
                    gemm::Parallelism::None,
                );
            } else {
                one(
                    c.add(lo * n),
                    a.add(lo * a_rs),
                    b,
                    hi - lo,
                    n,
                    gemm::Parallelism::None,
                );
            }
        }
    });
}

/// A pointer shared with the tasks of [`gemm_raw`], which write disjoint parts of it.
#[derive(Clone, Copy)]
struct SendPtr(*mut f32);

// SAFETY: the tasks that receive it read the operands and write disjoint blocks of the
// result (see `gemm_raw`).
unsafe impl Send for SendPtr {}
// SAFETY: as above.
unsafe impl Sync for SendPtr {}

impl SendPtr {
    fn get(self) -> *mut f32 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{f32_bits, max_rel, uniform, weighted_grads};
    use super::*;
    use candle_core::Var;

    /// `x · y + a · b` with the second product accumulated by `gemm` gives the bits of the
    /// two products and an add, for a transposed (strided) operand too, on 1 and 2 threads.
    #[test]
    fn plus_product_gives_the_bits_of_two_products_and_an_add() {
        let x = uniform(&[70, 90], 1, 1.0);
        let y = uniform(&[40, 90], 2, 1.0).t().unwrap(); // [90, 40], strides (1, 90)
        let a = uniform(&[70, 3], 3, 1.0);
        let b = uniform(&[3, 40], 4, 1.0);
        for threads in [1, 2] {
            let (got, want) = in_pool(threads, || {
                let op = PlusProduct {
                    a: a.clone(),
                    b: b.clone(),
                };
                let got = x.apply_op2_no_bwd(&y, &op).unwrap();
                let want = (matmul(&x, &y).unwrap() + matmul(&a, &b).unwrap()).unwrap();
                (got, want)
            });
            assert_eq!(got.dims(), [70, 40]);
            assert!(f32_bits(&got) == f32_bits(&want), "{threads} threads");
        }
    }

    fn in_pool<R: Send>(threads: usize, f: impl FnOnce() -> R + Send) -> R {
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap()
            .install(f)
    }

    /// Batch dimensions walked with their own strides: a size-1 dimension may carry any
    /// stride (here the attention's one-KV-head case: `[b, t, 1, d]` transposed to
    /// `[b, 1, t, d]`, whose size-1 dimension has stride `d`), and broadcast (stride-0)
    /// batch dimensions.
    #[test]
    fn batch_dimensions_use_their_own_strides() {
        let (b, t, d) = (3, 5, 4);
        let q = uniform(&[b, 1, t, d], 5, 1.0);
        let k = uniform(&[b, t, 1, d], 6, 1.0).transpose(1, 2).unwrap();
        assert_eq!(k.dims(), &[b, 1, t, d]);
        let kt = k.t().unwrap();
        let want = q.matmul(&kt).unwrap();
        let got = matmul(&q, &kt).unwrap();
        assert!(max_rel(&got, &want) < 1e-6);
        // The same layout as the right operand untransposed (`att · v`): candle counts it as
        // contiguous, so no copy is made.
        let att = uniform(&[b, 1, t, t], 9, 1.0);
        let want = att.matmul(&k).unwrap();
        assert!(max_rel(&matmul(&att, &k).unwrap(), &want) < 1e-6);
        let w = uniform(&[1, d, 2], 7, 1.0).broadcast_as((b, d, 2)).unwrap();
        let x = uniform(&[b, t, d], 8, 1.0);
        let want = x.matmul(&w).unwrap();
        assert!(max_rel(&matmul(&x, &w).unwrap(), &want) < 1e-6);
    }

    #[test]
    fn matches_candle_and_is_the_same_on_any_number_of_threads() {
        // Large enough to be split between threads, strided (transposed) operands, batches.
        for (ashape, bshape, transpose_b) in [
            (vec![300, 256], vec![384, 256], true),
            (vec![2, 3, 200, 64], vec![2, 3, 64, 150], false),
            (vec![2, 3, 200, 64], vec![2, 3, 150, 64], true),
            (vec![1, 64], vec![512, 64], true),
            // Split by rows (few columns), and a width that is no multiple of the blocks.
            (vec![1000, 64], vec![100, 64], true),
            (vec![130, 300], vec![300, 700], false),
            // Short last blocks (1 and 2 rows before merging), a depth over 512, few columns.
            (vec![129, 400], vec![400, 100], false),
            (vec![130, 4100], vec![4100, 8], false),
        ] {
            let a = uniform(&ashape, 1, 1.0);
            let b0 = uniform(&bshape, 2, 1.0);
            let r = b0.rank();
            let b = if transpose_b {
                b0.transpose(r - 2, r - 1).unwrap()
            } else {
                b0
            };
            let want = a.matmul(&b).unwrap();
            let one = in_pool(1, || matmul(&a, &b).unwrap());
            let two = in_pool(2, || matmul(&a, &b).unwrap());
            let four = in_pool(4, || matmul(&a, &b).unwrap());
            assert_eq!(one.dims(), want.dims());
            assert!(max_rel(&one, &want) < 1e-5, "{ashape:?} x {bshape:?}");
            let (v1, v2, v4) = (
                one.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
                two.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
                four.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
            );
            assert!(
                v1 == v2 && v1 == v4,
                "{ashape:?} x {bshape:?}: differs by thread count"
            );
        }
    }

    #[test]
    fn gradients_match_candles_matmul() {
        let a = Var::from_tensor(&uniform(&[2, 37, 24], 3, 1.0)).unwrap();
        let b = Var::from_tensor(&uniform(&[2, 24, 19], 4, 1.0)).unwrap();
        let w = uniform(&[2, 37, 19], 5, 1.0);
        let run = |y: Tensor| {
            let g = weighted_grads(&y, &w);
            (
                g.get(a.as_tensor()).unwrap().clone(),
                g.get(b.as_tensor()).unwrap().clone(),
            )
        };
        let (ga, gb) = run(matmul(a.as_tensor(), b.as_tensor()).unwrap());
        let (wa, wb) = run(a.as_tensor().matmul(b.as_tensor()).unwrap());
        assert!(max_rel(&ga, &wa) < 1e-5);
        assert!(max_rel(&gb, &wb) < 1e-5);
    }

    /// `linear` against candle's `x · wᵀ`: values, the input's gradient and the weight's,
    /// for a weight that is a variable and for a frozen one (no weight gradient), with
    /// leading dimensions and a transposed (strided) weight.
    #[test]
    fn linear_matches_candle_and_its_gradients() {
        let x = Var::from_tensor(&uniform(&[3, 5, 24], 7, 1.0)).unwrap();
        let target = uniform(&[3, 5, 19], 8, 1.0);
        let w_var = Var::from_tensor(&uniform(&[19, 24], 9, 1.0)).unwrap();
        let frozen = uniform(&[24, 19], 10, 1.0).t().unwrap();
        for w in [w_var.as_tensor(), &frozen] {
            let run = |y: Tensor| {
                let g = weighted_grads(&y, &target);
                (
                    y.detach(),
                    g.get(x.as_tensor()).unwrap().clone(),
                    g.get(w).cloned(),
                )
            };
            let (y1, gx1, gw1) = run(linear(x.as_tensor(), w).unwrap());
            let want = x
                .as_tensor()
                .reshape((15, 24))
                .unwrap()
                .matmul(&w.t().unwrap())
                .unwrap()
                .reshape((3, 5, 19))
                .unwrap();
            let (y2, gx2, gw2) = run(want);
            assert!(max_rel(&y1, &y2) < 1e-5);
            assert!(max_rel(&gx1, &gx2) < 1e-5);
            match (gw1, gw2) {
                (Some(a), Some(b)) => assert!(max_rel(&a, &b) < 1e-5),
                (None, None) => assert!(!w.is_variable()),
                (a, b) => panic!("weight gradient {:?} vs {:?}", a.is_some(), b.is_some()),
            }
        }
    }

    /// `lora_linear` against its composed form: values and the gradients of the input and
    /// both adapters, on a frozen, strided base weight with leading dimensions.
    #[test]
    fn lora_linear_matches_the_composed_form() {
        let x = Var::from_tensor(&uniform(&[3, 5, 24], 11, 1.0)).unwrap();
        let w = uniform(&[24, 19], 12, 1.0).t().unwrap();
        let a = Var::from_tensor(&uniform(&[4, 24], 13, 1.0)).unwrap();
        let b = Var::from_tensor(&uniform(&[19, 4], 14, 1.0)).unwrap();
        let target = uniform(&[3, 5, 19], 15, 1.0);
        let run = |y: Tensor| {
            let g = weighted_grads(&y, &target);
            let get = |t: &Var| g.get(t.as_tensor()).unwrap().clone();
            (y.detach(), get(&x), get(&a), get(&b), g.get(&w).is_none())
        };
        let (xt, at, bt) = (x.as_tensor(), a.as_tensor(), b.as_tensor());
        let fused = run(lora_linear(xt, &w, at, bt, 2.5).unwrap());
        let composed = (linear(xt, &w).unwrap()
            + linear(&(linear(xt, at).unwrap() * 2.5).unwrap(), bt).unwrap())
        .unwrap();
        let want = run(composed);
        assert!(max_rel(&fused.0, &want.0) < 1e-5);
        assert!(max_rel(&fused.1, &want.1) < 1e-5);
        assert!(max_rel(&fused.2, &want.2) < 1e-5);
        assert!(max_rel(&fused.3, &want.3) < 1e-5);
        assert!(fused.4 && want.4);
    }
}
