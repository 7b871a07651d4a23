//! The LoRA flags, vLLM's names and defaults (flattened into the engine
//! flags, so global like them).

use crate::lora::{parse_lora_module, LoraModule};
use clap::Args;

/// `--enable-lora` and what it takes.
#[derive(Debug, Clone, Args)]
pub struct LoraArgs {
    /// Serve LoRA adapters: a request whose `model` names an adapter runs
    /// with it (CPU and GPU executors).
    #[arg(long, global = true)]
    pub enable_lora: bool,
    /// Adapters to serve from startup: `NAME=PATH` (a PEFT folder or a
    /// llama.cpp LoRA .gguf) or vLLM's JSON
    /// `{"name": .., "path": .., "base_model_name": ..}`; several may follow
    /// one flag. A bad adapter stops startup, naming the problem.
    #[arg(long, global = true, value_name = "NAME=PATH", num_args = 1.., value_parser = parse_lora_module)]
    pub lora_modules: Vec<LoraModule>,
    /// Most distinct adapters in one batch (slots). Range: >= 1.
    #[arg(long, global = true, value_name = "N", default_value_t = 1, value_parser = super::range_positive)]
    pub max_loras: usize,
    /// Highest adapter rank accepted (vLLM's default 16). Range: >= 1.
    #[arg(long, global = true, value_name = "N", default_value_t = 16, value_parser = super::range_positive)]
    pub max_lora_rank: usize,
    /// Adapters whose weights stay in memory (least recently used dropped,
    /// read again on use; default: --max-loras). Range: >= 1.
    #[arg(long, global = true, value_name = "N", value_parser = super::range_positive)]
    pub max_cpu_loras: Option<usize>,
}

impl LoraArgs {
    /// The number of adapters kept loaded.
    pub fn cpu_loras(&self) -> usize {
        self.max_cpu_loras
            .unwrap_or(self.max_loras)
            .max(self.max_loras)
    }
}
