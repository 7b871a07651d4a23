//! `cargo xtask gen-lora [--out DIR] [--base GGUF] [--only NAME] [--no-merged]`:
//! the LoRA reference. Writes seeded random PEFT adapters for the default
//! model (`model_loader::lora_gen::reference_set`: a zero adapter and
//! several target sets, ranks and scale rules) and, for each, the base GGUF
//! merged with it at F32 (`W + scale B A`, Q/K rows re-permuted as llama.cpp
//! stores them). Serving the merged file with `--dtype float32` is what the
//! server with the adapter must reproduce; the zero adapter's merged file
//! must reproduce the base model.

use anyhow::Context;
use std::path::PathBuf;

/// Arguments of this task.
#[derive(clap::Args)]
pub struct Args {
    /// Output folder (default: `<cache>/lora`).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Base model GGUF (default: the fetched SmolLM2-135M).
    #[arg(long)]
    base: Option<PathBuf>,
    /// Only this reference adapter (default: all).
    #[arg(long)]
    only: Option<String>,
    /// Write the adapters without the merged models (about 540 MB each).
    #[arg(long)]
    no_merged: bool,
}

/// Runs the task.
pub fn run(args: Args) -> anyhow::Result<()> {
    let out = args
        .out
        .unwrap_or_else(|| model_loader::paths::cache_dir().join("lora"));
    let base = args
        .base
        .unwrap_or_else(model_loader::paths::default_model_path);
    for (name, _) in model_loader::lora_gen::reference_set() {
        if args.only.as_deref().is_some_and(|o| o != name) {
            continue;
        }
        let (dir, merged) =
            model_loader::lora_gen::write_reference(&base, &out, name, !args.no_merged)
                .with_context(|| format!("writing reference adapter {name}"))?;
        println!("wrote {}", dir.display());
        if !args.no_merged {
            println!("wrote {}", merged.display());
        }
    }
    Ok(())
}
