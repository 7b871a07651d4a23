//! The engine loop: schedule -> block operations -> forward pass -> sample ->
//! append tokens / finish -> outputs, and the async handle around it.
//!
//! Invariants:
//! - a sequence's sampled token is appended to its `tokens` in the same step
//!   it is sampled; its K/V is written by the next step's `append_slots`;
//! - a finished sequence's blocks are freed in the step it finishes;
//! - prompt logprobs are recorded before the step's tokens are sampled, and
//!   handed out once: on the request's first output carrying tokens (or its
//!   final output when outputs are buffered);
//! - an executor failure aborts (and frees) every request it touched, and the
//!   loop keeps serving the others;
//! - constrained rows (`SamplingParams::structured`) are masked before their
//!   draw; their masks are computed on a second thread while the forward
//!   pass runs (they depend only on tokens already known), see
//!   [`crate::grammar`];
//! - a step's results change sequences in one place,
//!   `Scheduler::update_from_output`, after `sample` drew every row into
//!   a `StepOutcome` (this loop never changes a sequence itself);
//! - the path of each step's draws is chosen up front from the executor's
//!   declared `Capabilities` (`sample::sampling`);
//! - with a KV event sink ([`LlmEngine::set_kv_event_sink`]) the KV
//!   manager's events are taken once at the end of every `step` call and
//!   handed to the sink in one call when there are any (without a sink the
//!   manager records nothing: one `Option` check per step);
//! - with `SchedulerConfig::async_scheduling` the next step is scheduled and
//!   launched before this one's tokens are appended (`overlap`): the same
//!   outputs, a placeholder token for at most one `step` call.
//!
//! Cost per step: the scheduler's, the forward pass, and the sampler's
//! O(rows x vocab) (see `postprocess` for forks, best_of and beam search);
//! with constrained rows, max(forward, masks) instead of the forward pass
//! alone, plus O(vocab) per constrained or biased row to copy and mask it.

mod count_slots;
mod draft;
mod handle;
mod lora;
mod mixed;
mod overlap;
mod sample;
mod verify;

pub use crate::sampler::PromptLogprob;
pub use crate::scheduler::{RequestOutput, SeqOutput};
pub use handle::{EngineHandle, HandleConfig, RequestStream, ShutdownMode};

use crate::error::EngineError;
use crate::executor::{Capabilities, ExecError, Executor, Sampling, StepOutput};
use crate::grammar::state::{GrammarStates, MaskWork};
use crate::grammar::Mask;
use crate::kv::{KvCacheManager, KvEventSink, KvStats};
use crate::scheduler::{
    validate_request, Ahead, Outputs, RequestId, RequestParams, SampleTarget, Scheduler,
    SchedulerConfig, SchedulerOutput, SchedulerStats, ValidRequest,
};
use crate::spec::governor::{Drafting, Governor, StepSample};
use crate::spec::{NgramProposer, ProposeInput, Proposer, SpecConfig, SpecMethod};
pub use draft::DraftProposer;
pub use lora::LoraNames;
pub use overlap::OverlapStats;
use overlap::{ExecWorker, InFlight, Runner};
use std::time::{Duration, Instant};

/// Engine configuration beyond the KV cache (which is built by the caller).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct EngineConfig {
    pub scheduler: SchedulerConfig,
    /// Tokens that end a sequence unless `ignore_eos` (the model's EOS).
    pub eos_token_ids: Vec<u32>,
}

/// Snapshot of the engine's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct EngineStats {
    pub scheduler: SchedulerStats,
    pub kv: KvStats,
}

/// Cumulative wall time per part of a step (for the overhead report; never
/// asserted on in tests). With asynchronous scheduling `execute` is the
/// time spent waiting for the executor, and `postprocess` includes
/// launching the next step.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StepTimings {
    pub schedule: Duration,
    pub execute: Duration,
    pub postprocess: Duration,
    pub steps: u64,
    /// Time spent computing grammar masks (on the mask thread).
    pub mask_compute: Duration,
    /// Time the step waited for masks after its forward pass (the part of
    /// `mask_compute` not hidden behind the forward pass).
    pub mask_wait: Duration,
    /// Steps with at least one constrained row.
    pub mask_steps: u64,
}

/// The synchronous engine: owns the scheduler, the KV cache and the executor.
pub struct LlmEngine {
    scheduler: Scheduler,
    kv: Box<dyn KvCacheManager>,
    /// The executor, on this thread or (asynchronous scheduling) its own.
    runner: Runner,
    /// Asynchronous scheduling: the step the executor is running.
    in_flight: Option<InFlight>,
    overlap: OverlapStats,
    /// What the executor can do beyond returning logits.
    caps: Capabilities,
    timings: StepTimings,
    grammars: GrammarStates,
    /// Rows of the executor's token-count table (device penalties).
    count_slots: count_slots::CountSlots,
    /// Where the KV manager's events go (recording is off without one).
    kv_events: Option<Box<dyn KvEventSink>>,
    /// Speculative decoding's proposer (`None`: speculation off).
    proposer: Option<Box<dyn Proposer>>,
    /// Adaptive speculation (`SpecConfig::adaptive`): whether the next
    /// step speculates, from measured cost per token.
    governor: Option<Governor>,
    /// LoRA adapters: the executor's support and the slot table (`lora.rs`).
    lora: lora::EngineLora,
}

impl LlmEngine {
    /// Checks that the KV cache and the executor agree on the block layout.
    pub fn new(
        config: EngineConfig,
        kv: Box<dyn KvCacheManager>,
        executor: Box<dyn Executor>,
    ) -> Result<Self, EngineError> {
        if kv.block_size() != executor.block_size() {
            return Err(EngineError::InvalidConfig(format!(
                "KV cache block size {} differs from the executor's {}",
                kv.block_size(),
                executor.block_size()
            )));
        }
        let stats = kv.stats();
        let (gpu, cpu) = executor.num_blocks();
        if stats.total_blocks > gpu || stats.cpu_total_blocks > cpu {
            return Err(EngineError::InvalidConfig(format!(
                "KV cache has {}+{} blocks but the executor's pools hold {gpu}+{cpu}",
                stats.total_blocks, stats.cpu_total_blocks
            )));
        }
        let caps = executor.capabilities();
        let proposer: Option<Box<dyn Proposer>> = match &config.scheduler.speculative {
            Some(SpecConfig {
                method:
                    SpecMethod::Ngram {
                        prompt_lookup_min,
                        prompt_lookup_max,
                    },
                ..
            }) => Some(Box::new(NgramProposer {
                min: *prompt_lookup_min,
                max: *prompt_lookup_max,
            })),
            // A draft model is built by the caller: `set_proposer`.
            _ => None,
        };
        let governor = config
            .scheduler
            .speculative
            .as_ref()
            .filter(|s| s.adaptive)
            .map(|_| Governor::new());
        let lora = lora::EngineLora::new(executor.supports_lora());
        let runner = if config.scheduler.async_scheduling {
            Runner::Worker(ExecWorker::spawn(executor)?)
        } else {
            Runner::Direct(executor)
        };
        Ok(Self {
            scheduler: Scheduler::new(config.scheduler)?.with_eos_token_ids(config.eos_token_ids),
            kv,
            runner,
            in_flight: None,
            overlap: OverlapStats::default(),
            caps,
            timings: StepTimings::default(),
            grammars: GrammarStates::default(),
            count_slots: count_slots::CountSlots::new(caps.count_slots),
            kv_events: None,
            proposer,
            governor,
            lora,
        })
    }

    /// Installs speculative decoding's proposer (a draft model's; the
    /// n-gram proposer is installed from the configuration). Proposals
    /// are made only while `SchedulerConfig::speculative` is set.
    pub fn set_proposer(&mut self, proposer: Box<dyn Proposer>) {
        self.proposer = Some(proposer);
    }

    /// Asks the proposer for the next step's proposals of the sequences
    /// that may speculate (`Scheduler::spec_candidates`; while the
    /// governor probes, only a few of them: `Drafting`); returns whether
    /// any may (whether or not the governor let them).
    fn propose(&mut self) -> bool {
        let Some(proposer) = self.proposer.as_mut() else {
            return false;
        };
        let candidates = self.scheduler.spec_candidates();
        let live = self.scheduler.live_seq_ids();
        proposer.retain(&|seq| live.contains(&seq));
        if candidates.is_empty() {
            return false;
        }
        let drafting = self
            .governor
            .as_ref()
            .map_or(Drafting::All, |g| g.drafting());
        let (order, most) = drafting.order(candidates.len());
        let order: Vec<usize> = order.collect();
        // Asked in rounds until `most` sequences have a proposal: one
        // round unless some (n-gram lookup) come back empty.
        let (mut asked, mut proposed) = (0, 0);
        while proposed < most && asked < order.len() {
            let round = &order[asked..(asked + most - proposed).min(order.len())];
            asked += round.len();
            let scheduler = &self.scheduler;
            let (ids, inputs): (Vec<_>, Vec<_>) = round
                .iter()
                .filter_map(|&i| {
                    let c = &candidates[i];
                    let seq = scheduler.group(c.request_id)?.seqs.first()?;
                    let input = ProposeInput {
                        seq: c.seq_id,
                        tokens: &seq.tokens,
                        max: c.max,
                    };
                    Some((c.request_id, input))
                })
                .unzip();
            let proposals = proposer.propose(&inputs);
            drop(inputs);
            for (id, p) in ids.into_iter().zip(proposals) {
                proposed += usize::from(!p.is_empty());
                self.scheduler.set_proposals(id, p);
            }
        }
        true
    }

    /// Turns on the KV manager's event recording and hands every step's
    /// events to `sink` (on the engine thread, once per step that recorded
    /// any; the sink must not block).
    pub fn set_kv_event_sink(&mut self, sink: Box<dyn KvEventSink>) {
        self.kv.record_events(true);
        self.kv_events = Some(sink);
    }

    /// Hands the events recorded since the last call to the sink.
    fn publish_kv_events(&mut self) {
        if let Some(sink) = self.kv_events.as_mut() {
            let events = self.kv.take_events();
            if !events.is_empty() {
                sink.publish(events);
            }
        }
    }

    /// Validates and queues a request; refuses at once what can never run.
    pub fn add_request(
        &mut self,
        request_id: RequestId,
        prompt: Vec<u32>,
        params: RequestParams,
    ) -> Result<(), EngineError> {
        let valid = validate_request(
            self.scheduler.config(),
            self.kv_capacity_tokens(),
            prompt,
            params,
        )?;
        self.add_valid_request(request_id, valid)
    }

    /// Queues a request validated already (by [`EngineHandle::add_request`]).
    pub fn add_valid_request(
        &mut self,
        request_id: RequestId,
        request: ValidRequest,
    ) -> Result<(), EngineError> {
        self.scheduler
            .add_request(self.kv.as_ref(), request_id, request)
    }

    /// Aborts a request wherever it is; its blocks are freed at once.
    /// Returns false for an unknown or finished id.
    pub fn abort_request(&mut self, request_id: RequestId) -> bool {
        self.scheduler.abort(self.kv.as_mut(), request_id).is_some()
    }

    /// Whether any request is unfinished.
    pub fn has_unfinished(&self) -> bool {
        self.scheduler.has_unfinished()
    }

    pub fn stats(&self) -> EngineStats {
        EngineStats {
            scheduler: self.scheduler.stats(),
            kv: self.kv.stats(),
        }
    }

    pub fn timings(&self) -> StepTimings {
        self.timings
    }

    /// What asynchronous scheduling ran ahead.
    pub fn overlap_stats(&self) -> OverlapStats {
        self.overlap
    }

    pub fn scheduler_config(&self) -> &SchedulerConfig {
        self.scheduler.config()
    }

    /// Tokens the whole accelerator pool holds.
    pub fn kv_capacity_tokens(&self) -> usize {
        self.kv.stats().total_blocks * self.kv.block_size()
    }

    /// Runs one iteration and returns every request's news. With
    /// asynchronous scheduling the iteration also schedules and launches
    /// the next step (see `overlap`).
    pub fn step(&mut self) -> Vec<RequestOutput> {
        let outs = if matches!(self.runner, Runner::Worker(_)) {
            self.step_overlapped()
        } else {
            self.step_direct()
        };
        self.publish_kv_events();
        outs
    }

    /// [`Self::step`] with the executor on this thread.
    fn step_direct(&mut self) -> Vec<RequestOutput> {
        let t0 = Instant::now();
        let could_speculate = self.propose();
        let sched = self.scheduler.schedule(self.kv.as_mut());
        let t1 = Instant::now();
        let mut outs = Outputs::default();
        push_refused(&sched, &mut outs);
        if sched.is_empty() {
            self.timings.schedule += t1 - t0;
            return outs.into_list();
        }
        let sampling = self.sampling(&sched);
        let (result, masks) = self.execute_with_masks(&sched, &sampling);
        let t2 = Instant::now();
        let outcome = self.sample(&sched, result, &masks);
        let accepted_before = self.accepted_tokens();
        self.scheduler.update_from_output(
            self.kv.as_mut(),
            &sched,
            outcome,
            &Ahead::none(),
            &mut outs,
        );
        self.record_timings(t0, t1, t2);
        let counted = could_speculate && decode_only(&sched);
        self.govern(&sched, counted, accepted_before, t0);
        outs.into_list()
    }

    /// Proposals accepted so far (0 without a governor: only it reads them).
    fn accepted_tokens(&self) -> u64 {
        match self.governor {
            Some(_) => self.scheduler.stats().spec.accepted_tokens,
            None => 0,
        }
    }

    /// Reports a step that began at `t0` and has been applied to the
    /// governor, if `counted` (the steps it compares: decode only, with a
    /// sequence that could speculate).
    fn govern(
        &mut self,
        sched: &SchedulerOutput,
        counted: bool,
        accepted_before: u64,
        t0: Instant,
    ) {
        if self.governor.is_none() || !counted {
            return;
        }
        let accepted = self.accepted_tokens() - accepted_before;
        if let Some(g) = self.governor.as_mut() {
            g.record(StepSample {
                secs: t0.elapsed().as_secs_f64(),
                rows: sched.targets.len(),
                drafted: sched.spec.iter().map(|s| s.proposals.len()).sum(),
                accepted: accepted as usize,
            });
        }
    }

    /// Whether the next step should ask for proposals: a proposer, a load
    /// that allows speculation, and a governor (if any) that does not say
    /// plain.
    fn wants_proposals(&self) -> bool {
        self.proposer.is_some()
            && self.scheduler.may_speculate()
            && self
                .governor
                .as_ref()
                .is_none_or(|g| g.drafting() != Drafting::Off)
    }

    /// Adds one step's schedule / execute / postprocess times (now is the end).
    fn record_timings(&mut self, t0: Instant, t1: Instant, t2: Instant) {
        let t3 = Instant::now();
        self.timings.schedule += t1 - t0;
        self.timings.execute += t2 - t1;
        self.timings.postprocess += t3 - t2;
        self.timings.steps += 1;
    }

    /// Runs the step; meanwhile, on a second thread, the grammar masks of
    /// the constrained rows (such rows are always drawn on the host).
    /// Returns the executor's answer and one mask slot per sampled row.
    fn execute_with_masks(
        &mut self,
        sched: &SchedulerOutput,
        sampling: &Sampling,
    ) -> (Result<StepOutput, ExecError>, Vec<Option<Mask>>) {
        let lora = match self.lora.place(sched) {
            Ok(l) => l,
            Err(e) => return (Err(e), Vec::new()),
        };
        let scheduler = &self.scheduler;
        let grammars = &mut self.grammars;
        let work = mask_work(scheduler, grammars, &sched.targets);
        let Some(executor) = self.runner.direct() else {
            return (Err(ExecError::WorkerStopped), Vec::new());
        };
        if work.is_empty() {
            return (
                executor.execute_lora(&sched.ops, &sched.batch, &lora, sampling),
                Vec::new(),
            );
        }
        let (result, computed, spent, waited) = std::thread::scope(|s| {
            let h = s.spawn(|| {
                let t = Instant::now();
                let m = grammars.compute_masks(&work);
                (m, t.elapsed())
            });
            let result = executor.execute_lora(&sched.ops, &sched.batch, &lora, sampling);
            let t = Instant::now();
            let (computed, spent) = h.join().unwrap_or_else(|_| (Vec::new(), Duration::ZERO));
            (result, computed, spent, t.elapsed())
        });
        let masks = place_masks(&work, computed, sched.targets.len());
        self.timings.mask_compute += spent;
        self.timings.mask_wait += waited;
        self.timings.mask_steps += 1;
        (result, masks)
    }
}

/// The grammar work of a step's constrained rows (after dropping the
/// matchers of groups that left).
fn mask_work<'a>(
    scheduler: &'a Scheduler,
    grammars: &mut GrammarStates,
    targets: &[SampleTarget],
) -> Vec<MaskWork<'a>> {
    if !grammars.is_empty() {
        grammars.retain(|id| scheduler.group(id).is_some());
    }
    targets
        .iter()
        .enumerate()
        .filter_map(|(row, t)| {
            let g = scheduler.group(t.request_id)?;
            let grammar = g.params.sampling.structured.as_ref()?;
            let seq = g.seqs.get(t.seq_index)?;
            Some(MaskWork {
                row,
                request_id: t.request_id,
                seq_index: t.seq_index,
                grammar,
                output: seq.tokens.get(seq.prompt_len..).unwrap_or(&[]),
            })
        })
        .collect()
}

/// One mask slot per sampled row from the computed masks (empty when no
/// row is constrained). When the computation failed (`computed` short), the
/// constrained rows may only end.
fn place_masks(
    work: &[MaskWork<'_>],
    computed: Vec<(usize, Mask)>,
    rows: usize,
) -> Vec<Option<Mask>> {
    if work.is_empty() {
        return Vec::new();
    }
    let mut masks: Vec<Option<Mask>> = vec![None; rows];
    if computed.len() == work.len() {
        for (row, m) in computed {
            masks[row] = Some(m);
        }
    } else {
        tracing::error!("grammar mask computation failed; constrained sequences end");
        for w in work {
            masks[w.row] = Some(Mask::only(w.grammar.eos(), w.grammar.vocab_size()));
        }
    }
    masks
}

/// Reports the requests a schedule refused.
fn push_refused(sched: &SchedulerOutput, outs: &mut Outputs) {
    for (id, e) in &sched.refused {
        outs.push_failed(*id, e.clone());
    }
}

/// True when every row of the step is a sampled row or a proposal (no
/// prompt tokens): the steps the speculation governor compares. Reads the
/// batch: call it before the batch is moved out.
fn decode_only(sched: &SchedulerOutput) -> bool {
    let proposals: usize = sched.spec.iter().map(|s| s.proposals.len()).sum();
    sched.prompt_targets.is_empty()
        && sched.batch.token_ids.len() == sched.targets.len() + proposals
}
