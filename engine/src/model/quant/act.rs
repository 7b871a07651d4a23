//! Activations quantized per 32 values to 8 bits, as llama.cpp's `Q8_0`
//! (`d = amax / 127`, `q = round(x / d)`), optionally with a second 8-bit
//! level for the rounding residual ([`ActPrecision::Two8`]).
//!
//! Two levels: `lo = round((x - d q) / (d / 256))`, clamped to -127..=127,
//! so `x ~ (256 q + lo) * d / 256` with an error of `d / 512` at most
//! (16-bit precision): the kernels form the integer `256 dot(w, q) +
//! dot(w, lo)` exactly in i32 (lane sums stay below 2^24, so the f32
//! conversion is exact too) and scale it once by `d / 256`. The integer work
//! doubles; the memory traffic and the f32 work stay the same.
//!
//! Invariants: `k` is a multiple of 32; `d` is the scale of the combined
//! integer (`amax / 127`, divided by 256 with two levels);
//! `sums[g] = d * sum(combined[16g..16g+16])` (the term the weights'
//! per-16 offsets multiply).
//! Cost: O(m k), one allocation of each array per call.

use crate::model::par;

/// Values per activation block (one scale each).
pub const QA: usize = 32;

/// How finely activations are quantized.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ActPrecision {
    /// One 8-bit level per value (llama.cpp's `Q8_0`).
    One8,
    /// An 8-bit level plus an 8-bit residual (about 16 bits).
    Two8,
}

/// `m` rows of `k` quantized activations.
#[derive(Debug, Clone)]
pub struct QuantizedActs {
    pub m: usize,
    pub k: usize,
    /// `[m, k]` levels.
    pub q: Vec<i8>,
    /// `[m, k]` residual levels (empty with [`ActPrecision::One8`]).
    pub lo: Vec<i8>,
    /// `[m, k / 32]` scales of the combined integer.
    pub d: Vec<f32>,
    /// `[m, k / 16]` scaled sums of 16 values.
    pub sums: Vec<f32>,
    /// The whole groups of rows again in the lane kernel's order, when
    /// built ([`QuantizedActs::with_lanes`]).
    pub lanes: Option<super::lanes::LaneActs>,
}

/// One row of [`QuantizedActs`].
#[derive(Clone, Copy)]
pub struct ActRow<'a> {
    pub q: &'a [i8],
    /// The residual levels, if any.
    pub lo: Option<&'a [i8]>,
    pub d: &'a [f32],
    pub sums: &'a [f32],
}

impl QuantizedActs {
    /// Quantizes `x[m, k]` with [`ActPrecision::Two8`].
    pub fn new(x: &[f32], m: usize, k: usize) -> Self {
        Self::with_precision(x, m, k, ActPrecision::Two8)
    }

    /// Quantizes `x[m, k]` (with AVX2 where the CPU has it). Panics unless
    /// `k` is a multiple of 32 and `x` holds `m * k` values (the model
    /// checks shapes at load).
    pub fn with_precision(x: &[f32], m: usize, k: usize, p: ActPrecision) -> Self {
        Self::quantize(x, m, k, p, false)
    }

    /// [`QuantizedActs::with_precision`], with 512-bit registers where
    /// `wide512` and the CPU has AVX-512 F/BW/DQ
    /// ([`super::kernels::has_avx512_bw`]): the
    /// same bits, half the instructions (the pass was ~4% of a batch-32
    /// decode step). False keeps AVX2 (to measure the AVX2 path on an
    /// AVX-512 machine).
    pub fn quantize(x: &[f32], m: usize, k: usize, p: ActPrecision, wide512: bool) -> Self {
        let wide512 = wide512 && super::kernels::has_avx512_bw();
        assert!(
            k.is_multiple_of(QA) && x.len() >= m * k,
            "activations: shape"
        );
        let mut a = Self::zeroed(m, k, p);
        if m * k == 0 {
            return a;
        }
        let rows = m.div_ceil(par::parts(m, m * k));
        let mut parts: Vec<_> = x[..m * k].chunks(rows * k).zip(a.parts(rows)).collect();
        par::for_each_mut(&mut parts, |(x, part): &mut (&[f32], Part<'_>)| {
            #[cfg(target_arch = "x86_64")]
            if wide512 {
                // SAFETY: the CPU has AVX-512 F/BW/DQ and AVX2
                // (`has_avx512_bw`, checked above).
                unsafe { fill_zmm(x, part) };
                return;
            }
            #[cfg(target_arch = "x86_64")]
            if std::arch::is_x86_feature_detected!("avx2") {
                // SAFETY: the CPU has AVX2 (checked just above).
                unsafe { fill_avx2(x, part) };
                return;
            }
            fill(x, part);
        });
        a
    }

    /// The buffers cut at every `rows` rows (the parts [`fill`] writes).
    fn parts(&mut self, rows: usize) -> Vec<Part<'_>> {
        let k = self.k;
        let mut out = Vec::with_capacity(self.m.div_ceil(rows));
        let (mut q, mut lo, mut d, mut sums) = (
            &mut self.q[..],
            &mut self.lo[..],
            &mut self.d[..],
            &mut self.sums[..],
        );
        while !q.is_empty() {
            let n = rows * k;
            let (qh, loh) = (split_front(&mut q, n), split_front(&mut lo, n));
            let (dh, sh) = (split_front(&mut d, n / QA), split_front(&mut sums, n / 16));
            out.push(Part {
                q: qh,
                lo: loh,
                d: dh,
                sums: sh,
            });
        }
        out
    }

    /// `m` rows of `k` zeros, with the residual levels if `p` has them.
    fn zeroed(m: usize, k: usize, p: ActPrecision) -> Self {
        Self {
            m,
            k,
            q: vec![0i8; m * k],
            lo: vec![0i8; if p == ActPrecision::Two8 { m * k } else { 0 }],
            d: vec![0f32; m * k / QA],
            sums: vec![0f32; m * k / 16],
            lanes: None,
        }
    }

    /// The same activations with their whole groups of `width` rows
    /// ([`super::lanes::LANES`] or [`super::lanes::MAX_LANES`]) also laid
    /// out for the lane kernel (built once, shared by every weight part of
    /// a product).
    pub fn with_lanes(mut self, width: usize) -> Self {
        self.lanes = super::lanes::LaneActs::new(&self, width);
        self
    }

    /// Row `r`'s levels, scales and sums.
    pub fn row(&self, r: usize) -> ActRow<'_> {
        let k = self.k;
        ActRow {
            q: &self.q[r * k..(r + 1) * k],
            lo: (!self.lo.is_empty()).then(|| &self.lo[r * k..(r + 1) * k]),
            d: &self.d[r * k / QA..(r + 1) * k / QA],
            sums: &self.sums[r * k / 16..(r + 1) * k / 16],
        }
    }

    /// The value the kernels multiply for element `i` of row `r`.
    pub fn value(&self, r: usize, i: usize) -> f64 {
        let j = r * self.k + i;
        let lo = self.lo.get(j).map_or(0.0, |&l| f64::from(l));
        let hi = f64::from(self.q[j]) * if self.lo.is_empty() { 1.0 } else { 256.0 };
        (hi + lo) * f64::from(self.d[j / QA])
    }
}

/// The first `n` items of `v` (all where it is shorter), `v` left with the
/// rest.
fn split_front<'a, T>(v: &mut &'a mut [T], n: usize) -> &'a mut [T] {
    let len = v.len();
    let (head, tail) = std::mem::take(v).split_at_mut(n.min(len));
    *v = tail;
    head
}

/// Some consecutive rows of a [`QuantizedActs`]'s buffers (`lo` empty
/// with one level).
struct Part<'a> {
    q: &'a mut [i8],
    lo: &'a mut [i8],
    d: &'a mut [f32],
    sums: &'a mut [f32],
}

/// Quantizes the 32-blocks of `x` into `a` (the part of the same rows, cut
/// by [`QuantizedActs::parts`]; two levels if `a.lo` is not empty). The
/// portable reference; [`fill_avx2`] gives the same bits.
fn fill(x: &[f32], a: &mut Part<'_>) {
    let two = !a.lo.is_empty();
    let (q, lo, d, sums) = (&mut a.q, &mut a.lo, &mut a.d, &mut a.sums);
    for (b, (((xb, qb), db), sb)) in x
        .chunks_exact(QA)
        .zip(q.chunks_exact_mut(QA))
        .zip(d.iter_mut())
        .zip(sums.chunks_exact_mut(2))
        .enumerate()
    {
        let amax = xb.iter().fold(0f32, |a, v| a.max(v.abs()));
        let scale = amax / 127.0;
        let inv = if scale > 0.0 { 1.0 / scale } else { 0.0 };
        for (o, v) in qb.iter_mut().zip(xb) {
            *o = (v * inv).round() as i8;
        }
        let mut comb = [0i32; QA];
        if two {
            let lb = &mut lo[b * QA..(b + 1) * QA];
            for (((o, v), &h), c) in lb.iter_mut().zip(xb).zip(qb.iter()).zip(&mut comb) {
                let r = (v * inv - f32::from(h)) * 256.0;
                *o = r.round().clamp(-127.0, 127.0) as i8;
                *c = 256 * i32::from(h) + i32::from(*o);
            }
            *db = scale / 256.0;
        } else {
            for (c, &h) in comb.iter_mut().zip(qb.iter()) {
                *c = i32::from(h);
            }
            *db = scale;
        }
        for (h, s) in sb.iter_mut().enumerate() {
            let t: i32 = comb[h * 16..h * 16 + 16].iter().sum();
            *s = *db * t as f32;
        }
    }
}

/// [`fill`] with AVX2, one block (32 values) in four vectors: the same
/// float operations in the same order per value, so the same bits.
/// `f32::round` (half away from zero) is `t + copysign(|y - t| >= 0.5, y)`
/// with `t = trunc(y)` (`y - t` is exact); NaN levels become 0 as Rust's
/// `as i8` makes them.
///
/// # Safety
/// The CPU has AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn fill_avx2(x: &[f32], a: &mut Part<'_>) {
    use std::arch::x86_64::*;
    let two = !a.lo.is_empty();
    let abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
    let (sign, half, one) = (
        _mm256_set1_ps(-0.0),
        _mm256_set1_ps(0.5),
        _mm256_set1_ps(1.0),
    );
    let round = |y: __m256| {
        let t = _mm256_round_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(y);
        let ge = _mm256_cmp_ps::<_CMP_GE_OQ>(_mm256_and_ps(_mm256_sub_ps(y, t), abs), half);
        let r = _mm256_add_ps(
            t,
            _mm256_and_ps(ge, _mm256_or_ps(_mm256_and_ps(y, sign), one)),
        );
        // NaN -> 0.
        _mm256_and_ps(r, _mm256_cmp_ps::<_CMP_ORD_Q>(r, r))
    };
    // Four vectors of i32 levels -> 32 bytes in order.
    let pack = |v: [__m256i; 4]| {
        let p = _mm256_packs_epi16(
            _mm256_packs_epi32(v[0], v[1]),
            _mm256_packs_epi32(v[2], v[3]),
        );
        _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7))
    };
    let hsum = |v: __m256i| {
        let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b0100_1110>(s));
        _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32::<0b1011_0001>(s)))
    };
    let (lim, neg_lim, k256) = (
        _mm256_set1_ps(127.0),
        _mm256_set1_ps(-127.0),
        _mm256_set1_ps(256.0),
    );
    for b in 0..x.len() / QA {
        // SAFETY: block b's 32 values lie in `x`, its levels in `a.q` (and
        // `a.lo` with two levels), its scale in `a.d` and its two sums in
        // `a.sums`: a part holds the levels, scales and sums of as many
        // values as its `x` (`QuantizedActs::parts` cuts both at the same
        // rows).
        unsafe {
            let v: [__m256; 4] =
                std::array::from_fn(|i| _mm256_loadu_ps(x.as_ptr().add(b * QA + 8 * i)));
            // max_ps returns its second operand when the first is NaN:
            // NaN values are skipped, as by f32::max.
            let mx = v.iter().fold(_mm256_setzero_ps(), |m, &x| {
                _mm256_max_ps(_mm256_and_ps(x, abs), m)
            });
            let m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps::<1>(mx));
            let m2 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
            let amax = _mm_cvtss_f32(_mm_max_ss(m2, _mm_movehdup_ps(m2)));
            let scale = amax / 127.0;
            let inv = _mm256_set1_ps(if scale > 0.0 { 1.0 / scale } else { 0.0 });
            let y: [__m256; 4] = std::array::from_fn(|i| _mm256_mul_ps(v[i], inv));
            let h: [__m256; 4] = std::array::from_fn(|i| round(y[i]));
            let hi: [__m256i; 4] = std::array::from_fn(|i| _mm256_cvttps_epi32(h[i]));
            _mm256_storeu_si256(a.q.as_mut_ptr().add(b * QA).cast(), pack(hi));
            let db = if two { scale / 256.0 } else { scale };
            *a.d.get_unchecked_mut(b) = db;
            let comb = if two {
                let l: [__m256i; 4] = std::array::from_fn(|i| {
                    let r = round(_mm256_mul_ps(_mm256_sub_ps(y[i], h[i]), k256));
                    _mm256_cvttps_epi32(_mm256_min_ps(_mm256_max_ps(r, neg_lim), lim))
                });
                _mm256_storeu_si256(a.lo.as_mut_ptr().add(b * QA).cast(), pack(l));
                std::array::from_fn(|i| _mm256_add_epi32(_mm256_slli_epi32::<8>(hi[i]), l[i]))
            } else {
                hi
            };
            for g in 0..2 {
                let t = hsum(_mm256_add_epi32(comb[2 * g], comb[2 * g + 1]));
                *a.sums.get_unchecked_mut(2 * b + g) = db * t as f32;
            }
        }
    }
}

/// [`fill_avx2`] with AVX-512, one block in two vectors: per value the
/// same float operations in the same order (the rounding's `+ 0` where no
/// step is taken included, so a `-0.0` becomes `+0.0` as there), so the
/// same bits; the levels are narrowed by saturating `vpmovsdb` (the AVX2
/// packs saturate the same way) and each 16-sum is one register's.
///
/// # Safety
/// The CPU has AVX-512 F, BW and DQ, and AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx2")]
unsafe fn fill_zmm(x: &[f32], a: &mut Part<'_>) {
    use std::arch::x86_64::*;
    let two = !a.lo.is_empty();
    let abs = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fff_ffff));
    let (sign, half, one) = (
        _mm512_set1_ps(-0.0),
        _mm512_set1_ps(0.5),
        _mm512_set1_ps(1.0),
    );
    let round = |y: __m512| {
        let t = _mm512_roundscale_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(y);
        let ge = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(_mm512_and_ps(_mm512_sub_ps(y, t), abs), half);
        let step = _mm512_maskz_mov_ps(ge, _mm512_or_ps(_mm512_and_ps(y, sign), one));
        let r = _mm512_add_ps(t, step);
        // NaN -> 0.
        _mm512_maskz_mov_ps(_mm512_cmp_ps_mask::<_CMP_ORD_Q>(r, r), r)
    };
    let (lim, neg_lim, k256) = (
        _mm512_set1_ps(127.0),
        _mm512_set1_ps(-127.0),
        _mm512_set1_ps(256.0),
    );
    for b in 0..x.len() / QA {
        // SAFETY: as in `fill_avx2` (a part holds the levels, scales and
        // sums of as many values as its `x`).
        unsafe {
            let v: [__m512; 2] =
                std::array::from_fn(|i| _mm512_loadu_ps(x.as_ptr().add(b * QA + 16 * i)));
            // max_ps returns its second operand when the first is NaN.
            let mx = v.iter().fold(_mm512_setzero_ps(), |m, &x| {
                _mm512_max_ps(_mm512_and_ps(x, abs), m)
            });
            let amax = _mm512_reduce_max_ps(mx);
            let scale = amax / 127.0;
            let inv = _mm512_set1_ps(if scale > 0.0 { 1.0 / scale } else { 0.0 });
            let y: [__m512; 2] = std::array::from_fn(|i| _mm512_mul_ps(v[i], inv));
            let h: [__m512; 2] = std::array::from_fn(|i| round(y[i]));
            let hi: [__m512i; 2] = std::array::from_fn(|i| _mm512_cvttps_epi32(h[i]));
            for (i, hv) in hi.iter().enumerate() {
                let q = a.q.as_mut_ptr().add(b * QA + 16 * i);
                _mm_storeu_si128(q.cast(), _mm512_cvtsepi32_epi8(*hv));
            }
            let db = if two { scale / 256.0 } else { scale };
            *a.d.get_unchecked_mut(b) = db;
            for i in 0..2 {
                let comb = if two {
                    let r = round(_mm512_mul_ps(_mm512_sub_ps(y[i], h[i]), k256));
                    let l = _mm512_cvttps_epi32(_mm512_min_ps(_mm512_max_ps(r, neg_lim), lim));
                    let lo = a.lo.as_mut_ptr().add(b * QA + 16 * i);
                    _mm_storeu_si128(lo.cast(), _mm512_cvtsepi32_epi8(l));
                    _mm512_add_epi32(_mm512_slli_epi32::<8>(hi[i]), l)
                } else {
                    hi[i]
                };
                let t = _mm512_reduce_add_epi32(comb);
                *a.sums.get_unchecked_mut(2 * b + i) = db * t as f32;
            }
        }
    }
}

/// [`QuantizedActs::with_precision`] without the AVX2 build (tests
/// compare the two bit for bit).
#[cfg(test)]
pub(super) fn portable(x: &[f32], m: usize, k: usize, p: ActPrecision) -> QuantizedActs {
    let mut a = QuantizedActs::zeroed(m, k, p);
    for mut part in a.parts(m.max(1)) {
        fill(&x[..m * k], &mut part);
    }
    a
}
