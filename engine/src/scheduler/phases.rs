//! The three scheduling phases and preemption. See the module docs of
//! [`super`] for the policy; each phase is one method over a shared [`Step`].

use super::batch::{blocks_needed, plan_len, plan_tokens, BatchBuilder, TokenPlan};
use super::budget::StepBudget;
use super::config::{PreemptionMode, SchedulerConfig};
use super::sequence::{QueueKey, SeqStatus};
use super::{Scheduler, SchedulerOutput};
use crate::error::{EngineError, RequestError};
use crate::kv::{AdmitDecision, KvCacheManager, KvError, LengthHint};

/// One step in progress: the budget, the batch being built and the output.
pub(crate) struct Step {
    pub budget: StepBudget,
    pub builder: BatchBuilder,
    pub out: SchedulerOutput,
    chunked: bool,
}

impl Step {
    pub fn new(config: &SchedulerConfig) -> Self {
        Self {
            budget: StepBudget::new(config.max_num_batched_tokens, config.max_num_seqs),
            builder: BatchBuilder::default(),
            out: SchedulerOutput::default(),
            chunked: config.enable_chunked_prefill,
        }
    }

    /// The tokens of a resident group that fit the remaining budget.
    fn plan(&self, group: &super::SequenceGroup) -> Option<TokenPlan> {
        plan_tokens(group, self.budget.remaining_tokens(), self.chunked)
    }

    /// Moves the builder's work into the output.
    /// Prompt rows go after the sampled rows (see `batch`).
    pub fn finish(mut self) -> SchedulerOutput {
        let mut batch = self.builder.batch;
        batch.logits_rows.extend(self.builder.prompt_rows);
        batch.logits_rows.extend(self.builder.spec_rows);
        self.out.batch = batch;
        self.out.spec = self.builder.spec;
        self.out.ops.copies = self.builder.copies;
        self.out.targets = self.builder.targets;
        self.out.prompt_targets = self.builder.prompt_targets;
        self.out.seq_lora = self.builder.seq_lora;
        self.out
    }
}

/// How [`Scheduler::try_fit`] ended.
enum Fit {
    /// The plan's blocks are free: commit it.
    Fits,
    /// The group itself was preempted (it was the last running group).
    PreemptedSelf,
}

impl Scheduler {
    /// Phase 1: keep running groups going, preempting from the back.
    pub(crate) fn schedule_running(&mut self, kv: &mut dyn KvCacheManager, step: &mut Step) {
        let keys: Vec<QueueKey> = self.running.iter().copied().collect();
        for key in &keys {
            if let Some(g) = self.groups.get(&key.id) {
                step.budget.add_seqs(g.num_unfinished());
            }
        }
        let num_keys = keys.len();
        for (i, key) in keys.into_iter().enumerate() {
            if !self.running.contains(&key) {
                continue; // preempted earlier in this step
            }
            let Some(plan) = self.groups.get(&key.id).and_then(|g| step.plan(g)) else {
                continue;
            };
            let plan = self.with_proposals(kv, step, key, plan, num_keys - i - 1);
            match self.try_fit(kv, step, key, &plan) {
                Ok(Fit::Fits) => self.commit(kv, step, key, &plan),
                Ok(Fit::PreemptedSelf) => {}
                Err(e) => self.fail(kv, step, key, e),
            }
        }
    }

    /// Phase 2: bring swapped groups back, oldest (highest priority) first.
    pub(crate) fn schedule_swapped(&mut self, kv: &mut dyn KvCacheManager, step: &mut Step) {
        let keys: Vec<QueueKey> = self.swapped.iter().copied().collect();
        for key in keys {
            if !self.groups.get(&key.id).is_some_and(|g| self.lora_fits(g)) {
                continue; // --max-loras adapters already running
            }
            let Some(group) = self.groups.get_mut(&key.id) else {
                continue;
            };
            let ids = group.unfinished_ids();
            if !step.budget.has_seq_room(ids.len()) || !kv.can_swap_in(&ids) {
                break;
            }
            match kv.swap_in(&ids) {
                Ok(copies) => step.out.ops.swap_in.extend(copies),
                Err(e) => {
                    self.fail(kv, step, key, e);
                    continue;
                }
            }
            group.set_status(SeqStatus::Running);
            self.swapped.remove(&key);
            self.running.insert(key);
            step.budget.add_seqs(ids.len());
            // Resident again; it computes this step only if its slots fit now.
            let Some(plan) = step.plan(group) else {
                continue;
            };
            match blocks_needed(kv, group, &plan) {
                Ok(n) if n <= kv.num_free_blocks() => self.commit(kv, step, key, &plan),
                Ok(_) => {}
                Err(e) => self.fail(kv, step, key, e),
            }
        }
    }

    /// Phase 3: admit waiting groups FCFS while they fit.
    pub(crate) fn schedule_waiting(&mut self, kv: &mut dyn KvCacheManager, step: &mut Step) {
        let keys: Vec<QueueKey> = self.waiting.iter().copied().collect();
        for key in keys {
            if step.budget.remaining_tokens() == 0 {
                break;
            }
            let Some(group) = self.groups.get(&key.id) else {
                continue;
            };
            let num_seqs = group.expected_seqs();
            if !step.budget.has_seq_room(num_seqs) {
                break;
            }
            if !self.lora_fits(group) {
                continue; // --max-loras adapters already running
            }
            // Without chunking the whole history must fit this step.
            let longest = group
                .unfinished()
                .map(|s| s.tokens.len())
                .max()
                .unwrap_or(0);
            if !step.chunked && longest > step.budget.remaining_tokens() {
                break;
            }
            let hint = LengthHint {
                max_total_tokens: group.max_total_tokens(self.config.max_model_len),
                oracle_total_tokens: None,
            };
            let decision = group
                .unfinished()
                .max_by_key(|s| s.tokens.len())
                .map(|s| kv.can_admit_keyed(&s.tokens, num_seqs, hint, group.cache_key()));
            match decision {
                Some(AdmitDecision::Now) => {}
                Some(AdmitDecision::Later) | None => break,
                Some(AdmitDecision::Never) => {
                    let capacity_tokens = kv.stats().total_blocks * kv.block_size();
                    self.refuse(
                        kv,
                        step,
                        key,
                        RequestError::NeverFits {
                            needed_tokens: longest,
                            capacity_tokens,
                        }
                        .into(),
                    );
                    continue;
                }
            }
            match self.admit(kv, step, key, hint) {
                Ok(true) => {}
                Ok(false) => break,
                Err(e) => self.fail(kv, step, key, e),
            }
        }
    }

    /// Allocates a waiting group's sequences and schedules its first chunk.
    /// `Ok(false)` (with everything rolled back) when the chunk's blocks do
    /// not fit after all.
    fn admit(
        &mut self,
        kv: &mut dyn KvCacheManager,
        step: &mut Step,
        key: QueueKey,
        hint: LengthHint,
    ) -> Result<bool, KvError> {
        let Some(group) = self.groups.get_mut(&key.id) else {
            return Ok(true);
        };
        let mut cached = 0;
        // A group collecting prompt logprobs computes every prompt position:
        // cached positions would never be scored (vLLM skips the cache too).
        let uncached = group.next_prompt_logprob().is_some();
        let key_extra = group.cache_key();
        for i in 0..group.seqs.len() {
            let seq = &mut group.seqs[i];
            if seq.is_finished() {
                continue;
            }
            let allocated = if uncached {
                kv.allocate_uncached_keyed(seq.id, &seq.tokens, hint, key_extra)
            } else {
                kv.allocate_keyed(seq.id, &seq.tokens, hint, key_extra)
            };
            match allocated {
                Ok(n) => {
                    seq.num_computed_tokens = n;
                    seq.status = SeqStatus::Running;
                    cached = cached.max(n);
                }
                Err(e) => {
                    Self::release(kv, group);
                    return Err(e);
                }
            }
        }
        let plan = step.plan(group);
        let fits = match &plan {
            Some(p) => blocks_needed(kv, group, p)? <= kv.num_free_blocks(),
            None => false,
        };
        let Some(plan) = plan.filter(|_| fits) else {
            Self::release(kv, group);
            return Ok(false);
        };
        group.num_cached_tokens = cached;
        self.waiting.remove(&key);
        self.running.insert(key);
        step.budget.add_seqs(group.num_unfinished());
        self.commit(kv, step, key, &plan);
        Ok(true)
    }

    /// Frees a group's resident sequences and puts them back to "nothing computed".
    fn release(kv: &mut dyn KvCacheManager, group: &mut super::SequenceGroup) {
        for seq in group.seqs.iter_mut().filter(|s| !s.is_finished()) {
            if matches!(seq.status, SeqStatus::Running | SeqStatus::Swapped) {
                kv.free(seq.id);
            }
            seq.num_computed_tokens = 0;
            seq.status = SeqStatus::Waiting;
        }
    }

    /// Preempts from the back of the running queue until `plan` fits.
    fn try_fit(
        &mut self,
        kv: &mut dyn KvCacheManager,
        step: &mut Step,
        key: QueueKey,
        plan: &TokenPlan,
    ) -> Result<Fit, KvError> {
        loop {
            let Some(group) = self.groups.get(&key.id) else {
                return Ok(Fit::PreemptedSelf);
            };
            if blocks_needed(kv, group, plan)? <= kv.num_free_blocks() {
                return Ok(Fit::Fits);
            }
            let Some(&victim) = self.running.last() else {
                return Ok(Fit::PreemptedSelf);
            };
            self.preempt(kv, step, victim);
            if victim == key {
                return Ok(Fit::PreemptedSelf);
            }
        }
    }

    /// Preempts a whole running group: swap when the mode and the CPU pool
    /// allow, otherwise recompute.
    fn preempt(&mut self, kv: &mut dyn KvCacheManager, step: &mut Step, key: QueueKey) {
        let Some(group) = self.groups.get_mut(&key.id) else {
            return;
        };
        let ids = group.unfinished_ids();
        self.running.remove(&key);
        step.budget.remove_seqs(ids.len());
        step.out.preempted.push(key.id);
        if self.config.preemption_mode != PreemptionMode::Recompute {
            if let Ok(copies) = kv.swap_out(&ids) {
                step.out.ops.swap_out.extend(copies);
                group.set_status(SeqStatus::Swapped);
                self.swapped.insert(key);
                self.stats.preemptions_swap += 1;
                return;
            }
        }
        Self::release(kv, group);
        self.waiting.insert(key);
        self.stats.preemptions_recompute += 1;
    }

    /// Reserves the plan's slots and adds its tokens to the batch.
    fn commit(
        &mut self,
        kv: &mut dyn KvCacheManager,
        step: &mut Step,
        key: QueueKey,
        plan: &TokenPlan,
    ) {
        let Some(group) = self.groups.get_mut(&key.id) else {
            return;
        };
        match step.builder.push_group(kv, group, plan) {
            Ok(()) => {
                step.budget.consume_tokens(plan_len(plan));
                step.out.scheduled.push(key.id);
            }
            Err(e) => self.fail(kv, step, key, e),
        }
    }

    /// Removes a group after a KV cache failure the budget did not foresee.
    fn fail(&mut self, kv: &mut dyn KvCacheManager, step: &mut Step, key: QueueKey, e: KvError) {
        tracing::error!(request = %key.id, error = %e, "KV cache refused a budgeted operation");
        self.refuse(kv, step, key, EngineError::from(e));
    }

    /// Removes a group with an error reported to its caller.
    fn refuse(
        &mut self,
        kv: &mut dyn KvCacheManager,
        step: &mut Step,
        key: QueueKey,
        error: EngineError,
    ) {
        if self.abort(kv, key.id).is_some() {
            self.stats.refused += 1;
            step.out.refused.push((key.id, error));
        }
    }
}
