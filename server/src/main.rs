//! `server`: the OpenAI-compatible serving binary (see `server --help`).

use clap::Parser;
use server::cli::{Cli, Command};

fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Some(Command::Generate(a)) => server::app::run_generate(a),
        Some(Command::Serve(a)) => server::app::run_serve(a),
        None => server::app::run_serve(cli.serve),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
