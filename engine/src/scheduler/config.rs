//! Scheduler configuration, with vLLM's option names.

use crate::error::EngineError;

/// How a running group is preempted when the accelerator pool runs out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PreemptionMode {
    /// Swap to the CPU pool when it has room, otherwise recompute.
    #[default]
    Auto,
    /// Always swap; when the CPU pool is full, fall back to recompute (and
    /// count it as a recompute).
    Swap,
    /// Always drop the blocks and recompute prompt + generated tokens later.
    Recompute,
}

impl std::str::FromStr for PreemptionMode {
    type Err = EngineError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(Self::Auto),
            "swap" => Ok(Self::Swap),
            "recompute" => Ok(Self::Recompute),
            other => Err(EngineError::InvalidConfig(format!(
                "preemption mode must be auto, swap or recompute, not {other:?}"
            ))),
        }
    }
}

/// Budgets and policies of the iteration-level scheduler.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchedulerConfig {
    /// Most sequences in one step (`--max-num-seqs`).
    pub max_num_seqs: usize,
    /// Most tokens (prefill chunks + decode tokens) in one step
    /// (`--max-num-batched-tokens`).
    pub max_num_batched_tokens: usize,
    /// Most tokens (prompt + output) of one sequence (`--max-model-len`).
    pub max_model_len: usize,
    /// Split long prompts into chunks that fit the token budget.
    pub enable_chunked_prefill: bool,
    /// `--preemption-mode`.
    pub preemption_mode: PreemptionMode,
    /// Schedule step N+1 while the executor runs step N (vLLM's
    /// `--async-scheduling`); outputs are the same as without it. See
    /// `engine_loop::overlap`.
    pub async_scheduling: bool,
    /// Speculative decoding (`--speculative-config`), off when `None`.
    pub speculative: Option<crate::spec::SpecConfig>,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        Self {
            max_num_seqs: 256,
            max_num_batched_tokens: 2048,
            max_model_len: 2048,
            enable_chunked_prefill: true,
            preemption_mode: PreemptionMode::Auto,
            async_scheduling: false,
            speculative: None,
        }
    }
}

impl SchedulerConfig {
    /// Checks the budgets are usable. Without chunked prefill a whole prompt
    /// must fit one step, so `max_num_batched_tokens >= max_model_len`.
    pub fn validate(&self) -> Result<(), EngineError> {
        let bad = |m: String| Err(EngineError::InvalidConfig(m));
        if self.max_num_seqs == 0 {
            return bad("max_num_seqs must be at least 1".into());
        }
        if self.max_num_batched_tokens == 0 {
            return bad("max_num_batched_tokens must be at least 1".into());
        }
        if self.max_model_len < 2 {
            return bad("max_model_len must be at least 2".into());
        }
        if !self.enable_chunked_prefill && self.max_num_batched_tokens < self.max_model_len {
            return bad(format!(
                "without chunked prefill max_num_batched_tokens ({}) must be >= max_model_len ({})",
                self.max_num_batched_tokens, self.max_model_len
            ));
        }
        if let Some(spec) = &self.speculative {
            spec.validate()?;
        }
        Ok(())
    }
}
