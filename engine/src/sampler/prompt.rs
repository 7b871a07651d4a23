//! Prompt logprobs (vLLM's `prompt_logprobs`): for prompt token `i > 0`, its
//! logprob given tokens `0..i`, its rank, and the top-k alternatives, all
//! from the raw log-softmax of the logits row at position `i - 1`.
//!
//! Invariants: `rank` is vLLM's, `1 + #{tokens with a strictly larger
//! logit}` (so the argmax has rank 1); `top` is best first with ties towards
//! the lowest id (the same order as generated tokens' top logprobs); NaN
//! logits never count as larger. Cost: O(V) per row plus O(V + k log k) for
//! the top-k.

use super::ops::top_logprobs;
use super::{log_sum_exp, max_ignoring_nan};

/// One prompt token's logprob entry.
#[derive(Debug, Clone, PartialEq)]
pub struct PromptLogprob {
    /// The prompt token.
    pub token: u32,
    /// Natural log of its probability given the tokens before it.
    pub logprob: f32,
    /// 1-based rank of the token in the row (1 = most likely).
    pub rank: usize,
    /// The `k` most likely tokens `(token, logprob)`, best first.
    pub top: Vec<(u32, f32)>,
}

/// The entry of `token` in `row` with the `k` best alternatives.
/// A token outside the row gets logprob `-inf` and the last rank.
pub fn prompt_logprob(row: &[f32], token: u32, k: usize) -> PromptLogprob {
    let lse = log_sum_exp(row, max_ignoring_nan(row));
    let logit = row
        .get(token as usize)
        .copied()
        .unwrap_or(f32::NEG_INFINITY);
    let larger = row.iter().filter(|&&v| v > logit).count();
    PromptLogprob {
        token,
        logprob: if logit.is_nan() {
            f32::NAN
        } else {
            logit - lse
        },
        rank: larger + 1,
        top: top_logprobs(row, k),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logprob_rank_and_top_of_a_small_row() {
        // log-softmax of [1, 3, 2, 3]: lse = ln(e + 2e^3 + e^2).
        let row = [1.0f32, 3.0, 2.0, 3.0];
        let lse = (1f64.exp() + 2.0 * 3f64.exp() + 2f64.exp()).ln();
        let p = prompt_logprob(&row, 2, 2);
        assert_eq!(p.token, 2);
        assert!((f64::from(p.logprob) - (2.0 - lse)).abs() < 1e-5);
        assert_eq!(p.rank, 3);
        assert_eq!(p.top.len(), 2);
        assert_eq!((p.top[0].0, p.top[1].0), (1, 3));
        assert!((f64::from(p.top[0].1) - (3.0 - lse)).abs() < 1e-5);
        assert_eq!(prompt_logprob(&row, 1, 0).rank, 1);
        assert!(prompt_logprob(&row, 1, 0).top.is_empty());
    }

    #[test]
    fn token_outside_the_row_is_impossible() {
        let p = prompt_logprob(&[0.0, 1.0], 9, 1);
        assert_eq!(p.logprob, f32::NEG_INFINITY);
        assert_eq!(p.rank, 3);
    }
}
