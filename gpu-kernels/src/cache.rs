//! KV-cache writes: `reshape_and_cache` (new K and V into their slots, fused) and
//! `copy_blocks` (copy-on-write block copies, every layer, one launch).
//!
//! Cache layout `[num_blocks, block_size, num_kv_heads, head_dim]`: slot
//! `s = block * block_size + offset` is a contiguous row of `num_kv_heads * head_dim`
//! elements starting at `s * num_kv_heads * head_dim`.

use crate::device::{block_dim_x, block_idx_x, block_idx_y, thread_idx_x};
use crate::Storage;

/// Writes token `t`'s key and value rows (`[num_kv_heads, head_dim]` each) to cache
/// slot `slot_mapping[t]` of both caches.
///
/// Thread mapping: one block per token (grid x), thread `i` copies elements
/// `i, i + threads, ...` of the row (coalesced). No shared memory. O(row) per block.
/// `key_stride` / `value_stride` are the element distances between consecutive tokens
/// of `key` / `value` (`num_kv_heads * head_dim` when contiguous; larger for a view into
/// a fused QKV buffer).
///
/// # Safety
/// `key`, `value` hold `num_tokens` rows at their strides; every slot is
/// `< num_blocks * block_size` of both caches; no two tokens share a slot.
pub unsafe fn reshape_and_cache<T: Storage>(
    key: *const T,
    value: *const T,
    k_cache: *mut T,
    v_cache: *mut T,
    slot_mapping: *const u32,
    num_kv_heads: u32,
    head_dim: u32,
    key_stride: u32,
    value_stride: u32,
) {
    let t = block_idx_x() as usize;
    let n = (num_kv_heads * head_dim) as usize;
    // SAFETY: per the function contract.
    unsafe {
        let slot = *slot_mapping.add(t) as usize;
        let (src_k, src_v) = (
            key.add(t * key_stride as usize),
            value.add(t * value_stride as usize),
        );
        let (dst_k, dst_v) = (k_cache.add(slot * n), v_cache.add(slot * n));
        let mut i = thread_idx_x() as usize;
        while i < n {
            *dst_k.add(i) = *src_k.add(i);
            *dst_v.add(i) = *src_v.add(i);
            i += block_dim_x() as usize;
        }
    }
}

/// Copies whole blocks `block_mapping[2p] -> block_mapping[2p + 1]` in the key and
/// value cache of every layer.
///
/// Thread mapping: grid (layers, pairs); thread `i` copies elements `i, i + threads..`
/// of the `numel_per_block` elements of one block in K and in V. No shared memory.
/// `key_cache_ptrs` / `value_cache_ptrs` hold one device address per layer.
///
/// # Safety
/// Every address points at a cache of the same shape; every block id is in range;
/// no destination block is also a source or another pair's destination in the launch.
pub unsafe fn copy_blocks<T: Storage>(
    key_cache_ptrs: *const u64,
    value_cache_ptrs: *const u64,
    block_mapping: *const u32,
    numel_per_block: u32,
) {
    let (layer, pair) = (block_idx_x() as usize, block_idx_y() as usize);
    let n = numel_per_block as usize;
    // SAFETY: per the function contract.
    unsafe {
        let k = *key_cache_ptrs.add(layer) as usize as *mut T;
        let v = *value_cache_ptrs.add(layer) as usize as *mut T;
        let src = *block_mapping.add(2 * pair) as usize * n;
        let dst = *block_mapping.add(2 * pair + 1) as usize * n;
        let mut i = thread_idx_x() as usize;
        while i < n {
            *k.add(dst + i) = *k.add(src + i);
            *v.add(dst + i) = *v.add(src + i);
            i += block_dim_x() as usize;
        }
    }
}

/// Rotary embedding fused with the cache write, one launch instead of
/// `rotary_embedding` + `reshape_and_cache`: for token `t` at position `positions[t]`,
/// writes its rotated query heads (rotate-half form, as
/// [`crate::elementwise::rotary_embedding`]) to row `t` of `query_out`, contiguous
/// `[num_tokens, num_heads, head_dim]` (the layout the attention kernels read; `query_out
/// == query` with `query_stride == num_heads * head_dim` rotates in place), and writes its
/// rotated key heads and its value heads to cache slot `slot_mapping[t]` (the source key
/// is left unrotated: attention reads K from the cache).
///
/// Thread mapping: one block per token (grid x, [`crate::launch::per_row`]); thread `i`
/// takes items `i, i + threads, ...` of `(num_heads + num_kv_heads) * rot_dim / 2`
/// rotation pairs, then of the `num_kv_heads * head_dim` value elements, the key
/// elements past `rot_dim` and the query elements past `rot_dim` (consecutive threads,
/// consecutive addresses). No shared memory.
/// Bytes per token: `2 * (num_heads + 2 * num_kv_heads) * head_dim * sizeof(T)` plus
/// `4 * rot_dim` of cos/sin; the floor is those bytes over the copy bandwidth.
/// `*_stride`: element distance between consecutive tokens (views into a fused QKV
/// buffer allowed).
///
/// # Safety
/// `query`: `num_tokens` rows of `num_heads * head_dim` at `query_stride`; `query_out`:
/// `num_tokens * num_heads * head_dim` elements, either exactly `query` (in place, stride
/// `num_heads * head_dim`) or overlapping none of the inputs; `key`, `value`:
/// rows of `num_kv_heads * head_dim` at their strides, not overlapping `query_out`;
/// `positions[t] < max_position` of `cos_sin_cache` (`f32[max_position, rot_dim]`);
/// `rot_dim` even and `<= head_dim`; slots in range of both caches and distinct.
pub unsafe fn rotary_embedding_and_cache<T: Storage>(
    positions: *const u32,
    query: *const T,
    query_out: *mut T,
    key: *const T,
    value: *const T,
    k_cache: *mut T,
    v_cache: *mut T,
    slot_mapping: *const u32,
    cos_sin_cache: *const f32,
    num_heads: u32,
    num_kv_heads: u32,
    head_dim: u32,
    rot_dim: u32,
    query_stride: u32,
    key_stride: u32,
    value_stride: u32,
) {
    let t = block_idx_x() as usize;
    let (hd, half) = (head_dim as usize, rot_dim as usize / 2);
    let (nq, nk) = (num_heads as usize, num_kv_heads as usize);
    let threads = block_dim_x() as usize;
    // SAFETY: per the function contract; every output element is written by one thread.
    unsafe {
        let cs = cos_sin_cache.add(*positions.add(t) as usize * rot_dim as usize);
        let slot = *slot_mapping.add(t) as usize;
        let q = query.add(t * query_stride as usize);
        let qo = query_out.add(t * nq * hd);
        let k = key.add(t * key_stride as usize);
        let v = value.add(t * value_stride as usize);
        let (kc, vc) = (k_cache.add(slot * nk * hd), v_cache.add(slot * nk * hd));
        let mut i = thread_idx_x() as usize;
        while i < (nq + nk) * half {
            let (h, j) = (i / half, i % half);
            let (c, s) = (*cs.add(j), *cs.add(half + j));
            if h < nq {
                let (x, y) = (q.add(h * hd), qo.add(h * hd));
                let (x1, x2) = ((*x.add(j)).to_f32(), (*x.add(j + half)).to_f32());
                *y.add(j) = T::from_f32(x1 * c - x2 * s);
                *y.add(j + half) = T::from_f32(x2 * c + x1 * s);
            } else {
                let h = h - nq;
                let (x, y) = (k.add(h * hd), kc.add(h * hd));
                let (x1, x2) = ((*x.add(j)).to_f32(), (*x.add(j + half)).to_f32());
                *y.add(j) = T::from_f32(x1 * c - x2 * s);
                *y.add(j + half) = T::from_f32(x2 * c + x1 * s);
            }
            i += threads;
        }
        let mut i = thread_idx_x() as usize;
        while i < nk * hd {
            *vc.add(i) = *v.add(i);
            if i % hd >= 2 * half {
                *kc.add(i) = *k.add(i);
            }
            i += threads;
        }
        // The query elements past `rot_dim` (partial rotary) are copied as they are.
        let mut i = thread_idx_x() as usize;
        while i < nq * hd {
            if i % hd >= 2 * half {
                *qo.add(i) = *q.add(i);
            }
            i += threads;
        }
    }
}
