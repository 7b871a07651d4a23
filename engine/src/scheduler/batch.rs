//! Turning scheduled token counts into a [`ForwardBatch`].
//!
//! Invariants: a sequence is pushed at most once per step; its K/V slots are
//! reserved (`append_slots`) in the same call that adds its tokens, so the
//! batch and the KV cache never disagree on `context_len`. Logits rows are
//! the sampled rows first (one per [`SampleTarget`]), then the prompt rows
//! of groups collecting prompt logprobs (one per [`PromptTarget`]).
//! Cost: O(tokens + block table length) per pushed sequence.

use super::sequence::{RequestId, SequenceGroup};
use super::spec::SpecTarget;
use crate::kv::{BlockCopy, KvCacheManager, KvError};
use engine_core::{ForwardBatch, SeqSpan};

/// Which sequence a logits row belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SampleTarget {
    pub request_id: RequestId,
    /// Index into the group's `seqs`.
    pub seq_index: usize,
    /// The sequence's token count when scheduled: the row's draw becomes
    /// token number `num_tokens`. A row whose sequence has since changed
    /// (finished, or grown otherwise) is stale and its draw is dropped.
    pub num_tokens: usize,
}

/// A prompt position scored this step: the logits row of position
/// `position - 1` gives the logprob of prompt token `position`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PromptTarget {
    pub request_id: RequestId,
    /// Prompt position scored (>= 1).
    pub position: usize,
}

/// Most prompt positions one group scores in a step under chunked prefill
/// (each costs a vocab-wide logits row: 256 x 49152 floats is 50 MB).
pub const MAX_PROMPT_LOGPROB_ROWS: usize = 256;

/// How many tokens each sequence of a group computes this step.
pub(crate) type TokenPlan = Vec<(usize, usize)>;

/// Accumulates one step's batch.
#[derive(Debug, Default)]
pub(crate) struct BatchBuilder {
    pub batch: ForwardBatch,
    pub copies: Vec<BlockCopy>,
    pub targets: Vec<SampleTarget>,
    /// Batch rows whose logits score prompt tokens, and what they score.
    pub prompt_rows: Vec<usize>,
    pub prompt_targets: Vec<PromptTarget>,
    /// Batch rows of speculative proposals, and whose they are.
    pub spec_rows: Vec<usize>,
    pub spec: Vec<SpecTarget>,
    /// Prompt tokens computed this step (first computation or recompute).
    pub prompt_tokens: usize,
    /// Each pushed sequence's LoRA adapter, in `batch.seqs` order.
    pub seq_lora: Vec<Option<super::LoraRequest>>,
}

impl BatchBuilder {
    /// Appends the planned tokens of `group`'s sequences to the batch,
    /// reserving their slots. A sequence that catches up with its tokens gets
    /// a logits row; a group collecting prompt logprobs gets one row per
    /// prompt position this chunk scores for the first time.
    pub fn push_group(
        &mut self,
        kv: &mut dyn KvCacheManager,
        group: &mut SequenceGroup,
        plan: &TokenPlan,
    ) -> Result<(), KvError> {
        let next_prompt = group.next_prompt_logprob();
        for &(seq_index, num_new) in plan {
            let Some(seq) = group.seqs.get_mut(seq_index) else {
                continue;
            };
            let start = seq.num_computed_tokens;
            let first_row = self.batch.token_ids.len();
            let end = start + num_new;
            // Past the sequence's tokens, the plan computes its proposals
            // (speculative decoding; see `spec`).
            let real_end = end.min(seq.tokens.len());
            let proposals = std::mem::take(&mut seq.proposals);
            let proposals = &proposals[..proposals.len().min(end - real_end)];
            let tokens = &seq.tokens[start..real_end];
            let mut outcome = kv.append_slots(seq.id, tokens)?;
            if !proposals.is_empty() {
                let more = kv.append_provisional(seq.id, proposals)?;
                outcome.slots.extend(more.slots);
                outcome.copies.extend(more.copies);
            }
            let end = real_end + proposals.len();
            let block_table = kv.block_table(seq.id)?.to_vec();
            self.batch.token_ids.extend_from_slice(tokens);
            self.batch.token_ids.extend_from_slice(proposals);
            self.batch.positions.extend(start..end);
            self.batch.slot_mapping.extend_from_slice(&outcome.slots);
            self.copies.extend_from_slice(&outcome.copies);
            self.prompt_tokens += seq.prompt_len.saturating_sub(start).min(num_new);
            seq.num_computed_tokens = end;
            self.batch.seqs.push(SeqSpan {
                query_len: num_new,
                context_len: end,
                block_table,
            });
            self.seq_lora.push(group.params.lora.clone());
            if let Some(next) = next_prompt.filter(|_| seq_index == 0) {
                // Row `p` scores token `p + 1`: positions start+1 ..= end,
                // within the prompt, from the first one still missing.
                let last = end.min(seq.prompt_len - 1);
                for pos in next.max(start + 1)..=last {
                    self.prompt_rows.push(first_row + (pos - 1 - start));
                    self.prompt_targets.push(PromptTarget {
                        request_id: group.request_id,
                        position: pos,
                    });
                }
            }
            if real_end == seq.tokens.len() {
                let row = first_row + (real_end - 1 - start);
                self.batch.logits_rows.push(row);
                if !proposals.is_empty() {
                    self.spec_rows.extend(row + 1..=row + proposals.len());
                    self.spec.push(SpecTarget {
                        target: self.targets.len(),
                        proposals: proposals.to_vec(),
                    });
                }
                self.targets.push(SampleTarget {
                    request_id: group.request_id,
                    seq_index,
                    num_tokens: real_end,
                });
            }
        }
        Ok(())
    }
}

/// Plans the tokens of a resident group within `remaining_tokens`.
/// With chunking, a long catch-up is cut to what fits (and, while the group
/// collects prompt logprobs, to [`MAX_PROMPT_LOGPROB_ROWS`] tokens); without
/// it, a sequence is scheduled whole or not at all. `None` when nothing fits.
pub(crate) fn plan_tokens(
    group: &SequenceGroup,
    remaining_tokens: usize,
    chunked: bool,
) -> Option<TokenPlan> {
    let mut left = remaining_tokens;
    if chunked && group.next_prompt_logprob().is_some() {
        left = left.min(MAX_PROMPT_LOGPROB_ROWS);
    }
    let mut plan = TokenPlan::new();
    for (i, seq) in group.seqs.iter().enumerate() {
        if seq.is_finished() || seq.num_uncomputed() == 0 {
            continue;
        }
        let want = seq.num_uncomputed();
        let take = if chunked {
            want.min(left)
        } else if want <= left {
            want
        } else {
            return None;
        };
        if take == 0 {
            break;
        }
        left -= take;
        plan.push((i, take));
    }
    if plan.is_empty() {
        None
    } else {
        Some(plan)
    }
}

/// Total tokens of a plan.
pub(crate) fn plan_len(plan: &TokenPlan) -> usize {
    plan.iter().map(|&(_, n)| n).sum()
}

/// Free accelerator blocks the plan would consume.
pub(crate) fn blocks_needed(
    kv: &dyn KvCacheManager,
    group: &SequenceGroup,
    plan: &TokenPlan,
) -> Result<usize, KvError> {
    let mut total = 0;
    for &(i, n) in plan {
        if let Some(seq) = group.seqs.get(i) {
            total += kv.blocks_needed_to_append(seq.id, n)?;
        }
    }
    Ok(total)
}
