//! The batched kernels with activation rows across the vector lanes.
//!
//! Why: the row-major kernels of [`super::kernels`] spend, per 32-block
//! and (weight row, activation row) pair, the integer products plus a
//! shift, a convert, a multiply and an FMA to scale and combine them (AVX2
//! without VNNI: about 9 vector operations for 32 multiply-adds, half of it
//! float work; AVX-512 VNNI: 2 `vpdpbusd` and 4 float or shift operations
//! per 64). Here a group of activation rows sits in the i32 lanes of one
//! register, each lane holding two 16-bit values (the two-level integer
//! `256 q + lo` fits in i16: |.| <= 32639), and one weight row's pair of
//! 16-bit levels is broadcast to every lane, so the integer work is one
//! multiply-add of pairs per lane and the scales are applied once per
//! 32-block (once per 16-half for the types whose scales change every 16
//! values) for the whole group at once:
//! - AVX2 ([`avx2`], groups of 8 rows in ymm): `vpmaddwd` + `vpaddd` per 16
//!   multiply-adds (about 2.3 operations with the float work, against 4.5).
//! - AVX-512 VNNI ([`zmm`], groups of 16 rows in zmm): one `vpdpwssd` per
//!   32 multiply-adds (forced by `asm!`: the compiler split most of them),
//!   each weight pair broadcast once for two groups; the float work is one
//!   operation per 170 multiply-adds.
//!
//! Layout ([`LaneActs`], built once per product from [`QuantizedActs`],
//! for one group width `w`): rows in groups of `w`; per group and column
//! pair `p`, `w` x 2 i16 (`[row][2]`); per group and 32-block the rows'
//! scales; per group and 16-group the rows' scaled sums (for the weights'
//! offsets). Rows past the last whole group stay with the row-major
//! kernels.
//!
//! Weights: the decoded [`Tile`] widened to i16 ([`Tile::widen`]), the
//! level offset taken out there for every type without a minimum (the
//! signed types' 128, `Q4_0`'s 8, `Q5_0`'s 16, ...), so their products need
//! no offset term at all; the types with a minimum keep it in `bb` (one
//! FMA per row, group and 16 values).
//!
//! Every lane does the same integer sums and the same float operations in
//! the same order ([`scalar_group`] is the reference), so a row's result
//! is the same bits at either width and on either instruction set.
//!
//! Invariants: `k` is a multiple of 32; lane sums stay below 2^31 (32
//! products of at most 128 x 32639 each per 32-block: 1.4e8); they are
//! converted to f32 once per block (relative rounding 2^-24, far below the
//! activations' 2^-16).
//! Cost: O(NR k) per tile and group; building the lanes is O(m k).

use super::act::{QuantizedActs, QA};
use super::kernels::Isa;
use super::tile::Tile;
use super::NR;
use crate::model::par;
use model_loader::QuantType;

/// The body of a lane kernel's `dispatch`: calls `$groups::<G, HALF,
/// OFF>` for `res.len()` (1 or 2) groups, the tile's scale granularity and
/// whether its levels need the offset term (one definition for the AVX2
/// and AVX-512 kernels).
#[cfg(target_arch = "x86_64")]
macro_rules! dispatch_groups {
    ($groups:ident, $tile:expr, $la:expr, $g0:expr, $res:expr) => {{
        macro_rules! go {
            ($g:literal) => {{
                let res: &mut [_; $g] = $res.try_into().expect("checked length");
                // SAFETY: the caller's contract, passed on.
                unsafe {
                    match (half_scales($tile.ty()), $tile.w16_offset) {
                        (false, false) => $groups::<$g, false, false>($tile, $la, $g0, res),
                        (false, true) => $groups::<$g, false, true>($tile, $la, $g0, res),
                        (true, false) => $groups::<$g, true, false>($tile, $la, $g0, res),
                        (true, true) => $groups::<$g, true, true>($tile, $la, $g0, res),
                    }
                }
            }};
        }
        if $res.len() == 2 {
            go!(2)
        } else {
            go!(1)
        }
    }};
}

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod zmm;

/// Activation rows per lane group of the AVX2 kernel (the i32 lanes of a
/// ymm register).
pub const LANES: usize = 8;

/// Activation rows per lane group of the AVX-512 kernel (a zmm register),
/// the widest group.
pub const MAX_LANES: usize = 16;

/// Results of one group: `[lane][tile row]` (the first `width` lanes used).
pub type GroupRes = [[f32; NR]; MAX_LANES];

/// The group width of `isa`'s lane kernel, if it has one: 16 on AVX-512
/// VNNI (falling back to the portable form where the CPU lacks it), 8 on
/// AVX2.
pub fn width(isa: Isa) -> Option<usize> {
    match isa {
        Isa::Avx512Vnni => Some(MAX_LANES),
        Isa::Avx2 => Some(LANES),
        Isa::Scalar | Isa::Neon => None,
    }
}

/// Groups of `width` rows of quantized activations in lane order; the
/// last group may be padded with zero rows (their results are zero and
/// are not written).
#[derive(Debug, Clone)]
pub struct LaneActs {
    pub groups: usize,
    /// Rows of the activations covered (the first `m`); where the last
    /// group is padded, the rest of it is padding.
    pub m: usize,
    pub k: usize,
    /// Rows per group ([`LANES`] or [`MAX_LANES`]).
    pub width: usize,
    /// `[groups, k / 2, width, 2]` combined levels.
    pub x: Vec<i16>,
    /// `[groups, k / 32, width]` scales of the combined levels.
    pub d: Vec<f32>,
    /// `[groups, k / 16, width]` scaled sums of 16 values.
    pub s: Vec<f32>,
}

impl LaneActs {
    /// `act`'s rows in groups of `width`: the whole groups, and the rest
    /// in a last group padded with zero rows when it holds at least half a
    /// group (fewer rows are left to the caller's row-major kernel); `None`
    /// when there is no whole group. Panics unless `width` is [`LANES`] or
    /// [`MAX_LANES`].
    ///
    /// Why pad: rows past the whole groups run the row-major kernel, which
    /// needs the tile in a second form and costs more per row. Measured
    /// on AVX-512 (`gemv_bench --rows=M`, weight GB/s, Q5_0 / Q8_0 / Q4_K /
    /// Q6_K): the row-major rest loses to a padded group from about 4-8
    /// rows (44 rows: 1.2 / 1.8 / 1.3 / 1.7 row-major, 1.7 / 2.1 / 1.5 /
    /// 2.1 padded) and wins below (33 rows: 1.9 / 3.1 / 2.1 / 2.8 against
    /// 1.8 / 2.2 / 1.6 / 2.1).
    pub fn new(act: &QuantizedActs, width: usize) -> Option<Self> {
        assert!(
            width == LANES || width == MAX_LANES,
            "lane groups of {width}"
        );
        let (k, whole, rest) = (act.k, act.m / width, act.m % width);
        if whole == 0 {
            return None;
        }
        let groups = whole + usize::from(rest >= width / 2);
        let m = act.m.min(groups * width);
        let (pairs, blocks, sixteens) = (k / 2, k / QA, k / 16);
        let mut x = vec![0i16; groups * k * width];
        let mut d = vec![0f32; groups * blocks * width];
        let mut s = vec![0f32; groups * sixteens * width];
        let group = |(g, xg, dg, sg): &mut (usize, &mut [i16], &mut [f32], &mut [f32])| {
            // A row's combined levels in order (a loop that vectorizes),
            // then one 4-byte move per pair into its lane: the interleaved
            // writes alone cost twice as much, value by value.
            let mut combined = Vec::with_capacity(k);
            for l in 0..width.min(m - *g * width) {
                let row = act.row(*g * width + l);
                combined.clear();
                match row.lo {
                    Some(lo) => combined.extend(
                        row.q
                            .iter()
                            .zip(lo)
                            .map(|(&q, &lo)| 256 * i16::from(q) + i16::from(lo)),
                    ),
                    None => combined.extend(row.q.iter().map(|&q| i16::from(q))),
                }
                for (pair, v) in xg.chunks_exact_mut(2 * width).zip(combined.chunks_exact(2)) {
                    pair[2 * l..2 * l + 2].copy_from_slice(v);
                }
                for (c, &v) in row.d.iter().enumerate() {
                    dg[c * width + l] = v;
                }
                for (h, &v) in row.sums.iter().enumerate() {
                    sg[h * width + l] = v;
                }
            }
        };
        let mut parts: Vec<_> = x
            .chunks_mut(pairs * 2 * width)
            .zip(d.chunks_mut(blocks * width))
            .zip(s.chunks_mut(sixteens * width))
            .enumerate()
            .map(|(g, ((x, d), s))| (g, x, d, s))
            .collect();
        // One task per group where the layout is worth a region.
        if par::parts(groups, m * k) > 1 {
            par::for_each_mut(&mut parts, group);
        } else {
            parts.iter_mut().for_each(group);
        }
        drop(parts);
        Some(Self {
            groups,
            m,
            k,
            width,
            x,
            d,
            s,
        })
    }
}

/// True when `ty`'s two 16-halves of a 32-block may have different scales
/// (the others repeat one scale per 32 values, so the kernel applies it
/// once per block).
pub fn half_scales(ty: QuantType) -> bool {
    matches!(ty, QuantType::Q2K | QuantType::Q3K | QuantType::Q6K)
}

/// `res[i][l][t] = dot(tile row t, activation row (g0 + i) * width + l)`
/// for the `res.len()` (1 or 2) groups from `g0` and the `la.width` lanes
/// of each: AVX2 for groups of 8, AVX-512 VNNI for groups of 16 (two
/// groups share each weight broadcast), the portable form where the CPU
/// lacks them.
///
/// Panics if the tile has no widened levels or disagrees with `la` on
/// `k`, `res` holds not 1 or 2 groups, or they run past `la`'s.
pub fn dot_groups(tile: &Tile, la: &LaneActs, g0: usize, res: &mut [GroupRes]) {
    let n = res.len();
    assert!(
        tile.k == la.k
            && (1..=2).contains(&n)
            && g0 + n <= la.groups
            && tile.w16.len() >= NR * tile.kp,
        "dot_groups: shapes"
    );
    #[cfg(target_arch = "x86_64")]
    if la.width == MAX_LANES && super::kernels::has_zmm() {
        // SAFETY: the CPU has AVX-512 F/BW/VNNI, AVX2 and FMA (`has_zmm`);
        // the shapes are asserted above and the groups are 16 wide.
        unsafe { zmm::dispatch(tile, la, g0, res) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if la.width == LANES
        && std::arch::is_x86_feature_detected!("avx2")
        && std::arch::is_x86_feature_detected!("fma")
    {
        // SAFETY: the CPU has AVX2 and FMA (checked just above), and
        // AVX-VNNI where `has_avx_vnni` says; the shapes are asserted
        // above and the groups are 8 wide.
        unsafe { avx2::dispatch(tile, la, g0, res, super::kernels::has_avx_vnni()) };
        return;
    }
    for (i, r) in res.iter_mut().enumerate() {
        scalar_group(tile, la, g0 + i, &mut r[..la.width]);
    }
}

/// [`dot_groups`] for 8-wide groups on the AVX2 kernel without AVX-VNNI,
/// whatever the CPU has beyond AVX2 (for the tests: where the CPU has
/// AVX-VNNI, `dot_groups` runs the other form). False, and nothing
/// computed, without AVX2 and FMA.
#[cfg(test)]
pub(super) fn avx2_plain(tile: &Tile, la: &LaneActs, g0: usize, res: &mut [GroupRes]) -> bool {
    assert!(la.width == LANES && tile.k == la.k && g0 + res.len() <= la.groups);
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: the CPU has AVX2 and FMA (checked); the shapes are
        // asserted above.
        unsafe { avx2::dispatch(tile, la, g0, res, false) };
        return true;
    }
    false
}

/// The portable form of [`dot_groups`] for one group (`res`: its
/// `la.width` lanes): the same integer sums and the same fused float
/// operations in the same order per lane, so the same bits.
#[allow(clippy::needless_range_loop)] // columns index levels and activations alike
pub fn scalar_group(tile: &Tile, la: &LaneActs, g: usize, res: &mut [[f32; NR]]) {
    let (k, kp, width) = (tile.k, tile.kp, la.width);
    assert_eq!(res.len(), width, "scalar_group: one result per lane");
    let (pairs, blocks, sixteens) = (k / 2, k / QA, k / 16);
    let half = half_scales(tile.ty());
    let gp = kp / 16;
    for (l, out) in res.iter_mut().enumerate() {
        for (t, o) in out.iter_mut().enumerate() {
            let w = &tile.w16[t * kp..t * kp + k];
            let mut f = 0f32;
            for c in 0..blocks {
                let d = la.d[(g * blocks + c) * width + l];
                let subs = if half { 2 } else { 1 };
                for h in 0..subs {
                    let span = QA / subs;
                    let mut acc = 0i32;
                    for i in c * QA + h * span..c * QA + (h + 1) * span {
                        let x = la.x[((g * pairs + i / 2) * width + l) * 2 + i % 2];
                        acc += i32::from(w[i]) * i32::from(x);
                    }
                    let a = tile.a8[t * kp / 4 + c * 8 + h * 4];
                    f = (acc as f32).mul_add(d * a, f);
                }
                if tile.w16_offset {
                    for h in 2 * c..2 * c + 2 {
                        f = tile.bb[t * gp + h].mul_add(la.s[(g * sixteens + h) * width + l], f);
                    }
                }
            }
            *o = f;
        }
    }
}
