//! The msgpack payload of one published batch, byte for byte what vLLM's
//! `msgspec` encoder wrote for its positional ("array_like") structs before
//! vLLM moved its events to maps (see the parent module): every declared
//! field, in declaration order (msgspec's `omit_defaults` does not shorten
//! array-like structs; checked with msgspec 0.22), tagged events starting
//! with their class name:
//!
//! ```text
//! batch:            [ts: float64, events: [event...], data_parallel_rank: int|nil]
//! BlockStored:      ["BlockStored", block_hashes: [uint...], parent_block_hash: uint|nil,
//!                    token_ids: [uint...], block_size: uint, lora_id: uint|nil,
//!                    medium: str|nil, lora_name: str|nil, extra_keys: list|nil,
//!                    group_idx: uint|nil, kv_cache_spec_kind: str|nil,
//!                    kv_cache_spec_sliding_window: uint|nil]
//! BlockRemoved:     ["BlockRemoved", block_hashes: [uint...], medium: str|nil,
//!                    group_idx: uint|nil]
//! AllBlocksCleared: ["AllBlocksCleared"]
//! ```
//!
//! Our values for vLLM's later fields: one KV cache group of full
//! attention (`group_idx` 0, `kv_cache_spec_kind` "full_attention", no
//! sliding window: every layer of ours shares one block table), no adapters
//! (`lora_id`, `lora_name` nil), no extra hash keys (`extra_keys` nil; the
//! server never sets the cache's extra key). A consumer written for an
//! older, shorter `BlockStored` (vLLM's example subscriber has 6 fields)
//! decodes these arrays with msgspec, which ignores extra trailing elements.
//!
//! Block hashes: ours are 128-bit; like vLLM's `maybe_convert_block_hash`
//! (the integer of the hash bytes, big-endian, masked to 64 bits: its
//! default) we publish the low 64 bits as a msgpack unsigned integer.
//!
//! Integers use msgpack's smallest form (as msgspec writes them), the
//! timestamp is always a float64 (`0xcb`), strings are `str` (not `bin`).
//!
//! Cost: one pass over the events, O(hashes + tokens), into one buffer.

use engine::kv::{BlockHash, KvEvent};

/// vLLM's 64-bit external form of a block hash: the low 64 bits.
pub fn wire_hash(h: BlockHash) -> u64 {
    h.0 as u64
}

/// A growing msgpack buffer. Writes into a `Vec` cannot fail, so rmp's
/// results are dropped.
struct Enc(Vec<u8>);

impl Enc {
    fn array(&mut self, len: usize) {
        let _ = rmp::encode::write_array_len(&mut self.0, len as u32);
    }
    fn uint(&mut self, v: u64) {
        let _ = rmp::encode::write_uint(&mut self.0, v);
    }
    fn sint(&mut self, v: i64) {
        let _ = rmp::encode::write_sint(&mut self.0, v);
    }
    fn nil(&mut self) {
        let _ = rmp::encode::write_nil(&mut self.0);
    }
    fn str(&mut self, s: &str) {
        let _ = rmp::encode::write_str(&mut self.0, s);
    }
    fn f64(&mut self, v: f64) {
        let _ = rmp::encode::write_f64(&mut self.0, v);
    }
    fn opt_uint(&mut self, v: Option<u64>) {
        match v {
            Some(v) => self.uint(v),
            None => self.nil(),
        }
    }
    fn hashes(&mut self, hs: &[BlockHash]) {
        self.array(hs.len());
        for &h in hs {
            self.uint(wire_hash(h));
        }
    }
}

/// vLLM's `kv_cache_spec_kind` of our one KV cache group.
pub const SPEC_KIND: &str = "full_attention";

/// Encodes one `KVEventBatch`: `ts` in seconds since the Unix epoch,
/// `data_parallel_rank` as vLLM's publisher fills it (its rank; 0 here).
pub fn encode_batch(ts: f64, events: &[KvEvent], data_parallel_rank: Option<i64>) -> Vec<u8> {
    let tokens: usize = events
        .iter()
        .map(|e| match e {
            KvEvent::BlockStored {
                block_hashes,
                token_ids,
                ..
            } => 9 * block_hashes.len() + 5 * token_ids.len() + 48,
            KvEvent::BlockRemoved { block_hashes, .. } => 9 * block_hashes.len() + 24,
            KvEvent::AllBlocksCleared => 18,
        })
        .sum();
    let mut e = Enc(Vec::with_capacity(16 + tokens));
    e.array(3);
    e.f64(ts);
    e.array(events.len());
    for ev in events {
        match ev {
            KvEvent::BlockStored {
                block_hashes,
                parent_block_hash,
                token_ids,
                block_size,
                lora_id,
                medium,
            } => {
                e.array(12);
                e.str("BlockStored");
                e.hashes(block_hashes);
                e.opt_uint(parent_block_hash.map(wire_hash));
                e.array(token_ids.len());
                for &t in token_ids {
                    e.uint(u64::from(t));
                }
                e.uint(*block_size as u64);
                e.opt_uint(*lora_id);
                e.str(medium.as_str());
                e.nil(); // lora_name
                e.nil(); // extra_keys
                e.uint(0); // group_idx
                e.str(SPEC_KIND);
                e.nil(); // kv_cache_spec_sliding_window
            }
            KvEvent::BlockRemoved {
                block_hashes,
                medium,
            } => {
                e.array(4);
                e.str("BlockRemoved");
                e.hashes(block_hashes);
                e.str(medium.as_str());
                e.uint(0); // group_idx
            }
            KvEvent::AllBlocksCleared => {
                e.array(1);
                e.str("AllBlocksCleared");
            }
        }
    }
    match data_parallel_rank {
        Some(rank) => e.sint(rank),
        None => e.nil(),
    }
    e.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use engine::kv::KvMedium;

    /// The bytes below are written from the msgpack spec by hand (marker
    /// bytes commented), not produced by an encoder.
    #[test]
    fn a_batch_encodes_to_the_bytes_the_spec_gives() {
        let big = BlockHash((0xdead_u128 << 64) | 0x1_0000_0000);
        let events = vec![
            KvEvent::BlockStored {
                block_hashes: vec![BlockHash(1), big],
                parent_block_hash: None,
                token_ids: vec![1, 2, 300, 70_000],
                block_size: 2,
                lora_id: None,
                medium: KvMedium::Gpu,
            },
            KvEvent::BlockStored {
                block_hashes: vec![BlockHash(200)],
                parent_block_hash: Some(big),
                token_ids: vec![127, 128],
                block_size: 2,
                lora_id: None,
                medium: KvMedium::Gpu,
            },
            KvEvent::BlockRemoved {
                block_hashes: vec![BlockHash(5)],
                medium: KvMedium::Gpu,
            },
            KvEvent::AllBlocksCleared,
        ];
        let mut want: Vec<u8> = vec![
            0x93, // fixarray(3): the batch
            0xcb, 0x3f, 0xf8, 0, 0, 0, 0, 0, 0,    // float64 1.5
            0x94, // fixarray(4): the events
            0x9c, // fixarray(12): BlockStored
            0xab, // fixstr(11)
        ];
        want.extend_from_slice(b"BlockStored");
        want.extend_from_slice(&[
            0x92, // block_hashes: fixarray(2)
            0x01, // positive fixint 1
            0xcf, 0, 0, 0, 0x01, 0, 0, 0, 0,    // uint64 0x1_0000_0000 (high 64 bits dropped)
            0xc0, // parent_block_hash: nil
            0x94, // token_ids: fixarray(4)
            0x01, 0x02, // 1, 2
            0xcd, 0x01, 0x2c, // uint16 300
            0xce, 0, 0x01, 0x11, 0x70, // uint32 70000
            0x02, // block_size 2
            0xc0, // lora_id nil
            0xa3, b'G', b'P', b'U', // medium "GPU"
            0xc0, // lora_name nil
            0xc0, // extra_keys nil
            0x00, // group_idx 0
            0xae, // fixstr(14)
        ]);
        want.extend_from_slice(b"full_attention");
        want.extend_from_slice(&[
            0xc0, // kv_cache_spec_sliding_window nil
            0x9c, 0xab,
        ]);
        want.extend_from_slice(b"BlockStored");
        want.extend_from_slice(&[
            0x91, 0xcc, 0xc8, // [uint8 200]
            0xcf, 0, 0, 0, 0x01, 0, 0, 0, 0, // parent: the low 64 bits of `big`
            0x92, 0x7f, 0xcc, 0x80, // [127 (fixint), uint8 128]
            0x02, 0xc0, 0xa3, b'G', b'P', b'U', 0xc0, 0xc0, 0x00, 0xae,
        ]);
        want.extend_from_slice(b"full_attention");
        want.push(0xc0);
        want.extend_from_slice(&[0x94, 0xac]); // BlockRemoved: fixarray(4), fixstr(12)
        want.extend_from_slice(b"BlockRemoved");
        want.extend_from_slice(&[0x91, 0x05, 0xa3, b'G', b'P', b'U', 0x00]);
        want.extend_from_slice(&[0x91, 0xb0]); // AllBlocksCleared: fixarray(1), fixstr(16)
        want.extend_from_slice(b"AllBlocksCleared");
        want.push(0x00); // data_parallel_rank 0
        assert_eq!(encode_batch(1.5, &events, Some(0)), want);
    }

    #[test]
    fn no_rank_is_nil_and_long_lists_use_the_wider_markers() {
        // No rank: nil (msgspec writes every field of an array-like struct).
        assert_eq!(
            encode_batch(0.0, &[], None),
            vec![0x93, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0x90, 0xc0]
        );
        // 16 hashes: array16 (0xdc, big-endian length).
        let ev = KvEvent::BlockRemoved {
            block_hashes: (0..16).map(BlockHash).collect(),
            medium: KvMedium::Gpu,
        };
        let bytes = encode_batch(0.0, &[ev], Some(0));
        let mut want = vec![0x93, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0x91, 0x94, 0xac];
        want.extend_from_slice(b"BlockRemoved");
        want.extend_from_slice(&[0xdc, 0x00, 0x10]);
        want.extend(0u8..16);
        want.extend_from_slice(&[0xa3, b'G', b'P', b'U', 0x00, 0x00]);
        assert_eq!(bytes, want);
    }
}
