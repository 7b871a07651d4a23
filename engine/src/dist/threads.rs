//! An in-process [`Collective`] over threads, for tests: N ranks in one
//! process meet at a barrier and sum in rank order (the same bits on
//! every rank). It checks the sharding and the executors' protocol
//! without an MPI library; the real ranks are processes under `mpiexec`
//! (`server/tests/tensor_parallel.rs`).

use super::Collective;
use engine_core::ExecError;
use std::sync::{Arc, Barrier, Mutex};

struct Shared {
    barrier: Barrier,
    floats: Mutex<Vec<Vec<f32>>>,
    bytes: Mutex<Vec<u8>>,
}

/// One rank of a [`group`].
pub struct ThreadRank {
    rank: usize,
    world: usize,
    shared: Arc<Shared>,
}

/// `world` ranks sharing one barrier.
pub fn group(world: usize) -> Vec<ThreadRank> {
    let shared = Arc::new(Shared {
        barrier: Barrier::new(world),
        floats: Mutex::new(vec![Vec::new(); world]),
        bytes: Mutex::new(Vec::new()),
    });
    (0..world)
        .map(|rank| ThreadRank {
            rank,
            world,
            shared: Arc::clone(&shared),
        })
        .collect()
}

fn poisoned() -> ExecError {
    ExecError::Collective("a rank thread panicked".into())
}

impl ThreadRank {
    /// Every rank's `mine`, in rank order.
    fn exchange(&self, mine: &[f32]) -> Result<Vec<Vec<f32>>, ExecError> {
        self.shared.floats.lock().map_err(|_| poisoned())?[self.rank] = mine.to_vec();
        self.shared.barrier.wait();
        let all = self.shared.floats.lock().map_err(|_| poisoned())?.clone();
        self.shared.barrier.wait();
        Ok(all)
    }
}

impl Collective for ThreadRank {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world(&self) -> usize {
        self.world
    }

    fn library(&self) -> &'static str {
        "threads (tests)"
    }

    fn all_reduce_sum(&self, buf: &mut [f32]) -> Result<(), ExecError> {
        let all = self.exchange(buf)?;
        buf.iter_mut().for_each(|v| *v = 0.0);
        for part in &all {
            buf.iter_mut().zip(part).for_each(|(a, b)| *a += b);
        }
        Ok(())
    }

    fn gather(&self, mine: &[f32], counts: &[usize]) -> Result<Vec<f32>, ExecError> {
        let all = self.exchange(mine)?;
        for (r, part) in all.iter().enumerate() {
            if part.len() != counts[r] {
                return Err(ExecError::Collective(format!(
                    "rank {r} sent {} values, {} expected",
                    part.len(),
                    counts[r]
                )));
            }
        }
        Ok(if self.rank == 0 {
            all.concat()
        } else {
            Vec::new()
        })
    }

    fn broadcast(&self, bytes: &mut Vec<u8>) -> Result<(), ExecError> {
        if self.rank == 0 {
            *self.shared.bytes.lock().map_err(|_| poisoned())? = bytes.clone();
        }
        self.shared.barrier.wait();
        if self.rank != 0 {
            *bytes = self.shared.bytes.lock().map_err(|_| poisoned())?.clone();
        }
        self.shared.barrier.wait();
        Ok(())
    }
}
