//! Block pool and KV cache manager: PagedAttention's memory management.
//!
//! The scheduler talks to the KV cache only through [`KvCacheManager`]: it
//! asks for slots and gets them or "not now"; it never touches a pool's
//! internals. The paged manager (ours) and the paper's contiguous-reservation
//! baselines (Orca Max / Pow2 / Oracle) implement the same trait.
//!
//! Vocabulary:
//! - a *block* holds the K/V of `block_size` consecutive tokens of one
//!   sequence; blocks live in a pool (the accelerator pool or the CPU swap pool);
//! - a sequence's *block table* maps its logical blocks to physical ones;
//! - a *slot* is `block.0 as usize * block_size + offset`: where one token's
//!   K/V is written in the accelerator pool.

mod check;
mod events;
mod fx;
mod paged;
mod pool;
mod prefix_cache;
mod reservation;
mod swap;
#[cfg(test)]
mod tests_prop;
#[cfg(test)]
mod tests_reservation;
#[cfg(test)]
mod tests_unit;

pub use events::{KvEvent, KvEventSink, KvMedium};
pub use paged::{PagedKvCacheManager, PagedKvConfig};
pub use prefix_cache::{hash_block, BlockHash};
pub use reservation::{ReservationKvCacheManager, ReservationPolicy};

pub use engine_core::{BlockCopy, BlockId, KvError, SeqId};

/// The answer to "can this group be admitted?".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdmitDecision {
    /// Enough free blocks now (above the watermark).
    Now,
    /// Not now, but it fits in an empty cache: wait.
    Later,
    /// Larger than the whole cache: refuse the request, never queue it.
    Never,
}

/// Length information the contiguous-reservation baselines need to decide
/// how much to reserve. The paged manager ignores everything but the prompt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LengthHint {
    /// Upper bound on prompt + output tokens (`max_model_len` or prompt + max_tokens).
    pub max_total_tokens: usize,
    /// The true prompt + output length, when known (the Oracle baseline).
    pub oracle_total_tokens: Option<usize>,
}

/// Slots for newly scheduled tokens, plus the copy-on-write copies that must
/// happen before they are written.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AppendOutcome {
    /// One slot per appended token, in order.
    pub slots: Vec<usize>,
    /// (src, dst) accelerator-pool block copies to run before the step.
    pub copies: Vec<BlockCopy>,
}

/// Counters and gauges for metrics and benchmarks.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct KvStats {
    pub total_blocks: usize,
    pub free_blocks: usize,
    pub cpu_total_blocks: usize,
    pub cpu_free_blocks: usize,
    /// Fraction of accelerator blocks in use (0..=1).
    pub usage: f32,
    /// Slots reserved (allocated blocks x block_size, shared blocks once).
    pub allocated_slots: usize,
    /// Slots holding real token states.
    pub used_slots: usize,
    pub prefix_cache_queries: u64,
    pub prefix_cache_hits: u64,
    pub prefix_cache_evictions: u64,
}

/// The narrow interface between the scheduler and the KV cache.
///
/// A sequence's tokens enter the cache through [`KvCacheManager::append_slots`]:
/// the scheduler appends exactly the tokens it schedules for compute in a
/// step (a prompt chunk, or the one token sampled last step).
pub trait KvCacheManager: Send {
    /// Tokens per block.
    fn block_size(&self) -> usize;

    /// Whether a new group of `num_seqs` sequences sharing `prompt` can be
    /// admitted now, later, or never.
    fn can_admit(&self, prompt: &[u32], num_seqs: usize, hint: LengthHint) -> AdmitDecision;

    /// Registers a new sequence whose prompt is `prompt`. Reuses the longest
    /// cached prefix (whole blocks only; never the whole prompt: at least one
    /// token is left to compute so the step yields logits) and returns how
    /// many leading tokens are already computed. Those tokens count as
    /// appended; the caller appends the rest.
    fn allocate(&mut self, seq: SeqId, prompt: &[u32], hint: LengthHint) -> Result<usize, KvError>;

    /// [`Self::can_admit`] for a sequence whose prefix-cache key is `extra`
    /// (a LoRA adapter's id): only blocks cached under the same key count.
    /// The default suits managers without a prefix cache.
    fn can_admit_keyed(
        &self,
        prompt: &[u32],
        num_seqs: usize,
        hint: LengthHint,
        extra: Option<u64>,
    ) -> AdmitDecision {
        let _ = extra;
        self.can_admit(prompt, num_seqs, hint)
    }

    /// [`Self::allocate`] under the prefix-cache key `extra`: blocks are
    /// shared only between sequences with the same key (forks inherit it).
    /// The default suits managers without a prefix cache.
    fn allocate_keyed(
        &mut self,
        seq: SeqId,
        prompt: &[u32],
        hint: LengthHint,
        extra: Option<u64>,
    ) -> Result<usize, KvError> {
        let _ = extra;
        self.allocate(seq, prompt, hint)
    }

    /// [`Self::allocate_uncached`] under the prefix-cache key `extra` (the
    /// blocks it fills are registered under that key).
    fn allocate_uncached_keyed(
        &mut self,
        seq: SeqId,
        prompt: &[u32],
        hint: LengthHint,
        extra: Option<u64>,
    ) -> Result<usize, KvError> {
        let _ = extra;
        self.allocate_uncached(seq, prompt, hint)
    }

    /// [`Self::allocate`] without reusing any cached prefix (returns 0): for
    /// requests that need every prompt position computed (prompt logprobs).
    /// The default suits managers without a prefix cache; a manager with one
    /// must skip its lookup here.
    fn allocate_uncached(
        &mut self,
        seq: SeqId,
        prompt: &[u32],
        hint: LengthHint,
    ) -> Result<usize, KvError> {
        self.allocate(seq, prompt, hint)
    }

    /// Number of free accelerator blocks `append_slots(seq, n tokens)` would
    /// consume (new blocks and copy-on-write copies), so the scheduler can
    /// budget a step before committing it.
    fn blocks_needed_to_append(&self, seq: SeqId, num_tokens: usize) -> Result<usize, KvError>;

    /// Reserves slots for `tokens`, appended after the sequence's current
    /// tokens. All or nothing: on `OutOfBlocks` nothing changed.
    fn append_slots(&mut self, seq: SeqId, tokens: &[u32]) -> Result<AppendOutcome, KvError>;

    /// Reserves slots for speculative `tokens` (proposals a verification
    /// step computes), appended like [`Self::append_slots`] but
    /// *provisional*: a block they fill is not findable by its contents
    /// until [`Self::settle_provisional`] keeps them, so a rejected proposal
    /// never enters the prefix cache. The default (managers that hash
    /// nothing) is a plain append.
    fn append_provisional(&mut self, seq: SeqId, tokens: &[u32]) -> Result<AppendOutcome, KvError> {
        self.append_slots(seq, tokens)
    }

    /// Keeps the first `keep` provisional tokens of `seq` (the accepted
    /// proposals) and drops the rest: their slots are given back, a block
    /// left empty is freed, and full blocks of kept tokens become findable.
    fn settle_provisional(&mut self, seq: SeqId, keep: usize) -> Result<(), KvError> {
        let _ = (seq, keep);
        Err(KvError::InvalidConfig(
            "this KV cache manager cannot roll back speculative tokens".into(),
        ))
    }

    /// Drops the tokens of `seq` past its first `num_tokens` (a draft
    /// model's cache after the target rejected its proposals). Refused
    /// when that would cut into a block already findable by its contents.
    fn truncate(&mut self, seq: SeqId, num_tokens: usize) -> Result<(), KvError> {
        let _ = (seq, num_tokens);
        Err(KvError::InvalidConfig(
            "this KV cache manager cannot truncate a sequence".into(),
        ))
    }

    /// Replaces the last token appended to `seq` (asynchronous scheduling
    /// appends a placeholder and learns the token once the previous step's
    /// sample arrives). Fails when that token's block is already full and
    /// findable by its contents ([`KvCacheManager::hashes_tokens`]). The
    /// default suits managers that keep no token contents.
    fn replace_last_token(&mut self, seq: SeqId, token: u32) -> Result<(), KvError> {
        let _ = (seq, token);
        Ok(())
    }

    /// Whether a full block's token contents are recorded (prefix caching),
    /// so a placeholder must never complete a block.
    fn hashes_tokens(&self) -> bool {
        false
    }

    /// Makes `child` share every block of `parent` (reference counts go up).
    fn fork(&mut self, parent: SeqId, child: SeqId) -> Result<(), KvError>;

    /// Drops the sequence and its references, wherever its blocks live.
    /// Freed full blocks stay findable by the prefix cache until evicted.
    fn free(&mut self, seq: SeqId);

    /// The accelerator block table of a resident sequence.
    fn block_table(&self, seq: SeqId) -> Result<&[BlockId], KvError>;

    /// Number of tokens appended to the sequence so far.
    fn num_tokens(&self, seq: SeqId) -> Result<usize, KvError>;

    /// Moves a whole group to the CPU pool, all or nothing. Blocks shared
    /// inside the group move once and stay shared. Returns device -> CPU copies.
    fn swap_out(&mut self, group: &[SeqId]) -> Result<Vec<BlockCopy>, KvError>;

    /// Whether [`KvCacheManager::swap_in`] would succeed now.
    fn can_swap_in(&self, group: &[SeqId]) -> bool;

    /// Brings a swapped group back, all or nothing. Returns CPU -> device copies.
    fn swap_in(&mut self, group: &[SeqId]) -> Result<Vec<BlockCopy>, KvError>;

    /// Number of free accelerator blocks.
    fn num_free_blocks(&self) -> usize;

    /// Counters and gauges.
    fn stats(&self) -> KvStats;

    /// Starts (or stops) recording [`KvEvent`]s: changes of the set of
    /// blocks the prefix cache can find. Off by default, and free while off.
    /// The default suits managers without a prefix cache (they have nothing
    /// to report).
    fn record_events(&mut self, on: bool) {
        let _ = on;
    }

    /// The events recorded since the last call, oldest first (empty while
    /// not recording).
    fn take_events(&mut self) -> Vec<KvEvent> {
        Vec::new()
    }
}
