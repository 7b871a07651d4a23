//! Sequences, sequence groups and request parameters.
//!
//! A request is a [`SequenceGroup`]: its `n` samples or beams. The group is
//! the unit of admission, preemption and swapping (all or nothing); each
//! [`Sequence`] in it is the unit the KV cache knows ([`SeqId`]).
//!
//! Invariant (vLLM v1's statement): every sequence has `num_computed_tokens
//! <= tokens.len()`; a step schedules `tokens.len() - num_computed_tokens`
//! tokens (or a chunk of them) and the KV cache holds exactly
//! `num_computed_tokens` tokens of a resident sequence once the step's slots
//! are appended. Prefill, chunked prefill, decode, prefix-cache hits and
//! recomputation after preemption are all the same catch-up.

use crate::kv::SeqId;
use crate::sampler::{PromptLogprob, SamplingParams};

pub use engine_core::RequestId;

/// Why a sequence stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FinishReason {
    /// EOS or a stop token.
    Stop,
    /// `max_tokens` or `max_model_len` reached.
    Length,
    /// Aborted by the caller, refused, or failed.
    Abort,
}

/// Where a sequence is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SeqStatus {
    /// Not resident: never admitted, or preempted by recompute.
    Waiting,
    /// Blocks in the accelerator pool.
    Running,
    /// Blocks in the CPU swap pool.
    Swapped,
    /// Done; its blocks are freed.
    Finished(FinishReason),
}

/// Per-request generation parameters: stopping rules and priority here,
/// how tokens are chosen in [`SamplingParams`].
#[derive(Debug, Clone, PartialEq)]
pub struct RequestParams {
    /// Most generated tokens (`None`: up to `max_model_len`).
    pub max_tokens: Option<usize>,
    /// Keep generating after EOS.
    pub ignore_eos: bool,
    /// Extra token ids that stop the sequence (the token is kept in the output).
    pub stop_token_ids: Vec<u32>,
    /// Lower is served first (vLLM's convention); ties go FCFS.
    pub priority: i32,
    /// Temperature, top-k/p, penalties, seed, n, best_of, beam search, ...
    pub sampling: SamplingParams,
    /// The LoRA adapter to run with (`None`: the base model).
    pub lora: Option<super::LoraRequest>,
}

impl Default for RequestParams {
    fn default() -> Self {
        Self {
            max_tokens: Some(16),
            ignore_eos: false,
            stop_token_ids: Vec::new(),
            priority: 0,
            sampling: SamplingParams::default(),
            lora: None,
        }
    }
}

/// One sequence: prompt followed by generated tokens.
#[derive(Debug, Clone, PartialEq)]
pub struct Sequence {
    pub id: SeqId,
    /// Prompt then output tokens.
    pub tokens: Vec<u32>,
    pub prompt_len: usize,
    /// Tokens whose K/V is in the cache (or scheduled to be this step).
    pub num_computed_tokens: usize,
    /// Logprob of each generated token, in order.
    pub output_logprobs: Vec<f32>,
    /// Top alternatives of each generated token (empty lists unless asked).
    pub output_top_logprobs: Vec<Vec<(u32, f32)>>,
    /// Beam search: this beam's next-token candidates, waiting for the
    /// group's other beams to catch up.
    pub beam_candidates: Option<Vec<(u32, f32)>>,
    /// Speculative decoding: tokens proposed for the next step (set just
    /// before it is scheduled, taken when it is).
    pub proposals: Vec<u32>,
    pub status: SeqStatus,
}

impl Sequence {
    pub fn new(id: SeqId, prompt: Vec<u32>) -> Self {
        Self {
            id,
            prompt_len: prompt.len(),
            tokens: prompt,
            num_computed_tokens: 0,
            output_logprobs: Vec::new(),
            output_top_logprobs: Vec::new(),
            beam_candidates: None,
            proposals: Vec::new(),
            status: SeqStatus::Waiting,
        }
    }

    /// Generated tokens so far.
    pub fn output_tokens(&self) -> &[u32] {
        &self.tokens[self.prompt_len..]
    }

    /// Tokens not yet computed (the next step's work).
    pub fn num_uncomputed(&self) -> usize {
        self.tokens.len().saturating_sub(self.num_computed_tokens)
    }

    /// Sum of the generated tokens' logprobs.
    pub fn cumulative_logprob(&self) -> f64 {
        self.output_logprobs.iter().map(|&l| f64::from(l)).sum()
    }

    /// True once a reason to stop was recorded.
    pub fn is_finished(&self) -> bool {
        matches!(self.status, SeqStatus::Finished(_))
    }

    /// True while the prompt (or the recomputed history) is being caught up.
    pub fn in_prefill(&self) -> bool {
        self.num_uncomputed() > 1 || self.num_computed_tokens < self.prompt_len
    }
}

/// A request: its sequences, parameters and queue position.
#[derive(Debug, Clone, PartialEq)]
pub struct SequenceGroup {
    pub request_id: RequestId,
    pub seqs: Vec<Sequence>,
    pub params: RequestParams,
    /// Monotone arrival stamp (FCFS order, and the victim order).
    pub arrival: u64,
    /// Tokens found in the prefix cache at the last admission.
    pub num_cached_tokens: usize,
    /// The seed of every draw of this group (the request's, or random).
    pub seed: u64,
    /// Beam search: finished hypotheses, kept apart from the live beams.
    pub hypotheses: Vec<Hypothesis>,
    /// `Some` when the request asked for `prompt_logprobs`.
    pub prompt_logprobs: Option<PromptLogprobs>,
}

/// A group's prompt logprobs, collected chunk by chunk.
///
/// Invariant: `entries[i]` is prompt position `i`'s entry (`entries[0]` is
/// `None`); positions are collected in order, each exactly once, so a
/// recomputed chunk (after preemption) adds nothing. Once `sent`, `entries`
/// is empty and stays so.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PromptLogprobs {
    pub entries: Vec<Option<PromptLogprob>>,
    pub sent: bool,
}

impl PromptLogprobs {
    /// Nothing collected yet but the first position's `None`.
    pub fn new() -> Self {
        Self {
            entries: vec![None],
            sent: false,
        }
    }
}

/// A finished beam-search hypothesis.
#[derive(Debug, Clone, PartialEq)]
pub struct Hypothesis {
    pub output_tokens: Vec<u32>,
    pub logprobs: Vec<f32>,
    pub top_logprobs: Vec<Vec<(u32, f32)>>,
    /// Cumulative logprob over length ^ length_penalty.
    pub score: f64,
    pub reason: FinishReason,
}

impl SequenceGroup {
    /// A group of width > 1 that has not drawn its first token yet (its
    /// first row's draws fork it).
    pub fn needs_fork(&self) -> bool {
        self.params.sampling.width() > 1
            && self.seqs.len() == 1
            && self.seqs.iter().all(|s| s.tokens.len() == s.prompt_len)
    }

    /// Queue key: lower sorts first (served first, preempted last).
    pub fn key(&self) -> QueueKey {
        QueueKey {
            priority: self.params.priority,
            arrival: self.arrival,
            id: self.request_id,
        }
    }

    /// Sequences not yet finished.
    pub fn unfinished(&self) -> impl Iterator<Item = &Sequence> {
        self.seqs.iter().filter(|s| !s.is_finished())
    }

    /// Number of sequences not yet finished.
    pub fn num_unfinished(&self) -> usize {
        self.unfinished().count()
    }

    /// Ids of the unfinished sequences (the KV cache's view of the group).
    pub fn unfinished_ids(&self) -> Vec<SeqId> {
        self.unfinished().map(|s| s.id).collect()
    }

    /// Sets the status of every unfinished sequence.
    pub fn set_status(&mut self, status: SeqStatus) {
        for s in self.seqs.iter_mut().filter(|s| !s.is_finished()) {
            s.status = status;
        }
    }

    /// Whether every sequence has finished.
    pub fn is_finished(&self) -> bool {
        self.seqs.iter().all(Sequence::is_finished)
    }

    /// Sequences the group will hold once forked: its width before the first
    /// token is sampled, then its unfinished count.
    pub fn expected_seqs(&self) -> usize {
        let started = self.seqs.iter().any(|s| s.tokens.len() > s.prompt_len);
        if started || self.seqs.len() != 1 {
            self.num_unfinished()
        } else {
            self.params.sampling.width()
        }
    }

    /// The prompt length (every sequence of a group shares the prompt).
    pub fn prompt_len(&self) -> usize {
        self.seqs.first().map_or(0, |s| s.prompt_len)
    }

    /// The next prompt position whose logprob is still missing, while the
    /// group asked for prompt logprobs and they are incomplete. Such a group
    /// must compute its whole prompt (no prefix-cache hits).
    pub fn next_prompt_logprob(&self) -> Option<usize> {
        let p = self.prompt_logprobs.as_ref().filter(|p| !p.sent)?;
        let next = p.entries.len().max(1);
        (next < self.prompt_len()).then_some(next)
    }

    /// Records the entry of prompt position `pos` if it is the next one
    /// missing (a duplicate or out-of-order entry is ignored).
    pub fn record_prompt_logprob(&mut self, pos: usize, entry: PromptLogprob) {
        if self.next_prompt_logprob() != Some(pos) {
            return;
        }
        if let Some(p) = self.prompt_logprobs.as_mut() {
            p.entries.push(Some(entry));
        }
    }

    /// Hands out the complete prompt logprobs once; `None` when not asked,
    /// incomplete, or already handed out.
    pub fn take_prompt_logprobs(&mut self) -> Option<Vec<Option<PromptLogprob>>> {
        let prompt_len = self.prompt_len();
        let p = self.prompt_logprobs.as_mut().filter(|p| !p.sent)?;
        if p.entries.len() < prompt_len {
            return None;
        }
        p.sent = true;
        Some(std::mem::take(&mut p.entries))
    }

    /// Upper bound on one sequence's total length under `max_model_len`.
    pub fn max_total_tokens(&self, max_model_len: usize) -> usize {
        let prompt = self.seqs.first().map_or(0, |s| s.prompt_len);
        match self.params.max_tokens {
            Some(m) => (prompt + m).min(max_model_len),
            None => max_model_len,
        }
    }
}

/// Order of the waiting, running and swapped queues: priority, then arrival.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct QueueKey {
    pub priority: i32,
    pub arrival: u64,
    pub id: RequestId,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(token: u32) -> PromptLogprob {
        PromptLogprob {
            token,
            logprob: -1.0,
            rank: 1,
            top: Vec::new(),
        }
    }

    fn group(prompt: Vec<u32>, asked: bool) -> SequenceGroup {
        SequenceGroup {
            request_id: RequestId(0),
            seqs: vec![Sequence::new(SeqId(0), prompt)],
            params: RequestParams::default(),
            arrival: 0,
            num_cached_tokens: 0,
            seed: 0,
            hypotheses: Vec::new(),
            prompt_logprobs: asked.then(PromptLogprobs::new),
        }
    }

    #[test]
    fn prompt_logprobs_are_recorded_in_order_once_and_taken_once() {
        let mut g = group(vec![5, 6, 7], true);
        assert_eq!(g.next_prompt_logprob(), Some(1));
        assert_eq!(g.take_prompt_logprobs(), None, "incomplete");
        g.record_prompt_logprob(2, entry(7)); // out of order: ignored
        g.record_prompt_logprob(1, entry(6));
        g.record_prompt_logprob(1, entry(6)); // duplicate: ignored
        assert_eq!(g.next_prompt_logprob(), Some(2));
        g.record_prompt_logprob(2, entry(7));
        assert_eq!(g.next_prompt_logprob(), None);
        let list = g.take_prompt_logprobs().expect("complete");
        assert_eq!(list, vec![None, Some(entry(6)), Some(entry(7))]);
        assert_eq!(g.take_prompt_logprobs(), None, "handed out once");
        g.record_prompt_logprob(1, entry(6));
        assert_eq!(g.take_prompt_logprobs(), None, "never refilled");
        assert_eq!(g.next_prompt_logprob(), None);
    }

    #[test]
    fn one_token_prompts_and_unasked_groups() {
        let mut one = group(vec![9], true);
        assert_eq!(one.next_prompt_logprob(), None);
        assert_eq!(one.take_prompt_logprobs(), Some(vec![None]));
        let mut none = group(vec![1, 2], false);
        assert_eq!(none.next_prompt_logprob(), None);
        assert_eq!(none.take_prompt_logprobs(), None);
    }
}
