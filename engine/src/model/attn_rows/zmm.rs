//! The 512-bit forms of the attention loops (AVX-512 F and DQ, checked at
//! run time), with the AVX2 loops' sums in the AVX2 loops' order, so the
//! results are the same bits whichever runs.
//!
//! - Scores ([`scores4`]): one zmm holds two keys' 8-value chunks (key
//!   `i` in the low half, key `i + 1` in the high half) against the query
//!   chunk broadcast to both halves, so each half accumulates exactly what
//!   one of the AVX2 kernel's ymm accumulators does; four keys per pass
//!   (two zmm per head: `2 H` independent FMA chains, enough to keep two
//!   FMA units busy at H = 2..4), and the halves are reduced by the AVX2
//!   kernel's `hsum4`.
//! - Weighted sums ([`sum_heads`]): 16 output values per zmm, up to 64 per
//!   head in registers across all keys; one FMA per value and key, keys in
//!   order (as the portable form).
//!
//! Why: where the CPU has full-width 512-bit units (Intel Xeon since
//! Skylake-SP, AMD Zen 5) an FMA or an f16 conversion of 16 lanes costs
//! what one of 8 does, and at batch 32 the attention loops were a quarter
//! of a decode step's time (`perf`, SmolLM2 Q4_K_M, context 192). Where
//! 512-bit work is split in two (AMD Zen 4) they issue half the
//! instructions for the same work.
//!
//! Invariants: as the parent module's; `hd` a multiple of 8.
//! Cost: O(H n hd) per call, no allocation.

// The register blocks index accumulators [pair][head] and [head][chunk]
// by constant-trip loops (unrolled into registers).
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use super::x86::{hsum4, prefetch_key, sum_chunk, AHEAD};
use super::KvElem;

/// Eight pool values from `p0` (low half) and eight from `p1` (high half)
/// as f32 (f16: one conversion of 16).
///
/// # Safety
/// Each pointer is valid for reading eight elements; the caller enables
/// AVX-512 F/DQ, AVX2 and F16C (the body is inlined into it).
#[inline(always)]
unsafe fn load8x2<E: KvElem>(p0: *const E, p1: *const E) -> __m512 {
    // SAFETY: the caller's contract; `E` is f16 or f32 (sealed).
    unsafe {
        if E::IS_F16 {
            let lo = _mm256_castsi128_si256(_mm_loadu_si128(p0.cast()));
            _mm512_cvtph_ps(_mm256_inserti128_si256::<1>(lo, _mm_loadu_si128(p1.cast())))
        } else {
            _mm512_insertf32x8::<1>(
                _mm512_castps256_ps512(_mm256_loadu_ps(p0.cast())),
                _mm256_loadu_ps(p1.cast()),
            )
        }
    }
}

/// Sixteen pool values at `p` as f32.
///
/// # Safety
/// As [`load8x2`], for sixteen elements at `p`.
#[inline(always)]
unsafe fn load16<E: KvElem>(p: *const E) -> __m512 {
    // SAFETY: the caller's contract; `E` is f16 or f32 (sealed).
    unsafe {
        if E::IS_F16 {
            _mm512_cvtph_ps(_mm256_loadu_si256(p.cast()))
        } else {
            _mm512_loadu_ps(p.cast())
        }
    }
}

/// True when the CPU has AVX-512 F and DQ (checked once per process).
pub(super) fn available() -> bool {
    static ZMM: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ZMM.get_or_init(|| {
        std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512dq")
    })
}

/// The scores of `H` heads for the first `4 * (n / 4)` keys; returns that
/// count (the AVX2 kernel does the rest, pairs first: the same bits).
///
/// # Safety
/// AVX-512 F/DQ, AVX2, FMA and F16C; `hd` a multiple of 8; `q.len() == H
/// hd`; `out.len() == H n`; every `addrs[i] + hd <= pool.len()`.
#[target_feature(enable = "avx512f,avx512dq,avx2,fma,f16c")]
pub(super) unsafe fn scores4<E: KvElem, const H: usize>(
    q: &[f32],
    hd: usize,
    pool: &[E],
    addrs: &[usize],
    scale: f32,
    out: &mut [f32],
) -> usize {
    let (qp, pp, n) = (q.as_ptr(), pool.as_ptr(), addrs.len());
    let whole = n / 4 * 4;
    let zero = _mm512_setzero_ps();
    let sc = _mm_set1_ps(scale);
    for i in (0..whole).step_by(4) {
        // SAFETY: the caller's contract: keys i..i + 4 hold hd values in
        // the pool, q holds H rows of hd, d + 8 <= hd, and h n + i + 3 <
        // H n = out.len().
        unsafe {
            let k = [
                pp.add(addrs[i]),
                pp.add(addrs[i + 1]),
                pp.add(addrs[i + 2]),
                pp.add(addrs[i + 3]),
            ];
            for &a in addrs.get(i + AHEAD..(i + AHEAD + 4).min(n)).unwrap_or(&[]) {
                prefetch_key(pp.add(a), hd);
            }
            // acc[pair][head]: low half key 2 pair, high half key 2 pair + 1.
            let mut acc = [[zero; H]; 2];
            for d in (0..hd).step_by(8) {
                let kv = [
                    load8x2(k[0].add(d), k[1].add(d)),
                    load8x2(k[2].add(d), k[3].add(d)),
                ];
                for h in 0..H {
                    let qd = _mm512_broadcast_f32x8(_mm256_loadu_ps(qp.add(h * hd + d)));
                    acc[0][h] = _mm512_fmadd_ps(qd, kv[0], acc[0][h]);
                    acc[1][h] = _mm512_fmadd_ps(qd, kv[1], acc[1][h]);
                }
            }
            for (pair, acc) in acc.iter().enumerate() {
                // (head, key) sums four at a time, as the AVX2 kernel:
                // [h0k0 h0k1 h1k0 h1k1] ...
                let mut flat = [_mm256_setzero_ps(); 8];
                for h in 0..H {
                    flat[2 * h] = _mm512_castps512_ps256(acc[h]);
                    flat[2 * h + 1] = _mm512_extractf32x8_ps::<1>(acc[h]);
                }
                let mut sums = [0f32; 8];
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
                let key = i + 2 * pair;
                for h in 0..H {
                    *out.get_unchecked_mut(h * n + key) = sums[2 * h];
                    *out.get_unchecked_mut(h * n + key + 1) = sums[2 * h + 1];
                }
            }
        }
    }
    whole
}

/// `o[h] = sum_i p[h * n + i] * pool[addrs[i]..][..hd]` for `H` heads:
/// 64 values of each head per pass over the keys (`4 H` accumulators),
/// then 16, then the AVX2 kernel's 8.
///
/// # Safety
/// AVX-512 F/DQ, AVX2, FMA and F16C; `hd` a multiple of 8; `o.len() == H
/// hd`; `p.len() == H n`; every `addrs[i] + hd <= pool.len()`.
#[target_feature(enable = "avx512f,avx512dq,avx2,fma,f16c")]
pub(super) unsafe fn sum_heads<E: KvElem, const H: usize>(
    p: &[f32],
    pool: &[E],
    addrs: &[usize],
    hd: usize,
    o: &mut [f32],
) {
    let mut c0 = 0;
    while c0 + 64 <= hd {
        // SAFETY: c0 + 64 <= hd; the rest is the caller's contract.
        unsafe { sum_chunk16::<E, H, 4>(p, pool, addrs, hd, c0, o) };
        c0 += 64;
    }
    while c0 + 16 <= hd {
        // SAFETY: c0 + 16 <= hd.
        unsafe { sum_chunk16::<E, H, 1>(p, pool, addrs, hd, c0, o) };
        c0 += 16;
    }
    if c0 < hd {
        // SAFETY: c0 + 8 == hd (hd is a multiple of 8); AVX2, FMA and
        // F16C are enabled.
        unsafe { sum_chunk::<E, H, 1>(p, pool, addrs, hd, c0, o) };
    }
}

/// Values `c0..c0 + 16 W` of each of the `H` heads' weighted sums.
///
/// # Safety
/// As [`sum_heads`], and `c0 + 16 W <= hd`.
#[target_feature(enable = "avx512f,avx512dq,avx2,fma,f16c")]
#[inline]
unsafe fn sum_chunk16<E: KvElem, const H: usize, const W: usize>(
    p: &[f32],
    pool: &[E],
    addrs: &[usize],
    hd: usize,
    c0: usize,
    o: &mut [f32],
) {
    let n = addrs.len();
    let mut acc = [[_mm512_setzero_ps(); W]; H];
    for (j, &a) in addrs.iter().enumerate() {
        // SAFETY: the caller's contract: a + c0 + 16 W <= a + hd <=
        // pool.len(), and h n + j < H n = p.len().
        unsafe {
            if let Some(&next) = addrs.get(j + AHEAD) {
                prefetch_key(pool.as_ptr().add(next + c0), 16 * W);
            }
            let v = pool.as_ptr().add(a + c0);
            let mut vals = [_mm512_setzero_ps(); W];
            for (w, x) in vals.iter_mut().enumerate() {
                *x = load16(v.add(16 * w));
            }
            for h in 0..H {
                let pj = _mm512_set1_ps(*p.get_unchecked(h * n + j));
                for w in 0..W {
                    acc[h][w] = _mm512_fmadd_ps(vals[w], pj, acc[h][w]);
                }
            }
        }
    }
    for h in 0..H {
        for w in 0..W {
            // SAFETY: h hd + c0 + 16 w + 16 <= h hd + hd <= H hd = o.len().
            unsafe { _mm512_storeu_ps(o.as_mut_ptr().add(h * hd + c0 + 16 * w), acc[h][w]) };
        }
    }
}
