//! Turning scheduled token counts into a [`ForwardBatch`].
//!
//! Invariant: a sequence is pushed at most once per step; its K/V slots are
//! reserved (`append_slots`) in the same call that adds its tokens, so the
//! batch and the KV cache never disagree on `context_len`.
//! Cost: O(tokens + block table length) per pushed sequence.

use super::sequence::{RequestId, SequenceGroup};
use crate::executor::{ForwardBatch, SeqSpan};
use crate::kv::{BlockCopy, KvCacheManager, KvError};

/// Which sequence a logits row belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SampleTarget {
    pub request_id: RequestId,
    /// Index into the group's `seqs`.
    pub seq_index: usize,
}

/// How many tokens each sequence of a group computes this step.
pub(crate) type TokenPlan = Vec<(usize, usize)>;

/// Accumulates one step's batch.
#[derive(Debug, Default)]
pub(crate) struct BatchBuilder {
    pub batch: ForwardBatch,
    pub copies: Vec<BlockCopy>,
    pub targets: Vec<SampleTarget>,
    /// Prompt tokens computed this step (first computation or recompute).
    pub prompt_tokens: usize,
}

impl BatchBuilder {
    /// Appends the planned tokens of `group`'s sequences to the batch,
    /// reserving their slots. A sequence that catches up with its tokens gets
    /// a logits row.
    pub fn push_group(
        &mut self,
        kv: &mut dyn KvCacheManager,
        group: &mut SequenceGroup,
        plan: &TokenPlan,
    ) -> Result<(), KvError> {
        for &(seq_index, num_new) in plan {
            let Some(seq) = group.seqs.get_mut(seq_index) else {
                continue;
            };
            let start = seq.num_computed_tokens;
            let end = start + num_new;
            let tokens = &seq.tokens[start..end];
            let outcome = kv.append_slots(seq.id, tokens)?;
            let block_table = kv.block_table(seq.id)?.to_vec();
            self.batch.token_ids.extend_from_slice(tokens);
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
            if end == seq.tokens.len() {
                self.batch.logits_rows.push(self.batch.token_ids.len() - 1);
                self.targets.push(SampleTarget {
                    request_id: group.request_id,
                    seq_index,
                });
            }
        }
        Ok(())
    }
}

/// Plans the tokens of a resident group within `remaining_tokens`.
/// With chunking, a long catch-up is cut to what fits; without it, a
/// sequence is scheduled whole or not at all. `None` when nothing fits.
pub(crate) fn plan_tokens(
    group: &SequenceGroup,
    remaining_tokens: usize,
    chunked: bool,
) -> Option<TokenPlan> {
    let mut left = remaining_tokens;
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
