//! Loading pieces every decoder in `arch/` shares: shape checks, the fused
//! q/k/v and gate/up layers of one decoder layer, and the embedding, final
//! norm and head. Weights leave here fused and shape-checked, in the sink's
//! format.
//!
//! Invariant: nothing reaches a sink before its shape matched what the
//! model's [`Dims`] say (`ModelError::ShapeMismatch` names the tensor).

use super::{Dims, WeightSource};
use crate::model::backend::{Format, WeightSink};
use crate::model::ModelError;
use model_loader::{LayerWeights, Tensor, Weight};

/// `F::Matrix` of a sink.
pub type MatrixOf<S> = <<S as WeightSink>::Format as Format>::Matrix;
/// `F::Vector` of a sink.
pub type VectorOf<S> = <<S as WeightSink>::Format as Format>::Vector;

/// Checks that a large matrix has `shape`.
pub fn expect_w(w: Weight, name: &str, shape: &[usize]) -> Result<Weight, ModelError> {
    if w.shape() != shape {
        return Err(ModelError::ShapeMismatch {
            name: name.to_string(),
            expected: shape.to_vec(),
            got: w.shape().to_vec(),
        });
    }
    Ok(w)
}

/// Checks that a small tensor has `shape` and returns its values.
pub fn expect_t(t: Tensor, name: &str, shape: &[usize]) -> Result<Vec<f32>, ModelError> {
    if t.shape != shape || t.data.len() != shape.iter().product::<usize>() {
        return Err(ModelError::ShapeMismatch {
            name: name.to_string(),
            expected: shape.to_vec(),
            got: t.shape,
        });
    }
    Ok(t.data)
}

/// The linear layers and the two pre-norms of one Llama-shaped decoder
/// layer, fused: q/k/v as one `[q + 2 kv, hidden]` layer (with Qwen2's
/// concatenated biases), gate/up as one `[2 inter, hidden]` layer.
#[derive(Clone)]
pub struct Block<M, V> {
    pub attn_norm: V,
    pub qkv: M,
    pub o: M,
    pub ffn_norm: V,
    pub gate_up: M,
    pub down: M,
}

impl<M, V> Block<M, V> {
    /// The four linear layers.
    pub fn matrices(&self) -> [&M; 4] {
        [&self.qkv, &self.o, &self.gate_up, &self.down]
    }

    /// The four linear layers, mutably.
    pub fn matrices_mut(&mut self) -> [&mut M; 4] {
        [
            &mut self.qkv,
            &mut self.o,
            &mut self.gate_up,
            &mut self.down,
        ]
    }
}

/// A layer's block in a sink's formats, and what is left of the layer
/// (Gemma's norms).
pub type LoadedBlock<S> = (
    Block<MatrixOf<S>, VectorOf<S>>,
    Option<model_loader::GemmaNorms>,
);

/// Hands layer `i`'s shared tensors to `sink`; returns the block and what
/// is left of the layer (architecture-specific tensors, e.g. Gemma's norms).
pub fn load_block<S>(
    sink: &mut S,
    d: &Dims,
    i: usize,
    lw: LayerWeights<Weight>,
) -> Result<LoadedBlock<S>, S::Error>
where
    S: WeightSink,
    S::Error: From<ModelError>,
{
    let (h, qd, kvd, inter) = (d.hidden, d.q_dim(), d.kv_dim(), d.inter);
    let n = |s: &str| format!("layers.{i}.{s}");
    let bias = match (lw.bq, lw.bk, lw.bv) {
        (None, None, None) => None,
        (Some(bq), Some(bk), Some(bv)) => {
            let mut b = expect_t(bq, &n("bq"), &[qd])?;
            b.extend(expect_t(bk, &n("bk"), &[kvd])?);
            b.extend(expect_t(bv, &n("bv"), &[kvd])?);
            Some(b)
        }
        _ => {
            return Err(ModelError::InvalidConfig(n(
                "q/k/v biases present for some projections only",
            ))
            .into())
        }
    };
    let qkv = vec![
        expect_w(lw.wq, &n("wq"), &[qd, h])?,
        expect_w(lw.wk, &n("wk"), &[kvd, h])?,
        expect_w(lw.wv, &n("wv"), &[kvd, h])?,
    ];
    let gate_up = vec![
        expect_w(lw.w_gate, &n("w_gate"), &[inter, h])?,
        expect_w(lw.w_up, &n("w_up"), &[inter, h])?,
    ];
    let o = expect_w(lw.wo, &n("wo"), &[h, qd])?;
    let down = expect_w(lw.w_down, &n("w_down"), &[h, inter])?;
    let attn_norm = expect_t(lw.attn_norm, &n("attn_norm"), &[h])?;
    let ffn_norm = expect_t(lw.ffn_norm, &n("ffn_norm"), &[h])?;
    let block = Block {
        attn_norm: sink.vector(&n("attn_norm"), attn_norm)?,
        qkv: sink.matrix(&n("qkv"), qkv, h, bias)?,
        o: sink.matrix(&n("wo"), vec![o], qd, None)?,
        ffn_norm: sink.vector(&n("ffn_norm"), ffn_norm)?,
        gate_up: sink.matrix(&n("gate_up"), gate_up, h, None)?,
        down: sink.matrix(&n("w_down"), vec![down], inter, None)?,
    };
    Ok((block, lw.gemma))
}

/// The embedding, the final norm and the untied head (`None`: tied).
#[derive(Clone)]
pub struct Ends<M, V> {
    pub embedding: M,
    pub final_norm: V,
    pub lm_head: Option<M>,
}

impl<M, V> Ends<M, V> {
    /// The head: the embedding when tied.
    pub fn head(&self) -> &M {
        self.lm_head.as_ref().unwrap_or(&self.embedding)
    }

    /// The embedding, the untied head and every block's linear layers.
    pub fn matrices<'a>(&'a self, blocks: impl Iterator<Item = &'a Block<M, V>>) -> Vec<&'a M> {
        let ends = std::iter::once(&self.embedding).chain(self.lm_head.as_ref());
        ends.chain(blocks.flat_map(Block::matrices)).collect()
    }

    /// [`Ends::matrices`], mutably.
    pub fn matrices_mut<'a>(
        &'a mut self,
        blocks: impl Iterator<Item = &'a mut Block<M, V>>,
    ) -> Vec<&'a mut M> {
        let ends = std::iter::once(&mut self.embedding).chain(self.lm_head.as_mut());
        ends.chain(blocks.flat_map(Block::matrices_mut)).collect()
    }
}

/// Hands the embedding, final norm and head to `sink`.
pub fn load_ends<S>(
    sink: &mut S,
    d: &Dims,
    source: &mut dyn WeightSource,
) -> Result<Ends<MatrixOf<S>, VectorOf<S>>, S::Error>
where
    S: WeightSink,
    S::Error: From<ModelError>,
{
    let rows = source.vocab_rows().map_or(d.vocab, |r| r.len());
    let vh = [rows, d.hidden];
    let emb = expect_w(source.token_embedding()?, "token_embedding", &vh)?;
    let embedding = sink.matrix("token_embedding", vec![emb], d.hidden, None)?;
    let lm_head = match source.lm_head()? {
        Some(w) => {
            let w = expect_w(w, "lm_head", &vh)?;
            Some(sink.matrix("lm_head", vec![w], d.hidden, None)?)
        }
        None => None,
    };
    let norm = expect_t(source.final_norm()?, "final_norm", &[d.hidden])?;
    Ok(Ends {
        embedding,
        final_norm: sink.vector("final_norm", norm)?,
        lm_head,
    })
}

/// The dimensions of `config` and every layer read from `source`, a layer
/// at a time: its shared block handed to `sink`, then `layer(i, block,
/// rest)` builds the architecture's layer from it and what is left of the
/// loader's layer (Gemma's norms).
pub fn load_layers<S, L>(
    config: &model_loader::ModelConfig,
    source: &mut dyn WeightSource,
    sink: &mut S,
    mut layer: impl FnMut(
        &mut S,
        usize,
        Block<MatrixOf<S>, VectorOf<S>>,
        Option<model_loader::GemmaNorms>,
    ) -> Result<L, S::Error>,
) -> Result<(Dims, Vec<L>), S::Error>
where
    S: WeightSink,
    S::Error: From<ModelError>,
{
    let dims = Dims::of(config)?;
    let found = source.num_layers();
    if found != dims.layers {
        return Err(ModelError::InvalidConfig(format!(
            "{found} layers of weights for {} configured layers",
            dims.layers
        ))
        .into());
    }
    let mut layers = Vec::with_capacity(dims.layers);
    for i in 0..dims.layers {
        let (block, rest) = load_block(sink, &dims, i, source.layer(i)?)?;
        layers.push(layer(sink, i, block, rest)?);
    }
    Ok((dims, layers))
}
