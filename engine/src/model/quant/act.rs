//! Activations quantized per 32 values to 8 bits, as llama.cpp's `Q8_0`:
//! `d = amax / 127`, `q = round(x / d)`.
//!
//! Invariants: `k` is a multiple of 32; `sums[g] = d * sum(q[16g..16g+16])`
//! (the term the weights' per-16 offsets multiply).
//! Cost: O(m k), one allocation of each array per call.

/// Values per activation block (one scale each).
pub const QA: usize = 32;

/// `m` rows of `k` quantized activations.
#[derive(Debug, Clone)]
pub struct QuantizedActs {
    pub m: usize,
    pub k: usize,
    /// `[m, k]` levels.
    pub q: Vec<i8>,
    /// `[m, k / 32]` scales.
    pub d: Vec<f32>,
    /// `[m, k / 16]` scaled sums of 16 levels.
    pub sums: Vec<f32>,
}

impl QuantizedActs {
    /// Quantizes `x[m, k]`. Panics unless `k` is a multiple of 32 and `x`
    /// holds `m * k` values (the model checks shapes at load).
    pub fn new(x: &[f32], m: usize, k: usize) -> Self {
        assert!(
            k.is_multiple_of(QA) && x.len() >= m * k,
            "activations: shape"
        );
        let mut q = vec![0i8; m * k];
        let mut d = vec![0f32; m * k / QA];
        let mut sums = vec![0f32; m * k / 16];
        for (((xb, qb), db), sb) in x[..m * k]
            .chunks_exact(QA)
            .zip(q.chunks_exact_mut(QA))
            .zip(d.iter_mut())
            .zip(sums.chunks_exact_mut(2))
        {
            let amax = xb.iter().fold(0f32, |a, v| a.max(v.abs()));
            let scale = amax / 127.0;
            let inv = if scale > 0.0 { 1.0 / scale } else { 0.0 };
            for (o, v) in qb.iter_mut().zip(xb) {
                *o = (v * inv).round() as i8;
            }
            *db = scale;
            for (h, s) in sb.iter_mut().enumerate() {
                let t: i32 = qb[h * 16..h * 16 + 16].iter().map(|&v| i32::from(v)).sum();
                *s = scale * t as f32;
            }
        }
        Self { m, k, q, d, sums }
    }

    /// Row `r`'s levels, scales and sums.
    pub fn row(&self, r: usize) -> (&[i8], &[f32], &[f32]) {
        let k = self.k;
        (
            &self.q[r * k..(r + 1) * k],
            &self.d[r * k / QA..(r + 1) * k / QA],
            &self.sums[r * k / 16..(r + 1) * k / 16],
        )
    }
}
