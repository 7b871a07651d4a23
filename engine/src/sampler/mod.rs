//! Turning a logits row into a token.
//!
//! [`Sampler::greedy`] is the fast path (argmax); [`sample_row`] applies a
//! request's [`SamplingParams`] (penalties, temperature, top-k / top-p /
//! min-p, seeded draw, top logprobs); [`params`] validates them;
//! [`prompt::prompt_logprob`] scores a prompt token (`prompt_logprobs`).
//!
//! Invariants: ties go to the lowest token id; NaN logits are never chosen
//! (a row of only NaN yields token 0 with logprob NaN); the logprob is
//! `logit - logsumexp(row)` over the finite logits. Cost: O(vocab) per row.

pub mod device;
pub mod ops;
pub mod params;
pub mod prompt;

pub use ops::{greedy_on_device, sample_row, top_logprobs, uniform, SampleOut, SeqContext};
pub use params::{SamplingParams, MAX_LOGPROBS};
pub use prompt::{prompt_logprob, PromptLogprob};

/// One chosen token.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sampled {
    pub token: u32,
    /// Natural log of the token's softmax probability.
    pub logprob: f32,
}

/// Chooses tokens from logits rows.
#[derive(Debug, Clone, Copy, Default)]
pub struct Sampler;

impl Sampler {
    /// Greedy choice for each row (rows in parallel when there are several).
    pub fn greedy_rows(&self, logits: &engine_core::Logits) -> Vec<Sampled> {
        use rayon::prelude::*;
        if logits.rows < 2 {
            return (0..logits.rows)
                .map(|r| self.greedy(logits.row(r)))
                .collect();
        }
        logits
            .data
            .par_chunks(logits.vocab.max(1))
            .take(logits.rows)
            .map(|row| self.greedy(row))
            .collect()
    }

    /// Greedy choice: the argmax of `row`. Three vectorizable passes: the
    /// maximum, its first index, the log-sum-exp.
    pub fn greedy(&self, row: &[f32]) -> Sampled {
        let max = max_ignoring_nan(row);
        match first_index_of(row, max) {
            Some(token) => Sampled {
                token,
                logprob: max - log_sum_exp(row, max),
            },
            // Only NaN.
            None => Sampled {
                token: 0,
                logprob: f32::NAN,
            },
        }
    }
}

/// The first index holding `max` (the argmax given the row's maximum);
/// `None` when the row is only NaN.
fn first_index_of(row: &[f32], max: f32) -> Option<u32> {
    row.iter().position(|&v| v == max).map(|i| i as u32)
}

/// The largest non-NaN value (`-inf` when there is none). Eight lanes so
/// the loop vectorizes; NaN never wins a `>` comparison.
fn max_ignoring_nan(row: &[f32]) -> f32 {
    let mut lanes = [f32::NEG_INFINITY; 8];
    let chunks = row.chunks_exact(8);
    let tail = chunks.remainder();
    for c in chunks {
        for (m, &v) in lanes.iter_mut().zip(c) {
            *m = if v > *m { v } else { *m };
        }
    }
    lanes
        .iter()
        .chain(tail)
        .fold(f32::NEG_INFINITY, |m, &v| if v > m { v } else { m })
}

/// `log(sum(exp(x)))` over the non-NaN entries, given their maximum.
/// Eight independent lanes so the loop vectorizes; `exp` is [`fast_exp`].
fn log_sum_exp(row: &[f32], max: f32) -> f32 {
    if max.is_infinite() {
        return max;
    }
    let mut lanes = [0.0f32; 8];
    let chunks = row.chunks_exact(8);
    let tail = chunks.remainder();
    for c in chunks {
        for (acc, &v) in lanes.iter_mut().zip(c) {
            // NaN fails the comparison and contributes 0.
            let e = fast_exp(v - max);
            *acc += if v >= f32::NEG_INFINITY { e } else { 0.0 };
        }
    }
    let mut sum: f64 = lanes.iter().map(|&x| f64::from(x)).sum();
    for &v in tail.iter().filter(|v| !v.is_nan()) {
        sum += f64::from(fast_exp(v - max));
    }
    max + sum.ln() as f32
}

/// `e^x` for `x <= 0` (see `gpu_kernels::sampling::exp_poly`: the one
/// definition the CPU sampler and the sampling kernel share).
pub use gpu_kernels::sampling::exp_poly as fast_exp;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_takes_argmax_with_softmax_logprob() {
        let s = Sampler.greedy(&[0.0, 2.0, 1.0]);
        assert_eq!(s.token, 1);
        // softmax(2) among {0,1,2}: e^2 / (1 + e + e^2) = 0.66524...
        assert!((s.logprob - 0.665_240_9f32.ln()).abs() < 1e-5);
    }

    #[test]
    fn ties_go_to_lowest_id_and_nan_is_skipped() {
        assert_eq!(Sampler.greedy(&[f32::NAN, 3.0, 3.0]).token, 1);
        let s = Sampler.greedy(&[f32::NAN, f32::NAN]);
        assert_eq!(s.token, 0);
        assert!(s.logprob.is_nan());
    }

    #[test]
    fn fast_exp_is_accurate() {
        let mut x = -87.0f32;
        while x <= 0.0 {
            let (got, want) = (fast_exp(x), x.exp());
            assert!(
                ((got - want) / want).abs() < 5e-7,
                "exp({x}) = {got}, want {want}"
            );
            x += 0.0137;
        }
        assert_eq!(fast_exp(0.0), 1.0);
    }

    #[test]
    fn logprob_of_a_long_row_matches_f64() {
        let row: Vec<f32> = (0..49_157)
            .map(|i| ((i * 7919) % 1000) as f32 / 97.0)
            .collect();
        let s = Sampler.greedy(&row);
        let max = f64::from(row[s.token as usize]);
        let lse = max
            + row
                .iter()
                .map(|&v| (f64::from(v) - max).exp())
                .sum::<f64>()
                .ln();
        assert!((f64::from(s.logprob) - (max - lse)).abs() < 1e-5, "{s:?}");
    }

    #[test]
    fn certain_token_has_logprob_zero() {
        let s = Sampler.greedy(&[f32::NEG_INFINITY, 5.0, f32::NEG_INFINITY]);
        assert_eq!(s.token, 1);
        assert!(s.logprob.abs() < 1e-6);
    }
}
