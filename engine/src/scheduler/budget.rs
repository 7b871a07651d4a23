//! The per-step budget: tokens and sequences scheduled so far.
//!
//! Invariant: `num_batched_tokens <= token_budget` and
//! `num_seqs <= max_num_seqs` after every successful [`StepBudget::consume`].

/// What one step may still take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepBudget {
    token_budget: usize,
    max_num_seqs: usize,
    num_batched_tokens: usize,
    num_seqs: usize,
}

impl StepBudget {
    /// A fresh budget. Resident sequences count against `max_num_seqs`
    /// (through [`StepBudget::add_seqs`]) whether or not they get tokens.
    pub fn new(token_budget: usize, max_num_seqs: usize) -> Self {
        Self {
            token_budget,
            max_num_seqs,
            num_batched_tokens: 0,
            num_seqs: 0,
        }
    }

    /// Tokens still available this step.
    pub fn remaining_tokens(&self) -> usize {
        self.token_budget - self.num_batched_tokens
    }

    /// Whether `seqs` more resident sequences fit.
    pub fn has_seq_room(&self, seqs: usize) -> bool {
        self.num_seqs + seqs <= self.max_num_seqs
    }

    /// Records `tokens` scheduled tokens.
    pub fn consume_tokens(&mut self, tokens: usize) {
        debug_assert!(tokens <= self.remaining_tokens());
        self.num_batched_tokens += tokens.min(self.remaining_tokens());
    }

    /// Records `seqs` sequences made resident.
    pub fn add_seqs(&mut self, seqs: usize) {
        self.num_seqs += seqs;
    }

    /// Releases `seqs` sequences (a preempted group).
    pub fn remove_seqs(&mut self, seqs: usize) {
        self.num_seqs = self.num_seqs.saturating_sub(seqs);
    }

    /// Tokens scheduled so far.
    pub fn num_batched_tokens(&self) -> usize {
        self.num_batched_tokens
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budget_counts_tokens_and_seqs() {
        let mut b = StepBudget::new(10, 2);
        assert_eq!(b.remaining_tokens(), 10);
        b.consume_tokens(7);
        assert_eq!(b.remaining_tokens(), 3);
        b.add_seqs(2);
        assert!(!b.has_seq_room(1));
        b.remove_seqs(1);
        assert!(b.has_seq_room(1));
        assert_eq!(b.num_batched_tokens(), 7);
    }
}
