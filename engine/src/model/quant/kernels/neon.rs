//! The NEON block (aarch64): [`super::dot_scalar`]'s arithmetic with the 16-value
//! integer sums in vectors. Per 16-half and tile row: the levels as i8
//! (`u`, or `u ^ 0x80` = the true level for the signed types), two
//! `smull` (low and high 8) and one `saddlp` + `sadalp` pair into four i32
//! lanes per activation level, the residual level's lanes added to the
//! first's shifted by 8, one `addv`; then exactly the portable float
//! operations in the same order, so the same bits as [`super::Isa::Scalar`]
//! (whatever the batch: each row is computed alone).
//!
//! Stable Rust has no `sdot` intrinsic (`vdotq_s32` is behind
//! `stdarch_neon_dotprod`), so this uses the NEON every aarch64 CPU has.
//!
//! Invariants: the i8 products fit i16 (|w| <= 128, |x| <= 127); the lane
//! sums stay far below 2^31. Cost: O(NR k) per row, no allocation.

use std::arch::aarch64::*;

use super::super::act::ActRow;
use super::super::tile::Tile;
use super::NR;

/// `dot(w, x)` over 16 i8 pairs as four i32 lanes.
#[inline]
#[target_feature(enable = "neon")]
fn dot16(w: int8x16_t, x: int8x16_t) -> int32x4_t {
    let lo = vmull_s8(vget_low_s8(w), vget_low_s8(x));
    let hi = vmull_high_s8(w, x);
    vpadalq_s16(vpaddlq_s16(lo), hi)
}

/// [`super::dot_scalar`] for one activation row.
///
/// # Safety
/// The CPU has NEON; `row` holds `tile.k` levels (and residual levels,
/// if any), `tile.k / 32` scales and `tile.k / 16` sums.
#[target_feature(enable = "neon")]
pub(super) unsafe fn dot_row(tile: &Tile, row: ActRow<'_>, res: &mut [f32; NR]) {
    let flip = vdupq_n_u8(if tile.signed { 0x80 } else { 0 });
    for (t, out) in res.iter_mut().enumerate() {
        let (u, a8, bb) = tile.row(t);
        let mut acc = 0f32;
        for (c, &d) in row.d.iter().enumerate() {
            for h in 0..2 {
                let at = c * 32 + h * 16;
                // SAFETY: at + 16 <= k: the 16 levels of this half in
                // the tile row and in the activation rows (the
                // caller's contract).
                let s = unsafe {
                    let w = vreinterpretq_s8_u8(veorq_u8(vld1q_u8(u.as_ptr().add(at)), flip));
                    let mut v = dot16(w, vld1q_s8(row.q.as_ptr().add(at)));
                    if let Some(lo) = row.lo {
                        let l = dot16(w, vld1q_s8(lo.as_ptr().add(at)));
                        v = vaddq_s32(vshlq_n_s32::<8>(v), l);
                    }
                    vaddvq_s32(v)
                };
                acc += s as f32 * (a8[c * 8 + h * 4] * d);
            }
        }
        if tile.has_offset {
            acc += bb.iter().zip(row.sums).map(|(b, s)| b * s).sum::<f32>();
        }
        *out = acc;
    }
}
