//! The model hyper-parameters the engine needs, whatever file they came from.

/// Model families that share the Llama forward pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Architecture {
    /// `LlamaForCausalLM` (also GGUF `llama`).
    Llama,
    /// `MistralForCausalLM`: Llama with (optional) sliding window; same math here.
    Mistral,
    /// `Qwen2ForCausalLM`: Llama with biases on the q/k/v projections.
    Qwen2,
}

/// Rotary-embedding frequency scaling (`rope_scaling` in `config.json`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RopeScaling {
    /// Llama 3.1's piecewise scaling of the inverse frequencies.
    Llama3 {
        factor: f32,
        low_freq_factor: f32,
        high_freq_factor: f32,
        original_max_position_embeddings: usize,
    },
}

/// Hyper-parameters of a Llama-family decoder.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    pub architecture: Architecture,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    /// Usually `hidden_size / num_attention_heads`.
    pub head_dim: usize,
    pub rms_norm_eps: f32,
    pub rope_theta: f32,
    pub rope_scaling: Option<RopeScaling>,
    pub max_position_embeddings: usize,
    /// The output projection reuses the token embedding matrix.
    pub tie_word_embeddings: bool,
    /// q/k/v projections carry biases (Qwen2).
    pub attention_bias: bool,
}

impl ModelConfig {
    /// Checks the relations the forward pass relies on: non-zero sizes, whole
    /// GQA groups, an even head dimension (rotary pairs).
    pub fn validate(&self) -> Result<(), crate::error::LoaderError> {
        let bad = |m: String| Err(crate::error::LoaderError::InvalidConfig(m));
        let sizes = [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_key_value_heads),
            ("head_dim", self.head_dim),
            ("max_position_embeddings", self.max_position_embeddings),
        ];
        if let Some((name, _)) = sizes.iter().find(|(_, v)| *v == 0) {
            return bad(format!("{name} is 0"));
        }
        if !self
            .num_attention_heads
            .is_multiple_of(self.num_key_value_heads)
        {
            return bad(format!(
                "{} attention heads not a multiple of {} KV heads",
                self.num_attention_heads, self.num_key_value_heads
            ));
        }
        if !self.head_dim.is_multiple_of(2) {
            return bad(format!("head_dim {} is odd", self.head_dim));
        }
        if !(self.rms_norm_eps > 0.0 && self.rope_theta > 0.0) {
            return bad("rms_norm_eps and rope_theta must be positive".into());
        }
        Ok(())
    }
}
