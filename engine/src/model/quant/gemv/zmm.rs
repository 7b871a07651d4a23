//! AVX-512 (F + BW + VNNI) few-row kernels for the 32-block types: two
//! 32-blocks of a row per 512-bit vector, so one `vpdpbusd` (two with the
//! activations' residual level) covers 64 weights.
//!
//! Per pair of blocks and weight row (4- and 5-bit types): each block's 16
//! `qs` bytes broadcast by the load into two 16-byte quarters (block 0 to
//! the low half, block 1 merged into the high one: no shuffle), the high
//! nibbles' quarters shifted right by 4, one `vpand` (`Q5_x`: the fifth
//! bits from `qh` as a 64-bit mask, one masked add), the integer products
//! combined as `(dot(w, q) << 8) + dot(w, lo)` by feeding the shifted first
//! result as the second `vpdpbusd`'s accumulator, one convert and one FMA
//! with the block scales `d` (times the activations' scales) spread over
//! the eight i32 lanes of their block by one permute.
//! `Q8_0` (signed levels): `vpdpbusd` takes `w ^ 0x80` (= `w + 128`) and
//! the activations' `128 * sum(x)` per lane (computed once per pair for all
//! rows) is subtracted in i32, so the result is exact.
//!
//! The scales (`d`, and the mins `m`) are read by scalar loads and
//! converted from f16 for the [`NR`] rows of a call together: one
//! `vcvtph2ps` and one multiply by the activations' scales per pair of
//! blocks for all rows. The offsets (`m`, `-8 d`, `-16 d`) meet the
//! activations' 16-sums in one FMA per pair for all rows (lane `4t + i`:
//! row `t`'s chain of the 16-groups `i` mod 4), summed `(c0 + c2) + (c1 +
//! c3)` at the end. The first form of these kernels converted each row's
//! scales with a `vpermw` + `vcvtph2ps` (and placed the `qs` bytes with a
//! second `vpermw`), per row and pair; on Intel server cores `vpermw` is two
//! port-5 uops and 512-bit code has only ports 0 and 5, and that form ran
//! behind the AVX2 kernels on Emerald Rapids (`gemv_bench --l2` `Q4_1` 9.3
//! GB/s against 11.7; this form 13.0-13.7).
//!
//! Every row gets the same float operations in the same order as the
//! many-row kernels ([`super::zmm_rows`], decoding one row with
//! [`q4_pair`] / [`q8_pair`]) and the tiles' exact form give it, so a
//! row's result is the same bits whichever ran it.
//!
//! Each row's loop prefetches its position [`PF_GROUPS`] groups of [`NR`]
//! rows ahead, so the next rows stream in from DRAM while this group
//! computes (one layer's matrices are small, 0.2 to 1 MB per thread, and
//! the hardware prefetcher restarts at each of them).
//!
//! Invariants: the i32 lanes stay below 2^24 in magnitude (as in the AVX2
//! kernels; `Q8_0`'s lanes after the correction equal the signed products),
//! so the f32 conversion is exact; a row's odd last block runs its own
//! step (`TWO = false`) whose loads stop at the block, so nothing is read
//! past a row's last block.
//! Cost: per pair of blocks and row about 8 vector uops (4-bit, `LO`) for
//! 36 to 48 weight bytes, plus about 12 per pair for the [`NR`] rows'
//! scales and offsets; one pass over the rows' bytes.

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

/// The 16 lanes (indices) of `a` as a vector.
#[inline]
#[target_feature(enable = "avx512f")]
pub(super) fn lanes(a: &[i32; 16]) -> __m512i {
    // SAFETY: `a` is 64 readable bytes.
    unsafe { _mm512_loadu_si512(a.as_ptr().cast()) }
}

/// Permute indices that spread scale `4t + 2 b` (`STRIDE` 4, the 4-bit
/// types' `[d0, m0, d1, m1]` per row) or `2t + b` (`STRIDE` 2, `Q8_0`'s
/// `[d0, d1]`) over block `b`'s eight lanes, for row `t`.
const fn spread<const STRIDE: usize>() -> [[i32; 16]; NR] {
    let mut a = [[0i32; 16]; NR];
    let mut t = 0;
    while t < NR {
        let mut l = 0;
        while l < 16 {
            a[t][l] = (STRIDE * t + STRIDE / 2 * (l / 8)) as i32;
            l += 1;
        }
        t += 1;
    }
    a
}

/// [`spread`] for the 4-bit types' scales.
static D_LANES: [[i32; 16]; NR] = spread::<4>();
/// [`spread`] for `Q8_0`'s scales.
static D8_LANES: [[i32; 16]; NR] = spread::<2>();

/// Lanes that place row `t`'s scales `[d0, d0, d1, d1]` on lanes `4t..4t
/// + 4` (one per 16-group of the pair); plus one, its mins.
static O_LANES: [i32; 16] = {
    let mut a = [0i32; 16];
    let mut l = 0;
    while l < 16 {
        a[l] = (l / 4 * 4 + 2 * (l % 4 / 2)) as i32;
        l += 1;
    }
    a
};

/// The activations' levels (and with `LO` their residuals; else the levels
/// again) of the pair at block `c` (`TWO`; else block `c + 1`'s are zero).
///
/// # Safety
/// The CPU has AVX-512 F/BW; `qx` (and with `LO` `lo`) hold the levels of
/// block `c` (and `c + 1` when `TWO`).
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn acts<const LO: bool, const TWO: bool>(
    qx: &[i8],
    lo: &[i8],
    c: usize,
) -> (__m512i, __m512i) {
    let k: __mmask64 = if TWO { u64::MAX } else { u32::MAX.into() };
    // SAFETY: masked to the blocks present (the contract).
    unsafe {
        let x = _mm512_maskz_loadu_epi8(k, qx.as_ptr().add(32 * c));
        let xl = if LO {
            _mm512_maskz_loadu_epi8(k, lo.as_ptr().add(32 * c))
        } else {
            x
        };
        (x, xl)
    }
}

/// The activations' scales of the pair at block `c` in lanes 0 and 1
/// (lane 1 zero without `TWO`).
///
/// # Safety
/// The CPU has AVX-512 F/VL; `dx` holds scale `c` (and `c + 1` when `TWO`).
#[inline]
#[target_feature(enable = "avx512f,avx512vl")]
unsafe fn act_scales<const TWO: bool>(dx: &[f32], c: usize) -> __m128 {
    // SAFETY: masked to the scales present (the contract).
    unsafe { _mm_maskz_loadu_ps(if TWO { 0b11 } else { 0b01 }, dx.as_ptr().add(c)) }
}

/// One weight row's pair of 4/5-bit blocks decoded: the levels (64
/// bytes), the blocks' scales `d` on their eight lanes each, and the factor
/// the activations' 16-sums meet (`m` for the types with a min, else `d`).
pub(super) struct Q4Pair {
    pub w: __m512i,
    pub dw: __m512,
    pub o: __m512,
}

/// The 64 levels of the pair of blocks at `p` (`TWO`; else block 1's are
/// zero): block 0's 32 in bytes 0-31 (low nibbles, then high), block 1's in
/// 32-63; 0..=15, or (`FIVE`) 0..=31 with the fifth bit from `qh`.
///
/// # Safety
/// The CPU has AVX-512 F/BW; `p` holds the block (and the next when `TWO`).
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn q4_levels<const MIN: bool, const FIVE: bool, const TWO: bool>(p: *const u8) -> __m512i {
    let bs = super::x86::q4_block_bytes::<MIN, FIVE>();
    // SAFETY: each block's qs are its last 16 bytes, qh the 4 before (the
    // contract).
    unsafe {
        let q0 = _mm_loadu_si128(p.add(bs - 16).cast());
        let q = if TWO {
            // Block 1's qs merged into the high half by a masked
            // broadcast load (load + one port-0/5 uop). As `asm!`: LLVM
            // turns `_mm512_mask_broadcast_i32x4` into a 256-bit broadcast
            // + `vinserti64x4`, a port-5 uop, the port this kernel is
            // short of (`gemv_bench --l2` Q4_1 13.2 -> 13.9 GB/s).
            let mut q = _mm512_broadcast_i32x4(q0);
            std::arch::asm!(
                "vbroadcasti32x4 {q}{{{k}}}, xmmword ptr [{p}]",
                q = inout(zmm_reg) q,
                k = in(kreg) 0xff00u16,
                p = in(reg) p.add(2 * bs - 16),
                options(pure, readonly, nostack, preserves_flags),
            );
            q
        } else {
            _mm512_maskz_broadcast_i32x4(0x00ff, q0)
        };
        let w = _mm512_and_si512(
            _mm512_mask_srli_epi64::<4>(q, 0b1100_1100, q),
            _mm512_set1_epi8(0x0f),
        );
        if !FIVE {
            return w;
        }
        let h0 = p.add(bs - 20).cast::<u32>().read_unaligned();
        let h1 = if TWO {
            p.add(2 * bs - 20).cast::<u32>().read_unaligned()
        } else {
            0
        };
        let k = u64::from(h0) | (u64::from(h1) << 32);
        _mm512_mask_add_epi8(w, k, w, _mm512_set1_epi8(16))
    }
}

/// The f16 scales of the pair of 4/5-bit blocks at `p` in words 0-3: `[d0,
/// m0, d1, m1]` (without a min, the `m` words are level bytes, never used;
/// without `TWO`, words 2-3 are zero).
///
/// # Safety
/// The CPU has AVX2; `p` holds the block (and the next when `TWO`).
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn q4_head<const TWO: bool>(p: *const u8, bs: usize) -> __m128i {
    // SAFETY: the first 4 bytes of each block present (the contract).
    unsafe {
        let h = _mm_cvtsi32_si128(p.cast::<i32>().read_unaligned());
        if TWO {
            _mm_insert_epi32::<1>(h, p.add(bs).cast::<i32>().read_unaligned())
        } else {
            h
        }
    }
}

/// Decodes the pair of blocks at `p` (`TWO`; else block 1's lanes are
/// zero) for the many-row kernels: the values [`q4`] uses for the row.
///
/// # Safety
/// The CPU has AVX-512 F/BW/VL and F16C; `p` holds the block (and the next
/// when `TWO`) of the type.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,f16c")]
pub(super) unsafe fn q4_pair<const MIN: bool, const FIVE: bool, const TWO: bool>(
    p: *const u8,
) -> Q4Pair {
    let bs = super::x86::q4_block_bytes::<MIN, FIVE>();
    // SAFETY: the contract.
    unsafe {
        let w = q4_levels::<MIN, FIVE, TWO>(p);
        let sc = _mm512_castps128_ps512(_mm_cvtph_ps(q4_head::<TWO>(p, bs)));
        let d = lanes(&D_LANES[0]);
        let dw = _mm512_permutexvar_ps(d, sc);
        let o = if MIN {
            _mm512_permutexvar_ps(_mm512_add_epi32(d, _mm512_set1_epi32(1)), sc)
        } else {
            dw
        };
        Q4Pair { w, dw, o }
    }
}

/// `Q4_0`, `Q4_1` (`MIN`), `Q5_0` (`FIVE`) or `Q5_1` (both) rows against
/// one activation row: `res[t] = dot(rows[t], x)` (the module's doc says
/// how).
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
    let nb = qx.len() / 32;
    let bs = super::x86::q4_block_bytes::<MIN, FIVE>();
    debug_assert!(rows.iter().all(|r| r.len() >= nb * bs));
    debug_assert!(dx.len() >= nb && sx.len() >= 2 * nb && (!LO || lo.len() >= 32 * nb));
    let mut st = Q4State {
        rp: std::array::from_fn(|t| rows[t].as_ptr()),
        pf: PF_GROUPS * NR * nb * bs,
        d_lanes: std::array::from_fn(|t| lanes(&D_LANES[t])),
        o_lanes: _mm512_add_epi32(lanes(&O_LANES), _mm512_set1_epi32(i32::from(MIN))),
        acc: [_mm512_setzero_ps(); NR],
        off: _mm512_setzero_ps(),
    };
    let mut c = 0;
    while c + 1 < nb {
        // SAFETY: blocks c and c + 1 exist in the activations and in every
        // row (the contract).
        unsafe { q4_step::<MIN, FIVE, LO, true>(&mut st, c, qx, lo, dx, sx) };
        c += 2;
    }
    if c < nb {
        // SAFETY: block c exists (c + 1 does not).
        unsafe { q4_step::<MIN, FIVE, LO, false>(&mut st, c, qx, lo, dx, sx) };
    }
    let mut chains = [0f32; 16];
    // SAFETY: 16 f32 into an [f32; 16].
    unsafe { _mm512_storeu_ps(chains.as_mut_ptr(), st.off) };
    for t in 0..NR {
        let c = &chains[4 * t..4 * t + 4];
        let off = (c[0] + c[2]) + (c[1] + c[3]);
        res[t] = _mm512_reduce_add_ps(st.acc[t]) + offset_factor::<MIN, FIVE>() * off;
    }
}

/// What [`q4`] carries from one block pair to the next.
struct Q4State {
    rp: [*const u8; NR],
    /// Prefetch distance in bytes.
    pf: usize,
    /// [`D_LANES`] and [`O_LANES`] (shifted to the mins for `MIN`).
    d_lanes: [__m512i; NR],
    o_lanes: __m512i,
    acc: [__m512; NR],
    /// Lane `4t + i`: row `t`'s offsets times the 16-sums of group `i`
    /// mod 4.
    off: __m512,
}

/// One pair of blocks (`TWO`; else the last, odd block) at block `c` of
/// every row of [`q4`].
///
/// # Safety
/// As for [`q4`]; block `c` (and `c + 1` when `TWO`) exists.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn q4_step<const MIN: bool, const FIVE: bool, const LO: bool, const TWO: bool>(
    st: &mut Q4State,
    c: usize,
    qx: &[i8],
    lo: &[i8],
    dx: &[f32],
    sx: &[f32],
) {
    let bs = super::x86::q4_block_bytes::<MIN, FIVE>();
    // SAFETY: the blocks exist in the activations and in each row (the
    // contract); the masks select only theirs; a prefetch never faults
    // (wrapping address).
    unsafe {
        let (x, xl) = acts::<LO, TWO>(qx, lo, c);
        // [dx0, 1, dx1, 1] on every row's four lanes.
        let dxv = _mm512_mask_permutexvar_ps(
            _mm512_set1_ps(1.0),
            0x5555,
            _mm512_set_epi32(0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0),
            _mm512_castps128_ps512(act_scales::<TWO>(dx, c)),
        );
        let ks = if TWO { 0b1111 } else { 0b0011 };
        let s = _mm512_broadcast_f32x4(_mm_maskz_loadu_ps(ks, sx.as_ptr().add(2 * c)));
        // Row t's [d0, m0, d1, m1] on lanes 4t..4t + 4, then with the d
        // times the activations' scales (the m times 1: exact).
        let head = |t: usize| q4_head::<TWO>(st.rp[t].add(c * bs), bs);
        let sc = _mm512_cvtph_ps(_mm256_inserti128_si256::<1>(
            _mm256_castsi128_si256(_mm_unpacklo_epi64(head(0), head(1))),
            _mm_unpacklo_epi64(head(2), head(3)),
        ));
        let scaled = _mm512_mul_ps(sc, dxv);
        st.off = _mm512_fmadd_ps(_mm512_permutexvar_ps(st.o_lanes, sc), s, st.off);
        for t in 0..NR {
            let p = st.rp[t].add(c * bs);
            _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(st.pf).cast());
            let w = q4_levels::<MIN, FIVE, TWO>(p);
            let hi = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w, x);
            let prod = if LO {
                _mm512_dpbusd_epi32(_mm512_slli_epi32::<8>(hi), w, xl)
            } else {
                hi
            };
            let dw = _mm512_permutexvar_ps(st.d_lanes[t], scaled);
            st.acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(prod), dw, st.acc[t]);
        }
    }
}

/// The offset of a level per unit of the factor the 16-sums meet: `m`
/// itself (`MIN`), else `-16 d` (`Q5_0`) or `-8 d` (`Q4_0`).
const fn offset_factor<const MIN: bool, const FIVE: bool>() -> f32 {
    if MIN {
        1.0
    } else if FIVE {
        -16.0
    } else {
        -8.0
    }
}

/// A 4/5-bit row's dot product from its accumulators (the many-row
/// kernels' form): the scaled products plus the offsets, whose lanes each
/// met a 16-sum of their block (four lanes per 16-sum) with `m` (`MIN`) or
/// `d` (then `-16 d` for `Q5_0`, `-8 d` for `Q4_0`). The four copies of a
/// chain `c_i` reduce to `4 ((c0 + c2) + (c1 + c3))`, exactly [`q4`]'s sum
/// times 4.
#[inline]
#[target_feature(enable = "avx512f")]
pub(super) fn q4_finish<const MIN: bool, const FIVE: bool>(acc: __m512, off: __m512) -> f32 {
    // The four copies of each chain add exactly; / 4 is exact too.
    let o = 0.25 * offset_factor::<MIN, FIVE>();
    _mm512_reduce_add_ps(acc) + o * _mm512_reduce_add_ps(off)
}

/// `Q8_0`'s 34-byte blocks: d (f16), 32 signed levels.
const Q8_BYTES: usize = 34;

/// The levels `+ 128` of the pair of `Q8_0` blocks at `p` (64 bytes;
/// without `TWO`, block 1's bytes are `0x80`: its activations are zero).
///
/// # Safety
/// The CPU has AVX-512 F; `p` holds the block (and the next when `TWO`).
#[inline]
#[target_feature(enable = "avx512f,avx2")]
unsafe fn q8_levels<const TWO: bool>(p: *const u8) -> __m512i {
    // SAFETY: each block's levels are its 32 bytes after d (the contract).
    unsafe {
        let w0 = _mm256_loadu_si256(p.add(2).cast());
        let w1 = if TWO {
            _mm256_loadu_si256(p.add(Q8_BYTES + 2).cast())
        } else {
            _mm256_setzero_si256()
        };
        _mm512_xor_si512(
            _mm512_inserti64x4::<1>(_mm512_castsi256_si512(w0), w1),
            _mm512_set1_epi8(-128),
        )
    }
}

/// The f16 scales `[d0, d1]` of the pair of `Q8_0` blocks at `p` (`d1`
/// zero without `TWO`) as one word pair.
///
/// # Safety
/// `p` holds the block (and the next when `TWO`).
#[inline]
unsafe fn q8_head<const TWO: bool>(p: *const u8) -> i32 {
    // SAFETY: the first 2 bytes of each block present (the contract).
    unsafe {
        let d0 = p.cast::<u16>().read_unaligned();
        let d1 = if TWO {
            p.add(Q8_BYTES).cast::<u16>().read_unaligned()
        } else {
            0
        };
        (u32::from(d0) | (u32::from(d1) << 16)) as i32
    }
}

/// One weight row's pair of `Q8_0` blocks at `p` for the many-row kernels:
/// [`q8_levels`] and the scales on their eight lanes each.
///
/// # Safety
/// The CPU has AVX-512 F/BW/VL and F16C; `p` holds the block (and the next
/// when `TWO`).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,f16c")]
pub(super) unsafe fn q8_pair<const TWO: bool>(p: *const u8) -> (__m512i, __m512) {
    // SAFETY: the contract.
    unsafe {
        let sc = _mm_cvtph_ps(_mm_cvtsi32_si128(q8_head::<TWO>(p)));
        let dw = _mm512_permutexvar_ps(lanes(&D8_LANES[0]), _mm512_castps128_ps512(sc));
        (q8_levels::<TWO>(p), dw)
    }
}

/// `Q8_0` rows (34-byte blocks: d, 32 signed levels) against one
/// activation row. The rows' scales are converted together and multiplied
/// by the activations' once per pair, as in [`q4`].
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
    let nb = qx.len() / 32;
    debug_assert!(rows.iter().all(|r| r.len() >= nb * Q8_BYTES));
    debug_assert!(dx.len() >= nb && sx.len() >= 2 * nb && (!LO || lo.len() >= 32 * nb));
    let rp: [*const u8; NR] = std::array::from_fn(|t| rows[t].as_ptr());
    let pf = PF_GROUPS * NR * nb * Q8_BYTES;
    let d_lanes: [__m512i; NR] = std::array::from_fn(|t| lanes(&D8_LANES[t]));
    let mut acc = [_mm512_setzero_ps(); NR];
    let mut c = 0;
    while c + 1 < nb {
        // SAFETY: blocks c and c + 1 exist (the contract).
        unsafe { q8_step::<LO, true>(&rp, pf, &d_lanes, &mut acc, c, qx, lo, dx) };
        c += 2;
    }
    if c < nb {
        // SAFETY: block c exists (c + 1 does not).
        unsafe { q8_step::<LO, false>(&rp, pf, &d_lanes, &mut acc, c, qx, lo, dx) };
    }
    for t in 0..NR {
        res[t] = _mm512_reduce_add_ps(acc[t]);
    }
}

/// One pair of blocks (`TWO`; else the last, odd block) at block `c` of
/// every row of [`q8`].
///
/// # Safety
/// As for [`q8`]; block `c` (and `c + 1` when `TWO`) exists.
#[allow(clippy::too_many_arguments)]
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn q8_step<const LO: bool, const TWO: bool>(
    rp: &[*const u8; NR],
    pf: usize,
    d_lanes: &[__m512i; NR],
    acc: &mut [__m512; NR],
    c: usize,
    qx: &[i8],
    lo: &[i8],
    dx: &[f32],
) {
    let flip = _mm512_set1_epi8(-128);
    // SAFETY: the blocks exist in the activations and in each row (the
    // contract); a prefetch never faults (wrapping address).
    unsafe {
        let (x, xl) = acts::<LO, TWO>(qx, lo, c);
        // 128 * (sum of each 4 levels), combined like the products.
        let mut corr = _mm512_dpbusd_epi32(_mm512_setzero_si512(), flip, x);
        if LO {
            corr = _mm512_dpbusd_epi32(_mm512_slli_epi32::<8>(corr), flip, xl);
        }
        // Row t's [d0, d1] on lanes 2t, 2t + 1, times [dx0, dx1].
        let head = |t: usize| q8_head::<TWO>(rp[t].add(c * Q8_BYTES));
        let sc = _mm256_cvtph_ps(_mm_setr_epi32(head(0), head(1), head(2), head(3)));
        let d = _mm256_castpd_ps(_mm256_broadcastsd_pd(_mm_castps_pd(act_scales::<TWO>(
            dx, c,
        ))));
        let scaled = _mm512_castps256_ps512(_mm256_mul_ps(sc, d));
        for t in 0..NR {
            let p = rp[t].add(c * Q8_BYTES);
            let ahead = p.wrapping_add(pf);
            _mm_prefetch::<_MM_HINT_T0>(ahead.cast());
            _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(64).cast());
            let w = q8_levels::<TWO>(p);
            let hi = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w, x);
            let prod = if LO {
                _mm512_dpbusd_epi32(_mm512_slli_epi32::<8>(hi), w, xl)
            } else {
                hi
            };
            let prod = _mm512_sub_epi32(prod, corr);
            let dw = _mm512_permutexvar_ps(d_lanes[t], scaled);
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(prod), dw, acc[t]);
        }
    }
}
