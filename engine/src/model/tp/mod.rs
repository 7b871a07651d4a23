//! The model split for tensor parallelism: [`plan`] says which heads, FFN
//! columns and vocabulary rows each rank holds; [`shard`] hands a rank only
//! its slices of each tensor, so the one model definition (`arch/`) loads
//! a shard as it loads a whole model. The communication is
//! [`crate::dist`]'s; the model files mark where it happens
//! ([`super::backend::Backend::linear_row_parallel`]).

pub mod plan;
pub mod shard;

pub use plan::{RankShard, TpPlan};
pub use shard::ShardSource;

use super::lora::{LoraAdapter, LoraTarget};
use crate::dist::Collective;
use engine_core::{ExecError, Logits};
use model_loader::lora::{LoraLayer, LoraPair};
use std::ops::Range;
use std::sync::Arc;

/// What one rank's forward pass needs: the collectives and the plan.
#[derive(Clone)]
pub struct TpRank {
    pub comm: Arc<dyn Collective>,
    pub plan: Arc<TpPlan>,
}

impl TpRank {
    /// This rank's shard.
    pub fn shard(&self) -> &RankShard {
        &self.plan.ranks[self.comm.rank()]
    }

    /// The LM head's output: each rank's `mine` (`rows` rows of its
    /// vocabulary slice) gathered to rank 0 as one `[rows, vocab]` matrix;
    /// the other ranks get no rows (their step's answer is not read).
    pub fn gather_logits(
        &self,
        rows: usize,
        mine: &[f32],
        vocab: usize,
    ) -> Result<Logits, ExecError> {
        let widths: Vec<usize> = self.plan.ranks.iter().map(|r| r.vocab.len()).collect();
        let counts: Vec<usize> = widths.iter().map(|w| w * rows).collect();
        let all = self.comm.gather(mine, &counts)?;
        Ok(if self.comm.rank() == 0 {
            Logits {
                rows,
                vocab,
                data: interleave(&all, rows, &widths),
            }
        } else {
            Logits {
                rows: 0,
                vocab,
                data: Vec::new(),
            }
        })
    }
}

impl TpRank {
    /// This rank's slice of adapter `a`, cut as the layers it adapts are:
    /// for the column-parallel targets (q, k, v by head, gate and up by FFN
    /// column) the rows of B; for the row-parallel ones (o, down) the
    /// columns of A, whose partial deltas the layer's all-reduce sums.
    pub fn shard_adapter(&self, a: &LoraAdapter) -> LoraAdapter {
        let s = self.shard();
        let hd = self.plan.head_dim;
        let heads = |h: &Range<usize>| h.start * hd..h.end * hd;
        let r = a.rank.max(1);
        // B is `[out, r]`: whole rows. A is `[r, in]`: a range of each row.
        let rows = |b: &[f32], keep: Range<usize>| b[keep.start * r..keep.end * r].to_vec();
        let cols = |a: &[f32], keep: Range<usize>| -> Vec<f32> {
            a.chunks_exact(a.len() / r)
                .flat_map(|row| row[keep.clone()].iter().copied())
                .collect()
        };
        let cut = |t: LoraTarget, p: &LoraPair| -> LoraPair {
            let (a, b) = match t {
                LoraTarget::Q => (p.a.clone(), rows(&p.b, heads(&s.q_heads))),
                LoraTarget::K | LoraTarget::V => (p.a.clone(), rows(&p.b, heads(&s.kv_heads))),
                LoraTarget::Gate | LoraTarget::Up => (p.a.clone(), rows(&p.b, s.inter.clone())),
                LoraTarget::O => (cols(&p.a, heads(&s.q_heads)), p.b.clone()),
                LoraTarget::Down => (cols(&p.a, s.inter.clone()), p.b.clone()),
            };
            LoraPair { a, b }
        };
        LoraAdapter {
            format: a.format,
            rank: a.rank,
            alpha: a.alpha,
            scale: a.scale,
            base_model: a.base_model.clone(),
            layers: a
                .layers
                .iter()
                .map(|l| LoraLayer {
                    pairs: std::array::from_fn(|t| {
                        l.pairs[t].as_ref().map(|p| cut(LoraTarget::ALL[t], p))
                    }),
                })
                .collect(),
        }
    }
}

/// Rank-ordered `[rows, widths[r]]` blocks into one `[rows, sum]` matrix.
fn interleave(blocks: &[f32], rows: usize, widths: &[usize]) -> Vec<f32> {
    let total: usize = widths.iter().sum();
    let mut out = vec![0.0f32; rows * total];
    let (mut src, mut col) = (0, 0);
    for &w in widths {
        for r in 0..rows {
            out[r * total + col..r * total + col + w].copy_from_slice(&blocks[src..src + w]);
            src += w;
        }
        col += w;
    }
    out
}

impl std::fmt::Debug for TpRank {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TpRank")
            .field("rank", &self.comm.rank())
            .field("world", &self.comm.world())
            .field("library", &self.comm.library())
            .finish()
    }
}
