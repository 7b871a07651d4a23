//! Dequantized model weights, laid out as Hugging Face does.
//!
//! Linear weights are row-major `[out_features, in_features]` (so `y = x W^T`).
//! GGUF's Q/K row permutation has already been undone: the rows follow the
//! HF order, so the rotary embedding is the rotate-half form everywhere.

/// A dense, row-major f32 tensor.
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
}

impl Tensor {
    /// Builds a tensor; `data.len()` must equal the product of `shape`.
    pub fn new(shape: Vec<usize>, data: Vec<f32>) -> Self {
        debug_assert_eq!(shape.iter().product::<usize>(), data.len());
        Self { shape, data }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.data.len()
    }

    /// True when the tensor holds no element.
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }
}

/// Weights of one decoder layer.
#[derive(Debug, Clone)]
pub struct LayerWeights {
    /// `[hidden]`, RMSNorm before attention.
    pub attn_norm: Tensor,
    /// `[num_heads * head_dim, hidden]`.
    pub wq: Tensor,
    /// `[num_kv_heads * head_dim, hidden]`.
    pub wk: Tensor,
    /// `[num_kv_heads * head_dim, hidden]`.
    pub wv: Tensor,
    /// `[hidden, num_heads * head_dim]`.
    pub wo: Tensor,
    /// Optional q/k/v biases (Qwen2).
    pub bq: Option<Tensor>,
    pub bk: Option<Tensor>,
    pub bv: Option<Tensor>,
    /// `[hidden]`, RMSNorm before the MLP.
    pub ffn_norm: Tensor,
    /// `[intermediate, hidden]`.
    pub w_gate: Tensor,
    /// `[intermediate, hidden]`.
    pub w_up: Tensor,
    /// `[hidden, intermediate]`.
    pub w_down: Tensor,
    /// Gemma 3's extra norms; `None` for the Llama family.
    pub gemma: Option<GemmaNorms>,
}

/// Gemma 3's per-layer norms beyond the Llama layout. Their weights are used
/// as stored (`x * w`): llama.cpp's converter already folded Gemma's `1 + w`.
#[derive(Debug, Clone)]
pub struct GemmaNorms {
    /// `[head_dim]`, RMSNorm of each query head before rotary.
    pub q_norm: Tensor,
    /// `[head_dim]`, RMSNorm of each key head before rotary.
    pub k_norm: Tensor,
    /// `[hidden]`, RMSNorm of the attention output before the residual add.
    pub post_attn_norm: Tensor,
    /// `[hidden]`, RMSNorm of the MLP output before the residual add.
    pub post_ffn_norm: Tensor,
}

/// All weights of a Llama-family model.
#[derive(Debug, Clone)]
pub struct ModelWeights {
    /// `[vocab, hidden]`.
    pub token_embedding: Tensor,
    pub layers: Vec<LayerWeights>,
    /// `[hidden]`.
    pub final_norm: Tensor,
    /// `[vocab, hidden]`; `None` when tied to `token_embedding`.
    pub lm_head: Option<Tensor>,
}

impl ModelWeights {
    /// The output projection, tied or not.
    pub fn output_weight(&self) -> &Tensor {
        self.lm_head.as_ref().unwrap_or(&self.token_embedding)
    }
}
