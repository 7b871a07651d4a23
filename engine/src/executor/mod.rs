//! Executors run one step: block operations, then the forward pass.
//!
//! The scheduler builds a [`ForwardBatch`] and [`BlockOps`] and never knows
//! which executor runs them: [`CpuExecutor`], or [`gpu::GpuExecutor`] on the
//! host-emulated device (tests) or on CUDA (feature `cuda`).
//! [`build_executor`] picks one for `--device auto|cpu|cuda`.

pub mod cpu;
pub mod gpu;
pub mod select;

pub use cpu::generate::{argmax, generate_greedy, ContiguousLayout};
pub use cpu::CpuExecutor;
pub use select::{build_executor, BuiltExecutor, DeviceKind, ExecutorRequest};

use crate::kv::{BlockCopy, BlockId};
use thiserror::Error;

/// The tokens of one sequence in a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeqSpan {
    /// Number of this step's tokens for the sequence (prompt chunk or 1).
    /// The sequence's tokens are consecutive in [`ForwardBatch::token_ids`].
    pub query_len: usize,
    /// Tokens in the KV cache for this sequence once this step's tokens are
    /// written (cached prefix + this step's tokens).
    pub context_len: usize,
    /// Accelerator block table covering `context_len` tokens.
    pub block_table: Vec<BlockId>,
}

/// One forward pass over sequences of different lengths (prefill chunks and
/// decode tokens mixed).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ForwardBatch {
    /// All new tokens, sequence after sequence.
    pub token_ids: Vec<u32>,
    /// Position of each token in its sequence.
    pub positions: Vec<usize>,
    /// Slot (block * block_size + offset) where each token's K/V is written.
    pub slot_mapping: Vec<usize>,
    /// Per-sequence spans, in the order of `token_ids`.
    pub seqs: Vec<SeqSpan>,
    /// Rows of `token_ids` whose logits are wanted (usually each sequence's last).
    pub logits_rows: Vec<usize>,
}

/// Block movements to perform before the forward pass, in this order:
/// swap out, swap in, copy-on-write copies.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BlockOps {
    /// Accelerator -> CPU pool.
    pub swap_out: Vec<BlockCopy>,
    /// CPU pool -> accelerator.
    pub swap_in: Vec<BlockCopy>,
    /// Inside the accelerator pool.
    pub copies: Vec<BlockCopy>,
}

impl BlockOps {
    /// True when there is nothing to move.
    pub fn is_empty(&self) -> bool {
        self.swap_out.is_empty() && self.swap_in.is_empty() && self.copies.is_empty()
    }
}

/// Logits for the rows asked for, row-major `[rows, vocab]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Logits {
    pub rows: usize,
    pub vocab: usize,
    pub data: Vec<f32>,
}

impl Logits {
    /// The logits of one requested row.
    pub fn row(&self, i: usize) -> &[f32] {
        &self.data[i * self.vocab..(i + 1) * self.vocab]
    }
}

/// Errors of an executor.
#[derive(Debug, Error)]
pub enum ExecError {
    #[error("invalid batch: {0}")]
    InvalidBatch(String),
    #[error("block {0:?} is outside the pool")]
    BlockOutOfRange(BlockId),
    /// The GPU executor's device failed or refused (see `gpu::GpuError`).
    #[error("{0}")]
    Device(String),
}

/// What the engine loop needs from a device.
pub trait Executor: Send {
    /// Runs the block operations, then the forward pass, and returns logits
    /// for `batch.logits_rows`.
    fn execute(&mut self, ops: &BlockOps, batch: &ForwardBatch) -> Result<Logits, ExecError>;

    /// Vocabulary size of the loaded model.
    fn vocab_size(&self) -> usize;

    /// Number of blocks in the accelerator pool and in the CPU swap pool.
    fn num_blocks(&self) -> (usize, usize);

    /// Tokens per block.
    fn block_size(&self) -> usize;
}
