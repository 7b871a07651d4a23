//! Model definitions: one file per architecture family, each written once
//! over [`Backend`](super::backend::Backend) and
//! [`WeightSink`](super::backend::WeightSink), whatever the executor.
//!
//! - [`llama`]: Llama, Mistral and Qwen2 (q/k/v biases ride in the fused
//!   q/k/v layer);
//! - [`gemma3`]: Gemma 3 (scaled embedding, q/k head norms, post-norms,
//!   GELU-tanh, sliding-window local layers with their own rotary base);
//! - [`common`]: the loading pieces both share (shape checks, the fused
//!   q/k/v and gate/up layers, the head).
//!
//! [`Model`] is the registry: a closed enum over the architectures, picked
//! from `ModelConfig::architecture`. Adding an architecture is one model
//! file plus its arm here.
//!
//! Invariants: a model file checks every tensor's shape before a sink sees
//! it, so a backend may trust the dimensions of what it is given; weights
//! are read from the [`WeightSource`] one layer at a time and handed to the
//! sink before the next is read (a GPU executor never holds a full-model
//! host copy).

pub mod common;
pub mod gemma3;
pub mod llama;
pub mod lora_cols;

use super::backend::{ActWidths, Backend, Format, WeightSink};
use super::ModelError;
use model_loader::{Architecture, LayerWeights, ModelConfig, ModelWeights, Tensor, Weight};

/// A model's dimensions, as every backend and model file reads them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Dims {
    pub hidden: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub inter: usize,
    pub vocab: usize,
    pub layers: usize,
    pub eps: f32,
}

impl Dims {
    /// The dimensions of `c`, refusing a configuration no layer graph can
    /// run (zero sizes, heads not a multiple of KV heads, odd head size).
    pub fn of(c: &ModelConfig) -> Result<Self, ModelError> {
        let bad = |m: &str| Err(ModelError::InvalidConfig(m.to_string()));
        if c.num_attention_heads == 0 || c.num_key_value_heads == 0 || c.num_hidden_layers == 0 {
            return bad("zero heads or layers");
        }
        if !c.num_attention_heads.is_multiple_of(c.num_key_value_heads) {
            return bad("num_attention_heads is not a multiple of num_key_value_heads");
        }
        if c.head_dim == 0 || !c.head_dim.is_multiple_of(2) {
            return bad("head_dim must be even and non-zero");
        }
        if c.hidden_size == 0
            || c.intermediate_size == 0
            || c.vocab_size == 0
            || c.max_position_embeddings == 0
        {
            return bad("zero-sized dimension");
        }
        Ok(Self {
            hidden: c.hidden_size,
            heads: c.num_attention_heads,
            kv_heads: c.num_key_value_heads,
            head_dim: c.head_dim,
            inter: c.intermediate_size,
            vocab: c.vocab_size,
            layers: c.num_hidden_layers,
            eps: c.rms_norm_eps,
        })
    }

    /// Width of all query heads.
    pub fn q_dim(&self) -> usize {
        self.heads * self.head_dim
    }

    /// Width of all key (or value) heads.
    pub fn kv_dim(&self) -> usize {
        self.kv_heads * self.head_dim
    }

    /// Width of the fused q/k/v projection.
    pub fn qkv_dim(&self) -> usize {
        self.q_dim() + 2 * self.kv_dim()
    }

    /// The slot widths of a decoder with these dimensions (`branch`: whether
    /// it uses the [`super::backend::Act::Branch`] slot).
    pub fn act_widths(&self, branch: bool) -> ActWidths {
        ActWidths([
            self.hidden,
            self.hidden,
            self.qkv_dim(),
            self.q_dim(),
            2 * self.inter,
            self.inter,
            if branch { self.hidden } else { 0 },
        ])
    }
}

/// Where a model's tensors come from, one layer at a time: a file being
/// read ([`model_loader::WeightReader`]) or weights already in memory
/// ([`InMemory`]). Each tensor is asked for once.
pub trait WeightSource {
    /// Layers the source holds.
    fn num_layers(&self) -> usize;
    /// Layer `i`'s tensors.
    fn layer(&mut self, i: usize) -> Result<LayerWeights<Weight>, ModelError>;
    /// `[vocab, hidden]`.
    fn token_embedding(&mut self) -> Result<Weight, ModelError>;
    /// `None` when tied to the embedding.
    fn lm_head(&mut self) -> Result<Option<Weight>, ModelError>;
    /// `[hidden]`.
    fn final_norm(&mut self) -> Result<Tensor, ModelError>;
    /// The vocabulary rows the embedding and head hold (`None`: all; a
    /// tensor-parallel shard holds a range, see [`crate::model::tp`]).
    fn vocab_rows(&self) -> Option<std::ops::Range<usize>> {
        None
    }
}

impl<S: WeightSource + ?Sized> WeightSource for &mut S {
    fn num_layers(&self) -> usize {
        (**self).num_layers()
    }

    fn layer(&mut self, i: usize) -> Result<LayerWeights<Weight>, ModelError> {
        (**self).layer(i)
    }

    fn token_embedding(&mut self) -> Result<Weight, ModelError> {
        (**self).token_embedding()
    }

    fn lm_head(&mut self) -> Result<Option<Weight>, ModelError> {
        (**self).lm_head()
    }

    fn final_norm(&mut self) -> Result<Tensor, ModelError> {
        (**self).final_norm()
    }

    fn vocab_rows(&self) -> Option<std::ops::Range<usize>> {
        (**self).vocab_rows()
    }
}

/// Weights already in memory, handed out once each (a second ask for the
/// same tensor is an error, never a copy).
pub struct InMemory {
    embedding: Option<Weight>,
    layers: Vec<Option<LayerWeights<Weight>>>,
    final_norm: Option<Tensor>,
    lm_head: Option<Option<Weight>>,
}

impl<W: Into<Weight>> From<ModelWeights<W>> for InMemory {
    fn from(w: ModelWeights<W>) -> Self {
        let w = w.map(Into::into);
        Self {
            embedding: Some(w.token_embedding),
            layers: w.layers.into_iter().map(Some).collect(),
            final_norm: Some(w.final_norm),
            lm_head: Some(w.lm_head),
        }
    }
}

fn taken(what: String) -> ModelError {
    ModelError::Missing(what)
}

impl WeightSource for InMemory {
    fn num_layers(&self) -> usize {
        self.layers.len()
    }

    fn layer(&mut self, i: usize) -> Result<LayerWeights<Weight>, ModelError> {
        self.layers
            .get_mut(i)
            .and_then(Option::take)
            .ok_or_else(|| taken(format!("layers.{i}")))
    }

    fn token_embedding(&mut self) -> Result<Weight, ModelError> {
        self.embedding
            .take()
            .ok_or_else(|| taken("token_embedding".into()))
    }

    fn lm_head(&mut self) -> Result<Option<Weight>, ModelError> {
        self.lm_head.take().ok_or_else(|| taken("lm_head".into()))
    }

    fn final_norm(&mut self) -> Result<Tensor, ModelError> {
        self.final_norm
            .take()
            .ok_or_else(|| taken("final_norm".into()))
    }
}

/// A model file being read ([`model_loader::WeightReader`]), its matrices
/// in `types` (`File`: a GGUF's quantized blocks stay quantized).
pub struct FileSource<'r> {
    pub reader: &'r model_loader::WeightReader,
    pub types: model_loader::WeightTypes,
}

impl WeightSource for FileSource<'_> {
    fn num_layers(&self) -> usize {
        self.reader.num_layers()
    }

    fn layer(&mut self, i: usize) -> Result<LayerWeights<Weight>, ModelError> {
        Ok(self.reader.layer(i, self.types)?)
    }

    fn token_embedding(&mut self) -> Result<Weight, ModelError> {
        Ok(self.reader.token_embedding(self.types)?)
    }

    fn lm_head(&mut self) -> Result<Option<Weight>, ModelError> {
        Ok(self.reader.lm_head(self.types)?)
    }

    fn final_norm(&mut self) -> Result<Tensor, ModelError> {
        Ok(self.reader.final_norm()?)
    }
}

/// A model of any registered architecture, its weights in format `F`.
pub enum Model<F: Format> {
    Llama(llama::Llama<F>),
    Gemma3(gemma3::Gemma3<F>),
}

/// Formats whose weights can be copied (the CPU's: a benchmark compares a
/// model with a variant of itself).
pub trait CloneFormat: Format<Matrix: Clone, Vector: Clone, Rope: Clone> {}
impl<F: Format<Matrix: Clone, Vector: Clone, Rope: Clone>> CloneFormat for F {}

impl<F: CloneFormat> Clone for Model<F> {
    fn clone(&self) -> Self {
        match self {
            Model::Llama(m) => Model::Llama(m.clone()),
            Model::Gemma3(m) => Model::Gemma3(m.clone()),
        }
    }
}

impl<F: Format> Model<F> {
    /// Reads the weights of `config`'s architecture from `source`, checks
    /// their shapes and hands them to `sink`, a layer at a time.
    pub fn load<S>(
        config: ModelConfig,
        source: &mut dyn WeightSource,
        sink: &mut S,
    ) -> Result<Self, S::Error>
    where
        S: WeightSink<Format = F>,
        S::Error: From<ModelError>,
    {
        Ok(match config.architecture {
            Architecture::Gemma3(g) => {
                Model::Gemma3(gemma3::Gemma3::load(config, g, source, sink)?)
            }
            _ => Model::Llama(llama::Llama::load(config, source, sink)?),
        })
    }

    /// Runs the layer graph of one step on `backend` (see
    /// [`super::backend::Backend`]).
    pub fn run<B: Backend<Format = F>>(&self, backend: &mut B) -> Result<(), B::Error> {
        match self {
            Model::Llama(m) => m.forward(backend),
            Model::Gemma3(m) => m.forward(backend),
        }
    }

    /// The hyper-parameters the model was loaded with.
    pub fn config(&self) -> &ModelConfig {
        match self {
            Model::Llama(m) => &m.config,
            Model::Gemma3(m) => &m.config,
        }
    }

    /// The dimensions.
    pub fn dims(&self) -> Dims {
        match self {
            Model::Llama(m) => m.dims,
            Model::Gemma3(m) => m.dims,
        }
    }

    /// Every linear layer, the embedding and the head included.
    pub fn matrices(&self) -> Vec<&F::Matrix> {
        match self {
            Model::Llama(m) => m.matrices(),
            Model::Gemma3(m) => m.matrices(),
        }
    }

    /// Every linear layer, mutably.
    pub fn matrices_mut(&mut self) -> Vec<&mut F::Matrix> {
        match self {
            Model::Llama(m) => m.matrices_mut(),
            Model::Gemma3(m) => m.matrices_mut(),
        }
    }
}
