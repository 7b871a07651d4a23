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

    /// Quantizes `x[m, k]`. Panics unless `k` is a multiple of 32 and `x`
    /// holds `m * k` values (the model checks shapes at load).
    pub fn with_precision(x: &[f32], m: usize, k: usize, p: ActPrecision) -> Self {
        assert!(
            k.is_multiple_of(QA) && x.len() >= m * k,
            "activations: shape"
        );
        let two = p == ActPrecision::Two8;
        let mut q = vec![0i8; m * k];
        let mut lo = vec![0i8; if two { m * k } else { 0 }];
        let mut d = vec![0f32; m * k / QA];
        let mut sums = vec![0f32; m * k / 16];
        for (b, (((xb, qb), db), sb)) in x[..m * k]
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
        Self {
            m,
            k,
            q,
            lo,
            d,
            sums,
        }
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
