//! Models: one definition per architecture, whatever the executor, and the
//! CPU's side of it.
//!
//! - [`backend`]: the seam. [`backend::Backend`] (the operations of one
//!   step on activation slots) and [`backend::WeightSink`] (weights into an
//!   executor's formats). The GPU executor implements both in
//!   `executor::gpu::forward`; the CPU in [`cpu_backend`].
//! - [`arch`]: the model definitions, one file per architecture family
//!   (`llama.rs`: Llama, Mistral, Qwen2; `gemma3.rs`), and [`Model`], the
//!   registry. A model reads its weights from a [`WeightSource`] a layer at
//!   a time.
//! - [`cpu_backend`]: [`CpuModel`] (a [`Model`] with CPU weights) and its
//!   step.
//! - The CPU kernels: [`ops`] (RMSNorm, rotary, SiLU/GELU-and-mul,
//!   embedding, softmax), [`linear`] (`y = x W^T + b`: f32 on the `gemm`
//!   crate, block-quantized on [`quant`]), [`kv_cache`] (the paged pool,
//!   `[num_blocks, block_size, num_kv_heads, head_dim]` per layer, K and V,
//!   f32 or f16), [`attention`] (K/V writes through the slot mapping, causal
//!   GQA attention through block tables, optional sliding window), [`par`]
//!   (the fork-join pool).
//! - [`batch`]: validation of a `ForwardBatch` (typed errors, no panics).
//! - [`tp`]: the model split for tensor parallelism (which rank holds which
//!   heads, FFN columns and vocabulary rows; a rank's weight slices).
//!
//! Sliding windows: Gemma 3's on its local layers, Mistral's (when its
//! config states one) on every layer.

pub mod arch;
pub mod attention;
pub mod attn_rows;
pub mod backend;
pub mod batch;
pub mod cpu_backend;
pub mod kv_cache;
pub mod linear;
pub mod lora;
pub mod ops;
pub mod par;
pub mod quant;
pub mod tp;

#[cfg(test)]
pub(crate) mod test_util;
#[cfg(test)]
mod tests_model;
#[cfg(test)]
mod tests_ops;

pub use arch::{Dims, FileSource, InMemory, Model, WeightSource};
pub use cpu_backend::{Cpu, CpuModel, CpuSink};
pub use kv_cache::{Kv, KvCache, KvDtype, KvElem, KvGeometry, LayerKv};

use thiserror::Error;

/// The KV pool geometry of a model with `config` for `num_blocks` blocks of
/// `block_size` tokens.
pub fn kv_geometry(
    config: &model_loader::ModelConfig,
    num_blocks: usize,
    block_size: usize,
) -> KvGeometry {
    KvGeometry {
        num_layers: config.num_hidden_layers,
        num_blocks,
        block_size,
        num_kv_heads: config.num_key_value_heads,
        head_dim: config.head_dim,
    }
}

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
    /// A tensor the model needs is absent (or was taken already).
    #[error("tensor {0} is missing")]
    Missing(String),
    /// Reading the weights failed.
    #[error("reading the weights")]
    Loader(#[from] model_loader::LoaderError),
}
