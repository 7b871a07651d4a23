//! Sampling on the device (issue 14, item 1).
//!
//! - [`greedy_rows`]: greedy rows reduced to `(token, max, sum)` so a greedy
//!   step downloads 12 bytes per row instead of the row's `vocab` logits.
//! - [`sample_rows`]: one draw per row with temperature, top-k, top-p and
//!   min-p, its raw logprob and the raw top-n logprobs (n <= 20), by the
//!   algorithm the CPU sampler (`engine::sampler::ops`) runs too, built on the
//!   scalar functions below ([`exp_poly`], [`ln_poly`], [`order_key`],
//!   [`race_score`]) and [`crate::philox`].
//!
//! The draw (both samplers): `s_i = (l_i - max) / T` over the finite logits;
//! kept: `key(s_i) >= thr` and `exp(s_i) >= min_p`, where `thr` is the
//! largest order key such that the top-k count (`#{key >= thr} >= k`), then
//! the top-p mass (`sum{exp(s_j) : key_j >= thr} >= top_p * Z`, Z the mass
//! top-k kept) still hold: no sort, a 32-step bitwise search of reductions.
//! The token is the argmax over kept tokens of `s_i - ln(-ln u_i)` (an
//! exponential race: argmax `p_i / E_i`, `E_i = -ln u_i`), `u_i` =
//! `philox::token_uniform(seed, seq, step, i)`; ties go to the lowest id.
//!
//! Thread mapping: one block per logits row (grid x); thread `i` reads
//! elements `i, i + threads, ...` (coalesced); block reductions. Cost per
//! row: O(vocab) for greedy, O(vocab x (2 + 32 per threshold searched + n))
//! for a draw (the searches re-read the row from cache).
//!
//! Invariants, as the CPU sampler's (`engine::sampler`): NaN never wins; ties
//! go to the lowest token id; the sum runs over the non-NaN logits, so
//! logsumexp is `max + ln(sum)` and the host computes the argmax's logprob as
//! `-ln(sum)`. A row of only NaN
//! reports index `-1` (the host then picks token 0 with logprob NaN, as the
//! CPU does). Token ids are carried as `f32`, exact below 2^24.

use crate::device::{block_dim_x, block_idx_x, exp_fast, thread_idx_x};
use crate::reduce::{block_max, block_sum};
use crate::Storage;

/// For each row `r` of `logits`: `out[3r] = argmax` (lowest id on ties, `-1`
/// when the row is all NaN), `out[3r + 1] = max`, `out[3r + 2] = sum(exp(v -
/// max))` over the row's non-NaN values.
///
/// # Safety
/// `logits`: `[rows, vocab]`; `out`: `[rows, 3]`; grid x = rows; 1-D blocks,
/// a multiple of 32 threads.
pub unsafe fn greedy_rows<T: Storage>(out: *mut f32, logits: *const T, vocab: u32) {
    let n = vocab as usize;
    let (tid, threads) = (thread_idx_x() as usize, block_dim_x() as usize);
    let row = block_idx_x() as usize;
    // SAFETY: per the function contract, every read is inside row `row`.
    unsafe {
        let x = logits.add(row * n);
        let (mut best, mut best_i) = (f32::NEG_INFINITY, f32::INFINITY);
        let mut i = tid;
        while i < n {
            let v = (*x.add(i)).to_f32();
            // Strictly greater: the first (lowest) index wins inside a thread.
            if v > best || (best_i == f32::INFINITY && v == best) {
                best = v;
                best_i = i as f32;
            }
            i += threads;
        }
        let max = block_max(best);
        let mine = if best == max { best_i } else { f32::INFINITY };
        let first = -block_max(-mine);
        let mut sum = 0.0f32;
        if max > f32::NEG_INFINITY {
            let mut i = tid;
            while i < n {
                let v = (*x.add(i)).to_f32();
                if !v.is_nan() {
                    sum += exp_fast(v - max);
                }
                i += threads;
            }
        }
        let sum = block_sum(sum);
        if tid == 0 {
            let o = out.add(3 * row);
            *o = if first == f32::INFINITY { -1.0 } else { first };
            *o.add(1) = max;
            *o.add(2) = sum;
        }
    }
}

/// Words per row of [`sample_rows`]'s `params`: temperature (f32 bits, > 0),
/// top_p (f32 bits), min_p (f32 bits), top_k (0: none), seed low and high
/// words, the sequence's index in its group, the step (output position).
pub const PARAM_WORDS: usize = 8;
/// Most top logprobs per row [`sample_rows`] reports.
pub const MAX_TOP_N: usize = 20;

/// `e^x` for `x <= 0` (larger inputs are clamped to 0), relative error below
/// 5e-7: Cody-Waite range reduction `x = n ln2 + r`, a degree-6 polynomial
/// for `e^r`, and `2^n` built in the exponent bits. Plain `f32` arithmetic,
/// so the CPU sampler and the emulated kernel compute the same bits (the
/// device may fuse multiply-adds: ulp-level differences). 0 below -87.
#[inline(always)]
pub fn exp_poly(x: f32) -> f32 {
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    let x = x.clamp(-87.0, 0.0);
    // Round to nearest without a libm call: adding 1.5 * 2^23 pushes the
    // fraction out of the mantissa (|x log2 e| < 2^22 here).
    const ROUND: f32 = 12_582_912.0;
    let n = (x * core::f32::consts::LOG2_E + ROUND) - ROUND;
    let r = x - n * LN2_HI - n * LN2_LO;
    let p = 1.0
        + r * (1.0
            + r * (0.5
                + r * (1.0 / 6.0 + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0))))));
    let scale = f32::from_bits(((n as i32 + 127) as u32) << 23);
    p * scale
}

/// Natural log of a positive normal `x`, relative error about 1e-7:
/// `x = m 2^e` with `m` in [sqrt(1/2), sqrt(2)), `ln m = 2 atanh(t)`,
/// `t = (m - 1) / (m + 1)`, five odd terms. Plain `f32` arithmetic (see
/// [`exp_poly`]).
#[inline(always)]
pub fn ln_poly(x: f32) -> f32 {
    let bits = x.to_bits();
    let mut e = ((bits >> 23) & 0xff) as i32 - 127;
    let mut m = f32::from_bits((bits & 0x007f_ffff) | 0x3f80_0000);
    if m > core::f32::consts::SQRT_2 {
        m *= 0.5;
        e += 1;
    }
    let t = (m - 1.0) / (m + 1.0);
    let t2 = t * t;
    let series = 1.0 + t2 * (1.0 / 3.0 + t2 * (1.0 / 5.0 + t2 * (1.0 / 7.0 + t2 * (1.0 / 9.0))));
    e as f32 * core::f32::consts::LN_2 + 2.0 * t * series
}

/// A `u32` whose unsigned order is the numeric order of non-NaN `x`.
#[inline(always)]
pub fn order_key(x: f32) -> u32 {
    let b = x.to_bits();
    if b & 0x8000_0000 != 0 {
        !b
    } else {
        b | 0x8000_0000
    }
}

/// The race score of a kept token with scaled logit `s` and uniform `u` in
/// (0, 1): `s - ln(-ln u)` (its Gumbel-perturbed logit; the argmax over kept
/// tokens is a draw from their softmax).
#[inline(always)]
pub fn race_score(s: f32, u: f32) -> f32 {
    s - ln_poly(-ln_poly(u))
}

/// The best `(value, index)` of the block with the lowest index on ties, given
/// each thread's best (index `f32::INFINITY` when it has none); every thread
/// gets the answer.
#[inline(always)]
fn block_argmax(best: f32, best_i: f32) -> (f32, f32) {
    let max = block_max(best);
    let mine = if best == max { best_i } else { f32::INFINITY };
    (max, -block_max(-mine))
}

/// One thread's view of a row: its element indices are `tid + j * threads`.
#[derive(Clone, Copy)]
struct RowView {
    x: *const f32,
    n: usize,
    tid: usize,
    threads: usize,
}

impl RowView {
    /// Calls `f(i, v)` on this thread's elements in increasing `i`.
    ///
    /// # Safety
    /// `x` holds `n` readable f32.
    #[inline(always)]
    unsafe fn each(self, mut f: impl FnMut(usize, f32)) {
        let mut i = self.tid;
        while i < self.n {
            // SAFETY: i < n (the contract).
            f(i, unsafe { *self.x.add(i) });
            i += self.threads;
        }
    }

    /// The largest order key `thr` of scaled logits with `measure(thr) >=
    /// target`, where `measure(t)` is the block sum of `weight(s)` over the
    /// finite elements with `order_key(s) >= t` (monotone in `t`). A
    /// bitwise search: 32 block reductions.
    ///
    /// # Safety
    /// As [`Self::each`]; every thread of the block calls it.
    #[inline(always)]
    unsafe fn search(self, scale: Scale, target: f32, weight: impl Fn(f32) -> f32) -> u32 {
        let mut thr = 0u32;
        let mut bit = 32;
        while bit > 0 {
            bit -= 1;
            let cand = thr | (1 << bit);
            let mut acc = 0.0f32;
            // SAFETY: forwarded contract.
            unsafe {
                self.each(|_, v| {
                    if let Some(s) = scale.of(v) {
                        if order_key(s) >= cand {
                            acc += weight(s);
                        }
                    }
                })
            };
            if block_sum(acc) >= target {
                thr = cand;
            }
        }
        thr
    }
}

/// `s = (v - max) * inv_t` for finite `v`.
#[derive(Clone, Copy)]
struct Scale {
    max: f32,
    inv_t: f32,
}

impl Scale {
    #[inline(always)]
    fn of(self, v: f32) -> Option<f32> {
        v.is_finite().then_some((v - self.max) * self.inv_t)
    }
}

/// For each row `r` of `logits` with its [`PARAM_WORDS`] words of `params`:
/// `out[r * (2 + 2 n_top)..]` = the drawn token (as f32), its logprob in the
/// raw row (`l - logsumexp(row)`), then `n_top` pairs (token, logprob) of the
/// raw row's best, best first (token `-1` past the finite entries). A
/// temperature of 0 (bits) draws the argmax (lowest id on ties, token 0 in a
/// row of only NaN). See the module docs for the draw.
///
/// # Safety
/// `logits`: `[rows, vocab]`; `params`: `[rows, PARAM_WORDS]`; `out`: `[rows,
/// 2 + 2 n_top]` with `n_top <= MAX_TOP_N`; grid x = rows; 1-D blocks, a
/// multiple of 32 threads.
pub unsafe fn sample_rows(
    out: *mut f32,
    logits: *const f32,
    params: *const u32,
    vocab: u32,
    n_top: u32,
) {
    let n = vocab as usize;
    let (tid, threads) = (thread_idx_x() as usize, block_dim_x() as usize);
    let row = block_idx_x() as usize;
    // SAFETY: per the function contract, every access is inside row `row`.
    unsafe {
        let view = RowView {
            x: logits.add(row * n),
            n,
            tid,
            threads,
        };
        let p = params.add(row * PARAM_WORDS);
        let w = |k: usize| *p.add(k);
        // The raw row: argmax (NaN never wins, lowest id on ties), max, sum.
        let (mut best, mut best_i) = (f32::NEG_INFINITY, f32::INFINITY);
        view.each(|i, v| {
            if v > best || (best_i == f32::INFINITY && v == best) {
                best = v;
                best_i = i as f32;
            }
        });
        let (max, first) = block_argmax(best, best_i);
        let mut sum = 0.0f32;
        if max > f32::NEG_INFINITY {
            view.each(|_, v| {
                if !v.is_nan() {
                    sum += exp_poly(v - max);
                }
            });
        }
        let lse = max + ln_or_neg_inf(block_sum(sum));
        let temperature = f32::from_bits(w(0));
        let token = if temperature > 0.0 {
            let draw = Draw {
                scale: Scale {
                    max,
                    inv_t: 1.0 / temperature,
                },
                top_p: f32::from_bits(w(1)),
                min_p: f32::from_bits(w(2)),
                top_k: w(3),
                seed: u64::from(w(4)) | (u64::from(w(5)) << 32),
                seq: w(6),
                step: w(7),
            };
            draw.run(view)
        } else {
            first
        };
        let token = if token == f32::INFINITY {
            0
        } else {
            token as usize
        };
        let o = out.add(row * (2 + 2 * n_top as usize));
        if tid == 0 {
            *o = token as f32;
            *o.add(1) = if token < n {
                *view.x.add(token) - lse
            } else {
                f32::NAN
            };
        }
        top_n(view, o.add(2), n_top, lse);
    }
}

/// `ln(sum)` of a sum of exponentials (`-inf` when it is 0).
#[inline(always)]
fn ln_or_neg_inf(sum: f32) -> f32 {
    if sum > 0.0 {
        ln_poly(sum)
    } else {
        f32::NEG_INFINITY
    }
}

/// One row's draw parameters.
#[derive(Clone, Copy)]
struct Draw {
    scale: Scale,
    top_p: f32,
    min_p: f32,
    top_k: u32,
    seed: u64,
    seq: u32,
    step: u32,
}

impl Draw {
    /// The drawn token (`f32::INFINITY` when no logit is finite).
    ///
    /// # Safety
    /// As [`RowView::each`]; every thread of the block calls it.
    #[inline(always)]
    unsafe fn run(self, view: RowView) -> f32 {
        let sc = self.scale;
        // SAFETY: forwarded contract (every call below reads row elements).
        unsafe {
            let mut thr = 0u32;
            if self.top_k > 0 && (self.top_k as usize) < view.n {
                thr = view.search(sc, self.top_k as f32, |_| 1.0);
            }
            if self.top_p < 1.0 {
                let mut z = 0.0f32;
                view.each(|_, v| {
                    if let Some(s) = sc.of(v) {
                        if order_key(s) >= thr {
                            z += exp_poly(s);
                        }
                    }
                });
                let target = self.top_p * block_sum(z);
                let floor = thr;
                thr = view.search(sc, target, |s| {
                    if order_key(s) >= floor {
                        exp_poly(s)
                    } else {
                        0.0
                    }
                });
            }
            let (mut best, mut best_i) = (f32::NEG_INFINITY, f32::INFINITY);
            view.each(|i, v| {
                let Some(s) = sc.of(v) else { return };
                if order_key(s) < thr || exp_poly(s) < self.min_p {
                    return;
                }
                let u = crate::philox::token_uniform(self.seed, self.seq, self.step, i as u32);
                let score = race_score(s, u);
                if score > best || best_i == f32::INFINITY {
                    best = score;
                    best_i = i as f32;
                }
            });
            block_argmax(best, best_i).1
        }
    }
}

/// Writes the `n_top` best finite entries of the row (value descending, id
/// ascending) as (token, logprob) pairs at `o` (thread 0 writes).
///
/// # Safety
/// As [`RowView::each`]; `o` holds `2 n_top` f32; every thread calls it.
#[inline(always)]
unsafe fn top_n(view: RowView, o: *mut f32, n_top: u32, lse: f32) {
    let (mut pv, mut pi) = (f32::INFINITY, -1.0f32);
    for j in 0..n_top as usize {
        let (mut best, mut best_i) = (f32::NEG_INFINITY, f32::INFINITY);
        // SAFETY: forwarded contract.
        unsafe {
            view.each(|i, v| {
                let fi = i as f32;
                let after = v < pv || (v == pv && fi > pi);
                if v.is_finite() && after && (v > best || best_i == f32::INFINITY) {
                    best = v;
                    best_i = fi;
                }
            })
        };
        let (v, i) = block_argmax(best, best_i);
        if view.tid == 0 {
            let (id, lp) = if i == f32::INFINITY {
                (-1.0, f32::NAN)
            } else {
                (i, v - lse)
            };
            // SAFETY: j < n_top (the contract).
            unsafe {
                *o.add(2 * j) = id;
                *o.add(2 * j + 1) = lp;
            }
        }
        (pv, pi) = (v, i);
    }
}

#[cfg(all(test, not(target_arch = "nvptx64")))]
mod tests {
    use crate::entries::emulate;
    use crate::launch::per_row;
    use crate::sig::KernelArg;
    use std::vec;
    use std::vec::Vec;

    /// Plain-Rust reference: (argmax with the lowest id on ties, max, sum of exp).
    fn reference(row: &[f32]) -> (f32, f32, f32) {
        let max = row
            .iter()
            .copied()
            .filter(|v| !v.is_nan())
            .fold(f32::NEG_INFINITY, f32::max);
        let idx = row
            .iter()
            .position(|&v| v == max)
            .map_or(-1.0, |i| i as f32);
        let sum: f64 = if max == f32::NEG_INFINITY {
            0.0
        } else {
            row.iter()
                .filter(|v| !v.is_nan())
                .map(|&v| ((v - max) as f64).exp())
                .sum()
        };
        (idx, max, sum as f32)
    }

    #[test]
    fn greedy_rows_matches_the_reference() {
        let vocab = 1000usize;
        let mut seed = 7u32;
        let mut rows: Vec<Vec<f32>> = (0..5)
            .map(|_| {
                (0..vocab)
                    .map(|_| {
                        seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                        ((seed >> 8) as f32 / (1u32 << 24) as f32 - 0.5) * 20.0
                    })
                    .collect()
            })
            .collect();
        // A tie between ids 900 and 37 (lowest wins), seen by different threads.
        rows[1][900] = 50.0;
        rows[1][37] = 50.0;
        // NaN never wins; the maximum at the last id.
        rows[2][3] = f32::NAN;
        rows[2][vocab - 1] = 99.0;
        // Only NaN.
        rows[3] = vec![f32::NAN; vocab];
        // A maximum the first thread does not see, and -inf entries.
        rows[4][0] = f32::NEG_INFINITY;
        rows[4][513] = 40.0;
        let logits: Vec<f32> = rows.concat();
        let mut out = vec![f32::NAN; 3 * rows.len()];
        let args = [
            KernelArg::Ptr(out.as_mut_ptr() as u64),
            KernelArg::Ptr(logits.as_ptr() as u64),
            KernelArg::U32(vocab as u32),
        ];
        // SAFETY: `logits` is [5, vocab], `out` [5, 3], one block per row.
        unsafe { emulate("greedy_rows_f32", per_row(rows.len() as u32, 64), &args) }
            .expect("launch");
        for (r, row) in rows.iter().enumerate() {
            let (idx, max, sum) = reference(row);
            let got = &out[3 * r..3 * r + 3];
            assert_eq!(got[0], idx, "row {r} argmax");
            assert!(
                got[1] == max || (got[1].is_nan() && max.is_nan()),
                "row {r} max"
            );
            assert!(
                (got[2] - sum).abs() <= 1e-4 * sum.max(1.0),
                "row {r}: sum {} vs {sum}",
                got[2]
            );
        }
        assert_eq!(out[3], 37.0);
        assert_eq!(out[9], -1.0);
    }
}

#[cfg(all(test, not(target_arch = "nvptx64")))]
mod draw_tests {
    use super::*;
    use crate::entries::emulate;
    use crate::launch::per_row;
    use crate::philox::token_uniform;
    use crate::sig::KernelArg;
    use std::vec;
    use std::vec::Vec;

    #[derive(Clone, Copy, Debug)]
    struct P {
        t: f32,
        top_p: f32,
        min_p: f32,
        top_k: u32,
        seed: u64,
        seq: u32,
        step: u32,
    }

    /// Plain-Rust reference of the draw: thresholds by a full sort, mass in f64.
    fn reference_draw(row: &[f32], p: P) -> usize {
        let max = row
            .iter()
            .copied()
            .filter(|v| !v.is_nan())
            .fold(f32::NEG_INFINITY, f32::max);
        if p.t == 0.0 {
            return row.iter().position(|&v| v == max).unwrap_or(0);
        }
        let inv_t = 1.0 / p.t;
        let mut c: Vec<(usize, f32)> = row
            .iter()
            .enumerate()
            .filter(|(_, v)| v.is_finite())
            .map(|(i, &v)| (i, (v - max) * inv_t))
            .collect();
        c.sort_by(|a, b| b.1.partial_cmp(&a.1).unwrap().then(a.0.cmp(&b.0)));
        if p.top_k > 0 && (p.top_k as usize) < c.len() {
            let kth = c[p.top_k as usize - 1].1;
            c.retain(|x| x.1 >= kth);
        }
        if p.top_p < 1.0 {
            let z: f64 = c.iter().map(|x| f64::from(exp_poly(x.1))).sum();
            let mut acc = 0.0;
            let mut cut = f32::NEG_INFINITY;
            for x in &c {
                acc += f64::from(exp_poly(x.1));
                if acc >= f64::from(p.top_p) * z {
                    cut = x.1;
                    break;
                }
            }
            c.retain(|x| x.1 >= cut);
        }
        c.retain(|x| exp_poly(x.1) >= p.min_p);
        let mut best = (f32::NEG_INFINITY, usize::MAX);
        for &(i, s) in &c {
            let score = race_score(s, token_uniform(p.seed, p.seq, p.step, i as u32));
            if score > best.0 || (score == best.0 && i < best.1) {
                best = (score, i);
            }
        }
        if best.1 == usize::MAX {
            0
        } else {
            best.1
        }
    }

    fn run(rows: &[Vec<f32>], ps: &[P], n_top: usize) -> Vec<f32> {
        let vocab = rows[0].len();
        let logits: Vec<f32> = rows.concat();
        let params: Vec<u32> = ps
            .iter()
            .flat_map(|p| {
                [
                    p.t.to_bits(),
                    p.top_p.to_bits(),
                    p.min_p.to_bits(),
                    p.top_k,
                    p.seed as u32,
                    (p.seed >> 32) as u32,
                    p.seq,
                    p.step,
                ]
            })
            .collect();
        let mut out = vec![f32::NAN; rows.len() * (2 + 2 * n_top)];
        let args = [
            KernelArg::Ptr(out.as_mut_ptr() as u64),
            KernelArg::Ptr(logits.as_ptr() as u64),
            KernelArg::Ptr(params.as_ptr() as u64),
            KernelArg::U32(vocab as u32),
            KernelArg::U32(n_top as u32),
        ];
        // SAFETY: logits [rows, vocab], params [rows, 8], out [rows, 2 + 2 n_top].
        unsafe { emulate("sample_rows_f32", per_row(rows.len() as u32, 32), &args) }
            .expect("launch");
        out
    }

    fn lcg_rows(n: usize, vocab: usize, seed: u32) -> Vec<Vec<f32>> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                (0..vocab)
                    .map(|_| {
                        s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                        ((s >> 8) as f32 / (1u32 << 24) as f32 - 0.5) * 12.0
                    })
                    .collect()
            })
            .collect()
    }

    #[test]
    fn draws_equal_the_sorted_reference() {
        let vocab = 300;
        let rows = lcg_rows(24, vocab, 11);
        let ps: Vec<P> = (0..24u32)
            .map(|r| P {
                t: [0.0, 0.3, 0.8, 1.0, 1.7][r as usize % 5],
                top_p: [1.0, 0.9, 0.5, 0.95][r as usize % 4],
                min_p: [0.0, 0.05, 0.2][r as usize % 3],
                top_k: [0, 1, 5, 50, 299, 400][r as usize % 6],
                seed: 1_000 + u64::from(r) * 7 + (u64::from(r) << 35),
                seq: r % 3,
                step: r * 5,
            })
            .collect();
        let out = run(&rows, &ps, 0);
        for (r, (row, p)) in rows.iter().zip(&ps).enumerate() {
            assert_eq!(
                out[2 * r] as usize,
                reference_draw(row, *p),
                "row {r}: {p:?}"
            );
        }
        // The draws depend on the step (different keys, different tokens).
        let mut moved = ps.clone();
        moved.iter_mut().for_each(|p| p.step += 1);
        let out2 = run(&rows, &moved, 0);
        let differs = (0..24)
            .filter(|&r| ps[r].t > 0.0 && out[2 * r] != out2[2 * r])
            .count();
        assert!(differs > 3, "the step does not key the draw ({differs})");
    }

    #[test]
    fn draw_frequencies_follow_the_softmax() {
        // Four tokens, T = 1: frequencies over many steps vs softmax.
        let row = vec![1.0f32, 0.0, -1.0, 0.5];
        let n = 1000;
        let rows = vec![row.clone(); n];
        let ps: Vec<P> = (0..n as u32)
            .map(|i| P {
                t: 1.0,
                top_p: 1.0,
                min_p: 0.0,
                top_k: 0,
                seed: 5,
                seq: 0,
                step: i,
            })
            .collect();
        let out = run(&rows, &ps, 0);
        let z: f64 = row.iter().map(|&v| f64::from(v).exp()).sum();
        for (tok, &v) in row.iter().enumerate() {
            let want = f64::from(v).exp() / z;
            let got = (0..n).filter(|&r| out[2 * r] as usize == tok).count() as f64 / n as f64;
            let sd = (want * (1.0 - want) / n as f64).sqrt();
            assert!(
                (got - want).abs() < 4.5 * sd,
                "token {tok}: {got} vs {want}"
            );
        }
    }

    #[test]
    fn logprob_and_top_n_come_from_the_raw_row() {
        let mut rows = lcg_rows(3, 100, 3);
        rows[1][7] = f32::NAN;
        rows[1][8] = f32::NEG_INFINITY;
        rows[2] = vec![f32::NAN; 100];
        let ps = vec![
            P {
                t: 0.7,
                top_p: 0.9,
                min_p: 0.0,
                top_k: 10,
                seed: 1,
                seq: 0,
                step: 0
            };
            3
        ];
        let n_top = 20;
        let out = run(&rows, &ps, n_top);
        let stride = 2 + 2 * n_top;
        for (r, row) in rows.iter().enumerate().take(2) {
            let o = &out[r * stride..(r + 1) * stride];
            let max = row
                .iter()
                .copied()
                .filter(|v| !v.is_nan())
                .fold(f32::NEG_INFINITY, f32::max);
            let lse = f64::from(max)
                + row
                    .iter()
                    .filter(|v| !v.is_nan())
                    .map(|&v| f64::from(v - max).exp())
                    .sum::<f64>()
                    .ln();
            let tok = o[0] as usize;
            assert!((f64::from(o[1]) - (f64::from(row[tok]) - lse)).abs() < 1e-5);
            let mut idx: Vec<usize> = (0..row.len()).filter(|&i| row[i].is_finite()).collect();
            idx.sort_by(|&a, &b| row[b].partial_cmp(&row[a]).unwrap().then(a.cmp(&b)));
            for j in 0..n_top {
                assert_eq!(o[2 + 2 * j] as usize, idx[j], "row {r} top {j}");
                let want = f64::from(row[idx[j]]) - lse;
                assert!((f64::from(o[3 + 2 * j]) - want).abs() < 1e-5);
            }
        }
        // Only NaN: token 0, logprob NaN, no top entries.
        let o = &out[2 * stride..];
        assert_eq!(o[0], 0.0);
        assert!(o[1].is_nan());
        assert_eq!(o[2], -1.0);
    }

    #[test]
    fn scalar_functions_are_accurate() {
        let mut x = 1e-7f32;
        while x < 30.0 {
            let (got, want) = (f64::from(ln_poly(x)), f64::from(x).ln());
            assert!(
                (got - want).abs() <= 2e-7 * want.abs().max(1.0),
                "ln({x}) = {got}, want {want}"
            );
            x *= 1.0137;
        }
        let mut x = -87.0f32;
        while x <= 0.0 {
            let (got, want) = (exp_poly(x), x.exp());
            assert!(((got - want) / want).abs() < 5e-7, "exp({x})");
            x += 0.0137;
        }
        let vals = [
            f32::NEG_INFINITY,
            -3.5,
            -1e-30,
            -0.0,
            0.0,
            1e-30,
            2.0,
            f32::INFINITY,
        ];
        for w in vals.windows(2) {
            assert!(order_key(w[0]) <= order_key(w[1]), "{w:?}");
        }
    }
}
