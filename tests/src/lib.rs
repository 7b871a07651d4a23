//! Shared helpers for the cross-crate integration tests: fixture loading and
//! a batched greedy decoder that also reports top-k logprobs, used to compare
//! our forward pass with golden outputs from HF transformers.

use engine::executor::cpu::generate::{argmax, ContiguousLayout};
use engine::executor::{BlockOps, Executor, ForwardBatch, Sampling, StepOutput};
use serde::Deserialize;
use std::path::{Path, PathBuf};

/// One golden prompt (see `tests/fixtures/make_golden.py`).
#[derive(Debug, Deserialize)]
pub struct GoldenCase {
    pub text: String,
    pub chat: bool,
    pub rendered: String,
    pub prompt_ids: Vec<u32>,
    pub greedy_ids: Vec<u32>,
    /// Per step: five `[token id, logprob]` pairs, best first.
    pub top5_logprobs: Vec<Vec<(u32, f64)>>,
}

/// Reference ids for one tokenizer text.
#[derive(Debug, Deserialize)]
pub struct TokenizerCase {
    pub text: String,
    pub ids: Vec<u32>,
}

/// A golden fixture file.
#[derive(Debug, Deserialize)]
pub struct Golden {
    pub source: String,
    pub new_tokens: usize,
    pub cases: Vec<GoldenCase>,
    pub tokenizer: Vec<TokenizerCase>,
}

/// Path of a committed fixture (in `$PAGED_ENGINE_FIXTURES` when set, for
/// test binaries run away from their checkout, as on a GPU machine).
pub fn fixture_path(name: &str) -> PathBuf {
    match std::env::var_os("PAGED_ENGINE_FIXTURES") {
        Some(dir) => PathBuf::from(dir).join(name),
        None => Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("fixtures")
            .join(name),
    }
}

/// Reads and parses a golden fixture.
pub fn load_golden(name: &str) -> Golden {
    let path = fixture_path(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The default model, or a panic telling what to run.
pub fn default_model_path() -> PathBuf {
    let p = model_loader::paths::default_model_path();
    assert!(
        p.is_file(),
        "{} is missing: run `cargo xtask fetch-model`",
        p.display()
    );
    p
}

/// What our engine produced for one prompt.
#[derive(Debug, Clone, PartialEq)]
pub struct Decoded {
    pub ids: Vec<u32>,
    /// Per step: the full log-softmax row (f64), for comparing logprobs.
    pub logprobs: Vec<Vec<f64>>,
}

/// Log-softmax of one logits row, in f64.
pub fn log_softmax(row: &[f32]) -> Vec<f64> {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let sum: f64 = row.iter().map(|&x| (x as f64 - max).exp()).sum();
    let lse = max + sum.ln();
    row.iter().map(|&x| x as f64 - lse).collect()
}

/// Greedy-decodes every prompt for `new_tokens` steps, all prompts in one
/// batch per step (never stopping at EOS, as the fixtures do), through the
/// executor's paged KV cache with a fixed contiguous block layout.
pub fn greedy_batch<E: Executor>(
    exec: &mut E,
    prompts: &[Vec<u32>],
    new_tokens: usize,
) -> Vec<Decoded> {
    let bs = exec.block_size();
    let longest = prompts.iter().map(Vec::len).max().unwrap_or(0) + new_tokens;
    let layout = ContiguousLayout {
        block_size: bs,
        blocks_per_seq: longest.div_ceil(bs),
    };
    assert!(
        layout.blocks_per_seq * prompts.len() <= exec.num_blocks().0,
        "KV pool too small"
    );
    let ops = BlockOps::default();
    let mut out: Vec<Decoded> = prompts
        .iter()
        .map(|_| Decoded {
            ids: vec![],
            logprobs: vec![],
        })
        .collect();
    let mut past = vec![0usize; prompts.len()];
    let mut pending: Vec<Vec<u32>> = prompts.to_vec();
    for _ in 0..new_tokens {
        let mut batch = ForwardBatch::default();
        for (i, toks) in pending.iter().enumerate() {
            layout.push(&mut batch, i, past[i], toks, true);
        }
        let logits = exec
            .execute(&ops, &batch, &Sampling::Host)
            .and_then(StepOutput::into_logits)
            .expect("forward pass");
        for i in 0..prompts.len() {
            past[i] += pending[i].len();
            let row = logits.row(i);
            let next = argmax(row);
            out[i].ids.push(next);
            out[i].logprobs.push(log_softmax(row));
            pending[i] = vec![next];
        }
    }
    out
}

/// Compares our decode with the golden case: greedy ids must be equal, and
/// where the ids agree the top-5 logprobs must be within `tol`. Returns a
/// description of the first mismatch.
pub fn compare_with_golden(case: &GoldenCase, ours: &Decoded, tol: f64) -> Result<f64, String> {
    let mut worst: f64 = 0.0;
    for (step, (want, got)) in case.greedy_ids.iter().zip(&ours.ids).enumerate() {
        for &(id, lp) in &case.top5_logprobs[step] {
            let d = (ours.logprobs[step][id as usize] - lp).abs();
            worst = worst.max(d);
            if d > tol {
                return Err(format!(
                    "prompt {:?}: step {step}, token {id}: logprob {} vs reference {lp}",
                    case.text, ours.logprobs[step][id as usize]
                ));
            }
        }
        if want != got {
            return Err(format!(
                "prompt {:?}: step {step}: greedy id {got} vs reference {want} (ours so far {:?})",
                case.text,
                &ours.ids[..=step]
            ));
        }
    }
    Ok(worst)
}
