//! The persistent device batch (as vLLM v1's persistent input batch): the
//! step's integers live in device buffers that outlive the step, and the
//! block tables are updated from what changed since the previous step
//! instead of being rebuilt and uploaded whole.
//!
//! - Block tables: one `u32[rows, cols]` device table, row `i` holding the
//!   step's sequence `i`, and its host mirror; `cols` covers the model's
//!   longest sequence from the start (SmolLM2, 8192 positions in blocks of
//!   16: 512 columns, 2 KB a row), so only new rows ever grow it. Each step compares every row's
//!   used blocks (`ceil(context_len / block_size)`) with the mirror and
//!   uploads only the words that differ (a decode step: the rows that gained
//!   a block; a sequence that joins: its row), runs closer than
//!   [`MERGE_GAP`] words going up as one copy. Rows are the scheduler's
//!   order: a sequence that leaves shifts the rows after it, which then
//!   differ and go up again (the diff finds that; nothing else tracks
//!   identities).
//! - The step words (ids, positions, slots, logits rows, context lengths,
//!   query starts) change every step and go up in one copy into a buffer
//!   that is kept; their offsets depend only on the counts, so a padded
//!   decode step of a graph bucket always uses the same addresses.
//! - Padded decode (a CUDA-graph step of bucket `B` with `k < B` rows): rows
//!   `k..B` get token 0 at position 0, context 1, logits row = the row, a
//!   slot of their own in the pool's padding blocks
//!   (`KvPools::pad_slot`), whose block is their whole table: they write no
//!   real block and read only their own slot.
//!
//! Invariants: the mirror equals the device table (both zeroed at
//! allocation; every change to the mirror is uploaded in the same call); the
//! table only grows (a growth reallocates, which changes the address and so
//! retires every captured graph).
//!
//! Cost: O(sum of used blocks) host compares per step; bytes up per step:
//! the step words (about 6 words per sequence in decode) plus the changed
//! table words. No allocation per step once the buffers reach the largest
//! batch.

use super::{ensure, Meta};
use crate::executor::gpu::blocks::KvPools;
use crate::executor::gpu::device::{DevBuf, Device};
use crate::executor::gpu::GpuError;
use crate::executor::ForwardBatch;

/// Changed table words closer than this many words go up in one copy: an
/// upload call costs the host a few microseconds, while 4 KB more in the
/// same copy cost well under one (PCIe moves 4 KB in about 0.2 us).
pub const MERGE_GAP: usize = 1024;

/// Device buffers and host staging of the step's integers. See the module docs.
#[derive(Default)]
pub struct DeviceBatch {
    step: Option<DevBuf>,
    table: Option<DevBuf>,
    rows_cap: usize,
    cols: usize,
    /// What the device table holds, `rows_cap * cols` words.
    mirror: Vec<u32>,
    /// Changed runs of the table this step: `[start, end)` word offsets.
    runs: Vec<(usize, usize)>,
    words: Vec<u32>,
    bytes: Vec<u8>,
}

/// A padded decode step: `bucket` rows, padding rows' slots from `kv`.
pub struct Padding<'a> {
    pub bucket: usize,
    pub kv: &'a KvPools,
    /// The context bound the decode plan is fixed for (the model's positions).
    pub max_context: usize,
}

impl DeviceBatch {
    /// The device buffers (for the graphs' address fingerprint).
    pub fn buffers(&self) -> [Option<&DevBuf>; 2] {
        [self.step.as_ref(), self.table.as_ref()]
    }

    /// Returns the device buffers.
    pub fn release(self, dev: &mut dyn Device) -> Result<(), GpuError> {
        [self.step, self.table]
            .into_iter()
            .flatten()
            .try_for_each(|b| dev.free(b))
    }

    /// Uploads a validated `batch`'s integers (padded to `pad.bucket` rows
    /// when given: a decode-only batch whose logits rows are `0..k`) and
    /// returns where they are. The table gets at least `max_positions /
    /// block_size` columns at its first allocation (a sequence never needs
    /// more), so it grows only in rows.
    pub fn upload(
        &mut self,
        dev: &mut dyn Device,
        batch: &ForwardBatch,
        (block_size, max_positions): (usize, usize),
        pad: Option<&Padding<'_>>,
    ) -> Result<Meta, GpuError> {
        let k = batch.seqs.len();
        let rows = pad.map_or(k, |p| p.bucket);
        let used = |ctx: usize| ctx.div_ceil(block_size);
        let need_cols = batch
            .seqs
            .iter()
            .map(|s| used(s.context_len))
            .max()
            .unwrap_or(0)
            .max(max_positions.div_ceil(block_size))
            .max(1);
        self.reserve_table(dev, rows, need_cols)?;
        self.runs.clear();
        let cols = self.cols;
        for (i, s) in batch.seqs.iter().enumerate() {
            let table = s.block_table[..used(s.context_len)].iter().map(|b| b.0);
            self.diff_row(i * cols, table);
        }
        if let Some(p) = pad {
            for j in 0..rows - k {
                let block = (p.kv.pad_slot(j) / block_size) as u32;
                self.diff_row((k + j) * cols, std::iter::once(block));
            }
        }
        self.upload_runs(dev)?;
        self.upload_step(dev, batch, pad)
    }

    /// Grows the table to at least `rows` x `cols` (doubling), zeroed on the
    /// device and in the mirror.
    fn reserve_table(
        &mut self,
        dev: &mut dyn Device,
        rows: usize,
        cols: usize,
    ) -> Result<(), GpuError> {
        if self.table.is_some() && rows <= self.rows_cap && cols <= self.cols {
            return Ok(());
        }
        let rows_cap = rows.max(self.rows_cap).next_power_of_two().max(8);
        let cols = cols.max(self.cols).next_power_of_two();
        if let Some(old) = self.table.take() {
            dev.free(old)?;
        }
        self.table = Some(dev.alloc(4 * rows_cap * cols)?);
        self.rows_cap = rows_cap;
        self.cols = cols;
        self.mirror.clear();
        self.mirror.resize(rows_cap * cols, 0);
        Ok(())
    }

    /// Writes `table` into the mirror's row at word `at`, recording the
    /// changed span.
    fn diff_row(&mut self, at: usize, table: impl Iterator<Item = u32>) {
        let mut span: Option<(usize, usize)> = None;
        for (i, b) in table.enumerate() {
            let w = &mut self.mirror[at + i];
            if *w != b {
                *w = b;
                let e = span.get_or_insert((at + i, at + i + 1));
                e.1 = at + i + 1;
            }
        }
        if let Some((start, end)) = span {
            match self.runs.last_mut() {
                Some(last) if start <= last.1 + MERGE_GAP => last.1 = end,
                _ => self.runs.push((start, end)),
            }
        }
    }

    /// Uploads the changed runs of the mirror.
    fn upload_runs(&mut self, dev: &mut dyn Device) -> Result<(), GpuError> {
        let Some(table) = &self.table else {
            return Ok(());
        };
        for &(start, end) in &self.runs {
            self.bytes.clear();
            self.bytes
                .extend(self.mirror[start..end].iter().flat_map(|w| w.to_le_bytes()));
            dev.upload(table.ptr.offset(4 * start), &self.bytes)?;
        }
        Ok(())
    }

    /// Packs and uploads the step words (one copy).
    fn upload_step(
        &mut self,
        dev: &mut dyn Device,
        batch: &ForwardBatch,
        pad: Option<&Padding<'_>>,
    ) -> Result<Meta, GpuError> {
        let k = batch.seqs.len();
        let (n, r, s) = match pad {
            Some(p) => (p.bucket, p.bucket, p.bucket),
            None => (batch.token_ids.len(), batch.logits_rows.len(), k),
        };
        let extra = n - batch.token_ids.len();
        let v = &mut self.words;
        v.clear();
        v.extend_from_slice(&batch.token_ids);
        v.extend(std::iter::repeat_n(0, extra));
        v.extend(batch.positions.iter().map(|&p| p as u32));
        v.extend(std::iter::repeat_n(0, extra));
        v.extend(batch.slot_mapping.iter().map(|&s| s as u32));
        if let Some(p) = pad {
            v.extend((0..extra).map(|j| p.kv.pad_slot(j) as u32));
            v.extend((0..r).map(|i| i as u32));
        } else {
            v.extend(batch.logits_rows.iter().map(|&r| r as u32));
        }
        v.extend(batch.seqs.iter().map(|s| s.context_len as u32));
        v.extend(std::iter::repeat_n(1, s - k));
        v.push(0);
        let mut start = 0u32;
        for q in batch
            .seqs
            .iter()
            .map(|s| s.query_len)
            .chain(std::iter::repeat_n(1, s - k))
        {
            start += q as u32;
            v.push(start);
        }
        self.bytes.clear();
        self.bytes.extend(v.iter().flat_map(|x| x.to_le_bytes()));
        let base = ensure(dev, &mut self.step, self.bytes.len())?;
        dev.upload(base, &self.bytes)?;
        let table = self
            .table
            .as_ref()
            .ok_or_else(|| GpuError::Device("block table not allocated".into()))?;
        let at = |words: usize| base.offset(4 * words);
        let real_max = batch.seqs.iter().map(|s| s.context_len).max().unwrap_or(0);
        let real_total = batch.seqs.iter().map(|s| s.context_len).sum();
        Ok(Meta {
            ids: at(0),
            positions: at(n),
            slots: at(2 * n),
            rows: at(3 * n),
            context_lens: at(3 * n + r),
            query_start: at(3 * n + r + s),
            tables: table.ptr,
            max_blocks: self.cols,
            // A graph's decode plan is fixed for any context up to the bound.
            max_context: pad.map_or(real_max, |p| p.max_context),
            total_context: pad.map_or(real_total, |p| p.bucket * p.max_context),
            all_decode: batch.seqs.iter().all(|s| s.query_len == 1),
        })
    }
}
