//! Greedy outputs do not depend on how requests are scheduled: alone, in one
//! batch, under preemption by swap and by recompute, with small prefill
//! chunks, and on prefix-cache hits. The reference for "alone" is the
//! executor's own greedy loop (`generate_greedy`, contiguous blocks, no
//! scheduler), so the scheduler is checked against code it does not share.

mod common;

use common::{assert_pools_full, engine, params, prompts, run_batch, run_to_end, Setup};
use engine::executor::{generate_greedy, CpuExecutor};
use engine::model::CpuModel;
use engine::scheduler::{PreemptionMode, RequestId};
use std::collections::HashMap;

const MAX_TOKENS: [usize; 6] = [20, 24, 16, 24, 12, 22];

fn set() -> Vec<Vec<u32>> {
    prompts(7, MAX_TOKENS.len(), 5, 40)
}

/// Each prompt alone through the executor's plain greedy loop.
fn reference(prompts: &[Vec<u32>]) -> Vec<Vec<u32>> {
    let (config, weights) = common::tiny();
    prompts
        .iter()
        .zip(MAX_TOKENS)
        .map(|(p, m)| {
            let model = CpuModel::new(config.clone(), weights.clone()).expect("model");
            let mut exec = CpuExecutor::new(model, 64, 0, 4).expect("executor");
            generate_greedy(&mut exec, p, m, &[], |_| {}).expect("generate")
        })
        .collect()
}

#[test]
fn alone_matches_the_executors_greedy_loop() {
    common::on_each_executor(|| {
        let ps = set();
        let want = reference(&ps);
        for (i, p) in ps.iter().enumerate() {
            let (got, eng) = run_batch(
                &Setup::default(),
                std::slice::from_ref(p),
                &MAX_TOKENS[i..=i],
            );
            assert_eq!(got[0], want[i], "prompt {i} alone");
            assert_eq!(got[0].len(), MAX_TOKENS[i]);
            assert_pools_full(&eng);
        }
    });
}

#[test]
fn one_batch_matches_alone() {
    common::on_each_executor(|| {
        let ps = set();
        let (got, eng) = run_batch(&Setup::default(), &ps, &MAX_TOKENS);
        assert_eq!(got, reference(&ps));
        let s = eng.stats().scheduler;
        assert_eq!(s.preemptions_swap + s.preemptions_recompute, 0);
        assert_eq!(s.generation_tokens, MAX_TOKENS.iter().sum::<usize>() as u64);
        assert_pools_full(&eng);
    });
}

/// A pool that holds about two of the six requests at full length.
fn pressured(mode: PreemptionMode, cpu_blocks: usize) -> Setup {
    let mut s = Setup {
        device_blocks: 24,
        cpu_blocks,
        ..Setup::default()
    };
    s.sched.preemption_mode = mode;
    s
}

#[test]
fn preemption_by_swap_matches_alone() {
    common::on_each_executor(|| {
        let ps = set();
        let (got, eng) = run_batch(&pressured(PreemptionMode::Swap, 256), &ps, &MAX_TOKENS);
        assert_eq!(got, reference(&ps));
        let s = eng.stats().scheduler;
        assert!(s.preemptions_swap > 0, "no swap happened: {s:?}");
        assert_eq!(s.preemptions_recompute, 0, "{s:?}");
        assert_pools_full(&eng);
    });
}

#[test]
fn preemption_by_recompute_matches_alone() {
    common::on_each_executor(|| {
        let ps = set();
        let (got, eng) = run_batch(&pressured(PreemptionMode::Recompute, 256), &ps, &MAX_TOKENS);
        assert_eq!(got, reference(&ps));
        let s = eng.stats().scheduler;
        assert!(s.preemptions_recompute > 0, "no recompute happened: {s:?}");
        assert_eq!(s.preemptions_swap, 0, "{s:?}");
        assert_pools_full(&eng);
    });
}

#[test]
fn small_prefill_chunks_match_alone() {
    common::on_each_executor(|| {
        let ps = set();
        let mut setup = Setup::default();
        setup.sched.max_num_batched_tokens = 5;
        let (got, eng) = run_batch(&setup, &ps, &MAX_TOKENS);
        assert_eq!(got, reference(&ps));
        // The longest prompt needs several steps of at most 5 tokens.
        let longest = ps.iter().map(Vec::len).max().unwrap_or(0);
        assert!(eng.stats().scheduler.steps as usize >= longest / 5);
        assert_pools_full(&eng);
    });
}

#[test]
fn prefix_cache_hit_matches_alone() {
    common::on_each_executor(|| {
        let ps = set();
        let want = reference(&ps);
        let setup = Setup {
            prefix_caching: true,
            ..Setup::default()
        };
        let mut eng = engine(&setup);
        let mut got = HashMap::new();
        // First pass fills the cache; the second pass finds each prompt's full
        // blocks there.
        for round in 0..2u64 {
            for (i, p) in ps.iter().enumerate() {
                let id = RequestId(round * 100 + i as u64);
                eng.add_request(id, p.clone(), params(MAX_TOKENS[i]))
                    .expect("accepted");
            }
            run_to_end(&mut eng, &mut got);
        }
        for (i, w) in want.iter().enumerate() {
            let first = &got[&RequestId(i as u64)];
            let second = &got[&RequestId(100 + i as u64)];
            assert_eq!(&first.tokens, w, "prompt {i}, cold");
            assert_eq!(&second.tokens, w, "prompt {i}, cached");
            let full_blocks = (ps[i].len() - 1) / setup.block_size * setup.block_size;
            assert_eq!(
                second.num_cached_tokens, full_blocks,
                "prompt {i} cached tokens"
            );
        }
        assert!(eng.stats().kv.prefix_cache_hits > 0);
        assert_pools_full(&eng);
    });
}
