//! The seam between the HTTP layer and the engine: a small [`Backend`] trait
//! with the types the handlers need, and nothing of HTTP in it.
//!
//! The real implementation is [`crate::engine_backend::EngineBackend`], a thin
//! adapter over `engine::EngineHandle`. Handlers only ever see this trait.
//!
//! Invariants:
//! - a request reaching [`Backend::submit`] is converted from the wire form,
//!   not validated: the engine validates it once, at submission (non-empty
//!   prompt, `prompt + max_tokens <= max_model_len`, parameters in range),
//!   and refuses it with a typed `EngineError`;
//! - dropping an [`OutputStream`] before its last item aborts the request in
//!   the engine and frees its blocks;
//! - every sequence index `0..n` ends with exactly one delta carrying a
//!   `finish_reason`, then the stream ends;
//! - `prompt_logprobs`, when asked, arrive on exactly one item, never after
//!   the item that carries the first tokens.

pub use engine::sampler::SamplingParams;
pub use engine::scheduler::RequestParams;
use futures_util::stream::BoxStream;

/// One request for the engine: token ids plus parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineRequest {
    pub prompt_token_ids: Vec<u32>,
    /// The engine's own parameter types: each parameter is declared and
    /// range-checked once, in `engine::sampler::params`.
    pub params: RequestParams,
}

/// Why a sequence ended, as the engine sees it (stop strings are the
/// server's business and map to [`FinishReason::Stop`] there).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// EOS or a stop token id.
    Stop,
    /// `max_tokens` or `max_model_len`.
    Length,
    /// Aborted or failed in the engine.
    Abort,
}

impl FinishReason {
    /// OpenAI's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Abort => "abort",
        }
    }
}

/// One generated token.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenOut {
    pub token_id: u32,
    pub logprob: f32,
    /// The most likely alternatives `(token, logprob)`, best first; may be
    /// shorter than asked when the engine does not report them.
    pub top_logprobs: Vec<(u32, f32)>,
}

/// One prompt token's logprob (the first prompt token has none).
#[derive(Debug, Clone, PartialEq)]
pub struct PromptTokenLogprob {
    pub token_id: u32,
    pub logprob: f32,
    /// 1-based rank in the model's distribution.
    pub rank: usize,
    /// The most likely alternatives `(token, logprob)`, best first.
    pub top_logprobs: Vec<(u32, f32)>,
}

/// A prompt's logprobs: one entry per prompt token, `None` for the first.
pub type PromptLogprobs = Vec<Option<PromptTokenLogprob>>;

/// New tokens of sequence `index` since its previous delta.
#[derive(Debug, Clone, PartialEq)]
pub struct SeqDelta {
    pub index: usize,
    pub tokens: Vec<TokenOut>,
    pub finish_reason: Option<FinishReason>,
}

/// One item of a request's stream.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct StepOutput {
    pub seqs: Vec<SeqDelta>,
    /// Prompt tokens served from the prefix cache.
    pub num_cached_tokens: usize,
    /// Set once per request that asked for `prompt_logprobs`, on its first
    /// item with tokens (the final one when the engine buffers outputs).
    pub prompt_logprobs: Option<PromptLogprobs>,
}

/// A failure reported by the engine: the engine's own typed error (the
/// HTTP layer maps it to a status in one place, `ApiError::from`).
pub use engine::EngineError;

/// A request's outputs. Dropping it aborts the request.
pub type OutputStream = BoxStream<'static, Result<StepOutput, EngineError>>;

/// Counters for `/metrics`, as of the engine's last step.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct BackendStats {
    pub num_running: usize,
    pub num_waiting: usize,
    pub num_swapped: usize,
    pub kv_total_blocks: usize,
    pub kv_free_blocks: usize,
    pub cpu_total_blocks: usize,
    pub cpu_free_blocks: usize,
    /// Fraction of accelerator blocks in use (0..=1).
    pub kv_usage: f64,
    pub prefix_cache_queries: u64,
    pub prefix_cache_hits: u64,
    pub preemptions_swap: u64,
    pub preemptions_recompute: u64,
    pub prompt_tokens: u64,
    pub generation_tokens: u64,
    /// Speculative decoding's counters (`None`: speculation off).
    pub spec: Option<SpecMetrics>,
}

/// Speculative decoding's counters and its proposals per step.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SpecMetrics {
    pub num_speculative_tokens: usize,
    pub stats: engine::scheduler::SpecStats,
}

/// Static facts about the engine the HTTP layer validates against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackendLimits {
    /// Most tokens (prompt + output) of one sequence.
    pub max_model_len: usize,
    pub block_size: usize,
    pub num_gpu_blocks: usize,
    /// Blocks of the host swap pool.
    pub num_cpu_blocks: usize,
}

/// What the HTTP layer needs from an engine.
pub trait Backend: Send + Sync + 'static {
    /// Validates (the engine's one validation) and queues a request.
    fn submit(&self, req: EngineRequest) -> Result<OutputStream, EngineError>;
    /// Runs the engine's validation of `req` without queueing it (for a
    /// request answered without generation: `echo` with `max_tokens` 0).
    fn validate(&self, req: &EngineRequest) -> Result<(), EngineError>;
    /// Counters for `/metrics`.
    fn stats(&self) -> BackendStats;
    /// LoRA adapter names of running and waiting requests (`/metrics`).
    fn lora_names(&self) -> engine::engine_loop::LoraNames {
        Default::default()
    }
    /// Limits for validation.
    fn limits(&self) -> BackendLimits;
    /// Stops accepting work and aborts or drains what is in flight.
    /// Blocking; called once at shutdown.
    fn shutdown(&self);
}
