//! Dequantization of GGUF tensor data to f32: the float types here, the
//! block-quantized ones through [`crate::quant`] (one decoder per layout).
//! Every function is O(n) and checks that the byte length matches the
//! element count before touching data.

use half::{bf16, f16};

use crate::error::{LoaderError, Result};
use crate::gguf::GgmlType;
use crate::quant::{self, QuantType};

/// Elements per legacy quantized block.
pub const QK: usize = 32;

/// Dequantizes `n` elements of type `ty` from `bytes`.
pub fn dequantize(ty: GgmlType, bytes: &[u8], n: usize, tensor: &str) -> Result<Vec<f32>> {
    let (block, _) = ty.block_layout().ok_or_else(|| ty.unsupported(tensor))?;
    let expected = ty.byte_size(n, if n.is_multiple_of(block) { block } else { n }, tensor)?;
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
        other => match QuantType::from_ggml(other) {
            Some(q) => quant::dequantize_row(q, bytes, &mut out),
            None => return Err(ty.unsupported(tensor)),
        },
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

/// Quantizes f32 values to `Q8_0` the way llama.cpp does (`d = amax / 127`,
/// round to nearest). `values.len()` must be a multiple of 32 (checked).
pub fn quantize_q8_0(values: &[f32]) -> Result<Vec<u8>> {
    quant::quantize(QuantType::Q8_0, values)
}

/// Encodes f32 values as `ty` (any readable type; quantized types need whole
/// blocks).
pub fn encode(ty: GgmlType, values: &[f32], tensor: &str) -> Result<Vec<u8>> {
    Ok(match ty {
        GgmlType::F32 => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        GgmlType::F16 => values
            .iter()
            .flat_map(|v| f16::from_f32(*v).to_le_bytes())
            .collect(),
        GgmlType::Bf16 => values
            .iter()
            .flat_map(|v| bf16::from_f32(*v).to_le_bytes())
            .collect(),
        other => match QuantType::from_ggml(other) {
            Some(q) => quant::quantize(q, values)?,
            None => return Err(ty.unsupported(tensor)),
        },
    })
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
        let err = dequantize(GgmlType::from_id(16), &[], 256, "blk.0.x").unwrap_err();
        assert!(err.to_string().contains("IQ2_XXS"), "{err}");
    }
}
