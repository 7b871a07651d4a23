//! The engine's speculative decoding configuration (the server parses
//! vLLM's `--speculative-config` JSON into it).

use crate::error::EngineError;
use std::path::PathBuf;

/// Most proposals per sequence and step.
pub const MAX_SPEC_TOKENS: usize = 16;

/// Where proposals come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SpecMethod {
    /// Prompt lookup: the tokens that followed the latest earlier match of
    /// the sequence's last `n` tokens, `n` from `prompt_lookup_max` down to
    /// `prompt_lookup_min`.
    Ngram {
        prompt_lookup_min: usize,
        prompt_lookup_max: usize,
    },
    /// A smaller model with the target's vocabulary, proposing greedily.
    DraftModel { model: PathBuf },
}

/// Speculative decoding on (see `crate::spec`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecConfig {
    pub method: SpecMethod,
    /// Proposals per sequence and step (`k`).
    pub num_speculative_tokens: usize,
    /// No speculation in a step when this many requests or more are
    /// running or waiting (vLLM's `disable_by_batch_size`): at large
    /// batches a step is no longer bound by reading the weights.
    pub disable_by_batch_size: Option<usize>,
    /// Speculate only while it measures cheaper per emitted token than
    /// plain decoding (ours, not vLLM's; see [`super::governor`]).
    pub adaptive: bool,
}

impl SpecConfig {
    /// Checks every field's range; the error names the field.
    pub fn validate(&self) -> Result<(), EngineError> {
        let bad = |field: &str, why: String| {
            Err(EngineError::InvalidConfig(format!(
                "speculative config: {field} {why}"
            )))
        };
        let k = self.num_speculative_tokens;
        if !(1..=MAX_SPEC_TOKENS).contains(&k) {
            return bad(
                "num_speculative_tokens",
                format!("must be in 1..={MAX_SPEC_TOKENS}, not {k}"),
            );
        }
        if self.disable_by_batch_size.is_some_and(|n| n < 2) {
            return bad("disable_by_batch_size", "must be at least 2".into());
        }
        if let SpecMethod::Ngram {
            prompt_lookup_min: min,
            prompt_lookup_max: max,
        } = self.method
        {
            if min < 1 {
                return bad(
                    "prompt_lookup_min",
                    format!("must be at least 1, not {min}"),
                );
            }
            if max < 1 {
                return bad(
                    "prompt_lookup_max",
                    format!("must be at least 1, not {max}"),
                );
            }
            if min > max {
                return bad(
                    "prompt_lookup_min",
                    format!("({min}) must not exceed prompt_lookup_max ({max})"),
                );
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ngram(k: usize, min: usize, max: usize) -> SpecConfig {
        SpecConfig {
            method: SpecMethod::Ngram {
                prompt_lookup_min: min,
                prompt_lookup_max: max,
            },
            num_speculative_tokens: k,
            disable_by_batch_size: None,
            adaptive: false,
        }
    }

    #[test]
    fn ranges_are_checked_and_named() {
        assert!(ngram(4, 1, 3).validate().is_ok());
        for (cfg, field) in [
            (ngram(0, 1, 3), "num_speculative_tokens"),
            (ngram(MAX_SPEC_TOKENS + 1, 1, 3), "num_speculative_tokens"),
            (ngram(4, 0, 3), "prompt_lookup_min"),
            (ngram(4, 4, 3), "prompt_lookup_min"),
        ] {
            let e = cfg.validate().unwrap_err().to_string();
            assert!(e.contains(field), "{e}");
        }
        let mut c = ngram(4, 1, 3);
        c.disable_by_batch_size = Some(1);
        assert!(c
            .validate()
            .unwrap_err()
            .to_string()
            .contains("disable_by_batch_size"));
    }
}
