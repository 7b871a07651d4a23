//! Automatic prefix caching: full blocks findable by the hash of their
//! contents and of everything before them.
//!
//! A full block's hash is chained: `H(parent block's hash, extra key,
//! token ids of the block)`, so equal hashes mean equal prefixes up to and
//! including the block. The extra key separates caches that must not mix
//! (for example an adapter id or a cache salt).
//!
//! The hash is deterministic across runs and processes: SipHash-1-3 with
//! fixed keys (`std::hash::DefaultHasher::new()`), run twice with different
//! seeds for a 128-bit value. Collisions are handled safely: a hit also
//! requires the stored token ids, extra key and parent hash to be equal to
//! the query's, so a false hit needs a 128-bit collision of the parent hash.
//!
//! The cache holds no references: a cached block is either used by some
//! sequence or sits in the free list with reference count 0, and is
//! forgotten ([`PrefixCache::evict`]) when the pool hands it out afresh.
//! Registration of a hash that is already cached (under another block) is
//! skipped: one block per hash.
//!
//! Counters are per token, as vLLM counts them: `queries` adds the prompt
//! length of every lookup made by `allocate`, `hits` the number of prompt
//! tokens found; `evictions` counts cached blocks reused for new contents.
//!
//! Events: when recording is on ([`PrefixCache::record_events`]) every
//! change of the hash map is logged as a [`KvEvent`] (see `events`): a
//! successful `register` as a store, an `evict` that forgot a block as a
//! removal, `clear` as "all cleared". A skipped registration records
//! nothing, so the log mirrors the map exactly.
//!
//! Complexity: lookup is O(matched blocks x block_size) plus one hash per
//! probed block; register and evict are O(block_size) and O(1) expected
//! (recording adds O(block_size) per store); clear is O(blocks).

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};

use super::events::{EventLog, KvEvent};
use super::fx::FxBuild;
use super::BlockId;

/// Chained hash identifying a full block's contents and its whole prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BlockHash(pub u128);

/// Hash of a full block given its parent's hash (`None` for the first block).
pub fn hash_block(parent: Option<BlockHash>, extra: Option<u64>, tokens: &[u32]) -> BlockHash {
    let half = |seed: u64| {
        let mut h = DefaultHasher::new();
        seed.hash(&mut h);
        parent.map(|p| p.0).hash(&mut h);
        extra.hash(&mut h);
        tokens.hash(&mut h);
        h.finish()
    };
    let hi = half(0x9e37_79b9_7f4a_7c15);
    let lo = half(0xc2b2_ae3d_27d4_eb4f);
    BlockHash((u128::from(hi) << 64) | u128::from(lo))
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    hash: BlockHash,
    parent: Option<BlockHash>,
    extra: Option<u64>,
}

/// Per-token counters of the prefix cache.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PrefixCacheCounters {
    pub queries: u64,
    pub hits: u64,
    pub evictions: u64,
}

/// Hash -> block map over one accelerator pool.
#[derive(Debug, Clone)]
pub struct PrefixCache {
    enabled: bool,
    block_size: usize,
    map: HashMap<BlockHash, BlockId, FxBuild>,
    /// Indexed by block id: the entry of a cached block.
    entries: Vec<Option<Entry>>,
    /// Token ids of cached blocks, `block_size` per block, flat.
    tokens: Vec<u32>,
    pub counters: PrefixCacheCounters,
    /// The event log, while recording (`None`: off, no cost).
    events: Option<EventLog>,
}

/// One block found by [`PrefixCache::lookup`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheHit {
    pub block: BlockId,
    pub hash: BlockHash,
}

impl PrefixCache {
    /// A cache over `num_blocks` blocks of `block_size` tokens; the token
    /// store is only allocated when `enabled`.
    pub fn new(num_blocks: usize, block_size: usize, enabled: bool) -> Self {
        let store = if enabled { num_blocks * block_size } else { 0 };
        Self {
            enabled,
            block_size,
            map: HashMap::default(),
            entries: vec![None; num_blocks],
            tokens: vec![0; store],
            counters: PrefixCacheCounters::default(),
            events: None,
        }
    }

    /// Starts or stops recording events; stopping drops what was recorded.
    pub fn record_events(&mut self, on: bool) {
        if on != self.events.is_some() {
            self.events = on.then(EventLog::default);
        }
    }

    /// The events recorded since the last call, in order (empty when off).
    pub fn take_events(&mut self) -> Vec<KvEvent> {
        self.events.as_mut().map(EventLog::take).unwrap_or_default()
    }

    /// Forgets every cached block (their contents stay where they are, but
    /// nothing is findable any more). Returns how many were forgotten; an
    /// `AllBlocksCleared` event is recorded either way.
    pub fn clear(&mut self) -> usize {
        let n = self.map.len();
        self.map.clear();
        self.entries.iter_mut().for_each(|e| *e = None);
        if let Some(log) = &mut self.events {
            log.cleared();
        }
        n
    }

    pub fn enabled(&self) -> bool {
        self.enabled
    }

    pub fn is_cached(&self, b: BlockId) -> bool {
        self.entries
            .get(b.0 as usize)
            .is_some_and(|entry| entry.is_some())
    }

    /// Every hash the cache can find now (no order).
    pub fn cached_hashes(&self) -> impl Iterator<Item = BlockHash> + '_ {
        self.map.keys().copied()
    }

    /// The longest chain of cached full blocks that prefixes `tokens`, at
    /// most `max_blocks` long. Does not touch the counters.
    pub fn lookup(&self, tokens: &[u32], extra: Option<u64>, max_blocks: usize) -> Vec<CacheHit> {
        let mut hits = Vec::new();
        let block_size = self.block_size;
        if !self.enabled || block_size == 0 {
            return hits;
        }
        let mut parent = None;
        for chunk in tokens.chunks_exact(block_size).take(max_blocks) {
            let hash = hash_block(parent, extra, chunk);
            let Some(&block) = self.map.get(&hash) else {
                break;
            };
            let matches = self.entries[block.0 as usize].as_ref().is_some_and(|e| {
                e.hash == hash
                    && e.parent == parent
                    && e.extra == extra
                    && self.block_tokens(block) == chunk
            });
            if !matches {
                break;
            }
            hits.push(CacheHit { block, hash });
            parent = Some(hash);
        }
        hits
    }

    /// Makes `block` (full, holding `tokens`) findable under `hash`, unless
    /// it is already cached or another block holds that hash.
    pub fn register(
        &mut self,
        block: BlockId,
        hash: BlockHash,
        parent: Option<BlockHash>,
        extra: Option<u64>,
        tokens: &[u32],
    ) -> bool {
        if !self.enabled
            || tokens.len() != self.block_size
            || self.is_cached(block)
            || self.map.contains_key(&hash)
        {
            return false;
        }
        self.map.insert(hash, block);
        self.entries[block.0 as usize] = Some(Entry {
            hash,
            parent,
            extra,
        });
        let start = block.0 as usize * self.block_size;
        self.tokens[start..start + self.block_size].copy_from_slice(tokens);
        if let Some(log) = &mut self.events {
            log.stored(hash, parent, tokens);
        }
        true
    }

    fn block_tokens(&self, block: BlockId) -> &[u32] {
        let start = block.0 as usize * self.block_size;
        &self.tokens[start..start + self.block_size]
    }

    /// Forgets `block` if it is cached (it is about to hold new contents).
    pub fn evict(&mut self, block: BlockId) {
        if let Some(entry) = self
            .entries
            .get_mut(block.0 as usize)
            .and_then(Option::take)
        {
            self.map.remove(&entry.hash);
            self.counters.evictions += 1;
            if let Some(log) = &mut self.events {
                log.removed(entry.hash);
            }
        }
    }

    /// Verifies that map and entries agree. O(cached blocks).
    pub fn check_invariants(&self) -> Result<(), String> {
        let cached = self.entries.iter().filter(|e| e.is_some()).count();
        if cached != self.map.len() {
            return Err(format!(
                "{} entries but {} map keys",
                cached,
                self.map.len()
            ));
        }
        for (hash, b) in &self.map {
            let entry = self.entries[b.0 as usize]
                .as_ref()
                .ok_or_else(|| format!("map points at uncached {b:?}"))?;
            if entry.hash != *hash {
                return Err(format!("entry of {b:?} disagrees with the map"));
            }
            if hash_block(entry.parent, entry.extra, self.block_tokens(*b)) != *hash {
                return Err(format!("entry of {b:?} is not its contents' hash"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash_is_chained_and_keyed() {
        let a = hash_block(None, None, &[1, 2]);
        assert_eq!(a, hash_block(None, None, &[1, 2]));
        assert_ne!(a, hash_block(None, None, &[2, 1]));
        assert_ne!(a, hash_block(None, Some(7), &[1, 2]));
        let b = hash_block(Some(a), None, &[3, 4]);
        assert_ne!(b, hash_block(None, None, &[3, 4]));
    }

    #[test]
    fn colliding_hash_with_other_tokens_is_a_miss() {
        let mut cache = PrefixCache::new(4, 2, true);
        let real = hash_block(None, None, &[1, 2]);
        // Forge a collision: block 0 registered under the hash of [1, 2]
        // while holding [9, 9]. Lookup must compare the tokens and miss.
        assert!(cache.register(BlockId(0), real, None, None, &[9, 9]));
        assert!(cache.lookup(&[1, 2, 3], None, 1).is_empty());
        assert!(cache.check_invariants().is_err());
    }

    #[test]
    fn lookup_stops_at_first_miss_and_respects_max() {
        let mut cache = PrefixCache::new(4, 2, true);
        let h0 = hash_block(None, None, &[1, 2]);
        let h1 = hash_block(Some(h0), None, &[3, 4]);
        cache.register(BlockId(2), h0, None, None, &[1, 2]);
        cache.register(BlockId(3), h1, Some(h0), None, &[3, 4]);
        let hits = cache.lookup(&[1, 2, 3, 4, 5], None, 8);
        assert_eq!(
            hits.iter().map(|h| h.block).collect::<Vec<_>>(),
            vec![BlockId(2), BlockId(3)]
        );
        assert_eq!(cache.lookup(&[1, 2, 3, 4], None, 1).len(), 1);
        assert_eq!(cache.lookup(&[1, 2, 3, 4], Some(1), 8).len(), 0);
        assert_eq!(cache.lookup(&[1, 3, 3, 4], None, 8).len(), 0);
        cache.evict(BlockId(2));
        assert_eq!(cache.counters.evictions, 1);
        assert!(cache.lookup(&[1, 2, 3, 4], None, 8).is_empty());
        cache.check_invariants().unwrap();
    }
}
