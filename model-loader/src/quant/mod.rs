//! GGUF block quantization: every block type decoded to 8-bit integers with
//! per-16-element affine parameters, dequantized to f32, and encoded from f32.
//!
//! One decoder per type, [`decode_row`], turns a row of blocks into signed
//! 8-bit levels `q` plus, per group of [`GROUP`] elements, a scale `a` and an
//! offset `b`, so that `x[i] = a[i/16] * q[i] + b[i/16]`. The f32
//! dequantization ([`dequantize_row`]) and the engine's integer dot products
//! both read this form, so the bit layouts live in one place. Types without
//! a minimum have `b == 0` ([`QuantType::has_offset`] is false).
//!
//! Invariants: a row holds a whole number of blocks; `q` fits an `i8` for
//! every type (the widest is `Q8_0`/`Q8_K`, -128..127); encoders write the
//! same layout the decoders read (checked against the `gguf` Python
//! package's dequantization by `tests/quant_gguf.rs`).
//!
//! Cost: decoding and dequantizing are O(n) with no allocation; encoding is
//! O(n) with one small allocation per block for the K-quants.

mod kquants;
pub use kquants::scale_min_k4;
mod legacy;

use crate::error::{LoaderError, Result};
use crate::gguf::GgmlType;

/// Elements sharing one `(a, b)` pair in the decoded form.
pub const GROUP: usize = 16;

/// The block-quantized GGUF types.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QuantType {
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q2K,
    Q3K,
    Q4K,
    Q5K,
    Q6K,
    Q8K,
}

type Decoder = fn(&[u8], &mut [i8], &mut [f32], &mut [f32]);
type Encoder = fn(&[f32], &mut Vec<u8>);

impl QuantType {
    /// Every type, in id order.
    pub const ALL: [QuantType; 11] = [
        Self::Q4_0,
        Self::Q4_1,
        Self::Q5_0,
        Self::Q5_1,
        Self::Q8_0,
        Self::Q2K,
        Self::Q3K,
        Self::Q4K,
        Self::Q5K,
        Self::Q6K,
        Self::Q8K,
    ];

    /// The quantized type of a GGUF tensor type, if it is one.
    pub fn from_ggml(t: GgmlType) -> Option<Self> {
        Some(match t {
            GgmlType::Q4_0 => Self::Q4_0,
            GgmlType::Q4_1 => Self::Q4_1,
            GgmlType::Q5_0 => Self::Q5_0,
            GgmlType::Q5_1 => Self::Q5_1,
            GgmlType::Q8_0 => Self::Q8_0,
            GgmlType::Q2K => Self::Q2K,
            GgmlType::Q3K => Self::Q3K,
            GgmlType::Q4K => Self::Q4K,
            GgmlType::Q5K => Self::Q5K,
            GgmlType::Q6K => Self::Q6K,
            GgmlType::Q8K => Self::Q8K,
            _ => return None,
        })
    }

    /// The GGUF tensor type.
    pub fn ggml(self) -> GgmlType {
        match self {
            Self::Q4_0 => GgmlType::Q4_0,
            Self::Q4_1 => GgmlType::Q4_1,
            Self::Q5_0 => GgmlType::Q5_0,
            Self::Q5_1 => GgmlType::Q5_1,
            Self::Q8_0 => GgmlType::Q8_0,
            Self::Q2K => GgmlType::Q2K,
            Self::Q3K => GgmlType::Q3K,
            Self::Q4K => GgmlType::Q4K,
            Self::Q5K => GgmlType::Q5K,
            Self::Q6K => GgmlType::Q6K,
            Self::Q8K => GgmlType::Q8K,
        }
    }

    /// llama.cpp's name (`Q4_K`, ...).
    pub fn name(self) -> &'static str {
        self.ggml().name()
    }

    /// Elements per block (32 or 256).
    pub fn block_len(self) -> usize {
        self.layout().0
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        self.layout().1
    }

    fn layout(self) -> (usize, usize) {
        // Every QuantType has a block layout in GgmlType.
        self.ggml().block_layout().unwrap_or((1, 0))
    }

    /// True when the decoded form has a non-zero offset `b` (a minimum).
    pub fn has_offset(self) -> bool {
        matches!(
            self,
            Self::Q4_1 | Self::Q5_1 | Self::Q2K | Self::Q4K | Self::Q5K
        )
    }

    fn decoder(self) -> Decoder {
        match self {
            Self::Q4_0 => legacy::decode_q4_0,
            Self::Q4_1 => legacy::decode_q4_1,
            Self::Q5_0 => legacy::decode_q5_0,
            Self::Q5_1 => legacy::decode_q5_1,
            Self::Q8_0 => legacy::decode_q8_0,
            Self::Q2K => kquants::decode_q2_k,
            Self::Q3K => kquants::decode_q3_k,
            Self::Q4K => kquants::decode_q4_k,
            Self::Q5K => kquants::decode_q5_k,
            Self::Q6K => kquants::decode_q6_k,
            Self::Q8K => kquants::decode_q8_k,
        }
    }

    fn encoder(self) -> Encoder {
        match self {
            Self::Q4_0 => legacy::encode_q4_0,
            Self::Q4_1 => legacy::encode_q4_1,
            Self::Q5_0 => legacy::encode_q5_0,
            Self::Q5_1 => legacy::encode_q5_1,
            Self::Q8_0 => legacy::encode_q8_0,
            Self::Q2K => kquants::encode_q2_k,
            Self::Q3K => kquants::encode_q3_k,
            Self::Q4K => kquants::encode_q4_k,
            Self::Q5K => kquants::encode_q5_k,
            Self::Q6K => kquants::encode_q6_k,
            Self::Q8K => kquants::encode_q8_k,
        }
    }

    /// Bytes of `n` elements, or an error when `n` is not whole blocks.
    pub fn bytes_for(self, n: usize) -> Result<usize> {
        if !n.is_multiple_of(self.block_len()) {
            return Err(LoaderError::Malformed(format!(
                "{} needs a multiple of {} values, got {n}",
                self.name(),
                self.block_len()
            )));
        }
        Ok(n / self.block_len() * self.block_bytes())
    }
}

/// Decodes whole blocks: `bytes` holds `q.len() / block_len` blocks, `a` and
/// `b` hold `q.len() / 16` values. Panics if the lengths disagree (callers
/// size them from the tensor's shape, checked at load).
pub fn decode_row(ty: QuantType, bytes: &[u8], q: &mut [i8], a: &mut [f32], b: &mut [f32]) {
    let (bl, bb) = (ty.block_len(), ty.block_bytes());
    let blocks = q.len() / bl;
    assert!(
        q.len() == blocks * bl
            && bytes.len() == blocks * bb
            && a.len() == q.len() / GROUP
            && b.len() == a.len(),
        "decode_row: inconsistent lengths"
    );
    let dec = ty.decoder();
    let g = bl / GROUP;
    for (i, blk) in bytes.chunks_exact(bb).enumerate() {
        dec(
            blk,
            &mut q[i * bl..(i + 1) * bl],
            &mut a[i * g..(i + 1) * g],
            &mut b[i * g..(i + 1) * g],
        );
    }
}

/// Dequantizes whole blocks into `out` (`out.len()` elements; panics on a
/// length mismatch like [`decode_row`]).
pub fn dequantize_row(ty: QuantType, bytes: &[u8], out: &mut [f32]) {
    let (bl, bb) = (ty.block_len(), ty.block_bytes());
    assert!(
        out.len().is_multiple_of(bl) && bytes.len() == out.len() / bl * bb,
        "dequantize_row: inconsistent lengths"
    );
    let dec = ty.decoder();
    let g = bl / GROUP;
    let mut q = [0i8; 256];
    let (mut a, mut b) = ([0f32; 16], [0f32; 16]);
    for (blk, o) in bytes.chunks_exact(bb).zip(out.chunks_exact_mut(bl)) {
        dec(blk, &mut q[..bl], &mut a[..g], &mut b[..g]);
        for (gi, (og, qg)) in o
            .chunks_exact_mut(GROUP)
            .zip(q.chunks_exact(GROUP))
            .enumerate()
        {
            for (x, &v) in og.iter_mut().zip(qg) {
                *x = a[gi] * f32::from(v) + b[gi];
            }
        }
    }
}

/// Quantizes `values` (a whole number of blocks) to `ty`.
pub fn quantize(ty: QuantType, values: &[f32]) -> Result<Vec<u8>> {
    let mut out = Vec::with_capacity(ty.bytes_for(values.len())?);
    let enc = ty.encoder();
    for blk in values.chunks_exact(ty.block_len()) {
        enc(blk, &mut out);
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
