//! LoRA in the scheduler: which adapter a request uses ([`LoraRequest`],
//! part of `RequestParams`), the `--max-loras` limit, and the adapter names
//! the `vllm:lora_requests_info` metric reports.
//!
//! Invariants: the distinct adapters among running groups never exceed
//! `max_loras` (checked where a group becomes running: admission from the
//! waiting queue and swap-in), so no step's batch holds more; a group whose
//! adapter does not fit stays where it is and later groups may pass it, as
//! vLLM does. A request's prefix-cache key is its adapter's id, so blocks
//! are never shared across adapters (nor between an adapter and the base).
//!
//! Cost: O(running groups) per check.

use super::{Scheduler, SequenceGroup};
use engine_core::LoraId;
use model_loader::lora::LoraAdapter;
use std::collections::BTreeSet;
use std::sync::Arc;

/// The adapter a request runs with.
#[derive(Clone)]
pub struct LoraRequest {
    /// Never reused for other weights (a reloaded adapter gets a new id).
    pub id: LoraId,
    /// The name clients use (`"model": name`).
    pub name: Arc<str>,
    pub adapter: Arc<LoraAdapter>,
}

impl LoraRequest {
    /// The prefix-cache key of the request's blocks.
    pub fn cache_key(&self) -> u64 {
        u64::from(self.id.0)
    }
}

impl PartialEq for LoraRequest {
    fn eq(&self, other: &Self) -> bool {
        self.id == other.id
    }
}

impl std::fmt::Debug for LoraRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoraRequest")
            .field("id", &self.id)
            .field("name", &self.name)
            .field("rank", &self.adapter.rank)
            .finish()
    }
}

impl SequenceGroup {
    /// The prefix-cache key of the group's blocks (its adapter's id).
    pub fn cache_key(&self) -> Option<u64> {
        self.params.lora.as_ref().map(LoraRequest::cache_key)
    }
}

impl Scheduler {
    /// Sets the most distinct adapters among running groups (`--max-loras`).
    pub fn set_max_loras(&mut self, n: usize) {
        self.max_loras = n;
    }

    /// The `--max-loras` limit (0: adapters not served).
    pub fn max_loras(&self) -> usize {
        self.max_loras
    }

    /// Whether `group` may become running without exceeding `max_loras`
    /// distinct adapters among running groups.
    pub(crate) fn lora_fits(&self, group: &SequenceGroup) -> bool {
        let Some(l) = &group.params.lora else {
            return true;
        };
        if self.max_loras == 0 {
            // Adapters not enabled: the step is refused by the slot table
            // (a typed error), never left waiting forever.
            return true;
        }
        let running = self.running_loras();
        running.contains(&l.id) || running.len() < self.max_loras
    }

    fn running_loras(&self) -> BTreeSet<LoraId> {
        self.running
            .iter()
            .filter_map(|k| self.groups.get(&k.id))
            .filter_map(|g| g.params.lora.as_ref().map(|l| l.id))
            .collect()
    }

    /// The adapter names of running and of waiting (and swapped) groups,
    /// each sorted and without repeats (vLLM's `running_lora_adapters` and
    /// `waiting_lora_adapters`).
    pub fn lora_names(&self) -> (Vec<String>, Vec<String>) {
        let running = self.names_of(self.running.iter());
        let waiting = self.names_of(self.waiting.iter().chain(self.swapped.iter()));
        (running, waiting)
    }

    fn names_of<'a>(&self, keys: impl Iterator<Item = &'a super::QueueKey>) -> Vec<String> {
        keys.filter_map(|k| self.groups.get(&k.id))
            .filter_map(|g| g.params.lora.as_ref().map(|l| l.name.to_string()))
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect()
    }
}
