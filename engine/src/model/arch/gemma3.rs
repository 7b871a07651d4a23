//! Gemma 3: the Llama layout plus an embedding scaled by `sqrt(hidden)`,
//! RMSNorm of each query and key head before rotary, the attention and MLP
//! outputs RMS-normed before their residual adds, a GELU-tanh gate, scores
//! scaled by `query_pre_attn_scalar ^ -0.5`, and local layers (five in six)
//! that attend through a sliding window with their own rotary base.
//!
//! ```text
//! x = embed(ids) * sqrt(hidden)
//! per layer: qkv = qkv(rms_norm(x)); q, k = head_norm(q), head_norm(k)
//!            x += rms_norm(o(attention(qkv, window if local)))     (post-attention norm)
//!            x += rms_norm(down(gelu_tanh(gate(h)) * up(h)))        (post-MLP norm), h = rms_norm(x)
//! logits = head(rms_norm(x[logits rows]))                            (tied head)
//! ```
//!
//! The GGUF norm weights already hold Gemma's `1 + w` (llama.cpp's
//! converter folds it), so every norm is used as stored.
//!
//! Cost per step: the Llama graph's plus two head-norm and two norm-and-add
//! passes per layer (O(tokens x hidden) each).

use super::common::{expect_t, load_ends, load_layers, Block, Ends};
use super::lora_cols as lora;
use super::{Dims, WeightSource};
use crate::model::backend::{Act, Backend, Format, Gate, LayerAttn, WeightSink};
use crate::model::lora::LoraTarget;
use crate::model::ops::RopeTables;
use crate::model::ModelError;
use model_loader::{Gemma3Params, ModelConfig};

/// One Gemma 3 decoder layer: the shared block plus its four extra norms.
struct Layer<F: Format> {
    block: Block<F::Matrix, F::Vector>,
    q_norm: F::Vector,
    k_norm: F::Vector,
    post_attn_norm: F::Vector,
    post_ffn_norm: F::Vector,
    /// A sliding-window layer (with the local rotary table).
    local: bool,
}

impl<F: super::CloneFormat> Clone for Layer<F> {
    fn clone(&self) -> Self {
        Self {
            block: self.block.clone(),
            q_norm: self.q_norm.clone(),
            k_norm: self.k_norm.clone(),
            post_attn_norm: self.post_attn_norm.clone(),
            post_ffn_norm: self.post_ffn_norm.clone(),
            local: self.local,
        }
    }
}

impl<F: super::CloneFormat> Clone for Gemma3<F> {
    fn clone(&self) -> Self {
        Self {
            config: self.config.clone(),
            dims: self.dims,
            params: self.params,
            ends: self.ends.clone(),
            layers: self.layers.clone(),
            rope_global: self.rope_global.clone(),
            rope_local: self.rope_local.clone(),
        }
    }
}

/// A Gemma 3 decoder, weights in format `F`.
pub struct Gemma3<F: Format> {
    pub(super) config: ModelConfig,
    pub(super) dims: Dims,
    params: Gemma3Params,
    ends: Ends<F::Matrix, F::Vector>,
    layers: Vec<Layer<F>>,
    rope_global: F::Rope,
    rope_local: F::Rope,
}

impl<F: Format> Gemma3<F> {
    /// Reads, checks and hands every tensor to `sink`, a layer at a time.
    pub fn load<S>(
        config: ModelConfig,
        params: Gemma3Params,
        source: &mut dyn WeightSource,
        sink: &mut S,
    ) -> Result<Self, S::Error>
    where
        S: WeightSink<Format = F>,
        S::Error: From<ModelError>,
    {
        let (dims, layers) = load_layers(&config, source, sink, |sink, i, block, gemma| {
            let g = gemma.ok_or_else(|| {
                ModelError::InvalidConfig(format!("layers.{i}: the gemma3 norms are missing"))
            })?;
            let (h, hd) = (config.hidden_size, config.head_dim);
            let n = |s: &str| format!("layers.{i}.{s}");
            let mut norm = |name: &str, t, len| -> Result<F::Vector, S::Error> {
                let v = expect_t(t, &n(name), &[len])?;
                sink.vector(&n(name), v)
            };
            Ok(Layer {
                block,
                q_norm: norm("q_norm", g.q_norm, hd)?,
                k_norm: norm("k_norm", g.k_norm, hd)?,
                post_attn_norm: norm("post_attn_norm", g.post_attn_norm, h)?,
                post_ffn_norm: norm("post_ffn_norm", g.post_ffn_norm, h)?,
                local: params.is_local(i),
            })
        })?;
        let hd = dims.head_dim;
        let ends = load_ends(sink, &dims, source)?;
        let c = &config;
        let positions = c.max_position_embeddings;
        let rope_global =
            sink.rope(RopeTables::new(hd, c.rope_theta, c.rope_scaling, positions))?;
        let rope_local = sink.rope(RopeTables::new(
            hd,
            params.rope_local_theta,
            None,
            positions,
        ))?;
        Ok(Self {
            config,
            dims,
            params,
            ends,
            layers,
            rope_global,
            rope_local,
        })
    }

    /// One step on `b` (see the module docs).
    pub fn forward<B: Backend<Format = F>>(&self, b: &mut B) -> Result<(), B::Error> {
        let (d, eps) = (&self.dims, self.dims.eps);
        let scale = 1.0 / self.params.query_pre_attn_scalar.sqrt();
        b.begin(&d.act_widths(true))?;
        b.embed(
            Act::Residual,
            &self.ends.embedding,
            Some((d.hidden as f32).sqrt()),
        )?;
        for (layer, l) in self.layers.iter().enumerate() {
            let blk = &l.block;
            b.rms_norm(Act::Normed, Act::Residual, &blk.attn_norm, eps)?;
            b.linear(Act::Qkv, Act::Normed, &blk.qkv, false)?;
            b.lora(Act::Qkv, Act::Normed, layer, &lora::qkv(d))?;
            b.head_norms(Act::Qkv, &l.q_norm, &l.k_norm, eps)?;
            let attn = LayerAttn {
                layer,
                rope: if l.local {
                    &self.rope_local
                } else {
                    &self.rope_global
                },
                scale,
                window: l.local.then_some(self.params.sliding_window),
            };
            b.attention(Act::Attn, Act::Qkv, &attn)?;
            b.linear_row_parallel(
                Act::Branch,
                Act::Attn,
                &blk.o,
                false,
                (layer, LoraTarget::O),
            )?;
            b.add_rms_norm(Act::Residual, Act::Branch, &l.post_attn_norm, eps)?;
            b.rms_norm(Act::Normed, Act::Residual, &blk.ffn_norm, eps)?;
            b.linear(Act::GateUp, Act::Normed, &blk.gate_up, false)?;
            b.lora(Act::GateUp, Act::Normed, layer, &lora::gate_up(d))?;
            b.gated(Act::Gated, Act::GateUp, Gate::GeluTanh)?;
            let down = (layer, LoraTarget::Down);
            b.linear_row_parallel(Act::Branch, Act::Gated, &blk.down, false, down)?;
            b.add_rms_norm(Act::Residual, Act::Branch, &l.post_ffn_norm, eps)?;
        }
        b.logits(Act::Residual, &self.ends.final_norm, self.ends.head(), eps)
    }

    pub(super) fn matrices(&self) -> Vec<&F::Matrix> {
        self.ends.matrices(self.layers.iter().map(|l| &l.block))
    }

    pub(super) fn matrices_mut(&mut self) -> Vec<&mut F::Matrix> {
        self.ends
            .matrices_mut(self.layers.iter_mut().map(|l| &mut l.block))
    }
}
