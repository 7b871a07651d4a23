//! A small, fast, deterministic hasher (the Fx multiply-rotate scheme) for
//! the manager's internal maps, whose keys are sequence ids handed out by the
//! scheduler and block hashes that are already uniformly distributed. Not
//! collision resistant: never use it on keys a client chooses directly.

use std::hash::{BuildHasherDefault, Hasher};

const K: u64 = 0x517c_c1b7_2722_0a95;

/// Fx-style hasher: `h = (h.rotl(5) ^ word) * K` per 64-bit word.
#[derive(Debug, Default, Clone, Copy)]
pub struct FxHasher(u64);

impl FxHasher {
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(K);
    }
}

impl Hasher for FxHasher {
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut buf = [0u8; 8];
            buf[..chunk.len()].copy_from_slice(chunk);
            self.add(u64::from_le_bytes(buf));
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.add(n);
    }

    fn write_u128(&mut self, n: u128) {
        self.add(n as u64);
        self.add((n >> 64) as u64);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// `HashMap` hasher builder for the internal maps.
pub type FxBuild = BuildHasherDefault<FxHasher>;
