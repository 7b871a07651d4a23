//! Swapping whole sequence groups between the accelerator pool and the CPU
//! pool (preemption by swapping).
//!
//! All or nothing: the group is checked (every sequence known and in the
//! right place, enough free blocks on the destination) before anything
//! moves. A block referenced by several sequences of the group moves once
//! and stays shared; its destination reference count is the number of the
//! group's table entries naming it. A block also held outside the group
//! stays on the accelerator for the other holders (the group gets its own
//! copy). Complexity: O(blocks of the group), expected.

use std::collections::{HashMap, HashSet};

use super::paged::{PagedKvCacheManager, Residence};
use super::{BlockCopy, BlockId, KvError, SeqId};

/// The group's ids, each once, in first-appearance order.
fn distinct(group: &[SeqId]) -> Vec<SeqId> {
    let mut seen = HashSet::with_capacity(group.len());
    group.iter().copied().filter(|s| seen.insert(*s)).collect()
}

impl PagedKvCacheManager {
    /// Distinct blocks of the group's tables, in first-appearance order,
    /// after checking every sequence is in `want`.
    fn group_blocks(&self, ids: &[SeqId], want: Residence) -> Result<Vec<BlockId>, KvError> {
        let mut seen = HashSet::new();
        let mut order = Vec::new();
        for &id in ids {
            let st = self.state(id)?;
            if st.residence != want {
                return Err(match want {
                    Residence::Device => KvError::NotResident(id),
                    Residence::Swapped => KvError::NotSwapped(id),
                });
            }
            order.extend(st.table.iter().copied().filter(|b| seen.insert(*b)));
        }
        Ok(order)
    }

    /// Accelerator blocks `swap_in(group)` needs, or why it cannot run.
    pub(super) fn swap_in_need(&self, group: &[SeqId]) -> Result<usize, KvError> {
        Ok(self
            .group_blocks(&distinct(group), Residence::Swapped)?
            .len())
    }

    pub(super) fn swap_out_group(&mut self, group: &[SeqId]) -> Result<Vec<BlockCopy>, KvError> {
        let ids = distinct(group);
        let order = self.group_blocks(&ids, Residence::Device)?;
        if self.cpu.num_free() < order.len() {
            return Err(KvError::SwapSpaceFull);
        }
        let mut map = HashMap::with_capacity(order.len());
        let mut copies = Vec::with_capacity(order.len());
        for &src in &order {
            // Cannot fail: the free count was checked above.
            let dst = self.cpu.pop_free().ok_or(KvError::SwapSpaceFull)?;
            map.insert(src, dst);
            copies.push(BlockCopy { src, dst });
        }
        for id in ids {
            let st = self.seqs.get_mut(&id).ok_or(KvError::UnknownSequence(id))?;
            for b in st.table.iter_mut().rev() {
                let Some(&cpu_block) = map.get(b) else {
                    continue;
                };
                self.cpu.acquire(cpu_block);
                self.dev.release(*b);
                *b = cpu_block;
            }
            st.residence = Residence::Swapped;
        }
        // Drop the reference `pop_free` gave each CPU block: what remains is
        // one per table entry.
        for c in &copies {
            self.cpu.release(c.dst, false);
        }
        Ok(copies)
    }

    pub(super) fn swap_in_group(&mut self, group: &[SeqId]) -> Result<Vec<BlockCopy>, KvError> {
        let ids = distinct(group);
        let order = self.group_blocks(&ids, Residence::Swapped)?;
        if self.dev.pool.num_free() < order.len() {
            return Err(KvError::OutOfBlocks);
        }
        let bs = self.cfg.block_size;
        let mut map = HashMap::with_capacity(order.len());
        let mut copies = Vec::with_capacity(order.len());
        for &src in &order {
            let dst = self.dev.alloc().ok_or(KvError::OutOfBlocks)?;
            map.insert(src, dst);
            copies.push(BlockCopy { src, dst });
        }
        for id in ids {
            let st = self.seqs.get_mut(&id).ok_or(KvError::UnknownSequence(id))?;
            let n = st.tokens.len();
            for (i, b) in st.table.iter_mut().enumerate() {
                let Some(&dev_block) = map.get(b) else {
                    continue;
                };
                // Every holder of a block sees the same fill.
                self.dev.set_fill(dev_block, (n - i * bs).min(bs));
                self.dev.acquire(dev_block);
                self.cpu.release(*b, false);
                *b = dev_block;
            }
            st.residence = Residence::Device;
            // The contents are back: make the full blocks findable again.
            for (i, &hash) in st.hashes.iter().enumerate() {
                let parent = i.checked_sub(1).map(|p| st.hashes[p]);
                let toks = &st.tokens[i * bs..(i + 1) * bs];
                self.dev
                    .cache
                    .register(st.table[i], hash, parent, st.extra, toks);
            }
            // Blocks settled full while swapped out get their hashes now.
            Self::register_full_blocks(&mut self.dev, st, bs);
        }
        for c in &copies {
            self.dev.release(c.dst);
        }
        Ok(copies)
    }
}
