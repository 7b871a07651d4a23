//! Validation of a [`ForwardBatch`] before any compute touches it.
//!
//! After `validate` succeeds the forward pass may index without further
//! checks: lengths agree, every token id is in the vocabulary, every
//! position has a rotary entry, each sequence's tokens sit at positions
//! `context_len - query_len ..context_len`, every block id the attention
//! reads is inside the pool, and every K/V slot is the one the block table
//! names for the token's position. O(tokens + block table entries).

pub use engine_core::validate_batch as validate;
