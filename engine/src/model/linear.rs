//! Linear layers `y = x W^T (+ b)` on the `gemm` crate.
//!
//! Weights are row-major `[out, in]` as loaded; the GEMM reads them
//! transposed through strides (no copy per call). Work is spread over the
//! rayon pool by splitting the output columns into one contiguous stripe per
//! thread, each stripe a single-threaded `gemm` call: `gemm` runs its
//! matrix-vector path (used when there is one row, i.e. decode at batch 1)
//! on one thread only, and the stripes keep both cores busy at every batch
//! size. Cost: O(rows x out x in) flops, no allocation beyond gemm's packing.

use gemm::{gemm, Parallelism};
use rayon::prelude::*;

/// Output columns per stripe are rounded to this (a multiple of the kernels' NR).
const STRIPE_ALIGN: usize = 32;

/// Below this many multiply-adds a single call is cheaper than a fork.
const PARALLEL_MIN_WORK: usize = 1 << 16;

/// A dense layer with an optional bias.
#[derive(Debug, Clone)]
pub struct Linear {
    /// `[out, in]`, row-major.
    pub weight: Vec<f32>,
    pub bias: Option<Vec<f32>>,
    pub out_features: usize,
    pub in_features: usize,
}

impl Linear {
    /// `out[rows, out_features] (+)= x[rows, in_features] W^T + b`.
    /// With `accumulate`, the product is added to `out` (residual fusion).
    pub fn forward(&self, x: &[f32], rows: usize, out: &mut [f32], accumulate: bool) {
        matmul_wt(
            x,
            rows,
            &self.weight,
            self.out_features,
            self.in_features,
            out,
            accumulate,
        );
        if let Some(b) = &self.bias {
            for orow in out.chunks_exact_mut(self.out_features) {
                for (o, bv) in orow.iter_mut().zip(b) {
                    *o += bv;
                }
            }
        }
    }
}

/// A raw pointer that may cross rayon threads; each thread writes a disjoint
/// column stripe.
#[derive(Clone, Copy)]
struct SendPtr(*mut f32);
// SAFETY: only used to hand disjoint output stripes to worker threads; see
// `matmul_wt`.
unsafe impl Send for SendPtr {}
// SAFETY: as above; the pointer is only read (copied) concurrently.
unsafe impl Sync for SendPtr {}

impl SendPtr {
    /// The pointer (a method, so closures capture the `Send` wrapper whole).
    fn get(self) -> *mut f32 {
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
    assert!(x.len() >= m * k && w.len() >= n * k && out.len() >= m * n);
    if m == 0 || n == 0 {
        return;
    }
    let threads = rayon::current_num_threads().max(1);
    let work = m * n * k;
    let stripes = if work < PARALLEL_MIN_WORK || threads == 1 {
        1
    } else {
        threads
    };
    let per = n.div_ceil(stripes).div_ceil(STRIPE_ALIGN) * STRIPE_ALIGN;
    let dst = SendPtr(out.as_mut_ptr());
    let run = |c0: usize| {
        let cols = per.min(n - c0);
        // SAFETY: x is [m, k] (row stride k), w rows c0..c0+cols are inside
        // w (n*k elements, checked above), and the destination stripe covers
        // rows 0..m, columns c0..c0+cols of out (m*n elements, checked
        // above). Stripes are disjoint across threads, so no two calls write
        // the same element, and `out` is exclusively borrowed for the whole
        // parallel section.
        unsafe {
            gemm(
                m,
                cols,
                k,
                dst.get().add(c0),
                1,
                n as isize,
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
    if stripes == 1 {
        run(0);
    } else {
        (0..n)
            .step_by(per)
            .collect::<Vec<_>>()
            .into_par_iter()
            .for_each(run);
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

    #[test]
    fn linear_adds_bias() {
        let lin = Linear {
            weight: vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0],
            bias: Some(vec![10.0, 20.0]),
            out_features: 2,
            in_features: 3,
        };
        let mut out = vec![0.0; 2];
        lin.forward(&[1.0, 1.0, 1.0], 1, &mut out, false);
        assert_eq!(out, vec![16.0, 35.0]);
    }
}
