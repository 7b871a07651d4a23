//! The whole engine on the GPU executor over the host-emulated device: the
//! real scheduler, KV manager and sampler drive the GPU executor's launches,
//! swaps and copy-on-write copies, and every request's tokens must equal the
//! CPU executor's. Small on purpose: the emulator runs one OS thread per GPU
//! thread (the other engine tests take the emulator with
//! `ENGINE_TEST_EXECUTORS=cpu,emulated`).

mod common;

use common::{assert_pools_full, engine, engine_over, executor, on_executors, ExecKind, Setup};
use engine::executor::{
    BlockOps, Capabilities, ExecError, Executor, ForwardBatch, Sampling, StepOutput,
};
use engine::sampler::SamplingParams;
use engine::scheduler::{PreemptionMode, RequestId, RequestParams};
use engine::LlmEngine;
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Per (request, sequence index): the generated tokens.
type Out = BTreeMap<(u64, usize), Vec<u32>>;

fn run(eng: &mut LlmEngine) -> Out {
    run_scored(eng).0
}

/// [`run`], plus each request's prompt logprobs: (token, logprob).
fn run_scored(eng: &mut LlmEngine) -> (Out, BTreeMap<u64, Vec<(u32, f32)>>) {
    let mut out = Out::new();
    let mut scored = BTreeMap::new();
    for _ in 0..10_000 {
        if !eng.has_unfinished() {
            return (out, scored);
        }
        for o in eng.step() {
            assert!(o.error.is_none(), "{:?}", o.error);
            if let Some(p) = &o.prompt_logprobs {
                let ids = p.iter().flatten().map(|e| (e.token, e.logprob)).collect();
                scored.insert(o.request_id.0, ids);
            }
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

/// Counts the executor's device draws that use count slots, the slot
/// fills they carry, and the mixed steps (some rows drawn by the host);
/// delegates everything.
struct Spy {
    inner: Box<dyn Executor>,
    slot_steps: Arc<AtomicUsize>,
    fills: Arc<AtomicUsize>,
    mixed_steps: Arc<AtomicUsize>,
}

impl Executor for Spy {
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    fn execute(
        &mut self,
        ops: &BlockOps,
        batch: &ForwardBatch,
        sampling: &Sampling,
    ) -> Result<StepOutput, ExecError> {
        let out = self.inner.execute(ops, batch, sampling)?;
        if let Sampling::Device(draws) = sampling {
            if draws.rows.iter().any(|r| r.slot.is_some()) {
                self.slot_steps.fetch_add(1, Ordering::Relaxed);
                self.fills.fetch_add(draws.fills.len(), Ordering::Relaxed);
            }
            if !draws.host_rows.is_empty() {
                self.mixed_steps.fetch_add(1, Ordering::Relaxed);
            }
        }
        Ok(out)
    }
    fn vocab_size(&self) -> usize {
        self.inner.vocab_size()
    }
    fn num_blocks(&self) -> (usize, usize) {
        self.inner.num_blocks()
    }
    fn block_size(&self) -> usize {
        self.inner.block_size()
    }
}

/// Requests with penalties (greedy and seeded, one of them n = 2, whose
/// children get their slots after the fork), `min_tokens` before a stop id,
/// `logit_bias`, and a plain one, in one batch; then (ids 6 and 7) a beam
/// search and a `prompt_logprobs` request, whose rows the host draws from
/// their own logits while the others are drawn on the device.
fn penalized_workload(eng: &mut LlmEngine) {
    let d = SamplingParams::default;
    let sampling = [
        SamplingParams {
            repetition_penalty: 1.6,
            ..d()
        },
        SamplingParams {
            frequency_penalty: 1.2,
            presence_penalty: 0.4,
            ..d()
        },
        SamplingParams {
            temperature: 0.9,
            seed: Some(11),
            repetition_penalty: 1.2,
            presence_penalty: 0.6,
            logprobs: Some(2),
            ..d()
        },
        SamplingParams {
            n: 2,
            temperature: 1.0,
            seed: Some(5),
            frequency_penalty: 0.8,
            ..d()
        },
        SamplingParams {
            min_tokens: 6,
            logit_bias: vec![(17, 40.0), (99, -50.0)],
            ..d()
        },
        SamplingParams {
            temperature: 0.8,
            seed: Some(2),
            ..d()
        },
    ];
    for (i, s) in sampling.into_iter().enumerate() {
        let params = RequestParams {
            max_tokens: Some(12),
            stop_token_ids: vec![17],
            sampling: s,
            ..RequestParams::default()
        };
        let prompt: Vec<u32> = (0..7 + i as u32)
            .map(|j| (j * 37 + i as u32 * 11) % 300 + 3)
            .collect();
        eng.add_request(RequestId(i as u64), prompt, params)
            .expect("accepted");
    }
    let beam = RequestParams {
        max_tokens: Some(6),
        sampling: SamplingParams {
            n: 2,
            best_of: Some(2),
            use_beam_search: true,
            ..d()
        },
        ..RequestParams::default()
    };
    eng.add_request(RequestId(6), vec![40, 41, 42, 43, 44], beam)
        .expect("accepted");
    let scored = RequestParams {
        max_tokens: Some(5),
        sampling: SamplingParams {
            prompt_logprobs: Some(2),
            temperature: 0.5,
            seed: Some(8),
            ..d()
        },
        ..RequestParams::default()
    };
    eng.add_request(RequestId(7), vec![60, 61, 62, 63, 64, 65], scored)
        .expect("accepted");
}

/// The engine with penalties, `min_tokens` and `logit_bias` drawn on the
/// emulated GPU (count slots kept on the device), beside beam search and
/// prompt logprobs drawn by the host in the same (mixed) steps, gives the
/// CPU executor's tokens, in the synchronous and the overlapped loop; the
/// device draws did use slots, each sequence filled about once.
#[test]
fn penalized_requests_on_the_emulated_gpu_match_the_cpu() {
    let setup = Setup::default();
    let results = RefCell::new(Vec::new());
    on_executors(&[ExecKind::Cpu, ExecKind::Emulated], || {
        let slot_steps = Arc::new(AtomicUsize::new(0));
        let fills = Arc::new(AtomicUsize::new(0));
        let mixed = Arc::new(AtomicUsize::new(0));
        let spy = Spy {
            inner: executor(setup.device_blocks, setup.cpu_blocks, setup.block_size),
            slot_steps: slot_steps.clone(),
            fills: fills.clone(),
            mixed_steps: mixed.clone(),
        };
        let mut eng = engine_over(&setup, common::async_scheduling(), Box::new(spy));
        penalized_workload(&mut eng);
        let (out, scored) = run_scored(&mut eng);
        // The prompt row of every position after the first, scored once.
        let ids: Vec<u32> = scored
            .get(&7)
            .map_or(Vec::new(), |v| v.iter().map(|x| x.0).collect());
        assert_eq!(ids, vec![61, 62, 63, 64, 65]);
        assert_pools_full(&eng);
        let kind = common::current_executor();
        let (steps, fills) = (
            slot_steps.load(Ordering::Relaxed),
            fills.load(Ordering::Relaxed),
        );
        let mixed = mixed.load(Ordering::Relaxed);
        if kind == ExecKind::Emulated {
            assert!(mixed >= 4, "{mixed} mixed steps");
            assert!(steps >= 8, "{steps} device steps with count slots");
            // 5 sequences with penalties, plus n = 2's second child.
            assert!((4..=8).contains(&fills), "{fills} slot fills");
        } else {
            assert_eq!((steps, mixed), (0, 0));
        }
        results
            .borrow_mut()
            .push((kind, common::async_scheduling(), out, scored));
    });
    let results = results.into_inner();
    let (cpu, cpu_scored) = (&results[0].2, &results[0].3[&7]);
    assert_eq!(cpu.len(), 10, "{cpu:?}");
    // Request 4's bias makes its stop id the argmax: suppressed for the
    // first 6 tokens, drawn at once after.
    assert_eq!(cpu[&(4, 0)].len(), 7, "{cpu:?}");
    assert_eq!(cpu[&(4, 0)][6], 17);
    assert!(!cpu[&(4, 0)][..6].contains(&17));
    for (kind, overlapped, out, scored) in &results {
        assert_eq!(
            out, cpu,
            "{kind:?} (async: {overlapped}) vs the CPU executor"
        );
        for (g, c) in scored[&7].iter().zip(cpu_scored) {
            assert!(
                (g.1 - c.1).abs() < 1e-3,
                "{kind:?} prompt logprob {g:?} vs {c:?}"
            );
        }
    }
}

/// Passes everything to `inner` but declares `caps`, and counts the steps
/// whose proposal rows (more logits rows than sequences) were drawn on the
/// device (`Sampling::Device`) or reduced there (`Sampling::Greedy`).
struct Declared {
    inner: Box<dyn Executor>,
    caps: Capabilities,
    device_spec: Arc<AtomicUsize>,
    greedy_spec: Arc<AtomicUsize>,
}

impl Executor for Declared {
    fn capabilities(&self) -> Capabilities {
        self.caps
    }
    fn execute(
        &mut self,
        ops: &BlockOps,
        batch: &ForwardBatch,
        sampling: &Sampling,
    ) -> Result<StepOutput, ExecError> {
        if batch.logits_rows.len() > batch.seqs.len() {
            match sampling {
                Sampling::Device(_) => self.device_spec.fetch_add(1, Ordering::Relaxed),
                Sampling::Greedy => self.greedy_spec.fetch_add(1, Ordering::Relaxed),
                Sampling::Host => 0,
            };
        }
        self.inner.execute(ops, batch, sampling)
    }
    fn vocab_size(&self) -> usize {
        self.inner.vocab_size()
    }
    fn num_blocks(&self) -> (usize, usize) {
        self.inner.num_blocks()
    }
    fn block_size(&self) -> usize {
        self.inner.block_size()
    }
}

/// Prompts repeating a segment (prompt lookup finds proposals): greedy
/// requests, then seeded ones with temperature, top-k, top-p, min-p,
/// top logprobs, `min_tokens` before stop ids and `logit_bias`.
fn speculating_workload(eng: &mut LlmEngine, greedy: bool) {
    let d = SamplingParams::default;
    let sampling = if greedy {
        vec![d(), d()]
    } else {
        vec![
            SamplingParams {
                temperature: 0.7,
                top_k: Some(40),
                top_p: 0.9,
                seed: Some(21),
                logprobs: Some(2),
                ..d()
            },
            SamplingParams {
                temperature: 1.0,
                min_p: 0.05,
                seed: Some(4),
                min_tokens: 7,
                logit_bias: vec![(17, 30.0), (250, 3.0)],
                ..d()
            },
            SamplingParams {
                temperature: 0.3,
                seed: Some(9),
                ..d()
            },
        ]
    };
    for (i, s) in sampling.into_iter().enumerate() {
        let seg: Vec<u32> = (0..5).map(|j| (j * 53 + i as u32 * 29) % 400 + 3).collect();
        let prompt = [seg.as_slice(), &[90 + i as u32], &seg, &seg[..2]].concat();
        let params = RequestParams {
            max_tokens: Some(10),
            stop_token_ids: vec![17],
            sampling: s,
            ..RequestParams::default()
        };
        eng.add_request(RequestId(i as u64), prompt, params)
            .expect("accepted");
    }
}

/// Speculation (prompt lookup, k = 3) on the emulated GPU gives the CPU's
/// tokens: greedy steps verified from the device's argmax rows, seeded
/// sampled steps from proposal rows drawn on the device at their own
/// output positions, and the same emulated executor declaring no device
/// sampling (every row verified on the host from logits) agrees too.
#[test]
fn speculation_on_the_emulated_gpu_matches_the_cpu() {
    let mut setup = Setup::default();
    setup.sched.speculative = Some(engine::spec::SpecConfig {
        method: engine::spec::SpecMethod::Ngram {
            prompt_lookup_min: 1,
            prompt_lookup_max: 3,
        },
        num_speculative_tokens: 3,
        disable_by_batch_size: None,
        adaptive: false,
    });
    let host_only = Capabilities {
        greedy: false,
        sampled: false,
        count_slots: false,
    };
    for greedy in [true, false] {
        let results = RefCell::new(Vec::new());
        for (kind, declared) in [
            (ExecKind::Cpu, None),
            (ExecKind::Emulated, None),
            (ExecKind::Emulated, Some(host_only)),
        ] {
            on_executors(&[kind], || {
                if common::async_scheduling() {
                    return; // refused with speculation
                }
                let inner = executor(setup.device_blocks, setup.cpu_blocks, setup.block_size);
                let device_spec = Arc::new(AtomicUsize::new(0));
                let greedy_spec = Arc::new(AtomicUsize::new(0));
                let caps = declared.unwrap_or_else(|| inner.capabilities());
                let exec = Declared {
                    inner,
                    caps,
                    device_spec: device_spec.clone(),
                    greedy_spec: greedy_spec.clone(),
                };
                let mut eng = engine_over(&setup, false, Box::new(exec));
                speculating_workload(&mut eng, greedy);
                let out = run(&mut eng);
                assert!(eng.stats().scheduler.spec.draft_tokens > 0);
                assert_pools_full(&eng);
                let on_device = (
                    device_spec.load(Ordering::Relaxed),
                    greedy_spec.load(Ordering::Relaxed),
                );
                if kind == ExecKind::Emulated && declared.is_none() {
                    let n = if greedy { on_device.1 } else { on_device.0 };
                    assert!(n > 0, "greedy {greedy}: {on_device:?}");
                } else {
                    assert_eq!(on_device, (0, 0));
                }
                results.borrow_mut().push((kind, declared.is_some(), out));
            });
        }
        let results = results.into_inner();
        let cpu = &results[0].2;
        assert_eq!(cpu.len(), if greedy { 2 } else { 3 }, "{cpu:?}");
        for (kind, host_only, out) in &results {
            assert_eq!(
                out, cpu,
                "greedy {greedy}: {kind:?} (host only: {host_only})"
            );
        }
    }
}
