//! HF model directories: `config.json`, safetensors weights (single file or
//! sharded), `tokenizer.json`, `tokenizer_config.json`,
//! `generation_config.json`.
//!
//! Supported `architectures`: `LlamaForCausalLM`, `MistralForCausalLM`,
//! `Qwen2ForCausalLM` (q/k/v biases). `rope_scaling` of type `llama3` is
//! parsed; any other type is refused. Weights keep HF's row order (no
//! permutation). O(total elements) to read the weights, which
//! [`crate::reader`] does (tensor names there).

use std::path::Path;

use serde_json::Value;

use crate::chat::ChatTemplate;
use crate::config::{Architecture, ModelConfig, RopeScaling};
use crate::error::{LoaderError, Result};
use crate::reader::{Source, WeightTypes};
use crate::safetensors_io::SafetensorsSet;
use crate::tokenizer::{SpecialTokens, Tokenizer};
use crate::weights::{ModelWeights, Weight};

/// Reads and parses a JSON file.
pub fn read_json(path: &Path) -> Result<Value> {
    let text = std::fs::read_to_string(path).map_err(|e| LoaderError::io(path, e))?;
    serde_json::from_str(&text).map_err(|e| LoaderError::BadJson {
        path: path.to_path_buf(),
        source: e,
    })
}

fn bad(msg: String) -> LoaderError {
    LoaderError::InvalidConfig(msg)
}

fn field_usize(v: &Value, key: &str) -> Result<Option<usize>> {
    match v.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(x) => x
            .as_u64()
            .map(|n| Some(n as usize))
            .ok_or_else(|| bad(format!("config.json: {key} is not a non-negative integer"))),
    }
}

fn req_usize(v: &Value, key: &str) -> Result<usize> {
    field_usize(v, key)?.ok_or_else(|| bad(format!("config.json: missing {key}")))
}

fn field_f32(v: &Value, key: &str) -> Result<Option<f32>> {
    match v.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(x) => x
            .as_f64()
            .map(|n| Some(n as f32))
            .ok_or_else(|| bad(format!("config.json: {key} is not a number"))),
    }
}

fn field_bool(v: &Value, key: &str) -> Result<Option<bool>> {
    match v.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(x) => x
            .as_bool()
            .map(Some)
            .ok_or_else(|| bad(format!("config.json: {key} is not a bool"))),
    }
}

/// Parses a `config.json` value.
pub fn parse_config(v: &Value) -> Result<ModelConfig> {
    let arch = v
        .get("architectures")
        .and_then(|a| a.get(0))
        .and_then(Value::as_str)
        .ok_or_else(|| bad("config.json: missing architectures".into()))?;
    let architecture = match arch {
        "LlamaForCausalLM" => Architecture::Llama,
        "MistralForCausalLM" => Architecture::Mistral {
            sliding_window: field_usize(v, "sliding_window")?.filter(|&w| w > 0),
        },
        "Qwen2ForCausalLM" => Architecture::Qwen2,
        other => return Err(LoaderError::UnsupportedArchitecture(other.to_string())),
    };
    let hidden_size = req_usize(v, "hidden_size")?;
    let num_attention_heads = req_usize(v, "num_attention_heads")?;
    if num_attention_heads == 0 {
        return Err(bad("config.json: num_attention_heads is 0".into()));
    }
    let config = ModelConfig {
        architecture,
        vocab_size: req_usize(v, "vocab_size")?,
        hidden_size,
        intermediate_size: req_usize(v, "intermediate_size")?,
        num_hidden_layers: req_usize(v, "num_hidden_layers")?,
        num_attention_heads,
        num_key_value_heads: field_usize(v, "num_key_value_heads")?.unwrap_or(num_attention_heads),
        head_dim: field_usize(v, "head_dim")?.unwrap_or(hidden_size / num_attention_heads),
        rms_norm_eps: field_f32(v, "rms_norm_eps")?.unwrap_or(1e-6),
        rope_theta: field_f32(v, "rope_theta")?.unwrap_or(10_000.0),
        rope_scaling: parse_rope_scaling(v.get("rope_scaling"))?,
        max_position_embeddings: field_usize(v, "max_position_embeddings")?.unwrap_or(2048),
        tie_word_embeddings: field_bool(v, "tie_word_embeddings")?.unwrap_or(false),
        attention_bias: architecture == Architecture::Qwen2
            || field_bool(v, "attention_bias")?.unwrap_or(false),
    };
    config.validate()?;
    Ok(config)
}

fn parse_rope_scaling(v: Option<&Value>) -> Result<Option<RopeScaling>> {
    let Some(v) = v.filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let ty = v
        .get("rope_type")
        .or_else(|| v.get("type"))
        .and_then(Value::as_str)
        .ok_or_else(|| bad("config.json: rope_scaling without a type".into()))?;
    match ty {
        "default" => Ok(None),
        "llama3" => {
            let f = |k: &str| {
                v.get(k).and_then(Value::as_f64).ok_or_else(|| {
                    bad(format!(
                        "config.json: rope_scaling.{k} missing or not a number"
                    ))
                })
            };
            Ok(Some(RopeScaling::Llama3 {
                factor: f("factor")? as f32,
                low_freq_factor: f("low_freq_factor")? as f32,
                high_freq_factor: f("high_freq_factor")? as f32,
                original_max_position_embeddings: f("original_max_position_embeddings")? as usize,
            }))
        }
        other => Err(LoaderError::UnsupportedRopeScaling(other.to_string())),
    }
}

/// Reads `dir/config.json`.
pub fn read_config(dir: &Path) -> Result<ModelConfig> {
    parse_config(&read_json(&dir.join("config.json"))?)
}

/// A token given as `"<s>"` or `{"content": "<s>", ...}`.
fn token_string(v: Option<&Value>) -> Option<String> {
    match v? {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => o.get("content")?.as_str().map(str::to_string),
        _ => None,
    }
}

/// Ids from `eos_token_id`: an int or a list of ints.
fn id_list(v: Option<&Value>) -> Vec<u32> {
    match v {
        Some(Value::Number(n)) => n.as_u64().map(|x| x as u32).into_iter().collect(),
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(Value::as_u64)
            .map(|x| x as u32)
            .collect(),
        _ => Vec::new(),
    }
}

/// Loads the tokenizer and the chat template of an HF directory.
pub fn tokenizer_and_template(dir: &Path) -> Result<(Tokenizer, Option<ChatTemplate>)> {
    let tok_path = dir.join("tokenizer.json");
    let json = std::fs::read_to_string(&tok_path).map_err(|e| LoaderError::io(&tok_path, e))?;
    let cfg_path = dir.join("tokenizer_config.json");
    let tcfg = if cfg_path.is_file() {
        read_json(&cfg_path)?
    } else {
        Value::Null
    };
    let gen_path = dir.join("generation_config.json");
    let gen = if gen_path.is_file() {
        read_json(&gen_path)?
    } else {
        Value::Null
    };
    // A first pass without special ids, to look token strings up.
    let plain = Tokenizer::from_json(json.clone(), SpecialTokens::default())?;
    let bos_str = token_string(tcfg.get("bos_token"));
    let eos_str = token_string(tcfg.get("eos_token"));
    let bos = bos_str
        .as_deref()
        .and_then(|s| plain.token_to_id(s))
        .or_else(|| id_list(gen.get("bos_token_id")).first().copied());
    let mut eos: Vec<u32> = eos_str
        .as_deref()
        .and_then(|s| plain.token_to_id(s))
        .into_iter()
        .collect();
    for id in id_list(gen.get("eos_token_id")) {
        if !eos.contains(&id) {
            eos.push(id);
        }
    }
    let add_bos = tcfg
        .get("add_bos_token")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let tokenizer = Tokenizer::from_json(json, SpecialTokens { bos, eos, add_bos })?;
    let template_src = match tcfg.get("chat_template") {
        Some(Value::String(s)) => Some(s.clone()),
        Some(Value::Array(list)) => list
            .iter()
            .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
            .or_else(|| list.first())
            .and_then(|t| t.get("template"))
            .and_then(Value::as_str)
            .map(str::to_string),
        _ => None,
    };
    let template = match template_src {
        Some(src) => Some(ChatTemplate::new(
            &src,
            bos_str.as_deref().unwrap_or(""),
            eos_str.as_deref().unwrap_or(""),
        )?),
        None => None,
    };
    Ok((tokenizer, template))
}

/// Reads the weights of an HF directory as f32 (through the same reads as
/// [`crate::WeightReader`], with this config).
pub fn read_weights(dir: &Path, c: &ModelConfig) -> Result<ModelWeights> {
    let set = SafetensorsSet::open(dir)?;
    Ok(Source::hf(&set, c)
        .weights(WeightTypes::F32)?
        .map(Weight::into_f32))
}
