//! A trivial allocator and greedy generation, for tests, benchmarks and the
//! `server generate` quick look. The real KV cache manager lives in
//! `crate::kv`; this one gives sequence `i` the fixed, contiguous run of
//! blocks `[i * blocks_per_seq, (i + 1) * blocks_per_seq)`.

use crate::executor::{BlockOps, ExecError, Executor, ForwardBatch, Sampling, SeqSpan};
use crate::kv::BlockId;

/// Largest prompt chunk `generate_greedy` sends in one forward pass.
const PREFILL_CHUNK: usize = 512;

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

/// Index of the largest logit (the first one on ties; NaNs never win).
pub fn argmax(row: &[f32]) -> u32 {
    let mut best = 0;
    let mut best_v = f32::NEG_INFINITY;
    for (i, &v) in row.iter().enumerate() {
        if v > best_v {
            best_v = v;
            best = i;
        }
    }
    best as u32
}

/// Greedy continuation of `prompt` (up to `max_new_tokens`, stopping after
/// an id in `eos_ids`, which is included), using blocks from 0 upwards of
/// the executor's pool. `on_token` sees each new id as it is produced.
pub fn generate_greedy<E: Executor + ?Sized>(
    exec: &mut E,
    prompt: &[u32],
    max_new_tokens: usize,
    eos_ids: &[u32],
    mut on_token: impl FnMut(u32),
) -> Result<Vec<u32>, ExecError> {
    if prompt.is_empty() {
        return Err(ExecError::InvalidBatch("empty prompt".into()));
    }
    let bs = exec.block_size();
    let total = prompt.len() + max_new_tokens;
    let layout = ContiguousLayout {
        block_size: bs,
        blocks_per_seq: total.div_ceil(bs),
    };
    if layout.blocks_per_seq > exec.num_blocks().0 {
        return Err(ExecError::InvalidBatch(format!(
            "{total} tokens need {} blocks, the pool has {}",
            layout.blocks_per_seq,
            exec.num_blocks().0
        )));
    }
    let mut out = Vec::new();
    if max_new_tokens == 0 {
        return Ok(out);
    }
    let ops = BlockOps::default();
    let mut past = 0;
    let mut next = 0;
    for chunk in prompt.chunks(PREFILL_CHUNK) {
        let mut batch = ForwardBatch::default();
        layout.push(
            &mut batch,
            0,
            past,
            chunk,
            past + chunk.len() == prompt.len(),
        );
        let logits = exec.execute(&ops, &batch, &Sampling::Host)?.into_logits()?;
        past += chunk.len();
        if logits.rows == 1 {
            next = argmax(logits.row(0));
        }
    }
    loop {
        out.push(next);
        on_token(next);
        if out.len() == max_new_tokens || eos_ids.contains(&next) {
            return Ok(out);
        }
        let mut batch = ForwardBatch::default();
        layout.push(&mut batch, 0, past, &[next], true);
        past += 1;
        next = argmax(
            exec.execute(&ops, &batch, &Sampling::Host)?
                .into_logits()?
                .row(0),
        );
    }
}
