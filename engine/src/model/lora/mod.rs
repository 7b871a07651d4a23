//! LoRA adapters at run time: what a step hands the executor
//! ([`LoraStep`]: the slot table and each sequence's slot), the slot table
//! itself ([`slots::LoraSlots`], LRU), and the CPU kernel
//! ([`kernel::apply`]) that adds `scale (x A^T) B^T` to a linear layer's
//! output, rows grouped by adapter.
//!
//! The model definitions call [`crate::model::backend::Backend::lora`]
//! right after each adaptable linear layer with the targets of its output
//! columns (q/k/v fused: three targets at their column offsets; gate/up
//! fused: two). A backend without adapters does nothing there.
//!
//! Invariants: a step uses at most `slots.len()` (`--max-loras`) distinct
//! adapters; `seq_slot[i]`, when set, names a filled slot; a slot's
//! [`LoraId`] always names the same weights (ids are never reused), so an
//! executor may keep a prepared copy per slot keyed by the id.
//!
//! Cost: per adapted row and target, `r x (in + out)` multiply-adds (rank 8
//! on all seven targets of SmolLM2-135M: about 2% of the base model's
//! products per token); the step's rows are gathered per adapter once per
//! linear layer.

pub mod kernel;
pub mod slots;

pub use engine_core::LoraId;
pub use model_loader::lora::{LoraAdapter, LoraTarget};
use std::sync::Arc;

/// One filled slot: the adapter's id and weights.
#[derive(Debug, Clone)]
pub struct SlotEntry {
    pub id: LoraId,
    pub adapter: Arc<LoraAdapter>,
}

/// The adapters of one step, as the executor receives them.
#[derive(Debug, Clone, Default)]
pub struct LoraStep {
    /// The slot table (`--max-loras` entries, `None` = empty).
    pub slots: Vec<Option<SlotEntry>>,
    /// Per sequence of the batch (`ForwardBatch::seqs` order): its slot, or
    /// `None` for the base model. Empty: no sequence has an adapter.
    pub seq_slot: Vec<Option<u32>>,
}

impl LoraStep {
    /// True when no sequence of the step uses an adapter.
    pub fn is_empty(&self) -> bool {
        self.seq_slot.iter().all(Option::is_none)
    }

    /// Checks the step against the batch's sequence count.
    pub fn validate(&self, num_seqs: usize) -> Result<(), engine_core::ExecError> {
        if self.is_empty() {
            return Ok(());
        }
        if self.seq_slot.len() != num_seqs {
            return Err(engine_core::ExecError::InvalidBatch(format!(
                "{} LoRA slot entries for {num_seqs} sequences",
                self.seq_slot.len()
            )));
        }
        for s in self.seq_slot.iter().flatten() {
            if self.slots.get(*s as usize).is_none_or(Option::is_none) {
                return Err(engine_core::ExecError::InvalidBatch(format!(
                    "LoRA slot {s} is empty or outside the {} slots",
                    self.slots.len()
                )));
            }
        }
        Ok(())
    }
}

/// Where an adaptable linear layer's targets sit in its output row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoraCols {
    pub target: LoraTarget,
    /// The first output column of the target's rows.
    pub offset: usize,
}
