//! Batch-invariant results on the real default model (SmolLM2-135M, the
//! GGUF's quantized blocks kept, `--dtype auto`): a request's tokens,
//! logprobs and top logprobs are the same bits alone and when it shares
//! its batches with 1, 4, 7 and 32 other requests, through the engine; and
//! the logits of positions scored as one multi-token span (a speculative
//! verification step, a prefill chunk) equal those of the same positions
//! decoded one step at a time. Both with [`CpuModel::set_batch_invariant`]
//! (`--batch-invariant`), and for the f32 weights (`--dtype float32`) too.
//!
//! Skipped (with a printed reason) when the GGUF file is not fetched
//! (`cargo xtask fetch-model`).

mod common;

use common::{collect, engine_over, Collected, Setup};
use engine::executor::{
    ContiguousLayout, CpuExecutor, Executor, ForwardBatch, Sampling, StepOutput,
};
use engine::model::CpuModel;
use engine::sampler::SamplingParams;
use engine::scheduler::{RequestId, RequestParams};
use engine::{LlmEngine, RequestOutput};
use model_loader::WeightTypes;
use std::collections::HashMap;
use std::sync::OnceLock;

/// Greedy tokens of the request under test.
const TOKENS: usize = 16;
const TOP: usize = 5;

/// The default model with its matrices in `types`, loaded once per
/// binary; `None` (after printing why) when the file is missing.
fn model(types: WeightTypes) -> Option<&'static CpuModel> {
    static QUANT: OnceLock<Option<CpuModel>> = OnceLock::new();
    static F32: OnceLock<Option<CpuModel>> = OnceLock::new();
    let cell = if types == WeightTypes::File {
        &QUANT
    } else {
        &F32
    };
    cell.get_or_init(|| {
        let path = model_loader::paths::default_model_path();
        if !path.is_file() {
            eprintln!(
                "skipped: {} missing (run `cargo xtask fetch-model`)",
                path.display()
            );
            return None;
        }
        let m = model_loader::load_model_with(&path, types).expect("load the default model");
        Some(CpuModel::new(m.config, m.weights).expect("model"))
    })
    .as_ref()
}

fn cpu_model(types: WeightTypes, invariant: bool) -> Option<CpuModel> {
    let mut m = model(types)?.clone();
    assert_eq!(m.is_quantized(), types == WeightTypes::File);
    m.set_batch_invariant(invariant);
    Some(m)
}

/// A prompt of `len` ordinary token ids, different per `seed`.
fn prompt(seed: u32, len: usize) -> Vec<u32> {
    (0..len as u32)
        .map(|i| 300 + (i * 7919 + seed * 104_729) % 40_000)
        .collect()
}

/// What the request under test produced: tokens, logprobs and top
/// logprobs as bits.
#[derive(Debug, Default, PartialEq)]
struct Trace {
    tokens: Vec<u32>,
    logprobs: Vec<u32>,
    top: Vec<Vec<(u32, u32)>>,
}

fn params(max_tokens: usize) -> RequestParams {
    RequestParams {
        max_tokens: Some(max_tokens),
        ignore_eos: true,
        sampling: SamplingParams {
            logprobs: Some(TOP),
            ..SamplingParams::default()
        },
        ..RequestParams::default()
    }
}

/// Runs the request under test with `others` other requests (prompts of
/// varied lengths, as many tokens or more), all added before the first
/// step, and returns its trace.
fn run(eng: &mut LlmEngine, next_id: &mut u64, others: usize) -> Trace {
    let target = RequestId(*next_id);
    eng.add_request(target, prompt(0, 21), params(TOKENS))
        .expect("accepted");
    for i in 0..others {
        let id = RequestId(*next_id + 1 + i as u64);
        let len = 5 + (i * 7) % 29;
        eng.add_request(id, prompt(1 + i as u32, len), params(TOKENS + i % 3))
            .expect("accepted");
    }
    *next_id += 1 + others as u64;
    let (mut trace, mut done) = (Trace::default(), HashMap::<RequestId, Collected>::new());
    for _ in 0..10_000 {
        if !eng.has_unfinished() {
            break;
        }
        let outs: Vec<RequestOutput> = eng.step();
        for o in outs.iter().filter(|o| o.request_id == target) {
            assert!(o.error.is_none(), "{:?}", o.error);
            for s in &o.seqs {
                trace.tokens.extend_from_slice(&s.new_token_ids);
                trace
                    .logprobs
                    .extend(s.new_logprobs.iter().map(|l| l.to_bits()));
                trace.top.extend(
                    s.new_top_logprobs
                        .iter()
                        .map(|t| t.iter().map(|&(id, l)| (id, l.to_bits())).collect()),
                );
            }
        }
        collect(&mut done, outs);
    }
    assert!(!eng.has_unfinished(), "engine did not finish");
    assert_eq!(done.len(), others + 1);
    assert!(done.values().all(|c| c.finished && c.error.is_none()));
    assert_eq!(trace.tokens.len(), TOKENS);
    assert!(trace.top.iter().all(|t| t.len() == TOP));
    trace
}

/// The request's trace alone and in batches of 2, 5, 8 and 33 (`sizes`).
fn check_batches(types: WeightTypes, invariant: bool, sizes: &[usize]) {
    let Some(model) = cpu_model(types, invariant) else {
        return;
    };
    let block_size = 16;
    let exec = CpuExecutor::new(model, 160, 0, block_size).expect("executor");
    let setup = Setup {
        block_size,
        device_blocks: 160,
        ..Setup::default()
    };
    let mut eng = engine_over(&setup, false, Box::new(exec));
    let mut next = 0;
    let alone = run(&mut eng, &mut next, 0);
    for &n in sizes {
        let got = run(&mut eng, &mut next, n - 1);
        assert_eq!(
            got.tokens, alone.tokens,
            "{types:?}: greedy ids in a batch of {n}"
        );
        for (i, (g, a)) in got.logprobs.iter().zip(&alone.logprobs).enumerate() {
            assert_eq!(
                g,
                a,
                "{types:?}: token {i}'s logprob in a batch of {n}: {} vs {} alone",
                f32::from_bits(*g),
                f32::from_bits(*a)
            );
        }
        assert_eq!(got, alone, "{types:?}: top logprobs in a batch of {n}");
    }
}

#[test]
fn quantized_logprobs_are_bit_identical_in_batches_of_2_5_8_and_33() {
    check_batches(WeightTypes::File, true, &[2, 5, 8, 33]);
}

#[test]
fn f32_logprobs_are_bit_identical_in_batches_with_the_invariant_kernels() {
    check_batches(WeightTypes::F32, true, &[2, 5]);
}

/// Logits rows of one forward of `batch` on `exec`.
fn forward(exec: &mut CpuExecutor, batch: &ForwardBatch) -> Vec<Vec<f32>> {
    let logits = exec
        .execute(&Default::default(), batch, &Sampling::Host)
        .and_then(StepOutput::into_logits)
        .expect("forward pass");
    (0..logits.rows).map(|r| logits.row(r).to_vec()).collect()
}

fn argmax(row: &[f32]) -> u32 {
    let mut best = 0;
    for (i, v) in row.iter().enumerate() {
        if *v > row[best] {
            best = i;
        }
    }
    best as u32
}

/// A prompt, then `SPAN` greedy tokens one decode step at a time (beside
/// a second sequence's decode rows); then, on a fresh cache, the same
/// prompt and the same tokens scored as one span with a logits row per
/// position (beside the second sequence's prefill rows). Every logits row
/// must be the same bits.
fn check_span(types: WeightTypes, invariant: bool) {
    const SPAN: usize = 5;
    let block_size = 16;
    let layout = ContiguousLayout {
        block_size,
        blocks_per_seq: 4,
    };
    let (p, other) = (prompt(3, 27), prompt(4, 9));
    let Some(model) = cpu_model(types, invariant) else {
        return;
    };
    let mut a = CpuExecutor::new(model, 8, 0, block_size).expect("executor");
    // One decode step at a time.
    let mut batch = ForwardBatch::default();
    layout.push(&mut batch, 0, 0, &p, true);
    layout.push(&mut batch, 1, 0, &other, true);
    let mut last = forward(&mut a, &batch)[0].clone();
    let (mut tokens, mut stepped) = (Vec::new(), Vec::new());
    for s in 0..SPAN {
        let t = argmax(&last);
        tokens.push(t);
        let mut batch = ForwardBatch::default();
        layout.push(&mut batch, 0, p.len() + s, &[t], true);
        layout.push(&mut batch, 1, other.len() + s, &[7 + s as u32], true);
        last = forward(&mut a, &batch)[0].clone();
        stepped.push(last.clone());
    }
    // The prompt, then the tokens as one span.
    let mut b = CpuExecutor::new(
        cpu_model(types, invariant).expect("loaded"),
        8,
        0,
        block_size,
    )
    .expect("executor");
    let mut batch = ForwardBatch::default();
    layout.push(&mut batch, 0, 0, &p, true);
    forward(&mut b, &batch);
    let mut batch = ForwardBatch::default();
    layout.push(&mut batch, 0, p.len(), &tokens, false);
    layout.push(&mut batch, 1, 0, &other, true);
    batch.logits_rows = (0..SPAN).collect();
    let spanned = forward(&mut b, &batch);
    assert_eq!(spanned.len(), SPAN);
    for (i, (s, d)) in spanned.iter().zip(&stepped).enumerate() {
        let diff = s
            .iter()
            .zip(d)
            .filter(|(x, y)| x.to_bits() != y.to_bits())
            .count();
        assert_eq!(
            diff,
            0,
            "{types:?}: position {} scored in a span differs from its decode step in {diff} logits",
            p.len() + i
        );
    }
}

#[test]
fn quantized_span_logits_equal_decode_steps() {
    check_span(WeightTypes::File, true);
}

#[test]
fn f32_span_logits_equal_decode_steps_with_the_invariant_kernels() {
    check_span(WeightTypes::F32, true);
}
