//! From the executor's answer to a [`StepOutcome`]: which path a step's
//! draws take ([`LlmEngine::sampling`], chosen from the executor's
//! capabilities), the host's draws from logits rows (in parallel over
//! rows), beam candidates and prompt logprobs. Nothing here changes a
//! sequence: `Scheduler::update_from_output` applies the outcome.
//!
//! Invariants:
//! - a group of width `w > 1` (n / best_of) draws its `w` first tokens
//!   from its prompt's one logits row, with streams `0..w`;
//! - prompt logprobs: row `targets.len() + i` scores `prompt_targets[i]`;
//! - a row with a grammar mask or a `logit_bias` is copied, biased, then
//!   masked (disallowed tokens at `-inf`) before the draw; its logprobs are
//!   those of that processed row (vLLM also applies the grammar bitmask
//!   before its sampler computes logprobs; for `logit_bias` vLLM reports
//!   the unbiased logprobs, we report the biased ones).
//!
//! Cost: O(rows x vocab) for the draws (see `sampler::ops`) and for the
//! prompt rows, plus O(beams x vocab) for the beam candidates.

use super::LlmEngine;
use crate::error::EngineError;
use crate::executor::{ExecError, Logits, Sampling, StepOutput};
use crate::grammar::Mask;
use crate::sampler::device::{DeviceDraws, DeviceRow, Fill, Processing};
use crate::sampler::{
    greedy_on_device, prompt_logprob, sample_row, top_logprobs, PromptLogprob, SampleOut,
    SeqContext,
};
use crate::scheduler::{Draw, Drawn, RequestId, SampleTarget, SchedulerOutput, StepOutcome};
use std::collections::HashMap;

impl LlmEngine {
    /// Where the step's rows are drawn, as the executor's capabilities
    /// allow: plain greedy steps reduced where the logits are (12 bytes per
    /// row), other steps whose every row has a [`DeviceRow`] drawn there;
    /// anything else (a row needing the logits) on the host. Called once
    /// per launched step, before its batch is moved out (a slot refill may
    /// read the step's input ids); claims the count slots the step uses.
    pub(super) fn sampling(&mut self, sched: &SchedulerOutput) -> Sampling {
        if self.caps.greedy && self.all_rows_plain_greedy(sched) {
            Sampling::Greedy
        } else if let Some(draws) = self.caps.sampled.then(|| self.device_rows(sched)).flatten() {
            Sampling::Device(draws)
        } else {
            Sampling::Host
        }
    }

    /// Turns the executor's answer to `sched` into what the step produced
    /// (no sequence changes).
    pub(super) fn sample(
        &mut self,
        sched: &SchedulerOutput,
        result: Result<StepOutput, ExecError>,
        masks: &[Option<Mask>],
    ) -> StepOutcome {
        self.count_slots
            .step_done(matches!(result, Ok(StepOutput::Drawn(_))));
        let rows = sched.num_logits_rows();
        match result {
            Ok(StepOutput::Drawn(out)) => self.device_result(sched, out),
            Ok(StepOutput::Logits(logits)) if logits.rows == rows => {
                let prompt = self.prompt_entries(sched, &logits, sched.targets.len());
                let (draws, beams) = self.plan_draws(&sched.targets);
                let sampled = self.run_draws(&draws, &logits, masks);
                let beams = self.beam_candidates(&beams, &logits);
                let spec = self.verify_host(sched, &draws, &sampled, &logits);
                StepOutcome::Drawn(Drawn {
                    draws,
                    sampled,
                    beams,
                    prompt,
                    spec,
                })
            }
            Ok(StepOutput::Logits(logits)) => {
                StepOutcome::Failed(EngineError::Executor(ExecError::WrongAnswer(format!(
                    "{} logits rows for {} sampled, {} prompt and {} proposal rows",
                    logits.rows,
                    sched.targets.len(),
                    sched.prompt_targets.len(),
                    rows - sched.targets.len() - sched.prompt_targets.len()
                ))))
            }
            Err(e) => StepOutcome::Failed(e.into()),
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
    /// cannot keep counts, or no row is drawn on the device. A step with
    /// proposals is drawn on the device only when it has no host row and
    /// no speculating sequence has penalties; its proposal rows follow the
    /// sampled rows ([`Self::proposal_rows`]). Rows the host
    /// draws (beam search, a group about to fork, prompt rows) are
    /// `host_rows`: a mixed step. Rows with penalties get a count slot,
    /// filled from their sequence's tokens when the device's counts do not
    /// hold them.
    fn device_rows(&mut self, sched: &SchedulerOutput) -> Option<DeviceDraws> {
        if sched.targets.is_empty() {
            return None;
        }
        let speculating = !sched.spec.is_empty();
        if speculating && !sched.prompt_targets.is_empty() {
            // Proposal rows are drawn on the device only in steps without
            // host rows (see `spec_rows`).
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
            if p.use_beam_search || g.needs_fork() {
                if speculating {
                    return None;
                }
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
                self.scheduler.stop_ids(g)
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
        if speculating {
            plan.extend(self.proposal_rows(sched)?);
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
            self.count_slots.step_done(false);
        }
        draws
    }

    /// The device draw of every proposal row of `sched` (in
    /// [`SchedulerOutput::spec_rows`] order), or `None` when one cannot be
    /// drawn there (a speculating sequence with penalties: its proposal
    /// rows would need counts over the proposals before them). Proposal
    /// `j`'s row is drawn as `verify_host` draws it: the sequence's seeded
    /// stream at output position `output_len + j + 1`, its `min_tokens`
    /// suppression by that position, its `logit_bias`.
    fn proposal_rows(
        &self,
        sched: &SchedulerOutput,
    ) -> Option<Vec<(DeviceRow, Option<Processing>, bool)>> {
        let mut rows = Vec::with_capacity(sched.num_logits_rows() - sched.targets.len());
        for st in &sched.spec {
            let t = sched.targets.get(st.target)?;
            let g = self.scheduler.group(t.request_id)?;
            let p = &g.params.sampling;
            if p.has_penalties() || p.structured.is_some() {
                return None;
            }
            let s = g.seqs.get(t.seq_index)?;
            let output_len = t.num_tokens.saturating_sub(s.prompt_len);
            let stops = if output_len + 1 < p.min_tokens {
                self.scheduler.stop_ids(g)
            } else {
                Vec::new()
            };
            for j in 0..st.proposals.len() {
                let at = output_len + j + 1;
                let row = DeviceRow::of(p, g.seed, t.seq_index, at);
                rows.push((row, Processing::of(p, at, &stops), false));
            }
        }
        Some(rows)
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

    /// Scores this step's prompt rows (in parallel; prompt row `i` is
    /// `logits` row `base + i`).
    pub(super) fn prompt_entries(
        &self,
        sched: &SchedulerOutput,
        logits: &Logits,
        base: usize,
    ) -> Vec<(RequestId, usize, PromptLogprob)> {
        use rayon::prelude::*;
        let work: Vec<(usize, u32, usize, RequestId, usize)> = sched
            .prompt_targets
            .iter()
            .enumerate()
            .filter_map(|(i, t)| {
                let g = self.scheduler.group(t.request_id)?;
                let token = *g.seqs.first()?.tokens.get(t.position)?;
                let k = g.params.sampling.prompt_logprobs?;
                Some((base + i, token, k, t.request_id, t.position))
            })
            .collect();
        work.par_iter()
            .map(|&(row, token, k, id, position)| {
                (id, position, prompt_logprob(logits.row(row), token, k))
            })
            .collect()
    }

    /// Each beam row's next-token candidates: its top `2 x width` (at
    /// least `logprobs`) raw logprobs, best first; `rows` index `logits`.
    pub(super) fn beam_candidates(
        &self,
        rows: &[(usize, SampleTarget)],
        logits: &Logits,
    ) -> Vec<(SampleTarget, Vec<(u32, f32)>)> {
        rows.iter()
            .filter_map(|&(row, t)| {
                let s = &self.scheduler.group(t.request_id)?.params.sampling;
                let k = (2 * s.width()).max(s.logprobs.unwrap_or(0));
                Some((t, top_logprobs(logits.row(row), k)))
            })
            .collect()
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
            if !self.scheduler.is_live(t) {
                continue;
            }
            if g.params.sampling.use_beam_search {
                beams.push((row, *t));
            } else if g.needs_fork() {
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
            .map(|(id, g)| (id, self.scheduler.stop_ids(g)))
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
