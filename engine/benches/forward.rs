//! Forward-pass throughput of SmolLM2-135M on the CPU: prefill tokens/s
//! (one 128-token prompt; 4 prompts of 128 in one pass) and decode tokens/s at batch 1
//! and 32 with a context of about 128 tokens.
//!
//! Uses the real weights when `model_loader::load_model` can read the default
//! GGUF (`cargo xtask fetch-model`); the timing depends only on the shapes,
//! so when the file is missing the bench says so and uses random weights of
//! the same shapes. Throughput = tokens per iteration / time per iteration.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use engine::executor::{ContiguousLayout, ForwardBatch};
use engine::model::{CpuModel, KvCache};
use model_loader::{Architecture, LayerWeights, ModelConfig, ModelWeights, Tensor};
use std::time::{Duration, Instant};

const BLOCK: usize = 16;
const CTX: usize = 128;

fn smollm2_config() -> ModelConfig {
    ModelConfig {
        architecture: Architecture::Llama,
        vocab_size: 49152,
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

fn random_weights(c: &ModelConfig) -> ModelWeights {
    let mut seed = 1u32;
    let mut t = |shape: &[usize], scale: f32| {
        let n: usize = shape.iter().product();
        let data = (0..n)
            .map(|_| {
                seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                scale * ((seed >> 8) as f32 / (1u32 << 24) as f32 - 0.5)
            })
            .collect();
        Tensor::new(shape.to_vec(), data)
    };
    let (h, i, hd) = (c.hidden_size, c.intermediate_size, c.head_dim);
    let (qd, kvd) = (c.num_attention_heads * hd, c.num_key_value_heads * hd);
    let layers = (0..c.num_hidden_layers)
        .map(|_| LayerWeights {
            attn_norm: t(&[h], 0.1),
            wq: t(&[qd, h], 0.1),
            wk: t(&[kvd, h], 0.1),
            wv: t(&[kvd, h], 0.1),
            wo: t(&[h, qd], 0.1),
            bq: None,
            bk: None,
            bv: None,
            ffn_norm: t(&[h], 0.1),
            w_gate: t(&[i, h], 0.1),
            w_up: t(&[i, h], 0.1),
            w_down: t(&[h, i], 0.1),
            gemma: None,
        })
        .collect();
    ModelWeights {
        token_embedding: t(&[c.vocab_size, h], 0.1),
        layers,
        final_norm: t(&[h], 0.1),
        lm_head: None,
    }
}

fn load() -> CpuModel {
    let path = model_loader::paths::default_model_path();
    match model_loader::load_model(&path) {
        Ok(m) => return CpuModel::new(m.config, m.weights).expect("SmolLM2 model"),
        Err(e) => eprintln!(
            "forward bench: cannot load {} ({e}); timing random weights of SmolLM2-135M's shapes",
            path.display()
        ),
    }
    let c = smollm2_config();
    CpuModel::new(c.clone(), random_weights(&c)).expect("SmolLM2-shaped model")
}

fn prompt(seq: usize, n: usize) -> Vec<u32> {
    (0..n as u32)
        .map(|i| (i * 7919 + seq as u32 * 104_729) % 49152)
        .collect()
}

/// CPU seconds (user + system) this process has used (Linux `/proc`, 100 Hz ticks).
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

/// Prints wall-clock tokens/s and tokens per CPU-second x threads: on a
/// machine shared with other work the second is what the same run would
/// reach with every core to itself (an upper bound: it assumes perfect
/// parallel efficiency).
fn cpu_time_estimate(name: &str, tokens: usize, iters: usize, mut step: impl FnMut()) {
    let (c0, t0) = (cpu_seconds(), Instant::now());
    for _ in 0..iters {
        step();
    }
    let wall = t0.elapsed().as_secs_f64();
    let total = (tokens * iters) as f64;
    let threads = rayon::current_num_threads();
    match (c0, cpu_seconds()) {
        (Some(a), Some(b)) if b > a => eprintln!(
            "{name}: {:.1} tok/s wall; {:.1} tok/s per CPU-second, x{threads} threads = {:.1} tok/s uncontended estimate",
            total / wall,
            total / (b - a),
            total / (b - a) * threads as f64
        ),
        _ => eprintln!("{name}: {:.1} tok/s wall", total / wall),
    }
}

fn bench_prefill(c: &mut Criterion, model: &CpuModel, seqs: usize) {
    let layout = ContiguousLayout {
        block_size: BLOCK,
        blocks_per_seq: CTX.div_ceil(BLOCK) + 1,
    };
    let mut cache = KvCache::new(model.kv_geometry(seqs * layout.blocks_per_seq, BLOCK));
    let mut batch = ForwardBatch::default();
    for s in 0..seqs {
        layout.push(&mut batch, s, 0, &prompt(s, CTX), true);
    }
    cpu_time_estimate(&format!("prefill {seqs}x{CTX}"), seqs * CTX, 3, || {
        model.forward(&batch, &mut cache).expect("forward");
    });
    let mut g = c.benchmark_group("prefill");
    g.throughput(Throughput::Elements((seqs * CTX) as u64));
    g.sample_size(10)
        .measurement_time(Duration::from_secs(if seqs > 1 { 25 } else { 10 }));
    g.bench_function(format!("{seqs}x{CTX}"), |b| {
        b.iter(|| model.forward(&batch, &mut cache).expect("forward"))
    });
    g.finish();
}

fn bench_decode(c: &mut Criterion, model: &CpuModel, seqs: usize) {
    let layout = ContiguousLayout {
        block_size: BLOCK,
        blocks_per_seq: CTX.div_ceil(BLOCK) + 1,
    };
    let mut cache = KvCache::new(model.kv_geometry(seqs * layout.blocks_per_seq, BLOCK));
    // Fill the context once, then time one decode step at position CTX.
    let mut pre = ForwardBatch::default();
    let mut batch = ForwardBatch::default();
    for s in 0..seqs {
        layout.push(&mut pre, s, 0, &prompt(s, CTX), false);
        layout.push(&mut batch, s, CTX, &[(s as u32 * 13) % 49152], true);
    }
    model.forward(&pre, &mut cache).expect("prefill");
    cpu_time_estimate(&format!("decode batch {seqs}"), seqs, 20, || {
        model.forward(&batch, &mut cache).expect("forward");
    });
    let mut g = c.benchmark_group("decode");
    g.throughput(Throughput::Elements(seqs as u64));
    g.sample_size(20).measurement_time(Duration::from_secs(10));
    g.bench_function(format!("batch{seqs}_ctx{CTX}"), |b| {
        b.iter(|| model.forward(&batch, &mut cache).expect("forward"))
    });
    g.finish();
}

fn forward(c: &mut Criterion) {
    let model = load();
    bench_decode(c, &model, 1);
    bench_decode(c, &model, 32);
    bench_prefill(c, &model, 1);
    bench_prefill(c, &model, 4);
}

criterion_group!(benches, forward);
criterion_main!(benches);
