//! [`super::gemv`]'s direct kernels for the K-quant types of a `Q4_K_M`
//! file: `Q4_K` (8 sub-blocks of 32 with 6-bit scales and mins; `Q5_K`
//! the same with a fifth bit from `qh`) and `Q6_K`
//! (16 sub-blocks of 16 with 8-bit scales, levels offset by 32). One weight
//! row at a time; the 32-value sub-blocks line up with the activations'
//! 32-blocks, so each needs one integer dot product and one scale.
//!
//! Per 32-block `c` (sub-block `s` of 256-block `b`, `c = 8 b + s`):
//! - `Q4_K`/`Q5_K`: `d sc[s] dx[c] dot(q, x) - dmin m[s] (sums[2c] + sums[2c+1])`.
//! - `Q6_K`: the two 16-halves scaled by `d sc[2s]` and `d sc[2s + 1]` (one
//!   scale vector, matching the i32 lanes' halves), minus
//!   `32 d (sc[2s] sums[2c] + sc[2s + 1] sums[2c + 1])` for the offset.
//!
//! One accumulator per row, its 32-blocks in order, the offsets in a
//! scalar chain: the tile kernels reproduce exactly this arithmetic
//! (`tile::OffsetForm`), so a row's result does not depend on the batch.
//!
//! Invariants: `k` is a multiple of 256; levels fed to `vpmaddubsw` lie in
//! 0..=63. Cost: one pass over the row's bytes, O(k) per activation row.

#[cfg(target_arch = "x86_64")]
pub(super) mod x86 {
    use std::arch::x86_64::*;

    use super::super::f16_at;
    use super::super::kernels::x86::{dot4_avx2, dot4_vnni, hsum};
    use model_loader::quant::scale_min_k4;

    /// Bytes of a `Q4_K` block (`Q5`: `Q5_K`): d, dmin, scales[12],
    /// [qh[32]], qs[128].
    pub(in crate::model::quant) const fn q4k_block_bytes<const Q5: bool>() -> usize {
        if Q5 {
            176
        } else {
            144
        }
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

    macro_rules! k_kernels {
        ($q4k:ident, $q6k:ident, $dot:ident, $features:literal) => {
            /// One `Q4_K` row (or, with `Q5`, `Q5_K`) against one
            /// activation row.
            ///
            /// # Safety
            /// The CPU has the enabled features; `row` holds `k / 256`
            /// 144-byte (`Q5_K`: 176-byte) blocks, `qx` (and with `LO` `lo`) k levels, `dx`
            /// k / 32 scales, `sx` k / 16 sums, `k = qx.len()`.
            #[target_feature(enable = $features)]
            pub unsafe fn $q4k<const Q5: bool, const LO: bool>(
                row: &[u8],
                qx: &[i8],
                lo: &[i8],
                dx: &[f32],
                sx: &[f32],
            ) -> f32 {
                let nb = qx.len() / 256;
                let bs = q4k_block_bytes::<Q5>();
                debug_assert!(row.len() >= nb * bs && dx.len() >= 8 * nb && sx.len() >= 16 * nb);
                let mut acc = _mm256_setzero_ps();
                let mut off = 0f32;
                for (b, blk) in row.chunks_exact(bs).take(nb).enumerate() {
                    let (d, dmin) = (f16_at(blk, 0), f16_at(blk, 2));
                    let scales = &blk[4..16];
                    for j in 0..4 {
                        let c = 8 * b + 2 * j;
                        // SAFETY: the 32 bytes at qs_at + 32 j (and, Q5,
                        // the 32 at 16) lie in the bs-byte block; c + 1 <
                        // 8 nb, so the levels at 32 c .. 32 c + 64 lie in
                        // `qx` (and `lo`), dx[c + 1] and sx[2c + 3] in theirs
                        // (contract).
                        unsafe {
                            let w = q4k_levels::<Q5>(blk.as_ptr(), j);
                            for (h, wh) in w.into_iter().enumerate() {
                                let ch = c + h;
                                let x = _mm256_loadu_si256(qx.as_ptr().add(32 * ch).cast());
                                let mut p = $dot::<false>(wh, x);
                                if LO {
                                    let xl = _mm256_loadu_si256(lo.as_ptr().add(32 * ch).cast());
                                    p = _mm256_add_epi32(
                                        _mm256_slli_epi32::<8>(p),
                                        $dot::<false>(wh, xl),
                                    );
                                }
                                let (sc, m) = scale_min_k4(scales, 2 * j + h);
                                let s = d * f32::from(sc) * *dx.get_unchecked(ch);
                                acc =
                                    _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(s), acc);
                                off -= dmin
                                    * f32::from(m)
                                    * (*sx.get_unchecked(2 * ch) + *sx.get_unchecked(2 * ch + 1));
                            }
                        }
                    }
                }
                // SAFETY: the CPU has AVX2 (contract).
                unsafe { hsum(acc) + off }
            }

            /// One `Q6_K` row against one activation row.
            ///
            /// # Safety
            /// As for the `Q4_K` kernel, with 210-byte blocks.
            #[target_feature(enable = $features)]
            pub unsafe fn $q6k<const LO: bool>(
                row: &[u8],
                qx: &[i8],
                lo: &[i8],
                dx: &[f32],
                sx: &[f32],
            ) -> f32 {
                let nb = qx.len() / 256;
                debug_assert!(row.len() >= nb * 210 && dx.len() >= 8 * nb && sx.len() >= 16 * nb);
                let mut acc = _mm256_setzero_ps();
                let mut off = 0f32;
                for (b, blk) in row.chunks_exact(210).take(nb).enumerate() {
                    let d = f16_at(blk, 208);
                    for n in 0..2 {
                        // SAFETY: ql (64 bytes at 64 n), qh (32 at 128 +
                        // 32 n) and the 8 scales at 192 + 8 n lie in the
                        // 210-byte block; the 32-blocks c .. c + 4 < 8 nb
                        // index `qx`, `lo`, `dx`, `sx` in range (contract).
                        unsafe {
                            let w = q6k_levels(blk.as_ptr(), n);
                            let sc = &blk[192 + 8 * n..200 + 8 * n];
                            for (i, wi) in w.into_iter().enumerate() {
                                let c = 8 * b + 4 * n + i;
                                let x = _mm256_loadu_si256(qx.as_ptr().add(32 * c).cast());
                                let mut pr = $dot::<false>(wi, x);
                                if LO {
                                    let xl = _mm256_loadu_si256(lo.as_ptr().add(32 * c).cast());
                                    pr = _mm256_add_epi32(
                                        _mm256_slli_epi32::<8>(pr),
                                        $dot::<false>(wi, xl),
                                    );
                                }
                                let (s0, s1) = (
                                    d * f32::from(sc[2 * i] as i8),
                                    d * f32::from(sc[2 * i + 1] as i8),
                                );
                                let dc = *dx.get_unchecked(c);
                                let sv =
                                    _mm256_set_m128(_mm_set1_ps(s1 * dc), _mm_set1_ps(s0 * dc));
                                acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(pr), sv, acc);
                                off -= 32.0
                                    * (s0 * *sx.get_unchecked(2 * c)
                                        + s1 * *sx.get_unchecked(2 * c + 1));
                            }
                        }
                    }
                }
                // SAFETY: the CPU has AVX2 (contract).
                unsafe { hsum(acc) + off }
            }
        };
    }

    k_kernels!(q4k_avx2, q6k_avx2, dot4_avx2, "avx2,fma,f16c");
    k_kernels!(
        q4k_vnni,
        q6k_vnni,
        dot4_vnni,
        "avx2,fma,f16c,avx512vnni,avx512vl"
    );
}
