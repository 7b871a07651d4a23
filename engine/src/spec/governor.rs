//! Adaptive speculation (`"adaptive": true` in the speculative config):
//! speculate only while it pays, measured on this machine and workload.
//!
//! Speculation pays when the rows a step adds to verify proposals cost
//! less than the tokens they emit would cost in plain steps. Where a step
//! is bound by reading the weights (a GPU at small batch) an extra row
//! costs little; where it is bound by arithmetic (a CPU with few cores:
//! each activation row costs its own integer work) it costs nearly what a
//! sampled row does, and speculation loses unless almost everything is
//! accepted. Which case holds, and how much is accepted, depends on the
//! machine, the model and the requests, so the governor measures:
//!
//! - `c`: wall time per sampled row of plain decode steps;
//! - `x`: the extra wall time per drafted row (a proposal verified) of
//!   speculating steps, over what their sampled rows cost at `c`;
//! - `a`: tokens accepted per drafted row (a slower average: acceptance
//!   varies along a text);
//!
//! (moving averages; a step's time depends on its rows, not on what the
//! text says, so a few steps suffice) and speculates while
//! `x < 0.95 a c`: a drafted row must cost less than the tokens it is
//! expected to give would cost in plain rows, by a margin (within the
//! noise, plain decoding is kept). The averages weigh their first samples
//! equally, so an unusual first probe does not set them.
//!
//! Whichever mode it is not in gets a [`WINDOW`]-step probe every
//! [`HOLD`] counted steps, to keep its averages fresh as requests come and
//! go. Before both modes have been measured it probes plain first, then
//! speculation. A probe of speculation lets at most [`PROBE_SEQS`]
//! sequences draft ([`Drafting::Few`], a different few each step): `x`
//! and `a` are per drafted row, so a few sequences measure them, and at
//! a large batch, where speculation rarely pays, a probe then costs a few
//! extra rows instead of `k` per sequence (measured at batch 32 with all
//! sequences drafting: each probe step cost 2.6 plain steps, and probing
//! alone made adaptive decoding 10-15% slower than plain).
//!
//! Counted steps are decode steps (no prompt rows) in which some sequence
//! could speculate; other steps are ignored. Outputs are exact either way
//! (verification reproduces plain decoding), so switching changes speed
//! only.
//!
//! Cost: O(1) per step. The mode not chosen runs [`WINDOW`] of every
//! `WINDOW + HOLD` counted steps (~11%).

/// Counted steps of a probe of the mode not chosen.
pub const WINDOW: usize = 8;
/// Counted steps between probes.
pub const HOLD: usize = 64;
/// Most sequences that draft in a step probing speculation.
pub const PROBE_SEQS: usize = 4;
/// Weight of a step in the cost averages.
const COST_WEIGHT: f64 = 0.2;
/// Weight of a step in the acceptance average.
const ACCEPT_WEIGHT: f64 = 0.05;
/// Speculation must beat plain decoding by this factor to be chosen: where
/// the two are within the measurements' noise, switching wins little and
/// risks losing (the goal is never more than 5% slower than plain).
const MARGIN: f64 = 0.95;

/// A moving average whose first samples count equally (the `n`-th sample
/// weighs `max(1 / n, w)`): one unusual first step cannot set it for long
/// (with a plain moving average started at the first sample, a first
/// speculating step that happened to accept much held the acceptance up
/// for the whole run: measured 0.56 tokens per row against 0.25 true).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Avg {
    mean: f64,
    n: u32,
}

impl Avg {
    fn add(&mut self, x: f64, w: f64) {
        self.n = self.n.saturating_add(1);
        self.mean += w.max(1.0 / f64::from(self.n)) * (x - self.mean);
    }

    /// The average, once there is a sample.
    fn get(&self) -> Option<f64> {
        (self.n > 0).then_some(self.mean)
    }
}

/// What one counted step was.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepSample {
    /// Wall time of the step.
    pub secs: f64,
    /// Sampled rows (one per running sequence).
    pub rows: usize,
    /// Proposals verified (0 in a plain step).
    pub drafted: usize,
    /// Proposals accepted.
    pub accepted: usize,
}

/// Which sequences may draft in the next step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Drafting {
    /// None: a plain step.
    Off,
    /// At most `seqs` sequences (a probe), chosen cyclically from the
    /// `turn`-th group of `seqs` candidates.
    Few { seqs: usize, turn: usize },
    /// Every sequence with a proposal.
    All,
}

impl Drafting {
    /// The candidates' indices, out of `n`, in the order to ask for
    /// proposals, with the most that may draft.
    pub fn order(self, n: usize) -> (impl Iterator<Item = usize>, usize) {
        let (start, most) = match self {
            Drafting::Off => (0, 0),
            Drafting::Few { seqs, turn } => (turn.wrapping_mul(seqs) % n.max(1), seqs),
            Drafting::All => (0, n),
        };
        ((0..n).map(move |i| (start + i) % n), most.min(n))
    }
}

/// The adaptive switch (see the module docs).
#[derive(Debug, Clone, PartialEq)]
pub struct Governor {
    on: bool,
    /// Counted steps until the next probe (or, probing, until it ends).
    left: usize,
    probing: bool,
    /// Counted steps so far (rotates the probes' drafting sequences).
    steps: usize,
    plain: Avg,
    extra: Avg,
    accept: Avg,
}

impl Default for Governor {
    fn default() -> Self {
        Self::new()
    }
}

impl Governor {
    /// Starts by measuring plain steps.
    pub fn new() -> Self {
        Self {
            on: false,
            left: WINDOW,
            probing: true,
            steps: 0,
            plain: Avg::default(),
            extra: Avg::default(),
            accept: Avg::default(),
        }
    }

    /// Which sequences the next step lets draft.
    pub fn drafting(&self) -> Drafting {
        match (self.on, self.probing) {
            (false, _) => Drafting::Off,
            (true, true) => Drafting::Few {
                seqs: PROBE_SEQS,
                turn: self.steps,
            },
            (true, false) => Drafting::All,
        }
    }

    /// Records a counted step (see the module docs).
    pub fn record(&mut self, s: StepSample) {
        if s.rows == 0 {
            return;
        }
        self.steps = self.steps.wrapping_add(1);
        if s.drafted == 0 {
            self.plain.add(s.secs / s.rows as f64, COST_WEIGHT);
        } else if let Some(c) = self.plain.get() {
            let extra = (s.secs - c * s.rows as f64) / s.drafted as f64;
            self.extra.add(extra, COST_WEIGHT);
            let accepted = s.accepted as f64 / s.drafted as f64;
            self.accept.add(accepted, ACCEPT_WEIGHT);
        }
        self.left = self.left.saturating_sub(1);
        if self.left > 0 {
            return;
        }
        match (self.plain.get(), self.extra.get().zip(self.accept.get())) {
            (Some(c), Some((x, a))) => {
                let pays = x < MARGIN * a * c;
                tracing::debug!(
                    plain_ms_per_row = c * 1e3,
                    extra_ms_per_drafted_row = x * 1e3,
                    accepted_per_drafted_row = a,
                    speculate = pays,
                    "adaptive speculation"
                );
                // After a probe, the measured choice holds; after a hold,
                // the other mode is probed.
                (self.on, self.probing, self.left) = if self.probing {
                    (pays, false, HOLD)
                } else {
                    (!pays, true, WINDOW)
                };
            }
            // Not measured yet: plain first, then speculation.
            (Some(_), None) => (self.on, self.probing, self.left) = (true, true, WINDOW),
            (None, _) => (self.on, self.probing, self.left) = (false, true, WINDOW),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `steps` counted steps at batch 1 with k = 3 where a plain
    /// step costs 1 s and a speculating one `spec_secs` with `accepted`
    /// tokens accepted; returns the share of steps that speculated.
    fn share_on(g: &mut Governor, steps: usize, spec_secs: f64, accepted: usize) -> f64 {
        let mut on = 0;
        for _ in 0..steps {
            let speculated = g.drafting() != Drafting::Off;
            on += usize::from(speculated);
            g.record(StepSample {
                secs: if speculated { spec_secs } else { 1.0 },
                rows: 1,
                drafted: if speculated { 3 } else { 0 },
                accepted: if speculated { accepted } else { 0 },
            });
        }
        on as f64 / steps as f64
    }

    #[test]
    fn keeps_the_cheaper_mode_and_probes_the_other_rarely() {
        // 3 tokens for the time of 1.5 steps: speculation wins.
        let mut g = Governor::new();
        let share = share_on(&mut g, 800, 1.5, 2);
        assert!(share > 0.85, "{share}");
        // 4 rows cost 3.5 steps for 2 tokens (a CPU): it loses.
        let mut g = Governor::new();
        let share = share_on(&mut g, 800, 3.5, 1);
        assert!(share < 0.15, "{share}");
        assert!(share > 0.0, "the losing mode is still probed");
    }

    #[test]
    fn follows_a_workload_that_changes() {
        let mut g = Governor::new();
        share_on(&mut g, 400, 3.5, 1);
        // Requests whose outputs repeat their prompts arrive.
        share_on(&mut g, 2 * (WINDOW + HOLD), 1.2, 3);
        let share = share_on(&mut g, 400, 1.2, 3);
        assert!(share > 0.85, "{share}");
        // And leave again.
        share_on(&mut g, 2 * (WINDOW + HOLD), 3.5, 0);
        let share = share_on(&mut g, 400, 3.5, 0);
        assert!(share < 0.15, "{share}");
    }

    #[test]
    fn one_lucky_first_probe_does_not_keep_speculation_on() {
        // The first speculating step accepts 3 tokens, every later one
        // none: speculation (1.6 s a step) loses to plain (1 s).
        let mut g = Governor::new();
        let (mut on, mut spec_steps) = (0, 0);
        for _ in 0..400 {
            let speculated = g.drafting() != Drafting::Off;
            on += usize::from(speculated);
            let accepted = if speculated && spec_steps == 0 { 3 } else { 0 };
            spec_steps += usize::from(speculated);
            g.record(StepSample {
                secs: if speculated { 1.6 } else { 1.0 },
                rows: 1,
                drafted: if speculated { 3 } else { 0 },
                accepted,
            });
        }
        let share = on as f64 / 400.0;
        assert!(share < 0.2, "{share}");
    }

    #[test]
    fn within_the_noise_plain_decoding_is_kept() {
        // 2 tokens for the time of 1.98 plain steps: a 1% gain at best.
        let mut g = Governor::new();
        let share = share_on(&mut g, 800, 1.98, 1);
        assert!(share < 0.15, "{share}");
    }

    #[test]
    fn a_noisy_step_does_not_flip_the_choice() {
        let mut g = Governor::new();
        share_on(&mut g, 200, 3.5, 1);
        assert_eq!(g.drafting(), Drafting::Off);
        // One plain step twice as slow as usual (the machine is shared).
        g.record(StepSample {
            secs: 2.0,
            rows: 1,
            drafted: 0,
            accepted: 0,
        });
        let share = share_on(&mut g, 200, 3.5, 1);
        assert!(share < 0.15, "{share}");
    }

    /// Runs `steps` counted steps at batch 32 with k = 3, where every
    /// sequence has a proposal, a sampled row costs 1 s, a drafted row
    /// `x` s and accepts `a` tokens; returns (time per emitted token,
    /// share of steps in which every sequence drafted).
    fn batch_32(g: &mut Governor, steps: usize, x: f64, a: f64) -> (f64, f64) {
        let (mut secs, mut tokens, mut all) = (0.0, 0.0, 0);
        for _ in 0..steps {
            let drafting = g.drafting();
            let (order, most) = drafting.order(32);
            assert_eq!(order.count(), 32);
            all += usize::from(drafting == Drafting::All);
            let drafted = 3 * most;
            let s = StepSample {
                secs: 32.0 + x * drafted as f64,
                rows: 32,
                drafted,
                accepted: (a * drafted as f64).round() as usize,
            };
            secs += s.secs;
            tokens += (s.rows + s.accepted) as f64;
            g.record(s);
        }
        (secs / tokens, all as f64 / steps as f64)
    }

    #[test]
    fn probes_at_a_large_batch_cost_little_where_speculation_loses() {
        // A drafted row costs 0.9 of a sampled one and gives 0.3 tokens:
        // speculating every sequence would cost 1.95 s a token. Probes let
        // a few sequences draft, so adaptive decoding stays within 5% of
        // plain's 1 s a token (probing with all 32 would cost 18%).
        let mut g = Governor::new();
        let (per_token, all) = batch_32(&mut g, 1000, 0.9, 0.3);
        assert!(per_token < 1.05, "{per_token}");
        assert!(all < 0.05, "{all}");
    }

    #[test]
    fn a_few_drafting_sequences_find_where_speculation_wins() {
        // A drafted row costs 0.2 of a sampled one and gives 0.7 tokens:
        // speculating every sequence costs 0.52 s a token.
        let mut g = Governor::new();
        let (per_token, all) = batch_32(&mut g, 1000, 0.2, 0.7);
        assert!(all > 0.85, "{all}");
        assert!(per_token < 0.6, "{per_token}");
    }

    #[test]
    fn probes_rotate_over_the_candidates() {
        let mut seen = [false; 10];
        for turn in 0..3 {
            let (order, most) = Drafting::Few { seqs: 4, turn }.order(10);
            assert_eq!(most, 4);
            for i in order.take(most) {
                seen[i] = true;
            }
        }
        assert!(seen.iter().all(|&s| s), "{seen:?}");
        let (order, most) = Drafting::Off.order(5);
        assert_eq!((order.count(), most), (5, 0));
        let (order, most) = Drafting::Few { seqs: 4, turn: 7 }.order(2);
        assert_eq!((order.collect::<Vec<_>>(), most), (vec![0, 1], 2));
    }
}
