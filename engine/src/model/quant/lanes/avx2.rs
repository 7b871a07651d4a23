//! The AVX2 lane kernel: groups of [`LANES`] activation rows in the i32
//! lanes of ymm registers (see the parent module for the layout). Where
//! the CPU has AVX-VNNI (Intel since Alder Lake and Sapphire Rapids, AMD
//! Zen 5), one VEX `vpdpwssd` replaces each `vpmaddwd` + `vpaddd` pair:
//! the same i32 sums (neither saturates), so the same bits.

// The register blocks index accumulators [group][row] by constant-trip
// loops (unrolled into registers): clearer than zipped iterators here.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use super::super::act::QA;
use super::super::tile::Tile;
use super::super::NR;
use super::{half_scales, GroupRes, LaneActs, LANES};

/// [`groups`] for `res.len()` (1 or 2) groups, by the tile's scale
/// granularity and offsets; with `vnni`, its AVX-VNNI form.
///
/// # Safety
/// The CPU must have AVX2 and FMA (and AVX-VNNI with `vnni`); `la.width
/// == LANES`, `tile.k == la.k`, `g0 + res.len() <= la.groups`, `tile.w16`
/// holds `NR * tile.kp` levels, `res.len()` is 1 or 2.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn dispatch(
    tile: &Tile,
    la: &LaneActs,
    g0: usize,
    res: &mut [GroupRes],
    vnni: bool,
) {
    debug_assert_eq!(la.width, LANES);
    if vnni {
        dispatch_groups!(groups_vnni, tile, la, g0, res)
    } else {
        dispatch_groups!(groups_plain, tile, la, g0, res)
    }
}

/// [`groups`] with `vpmaddwd` + `vpaddd`.
///
/// # Safety
/// As [`dispatch`].
#[target_feature(enable = "avx2,fma")]
unsafe fn groups_plain<const G: usize, const HALF: bool, const OFF: bool>(
    tile: &Tile,
    la: &LaneActs,
    g0: usize,
    res: &mut [GroupRes; G],
) {
    // SAFETY: the contract.
    unsafe { groups::<G, HALF, OFF, false>(tile, la, g0, res) }
}

/// [`groups`] with AVX-VNNI's `vpdpwssd`.
///
/// # Safety
/// As [`dispatch`] with `vnni`.
#[target_feature(enable = "avx2,fma")]
unsafe fn groups_vnni<const G: usize, const HALF: bool, const OFF: bool>(
    tile: &Tile,
    la: &LaneActs,
    g0: usize,
    res: &mut [GroupRes; G],
) {
    // SAFETY: the contract.
    unsafe { groups::<G, HALF, OFF, true>(tile, la, g0, res) }
}

/// `G` lane groups (`g0..g0 + G`) against one tile: per column pair
/// one load of each group's 16 values, then per tile row one broadcast
/// of its two 16-bit levels (shared by the `G` groups), and per group
/// `vpmaddwd` + `vpaddd` (`VNNI`: one `vpdpwssd`) into that (row,
/// group)'s i32 lanes; per
/// 32-block (or 16-half with `HALF`) one convert, one multiply
/// (activation scales x the row's scale) and one FMA per (row, group);
/// with `OFF`, one FMA per (row, group) and 16-group for the offsets.
/// `G = 2` keeps 8 integer accumulators, 2 activation vectors and the
/// broadcast in registers (the float sums, touched once per block, may
/// live on the stack).
///
/// # Safety
/// As [`dispatch`].
#[target_feature(enable = "avx2,fma")]
unsafe fn groups<const G: usize, const HALF: bool, const OFF: bool, const VNNI: bool>(
    tile: &Tile,
    la: &LaneActs,
    g0: usize,
    res: &mut [GroupRes; G],
) {
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
        xp[i] = xp[i].wrapping_add((g0 + i) * k * LANES);
        dp[i] = dp[i].wrapping_add((g0 + i) * blocks * LANES);
        sp[i] = sp[i].wrapping_add((g0 + i) * sixteens * LANES);
    }
    let (wp, ap, bp) = (tile.w16.as_ptr(), tile.a8.as_ptr(), tile.bb.as_ptr());
    let mut f = [[_mm256_setzero_ps(); NR]; G];
    for c in 0..blocks {
        // SAFETY: c < k / 32: block c's 16 pairs (16 x 16 i16), its 8
        // scales and its two 16-groups' sums lie inside each group;
        // each tile row t reads w16[t kp + 32 c .. + 32], a8[t kp / 4 +
        // 8 c + 4 h] and bb[t gp + 2 c + h], inside the tile (k <= kp).
        unsafe {
            let mut dv = [_mm256_setzero_ps(); G];
            for i in 0..G {
                dv[i] = _mm256_loadu_ps(dp[i].add(c * LANES));
            }
            for h in 0..subs {
                let mut acc = [[_mm256_setzero_si256(); NR]; G];
                for p in c * 16 + h * span..c * 16 + (h + 1) * span {
                    let mut x = [_mm256_setzero_si256(); G];
                    for i in 0..G {
                        x[i] = _mm256_loadu_si256(xp[i].add(p * 2 * LANES).cast());
                    }
                    for t in 0..NR {
                        let w = wp.add(t * kp + 2 * p).cast::<i32>().read_unaligned();
                        let w = _mm256_set1_epi32(w);
                        for i in 0..G {
                            if VNNI {
                                vnni_asm!("{{vex}} vpdpwssd", ymm_reg, acc[i][t], x[i], w);
                            } else {
                                let prod = _mm256_madd_epi16(x[i], w);
                                acc[i][t] = _mm256_add_epi32(acc[i][t], prod);
                            }
                        }
                    }
                }
                for t in 0..NR {
                    let a = _mm256_set1_ps(*ap.add(t * kp / 4 + c * 8 + h * 4));
                    for i in 0..G {
                        let sc = _mm256_mul_ps(dv[i], a);
                        f[i][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[i][t]), sc, f[i][t]);
                    }
                }
            }
            if OFF {
                for h in 2 * c..2 * c + 2 {
                    for i in 0..G {
                        let sv = _mm256_loadu_ps(sp[i].add(h * LANES));
                        for t in 0..NR {
                            let b = _mm256_set1_ps(*bp.add(t * gp + h));
                            f[i][t] = _mm256_fmadd_ps(b, sv, f[i][t]);
                        }
                    }
                }
            }
        }
    }
    for i in 0..G {
        let mut cols = [[0f32; LANES]; NR];
        for t in 0..NR {
            // SAFETY: 8 f32 into an [f32; 8].
            unsafe { _mm256_storeu_ps(cols[t].as_mut_ptr(), f[i][t]) };
        }
        for (l, out) in res[i].iter_mut().take(LANES).enumerate() {
            for t in 0..NR {
                out[t] = cols[t][l];
            }
        }
    }
}
