//! Fused CPU kernels of the training path, each with its backward pass.
//!
//! candle's own fused kernels (softmax, RMSNorm) have no backward pass, so the training path
//! used to compose them from elementary operations: the attention softmax alone was about
//! seven passes over the `[batch, heads, t, t]` scores forward and a dozen backward, each a
//! fresh tensor, each large one split by candle over its spin-waiting thread barrier. The
//! ops here (attention softmax, RMSNorm, RoPE, SwiGLU, the target tokens' log-probabilities,
//! the attention heads' transposes) do one pass each way, split by rows over the current
//! rayon pool (every row is computed the same way whatever the number of threads, so results
//! do not depend on it). Their exponentials, row sums and maxima are [`super::vmath`]'s
//! vectorised kernels; [`add`] forms the tape's sums. Outputs are allocated without zeroing
//! and zeroed chunk by chunk by the tasks that fill them ([`uninit`](super::buffers::uninit), [`zeroed`](super::buffers::zeroed)).
//!
//! Gradients equal the composed forms' up to float reassociation (tested below, and on a
//! whole model in `tests/it/local_backend.rs`).

use candle_core::{CpuStorage, CustomOp1, CustomOp2, Layout, Shape, Tensor};
use rayon::prelude::*;
use std::mem::MaybeUninit;

use super::buffers::{assume_written, contiguous_f32, f32_cpu, uninit, written, zeroed};

/// Tasks of [`rows_per_task`] rows below which an op is not split between threads at all.
const MIN_TASKS: usize = 8;

/// Rows per rayon task: enough work per task to pay for the split.
fn rows_per_task(row_len: usize) -> usize {
    (16_384 / row_len.max(1)).max(1)
}

/// `softmax(scale · x + causal mask)` over the last dimension of attention scores
/// `[b, heads, rep · t, kt]` whose rows are `rep` blocks of `t` queries at positions
/// `offset + i` (`i` the row's index within its block), key `j` visible when
/// `j ≤ offset + i`. Masked entries are exactly 0, as `exp(-inf)` is.
pub(crate) fn causal_softmax(
    x: &Tensor,
    scale: f64,
    t: usize,
    offset: usize,
) -> candle_core::Result<Tensor> {
    if !x.device().is_cpu() || x.dtype() != candle_core::DType::F32 {
        candle_core::bail!("causal_softmax: f32 on the CPU only");
    }
    x.contiguous()?.apply_op1(CausalSoftmax {
        scale: scale as f32,
        t,
        offset,
    })
}

struct CausalSoftmax {
    scale: f32,
    t: usize,
    offset: usize,
}

impl CausalSoftmax {
    /// Number of visible keys of flat row `r`.
    fn visible(&self, r: usize, kt: usize) -> usize {
        let i = r % self.t.max(1);
        (self.offset + i + 1).min(kt)
    }
}

impl CustomOp1 for CausalSoftmax {
    fn name(&self) -> &'static str {
        "rlvr-causal-softmax"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let x = contiguous_f32(s, l, "causal softmax")?;
        let kt = l.dims().last().copied().unwrap_or(1).max(1);
        let mut y = uninit(x.len());
        let per = rows_per_task(kt) * kt;
        y.par_chunks_mut(per)
            .with_min_len(MIN_TASKS)
            .zip(x.par_chunks(per))
            .enumerate()
            .for_each(|(c, (yc, xc))| {
                let yc = zeroed(yc);
                let r0 = c * (per / kt);
                for (k, (yr, xr)) in yc.chunks_mut(kt).zip(xc.chunks(kt)).enumerate() {
                    let n = self.visible(r0 + k, kt);
                    yr[..n].copy_from_slice(&xr[..n]);
                    super::vmath::softmax_in_place(&mut yr[..n], self.scale);
                }
            });
        // SAFETY: its tasks zeroed every chunk of `y` before filling it.
        let y = unsafe { written(y) };
        Ok((CpuStorage::F32(y), l.shape().clone()))
    }

    fn bwd(&self, _x: &Tensor, y: &Tensor, grad: &Tensor) -> candle_core::Result<Option<Tensor>> {
        let g = grad.contiguous()?;
        Ok(Some(y.apply_op2_no_bwd(
            &g,
            &SoftmaxBackward { scale: self.scale },
        )?))
    }
}

/// Causal attention `softmax(scale · q kᵀ + causal mask) · v` as one graph node, for `q`
/// (`[b, g, rep · t, d]`, the query heads sharing a key/value head stacked as in
/// [`causal_softmax`]) and `k`, `v` (`[b, g, kt, d]`): `[b, g, rep · t, d]`. The forward
/// pass is the same products and [`causal_softmax`] on detached inputs; the op keeps the
/// attention weights for its backward pass (`dv = attᵀ · γ`, the softmax backward of
/// `γ · vᵀ`, then `dq = ds · k`, `dk = dsᵀ · q`). Composed, it is four nodes (the transpose
/// of `k`, two products and the softmax), the scores and the weights each costing candle's
/// backward pass a zero tensor and an add as large as themselves.
pub(crate) fn causal_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    scale: f64,
    t: usize,
    offset: usize,
) -> candle_core::Result<Tensor> {
    let (y, att) = causal_attention_parts(q, k, v, scale, t, offset)?;
    q.apply_op3(
        k,
        v,
        CausalAttention {
            y,
            att,
            scale: scale as f32,
        },
    )
}

/// [`causal_attention`] outside the autograd graph: the output and the attention weights
/// `[b, g, rep · t, kt]` its backward pass ([`causal_attention_grads`]) needs.
pub(crate) fn causal_attention_parts(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    scale: f64,
    t: usize,
    offset: usize,
) -> candle_core::Result<(Tensor, Tensor)> {
    match Entries::new(q, k, v)? {
        Some(entries) => entries.forward(scale as f32, t, offset),
        None => composed_attention_parts(q, k, v, scale, t, offset),
    }
}

/// [`causal_attention_parts`] as whole-tensor products and a softmax.
fn composed_attention_parts(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    scale: f64,
    t: usize,
    offset: usize,
) -> candle_core::Result<(Tensor, Tensor)> {
    let att = causal_softmax(
        &super::matmul::matmul(&q.detach(), &k.detach().t()?)?,
        scale,
        t,
        offset,
    )?;
    let y = super::matmul::matmul(&att, &v.detach())?;
    Ok((y, att))
}

/// The gradients `(dq, dk, dv)` of [`causal_attention`] given the attention weights `att`
/// and `grad` = ∂L/∂y.
pub(crate) fn causal_attention_grads(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    att: &Tensor,
    grad: &Tensor,
    scale: f32,
) -> candle_core::Result<(Tensor, Tensor, Tensor)> {
    match Entries::new(q, k, v)? {
        Some(entries) => entries.backward(att, grad, scale),
        None => composed_attention_grads(q, k, v, att, grad, scale),
    }
}

/// [`causal_attention_grads`] as whole-tensor products and a softmax gradient.
fn composed_attention_grads(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    att: &Tensor,
    grad: &Tensor,
    scale: f32,
) -> candle_core::Result<(Tensor, Tensor, Tensor)> {
    use super::matmul::matmul;
    let (q, k, v) = (q.detach(), k.detach(), v.detach());
    let g = grad.contiguous()?;
    let datt = matmul(&g, &v.t()?)?;
    let ds = att.apply_op2_no_bwd(&datt, &SoftmaxBackward { scale })?;
    let dq = matmul(&ds, &k)?;
    let dk = matmul(&ds.t()?, &q)?;
    let dv = matmul(&att.t()?, &g)?;
    Ok((dq, dk, dv))
}

/// Attention computed one `(sequence, KV head)` entry at a time, the entries side by side on
/// the current rayon pool, one thread each: each entry's products, softmax and (backward)
/// softmax gradient in one task, its `[rep · t, kt]` temporaries in cache, instead of one
/// fork-join per product and per pass over `[b, g, rep · t, kt]` tensors. The products are
/// the `gemm` calls of the composed path (same operands, same strides) and the softmaxes the
/// same row kernels, and `gemm`'s sums do not depend on its thread count, so the results
/// are the composed path's bits (tested). Used for f32 CPU tensors when there are at least
/// as many entries as threads.
struct Entries {
    /// `[b, g, m, d]` queries (`m = rep · t`), `[b, g, kt, d]` keys and values, contiguous.
    q: Tensor,
    k: Tensor,
    v: Tensor,
    entries: usize,
    m: usize,
    kt: usize,
    d: usize,
}

/// The f32 values of a contiguous CPU tensor's storage (`storage_and_layout`'s parts).
fn cpu_values<'a>(
    storage: &'a candle_core::Storage,
    layout: &Layout,
) -> candle_core::Result<&'a [f32]> {
    let candle_core::Storage::Cpu(s) = storage else {
        candle_core::bail!("attention: CPU tensors only");
    };
    contiguous_f32(s, layout, "attention")
}

impl Entries {
    fn new(q: &Tensor, k: &Tensor, v: &Tensor) -> candle_core::Result<Option<Self>> {
        if ![q, k, v].into_iter().all(f32_cpu) || q.rank() != 4 || k.rank() != 4 {
            return Ok(None);
        }
        let (b, g, m, d) = q.dims4()?;
        let (kb, kg, kt, kd) = k.dims4()?;
        if (kb, kg, kd) != (b, g, d) || v.dims() != k.dims() {
            return Ok(None);
        }
        let entries = b * g;
        let threads = rayon::current_num_threads();
        if entries == 0 || m == 0 || kt == 0 || d == 0 || entries < threads {
            return Ok(None);
        }
        Ok(Some(Entries {
            q: q.detach().contiguous()?,
            k: k.detach().contiguous()?,
            v: v.detach().contiguous()?,
            entries,
            m,
            kt,
            d,
        }))
    }

    /// Runs `f` on the values of the queries, keys and values.
    fn with_qkv<R>(
        &self,
        f: impl FnOnce(&[f32], &[f32], &[f32]) -> candle_core::Result<R>,
    ) -> candle_core::Result<R> {
        let (qs, ql) = self.q.storage_and_layout();
        let (ks, kl) = self.k.storage_and_layout();
        let (vs, vl) = self.v.storage_and_layout();
        f(
            cpu_values(&qs, ql)?,
            cpu_values(&ks, kl)?,
            cpu_values(&vs, vl)?,
        )
    }

    /// `[b, g, rows, cols]` from the values of all entries.
    fn tensor(&self, values: Vec<f32>, rows: usize, cols: usize) -> candle_core::Result<Tensor> {
        let (b, g) = (self.q.dim(0)?, self.q.dim(1)?);
        Tensor::from_vec(values, (b, g, rows, cols), self.q.device())
    }

    /// `(y, att)`: the output `[b, g, m, d]` and the attention weights `[b, g, m, kt]`.
    fn forward(
        &self,
        scale: f32,
        t: usize,
        offset: usize,
    ) -> candle_core::Result<(Tensor, Tensor)> {
        let (m, kt, d) = (self.m, self.kt, self.d);
        let rows = CausalSoftmax { scale, t, offset };
        let mut att = uninit(self.entries * m * kt);
        let mut y = uninit(self.entries * m * d);
        self.with_qkv(|q, k, v| {
            att.par_chunks_mut(m * kt)
                .zip(y.par_chunks_mut(m * d))
                .enumerate()
                .for_each(|(e, (ac, yc))| {
                    let (qe, ke, ve) = (&q[e * m * d..], &k[e * kt * d..], &v[e * kt * d..]);
                    // SAFETY: `qe` holds `m × d` values, `ke` `kt × d` (read as its
                    // transpose, `d × kt`), `ac` `m × kt`, every one written by the product.
                    let ac = unsafe {
                        super::matmul::gemm_f32(ac, qe, (d, 1), ke, (1, d), m, kt, d, 1);
                        assume_written(ac)
                    };
                    for (r, row) in ac.chunks_mut(kt).enumerate() {
                        let n = rows.visible(r, kt);
                        let (live, masked) = row.split_at_mut(n);
                        super::vmath::softmax_in_place(live, scale);
                        masked.fill(0.0);
                    }
                    // SAFETY: `ac` holds `m × kt` values, `ve` `kt × d`, `yc` `m × d`.
                    unsafe { super::matmul::gemm_f32(yc, ac, (kt, 1), ve, (d, 1), m, d, kt, 1) };
                });
            Ok(())
        })?;
        // SAFETY: every entry's task wrote its chunks of `att` and `y` whole.
        let (att, y) = unsafe { (written(att), written(y)) };
        Ok((self.tensor(y, m, d)?, self.tensor(att, m, kt)?))
    }

    /// `(dq, dk, dv)` given the attention weights `att` and `grad` = ∂L/∂y.
    fn backward(
        &self,
        att: &Tensor,
        grad: &Tensor,
        scale: f32,
    ) -> candle_core::Result<(Tensor, Tensor, Tensor)> {
        let (m, kt, d) = (self.m, self.kt, self.d);
        if att.elem_count() != self.entries * m * kt || grad.elem_count() != self.entries * m * d {
            candle_core::bail!(
                "attention backward: weights {:?}, gradient {:?}",
                att.dims(),
                grad.dims()
            );
        }
        let (att, grad) = (att.contiguous()?, grad.contiguous()?);
        let (as_, al) = att.storage_and_layout();
        let (gs, gl) = grad.storage_and_layout();
        let (att, g) = (cpu_values(&as_, al)?, cpu_values(&gs, gl)?);
        let mut dq = uninit(self.entries * m * d);
        let mut dk = uninit(self.entries * kt * d);
        let mut dv = uninit(self.entries * kt * d);
        self.with_qkv(|q, k, v| {
            dq.par_chunks_mut(m * d)
                .zip(dk.par_chunks_mut(kt * d).zip(dv.par_chunks_mut(kt * d)))
                .enumerate()
                .for_each(|(e, (dqc, (dkc, dvc)))| {
                    let (qe, ke, ve) = (&q[e * m * d..], &k[e * kt * d..], &v[e * kt * d..]);
                    let (ae, ge) = (&att[e * m * kt..(e + 1) * m * kt], &g[e * m * d..]);
                    // datt = g · vᵀ, then the softmax's gradient in place:
                    // ds = scale · att ⊙ (datt − Σ att ⊙ datt).
                    let mut ds = uninit(m * kt);
                    // SAFETY: `ge` holds `m × d` values, `ve` `kt × d` (read as `d × kt`),
                    // `ds` `m × kt`, every one written by the product.
                    let mut ds = unsafe {
                        super::matmul::gemm_f32(&mut ds, ge, (d, 1), ve, (1, d), m, kt, d, 1);
                        written(ds)
                    };
                    for (dr, yr) in ds.chunks_mut(kt).zip(ae.chunks(kt)) {
                        let dot = super::vmath::dot(yr, dr);
                        for (dv, &yv) in dr.iter_mut().zip(yr) {
                            *dv = scale * yv * (*dv - dot);
                        }
                    }
                    // SAFETY: `ds` holds `m × kt` values (read as `kt × m` for dk), `ke` and
                    // `ve`'s entries `kt × d`, `qe` and `ge` `m × d`, `ae` `m × kt` (read as
                    // `kt × m`); `dqc` holds `m × d` values, `dkc` and `dvc` `kt × d`.
                    unsafe {
                        super::matmul::gemm_f32(dqc, &ds, (kt, 1), ke, (d, 1), m, d, kt, 1);
                        super::matmul::gemm_f32(dkc, &ds, (1, kt), qe, (d, 1), kt, d, m, 1);
                        super::matmul::gemm_f32(dvc, ae, (1, kt), ge, (d, 1), kt, d, m, 1);
                    }
                    super::pool::give(ds);
                });
            Ok(())
        })?;
        // SAFETY: every entry's task wrote its chunks of `dq`, `dk` and `dv` whole.
        let (dq, dk, dv) = unsafe { (written(dq), written(dk), written(dv)) };
        Ok((
            self.tensor(dq, m, d)?,
            self.tensor(dk, kt, d)?,
            self.tensor(dv, kt, d)?,
        ))
    }
}

struct CausalAttention {
    /// The output, computed before the op is applied (its forward pass hands it over).
    y: Tensor,
    /// The attention weights `[b, g, rep · t, kt]`.
    att: Tensor,
    scale: f32,
}

impl candle_core::CustomOp3 for CausalAttention {
    fn name(&self) -> &'static str {
        "rlvr-causal-attention"
    }

    fn cpu_fwd(
        &self,
        _s1: &CpuStorage,
        _l1: &Layout,
        _s2: &CpuStorage,
        _l2: &Layout,
        _s3: &CpuStorage,
        _l3: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (storage, layout) = self.y.storage_and_layout();
        let candle_core::Storage::Cpu(s) = &*storage else {
            candle_core::bail!("causal attention: CPU only");
        };
        let y = contiguous_f32(s, layout, "causal attention")?;
        Ok((CpuStorage::F32(y.to_vec()), layout.shape().clone()))
    }

    fn bwd(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        _y: &Tensor,
        grad: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let (dq, dk, dv) = causal_attention_grads(q, k, v, &self.att, grad, self.scale)?;
        Ok((Some(dq), Some(dk), Some(dv)))
    }
}

/// `dx = scale · y ⊙ (g − Σ g ⊙ y)` over the last dimension.
struct SoftmaxBackward {
    scale: f32,
}

impl CustomOp2 for SoftmaxBackward {
    fn name(&self) -> &'static str {
        "rlvr-softmax-backward"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let y = contiguous_f32(s1, l1, "softmax backward")?;
        let g = contiguous_f32(s2, l2, "softmax backward")?;
        if y.len() != g.len() {
            candle_core::bail!("softmax backward: shapes differ");
        }
        let kt = l1.dims().last().copied().unwrap_or(1).max(1);
        let mut dx = uninit(y.len());
        let per = rows_per_task(kt) * kt;
        dx.par_chunks_mut(per)
            .with_min_len(MIN_TASKS)
            .zip(y.par_chunks(per).zip(g.par_chunks(per)))
            .for_each(|(dc, (yc, gc))| {
                let dc = zeroed(dc);
                for ((dr, yr), gr) in dc.chunks_mut(kt).zip(yc.chunks(kt)).zip(gc.chunks(kt)) {
                    let dot = super::vmath::dot(yr, gr);
                    for ((d, &yv), &gv) in dr.iter_mut().zip(yr).zip(gr) {
                        *d = self.scale * yv * (gv - dot);
                    }
                }
            });
        // SAFETY: its tasks zeroed every chunk of `dx` before filling it.
        let dx = unsafe { written(dx) };
        Ok((CpuStorage::F32(dx), l1.shape().clone()))
    }
}

/// RMSNorm over the last dimension: `x / sqrt(mean(x²) + eps) · w` (`w`: [h]).
pub(crate) fn rms_norm(x: &Tensor, w: &Tensor, eps: f64) -> candle_core::Result<Tensor> {
    if !x.device().is_cpu() || x.dtype() != candle_core::DType::F32 {
        candle_core::bail!("rms_norm: f32 on the CPU only");
    }
    x.contiguous()?
        .apply_op2(&w.contiguous()?, RmsNorm { eps: eps as f32 })
}

struct RmsNorm {
    eps: f32,
}

impl RmsNorm {
    fn inv_rms(&self, row: &[f32]) -> f32 {
        let ss = super::vmath::dot(row, row);
        1.0 / (ss / row.len() as f32 + self.eps).sqrt()
    }
}

impl CustomOp2 for RmsNorm {
    fn name(&self) -> &'static str {
        "rlvr-rms-norm"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let x = contiguous_f32(s1, l1, "rms_norm")?;
        let w = contiguous_f32(s2, l2, "rms_norm")?;
        let h = w.len();
        if h == 0 || l1.dims().last() != Some(&h) {
            candle_core::bail!("rms_norm: input {:?}, weight {:?}", l1.dims(), l2.dims());
        }
        let mut y = uninit(x.len());
        let per = rows_per_task(h) * h;
        y.par_chunks_mut(per)
            .with_min_len(MIN_TASKS)
            .zip(x.par_chunks(per))
            .for_each(|(yc, xc)| {
                let yc = zeroed(yc);
                for (yr, xr) in yc.chunks_mut(h).zip(xc.chunks(h)) {
                    let r = self.inv_rms(xr);
                    for ((o, &v), &wv) in yr.iter_mut().zip(xr).zip(w) {
                        *o = v * r * wv;
                    }
                }
            });
        // SAFETY: its tasks zeroed every chunk of `y` before filling it.
        let y = unsafe { written(y) };
        Ok((CpuStorage::F32(y), l1.shape().clone()))
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _y: &Tensor,
        grad: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>)> {
        rms_norm_grads(x, w, grad, self.eps, x.track_op(), w.track_op())
    }
}

/// The gradients of [`rms_norm`] given `grad` = ∂L/∂y: `dx` when `need_x`, `dw` when
/// `need_w` (`eps` as [`rms_norm`] rounds it).
pub(crate) fn rms_norm_grads(
    x: &Tensor,
    w: &Tensor,
    grad: &Tensor,
    eps: f32,
    need_x: bool,
    need_w: bool,
) -> candle_core::Result<(Option<Tensor>, Option<Tensor>)> {
    let g = grad.contiguous()?;
    let gx = if need_x {
        Some(x.apply_op3_no_bwd(w, &g, &RmsNormInputGrad { eps })?)
    } else {
        None
    };
    let gw = if need_w {
        Some(x.apply_op2_no_bwd(&g, &RmsNormWeightGrad { eps })?)
    } else {
        None
    };
    Ok((gx, gw))
}

/// `dx = r · (g ⊙ w − x̂ · mean(g ⊙ w ⊙ x̂))`, `x̂ = r · x`, `r = 1 / rms(x)`.
struct RmsNormInputGrad {
    eps: f32,
}

impl candle_core::CustomOp3 for RmsNormInputGrad {
    fn name(&self) -> &'static str {
        "rlvr-rms-norm-input-grad"
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
        let x = contiguous_f32(s1, l1, "rms_norm backward")?;
        let w = contiguous_f32(s2, l2, "rms_norm backward")?;
        let g = contiguous_f32(s3, l3, "rms_norm backward")?;
        let h = w.len();
        if h == 0 || g.len() != x.len() {
            candle_core::bail!("rms_norm backward: shapes differ");
        }
        let norm = RmsNorm { eps: self.eps };
        let mut dx = uninit(x.len());
        let per = rows_per_task(h) * h;
        dx.par_chunks_mut(per)
            .with_min_len(MIN_TASKS)
            .zip(x.par_chunks(per).zip(g.par_chunks(per)))
            .for_each(|(dc, (xc, gc))| {
                let dc = zeroed(dc);
                for ((dr, xr), gr) in dc.chunks_mut(h).zip(xc.chunks(h)).zip(gc.chunks(h)) {
                    let r = norm.inv_rms(xr);
                    let dot: f32 = xr
                        .iter()
                        .zip(gr)
                        .zip(w)
                        .map(|((&xv, &gv), &wv)| gv * wv * xv * r)
                        .sum();
                    let mean = dot / h as f32;
                    for (((d, &xv), &gv), &wv) in dr.iter_mut().zip(xr).zip(gr).zip(w) {
                        *d = r * (gv * wv - xv * r * mean);
                    }
                }
            });
        // SAFETY: its tasks zeroed every chunk of `dx` before filling it.
        let dx = unsafe { written(dx) };
        Ok((CpuStorage::F32(dx), l1.shape().clone()))
    }
}

/// `dw = Σ_rows g ⊙ x̂`, summed row after row (the same order on any number of threads).
struct RmsNormWeightGrad {
    eps: f32,
}

impl CustomOp2 for RmsNormWeightGrad {
    fn name(&self) -> &'static str {
        "rlvr-rms-norm-weight-grad"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let x = contiguous_f32(s1, l1, "rms_norm backward")?;
        let g = contiguous_f32(s2, l2, "rms_norm backward")?;
        let h = l1.dims().last().copied().unwrap_or(1).max(1);
        let norm = RmsNorm { eps: self.eps };
        let mut dw = vec![0f32; h];
        for (xr, gr) in x.chunks(h).zip(g.chunks(h)) {
            let r = norm.inv_rms(xr);
            for ((d, &xv), &gv) in dw.iter_mut().zip(xr).zip(gr) {
                *d += gv * xv * r;
            }
        }
        Ok((CpuStorage::F32(dw), Shape::from(h)))
    }
}

/// Rotary embedding of `x` (`[b, heads, t, d]`) at positions with the tables `cos`, `sin`
/// (`[t, d / 2]`, one row per position): the halves `x₁`, `x₂` of each head vector become
/// `x₁·cos − x₂·sin` and `x₂·cos + x₁·sin`.
pub(crate) fn rope(x: &Tensor, cos: &Tensor, sin: &Tensor) -> candle_core::Result<Tensor> {
    if !x.device().is_cpu() || x.dtype() != candle_core::DType::F32 {
        candle_core::bail!("rope: f32 on the CPU only");
    }
    let (_b, _h, t, d) = x.dims4()?;
    if d % 2 != 0 || cos.dims() != [t, d / 2] || sin.dims() != [t, d / 2] {
        candle_core::bail!("rope: tables {:?} for input {:?}", cos.dims(), x.dims());
    }
    x.contiguous()?.apply_op1(rope_op(cos, sin, t, 1.0)?)
}

/// The gradient of [`rope`] given `grad` = ∂L/∂y (`[b, heads, t, d]`): the inverse rotation.
pub(crate) fn rope_grad(grad: &Tensor, cos: &Tensor, sin: &Tensor) -> candle_core::Result<Tensor> {
    let (_b, _h, t, _d) = grad.dims4()?;
    grad.contiguous()?
        .apply_op1_no_bwd(&rope_op(cos, sin, t, -1.0)?)
}

fn rope_op(cos: &Tensor, sin: &Tensor, t: usize, sign: f32) -> candle_core::Result<Rope> {
    Ok(Rope {
        cos: std::sync::Arc::new(cos.flatten_all()?.to_vec1::<f32>()?),
        sin: std::sync::Arc::new(sin.flatten_all()?.to_vec1::<f32>()?),
        t,
        sign,
    })
}

struct Rope {
    cos: std::sync::Arc<Vec<f32>>,
    sin: std::sync::Arc<Vec<f32>>,
    t: usize,
    /// `1`: the rotation; `-1`: its inverse (the backward pass).
    sign: f32,
}

impl CustomOp1 for Rope {
    fn name(&self) -> &'static str {
        "rlvr-rope"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let x = contiguous_f32(s, l, "rope")?;
        let d = l.dims().last().copied().unwrap_or(2).max(2);
        let half = d / 2;
        let mut y = uninit(x.len());
        let per = rows_per_task(d) * d;
        y.par_chunks_mut(per)
            .with_min_len(MIN_TASKS)
            .zip(x.par_chunks(per))
            .enumerate()
            .for_each(|(c, (yc, xc))| {
                let yc = zeroed(yc);
                let r0 = c * (per / d);
                for (k, (yr, xr)) in yc.chunks_mut(d).zip(xc.chunks(d)).enumerate() {
                    let p = (r0 + k) % self.t.max(1);
                    let cos = &self.cos[p * half..(p + 1) * half];
                    let sin = &self.sin[p * half..(p + 1) * half];
                    let (x1, x2) = xr.split_at(half);
                    let (y1, y2) = yr.split_at_mut(half);
                    for j in 0..half {
                        let (c, s) = (cos[j], self.sign * sin[j]);
                        y1[j] = x1[j] * c - x2[j] * s;
                        y2[j] = x2[j] * c + x1[j] * s;
                    }
                }
            });
        // SAFETY: its tasks zeroed every chunk of `y` before filling it.
        let y = unsafe { written(y) };
        Ok((CpuStorage::F32(y), l.shape().clone()))
    }

    fn bwd(&self, _x: &Tensor, _y: &Tensor, grad: &Tensor) -> candle_core::Result<Option<Tensor>> {
        let inverse = Rope {
            cos: self.cos.clone(),
            sin: self.sin.clone(),
            t: self.t,
            sign: -self.sign,
        };
        Ok(Some(grad.contiguous()?.apply_op1_no_bwd(&inverse)?))
    }
}

/// Elements per rayon task of the element-wise ops.
const ELEMS_PER_TASK: usize = 16_384;

/// An element-wise op of two same-length contiguous f32 inputs: `f` gets each chunk of the
/// unzeroed output with the matching chunks of the inputs, chunks split over the current
/// rayon pool, and must write every value of its output chunk.
fn map2(
    s1: &CpuStorage,
    l1: &Layout,
    s2: &CpuStorage,
    l2: &Layout,
    what: &str,
    f: impl Fn(&mut [MaybeUninit<f32>], &[f32], &[f32]) + Sync,
) -> candle_core::Result<Vec<f32>> {
    let a = contiguous_f32(s1, l1, what)?;
    let b = contiguous_f32(s2, l2, what)?;
    if a.len() != b.len() {
        candle_core::bail!("{what}: shapes {:?} and {:?} differ", l1.dims(), l2.dims());
    }
    let mut y = uninit(a.len());
    y.par_chunks_mut(ELEMS_PER_TASK)
        .with_min_len(MIN_TASKS)
        .zip(
            a.par_chunks(ELEMS_PER_TASK)
                .zip(b.par_chunks(ELEMS_PER_TASK)),
        )
        .for_each(|(yc, (ac, bc))| f(yc, ac, bc));
    // SAFETY: the chunks cover `y`, and `f` writes every value of each.
    Ok(unsafe { written(y) })
}

/// `a ⊙ a` outside the autograd graph: candle's `sqr`, the same values, in a buffer of the
/// backend's [pool](super::pool) (the gradient norms square every gradient each step).
pub(crate) fn sqr(a: &Tensor) -> candle_core::Result<Tensor> {
    if !f32_cpu(a) {
        return a.sqr();
    }
    let a = a.contiguous()?;
    let square = Map2::new("rlvr-square", |yc, ac, _| {
        for (o, &x) in yc.iter_mut().zip(ac) {
            o.write(x * x);
        }
    });
    a.apply_op2_no_bwd(&a, &square)
}

/// `a + b` for tensors of the same shape, outside the autograd graph (the tape's residual
/// connections and gradient sums), split over the current rayon pool. candle's own add
/// splits large tensors over its separate spin-waiting pool, whose threads then spin on the
/// cores this pool's threads need. Off the CPU, for other dtypes or shapes: candle's add.
pub(crate) fn add(a: &Tensor, b: &Tensor) -> candle_core::Result<Tensor> {
    if !f32_cpu(a) || !f32_cpu(b) || a.dims() != b.dims() {
        return (a.detach() + b.detach())?.contiguous();
    }
    let add = Map2::new("rlvr-add", |yc, ac, bc| {
        for ((o, &x), &z) in yc.iter_mut().zip(ac).zip(bc) {
            o.write(x + z);
        }
    });
    a.contiguous()?.apply_op2_no_bwd(&b.contiguous()?, &add)
}

/// An element-wise op of two tensors without a backward pass: [`map2`] with `f` on each
/// chunk, the output shaped as the first input.
struct Map2<F> {
    name: &'static str,
    f: F,
}

impl<F: Fn(&mut [MaybeUninit<f32>], &[f32], &[f32]) + Send + Sync> Map2<F> {
    fn new(name: &'static str, f: F) -> Self {
        Map2 { name, f }
    }
}

impl<F: Fn(&mut [MaybeUninit<f32>], &[f32], &[f32]) + Send + Sync> CustomOp2 for Map2<F> {
    fn name(&self) -> &'static str {
        self.name
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let y = map2(s1, l1, s2, l2, self.name, &self.f)?;
        Ok((CpuStorage::F32(y), l1.shape().clone()))
    }
}

/// SwiGLU, `silu(g) ⊙ u` with `silu(x) = x · σ(x)`, one pass forward and one backward (both
/// input gradients together). Falls back to candle's composed `g.silu() * u` (which has a
/// backward pass too) off the CPU, for other dtypes than f32, or for inputs of different
/// shapes.
pub(crate) fn swiglu(g: &Tensor, u: &Tensor) -> candle_core::Result<Tensor> {
    if !f32_cpu(g) || !f32_cpu(u) || g.dims() != u.dims() {
        return g.silu()? * u;
    }
    g.contiguous()?.apply_op2(&u.contiguous()?, SwiGlu)
}

struct SwiGlu;

impl CustomOp2 for SwiGlu {
    fn name(&self) -> &'static str {
        "rlvr-swiglu"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        // Every value written: the kernel fills the chunk it is given, zeroed first.
        let y = map2(s1, l1, s2, l2, "swiglu", |yc, gc, uc| {
            super::vmath::swiglu(zeroed(yc), gc, uc)
        })?;
        Ok((CpuStorage::F32(y), l1.shape().clone()))
    }

    fn bwd(
        &self,
        g: &Tensor,
        u: &Tensor,
        _y: &Tensor,
        grad: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>)> {
        let (tg, tu) = (g.track_op(), u.track_op());
        if !tg && !tu {
            return Ok((None, None));
        }
        let (dg, du) = swiglu_grads(g, u, grad)?;
        Ok((tg.then_some(dg), tu.then_some(du)))
    }
}

/// The gradients of [`swiglu`] (`silu(g) ⊙ u`) given `grad` = ∂L/∂y: `(dg, du)`, computed in
/// one pass.
pub(crate) fn swiglu_grads(
    g: &Tensor,
    u: &Tensor,
    grad: &Tensor,
) -> candle_core::Result<(Tensor, Tensor)> {
    // Both gradients in one pass, stacked: [2, ...] (contiguous halves).
    let both = g.apply_op3_no_bwd(u, &grad.contiguous()?, &SwiGluBackward)?;
    Ok((both.get(0)?, both.get(1)?))
}

/// `dg = γ ⊙ u ⊙ σ(g)(1 + g(1 − σ(g)))` and `du = γ ⊙ silu(g)`, stacked as `[2, ...]`.
struct SwiGluBackward;

impl candle_core::CustomOp3 for SwiGluBackward {
    fn name(&self) -> &'static str {
        "rlvr-swiglu-backward"
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
        let g = contiguous_f32(s1, l1, "swiglu backward")?;
        let u = contiguous_f32(s2, l2, "swiglu backward")?;
        let gr = contiguous_f32(s3, l3, "swiglu backward")?;
        let n = g.len();
        if u.len() != n || gr.len() != n {
            candle_core::bail!("swiglu backward: shapes differ");
        }
        let mut out = uninit(2 * n);
        let (dg, du) = out.split_at_mut(n);
        dg.par_chunks_mut(ELEMS_PER_TASK)
            .zip(du.par_chunks_mut(ELEMS_PER_TASK))
            .zip(
                g.par_chunks(ELEMS_PER_TASK)
                    .zip(u.par_chunks(ELEMS_PER_TASK))
                    .zip(gr.par_chunks(ELEMS_PER_TASK)),
            )
            .with_min_len(MIN_TASKS)
            .for_each(|((dgc, duc), ((gc, uc), grc))| {
                super::vmath::swiglu_grads(zeroed(dgc), zeroed(duc), gc, uc, grc)
            });
        let mut shape = vec![2];
        shape.extend_from_slice(l1.dims());
        // SAFETY: its tasks zeroed every chunk of `out` before filling it.
        let out = unsafe { written(out) };
        Ok((CpuStorage::F32(out), Shape::from(shape)))
    }
}

/// Log-probabilities of the target tokens, `x[r, tᵣ] − log Σⱼ exp x[r, j]` for each row `r`
/// of `logits` (`[T, V]`, f32 on the CPU; `targets`: `T` ids, each below `V`), as a `[T]`
/// tensor. Each row is read twice (its maximum, then its sum of exponentials) and no
/// `[T, V]` log-softmax is made; the backward pass writes `γᵣ · (onehot(tᵣ) − softmax(x[r]))`
/// row by row, the only `[T, V]` tensor of the op.
pub(crate) fn token_logprobs(logits: &Tensor, targets: Vec<u32>) -> candle_core::Result<Tensor> {
    let op = token_logprobs_op(logits, targets)?;
    logits.contiguous()?.apply_op1(op)
}

/// The op of [`token_logprobs`], its inputs checked.
fn token_logprobs_op(logits: &Tensor, targets: Vec<u32>) -> candle_core::Result<TokenLogprobs> {
    if !logits.device().is_cpu() || logits.dtype() != candle_core::DType::F32 {
        candle_core::bail!("token_logprobs: f32 on the CPU only");
    }
    let (t, v) = logits.dims2()?;
    if v == 0 || targets.len() != t {
        candle_core::bail!(
            "token_logprobs: {} targets for logits of shape {:?}",
            targets.len(),
            logits.dims()
        );
    }
    if let Some(bad) = targets.iter().find(|&&id| id as usize >= v) {
        candle_core::bail!("token_logprobs: target {bad} outside the vocabulary of {v}");
    }
    Ok(TokenLogprobs {
        targets: std::sync::Arc::new(targets),
        stats: std::sync::OnceLock::new(),
    })
}

/// [`token_logprobs`] outside the autograd graph: the log-probabilities and what their
/// backward pass needs ([`SavedTokenLogprobs::grad`]).
pub(crate) fn token_logprobs_saved(
    logits: &Tensor,
    targets: Vec<u32>,
) -> candle_core::Result<(Tensor, SavedTokenLogprobs)> {
    let op = token_logprobs_op(logits, targets)?;
    let lp = logits.contiguous()?.apply_op1_no_bwd(&op)?;
    Ok((lp, SavedTokenLogprobs(op)))
}

/// The per-row statistics of a [`token_logprobs_saved`] forward pass.
pub(crate) struct SavedTokenLogprobs(TokenLogprobs);

impl SavedTokenLogprobs {
    /// ∂L/∂logits given `grad` = ∂L/∂logprobs (`[T]`), for the logits of the forward pass.
    pub(crate) fn grad(&self, logits: &Tensor, grad: &Tensor) -> candle_core::Result<Tensor> {
        match self.0.bwd(logits, grad, grad)? {
            Some(g) => Ok(g),
            None => candle_core::bail!("token_logprobs: no gradient"),
        }
    }
}

struct TokenLogprobs {
    targets: std::sync::Arc<Vec<u32>>,
    /// Per row, from the forward pass: the maximum `m` and `Σⱼ exp(x[r, j] − m)`.
    stats: std::sync::OnceLock<std::sync::Arc<Vec<[f32; 2]>>>,
}

impl TokenLogprobs {
    /// The row maximum and the sum of the exponentials of the row minus it.
    fn row_stats(row: &[f32]) -> [f32; 2] {
        let m = super::vmath::max(row);
        [m, super::vmath::exp_sum(row, m)]
    }
}

impl CustomOp1 for TokenLogprobs {
    fn name(&self) -> &'static str {
        "rlvr-token-logprobs"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let x = contiguous_f32(s, l, "token logprobs")?;
        let (t, v) = l.shape().dims2()?;
        if v == 0 || self.targets.len() != t {
            candle_core::bail!("token logprobs: shapes differ");
        }
        let mut stats = vec![[0f32; 2]; t];
        let per = rows_per_task(v);
        stats
            .par_chunks_mut(per)
            .with_min_len(MIN_TASKS)
            .zip(x.par_chunks(per * v))
            .for_each(|(sc, xc)| {
                for (st, xr) in sc.iter_mut().zip(xc.chunks(v)) {
                    *st = Self::row_stats(xr);
                }
            });
        let mut y = Vec::with_capacity(t);
        for ((xr, st), &id) in x.chunks(v).zip(&stats).zip(self.targets.iter()) {
            let picked = xr.get(id as usize).copied().unwrap_or(f32::NAN);
            // As the composed form: (x_t − m) − log Σ exp(x − m).
            y.push((picked - st[0]) - st[1].ln());
        }
        // The op is made for one call, so its statistics are set once.
        let _ = self.stats.set(std::sync::Arc::new(stats));
        Ok((CpuStorage::F32(y), Shape::from(t)))
    }

    fn bwd(&self, x: &Tensor, _y: &Tensor, grad: &Tensor) -> candle_core::Result<Option<Tensor>> {
        let stats = match self.stats.get() {
            Some(s) => s.clone(),
            None => {
                // Not reached (the forward pass sets them); recomputed to be safe.
                let (_, v) = x.dims2()?;
                let xs = x.flatten_all()?.to_vec1::<f32>()?;
                std::sync::Arc::new(xs.chunks(v.max(1)).map(Self::row_stats).collect())
            }
        };
        let op = TokenLogprobsBackward {
            targets: self.targets.clone(),
            stats,
        };
        Ok(Some(x.apply_op2_no_bwd(&grad.contiguous()?, &op)?))
    }
}

/// `dx[r, j] = γᵣ · (1[j = tᵣ] − exp(x[r, j] − mᵣ) / sᵣ)`.
struct TokenLogprobsBackward {
    targets: std::sync::Arc<Vec<u32>>,
    stats: std::sync::Arc<Vec<[f32; 2]>>,
}

impl CustomOp2 for TokenLogprobsBackward {
    fn name(&self) -> &'static str {
        "rlvr-token-logprobs-backward"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let x = contiguous_f32(s1, l1, "token logprobs backward")?;
        let g = contiguous_f32(s2, l2, "token logprobs backward")?;
        let (t, v) = l1.shape().dims2()?;
        if v == 0 || g.len() != t || self.targets.len() != t || self.stats.len() != t {
            candle_core::bail!("token logprobs backward: shapes differ");
        }
        let mut dx = uninit(x.len());
        let per = rows_per_task(v);
        dx.par_chunks_mut(per * v)
            .with_min_len(MIN_TASKS)
            .zip(x.par_chunks(per * v))
            .enumerate()
            .for_each(|(c, (dc, xc))| {
                let dc = zeroed(dc);
                for (k, (dr, xr)) in dc.chunks_mut(v).zip(xc.chunks(v)).enumerate() {
                    let r = c * per + k;
                    let [m, sum] = self.stats[r];
                    let gr = g[r];
                    super::vmath::exp_scaled(dr, xr, m, -gr / sum);
                    if let Some(d) = dr.get_mut(self.targets[r] as usize) {
                        *d += gr;
                    }
                }
            });
        // SAFETY: its tasks zeroed every chunk of `dx` before filling it.
        let dx = unsafe { written(dx) };
        Ok((CpuStorage::F32(dx), l1.shape().clone()))
    }
}

/// The heads of `x` (`[b, t, n·d]`, a projection's output) as `[b, n, t, d]`, contiguous:
/// one copy forward and one back, as one graph node (instead of a reshape, a transpose and a
/// copy, each of which costs candle's backward pass a zero tensor and an add). Composed from
/// candle ops off the CPU and for other dtypes than f32.
pub(crate) fn split_heads(x: &Tensor, n: usize) -> candle_core::Result<Tensor> {
    let (b, t, nd) = x.dims3()?;
    if n == 0 || nd % n != 0 {
        candle_core::bail!("split_heads: {nd} features are not {n} heads");
    }
    let d = nd / n;
    if !x.device().is_cpu() || x.dtype() != candle_core::DType::F32 {
        return x.reshape((b, t, n, d))?.transpose(1, 2)?.contiguous();
    }
    x.contiguous()?.apply_op1(Heads {
        b,
        t,
        n,
        d,
        split: true,
    })
}

/// The inverse of [`split_heads`]: `x` (`[b, g, r, d]` holding `n = g·r / t` heads of `t`
/// positions in the layout of `[b, n, t, d]`, e.g. the grouped-query attention's output
/// `[b, kv_heads, rep·t, d]`) as `[b, t, n·d]`.
pub(crate) fn merge_heads(x: &Tensor, t: usize) -> candle_core::Result<Tensor> {
    let (b, g, r, d) = x.dims4()?;
    if t == 0 || (g * r) % t != 0 {
        candle_core::bail!("merge_heads: {g} x {r} rows are not heads of {t} positions");
    }
    let n = g * r / t;
    if !x.device().is_cpu() || x.dtype() != candle_core::DType::F32 {
        return x
            .reshape((b, n, t, d))?
            .transpose(1, 2)?
            .contiguous()?
            .reshape((b, t, n * d));
    }
    x.contiguous()?.apply_op1(Heads {
        b,
        t,
        n,
        d,
        split: false,
    })
}

/// `[b, t, n·d]` ↔ `[b, n, t, d]` (`split`: the former to the latter).
struct Heads {
    b: usize,
    t: usize,
    n: usize,
    d: usize,
    split: bool,
}

impl CustomOp1 for Heads {
    fn name(&self) -> &'static str {
        "rlvr-heads"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let x = contiguous_f32(s, l, "heads")?;
        let (b, t, n, d) = (self.b, self.t, self.n, self.d);
        if x.len() != b * t * n * d || d == 0 {
            candle_core::bail!("heads: {:?} is not [{b}, {t}, {n} x {d}]", l.dims());
        }
        let mut y = uninit(x.len());
        if self.split {
            // One task per (batch row, head): its [t, d] block gathered from the positions.
            y.par_chunks_mut(t * d)
                .with_min_len(MIN_TASKS)
                .enumerate()
                .for_each(|(bh, yc)| {
                    let yc = zeroed(yc);
                    let (bi, h) = (bh / n, bh % n);
                    for (ti, yr) in yc.chunks_mut(d).enumerate() {
                        let src = (bi * t + ti) * n * d + h * d;
                        yr.copy_from_slice(&x[src..src + d]);
                    }
                });
            // SAFETY: its tasks zeroed every chunk of `y` before filling it.
            let y = unsafe { written(y) };
            Ok((CpuStorage::F32(y), Shape::from((b, n, t, d))))
        } else {
            // One task per (batch row, position): its n heads gathered.
            y.par_chunks_mut(n * d)
                .with_min_len(MIN_TASKS)
                .enumerate()
                .for_each(|(bt, yc)| {
                    let yc = zeroed(yc);
                    let (bi, ti) = (bt / t, bt % t);
                    for (h, yr) in yc.chunks_mut(d).enumerate() {
                        let src = ((bi * n + h) * t + ti) * d;
                        yr.copy_from_slice(&x[src..src + d]);
                    }
                });
            // SAFETY: its tasks zeroed every chunk of `y` before filling it.
            let y = unsafe { written(y) };
            Ok((CpuStorage::F32(y), Shape::from((b, t, n * d))))
        }
    }

    fn bwd(&self, x: &Tensor, _y: &Tensor, grad: &Tensor) -> candle_core::Result<Option<Tensor>> {
        let inverse = Heads {
            split: !self.split,
            ..*self
        };
        let g = grad.contiguous()?.apply_op1_no_bwd(&inverse)?;
        Ok(Some(g.reshape(x.dims())?))
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{f32_bits, max_rel, uniform, weighted_grads};
    use super::*;
    use candle_core::{D, Device, Var};

    /// The training path's former composed form: scale, additive causal mask, softmax.
    fn composed(x: &Tensor, scale: f64, t: usize, offset: usize) -> Tensor {
        let (b, h, rt, kt) = x.dims4().unwrap();
        let rep = rt / t;
        let m: Vec<f32> = (0..t)
            .flat_map(|i| {
                (0..kt).map(move |j| {
                    if j > offset + i {
                        f32::NEG_INFINITY
                    } else {
                        0.0
                    }
                })
            })
            .collect();
        let m = Tensor::from_vec(m, (t, kt), &Device::Cpu).unwrap();
        let att = (x * scale)
            .unwrap()
            .reshape((b, h, rep, t, kt))
            .unwrap()
            .broadcast_add(&m)
            .unwrap()
            .reshape((b, h, rt, kt))
            .unwrap();
        let mx = att.max_keepdim(D::Minus1).unwrap().detach();
        let e = att.broadcast_sub(&mx).unwrap().exp().unwrap();
        let s = e.sum_keepdim(D::Minus1).unwrap();
        e.broadcast_div(&s).unwrap()
    }

    #[test]
    fn causal_softmax_and_its_gradient_match_the_composed_form() {
        for (shape, t, offset) in [([2, 3, 2 * 7, 7], 7, 0), ([1, 2, 3 * 5, 9], 5, 4)] {
            let x = Var::from_tensor(&uniform(&shape, 1, 2.0)).unwrap();
            let w = uniform(&shape, 2, 2.0);
            let run = |y: Tensor| {
                let g = weighted_grads(&y, &w);
                (y.detach(), g.get(x.as_tensor()).unwrap().clone())
            };
            let (y1, g1) = run(causal_softmax(x.as_tensor(), 0.3, t, offset).unwrap());
            let (y2, g2) = run(composed(x.as_tensor(), 0.3, t, offset));
            assert!(max_rel(&y1, &y2) < 1e-6, "{shape:?}");
            assert!(max_rel(&g1, &g2) < 1e-5, "{shape:?}");
        }
    }

    #[test]
    fn rms_norm_and_its_gradients_match_the_composed_form() {
        let x = Var::from_tensor(&uniform(&[3, 5, 24], 3, 2.0)).unwrap();
        let w = Var::from_tensor(&uniform(&[24], 4, 2.0)).unwrap();
        let target = uniform(&[3, 5, 24], 5, 2.0);
        let run = |y: Tensor| {
            let g = weighted_grads(&y, &target);
            (
                y.detach(),
                g.get(x.as_tensor()).unwrap().clone(),
                g.get(w.as_tensor()).unwrap().clone(),
            )
        };
        let (y1, gx1, gw1) = run(rms_norm(x.as_tensor(), w.as_tensor(), 1e-6).unwrap());
        let xt = x.as_tensor();
        let var = xt.sqr().unwrap().mean_keepdim(D::Minus1).unwrap();
        let denom = (var + 1e-6).unwrap().sqrt().unwrap();
        let composed = xt
            .broadcast_div(&denom)
            .unwrap()
            .broadcast_mul(w.as_tensor())
            .unwrap();
        let (y2, gx2, gw2) = run(composed);
        assert!(max_rel(&y1, &y2) < 1e-6);
        assert!(max_rel(&gx1, &gx2) < 1e-5);
        assert!(max_rel(&gw1, &gw2) < 1e-5);
    }

    #[test]
    fn rope_and_its_gradient_match_the_composed_form() {
        let (t, d) = (6, 8);
        let x = Var::from_tensor(&uniform(&[2, 3, t, d], 6, 2.0)).unwrap();
        let cos = uniform(&[t, d / 2], 7, 2.0);
        let sin = uniform(&[t, d / 2], 8, 2.0);
        let target = uniform(&[2, 3, t, d], 9, 2.0);
        let run = |y: Tensor| {
            let g = weighted_grads(&y, &target);
            (y.detach(), g.get(x.as_tensor()).unwrap().clone())
        };
        let (y1, g1) = run(rope(x.as_tensor(), &cos, &sin).unwrap());
        let xt = x.as_tensor();
        let c = Tensor::cat(&[&cos, &cos], 1).unwrap();
        let s = Tensor::cat(&[&sin, &sin], 1).unwrap();
        let x1 = xt.narrow(3, 0, d / 2).unwrap();
        let x2 = xt.narrow(3, d / 2, d / 2).unwrap();
        let rot = Tensor::cat(&[&x2.neg().unwrap(), &x1], 3).unwrap();
        let composed = (xt.broadcast_mul(&c).unwrap() + rot.broadcast_mul(&s).unwrap()).unwrap();
        let (y2, g2) = run(composed);
        assert!(max_rel(&y1, &y2) < 1e-6);
        assert!(max_rel(&g1, &g2) < 1e-6);
    }

    #[test]
    fn swiglu_and_its_gradients_match_the_composed_form() {
        // Large enough to be split between tasks; values past the sigmoid's saturation.
        for shape in [vec![3, 5, 24], vec![4, 64, 384]] {
            let g = Var::from_tensor(&uniform(&shape, 10, 12.0)).unwrap();
            let u = Var::from_tensor(&uniform(&shape, 11, 2.0)).unwrap();
            let target = uniform(&shape, 12, 2.0);
            let run = |y: Tensor| {
                let gr = weighted_grads(&y, &target);
                (
                    y.detach(),
                    gr.get(g.as_tensor()).unwrap().clone(),
                    gr.get(u.as_tensor()).unwrap().clone(),
                )
            };
            let (y1, dg1, du1) = run(swiglu(g.as_tensor(), u.as_tensor()).unwrap());
            let composed = (g.as_tensor().silu().unwrap() * u.as_tensor()).unwrap();
            let (y2, dg2, du2) = run(composed);
            assert!(max_rel(&y1, &y2) <= 1e-4, "{shape:?}");
            assert!(max_rel(&dg1, &dg2) <= 1e-4, "{shape:?}");
            assert!(max_rel(&du1, &du2) <= 1e-4, "{shape:?}");
        }
        // Only one input tracked: the other gets no gradient, the tracked one the same.
        let g = Var::from_tensor(&uniform(&[2, 7], 13, 3.0)).unwrap();
        let u = uniform(&[2, 7], 14, 3.0);
        let gr = swiglu(g.as_tensor(), &u)
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap();
        let want = (g.as_tensor().silu().unwrap() * &u)
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap();
        let (a, b) = (
            gr.get(g.as_tensor()).unwrap(),
            want.get(g.as_tensor()).unwrap(),
        );
        assert!(max_rel(a, b) <= 1e-4);
        assert!(gr.get(&u).is_none());
    }

    #[test]
    fn split_and_merge_heads_and_their_gradients_match_the_composed_form() {
        let (b, t, n, d) = (2, 5, 6, 4);
        let x = Var::from_tensor(&uniform(&[b, t, n * d], 15, 2.0)).unwrap();
        let target = uniform(&[b, n, t, d], 16, 2.0);
        let grad_of = |y: &Tensor, target: &Tensor| {
            let g = weighted_grads(y, target);
            g.get(x.as_tensor()).unwrap().clone()
        };
        let y1 = split_heads(x.as_tensor(), n).unwrap();
        let y2 = x
            .as_tensor()
            .reshape((b, t, n, d))
            .unwrap()
            .transpose(1, 2)
            .unwrap()
            .contiguous()
            .unwrap();
        assert_eq!(y1.dims(), [b, n, t, d]);
        assert_eq!(max_rel(&y1, &y2), 0.0);
        assert_eq!(max_rel(&grad_of(&y1, &target), &grad_of(&y2, &target)), 0.0);
        // Merging the grouped layout [b, g, r·t, d] (g = 2 groups of r = 3 heads) back.
        let h = y1.reshape((b, 2, 3 * t, d)).unwrap();
        let m1 = merge_heads(&h, t).unwrap();
        let m2 = h
            .reshape((b, n, t, d))
            .unwrap()
            .transpose(1, 2)
            .unwrap()
            .contiguous()
            .unwrap()
            .reshape((b, t, n * d))
            .unwrap();
        assert_eq!(m1.dims(), [b, t, n * d]);
        assert_eq!(max_rel(&m1, x.as_tensor()), 0.0);
        let target = uniform(&[b, t, n * d], 17, 2.0);
        assert_eq!(max_rel(&grad_of(&m1, &target), &grad_of(&m2, &target)), 0.0);
    }

    /// The per-entry attention gives the bits of the whole-tensor products and softmax, on
    /// 1 and 2 threads, with grouped heads, an offset and a partly masked last block.
    #[test]
    fn attention_by_entries_gives_the_composed_bits() {
        for (rep, t, kt, offset) in [(2, 7, 7, 0), (3, 4, 9, 5), (1, 40, 40, 0)] {
            let (b, g, d) = (2, 3, 8);
            let q = uniform(&[b, g, rep * t, d], 41, 2.0);
            let k = uniform(&[b, g, kt, d], 42, 2.0);
            let v = uniform(&[b, g, kt, d], 43, 2.0);
            let gy = uniform(&[b, g, rep * t, d], 44, 2.0);
            for threads in [1, 2] {
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .build()
                    .unwrap();
                pool.install(|| {
                    let entries = Entries::new(&q, &k, &v).unwrap().unwrap();
                    let (y1, a1) = entries.forward(0.35, t, offset).unwrap();
                    let (y2, a2) = composed_attention_parts(&q, &k, &v, 0.35, t, offset).unwrap();
                    assert!(f32_bits(&y1) == f32_bits(&y2), "{rep} {t} {kt}: y");
                    assert!(f32_bits(&a1) == f32_bits(&a2), "{rep} {t} {kt}: att");
                    let g1 = entries.backward(&a1, &gy, 0.35).unwrap();
                    let g2 = composed_attention_grads(&q, &k, &v, &a2, &gy, 0.35).unwrap();
                    assert!(f32_bits(&g1.0) == f32_bits(&g2.0), "{rep} {t} {kt}: dq");
                    assert!(f32_bits(&g1.1) == f32_bits(&g2.1), "{rep} {t} {kt}: dk");
                    assert!(f32_bits(&g1.2) == f32_bits(&g2.2), "{rep} {t} {kt}: dv");
                });
            }
        }
    }

    #[test]
    fn causal_attention_and_its_gradients_match_the_composed_form() {
        use super::super::matmul::matmul;
        // [b, g, rep·t, d] queries, [b, g, kt, d] keys/values; with and without an offset.
        for (rep, t, kt, offset) in [(2, 7, 7, 0), (3, 4, 9, 5)] {
            let (b, g, d) = (2, 2, 8);
            let q = Var::from_tensor(&uniform(&[b, g, rep * t, d], 31, 2.0)).unwrap();
            let k = Var::from_tensor(&uniform(&[b, g, kt, d], 32, 2.0)).unwrap();
            let v = Var::from_tensor(&uniform(&[b, g, kt, d], 33, 2.0)).unwrap();
            let target = uniform(&[b, g, rep * t, d], 34, 2.0);
            let run = |y: Tensor| {
                let gr = weighted_grads(&y, &target);
                let get = |x: &Var| gr.get(x.as_tensor()).unwrap().clone();
                (y.detach(), get(&q), get(&k), get(&v))
            };
            let (qt, kt_, vt) = (q.as_tensor(), k.as_tensor(), v.as_tensor());
            let fused = run(causal_attention(qt, kt_, vt, 0.35, t, offset).unwrap());
            let scores = matmul(qt, &kt_.t().unwrap()).unwrap();
            let att = causal_softmax(&scores, 0.35, t, offset).unwrap();
            let want = run(matmul(&att, vt).unwrap());
            assert!(max_rel(&fused.0, &want.0) <= 1e-6);
            assert!(max_rel(&fused.1, &want.1) <= 1e-5);
            assert!(max_rel(&fused.2, &want.2) <= 1e-5);
            assert!(max_rel(&fused.3, &want.3) <= 1e-5);
        }
    }
}
