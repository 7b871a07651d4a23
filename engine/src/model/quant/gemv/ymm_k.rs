//! AVX2 few-row kernels for the K-quants (`Q4_K`, `Q5_K`, `Q6_K`) against
//! one activation row, [`NR`] weight rows at a time: the rows' FMA chains
//! are independent, so they overlap where one row's chain waits on its
//! last FMA (the one-row loop this replaces ran at ~12 GB/s from L2, a
//! quarter of the 512-bit kernels).
//!
//! Every row gets [`super::super::gemv_k`]'s arithmetic in its order, so
//! its result is the same bits as before, as the tile kernels' exact form
//! and as [`super::ymm_k_rows`] give it: per 32-block the scale
//! `(d sc) dx` and one FMA into the row's accumulator; the offsets
//! `(dmin m)(s0 + s1)` (`Q6_K`: `32 (s0 a + s1 b)`) subtracted one by one
//! from a scalar. What is vectorized is only what gives each lane the
//! scalar's bits: a 256-block's eight scales and eight offsets are one
//! multiply each (llama.cpp's shuffle unpacks `Q4_K`'s 6-bit scales),
//! kept on the stack and broadcast from there.
//!
//! Loop order: per 256-block, the rows' scales, then its 32-blocks in
//! order with the rows innermost (each weight vector decoded once, the
//! activation vectors loaded once per 32-block), then the rows' offsets.
//! Each row's loop prefetches its position [`PF_GROUPS`] groups of rows
//! ahead, as the 512-bit kernels do.
//!
//! Where the CPU has AVX-VNNI, the kernels run with `VNNI`
//! ([`super::RowKernel`] decides once per product): one `vpdpbusd` per
//! `vpmaddubsw` + `vpmaddwd` ([`dot_levels`]), the same i32 lanes, so the
//! same bits (`gemv_bench --avx2 --l2`, `PAGED_ENGINE_AVX_VNNI=0/1`
//! alternated on Emerald Rapids: `Q4_K` 10.6-10.8 -> 12.7-12.8 GB/s,
//! `Q5_K` 9.6-9.8 -> 10.9, `Q6_K` 11.8 -> 13.8-13.9).
//!
//! Invariants: levels into `vpmaddubsw` lie in 0..=63; `k` is a multiple
//! of 256; the i32 lanes stay below 2^24 (exact conversion).
//! Cost: per 32-block and row ~9 vector instructions (`Q6_K` ~12), per
//! 256-block and row ~25 for the scales and offsets; one pass over the
//! rows' bytes.

use std::arch::x86_64::*;

use super::super::gemv_k::x86::{q4k_block_bytes, q4k_levels, q4k_scale_bytes, q6k_levels};
use super::super::kernels::x86::hsum;
use super::super::NR;
use super::x86::{act_levels, dot_levels};
use super::zmm::PF_GROUPS;

/// Prefetches the `bs` bytes at `p`.
#[inline]
fn prefetch(p: *const u8, bs: usize) {
    for l in (0..bs).step_by(64) {
        // SAFETY: a prefetch never faults, whatever the address.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(l).cast()) };
    }
}

/// Subtracts a block's offsets from each row's chain, one by one in
/// order (the scalar chain of the arithmetic).
#[inline]
fn subtract(off: &mut [f32; NR], offs: &[[f32; 8]; NR]) {
    for (off, offs) in off.iter_mut().zip(offs) {
        for &o in offs {
            *off -= o;
        }
    }
}

/// The rows' results: each accumulator's lane sum plus its offsets.
///
/// # Safety
/// The CPU has AVX2.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn finish(acc: &[__m256; NR], off: &[f32; NR], res: &mut [f32; NR]) {
    for t in 0..NR {
        // SAFETY: the CPU has AVX2 (contract).
        res[t] = unsafe { hsum(acc[t]) } + off[t];
    }
}

/// The integer product of 32 unsigned levels `w` with the activations'
/// levels at `at` (with `LO` also their residuals: [`dot_levels`]), as
/// f32.
///
/// # Safety
/// The CPU has AVX2 (and AVX-VNNI with `VNNI`); `qx` (and with `LO`
/// `lo`) hold 32 levels at `at`.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot32<const VNNI: bool, const LO: bool>(
    w: __m256i,
    qx: &[i8],
    lo: &[i8],
    at: usize,
) -> __m256 {
    // SAFETY: the contract.
    unsafe {
        let (x, xl) = act_levels::<LO>(qx, lo, at);
        _mm256_cvtepi32_ps(dot_levels::<false, LO, VNNI>(w, x, xl))
    }
}

/// `Q4_K` (or, with `Q5`, `Q5_K`) rows against one activation row.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C (and AVX-VNNI with `VNNI`); every row
/// holds `k / 256` blocks of 144 (`Q5_K`: 176) bytes and lies in one
/// allocation, `qx` (and with `LO` `lo`) k levels, `dx` k / 32 scales, `sx`
/// k / 16 sums, `k = qx.len()`.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn q4k<const VNNI: bool, const Q5: bool, const LO: bool>(
    rows: &[&[u8]; NR],
    qx: &[i8],
    lo: &[i8],
    dx: &[f32],
    sx: &[f32],
    res: &mut [f32; NR],
) {
    let nb = qx.len() / 256;
    let bs = q4k_block_bytes::<Q5>();
    debug_assert!(rows.iter().all(|r| r.len() >= nb * bs));
    debug_assert!(dx.len() >= 8 * nb && sx.len() >= 16 * nb && (!LO || lo.len() >= 256 * nb));
    let pf = PF_GROUPS * NR * nb * bs;
    let rp: [*const u8; NR] = std::array::from_fn(|t| rows[t].as_ptr());
    let mut acc = [_mm256_setzero_ps(); NR];
    let mut off = [0f32; NR];
    // Row t's block: the eight 32-blocks' `(d sc) dx` and `(dmin m)(s0 + s1)`.
    let mut scale = [[0f32; 8]; NR];
    let mut offs = [[0f32; 8]; NR];
    for b in 0..nb {
        // SAFETY: b < nb: the block's bs bytes lie in every row, the 256
        // levels at 256 b in `qx` (`lo`), 8 scales at 8 b in `dx`, 16 sums
        // at 16 b in `sx` (contract); the stores go to [f32; 8] arrays.
        unsafe {
            let dxb = _mm256_loadu_ps(dx.as_ptr().add(8 * b));
            // [0 1 4 5 2 3 6 7]'s pair sums, then the 64-bit units in order.
            let pairs = _mm256_hadd_ps(
                _mm256_loadu_ps(sx.as_ptr().add(16 * b)),
                _mm256_loadu_ps(sx.as_ptr().add(16 * b + 8)),
            );
            let ssub = _mm256_castpd_ps(_mm256_permute4x64_pd::<0b11_01_10_00>(_mm256_castps_pd(
                pairs,
            )));
            for t in 0..NR {
                let blk = rp[t].add(b * bs);
                prefetch(blk.wrapping_add(pf), bs);
                let dd = _mm_cvtph_ps(_mm_cvtsi32_si128(blk.cast::<i32>().read_unaligned()));
                let sm = q4k_scale_bytes(blk);
                let sc = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(sm));
                let m = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_unpackhi_epi64(sm, sm)));
                let scw = _mm256_mul_ps(_mm256_broadcastss_ps(dd), sc);
                let mins = _mm256_mul_ps(_mm256_broadcastss_ps(_mm_movehdup_ps(dd)), m);
                _mm256_storeu_ps(scale[t].as_mut_ptr(), _mm256_mul_ps(scw, dxb));
                _mm256_storeu_ps(offs[t].as_mut_ptr(), _mm256_mul_ps(mins, ssub));
            }
            for j in 0..4 {
                for t in 0..NR {
                    let w = q4k_levels::<Q5>(rp[t].add(b * bs), j);
                    for (h, &wh) in w.iter().enumerate() {
                        let p = dot32::<VNNI, LO>(wh, qx, lo, 256 * b + 64 * j + 32 * h);
                        let s = _mm256_broadcast_ss(&scale[t][2 * j + h]);
                        acc[t] = _mm256_fmadd_ps(p, s, acc[t]);
                    }
                }
            }
        }
        subtract(&mut off, &offs);
    }
    // SAFETY: the CPU has AVX2 (contract).
    unsafe { finish(&acc, &off, res) };
}

/// `Q6_K` rows (210-byte blocks: ql[128], qh[64], scales[16], d) against
/// one activation row.
///
/// # Safety
/// As for the `Q4_K` kernel, with 210-byte blocks.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn q6k<const VNNI: bool, const LO: bool>(
    rows: &[&[u8]; NR],
    qx: &[i8],
    lo: &[i8],
    dx: &[f32],
    sx: &[f32],
    res: &mut [f32; NR],
) {
    const BS: usize = 210;
    let nb = qx.len() / 256;
    debug_assert!(rows.iter().all(|r| r.len() >= nb * BS));
    debug_assert!(dx.len() >= 8 * nb && sx.len() >= 16 * nb && (!LO || lo.len() >= 256 * nb));
    let pf = PF_GROUPS * NR * nb * BS;
    let rp: [*const u8; NR] = std::array::from_fn(|t| rows[t].as_ptr());
    // Lanes 2q, 2q + 1 take 32-block q's activation scale (q < 4, then 4..8).
    let halves = [
        _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3),
        _mm256_setr_epi32(4, 4, 5, 5, 6, 6, 7, 7),
    ];
    let mut acc = [_mm256_setzero_ps(); NR];
    let mut off = [0f32; NR];
    // Row t's block: the 16 halves' `(d sc) dx`; the eight 32-blocks'
    // `32 (s0 a + s1 b)`.
    let mut scale = [[0f32; 16]; NR];
    let mut offs = [[0f32; 8]; NR];
    for b in 0..nb {
        // SAFETY: as in the `Q4_K` kernel, with 210-byte blocks: the 16 scale bytes at
        // 192 and `d` at 208 lie in the block; the stores go to the arrays.
        unsafe {
            let dxb = _mm256_loadu_ps(dx.as_ptr().add(8 * b));
            let dxh = [
                _mm256_permutevar8x32_ps(dxb, halves[0]),
                _mm256_permutevar8x32_ps(dxb, halves[1]),
            ];
            let s16 = [
                _mm256_loadu_ps(sx.as_ptr().add(16 * b)),
                _mm256_loadu_ps(sx.as_ptr().add(16 * b + 8)),
            ];
            for t in 0..NR {
                let blk = rp[t].add(b * BS);
                prefetch(blk.wrapping_add(pf), BS);
                let d =
                    _mm256_cvtph_ps(_mm_set1_epi16(blk.add(208).cast::<i16>().read_unaligned()));
                let scb = _mm_loadu_si128(blk.add(192).cast());
                let sw = [
                    _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(scb))),
                    _mm256_mul_ps(
                        d,
                        _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_unpackhi_epi64(scb, scb))),
                    ),
                ];
                _mm256_storeu_ps(scale[t].as_mut_ptr(), _mm256_mul_ps(sw[0], dxh[0]));
                _mm256_storeu_ps(scale[t].as_mut_ptr().add(8), _mm256_mul_ps(sw[1], dxh[1]));
                // [0 1 4 5 2 3 6 7]'s `s0 a + s1 b`, then the units in order.
                let pairs =
                    _mm256_hadd_ps(_mm256_mul_ps(sw[0], s16[0]), _mm256_mul_ps(sw[1], s16[1]));
                let t32 = _mm256_castpd_ps(_mm256_permute4x64_pd::<0b11_01_10_00>(
                    _mm256_castps_pd(pairs),
                ));
                let o = _mm256_mul_ps(_mm256_set1_ps(32.0), t32);
                _mm256_storeu_ps(offs[t].as_mut_ptr(), o);
            }
            // Written out for both halves (see `q6k_half`).
            q6k_half::<VNNI, LO, 0>(&rp, b, qx, lo, &scale, &mut acc);
            q6k_half::<VNNI, LO, 1>(&rp, b, qx, lo, &scale, &mut acc);
        }
        subtract(&mut off, &offs);
    }
    // SAFETY: the CPU has AVX2 (contract).
    unsafe { finish(&acc, &off, res) };
}

/// Sub-blocks `4 N .. 4 N + 4` of every row's `Q6_K` block `b` into the
/// rows' accumulators: each 32-block's integer product times its two
/// halves' scales (`scale[t]`, the 16 halves' `(d sc) dx`). The four
/// sub-blocks' activations are loaded once for all rows.
///
/// # Safety
/// As for [`q6k`]: the CPU has AVX2 (and AVX-VNNI with `VNNI`); block
/// `b` lies in every row, `qx` (with `LO` `lo`) holds its 256 levels;
/// `N < 2`.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn q6k_half<const VNNI: bool, const LO: bool, const N: usize>(
    rp: &[*const u8; NR],
    b: usize,
    qx: &[i8],
    lo: &[i8],
    scale: &[[f32; 16]; NR],
    acc: &mut [__m256; NR],
) {
    const BS: usize = 210;
    // SAFETY: the contract (the 4 sub-blocks' levels lie in `qx`, `lo`).
    let acts: [(__m256i, __m256i); 4] =
        std::array::from_fn(|i| unsafe { act_levels::<LO>(qx, lo, 256 * b + 32 * (4 * N + i)) });
    let mut row = |t: usize| {
        // SAFETY: the contract.
        unsafe {
            let w = q6k_levels(rp[t].add(b * BS), N);
            for (i, (&wi, &(x, xl))) in w.iter().zip(&acts).enumerate() {
                let q = 4 * N + i;
                let p = _mm256_cvtepi32_ps(dot_levels::<false, LO, VNNI>(wi, x, xl));
                // The first 16 values scaled by half 2q's scale, the next
                // 16 by half 2q + 1's (the i32 lanes' halves).
                let s = _mm256_set_m128(
                    _mm_broadcast_ss(&scale[t][2 * q + 1]),
                    _mm_broadcast_ss(&scale[t][2 * q]),
                );
                acc[t] = _mm256_fmadd_ps(p, s, acc[t]);
            }
        }
    };
    // The rows written out: as a loop LLVM kept it rolled (the `asm!`
    // products weigh in its unrolling cost): `gemv_bench --avx2 --l2`
    // Q6_K with AVX-VNNI 12.5 GB/s rolled, 13.8-14.0 written out.
    const _: () = assert!(NR == 4);
    row(0);
    row(1);
    row(2);
    row(3);
}
