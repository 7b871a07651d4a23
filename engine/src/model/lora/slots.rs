//! The slot table: `--max-loras` slots holding the adapters a step uses,
//! filled and evicted least-recently-used.
//!
//! Invariants: an adapter sits in at most one slot; a step's adapters are
//! all placed or the step is refused (more distinct adapters than slots is
//! an error, which the scheduler's limit prevents); a slot used by the
//! current step is never evicted by it.
//!
//! Cost: O(slots x adapters of the step) per step (both are small).

use super::{LoraStep, SlotEntry};
use engine_core::{ExecError, LoraId};
use model_loader::lora::LoraAdapter;
use std::sync::Arc;

/// The slots and when each was last used.
#[derive(Debug, Clone)]
pub struct LoraSlots {
    slots: Vec<Option<SlotEntry>>,
    last_used: Vec<u64>,
    clock: u64,
    /// Slots filled so far (a fill is a load into the executor's slot).
    pub fills: u64,
}

impl LoraSlots {
    /// `n` empty slots.
    pub fn new(n: usize) -> Self {
        Self {
            slots: vec![None; n],
            last_used: vec![0; n],
            clock: 0,
            fills: 0,
        }
    }

    /// The number of slots.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// True when there are no slots (LoRA off).
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// The ids in the slots, slot order.
    pub fn ids(&self) -> Vec<Option<LoraId>> {
        self.slots
            .iter()
            .map(|s| s.as_ref().map(|e| e.id))
            .collect()
    }

    /// Places each sequence's adapter (`None`: base) in a slot and returns
    /// the step's [`LoraStep`].
    pub fn place(
        &mut self,
        seqs: &[Option<(LoraId, Arc<LoraAdapter>)>],
    ) -> Result<LoraStep, ExecError> {
        if seqs.iter().all(Option::is_none) {
            return Ok(LoraStep::default());
        }
        self.clock += 1;
        let now = self.clock;
        let mut seq_slot = Vec::with_capacity(seqs.len());
        for s in seqs {
            let Some((id, adapter)) = s else {
                seq_slot.push(None);
                continue;
            };
            let slot = match self.find(*id) {
                Some(i) => i,
                None => {
                    let i = self.victim(now).ok_or_else(|| {
                        ExecError::InvalidBatch(format!(
                            "more distinct LoRA adapters in one step than the {} slots (--max-loras)",
                            self.slots.len()
                        ))
                    })?;
                    self.slots[i] = Some(SlotEntry {
                        id: *id,
                        adapter: Arc::clone(adapter),
                    });
                    self.fills += 1;
                    i
                }
            };
            self.last_used[slot] = now;
            seq_slot.push(Some(slot as u32));
        }
        Ok(LoraStep {
            slots: self.slots.clone(),
            seq_slot,
        })
    }

    fn find(&self, id: LoraId) -> Option<usize> {
        self.slots
            .iter()
            .position(|s| s.as_ref().is_some_and(|e| e.id == id))
    }

    /// An empty slot, else the least recently used one not used at `now`.
    fn victim(&self, now: u64) -> Option<usize> {
        if let Some(i) = self.slots.iter().position(Option::is_none) {
            return Some(i);
        }
        (0..self.slots.len())
            .filter(|&i| self.last_used[i] != now)
            .min_by_key(|&i| self.last_used[i])
    }

    /// Empties the slot holding `id` (the adapter was unloaded).
    pub fn evict(&mut self, id: LoraId) {
        if let Some(i) = self.find(id) {
            self.slots[i] = None;
            self.last_used[i] = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use model_loader::lora::{LoraFormat, LoraLayer};

    fn adapter() -> Arc<LoraAdapter> {
        Arc::new(LoraAdapter {
            format: LoraFormat::Peft,
            rank: 1,
            alpha: 1.0,
            scale: 1.0,
            base_model: None,
            layers: vec![LoraLayer::default()],
        })
    }

    #[test]
    fn lru_fill_evict_and_refusal() {
        let a = adapter();
        let mut s = LoraSlots::new(2);
        let one = |id: u32| Some((LoraId(id), Arc::clone(&a)));
        let st = s.place(&[one(1), None, one(2), one(1)]).unwrap();
        assert_eq!(st.seq_slot, vec![Some(0), None, Some(1), Some(0)]);
        // 1 used now, 2 is least recent: 3 takes slot 1.
        let st = s.place(&[one(1)]).unwrap();
        assert_eq!(st.seq_slot, vec![Some(0)]);
        let st = s.place(&[one(3)]).unwrap();
        assert_eq!(st.seq_slot, vec![Some(1)]);
        assert_eq!(s.ids(), vec![Some(LoraId(1)), Some(LoraId(3))]);
        assert_eq!(s.fills, 3);
        // Three distinct adapters never fit two slots.
        assert!(s.place(&[one(4), one(5), one(6)]).is_err());
        s.evict(LoraId(1));
        assert!(s.place(&[]).unwrap().is_empty());
    }
}
