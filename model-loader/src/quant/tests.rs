use super::*;

/// Deterministic values in (-1, 1) with magnitudes varying per 32.
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|i| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let u = (s >> 40) as f32 / (1u64 << 24) as f32;
            (u * 2.0 - 1.0) * (0.05 + ((i / 32) % 7) as f32 * 0.15)
        })
        .collect()
}

fn rel_rms(x: &[f32], y: &[f32]) -> f64 {
    let e: f64 = x.iter().zip(y).map(|(a, b)| f64::from(a - b).powi(2)).sum();
    let s: f64 = x.iter().map(|a| f64::from(*a).powi(2)).sum();
    (e / s).sqrt()
}

/// Round trip f32 -> type -> f32: relative RMS error under a per-type bound
/// (about 1.3x what our encoders reach on this data).
#[test]
fn round_trip_error_is_bounded_for_every_type() {
    let bounds = [
        (QuantType::Q4_0, 0.09),
        (QuantType::Q4_1, 0.08),
        (QuantType::Q5_0, 0.04),
        (QuantType::Q5_1, 0.04),
        (QuantType::Q8_0, 0.005),
        (QuantType::Q2K, 0.35),
        (QuantType::Q3K, 0.18),
        (QuantType::Q4K, 0.085),
        (QuantType::Q5K, 0.04),
        (QuantType::Q6K, 0.02),
        (QuantType::Q8K, 0.0085),
    ];
    for (ty, bound) in bounds {
        let x = values(1024, ty as u64 + 1);
        let bytes = quantize(ty, &x).unwrap();
        assert_eq!(bytes.len(), 1024 / ty.block_len() * ty.block_bytes());
        let mut back = vec![0f32; x.len()];
        dequantize_row(ty, &bytes, &mut back);
        let e = rel_rms(&x, &back);
        assert!(e < bound, "{}: relative rms {e} >= {bound}", ty.name());
        assert!(e > 0.0 || ty == QuantType::Q8K, "{}: lossless?", ty.name());
    }
}

#[test]
fn decode_row_and_dequantize_agree() {
    for ty in QuantType::ALL {
        let x = values(512, 99);
        let bytes = quantize(ty, &x).unwrap();
        let (mut q, mut a, mut b) = (vec![0i8; 512], vec![0f32; 32], vec![0f32; 32]);
        decode_row(ty, &bytes, &mut q, &mut a, &mut b);
        let mut want = vec![0f32; 512];
        dequantize_row(ty, &bytes, &mut want);
        for i in 0..512 {
            let g = i / GROUP;
            assert_eq!(
                a[g] * f32::from(q[i]) + b[g],
                want[i],
                "{} [{i}]",
                ty.name()
            );
        }
        if !ty.has_offset() {
            assert!(b.iter().all(|&v| v == 0.0), "{} offset", ty.name());
        }
    }
}

#[test]
fn zero_blocks_decode_to_zero() {
    for ty in QuantType::ALL {
        let bytes = quantize(ty, &[0.0; 256]).unwrap();
        let mut back = vec![1f32; 256];
        dequantize_row(ty, &bytes, &mut back);
        assert!(back.iter().all(|&v| v == 0.0), "{}", ty.name());
    }
}

#[test]
fn q8_k_block_by_hand() {
    // d = 0.5 (f32), q = i - 128 wrapped into i8, bsums ignored by readers.
    let mut blk = 0.5f32.to_le_bytes().to_vec();
    blk.extend((0..256).map(|i| (i as u8).wrapping_sub(128)));
    blk.extend([0u8; 32]);
    let mut out = vec![0f32; 256];
    dequantize_row(QuantType::Q8K, &blk, &mut out);
    assert_eq!(out[0], -64.0);
    assert_eq!(out[255], 63.5);
    // Our encoder's bsums are the sums of each 16 levels.
    let enc = quantize(QuantType::Q8K, &values(256, 5)).unwrap();
    let qsum: i32 = enc[4..20].iter().map(|&v| i32::from(v as i8)).sum();
    assert_eq!(i32::from(i16::from_le_bytes([enc[260], enc[261]])), qsum);
}

#[test]
fn partial_blocks_are_refused() {
    let err = quantize(QuantType::Q4K, &[0.0; 255]).unwrap_err();
    assert!(err.to_string().contains("Q4_K"), "{err}");
}
