//! Time per KV cache operation at pool sizes 10^3, 10^4 and 10^5 blocks.
//! Every operation is O(blocks touched), so the figures should not grow with
//! the pool size. Each pool is first half filled and then fragmented (every
//! other sequence freed), so the free list mixes never-used and cached blocks
//! and allocations go through prefix-cache eviction. With caching on, LRU
//! reuse walks the whole free list, so a larger pool means colder memory
//! (cache misses), not more work; the `_nocache` variant reuses hot blocks.

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use engine::kv::{KvCacheManager, LengthHint, PagedKvCacheManager, PagedKvConfig, SeqId};

const BS: usize = 16;
const SIZES: [usize; 3] = [1_000, 10_000, 100_000];
const HINT: LengthHint = LengthHint {
    max_total_tokens: 4096,
    oracle_total_tokens: None,
};

fn prompt(seed: u32, len: usize) -> Vec<u32> {
    (0..len as u32)
        .map(|i| seed.wrapping_mul(2_654_435_761).wrapping_add(i) % 49_152)
        .collect()
}

/// A pool of `n` blocks, half used by 4-block sequences of which every
/// other one has been freed again (its full blocks stay cached).
fn busy_manager(n: usize, caching: bool) -> (PagedKvCacheManager, u64) {
    let mut cfg = PagedKvConfig::new(BS, n, n / 4);
    cfg.enable_prefix_caching = caching;
    let mut m = PagedKvCacheManager::new(cfg).expect("valid config");
    let seqs = (n / 2 / 4) as u64;
    for s in 0..seqs {
        let p = prompt(s as u32 + 1_000_000, 4 * BS);
        m.allocate(SeqId(s), &p, HINT).expect("fresh id");
        m.append_slots(SeqId(s), &p).expect("room");
    }
    for s in (0..seqs).step_by(2) {
        m.free(SeqId(s));
    }
    (m, seqs)
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("kv");
    g.warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_millis(800))
        .sample_size(20);
    for &n in &SIZES {
        // allocate + append a 64-token prompt (4 fresh blocks) + free.
        let (mut m, mut next) = busy_manager(n, true);
        g.bench_function(BenchmarkId::new("alloc_append64_free", n), |b| {
            b.iter(|| {
                next += 1;
                let id = SeqId(next);
                let p = prompt(next as u32, 4 * BS);
                m.allocate(id, &p, HINT).expect("fresh id");
                black_box(m.append_slots(id, &p).expect("room"));
                m.free(id);
            })
        });

        // The same without prefix caching: freed blocks are worthless and go
        // back to the head of the free list, so the same hot blocks are reused.
        let (mut m, mut next) = busy_manager(n, false);
        g.bench_function(BenchmarkId::new("alloc_append64_free_nocache", n), |b| {
            b.iter(|| {
                next += 1;
                let id = SeqId(next);
                let p = prompt(next as u32, 4 * BS);
                m.allocate(id, &p, HINT).expect("fresh id");
                black_box(m.append_slots(id, &p).expect("room"));
                m.free(id);
            })
        });

        // One decode step: append one token (a new block every 16 steps).
        let (mut m, mut next) = busy_manager(n, true);
        next += 1;
        let mut id = SeqId(next);
        m.allocate(id, &[1], HINT).expect("fresh id");
        let mut len = 0usize;
        g.bench_function(BenchmarkId::new("decode_append1", n), |b| {
            b.iter(|| {
                if len == 1024 {
                    m.free(id);
                    next += 1;
                    id = SeqId(next);
                    m.allocate(id, &[1], HINT).expect("fresh id");
                    len = 0;
                }
                len += 1;
                black_box(m.append_slots(id, &[len as u32]).expect("room"));
            })
        });

        // fork a 200-token sequence (13 blocks) + copy-on-write append + free.
        let (mut m, mut next) = busy_manager(n, true);
        next += 1;
        let parent = SeqId(next);
        let p = prompt(7, 200);
        m.allocate(parent, &p, HINT).expect("fresh id");
        m.append_slots(parent, &p).expect("room");
        g.bench_function(BenchmarkId::new("fork_cow_append_free", n), |b| {
            b.iter(|| {
                next += 1;
                let child = SeqId(next);
                m.fork(parent, child).expect("resident parent");
                black_box(m.append_slots(child, &[5]).expect("room"));
                m.free(child);
            })
        });

        // Prefix-cache hit: 256-token prompt, 15 cached blocks reused.
        let (mut m, mut next) = busy_manager(n, true);
        let p = prompt(9, 16 * BS);
        next += 1;
        m.allocate(SeqId(next), &p, HINT).expect("fresh id");
        m.append_slots(SeqId(next), &p).expect("room");
        m.free(SeqId(next));
        g.bench_function(BenchmarkId::new("prefix_hit256_free", n), |b| {
            b.iter(|| {
                next += 1;
                let id = SeqId(next);
                let hit = m.allocate(id, &p, HINT).expect("fresh id");
                assert_eq!(hit, 15 * BS);
                m.free(id);
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
