//! A pool of fixed-size KV blocks with reference counts and an intrusive,
//! index-linked, doubly linked free list (vLLM v1's `FreeKVCacheBlockQueue`).
//!
//! One pool exists per device: the accelerator pool and the CPU swap pool.
//! The pool only does bookkeeping; the K/V tensors live in the executor.
//!
//! Free-list order is eviction order: [`BlockPool::pop_free`] takes the head
//! (least recently freed), [`BlockPool::release`] puts a block at the tail
//! (most recently freed, to be kept longest) or, for a block whose contents
//! are worthless, at the head (reused first).
//!
//! Block ids handed to the pool must be its own (the manager only passes
//! ids the pool gave out); the pool is private to the `kv` module.
//!
//! Complexity: `pop_free`, `release`, `acquire` (including removal of a
//! free block from the middle of the list, the prefix-cache hit on a freed
//! block) are O(1) and allocation free. Construction is O(n).
//!
//! Invariants (checked by [`BlockPool::check_invariants`]):
//! - a block is in the free list if and only if its reference count is 0;
//! - the list is consistent: `next(prev(b)) == b`, head has no `prev`,
//!   tail has no `next`, and walking it visits exactly `num_free` blocks once.

use super::BlockId;

#[derive(Debug, Clone, Copy, Default)]
struct Node {
    ref_count: u32,
    prev: Option<BlockId>,
    next: Option<BlockId>,
}

/// A fixed set of blocks, each reference counted, with an O(1) free list.
#[derive(Debug, Clone)]
pub struct BlockPool {
    nodes: Vec<Node>,
    head: Option<BlockId>,
    tail: Option<BlockId>,
    num_free: usize,
}

impl BlockPool {
    /// A pool of `num_blocks` free blocks, listed in id order.
    /// The caller guarantees `num_blocks <= u32::MAX as usize + 1`.
    pub fn new(num_blocks: usize) -> Self {
        let mut pool = Self {
            nodes: vec![Node::default(); num_blocks],
            head: None,
            tail: None,
            num_free: 0,
        };
        for i in 0..num_blocks {
            pool.push_back(BlockId(i as u32));
        }
        pool
    }

    /// Total number of blocks.
    pub fn num_blocks(&self) -> usize {
        self.nodes.len()
    }

    /// Number of blocks with reference count 0.
    pub fn num_free(&self) -> usize {
        self.num_free
    }

    /// Reference count of `b` (0 for an id outside the pool).
    pub fn ref_count(&self, b: BlockId) -> u32 {
        self.nodes.get(b.0 as usize).map_or(0, |n| n.ref_count)
    }

    /// Takes the head of the free list and gives it reference count 1.
    pub fn pop_free(&mut self) -> Option<BlockId> {
        let b = self.head?;
        self.unlink(b);
        self.node_mut(b).ref_count = 1;
        Some(b)
    }

    /// Adds one reference to `b`; a free block leaves the free list (O(1)).
    pub fn acquire(&mut self, b: BlockId) {
        if self.node(b).ref_count == 0 {
            self.unlink(b);
        }
        self.node_mut(b).ref_count += 1;
    }

    /// Drops one reference to `b`. When it reaches 0 the block joins the free
    /// list: at the tail (`keep = true`, evicted last) or at the head.
    /// Returns whether the block became free.
    pub fn release(&mut self, b: BlockId, keep: bool) -> bool {
        let node = self.node_mut(b);
        if node.ref_count == 0 {
            // A double release would corrupt the list: refuse it (and catch
            // the caller's bug in debug builds).
            debug_assert!(false, "release of a free block {b:?}");
            return false;
        }
        node.ref_count -= 1;
        if node.ref_count > 0 {
            return false;
        }
        if keep {
            self.push_back(b);
        } else {
            self.push_front(b);
        }
        true
    }

    /// Free blocks from head (next evicted) to tail.
    pub fn free_list(&self) -> FreeIter<'_> {
        FreeIter {
            pool: self,
            cur: self.head,
        }
    }

    /// Verifies the invariants in the module docs. O(n).
    pub fn check_invariants(&self) -> Result<(), String> {
        let mut seen = vec![false; self.nodes.len()];
        let mut count = 0usize;
        let mut prev: Option<BlockId> = None;
        let mut cur = self.head;
        while let Some(b) = cur {
            let i = b.0 as usize;
            if i >= self.nodes.len() || seen[i] {
                return Err(format!("free list revisits or leaves the pool at {b:?}"));
            }
            seen[i] = true;
            count += 1;
            let n = self.nodes[i];
            if n.prev != prev {
                return Err(format!("free list prev link broken at {b:?}"));
            }
            if n.ref_count != 0 {
                return Err(format!("{b:?} is free and referenced ({})", n.ref_count));
            }
            prev = cur;
            cur = n.next;
        }
        if prev != self.tail {
            return Err("free list tail is not the last node".into());
        }
        if count != self.num_free {
            return Err(format!("num_free {} but list has {count}", self.num_free));
        }
        for (i, n) in self.nodes.iter().enumerate() {
            if n.ref_count == 0 && !seen[i] {
                return Err(format!("block {i} has no reference and is not free"));
            }
        }
        Ok(())
    }

    fn node(&self, b: BlockId) -> &Node {
        &self.nodes[b.0 as usize]
    }

    fn node_mut(&mut self, b: BlockId) -> &mut Node {
        &mut self.nodes[b.0 as usize]
    }

    fn push_back(&mut self, b: BlockId) {
        let old_tail = self.tail;
        *self.node_mut(b) = Node {
            ref_count: 0,
            prev: old_tail,
            next: None,
        };
        match old_tail {
            Some(t) => self.node_mut(t).next = Some(b),
            None => self.head = Some(b),
        }
        self.tail = Some(b);
        self.num_free += 1;
    }

    fn push_front(&mut self, b: BlockId) {
        let old_head = self.head;
        *self.node_mut(b) = Node {
            ref_count: 0,
            prev: None,
            next: old_head,
        };
        match old_head {
            Some(h) => self.node_mut(h).prev = Some(b),
            None => self.tail = Some(b),
        }
        self.head = Some(b);
        self.num_free += 1;
    }

    fn unlink(&mut self, b: BlockId) {
        let Node { prev, next, .. } = *self.node(b);
        match prev {
            Some(p) => self.node_mut(p).next = next,
            None => self.head = next,
        }
        match next {
            Some(n) => self.node_mut(n).prev = prev,
            None => self.tail = prev,
        }
        let node = self.node_mut(b);
        node.prev = None;
        node.next = None;
        self.num_free -= 1;
    }
}

/// Iterator over the free list, head first.
pub struct FreeIter<'a> {
    pool: &'a BlockPool,
    cur: Option<BlockId>,
}

impl Iterator for FreeIter<'_> {
    type Item = BlockId;

    fn next(&mut self) -> Option<BlockId> {
        let b = self.cur?;
        self.cur = self.pool.node(b).next;
        Some(b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(pool: &BlockPool) -> Vec<u32> {
        pool.free_list().map(|b| b.0).collect()
    }

    #[test]
    fn allocate_release_and_middle_removal_keep_lru_order() {
        let mut pool = BlockPool::new(4);
        assert_eq!(ids(&pool), vec![0, 1, 2, 3]);
        let a = pool.pop_free();
        let b = pool.pop_free();
        assert_eq!((a, b), (Some(BlockId(0)), Some(BlockId(1))));
        assert_eq!(pool.num_free(), 2);
        assert!(pool.release(BlockId(1), true));
        assert_eq!(ids(&pool), vec![2, 3, 1]);
        // Remove from the middle: a prefix-cache hit on a freed block.
        pool.acquire(BlockId(3));
        assert_eq!(ids(&pool), vec![2, 1]);
        assert_eq!(pool.ref_count(BlockId(3)), 1);
        pool.acquire(BlockId(3));
        assert!(!pool.release(BlockId(3), true));
        assert!(pool.release(BlockId(3), false));
        assert_eq!(ids(&pool), vec![3, 2, 1]);
        pool.check_invariants().unwrap();
        assert!(pool.release(BlockId(0), true));
        assert_eq!(pool.num_free(), 4);
        pool.check_invariants().unwrap();
    }

    #[test]
    fn empty_pool_gives_nothing() {
        let mut pool = BlockPool::new(1);
        assert_eq!(pool.pop_free(), Some(BlockId(0)));
        assert_eq!(pool.pop_free(), None);
        assert_eq!(pool.free_list().next(), None);
        pool.check_invariants().unwrap();
    }
}
