//! Sampling on the device: the forward pass leaves its logits rows on the
//! device (`forward::Output::Device`), one `sample_rows_f32` launch draws
//! every row (`gpu_kernels::sampling::sample_rows`, the CPU sampler's
//! algorithm) and one download brings back each row's token, logprob and
//! top logprobs.
//!
//! Invariants: one launch and one download per step, after the forward
//! pass on the same stream; `rows` has one entry per logits row, or the step
//! is refused before anything runs; the parameter and output buffers grow
//! to the largest batch and are reused (no allocation per step after that
//! but the returned rows). Cost: `8 x 4` bytes up and `(2 + 2 n) x 4` bytes
//! down per row (n the step's largest `logprobs`), independent of the
//! vocabulary.

use super::device::{DevBuf, DevPtr, Device, Kernel, ThreadsFor};
use super::forward::{ensure, Output, StepOut};
use super::{GpuError, GpuExecutor};
use crate::executor::{BlockOps, ExecError, ForwardBatch};
use crate::sampler::device::{out_stride, pack, step_top_n, unpack, DeviceRow};
use crate::sampler::SampleOut;
use gpu_kernels::{launch as geom, KernelArg};

/// The sampling kernel and its reusable buffers.
pub struct SampleState {
    kernel: Kernel,
    params: Option<DevBuf>,
    out: Option<DevBuf>,
    words: Vec<u32>,
    bytes: Vec<u8>,
}

impl SampleState {
    /// Resolves `sample_rows_f32` (once, at start).
    pub fn new(dev: &mut dyn Device) -> Result<Self, GpuError> {
        Ok(Self {
            kernel: dev.kernel("sample_rows_f32")?,
            params: None,
            out: None,
            words: Vec::new(),
            bytes: Vec::new(),
        })
    }

    /// Draws the `rows.len()` rows of `[rows, vocab]` f32 `logits`.
    fn draw(
        &mut self,
        dev: &mut dyn Device,
        logits: DevPtr,
        rows: &[DeviceRow],
        vocab: usize,
    ) -> Result<Vec<SampleOut>, GpuError> {
        let r = rows.len();
        let n_top = step_top_n(rows);
        pack(rows, &mut self.words);
        self.bytes.clear();
        self.bytes
            .extend(self.words.iter().flat_map(|w| w.to_le_bytes()));
        let params = ensure(dev, &mut self.params, self.bytes.len())?;
        dev.upload(params, &self.bytes)?;
        let out_bytes = r * out_stride(n_top) * 4;
        let out = ensure(dev, &mut self.out, out_bytes)?;
        let cfg = geom::per_row(r as u32, dev.threads(ThreadsFor::Rows));
        let args = [
            out.arg(),
            logits.arg(),
            params.arg(),
            KernelArg::U32(vocab as u32),
            KernelArg::U32(n_top as u32),
        ];
        // SAFETY: `logits` holds `r` rows of `vocab` f32 (the LM head's
        // output of this step), `params` `r * PARAM_WORDS` u32 (uploaded
        // above), `out` `r * out_stride(n_top)` f32 with `n_top <=
        // MAX_LOGPROBS`; one block per row.
        unsafe { dev.launch(self.kernel, cfg, &args) }?;
        self.bytes.resize(out_bytes, 0);
        dev.download(out, &mut self.bytes)?;
        let floats: Vec<f32> = self
            .bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        Ok(unpack(&floats, rows, n_top))
    }
}

impl<D: Device> GpuExecutor<D> {
    /// The step with every logits row drawn on the device.
    pub(super) fn sample_step(
        &mut self,
        ops: &BlockOps,
        batch: &ForwardBatch,
        rows: &[DeviceRow],
    ) -> Result<Vec<SampleOut>, ExecError> {
        if rows.len() != batch.logits_rows.len() {
            return Err(ExecError::InvalidBatch(format!(
                "{} sampling rows for {} logits rows",
                rows.len(),
                batch.logits_rows.len()
            )));
        }
        let logits = match self.step(ops, batch, Output::Device)? {
            StepOut::Device(p) => p,
            // No logits rows: nothing to draw.
            StepOut::Logits(_) => return Ok(Vec::new()),
            StepOut::Greedy(_) => {
                return Err(ExecError::Device(
                    "greedy rows where device logits were asked".into(),
                ))
            }
        };
        Ok(self
            .sampling
            .draw(&mut self.dev, logits, rows, self.dims.vocab)?)
    }
}
