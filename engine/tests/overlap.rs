//! Asynchronous scheduling against the synchronous loop on the real tiny
//! model, paged KV cache (prefix caching on) and CPU executor: the same
//! tokens, logprobs and finish reasons for a mix of requests (greedy,
//! seeded sampling with penalties, n = 2, best_of, beam search, prompt
//! logprobs, structured output, stop tokens hit mid-run), every block back after aborts, and
//! proof that the overlapped loop ran ahead and dropped the rows of
//! sequences that had finished.

mod common;

use common::{assert_pools_full, engine_over, engine_with, prompts, Setup};
use engine::executor::{
    BlockOps, Capabilities, ExecError, Executor, ForwardBatch, Sampling, StepOutput,
};
use engine::grammar::{GrammarCompiler, GrammarSpec};
use engine::sampler::SamplingParams;
use engine::scheduler::{FinishReason, RequestId, RequestParams};
use engine::LlmEngine;
use std::collections::HashMap;

/// Per request: each sequence's (tokens, logprobs, finish reason), and
/// whether the request finished.
type Seqs = Vec<(Vec<u32>, Vec<f32>, Option<FinishReason>)>;
type Got = HashMap<RequestId, (Seqs, bool)>;

fn run(eng: &mut LlmEngine) -> Got {
    let mut got: Got = HashMap::new();
    for _ in 0..100_000 {
        if !eng.has_unfinished() {
            return got;
        }
        for o in eng.step() {
            assert!(o.error.is_none(), "{}: {:?}", o.request_id, o.error);
            let e = got.entry(o.request_id).or_default();
            assert!(!e.1, "output after the end for {}", o.request_id);
            for s in o.seqs {
                if e.0.len() <= s.index {
                    e.0.resize(s.index + 1, (Vec::new(), Vec::new(), None));
                }
                let seq = &mut e.0[s.index];
                assert!(
                    seq.2.is_none(),
                    "tokens after the finish of {}",
                    o.request_id
                );
                seq.0.extend(s.new_token_ids);
                seq.1.extend(s.new_logprobs);
                seq.2 = s.finish_reason;
            }
            e.1 |= o.finished;
        }
    }
    panic!("no end");
}

/// Same tokens, finish reasons and end; logprobs within 1e-4 (the CPU
/// executor's sums depend slightly on which rows share a batch, in either
/// mode).
fn assert_same(a: &(Seqs, bool), b: &(Seqs, bool), i: u64) {
    assert_eq!(a.1, b.1, "request {i} finished");
    assert_eq!(a.0.len(), b.0.len(), "request {i} sequences");
    for (x, y) in a.0.iter().zip(&b.0) {
        assert_eq!((&x.0, x.2), (&y.0, y.2), "request {i}");
        assert_eq!(x.1.len(), y.1.len(), "request {i} logprobs");
        for (p, q) in x.1.iter().zip(&y.1) {
            assert!((p - q).abs() < 1e-4, "request {i}: logprob {p} vs {q}");
        }
    }
}

/// Block size 4; with prefix caching a sequence whose next token would
/// complete a block is not run ahead, without it every plain one is.
fn setup(prefix_caching: bool) -> Setup {
    Setup {
        prefix_caching,
        ..Setup::default()
    }
}

fn greedy(max_tokens: usize, stops: &[u32]) -> RequestParams {
    RequestParams {
        max_tokens: Some(max_tokens),
        ignore_eos: true,
        stop_token_ids: stops.to_vec(),
        ..RequestParams::default()
    }
}

fn sampled(seed: u64, n: usize, best_of: Option<usize>, stops: &[u32]) -> RequestParams {
    RequestParams {
        max_tokens: Some(24),
        ignore_eos: true,
        stop_token_ids: stops.to_vec(),
        sampling: SamplingParams {
            n,
            best_of,
            temperature: 0.8,
            top_k: Some(4),
            frequency_penalty: 0.3,
            seed: Some(seed),
            logprobs: Some(2),
            ..SamplingParams::default()
        },
        ..RequestParams::default()
    }
}

/// The mixed workload; `stops` are token ids the greedy runs produce.
fn workload(stops: &[u32]) -> Vec<(Vec<u32>, RequestParams)> {
    let ps = prompts(7, 12, 3, 30);
    let mut w = Vec::new();
    for (i, p) in ps.iter().enumerate() {
        let params = match i % 6 {
            0 => greedy(1 + i * 2, &[]),
            1 => greedy(20, stops),
            2 => sampled(i as u64, 2, None, stops),
            3 => sampled(i as u64, 1, Some(3), stops),
            4 => RequestParams {
                max_tokens: Some(6),
                ignore_eos: true,
                sampling: SamplingParams {
                    n: 1,
                    best_of: Some(2),
                    use_beam_search: true,
                    ..SamplingParams::default()
                },
                ..RequestParams::default()
            },
            _ => RequestParams {
                sampling: SamplingParams {
                    prompt_logprobs: Some(1),
                    ..SamplingParams::default()
                },
                ..greedy(8, stops)
            },
        };
        w.push((p.clone(), params));
    }
    // Two constrained requests: their masks need the previous token.
    let compiler = GrammarCompiler::new(common::tiny_tokenizer(), 2).expect("compiler");
    let re = compiler
        .compile(&GrammarSpec::Regex("[0-9]{3}-[a-z]{4}(x|yy)".into()))
        .expect("compiles");
    for (i, p) in ps.iter().take(2).enumerate() {
        let params = RequestParams {
            max_tokens: Some(40),
            sampling: SamplingParams {
                temperature: 1.0,
                seed: Some(100 + i as u64),
                structured: Some(re.clone()),
                ..SamplingParams::default()
            },
            ..RequestParams::default()
        };
        w.push((p.clone(), params));
    }
    w
}

fn run_workload(
    overlapped: bool,
    caching: bool,
    w: &[(Vec<u32>, RequestParams)],
) -> (Got, LlmEngine) {
    let mut eng = engine_with(&setup(caching), overlapped);
    for (i, (p, params)) in w.iter().enumerate() {
        eng.add_request(RequestId(i as u64), p.clone(), params.clone())
            .expect("add");
    }
    let got = run(&mut eng);
    (got, eng)
}

/// Stop ids: the 4th generated token of two greedy requests and the 3rd of
/// the first sequence of the n = 2 requests, so those end mid-run.
fn stop_ids() -> Vec<u32> {
    let w = workload(&[]);
    let (got, _) = run_workload(false, true, &w);
    let nth = |i: u64, k: usize| got[&RequestId(i)].0[0].0[k];
    vec![nth(1, 3), nth(7, 3), nth(2, 2), nth(8, 2)]
}

#[test]
fn async_scheduling_matches_the_synchronous_loop() {
    let stops = stop_ids();
    let w = workload(&stops);
    for caching in [true, false] {
        println!("-- prefix caching {caching}");
        compare(&w, caching);
    }
}

fn compare(w: &[(Vec<u32>, RequestParams)], caching: bool) {
    let (sync, sync_eng) = run_workload(false, caching, w);
    let (overlapped, async_eng) = run_workload(true, caching, w);
    assert_eq!(sync.len(), w.len());
    for i in 0..w.len() as u64 {
        let id = RequestId(i);
        assert_same(&sync[&id], &overlapped[&id], i);
    }
    // The workload exercises what it claims: greedy requests stopped by a
    // stop id before max_tokens, and an n = 2 group whose sequences ended
    // at different steps (a finished sequence next to a running one).
    let stopped = |i: u64| sync[&RequestId(i)].0[0].2 == Some(FinishReason::Stop);
    assert!(stopped(1) && stopped(7), "stop ids not hit");
    assert_eq!(sync[&RequestId(1)].0[0].0.len(), 4);
    let uneven = [2u64, 8].iter().any(|&i| {
        let s = &sync[&RequestId(i)].0;
        s.len() == 2 && s[0].0.len() != s[1].0.len()
    });
    assert!(uneven, "no n = 2 group with sequences of different lengths");
    // The synchronous loop never runs ahead; the overlapped one does, and
    // drops the rows it computed for sequences that had already stopped.
    assert_eq!(sync_eng.overlap_stats(), Default::default());
    let o = async_eng.overlap_stats();
    assert!(o.steps_ahead > 0 && o.seqs_ahead > 0, "{o:?}");
    assert!(o.stale_rows > 0, "{o:?}");
    assert_pools_full(&sync_eng);
    assert_pools_full(&async_eng);
}

#[test]
fn aborts_while_a_step_runs_free_every_block() {
    let ps = prompts(3, 8, 4, 20);
    let mut want = engine_with(&setup(true), false);
    for (i, p) in ps.iter().enumerate() {
        want.add_request(RequestId(i as u64), p.clone(), greedy(16, &[]))
            .expect("add");
    }
    let want = run(&mut want);
    let mut eng = engine_with(&setup(true), true);
    for (i, p) in ps.iter().enumerate() {
        eng.add_request(RequestId(i as u64), p.clone(), greedy(16, &[]))
            .expect("add");
    }
    let mut got: Got = HashMap::new();
    for step in 0..100_000 {
        if !eng.has_unfinished() {
            break;
        }
        if step == 3 || step == 6 {
            // Aborted while the step holding their next row runs.
            assert!(eng.abort_request(RequestId(step as u64)));
            assert!(eng.abort_request(RequestId(step as u64 + 1)));
        }
        for o in eng.step() {
            let e = got.entry(o.request_id).or_default();
            if e.0.is_empty() {
                e.0.push((Vec::new(), Vec::new(), None));
            }
            e.0[0].0.extend_from_slice(o.token_ids());
            e.1 |= o.finished;
        }
    }
    assert_pools_full(&eng);
    for i in [0u64, 1, 2, 5] {
        assert_eq!(
            got[&RequestId(i)].0[0].0,
            want[&RequestId(i)].0[0].0,
            "request {i}"
        );
    }
    assert!(eng.overlap_stats().seqs_ahead > 0);
}

/// The tiny model's CPU executor, failing its `fail_at`-th step.
struct FailingAt {
    inner: Box<dyn Executor>,
    calls: usize,
    fail_at: usize,
}

impl FailingAt {
    fn tick(&mut self) -> Result<(), ExecError> {
        self.calls += 1;
        if self.calls == self.fail_at {
            return Err(ExecError::Gpu(engine::error::GpuError::Device(
                "injected failure".into(),
            )));
        }
        Ok(())
    }
}

impl Executor for FailingAt {
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    fn execute(
        &mut self,
        ops: &BlockOps,
        batch: &ForwardBatch,
        sampling: &Sampling,
    ) -> Result<StepOutput, ExecError> {
        self.tick()?;
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

/// A failed step aborts its requests with the error and frees their
/// blocks, in both modes; requests added afterwards run as if nothing had
/// happened.
#[test]
fn a_failed_step_aborts_its_requests_and_frees_every_block() {
    let s = setup(true);
    let ps = prompts(5, 6, 4, 20);
    let (want, _) = run_workload(
        false,
        true,
        &ps.iter()
            .map(|p| (p.clone(), greedy(10, &[])))
            .collect::<Vec<_>>(),
    );
    for overlapped in [false, true] {
        let inner = common::executor(s.device_blocks, s.cpu_blocks, s.block_size);
        let exec = FailingAt {
            inner,
            calls: 0,
            fail_at: 4,
        };
        let mut eng = engine_over(&s, overlapped, Box::new(exec));
        for (i, p) in ps.iter().take(3).enumerate() {
            eng.add_request(RequestId(i as u64), p.clone(), greedy(10, &[]))
                .expect("add");
        }
        let mut failed = Vec::new();
        let mut got: HashMap<RequestId, Vec<u32>> = HashMap::new();
        for step in 0..10_000 {
            if step == 6 {
                for (i, p) in ps.iter().enumerate().skip(3) {
                    eng.add_request(RequestId(i as u64), p.clone(), greedy(10, &[]))
                        .expect("add");
                }
            }
            if step > 6 && !eng.has_unfinished() {
                break;
            }
            for o in eng.step() {
                if o.error.is_some() {
                    failed.push(o.request_id);
                }
                got.entry(o.request_id)
                    .or_default()
                    .extend_from_slice(o.token_ids());
            }
        }
        failed.sort();
        assert_eq!(
            failed,
            [RequestId(0), RequestId(1), RequestId(2)],
            "async {overlapped}"
        );
        assert_pools_full(&eng);
        for i in 3..ps.len() as u64 {
            let id = RequestId(i);
            assert_eq!(
                got[&id], want[&id].0[0].0,
                "request {i}, async {overlapped}"
            );
        }
    }
}
