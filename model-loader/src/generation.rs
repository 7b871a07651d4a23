//! The model's recommended sampling defaults, as vLLM's
//! `--generation-config auto` takes them: from an HF directory's
//! `generation_config.json` (`temperature`, `top_p`, `top_k`, `min_p`,
//! `repetition_penalty`, `max_new_tokens`), or from a GGUF's
//! `general.sampling.*` keys (llama.cpp's names: `temp`, `top_p`, `top_k`,
//! `min_p`, `penalty_repeat`). A request's own values always win; a field
//! the model does not state stays `None` (the API's default applies).

use crate::error::{LoaderError, Result};
use crate::gguf::GgufFile;
use serde_json::Value;
use std::path::Path;

/// Sampling defaults a model states. All `None`: it states none.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct GenerationDefaults {
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    /// `top_k`; `0` or `-1` mean off, as in a request.
    pub top_k: Option<i64>,
    pub min_p: Option<f64>,
    pub repetition_penalty: Option<f64>,
    /// Default `max_tokens` (HF `max_new_tokens`).
    pub max_tokens: Option<u64>,
}

impl GenerationDefaults {
    /// Whether the model states any default.
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }

    /// From a `generation_config.json` object; other keys are ignored, as
    /// vLLM ignores them. A listed key of the wrong JSON type is an error
    /// naming it.
    pub fn from_json(v: &Value, path: &Path) -> Result<Self> {
        let bad = |key: &str, want: &str| {
            LoaderError::InvalidConfig(format!(
                "{}: {key} must be {want}, got {}",
                path.display(),
                v[key]
            ))
        };
        let float = |key: &str| match v.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(x) => x.as_f64().map(Some).ok_or_else(|| bad(key, "a number")),
        };
        let int = |key: &str| match v.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(x) => x.as_i64().map(Some).ok_or_else(|| bad(key, "an integer")),
        };
        let max_tokens = match v.get("max_new_tokens") {
            None | Some(Value::Null) => None,
            Some(x) => Some(
                x.as_u64()
                    .ok_or_else(|| bad("max_new_tokens", "a non-negative integer"))?,
            ),
        };
        Ok(Self {
            temperature: float("temperature")?,
            top_p: float("top_p")?,
            top_k: int("top_k")?,
            min_p: float("min_p")?,
            repetition_penalty: float("repetition_penalty")?,
            max_tokens,
        })
    }

    /// `<dir>/generation_config.json`; a folder without one states nothing.
    pub fn from_dir(dir: &Path) -> Result<Self> {
        let path = dir.join("generation_config.json");
        if !path.is_file() {
            return Ok(Self::default());
        }
        Self::from_json(&crate::hf::read_json(&path)?, &path)
    }

    /// A GGUF's `general.sampling.*` keys.
    pub fn from_gguf(g: &GgufFile) -> Result<Self> {
        let float = |key: &str| -> Result<Option<f64>> {
            g.get(key)
                .map(|v| {
                    v.as_f64().ok_or_else(|| LoaderError::MetadataType {
                        key: key.into(),
                        expected: "number",
                    })
                })
                .transpose()
        };
        let top_k = g
            .get("general.sampling.top_k")
            .map(|v| {
                v.as_i64().ok_or_else(|| LoaderError::MetadataType {
                    key: "general.sampling.top_k".into(),
                    expected: "integer",
                })
            })
            .transpose()?;
        Ok(Self {
            temperature: float("general.sampling.temp")?,
            top_p: float("general.sampling.top_p")?,
            top_k,
            min_p: float("general.sampling.min_p")?,
            repetition_penalty: float("general.sampling.penalty_repeat")?,
            max_tokens: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn json_takes_vllms_keys_and_names_a_bad_one() {
        let p = Path::new("g.json");
        let d = GenerationDefaults::from_json(
            &json!({"temperature": 0.6, "top_p": 0.95, "top_k": 20, "max_new_tokens": 512,
                    "do_sample": true, "bos_token_id": 1}),
            p,
        )
        .unwrap();
        assert_eq!(d.temperature, Some(0.6));
        assert_eq!(d.top_p, Some(0.95));
        assert_eq!(d.top_k, Some(20));
        assert_eq!(d.max_tokens, Some(512));
        assert_eq!(d.min_p, None);
        let e = GenerationDefaults::from_json(&json!({"top_k": "20"}), p).unwrap_err();
        assert!(e.to_string().contains("top_k"), "{e}");
        assert!(GenerationDefaults::from_json(&json!({}), p)
            .unwrap()
            .is_empty());
    }

    #[test]
    fn gguf_takes_llama_cpp_keys() {
        use crate::gguf::{writer::GgufWriter, MetaValue};
        let mut w = GgufWriter::new();
        w.meta("general.architecture", MetaValue::String("llama".into()))
            .meta("general.sampling.temp", MetaValue::F32(0.6))
            .meta("general.sampling.top_k", MetaValue::I32(20))
            .meta("general.sampling.penalty_repeat", MetaValue::F32(1.1));
        let g = GgufFile::parse(w.to_bytes().unwrap()).unwrap();
        let d = GenerationDefaults::from_gguf(&g).unwrap();
        assert_eq!(d.temperature, Some(f64::from(0.6f32)));
        assert_eq!(d.top_k, Some(20));
        assert_eq!(d.repetition_penalty, Some(f64::from(1.1f32)));
        assert_eq!((d.top_p, d.min_p, d.max_tokens), (None, None, None));
        let mut w = GgufWriter::new();
        w.meta("general.sampling.top_k", MetaValue::String("20".into()));
        let g = GgufFile::parse(w.to_bytes().unwrap()).unwrap();
        let e = GenerationDefaults::from_gguf(&g).unwrap_err();
        assert!(e.to_string().contains("general.sampling.top_k"), "{e}");
    }
}
