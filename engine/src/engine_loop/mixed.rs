//! A step drawn partly on the device: the executor's answer to
//! `Sampling::Device`, checked against the schedule and, when some rows
//! are drawn by the host (beam search, a group's forking draws, prompt
//! rows: `DeviceDraws::host_rows`), completed from the logits of those rows
//! only.
//!
//! Invariants: a mixed step gives the same draws as the logits path: each
//! row is drawn by its sequence's own definition (device rows by the
//! sampling kernel, host rows by the CPU sampler, beams at commit), and a
//! prompt row is scored from its own logits; the host rows are ascending
//! and the prompt rows are the last of them. Cost: O(host rows x vocab) on
//! the host, nothing for device rows.

use super::LlmEngine;
use crate::error::EngineError;
use crate::executor::{ExecError, Logits};
use crate::sampler::device::DeviceOut;
use crate::sampler::SampleOut;
use crate::scheduler::{Draw, Drawn, SchedulerOutput, StepOutcome};
use std::collections::HashMap;

impl LlmEngine {
    /// The executor's device draws of `sched` (see the module docs).
    pub(super) fn device_result(&self, sched: &SchedulerOutput, out: DeviceOut) -> StepOutcome {
        let targets = sched.targets.len();
        let rows = targets + sched.prompt_targets.len();
        let greedy_rows = sched.num_logits_rows();
        match out.logits {
            // A step with proposals: every row reduced (plain greedy) or
            // drawn (`Sampling::Device`, proposal rows at their own output
            // positions) on the device, the proposal rows verified from
            // those draws by `verify.rs`'s one rule.
            None if !sched.spec.is_empty()
                && out.rows.len() == greedy_rows
                && sched.prompt_targets.is_empty() =>
            {
                let spec = Self::verify_rows(sched, &out.rows);
                let mut rows = out.rows;
                rows.truncate(targets);
                StepOutcome::Device { rows, spec }
            }
            None if out.rows.len() == targets && sched.prompt_targets.is_empty() => {
                StepOutcome::Device {
                    rows: out.rows,
                    spec: Vec::new(),
                }
            }
            Some(logits)
                if out.rows.len() == rows
                    && logits.rows == out.host_rows.len()
                    && out.host_rows.len() >= sched.prompt_targets.len() =>
            {
                self.mixed(sched, out.rows, &out.host_rows, logits)
            }
            _ => StepOutcome::Failed(EngineError::Executor(ExecError::WrongAnswer(format!(
                "{} device rows and {} host rows for {targets} sampled and {} prompt rows",
                out.rows.len(),
                out.host_rows.len(),
                sched.prompt_targets.len()
            )))),
        }
    }

    /// Completes a mixed step: prompt rows scored, host rows drawn from
    /// `logits` (the host rows' logits, in `host_rows` order), the other
    /// rows taken from `device`.
    fn mixed(
        &self,
        sched: &SchedulerOutput,
        device: Vec<SampleOut>,
        host_rows: &[u32],
        logits: Logits,
    ) -> StepOutcome {
        let first_prompt = host_rows.len() - sched.prompt_targets.len();
        let prompt = self.prompt_entries(sched, &logits, first_prompt);
        let at: HashMap<usize, usize> = host_rows
            .iter()
            .enumerate()
            .map(|(k, &r)| (r as usize, k))
            .collect();
        let (draws, beams) = self.plan_draws(&sched.targets);
        let host: Vec<_> = draws
            .iter()
            .filter_map(|d| at.get(&d.row).map(|&k| Draw { row: k, ..*d }))
            .collect();
        let mut host_drawn = self.run_draws(&host, &logits, &[]).into_iter();
        let mut device = device.into_iter().map(Some).collect::<Vec<_>>();
        let sampled = draws
            .iter()
            .map(|d| {
                if at.contains_key(&d.row) {
                    host_drawn.next().flatten()
                } else {
                    device.get_mut(d.row).and_then(Option::take)
                }
            })
            .collect();
        let beams: Vec<_> = beams
            .into_iter()
            .filter_map(|(row, t)| at.get(&row).map(|&k| (k, t)))
            .collect();
        StepOutcome::Drawn(Drawn {
            draws,
            sampled,
            beams: self.beam_candidates(&beams, &logits),
            prompt,
            spec: Vec::new(),
        })
    }
}
