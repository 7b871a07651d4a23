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
    validate_batch, BlockOps, ExecError, ForwardBatch, GreedyRow, HostLayer, HostModel,
    HostWeights, KvGeometry, Logits, SeqSpan,
};

/// What the engine loop needs from a device.
pub trait Executor: Send {
    /// Runs the block operations, then the forward pass, and returns logits
    /// for `batch.logits_rows`.
    fn execute(&mut self, ops: &BlockOps, batch: &ForwardBatch) -> Result<Logits, ExecError>;

    /// Runs the step like [`Executor::execute`] but returns only each logits
    /// row's greedy choice, reduced where the logits are (on a GPU: 12 bytes
    /// per row leave the device instead of `vocab` floats). For steps whose
    /// every row is plain greedy (no penalties, logprobs, suppression or
    /// prompt rows). `Ok(None)`: this executor has no such path and ran
    /// nothing; call `execute`.
    fn execute_greedy(
        &mut self,
        _ops: &BlockOps,
        _batch: &ForwardBatch,
    ) -> Result<Option<Vec<GreedyRow>>, ExecError> {
        Ok(None)
    }

    /// Runs the step like [`Executor::execute`] and draws each logits row
    /// where the logits are, with `draws.rows[i]`'s parameters and
    /// processing (see `sampler::device`): on a GPU only each row's token,
    /// logprob and top logprobs leave the device, plus the logits of
    /// `draws.host_rows`. `draws.rows` has one entry per logits row. `Ok(None)`: this executor has no such path and ran
    /// nothing; call `execute` and sample on the CPU.
    fn execute_sampled(
        &mut self,
        _ops: &BlockOps,
        _batch: &ForwardBatch,
        _draws: &crate::sampler::device::DeviceDraws,
    ) -> Result<Option<crate::sampler::device::DeviceOut>, ExecError> {
        Ok(None)
    }

    /// Vocabulary size of the loaded model.
    fn vocab_size(&self) -> usize;

    /// Number of blocks in the accelerator pool and in the CPU swap pool.
    fn num_blocks(&self) -> (usize, usize);

    /// Tokens per block.
    fn block_size(&self) -> usize;
}
