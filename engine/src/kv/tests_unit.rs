//! Unit tests of the paged manager's documented behaviours.

use super::{
    hash_block, AdmitDecision, BlockCopy, KvCacheManager, KvError, KvEvent, KvMedium, LengthHint,
    PagedKvCacheManager, PagedKvConfig, SeqId,
};

const HINT: LengthHint = LengthHint {
    max_total_tokens: 1 << 20,
    oracle_total_tokens: None,
};

fn manager(bs: usize, dev: usize, cpu: usize, caching: bool) -> PagedKvCacheManager {
    let mut cfg = PagedKvConfig::new(bs, dev, cpu);
    cfg.watermark = 0.0;
    cfg.enable_prefix_caching = caching;
    PagedKvCacheManager::new(cfg).unwrap()
}

/// Allocates `seq` with `prompt` and appends what the cache did not hold.
fn admit(m: &mut PagedKvCacheManager, seq: u64, prompt: &[u32]) -> usize {
    let computed = m.allocate(SeqId(seq), prompt, HINT).unwrap();
    m.append_slots(SeqId(seq), &prompt[computed..]).unwrap();
    computed
}

#[test]
fn slots_follow_the_block_table() {
    let mut m = manager(4, 8, 0, false);
    m.allocate(SeqId(1), &[1, 2, 3, 4, 5, 6], HINT).unwrap();
    let out = m.append_slots(SeqId(1), &[1, 2, 3, 4, 5, 6]).unwrap();
    let t = m.block_table(SeqId(1)).unwrap().to_vec();
    assert_eq!(t.len(), 2);
    let (a, b) = (t[0].0 as usize, t[1].0 as usize);
    assert_eq!(
        out.slots,
        vec![a * 4, a * 4 + 1, a * 4 + 2, a * 4 + 3, b * 4, b * 4 + 1]
    );
    assert!(out.copies.is_empty());
    assert_eq!(m.num_tokens(SeqId(1)), Ok(6));
    let s = m.stats();
    assert_eq!((s.allocated_slots, s.used_slots), (8, 6));
}

#[test]
fn copy_on_write_after_fork_and_append() {
    let mut m = manager(4, 8, 0, false);
    admit(&mut m, 1, &[1, 2, 3, 4, 5, 6]);
    m.fork(SeqId(1), SeqId(2)).unwrap();
    let t1 = m.block_table(SeqId(1)).unwrap().to_vec();
    assert_eq!(m.block_table(SeqId(2)).unwrap(), &t1[..]);
    assert!(t1.iter().all(|&b| m.device_ref_count(b) == 2));
    // Both blocks are shared: no new block until someone writes.
    assert_eq!(m.num_free_blocks(), 6);
    assert_eq!(m.blocks_needed_to_append(SeqId(2), 1), Ok(1));

    let out = m.append_slots(SeqId(2), &[7]).unwrap();
    let t2 = m.block_table(SeqId(2)).unwrap().to_vec();
    assert_eq!(t2[0], t1[0], "full block stays shared");
    assert_ne!(t2[1], t1[1], "partial block is copied");
    assert_eq!(
        out.copies,
        vec![BlockCopy {
            src: t1[1],
            dst: t2[1]
        }]
    );
    assert_eq!(out.slots, vec![t2[1].0 as usize * 4 + 2]);
    assert_eq!(m.device_ref_count(t1[1]), 1);
    assert_eq!(m.device_ref_count(t1[0]), 2);

    // The parent now owns its last block alone: it writes in place.
    assert_eq!(m.blocks_needed_to_append(SeqId(1), 1), Ok(0));
    let out = m.append_slots(SeqId(1), &[8]).unwrap();
    assert!(out.copies.is_empty());
    assert_eq!(out.slots, vec![t1[1].0 as usize * 4 + 2]);
    assert_eq!(m.stats().used_slots, 4 + 3 + 3);
    m.check_invariants().unwrap();
}

#[test]
fn prefix_hit_after_the_first_request_finished() {
    let mut m = manager(4, 8, 0, true);
    let prompt: Vec<u32> = (10..20).collect();
    assert_eq!(admit(&mut m, 1, &prompt), 0);
    let first = m.block_table(SeqId(1)).unwrap().to_vec();
    m.free(SeqId(1));
    assert_eq!(m.num_free_blocks(), 8);

    // Two full blocks (8 tokens) are reused; the rest is computed.
    assert_eq!(admit(&mut m, 2, &prompt), 8);
    assert_eq!(m.block_table(SeqId(2)).unwrap()[..2], first[..2]);
    let s = m.stats();
    assert_eq!((s.prefix_cache_queries, s.prefix_cache_hits), (20, 8));

    // Never the whole prompt: an 8-token prompt reuses one block only.
    assert_eq!(m.allocate(SeqId(3), &prompt[..8], HINT), Ok(4));
    // A different extra key does not see those blocks.
    assert_eq!(m.allocate_with_extra_key(SeqId(4), &prompt, Some(7)), Ok(0));
    m.check_invariants().unwrap();
}

#[test]
fn prefix_caching_can_be_switched_off() {
    let mut m = manager(4, 8, 0, false);
    let prompt: Vec<u32> = (10..20).collect();
    admit(&mut m, 1, &prompt);
    m.free(SeqId(1));
    assert_eq!(admit(&mut m, 2, &prompt), 0);
    assert_eq!(m.stats().prefix_cache_queries, 0);
}

#[test]
fn freed_cached_blocks_are_evicted_in_lru_order() {
    let mut m = manager(2, 4, 0, true);
    admit(&mut m, 1, &[1, 2]); // one full block
    admit(&mut m, 2, &[3, 4]);
    let a = m.block_table(SeqId(1)).unwrap()[0];
    let b = m.block_table(SeqId(2)).unwrap()[0];
    m.free(SeqId(1));
    m.free(SeqId(2));
    // Never-used blocks first, then a (freed first), then b.
    let free = m.free_device_blocks();
    assert_eq!(free[2..], [a, b]);
    // Three fresh blocks: the two never-used ones and then a.
    admit(&mut m, 3, &[9, 9, 9, 9, 9]);
    assert_eq!(m.stats().prefix_cache_evictions, 1);
    assert_eq!(m.block_table(SeqId(3)).unwrap(), &[free[0], free[1], a]);
    assert!(!m.is_cached(a));
    assert!(m.is_cached(b));
    m.free(SeqId(3));
    assert_eq!(
        m.allocate(SeqId(4), &[1, 2, 0], HINT),
        Ok(0),
        "a was evicted"
    );
    assert_eq!(m.allocate(SeqId(5), &[3, 4, 0], HINT), Ok(2), "b survived");
    assert_eq!(m.block_table(SeqId(5)).unwrap(), &[b]);
    m.check_invariants().unwrap();
}

#[test]
fn a_hit_on_a_freed_block_leaves_the_free_list() {
    let mut m = manager(2, 4, 0, true);
    admit(&mut m, 1, &[1, 2, 3]);
    let a = m.block_table(SeqId(1)).unwrap()[0];
    m.free(SeqId(1));
    assert!(m.free_device_blocks().contains(&a));
    assert_eq!(m.allocate(SeqId(2), &[1, 2, 5], HINT), Ok(2));
    assert!(!m.free_device_blocks().contains(&a));
    assert_eq!(m.device_ref_count(a), 1);
    assert_eq!(m.num_free_blocks(), 3);
}

#[test]
fn admission_says_now_later_or_never() {
    let mut cfg = PagedKvConfig::new(4, 10, 0);
    cfg.watermark = 0.1; // one block kept free
    let mut m = PagedKvCacheManager::new(cfg).unwrap();
    assert_eq!(m.watermark_blocks(), 1);
    // 40 tokens: 10 blocks + 1 decode block > 9 usable blocks.
    assert_eq!(m.can_admit(&[0; 40], 1, HINT), AdmitDecision::Never);
    // 30 tokens, 4 samples: 7 full blocks + 4 own last blocks > 9.
    assert_eq!(m.can_admit(&[0; 30], 4, HINT), AdmitDecision::Never);
    assert_eq!(m.can_admit(&[0; 32], 1, HINT), AdmitDecision::Now);
    admit(&mut m, 1, &[5; 9]); // 3 blocks taken
    assert_eq!(m.can_admit(&[0; 32], 1, HINT), AdmitDecision::Later);
    assert_eq!(m.can_admit(&[0; 20], 1, HINT), AdmitDecision::Now);
    m.free(SeqId(1));
    assert_eq!(m.can_admit(&[0; 32], 1, HINT), AdmitDecision::Now);
}

#[test]
fn failed_append_changes_nothing() {
    let mut m = manager(4, 3, 0, true);
    admit(&mut m, 1, &[1, 2, 3, 4, 5]);
    m.fork(SeqId(1), SeqId(2)).unwrap();
    let before = m.clone();
    // CoW (1 block) + 2 new blocks > 1 free block.
    assert_eq!(m.blocks_needed_to_append(SeqId(2), 8), Ok(3));
    assert_eq!(m.append_slots(SeqId(2), &[0; 8]), Err(KvError::OutOfBlocks));
    assert_eq!(m.stats(), before.stats());
    assert_eq!(m.block_table(SeqId(2)), before.block_table(SeqId(2)));
    assert_eq!(m.num_tokens(SeqId(2)), Ok(5));
    m.check_invariants().unwrap();
}

#[test]
fn swap_moves_shared_blocks_once_and_back() {
    let mut m = manager(4, 8, 8, true);
    admit(&mut m, 1, &[1, 2, 3, 4, 5, 6]);
    m.fork(SeqId(1), SeqId(2)).unwrap();
    m.append_slots(SeqId(2), &[7]).unwrap();
    let tokens1 = m.tokens(SeqId(1)).unwrap().to_vec();
    let tokens2 = m.tokens(SeqId(2)).unwrap().to_vec();
    let copies = m.swap_out(&[SeqId(1), SeqId(2)]).unwrap();
    assert_eq!(copies.len(), 3, "shared block moved once");
    let c1 = m.swapped_block_table(SeqId(1)).unwrap().to_vec();
    let c2 = m.swapped_block_table(SeqId(2)).unwrap().to_vec();
    assert_eq!(c1[0], c2[0]);
    assert_eq!(m.cpu_ref_count(c1[0]), 2);
    assert_eq!(m.block_table(SeqId(1)), Err(KvError::NotResident(SeqId(1))));
    assert_eq!(
        m.append_slots(SeqId(1), &[1]),
        Err(KvError::NotResident(SeqId(1)))
    );
    assert_eq!(
        m.fork(SeqId(1), SeqId(3)),
        Err(KvError::NotResident(SeqId(1)))
    );
    assert_eq!(m.stats().used_slots, 0);
    assert_eq!(m.stats().cpu_free_blocks, 5);

    let back = m.swap_in(&[SeqId(2), SeqId(1)]).unwrap();
    assert_eq!(back.len(), 3);
    let t1 = m.block_table(SeqId(1)).unwrap().to_vec();
    let t2 = m.block_table(SeqId(2)).unwrap().to_vec();
    assert_eq!(t1[0], t2[0]);
    assert_ne!(t1[1], t2[1]);
    assert_eq!(m.device_ref_count(t1[0]), 2);
    assert_eq!(m.tokens(SeqId(1)).unwrap(), &tokens1[..]);
    assert_eq!(m.tokens(SeqId(2)).unwrap(), &tokens2[..]);
    assert_eq!(m.swap_in(&[SeqId(1)]), Err(KvError::NotSwapped(SeqId(1))));
    assert_eq!(m.stats().cpu_free_blocks, 8);
    m.check_invariants().unwrap();
}

#[test]
fn failed_swaps_change_nothing() {
    let mut m = manager(4, 4, 1, false);
    admit(&mut m, 1, &[1, 2, 3, 4, 5]);
    let before = m.clone();
    assert_eq!(m.swap_out(&[SeqId(1)]), Err(KvError::SwapSpaceFull));
    assert_eq!(m.stats(), before.stats());
    assert_eq!(m.block_table(SeqId(1)), before.block_table(SeqId(1)));

    let mut m = manager(4, 3, 4, false);
    admit(&mut m, 1, &[1, 2, 3, 4, 5]);
    m.swap_out(&[SeqId(1)]).unwrap();
    admit(&mut m, 2, &[1, 2, 3, 4, 5, 6, 7, 8, 9]); // takes all 3 blocks
    let before = m.clone();
    assert!(!m.can_swap_in(&[SeqId(1)]));
    assert_eq!(m.swap_in(&[SeqId(1)]), Err(KvError::OutOfBlocks));
    assert_eq!(m.stats(), before.stats());
    assert_eq!(
        m.swapped_block_table(SeqId(1)),
        before.swapped_block_table(SeqId(1))
    );
    // A group with one unknown member moves nothing either.
    assert_eq!(
        m.swap_out(&[SeqId(2), SeqId(9)]),
        Err(KvError::UnknownSequence(SeqId(9)))
    );
    assert_eq!(m.stats(), before.stats());
    m.check_invariants().unwrap();
}

#[test]
fn errors_are_typed() {
    let mut m = manager(4, 4, 0, true);
    assert_eq!(
        m.num_tokens(SeqId(1)),
        Err(KvError::UnknownSequence(SeqId(1)))
    );
    m.allocate(SeqId(1), &[1], HINT).unwrap();
    assert_eq!(
        m.allocate(SeqId(1), &[1], HINT),
        Err(KvError::DuplicateSequence(SeqId(1)))
    );
    assert_eq!(
        m.fork(SeqId(1), SeqId(1)),
        Err(KvError::DuplicateSequence(SeqId(1)))
    );
    // No blocks yet: swapping moves nothing and needs no CPU room.
    assert_eq!(m.swap_out(&[SeqId(1)]), Ok(vec![]));
    assert_eq!(m.block_table(SeqId(1)), Err(KvError::NotResident(SeqId(1))));
    m.free(SeqId(42)); // unknown: no-op
    for bad in [
        PagedKvConfig::new(0, 4, 0),
        PagedKvConfig::new(4, 0, 0),
        PagedKvConfig {
            watermark: 1.5,
            ..PagedKvConfig::new(4, 4, 0)
        },
    ] {
        assert!(matches!(
            PagedKvCacheManager::new(bad),
            Err(KvError::InvalidConfig(_))
        ));
    }
}

/// The events of a concrete history: one chain stored as one event, a
/// second chain, its eviction when the pool runs out, and a reset that is
/// refused while blocks are held.
#[test]
fn events_follow_the_cache() {
    let mut m = manager(2, 4, 0, true);
    assert!(m.take_events().is_empty(), "off by default");
    admit(&mut m, 1, &[1, 2, 3, 4, 5]);
    assert!(m.take_events().is_empty(), "nothing recorded while off");
    m.free(SeqId(1));

    let mut m = manager(2, 4, 0, true);
    m.record_events(true);
    admit(&mut m, 1, &[1, 2, 3, 4, 5]);
    let h1 = hash_block(None, None, &[1, 2]);
    let h2 = hash_block(Some(h1), None, &[3, 4]);
    assert_eq!(
        m.take_events(),
        vec![KvEvent::BlockStored {
            block_hashes: vec![h1, h2],
            parent_block_hash: None,
            token_ids: vec![1, 2, 3, 4],
            block_size: 2,
            lora_id: None,
            medium: KvMedium::Gpu,
        }]
    );
    // A decode token that completes block 3: its own event, parent h2.
    m.append_slots(SeqId(1), &[6]).unwrap();
    let h3 = hash_block(Some(h2), None, &[5, 6]);
    assert_eq!(
        m.take_events(),
        vec![KvEvent::BlockStored {
            block_hashes: vec![h3],
            parent_block_hash: Some(h2),
            token_ids: vec![5, 6],
            block_size: 2,
            lora_id: None,
            medium: KvMedium::Gpu,
        }]
    );
    assert!(!m.reset_prefix_cache(), "refused while blocks are held");
    assert!(m.take_events().is_empty());
    m.free(SeqId(1));
    // Four free blocks, three cached: a new 4-block sequence reuses all of
    // them. Eviction order: the free list's order (last blocks first).
    admit(&mut m, 2, &[9, 9, 8, 8, 7, 7, 6]);
    let g1 = hash_block(None, None, &[9, 9]);
    let g2 = hash_block(Some(g1), None, &[8, 8]);
    let g3 = hash_block(Some(g2), None, &[7, 7]);
    let evs = m.take_events();
    let removed: Vec<_> = evs
        .iter()
        .filter_map(|e| match e {
            KvEvent::BlockRemoved { block_hashes, .. } => Some(block_hashes.clone()),
            _ => None,
        })
        .flatten()
        .collect();
    assert_eq!(removed, vec![h3, h2, h1]);
    assert_eq!(
        evs.last(),
        Some(&KvEvent::BlockStored {
            block_hashes: vec![g1, g2, g3],
            parent_block_hash: None,
            token_ids: vec![9, 9, 8, 8, 7, 7],
            block_size: 2,
            lora_id: None,
            medium: KvMedium::Gpu,
        })
    );
    m.free(SeqId(2));
    assert!(m.reset_prefix_cache());
    assert_eq!(m.take_events(), vec![KvEvent::AllBlocksCleared]);
    assert!(m.cached_hashes().is_empty());
    // Nothing findable: the same prompt is computed again.
    assert_eq!(admit(&mut m, 3, &[9, 9, 8, 8, 7]), 0);
}

#[test]
fn provisional_tokens_are_never_hashed_and_roll_back() {
    let mut m = manager(4, 8, 0, true);
    admit(&mut m, 1, &[1, 2, 3, 4, 5, 6]);
    let cached_before = m.cached_hashes().len();
    assert_eq!(cached_before, 1);
    // Six proposals fill block 1 and reach into block 2 and 3.
    let out = m
        .append_provisional(SeqId(1), &[7, 8, 9, 10, 11, 12])
        .unwrap();
    assert_eq!(out.slots.len(), 6);
    assert_eq!(m.block_table(SeqId(1)).unwrap().len(), 3);
    assert_eq!(
        m.cached_hashes().len(),
        1,
        "a block of proposals is not findable"
    );
    m.check_invariants().unwrap();
    let free_before = m.num_free_blocks();
    // Keep two proposals: 8 tokens, two full blocks, the third block freed.
    m.settle_provisional(SeqId(1), 2).unwrap();
    m.check_invariants().unwrap();
    assert_eq!(m.num_tokens(SeqId(1)), Ok(8));
    assert_eq!(m.block_table(SeqId(1)).unwrap().len(), 2);
    assert_eq!(m.num_free_blocks(), free_before + 1);
    let want = hash_block(
        Some(hash_block(None, None, &[1, 2, 3, 4])),
        None,
        &[5, 6, 7, 8],
    );
    assert!(
        m.cached_hashes().contains(&want),
        "the accepted block is findable"
    );
    assert_eq!(m.cached_hashes().len(), 2);
    // Rejecting everything leaves the sequence as it was.
    m.append_provisional(SeqId(1), &[9, 9, 9]).unwrap();
    m.settle_provisional(SeqId(1), 0).unwrap();
    m.check_invariants().unwrap();
    assert_eq!(m.num_tokens(SeqId(1)), Ok(8));
    assert_eq!(m.stats().used_slots, 8);
    m.free(SeqId(1));
    assert_eq!(m.num_free_blocks(), 8);
}

#[test]
fn truncate_refuses_to_cut_a_hashed_block() {
    let mut m = manager(4, 8, 0, true);
    admit(&mut m, 1, &[1, 2, 3, 4, 5, 6]);
    assert_eq!(m.truncate(SeqId(1), 3), Err(KvError::SealedToken(SeqId(1))));
    m.truncate(SeqId(1), 4).unwrap();
    m.check_invariants().unwrap();
    assert_eq!(m.block_table(SeqId(1)).unwrap().len(), 1);
    let mut plain = manager(4, 8, 0, false);
    admit(&mut plain, 1, &[1, 2, 3, 4, 5, 6]);
    plain.truncate(SeqId(1), 1).unwrap();
    plain.check_invariants().unwrap();
    assert_eq!(plain.num_free_blocks(), 7);
}
