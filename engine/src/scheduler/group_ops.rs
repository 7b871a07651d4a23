//! Changing a running group's membership: forking a sequence (parallel
//! sampling, beam search), dropping beams, finishing a whole group.
//!
//! Invariant: a forked child shares every block of its parent in the KV
//! cache (`KvCacheManager::fork`) and starts with a copy of the parent's
//! tokens and `num_computed_tokens`; the first append to a shared partial
//! block copies it (copy-on-write in `append_slots`). Cost: O(tokens) per
//! fork for the token copy plus the cache's O(blocks).

use super::sequence::{FinishReason, RequestId, SeqStatus, SequenceGroup};
use super::Scheduler;
use crate::error::EngineError;
use crate::kv::{KvCacheManager, SeqId};

impl Scheduler {
    /// Forks sequence `parent` of a running group; returns the child's index
    /// in `seqs`. The child is running and shares all the parent's blocks.
    pub fn fork_seq(
        &mut self,
        kv: &mut dyn KvCacheManager,
        request_id: RequestId,
        parent: usize,
    ) -> Result<usize, EngineError> {
        let child_id = SeqId(self.next_seq);
        let group = self
            .groups
            .get_mut(&request_id)
            .ok_or_else(|| EngineError::Inconsistent(format!("fork of unknown {request_id}")))?;
        let source = group
            .seqs
            .get(parent)
            .filter(|s| s.status == SeqStatus::Running)
            .ok_or_else(|| {
                EngineError::Inconsistent(format!("fork of a non-running sequence of {request_id}"))
            })?;
        kv.fork(source.id, child_id)?;
        let mut child = source.clone();
        child.id = child_id;
        child.beam_candidates = None;
        self.next_seq += 1;
        group.seqs.push(child);
        Ok(group.seqs.len() - 1)
    }

    /// Keeps the sequences whose `keep` entry is true and frees the others'
    /// blocks (dropped beams). Indices of kept sequences shift down.
    pub fn retain_seqs(
        &mut self,
        kv: &mut dyn KvCacheManager,
        request_id: RequestId,
        keep: &[bool],
    ) {
        let Some(group) = self.groups.get_mut(&request_id) else {
            return;
        };
        let mut i = 0;
        group.seqs.retain(|s| {
            let k = keep.get(i).copied().unwrap_or(true);
            i += 1;
            if !k && matches!(s.status, SeqStatus::Running | SeqStatus::Swapped) {
                kv.free(s.id);
            }
            k
        });
    }

    /// Finishes every unfinished sequence of a group with `reason`, frees its
    /// blocks and removes the group, which is returned.
    pub fn finish_group(
        &mut self,
        kv: &mut dyn KvCacheManager,
        request_id: RequestId,
        reason: FinishReason,
    ) -> Option<SequenceGroup> {
        let group = self.groups.get_mut(&request_id)?;
        let unfinished: Vec<usize> = (0..group.seqs.len())
            .filter(|&i| !group.seqs[i].is_finished())
            .collect();
        if unfinished.is_empty() {
            let key = group.key();
            self.waiting.remove(&key);
            self.running.remove(&key);
            self.swapped.remove(&key);
            return self.groups.remove(&request_id);
        }
        let mut done = None;
        for i in unfinished {
            done = self.finish_seq(kv, request_id, i, reason);
        }
        done
    }
}
