//! What an executor is handed and what it hands back: [`ForwardBatch`] and
//! [`BlockOps`] in, [`Logits`] (or [`GreedyRow`]s) out, the pool's shape
//! ([`KvGeometry`]) and [`validate_batch`], which every executor runs before
//! anything touches memory.
//!
//! Invariants: after [`validate_batch`] succeeds the forward pass may index
//! without further checks: lengths agree, every token id is in the vocabulary,
//! every position has a rotary entry, each sequence's tokens sit at positions
//! `context_len - query_len ..context_len`, every block id the attention
//! reads is inside the pool, and every K/V slot is the one the block table
//! names for the token's position.
//!
//! Cost: [`validate_batch`] is O(tokens + block table entries); the rest are
//! plain data.

use crate::error::ExecError;
use crate::ids::{BlockCopy, BlockId};

/// The tokens of one sequence in a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeqSpan {
    /// Number of this step's tokens for the sequence (prompt chunk or 1).
    /// The sequence's tokens are consecutive in [`ForwardBatch::token_ids`].
    pub query_len: usize,
    /// Tokens in the KV cache for this sequence once this step's tokens are
    /// written (cached prefix + this step's tokens).
    pub context_len: usize,
    /// Accelerator block table covering `context_len` tokens.
    pub block_table: Vec<BlockId>,
}

/// One forward pass over sequences of different lengths (prefill chunks and
/// decode tokens mixed).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ForwardBatch {
    /// All new tokens, sequence after sequence.
    pub token_ids: Vec<u32>,
    /// Position of each token in its sequence.
    pub positions: Vec<usize>,
    /// Slot (block * block_size + offset) where each token's K/V is written.
    pub slot_mapping: Vec<usize>,
    /// Per-sequence spans, in the order of `token_ids`.
    pub seqs: Vec<SeqSpan>,
    /// Rows of `token_ids` whose logits are wanted (usually each sequence's last).
    pub logits_rows: Vec<usize>,
}

/// Block movements to perform before the forward pass, in this order:
/// swap out, swap in, copy-on-write copies.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BlockOps {
    /// Accelerator -> CPU pool.
    pub swap_out: Vec<BlockCopy>,
    /// CPU pool -> accelerator.
    pub swap_in: Vec<BlockCopy>,
    /// Inside the accelerator pool.
    pub copies: Vec<BlockCopy>,
}

impl BlockOps {
    /// True when there is nothing to move.
    pub fn is_empty(&self) -> bool {
        self.swap_out.is_empty() && self.swap_in.is_empty() && self.copies.is_empty()
    }
}

/// Logits for the rows asked for, row-major `[rows, vocab]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Logits {
    pub rows: usize,
    pub vocab: usize,
    pub data: Vec<f32>,
}

impl Logits {
    /// The logits of one requested row.
    pub fn row(&self, i: usize) -> &[f32] {
        &self.data[i * self.vocab..(i + 1) * self.vocab]
    }
}

/// One logits row reduced to its greedy choice on the device: the argmax
/// (lowest id on ties, NaN never wins) and its log-softmax value, exactly as
/// the CPU sampler's greedy path defines them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GreedyRow {
    pub token: u32,
    pub logprob: f32,
}

/// Shape of a pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvGeometry {
    pub num_layers: usize,
    pub num_blocks: usize,
    pub block_size: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
}

impl KvGeometry {
    /// Elements of one token's K (or V) in one layer.
    pub fn token_elems(&self) -> usize {
        self.num_kv_heads * self.head_dim
    }

    /// Elements of one block's K (or V) in one layer.
    pub fn block_elems(&self) -> usize {
        self.block_size * self.token_elems()
    }

    /// Bytes one block takes across all layers, K and V, at `elem_bytes`
    /// per element.
    pub fn bytes_per_block(&self, elem_bytes: usize) -> usize {
        2 * self.num_layers * self.block_elems() * elem_bytes
    }

    /// Total slots in the pool.
    pub fn num_slots(&self) -> usize {
        self.num_blocks * self.block_size
    }
}

fn invalid(msg: String) -> ExecError {
    ExecError::InvalidBatch(msg)
}

/// Checks `batch` against the pool geometry, vocabulary and rotary range.
pub fn validate_batch(
    batch: &ForwardBatch,
    geom: &KvGeometry,
    vocab: usize,
    max_positions: usize,
) -> Result<(), ExecError> {
    let n = batch.token_ids.len();
    if batch.positions.len() != n || batch.slot_mapping.len() != n {
        return Err(invalid(format!(
            "{n} tokens but {} positions and {} slots",
            batch.positions.len(),
            batch.slot_mapping.len()
        )));
    }
    let total: usize = batch.seqs.iter().map(|s| s.query_len).sum();
    if total != n {
        return Err(invalid(format!(
            "sequence spans cover {total} tokens, batch has {n}"
        )));
    }
    if let Some(&id) = batch.token_ids.iter().find(|&&id| id as usize >= vocab) {
        return Err(invalid(format!(
            "token id {id} outside the vocabulary ({vocab})"
        )));
    }
    if let Some(&r) = batch.logits_rows.iter().find(|&&r| r >= n) {
        return Err(invalid(format!(
            "logits row {r} outside the batch ({n} tokens)"
        )));
    }
    let bs = geom.block_size;
    let mut row = 0;
    for (si, span) in batch.seqs.iter().enumerate() {
        if span.query_len == 0 || span.context_len < span.query_len {
            return Err(invalid(format!(
                "sequence {si}: query_len {} with context_len {}",
                span.query_len, span.context_len
            )));
        }
        let needed = span.context_len.div_ceil(bs);
        if span.block_table.len() < needed {
            return Err(invalid(format!(
                "sequence {si}: block table has {} blocks, context of {} tokens needs {needed}",
                span.block_table.len(),
                span.context_len
            )));
        }
        if let Some(&b) = span.block_table[..needed]
            .iter()
            .find(|b| b.0 as usize >= geom.num_blocks)
        {
            return Err(ExecError::BlockOutOfRange(b));
        }
        let past = span.context_len - span.query_len;
        for i in 0..span.query_len {
            let t = row + i;
            let pos = batch.positions[t];
            if pos != past + i {
                return Err(invalid(format!(
                    "sequence {si}: token {i} at position {pos}, expected {}",
                    past + i
                )));
            }
            if pos >= max_positions {
                return Err(invalid(format!(
                    "position {pos} beyond the model's {max_positions}"
                )));
            }
            let want = span.block_table[pos / bs].0 as usize * bs + pos % bs;
            if batch.slot_mapping[t] != want {
                return Err(invalid(format!(
                    "sequence {si}: token {i} mapped to slot {}, its block table says {want}",
                    batch.slot_mapping[t]
                )));
            }
        }
        row += span.query_len;
    }
    Ok(())
}

/// Fixed per-sequence block runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ContiguousLayout {
    pub block_size: usize,
    pub blocks_per_seq: usize,
}

impl ContiguousLayout {
    /// Block table of sequence `seq` covering `context_len` tokens.
    pub fn block_table(&self, seq: usize, context_len: usize) -> Vec<BlockId> {
        let first = seq * self.blocks_per_seq;
        (first..first + context_len.div_ceil(self.block_size))
            .map(|b| BlockId(b as u32))
            .collect()
    }

    /// Appends `tokens` of sequence `seq` (whose first `past` tokens are
    /// already cached) to `batch`; asks for the last token's logits when
    /// `want_logits`.
    pub fn push(
        &self,
        batch: &mut ForwardBatch,
        seq: usize,
        past: usize,
        tokens: &[u32],
        want_logits: bool,
    ) {
        let context_len = past + tokens.len();
        let table = self.block_table(seq, context_len);
        for (i, &t) in tokens.iter().enumerate() {
            let pos = past + i;
            batch.token_ids.push(t);
            batch.positions.push(pos);
            batch.slot_mapping.push(
                table[pos / self.block_size].0 as usize * self.block_size + pos % self.block_size,
            );
        }
        if want_logits && !tokens.is_empty() {
            batch.logits_rows.push(batch.token_ids.len() - 1);
        }
        batch.seqs.push(SeqSpan {
            query_len: tokens.len(),
            context_len,
            block_table: table,
        });
    }
}
