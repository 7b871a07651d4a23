//! `server`: the OpenAI-compatible serving binary (see `server --help`).

use server::cli::{Action, Cli};

fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        // Logs on stderr: stdout carries `generate`'s text alone.
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse_checked();
    let result = match cli.into_action() {
        Action::Generate(engine, a) => server::app::run_generate(&engine, a),
        Action::Serve(a) => server::app::run_serve(a),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
