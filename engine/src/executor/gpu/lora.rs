//! Multi-LoRA on the GPU executor: the adapters of the engine's slot table
//! held on the device, and the launches [`super::forward`]'s `GpuStep::lora`
//! makes after each adaptable linear layer (Punica's shrink and expand,
//! `gpu_kernels::lora`, in the executor's dtype).
//!
//! Device state, kept across steps and made on the first step with adapters
//! (an executor that never sees one allocates nothing here):
//! - the stacks, one allocation: per site (layer, target) `A: [slots,
//!   max_rank, in]` then `B: [slots, out, max_rank]`, each 256-byte aligned,
//!   in the executor's dtype (f32 / f16 / bf16, the activations' type, which
//!   is what the kernels read);
//! - `ranks: u32[layers, 7, slots]` (a site's rank per slot: 0 where the
//!   slot's adapter leaves that target alone, so the kernels skip its rows)
//!   followed by `scales: f32[slots]`, one small buffer.
//!
//! Slot fills: the step's [`LoraStep`] says which adapter id is in which
//! slot. A slot whose id differs from the one the device holds is uploaded
//! (`A` as given, `B` padded to `max_rank` columns; two uploads per adapted
//! site), then the rank/scale buffer once; a slot with the same id is reused
//! as it is (ids are never reused for other weights); an emptied slot gets
//! rank 0 everywhere (its stale weights are never read). The stacks are
//! sized for the largest rank seen: a larger adapter reallocates them and
//! uploads every filled slot again.
//!
//! Per step with adapters: one upload of the rows' slots. A decode-only
//! step uses BGMV with `idx: i32[tokens]` (each row's slot, -1 for base
//! rows); a step with a prompt chunk uses SGMV over the rows cut into runs
//! of one slot (`seg_starts: u32[segs + 1]` then `seg_idx: i32[segs]`, base
//! runs -1; consecutive sequences of one adapter share a run). `t: f32[tokens,
//! max_rank]` is the shrink/expand scratch, reused by every site in stream
//! order. Each adapted target of a site that some slot of the step adapts
//! gets one shrink and one expand launch (the expand adds `scale t B^T` into
//! the target's columns of the fused output in place); a site no used slot
//! adapts gets none.
//!
//! Invariants: a step without adapters never comes here (no [`LoraRun`]: no
//! launch, upload or allocation on the base path); a step with adapters runs
//! eagerly, never as a CUDA graph (its launches depend on the slots it uses
//! and its row index's layout; see `graphs.rs`); the device's rank table is
//! uploaded whenever the host mirror changed, before the step's launches.
//!
//! Cost: a fill uploads the adapter (`r (in + out)` elements per adapted
//! site); a step uploads 4 bytes per row (BGMV) or 8 per run (SGMV) and
//! launches `2 x` adapted targets per layer; the kernels' own cost is in
//! `gpu_kernels::lora`'s docs.

use super::device::{DType, DevBuf, DevPtr, Device, Kernel, ThreadsFor};
use super::forward::ensure;
use super::GpuError;
use crate::executor::{ExecError, ForwardBatch};
use crate::model::lora::{LoraAdapter, LoraCols, LoraId, LoraStep, LoraTarget};
use crate::model::tp::TpRank;
use crate::model::Dims;
use gpu_kernels::{launch as geom, KernelArg};

/// Targets per layer.
const TARGETS: usize = LoraTarget::ALL.len();

/// The four LoRA entry points of the executor's dtype.
#[derive(Clone, Copy, Debug)]
struct LoraKernels {
    bgmv_shrink: Kernel,
    bgmv_expand: Kernel,
    sgmv_shrink: Kernel,
    sgmv_expand: Kernel,
}

impl LoraKernels {
    fn resolve(dev: &mut dyn Device, t: DType) -> Result<Self, GpuError> {
        let sfx = t.kernel_suffix();
        let mut k = |f: &str| dev.kernel(&format!("lora_{f}_{sfx}"));
        Ok(Self {
            bgmv_shrink: k("bgmv_shrink")?,
            bgmv_expand: k("bgmv_expand")?,
            sgmv_shrink: k("sgmv_shrink")?,
            sgmv_expand: k("sgmv_expand")?,
        })
    }
}

/// One site's (layer, target) stacks: byte offsets in the stack allocation
/// and the base matrix's shape.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Site {
    a: usize,
    b: usize,
    inp: usize,
    out: usize,
}

/// `(out, in)` of `t`'s base matrix (`LoraTarget::shape` from [`Dims`]).
fn shape(t: LoraTarget, d: &Dims) -> (usize, usize) {
    let (h, q, kv, ff) = (d.hidden, d.q_dim(), d.kv_dim(), d.inter);
    match t {
        LoraTarget::Q => (q, h),
        LoraTarget::K | LoraTarget::V => (kv, h),
        LoraTarget::O => (h, q),
        LoraTarget::Gate | LoraTarget::Up => (ff, h),
        LoraTarget::Down => (h, ff),
    }
}

/// Allocations are rounded to this many bytes (keeps every stack 16-byte
/// aligned for the kernels' vector loads).
const ALIGN: usize = 256;

/// The adapters on the device. See the module docs.
#[derive(Default)]
pub struct GpuLora {
    kernels: Option<LoraKernels>,
    /// The adapter each slot's stacks hold.
    ids: Vec<Option<LoraId>>,
    /// Rank capacity of the stacks (the largest rank seen).
    max_rank: usize,
    stacks: Option<DevBuf>,
    /// Per site, `layer * 7 + target`.
    sites: Vec<Site>,
    /// Host mirror of the device rank table, `[site, slot]`.
    ranks: Vec<u32>,
    /// Each slot's scale (0 when empty).
    scales: Vec<f32>,
    /// The mirror differs from the device's table.
    meta_dirty: bool,
    /// `ranks` then `scales` on the device.
    meta: Option<DevBuf>,
    /// The step's row words (BGMV index or SGMV segments).
    rows: Option<DevBuf>,
    /// `f32[tokens, max_rank]`.
    t: Option<DevBuf>,
    /// Slots the current step's rows use.
    used: Vec<bool>,
    words: Vec<u32>,
    bytes: Vec<u8>,
    /// Slots uploaded since start (tests read it).
    pub fills: u64,
}

/// How a step's rows name their slots on the device.
#[derive(Clone, Copy, Debug)]
enum Rows {
    /// `idx: i32[tokens]`.
    Bgmv { idx: DevPtr },
    /// `seg_starts: u32[segs + 1]`, `seg_idx: i32[segs]`.
    Sgmv {
        starts: DevPtr,
        idx: DevPtr,
        segs: usize,
    },
}

/// What one step's `GpuStep::lora` calls need: every address is live until
/// the next [`GpuLora::prepare`].
pub struct LoraRun<'a> {
    kernels: LoraKernels,
    stacks: DevPtr,
    sites: &'a [Site],
    ranks_host: &'a [u32],
    used: &'a [bool],
    ranks: DevPtr,
    scales: DevPtr,
    slots: usize,
    max_rank: usize,
    rows: Rows,
    t: DevPtr,
    tokens: usize,
}

fn words_to_bytes(words: &[u32], bytes: &mut Vec<u8>) {
    bytes.clear();
    bytes.extend(words.iter().flat_map(|w| w.to_le_bytes()));
}

impl GpuLora {
    /// Brings the device's slots in line with `step` (uploading the
    /// adapters whose slot changed), uploads the rows' slots of `batch`, and
    /// returns what the step's launches need. `step` was validated against
    /// `batch` and has adapters.
    ///
    /// Under tensor parallelism (`tp`: the model is this rank's shard) a
    /// slot holds this rank's slice of its adapter
    /// ([`TpRank::shard_adapter`]).
    pub fn prepare(
        &mut self,
        dev: &mut dyn Device,
        (d, dtype): (&Dims, DType),
        step: &LoraStep,
        batch: &ForwardBatch,
        tp: Option<&TpRank>,
    ) -> Result<LoraRun<'_>, ExecError> {
        let kernels = match self.kernels {
            Some(k) => k,
            None => {
                let k = LoraKernels::resolve(dev, dtype)?;
                self.kernels = Some(k);
                k
            }
        };
        self.fill_slots(dev, (d, dtype), step, tp)?;
        let rows = self.upload_rows(dev, step, batch)?;
        let tokens = batch.token_ids.len();
        let t = ensure(dev, &mut self.t, tokens * self.max_rank * 4)?;
        let meta = self
            .meta
            .as_ref()
            .ok_or_else(|| GpuError::Device("LoRA rank table missing".into()))?
            .ptr;
        let stacks = self
            .stacks
            .as_ref()
            .ok_or_else(|| GpuError::Device("LoRA stacks missing".into()))?
            .ptr;
        Ok(LoraRun {
            kernels,
            stacks,
            sites: &self.sites,
            ranks_host: &self.ranks,
            used: &self.used,
            ranks: meta,
            scales: meta.offset(self.ranks.len() * 4),
            slots: self.ids.len(),
            max_rank: self.max_rank,
            rows,
            t,
            tokens,
        })
    }

    /// Uploads the adapters of slots whose id changed (reallocating the
    /// stacks first when the slot count or the largest rank grew), then the
    /// rank/scale table if it changed.
    fn fill_slots(
        &mut self,
        dev: &mut dyn Device,
        (d, dtype): (&Dims, DType),
        step: &LoraStep,
        tp: Option<&TpRank>,
    ) -> Result<(), ExecError> {
        let slots = step.slots.len();
        let rank = step
            .slots
            .iter()
            .flatten()
            .map(|e| e.adapter.rank)
            .max()
            .unwrap_or(0);
        if slots != self.ids.len() || rank > self.max_rank || self.stacks.is_none() {
            self.reallocate(dev, d, dtype, slots, rank.max(self.max_rank).max(1))?;
        }
        for (s, entry) in step.slots.iter().enumerate() {
            match entry {
                None if self.ids[s].is_none() => {}
                None => {
                    self.clear_slot(s);
                    self.ids[s] = None;
                }
                Some(e) if self.ids[s] == Some(e.id) => {}
                Some(e) => {
                    self.ids[s] = None;
                    self.clear_slot(s);
                    match tp {
                        Some(tp) => {
                            self.upload_slot(dev, d, dtype, s, &tp.shard_adapter(&e.adapter))?
                        }
                        None => self.upload_slot(dev, d, dtype, s, &e.adapter)?,
                    }
                    self.scales[s] = e.adapter.scale;
                    self.ids[s] = Some(e.id);
                    self.fills += 1;
                }
            }
        }
        if self.meta_dirty {
            let mut words = std::mem::take(&mut self.words);
            words.clear();
            words.extend_from_slice(&self.ranks);
            words.extend(self.scales.iter().map(|s| s.to_bits()));
            words_to_bytes(&words, &mut self.bytes);
            self.words = words;
            let meta = ensure(dev, &mut self.meta, self.bytes.len())?;
            dev.upload(meta, &self.bytes)?;
            self.meta_dirty = false;
        }
        Ok(())
    }

    /// New stacks for `slots` slots of rank up to `max_rank` (every slot
    /// empty; the old stacks freed first).
    fn reallocate(
        &mut self,
        dev: &mut dyn Device,
        d: &Dims,
        dtype: DType,
        slots: usize,
        max_rank: usize,
    ) -> Result<(), GpuError> {
        if let Some(old) = self.stacks.take() {
            dev.free(old)?;
        }
        let sz = dtype.size();
        let mut off = 0;
        self.sites.clear();
        for _ in 0..d.layers {
            for t in LoraTarget::ALL {
                let (out, inp) = shape(t, d);
                let a = off;
                off += (slots * max_rank * inp * sz).next_multiple_of(ALIGN);
                let b = off;
                off += (slots * out * max_rank * sz).next_multiple_of(ALIGN);
                self.sites.push(Site { a, b, inp, out });
            }
        }
        self.stacks = Some(dev.alloc(off.max(ALIGN))?);
        self.max_rank = max_rank;
        self.ids = vec![None; slots];
        self.ranks = vec![0; self.sites.len() * slots];
        self.scales = vec![0.0; slots];
        self.used = vec![false; slots];
        self.meta_dirty = true;
        Ok(())
    }

    /// Slot `s` adapts nothing (host mirror; uploaded with the table).
    fn clear_slot(&mut self, s: usize) {
        let slots = self.ids.len();
        self.ranks
            .iter_mut()
            .skip(s)
            .step_by(slots)
            .for_each(|r| *r = 0);
        self.scales[s] = 0.0;
        self.meta_dirty = true;
    }

    /// Uploads `adapter`'s matrices into slot `s` and records its ranks.
    fn upload_slot(
        &mut self,
        dev: &mut dyn Device,
        d: &Dims,
        dtype: DType,
        s: usize,
        adapter: &LoraAdapter,
    ) -> Result<(), ExecError> {
        let (r, mr, sz, slots) = (adapter.rank, self.max_rank, dtype.size(), self.ids.len());
        if adapter.layers.len() != d.layers {
            return Err(ExecError::InvalidBatch(format!(
                "a LoRA adapter of {} layers on a model of {}",
                adapter.layers.len(),
                d.layers
            )));
        }
        let base = self
            .stacks
            .as_ref()
            .ok_or_else(|| GpuError::Device("LoRA stacks missing".into()))?
            .ptr;
        let mut padded = Vec::new();
        for (l, layer) in adapter.layers.iter().enumerate() {
            for t in LoraTarget::ALL {
                let Some(p) = &layer.pairs[t.index()] else {
                    continue;
                };
                let si = l * TARGETS + t.index();
                let site = self.sites[si];
                if p.a.len() != r * site.inp || p.b.len() != site.out * r {
                    return Err(ExecError::InvalidBatch(format!(
                        "LoRA adapter layer {l} {}: A has {} values and B {}, \
                         expected {r} x {} and {} x {r}",
                        t.hf_name(),
                        p.a.len(),
                        p.b.len(),
                        site.inp,
                        site.out
                    )));
                }
                let a_at = base.offset(site.a + s * mr * site.inp * sz);
                dev.upload(a_at, &dtype.encode(&p.a))?;
                // `[out, max_rank]`: the adapter's `r` columns, then zeros.
                padded.clear();
                padded.resize(site.out * mr, 0.0f32);
                for (row, src) in padded.chunks_exact_mut(mr).zip(p.b.chunks_exact(r)) {
                    row[..r].copy_from_slice(src);
                }
                let b_at = base.offset(site.b + s * site.out * mr * sz);
                dev.upload(b_at, &dtype.encode(&padded))?;
                self.ranks[si * slots + s] = r as u32;
            }
        }
        self.meta_dirty = true;
        Ok(())
    }

    /// Uploads each row's slot (BGMV, a decode-only step) or the runs of
    /// rows sharing one (SGMV, a step with a prompt chunk), and marks the
    /// slots the step uses.
    fn upload_rows(
        &mut self,
        dev: &mut dyn Device,
        step: &LoraStep,
        batch: &ForwardBatch,
    ) -> Result<Rows, GpuError> {
        self.used.iter_mut().for_each(|u| *u = false);
        let slot_of = |i: usize| -> i32 {
            step.seq_slot
                .get(i)
                .copied()
                .flatten()
                .map_or(-1, |s| s as i32)
        };
        for s in step.seq_slot.iter().flatten() {
            if let Some(u) = self.used.get_mut(*s as usize) {
                *u = true;
            }
        }
        let mut words = std::mem::take(&mut self.words);
        words.clear();
        let prefill = batch.seqs.iter().any(|q| q.query_len > 1);
        let segs = if prefill {
            // Runs of one slot: starts (closed by the row count), then slots.
            let mut starts = Vec::new();
            let mut idx: Vec<i32> = Vec::new();
            let mut row = 0u32;
            for (i, q) in batch.seqs.iter().enumerate() {
                let v = slot_of(i);
                if q.query_len > 0 && idx.last() != Some(&v) {
                    starts.push(row);
                    idx.push(v);
                }
                row += q.query_len as u32;
            }
            starts.push(row);
            words.extend_from_slice(&starts);
            words.extend(idx.iter().map(|&v| v as u32));
            Some(idx.len())
        } else {
            for (i, q) in batch.seqs.iter().enumerate() {
                let v = slot_of(i) as u32;
                words.extend(std::iter::repeat_n(v, q.query_len));
            }
            None
        };
        words_to_bytes(&words, &mut self.bytes);
        self.words = words;
        let buf = ensure(dev, &mut self.rows, self.bytes.len())?;
        dev.upload(buf, &self.bytes)?;
        Ok(match segs {
            None => Rows::Bgmv { idx: buf },
            Some(segs) => Rows::Sgmv {
                starts: buf,
                idx: buf.offset((segs + 1) * 4),
                segs,
            },
        })
    }
}

/// A `u32` kernel argument.
fn u(x: usize) -> KernelArg {
    KernelArg::U32(x as u32)
}

impl LoraRun<'_> {
    /// Whether some slot of the step adapts site `si`.
    fn active(&self, si: usize) -> bool {
        let ranks = &self.ranks_host[si * self.slots..(si + 1) * self.slots];
        ranks.iter().zip(self.used).any(|(&r, &u)| u && r > 0)
    }

    /// Adds the deltas of layer `layer`'s targets `cols` into `y` (`[tokens,
    /// y_width]`, each target's columns from its offset) from `x`
    /// (`[tokens, x_width]`): one shrink and one expand launch per target
    /// some slot of the step adapts.
    ///
    /// # Safety
    /// `x` and `y` address distinct live buffers of the step's `tokens` rows
    /// of `x_width` and `y_width` elements of the executor's dtype.
    pub unsafe fn apply(
        &self,
        dev: &mut dyn Device,
        layer: usize,
        cols: &[LoraCols],
        (x, x_width): (DevPtr, usize),
        (y, y_width): (DevPtr, usize),
    ) -> Result<(), GpuError> {
        let (n, mr) = (self.tokens, self.max_rank);
        if n == 0 {
            return Ok(());
        }
        let threads = dev.threads(ThreadsFor::Lora);
        for c in cols {
            let si = layer * TARGETS + c.target.index();
            let site = *self
                .sites
                .get(si)
                .ok_or_else(|| GpuError::Device(format!("LoRA: no layer {layer} on the device")))?;
            if site.inp != x_width || c.offset + site.out > y_width {
                return Err(GpuError::Device(format!(
                    "LoRA {}: a {} -> {} site on {x_width}-wide input, columns {}.. of {y_width}",
                    c.target.hf_name(),
                    site.inp,
                    site.out,
                    c.offset
                )));
            }
            if !self.active(si) {
                continue;
            }
            let k = self.kernels;
            let (a, b) = (self.stacks.offset(site.a), self.stacks.offset(site.b));
            let ranks = self.ranks.offset(si * self.slots * 4);
            let (t, scales) = (self.t, self.scales);
            let (rows, out) = (n as u32, site.out as u32);
            // SAFETY: (both arms) `x` holds `n` rows of `site.inp` and `y` `n`
            // rows of `y_width >= offset + out` (checked above, and the
            // caller's contract); `t` holds `n x max_rank` f32 (`prepare`);
            // the stacks hold `slots` slots of `[max_rank, in]` / `[out,
            // max_rank]` at the site's offsets; `ranks` holds the site's
            // `slots` ranks (each `<= max_rank`) and `scales` `slots` f32;
            // the row index (or the segments, covering `0..n` in order)
            // names only slots `< slots` or -1; no output overlaps an input.
            unsafe {
                match self.rows {
                    Rows::Bgmv { idx } => {
                        let cfg = geom::lora_bgmv_shrink(rows, mr as u32, threads);
                        let args = [
                            t.arg(),
                            x.arg(),
                            a.arg(),
                            idx.arg(),
                            ranks.arg(),
                            u(site.inp),
                            u(mr),
                        ];
                        dev.launch(k.bgmv_shrink, cfg, &args)?;
                        let cfg = geom::lora_bgmv_expand(rows, out, threads);
                        let args = [
                            y.arg(),
                            t.arg(),
                            b.arg(),
                            idx.arg(),
                            ranks.arg(),
                            scales.arg(),
                            u(site.out),
                            u(mr),
                            u(y_width),
                            u(c.offset),
                        ];
                        dev.launch(k.bgmv_expand, cfg, &args)?;
                    }
                    Rows::Sgmv { starts, idx, segs } => {
                        let g = segs as u32;
                        let cfg = geom::lora_sgmv_shrink(rows, g, mr as u32, threads);
                        let args = [
                            t.arg(),
                            x.arg(),
                            a.arg(),
                            starts.arg(),
                            idx.arg(),
                            ranks.arg(),
                            u(segs),
                            u(site.inp),
                            u(mr),
                        ];
                        dev.launch(k.sgmv_shrink, cfg, &args)?;
                        let cfg = geom::lora_sgmv_expand(rows, g, out, threads);
                        let args = [
                            y.arg(),
                            t.arg(),
                            b.arg(),
                            starts.arg(),
                            idx.arg(),
                            ranks.arg(),
                            scales.arg(),
                            u(segs),
                            u(site.out),
                            u(mr),
                            u(y_width),
                            u(c.offset),
                        ];
                        dev.launch(k.sgmv_expand, cfg, &args)?;
                    }
                }
            }
        }
        Ok(())
    }
}
