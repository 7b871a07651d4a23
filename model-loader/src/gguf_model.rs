//! GGUF -> [`ModelConfig`] and [`ModelWeights`].
//!
//! Architectures `llama` (also used for Mistral-style models), `qwen2`
//! (q/k/v biases) and `gemma3` (q/k norms, post-norms; the sliding-window
//! period 6 and the local rotary base 10,000 are not in the file's metadata:
//! they are Gemma 3's constants, as llama.cpp also hard-codes them, unless
//! `gemma3.attention.sliding_window_pattern` / `gemma3.rope.freq_base_swa` say
//! otherwise; the attention scale is `head_dim ^ -0.5`, as llama.cpp uses for
//! every Gemma 3 size but 27B). Tensor names follow llama.cpp (`token_embd`,
//! `blk.N.attn_q`, ..., `output_norm`, `output`; no `output` = tied).
//! GGUF dims are innermost-first, so a `[out, in]` HF weight has
//! `dims = [in, out]`; the data is the same row-major bytes.
//!
//! The tensors themselves are read by [`crate::reader`] (names, shapes,
//! types, un-permutation, parallelism): [`weights_from_gguf_as`] is its
//! whole-model read over a file the caller parsed. Invariant: the returned
//! attn_q/attn_k rows are in HF order (llama.cpp's permutation undone, for
//! `llama` only: llama.cpp does not permute qwen2). O(total elements); under
//! [`WeightTypes::File`] the large block-quantized matrices are copied as
//! they are (rows permuted as whole blocks).

use crate::config::{Architecture, Gemma3Params, ModelConfig};
use crate::error::{LoaderError, Result};
use crate::gguf::GgufFile;
use crate::reader::Source;
pub use crate::reader::WeightTypes;
use crate::weights::{ModelWeights, Weight};

/// Gemma 3's period of global layers (one in six).
const GEMMA3_GLOBAL_EVERY: usize = 6;
/// Gemma 3's rotary base on the local (sliding-window) layers.
const GEMMA3_ROPE_LOCAL_THETA: f32 = 10_000.0;

/// Reads the hyper-parameters from the metadata.
pub fn config_from_gguf(g: &GgufFile) -> Result<ModelConfig> {
    let arch_name = g.get_str("general.architecture")?;
    let key = |k: &str| format!("{arch_name}.{k}");
    let architecture = match arch_name {
        "llama" => Architecture::Llama,
        "qwen2" => Architecture::Qwen2,
        "gemma3" => Architecture::Gemma3(gemma3_params(g, &key)?),
        other => return Err(LoaderError::UnsupportedArchitecture(other.to_string())),
    };
    let hidden_size = g.get_usize(&key("embedding_length"))?;
    let num_attention_heads = g.get_usize(&key("attention.head_count"))?;
    let num_key_value_heads = g
        .get_opt(&key("attention.head_count_kv"), "unsigned integer", |v| {
            v.as_u64()
        })?
        .map_or(num_attention_heads, |v| v as usize);
    if num_attention_heads == 0 || num_key_value_heads == 0 {
        return Err(LoaderError::InvalidConfig("zero attention heads".into()));
    }
    let head_dim = match g.get_opt(&key("attention.key_length"), "unsigned integer", |v| {
        v.as_u64()
    })? {
        Some(v) => v as usize,
        None => hidden_size / num_attention_heads,
    };
    let vocab_size = match g.get_opt(&key("vocab_size"), "unsigned integer", |v| v.as_u64())? {
        Some(v) => v as usize,
        None => match g.get("tokenizer.ggml.tokens").and_then(|v| v.as_array()) {
            Some(a) => a.len(),
            None => g.get_usize(&key("vocab_size"))?,
        },
    };
    let has_output = g.tensor_info("output.weight").is_some();
    let config = ModelConfig {
        architecture,
        vocab_size,
        hidden_size,
        intermediate_size: g.get_usize(&key("feed_forward_length"))?,
        num_hidden_layers: g.get_usize(&key("block_count"))?,
        num_attention_heads,
        num_key_value_heads,
        head_dim,
        rms_norm_eps: g.get_f32(&key("attention.layer_norm_rms_epsilon"))?,
        rope_theta: g
            .get_opt(&key("rope.freq_base"), "number", |v| v.as_f64())?
            .map_or(10_000.0, |v| v as f32),
        rope_scaling: None,
        max_position_embeddings: g.get_usize(&key("context_length"))?,
        tie_word_embeddings: !has_output,
        attention_bias: architecture == Architecture::Qwen2,
    };
    config.validate()?;
    Ok(config)
}

/// Gemma 3's extra hyper-parameters (see the module docs for the defaults).
fn gemma3_params(g: &GgufFile, key: &dyn Fn(&str) -> String) -> Result<Gemma3Params> {
    let uint = |k: &str| g.get_opt(&key(k), "unsigned integer", |v| v.as_u64());
    let num = |k: &str| g.get_opt(&key(k), "number", |v| v.as_f64());
    let head_dim = match uint("attention.key_length")? {
        Some(v) => v as f32,
        None => {
            let h = g.get_usize(&key("embedding_length"))?;
            let n = g.get_usize(&key("attention.head_count"))?.max(1);
            (h / n) as f32
        }
    };
    Ok(Gemma3Params {
        sliding_window: g.get_usize(&key("attention.sliding_window"))?,
        global_every: uint("attention.sliding_window_pattern")?
            .map_or(GEMMA3_GLOBAL_EVERY, |v| v as usize),
        rope_local_theta: num("rope.freq_base_swa")?.map_or(GEMMA3_ROPE_LOCAL_THETA, |v| v as f32),
        query_pre_attn_scalar: head_dim,
    })
}

/// Inverse of llama.cpp's Q/K row permutation on a `[rows, cols]` matrix:
/// `w.reshape(n_head, head_dim/2, 2, cols).swapaxes(1, 2).reshape(rows, cols)`.
pub fn unpermute_qk(w: &[f32], n_head: usize, rows: usize, cols: usize) -> Vec<f32> {
    unpermute_rows(w, n_head, rows, cols)
}

/// [`unpermute_qk`] on rows of any element type (`cols` elements per row:
/// f32 values or the bytes of a quantized row).
pub(crate) fn unpermute_rows<T: Copy + Default>(
    w: &[T],
    n_head: usize,
    rows: usize,
    cols: usize,
) -> Vec<T> {
    let hd = rows / n_head;
    let half = hd / 2;
    let mut out = vec![T::default(); w.len()];
    for h in 0..n_head {
        for i in 0..2 {
            for j in 0..half {
                let dst = h * hd + i * half + j;
                let src = h * hd + 2 * j + i;
                out[dst * cols..(dst + 1) * cols].copy_from_slice(&w[src * cols..(src + 1) * cols]);
            }
        }
    }
    out
}

/// Reads every weight, dequantized to f32 and in HF layout.
pub fn weights_from_gguf(g: &GgufFile, c: &ModelConfig) -> Result<ModelWeights> {
    Ok(weights_from_gguf_as(g, c, WeightTypes::F32)?.map(Weight::into_f32))
}

/// Reads every weight in HF layout, the large matrices kept as `types` says
/// (through the same reads as [`crate::WeightReader`], over a file the
/// caller parsed).
pub fn weights_from_gguf_as(
    g: &GgufFile,
    c: &ModelConfig,
    types: WeightTypes,
) -> Result<ModelWeights<Weight>> {
    Source::gguf(g, c).weights(types)
}
