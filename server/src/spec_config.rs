//! `--speculative-config`: vLLM's `SpeculativeConfig` JSON
//! (`vllm/config/speculative.py`), parsed once at startup into the
//! engine's `SpecConfig`. Every error names the field.
//!
//! Accepted fields: `method` (`"ngram"` or `"draft_model"`; without it a
//! `model` means a draft model, as vLLM reads it), `model` (the draft
//! model's path), `num_speculative_tokens` (required, 1..=16),
//! `prompt_lookup_max` / `prompt_lookup_min` (n-gram lengths; vLLM's
//! defaults: both 5 when neither is given, else the one given for both),
//! `disable_by_batch_size` (>= 2). Any other field is refused.

use engine::spec::{SpecConfig, SpecMethod};
use serde::Deserialize;
use std::path::PathBuf;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    method: Option<String>,
    model: Option<String>,
    num_speculative_tokens: Option<usize>,
    prompt_lookup_max: Option<usize>,
    prompt_lookup_min: Option<usize>,
    disable_by_batch_size: Option<usize>,
    adaptive: Option<bool>,
}

/// Parses and checks the flag's JSON (clap puts the flag's name in front
/// of an error).
pub fn parse(s: &str) -> Result<SpecConfig, String> {
    if !s.trim_start().starts_with('{') {
        return Err(format!(
            "expected a JSON object such as {{\"method\": \"ngram\", \"num_speculative_tokens\": 4}}, got `{s}`"
        ));
    }
    let mut de = serde_json::Deserializer::from_str(s);
    let raw: Raw = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        if path.is_empty() || path == "." || path == "?" {
            e.inner().to_string()
        } else {
            format!("`{path}`: {}", e.inner())
        }
    })?;
    de.end().map_err(|e| e.to_string())?;
    let method = match (raw.method.as_deref(), raw.model) {
        (Some("ngram"), None) => {
            let (min, max) = match (raw.prompt_lookup_min, raw.prompt_lookup_max) {
                (None, None) => (5, 5),
                (Some(n), None) | (None, Some(n)) => (n, n),
                (Some(a), Some(b)) => (a, b),
            };
            SpecMethod::Ngram {
                prompt_lookup_min: min,
                prompt_lookup_max: max,
            }
        }
        (Some("ngram"), Some(_)) => {
            return Err("`model`: the ngram method takes no model".into());
        }
        (Some("draft_model") | None, Some(model)) => {
            if raw.prompt_lookup_min.is_some() || raw.prompt_lookup_max.is_some() {
                return Err(
                    "`prompt_lookup_min`/`prompt_lookup_max`: only the ngram method takes them"
                        .into(),
                );
            }
            SpecMethod::DraftModel {
                model: PathBuf::from(model),
            }
        }
        (Some("draft_model"), None) => {
            return Err("`model`: the draft_model method needs the draft model's path".into());
        }
        (None, None) => {
            return Err("`method`: missing (\"ngram\", or \"draft_model\" with a `model`)".into());
        }
        (Some(other), _) => {
            return Err(format!(
                "`method`: unknown method `{other}` (supported: \"ngram\", \"draft_model\")"
            ));
        }
    };
    let Some(k) = raw.num_speculative_tokens else {
        return Err("`num_speculative_tokens`: missing".into());
    };
    let cfg = SpecConfig {
        method,
        num_speculative_tokens: k,
        disable_by_batch_size: raw.disable_by_batch_size,
        adaptive: raw.adaptive.unwrap_or(false),
    };
    cfg.validate().map_err(|e| e.to_string())?;
    Ok(cfg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adaptive_is_ours_and_off_by_default() {
        let on = parse(r#"{"method": "ngram", "num_speculative_tokens": 3, "adaptive": true}"#)
            .expect("parses");
        assert!(on.adaptive);
        let off = parse(r#"{"method": "ngram", "num_speculative_tokens": 3}"#).expect("parses");
        assert!(!off.adaptive);
        let e = parse(r#"{"method": "ngram", "num_speculative_tokens": 3, "adaptive": 1}"#)
            .expect_err("not a bool");
        assert!(e.contains("adaptive"), "{e}");
    }

    #[test]
    fn ngram_with_vllm_defaults() {
        let c = parse(r#"{"method": "ngram", "num_speculative_tokens": 4}"#).unwrap();
        assert_eq!(
            c.method,
            SpecMethod::Ngram {
                prompt_lookup_min: 5,
                prompt_lookup_max: 5
            }
        );
        let c = parse(r#"{"method":"ngram","num_speculative_tokens":3,"prompt_lookup_max":4}"#)
            .unwrap();
        assert_eq!(
            c.method,
            SpecMethod::Ngram {
                prompt_lookup_min: 4,
                prompt_lookup_max: 4
            }
        );
    }

    #[test]
    fn a_model_without_a_method_is_a_draft() {
        let c = parse(r#"{"model": "/m/draft.gguf", "num_speculative_tokens": 2}"#).unwrap();
        assert_eq!(
            c.method,
            SpecMethod::DraftModel {
                model: "/m/draft.gguf".into()
            }
        );
    }

    #[test]
    fn errors_name_the_field() {
        for (json, field) in [
            (
                r#"{"method": "eagle", "num_speculative_tokens": 2}"#,
                "method",
            ),
            (r#"{"method": "ngram"}"#, "num_speculative_tokens"),
            (
                r#"{"method": "ngram", "num_speculative_tokens": 0}"#,
                "num_speculative_tokens",
            ),
            (
                r#"{"method": "ngram", "num_speculative_tokens": 99}"#,
                "num_speculative_tokens",
            ),
            (
                r#"{"method":"ngram","num_speculative_tokens":2,"prompt_lookup_min":4,"prompt_lookup_max":2}"#,
                "prompt_lookup_min",
            ),
            (
                r#"{"method": "ngram", "num_speculative_tokens": 2, "foo": 1}"#,
                "foo",
            ),
            (
                r#"{"method": "draft_model", "num_speculative_tokens": 2}"#,
                "model",
            ),
            (r#"{"num_speculative_tokens": 2}"#, "method"),
            (
                r#"{"method": "ngram", "num_speculative_tokens": "x"}"#,
                "num_speculative_tokens",
            ),
            (
                r#"{"method":"ngram","num_speculative_tokens":2,"disable_by_batch_size":1}"#,
                "disable_by_batch_size",
            ),
        ] {
            let e = parse(json).unwrap_err();
            assert!(e.contains(field), "{json}: {e}");
        }
        assert!(parse("[1]").is_err());
    }
}
