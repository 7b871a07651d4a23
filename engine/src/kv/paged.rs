//! The paged KV cache manager (PagedAttention): block tables over a
//! reference-counted block pool, copy-on-write, automatic prefix caching and
//! swapping of whole groups to a CPU pool.
//!
//! Per sequence the manager keeps its block table, its token ids and the
//! chained hashes of its full blocks. A sequence is either *resident* (its
//! table names accelerator blocks) or *swapped* (its table names CPU blocks).
//!
//! Invariants (checked by [`PagedKvCacheManager::check_invariants`]):
//! - a sequence with `n` tokens has exactly `ceil(n / block_size)` blocks,
//!   so at most its last block is partial;
//! - each block's reference count equals the number of block-table entries
//!   naming it (the prefix cache holds no reference); a block is in the free
//!   list if and only if nothing references it;
//! - every holder of a shared block sees the same number of tokens in it: a
//!   write into a shared partial block first copies it (copy-on-write);
//! - only full blocks are registered in the prefix cache;
//! - `used_slots` is the sum, over referenced accelerator blocks, of the
//!   tokens they hold (shared blocks once).
//!
//! Complexity: `append_slots` is O(tokens appended + blocks allocated), each
//! block allocation O(1); `fork` and `free` are O(blocks of the sequence);
//! `allocate` and `can_admit` are O(prompt length) (hashing); swaps are
//! O(blocks of the group). Nothing depends on the pool size.
//!
//! Figures ([`KvCacheManager::stats`]): `allocated_slots` is referenced
//! accelerator blocks x block size (shared blocks once; freed blocks kept only
//! for the prefix cache are free, not allocated), `used_slots` the tokens
//! those blocks hold, so `used_slots / allocated_slots` is the share of
//! reserved KV slots holding real token states. Prefix-cache counters are per
//! token (see `prefix_cache`).
//!
//! Events: with [`KvCacheManager::record_events`] on, every change of
//! what the prefix cache can find is recorded (see `events`): stores as full
//! blocks get their hash (appends, swap-in), removals as a cached free block
//! is reused, "all cleared" on [`PagedKvCacheManager::reset_prefix_cache`].
//!
//! Watermark: admitting a new group must leave `watermark_blocks`
//! (`floor(watermark * total)`) blocks free, so running sequences keep room to
//! grow. A group that cannot fit even in an empty cache above the watermark
//! gets [`AdmitDecision::Never`] (it would otherwise wait forever).

use std::collections::HashMap;

use super::fx::FxBuild;
use super::pool::BlockPool;
use super::prefix_cache::{hash_block, BlockHash, PrefixCache};
use super::{
    AdmitDecision, AppendOutcome, BlockCopy, BlockId, KvCacheManager, KvError, KvEvent, KvStats,
    LengthHint, SeqId,
};

/// Configuration of a [`PagedKvCacheManager`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PagedKvConfig {
    /// Tokens per block (vLLM's default is 16).
    pub block_size: usize,
    /// Blocks in the accelerator pool.
    pub num_device_blocks: usize,
    /// Blocks in the CPU swap pool (0 disables swapping).
    pub num_cpu_blocks: usize,
    /// Fraction of accelerator blocks kept free when admitting new groups.
    pub watermark: f32,
    /// Automatic prefix caching on or off.
    pub enable_prefix_caching: bool,
}

impl PagedKvConfig {
    /// A configuration with vLLM's defaults: watermark 0.01, prefix caching on.
    pub fn new(block_size: usize, num_device_blocks: usize, num_cpu_blocks: usize) -> Self {
        Self {
            block_size,
            num_device_blocks,
            num_cpu_blocks,
            watermark: 0.01,
            enable_prefix_caching: true,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Residence {
    Device,
    Swapped,
}

#[derive(Debug, Clone)]
pub(super) struct SeqState {
    /// Block table: accelerator blocks when resident, CPU blocks when swapped.
    pub(super) table: Vec<BlockId>,
    pub(super) tokens: Vec<u32>,
    /// Chained hashes of the full blocks (empty when caching is off).
    pub(super) hashes: Vec<BlockHash>,
    pub(super) extra: Option<u64>,
    pub(super) residence: Residence,
    /// Trailing tokens appended by [`KvCacheManager::append_provisional`]
    /// and not yet settled: speculative proposals, never hashed.
    pub(super) provisional: usize,
}

/// Accelerator-side bookkeeping, kept apart from the sequence map so both
/// can be borrowed mutably at once.
#[derive(Debug, Clone)]
pub(super) struct Device {
    pub(super) pool: BlockPool,
    pub(super) cache: PrefixCache,
    /// Tokens held by each block (meaningful while referenced or cached).
    pub(super) fill: Vec<u32>,
    /// Sum of `fill` over referenced blocks.
    pub(super) used_slots: usize,
}

impl Device {
    /// A fresh block: the least recently freed one, forgotten by the cache.
    pub(super) fn alloc(&mut self) -> Option<BlockId> {
        let b = self.pool.pop_free()?;
        self.cache.evict(b);
        self.fill[b.0 as usize] = 0;
        Some(b)
    }

    pub(super) fn acquire(&mut self, b: BlockId) {
        if self.pool.ref_count(b) == 0 {
            self.used_slots += self.fill[b.0 as usize] as usize;
        }
        self.pool.acquire(b);
    }

    pub(super) fn release(&mut self, b: BlockId) {
        let keep = self.cache.is_cached(b);
        if self.pool.release(b, keep) {
            self.used_slots -= self.fill[b.0 as usize] as usize;
        }
    }

    pub(super) fn set_fill(&mut self, b: BlockId, fill: usize) {
        let slot = &mut self.fill[b.0 as usize];
        self.used_slots = self.used_slots + fill - *slot as usize;
        *slot = fill as u32;
    }
}

/// PagedAttention's KV cache manager. See the module docs.
#[derive(Debug, Clone)]
pub struct PagedKvCacheManager {
    pub(super) cfg: PagedKvConfig,
    pub(super) watermark_blocks: usize,
    pub(super) dev: Device,
    pub(super) cpu: BlockPool,
    pub(super) seqs: HashMap<SeqId, SeqState, FxBuild>,
}

impl PagedKvCacheManager {
    /// Builds the pools. Errors on a zero block size, an empty accelerator
    /// pool, more blocks than `u32` ids can name, or a watermark outside 0..1.
    pub fn new(cfg: PagedKvConfig) -> Result<Self, KvError> {
        let max_blocks = u32::MAX as usize;
        if cfg.block_size == 0 || cfg.block_size > u32::MAX as usize {
            return Err(KvError::InvalidConfig(
                "block_size must be at least 1".into(),
            ));
        }
        if cfg.num_device_blocks == 0 || cfg.num_device_blocks > max_blocks {
            return Err(KvError::InvalidConfig(format!(
                "num_device_blocks must be in 1..={max_blocks}"
            )));
        }
        if cfg.num_cpu_blocks > max_blocks {
            return Err(KvError::InvalidConfig(format!(
                "num_cpu_blocks must be at most {max_blocks}"
            )));
        }
        if !(0.0..1.0).contains(&cfg.watermark) {
            return Err(KvError::InvalidConfig("watermark must be in [0, 1)".into()));
        }
        let n = cfg.num_device_blocks;
        Ok(Self {
            cfg,
            watermark_blocks: (cfg.watermark as f64 * n as f64) as usize,
            dev: Device {
                pool: BlockPool::new(n),
                cache: PrefixCache::new(n, cfg.block_size, cfg.enable_prefix_caching),
                fill: vec![0; n],
                used_slots: 0,
            },
            cpu: BlockPool::new(cfg.num_cpu_blocks),
            seqs: HashMap::default(),
        })
    }

    pub fn config(&self) -> &PagedKvConfig {
        &self.cfg
    }

    /// Blocks kept free when admitting new groups.
    pub fn watermark_blocks(&self) -> usize {
        self.watermark_blocks
    }

    /// [`KvCacheManager::allocate`] with an extra prefix-cache key (for
    /// example an adapter id): blocks are shared only between sequences
    /// with the same key. Forks inherit the key.
    pub fn allocate_with_extra_key(
        &mut self,
        seq: SeqId,
        prompt: &[u32],
        extra: Option<u64>,
    ) -> Result<usize, KvError> {
        self.register(seq, prompt, extra, true)
    }

    /// Registers `seq`, taking the cached prefix of `prompt` when `use_cache`.
    fn register(
        &mut self,
        seq: SeqId,
        prompt: &[u32],
        extra: Option<u64>,
        use_cache: bool,
    ) -> Result<usize, KvError> {
        if self.seqs.contains_key(&seq) {
            return Err(KvError::DuplicateSequence(seq));
        }
        let bs = self.cfg.block_size;
        let max_blocks = prompt.len().saturating_sub(1) / bs;
        let hits = if use_cache {
            self.dev.cache.lookup(prompt, extra, max_blocks)
        } else {
            Vec::new()
        };
        if use_cache && self.dev.cache.enabled() {
            let counters = &mut self.dev.cache.counters;
            counters.queries += prompt.len() as u64;
            counters.hits += (hits.len() * bs) as u64;
        }
        for hit in &hits {
            self.dev.acquire(hit.block);
        }
        let computed = hits.len() * bs;
        self.seqs.insert(
            seq,
            SeqState {
                table: hits.iter().map(|h| h.block).collect(),
                tokens: prompt[..computed].to_vec(),
                hashes: hits.iter().map(|h| h.hash).collect(),
                extra,
                residence: Residence::Device,
                provisional: 0,
            },
        );
        Ok(computed)
    }

    /// [`KvCacheManager::can_admit`] for sequences with an extra cache key.
    pub fn can_admit_with_extra_key(
        &self,
        prompt: &[u32],
        num_seqs: usize,
        extra: Option<u64>,
    ) -> AdmitDecision {
        let bs = self.cfg.block_size;
        // After prefill and one decode token each: the shared full prompt
        // blocks plus one own last block per sequence.
        let need = (prompt.len() / bs).saturating_add(num_seqs.max(1));
        let total = self.dev.pool.num_blocks();
        if total.saturating_sub(self.watermark_blocks) < need {
            return AdmitDecision::Never;
        }
        let max_blocks = prompt.len().saturating_sub(1) / bs;
        let held_hits = self
            .dev
            .cache
            .lookup(prompt, extra, max_blocks)
            .iter()
            .filter(|h| self.dev.pool.ref_count(h.block) > 0)
            .count();
        let from_free = need - held_hits;
        if self.dev.pool.num_free() >= from_free + self.watermark_blocks {
            AdmitDecision::Now
        } else {
            AdmitDecision::Later
        }
    }

    /// Token ids appended to `seq` so far (resident or swapped).
    pub fn tokens(&self, seq: SeqId) -> Result<&[u32], KvError> {
        Ok(&self.state(seq)?.tokens)
    }

    /// Whether `seq` is currently swapped out.
    pub fn is_swapped(&self, seq: SeqId) -> Result<bool, KvError> {
        Ok(self.state(seq)?.residence == Residence::Swapped)
    }

    /// The CPU block table of a swapped-out sequence.
    pub fn swapped_block_table(&self, seq: SeqId) -> Result<&[BlockId], KvError> {
        let st = self.state(seq)?;
        match st.residence {
            Residence::Swapped => Ok(&st.table),
            Residence::Device => Err(KvError::NotSwapped(seq)),
        }
    }

    /// Reference count of an accelerator block.
    pub fn device_ref_count(&self, b: BlockId) -> u32 {
        self.dev.pool.ref_count(b)
    }

    /// Reference count of a CPU block.
    pub fn cpu_ref_count(&self, b: BlockId) -> u32 {
        self.cpu.ref_count(b)
    }

    /// Free accelerator blocks, next to be evicted first.
    pub fn free_device_blocks(&self) -> Vec<BlockId> {
        self.dev.pool.free_list().collect()
    }

    /// Whether an accelerator block is findable by the prefix cache.
    pub fn is_cached(&self, b: BlockId) -> bool {
        self.dev.cache.is_cached(b)
    }

    /// vLLM's `reset_prefix_cache`: forgets every cached block, and records
    /// `AllBlocksCleared`. Refused (returns false, nothing changes) while
    /// any accelerator block is referenced, as vLLM refuses while blocks are
    /// in use. O(pool size).
    pub fn reset_prefix_cache(&mut self) -> bool {
        if self.dev.pool.num_free() != self.dev.pool.num_blocks() {
            return false;
        }
        self.dev.cache.clear();
        true
    }

    /// Every hash the prefix cache can find now (no order).
    pub fn cached_hashes(&self) -> Vec<BlockHash> {
        self.dev.cache.cached_hashes().collect()
    }

    /// Number of sequences known (resident or swapped).
    pub fn num_sequences(&self) -> usize {
        self.seqs.len()
    }

    pub(super) fn state(&self, seq: SeqId) -> Result<&SeqState, KvError> {
        self.seqs.get(&seq).ok_or(KvError::UnknownSequence(seq))
    }

    fn resident(&self, seq: SeqId) -> Result<&SeqState, KvError> {
        let st = self.state(seq)?;
        match st.residence {
            Residence::Device => Ok(st),
            Residence::Swapped => Err(KvError::NotResident(seq)),
        }
    }

    /// (copy-on-write needed, new blocks needed) to append `n` tokens.
    fn append_plan(&self, st: &SeqState, n: usize) -> (bool, usize) {
        if n == 0 {
            return (false, 0);
        }
        let bs = self.cfg.block_size;
        let cur = st.tokens.len();
        let cow = !cur.is_multiple_of(bs)
            && st
                .table
                .last()
                .is_some_and(|&b| self.dev.pool.ref_count(b) > 1);
        let new_blocks = (cur + n).div_ceil(bs) - st.table.len();
        (cow, new_blocks)
    }

    /// Registers the full blocks `from..` of `seq` in the prefix cache,
    /// extending its hash chain.
    pub(super) fn register_full_blocks(dev: &mut Device, st: &mut SeqState, bs: usize) {
        if !dev.cache.enabled() {
            return;
        }
        let full = (st.tokens.len() - st.provisional) / bs;
        for i in st.hashes.len()..full {
            let parent = i.checked_sub(1).map(|p| st.hashes[p]);
            let toks = &st.tokens[i * bs..(i + 1) * bs];
            let hash = hash_block(parent, st.extra, toks);
            st.hashes.push(hash);
            dev.cache
                .register(st.table[i], hash, parent, st.extra, toks);
        }
    }
}

impl PagedKvCacheManager {
    /// [`KvCacheManager::append_slots`], the tokens marked provisional
    /// (never hashed until settled) or not.
    fn append(
        &mut self,
        seq: SeqId,
        tokens: &[u32],
        provisional: bool,
    ) -> Result<AppendOutcome, KvError> {
        let (cow, new_blocks) = self.append_plan(self.resident(seq)?, tokens.len());
        if self.dev.pool.num_free() < usize::from(cow) + new_blocks {
            return Err(KvError::OutOfBlocks);
        }
        let bs = self.cfg.block_size;
        let dev = &mut self.dev;
        let st = self
            .seqs
            .get_mut(&seq)
            .ok_or(KvError::UnknownSequence(seq))?;
        let mut out = AppendOutcome::default();
        if cow {
            let last = st.table.len() - 1;
            let src = st.table[last];
            let dst = dev.alloc().ok_or(KvError::OutOfBlocks)?;
            dev.set_fill(dst, dev.fill[src.0 as usize] as usize);
            // src is shared (reference count > 1): it stays referenced.
            dev.release(src);
            st.table[last] = dst;
            out.copies.push(BlockCopy { src, dst });
        }
        for _ in 0..new_blocks {
            let b = dev.alloc().ok_or(KvError::OutOfBlocks)?;
            st.table.push(b);
        }
        out.slots.reserve(tokens.len());
        let start = st.tokens.len();
        for pos in start..start + tokens.len() {
            let b = st.table[pos / bs];
            out.slots.push(b.0 as usize * bs + pos % bs);
        }
        // Account the written tokens block by block.
        let mut pos = start;
        let end = start + tokens.len();
        while pos < end {
            let b = st.table[pos / bs];
            let block_end = (pos / bs + 1) * bs;
            let upto = block_end.min(end);
            let fill = dev.fill[b.0 as usize] as usize + (upto - pos);
            dev.set_fill(b, fill);
            pos = upto;
        }
        st.tokens.extend_from_slice(tokens);
        if provisional {
            st.provisional += tokens.len();
        }
        Self::register_full_blocks(dev, st, bs);
        Ok(out)
    }

    /// Drops a resident sequence's tokens past `len` (none of them hashed:
    /// the callers check): blocks left empty are released, the last one's
    /// fill shrinks. Its slots hold stale K/V that the next append
    /// overwrites before anything reads it.
    fn cut(&mut self, seq: SeqId, len: usize) -> Result<(), KvError> {
        let bs = self.cfg.block_size;
        let st = self
            .seqs
            .get_mut(&seq)
            .ok_or(KvError::UnknownSequence(seq))?;
        if len >= st.tokens.len() {
            return Ok(());
        }
        let keep_blocks = len.div_ceil(bs);
        let on_device = st.residence == Residence::Device;
        while st.table.len() > keep_blocks {
            if let Some(b) = st.table.pop() {
                if on_device {
                    self.dev.release(b);
                } else {
                    self.cpu.release(b, false);
                }
            }
        }
        if let (true, Some(&last)) = (on_device, st.table.last()) {
            self.dev.set_fill(last, len - (keep_blocks - 1) * bs);
        }
        st.tokens.truncate(len);
        Ok(())
    }
}

impl KvCacheManager for PagedKvCacheManager {
    fn block_size(&self) -> usize {
        self.cfg.block_size
    }

    fn can_admit(&self, prompt: &[u32], num_seqs: usize, _hint: LengthHint) -> AdmitDecision {
        self.can_admit_with_extra_key(prompt, num_seqs, None)
    }

    fn allocate(
        &mut self,
        seq: SeqId,
        prompt: &[u32],
        _hint: LengthHint,
    ) -> Result<usize, KvError> {
        self.allocate_with_extra_key(seq, prompt, None)
    }

    fn allocate_uncached(
        &mut self,
        seq: SeqId,
        prompt: &[u32],
        _hint: LengthHint,
    ) -> Result<usize, KvError> {
        self.register(seq, prompt, None, false)
    }

    fn can_admit_keyed(
        &self,
        prompt: &[u32],
        num_seqs: usize,
        _hint: LengthHint,
        extra: Option<u64>,
    ) -> AdmitDecision {
        self.can_admit_with_extra_key(prompt, num_seqs, extra)
    }

    fn allocate_keyed(
        &mut self,
        seq: SeqId,
        prompt: &[u32],
        _hint: LengthHint,
        extra: Option<u64>,
    ) -> Result<usize, KvError> {
        self.allocate_with_extra_key(seq, prompt, extra)
    }

    fn allocate_uncached_keyed(
        &mut self,
        seq: SeqId,
        prompt: &[u32],
        _hint: LengthHint,
        extra: Option<u64>,
    ) -> Result<usize, KvError> {
        self.register(seq, prompt, extra, false)
    }

    fn blocks_needed_to_append(&self, seq: SeqId, num_tokens: usize) -> Result<usize, KvError> {
        let (cow, new_blocks) = self.append_plan(self.resident(seq)?, num_tokens);
        Ok(usize::from(cow) + new_blocks)
    }

    fn append_slots(&mut self, seq: SeqId, tokens: &[u32]) -> Result<AppendOutcome, KvError> {
        self.append(seq, tokens, false)
    }

    fn append_provisional(&mut self, seq: SeqId, tokens: &[u32]) -> Result<AppendOutcome, KvError> {
        self.append(seq, tokens, true)
    }

    fn settle_provisional(&mut self, seq: SeqId, keep: usize) -> Result<(), KvError> {
        // Resident, or swapped out while its step ran (asynchronous
        // scheduling may preempt a sequence before its update).
        let st = self.state(seq)?;
        let keep = keep.min(st.provisional);
        let len = st.tokens.len() - st.provisional + keep;
        self.cut(seq, len)?;
        let bs = self.cfg.block_size;
        let st = self
            .seqs
            .get_mut(&seq)
            .ok_or(KvError::UnknownSequence(seq))?;
        st.provisional = 0;
        if st.residence == Residence::Device {
            // A swapped sequence's full blocks are hashed at swap-in.
            Self::register_full_blocks(&mut self.dev, st, bs);
        }
        Ok(())
    }

    fn truncate(&mut self, seq: SeqId, num_tokens: usize) -> Result<(), KvError> {
        let st = self.resident(seq)?;
        if num_tokens < st.hashes.len() * self.cfg.block_size {
            return Err(KvError::SealedToken(seq));
        }
        self.cut(seq, num_tokens)?;
        if let Some(st) = self.seqs.get_mut(&seq) {
            st.provisional = st.provisional.min(st.tokens.len());
        }
        Ok(())
    }

    fn replace_last_token(&mut self, seq: SeqId, token: u32) -> Result<(), KvError> {
        let bs = self.cfg.block_size;
        let st = self
            .seqs
            .get_mut(&seq)
            .ok_or(KvError::UnknownSequence(seq))?;
        let Some(last) = st.tokens.len().checked_sub(1) else {
            return Err(KvError::UnknownSequence(seq));
        };
        if last / bs < st.hashes.len() {
            return Err(KvError::SealedToken(seq));
        }
        st.tokens[last] = token;
        Ok(())
    }

    fn hashes_tokens(&self) -> bool {
        self.dev.cache.enabled()
    }

    fn fork(&mut self, parent: SeqId, child: SeqId) -> Result<(), KvError> {
        if self.seqs.contains_key(&child) {
            return Err(KvError::DuplicateSequence(child));
        }
        let st = self.resident(parent)?.clone();
        for &b in &st.table {
            self.dev.acquire(b);
        }
        self.seqs.insert(child, st);
        Ok(())
    }

    fn free(&mut self, seq: SeqId) {
        let Some(st) = self.seqs.remove(&seq) else {
            return;
        };
        // Last blocks first: they join the free list earlier and so are
        // evicted before the (more shareable) first blocks of the chain.
        for &b in st.table.iter().rev() {
            match st.residence {
                Residence::Device => self.dev.release(b),
                Residence::Swapped => {
                    self.cpu.release(b, false);
                }
            }
        }
    }

    fn block_table(&self, seq: SeqId) -> Result<&[BlockId], KvError> {
        Ok(&self.resident(seq)?.table)
    }

    fn num_tokens(&self, seq: SeqId) -> Result<usize, KvError> {
        Ok(self.state(seq)?.tokens.len())
    }

    fn swap_out(&mut self, group: &[SeqId]) -> Result<Vec<BlockCopy>, KvError> {
        self.swap_out_group(group)
    }

    fn can_swap_in(&self, group: &[SeqId]) -> bool {
        self.swap_in_need(group)
            .is_ok_and(|need| need <= self.dev.pool.num_free())
    }

    fn swap_in(&mut self, group: &[SeqId]) -> Result<Vec<BlockCopy>, KvError> {
        self.swap_in_group(group)
    }

    fn num_free_blocks(&self) -> usize {
        self.dev.pool.num_free()
    }

    fn stats(&self) -> KvStats {
        let total = self.dev.pool.num_blocks();
        let free = self.dev.pool.num_free();
        let c = self.dev.cache.counters;
        KvStats {
            total_blocks: total,
            free_blocks: free,
            cpu_total_blocks: self.cpu.num_blocks(),
            cpu_free_blocks: self.cpu.num_free(),
            usage: (total - free) as f32 / total as f32,
            allocated_slots: (total - free) * self.cfg.block_size,
            used_slots: self.dev.used_slots,
            prefix_cache_queries: c.queries,
            prefix_cache_hits: c.hits,
            prefix_cache_evictions: c.evictions,
        }
    }

    fn record_events(&mut self, on: bool) {
        self.dev.cache.record_events(on);
    }

    fn take_events(&mut self) -> Vec<KvEvent> {
        self.dev.cache.take_events()
    }
}
