//! A rank's view of a model's weights: [`ShardSource`] wraps any
//! [`WeightSource`] and hands out only the rank's slices (see
//! [`super::plan`]), so the one model definition loads a shard exactly as
//! it loads a whole model.
//!
//! Column-parallel layers (q/k/v with their biases, gate/up) are cut by
//! output rows, which keeps any quantized type whole. Row-parallel layers
//! (o_proj, down_proj) are cut by input columns on their quant blocks'
//! boundaries; where a head split falls inside a block (a 256-value type
//! with 64-wide heads split into odd groups), that one matrix's slice is
//! dequantized to f32 instead, and a warning says so. Embedding and head
//! are cut by vocabulary rows. Norms are whole on every rank.
//!
//! Cost: a layer is read whole, then sliced: O(layer bytes) extra memory
//! for one layer at a time.

use super::plan::RankShard;
use crate::model::{ModelError, WeightSource};
use model_loader::{LayerWeights, Tensor, Weight};
use std::ops::Range;

/// The slices of `inner`'s tensors that one rank holds.
pub struct ShardSource<'s> {
    inner: &'s mut dyn WeightSource,
    shard: RankShard,
    head_dim: usize,
}

impl<'s> ShardSource<'s> {
    pub fn new(inner: &'s mut dyn WeightSource, shard: RankShard, head_dim: usize) -> Self {
        Self {
            inner,
            shard,
            head_dim,
        }
    }

    fn heads(&self, heads: &Range<usize>) -> Range<usize> {
        heads.start * self.head_dim..heads.end * self.head_dim
    }
}

fn rows(w: Weight, r: Range<usize>, name: &str) -> Result<Weight, ModelError> {
    w.slice_rows(r).map_err(|e| sliced(name, e))
}

fn sliced(name: &str, e: model_loader::LoaderError) -> ModelError {
    ModelError::InvalidConfig(format!("tensor parallel slice of {name}: {e}"))
}

/// Columns `c` of `w`, in its own type when `c` is on its blocks'
/// boundaries, else dequantized (see the module docs).
fn cols(w: Weight, c: Range<usize>, name: &str) -> Result<Weight, ModelError> {
    match w.slice_cols(c.clone()) {
        Ok(s) => Ok(s),
        Err(_) if matches!(w, Weight::Quantized(_)) => {
            tracing::warn!(
                tensor = name,
                columns = ?c,
                "the tensor-parallel split cuts through this matrix's quant blocks: \
                 its slice is kept as f32"
            );
            Weight::F32(w.into_f32())
                .slice_cols(c)
                .map_err(|e| sliced(name, e))
        }
        Err(e) => Err(sliced(name, e)),
    }
}

fn part(t: Option<Tensor>, r: Range<usize>, name: &str) -> Result<Option<Tensor>, ModelError> {
    t.map(|t| {
        t.data
            .get(r.clone())
            .map(|d| Tensor::new(vec![r.len()], d.to_vec()))
            .ok_or_else(|| ModelError::InvalidConfig(format!("{name}: no values {r:?}")))
    })
    .transpose()
}

impl WeightSource for ShardSource<'_> {
    fn num_layers(&self) -> usize {
        self.inner.num_layers()
    }

    fn layer(&mut self, i: usize) -> Result<LayerWeights<Weight>, ModelError> {
        let l = self.inner.layer(i)?;
        let (q, kv) = (
            self.heads(&self.shard.q_heads),
            self.heads(&self.shard.kv_heads),
        );
        let inter = self.shard.inter.clone();
        let n = |s: &str| format!("layers.{i}.{s}");
        Ok(LayerWeights {
            attn_norm: l.attn_norm,
            wq: rows(l.wq, q.clone(), &n("wq"))?,
            wk: rows(l.wk, kv.clone(), &n("wk"))?,
            wv: rows(l.wv, kv.clone(), &n("wv"))?,
            wo: cols(l.wo, q.clone(), &n("wo"))?,
            bq: part(l.bq, q, &n("bq"))?,
            bk: part(l.bk, kv.clone(), &n("bk"))?,
            bv: part(l.bv, kv, &n("bv"))?,
            ffn_norm: l.ffn_norm,
            w_gate: rows(l.w_gate, inter.clone(), &n("w_gate"))?,
            w_up: rows(l.w_up, inter.clone(), &n("w_up"))?,
            w_down: cols(l.w_down, inter, &n("w_down"))?,
            gemma: l.gemma,
        })
    }

    fn token_embedding(&mut self) -> Result<Weight, ModelError> {
        let w = self.inner.token_embedding()?;
        rows(w, self.shard.vocab.clone(), "token_embedding")
    }

    fn lm_head(&mut self) -> Result<Option<Weight>, ModelError> {
        let vocab = self.shard.vocab.clone();
        self.inner
            .lm_head()?
            .map(|w| rows(w, vocab, "lm_head"))
            .transpose()
    }

    fn final_norm(&mut self) -> Result<Tensor, ModelError> {
        self.inner.final_norm()
    }

    fn vocab_rows(&self) -> Option<Range<usize>> {
        Some(self.shard.vocab.clone())
    }
}
