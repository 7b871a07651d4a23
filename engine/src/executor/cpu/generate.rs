//! A trivial allocator and greedy generation, for tests, benchmarks and the
//! `server generate` quick look. The real KV cache manager lives in
//! `crate::kv`; this one gives sequence `i` the fixed, contiguous run of
//! blocks `[i * blocks_per_seq, (i + 1) * blocks_per_seq)`.

pub use engine_core::ContiguousLayout;

use crate::executor::{BlockOps, ExecError, Executor, ForwardBatch, Sampling};

/// Largest prompt chunk `generate_greedy` sends in one forward pass.
const PREFILL_CHUNK: usize = 512;

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
