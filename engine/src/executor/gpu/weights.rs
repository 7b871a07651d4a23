//! The GPU's weight formats ([`Gpu`]) and [`GpuSink`], which takes a model's
//! tensors straight from the loader to the device: each linear layer's
//! parts (fused q/k/v, gate/up) converted to the executor's [`DType`] in
//! bounded row chunks and uploaded into one buffer, norms in the dtype,
//! rotary tables in f32. Layouts are the model file's (`[out, in]`
//! row-major), so a fused layer is one GEMM.
//!
//! Invariant: host memory for a conversion is bounded by
//! [`CHUNK_BYTES`] of f32 (plus its encoding), whatever the tensor: a
//! quantized GGUF tensor is dequantized a row range at a time, never whole,
//! and nothing of the model stays on the host once uploaded.
//!
//! Cost: O(parameters) conversion and upload, once.

use super::device::{DType, DevBuf, DevPtr, Device};
use super::GpuError;
use crate::executor::BuildError;
use crate::model::backend::{Format, WeightSink};
use crate::model::ops::RopeTables;
use crate::model::ModelError;
use model_loader::Weight;

/// Most f32 bytes converted at once while uploading a matrix.
pub const CHUNK_BYTES: usize = 16 << 20;

/// The GPU's weight formats.
#[derive(Debug, Clone, Copy)]
pub struct Gpu;

impl Format for Gpu {
    type Matrix = GpuMatrix;
    type Vector = DevBuf;
    type Rope = GpuRope;
}

/// A linear layer on the device: `[rows, cols]` in the executor's dtype,
/// and its bias `[rows]` (Qwen2's q/k/v).
#[derive(Debug)]
pub struct GpuMatrix {
    pub buf: DevBuf,
    pub bias: Option<DevBuf>,
    pub rows: usize,
    pub cols: usize,
}

/// A rotary table on the device: `f32[max_positions, head_dim]`, each row
/// the cosines then the sines of its position.
#[derive(Debug)]
pub struct GpuRope {
    pub cos_sin: DevBuf,
    pub max_positions: usize,
}

/// Uploads a model's weights to `dev` in `dtype` (see the module docs).
pub struct GpuSink<'d> {
    dev: &'d mut dyn Device,
    dtype: DType,
    /// Bytes uploaded so far.
    pub bytes: usize,
}

impl<'d> GpuSink<'d> {
    pub fn new(dev: &'d mut dyn Device, dtype: DType) -> Self {
        Self {
            dev,
            dtype,
            bytes: 0,
        }
    }

    fn alloc(&mut self, bytes: usize) -> Result<DevBuf, GpuError> {
        let buf = self.dev.alloc(bytes)?;
        self.bytes += bytes;
        Ok(buf)
    }

    /// `values` in `t`, uploaded into a new buffer.
    fn put(&mut self, values: &[f32], t: DType) -> Result<DevBuf, GpuError> {
        let data = t.encode(values);
        let buf = self.alloc(data.len())?;
        self.dev.upload(buf.ptr, &data)?;
        Ok(buf)
    }

    /// Uploads one matrix part's rows at `dst`, `CHUNK_BYTES` of f32 at a time.
    fn put_rows(&mut self, dst: DevPtr, part: &Weight, cols: usize) -> Result<usize, BuildError> {
        let rows = part.shape().first().copied().unwrap_or(0);
        let per = (CHUNK_BYTES / (4 * cols.max(1))).max(1);
        let mut f32s = Vec::new();
        let mut r = 0;
        while r < rows {
            let end = (r + per).min(rows);
            f32s.resize((end - r) * cols, 0.0);
            part.to_f32_rows(r..end, &mut f32s)
                .map_err(ModelError::from)?;
            let data = self.dtype.encode(&f32s);
            self.dev
                .upload(dst.offset(r * cols * self.dtype.size()), &data)?;
            r = end;
        }
        Ok(rows)
    }
}

impl WeightSink for GpuSink<'_> {
    type Format = Gpu;
    type Error = BuildError;

    fn matrix(
        &mut self,
        _name: &str,
        parts: Vec<Weight>,
        in_features: usize,
        bias: Option<Vec<f32>>,
    ) -> Result<GpuMatrix, BuildError> {
        let rows: usize = parts
            .iter()
            .map(|p| p.shape().first().copied().unwrap_or(0))
            .sum();
        let buf = self.alloc(rows * in_features * self.dtype.size())?;
        let mut row = 0;
        for p in &parts {
            let at = buf.ptr.offset(row * in_features * self.dtype.size());
            row += self.put_rows(at, p, in_features)?;
        }
        let bias = bias.map(|b| self.put(&b, self.dtype)).transpose()?;
        Ok(GpuMatrix {
            buf,
            bias,
            rows,
            cols: in_features,
        })
    }

    fn vector(&mut self, _name: &str, values: Vec<f32>) -> Result<DevBuf, BuildError> {
        Ok(self.put(&values, self.dtype)?)
    }

    fn rope(&mut self, table: RopeTables) -> Result<GpuRope, BuildError> {
        Ok(GpuRope {
            cos_sin: self.put(&table.cos_sin_cache(), DType::F32)?,
            max_positions: table.max_positions(),
        })
    }
}
