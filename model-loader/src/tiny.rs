//! The tiny deterministic random-weight test model, written in both layouts
//! with identical weights: `tiny.gguf` (F32, Q/K permuted as llama.cpp's
//! converter does, full tokenizer metadata) and `hf/` (config.json,
//! model.safetensors, tokenizer.json, tokenizer_config.json,
//! generation_config.json).
//!
//! Llama architecture: hidden 64, 2 layers, 4 heads, 2 KV heads, head_dim
//! 16, intermediate 160, rope theta 10000, eps 1e-5, tied embeddings, 512
//! positions. The tokenizer is SmolLM2's truncated to [`TINY_VOCAB`]
//! tokens (see [`truncate_vocab`]): its first ids unchanged (special tokens
//! included), the byte tokens that lie beyond them appended, and the merges
//! whose parts and result all survive, so any text still encodes.
//!
//! Weights come from splitmix64 seeded by an FNV-1a hash of the tensor name
//! (stable across crate versions and independent of write order); linear
//! weights are uniform with std `1/sqrt(in_features)` (`2/sqrt(in)` for
//! o_proj and down_proj), embeddings std 0.15, layer norm weights `1 ± 0.1`,
//! final norm `2.5 ± 0.26` (uniform, std 0.15) (logits std about 3). Checked with an
//! independent numpy forward pass (`tests/fixtures/tiny_numpy_forward.py`):
//! greedy continuations vary (no single repeated token), top probability
//! 0.2-0.5. Cost: O(parameters) (about 0.2 M).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde_json::json;

use crate::config::{Architecture, ModelConfig};
use crate::error::{LoaderError, Result};
use crate::gguf::writer::{permute_qk, GgufWriter};
use crate::gguf::{GgmlType, GgufFile, MetaValue};
use crate::tokenizer::gguf::{GgufVocab, VocabModel};
use crate::tokenizer::{byte_to_char_table, Tokenizer};
use crate::weights::{LayerWeights, ModelWeights, Tensor};

/// Vocabulary size of the tiny model.
pub const TINY_VOCAB: usize = 1024;

/// Paths of what [`write_tiny_model`] wrote.
#[derive(Debug, Clone)]
pub struct TinyModelFiles {
    pub gguf: PathBuf,
    pub hf_dir: PathBuf,
}

/// The tiny model's hyper-parameters.
pub fn tiny_config() -> ModelConfig {
    ModelConfig {
        architecture: Architecture::Llama,
        vocab_size: TINY_VOCAB,
        hidden_size: 64,
        intermediate_size: 160,
        num_hidden_layers: 2,
        num_attention_heads: 4,
        num_key_value_heads: 2,
        head_dim: 16,
        rms_norm_eps: 1e-5,
        rope_theta: 10_000.0,
        rope_scaling: None,
        max_position_embeddings: 512,
        tie_word_embeddings: true,
        attention_bias: false,
    }
}

/// splitmix64: a tiny, well-mixed, version-stable generator.
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// Seeds the generator.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `[-1, 1)`.
    pub fn next_signed(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
}

fn fnv1a(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

/// Uniform values with the given standard deviation around `mean`.
fn random(name: &str, shape: Vec<usize>, mean: f32, std: f32) -> Tensor {
    let mut rng = SplitMix64::new(fnv1a(name));
    let n = shape.iter().product();
    let a = std * 3f32.sqrt();
    let data = (0..n).map(|_| mean + a * rng.next_signed()).collect();
    Tensor::new(shape, data)
}

/// The tiny model's weights (HF layout).
pub fn tiny_weights() -> ModelWeights {
    let c = tiny_config();
    let (h, q, kv, ff) = (c.hidden_size, 64, 32, c.intermediate_size);
    let lin = |name: &str, out: usize, inp: usize| {
        random(name, vec![out, inp], 0.0, 1.0 / (inp as f32).sqrt())
    };
    // Projections back into the residual stream are twice as strong, so the
    // layers outweigh the (small) embedding: with tied embeddings a dominant
    // embedding makes every step predict its own input token again.
    let out_proj = |name: &str, out: usize, inp: usize| {
        random(name, vec![out, inp], 0.0, 2.0 / (inp as f32).sqrt())
    };
    let layers = (0..c.num_hidden_layers)
        .map(|l| {
            let n = |s: &str| format!("model.layers.{l}.{s}");
            LayerWeights {
                attn_norm: random(&n("input_layernorm.weight"), vec![h], 1.0, 0.06),
                wq: lin(&n("self_attn.q_proj.weight"), q, h),
                wk: lin(&n("self_attn.k_proj.weight"), kv, h),
                wv: lin(&n("self_attn.v_proj.weight"), kv, h),
                wo: out_proj(&n("self_attn.o_proj.weight"), h, q),
                bq: None,
                bk: None,
                bv: None,
                ffn_norm: random(&n("post_attention_layernorm.weight"), vec![h], 1.0, 0.06),
                w_gate: lin(&n("mlp.gate_proj.weight"), ff, h),
                w_up: lin(&n("mlp.up_proj.weight"), ff, h),
                w_down: out_proj(&n("mlp.down_proj.weight"), h, ff),
                gemma: None,
            }
        })
        .collect();
    ModelWeights {
        token_embedding: random(
            "model.embed_tokens.weight",
            vec![c.vocab_size, h],
            0.0,
            0.15,
        ),
        layers,
        final_norm: random("model.norm.weight", vec![h], 2.5, 0.15),
        lm_head: None,
    }
}

/// HF tensor names paired with GGUF names, in llama.cpp's write order.
pub fn tensor_names(w: &ModelWeights) -> Vec<(String, String, &Tensor)> {
    let mut out = vec![(
        "model.embed_tokens.weight".to_string(),
        "token_embd.weight".to_string(),
        &w.token_embedding,
    )];
    for (l, layer) in w.layers.iter().enumerate() {
        let pairs: [(&str, &str, &Tensor); 9] = [
            (
                "input_layernorm.weight",
                "attn_norm.weight",
                &layer.attn_norm,
            ),
            ("self_attn.q_proj.weight", "attn_q.weight", &layer.wq),
            ("self_attn.k_proj.weight", "attn_k.weight", &layer.wk),
            ("self_attn.v_proj.weight", "attn_v.weight", &layer.wv),
            ("self_attn.o_proj.weight", "attn_output.weight", &layer.wo),
            (
                "post_attention_layernorm.weight",
                "ffn_norm.weight",
                &layer.ffn_norm,
            ),
            ("mlp.gate_proj.weight", "ffn_gate.weight", &layer.w_gate),
            ("mlp.up_proj.weight", "ffn_up.weight", &layer.w_up),
            ("mlp.down_proj.weight", "ffn_down.weight", &layer.w_down),
        ];
        out.extend(
            pairs
                .into_iter()
                .map(|(hf, gg, t)| (format!("model.layers.{l}.{hf}"), format!("blk.{l}.{gg}"), t)),
        );
    }
    out.push((
        "model.norm.weight".into(),
        "output_norm.weight".into(),
        &w.final_norm,
    ));
    out
}

/// SmolLM2's GGUF vocabulary truncated to `n` ids: its first `n - m` tokens
/// (same ids as in SmolLM2) followed by the `m` byte tokens whose ids lie
/// beyond that, in their original order, so every byte the source can
/// encode stays encodable.
/// Merges are kept when both parts and the result survive, in rank order.
pub fn truncate_vocab(full: &GgufVocab, n: usize) -> Result<GgufVocab> {
    let full_ids: HashMap<&str, usize> = full
        .tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.as_str(), i))
        .collect();
    // SmolLM2 lacks a few byte tokens (bytes never seen in its training
    // text); the tiny vocabulary keeps every byte token the source has.
    let mut byte_ids: Vec<usize> = byte_to_char_table()
        .iter()
        .filter_map(|c| full_ids.get(c.to_string().as_str()).copied())
        .collect();
    byte_ids.sort_unstable();
    // Smallest prefix cut `k` such that k + (byte tokens at ids >= k) == n.
    let mut k = n.min(full.tokens.len());
    while k > 0 && k + byte_ids.iter().filter(|&&id| id >= k).count() > n {
        k -= 1;
    }
    let kept: Vec<usize> = (0..k)
        .chain(byte_ids.iter().copied().filter(|&id| id >= k))
        .collect();
    let tokens: Vec<String> = kept.iter().map(|&i| full.tokens[i].clone()).collect();
    let new_id: HashMap<usize, u32> = kept
        .iter()
        .enumerate()
        .map(|(new, &old)| (old, new as u32))
        .collect();
    let ids: HashMap<&str, usize> = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.as_str(), i))
        .collect();
    let full_merges = full.bpe_merges().ok_or_else(|| {
        LoaderError::Tokenizer("the tiny model needs a byte-level BPE source vocabulary".into())
    })?;
    let merges = full_merges
        .iter()
        .filter(|m| {
            m.split_once(' ').is_some_and(|(a, b)| {
                ids.contains_key(a)
                    && ids.contains_key(b)
                    && ids.contains_key(format!("{a}{b}").as_str())
            })
        })
        .cloned()
        .collect();
    let remap = |id: u32| new_id.get(&(id as usize)).copied();
    Ok(GgufVocab {
        pre: full.pre.clone(),
        token_types: kept.iter().map(|&i| full.token_types[i]).collect(),
        tokens,
        model: VocabModel::Bpe { merges },
        unk: full.unk.and_then(remap),
        bos: full.bos.and_then(remap),
        eos: full.eos.iter().filter_map(|&i| remap(i)).collect(),
        add_bos: full.add_bos,
    })
}

/// Writes the tiny model into `out_dir`, taking the tokenizer from the
/// fetched SmolLM2 GGUF ([`crate::paths::default_model_path`]).
pub fn write_tiny_model(out_dir: &Path) -> Result<TinyModelFiles> {
    write_tiny_model_from(&crate::paths::default_model_path(), out_dir)
}

/// Writes the tiny model into `out_dir`, taking the tokenizer from `smollm2`.
pub fn write_tiny_model_from(smollm2: &Path, out_dir: &Path) -> Result<TinyModelFiles> {
    if !smollm2.is_file() {
        return Err(LoaderError::io(
            smollm2,
            std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "the tiny model takes its tokenizer from SmolLM2's GGUF: run `cargo xtask fetch-model` first",
            ),
        ));
    }
    let src = GgufFile::open(smollm2)?;
    let vocab = truncate_vocab(&GgufVocab::from_gguf(&src)?, TINY_VOCAB)?;
    let template = src.get_str("tokenizer.chat_template")?.to_string();
    let tokenizer = vocab.build()?;
    check_tokenizer(&tokenizer)?;
    let weights = tiny_weights();
    let hf_dir = out_dir.join("hf");
    std::fs::create_dir_all(&hf_dir).map_err(|e| LoaderError::io(&hf_dir, e))?;
    let gguf = out_dir.join("tiny.gguf");
    let bytes = gguf_bytes(&vocab, &template, &weights)?;
    std::fs::write(&gguf, bytes).map_err(|e| LoaderError::io(&gguf, e))?;
    write_hf(&hf_dir, &vocab, &tokenizer, &template, &weights)?;
    Ok(TinyModelFiles { gguf, hf_dir })
}

/// The truncated BPE must still encode arbitrary text, within the vocabulary.
fn check_tokenizer(t: &Tokenizer) -> Result<()> {
    let text = "Hello, world! 12345 — naïve café 🦀\n\tfn main() { println!(\"x\"); } <|im_start|>";
    let ids = t.encode(text, false)?;
    let back = t.decode(&ids, false)?;
    if back != text || ids.iter().any(|&i| i as usize >= TINY_VOCAB) {
        return Err(LoaderError::Tokenizer(format!(
            "truncated tokenizer does not round-trip: {back:?}"
        )));
    }
    Ok(())
}

fn u32v(v: usize) -> MetaValue {
    MetaValue::U32(v as u32)
}

fn gguf_bytes(vocab: &GgufVocab, template: &str, w: &ModelWeights) -> Result<Vec<u8>> {
    let c = tiny_config();
    let mut g = GgufWriter::new();
    let strs = |v: &[String]| MetaValue::Array(v.iter().cloned().map(MetaValue::String).collect());
    g.meta("general.architecture", MetaValue::String("llama".into()))
        .meta("general.type", MetaValue::String("model".into()))
        .meta(
            "general.name",
            MetaValue::String("Tiny Random Llama".into()),
        )
        .meta("llama.block_count", u32v(c.num_hidden_layers))
        .meta("llama.context_length", u32v(c.max_position_embeddings))
        .meta("llama.embedding_length", u32v(c.hidden_size))
        .meta("llama.feed_forward_length", u32v(c.intermediate_size))
        .meta("llama.attention.head_count", u32v(c.num_attention_heads))
        .meta("llama.attention.head_count_kv", u32v(c.num_key_value_heads))
        .meta("llama.rope.freq_base", MetaValue::F32(c.rope_theta))
        .meta(
            "llama.attention.layer_norm_rms_epsilon",
            MetaValue::F32(c.rms_norm_eps),
        )
        .meta("llama.attention.key_length", u32v(c.head_dim))
        .meta("llama.attention.value_length", u32v(c.head_dim))
        .meta("general.file_type", MetaValue::U32(0))
        .meta("llama.vocab_size", u32v(c.vocab_size))
        .meta("llama.rope.dimension_count", u32v(c.head_dim))
        .meta("tokenizer.ggml.model", MetaValue::String("gpt2".into()))
        .meta("tokenizer.ggml.pre", MetaValue::String(vocab.pre.clone()))
        .meta("tokenizer.ggml.tokens", strs(&vocab.tokens))
        .meta(
            "tokenizer.ggml.token_type",
            MetaValue::Array(
                vocab
                    .token_types
                    .iter()
                    .map(|&t| MetaValue::I32(t as i32))
                    .collect(),
            ),
        )
        .meta(
            "tokenizer.ggml.merges",
            strs(vocab.bpe_merges().unwrap_or_default()),
        );
    if let Some(bos) = vocab.bos {
        g.meta("tokenizer.ggml.bos_token_id", MetaValue::U32(bos));
    }
    if let Some(&eos) = vocab.eos.first() {
        g.meta("tokenizer.ggml.eos_token_id", MetaValue::U32(eos))
            .meta("tokenizer.ggml.padding_token_id", MetaValue::U32(eos));
    }
    g.meta("tokenizer.ggml.unknown_token_id", MetaValue::U32(0))
        .meta(
            "tokenizer.ggml.add_bos_token",
            MetaValue::Bool(vocab.add_bos),
        )
        .meta("tokenizer.ggml.add_space_prefix", MetaValue::Bool(false))
        .meta(
            "tokenizer.chat_template",
            MetaValue::String(template.to_string()),
        )
        .meta("general.quantization_version", MetaValue::U32(2));
    for (hf, gg, t) in tensor_names(w) {
        let data = if hf.ends_with("q_proj.weight") {
            permute_qk(&t.data, c.num_attention_heads, t.shape[0], t.shape[1])
        } else if hf.ends_with("k_proj.weight") {
            permute_qk(&t.data, c.num_key_value_heads, t.shape[0], t.shape[1])
        } else {
            t.data.clone()
        };
        g.tensor(&gg, t.shape.clone(), GgmlType::F32, data);
    }
    g.to_bytes()
}

fn write_json(path: &Path, v: &serde_json::Value) -> Result<()> {
    let text = serde_json::to_string_pretty(v).map_err(|e| LoaderError::TokenizerLib(e.into()))?;
    std::fs::write(path, text + "\n").map_err(|e| LoaderError::io(path, e))
}

fn write_hf(
    dir: &Path,
    vocab: &GgufVocab,
    tok: &Tokenizer,
    template: &str,
    w: &ModelWeights,
) -> Result<()> {
    let c = tiny_config();
    let bos = vocab.bos.unwrap_or(1);
    let eos = vocab.eos.first().copied().unwrap_or(2);
    write_json(
        &dir.join("config.json"),
        &json!({
            "architectures": ["LlamaForCausalLM"], "model_type": "llama",
            "vocab_size": c.vocab_size, "hidden_size": c.hidden_size,
            "intermediate_size": c.intermediate_size, "num_hidden_layers": c.num_hidden_layers,
            "num_attention_heads": c.num_attention_heads, "num_key_value_heads": c.num_key_value_heads,
            "head_dim": c.head_dim, "hidden_act": "silu", "rms_norm_eps": c.rms_norm_eps,
            "rope_theta": c.rope_theta, "rope_scaling": null,
            "max_position_embeddings": c.max_position_embeddings,
            "tie_word_embeddings": true, "attention_bias": false, "mlp_bias": false,
            "bos_token_id": bos, "eos_token_id": eos, "torch_dtype": "float32",
            "initializer_range": 0.02, "pretraining_tp": 1, "use_cache": true,
        }),
    )?;
    write_json(
        &dir.join("generation_config.json"),
        &json!({"bos_token_id": bos, "eos_token_id": eos}),
    )?;
    let name = |id: u32| vocab.tokens.get(id as usize).cloned().unwrap_or_default();
    write_json(
        &dir.join("tokenizer_config.json"),
        &json!({
            "add_bos_token": vocab.add_bos, "add_prefix_space": false,
            "bos_token": name(bos), "eos_token": name(eos), "pad_token": name(eos),
            "unk_token": name(0), "chat_template": template, "model_max_length": c.max_position_embeddings,
            "clean_up_tokenization_spaces": false, "tokenizer_class": "GPT2Tokenizer",
        }),
    )?;
    tok.save(&dir.join("tokenizer.json"))?;
    let tensors: Vec<(String, &Tensor)> = tensor_names(w)
        .into_iter()
        .map(|(hf, _, t)| (hf, t))
        .collect();
    crate::safetensors_io::write_f32(&dir.join("model.safetensors"), &tensors)
}
