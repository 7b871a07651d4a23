//! The logits processing of the device draw (issue 14): `logit_bias`, the
//! three penalties from per-sequence token counts kept on the device, and
//! `min_tokens` suppression, in the CPU sampler's order and definitions
//! (`engine::sampler::ops::sample_row`).
//!
//! The count table: `[slots, vocab]` `u32`, one row per live sequence that
//! needs penalties. Entry `t` of a slot is [`PROMPT_BIT`] when token `t` is
//! in the sequence's prompt, plus the number of times `t` occurs in its
//! output. [`fill_counts`] writes a slot from a sparse list the host computed
//! once per sequence; the sampling kernel (`sampling::sample_rows`) adds 1 at
//! each drawn token, so afterwards nothing is uploaded per step.
//!
//! [`penalize_rows`], one block per processed row:
//! 1. adds the row's bias list to the logits row in place (the reported
//!    logprobs are those of the biased row, as on the CPU);
//! 2. writes a copy of the biased row with the penalties applied (vLLM's
//!    definitions: repetition divides a positive logit by the penalty and
//!    multiplies a non-positive one, for every token seen in the prompt or
//!    the output; frequency and presence subtract `f * count + p` for every
//!    token of the output);
//! 3. sets the row's suppressed ids (stop tokens before `min_tokens`) to
//!    `-inf` in the copy. The draw reads the copy.
//!
//! Invariants: a slot's row reflects exactly the tokens the host counted
//! plus one per draw since; rows of one launch use distinct slots (one
//! sequence per row). Ids at or past `vocab` are ignored. Cost:
//! [`fill_counts`] O(vocab + distinct tokens) per filled slot, once per
//! sequence; [`penalize_rows`] two passes over the row (read counts and
//! logits, write the copy) plus the bias list (one thread) and the
//! suppressed ids.

use crate::device::{block_dim_x, block_idx_x, sync_threads, thread_idx_x};

/// Words per processed row of [`penalize_rows`]: the logits row, the slot
/// ([`NO_SLOT`]: no penalties), repetition, frequency and presence
/// penalties (f32 bits), the bias pairs' start and count in `lists` (pairs
/// of token and f32 bits), the suppressed ids' start and count in `lists`.
pub const PEN_WORDS: usize = 9;
/// Words per slot fill of [`fill_counts`]: the slot, the first pair and the
/// number of pairs in `pairs` (pairs of token and packed count).
pub const FILL_WORDS: usize = 3;
/// No slot / no processed row.
pub const NO_SLOT: u32 = u32::MAX;
/// Marks a token of the prompt in a count entry; the low 31 bits count the
/// token's occurrences in the output.
pub const PROMPT_BIT: u32 = 1 << 31;

/// A count entry: the prompt bit and the output occurrences.
#[inline(always)]
pub const fn pack_count(in_prompt: bool, output_count: u32) -> u32 {
    (if in_prompt { PROMPT_BIT } else { 0 }) | (output_count & !PROMPT_BIT)
}

/// The CPU sampler's penalties on one logit `v` with count entry `c`
/// (see the module docs). Plain `f32` arithmetic (the device may fuse the
/// multiply-add: ulp-level differences).
#[inline(always)]
pub fn penalized(v: f32, c: u32, repetition: f32, frequency: f32, presence: f32) -> f32 {
    if c == 0 {
        return v;
    }
    let mut v = v;
    if repetition != 1.0 {
        v = if v > 0.0 {
            v / repetition
        } else {
            v * repetition
        };
    }
    let out = c & !PROMPT_BIT;
    if out > 0 {
        v -= frequency * out as f32 + presence;
    }
    v
}

/// For fill `f` (block `f`) of `fills`: zeroes slot `fills[3f]` of `counts`,
/// then stores each of its pairs `(token, entry)`.
///
/// # Safety
/// `counts`: `[slots, vocab]` with every filled slot below `slots`; `fills`:
/// `[grid x, FILL_WORDS]`; `pairs` holds every pair the fills name, each
/// token at most once per fill; 1-D blocks, a multiple of 32 threads.
pub unsafe fn fill_counts(counts: *mut u32, fills: *const u32, pairs: *const u32, vocab: u32) {
    let n = vocab as usize;
    let (tid, threads) = (thread_idx_x() as usize, block_dim_x() as usize);
    // SAFETY: per the function contract.
    unsafe {
        let f = fills.add(block_idx_x() as usize * FILL_WORDS);
        let row = counts.add(*f as usize * n);
        let (start, len) = (*f.add(1) as usize, *f.add(2) as usize);
        let mut i = tid;
        while i < n {
            *row.add(i) = 0;
            i += threads;
        }
        sync_threads();
        let mut j = tid;
        while j < len {
            let p = pairs.add(2 * (start + j));
            let token = *p as usize;
            if token < n {
                *row.add(token) = *p.add(1);
            }
            j += threads;
        }
    }
}

/// For processed row `j` (block `j`) with its [`PEN_WORDS`] words of
/// `rows`: biases logits row `rows[9j]` in place and writes its penalized,
/// suppressed copy to `out[j * vocab..]` (see the module docs).
///
/// # Safety
/// `out`: `[grid x, vocab]`; `logits`: `[rows, vocab]` holding every row
/// named; `counts`: `[slots, vocab]` holding every slot named (other than
/// [`NO_SLOT`]); `rows`: `[grid x, PEN_WORDS]`; `lists` holds every range
/// named; distinct blocks name distinct logits rows; 1-D blocks, a multiple
/// of 32 threads.
pub unsafe fn penalize_rows(
    out: *mut f32,
    logits: *mut f32,
    counts: *const u32,
    rows: *const u32,
    lists: *const u32,
    vocab: u32,
) {
    let n = vocab as usize;
    let (tid, threads) = (thread_idx_x() as usize, block_dim_x() as usize);
    let j = block_idx_x() as usize;
    // SAFETY: per the function contract, every access is inside this
    // block's logits row, copy, slot or list ranges.
    unsafe {
        let w = rows.add(j * PEN_WORDS);
        let word = |k: usize| *w.add(k);
        let x = logits.add(word(0) as usize * n);
        if tid == 0 {
            // One thread, in list order: a repeated id adds twice, as on the CPU.
            let (start, len) = (word(5) as usize, word(6) as usize);
            for k in 0..len {
                let p = lists.add(2 * k + start);
                let token = *p as usize;
                if token < n {
                    *x.add(token) += f32::from_bits(*p.add(1));
                }
            }
        }
        sync_threads();
        let slot = word(1);
        let (rep, freq, pres) = (
            f32::from_bits(word(2)),
            f32::from_bits(word(3)),
            f32::from_bits(word(4)),
        );
        let o = out.add(j * n);
        let mut i = tid;
        while i < n {
            let v = *x.add(i);
            *o.add(i) = if slot == NO_SLOT {
                v
            } else {
                penalized(v, *counts.add(slot as usize * n + i), rep, freq, pres)
            };
            i += threads;
        }
        sync_threads();
        let (start, len) = (word(7) as usize, word(8) as usize);
        let mut k = tid;
        while k < len {
            let token = *lists.add(start + k) as usize;
            if token < n {
                *o.add(token) = f32::NEG_INFINITY;
            }
            k += threads;
        }
    }
}

#[cfg(all(test, not(target_arch = "nvptx64")))]
mod tests {
    use super::*;
    use crate::entries::emulate;
    use crate::launch::per_row;
    use crate::sig::KernelArg;
    use std::vec;
    use std::vec::Vec;

    #[test]
    fn fill_then_penalize_follows_the_definitions() {
        let vocab = 70usize;
        // Slot 1 gets: token 3 in the prompt only, token 5 in the prompt and
        // twice in the output, token 69 once in the output; slot 0 stays
        // garbage-free after a fill with no pairs.
        let mut counts = vec![7u32; 2 * vocab];
        let pairs: Vec<u32> = vec![
            3,
            pack_count(true, 0),
            5,
            pack_count(true, 2),
            69,
            pack_count(false, 1),
            500,
            1,
        ];
        let fills = [1u32, 0, 4, 0, 4, 0];
        let args = [
            KernelArg::Ptr(counts.as_mut_ptr() as u64),
            KernelArg::Ptr(fills.as_ptr() as u64),
            KernelArg::Ptr(pairs.as_ptr() as u64),
            KernelArg::U32(vocab as u32),
        ];
        // SAFETY: counts [2, vocab]; two fills of slots 1 and 0 over `pairs`.
        unsafe { emulate("fill_counts", per_row(2, 32), &args) }.expect("fill");
        let nonzero: Vec<(usize, u32)> = counts
            .iter()
            .enumerate()
            .filter(|(_, &c)| c != 0)
            .map(|(i, &c)| (i, c))
            .collect();
        assert_eq!(
            nonzero,
            vec![
                (vocab + 3, PROMPT_BIT),
                (vocab + 5, PROMPT_BIT | 2),
                (vocab + 69, 1)
            ]
        );
        // Two logits rows; processed row 0 is logits row 1 with slot 1,
        // bias +2 on token 4 (twice) and +3 on token 5, token 69 suppressed.
        let mut logits: Vec<f32> = (0..2 * vocab).map(|i| (i % 9) as f32 - 4.0).collect();
        let raw = logits.clone();
        let (rep, freq, pres) = (1.5f32, 0.25f32, 0.5f32);
        let lists: Vec<u32> = vec![
            4,
            2.0f32.to_bits(),
            5,
            3.0f32.to_bits(),
            4,
            2.0f32.to_bits(),
            69,
        ];
        let rows = [
            1u32,
            1,
            rep.to_bits(),
            freq.to_bits(),
            pres.to_bits(),
            0,
            3,
            6,
            1,
        ];
        let mut out = vec![f32::NAN; vocab];
        let args = [
            KernelArg::Ptr(out.as_mut_ptr() as u64),
            KernelArg::Ptr(logits.as_mut_ptr() as u64),
            KernelArg::Ptr(counts.as_ptr() as u64),
            KernelArg::Ptr(rows.as_ptr() as u64),
            KernelArg::Ptr(lists.as_ptr() as u64),
            KernelArg::U32(vocab as u32),
        ];
        // SAFETY: out [1, vocab], logits [2, vocab], counts [2, vocab].
        unsafe { emulate("penalize_rows", per_row(1, 64), &args) }.expect("penalize");
        // The bias lands in the logits row itself; row 0 is untouched.
        assert_eq!(logits[..vocab], raw[..vocab]);
        let b = |t: usize| raw[vocab + t];
        assert_eq!(logits[vocab + 4], b(4) + 2.0 + 2.0);
        assert_eq!(logits[vocab + 5], b(5) + 3.0);
        for t in 0..vocab {
            let v = logits[vocab + t];
            let want = match t {
                // Prompt only: repetition by the sign rule.
                3 => {
                    if v > 0.0 {
                        v / rep
                    } else {
                        v * rep
                    }
                }
                // Prompt and output twice: repetition, then 2 f + p.
                5 => (if v > 0.0 { v / rep } else { v * rep }) - (freq * 2.0 + pres),
                69 => f32::NEG_INFINITY,
                _ => v,
            };
            assert_eq!(out[t], want, "token {t}");
        }
        assert!(b(3) < 0.0 && b(5) + 3.0 > 0.0, "both signs are exercised");
    }
}
