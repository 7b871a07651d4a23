//! Rank 0's commands to the other ranks, as the bytes one broadcast
//! carries: a tag, then each field as little-endian integers (lengths
//! first). Decoding checks every length against the bytes left, so a
//! short or garbled message is a typed error, never a panic.
//!
//! Cost: O(tokens + block-table entries) per step, a few KB at batch 32;
//! a LoRA adapter's weights once, before the first step that uses it
//! (`r x (in + out)` floats per adapted matrix).

use engine_core::{BlockCopy, BlockId, BlockOps, ExecError, ForwardBatch, LoraId, SeqSpan};
use model_loader::lora::{LoraAdapter, LoraFormat, LoraLayer, LoraPair};

/// What the other ranks do next.
#[derive(Debug, Clone, PartialEq)]
pub enum Command {
    /// Block moves, then the forward pass of `batch` (logits stay on rank 0),
    /// with the adapters `lora` names.
    Step {
        ops: BlockOps,
        batch: ForwardBatch,
        lora: LoraIds,
    },
    /// An adapter's weights, sent before the first step whose slot table
    /// holds `id` (ids are never reused, so a rank keeps them by id).
    Adapter { id: LoraId, adapter: LoraAdapter },
    /// Rank 0 is stopping: leave the loop.
    Shutdown,
}

/// A step's adapters by id: the executor's `LoraStep` without the weights,
/// which the ranks already hold ([`Command::Adapter`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LoraIds {
    /// The slot table (`None`: empty slot). Empty when no row is adapted.
    pub slots: Vec<Option<LoraId>>,
    /// Per sequence, its slot (`LoraStep::seq_slot`).
    pub seq_slot: Vec<Option<u32>>,
}

const STEP: u8 = 1;
const SHUTDOWN: u8 = 2;
const ADAPTER: u8 = 3;

impl Command {
    /// The command's bytes.
    pub fn encode(&self) -> Vec<u8> {
        match self {
            Command::Shutdown => vec![SHUTDOWN],
            Command::Step { ops, batch, lora } => encode_step(ops, batch, lora),
            Command::Adapter { id, adapter } => encode_adapter(*id, adapter),
        }
    }

    /// Reads a command written by [`Self::encode`].
    pub fn decode(bytes: &[u8]) -> Result<Self, ExecError> {
        let mut r = Reader { bytes, at: 0 };
        let command = match r.byte()? {
            SHUTDOWN => Command::Shutdown,
            ADAPTER => {
                let id = LoraId(r.u32()?);
                Command::Adapter {
                    id,
                    adapter: r.adapter()?,
                }
            }
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
                let slots = r
                    .list()?
                    .into_iter()
                    .map(|v| opt_u32(v).map(|s| s.map(LoraId)))
                    .collect::<Result<_, _>>()?;
                let seq_slot = r
                    .list()?
                    .into_iter()
                    .map(opt_u32)
                    .collect::<Result<_, _>>()?;
                Command::Step {
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
                    lora: LoraIds { slots, seq_slot },
                }
            }
            t => return Err(bad(&format!("unknown command tag {t}"))),
        };
        if r.at != bytes.len() {
            return Err(bad("trailing bytes"));
        }
        Ok(command)
    }
}

/// The bytes of [`Command::Step`] for `ops`, `batch` and `lora`, written
/// from borrows (rank 0 sends every step: no copy of the batch is made).
pub fn encode_step(ops: &BlockOps, batch: &ForwardBatch, lora: &LoraIds) -> Vec<u8> {
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
    // Optional ids as 0 (none) or id + 1.
    let opt = |v: Option<u32>| v.map_or(0, |x| x as usize + 1);
    put_iter(&mut w, lora.slots.iter().map(|s| opt(s.map(|id| id.0))));
    put_iter(&mut w, lora.seq_slot.iter().map(|&s| opt(s)));
    w
}

/// The bytes of [`Command::Adapter`], written from a borrow.
pub fn encode_adapter(id: LoraId, a: &LoraAdapter) -> Vec<u8> {
    let mut w = vec![ADAPTER];
    put(&mut w, id.0 as usize);
    w.push(match a.format {
        LoraFormat::Peft => 0,
        LoraFormat::Gguf => 1,
    });
    put(&mut w, a.rank);
    put_floats(&mut w, &[a.alpha, a.scale]);
    let name = a.base_model.as_deref().unwrap_or_default().as_bytes();
    w.push(u8::from(a.base_model.is_some()));
    put(&mut w, name.len());
    w.extend_from_slice(name);
    put(&mut w, a.layers.len());
    for l in &a.layers {
        for p in &l.pairs {
            w.push(u8::from(p.is_some()));
            if let Some(p) = p {
                put_floats(&mut w, &p.a);
                put_floats(&mut w, &p.b);
            }
        }
    }
    w
}

/// `None` for 0, else `v - 1` (see `encode_step`).
fn opt_u32(v: usize) -> Result<Option<u32>, ExecError> {
    match v {
        0 => Ok(None),
        v => u32::try_from(v - 1)
            .map(Some)
            .map_err(|_| bad("adapter id")),
    }
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

/// A length, then the values' 4-byte little-endian bits.
fn put_floats(w: &mut Vec<u8>, v: &[f32]) {
    put(w, v.len());
    v.iter().for_each(|x| w.extend_from_slice(&x.to_le_bytes()));
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

    fn u32(&mut self) -> Result<u32, ExecError> {
        u32::try_from(self.u64()?).map_err(|_| bad("value out of range"))
    }

    /// `n` raw bytes.
    fn bytes(&mut self, n: usize) -> Result<&[u8], ExecError> {
        let end = self
            .at
            .checked_add(n)
            .ok_or_else(|| bad("length past the end"))?;
        let b = self.bytes.get(self.at..end).ok_or_else(|| bad("short"))?;
        self.at = end;
        Ok(b)
    }

    /// A length, checked against the bytes left (4 per value), then the values.
    fn floats(&mut self) -> Result<Vec<f32>, ExecError> {
        let n = self.u64()?;
        if n > (self.bytes.len() - self.at) / 4 {
            return Err(bad("length past the end"));
        }
        Ok(self
            .bytes(4 * n)?
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }

    fn adapter(&mut self) -> Result<LoraAdapter, ExecError> {
        let format = match self.byte()? {
            0 => LoraFormat::Peft,
            1 => LoraFormat::Gguf,
            _ => return Err(bad("adapter format")),
        };
        let rank = self.u64()?;
        let (alpha, scale) = match self.floats()?.as_slice() {
            &[alpha, scale] => (alpha, scale),
            _ => return Err(bad("adapter alpha and scale")),
        };
        let named = self.byte()? == 1;
        let n = self.u64()?;
        let name =
            String::from_utf8(self.bytes(n)?.to_vec()).map_err(|_| bad("base model name"))?;
        // Each layer takes 7 bytes at least (a flag per target).
        let layers = self.u64()?;
        if layers > (self.bytes.len() - self.at) / 7 {
            return Err(bad("length past the end"));
        }
        let mut out = Vec::with_capacity(layers);
        for _ in 0..layers {
            let mut layer = LoraLayer::default();
            for pair in &mut layer.pairs {
                if self.byte()? == 1 {
                    *pair = Some(LoraPair {
                        a: self.floats()?,
                        b: self.floats()?,
                    });
                }
            }
            out.push(layer);
        }
        Ok(LoraAdapter {
            format,
            rank,
            alpha,
            scale,
            base_model: named.then_some(name),
            layers: out,
        })
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
            lora: LoraIds {
                slots: vec![None, Some(LoraId(7)), Some(LoraId(0))],
                seq_slot: vec![Some(1), None],
            },
        }
    }

    fn adapter() -> Command {
        let mut layer = LoraLayer::default();
        layer.pairs[2] = Some(LoraPair {
            a: vec![0.5, -1.25, 3.0],
            b: vec![f32::MIN_POSITIVE, 2.0],
        });
        Command::Adapter {
            id: LoraId(7),
            adapter: LoraAdapter {
                format: LoraFormat::Gguf,
                rank: 1,
                alpha: 16.0,
                scale: 2.0,
                base_model: Some("SmolLM2".into()),
                layers: vec![LoraLayer::default(), layer],
            },
        }
    }

    #[test]
    fn commands_round_trip() {
        for c in [step(), adapter(), Command::Shutdown] {
            assert_eq!(Command::decode(&c.encode()).expect("decode"), c);
        }
    }

    #[test]
    fn every_truncation_and_garbage_is_an_error() {
        for bytes in [step().encode(), adapter().encode()] {
            for cut in 0..bytes.len() {
                assert!(Command::decode(&bytes[..cut]).is_err(), "cut at {cut}");
            }
            let mut long = bytes.clone();
            long.push(0);
            assert!(Command::decode(&long).is_err());
        }
        let bytes = step().encode();
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
