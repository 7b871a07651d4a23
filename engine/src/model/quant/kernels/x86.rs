//! The x86-64 register blocks: AVX-512 VNNI on zmm and AVX2 (see the
//! parent module for the kernels' arithmetic).

// The register blocks index accumulators [row][column] by constant-trip
// loops (unrolled into registers): clearer than zipped iterators here.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use super::super::act::QuantizedActs;
use super::super::tile::{offset_form, OffsetForm, Tile, STEP};
use super::{MR, NR};

/// Sum of the 8 lanes.
#[target_feature(enable = "avx2,fma")]
pub(in crate::model::quant) unsafe fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_shuffle_ps::<1>(s, s));
    _mm_cvtss_f32(s)
}

/// `u * x` summed over groups of 4 bytes into 8 i32 lanes, AVX2.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(in crate::model::quant) unsafe fn dot4_avx2<const SIGNED: bool>(
    w: __m256i,
    x: __m256i,
) -> __m256i {
    let p16 = if SIGNED {
        _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w))
    } else {
        _mm256_maddubs_epi16(w, x)
    };
    _mm256_madd_epi16(p16, _mm256_set1_epi16(1))
}

/// Pointers to activation rows `r0..r0 + M`: levels, residual levels
/// (the levels again without a residual), scales, sums.
struct Rows<const M: usize> {
    q: [*const i8; M],
    lo: [*const i8; M],
    d: [*const f32; M],
    s: [*const f32; M],
}

impl<const M: usize> Rows<M> {
    fn new(act: &QuantizedActs, r0: usize) -> Self {
        let (k, lo) = (act.k, !act.lo.is_empty());
        let at = |r: usize| (r0 + r) * k;
        Self {
            // `wrapping_add`: plain address arithmetic; the kernels read
            // only inside the rows (their callers' contract).
            q: std::array::from_fn(|r| act.q.as_ptr().wrapping_add(at(r))),
            lo: std::array::from_fn(|r| {
                if lo {
                    act.lo.as_ptr().wrapping_add(at(r))
                } else {
                    act.q.as_ptr().wrapping_add(at(r))
                }
            }),
            d: std::array::from_fn(|r| act.d.as_ptr().wrapping_add(at(r) / 32)),
            s: std::array::from_fn(|r| act.sums.as_ptr().wrapping_add(at(r) / 16)),
        }
    }
}

/// [`block_zmm`] for `mr` rows, with or without a residual level.
///
/// # Safety
/// The CPU must have AVX-512 F/BW/VNNI, AVX2 and FMA; `1 <= mr <= MR`,
/// `r0 + mr <= act.m`, `tile.k == act.k`.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma")]
pub unsafe fn block_zmm_dispatch(
    tile: &Tile,
    act: &QuantizedActs,
    r0: usize,
    mr: usize,
    res: &mut [[f32; NR]; MR],
) {
    macro_rules! go {
        ($m:literal) => {
            match (act.lo.is_empty(), tile.signed) {
                (true, false) => block_zmm::<$m, false, false>(tile, Rows::new(act, r0), res),
                (false, false) => block_zmm::<$m, true, false>(tile, Rows::new(act, r0), res),
                (true, true) => block_zmm::<$m, false, true>(tile, Rows::new(act, r0), res),
                (false, true) => block_zmm::<$m, true, true>(tile, Rows::new(act, r0), res),
            }
        };
    }
    // SAFETY: the caller's contract, passed on (rows r0..r0 + mr exist).
    unsafe {
        match mr {
            1 => go!(1),
            2 => go!(2),
            3 => go!(3),
            _ => go!(4),
        }
    }
}

/// The 512-bit register block: `M` activation rows x [`NR`] weight
/// rows, 64 levels per step. Per step and pair: `vpdpbusd` of the high
/// level, shifted 8 bits, `vpdpbusd` of the residual into the same i32
/// lanes (exact), one convert, and one FMA with the lane's scale
/// (weight half-scale x activation block scale). The weights' offsets
/// are added into the same accumulators at the end, then each pair is
/// reduced once.
///
/// # Safety
/// The CPU must have the enabled features; `rows` point at `M` rows of
/// `tile.k` levels (`k / 32` scales, `k / 16` sums) each.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma")]
unsafe fn block_zmm<const M: usize, const LO: bool, const SIGNED: bool>(
    tile: &Tile,
    rows: Rows<M>,
    res: &mut [[f32; NR]; MR],
) {
    let (k, kp) = (tile.k, tile.kp);
    let (up, ap) = (tile.u.as_ptr(), tile.a8.as_ptr());
    // Lanes 0-7 take the first block's scale, 8-15 the second's.
    let idx = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    let (zero, c80) = (_mm512_setzero_si512(), _mm512_set1_epi8(-128));
    let mut acc = [[_mm512_setzero_ps(); NR]; M];
    let steps = k.div_ceil(STEP);
    for s in 0..steps {
        // A last step of 32 (k = 32 mod 64) reads half the levels and
        // one scale; the tile's padding is zero.
        let (xm, dm): (__mmask64, __mmask16) = if (s + 1) * STEP <= k {
            (!0, 0b11)
        } else {
            (0xffff_ffff, 0b1)
        };
        // SAFETY: s * 64 < kp, so the 64 levels and 16 scales of each
        // tile row at t * kp + s * 64 (t * kp / 4 + s * 16) lie inside
        // `u` (NR kp) and `a8` (NR kp / 4). Activation loads are masked
        // to the row: 64 (or, on the last half step, 32) levels at
        // s * 64 < k, and 2 (or 1) scales at 2 s < k / 32.
        unsafe {
            let mut w = [zero; NR];
            let mut a = [_mm512_setzero_ps(); NR];
            for t in 0..NR {
                w[t] = _mm512_loadu_si512(up.add(t * kp + s * STEP).cast());
                a[t] = _mm512_loadu_ps(ap.add(t * kp / 4 + s * 16));
            }
            for r in 0..M {
                let x = _mm512_maskz_loadu_epi8(xm, rows.q[r].add(s * STEP));
                let xl = if LO {
                    _mm512_maskz_loadu_epi8(xm, rows.lo[r].add(s * STEP))
                } else {
                    x
                };
                let d = _mm512_maskz_loadu_ps(dm, rows.d[r].add(2 * s));
                let d = _mm512_permutexvar_ps(idx, d);
                // The signed types' levels carry +128: take out
                // 128 * sum(x) with the same shift pattern.
                let corr = if SIGNED {
                    let c = _mm512_dpbusd_epi32(zero, c80, x);
                    if LO {
                        _mm512_dpbusd_epi32(_mm512_slli_epi32::<8>(c), c80, xl)
                    } else {
                        c
                    }
                } else {
                    zero
                };
                for t in 0..NR {
                    let mut p = _mm512_dpbusd_epi32(zero, w[t], x);
                    if LO {
                        p = _mm512_dpbusd_epi32(_mm512_slli_epi32::<8>(p), w[t], xl);
                    }
                    if SIGNED {
                        p = _mm512_sub_epi32(p, corr);
                    }
                    let sc = _mm512_mul_ps(a[t], d);
                    acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), sc, acc[r][t]);
                }
            }
        }
    }
    let mut off = [[0f32; NR]; M];
    // SAFETY: the tile's arrays and the rows' sums hold what
    // `offsets_zmm` reads (the contract, `Tile::new`).
    let folded = unsafe { offsets_zmm(tile, &rows, &mut off) };
    if folded && tile.has_offset {
        let (g, gp) = (k / 16, kp / 16);
        let bp = tile.bb.as_ptr();
        for i in (0..g).step_by(16) {
            let mk: __mmask16 = if g - i >= 16 {
                !0
            } else {
                (1u16 << (g - i)) - 1
            };
            // SAFETY: masked to i..g: inside each tile row's `bb`
            // (t * gp + i.., g <= gp) and each activation row's sums.
            unsafe {
                for t in 0..NR {
                    let b = _mm512_maskz_loadu_ps(mk, bp.add(t * gp + i));
                    for r in 0..M {
                        let sx = _mm512_maskz_loadu_ps(mk, rows.s[r].add(i));
                        acc[r][t] = _mm512_fmadd_ps(b, sx, acc[r][t]);
                    }
                }
            }
        }
    }
    for r in 0..M {
        for t in 0..NR {
            res[r][t] = _mm512_reduce_add_ps(acc[r][t]);
            if tile.has_offset && !folded {
                res[r][t] += off[r][t];
            }
        }
    }
}

/// The offset terms `off[r][t]` of the 512-bit block in the direct
/// 512-bit kernels' arithmetic ([`super::super::gemv`]'s `zmm` and
/// `zmm_k`, see [`OffsetForm`]), so the block's rows equal theirs bit
/// for bit. Returns true (and computes nothing) for
/// [`OffsetForm::Folded`], whose offsets the caller folds into its
/// accumulators.
///
/// # Safety
/// As [`block_zmm`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")]
unsafe fn offsets_zmm<const M: usize>(
    tile: &Tile,
    rows: &Rows<M>,
    off: &mut [[f32; NR]; M],
) -> bool {
    let (k, gp) = (tile.k, tile.kp / 16);
    let g = k / 16;
    let bp = tile.bb.as_ptr();
    if !tile.exact {
        return true;
    }
    match offset_form(tile.ty()) {
        OffsetForm::None => {}
        OffsetForm::Folded => return true,
        OffsetForm::Pairs => {
            // Lanes 4t + i: tile row t's chain of the 16-groups
            // = i mod 4 (the direct kernel's lanes 4i..4i + 4, one
            // copy instead of four: its reduction adds the four
            // copies exactly and scales them back by 1/4).
            let qp = tile.bbq.as_ptr();
            let mut o = [_mm512_setzero_ps(); M];
            for s in 0..g.div_ceil(4) {
                let mk: __mmask8 = if g - 4 * s >= 4 { 0xf } else { 0x3 };
                // SAFETY: 16 values at 16 s < NR kp / 16 = bbq.len();
                // the sums load is masked to the groups below g.
                unsafe {
                    let b = _mm512_loadu_ps(qp.add(16 * s));
                    for r in 0..M {
                        let sx = _mm_maskz_loadu_ps(mk, rows.s[r].add(4 * s));
                        o[r] = _mm512_fmadd_ps(b, _mm512_broadcast_f32x4(sx), o[r]);
                    }
                }
            }
            for r in 0..M {
                let mut v = [0f32; 16];
                // SAFETY: 16 f32 into an [f32; 16].
                unsafe { _mm512_storeu_ps(v.as_mut_ptr(), o[r]) };
                for t in 0..NR {
                    let c = &v[4 * t..4 * t + 4];
                    off[r][t] = (c[0] + c[2]) + (c[1] + c[3]);
                }
            }
        }
        OffsetForm::Sub32 => {
            let (even, odd) = (
                _mm512_set_epi32(14, 12, 10, 8, 6, 4, 2, 0, 14, 12, 10, 8, 6, 4, 2, 0),
                _mm512_set_epi32(15, 13, 11, 9, 7, 5, 3, 1, 15, 13, 11, 9, 7, 5, 3, 1),
            );
            for r in 0..M {
                let mut o = [_mm256_setzero_ps(); NR];
                for b in 0..g / 16 {
                    // SAFETY: 16 sums at 16 b < g in the row's sums,
                    // 16 offsets at t gp + 16 b < t gp + g in `bb`.
                    unsafe {
                        let s16 = _mm512_loadu_ps(rows.s[r].add(16 * b));
                        let ssub = _mm512_castps512_ps256(_mm512_add_ps(
                            _mm512_permutexvar_ps(even, s16),
                            _mm512_permutexvar_ps(odd, s16),
                        ));
                        for t in 0..NR {
                            let bv = _mm512_castps512_ps256(_mm512_permutexvar_ps(
                                even,
                                _mm512_loadu_ps(bp.add(t * gp + 16 * b)),
                            ));
                            o[t] = _mm256_fmadd_ps(bv, ssub, o[t]);
                        }
                    }
                }
                for t in 0..NR {
                    // SAFETY: the CPU has AVX2 (contract).
                    off[r][t] = unsafe { hsum(o[t]) };
                }
            }
        }
        OffsetForm::Half16 => {
            for r in 0..M {
                let mut o = [_mm512_setzero_ps(); NR];
                for b in 0..g / 16 {
                    // SAFETY: as for `Sub32`.
                    unsafe {
                        let s16 = _mm512_loadu_ps(rows.s[r].add(16 * b));
                        for t in 0..NR {
                            let bv = _mm512_loadu_ps(bp.add(t * gp + 16 * b));
                            o[t] = _mm512_fmadd_ps(bv, s16, o[t]);
                        }
                    }
                }
                for t in 0..NR {
                    off[r][t] = _mm512_reduce_add_ps(o[t]);
                }
            }
        }
    }
    false
}

/// [`block_avx2`] over `mr` rows, two at a time.
///
/// # Safety
/// The CPU must have AVX2 and FMA; `r0 + mr <= act.m`, `mr <= MR`,
/// `tile.k == act.k`.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn block_avx2_dispatch(
    tile: &Tile,
    act: &QuantizedActs,
    r0: usize,
    mr: usize,
    res: &mut [[f32; NR]; MR],
) {
    let mut r = 0;
    while r < mr {
        let two = mr - r >= 2;
        let mut out = [[0f32; NR]; 2];
        // SAFETY: rows r0 + r (.. + 1 when `two`) exist (the caller's
        // contract); the CPU has AVX2 and FMA.
        unsafe {
            macro_rules! go {
                ($m:literal) => {
                    match (act.lo.is_empty(), tile.signed) {
                        (true, false) => {
                            block_avx2::<$m, false, false>(tile, Rows::new(act, r0 + r), &mut out)
                        }
                        (false, false) => {
                            block_avx2::<$m, true, false>(tile, Rows::new(act, r0 + r), &mut out)
                        }
                        (true, true) => {
                            block_avx2::<$m, false, true>(tile, Rows::new(act, r0 + r), &mut out)
                        }
                        (false, true) => {
                            block_avx2::<$m, true, true>(tile, Rows::new(act, r0 + r), &mut out)
                        }
                    }
                };
            }
            if two {
                go!(2)
            } else {
                go!(1)
            }
        }
        let n = if two { 2 } else { 1 };
        res[r..r + n].copy_from_slice(&out[..n]);
        r += n;
    }
}

/// The 256-bit register block: `M` (<= 2: AVX2 has 16 registers)
/// activation rows x [`NR`] weight rows, one 32-block per step; signed
/// levels flip back (`u ^ 0x80`) and use the sign trick, since
/// `vpmaddubsw` saturates past 63.
///
/// # Safety
/// As [`block_zmm`], for AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
unsafe fn block_avx2<const M: usize, const LO: bool, const SIGNED: bool>(
    tile: &Tile,
    rows: Rows<M>,
    res: &mut [[f32; NR]; 2],
) {
    let (k, kp) = (tile.k, tile.kp);
    let (up, ap) = (tile.u.as_ptr(), tile.a8.as_ptr());
    let flip = _mm256_set1_epi8(-128);
    let mut acc = [[_mm256_setzero_ps(); NR]; M];
    for c in 0..k / 32 {
        // SAFETY: c * 32 < k: 32 levels / 8 scales of each tile row and
        // 32 levels / 1 scale of each activation row lie inside them.
        unsafe {
            for r in 0..M {
                let x = _mm256_loadu_si256(rows.q[r].add(c * 32).cast());
                let xl = if LO {
                    _mm256_loadu_si256(rows.lo[r].add(c * 32).cast())
                } else {
                    x
                };
                let d = _mm256_set1_ps(*rows.d[r].add(c));
                for t in 0..NR {
                    let mut w = _mm256_loadu_si256(up.add(t * kp + c * 32).cast());
                    if SIGNED {
                        w = _mm256_xor_si256(w, flip);
                    }
                    let mut p = dot4_avx2::<SIGNED>(w, x);
                    if LO {
                        p = _mm256_add_epi32(_mm256_slli_epi32::<8>(p), dot4_avx2::<SIGNED>(w, xl));
                    }
                    let sc = _mm256_mul_ps(_mm256_loadu_ps(ap.add(t * kp / 4 + c * 8)), d);
                    acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), sc, acc[r][t]);
                }
            }
        }
    }
    let form = if tile.exact {
        offset_form(tile.ty())
    } else {
        OffsetForm::Folded
    };
    let mut tail = [[0f32; NR]; M];
    if tile.has_offset && form == OffsetForm::Folded {
        let (g, gp) = (k / 16, kp / 16);
        let whole = g / 8 * 8;
        for t in 0..NR {
            let bb = &tile.bb[t * gp..t * gp + g];
            for r in 0..M {
                // SAFETY: row r's sums hold g values (caller's contract).
                let sx = unsafe { std::slice::from_raw_parts(rows.s[r], g) };
                for i in (0..whole).step_by(8) {
                    // SAFETY: i + 8 <= whole <= g, both slices hold g.
                    unsafe {
                        let b = _mm256_loadu_ps(bb.as_ptr().add(i));
                        let s = _mm256_loadu_ps(sx.as_ptr().add(i));
                        acc[r][t] = _mm256_fmadd_ps(b, s, acc[r][t]);
                    }
                }
                tail[r][t] = bb[whole..]
                    .iter()
                    .zip(&sx[whole..])
                    .map(|(b, s)| b * s)
                    .sum();
            }
        }
    } else if tile.has_offset {
        // The direct AVX2 kernels' offset chains ([`OffsetForm`]),
        // so these rows equal theirs bit for bit.
        let (g, gp) = (k / 16, kp / 16);
        for t in 0..NR {
            let bb = &tile.bb[t * gp..t * gp + g];
            for r in 0..M {
                // SAFETY: row r's sums hold g values (caller's contract).
                let sx = unsafe { std::slice::from_raw_parts(rows.s[r], g) };
                tail[r][t] = offsets_avx2(form, bb, sx);
            }
        }
    }
    for r in 0..M {
        for t in 0..NR {
            // SAFETY: the CPU has AVX2 (caller's contract).
            let h = unsafe { hsum(acc[r][t]) };
            res[r][t] = if tile.has_offset { h + tail[r][t] } else { h };
        }
    }
}

/// One (tile row, activation row) pair's offset term in the direct
/// AVX2 kernels' arithmetic: `bb` and `sx` hold the `k / 16` offsets
/// and 16-sums. `mul_add` is the FMA instruction here (the caller
/// enables FMA).
#[inline]
#[target_feature(enable = "avx2,fma")]
fn offsets_avx2(form: OffsetForm, bb: &[f32], sx: &[f32]) -> f32 {
    let mut o = 0f32;
    let pairs = bb.chunks_exact(2).zip(sx.chunks_exact(2));
    match form {
        OffsetForm::Pairs => {
            for (b, s) in pairs {
                o = b[0].mul_add(s[0] + s[1], o);
            }
        }
        OffsetForm::Sub32 => {
            for (b, s) in pairs {
                o += b[0] * (s[0] + s[1]);
            }
        }
        OffsetForm::Half16 => {
            for (b, s) in pairs {
                o += b[0] * s[0] + b[1] * s[1];
            }
        }
        OffsetForm::None | OffsetForm::Folded => {}
    }
    o
}
