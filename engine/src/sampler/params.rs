//! Sampling parameters (OpenAI / vLLM names and semantics) and their
//! validation.
//!
//! This is the one declaration and the one range check of every sampling
//! parameter: the server parses JSON into these types and calls
//! [`SamplingParams::validate`], whose [`RequestError::InvalidParam`] names
//! the parameter for the HTTP 400's `param`.
//!
//! Invariant: a [`SamplingParams`] that passed [`SamplingParams::validate`]
//! never makes the sampler panic or divide by zero: temperature in [0, 2]
//! (OpenAI's range), `top_p` in (0, 1], `min_p` in [0, 1], `top_k >= 1`,
//! `repetition_penalty` in (0, 2], penalties in [-2, 2], `best_of >= n >= 1`
//! (at most 128), `logprobs <= 20`, `prompt_logprobs <= 20`, every
//! `logit_bias` value in [-100, 100] and finite, `length_penalty` finite.
//! Token ids (`logit_bias` keys) are checked against the vocabulary by the
//! caller, which knows it.

use crate::error::RequestError;

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
    /// OpenAI's `logit_bias`: `(token id, bias)` added to the logits before
    /// the draw (the reported logprobs include it). Empty: none.
    pub logit_bias: Vec<(u32, f32)>,
    /// A compiled grammar the output must follow (JSON schema, regex,
    /// choice, Lark): see [`crate::grammar`]. `None`: free output.
    pub structured: Option<crate::grammar::CompiledGrammar>,
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
            logit_bias: Vec::new(),
            structured: None,
        }
    }
}

/// Most distinct tokens in one `logit_bias` (OpenAI accepts 300).
pub const MAX_LOGIT_BIAS: usize = 300;

fn invalid(param: &'static str, reason: impl Into<String>) -> RequestError {
    RequestError::InvalidParam {
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
    pub fn validate(&self, max_tokens: Option<usize>) -> Result<(), RequestError> {
        self.validate_counts(max_tokens)?;
        self.validate_distribution()?;
        self.validate_penalties()?;
        if !self.length_penalty.is_finite() {
            return Err(invalid("length_penalty", "must be finite"));
        }
        if self.use_beam_search && !self.is_greedy() {
            return Err(invalid("temperature", "must be 0 with beam search"));
        }
        if self.use_beam_search && self.structured.is_some() {
            return Err(invalid(
                "structured_outputs",
                "structured outputs are not supported with beam search",
            ));
        }
        if self.structured.is_some() && self.min_tokens > 0 {
            // The grammar may be complete (EOS the only allowed token)
            // before min_tokens: nothing could be drawn.
            return Err(invalid(
                "min_tokens",
                "min_tokens cannot be combined with a structured output constraint",
            ));
        }
        if self.logit_bias.len() > MAX_LOGIT_BIAS {
            return Err(invalid(
                "logit_bias",
                format!("at most {MAX_LOGIT_BIAS} tokens"),
            ));
        }
        if let Some((t, b)) = self
            .logit_bias
            .iter()
            .find(|(_, b)| !(-100.0..=100.0).contains(b))
        {
            return Err(invalid(
                "logit_bias",
                format!("bias {b} of token {t} must be in [-100, 100]"),
            ));
        }
        Ok(())
    }

    fn validate_counts(&self, max_tokens: Option<usize>) -> Result<(), RequestError> {
        if self.n == 0 || self.n > MAX_GROUP_WIDTH {
            return Err(invalid(
                "n",
                format!("must be in [1, {MAX_GROUP_WIDTH}], got {}", self.n),
            ));
        }
        if let Some(b) = self.best_of {
            if b < self.n || b > MAX_GROUP_WIDTH {
                return Err(invalid(
                    "best_of",
                    format!(
                        "must be >= n ({}) and <= {MAX_GROUP_WIDTH}, got {b}",
                        self.n
                    ),
                ));
            }
        }
        if self.logprobs.is_some_and(|k| k > MAX_LOGPROBS) {
            return Err(invalid(
                "logprobs",
                format!("must be in [0, {MAX_LOGPROBS}]"),
            ));
        }
        if self.prompt_logprobs.is_some_and(|k| k > MAX_LOGPROBS) {
            return Err(invalid(
                "prompt_logprobs",
                format!("must be in [0, {MAX_LOGPROBS}]"),
            ));
        }
        if let Some(m) = max_tokens.filter(|&m| self.min_tokens > m) {
            return Err(invalid(
                "min_tokens",
                format!(
                    "min_tokens ({}) must be <= max_tokens ({m})",
                    self.min_tokens
                ),
            ));
        }
        Ok(())
    }

    fn validate_distribution(&self) -> Result<(), RequestError> {
        if !(0.0..=2.0).contains(&self.temperature) {
            return Err(invalid(
                "temperature",
                format!("must be in [0, 2], got {}", self.temperature),
            ));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(invalid(
                "top_p",
                format!("must be in (0, 1], got {}", self.top_p),
            ));
        }
        if self.top_k == Some(0) {
            return Err(invalid("top_k", "must be at least 1"));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return Err(invalid(
                "min_p",
                format!("must be in [0, 1], got {}", self.min_p),
            ));
        }
        Ok(())
    }

    fn validate_penalties(&self) -> Result<(), RequestError> {
        for (name, v) in [
            ("presence_penalty", self.presence_penalty),
            ("frequency_penalty", self.frequency_penalty),
        ] {
            if !(-2.0..=2.0).contains(&v) {
                return Err(invalid(name, format!("must be in [-2, 2], got {v}")));
            }
        }
        let r = self.repetition_penalty;
        if !(r > 0.0 && r <= 2.0) {
            return Err(invalid(
                "repetition_penalty",
                format!("must be in (0, 2], got {r}"),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn param_of(e: RequestError) -> &'static str {
        match e {
            RequestError::InvalidParam { param, .. } => param,
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
            (
                SamplingParams {
                    temperature: 2.5,
                    ..d()
                },
                "temperature",
            ),
            (
                SamplingParams {
                    repetition_penalty: 2.5,
                    ..d()
                },
                "repetition_penalty",
            ),
            (
                SamplingParams {
                    logit_bias: vec![(5, 100.5)],
                    ..d()
                },
                "logit_bias",
            ),
            (
                SamplingParams {
                    logit_bias: vec![(5, f32::NAN)],
                    ..d()
                },
                "logit_bias",
            ),
            (
                SamplingParams {
                    logit_bias: (0..301).map(|t| (t, 1.0)).collect(),
                    ..d()
                },
                "logit_bias",
            ),
        ];
        for (p, name) in cases {
            let e = p.validate(Some(16)).expect_err(name);
            assert_eq!(param_of(e), name);
        }
    }
}
