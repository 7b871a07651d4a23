//! Shared test helpers: seeded randomness (fresh seed per run, `GK_SEED` to replay),
//! poisoned outputs, tolerance checks in the vLLM style.
#![allow(dead_code)]

pub mod paged;

use gpu_kernels::Storage;
use half::{bf16, f16};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// A seeded RNG; the seed is printed and repeated in every failure message.
pub struct TestRng {
    pub seed: u64,
    pub rng: StdRng,
}

impl TestRng {
    pub fn new(test: &str) -> Self {
        let seed = std::env::var("GK_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap_or_default();
                now.as_nanos() as u64 ^ (std::process::id() as u64) << 32
            });
        eprintln!("{test}: seed {seed} (replay with GK_SEED={seed})");
        Self {
            seed,
            rng: StdRng::seed_from_u64(seed),
        }
    }

    pub fn vec<T: Storage>(&mut self, n: usize, lo: f32, hi: f32) -> Vec<T> {
        (0..n)
            .map(|_| T::from_f32(self.rng.gen_range(lo..hi)))
            .collect()
    }

    pub fn shuffled(&mut self, n: usize) -> Vec<u32> {
        let mut v: Vec<u32> = (0..n as u32).collect();
        for i in (1..n).rev() {
            let j = self.rng.gen_range(0..=i);
            v.swap(i, j);
        }
        v
    }

    pub fn range(&mut self, lo: usize, hi_incl: usize) -> usize {
        self.rng.gen_range(lo..=hi_incl)
    }
}

/// Output buffer filled with NaN so unwritten elements fail the comparison.
pub fn poisoned<T: Storage>(n: usize) -> Vec<T> {
    vec![T::from_f32(f32::NAN); n]
}

pub fn to_f64<T: Storage>(v: &[T]) -> Vec<f64> {
    v.iter().map(|x| x.to_f32() as f64).collect()
}

/// (atol, rtol) as vLLM's kernel tests: f32 1e-5; f16 1e-3; bf16 1e-3 with rtol 1.6e-2.
pub fn tol<T: Storage>() -> (f64, f64) {
    match T::NAME {
        "f32" => (1e-5, 1.3e-6),
        "f16" => (1e-3, 1e-3),
        _ => (1e-3, 1.6e-2),
    }
}

/// Asserts `|got - want| <= atol + rtol * |want|` element-wise (NaN fails).
pub fn assert_close<T: Storage>(what: &str, seed: u64, got: &[T], want: &[f64]) {
    assert_eq!(got.len(), want.len(), "{what}: length (seed {seed})");
    let (atol, rtol) = tol::<T>();
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let g = g.to_f32() as f64;
        let ok = (g - w).abs() <= atol + rtol * w.abs();
        assert!(
            ok,
            "{what} [{}]: element {i}: got {g}, want {w} (atol {atol}, rtol {rtol}; seed {seed})",
            T::NAME
        );
    }
}

/// Exact equality of storage bits.
pub fn assert_bits_eq<T: Storage>(what: &str, seed: u64, got: &[T], want: &[T]) {
    assert_eq!(got.len(), want.len(), "{what}: length (seed {seed})");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let (g, w) = (g.to_f32(), w.to_f32());
        assert!(
            g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()),
            "{what}: element {i}: got {g}, want {w} (seed {seed})"
        );
    }
}

/// Rounds an f64 reference through the storage type, as a kernel storing `T` does.
pub fn round<T: Storage>(x: f64) -> f64 {
    T::from_f32(x as f32).to_f32() as f64
}

pub type F16 = f16;
pub type BF16 = bf16;

/// Emulated block size used by the tests (two warps, so cross-warp reductions run).
pub const THREADS: u32 = 64;
