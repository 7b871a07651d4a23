//! AVX-512 (F + BW + VNNI) few-row kernels for the 32-block types: two
//! 32-blocks of a row per 512-bit vector, so one `vpdpbusd` (two with the
//! activations' residual level) covers 64 weights.
//!
//! Per pair of blocks and weight row (4- and 5-bit types): one masked load
//! of the pair's bytes, one `vpermw` that places each block's 16 `qs` bytes
//! twice (for the low and the high nibbles), a masked `vpsrlw` + `vpand` to take
//! the nibbles (`Q5_x`: the fifth bits from `qh` as a 64-bit mask, one
//! masked add), one `vpermw` + `vcvtph2ps` for the two scales `d` (and
//! mins `m`) on the eight i32 lanes of their block, the integer products
//! combined as `(dot(w, q) << 8) + dot(w, lo)` by feeding the shifted
//! first result as the second `vpdpbusd`'s accumulator, one convert and one
//! FMA. The offsets (`m`, `-8 d`, `-16 d`) accumulate per lane against the
//! activations' 16-sums and are summed once per row.
//! `Q8_0` (signed levels): `vpdpbusd` takes `w ^ 0x80` (= `w + 128`) and
//! the activations' `128 * sum(x)` per lane (computed once per pair for all
//! rows) is subtracted in i32, so the result is exact.
//!
//! Each row's loop prefetches its position [`PF_GROUPS`] groups of [`NR`]
//! rows ahead, so the next rows stream in from DRAM while this group
//! computes (one layer's matrices are small, 0.2 to 1 MB per thread, and
//! the hardware prefetcher restarts at each of them).
//!
//! Invariants: the i32 lanes stay below 2^24 in magnitude (as in the AVX2
//! kernels; `Q8_0`'s lanes after the correction equal the signed products),
//! so the f32 conversion is exact; the weight loads are masked to the
//! bytes of the blocks present, so nothing is read past a row's last block.
//! Cost: per pair of blocks and row about 15 vector instructions for 36 to
//! 68 weight bytes; one pass over the rows' bytes.

use std::arch::x86_64::*;
use std::sync::OnceLock;

use super::super::NR;

/// How many groups of [`NR`] rows ahead each row's loop prefetches.
pub(super) const PF_GROUPS: usize = 2;

/// True when the CPU runs these kernels (checked once).
pub fn available() -> bool {
    static OK: OnceLock<bool> = OnceLock::new();
    *OK.get_or_init(|| {
        is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512vl")
            && is_x86_feature_detected!("avx512vnni")
            && is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c")
    })
}

/// The 32 words (indices, shift counts) of `a` as a vector.
#[inline]
#[target_feature(enable = "avx512f")]
pub(super) fn words(a: &[i16; 32]) -> __m512i {
    // SAFETY: `a` is 64 readable bytes.
    unsafe { _mm512_loadu_si512(a.as_ptr().cast()) }
}

/// The 16 lanes (indices) of `a` as a vector.
#[inline]
#[target_feature(enable = "avx512f")]
pub(super) fn lanes(a: &[i32; 16]) -> __m512i {
    // SAFETY: `a` is 64 readable bytes.
    unsafe { _mm512_loadu_si512(a.as_ptr().cast()) }
}

/// `vpermw` indices for a pair of `bs`-byte 4-bit blocks: `[0]` words 0-7
/// and 8-15 block 0's 16 `qs` bytes (for the low, then the high nibbles),
/// 16-31 block 1's; `[1]` words 0-7 block 0's `d`, 8-15 block 1's, 16-31
/// the same for `m` (the word after `d`). Built at compile time.
const fn q4_idx(bs: usize) -> [[i16; 32]; 2] {
    let mut a = [[0i16; 32]; 2];
    let mut i = 0;
    while i < 32 {
        a[0][i] = ((i / 16) * bs / 2 + (bs - 16) / 2 + i % 8) as i16;
        a[1][i] = ((i / 8 % 2) * bs / 2 + i / 16) as i16;
        i += 1;
    }
    a
}

/// [`q4_idx`] for 18, 20, 22 and 24-byte blocks.
static Q4_IDX: [[[i16; 32]; 2]; 4] = [q4_idx(18), q4_idx(20), q4_idx(22), q4_idx(24)];

/// The words shifted right by 4 (8-15 and 24-31: the high nibbles). A
/// masked immediate shift: `vpsrlvw` through the intrinsic costs a second
/// instruction (its count >= 16 rule becomes a masked move).
const HIGH: __mmask32 = 0xff00_ff00;

/// `Q8_0`'s scale words: block 0's `d` (word 0) on words 0-7, block 1's
/// (word 17) on 8-15.
static Q8_SIDX: [i16; 32] = {
    let mut a = [0i16; 32];
    let mut i = 8;
    while i < 16 {
        a[i] = 17;
        i += 1;
    }
    a
};

/// Mask of the first `n` bytes.
pub(super) fn first(n: usize) -> u64 {
    if n >= 64 {
        u64::MAX
    } else {
        (1u64 << n) - 1
    }
}

/// The activations of the pair at block `c` (`two`: block `c + 1` too;
/// otherwise its lanes are zero): levels, residual levels (zero without
/// `LO`), scales (eight lanes per block) and 16-sums (four lanes each).
struct Pair {
    x: __m512i,
    xl: __m512i,
    d: __m512,
    s: __m512,
}

/// Loads [`Pair`] `c`.
///
/// # Safety
/// The CPU has AVX-512 F/BW/VL; `qx` (and with `LO` `lo`) hold the levels
/// of block `c` (and `c + 1` when `two`), `dx` and `sx` their scales and
/// sums.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn pair<const LO: bool>(
    qx: &[i8],
    lo: &[i8],
    dx: &[f32],
    sx: &[f32],
    c: usize,
    two: bool,
) -> Pair {
    let (kx, kd, ks) = if two {
        (u64::MAX, 0b11, 0b1111)
    } else {
        (first(32), 0b01, 0b0011)
    };
    let by_block = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    let by_half = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
    // SAFETY: the masks select only the present blocks' elements (the
    // contract); masked-off elements are not read.
    unsafe {
        let x = _mm512_maskz_loadu_epi8(kx, qx.as_ptr().add(32 * c));
        let xl = if LO {
            _mm512_maskz_loadu_epi8(kx, lo.as_ptr().add(32 * c))
        } else {
            _mm512_setzero_si512()
        };
        let d = _mm_maskz_loadu_ps(kd, dx.as_ptr().add(c));
        let s = _mm_maskz_loadu_ps(ks, sx.as_ptr().add(2 * c));
        Pair {
            x,
            xl,
            d: _mm512_permutexvar_ps(by_block, _mm512_castps128_ps512(d)),
            s: _mm512_permutexvar_ps(by_half, _mm512_castps128_ps512(s)),
        }
    }
}

/// One weight row's pair of 4/5-bit blocks decoded: the levels (64
/// bytes), the blocks' scales `d` on their eight lanes each, and the factor
/// the activations' 16-sums meet (`m` for the types with a min, else `d`).
pub(super) struct Q4Pair {
    pub w: __m512i,
    pub dw: __m512,
    pub o: __m512,
}

/// Decodes the pair of blocks at `p` (`two`: block `c + 1` too, `bs`
/// bytes on; otherwise its lanes are zero) for [`q4`] and the many-row
/// kernels alike.
///
/// # Safety
/// The CPU has AVX-512 F/BW/VL and F16C; `p` holds the block (and the next
/// when `two`) of the type with `bs`-byte blocks.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
pub(super) unsafe fn q4_pair<const MIN: bool, const FIVE: bool>(
    p: *const u8,
    two: bool,
    bs: usize,
) -> Q4Pair {
    let qh_at = if MIN { 4 } else { 2 };
    let idx = &Q4_IDX[(bs - 18) / 2];
    let (qidx, sidx) = (words(&idx[0]), words(&idx[1]));
    let kw = first(if two { 2 * bs } else { bs });
    // SAFETY: the loads are masked to the blocks present (the contract).
    unsafe {
        let raw = _mm512_maskz_loadu_epi8(kw, p.cast());
        let qs = _mm512_permutexvar_epi16(qidx, raw);
        let mut w = _mm512_and_si512(
            _mm512_mask_srli_epi16::<4>(qs, HIGH, qs),
            _mm512_set1_epi8(0x0f),
        );
        if FIVE {
            let h0 = p.add(qh_at).cast::<u32>().read_unaligned();
            let h1 = if two {
                p.add(bs + qh_at).cast::<u32>().read_unaligned()
            } else {
                0
            };
            let k = u64::from(h0) | (u64::from(h1) << 32);
            w = _mm512_mask_add_epi8(w, k, w, _mm512_set1_epi8(16));
        }
        let sc = _mm512_permutexvar_epi16(sidx, raw);
        let dw = _mm512_cvtph_ps(_mm512_castsi512_si256(sc));
        let o = if MIN {
            _mm512_cvtph_ps(_mm512_extracti64x4_epi64::<1>(sc))
        } else {
            dw
        };
        Q4Pair { w, dw, o }
    }
}

/// One weight row's pair of `Q8_0` blocks at `p`: the levels `+ 128`
/// (64 bytes; an absent second block's are zero) and the scales on their
/// eight lanes each.
///
/// # Safety
/// The CPU has AVX-512 F/BW/VL and F16C; `p` holds the block (and the next
/// when `two`).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
pub(super) unsafe fn q8_pair(p: *const u8, two: bool) -> (__m512i, __m512) {
    const BS: usize = 34;
    let (k1, kd) = if two {
        (u32::MAX, first(2 * BS))
    } else {
        (0, first(2))
    };
    // SAFETY: the loads of block c + 1's bytes are masked off when it is
    // absent (the contract).
    unsafe {
        let w0 = _mm256_loadu_si256(p.add(2).cast());
        let w1 = _mm256_maskz_loadu_epi8(k1, p.add(BS + 2).cast());
        let w = _mm512_xor_si512(
            _mm512_inserti64x4::<1>(_mm512_castsi256_si512(w0), w1),
            _mm512_set1_epi8(-128),
        );
        let raw = _mm512_maskz_loadu_epi8(kd, p.cast());
        let dw = _mm512_cvtph_ps(_mm512_castsi512_si256(_mm512_permutexvar_epi16(
            words(&Q8_SIDX),
            raw,
        )));
        (w, dw)
    }
}

/// `Q4_0`, `Q4_1` (`MIN`), `Q5_0` (`FIVE`) or `Q5_1` (both) rows against
/// one activation row: `res[t] = dot(rows[t], x)`.
///
/// # Safety
/// The CPU has the features [`available`] checks; every row holds
/// `k / 32` blocks of the type (18, 20, 22 or 24 bytes) and lies inside
/// one allocation (the prefetches ahead need no validity), `qx` k levels,
/// `dx` k / 32 scales, `sx` k / 16 sums, `k = qx.len()`; with `LO`, `lo`
/// k levels.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn q4<const MIN: bool, const FIVE: bool, const LO: bool>(
    rows: &[&[u8]; NR],
    qx: &[i8],
    lo: &[i8],
    dx: &[f32],
    sx: &[f32],
    res: &mut [f32; NR],
) {
    // d (f16), [m (f16)], [qh (u32)], qs[16].
    let bs = super::x86::q4_block_bytes::<MIN, FIVE>();
    let nb = qx.len() / 32;
    debug_assert!(rows.iter().all(|r| r.len() >= nb * bs));
    debug_assert!(dx.len() >= nb && sx.len() >= 2 * nb && (!LO || lo.len() >= 32 * nb));
    let pf = PF_GROUPS * NR * nb * bs;
    let rp: [*const u8; NR] = std::array::from_fn(|t| rows[t].as_ptr());
    let mut acc = [_mm512_setzero_ps(); NR];
    let mut off = [_mm512_setzero_ps(); NR];
    let mut c = 0;
    while c < nb {
        let two = c + 1 < nb;
        // SAFETY: blocks c (and c + 1 when `two`) exist in the activations
        // and in each row (contract); a prefetch never faults (wrapping
        // address).
        unsafe {
            let a = pair::<LO>(qx, lo, dx, sx, c, two);
            for t in 0..NR {
                let p = rp[t].add(c * bs);
                _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(pf).cast());
                let Q4Pair { w, dw, o } = q4_pair::<MIN, FIVE>(p, two, bs);
                let hi = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w, a.x);
                let prod = if LO {
                    _mm512_dpbusd_epi32(_mm512_slli_epi32::<8>(hi), w, a.xl)
                } else {
                    hi
                };
                acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(prod), _mm512_mul_ps(dw, a.d), acc[t]);
                off[t] = _mm512_fmadd_ps(o, a.s, off[t]);
            }
        }
        c += 2;
    }
    for t in 0..NR {
        res[t] = q4_finish::<MIN, FIVE>(acc[t], off[t]);
    }
}

/// A 4/5-bit row's dot product from its accumulators: the scaled products
/// plus the offsets, whose lanes each met a 16-sum of their block (four
/// lanes per 16-sum) with `m` (`MIN`) or `d` (then `-16 d` for `Q5_0`,
/// `-8 d` for `Q4_0`).
#[inline]
#[target_feature(enable = "avx512f")]
pub(super) fn q4_finish<const MIN: bool, const FIVE: bool>(acc: __m512, off: __m512) -> f32 {
    let o = 0.25
        * if MIN {
            1.0
        } else if FIVE {
            -16.0
        } else {
            -8.0
        };
    _mm512_reduce_add_ps(acc) + o * _mm512_reduce_add_ps(off)
}

/// `Q8_0` rows (34-byte blocks: d, 32 signed levels) against one
/// activation row.
///
/// # Safety
/// As for [`q4`], with 34-byte blocks (`sx` unused).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn q8<const LO: bool>(
    rows: &[&[u8]; NR],
    qx: &[i8],
    lo: &[i8],
    dx: &[f32],
    sx: &[f32],
    res: &mut [f32; NR],
) {
    const BS: usize = 34;
    let nb = qx.len() / 32;
    debug_assert!(rows.iter().all(|r| r.len() >= nb * BS));
    debug_assert!(dx.len() >= nb && sx.len() >= 2 * nb && (!LO || lo.len() >= 32 * nb));
    let flip = _mm512_set1_epi8(-128);
    let pf = PF_GROUPS * NR * nb * BS;
    let rp: [*const u8; NR] = std::array::from_fn(|t| rows[t].as_ptr());
    let mut acc = [_mm512_setzero_ps(); NR];
    let mut c = 0;
    while c < nb {
        let two = c + 1 < nb;
        // SAFETY: as in `q4`, with 34-byte blocks.
        unsafe {
            let a = pair::<LO>(qx, lo, dx, sx, c, two);
            // 128 * (sum of each 4 levels), combined like the products.
            let mut corr = _mm512_dpbusd_epi32(_mm512_setzero_si512(), flip, a.x);
            if LO {
                corr = _mm512_dpbusd_epi32(_mm512_slli_epi32::<8>(corr), flip, a.xl);
            }
            for t in 0..NR {
                let p = rp[t].add(c * BS);
                let ahead = p.wrapping_add(pf);
                _mm_prefetch::<_MM_HINT_T0>(ahead.cast());
                _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(64).cast());
                let (w, dw) = q8_pair(p, two);
                let hi = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w, a.x);
                let prod = if LO {
                    _mm512_dpbusd_epi32(_mm512_slli_epi32::<8>(hi), w, a.xl)
                } else {
                    hi
                };
                let prod = _mm512_sub_epi32(prod, corr);
                acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(prod), _mm512_mul_ps(dw, a.d), acc[t]);
            }
        }
        c += 2;
    }
    for t in 0..NR {
        res[t] = _mm512_reduce_add_ps(acc[t]);
    }
}
