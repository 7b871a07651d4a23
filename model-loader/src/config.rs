//! The model hyper-parameters the engine needs, whatever file they came from.

/// Model families that share the Llama forward pass.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Architecture {
    /// `LlamaForCausalLM` (also GGUF `llama`).
    Llama,
    /// `MistralForCausalLM`: Llama with an optional sliding window (every
    /// layer's query sees positions `p - w + 1 ..= p`; Mistral-7B v0.1:
    /// 4096, later versions none).
    Mistral { sliding_window: Option<usize> },
    /// `Qwen2ForCausalLM`: Llama with biases on the q/k/v projections.
    Qwen2,
    /// Gemma 3 (text): sliding-window local layers, q/k norms, post-norms,
    /// GELU-tanh MLP, embedding scaled by `sqrt(hidden)`.
    Gemma3(Gemma3Params),
}

/// What Gemma 3 adds to the shared hyper-parameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Gemma3Params {
    /// Keys a local layer's query sees: positions `p - sliding_window + 1 ..= p`.
    pub sliding_window: usize,
    /// Every `global_every`-th layer (layers `global_every - 1`, `2 * global_every - 1`, ...)
    /// attends globally; the others are local (Gemma 3: 6).
    pub global_every: usize,
    /// Rotary base of the local layers (`rope_theta` is the global layers').
    pub rope_local_theta: f32,
    /// Attention scores are scaled by `query_pre_attn_scalar ^ -0.5`.
    pub query_pre_attn_scalar: f32,
}

impl Gemma3Params {
    /// Whether layer `layer` (0-based) uses the sliding window.
    pub fn is_local(&self, layer: usize) -> bool {
        self.global_every == 0 || !(layer + 1).is_multiple_of(self.global_every)
    }
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
        if let Architecture::Gemma3(g) = self.architecture {
            if g.sliding_window == 0 || g.global_every == 0 {
                return bad(
                    "gemma3 sliding_window and global layer period must be positive".into(),
                );
            }
            if !(g.rope_local_theta > 0.0 && g.query_pre_attn_scalar > 0.0) {
                return bad(
                    "gemma3 local rope base and query_pre_attn_scalar must be positive".into(),
                );
            }
        }
        Ok(())
    }
}
