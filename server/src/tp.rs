//! Tensor-parallel launch: `--tensor-parallel-size N`, every rank started
//! by `mpiexec -n N server ...` (by hand, or by the server itself run as a
//! plain command: `crate::tp_front`); see `engine::dist`.
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
    // `mp` (the default) starts its ranks through MPI's launcher: the
    // plain command becomes the HTTP front (`crate::tp_front`), which runs
    // `mpiexec -n N` of itself; here, under that launcher, it is `mpi`.
    let comm = match engine.distributed_executor_backend {
        DistBackendArg::Mp if !crate::tp_front::started_by_mpiexec() => bail!(
            "--distributed-executor-backend mp starts its {n} ranks through MPI's launcher: \
             run `server --tensor-parallel-size {n}` from a build with `--features mpi` (it \
             then runs `mpiexec -n {n}` of itself), or start them yourself with `mpiexec -n \
             {n} server ... --tensor-parallel-size {n}`; with --device cuda each rank takes \
             one GPU and the ranks all-reduce over NCCL"
        ),
        DistBackendArg::Mp | DistBackendArg::Mpi => mpi_world(n)?,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::Cli;
    use clap::Parser;

    fn engine(argv: &[&str]) -> EngineArgs {
        let argv = std::iter::once("server").chain(argv.iter().copied());
        Cli::try_parse_from(argv).expect("flags parse").serve.engine
    }

    fn refusal(argv: &[&str]) -> String {
        match collective(&engine(argv)) {
            Ok(_) => panic!("{argv:?} accepted"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn size_one_needs_no_collectives_and_bad_launches_say_what_to_do() {
        assert!(collective(&engine(&[])).expect("size 1").is_none());
        let e = refusal(&["--tensor-parallel-size", "2"]);
        assert!(e.contains("mpiexec -n 2") && e.contains("NCCL"), "{e}");
        #[cfg(not(feature = "mpi"))]
        {
            let e = refusal(&[
                "--tensor-parallel-size",
                "2",
                "--distributed-executor-backend",
                "mpi",
            ]);
            assert!(e.contains("--features mpi"), "{e}");
        }
        assert!(Cli::try_parse_from(["server", "--tensor-parallel-size", "0"]).is_err());
    }

    #[test]
    fn the_fingerprint_ignores_the_folder_and_names_each_flag() {
        let dir = tempfile::tempdir().expect("dir");
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        std::fs::create_dir_all(&a).expect("a");
        std::fs::create_dir_all(&b).expect("b");
        std::fs::write(a.join("m.gguf"), b"12345").expect("write");
        std::fs::write(b.join("m.gguf"), b"12345").expect("write");
        let e = engine(&["--block-size", "32"]);
        let fa = fingerprint(&e, &a.join("m.gguf"));
        assert_eq!(fa, fingerprint(&e, &b.join("m.gguf")));
        assert!(
            fa.starts_with("m.gguf (5 bytes), ") && fa.contains("block_size: 32"),
            "{fa}"
        );
        assert_ne!(fa, fingerprint(&engine(&[]), &a.join("m.gguf")));
    }
}
