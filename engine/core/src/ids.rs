//! The engine's newtype ids: who a request is ([`RequestId`]), which sequence
//! the KV cache tracks ([`SeqId`]), which physical block holds K/V
//! ([`BlockId`]), and one block move ([`BlockCopy`]).

use std::fmt;

/// The caller's name for a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RequestId(pub u64);

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "req-{}", self.0)
    }
}

/// A sequence as the KV cache knows it. The scheduler hands these out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SeqId(pub u64);

/// A physical block index inside one pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockId(pub u32);

/// One block copy the executor must perform before the forward pass.
/// For copy-on-write both ids are in the accelerator pool; for swaps `src`
/// and `dst` are in the pools named by the operation (out: device -> CPU,
/// in: CPU -> device).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BlockCopy {
    pub src: BlockId,
    pub dst: BlockId,
}

/// A LoRA adapter as the engine knows it: given once per adapter loaded
/// (never reused for different weights), part of a request's prefix-cache
/// key. The base model has none.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LoraId(pub u32);
