//! Which sequence owns which row ("slot") of the executor's token-count
//! table, the device half of the penalties (`sampler::device`,
//! `gpu_kernels::penalty`), and when a slot must be (re)filled from the
//! sequence's tokens.
//!
//! A slot is claimed when a sequence with penalties is first drawn on the
//! device and filled then from its tokens; each device draw adds its token
//! on the device. The host tracks, per slot, how many of the sequence's
//! tokens the device counts hold (`device_len`), assuming the draw of a
//! launched step happens; a row is refilled whenever its sequence's length
//! differs from that (a step drawn on the host, a step that failed, a
//! grown table), so the device never uses counts of another history.
//!
//! Invariants:
//! - a slot has at most one owner; a slot is freed only when its sequence is
//!   gone or finished, checked when a device step being planned needs room
//!   (after every step that could still draw for it was launched: the
//!   executor runs steps in order, so a refill of a reused slot follows the
//!   old owner's last increment);
//! - growing the table (the executor reallocates it zeroed) forgets every
//!   slot's counts;
//! - after a step that did not draw on the device, its rows' counts are
//!   forgotten;
//! - an executor without count slots (`Capabilities::count_slots`) is
//!   never given one: its penalized rows take the logits path.
//!
//! Cost: O(1) per row with penalties, plus O(slots) liveness checks when a
//! new sequence finds no free slot, plus the refills (O(tokens) each).

use crate::scheduler::RequestId;
use std::collections::HashMap;

/// A sequence: its request and its index in the group.
pub(super) type SeqKey = (RequestId, usize);

/// Smallest table the executor is asked for.
const MIN_SLOTS: u32 = 8;

#[derive(Debug, Clone, Copy)]
struct Owned {
    slot: u32,
    /// Tokens the device counts hold (`None`: unknown, refill).
    device_len: Option<usize>,
}

/// The slot table of one engine (see the module docs).
#[derive(Debug, Default)]
pub(super) struct CountSlots {
    owners: HashMap<SeqKey, Owned>,
    free: Vec<u32>,
    /// Slots handed out so far (free or owned).
    used: u32,
    /// Slots the executor's table holds.
    capacity: u32,
    /// The sequences of the launched step's rows that hold a slot.
    in_flight: Vec<SeqKey>,
    /// The executor keeps count slots.
    supported: bool,
}

impl CountSlots {
    /// The table of an executor that keeps count slots (`supported`) or not.
    pub(super) fn new(supported: bool) -> Self {
        Self {
            supported,
            ..Self::default()
        }
    }

    /// Whether penalized rows may be drawn on the device.
    pub(super) fn supported(&self) -> bool {
        self.supported
    }

    /// Slots the executor's table must hold.
    pub(super) fn capacity(&self) -> u32 {
        self.capacity
    }

    /// Slots owned now.
    #[cfg(test)]
    pub(super) fn owned(&self) -> usize {
        self.owners.len()
    }

    /// Frees the slots of sequences for which `alive` is false.
    pub(super) fn retain(&mut self, alive: impl Fn(&SeqKey) -> bool) {
        let free = &mut self.free;
        self.owners.retain(|k, o| {
            let keep = alive(k);
            if !keep {
                free.push(o.slot);
            }
            keep
        });
    }

    /// Makes room for the sequences of `keys` that hold no slot yet: first
    /// by freeing the slots of sequences no longer `alive` (only when
    /// needed), then by growing the table (it doubles, and every slot is
    /// to be refilled).
    pub(super) fn reserve(&mut self, keys: &[SeqKey], alive: impl Fn(&SeqKey) -> bool) {
        let new = keys.iter().filter(|k| !self.owners.contains_key(k)).count() as u32;
        if new > self.free.len() as u32 && self.used + new > self.capacity {
            self.retain(alive);
        }
        let need = self.used + new.saturating_sub(self.free.len() as u32);
        if need <= self.capacity {
            return;
        }
        self.capacity = need.max(2 * self.capacity).max(MIN_SLOTS);
        for o in self.owners.values_mut() {
            o.device_len = None;
        }
    }

    /// The slot of `key`, drawn now at length `num_tokens`, and whether it
    /// must be filled with the sequence's first `num_tokens` tokens first.
    /// Records the draw as launched. `None`: no room (call [`Self::reserve`]).
    pub(super) fn claim(&mut self, key: SeqKey, num_tokens: usize) -> Option<(u32, bool)> {
        use std::collections::hash_map::Entry;
        let owned = match self.owners.entry(key) {
            Entry::Occupied(o) => o.into_mut(),
            Entry::Vacant(v) => {
                let slot = match self.free.pop() {
                    Some(s) => s,
                    None if self.used < self.capacity => {
                        self.used += 1;
                        self.used - 1
                    }
                    None => return None,
                };
                v.insert(Owned {
                    slot,
                    device_len: None,
                })
            }
        };
        let fill = owned.device_len != Some(num_tokens);
        owned.device_len = Some(num_tokens + 1);
        self.in_flight.push(key);
        Some((owned.slot, fill))
    }

    /// The launched step is answered: `drew` when the executor drew its rows
    /// on the device.
    pub(super) fn step_done(&mut self, drew: bool) {
        if !drew {
            for k in &self.in_flight {
                if let Some(o) = self.owners.get_mut(k) {
                    o.device_len = None;
                }
            }
        }
        self.in_flight.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(i: u64) -> SeqKey {
        (RequestId(i), 0)
    }

    #[test]
    fn a_slot_is_filled_once_then_follows_its_draws() {
        let mut s = CountSlots::new(true);
        s.reserve(&[key(1)], |_| true);
        assert_eq!(s.capacity(), MIN_SLOTS);
        assert_eq!(s.claim(key(1), 5), Some((0, true)));
        s.step_done(true);
        assert_eq!(s.claim(key(1), 6), Some((0, false)));
        s.step_done(true);
        // A step drawn on the host: the next device draw refills.
        assert_eq!(s.claim(key(1), 8), Some((0, true)));
        // That step failed: refill again.
        s.step_done(false);
        assert_eq!(s.claim(key(1), 9), Some((0, true)));
        s.step_done(true);
        assert!(s.supported());
    }

    #[test]
    fn freed_slots_are_reused_and_growth_refills_everyone() {
        let mut s = CountSlots::new(true);
        let keys: Vec<SeqKey> = (0..8).map(key).collect();
        s.reserve(&keys, |_| true);
        for (i, k) in keys.iter().enumerate() {
            assert_eq!(s.claim(*k, 3), Some((i as u32, true)));
        }
        s.step_done(true);
        assert_eq!(s.claim(key(100), 3), None, "the table is full");
        // Full: the dead sequence's slot is freed for the new one.
        s.reserve(&[key(100)], |k| k.0 != RequestId(2));
        assert_eq!(s.owned(), 7);
        assert_eq!(s.capacity(), MIN_SLOTS, "a freed slot is enough");
        assert_eq!(s.claim(key(100), 3), Some((2, true)));
        s.reserve(&[key(101), key(102)], |_| true);
        assert_eq!(s.capacity(), 2 * MIN_SLOTS);
        // Grown: the old owners' counts are gone.
        assert_eq!(s.claim(key(0), 4), Some((0, true)));
        s.step_done(true);
    }

    #[test]
    fn an_executor_without_count_slots_is_never_given_one() {
        assert!(!CountSlots::new(false).supported());
        assert!(CountSlots::new(true).supported());
    }
}
