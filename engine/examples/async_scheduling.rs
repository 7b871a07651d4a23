//! Synchronous against asynchronous scheduling (`--async-scheduling`) on the
//! CPU executor: many short requests, the two modes interleaved in one
//! process, output tok/s and steps/s of each run, and a check that both
//! modes produced the same tokens.
//!
//! `cargo run -p engine --example async_scheduling [-- MODEL_PATH [REQUESTS] [OUTPUT] [ROUNDS]]`
//! (`""` as MODEL_PATH for the default, `tiny` for the test model)
//! (defaults: the fetched SmolLM2-135M GGUF, 128 requests of 8..40 prompt
//! tokens, 16 output tokens, 3 rounds; half the requests greedy, half
//! seeded sampling at temperature 0.8). Timings, not a test.

use engine::executor::CpuExecutor;
use engine::kv::{PagedKvCacheManager, PagedKvConfig};
use engine::model::CpuModel;
use engine::sampler::SamplingParams;
use engine::scheduler::{RequestId, RequestParams, SchedulerConfig};
use engine::{EngineConfig, LlmEngine};
use model_loader::{ModelConfig, ModelWeights};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

fn arg(i: usize, default: usize) -> usize {
    std::env::args()
        .nth(i)
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

struct Run {
    wall: Duration,
    tokens: usize,
    steps: u64,
    outputs: HashMap<RequestId, Vec<u32>>,
    timings: engine::engine_loop::StepTimings,
}

#[allow(clippy::too_many_arguments)]
fn run(
    config: &ModelConfig,
    weights: &ModelWeights,
    eos: &[u32],
    requests: &[(Vec<u32>, RequestParams)],
    overlapped: bool,
) -> Result<Run, Box<dyn std::error::Error>> {
    let model = CpuModel::new(config.clone(), weights.clone())?;
    let block_size = 16;
    let blocks = 1024;
    let exec = CpuExecutor::new(model, blocks, 0, block_size)?;
    let kv = PagedKvCacheManager::new(PagedKvConfig::new(block_size, blocks, 0))?;
    let cfg = EngineConfig {
        scheduler: SchedulerConfig {
            max_num_seqs: 64,
            max_num_batched_tokens: 1024,
            async_scheduling: overlapped,
            ..SchedulerConfig::default()
        },
        eos_token_ids: eos.to_vec(),
    };
    let mut eng = LlmEngine::new(cfg, Box::new(kv), Box::new(exec))?;
    for (i, (p, params)) in requests.iter().enumerate() {
        eng.add_request(RequestId(i as u64), p.clone(), params.clone())?;
    }
    let mut outputs: HashMap<RequestId, Vec<u32>> = HashMap::new();
    let start = Instant::now();
    while eng.has_unfinished() {
        for o in eng.step() {
            if let Some(e) = o.error {
                return Err(format!("{}: {e}", o.request_id).into());
            }
            outputs
                .entry(o.request_id)
                .or_default()
                .extend_from_slice(o.token_ids());
        }
    }
    let wall = start.elapsed();
    Ok(Run {
        wall,
        tokens: outputs.values().map(Vec::len).sum(),
        steps: eng.timings().steps,
        outputs,
        timings: eng.timings(),
    })
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args().nth(1).filter(|s| !s.is_empty());
    let (n, output_len, rounds) = (arg(2, 128), arg(3, 16), arg(4, 3));
    let (config, weights, eos) = if path.as_deref() == Some("tiny") {
        // The test model (random weights, about 1,000 tokens): a short
        // forward pass, so host work is a larger share of a step.
        let c = model_loader::tiny::tiny_config();
        (c, model_loader::tiny::tiny_weights(), vec![2])
    } else {
        let path = path.map_or_else(model_loader::paths::default_model_path, PathBuf::from);
        let loaded = model_loader::load_model(&path)
            .map_err(|e| format!("{}: {e} (run `cargo xtask fetch-model`)", path.display()))?;
        let eos = loaded.tokenizer.eos_token_ids().to_vec();
        (loaded.config, loaded.weights, eos)
    };
    let vocab = config.vocab_size as u32;
    let mut rng = ChaCha8Rng::seed_from_u64(0);
    let requests: Vec<(Vec<u32>, RequestParams)> = (0..n)
        .map(|i| {
            let len = rng.gen_range(8..=40);
            let prompt = (0..len).map(|_| rng.gen_range(3..vocab)).collect();
            let sampling = if i % 2 == 0 {
                SamplingParams::default()
            } else {
                SamplingParams {
                    temperature: 0.8,
                    seed: Some(i as u64),
                    ..SamplingParams::default()
                }
            };
            let params = RequestParams {
                max_tokens: Some(output_len),
                ignore_eos: true,
                sampling,
                ..RequestParams::default()
            };
            (prompt, params)
        })
        .collect();
    println!("{n} requests x {output_len} output tokens, CPU executor, {rounds} rounds");
    let mut sums = [(Duration::ZERO, 0usize, 0u64); 2];
    let mut reference: Option<HashMap<RequestId, Vec<u32>>> = None;
    for round in 0..rounds {
        for overlapped in [false, true] {
            let r = run(&config, &weights, &eos, &requests, overlapped)?;
            let mode = if overlapped { "async" } else { "sync " };
            let t = r.timings;
            println!(
                "round {round} {mode}: {:>7.1} tok/s {:>6.1} steps/s ({} tokens, {} steps, {:.2} s; schedule {:.0} ms, wait/execute {:.0} ms, postprocess {:.0} ms)",
                r.tokens as f64 / r.wall.as_secs_f64(),
                r.steps as f64 / r.wall.as_secs_f64(),
                r.tokens,
                r.steps,
                r.wall.as_secs_f64(),
                t.schedule.as_secs_f64() * 1e3,
                t.execute.as_secs_f64() * 1e3,
                t.postprocess.as_secs_f64() * 1e3,
            );
            match &reference {
                None => reference = Some(r.outputs),
                Some(want) => {
                    let differ = want.iter().filter(|(id, v)| r.outputs.get(id) != Some(v));
                    let differ = differ.count();
                    if differ > 0 {
                        println!("  {differ} requests differ from round 0 sync");
                    }
                }
            }
            let s = &mut sums[usize::from(overlapped)];
            s.0 += r.wall;
            s.1 += r.tokens;
            s.2 += r.steps;
        }
    }
    let rate = |s: (Duration, usize, u64)| {
        (
            s.1 as f64 / s.0.as_secs_f64(),
            s.2 as f64 / s.0.as_secs_f64(),
        )
    };
    let (sync, overlapped) = (rate(sums[0]), rate(sums[1]));
    println!(
        "total: sync {:.1} tok/s {:.1} steps/s; async {:.1} tok/s {:.1} steps/s; async/sync tok/s {:.3}",
        sync.0,
        sync.1,
        overlapped.0,
        overlapped.1,
        overlapped.0 / sync.0
    );
    Ok(())
}
