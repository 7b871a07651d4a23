//! Scheduling a step ahead of the previous one's draws (asynchronous
//! scheduling, vLLM's `--async-scheduling`): while the executor runs step
//! N, [`Scheduler::schedule_ahead`] schedules N+1, computing each plain
//! sequence of N one token further, at a placeholder for the token N is
//! drawing. [`Ahead`] remembers those sequences; once N's draws are known,
//! [`Ahead::patch`] writes them over the placeholders in N+1's input ids
//! (before N+1 is launched) and [`Scheduler::update_from_output`] in the
//! KV cache manager's record (before N's tokens are appended).
//!
//! Invariants:
//! - a placeholder lives in a sequence's tokens only inside
//!   `schedule_ahead`: the scheduler's sequences never hold one when the
//!   engine reads them; the KV cache manager's record holds it until the
//!   update of step N;
//! - a placeholder never completes a block while the KV cache manager hashes
//!   block contents (`KvCacheManager::hashes_tokens`): that sequence sits
//!   N+1 out;
//! - a sequence left computed ahead of its tokens (no token was drawn for
//!   it) is aborted by the update.
//!
//! Not scheduled ahead (such a sequence skips N+1 and runs again in N+2):
//! beam search (beams fork and die at the update), a group about to fork
//! (n > 1 or best_of > 1, after its prompt row), prompt_logprobs, a token
//! that will end the sequence by length, and a placeholder that would
//! complete a hashed block.
//!
//! Cost: O(rows of N) plus one schedule; one `HashMap` of N+1's rows to patch.

use super::{RequestId, SampleTarget, Scheduler, SchedulerOutput, SeqStatus, SequenceGroup};
use crate::kv::{KvCacheManager, SeqId};
use std::collections::HashMap;

/// Token id standing in for a draw not known yet. Any valid id: a stale row
/// still runs through the model.
const PLACEHOLDER: u32 = 0;

/// A sequence of the running step that the next step was scheduled ahead of.
#[derive(Debug, Clone, Copy)]
struct Spec {
    request_id: RequestId,
    seq_index: usize,
    seq_id: SeqId,
    /// Position of the placeholder.
    pos: usize,
    /// The drawn token, once written into the next step's input.
    token: Option<u32>,
}

/// The sequences a step was scheduled ahead of (see the module docs).
#[derive(Debug, Default)]
pub struct Ahead {
    specs: Vec<Spec>,
}

impl Ahead {
    /// Nothing scheduled ahead (the synchronous loop).
    pub fn none() -> Self {
        Self::default()
    }

    /// Sequences scheduled ahead of their draw.
    pub fn len(&self) -> usize {
        self.specs.len()
    }

    /// Whether no sequence was scheduled ahead.
    pub fn is_empty(&self) -> bool {
        self.specs.is_empty()
    }

    /// Writes each drawn token (`tokens`, by request and sequence index)
    /// over its placeholder in `next`'s input ids, for the sequences `next`
    /// computes at the placeholder's position.
    pub fn patch(&mut self, tokens: &HashMap<(RequestId, usize), u32>, next: &mut SchedulerOutput) {
        let rows: HashMap<(RequestId, usize), (usize, usize)> = next
            .targets
            .iter()
            .enumerate()
            .map(|(i, t)| ((t.request_id, t.seq_index), (i, t.num_tokens)))
            .collect();
        for s in &mut self.specs {
            let key = (s.request_id, s.seq_index);
            let (Some(&(i, n)), Some(&token)) = (rows.get(&key), tokens.get(&key)) else {
                continue;
            };
            let Some(&row) = next.batch.logits_rows.get(i).filter(|_| n == s.pos + 1) else {
                continue;
            };
            if let Some(slot) = next.batch.token_ids.get_mut(row) {
                *slot = token;
                s.token = Some(token);
            }
        }
    }

    /// `(request, sequence id, drawn token)` of every patched placeholder.
    pub(super) fn patched(&self) -> impl Iterator<Item = (RequestId, SeqId, u32)> + '_ {
        self.specs
            .iter()
            .filter_map(|s| Some((s.request_id, s.seq_id, s.token?)))
    }

    /// `(request, sequence index)` of every sequence scheduled ahead.
    pub(super) fn sequences(&self) -> impl Iterator<Item = (RequestId, usize)> + '_ {
        self.specs.iter().map(|s| (s.request_id, s.seq_index))
    }
}

/// Whether a group's sequences may be scheduled ahead of their draw.
fn speculable(g: &SequenceGroup) -> bool {
    let p = &g.params.sampling;
    !p.use_beam_search && p.prompt_logprobs.is_none() && !g.needs_fork()
}

impl Scheduler {
    /// Schedules the next step while `running`'s rows are being drawn
    /// (see the module docs).
    pub fn schedule_ahead(
        &mut self,
        kv: &mut dyn KvCacheManager,
        running: &[SampleTarget],
    ) -> (SchedulerOutput, Ahead) {
        let specs = self.push_placeholders(kv, running);
        let next = self.schedule(kv);
        for s in &specs {
            let seq = self
                .groups
                .get_mut(&s.request_id)
                .and_then(|g| g.seqs.get_mut(s.seq_index));
            if let Some(seq) = seq.filter(|q| q.tokens.len() == s.pos + 1) {
                seq.tokens.pop();
            }
        }
        (next, Ahead { specs })
    }

    /// Gives each speculable, caught-up sequence of `running` a placeholder
    /// for the token it is drawing.
    fn push_placeholders(
        &mut self,
        kv: &dyn KvCacheManager,
        running: &[SampleTarget],
    ) -> Vec<Spec> {
        let hashed = kv.hashes_tokens();
        let bs = kv.block_size();
        let max_model_len = self.config.max_model_len;
        let mut specs = Vec::new();
        for t in running {
            let Some(g) = self.groups.get_mut(&t.request_id) else {
                continue;
            };
            if !speculable(g) {
                continue;
            }
            let max_tokens = g.params.max_tokens;
            let Some(seq) = g.seqs.get_mut(t.seq_index) else {
                continue;
            };
            let len = seq.tokens.len();
            let caught_up = len == t.num_tokens && seq.num_computed_tokens == len;
            if seq.status != SeqStatus::Running || !caught_up {
                continue;
            }
            let ends = max_tokens.is_some_and(|m| len + 1 - seq.prompt_len >= m)
                || len + 1 >= max_model_len;
            if ends || (hashed && (len + 1).is_multiple_of(bs)) {
                continue;
            }
            seq.tokens.push(PLACEHOLDER);
            specs.push(Spec {
                request_id: t.request_id,
                seq_index: t.seq_index,
                seq_id: seq.id,
                pos: len,
                token: None,
            });
        }
        specs
    }
}
