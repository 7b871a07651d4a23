//! Decoders straight into the lane kernel's form ([`super::tile::Tile::w16`]
//! levels as i16, the scales `a8[8 c]` of each 32-block `c` (and
//! `a8[8 c + 4]` of its second 16-half for `Q6_K`), and for the types with
//! a minimum the per-16 offsets `bb`) for the common file types: `Q4_0`,
//! `Q4_1`, `Q5_0`, `Q5_1`, `Q8_0`, `Q4_K`, `Q5_K`, `Q6_K` (a Q4_K_M file is made of
//! `Q5_0` for matrices whose width is not a multiple of 256, `Q4_K` /
//! `Q6_K` for the rest and `Q8_0` for the output head).
//!
//! Why: the general path decodes to unsigned bytes with every scale
//! spread for the row-major kernels, then widens the bytes in a second
//! pass; at batch 32 a tile is used for only 32 activation rows, so that
//! work was about a fifth of the lane kernel's time. Here one pass does
//! it: nibbles zero-extended to i16 lanes, `Q5_*`'s fifth bits expanded by
//! a compare against per-lane bit masks, the offset of the types without a
//! minimum subtracted (their levels are the true signed ones), stored.
//!
//! Invariants: the results equal [`super::tile::Tile::decode`] followed by
//! [`super::tile::Tile::widen`] on every value the lane kernel reads
//! (tested bit for bit). Cost: O(k) per row, no allocation.

use model_loader::quant::scale_min_k4;
use model_loader::QuantType;

use super::f16_at;
use super::tile::fold;

/// True when `ty` has a wide decoder.
pub fn supported(ty: QuantType) -> bool {
    layout(ty).is_some()
}

/// (block bytes, values per block) of the types with a wide decoder.
fn layout(ty: QuantType) -> Option<(usize, usize)> {
    Some(match ty {
        QuantType::Q4_0 => (18, 32),
        QuantType::Q4_1 => (20, 32),
        QuantType::Q5_0 => (22, 32),
        QuantType::Q5_1 => (24, 32),
        QuantType::Q8_0 => (34, 32),
        QuantType::Q4K => (144, 256),
        QuantType::Q5K => (176, 256),
        QuantType::Q6K => (210, 256),
        _ => return None,
    })
}

/// Decodes one row of `ty` (`row`: its blocks) into `w16` (`k` levels),
/// the scales the lane kernel reads in `a8` (`k / 4` entries) and, for
/// the types with a minimum, the offsets `bb` (`k / 16`). Returns false,
/// touching nothing, for other types or inconsistent lengths.
///
/// `wide` lets the 32-value types (`Q4_0`, `Q4_1`, `Q5_0`, `Q5_1`,
/// `Q8_0`) use 512-bit registers where the CPU has AVX-512 BW
/// ([`super::kernels::has_avx512_bw`]): the same values in about half the instructions.
/// Batch-32 `Q5_0` products from L2 ran ~5% faster (`gemv_bench --rows=32
/// --l2`); in a model step the decode's share barely moved, its loads
/// waiting on the weights from DRAM. False keeps AVX2 (to measure the
/// AVX2 path on an AVX-512 machine).
pub fn decode_row(
    ty: QuantType,
    row: &[u8],
    w16: &mut [i16],
    a8: &mut [f32],
    bb: &mut [f32],
    wide: bool,
) -> bool {
    let Some((bytes, len)) = layout(ty) else {
        return false;
    };
    let (k, blocks) = (w16.len(), w16.len() / len);
    if k != blocks * len || row.len() != blocks * bytes || a8.len() != k / 4 || bb.len() != k / 16 {
        return false;
    }
    #[cfg(target_arch = "x86_64")]
    if wide && super::kernels::has_avx512_bw() {
        // SAFETY: AVX-512 F/BW, AVX2 and F16C checked at run time by
        // `has_avx512_bw`; the lengths are checked above.
        if unsafe { zmm::decode_small(ty, row, w16, a8, bb) } {
            return true;
        }
    }
    // Only x86 has the 512-bit forms.
    let _ = wide;
    // One loop per type (the closures inline into it): a `match` on the
    // type per block cost as much as the decoding of a 32-value block.
    match ty {
        QuantType::Q4_0 => each_block::<18, 32>(row, w16, a8, bb, |blk, w, a8, _| {
            a8[0] = f16_at(blk, 0);
            nibbles(&blk[2..18], None, 8, arr32(w));
        }),
        QuantType::Q4_1 => each_block::<20, 32>(row, w16, a8, bb, |blk, w, a8, bb| {
            let d = f16_at(blk, 0);
            a8[0] = d;
            bb.fill(fold(d, f16_at(blk, 2), 0.0));
            nibbles(&blk[4..20], None, 0, arr32(w));
        }),
        QuantType::Q5_0 => each_block::<22, 32>(row, w16, a8, bb, |blk, w, a8, _| {
            a8[0] = f16_at(blk, 0);
            nibbles(&blk[6..22], Some(u32_at(blk, 2)), 16, arr32(w));
        }),
        QuantType::Q5_1 => each_block::<24, 32>(row, w16, a8, bb, |blk, w, a8, bb| {
            let d = f16_at(blk, 0);
            a8[0] = d;
            bb.fill(fold(d, f16_at(blk, 2), 0.0));
            nibbles(&blk[8..24], Some(u32_at(blk, 4)), 0, arr32(w));
        }),
        QuantType::Q8_0 => each_block::<34, 32>(row, w16, a8, bb, |blk, w, a8, _| {
            a8[0] = f16_at(blk, 0);
            bytes_i8(&blk[2..34], arr32(w));
        }),
        QuantType::Q4K => each_block::<144, 256>(row, w16, a8, bb, |blk, w, a8, bb| {
            q4k::<false>(blk, &blk[16..144], w, a8, bb)
        }),
        QuantType::Q5K => each_block::<176, 256>(row, w16, a8, bb, |blk, w, a8, bb| {
            q4k::<true>(blk, &blk[48..176], w, a8, bb)
        }),
        QuantType::Q6K => each_block::<210, 256>(row, w16, a8, bb, |blk, w, a8, _| q6k(blk, w, a8)),
        _ => return false,
    }
    true
}

/// Runs `f` on each block of `row` (`BYTES` bytes, `LEN` values) with its
/// `LEN` levels, `LEN / 4` scale slots and `LEN / 16` offsets.
#[inline(always)]
fn each_block<const BYTES: usize, const LEN: usize>(
    row: &[u8],
    w16: &mut [i16],
    a8: &mut [f32],
    bb: &mut [f32],
    f: impl Fn(&[u8; BYTES], &mut [i16; LEN], &mut [f32], &mut [f32]),
) {
    for (((blk, w), a8), bb) in row
        .chunks_exact(BYTES)
        .zip(w16.chunks_exact_mut(LEN))
        .zip(a8.chunks_exact_mut(LEN / 4))
        .zip(bb.chunks_exact_mut(LEN / 16))
    {
        match (blk.try_into(), w.try_into()) {
            (Ok(blk), Ok(w)) => f(blk, w, a8, bb),
            _ => unreachable!("chunks of the arrays' lengths"),
        }
    }
}

fn u32_at(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]])
}

/// The first 32 levels of `w` as an array (callers pass 32-value blocks).
#[inline(always)]
fn arr32(w: &mut [i16]) -> &mut [i16; 32] {
    match w.get_mut(..32).and_then(|w| w.try_into().ok()) {
        Some(a) => a,
        None => unreachable!("blocks of at least 32 values"),
    }
}

/// `Q4_K` and (`Q5`) `Q5_K`: eight 32-blocks, each one scale and one
/// minimum (6-bit each, times the super-block's `d` and `dmin`), levels
/// 0..=15 in 64-value chunks of `qs` (low nibbles, then high); `Q5_K`
/// adds bit `j` of `qh[l]` (bytes 16..48) as bit 4 of value `l` of
/// 32-block `j`.
#[inline(always)]
fn q4k<const Q5: bool>(blk: &[u8], qs: &[u8], w: &mut [i16], a8: &mut [f32], bb: &mut [f32]) {
    let (d, dmin) = (f16_at(blk, 0), f16_at(blk, 2));
    for j in 0..8 {
        let (sc, m) = scale_min_k4(&blk[4..16], j);
        let (av, bv) = (d * f32::from(sc), -(dmin * f32::from(m)));
        a8[8 * j] = av;
        bb[2 * j] = fold(av, bv, 0.0);
        bb[2 * j + 1] = fold(av, bv, 0.0);
    }
    let qh: &[u8; 32] = match blk[16..48].try_into() {
        Ok(q) => q,
        Err(_) => unreachable!("32 bytes"),
    };
    for c in 0..4 {
        let qs: &[u8; 32] = match qs[c * 32..c * 32 + 32].try_into() {
            Ok(q) => q,
            Err(_) => unreachable!("32 bytes"),
        };
        let out = &mut w[c * 64..c * 64 + 64];
        for l in 0..32 {
            out[l] = i16::from(qs[l] & 0x0f);
            out[32 + l] = i16::from(qs[l] >> 4);
            if Q5 {
                out[l] |= i16::from((qh[l] >> (2 * c)) & 1) << 4;
                out[32 + l] |= i16::from((qh[l] >> (2 * c + 1)) & 1) << 4;
            }
        }
    }
}

/// `Q6_K`: sixteen 16-value scales (signed 8-bit times `d`), levels
/// `(low 4 bits | high 2 bits << 4) - 32`.
#[inline(always)]
fn q6k(blk: &[u8], w: &mut [i16], a8: &mut [f32]) {
    let d = f16_at(blk, 208);
    for g in 0..16 {
        a8[4 * g] = d * f32::from(blk[192 + g] as i8);
    }
    for hh in 0..2 {
        let qh: &[u8; 32] = match blk[128 + hh * 32..160 + hh * 32].try_into() {
            Ok(q) => q,
            Err(_) => unreachable!("32 bytes"),
        };
        for qq in 0..4 {
            let at = hh * 64 + (qq % 2) * 32;
            let ql: &[u8; 32] = match blk[at..at + 32].try_into() {
                Ok(q) => q,
                Err(_) => unreachable!("32 bytes"),
            };
            let out = &mut w[hh * 128 + qq * 32..hh * 128 + qq * 32 + 32];
            for l in 0..32 {
                let low = (ql[l] >> (4 * (qq / 2))) & 0x0f;
                let high = (qh[l] >> (2 * qq)) & 3;
                out[l] = i16::from(low | (high << 4)) - 32;
            }
        }
    }
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

/// `Q8_0`'s signed bytes, sign-extended (two `vpmovsxbw` with AVX2: the
/// scalar loop stayed byte by byte, ~a quarter of the one-pass decode's
/// time at batch 32 on a Q4_K_M file, whose output head is `Q8_0`).
#[inline(always)]
fn bytes_i8(qs: &[u8], out: &mut [i16; 32]) {
    #[cfg(all(target_arch = "x86_64", target_feature = "avx2"))]
    {
        assert!(qs.len() >= 32, "a block's 32 bytes");
        // SAFETY: AVX2 is enabled at compile time (the cfg); `qs` holds
        // 32 bytes (asserted) and `out` 32 i16.
        unsafe { x86::bytes_i8(qs, out) };
    }
    #[cfg(not(all(target_arch = "x86_64", target_feature = "avx2")))]
    bytes_i8_portable(qs, out);
}

/// The portable [`bytes_i8`] (the reference of the tests).
#[cfg_attr(
    all(target_arch = "x86_64", target_feature = "avx2"),
    allow(dead_code) // only the tests call it there
)]
fn bytes_i8_portable(qs: &[u8], out: &mut [i16; 32]) {
    for (o, &b) in out.iter_mut().zip(qs) {
        *o = i16::from(b as i8);
    }
}

/// The 512-bit decoders of the 32-value types.
#[cfg(target_arch = "x86_64")]
mod zmm {
    use std::arch::x86_64::*;

    use model_loader::QuantType;

    use super::super::f16_at;
    use super::super::tile::fold;
    use super::each_block;

    /// [`super::decode_row`] for `Q4_0`, `Q4_1`, `Q5_0`, `Q5_1` and `Q8_0`
    /// (false, touching nothing, for other types): per block one 512-bit
    /// store of its 32 levels.
    ///
    /// # Safety
    /// AVX-512 F and BW, AVX2 and F16C; the lengths agree as
    /// [`super::decode_row`] checks (`row` whole blocks of `ty`, `w16` 32
    /// levels per block, `a8` 8 and `bb` 2 entries per block).
    #[target_feature(enable = "avx512f,avx512bw,avx2,f16c")]
    pub(super) unsafe fn decode_small(
        ty: QuantType,
        row: &[u8],
        w16: &mut [i16],
        a8: &mut [f32],
        bb: &mut [f32],
    ) -> bool {
        match ty {
            QuantType::Q4_0 => each_block::<18, 32>(row, w16, a8, bb, |blk, w, a8, _| {
                a8[0] = f16_at(blk, 0);
                // SAFETY: the features are enabled (this function's).
                unsafe { nibbles(blk[2..18].as_ptr(), None, 8, w) };
            }),
            QuantType::Q4_1 => each_block::<20, 32>(row, w16, a8, bb, |blk, w, a8, bb| {
                let d = f16_at(blk, 0);
                a8[0] = d;
                bb.fill(fold(d, f16_at(blk, 2), 0.0));
                // SAFETY: as above.
                unsafe { nibbles(blk[4..20].as_ptr(), None, 0, w) };
            }),
            QuantType::Q5_0 => each_block::<22, 32>(row, w16, a8, bb, |blk, w, a8, _| {
                a8[0] = f16_at(blk, 0);
                let qh = super::u32_at(blk, 2);
                // SAFETY: as above.
                unsafe { nibbles(blk[6..22].as_ptr(), Some(qh), 16, w) };
            }),
            QuantType::Q5_1 => each_block::<24, 32>(row, w16, a8, bb, |blk, w, a8, bb| {
                let d = f16_at(blk, 0);
                a8[0] = d;
                bb.fill(fold(d, f16_at(blk, 2), 0.0));
                let qh = super::u32_at(blk, 4);
                // SAFETY: as above.
                unsafe { nibbles(blk[8..24].as_ptr(), Some(qh), 0, w) };
            }),
            QuantType::Q8_0 => each_block::<34, 32>(row, w16, a8, bb, |blk, w, a8, _| {
                a8[0] = f16_at(blk, 0);
                // SAFETY: 32 bytes at blk[2..34] into 32 i16; the features
                // are enabled.
                unsafe {
                    let x = _mm256_loadu_si256(blk[2..34].as_ptr().cast());
                    _mm512_storeu_si512(w.as_mut_ptr().cast(), _mm512_cvtepi8_epi16(x));
                }
            }),
            _ => return false,
        }
        true
    }

    /// [`super::nibbles`] in one zmm: the 16 bytes and their high nibbles
    /// side by side (bytes), masked to nibbles, zero-extended to 32 i16 in
    /// element order, minus `off`, plus 16 where bit `i` of `qh` is set
    /// (one masked add).
    ///
    /// # Safety
    /// AVX-512 F and BW, AVX2; 16 readable bytes at `qs`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx2")]
    unsafe fn nibbles(qs: *const u8, qh: Option<u32>, off: i16, out: &mut [i16; 32]) {
        // SAFETY: the caller's contract (16 bytes at qs); out is 64 bytes.
        unsafe {
            let x = _mm_loadu_si128(qs.cast());
            let both =
                _mm256_inserti128_si256::<1>(_mm256_castsi128_si256(x), _mm_srli_epi16::<4>(x));
            let nib = _mm256_and_si256(both, _mm256_set1_epi8(0x0f));
            let mut v = _mm512_sub_epi16(_mm512_cvtepu8_epi16(nib), _mm512_set1_epi16(off));
            if let Some(h) = qh {
                v = _mm512_mask_add_epi16(v, h, v, _mm512_set1_epi16(16));
            }
            _mm512_storeu_si512(out.as_mut_ptr().cast(), v);
        }
    }
}

#[cfg(all(target_arch = "x86_64", target_feature = "avx2"))]
mod x86 {
    use std::arch::x86_64::*;

    /// [`super::bytes_i8`] in AVX2: 16 bytes sign-extended per store.
    ///
    /// # Safety
    /// AVX2; `qs` holds at least 32 bytes.
    #[inline(always)]
    pub(super) unsafe fn bytes_i8(qs: &[u8], out: &mut [i16; 32]) {
        // SAFETY: the caller's contract (32 readable bytes at qs, AVX2);
        // out is 64 bytes, written as two unaligned 32-byte stores.
        unsafe {
            let p = qs.as_ptr().cast::<__m128i>();
            let o = out.as_mut_ptr().cast::<__m256i>();
            _mm256_storeu_si256(o, _mm256_cvtepi8_epi16(_mm_loadu_si128(p)));
            _mm256_storeu_si256(o.add(1), _mm256_cvtepi8_epi16(_mm_loadu_si128(p.add(1))));
        }
    }

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
    fn vector_bytes_equal_the_portable_form() {
        let qs: Vec<u8> = (0..32u8).map(|i| i.wrapping_mul(97) ^ 0x5a).collect();
        let (mut fast, mut slow) = ([0i16; 32], [0i16; 32]);
        bytes_i8(&qs, &mut fast);
        bytes_i8_portable(&qs, &mut slow);
        assert_eq!(fast, slow);
        assert!(slow.iter().any(|&v| v < 0) && slow.iter().any(|&v| v > 0));
    }

    #[test]
    fn other_types_and_bad_lengths_are_refused() {
        let mut w = [0i16; 32];
        let mut a = [0f32; 8];
        let mut b = [0f32; 2];
        assert!(!decode_row(
            QuantType::Q2K,
            &[0; 84],
            &mut w,
            &mut a,
            &mut b,
            true
        ));
        assert!(!decode_row(
            QuantType::Q5_0,
            &[0; 21],
            &mut w,
            &mut a,
            &mut b,
            true
        ));
        assert!(!decode_row(
            QuantType::Q8_0,
            &[0; 34],
            &mut w[..16],
            &mut a,
            &mut b,
            true
        ));
    }
}
