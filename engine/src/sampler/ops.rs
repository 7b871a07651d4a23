//! One sequence's draw from one logits row: penalties, `min_tokens`
//! suppression, temperature, top-k, top-p, min-p, then a draw with the
//! sequence's own generator; plus the raw top logprobs.
//!
//! Invariants:
//! - logprobs (of the chosen token and the top alternatives) are always taken
//!   from the raw row's log-softmax, as vLLM returns them by default; the
//!   processed distribution only decides which token is drawn;
//! - the uniform number of draw `i` of sequence `s` under seed `k` is a pure
//!   function of `(k, s, i)` ([`uniform`]), so a seeded request gives the same
//!   tokens whatever else is batched with it and across preemption;
//! - ties are broken towards the lowest token id everywhere.
//!
//! Cost: O(V) for greedy without penalties; O(V + H) with penalties (H the
//! history length); O(V log V) for a random draw without top-k (one sort of
//! the finite logits), O(V + k log k) with top-k.

use super::params::SamplingParams;
use super::{log_sum_exp, max_ignoring_nan, Sampler};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::cmp::Ordering;
use std::collections::{HashMap, HashSet};

/// What the sampler needs to know about one sequence.
#[derive(Debug, Clone, Copy)]
pub struct SeqContext<'a> {
    pub params: &'a SamplingParams,
    /// Prompt then output tokens so far.
    pub tokens: &'a [u32],
    pub prompt_len: usize,
    /// The request's seed (fixed when the request is added).
    pub seed: u64,
    /// The sequence's index in its group: its generator's stream.
    pub seq_index: usize,
    /// Ids suppressed while fewer than `min_tokens` tokens are generated.
    pub stop_ids: &'a [u32],
}

impl SeqContext<'_> {
    fn output_len(&self) -> usize {
        self.tokens.len().saturating_sub(self.prompt_len)
    }
}

/// One drawn token with its raw logprob and the raw top alternatives.
#[derive(Debug, Clone, PartialEq)]
pub struct SampleOut {
    pub token: u32,
    pub logprob: f32,
    /// `(token, logprob)` best first; `params.logprobs` entries.
    pub top_logprobs: Vec<(u32, f32)>,
}

/// The uniform number in [0, 1) of draw `step` of sequence `seq_index`
/// under `seed`: ChaCha8 keyed by the seed, one stream per sequence, the
/// word position by step.
pub fn uniform(seed: u64, seq_index: usize, step: usize) -> f64 {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(seq_index as u64);
    rng.set_word_pos(step as u128 * 2);
    rng.gen::<f64>()
}

/// Draws one token for `ctx` from `row`.
/// True when [`sample_row`] takes its plain greedy path and returns nothing
/// but the token and its logprob (no penalties, no top logprobs, no stop-id
/// suppression before `min_tokens`): then an executor's on-device argmax
/// (`Executor::execute_greedy`) gives the same answer. Keep in step with
/// `sample_row` when a new parameter changes the logits.
pub fn greedy_on_device(p: &SamplingParams, output_len: usize) -> bool {
    p.is_greedy()
        && !p.has_penalties()
        && p.logprobs.unwrap_or(0) == 0
        && output_len >= p.min_tokens
}

pub fn sample_row(row: &[f32], ctx: &SeqContext<'_>) -> SampleOut {
    let p = ctx.params;
    let max = max_ignoring_nan(row);
    let lse = log_sum_exp(row, max);
    let suppress = ctx.output_len() < p.min_tokens && !ctx.stop_ids.is_empty();
    let token = if p.is_greedy() && !p.has_penalties() && !suppress {
        Sampler.greedy(row).token
    } else {
        let mut logits = row.to_vec();
        apply_penalties(&mut logits, ctx.tokens, ctx.prompt_len, p);
        if suppress {
            for &id in ctx.stop_ids {
                if let Some(v) = logits.get_mut(id as usize) {
                    *v = f32::NEG_INFINITY;
                }
            }
        }
        if p.is_greedy() {
            Sampler.greedy(&logits).token
        } else {
            let u = uniform(ctx.seed, ctx.seq_index, ctx.output_len());
            draw(&logits, p, u)
        }
    };
    let raw = row.get(token as usize).copied().unwrap_or(f32::NAN);
    SampleOut {
        token,
        logprob: raw - lse,
        top_logprobs: top_logprobs_with(row, lse, p.logprobs.unwrap_or(0)),
    }
}

/// The `k` most likely tokens of `row` with their log-softmax values.
pub fn top_logprobs(row: &[f32], k: usize) -> Vec<(u32, f32)> {
    let lse = log_sum_exp(row, max_ignoring_nan(row));
    top_logprobs_with(row, lse, k)
}

fn top_logprobs_with(row: &[f32], lse: f32, k: usize) -> Vec<(u32, f32)> {
    if k == 0 {
        return Vec::new();
    }
    top_k_sorted(row, Some(k))
        .into_iter()
        .map(|(id, v)| (id, v - lse))
        .collect()
}

/// vLLM's penalties: repetition over prompt and output tokens, frequency and
/// presence over output tokens only.
pub fn apply_penalties(logits: &mut [f32], tokens: &[u32], prompt_len: usize, p: &SamplingParams) {
    if !p.has_penalties() {
        return;
    }
    if p.repetition_penalty != 1.0 {
        let seen: HashSet<u32> = tokens.iter().copied().collect();
        for id in seen {
            if let Some(v) = logits.get_mut(id as usize) {
                *v = if *v > 0.0 {
                    *v / p.repetition_penalty
                } else {
                    *v * p.repetition_penalty
                };
            }
        }
    }
    let mut counts: HashMap<u32, u32> = HashMap::new();
    for &t in tokens.get(prompt_len..).unwrap_or(&[]) {
        *counts.entry(t).or_default() += 1;
    }
    for (id, c) in counts {
        if let Some(v) = logits.get_mut(id as usize) {
            *v -= p.frequency_penalty * c as f32 + p.presence_penalty;
        }
    }
}

/// Descending by value, then ascending by id.
fn by_value_desc(a: &(u32, f32), b: &(u32, f32)) -> Ordering {
    b.1.partial_cmp(&a.1)
        .unwrap_or(Ordering::Equal)
        .then(a.0.cmp(&b.0))
}

/// The finite entries of `row` (the best `k` when given), sorted best first.
fn top_k_sorted(row: &[f32], k: Option<usize>) -> Vec<(u32, f32)> {
    let mut cands: Vec<(u32, f32)> = row
        .iter()
        .enumerate()
        .filter(|(_, v)| v.is_finite())
        .map(|(i, &v)| (i as u32, v))
        .collect();
    if let Some(k) = k.filter(|&k| k < cands.len()) {
        cands.select_nth_unstable_by(k, by_value_desc);
        cands.truncate(k);
    }
    cands.sort_unstable_by(by_value_desc);
    cands
}

/// The kept candidates (best first) and their unnormalized probabilities
/// after temperature, top-k, top-p and min-p.
pub fn truncated_distribution(logits: &[f32], p: &SamplingParams) -> Vec<(u32, f64)> {
    let cands = top_k_sorted(logits, p.top_k);
    let Some(&(_, best)) = cands.first() else {
        return Vec::new();
    };
    let t = f64::from(p.temperature.max(f32::MIN_POSITIVE));
    let mut probs: Vec<(u32, f64)> = cands
        .iter()
        .map(|&(id, v)| (id, ((f64::from(v) - f64::from(best)) / t).exp()))
        .collect();
    let total: f64 = probs.iter().map(|x| x.1).sum();
    // top-p: keep a token while the mass before it is below top_p.
    let mut before = 0.0;
    let keep_p = probs
        .iter()
        .take_while(|x| {
            let keep = before < f64::from(p.top_p) * total;
            before += x.1;
            keep
        })
        .count()
        .max(1);
    probs.truncate(keep_p);
    // min-p: relative to the most likely token (probs[0] is 1 before scaling).
    let floor = f64::from(p.min_p) * probs[0].1;
    let keep_min = probs.iter().take_while(|x| x.1 >= floor).count().max(1);
    probs.truncate(keep_min);
    probs
}

/// Inverse-CDF draw with `u` in [0, 1) from the truncated distribution.
fn draw(logits: &[f32], p: &SamplingParams, u: f64) -> u32 {
    let probs = truncated_distribution(logits, p);
    let total: f64 = probs.iter().map(|x| x.1).sum();
    let target = u * total;
    let mut acc = 0.0;
    for &(id, w) in &probs {
        acc += w;
        if target < acc {
            return id;
        }
    }
    probs.last().map_or(0, |x| x.0)
}
