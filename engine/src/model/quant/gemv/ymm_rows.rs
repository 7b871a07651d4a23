//! AVX2 few-row kernels for several activation rows at once (`Q4_0`,
//! `Q4_1`, `Q5_0`, `Q5_1`, `Q8_0`): each weight block is loaded and
//! decoded once and multiplied with up to [`MAX_ROWS`] activation rows,
//! where the one-row kernels of [`super::x86`] decode it again for every
//! row. The AVX2 counterpart of [`super::zmm_rows`], for CPUs without
//! AVX-512 (AMD Zen 2 and 3, Intel client cores); the K-quants' kernels
//! are in [`super::ymm_k_rows`], on the same packed activations.
//!
//! Every activation row gets the same integer sums and the same float
//! operations in the same order as the one-row kernel gives it (the
//! block's scale product `dw * dx`, one FMA per block into the row's
//! accumulator, the offsets' FMA chain, the same horizontal sum), so a
//! row's result is the same bits whichever kernel ran it.
//!
//! [`YmmActs`] packs the rows once per product, by 32-block: each row's
//! levels and residual levels, then the rows' block scales side by side
//! and their block sums side by side, so one weight scale multiplies
//! every row's scale in one instruction and the offsets of all rows run
//! in one vector chain.
//!
//! Loop order: one weight row at a time, blocks in order, the activation
//! rows innermost; `M` accumulators and two offset vectors in registers.
//!
//! Where the CPU has AVX-VNNI these kernels and [`super::ymm_k_rows`]'s
//! run with `VNNI` (`ManyRows` decides once per product): one `vpdpbusd`
//! (as `asm!`, [`row_dot`]) per `vpmaddubsw` + `vpmaddwd`, the same i32
//! lanes, so the same bits. `gemv_bench --avx2 --l2`,
//! `PAGED_ENGINE_AVX_VNNI=0/1` alternated twice (Emerald Rapids, GB/s):
//! 3 rows Q4_1 4.3 -> 5.1-5.2, Q5_0 4.2-4.3 -> 5.0, Q8_0 6.4-6.6 -> 7.4,
//! Q4_K 3.4-3.6 -> 3.9-4.0; 6 rows Q5_0 2.5 -> 3.0, Q8_0 3.2-3.4 ->
//! 3.7-4.0, Q4_K 1.8-1.9 -> 2.3.
//!
//! Invariants: levels into `vpmaddubsw` as in the one-row kernels (weight
//! levels 0..=31 unsigned, or `Q8_0`'s sign trick); the packed data is
//! 32-byte aligned.
//! Cost: per 32-block and weight row ~6 vector instructions of decode
//! (10 for the 5-bit types) plus ~8 per activation row; [`YmmActs`] is
//! `(64 m + 128) k / 32` bytes, built once per product.

use std::arch::x86_64::*;

use model_loader::QuantType;

use super::super::act::QuantizedActs;
use super::super::kernels::x86::hsum;
use super::packed::PackedRows;
use super::x86::{dot_levels, q4_block_bytes, q4_levels};

/// Most activation rows one kernel call takes (`M` accumulators, two
/// offset vectors, the block's levels and scales in the 16 registers).
pub const MAX_ROWS: usize = 6;

/// Most activation rows a product of `ty` sends here: 8 (two chunks) for
/// the 32-block types, 6 (one chunk) for the K-quants. Measured
/// (`gemv_bench --avx2 --rows=M`, against the tile path they replace):
/// at 12 rows the tiles' register blocks beat two passes over `Q8_0`
/// (0.85x); at 8 the 32-block types gain 1.0x to 1.3x and the K-quants
/// 0.85x to 1.0x; at 6 rows 1.0x to 1.5x (K-quants) and 1.5x to 2.5x.
pub fn most_rows(ty: QuantType) -> usize {
    if ty.block_len() == 256 {
        MAX_ROWS
    } else {
        8
    }
}

/// The activation rows of one product packed for these kernels and those
/// of [`super::ymm_k_rows`]: 32-block `c` at `c * unit` bytes, holding row
/// `r`'s 32 levels at `64 r` and its 32 residual levels at `64 r + 32`,
/// then, lane `r` for row `r`, the rows' block scales (`f32`) at `64 m`,
/// their block sums (`sums[2c] + sums[2c + 1]`, added as the one-row
/// kernels add them) at `64 m + 32`, and the two 16-sums apart
/// (`sums[2c]`, `sums[2c + 1]`, for `Q6_K`) at `64 m + 64` and `64 m + 96`.
pub type YmmActs = PackedRows<32>;

/// Offsets in a 32-block's unit of [`YmmActs`] with `m` rows: the scales,
/// the pair sums, the even and the odd 16-sums (8 `f32` lanes each).
pub(super) const fn vectors(m: usize) -> [usize; 4] {
    [64 * m, 64 * m + 32, 64 * m + 64, 64 * m + 96]
}

impl PackedRows<32> {
    /// Rows `rows` of `act` (at most [`MAX_ROWS`]) packed for `ty`'s
    /// kernels, or `None` when there are none for `ty`.
    pub fn new(act: &QuantizedActs, rows: std::ops::Range<usize>, ty: QuantType) -> Option<Self> {
        let block = match ty {
            QuantType::Q4_0
            | QuantType::Q4_1
            | QuantType::Q5_0
            | QuantType::Q5_1
            | QuantType::Q8_0 => 32,
            QuantType::Q4K | QuantType::Q5K | QuantType::Q6K => 256,
            _ => return None,
        };
        let (m, k) = (rows.len(), act.k);
        if m == 0 || m > MAX_ROWS || rows.end > act.m || !k.is_multiple_of(block) {
            return None;
        }
        let unit = 64 * m + 128;
        let mut a = Self::zeroed(m, k, unit, k / 32 * unit);
        let data = a.data_mut();
        let [dx, pair, even, odd] = vectors(m);
        for (r, ar) in rows.enumerate() {
            let row = act.row(ar);
            for (c, blk) in data.chunks_exact_mut(unit).enumerate() {
                let v = 32 * c..32 * c + 32;
                for (d, &q) in blk[64 * r..64 * r + 32].iter_mut().zip(&row.q[v.clone()]) {
                    *d = q as u8;
                }
                if let Some(lo) = row.lo {
                    for (d, &l) in blk[64 * r + 32..64 * r + 64].iter_mut().zip(&lo[v]) {
                        *d = l as u8;
                    }
                }
                let (s0, s1) = (row.sums[2 * c], row.sums[2 * c + 1]);
                for (at, val) in [(dx, row.d[c]), (pair, s0 + s1), (even, s0), (odd, s1)] {
                    let at = at + 4 * r;
                    blk[at..at + 4].copy_from_slice(&val.to_ne_bytes());
                }
            }
        }
        Some(a)
    }
}

/// Row `r`'s integer product with `w` for the block at `at` (levels at
/// `at + 64 r`, residuals 32 bytes on), as the one-row kernels form it,
/// in `f32` (with `VNNI` in the AVX-VNNI form: the same bits).
///
/// # Safety
/// The CPU has AVX2 (and AVX-VNNI with `VNNI`); `at + 64 r` holds 64
/// readable bytes, 32-byte aligned.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn row_dot<const SIGNED: bool, const LO: bool, const VNNI: bool>(
    w: __m256i,
    at: *const u8,
    r: usize,
) -> __m256 {
    // SAFETY: the contract.
    unsafe {
        let x = _mm256_load_si256(at.add(64 * r).cast());
        let xl = if LO {
            _mm256_load_si256(at.add(64 * r + 32).cast())
        } else {
            x
        };
        _mm256_cvtepi32_ps(dot_levels::<SIGNED, LO, VNNI>(w, x, xl))
    }
}

/// `v`'s eight lanes in memory: a row's lane is then broadcast with a
/// load, not a shuffle on the port the products need.
///
/// # Safety
/// The CPU has AVX2.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) unsafe fn stored(v: __m256) -> [f32; 8] {
    let mut out = [0f32; 8];
    // SAFETY: 8 f32 into an [f32; 8].
    unsafe { _mm256_storeu_ps(out.as_mut_ptr(), v) };
    out
}

/// `Q4_0`, `Q4_1` (`MIN`), `Q5_0` (`FIVE`) or `Q5_1` (both): `res[t][r] =
/// dot(rows[t], activation row r)` for the `M` rows packed in `a`, each the
/// same bits as the one-row AVX2 kernel gives it.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C (and AVX-VNNI with `VNNI`); each of
/// `rows` holds `a.k() / 32` blocks of the type and lies in one
/// allocation (the prefetch `pf` bytes ahead needs no validity); `a` was
/// packed by [`YmmActs::new`] with `M` rows (with residual levels when
/// `LO`).
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn q4_rows<
    const VNNI: bool,
    const MIN: bool,
    const FIVE: bool,
    const LO: bool,
    const M: usize,
>(
    rows: &[&[u8]],
    pf: usize,
    a: &YmmActs,
    res: &mut [[f32; M]],
) {
    let bs = q4_block_bytes::<MIN, FIVE>();
    let nb = a.k() / 32;
    debug_assert!(rows.iter().all(|r| r.len() >= nb * bs));
    debug_assert!(a.rows() == M);
    let [dx_at, pair_at, ..] = vectors(M);
    for (&row, res) in rows.iter().zip(res.iter_mut()) {
        let mut acc = [_mm256_setzero_ps(); M];
        // Lane r: row r's sum of d * s, and (MIN) of m * s.
        let mut off_d = _mm256_setzero_ps();
        let mut off_m = _mm256_setzero_ps();
        for c in 0..nb {
            // SAFETY: block c exists in `row` and in `a` (the contract); a
            // prefetch never faults (wrapping address).
            unsafe {
                let p = row.as_ptr().add(c * bs);
                if c % 2 == 0 {
                    _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(pf).cast());
                }
                // d, then m (or level bytes, unused without MIN).
                let dm = _mm_cvtph_ps(_mm_cvtsi32_si128(p.cast::<i32>().read_unaligned()));
                let dw = _mm256_broadcastss_ps(dm);
                let w = q4_levels::<FIVE>(p, bs);
                let u = a.base().add(c * a.unit());
                let sv = _mm256_load_ps(u.add(pair_at).cast());
                let scaled = _mm256_mul_ps(dw, _mm256_load_ps(u.add(dx_at).cast()));
                off_d = _mm256_fmadd_ps(dw, sv, off_d);
                if MIN {
                    let mw = _mm256_broadcastss_ps(_mm_movehdup_ps(dm));
                    off_m = _mm256_fmadd_ps(mw, sv, off_m);
                }
                let sc = stored(scaled);
                for (r, acc) in acc.iter_mut().enumerate() {
                    let sc = _mm256_broadcast_ss(&sc[r]);
                    *acc = _mm256_fmadd_ps(row_dot::<false, LO, VNNI>(w, u, r), sc, *acc);
                }
            }
        }
        // SAFETY: the CPU has AVX2 (contract).
        let (d, m) = unsafe { (stored(off_d), stored(off_m)) };
        for r in 0..M {
            // The offset of a level, as the one-row kernel applies it.
            let off = if MIN {
                m[r]
            } else if FIVE {
                -16.0 * d[r]
            } else {
                -8.0 * d[r]
            };
            // SAFETY: the CPU has AVX2 (contract).
            res[r] = unsafe { hsum(acc[r]) } + off;
        }
    }
}

/// `Q8_0` (34-byte blocks, signed levels) against the `M` rows of `a`,
/// each the same bits as the one-row AVX2 kernel gives it.
///
/// # Safety
/// As for [`q4_rows`], with 34-byte blocks.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn q8_rows<const VNNI: bool, const LO: bool, const M: usize>(
    rows: &[&[u8]],
    pf: usize,
    a: &YmmActs,
    res: &mut [[f32; M]],
) {
    const BS: usize = 34;
    let nb = a.k() / 32;
    debug_assert!(rows.iter().all(|r| r.len() >= nb * BS));
    debug_assert!(a.rows() == M);
    let dx_at = vectors(M)[0];
    for (&row, res) in rows.iter().zip(res.iter_mut()) {
        let mut acc = [_mm256_setzero_ps(); M];
        for c in 0..nb {
            // SAFETY: as in `q4_rows`, with 34-byte blocks.
            unsafe {
                let p = row.as_ptr().add(c * BS);
                _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(pf).cast());
                let dw = _mm256_broadcastss_ps(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(
                    p.cast::<u16>().read_unaligned(),
                ))));
                let w = _mm256_loadu_si256(p.add(2).cast());
                let u = a.base().add(c * a.unit());
                let scaled = _mm256_mul_ps(dw, _mm256_load_ps(u.add(dx_at).cast()));
                let sc = stored(scaled);
                for (r, acc) in acc.iter_mut().enumerate() {
                    let sc = _mm256_broadcast_ss(&sc[r]);
                    *acc = _mm256_fmadd_ps(row_dot::<true, LO, VNNI>(w, u, r), sc, *acc);
                }
            }
        }
        for r in 0..M {
            // SAFETY: the CPU has AVX2 (contract).
            res[r] = unsafe { hsum(acc[r]) };
        }
    }
}
