//! Dequantization of GGUF tensor data to f32, one function per type.
//!
//! Block formats (llama.cpp `ggml-common.h`), 32 elements per block:
//! - `Q4_0`: f16 scale `d`, 16 bytes of nibbles; `x = (q - 8) * d`.
//! - `Q4_1`: f16 `d`, f16 min `m`, 16 bytes of nibbles; `x = q * d + m`.
//! - `Q8_0`: f16 `d`, 32 signed bytes; `x = q * d`.
//!
//! Nibble order: byte `j` holds element `j` in its low nibble and element
//! `j + 16` in its high nibble. Every function is O(n) and checks that the
//! byte length matches the element count before touching data.

use half::{bf16, f16};

use crate::error::{LoaderError, Result};
use crate::gguf::GgmlType;

/// Elements per quantized block.
pub const QK: usize = 32;

/// Dequantizes `n` elements of type `ty` from `bytes`.
pub fn dequantize(ty: GgmlType, bytes: &[u8], n: usize, tensor: &str) -> Result<Vec<f32>> {
    let expected = ty.byte_size(n, if n.is_multiple_of(QK) { QK } else { n }, tensor)?;
    if bytes.len() != expected {
        return Err(LoaderError::Malformed(format!(
            "tensor {tensor}: {} bytes for {n} {} elements (expected {expected})",
            bytes.len(),
            ty.name()
        )));
    }
    let mut out = vec![0f32; n];
    match ty {
        GgmlType::F32 => dequant_f32(bytes, &mut out),
        GgmlType::F16 => dequant_f16(bytes, &mut out),
        GgmlType::Bf16 => dequant_bf16(bytes, &mut out),
        GgmlType::Q4_0 => dequant_q4_0(bytes, &mut out),
        GgmlType::Q4_1 => dequant_q4_1(bytes, &mut out),
        GgmlType::Q8_0 => dequant_q8_0(bytes, &mut out),
        GgmlType::Other(_) => return Err(ty.unsupported(tensor)),
    }
    Ok(out)
}

/// Little-endian f32 values.
pub fn dequant_f32(bytes: &[u8], out: &mut [f32]) {
    for (o, b) in out.iter_mut().zip(bytes.chunks_exact(4)) {
        *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    }
}

/// Little-endian IEEE half values.
pub fn dequant_f16(bytes: &[u8], out: &mut [f32]) {
    for (o, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
        *o = f16::from_le_bytes([b[0], b[1]]).to_f32();
    }
}

/// Little-endian bfloat16 values.
pub fn dequant_bf16(bytes: &[u8], out: &mut [f32]) {
    for (o, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
        *o = bf16::from_le_bytes([b[0], b[1]]).to_f32();
    }
}

fn half_at(b: &[u8], i: usize) -> f32 {
    f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

/// `Q4_0` blocks (18 bytes each).
pub fn dequant_q4_0(bytes: &[u8], out: &mut [f32]) {
    for (blk, o) in bytes.chunks_exact(18).zip(out.chunks_exact_mut(QK)) {
        let d = half_at(blk, 0);
        for j in 0..16 {
            let q = blk[2 + j];
            o[j] = (i32::from(q & 0x0f) - 8) as f32 * d;
            o[j + 16] = (i32::from(q >> 4) - 8) as f32 * d;
        }
    }
}

/// `Q4_1` blocks (20 bytes each).
pub fn dequant_q4_1(bytes: &[u8], out: &mut [f32]) {
    for (blk, o) in bytes.chunks_exact(20).zip(out.chunks_exact_mut(QK)) {
        let d = half_at(blk, 0);
        let m = half_at(blk, 2);
        for j in 0..16 {
            let q = blk[4 + j];
            o[j] = f32::from(q & 0x0f) * d + m;
            o[j + 16] = f32::from(q >> 4) * d + m;
        }
    }
}

/// `Q8_0` blocks (34 bytes each).
pub fn dequant_q8_0(bytes: &[u8], out: &mut [f32]) {
    for (blk, o) in bytes.chunks_exact(34).zip(out.chunks_exact_mut(QK)) {
        let d = half_at(blk, 0);
        for j in 0..QK {
            o[j] = f32::from(blk[2 + j] as i8) * d;
        }
    }
}

/// Quantizes f32 values to `Q8_0` the way llama.cpp does (`d = amax / 127`,
/// round to nearest). `values.len()` must be a multiple of 32 (checked).
pub fn quantize_q8_0(values: &[f32]) -> Result<Vec<u8>> {
    if !values.len().is_multiple_of(QK) {
        return Err(LoaderError::Malformed(format!(
            "Q8_0 needs a multiple of {QK} values, got {}",
            values.len()
        )));
    }
    let mut out = Vec::with_capacity(values.len() / QK * 34);
    for blk in values.chunks_exact(QK) {
        let amax = blk.iter().fold(0f32, |a, v| a.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        out.extend_from_slice(&f16::from_f32(d).to_le_bytes());
        out.extend(blk.iter().map(|v| (v * id).round() as i8 as u8));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q4_1_block_by_hand() {
        // d = 0.5, m = -1.0, byte j = (j+1) << 4 | j  (low nibble j, high j+1)
        let mut blk = Vec::new();
        blk.extend_from_slice(&f16::from_f32(0.5).to_le_bytes());
        blk.extend_from_slice(&f16::from_f32(-1.0).to_le_bytes());
        for j in 0..16u8 {
            blk.push(((j + 1) & 0x0f) << 4 | j);
        }
        let v = dequantize(GgmlType::Q4_1, &blk, 32, "t").unwrap();
        assert_eq!(v[0], -1.0);
        assert_eq!(v[3], 0.5);
        assert_eq!(v[16], -0.5); // high nibble of byte 0 is 1
        assert_eq!(v[31], -1.0); // high nibble of byte 15 is (16 & 15) = 0
    }

    #[test]
    fn q4_0_block_by_hand() {
        let mut blk = Vec::new();
        blk.extend_from_slice(&f16::from_f32(2.0).to_le_bytes());
        blk.extend(std::iter::repeat_n(0xf0u8, 16)); // low 0 -> -8, high 15 -> 7
        let v = dequantize(GgmlType::Q4_0, &blk, 32, "t").unwrap();
        assert_eq!(v[0], -16.0);
        assert_eq!(v[16], 14.0);
    }

    #[test]
    fn q8_0_roundtrip_is_close() {
        let vals: Vec<f32> = (0..64).map(|i| (i as f32 - 31.5) / 10.0).collect();
        let q = quantize_q8_0(&vals).unwrap();
        assert_eq!(q.len(), 68);
        let back = dequantize(GgmlType::Q8_0, &q, 64, "t").unwrap();
        for (a, b) in vals.iter().zip(&back) {
            assert!((a - b).abs() < 3.2 / 127.0, "{a} vs {b}");
        }
    }

    #[test]
    fn half_types() {
        let bytes: Vec<u8> = [1.5f32, -2.25]
            .iter()
            .flat_map(|v| f16::from_f32(*v).to_le_bytes())
            .collect();
        assert_eq!(
            dequantize(GgmlType::F16, &bytes, 2, "t").unwrap(),
            vec![1.5, -2.25]
        );
        let bytes: Vec<u8> = [1.5f32, -2.25]
            .iter()
            .flat_map(|v| bf16::from_f32(*v).to_le_bytes())
            .collect();
        assert_eq!(
            dequantize(GgmlType::Bf16, &bytes, 2, "t").unwrap(),
            vec![1.5, -2.25]
        );
    }

    #[test]
    fn wrong_length_is_an_error() {
        let err = dequantize(GgmlType::Q8_0, &[0u8; 33], 32, "t").unwrap_err();
        assert!(matches!(err, LoaderError::Malformed(_)), "{err}");
    }

    #[test]
    fn other_types_are_refused_by_name() {
        let err = dequantize(GgmlType::from_id(12), &[], 256, "blk.0.x").unwrap_err();
        assert!(err.to_string().contains("Q4_K"), "{err}");
    }
}
