//! One forward pass on a [`Device`]: the GPU's [`Backend`], on which the
//! model definition (`crate::model::arch`, the same file the CPU runs)
//! writes its layer graph. Each operation is one or two launches:
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
use super::device::{DType, DevBuf, DevPtr, Device, Gemm, Kernel, ThreadsFor};
use super::lora::LoraRun;
use super::weights::{Gpu, GpuMatrix, GpuRope};
use super::GpuError;
use crate::executor::{ForwardBatch, GreedyRow, Logits, SeqSpan};
use crate::kv::BlockId;
use crate::model::backend::{Act, ActWidths, Backend, Gate, LayerAttn};
use crate::model::lora::{LoraCols, LoraTarget};
use crate::model::tp::TpRank;
use crate::model::{Dims, Model};
use gpu_kernels::{launch as geom, KernelArg, LaunchConfig};

mod attention;
pub mod batch;
use attention::{attention, AttnArgs};
pub use batch::{DeviceBatch, Padding};

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
    /// The activation slots, by [`Act::index`].
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

/// `out[r] = table[ids[r] - first]` for `rows` rows of `width`, where
/// `first <= ids[r] < first + table_rows`, else zeros (`table` holds the
/// rows `first..first + table_rows` of a larger matrix: a tensor-parallel
/// rank's vocabulary slice; `first` is 0 otherwise).
///
/// # Safety
/// As [`Device::launch`]; `table` holds `table_rows` rows of `width`,
/// `out` holds `rows` rows.
unsafe fn gather(
    dev: &mut dyn Device,
    k: &Kernels,
    (out, ids, table): (DevPtr, DevPtr, DevPtr),
    rows: usize,
    width: usize,
    (first, table_rows): (usize, usize),
) -> Result<(), GpuError> {
    let cfg = per_row(dev, rows);
    let args = [
        out.arg(),
        ids.arg(),
        table.arg(),
        u(width),
        u(first),
        u(table_rows),
    ];
    // SAFETY: forwarded to the caller; the kernel reads only rows below
    // `table_rows`.
    unsafe { dev.launch(k.embedding, cfg, &args) }
}

/// `out = rms_norm(input) * weight` over `rows` rows of `width`.
///
/// # Safety
/// As [`Device::launch`]; `out`/`input` hold `rows` rows, not aliased.
unsafe fn rms_norm_rows(
    dev: &mut dyn Device,
    k: &Kernels,
    (out, input, weight): (DevPtr, DevPtr, DevPtr),
    (rows, width, eps): (usize, usize, f32),
) -> Result<(), GpuError> {
    let cfg = per_row(dev, rows);
    let args = [
        out.arg(),
        input.arg(),
        weight.arg(),
        KernelArg::F32(eps),
        u(width),
    ];
    // SAFETY: forwarded to the caller.
    unsafe { dev.launch(k.rms_norm, cfg, &args) }
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
    let mut step = GpuStep {
        dev: &mut *dev,
        p,
        s: &mut *s,
        m,
        batch,
        widths: ActWidths::default(),
        acts: [DevPtr(0); 7],
        logits: None,
    };
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

/// The GPU's [`Backend`] for one step (see the module docs).
struct GpuStep<'a, 'p> {
    dev: &'a mut dyn Device,
    p: &'a Parts<'p>,
    s: &'a mut Scratch,
    m: &'a Meta,
    batch: &'a ForwardBatch,
    widths: ActWidths,
    acts: [DevPtr; 7],
    /// The logits buffer once [`Backend::logits`] ran.
    logits: Option<DevPtr>,
}

impl GpuStep<'_, '_> {
    fn n(&self) -> usize {
        self.batch.token_ids.len()
    }

    fn at(&self, a: Act) -> DevPtr {
        self.acts[a.index()]
    }

    /// Under tensor parallelism, `count` values of the step's type at `buf`
    /// summed over the ranks, in place: by the device's own collective
    /// (NCCL) where it has one, else through the host (download, the
    /// ranks' [`crate::dist::Collective`], upload: a wait per call, so
    /// such a step is never captured as a graph). Nothing without tensor
    /// parallelism.
    fn all_reduce(&mut self, buf: DevPtr, count: usize) -> Result<(), GpuError> {
        let Some(tp) = self.p.tp else {
            return Ok(());
        };
        let t = self.p.dtype;
        if self.dev.has_all_reduce() {
            return self.dev.all_reduce_sum(buf, count, t);
        }
        let mut bytes = vec![0u8; count * t.size()];
        self.dev.download(buf, &mut bytes)?;
        let mut values = t.decode(&bytes);
        tp.comm
            .all_reduce_sum(&mut values)
            .map_err(|e| GpuError::Collective(engine_core::Report(&e).to_string()))?;
        self.dev.upload(buf, &t.encode(&values))
    }

    /// # Safety
    /// As [`Device::gemm`]: `a` holds `m` rows of `k`, `w` is `[n, k]`,
    /// `c` holds `m` rows of `n`.
    unsafe fn gemm(
        &mut self,
        (m, n, k): (usize, usize, usize),
        (a, w, c): (DevPtr, DevPtr, DevPtr),
        accumulate: bool,
    ) -> Result<(), GpuError> {
        let t = self.p.dtype;
        let g = Gemm {
            m,
            n,
            k,
            a,
            b: w,
            c,
            ab: t,
            c_type: t,
            accumulate,
        };
        // SAFETY: forwarded to the caller.
        unsafe { self.dev.gemm(&g) }
    }
}

impl Backend for GpuStep<'_, '_> {
    type Format = Gpu;
    type Error = GpuError;

    fn begin(&mut self, widths: &ActWidths) -> Result<(), GpuError> {
        let e = self.p.dtype.size() * self.n();
        for a in Act::ALL {
            let bytes = e * widths.of(a);
            self.acts[a.index()] = ensure(self.dev, &mut self.s.acts[a.index()], bytes)?;
        }
        self.widths = *widths;
        Ok(())
    }

    fn embed(&mut self, out: Act, table: &GpuMatrix, scale: Option<f32>) -> Result<(), GpuError> {
        let (n, h, o) = (self.n(), self.p.dims.hidden, self.at(out));
        // Under tensor parallelism the table holds this rank's vocabulary
        // rows: other ids give zero rows, and the sum over ranks below
        // fills every row exactly once.
        let first = self.p.tp.map_or(0, |tp| tp.shard().vocab.start);
        // SAFETY: the slot holds `n` rows of `hidden` (`begin`); the table
        // holds `table.rows` rows, the kernel reads no other.
        unsafe {
            gather(
                self.dev,
                self.p.kernels,
                (o, self.m.ids, table.buf.ptr),
                n,
                h,
                (first, table.rows),
            )
        }?;
        if let Some(s) = scale {
            let k = needed(self.p.kernels.scale_rows, "scaled embedding")?;
            let cfg = per_row(self.dev, n);
            // SAFETY: the slot holds `n` rows of `hidden`; one block per row.
            unsafe { self.dev.launch(k, cfg, &[o.arg(), KernelArg::F32(s), u(h)]) }?;
        }
        self.all_reduce(o, n * h)
    }

    fn rms_norm(&mut self, out: Act, x: Act, w: &DevBuf, eps: f32) -> Result<(), GpuError> {
        let (n, width) = (self.n(), self.widths.of(x));
        let ptrs = (self.at(out), self.at(x), w.ptr);
        // SAFETY: both slots hold `n` rows of `width` (same width: the model
        // norms the residual stream into a hidden-wide slot), distinct slots.
        unsafe { rms_norm_rows(self.dev, self.p.kernels, ptrs, (n, width, eps)) }
    }

    fn linear(
        &mut self,
        out: Act,
        x: Act,
        w: &GpuMatrix,
        accumulate: bool,
    ) -> Result<(), GpuError> {
        let n = self.n();
        let (o, i) = (self.at(out), self.at(x));
        if let Some(b) = &w.bias {
            if accumulate {
                return Err(GpuError::Unsupported(
                    "an accumulated linear layer with a bias".into(),
                ));
            }
            // The bias row is broadcast into every row of `out` by a gather
            // with every row id 0 (the zeros buffer is zeroed at allocation
            // and never written); the GEMM then accumulates onto it.
            let zeros = ensure(self.dev, &mut self.s.zeros, 4 * n)?;
            // SAFETY: `out` holds `n` rows of `rows`; row id 0 is inside the
            // one-row bias.
            unsafe {
                gather(
                    self.dev,
                    self.p.kernels,
                    (o, zeros, b.ptr),
                    n,
                    w.rows,
                    (0, 1),
                )
            }?;
        }
        // SAFETY: the slots hold `n` rows of their widths, which the model
        // sized from the same dimensions as `w` (`[rows, cols]`).
        unsafe {
            self.gemm(
                (n, w.rows, w.cols),
                (i, w.buf.ptr, o),
                accumulate || w.bias.is_some(),
            )
        }
    }

    fn linear_row_parallel(
        &mut self,
        out: Act,
        x: Act,
        w: &GpuMatrix,
        accumulate: bool,
        (layer, target): (usize, LoraTarget),
    ) -> Result<(), GpuError> {
        // Rank 0 adds into `out`, the others overwrite it with their
        // partial product: the sum is `out + sum of partials`. An
        // adapter's delta is linear in `x` too: each rank adds its slice's
        // (`x_r A_r^T B^T`, its A cut as `w` is) before the sum.
        let rank0 = self.p.tp.is_none_or(|tp| tp.comm.rank() == 0);
        self.linear(out, x, w, accumulate && rank0)?;
        self.lora(out, x, layer, &[LoraCols { target, offset: 0 }])?;
        self.all_reduce(self.at(out), self.n() * w.rows)
    }

    fn lora(&mut self, out: Act, x: Act, layer: usize, cols: &[LoraCols]) -> Result<(), GpuError> {
        let Some(run) = self.p.lora else {
            return Ok(());
        };
        let x = (self.at(x), self.widths.of(x));
        let y = (self.at(out), self.widths.of(out));
        // SAFETY: both are activation slots of the step's `n` rows of their
        // widths (`begin`), distinct (a linear layer's input and output).
        unsafe { run.apply(self.dev, layer, cols, x, y) }
    }

    fn head_norms(&mut self, qkv: Act, q: &DevBuf, k: &DevBuf, eps: f32) -> Result<(), GpuError> {
        let kernel = needed(self.p.kernels.rms_norm_heads, "per-head q/k norms")?;
        let d = self.p.dims;
        let threads = self.dev.threads(ThreadsFor::Rows);
        let cfg = geom::per_head(self.n() as u32, (d.heads + d.kv_heads) as u32, threads);
        let args = [
            self.at(qkv).arg(),
            q.ptr.arg(),
            k.ptr.arg(),
            KernelArg::F32(eps),
            u(d.head_dim),
            u(d.heads),
            u(d.kv_heads),
            u(d.qkv_dim()),
        ];
        // SAFETY: the slot holds `n` rows of `q + 2 kv`; the q heads then the
        // k heads of a row are its first `(heads + kv_heads) * head_dim`
        // values; each block norms one head in place.
        unsafe { self.dev.launch(kernel, cfg, &args) }
    }

    fn attention(
        &mut self,
        out: Act,
        qkv: Act,
        a: &LayerAttn<'_, GpuRope>,
    ) -> Result<(), GpuError> {
        let (n, d, sz) = (self.n(), self.p.dims, self.p.dtype.size());
        let (qd, kvd, stride) = (d.q_dim(), d.kv_dim(), d.qkv_dim());
        let kv = self.p.kv;
        let (kc, vc) = (kv.layer_ptr(a.layer, 0), kv.layer_ptr(a.layer, 1));
        let q = ensure(self.dev, &mut self.s.q, n * qd * sz)?;
        let x = self.at(qkv);
        let args = [
            self.m.positions.arg(),
            x.arg(),
            q.arg(),
            x.offset(qd * sz).arg(),
            x.offset((qd + kvd) * sz).arg(),
            kc.arg(),
            vc.arg(),
            self.m.slots.arg(),
            a.rope.cos_sin.ptr.arg(),
            u(d.heads),
            u(d.kv_heads),
            u(d.head_dim),
            u(d.head_dim),
            u(stride),
            u(stride),
            u(stride),
        ];
        let cfg = per_row(self.dev, n);
        // SAFETY: q, k and v are disjoint column ranges of the `Qkv` slot at
        // stride `q + 2 kv`; the rotated q goes to its own `n x q` buffer; the
        // batch was validated (positions inside the rotary table, slots
        // distinct and inside the pool), so every access the kernel's
        // `# Safety` describes is in bounds.
        unsafe { self.dev.launch(self.p.kernels.rotary_cache, cfg, &args) }?;
        let args = AttnArgs {
            q,
            out: self.at(out),
            kc,
            vc,
            scale: a.scale,
            window: a.window,
        };
        let bs = kv.geometry().block_size;
        // SAFETY: `q`/`out` hold the batch's tokens, `kc`/`vc` the layer's
        // caches; the batch and its block tables were validated.
        unsafe {
            attention(
                self.dev,
                self.p.kernels,
                self.s,
                &d,
                self.m,
                self.batch,
                bs,
                &args,
            )
        }
    }

    fn gated(&mut self, out: Act, gate_up: Act, gate: Gate) -> Result<(), GpuError> {
        let kernel = match gate {
            Gate::Silu => self.p.kernels.silu_and_mul,
            Gate::GeluTanh => needed(self.p.kernels.gelu_tanh_and_mul, "GELU-tanh")?,
        };
        let cfg = per_row(self.dev, self.n());
        let args = [
            self.at(out).arg(),
            self.at(gate_up).arg(),
            u(self.widths.of(out)),
        ];
        // SAFETY: `gate_up` holds `n` rows of twice `out`'s width.
        unsafe { self.dev.launch(kernel, cfg, &args) }
    }

    fn add_rms_norm(&mut self, x: Act, branch: Act, w: &DevBuf, eps: f32) -> Result<(), GpuError> {
        let kernel = needed(self.p.kernels.add_rms_norm, "post-norms")?;
        let cfg = per_row(self.dev, self.n());
        let args = [
            self.at(x).arg(),
            self.at(branch).arg(),
            w.ptr.arg(),
            KernelArg::F32(eps),
            u(self.widths.of(x)),
        ];
        // SAFETY: both slots hold `n` rows of `hidden`, distinct slots.
        unsafe { self.dev.launch(kernel, cfg, &args) }
    }

    fn logits(
        &mut self,
        x: Act,
        final_norm: &DevBuf,
        head: &GpuMatrix,
        eps: f32,
    ) -> Result<(), GpuError> {
        let r = self.batch.logits_rows.len();
        if r == 0 {
            return Ok(());
        }
        // `head.rows`: the whole vocabulary, or this rank's slice of it.
        let (h, vocab, sz) = (self.p.dims.hidden, head.rows, self.p.dtype.size());
        let rows = ensure(self.dev, &mut self.s.rows, r * h * sz)?;
        let normed = ensure(self.dev, &mut self.s.normed, r * h * sz)?;
        let logits = ensure(self.dev, &mut self.s.logits, r * vocab * 4)?;
        let g = Gemm {
            m: r,
            n: vocab,
            k: h,
            a: normed,
            b: head.buf.ptr,
            c: logits,
            ab: self.p.dtype,
            c_type: DType::F32,
            accumulate: false,
        };
        let (k, x, n) = (self.p.kernels, self.at(x), self.n());
        // SAFETY: `rows`/`normed` hold `r` rows of `hidden`, `logits` `r` rows
        // of `vocab` f32; the validated logits rows are `< n`, inside `x`;
        // the head is `[vocab, hidden]`. Gathering rows of the residual
        // stream is an embedding lookup with `x` as the table.
        unsafe {
            gather(self.dev, k, (rows, self.m.rows, x), r, h, (0, n))?;
            rms_norm_rows(self.dev, k, (normed, rows, final_norm.ptr), (r, h, eps))?;
            self.dev.gemm(&g)?;
        }
        self.logits = Some(logits);
        Ok(())
    }
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
