//! The engine's error types live in `engine-core` (the bottom floor, so that
//! every part can name them without an upward import); re-exported here.
//! The server maps [`EngineError`] to HTTP in exactly one place.

pub use engine_core::error::{
    cause, Cause, EngineError, ExecError, GpuError, KvError, Report, RequestError,
};
