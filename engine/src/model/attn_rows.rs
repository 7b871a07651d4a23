//! The two inner loops of CPU attention for one query row and a group of
//! query heads that share one KV head (GQA): the scores of a list of keys
//! and the probability-weighted sums of their values, keys and values
//! addressed by pool offsets (the paged layout), in the pool's element type
//! ([`KvElem`]: f32, or f16 widened to f32 as it is loaded, eight values
//! per `vcvtph2ps`).
//!
//! Why groups: each key and value is loaded (and, for f16, converted) once
//! for all the heads that read it instead of once per head, so the
//! conversions and loads per multiply-add shrink by the group size (3 for
//! SmolLM2's 9 heads over 3 KV heads).
//!
//! With AVX2 + FMA + F16C (the workspace's `x86-64-v3` baseline) the scores
//! run two keys at a time for up to [`MAX_HEADS`] heads (each loaded key
//! vector feeds one FMA chain per head; the head sums are reduced four at
//! a time by three `vhaddps`), and the weighted sums keep up to 72 output
//! values in registers across all keys (per key and head one broadcast,
//! then one FMA per 8 values; no load or store of the output). The
//! portable forms are the reference and the fallback.
//!
//! Shapes: `H` heads of `hd` values; queries and outputs are `[H, hd]`
//! (consecutive heads of a token row are contiguous), scores and
//! probabilities `[H, n]` for `n` keys.
//!
//! Invariants: every address plus `hd` lies inside the pool slice
//! (asserted once per call). The weighted sums add the keys in order with
//! one FMA per value, so their bits equal the portable form's; the scores
//! sum each key's products in a different order (rounding only).
//! Cost: O(H n hd) per call, no allocation.

use super::kv_cache::KvElem;

/// Most heads one call of the vector kernels serves (callers split larger
/// groups).
pub const MAX_HEADS: usize = 4;

/// `out[h * n + i] = scale * (q[h] . pool[addrs[i]..][..hd])` for the
/// `H = q.len() / hd` heads of `q` (`[H, hd]`), `n = addrs.len()`.
///
/// Panics unless `1 <= H <= MAX_HEADS`, `q.len() == H hd`, `out` holds
/// `H n` values and every address plus `hd` lies in `pool`.
///
/// `wide` lets the 512-bit loops run where the CPU has them ([`zmm`]: the
/// same bits, fewer instructions); false keeps the AVX2 ones (to measure
/// the AVX2 path on an AVX-512 machine).
pub fn scores<E: KvElem>(
    q: &[f32],
    hd: usize,
    pool: &[E],
    addrs: &[usize],
    scale: f32,
    out: &mut [f32],
    wide: bool,
) {
    let (heads, n) = check(q.len(), hd, pool.len(), addrs, out.len());
    let _ = (heads, wide); // used only where the x86 kernels are compiled in
    #[allow(unused_mut)] // likewise assigned only there
    let mut done = 0;
    #[cfg(all(
        target_arch = "x86_64",
        target_feature = "avx2",
        target_feature = "fma",
        target_feature = "f16c"
    ))]
    if hd.is_multiple_of(8) {
        if wide && zmm::available() {
            // SAFETY: AVX-512 F/DQ checked at run time, the rest enabled at
            // compile time; the shapes and every address are checked above.
            done = unsafe {
                match heads {
                    1 => zmm::scores4::<E, 1>(q, hd, pool, addrs, scale, out),
                    2 => zmm::scores4::<E, 2>(q, hd, pool, addrs, scale, out),
                    3 => zmm::scores4::<E, 3>(q, hd, pool, addrs, scale, out),
                    _ => zmm::scores4::<E, 4>(q, hd, pool, addrs, scale, out),
                }
            };
        }
        // SAFETY: AVX2, FMA and F16C are enabled at compile time (the
        // cfg); the shapes and every address are checked above.
        done = unsafe {
            match heads {
                1 => x86::scores2::<E, 1>(q, hd, pool, addrs, done, scale, out),
                2 => x86::scores2::<E, 2>(q, hd, pool, addrs, done, scale, out),
                3 => x86::scores2::<E, 3>(q, hd, pool, addrs, done, scale, out),
                _ => x86::scores2::<E, 4>(q, hd, pool, addrs, done, scale, out),
            }
        };
    }
    for (h, qh) in q.chunks_exact(hd).enumerate() {
        for i in done..n {
            let a = addrs[i];
            out[h * n + i] = E::dot(qh, &pool[a..a + hd]) * scale;
        }
    }
}

/// Asks for the cache lines of the first keys (or values) at `addrs`, as
/// many as the loops prefetch ahead: called for the values before the
/// work that precedes [`weighted_sum`] (the softmax), so that its first
/// keys do not start cold. A hint: no effect on results; nothing where the
/// vector loops are not compiled in.
pub fn prefetch_first<E: KvElem>(pool: &[E], addrs: &[usize], hd: usize) {
    #[cfg(all(
        target_arch = "x86_64",
        target_feature = "avx2",
        target_feature = "fma",
        target_feature = "f16c"
    ))]
    for &a in &addrs[..addrs.len().min(x86::AHEAD)] {
        x86::prefetch_key(pool.as_ptr().wrapping_add(a), hd);
    }
    #[cfg(not(all(
        target_arch = "x86_64",
        target_feature = "avx2",
        target_feature = "fma",
        target_feature = "f16c"
    )))]
    let _ = (pool, addrs, hd);
}

/// `o[h] = sum_i p[h * n + i] * pool[addrs[i]..][..hd]`, keys in order, for
/// the `H = o.len() / hd` heads of `o` (`[H, hd]`), `n = addrs.len()`.
///
/// Panics unless `1 <= H <= MAX_HEADS`, `o.len() == H hd`, `p` holds
/// `H n` values and every address plus `hd` lies in `pool`.
///
/// `wide`: as in [`scores`] (the bits are the same either way).
pub fn weighted_sum<E: KvElem>(
    p: &[f32],
    pool: &[E],
    addrs: &[usize],
    hd: usize,
    o: &mut [f32],
    wide: bool,
) {
    let (heads, _) = check(o.len(), hd, pool.len(), addrs, p.len());
    let _ = (heads, wide); // used only where the x86 kernels are compiled in
    #[cfg(all(
        target_arch = "x86_64",
        target_feature = "avx2",
        target_feature = "fma",
        target_feature = "f16c"
    ))]
    if hd.is_multiple_of(8) {
        if wide && zmm::available() {
            // SAFETY: AVX-512 F/DQ checked at run time, the rest enabled at
            // compile time; the shapes and every address are checked above.
            unsafe {
                match heads {
                    1 => zmm::sum_heads::<E, 1>(p, pool, addrs, hd, o),
                    2 => zmm::sum_heads::<E, 2>(p, pool, addrs, hd, o),
                    3 => zmm::sum_heads::<E, 3>(p, pool, addrs, hd, o),
                    _ => zmm::sum_heads::<E, 4>(p, pool, addrs, hd, o),
                }
            }
            return;
        }
        // SAFETY: AVX2, FMA and F16C are enabled at compile time; the
        // shapes and every address are checked above.
        unsafe {
            match heads {
                1 => x86::sum_heads::<E, 1, 8>(p, pool, addrs, hd, o),
                2 => x86::sum_heads::<E, 2, 4>(p, pool, addrs, hd, o),
                3 => x86::sum_heads::<E, 3, 3>(p, pool, addrs, hd, o),
                _ => x86::sum_heads::<E, 4, 2>(p, pool, addrs, hd, o),
            }
        }
        return;
    }
    weighted_sum_portable(p, pool, addrs, hd, o);
}

/// The portable [`weighted_sum`] (one FMA per value, keys in order).
pub fn weighted_sum_portable<E: KvElem>(
    p: &[f32],
    pool: &[E],
    addrs: &[usize],
    hd: usize,
    o: &mut [f32],
) {
    let n = addrs.len();
    o.fill(0.0);
    for (h, oh) in o.chunks_exact_mut(hd).enumerate() {
        for (&pj, &a) in p[h * n..(h + 1) * n].iter().zip(addrs) {
            for (ov, v) in oh.iter_mut().zip(&pool[a..a + hd]) {
                *ov = v.to_f32().mul_add(pj, *ov);
            }
        }
    }
}

/// Checks the shapes shared by both loops; returns (heads, keys).
fn check(
    per_head_len: usize,
    hd: usize,
    pool_len: usize,
    addrs: &[usize],
    per_key_len: usize,
) -> (usize, usize) {
    let heads = per_head_len / hd.max(1);
    let n = addrs.len();
    assert!(
        hd > 0
            && (1..=MAX_HEADS).contains(&heads)
            && heads * hd == per_head_len
            && per_key_len == heads * n
            && addrs.iter().all(|&a| a + hd <= pool_len),
        "attention rows: shapes"
    );
    (heads, n)
}

#[cfg(all(
    target_arch = "x86_64",
    target_feature = "avx2",
    target_feature = "fma",
    target_feature = "f16c"
))]
mod zmm;

#[cfg(all(
    target_arch = "x86_64",
    target_feature = "avx2",
    target_feature = "fma",
    target_feature = "f16c"
))]
// The register blocks index accumulators [key][head] and [head][chunk]
// by constant-trip loops (unrolled into registers).
#[allow(clippy::needless_range_loop)]
mod x86 {
    use std::arch::x86_64::*;

    use super::KvElem;

    /// Keys ahead of the one in use whose cache lines the loops ask for:
    /// the pool is paged, so the hardware prefetcher cannot follow a
    /// sequence's keys from block to block, and at batch 32 these loops
    /// wait on memory (f16 keys and values stream at ~15 GB/s, f32 ones
    /// at ~23). Measured, batch-32 decode of SmolLM2 Q4_K_M on 2 cores:
    /// on a Zen 5-class VM 8 keys ahead gained 0-5% of a step (the AVX2
    /// loops then measured neutral); on an Emerald Rapids VM 24 beat 8
    /// (512-bit: fastest forward 50.4-54.3 -> 49.0-50.1 ms over 5
    /// alternated pairs; AVX2: 65.4-66.9 -> 63.0-63.8 ms over 3, the
    /// loops' share of the profile 14.8-15.0% -> 13.6-14.0%).
    pub(super) const AHEAD: usize = 24;

    /// Asks for the cache lines of `len` values at `p` (a hint that never
    /// faults): the first, every 64 bytes on, and the last byte's (for a
    /// `p` that is not line-aligned). Written without an iterator chain:
    /// `step_by(..).chain(..)` compiled to a branchy state machine per
    /// key that took ~40% of the weighted sums' samples.
    #[inline(always)]
    pub(super) fn prefetch_key<E>(p: *const E, len: usize) {
        let bytes = len * std::mem::size_of::<E>();
        let s = p.cast::<i8>();
        // Every `_mm_prefetch` here: a hint that never faults, whatever
        // the address; `wrapping_add` keeps the arithmetic defined.
        // SAFETY: as just said.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(s) };
        let mut off = 64;
        while off < bytes {
            // SAFETY: as above.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(s.wrapping_add(off)) };
            off += 64;
        }
        // SAFETY: as above.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(s.wrapping_add(bytes.saturating_sub(1))) };
    }

    /// Eight pool values at `p` as f32 (f16 widened by one `vcvtph2ps`).
    ///
    /// # Safety
    /// `p` is valid for reading eight elements; AVX2 and F16C (enabled at
    /// compile time: the module's cfg).
    #[inline(always)]
    pub(super) unsafe fn load8<E: KvElem>(p: *const E) -> __m256 {
        // SAFETY: the caller's contract; `E` is f16 or f32 (sealed), so
        // the eight elements are 16 or 32 readable bytes.
        unsafe {
            if E::IS_F16 {
                _mm256_cvtph_ps(_mm_loadu_si128(p.cast()))
            } else {
                _mm256_loadu_ps(p.cast())
            }
        }
    }

    /// `[a b c d]`: the horizontal sums of four vectors.
    ///
    /// # Safety
    /// AVX (enabled at compile time: the module's cfg).
    #[inline(always)]
    pub(super) unsafe fn hsum4(v: [__m256; 4]) -> __m128 {
        // SAFETY: register-only AVX operations; AVX is enabled (the cfg).
        unsafe {
            // [a0 a1 a2 a3] per 128-bit half, then the halves added.
            let h = _mm256_hadd_ps(_mm256_hadd_ps(v[0], v[1]), _mm256_hadd_ps(v[2], v[3]));
            _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps::<1>(h))
        }
    }

    /// The scores of `H` heads for keys `from..` two at a time, then an odd
    /// last key alone; returns the end of the keys done (all of them).
    /// A key's sums are the same bits whichever way it runs: each of its
    /// per-head FMA chains is reduced by [`hsum4`], whose result for one
    /// vector does not depend on the other three.
    ///
    /// # Safety
    /// AVX2, FMA and F16C; `hd` a multiple of 8; `q.len() == H hd`;
    /// `out.len() == H n`; every `addrs[i] + hd <= pool.len()`.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn scores2<E: KvElem, const H: usize>(
        q: &[f32],
        hd: usize,
        pool: &[E],
        addrs: &[usize],
        from: usize,
        scale: f32,
        out: &mut [f32],
    ) -> usize {
        let (qp, pp, n) = (q.as_ptr(), pool.as_ptr(), addrs.len());
        let whole = from + n.saturating_sub(from) / 2 * 2;
        let zero = _mm256_setzero_ps();
        for i in (from..whole).step_by(2) {
            // SAFETY: the caller's contract: keys i and i + 1 hold hd values
            // in the pool, q holds H rows of hd, d + 8 <= hd, and h n + i + 1
            // < H n = out.len().
            unsafe {
                let k = [pp.add(addrs[i]), pp.add(addrs[i + 1])];
                for &a in addrs.get(i + AHEAD..(i + AHEAD + 2).min(n)).unwrap_or(&[]) {
                    prefetch_key(pp.add(a), hd);
                }
                let mut acc = [[zero; H]; 2];
                for d in (0..hd).step_by(8) {
                    let kv = [load8(k[0].add(d)), load8(k[1].add(d))];
                    for h in 0..H {
                        let qd = _mm256_loadu_ps(qp.add(h * hd + d));
                        acc[0][h] = _mm256_fmadd_ps(qd, kv[0], acc[0][h]);
                        acc[1][h] = _mm256_fmadd_ps(qd, kv[1], acc[1][h]);
                    }
                }
                // (head, key) sums four at a time: [h0k0 h0k1 h1k0 h1k1] ...
                let mut flat = [zero; 8];
                for h in 0..H {
                    flat[2 * h] = acc[0][h];
                    flat[2 * h + 1] = acc[1][h];
                }
                let mut sums = [0f32; 8];
                let sc = _mm_set1_ps(scale);
                _mm_storeu_ps(
                    sums.as_mut_ptr(),
                    _mm_mul_ps(hsum4([flat[0], flat[1], flat[2], flat[3]]), sc),
                );
                if H > 2 {
                    _mm_storeu_ps(
                        sums.as_mut_ptr().add(4),
                        _mm_mul_ps(hsum4([flat[4], flat[5], flat[6], flat[7]]), sc),
                    );
                }
                for h in 0..H {
                    *out.get_unchecked_mut(h * n + i) = sums[2 * h];
                    *out.get_unchecked_mut(h * n + i + 1) = sums[2 * h + 1];
                }
            }
        }
        if whole < n {
            // SAFETY: as above, for key `whole` = n - 1 alone.
            unsafe {
                let k = pp.add(addrs[whole]);
                let mut acc = [zero; 4];
                for d in (0..hd).step_by(8) {
                    let kv = load8(k.add(d));
                    for h in 0..H {
                        let qd = _mm256_loadu_ps(qp.add(h * hd + d));
                        acc[h] = _mm256_fmadd_ps(qd, kv, acc[h]);
                    }
                }
                let mut sums = [0f32; 4];
                _mm_storeu_ps(
                    sums.as_mut_ptr(),
                    _mm_mul_ps(hsum4(acc), _mm_set1_ps(scale)),
                );
                for h in 0..H {
                    *out.get_unchecked_mut(h * n + whole) = sums[h];
                }
            }
        }
        n
    }

    /// [`weighted_sum`] for `H` heads, `8 W` values of each head per pass over
    /// the keys (`H W` accumulators in registers), then 16 (where `W > 2`),
    /// then 8 at a time. Each pass's FMA chains advance once per key, so
    /// more accumulators hide more of the FMA latency: 3 heads take `W = 3`
    /// (9 chains; passes of 24, 24 and 16 values at `hd = 64`), measured
    /// 9.9 -> 8.2 ns per key and KV head from L2 against `W = 2` (4 passes
    /// of 6 chains), single thread, Emerald Rapids.
    ///
    /// # Safety
    /// AVX2, FMA and F16C; `hd` a multiple of 8; `o.len() == H hd`;
    /// `p.len() == H n`; every `addrs[i] + hd <= pool.len()`.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn sum_heads<E: KvElem, const H: usize, const W: usize>(
        p: &[f32],
        pool: &[E],
        addrs: &[usize],
        hd: usize,
        o: &mut [f32],
    ) {
        let mut c0 = 0;
        while c0 + 8 * W <= hd {
            // SAFETY: c0 + 8 W <= hd; the rest is the caller's contract.
            unsafe { sum_chunk::<E, H, W>(p, pool, addrs, hd, c0, o) };
            c0 += 8 * W;
        }
        if W > 2 && c0 + 16 <= hd {
            // SAFETY: c0 + 16 <= hd.
            unsafe { sum_chunk::<E, H, 2>(p, pool, addrs, hd, c0, o) };
            c0 += 16;
        }
        while c0 < hd {
            // SAFETY: c0 + 8 <= hd (hd is a multiple of 8).
            unsafe { sum_chunk::<E, H, 1>(p, pool, addrs, hd, c0, o) };
            c0 += 8;
        }
    }

    /// Values `c0..c0 + 8 W` of each of the `H` heads' weighted sums.
    ///
    /// # Safety
    /// As [`sum_heads`], and `c0 + 8 W <= hd`.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    pub(super) unsafe fn sum_chunk<E: KvElem, const H: usize, const W: usize>(
        p: &[f32],
        pool: &[E],
        addrs: &[usize],
        hd: usize,
        c0: usize,
        o: &mut [f32],
    ) {
        let n = addrs.len();
        let mut acc = [[_mm256_setzero_ps(); W]; H];
        for (j, &a) in addrs.iter().enumerate() {
            // SAFETY: the caller's contract: a + c0 + 8 W <= a + hd <=
            // pool.len(), and h n + j < H n = p.len().
            unsafe {
                if let Some(&next) = addrs.get(j + AHEAD) {
                    prefetch_key(pool.as_ptr().add(next + c0), 8 * W);
                }
                let v = pool.as_ptr().add(a + c0);
                let mut vals = [_mm256_setzero_ps(); W];
                for (w, x) in vals.iter_mut().enumerate() {
                    *x = load8(v.add(8 * w));
                }
                for h in 0..H {
                    let pj = _mm256_set1_ps(*p.get_unchecked(h * n + j));
                    for w in 0..W {
                        acc[h][w] = _mm256_fmadd_ps(vals[w], pj, acc[h][w]);
                    }
                }
            }
        }
        for h in 0..H {
            for w in 0..W {
                // SAFETY: h hd + c0 + 8 w + 8 <= h hd + hd <= H hd = o.len().
                unsafe { _mm256_storeu_ps(o.as_mut_ptr().add(h * hd + c0 + 8 * w), acc[h][w]) };
            }
        }
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

    const SHAPES: [(usize, usize); 7] = [
        (64, 9),
        (8, 4),
        (24, 7),
        (256, 13),
        (12, 5),
        (64, 0),
        (72, 3),
    ];

    fn check_scores<E: KvElem>(to_pool: impl Fn(f32) -> E) {
        for (hd, n) in SHAPES {
            for heads in 1..=MAX_HEADS {
                let (pool, addrs) = pool_and_addrs(hd, n);
                let pool: Vec<E> = pool.into_iter().map(&to_pool).collect();
                let q: Vec<f32> = (0..heads * hd).map(|i| (i as f32 * 0.37).sin()).collect();
                let mut got = vec![f32::NAN; heads * n];
                scores(&q, hd, &pool, &addrs, 0.125, &mut got, true);
                for h in 0..heads {
                    for (i, &a) in addrs.iter().enumerate() {
                        let want: f64 = q[h * hd..(h + 1) * hd]
                            .iter()
                            .zip(&pool[a..a + hd])
                            .map(|(x, y)| f64::from(*x) * f64::from(y.to_f32()))
                            .sum::<f64>()
                            * 0.125;
                        let g = f64::from(got[h * n + i]);
                        assert!(
                            (g - want).abs() <= 1e-5 * (1.0 + want.abs()),
                            "hd {hd} heads {heads} head {h} key {i}: {g} vs {want}"
                        );
                    }
                }
            }
        }
    }

    fn check_weighted_sum<E: KvElem>(to_pool: impl Fn(f32) -> E) {
        for (hd, n) in SHAPES {
            for heads in 1..=MAX_HEADS {
                let (pool, addrs) = pool_and_addrs(hd, n);
                let pool: Vec<E> = pool.into_iter().map(&to_pool).collect();
                let p: Vec<f32> = (0..heads * n).map(|j| 1.0 / (j as f32 + 2.0)).collect();
                let (mut fast, mut slow) = (vec![f32::NAN; heads * hd], vec![0.0; heads * hd]);
                weighted_sum(&p, &pool, &addrs, hd, &mut fast, true);
                weighted_sum_portable(&p, &pool, &addrs, hd, &mut slow);
                assert_eq!(fast, slow, "hd {hd} heads {heads}");
                // And the portable form is the plain per-head sum.
                for h in 0..heads {
                    for c in 0..hd {
                        let want: f64 = addrs
                            .iter()
                            .enumerate()
                            .map(|(j, &a)| {
                                f64::from(p[h * n + j]) * f64::from(pool[a + c].to_f32())
                            })
                            .sum();
                        let g = f64::from(slow[h * hd + c]);
                        assert!(
                            (g - want).abs() <= 1e-5 * (1.0 + want.abs()),
                            "{g} vs {want}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn scores_match_per_key_dot_products() {
        check_scores(|x| x);
        check_scores(f16::from_f32);
    }

    #[test]
    fn weighted_sums_equal_the_portable_form_bit_for_bit() {
        check_weighted_sum(|x| x);
        check_weighted_sum(f16::from_f32);
    }

    /// The 512-bit loops give the AVX2 loops' bits (scores and weighted
    /// sums, f32 and f16 pools, every head count, odd key counts).
    #[test]
    fn wide_and_narrow_loops_give_the_same_bits() {
        #[cfg(all(
            target_arch = "x86_64",
            target_feature = "avx2",
            target_feature = "fma",
            target_feature = "f16c"
        ))]
        if !zmm::available() {
            eprintln!("SKIP 512-bit attention loops: this CPU has no AVX-512 F/DQ (AVX2 ran)");
        }
        fn check<E: KvElem>(to_pool: impl Fn(f32) -> E) {
            for (hd, n) in SHAPES.into_iter().chain([(64, 11), (136, 6), (64, 4)]) {
                for heads in 1..=MAX_HEADS {
                    let (pool, addrs) = pool_and_addrs(hd, n);
                    let pool: Vec<E> = pool.into_iter().map(&to_pool).collect();
                    let q: Vec<f32> = (0..heads * hd).map(|i| (i as f32 * 0.37).sin()).collect();
                    let run = |wide| {
                        let mut s = vec![f32::NAN; heads * n];
                        scores(&q, hd, &pool, &addrs, 0.125, &mut s, wide);
                        let mut o = vec![f32::NAN; heads * hd];
                        weighted_sum(&s, &pool, &addrs, hd, &mut o, wide);
                        (s, o)
                    };
                    let (wide, narrow) = (run(true), run(false));
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert_eq!(
                        bits(&wide.0),
                        bits(&narrow.0),
                        "scores hd {hd} n {n} heads {heads}"
                    );
                    assert_eq!(
                        bits(&wide.1),
                        bits(&narrow.1),
                        "sums hd {hd} n {n} heads {heads}"
                    );
                }
            }
        }
        check(|x| x);
        check(f16::from_f32);
    }

    /// A key's score is the same bits whether it runs in a 512-bit group
    /// of four, an AVX2 pair or alone (the last of an odd count): what
    /// keeps a row's attention independent of how many keys follow it
    /// (a verification row of speculative decoding against plain decode).
    #[test]
    fn a_keys_score_does_not_depend_on_the_keys_around_it() {
        for hd in [64, 72, 8] {
            for heads in 1..=MAX_HEADS {
                let n = 11;
                let (pool, addrs) = pool_and_addrs(hd, n);
                let pool: Vec<f16> = pool.into_iter().map(f16::from_f32).collect();
                let q: Vec<f32> = (0..heads * hd).map(|i| (i as f32 * 0.61).cos()).collect();
                for wide in [true, false] {
                    let mut all = vec![f32::NAN; heads * n];
                    scores(&q, hd, &pool, &addrs, 0.125, &mut all, wide);
                    for m in 1..n {
                        let mut some = vec![f32::NAN; heads * m];
                        scores(&q, hd, &pool, &addrs[..m], 0.125, &mut some, wide);
                        for h in 0..heads {
                            for i in 0..m {
                                assert_eq!(
                                    some[h * m + i].to_bits(),
                                    all[h * n + i].to_bits(),
                                    "hd {hd} heads {heads} wide {wide}: key {i} of {m}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    #[should_panic(expected = "shapes")]
    fn more_heads_than_a_call_serves_is_refused() {
        let (pool, addrs) = pool_and_addrs(8, 2);
        let q = vec![0.0; 8 * (MAX_HEADS + 1)];
        let mut out = vec![0.0; 2 * (MAX_HEADS + 1)];
        scores(&q, 8, &pool, &addrs, 1.0, &mut out, true);
    }
}
