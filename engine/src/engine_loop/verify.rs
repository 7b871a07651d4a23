//! Verifying speculative proposals (see `crate::spec`): each sequence's
//! proposal rows are drawn in order, each exactly as the sequence's next
//! token would be drawn without speculation (its processing, its seeded
//! uniform at that output position, its penalties over the tokens before
//! it), and a proposal is accepted while it equals the draw.
//!
//! Invariants: `accept` stops at the first draw that differs from its
//! proposal (that draw is kept: the corrected token) or after the last
//! proposal (its row's draw is the bonus token), so a sequence gains
//! `accepted + 1` tokens; a draw never looks at later proposals.
//!
//! Cost: O(accepted x vocab) per sequence on the host path (sequences in
//! parallel); on the device paths every proposal row is reduced or drawn
//! there and only its id and logprobs come back (12 bytes per greedy row).

use super::LlmEngine;
use crate::executor::Logits;
use crate::sampler::{sample_row, SampleOut, SeqContext};
use crate::scheduler::{Draw, SchedulerOutput};

/// Draws after `first` while each equals its proposal: `draw(j)` draws the
/// row of proposal `j` (the distribution of the token after it).
fn accept(
    proposals: &[u32],
    first: u32,
    mut draw: impl FnMut(usize) -> Option<SampleOut>,
) -> Vec<SampleOut> {
    let mut more = Vec::new();
    let mut current = first;
    for (j, &p) in proposals.iter().enumerate() {
        if current != p {
            break;
        }
        let Some(d) = draw(j) else {
            break;
        };
        current = d.token;
        more.push(d);
    }
    more
}

impl LlmEngine {
    /// The host's verification: `draws`/`sampled` are the step's plain
    /// draws (a draw's `row` is its target's index), `logits` has every
    /// row of `sched`.
    pub(super) fn verify_host(
        &self,
        sched: &SchedulerOutput,
        draws: &[Draw],
        sampled: &[Option<SampleOut>],
        logits: &Logits,
    ) -> Vec<Vec<SampleOut>> {
        use rayon::prelude::*;
        let rows = sched.spec_rows();
        let scheduler = &self.scheduler;
        let one = |i: usize| -> Vec<SampleOut> {
            let st = &sched.spec[i];
            let first = draws
                .iter()
                .zip(sampled)
                .find(|(d, _)| d.row == st.target)
                .and_then(|(_, s)| s.as_ref().map(|s| s.token));
            let Some(t) = sched.targets.get(st.target) else {
                return Vec::new();
            };
            let (Some(first), Some(g)) = (first, scheduler.group(t.request_id)) else {
                return Vec::new();
            };
            let Some(seq) = g.seqs.get(t.seq_index) else {
                return Vec::new();
            };
            let Some(history) = seq.tokens.get(..t.num_tokens) else {
                return Vec::new();
            };
            let stops = scheduler.stop_ids(g);
            let bias = &g.params.sampling.logit_bias;
            let mut tokens = history.to_vec();
            accept(&st.proposals, first, |j| {
                tokens.push(st.proposals[j]);
                let ctx = SeqContext {
                    params: &g.params.sampling,
                    tokens: &tokens,
                    prompt_len: seq.prompt_len,
                    seed: g.seed,
                    seq_index: t.seq_index,
                    stop_ids: &stops,
                };
                let r = rows[i] + j;
                let row = logits.data.get(r * logits.vocab..(r + 1) * logits.vocab)?;
                Some(if bias.is_empty() {
                    sample_row(row, &ctx)
                } else {
                    let mut biased = row.to_vec();
                    for &(t, b) in bias {
                        if let Some(v) = biased.get_mut(t as usize) {
                            *v += b;
                        }
                    }
                    sample_row(&biased, &ctx)
                })
            })
        };
        if sched.spec.len() < 2 {
            (0..sched.spec.len()).map(one).collect()
        } else {
            (0..sched.spec.len()).into_par_iter().map(one).collect()
        }
    }

    /// The device's verification: `rows` holds one draw per logits row of
    /// `sched` (a plain greedy step's argmax rows, or `Sampling::Device`
    /// draws where proposal `j`'s row was drawn at output position
    /// `output_len + j + 1`, as `verify_host` draws it), so the same rule
    /// gives the same tokens.
    pub(super) fn verify_rows(sched: &SchedulerOutput, rows: &[SampleOut]) -> Vec<Vec<SampleOut>> {
        sched
            .spec
            .iter()
            .zip(sched.spec_rows())
            .map(|(st, first_row)| {
                let Some(first) = rows.get(st.target).map(|r| r.token) else {
                    return Vec::new();
                };
                accept(&st.proposals, first, |j| rows.get(first_row + j).cloned())
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::accept;
    use crate::sampler::SampleOut;

    fn out(token: u32) -> SampleOut {
        SampleOut {
            token,
            logprob: 0.0,
            top_logprobs: Vec::new(),
        }
    }

    #[test]
    fn accepts_the_matching_prefix_and_keeps_the_correction() {
        // Target draws: 5 (= p0), 6 (= p1), 9 (!= p2 = 7): two accepted,
        // the correction 9 kept, p2's row never drawn.
        let draws = [6, 9, 1];
        let mut asked = Vec::new();
        let more = accept(&[5, 6, 7], 5, |j| {
            asked.push(j);
            Some(out(draws[j]))
        });
        let tokens: Vec<u32> = more.iter().map(|o| o.token).collect();
        assert_eq!(tokens, [6, 9]);
        assert_eq!(asked, [0, 1]);
        // First draw differs: nothing accepted, no proposal row drawn.
        assert!(accept(&[5, 6], 4, |_| panic!("must not draw")).is_empty());
        // All accepted: the last row's draw is the bonus token.
        let more = accept(&[5, 6], 5, |j| Some(out([6, 8][j])));
        assert_eq!(more.iter().map(|o| o.token).collect::<Vec<_>>(), [6, 8]);
    }
}
