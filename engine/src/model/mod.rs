//! The Llama-family forward pass on the CPU (Llama, Mistral, Qwen2, Gemma 3).
//!
//! - [`ops`]: RMSNorm (also per head, in place), rotary embedding
//!   (rotate-half, Llama-3 scaling), SiLU-and-mul, GELU-tanh-and-mul,
//!   embedding gather, softmax; written once for all variants.
//! - [`linear`]: `y = x W^T + b` on the `gemm` crate, both cores busy.
//! - [`kv_cache`]: the paged KV pool, layout
//!   `[num_blocks, block_size, num_kv_heads, head_dim]` per layer, K and V.
//! - [`attention`]: K/V writes through the slot mapping, causal GQA attention
//!   through block tables, with an optional sliding window (masking only).
//! - [`batch`]: validation of a `ForwardBatch` (typed errors, no panics).
//! - [`llama`]: [`LlamaModel`], the decoder (Llama, Mistral, Qwen2, Gemma 3).
//!
//! Gemma 3's sliding window is applied on its local layers; Mistral's is not
//! (full causal attention), which is exact for contexts up to the window.

pub mod attention;
mod attn_rows;
pub mod batch;
pub mod kv_cache;
pub mod linear;
pub mod llama;
pub mod ops;
pub mod par;
pub mod quant;

#[cfg(test)]
pub(crate) mod test_util;
#[cfg(test)]
mod tests_model;
#[cfg(test)]
mod tests_ops;

pub use kv_cache::{Kv, KvCache, KvDtype, KvElem, KvGeometry, LayerKv};
pub use llama::{LayerView, LlamaModel, WeightsView};

use thiserror::Error;

/// Errors building a model from a config and weights.
#[derive(Debug, Error)]
pub enum ModelError {
    #[error("tensor {name}: expected shape {expected:?}, got {got:?}")]
    ShapeMismatch {
        name: String,
        expected: Vec<usize>,
        got: Vec<usize>,
    },
    #[error("invalid model config: {0}")]
    InvalidConfig(String),
}
