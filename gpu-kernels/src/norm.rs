//! RMSNorm and fused residual-add + RMSNorm (Llama).
//!
//! Thread mapping: one block per row (grid x); thread `i` handles elements
//! `i, i + threads, ...`; the sum of squares is a block reduction (warp shuffles, then
//! `f32[32]` static shared memory). Two passes over the row, O(hidden) per block.

use crate::device::{block_dim_x, block_idx_x, sqrt, thread_idx_x};
use crate::reduce::block_sum;
use crate::Storage;

/// `out[r] = input[r] / sqrt(mean(input[r]^2) + eps) * weight`, computed in `f32`.
///
/// # Safety
/// `out`, `input`: `[rows, hidden]`; `weight`: `[hidden]`; grid x = rows.
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
        let mut ss = 0.0f32;
        let mut i = tid;
        while i < n {
            let v = (*x.add(i)).to_f32();
            ss += v * v;
            i += threads;
        }
        let inv = 1.0 / sqrt(block_sum(ss) / n as f32 + eps);
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
