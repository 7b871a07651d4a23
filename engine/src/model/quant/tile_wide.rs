//! Decoders straight into the lane kernel's form ([`super::tile::Tile::w16`]:
//! the true levels as i16, one scale per 32-block) for the types whose
//! levels have no minimum and one scale per 32 values: `Q4_0`, `Q5_0` and
//! `Q8_0` (in a Q4_K_M file, `Q5_0` holds most matrices whose width is not
//! a multiple of 256 and `Q8_0` the output head).
//!
//! Why: the general path decodes to unsigned bytes with every scale
//! spread for the row-major kernels, then widens the bytes in a second
//! pass; at batch 32 a tile is used for only 32 activation rows, so that
//! work was about a fifth of the lane kernel's time. Here one pass does
//! it: nibbles zero-extended to i16 lanes, `Q5_0`'s fifth bits expanded by
//! a compare against per-lane bit masks, the offset subtracted, stored.
//!
//! Invariants: the results equal [`super::tile::Tile::decode`] followed by
//! [`super::tile::Tile::widen`] on every value the lane kernel reads (the
//! levels, and `a8[8 c]`, the scale of block `c`; tested bit for bit).
//! Cost: O(k) per row, no allocation.

use half::f16;
use model_loader::QuantType;

/// True when `ty` has a wide decoder.
pub fn supported(ty: QuantType) -> bool {
    matches!(ty, QuantType::Q4_0 | QuantType::Q5_0 | QuantType::Q8_0)
}

/// Decodes one row of `ty` (`row`: its blocks) into `w16` (`k` levels)
/// and the block scales `a8[8 c]` (the other entries of `a8` are left
/// alone). Returns false, touching nothing, for other types or
/// inconsistent lengths.
pub fn decode_row(ty: QuantType, row: &[u8], w16: &mut [i16], a8: &mut [f32]) -> bool {
    let (bytes, k) = match ty {
        QuantType::Q4_0 => (18, w16.len()),
        QuantType::Q5_0 => (22, w16.len()),
        QuantType::Q8_0 => (34, w16.len()),
        _ => return false,
    };
    let blocks = k / 32;
    if k != blocks * 32 || row.len() != blocks * bytes || a8.len() < blocks * 8 {
        return false;
    }
    for (c, (blk, out)) in row
        .chunks_exact(bytes)
        .zip(w16.chunks_exact_mut(32))
        .enumerate()
    {
        a8[8 * c] = f16::from_le_bytes([blk[0], blk[1]]).to_f32();
        let out: &mut [i16; 32] = match out.try_into() {
            Ok(o) => o,
            Err(_) => unreachable!("chunks of 32"),
        };
        match ty {
            QuantType::Q4_0 => nibbles(&blk[2..18], None, 8, out),
            QuantType::Q5_0 => {
                let qh = u32::from_le_bytes([blk[2], blk[3], blk[4], blk[5]]);
                nibbles(&blk[6..22], Some(qh), 16, out);
            }
            _ => bytes_i8(&blk[2..34], out),
        }
    }
    true
}

/// Legacy nibble order (byte `j`: element `j` low, `j + 16` high), plus
/// bit `j` of `qh` as bit 4 of element `j` when given, minus `off`.
#[inline(always)]
fn nibbles(qs: &[u8], qh: Option<u32>, off: i16, out: &mut [i16; 32]) {
    #[cfg(all(target_arch = "x86_64", target_feature = "avx2"))]
    {
        assert!(qs.len() >= 16, "a block's 16 nibble bytes");
        // SAFETY: AVX2 is enabled at compile time (the cfg); `qs` holds
        // 16 bytes (asserted) and `out` 32 i16.
        unsafe { x86::nibbles(qs, qh, off, out) };
    }
    #[cfg(not(all(target_arch = "x86_64", target_feature = "avx2")))]
    nibbles_portable(qs, qh, off, out);
}

/// The portable [`nibbles`] (the reference of the tests).
#[cfg_attr(
    all(target_arch = "x86_64", target_feature = "avx2"),
    allow(dead_code) // only the tests call it there
)]
fn nibbles_portable(qs: &[u8], qh: Option<u32>, off: i16, out: &mut [i16; 32]) {
    let h = qh.unwrap_or(0);
    for j in 0..16 {
        let bit = |i: usize| (((h >> i) & 1) << 4) as i16;
        out[j] = i16::from(qs[j] & 0x0f) + bit(j) - off;
        out[j + 16] = i16::from(qs[j] >> 4) + bit(j + 16) - off;
    }
}

/// `Q8_0`'s signed bytes, sign-extended.
#[inline(always)]
fn bytes_i8(qs: &[u8], out: &mut [i16; 32]) {
    for (o, &b) in out.iter_mut().zip(qs) {
        *o = i16::from(b as i8);
    }
}

#[cfg(all(target_arch = "x86_64", target_feature = "avx2"))]
mod x86 {
    use std::arch::x86_64::*;

    /// [`super::nibbles`] in AVX2: 16 i16 lanes per half; the fifth bits
    /// by `(broadcast(qh half) & (1 << lane)) == (1 << lane)`.
    ///
    /// # Safety
    /// AVX2; `qs` holds at least 16 bytes.
    #[inline(always)]
    pub(super) unsafe fn nibbles(qs: &[u8], qh: Option<u32>, off: i16, out: &mut [i16; 32]) {
        // SAFETY: the caller's contract (16 readable bytes at qs, AVX2);
        // out is 64 bytes, written as two unaligned 32-byte stores.
        unsafe {
            let x = _mm256_cvtepu8_epi16(_mm_loadu_si128(qs.as_ptr().cast()));
            let low = _mm256_and_si256(x, _mm256_set1_epi16(0x0f));
            let high = _mm256_srli_epi16::<4>(x);
            let offv = _mm256_set1_epi16(off);
            let (mut lo, mut hi) = (_mm256_sub_epi16(low, offv), _mm256_sub_epi16(high, offv));
            if let Some(h) = qh {
                let bits = _mm256_setr_epi16(
                    1,
                    2,
                    4,
                    8,
                    16,
                    32,
                    64,
                    128,
                    256,
                    512,
                    1024,
                    2048,
                    4096,
                    8192,
                    16384,
                    i16::MIN,
                );
                let sixteen = _mm256_set1_epi16(16);
                let fifth = |half: u32| {
                    let b = _mm256_set1_epi16(half as u16 as i16);
                    let set = _mm256_cmpeq_epi16(_mm256_and_si256(b, bits), bits);
                    _mm256_and_si256(set, sixteen)
                };
                lo = _mm256_add_epi16(lo, fifth(h & 0xffff));
                hi = _mm256_add_epi16(hi, fifth(h >> 16));
            }
            let o = out.as_mut_ptr().cast::<__m256i>();
            _mm256_storeu_si256(o, lo);
            _mm256_storeu_si256(o.add(1), hi);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vector_nibbles_equal_the_portable_form() {
        let qs: Vec<u8> = (0..16u8)
            .map(|i| i.wrapping_mul(37).wrapping_add(11))
            .collect();
        for qh in [
            None,
            Some(0),
            Some(u32::MAX),
            Some(0x8001_7f3c),
            Some(0x1234_5678),
        ] {
            for off in [8, 16] {
                let (mut fast, mut slow) = ([0i16; 32], [0i16; 32]);
                nibbles(&qs, qh, off, &mut fast);
                nibbles_portable(&qs, qh, off, &mut slow);
                assert_eq!(fast, slow, "qh {qh:?} off {off}");
            }
        }
    }

    #[test]
    fn other_types_and_bad_lengths_are_refused() {
        let mut w = [0i16; 32];
        let mut a = [0f32; 8];
        assert!(!decode_row(QuantType::Q4_1, &[0; 20], &mut w, &mut a));
        assert!(!decode_row(QuantType::Q5_0, &[0; 21], &mut w, &mut a));
        assert!(!decode_row(QuantType::Q8_0, &[0; 34], &mut w[..16], &mut a));
    }
}
