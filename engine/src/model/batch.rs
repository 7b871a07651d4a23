//! Validation of a [`ForwardBatch`] before any compute touches it.
//!
//! After `validate` succeeds the forward pass may index without further
//! checks: lengths agree, every token id is in the vocabulary, every
//! position has a rotary entry, each sequence's tokens sit at positions
//! `context_len - query_len ..context_len`, every block id the attention
//! reads is inside the pool, and every K/V slot is the one the block table
//! names for the token's position. O(tokens + block table entries).

use super::kv_cache::KvGeometry;
use crate::executor::{ExecError, ForwardBatch};

fn invalid(msg: String) -> ExecError {
    ExecError::InvalidBatch(msg)
}

/// Checks `batch` against the pool geometry, vocabulary and rotary range.
pub fn validate(
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
