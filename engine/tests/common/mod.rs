//! Shared set-up for the engine's integration tests: the real tiny model
//! (written by `model_loader::tiny` into a temp dir and loaded back), the
//! real `PagedKvCacheManager` and the real `CpuExecutor`.
#![allow(dead_code)]

use engine::executor::CpuExecutor;
use engine::kv::{PagedKvCacheManager, PagedKvConfig};
use engine::model::LlamaModel;
use engine::scheduler::{RequestId, RequestParams, SchedulerConfig};
use engine::{EngineConfig, LlmEngine, RequestOutput};
use model_loader::{ModelConfig, ModelWeights};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::HashMap;
use std::sync::OnceLock;

/// The tiny model's config and weights, loaded once per test binary.
pub fn tiny() -> &'static (ModelConfig, ModelWeights) {
    static TINY: OnceLock<(ModelConfig, ModelWeights)> = OnceLock::new();
    TINY.get_or_init(|| {
        let dir = tempfile::tempdir().expect("temp dir");
        match model_loader::tiny::write_tiny_model(dir.path())
            .and_then(|files| model_loader::load_model(&files.gguf))
        {
            Ok(m) => (m.config, m.weights),
            Err(e) => {
                // The tokenizer comes from the fetched SmolLM2 file; the
                // weights do not, so the same model is still available.
                eprintln!("tiny model not written to disk ({e}); using the in-memory generator");
                (
                    model_loader::tiny::tiny_config(),
                    model_loader::tiny::tiny_weights(),
                )
            }
        }
    })
}

/// Shape of one engine under test.
#[derive(Debug, Clone)]
pub struct Setup {
    pub block_size: usize,
    pub device_blocks: usize,
    pub cpu_blocks: usize,
    pub prefix_caching: bool,
    pub watermark: f32,
    pub sched: SchedulerConfig,
}

impl Default for Setup {
    fn default() -> Self {
        Self {
            block_size: 4,
            device_blocks: 512,
            cpu_blocks: 0,
            prefix_caching: false,
            watermark: 0.0,
            sched: SchedulerConfig {
                max_num_seqs: 64,
                max_num_batched_tokens: 512,
                max_model_len: 256,
                enable_chunked_prefill: true,
                preemption_mode: Default::default(),
            },
        }
    }
}

/// A real engine: tiny model, paged KV cache, CPU executor.
pub fn engine(setup: &Setup) -> LlmEngine {
    let (config, weights) = tiny();
    let model = LlamaModel::new(config.clone(), weights.clone()).expect("tiny model");
    let exec = CpuExecutor::new(
        model,
        setup.device_blocks,
        setup.cpu_blocks,
        setup.block_size,
    )
    .expect("executor");
    let mut kv_cfg = PagedKvConfig::new(setup.block_size, setup.device_blocks, setup.cpu_blocks);
    kv_cfg.enable_prefix_caching = setup.prefix_caching;
    kv_cfg.watermark = setup.watermark;
    let kv = PagedKvCacheManager::new(kv_cfg).expect("kv cache");
    let cfg = EngineConfig {
        scheduler: setup.sched.clone(),
        eos_token_ids: vec![2],
    };
    LlmEngine::new(cfg, Box::new(kv), Box::new(exec)).expect("engine")
}

/// Random prompts of token ids in the tiny vocabulary (no special ids).
pub fn prompts(seed: u64, count: usize, min_len: usize, max_len: usize) -> Vec<Vec<u32>> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..count)
        .map(|_| {
            let len = rng.gen_range(min_len..=max_len);
            (0..len).map(|_| rng.gen_range(3..1000)).collect()
        })
        .collect()
}

/// Greedy, fixed-length parameters.
pub fn params(max_tokens: usize) -> RequestParams {
    RequestParams {
        max_tokens: Some(max_tokens),
        ignore_eos: true,
        ..RequestParams::default()
    }
}

/// What one request produced.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Collected {
    pub tokens: Vec<u32>,
    pub finished: bool,
    pub error: Option<engine::EngineError>,
    pub num_cached_tokens: usize,
}

/// Folds step outputs into per-request results.
pub fn collect(into: &mut HashMap<RequestId, Collected>, outs: Vec<RequestOutput>) {
    for o in outs {
        let c = into.entry(o.request_id).or_default();
        assert!(!c.finished, "output after the end for {}", o.request_id);
        c.tokens.extend_from_slice(o.token_ids());
        c.finished |= o.finished;
        c.num_cached_tokens = c.num_cached_tokens.max(o.num_cached_tokens);
        if o.error.is_some() {
            c.error = o.error;
        }
    }
}

/// Steps until nothing is left (bounded, so a livelock fails the test).
pub fn run_to_end(eng: &mut LlmEngine, into: &mut HashMap<RequestId, Collected>) {
    for _ in 0..100_000 {
        if !eng.has_unfinished() {
            return;
        }
        let outs = eng.step();
        collect(into, outs);
    }
    panic!("engine did not finish within 100000 steps");
}

/// Runs every prompt in one engine, all added before the first step.
pub fn run_batch(
    setup: &Setup,
    prompts: &[Vec<u32>],
    max_tokens: &[usize],
) -> (Vec<Vec<u32>>, LlmEngine) {
    let mut eng = engine(setup);
    for (i, p) in prompts.iter().enumerate() {
        eng.add_request(RequestId(i as u64), p.clone(), params(max_tokens[i]))
            .expect("request accepted");
    }
    let mut got = HashMap::new();
    run_to_end(&mut eng, &mut got);
    let out = (0..prompts.len())
        .map(|i| {
            let c = got.remove(&RequestId(i as u64)).unwrap_or_default();
            assert!(c.finished && c.error.is_none(), "request {i}: {c:?}");
            c.tokens
        })
        .collect();
    (out, eng)
}

/// Asserts both pools are whole again.
pub fn assert_pools_full(eng: &LlmEngine) {
    let kv = eng.stats().kv;
    assert_eq!(
        kv.free_blocks, kv.total_blocks,
        "device blocks leaked: {kv:?}"
    );
    assert_eq!(
        kv.cpu_free_blocks, kv.cpu_total_blocks,
        "CPU blocks leaked: {kv:?}"
    );
}
