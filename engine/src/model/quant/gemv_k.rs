//! The arithmetic of [`super::gemv`]'s direct kernels for the K-quant
//! types of a `Q4_K_M` file, and their AVX2 level decoders: `Q4_K` (8
//! sub-blocks of 32 with 6-bit scales and mins; `Q5_K` the same with a
//! fifth bit from `qh`) and `Q6_K` (16 sub-blocks of 16 with 8-bit scales,
//! levels offset by 32). The 32-value sub-blocks line up with the
//! activations' 32-blocks, so each needs one integer dot product and one
//! scale.
//!
//! Per 32-block `c` (sub-block `s` of 256-block `b`, `c = 8 b + s`):
//! - `Q4_K`/`Q5_K`: `d sc[s] dx[c] dot(q, x) - dmin m[s] (sums[2c] + sums[2c+1])`.
//! - `Q6_K`: the two 16-halves scaled by `d sc[2s]` and `d sc[2s + 1]` (one
//!   scale vector, matching the i32 lanes' halves), minus
//!   `32 d (sc[2s] sums[2c] + sc[2s + 1] sums[2c + 1])` for the offset.
//!
//! On AVX2 (`gemv::ymm_k`, `gemv::ymm_k_rows`): one accumulator per row,
//! its 32-blocks in order, the offsets in a scalar chain: the tile kernels
//! reproduce exactly this arithmetic (`tile::OffsetForm`), so a row's
//! result does not depend on the batch. The 512-bit kernels (`gemv::zmm_k`)
//! have their own order, which the 512-bit tiles reproduce.
//!
//! Invariants: `k` is a multiple of 256; levels fed to `vpmaddubsw` lie in
//! 0..=63.

#[cfg(target_arch = "x86_64")]
pub(super) mod x86 {
    use std::arch::x86_64::*;

    /// Bytes of a `Q4_K` block (`Q5`: `Q5_K`): d, dmin, scales[12],
    /// [qh[32]], qs[128].
    pub(in crate::model::quant) const fn q4k_block_bytes<const Q5: bool>() -> usize {
        if Q5 {
            176
        } else {
            144
        }
    }

    /// The `Q4_K` (`Q5_K`) block at `blk`'s 6-bit scales and mins, one per
    /// byte: bytes 0-7 the eight sub-blocks' scales, 8-15 their mins.
    /// `scales[12]` holds sub-blocks 0-3's scales (mins) in the low 6 bits
    /// of bytes 0-3 (4-7), and 4-7's in the nibbles of bytes 8-11 (low:
    /// scales, high: mins) with their top 2 bits in the top bits of bytes
    /// 0-3 (4-7): two byte shuffles put every part in place.
    ///
    /// # Safety
    /// The CPU has AVX2; `blk` holds a whole block (16 bytes at 4).
    #[inline]
    #[target_feature(enable = "avx2")]
    pub(in crate::model::quant) unsafe fn q4k_scale_bytes(blk: *const u8) -> __m128i {
        // SAFETY: bytes 4..20 lie in the block (144 or 176 bytes).
        let v = unsafe { _mm_loadu_si128(blk.add(4).cast()) };
        // Low parts: scales 0-3, the low nibbles of bytes 8-11, mins 0-3,
        // the high nibbles of bytes 8-11 (shifted down in the last word).
        let lo = _mm_shuffle_epi8(
            v,
            _mm_setr_epi8(0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 8, 9, 10, 11),
        );
        let lo = _mm_blend_epi32::<0b1000>(lo, _mm_srli_epi16::<4>(lo));
        let keep = _mm_setr_epi32(0x3f3f_3f3f, 0x0f0f_0f0f, 0x3f3f_3f3f, 0x0f0f_0f0f);
        // High parts: bits 6-7 of bytes 0-3 (4-7) to bits 4-5 of scales
        // (mins) 4-7.
        let hi = _mm_shuffle_epi8(
            v,
            _mm_setr_epi8(-1, -1, -1, -1, 0, 1, 2, 3, -1, -1, -1, -1, 4, 5, 6, 7),
        );
        let hi = _mm_and_si128(_mm_srli_epi16::<2>(hi), _mm_set1_epi8(0x30));
        _mm_or_si128(_mm_and_si128(lo, keep), hi)
    }

    /// Sub-blocks `2j` and `2j + 1` of the `Q4_K` (`Q5`: `Q5_K`) block at
    /// `blk`: 32 levels each, one per byte, 0..=15 (0..=31).
    ///
    /// # Safety
    /// The CPU has AVX2; `blk` holds a whole block; `j < 4`.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub(in crate::model::quant) unsafe fn q4k_levels<const Q5: bool>(
        blk: *const u8,
        j: usize,
    ) -> [__m256i; 2] {
        let qs_at = if Q5 { 48 } else { 16 };
        let mask = _mm256_set1_epi8(0x0f);
        // SAFETY: the 32 bytes at qs_at + 32 j (and, Q5, the 32 at 16) lie
        // in the block (the contract).
        unsafe {
            let q = _mm256_loadu_si256(blk.add(qs_at + 32 * j).cast());
            let mut w = [
                _mm256_and_si256(q, mask),
                _mm256_and_si256(_mm256_srli_epi16::<4>(q), mask),
            ];
            if Q5 {
                // Bit 2j (2j + 1) of qh[l] is bit 4 of value l of the
                // first (second) sub-block.
                let h = _mm256_loadu_si256(blk.add(16).cast());
                for (hh, wh) in w.iter_mut().enumerate() {
                    let sh = _mm_cvtsi32_si128((2 * j + hh) as i32);
                    let bit = _mm256_and_si256(_mm256_srl_epi16(h, sh), _mm256_set1_epi8(1));
                    *wh = _mm256_or_si256(*wh, _mm256_slli_epi16::<4>(bit));
                }
            }
            w
        }
    }

    /// Sub-blocks `4n .. 4n + 4` of the `Q6_K` block (210 bytes) at `blk`:
    /// 32 levels each, one per byte, 0..=63 (the offset 32 not applied).
    ///
    /// # Safety
    /// The CPU has AVX2; `blk` holds a whole block; `n < 2`.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub(in crate::model::quant) unsafe fn q6k_levels(blk: *const u8, n: usize) -> [__m256i; 4] {
        let (m4, m3) = (_mm256_set1_epi8(0x0f), _mm256_set1_epi8(3));
        // SAFETY: ql (64 bytes at 64 n) and qh (32 at 128 + 32 n) lie in
        // the block (the contract).
        unsafe {
            let a = _mm256_loadu_si256(blk.add(64 * n).cast());
            let bq = _mm256_loadu_si256(blk.add(64 * n + 32).cast());
            let h = _mm256_loadu_si256(blk.add(128 + 32 * n).cast());
            let hi = |s: __m256i| _mm256_slli_epi16::<4>(_mm256_and_si256(s, m3));
            [
                _mm256_or_si256(_mm256_and_si256(a, m4), hi(h)),
                _mm256_or_si256(_mm256_and_si256(bq, m4), hi(_mm256_srli_epi16::<2>(h))),
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16::<4>(a), m4),
                    hi(_mm256_srli_epi16::<4>(h)),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16::<4>(bq), m4),
                    hi(_mm256_srli_epi16::<6>(h)),
                ),
            ]
        }
    }
}
