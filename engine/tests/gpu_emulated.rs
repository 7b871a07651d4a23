//! The whole engine on the GPU executor over the host-emulated device: the
//! real scheduler, KV manager and sampler drive the GPU executor's launches,
//! swaps and copy-on-write copies, and every request's tokens must equal the
//! CPU executor's. Small on purpose: the emulator runs one OS thread per GPU
//! thread (the other engine tests take the emulator with
//! `ENGINE_TEST_EXECUTORS=cpu,emulated`).

mod common;

use common::{assert_pools_full, engine, on_executors, ExecKind, Setup};
use engine::sampler::SamplingParams;
use engine::scheduler::{PreemptionMode, RequestId, RequestParams};
use engine::LlmEngine;
use std::cell::RefCell;
use std::collections::BTreeMap;

/// Per (request, sequence index): the generated tokens.
type Out = BTreeMap<(u64, usize), Vec<u32>>;

fn run(eng: &mut LlmEngine) -> Out {
    let mut out = Out::new();
    for _ in 0..10_000 {
        if !eng.has_unfinished() {
            return out;
        }
        for o in eng.step() {
            assert!(o.error.is_none(), "{:?}", o.error);
            for s in o.seqs {
                out.entry((o.request_id.0, s.index))
                    .or_default()
                    .extend(s.new_token_ids);
            }
        }
    }
    panic!("the engine did not finish");
}

/// Greedy requests and one seeded n=2 sampling request (its two sequences
/// fork after the prompt: shared blocks, then copy-on-write), in a pool too
/// small for all of them at once, so groups are swapped out and back in.
fn workload(eng: &mut LlmEngine) {
    let prompts: [&[u32]; 3] = [
        &[5, 17, 99, 3, 250, 41],
        &[7, 7, 300, 12, 8, 64, 2, 90, 11],
        &[401, 33, 6, 18, 77, 5, 9],
    ];
    for (i, p) in prompts.iter().enumerate() {
        let params = RequestParams {
            max_tokens: Some(8),
            ignore_eos: true,
            ..RequestParams::default()
        };
        eng.add_request(RequestId(i as u64), p.to_vec(), params)
            .expect("accepted");
    }
    let sampled = RequestParams {
        max_tokens: Some(8),
        ignore_eos: true,
        sampling: SamplingParams {
            n: 2,
            temperature: 1.0,
            seed: Some(3),
            ..SamplingParams::default()
        },
        ..RequestParams::default()
    };
    eng.add_request(RequestId(9), vec![12, 13, 14, 15, 16], sampled)
        .expect("accepted");
}

#[test]
fn the_engine_on_the_emulated_gpu_matches_the_cpu_under_swapping() {
    let mut setup = Setup {
        device_blocks: 10,
        cpu_blocks: 32,
        ..Setup::default()
    };
    setup.sched.preemption_mode = PreemptionMode::Swap;
    let results = RefCell::new(Vec::new());
    on_executors(&[ExecKind::Cpu, ExecKind::Emulated], || {
        let mut eng = engine(&setup);
        workload(&mut eng);
        let out = run(&mut eng);
        let swaps = eng.stats().scheduler.preemptions_swap;
        assert_pools_full(&eng);
        let kind = (common::current_executor(), common::async_scheduling());
        results.borrow_mut().push((kind, out, swaps));
    });
    let results = results.into_inner();
    let cpu = &results[0];
    assert_eq!(
        cpu.1.len(),
        5,
        "3 greedy + 2 sampled sequences: {:?}",
        cpu.1
    );
    assert!(cpu.1.values().all(|t| t.len() == 8));
    for (kind, out, swaps) in &results {
        assert!(*swaps > 0, "{kind:?} never swapped");
        assert_eq!(out, &cpu.1, "{kind:?} vs the CPU executor");
        // The schedule depends only on the requests and the loop's mode.
        let same_mode = results.iter().filter(|r| r.0 .1 == kind.1);
        assert!(same_mode.into_iter().all(|r| r.2 == *swaps), "{kind:?}");
    }
}
