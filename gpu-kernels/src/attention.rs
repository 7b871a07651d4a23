//! Paged attention: the split-K reduce of decode (the decode kernels are in
//! [`crate::decode`]) and prefill / chunked prefill, all reading K and V through the
//! block table.
//!
//! KV cache layout (shared with the CPU backend): `[num_blocks, block_size,
//! num_kv_heads, head_dim]`, so token `t` of a sequence lives in physical block
//! `block_table[t / block_size]` at slot `t % block_size`. GQA/MQA: query head `h`
//! reads KV head `h / (num_heads / num_kv_heads)`.
//!
//! The split-K reduce: one block per (query head, sequence), thread `i` owns output dims
//! `i, i + threads, ...` and reads the O(partitions) weights itself; no shared memory.
//! Partitions that hold no attended token (a sliding window shorter than the context)
//! come with max logit `-inf` and sum 0 and add nothing.
//! Prefill runs the streaming kernel of [`crate::decode`] per (query head, query token);
//! nothing in shared memory grows with the context. Both decode and prefill take a
//! sliding window (`window > 0`: a query at position `p` sees keys `max(0, p + 1 -
//! window) ..= p`; 0: plain causal attention).

use crate::device::{block_dim_x, block_idx_x, block_idx_y, exp_fast, grid_dim_x, thread_idx_x};
use crate::Storage;

/// Largest supported head size (the static query stage is sized for it).
pub const MAX_HEAD_DIM: usize = 256;
/// Head sizes the entry points are instantiated for.
pub const HEAD_SIZES: [usize; 6] = [16, 64, 80, 96, 128, 256];

#[inline(always)]
unsafe fn write_zeros<T: Storage>(p: *mut T, n: usize) {
    let mut d = thread_idx_x() as usize;
    while d < n {
        // SAFETY: the caller passes `n` writable elements.
        unsafe { *p.add(d) = T::from_f32(0.0) };
        d += block_dim_x() as usize;
    }
}

/// Split-K reduce: combines the partitions of [`crate::decode::paged_attention_v2`] into
/// `out[s, h] = sum_p w_p * tmp_out[s, h, p] / sum_p w_p`, with
/// `w_p = exp_sums[p] * exp(max_logits[p] - max_p max_logits)`, over the partitions
/// `p < min(ceil(context_len / partition_size), max_partitions)`. A partition with max
/// logit `-inf` (no attended token: before a sliding window's end, see
/// [`crate::decode::paged_attention_v2`]) has weight 0 and its `tmp_out` is not read,
/// so it adds nothing and no NaN.
///
/// Grid (num_heads, num_seqs), no shared memory; thread `i` owns dims `i, i + threads..`
/// and reads the O(partitions) weights itself. A zero-length context (or, which v2 never
/// writes, only empty partitions) yields zeros.
///
/// # Safety
/// Buffers as written by [`crate::decode::paged_attention_v2`] with the same `partition_size` and
/// `max_partitions` (its grid's z); `out` is `[num_seqs, num_heads, D]`.
pub unsafe fn paged_attention_v2_reduce<T: Storage, const D: usize>(
    out: *mut T,
    tmp_out: *const f32,
    max_logits: *const f32,
    exp_sums: *const f32,
    context_lens: *const u32,
    partition_size: u32,
    max_partitions: u32,
) {
    let (head, seq, num_heads) = (
        block_idx_x() as usize,
        block_idx_y() as usize,
        grid_dim_x() as usize,
    );
    let row = seq * num_heads + head;
    // SAFETY: per the function contract; only the first `parts` partitions were written
    // (with a window, v2's grid may hold fewer than ceil(context_len / partition_size)).
    unsafe {
        let ctx = *context_lens.add(seq);
        let parts = ctx.div_ceil(partition_size).min(max_partitions) as usize;
        let base = row * max_partitions as usize;
        let mut m = f32::NEG_INFINITY;
        for p in 0..parts {
            m = m.max(*max_logits.add(base + p));
        }
        if m == f32::NEG_INFINITY {
            // No partition (zero-length context), or none with a token.
            write_zeros(out.add(row * D), D);
            return;
        }
        // An empty partition's weight: 0 * exp(-inf) = 0.
        let mut total = 0.0f32;
        for p in 0..parts {
            total += *exp_sums.add(base + p) * exp_fast(*max_logits.add(base + p) - m);
        }
        let mut d = thread_idx_x() as usize;
        while d < D {
            let mut acc = 0.0f32;
            for p in 0..parts {
                let ml = *max_logits.add(base + p);
                if ml == f32::NEG_INFINITY {
                    // Empty: its partial output was never written.
                    continue;
                }
                let w = *exp_sums.add(base + p) * exp_fast(ml - m);
                acc += w * *tmp_out.add((base + p) * D + d);
            }
            *out.add(row * D + d) = T::from_f32(acc / total);
            d += block_dim_x() as usize;
        }
    }
}

/// Query rows of one sequence that one prefill block serves (each K/V vector it streams
/// is used by all of them).
pub const PREFILL_TILE: usize = crate::decode::MAX_GROUP;

/// Prefill / chunked-prefill attention over variable-length sequences in one launch.
///
/// Query tokens of all sequences are concatenated: sequence `s` owns query rows
/// `query_start_loc[s] .. query_start_loc[s + 1]`, which are its last tokens, so query
/// row `i` of `s` sits at position `context_lens[s] - q_len + i` and attends (causal mask)
/// to cached tokens `0..=position`, the cached prefix included, or with a sliding window
/// (`window > 0`) to `max(0, position + 1 - window) ..= position`. K/V of the new tokens
/// must already be in the cache (`reshape_and_cache` first). Decode tokens of a mixed
/// batch are sequences with one query row. Grid (head, query token); the owning sequence
/// is found by binary search over `query_start_loc`, and the block of every
/// [`PREFILL_TILE`]-th query row of a sequence serves that row and the next ones (up to
/// `PREFILL_TILE`), the other blocks return at once.
///
/// Thread mapping: the streaming kernel of [`crate::decode`] with the tile's query rows in
/// place of a GQA group's heads (16-byte K/V loads, warps over whole KV blocks, online
/// softmax in registers, causal and window mask per row in one compare, one cross-warp
/// merge), so nothing in shared memory grows with the context: any context length runs.
/// With a window the tile's token range starts at its first row's first key: KV blocks
/// wholly before it are never read, the rest is masked per (row, token). Cost: K/V bytes
/// `2 * sum over tiles of n_tile * head_dim * sizeof(T)` per head, `n_tile` the tile's
/// keys (`last position + 1`, or at most `window + PREFILL_TILE - 1` with a window), i.e.
/// `1 / PREFILL_TILE` of one read per query row; FLOPs `4 * sum(keys per row) * num_heads
/// * head_dim` on CUDA cores. The tensor-core kernel is [`crate::prefill_mma`].
///
/// Grid (num_heads, num_tokens); see [`crate::launch::prefill_attention`]. `out`, `q`:
/// `[num_tokens, num_heads, D]`; `query_start_loc`: `[num_seqs + 1]`, starting at 0 and
/// non-decreasing; other shapes as [`crate::decode::paged_attention_v1`].
///
/// # Safety
/// As [`crate::decode::paged_attention_v1`] (dynamic shared memory of
/// [`crate::launch::decode_shared_bytes`]`(D, threads)`; table entries before a tile's
/// window are not read), plus `q_len <= context_len` for every sequence.
pub unsafe fn prefill_attention<T: Storage, const D: usize>(
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
    let (head, tok, num_heads) = (block_idx_x() as usize, block_idx_y(), grid_dim_x() as usize);
    // SAFETY: per the function contract.
    unsafe {
        // Last sequence whose start is <= tok.
        let (mut lo, mut hi) = (0u32, num_seqs);
        while hi - lo > 1 {
            let mid = (lo + hi) / 2;
            if *query_start_loc.add(mid as usize) <= tok {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        let seq = lo as usize;
        let q_start = *query_start_loc.add(seq);
        let q_len = *query_start_loc.add(seq + 1) - q_start;
        let i = tok - q_start;
        // The block of the tile's first row serves the tile; the others have nothing to do.
        if !i.is_multiple_of(PREFILL_TILE as u32) {
            return;
        }
        let rows = (q_len - i).min(PREFILL_TILE as u32) as usize;
        let ctx = *context_lens.add(seq);
        let pos = (ctx - q_len + i) as usize;
        let kv_head = head / (num_heads / num_kv_heads as usize);
        let row = (tok as usize * num_heads + head) * D;
        let w = crate::decode::Work {
            q: q.add(row),
            q_stride: num_heads * D,
            causal: pos,
            span: crate::decode::window_span(window),
            k_cache,
            v_cache,
            block_table: block_tables.add(seq * max_blocks_per_seq as usize),
            num_kv_heads: num_kv_heads as usize,
            kv_head,
            block_size: block_size as usize,
            head0: head,
            hpb: rows,
        };
        let o = out.add(row);
        // Row 0's first key: the tile's lowest (KV blocks before it are skipped).
        let start = crate::decode::window_start(pos + 1, window);
        crate::decode::attend_group::<T, D, true>(w, start, pos + rows, scale, |r, d, v, _, _| {
            *o.add(r * num_heads * D + d) = T::from_f32(v)
        });
    }
}
