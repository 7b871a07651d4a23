//! The CPU's side of the model seam: [`Cpu`], its weight formats (a
//! [`Linear`] keeps quantized blocks or f32 rows, vectors stay f32, rotary
//! tables are computed once), [`CpuSink`] and [`CpuStep`], the
//! [`Backend`] of one forward pass over the paged [`KvCache`]. [`CpuModel`]
//! is a model of any architecture with CPU weights, and its `forward` the
//! CPU executor's whole step.
//!
//! Invariants: a step's batch is validated (`batch::validate`) before any
//! operation runs, so operations index without further checks; activation
//! slots are allocated once per step (`begin`) and reused by every layer.
//!
//! Cost: per operation as its kernel (`linear`, `attention`, `ops`); the
//! seam adds nothing per element.

use super::arch::{Dims, InMemory, Model};
use super::attention::{paged_attention, plan, AttnParams, AttnTask};
use super::backend::{Act, ActWidths, Backend, Format, Gate, LayerAttn, WeightSink};
use super::batch::validate;
use super::kv_cache::{KvCache, KvGeometry};
use super::linear::{Linear, LinearWeight};
use super::lora::kernel::{apply, Prepared, RowGroups};
use super::lora::{LoraCols, LoraTarget};
use super::ops::{embed, gelu_tanh_mul, rms_norm, rms_norm_in_place, silu_mul, RopeTables};
use super::par;
use super::quant::{ActPrecision, Isa, QMatrix};
use super::tp::TpRank;
use super::ModelError;
use engine_core::{ExecError, ForwardBatch, Logits};
use model_loader::{ModelConfig, ModelWeights, Weight};
use std::sync::Arc;

/// The CPU's weight formats.
#[derive(Debug, Clone, Copy)]
pub struct Cpu;

impl Format for Cpu {
    type Matrix = Linear;
    type Vector = Vec<f32>;
    type Rope = RopeTables;
}

/// A model with its weights on the CPU.
pub type CpuModel = Model<Cpu>;

/// Takes weights as they come: block-quantized matrices stay quantized,
/// f32 stays f32, fused parts are merged where their types agree.
#[derive(Debug, Default)]
pub struct CpuSink;

impl WeightSink for CpuSink {
    type Format = Cpu;
    type Error = ModelError;

    fn matrix(
        &mut self,
        _name: &str,
        parts: Vec<Weight>,
        in_features: usize,
        bias: Option<Vec<f32>>,
    ) -> Result<Linear, ModelError> {
        let parts = parts
            .into_iter()
            .map(|w| match w {
                Weight::F32(t) => LinearWeight::F32(t.data),
                Weight::Quantized(q) => LinearWeight::Quant(QMatrix::from_tensor(q)),
            })
            .collect();
        Ok(Linear::stacked(parts, in_features, bias))
    }

    fn vector(&mut self, _name: &str, values: Vec<f32>) -> Result<Vec<f32>, ModelError> {
        Ok(values)
    }

    fn rope(&mut self, table: RopeTables) -> Result<RopeTables, ModelError> {
        Ok(table)
    }
}

impl CpuModel {
    /// Checks shapes and converts the weights (fusing q/k/v and gate/up).
    /// Matrices given as [`Weight::Quantized`] stay quantized.
    pub fn new<W: Into<Weight>>(
        config: ModelConfig,
        weights: ModelWeights<W>,
    ) -> Result<Self, ModelError> {
        let model = Self::load(config, &mut InMemory::from(weights), &mut CpuSink)?;
        // The loader's per-tensor copies and the unfused parts freed above
        // stay in the allocator's free lists (about 58 MiB for SmolLM2
        // Q4_1: resident memory 163 MiB for 92 MiB of weights); hand them
        // back to the OS.
        release_free_heap();
        keep_freed_scratch();
        Ok(model)
    }

    /// True when some matrix is kept block-quantized.
    pub fn is_quantized(&self) -> bool {
        self.matrices().into_iter().any(Linear::is_quantized)
    }

    /// How every quantized layer quantizes its activations (default
    /// [`ActPrecision::Two8`]; `One8` is llama.cpp's scheme, for comparison).
    pub fn set_act_precision(&mut self, p: ActPrecision) {
        self.matrices_mut().into_iter().for_each(|m| m.act = p);
    }

    /// Batch-invariant kernels for every layer (default off): a row's
    /// logits are then the same bits whatever else shares its batch or
    /// span. Quantized weights: the tile kernels repeat the direct
    /// kernels' offset arithmetic and AVX2's lane kernel is not used; f32
    /// weights go through [`super::linear::matmul_wt_rows`] instead of
    /// `gemm` (see [`Linear::invariant`]).
    pub fn set_batch_invariant(&mut self, on: bool) {
        self.matrices_mut()
            .into_iter()
            .for_each(|m| m.invariant = on);
    }

    /// The quantized kernels' family for every layer (default
    /// [`Isa::best`]; a family the CPU lacks falls back inside the
    /// kernels), which also decides whether attention may use its 512-bit
    /// loops. For side-by-side measurements of two ISAs in one process.
    pub fn set_isa(&mut self, isa: Isa) {
        self.matrices_mut().into_iter().for_each(|m| m.isa = isa);
    }

    /// Whether attention may run its 512-bit loops: the layers' kernel
    /// family is AVX-512 ([`Self::set_isa`]).
    fn wide_attention(&self) -> bool {
        self.matrices()
            .first()
            .is_none_or(|m| m.isa == Isa::Avx512Vnni)
    }

    /// Bytes held by the weight matrices (quantized ones at their size).
    pub fn matrix_bytes(&self) -> usize {
        self.matrices().into_iter().map(Linear::nbytes).sum()
    }

    /// The KV pool geometry this model needs for `num_blocks` blocks of `block_size`.
    pub fn kv_geometry(&self, num_blocks: usize, block_size: usize) -> KvGeometry {
        super::kv_geometry(self.config(), num_blocks, block_size)
    }

    /// Runs one forward pass: writes this step's K/V into `cache` and returns
    /// the logits of `batch.logits_rows`, in that order.
    pub fn forward(&self, batch: &ForwardBatch, cache: &mut KvCache) -> Result<Logits, ExecError> {
        self.forward_lora(batch, cache, None)
    }

    /// [`Self::forward`] with LoRA adapters: `lora` holds each slot's
    /// prepared adapter and the step's rows per slot.
    pub fn forward_lora(
        &self,
        batch: &ForwardBatch,
        cache: &mut KvCache,
        lora: Option<CpuLora<'_>>,
    ) -> Result<Logits, ExecError> {
        self.forward_with(batch, cache, lora, None)
    }

    /// [`Self::forward_lora`] on one tensor-parallel rank (`tp`: this
    /// model is the rank's shard; see [`super::tp`]). Rank 0 gets the
    /// whole vocabulary's logits; the other ranks get none (`rows: 0`).
    pub fn forward_with(
        &self,
        batch: &ForwardBatch,
        cache: &mut KvCache,
        lora: Option<CpuLora<'_>>,
        tp: Option<&TpRank>,
    ) -> Result<Logits, ExecError> {
        let d = self.dims();
        let geom = cache.geometry();
        if geom.num_layers != d.layers
            || geom.num_kv_heads != d.kv_heads
            || geom.head_dim != d.head_dim
            || geom.block_size == 0
        {
            return Err(ExecError::InvalidBatch(format!(
                "KV cache geometry {geom:?} does not fit the model"
            )));
        }
        let max_positions = self.config().max_position_embeddings;
        validate(batch, &geom, d.vocab, max_positions)?;
        if batch.token_ids.is_empty() {
            // A step with block operations only (validation above guarantees no rows).
            return Ok(Logits {
                rows: 0,
                vocab: d.vocab,
                data: Vec::new(),
            });
        }
        let mut step = CpuStep::new(batch, cache, d);
        step.wide_attention = self.wide_attention();
        step.lora = lora;
        step.tp = tp;
        self.run(&mut step)?;
        step.logits
            .take()
            .ok_or_else(|| ExecError::WrongAnswer("the model computed no logits".into()))
    }
}

/// Returns the heap's free pages to the OS (glibc's `malloc_trim`; a no-op
/// elsewhere). Cost: one pass over the allocator's free lists.
fn release_free_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        extern "C" {
            fn malloc_trim(pad: usize) -> std::ffi::c_int;
        }
        // SAFETY: glibc's malloc_trim takes no pointers and only releases
        // pages of free chunks (thread-safe: it locks each arena).
        unsafe {
            malloc_trim(0);
        }
    }
}

/// Lets glibc keep freed chunks for reuse instead of handing them back to
/// the OS on `free`. A forward pass allocates and frees its scratch every
/// step (activations, packed rows, logits: a few MB at batch 32 for
/// SmolLM2); glibc's adaptive thresholds still unmapped or trimmed part
/// of it, and every step took the pages back through page faults:
/// `perf stat -e page-faults` over `--profile decode32` (SmolLM2 Q4_K_M)
/// 1040-1215 faults per forward by default, 516-537 with both thresholds
/// set (either alone: 3400-3600, since setting one freezes the other at
/// its 128 KiB default); `clear_page_erms` ~4% of the step before. What is
/// kept is bounded by a step's scratch (chunks past [`SCRATCH_KEEP`] are
/// still mapped and unmapped); [`release_free_heap`] still returns it all.
fn keep_freed_scratch() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        extern "C" {
            fn mallopt(param: std::ffi::c_int, value: std::ffi::c_int) -> std::ffi::c_int;
        }
        // glibc's <malloc.h>.
        const M_TRIM_THRESHOLD: std::ffi::c_int = -1;
        const M_MMAP_THRESHOLD: std::ffi::c_int = -3;
        // SAFETY: mallopt takes no pointers; it sets allocator parameters
        // under the allocator's lock.
        unsafe {
            mallopt(M_MMAP_THRESHOLD, SCRATCH_KEEP);
            mallopt(M_TRIM_THRESHOLD, 4 * SCRATCH_KEEP);
        }
    }
}

/// Largest chunk the allocator serves from its heaps (glibc's ceiling for
/// the mmap threshold on 64-bit, 32 MiB).
const SCRATCH_KEEP: std::ffi::c_int = 32 << 20;

/// One forward pass on the CPU: the batch, the pool it writes, and the
/// step's activation slots.
pub struct CpuStep<'a> {
    batch: &'a ForwardBatch,
    cache: &'a mut KvCache,
    dims: Dims,
    /// Attention work units, planned once for every layer.
    tasks: Vec<AttnTask>,
    bufs: [Vec<f32>; 7],
    /// Scratch of [`Backend::add_rms_norm`].
    tmp: Vec<f32>,
    logits: Option<Logits>,
    /// The step's adapters (none: base model only).
    lora: Option<CpuLora<'a>>,
    /// This rank's collectives and shard under tensor parallelism.
    tp: Option<&'a TpRank>,
    /// [`AttnParams::wide`] for every layer.
    wide_attention: bool,
}

/// A step's adapters on the CPU: each slot's prepared weights and the rows
/// per slot.
#[derive(Debug, Clone, Copy)]
pub struct CpuLora<'a> {
    pub prepared: &'a [Option<Arc<Prepared>>],
    pub groups: &'a RowGroups,
}

impl<'a> CpuStep<'a> {
    /// A step over a validated `batch`.
    pub fn new(batch: &'a ForwardBatch, cache: &'a mut KvCache, dims: Dims) -> Self {
        Self {
            tasks: plan(&batch.seqs, dims.heads, dims.kv_heads),
            batch,
            cache,
            dims,
            bufs: Default::default(),
            tmp: Vec::new(),
            logits: None,
            lora: None,
            tp: None,
            wide_attention: true,
        }
    }

    fn rows(&self) -> usize {
        self.batch.token_ids.len()
    }
}

/// Row `r` of a (possibly stacked) table into `out`; nothing when the
/// table has no row `r`.
fn table_row(parts: &[LinearWeight], mut r: usize, h: usize, out: &mut [f32]) {
    for p in parts {
        let rows = p.rows(h);
        if r < rows {
            match p {
                LinearWeight::F32(t) => out.copy_from_slice(&t[r * h..(r + 1) * h]),
                LinearWeight::Quant(q) => q.dequantize_row(r, out),
            }
            return;
        }
        r -= rows;
    }
}

/// Slot `out` mutably and slot `x` shared (distinct slots).
fn io(bufs: &mut [Vec<f32>; 7], out: Act, x: Act) -> Result<(&mut [f32], &[f32]), ExecError> {
    let (o, i) = (out.index(), x.index());
    if o == i {
        return Err(ExecError::InvalidConfig(format!(
            "the model reads and writes slot {out:?} in one operation"
        )));
    }
    Ok(if o < i {
        let (a, b) = bufs.split_at_mut(i);
        (&mut a[o][..], &b[0][..])
    } else {
        let (a, b) = bufs.split_at_mut(o);
        (&mut b[0][..], &a[i][..])
    })
}

impl Backend for CpuStep<'_> {
    type Format = Cpu;
    type Error = ExecError;

    fn begin(&mut self, widths: &ActWidths) -> Result<(), ExecError> {
        let n = self.rows();
        for slot in Act::ALL {
            self.bufs[slot.index()] = vec![0.0; n * widths.of(slot)];
        }
        Ok(())
    }

    fn embed(&mut self, out: Act, table: &Linear, scale: Option<f32>) -> Result<(), ExecError> {
        let h = self.dims.hidden;
        let ids = &self.batch.token_ids;
        let out = &mut self.bufs[out.index()];
        match (table.parts.as_slice(), self.tp) {
            ([LinearWeight::F32(t)], None) => embed(t, h, ids, out),
            (parts, tp) => {
                // Under tensor parallelism the table holds the rank's
                // vocabulary rows: other ids stay zero, and the sum over
                // ranks below fills every row exactly once.
                let first = tp.map_or(0, |tp| tp.shard().vocab.start);
                for (o, &id) in out.chunks_exact_mut(h).zip(ids) {
                    if let Some(r) = (id as usize).checked_sub(first) {
                        table_row(parts, r, h, o);
                    }
                }
            }
        }
        if let Some(s) = scale {
            out.iter_mut().for_each(|v| *v *= s);
        }
        if let Some(tp) = self.tp {
            tp.comm.all_reduce_sum(out)?;
        }
        Ok(())
    }

    fn rms_norm(&mut self, out: Act, x: Act, w: &Vec<f32>, eps: f32) -> Result<(), ExecError> {
        let (out, x) = io(&mut self.bufs, out, x)?;
        rms_norm(x, w, eps, out);
        Ok(())
    }

    fn linear(&mut self, out: Act, x: Act, w: &Linear, accumulate: bool) -> Result<(), ExecError> {
        let n = self.rows();
        let (out, x) = io(&mut self.bufs, out, x)?;
        w.forward(x, n, out, accumulate);
        Ok(())
    }

    fn linear_row_parallel(
        &mut self,
        out: Act,
        x: Act,
        w: &Linear,
        accumulate: bool,
        (layer, target): (usize, LoraTarget),
    ) -> Result<(), ExecError> {
        let cols = [LoraCols { target, offset: 0 }];
        let Some(tp) = self.tp else {
            self.linear(out, x, w, accumulate)?;
            return self.lora(out, x, layer, &cols);
        };
        // Rank 0 adds into `out`, the others overwrite it with their
        // partial product: the sum is `out + sum of partials`. An
        // adapter's delta is linear in `x` too: each rank adds its slice's
        // (`x_r A_r^T B^T`, its A cut as `w` is) before the sum.
        self.linear(out, x, w, accumulate && tp.comm.rank() == 0)?;
        self.lora(out, x, layer, &cols)?;
        tp.comm.all_reduce_sum(&mut self.bufs[out.index()])
    }

    fn lora(&mut self, out: Act, x: Act, layer: usize, cols: &[LoraCols]) -> Result<(), ExecError> {
        let Some(l) = self.lora else {
            return Ok(());
        };
        let n = self.rows();
        let (out, x) = io(&mut self.bufs, out, x)?;
        apply(x, out, n, l.groups, l.prepared, layer, cols);
        Ok(())
    }

    fn head_norms(
        &mut self,
        qkv: Act,
        q: &Vec<f32>,
        k: &Vec<f32>,
        eps: f32,
    ) -> Result<(), ExecError> {
        let (qd, kvd) = (self.dims.q_dim(), self.dims.kv_dim());
        for row in self.bufs[qkv.index()].chunks_exact_mut(self.dims.qkv_dim()) {
            let (qs, rest) = row.split_at_mut(qd);
            rms_norm_in_place(qs, q, eps);
            rms_norm_in_place(&mut rest[..kvd], k, eps);
        }
        Ok(())
    }

    fn attention(
        &mut self,
        out: Act,
        qkv: Act,
        a: &LayerAttn<'_, RopeTables>,
    ) -> Result<(), ExecError> {
        let d = self.dims;
        let (qd, kvd, stride) = (d.q_dim(), d.kv_dim(), d.qkv_dim());
        let positions = &self.batch.positions;
        for (row, &pos) in self.bufs[qkv.index()]
            .chunks_exact_mut(stride)
            .zip(positions)
        {
            let (q, rest) = row.split_at_mut(qd);
            a.rope.apply(q, pos);
            a.rope.apply(&mut rest[..kvd], pos);
        }
        let geom = self.cache.geometry();
        let (batch, tasks) = (self.batch, &self.tasks);
        let params = AttnParams {
            scale: a.scale,
            window: a.window,
            wide: self.wide_attention,
        };
        let (outb, qkvb) = io(&mut self.bufs, out, qkv)?;
        let layer = self.cache.layer_mut(a.layer);
        layer.write(
            &qkvb[qd..],
            &qkvb[qd + kvd..],
            stride,
            &batch.slot_mapping,
            kvd,
        );
        paged_attention(
            params,
            qkvb,
            stride,
            self.cache.layer(a.layer),
            &geom,
            &batch.seqs,
            tasks,
            d.heads,
            outb,
        );
        Ok(())
    }

    fn gated(&mut self, out: Act, gate_up: Act, gate: Gate) -> Result<(), ExecError> {
        let inter = self.dims.inter;
        let (out, gu) = io(&mut self.bufs, out, gate_up)?;
        let rows = out.len() / inter.max(1);
        // Rows in parts, one task each where the work is worth a region
        // (at batch 32 this pass was ~2% of a step on one thread while the
        // others waited).
        let per = rows.div_ceil(par::parts(rows, out.len())).max(1) * inter.max(1);
        let mut parts: Vec<_> = gu.chunks(2 * per).zip(out.chunks_mut(per)).collect();
        par::for_each_mut(&mut parts, |(gu, out)| match gate {
            Gate::Silu => silu_mul(gu, inter, out),
            Gate::GeluTanh => gelu_tanh_mul(gu, inter, out),
        });
        Ok(())
    }

    fn add_rms_norm(
        &mut self,
        x: Act,
        branch: Act,
        w: &Vec<f32>,
        eps: f32,
    ) -> Result<(), ExecError> {
        let mut tmp = std::mem::take(&mut self.tmp);
        let (x, branch) = io(&mut self.bufs, x, branch)?;
        tmp.resize(branch.len(), 0.0);
        rms_norm(branch, w, eps, &mut tmp);
        x.iter_mut().zip(&tmp).for_each(|(a, b)| *a += b);
        self.tmp = tmp;
        Ok(())
    }

    fn logits(
        &mut self,
        x: Act,
        final_norm: &Vec<f32>,
        head: &Linear,
        eps: f32,
    ) -> Result<(), ExecError> {
        let (h, vocab) = (self.dims.hidden, self.dims.vocab);
        let x = &self.bufs[x.index()];
        let rows = self.batch.logits_rows.len();
        let mut sel = vec![0.0f32; rows * h];
        for (dst, &r) in sel.chunks_exact_mut(h).zip(&self.batch.logits_rows) {
            dst.copy_from_slice(&x[r * h..(r + 1) * h]);
        }
        let mut normed = vec![0.0f32; rows * h];
        rms_norm(&sel, final_norm, eps, &mut normed);
        let Some(tp) = self.tp else {
            let mut data = vec![0.0f32; rows * vocab];
            head.forward(&normed, rows, &mut data, false);
            self.logits = Some(Logits { rows, vocab, data });
            return Ok(());
        };
        let mut part = vec![0.0f32; rows * tp.shard().vocab.len()];
        head.forward(&normed, rows, &mut part, false);
        self.logits = Some(tp.gather_logits(rows, &part, vocab)?);
        Ok(())
    }
}
