//! Share of engine step time spent outside the forward pass (scheduling,
//! sampling, bookkeeping) for SmolLM2-135M with 64 concurrent requests.
//!
//! `cargo run --release -p engine --example step_overhead [-- MODEL_PATH [N] [PROMPT] [OUTPUT]]`
//! (defaults: the fetched SmolLM2-135M GGUF, 64 requests, 32 prompt tokens,
//! 32 output tokens). Timings, not a test: nothing here passes or fails.

use engine::executor::CpuExecutor;
use engine::kv::{PagedKvCacheManager, PagedKvConfig};
use engine::model::CpuModel;
use engine::scheduler::{RequestId, RequestParams, SchedulerConfig};
use engine::{EngineConfig, LlmEngine};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::path::PathBuf;
use std::time::{Duration, Instant};

fn arg(i: usize, default: usize) -> usize {
    std::env::args()
        .nth(i)
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args()
        .nth(1)
        .map(PathBuf::from)
        .unwrap_or_else(model_loader::paths::default_model_path);
    let (n, prompt_len, output_len) = (arg(2, 64), arg(3, 32), arg(4, 32));
    let loaded = model_loader::load_model(&path)
        .map_err(|e| format!("{}: {e} (run `cargo xtask fetch-model`)", path.display()))?;
    let vocab = loaded.config.vocab_size as u32;
    let model = CpuModel::new(loaded.config, loaded.weights)?;
    let block_size = 16;
    let blocks = n * (prompt_len + output_len).div_ceil(block_size) + 16;
    let exec = CpuExecutor::new(model, blocks, 0, block_size)?;
    let kv = PagedKvCacheManager::new(PagedKvConfig::new(block_size, blocks, 0))?;
    let config = EngineConfig {
        scheduler: SchedulerConfig {
            max_num_seqs: n,
            max_num_batched_tokens: 2048,
            ..SchedulerConfig::default()
        },
        eos_token_ids: loaded.tokenizer.eos_token_ids().to_vec(),
    };
    let mut eng = LlmEngine::new(config, Box::new(kv), Box::new(exec))?;
    let mut rng = ChaCha8Rng::seed_from_u64(0);
    for i in 0..n {
        let prompt = (0..prompt_len).map(|_| rng.gen_range(3..vocab)).collect();
        let params = RequestParams {
            max_tokens: Some(output_len),
            ignore_eos: true,
            ..RequestParams::default()
        };
        eng.add_request(RequestId(i as u64), prompt, params)?;
    }
    // The sampler alone on logits of this shape.
    let logits = engine::executor::Logits {
        rows: n,
        vocab: vocab as usize,
        data: (0..n * vocab as usize)
            .map(|i| ((i * 7919) % 1013) as f32 / 101.0)
            .collect(),
    };
    let t = Instant::now();
    let reps = 10;
    for _ in 0..reps {
        std::hint::black_box(engine::sampler::Sampler.greedy_rows(&logits));
    }
    println!(
        "greedy sampling of {n} x {vocab} logits: {:.3} ms",
        ms(t.elapsed()) / reps as f64
    );
    if std::env::var_os("SAMPLER_ONLY").is_some() {
        return Ok(());
    }
    let start = Instant::now();
    let mut first = None;
    while eng.has_unfinished() {
        eng.step();
        if first.is_none() {
            first = Some(eng.timings());
        }
    }
    let wall = start.elapsed();
    let all = eng.timings();
    let prefill = first.unwrap_or_default();
    let report = |name: &str, sched: Duration, exec: Duration, post: Duration, steps: u64| {
        let total = sched + exec + post;
        let outside = sched + post;
        println!(
            "{name}: {steps} steps, schedule {:.3} ms/step, forward {:.3} ms/step, sample+bookkeeping {:.3} ms/step, outside forward {:.3}% of step time",
            ms(sched) / steps as f64,
            ms(exec) / steps as f64,
            ms(post) / steps as f64,
            100.0 * outside.as_secs_f64() / total.as_secs_f64()
        );
    };
    println!("{} requests x ({prompt_len} prompt + {output_len} output) tokens, {} threads, wall {:.2} s",
        n, rayon::current_num_threads(), wall.as_secs_f64());
    report(
        "prefill step",
        prefill.schedule,
        prefill.execute,
        prefill.postprocess,
        prefill.steps.max(1),
    );
    report(
        "decode steps",
        all.schedule - prefill.schedule,
        all.execute - prefill.execute,
        all.postprocess - prefill.postprocess,
        (all.steps - prefill.steps).max(1),
    );
    report(
        "all steps",
        all.schedule,
        all.execute,
        all.postprocess,
        all.steps.max(1),
    );
    let s = eng.stats().scheduler;
    println!(
        "generation tokens {}, decode throughput {:.1} tokens/s",
        s.generation_tokens,
        s.generation_tokens as f64 / wall.as_secs_f64()
    );
    Ok(())
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}
