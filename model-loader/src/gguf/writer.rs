//! A small GGUF v3 writer: metadata plus tensors of any readable type. Used by the
//! tests (to build well-formed and malformed files) and by the tiny-model
//! generator. Tensors are given row-major with the HF shape; the writer
//! stores dims innermost-first as GGUF does. The Q/K row permutation is the
//! caller's business (see [`permute_qk`]).

use super::{value_type as t, GgmlType, MetaValue, DEFAULT_ALIGNMENT, GGUF_MAGIC};
use crate::error::{LoaderError, Result};

/// One tensor to write.
#[derive(Debug, Clone)]
pub struct WriterTensor {
    pub name: String,
    /// Row-major shape, outermost first.
    pub shape: Vec<usize>,
    pub ty: GgmlType,
    pub data: Vec<f32>,
}

/// Builds a GGUF file in memory.
#[derive(Debug, Default)]
pub struct GgufWriter {
    metadata: Vec<(String, MetaValue)>,
    tensors: Vec<WriterTensor>,
}

impl GgufWriter {
    /// An empty file.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds (or appends, in order) a metadata entry.
    pub fn meta(&mut self, key: &str, value: MetaValue) -> &mut Self {
        self.metadata.push((key.to_string(), value));
        self
    }

    /// Adds a tensor stored as `ty` (any readable type; rows of whole blocks).
    pub fn tensor(
        &mut self,
        name: &str,
        shape: Vec<usize>,
        ty: GgmlType,
        data: Vec<f32>,
    ) -> &mut Self {
        self.tensors.push(WriterTensor {
            name: name.to_string(),
            shape,
            ty,
            data,
        });
        self
    }

    /// Serializes the file.
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        out.extend_from_slice(&GGUF_MAGIC.to_le_bytes());
        out.extend_from_slice(&3u32.to_le_bytes());
        out.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (k, v) in &self.metadata {
            write_str(&mut out, k);
            write_value(&mut out, v, true);
        }
        let blobs = self
            .tensors
            .iter()
            .map(encode_tensor)
            .collect::<Result<Vec<_>>>()?;
        let mut offset = 0u64;
        for (tensor, blob) in self.tensors.iter().zip(&blobs) {
            write_str(&mut out, &tensor.name);
            out.extend_from_slice(&(tensor.shape.len() as u32).to_le_bytes());
            for d in tensor.shape.iter().rev() {
                out.extend_from_slice(&(*d as u64).to_le_bytes());
            }
            out.extend_from_slice(&tensor.ty.id().to_le_bytes());
            out.extend_from_slice(&offset.to_le_bytes());
            offset = (offset + blob.len() as u64).div_ceil(DEFAULT_ALIGNMENT) * DEFAULT_ALIGNMENT;
        }
        for blob in &blobs {
            pad(&mut out);
            out.extend_from_slice(blob);
        }
        Ok(out)
    }
}

fn pad(out: &mut Vec<u8>) {
    let a = DEFAULT_ALIGNMENT as usize;
    out.resize(out.len().div_ceil(a) * a, 0);
}

fn encode_tensor(t: &WriterTensor) -> Result<Vec<u8>> {
    if t.shape.iter().product::<usize>() != t.data.len() {
        return Err(LoaderError::ShapeMismatch {
            tensor: t.name.clone(),
            expected: t.shape.clone(),
            found: vec![t.data.len()],
        });
    }
    crate::dequant::encode(t.ty, &t.data, &t.name)
}

fn write_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn type_id(v: &MetaValue) -> u32 {
    match v {
        MetaValue::U8(_) => t::U8,
        MetaValue::I8(_) => t::I8,
        MetaValue::U16(_) => t::U16,
        MetaValue::I16(_) => t::I16,
        MetaValue::U32(_) => t::U32,
        MetaValue::I32(_) => t::I32,
        MetaValue::F32(_) => t::F32,
        MetaValue::Bool(_) => t::BOOL,
        MetaValue::String(_) => t::STRING,
        MetaValue::Array(_) => t::ARRAY,
        MetaValue::U64(_) => t::U64,
        MetaValue::I64(_) => t::I64,
        MetaValue::F64(_) => t::F64,
    }
}

/// Writes a value; `with_type` writes the type id first (not done for array items).
fn write_value(out: &mut Vec<u8>, v: &MetaValue, with_type: bool) {
    if with_type {
        out.extend_from_slice(&type_id(v).to_le_bytes());
    }
    match v {
        MetaValue::U8(x) => out.push(*x),
        MetaValue::I8(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::Bool(x) => out.push(u8::from(*x)),
        MetaValue::String(s) => write_str(out, s),
        MetaValue::Array(items) => {
            // Element type of an empty array: u8 by convention.
            let elem = items.first().map_or(t::U8, type_id);
            out.extend_from_slice(&elem.to_le_bytes());
            out.extend_from_slice(&(items.len() as u64).to_le_bytes());
            for item in items {
                write_value(out, item, false);
            }
        }
        MetaValue::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
    }
}

/// llama.cpp's converter permutation of Q/K rows (`[out, in]` row-major):
/// `w.reshape(n_head, 2, out/n_head/2, in).swapaxes(1, 2).reshape(out, in)`.
/// The loader applies the inverse, [`crate::gguf_model::unpermute_qk`].
pub fn permute_qk(w: &[f32], n_head: usize, rows: usize, cols: usize) -> Vec<f32> {
    let hd = rows / n_head;
    let half = hd / 2;
    let mut out = vec![0f32; w.len()];
    for h in 0..n_head {
        for i in 0..2 {
            for j in 0..half {
                let src = h * hd + i * half + j;
                let dst = h * hd + 2 * j + i;
                out[dst * cols..(dst + 1) * cols].copy_from_slice(&w[src * cols..(src + 1) * cols]);
            }
        }
    }
    out
}
