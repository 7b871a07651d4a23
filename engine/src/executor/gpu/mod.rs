//! The GPU executor: the same [`Executor`] contract as the CPU executor, run
//! through the `gpu-kernels` entry points and GEMMs on a [`Device`].
//!
//! - [`device`]: the [`Device`] trait (memory, copies, launches by name, GEMM).
//! - [`emu`]: [`EmuDevice`], the device on the host emulator (always built;
//!   tests the orchestration everywhere).
//! - [`counting`]: [`CountingDevice`], records launches and copies and
//!   computes nothing (the host-side benchmark `benches/gpu_host.rs`).
//! - `cuda` (feature `cuda`): `CudaDevice` on cudarc with dynamic loading,
//!   the PTX from `cargo xtask build-ptx`, cuBLAS GEMMs.
//! - [`cublas_path`]: finding cuBLAS 12 or 13 (wheel folders included) before
//!   cudarc's bare-name `dlopen`.
//! - [`weights`]: weights converted to the executor's dtype and uploaded once.
//! - [`forward`]: one step's forward pass (the persistent device batch,
//!   per-layer kernels).
//! - [`graphs`]: CUDA graphs of decode-only steps, per batch-size bucket.
//! - [`sample`]: sampling on the device (`Executor::execute_sampled`).
//! - [`blocks`]: the KV pools and the block operations (swap out, swap in,
//!   copy-on-write `copy_blocks`).
//!
//! Invariants: the KV layout is the CPU's (`[num_blocks, block_size,
//! num_kv_heads, head_dim]` per layer, K and V); every batch is validated by
//! the same code as on the CPU before anything is launched, and every block id
//! of a step's block operations is checked before anything moves, so a bad
//! batch leaves both pools untouched; block operations run before the forward
//! pass that needs them (the swap stream is fenced before compute).

pub mod blocks;
pub mod counting;
pub mod cublas_path;
pub mod device;
pub mod emu;
pub mod forward;
pub mod graphs;
pub mod sample;
pub mod weights;

#[cfg(feature = "cuda")]
pub mod cuda;

pub use counting::{Counters, CountersHandle, CountingDevice};
pub use device::{DType, DevBuf, DevPtr, Device, Gemm, GraphId, HostBuf, ThreadsFor};
pub use emu::EmuDevice;

use super::{
    BlockOps, ExecError, Executor, ForwardBatch, GreedyRow, HostModel, KvGeometry, Logits,
};
use crate::sampler::device::{DeviceDraws, DeviceOut};
use blocks::KvPools;
use forward::{Dims, Kernels, Scratch};
use graphs::Graphs;
use thiserror::Error;
use weights::DeviceWeights;

/// Head sizes the attention entry points are built for.
pub use gpu_kernels::attention::HEAD_SIZES as SUPPORTED_HEAD_DIMS;

/// Errors of the GPU executor and its devices.
#[derive(Debug, Error)]
pub enum GpuError {
    /// No usable CUDA driver or device (or the `cuda` feature is off).
    #[error("no CUDA device: {0}")]
    Unavailable(String),
    /// The model or configuration needs something the GPU path lacks.
    #[error("not supported on the GPU executor: {0}")]
    Unsupported(String),
    /// The PTX could not be found or loaded.
    #[error("PTX: {0}")]
    Ptx(String),
    /// The device has too little memory for what was asked.
    #[error("out of device memory: {0}")]
    OutOfMemory(String),
    /// A driver, cuBLAS or emulator call failed.
    #[error("device error: {0}")]
    Device(String),
}

impl From<GpuError> for ExecError {
    fn from(e: GpuError) -> Self {
        ExecError::Device(e.to_string())
    }
}

/// How many KV blocks the executor gets.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum KvSizing {
    /// Exactly these many device and CPU swap blocks.
    Blocks { gpu: usize, cpu: usize },
    /// vLLM's profile: after the weights and one forward pass of
    /// `max_num_batched_tokens` tokens, device blocks fill `fraction` of the
    /// device's total memory; the swap pool has `swap_bytes` of host memory.
    Utilization {
        fraction: f64,
        swap_bytes: usize,
        max_num_batched_tokens: usize,
    },
}

/// Options of a [`GpuExecutor`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GpuOptions {
    /// Element type of weights, activations and the KV cache.
    pub dtype: DType,
    /// Tokens per KV block.
    pub block_size: usize,
    pub kv: KvSizing,
}

/// Runs a Llama-family model on a [`Device`] over a paged KV cache.
pub struct GpuExecutor<D: Device> {
    dev: D,
    dims: Dims,
    dtype: DType,
    weights: DeviceWeights,
    kv: KvPools,
    scratch: Scratch,
    kernels: Kernels,
    graphs: Graphs,
    sampling: sample::SampleState,
}

impl<D: Device> GpuExecutor<D> {
    /// Uploads `model` to `dev` and sizes the KV pools. The caller may drop
    /// `model` afterwards (the device holds its own copy).
    pub fn new<M: HostModel + ?Sized>(
        mut dev: D,
        model: &M,
        opts: GpuOptions,
    ) -> Result<Self, GpuError> {
        let host = model.host_weights();
        if let model_loader::Architecture::Gemma3(_) = host.config.architecture {
            return Err(GpuError::Unsupported(
                "the gemma3 architecture (sliding window, q/k norms, post-norms) is not implemented on the GPU executor; use --device cpu".into(),
            ));
        }
        let dims = Dims::of(&host)?;
        if opts.block_size == 0 {
            return Err(GpuError::Unsupported("block_size must be positive".into()));
        }
        let weights = DeviceWeights::upload(&mut dev, &host, opts.dtype)?;
        let kernels = Kernels::resolve(&mut dev, opts.dtype, dims.head_dim)?;
        let sampling = sample::SampleState::new(&mut dev)?;
        let config = host.config;
        let geom = |blocks| KvGeometry::for_model(config, blocks, opts.block_size);
        let (gpu_blocks, cpu_blocks) = match opts.kv {
            KvSizing::Blocks { gpu, cpu } => (gpu, cpu),
            KvSizing::Utilization {
                fraction,
                swap_bytes,
                max_num_batched_tokens,
            } => {
                let per_block = KvPools::bytes_per_block(&geom(1), opts.dtype);
                let profiled = profile_free_bytes(
                    &mut dev,
                    &kernels,
                    dims,
                    &weights,
                    opts,
                    max_num_batched_tokens.min(dims.max_positions),
                    geom,
                )?;
                let gpu = blocks_for_fraction(profiled, fraction, per_block)?;
                (gpu, swap_bytes / per_block)
            }
        };
        if gpu_blocks == 0 {
            return Err(GpuError::OutOfMemory(
                "no room for a single KV block".into(),
            ));
        }
        let kv = KvPools::new(&mut dev, geom(gpu_blocks), cpu_blocks, opts.dtype)?;
        tracing::info!(
            device = %dev.describe(),
            weights_mib = weights.bytes >> 20,
            gpu_blocks,
            cpu_blocks,
            "GPU executor ready"
        );
        Ok(Self {
            dev,
            dims,
            dtype: opts.dtype,
            weights,
            kv,
            scratch: Scratch::default(),
            kernels,
            graphs: Graphs::new(graphs::MAX_BUCKET, false),
            sampling,
        })
    }

    /// CUDA graphs for decode steps of up to `min(512, max_num_seqs)`
    /// sequences (the default: up to 512), or none with `enforce_eager`
    /// (vLLM's `--enforce-eager`).
    pub fn with_cuda_graphs(mut self, max_num_seqs: usize, enforce_eager: bool) -> Self {
        self.graphs = Graphs::new(max_num_seqs, enforce_eager);
        self
    }

    /// The device (tests read the emulator's counters).
    pub fn device(&self) -> &D {
        &self.dev
    }

    /// The device, mutably (tests change inputs in place).
    pub fn device_mut(&mut self) -> &mut D {
        &mut self.dev
    }

    /// One block's K and V of every layer, as f32, for the device pool
    /// (`host == false`) or the swap pool: `[layer][K, V][block elements]`.
    /// Used by tests to compare pools with the CPU executor.
    pub fn read_block(&mut self, block: usize, host: bool) -> Result<Vec<Vec<f32>>, GpuError> {
        self.kv.read_block(&mut self.dev, block, host)
    }

    /// Writes one device block's K (`kv == 0`) or V of `layer` (tests).
    pub fn write_block(
        &mut self,
        layer: usize,
        kv: usize,
        block: usize,
        values: &[f32],
    ) -> Result<(), GpuError> {
        self.kv.write_block(&mut self.dev, layer, kv, block, values)
    }
}

/// Free device bytes after a forward pass of `tokens` tokens on a temporary
/// pool just big enough for it (weights, workspace and library workspaces are
/// then all allocated, as vLLM's profile run does).
#[allow(clippy::too_many_arguments)]
fn profile_free_bytes<D: Device>(
    dev: &mut D,
    kernels: &Kernels,
    dims: Dims,
    weights: &DeviceWeights,
    opts: GpuOptions,
    tokens: usize,
    geom: impl Fn(usize) -> KvGeometry,
) -> Result<(usize, usize), GpuError> {
    let tokens = tokens.max(1);
    let blocks = tokens.div_ceil(opts.block_size);
    let pool = KvPools::new(dev, geom(blocks), 0, opts.dtype)?;
    let batch = forward::profile_batch(tokens, opts.block_size);
    let mut scratch = Scratch::default();
    let run = forward::run(
        dev,
        kernels,
        dims,
        opts.dtype,
        weights,
        &pool,
        &mut scratch,
        &batch,
    );
    let info = dev.mem_info();
    scratch.release(dev)?;
    pool.release(dev)?;
    run?;
    info.ok_or_else(|| {
        GpuError::Unsupported(
            "this device cannot report its memory: give the KV pool size in blocks".into(),
        )
    })
}

/// Device blocks that fit in `fraction` of total memory given what the
/// profile left free: `(free - total * (1 - fraction)) / per_block`.
fn blocks_for_fraction(
    (free, total): (usize, usize),
    fraction: f64,
    per_block: usize,
) -> Result<usize, GpuError> {
    if !(fraction > 0.0 && fraction <= 1.0) {
        return Err(GpuError::Unsupported(format!(
            "gpu memory utilization must be in (0, 1], got {fraction}"
        )));
    }
    let reserve = (total as f64 * (1.0 - fraction)) as usize;
    let avail = free.saturating_sub(reserve);
    let blocks = avail / per_block.max(1);
    if blocks == 0 {
        return Err(GpuError::OutOfMemory(format!(
            "after the weights and the profile run {} MiB are free of {} MiB; \
             utilization {fraction} leaves no room for a KV block of {per_block} bytes",
            free >> 20,
            total >> 20
        )));
    }
    Ok(blocks)
}

impl<D: Device> GpuExecutor<D> {
    /// Block operations, validation, then the forward pass returning `out`.
    fn step(
        &mut self,
        ops: &BlockOps,
        batch: &ForwardBatch,
        out: forward::Output,
    ) -> Result<forward::StepOut, ExecError> {
        self.kv.apply(&mut self.dev, ops)?;
        if batch.token_ids.is_empty() && batch.logits_rows.is_empty() {
            return Ok(match out {
                forward::Output::Logits | forward::Output::Device => {
                    forward::StepOut::Logits(Logits {
                        rows: 0,
                        vocab: self.dims.vocab,
                        data: Vec::new(),
                    })
                }
                forward::Output::Greedy => forward::StepOut::Greedy(Vec::new()),
            });
        }
        super::validate_batch(
            batch,
            &self.kv.geometry(),
            self.dims.vocab,
            self.dims.max_positions,
        )?;
        if let Some(bucket) = self.graphs.bucket_of(batch) {
            return Ok(self.graph_step(batch, bucket, out)?);
        }
        Ok(forward::run_to(
            &mut self.dev,
            &self.kernels,
            self.dims,
            self.dtype,
            &self.weights,
            &self.kv,
            &mut self.scratch,
            batch,
            out,
        )?)
    }
}

impl<D: Device> GpuExecutor<D> {
    /// A validated decode batch padded to `bucket` rows, run as that
    /// bucket's graph (captured first if there is none for the current
    /// buffers). See [`graphs`].
    fn graph_step(
        &mut self,
        batch: &ForwardBatch,
        bucket: usize,
        out: forward::Output,
    ) -> Result<forward::StepOut, GpuError> {
        let pad = forward::Padding {
            bucket,
            kv: &self.kv,
            max_context: self.dims.max_positions,
        };
        let geometry = (self.kv.geometry().block_size, self.dims.max_positions);
        let m = self
            .scratch
            .batch
            .upload(&mut self.dev, batch, geometry, Some(&pad))?;
        let rows = batch.seqs.len();
        let print = self.scratch.fingerprint();
        if let Some(g) = self.graphs.find(bucket, out, &print) {
            // SAFETY: the fingerprint is the capture's: every scratch and
            // batch buffer the graph addresses is live at the same address
            // and size; weights and KV pools never move.
            unsafe { self.dev.launch_graph(g) }?;
            return forward::finish(&mut self.dev, &mut self.scratch, self.dims, rows, out);
        }
        if let Some(old) = self.graphs.take(bucket, out) {
            self.dev.drop_graph(old)?;
        }
        let counts = graphs::padded_counts(bucket);
        let run = |dev: &mut D, scratch: &mut Scratch| {
            forward::compute(
                dev,
                &self.kernels,
                self.dims,
                self.dtype,
                &self.weights,
                &self.kv,
                scratch,
                &counts,
                &m,
                out,
            )
        };
        // Eager first: computes this step and sizes every buffer, so that
        // the capture below allocates nothing.
        run(&mut self.dev, &mut self.scratch)?;
        let print = self.scratch.fingerprint();
        self.dev.begin_capture()?;
        let recorded = run(&mut self.dev, &mut self.scratch);
        let graph = self.dev.end_capture();
        recorded?;
        let graph = graph?;
        if self.scratch.fingerprint() != print {
            self.dev.drop_graph(graph)?;
            return Err(GpuError::Device(
                "a buffer moved while capturing a graph".into(),
            ));
        }
        self.graphs.insert(bucket, out, graph, print);
        forward::finish(&mut self.dev, &mut self.scratch, self.dims, rows, out)
    }
}

impl<D: Device> Executor for GpuExecutor<D> {
    fn execute(&mut self, ops: &BlockOps, batch: &ForwardBatch) -> Result<Logits, ExecError> {
        match self.step(ops, batch, forward::Output::Logits)? {
            forward::StepOut::Logits(l) => Ok(l),
            forward::StepOut::Greedy(_) | forward::StepOut::Device(_) => Err(ExecError::Device(
                "greedy rows where logits were asked".into(),
            )),
        }
    }

    fn execute_greedy(
        &mut self,
        ops: &BlockOps,
        batch: &ForwardBatch,
    ) -> Result<Option<Vec<GreedyRow>>, ExecError> {
        match self.step(ops, batch, forward::Output::Greedy)? {
            forward::StepOut::Greedy(rows) => Ok(Some(rows)),
            forward::StepOut::Logits(_) | forward::StepOut::Device(_) => Err(ExecError::Device(
                "logits where greedy rows were asked".into(),
            )),
        }
    }

    fn execute_sampled(
        &mut self,
        ops: &BlockOps,
        batch: &ForwardBatch,
        draws: &DeviceDraws,
    ) -> Result<Option<DeviceOut>, ExecError> {
        self.sample_step(ops, batch, draws).map(Some)
    }

    fn vocab_size(&self) -> usize {
        self.dims.vocab
    }

    fn num_blocks(&self) -> (usize, usize) {
        (self.kv.num_blocks(), self.kv.num_cpu_blocks())
    }

    fn block_size(&self) -> usize {
        self.kv.geometry().block_size
    }
}

#[cfg(test)]
mod tests;
