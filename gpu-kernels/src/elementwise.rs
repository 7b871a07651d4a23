//! Row-wise elementwise kernels: rotary embedding (Llama rotate-half), SiLU-and-mul,
//! GELU-tanh-and-mul (Gemma), embedding gather, row scaling (Gemma's embedding scale).
//! One block per token (grid x), thread `i` handles items `i, i + threads, ...` of the
//! row ([`scale_rows`]: 16-byte vectors when the row is whole aligned vectors); no
//! shared memory; O(row) per block.

#![allow(clippy::needless_range_loop)] // parallel register arrays, constant-bounded unrolled loops

use crate::device::{block_dim_x, block_idx_x, exp_fast, ld_global_v4, st_global_v4, thread_idx_x};
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
    // SAFETY: per the function contract.
    unsafe { gated(out, input, d, |g| g / (1.0 + exp_fast(-g))) }
}

/// `out[t, j] = act(input[t, j]) * input[t, d + j]`: the body of the gated MLP
/// activations. One block per token (grid x), thread `i` handles `j = i, i + threads, ...`.
///
/// # Safety
/// As [`silu_and_mul`].
#[inline(always)]
unsafe fn gated<T: Storage>(out: *mut T, input: *const T, d: u32, act: impl Fn(f32) -> f32) {
    let (t, d) = (block_idx_x() as usize, d as usize);
    // SAFETY: per the function contract.
    unsafe {
        let x = input.add(t * 2 * d);
        let mut j = thread_idx_x() as usize;
        while j < d {
            let g = (*x.add(j)).to_f32();
            *out.add(t * d + j) = T::from_f32(act(g) * (*x.add(d + j)).to_f32());
            j += block_dim_x() as usize;
        }
    }
}

/// Embedding gather over a slice of the vocabulary: `out[t] = table[ids[t] - first]`
/// where `first <= ids[t] < first + rows`, else a row of zeros; `table`: `[rows, hidden]`,
/// the vocabulary rows `first..first + rows`. The whole table is `first = 0, rows = vocab`;
/// a tensor-parallel rank holds a slice, and the zero rows of the other ranks' ids make
/// the sum over ranks the full lookup. Also gathers rows of any `[rows, hidden]`
/// matrix by index (the logits rows of the residual stream, a bias row broadcast).
///
/// Thread mapping: one block per token (grid x, [`crate::launch::per_row`]), thread `i`
/// copies elements `i, i + threads, ...` of the row. No shared memory. Cost per token:
/// `2 hidden * sizeof(T)` bytes.
///
/// # Safety
/// `out`: `[tokens, hidden]`; `table` holds `rows` rows of `hidden`; grid x = tokens.
pub unsafe fn embedding<T: Storage>(
    out: *mut T,
    ids: *const u32,
    table: *const T,
    hidden: u32,
    first: u32,
    rows: u32,
) {
    let (t, n) = (block_idx_x() as usize, hidden as usize);
    // SAFETY: per the function contract; `row < rows` is checked before the read.
    unsafe {
        let row = (*ids.add(t)).wrapping_sub(first);
        let mut i = thread_idx_x() as usize;
        if row < rows {
            let src = table.add(row as usize * n);
            while i < n {
                *out.add(t * n + i) = *src.add(i);
                i += block_dim_x() as usize;
            }
        } else {
            while i < n {
                *out.add(t * n + i) = T::from_f32(0.0);
                i += block_dim_x() as usize;
            }
        }
    }
}

/// `sqrt(2 / pi)`, as the CPU engine's `gelu_tanh_mul`.
const SQRT_2_OVER_PI: f32 = 0.797_884_6;

/// GELU, tanh approximation: `0.5 g (1 + tanh(u))` with `u = sqrt(2 / pi) (g + 0.044715
/// g^3)`, evaluated as `g / (1 + e^(-2u))` (the same function: `0.5 (1 + tanh(u)) =
/// 1 / (1 + e^(-2u))`), so it needs no `tanhf` (absent on nvptx) and is stable for any
/// `g`: for large `u` the exponential goes to 0 (result `g`), for very negative `u` to
/// infinity (result `-0`), never inf / inf; nor does `1 + tanh(u)` cancel for negative
/// `g`. One `ex2.approx` and one division.
#[inline(always)]
pub fn gelu_tanh(g: f32) -> f32 {
    let u = SQRT_2_OVER_PI * (g + 0.044_715 * g * g * g);
    g / (1.0 + exp_fast(-2.0 * u))
}

/// `out[t, j] = gelu_tanh(input[t, j]) * input[t, d + j]` ([`gelu_tanh`]); `input`:
/// `[tokens, 2d]` (gate then up), `out`: `[tokens, d]`. Gemma's MLP activation, the CPU
/// engine's `gelu_tanh_mul`.
///
/// Thread mapping: one block per token (grid x, [`crate::launch::per_row`]), thread `i`
/// handles `j = i, i + threads, ...`. Cost per token: `3 d * sizeof(T)` bytes, one
/// exponential and one division per output.
///
/// # Safety
/// Shapes as above, `out` and `input` not overlapping; grid x = tokens.
pub unsafe fn gelu_tanh_and_mul<T: Storage>(out: *mut T, input: *const T, d: u32) {
    // SAFETY: per the function contract.
    unsafe { gated(out, input, d, gelu_tanh) }
}

/// In place: `x[r, j] *= s` (computed in `f32`, rounded to `T`); Gemma's embedding
/// scale `sqrt(hidden)`.
///
/// Thread mapping: one block per row (grid x, [`crate::launch::per_row`]); when `width
/// * sizeof(T) % 16 == 0` and the row is 16-byte aligned, thread `i` handles the 16-byte
/// vectors `i, i + threads, ...` (coherent `ld.global.v4`: the kernel writes `x`),
/// otherwise the elements. Cost per row: `2 * width * sizeof(T)` bytes.
///
/// # Safety
/// `x`: `[rows, width]`, written by this kernel only; grid x = rows.
pub unsafe fn scale_rows<T: Storage>(x: *mut T, s: f32, width: u32) {
    let n = width as usize;
    let (tid, threads) = (thread_idx_x() as usize, block_dim_x() as usize);
    // SAFETY: per the function contract; each element is read and written by one thread.
    unsafe {
        let p = x.add(block_idx_x() as usize * n);
        if n.is_multiple_of(T::VEC) && (p as usize).is_multiple_of(16) {
            let (vec, nv) = (T::VEC, n / T::VEC);
            let mut j = tid;
            while j < nv {
                let a = T::unpack(ld_global_v4(p.add(j * vec).cast()));
                let mut y = [0.0f32; 8];
                for e in 0..vec {
                    y[e] = a[e] * s;
                }
                st_global_v4(p.add(j * vec).cast(), T::pack(y));
                j += threads;
            }
            return;
        }
        let mut i = tid;
        while i < n {
            *p.add(i) = T::from_f32((*p.add(i)).to_f32() * s);
            i += threads;
        }
    }
}
