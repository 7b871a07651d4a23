//! The one place a step's results change sequences:
//! [`Scheduler::update_from_output`] (vLLM v1's `update_from_output` in
//! spirit). The engine loop hands it the schedule it ran and the
//! [`StepOutcome`] it sampled from the executor's answer; everything a step
//! produced is applied here, in this order:
//! 1. the placeholders of sequences scheduled ahead (asynchronous
//!    scheduling, [`Ahead`]) replaced in the KV cache manager by their
//!    drawn tokens;
//! 2. prompt logprobs recorded (each position once);
//! 3. groups of width `w > 1` forked after their prompt's row (the `w`
//!    first tokens are `w` draws of that one row; the children share the
//!    prompt's blocks);
//! 4. drawn tokens appended, each sequence finished when a stop rule says
//!    so (its blocks freed at once);
//! 5. beam steps (`beam.rs`) of the groups whose beams all have candidates;
//! 6. speculative decoding's accepted tokens appended and its rejected
//!    slots rolled back (`spec.rs`);
//! 7. a failed step's requests aborted, and sequences left scheduled ahead
//!    of a token that was never drawn aborted.
//!
//! Invariants:
//! - a group that returns the best `n` of more (best_of > n, beam search)
//!   reports nothing until it finishes, then every chosen sequence whole;
//!   other groups stream each token in the step it is drawn;
//! - prompt logprobs ride on one output: a request's first output with
//!   tokens (its final one when outputs are buffered);
//! - a row whose sequence finished or changed after it was scheduled is
//!   stale ([`Scheduler::is_live`]) and its draw is dropped.
//!
//! Cost: O(rows) appends and finish checks, plus forks and beam steps
//! (O(width^2 log width) per beam group).

use super::ahead::Ahead;
use super::beam;
use super::output::{Outputs, RequestOutput};
use super::{
    FinishReason, RequestId, RequestParams, SampleTarget, Scheduler, SchedulerOutput, SeqStatus,
    SequenceGroup,
};
use crate::error::{EngineError, Report};
use crate::kv::KvCacheManager;
use crate::sampler::{PromptLogprob, SampleOut};
use std::collections::HashMap;

/// One draw: which logits row, which group, which sequence (maybe a
/// fork-to-be: `seq_index` past the group's sequences).
#[derive(Debug, Clone, Copy)]
pub struct Draw {
    pub row: usize,
    pub request_id: RequestId,
    pub seq_index: usize,
}

/// A step's draws made by the host (a mixed step's device rows included).
#[derive(Debug, Default)]
pub struct Drawn {
    pub draws: Vec<Draw>,
    /// One per draw (`None`: its group vanished).
    pub sampled: Vec<Option<SampleOut>>,
    /// Beam rows: each beam's next-token candidates, best first.
    pub beams: Vec<(SampleTarget, Vec<(u32, f32)>)>,
    /// Prompt positions scored this step: `(request, position, entry)`.
    pub prompt: Vec<(RequestId, usize, PromptLogprob)>,
    /// Per `SchedulerOutput::spec` entry, the draws after its target's,
    /// one per accepted proposal (see `Scheduler::apply_spec`).
    pub spec: Vec<Vec<SampleOut>>,
}

/// What a step produced, before any sequence changed.
#[derive(Debug)]
pub enum StepOutcome {
    /// The executor's draw per sampled row (greedy or sampled where the
    /// logits are), and per `SchedulerOutput::spec` entry the draws after
    /// its target's, one per accepted proposal.
    Device {
        rows: Vec<SampleOut>,
        spec: Vec<Vec<SampleOut>>,
    },
    /// Draws made by the host.
    Drawn(Drawn),
    /// The step failed: its requests are aborted.
    Failed(EngineError),
}

impl StepOutcome {
    /// The token drawn for each `(request, sequence index)` of the step's
    /// plain rows (beam rows are decided at the update).
    pub fn tokens(&self, targets: &[SampleTarget]) -> HashMap<(RequestId, usize), u32> {
        match self {
            Self::Device { rows, .. } => targets
                .iter()
                .zip(rows)
                .map(|(t, r)| ((t.request_id, t.seq_index), r.token))
                .collect(),
            Self::Drawn(d) => d
                .draws
                .iter()
                .zip(&d.sampled)
                .filter_map(|(d, s)| Some(((d.request_id, d.seq_index), s.as_ref()?.token)))
                .collect(),
            Self::Failed(_) => HashMap::new(),
        }
    }
}

/// Why a sequence that just got `token` stops, if it does.
pub fn finish_reason(
    params: &RequestParams,
    eos: &[u32],
    token: u32,
    output_len: usize,
    total_len: usize,
    max_model_len: usize,
) -> Option<FinishReason> {
    if params.stop_token_ids.contains(&token) || (!params.ignore_eos && eos.contains(&token)) {
        Some(FinishReason::Stop)
    } else if params.max_tokens.is_some_and(|m| output_len >= m) || total_len >= max_model_len {
        Some(FinishReason::Length)
    } else {
        None
    }
}

impl Scheduler {
    /// Applies everything step `sched` produced (see the module docs);
    /// news go to `outs`. `ahead` holds the sequences of this step that the
    /// next one was scheduled ahead of (empty in the synchronous loop).
    pub fn update_from_output(
        &mut self,
        kv: &mut dyn KvCacheManager,
        sched: &SchedulerOutput,
        outcome: StepOutcome,
        ahead: &Ahead,
        outs: &mut Outputs,
    ) {
        let broken = self.settle_ahead(kv, ahead);
        let spec = match outcome {
            StepOutcome::Device { rows, spec } => {
                self.apply_device_rows(kv, &sched.targets, rows, outs);
                spec
            }
            StepOutcome::Drawn(mut drawn) => {
                let spec = std::mem::take(&mut drawn.spec);
                self.apply_drawn(kv, drawn, outs);
                spec
            }
            StepOutcome::Failed(e) => {
                self.fail_step(kv, sched, e, outs);
                Vec::new()
            }
        };
        self.apply_spec(kv, &sched.targets, &sched.spec, spec, outs);
        self.abort_unsettled(kv, ahead, broken, outs);
    }

    /// Whether a row's sequence is still the one that was scheduled: alive,
    /// unfinished and with the same tokens.
    pub fn is_live(&self, t: &SampleTarget) -> bool {
        self.group(t.request_id)
            .and_then(|g| g.seqs.get(t.seq_index))
            .is_some_and(|s| !s.is_finished() && s.tokens.len() == t.num_tokens)
    }

    /// EOS (unless ignored) and the request's stop token ids.
    pub fn stop_ids(&self, g: &SequenceGroup) -> Vec<u32> {
        let mut ids = g.params.stop_token_ids.clone();
        if !g.params.ignore_eos {
            ids.extend_from_slice(&self.eos_token_ids);
        }
        ids
    }

    /// Appends the executor's draw of each live row.
    fn apply_device_rows(
        &mut self,
        kv: &mut dyn KvCacheManager,
        targets: &[SampleTarget],
        rows: Vec<SampleOut>,
        outs: &mut Outputs,
    ) {
        let mut appended = 0;
        for (row, (t, s)) in targets.iter().zip(rows).enumerate() {
            if !self.is_live(t) {
                continue;
            }
            appended += 1;
            let draw = Draw {
                row,
                request_id: t.request_id,
                seq_index: t.seq_index,
            };
            self.append_sampled(kv, draw, s, outs);
        }
        self.record_generated(appended);
    }

    /// Records prompt logprobs, forks, appends the host's draws, runs the
    /// beam steps.
    fn apply_drawn(&mut self, kv: &mut dyn KvCacheManager, drawn: Drawn, outs: &mut Outputs) {
        let Drawn {
            draws,
            sampled,
            beams,
            prompt,
            spec: _,
        } = drawn;
        for (id, position, entry) in prompt {
            if let Some(g) = self.groups.get_mut(&id) {
                g.record_prompt_logprob(position, entry);
            }
        }
        self.fork_groups(kv, &draws, outs);
        for (draw, s) in draws.iter().zip(sampled) {
            if let Some(s) = s {
                self.append_sampled(kv, *draw, s, outs);
            }
        }
        let generated = draws.len() + beams.len();
        self.apply_beam_rows(kv, beams, outs);
        self.record_generated(generated);
    }

    /// Creates the children of groups whose prompt row was just drawn.
    fn fork_groups(&mut self, kv: &mut dyn KvCacheManager, draws: &[Draw], outs: &mut Outputs) {
        for d in draws.iter().filter(|d| d.seq_index > 0) {
            let Some(g) = self.group(d.request_id) else {
                continue;
            };
            // Children are created in index order; later steps' draws of
            // existing sequences are skipped here.
            if g.seqs.len() != d.seq_index {
                continue;
            }
            if let Err(e) = self.fork_seq(kv, d.request_id, 0) {
                if self.abort(kv, d.request_id).is_some() {
                    outs.push_failed(d.request_id, e);
                }
            }
        }
    }

    /// Appends one drawn token, reports it (unless buffered) and finishes
    /// the sequence when a stop rule says so.
    pub(super) fn append_sampled(
        &mut self,
        kv: &mut dyn KvCacheManager,
        d: Draw,
        s: SampleOut,
        outs: &mut Outputs,
    ) {
        let max_model_len = self.config.max_model_len;
        let Some(group) = self.groups.get_mut(&d.request_id) else {
            return;
        };
        let cached = group.num_cached_tokens;
        let buffered = group.params.sampling.buffers_output();
        let min_tokens = group.params.sampling.min_tokens;
        let Some(seq) = group.seqs.get_mut(d.seq_index) else {
            return;
        };
        seq.tokens.push(s.token);
        seq.output_logprobs.push(s.logprob);
        seq.output_top_logprobs.push(s.top_logprobs.clone());
        let out_len = seq.output_tokens().len();
        let reason = finish_reason(
            &group.params,
            &self.eos_token_ids,
            s.token,
            out_len,
            seq.tokens.len(),
            max_model_len,
        )
        .filter(|r| *r != FinishReason::Stop || out_len >= min_tokens);
        if !buffered {
            let prompt_logprobs = group.take_prompt_logprobs();
            let out = outs.get(d.request_id);
            out.num_cached_tokens = cached;
            if prompt_logprobs.is_some() {
                out.prompt_logprobs = prompt_logprobs;
            }
            let so = out.seq_mut(d.seq_index);
            so.new_token_ids.push(s.token);
            so.new_logprobs.push(s.logprob);
            so.new_top_logprobs.push(s.top_logprobs);
            so.finish_reason = reason;
        }
        let Some(reason) = reason else {
            return;
        };
        if let Some(mut group) = self.finish_seq(kv, d.request_id, d.seq_index, reason) {
            if buffered {
                *outs.get(d.request_id) = best_of_output(&mut group);
            }
            outs.get(d.request_id).finished = true;
        }
    }

    /// Stores each beam's candidates; runs the beam step of every group
    /// whose live beams all have theirs.
    fn apply_beam_rows(
        &mut self,
        kv: &mut dyn KvCacheManager,
        rows: Vec<(SampleTarget, Vec<(u32, f32)>)>,
        outs: &mut Outputs,
    ) {
        let mut touched = Vec::new();
        for (t, candidates) in rows {
            let Some(g) = self.groups.get_mut(&t.request_id) else {
                continue;
            };
            if let Some(seq) = g.seqs.get_mut(t.seq_index) {
                seq.beam_candidates = Some(candidates);
            }
            if !touched.contains(&t.request_id) {
                touched.push(t.request_id);
            }
        }
        for id in touched {
            let eos = self.eos_token_ids.clone();
            if let Some(mut group) = beam::step(self, kv, id, &eos) {
                *outs.get(id) = beam::final_output(&mut group);
                outs.get(id).finished = true;
            }
        }
    }

    /// Aborts every request the failed step touched.
    fn fail_step(
        &mut self,
        kv: &mut dyn KvCacheManager,
        sched: &SchedulerOutput,
        error: EngineError,
        outs: &mut Outputs,
    ) {
        tracing::error!(error = %Report(&error), "step failed; aborting its requests");
        for &id in sched.scheduled.iter().chain(&sched.preempted) {
            if self.abort(kv, id).is_some() {
                outs.push_failed(id, error.clone());
            }
        }
    }

    /// Writes the drawn tokens over the placeholders the next step was
    /// scheduled with, in the KV cache manager's record. Returns the groups
    /// whose manager refused.
    fn settle_ahead(
        &mut self,
        kv: &mut dyn KvCacheManager,
        ahead: &Ahead,
    ) -> Vec<(RequestId, EngineError)> {
        ahead
            .patched()
            .filter_map(|(request_id, seq_id, token)| {
                kv.replace_last_token(seq_id, token)
                    .err()
                    .map(|e| (request_id, e.into()))
            })
            .collect()
    }

    /// Aborts the groups whose placeholder could not be replaced: the KV
    /// cache manager refused, or no token was drawn for a sequence the next
    /// step computes (its `num_computed_tokens` ran ahead of its tokens).
    fn abort_unsettled(
        &mut self,
        kv: &mut dyn KvCacheManager,
        ahead: &Ahead,
        broken: Vec<(RequestId, EngineError)>,
        outs: &mut Outputs,
    ) {
        let mut failed = broken;
        for (request_id, seq_index) in ahead.sequences() {
            let ran_ahead = self
                .group(request_id)
                .and_then(|g| g.seqs.get(seq_index))
                .is_some_and(|q| !q.is_finished() && q.num_computed_tokens > q.tokens.len());
            if ran_ahead {
                let e = EngineError::Inconsistent(
                    "no token was drawn for a sequence scheduled ahead".into(),
                );
                failed.push((request_id, e));
            }
        }
        for (id, e) in failed {
            tracing::error!(request = %id, error = %Report(&e), "overlapped step failed; aborting");
            if self.abort(kv, id).is_some() {
                outs.push_failed(id, e);
            }
        }
    }
}

/// The best `n` finished sequences by cumulative logprob, whole (with the
/// prompt logprobs, when asked).
fn best_of_output(group: &mut SequenceGroup) -> RequestOutput {
    let mut order: Vec<usize> = (0..group.seqs.len()).collect();
    order.sort_by(|&a, &b| {
        let (ca, cb) = (
            group.seqs[a].cumulative_logprob(),
            group.seqs[b].cumulative_logprob(),
        );
        cb.partial_cmp(&ca)
            .unwrap_or(std::cmp::Ordering::Equal)
            .then(a.cmp(&b))
    });
    let mut out = RequestOutput::new(group.request_id);
    out.num_cached_tokens = group.num_cached_tokens;
    out.prompt_logprobs = group.take_prompt_logprobs();
    for (rank, &i) in order.iter().take(group.params.sampling.n).enumerate() {
        let seq = &group.seqs[i];
        let so = out.seq_mut(rank);
        so.new_token_ids = seq.output_tokens().to_vec();
        so.new_logprobs = seq.output_logprobs.clone();
        so.new_top_logprobs = seq.output_top_logprobs.clone();
        so.finish_reason = match seq.status {
            SeqStatus::Finished(r) => Some(r),
            _ => None,
        };
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finish_rules() {
        let p = RequestParams {
            max_tokens: Some(3),
            stop_token_ids: vec![7],
            ..RequestParams::default()
        };
        assert_eq!(
            finish_reason(&p, &[2], 2, 1, 5, 100),
            Some(FinishReason::Stop)
        );
        assert_eq!(
            finish_reason(&p, &[2], 7, 1, 5, 100),
            Some(FinishReason::Stop)
        );
        assert_eq!(finish_reason(&p, &[2], 5, 1, 5, 100), None);
        assert_eq!(
            finish_reason(&p, &[2], 5, 3, 5, 100),
            Some(FinishReason::Length)
        );
        assert_eq!(
            finish_reason(&p, &[2], 5, 1, 100, 100),
            Some(FinishReason::Length)
        );
        let ignore = RequestParams {
            ignore_eos: true,
            ..p
        };
        assert_eq!(finish_reason(&ignore, &[2], 2, 1, 5, 100), None);
    }
}
