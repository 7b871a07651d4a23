//! Paged attention: the split-K reduce of decode (the decode kernels are in
//! [`crate::decode`]) and prefill / chunked prefill, all reading K and V through the
//! block table.
//!
//! KV cache layout (shared with the CPU backend): `[num_blocks, block_size,
//! num_kv_heads, head_dim]`, so token `t` of a sequence lives in physical block
//! `block_table[t / block_size]` at slot `t % block_size`. GQA/MQA: query head `h`
//! reads KV head `h / (num_heads / num_kv_heads)`.
//!
//! Thread mapping (one block per (query head, sequence) or (query head, query token),
//! any 1-D block of `32 * w` threads):
//! 1. the scaled query is staged in static shared memory (`f32[head_dim]`);
//! 2. warp `w` computes the logits of tokens `w, w + warps, ...`: the lanes split the
//!    head dimension (coalesced reads of one K row), a butterfly reduction adds up;
//! 3. block max and block sum of `exp` (warp shuffles, then one shared slot per warp);
//! 4. thread `i` accumulates output dims `i, i + threads, ...` over all tokens
//!    (coalesced reads of V rows).
//!
//! Shared memory: `f32[256]` static (query) + `f32[32]` static (reductions) + dynamic
//! `f32[tokens]` (logits: the context length, or the partition size for split-K).
//! Work per block O(tokens * head_dim); accumulation in `f32`.

use crate::device::{
    block_dim_x, block_idx_x, block_idx_y, dynamic_shared_mem, exp_fast, grid_dim_x, lane_id,
    sync_threads, thread_idx_x, warp_id,
};
use crate::reduce::{block_max, block_sum, warp_sum};
use crate::Storage;

/// Largest supported head size (the static query stage is sized for it).
pub const MAX_HEAD_DIM: usize = 256;
/// Head sizes the entry points are instantiated for.
pub const HEAD_SIZES: [usize; 6] = [16, 64, 80, 96, 128, 256];

/// Where one attention problem reads its K/V.
#[derive(Clone, Copy)]
struct KvView<T> {
    k_cache: *const T,
    v_cache: *const T,
    block_table: *const u32,
    kv_head: usize,
    num_kv_heads: usize,
    block_size: usize,
}

impl<T> KvView<T> {
    /// Element offset of token `t`'s row for this KV head.
    ///
    /// # Safety
    /// `t / block_size` must be inside the sequence's block table.
    #[inline(always)]
    unsafe fn row(&self, t: usize, head_dim: usize) -> usize {
        // SAFETY: guaranteed by the caller.
        let blk = unsafe { *self.block_table.add(t / self.block_size) } as usize;
        ((blk * self.block_size + t % self.block_size) * self.num_kv_heads + self.kv_head)
            * head_dim
    }
}

/// Softmax attention of one query row over tokens `start..end` (non-empty) of one
/// sequence. Calls `emit(d, acc, sum)` for each output dim owned by the thread, with
/// `acc` the un-normalised weighted sum of V and `sum` the softmax denominator; returns
/// `(max logit, sum of exp)`.
///
/// # Safety
/// Block-uniform call; `q` points at `D` elements; the block table covers `end`
/// tokens; dynamic shared memory holds `end - start` floats.
#[inline(always)]
unsafe fn attend<T: Storage, const D: usize>(
    q: *const T,
    kv: KvView<T>,
    start: usize,
    end: usize,
    scale: f32,
    mut emit: impl FnMut(usize, f32, f32),
) -> (f32, f32) {
    let tid = thread_idx_x() as usize;
    let threads = block_dim_x() as usize;
    let (lane, warp, warps) = (lane_id() as usize, warp_id() as usize, threads / 32);
    let qs = crate::shared_array!(GK_ATTN_Q: [f32; 256]);
    let logits = dynamic_shared_mem() as *mut f32;
    let n = end - start;
    // SAFETY: all indices are within the sizes stated in the function contract; shared
    // arrays are written and read on opposite sides of `sync_threads`.
    unsafe {
        let mut d = tid;
        while d < D {
            *qs.add(d) = (*q.add(d)).to_f32() * scale;
            d += threads;
        }
        sync_threads();
        let mut t = warp;
        while t < n {
            let k = kv.k_cache.add(kv.row(start + t, D));
            let mut dot = 0.0f32;
            let mut d = lane;
            while d < D {
                dot += *qs.add(d) * (*k.add(d)).to_f32();
                d += 32;
            }
            let dot = warp_sum(dot);
            if lane == 0 {
                *logits.add(t) = dot;
            }
            t += warps;
        }
        sync_threads();
        let mut m = f32::NEG_INFINITY;
        let mut i = tid;
        while i < n {
            m = m.max(*logits.add(i));
            i += threads;
        }
        let m = block_max(m);
        let mut s = 0.0f32;
        let mut i = tid;
        while i < n {
            let e = exp_fast(*logits.add(i) - m);
            *logits.add(i) = e;
            s += e;
            i += threads;
        }
        // `block_sum` ends with a barrier, so every exp is visible below.
        let s = block_sum(s);
        let mut d = tid;
        while d < D {
            let mut acc = 0.0f32;
            for t in 0..n {
                let v = kv.v_cache.add(kv.row(start + t, D));
                acc += *logits.add(t) * (*v.add(d)).to_f32();
            }
            emit(d, acc, s);
            d += threads;
        }
        (m, s)
    }
}

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
/// `w_p = exp_sums[p] * exp(max_logits[p] - max_p max_logits)`.
///
/// Grid (num_heads, num_seqs), no shared memory; thread `i` owns dims `i, i + threads..`
/// and reads the O(partitions) weights itself. A zero-length context yields zeros.
///
/// # Safety
/// Buffers as written by [`crate::decode::paged_attention_v2`] with the same `partition_size` and
/// `max_partitions`; `out` is `[num_seqs, num_heads, D]`.
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
    // SAFETY: per the function contract; only the first `parts` partitions were written.
    unsafe {
        let ctx = *context_lens.add(seq);
        let parts = ctx.div_ceil(partition_size) as usize;
        let base = row * max_partitions as usize;
        if parts == 0 {
            write_zeros(out.add(row * D), D);
            return;
        }
        let mut m = f32::NEG_INFINITY;
        for p in 0..parts {
            m = m.max(*max_logits.add(base + p));
        }
        let mut total = 0.0f32;
        for p in 0..parts {
            total += *exp_sums.add(base + p) * exp_fast(*max_logits.add(base + p) - m);
        }
        let mut d = thread_idx_x() as usize;
        while d < D {
            let mut acc = 0.0f32;
            for p in 0..parts {
                let w = *exp_sums.add(base + p) * exp_fast(*max_logits.add(base + p) - m);
                acc += w * *tmp_out.add((base + p) * D + d);
            }
            *out.add(row * D + d) = T::from_f32(acc / total);
            d += block_dim_x() as usize;
        }
    }
}

/// Prefill / chunked-prefill attention over variable-length sequences in one launch.
///
/// Query tokens of all sequences are concatenated: sequence `s` owns query rows
/// `query_start_loc[s] .. query_start_loc[s + 1]`, which are its last tokens, so query
/// row `i` of `s` sits at position `context_lens[s] - q_len + i` and attends (causal mask)
/// to cached tokens `0..=position`, the cached prefix included. K/V of the new tokens
/// must already be in the cache (`reshape_and_cache` first). One block per (head, query
/// token); the owning sequence is found by binary search over `query_start_loc`.
///
/// Grid (num_heads, num_tokens); see [`crate::launch::prefill_attention`]. `out`, `q`:
/// `[num_tokens, num_heads, D]`; `query_start_loc`: `[num_seqs + 1]`, starting at 0 and
/// non-decreasing; other shapes as [`crate::decode::paged_attention_v1`].
///
/// # Safety
/// As [`crate::decode::paged_attention_v1`], plus `q_len <= context_len` for every sequence.
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
        let ctx = *context_lens.add(seq);
        let pos = (ctx - q_len + (tok - q_start)) as usize;
        let kv = KvView {
            k_cache,
            v_cache,
            block_table: block_tables.add(seq * max_blocks_per_seq as usize),
            kv_head: head / (num_heads / num_kv_heads as usize),
            num_kv_heads: num_kv_heads as usize,
            block_size: block_size as usize,
        };
        let row = (tok as usize * num_heads + head) * D;
        let o = out.add(row);
        attend::<T, D>(q.add(row), kv, 0, pos + 1, scale, |d, acc, sum| {
            *o.add(d) = T::from_f32(acc / sum)
        });
    }
}
