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

/// `paged_attention_v1_*`: grid (heads, seqs); logits of the longest context in
/// dynamic shared memory (`4 * max_context_len` bytes).
pub const fn paged_attention_v1(
    num_seqs: u32,
    num_heads: u32,
    max_context_len: u32,
    threads: u32,
) -> LaunchConfig {
    LaunchConfig {
        grid: Dim3::xy(num_heads, num_seqs),
        block: Dim3::x(threads),
        shared_mem_bytes: 4 * max_context_len,
    }
}

/// Number of split-K partitions of a context.
pub const fn num_partitions(context_len: u32, partition_size: u32) -> u32 {
    context_len.div_ceil(partition_size)
}

/// `paged_attention_v2_*`: grid (heads, seqs, partitions of the longest context).
pub const fn paged_attention_v2(
    num_seqs: u32,
    num_heads: u32,
    max_context_len: u32,
    partition_size: u32,
    threads: u32,
) -> LaunchConfig {
    LaunchConfig {
        grid: Dim3::xyz(
            num_heads,
            num_seqs,
            num_partitions(max_context_len, partition_size),
        ),
        block: Dim3::x(threads),
        shared_mem_bytes: 4 * partition_size,
    }
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

/// `prefill_attention_*`: grid (heads, query tokens); logits of the longest context.
pub const fn prefill_attention(
    num_tokens: u32,
    num_heads: u32,
    max_context_len: u32,
    threads: u32,
) -> LaunchConfig {
    LaunchConfig {
        grid: Dim3::xy(num_heads, num_tokens),
        block: Dim3::x(threads),
        shared_mem_bytes: 4 * max_context_len,
    }
}

/// Row-wise kernels (`reshape_and_cache`, norms, rotary, SiLU-and-mul, embedding):
/// one block per row/token.
pub const fn per_row(rows: u32, threads: u32) -> LaunchConfig {
    LaunchConfig {
        grid: Dim3::x(rows),
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
