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
