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
use crate::penalty::NO_SLOT;
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
/// words, the sequence's index in its group, the step (output position),
/// the row's processed copy in `draw_rows` (`penalty::NO_SLOT`: draw from
/// the logits row itself), the row's count slot (`NO_SLOT`: none).
pub const PARAM_WORDS: usize = 10;
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
/// logits row (`l - logsumexp(row)`), then `n_top` pairs (token, logprob) of
/// the logits row's best, best first (token `-1` past the finite entries).
/// The draw reads the row's processed copy in `draw_rows` when it has one
/// (penalties, suppression: `crate::penalty`), else the logits row. A
/// temperature of 0 (bits) draws the argmax (lowest id on ties, token 0 in a
/// row of only NaN). See the module docs for the draw. A row with a count
/// slot adds 1 to its slot's entry of the drawn token in `counts`.
///
/// # Safety
/// `logits`: `[rows, vocab]`; `params`: `[rows, PARAM_WORDS]`; `out`: `[rows,
/// 2 + 2 n_top]` with `n_top <= MAX_TOP_N`; `draw_rows` holds every
/// processed row named (`[_, vocab]`), `counts` every slot named (`[_,
/// vocab]`), distinct rows naming distinct slots; grid x = rows; 1-D blocks,
/// a multiple of 32 threads.
pub unsafe fn sample_rows(
    out: *mut f32,
    logits: *const f32,
    draw_rows: *const f32,
    counts: *mut u32,
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
        // The row the draw reads: the processed copy (its own max and
        // argmax, as the CPU sampler takes them), or the logits row.
        let (dview, dmax, dfirst) = if w(8) == NO_SLOT {
            (view, max, first)
        } else {
            let dview = RowView {
                x: draw_rows.add(w(8) as usize * n),
                ..view
            };
            let (mut best, mut best_i) = (f32::NEG_INFINITY, f32::INFINITY);
            dview.each(|i, v| {
                if v > best || (best_i == f32::INFINITY && v == best) {
                    best = v;
                    best_i = i as f32;
                }
            });
            let (m, f) = block_argmax(best, best_i);
            (dview, m, f)
        };
        let temperature = f32::from_bits(w(0));
        let token = if temperature > 0.0 {
            let draw = Draw {
                scale: Scale {
                    max: dmax,
                    inv_t: 1.0 / temperature,
                },
                top_p: f32::from_bits(w(1)),
                min_p: f32::from_bits(w(2)),
                top_k: w(3),
                seed: u64::from(w(4)) | (u64::from(w(5)) << 32),
                seq: w(6),
                step: w(7),
            };
            draw.run(dview)
        } else {
            dfirst
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
            let slot = w(9);
            if slot != NO_SLOT && token < n {
                *counts.add(slot as usize * n + token) += 1;
            }
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
mod draw_tests;
