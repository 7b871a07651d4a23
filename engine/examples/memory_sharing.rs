//! KV blocks used by parallel sampling (n = 2, 4, 6) and beam search
//! (width 2, 4, 6) on shared copy-on-write blocks, against the same number
//! of independent requests, with SmolLM2-135M on ShareGPT prompts.
//!
//! `cargo run --release -p engine --example memory_sharing [-- PROMPTS MAX_OUTPUT]`
//! (defaults: 4 prompts, outputs capped at 32 tokens). Prompts and output
//! lengths come from `<cache>/datasets/sharegpt-*.jsonl` (`cargo xtask
//! fetch-data`). Every sequence runs to its output length (`ignore_eos`), so
//! the only difference between the runs is block sharing. Prefix caching is
//! off, so independent requests do not share the prompt either.
//! Reports time-averaged (over steps) and peak blocks in use, and the saving.

use engine::executor::CpuExecutor;
use engine::kv::{PagedKvCacheManager, PagedKvConfig};
use engine::model::CpuModel;
use engine::sampler::SamplingParams;
use engine::scheduler::{RequestId, RequestParams, SchedulerConfig};
use engine::{EngineConfig, LlmEngine};
use model_loader::{ModelConfig, ModelWeights};
use std::io::BufRead;

const BLOCK: usize = 16;

type Res<T> = Result<T, Box<dyn std::error::Error>>;
const BLOCKS: usize = 4096;

fn arg(i: usize, default: usize) -> usize {
    std::env::args()
        .nth(i)
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// (prompt tokens, output length) of the first `count` ShareGPT records.
fn sharegpt(
    tok: &model_loader::Tokenizer,
    count: usize,
    cap: usize,
) -> Res<Vec<(Vec<u32>, usize)>> {
    let dir = model_loader::paths::cache_dir().join("datasets");
    let file = std::fs::read_dir(&dir)?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "jsonl"))
        .ok_or("no ShareGPT jsonl (run `cargo xtask fetch-data`)")?;
    let mut out = Vec::new();
    for line in std::io::BufReader::new(std::fs::File::open(file)?).lines() {
        let v: serde_json::Value = serde_json::from_str(&line?)?;
        let prompt = tok.encode(v["prompt"].as_str().unwrap_or_default(), true)?;
        let output = v["output_len"].as_u64().unwrap_or(0) as usize;
        if prompt.len() >= 4 && prompt.len() <= 512 && output >= 4 {
            out.push((prompt, output.min(cap)));
        }
        if out.len() == count {
            break;
        }
    }
    Ok(out)
}

fn engine(
    config: &ModelConfig,
    weights: &ModelWeights,
) -> Result<LlmEngine, Box<dyn std::error::Error>> {
    let model = CpuModel::new(config.clone(), weights.clone())?;
    let exec = CpuExecutor::new(model, BLOCKS, 0, BLOCK)?;
    let mut kv_cfg = PagedKvConfig::new(BLOCK, BLOCKS, 0);
    kv_cfg.enable_prefix_caching = false;
    let kv = PagedKvCacheManager::new(kv_cfg)?;
    let cfg = EngineConfig {
        scheduler: SchedulerConfig {
            max_num_seqs: 256,
            max_num_batched_tokens: 4096,
            max_model_len: 2048,
            ..SchedulerConfig::default()
        },
        eos_token_ids: vec![2],
    };
    Ok(LlmEngine::new(cfg, Box::new(kv), Box::new(exec))?)
}

fn params(max_tokens: usize, sampling: SamplingParams) -> RequestParams {
    RequestParams {
        max_tokens: Some(max_tokens),
        ignore_eos: true,
        sampling,
        ..RequestParams::default()
    }
}

/// Runs every request to the end; (time-averaged, peak) blocks in use.
fn measure(
    eng: &mut LlmEngine,
    reqs: Vec<(Vec<u32>, RequestParams)>,
) -> Result<(f64, usize), Box<dyn std::error::Error>> {
    for (i, (p, r)) in reqs.into_iter().enumerate() {
        eng.add_request(RequestId(i as u64), p, r)?;
    }
    let (mut sum, mut steps, mut peak) = (0usize, 0usize, 0usize);
    while eng.has_unfinished() {
        for o in eng.step() {
            if let Some(e) = o.error {
                return Err(e.into());
            }
        }
        let kv = eng.stats().kv;
        let used = kv.total_blocks - kv.free_blocks;
        sum += used;
        steps += 1;
        peak = peak.max(used);
    }
    Ok((sum as f64 / steps.max(1) as f64, peak))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let loaded = model_loader::load_model(&model_loader::paths::default_model_path())?;
    let data = sharegpt(&loaded.tokenizer, arg(1, 4), arg(2, 32))?;
    let (config, weights) = (loaded.config, loaded.weights);
    println!(
        "{} ShareGPT prompts, mean prompt {:.0} tokens, mean output {:.0}",
        data.len(),
        data.iter().map(|d| d.0.len()).sum::<usize>() as f64 / data.len() as f64,
        data.iter().map(|d| d.1).sum::<usize>() as f64 / data.len() as f64
    );
    println!(
        "{:<14} {:>12} {:>12} {:>10} {:>10}",
        "mode", "avg shared", "avg indep", "saving", "peak sav."
    );
    for beam in [false, true] {
        for k in [2usize, 4, 6] {
            let group = |seed: u64| SamplingParams {
                n: if beam { 1 } else { k },
                best_of: Some(k),
                temperature: if beam { 0.0 } else { 1.0 },
                use_beam_search: beam,
                seed: Some(seed),
                ..SamplingParams::default()
            };
            let shared: Vec<_> = data
                .iter()
                .enumerate()
                .map(|(i, (p, m))| (p.clone(), params(*m, group(i as u64))))
                .collect();
            let indep: Vec<_> = data
                .iter()
                .enumerate()
                .flat_map(|(i, (p, m))| {
                    (0..k).map(move |j| {
                        (
                            p.clone(),
                            params(
                                *m,
                                SamplingParams {
                                    temperature: 1.0,
                                    seed: Some((i * 100 + j) as u64),
                                    ..SamplingParams::default()
                                },
                            ),
                        )
                    })
                })
                .collect();
            let (a_s, p_s) = measure(&mut engine(&config, &weights)?, shared)?;
            let (a_i, p_i) = measure(&mut engine(&config, &weights)?, indep)?;
            let name = format!("{} {k}", if beam { "beam width" } else { "parallel n" });
            println!(
                "{name:<14} {a_s:>12.1} {a_i:>12.1} {:>9.1}% {:>9.1}%",
                100.0 * (1.0 - a_s / a_i),
                100.0 * (1.0 - p_s as f64 / p_i as f64)
            );
        }
    }
    Ok(())
}
