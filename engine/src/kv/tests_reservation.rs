//! Tests of the contiguous-reservation baselines.

use super::{
    AdmitDecision, BlockCopy, BlockId, KvCacheManager, KvError, LengthHint,
    ReservationKvCacheManager, ReservationPolicy, SeqId,
};

fn hint(max: usize, oracle: Option<usize>) -> LengthHint {
    LengthHint {
        max_total_tokens: max,
        oracle_total_tokens: oracle,
    }
}

#[test]
fn policies_reserve_what_the_paper_says() {
    use ReservationPolicy::*;
    let h = hint(2048, Some(100));
    assert_eq!(OrcaMax.reserved_tokens(10, h), 2048);
    assert_eq!(OrcaPow2.reserved_tokens(10, h), 128);
    assert_eq!(OrcaOracle.reserved_tokens(10, h), 100);
    assert_eq!(OrcaPow2.reserved_tokens(10, hint(2048, Some(128))), 128);
    assert_eq!(OrcaPow2.reserved_tokens(10, hint(2048, None)), 2048);
    // Never less than the prompt.
    assert_eq!(OrcaOracle.reserved_tokens(300, h), 300);
}

#[test]
fn reservation_is_contiguous_and_counts_written_tokens() {
    let mut m = ReservationKvCacheManager::new(ReservationPolicy::OrcaOracle, 1, 1000).unwrap();
    let h = hint(2048, Some(30));
    assert_eq!(m.allocate(SeqId(1), &[0; 10], h), Ok(0));
    let out = m.append_slots(SeqId(1), &[7; 10]).unwrap();
    let start = m.block_table(SeqId(1)).unwrap()[0].0 as usize;
    assert_eq!(out.slots, (start..start + 10).collect::<Vec<_>>());
    assert_eq!(m.block_table(SeqId(1)).unwrap().len(), 30);
    let s = m.stats();
    assert_eq!(
        (s.allocated_slots, s.used_slots, s.free_blocks),
        (30, 10, 970)
    );
    m.check_invariants().unwrap();
}

#[test]
fn admission_now_later_never() {
    let mut m = ReservationKvCacheManager::new(ReservationPolicy::OrcaMax, 1, 1000).unwrap();
    let h = hint(600, None);
    assert_eq!(m.can_admit(&[0; 10], 1, h), AdmitDecision::Now);
    assert_eq!(m.can_admit(&[0; 10], 2, h), AdmitDecision::Never);
    m.allocate(SeqId(1), &[0; 10], h).unwrap();
    assert_eq!(m.can_admit(&[0; 10], 1, h), AdmitDecision::Later);
    assert_eq!(m.allocate(SeqId(2), &[0; 10], h), Err(KvError::OutOfBlocks));
    m.free(SeqId(1));
    assert_eq!(m.can_admit(&[0; 10], 1, h), AdmitDecision::Now);
    assert_eq!(m.num_free_blocks(), 1000);
    m.check_invariants().unwrap();
}

#[test]
fn fork_copies_arrive_with_the_childs_next_append() {
    let mut m = ReservationKvCacheManager::new(ReservationPolicy::OrcaOracle, 4, 8).unwrap();
    let h = hint(64, Some(8));
    m.allocate(SeqId(1), &[1; 5], h).unwrap();
    m.append_slots(SeqId(1), &[1; 5]).unwrap();
    let parent = m.block_table(SeqId(1)).unwrap().to_vec();
    m.fork(SeqId(1), SeqId(2)).unwrap();
    let child = m.block_table(SeqId(2)).unwrap().to_vec();
    assert_eq!(m.num_tokens(SeqId(2)), Ok(5));
    // The parent leaves, but its written blocks stay pinned for the copy.
    m.free(SeqId(1));
    assert_eq!(m.num_free_blocks(), 4);
    m.check_invariants().unwrap();
    let out = m.append_slots(SeqId(2), &[2]).unwrap();
    let want: Vec<BlockCopy> = parent
        .iter()
        .zip(&child)
        .map(|(&src, &dst)| BlockCopy { src, dst })
        .collect();
    assert_eq!(out.copies, want);
    assert_eq!(out.slots, vec![child[0].0 as usize * 4 + 5]);
    assert_eq!(m.num_free_blocks(), 6);
    m.check_invariants().unwrap();
}

#[test]
fn outgrowing_a_reservation_grows_in_place_or_fails_cleanly() {
    let mut m = ReservationKvCacheManager::new(ReservationPolicy::OrcaOracle, 4, 10).unwrap();
    let h = hint(64, Some(4));
    m.allocate(SeqId(1), &[0; 4], h).unwrap();
    m.allocate(SeqId(2), &[0; 4], h).unwrap();
    assert_eq!(m.block_table(SeqId(1)).unwrap(), &[BlockId(0)]);
    assert_eq!(m.blocks_needed_to_append(SeqId(1), 5), Ok(1));
    let before = m.stats();
    assert_eq!(m.append_slots(SeqId(1), &[0; 5]), Err(KvError::OutOfBlocks));
    assert_eq!(m.stats(), before);
    assert_eq!(m.num_tokens(SeqId(1)), Ok(0));
    let out = m.append_slots(SeqId(2), &[0; 5]).unwrap();
    assert_eq!(out.slots, (4..9).collect::<Vec<_>>());
    assert_eq!(m.block_table(SeqId(2)).unwrap(), &[BlockId(1), BlockId(2)]);
    assert_eq!(m.swap_out(&[SeqId(1)]), Err(KvError::SwapSpaceFull));
    assert_eq!(
        m.swap_out(&[SeqId(9)]),
        Err(KvError::UnknownSequence(SeqId(9)))
    );
    m.free(SeqId(1));
    m.free(SeqId(2));
    assert_eq!(m.num_free_blocks(), 10);
    assert_eq!(m.can_admit(&[0; 40], 1, hint(40, None)), AdmitDecision::Now);
    m.check_invariants().unwrap();
}
