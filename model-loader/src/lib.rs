//! Everything needed to turn model files on disk into typed, validated data:
//! a [`ModelConfig`], dequantized f32 [`ModelWeights`], a [`Tokenizer`] and a
//! [`ChatTemplate`].
//!
//! Invariant: this crate does no model compute and no GPU work. It reads,
//! validates, dequantizes and reorders; numbers leave it as plain `f32` rows.

pub mod config;
pub mod paths;
pub mod weights;

pub use config::{Architecture, ModelConfig, RopeScaling};
pub use weights::{LayerWeights, ModelWeights, Tensor};
