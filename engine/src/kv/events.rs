//! KV cache events: what the prefix cache made findable and what it forgot,
//! for an observer outside the engine (a KV-aware router), in the shape of
//! vLLM's KV cache events (`BlockStored`, `BlockRemoved`,
//! `AllBlocksCleared`).
//!
//! The paged manager records events only when asked
//! ([`super::KvCacheManager::record_events`]); the engine loop takes them
//! once per step ([`super::KvCacheManager::take_events`]) and hands them to
//! a [`KvEventSink`]. This module knows no transport: the server's sink
//! encodes and publishes them.
//!
//! Invariants:
//! - an event is recorded exactly when the prefix cache's hash map changes:
//!   `BlockStored` when a block becomes findable under a hash, `BlockRemoved`
//!   when a findable block is forgotten (evicted for new contents),
//!   `AllBlocksCleared` when the whole map is dropped. So applying the
//!   events in order to an empty set gives exactly the hashes the cache can
//!   find now (the property test checks this after every operation);
//! - events are kept in the order of the changes; consecutive stores that
//!   extend one chain (the next block's parent is the previous block's
//!   hash) are merged into one `BlockStored` whose `parent_block_hash` is
//!   the parent of its first block, as vLLM batches one request's blocks;
//!   consecutive removals are merged into one `BlockRemoved`.
//!
//! Cost: nothing when recording is off (one `Option` check per register or
//! evict); when on, O(block_size) per stored block (its token ids are
//! copied) and O(1) per removed block, amortized.

use super::prefix_cache::BlockHash;

/// Where the blocks of an event live (vLLM's `medium`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KvMedium {
    /// The accelerator pool, the one the prefix cache indexes. vLLM names
    /// its device pool `"GPU"` whatever the platform, and so do we (the
    /// CPU executor's pool included): to a router it is "the engine's own
    /// KV cache".
    Gpu,
    /// A CPU tier (vLLM's offloading connectors). Our CPU swap pool holds
    /// no findable blocks, so the paged manager never emits it.
    Cpu,
}

impl KvMedium {
    /// vLLM's string for the medium.
    pub fn as_str(self) -> &'static str {
        match self {
            KvMedium::Gpu => "GPU",
            KvMedium::Cpu => "CPU",
        }
    }
}

/// One change of the set of findable blocks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KvEvent {
    /// Blocks became findable: `block_hashes[i]` holds
    /// `token_ids[i * block_size..(i + 1) * block_size]`, block `i + 1`'s
    /// parent is block `i`, block 0's is `parent_block_hash` (`None` for the
    /// first block of a sequence).
    BlockStored {
        block_hashes: Vec<BlockHash>,
        parent_block_hash: Option<BlockHash>,
        token_ids: Vec<u32>,
        block_size: usize,
        /// Always `None`: no adapters yet.
        lora_id: Option<u64>,
        medium: KvMedium,
    },
    /// Blocks are no longer findable.
    BlockRemoved {
        block_hashes: Vec<BlockHash>,
        medium: KvMedium,
    },
    /// Nothing is findable any more.
    AllBlocksCleared,
}

/// Where the engine loop hands each step's events. Called on the engine
/// thread, once per step that recorded any: it must not block (queue and
/// return; drop and count when the queue is full).
pub trait KvEventSink: Send {
    fn publish(&mut self, events: Vec<KvEvent>);
}

/// The recorder inside the prefix cache.
#[derive(Debug, Clone, Default)]
pub(super) struct EventLog {
    events: Vec<KvEvent>,
}

impl EventLog {
    /// `block` (holding `tokens`) became findable under `hash`.
    pub(super) fn stored(&mut self, hash: BlockHash, parent: Option<BlockHash>, tokens: &[u32]) {
        if let Some(KvEvent::BlockStored {
            block_hashes,
            token_ids,
            block_size,
            ..
        }) = self.events.last_mut()
        {
            if parent.is_some()
                && block_hashes.last().copied() == parent
                && *block_size == tokens.len()
            {
                block_hashes.push(hash);
                token_ids.extend_from_slice(tokens);
                return;
            }
        }
        self.events.push(KvEvent::BlockStored {
            block_hashes: vec![hash],
            parent_block_hash: parent,
            token_ids: tokens.to_vec(),
            block_size: tokens.len(),
            lora_id: None,
            medium: KvMedium::Gpu,
        });
    }

    /// The block findable under `hash` was forgotten.
    pub(super) fn removed(&mut self, hash: BlockHash) {
        if let Some(KvEvent::BlockRemoved { block_hashes, .. }) = self.events.last_mut() {
            block_hashes.push(hash);
            return;
        }
        self.events.push(KvEvent::BlockRemoved {
            block_hashes: vec![hash],
            medium: KvMedium::Gpu,
        });
    }

    /// Every block was forgotten: earlier events no longer matter to a
    /// subscriber that applies this one, but they are kept (in order) so the
    /// stream stays a faithful log.
    pub(super) fn cleared(&mut self) {
        self.events.push(KvEvent::AllBlocksCleared);
    }

    pub(super) fn take(&mut self) -> Vec<KvEvent> {
        std::mem::take(&mut self.events)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(n: u128) -> BlockHash {
        BlockHash(n)
    }

    #[test]
    fn a_chain_is_one_event_and_a_new_chain_another() {
        let mut log = EventLog::default();
        log.stored(h(1), None, &[1, 2]);
        log.stored(h(2), Some(h(1)), &[3, 4]);
        log.stored(h(3), Some(h(2)), &[5, 6]);
        // Another sequence's first block: its own event, even though its
        // parent (None) is not the last hash.
        log.stored(h(9), None, &[7, 7]);
        // A block whose parent was stored earlier but not last: new event.
        log.stored(h(4), Some(h(2)), &[8, 8]);
        log.removed(h(1));
        log.removed(h(9));
        log.stored(h(5), Some(h(4)), &[0, 0]);
        log.cleared();
        let got = log.take();
        let stored = |hs: &[u128], parent: Option<u128>, toks: &[u32]| KvEvent::BlockStored {
            block_hashes: hs.iter().map(|&x| h(x)).collect(),
            parent_block_hash: parent.map(h),
            token_ids: toks.to_vec(),
            block_size: 2,
            lora_id: None,
            medium: KvMedium::Gpu,
        };
        assert_eq!(
            got,
            vec![
                stored(&[1, 2, 3], None, &[1, 2, 3, 4, 5, 6]),
                stored(&[9], None, &[7, 7]),
                stored(&[4], Some(2), &[8, 8]),
                KvEvent::BlockRemoved {
                    block_hashes: vec![h(1), h(9)],
                    medium: KvMedium::Gpu
                },
                // Not merged into the earlier chain: a removal came between.
                stored(&[5], Some(4), &[0, 0]),
                KvEvent::AllBlocksCleared,
            ]
        );
        assert!(log.take().is_empty());
    }
}
