//! The engine's side of LoRA: turning a step's per-sequence adapters into
//! the executor's slot table ([`LoraSlots`], LRU over `--max-loras` slots),
//! and what the server asks about adapters (the metric's names).
//!
//! Invariants: adapters are off until [`LlmEngine::enable_lora`] succeeds,
//! which it does only on an executor that applies them; a step without
//! adapters hands the executor an empty [`LoraStep`] (the base path, no
//! slot touched).
//!
//! Cost: O(sequences of the step + slots) per step with adapters; nothing
//! otherwise.

use super::LlmEngine;
use crate::error::EngineError;
use crate::executor::ExecError;
use crate::model::lora::slots::LoraSlots;
use crate::model::lora::LoraStep;
use crate::scheduler::SchedulerOutput;
use std::sync::Arc;

/// What `vllm:lora_requests_info` reports.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LoraNames {
    /// `--max-loras` (0: adapters not served).
    pub max_loras: usize,
    /// Adapters of running requests, sorted, no repeats.
    pub running: Vec<String>,
    /// Adapters of waiting (and swapped) requests, sorted, no repeats.
    pub waiting: Vec<String>,
}

/// The executor's LoRA support and the slot table.
#[derive(Debug)]
pub(super) struct EngineLora {
    supported: bool,
    slots: LoraSlots,
}

impl EngineLora {
    pub(super) fn new(supported: bool) -> Self {
        Self {
            supported,
            slots: LoraSlots::new(0),
        }
    }

    /// The step's [`LoraStep`] (empty when no sequence has an adapter).
    pub(super) fn place(&mut self, sched: &SchedulerOutput) -> Result<LoraStep, ExecError> {
        if sched.seq_lora.iter().all(Option::is_none) {
            return Ok(LoraStep::default());
        }
        let seqs: Vec<_> = sched
            .seq_lora
            .iter()
            .map(|l| l.as_ref().map(|l| (l.id, Arc::clone(&l.adapter))))
            .collect();
        self.slots.place(&seqs)
    }
}

impl LlmEngine {
    /// Serves LoRA adapters with `max_loras` slots (at most that many
    /// distinct adapters in one step). Refused on an executor that does not
    /// apply adapters, and for `max_loras` 0.
    pub fn enable_lora(&mut self, max_loras: usize) -> Result<(), EngineError> {
        if !self.lora.supported {
            return Err(EngineError::InvalidConfig(
                "this executor does not apply LoRA adapters (the CPU and GPU executors do)".into(),
            ));
        }
        if max_loras == 0 {
            return Err(EngineError::InvalidConfig(
                "--max-loras must be at least 1".into(),
            ));
        }
        self.lora.slots = LoraSlots::new(max_loras);
        self.scheduler.set_max_loras(max_loras);
        Ok(())
    }

    /// Whether adapters are served.
    pub fn lora_enabled(&self) -> bool {
        !self.lora.slots.is_empty()
    }

    /// The adapter names of running and of waiting requests, and the
    /// `--max-loras` limit.
    pub fn lora_names(&self) -> LoraNames {
        let (running, waiting) = self.scheduler.lora_names();
        LoraNames {
            max_loras: self.scheduler.max_loras(),
            running,
            waiting,
        }
    }

    /// Slots filled since start (each a load of an adapter into a slot).
    pub fn lora_slot_fills(&self) -> u64 {
        self.lora.slots.fills
    }
}
