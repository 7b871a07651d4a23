//! Memory saving of parallel sampling and beam search (paper §6.3, Fig. 15):
//! KV blocks in use when each prompt runs as one group of `k` sequences on
//! shared copy-on-write blocks (`n = k`, or beam width `k`), against the same
//! prompts run as `k` independent requests each.
//!
//! Method (the same as `engine/examples/memory_sharing.rs`): the real model
//! on the CPU executor, paged KV, prefix caching off (so independent requests
//! do not share the prompt either), every sequence runs to its reference
//! output length (`ignore_eos`), all requests arrive at once, and the KV pool
//! is sized so nothing is preempted. The only difference between the two
//! runs is block sharing. Blocks in use are sampled after every step; the
//! saving is `1 - shared / independent` of the time-averaged (over steps)
//! count, and of the peak.
//!
//! Cost: two full engine runs per (workload, mode, k); memory O(blocks).

use super::drivers::TraceRequest;
use anyhow::{bail, Result};
use engine::executor::CpuExecutor;
use engine::kv::{PagedKvCacheManager, PagedKvConfig};
use engine::model::CpuModel;
use engine::sampler::SamplingParams;
use engine::scheduler::{RequestId, RequestParams, SchedulerConfig};
use engine::{EngineConfig, LlmEngine};
use model_loader::{ModelConfig, ModelWeights};

/// How the `k` sequences of one prompt are produced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// `n = k` random samples of one prompt.
    Parallel,
    /// Beam search of width `k`.
    Beam,
}

impl Mode {
    pub const ALL: [Mode; 2] = [Mode::Parallel, Mode::Beam];

    pub fn name(self) -> &'static str {
        match self {
            Mode::Parallel => "parallel sampling",
            Mode::Beam => "beam search",
        }
    }
}

/// One measured row.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub workload: &'static str,
    pub mode: Mode,
    pub k: usize,
    /// (time-averaged, peak) blocks in use, shared group run.
    pub shared: (f64, usize),
    /// (time-averaged, peak) blocks in use, independent requests run.
    pub indep: (f64, usize),
}

impl Row {
    /// Saving of time-averaged blocks, in [0, 1] when sharing helps.
    pub fn avg_saving(&self) -> Option<f64> {
        saving(self.shared.0, self.indep.0)
    }

    /// Saving of peak blocks.
    pub fn peak_saving(&self) -> Option<f64> {
        saving(self.shared.1 as f64, self.indep.1 as f64)
    }
}

/// `1 - shared / independent`; `None` when the baseline used no memory.
pub fn saving(shared: f64, indep: f64) -> Option<f64> {
    (indep > 0.0).then(|| 1.0 - shared / indep)
}

/// Per-step samples of blocks in use -> (time average, peak).
pub fn summarize(samples: &[usize]) -> (f64, usize) {
    let peak = samples.iter().copied().max().unwrap_or(0);
    let avg = if samples.is_empty() {
        0.0
    } else {
        samples.iter().sum::<usize>() as f64 / samples.len() as f64
    };
    (avg, peak)
}

/// Blocks that hold `k` full copies of every request (prompt + output), plus
/// one spare block per sequence: enough that neither run is ever preempted.
pub fn pool_blocks(trace: &[TraceRequest], k: usize, block_size: usize) -> usize {
    let per: usize = trace
        .iter()
        .map(|r| (r.prompt.len() + r.output_len).div_ceil(block_size) + 1)
        .sum();
    per * k + 1
}

/// The sampling params of the group run.
fn group_params(mode: Mode, k: usize, seed: u64) -> SamplingParams {
    let beam = mode == Mode::Beam;
    SamplingParams {
        n: if beam { 1 } else { k },
        best_of: Some(k),
        temperature: if beam { 0.0 } else { 1.0 },
        use_beam_search: beam,
        seed: Some(seed),
        ..SamplingParams::default()
    }
}

fn request(max_tokens: usize, sampling: SamplingParams) -> RequestParams {
    RequestParams {
        max_tokens: Some(max_tokens),
        ignore_eos: true,
        sampling,
        ..RequestParams::default()
    }
}

/// The model, loaded once for every run.
pub struct Model {
    pub config: ModelConfig,
    pub weights: ModelWeights,
    pub eos: Vec<u32>,
}

fn engine(m: &Model, blocks: usize, block_size: usize, max_model_len: usize) -> Result<LlmEngine> {
    let model = CpuModel::new(m.config.clone(), m.weights.clone())?;
    let exec = CpuExecutor::new(model, blocks, 0, block_size)?;
    let mut kv_cfg = PagedKvConfig::new(block_size, blocks, 0);
    kv_cfg.enable_prefix_caching = false;
    let kv = PagedKvCacheManager::new(kv_cfg)?;
    let cfg = EngineConfig {
        scheduler: SchedulerConfig {
            max_num_seqs: 256,
            max_num_batched_tokens: 4096.max(max_model_len),
            max_model_len,
            ..SchedulerConfig::default()
        },
        eos_token_ids: m.eos.clone(),
    };
    Ok(LlmEngine::new(cfg, Box::new(kv), Box::new(exec))?)
}

/// Runs every request to the end; per-step blocks in use.
fn measure(eng: &mut LlmEngine, reqs: Vec<(Vec<u32>, RequestParams)>) -> Result<Vec<usize>> {
    for (i, (p, r)) in reqs.into_iter().enumerate() {
        eng.add_request(RequestId(i as u64), p, r)?;
    }
    let mut samples = Vec::new();
    while eng.has_unfinished() {
        for o in eng.step() {
            if let Some(e) = o.error {
                bail!("request failed: {e}");
            }
        }
        let kv = eng.stats().kv;
        samples.push(kv.total_blocks - kv.free_blocks);
    }
    Ok(samples)
}

/// Measures one (workload, mode, k) row.
pub fn measure_row(
    m: &Model,
    workload: &'static str,
    trace: &[TraceRequest],
    mode: Mode,
    k: usize,
    block_size: usize,
    max_model_len: usize,
) -> Result<Row> {
    let blocks = pool_blocks(trace, k, block_size);
    let shared: Vec<_> = trace
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let p = request(r.output_len, group_params(mode, k, i as u64));
            (r.prompt.clone(), p)
        })
        .collect();
    let indep: Vec<_> = trace
        .iter()
        .enumerate()
        .flat_map(|(i, r)| {
            (0..k).map(move |j| {
                let sampling = SamplingParams {
                    temperature: 1.0,
                    seed: Some((i * 100 + j) as u64),
                    ..SamplingParams::default()
                };
                (r.prompt.clone(), request(r.output_len, sampling))
            })
        })
        .collect();
    let s = measure(&mut engine(m, blocks, block_size, max_model_len)?, shared)?;
    let i = measure(&mut engine(m, blocks, block_size, max_model_len)?, indep)?;
    Ok(Row {
        workload,
        mode,
        k,
        shared: summarize(&s),
        indep: summarize(&i),
    })
}

/// The paper's range for (workload, mode), as printed in the table.
pub fn paper_range(workload: &str, mode: Mode) -> &'static str {
    match (workload, mode) {
        ("Alpaca-like", Mode::Parallel) => "6.1-9.8%",
        ("Alpaca-like", Mode::Beam) => "37.6-55.2%",
        (_, Mode::Parallel) => "16.2-30.5%",
        (_, Mode::Beam) => "44.3-66.3%",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn saving_of_hand_made_counts() {
        assert_eq!(saving(30.0, 40.0), Some(0.25));
        assert_eq!(saving(40.0, 40.0), Some(0.0));
        assert_eq!(saving(5.0, 0.0), None);
    }

    #[test]
    fn summarize_averages_over_steps_and_takes_peak() {
        assert_eq!(summarize(&[2, 4, 6, 4]), (4.0, 6));
        assert_eq!(summarize(&[]), (0.0, 0));
    }

    #[test]
    fn pool_holds_k_copies_plus_spare_blocks() {
        let t = |p: usize, o: usize| TraceRequest {
            prompt: vec![1; p],
            output_len: o,
            arrival: 0.0,
        };
        // (10 + 6) / 16 = 1 block (+1 spare); (20 + 13) / 16 -> 3 blocks (+1).
        let trace = [t(10, 6), t(20, 13)];
        assert_eq!(pool_blocks(&trace, 4, 16), (2 + 4) * 4 + 1);
    }

    #[test]
    fn paper_ranges_by_workload_and_mode() {
        assert_eq!(paper_range("Alpaca-like", Mode::Beam), "37.6-55.2%");
        assert_eq!(paper_range("ShareGPT", Mode::Parallel), "16.2-30.5%");
    }

    #[test]
    fn group_params_select_beam_or_parallel() {
        let b = group_params(Mode::Beam, 4, 7);
        assert!(b.use_beam_search);
        assert_eq!((b.n, b.best_of), (1, Some(4)));
        let p = group_params(Mode::Parallel, 6, 7);
        assert!(!p.use_beam_search);
        assert_eq!((p.n, p.best_of), (6, Some(6)));
    }
}
