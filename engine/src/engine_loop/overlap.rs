//! Asynchronous scheduling (`SchedulerConfig::async_scheduling`, vLLM's
//! `--async-scheduling`): the executor runs on a worker thread, and while it
//! runs step N the engine schedules step N+1.
//!
//! One `step` call with step N in flight:
//! 1. step N+1 is scheduled ahead of N's draws (`Scheduler::schedule_ahead`:
//!    each plain sequence of N computed one token further, at a
//!    placeholder);
//! 2. N's answer arrives and is sampled (no sequence changes);
//! 3. each drawn token is written over its placeholder in N+1's input ids
//!    (`Ahead::patch`), and N+1 is launched;
//! 4. while N+1 runs: `Scheduler::update_from_output` applies N (the KV
//!    cache manager's placeholders replaced, tokens appended, finishes,
//!    frees, outputs), then N+1's grammar masks are computed (they need
//!    N's tokens).
//!
//! (The first call, with nothing in flight, schedules and launches N first.)
//!
//! Speculative decoding: proposals are made from a sequence's drawn tokens,
//! and a step that verifies them decides how many tokens each sequence
//! gains, so such steps are not scheduled ahead. Where the next step will
//! ask for proposals (a proposer, a load under `disable_by_batch_size`, a
//! governor that does not say plain) or N verified some, the iteration
//! waits for N, applies it, then proposes, schedules and launches N+1
//! (the synchronous loop's order, with the executor still on its thread).
//! Plain stretches (speculation disabled by the batch size, or switched off
//! by the governor) run ahead as above.
//!
//! Invariants:
//! - a row of N+1 whose sequence finished, or was aborted, at N is stale
//!   (`Scheduler::is_live`) and its draw is dropped. Its blocks are freed at
//!   once; the worker runs steps in order, so the row's K/V write into a
//!   freed slot happens before any later step that could reuse the block;
//! - outputs equal the synchronous loop's: a draw depends only on its
//!   sequence's tokens and (seed, sequence, position), and a row's logits
//!   only on its own sequence (the invariance tests check both), so the
//!   different batch composition changes nothing.
//!
//! What is not scheduled ahead, and why: see `scheduler::ahead`.
//!
//! Cost: two channel messages per step and one `HashMap` of the step's rows;
//! host work of N+1's schedule and of N's update overlaps the executor.

use super::{decode_only, mask_work, place_masks, push_refused, LlmEngine, RequestOutput};
use crate::error::EngineError;
use crate::executor::{BlockOps, ExecError, Executor, ForwardBatch, Sampling, StepOutput};
use crate::grammar::Mask;
use crate::scheduler::{Ahead, Outputs, SampleTarget, SchedulerOutput};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::thread::JoinHandle;
use std::time::Instant;

/// How much asynchronous scheduling ran ahead (zero in the synchronous loop).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OverlapStats {
    /// Steps scheduled while the previous one was running.
    pub steps_ahead: u64,
    /// Sequences scheduled before their previous token was drawn.
    pub seqs_ahead: u64,
    /// Rows computed for a sequence that had finished by then, and dropped.
    pub stale_rows: u64,
}

/// Where the executor runs.
pub(super) enum Runner {
    /// On the engine's thread (synchronous loop).
    Direct(Box<dyn Executor>),
    /// On its own thread (asynchronous scheduling).
    Worker(ExecWorker),
}

impl Runner {
    /// The executor, when it runs on this thread.
    pub(super) fn direct(&mut self) -> Option<&mut (dyn Executor + 'static)> {
        match self {
            Self::Direct(e) => Some(e.as_mut()),
            Self::Worker(_) => None,
        }
    }
}

/// One step for the worker.
struct Job {
    ops: BlockOps,
    batch: ForwardBatch,
    sampling: Sampling,
    /// The step's adapters (or why they could not be placed).
    lora: Result<crate::model::lora::LoraStep, ExecError>,
}

/// A thread that owns the executor and runs the steps it is sent, in order.
pub(super) struct ExecWorker {
    jobs: Option<Sender<Job>>,
    results: Receiver<Result<StepOutput, ExecError>>,
    thread: Option<JoinHandle<()>>,
}

impl ExecWorker {
    pub(super) fn spawn(mut executor: Box<dyn Executor>) -> Result<Self, EngineError> {
        let (jobs, job_rx) = channel::<Job>();
        let (result_tx, results) = channel();
        let thread = std::thread::Builder::new()
            .name("executor".into())
            .spawn(move || {
                for job in job_rx {
                    let result = match &job.lora {
                        Ok(l) => executor.execute_lora(&job.ops, &job.batch, l, &job.sampling),
                        Err(e) => Err(e.clone()),
                    };
                    if result_tx.send(result).is_err() {
                        break;
                    }
                }
            })
            .map_err(|e| EngineError::Thread {
                what: "executor",
                source: crate::error::cause(e),
            })?;
        Ok(Self {
            jobs: Some(jobs),
            results,
            thread: Some(thread),
        })
    }

    /// Queues a step. A stopped worker is noticed by [`Self::wait`].
    fn submit(&self, job: Job) {
        if let Some(tx) = &self.jobs {
            let _ = tx.send(job);
        }
    }

    /// The answer of the oldest submitted step.
    fn wait(&self) -> Result<StepOutput, ExecError> {
        self.results
            .recv()
            .unwrap_or_else(|_| Err(ExecError::WorkerStopped))
    }
}

impl Drop for ExecWorker {
    fn drop(&mut self) {
        self.jobs = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The step the worker is running (its batch and block ops moved out).
pub(super) struct InFlight {
    sched: SchedulerOutput,
    masks: Vec<Option<Mask>>,
    /// Whether the speculation governor counts the step (decode only,
    /// with a sequence that could speculate).
    counted: bool,
}

impl LlmEngine {
    /// One iteration of the overlapped loop (see the module docs).
    pub(super) fn step_overlapped(&mut self) -> Vec<RequestOutput> {
        let t0 = Instant::now();
        let mut outs = Outputs::default();
        if self.in_flight.is_none() && !self.launch_now(&mut outs) {
            self.timings.schedule += t0.elapsed();
            return outs.into_list();
        }
        let Some(prev) = self.in_flight.take() else {
            return outs.into_list();
        };
        // Speculation: a step verifying proposals is not run ahead of (how
        // many tokens its sequences gain is known only from its draws),
        // and neither is one whose successor will ask for proposals (they
        // are made from the sequences' drawn tokens).
        let run_ahead = prev.sched.spec.is_empty() && !self.wants_proposals();
        let (mut next, mut ahead) = if run_ahead {
            let could_speculate = self.proposer.is_some() && self.scheduler.may_speculate();
            let (next, ahead) = self
                .scheduler
                .schedule_ahead(self.kv.as_mut(), &prev.sched.targets);
            (Some((next, could_speculate)), ahead)
        } else {
            (None, Ahead::none())
        };
        if let Some((next, _)) = &next {
            push_refused(next, &mut outs);
            self.overlap.steps_ahead += u64::from(!next.is_empty());
            self.overlap.seqs_ahead += ahead.len() as u64;
        }
        let t1 = Instant::now();
        let result = match &self.runner {
            Runner::Worker(w) => w.wait(),
            Runner::Direct(_) => Err(ExecError::WorkerStopped),
        };
        let t2 = Instant::now();
        self.overlap.stale_rows += stale_rows(self, &prev.sched.targets);
        let outcome = self.sample(&prev.sched, result, &prev.masks);
        let launched = match next.as_mut() {
            Some((next, could_speculate)) => {
                ahead.patch(&outcome.tokens(&prev.sched.targets), next);
                let launch = !next.is_empty();
                if launch {
                    self.launch(std::mem::take(next), *could_speculate);
                }
                launch
            }
            None => false,
        };
        let accepted_before = self.accepted_tokens();
        self.scheduler.update_from_output(
            self.kv.as_mut(),
            &prev.sched,
            outcome,
            &ahead,
            &mut outs,
        );
        if launched {
            // N's tokens are appended now: the masks of N+1 may see them.
            self.mask_in_flight();
        } else if !run_ahead {
            // N's tokens are appended: propose from them, launch N+1.
            self.launch_now(&mut outs);
        }
        self.record_timings(t0, t1, t2);
        self.govern(&prev.sched, prev.counted, accepted_before, t0);
        outs.into_list()
    }

    /// With nothing in flight: asks for proposals, schedules the next step
    /// and launches it; false when there was nothing to run.
    fn launch_now(&mut self, outs: &mut Outputs) -> bool {
        let could_speculate = self.propose();
        let sched = self.scheduler.schedule(self.kv.as_mut());
        push_refused(&sched, outs);
        if sched.is_empty() {
            return false;
        }
        self.launch(sched, could_speculate);
        self.mask_in_flight();
        true
    }

    /// Sends a step to the worker (its masks come later, see
    /// [`Self::mask_in_flight`]).
    fn launch(&mut self, mut sched: SchedulerOutput, could_speculate: bool) {
        // Before the batch is moved out: a refill may read its input ids.
        let sampling = self.sampling(&sched);
        let counted = could_speculate && decode_only(&sched);
        let lora = self.lora.place(&sched);
        let job = Job {
            ops: std::mem::take(&mut sched.ops),
            batch: std::mem::take(&mut sched.batch),
            sampling,
            lora,
        };
        if let Runner::Worker(w) = &self.runner {
            w.submit(job);
        }
        self.in_flight = Some(InFlight {
            sched,
            masks: Vec::new(),
            counted,
        });
    }

    /// Computes the grammar masks of the running step's constrained rows
    /// here, while the worker runs it.
    fn mask_in_flight(&mut self) {
        let Some(f) = self.in_flight.take() else {
            return;
        };
        let masks = self.masks_now(&f.sched.targets);
        self.in_flight = Some(InFlight { masks, ..f });
    }

    /// The grammar masks of the constrained rows, computed on this thread.
    fn masks_now(&mut self, targets: &[SampleTarget]) -> Vec<Option<Mask>> {
        let work = mask_work(&self.scheduler, &mut self.grammars, targets);
        if work.is_empty() {
            return Vec::new();
        }
        let t = Instant::now();
        let grammars = &mut self.grammars;
        let computed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            grammars.compute_masks(&work)
        }))
        .unwrap_or_default();
        let masks = place_masks(&work, computed, targets.len());
        self.timings.mask_compute += t.elapsed();
        self.timings.mask_steps += 1;
        masks
    }
}

/// Rows computed for a sequence that finished (or changed) since.
fn stale_rows(engine: &LlmEngine, targets: &[SampleTarget]) -> u64 {
    targets
        .iter()
        .filter(|t| !engine.scheduler.is_live(t))
        .count() as u64
}
