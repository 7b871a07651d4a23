//! Speculative decoding: what proposes tokens, and its configuration.
//!
//! A decode step reads every weight to produce one token per sequence;
//! speculative decoding lets one step verify several. Before a step, a
//! [`Proposer`] guesses up to `k` next tokens of each eligible sequence
//! (`Scheduler::spec_candidates`); the scheduler appends them to the
//! sequence's span as *provisional* KV slots
//! (`KvCacheManager::append_provisional`), so the target model scores the
//! last token and the `k` proposals in one forward pass (the executors'
//! multi-query path, causal within the span, with a logits row per
//! position); the sampler draws each row in order and accepts proposals
//! while they equal the draws (`engine_loop::verify`); the update appends
//! the accepted tokens plus the first draw that differed (or the bonus
//! token after the last proposal) and rolls the rejected slots back
//! (`KvCacheManager::settle_provisional`).
//!
//! Every proposer here is deterministic (n-gram lookup, or a draft model's
//! greedy tokens), so the proposal distribution `q` is one-hot. Then the
//! rejection sampling of Leviathan et al. and Chen et al. (accept `x` with
//! `min(1, p(x) / q(x)) = p(x)`; on rejection draw from `max(0, p - q)`
//! normalized, which is `p` without `x`) is exactly "draw from `p`, accept
//! when the draw equals `x`, else keep the draw": the target's
//! distribution is unchanged. With the engine's seeded per-token draws
//! (the Philox counter is the token's index in the output), a request's
//! tokens under speculation are the same tokens it gets without it, for
//! greedy and sampled requests alike.
//!
//! Invariants: proposals never exceed what the request may still generate
//! (`max_tokens`, `max_model_len`: a step emits at most `k + 1` tokens);
//! only accepted tokens ever enter the prefix cache's hash chain.
//!
//! Cost: n-gram lookup is O(len x n) per sequence and step, on the host.

mod config;
pub mod governor;
mod ngram;

pub use config::{SpecConfig, SpecMethod, MAX_SPEC_TOKENS};
pub use ngram::propose_ngram;

use engine_core::SeqId;

/// One sequence a proposer is asked about.
#[derive(Debug, Clone, Copy)]
pub struct ProposeInput<'a> {
    pub seq: SeqId,
    /// Prompt then output tokens (all accepted; the last one not computed
    /// yet).
    pub tokens: &'a [u32],
    /// Most tokens to propose.
    pub max: usize,
}

/// Guesses the next tokens of sequences. An empty proposal is allowed
/// (that sequence decodes one token as usual).
pub trait Proposer: Send {
    /// Proposals, one list per input, each at most `input.max` long.
    fn propose(&mut self, inputs: &[ProposeInput<'_>]) -> Vec<Vec<u32>>;

    /// Sequences still alive: a proposer holding per-sequence state (a
    /// draft model's KV cache) drops the rest. Called before `propose`.
    fn retain(&mut self, alive: &dyn Fn(SeqId) -> bool) {
        let _ = alive;
    }
}

/// Prompt lookup (vLLM's `"ngram"`): the tokens that followed the latest
/// earlier occurrence of the sequence's last `n` tokens, longest `n` first.
#[derive(Debug, Clone, Copy)]
pub struct NgramProposer {
    pub min: usize,
    pub max: usize,
}

impl Proposer for NgramProposer {
    fn propose(&mut self, inputs: &[ProposeInput<'_>]) -> Vec<Vec<u32>> {
        inputs
            .iter()
            .map(|i| propose_ngram(i.tokens, self.min, self.max, i.max))
            .collect()
    }
}
