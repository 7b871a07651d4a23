//! Rank 0's commands to the other ranks, as the bytes one broadcast
//! carries: a tag, then each field as little-endian integers (lengths
//! first). Decoding checks every length against the bytes left, so a
//! short or garbled message is a typed error, never a panic.
//!
//! Cost: O(tokens + block-table entries) per step, a few KB at batch 32.

use engine_core::{BlockCopy, BlockId, BlockOps, ExecError, ForwardBatch, SeqSpan};

/// What the other ranks do next.
#[derive(Debug, Clone, PartialEq)]
pub enum Command {
    /// Block moves, then the forward pass of `batch` (logits stay on rank 0).
    Step { ops: BlockOps, batch: ForwardBatch },
    /// Rank 0 is stopping: leave the loop.
    Shutdown,
}

const STEP: u8 = 1;
const SHUTDOWN: u8 = 2;

impl Command {
    /// The command's bytes.
    pub fn encode(&self) -> Vec<u8> {
        match self {
            Command::Shutdown => vec![SHUTDOWN],
            Command::Step { ops, batch } => encode_step(ops, batch),
        }
    }

    /// Reads a command written by [`Self::encode`].
    pub fn decode(bytes: &[u8]) -> Result<Self, ExecError> {
        let mut r = Reader { bytes, at: 0 };
        match r.byte()? {
            SHUTDOWN => Ok(Command::Shutdown),
            STEP => {
                let mut lists = Vec::with_capacity(3);
                for _ in 0..3 {
                    let n = r.len()?;
                    let mut copies = Vec::with_capacity(n);
                    for _ in 0..n {
                        copies.push(BlockCopy {
                            src: r.block()?,
                            dst: r.block()?,
                        });
                    }
                    lists.push(copies);
                }
                let copies = lists.pop().unwrap_or_default();
                let swap_in = lists.pop().unwrap_or_default();
                let swap_out = lists.pop().unwrap_or_default();
                let token_ids = r
                    .list()?
                    .into_iter()
                    .map(|t| u32::try_from(t).map_err(|_| bad("token id")))
                    .collect::<Result<_, _>>()?;
                let positions = r.list()?;
                let slot_mapping = r.list()?;
                let logits_rows = r.list()?;
                let n = r.len()?;
                let mut seqs = Vec::with_capacity(n);
                for _ in 0..n {
                    let query_len = r.u64()?;
                    let context_len = r.u64()?;
                    let block_table = r
                        .list()?
                        .into_iter()
                        .map(block_id)
                        .collect::<Result<_, _>>()?;
                    seqs.push(SeqSpan {
                        query_len,
                        context_len,
                        block_table,
                    });
                }
                if r.at != bytes.len() {
                    return Err(bad("trailing bytes"));
                }
                Ok(Command::Step {
                    ops: BlockOps {
                        swap_out,
                        swap_in,
                        copies,
                    },
                    batch: ForwardBatch {
                        token_ids,
                        positions,
                        slot_mapping,
                        seqs,
                        logits_rows,
                    },
                })
            }
            t => Err(bad(&format!("unknown command tag {t}"))),
        }
    }
}

/// The bytes of [`Command::Step`] for `ops` and `batch`, written from
/// borrows (rank 0 sends every step: no copy of the batch is made).
pub fn encode_step(ops: &BlockOps, batch: &ForwardBatch) -> Vec<u8> {
    let words = 4
        + 2 * (ops.swap_out.len() + ops.swap_in.len() + ops.copies.len())
        + 4 * batch.token_ids.len()
        + batch
            .seqs
            .iter()
            .map(|s| 3 + s.block_table.len())
            .sum::<usize>()
        + 5;
    let mut w = Vec::with_capacity(1 + 8 * words);
    w.push(STEP);
    for copies in [&ops.swap_out, &ops.swap_in, &ops.copies] {
        put(&mut w, copies.len());
        for c in copies.iter() {
            put(&mut w, c.src.0 as usize);
            put(&mut w, c.dst.0 as usize);
        }
    }
    put_iter(&mut w, batch.token_ids.iter().map(|&t| t as usize));
    for v in [&batch.positions, &batch.slot_mapping, &batch.logits_rows] {
        put_iter(&mut w, v.iter().copied());
    }
    put(&mut w, batch.seqs.len());
    for s in &batch.seqs {
        put(&mut w, s.query_len);
        put(&mut w, s.context_len);
        put_iter(&mut w, s.block_table.iter().map(|b| b.0 as usize));
    }
    w
}

fn bad(what: &str) -> ExecError {
    ExecError::Collective(format!("malformed step command from rank 0: {what}"))
}

fn block_id(v: usize) -> Result<BlockId, ExecError> {
    u32::try_from(v).map(BlockId).map_err(|_| bad("block id"))
}

fn put(w: &mut Vec<u8>, v: usize) {
    w.extend_from_slice(&(v as u64).to_le_bytes());
}

/// A length, then the values.
fn put_iter(w: &mut Vec<u8>, v: impl ExactSizeIterator<Item = usize>) {
    put(w, v.len());
    v.for_each(|x| put(w, x));
}

struct Reader<'b> {
    bytes: &'b [u8],
    at: usize,
}

impl Reader<'_> {
    fn byte(&mut self) -> Result<u8, ExecError> {
        let b = *self.bytes.get(self.at).ok_or_else(|| bad("empty"))?;
        self.at += 1;
        Ok(b)
    }

    fn u64(&mut self) -> Result<usize, ExecError> {
        let end = self.at + 8;
        let b = self.bytes.get(self.at..end).ok_or_else(|| bad("short"))?;
        self.at = end;
        let v = u64::from_le_bytes(b.try_into().map_err(|_| bad("short"))?);
        usize::try_from(v).map_err(|_| bad("value out of range"))
    }

    /// A length, checked against the bytes left (8 per item at least).
    fn len(&mut self) -> Result<usize, ExecError> {
        let n = self.u64()?;
        if n > (self.bytes.len() - self.at) / 8 {
            return Err(bad("length past the end"));
        }
        Ok(n)
    }

    fn list(&mut self) -> Result<Vec<usize>, ExecError> {
        let n = self.len()?;
        (0..n).map(|_| self.u64()).collect()
    }

    fn block(&mut self) -> Result<BlockId, ExecError> {
        block_id(self.u64()?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step() -> Command {
        Command::Step {
            ops: BlockOps {
                swap_out: vec![BlockCopy {
                    src: BlockId(3),
                    dst: BlockId(0),
                }],
                swap_in: vec![],
                copies: vec![BlockCopy {
                    src: BlockId(7),
                    dst: BlockId(9),
                }],
            },
            batch: ForwardBatch {
                token_ids: vec![5, 6, 7, 49151],
                positions: vec![0, 1, 2, 10],
                slot_mapping: vec![16, 17, 18, 42],
                seqs: vec![
                    SeqSpan {
                        query_len: 3,
                        context_len: 3,
                        block_table: vec![BlockId(1)],
                    },
                    SeqSpan {
                        query_len: 1,
                        context_len: 11,
                        block_table: vec![BlockId(2), BlockId(2 << 20)],
                    },
                ],
                logits_rows: vec![2, 3],
            },
        }
    }

    #[test]
    fn commands_round_trip() {
        for c in [step(), Command::Shutdown] {
            assert_eq!(Command::decode(&c.encode()).expect("decode"), c);
        }
    }

    #[test]
    fn every_truncation_and_garbage_is_an_error() {
        let bytes = step().encode();
        for cut in 0..bytes.len() {
            assert!(Command::decode(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        let mut long = bytes.clone();
        long.push(0);
        assert!(Command::decode(&long).is_err());
        assert!(Command::decode(&[9]).is_err());
        // A huge length is refused before any allocation.
        let mut huge = vec![STEP];
        huge.extend_from_slice(&u64::MAX.to_le_bytes());
        assert!(Command::decode(&huge).is_err());
    }
}
