//! From logits rows to appended tokens: draws (in parallel over rows), forks
//! of parallel-sampling groups after their prompt, beam-search steps, finish
//! checks and outputs.
//!
//! Invariants:
//! - a group of width `w > 1` (n / best_of) forks after its prompt's logits
//!   row: the prompt is computed once, the `w` first tokens are `w` draws
//!   from that one row with streams `0..w`, and the children share the
//!   prompt's blocks;
//! - a group that returns the best `n` of more (best_of > n, beam search)
//!   reports nothing until it finishes, then every chosen sequence whole;
//!   other groups stream each token in the step it is drawn.
//!
//! - prompt logprobs: row `targets.len() + i` scores `prompt_targets[i]`;
//!   each position is recorded once in its group (a recomputed chunk adds
//!   nothing) and the complete list rides on one output.
//!
//! - a row with a grammar mask or a `logit_bias` is copied, biased, then
//!   masked (disallowed tokens at `-inf`) before the draw; its logprobs are
//!   those of that processed row (vLLM also applies the grammar bitmask
//!   before its sampler computes logprobs; for `logit_bias` vLLM reports
//!   the unbiased logprobs, we report the biased ones).
//!
//! Cost: O(rows x vocab) for the draws (see `sampler::ops`) and for the
//! prompt rows, plus O(width x candidates) per beam group.

use super::overlap::StepResult;
use super::{finish_reason, LlmEngine, Outputs};
use crate::error::EngineError;
use crate::executor::{ExecError, Executor, Logits};
use crate::grammar::Mask;
use crate::sampler::device::{DeviceDraws, DeviceOut, DeviceRow, Fill, Processing};
use crate::sampler::{
    greedy_on_device, prompt_logprob, sample_row, top_logprobs, SampleOut, SeqContext,
};
use crate::scheduler::{FinishReason, RequestId, SampleTarget, SchedulerOutput, SequenceGroup};
use std::collections::HashMap;

/// One draw: which row, which group, which sequence (maybe a fork-to-be).
#[derive(Debug, Clone, Copy)]
pub(super) struct Draw {
    pub row: usize,
    pub request_id: RequestId,
    pub seq_index: usize,
}

/// A step's draws before they are appended.
pub(super) struct Drawn {
    pub draws: Vec<Draw>,
    /// One per draw (`None`: its group vanished).
    pub sampled: Vec<Option<SampleOut>>,
    /// Beam-search rows (their candidates are taken at commit).
    pub beams: Vec<(usize, SampleTarget)>,
}

/// A step's outcome after sampling, before any sequence changes.
pub(super) enum Sampled {
    /// The executor's draw per sampled row (greedy or sampled where the
    /// logits are: `DevicePath`).
    Device(Vec<SampleOut>),
    /// Host draws from the logits (kept for the beam rows).
    Drawn(Drawn, Logits),
    /// The step failed: its requests are aborted at commit.
    Failed(EngineError),
}

impl Sampled {
    /// The token drawn for each (request, sequence index) of the step's
    /// plain rows (beam rows are decided at commit).
    pub(super) fn tokens(&self, targets: &[SampleTarget]) -> HashMap<(RequestId, usize), u32> {
        match self {
            Self::Device(rows) => targets
                .iter()
                .zip(rows)
                .map(|(t, r)| ((t.request_id, t.seq_index), r.token))
                .collect(),
            Self::Drawn(d, _) => d
                .draws
                .iter()
                .zip(&d.sampled)
                .filter_map(|(d, s)| Some(((d.request_id, d.seq_index), s.as_ref()?.token)))
                .collect(),
            Self::Failed(_) => HashMap::new(),
        }
    }
}

impl LlmEngine {
    /// Checks the executor's answer against the schedule, scores prompt
    /// rows and draws the sampled rows. Sequences keep their tokens; only
    /// prompt logprobs are recorded here.
    pub(super) fn sample_step(
        &mut self,
        sched: &SchedulerOutput,
        result: Result<StepResult, ExecError>,
        masks: &[Option<Mask>],
    ) -> Sampled {
        self.count_slots.step_done(
            matches!(result, Ok(StepResult::Device(_))),
            matches!(result, Ok(StepResult::Logits(_))),
        );
        let rows = sched.targets.len() + sched.prompt_targets.len();
        match result {
            Ok(StepResult::Device(out)) => self.device_result(sched, out),
            Ok(StepResult::Logits(logits)) if logits.rows == rows => {
                self.apply_prompt_rows(sched, &logits, sched.targets.len());
                let drawn = self.draw_rows(&sched.targets, &logits, masks);
                Sampled::Drawn(drawn, logits)
            }
            Ok(StepResult::Logits(logits)) => Sampled::Failed(EngineError::Executor(format!(
                "{} logits rows for {} sampled and {} prompt rows",
                logits.rows,
                sched.targets.len(),
                sched.prompt_targets.len()
            ))),
            Err(e) => Sampled::Failed(e.into()),
        }
    }

    /// The one place a step's results change sequences: appends the drawn
    /// tokens (forks, beam steps, finishes, outputs), or aborts the step's
    /// requests when it failed.
    pub(super) fn commit_step(
        &mut self,
        sched: &SchedulerOutput,
        sampled: Sampled,
        outs: &mut Outputs,
    ) {
        match sampled {
            Sampled::Device(rows) => self.apply_device_rows(&sched.targets, rows, outs),
            Sampled::Drawn(drawn, logits) => self.commit_draws(drawn, &logits, outs),
            Sampled::Failed(e) => self.fail_step(sched, e, outs),
        }
    }

    /// Draws every live row (changes no sequence).
    pub(super) fn draw_rows(
        &self,
        targets: &[SampleTarget],
        logits: &Logits,
        masks: &[Option<Mask>],
    ) -> Drawn {
        let (draws, beams) = self.plan_draws(targets);
        let sampled = self.run_draws(&draws, logits, masks);
        Drawn {
            draws,
            sampled,
            beams,
        }
    }

    /// Forks, appends the drawn tokens, runs the beam steps.
    pub(super) fn commit_draws(&mut self, drawn: Drawn, logits: &Logits, outs: &mut Outputs) {
        let Drawn {
            draws,
            sampled,
            beams,
        } = drawn;
        self.fork_groups(&draws, outs);
        for (draw, s) in draws.iter().zip(sampled) {
            self.append_sampled(*draw, s, outs);
        }
        self.apply_beam_rows(&beams, logits, outs);
        self.scheduler.record_generated(draws.len() + beams.len());
    }

    /// Whether a row's sequence is still the one that was scheduled: alive,
    /// unfinished and with the same tokens. A stale row (its sequence
    /// finished or was aborted after the row was scheduled, which the
    /// overlapped loop allows) is dropped.
    pub(super) fn is_live(&self, t: &SampleTarget) -> bool {
        self.scheduler
            .group(t.request_id)
            .and_then(|g| g.seqs.get(t.seq_index))
            .is_some_and(|s| !s.is_finished() && s.tokens.len() == t.num_tokens)
    }

    /// Which draws the executor may make where the logits are: plain greedy
    /// steps through `execute_greedy` (12 bytes per row), other steps whose
    /// every row has a [`DeviceRow`] through `execute_sampled`; anything else
    /// (a row needing the logits) takes the logits path. Called once per
    /// launched step, before its batch is moved out (a slot refill may read
    /// the step's input ids); claims the count slots the step uses.
    pub(super) fn device_path(&mut self, sched: &SchedulerOutput) -> DevicePath {
        if self.all_rows_plain_greedy(sched) {
            DevicePath::Greedy
        } else if let Some(draws) = self.device_rows(sched) {
            DevicePath::Sampled(draws)
        } else {
            DevicePath::Logits
        }
    }

    /// True when every row of the step is a plain greedy draw (one sequence,
    /// no beam, no prompt rows, and `sampler::greedy_on_device`), so the
    /// executor may reduce the rows where the logits are.
    pub(super) fn all_rows_plain_greedy(&self, sched: &SchedulerOutput) -> bool {
        !sched.targets.is_empty()
            && sched.prompt_targets.is_empty()
            && sched.targets.iter().all(|t| {
                self.scheduler.group(t.request_id).is_some_and(|g| {
                    let p = &g.params.sampling;
                    !p.use_beam_search
                        && p.width() == 1
                        && p.structured.is_none()
                        && p.logit_bias.is_empty()
                        && g.seqs.get(t.seq_index).is_some_and(|s| {
                            greedy_on_device(p, s.tokens.len().saturating_sub(s.prompt_len))
                        })
                })
            })
    }

    /// Each row's device draw, or `None` when the step takes the logits
    /// path: a row has a grammar, a row has penalties and the executor
    /// cannot keep counts, or no row is drawn on the device. Rows the host
    /// draws (beam search, a group about to fork, prompt rows) are
    /// `host_rows`: a mixed step. Rows with penalties get a count slot,
    /// filled from their sequence's tokens when the device's counts do not
    /// hold them.
    fn device_rows(&mut self, sched: &SchedulerOutput) -> Option<DeviceDraws> {
        if sched.targets.is_empty() {
            return None;
        }
        // Host rows' device draws are unused: the cheapest draw.
        let unused = DeviceRow::of(&crate::sampler::SamplingParams::default(), 0, 0, 0);
        let mut host_rows = Vec::new();
        let mut plan = Vec::with_capacity(sched.targets.len());
        for (i, t) in sched.targets.iter().enumerate() {
            let g = self.scheduler.group(t.request_id)?;
            let p = &g.params.sampling;
            if p.structured.is_some() {
                return None;
            }
            if p.use_beam_search || needs_fork(g) {
                host_rows.push(i as u32);
                plan.push((unused, None, false));
                continue;
            }
            let s = g.seqs.get(t.seq_index)?;
            // The count when scheduled, not now: with asynchronous
            // scheduling the previous step's token may not be appended
            // yet, and the draw's counter must be the synchronous loop's.
            let output_len = t.num_tokens.saturating_sub(s.prompt_len);
            let row = DeviceRow::of(p, g.seed, t.seq_index, output_len);
            let stops = if output_len < p.min_tokens {
                self.stop_ids(g)
            } else {
                Vec::new()
            };
            let processing = Processing::of(p, output_len, &stops);
            if p.has_penalties() && !has_history(sched, i, s) {
                return None;
            }
            plan.push((row, processing, p.has_penalties()));
        }
        if host_rows.len() == sched.targets.len() {
            return None;
        }
        let first_prompt_row = sched.targets.len() as u32;
        host_rows.extend((0..sched.prompt_targets.len() as u32).map(|j| first_prompt_row + j));
        let penalized = || {
            plan.iter()
                .zip(&sched.targets)
                .filter(|(x, _)| x.2)
                .map(|(_, t)| (t.request_id, t.seq_index))
        };
        if penalized().next().is_some() {
            if !self.count_slots.supported() {
                return None;
            }
            let scheduler = &self.scheduler;
            let keys: Vec<_> = penalized().collect();
            self.count_slots.reserve(&keys, |&(id, i)| {
                scheduler
                    .group(id)
                    .and_then(|g| g.seqs.get(i))
                    .is_some_and(|s| !s.is_finished())
            });
        }
        let draws = self.claim_slots(sched, plan, host_rows);
        if draws.is_none() {
            // Claims made before the refusal: forget them (no draw follows).
            self.count_slots.step_done(false, false);
        }
        draws
    }

    /// The step's [`DeviceDraws`] from its planned rows: each row with
    /// penalties claims its count slot (room was reserved), and a fill
    /// where the device's counts do not hold the sequence's tokens.
    fn claim_slots(
        &mut self,
        sched: &SchedulerOutput,
        plan: Vec<(DeviceRow, Option<Processing>, bool)>,
        host_rows: Vec<u32>,
    ) -> Option<DeviceDraws> {
        let unused = DeviceRow::of(&crate::sampler::SamplingParams::default(), 0, 0, 0);
        let mut draws = DeviceDraws {
            host_rows,
            ..DeviceDraws::default()
        };
        for (i, (row, mut processing, pen)) in plan.into_iter().enumerate() {
            if let (true, Some(p)) = (pen, processing.as_mut()) {
                let t = &sched.targets[i];
                let (slot, fill) = self
                    .count_slots
                    .claim((t.request_id, t.seq_index), t.num_tokens)?;
                p.slot = Some(slot);
                if fill {
                    let g = self.scheduler.group(t.request_id)?;
                    let s = g.seqs.get(t.seq_index)?;
                    let tokens = history(sched, i, s)?;
                    draws
                        .fills
                        .push(Fill::from_tokens(slot, &tokens, s.prompt_len));
                }
            }
            draws.push(row, processing);
        }
        for _ in &sched.prompt_targets {
            draws.push(unused, None);
        }
        draws.slots = self.count_slots.capacity();
        Some(draws)
    }

    /// Appends the executor's draw of each row (see
    /// [`Self::device_path`]): the token, logprob and top logprobs the
    /// CPU sampler would give on the same logits.
    fn apply_device_rows(
        &mut self,
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
            self.append_sampled(draw, Some(s), outs);
        }
        self.scheduler.record_generated(appended);
    }

    /// Scores this step's prompt rows (in parallel; prompt row `i` is
    /// `logits` row `base + i`) and records them in their groups.
    pub(super) fn apply_prompt_rows(
        &mut self,
        sched: &SchedulerOutput,
        logits: &Logits,
        base: usize,
    ) {
        use rayon::prelude::*;
        let work: Vec<(usize, u32, usize)> = sched
            .prompt_targets
            .iter()
            .enumerate()
            .filter_map(|(i, t)| {
                let g = self.scheduler.group(t.request_id)?;
                let token = *g.seqs.first()?.tokens.get(t.position)?;
                Some((base + i, token, g.params.sampling.prompt_logprobs?))
            })
            .collect();
        let entries: Vec<_> = work
            .par_iter()
            .map(|&(row, token, k)| prompt_logprob(logits.row(row), token, k))
            .collect();
        for (t, e) in sched.prompt_targets.iter().zip(entries) {
            if let Some(g) = self.scheduler.group_mut(t.request_id) {
                g.record_prompt_logprob(t.position, e);
            }
        }
    }

    /// Splits rows into draws (one per sequence, `width` for a group about
    /// to fork) and beam rows.
    pub(super) fn plan_draws(
        &self,
        targets: &[SampleTarget],
    ) -> (Vec<Draw>, Vec<(usize, SampleTarget)>) {
        let mut draws = Vec::with_capacity(targets.len());
        let mut beams = Vec::new();
        for (row, t) in targets.iter().enumerate() {
            let Some(g) = self.scheduler.group(t.request_id) else {
                continue;
            };
            if !self.is_live(t) {
                continue;
            }
            if g.params.sampling.use_beam_search {
                beams.push((row, *t));
            } else if needs_fork(g) {
                draws.extend((0..g.params.sampling.width()).map(|seq_index| Draw {
                    row,
                    request_id: t.request_id,
                    seq_index,
                }));
            } else {
                draws.push(Draw {
                    row,
                    request_id: t.request_id,
                    seq_index: t.seq_index,
                });
            }
        }
        (draws, beams)
    }

    /// Runs the draws, in parallel when there are several. A draw for a
    /// fork-to-be uses the parent's history and its own stream.
    pub(super) fn run_draws(
        &self,
        draws: &[Draw],
        logits: &Logits,
        masks: &[Option<Mask>],
    ) -> Vec<Option<SampleOut>> {
        use rayon::prelude::*;
        let stops: HashMap<RequestId, Vec<u32>> = draws
            .iter()
            .filter_map(|d| {
                self.scheduler
                    .group(d.request_id)
                    .map(|g| (d.request_id, g))
            })
            .map(|(id, g)| (id, self.stop_ids(g)))
            .collect();
        let ctx = |d: &Draw| -> Option<SeqContext<'_>> {
            let g = self.scheduler.group(d.request_id)?;
            let seq = g.seqs.get(d.seq_index).or_else(|| g.seqs.first())?;
            Some(SeqContext {
                params: &g.params.sampling,
                tokens: &seq.tokens,
                prompt_len: seq.prompt_len,
                seed: g.seed,
                seq_index: d.seq_index,
                stop_ids: stops.get(&d.request_id).map_or(&[], Vec::as_slice),
            })
        };
        let work: Vec<Option<(usize, SeqContext<'_>)>> =
            draws.iter().map(|d| ctx(d).map(|c| (d.row, c))).collect();
        let one = |w: &Option<(usize, SeqContext<'_>)>| {
            w.as_ref().map(|(row, c)| {
                let mask = masks.get(*row).and_then(Option::as_ref);
                match processed_row(logits.row(*row), &c.params.logit_bias, mask) {
                    Some(processed) => sample_row(&processed, c),
                    None => sample_row(logits.row(*row), c),
                }
            })
        };
        if work.len() < 2 {
            work.iter().map(one).collect()
        } else {
            work.par_iter().map(one).collect()
        }
    }

    /// EOS (unless ignored) and the request's stop token ids.
    fn stop_ids(&self, g: &SequenceGroup) -> Vec<u32> {
        let mut ids = g.params.stop_token_ids.clone();
        if !g.params.ignore_eos {
            ids.extend_from_slice(&self.eos_token_ids);
        }
        ids
    }

    /// Creates the children of groups whose prompt row was just drawn.
    fn fork_groups(&mut self, draws: &[Draw], outs: &mut Outputs) {
        for d in draws.iter().filter(|d| d.seq_index > 0) {
            let Some(g) = self.scheduler.group(d.request_id) else {
                continue;
            };
            // Children are created in index order; later steps' draws of
            // existing sequences are skipped here.
            if g.seqs.len() != d.seq_index {
                continue;
            }
            if let Err(e) = self.scheduler.fork_seq(self.kv.as_mut(), d.request_id, 0) {
                if self
                    .scheduler
                    .abort(self.kv.as_mut(), d.request_id)
                    .is_some()
                {
                    outs.push_failed(d.request_id, e);
                }
            }
        }
    }

    /// Appends one drawn token, reports it (unless buffered) and finishes
    /// the sequence when a stop rule says so.
    fn append_sampled(&mut self, d: Draw, s: Option<SampleOut>, outs: &mut Outputs) {
        let Some(s) = s else {
            return;
        };
        let max_model_len = self.scheduler.config().max_model_len;
        let Some(group) = self.scheduler.group_mut(d.request_id) else {
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
        let done = self
            .scheduler
            .finish_seq(self.kv.as_mut(), d.request_id, d.seq_index, reason);
        if let Some(mut group) = done {
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
        rows: &[(usize, SampleTarget)],
        logits: &Logits,
        outs: &mut Outputs,
    ) {
        let mut touched = Vec::new();
        for &(row, t) in rows {
            let Some(g) = self.scheduler.group_mut(t.request_id) else {
                continue;
            };
            let k = (2 * g.params.sampling.width()).max(g.params.sampling.logprobs.unwrap_or(0));
            if let Some(seq) = g.seqs.get_mut(t.seq_index) {
                seq.beam_candidates = Some(top_logprobs(logits.row(row), k));
            }
            if !touched.contains(&t.request_id) {
                touched.push(t.request_id);
            }
        }
        for id in touched {
            let eos = self.eos_token_ids.clone();
            if let Some(mut group) =
                super::beam::step(&mut self.scheduler, self.kv.as_mut(), id, &eos)
            {
                *outs.get(id) = super::beam::final_output(&mut group);
                outs.get(id).finished = true;
            }
        }
    }
}

/// The row after `logit_bias` and the grammar mask, when either applies
/// (`None`: the raw row is drawn from as it is).
fn processed_row(row: &[f32], bias: &[(u32, f32)], mask: Option<&Mask>) -> Option<Vec<f32>> {
    if bias.is_empty() && mask.is_none() {
        return None;
    }
    let mut out = row.to_vec();
    for &(t, b) in bias {
        if let Some(v) = out.get_mut(t as usize) {
            *v += b;
        }
    }
    if let Some(m) = mask {
        m.apply(&mut out);
    }
    Some(out)
}

/// The first `t.num_tokens` tokens of target `i`'s sequence `s`: its own,
/// or (asynchronous scheduling: the previous draw not appended yet) all it
/// has and the step's input id at the row's position. `None`: neither.
fn history<'a>(
    sched: &SchedulerOutput,
    i: usize,
    s: &'a crate::scheduler::Sequence,
) -> Option<std::borrow::Cow<'a, [u32]>> {
    let n = sched.targets.get(i)?.num_tokens;
    if let Some(own) = s.tokens.get(..n) {
        return Some(own.into());
    }
    let last = *sched
        .batch
        .token_ids
        .get(*sched.batch.logits_rows.get(i)?)?;
    let mut v = s.tokens.get(..n.checked_sub(1)?)?.to_vec();
    v.push(last);
    Some(v.into())
}

/// Whether [`history`] can give target `i`'s tokens (without building them).
fn has_history(sched: &SchedulerOutput, i: usize, s: &crate::scheduler::Sequence) -> bool {
    let Some(n) = sched.targets.get(i).map(|t| t.num_tokens) else {
        return false;
    };
    let row = sched.batch.logits_rows.get(i);
    s.tokens.len() >= n
        || (s.tokens.len() + 1 == n && row.is_some_and(|&r| r < sched.batch.token_ids.len()))
}

/// A group of width > 1 that has not drawn its first token yet.
pub(super) fn needs_fork(g: &SequenceGroup) -> bool {
    g.params.sampling.width() > 1
        && g.seqs.len() == 1
        && g.seqs.iter().all(|s| s.tokens.len() == s.prompt_len)
}

/// The best `n` finished sequences by cumulative logprob, whole (with the
/// prompt logprobs, when asked).
fn best_of_output(group: &mut SequenceGroup) -> crate::RequestOutput {
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
    let mut out = crate::RequestOutput::new(group.request_id);
    out.num_cached_tokens = group.num_cached_tokens;
    out.prompt_logprobs = group.take_prompt_logprobs();
    for (rank, &i) in order.iter().take(group.params.sampling.n).enumerate() {
        let seq = &group.seqs[i];
        let so = out.seq_mut(rank);
        so.new_token_ids = seq.output_tokens().to_vec();
        so.new_logprobs = seq.output_logprobs.clone();
        so.new_top_logprobs = seq.output_top_logprobs.clone();
        so.finish_reason = match seq.status {
            crate::scheduler::SeqStatus::Finished(r) => Some(r),
            _ => None,
        };
    }
    out
}

/// How a step's rows are drawn (see [`LlmEngine::device_path`]).
pub(super) enum DevicePath {
    /// The host samples from downloaded logits.
    Logits,
    /// Every row plain greedy: `Executor::execute_greedy`.
    Greedy,
    /// Every row drawable on the device: `Executor::execute_sampled`.
    Sampled(DeviceDraws),
}

/// Runs the step on `path`'s device route. `Ok(None)`: the path is
/// [`DevicePath::Logits`] or the executor has no such route (it ran
/// nothing); the caller runs `execute`.
pub(super) fn run_on_device(
    executor: &mut dyn Executor,
    ops: &crate::executor::BlockOps,
    batch: &crate::executor::ForwardBatch,
    path: &DevicePath,
) -> Result<Option<DeviceOut>, ExecError> {
    match path {
        DevicePath::Logits => Ok(None),
        DevicePath::Greedy => Ok(executor.execute_greedy(ops, batch)?.map(|rows| DeviceOut {
            rows: rows.iter().map(SampleOut::from).collect(),
            host_rows: Vec::new(),
            logits: None,
        })),
        DevicePath::Sampled(rows) => executor.execute_sampled(ops, batch, rows),
    }
}
