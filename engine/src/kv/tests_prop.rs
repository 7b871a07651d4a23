//! Model-based property test of the paged manager.
//!
//! The test keeps a shadow of the physical memory (the token id written at
//! every offset of every accelerator and CPU block) and of each sequence's
//! expected tokens. It performs the copies the manager asks for and writes
//! each appended token at the slot the manager returns, then checks after
//! every operation that reading each sequence through its block table gives
//! back exactly its tokens, plus the bookkeeping invariants.
//!
//! Like real K/V, the value the shadow stores for a token depends on the
//! token *and everything before it* (a rolling hash of the prefix), so a
//! prefix-cache hit on a block with the right tokens but another prefix is
//! caught too.
//!
//! With prefix caching the manager also records its events, and the model
//! plays a subscriber: it applies each operation's events to its own set of
//! findable hashes and checks, after every operation, that this set is
//! exactly what the cache can find (so every stored hash is either still
//! cached or was removed), that each `BlockStored` chain hashes to its
//! hashes from its parent and tokens, and that no hash is stored twice or
//! removed unseen.

use std::collections::{HashMap, HashSet};

use proptest::prelude::*;

use super::{
    hash_block, AdmitDecision, BlockCopy, BlockHash, BlockId, KvCacheManager, KvError, KvEvent,
    KvMedium, LengthHint, PagedKvCacheManager, PagedKvConfig, SeqId,
};

const BS: usize = 4;
const DEV_BLOCKS: usize = 24;
const CPU_BLOCKS: usize = 12;

#[derive(Debug, Clone)]
enum Op {
    Admit {
        prefix: usize,
        keep: usize,
        tail: Vec<u32>,
    },
    Append {
        group: usize,
        member: usize,
        tokens: Vec<u32>,
    },
    Fork {
        group: usize,
        member: usize,
    },
    Free {
        group: usize,
        member: usize,
    },
    SwapOut {
        group: usize,
    },
    SwapIn {
        group: usize,
    },
}

fn op() -> impl Strategy<Value = Op> {
    let toks = |max| prop::collection::vec(0u32..6, 1..max);
    prop_oneof![
        3 => (0usize..3, 0usize..=20, prop::collection::vec(0u32..6, 0..6))
            .prop_map(|(prefix, keep, tail)| Op::Admit { prefix, keep, tail }),
        5 => (any::<usize>(), any::<usize>(), toks(7))
            .prop_map(|(group, member, tokens)| Op::Append { group, member, tokens }),
        2 => (any::<usize>(), any::<usize>()).prop_map(|(group, member)| Op::Fork { group, member }),
        2 => (any::<usize>(), any::<usize>()).prop_map(|(group, member)| Op::Free { group, member }),
        1 => any::<usize>().prop_map(|group| Op::SwapOut { group }),
        1 => any::<usize>().prop_map(|group| Op::SwapIn { group }),
    ]
}

struct Model {
    mgr: PagedKvCacheManager,
    dev_mem: Vec<[Option<u64>; BS]>,
    cpu_mem: Vec<[Option<u64>; BS]>,
    expected: HashMap<SeqId, Vec<u32>>,
    groups: Vec<Vec<SeqId>>,
    next_id: u64,
    prefixes: [Vec<u32>; 3],
    seen: Coverage,
    /// The findable hashes, as a subscriber to the events knows them.
    view: HashSet<BlockHash>,
}

/// How often the interesting paths ran, to show the test reaches them.
#[derive(Debug, Default, Clone, Copy)]
struct Coverage {
    prefix_hits: usize,
    cow_copies: usize,
    append_refused: usize,
    swap_outs: usize,
    swap_ins: usize,
    swap_refused: usize,
    stored_events: usize,
    removed_events: usize,
}

const HINT: LengthHint = LengthHint {
    max_total_tokens: 4096,
    oracle_total_tokens: None,
};

impl Model {
    fn new(caching: bool) -> Self {
        let mut cfg = PagedKvConfig::new(BS, DEV_BLOCKS, CPU_BLOCKS);
        cfg.enable_prefix_caching = caching;
        cfg.watermark = 0.05;
        let mut mgr = PagedKvCacheManager::new(cfg).unwrap();
        mgr.record_events(true);
        Self {
            mgr,
            view: HashSet::new(),
            dev_mem: vec![[None; BS]; DEV_BLOCKS],
            cpu_mem: vec![[None; BS]; CPU_BLOCKS],
            expected: HashMap::new(),
            groups: Vec::new(),
            next_id: 0,
            seen: Coverage::default(),
            prefixes: [
                (0..20).map(|i| 100 + i).collect(),
                (0..20).map(|i| 200 + i % 3).collect(),
                (0..20)
                    .map(|i| if i < 8 { 100 + i } else { 300 + i })
                    .collect(),
            ],
        }
    }

    /// The "K/V" of the token at `pos`: FNV-1a over `tokens[..=pos]`.
    fn kv_value(tokens: &[u32], pos: usize) -> u64 {
        tokens[..=pos].iter().fold(0xcbf2_9ce4_8422_2325, |h, &t| {
            (h ^ u64::from(t)).wrapping_mul(0x0100_0000_01b3)
        })
    }

    fn new_id(&mut self) -> SeqId {
        self.next_id += 1;
        SeqId(self.next_id)
    }

    fn pick(&self, group: usize, member: usize) -> Option<(usize, SeqId)> {
        let g = group.checked_rem(self.groups.len())?;
        let members = &self.groups[g];
        Some((g, members[member % members.len()]))
    }

    fn copy(mem_src: &[[Option<u64>; BS]], mem_dst: &mut [[Option<u64>; BS]], c: BlockCopy) {
        mem_dst[c.dst.0 as usize] = mem_src[c.src.0 as usize];
    }

    /// Appends through the manager and writes into the shadow memory.
    fn append(&mut self, seq: SeqId, tokens: &[u32]) -> Result<(), KvError> {
        let before = self.mgr.clone();
        let need = self.mgr.blocks_needed_to_append(seq, tokens.len())?;
        let out = match self.mgr.append_slots(seq, tokens) {
            Ok(out) => out,
            Err(e) => {
                assert!(
                    need > self.mgr.num_free_blocks(),
                    "refused though {need} fit"
                );
                self.assert_unchanged(&before);
                self.seen.append_refused += 1;
                return Err(e);
            }
        };
        assert_eq!(before.num_free_blocks() - self.mgr.num_free_blocks(), need);
        self.seen.cow_copies += out.copies.len();
        for c in &out.copies {
            let mem = self.dev_mem.clone();
            Self::copy(&mem, &mut self.dev_mem, *c);
        }
        assert_eq!(out.slots.len(), tokens.len());
        let all = self.expected.entry(seq).or_default();
        let start = all.len();
        all.extend_from_slice(tokens);
        let all = all.clone();
        for (i, &slot) in out.slots.iter().enumerate() {
            let b = BlockId((slot / BS) as u32);
            assert_eq!(self.mgr.device_ref_count(b), 1, "write into a shared block");
            self.dev_mem[slot / BS][slot % BS] = Some(Self::kv_value(&all, start + i));
        }
        Ok(())
    }

    fn assert_unchanged(&self, before: &PagedKvCacheManager) {
        assert_eq!(before.stats(), self.mgr.stats());
        for &id in self.expected.keys() {
            assert_eq!(before.block_table(id), self.mgr.block_table(id));
            assert_eq!(
                before.swapped_block_table(id),
                self.mgr.swapped_block_table(id)
            );
            assert_eq!(before.num_tokens(id), self.mgr.num_tokens(id));
        }
    }

    fn admit(&mut self, prefix: usize, keep: usize, tail: &[u32]) {
        let mut prompt: Vec<u32> = self.prefixes[prefix][..keep].to_vec();
        prompt.extend_from_slice(tail);
        if prompt.is_empty() || self.mgr.can_admit(&prompt, 1, HINT) != AdmitDecision::Now {
            return;
        }
        let id = self.new_id();
        let computed = self.mgr.allocate(id, &prompt, HINT).unwrap();
        assert!(computed < prompt.len() && computed.is_multiple_of(BS));
        self.seen.prefix_hits += usize::from(computed > 0);
        self.expected.insert(id, prompt[..computed].to_vec());
        self.groups.push(vec![id]);
        // A prefix hit must hand back blocks that really hold the prompt.
        self.check_contents();
        if self.append(id, &prompt[computed..]).is_err() {
            self.free_seq(id);
        }
    }

    fn free_seq(&mut self, id: SeqId) {
        self.mgr.free(id);
        self.expected.remove(&id);
        for g in &mut self.groups {
            g.retain(|&s| s != id);
        }
        self.groups.retain(|g| !g.is_empty());
    }

    fn swap(&mut self, group: usize, out: bool) {
        let Some(g) = group.checked_rem(self.groups.len()) else {
            return;
        };
        let ids = self.groups[g].clone();
        let before = self.mgr.clone();
        let res = if out {
            self.mgr.swap_out(&ids)
        } else {
            let can = self.mgr.can_swap_in(&ids);
            let res = self.mgr.swap_in(&ids);
            assert_eq!(can, res.is_ok());
            res
        };
        match res {
            Ok(copies) => {
                if out {
                    self.seen.swap_outs += 1;
                } else {
                    self.seen.swap_ins += 1;
                }
                for c in copies {
                    if out {
                        Self::copy(&self.dev_mem, &mut self.cpu_mem, c);
                    } else {
                        Self::copy(&self.cpu_mem, &mut self.dev_mem, c);
                    }
                }
            }
            Err(_) => {
                self.assert_unchanged(&before);
                self.seen.swap_refused += 1;
            }
        }
    }

    fn apply(&mut self, op: &Op) {
        match op {
            Op::Admit { prefix, keep, tail } => self.admit(*prefix, *keep, tail),
            Op::Append {
                group,
                member,
                tokens,
            } => {
                if let Some((_, id)) = self.pick(*group, *member) {
                    // Errors (swapped, out of blocks) must leave no trace.
                    let _ = self.append(id, tokens);
                }
            }
            Op::Fork { group, member } => {
                if let Some((g, id)) = self.pick(*group, *member) {
                    let child = self.new_id();
                    if self.mgr.fork(id, child).is_ok() {
                        let toks = self.expected[&id].clone();
                        self.expected.insert(child, toks);
                        self.groups[g].push(child);
                    }
                }
            }
            Op::Free { group, member } => {
                if let Some((_, id)) = self.pick(*group, *member) {
                    self.free_seq(id);
                }
            }
            Op::SwapOut { group } => self.swap(*group, true),
            Op::SwapIn { group } => self.swap(*group, false),
        }
    }

    /// Reading each sequence through its table gives exactly its tokens.
    fn check_contents(&self) {
        for (&id, toks) in &self.expected {
            let (table, mem) = match self.mgr.block_table(id) {
                Ok(t) => (t, &self.dev_mem),
                Err(_) => (self.mgr.swapped_block_table(id).unwrap(), &self.cpu_mem),
            };
            assert_eq!(self.mgr.num_tokens(id), Ok(toks.len()));
            assert_eq!(
                table.len(),
                toks.len().div_ceil(BS),
                "partial blocks of {id:?}"
            );
            for pos in 0..toks.len() {
                let b = table[pos / BS].0 as usize;
                let want = Some(Self::kv_value(toks, pos));
                assert_eq!(mem[b][pos % BS], want, "{id:?} token {pos}");
            }
        }
    }

    /// Reference counts recomputed from the public block tables.
    fn check_refs(&self) {
        let mut dev = [0u32; DEV_BLOCKS];
        let mut cpu = [0u32; CPU_BLOCKS];
        for &id in self.expected.keys() {
            match self.mgr.block_table(id) {
                Ok(t) => t.iter().for_each(|b| dev[b.0 as usize] += 1),
                Err(_) => self
                    .mgr
                    .swapped_block_table(id)
                    .unwrap()
                    .iter()
                    .for_each(|b| cpu[b.0 as usize] += 1),
            }
        }
        for (i, &n) in dev.iter().enumerate() {
            assert_eq!(
                self.mgr.device_ref_count(BlockId(i as u32)),
                n,
                "device block {i}"
            );
        }
        for (i, &n) in cpu.iter().enumerate() {
            assert_eq!(
                self.mgr.cpu_ref_count(BlockId(i as u32)),
                n,
                "cpu block {i}"
            );
        }
        let free = self.mgr.free_device_blocks();
        assert!(
            free.iter().all(|b| dev[b.0 as usize] == 0),
            "free and referenced"
        );
        assert_eq!(free.len(), dev.iter().filter(|&&n| n == 0).count());
        assert_eq!(free.len(), self.mgr.num_free_blocks());
        let stats = self.mgr.stats();
        assert_eq!(
            stats.cpu_free_blocks,
            cpu.iter().filter(|&&n| n == 0).count()
        );
        assert!(stats.used_slots <= stats.allocated_slots);
    }

    fn check(&mut self) {
        if let Err(e) = self.mgr.check_invariants() {
            panic!("invariant: {e}");
        }
        self.check_refs();
        self.check_contents();
        self.check_events();
    }

    /// Applies the events recorded since the last check to the subscriber's
    /// view, then compares the view with what the cache can find.
    fn check_events(&mut self) {
        for ev in self.mgr.take_events() {
            match ev {
                KvEvent::BlockStored {
                    block_hashes,
                    parent_block_hash,
                    token_ids,
                    block_size,
                    lora_id,
                    medium,
                } => {
                    self.seen.stored_events += 1;
                    assert_eq!((block_size, lora_id, medium), (BS, None, KvMedium::Gpu));
                    assert!(!block_hashes.is_empty());
                    assert_eq!(token_ids.len(), block_hashes.len() * BS);
                    let mut parent = parent_block_hash;
                    for (hash, toks) in block_hashes.iter().zip(token_ids.chunks(BS)) {
                        assert_eq!(*hash, hash_block(parent, None, toks), "chain broken");
                        assert!(self.view.insert(*hash), "{hash:?} stored twice");
                        parent = Some(*hash);
                    }
                }
                KvEvent::BlockRemoved {
                    block_hashes,
                    medium,
                } => {
                    self.seen.removed_events += 1;
                    assert_eq!(medium, KvMedium::Gpu);
                    for hash in block_hashes {
                        assert!(self.view.remove(&hash), "{hash:?} removed unseen");
                    }
                }
                KvEvent::AllBlocksCleared => self.view.clear(),
            }
        }
        let cached: HashSet<BlockHash> = self.mgr.cached_hashes().into_iter().collect();
        assert_eq!(self.view, cached, "the events disagree with the cache");
    }
}

fn run(ops: &[Op], caching: bool) -> (Coverage, u64) {
    let mut m = Model::new(caching);
    for op in ops {
        m.apply(op);
        m.check();
    }
    let ids: Vec<SeqId> = m.expected.keys().copied().collect();
    for id in ids {
        m.free_seq(id);
        m.check();
    }
    assert_eq!(m.mgr.num_free_blocks(), DEV_BLOCKS);
    assert_eq!(m.mgr.stats().cpu_free_blocks, CPU_BLOCKS);
    assert_eq!(m.mgr.stats().used_slots, 0);
    // Everything is free: the reset is allowed and the subscriber's view
    // follows it to empty.
    assert!(m.mgr.reset_prefix_cache());
    m.check();
    assert!(m.view.is_empty() && m.mgr.cached_hashes().is_empty());
    (m.seen, m.mgr.stats().prefix_cache_evictions)
}

/// The generator reaches every path the properties are about.
#[test]
fn random_operations_reach_every_path() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let mut runner = TestRunner::deterministic();
    let strategy = prop::collection::vec(op(), 200..250);
    let mut total = Coverage::default();
    let mut evictions = 0;
    for _ in 0..20 {
        let ops = strategy.new_tree(&mut runner).unwrap().current();
        let (c, e) = run(&ops, true);
        total.prefix_hits += c.prefix_hits;
        total.cow_copies += c.cow_copies;
        total.append_refused += c.append_refused;
        total.swap_outs += c.swap_outs;
        total.swap_ins += c.swap_ins;
        total.swap_refused += c.swap_refused;
        total.stored_events += c.stored_events;
        total.removed_events += c.removed_events;
        evictions += e;
    }
    eprintln!("coverage over 20 runs: {total:?}, evictions {evictions}");
    let Coverage {
        prefix_hits,
        cow_copies,
        append_refused,
        swap_outs,
        swap_ins,
        swap_refused,
        stored_events,
        removed_events,
    } = total;
    for (name, n) in [
        ("prefix hits", prefix_hits),
        ("copy-on-write copies", cow_copies),
        ("refused appends", append_refused),
        ("swap outs", swap_outs),
        ("swap ins", swap_ins),
        ("refused swaps", swap_refused),
        ("evictions", evictions as usize),
        ("BlockStored events", stored_events),
        ("BlockRemoved events", removed_events),
    ] {
        assert!(n > 0, "{name} never happened: {total:?}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn random_operations_keep_every_invariant(ops in prop::collection::vec(op(), 1..250)) {
        run(&ops, true);
    }

    #[test]
    fn random_operations_without_prefix_caching(ops in prop::collection::vec(op(), 1..150)) {
        run(&ops, false);
    }
}
