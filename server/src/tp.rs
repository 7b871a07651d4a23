//! Tensor-parallel launch: `--tensor-parallel-size N` with
//! `--distributed-executor-backend mpi`, every rank started by
//! `mpiexec -n N server ...` (see `engine::dist`).
//!
//! Rank 0 serves HTTP and drives the engine; the other ranks load their
//! shard and run the steps rank 0 broadcasts until it stops
//! ([`crate::app`] dispatches on [`collective`]'s rank). All ranks first
//! check that they were started with the same model file and flags.
//!
//! Invariant: MPI is initialised at most once per process, by the first
//! call to [`collective`]; later calls return the same communicator.

use crate::cli::{DistBackendArg, EngineArgs};
use anyhow::bail;
use engine::dist::Collective;
use std::path::Path;
use std::sync::{Arc, OnceLock};

/// This process's collectives (`None` at tensor parallel size 1).
pub fn collective(engine: &EngineArgs) -> anyhow::Result<Option<Arc<dyn Collective>>> {
    static COMM: OnceLock<Arc<dyn Collective>> = OnceLock::new();
    let n = engine.tensor_parallel_size;
    if n == 1 {
        return Ok(None);
    }
    if let Some(c) = COMM.get() {
        return Ok(Some(Arc::clone(c)));
    }
    if engine.lora.enable_lora {
        bail!("--enable-lora with --tensor-parallel-size {n}: adapters are not sharded yet");
    }
    let comm = match engine.distributed_executor_backend {
        DistBackendArg::Mp => bail!(
            "--distributed-executor-backend mp spawns one worker per GPU talking NCCL, which \
             this build does not have yet; on the CPU start the ranks with `mpiexec -n {n} \
             server ... --tensor-parallel-size {n} --distributed-executor-backend mpi`"
        ),
        DistBackendArg::Mpi => mpi_world(n)?,
    };
    Ok(Some(Arc::clone(COMM.get_or_init(|| comm))))
}

#[cfg(feature = "mpi")]
fn mpi_world(n: usize) -> anyhow::Result<Arc<dyn Collective>> {
    let comm = engine::dist::mpi::MpiComm::init()?;
    if comm.world() != n {
        bail!(
            "--tensor-parallel-size {n}, but mpiexec started {} ranks (use mpiexec -n {n})",
            comm.world()
        );
    }
    Ok(Arc::new(comm))
}

#[cfg(not(feature = "mpi"))]
fn mpi_world(_: usize) -> anyhow::Result<Arc<dyn Collective>> {
    bail!(
        "--distributed-executor-backend mpi: this build has no MPI support; rebuild with \
         `cargo build --release --features mpi` (needs an MPI library and libclang: \
         apt-get install libmpich-dev libclang-dev)"
    )
}

/// What every rank must agree on: the model file (name and size; the
/// folder may differ between hosts) and every engine flag.
pub fn fingerprint(engine: &EngineArgs, model: &Path) -> String {
    let size = std::fs::metadata(model).map_or(0, |m| m.len());
    let name = model.file_name().map_or_else(
        || model.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    );
    let flags = EngineArgs {
        model: None,
        ..engine.clone()
    };
    format!("{name} ({size} bytes), {flags:?}")
}
