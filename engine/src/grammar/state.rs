//! Per-sequence grammar matchers and the batch's masks.
//!
//! [`GrammarStates`] keeps one matcher per constrained sequence, keyed by
//! (request, sequence index). [`GrammarStates::compute_masks`] first brings
//! each matcher to its sequence's output tokens (the last step's sampled
//! token is consumed here, lazily), then asks for the allowed-token mask. The
//! engine runs it on its own thread while the executor's forward pass runs:
//! the masks depend only on tokens already known.
//!
//! Invariants:
//! - a matcher's `history` equals the output tokens it has consumed; before a
//!   mask is computed, the history is made equal to the sequence's output
//!   tokens (rollback of what differs, then consume what is new), so swap,
//!   recompute and forks cannot desynchronize it;
//! - a sequence new to the table (a fork child) starts from a copy of its
//!   group's sequence 0 (the parent), then follows its own tokens;
//! - a matcher that refuses a token (possible only when every allowed token
//!   was removed by another rule, e.g. `min_tokens` suppressing EOS) gives
//!   an EOS-only mask from then on and logs why;
//! - entries of requests that are gone are dropped by [`GrammarStates::retain`].
//!
//! Cost: per constrained row one `llguidance` mask (see the module above)
//! plus one consume per new token; rows are processed in parallel (rayon).

use super::{CompiledGrammar, Mask};
use engine_core::RequestId;
use llguidance::Matcher;
use std::collections::HashMap;

/// One sequence's matcher and the tokens it consumed.
struct SeqMatcher {
    matcher: Matcher,
    history: Vec<u32>,
    /// Set when the matcher refused a token: the sequence may only end.
    failed: bool,
}

impl SeqMatcher {
    fn new(g: &CompiledGrammar) -> Self {
        Self {
            matcher: g.start_matcher(),
            history: Vec::new(),
            failed: false,
        }
    }

    fn fork(&self) -> Self {
        Self {
            matcher: self.matcher.deep_clone(),
            history: self.history.clone(),
            failed: self.failed,
        }
    }

    /// Makes `history` equal `output`: rolls back past the common prefix,
    /// consumes the rest. Falls back to a rebuild when rollback fails.
    fn follow(&mut self, g: &CompiledGrammar, output: &[u32]) {
        if self.failed {
            return;
        }
        let common = self
            .history
            .iter()
            .zip(output)
            .take_while(|(a, b)| a == b)
            .count();
        if common < self.history.len() {
            let back = self.history.len() - common;
            if self.matcher.rollback(back).is_err() {
                *self = Self::new(g);
                return self.follow(g, output);
            }
            self.history.truncate(common);
        }
        for &t in &output[common..] {
            if let Err(e) = self.matcher.consume_token(t) {
                tracing::warn!(token = t, error = %e, "grammar refused a token; the sequence may only end now");
                self.failed = true;
                return;
            }
            self.history.push(t);
        }
    }

    fn mask(&mut self, g: &CompiledGrammar) -> Mask {
        let eos = g.eos();
        if self.failed {
            return Mask::only(eos, g.vocab_size());
        }
        match self.matcher.compute_mask_or_eos() {
            Ok(v) if !v.is_zero() => Mask::from_vob(&v, g.vocab_size()),
            Ok(_) => Mask::only(eos, g.vocab_size()),
            Err(e) => {
                tracing::warn!(error = %e, "grammar mask failed; the sequence may only end now");
                self.failed = true;
                Mask::only(eos, g.vocab_size())
            }
        }
    }
}

/// One row that needs a mask.
#[derive(Debug, Clone, Copy)]
pub struct MaskWork<'a> {
    /// The logits row.
    pub row: usize,
    pub request_id: RequestId,
    pub seq_index: usize,
    pub grammar: &'a CompiledGrammar,
    /// The sequence's output tokens so far.
    pub output: &'a [u32],
}

/// Matchers of every live constrained sequence.
#[derive(Default)]
pub struct GrammarStates {
    groups: HashMap<RequestId, Vec<Option<SeqMatcher>>>,
}

impl GrammarStates {
    /// Number of sequences with a matcher.
    pub fn len(&self) -> usize {
        self.groups
            .values()
            .map(|v| v.iter().flatten().count())
            .sum()
    }

    /// Whether no sequence has a matcher.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Brings each row's matcher to its tokens and computes its mask.
    /// Returns `(row, mask)` pairs.
    pub fn compute_masks(&mut self, work: &[MaskWork<'_>]) -> Vec<(usize, Mask)> {
        use rayon::prelude::*;
        // Create missing matchers first (fork children copy sequence 0).
        for w in work {
            let seqs = self.groups.entry(w.request_id).or_default();
            if seqs.len() <= w.seq_index {
                seqs.resize_with(w.seq_index + 1, || None);
            }
            if seqs[w.seq_index].is_none() {
                let fresh = match seqs.first().and_then(Option::as_ref) {
                    Some(parent) if w.seq_index > 0 => parent.fork(),
                    _ => SeqMatcher::new(w.grammar),
                };
                seqs[w.seq_index] = Some(fresh);
            }
        }
        // Pair each row with its matcher (distinct (request, seq) per row).
        let mut by_key: HashMap<(RequestId, usize), &MaskWork<'_>> = HashMap::new();
        for w in work {
            by_key.insert((w.request_id, w.seq_index), w);
        }
        let mut jobs: Vec<(&MaskWork<'_>, &mut SeqMatcher)> = Vec::with_capacity(work.len());
        for (id, seqs) in self.groups.iter_mut() {
            for (i, m) in seqs.iter_mut().enumerate() {
                if let (Some(w), Some(m)) = (by_key.get(&(*id, i)), m.as_mut()) {
                    jobs.push((w, m));
                }
            }
        }
        jobs.par_iter_mut()
            .map(|(w, m)| {
                m.follow(w.grammar, w.output);
                (w.row, m.mask(w.grammar))
            })
            .collect()
    }

    /// Drops the matchers of requests for which `live` is false.
    pub fn retain(&mut self, mut live: impl FnMut(RequestId) -> bool) {
        self.groups.retain(|id, _| live(*id));
    }
}
