//! [`Nccl`] (feature `cuda`): a tensor-parallel rank's NCCL communicator,
//! the all-reduce a [`super::cuda::CudaDevice`] runs on its compute stream
//! ([`super::Device::all_reduce_sum`]).
//!
//! Bootstrap, as NCCL's documentation shows it for MPI programs: rank 0
//! asks NCCL for a unique id, the host [`Collective`] (MPI) broadcasts its
//! 128 bytes, every rank calls `ncclCommInitRank` with it. NCCL is loaded
//! at run time like the rest of CUDA: [`Nccl::join`] first checks that
//! `libnccl` opens (cudarc's loader panics otherwise) and says so as an
//! error, which the caller turns into the host-staged fallback. All ranks
//! agree on whether NCCL is used (a rank without it makes every rank fall
//! back), since a rank alone on NCCL would wait forever for the others.
//!
//! Only the all-reduce goes through NCCL (two per layer plus the
//! embedding's: the hot path); the logits gather and the step broadcast
//! stay on the host collective, which the host needs anyway.
//!
//! NOTE: written and compiled without a GPU (none was lent to this task);
//! the executor's tensor-parallel orchestration is tested on the emulator
//! with the host-staged all-reduce, but these NCCL calls have not run.

use super::device::{DType, DevPtr};
use super::GpuError;
use crate::dist::Collective;
use cudarc::nccl::{result, sys};

/// An NCCL communicator of `world` ranks (destroyed on drop).
pub struct Nccl {
    comm: sys::ncclComm_t,
}

// SAFETY: an NCCL communicator may be used from any thread as long as calls
// on it are not concurrent; the owning device is used by one thread at a
// time (`&mut self` on every call).
unsafe impl Send for Nccl {}

impl Nccl {
    /// Joins the communicator of all `comm.world()` ranks (every rank calls
    /// this at the same point, with its device's context current). `Err`
    /// on every rank when any rank lacks NCCL or fails to join, with that
    /// rank's reason: every rank makes the same host collective calls
    /// whatever fails, so none is left waiting in one.
    pub fn join(comm: &dyn Collective) -> Result<Self, GpuError> {
        // SAFETY: only tries to dlopen NCCL's candidate library names.
        let present = unsafe { sys::is_culib_present() };
        agree(
            comm,
            present,
            "could not load the NCCL library (libnccl.so.2)",
        )?;
        // Rank 0's id, or nothing where it could not make one.
        let mut id = Vec::new();
        let mut made = Ok(());
        if comm.rank() == 0 {
            match result::get_uniqueid() {
                Ok(unique) => id = unique.internal.iter().map(|&c| c as u8).collect(),
                Err(e) => made = Err(failed("ncclGetUniqueId")(e)),
            }
        }
        comm.broadcast(&mut id).map_err(collective)?;
        made?;
        let mut unique = sys::ncclUniqueId { internal: [0; 128] };
        if id.len() != unique.internal.len() {
            return Err(GpuError::Collective(format!(
                "rank 0 sent an NCCL id of {} bytes (128 expected)",
                id.len()
            )));
        }
        for (d, &b) in unique.internal.iter_mut().zip(&id) {
            *d = b as _;
        }
        let mut raw: sys::ncclComm_t = std::ptr::null_mut();
        let (world, rank) = (comm.world() as i32, comm.rank() as i32);
        // SAFETY: `raw` is written by NCCL; the id is rank 0's, the same on
        // every rank; the caller made this rank's context current.
        let init = unsafe { result::comm_init_rank(&mut raw, world, unique, rank) };
        let joined = init.is_ok();
        // Dropped (destroyed) below unless every rank joined.
        let nccl = joined.then_some(Self { comm: raw });
        agree(comm, joined, "could not join the NCCL communicator")?;
        init.map_err(failed("ncclCommInitRank"))?;
        nccl.ok_or_else(|| GpuError::Collective("no NCCL communicator".into()))
    }

    /// `count` values of `dtype` at `buf` summed over the ranks, in place,
    /// on `stream`.
    ///
    /// # Safety
    /// `buf` addresses a live device allocation of at least `count`
    /// elements on this communicator's device; `stream` is live.
    pub unsafe fn all_reduce_sum(
        &self,
        buf: DevPtr,
        count: usize,
        dtype: DType,
        stream: cudarc::driver::sys::CUstream,
    ) -> Result<(), GpuError> {
        let t = match dtype {
            DType::F32 => sys::ncclDataType_t::ncclFloat32,
            DType::F16 => sys::ncclDataType_t::ncclFloat16,
            DType::Bf16 => sys::ncclDataType_t::ncclBfloat16,
        };
        let p = buf.0 as *mut std::ffi::c_void;
        // SAFETY: per the function contract; in place (send == receive) is
        // allowed by NCCL.
        unsafe {
            result::all_reduce(
                p,
                p,
                count,
                t,
                sys::ncclRedOp_t::ncclSum,
                self.comm,
                stream as sys::cudaStream_t,
            )
        }
        .map_err(failed("ncclAllReduce"))?;
        Ok(())
    }
}

impl Drop for Nccl {
    fn drop(&mut self) {
        // SAFETY: the communicator is this value's; nothing uses it after.
        let _ = unsafe { result::comm_destroy(self.comm) };
    }
}

/// `Ok` on every rank when `ok` holds on every rank; else an error on
/// every rank (this rank's `what`, or that another rank failed it).
fn agree(comm: &dyn Collective, ok: bool, what: &str) -> Result<(), GpuError> {
    let mut all = [f32::from(u8::from(ok))];
    comm.all_reduce_sum(&mut all).map_err(collective)?;
    if all[0] as usize == comm.world() {
        return Ok(());
    }
    Err(GpuError::unavailable(if ok {
        format!("another rank {what}")
    } else {
        format!("this rank {what}")
    }))
}

/// A host collective's failure during the NCCL bootstrap.
fn collective(e: crate::executor::ExecError) -> GpuError {
    GpuError::Collective(engine_core::Report(&e).to_string())
}

/// NCCL's status code as a typed error source (cudarc's `NcclError` is not
/// a `std::error::Error`).
#[derive(Debug)]
struct NcclStatusError(sys::ncclResult_t);

impl std::fmt::Display for NcclStatusError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "NCCL returned {:?}", self.0)
    }
}

impl std::error::Error for NcclStatusError {}

/// Maps a failed NCCL call `op` to [`GpuError::Driver`].
fn failed(op: &'static str) -> impl Fn(result::NcclError) -> GpuError {
    move |e| GpuError::Driver {
        op,
        source: engine_core::cause(NcclStatusError(e.0)),
    }
}
