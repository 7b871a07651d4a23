//! Iteration-level scheduler (continuous batching).
//!
//! Every step runs three phases with one [`StepBudget`]:
//! 1. **running**: keep resident groups going (decode tokens and continuing
//!    prefill chunks), in priority/arrival order. When the accelerator pool
//!    cannot hold a group's new slots, the lowest-priority, latest-arrived
//!    running group is preempted whole: swapped out when the CPU pool has
//!    room (per [`PreemptionMode`]), otherwise freed for recomputation.
//! 2. **swapped**: resume swapped groups (oldest first) before anything new.
//! 3. **waiting**: admit waiting groups FCFS (by priority, then arrival) while
//!    `can_admit` says `Now` and the budget has room. `Never` refuses the
//!    request at once; `Later` stops admission (FCFS, no overtaking).
//!    Phases 2 and 3 are skipped in a step that preempted, and phase 3 while
//!    any group is swapped out.
//!
//! Invariants:
//! - a group is in exactly one of the waiting, running and swapped queues
//!   until it finishes; all its unfinished sequences share its status;
//! - a resident sequence's KV cache holds `num_computed_tokens` tokens;
//! - a step's tokens never exceed `max_num_batched_tokens`, and resident
//!   sequences never exceed `max_num_seqs`;
//! - a victim is never a group already scheduled in the same step (groups are
//!   scheduled from the front of the running queue, victims taken from its back);
//! - a group still collecting prompt logprobs takes no prefix-cache hit at
//!   admission (a cached token is never computed, so it has no logits row)
//!   and asks for one extra logits row per prompt position it scores for
//!   the first time; under chunked prefill its chunks are capped at
//!   `MAX_PROMPT_LOGPROB_ROWS` tokens.
//!
//! Cost per step: O(G log G) queue work for G groups, plus O(tokens) batch
//! assembly and one `blocks_needed_to_append` per scheduled sequence.

mod ahead;
mod batch;
mod beam;
mod budget;
mod config;
mod group_ops;
mod lora;
mod output;
mod phases;
mod sequence;
mod spec;
mod update;

pub use ahead::Ahead;
pub use batch::{PromptTarget, SampleTarget, MAX_PROMPT_LOGPROB_ROWS};
pub use budget::StepBudget;
pub use config::{PreemptionMode, SchedulerConfig};
pub use lora::LoraRequest;
pub use output::{Outputs, RequestOutput, SeqOutput};
pub use sequence::{
    FinishReason, Hypothesis, PromptLogprobs, QueueKey, RequestId, RequestParams, SeqStatus,
    Sequence, SequenceGroup,
};
pub use spec::{SpecCandidate, SpecStats, SpecTarget};
pub use update::{finish_reason, Draw, Drawn, StepOutcome};

use crate::error::{EngineError, RequestError};
use crate::kv::{AdmitDecision, KvCacheManager, LengthHint, SeqId};
use engine_core::{BlockOps, ForwardBatch};
use std::collections::{BTreeSet, HashMap};

/// Counters and gauges for `/metrics` and benchmarks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SchedulerStats {
    pub num_running: usize,
    pub num_waiting: usize,
    pub num_swapped: usize,
    pub preemptions_swap: u64,
    pub preemptions_recompute: u64,
    /// Prompt tokens computed (recomputed prompt tokens count again).
    pub prompt_tokens: u64,
    /// Tokens sampled.
    pub generation_tokens: u64,
    /// Requests refused after queueing (they could never fit).
    pub refused: u64,
    pub steps: u64,
    /// Speculative decoding's counters.
    pub spec: SpecStats,
}

/// What one `schedule` call decided.
#[derive(Debug, Default)]
pub struct SchedulerOutput {
    pub batch: ForwardBatch,
    pub ops: BlockOps,
    /// The sequence of each sampled logits row: logits row `i` is
    /// `targets[i]` (the first `targets.len()` entries of `batch.logits_rows`).
    pub targets: Vec<SampleTarget>,
    /// Prompt positions scored this step (`prompt_logprobs`): logits row
    /// `targets.len() + i` is the distribution of `prompt_targets[i]`.
    pub prompt_targets: Vec<PromptTarget>,
    /// Sequences verifying proposals: their rows follow the prompt rows
    /// (see [`SchedulerOutput::spec_rows`]).
    pub spec: Vec<SpecTarget>,
    /// Groups removed this step with an error (never fit, KV failure).
    pub refused: Vec<(RequestId, EngineError)>,
    /// Groups preempted this step.
    pub preempted: Vec<RequestId>,
    /// Groups with tokens in `batch`.
    pub scheduled: Vec<RequestId>,
    /// Per sequence of `batch` (`batch.seqs` order): its LoRA adapter.
    pub seq_lora: Vec<Option<LoraRequest>>,
}

impl SchedulerOutput {
    /// True when there is neither a forward pass nor a block move to run.
    pub fn is_empty(&self) -> bool {
        self.batch.token_ids.is_empty() && self.ops.is_empty()
    }

    /// The logits row of each `spec` entry's first proposal: proposal `j`
    /// of `spec[i]` is scored by row `spec_rows()[i] + j` (the rows of all
    /// proposals follow the sampled and the prompt rows, in order).
    pub fn spec_rows(&self) -> Vec<usize> {
        let mut row = self.targets.len() + self.prompt_targets.len();
        self.spec
            .iter()
            .map(|s| {
                let first = row;
                row += s.proposals.len();
                first
            })
            .collect()
    }

    /// Logits rows the step asks for: sampled, prompt and proposal rows.
    pub fn num_logits_rows(&self) -> usize {
        self.targets.len()
            + self.prompt_targets.len()
            + self.spec.iter().map(|s| s.proposals.len()).sum::<usize>()
    }
}

/// The scheduler: owns every unfinished request's sequences.
#[derive(Debug)]
pub struct Scheduler {
    config: SchedulerConfig,
    groups: HashMap<RequestId, SequenceGroup>,
    waiting: BTreeSet<QueueKey>,
    running: BTreeSet<QueueKey>,
    swapped: BTreeSet<QueueKey>,
    next_arrival: u64,
    next_seq: u64,
    stats: SchedulerStats,
    /// Tokens that end a sequence unless `ignore_eos` (the model's EOS).
    eos_token_ids: Vec<u32>,
    /// Most distinct LoRA adapters among running groups (0: no adapters
    /// served; see `lora.rs`).
    max_loras: usize,
}

impl Scheduler {
    /// A scheduler with validated budgets.
    pub fn new(config: SchedulerConfig) -> Result<Self, EngineError> {
        config.validate()?;
        Ok(Self {
            config,
            groups: HashMap::new(),
            waiting: BTreeSet::new(),
            running: BTreeSet::new(),
            swapped: BTreeSet::new(),
            next_arrival: 0,
            next_seq: 0,
            stats: SchedulerStats::default(),
            eos_token_ids: Vec::new(),
            max_loras: 0,
        })
    }

    /// The model's end-of-sequence ids (a sequence drawing one finishes
    /// unless its request ignores EOS).
    pub fn with_eos_token_ids(mut self, eos: Vec<u32>) -> Self {
        self.eos_token_ids = eos;
        self
    }

    pub fn config(&self) -> &SchedulerConfig {
        &self.config
    }

    /// Queues a validated request of one sequence. Refuses a duplicate id,
    /// and a request that could grow larger than what `kv` would ever admit
    /// (the whole cache less its watermark: a state of the cache, not of the
    /// request, so it is checked here rather than in [`validate_request`]).
    pub fn add_request(
        &mut self,
        kv: &dyn KvCacheManager,
        request_id: RequestId,
        request: ValidRequest,
    ) -> Result<(), EngineError> {
        if self.groups.contains_key(&request_id) {
            return Err(RequestError::DuplicateRequest(request_id).into());
        }
        let ValidRequest { prompt, params } = request;
        let seq = Sequence::new(SeqId(self.next_seq), prompt);
        self.next_seq += 1;
        let seed = params.sampling.seed.unwrap_or_else(rand::random);
        let prompt_logprobs = params
            .sampling
            .prompt_logprobs
            .map(|_| PromptLogprobs::new());
        let group = SequenceGroup {
            request_id,
            seqs: vec![seq],
            params,
            arrival: self.next_arrival,
            num_cached_tokens: 0,
            seed,
            hypotheses: Vec::new(),
            prompt_logprobs,
        };
        self.check_admissible_at_full_length(kv, &group)?;
        self.next_arrival += 1;
        self.waiting.insert(group.key());
        self.groups.insert(request_id, group);
        Ok(())
    }

    /// A group preempted by recompute is readmitted with all its tokens as
    /// its prompt. Asks the KV cache whether the longest such prompt could
    /// ever be admitted (its watermark included), so a request is refused
    /// now rather than in the middle of its generation.
    fn check_admissible_at_full_length(
        &self,
        kv: &dyn KvCacheManager,
        group: &SequenceGroup,
    ) -> Result<(), EngineError> {
        let max_total = group.max_total_tokens(self.config.max_model_len);
        let Some(seq) = group.seqs.first() else {
            return Ok(());
        };
        let mut probe = seq.tokens.clone();
        // The last generated token is never part of a readmitted prompt.
        probe.resize((max_total - 1).max(probe.len()), 0);
        let hint = LengthHint {
            max_total_tokens: max_total,
            oracle_total_tokens: None,
        };
        if kv.can_admit(&probe, group.expected_seqs(), hint) == AdmitDecision::Never {
            return Err(RequestError::NeverFits {
                needed_tokens: probe.len(),
                capacity_tokens: kv.stats().total_blocks * kv.block_size(),
            }
            .into());
        }
        Ok(())
    }

    /// Removes a request wherever it is and frees all its blocks at once.
    /// Returns the group, or `None` for an unknown (or finished) id.
    pub fn abort(
        &mut self,
        kv: &mut dyn KvCacheManager,
        request_id: RequestId,
    ) -> Option<SequenceGroup> {
        let mut group = self.groups.remove(&request_id)?;
        let key = group.key();
        self.waiting.remove(&key);
        self.running.remove(&key);
        self.swapped.remove(&key);
        for seq in group.seqs.iter_mut() {
            if matches!(seq.status, SeqStatus::Running | SeqStatus::Swapped) {
                kv.free(seq.id);
            }
            if !seq.is_finished() {
                seq.status = SeqStatus::Finished(FinishReason::Abort);
            }
        }
        Some(group)
    }

    /// A live group.
    pub fn group(&self, request_id: RequestId) -> Option<&SequenceGroup> {
        self.groups.get(&request_id)
    }

    /// Marks one sequence finished and frees its blocks. When the whole group
    /// is finished it leaves the scheduler and is returned.
    pub fn finish_seq(
        &mut self,
        kv: &mut dyn KvCacheManager,
        request_id: RequestId,
        seq_index: usize,
        reason: FinishReason,
    ) -> Option<SequenceGroup> {
        let group = self.groups.get_mut(&request_id)?;
        let seq = group.seqs.get_mut(seq_index)?;
        if !seq.is_finished() {
            if matches!(seq.status, SeqStatus::Running | SeqStatus::Swapped) {
                kv.free(seq.id);
            }
            seq.status = SeqStatus::Finished(reason);
        }
        if !group.is_finished() {
            return None;
        }
        let key = group.key();
        self.waiting.remove(&key);
        self.running.remove(&key);
        self.swapped.remove(&key);
        self.groups.remove(&request_id)
    }

    /// Counts sampled tokens (the engine loop calls this after sampling).
    pub fn record_generated(&mut self, tokens: usize) {
        self.stats.generation_tokens += tokens as u64;
    }

    /// Whether any request is unfinished.
    pub fn has_unfinished(&self) -> bool {
        !self.groups.is_empty()
    }

    pub fn num_waiting(&self) -> usize {
        self.waiting.len()
    }

    /// Counters and current queue sizes.
    pub fn stats(&self) -> SchedulerStats {
        SchedulerStats {
            num_running: self.running.len(),
            num_waiting: self.waiting.len(),
            num_swapped: self.swapped.len(),
            ..self.stats
        }
    }

    /// Decides one step: which tokens run, which blocks move, who is
    /// preempted, admitted or refused. Slots are reserved in `kv` and
    /// `num_computed_tokens` advanced as the batch is built.
    pub fn schedule(&mut self, kv: &mut dyn KvCacheManager) -> SchedulerOutput {
        let mut step = phases::Step::new(&self.config);
        self.schedule_running(kv, &mut step);
        if step.out.preempted.is_empty() {
            self.schedule_swapped(kv, &mut step);
            if self.swapped.is_empty() {
                self.schedule_waiting(kv, &mut step);
            }
        }
        self.stats.steps += 1;
        self.stats.prompt_tokens += step.builder.prompt_tokens as u64;
        step.finish()
    }
}

/// Checks a request against the budgets before it is queued, the one
/// place a request is validated (the async handle calls it at submission,
/// so the caller gets these errors synchronously; the server only converts
/// the wire format): its sampling parameters in range, a prompt that is not
/// empty, the one context-length rule (vLLM's: `prompt + max_tokens <=
/// max_model_len`, with `max_tokens` absent counting as 1, so a prompt
/// must leave room for one token), and never larger than the whole KV cache
/// (`capacity_tokens`) even at its longest.
pub fn validate_request(
    config: &SchedulerConfig,
    capacity_tokens: usize,
    prompt: Vec<u32>,
    params: RequestParams,
) -> Result<ValidRequest, RequestError> {
    if params.max_tokens == Some(0) {
        return Err(RequestError::InvalidParam {
            param: "max_tokens",
            reason: "must be at least 1".into(),
        });
    }
    params.sampling.validate(params.max_tokens)?;
    if config.speculative.is_some() && params.sampling.use_beam_search {
        return Err(RequestError::InvalidParam {
            param: "use_beam_search",
            reason: "beam search cannot be combined with speculative decoding \
                     (the server runs with --speculative-config)"
                .into(),
        });
    }
    if prompt.is_empty() {
        return Err(RequestError::EmptyPrompt);
    }
    let max_model_len = config.max_model_len;
    let max_tokens = params.max_tokens.unwrap_or(1);
    if prompt.len() + max_tokens > max_model_len {
        return Err(RequestError::ContextTooLong {
            prompt_len: prompt.len(),
            max_tokens,
            max_model_len,
        });
    }
    let longest = match params.max_tokens {
        Some(m) => prompt.len() + m,
        None => max_model_len,
    };
    // The last generated token is never written to the cache.
    let needed_tokens = longest - 1;
    if needed_tokens > capacity_tokens {
        return Err(RequestError::NeverFits {
            needed_tokens,
            capacity_tokens,
        });
    }
    Ok(ValidRequest { prompt, params })
}

/// A request that passed [`validate_request`]; the scheduler takes nothing
/// else, so a request is validated once, wherever it is submitted.
#[derive(Debug, Clone)]
pub struct ValidRequest {
    prompt: Vec<u32>,
    params: RequestParams,
}

impl ValidRequest {
    /// The prompt's token ids.
    pub fn prompt(&self) -> &[u32] {
        &self.prompt
    }

    /// The request's parameters.
    pub fn params(&self) -> &RequestParams {
        &self.params
    }
}
