//! [`Collective`] on MPI (rsmpi over the system's MPICH or Open MPI), for
//! CPU ranks started by `mpiexec -n N server ...`.
//!
//! MPI is initialised once per process ([`MpiComm::init`]) with thread
//! support "multiple" requested and at least "serialized" required: the
//! calls come from the engine's thread, never two at once (each rank makes
//! its collective calls in one sequence). The universe lives as long as
//! the communicator; dropping the last handle finalises MPI.
//!
//! Failure: a rank that dies makes `mpiexec` end the job (MPI's default
//! error handler aborts), so no rank waits forever on a dead peer.
//!
//! Cost: whatever the library's algorithms cost; all-reduce copies its
//! buffer once (rsmpi has no in-place all-reduce).

use super::Collective;
use engine_core::ExecError;
use mpi::collective::SystemOperation;
use mpi::datatype::PartitionMut;
use mpi::topology::{Communicator, SimpleCommunicator};
use mpi::traits::{CommunicatorCollectives, Root};
use mpi::{Count, Threading};

/// The world communicator of an `mpiexec` job.
pub struct MpiComm {
    world: SimpleCommunicator,
    rank: usize,
    size: usize,
    scratch: std::sync::Mutex<Vec<f32>>,
    _universe: mpi::environment::Universe,
}

// SAFETY: the communicator handle is an integer (MPICH) or a pointer to
// library state (Open MPI) that MPI lets any thread use once the library
// runs at "serialized" thread support or above, which `init` requires; the
// engine never calls two collectives at once (each rank makes its calls in
// one sequence, from one thread at a time).
unsafe impl Send for MpiComm {}
// SAFETY: as above: shared use is serialized by the engine's call order.
unsafe impl Sync for MpiComm {}

impl MpiComm {
    /// Initialises MPI for this process. Errors when MPI was initialised
    /// already or the library cannot run calls from more than one thread.
    pub fn init() -> Result<Self, ExecError> {
        let (universe, threading) = mpi::initialize_with_threading(Threading::Multiple)
            .ok_or_else(|| ExecError::Collective("MPI was initialised already".into()))?;
        if threading < Threading::Serialized {
            return Err(ExecError::Collective(format!(
                "the MPI library offers thread support {threading:?}; serialized is needed"
            )));
        }
        let world = universe.world();
        let (rank, size) = (world.rank() as usize, world.size() as usize);
        Ok(Self {
            world,
            rank,
            size,
            scratch: std::sync::Mutex::new(Vec::new()),
            _universe: universe,
        })
    }
}

fn count(n: usize) -> Result<Count, ExecError> {
    Count::try_from(n).map_err(|_| ExecError::Collective(format!("{n} values exceed MPI's count")))
}

impl Collective for MpiComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world(&self) -> usize {
        self.size
    }

    fn library(&self) -> &'static str {
        "MPI"
    }

    fn all_reduce_sum(&self, buf: &mut [f32]) -> Result<(), ExecError> {
        let mut send = self
            .scratch
            .lock()
            .map_err(|_| ExecError::Collective("scratch buffer poisoned".into()))?;
        send.clear();
        send.extend_from_slice(buf);
        self.world
            .all_reduce_into(&send[..], buf, SystemOperation::sum());
        Ok(())
    }

    fn gather(&self, mine: &[f32], counts: &[usize]) -> Result<Vec<f32>, ExecError> {
        let root = self.world.process_at_rank(0);
        if self.rank != 0 {
            root.gather_varcount_into(mine);
            return Ok(Vec::new());
        }
        let counts: Vec<Count> = counts.iter().map(|&c| count(c)).collect::<Result<_, _>>()?;
        let mut displs = Vec::with_capacity(counts.len());
        let mut at: Count = 0;
        for &c in &counts {
            displs.push(at);
            at = at
                .checked_add(c)
                .ok_or_else(|| ExecError::Collective("gather larger than MPI's count".into()))?;
        }
        let mut out = vec![0.0f32; at as usize];
        {
            let mut part = PartitionMut::new(&mut out[..], counts, &displs[..]);
            root.gather_varcount_into_root(mine, &mut part);
        }
        Ok(out)
    }

    fn broadcast(&self, bytes: &mut Vec<u8>) -> Result<(), ExecError> {
        let root = self.world.process_at_rank(0);
        let mut len = bytes.len() as u64;
        root.broadcast_into(&mut len);
        let len = usize::try_from(len)
            .map_err(|_| ExecError::Collective(format!("a broadcast of {len} bytes")))?;
        bytes.resize(len, 0);
        root.broadcast_into(&mut bytes[..]);
        Ok(())
    }
}
