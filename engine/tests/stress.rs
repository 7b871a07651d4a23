//! 200 requests of random lengths arrive over time at a KV cache only a few
//! blocks larger than the longest request. Every request must finish with
//! the same greedy tokens as an unpressured run, both preemption modes must
//! be exercised, and both pools must be whole at the end.

mod common;

use common::{assert_pools_full, collect, engine, params, run_to_end, Collected, Setup};
use engine::scheduler::{PreemptionMode, RequestId};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::HashMap;

const REQUESTS: usize = 200;
const MAX_PROMPT: usize = 40;
const MAX_OUTPUT: usize = 24;
const BLOCK: usize = 4;

struct Workload {
    prompts: Vec<Vec<u32>>,
    max_tokens: Vec<usize>,
}

/// Random prompts (a quarter share a 12-token prefix) and output lengths.
fn workload(seed: u64) -> Workload {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let shared: Vec<u32> = (0..12).map(|_| rng.gen_range(3..1000)).collect();
    let mut prompts = Vec::new();
    let mut max_tokens = Vec::new();
    for _ in 0..REQUESTS {
        let len = rng.gen_range(1..=MAX_PROMPT);
        let mut p: Vec<u32> = (0..len).map(|_| rng.gen_range(3..1000)).collect();
        if rng.gen_bool(0.25) && len > shared.len() {
            p[..shared.len()].copy_from_slice(&shared);
        }
        prompts.push(p);
        max_tokens.push(rng.gen_range(1..=MAX_OUTPUT));
    }
    Workload {
        prompts,
        max_tokens,
    }
}

/// Runs the workload; requests arrive 0-2 per step (seeded).
fn run(
    setup: &Setup,
    w: &Workload,
    arrival_seed: u64,
) -> (HashMap<RequestId, Collected>, engine::LlmEngine) {
    let mut eng = engine(setup);
    let mut rng = ChaCha8Rng::seed_from_u64(arrival_seed);
    let mut got = HashMap::new();
    let mut next = 0;
    while next < REQUESTS {
        for _ in 0..rng.gen_range(0..=2) {
            if next < REQUESTS {
                let id = RequestId(next as u64);
                eng.add_request(id, w.prompts[next].clone(), params(w.max_tokens[next]))
                    .expect("request accepted");
                next += 1;
            }
        }
        let outs = eng.step();
        collect(&mut got, outs);
    }
    run_to_end(&mut eng, &mut got);
    (got, eng)
}

#[test]
fn two_hundred_requests_under_pressure_match_the_unpressured_run() {
    common::on_each_executor(|| {
        let w = workload(42);
        let longest_blocks = (MAX_PROMPT + MAX_OUTPUT).div_ceil(BLOCK);

        let roomy = Setup {
            device_blocks: REQUESTS * longest_blocks,
            prefix_caching: true,
            ..Setup::default()
        };
        let (want, eng) = run(&roomy, &w, 1);
        let s = eng.stats().scheduler;
        assert_eq!(s.preemptions_swap + s.preemptions_recompute, 0, "{s:?}");
        assert_pools_full(&eng);

        let mut tight = Setup {
            device_blocks: longest_blocks + 4,
            // Room for small victims only: large ones fall back to recompute.
            cpu_blocks: longest_blocks / 2 + 2,
            prefix_caching: true,
            ..Setup::default()
        };
        tight.sched.preemption_mode = PreemptionMode::Auto;
        let (got, eng) = run(&tight, &w, 2);

        for i in 0..REQUESTS {
            let id = RequestId(i as u64);
            let (g, r) = (&got[&id], &want[&id]);
            assert!(g.finished && g.error.is_none(), "request {i}: {g:?}");
            assert_eq!(g.tokens.len(), w.max_tokens[i], "request {i} length");
            assert_eq!(
                g.tokens, r.tokens,
                "request {i} differs from the unpressured run"
            );
        }
        let s = eng.stats().scheduler;
        assert!(s.preemptions_swap > 0, "swap never exercised: {s:?}");
        assert!(
            s.preemptions_recompute > 0,
            "recompute never exercised: {s:?}"
        );
        assert_eq!((s.num_running, s.num_waiting, s.num_swapped), (0, 0, 0));
        assert_eq!(
            s.generation_tokens,
            w.max_tokens.iter().sum::<usize>() as u64
        );
        assert_pools_full(&eng);
        eprintln!("pressured run: {s:?}");
    });
}
