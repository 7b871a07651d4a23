//! A tile of [`NR`] weight rows decoded for the integer kernels.
//!
//! Per row: levels `u` (`k` bytes), per-32 scale vectors `a8` (the scales
//! of the two 16-halves, each repeated 4 times, matching the 8 i32 lanes an
//! AVX2 `vpmaddwd` leaves), and per-16 offsets `bb`.
//!
//! Unsigned mode (every type but `Q8_0`/`Q8_K`): `u = q + off` lies in
//! 0..=63 and `bb = b - a * off`, so `w = a * u + bb` exactly as
//! `a * q + b`. Signed mode: `u = q` (-128..127) and `bb = 0`.
//!
//! Invariant: rows past the decoded count are zero (their results are
//! computed and discarded). Cost: O(NR k) per decode, no allocation.

use model_loader::quant::{decode_row, GROUP};
use model_loader::QuantType;

use super::{QMatrix, NR};

/// The decoded rows.
pub struct Tile {
    pub k: usize,
    /// Levels stored as `i8` (unsigned mode keeps them non-negative).
    pub u: Vec<i8>,
    /// `[NR, k / 32 * 8]`.
    pub a8: Vec<f32>,
    /// `[NR, k / 16]`.
    pub bb: Vec<f32>,
    /// True for `Q8_0` / `Q8_K` (sign trick in the kernels).
    pub signed: bool,
    /// True when `bb` may be non-zero.
    pub has_offset: bool,
    off: i8,
    a: Vec<f32>,
    b: Vec<f32>,
}

/// The level offset that makes a type's levels non-negative (unsigned
/// mode), or `None` for the signed types.
pub fn level_offset(ty: QuantType) -> Option<i8> {
    match ty {
        QuantType::Q8_0 | QuantType::Q8K => None,
        QuantType::Q4_0 => Some(8),
        QuantType::Q5_0 => Some(16),
        QuantType::Q3K => Some(4),
        QuantType::Q6K => Some(32),
        QuantType::Q4_1 | QuantType::Q5_1 | QuantType::Q2K | QuantType::Q4K | QuantType::Q5K => {
            Some(0)
        }
    }
}

impl Tile {
    /// An empty tile for rows of `k` values of type `ty`.
    pub fn new(ty: QuantType, k: usize) -> Self {
        let off = level_offset(ty);
        Self {
            k,
            u: vec![0; NR * k],
            a8: vec![0.0; NR * k / 4],
            bb: vec![0.0; NR * k / GROUP],
            signed: off.is_none(),
            has_offset: off.is_some_and(|o| o != 0) || ty.has_offset(),
            off: off.unwrap_or(0),
            a: vec![0.0; k / GROUP],
            b: vec![0.0; k / GROUP],
        }
    }

    /// Decodes rows `j..j + nr` of `w` (`nr <= NR`); the rest become zero.
    pub fn decode(&mut self, w: &QMatrix, j: usize, nr: usize) {
        let (k, rb) = (self.k, w.row_bytes());
        let g = k / GROUP;
        for t in 0..NR {
            let u = &mut self.u[t * k..(t + 1) * k];
            let a8 = &mut self.a8[t * k / 4..(t + 1) * k / 4];
            let bb = &mut self.bb[t * g..(t + 1) * g];
            if t >= nr {
                u.fill(0);
                a8.fill(0.0);
                bb.fill(0.0);
                continue;
            }
            let row = &w.bytes[(j + t) * rb..(j + t + 1) * rb];
            if decode_legacy(w.ty, row, u, a8, bb) {
                continue;
            }
            decode_row(w.ty, row, u, &mut self.a, &mut self.b);
            if self.off != 0 {
                for v in u.iter_mut() {
                    *v += self.off;
                }
            }
            for (c, a8c) in a8.chunks_exact_mut(8).enumerate() {
                a8c[..4].fill(self.a[2 * c]);
                a8c[4..].fill(self.a[2 * c + 1]);
            }
            let off = f32::from(self.off);
            for ((o, &a), &b) in bb.iter_mut().zip(&self.a).zip(&self.b) {
                *o = b - a * off;
            }
        }
    }

    /// Row `t`'s levels, scale vectors and offsets (the tile's decoded form).
    pub fn row(&self, t: usize) -> (&[i8], &[f32], &[f32]) {
        let (k, g) = (self.k, self.k / GROUP);
        (
            &self.u[t * k..(t + 1) * k],
            &self.a8[t * k / 4..(t + 1) * k / 4],
            &self.bb[t * g..(t + 1) * g],
        )
    }
}

fn f16_at(b: &[u8], i: usize) -> f32 {
    half::f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

/// Fast path for the 32-element types: decodes a row straight into the
/// tile's form (levels with the offset folded in, `a8`, `bb`), with
/// fixed-size inner loops the compiler vectorizes. Returns false for other
/// types. Same values as the generic path (tested).
fn decode_legacy(ty: QuantType, row: &[u8], u: &mut [i8], a8: &mut [f32], bb: &mut [f32]) -> bool {
    let bb_len = bb.len();
    let blocks = u.chunks_exact_mut(32).zip(a8.chunks_exact_mut(8));
    let mut bbs = bb.chunks_exact_mut(2);
    match ty {
        QuantType::Q4_0 | QuantType::Q4_1 => {
            let bytes = if ty == QuantType::Q4_0 { 18 } else { 20 };
            for ((blk, (uc, a8c)), bbc) in row.chunks_exact(bytes).zip(blocks).zip(&mut bbs) {
                let d = f16_at(blk, 0);
                let qs: &[u8; 16] = match blk[bytes - 16..].try_into() {
                    Ok(q) => q,
                    Err(_) => return false,
                };
                let uc: &mut [i8; 32] = match uc.try_into() {
                    Ok(u) => u,
                    Err(_) => return false,
                };
                // Fixed-size arrays: no bounds checks, one vector op each.
                let lo: [i8; 16] = std::array::from_fn(|j| (qs[j] & 0x0f) as i8);
                let hi: [i8; 16] = std::array::from_fn(|j| (qs[j] >> 4) as i8);
                uc[..16].copy_from_slice(&lo);
                uc[16..].copy_from_slice(&hi);
                a8c.fill(d);
                // Q4_0: q - 8 with offset 8 folded: bb = -8 d. Q4_1: bb = m.
                bbc.fill(if ty == QuantType::Q4_0 {
                    -8.0 * d
                } else {
                    f16_at(blk, 2)
                });
            }
        }
        QuantType::Q8_0 => {
            for (blk, (uc, a8c)) in row.chunks_exact(34).zip(blocks) {
                for (o, &v) in uc.iter_mut().zip(&blk[2..34]) {
                    *o = v as i8;
                }
                a8c.fill(f16_at(blk, 0));
            }
            bb[..bb_len].fill(0.0);
        }
        _ => return false,
    }
    true
}
