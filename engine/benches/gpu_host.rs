//! Host side of the GPU executor, without a GPU (issue 14, item 7).
//!
//! `cargo bench -p engine --bench gpu_host [-- SEQS STEPS [--sampled]
//! [--penalties]]` (defaults 256, 64; `--sampled`: temperature 0.8, top_p
//! 0.95 instead of greedy, drawn on the device (`Sampling::Device`);
//! `--penalties`: also repetition 1.1, frequency 0.2 and presence 0.1, with
//! the token counts kept on the device, filled at each sequence's first draw;
//! `--kv-events`: instead of eager against graphs, two graph runs with prefix
//! caching on, KV cache events off against on (a counting sink), so the
//! cost of recording and handing over events shows per step)
//!
//! The real engine loop (scheduler, paged KV manager, GPU executor, sampler,
//! postprocessing) runs SmolLM2-135M's shapes in bf16 on a
//! [`CountingDevice`]: launches, GEMMs and copies are recorded, nothing is
//! computed (downloaded logits are zeros, so greedy picks token 0). Weights are
//! constants of the right shapes (the device never reads them).
//!
//! Workload: SEQS requests submitted at once, greedy, `ignore_eos`, 256 output
//! tokens each. Prompt lengths are those of the first SEQS pairs of the
//! fetched ShareGPT file (`<cache>/datasets/sharegpt-*.jsonl`, `cargo xtask
//! fetch-data`) when present; otherwise a documented synthetic distribution:
//! `4 + Exp(mean 232)` tokens capped at 1024 (mean about 236, the fetched
//! file's mean prompt length for SmolLM2), from a fixed seed. The prompts'
//! token ids are synthetic either way (the device computes nothing).
//!
//! Two engines run it side by side, eager (`--enforce-eager`) and with CUDA
//! graphs (decode steps padded to a bucket and replayed as one graph
//! launch); after every prompt is prefilled, STEPS pure decode steps of each
//! are timed, the two interleaved step by step. Reported per decode step: host microseconds (median and mean; split
//! into schedule / execute / postprocess from the engine's own timings),
//! kernel launches and GEMMs issued eagerly, graph launches (and graphs
//! captured), uploads and bytes, downloads and bytes, host
//! waits, and heap allocations and bytes (a counting global allocator).
//! Wall time on a shared machine is noisy: the process CPU time per step is
//! printed beside it.

use engine::executor::gpu::{
    Counters, CountersHandle, CountingDevice, DType, GpuExecutor, GpuOptions, KvSizing,
};
use engine::kv::{PagedKvCacheManager, PagedKvConfig};
use engine::scheduler::{RequestId, RequestParams, SchedulerConfig};
use engine::{EngineConfig, LlmEngine};
use model_loader::{Architecture, LayerWeights, ModelConfig, ModelWeights, Tensor};
use std::alloc::{GlobalAlloc, Layout, System};
use std::io::BufRead;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Instant;

/// Counts heap allocations (calls and bytes) of the whole process.
struct CountingAlloc;

static ALLOCS: AtomicU64 = AtomicU64::new(0);
static ALLOC_BYTES: AtomicU64 = AtomicU64::new(0);

// SAFETY: forwards every call to the system allocator unchanged; the counters
// are relaxed atomics that never affect what is returned.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Relaxed);
        ALLOC_BYTES.fetch_add(layout.size() as u64, Relaxed);
        // SAFETY: the caller's contract is the system allocator's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Relaxed);
        ALLOC_BYTES.fetch_add(layout.size() as u64, Relaxed);
        // SAFETY: as above.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above; `ptr` came from this allocator.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Relaxed);
        ALLOC_BYTES.fetch_add(new_size as u64, Relaxed);
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

const BLOCK: usize = 16;
const OUTPUT: usize = 256;
const VOCAB: usize = 49152;

fn smollm2_config() -> ModelConfig {
    ModelConfig {
        architecture: Architecture::Llama,
        vocab_size: VOCAB,
        hidden_size: 576,
        intermediate_size: 1536,
        num_hidden_layers: 30,
        num_attention_heads: 9,
        num_key_value_heads: 3,
        head_dim: 64,
        rms_norm_eps: 1e-5,
        rope_theta: 100000.0,
        rope_scaling: None,
        max_position_embeddings: 8192,
        tie_word_embeddings: true,
        attention_bias: false,
    }
}

/// Constant weights of `c`'s shapes (the counting device never reads them).
fn const_weights(c: &ModelConfig) -> ModelWeights {
    let t = |shape: &[usize]| Tensor::new(shape.to_vec(), vec![0.01; shape.iter().product()]);
    let (h, i, hd) = (c.hidden_size, c.intermediate_size, c.head_dim);
    let (qd, kvd) = (c.num_attention_heads * hd, c.num_key_value_heads * hd);
    let layers = (0..c.num_hidden_layers)
        .map(|_| LayerWeights {
            attn_norm: t(&[h]),
            wq: t(&[qd, h]),
            wk: t(&[kvd, h]),
            wv: t(&[kvd, h]),
            wo: t(&[h, qd]),
            bq: None,
            bk: None,
            bv: None,
            ffn_norm: t(&[h]),
            w_gate: t(&[i, h]),
            w_up: t(&[i, h]),
            w_down: t(&[h, i]),
            gemma: None,
        })
        .collect();
    ModelWeights {
        token_embedding: t(&[c.vocab_size, h]),
        layers,
        final_norm: t(&[h]),
        lm_head: None,
    }
}

/// Prompt lengths of the first `n` fetched ShareGPT pairs, if the file is there.
fn sharegpt_lengths(n: usize) -> Option<Vec<usize>> {
    let dir = model_loader::paths::cache_dir().join("datasets");
    let file = std::fs::read_dir(&dir)
        .ok()?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| {
            p.extension().is_some_and(|x| x == "jsonl")
                && p.file_name()
                    .is_some_and(|f| f.to_string_lossy().starts_with("sharegpt"))
        })?;
    let mut out = Vec::with_capacity(n);
    for line in std::io::BufReader::new(std::fs::File::open(file).ok()?).lines() {
        let v: serde_json::Value = serde_json::from_str(&line.ok()?).ok()?;
        let len = v["prompt_len"].as_u64()? as usize;
        out.push(len.clamp(1, 1024));
        if out.len() == n {
            return Some(out);
        }
    }
    None
}

/// `4 + Exp(mean 232)` capped at 1024, from a fixed LCG seed.
fn synthetic_lengths(n: usize) -> Vec<usize> {
    let mut state = 0x2545_f491_4f6c_dd1du64;
    (0..n)
        .map(|_| {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            let u = ((state >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
            (4.0 - 232.0 * u.ln()).min(1024.0) as usize
        })
        .collect()
}

/// CPU seconds (user + system) this process has used (Linux `/proc`, 100 Hz
/// ticks); on a shared machine this is steadier than wall time.
fn cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let fields: Vec<&str> = stat
        .get(stat.rfind(')')? + 2..)?
        .split_whitespace()
        .collect();
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) / 100.0)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// One engine of the comparison, with its device's counters.
struct Run {
    name: &'static str,
    /// KV cache events the sink received (`--kv-events`).
    published: Arc<AtomicU64>,
    engine: LlmEngine,
    counters: CountersHandle,
    times: Vec<f64>,
    allocs: (u64, u64),
    c0: Counters,
    t0: engine::engine_loop::StepTimings,
}

/// Prefix caching and KV cache events of a run.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Events {
    /// Prefix caching off (the default comparison: eager against graphs).
    NoCache,
    /// Prefix caching on, no events recorded.
    Off,
    /// Prefix caching on, every event handed to a counting sink.
    On,
}

/// A sink that counts events, as cheap as the server's publisher's
/// non-blocking queue push is (the encoding and the socket run on the
/// publisher's own thread).
struct CountingSink(Arc<AtomicU64>);

impl engine::kv::KvEventSink for CountingSink {
    fn publish(&mut self, events: Vec<engine::kv::KvEvent>) {
        self.0.fetch_add(events.len() as u64, Relaxed);
    }
}

/// The engine over a counting device, every prompt submitted and prefilled.
fn start(
    name: &'static str,
    lens: &[usize],
    blocks: usize,
    graphs: bool,
    events: Events,
) -> (Run, usize) {
    let seqs = lens.len();
    let config = smollm2_config();
    let dev = CountingDevice::new(141 << 30);
    let counters = dev.counters();
    let opts = GpuOptions {
        dtype: DType::Bf16,
        block_size: BLOCK,
        kv: KvSizing::Blocks {
            gpu: blocks,
            cpu: 0,
        },
    };
    let exec = GpuExecutor::new(dev, config.clone(), const_weights(&config), opts)
        .expect("GPU executor on the counting device")
        .with_cuda_graphs(seqs, !graphs);
    let mut kv_cfg = PagedKvConfig::new(BLOCK, blocks, 0);
    kv_cfg.enable_prefix_caching = events != Events::NoCache;
    let kv = PagedKvCacheManager::new(kv_cfg).expect("KV manager");
    let cfg = EngineConfig {
        scheduler: SchedulerConfig {
            max_num_seqs: seqs,
            max_num_batched_tokens: 4096,
            max_model_len: 2048,
            ..SchedulerConfig::default()
        },
        eos_token_ids: vec![0],
    };
    let mut engine = LlmEngine::new(cfg, Box::new(kv), Box::new(exec)).expect("engine");
    let published = Arc::new(AtomicU64::new(0));
    if events == Events::On {
        engine.set_kv_event_sink(Box::new(CountingSink(Arc::clone(&published))));
    }
    for (i, &len) in lens.iter().enumerate() {
        let prompt = (0..len as u32)
            .map(|j| (j * 7919 + i as u32 * 104_729) % VOCAB as u32)
            .collect();
        let mut params = RequestParams {
            max_tokens: Some(OUTPUT),
            ignore_eos: true,
            ..RequestParams::default()
        };
        if std::env::args().any(|a| a == "--sampled") {
            params.sampling.temperature = 0.8;
            params.sampling.top_p = 0.95;
            params.sampling.seed = Some(i as u64);
        }
        if std::env::args().any(|a| a == "--penalties") {
            params.sampling.repetition_penalty = 1.1;
            params.sampling.frequency_penalty = 0.2;
            params.sampling.presence_penalty = 0.1;
        }
        engine
            .add_request(RequestId(i as u64), prompt, params)
            .expect("request");
    }
    let prompt_total: usize = lens.iter().sum();
    let mut prefill_steps = 0;
    while engine.stats().scheduler.prompt_tokens < prompt_total as u64 {
        engine.step();
        prefill_steps += 1;
    }
    let (c0, t0) = (counters.get(), engine.timings());
    let run = Run {
        name,
        published,
        engine,
        counters,
        times: Vec::new(),
        allocs: (0, 0),
        c0,
        t0,
    };
    (run, prefill_steps)
}

impl Run {
    /// One timed decode step.
    fn step(&mut self, seqs: usize) {
        let (a0, b0) = (ALLOCS.load(Relaxed), ALLOC_BYTES.load(Relaxed));
        let start = Instant::now();
        let outs = self.engine.step();
        self.times.push(start.elapsed().as_secs_f64() * 1e6);
        self.allocs.0 += ALLOCS.load(Relaxed) - a0;
        self.allocs.1 += ALLOC_BYTES.load(Relaxed) - b0;
        assert_eq!(outs.len(), seqs, "every sequence decodes each step");
    }

    /// This run's column of the table: one value per row of [`ROWS`].
    fn column(&mut self, steps: usize) -> Vec<String> {
        let (c, t) = (self.counters.get().since(&self.c0), self.engine.timings());
        let per = |x: u64| x as f64 / steps as f64;
        let us = |d: std::time::Duration| d.as_secs_f64() * 1e6 / steps as f64;
        let mean = self.times.iter().sum::<f64>() / steps as f64;
        let t0 = &self.t0;
        vec![
            format!("{:.0}", median(&mut self.times)),
            format!("{mean:.0}"),
            format!(
                "{:.0} / {:.0} / {:.0}",
                us(t.schedule - t0.schedule),
                us(t.execute - t0.execute),
                us(t.postprocess - t0.postprocess)
            ),
            format!("{:.1}", per(c.launches)),
            format!("{:.1}", per(c.gemms)),
            format!("{:.2} ({} captured)", per(c.graph_launches), c.captures),
            format!("{:.1} ({:.0})", per(c.uploads), per(c.upload_bytes)),
            format!("{:.1} ({:.0})", per(c.downloads), per(c.download_bytes)),
            format!("{:.1}", per(c.host_waits())),
            format!("{:.1}", per(c.allocs)),
            format!("{:.0} ({:.0})", per(self.allocs.0), per(self.allocs.1)),
        ]
    }
}

/// The table's rows (per decode step).
const ROWS: [&str; 11] = [
    "host us (median)",
    "host us (mean)",
    "of which schedule / execute / postprocess us",
    "kernel launches (eager)",
    "GEMMs (eager)",
    "graph launches",
    "uploads (bytes)",
    "downloads (bytes)",
    "host waits",
    "device allocs",
    "heap allocations (bytes)",
];

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let seqs = args.first().copied().unwrap_or(256);
    let steps = args.get(1).copied().unwrap_or(64);
    let (lens, source) = match sharegpt_lengths(seqs) {
        Some(l) => (l, "fetched ShareGPT prompt lengths"),
        None => (
            synthetic_lengths(seqs),
            "synthetic 4 + Exp(232) prompt lengths (no fetched ShareGPT file)",
        ),
    };
    let prompt_total: usize = lens.iter().sum();
    let blocks = lens
        .iter()
        .map(|l| (l + OUTPUT).div_ceil(BLOCK) + 1)
        .sum::<usize>();
    let kv_events = std::env::args().any(|a| a == "--kv-events");
    let (a, prefill_steps, b) = if kv_events {
        let (a, p) = start("graphs, events off", &lens, blocks, true, Events::Off);
        let (b, _) = start("graphs, events on", &lens, blocks, true, Events::On);
        (a, p, b)
    } else {
        let (a, p) = start(
            "eager (--enforce-eager)",
            &lens,
            blocks,
            false,
            Events::NoCache,
        );
        let (b, _) = start("CUDA graphs", &lens, blocks, true, Events::NoCache);
        (a, p, b)
    };
    let mut runs = [a, b];
    let before = runs[1].published.load(Relaxed);
    let t0 = Instant::now();
    // Interleaved, so that both modes see the same machine load.
    let cpu0 = cpu_seconds();
    for _ in 0..steps {
        for r in &mut runs {
            r.step(seqs);
        }
    }
    let cpu = cpu_seconds()
        .zip(cpu0)
        .map(|(b, a)| (b - a) * 1e6 / (2 * steps) as f64);
    println!(
        "gpu_host: {seqs} sequences ({}), {source}: mean prompt {:.0} tokens; {prefill_steps} prefill steps, then {steps} decode steps per mode, the two modes interleaved step by step",
        match (
            std::env::args().any(|a| a == "--sampled"),
            std::env::args().any(|a| a == "--penalties"),
        ) {
            (true, true) => "sampled: temperature 0.8, top_p 0.95, penalties",
            (true, false) => "sampled: temperature 0.8, top_p 0.95",
            (false, true) => "greedy with penalties",
            (false, false) => "greedy",
        },
        prompt_total as f64 / seqs as f64
    );
    let cols: Vec<Vec<String>> = runs.iter_mut().map(|r| r.column(steps)).collect();
    println!("| per decode step | {} | {} |", runs[0].name, runs[1].name);
    println!("|---|---|---|");
    for (i, row) in ROWS.iter().enumerate() {
        println!("| {row} | {} | {} |", cols[0][i], cols[1][i]);
    }
    if let Some(cpu) = cpu {
        println!("process CPU us per decode step, both modes averaged (10 ms ticks): {cpu:.0}");
    }
    if kv_events {
        let during = runs[1].published.load(Relaxed) - before;
        let secs = t0.elapsed().as_secs_f64() / 2.0;
        println!(
            "KV cache events: {} during prefill, {during} over the {steps} decode steps \
             ({:.1} per step, {:.0} per second of the events-on run's wall time)",
            before,
            during as f64 / steps as f64,
            during as f64 / secs
        );
    }
}
