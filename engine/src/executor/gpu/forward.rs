//! One forward pass on a [`Device`], mirroring the CPU model
//! (`crate::model::llama`, which this module does not import) operation for
//! operation:
//!
//! ```text
//! x = embedding(ids)                                   (residual stream, dtype T)
//! per layer: h = rms_norm(x); qkv = h Wqkv^T                (one GEMM, [tokens, q + 2 kv])
//!            q = rotary(qkv.q); cache[slots] = rotary(qkv.k), qkv.v   (one launch)
//!            a = attention(q, paged K/V)    decode: paged_attention v1 / v2+reduce
//!                                           otherwise: prefill_attention (mixed batch)
//!            x += a Wo^T; h = rms_norm(x); g = h Wgate_up^T; s = silu_and_mul(g); x += s Wdown^T
//! rows = gather(x, logits_rows); logits (f32) = rms_norm(rows) Wlm^T
//! ```
//!
//! All per-step integers (ids, positions, slots, context lengths, query
//! starts, block tables, logits rows) live in the persistent [`DeviceBatch`]
//! (block tables updated from what changed, the rest in one upload);
//! activations live in a [`Scratch`] that grows to the
//! largest batch seen and is then reused. Kernels are resolved once into
//! [`Kernels`].
//!
//! The q/k/v projection is one GEMM over the fused `[q + 2 kv, hidden]`
//! weight into a `[tokens, q + 2 kv]` buffer (Qwen2's biases: the fused bias
//! row `[bq | bk | bv]` is broadcast into it by one gather first, and the GEMM
//! accumulates). One `rotary_embedding_and_cache` launch then reads q, k and v
//! out of that buffer at its row stride, writes rotated K and V into the
//! paged cache and rotated q into a separate contiguous `[tokens, heads,
//! head_dim]` buffer. Why a copy of q rather than rotating it in place: the
//! attention kernels (decode v1/v2, prefill) take no q row stride and read q
//! as `[tokens, heads, head_dim]`; writing q out costs the same bytes as the
//! in-place rotation (q is read and written once either way) and keeps the
//! attention kernels' signatures as they are.
//!
//! Invariants: the `qkv` buffer is written only by the bias gather and the
//! GEMM and read only by the fused rotary/cache launch; `q` is written only by
//! that launch (all `q_dim` columns, rotated or copied past `rot_dim`).
//!
//! Cost: launches per step (GEMMs included) 1 + 9 per layer with v1 decode
//! attention (10 with v2 + reduce) + 3, plus 1 per layer for q/k/v biases;
//! GEMMs 4 per layer + 1. Cost is dominated by the GEMMs,
//! O(tokens x parameters).

use super::blocks::KvPools;
use super::device::{DType, DevBuf, DevPtr, Device, Gemm, Kernel, ThreadsFor};
use super::weights::DeviceWeights;
use super::{GpuError, SUPPORTED_HEAD_DIMS};
use crate::executor::HostWeights;
use crate::executor::{ForwardBatch, GreedyRow, Logits, SeqSpan};
use crate::kv::BlockId;
use gpu_kernels::{launch as geom, KernelArg, LaunchConfig};

mod attention;
pub mod batch;
use attention::attention;
pub use batch::{DeviceBatch, Padding};

/// The model dimensions the forward pass needs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Dims {
    pub hidden: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub inter: usize,
    pub vocab: usize,
    pub layers: usize,
    pub eps: f32,
    pub max_positions: usize,
}

impl Dims {
    /// The dimensions of `w`, refusing head sizes without attention entry points.
    pub fn of(w: &HostWeights<'_>) -> Result<Self, GpuError> {
        let c = w.config;
        if !SUPPORTED_HEAD_DIMS.contains(&c.head_dim) {
            return Err(GpuError::Unsupported(format!(
                "head_dim {} (the attention kernels are built for {SUPPORTED_HEAD_DIMS:?})",
                c.head_dim
            )));
        }
        Ok(Self {
            hidden: c.hidden_size,
            heads: c.num_attention_heads,
            kv_heads: c.num_key_value_heads,
            head_dim: c.head_dim,
            inter: c.intermediate_size,
            vocab: c.vocab_size,
            layers: c.num_hidden_layers,
            eps: c.rms_norm_eps,
            max_positions: w.max_positions,
        })
    }

    fn q_dim(&self) -> usize {
        self.heads * self.head_dim
    }

    fn kv_dim(&self) -> usize {
        self.kv_heads * self.head_dim
    }

    /// Width of the fused q/k/v projection.
    fn qkv_dim(&self) -> usize {
        self.q_dim() + 2 * self.kv_dim()
    }
}

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
        })
    }
}

/// Device scratch buffers of the forward pass, each grown on demand.
#[derive(Default)]
pub struct Scratch {
    /// The step's integers (persistent block tables).
    pub batch: DeviceBatch,
    x: Option<DevBuf>,
    h: Option<DevBuf>,
    /// `[tokens, q + 2 kv]`: the fused projection's output.
    qkv: Option<DevBuf>,
    /// `[tokens, heads, head_dim]`: rotated q, contiguous for attention.
    q: Option<DevBuf>,
    attn: Option<DevBuf>,
    gate_up: Option<DevBuf>,
    act: Option<DevBuf>,
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
    /// Returns every buffer to the device.
    pub fn release(self, dev: &mut dyn Device) -> Result<(), GpuError> {
        self.batch.release(dev)?;
        let all = [
            self.x,
            self.h,
            self.qkv,
            self.q,
            self.attn,
            self.gate_up,
            self.act,
            self.rows,
            self.normed,
            self.logits,
            self.split_out,
            self.split_max,
            self.split_sum,
            self.zeros,
            self.greedy,
        ];
        all.into_iter().flatten().try_for_each(|b| dev.free(b))
    }

    /// Address and size of every device buffer, the batch's included: a
    /// captured graph is valid while this is what it was at capture.
    pub fn fingerprint(&self) -> [(u64, usize); 17] {
        let [step, table] = self.batch.buffers();
        let all = [
            step,
            table,
            self.x.as_ref(),
            self.h.as_ref(),
            self.qkv.as_ref(),
            self.q.as_ref(),
            self.attn.as_ref(),
            self.gate_up.as_ref(),
            self.act.as_ref(),
            self.rows.as_ref(),
            self.normed.as_ref(),
            self.logits.as_ref(),
            self.split_out.as_ref(),
            self.split_max.as_ref(),
            self.split_sum.as_ref(),
            self.zeros.as_ref(),
            self.greedy.as_ref(),
        ];
        all.map(|b| b.map_or((0, 0), |b| (b.ptr.0, b.bytes)))
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

/// The activation buffers of one step (addresses).
struct Acts {
    x: DevPtr,
    h: DevPtr,
    qkv: DevPtr,
    q: DevPtr,
    attn: DevPtr,
    gate_up: DevPtr,
    act: DevPtr,
}

fn activations(
    dev: &mut dyn Device,
    s: &mut Scratch,
    d: Dims,
    n: usize,
    t: DType,
) -> Result<Acts, GpuError> {
    let e = t.size() * n;
    Ok(Acts {
        x: ensure(dev, &mut s.x, e * d.hidden)?,
        h: ensure(dev, &mut s.h, e * d.hidden)?,
        qkv: ensure(dev, &mut s.qkv, e * d.qkv_dim())?,
        q: ensure(dev, &mut s.q, e * d.q_dim())?,
        attn: ensure(dev, &mut s.attn, e * d.q_dim())?,
        gate_up: ensure(dev, &mut s.gate_up, e * 2 * d.inter)?,
        act: ensure(dev, &mut s.act, e * d.inter)?,
    })
}

/// Launch helper over the resolved [`Kernels`].
struct Launcher<'a> {
    dev: &'a mut dyn Device,
    t: DType,
    k: &'a Kernels,
}

/// A `u32` kernel argument.
fn u(x: usize) -> KernelArg {
    KernelArg::U32(x as u32)
}

impl Launcher<'_> {
    /// # Safety
    /// As [`Device::launch`].
    unsafe fn run(
        &mut self,
        kernel: Kernel,
        cfg: LaunchConfig,
        args: &[KernelArg],
    ) -> Result<(), GpuError> {
        // SAFETY: forwarded to the caller.
        unsafe { self.dev.launch(kernel, cfg, args) }
    }

    /// `c = a W^T` (`+=` with `accumulate`); `a` is `[m, k]`, `W` `[n, k]`.
    ///
    /// # Safety
    /// As [`Device::gemm`].
    unsafe fn gemm(
        &mut self,
        (m, n, k): (usize, usize, usize),
        a: DevPtr,
        w: DevPtr,
        c: DevPtr,
        accumulate: bool,
    ) -> Result<(), GpuError> {
        let (ab, c_type, b) = (self.t, self.t, w);
        let g = Gemm {
            m,
            n,
            k,
            a,
            b,
            c,
            ab,
            c_type,
            accumulate,
        };
        // SAFETY: forwarded to the caller.
        unsafe { self.dev.gemm(&g) }
    }

    fn rows(&self, rows: usize) -> LaunchConfig {
        geom::per_row(rows as u32, self.dev.threads(ThreadsFor::Rows))
    }

    /// `out[r] = table[ids[r]]` for `rows` rows of `hidden`.
    ///
    /// # Safety
    /// As [`Device::launch`]; every id is below the table's row count.
    unsafe fn gather(
        &mut self,
        out: DevPtr,
        ids: DevPtr,
        table: DevPtr,
        rows: usize,
        hidden: usize,
    ) -> Result<(), GpuError> {
        let cfg = self.rows(rows);
        // SAFETY: forwarded to the caller.
        unsafe {
            self.run(
                self.k.embedding,
                cfg,
                &[out.arg(), ids.arg(), table.arg(), u(hidden)],
            )
        }
    }

    /// `out = rms_norm(input) * weight` over `rows` rows of `d.hidden`.
    ///
    /// # Safety
    /// As [`Device::launch`].
    unsafe fn rms_norm(
        &mut self,
        d: &Dims,
        out: DevPtr,
        input: DevPtr,
        weight: DevPtr,
        rows: usize,
    ) -> Result<(), GpuError> {
        let cfg = self.rows(rows);
        let args = [
            out.arg(),
            input.arg(),
            weight.arg(),
            KernelArg::F32(d.eps),
            u(d.hidden),
        ];
        // SAFETY: forwarded to the caller.
        unsafe { self.run(self.k.rms_norm, cfg, &args) }
    }
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
#[allow(clippy::too_many_arguments)]
pub fn run(
    dev: &mut dyn Device,
    k: &Kernels,
    d: Dims,
    t: DType,
    w: &DeviceWeights,
    kv: &KvPools,
    s: &mut Scratch,
    batch: &ForwardBatch,
) -> Result<Logits, GpuError> {
    match run_to(dev, k, d, t, w, kv, s, batch, Output::Logits)? {
        StepOut::Logits(l) => Ok(l),
        StepOut::Greedy(_) | StepOut::Device(_) => Err(GpuError::Device(
            "greedy rows where logits were asked".into(),
        )),
    }
}

/// Runs the forward pass of a validated `batch` and returns `out`.
#[allow(clippy::too_many_arguments)]
pub fn run_to(
    dev: &mut dyn Device,
    k: &Kernels,
    d: Dims,
    t: DType,
    w: &DeviceWeights,
    kv: &KvPools,
    s: &mut Scratch,
    batch: &ForwardBatch,
    out: Output,
) -> Result<StepOut, GpuError> {
    let geometry = (kv.geometry().block_size, d.max_positions);
    let m = s.batch.upload(dev, batch, geometry, None)?;
    compute(dev, k, d, t, w, kv, s, batch, &m, out)?;
    finish(dev, s, d, batch.logits_rows.len(), out)
}

/// Every launch and GEMM of the step whose integers are at `m` (`batch`
/// gives the counts: tokens, sequences, logits rows), up to the logits (and
/// the greedy reduction with [`Output::Greedy`]). No upload, download or
/// synchronization: this is what a graph captures. Allocates only where a
/// scratch buffer is too small for these counts.
#[allow(clippy::too_many_arguments)]
pub fn compute(
    dev: &mut dyn Device,
    k: &Kernels,
    d: Dims,
    t: DType,
    w: &DeviceWeights,
    kv: &KvPools,
    s: &mut Scratch,
    batch: &ForwardBatch,
    m: &Meta,
    out: Output,
) -> Result<(), GpuError> {
    let n = batch.token_ids.len();
    let a = activations(dev, s, d, n, t)?;
    let mut l = Launcher { dev, t, k };
    // SAFETY: buffers were sized above for `n` tokens (`activations`,
    // the batch upload) and the batch was validated (ids < vocab), so the
    // gather stays inside the embedding table and `x`.
    unsafe { l.gather(a.x, m.ids, w.embedding.ptr, n, d.hidden) }?;
    for li in 0..w.layers.len() {
        layer(&mut l, s, &d, w, kv, li, m, &a, batch)?;
    }
    let r = batch.logits_rows.len();
    if r == 0 {
        return Ok(());
    }
    let sz = t.size();
    let rows = ensure(l.dev, &mut s.rows, r * d.hidden * sz)?;
    let normed = ensure(l.dev, &mut s.normed, r * d.hidden * sz)?;
    let logits = ensure(l.dev, &mut s.logits, r * d.vocab * 4)?;
    let g = Gemm {
        m: r,
        n: d.vocab,
        k: d.hidden,
        a: normed,
        b: w.lm_head_ptr(),
        c: logits,
        ab: t,
        c_type: DType::F32,
        accumulate: false,
    };
    // SAFETY: `rows`/`normed` hold `r` rows of `hidden`, `logits` `r` rows of
    // `vocab` f32; the validated logits rows are `< n`, inside `x`; the LM
    // head is `[vocab, hidden]`. Gathering rows of the residual stream is an
    // embedding lookup with `x` as the table.
    unsafe {
        l.gather(rows, m.rows, a.x, r, d.hidden)?;
        l.rms_norm(&d, normed, rows, w.final_norm.ptr, r)?;
        l.dev.gemm(&g)?;
    }
    if out == Output::Greedy {
        let buf = ensure(l.dev, &mut s.greedy, r * 12)?;
        let cfg = geom::per_row(r as u32, l.dev.threads(ThreadsFor::Rows));
        let args = [buf.arg(), logits.arg(), u(d.vocab)];
        // SAFETY: `logits` holds `r` rows of `vocab` f32 (written by the
        // LM-head GEMM above); `buf` holds `r * 3` f32; one block per row.
        unsafe { l.dev.launch(k.greedy_rows, cfg, &args) }?;
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
    d: Dims,
    r: usize,
    out: Output,
) -> Result<StepOut, GpuError> {
    let missing = || GpuError::Device("no output buffer for the step's rows".into());
    match out {
        _ if r == 0 => Ok(match out {
            Output::Logits | Output::Device => StepOut::Logits(Logits {
                rows: 0,
                vocab: d.vocab,
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
            let mut data = vec![0f32; r * d.vocab];
            dev.download(logits, f32_bytes(&mut data))?;
            if cfg!(target_endian = "big") {
                data.iter_mut()
                    .for_each(|v| *v = f32::from_bits(u32::from_le(v.to_bits())));
            }
            Ok(StepOut::Logits(Logits {
                rows: r,
                vocab: d.vocab,
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

/// Decoder layer `li` over the batch, in place on the residual stream `a.x`.
#[allow(clippy::too_many_arguments)]
fn layer(
    l: &mut Launcher<'_>,
    s: &mut Scratch,
    d: &Dims,
    w: &DeviceWeights,
    kv: &KvPools,
    li: usize,
    m: &Meta,
    a: &Acts,
    batch: &ForwardBatch,
) -> Result<(), GpuError> {
    let n = batch.token_ids.len();
    let (h, hd, qd, kvd, sz) = (d.hidden, d.head_dim, d.q_dim(), d.kv_dim(), l.t.size());
    let qkvd = d.qkv_dim();
    let lw = &w.layers[li];
    let (kc, vc) = (kv.layer_ptr(li, 0), kv.layer_ptr(li, 1));
    // Qwen2's q/k/v biases: the fused bias row `[bq | bk | bv]` is broadcast
    // into every row of `qkv` (a gather with every row id 0; the buffer is
    // zeroed at allocation and never written), then the GEMM accumulates.
    let bias = match &lw.qkv_bias {
        Some(b) => Some((b.ptr, ensure(l.dev, &mut s.zeros, 4 * n)?)),
        None => None,
    };
    let rows = l.rows(n);
    let rotary_cache = [
        m.positions.arg(),
        a.qkv.arg(),
        a.q.arg(),
        a.qkv.offset(qd * sz).arg(),
        a.qkv.offset((qd + kvd) * sz).arg(),
        kc.arg(),
        vc.arg(),
        m.slots.arg(),
        w.cos_sin.ptr.arg(),
        u(d.heads),
        u(d.kv_heads),
        u(hd),
        u(hd),
        u(qkvd),
        u(qkvd),
        u(qkvd),
    ];
    // SAFETY: every activation buffer holds `n` rows of its width
    // (`activations`); the weights are `[out, in]` matrices of the model's
    // dimensions (`qkv` is `[q + 2 kv, hidden]`, its bias `[q + 2 kv]`); q, k
    // and v are disjoint column ranges of `qkv` at stride `q + 2 kv`, and the
    // rotated q goes to the separate `q` buffer; the batch was validated
    // (positions inside the rotary table, slots distinct and inside the pool,
    // block ids inside the pool, spans consistent), so every access the
    // kernels' `# Safety` sections describe is in bounds.
    unsafe {
        l.rms_norm(d, a.h, a.x, lw.attn_norm.ptr, n)?;
        if let Some((b, zeros)) = bias {
            l.gather(a.qkv, zeros, b, n, qkvd)?;
        }
        l.gemm((n, qkvd, h), a.h, lw.qkv.ptr, a.qkv, bias.is_some())?;
        l.run(l.k.rotary_cache, rows, &rotary_cache)?;
        attention(
            l,
            s,
            d,
            m,
            batch,
            kv.geometry().block_size,
            a.q,
            a.attn,
            kc,
            vc,
        )?;
        l.gemm((n, h, qd), a.attn, lw.o.ptr, a.x, true)?;
        l.rms_norm(d, a.h, a.x, lw.ffn_norm.ptr, n)?;
        l.gemm((n, 2 * d.inter, h), a.h, lw.gate_up.ptr, a.gate_up, false)?;
        l.run(
            l.k.silu_and_mul,
            rows,
            &[a.act.arg(), a.gate_up.arg(), u(d.inter)],
        )?;
        l.gemm((n, h, d.inter), a.act, lw.down.ptr, a.x, true)
    }
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
