//! The two ways of running a trace through the scheduler and a KV policy:
//!
//! - [`run_real`]: the whole engine (`LlmEngine` + `CpuExecutor` running the
//!   real model), wall-clock time, arrivals released as their time comes.
//! - [`run_simulated`] (`--simulate`): the real `Scheduler` and the real KV
//!   managers, but no forward pass: each step takes a fixed time model
//!   `base + per_token x batched tokens` on a virtual clock, and each
//!   scheduled sequence gets a placeholder token; a request finishes at its
//!   reference output length. Memory behaviour (admission, reservation,
//!   preemption) is exactly the engine's; timings are the model's.
//!
//! Both sample, once per step, the number of running requests and the KV
//! slots allocated vs holding real token states.

use super::hint::KvSetup;
use anyhow::{Context, Result};
use engine::executor::CpuExecutor;
use engine::model::CpuModel;
use engine::sampler::SampleOut;
use engine::scheduler::{
    validate_request, Ahead, Outputs, RequestId, RequestParams, Scheduler, SchedulerConfig,
    StepOutcome,
};
use engine::{EngineConfig, EngineError, LlmEngine};
use std::path::Path;
use std::time::{Duration, Instant};

/// One request of a trace, tokenized.
#[derive(Debug, Clone)]
pub struct TraceRequest {
    pub prompt: Vec<u32>,
    pub output_len: usize,
    /// Arrival time, seconds from the start.
    pub arrival: f64,
}

/// What one run measured.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunStats {
    pub steps: u64,
    sum_running: f64,
    sum_used: f64,
    sum_alloc: f64,
    sum_total: f64,
    /// (arrival, finish, output tokens) of each finished request.
    pub finished: Vec<(f64, f64, usize)>,
    pub refused: usize,
    /// The first refusal's reason.
    pub first_refusal: Option<String>,
    pub preemptions: u64,
    pub duration_s: f64,
}

impl RunStats {
    /// Records one step's gauges.
    pub fn sample(
        &mut self,
        running: usize,
        used_slots: usize,
        allocated_slots: usize,
        total_slots: usize,
    ) {
        self.steps += 1;
        self.sum_total += total_slots as f64;
        self.sum_running += running as f64;
        self.sum_used += used_slots as f64;
        self.sum_alloc += allocated_slots as f64;
    }

    /// Mean running requests per step.
    pub fn avg_running(&self) -> f64 {
        self.sum_running / (self.steps.max(1) as f64)
    }

    /// Share of allocated KV slots holding real token states, over all steps.
    pub fn used_share(&self) -> f64 {
        if self.sum_alloc == 0.0 {
            0.0
        } else {
            self.sum_used / self.sum_alloc
        }
    }

    /// Share of the whole KV budget holding real token states, over all
    /// steps (counts free and fragmented space as waste too).
    pub fn budget_share(&self) -> f64 {
        if self.sum_total == 0.0 {
            0.0
        } else {
            self.sum_used / self.sum_total
        }
    }

    /// The paper's normalized latency: mean of e2e / output tokens (s/token).
    pub fn normalized_latency(&self) -> f64 {
        let v: Vec<f64> = self
            .finished
            .iter()
            .filter(|f| f.2 > 0)
            .map(|&(a, f, n)| (f - a) / n as f64)
            .collect();
        v.iter().sum::<f64>() / (v.len().max(1) as f64)
    }

    /// Finished requests per second.
    pub fn throughput(&self) -> f64 {
        self.finished.len() as f64 / self.duration_s.max(f64::MIN_POSITIVE)
    }
}

/// The linear step-time model of `--simulate`.
#[derive(Debug, Clone, Copy)]
pub struct StepModel {
    pub base_s: f64,
    pub per_token_s: f64,
}

fn params(output_len: usize) -> RequestParams {
    RequestParams {
        max_tokens: Some(output_len),
        ignore_eos: true,
        ..RequestParams::default()
    }
}

/// Runs the trace on the scheduler and a real KV manager, simulated time.
pub fn run_simulated(
    trace: &[TraceRequest],
    kv_setup: &KvSetup,
    sched_cfg: &SchedulerConfig,
    model: StepModel,
) -> Result<RunStats> {
    let truths: Vec<(Vec<u32>, usize)> = trace
        .iter()
        .map(|r| (r.prompt.clone(), r.prompt.len() + r.output_len))
        .collect();
    let mut kv = kv_setup.build(&truths)?;
    let mut sched = Scheduler::new(sched_cfg.clone())?;
    let mut stats = RunStats::default();
    let mut arrivals = std::collections::HashMap::new();
    let mut produced = std::collections::HashMap::new();
    let (mut clock, mut next) = (0.0f64, 0usize);
    loop {
        while next < trace.len() && trace[next].arrival <= clock {
            let r = &trace[next];
            let id = RequestId(next as u64);
            let capacity = kv.stats().total_blocks * kv.block_size();
            let valid =
                validate_request(sched_cfg, capacity, r.prompt.clone(), params(r.output_len))
                    .map_err(EngineError::from);
            match valid.and_then(|v| sched.add_request(kv.as_ref(), id, v)) {
                Ok(()) => {
                    arrivals.insert(id, (r.arrival, r.output_len));
                }
                Err(e) => {
                    stats.refused += 1;
                    stats.first_refusal.get_or_insert_with(|| e.to_string());
                }
            }
            next += 1;
        }
        if !sched.has_unfinished() {
            match trace.get(next) {
                Some(r) => {
                    clock = clock.max(r.arrival);
                    continue;
                }
                None => break,
            }
        }
        let out = sched.schedule(kv.as_mut());
        stats.refused += out.refused.len();
        if let Some((_, e)) = out.refused.first() {
            stats.first_refusal.get_or_insert_with(|| e.to_string());
        }
        if out.is_empty() {
            // Nothing runnable: jump to the next arrival, or stop if none.
            match trace.get(next) {
                Some(r) => clock = clock.max(r.arrival),
                None => break,
            }
            continue;
        }
        let kvs = kv.stats();
        stats.sample(
            sched.stats().num_running,
            kvs.used_slots,
            kvs.allocated_slots,
            kvs.total_blocks * kv.block_size(),
        );
        clock += model.base_s + model.per_token_s * out.batch.token_ids.len() as f64;
        // Every row "draws" token 0; requests end at their `max_tokens`
        // (their oracle output length), applied as the engine applies a step.
        let rows = out
            .targets
            .iter()
            .map(|_| SampleOut {
                token: 0,
                logprob: 0.0,
                top_logprobs: Vec::new(),
            })
            .collect();
        let mut news = Outputs::default();
        sched.update_from_output(
            kv.as_mut(),
            &out,
            StepOutcome::Device {
                rows,
                spec: Vec::new(),
            },
            &Ahead::none(),
            &mut news,
        );
        for o in news.into_list() {
            let n = produced.entry(o.request_id).or_insert(0);
            *n += o.token_ids().len();
            if o.finished {
                let (arrival, _) = arrivals.get(&o.request_id).copied().unwrap_or((0.0, 0));
                stats.finished.push((arrival, clock, *n));
            }
        }
    }
    let s = sched.stats();
    stats.preemptions = s.preemptions_swap + s.preemptions_recompute;
    stats.duration_s = clock - trace.first().map_or(0.0, |r| r.arrival);
    Ok(stats)
}

/// Runs the trace on the whole engine with the real model, wall-clock time.
pub fn run_real(
    trace: &[TraceRequest],
    kv_setup: &KvSetup,
    sched_cfg: &SchedulerConfig,
    model_path: &Path,
) -> Result<RunStats> {
    let loaded = model_loader::load_model(model_path)
        .with_context(|| format!("loading {}", model_path.display()))?;
    let eos = loaded.tokenizer.eos_token_ids().to_vec();
    let model = CpuModel::new(loaded.config, loaded.weights)?;
    let executor = CpuExecutor::new(model, kv_setup.num_blocks(), 0, kv_setup.block_size())?;
    let truths: Vec<(Vec<u32>, usize)> = trace
        .iter()
        .map(|r| (r.prompt.clone(), r.prompt.len() + r.output_len))
        .collect();
    let kv = kv_setup.build(&truths)?;
    let cfg = EngineConfig {
        scheduler: sched_cfg.clone(),
        eos_token_ids: eos,
    };
    let mut engine = LlmEngine::new(cfg, kv, Box::new(executor))?;
    let mut stats = RunStats::default();
    let mut produced = vec![0usize; trace.len()];
    let start = Instant::now();
    let mut next = 0usize;
    loop {
        let now = start.elapsed().as_secs_f64();
        while next < trace.len() && trace[next].arrival <= now {
            let r = &trace[next];
            let id = RequestId(next as u64);
            if let Err(e) = engine.add_request(id, r.prompt.clone(), params(r.output_len)) {
                stats.refused += 1;
                stats.first_refusal.get_or_insert_with(|| e.to_string());
            }
            next += 1;
        }
        if !engine.has_unfinished() {
            match trace.get(next) {
                Some(r) => {
                    std::thread::sleep(Duration::from_secs_f64((r.arrival - now).max(0.0)));
                    continue;
                }
                None => break,
            }
        }
        let outs = engine.step();
        let st = engine.stats();
        stats.sample(
            st.scheduler.num_running,
            st.kv.used_slots,
            st.kv.allocated_slots,
            st.kv.total_blocks * kv_setup.block_size(),
        );
        let t = start.elapsed().as_secs_f64();
        for o in outs {
            let i = o.request_id.0 as usize;
            let n: usize = o.seqs.iter().map(|s| s.new_token_ids.len()).sum();
            if let Some(p) = produced.get_mut(i) {
                *p += n;
            }
            if let Some(e) = &o.error {
                stats.refused += 1;
                stats.first_refusal.get_or_insert_with(|| e.to_string());
            } else if o.finished {
                stats.finished.push((trace[i].arrival, t, produced[i]));
            }
        }
    }
    let s = engine.stats().scheduler;
    stats.preemptions = s.preemptions_swap + s.preemptions_recompute;
    stats.duration_s = start.elapsed().as_secs_f64() - trace.first().map_or(0.0, |r| r.arrival);
    Ok(stats)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench_paper::hint::Policy;

    #[test]
    fn run_stats_by_hand() {
        let mut s = RunStats::default();
        s.sample(2, 30, 100, 200);
        s.sample(4, 70, 100, 200);
        s.finished = vec![(0.0, 2.0, 4), (1.0, 2.0, 2)];
        s.duration_s = 4.0;
        assert_eq!(s.avg_running(), 3.0);
        assert!((s.used_share() - 0.5).abs() < 1e-12);
        assert!((s.budget_share() - 0.25).abs() < 1e-12);
        assert!((s.normalized_latency() - 0.5).abs() < 1e-12);
        assert!((s.throughput() - 0.5).abs() < 1e-12);
    }

    /// Memory-only simulation on a hand-made trace: 4 requests of 8 prompt
    /// and 8 output tokens, 64 slots. Max reserves 32 per request (2 fit at
    /// once), Oracle 16 (4 fit), and everything finishes.
    #[test]
    fn simulation_admits_by_policy() {
        let trace: Vec<TraceRequest> = (0..4)
            .map(|i| TraceRequest {
                prompt: vec![100 + i; 8],
                output_len: 8,
                arrival: 0.0,
            })
            .collect();
        let cfg = SchedulerConfig {
            max_model_len: 32,
            ..SchedulerConfig::default()
        };
        let model = StepModel {
            base_s: 0.01,
            per_token_s: 0.0,
        };
        let setup = |policy| KvSetup {
            policy,
            budget_tokens: 64,
            paged_block_size: 4,
            orca_block_size: 1,
            prefix_caching: false,
            max_model_len: 32,
        };
        let max = run_simulated(&trace, &setup(Policy::OrcaMax), &cfg, model).unwrap();
        let oracle = run_simulated(&trace, &setup(Policy::OrcaOracle), &cfg, model).unwrap();
        let paged = run_simulated(&trace, &setup(Policy::Paged), &cfg, model).unwrap();
        for r in [&max, &oracle, &paged] {
            assert_eq!(r.finished.len(), 4);
            assert_eq!(r.refused, 0);
            assert!(r.finished.iter().all(|f| f.2 == 8));
        }
        assert!(max.avg_running() <= 2.0 + 1e-9, "max {}", max.avg_running());
        assert!(
            oracle.avg_running() > 3.0,
            "oracle {}",
            oracle.avg_running()
        );
        assert!(paged.used_share() > oracle.used_share());
        assert!(oracle.used_share() > max.used_share());
    }
}
