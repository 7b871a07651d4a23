//! The scheduler's side of speculative decoding (see `crate::spec`):
//! which sequences may speculate this step ([`Scheduler::spec_candidates`]),
//! how many of their proposals the step's token and block budgets take
//! ([`Scheduler::with_proposals`]), and the update that appends the
//! accepted tokens and rolls the rejected slots back
//! ([`Scheduler::apply_spec`]).
//!
//! Invariants:
//! - a sequence speculates only while plainly decoding: one sequence in its
//!   group (no n / best_of fork, no beam search), no grammar, no prompt
//!   logprobs pending, exactly one token to compute;
//! - proposals never push a sequence past `max_tokens` or `max_model_len`:
//!   a step with `k` proposals emits at most `k + 1` tokens;
//! - proposals take only what is left of the step's token budget after one
//!   token for every running sequence not scheduled yet, and only free
//!   blocks: speculation never preempts anyone;
//! - after the update, a live sequence's KV cache holds exactly its
//!   `num_computed_tokens` tokens again (the accepted ones), settled.
//!
//! Cost: O(running groups) per step for the candidates; the update
//! O(accepted tokens) plus one settle per speculating sequence.

use super::batch::{blocks_needed, TokenPlan};
use super::output::Outputs;
use super::phases::Step;
use super::update::Draw;
use super::{QueueKey, RequestId, Scheduler, SeqStatus, SequenceGroup};
use crate::error::EngineError;
use crate::kv::{KvCacheManager, SeqId};
use crate::sampler::SampleOut;
use crate::spec::MAX_SPEC_TOKENS;

/// A sequence that speculates this step: logits rows for its proposals
/// follow the step's prompt rows (see `SchedulerOutput::spec_rows`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecTarget {
    /// Index into `SchedulerOutput::targets`: the row of the sequence's
    /// last token, whose draw is compared with `proposals[0]`.
    pub target: usize,
    /// The proposed tokens computed this step, in order.
    pub proposals: Vec<u32>,
}

/// A sequence that may get proposals for the next step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpecCandidate {
    pub request_id: RequestId,
    pub seq_id: SeqId,
    /// Most proposals it may take.
    pub max: usize,
}

/// Speculative decoding counters (vLLM's `vllm:spec_decode_*`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SpecStats {
    /// Sequence-steps that verified proposals.
    pub drafts: u64,
    /// Proposed tokens verified.
    pub draft_tokens: u64,
    /// Proposed tokens accepted.
    pub accepted_tokens: u64,
    /// Accepted proposals by position (0 = the first proposal).
    pub accepted_per_pos: [u64; MAX_SPEC_TOKENS],
}

/// Whether a group's one sequence may speculate (see the module docs).
fn plain(g: &SequenceGroup) -> bool {
    let p = &g.params.sampling;
    g.seqs.len() == 1
        && p.width() == 1
        && !p.use_beam_search
        && p.structured.is_none()
        && g.next_prompt_logprob().is_none()
}

impl Scheduler {
    /// Whether speculation is on, the load allows it (fewer than
    /// `disable_by_batch_size` requests running or waiting) and some
    /// running group could speculate (whatever its sequence's progress).
    pub fn may_speculate(&self) -> bool {
        self.load_allows_speculation()
            && self
                .running
                .iter()
                .any(|key| self.groups.get(&key.id).is_some_and(plain))
    }

    /// Speculation is on and fewer than `disable_by_batch_size` requests
    /// are running or waiting.
    fn load_allows_speculation(&self) -> bool {
        let load = self.running.len() + self.waiting.len() + self.swapped.len();
        self.config
            .speculative
            .as_ref()
            .is_some_and(|c| c.disable_by_batch_size.is_none_or(|n| load < n))
    }

    /// The running sequences that may speculate in the next step, with how
    /// many tokens each may take. Empty when speculation is off, or when
    /// `disable_by_batch_size` requests or more are running or waiting.
    pub fn spec_candidates(&self) -> Vec<SpecCandidate> {
        let Some(cfg) = self
            .config
            .speculative
            .as_ref()
            .filter(|_| self.load_allows_speculation())
        else {
            return Vec::new();
        };
        let max_model_len = self.config.max_model_len;
        self.running
            .iter()
            .filter_map(|key| {
                let g = self.groups.get(&key.id).filter(|g| plain(g))?;
                let s = g.seqs.first()?;
                if s.status != SeqStatus::Running || s.num_uncomputed() != 1 || s.in_prefill() {
                    return None;
                }
                let len = s.tokens.len();
                // Accepting `a` proposals adds `a + 1` tokens.
                let by_len = max_model_len.saturating_sub(len + 1);
                let by_tokens = g
                    .params
                    .max_tokens
                    .map_or(usize::MAX, |m| m.saturating_sub(len - s.prompt_len + 1));
                let max = cfg.num_speculative_tokens.min(by_len).min(by_tokens);
                (max > 0).then_some(SpecCandidate {
                    request_id: key.id,
                    seq_id: s.id,
                    max,
                })
            })
            .collect()
    }

    /// The ids of every unfinished sequence (a proposer drops the state of
    /// the others).
    pub fn live_seq_ids(&self) -> std::collections::HashSet<SeqId> {
        self.groups
            .values()
            .flat_map(|g| g.seqs.iter())
            .filter(|s| !s.is_finished())
            .map(|s| s.id)
            .collect()
    }

    /// Sets the proposals of a request's sequence for the next step (at
    /// most what [`Self::spec_candidates`] allowed; more are cut).
    pub fn set_proposals(&mut self, request_id: RequestId, mut proposals: Vec<u32>) {
        let Some(g) = self.groups.get_mut(&request_id) else {
            return;
        };
        let k = self
            .config
            .speculative
            .as_ref()
            .map_or(0, |c| c.num_speculative_tokens);
        proposals.truncate(k);
        if let Some(s) = g.seqs.first_mut() {
            s.proposals = proposals;
        }
    }

    /// `plan` extended by the group's proposals where the budget and the
    /// free blocks allow, leaving one token for each of the `later`
    /// running groups not scheduled yet.
    pub(super) fn with_proposals(
        &self,
        kv: &dyn KvCacheManager,
        step: &Step,
        key: QueueKey,
        plan: TokenPlan,
        later: usize,
    ) -> TokenPlan {
        let Some(g) = self.groups.get(&key.id) else {
            return plan;
        };
        let Some(s) = g.seqs.first().filter(|s| !s.proposals.is_empty()) else {
            return plan;
        };
        if plan != [(0, 1)] || !plain(g) {
            return plan;
        }
        let room = step.budget.remaining_tokens().saturating_sub(1 + later);
        let extra = s.proposals.len().min(room);
        if extra == 0 {
            return plan;
        }
        let ext = vec![(0, 1 + extra)];
        match blocks_needed(kv, g, &ext) {
            Ok(n) if n <= kv.num_free_blocks() => ext,
            _ => plan,
        }
    }

    /// Applies a step's verified proposals: `accepted[i]` holds the draws
    /// after `spec[i]`'s target draw, one per accepted proposal (so the
    /// last of them is the first that differed from its proposal, or the
    /// bonus token). Appends them (stopping at a finish), settles the KV
    /// cache to the accepted proposals and sets `num_computed_tokens`.
    pub(super) fn apply_spec(
        &mut self,
        kv: &mut dyn KvCacheManager,
        targets: &[super::SampleTarget],
        spec: &[SpecTarget],
        accepted: Vec<Vec<SampleOut>>,
        outs: &mut Outputs,
    ) {
        let mut accepted = accepted.into_iter();
        for st in spec {
            let more = accepted.next().unwrap_or_default();
            let Some(&t) = targets.get(st.target) else {
                continue;
            };
            self.record_spec(st.proposals.len(), more.len());
            let alive = |sched: &Self| {
                sched
                    .group(t.request_id)
                    .and_then(|g| g.seqs.get(t.seq_index))
                    .filter(|s| !s.is_finished())
                    .map(|s| (s.tokens.len(), s.status, s.id))
            };
            let Some((len, _, _)) = alive(self) else {
                continue; // finished (blocks freed) or gone
            };
            let mut keep = 0;
            if len == t.num_tokens + 1 {
                for s in more {
                    let d = Draw {
                        row: st.target,
                        request_id: t.request_id,
                        seq_index: t.seq_index,
                    };
                    self.append_sampled(kv, d, s, outs);
                    keep += 1;
                    if alive(self).is_none() {
                        break;
                    }
                }
                self.record_generated(keep);
            }
            let Some((_, status, seq_id)) = alive(self) else {
                continue;
            };
            if !matches!(status, SeqStatus::Running) {
                continue; // preempted by recompute: nothing cached
            }
            if let Err(e) = kv.settle_provisional(seq_id, keep) {
                if self.abort(kv, t.request_id).is_some() {
                    outs.push_failed(t.request_id, EngineError::from(e));
                }
                continue;
            }
            if let Some(s) = self
                .groups
                .get_mut(&t.request_id)
                .and_then(|g| g.seqs.get_mut(t.seq_index))
            {
                s.num_computed_tokens = t.num_tokens + keep;
            }
        }
    }

    fn record_spec(&mut self, proposed: usize, accepted: usize) {
        let s = &mut self.stats.spec;
        s.drafts += 1;
        s.draft_tokens += proposed as u64;
        s.accepted_tokens += accepted as u64;
        for n in s.accepted_per_pos.iter_mut().take(accepted) {
            *n += 1;
        }
    }
}
