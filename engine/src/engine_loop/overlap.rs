//! Asynchronous scheduling (`SchedulerConfig::async_scheduling`, vLLM's
//! `--async-scheduling`): the executor runs on a worker thread, and while it
//! runs step N the engine schedules step N+1.
//!
//! One `step` call with step N in flight:
//! 1. each speculable sequence of N gets a placeholder for the token N is
//!    about to draw, and step N+1 is scheduled (its slot reserved ahead);
//! 2. N's answer arrives; its rows are drawn (no sequence changes yet) and
//!    the placeholders removed;
//! 3. each drawn token is written over its placeholder in N+1's input ids and
//!    in the KV cache manager's record, and N+1 is launched;
//! 4. while N+1 runs: N's tokens are appended (finishes, frees, outputs),
//!    then N+1's grammar masks are computed (they need N's tokens).
//!
//! (The first call, with nothing in flight, schedules and launches N first.)
//!
//! Invariants:
//! - a placeholder lives only inside one `step` call: the scheduler's copy is
//!   gone before N's results are applied, the KV cache manager's before N+1
//!   is launched; a sequence left with `num_computed_tokens > tokens.len()`
//!   (no token drawn for it) is aborted;
//! - a placeholder never completes a block while the KV cache manager hashes
//!   block contents (`KvCacheManager::hashes_tokens`): that sequence sits
//!   N+1 out and runs again in N+2;
//! - a row of N+1 whose sequence finished, or was aborted, at N is stale
//!   (`LlmEngine::is_live`) and its draw is dropped. Its blocks are freed at
//!   once; the worker runs steps in order, so the row's K/V write into a
//!   freed slot happens before any later step that could reuse the block;
//! - outputs equal the synchronous loop's: a draw depends only on its
//!   sequence's tokens and (seed, sequence, position), and a row's logits
//!   only on its own sequence (the invariance tests check both), so the
//!   different batch composition changes nothing.
//!
//! Not speculated (such a sequence skips N+1 and runs again in N+2; a step
//! with only these is a synchronous step): beam search (beams fork and die
//! at commit), a group about to fork (n > 1 or best_of > 1, after its
//! prompt row), prompt_logprobs, a token that will end the sequence by
//! length, and a placeholder that would complete a hashed block.
//!
//! Cost: two channel messages per step and one `HashMap` of the step's rows;
//! host work of N+1's schedule and of N's postprocess overlaps the executor.

use super::postprocess::{needs_fork, run_on_device, DevicePath};
use super::{mask_work, place_masks, push_refused, LlmEngine, Outputs, RequestOutput};
use crate::error::EngineError;
use crate::executor::{BlockOps, ExecError, Executor, ForwardBatch, Logits};
use crate::grammar::Mask;
use crate::scheduler::{RequestId, SampleTarget, SchedulerOutput, SeqStatus, SequenceGroup};
use std::collections::HashMap;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::thread::JoinHandle;
use std::time::Instant;

/// Token id standing in for a draw not known yet. Any valid id: a stale row
/// still runs through the model.
const PLACEHOLDER: u32 = 0;

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

/// What the executor answered for one step.
pub(super) enum StepResult {
    /// Each sampled row's draw made by the executor (`DevicePath`), with
    /// the logits of the rows the host draws (a mixed step).
    Device(crate::sampler::device::DeviceOut),
    Logits(Logits),
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
    /// Whether the executor may draw the rows itself (tried first).
    path: DevicePath,
}

/// A thread that owns the executor and runs the steps it is sent, in order.
pub(super) struct ExecWorker {
    jobs: Option<Sender<Job>>,
    results: Receiver<Result<StepResult, ExecError>>,
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
                    if result_tx.send(run_job(executor.as_mut(), &job)).is_err() {
                        break;
                    }
                }
            })
            .map_err(|e| {
                EngineError::InvalidConfig(format!("cannot start the executor thread: {e}"))
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
    fn wait(&self) -> Result<StepResult, ExecError> {
        self.results
            .recv()
            .unwrap_or_else(|_| Err(ExecError::Device("the executor thread stopped".into())))
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

fn run_job(executor: &mut dyn Executor, job: &Job) -> Result<StepResult, ExecError> {
    if let Some(rows) = run_on_device(executor, &job.ops, &job.batch, &job.path)? {
        return Ok(StepResult::Device(rows));
    }
    executor
        .execute(&job.ops, &job.batch)
        .map(StepResult::Logits)
}

/// The step the worker is running (its batch and block ops moved out).
pub(super) struct InFlight {
    sched: SchedulerOutput,
    masks: Vec<Option<Mask>>,
}

/// A sequence of the running step given a placeholder at `pos`.
struct Spec {
    request_id: RequestId,
    seq_index: usize,
    pos: usize,
}

/// Whether a group's sequences may be scheduled ahead of their draw.
fn speculable(g: &SequenceGroup) -> bool {
    let p = &g.params.sampling;
    !p.use_beam_search && p.prompt_logprobs.is_none() && !needs_fork(g)
}

impl LlmEngine {
    /// One iteration of the overlapped loop (see the module docs).
    pub(super) fn step_overlapped(&mut self) -> Vec<RequestOutput> {
        let t0 = Instant::now();
        let mut outs = Outputs::default();
        if self.in_flight.is_none() {
            let sched = self.scheduler.schedule(self.kv.as_mut());
            push_refused(&sched, &mut outs);
            if sched.is_empty() {
                self.timings.schedule += t0.elapsed();
                return outs.list;
            }
            self.launch(sched);
            self.mask_in_flight();
        }
        let Some(prev) = self.in_flight.take() else {
            return outs.list;
        };
        let specs = self.push_placeholders(&prev.sched.targets);
        let mut next = self.scheduler.schedule(self.kv.as_mut());
        push_refused(&next, &mut outs);
        self.overlap.steps_ahead += u64::from(!next.is_empty());
        self.overlap.seqs_ahead += specs.len() as u64;
        let t1 = Instant::now();
        let result = match &self.runner {
            Runner::Worker(w) => w.wait(),
            Runner::Direct(_) => Err(ExecError::Device("no executor thread".into())),
        };
        let t2 = Instant::now();
        self.pop_placeholders(&specs);
        self.overlap.stale_rows += prev
            .sched
            .targets
            .iter()
            .filter(|t| !self.is_live(t))
            .count() as u64;
        let sampled = self.sample_step(&prev.sched, result, &prev.masks);
        let tokens = sampled.tokens(&prev.sched.targets);
        let broken = self.patch_next(&specs, &tokens, &mut next);
        let launched = !next.is_empty();
        if launched {
            self.launch(next);
        }
        self.commit_step(&prev.sched, sampled, &mut outs);
        self.abort_unpatched(&specs, broken, &mut outs);
        if launched {
            // N's tokens are appended now: the masks of N+1 may see them.
            self.mask_in_flight();
        }
        self.record_timings(t0, t1, t2);
        outs.list
    }

    /// Sends a step to the worker (its masks come later, see
    /// [`Self::mask_in_flight`]).
    fn launch(&mut self, mut sched: SchedulerOutput) {
        // Before the batch is moved out: a refill may read its input ids.
        let path = self.device_path(&sched);
        let job = Job {
            ops: std::mem::take(&mut sched.ops),
            batch: std::mem::take(&mut sched.batch),
            path,
        };
        if let Runner::Worker(w) = &self.runner {
            w.submit(job);
        }
        self.in_flight = Some(InFlight {
            sched,
            masks: Vec::new(),
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

    /// Gives each speculable sequence of the running step a placeholder for
    /// the token it is drawing, so the next schedule computes it.
    fn push_placeholders(&mut self, targets: &[SampleTarget]) -> Vec<Spec> {
        let hashed = self.kv.hashes_tokens();
        let bs = self.kv.block_size();
        let max_model_len = self.scheduler.config().max_model_len;
        let mut specs = Vec::new();
        for t in targets {
            let Some(g) = self.scheduler.group_mut(t.request_id) else {
                continue;
            };
            if !speculable(g) {
                continue;
            }
            let max_tokens = g.params.max_tokens;
            let Some(seq) = g.seqs.get_mut(t.seq_index) else {
                continue;
            };
            let len = seq.tokens.len();
            let caught_up = len == t.num_tokens && seq.num_computed_tokens == len;
            if seq.status != SeqStatus::Running || !caught_up {
                continue;
            }
            let ends = max_tokens.is_some_and(|m| len + 1 - seq.prompt_len >= m)
                || len + 1 >= max_model_len;
            if ends || (hashed && (len + 1).is_multiple_of(bs)) {
                continue;
            }
            seq.tokens.push(PLACEHOLDER);
            specs.push(Spec {
                request_id: t.request_id,
                seq_index: t.seq_index,
                pos: len,
            });
        }
        specs
    }

    /// Removes the placeholders from the scheduler's sequences (the running
    /// step's rows are then drawn on the true histories).
    fn pop_placeholders(&mut self, specs: &[Spec]) {
        for s in specs {
            let seq = self
                .scheduler
                .group_mut(s.request_id)
                .and_then(|g| g.seqs.get_mut(s.seq_index));
            if let Some(seq) = seq.filter(|q| q.tokens.len() == s.pos + 1) {
                seq.tokens.pop();
            }
        }
    }

    /// Writes each drawn token over its placeholder in `next`'s input ids
    /// and in the KV cache manager. Returns the groups whose manager refused.
    fn patch_next(
        &mut self,
        specs: &[Spec],
        tokens: &HashMap<(RequestId, usize), u32>,
        next: &mut SchedulerOutput,
    ) -> Vec<(RequestId, EngineError)> {
        let rows: HashMap<(RequestId, usize), (usize, usize)> = next
            .targets
            .iter()
            .enumerate()
            .map(|(i, t)| ((t.request_id, t.seq_index), (i, t.num_tokens)))
            .collect();
        let mut broken = Vec::new();
        for s in specs {
            let key = (s.request_id, s.seq_index);
            let (Some(&(i, n)), Some(&token)) = (rows.get(&key), tokens.get(&key)) else {
                continue;
            };
            let Some(&row) = next.batch.logits_rows.get(i).filter(|_| n == s.pos + 1) else {
                continue;
            };
            if let Some(slot) = next.batch.token_ids.get_mut(row) {
                *slot = token;
            }
            let seq_id = self
                .scheduler
                .group(s.request_id)
                .and_then(|g| g.seqs.get(s.seq_index))
                .map(|q| q.id);
            if let Some(id) = seq_id {
                if let Err(e) = self.kv.replace_last_token(id, token) {
                    broken.push((s.request_id, e.into()));
                }
            }
        }
        broken
    }

    /// Aborts the groups whose placeholder could not be replaced: the KV
    /// cache manager refused, or no token was drawn for a sequence the next
    /// step computes (its `num_computed_tokens` ran ahead of its tokens).
    fn abort_unpatched(
        &mut self,
        specs: &[Spec],
        broken: Vec<(RequestId, EngineError)>,
        outs: &mut Outputs,
    ) {
        let mut failed = broken;
        for s in specs {
            let ahead = self
                .scheduler
                .group(s.request_id)
                .and_then(|g| g.seqs.get(s.seq_index))
                .is_some_and(|q| !q.is_finished() && q.num_computed_tokens > q.tokens.len());
            if ahead {
                let e = EngineError::Executor("no token was drawn for a scheduled sequence".into());
                failed.push((s.request_id, e));
            }
        }
        for (id, e) in failed {
            tracing::error!(request = %id, error = %e, "overlapped step failed; aborting");
            if self.scheduler.abort(self.kv.as_mut(), id).is_some() {
                outs.push_failed(id, e);
            }
        }
    }
}
