//! One forward pass on a [`Device`]: the GPU's `Backend` (`step.rs`), on
//! which the model definition (`crate::model::arch`, the same file the CPU
//! runs) writes its layer graph, and around it the step (this file: the
//! kernel table, the scratch buffers, [`compute`] and [`finish`]). Each
//! operation is one or two launches:
//!
//! ```text
//! embed        embedding gather (+ scale_rows: Gemma's sqrt(hidden))
//! rms_norm     rms_norm                      add_rms_norm  add_rms_norm (x += norm(branch))
//! linear       GEMM x W^T (a bias: broadcast by a gather first, the GEMM accumulates)
//! head_norms   rms_norm_heads (in place on q and k of the fused q/k/v rows)
//! attention    rotary_embedding_and_cache (rotated K/V into the paged cache,
//!              rotated q into a contiguous buffer), then paged attention:
//!              decode v1 / split-K v2 + reduce, else prefill over the mixed batch
//! gated        silu_and_mul / gelu_tanh_and_mul
//! logits       gather the logits rows, rms_norm, GEMM with the head (f32 out)
//! lora         per adapted target: shrink + expand (BGMV or SGMV, `lora.rs`);
//!              only on a step with adapters
//! ```
//!
//! All per-step integers (ids, positions, slots, context lengths, query
//! starts, block tables, logits rows) live in the persistent [`DeviceBatch`]
//! (block tables updated from what changed, the rest in one upload);
//! activations live in a [`Scratch`] whose slots grow to the largest batch
//! seen and are then reused. Kernels are resolved once into [`Kernels`].
//!
//! Why rotated q is written to its own buffer rather than in place: the
//! attention kernels (decode v1/v2, prefill) take no q row stride and read q
//! as `[tokens, heads, head_dim]`; writing q out costs the same bytes as the
//! in-place rotation and keeps the attention kernels' signatures.
//!
//! Invariants: the `Qkv` slot is written only by its GEMM (and the bias
//! gather before it) and read only by the head norms and the fused
//! rotary/cache launch; the rotated-q buffer is written only by that launch.
//! Nothing here uploads, downloads or synchronizes: [`compute`] is what a
//! CUDA graph captures.
//!
//! Cost: launches per step for Llama-shaped models 1 + 9 per layer with v1
//! decode attention (10 with v2 + reduce) + 3, plus 1 per layer for q/k/v
//! biases; GEMMs 4 per layer + 1. Dominated by the GEMMs, O(tokens x
//! parameters).

use super::blocks::KvPools;
use super::device::{DType, DevBuf, DevPtr, Device, Kernel, ThreadsFor};
use super::lora::LoraRun;
use super::weights::Gpu;
use super::GpuError;
use crate::executor::{ForwardBatch, GreedyRow, Logits, SeqSpan};
use crate::kv::BlockId;
use crate::model::tp::TpRank;
use crate::model::{Dims, Model};
use gpu_kernels::{launch as geom, KernelArg, LaunchConfig};

mod attention;
pub mod batch;
mod step;
pub use batch::{DeviceBatch, Padding};
use step::GpuStep;

/// Every kernel the forward pass launches, resolved once at start for the
/// executor's dtype and head size: launches index this table (no name
/// formatting or map lookup per launch).
#[derive(Clone, Copy, Debug)]
pub struct Kernels {
    embedding: Kernel,
    rms_norm: Kernel,
    /// `rotary_embedding_and_cache`: rotary of q and k fused with the K/V cache write.
    rotary_cache: Kernel,
    silu_and_mul: Kernel,
    paged_v1: Kernel,
    paged_v2: Kernel,
    paged_v2_reduce: Kernel,
    /// `prefill_attention_mma` or `prefill_attention`, as `prefill_kind` says.
    prefill: Kernel,
    prefill_kind: geom::PrefillKernel,
    greedy_rows: Kernel,
    /// Gemma 3's operations.
    rms_norm_heads: Option<Kernel>,
    gelu_tanh_and_mul: Option<Kernel>,
    add_rms_norm: Option<Kernel>,
    scale_rows: Option<Kernel>,
}

impl Kernels {
    /// Resolves the entry points `<family>_<dtype>[_h<head_dim>]`.
    pub fn resolve(dev: &mut dyn Device, t: DType, head_dim: usize) -> Result<Self, GpuError> {
        let sfx = t.kernel_suffix();
        let mut plain = |f: &str| dev.kernel(&format!("{f}_{sfx}"));
        let (embedding, rms_norm, rotary_cache, silu_and_mul) = (
            plain("embedding")?,
            plain("rms_norm")?,
            plain("rotary_embedding_and_cache")?,
            plain("silu_and_mul")?,
        );
        let (rms_norm_heads, gelu_tanh_and_mul, add_rms_norm, scale_rows) = (
            plain("rms_norm_heads").ok(),
            plain("gelu_tanh_and_mul").ok(),
            plain("add_rms_norm").ok(),
            plain("scale_rows").ok(),
        );
        let prefill_kind = geom::choose_prefill(t.size() as u32, head_dim as u32);
        let mut head = |f: &str| dev.kernel(&format!("{f}_{sfx}_h{head_dim}"));
        Ok(Self {
            embedding,
            rms_norm,
            rotary_cache,
            silu_and_mul,
            paged_v1: head("paged_attention_v1")?,
            paged_v2: head("paged_attention_v2")?,
            paged_v2_reduce: head("paged_attention_v2_reduce")?,
            prefill: head(match prefill_kind {
                geom::PrefillKernel::Mma => "prefill_attention_mma",
                geom::PrefillKernel::Streaming => "prefill_attention",
            })?,
            prefill_kind,
            greedy_rows: dev.kernel("greedy_rows_f32")?,
            rms_norm_heads,
            gelu_tanh_and_mul,
            add_rms_norm,
            scale_rows,
        })
    }
}

/// A kernel this build may lack (an op only some architectures use).
fn needed(k: Option<Kernel>, what: &str) -> Result<Kernel, GpuError> {
    k.ok_or_else(|| GpuError::Unsupported(format!("{what}: the PTX has no such entry point")))
}

/// Device scratch buffers of the forward pass, each grown on demand.
#[derive(Default)]
pub struct Scratch {
    /// The step's integers (persistent block tables).
    pub batch: DeviceBatch,
    /// The activation slots, by [`crate::model::backend::Act::index`].
    acts: [Option<DevBuf>; 7],
    /// `[tokens, heads, head_dim]`: rotated q, contiguous for attention.
    q: Option<DevBuf>,
    rows: Option<DevBuf>,
    normed: Option<DevBuf>,
    logits: Option<DevBuf>,
    split_out: Option<DevBuf>,
    split_max: Option<DevBuf>,
    split_sum: Option<DevBuf>,
    /// `u32` zeros, one per token: the row ids that broadcast a bias row.
    zeros: Option<DevBuf>,
    /// `f32[rows, 3]` of the greedy reduction (device) and its host copy.
    greedy: Option<DevBuf>,
    greedy_host: Vec<u8>,
}

impl Scratch {
    /// Every device buffer but the batch's.
    fn own(&self) -> impl Iterator<Item = &Option<DevBuf>> {
        self.acts.iter().chain([
            &self.q,
            &self.rows,
            &self.normed,
            &self.logits,
            &self.split_out,
            &self.split_max,
            &self.split_sum,
            &self.zeros,
            &self.greedy,
        ])
    }

    /// Returns every buffer to the device.
    pub fn release(self, dev: &mut dyn Device) -> Result<(), GpuError> {
        let Scratch {
            batch,
            acts,
            q,
            rows,
            normed,
            logits,
            split_out,
            split_max,
            split_sum,
            zeros,
            greedy,
            greedy_host: _,
        } = self;
        batch.release(dev)?;
        let rest = [
            q, rows, normed, logits, split_out, split_max, split_sum, zeros, greedy,
        ];
        acts.into_iter()
            .chain(rest)
            .flatten()
            .try_for_each(|b| dev.free(b))
    }

    /// Address and size of every device buffer, the batch's included: a
    /// captured graph is valid while this is what it was at capture.
    pub fn fingerprint(&self) -> super::graphs::Fingerprint {
        let mut print = [(0, 0); 18];
        let [step, table] = self.batch.buffers();
        let all = [step, table]
            .into_iter()
            .chain(self.own().map(Option::as_ref));
        for (p, b) in print.iter_mut().zip(all) {
            *p = b.map_or((0, 0), |b| (b.ptr.0, b.bytes));
        }
        print
    }
}

/// The address of `slot`'s buffer, reallocated (to twice the need) if it is
/// smaller than `bytes`.
pub fn ensure(
    dev: &mut dyn Device,
    slot: &mut Option<DevBuf>,
    bytes: usize,
) -> Result<DevPtr, GpuError> {
    if let Some(b) = slot {
        if b.bytes >= bytes {
            return Ok(b.ptr);
        }
    }
    if let Some(old) = slot.take() {
        dev.free(old)?;
    }
    let buf = dev.alloc((2 * bytes).max(256))?;
    let p = buf.ptr;
    *slot = Some(buf);
    Ok(p)
}

/// Addresses of one step's integers in the [`DeviceBatch`].
pub struct Meta {
    ids: DevPtr,
    positions: DevPtr,
    slots: DevPtr,
    context_lens: DevPtr,
    query_start: DevPtr,
    tables: DevPtr,
    rows: DevPtr,
    /// Columns of `tables`.
    max_blocks: usize,
    /// The decode planner's inputs: longest context and sum of the context
    /// lengths (fixed bounds on a graph step, see [`batch`]).
    max_context: usize,
    total_context: usize,
    all_decode: bool,
}

/// What every step of one executor shares: the kernels, the model on the
/// device, its dimensions and dtype, and the KV pools; plus the step's LoRA
/// adapters, if it has any (`None`: the base path, no LoRA launch).
pub struct Parts<'a> {
    pub kernels: &'a Kernels,
    pub model: &'a Model<Gpu>,
    pub dims: Dims,
    pub dtype: DType,
    pub kv: &'a KvPools,
    pub lora: Option<&'a LoraRun<'a>>,
    /// This rank's shard and collectives under tensor parallelism.
    pub tp: Option<&'a TpRank>,
}

impl Parts<'_> {
    /// Rows of the LM head here: the vocabulary, or under tensor
    /// parallelism this rank's slice of it (the logits' width).
    pub fn vocab_rows(&self) -> usize {
        self.tp.map_or(self.dims.vocab, |tp| tp.shard().vocab.len())
    }
}

/// A `u32` kernel argument.
fn u(x: usize) -> KernelArg {
    KernelArg::U32(x as u32)
}

/// One row per block, the device's row width.
fn per_row(dev: &dyn Device, rows: usize) -> LaunchConfig {
    geom::per_row(rows as u32, dev.threads(ThreadsFor::Rows))
}

/// What a step hands back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Output {
    /// The logits rows (`rows x vocab` f32 downloaded).
    Logits,
    /// Each row's greedy choice (`rows x 12` bytes downloaded).
    Greedy,
    /// Nothing downloaded: the logits rows stay on the device (`sample.rs`).
    Device,
}

/// A step's result, as asked by [`Output`].
pub enum StepOut {
    Logits(Logits),
    Greedy(Vec<GreedyRow>),
    /// `[rows, vocab]` f32 logits on the device (valid until the next step).
    Device(DevPtr),
}

/// Runs the forward pass of a validated `batch` and returns its logits rows.
pub fn run(
    dev: &mut dyn Device,
    p: &Parts<'_>,
    s: &mut Scratch,
    batch: &ForwardBatch,
) -> Result<Logits, GpuError> {
    match run_to(dev, p, s, batch, Output::Logits)? {
        StepOut::Logits(l) => Ok(l),
        StepOut::Greedy(_) | StepOut::Device(_) => Err(GpuError::Device(
            "greedy rows where logits were asked".into(),
        )),
    }
}

/// Runs the forward pass of a validated `batch` and returns `out`.
pub fn run_to(
    dev: &mut dyn Device,
    p: &Parts<'_>,
    s: &mut Scratch,
    batch: &ForwardBatch,
    out: Output,
) -> Result<StepOut, GpuError> {
    let geometry = (
        p.kv.geometry().block_size,
        p.model.config().max_position_embeddings,
    );
    let m = s.batch.upload(dev, batch, geometry, None)?;
    compute(dev, p, s, batch, &m, out)?;
    finish(dev, s, p.vocab_rows(), batch.logits_rows.len(), out)
}

/// Every launch and GEMM of the step whose integers are at `m` (`batch`
/// gives the counts: tokens, sequences, logits rows), up to the logits (and
/// the greedy reduction with [`Output::Greedy`]). No upload, download or
/// synchronization: this is what a graph captures. Allocates only where a
/// scratch buffer is too small for these counts.
pub fn compute(
    dev: &mut dyn Device,
    p: &Parts<'_>,
    s: &mut Scratch,
    batch: &ForwardBatch,
    m: &Meta,
    out: Output,
) -> Result<(), GpuError> {
    let mut step = GpuStep::new(&mut *dev, p, &mut *s, m, batch);
    p.model.run(&mut step)?;
    let logits = step.logits;
    let r = batch.logits_rows.len();
    if let (Output::Greedy, Some(logits), true) = (out, logits, r > 0) {
        let buf = ensure(dev, &mut s.greedy, r * 12)?;
        let cfg = per_row(dev, r);
        let args = [buf.arg(), logits.arg(), u(p.dims.vocab)];
        // SAFETY: `logits` holds `r` rows of `vocab` f32 (written by the
        // LM-head GEMM); `buf` holds `r * 3` f32; one block per row.
        unsafe { dev.launch(p.kernels.greedy_rows, cfg, &args) }?;
    }
    Ok(())
}

/// Downloads the first `r` rows of what [`compute`] left (the step's one
/// host wait): logits, or each row's `(argmax, max, sum exp)` reduced on the
/// device (12 bytes a row). The argmax's logit is `max` and logsumexp is
/// `max + ln(sum)`, so its logprob is `-ln(sum)` (the CPU sampler's
/// definition).
pub fn finish(
    dev: &mut dyn Device,
    s: &mut Scratch,
    vocab: usize,
    r: usize,
    out: Output,
) -> Result<StepOut, GpuError> {
    let missing = || GpuError::Device("no output buffer for the step's rows".into());
    match out {
        _ if r == 0 => Ok(match out {
            Output::Logits | Output::Device => StepOut::Logits(Logits {
                rows: 0,
                vocab,
                data: Vec::new(),
            }),
            Output::Greedy => StepOut::Greedy(Vec::new()),
        }),
        Output::Greedy => {
            let buf = s.greedy.as_ref().ok_or_else(missing)?.ptr;
            s.greedy_host.resize(r * 12, 0);
            dev.download(buf, &mut s.greedy_host)?;
            Ok(StepOut::Greedy(greedy_rows(&s.greedy_host)))
        }
        // The logits stay on the device for the sampler (`sample.rs`).
        Output::Device => Ok(StepOut::Device(s.logits.as_ref().ok_or_else(missing)?.ptr)),
        Output::Logits => {
            let logits = s.logits.as_ref().ok_or_else(missing)?.ptr;
            // Straight into the f32 rows (one allocation, no decode pass).
            let mut data = vec![0f32; r * vocab];
            dev.download(logits, f32_bytes(&mut data))?;
            if cfg!(target_endian = "big") {
                data.iter_mut()
                    .for_each(|v| *v = f32::from_bits(u32::from_le(v.to_bits())));
            }
            Ok(StepOut::Logits(Logits {
                rows: r,
                vocab,
                data,
            }))
        }
    }
}

/// Decodes the greedy reduction's `(argmax, max, sum exp)` rows.
fn greedy_rows(host: &[u8]) -> Vec<GreedyRow> {
    host.chunks_exact(12)
        .map(|c| {
            let f = |i: usize| f32::from_le_bytes([c[i], c[i + 1], c[i + 2], c[i + 3]]);
            let (idx, sum) = (f(0), f(8));
            if idx < 0.0 {
                // Only NaN in the row: the CPU sampler's answer.
                GreedyRow {
                    token: 0,
                    logprob: f32::NAN,
                }
            } else {
                GreedyRow {
                    token: idx as u32,
                    logprob: -sum.ln(),
                }
            }
        })
        .collect()
}

/// The bytes of `v` (the device's little-endian f32s land in them).
fn f32_bytes(v: &mut [f32]) -> &mut [u8] {
    // SAFETY: `v` is a live, exclusively borrowed slice of `4 * len` bytes;
    // u8 has alignment 1 and every byte pattern is a valid f32 and u8.
    unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr().cast::<u8>(), std::mem::size_of_val(v)) }
}

/// A one-sequence prefill of `tokens` tokens over blocks `0..` (the profile run).
pub fn profile_batch(tokens: usize, block_size: usize) -> ForwardBatch {
    let blocks = tokens.div_ceil(block_size);
    ForwardBatch {
        token_ids: vec![0; tokens],
        positions: (0..tokens).collect(),
        slot_mapping: (0..tokens).collect(),
        seqs: vec![SeqSpan {
            query_len: tokens,
            context_len: tokens,
            block_table: (0..blocks as u32).map(BlockId).collect(),
        }],
        logits_rows: vec![tokens - 1],
    }
}
