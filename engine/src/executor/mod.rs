//! Executors run one step: block operations, then the forward pass.
//!
//! The scheduler builds a [`ForwardBatch`] and [`BlockOps`] and never knows
//! which executor runs them: [`CpuExecutor`], or [`gpu::GpuExecutor`] on the
//! host-emulated device (tests) or on CUDA (feature `cuda`).
//! [`build_executor`] picks one for `--device auto|cpu|cuda`. The shared
//! types live in the leaf module [`types`].

pub mod cpu;
pub mod gpu;
pub mod select;
pub mod types;

pub use cpu::generate::{argmax, generate_greedy, ContiguousLayout};
pub use cpu::CpuExecutor;
pub use select::{build_executor, BuiltExecutor, DeviceKind, ExecutorRequest};

pub use types::{
    validate_batch, BlockOps, ExecError, ForwardBatch, HostLayer, HostModel, HostWeights,
    KvGeometry, Logits, SeqSpan,
};

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
