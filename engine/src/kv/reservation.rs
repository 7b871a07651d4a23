//! The paper's contiguous-reservation baselines (Orca Max / Pow2 / Oracle)
//! behind the same [`KvCacheManager`] trait as the paged manager.
//!
//! At admission each sequence reserves one contiguous run of blocks sized by
//! the policy; its slots are `start * block_size + position`, so the paged
//! executor can run them unchanged. Use `block_size = 1` for the paper's
//! token-granular accounting.
//!
//! - [`ReservationPolicy::OrcaMax`] reserves `LengthHint::max_total_tokens`.
//! - [`ReservationPolicy::OrcaPow2`] reserves the next power of two of the true
//!   prompt + output length (the oracle; `max_total_tokens` without one),
//!   capped at `max_total_tokens`.
//! - [`ReservationPolicy::OrcaOracle`] reserves exactly the true length.
//!
//! A reservation is never less than the prompt. A sequence that outgrows its
//! reservation grows in place if the blocks right after it are free, else
//! `append_slots` fails with `OutOfBlocks` (the scheduler preempts).
//! No sharing: `fork` reserves a separate run for the child; the copies of the
//! parent's written blocks are returned with the child's next
//! `append_slots`, and the parent's blocks stay pinned (reference counted)
//! until then. No prefix caching and no CPU pool: `swap_out` answers
//! `SwapSpaceFull`, so preemption is by recomputation.
//!
//! Stats: `allocated_slots` = reserved (and pinned) blocks x block size,
//! `used_slots` = tokens actually written, summed over sequences.
//!
//! Complexity: reserving is first fit over the free extents, O(extents);
//! freeing merges with neighbours, O(log extents) per freed run.
//! Invariant: free extents are disjoint, non-adjacent (merged), and cover
//! exactly the blocks with reference count 0.

use std::collections::{BTreeMap, HashMap};

use super::{
    AdmitDecision, AppendOutcome, BlockCopy, BlockId, KvCacheManager, KvError, KvStats, LengthHint,
    SeqId,
};

/// How much a contiguous-reservation baseline reserves per sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReservationPolicy {
    OrcaMax,
    OrcaPow2,
    OrcaOracle,
}

impl ReservationPolicy {
    /// Tokens reserved for a sequence with this prompt length and hint.
    pub fn reserved_tokens(self, prompt_len: usize, hint: LengthHint) -> usize {
        let truth = hint.oracle_total_tokens.unwrap_or(hint.max_total_tokens);
        let want = match self {
            Self::OrcaMax => hint.max_total_tokens,
            Self::OrcaPow2 => truth
                .checked_next_power_of_two()
                .unwrap_or(usize::MAX)
                .min(hint.max_total_tokens.max(truth)),
            Self::OrcaOracle => truth,
        };
        want.max(prompt_len).max(1)
    }
}

#[derive(Debug, Clone)]
struct ResSeq {
    table: Vec<BlockId>,
    tokens: usize,
    /// Copies from a fork parent, returned with the next append.
    pending: Vec<BlockCopy>,
}

/// A contiguous-reservation KV cache manager (the paper's baselines).
#[derive(Debug, Clone)]
pub struct ReservationKvCacheManager {
    policy: ReservationPolicy,
    block_size: usize,
    total_blocks: usize,
    /// Free extents: start block -> length in blocks.
    free: BTreeMap<usize, usize>,
    num_free: usize,
    refs: Vec<u32>,
    seqs: HashMap<SeqId, ResSeq>,
}

impl ReservationKvCacheManager {
    pub fn new(
        policy: ReservationPolicy,
        block_size: usize,
        num_blocks: usize,
    ) -> Result<Self, KvError> {
        if block_size == 0 || num_blocks == 0 || num_blocks > u32::MAX as usize {
            return Err(KvError::InvalidConfig(
                "block_size and num_blocks must be at least 1 (num_blocks < 2^32)".into(),
            ));
        }
        let mut free = BTreeMap::new();
        free.insert(0, num_blocks);
        Ok(Self {
            policy,
            block_size,
            total_blocks: num_blocks,
            free,
            num_free: num_blocks,
            refs: vec![0; num_blocks],
            seqs: HashMap::new(),
        })
    }

    pub fn policy(&self) -> ReservationPolicy {
        self.policy
    }

    fn blocks_for(&self, prompt_len: usize, hint: LengthHint) -> usize {
        self.policy
            .reserved_tokens(prompt_len, hint)
            .div_ceil(self.block_size)
    }

    /// First-fit contiguous run of `n` blocks, referenced once each.
    fn reserve(&mut self, n: usize) -> Option<Vec<BlockId>> {
        let (&start, &len) = self.free.iter().find(|(_, &len)| len >= n)?;
        self.free.remove(&start);
        if len > n {
            self.free.insert(start + n, len - n);
        }
        self.num_free -= n;
        let run: Vec<BlockId> = (start..start + n).map(|b| BlockId(b as u32)).collect();
        for b in &run {
            self.refs[b.0 as usize] = 1;
        }
        Some(run)
    }

    /// Drops one reference from each block; runs reaching 0 become free.
    fn release(&mut self, blocks: &[BlockId]) {
        let mut run: Option<(usize, usize)> = None;
        for &b in blocks {
            let i = b.0 as usize;
            self.refs[i] = self.refs[i].saturating_sub(1);
            if self.refs[i] > 0 {
                continue;
            }
            run = match run {
                Some((s, l)) if s + l == i => Some((s, l + 1)),
                Some((s, l)) => {
                    self.free_range(s, l);
                    Some((i, 1))
                }
                None => Some((i, 1)),
            };
        }
        if let Some((s, l)) = run {
            self.free_range(s, l);
        }
    }

    fn free_range(&mut self, mut start: usize, mut len: usize) {
        self.num_free += len;
        if let Some((&ps, &pl)) = self.free.range(..start).next_back() {
            if ps + pl == start {
                self.free.remove(&ps);
                start = ps;
                len += pl;
            }
        }
        if let Some(nl) = self.free.remove(&(start + len)) {
            len += nl;
        }
        self.free.insert(start, len);
    }

    fn seq(&self, seq: SeqId) -> Result<&ResSeq, KvError> {
        self.seqs.get(&seq).ok_or(KvError::UnknownSequence(seq))
    }

    /// Verifies the extent invariants and reference counts. O(blocks).
    pub fn check_invariants(&self) -> Result<(), String> {
        let mut want = vec![0u32; self.total_blocks];
        for st in self.seqs.values() {
            for b in st.table.iter().chain(st.pending.iter().map(|c| &c.src)) {
                want[b.0 as usize] += 1;
            }
        }
        if want != self.refs {
            return Err("reference counts differ from tables and pins".into());
        }
        let mut end = None;
        let mut free = 0;
        for (&s, &l) in &self.free {
            if l == 0 || end.is_some_and(|e| e >= s) {
                return Err(format!("extent {s}+{l} overlaps or touches the previous"));
            }
            if want[s..s + l].iter().any(|&r| r != 0) {
                return Err(format!("extent {s}+{l} holds referenced blocks"));
            }
            free += l;
            end = Some(s + l);
        }
        let unreferenced = want.iter().filter(|&&r| r == 0).count();
        if free != self.num_free || free != unreferenced {
            return Err(format!(
                "{free} free in extents, {unreferenced} unreferenced"
            ));
        }
        Ok(())
    }
}

impl KvCacheManager for ReservationKvCacheManager {
    fn block_size(&self) -> usize {
        self.block_size
    }

    fn can_admit(&self, prompt: &[u32], num_seqs: usize, hint: LengthHint) -> AdmitDecision {
        let k = self.blocks_for(prompt.len(), hint);
        let n = num_seqs.max(1);
        if k.saturating_mul(n) > self.total_blocks {
            return AdmitDecision::Never;
        }
        let fits: usize = self.free.values().map(|&l| l / k).sum();
        if fits >= n {
            AdmitDecision::Now
        } else {
            AdmitDecision::Later
        }
    }

    fn allocate(&mut self, seq: SeqId, prompt: &[u32], hint: LengthHint) -> Result<usize, KvError> {
        if self.seqs.contains_key(&seq) {
            return Err(KvError::DuplicateSequence(seq));
        }
        let n = self.blocks_for(prompt.len(), hint);
        let table = self.reserve(n).ok_or(KvError::OutOfBlocks)?;
        self.seqs.insert(
            seq,
            ResSeq {
                table,
                tokens: 0,
                pending: Vec::new(),
            },
        );
        Ok(0)
    }

    fn blocks_needed_to_append(&self, seq: SeqId, num_tokens: usize) -> Result<usize, KvError> {
        let st = self.seq(seq)?;
        Ok((st.tokens + num_tokens)
            .div_ceil(self.block_size)
            .saturating_sub(st.table.len()))
    }

    fn append_slots(&mut self, seq: SeqId, tokens: &[u32]) -> Result<AppendOutcome, KvError> {
        let grow = self.blocks_needed_to_append(seq, tokens.len())?;
        let st = self.seq(seq)?;
        let start = st.table.first().map_or(0, |b| b.0 as usize);
        let end = start + st.table.len();
        if grow > 0 {
            // Grow in place only: the reservation must stay contiguous.
            let Some(&len) = self.free.get(&end).filter(|&&len| len >= grow) else {
                return Err(KvError::OutOfBlocks);
            };
            self.free.remove(&end);
            if len > grow {
                self.free.insert(end + grow, len - grow);
            }
            self.num_free -= grow;
            for r in &mut self.refs[end..end + grow] {
                *r = 1;
            }
        }
        let bs = self.block_size;
        let st = self
            .seqs
            .get_mut(&seq)
            .ok_or(KvError::UnknownSequence(seq))?;
        st.table
            .extend((end..end + grow).map(|b| BlockId(b as u32)));
        let first = start * bs + st.tokens;
        st.tokens += tokens.len();
        let copies = std::mem::take(&mut st.pending);
        let pins: Vec<BlockId> = copies.iter().map(|c| c.src).collect();
        self.release(&pins);
        Ok(AppendOutcome {
            slots: (first..first + tokens.len()).collect(),
            copies,
        })
    }

    fn fork(&mut self, parent: SeqId, child: SeqId) -> Result<(), KvError> {
        if self.seqs.contains_key(&child) {
            return Err(KvError::DuplicateSequence(child));
        }
        let p = self.seq(parent)?.clone();
        let table = self.reserve(p.table.len()).ok_or(KvError::OutOfBlocks)?;
        let written = p.tokens.div_ceil(self.block_size);
        // A parent block still waiting for its own fork copy holds nothing
        // yet: copy from that copy's source instead.
        let parent_pending: HashMap<BlockId, BlockId> =
            p.pending.iter().map(|c| (c.dst, c.src)).collect();
        let mut pending = Vec::with_capacity(written);
        for (&own, &dst) in p.table.iter().zip(&table).take(written) {
            let src = parent_pending.get(&own).copied().unwrap_or(own);
            // The source block must survive until it is copied.
            self.refs[src.0 as usize] += 1;
            pending.push(BlockCopy { src, dst });
        }
        self.seqs.insert(
            child,
            ResSeq {
                table,
                tokens: p.tokens,
                pending,
            },
        );
        Ok(())
    }

    fn free(&mut self, seq: SeqId) {
        if let Some(st) = self.seqs.remove(&seq) {
            let pins: Vec<BlockId> = st.pending.iter().map(|c| c.src).collect();
            self.release(&st.table);
            self.release(&pins);
        }
    }

    fn block_table(&self, seq: SeqId) -> Result<&[BlockId], KvError> {
        Ok(&self.seq(seq)?.table)
    }

    fn num_tokens(&self, seq: SeqId) -> Result<usize, KvError> {
        Ok(self.seq(seq)?.tokens)
    }

    fn swap_out(&mut self, group: &[SeqId]) -> Result<Vec<BlockCopy>, KvError> {
        for &id in group {
            self.seq(id)?;
        }
        Err(KvError::SwapSpaceFull)
    }

    fn can_swap_in(&self, _group: &[SeqId]) -> bool {
        false
    }

    fn swap_in(&mut self, group: &[SeqId]) -> Result<Vec<BlockCopy>, KvError> {
        let id = *group.first().ok_or(KvError::NotSwapped(SeqId(0)))?;
        self.seq(id)?;
        Err(KvError::NotSwapped(id))
    }

    fn num_free_blocks(&self) -> usize {
        self.num_free
    }

    fn stats(&self) -> KvStats {
        let used = self.total_blocks - self.num_free;
        KvStats {
            total_blocks: self.total_blocks,
            free_blocks: self.num_free,
            usage: used as f32 / self.total_blocks as f32,
            allocated_slots: used * self.block_size,
            used_slots: self.seqs.values().map(|s| s.tokens).sum(),
            ..KvStats::default()
        }
    }
}
