//! The batched AVX2 kernel with activation rows across the vector lanes.
//!
//! Why: without VNNI, the row-major kernel of [`super::kernels`] spends
//! per 32-block and (weight row, activation row) pair two `vpmaddubsw`, two
//! `vpmaddwd` (two activation levels), a shift, an add, a convert, a
//! multiply and an FMA: about 9 vector operations for 32 multiply-adds, and
//! the float work is half of it. Here eight activation rows sit in the
//! eight i32 lanes of one ymm register, each lane holding two 16-bit values
//! (the two-level integer `256 q + lo` fits in i16: |.| <= 32639), and one
//! weight row's pair of 16-bit levels is broadcast to every lane: one
//! `vpmaddwd` plus one `vpaddd` per 16 multiply-adds, and the scales are
//! applied once per 32-block (once per 16-half for the types whose scales
//! change every 16 values) for all eight rows at once: about 2.3 operations
//! per 16 multiply-adds instead of about 4.5, and half the multiplies.
//!
//! Layout ([`LaneActs`], built once per product from [`QuantizedActs`]):
//! rows in groups of [`LANES`]; per group and column pair `p`, 16 i16
//! (`[row][2]`); per group and 32-block the eight rows' scales; per group
//! and 16-group the eight rows' scaled sums (for the weights' offsets).
//! Rows past the last whole group stay with the row-major kernels.
//!
//! Weights: the decoded [`Tile`] widened to i16 ([`Tile::widen`]), the
//! level offset taken out there for every type without a minimum (the
//! signed types' 128, `Q4_0`'s 8, `Q5_0`'s 16, ...), so their products need
//! no offset term at all; the types with a minimum keep it in `bb` (one
//! FMA per row, group and 16 values).
//!
//! Invariants: `k` is a multiple of 32; lane sums stay below 2^31 (32
//! products of at most 128 x 32639 each per 32-block: 1.4e8); they are
//! converted to f32 once per block (relative rounding 2^-24, far below the
//! activations' 2^-16).
//! Cost: O(NR k) per tile and group; building the lanes is O(m k).

use super::act::{QuantizedActs, QA};
use super::tile::Tile;
use super::NR;
use model_loader::QuantType;

/// Activation rows per lane group (the i32 lanes of a ymm register).
pub const LANES: usize = 8;

/// Whole groups of [`LANES`] rows of quantized activations in lane order.
#[derive(Debug, Clone)]
pub struct LaneActs {
    pub groups: usize,
    pub k: usize,
    /// `[groups, k / 2, LANES, 2]` combined levels.
    pub x: Vec<i16>,
    /// `[groups, k / 32, LANES]` scales of the combined levels.
    pub d: Vec<f32>,
    /// `[groups, k / 16, LANES]` scaled sums of 16 values.
    pub s: Vec<f32>,
}

impl LaneActs {
    /// The first `m / LANES` whole groups of `act`'s rows, or `None` when
    /// there is no whole group.
    pub fn new(act: &QuantizedActs) -> Option<Self> {
        let (k, groups) = (act.k, act.m / LANES);
        if groups == 0 {
            return None;
        }
        let (pairs, blocks, sixteens) = (k / 2, k / QA, k / 16);
        let mut x = vec![0i16; groups * k * LANES];
        let mut d = vec![0f32; groups * blocks * LANES];
        let mut s = vec![0f32; groups * sixteens * LANES];
        for g in 0..groups {
            for l in 0..LANES {
                let row = act.row(g * LANES + l);
                let xg = &mut x[g * pairs * 2 * LANES..(g + 1) * pairs * 2 * LANES];
                match row.lo {
                    Some(lo) => {
                        for (p, (q2, l2)) in
                            row.q.chunks_exact(2).zip(lo.chunks_exact(2)).enumerate()
                        {
                            let at = (p * LANES + l) * 2;
                            xg[at] = 256 * i16::from(q2[0]) + i16::from(l2[0]);
                            xg[at + 1] = 256 * i16::from(q2[1]) + i16::from(l2[1]);
                        }
                    }
                    None => {
                        for (p, q2) in row.q.chunks_exact(2).enumerate() {
                            let at = (p * LANES + l) * 2;
                            xg[at] = i16::from(q2[0]);
                            xg[at + 1] = i16::from(q2[1]);
                        }
                    }
                }
                for (c, &v) in row.d.iter().enumerate() {
                    d[(g * blocks + c) * LANES + l] = v;
                }
                for (h, &v) in row.sums.iter().enumerate() {
                    s[(g * sixteens + h) * LANES + l] = v;
                }
            }
        }
        Some(Self { groups, k, x, d, s })
    }

    /// Rows covered (whole groups).
    pub fn rows(&self) -> usize {
        self.groups * LANES
    }
}

/// True when `ty`'s two 16-halves of a 32-block may have different scales
/// (the others repeat one scale per 32 values, so the kernel applies it
/// once per block).
pub fn half_scales(ty: QuantType) -> bool {
    matches!(ty, QuantType::Q2K | QuantType::Q3K | QuantType::Q6K)
}

/// `res[i][l][t] = dot(tile row t, activation row (g0 + i) * LANES + l)`
/// for the `res.len()` (1 or 2) groups from `g0`, AVX2 (two groups share
/// each weight broadcast).
///
/// Panics if the tile has no widened levels or disagrees with `la` on
/// `k`, `res` holds not 1 or 2 groups, or they run past `la`'s.
pub fn dot_groups(tile: &Tile, la: &LaneActs, g0: usize, res: &mut [[[f32; NR]; LANES]]) {
    let n = res.len();
    assert!(
        tile.k == la.k
            && (1..=2).contains(&n)
            && g0 + n <= la.groups
            && tile.w16.len() >= NR * tile.kp,
        "dot_groups: shapes"
    );
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
        macro_rules! go {
            ($g:literal) => {{
                let res: &mut [_; $g] = res.try_into().expect("checked length");
                // SAFETY: the CPU has AVX2 and FMA (checked just above);
                // the shapes are asserted above.
                unsafe {
                    match (half_scales(tile.ty()), tile.w16_offset) {
                        (false, false) => x86::groups::<$g, false, false>(tile, la, g0, res),
                        (false, true) => x86::groups::<$g, false, true>(tile, la, g0, res),
                        (true, false) => x86::groups::<$g, true, false>(tile, la, g0, res),
                        (true, true) => x86::groups::<$g, true, true>(tile, la, g0, res),
                    }
                }
            }};
        }
        if n == 2 {
            go!(2)
        } else {
            go!(1)
        }
        return;
    }
    for (i, r) in res.iter_mut().enumerate() {
        scalar_group(tile, la, g0 + i, r);
    }
}

/// The portable form of [`dot_groups`] for one group: the same integer sums and the same
/// fused float operations in the same order per lane, so the same bits.
#[allow(clippy::needless_range_loop)] // columns index levels and activations alike
pub fn scalar_group(tile: &Tile, la: &LaneActs, g: usize, res: &mut [[f32; NR]; LANES]) {
    let (k, kp) = (tile.k, tile.kp);
    let (pairs, blocks, sixteens) = (k / 2, k / QA, k / 16);
    let half = half_scales(tile.ty());
    let gp = kp / 16;
    for (l, out) in res.iter_mut().enumerate() {
        for (t, o) in out.iter_mut().enumerate() {
            let w = &tile.w16[t * kp..t * kp + k];
            let mut f = 0f32;
            for c in 0..blocks {
                let d = la.d[(g * blocks + c) * LANES + l];
                let subs = if half { 2 } else { 1 };
                for h in 0..subs {
                    let span = QA / subs;
                    let mut acc = 0i32;
                    for i in c * QA + h * span..c * QA + (h + 1) * span {
                        let x = la.x[((g * pairs + i / 2) * LANES + l) * 2 + i % 2];
                        acc += i32::from(w[i]) * i32::from(x);
                    }
                    let a = tile.a8[t * kp / 4 + c * 8 + h * 4];
                    f = (acc as f32).mul_add(d * a, f);
                }
                if tile.w16_offset {
                    for h in 2 * c..2 * c + 2 {
                        f = tile.bb[t * gp + h].mul_add(la.s[(g * sixteens + h) * LANES + l], f);
                    }
                }
            }
            *o = f;
        }
    }
}

// The register blocks index accumulators [group][row] by constant-trip
// loops (unrolled into registers): clearer than zipped iterators here.
#[allow(clippy::needless_range_loop)]
#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::super::act::QA;
    use super::super::tile::Tile;
    use super::super::NR;
    use super::{LaneActs, LANES};

    /// `G` lane groups (`g0..g0 + G`) against one tile: per column pair
    /// one load of each group's 16 values, then per tile row one broadcast
    /// of its two 16-bit levels (shared by the `G` groups), and per group
    /// `vpmaddwd` + `vpaddd` into that (row, group)'s i32 lanes; per
    /// 32-block (or 16-half with `HALF`) one convert, one multiply
    /// (activation scales x the row's scale) and one FMA per (row, group);
    /// with `OFF`, one FMA per (row, group) and 16-group for the offsets.
    /// `G = 2` keeps 8 integer accumulators, 2 activation vectors and the
    /// broadcast in registers (the float sums, touched once per block, may
    /// live on the stack).
    ///
    /// # Safety
    /// The CPU must have AVX2 and FMA; `tile.k == la.k`, `g0 + G <=
    /// la.groups`, `tile.w16` holds `NR * tile.kp` levels.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn groups<const G: usize, const HALF: bool, const OFF: bool>(
        tile: &Tile,
        la: &LaneActs,
        g0: usize,
        res: &mut [[[f32; NR]; LANES]; G],
    ) {
        let (k, kp) = (tile.k, tile.kp);
        let (blocks, sixteens, gp) = (k / QA, k / 16, kp / 16);
        let subs = if HALF { 2 } else { 1 };
        let span = 16 / subs; // column pairs per scale
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
                                let prod = _mm256_madd_epi16(x[i], w);
                                acc[i][t] = _mm256_add_epi32(acc[i][t], prod);
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
            for (l, out) in res[i].iter_mut().enumerate() {
                for t in 0..NR {
                    out[t] = cols[t][l];
                }
            }
        }
    }
}
