//! [`super::zmm_k`]'s K-quant kernels for several activation rows at once
//! (see [`super::zmm_rows`] for why and the loop order): a weight row's
//! 256-block has its scales and its 64-weight vectors decoded once, then
//! meets each activation row with the same float operations, in the same
//! order, as the one-row kernel gives that row (same bits).
//!
//! Invariants: as in [`super::zmm_k`]. Cost: per block and weight row the
//! one-row kernel's decode (~25 instructions of scales, ~16 of levels) plus
//! ~30 per activation row.

use std::arch::x86_64::*;

use super::super::kernels::x86::hsum;
use super::zmm::lanes;
use super::zmm_k::{T, UPPER};
use super::zmm_rows::{PackedActs, K_UNIT};

/// The integer dot products of `w` with the 64 levels at `at + off` (and
/// the residuals 256 bytes on), as [`super::zmm_k`]'s `dot64`.
///
/// # Safety
/// The CPU has AVX-512 F/BW/VNNI; `at` is a row's unit of [`PackedActs`]
/// and `off + 64 <= 256`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn dot64<const LO: bool>(w: __m512i, at: *const u8, off: usize) -> __m512 {
    // SAFETY: the contract: both 64-byte loads lie in the unit.
    unsafe {
        let x = _mm512_load_si512(at.add(off).cast());
        let hi = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w, x);
        let p = if LO {
            let xl = _mm512_load_si512(at.add(256 + off).cast());
            _mm512_dpbusd_epi32(_mm512_slli_epi32::<8>(hi), w, xl)
        } else {
            hi
        };
        _mm512_cvtepi32_ps(p)
    }
}

/// `Q4_K` (or, with `Q5`, `Q5_K`) against the `M` rows of `a`, each the
/// same bits as [`super::zmm_k::q4k`] gives it.
///
/// # Safety
/// The CPU has the features [`super::zmm::available`] checks; each of
/// `rows` holds `a.k() / 256` blocks of 144 (`Q5_K`: 176) bytes in one
/// allocation (the prefetch `pf` bytes ahead needs no validity); `a` was
/// packed by [`PackedActs::new`] for a K-quant with `M` rows (with residual
/// levels when `LO`).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn q4k_rows<const Q5: bool, const LO: bool, const M: usize>(
    rows: &[&[u8]],
    pf: usize,
    a: &PackedActs,
    res: &mut [[f32; M]],
) {
    let nb = a.k() / 256;
    let (bs, qs_at) = if Q5 { (176, 48) } else { (144, 16) };
    debug_assert!(rows.iter().all(|r| r.len() >= nb * bs));
    debug_assert!(a.rows() == M && a.k().is_multiple_of(256));
    let (nib, b16) = (_mm512_set1_epi8(0x0f), _mm512_set1_epi8(0x10));
    let (even, odd) = (lanes(&T.even), lanes(&T.odd));
    for (&row, res) in rows.iter().zip(res.iter_mut()) {
        let mut acc = [_mm512_setzero_ps(); M];
        let mut off = [_mm256_setzero_ps(); M];
        for b in 0..nb {
            // SAFETY: b < nb: the block's bs bytes lie in `row`, the 256
            // levels at 256 b, 8 scales at 8 b and 16 sums at 16 b in every
            // activation row (contract); prefetches never fault.
            unsafe {
                let blk = row.as_ptr().add(b * bs);
                let ahead = blk.wrapping_add(pf);
                for l in (0..bs).step_by(64) {
                    _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(l).cast());
                }
                let dd = _mm_cvtph_ps(_mm_cvtsi32_si128(blk.cast::<i32>().read_unaligned()));
                let u = |i: usize| blk.add(4 + 4 * i).cast::<u32>().read_unaligned();
                let (u0, u1, u2) = (u(0), u(1), u(2));
                let (k1, k2, k3) = (0x3f3f_3f3f_u32, 0x0f0f_0f0f_u32, 0x0303_0303_u32);
                let sm = _mm_set_epi32(
                    (((u2 >> 4) & k2) | (((u1 >> 6) & k3) << 4)) as i32,
                    (u1 & k1) as i32,
                    ((u2 & k2) | (((u0 >> 6) & k3) << 4)) as i32,
                    (u0 & k1) as i32,
                );
                let smf = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(sm));
                let d = _mm256_broadcastss_ps(dd);
                let dmin =
                    _mm256_permutevar8x32_ps(_mm256_castps128_ps256(dd), _mm256_set1_epi32(1));
                let scw = _mm256_mul_ps(_mm512_castps512_ps256(smf), d);
                let mins = _mm256_mul_ps(
                    _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(smf))),
                    dmin,
                );
                let h = if Q5 {
                    let h = _mm512_broadcast_i64x4(_mm256_loadu_si256(blk.add(16).cast()));
                    _mm512_mask_srli_epi16::<1>(h, UPPER, h)
                } else {
                    _mm512_setzero_si512()
                };
                let w: [__m512i; 4] = std::array::from_fn(|j| {
                    let q = _mm256_loadu_si256(blk.add(qs_at + 32 * j).cast());
                    let w = _mm512_and_si512(
                        _mm512_inserti64x4::<1>(
                            _mm512_castsi256_si512(q),
                            _mm256_srli_epi16::<4>(q),
                        ),
                        nib,
                    );
                    if Q5 {
                        let at4 = match j {
                            0 => _mm512_slli_epi16::<4>(h),
                            1 => _mm512_slli_epi16::<2>(h),
                            2 => h,
                            _ => _mm512_srli_epi16::<2>(h),
                        };
                        _mm512_or_si512(w, _mm512_and_si512(at4, b16))
                    } else {
                        w
                    }
                });
                let u = a.base().add(b * M * K_UNIT);
                for r in 0..M {
                    let at = u.add(r * K_UNIT);
                    let dxb = _mm256_load_ps(at.add(512).cast());
                    let s16 = _mm512_load_ps(at.add(576).cast());
                    let ssub = _mm512_castps512_ps256(_mm512_add_ps(
                        _mm512_permutexvar_ps(even, s16),
                        _mm512_permutexvar_ps(odd, s16),
                    ));
                    let sc = _mm512_castps256_ps512(_mm256_mul_ps(scw, dxb));
                    off[r] = _mm256_fmadd_ps(mins, ssub, off[r]);
                    for (j, &wj) in w.iter().enumerate() {
                        let p = dot64::<LO>(wj, at, 64 * j);
                        let s = _mm512_permutexvar_ps(lanes(&T.pair[j]), sc);
                        acc[r] = _mm512_fmadd_ps(p, s, acc[r]);
                    }
                }
            }
        }
        for r in 0..M {
            // SAFETY: the CPU has AVX2 (contract).
            res[r] = _mm512_reduce_add_ps(acc[r]) - unsafe { hsum(off[r]) };
        }
    }
}

/// `Q6_K` (210-byte blocks) against the `M` rows of `a`, each the same
/// bits as [`super::zmm_k::q6k`] gives it.
///
/// # Safety
/// As for [`q4k_rows`], with 210-byte blocks.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn q6k_rows<const LO: bool, const M: usize>(
    rows: &[&[u8]],
    pf: usize,
    a: &PackedActs,
    res: &mut [[f32; M]],
) {
    const BS: usize = 210;
    let nb = a.k() / 256;
    debug_assert!(rows.iter().all(|r| r.len() >= nb * BS));
    debug_assert!(a.rows() == M && a.k().is_multiple_of(256));
    let (nib, m30) = (_mm512_set1_epi8(0x0f), _mm512_set1_epi8(0x30));
    let by_half = lanes(&T.by_half);
    for (&row, res) in rows.iter().zip(res.iter_mut()) {
        let mut acc = [_mm512_setzero_ps(); M];
        let mut off = [_mm512_setzero_ps(); M];
        for b in 0..nb {
            // SAFETY: as in `q4k_rows`, with 210-byte blocks; the 16-byte
            // scale load at 192 and the 64-byte ql loads at 0 and 64 lie
            // inside.
            unsafe {
                let blk = row.as_ptr().add(b * BS);
                let ahead = blk.wrapping_add(pf);
                for l in (0..BS).step_by(64) {
                    _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(l).cast());
                }
                let d = _mm512_cvtph_ps(_mm256_set1_epi16(
                    blk.add(208).cast::<i16>().read_unaligned(),
                ));
                let sw = _mm512_mul_ps(
                    _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(blk.add(192).cast()))),
                    d,
                );
                // The four 64-weight vectors in `zmm_k::q6k`'s order (m = 2n + i).
                let mut w = [_mm512_setzero_si512(); 4];
                for n in 0..2 {
                    let a = _mm512_loadu_si512(blk.add(64 * n).cast());
                    let h =
                        _mm512_broadcast_i64x4(_mm256_loadu_si256(blk.add(128 + 32 * n).cast()));
                    let h = _mm512_mask_srli_epi16::<2>(h, UPPER, h);
                    w[2 * n] = _mm512_or_si512(
                        _mm512_and_si512(a, nib),
                        _mm512_and_si512(_mm512_slli_epi16::<4>(h), m30),
                    );
                    w[2 * n + 1] = _mm512_or_si512(
                        _mm512_and_si512(_mm512_srli_epi16::<4>(a), nib),
                        _mm512_and_si512(h, m30),
                    );
                }
                let u = a.base().add(b * M * K_UNIT);
                for r in 0..M {
                    let at = u.add(r * K_UNIT);
                    let dxh = _mm512_permutexvar_ps(
                        by_half,
                        _mm512_castps256_ps512(_mm256_load_ps(at.add(512).cast())),
                    );
                    let s16 = _mm512_load_ps(at.add(576).cast());
                    off[r] = _mm512_fmadd_ps(sw, s16, off[r]);
                    let s = _mm512_mul_ps(sw, dxh);
                    for (m, &wm) in w.iter().enumerate() {
                        let p = dot64::<LO>(wm, at, 64 * m);
                        acc[r] =
                            _mm512_fmadd_ps(p, _mm512_permutexvar_ps(lanes(&T.half[m]), s), acc[r]);
                    }
                }
            }
        }
        for r in 0..M {
            res[r] = _mm512_reduce_add_ps(acc[r]) - 32.0 * _mm512_reduce_add_ps(off[r]);
        }
    }
}
