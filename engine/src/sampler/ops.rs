//! One sequence's draw from one logits row: penalties, `min_tokens`
//! suppression, temperature, top-k, top-p, min-p, then a draw ([`draw`]: an
//! exponential race over Philox uniforms, the algorithm the sampling kernel
//! runs too, so on the same logits both draw the same token); plus the raw
//! top logprobs.
//!
//! Invariants:
//! - logprobs (of the chosen token and the top alternatives) are always taken
//!   from the raw row's log-softmax, as vLLM returns them by default; the
//!   processed distribution only decides which token is drawn;
//! - the uniform number of token `t` in draw `i` of sequence `s` under seed
//!   `k` is a pure function of `(k, s, i, t)` ([`uniform`]), so a seeded
//!   request gives the same tokens whatever else is batched with it, across
//!   preemption, and on the CPU or the GPU sampler (rounding aside);
//! - ties are broken towards the lowest token id everywhere.
//!
//! Cost: O(V) for greedy without penalties; O(V + H) with penalties (H the
//! history length); a random draw O(V) plus one Philox block per kept token,
//! plus O(V) for top-k (a selection) and O(K log K) for top-p (a sort of the
//! K top-k keeps).

use super::params::SamplingParams;
use super::{first_index_of, log_sum_exp, max_ignoring_nan, Sampler};
use gpu_kernels::philox;
use gpu_kernels::sampling::{exp_poly, order_key, race_score};
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

impl From<&engine_core::GreedyRow> for SampleOut {
    fn from(g: &engine_core::GreedyRow) -> Self {
        Self {
            token: g.token,
            logprob: g.logprob,
            top_logprobs: Vec::new(),
        }
    }
}

/// The uniform number in (0, 1) of token `token` in draw `step` of
/// sequence `seq_index` under `seed`: Philox4x32-10 keyed by the seed,
/// shared with the sampling kernel (`gpu_kernels::philox`).
pub fn uniform(seed: u64, seq_index: usize, step: usize, token: u32) -> f32 {
    philox::token_uniform(seed, seq_index as u32, step as u32, token)
}

/// True when [`sample_row`] takes its plain greedy path and returns nothing
/// but the token and its logprob (no penalties, no top logprobs, no stop-id
/// suppression before `min_tokens`): then an executor's on-device argmax
/// (`Sampling::Greedy`) gives the same answer. Keep in step with
/// `sample_row` when a new parameter changes the logits.
pub fn greedy_on_device(p: &SamplingParams, output_len: usize) -> bool {
    p.is_greedy()
        && !p.has_penalties()
        && p.logprobs.unwrap_or(0) == 0
        && output_len >= p.min_tokens
}

/// Draws one token for `ctx` from `row`.
pub fn sample_row(row: &[f32], ctx: &SeqContext<'_>) -> SampleOut {
    let p = ctx.params;
    let max = max_ignoring_nan(row);
    let lse = log_sum_exp(row, max);
    let suppress = ctx.output_len() < p.min_tokens && !ctx.stop_ids.is_empty();
    let token = if p.is_greedy() && !p.has_penalties() && !suppress {
        // The maximum and log-sum-exp are known: one more pass, not three.
        first_index_of(row, max).unwrap_or(0)
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
            draw(&logits, p, ctx.seed, ctx.seq_index, ctx.output_len())
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

/// The order key ([`order_key`]) at and above which a scaled logit is kept
/// by top-k then top-p: the largest `thr` such that at least `k` finite
/// entries have `key >= thr` and, among those top-k keeps, the mass
/// `sum exp(s)` over `key >= thr` is at least `top_p` of theirs (0: keep
/// all). The sampling kernel finds the same threshold by a bitwise search of
/// reductions; here it is read off a partial sort. `scaled` is reordered.
pub fn keep_threshold(scaled: &mut [(u32, f32)], p: &SamplingParams) -> u32 {
    let desc = |a: &(u32, f32), b: &(u32, f32)| b.1.partial_cmp(&a.1).unwrap_or(Ordering::Equal);
    let mut kept = scaled.len();
    let mut thr = 0;
    if let Some(k) = p.top_k.filter(|&k| k > 0 && k < scaled.len()) {
        scaled.select_nth_unstable_by(k - 1, desc);
        thr = order_key(scaled[k - 1].1);
        // Ties of the k-th value are kept too: move every key >= thr first.
        kept = partition(scaled, |x| order_key(x.1) >= thr);
    }
    if p.top_p < 1.0 {
        let top = &mut scaled[..kept];
        top.sort_unstable_by(desc);
        let z: f64 = top.iter().map(|x| f64::from(exp_poly(x.1))).sum();
        let target = f64::from(p.top_p) * z;
        let mut mass = 0.0;
        for x in top.iter() {
            mass += f64::from(exp_poly(x.1));
            if mass >= target {
                thr = order_key(x.1);
                break;
            }
        }
    }
    thr
}

/// Moves the entries satisfying `keep` to the front; returns their count.
fn partition(v: &mut [(u32, f32)], keep: impl Fn(&(u32, f32)) -> bool) -> usize {
    let mut n = 0;
    for i in 0..v.len() {
        if keep(&v[i]) {
            v.swap(n, i);
            n += 1;
        }
    }
    n
}

/// Draws from `logits` (temperature > 0): scaled logits `s = (l - max) / T`
/// over the finite entries, kept when `key(s) >=` [`keep_threshold`] and
/// `exp(s) >= min_p`; the token is the kept argmax of
/// `race_score(s, uniform(seed, seq_index, step, id))` (an exponential
/// race), lowest id on ties; token 0 when no logit is finite. The sampling
/// kernel (`gpu_kernels::sampling::sample_rows`) runs the same definition.
pub fn draw(logits: &[f32], p: &SamplingParams, seed: u64, seq_index: usize, step: usize) -> u32 {
    let max = max_ignoring_nan(logits);
    let inv_t = 1.0 / p.temperature;
    let mut scaled: Vec<(u32, f32)> = logits
        .iter()
        .enumerate()
        .filter(|(_, v)| v.is_finite())
        .map(|(i, &v)| (i as u32, (v - max) * inv_t))
        .collect();
    let thr = keep_threshold(&mut scaled, p);
    let mut best = (f32::NEG_INFINITY, u32::MAX);
    for &(id, s) in &scaled {
        if order_key(s) < thr || exp_poly(s) < p.min_p {
            continue;
        }
        let score = race_score(s, uniform(seed, seq_index, step, id));
        if score > best.0 || (score == best.0 && id < best.1) || best.1 == u32::MAX {
            best = (score, id);
        }
    }
    if best.1 == u32::MAX {
        0
    } else {
        best.1
    }
}
