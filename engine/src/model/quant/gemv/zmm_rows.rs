//! AVX-512 VNNI few-row kernels for several activation rows at once: each
//! weight block is loaded and decoded once and multiplied with up to
//! [`MAX_ROWS`] activation rows (the verification rows of speculative
//! decoding, small decode batches). The one-row kernels of [`super::zmm`]
//! and [`super::zmm_k`] decode a block again for every activation row.
//! Measured (`gemv_bench --rows=M`, 96 MiB matrices, 2 threads): at 4
//! rows against the one-row kernels run four times, Q8_0 2.1x, Q6_K 2.3x,
//! Q5_0 and Q4_K 1.5x the weight bytes per second; at 6 and 8 rows against
//! the tile path (which [`super::super::MANY_MAX_M`] now replaces for
//! them) 1.5x to 2x; at 9 and 12 rows (two chunks, each decoding the
//! blocks again) 1.2x to 1.6x.
//!
//! Every activation row gets the same integer sums and the same float
//! operations in the same order as the one-row kernels give it, so a row's
//! result is the same bits whichever kernel ran it (the batch-invariant
//! mode relies on this; `rows_are_bit_identical_whatever_the_batch` checks
//! it). The activations are packed once per product ([`PackedActs`]): each
//! row's levels, residuals and what the one-row kernels build per block
//! from the activations alone (each 32-block's scale on its eight lanes,
//! each 16-sum on its four, `Q8_0`'s `128 * sum` correction), interleaved
//! by block so one pointer and constant offsets reach every row: with a
//! pointer per row and array the loop spilled its general registers and
//! gained nothing.
//!
//! Loop order: one weight row at a time (the [`super::super::NR`] rows of a
//! tile lie one after the other in memory, so this still streams), blocks
//! in order, the activation rows innermost; `2 m` float accumulators.
//!
//! Invariants: as in [`super::zmm`] (levels 0..=63 into `vpdpbusd`, i32
//! lanes below 2^24, weight loads masked to the blocks present); the packed
//! data is 64-byte aligned and an absent block's lanes are zero.
//! Cost: per pair of 32-blocks and weight row ~7 vector instructions of
//! decode (no `vpermw`: [`super::zmm::q4_pair`]) plus ~11 per activation
//! row; [`PackedActs`] is `4 m k` bytes
//! (`32-block types`; `2.5 m k` for K-quants), built once per product.

use std::arch::x86_64::*;

use model_loader::QuantType;

use super::super::act::QuantizedActs;
use super::packed::PackedRows;
use super::zmm::{q4_finish, q4_pair, q8_pair, Q4Pair};

/// Most activation rows one kernel call takes (its `2 m` accumulators stay
/// in registers); more rows are packed in several chunks.
pub const MAX_ROWS: usize = 8;

/// Bytes per pair of 32-blocks and activation row in [`PackedActs`]:
/// levels, residual levels, the blocks' scales on their eight lanes each,
/// and the 16-sums on their four lanes each (`Q8_0`: instead, `128 * sum`
/// of each lane's four levels, combined `(hi << 8) + lo` as the products
/// are). An odd last block's missing partner is zeros, as the one-row
/// kernels' masked loads give.
pub const PAIR_UNIT: usize = 256;
/// Bytes per 256-block and activation row (K-quants): levels, residual
/// levels, the eight scales (32 bytes, then 32 of padding), the 16 sums.
pub const K_UNIT: usize = 640;

/// The activation rows of one product packed for these kernels, built
/// once per product: unit `u` (a pair of 32-blocks or a 256-block) of row
/// `r` at `(u m + r) * unit` bytes, 64-byte aligned, so one pointer and
/// constant offsets reach every row's data (a pointer per row and array
/// spilled the general registers).
pub type PackedActs = PackedRows<64>;

impl PackedRows<64> {
    /// Rows `rows` of `act` (at most [`MAX_ROWS`]) packed for `ty`'s
    /// kernels, or `None` when there are none for `ty`.
    pub fn new(act: &QuantizedActs, rows: std::ops::Range<usize>, ty: QuantType) -> Option<Self> {
        let (pairs, q8) = match ty {
            QuantType::Q4_0 | QuantType::Q4_1 | QuantType::Q5_0 | QuantType::Q5_1 => (true, false),
            QuantType::Q8_0 => (true, true),
            QuantType::Q4K | QuantType::Q5K | QuantType::Q6K => (false, false),
            _ => return None,
        };
        let (m, k) = (rows.len(), act.k);
        if m == 0 || m > MAX_ROWS || rows.end > act.m || (!pairs && !k.is_multiple_of(256)) {
            return None;
        }
        let (unit, units) = if pairs {
            (PAIR_UNIT, (k / 32).div_ceil(2))
        } else {
            (K_UNIT, k / 256)
        };
        let mut a = Self::zeroed(m, k, unit, units * m * unit);
        let data = a.data_mut();
        let f32s = |dst: &mut [u8], vals: &mut dyn Iterator<Item = f32>| {
            for (d, v) in dst.chunks_exact_mut(4).zip(vals) {
                d.copy_from_slice(&v.to_ne_bytes());
            }
        };
        for (r, ar) in rows.enumerate() {
            let row = act.row(ar);
            let vals = if pairs { 64 } else { 256 };
            for u in 0..units {
                let at = (u * m + r) * unit;
                let dst = &mut data[at..at + unit];
                let v = u * vals..(u * vals + vals).min(k);
                let n = v.len();
                for (d, &q) in dst[..n].iter_mut().zip(&row.q[v.clone()]) {
                    *d = q as u8;
                }
                if let Some(lo) = row.lo {
                    for (d, &l) in dst[vals..vals + n].iter_mut().zip(&lo[v.clone()]) {
                        *d = l as u8;
                    }
                }
                if !pairs {
                    f32s(
                        &mut dst[512..544],
                        &mut row.d[8 * u..8 * u + 8].iter().copied(),
                    );
                    f32s(
                        &mut dst[576..640],
                        &mut row.sums[16 * u..16 * u + 16].iter().copied(),
                    );
                    continue;
                }
                // Lane l (of 16) covers values 4l..4l + 4 of the pair.
                let lanes = n / 4;
                f32s(
                    &mut dst[128..192],
                    &mut (0..lanes).map(|l| row.d[2 * u + l / 8]),
                );
                if q8 {
                    let four = |v: &[i8], l: usize| -> i32 {
                        let at = 64 * u + 4 * l;
                        v[at..at + 4].iter().map(|&x| 128 * i32::from(x)).sum()
                    };
                    for (l, d) in dst[192..256].chunks_exact_mut(4).take(lanes).enumerate() {
                        let c = match row.lo {
                            Some(lo) => (four(row.q, l) << 8) + four(lo, l),
                            None => four(row.q, l),
                        };
                        d.copy_from_slice(&c.to_ne_bytes());
                    }
                } else {
                    f32s(
                        &mut dst[192..256],
                        &mut (0..lanes).map(|l| row.sums[4 * u + l / 4]),
                    );
                }
            }
        }
        Some(a)
    }
}

/// `(dot(w, q) << 8) + dot(w, lo)` (`LO`; else `dot(w, q)`) in 16 i32
/// lanes of four products each, for the 64 levels at `at` and their
/// residuals `lo_at` bytes on: the one-row kernels' integer products, on
/// packed activations.
///
/// # Safety
/// The CPU has AVX-512 F/BW/VNNI; `at` and, with `LO`, `at + lo_at` are
/// 64-byte aligned and hold 64 readable bytes (a unit of [`PackedActs`]).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub(super) unsafe fn packed_dot<const LO: bool>(
    w: __m512i,
    at: *const u8,
    lo_at: usize,
) -> __m512i {
    // SAFETY: the contract.
    unsafe {
        let hi = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w, _mm512_load_si512(at.cast()));
        if LO {
            let xl = _mm512_load_si512(at.add(lo_at).cast());
            _mm512_dpbusd_epi32(_mm512_slli_epi32::<8>(hi), w, xl)
        } else {
            hi
        }
    }
}

/// `Q4_0`, `Q4_1` (`MIN`), `Q5_0` (`FIVE`) or `Q5_1` (both): `res[t][r] =
/// dot(rows[t], activation row r)` for the `M` rows packed in `a`, each the
/// same bits as [`super::zmm::q4`] gives it.
///
/// # Safety
/// The CPU has the features [`super::zmm::available`] checks; each of
/// `rows` holds `a.k() / 32` blocks of the type and lies in one allocation
/// (the prefetch `pf` bytes ahead needs no validity); `a` was packed by
/// [`PackedActs::new`] for the type with `M` rows (with residual levels
/// when `LO`).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn q4_rows<const MIN: bool, const FIVE: bool, const LO: bool, const M: usize>(
    rows: &[&[u8]],
    pf: usize,
    a: &PackedActs,
    res: &mut [[f32; M]],
) {
    let bs = super::x86::q4_block_bytes::<MIN, FIVE>();
    let nb = a.k() / 32;
    debug_assert!(rows.iter().all(|r| r.len() >= nb * bs));
    debug_assert!(a.rows() == M && a.unit() == PAIR_UNIT);
    for (&row, res) in rows.iter().zip(res.iter_mut()) {
        let mut acc = [[_mm512_setzero_ps(); M]; 2];
        let mut c = 0;
        while c + 1 < nb {
            // SAFETY: blocks c and c + 1 exist in `row` and in every
            // packed row, at unit c / 2.
            unsafe { q4_rows_step::<MIN, FIVE, LO, M, true>(row, c, pf, a, &mut acc) };
            c += 2;
        }
        if c < nb {
            // SAFETY: block c exists (c + 1 does not).
            unsafe { q4_rows_step::<MIN, FIVE, LO, M, false>(row, c, pf, a, &mut acc) };
        }
        for r in 0..M {
            res[r] = q4_finish::<MIN, FIVE>(acc[0][r], acc[1][r]);
        }
    }
}

/// One pair of blocks (`TWO`; else the last, odd block) at block `c` of
/// `row` against the `M` packed rows: `acc[0]` the products, `acc[1]` the
/// offsets.
///
/// # Safety
/// As for [`q4_rows`]; block `c` (and `c + 1` when `TWO`) exists.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn q4_rows_step<
    const MIN: bool,
    const FIVE: bool,
    const LO: bool,
    const M: usize,
    const TWO: bool,
>(
    row: &[u8],
    c: usize,
    pf: usize,
    a: &PackedActs,
    acc: &mut [[__m512; M]; 2],
) {
    let bs = super::x86::q4_block_bytes::<MIN, FIVE>();
    // SAFETY: the blocks exist in `row` and in every packed row, at unit
    // c / 2 (the contract); a prefetch never faults (wrapping address).
    unsafe {
        let p = row.as_ptr().add(c * bs);
        _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(pf).cast());
        let Q4Pair { w, dw, o } = q4_pair::<MIN, FIVE, TWO>(p);
        let u = a.base().add(c / 2 * M * PAIR_UNIT);
        let [acc, off] = acc;
        for (r, (acc, off)) in acc.iter_mut().zip(off.iter_mut()).enumerate() {
            let at = u.add(r * PAIR_UNIT);
            let prod = packed_dot::<LO>(w, at, 64);
            let d = _mm512_load_ps(at.add(128).cast());
            let s = _mm512_load_ps(at.add(192).cast());
            *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(prod), _mm512_mul_ps(dw, d), *acc);
            *off = _mm512_fmadd_ps(o, s, *off);
        }
    }
}

/// `Q8_0` (34-byte blocks) against the `M` rows of `a`, each the same bits
/// as [`super::zmm::q8`] gives it.
///
/// # Safety
/// As for [`q4_rows`], with 34-byte blocks (`a` packed for `Q8_0`: the
/// corrections in place of the sums).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn q8_rows<const LO: bool, const M: usize>(
    rows: &[&[u8]],
    pf: usize,
    a: &PackedActs,
    res: &mut [[f32; M]],
) {
    const BS: usize = 34;
    let nb = a.k() / 32;
    debug_assert!(rows.iter().all(|r| r.len() >= nb * BS));
    debug_assert!(a.rows() == M && a.unit() == PAIR_UNIT);
    for (&row, res) in rows.iter().zip(res.iter_mut()) {
        let mut acc = [_mm512_setzero_ps(); M];
        let mut c = 0;
        while c + 1 < nb {
            // SAFETY: blocks c and c + 1 exist in `row` and in every
            // packed row, at unit c / 2.
            unsafe { q8_rows_step::<LO, M, true>(row.as_ptr().add(c * BS), c, pf, a, &mut acc) };
            c += 2;
        }
        if c < nb {
            // SAFETY: block c exists (c + 1 does not).
            unsafe { q8_rows_step::<LO, M, false>(row.as_ptr().add(c * BS), c, pf, a, &mut acc) };
        }
        for r in 0..M {
            res[r] = _mm512_reduce_add_ps(acc[r]);
        }
    }
}

/// One pair of `Q8_0` blocks (`TWO`; else the last, odd block) at `p`,
/// block `c` of its row, against the `M` packed rows.
///
/// # Safety
/// As for [`q8_rows`]; `p` holds block `c` (and `c + 1` when `TWO`).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn q8_rows_step<const LO: bool, const M: usize, const TWO: bool>(
    p: *const u8,
    c: usize,
    pf: usize,
    a: &PackedActs,
    acc: &mut [__m512; M],
) {
    // SAFETY: the contract; a prefetch never faults (wrapping address).
    unsafe {
        let ahead = p.wrapping_add(pf);
        _mm_prefetch::<_MM_HINT_T0>(ahead.cast());
        _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(64).cast());
        let (w, dw) = q8_pair::<TWO>(p);
        let u = a.base().add(c / 2 * M * PAIR_UNIT);
        for (r, acc) in acc.iter_mut().enumerate() {
            let at = u.add(r * PAIR_UNIT);
            let prod = packed_dot::<LO>(w, at, 64);
            let corr = _mm512_load_si512(at.add(192).cast());
            let prod = _mm512_sub_epi32(prod, corr);
            let d = _mm512_load_ps(at.add(128).cast());
            *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(prod), _mm512_mul_ps(dw, d), *acc);
        }
    }
}
