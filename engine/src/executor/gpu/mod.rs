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
//! - `nccl` (feature `cuda`): the tensor-parallel ranks' NCCL all-reduce.
//! - [`cublas_path`]: finding cuBLAS 12 or 13 (wheel folders included) before
//!   cudarc's bare-name `dlopen`.
//! - [`weights`]: the GPU's weight formats and the sink that uploads a
//!   model's tensors from the loader, converted to the executor's dtype.
//! - [`forward`]: the GPU's `Backend` (the model definition of
//!   `crate::model::arch` runs on it) and one step (the persistent device
//!   batch, the launches).
//! - [`graphs`]: CUDA graphs of decode-only steps, per batch-size bucket.
//! - [`lora`]: multi-LoRA adapters in device slots and their BGMV / SGMV
//!   launches (`Executor::execute_lora`).
//! - [`sample`]: sampling on the device (`Sampling::Device`).
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
pub mod lora;
pub mod sample;
pub mod weights;

#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(feature = "cuda")]
pub mod nccl;

pub use counting::{Counters, CountersHandle, CountingDevice};
pub use device::{DType, DevBuf, DevPtr, Device, Gemm, GraphId, HostBuf, ThreadsFor};
pub use emu::EmuDevice;

use super::{
    BlockOps, BuildError, Capabilities, ExecError, Executor, ForwardBatch, KvGeometry, Logits,
    Sampling, StepOutput,
};
use crate::dist::Collective;
use crate::model::lora::LoraStep;
use crate::model::tp::TpRank;
use crate::model::{Dims, Model, WeightSource};
use crate::sampler::device::DeviceOut;
use crate::sampler::SampleOut;
use blocks::KvPools;
use forward::{Kernels, Parts, Scratch};
use graphs::Graphs;
use model_loader::ModelConfig;
use weights::{Gpu, GpuSink};

/// Head sizes the attention entry points are built for.
pub use gpu_kernels::attention::HEAD_SIZES as SUPPORTED_HEAD_DIMS;

pub use engine_core::GpuError;

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

/// Runs a model of any registered architecture on a [`Device`] over a
/// paged KV cache.
pub struct GpuExecutor<D: Device> {
    dev: D,
    dims: Dims,
    /// Positions the rotary tables cover (the batch validation's bound).
    max_positions: usize,
    dtype: DType,
    model: Model<Gpu>,
    kv: KvPools,
    scratch: Scratch,
    kernels: Kernels,
    graphs: Graphs,
    sampling: sample::SampleState,
    /// The LoRA slots on the device (nothing allocated until a step has
    /// adapters).
    lora: lora::GpuLora,
    /// This rank's shard and collectives under tensor parallelism (the
    /// model is the shard; see [`GpuExecutor::load_sharded`]).
    tp: Option<TpRank>,
}

impl<D: Device> GpuExecutor<D> {
    /// Reads `config`'s model from `source` a layer at a time, uploads it
    /// to `dev` in `opts.dtype` (no host copy of the model is kept or
    /// built), and sizes the KV pools.
    pub fn load(
        dev: D,
        config: ModelConfig,
        source: &mut dyn WeightSource,
        opts: GpuOptions,
    ) -> Result<Self, BuildError> {
        Self::load_with(dev, config, source, opts, None)
    }

    /// One tensor-parallel rank: [`GpuExecutor::load`] of this rank's
    /// shard (`config` its local configuration, `source` a
    /// [`crate::model::tp::ShardSource`]). Every rank must call this at the
    /// same time: the profile run meets the other ranks in its collectives,
    /// and the ranks agree on the smallest pool sizes, so that block ids
    /// mean the same on every rank. Steps return logits only (rank 0 gets
    /// the whole vocabulary's; the host draws), a LoRA slot holds this
    /// rank's slice of its adapter, and decode steps run as CUDA graphs
    /// only where the device all-reduces itself ([`Device::has_all_reduce`]:
    /// NCCL; the graph holds its calls).
    pub fn load_sharded(
        dev: D,
        config: ModelConfig,
        source: &mut dyn WeightSource,
        opts: GpuOptions,
        tp: TpRank,
    ) -> Result<Self, BuildError> {
        Self::load_with(dev, config, source, opts, Some(tp))
    }

    fn load_with(
        mut dev: D,
        config: ModelConfig,
        source: &mut dyn WeightSource,
        opts: GpuOptions,
        tp: Option<TpRank>,
    ) -> Result<Self, BuildError> {
        if !SUPPORTED_HEAD_DIMS.contains(&config.head_dim) {
            return Err(GpuError::Unsupported(format!(
                "head_dim {} (the attention kernels are built for {SUPPORTED_HEAD_DIMS:?})",
                config.head_dim
            ))
            .into());
        }
        if opts.block_size == 0 {
            return Err(GpuError::Unsupported("block_size must be positive".into()).into());
        }
        let kernels = Kernels::resolve(&mut dev, opts.dtype, config.head_dim)?;
        let mut sink = GpuSink::new(&mut dev, opts.dtype);
        let model = Model::load(config, source, &mut sink)?;
        let weights_bytes = sink.bytes;
        let dims = model.dims();
        let max_positions = model.config().max_position_embeddings;
        let sampling = sample::SampleState::new(&mut dev)?;
        let block_size = opts.block_size;
        let geom = |blocks| crate::model::kv_geometry(model.config(), blocks, block_size);
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
                    (&kernels, &model, opts, tp.as_ref()),
                    max_num_batched_tokens.min(max_positions),
                    geom,
                )?;
                let gpu = blocks_for_fraction(profiled, fraction, per_block)?;
                (gpu, swap_bytes / per_block)
            }
        };
        let (gpu_blocks, cpu_blocks) = match &tp {
            Some(tp) => agree_on_fewest(&*tp.comm, [gpu_blocks, cpu_blocks])?.into(),
            None => (gpu_blocks, cpu_blocks),
        };
        if gpu_blocks == 0 {
            return Err(GpuError::out_of_memory("no room for a single KV block").into());
        }
        let kv = KvPools::new(&mut dev, geom(gpu_blocks), cpu_blocks, opts.dtype)?;
        // All-reduces through the host wait for the device: such steps run
        // eager (see `forward`'s `all_reduce`); the device's own are captured.
        let host_reduced = tp.is_some() && !dev.has_all_reduce();
        tracing::info!(
            device = %dev.describe(),
            weights_mib = weights_bytes >> 20,
            gpu_blocks,
            cpu_blocks,
            "GPU executor ready"
        );
        Ok(Self {
            dev,
            dims,
            max_positions,
            dtype: opts.dtype,
            model,
            kv,
            scratch: Scratch::default(),
            kernels,
            graphs: Graphs::new(graphs::MAX_BUCKET, host_reduced),
            sampling,
            lora: lora::GpuLora::default(),
            tp,
        })
    }

    /// [`GpuExecutor::load`] from weights in memory (tests, benchmarks).
    pub fn new<W: Into<model_loader::Weight>>(
        dev: D,
        config: ModelConfig,
        weights: model_loader::ModelWeights<W>,
        opts: GpuOptions,
    ) -> Result<Self, BuildError> {
        Self::load(
            dev,
            config,
            &mut crate::model::InMemory::from(weights),
            opts,
        )
    }

    /// The device and the scratch, mutably, beside the parts every step
    /// reads (disjoint borrows of one executor).
    fn split(&mut self) -> (&mut D, &mut Scratch, Parts<'_>) {
        let parts = Parts {
            kernels: &self.kernels,
            model: &self.model,
            dims: self.dims,
            dtype: self.dtype,
            kv: &self.kv,
            lora: None,
            tp: self.tp.as_ref(),
        };
        (&mut self.dev, &mut self.scratch, parts)
    }

    /// CUDA graphs for decode steps of up to `min(512, max_num_seqs)`
    /// sequences (the default: up to 512), or none with `enforce_eager`
    /// (vLLM's `--enforce-eager`).
    pub fn with_cuda_graphs(mut self, max_num_seqs: usize, enforce_eager: bool) -> Self {
        let host_reduced = self.tp.is_some() && !self.dev.has_all_reduce();
        self.graphs = Graphs::new(max_num_seqs, enforce_eager || host_reduced);
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
fn profile_free_bytes<D: Device>(
    dev: &mut D,
    (kernels, model, opts, tp): (&Kernels, &Model<Gpu>, GpuOptions, Option<&TpRank>),
    tokens: usize,
    geom: impl Fn(usize) -> KvGeometry,
) -> Result<(usize, usize), GpuError> {
    let tokens = tokens.max(1);
    let blocks = tokens.div_ceil(opts.block_size);
    let pool = KvPools::new(dev, geom(blocks), 0, opts.dtype)?;
    let batch = forward::profile_batch(tokens, opts.block_size);
    let mut scratch = Scratch::default();
    let parts = Parts {
        kernels,
        model,
        dims: model.dims(),
        dtype: opts.dtype,
        kv: &pool,
        lora: None,
        tp,
    };
    let run = forward::run(dev, &parts, &mut scratch, &batch);
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
        return Err(GpuError::out_of_memory(format!(
            "after the weights and the profile run {} MiB are free of {} MiB; \
             utilization {fraction} leaves no room for a KV block of {per_block} bytes",
            free >> 20,
            total >> 20
        )));
    }
    Ok(blocks)
}

impl<D: Device> GpuExecutor<D> {
    /// Block operations, validation, then the forward pass returning `out`
    /// (with `lora`'s adapters: checked against the batch by the caller).
    fn step(
        &mut self,
        ops: &BlockOps,
        batch: &ForwardBatch,
        lora: &LoraStep,
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
            self.max_positions,
        )?;
        let step = if !lora.is_empty() {
            self.lora_step(batch, lora, out)?
        } else if let Some(bucket) = self.graphs.bucket_of(batch) {
            self.graph_step(batch, bucket, out)?
        } else {
            let (dev, scratch, parts) = self.split();
            forward::run_to(dev, &parts, scratch, batch, out)?
        };
        self.gathered(step)
    }

    /// A step's answer as the engine gets it: under tensor parallelism this
    /// rank's slice of the logits gathered (rank 0 gets them whole).
    fn gathered(&self, step: forward::StepOut) -> Result<forward::StepOut, ExecError> {
        match (&self.tp, step) {
            (None, step) => Ok(step),
            (Some(tp), forward::StepOut::Logits(mine)) => {
                let all = tp.gather_logits(mine.rows, &mine.data, self.dims.vocab)?;
                Ok(forward::StepOut::Logits(all))
            }
            (Some(_), _) => Err(ExecError::WrongAnswer(
                "greedy rows or device logits from a tensor-parallel rank".into(),
            )),
        }
    }

    /// A validated step with adapters, always eager (never a graph: its
    /// launches depend on the slots the step uses, see [`lora`]).
    fn lora_step(
        &mut self,
        batch: &ForwardBatch,
        lora: &LoraStep,
        out: forward::Output,
    ) -> Result<forward::StepOut, ExecError> {
        // `run` borrows the slot table, so the parts are built field by
        // field here rather than through `split` (which borrows all of self).
        let run = self.lora.prepare(
            &mut self.dev,
            (&self.dims, self.dtype),
            lora,
            batch,
            self.tp.as_ref(),
        )?;
        let parts = Parts {
            kernels: &self.kernels,
            model: &self.model,
            dims: self.dims,
            dtype: self.dtype,
            kv: &self.kv,
            lora: Some(&run),
            tp: self.tp.as_ref(),
        };
        Ok(forward::run_to(
            &mut self.dev,
            &parts,
            &mut self.scratch,
            batch,
            out,
        )?)
    }

    /// Adapter slots uploaded to the device so far (tests).
    pub fn lora_fills(&self) -> u64 {
        self.lora.fills
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
            max_context: self.max_positions,
        };
        let geometry = (self.kv.geometry().block_size, self.max_positions);
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
            let vocab = self.split().2.vocab_rows();
            return forward::finish(&mut self.dev, &mut self.scratch, vocab, rows, out);
        }
        if let Some(old) = self.graphs.take(bucket, out) {
            self.dev.drop_graph(old)?;
        }
        let counts = graphs::padded_counts(bucket);
        let (dev, scratch, parts) = self.split();
        let vocab = parts.vocab_rows();
        // Eager first: computes this step and sizes every buffer, so that
        // the capture below allocates nothing.
        forward::compute(dev, &parts, scratch, &counts, &m, out)?;
        let print = scratch.fingerprint();
        dev.begin_capture()?;
        let recorded = forward::compute(dev, &parts, scratch, &counts, &m, out);
        let graph = dev.end_capture();
        recorded?;
        let graph = graph?;
        if scratch.fingerprint() != print {
            dev.drop_graph(graph)?;
            return Err(GpuError::Device(
                "a buffer moved while capturing a graph".into(),
            ));
        }
        self.graphs.insert(bucket, out, graph, print);
        forward::finish(&mut self.dev, &mut self.scratch, vocab, rows, out)
    }
}

impl<D: Device> Executor for GpuExecutor<D> {
    fn capabilities(&self) -> Capabilities {
        // A rank holds a slice of the vocabulary: only rank 0's gathered
        // logits are whole, so the host draws under tensor parallelism.
        let whole = self.tp.is_none();
        Capabilities {
            greedy: whole,
            sampled: whole,
            count_slots: whole,
        }
    }

    fn execute(
        &mut self,
        ops: &BlockOps,
        batch: &ForwardBatch,
        sampling: &Sampling,
    ) -> Result<StepOutput, ExecError> {
        self.execute_lora(ops, batch, &LoraStep::default(), sampling)
    }

    fn supports_lora(&self) -> bool {
        true
    }

    fn execute_lora(
        &mut self,
        ops: &BlockOps,
        batch: &ForwardBatch,
        lora: &LoraStep,
        sampling: &Sampling,
    ) -> Result<StepOutput, ExecError> {
        lora.validate(batch.seqs.len())?;
        // A rank refuses before its forward pass meets the other ranks'
        // collectives (which would wait for a step they never run).
        if self.tp.is_some() && *sampling != Sampling::Host {
            return Err(ExecError::InvalidConfig(
                "tensor-parallel ranks return logits; the host draws".into(),
            ));
        }
        match sampling {
            Sampling::Host => match self.step(ops, batch, lora, forward::Output::Logits)? {
                forward::StepOut::Logits(l) => Ok(StepOutput::Logits(l)),
                forward::StepOut::Greedy(_) | forward::StepOut::Device(_) => Err(
                    ExecError::WrongAnswer("greedy rows where logits were asked".into()),
                ),
            },
            Sampling::Greedy => match self.step(ops, batch, lora, forward::Output::Greedy)? {
                forward::StepOut::Greedy(rows) => Ok(StepOutput::Drawn(DeviceOut {
                    rows: rows.iter().map(SampleOut::from).collect(),
                    host_rows: Vec::new(),
                    logits: None,
                })),
                forward::StepOut::Logits(_) | forward::StepOut::Device(_) => Err(
                    ExecError::WrongAnswer("logits where greedy rows were asked".into()),
                ),
            },
            Sampling::Device(draws) => Ok(StepOutput::Drawn(
                self.sample_step(ops, batch, lora, draws)?,
            )),
        }
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

/// The fewest of each count over the ranks, on every rank (pool sizes:
/// each rank measured its own free memory, and block ids must mean the
/// same everywhere). Rank 0 gathers, picks and broadcasts.
fn agree_on_fewest(comm: &dyn Collective, counts: [usize; 2]) -> Result<[usize; 2], ExecError> {
    // Block counts are far below 2^24, exact as f32.
    let mine = counts.map(|c| c as f32);
    let all = comm.gather(&mine, &vec![2; comm.world()])?;
    let mut bytes = Vec::new();
    if comm.rank() == 0 {
        for i in 0..2 {
            let fewest = all
                .iter()
                .skip(i)
                .step_by(2)
                .fold(f32::MAX, |a, &b| a.min(b));
            bytes.extend_from_slice(&(fewest as u64).to_le_bytes());
        }
    }
    comm.broadcast(&mut bytes)?;
    let at = |i: usize| {
        bytes
            .get(8 * i..8 * i + 8)
            .and_then(|b| b.try_into().ok())
            .map(u64::from_le_bytes)
            .ok_or_else(|| ExecError::Collective("rank 0 sent no pool sizes".into()))
    };
    Ok([at(0)? as usize, at(1)? as usize])
}

#[cfg(test)]
mod tests;
