//! Shared set-up for the engine's integration tests: the real tiny model
//! (written by `model_loader::tiny` into a temp dir and loaded back), the
//! real `PagedKvCacheManager` and a real executor.
//!
//! Every test that builds an engine runs once per executor
//! ([`on_each_executor`]): the CPU executor, and the GPU executor on CUDA
//! when the crate is built with `--features cuda` and a driver answers;
//! otherwise the test prints `SKIP cuda executor: <reason>`.
//! `ENGINE_TEST_EXECUTORS` (comma-separated `cpu`, `emulated`, `cuda`)
//! changes the list: the GPU machine's script runs `cuda` only, and
//! `emulated` (the GPU executor on the host-emulated device) is opt-in
//! because the emulator runs one OS thread per GPU thread and takes minutes
//! per test binary; `gpu_emulated.rs` runs a small engine workload on it by
//! default.
#![allow(dead_code)]

use engine::executor::gpu::{DType, EmuDevice, GpuExecutor, GpuOptions, KvSizing};
use engine::executor::{CpuExecutor, Executor};
use engine::kv::{PagedKvCacheManager, PagedKvConfig};
use engine::model::CpuModel;
use engine::scheduler::{RequestId, RequestParams, SchedulerConfig};
use engine::{EngineConfig, LlmEngine, RequestOutput};
use model_loader::{ModelConfig, ModelWeights};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::cell::Cell;
use std::collections::HashMap;
use std::sync::OnceLock;

/// An executor the engine tests run on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExecKind {
    Cpu,
    /// `GpuExecutor` on `EmuDevice`, float32.
    Emulated,
    /// `GpuExecutor` on CUDA, float32 (bf16 is checked by the golden test).
    Cuda,
}

thread_local! {
    static CURRENT: Cell<ExecKind> = const { Cell::new(ExecKind::Cpu) };
    static ASYNC: Cell<bool> = const { Cell::new(false) };
}

/// Why the CUDA executor cannot run here, or `None` when it can.
fn cuda_skip_reason() -> Option<String> {
    engine::executor::select::cuda_unavailable_reason()
}

/// Prints `msg` once per test binary, straight to stderr: libtest's output
/// capture covers `println!`/`eprintln!` only, so a skip is never silent.
fn skip_once(msg: &str) {
    use std::io::Write;
    static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if !SAID.swap(true, std::sync::atomic::Ordering::Relaxed) {
        let _ = writeln!(std::io::stderr(), "{msg}");
    }
}

/// The executors to run on (see the module docs), printing why CUDA is skipped.
pub fn executor_kinds() -> Vec<ExecKind> {
    let wanted = std::env::var("ENGINE_TEST_EXECUTORS").unwrap_or_else(|_| "cpu,cuda".into());
    let mut kinds = vec![];
    for name in wanted.split(',').map(str::trim) {
        match name {
            "cpu" => kinds.push(ExecKind::Cpu),
            "emulated" => kinds.push(ExecKind::Emulated),
            "cuda" => match cuda_skip_reason() {
                None => kinds.push(ExecKind::Cuda),
                Some(why) => skip_once(&format!("SKIP cuda executor: {why}")),
            },
            other => panic!("ENGINE_TEST_EXECUTORS: unknown executor {other:?}"),
        }
    }
    kinds
}

/// Runs `body` once per executor; [`engine`] builds on the current one.
pub fn on_each_executor(body: impl Fn()) {
    on_executors(&executor_kinds(), body);
}

/// The engine loops to run on: `ENGINE_TEST_SCHEDULING` (comma-separated
/// `sync`, `async`), both by default. `async` is
/// `SchedulerConfig::async_scheduling`.
pub fn scheduling_modes() -> Vec<bool> {
    let wanted = std::env::var("ENGINE_TEST_SCHEDULING").unwrap_or_else(|_| "sync,async".into());
    wanted
        .split(',')
        .map(str::trim)
        .map(|m| match m {
            "sync" => false,
            "async" => true,
            other => panic!("ENGINE_TEST_SCHEDULING: unknown mode {other:?}"),
        })
        .collect()
}

/// Runs `body` once on each of `kinds`, in each scheduling mode.
pub fn on_executors(kinds: &[ExecKind], body: impl Fn()) {
    for &kind in kinds {
        for overlapped in scheduling_modes() {
            CURRENT.with(|c| c.set(kind));
            ASYNC.with(|c| c.set(overlapped));
            let mode = if overlapped { "async" } else { "sync" };
            println!("-- on the {kind:?} executor, {mode} scheduling");
            body();
        }
    }
    CURRENT.with(|c| c.set(ExecKind::Cpu));
    ASYNC.with(|c| c.set(false));
}

/// Whether the current test iteration schedules asynchronously.
pub fn async_scheduling() -> bool {
    ASYNC.with(Cell::get)
}

/// The executor the current test iteration runs on.
pub fn current_executor() -> ExecKind {
    CURRENT.with(Cell::get)
}

/// A fresh executor of the current kind over the tiny model.
pub fn executor(device_blocks: usize, cpu_blocks: usize, block_size: usize) -> Box<dyn Executor> {
    let (config, weights) = tiny();
    let opts = GpuOptions {
        dtype: DType::F32,
        block_size,
        kv: KvSizing::Blocks {
            gpu: device_blocks,
            cpu: cpu_blocks,
        },
    };
    match current_executor() {
        ExecKind::Cpu => {
            let model = CpuModel::new(config.clone(), weights.clone()).expect("tiny model");
            Box::new(
                CpuExecutor::new(model, device_blocks, cpu_blocks, block_size).expect("executor"),
            )
        }
        ExecKind::Emulated => Box::new(
            GpuExecutor::new(EmuDevice::new(), config.clone(), weights.clone(), opts)
                .expect("gpu executor"),
        ),
        ExecKind::Cuda => cuda_executor(config, weights, opts),
    }
}

#[cfg(feature = "cuda")]
fn cuda_executor(
    config: &ModelConfig,
    weights: &ModelWeights,
    opts: GpuOptions,
) -> Box<dyn Executor> {
    let dev = engine::executor::gpu::cuda::CudaDevice::new(0).expect("cuda device");
    Box::new(GpuExecutor::new(dev, config.clone(), weights.clone(), opts).expect("cuda executor"))
}

#[cfg(not(feature = "cuda"))]
fn cuda_executor(_: &ModelConfig, _: &ModelWeights, _: GpuOptions) -> Box<dyn Executor> {
    unreachable!("executor_kinds() offers CUDA only with the cuda feature")
}

/// The tiny model's tokenizer (written to a temp dir and loaded back), once
/// per test binary.
pub fn tiny_tokenizer() -> std::sync::Arc<model_loader::Tokenizer> {
    static TOK: OnceLock<std::sync::Arc<model_loader::Tokenizer>> = OnceLock::new();
    TOK.get_or_init(|| {
        let dir = tempfile::tempdir().expect("temp dir");
        let files = model_loader::tiny::write_tiny_model(dir.path()).expect("tiny model");
        std::sync::Arc::new(
            model_loader::load_model(&files.gguf)
                .expect("load")
                .tokenizer,
        )
    })
    .clone()
}

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
                async_scheduling: false,
                speculative: None,
            },
        }
    }
}

/// A real engine: tiny model, paged KV cache, the current executor, the
/// current scheduling mode.
pub fn engine(setup: &Setup) -> LlmEngine {
    engine_with(setup, async_scheduling())
}

/// [`engine`] with asynchronous scheduling on or off.
pub fn engine_with(setup: &Setup, overlapped: bool) -> LlmEngine {
    let exec = executor(setup.device_blocks, setup.cpu_blocks, setup.block_size);
    engine_over(setup, overlapped, exec)
}

/// [`engine_with`] over a given executor.
pub fn engine_over(setup: &Setup, overlapped: bool, exec: Box<dyn Executor>) -> LlmEngine {
    let mut kv_cfg = PagedKvConfig::new(setup.block_size, setup.device_blocks, setup.cpu_blocks);
    kv_cfg.enable_prefix_caching = setup.prefix_caching;
    kv_cfg.watermark = setup.watermark;
    let kv = PagedKvCacheManager::new(kv_cfg).expect("kv cache");
    let cfg = EngineConfig {
        scheduler: SchedulerConfig {
            async_scheduling: overlapped,
            ..setup.sched.clone()
        },
        eos_token_ids: vec![2],
    };
    LlmEngine::new(cfg, Box::new(kv), exec).expect("engine")
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
    /// The error's whole chain as text (`engine::error::Report`), so that
    /// runs can be compared.
    pub error: Option<String>,
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
        if let Some(e) = &o.error {
            c.error = Some(engine::error::Report(e).to_string());
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
