//! The AVX-512 VNNI lane kernel: groups of [`MAX_LANES`] activation rows
//! in the i32 lanes of zmm registers (see the parent module for the
//! layout). Per column pair and tile row one `vpdpwssd` multiplies the
//! broadcast pair of weight levels with every row's pair of activations
//! and adds both products into the row's lane: 32 multiply-adds per
//! instruction, against the AVX2 kernel's 16 per two.

// The register blocks index accumulators [group][row] by constant-trip
// loops (unrolled into registers): clearer than zipped iterators here.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use super::super::act::QA;
use super::super::tile::Tile;
use super::super::NR;
use super::{half_scales, GroupRes, LaneActs, MAX_LANES};

/// [`groups`] for `res.len()` (1 or 2) groups, by the tile's scale
/// granularity and offsets.
///
/// # Safety
/// The CPU must have AVX-512 F/BW/VNNI, AVX2 and FMA; `la.width ==
/// MAX_LANES`, `tile.k == la.k`, `g0 + res.len() <= la.groups`,
/// `tile.w16` holds `NR * tile.kp` levels, `res.len()` is 1 or 2.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma")]
pub(super) unsafe fn dispatch(tile: &Tile, la: &LaneActs, g0: usize, res: &mut [GroupRes]) {
    debug_assert_eq!(la.width, MAX_LANES);
    dispatch_groups!(groups, tile, la, g0, res)
}

/// `G` lane groups (`g0..g0 + G`) against one tile: per column pair one
/// load of each group's 32 values, then per tile row one broadcast of its
/// two 16-bit levels (shared by the `G` groups) and per group one
/// `vpdpwssd` into that (row, group)'s i32 lanes; per 32-block (or
/// 16-half with `HALF`) one convert, one multiply (activation scales x the
/// row's scale) and one FMA per (row, group); with `OFF`, one FMA per
/// (row, group) and 16-group for the offsets. `G = 2`: 8 integer and 8
/// float accumulators, 2 activation vectors and the broadcast, all in
/// registers (32 zmm).
///
/// The 8 integer chains of a block are shorter than `vpdpwssd`'s latency
/// needs at two issues a cycle (~6 cycles: 12 chains), but every block
/// starts them from zero, so the core overlaps consecutive blocks: a
/// second set of accumulators for alternate pairs measured the same.
///
/// # Safety
/// As [`dispatch`].
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma")]
unsafe fn groups<const G: usize, const HALF: bool, const OFF: bool>(
    tile: &Tile,
    la: &LaneActs,
    g0: usize,
    res: &mut [GroupRes; G],
) {
    const W: usize = MAX_LANES;
    let (k, kp) = (tile.k, tile.kp);
    let (blocks, sixteens, gp) = (k / QA, k / 16, kp / 16);
    let subs = if HALF { 2 } else { 1 };
    // Column pairs per scale.
    let span = 16 / subs;
    // Group g0 + i's arrays (in bounds by the contract; plain address
    // arithmetic until read).
    let mut xp = [la.x.as_ptr(); G];
    let mut dp = [la.d.as_ptr(); G];
    let mut sp = [la.s.as_ptr(); G];
    for i in 0..G {
        xp[i] = xp[i].wrapping_add((g0 + i) * k * W);
        dp[i] = dp[i].wrapping_add((g0 + i) * blocks * W);
        sp[i] = sp[i].wrapping_add((g0 + i) * sixteens * W);
    }
    let (wp, ap, bp) = (tile.w16.as_ptr(), tile.a8.as_ptr(), tile.bb.as_ptr());
    let mut f = [[_mm512_setzero_ps(); NR]; G];
    for c in 0..blocks {
        // SAFETY: c < k / 32: block c's 16 pairs (16 x 32 i16), its 16
        // scales and its two 16-groups' sums lie inside each group; each
        // tile row t reads w16[t kp + 32 c .. + 32], a8[t kp / 4 + 8 c +
        // 4 h] and bb[t gp + 2 c + h], inside the tile (k <= kp); this
        // function enables AVX-512 VNNI (`vnni_asm!`).
        unsafe {
            let mut dv = [_mm512_setzero_ps(); G];
            for i in 0..G {
                dv[i] = _mm512_loadu_ps(dp[i].add(c * W));
            }
            for h in 0..subs {
                let mut acc = [[_mm512_setzero_si512(); NR]; G];
                for p in c * 16 + h * span..c * 16 + (h + 1) * span {
                    let mut x = [_mm512_setzero_si512(); G];
                    for i in 0..G {
                        x[i] = _mm512_loadu_si512(xp[i].add(p * 2 * W).cast());
                    }
                    for t in 0..NR {
                        let w = wp.add(t * kp + 2 * p).cast::<i32>().read_unaligned();
                        let w = _mm512_set1_epi32(w);
                        for i in 0..G {
                            vnni_asm!("vpdpwssd", zmm_reg, acc[i][t], x[i], w);
                        }
                    }
                }
                for t in 0..NR {
                    let a = _mm512_set1_ps(*ap.add(t * kp / 4 + c * 8 + h * 4));
                    for i in 0..G {
                        let sc = _mm512_mul_ps(dv[i], a);
                        f[i][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[i][t]), sc, f[i][t]);
                    }
                }
            }
            if OFF {
                for h in 2 * c..2 * c + 2 {
                    for i in 0..G {
                        let sv = _mm512_loadu_ps(sp[i].add(h * W));
                        for t in 0..NR {
                            let b = _mm512_set1_ps(*bp.add(t * gp + h));
                            f[i][t] = _mm512_fmadd_ps(b, sv, f[i][t]);
                        }
                    }
                }
            }
        }
    }
    for i in 0..G {
        let mut cols = [[0f32; W]; NR];
        for t in 0..NR {
            // SAFETY: 16 f32 into an [f32; 16].
            unsafe { _mm512_storeu_ps(cols[t].as_mut_ptr(), f[i][t]) };
        }
        for (l, out) in res[i].iter_mut().enumerate() {
            for t in 0..NR {
                out[t] = cols[t][l];
            }
        }
    }
}
