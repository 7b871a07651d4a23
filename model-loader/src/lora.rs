//! LoRA adapters: Hugging Face PEFT folders and llama.cpp GGUF adapters,
//! read into one f32 form, [`LoraAdapter`], checked against a base model's
//! [`ModelConfig`].
//!
//! - PEFT: `adapter_config.json` (`r`, `lora_alpha`, `target_modules`,
//!   `use_rslora`, `base_model_name_or_path`) and
//!   `adapter_model.safetensors` with
//!   `base_model.model.model.layers.N.{self_attn,mlp}.M.lora_A.weight`
//!   `[r, in]` and `...lora_B.weight` `[out, r]`. Scale `alpha / r`, or
//!   `alpha / sqrt(r)` with `use_rslora`.
//! - llama.cpp (`convert_lora_to_gguf.py`, read by `llama-adapter.cpp`):
//!   `general.type = adapter`, `adapter.type = lora`, `adapter.lora.alpha`;
//!   tensors `blk.N.attn_q.weight.lora_a` (ne `[in, r]`, row-major `[r, in]`)
//!   and `.lora_b` (ne `[r, out]`, row-major `[out, r]`). Scale `alpha / r`
//!   (alpha 0: scale 1, as llama.cpp).
//!
//! Row order of q/k: the loader un-permutes a `llama` GGUF base model's
//! `attn_q`/`attn_k` rows into HF order (`reader.rs`, `Spec::unpermute`), so
//! the engine's q and k are in HF order whatever the base file. A PEFT
//! adapter is in HF order and applies as it is; a GGUF adapter of a `llama`
//! model has its `lora_b` rows of `attn_q`/`attn_k` in llama.cpp's permuted
//! order (its converter permutes B like the base weight) and is un-permuted
//! here with the same function. `lora_a` is never permuted (its rows are the
//! rank, its columns the hidden input).
//!
//! Invariants: a loaded adapter has one rank `r <= max_rank` for every pair,
//! `a` is `[r, in]` and `b` is `[out, r]` with the base model's `in`/`out`
//! for that module, every layer index is inside the model, and at least one
//! pair exists. Every refusal is a [`LoaderError`] naming the problem
//! (missing file, rank above the limit, unknown target, shape mismatch).
//!
//! Cost: O(adapter elements) to read and convert; the adapter is held in f32
//! (`r x (in + out)` floats per targeted matrix per layer: SmolLM2-135M at
//! r = 8 on all seven modules is about 5 MB).

use crate::config::{Architecture, ModelConfig};
use crate::error::{LoaderError, Result};
use crate::gguf::GgufFile;
use crate::gguf_model::unpermute_qk;
use crate::safetensors_io::SafetensorsSet;
use std::path::Path;

/// A linear layer an adapter may target, in HF's names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum LoraTarget {
    Q,
    K,
    V,
    O,
    Gate,
    Up,
    Down,
}

impl LoraTarget {
    /// Every target, in index order.
    pub const ALL: [LoraTarget; 7] = [
        Self::Q,
        Self::K,
        Self::V,
        Self::O,
        Self::Gate,
        Self::Up,
        Self::Down,
    ];

    /// The index in [`LoraLayer::pairs`].
    pub fn index(self) -> usize {
        self as usize
    }

    /// PEFT's module name (`q_proj`, ...).
    pub fn hf_name(self) -> &'static str {
        match self {
            Self::Q => "q_proj",
            Self::K => "k_proj",
            Self::V => "v_proj",
            Self::O => "o_proj",
            Self::Gate => "gate_proj",
            Self::Up => "up_proj",
            Self::Down => "down_proj",
        }
    }

    /// The parent module in HF's tensor names.
    fn hf_parent(self) -> &'static str {
        match self {
            Self::Q | Self::K | Self::V | Self::O => "self_attn",
            _ => "mlp",
        }
    }

    /// llama.cpp's tensor stem (`attn_q`, ...).
    pub fn gguf_name(self) -> &'static str {
        match self {
            Self::Q => "attn_q",
            Self::K => "attn_k",
            Self::V => "attn_v",
            Self::O => "attn_output",
            Self::Gate => "ffn_gate",
            Self::Up => "ffn_up",
            Self::Down => "ffn_down",
        }
    }

    /// From PEFT's module name.
    pub fn from_hf(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.hf_name() == name)
    }

    /// `(out, in)` of the base matrix in `c`.
    pub fn shape(self, c: &ModelConfig) -> (usize, usize) {
        let (h, q, kv, ff) = (
            c.hidden_size,
            c.num_attention_heads * c.head_dim,
            c.num_key_value_heads * c.head_dim,
            c.intermediate_size,
        );
        match self {
            Self::Q => (q, h),
            Self::K | Self::V => (kv, h),
            Self::O => (h, q),
            Self::Gate | Self::Up => (ff, h),
            Self::Down => (h, ff),
        }
    }
}

/// One adapted matrix: `delta W = scale * b a`.
#[derive(Debug, Clone, PartialEq)]
pub struct LoraPair {
    /// `[r, in]`, row-major.
    pub a: Vec<f32>,
    /// `[out, r]`, row-major, rows in HF order.
    pub b: Vec<f32>,
}

/// The adapted matrices of one layer, indexed by [`LoraTarget::index`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LoraLayer {
    pub pairs: [Option<LoraPair>; 7],
}

/// Where an adapter came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoraFormat {
    Peft,
    Gguf,
}

/// A LoRA adapter in f32, checked against a base model.
#[derive(Debug, Clone, PartialEq)]
pub struct LoraAdapter {
    pub format: LoraFormat,
    pub rank: usize,
    pub alpha: f32,
    /// What every delta is multiplied by.
    pub scale: f32,
    /// PEFT's `base_model_name_or_path`, when stated.
    pub base_model: Option<String>,
    /// One entry per base model layer.
    pub layers: Vec<LoraLayer>,
}

impl LoraAdapter {
    /// The targets some layer adapts, in index order.
    pub fn targets(&self) -> Vec<LoraTarget> {
        LoraTarget::ALL
            .into_iter()
            .filter(|t| self.layers.iter().any(|l| l.pairs[t.index()].is_some()))
            .collect()
    }

    /// Floats held.
    pub fn num_elements(&self) -> usize {
        self.layers
            .iter()
            .flat_map(|l| l.pairs.iter().flatten())
            .map(|p| p.a.len() + p.b.len())
            .sum()
    }
}

/// Reads the adapter at `path` (a PEFT folder or a `.gguf` file) for the
/// base model `config`, refusing ranks above `max_rank`.
pub fn load_lora(path: &Path, config: &ModelConfig, max_rank: usize) -> Result<LoraAdapter> {
    if path.is_dir() {
        load_peft(path, config, max_rank)
    } else if path.is_file() {
        load_gguf(path, config, max_rank)
    } else {
        Err(LoaderError::LoraMissingFile {
            path: path.to_path_buf(),
            file: "adapter folder or .gguf file",
        })
    }
}

fn invalid(msg: impl Into<String>) -> LoaderError {
    LoaderError::LoraInvalid(msg.into())
}

/// PEFT's `target_modules`: a list of names or one name (a regex is refused).
fn peft_targets(v: &serde_json::Value) -> Result<Vec<LoraTarget>> {
    let names: Vec<&str> = match v {
        serde_json::Value::String(s) => vec![s.as_str()],
        serde_json::Value::Array(a) => a
            .iter()
            .map(|x| {
                x.as_str()
                    .ok_or_else(|| invalid("target_modules holds a non-string"))
            })
            .collect::<Result<_>>()?,
        _ => return Err(invalid("adapter_config.json has no target_modules list")),
    };
    names
        .into_iter()
        .map(|n| {
            LoraTarget::from_hf(n).ok_or_else(|| LoaderError::LoraUnknownTarget {
                module: n.to_string(),
            })
        })
        .collect()
}

fn load_peft(dir: &Path, config: &ModelConfig, max_rank: usize) -> Result<LoraAdapter> {
    let cfg_path = dir.join("adapter_config.json");
    if !cfg_path.is_file() {
        return Err(LoaderError::LoraMissingFile {
            path: dir.to_path_buf(),
            file: "adapter_config.json",
        });
    }
    let st_path = dir.join("adapter_model.safetensors");
    if !st_path.is_file() {
        return Err(LoaderError::LoraMissingFile {
            path: dir.to_path_buf(),
            file: "adapter_model.safetensors",
        });
    }
    let v = crate::hf::read_json(&cfg_path)?;
    let rank = v
        .get("r")
        .and_then(serde_json::Value::as_u64)
        .ok_or_else(|| invalid("adapter_config.json has no integer r"))? as usize;
    let alpha = v
        .get("lora_alpha")
        .and_then(serde_json::Value::as_f64)
        .unwrap_or(rank as f64) as f32;
    let rslora = v
        .get("use_rslora")
        .and_then(serde_json::Value::as_bool)
        .unwrap_or(false);
    for key in ["rank_pattern", "alpha_pattern"] {
        if v.get(key)
            .and_then(serde_json::Value::as_object)
            .is_some_and(|m| !m.is_empty())
        {
            return Err(invalid(format!(
                "{key} (per-module ranks) is not supported"
            )));
        }
    }
    if v.get("modules_to_save").is_some_and(|m| !m.is_null()) {
        return Err(invalid("modules_to_save is not supported"));
    }
    let targets = peft_targets(v.get("target_modules").unwrap_or(&serde_json::Value::Null))?;
    check_rank(rank, max_rank)?;
    let base_model = v
        .get("base_model_name_or_path")
        .and_then(serde_json::Value::as_str)
        .map(str::to_string);
    let st = SafetensorsSet::open_file(&st_path)?;
    let mut layers = vec![LoraLayer::default(); config.num_hidden_layers];
    // Every tensor must be a pair member of a declared target in range.
    for name in st.names() {
        let (layer, target, is_a) = parse_peft_name(name)?;
        if !targets.contains(&target) {
            return Err(invalid(format!(
                "tensor {name} adapts {} which target_modules does not list",
                target.hf_name()
            )));
        }
        if layer >= config.num_hidden_layers {
            return Err(invalid(format!(
                "tensor {name}: layer {layer} but the base model has {} layers",
                config.num_hidden_layers
            )));
        }
        let (out, inp) = target.shape(config);
        let expected = if is_a { [rank, inp] } else { [out, rank] };
        let data = st.read_f32(name, &expected)?.data;
        let slot = &mut layers[layer].pairs[target.index()];
        let pair = slot.get_or_insert_with(|| LoraPair {
            a: Vec::new(),
            b: Vec::new(),
        });
        if is_a {
            pair.a = data;
        } else {
            pair.b = data;
        }
    }
    let scale = if rslora {
        alpha / (rank as f32).sqrt()
    } else {
        alpha / rank as f32
    };
    finish(LoraFormat::Peft, rank, alpha, scale, base_model, layers)
}

/// `base_model.model.model.layers.N.self_attn.q_proj.lora_A.weight` ->
/// `(N, Q, true)`.
fn parse_peft_name(name: &str) -> Result<(usize, LoraTarget, bool)> {
    let bad = || {
        invalid(format!(
            "unexpected tensor {name} in adapter_model.safetensors"
        ))
    };
    let rest = name
        .strip_prefix("base_model.model.model.layers.")
        .ok_or_else(bad)?;
    let mut it = rest.split('.');
    let layer: usize = it.next().and_then(|s| s.parse().ok()).ok_or_else(bad)?;
    let parent = it.next().ok_or_else(bad)?;
    let module = it.next().ok_or_else(bad)?;
    let ab = it.next().ok_or_else(bad)?;
    if it.next() != Some("weight") || it.next().is_some() {
        return Err(bad());
    }
    let target = LoraTarget::from_hf(module).ok_or_else(|| LoaderError::LoraUnknownTarget {
        module: module.to_string(),
    })?;
    if parent != target.hf_parent() {
        return Err(bad());
    }
    let is_a = match ab {
        "lora_A" => true,
        "lora_B" => false,
        _ => return Err(bad()),
    };
    Ok((layer, target, is_a))
}

fn check_rank(rank: usize, max_rank: usize) -> Result<()> {
    if rank == 0 {
        return Err(invalid("rank 0"));
    }
    if rank > max_rank {
        return Err(LoaderError::LoraRankTooLarge {
            rank,
            max: max_rank,
        });
    }
    Ok(())
}

/// Every pair complete, at least one pair.
fn finish(
    format: LoraFormat,
    rank: usize,
    alpha: f32,
    scale: f32,
    base_model: Option<String>,
    layers: Vec<LoraLayer>,
) -> Result<LoraAdapter> {
    let mut any = false;
    for (i, l) in layers.iter().enumerate() {
        for t in LoraTarget::ALL {
            if let Some(p) = &l.pairs[t.index()] {
                if p.a.is_empty() || p.b.is_empty() {
                    return Err(invalid(format!(
                        "layer {i} {}: lora_A or lora_B is missing",
                        t.hf_name()
                    )));
                }
                any = true;
            }
        }
    }
    if !any {
        return Err(invalid("the adapter holds no LoRA weights"));
    }
    Ok(LoraAdapter {
        format,
        rank,
        alpha,
        scale,
        base_model,
        layers,
    })
}

fn load_gguf(path: &Path, config: &ModelConfig, max_rank: usize) -> Result<LoraAdapter> {
    let g = GgufFile::open(path)?;
    let general_type = g.get_str("general.type").unwrap_or("model");
    if general_type != "adapter" {
        return Err(invalid(format!(
            "{}: general.type is {general_type:?}, not \"adapter\"",
            path.display()
        )));
    }
    let adapter_type = g.get_str("adapter.type").unwrap_or("");
    if adapter_type != "lora" {
        return Err(invalid(format!(
            "{}: adapter.type is {adapter_type:?}, not \"lora\"",
            path.display()
        )));
    }
    let arch = g.get_str("general.architecture")?.to_string();
    let expected_arch = match config.architecture {
        Architecture::Llama | Architecture::Mistral { .. } => "llama",
        Architecture::Qwen2 => "qwen2",
        Architecture::Gemma3(_) => "gemma3",
    };
    if arch != expected_arch {
        return Err(invalid(format!(
            "adapter architecture {arch:?} does not match the base model's {expected_arch:?}"
        )));
    }
    let alpha = g.get_f32("adapter.lora.alpha").unwrap_or(0.0);
    let mut layers = vec![LoraLayer::default(); config.num_hidden_layers];
    let mut rank = None;
    for info in &g.tensors {
        let name = info.name.as_str();
        let bad = || invalid(format!("unexpected tensor {name} in a LoRA GGUF"));
        let (stem, is_a) = if let Some(s) = name.strip_suffix(".weight.lora_a") {
            (s, true)
        } else if let Some(s) = name.strip_suffix(".weight.lora_b") {
            (s, false)
        } else {
            return Err(bad());
        };
        let rest = stem.strip_prefix("blk.").ok_or_else(bad)?;
        let (layer, module) = rest.split_once('.').ok_or_else(bad)?;
        let layer: usize = layer.parse().map_err(|_| bad())?;
        let target = LoraTarget::ALL
            .into_iter()
            .find(|t| t.gguf_name() == module)
            .ok_or_else(|| LoaderError::LoraUnknownTarget {
                module: module.to_string(),
            })?;
        if layer >= config.num_hidden_layers {
            return Err(invalid(format!(
                "tensor {name}: layer {layer} but the base model has {} layers",
                config.num_hidden_layers
            )));
        }
        let shape = info.shape();
        if shape.len() != 2 {
            return Err(invalid(format!("tensor {name} is not a matrix")));
        }
        let r = if is_a { shape[0] } else { shape[1] };
        let r = *rank.get_or_insert(r);
        check_rank(r, max_rank)?;
        let (out, inp) = target.shape(config);
        let expected = if is_a { vec![r, inp] } else { vec![out, r] };
        if shape != expected {
            return Err(LoaderError::ShapeMismatch {
                tensor: name.to_string(),
                expected,
                found: shape,
            });
        }
        let mut data = g.read_f32(info)?;
        let permuted = arch == "llama" && !is_a;
        if permuted && target == LoraTarget::Q {
            data = unpermute_qk(&data, config.num_attention_heads, out, r);
        } else if permuted && target == LoraTarget::K {
            data = unpermute_qk(&data, config.num_key_value_heads, out, r);
        }
        let pair = layers[layer].pairs[target.index()].get_or_insert_with(|| LoraPair {
            a: Vec::new(),
            b: Vec::new(),
        });
        if is_a {
            pair.a = data;
        } else {
            pair.b = data;
        }
    }
    let rank = rank.ok_or_else(|| invalid("the adapter holds no LoRA weights"))?;
    let scale = if alpha == 0.0 {
        1.0
    } else {
        alpha / rank as f32
    };
    finish(LoraFormat::Gguf, rank, alpha, scale, None, layers)
}
