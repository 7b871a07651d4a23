//! AVX2 few-row kernels for the K-quants (`Q4_K`, `Q5_K`, `Q6_K`) on
//! several activation rows at once: each 256-block's levels are decoded
//! and its scales unpacked once, then multiplied with up to
//! [`super::ymm_rows::MAX_ROWS`] activation rows, where the one-row
//! kernels of `gemv_k` redo both for every row. Packed activations:
//! [`YmmActs`] (by 32-block, as for the 32-block types).
//!
//! Every row gets the one-row kernel's arithmetic in its order, so its
//! result is the same bits: the scale `(d sc) dx` per 32-block (the weight
//! factor `d sc` computed once, then times each row's `dx`), one FMA per
//! 32-block into the row's accumulator, the offsets' separate multiply and
//! subtract (`off - (dmin m) s`; `Q6_K`: `off - 32 (s0 a + s1 b)`), all
//! rows' offsets in one vector chain, lane `r` for row `r`.
//!
//! Loop order: one weight row at a time, 256-blocks in order, their
//! 32-blocks in order, the activation rows innermost.
//!
//! Invariants: levels into `vpmaddubsw` lie in 0..=63; `k` is a multiple
//! of 256. Cost: per 256-block and weight row ~30 vector instructions of
//! decode plus the scales' unpacking, then ~10 per 32-block and activation
//! row.

use std::arch::x86_64::*;

use super::super::f16_at;
use super::super::gemv_k::x86::{q4k_block_bytes, q4k_levels, q6k_levels};
use super::super::kernels::x86::hsum;
use super::ymm_rows::{row_dot, stored, vectors, YmmActs};
use model_loader::quant::scale_min_k4;

/// `Q4_K` (`Q5`: `Q5_K`): `res[t][r] = dot(rows[t], activation row r)` for
/// the `M` rows packed in `a`, each the same bits as the one-row AVX2
/// kernel gives it.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C (and AVX-VNNI with `VNNI`); each of
/// `rows` holds `a.k() / 256` blocks of the type and lies in one
/// allocation (the prefetch `pf` bytes ahead needs no validity); `a` was
/// packed by [`YmmActs::new`] for a K-quant with `M` rows (with residual
/// levels when `LO`).
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn q4k_rows<const VNNI: bool, const Q5: bool, const LO: bool, const M: usize>(
    rows: &[&[u8]],
    pf: usize,
    a: &YmmActs,
    res: &mut [[f32; M]],
) {
    let bs = q4k_block_bytes::<Q5>();
    let nb = a.k() / 256;
    debug_assert!(rows.iter().all(|r| r.len() >= nb * bs) && a.rows() == M);
    let [dx_at, pair_at, ..] = vectors(M);
    for (&row, res) in rows.iter().zip(res.iter_mut()) {
        let mut acc = [_mm256_setzero_ps(); M];
        // Lane r: row r's offsets.
        let mut off = _mm256_setzero_ps();
        for (b, blk) in row.chunks_exact(bs).take(nb).enumerate() {
            let p = blk.as_ptr();
            _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(pf).cast());
            _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(pf + 64).cast());
            let (d, dmin) = (f16_at(blk, 0), f16_at(blk, 2));
            let scales = &blk[4..16];
            for j in 0..4 {
                // SAFETY: `blk` is a whole block, j < 4; the 32-blocks
                // 8 b + 2 j + h < k / 32 lie in `a` (the contract).
                unsafe {
                    let w = q4k_levels::<Q5>(p, j);
                    for (h, wh) in w.into_iter().enumerate() {
                        let c = 8 * b + 2 * j + h;
                        let u = a.base().add(c * a.unit());
                        let (sc, m) = scale_min_k4(scales, 2 * j + h);
                        let dx = _mm256_load_ps(u.add(dx_at).cast());
                        let s = stored(_mm256_mul_ps(_mm256_set1_ps(d * f32::from(sc)), dx));
                        let pair = _mm256_load_ps(u.add(pair_at).cast());
                        let dm = _mm256_set1_ps(dmin * f32::from(m));
                        off = _mm256_sub_ps(off, _mm256_mul_ps(dm, pair));
                        for (r, acc) in acc.iter_mut().enumerate() {
                            let prod = row_dot::<false, LO, VNNI>(wh, u, r);
                            *acc = _mm256_fmadd_ps(prod, _mm256_broadcast_ss(&s[r]), *acc);
                        }
                    }
                }
            }
        }
        // SAFETY: the CPU has AVX2 (contract).
        let off = unsafe { stored(off) };
        for r in 0..M {
            // SAFETY: the CPU has AVX2 (contract).
            res[r] = unsafe { hsum(acc[r]) } + off[r];
        }
    }
}

/// `Q6_K` (210-byte blocks) against the `M` rows of `a`, each the same
/// bits as the one-row AVX2 kernel gives it.
///
/// # Safety
/// As for [`q4k_rows`], with 210-byte blocks.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn q6k_rows<const VNNI: bool, const LO: bool, const M: usize>(
    rows: &[&[u8]],
    pf: usize,
    a: &YmmActs,
    res: &mut [[f32; M]],
) {
    const BS: usize = 210;
    let nb = a.k() / 256;
    debug_assert!(rows.iter().all(|r| r.len() >= nb * BS) && a.rows() == M);
    let [dx_at, _, even_at, odd_at] = vectors(M);
    for (&row, res) in rows.iter().zip(res.iter_mut()) {
        let mut acc = [_mm256_setzero_ps(); M];
        let mut off = _mm256_setzero_ps();
        for (b, blk) in row.chunks_exact(BS).take(nb).enumerate() {
            let p = blk.as_ptr();
            for ahead in [0, 64, 128, 192] {
                _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(pf + ahead).cast());
            }
            let d = f16_at(blk, 208);
            for n in 0..2 {
                let sc = &blk[192 + 8 * n..200 + 8 * n];
                // SAFETY: `blk` is a whole block, n < 2; the 32-blocks
                // 8 b + 4 n + i < k / 32 lie in `a` (the contract).
                unsafe {
                    let w = q6k_levels(p, n);
                    for (i, wi) in w.into_iter().enumerate() {
                        let c = 8 * b + 4 * n + i;
                        let u = a.base().add(c * a.unit());
                        let (s0, s1) = (
                            d * f32::from(sc[2 * i] as i8),
                            d * f32::from(sc[2 * i + 1] as i8),
                        );
                        let dx = _mm256_load_ps(u.add(dx_at).cast());
                        let lo_half = stored(_mm256_mul_ps(_mm256_set1_ps(s0), dx));
                        let hi_half = stored(_mm256_mul_ps(_mm256_set1_ps(s1), dx));
                        let t = _mm256_add_ps(
                            _mm256_mul_ps(
                                _mm256_set1_ps(s0),
                                _mm256_load_ps(u.add(even_at).cast()),
                            ),
                            _mm256_mul_ps(_mm256_set1_ps(s1), _mm256_load_ps(u.add(odd_at).cast())),
                        );
                        off = _mm256_sub_ps(off, _mm256_mul_ps(_mm256_set1_ps(32.0), t));
                        for (r, acc) in acc.iter_mut().enumerate() {
                            // The first 16 values scaled by s0, the next
                            // 16 by s1 (the i32 lanes' halves).
                            let sv = _mm256_set_m128(
                                _mm_broadcast_ss(&hi_half[r]),
                                _mm_broadcast_ss(&lo_half[r]),
                            );
                            let prod = row_dot::<false, LO, VNNI>(wi, u, r);
                            *acc = _mm256_fmadd_ps(prod, sv, *acc);
                        }
                    }
                }
            }
        }
        // SAFETY: the CPU has AVX2 (contract).
        let off = unsafe { stored(off) };
        for r in 0..M {
            // SAFETY: the CPU has AVX2 (contract).
            res[r] = unsafe { hsum(acc[r]) } + off[r];
        }
    }
}
