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
pub mod tp;
#[cfg(test)]
mod tp_tests;
pub mod types;

#[cfg(test)]
pub(crate) mod test_run;

pub use cpu::generate::{argmax, generate_greedy, ContiguousLayout};
pub use cpu::CpuExecutor;
pub use select::{build_executor, BuiltExecutor, DeviceKind, ExecutorRequest, WeightInput};

use crate::model::lora::LoraStep;
use crate::sampler::device::{DeviceDraws, DeviceOut};

pub use types::{
    validate_batch, BlockOps, ExecError, ForwardBatch, GreedyRow, KvGeometry, Logits, SeqSpan,
};

/// Why an executor could not be built: the model's weights (shapes,
/// reading the file) or the executor itself (its device, its pools).
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error(transparent)]
    Model(#[from] crate::model::ModelError),
    #[error(transparent)]
    Exec(#[from] ExecError),
}

impl From<gpu::GpuError> for BuildError {
    fn from(e: gpu::GpuError) -> Self {
        Self::Exec(ExecError::Gpu(e))
    }
}

/// What an executor can do beyond returning logits, declared once so the
/// engine plans each step's path up front (never by asking and being
/// refused).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Capabilities {
    /// Reduces plain greedy rows where the logits are ([`Sampling::Greedy`]).
    pub greedy: bool,
    /// Draws rows where the logits are ([`Sampling::Device`]), host rows
    /// of a mixed step included.
    pub sampled: bool,
    /// Keeps the token-count slots penalties need on the device.
    pub count_slots: bool,
}

/// Where a step's rows are drawn, as the engine chose it from the
/// executor's [`Capabilities`].
#[derive(Debug, Clone, PartialEq)]
pub enum Sampling {
    /// Return every logits row; the host draws.
    Host,
    /// Every row is plain greedy: reduce each row where the logits are (on
    /// a GPU 12 bytes per row leave the device instead of `vocab` floats).
    Greedy,
    /// Draw each row where the logits are with its `DeviceDraws` row; only
    /// the draws, and the logits of `draws.host_rows`, come back.
    Device(DeviceDraws),
}

/// A step's answer.
#[derive(Debug, Clone, PartialEq)]
pub enum StepOutput {
    /// [`Sampling::Host`]: the logits of `batch.logits_rows`, in order.
    Logits(Logits),
    /// [`Sampling::Greedy`] or [`Sampling::Device`]: each row's draw.
    Drawn(DeviceOut),
}

impl StepOutput {
    /// The logits of a [`Sampling::Host`] step.
    pub fn into_logits(self) -> Result<Logits, ExecError> {
        match self {
            Self::Logits(l) => Ok(l),
            Self::Drawn(_) => Err(ExecError::WrongAnswer(
                "draws where logits were asked".into(),
            )),
        }
    }
}

/// What the engine loop needs from a device.
pub trait Executor: Send {
    /// What this executor can do beyond returning logits.
    fn capabilities(&self) -> Capabilities;

    /// Runs the block operations, then the forward pass, then the draws
    /// `sampling` asks for (which the executor's [`Capabilities`] allow;
    /// anything else is an error and runs nothing).
    fn execute(
        &mut self,
        ops: &BlockOps,
        batch: &ForwardBatch,
        sampling: &Sampling,
    ) -> Result<StepOutput, ExecError>;

    /// Whether [`Self::execute_lora`] applies adapters (the CPU and the GPU
    /// executors do).
    fn supports_lora(&self) -> bool {
        false
    }

    /// [`Self::execute`] with the step's LoRA adapters. The default runs a
    /// step without adapters and refuses one with adapters (a typed
    /// `InvalidConfig`, nothing run).
    fn execute_lora(
        &mut self,
        ops: &BlockOps,
        batch: &ForwardBatch,
        lora: &LoraStep,
        sampling: &Sampling,
    ) -> Result<StepOutput, ExecError> {
        if !lora.is_empty() {
            return Err(ExecError::InvalidConfig(
                "this executor does not apply LoRA adapters".into(),
            ));
        }
        self.execute(ops, batch, sampling)
    }

    /// Vocabulary size of the loaded model.
    fn vocab_size(&self) -> usize;

    /// Number of blocks in the accelerator pool and in the CPU swap pool.
    fn num_blocks(&self) -> (usize, usize);

    /// Tokens per block.
    fn block_size(&self) -> usize;
}
