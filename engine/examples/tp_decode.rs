//! Decode speed under tensor parallelism, and what its all-reduces cost.
//!
//! ```sh
//! cargo build --release -p engine --features mpi --example tp_decode
//! B=target/release/examples/tp_decode
//! TP_THREADS=2 $B MODEL            # one rank, 2 threads (the plain CPU executor)
//! TP_THREADS=1 mpiexec -n 2 $B MODEL   # two ranks, 1 thread each
//! ```
//!
//! Rank 0 prefills `batch` prompts of 32 tokens, then times `STEPS` decode
//! steps of `batch` rows (greedy), for each batch size in `TP_BATCHES`
//! (default `1,32`). Over several ranks it also reports the time spent in
//! all-reduce (waiting for the slower rank included) per step and per
//! layer (two all-reduces a layer, one for the embedding).

use engine::dist::mpi::MpiComm;
use engine::dist::Collective;
use engine::executor::gpu::DType;
use engine::executor::tp::{build_tp_executor, run_worker};
use engine::executor::{
    argmax, build_executor, BlockOps, ContiguousLayout, DeviceKind, ExecError, ExecutorRequest,
    ForwardBatch, Sampling, WeightInput,
};
use model_loader::{WeightReader, WeightTypes};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

const PROMPT: usize = 32;
const STEPS: usize = 32;

/// A collective that counts its all-reduces and their time.
struct Timed {
    inner: MpiComm,
    calls: AtomicU64,
    nanos: AtomicU64,
}

impl Collective for Timed {
    fn rank(&self) -> usize {
        self.inner.rank()
    }
    fn world(&self) -> usize {
        self.inner.world()
    }
    fn library(&self) -> &'static str {
        self.inner.library()
    }
    fn all_reduce_sum(&self, buf: &mut [f32]) -> Result<(), ExecError> {
        let t = Instant::now();
        let r = self.inner.all_reduce_sum(buf);
        self.nanos
            .fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
        self.calls.fetch_add(1, Ordering::Relaxed);
        r
    }
    fn gather(&self, mine: &[f32], counts: &[usize]) -> Result<Vec<f32>, ExecError> {
        self.inner.gather(mine, counts)
    }
    fn broadcast(&self, bytes: &mut Vec<u8>) -> Result<(), ExecError> {
        self.inner.broadcast(bytes)
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let model = std::env::args().nth(1).ok_or("usage: tp_decode MODEL")?;
    let threads: usize = std::env::var("TP_THREADS").map_or(Ok(1), |v| v.parse())?;
    engine::model::par::set_threads(threads);
    let batches: Vec<usize> = std::env::var("TP_BATCHES")
        .unwrap_or_else(|_| "1,32".into())
        .split(',')
        .map(str::parse)
        .collect::<Result<_, _>>()?;
    let comm = Arc::new(Timed {
        inner: MpiComm::init()?,
        calls: AtomicU64::new(0),
        nanos: AtomicU64::new(0),
    });
    let reader = WeightReader::open(std::path::Path::new(&model))?;
    let config = reader.config().clone();
    let max_batch = batches.iter().copied().max().unwrap_or(1);
    let layout = ContiguousLayout {
        block_size: 16,
        blocks_per_seq: (PROMPT + STEPS + 1).div_ceil(16),
    };
    let req = ExecutorRequest {
        device: DeviceKind::Cpu,
        block_size: layout.block_size,
        num_gpu_blocks: Some(max_batch * layout.blocks_per_seq),
        cpu_kv_cache_bytes: 0,
        swap_bytes: 0,
        gpu_memory_utilization: 0.9,
        max_num_batched_tokens: 2048,
        dtype: DType::F32,
        kv_cache_dtype: None,
        max_num_seqs: max_batch,
        enforce_eager: true,
        batch_invariant: false,
    };
    let input = WeightInput::File {
        reader: &reader,
        cpu_types: WeightTypes::File,
    };
    let world = comm.world();
    let built = if world == 1 {
        build_executor(config.clone(), input, &req)?
    } else {
        build_tp_executor(config.clone(), input, &req, Arc::clone(&comm) as _)?
    };
    let mut exec = built.executor;
    if comm.rank() != 0 {
        run_worker(&mut *exec, &*comm)?;
        return Ok(());
    }
    println!(
        "# {model}: {world} rank(s) x {threads} thread(s); {}",
        built.description
    );
    println!("| batch | decode tok/s | all-reduce ms/step | all-reduce us/layer | share of step |");
    println!("|---|---|---|---|---|");
    for &b in &batches {
        let mut last: Vec<u32> = Vec::with_capacity(b);
        for s in 0..b {
            let prompt: Vec<u32> = (0..PROMPT as u32)
                .map(|i| 300 + (i * 7919 + s as u32 * 104_729) % 40_000)
                .collect();
            let mut batch = ForwardBatch::default();
            layout.push(&mut batch, s, 0, &prompt, true);
            let l = exec
                .execute(&BlockOps::default(), &batch, &Sampling::Host)?
                .into_logits()?;
            last.push(argmax(&l.data[..l.vocab]));
        }
        let (c0, n0) = (
            comm.calls.load(Ordering::Relaxed),
            comm.nanos.load(Ordering::Relaxed),
        );
        let t = Instant::now();
        for step in 0..STEPS {
            let mut batch = ForwardBatch::default();
            for (s, tok) in last.iter().enumerate() {
                layout.push(&mut batch, s, PROMPT + step, &[*tok], true);
            }
            let l = exec
                .execute(&BlockOps::default(), &batch, &Sampling::Host)?
                .into_logits()?;
            for (s, row) in l.data.chunks_exact(l.vocab).enumerate() {
                last[s] = argmax(row);
            }
        }
        let secs = t.elapsed().as_secs_f64();
        let calls = comm.calls.load(Ordering::Relaxed) - c0;
        let ar_ms = (comm.nanos.load(Ordering::Relaxed) - n0) as f64 / 1e6;
        let per_step = ar_ms / STEPS as f64;
        let per_layer_us = per_step * 1e3 / config.num_hidden_layers as f64;
        println!(
            "| {b} | {:.1} | {per_step:.2} | {per_layer_us:.0} | {:.0}% ({calls} calls) |",
            (b * STEPS) as f64 / secs,
            100.0 * ar_ms / 1e3 / secs
        );
    }
    drop(exec);
    Ok(())
}
