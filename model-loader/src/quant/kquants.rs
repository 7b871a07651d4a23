//! The 256-element "K" super-block types (llama.cpp `ggml-common.h`):
//!
//! | type | bytes | layout | value |
//! |------|-------|--------|-------|
//! | `Q2_K` | 84  | `scales[16]` (4-bit scale, 4-bit min), `qs[64]`, `d`, `dmin` | `d*sc*q - dmin*m`, q in 0..3 |
//! | `Q3_K` | 110 | `hmask[32]`, `qs[64]`, `scales[12]` (16 x 6-bit), `d` | `d*(sc-32)*q`, q in -4..3 |
//! | `Q4_K` | 144 | `d`, `dmin`, `scales[12]` (8 x 6-bit scale and min), `qs[128]` | `d*sc*q - dmin*m`, q in 0..15 |
//! | `Q5_K` | 176 | `d`, `dmin`, `scales[12]`, `qh[32]`, `qs[128]` | as `Q4_K`, q in 0..31 |
//! | `Q6_K` | 210 | `ql[128]`, `qh[64]`, `scales[16]` (i8), `d` | `d*sc*q`, q in -32..31 |
//! | `Q8_K` | 292 | `d` (f32), `qs[256]` (i8), `bsums[16]` (i16) | `d*q` |
//!
//! Scales are per 16 elements (`Q2_K`, `Q3_K`, `Q6_K`) or per 32 (`Q4_K`,
//! `Q5_K`). The bit positions below are the inverse of the unpacking in
//! ggml's `dequantize_row_*` (and the `gguf` Python package).
//!
//! Encoders: the reference quantizers' layout and scale quantization, with
//! the per-sub-block scale taken directly from the range (llama.cpp's
//! `make_qkx2_quants` / `make_qx_quants` refine it iteratively; ours skip the
//! search, so they are valid files of slightly lower accuracy).

use half::f16;

use super::legacy::signed_amax;

fn f16_at(b: &[u8], i: usize) -> f32 {
    f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

/// Rounds to f16 and back (what a reader will see).
fn h(v: f32) -> f32 {
    f16::from_f32(v).to_f32()
}

fn nearest(v: f32) -> i32 {
    v.round() as i32
}

// ---------------------------------------------------------------- decoders

pub(super) fn decode_q2_k(blk: &[u8], q: &mut [i8], a: &mut [f32], b: &mut [f32]) {
    let (scales, qs) = (&blk[0..16], &blk[16..80]);
    let (d, dmin) = (f16_at(blk, 80), f16_at(blk, 82));
    for (e, v) in q.iter_mut().enumerate() {
        let (hh, s, l) = (e / 128, (e % 128) / 32, e % 32);
        *v = ((qs[hh * 32 + l] >> (2 * s)) & 3) as i8;
    }
    for g in 0..16 {
        a[g] = d * f32::from(scales[g] & 0x0f);
        b[g] = -(dmin * f32::from(scales[g] >> 4));
    }
}

pub(super) fn decode_q3_k(blk: &[u8], q: &mut [i8], a: &mut [f32], b: &mut [f32]) {
    let (hmask, qs, sc) = (&blk[0..32], &blk[32..96], &blk[96..108]);
    let d = f16_at(blk, 108);
    for (e, v) in q.iter_mut().enumerate() {
        let (hh, s, l) = (e / 128, (e % 128) / 32, e % 32);
        let low = ((qs[hh * 32 + l] >> (2 * s)) & 3) as i8;
        let high = (hmask[l] >> (e / 32)) & 1;
        *v = if high == 1 { low } else { low - 4 };
    }
    for g in 0..16 {
        let low = if g < 8 { sc[g] & 0x0f } else { sc[g - 8] >> 4 };
        let high = (sc[8 + g % 4] >> (2 * (g / 4))) & 3;
        let s = i32::from(low | (high << 4)) - 32;
        a[g] = d * s as f32;
        b[g] = 0.0;
    }
}

/// The 8 six-bit (scale, min) pairs of `Q4_K` / `Q5_K` (`sc`: the block's
/// 12 scale bytes; `j < 8`).
#[inline]
pub fn scale_min_k4(sc: &[u8], j: usize) -> (u8, u8) {
    if j < 4 {
        (sc[j] & 63, sc[j + 4] & 63)
    } else {
        (
            (sc[j + 4] & 0x0f) | ((sc[j - 4] >> 6) << 4),
            (sc[j + 4] >> 4) | ((sc[j] >> 6) << 4),
        )
    }
}

fn k4_scales(blk: &[u8], a: &mut [f32], b: &mut [f32]) {
    let (d, dmin) = (f16_at(blk, 0), f16_at(blk, 2));
    for j in 0..8 {
        let (s, m) = scale_min_k4(&blk[4..16], j);
        let (av, bv) = (d * f32::from(s), -(dmin * f32::from(m)));
        a[2 * j..2 * j + 2].fill(av);
        b[2 * j..2 * j + 2].fill(bv);
    }
}

pub(super) fn decode_q4_k(blk: &[u8], q: &mut [i8], a: &mut [f32], b: &mut [f32]) {
    let qs = &blk[16..144];
    for (e, v) in q.iter_mut().enumerate() {
        let (c, s, l) = (e / 64, (e % 64) / 32, e % 32);
        *v = ((qs[c * 32 + l] >> (4 * s)) & 0x0f) as i8;
    }
    k4_scales(blk, a, b);
}

pub(super) fn decode_q5_k(blk: &[u8], q: &mut [i8], a: &mut [f32], b: &mut [f32]) {
    let (qh, qs) = (&blk[16..48], &blk[48..176]);
    for (e, v) in q.iter_mut().enumerate() {
        let (c, s, l) = (e / 64, (e % 64) / 32, e % 32);
        let low = (qs[c * 32 + l] >> (4 * s)) & 0x0f;
        let high = (qh[l] >> (e / 32)) & 1;
        *v = (low | (high << 4)) as i8;
    }
    k4_scales(blk, a, b);
}

pub(super) fn decode_q6_k(blk: &[u8], q: &mut [i8], a: &mut [f32], b: &mut [f32]) {
    let (ql, qh, sc) = (&blk[0..128], &blk[128..192], &blk[192..208]);
    let d = f16_at(blk, 208);
    for (e, v) in q.iter_mut().enumerate() {
        let (hh, r) = (e / 128, e % 128);
        let low = (ql[hh * 64 + r % 64] >> (4 * (r / 64))) & 0x0f;
        let high = (qh[hh * 32 + r % 32] >> (2 * (r / 32))) & 3;
        *v = (low | (high << 4)) as i8 - 32;
    }
    for g in 0..16 {
        a[g] = d * f32::from(sc[g] as i8);
        b[g] = 0.0;
    }
}

pub(super) fn decode_q8_k(blk: &[u8], q: &mut [i8], a: &mut [f32], b: &mut [f32]) {
    let d = f32::from_le_bytes([blk[0], blk[1], blk[2], blk[3]]);
    for (v, s) in q.iter_mut().zip(&blk[4..260]) {
        *v = *s as i8;
    }
    a.fill(d);
    b.fill(0.0);
}

// ---------------------------------------------------------------- encoders

/// `(min clamped to <= 0, max)` of a sub-block (the K-quants' convention).
fn range0(x: &[f32]) -> (f32, f32) {
    let lo = x.iter().fold(0f32, |m, &v| m.min(v));
    let hi = x.iter().fold(lo, |m, &v| m.max(v));
    (lo, hi)
}

/// Affine sub-block scales `(scale, -min)` for `levels` levels, then both
/// quantized to `bits`-bit integers against super-block `d` / `dmin`.
fn affine_scales(x: &[f32], sub: usize, levels: f32, top: f32) -> (f32, f32, Vec<(u8, u8)>) {
    let raw: Vec<(f32, f32)> = x
        .chunks_exact(sub)
        .map(|c| {
            let (lo, hi) = range0(c);
            ((hi - lo) / levels, -lo)
        })
        .collect();
    let max_scale = raw.iter().fold(0f32, |m, r| m.max(r.0));
    let max_min = raw.iter().fold(0f32, |m, r| m.max(r.1));
    let d = max_scale / top;
    let dmin = max_min / top;
    let q = |v: f32, d: f32| {
        if d > 0.0 {
            nearest(v / d).clamp(0, top as i32) as u8
        } else {
            0
        }
    };
    let ls = raw.iter().map(|&(s, m)| (q(s, d), q(m, dmin))).collect();
    (d, dmin, ls)
}

/// Levels `0..=max_l` of `x` under `value = d*q - m`.
fn affine_levels(x: &[f32], d: f32, m: f32, max_l: i32, out: &mut [u8]) {
    for (o, &v) in out.iter_mut().zip(x) {
        *o = if d > 0.0 {
            nearest((v + m) / d).clamp(0, max_l) as u8
        } else {
            0
        };
    }
}

pub(super) fn encode_q2_k(x: &[f32], out: &mut Vec<u8>) {
    let (d, dmin, ls) = affine_scales(x, 16, 3.0, 15.0);
    let (dh, dminh) = (h(d), h(dmin));
    let mut l = [0u8; 256];
    for (g, &(s, m)) in ls.iter().enumerate() {
        let r = g * 16..g * 16 + 16;
        affine_levels(
            &x[r.clone()],
            dh * f32::from(s),
            dminh * f32::from(m),
            3,
            &mut l[r],
        );
    }
    out.extend(ls.iter().map(|&(s, m)| s | (m << 4)));
    let mut qs = [0u8; 64];
    for (e, &v) in l.iter().enumerate() {
        qs[(e / 128) * 32 + e % 32] |= v << (2 * ((e % 128) / 32));
    }
    out.extend_from_slice(&qs);
    out.extend_from_slice(&f16::from_f32(d).to_le_bytes());
    out.extend_from_slice(&f16::from_f32(dmin).to_le_bytes());
}

/// Symmetric sub-block scales quantized to signed integers in `-lim..lim`:
/// returns `d` and the integer scales.
fn symmetric_scales(x: &[f32], nmax: f32, lim: i32) -> (f32, Vec<i32>) {
    let raw: Vec<f32> = x.chunks_exact(16).map(|c| signed_amax(c) / -nmax).collect();
    let max_scale = signed_amax(&raw);
    if max_scale == 0.0 {
        return (0.0, vec![0; raw.len()]);
    }
    let iscale = -(lim as f32) / max_scale;
    let ls = raw
        .iter()
        .map(|&s| nearest(iscale * s).clamp(-lim, lim - 1))
        .collect();
    (1.0 / iscale, ls)
}

/// Signed levels `-lo..hi` of `x` under `value = d*q`.
fn symmetric_levels(x: &[f32], d: f32, lo: i32, hi: i32, out: &mut [i32]) {
    for (o, &v) in out.iter_mut().zip(x) {
        *o = if d != 0.0 {
            nearest(v / d).clamp(-lo, hi)
        } else {
            0
        };
    }
}

pub(super) fn encode_q3_k(x: &[f32], out: &mut Vec<u8>) {
    let (d, ls) = symmetric_scales(x, 4.0, 32);
    let dh = h(d);
    let mut l = [0i32; 256];
    for (g, &s) in ls.iter().enumerate() {
        let r = g * 16..g * 16 + 16;
        symmetric_levels(&x[r.clone()], dh * s as f32, 4, 3, &mut l[r]);
    }
    let (mut hmask, mut qs) = ([0u8; 32], [0u8; 64]);
    for (e, &v) in l.iter().enumerate() {
        let u = (v + 4) as u8;
        let (low, high) = if u > 3 { (u - 4, 1) } else { (u, 0) };
        qs[(e / 128) * 32 + e % 32] |= low << (2 * ((e % 128) / 32));
        hmask[e % 32] |= high << (e / 32);
    }
    let mut sc = [0u8; 12];
    for (g, &s) in ls.iter().enumerate() {
        let u = (s + 32) as u8;
        if g < 8 {
            sc[g] |= u & 0x0f;
        } else {
            sc[g - 8] |= (u & 0x0f) << 4;
        }
        sc[8 + g % 4] |= (u >> 4) << (2 * (g / 4));
    }
    out.extend_from_slice(&hmask);
    out.extend_from_slice(&qs);
    out.extend_from_slice(&sc);
    out.extend_from_slice(&f16::from_f32(d).to_le_bytes());
}

/// The 12 scale bytes of `Q4_K` / `Q5_K` (inverse of [`scale_min_k4`]).
fn pack_k4_scales(ls: &[(u8, u8)]) -> [u8; 12] {
    let mut sc = [0u8; 12];
    for (j, &(s, m)) in ls.iter().enumerate() {
        if j < 4 {
            sc[j] = s;
            sc[j + 4] = m;
        } else {
            sc[j + 4] = (s & 0x0f) | ((m & 0x0f) << 4);
            sc[j - 4] |= (s >> 4) << 6;
            sc[j] |= (m >> 4) << 6;
        }
    }
    sc
}

/// Shared by `Q4_K` (`max_l` 15) and `Q5_K` (31): header and levels.
fn k4_encode(x: &[f32], max_l: i32, out: &mut Vec<u8>) -> [u8; 256] {
    let (d, dmin, ls) = affine_scales(x, 32, max_l as f32, 63.0);
    let (dh, dminh) = (h(d), h(dmin));
    let mut l = [0u8; 256];
    for (j, &(s, m)) in ls.iter().enumerate() {
        let r = j * 32..j * 32 + 32;
        affine_levels(
            &x[r.clone()],
            dh * f32::from(s),
            dminh * f32::from(m),
            max_l,
            &mut l[r],
        );
    }
    out.extend_from_slice(&f16::from_f32(d).to_le_bytes());
    out.extend_from_slice(&f16::from_f32(dmin).to_le_bytes());
    out.extend_from_slice(&pack_k4_scales(&ls));
    l
}

fn k4_nibbles(l: &[u8; 256]) -> [u8; 128] {
    let mut qs = [0u8; 128];
    for (e, &v) in l.iter().enumerate() {
        qs[(e / 64) * 32 + e % 32] |= (v & 0x0f) << (4 * ((e % 64) / 32));
    }
    qs
}

pub(super) fn encode_q4_k(x: &[f32], out: &mut Vec<u8>) {
    let l = k4_encode(x, 15, out);
    out.extend_from_slice(&k4_nibbles(&l));
}

pub(super) fn encode_q5_k(x: &[f32], out: &mut Vec<u8>) {
    let l = k4_encode(x, 31, out);
    let mut qh = [0u8; 32];
    for (e, &v) in l.iter().enumerate() {
        qh[e % 32] |= (v >> 4) << (e / 32);
    }
    out.extend_from_slice(&qh);
    out.extend_from_slice(&k4_nibbles(&l));
}

pub(super) fn encode_q6_k(x: &[f32], out: &mut Vec<u8>) {
    let (d, ls) = symmetric_scales(x, 32.0, 128);
    let dh = h(d);
    let mut l = [0i32; 256];
    for (g, &s) in ls.iter().enumerate() {
        let r = g * 16..g * 16 + 16;
        symmetric_levels(&x[r.clone()], dh * s as f32, 32, 31, &mut l[r]);
    }
    let (mut ql, mut qh) = ([0u8; 128], [0u8; 64]);
    for (e, &v) in l.iter().enumerate() {
        let u = (v + 32) as u8;
        let (hh, r) = (e / 128, e % 128);
        ql[hh * 64 + r % 64] |= (u & 0x0f) << (4 * (r / 64));
        qh[hh * 32 + r % 32] |= (u >> 4) << (2 * (r / 32));
    }
    out.extend_from_slice(&ql);
    out.extend_from_slice(&qh);
    out.extend(ls.iter().map(|&s| s as i8 as u8));
    out.extend_from_slice(&f16::from_f32(d).to_le_bytes());
}

pub(super) fn encode_q8_k(x: &[f32], out: &mut Vec<u8>) {
    let max = signed_amax(x);
    if max == 0.0 {
        out.extend_from_slice(&0f32.to_le_bytes());
        out.extend(std::iter::repeat_n(0u8, 256 + 32));
        return;
    }
    let iscale = -127.0 / max;
    let qs: Vec<i8> = x
        .iter()
        .map(|&v| nearest(iscale * v).min(127) as i8)
        .collect();
    out.extend_from_slice(&(1.0 / iscale).to_le_bytes());
    out.extend(qs.iter().map(|&v| v as u8));
    for c in qs.chunks_exact(16) {
        let s: i16 = c.iter().map(|&v| i16::from(v)).sum();
        out.extend_from_slice(&s.to_le_bytes());
    }
}
