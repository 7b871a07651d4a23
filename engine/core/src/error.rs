//! Every error type of the engine, from the bottom up: a device's
//! ([`GpuError`]), an executor's ([`ExecError`]), the KV cache's
//! ([`KvError`]), a request's ([`RequestError`]) and the engine's
//! ([`EngineError`], which wraps the others as typed sources).
//!
//! Invariants:
//! - a variant whose cause has a type keeps it as its `source()` (a foreign
//!   library's error as a [`Cause`]); a `String` payload only describes what
//!   our own code found, never a formatted error of another type;
//! - a wrapping variant's message does not repeat its source's: print an
//!   error with [`Report`] to get the whole chain (`a: b: c`);
//! - every type is cheap to clone (sources behind `Arc`), so one error can be
//!   delivered to each stream of a request and logged at the same time.

use crate::ids::{BlockId, RequestId, SeqId};
use std::error::Error as StdError;
use std::fmt;
use std::sync::Arc;
use thiserror::Error;

/// A foreign library's error kept as a typed source (driver, cuBLAS, I/O).
pub type Cause = Arc<dyn StdError + Send + Sync + 'static>;

/// Wraps any error as a [`Cause`].
pub fn cause(e: impl StdError + Send + Sync + 'static) -> Cause {
    Arc::new(e)
}

/// Displays an error and every source under it, joined by `": "`.
pub struct Report<'a>(pub &'a (dyn StdError + 'static));

impl fmt::Display for Report<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)?;
        let mut next = self.0.source();
        while let Some(e) = next {
            write!(f, ": {e}")?;
            next = e.source();
        }
        Ok(())
    }
}

/// Errors of the KV cache layer.
#[derive(Debug, Clone, Error, PartialEq, Eq)]
pub enum KvError {
    #[error("no free KV cache block in the accelerator pool")]
    OutOfBlocks,
    #[error("the CPU swap pool has no room for this group")]
    SwapSpaceFull,
    #[error("unknown sequence {0:?}")]
    UnknownSequence(SeqId),
    #[error("sequence {0:?} already exists")]
    DuplicateSequence(SeqId),
    #[error("sequence {0:?} is not resident in the accelerator pool")]
    NotResident(SeqId),
    #[error("sequence {0:?} is not swapped out")]
    NotSwapped(SeqId),
    #[error("the last token of sequence {0:?} is in a full block already cached by its contents")]
    SealedToken(SeqId),
    #[error("invalid KV cache configuration: {0}")]
    InvalidConfig(String),
}

/// Errors of the GPU executor and its devices.
#[derive(Debug, Clone, Error)]
pub enum GpuError {
    /// No usable CUDA driver or device (or the `cuda` feature is off).
    #[error("no CUDA device: {reason}")]
    Unavailable {
        reason: String,
        #[source]
        source: Option<Cause>,
    },
    /// The model or configuration needs something the GPU path lacks.
    #[error("not supported on the GPU executor: {0}")]
    Unsupported(String),
    /// The PTX could not be found or loaded.
    #[error("PTX: {what}")]
    Ptx {
        what: String,
        #[source]
        source: Option<Cause>,
    },
    /// The device has too little memory for what was asked.
    #[error("out of device memory: {what}")]
    OutOfMemory {
        what: String,
        #[source]
        source: Option<Cause>,
    },
    /// A driver or cuBLAS call failed.
    #[error("{op} failed")]
    Driver {
        op: &'static str,
        #[source]
        source: Cause,
    },
    /// The device (or the emulator) found a misuse: an unknown buffer or
    /// graph, a call while capturing, an out-of-bounds access.
    #[error("device error: {0}")]
    Device(String),
    /// A tensor-parallel collective failed (a rank is gone, the library
    /// refused): the step cannot finish on any rank.
    #[error("tensor parallelism: {0}")]
    Collective(String),
}

impl GpuError {
    /// [`GpuError::Unavailable`] without a foreign cause.
    pub fn unavailable(reason: impl Into<String>) -> Self {
        Self::Unavailable {
            reason: reason.into(),
            source: None,
        }
    }

    /// [`GpuError::OutOfMemory`] without a foreign cause.
    pub fn out_of_memory(what: impl Into<String>) -> Self {
        Self::OutOfMemory {
            what: what.into(),
            source: None,
        }
    }

    /// [`GpuError::Ptx`] without a foreign cause.
    pub fn ptx(what: impl Into<String>) -> Self {
        Self::Ptx {
            what: what.into(),
            source: None,
        }
    }

    /// A closure for `map_err`: call `op` failed with a foreign error.
    pub fn driver<E: StdError + Send + Sync + 'static>(op: &'static str) -> impl Fn(E) -> Self {
        move |e| Self::Driver {
            op,
            source: cause(e),
        }
    }
}

/// Errors of an executor.
#[derive(Debug, Clone, Error)]
pub enum ExecError {
    /// The batch breaks a rule of [`crate::validate_batch`].
    #[error("invalid batch: {0}")]
    InvalidBatch(String),
    #[error("block {0:?} is outside the pool")]
    BlockOutOfRange(BlockId),
    /// A block move between pools of different element types.
    #[error("KV pools hold different element types ({src} and {dst})")]
    MixedKvTypes {
        src: &'static str,
        dst: &'static str,
    },
    /// The executor was built with an unusable configuration.
    #[error("invalid executor configuration: {0}")]
    InvalidConfig(String),
    /// The answer does not fit the step that was asked (rows, kinds).
    #[error("the executor's answer does not fit the step: {0}")]
    WrongAnswer(String),
    /// The executor's worker thread stopped or could not start.
    #[error("the executor thread stopped")]
    WorkerStopped,
    /// The GPU executor's device failed or refused.
    #[error("GPU executor")]
    Gpu(#[from] GpuError),
    /// A collective operation between tensor-parallel ranks failed (a rank
    /// is gone, or the ranks disagree on the step).
    #[error("tensor parallelism: {0}")]
    Collective(String),
}

/// Why a request is refused at submission (the client's fault: HTTP 400).
#[derive(Debug, Clone, Error, PartialEq, Eq)]
pub enum RequestError {
    /// The prompt has no tokens.
    #[error("the prompt is empty")]
    EmptyPrompt,
    /// The prompt plus the tokens asked for do not fit `max_model_len`
    /// (`max_tokens` absent: the prompt leaves no room for one token).
    #[error(
        "This model's maximum context length is {max_model_len} tokens. However, you requested \
         {} tokens ({prompt_len} in the prompt, {max_tokens} for the completion). Please reduce \
         the length of the prompt or max_tokens.",
        prompt_len + max_tokens
    )]
    ContextTooLong {
        prompt_len: usize,
        max_tokens: usize,
        max_model_len: usize,
    },
    /// The request can grow larger than the whole KV cache: it would never fit.
    #[error("the request needs up to {needed_tokens} tokens of KV cache but the whole cache holds {capacity_tokens}")]
    NeverFits {
        needed_tokens: usize,
        capacity_tokens: usize,
    },
    /// A request with this id is already in the engine.
    #[error("duplicate request id {0}")]
    DuplicateRequest(RequestId),
    /// One parameter out of its range, or a combination the engine refuses.
    #[error("{param} {reason}")]
    InvalidParam { param: &'static str, reason: String },
}

impl RequestError {
    /// The request field at fault, for the 400's `param`.
    pub fn param(&self) -> Option<&'static str> {
        match self {
            Self::InvalidParam { param, .. } => Some(param),
            Self::ContextTooLong { .. } | Self::EmptyPrompt => Some("prompt"),
            Self::NeverFits { .. } => Some("max_tokens"),
            Self::DuplicateRequest(_) => None,
        }
    }
}

/// Everything that can go wrong between "add a request" and its last output.
#[derive(Debug, Clone, Error)]
pub enum EngineError {
    /// The request itself is invalid.
    #[error(transparent)]
    Request(#[from] RequestError),
    /// Too many requests are already waiting.
    #[error("the engine is overloaded: {waiting} requests waiting (limit {limit})")]
    Overloaded { waiting: usize, limit: usize },
    /// The engine is shutting down or has stopped.
    #[error("the engine is shut down")]
    ShutDown,
    /// Invalid engine or scheduler configuration (at startup).
    #[error("invalid engine configuration: {0}")]
    InvalidConfig(String),
    /// A thread of the engine could not be started.
    #[error("cannot start the {what} thread")]
    Thread {
        what: &'static str,
        #[source]
        source: Cause,
    },
    /// The KV cache manager refused an operation the scheduler had budgeted.
    #[error("KV cache failure")]
    Kv(#[from] KvError),
    /// The executor failed to run a step; the requests in that step are aborted.
    #[error("executor failure")]
    Executor(#[from] ExecError),
    /// The engine's own bookkeeping disagreed with itself; the request is
    /// aborted (a bug, reported rather than a panic).
    #[error("internal inconsistency: {0}")]
    Inconsistent(String),
}

impl From<GpuError> for EngineError {
    fn from(e: GpuError) -> Self {
        Self::Executor(ExecError::Gpu(e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn report_walks_the_chain() {
        let io = std::io::Error::other("CUDA_ERROR_ILLEGAL_ADDRESS");
        let e = EngineError::from(GpuError::driver::<std::io::Error>("cuLaunchKernel")(io));
        let text = Report(&e).to_string();
        assert_eq!(
            text,
            "executor failure: GPU executor: cuLaunchKernel failed: CUDA_ERROR_ILLEGAL_ADDRESS"
        );
        // The typed cause is reachable, not only its text.
        let gpu = e.source().and_then(|s| s.source()).expect("gpu error");
        assert!(gpu.downcast_ref::<GpuError>().is_some());
    }

    #[test]
    fn request_errors_pass_through_and_name_their_param() {
        let e = EngineError::from(RequestError::InvalidParam {
            param: "top_p",
            reason: "must be in (0, 1]".into(),
        });
        assert_eq!(e.to_string(), "top_p must be in (0, 1]");
        let EngineError::Request(r) = e else {
            panic!("not a request error");
        };
        assert_eq!(r.param(), Some("top_p"));
    }
}
