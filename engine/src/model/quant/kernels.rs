//! Integer dot products of a decoded weight [`Tile`] with one quantized
//! activation row, per instruction set.
//!
//! Every kernel computes, for each tile row `t`,
//! `sum_c dx[c] * (a8[t, c] . i32x8(u[t, c] * q[c])) + bb[t] . sums`, where
//! the i32x8 lanes hold sums of 4 adjacent byte products (lanes 0-3 the
//! first 16 values of the 32-block, 4-7 the second), so each lane takes its
//! half's scale from `a8`.
//!
//! - [`Isa::Avx512Vnni`]: `vpdpbusd` on 256-bit vectors (AVX-512 VNNI + VL).
//! - [`Isa::Avx2`]: `vpmaddubsw` + `vpmaddwd` (unsigned levels <= 63 never
//!   saturate the i16 pairs; signed types use `vpsignb`).
//! - [`Isa::Scalar`]: portable i32 loops, the reference the others are
//!   tested against. ARM NEON `sdot` is not written yet: aarch64 runs this.

use super::act::QuantizedActs;
use super::tile::Tile;
use super::NR;

/// The kernel family in use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isa {
    Scalar,
    Avx2,
    Avx512Vnni,
}

impl Isa {
    /// The best kernels this CPU runs (checked at run time).
    pub fn detect() -> Isa {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512vnni")
                && std::arch::is_x86_feature_detected!("avx512vl")
                && std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
            {
                return Isa::Avx512Vnni;
            }
            if std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
            {
                return Isa::Avx2;
            }
        }
        Isa::Scalar
    }

    /// [`Isa::detect`], computed once per process.
    pub fn best() -> Isa {
        static BEST: std::sync::OnceLock<Isa> = std::sync::OnceLock::new();
        *BEST.get_or_init(Isa::detect)
    }

    /// Every kernel family this CPU can run (for tests and benchmarks).
    pub fn available() -> Vec<Isa> {
        let mut v = vec![Isa::Scalar];
        match Isa::detect() {
            Isa::Avx512Vnni => v.extend([Isa::Avx2, Isa::Avx512Vnni]),
            Isa::Avx2 => v.push(Isa::Avx2),
            Isa::Scalar => {}
        }
        v
    }
}

/// `res[t] = dot(tile row t, activation row r)` for every tile row.
///
/// Panics if the tile and activations disagree on `k`. An `isa` the CPU
/// lacks falls back to the scalar kernel.
pub fn dot_tile(isa: Isa, tile: &Tile, act: &QuantizedActs, r: usize, res: &mut [f32; NR]) {
    assert_eq!(tile.k, act.k, "dot_tile: k");
    let row = act.row(r);
    #[cfg(target_arch = "x86_64")]
    {
        let avail = Isa::best();
        let vnni = isa == Isa::Avx512Vnni && avail == Isa::Avx512Vnni;
        let avx2 = (isa == Isa::Avx2 || vnni) && avail != Isa::Scalar;
        if vnni || avx2 {
            // SAFETY: the CPU has the features the called kernel enables
            // (checked by `Isa::best`), and `tile` and `row` have the
            // lengths the kernel reads: `k` levels (twice with a residual),
            // `k / 32` scales and `k / 16` sums per row, guaranteed by
            // `Tile::new(k)`, `QuantizedActs::row` and the assert above.
            unsafe {
                let (qx, dx) = (row.q, row.d);
                let lo = row.lo.unwrap_or(&[]);
                macro_rules! call {
                    ($f:ident) => {
                        match (tile.signed, row.lo.is_some()) {
                            (false, false) => x86::$f::<false, false>(tile, qx, lo, dx, res),
                            (false, true) => x86::$f::<false, true>(tile, qx, lo, dx, res),
                            (true, false) => x86::$f::<true, false>(tile, qx, lo, dx, res),
                            (true, true) => x86::$f::<true, true>(tile, qx, lo, dx, res),
                        }
                    };
                }
                if vnni {
                    call!(dot_vnni);
                } else {
                    call!(dot_avx2);
                }
                if tile.has_offset {
                    x86::add_offsets(tile, row.sums, res);
                }
            }
            return;
        }
    }
    let _ = isa;
    dot_scalar(tile, row, res);
}

/// `dot(u[16], lo or hi levels[16])` in i32.
fn dot16(u: &[i8], x: &[i8]) -> i32 {
    u.iter()
        .zip(x)
        .map(|(&w, &x)| i32::from(w) * i32::from(x))
        .sum()
}

/// The portable kernel.
fn dot_scalar(tile: &Tile, row: super::act::ActRow<'_>, res: &mut [f32; NR]) {
    for (t, out) in res.iter_mut().enumerate() {
        let (u, a8, bb) = tile.row(t);
        let mut acc = 0f32;
        for (c, (uc, &d)) in u.chunks_exact(32).zip(row.d).enumerate() {
            for h in 0..2 {
                let (w, at) = (&uc[h * 16..h * 16 + 16], c * 32 + h * 16);
                let mut s = dot16(w, &row.q[at..at + 16]);
                if let Some(lo) = row.lo {
                    s = 256 * s + dot16(w, &lo[at..at + 16]);
                }
                acc += s as f32 * (a8[c * 8 + h * 4] * d);
            }
        }
        if tile.has_offset {
            acc += bb.iter().zip(row.sums).map(|(b, s)| b * s).sum::<f32>();
        }
        *out = acc;
    }
}

#[cfg(target_arch = "x86_64")]
pub(super) mod x86 {
    use std::arch::x86_64::*;

    use super::super::tile::Tile;
    use super::NR;

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

    /// `u * x` summed over groups of 4 bytes into 8 i32 lanes, VNNI.
    #[inline]
    #[target_feature(enable = "avx2,fma,avx512vnni,avx512vl")]
    pub(in crate::model::quant) unsafe fn dot4_vnni<const SIGNED: bool>(
        w: __m256i,
        x: __m256i,
    ) -> __m256i {
        let z = _mm256_setzero_si256();
        if SIGNED {
            _mm256_dpbusd_epi32(z, _mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w))
        } else {
            _mm256_dpbusd_epi32(z, w, x)
        }
    }

    macro_rules! tile_kernel {
        ($name:ident, $dot:ident, $features:literal) => {
            /// The scaled integer part of the dot products (offsets not
            /// included).
            ///
            /// # Safety
            /// The CPU must have the enabled features; `qx` holds `k`
            /// levels and `dx` `k / 32` scales, `k == tile.k`.
            #[target_feature(enable = $features)]
            pub unsafe fn $name<const SIGNED: bool, const LO: bool>(
                tile: &Tile,
                qx: &[i8],
                lo: &[i8],
                dx: &[f32],
                res: &mut [f32; NR],
            ) {
                let k = tile.k;
                debug_assert!(qx.len() >= k && dx.len() >= k / 32);
                debug_assert!(!LO || lo.len() >= k);
                let (up, ap, xp, lp) =
                    (tile.u.as_ptr(), tile.a8.as_ptr(), qx.as_ptr(), lo.as_ptr());
                let mut acc = [_mm256_setzero_ps(); NR];
                for c in 0..k / 32 {
                    // SAFETY: c < k / 32, so the 32 bytes at c * 32 of each
                    // row (offset t * k, t < NR) lie inside `u` (NR * k
                    // bytes), `qx` and (with LO) `lo` (k each); the 8 floats
                    // at t * k / 4 + c * 8 inside `a8` (NR * k / 4); `dx[c]`
                    // inside `dx` (k / 32). The loads are unaligned; the CPU
                    // has the features this function enables (the caller's
                    // contract).
                    unsafe {
                        let x = _mm256_loadu_si256(xp.add(c * 32).cast());
                        let xl = if LO {
                            _mm256_loadu_si256(lp.add(c * 32).cast())
                        } else {
                            x
                        };
                        let d = _mm256_set1_ps(*dx.get_unchecked(c));
                        for (t, a) in acc.iter_mut().enumerate() {
                            let w = _mm256_loadu_si256(up.add(t * k + c * 32).cast());
                            let mut p = $dot::<SIGNED>(w, x);
                            if LO {
                                p = _mm256_add_epi32(
                                    _mm256_slli_epi32::<8>(p),
                                    $dot::<SIGNED>(w, xl),
                                );
                            }
                            let s = _mm256_mul_ps(_mm256_loadu_ps(ap.add(t * k / 4 + c * 8)), d);
                            *a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), s, *a);
                        }
                    }
                }
                for (r, a) in res.iter_mut().zip(acc) {
                    // SAFETY: the CPU has AVX2 (caller's contract).
                    *r = unsafe { hsum(a) };
                }
            }
        };
    }

    tile_kernel!(dot_avx2, dot4_avx2, "avx2,fma");
    tile_kernel!(dot_vnni, dot4_vnni, "avx2,fma,avx512vnni,avx512vl");

    /// `res[t] += bb[t] . sums` (the weights' per-16 offsets).
    ///
    /// # Safety
    /// The CPU must have AVX2 and FMA; `sx` holds `tile.k / 16` values.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn add_offsets(tile: &Tile, sx: &[f32], res: &mut [f32; NR]) {
        let g = tile.k / 16;
        let whole = g / 8 * 8;
        for (t, r) in res.iter_mut().enumerate() {
            let (_, _, bb) = tile.row(t);
            let mut acc = _mm256_setzero_ps();
            for i in (0..whole).step_by(8) {
                // SAFETY: i + 8 <= whole <= g = bb.len(), and sx.len() >= g.
                let (b, s) = unsafe {
                    (
                        _mm256_loadu_ps(bb.as_ptr().add(i)),
                        _mm256_loadu_ps(sx.as_ptr().add(i)),
                    )
                };
                acc = _mm256_fmadd_ps(b, s, acc);
            }
            let tail: f32 = bb[whole..g]
                .iter()
                .zip(&sx[whole..g])
                .map(|(b, s)| b * s)
                .sum();
            // SAFETY: the CPU has AVX2 (caller's contract).
            *r += unsafe { hsum(acc) } + tail;
        }
    }
}
