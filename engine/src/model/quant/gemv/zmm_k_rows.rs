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
use super::zmm_k::{q4k_block, q6k_block, T};
use super::zmm_rows::{packed_dot, PackedActs, K_UNIT};

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
    let bs = super::super::gemv_k::x86::q4k_block_bytes::<Q5>();
    debug_assert!(rows.iter().all(|r| r.len() >= nb * bs));
    debug_assert!(a.rows() == M && a.k().is_multiple_of(256));
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
                let (scw, mins, w) = q4k_block::<Q5>(blk);
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
                        let p = _mm512_cvtepi32_ps(packed_dot::<LO>(wj, at.add(64 * j), 256));
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
                let (sw, w) = q6k_block(blk);
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
                        let p = _mm512_cvtepi32_ps(packed_dot::<LO>(wm, at.add(64 * m), 256));
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
