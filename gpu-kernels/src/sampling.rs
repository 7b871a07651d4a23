//! Sampling on the device (issue 14, item 1): greedy rows reduced to
//! `(token, max, sum)` so a greedy step downloads 12 bytes per row instead of
//! the row's `vocab` logits.
//!
//! Thread mapping: one block per logits row (grid x); thread `i` reads
//! elements `i, i + threads, ...` (coalesced); three block reductions (maximum,
//! first index of the maximum, sum of `exp(v - max)`). O(vocab) per block,
//! one pass over the row in memory plus two from cache.
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
