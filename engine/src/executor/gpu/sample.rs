//! Sampling on the device: the forward pass leaves its logits rows on the
//! device (`forward::Output::Device`); then, in order on the same stream,
//! `fill_counts` writes the count slots of sequences new to the table,
//! `penalize_rows` biases the processed rows in place and writes their
//! penalized, suppressed copies (`gpu_kernels::penalty`), and
//! `sample_rows_f32` draws every row (the CPU sampler's algorithm) and adds
//! each drawn token to its row's count slot. One download brings back each
//! row's token, logprob and top logprobs, after the logits of the rows the
//! host draws itself (a mixed step: `DeviceDraws::host_rows`, copied by
//! `penalize_rows` with nothing to apply, before any bias lands in place).
//!
//! The count table (`slots x vocab` u32) lives here across steps; which
//! sequence owns which slot, and when a slot must be refilled, is the
//! engine's business (`engine_loop::count_slots`): this module only grows
//! the table to the slots a step names (a grown table starts zeroed, and
//! the engine refills every slot when it asks for more).
//!
//! Invariants: one upload, at most four launches and one download per
//! step, after the forward pass on the same stream; the draws are checked
//! (`DeviceDraws::check`: rows, processed rows and slots consistent) before
//! anything runs; the buffers grow to the largest step and are reused (no
//! allocation per step after that but the returned rows). Cost: the packed
//! words up (`10 x 4` bytes per row, plus the processed rows' lists and the
//! fills) and `(2 + 2 n) x 4` bytes down per row (n the step's largest
//! `logprobs`), independent of the vocabulary, plus `vocab x 4` bytes per
//! host row; on the device, two passes
//! over each processed row and one over each filled slot.

use super::device::{DevBuf, DevPtr, Device, Kernel, ThreadsFor};
use super::forward::{ensure, Output, StepOut};
use super::{GpuError, GpuExecutor};
use crate::executor::{BlockOps, ExecError, ForwardBatch};
use crate::model::lora::LoraStep;
use crate::sampler::device::{
    host_logits, out_stride, unpack, Buffers, DeviceDraws, DeviceOut, Stage,
};

/// The sampling kernels and their reusable buffers.
pub struct SampleState {
    /// One per [`Stage`], in `Stage::ALL` order.
    kernels: [Kernel; 3],
    words_buf: Option<DevBuf>,
    out: Option<DevBuf>,
    /// The processed rows' copies.
    draw: Option<DevBuf>,
    /// The count table, kept across steps.
    counts: Option<DevBuf>,
    words: Vec<u32>,
    bytes: Vec<u8>,
}

impl SampleState {
    /// Resolves the sampling kernels (once, at start).
    pub fn new(dev: &mut dyn Device) -> Result<Self, GpuError> {
        let [a, b, c] = Stage::ALL;
        Ok(Self {
            kernels: [
                dev.kernel(a.kernel())?,
                dev.kernel(b.kernel())?,
                dev.kernel(c.kernel())?,
            ],
            words_buf: None,
            out: None,
            draw: None,
            counts: None,
            words: Vec::new(),
            bytes: Vec::new(),
        })
    }

    fn kernel(&self, stage: Stage) -> Kernel {
        match stage {
            Stage::Fill => self.kernels[0],
            Stage::Penalize => self.kernels[1],
            Stage::Sample => self.kernels[2],
        }
    }

    /// Draws the rows of `[rows, vocab]` f32 `logits` (checked by the
    /// caller: `draws.check(rows)` passed).
    fn draw(
        &mut self,
        dev: &mut dyn Device,
        logits: DevPtr,
        draws: &DeviceDraws,
        vocab: usize,
    ) -> Result<DeviceOut, GpuError> {
        let r = draws.rows.len();
        let n_top = draws.top_n();
        let host_bytes = draws.host_rows.len() * vocab * 4;
        let layout = draws.pack(&mut self.words);
        self.bytes.clear();
        self.bytes
            .extend(self.words.iter().flat_map(|w| w.to_le_bytes()));
        let words = ensure(dev, &mut self.words_buf, self.bytes.len())?;
        dev.upload(words, &self.bytes)?;
        // The host rows' copies, then the draws: one download.
        let out_bytes = r * out_stride(n_top) * 4;
        let gather = ensure(dev, &mut self.out, host_bytes + out_bytes)?;
        let out = gather.offset(host_bytes);
        // Unused pointers (no processed row, no slot) are never read.
        let draw = match draws.processed.len() {
            0 => logits,
            p => ensure(dev, &mut self.draw, p * vocab * 4)?,
        };
        let counts = match draws.slots {
            0 => logits,
            s => ensure(dev, &mut self.counts, s as usize * vocab * 4)?,
        };
        let bufs = Buffers {
            gather: gather.0,
            out: out.0,
            logits: logits.0,
            draw: draw.0,
            counts: counts.0,
            words: words.0,
        };
        let threads = dev.threads(ThreadsFor::Rows);
        for l in draws.launches(layout, bufs, vocab, threads) {
            // SAFETY: `draws.check` passed, so every logits row, processed
            // row, host row and slot the words name is inside `logits` (the
            // LM head's `rows x vocab` f32 of this step), `draw` (`processed
            // x vocab` f32), `gather` (`host_rows x vocab` f32) and `counts`
            // (`slots x vocab` u32), each grown above;
            // `words` holds the packed words the offsets index; `out` holds
            // `rows x out_stride(n_top)` f32 with `n_top <= MAX_LOGPROBS`.
            unsafe { dev.launch(self.kernel(l.stage), l.cfg, &l.args) }?;
        }
        self.bytes.resize(host_bytes + out_bytes, 0);
        dev.download(gather, &mut self.bytes)?;
        let mut floats: Vec<f32> = self
            .bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        let drawn = floats.split_off(host_bytes / 4);
        Ok(DeviceOut {
            rows: unpack(&drawn, &draws.rows, n_top),
            host_rows: draws.host_rows.clone(),
            logits: host_logits(&draws.host_rows, vocab, floats),
        })
    }
}

impl<D: Device> GpuExecutor<D> {
    /// The step with every logits row drawn on the device.
    pub(super) fn sample_step(
        &mut self,
        ops: &BlockOps,
        batch: &ForwardBatch,
        lora: &LoraStep,
        draws: &DeviceDraws,
    ) -> Result<DeviceOut, ExecError> {
        draws
            .check(batch.logits_rows.len())
            .map_err(ExecError::InvalidBatch)?;
        let logits = match self.step(ops, batch, lora, Output::Device)? {
            StepOut::Device(p) => p,
            // No logits rows: nothing to draw.
            StepOut::Logits(_) => {
                return Ok(DeviceOut {
                    rows: Vec::new(),
                    host_rows: Vec::new(),
                    logits: None,
                })
            }
            StepOut::Greedy(_) => {
                return Err(ExecError::WrongAnswer(
                    "greedy rows where device logits were asked".into(),
                ))
            }
        };
        Ok(self
            .sampling
            .draw(&mut self.dev, logits, draws, self.dims.vocab)?)
    }
}
