//! Element-wise and per-row layer ops shared by every Llama-family variant:
//! RMSNorm, rotary embedding (rotate-half form), SiLU-and-mul, embedding
//! gather, and the small vector kernels (dot, axpy) the attention uses.
//!
//! Activations are row-major `[tokens, features]` f32 slices. Every op is
//! O(tokens x features) and allocation-free; the inner loops are written over
//! fixed-width chunks so that LLVM vectorizes them (AVX2 + FMA with the
//! workspace's `target-cpu=x86-64-v3`).

use model_loader::RopeScaling;

/// Lanes of one accumulator in [`dot`] (one AVX register of f32).
const LANES: usize = 8;

/// Independent accumulators in [`dot`] (hides the FMA latency).
#[cfg(not(all(
    target_arch = "x86_64",
    target_feature = "avx2",
    target_feature = "fma"
)))]
const ACCS: usize = 4;

/// Sums 8 lanes as a tree (3 dependent adds; a serial fold is 7, and LLVM
/// may not reorder float adds itself).
#[inline]
fn hsum8(v: [f32; LANES]) -> f32 {
    let a: [f32; 4] = std::array::from_fn(|i| v[i] + v[i + 4]);
    let b = [a[0] + a[2], a[1] + a[3]];
    b[0] + b[1]
}

/// Dot product of two equal-length slices, accumulated in f32 in `ACCS`
/// vectors of `LANES` partial sums reduced as a tree (vectorizes; the order
/// differs from a serial sum by rounding only). This is the attention's
/// `q . k` (64 values for SmolLM2): the reduction, not the multiplies,
/// dominated the old 32-lane serial fold.
#[cfg(not(all(
    target_arch = "x86_64",
    target_feature = "avx2",
    target_feature = "fma"
)))]
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    const W: usize = LANES * ACCS;
    let mut acc = [[0.0f32; LANES]; ACCS];
    let ca = a.chunks_exact(W);
    let cb = b.chunks_exact(W);
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for (j, accj) in acc.iter_mut().enumerate() {
            for (l, s) in accj.iter_mut().enumerate() {
                *s = x[j * LANES + l].mul_add(y[j * LANES + l], *s);
            }
        }
    }
    let ra8 = ra.chunks_exact(LANES);
    let rb8 = rb.chunks_exact(LANES);
    let (ta, tb) = (ra8.remainder(), rb8.remainder());
    for (x, y) in ra8.zip(rb8) {
        for (l, s) in acc[0].iter_mut().enumerate() {
            *s = x[l].mul_add(y[l], *s);
        }
    }
    let mut tail = 0.0f32;
    for (x, y) in ta.iter().zip(tb) {
        tail = x.mul_add(*y, tail);
    }
    let v: [f32; LANES] =
        std::array::from_fn(|l| (acc[0][l] + acc[1][l]) + (acc[2][l] + acc[3][l]));
    hsum8(v) + tail
}

/// [`dot`] with AVX2 + FMA (the workspace's `x86-64-v3` baseline): LLVM
/// turned the portable form into 2-wide vectors with spills (the profile
/// showed it at half of the attention's time), so it is spelled out: two
/// 8-wide FMA chains, then a 3-step horizontal add.
#[cfg(all(
    target_arch = "x86_64",
    target_feature = "avx2",
    target_feature = "fma"
))]
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    use std::arch::x86_64::*;
    debug_assert_eq!(a.len(), b.len());
    let n = a.len().min(b.len());
    let (pa, pb) = (a.as_ptr(), b.as_ptr());
    let mut i = 0;
    // SAFETY: AVX2 and FMA are enabled at compile time (the cfg above), and
    // every 8-float load at offset i has i + 8 <= n, inside both slices.
    let mut total = unsafe {
        let (mut s0, mut s1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        while i + 16 <= n {
            s0 = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(i)), _mm256_loadu_ps(pb.add(i)), s0);
            s1 = _mm256_fmadd_ps(
                _mm256_loadu_ps(pa.add(i + 8)),
                _mm256_loadu_ps(pb.add(i + 8)),
                s1,
            );
            i += 16;
        }
        if i + 8 <= n {
            s0 = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(i)), _mm256_loadu_ps(pb.add(i)), s0);
            i += 8;
        }
        let s = _mm256_add_ps(s0, s1);
        let q = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
        let q = _mm_add_ps(q, _mm_movehl_ps(q, q));
        _mm_cvtss_f32(_mm_add_ss(q, _mm_movehdup_ps(q)))
    };
    for j in i..n {
        total = a[j].mul_add(b[j], total);
    }
    total
}

/// Sum of a slice, in `LANES` partial sums (vectorizes).
#[inline]
pub fn sum(x: &[f32]) -> f32 {
    let mut acc = [0.0f32; LANES];
    let c = x.chunks_exact(LANES);
    let tail: f32 = c.remainder().iter().sum();
    for v in c {
        for (s, e) in acc.iter_mut().zip(v) {
            *s += e;
        }
    }
    hsum8(acc) + tail
}

/// `e^x` in f32, branch-free so that loops over it vectorize (libm's
/// `expf` is a call per element). Cephes' `expf`: `x = n ln2 + r` with
/// `|r| <= ln2 / 2` (ln2 split in two for an exact reduction), a degree-5
/// polynomial for `e^r`, and `2^n` built in the exponent bits; within 2
/// ulp of the true value over the clamped range. Inputs below -87.3 give
/// about 1e-38 (not 0), above 88.3 about 2e38 (not infinity); NaN stays NaN.
#[inline]
pub fn exp(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    let x = x.clamp(-87.336_54, 88.3);
    let n = (x * LOG2E + 0.5).floor();
    let r = n.mul_add(-LN2_LO, n.mul_add(-LN2_HI, x));
    let mut p = 1.987_569_1e-4f32;
    p = p.mul_add(r, 1.398_199_9e-3);
    p = p.mul_add(r, 8.333_452e-3);
    p = p.mul_add(r, 4.166_579_6e-2);
    p = p.mul_add(r, 0.166_666_65);
    p = p.mul_add(r, 0.5);
    let y = p.mul_add(r * r, r) + 1.0;
    // n lies in -126..=127 after the clamp: a normal power of two, built
    // from the bits of n + 1.5 * 2^23, whose low mantissa bits hold n in
    // two's complement (exact for |n| < 2^22). Not `n as i32`: Rust's
    // saturating cast does not vectorize (a scalar convert, two compares
    // and moves per value: most of softmax's and SiLU's time at batch 32).
    // A NaN `x` gives a NaN `y`, so any exponent bits give NaN.
    const MAGIC: f32 = 12_582_912.0;
    let e = (n + MAGIC).to_bits().wrapping_sub(MAGIC.to_bits());
    y * f32::from_bits(e.wrapping_add(127) << 23)
}

/// `out += alpha * x`.
#[inline]
pub fn axpy(alpha: f32, x: &[f32], out: &mut [f32]) {
    debug_assert_eq!(x.len(), out.len());
    for (o, v) in out.iter_mut().zip(x) {
        *o = v.mul_add(alpha, *o);
    }
}

/// RMSNorm of each row of `x` (`[rows, weight.len()]`) into `out`:
/// `out = x / sqrt(mean(x^2) + eps) * weight`.
pub fn rms_norm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let h = weight.len();
    debug_assert_eq!(x.len(), out.len());
    for (row, orow) in x.chunks_exact(h).zip(out.chunks_exact_mut(h)) {
        let ms = dot(row, row) / h as f32;
        let inv = 1.0 / (ms + eps).sqrt();
        for ((o, v), w) in orow.iter_mut().zip(row).zip(weight) {
            *o = v * inv * w;
        }
    }
}

/// SiLU-and-mul: each row of `gate_up` is `[gate (inter), up (inter)]`; the
/// matching row of `out` (`inter` wide) gets `silu(gate) * up`.
pub fn silu_mul(gate_up: &[f32], inter: usize, out: &mut [f32]) {
    debug_assert_eq!(gate_up.len(), out.len() * 2);
    for (row, orow) in gate_up
        .chunks_exact(2 * inter)
        .zip(out.chunks_exact_mut(inter))
    {
        let (gate, up) = row.split_at(inter);
        for ((o, g), u) in orow.iter_mut().zip(gate).zip(up) {
            *o = g / (1.0 + exp(-g)) * u;
        }
    }
}

/// RMSNorm in place over consecutive groups of `weight.len()` values (each
/// head of a `[heads * head_dim]` row with a `[head_dim]` weight: Gemma 3's
/// q/k norms).
pub fn rms_norm_in_place(x: &mut [f32], weight: &[f32], eps: f32) {
    let h = weight.len();
    for row in x.chunks_exact_mut(h) {
        let ms = dot(row, row) / h as f32;
        let inv = 1.0 / (ms + eps).sqrt();
        for (v, w) in row.iter_mut().zip(weight) {
            *v *= inv * w;
        }
    }
}

/// GELU (tanh approximation, PyTorch's `gelu(approximate="tanh")`) of the
/// gate times the up projection, row by row: `gate_up` is
/// `[tokens, 2 * inter]` (gate first), `out` is `[tokens, inter]` (Gemma).
pub fn gelu_tanh_mul(gate_up: &[f32], inter: usize, out: &mut [f32]) {
    debug_assert_eq!(gate_up.len(), out.len() * 2);
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    for (row, orow) in gate_up
        .chunks_exact(2 * inter)
        .zip(out.chunks_exact_mut(inter))
    {
        let (gate, up) = row.split_at(inter);
        for ((o, &g), u) in orow.iter_mut().zip(gate).zip(up) {
            let t = (SQRT_2_OVER_PI * (g + 0.044_715 * g * g * g)).tanh();
            *o = 0.5 * g * (1.0 + t) * u;
        }
    }
}

/// Copies embedding rows `table[id]` (`hidden` wide) into consecutive rows of
/// `out`. The caller has checked every id against the vocabulary.
pub fn embed(table: &[f32], hidden: usize, ids: &[u32], out: &mut [f32]) {
    for (&id, orow) in ids.iter().zip(out.chunks_exact_mut(hidden)) {
        let start = id as usize * hidden;
        orow.copy_from_slice(&table[start..start + hidden]);
    }
}

/// Rotary inverse frequencies `theta^(-2i/head_dim)` for `i < head_dim/2`,
/// with Llama 3.1's piecewise scaling applied when configured.
pub fn rope_inv_freq(head_dim: usize, theta: f32, scaling: Option<RopeScaling>) -> Vec<f64> {
    let half = head_dim / 2;
    let base: Vec<f64> = (0..half)
        .map(|i| 1.0 / (theta as f64).powf(2.0 * i as f64 / head_dim as f64))
        .collect();
    match scaling {
        None => base,
        Some(RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings,
        }) => {
            let (factor, low, high) = (
                factor as f64,
                low_freq_factor as f64,
                high_freq_factor as f64,
            );
            let old_len = original_max_position_embeddings as f64;
            let low_wavelen = old_len / low;
            let high_wavelen = old_len / high;
            base.into_iter()
                .map(|freq| {
                    let wavelen = 2.0 * std::f64::consts::PI / freq;
                    if wavelen < high_wavelen {
                        freq
                    } else if wavelen > low_wavelen {
                        freq / factor
                    } else {
                        let smooth = (old_len / wavelen - low) / (high - low);
                        (1.0 - smooth) * freq / factor + smooth * freq
                    }
                })
                .collect()
        }
    }
}

/// Precomputed cos/sin tables for positions `0..max_positions`, computed once
/// in f64 and stored as f32 `[max_positions, head_dim/2]`.
#[derive(Debug, Clone)]
pub struct RopeTables {
    half: usize,
    max_positions: usize,
    cos: Vec<f32>,
    sin: Vec<f32>,
}

impl RopeTables {
    /// Tables for `head_dim` (even) and positions below `max_positions`.
    pub fn new(
        head_dim: usize,
        theta: f32,
        scaling: Option<RopeScaling>,
        max_positions: usize,
    ) -> Self {
        let half = head_dim / 2;
        let inv = rope_inv_freq(head_dim, theta, scaling);
        let mut cos = Vec::with_capacity(max_positions * half);
        let mut sin = Vec::with_capacity(max_positions * half);
        for p in 0..max_positions {
            for f in &inv {
                let angle = p as f64 * f;
                cos.push(angle.cos() as f32);
                sin.push(angle.sin() as f32);
            }
        }
        Self {
            half,
            max_positions,
            cos,
            sin,
        }
    }

    /// The tables as the GPU rotary kernel reads them: `f32[max_positions,
    /// head_dim]`, each row the cosines then the sines of its position.
    pub fn cos_sin_cache(&self) -> Vec<f32> {
        let h = self.half;
        let mut out = Vec::with_capacity(self.max_positions * 2 * h);
        for p in 0..self.max_positions {
            out.extend_from_slice(&self.cos[p * h..(p + 1) * h]);
            out.extend_from_slice(&self.sin[p * h..(p + 1) * h]);
        }
        out
    }

    /// Number of positions covered.
    pub fn max_positions(&self) -> usize {
        self.max_positions
    }

    /// Rotates every head of one token in place (rotate-half form):
    /// `x[i], x[i+half] <- x[i] cos - x[i+half] sin, x[i+half] cos + x[i] sin`.
    /// `x` is `[n_heads, 2*half]`; `pos < max_positions` (checked by the caller).
    pub fn apply(&self, x: &mut [f32], pos: usize) {
        let half = self.half;
        let cos = &self.cos[pos * half..(pos + 1) * half];
        let sin = &self.sin[pos * half..(pos + 1) * half];
        for head in x.chunks_exact_mut(2 * half) {
            let (a, b) = head.split_at_mut(half);
            for (((x1, x2), c), s) in a.iter_mut().zip(b.iter_mut()).zip(cos).zip(sin) {
                let (u, v) = (*x1, *x2);
                *x1 = u * c - v * s;
                *x2 = v * c + u * s;
            }
        }
    }
}

/// Numerically stable in-place softmax of `x`; returns nothing, `x` sums to 1.
/// Three vectorized passes (max, exp, scale).
pub fn softmax_in_place(x: &mut [f32]) {
    let mut m = [f32::NEG_INFINITY; LANES];
    let c = x.chunks_exact(LANES);
    let tail = c
        .remainder()
        .iter()
        .copied()
        .fold(f32::NEG_INFINITY, f32::max);
    for v in c {
        for (a, e) in m.iter_mut().zip(v) {
            *a = a.max(*e);
        }
    }
    let max = m.iter().copied().fold(tail, f32::max);
    for v in x.iter_mut() {
        *v = exp(*v - max);
    }
    let inv = 1.0 / sum(x);
    for v in x.iter_mut() {
        *v *= inv;
    }
}
