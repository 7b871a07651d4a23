//! Fast decoders of the common file types straight into a [`super::tile`]
//! row's form: unsigned levels with the type's offset folded in, per-32
//! scale vectors `a8` (each 16-half's scale 4 times) and per-16 offsets
//! `bb = b - a * off` (`off = 0` for the signed `Q8_0`).
//!
//! Every block goes through fixed-size arrays (`[u8; 32]`, `[f32; 8]`, ...)
//! with constant-trip inner loops, which the compiler turns into vector
//! shifts, masks and byte shuffles without bounds checks; the bit layouts
//! are those of `model_loader::quant` (legacy nibble order, `Q5_*`'s `qh`
//! word, the K-quants' 64-element chunks).
//!
//! Invariants: the results equal `model_loader::quant::decode_row` plus the
//! offset fold bit for bit (tested for every type). Cost: O(k) per row, no
//! allocation.

use model_loader::quant::scale_min_k4;
use model_loader::QuantType;

use super::f16_at;
use super::tile::fold;

/// Decodes a row of `ty` into `u`, `a8`, `bb` (`u.len()` values, whole
/// blocks). Returns false for the types without a fast decoder (and for
/// inconsistent lengths, which the tile never passes).
pub(super) fn decode_fast(
    ty: QuantType,
    row: &[u8],
    u: &mut [u8],
    a8: &mut [f32],
    bb: &mut [f32],
) -> bool {
    match ty {
        QuantType::Q4_0 => blocks::<18, 32, 8, 2>(row, u, a8, bb, |blk, u, a8, bb| {
            let d = f16_at(blk, 0);
            nibbles(&blk[2..], u);
            a8.fill(d);
            bb.fill(fold(d, 0.0, 8.0));
        }),
        QuantType::Q4_1 => blocks::<20, 32, 8, 2>(row, u, a8, bb, |blk, u, a8, bb| {
            let d = f16_at(blk, 0);
            nibbles(&blk[4..], u);
            a8.fill(d);
            bb.fill(fold(d, f16_at(blk, 2), 0.0));
        }),
        QuantType::Q5_0 => blocks::<22, 32, 8, 2>(row, u, a8, bb, |blk, u, a8, bb| {
            let d = f16_at(blk, 0);
            five_bits(&blk[2..], u);
            a8.fill(d);
            bb.fill(fold(d, 0.0, 16.0));
        }),
        QuantType::Q5_1 => blocks::<24, 32, 8, 2>(row, u, a8, bb, |blk, u, a8, bb| {
            let d = f16_at(blk, 0);
            five_bits(&blk[4..], u);
            a8.fill(d);
            bb.fill(fold(d, f16_at(blk, 2), 0.0));
        }),
        QuantType::Q8_0 => blocks::<34, 32, 8, 2>(row, u, a8, bb, |blk, u, a8, bb| {
            let d = f16_at(blk, 0);
            for (o, &v) in u.iter_mut().zip(&blk[2..34]) {
                // q + 128 for q in -128..=127.
                *o = v ^ 0x80;
            }
            a8.fill(d);
            // The 128 is not folded (see `tile`): `bb = b = 0`.
            bb.fill(fold(d, 0.0, 0.0));
        }),
        QuantType::Q4K => blocks::<144, 256, 64, 16>(row, u, a8, bb, |blk, u, a8, bb| {
            k4_scales(blk, a8, bb);
            for c in 0..4 {
                let qs: &[u8; 32] = arr(&blk[16 + c * 32..]);
                for l in 0..32 {
                    u[c * 64 + l] = qs[l] & 0x0f;
                    u[c * 64 + 32 + l] = qs[l] >> 4;
                }
            }
        }),
        QuantType::Q5K => blocks::<176, 256, 64, 16>(row, u, a8, bb, |blk, u, a8, bb| {
            k4_scales(blk, a8, bb);
            let qh: &[u8; 32] = arr(&blk[16..]);
            for c in 0..4 {
                let qs: &[u8; 32] = arr(&blk[48 + c * 32..]);
                for l in 0..32 {
                    let (h0, h1) = ((qh[l] >> (2 * c)) & 1, (qh[l] >> (2 * c + 1)) & 1);
                    u[c * 64 + l] = (qs[l] & 0x0f) | (h0 << 4);
                    u[c * 64 + 32 + l] = (qs[l] >> 4) | (h1 << 4);
                }
            }
        }),
        QuantType::Q6K => blocks::<210, 256, 64, 16>(row, u, a8, bb, |blk, u, a8, bb| {
            let d = f16_at(blk, 208);
            let mut a = [0f32; 16];
            for (g, a) in a.iter_mut().enumerate() {
                *a = d * f32::from(blk[192 + g] as i8);
                bb[g] = fold(*a, 0.0, 32.0);
            }
            spread(&a, a8);
            for hh in 0..2 {
                let qh: &[u8; 32] = arr(&blk[128 + hh * 32..]);
                for qq in 0..4 {
                    let ql: &[u8; 32] = arr(&blk[hh * 64 + (qq % 2) * 32..]);
                    for l in 0..32 {
                        let low = (ql[l] >> (4 * (qq / 2))) & 0x0f;
                        let high = (qh[l] >> (2 * qq)) & 3;
                        u[hh * 128 + qq * 32 + l] = low | (high << 4);
                    }
                }
            }
        }),
        _ => false,
    }
}

/// The first `N` bytes of `s` as an array (callers slice inside a block of
/// known size, so the length always suffices).
#[inline(always)]
fn arr<const N: usize>(s: &[u8]) -> &[u8; N] {
    match s.get(..N).and_then(|s| s.try_into().ok()) {
        Some(a) => a,
        None => unreachable!("block slice shorter than {N}"),
    }
}

/// Runs `f` on each block of `B` bytes / `L` values (`A = L / 4` scale
/// lanes, `G = L / 16` offsets) as fixed-size arrays.
#[inline(always)]
fn blocks<const B: usize, const L: usize, const A: usize, const G: usize>(
    row: &[u8],
    u: &mut [u8],
    a8: &mut [f32],
    bb: &mut [f32],
    f: impl Fn(&[u8; B], &mut [u8; L], &mut [f32; A], &mut [f32; G]),
) -> bool {
    let n = u.len() / L;
    if u.len() != n * L || row.len() != n * B || a8.len() != n * A || bb.len() != n * G {
        return false;
    }
    for (((blk, uc), ac), bc) in row
        .chunks_exact(B)
        .zip(u.chunks_exact_mut(L))
        .zip(a8.chunks_exact_mut(A))
        .zip(bb.chunks_exact_mut(G))
    {
        let (Ok(blk), Ok(uc), Ok(ac), Ok(bc)) =
            (blk.try_into(), uc.try_into(), ac.try_into(), bc.try_into())
        else {
            return false;
        };
        f(blk, uc, ac, bc);
    }
    true
}

/// Legacy nibble order: byte `j` holds element `j` (low) and `j + 16`.
#[inline(always)]
fn nibbles(qs: &[u8], u: &mut [u8; 32]) {
    let qs: &[u8; 16] = arr(qs);
    for j in 0..16 {
        u[j] = qs[j] & 0x0f;
        u[j + 16] = qs[j] >> 4;
    }
}

/// `Q5_*`: `qh` (little-endian u32, bit `j` = bit 4 of element `j`) then
/// the nibbles.
#[inline(always)]
fn five_bits(h: &[u8], u: &mut [u8; 32]) {
    let qh: &[u8; 4] = arr(h);
    nibbles(&h[4..], u);
    for j in 0..32 {
        u[j] |= ((qh[j / 8] >> (j % 8)) & 1) << 4;
    }
}

/// Per-16 scales `a` into the per-32 lane layout (4 copies of each).
#[inline(always)]
fn spread(a: &[f32; 16], a8: &mut [f32; 64]) {
    for (g, &v) in a.iter().enumerate() {
        a8[g * 4..g * 4 + 4].fill(v);
    }
}

/// `Q4_K` / `Q5_K` scales: 8 six-bit (scale, min) pairs per super-block.
#[inline(always)]
fn k4_scales(blk: &[u8], a8: &mut [f32; 64], bb: &mut [f32; 16]) {
    let (d, dmin) = (f16_at(blk, 0), f16_at(blk, 2));
    let mut a = [0f32; 16];
    for j in 0..8 {
        let (s, m) = scale_min_k4(&blk[4..16], j);
        let (av, bv) = (d * f32::from(s), -(dmin * f32::from(m)));
        a[2 * j] = av;
        a[2 * j + 1] = av;
        bb[2 * j] = fold(av, bv, 0.0);
        bb[2 * j + 1] = fold(av, bv, 0.0);
    }
    spread(&a, a8);
}
