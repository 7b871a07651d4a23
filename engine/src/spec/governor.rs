//! Adaptive speculation (`"adaptive": true` in the speculative config):
//! speculate only while it pays, measured on this machine and workload.
//!
//! Speculation pays when a step that verifies proposals costs less than
//! the tokens it emits would cost in plain steps. Where a step is bound by
//! reading the weights (a GPU at small batch) a `k + 1` row step costs
//! about one step; where it is bound by arithmetic (a CPU with few cores:
//! each activation row costs its own integer work) it costs nearly `k + 1`
//! steps and speculation loses unless almost everything is accepted. Which
//! case holds, and how much is accepted, depends on the machine, the model
//! and the requests, so the governor measures:
//!
//! - `c_plain`, `c_spec`: wall time per sampled row of plain and of
//!   speculating decode steps (moving averages; a step's time depends on
//!   its rows, not on what the text says, so a few steps suffice);
//! - `r`: tokens accepted per sampled row in speculating steps (a slower
//!   average: acceptance varies along a text).
//!
//! and speculates while `c_spec < 0.95 c_plain (1 + r)` (a speculating
//! step's cost per emitted token below a plain step's, by a margin: within
//! the noise, plain decoding is kept). The averages weigh their first
//! samples equally, so an unusual first probe does not set them.
//! Whichever mode it is not in gets a [`WINDOW`]-step probe every
//! [`HOLD`] counted steps, to keep its average fresh as requests come and
//! go. Before both modes have
//! been measured it probes plain first, then speculation.
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
    /// Proposals accepted (0 in a plain step).
    pub accepted: usize,
    /// Whether the step verified proposals.
    pub speculated: bool,
}

/// The adaptive switch (see the module docs).
#[derive(Debug, Clone, PartialEq)]
pub struct Governor {
    on: bool,
    /// Counted steps until the next probe (or, probing, until it ends).
    left: usize,
    probing: bool,
    plain: Avg,
    spec: Avg,
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
            plain: Avg::default(),
            spec: Avg::default(),
            accept: Avg::default(),
        }
    }

    /// Whether the next step speculates.
    pub fn speculate(&self) -> bool {
        self.on
    }

    /// Records a counted step (see the module docs).
    pub fn record(&mut self, s: StepSample) {
        if s.rows == 0 {
            return;
        }
        let per_row = s.secs / s.rows as f64;
        if s.speculated {
            self.spec.add(per_row, COST_WEIGHT);
            self.accept
                .add(s.accepted as f64 / s.rows as f64, ACCEPT_WEIGHT);
        } else {
            self.plain.add(per_row, COST_WEIGHT);
        }
        self.left = self.left.saturating_sub(1);
        if self.left > 0 {
            return;
        }
        match (self.plain.get(), self.spec.get().zip(self.accept.get())) {
            (Some(plain), Some((spec, r))) => {
                let pays = spec < MARGIN * plain * (1.0 + r);
                tracing::debug!(
                    plain_ms_per_row = plain * 1e3,
                    spec_ms_per_row = spec * 1e3,
                    accepted_per_row = r,
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

    /// Runs `steps` counted steps at batch 1 where a plain step costs 1 s
    /// and a speculating one `spec_secs` with `accepted` tokens accepted;
    /// returns the share of steps that speculated.
    fn share_on(g: &mut Governor, steps: usize, spec_secs: f64, accepted: usize) -> f64 {
        let mut on = 0;
        for _ in 0..steps {
            let speculated = g.speculate();
            on += usize::from(speculated);
            g.record(StepSample {
                secs: if speculated { spec_secs } else { 1.0 },
                rows: 1,
                accepted: if speculated { accepted } else { 0 },
                speculated,
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
            let speculated = g.speculate();
            on += usize::from(speculated);
            let accepted = if speculated && spec_steps == 0 { 3 } else { 0 };
            spec_steps += usize::from(speculated);
            g.record(StepSample {
                secs: if speculated { 1.6 } else { 1.0 },
                rows: 1,
                accepted,
                speculated,
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
        assert!(!g.speculate());
        // One plain step twice as slow as usual (the machine is shared).
        g.record(StepSample {
            secs: 2.0,
            rows: 1,
            accepted: 0,
            speculated: false,
        });
        let share = share_on(&mut g, 200, 3.5, 1);
        assert!(share < 0.15, "{share}");
    }
}
