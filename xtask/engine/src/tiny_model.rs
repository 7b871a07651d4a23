//! `cargo xtask gen-tiny-model [--out DIR] [--smollm2 GGUF]`: writes the
//! deterministic tiny random-weight Llama model (GGUF and HF layouts with
//! identical weights, SmolLM2's tokenizer truncated to 1024 tokens).
//! Needs the fetched SmolLM2 GGUF (`cargo xtask fetch-model`) for the tokenizer.

use std::path::PathBuf;

use anyhow::Context;

/// Arguments of this task.
#[derive(clap::Args)]
pub struct Args {
    /// Output folder (default: `<cache>/tiny`).
    #[arg(long)]
    out: Option<PathBuf>,
    /// SmolLM2 GGUF to take the tokenizer from (default: the fetched model).
    #[arg(long)]
    smollm2: Option<PathBuf>,
}

/// Runs the task.
pub fn run(args: Args) -> anyhow::Result<()> {
    let out = args
        .out
        .unwrap_or_else(|| model_loader::paths::cache_dir().join("tiny"));
    let src = args
        .smollm2
        .unwrap_or_else(model_loader::paths::default_model_path);
    let files = model_loader::tiny::write_tiny_model_from(&src, &out)
        .with_context(|| format!("writing the tiny model into {}", out.display()))?;
    let loaded = model_loader::load_model(&files.gguf).context("re-reading tiny.gguf")?;
    let hf = model_loader::load_model(&files.hf_dir).context("re-reading the HF layout")?;
    anyhow::ensure!(
        loaded.config == hf.config,
        "the two layouts disagree on the config"
    );
    println!("wrote {}", files.gguf.display());
    println!("wrote {}", files.hf_dir.display());
    Ok(())
}
