//! Rebuilds an HF `tokenizer.json` from a GGUF file's `tokenizer.ggml.*`
//! metadata: byte-level BPE (`tokenizer.ggml.model == "gpt2"`) from
//! `tokens` + `merges`, the pre-tokenizer named by `tokenizer.ggml.pre`,
//! added tokens for control (type 3, special) and user-defined (type 4)
//! tokens, and a BOS-adding post-processor when `add_bos_token` is true.
//! SentencePiece vocabularies (`tokenizer.ggml.model == "llama"`: scores,
//! byte fallback, `▁`) are built by [`super::spm`]; for them BOS is added
//! unless the file says `add_bos_token = false` (llama.cpp's default).
//!
//! Pre-tokenizers (the regexes llama.cpp uses for each name):
//! - `smollm`: digits split one by one, then the GPT-2 regex, byte-level.
//! - `gpt2`: the GPT-2 regex, byte-level.
//! - `llama-bpe`: the Llama-3 regex (digits in groups of up to 3), `ignore_merges`.
//! - `qwen2`: the Qwen2 regex (single digits). No NFC normalization: the
//!   GGUF carries no normalizer, and llama.cpp and transformers (loading the
//!   GGUF) both tokenize the text as given (Qwen's own `tokenizer.json` does
//!   NFC; an HF model directory keeps it).
//!
//! Complexity: O(vocab + merges) to build the JSON.

use serde_json::{json, Value};

use super::spm::{spm_tokenizer_json, SpmFlavor, SpmVocab};
use super::{SpecialTokens, Tokenizer};
use crate::error::{LoaderError, Result};
use crate::gguf::GgufFile;

/// llama.cpp's token type for control tokens.
pub const TOKEN_TYPE_CONTROL: i64 = 3;
/// llama.cpp's token type for user-defined tokens.
pub const TOKEN_TYPE_USER_DEFINED: i64 = 4;

const LLAMA3_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The tokenizer model a GGUF file names.
#[derive(Debug, Clone, PartialEq)]
pub enum VocabModel {
    /// `gpt2`: byte-level BPE with an explicit merge list.
    Bpe { merges: Vec<String> },
    /// `llama`: SentencePiece with one score per piece.
    Spm { scores: Vec<f32>, flavor: SpmFlavor },
}

/// Everything the tokenizer needs from the metadata, owned.
#[derive(Debug, Clone)]
pub struct GgufVocab {
    /// `tokenizer.ggml.pre` (`default` when absent; unused for SentencePiece).
    pub pre: String,
    pub tokens: Vec<String>,
    pub token_types: Vec<i64>,
    pub model: VocabModel,
    pub unk: Option<u32>,
    pub bos: Option<u32>,
    pub eos: Vec<u32>,
    pub add_bos: bool,
}

impl GgufVocab {
    /// Reads the `tokenizer.ggml.*` keys.
    pub fn from_gguf(g: &GgufFile) -> Result<Self> {
        let model_name = g.get_str("tokenizer.ggml.model")?;
        if model_name != "gpt2" && model_name != "llama" {
            return Err(LoaderError::UnsupportedTokenizerModel(
                model_name.to_string(),
            ));
        }
        let pre = g
            .get_opt("tokenizer.ggml.pre", "string", |v| {
                v.as_str().map(str::to_string)
            })?
            .unwrap_or_else(|| "default".to_string());
        let tokens: Vec<String> = g
            .get_str_array("tokenizer.ggml.tokens")?
            .into_iter()
            .map(str::to_string)
            .collect();
        let token_types = match g.get("tokenizer.ggml.token_type") {
            None => vec![1; tokens.len()],
            Some(v) => v
                .as_array()
                .and_then(|a| a.iter().map(|x| x.as_i64()).collect::<Option<Vec<_>>>())
                .ok_or_else(|| LoaderError::MetadataType {
                    key: "tokenizer.ggml.token_type".into(),
                    expected: "array of integers",
                })?,
        };
        if token_types.len() != tokens.len() {
            return Err(LoaderError::Malformed(format!(
                "{} token types for {} tokens",
                token_types.len(),
                tokens.len()
            )));
        }
        let model = if model_name == "gpt2" {
            VocabModel::Bpe {
                merges: g
                    .get_str_array("tokenizer.ggml.merges")?
                    .into_iter()
                    .map(str::to_string)
                    .collect(),
            }
        } else {
            let scores = g
                .get("tokenizer.ggml.scores")
                .and_then(|v| v.as_array())
                .and_then(|a| {
                    a.iter()
                        .map(|x| x.as_f64().map(|f| f as f32))
                        .collect::<Option<Vec<_>>>()
                })
                .ok_or_else(|| LoaderError::MetadataType {
                    key: "tokenizer.ggml.scores".into(),
                    expected: "array of numbers",
                })?;
            if scores.len() != tokens.len() {
                return Err(LoaderError::Malformed(format!(
                    "{} scores for {} tokens",
                    scores.len(),
                    tokens.len()
                )));
            }
            let arch = g.get_str("general.architecture").unwrap_or("llama");
            let prefix = g.get_opt("tokenizer.ggml.add_space_prefix", "bool", |v| v.as_bool())?;
            VocabModel::Spm {
                scores,
                flavor: SpmFlavor::for_architecture(arch, prefix),
            }
        };
        let id = |key: &str| g.get_opt(key, "unsigned integer", |v| v.as_u64().map(|x| x as u32));
        let bos = id("tokenizer.ggml.bos_token_id")?;
        let mut eos: Vec<u32> = id("tokenizer.ggml.eos_token_id")?.into_iter().collect();
        if let Some(eot) = id("tokenizer.ggml.eot_token_id")? {
            if !eos.contains(&eot) {
                eos.push(eot);
            }
        }
        let is_spm = matches!(model, VocabModel::Spm { .. });
        let add_bos = g
            .get_opt("tokenizer.ggml.add_bos_token", "bool", |v| v.as_bool())?
            .unwrap_or(is_spm);
        let unk = id("tokenizer.ggml.unknown_token_id")?;
        Ok(Self {
            pre,
            tokens,
            token_types,
            model,
            unk,
            bos,
            eos,
            add_bos,
        })
    }

    /// The `tokenizer.json` value for this vocabulary.
    pub fn to_tokenizer_json(&self) -> Result<Value> {
        let mut value = match &self.model {
            VocabModel::Bpe { merges } => self.bpe_json(merges)?,
            VocabModel::Spm { scores, flavor } => spm_tokenizer_json(&SpmVocab {
                tokens: &self.tokens,
                token_types: &self.token_types,
                scores,
                unk: self.unk,
                flavor: *flavor,
            }),
        };
        if let Some(pp) = self.bos_post_processor()? {
            value["post_processor"] = pp;
        }
        Ok(value)
    }

    /// The post-processor that prepends BOS, when the file asks for it.
    fn bos_post_processor(&self) -> Result<Option<Value>> {
        let (true, Some(bos)) = (self.add_bos, self.bos) else {
            return Ok(None);
        };
        let bos_str = self.tokens.get(bos as usize).ok_or_else(|| {
            LoaderError::Tokenizer(format!("BOS id {bos} outside the vocabulary"))
        })?;
        Ok(Some(json!({
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": bos_str, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": bos_str, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": bos_str, "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {bos_str.clone(): {"id": bos_str, "ids": [bos], "tokens": [bos_str]}},
        })))
    }

    /// Byte-level BPE (`gpt2`) without BOS handling.
    fn bpe_json(&self, merges: &[String]) -> Result<Value> {
        let (normalizer, pre_tokenizer, ignore_merges) = pre_tokenizer(&self.pre)?;
        let mut vocab = serde_json::Map::with_capacity(self.tokens.len());
        for (id, tok) in self.tokens.iter().enumerate() {
            // Keep the first id of a duplicated string, as llama.cpp's map does.
            vocab.entry(tok.clone()).or_insert(json!(id));
        }
        let merges = merges
            .iter()
            .map(|m| {
                m.split_once(' ')
                    .map(|(a, b)| json!([a, b]))
                    .ok_or_else(|| LoaderError::Malformed(format!("merge {m:?} has no space")))
            })
            .collect::<Result<Vec<_>>>()?;
        let added: Vec<Value> = self
            .tokens
            .iter()
            .zip(&self.token_types)
            .enumerate()
            .filter(|(_, (_, t))| **t == TOKEN_TYPE_CONTROL || **t == TOKEN_TYPE_USER_DEFINED)
            .map(|(id, (content, t))| {
                json!({
                    "id": id, "content": content, "single_word": false, "lstrip": false,
                    "rstrip": false, "normalized": false, "special": *t == TOKEN_TYPE_CONTROL,
                })
            })
            .collect();
        let post_processor = json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": true});
        Ok(json!({
            "version": "1.0",
            "truncation": null,
            "padding": null,
            "added_tokens": added,
            "normalizer": normalizer,
            "pre_tokenizer": pre_tokenizer,
            "post_processor": post_processor,
            "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
            "model": {
                "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
                "ignore_merges": ignore_merges, "vocab": vocab, "merges": merges,
            },
        }))
    }

    /// The merge list of a byte-level BPE vocabulary (`None` for SentencePiece).
    pub fn bpe_merges(&self) -> Option<&[String]> {
        match &self.model {
            VocabModel::Bpe { merges } => Some(merges),
            VocabModel::Spm { .. } => None,
        }
    }

    /// The BOS/EOS settings.
    pub fn special_tokens(&self) -> SpecialTokens {
        SpecialTokens {
            bos: self.bos,
            eos: self.eos.clone(),
            add_bos: self.add_bos,
        }
    }

    /// Builds the tokenizer.
    pub fn build(&self) -> Result<Tokenizer> {
        let json = serde_json::to_string(&self.to_tokenizer_json()?)
            .map_err(|e| LoaderError::TokenizerLib(e.into()))?;
        Tokenizer::from_json(json, self.special_tokens())
    }
}

/// `(normalizer, pre_tokenizer, ignore_merges)` for a `tokenizer.ggml.pre` name.
fn pre_tokenizer(pre: &str) -> Result<(Value, Value, bool)> {
    let byte_level = |use_regex: bool| json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": use_regex});
    let split = |regex: &str| json!({"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": false});
    Ok(match pre {
        "smollm" => (
            Value::Null,
            json!({"type": "Sequence", "pretokenizers": [
                {"type": "Digits", "individual_digits": true}, byte_level(true)]}),
            false,
        ),
        "gpt2" => (Value::Null, byte_level(true), false),
        "llama-bpe" => (
            Value::Null,
            json!({"type": "Sequence", "pretokenizers": [split(LLAMA3_REGEX), byte_level(false)]}),
            true,
        ),
        "qwen2" => (
            Value::Null,
            json!({"type": "Sequence", "pretokenizers": [split(QWEN2_REGEX), byte_level(false)]}),
            false,
        ),
        other => return Err(LoaderError::UnsupportedPreTokenizer(other.to_string())),
    })
}

/// Builds the tokenizer of a GGUF file.
pub fn tokenizer_from_gguf(g: &GgufFile) -> Result<Tokenizer> {
    GgufVocab::from_gguf(g)?.build()
}
