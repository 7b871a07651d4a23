//! A tile of [`NR`] weight rows decoded for the integer kernels.
//!
//! Per row, padded with zeros to `kp` (`k` rounded up to 64, one 512-bit
//! step): unsigned levels `u` (`kp` bytes), per-32 scale vectors `a8` (the
//! scales of the two 16-halves, each repeated 4 times, matching the i32
//! lanes `vpdpbusd` leaves: two consecutive blocks fill the 16 lanes of a
//! zmm register), and per-16 offsets `bb`.
//!
//! Every type is stored unsigned: `u = q + off` with the type's
//! [`level_offset`]. Offset types (levels 0..=63, so `vpmaddubsw` never
//! saturates) fold the offset into `bb = b - a * off`, so `w = a * u + bb`
//! exactly as `a * q + b`. Signed tiles (`Q8_0`/`Q8_K`: `u = q + 128`, i.e.
//! `q ^ 0x80`, in 0..=255) keep `bb = b = 0` and the kernels take the 128
//! back out in integer arithmetic (VNNI: minus `128 * sum(x)`; AVX2: flip
//! the bit back and use the sign trick), so their dot products stay exact.
//!
//! Decoding: the common file types (`Q4_0`, `Q4_1`, `Q5_0`, `Q5_1`, `Q8_0`,
//! `Q4_K`, `Q5_K`, `Q6_K`) are unpacked straight into the tile's form with
//! fixed-size inner loops the compiler vectorizes ([`super::tile_decode`]);
//! `Q2_K`, `Q3_K` and `Q8_K` go through `model_loader::quant::decode_row`.
//! Both give the same bits (tested).
//!
//! Invariant: rows past the decoded count, and columns `k..kp`, are zero
//! (their products are zero or discarded). Cost: O(NR k) per decode, no
//! allocation.

use model_loader::quant::{decode_row, GROUP};
use model_loader::QuantType;

use super::tile_decode::decode_fast;
use super::tile_wide;
use super::{QMatrix, NR};

/// Values per kernel step (one zmm of levels).
pub const STEP: usize = 64;

/// The decoded rows.
pub struct Tile {
    pub k: usize,
    /// `k` rounded up to [`STEP`]: the row stride of `u`.
    pub kp: usize,
    /// `[NR, kp]` unsigned levels.
    pub u: Vec<u8>,
    /// `[NR, kp / 4]`.
    pub a8: Vec<f32>,
    /// `[NR, kp / 16]`.
    pub bb: Vec<f32>,
    /// True for `Q8_0` / `Q8_K` (`u = q + 128`, not folded into `bb`).
    pub signed: bool,
    /// True when `bb` may be non-zero.
    pub has_offset: bool,
    /// The kernels reproduce the direct kernels' offset arithmetic
    /// ([`OffsetForm`]; batch-invariant rows) instead of folding the
    /// offsets into their accumulators (cheaper). Set by the caller
    /// (`quant::matmul_with`'s `invariant`); false from [`Tile::new`].
    pub exact: bool,
    /// [`Tile::decode_wide`] may use 512-bit registers (the CPU's best
    /// kernels are the AVX-512 ones: `quant::matmul_with` sets it from its
    /// `isa`); false from [`Tile::new`], so a forced AVX2 run stays AVX2.
    pub wide512: bool,
    /// [`OffsetForm::Pairs`] types only: `bb` again, per 4 groups of 16
    /// (one 64-level kernel step) the [`NR`] rows' 4 offsets in a row
    /// (`[kp / 64, NR, 4]`), filled by [`Tile::decode`] for the 512-bit
    /// kernel's offset pass.
    pub bbq: Vec<f32>,
    /// `[NR, kp]` the true levels as i16 (filled by [`Tile::widen`] for
    /// the lane kernel; empty until then): the level offset taken out of
    /// every type whose offset is only that (the signed types' 128,
    /// `Q4_0`'s 8, `Q5_0`'s 16, `Q3_K`'s 4, `Q6_K`'s 32), so their dot
    /// products need no `bb` term.
    pub w16: Vec<i16>,
    /// True when the products of [`Tile::w16`] still need the `bb` term
    /// (the types with a per-block minimum).
    pub w16_offset: bool,
    /// Rows decoded by the last decode (the rest are zero).
    rows: usize,
    ty: QuantType,
    off: i16,
    q: Vec<i8>,
    a: Vec<f32>,
    b: Vec<f32>,
}

/// How a type's offsets (`bb`) meet the activations' 16-sums: the direct
/// kernels' arithmetic ([`super::gemv`]), which the tile kernels
/// reproduce operation for operation so that a row's result does not
/// depend on which path (so on how many rows) computed it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OffsetForm {
    /// No offset (`Q8_0`, `Q8_K`: the 128 is taken out in integers).
    None,
    /// `Q4_0`, `Q4_1`, `Q5_0`, `Q5_1`: one offset per 32-block against
    /// the block's two 16-sums (AVX2: `fma(bb, s0 + s1, o)` per block in
    /// one chain; AVX-512: one chain per 16-group mod 4, `fma(bb, s, o)`,
    /// summed `(c0 + c2) + (c1 + c3)`).
    Pairs,
    /// `Q4_K`, `Q5_K`: per 32-sub-block `bb * (s0 + s1)` (AVX2: unfused,
    /// one chain; AVX-512: 8 chains, one per sub-block of a 256-block,
    /// fused, then [`super::kernels::x86::hsum`]).
    Sub32,
    /// `Q6_K`: per 16-half (AVX2: `o + (b0 s0 + b1 s1)` per 32-block;
    /// AVX-512: 16 chains, one per half of a 256-block, fused, then
    /// reduced).
    Half16,
    /// `Q2_K`, `Q3_K` (no direct kernel, always tiles): folded into the
    /// kernels' accumulators.
    Folded,
}

/// The [`OffsetForm`] of `ty`.
pub fn offset_form(ty: QuantType) -> OffsetForm {
    match ty {
        QuantType::Q8_0 | QuantType::Q8K => OffsetForm::None,
        QuantType::Q4_0 | QuantType::Q4_1 | QuantType::Q5_0 | QuantType::Q5_1 => OffsetForm::Pairs,
        QuantType::Q4K | QuantType::Q5K => OffsetForm::Sub32,
        QuantType::Q6K => OffsetForm::Half16,
        QuantType::Q2K | QuantType::Q3K => OffsetForm::Folded,
    }
}

/// The level offset that makes a type's levels non-negative.
pub fn level_offset(ty: QuantType) -> i16 {
    match ty {
        QuantType::Q8_0 | QuantType::Q8K => 128,
        QuantType::Q4_0 => 8,
        QuantType::Q5_0 => 16,
        QuantType::Q3K => 4,
        QuantType::Q6K => 32,
        QuantType::Q4_1 | QuantType::Q5_1 | QuantType::Q2K | QuantType::Q4K | QuantType::Q5K => 0,
    }
}

/// `b - a * off`: the offset of a level stored with `off` added (one
/// expression, shared by every decoder so their bits agree).
#[inline(always)]
pub(super) fn fold(a: f32, b: f32, off: f32) -> f32 {
    b - a * off
}

impl Tile {
    /// An empty tile for rows of `k` values of type `ty`.
    pub fn new(ty: QuantType, k: usize) -> Self {
        let off = level_offset(ty);
        let kp = k.div_ceil(STEP) * STEP;
        Self {
            k,
            kp,
            u: vec![0; NR * kp],
            a8: vec![0.0; NR * kp / 4],
            bb: vec![0.0; NR * kp / GROUP],
            signed: off == 128,
            has_offset: (off != 0 && off != 128) || ty.has_offset(),
            exact: false,
            wide512: false,
            bbq: if offset_form(ty) == OffsetForm::Pairs {
                vec![0.0; NR * kp / GROUP]
            } else {
                Vec::new()
            },
            w16: Vec::new(),
            w16_offset: true,
            rows: 0,
            ty,
            off,
            q: Vec::new(),
            a: Vec::new(),
            b: Vec::new(),
        }
    }

    /// Decodes rows `j..j + nr` of `w` (`nr <= NR`); the rest become zero.
    pub fn decode(&mut self, w: &QMatrix, j: usize, nr: usize) {
        debug_assert_eq!(w.ty, self.ty, "Tile::decode: type");
        self.rows = nr;
        let (k, kp, rb) = (self.k, self.kp, w.row_bytes());
        let gp = kp / GROUP;
        for t in 0..NR {
            let u = &mut self.u[t * kp..t * kp + k];
            let a8 = &mut self.a8[t * kp / 4..t * kp / 4 + k / 4];
            let bb = &mut self.bb[t * gp..t * gp + k / GROUP];
            if t >= nr {
                u.fill(0);
                a8.fill(0.0);
                bb.fill(0.0);
                continue;
            }
            let row = &w.bytes[(j + t) * rb..(j + t + 1) * rb];
            if decode_fast(w.ty, row, u, a8, bb) {
                continue;
            }
            decode_generic(
                w.ty,
                self.off,
                row,
                u,
                a8,
                bb,
                (&mut self.q, &mut self.a, &mut self.b),
            );
        }
        if self.exact && !self.bbq.is_empty() {
            // [step][row][4]: rows past `nr` and groups past k / 16 are
            // zero in `bb`, so here too.
            for (s, q) in self.bbq.chunks_exact_mut(4 * NR).enumerate() {
                for (t, qt) in q.chunks_exact_mut(4).enumerate() {
                    qt.copy_from_slice(&self.bb[t * gp + 4 * s..t * gp + 4 * s + 4]);
                }
            }
        }
    }

    /// Decodes rows `j..j + nr` of `w` (`nr <= NR`) into the lane
    /// kernel's form only ([`Tile::w16`], the scales and offsets it
    /// reads) where the type has a one-pass decoder (`tile_wide`); false
    /// otherwise (use [`Tile::decode`] and [`Tile::widen`]). `u` and the
    /// other scale entries are left stale: only the lane kernel may read
    /// this tile.
    pub fn decode_wide(&mut self, w: &QMatrix, j: usize, nr: usize) -> bool {
        if !tile_wide::supported(self.ty) {
            return false;
        }
        let (k, kp, rb) = (self.k, self.kp, w.row_bytes());
        let gp = kp / GROUP;
        self.rows = nr;
        self.w16.resize(NR * kp, 0);
        // The next tile's bytes (they follow these rows) while this one
        // decodes.
        #[cfg(target_arch = "x86_64")]
        if let Some(next) = w
            .bytes
            .get((j + nr) * rb..((j + 2 * nr) * rb).min(w.bytes.len()))
        {
            for off in (0..next.len()).step_by(64) {
                // SAFETY: a prefetch is a hint that never faults; the
                // address is inside `next`.
                unsafe {
                    std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                        next.as_ptr().add(off).cast(),
                    )
                };
            }
        }
        for t in 0..NR {
            let w16 = &mut self.w16[t * kp..t * kp + k];
            let a8 = &mut self.a8[t * kp / 4..t * kp / 4 + k / 4];
            let bb = &mut self.bb[t * gp..t * gp + k / GROUP];
            if t >= nr {
                w16.fill(0);
                a8.fill(0.0);
                bb.fill(0.0);
                continue;
            }
            let row = &w.bytes[(j + t) * rb..(j + t + 1) * rb];
            if !tile_wide::decode_row(self.ty, row, w16, a8, bb, self.wide512) {
                // Inconsistent lengths (never from a loaded model): the
                // caller's decode + widen rewrites every level.
                return false;
            }
        }
        self.w16_offset = self.ty.has_offset();
        true
    }

    /// The weight type decoded.
    pub fn ty(&self) -> QuantType {
        self.ty
    }

    /// Fills [`Tile::w16`] from the decoded levels: `u - off` (the true
    /// levels `q`, so `w = a q`) for the types without a minimum, `u` for
    /// the others (their offsets stay folded in `bb`). O(NR kp).
    pub fn widen(&mut self) {
        self.w16_offset = self.ty.has_offset();
        let off = if self.w16_offset { 0 } else { self.off };
        let (k, kp) = (self.k, self.kp);
        self.w16.resize(self.u.len(), 0);
        for (t, (o, u)) in self
            .w16
            .chunks_exact_mut(kp)
            .zip(self.u.chunks_exact(kp))
            .enumerate()
        {
            if t >= self.rows {
                o.fill(0);
                continue;
            }
            for (o, &u) in o[..k].iter_mut().zip(&u[..k]) {
                *o = i16::from(u) - off;
            }
            o[k..].fill(0);
        }
    }

    /// Row `t`'s levels (`k`), scale vectors (`k / 4`) and offsets
    /// (`k / 16`).
    pub fn row(&self, t: usize) -> (&[u8], &[f32], &[f32]) {
        let (k, kp) = (self.k, self.kp);
        let gp = kp / GROUP;
        (
            &self.u[t * kp..t * kp + k],
            &self.a8[t * kp / 4..t * kp / 4 + k / 4],
            &self.bb[t * gp..t * gp + k / GROUP],
        )
    }
}

/// Any type through `model_loader`'s decoder, then the offset folded in.
fn decode_generic(
    ty: QuantType,
    off: i16,
    row: &[u8],
    u: &mut [u8],
    a8: &mut [f32],
    bb: &mut [f32],
    (q, a, b): (&mut Vec<i8>, &mut Vec<f32>, &mut Vec<f32>),
) {
    let k = u.len();
    q.resize(k, 0);
    a.resize(k / GROUP, 0.0);
    b.resize(k / GROUP, 0.0);
    decode_row(ty, row, q, a, b);
    for (o, &v) in u.iter_mut().zip(q.iter()) {
        // In range by `level_offset`: 0..=255.
        *o = (i16::from(v) + off) as u8;
    }
    for (c, a8c) in a8.chunks_exact_mut(8).enumerate() {
        a8c[..4].fill(a[2 * c]);
        a8c[4..].fill(a[2 * c + 1]);
    }
    // The signed types' 128 is taken out by the kernels, not by `bb`.
    let off = if off == 128 { 0.0 } else { f32::from(off) };
    for ((o, &a), &b) in bb.iter_mut().zip(a.iter()).zip(b.iter()) {
        *o = fold(a, b, off);
    }
}

/// Test access: the generic decoder into a tile's form (`u`, `a8`, `bb`
/// for one row of `k` values).
#[cfg(test)]
pub(super) fn decode_row_generic(
    ty: QuantType,
    row: &[u8],
    k: usize,
) -> (Vec<u8>, Vec<f32>, Vec<f32>) {
    let (mut u, mut a8, mut bb) = (vec![0u8; k], vec![0f32; k / 4], vec![0f32; k / GROUP]);
    let mut s = (Vec::new(), Vec::new(), Vec::new());
    decode_generic(
        ty,
        level_offset(ty),
        row,
        &mut u,
        &mut a8,
        &mut bb,
        (&mut s.0, &mut s.1, &mut s.2),
    );
    (u, a8, bb)
}
