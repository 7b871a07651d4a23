//! Row-wise elementwise kernels: rotary embedding (Llama rotate-half), SiLU-and-mul,
//! embedding gather. One block per token (grid x), thread `i` handles items
//! `i, i + threads, ...` of the row; no shared memory; O(row) per block.

use crate::device::{block_dim_x, block_idx_x, exp_fast, thread_idx_x};
use crate::Storage;

/// Rotary embedding, rotate-half (GPT-NeoX / Llama HF) form, in place on `query`
/// (`[tokens, num_heads, head_dim]`) and `key` (`[tokens, num_kv_heads, head_dim]`).
///
/// For each head and `j < rot_dim / 2`, with `c, s = cos_sin_cache[pos, j],
/// cos_sin_cache[pos, rot_dim / 2 + j]` (`f32[max_position, rot_dim]`, cosines then
/// sines): `x[j], x[j + rot_dim/2] = x[j] c - x[j + rot_dim/2] s, x[j + rot_dim/2] c + x[j] s`.
/// Dims past `rot_dim` are left alone.
///
/// # Safety
/// Shapes as above; `positions[t] < max_position`; `rot_dim` even and `<= head_dim`.
pub unsafe fn rotary_embedding<T: Storage>(
    positions: *const u32,
    query: *mut T,
    key: *mut T,
    cos_sin_cache: *const f32,
    num_heads: u32,
    num_kv_heads: u32,
    head_dim: u32,
    rot_dim: u32,
) {
    let t = block_idx_x() as usize;
    let (hd, half) = (head_dim as usize, rot_dim as usize / 2);
    let (nq, nk) = (num_heads as usize, num_kv_heads as usize);
    // SAFETY: per the function contract; each (head, j) pair is owned by one thread.
    unsafe {
        let cs = cos_sin_cache.add(*positions.add(t) as usize * rot_dim as usize);
        let mut i = thread_idx_x() as usize;
        while i < (nq + nk) * half {
            let (h, j) = (i / half, i % half);
            let x = if h < nq {
                query.add((t * nq + h) * hd)
            } else {
                key.add((t * nk + h - nq) * hd)
            };
            let (c, s) = (*cs.add(j), *cs.add(half + j));
            let (x1, x2) = ((*x.add(j)).to_f32(), (*x.add(j + half)).to_f32());
            *x.add(j) = T::from_f32(x1 * c - x2 * s);
            *x.add(j + half) = T::from_f32(x2 * c + x1 * s);
            i += block_dim_x() as usize;
        }
    }
}

/// `out[t, j] = silu(input[t, j]) * input[t, d + j]` with `silu(x) = x / (1 + e^-x)`;
/// `input`: `[tokens, 2d]` (gate then up), `out`: `[tokens, d]`.
///
/// # Safety
/// Shapes as above; grid x = tokens.
pub unsafe fn silu_and_mul<T: Storage>(out: *mut T, input: *const T, d: u32) {
    let (t, d) = (block_idx_x() as usize, d as usize);
    // SAFETY: per the function contract.
    unsafe {
        let x = input.add(t * 2 * d);
        let mut j = thread_idx_x() as usize;
        while j < d {
            let g = (*x.add(j)).to_f32();
            let silu = g / (1.0 + exp_fast(-g));
            *out.add(t * d + j) = T::from_f32(silu * (*x.add(d + j)).to_f32());
            j += block_dim_x() as usize;
        }
    }
}

/// Embedding gather: `out[t] = table[ids[t]]`; `table`: `[vocab, hidden]`.
///
/// # Safety
/// Every id `< vocab` (the host validates ids); `out`: `[tokens, hidden]`.
pub unsafe fn embedding<T: Storage>(out: *mut T, ids: *const u32, table: *const T, hidden: u32) {
    let (t, n) = (block_idx_x() as usize, hidden as usize);
    // SAFETY: per the function contract.
    unsafe {
        let src = table.add(*ids.add(t) as usize * n);
        let mut i = thread_idx_x() as usize;
        while i < n {
            *out.add(t * n + i) = *src.add(i);
            i += block_dim_x() as usize;
        }
    }
}
