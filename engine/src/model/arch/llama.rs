//! Llama, Mistral and Qwen2: the pre-norm decoder with rotary attention and
//! a SiLU-gated MLP. Qwen2's q/k/v biases ride in the fused q/k/v layer;
//! Mistral's sliding window (when its config states one) applies to every
//! layer's attention.
//!
//! ```text
//! x = embed(ids)
//! per layer: x += o(attention(qkv(rms_norm(x))))
//!            x += down(silu(gate(h)) * up(h)),  h = rms_norm(x)
//! logits = head(rms_norm(x[logits rows]))
//! ```
//!
//! Cost per step: six GEMMs' worth of products per layer over the step's
//! tokens (q/k/v and gate/up fused: four calls) plus paged attention; the
//! head only for the logits rows.

use super::common::{load_ends, load_layers, Block, Ends};
use super::lora_cols as lora;
use super::{Dims, WeightSource};
use crate::model::backend::{Act, Backend, Format, Gate, LayerAttn, WeightSink};
use crate::model::lora::LoraTarget;
use crate::model::ops::RopeTables;
use crate::model::ModelError;
use model_loader::ModelConfig;

/// A Llama-family decoder, weights in format `F`.
pub struct Llama<F: Format> {
    pub(super) config: ModelConfig,
    pub(super) dims: Dims,
    ends: Ends<F::Matrix, F::Vector>,
    layers: Vec<Block<F::Matrix, F::Vector>>,
    rope: F::Rope,
}

impl<F: super::CloneFormat> Clone for Llama<F> {
    fn clone(&self) -> Self {
        Self {
            config: self.config.clone(),
            dims: self.dims,
            ends: self.ends.clone(),
            layers: self.layers.clone(),
            rope: self.rope.clone(),
        }
    }
}

impl<F: Format> Llama<F> {
    /// Reads, checks and hands every tensor to `sink`, a layer at a time.
    pub fn load<S>(
        config: ModelConfig,
        source: &mut dyn WeightSource,
        sink: &mut S,
    ) -> Result<Self, S::Error>
    where
        S: WeightSink<Format = F>,
        S::Error: From<ModelError>,
    {
        let (dims, layers) = load_layers(&config, source, sink, |_, i, block, gemma| {
            if gemma.is_some() {
                return Err(ModelError::InvalidConfig(format!(
                    "layers.{i}: Gemma norms present without the gemma3 architecture"
                ))
                .into());
            }
            Ok(block)
        })?;
        let ends = load_ends(sink, &dims, source)?;
        let c = &config;
        let rope = sink.rope(RopeTables::new(
            c.head_dim,
            c.rope_theta,
            c.rope_scaling,
            c.max_position_embeddings,
        ))?;
        Ok(Self {
            config,
            dims,
            ends,
            layers,
            rope,
        })
    }

    /// One step on `b` (see the module docs).
    pub fn forward<B: Backend<Format = F>>(&self, b: &mut B) -> Result<(), B::Error> {
        let (d, eps) = (&self.dims, self.dims.eps);
        b.begin(&d.act_widths(false))?;
        b.embed(Act::Residual, &self.ends.embedding, None)?;
        for (layer, l) in self.layers.iter().enumerate() {
            b.rms_norm(Act::Normed, Act::Residual, &l.attn_norm, eps)?;
            b.linear(Act::Qkv, Act::Normed, &l.qkv, false)?;
            b.lora(Act::Qkv, Act::Normed, layer, &lora::qkv(d))?;
            let attn = LayerAttn {
                layer,
                rope: &self.rope,
                scale: 1.0 / (d.head_dim as f32).sqrt(),
                window: self.window(),
            };
            b.attention(Act::Attn, Act::Qkv, &attn)?;
            b.linear_row_parallel(Act::Residual, Act::Attn, &l.o, true, (layer, LoraTarget::O))?;
            b.rms_norm(Act::Normed, Act::Residual, &l.ffn_norm, eps)?;
            b.linear(Act::GateUp, Act::Normed, &l.gate_up, false)?;
            b.lora(Act::GateUp, Act::Normed, layer, &lora::gate_up(d))?;
            b.gated(Act::Gated, Act::GateUp, Gate::Silu)?;
            let down = (layer, LoraTarget::Down);
            b.linear_row_parallel(Act::Residual, Act::Gated, &l.down, true, down)?;
        }
        b.logits(Act::Residual, &self.ends.final_norm, self.ends.head(), eps)
    }

    /// Keys each query sees (`None`: all before it).
    fn window(&self) -> Option<usize> {
        match self.config.architecture {
            model_loader::Architecture::Mistral { sliding_window } => sliding_window,
            _ => None,
        }
    }

    pub(super) fn matrices(&self) -> Vec<&F::Matrix> {
        self.ends.matrices(self.layers.iter())
    }

    pub(super) fn matrices_mut(&mut self) -> Vec<&mut F::Matrix> {
        self.ends.matrices_mut(self.layers.iter_mut())
    }
}
