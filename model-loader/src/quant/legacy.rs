//! The 32-element block types: `Q4_0`, `Q4_1`, `Q5_0`, `Q5_1`, `Q8_0`
//! (llama.cpp `ggml-common.h`). Nibble order: byte `j` of `qs` holds element
//! `j` in its low nibble and element `j + 16` in its high nibble; `Q5_*` keep
//! bit 4 of element `j` in bit `j` of the little-endian `u32` `qh`.
//!
//! Encoders follow llama.cpp's reference quantizers (`quantize_row_*_ref`):
//! the same scale choice, the same rounding (`(int8)(v + 0.5)` truncation,
//! `roundf` for `Q8_0`), so they write the bytes llama.cpp writes.

use half::f16;

use super::GROUP;

fn f16_at(b: &[u8], i: usize) -> f32 {
    f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

fn put_f16(out: &mut Vec<u8>, v: f32) {
    out.extend_from_slice(&f16::from_f32(v).to_le_bytes());
}

/// Fills both 16-element groups of a 32-block with the same `a`, `b`.
fn two_groups(a: &mut [f32], b: &mut [f32], av: f32, bv: f32) {
    debug_assert_eq!(a.len(), 32 / GROUP);
    a.fill(av);
    b.fill(bv);
}

pub(super) fn decode_q4_0(blk: &[u8], q: &mut [i8], a: &mut [f32], b: &mut [f32]) {
    for j in 0..16 {
        let v = blk[2 + j];
        q[j] = (v & 0x0f) as i8 - 8;
        q[j + 16] = (v >> 4) as i8 - 8;
    }
    two_groups(a, b, f16_at(blk, 0), 0.0);
}

pub(super) fn decode_q4_1(blk: &[u8], q: &mut [i8], a: &mut [f32], b: &mut [f32]) {
    for j in 0..16 {
        let v = blk[4 + j];
        q[j] = (v & 0x0f) as i8;
        q[j + 16] = (v >> 4) as i8;
    }
    two_groups(a, b, f16_at(blk, 0), f16_at(blk, 2));
}

/// The 5-bit values of a `Q5_*` block (`qh` at `h`, `qs` at `h + 4`).
fn five_bits(blk: &[u8], h: usize, q: &mut [i8], offset: i8) {
    let qh = u32::from_le_bytes([blk[h], blk[h + 1], blk[h + 2], blk[h + 3]]);
    for j in 0..16 {
        let v = blk[h + 4 + j];
        let hi0 = ((qh >> j) & 1) as u8;
        let hi1 = ((qh >> (j + 16)) & 1) as u8;
        q[j] = ((v & 0x0f) | (hi0 << 4)) as i8 - offset;
        q[j + 16] = ((v >> 4) | (hi1 << 4)) as i8 - offset;
    }
}

pub(super) fn decode_q5_0(blk: &[u8], q: &mut [i8], a: &mut [f32], b: &mut [f32]) {
    five_bits(blk, 2, q, 16);
    two_groups(a, b, f16_at(blk, 0), 0.0);
}

pub(super) fn decode_q5_1(blk: &[u8], q: &mut [i8], a: &mut [f32], b: &mut [f32]) {
    five_bits(blk, 4, q, 0);
    two_groups(a, b, f16_at(blk, 0), f16_at(blk, 2));
}

pub(super) fn decode_q8_0(blk: &[u8], q: &mut [i8], a: &mut [f32], b: &mut [f32]) {
    for (d, s) in q.iter_mut().zip(&blk[2..34]) {
        *d = *s as i8;
    }
    two_groups(a, b, f16_at(blk, 0), 0.0);
}

/// The value of largest magnitude, with its sign (first one on ties).
pub(super) fn signed_amax(x: &[f32]) -> f32 {
    let (mut amax, mut max) = (0f32, 0f32);
    for &v in x {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    max
}

fn min_max(x: &[f32]) -> (f32, f32) {
    x.iter()
        .fold((f32::MAX, -f32::MAX), |(lo, hi), &v| (lo.min(v), hi.max(v)))
}

fn inv(d: f32) -> f32 {
    if d != 0.0 {
        1.0 / d
    } else {
        0.0
    }
}

pub(super) fn encode_q4_0(x: &[f32], out: &mut Vec<u8>) {
    let d = signed_amax(x) / -8.0;
    let id = inv(d);
    put_f16(out, d);
    for j in 0..16 {
        let lo = ((x[j] * id + 8.5) as i8).min(15) as u8;
        let hi = ((x[j + 16] * id + 8.5) as i8).min(15) as u8;
        out.push(lo | (hi << 4));
    }
}

pub(super) fn encode_q4_1(x: &[f32], out: &mut Vec<u8>) {
    let (min, max) = min_max(x);
    let d = (max - min) / 15.0;
    let id = inv(d);
    put_f16(out, d);
    put_f16(out, min);
    for j in 0..16 {
        let lo = (((x[j] - min) * id + 0.5) as i8).min(15) as u8;
        let hi = (((x[j + 16] - min) * id + 0.5) as i8).min(15) as u8;
        out.push(lo | (hi << 4));
    }
}

/// Packs 32 five-bit values as `qh` (u32 LE) then 16 bytes of nibbles.
fn pack_five(v: &[u8; 32], out: &mut Vec<u8>) {
    let mut qh = 0u32;
    for (j, &q) in v.iter().enumerate() {
        qh |= u32::from(q >> 4) << j;
    }
    out.extend_from_slice(&qh.to_le_bytes());
    for j in 0..16 {
        out.push((v[j] & 0x0f) | ((v[j + 16] & 0x0f) << 4));
    }
}

pub(super) fn encode_q5_0(x: &[f32], out: &mut Vec<u8>) {
    let d = signed_amax(x) / -16.0;
    let id = inv(d);
    put_f16(out, d);
    let mut v = [0u8; 32];
    for (q, &xv) in v.iter_mut().zip(x) {
        *q = ((xv * id + 16.5) as i8).min(31) as u8;
    }
    pack_five(&v, out);
}

pub(super) fn encode_q5_1(x: &[f32], out: &mut Vec<u8>) {
    let (min, max) = min_max(x);
    let d = (max - min) / 31.0;
    let id = inv(d);
    put_f16(out, d);
    put_f16(out, min);
    let mut v = [0u8; 32];
    for (q, &xv) in v.iter_mut().zip(x) {
        *q = (((xv - min) * id + 0.5) as i8).clamp(0, 31) as u8;
    }
    pack_five(&v, out);
}

pub(super) fn encode_q8_0(x: &[f32], out: &mut Vec<u8>) {
    let amax = x.iter().fold(0f32, |a, v| a.max(v.abs()));
    let d = amax / 127.0;
    let id = inv(d);
    put_f16(out, d);
    out.extend(x.iter().map(|v| (v * id).round() as i8 as u8));
}
