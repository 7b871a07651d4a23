//! The engine's bottom floor: the vocabulary every other part speaks.
//!
//! - [`ids`]: [`RequestId`], [`SeqId`], [`BlockId`], [`BlockCopy`];
//! - [`batch`]: what an executor is handed ([`ForwardBatch`], [`BlockOps`])
//!   and hands back ([`Logits`], [`GreedyRow`]), the KV pool's shape
//!   ([`KvGeometry`]) and [`validate_batch`];
//! - [`error`]: every error type, with typed sources.
//!
//! Invariant: this crate imports nothing else of the engine (it is a crate so
//! that the compiler keeps it so). The floors above it are listed in
//! ARCHITECTURE.md.

pub mod batch;
pub mod error;
pub mod ids;

pub use batch::{
    validate_batch, BlockOps, ContiguousLayout, ForwardBatch, GreedyRow, KvGeometry, Logits,
    SeqSpan,
};
pub use error::{cause, Cause, EngineError, ExecError, GpuError, KvError, Report, RequestError};
pub use ids::{BlockCopy, BlockId, LoraId, RequestId, SeqId};
