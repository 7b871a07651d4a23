//! Warp and block reductions over `f32` built on shuffles and one static shared array.
//!
//! Block reductions take O(log 32) shuffles plus O(warps) shared reads, two
//! `sync_threads`, and return the result to every thread. They must be called by every
//! thread of the block (1-D blocks, size a multiple of 32).

use crate::device::{block_dim_x, lane_id, shfl_xor_f32, sync_threads, warp_id};

/// Sum over the warp, result in every lane.
#[inline(always)]
pub fn warp_sum(mut v: f32) -> f32 {
    let mut m = 16;
    while m > 0 {
        v += shfl_xor_f32(v, m);
        m >>= 1;
    }
    v
}

#[inline(always)]
fn block_reduce(v: f32, warp_op: fn(f32) -> f32, op: fn(f32, f32) -> f32) -> f32 {
    let v = warp_op(v);
    let red = crate::shared_array!(GK_BLOCK_RED: [f32; 32]);
    let warps = block_dim_x().div_ceil(32);
    // Protects `red` from a previous reduction whose readers may still be reading.
    sync_threads();
    if lane_id() == 0 {
        // SAFETY: warp_id() < 32 for blocks of at most 1024 threads.
        unsafe { *red.add(warp_id() as usize) = v };
    }
    sync_threads();
    // SAFETY: entries 0..warps were written before the barrier above.
    let mut r = unsafe { *red };
    for w in 1..warps as usize {
        // SAFETY: as above.
        r = op(r, unsafe { *red.add(w) });
    }
    r
}

/// Sum over the block, result in every thread.
#[inline(always)]
pub fn block_sum(v: f32) -> f32 {
    block_reduce(v, warp_sum, |a, b| a + b)
}
