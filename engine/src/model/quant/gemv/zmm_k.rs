//! AVX-512 (F + BW + VNNI) few-row kernels for the K-quants of `Q4_K_M`
//! files, [`NR`] rows at a time like [`super::zmm`]: each 512-bit vector
//! holds 64 weights (two `Q4_K`/`Q5_K` sub-blocks of 32, four `Q6_K`
//! halves of 16), multiplied with one `vpdpbusd` (two with the residual
//! level, combined `(hi << 8) + lo` as in [`super::zmm`]).
//!
//! Scales are decoded once per 256-block and row, vectorized: `Q4_K`'s
//! 6-bit scales and mins by llama.cpp's three-word shuffle, then one
//! widening convert gives the eight `d sc` and eight `dmin m`; `Q6_K`'s 16
//! signed scales likewise. The products take their sub-block's scale with
//! one `vpermps`; the offsets (`dmin m`, `32 d sc`) meet the activations'
//! sums in one FMA per block and row.
//!
//! Invariants: levels fed to `vpdpbusd` lie in 0..=63; `k` is a multiple
//! of 256; the i32 lanes stay below 2^24 (exact f32 conversion).
//! Cost: one pass over the rows' bytes (prefetched [`PF_GROUPS`] row
//! groups ahead), about 10 vector instructions per 64 weights plus ~25
//! per block and row for the scales.

use std::arch::x86_64::*;

use super::super::gemv_k::x86::q4k_scale_bytes;
use super::super::kernels::x86::hsum;
use super::super::NR;
use super::zmm::{lanes, PF_GROUPS};

/// The words of a vector's upper 256 bits (the second copy of `qh`).
pub(super) const UPPER: __mmask32 = 0xffff_0000;

/// Index tables of the K-quant kernels, built at compile time.
pub(super) struct Tables {
    /// `Q4_K` sub-block pair j: lanes 0-7 take scale 2j, 8-15 scale 2j + 1.
    pub(super) pair: [[i32; 16]; 4],
    /// Even and odd lanes (the two 16-sums of each sub-block).
    pub(super) even: [i32; 16],
    pub(super) odd: [i32; 16],
    /// `Q6_K`'s 64 values at 64 m: lanes 4i..4i+4 take half 4m + i's scale.
    pub(super) half: [[i32; 16]; 4],
    /// Lane i takes 32-block i / 2 (a half's activation scale).
    pub(super) by_half: [i32; 16],
}

pub(super) static T: Tables = {
    let mut t = Tables {
        pair: [[0; 16]; 4],
        even: [0; 16],
        odd: [0; 16],
        half: [[0; 16]; 4],
        by_half: [0; 16],
    };
    let mut j = 0;
    while j < 4 {
        let mut i = 0;
        while i < 16 {
            t.pair[j][i] = (2 * j + i / 8) as i32;
            t.half[j][i] = (4 * j + i / 4) as i32;
            i += 1;
        }
        j += 1;
    }
    let mut i = 0;
    while i < 16 {
        t.even[i] = (2 * (i % 8)) as i32;
        t.odd[i] = (2 * (i % 8) + 1) as i32;
        t.by_half[i] = (i / 2) as i32;
        i += 1;
    }
    t
};

/// The activations' integer dot products with `w` (64 weights at `at`).
///
/// # Safety
/// The CPU has AVX-512 F/BW/VNNI; `qx` (and with `LO` `lo`) hold 64 levels
/// at `at`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn dot64<const LO: bool>(w: __m512i, qx: &[i8], lo: &[i8], at: usize) -> __m512 {
    // SAFETY: the contract.
    unsafe {
        let x = _mm512_loadu_si512(qx.as_ptr().add(at).cast());
        let hi = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w, x);
        let p = if LO {
            let xl = _mm512_loadu_si512(lo.as_ptr().add(at).cast());
            _mm512_dpbusd_epi32(_mm512_slli_epi32::<8>(hi), w, xl)
        } else {
            hi
        };
        _mm512_cvtepi32_ps(p)
    }
}

/// One weight row's `Q4_K` (`Q5`: `Q5_K`) 256-block at `blk` decoded:
/// the eight sub-block scales `d sc` and mins `dmin m`, and the four
/// 64-weight level vectors (sub-blocks 2j and 2j + 1 in vector j).
///
/// # Safety
/// The CPU has the features [`super::zmm::available`] checks; `blk` holds
/// one block (144 bytes; `Q5_K`: 176).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub(super) unsafe fn q4k_block<const Q5: bool>(blk: *const u8) -> (__m256, __m256, [__m512i; 4]) {
    let qs_at = if Q5 { 48 } else { 16 };
    let (nib, b16) = (_mm512_set1_epi8(0x0f), _mm512_set1_epi8(0x10));
    // SAFETY: every load lies in the block (the contract).
    unsafe {
        let dd = _mm_cvtph_ps(_mm_cvtsi32_si128(blk.cast::<i32>().read_unaligned()));
        // Bytes 0-7 the scales, 8-15 the mins.
        let sm = q4k_scale_bytes(blk);
        let smf = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(sm));
        let d = _mm256_broadcastss_ps(dd);
        let dmin = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(dd), _mm256_set1_epi32(1));
        let scw = _mm256_mul_ps(_mm512_castps512_ps256(smf), d);
        let mins = _mm256_mul_ps(
            _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(smf))),
            dmin,
        );
        // Q5_K: qh[l] twice, the second copy shifted right by 1: bit 2j
        // of the first and bit 2j + 1 of the second copy's bytes then sit
        // at the same place, bit 2j.
        let h = if Q5 {
            let h = _mm512_broadcast_i64x4(_mm256_loadu_si256(blk.add(16).cast()));
            _mm512_mask_srli_epi16::<1>(h, UPPER, h)
        } else {
            _mm512_setzero_si512()
        };
        let w = std::array::from_fn(|j| {
            let q = _mm256_loadu_si256(blk.add(qs_at + 32 * j).cast());
            let w = _mm512_and_si512(
                _mm512_inserti64x4::<1>(_mm512_castsi256_si512(q), _mm256_srli_epi16::<4>(q)),
                nib,
            );
            if Q5 {
                // Bit 2j to bit 4.
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
        (scw, mins, w)
    }
}

/// One weight row's `Q6_K` block at `blk` decoded: the 16 scales times
/// `d`, and the four 64-weight level vectors (values 64m..64m + 64 in
/// vector m).
///
/// # Safety
/// As for [`q4k_block`], with a 210-byte block.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub(super) unsafe fn q6k_block(blk: *const u8) -> (__m512, [__m512i; 4]) {
    let (nib, m30) = (_mm512_set1_epi8(0x0f), _mm512_set1_epi8(0x30));
    // SAFETY: the 16-byte scale load at 192, the 64-byte ql loads at 0
    // and 64 and the qh loads at 128 and 160 lie in the block.
    unsafe {
        let d = _mm512_cvtph_ps(_mm256_set1_epi16(
            blk.add(208).cast::<i16>().read_unaligned(),
        ));
        let sw = _mm512_mul_ps(
            _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(blk.add(192).cast()))),
            d,
        );
        let mut w = [_mm512_setzero_si512(); 4];
        for n in 0..2 {
            let a = _mm512_loadu_si512(blk.add(64 * n).cast());
            // qh twice, the copy for ql bytes 32-63 shifted right by 2:
            // bits 0-1 (4-5) then give ql bytes 0-31 (32-63) their fifth
            // and sixth bits for the low (high) nibbles.
            let h = _mm512_broadcast_i64x4(_mm256_loadu_si256(blk.add(128 + 32 * n).cast()));
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
        (sw, w)
    }
}

/// `Q4_K` (or, with `Q5`, `Q5_K`) rows against one activation row.
///
/// # Safety
/// The CPU has the features [`super::zmm::available`] checks; every row
/// holds `k / 256` blocks of 144 (`Q5_K`: 176) bytes and lies in one
/// allocation, `qx` (and with `LO` `lo`) k levels, `dx` k / 32 scales, `sx`
/// k / 16 sums, `k = qx.len()`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn q4k<const Q5: bool, const LO: bool>(
    rows: &[&[u8]; NR],
    qx: &[i8],
    lo: &[i8],
    dx: &[f32],
    sx: &[f32],
    res: &mut [f32; NR],
) {
    let nb = qx.len() / 256;
    // Q5_K: d, dmin, scales[12], qh[32], qs[128].
    let bs = super::super::gemv_k::x86::q4k_block_bytes::<Q5>();
    debug_assert!(rows.iter().all(|r| r.len() >= nb * bs));
    debug_assert!(dx.len() >= 8 * nb && sx.len() >= 16 * nb && (!LO || lo.len() >= 256 * nb));
    let (even, odd) = (lanes(&T.even), lanes(&T.odd));
    let pf = PF_GROUPS * NR * nb * bs;
    let rp: [*const u8; NR] = std::array::from_fn(|t| rows[t].as_ptr());
    let mut acc = [_mm512_setzero_ps(); NR];
    let mut off = [_mm256_setzero_ps(); NR];
    for b in 0..nb {
        // SAFETY: b < nb: the block's bs bytes lie in every row, the 256
        // levels at 256 b in `qx` (`lo`), 8 scales at 8 b in `dx`, 16 sums
        // at 16 b in `sx` (contract); prefetches never fault.
        unsafe {
            let dxb = _mm256_loadu_ps(dx.as_ptr().add(8 * b));
            let s16 = _mm512_loadu_ps(sx.as_ptr().add(16 * b));
            // Per sub-block: the sum of its two 16-sums.
            let ssub = _mm512_castps512_ps256(_mm512_add_ps(
                _mm512_permutexvar_ps(even, s16),
                _mm512_permutexvar_ps(odd, s16),
            ));
            for t in 0..NR {
                let blk = rp[t].add(b * bs);
                let ahead = blk.wrapping_add(pf);
                for l in (0..bs).step_by(64) {
                    _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(l).cast());
                }
                let (scw, mins, w) = q4k_block::<Q5>(blk);
                let sc = _mm256_mul_ps(scw, dxb);
                off[t] = _mm256_fmadd_ps(mins, ssub, off[t]);
                let sc = _mm512_castps256_ps512(sc);
                for (j, &w) in w.iter().enumerate() {
                    let p = dot64::<LO>(w, qx, lo, 256 * b + 64 * j);
                    let s = _mm512_permutexvar_ps(lanes(&T.pair[j]), sc);
                    acc[t] = _mm512_fmadd_ps(p, s, acc[t]);
                }
            }
        }
    }
    for t in 0..NR {
        // SAFETY: the CPU has AVX2 (contract).
        res[t] = _mm512_reduce_add_ps(acc[t]) - unsafe { hsum(off[t]) };
    }
}

/// `Q6_K` rows (210-byte blocks: ql[128], qh[64], scales[16], d) against
/// one activation row.
///
/// # Safety
/// As for [`q4k`], with 210-byte blocks.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn q6k<const LO: bool>(
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
    let by_half = lanes(&T.by_half);
    let pf = PF_GROUPS * NR * nb * BS;
    let rp: [*const u8; NR] = std::array::from_fn(|t| rows[t].as_ptr());
    let mut acc = [_mm512_setzero_ps(); NR];
    let mut off = [_mm512_setzero_ps(); NR];
    for b in 0..nb {
        // SAFETY: as in `q4k`, with 210-byte blocks; the 16-byte scale
        // load at 192 and the 64-byte ql loads at 0 and 64 lie inside.
        unsafe {
            let dxh = _mm512_permutexvar_ps(
                by_half,
                _mm512_castps256_ps512(_mm256_loadu_ps(dx.as_ptr().add(8 * b))),
            );
            let s16 = _mm512_loadu_ps(sx.as_ptr().add(16 * b));
            for t in 0..NR {
                let blk = rp[t].add(b * BS);
                let ahead = blk.wrapping_add(pf);
                for l in (0..BS).step_by(64) {
                    _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(l).cast());
                }
                let (sw, w) = q6k_block(blk);
                off[t] = _mm512_fmadd_ps(sw, s16, off[t]);
                let s = _mm512_mul_ps(sw, dxh);
                for (m, &wm) in w.iter().enumerate() {
                    let p = dot64::<LO>(wm, qx, lo, 256 * b + 64 * m);
                    acc[t] =
                        _mm512_fmadd_ps(p, _mm512_permutexvar_ps(lanes(&T.half[m]), s), acc[t]);
                }
            }
        }
    }
    for t in 0..NR {
        res[t] = _mm512_reduce_add_ps(acc[t]) - 32.0 * _mm512_reduce_add_ps(off[t]);
    }
}
