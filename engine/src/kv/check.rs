//! Whole-state invariant check of the paged manager, for tests and debug
//! builds. O(pool size + tokens); never call it on a hot path.

use std::collections::HashMap;

use super::paged::{PagedKvCacheManager, Residence};
use super::BlockId;

impl PagedKvCacheManager {
    /// Verifies every invariant listed in the `paged` module docs, plus the
    /// pools' and the prefix cache's own. Returns the first violation.
    pub fn check_invariants(&self) -> Result<(), String> {
        let bs = self.cfg.block_size;
        self.dev.pool.check_invariants()?;
        self.cpu.check_invariants()?;
        self.dev.cache.check_invariants()?;
        let mut dev_refs: HashMap<BlockId, u32> = HashMap::new();
        let mut cpu_refs: HashMap<BlockId, u32> = HashMap::new();
        for (id, st) in &self.seqs {
            let n = st.tokens.len();
            if st.table.len() != n.div_ceil(bs) {
                return Err(format!(
                    "{id:?}: {} blocks for {n} tokens (more than one partial block?)",
                    st.table.len()
                ));
            }
            if st.provisional > n {
                return Err(format!(
                    "{id:?}: {} provisional of {n} tokens",
                    st.provisional
                ));
            }
            // Provisional (speculative) tokens are never hashed.
            let settled = n - st.provisional;
            let want_hashes = if self.dev.cache.enabled() {
                settled / bs
            } else {
                0
            };
            // A sequence settled while swapped out hashes its new full
            // blocks at swap-in.
            let swapped_short = st.residence == Residence::Swapped && st.hashes.len() < want_hashes;
            if st.hashes.len() != want_hashes && !swapped_short {
                return Err(format!("{id:?}: {} block hashes", st.hashes.len()));
            }
            let refs = match st.residence {
                Residence::Device => &mut dev_refs,
                Residence::Swapped => &mut cpu_refs,
            };
            for (i, &b) in st.table.iter().enumerate() {
                *refs.entry(b).or_default() += 1;
                let fill = (n - i * bs).min(bs);
                if st.residence == Residence::Device && self.dev.fill[b.0 as usize] as usize != fill
                {
                    return Err(format!("{id:?}: {b:?} holds a different token count"));
                }
            }
        }
        let mut used = 0usize;
        for i in 0..self.dev.pool.num_blocks() {
            let b = BlockId(i as u32);
            let rc = self.dev.pool.ref_count(b);
            if rc != dev_refs.get(&b).copied().unwrap_or(0) {
                return Err(format!("device {b:?}: ref count {rc}, tables {dev_refs:?}"));
            }
            if rc > 0 {
                used += self.dev.fill[i] as usize;
            }
            if self.dev.cache.is_cached(b) && self.dev.fill[i] as usize != bs {
                return Err(format!("cached {b:?} is not full"));
            }
        }
        if used != self.dev.used_slots {
            return Err(format!("used_slots {} but {used}", self.dev.used_slots));
        }
        for i in 0..self.cpu.num_blocks() {
            let b = BlockId(i as u32);
            let rc = self.cpu.ref_count(b);
            if rc != cpu_refs.get(&b).copied().unwrap_or(0) {
                return Err(format!("cpu {b:?}: ref count {rc}"));
            }
        }
        Ok(())
    }
}
