//! RMSNorm and fused residual-add + RMSNorm (Llama); Gemma 3's per-head q/k norm
//! ([`rms_norm_heads`]) and post-norms ([`add_rms_norm`]).
//!
//! Thread mapping: one block per row (grid x; [`rms_norm_heads`]: per (token, head),
//! grid (tokens, heads)); when the row's length times `sizeof(T)` is a multiple of 16
//! bytes and the row's pointers are 16-byte aligned (checked per row), thread `i` handles
//! the 16-byte vectors `i, i + threads, ...` of the row (`ld.global.v4` /
//! `st.global.v4`, 8 bf16/f16 or 4 f32 per access), otherwise elements `i, i + threads,
//! ...`. The sum of squares is a block reduction (warp shuffles, then `f32[32]` static
//! shared memory). Two passes over the row (the second re-reads from L1/L2).
//! Buffers a kernel writes are read with coherent loads (`ld.global.v4`), only read-only
//! ones through the non-coherent path (`ld.global.nc`).
//!
//! Bytes per row: `rms_norm` `(2 * hidden + hidden) * sizeof(T)` (in, out, weight from L2
//! after the first rows), `fused_add_rms_norm` `4 * hidden * sizeof(T)` (input and
//! residual read, both written), `add_rms_norm` `3 * hidden * sizeof(T)` (input and the
//! residual read, the residual written), `rms_norm_heads` `2 * head_dim * sizeof(T)` per
//! head (read and written in place); FLOPs O(row). The floor is those bytes over the copy
//! bandwidth.

#![allow(clippy::needless_range_loop)] // parallel register arrays, constant-bounded unrolled loops

use crate::device::{
    block_dim_x, block_idx_x, block_idx_y, ld_global_nc_v4, ld_global_v4, sqrt, st_global_v4,
    thread_idx_x,
};
use crate::reduce::block_sum;
use crate::Storage;

/// `out[r] = input[r] / sqrt(mean(input[r]^2) + eps) * weight`, computed in `f32`.
///
/// # Safety
/// `out`, `input`: `[rows, hidden]`, not aliased; `weight`: `[hidden]`; grid x = rows.
pub unsafe fn rms_norm<T: Storage>(
    out: *mut T,
    input: *const T,
    weight: *const T,
    eps: f32,
    hidden: u32,
) {
    let n = hidden as usize;
    let (tid, threads) = (thread_idx_x() as usize, block_dim_x() as usize);
    let row = block_idx_x() as usize * n;
    // SAFETY: per the function contract.
    unsafe {
        let x = input.add(row);
        if n.is_multiple_of(T::VEC) && aligned16(&[x as usize, out as usize, weight as usize]) {
            let (vec, nv) = (T::VEC, n / T::VEC);
            let inv = inv_rms(nv, vec, n, eps, |j| {
                T::unpack(ld_global_nc_v4(x.add(j * vec).cast()))
            });
            let o = out.add(row);
            let mut j = tid;
            while j < nv {
                let a = T::unpack(ld_global_nc_v4(x.add(j * vec).cast()));
                let w = T::unpack(ld_global_nc_v4(weight.add(j * vec).cast()));
                let mut y = [0.0f32; 8];
                for e in 0..vec {
                    y[e] = a[e] * inv * w[e];
                }
                st_global_v4(o.add(j * vec).cast(), T::pack(y));
                j += threads;
            }
            return;
        }
        let inv = inv_rms(n, 1, n, eps, |i| lane0((*x.add(i)).to_f32()));
        let o = out.add(row);
        let mut i = tid;
        while i < n {
            *o.add(i) = T::from_f32((*x.add(i)).to_f32() * inv * (*weight.add(i)).to_f32());
            i += threads;
        }
    }
}

/// In place: `residual[r] += input[r]` (rounded to `T`), then
/// `input[r] = rms_norm(residual[r]) * weight`, as vLLM's `fused_add_rms_norm`.
///
/// # Safety
/// `input`, `residual`: `[rows, hidden]`, not aliased; `weight`: `[hidden]`; grid x = rows.
pub unsafe fn fused_add_rms_norm<T: Storage>(
    input: *mut T,
    residual: *mut T,
    weight: *const T,
    eps: f32,
    hidden: u32,
) {
    let n = hidden as usize;
    let (tid, threads) = (thread_idx_x() as usize, block_dim_x() as usize);
    let row = block_idx_x() as usize * n;
    // SAFETY: per the function contract; each element is read and written by one thread.
    unsafe {
        let (x, r) = (input.add(row), residual.add(row));
        if n.is_multiple_of(T::VEC) && aligned16(&[x as usize, r as usize, weight as usize]) {
            let (vec, nv) = (T::VEC, n / T::VEC);
            let mut ss = 0.0f32;
            let mut j = tid;
            while j < nv {
                let a = T::unpack(ld_global_v4(x.add(j * vec).cast()));
                let b = T::unpack(ld_global_v4(r.add(j * vec).cast()));
                let mut sum = [0.0f32; 8];
                for e in 0..vec {
                    sum[e] = a[e] + b[e];
                }
                let packed = T::pack(sum);
                st_global_v4(r.add(j * vec).cast(), packed);
                // The residual as stored (rounded to `T`) is what is normalised.
                let v = T::unpack(packed);
                for e in 0..vec {
                    ss += v[e] * v[e];
                }
                j += threads;
            }
            let inv = 1.0 / sqrt(block_sum(ss) / n as f32 + eps);
            let mut j = tid;
            while j < nv {
                let v = T::unpack(ld_global_v4(r.add(j * vec).cast()));
                let w = T::unpack(ld_global_nc_v4(weight.add(j * vec).cast()));
                let mut y = [0.0f32; 8];
                for e in 0..vec {
                    y[e] = v[e] * inv * w[e];
                }
                st_global_v4(x.add(j * vec).cast(), T::pack(y));
                j += threads;
            }
            return;
        }
        let mut ss = 0.0f32;
        let mut i = tid;
        while i < n {
            let s = T::from_f32((*x.add(i)).to_f32() + (*r.add(i)).to_f32());
            *r.add(i) = s;
            let v = s.to_f32();
            ss += v * v;
            i += threads;
        }
        let inv = 1.0 / sqrt(block_sum(ss) / n as f32 + eps);
        let mut i = tid;
        while i < n {
            *x.add(i) = T::from_f32((*r.add(i)).to_f32() * inv * (*weight.add(i)).to_f32());
            i += threads;
        }
    }
}

/// `1 / sqrt(mean(v^2) + eps)` over a row of `n` values that the block reads as `count`
/// pieces of `lanes` values each (16-byte vectors, or single values with `lanes == 1`):
/// thread `i` reads pieces `i, i + threads, ...` through `load`, then one block reduction
/// gives every thread the result, so every thread of the block must call it.
#[inline(always)]
fn inv_rms(
    count: usize,
    lanes: usize,
    n: usize,
    eps: f32,
    mut load: impl FnMut(usize) -> [f32; 8],
) -> f32 {
    let (tid, threads) = (thread_idx_x() as usize, block_dim_x() as usize);
    let mut ss = 0.0f32;
    let mut j = tid;
    while j < count {
        let a = load(j);
        for e in 0..lanes {
            ss += a[e] * a[e];
        }
        j += threads;
    }
    1.0 / sqrt(block_sum(ss) / n as f32 + eps)
}

/// One value as the first lane of a piece (the scalar path of [`inv_rms`]).
#[inline(always)]
fn lane0(v: f32) -> [f32; 8] {
    let mut a = [0.0f32; 8];
    a[0] = v;
    a
}

/// Whether every address is 16-byte aligned (the vector path's requirement; otherwise the
/// scalar path runs).
#[inline(always)]
fn aligned16(addrs: &[usize]) -> bool {
    addrs.iter().all(|a| a % 16 == 0)
}

/// Gemma 3's q/k norm, in place on a fused q|k|v projection buffer: per token row `t`
/// (grid x) and head `h` (grid y, `num_q_heads + num_k_heads` of them), the `head_dim`
/// elements at `x + t * row_stride + h * head_dim` become `v / sqrt(mean(v^2) + eps) *
/// w`, computed in `f32`, with `w = q_weight` for the q heads (`h < num_q_heads`) and
/// `k_weight` for the k heads after them. The rest of the row (v heads, padding) is not
/// touched. Blocks with `h >= num_q_heads + num_k_heads` return at once.
///
/// Thread mapping: the module's, over the head's `head_dim` elements (vectorised when
/// `head_dim * sizeof(T) % 16 == 0` and the head and weight are 16-byte aligned); one
/// block reduction (two `sync_threads`, `f32[32]` static shared memory). Launch with
/// [`crate::launch::per_head`]. Cost per head: `head_dim * sizeof(T)` read twice (the
/// second from L1) and written once, the weight from L2; FLOPs O(head_dim).
///
/// # Safety
/// `x`: `[tokens, row_stride]` with `(num_q_heads + num_k_heads) * head_dim <=
/// row_stride`, read and written by this kernel only (in place: loads from `x` are
/// coherent); `q_weight`, `k_weight`: `[head_dim]`, not written during the launch; grid
/// (tokens, >= `num_q_heads + num_k_heads`).
pub unsafe fn rms_norm_heads<T: Storage>(
    x: *mut T,
    q_weight: *const T,
    k_weight: *const T,
    eps: f32,
    head_dim: u32,
    num_q_heads: u32,
    num_k_heads: u32,
    row_stride: u32,
) {
    let n = head_dim as usize;
    let (tid, threads) = (thread_idx_x() as usize, block_dim_x() as usize);
    let (t, h) = (block_idx_x() as usize, block_idx_y());
    if h >= num_q_heads + num_k_heads {
        return;
    }
    let weight = if h < num_q_heads { q_weight } else { k_weight };
    // SAFETY: per the function contract; each element is read and written by one thread.
    unsafe {
        let p = x.add(t * row_stride as usize + h as usize * n);
        if n.is_multiple_of(T::VEC) && aligned16(&[p as usize, weight as usize]) {
            let (vec, nv) = (T::VEC, n / T::VEC);
            let inv = inv_rms(nv, vec, n, eps, |j| {
                T::unpack(ld_global_v4(p.add(j * vec).cast()))
            });
            let mut j = tid;
            while j < nv {
                let a = T::unpack(ld_global_v4(p.add(j * vec).cast()));
                let w = T::unpack(ld_global_nc_v4(weight.add(j * vec).cast()));
                let mut y = [0.0f32; 8];
                for e in 0..vec {
                    y[e] = a[e] * inv * w[e];
                }
                st_global_v4(p.add(j * vec).cast(), T::pack(y));
                j += threads;
            }
            return;
        }
        let inv = inv_rms(n, 1, n, eps, |i| lane0((*p.add(i)).to_f32()));
        let mut i = tid;
        while i < n {
            *p.add(i) = T::from_f32((*p.add(i)).to_f32() * inv * (*weight.add(i)).to_f32());
            i += threads;
        }
    }
}

/// Gemma 3's post-norms: `x[r] += input[r] / sqrt(mean(input[r]^2) + eps) * weight`
/// (the branch output is normalised, then added to the residual stream), computed in
/// `f32` and rounded to `T` once.
///
/// Thread mapping: the module's (one block per row, vectorised when `hidden *
/// sizeof(T) % 16 == 0` and the row's pointers are 16-byte aligned), as [`rms_norm`];
/// launch with [`crate::launch::per_row`]. Cost per row: `3 * hidden * sizeof(T)` bytes
/// (input read twice, the second from L1; the residual read and written), the weight
/// from L2; FLOPs O(hidden).
///
/// # Safety
/// `x`, `input`: `[rows, hidden]`, not aliased, `input` not written during the launch;
/// `weight`: `[hidden]`; grid x = rows.
pub unsafe fn add_rms_norm<T: Storage>(
    x: *mut T,
    input: *const T,
    weight: *const T,
    eps: f32,
    hidden: u32,
) {
    let n = hidden as usize;
    let (tid, threads) = (thread_idx_x() as usize, block_dim_x() as usize);
    let row = block_idx_x() as usize * n;
    // SAFETY: per the function contract; each element of `x` is read and written by one
    // thread.
    unsafe {
        let (src, dst) = (input.add(row), x.add(row));
        if n.is_multiple_of(T::VEC) && aligned16(&[src as usize, dst as usize, weight as usize]) {
            let (vec, nv) = (T::VEC, n / T::VEC);
            let inv = inv_rms(nv, vec, n, eps, |j| {
                T::unpack(ld_global_nc_v4(src.add(j * vec).cast()))
            });
            let mut j = tid;
            while j < nv {
                let a = T::unpack(ld_global_nc_v4(src.add(j * vec).cast()));
                let w = T::unpack(ld_global_nc_v4(weight.add(j * vec).cast()));
                let r = T::unpack(ld_global_v4(dst.add(j * vec).cast()));
                let mut y = [0.0f32; 8];
                for e in 0..vec {
                    y[e] = r[e] + a[e] * inv * w[e];
                }
                st_global_v4(dst.add(j * vec).cast(), T::pack(y));
                j += threads;
            }
            return;
        }
        let inv = inv_rms(n, 1, n, eps, |i| lane0((*src.add(i)).to_f32()));
        let mut i = tid;
        while i < n {
            let y = (*src.add(i)).to_f32() * inv * (*weight.add(i)).to_f32();
            *dst.add(i) = T::from_f32((*dst.add(i)).to_f32() + y);
            i += threads;
        }
    }
}
