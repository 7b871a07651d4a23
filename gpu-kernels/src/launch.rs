//! Launch geometry: [`Dim3`], [`LaunchConfig`], and the grid/block/shared-memory sizing
//! of every kernel family, shared by the emulator tests and a CUDA executor.

/// A 3-D extent or index.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dim3 {
    /// Fastest-varying dimension.
    pub x: u32,
    /// Middle dimension.
    pub y: u32,
    /// Slowest-varying dimension.
    pub z: u32,
}

impl Dim3 {
    /// A 1-D extent.
    pub const fn x(x: u32) -> Self {
        Self { x, y: 1, z: 1 }
    }
    /// A 2-D extent.
    pub const fn xy(x: u32, y: u32) -> Self {
        Self { x, y, z: 1 }
    }
    /// A 3-D extent.
    pub const fn xyz(x: u32, y: u32, z: u32) -> Self {
        Self { x, y, z }
    }
    /// Number of points.
    pub const fn count(self) -> usize {
        self.x as usize * self.y as usize * self.z as usize
    }
    /// The index of linear position `i` (x fastest).
    pub const fn unflatten(self, i: u32) -> Self {
        Self {
            x: i % self.x,
            y: (i / self.x) % self.y,
            z: i / (self.x * self.y),
        }
    }
}

/// Grid, block and dynamic shared memory of one launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchConfig {
    /// Blocks in the grid.
    pub grid: Dim3,
    /// Threads per block.
    pub block: Dim3,
    /// Dynamic shared memory per block, bytes.
    pub shared_mem_bytes: u32,
}

/// Threads per block used by the attention kernels on a GPU (4 warps).
pub const ATTN_THREADS: u32 = 128;
/// Threads per block used by the row-wise kernels on a GPU.
pub const ROW_THREADS: u32 = 256;

/// Dynamic shared memory of the decode kernels ([`crate::decode`]): one partial
/// softmax state per warp (`MAX_GROUP * head_dim + 2 * MAX_GROUP` floats). 33 KB at
/// head 256 and 4 warps ([`ATTN_THREADS`]); nothing depends on the context length. Past
/// 48 KB (8 warps at head 256) a CUDA launch needs the function's
/// `MAX_DYNAMIC_SHARED_SIZE_BYTES` attribute raised first.
pub const fn decode_shared_bytes(head_dim: u32, threads: u32) -> u32 {
    let g = crate::decode::MAX_GROUP as u32;
    (threads / 32) * (g * head_dim + 2 * g) * 4
}

/// Blocks along grid x of the decode kernels: one per slice of a KV head's query group.
pub const fn decode_grid_x(num_heads: u32, num_kv_heads: u32) -> u32 {
    num_kv_heads * crate::decode::group_split(num_heads, num_kv_heads).0
}

/// `paged_attention_v1_*`: grid (KV group slices, seqs); see [`decode_shared_bytes`].
/// [`plan_decode`] chooses between this and [`decode_v2`].
pub const fn decode_v1(
    num_seqs: u32,
    num_heads: u32,
    num_kv_heads: u32,
    head_dim: u32,
    threads: u32,
) -> LaunchConfig {
    LaunchConfig {
        grid: Dim3::xy(decode_grid_x(num_heads, num_kv_heads), num_seqs),
        block: Dim3::x(threads),
        shared_mem_bytes: decode_shared_bytes(head_dim, threads),
    }
}

/// Number of split-K partitions of a context.
pub const fn num_partitions(context_len: u32, partition_size: u32) -> u32 {
    context_len.div_ceil(partition_size)
}

/// `paged_attention_v2_*`: grid (KV group slices, seqs, partitions of the longest
/// attended range); see [`decode_shared_bytes`]. Finish with
/// [`paged_attention_v2_reduce`]. With a sliding window `max_context_len` may be the
/// longest `min(context_len, window)` (v2 cuts its partitions from the window's start);
/// the longest context is always enough.
pub const fn decode_v2(
    num_seqs: u32,
    num_heads: u32,
    num_kv_heads: u32,
    head_dim: u32,
    max_context_len: u32,
    partition_size: u32,
    threads: u32,
) -> LaunchConfig {
    LaunchConfig {
        grid: Dim3::xyz(
            decode_grid_x(num_heads, num_kv_heads),
            num_seqs,
            num_partitions(max_context_len, partition_size),
        ),
        block: Dim3::x(threads),
        shared_mem_bytes: decode_shared_bytes(head_dim, threads),
    }
}

/// A decode batch as the planner sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecodeShape {
    /// Sequences in the batch.
    pub num_seqs: u32,
    /// Query heads.
    pub num_heads: u32,
    /// KV heads (divides `num_heads`).
    pub num_kv_heads: u32,
    /// Head size.
    pub head_dim: u32,
    /// Longest context of the batch, tokens.
    pub max_context_len: u32,
    /// Sum of the batch's context lengths, tokens.
    pub total_context_len: u64,
    /// KV cache block size, tokens (the partition is a multiple of it).
    pub block_size: u32,
    /// Streaming multiprocessors of the device (132 on an H200).
    pub sm_count: u32,
    /// Threads per block of the launch.
    pub threads: u32,
}

/// The decode launch chosen by [`plan_decode`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecodePlan {
    /// One pass: `paged_attention_v1` with this geometry.
    V1(LaunchConfig),
    /// Split-K: `paged_attention_v2` then `paged_attention_v2_reduce`.
    V2 {
        /// Geometry of `paged_attention_v2`.
        attention: LaunchConfig,
        /// Geometry of `paged_attention_v2_reduce`.
        reduce: LaunchConfig,
        /// Tokens per partition (a multiple of the block size and of 64).
        partition_size: u32,
        /// Partitions of the longest context (the scratch is
        /// `num_seqs * num_heads * max_partitions` slots of `head_dim` floats).
        max_partitions: u32,
    },
}

/// Resident decode blocks per SM the planner counts on: ptxas gives the decode entries
/// 172-186 registers per thread at bf16/f16 (sm_90), so a 128-thread block holds about
/// 23K of the SM's 64K registers and two fit.
pub const DECODE_BLOCKS_PER_SM: u32 = 2;
/// Smallest split-K partition, tokens: below it the reduce and the per-block setup
/// (query staging, warp merge) stop being small next to the streamed K/V.
pub const MIN_PARTITION: u32 = 256;

/// Chooses v1 or split-K v2 and its partition size at run time, for attention without a
/// sliding window ([`plan_decode_window`] with window 0).
///
/// Rule: the single pass runs one block per (KV group slice, sequence). When that fills
/// [`DECODE_BLOCKS_PER_SM`] blocks on every SM, or the longest context is at most
/// [`MIN_PARTITION`] tokens, v1 is taken: nothing is gained by splitting and v2 adds a
/// scratch round trip and a launch. Otherwise the partition is the largest power of two
/// `>= MIN_PARTITION` (rounded up to a multiple of the block size) that still gives
/// enough blocks, counting only the partitions real contexts have (ragged batches: the
/// average context, not the longest, decides how many blocks do work).
pub fn plan_decode(s: DecodeShape) -> DecodePlan {
    let gx = decode_grid_x(s.num_heads, s.num_kv_heads);
    let v1_blocks = gx as u64 * s.num_seqs as u64;
    let target = s.sm_count as u64 * DECODE_BLOCKS_PER_SM as u64;
    if v1_blocks >= target || s.max_context_len <= MIN_PARTITION || s.num_seqs == 0 {
        return DecodePlan::V1(decode_v1(
            s.num_seqs,
            s.num_heads,
            s.num_kv_heads,
            s.head_dim,
            s.threads,
        ));
    }
    let round = |p: u32| p.div_ceil(s.block_size.max(1)) * s.block_size.max(1);
    let mut part = round(MIN_PARTITION);
    // Grow the partition while the working blocks (per sequence, its own partitions)
    // still reach the target with the larger size.
    while part < s.max_context_len {
        let next = round(part * 2);
        let blocks = gx as u64 * working_partitions(s, next);
        if blocks < target {
            break;
        }
        part = next;
    }
    let max_partitions = num_partitions(s.max_context_len, part);
    DecodePlan::V2 {
        attention: decode_v2(
            s.num_seqs,
            s.num_heads,
            s.num_kv_heads,
            s.head_dim,
            s.max_context_len,
            part,
            s.threads,
        ),
        reduce: paged_attention_v2_reduce(s.num_seqs, s.num_heads, s.threads),
        partition_size: part,
        max_partitions,
    }
}

/// [`plan_decode`] for a layer with sliding window `window` (0: none, exactly
/// [`plan_decode`]): the decode kernels attend at most `window` tokens per sequence and
/// v2 cuts its partitions from the window's start, so the plan runs on the effective
/// contexts, the longest `min(max_context_len, window)` and the total at most
/// `num_seqs * window` (`s` keeps the raw contexts). Fewer partitions and a smaller
/// split-K scratch follow, and short windows (<= [`MIN_PARTITION`]) always take v1.
/// Pass the same `window` to the kernels; a window-0 plan is also correct for a
/// windowed launch (its partitions past the window come out empty), only larger.
pub fn plan_decode_window(mut s: DecodeShape, window: u32) -> DecodePlan {
    if window > 0 {
        s.max_context_len = s.max_context_len.min(window);
        s.total_context_len = s.total_context_len.min(s.num_seqs as u64 * window as u64);
    }
    plan_decode(s)
}

/// Partitions that hold tokens, estimated from the average context of the batch.
fn working_partitions(s: DecodeShape, part: u32) -> u64 {
    let avg = s.total_context_len.div_ceil(s.num_seqs.max(1) as u64);
    s.num_seqs as u64 * avg.div_ceil(part as u64).max(1)
}

/// `paged_attention_v2_reduce_*`: grid (heads, seqs), no dynamic shared memory.
pub const fn paged_attention_v2_reduce(
    num_seqs: u32,
    num_heads: u32,
    threads: u32,
) -> LaunchConfig {
    LaunchConfig {
        grid: Dim3::xy(num_heads, num_seqs),
        block: Dim3::x(threads),
        shared_mem_bytes: 0,
    }
}

/// `prefill_attention_*`: grid (heads, query tokens); dynamic shared memory of
/// [`decode_shared_bytes`] for the largest head size, independent of the context
/// (`max_context_len` is no longer used; kept in the signature for callers).
pub const fn prefill_attention(
    num_tokens: u32,
    num_heads: u32,
    max_context_len: u32,
    threads: u32,
) -> LaunchConfig {
    let _ = max_context_len;
    LaunchConfig {
        grid: Dim3::xy(num_heads, num_tokens),
        block: Dim3::x(threads),
        shared_mem_bytes: decode_shared_bytes(crate::attention::MAX_HEAD_DIM as u32, threads),
    }
}

/// Row-wise kernels (`reshape_and_cache`, norms, rotary, SiLU- and GELU-and-mul,
/// embedding, `add_rms_norm`, `scale_rows`): one block per row/token.
pub const fn per_row(rows: u32, threads: u32) -> LaunchConfig {
    LaunchConfig {
        grid: Dim3::x(rows),
        block: Dim3::x(threads),
        shared_mem_bytes: 0,
    }
}

/// `rms_norm_heads_*`: one block per (token, head), grid (tokens, q heads + k heads). A
/// head of 256 elements is 32 16-byte vectors at bf16/f16 (64 at f32), so one or two
/// warps per block suit it.
pub const fn per_head(tokens: u32, heads: u32, threads: u32) -> LaunchConfig {
    LaunchConfig {
        grid: Dim3::xy(tokens, heads),
        block: Dim3::x(threads),
        shared_mem_bytes: 0,
    }
}

/// `copy_blocks_*`: grid (layers, block pairs).
pub const fn copy_blocks(num_layers: u32, num_pairs: u32, threads: u32) -> LaunchConfig {
    LaunchConfig {
        grid: Dim3::xy(num_layers, num_pairs),
        block: Dim3::x(threads),
        shared_mem_bytes: 0,
    }
}

/// `prefill_attention_mma_*` ([`crate::prefill_mma`]): grid (heads, an upper bound on
/// the query tiles: `ceil(num_tokens / BR) + num_seqs`, `BR = 16 * threads / 32`),
/// `threads` a multiple of 32 ([`ATTN_THREADS`]: 64-row tiles), dynamic shared memory
/// of [`crate::prefill_mma::shared_bytes`] (at most 34 KB: under the 48 KB default).
pub const fn prefill_mma(
    num_tokens: u32,
    num_seqs: u32,
    num_heads: u32,
    head_dim: u32,
    threads: u32,
) -> LaunchConfig {
    let br = crate::prefill_mma::WARP_ROWS as u32 * (threads / 32);
    LaunchConfig {
        grid: Dim3::xy(num_heads, num_tokens.div_ceil(br) + num_seqs),
        block: Dim3::x(threads),
        shared_mem_bytes: crate::prefill_mma::shared_bytes(head_dim as usize),
    }
}

/// Threads per block of the LoRA kernels ([`crate::lora`]): 4 warps, so a
/// `lora_bgmv_shrink` block covers 4 ranks and a `lora_sgmv_*` tile has 16 rows.
pub const LORA_THREADS: u32 = 128;

/// `lora_bgmv_shrink_*`: grid (rows, `ceil(max_rank / warps)`), one warp per (row,
/// rank), no shared memory. `threads` a multiple of 32 ([`LORA_THREADS`]).
pub const fn lora_bgmv_shrink(rows: u32, max_rank: u32, threads: u32) -> LaunchConfig {
    LaunchConfig {
        grid: Dim3::xy(rows, max_rank.div_ceil(threads / 32)),
        block: Dim3::x(threads),
        shared_mem_bytes: 0,
    }
}

/// `lora_bgmv_expand_*`: grid (rows, `ceil(out_dim / threads)`), one thread per (row,
/// output), no shared memory.
pub const fn lora_bgmv_expand(rows: u32, out_dim: u32, threads: u32) -> LaunchConfig {
    LaunchConfig {
        grid: Dim3::xy(rows, out_dim.div_ceil(threads)),
        block: Dim3::x(threads),
        shared_mem_bytes: 0,
    }
}

/// Blocks along grid x of the SGMV kernels: an upper bound on the row tiles
/// ([`crate::lora::sgmv_tile_rows`]`(threads)` rows each, 16 at [`LORA_THREADS`]) of
/// `num_segs` segments holding `rows` rows in all (`ceil(rows / tile rows) + num_segs`;
/// blocks past the last tile return at once).
pub const fn lora_sgmv_tiles(rows: u32, num_segs: u32, threads: u32) -> u32 {
    rows.div_ceil(crate::lora::sgmv_tile_rows(threads)) + num_segs
}

/// `lora_sgmv_shrink_*`: grid ([`lora_sgmv_tiles`], `ceil(max_rank / SGMV_COLS)`),
/// dynamic shared memory of [`crate::lora::sgmv_shared_bytes`] (6.5 KB at
/// [`LORA_THREADS`]).
pub const fn lora_sgmv_shrink(
    rows: u32,
    num_segs: u32,
    max_rank: u32,
    threads: u32,
) -> LaunchConfig {
    LaunchConfig {
        grid: Dim3::xy(
            lora_sgmv_tiles(rows, num_segs, threads),
            max_rank.div_ceil(crate::lora::SGMV_COLS as u32),
        ),
        block: Dim3::x(threads),
        shared_mem_bytes: crate::lora::sgmv_shared_bytes(threads),
    }
}

/// `lora_sgmv_expand_*`: grid ([`lora_sgmv_tiles`], `ceil(out_dim / SGMV_COLS)`),
/// dynamic shared memory of [`crate::lora::sgmv_shared_bytes`].
pub const fn lora_sgmv_expand(
    rows: u32,
    num_segs: u32,
    out_dim: u32,
    threads: u32,
) -> LaunchConfig {
    LaunchConfig {
        grid: Dim3::xy(
            lora_sgmv_tiles(rows, num_segs, threads),
            out_dim.div_ceil(crate::lora::SGMV_COLS as u32),
        ),
        block: Dim3::x(threads),
        shared_mem_bytes: crate::lora::sgmv_shared_bytes(threads),
    }
}

/// The prefill kernel family chosen by [`choose_prefill`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PrefillKernel {
    /// `prefill_attention_mma_*`: tensor cores, launched with [`prefill_mma`].
    Mma,
    /// `prefill_attention_*`: the streaming CUDA-core kernel, launched with
    /// [`prefill_attention`].
    Streaming,
}

/// The one rule that picks the prefill kernel: tensor cores for 16-bit caches (`bf16`,
/// `f16`: `elem_bytes == 2`) at the instantiated head sizes that are multiples of 16;
/// the streaming kernel otherwise (`f32` caches, other head sizes).
pub const fn choose_prefill(elem_bytes: u32, head_dim: u32) -> PrefillKernel {
    let mut i = 0;
    let mut instantiated = false;
    while i < crate::attention::HEAD_SIZES.len() {
        instantiated |= crate::attention::HEAD_SIZES[i] as u32 == head_dim;
        i += 1;
    }
    if elem_bytes == 2 && head_dim.is_multiple_of(16) && instantiated {
        PrefillKernel::Mma
    } else {
        PrefillKernel::Streaming
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefill_rule_takes_tensor_cores_for_16_bit_multiples_of_16() {
        for d in [16, 64, 80, 96, 128, 256] {
            assert_eq!(choose_prefill(2, d), PrefillKernel::Mma, "head {d}");
            assert_eq!(
                choose_prefill(4, d),
                PrefillKernel::Streaming,
                "f32 head {d}"
            );
        }
        // Not a multiple of 16, or not instantiated.
        for d in [8, 40, 72, 112, 192, 512] {
            assert_eq!(choose_prefill(2, d), PrefillKernel::Streaming, "head {d}");
        }
    }

    #[test]
    fn lora_grids_cover_every_rank_output_and_tile() {
        // BGMV: 4 warps take 4 ranks per block; one thread per output.
        let c = lora_bgmv_shrink(32, 16, LORA_THREADS);
        assert_eq!((c.grid, c.block), (Dim3::xy(32, 4), Dim3::x(128)));
        assert_eq!(lora_bgmv_shrink(5, 1, 64).grid, Dim3::xy(5, 1));
        assert_eq!(lora_bgmv_expand(32, 4097, 128).grid, Dim3::xy(32, 33));
        // SGMV, 4 warps: segments of 1, 7, 33 and 5 rows are 1 + 1 + 3 + 1 = 6 tiles of 16 rows;
        // the bound ceil(46 / 16) + 4 = 7 covers them.
        assert_eq!(lora_sgmv_tiles(46, 4, LORA_THREADS), 7);
        let c = lora_sgmv_shrink(46, 4, 48, LORA_THREADS);
        assert_eq!(
            (c.grid, c.shared_mem_bytes),
            (Dim3::xy(7, 2), (32 * 36 + 16 * 32) * 4)
        );
        // Two warps: tiles of 8 rows (1 + 1 + 5 + 1 = 8 <= ceil(46 / 8) + 4 = 10).
        assert_eq!(lora_sgmv_expand(46, 4, 576, 64).grid, Dim3::xy(10, 18));
    }

    #[test]
    fn prefill_mma_grid_bounds_the_tiles() {
        // 3 sequences of 1, 64 and 65 tokens: 1 + 1 + 2 = 4 tiles of 64 rows; the bound
        // ceil(130 / 64) + 3 = 6 covers them.
        let c = prefill_mma(130, 3, 8, 128, ATTN_THREADS);
        assert_eq!(c.grid, Dim3::xy(8, 6));
        assert_eq!(c.block, Dim3::x(128));
        assert_eq!(c.shared_mem_bytes, 2 * 64 * 136 * 2);
        assert_eq!(
            prefill_mma(1, 1, 1, 256, 128).shared_mem_bytes,
            2 * 32 * 264 * 2
        );
    }
}
