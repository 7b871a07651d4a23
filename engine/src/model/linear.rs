//! Linear layers `y = x W^T (+ b)`: f32 weights on the `gemm` crate, block-
//! quantized weights on the integer kernels of [`super::quant`].
//!
//! A layer is a stack of parts along the output rows (q/k/v or gate/up
//! fused); adjacent parts of the same kind are merged at construction, so a
//! fused layer is one product unless its parts have different types (a
//! Q4_K_M file may store `attn_v` as Q6_K beside a Q4_K `attn_q`).
//!
//! f32 weights are row-major `[out, in]` as loaded; the GEMM reads them
//! transposed through strides (no copy per call). Work is spread over the
//! [`par`] pool by splitting the output columns into contiguous stripes
//! ([`par::TASKS_PER_THREAD`] per thread, claimed dynamically), each stripe a
//! single-threaded `gemm` call: `gemm` runs its
//! matrix-vector path (used when there is one row, i.e. decode at batch 1)
//! on one thread only, and the stripes keep both cores busy at every batch
//! size. Cost: O(rows x out x in) flops, no allocation beyond gemm's packing
//! (quantized parts: one quantization of the activations per call).

use gemm::{gemm, Parallelism};

use super::par;
use super::quant::{self, ActPrecision, Isa, QMatrix};

/// Output columns per stripe are rounded to this (a multiple of the kernels' NR).
const STRIPE_ALIGN: usize = 32;

/// Below this many multiply-adds a single call is cheaper than a fork.
const PARALLEL_MIN_WORK: usize = 1 << 16;

/// One part of a layer's weight: `[rows, in]` f32 or quantized.
#[derive(Debug, Clone)]
pub enum LinearWeight {
    /// Row-major `[rows, in]`.
    F32(Vec<f32>),
    Quant(QMatrix),
}

impl LinearWeight {
    /// Output rows of this part.
    pub fn rows(&self, in_features: usize) -> usize {
        match self {
            Self::F32(w) => w.len() / in_features.max(1),
            Self::Quant(q) => q.rows,
        }
    }

    /// Bytes held.
    pub fn nbytes(&self) -> usize {
        match self {
            Self::F32(w) => w.len() * 4,
            Self::Quant(q) => q.bytes.len(),
        }
    }
}

/// A dense layer with an optional bias.
#[derive(Debug, Clone)]
pub struct Linear {
    /// Stacked along the output rows, in order.
    pub parts: Vec<LinearWeight>,
    pub bias: Option<Vec<f32>>,
    pub out_features: usize,
    pub in_features: usize,
    /// How the activations of quantized parts are quantized.
    pub act: ActPrecision,
    /// Batch-invariant kernels: each row's result the same bits whatever
    /// the number of rows (quantized parts: exact offset forms and no lane
    /// kernel, see [`quant::matmul_with`]; f32 parts: [`matmul_wt_rows`] instead of
    /// `gemm`, whose blocking and paths depend on the row count).
    pub invariant: bool,
    /// The quantized kernels' family ([`Isa::best`] unless set, e.g. to
    /// measure the AVX2 path on an AVX-512 machine side by side).
    pub isa: Isa,
}

impl Linear {
    /// A layer of one f32 matrix `[out_features, in_features]`.
    pub fn dense(weight: Vec<f32>, out_features: usize, in_features: usize) -> Self {
        Self {
            parts: vec![LinearWeight::F32(weight)],
            bias: None,
            out_features,
            in_features,
            act: ActPrecision::Two8,
            invariant: false,
            isa: Isa::best(),
        }
    }

    /// Stacks `parts` (merging adjacent parts of the same kind and type).
    pub fn stacked(parts: Vec<LinearWeight>, in_features: usize, bias: Option<Vec<f32>>) -> Self {
        let out_features = parts.iter().map(|p| p.rows(in_features)).sum();
        let mut merged: Vec<LinearWeight> = Vec::with_capacity(parts.len());
        for p in parts {
            match (merged.last_mut(), p) {
                (Some(LinearWeight::F32(a)), LinearWeight::F32(b)) => a.extend_from_slice(&b),
                (Some(LinearWeight::Quant(a)), LinearWeight::Quant(b)) if a.ty == b.ty => {
                    a.rows += b.rows;
                    a.bytes.extend_from_slice(&b.bytes);
                }
                (_, p) => merged.push(p),
            }
        }
        Self {
            parts: merged,
            bias,
            out_features,
            in_features,
            act: ActPrecision::Two8,
            invariant: false,
            isa: Isa::best(),
        }
    }

    /// The weight as one f32 slice, when it is a single f32 part.
    pub fn as_f32(&self) -> Option<&[f32]> {
        match self.parts.as_slice() {
            [LinearWeight::F32(w)] => Some(w),
            _ => None,
        }
    }

    /// True when some part is quantized.
    pub fn is_quantized(&self) -> bool {
        self.parts
            .iter()
            .any(|p| matches!(p, LinearWeight::Quant(_)))
    }

    /// The same layer with every part dequantized and merged into one.
    pub fn to_f32(&self) -> Linear {
        let mut w = Vec::with_capacity(self.out_features * self.in_features);
        for p in &self.parts {
            match p {
                LinearWeight::F32(v) => w.extend_from_slice(v),
                LinearWeight::Quant(q) => w.extend_from_slice(&q.to_f32()),
            }
        }
        Linear {
            parts: vec![LinearWeight::F32(w)],
            bias: self.bias.clone(),
            out_features: self.out_features,
            in_features: self.in_features,
            act: self.act,
            invariant: self.invariant,
            isa: self.isa,
        }
    }

    /// Bytes held by the weight parts.
    pub fn nbytes(&self) -> usize {
        self.parts.iter().map(LinearWeight::nbytes).sum()
    }

    /// `out[rows, out_features] (+)= x[rows, in_features] W^T + b`.
    /// With `accumulate`, the product is added to `out` (residual fusion).
    pub fn forward(&self, x: &[f32], rows: usize, out: &mut [f32], accumulate: bool) {
        self.forward_isa(x, rows, out, accumulate, self.isa);
    }

    /// [`Linear::forward`] with the quantized kernels of `isa`.
    pub fn forward_isa(&self, x: &[f32], rows: usize, out: &mut [f32], accumulate: bool, isa: Isa) {
        let (n, k) = (self.out_features, self.in_features);
        let act = self
            .is_quantized()
            .then(|| quant::quantize_acts(x, rows, k, self.act, isa, self.invariant));
        let mut c0 = 0;
        for p in &self.parts {
            let start = c0.min(out.len());
            let dst = &mut out[start..];
            match p {
                LinearWeight::F32(w) => {
                    let pn = w.len() / k.max(1);
                    if self.invariant {
                        matmul_wt_rows(x, rows, w, pn, k, dst, n, accumulate);
                    } else {
                        matmul_wt_ld(x, rows, w, pn, k, dst, n, accumulate);
                    }
                    c0 += pn;
                }
                LinearWeight::Quant(q) => {
                    if let Some(act) = &act {
                        quant::matmul_with(act, q, dst, n, accumulate, isa, self.invariant);
                    }
                    c0 += q.rows;
                }
            }
        }
        if let Some(b) = &self.bias {
            for orow in out.chunks_exact_mut(n) {
                for (o, bv) in orow.iter_mut().zip(b) {
                    *o += bv;
                }
            }
        }
    }
}

/// A raw pointer that may cross the pool's threads; each thread writes a disjoint
/// column stripe (here and in the quantized `quant::matmul`).
#[derive(Clone, Copy)]
pub(crate) struct SendPtr(pub(crate) *mut f32);
// SAFETY: only used to hand disjoint output stripes to worker threads; see
// `matmul_wt` and `quant::matmul`.
unsafe impl Send for SendPtr {}
// SAFETY: as above; the pointer is only read (copied) concurrently.
unsafe impl Sync for SendPtr {}

impl SendPtr {
    /// The pointer (a method, so closures capture the `Send` wrapper whole).
    pub(crate) fn get(self) -> *mut f32 {
        self.0
    }
}

/// `out[m, n] (+)= x[m, k] * w[n, k]^T`, all row-major.
///
/// Panics if a slice is shorter than its shape says (callers size them).
pub fn matmul_wt(
    x: &[f32],
    m: usize,
    w: &[f32],
    n: usize,
    k: usize,
    out: &mut [f32],
    accumulate: bool,
) {
    matmul_wt_ld(x, m, w, n, k, out, n, accumulate);
}

/// Output columns per parallel task of an `[m, k] x [n, k]^T` product:
/// one stripe below `PARALLEL_MIN_WORK` or on one thread, else
/// `TASKS_PER_THREAD` per thread, rounded up to `STRIPE_ALIGN` columns.
fn stripe_width(m: usize, n: usize, k: usize) -> usize {
    let threads = par::threads();
    let stripes = if m * n * k < PARALLEL_MIN_WORK || threads == 1 {
        1
    } else {
        threads * par::TASKS_PER_THREAD
    };
    n.div_ceil(stripes).div_ceil(STRIPE_ALIGN) * STRIPE_ALIGN
}

/// [`matmul_wt`] writing row `r` of the product at `out[r * ldo..]`
/// (`ldo >= n`: the product is a column block of a wider output).
#[allow(clippy::too_many_arguments)]
pub fn matmul_wt_ld(
    x: &[f32],
    m: usize,
    w: &[f32],
    n: usize,
    k: usize,
    out: &mut [f32],
    ldo: usize,
    accumulate: bool,
) {
    if m == 0 || n == 0 {
        return;
    }
    assert!(x.len() >= m * k && w.len() >= n * k && ldo >= n && out.len() >= (m - 1) * ldo + n);
    let per = stripe_width(m, n, k);
    let dst = SendPtr(out.as_mut_ptr());
    let run = |c0: usize| {
        let cols = per.min(n - c0);
        // SAFETY: x is [m, k] (row stride k), w rows c0..c0+cols are inside
        // w (n*k elements, checked above), and the destination stripe covers
        // rows 0..m, columns c0..c0+cols < n <= ldo with row stride ldo, the
        // last element below (m-1)*ldo + n <= out.len() (checked above). Stripes are disjoint across threads, so no two calls write
        // the same element, and `out` is exclusively borrowed for the whole
        // parallel section.
        unsafe {
            gemm(
                m,
                cols,
                k,
                dst.get().add(c0),
                1,
                ldo as isize,
                accumulate,
                x.as_ptr(),
                1,
                k as isize,
                w.as_ptr().add(c0 * k),
                k as isize,
                1,
                1.0,
                1.0,
                false,
                false,
                false,
                Parallelism::None,
            );
        }
    };
    par::for_each(n.div_ceil(per), |s| run(s * per));
}

/// [`matmul_wt_ld`] with every output element computed by the same
/// float operations whatever `m` (batch-invariant rows): per element one
/// chain of 8-lane FMAs over `k` in order (AVX2 + FMA, else the same
/// arithmetic in portable code), a fixed horizontal sum, then the `k % 8`
/// tail in one scalar FMA chain. `gemm` instead picks a matrix-vector path
/// at one row, a small-matrix kernel below 16 x 16 outputs and cache
/// blockings from `m`, so its rows round differently with the batch.
/// Slower than `gemm` on large batches (no packing; 4 x 2 register
/// blocks read straight from the row-major operands).
///
/// Panics if a slice is shorter than its shape says (callers size them).
#[allow(clippy::too_many_arguments)]
pub fn matmul_wt_rows(
    x: &[f32],
    m: usize,
    w: &[f32],
    n: usize,
    k: usize,
    out: &mut [f32],
    ldo: usize,
    accumulate: bool,
) {
    if m == 0 || n == 0 {
        return;
    }
    assert!(x.len() >= m * k && w.len() >= n * k && ldo >= n && out.len() >= (m - 1) * ldo + n);
    let per = stripe_width(m, n, k);
    let dst = SendPtr(out.as_mut_ptr());
    let simd = rows_simd();
    let run = |c0: usize| {
        let c1 = (c0 + per).min(n);
        let mut r0 = 0;
        while r0 < m {
            let mr = ROWS_MR.min(m - r0);
            let mut j = c0;
            while j < c1 {
                let nr = ROWS_NR.min(c1 - j);
                let mut res = [[0f32; ROWS_NR]; ROWS_MR];
                for (r, rr) in res.iter_mut().enumerate().take(mr) {
                    for (c, o) in rr.iter_mut().enumerate().take(nr) {
                        let xr = &x[(r0 + r) * k..(r0 + r + 1) * k];
                        let wr = &w[(j + c) * k..(j + c + 1) * k];
                        if !simd {
                            *o = dot_rows_portable(xr, wr);
                        }
                    }
                }
                #[cfg(target_arch = "x86_64")]
                if simd {
                    // SAFETY: `rows_simd` found AVX2 and FMA; rows r0..r0 +
                    // mr of x and j..j + nr of w hold k values each
                    // (asserted above: r0 + mr <= m, j + nr <= n).
                    unsafe { rows_x86::block(x, w, k, r0, mr, j, nr, &mut res) };
                }
                for (r, rr) in res.iter().enumerate().take(mr) {
                    // SAFETY: row r0 + r < m, columns j..j + nr <= c1 <= n
                    // <= ldo: inside `out` (asserted above); the columns
                    // c0..c1 belong to this stripe only, and `out` is
                    // exclusively borrowed for the call.
                    let o = unsafe {
                        std::slice::from_raw_parts_mut(dst.get().add((r0 + r) * ldo + j), nr)
                    };
                    for (o, v) in o.iter_mut().zip(rr) {
                        *o = if accumulate { *o + v } else { *v };
                    }
                }
                j += nr;
            }
            r0 += mr;
        }
    };
    par::for_each(n.div_ceil(per), |s| run(s * per));
}

/// Rows and columns of [`matmul_wt_rows`]'s register block.
const ROWS_MR: usize = 4;
const ROWS_NR: usize = 2;

/// True when [`matmul_wt_rows`] runs its AVX2 + FMA kernel.
fn rows_simd() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// One element of [`matmul_wt_rows`] in portable code: 8 lanes of fused
/// chains, the AVX2 kernel's horizontal sum, the scalar tail.
fn dot_rows_portable(x: &[f32], w: &[f32]) -> f32 {
    let mut l = [0f32; 8];
    let whole = x.len() / 8 * 8;
    for (xc, wc) in x[..whole].chunks_exact(8).zip(w[..whole].chunks_exact(8)) {
        for i in 0..8 {
            l[i] = xc[i].mul_add(wc[i], l[i]);
        }
    }
    let h = [l[0] + l[4], l[1] + l[5], l[2] + l[6], l[3] + l[7]];
    let mut s = (h[0] + h[2]) + (h[1] + h[3]);
    for (a, b) in x[whole..].iter().zip(&w[whole..]) {
        s = a.mul_add(*b, s);
    }
    s
}

#[cfg(target_arch = "x86_64")]
mod rows_x86 {
    use std::arch::x86_64::*;

    use super::{ROWS_MR, ROWS_NR};

    /// `res[r][c] = dot(x row r0 + r, w row j + c)` for `r < mr`, `c < nr`.
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA; `x` holds rows up to `r0 + mr` and `w` up
    /// to `j + nr`, `k` values each; `mr <= ROWS_MR`, `nr <= ROWS_NR`.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn block(
        x: &[f32],
        w: &[f32],
        k: usize,
        r0: usize,
        mr: usize,
        j: usize,
        nr: usize,
        res: &mut [[f32; ROWS_NR]; ROWS_MR],
    ) {
        // Rows past mr / nr repeat the last valid one (results dropped),
        // so the loop has fixed trip counts.
        let xp: [*const f32; ROWS_MR] =
            std::array::from_fn(|r| x.as_ptr().wrapping_add((r0 + r.min(mr - 1)) * k));
        let wp: [*const f32; ROWS_NR] =
            std::array::from_fn(|c| w.as_ptr().wrapping_add((j + c.min(nr - 1)) * k));
        let mut acc = [[_mm256_setzero_ps(); ROWS_NR]; ROWS_MR];
        let whole = k / 8 * 8;
        for i in (0..whole).step_by(8) {
            // SAFETY: i + 8 <= k inside each row (contract).
            unsafe {
                let wv: [__m256; ROWS_NR] = std::array::from_fn(|c| _mm256_loadu_ps(wp[c].add(i)));
                for (r, ar) in acc.iter_mut().enumerate() {
                    let xv = _mm256_loadu_ps(xp[r].add(i));
                    for (a, wv) in ar.iter_mut().zip(&wv) {
                        *a = _mm256_fmadd_ps(xv, *wv, *a);
                    }
                }
            }
        }
        for r in 0..mr {
            for c in 0..nr {
                let mut l = [0f32; 8];
                // SAFETY: 8 f32 into an [f32; 8].
                unsafe { _mm256_storeu_ps(l.as_mut_ptr(), acc[r][c]) };
                let h = [l[0] + l[4], l[1] + l[5], l[2] + l[6], l[3] + l[7]];
                let mut s = (h[0] + h[2]) + (h[1] + h[3]);
                for i in whole..k {
                    // SAFETY: i < k inside both rows (contract).
                    s = unsafe { (*xp[r].add(i)).mul_add(*wp[c].add(i), s) };
                }
                res[r][c] = s;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    fn naive(x: &[f32], m: usize, w: &[f32], n: usize, k: usize) -> Vec<f32> {
        let mut out = vec![0.0f32; m * n];
        for i in 0..m {
            for j in 0..n {
                let mut s = 0.0f64;
                for t in 0..k {
                    s += x[i * k + t] as f64 * w[j * k + t] as f64;
                }
                out[i * n + j] = s as f32;
            }
        }
        out
    }

    #[test]
    fn matmul_matches_naive_for_many_shapes_and_accumulates() {
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        for &(m, n, k) in &[
            (1, 1, 1),
            (1, 576, 576),
            (3, 100, 64),
            (32, 1536, 576),
            (17, 49, 33),
            (128, 200, 96),
        ] {
            let x: Vec<f32> = (0..m * k).map(|_| rng.gen_range(-1.0..1.0)).collect();
            let w: Vec<f32> = (0..n * k).map(|_| rng.gen_range(-1.0..1.0)).collect();
            let want = naive(&x, m, &w, n, k);
            let mut out = vec![f32::NAN; m * n];
            matmul_wt(&x, m, &w, n, k, &mut out, false);
            for (a, b) in out.iter().zip(&want) {
                assert!((a - b).abs() < 1e-3, "{m}x{n}x{k}: {a} vs {b}");
            }
            let mut acc = vec![1.5f32; m * n];
            matmul_wt(&x, m, &w, n, k, &mut acc, true);
            for (a, b) in acc.iter().zip(&want) {
                assert!((a - (b + 1.5)).abs() < 1e-3, "accumulate {m}x{n}x{k}");
            }
        }
    }

    /// The invariant f32 product: close to the exact one, and each row the
    /// same bits whatever the number of rows (`gemm` is not: its one-row
    /// path and its blockings round differently).
    #[test]
    fn invariant_f32_rows_do_not_depend_on_the_batch() {
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        for &(n, k) in &[(37, 61), (64, 576), (130, 200)] {
            let m_max = 33;
            let x: Vec<f32> = (0..m_max * k).map(|_| rng.gen_range(-1.0..1.0)).collect();
            let w: Vec<f32> = (0..n * k).map(|_| rng.gen_range(-1.0..1.0)).collect();
            let alone: Vec<Vec<f32>> = (0..m_max)
                .map(|r| {
                    let mut o = vec![f32::NAN; n];
                    matmul_wt_rows(&x[r * k..(r + 1) * k], 1, &w, n, k, &mut o, n, false);
                    o
                })
                .collect();
            let want = naive(&x, m_max, &w, n, k);
            for (r, row) in alone.iter().enumerate() {
                for (c, v) in row.iter().enumerate() {
                    assert!((v - want[r * n + c]).abs() < 1e-3, "{n}x{k} [{r}, {c}]");
                }
            }
            for m in (1..=9).chain([m_max]) {
                let r0 = (m * 5) % (m_max - m + 1);
                let mut out = vec![1.0f32; m * n];
                matmul_wt_rows(&x[r0 * k..(r0 + m) * k], m, &w, n, k, &mut out, n, true);
                for r in 0..m {
                    let want: Vec<u32> =
                        alone[r0 + r].iter().map(|v| (v + 1.0).to_bits()).collect();
                    let got: Vec<u32> = out[r * n..(r + 1) * n]
                        .iter()
                        .map(|v| v.to_bits())
                        .collect();
                    assert_eq!(got, want, "{n}x{k}: row {} of {m}", r0 + r);
                }
            }
        }
    }

    #[test]
    fn linear_adds_bias() {
        let mut lin = Linear::dense(vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0], 2, 3);
        lin.bias = Some(vec![10.0, 20.0]);
        let mut out = vec![0.0; 2];
        lin.forward(&[1.0, 1.0, 1.0], 1, &mut out, false);
        assert_eq!(out, vec![16.0, 35.0]);
    }

    #[test]
    fn stacked_parts_of_mixed_types_match_the_dequantized_product() {
        use model_loader::quant::quantize;
        use model_loader::QuantType;
        let mut rng = ChaCha8Rng::seed_from_u64(9);
        let (m, k) = (5, 256);
        let mut parts = Vec::new();
        for (ty, rows) in [
            (QuantType::Q4K, 6),
            (QuantType::Q4K, 2),
            (QuantType::Q6K, 3),
        ] {
            let w: Vec<f32> = (0..rows * k).map(|_| rng.gen_range(-1.0..1.0)).collect();
            parts.push(LinearWeight::Quant(QMatrix {
                ty,
                rows,
                cols: k,
                bytes: quantize(ty, &w).unwrap(),
            }));
        }
        parts.push(LinearWeight::F32(
            (0..4 * k).map(|_| rng.gen_range(-1.0..1.0)).collect(),
        ));
        let lin = Linear::stacked(parts, k, Some((0..15).map(|i| i as f32).collect()));
        assert_eq!(lin.out_features, 15);
        assert_eq!(lin.parts.len(), 3, "the two Q4_K parts merge");
        let dense = lin.to_f32();
        let x: Vec<f32> = (0..m * k).map(|_| rng.gen_range(-1.0..1.0)).collect();
        let (mut got, mut want) = (vec![0f32; m * 15], vec![0f32; m * 15]);
        lin.forward(&x, m, &mut got, false);
        dense.forward(&x, m, &mut want, false);
        for (g, w) in got.iter().zip(&want) {
            // 8-bit activations: error well under 1% of sqrt(k) * |w| * |x|.
            assert!((g - w).abs() < 0.1, "{g} vs {w}");
        }
    }
}
