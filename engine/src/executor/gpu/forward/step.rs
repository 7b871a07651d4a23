//! The GPU's [`Backend`]: each operation of the model definition
//! (`crate::model::arch`) as one or two launches or a GEMM on the step's
//! device (the table in the parent module's docs), the tensor-parallel
//! all-reduces included. [`super::compute`] runs the model on it.

use super::attention::{attention, AttnArgs};
use super::{ensure, needed, per_row, u, Kernels, Meta, Parts, Scratch};
use crate::executor::gpu::device::{DType, DevBuf, DevPtr, Device, Gemm, ThreadsFor};
use crate::executor::gpu::weights::{Gpu, GpuMatrix, GpuRope};
use crate::executor::gpu::GpuError;
use crate::executor::ForwardBatch;
use crate::model::backend::{Act, ActWidths, Backend, Gate, LayerAttn};
use crate::model::lora::{LoraCols, LoraTarget};
use gpu_kernels::{launch as geom, KernelArg};

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

/// The GPU's [`Backend`] for one step (see the parent module's docs).
pub(super) struct GpuStep<'a, 'p> {
    dev: &'a mut dyn Device,
    p: &'a Parts<'p>,
    s: &'a mut Scratch,
    m: &'a Meta,
    batch: &'a ForwardBatch,
    widths: ActWidths,
    acts: [DevPtr; 7],
    /// The logits buffer once [`Backend::logits`] ran.
    pub(super) logits: Option<DevPtr>,
}

impl<'a, 'p> GpuStep<'a, 'p> {
    /// A step over `batch`, whose integers are at `m`, before any operation.
    pub(super) fn new(
        dev: &'a mut dyn Device,
        p: &'a Parts<'p>,
        s: &'a mut Scratch,
        m: &'a Meta,
        batch: &'a ForwardBatch,
    ) -> Self {
        Self {
            dev,
            p,
            s,
            m,
            batch,
            widths: ActWidths::default(),
            acts: [DevPtr(0); 7],
            logits: None,
        }
    }
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
