//! The serving engine: KV cache paging, scheduling, sampling and the forward
//! pass on an executor.
//!
//! Invariant: this crate knows no HTTP and no JSON.

pub mod executor;
pub mod kv;
pub mod model;
pub mod scheduler;
