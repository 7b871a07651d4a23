//! The two inner loops of CPU attention for one query row: the scores of
//! a list of keys and the probability-weighted sum of their values, keys
//! and values addressed by pool offsets (the paged layout), in the pool's
//! element type ([`KvElem`]: f32, or f16 widened to f32 as it is loaded,
//! eight values per `vcvtph2ps`).
//!
//! With AVX2 + FMA + F16C (the workspace's `x86-64-v3` baseline) the scores run
//! four keys at a time (one load of each query vector feeds four FMA
//! chains, and the four sums are reduced together by three `vhaddps`
//! instead of one horizontal sum per key), and the weighted sum keeps up to
//! 64 output values in registers across all keys (per key: one broadcast,
//! then one FMA per 8 values; no load or store of the output). The
//! portable forms are the reference and the fallback.
//!
//! Invariants: every address plus the head size lies inside the pool
//! slice (asserted once per call). The weighted sum adds the keys in order
//! with one FMA per value, so its bits equal the portable form's; the
//! scores sum each key's products in a different order (rounding only).
//! Cost: O(n hd) per call, no allocation.

#[cfg(all(
    target_arch = "x86_64",
    target_feature = "avx2",
    target_feature = "fma",
    target_feature = "f16c"
))]
use std::arch::x86_64::*;

use super::kv_cache::KvElem;

/// `out[i] = scale * (q . pool[addrs[i]..][..q.len()])`.
///
/// Panics if `out` is shorter than `addrs` or an address runs past `pool`.
pub fn scores<E: KvElem>(q: &[f32], pool: &[E], addrs: &[usize], scale: f32, out: &mut [f32]) {
    let hd = q.len();
    assert!(
        out.len() >= addrs.len() && addrs.iter().all(|&a| a + hd <= pool.len()),
        "scores: shapes"
    );
    let mut done = 0;
    #[cfg(all(
        target_arch = "x86_64",
        target_feature = "avx2",
        target_feature = "fma",
        target_feature = "f16c"
    ))]
    if hd.is_multiple_of(8) {
        // SAFETY: AVX2, FMA and F16C are enabled at compile time (the cfg); every
        // address is checked against the pool above and `out` is long
        // enough.
        done = unsafe { scores4(q, pool, addrs, scale, out) };
    }
    for (o, &a) in out[done..].iter_mut().zip(&addrs[done..]) {
        *o = E::dot(q, &pool[a..a + hd]) * scale;
    }
}

/// `o = sum_i p[i] * pool[addrs[i]..][..o.len()]`, keys in order.
///
/// Panics if `p` is shorter than `addrs` or an address runs past `pool`.
pub fn weighted_sum<E: KvElem>(p: &[f32], pool: &[E], addrs: &[usize], o: &mut [f32]) {
    let hd = o.len();
    assert!(
        p.len() >= addrs.len() && addrs.iter().all(|&a| a + hd <= pool.len()),
        "weighted_sum: shapes"
    );
    #[cfg(all(
        target_arch = "x86_64",
        target_feature = "avx2",
        target_feature = "fma",
        target_feature = "f16c"
    ))]
    if hd.is_multiple_of(8) {
        for c0 in (0..hd).step_by(64) {
            // SAFETY: AVX2, FMA and F16C are enabled at compile time; the chunk
            // c0..c0 + 8 n lies inside `o` and inside each checked key.
            unsafe {
                match (hd - c0).min(64) / 8 {
                    8 => sum_chunk::<E, 8>(p, pool, addrs, c0, o),
                    7 => sum_chunk::<E, 7>(p, pool, addrs, c0, o),
                    6 => sum_chunk::<E, 6>(p, pool, addrs, c0, o),
                    5 => sum_chunk::<E, 5>(p, pool, addrs, c0, o),
                    4 => sum_chunk::<E, 4>(p, pool, addrs, c0, o),
                    3 => sum_chunk::<E, 3>(p, pool, addrs, c0, o),
                    2 => sum_chunk::<E, 2>(p, pool, addrs, c0, o),
                    _ => sum_chunk::<E, 1>(p, pool, addrs, c0, o),
                }
            }
        }
        return;
    }
    weighted_sum_portable(p, pool, addrs, o);
}

/// The portable [`weighted_sum`] (one FMA per value, keys in order).
pub fn weighted_sum_portable<E: KvElem>(p: &[f32], pool: &[E], addrs: &[usize], o: &mut [f32]) {
    let hd = o.len();
    o.fill(0.0);
    for (&pj, &a) in p.iter().zip(addrs) {
        for (ov, v) in o.iter_mut().zip(&pool[a..a + hd]) {
            *ov = v.to_f32().mul_add(pj, *ov);
        }
    }
}

/// The scores of the first `4 * (addrs.len() / 4)` keys; returns that
/// count.
///
/// # Safety
/// AVX2, FMA and F16C; `q.len()` a multiple of 8; every `addrs[i] + q.len() <=
/// pool.len()`; `out.len() >= addrs.len()`.
#[cfg(all(
    target_arch = "x86_64",
    target_feature = "avx2",
    target_feature = "fma",
    target_feature = "f16c"
))]
#[target_feature(enable = "avx2,fma")]
unsafe fn scores4<E: KvElem>(
    q: &[f32],
    pool: &[E],
    addrs: &[usize],
    scale: f32,
    out: &mut [f32],
) -> usize {
    let (qp, pp, hd) = (q.as_ptr(), pool.as_ptr(), q.len());
    let sc = _mm_set1_ps(scale);
    let whole = addrs.len() / 4 * 4;
    for (i, a4) in addrs[..whole].chunks_exact(4).enumerate() {
        // SAFETY: the caller's contract: each key's hd values lie in the
        // pool, d + 8 <= hd, and 4 i + 4 <= whole <= out.len().
        unsafe {
            let k: [*const E; 4] = std::array::from_fn(|j| pp.add(a4[j]));
            let mut acc = [_mm256_setzero_ps(); 4];
            for d in (0..hd).step_by(8) {
                let qd = _mm256_loadu_ps(qp.add(d));
                for j in 0..4 {
                    acc[j] = _mm256_fmadd_ps(qd, E::load8(k[j].add(d)), acc[j]);
                }
            }
            // [a0 a1 a2 a3] per 128-bit half, then the halves added.
            let h = _mm256_hadd_ps(
                _mm256_hadd_ps(acc[0], acc[1]),
                _mm256_hadd_ps(acc[2], acc[3]),
            );
            let s = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps::<1>(h));
            _mm_storeu_ps(out.as_mut_ptr().add(4 * i), _mm_mul_ps(s, sc));
        }
    }
    whole
}

/// Values `c0..c0 + 8 N` of [`weighted_sum`], held in `N` registers.
///
/// # Safety
/// AVX2, FMA and F16C; `c0 + 8 N <= o.len()`; every `addrs[i] + o.len() <=
/// pool.len()`; `p.len() >= addrs.len()`.
#[cfg(all(
    target_arch = "x86_64",
    target_feature = "avx2",
    target_feature = "fma",
    target_feature = "f16c"
))]
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn sum_chunk<E: KvElem, const N: usize>(
    p: &[f32],
    pool: &[E],
    addrs: &[usize],
    c0: usize,
    o: &mut [f32],
) {
    let mut acc = [_mm256_setzero_ps(); N];
    for (&pj, &a) in p.iter().zip(addrs) {
        // SAFETY: the caller's contract: a + c0 + 8 N <= a + hd <= pool.len().
        unsafe {
            let w = _mm256_set1_ps(pj);
            let v = pool.as_ptr().add(a + c0);
            for (i, r) in acc.iter_mut().enumerate() {
                *r = _mm256_fmadd_ps(E::load8(v.add(8 * i)), w, *r);
            }
        }
    }
    for (i, r) in acc.iter().enumerate() {
        // SAFETY: c0 + 8 i + 8 <= c0 + 8 N <= o.len().
        unsafe { _mm256_storeu_ps(o.as_mut_ptr().add(c0 + 8 * i), *r) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::f16;

    fn pool_and_addrs(hd: usize, n: usize) -> (Vec<f32>, Vec<usize>) {
        let te = 3 * hd + 8;
        let pool: Vec<f32> = (0..te * (n + 2))
            .map(|i| ((i * 7919 % 1000) as f32 - 500.0) / 250.0)
            .collect();
        // Out of order, as a block table makes them.
        let addrs = (0..n).map(|j| ((j * 5) % (n + 1)) * te + hd).collect();
        (pool, addrs)
    }

    fn check_scores<E: KvElem>(to_pool: impl Fn(f32) -> E) {
        for (hd, n) in [(64, 9), (8, 4), (24, 7), (256, 13), (12, 5), (64, 0)] {
            let (pool, addrs) = pool_and_addrs(hd, n);
            let pool: Vec<E> = pool.into_iter().map(&to_pool).collect();
            let q: Vec<f32> = (0..hd).map(|i| (i as f32 * 0.37).sin()).collect();
            let mut got = vec![f32::NAN; n];
            scores(&q, &pool, &addrs, 0.125, &mut got);
            for (i, &a) in addrs.iter().enumerate() {
                let want: f64 = q
                    .iter()
                    .zip(&pool[a..a + hd])
                    .map(|(x, y)| f64::from(*x) * f64::from(y.to_f32()))
                    .sum::<f64>()
                    * 0.125;
                assert!(
                    (f64::from(got[i]) - want).abs() <= 1e-5 * (1.0 + want.abs()),
                    "hd {hd} key {i}: {} vs {want}",
                    got[i]
                );
            }
        }
    }

    fn check_weighted_sum<E: KvElem>(to_pool: impl Fn(f32) -> E) {
        for (hd, n) in [(64, 9), (8, 1), (24, 7), (256, 13), (12, 5), (72, 3)] {
            let (pool, addrs) = pool_and_addrs(hd, n);
            let pool: Vec<E> = pool.into_iter().map(&to_pool).collect();
            let p: Vec<f32> = (0..n).map(|j| 1.0 / (j as f32 + 2.0)).collect();
            let (mut fast, mut slow) = (vec![f32::NAN; hd], vec![f32::NAN; hd]);
            weighted_sum(&p, &pool, &addrs, &mut fast);
            weighted_sum_portable(&p, &pool, &addrs, &mut slow);
            assert_eq!(fast, slow, "hd {hd}");
        }
    }

    #[test]
    fn scores_match_per_key_dot_products() {
        check_scores(|x| x);
        check_scores(f16::from_f32);
    }

    #[test]
    fn weighted_sum_equals_the_portable_form_bit_for_bit() {
        check_weighted_sum(|x| x);
        check_weighted_sum(f16::from_f32);
    }
}
