//! The serving engine: KV cache paging, scheduling, sampling and the forward
//! pass on an executor.
//!
//! Invariant: this crate knows no HTTP and no JSON.

pub mod dist;
pub mod engine_loop;
pub mod error;
pub mod executor;
pub mod grammar;
pub mod kv;
pub mod model;
pub mod sampler;
pub mod scheduler;
pub mod spec;

pub use engine_loop::{EngineConfig, EngineHandle, LlmEngine, RequestOutput, RequestStream};
pub use error::EngineError;
