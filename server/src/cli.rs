//! Command line, with vLLM's flag names.
//!
//! `server [serve] [FLAGS]` (serve is the default) runs the OpenAI-compatible
//! server; `server generate --prompt ...` prints a quick greedy completion.

use clap::{Args, Parser, Subcommand, ValueEnum};
use std::path::PathBuf;

/// A PagedAttention LLM serving engine with an OpenAI-compatible API.
#[derive(Debug, Parser)]
#[command(name = "server", version)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    /// Serving flags (used when no subcommand is given).
    #[command(flatten)]
    pub serve: ServeArgs,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the OpenAI-compatible HTTP server (the default).
    Serve(ServeArgs),
    /// Generate greedily from one prompt and print the text.
    Generate(GenerateArgs),
}

/// `--preemption-mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PreemptionArg {
    /// Swap to the CPU pool when it has room, else recompute.
    Auto,
    /// Prefer swapping.
    Swap,
    /// Always recompute.
    Recompute,
}

/// `--device`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DeviceArg {
    /// CUDA when this build has it and a GPU answers, else the CPU (the log says why).
    Auto,
    /// The CPU executor.
    Cpu,
    /// The CUDA executor; an error (never a fallback) when it cannot start.
    Cuda,
}

/// `--dtype` (vLLM's names): element type of weights, activations and KV cache
/// on the GPU. On the CPU, `auto` keeps a GGUF's quantized weights in their
/// file type (integer kernels); any other value dequantizes them to float32
/// at load (the reference path).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DtypeArg {
    /// bfloat16 on the GPU; the file's weight types on the CPU.
    Auto,
    #[value(alias = "bf16")]
    Bfloat16,
    #[value(alias = "half", alias = "fp16")]
    Float16,
    #[value(alias = "float", alias = "fp32")]
    Float32,
}

/// Model and engine flags shared by `serve` and `generate`.
#[derive(Debug, Clone, Args)]
pub struct EngineArgs {
    /// Model: a .gguf file or a Hugging Face model directory (default: the
    /// SmolLM2-135M-Instruct GGUF fetched by `cargo xtask fetch-model`).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Tokens per KV cache block.
    #[arg(long, default_value_t = 16)]
    pub block_size: usize,
    /// Most sequences in one engine step.
    #[arg(long, default_value_t = 256)]
    pub max_num_seqs: usize,
    /// Most tokens (prefill chunks + decodes) in one engine step.
    #[arg(long, default_value_t = 2048)]
    pub max_num_batched_tokens: usize,
    /// Most tokens (prompt + output) per sequence (default: the model's
    /// context length, capped at 8192).
    #[arg(long)]
    pub max_model_len: Option<usize>,
    /// CPU swap space for preempted sequences, in GiB.
    #[arg(long, default_value_t = 1.0)]
    pub swap_space: f64,
    /// CPU executor: memory for the KV cache pool, in GiB (ignored with
    /// --num-gpu-blocks-override; the GPU sizes its pool by --gpu-memory-utilization).
    #[arg(long, default_value_t = 1.0)]
    pub kv_cache_memory: f64,
    /// Exact number of KV cache blocks, overriding --kv-cache-memory.
    #[arg(long)]
    pub num_gpu_blocks_override: Option<usize>,
    /// Automatic prefix caching (on by default; `--enable-prefix-caching false` to turn off).
    #[arg(long, default_value_t = true, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub enable_prefix_caching: bool,
    /// Chunked prefill (on by default; `--enable-chunked-prefill false` to turn off).
    #[arg(long, default_value_t = true, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub enable_chunked_prefill: bool,
    /// How to preempt when KV blocks run out.
    #[arg(long, value_enum, default_value_t = PreemptionArg::Auto)]
    pub preemption_mode: PreemptionArg,
    /// Which executor runs the model.
    #[arg(long, value_enum, default_value_t = DeviceArg::Auto)]
    pub device: DeviceArg,
    /// GPU only: fraction of GPU memory for weights, activations and the KV
    /// cache (the KV pool gets what a profile run leaves of it).
    #[arg(long, default_value_t = 0.9)]
    pub gpu_memory_utilization: f64,
    /// Element type of weights, activations and KV cache on the GPU; on the
    /// CPU, `auto` keeps quantized GGUF weights quantized, `float32`
    /// dequantizes them at load.
    #[arg(long, value_enum, default_value_t = DtypeArg::Auto)]
    pub dtype: DtypeArg,
    /// Worker threads for the forward pass (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
}

/// `serve` flags.
#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub engine: EngineArgs,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on.
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// Model name in the API (default: the model file's stem).
    #[arg(long)]
    pub served_model_name: Option<String>,
    /// Require `Authorization: Bearer <KEY>` on every endpoint but /health.
    #[arg(long)]
    pub api_key: Option<String>,
    /// Requests allowed to wait for admission; beyond it new ones get 429.
    #[arg(long, default_value_t = 1024)]
    pub max_waiting_requests: usize,
    /// Largest accepted request body, in bytes.
    #[arg(long, default_value_t = crate::http::DEFAULT_MAX_BODY_BYTES)]
    pub max_body_bytes: usize,
}

/// `generate` flags.
#[derive(Debug, Clone, Args)]
pub struct GenerateArgs {
    #[command(flatten)]
    pub engine: EngineArgs,
    /// The prompt.
    #[arg(long)]
    pub prompt: String,
    /// Wrap the prompt as a user message with the model's chat template.
    #[arg(long)]
    pub chat: bool,
    /// Most tokens to generate.
    #[arg(long, default_value_t = 64)]
    pub max_tokens: usize,
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn serve_is_the_default() {
        let c = Cli::try_parse_from(["server", "--port", "9001", "--max-num-seqs", "8"])
            .expect("parses");
        assert!(c.command.is_none());
        assert_eq!(c.serve.port, 9001);
        assert_eq!(c.serve.engine.max_num_seqs, 8);
        let g = Cli::try_parse_from(["server", "generate", "--prompt", "hi", "--chat"])
            .expect("parses");
        assert!(matches!(g.command, Some(Command::Generate(ref a)) if a.chat && a.prompt == "hi"));
        let bad = Cli::try_parse_from(["server", "--preemption-mode", "sometimes"]);
        assert!(bad.is_err());
    }
}
