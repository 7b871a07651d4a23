//! Collective communication between tensor-parallel ranks (processes):
//! the floor under the sharded model ([`crate::model::tp`]) and the
//! tensor-parallel executors (`executor/tp.rs`).
//!
//! - [`Collective`]: the three operations the split needs (all-reduce sum,
//!   gather to rank 0, broadcast from rank 0), behind one small trait.
//!   [`Solo`] is world size 1 (no communication at all); `mpi` (feature
//!   `mpi`) runs them on the system's MPI library through rsmpi; `threads`
//!   (tests only) runs ranks as threads of one process.
//! - [`wire`]: rank 0's step commands to the other ranks, as bytes.
//!
//! The split follows vLLM's: q/k/v and gate/up are column-parallel (each
//! rank computes its own heads and FFN columns, no communication), o_proj
//! and down_proj row-parallel (each rank's partial product, then one
//! all-reduce each: two per layer), the embedding and the LM head split by
//! vocabulary (a masked lookup summed across ranks; logits gathered on rank
//! 0). Which rank holds what is [`crate::model::tp`]'s plan.
//!
//! Invariants: every rank runs the same layer graph over the same batch,
//! so every rank makes the same collective calls in the same order; block
//! ids are the same on every rank (each rank's KV pool holds its own heads
//! in the same number of blocks), so rank 0's block tables serve all.
//!
//! Pipeline parallelism would cut the layer list instead (each rank a range
//! of `Model`'s layers, activations sent point to point between stages); it
//! is not built, and its seam is the same [`Collective`] (plus a send and a
//! receive) and a layer range in the plan.

pub mod wire;

#[cfg(feature = "mpi")]
pub mod mpi;
#[cfg(test)]
pub(crate) mod threads;

use engine_core::ExecError;

/// The collective operations tensor parallelism needs, over `world()`
/// ranks. Every rank must make the same calls in the same order (they
/// block until all ranks arrive).
pub trait Collective: Send + Sync {
    /// This process's rank, `0..world()`.
    fn rank(&self) -> usize;
    /// Number of ranks.
    fn world(&self) -> usize;
    /// The library under the operations, for the startup log.
    fn library(&self) -> &'static str;
    /// `buf = sum over ranks of buf`, element by element, on every rank.
    fn all_reduce_sum(&self, buf: &mut [f32]) -> Result<(), ExecError>;
    /// Rank 0 gets every rank's `mine` concatenated in rank order
    /// (`counts[r]` values from rank `r`); the other ranks get nothing.
    fn gather(&self, mine: &[f32], counts: &[usize]) -> Result<Vec<f32>, ExecError>;
    /// Rank 0's `bytes` on every rank (the others' contents are replaced).
    fn broadcast(&self, bytes: &mut Vec<u8>) -> Result<(), ExecError>;
}

/// World size 1: nothing to communicate.
#[derive(Debug, Default, Clone, Copy)]
pub struct Solo;

impl Collective for Solo {
    fn rank(&self) -> usize {
        0
    }

    fn world(&self) -> usize {
        1
    }

    fn library(&self) -> &'static str {
        "none (world size 1)"
    }

    fn all_reduce_sum(&self, _: &mut [f32]) -> Result<(), ExecError> {
        Ok(())
    }

    fn gather(&self, mine: &[f32], _: &[usize]) -> Result<Vec<f32>, ExecError> {
        Ok(mine.to_vec())
    }

    fn broadcast(&self, _: &mut Vec<u8>) -> Result<(), ExecError> {
        Ok(())
    }
}
