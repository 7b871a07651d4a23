//! The executors' shared types: the vocabulary of `engine-core`, re-exported
//! here so an executor's users find them beside the [`super::Executor`] trait.

pub use engine_core::{
    validate_batch, BlockOps, ExecError, ForwardBatch, GreedyRow, KvGeometry, Logits, SeqSpan,
};
