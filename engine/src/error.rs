//! The engine crate's one error type. The server maps it to HTTP in one place
//! (`Overloaded` -> 429/503, `ShutDown` -> 503, request errors -> 400, the
//! rest -> 500).
//!
//! Invariant: every variant is cheap to clone, so one error can be delivered
//! to a request's stream and logged at the same time.

use crate::scheduler::RequestId;
use thiserror::Error;

/// Everything that can go wrong between "add a request" and its last output.
#[derive(Debug, Clone, Error, PartialEq, Eq)]
pub enum EngineError {
    /// The prompt has no tokens.
    #[error("the prompt is empty")]
    EmptyPrompt,
    /// The prompt leaves no room for a generated token within `max_model_len`.
    #[error("the prompt has {prompt_len} tokens; max_model_len is {max_model_len} (a prompt must be shorter to leave room for output)")]
    PromptTooLong {
        prompt_len: usize,
        max_model_len: usize,
    },
    /// The request can grow larger than the whole KV cache: it would never fit.
    #[error("the request needs up to {needed_tokens} tokens of KV cache but the whole cache holds {capacity_tokens}")]
    NeverFits {
        needed_tokens: usize,
        capacity_tokens: usize,
    },
    /// Too many requests are already waiting.
    #[error("the engine is overloaded: {waiting} requests waiting (limit {limit})")]
    Overloaded { waiting: usize, limit: usize },
    /// The engine is shutting down or has stopped.
    #[error("the engine is shut down")]
    ShutDown,
    /// A request with this id is already in the engine.
    #[error("duplicate request id {0}")]
    DuplicateRequest(RequestId),
    /// Invalid request parameters.
    #[error("invalid request parameters: {0}")]
    InvalidParams(String),
    /// One sampling parameter out of its range.
    #[error("invalid parameter {param}: {reason}")]
    InvalidParam { param: &'static str, reason: String },
    /// Invalid engine or scheduler configuration.
    #[error("invalid engine configuration: {0}")]
    InvalidConfig(String),
    /// The KV cache manager refused an operation the scheduler had budgeted.
    #[error("KV cache error: {0}")]
    Kv(String),
    /// The executor failed to run a step; the requests in that step are aborted.
    #[error("executor failure: {0}")]
    Executor(String),
}

impl From<crate::kv::KvError> for EngineError {
    fn from(e: crate::kv::KvError) -> Self {
        EngineError::Kv(e.to_string())
    }
}

impl From<crate::executor::ExecError> for EngineError {
    fn from(e: crate::executor::ExecError) -> Self {
        EngineError::Executor(e.to_string())
    }
}
