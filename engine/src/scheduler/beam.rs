//! Beam search inside the engine, on shared blocks.
//!
//! A beam group's live sequences are its beams. Each step, once every live
//! beam has its next-token candidates (its top `2 x width` raw logprobs):
//! 1. all candidates are ranked by cumulative logprob (ties: lower beam,
//!    then lower token id);
//! 2. walking that ranking, a stop token (EOS unless ignored, or a stop
//!    token id, once `min_tokens` are generated) ranked within the first
//!    `width` becomes a finished hypothesis, kept apart; any other candidate
//!    becomes a new beam, until `width` new beams are chosen;
//! 3. the first new beam of a parent continues the parent's sequence; each
//!    further one forks it (all blocks shared; the next append copies the
//!    last partial block); parents with no new beam are freed;
//! 4. at `max_tokens` (or `max_model_len`) the new beams become hypotheses.
//!
//! Score of a hypothesis: cumulative logprob / output_len ^ length_penalty.
//! The search ends when `max_tokens` is reached, no beam is left, or
//! `width` hypotheses exist and either `early_stopping` is set or the best
//! live beam's current score is no better than the worst of the best
//! `width` hypotheses (Hugging Face's heuristic). The best `n` hypotheses
//! are returned.
//!
//! Cost per step: O(width^2 log width) for the ranking, plus the forks.

use super::output::RequestOutput;
use super::update::finish_reason;
use super::{FinishReason, Hypothesis, RequestId, Scheduler, SequenceGroup};
use crate::kv::KvCacheManager;

/// One ranked candidate: parent beam, token, its logprob, new cumulative.
#[derive(Debug, Clone, Copy)]
struct Cand {
    beam: usize,
    token: u32,
    logprob: f32,
    cum: f64,
}

/// What this step decided.
struct Decision {
    beams: Vec<Cand>,
    hypotheses: Vec<Hypothesis>,
    done: bool,
}

/// Runs one beam step for `id` if all its beams have candidates. Returns
/// the finished group when the search ended.
pub(super) fn step(
    sched: &mut Scheduler,
    kv: &mut dyn KvCacheManager,
    id: RequestId,
    eos: &[u32],
) -> Option<SequenceGroup> {
    let max_model_len = sched.config().max_model_len;
    let group = sched.group(id)?;
    if group.seqs.iter().any(|s| s.beam_candidates.is_none()) {
        return None;
    }
    let d = decide(group, eos, max_model_len);
    let group = sched.groups.get_mut(&id)?;
    group.hypotheses.extend(d.hypotheses);
    if d.done || d.beams.is_empty() {
        rank_hypotheses(group);
        return sched.finish_group(kv, id, FinishReason::Stop);
    }
    if let Err(e) = apply(sched, kv, id, &d.beams) {
        tracing::error!(request = %id, error = %e, "beam fork failed");
        return sched.abort(kv, id);
    }
    None
}

/// Ranks the candidates and splits them into new beams and hypotheses.
fn decide(group: &SequenceGroup, eos: &[u32], max_model_len: usize) -> Decision {
    let p = &group.params;
    let width = p.sampling.width();
    let mut cands = Vec::new();
    for (b, seq) in group.seqs.iter().enumerate() {
        let cum = seq.cumulative_logprob();
        for &(token, logprob) in seq.beam_candidates.iter().flatten().take(2 * width) {
            cands.push(Cand {
                beam: b,
                token,
                logprob,
                cum: cum + f64::from(logprob),
            });
        }
    }
    cands.sort_by(|a, b| {
        b.cum
            .partial_cmp(&a.cum)
            .unwrap_or(std::cmp::Ordering::Equal)
            .then(a.beam.cmp(&b.beam))
            .then(a.token.cmp(&b.token))
    });
    let out_len = group.seqs.first().map_or(0, |s| s.output_tokens().len()) + 1;
    let total_len = group.seqs.first().map_or(0, |s| s.tokens.len()) + 1;
    let mut d = Decision {
        beams: Vec::new(),
        hypotheses: Vec::new(),
        done: false,
    };
    for (rank, c) in cands.iter().enumerate() {
        let reason = finish_reason(p, eos, c.token, out_len, total_len, max_model_len);
        let is_stop = reason == Some(FinishReason::Stop);
        if is_stop && out_len >= p.sampling.min_tokens {
            if rank < width {
                d.hypotheses.push(hypothesis(group, c, FinishReason::Stop));
            }
        } else if !is_stop {
            d.beams.push(*c);
            if d.beams.len() == width {
                break;
            }
        }
    }
    let at_length = p.max_tokens.is_some_and(|m| out_len >= m) || total_len >= max_model_len;
    if at_length {
        let beams = std::mem::take(&mut d.beams);
        d.hypotheses.extend(
            beams
                .iter()
                .map(|c| hypothesis(group, c, FinishReason::Length)),
        );
        d.done = true;
    } else {
        d.done = enough_hypotheses(group, &d, out_len);
    }
    d
}

/// Whether the finished hypotheses can no longer be beaten (see module docs).
fn enough_hypotheses(group: &SequenceGroup, d: &Decision, out_len: usize) -> bool {
    let s = &group.params.sampling;
    let width = s.width();
    let mut scores: Vec<f64> = group
        .hypotheses
        .iter()
        .chain(&d.hypotheses)
        .map(|h| h.score)
        .collect();
    if scores.len() < width {
        return false;
    }
    if s.early_stopping {
        return true;
    }
    scores.sort_by(|a, b| b.partial_cmp(a).unwrap_or(std::cmp::Ordering::Equal));
    let worst_kept = scores[width - 1];
    let best_live = d
        .beams
        .iter()
        .map(|c| score(c.cum, out_len, s.length_penalty))
        .fold(f64::NEG_INFINITY, f64::max);
    best_live <= worst_kept
}

/// Cumulative logprob over `len ^ length_penalty`.
pub fn score(cum: f64, len: usize, length_penalty: f32) -> f64 {
    cum / (len.max(1) as f64).powf(f64::from(length_penalty))
}

fn hypothesis(group: &SequenceGroup, c: &Cand, reason: FinishReason) -> Hypothesis {
    let seq = &group.seqs[c.beam];
    let k = group.params.sampling.logprobs.unwrap_or(0);
    let mut output_tokens = seq.output_tokens().to_vec();
    output_tokens.push(c.token);
    let mut logprobs = seq.output_logprobs.clone();
    logprobs.push(c.logprob);
    let mut top_logprobs = seq.output_top_logprobs.clone();
    top_logprobs.push(top_k(seq.beam_candidates.as_deref(), k));
    Hypothesis {
        score: score(
            c.cum,
            output_tokens.len(),
            group.params.sampling.length_penalty,
        ),
        output_tokens,
        logprobs,
        top_logprobs,
        reason,
    }
}

fn top_k(cands: Option<&[(u32, f32)]>, k: usize) -> Vec<(u32, f32)> {
    cands.map_or_else(Vec::new, |c| c.iter().take(k).copied().collect())
}

/// Forks and appends the new beams, frees the dropped ones.
fn apply(
    sched: &mut Scheduler,
    kv: &mut dyn KvCacheManager,
    id: RequestId,
    beams: &[Cand],
) -> Result<(), crate::error::EngineError> {
    let num_parents = sched.group(id).map_or(0, |g| g.seqs.len());
    let mut used = vec![false; num_parents];
    let mut targets = Vec::with_capacity(beams.len());
    for c in beams {
        let index = if used[c.beam] {
            sched.fork_seq(kv, id, c.beam)?
        } else {
            used[c.beam] = true;
            c.beam
        };
        targets.push((index, *c));
    }
    let Some(group) = sched.groups.get_mut(&id) else {
        return Ok(());
    };
    let k = group.params.sampling.logprobs.unwrap_or(0);
    for &(index, c) in &targets {
        let top = top_k(group.seqs[c.beam].beam_candidates.as_deref(), k);
        let seq = &mut group.seqs[index];
        seq.tokens.push(c.token);
        seq.output_logprobs.push(c.logprob);
        seq.output_top_logprobs.push(top);
    }
    for seq in &mut group.seqs {
        seq.beam_candidates = None;
    }
    let mut keep = used;
    keep.resize(num_parents + targets.len(), true);
    sched.retain_seqs(kv, id, &keep);
    Ok(())
}

/// Sorts a group's hypotheses best first (ties: earlier found first).
fn rank_hypotheses(group: &mut SequenceGroup) {
    group.hypotheses.sort_by(|a, b| {
        b.score
            .partial_cmp(&a.score)
            .unwrap_or(std::cmp::Ordering::Equal)
    });
}

/// The best `n` hypotheses as one final output (with the prompt logprobs,
/// when asked).
pub(super) fn final_output(group: &mut SequenceGroup) -> RequestOutput {
    let mut out = RequestOutput::new(group.request_id);
    out.num_cached_tokens = group.num_cached_tokens;
    out.prompt_logprobs = group.take_prompt_logprobs();
    for (i, h) in group
        .hypotheses
        .iter()
        .take(group.params.sampling.n)
        .enumerate()
    {
        let so = out.seq_mut(i);
        so.new_token_ids = h.output_tokens.clone();
        so.new_logprobs = h.logprobs.clone();
        so.new_top_logprobs = h.top_logprobs.clone();
        so.finish_reason = Some(h.reason);
    }
    out
}
