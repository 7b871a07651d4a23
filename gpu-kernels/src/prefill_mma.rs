//! Prefill / chunked-prefill attention on tensor cores, FlashAttention-2 style, over the
//! paged KV cache ([`prefill_attention_mma`]), for `bf16` and `f16` caches with head
//! sizes that are multiples of 16. `f32` caches and other head sizes keep the streaming
//! kernel ([`crate::attention::prefill_attention`]); [`crate::launch::choose_prefill`]
//! is the one rule that picks between them.
//!
//! Thread mapping. One thread block per (query head, query tile of one sequence): grid
//! `(num_heads, ceil(num_tokens / BR) + num_seqs)` (an upper bound on the tiles; blocks
//! past the last tile return at once), `warps * 32` threads, `BR = 16 * warps` query
//! rows per tile (64 with the 4 warps of [`crate::launch::ATTN_THREADS`]). A sequence's
//! tiles are taken last tile first, so the blocks with the longest causal range start
//! first. Per block:
//! - warp `w` owns query rows `16 w .. 16 w + 16` of the tile; their Q fragments (the A
//!   operand of `mma.sync.m16n8k16`, `D / 16` fragments of 4 registers) are loaded once
//!   from global memory and stay in registers;
//! - the block walks the KV tiles of `BC` = [`kv_tile`]`(D)` tokens from `kv_lo` up to
//!   the tile's last position (tiles wholly above the causal diagonal are never
//!   loaded); `kv_lo` is 0, or with a sliding window the first key of the tile's first
//!   row, `max(0, pos0 + 1 - window)`, so no KV tile wholly before the window is loaded;
//!   each tile:
//!   all threads gather the tile's K and V rows through the block table into shared
//!   memory with 16-byte asynchronous copies (`cp.async.cg.shared.global`, every copy
//!   of a thread in flight at once, no registers), past-the-end tokens zero-filled
//!   (`st.shared.v4.u32`), pipelined as in FlashAttention-2: the copy of V(k) runs
//!   during `S = Q K(k)^T` and the copy of K(k + 1) during `O += P V(k)` (single K and
//!   V tiles, four `sync_threads` per KV tile);
//! - each warp whose rows reach the tile computes `S = Q K^T` (16 x BC, `f32` in
//!   registers; K fragments by `ldmatrix.x4`), scales it, applies the causal and window
//!   mask (query row `i` of a sequence sits at position `p = context_len - q_len + i`
//!   and sees keys `max(0, p + 1 - window) ..= p`: per tile each row's visible keys are
//!   one range of the lane's constant key offsets, so each score is two compares with
//!   immediates), updates its rows' online softmax (a row's values live in the quad of
//!   lanes `4g .. 4g + 4`: row max by two quad shuffles, running sums kept per lane and
//!   reduced once at the end; the running max starts finite, so a row that has seen no
//!   key yet stays at 0 without NaN), rescales O, converts P to the A-fragment layout in
//!   registers (the C layout of two adjacent 8-column tiles is the A layout of one
//!   16-column step) and accumulates `O += P V` (V fragments by `ldmatrix.x4.trans`);
//! - at the end each lane divides its O fragment by the row sum and writes pairs of
//!   elements.
//!
//! Shared memory: K and V tiles, `2 * BC * (D + 8) * sizeof(T)` bytes
//! ([`shared_bytes`]): 18 KB at head 64, 34 KB at head 128 and 256 (BC 32 there). The
//! 8-element row padding makes the 8 row addresses of every `ldmatrix` hit distinct
//! banks. Nothing depends on the context length: any context runs.
//!
//! Cost per call, per query head: K/V bytes `2 * D * sizeof(T) * sum over tiles of
//! n_tile`, `n_tile` the tile's keys: `last position + 1`, or with a window at most
//! `window + BR - 1` (each tile of 64 query rows reads its causal prefix, or its window,
//! once; from L2 for the other heads of a KV group and the other tiles), plus Q and out
//! once. FLOPs `4 * sum over query rows of keys(row) * D` (QK^T and PV, the causal half
//! only), executed on tensor cores at tile granularity (the diagonal tiles do the masked
//! half too; with a window the edge tiles do their masked part, and at head 256 warps 2
//! and 3 may compute one KV tile that lies wholly before their rows' windows).
//! `window == 0` adds a few integer ops per KV tile and one compare per score. Floor: at
//! 4 x 2048 tokens, 32 heads, head 128, causal, 137 GFLOP, about 140 us at the H200's
//! 989 TFLOP/s dense bf16 (the target of 200 TFLOP/s is 690 us).
//!
//! Registers (ptxas, `cargo xtask build-ptx`, with the window): 144-168 at heads 64-96,
//! 199 (sm_80) / 209 (sm_90) at head 128, 246 / 248 at head 256; 0 spills, no stack.
//! Two 128-thread blocks fit an SM at head 128 and at head 256.
//!
//! Invariants: accumulation in `f32` (S, the running max and sums, O); P is rounded to
//! `T` for the PV product, as in FlashAttention-2. Control flow around `sync_threads` is
//! block-uniform; `mma`/`ldmatrix` run under warp-uniform conditions only.
//!
//! Not yet: each query head stages its own K/V (the other heads of its KV
//! group hit L2); ALiBi is not supported, as in the streaming kernel.

// Register arrays indexed by constant-bounded loops (which LLVM unrolls into registers)
// read more plainly than iterators here.
#![allow(clippy::needless_range_loop)]

use crate::device::{
    block_dim_x, block_idx_x, block_idx_y, cp_async_16, cp_async_commit, cp_async_wait_all,
    cp_async_wait_group_1, dynamic_shared_mem, exp2_fast, grid_dim_x, ldmatrix_x4_b16,
    ldmatrix_x4_trans_b16, mma_m16n8k16, shfl_xor_f32, st_shared_v4, sync_threads, thread_idx_x,
    SmemAddr,
};
use crate::Storage;

/// Query rows per warp (the M of `mma.m16n8k16`).
pub const WARP_ROWS: usize = 16;
/// Row padding of the shared K/V tiles, elements (16 bytes).
const PAD: usize = 8;
/// Largest head size (the register arrays are sized for it).
const MAX_D: usize = 256;
/// Largest KV tile.
const MAX_BC: usize = 64;

/// Tokens per KV tile for head size `d`: 64, or 32 at head sizes above 128 (keeps the
/// K and V tiles at 34 KB of shared memory and the S tile at 16 registers).
pub const fn kv_tile(d: usize) -> usize {
    if d <= 128 {
        64
    } else {
        32
    }
}

/// Dynamic shared memory of [`prefill_attention_mma`] at head size `d` with 16-bit
/// elements: the K and V tiles.
pub const fn shared_bytes(d: usize) -> u32 {
    (2 * kv_tile(d) * (d + PAD) * 2) as u32
}

/// The tile a block serves.
struct Tile {
    seq: usize,
    /// First query token of the sequence in the concatenated batch.
    q_start: usize,
    /// First row of the tile within the sequence's queries.
    i0: usize,
    /// Query rows in the tile.
    rows: usize,
    /// Position of the tile's first row.
    pos0: usize,
}

/// Maps `block_idx_y` to (sequence, tile), sequences in order, each sequence's tiles last
/// first. `None` past the last tile.
///
/// # Safety
/// `query_start_loc` holds `num_seqs + 1` non-decreasing entries; `context_lens`
/// `num_seqs`, each at least the sequence's query count.
#[inline(always)]
unsafe fn find_tile(
    query_start_loc: *const u32,
    context_lens: *const u32,
    num_seqs: u32,
    br: usize,
) -> Option<Tile> {
    let mut y = block_idx_y() as usize;
    // SAFETY: per the function contract.
    unsafe {
        for s in 0..num_seqs as usize {
            let q_start = *query_start_loc.add(s) as usize;
            let q_len = *query_start_loc.add(s + 1) as usize - q_start;
            let n = q_len.div_ceil(br);
            if y < n {
                let i0 = (n - 1 - y) * br;
                let ctx = *context_lens.add(s) as usize;
                return Some(Tile {
                    seq: s,
                    q_start,
                    i0,
                    rows: (q_len - i0).min(br),
                    pos0: ctx - q_len + i0,
                });
            }
            y -= n;
        }
    }
    None
}

/// Two `f32` narrowed to `T` and packed (first in the low half).
#[inline(always)]
fn pack2<T: Storage>(lo: f32, hi: f32) -> u32 {
    T::to_bits_u32(lo) | (T::to_bits_u32(hi) << 16)
}

/// Where a block finds its tokens in the caches.
struct Kv {
    block_table: *const u32,
    block_size: usize,
    num_kv_heads: usize,
    kv_head: usize,
}

/// Starts copying tokens `t0 .. t0 + BC` of one cache (K or V) into the shared tile
/// `dst` (row stride `D + PAD`) with 16-byte `cp.async` copies (all of a thread's copies
/// in flight at once, no registers), zeros for tokens at or past `kv_end`, and commits
/// them as one group. All threads of the block take part; the caller waits for the group
/// and then `sync_threads` before the tile is read.
///
/// # Safety
/// The block table covers tokens below `kv_end`; `dst` holds `BC * (D + PAD)` elements,
/// 16-byte aligned, not read by any thread until the wait and barrier.
#[inline(always)]
unsafe fn stage<T: Storage, const D: usize>(
    kv: &Kv,
    cache: *const T,
    t0: usize,
    kv_end: usize,
    dst: *mut T,
) {
    let bc = kv_tile(D);
    let vecs_per_row = D / T::VEC;
    let total = bc * vecs_per_row;
    let mut v = thread_idx_x() as usize;
    while v < total {
        let (tok, c) = (v / vecs_per_row, v % vecs_per_row);
        let key = t0 + tok;
        let to = dst.wrapping_add(tok * (D + PAD) + c * T::VEC);
        // SAFETY: per the function contract; rows are 16-byte multiples (D % 16 == 0).
        unsafe {
            if key < kv_end {
                let blk = *kv.block_table.add(key / kv.block_size) as usize;
                let off = ((blk * kv.block_size + key % kv.block_size) * kv.num_kv_heads
                    + kv.kv_head)
                    * D
                    + c * T::VEC;
                cp_async_16(SmemAddr::of(to), cache.add(off).cast());
            } else {
                st_shared_v4(to.cast(), [0; 4]);
            }
        }
        v += block_dim_x() as usize;
    }
    cp_async_commit();
}

/// Whether the Q fragments stay in registers for the whole block: up to head 128. At
/// head 256 they (64 registers) plus O (128) do not fit in 255 without spills, so they
/// are reloaded from global memory (L1) for every KV tile.
const fn q_in_regs(d: usize) -> bool {
    d <= 128
}

/// The A fragment of Q for the 16-column step `kk`: rows g / g + 8 (element offsets
/// `q_rows`, `None` for rows past the tile: zeros), columns `16 kk + 2t ..` and
/// `16 kk + 8 + 2t ..`.
///
/// # Safety
/// `q_rows` are offsets of rows of `D` readable elements of `q`, 4-byte aligned.
#[inline(always)]
unsafe fn q_fragment<T: Storage>(
    q: *const T,
    q_rows: [Option<usize>; 2],
    kk: usize,
    t: usize,
) -> [u32; 4] {
    let mut a = [0u32; 4];
    for i in 0..4 {
        if let Some(off) = q_rows[i % 2] {
            let col = 16 * kk + 8 * (i / 2) + 2 * t;
            // SAFETY: per the function contract; `col` is even: 4-byte aligned.
            a[i] = unsafe { *q.add(off + col).cast::<u32>() };
        }
    }
    a
}

/// One warp's FlashAttention-2 state: O fragments (`D / 8` tiles of 16 x 8), the running
/// max of rows `g` and `g + 8` (log2 domain) and this lane's partial row sums.
struct State {
    o: [[f32; 4]; MAX_D / 8],
    m: [f32; 2],
    l: [f32; 2],
}

/// `S = Q K^T` for the warp's 16 rows and the tile's BC keys (`BC / 8` C fragments).
///
/// # Safety
/// Full warp; `ks` is the staged K tile.
#[inline(always)]
unsafe fn scores<T: Storage, const D: usize>(
    qf: &[[u32; 4]; MAX_D / 16],
    q: *const T,
    q_rows: [Option<usize>; 2],
    ks: SmemAddr,
    lane: usize,
) -> [[f32; 4]; MAX_BC / 8] {
    let bc = kv_tile(D);
    let mut s = [[0.0f32; 4]; MAX_BC / 8];
    let (mat, r) = (lane / 8, lane % 8);
    // Matrices of one ldmatrix: (n-tile j, d lo), (j, d hi), (j + 1, d lo), (j + 1, d hi).
    let row = ks.offset(2 * ((8 * (mat / 2) + r) * (D + PAD) + 8 * (mat % 2)));
    for kk in 0..D / 16 {
        let a = if q_in_regs(D) {
            qf[kk]
        } else {
            // SAFETY: as in the kernel's preload.
            unsafe { q_fragment(q, q_rows, kk, lane % 4) }
        };
        let mut j = 0;
        while j < bc / 8 {
            let at = row.offset(2 * (8 * j * (D + PAD) + 16 * kk));
            // SAFETY: per the function contract; 16-byte aligned rows of the tile.
            let b = unsafe { ldmatrix_x4_b16(at) };
            s[j] = mma_m16n8k16::<T>(a, [b[0], b[1]], s[j]);
            s[j + 1] = mma_m16n8k16::<T>(a, [b[2], b[3]], s[j + 1]);
            j += 2;
        }
    }
    s
}

/// Masks and scales `s` (to the log2 domain), updates the online softmax of the lane's
/// two rows, rescales O, and returns P (unnormalised, in `s`'s layout). Row `h` sees the
/// keys `max(0, pos[h] + 1 - window) ..= pos[h]` (`window` 0: `0 ..= pos[h]`).
///
/// The mask is computed in the lane's key offsets: score `(j, i)` holds key `t0 + 2t +
/// o` with the constant `o = 8j + (i & 1)`, so each row's visible keys become one range
/// `lo < o <= hi` of small `i32`s, set once per tile, and every score is tested against
/// two immediates.
#[inline(always)]
fn softmax_update<const D: usize>(
    st: &mut State,
    s: &mut [[f32; 4]; MAX_BC / 8],
    t0: usize,
    pos: [usize; 2],
    window: u32,
    scale_log2: f32,
    lane: usize,
) {
    let bc = kv_tile(D);
    let t = lane % 4;
    let base = (t0 + 2 * t) as i64;
    let (mut lo, mut hi) = ([0i32; 2], [0i32; 2]);
    for h in 0..2 {
        // Clamped to -1 ..= MAX_BC, past every offset of the tile on either side.
        let top = pos[h] as i64 - base;
        hi[h] = top.clamp(-1, MAX_BC as i64) as i32;
        lo[h] = if window == 0 {
            -1
        } else {
            (top - window as i64).clamp(-1, MAX_BC as i64) as i32
        };
    }
    let mut mx = [f32::NEG_INFINITY; 2];
    for j in 0..bc / 8 {
        for i in 0..4 {
            let o = (8 * j + (i & 1)) as i32;
            let h = i / 2;
            let x = if lo[h] < o && o <= hi[h] {
                s[j][i] * scale_log2
            } else {
                f32::NEG_INFINITY
            };
            s[j][i] = x;
            mx[h] = mx[h].max(x);
        }
    }
    let mut alpha = [0.0f32; 2];
    for h in 0..2 {
        mx[h] = mx[h].max(shfl_xor_f32(mx[h], 1));
        mx[h] = mx[h].max(shfl_xor_f32(mx[h], 2));
        // `m` starts at f32::MIN, finite and below every score, so `m_new` is finite
        // even for a row that has seen no key yet (with a window, a warp's rows may
        // start in different KV tiles): its alpha is 1 (O and l are still 0) and its
        // masked scores give P = 0, never `-inf - -inf`.
        let m_new = st.m[h].max(mx[h]);
        alpha[h] = exp2_fast(st.m[h] - m_new);
        st.m[h] = m_new;
    }
    let mut sum = [0.0f32; 2];
    for j in 0..bc / 8 {
        for i in 0..4 {
            let p = exp2_fast(s[j][i] - st.m[i / 2]);
            s[j][i] = p;
            sum[i / 2] += p;
        }
    }
    for h in 0..2 {
        st.l[h] = st.l[h] * alpha[h] + sum[h];
    }
    for n in 0..D / 8 {
        for i in 0..4 {
            st.o[n][i] *= alpha[i / 2];
        }
    }
}

/// `O += P V` over the tile: P from registers (C layout of n-tiles `2k, 2k + 1` = A layout
/// of k-step `k`), V fragments by `ldmatrix.x4.trans`.
///
/// # Safety
/// Full warp; `vs` is the staged V tile.
#[inline(always)]
unsafe fn accumulate_pv<T: Storage, const D: usize>(
    st: &mut State,
    p: &[[f32; 4]; MAX_BC / 8],
    vs: SmemAddr,
    lane: usize,
) {
    let bc = kv_tile(D);
    let (mat, r) = (lane / 8, lane % 8);
    for k in 0..bc / 16 {
        let a = [
            pack2::<T>(p[2 * k][0], p[2 * k][1]),
            pack2::<T>(p[2 * k][2], p[2 * k][3]),
            pack2::<T>(p[2 * k + 1][0], p[2 * k + 1][1]),
            pack2::<T>(p[2 * k + 1][2], p[2 * k + 1][3]),
        ];
        // Matrices: (keys lo, d-tile n), (keys hi, n), (keys lo, n + 1), (keys hi, n + 1).
        let row = vs.offset(2 * ((16 * k + 8 * (mat % 2) + r) * (D + PAD) + 8 * (mat / 2)));
        let mut n = 0;
        while n < D / 8 {
            // SAFETY: per the function contract; 16-byte aligned rows of the tile.
            let b = unsafe { ldmatrix_x4_trans_b16(row.offset(2 * 8 * n)) };
            st.o[n] = mma_m16n8k16::<T>(a, [b[0], b[1]], st.o[n]);
            st.o[n + 1] = mma_m16n8k16::<T>(a, [b[2], b[3]], st.o[n + 1]);
            n += 2;
        }
    }
}

/// Prefill / chunked-prefill attention on tensor cores; same problem and arguments as
/// [`crate::attention::prefill_attention`] (see the module docs for the mapping).
///
/// Query tokens of all sequences are concatenated: sequence `s` owns query rows
/// `query_start_loc[s] .. query_start_loc[s + 1]`, its last tokens, so query row `i`
/// of `s` sits at position `context_lens[s] - q_len + i` and attends to cached tokens
/// `0..=position`, or with a sliding window (`window > 0`) to `max(0, position + 1 -
/// window) ..= position`. K/V of the new tokens must already be in the cache.
///
/// # Safety
/// `T` is `bf16` or `f16`, `D % 16 == 0` and `D <= 256`; launched with
/// [`crate::launch::prefill_mma`] (a block of whole warps, dynamic shared memory of
/// [`shared_bytes`]`(D)`); `out`, `q`: `[num_tokens, num_heads, D]` (4-byte aligned);
/// caches `[num_blocks, block_size, num_kv_heads, D]` (16-byte aligned); `block_tables`
/// `[num_seqs, max_blocks_per_seq]` covering each context; `query_start_loc`:
/// `[num_seqs + 1]` from 0, non-decreasing; `q_len <= context_len` for every sequence;
/// `num_kv_heads` divides `num_heads`. Table entries before a tile's window are not read.
pub unsafe fn prefill_attention_mma<T: Storage, const D: usize>(
    out: *mut T,
    q: *const T,
    k_cache: *const T,
    v_cache: *const T,
    block_tables: *const u32,
    context_lens: *const u32,
    query_start_loc: *const u32,
    num_seqs: u32,
    num_kv_heads: u32,
    scale: f32,
    block_size: u32,
    max_blocks_per_seq: u32,
    window: u32,
) {
    const { assert!(D.is_multiple_of(16) && D <= MAX_D && core::mem::size_of::<T>() == 2) };
    let warps = block_dim_x() as usize / 32;
    let br = WARP_ROWS * warps;
    let (head, num_heads) = (block_idx_x() as usize, grid_dim_x() as usize);
    // SAFETY: per the function contract.
    let Some(tile) = (unsafe { find_tile(query_start_loc, context_lens, num_seqs, br) }) else {
        return;
    };
    let (warp, lane) = (thread_idx_x() as usize / 32, thread_idx_x() as usize % 32);
    let (g, t) = (lane / 4, lane % 4);
    let row0 = WARP_ROWS * warp;
    let rows_lh = [row0 + g, row0 + g + 8];
    let pos = [tile.pos0 + rows_lh[0], tile.pos0 + rows_lh[1]];
    let warp_active = row0 < tile.rows;
    let warp_last = tile.pos0 + (row0 + WARP_ROWS).min(tile.rows) - 1;
    // Keys the tile sees: from its first row's first key (0 without a window) to its
    // last row's position. KV tiles are cut from `kv_lo`, so none lies wholly before
    // the window. A warp computes every KV tile from there (its rows start at most 48
    // keys later: at BC 64 that is always the first tile, at BC 32 warps 2 and 3 may
    // compute one tile wholly before their rows' windows, masked); a per-warp start
    // test cost 3-4 registers for that one tile.
    let kv_lo = crate::decode::window_start(tile.pos0 + 1, window);
    let kv_end = tile.pos0 + tile.rows;
    let q_row = |r: usize| (tile.q_start + tile.i0 + r) * num_heads + head;

    // Q rows g / g + 8 of the warp (None: past the tile) and their A fragments, kept
    // in registers up to head 128 (above, reloaded per KV tile: see `Q_IN_REGS`).
    let q_rows = [0, 1].map(|h| (rows_lh[h] < tile.rows).then(|| q_row(rows_lh[h]) * D));
    let mut qf = [[0u32; 4]; MAX_D / 16];
    if q_in_regs(D) {
        for kk in 0..D / 16 {
            // SAFETY: rows of this tile; see `q_fragment`.
            qf[kk] = unsafe { q_fragment(q, q_rows, kk, t) };
        }
    }
    let kv = Kv {
        // SAFETY: per the function contract.
        block_table: unsafe { block_tables.add(tile.seq * max_blocks_per_seq as usize) },
        block_size: block_size as usize,
        num_kv_heads: num_kv_heads as usize,
        kv_head: head / (num_heads / num_kv_heads as usize),
    };
    let ks = dynamic_shared_mem() as *mut T;
    let bc = kv_tile(D);
    let vs = ks.wrapping_add(bc * (D + PAD));
    let mut st = State {
        o: [[0.0; 4]; MAX_D / 8],
        // Finite (see `softmax_update`): the first key of a row rescales by exp2(MIN - m) = 0.
        m: [f32::MIN; 2],
        l: [0.0; 2],
    };
    let scale_log2 = scale * core::f32::consts::LOG2_E;
    // FlashAttention-2's pipeline over single K and V tiles: the copy of V(k) runs
    // during S = Q K(k)^T and the copy of K(k + 1) during O += P V(k).
    // SAFETY: the block table covers keys below kv_end <= context_len; no thread reads
    // a tile before the wait and barrier that follow its copy.
    unsafe { stage::<T, D>(&kv, k_cache, kv_lo, kv_end, ks) };
    let mut t0 = kv_lo;
    while t0 < kv_end {
        let compute = warp_active && t0 <= warp_last;
        sync_threads(); // PV of the previous tile has finished reading V.
                        // SAFETY: as for the first K tile; V is not read until the barrier before PV.
        unsafe { stage::<T, D>(&kv, v_cache, t0, kv_end, vs) };
        cp_async_wait_group_1(); // K(t0) has landed (V(t0) may still be in flight).
        sync_threads();
        let mut s = [[0.0f32; 4]; MAX_BC / 8];
        if compute {
            // SAFETY: full warp (warp-uniform condition); K staged and waited for.
            // The tile's fragment addresses are derived inside the loop (not hoisted
            // out of it and kept live in registers).
            unsafe {
                s = scores::<T, D>(&qf, q, q_rows, SmemAddr::of(ks).opaque(), lane);
            }
            softmax_update::<D>(&mut st, &mut s, t0, pos, window, scale_log2, lane);
        }
        sync_threads(); // Every warp has finished reading K.
        if t0 + bc < kv_end {
            // SAFETY: as for the first K tile; every warp finished reading K above.
            unsafe { stage::<T, D>(&kv, k_cache, t0 + bc, kv_end, ks) };
            cp_async_wait_group_1(); // V(t0) has landed.
        } else {
            cp_async_wait_all();
        }
        sync_threads();
        if compute {
            // SAFETY: full warp; V staged and waited for.
            unsafe { accumulate_pv::<T, D>(&mut st, &s, SmemAddr::of(vs).opaque(), lane) };
        }
        t0 += bc;
    }
    if !warp_active {
        return;
    }
    let mut inv = [0.0f32; 2];
    for h in 0..2 {
        let mut l = st.l[h];
        l += shfl_xor_f32(l, 1);
        l += shfl_xor_f32(l, 2);
        inv[h] = 1.0 / l;
    }
    for h in 0..2 {
        let r = rows_lh[h];
        if r < tile.rows {
            for n in 0..D / 8 {
                let v = pack2::<T>(st.o[n][2 * h] * inv[h], st.o[n][2 * h + 1] * inv[h]);
                // SAFETY: row `r` is this block's to write; the pair is 4-byte aligned.
                unsafe { *out.add(q_row(r) * D + 8 * n + 2 * t).cast::<u32>() = v };
            }
        }
    }
}
