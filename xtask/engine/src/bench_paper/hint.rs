//! The KV policies under test, and a wrapper that gives the contiguous
//! reservation baselines the length knowledge the paper grants them.
//!
//! The scheduler passes `LengthHint { max_total_tokens: prompt + max_tokens,
//! oracle_total_tokens: None }`. The paper's baselines need more: Orca (Max)
//! reserves the model's maximum sequence length, Orca (Oracle) the true
//! prompt + output length, Orca (Pow2) its next power of two. [`OracleHints`]
//! looks the true total up by the prompt's tokens (a sequence readmitted
//! after recompute passes prompt + generated tokens, so known prompt lengths
//! are tried as prefixes) and rewrites the hint; it delegates everything else
//! unchanged. Cost per lookup: O(prompt) hashing, O(distinct prompt lengths)
//! on a miss.

use engine::kv::{
    AdmitDecision, AppendOutcome, BlockCopy, BlockId, KvCacheManager, KvError, KvStats, LengthHint,
    PagedKvCacheManager, PagedKvConfig, ReservationKvCacheManager, ReservationPolicy, SeqId,
};
use std::collections::{BTreeSet, HashMap};

/// A KV policy of the comparison.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    Paged,
    OrcaMax,
    OrcaPow2,
    OrcaOracle,
}

impl Policy {
    pub const ALL: [Policy; 4] = [Self::Paged, Self::OrcaMax, Self::OrcaPow2, Self::OrcaOracle];

    pub fn name(self) -> &'static str {
        match self {
            Self::Paged => "paged",
            Self::OrcaMax => "orca-max",
            Self::OrcaPow2 => "orca-pow2",
            Self::OrcaOracle => "orca-oracle",
        }
    }
}

/// How a KV manager for a run is built.
#[derive(Debug, Clone, Copy)]
pub struct KvSetup {
    pub policy: Policy,
    /// Budget in token slots (the same for every policy).
    pub budget_tokens: usize,
    pub paged_block_size: usize,
    pub orca_block_size: usize,
    pub prefix_caching: bool,
    /// The Max baseline's reservation (the model's max sequence length).
    pub max_model_len: usize,
}

impl KvSetup {
    /// Block size the manager (and an executor next to it) uses.
    pub fn block_size(&self) -> usize {
        match self.policy {
            Policy::Paged => self.paged_block_size,
            _ => self.orca_block_size,
        }
    }

    /// Blocks in the accelerator pool.
    pub fn num_blocks(&self) -> usize {
        self.budget_tokens / self.block_size().max(1)
    }

    /// Builds the manager; `truths` maps prompts to true prompt + output lengths.
    pub fn build(&self, truths: &[(Vec<u32>, usize)]) -> Result<Box<dyn KvCacheManager>, KvError> {
        let res = |p| ReservationKvCacheManager::new(p, self.orca_block_size, self.num_blocks());
        Ok(match self.policy {
            Policy::Paged => {
                let mut cfg = PagedKvConfig::new(self.paged_block_size, self.num_blocks(), 0);
                cfg.enable_prefix_caching = self.prefix_caching;
                Box::new(PagedKvCacheManager::new(cfg)?)
            }
            Policy::OrcaMax => Box::new(OracleHints::new(
                res(ReservationPolicy::OrcaMax)?,
                truths,
                Some(self.max_model_len),
            )),
            Policy::OrcaPow2 => Box::new(OracleHints::new(
                res(ReservationPolicy::OrcaPow2)?,
                truths,
                Some(self.max_model_len),
            )),
            Policy::OrcaOracle => Box::new(OracleHints::new(
                res(ReservationPolicy::OrcaOracle)?,
                truths,
                None,
            )),
        })
    }
}

/// Rewrites length hints with the true totals (see the module docs).
pub struct OracleHints<K> {
    inner: K,
    truth: HashMap<Vec<u32>, usize>,
    lengths: BTreeSet<usize>,
    /// When set, `max_total_tokens` becomes this (Orca Max / Pow2's cap).
    max_total: Option<usize>,
}

impl<K: KvCacheManager> OracleHints<K> {
    /// Identical prompts with different outputs (ShareGPT has some) keep the
    /// longest total, so no sequence outgrows its reservation.
    pub fn new(inner: K, truths: &[(Vec<u32>, usize)], max_total: Option<usize>) -> Self {
        let mut truth: HashMap<Vec<u32>, usize> = HashMap::new();
        for (p, t) in truths {
            let e = truth.entry(p.clone()).or_insert(0);
            *e = (*e).max(*t);
        }
        Self {
            inner,
            truth,
            lengths: truths.iter().map(|(p, _)| p.len()).collect(),
            max_total,
        }
    }

    /// The true total for a prompt (or a readmitted prompt + output).
    pub fn lookup(&self, prompt: &[u32]) -> Option<usize> {
        if let Some(&t) = self.truth.get(prompt) {
            return Some(t);
        }
        self.lengths
            .range(..prompt.len())
            .rev()
            .find_map(|&l| self.truth.get(&prompt[..l]).copied())
    }

    fn hint(&self, prompt: &[u32], hint: LengthHint) -> LengthHint {
        match self.lookup(prompt) {
            Some(t) => LengthHint {
                max_total_tokens: self.max_total.unwrap_or(t).max(t),
                oracle_total_tokens: Some(t),
            },
            None => hint,
        }
    }
}

impl<K: KvCacheManager> KvCacheManager for OracleHints<K> {
    fn block_size(&self) -> usize {
        self.inner.block_size()
    }
    fn can_admit(&self, prompt: &[u32], num_seqs: usize, hint: LengthHint) -> AdmitDecision {
        self.inner
            .can_admit(prompt, num_seqs, self.hint(prompt, hint))
    }
    fn allocate(&mut self, seq: SeqId, prompt: &[u32], hint: LengthHint) -> Result<usize, KvError> {
        let h = self.hint(prompt, hint);
        self.inner.allocate(seq, prompt, h)
    }
    fn blocks_needed_to_append(&self, seq: SeqId, num_tokens: usize) -> Result<usize, KvError> {
        self.inner.blocks_needed_to_append(seq, num_tokens)
    }
    fn append_slots(&mut self, seq: SeqId, tokens: &[u32]) -> Result<AppendOutcome, KvError> {
        self.inner.append_slots(seq, tokens)
    }
    fn fork(&mut self, parent: SeqId, child: SeqId) -> Result<(), KvError> {
        self.inner.fork(parent, child)
    }
    fn free(&mut self, seq: SeqId) {
        self.inner.free(seq)
    }
    fn block_table(&self, seq: SeqId) -> Result<&[BlockId], KvError> {
        self.inner.block_table(seq)
    }
    fn num_tokens(&self, seq: SeqId) -> Result<usize, KvError> {
        self.inner.num_tokens(seq)
    }
    fn swap_out(&mut self, group: &[SeqId]) -> Result<Vec<BlockCopy>, KvError> {
        self.inner.swap_out(group)
    }
    fn can_swap_in(&self, group: &[SeqId]) -> bool {
        self.inner.can_swap_in(group)
    }
    fn swap_in(&mut self, group: &[SeqId]) -> Result<Vec<BlockCopy>, KvError> {
        self.inner.swap_in(group)
    }
    fn num_free_blocks(&self) -> usize {
        self.inner.num_free_blocks()
    }
    fn stats(&self) -> KvStats {
        self.inner.stats()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hints_follow_the_policy() {
        let truths = vec![(vec![1, 2, 3], 10), (vec![4, 5], 7), (vec![1, 2, 3], 9)];
        let bs = 1;
        let mk = |p| ReservationKvCacheManager::new(p, bs, 100).unwrap();
        let plain = LengthHint {
            max_total_tokens: 50,
            oracle_total_tokens: None,
        };
        // Oracle: exactly the truth.
        let mut o = OracleHints::new(mk(ReservationPolicy::OrcaOracle), &truths, None);
        o.allocate(SeqId(0), &[1, 2, 3], plain).unwrap();
        assert_eq!(o.stats().allocated_slots, 10);
        // Max: the max model length, whatever the truth.
        let mut m = OracleHints::new(mk(ReservationPolicy::OrcaMax), &truths, Some(64));
        m.allocate(SeqId(0), &[4, 5], plain).unwrap();
        assert_eq!(m.stats().allocated_slots, 64);
        // Pow2: next power of two of the truth, found through a readmitted prompt.
        let mut p = OracleHints::new(mk(ReservationPolicy::OrcaPow2), &truths, Some(64));
        assert_eq!(p.lookup(&[1, 2, 3, 9, 9]), Some(10));
        p.allocate(SeqId(0), &[1, 2, 3, 9, 9], plain).unwrap();
        assert_eq!(p.stats().allocated_slots, 16);
        // Unknown prompt: the scheduler's hint passes through.
        let mut u = OracleHints::new(mk(ReservationPolicy::OrcaOracle), &truths, None);
        assert_eq!(u.lookup(&[8, 8]), None);
        u.allocate(SeqId(0), &[8, 8], plain).unwrap();
        assert_eq!(u.stats().allocated_slots, 50);
    }
}
