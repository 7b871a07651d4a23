//! Sampling parameters (OpenAI / vLLM names and semantics) and their
//! validation.
//!
//! Invariant: a [`SamplingParams`] that passed [`SamplingParams::validate`]
//! never makes the sampler panic or divide by zero: temperature is finite and
//! non-negative, `top_p` in (0, 1], `min_p` in [0, 1], `top_k >= 1`,
//! `repetition_penalty > 0`, `best_of >= n >= 1`, `logprobs <= 20`,
//! `prompt_logprobs <= 20`.

use crate::error::EngineError;

/// Most top logprobs per token (OpenAI's limit).
pub const MAX_LOGPROBS: usize = 20;
/// Most sequences in one group.
pub const MAX_GROUP_WIDTH: usize = 128;

/// How one request's tokens are chosen. The default is greedy (temperature
/// 0), one sequence, no penalties: the engine's behaviour before sampling
/// existed. The server sets every field explicitly.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// Returned sequences.
    pub n: usize,
    /// Sequences generated (`None`: `n`); the best `n` by cumulative logprob
    /// are returned. With beam search it is the beam width.
    pub best_of: Option<usize>,
    /// 0 means greedy.
    pub temperature: f32,
    pub top_p: f32,
    /// `None`: no top-k cut.
    pub top_k: Option<usize>,
    pub min_p: f32,
    /// Subtracted once from every token already generated.
    pub presence_penalty: f32,
    /// Subtracted per occurrence in the generated tokens.
    pub frequency_penalty: f32,
    /// Divides positive / multiplies negative logits of every token in the
    /// prompt or the output (1 = off).
    pub repetition_penalty: f32,
    /// Seed of the request's generators (`None`: a fresh random seed).
    pub seed: Option<u64>,
    /// EOS and stop token ids are suppressed before this many output tokens.
    pub min_tokens: usize,
    /// Top logprobs returned per generated token (`None`: none).
    pub logprobs: Option<usize>,
    /// vLLM's `prompt_logprobs`: when set, the logprob and rank of every
    /// prompt token after the first, with this many top alternatives, are
    /// returned once (`None`: none). Such a request takes no prefix-cache
    /// hits while its prompt logprobs are incomplete.
    pub prompt_logprobs: Option<usize>,
    pub use_beam_search: bool,
    /// Beam score = cumulative logprob / output_len ^ length_penalty.
    pub length_penalty: f32,
    /// Beam search stops as soon as `width` hypotheses are finished.
    pub early_stopping: bool,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            n: 1,
            best_of: None,
            temperature: 0.0,
            top_p: 1.0,
            top_k: None,
            min_p: 0.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            repetition_penalty: 1.0,
            seed: None,
            min_tokens: 0,
            logprobs: None,
            prompt_logprobs: None,
            use_beam_search: false,
            length_penalty: 1.0,
            early_stopping: false,
        }
    }
}

fn invalid(param: &'static str, reason: impl Into<String>) -> EngineError {
    EngineError::InvalidParam {
        param,
        reason: reason.into(),
    }
}

impl SamplingParams {
    /// Sequences the group generates (beam width for beam search).
    pub fn width(&self) -> usize {
        self.best_of.unwrap_or(self.n).max(self.n).max(1)
    }

    /// True when no randomness is involved (temperature 0).
    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0
    }

    /// True when any penalty changes the logits.
    pub fn has_penalties(&self) -> bool {
        self.presence_penalty != 0.0
            || self.frequency_penalty != 0.0
            || self.repetition_penalty != 1.0
    }

    /// Whether outputs must wait for the group to finish (the best `n` of
    /// more, or beam search) instead of streaming.
    pub fn buffers_output(&self) -> bool {
        self.use_beam_search || self.width() > self.n
    }

    /// Checks every parameter; `max_tokens` is the request's limit.
    pub fn validate(&self, max_tokens: Option<usize>) -> Result<(), EngineError> {
        self.validate_counts(max_tokens)?;
        self.validate_distribution()?;
        self.validate_penalties()?;
        if !self.length_penalty.is_finite() {
            return Err(invalid("length_penalty", "must be finite"));
        }
        if self.use_beam_search && !self.is_greedy() {
            return Err(invalid("temperature", "must be 0 with beam search"));
        }
        Ok(())
    }

    fn validate_counts(&self, max_tokens: Option<usize>) -> Result<(), EngineError> {
        if self.n == 0 || self.n > MAX_GROUP_WIDTH {
            return Err(invalid("n", format!("must be in 1..={MAX_GROUP_WIDTH}")));
        }
        if let Some(b) = self.best_of {
            if b < self.n || b > MAX_GROUP_WIDTH {
                return Err(invalid(
                    "best_of",
                    format!("must be in n..={MAX_GROUP_WIDTH}"),
                ));
            }
        }
        if self.logprobs.is_some_and(|k| k > MAX_LOGPROBS) {
            return Err(invalid(
                "logprobs",
                format!("must be at most {MAX_LOGPROBS}"),
            ));
        }
        if self.prompt_logprobs.is_some_and(|k| k > MAX_LOGPROBS) {
            return Err(invalid(
                "prompt_logprobs",
                format!("must be at most {MAX_LOGPROBS}"),
            ));
        }
        if max_tokens.is_some_and(|m| self.min_tokens > m) {
            return Err(invalid("min_tokens", "must not exceed max_tokens"));
        }
        Ok(())
    }

    fn validate_distribution(&self) -> Result<(), EngineError> {
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return Err(invalid("temperature", "must be finite and >= 0"));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(invalid("top_p", "must be in (0, 1]"));
        }
        if self.top_k == Some(0) {
            return Err(invalid("top_k", "must be at least 1"));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return Err(invalid("min_p", "must be in [0, 1]"));
        }
        Ok(())
    }

    fn validate_penalties(&self) -> Result<(), EngineError> {
        for (name, v) in [
            ("presence_penalty", self.presence_penalty),
            ("frequency_penalty", self.frequency_penalty),
        ] {
            if !(-2.0..=2.0).contains(&v) {
                return Err(invalid(name, "must be in [-2, 2]"));
            }
        }
        if !(self.repetition_penalty.is_finite() && self.repetition_penalty > 0.0) {
            return Err(invalid("repetition_penalty", "must be finite and > 0"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn param_of(e: EngineError) -> &'static str {
        match e {
            EngineError::InvalidParam { param, .. } => param,
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn defaults_are_valid_and_greedy() {
        let p = SamplingParams::default();
        assert!(p.validate(Some(16)).is_ok());
        assert!(p.is_greedy());
        assert_eq!(p.width(), 1);
        for k in [0, MAX_LOGPROBS] {
            let p = SamplingParams {
                prompt_logprobs: Some(k),
                ..SamplingParams::default()
            };
            assert!(p.validate(Some(16)).is_ok(), "prompt_logprobs {k}");
        }
    }

    #[test]
    fn each_bad_parameter_is_named() {
        let d = SamplingParams::default;
        let cases: Vec<(SamplingParams, &str)> = vec![
            (SamplingParams { n: 0, ..d() }, "n"),
            (
                SamplingParams {
                    n: 3,
                    best_of: Some(2),
                    ..d()
                },
                "best_of",
            ),
            (
                SamplingParams {
                    temperature: -0.1,
                    ..d()
                },
                "temperature",
            ),
            (
                SamplingParams {
                    temperature: f32::NAN,
                    ..d()
                },
                "temperature",
            ),
            (SamplingParams { top_p: 0.0, ..d() }, "top_p"),
            (SamplingParams { top_p: 1.5, ..d() }, "top_p"),
            (
                SamplingParams {
                    top_k: Some(0),
                    ..d()
                },
                "top_k",
            ),
            (SamplingParams { min_p: 1.5, ..d() }, "min_p"),
            (
                SamplingParams {
                    presence_penalty: 3.0,
                    ..d()
                },
                "presence_penalty",
            ),
            (
                SamplingParams {
                    frequency_penalty: -2.5,
                    ..d()
                },
                "frequency_penalty",
            ),
            (
                SamplingParams {
                    repetition_penalty: 0.0,
                    ..d()
                },
                "repetition_penalty",
            ),
            (
                SamplingParams {
                    logprobs: Some(21),
                    ..d()
                },
                "logprobs",
            ),
            (
                SamplingParams {
                    prompt_logprobs: Some(21),
                    ..d()
                },
                "prompt_logprobs",
            ),
            (
                SamplingParams {
                    min_tokens: 17,
                    ..d()
                },
                "min_tokens",
            ),
            (
                SamplingParams {
                    length_penalty: f32::INFINITY,
                    ..d()
                },
                "length_penalty",
            ),
            (
                SamplingParams {
                    use_beam_search: true,
                    temperature: 1.0,
                    ..d()
                },
                "temperature",
            ),
        ];
        for (p, name) in cases {
            let e = p.validate(Some(16)).expect_err(name);
            assert_eq!(param_of(e), name);
        }
    }
}
