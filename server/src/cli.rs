//! Command line, with vLLM's flag names.
//!
//! `server [serve] [FLAGS]` (serve is the default) runs the OpenAI-compatible
//! server; `server generate --prompt ...` prints a quick greedy completion.
//!
//! Invariants:
//! - the engine flags ([`EngineArgs`]) are defined once, as clap *global*
//!   args: they are accepted before and after the subcommand and land in the
//!   same field (`server --model X generate` and `server generate --model X`
//!   both load X);
//! - the HTTP flags ([`HttpArgs`]) are one struct used twice: at the top
//!   level (no subcommand) and under `serve`; written before a subcommand
//!   they are a clap error ([`Cli::try_parse_checked`]), never a silently
//!   ignored value;
//! - every numeric flag is range-checked by its value parser, so a bad value
//!   is a clap error naming the flag and the range before anything loads;
//!   each flag's `--help` text states the same range (a test walks the table).
//!
//! Cost: parsing only; nothing here touches the model.

use crate::cors::CorsList;
use crate::kv_events::KvEventsConfig;
use clap::{Args, Parser, Subcommand, ValueEnum};
use std::path::PathBuf;

pub mod lora;

/// `range::positive` for the flags of submodules.
fn range_positive(s: &str) -> Result<usize, String> {
    range::positive(s)
}

/// A PagedAttention LLM serving engine with an OpenAI-compatible API.
///
/// Engine flags (model, KV cache, scheduler, device) may be written before or
/// after the subcommand; HTTP flags after `serve` or, with no subcommand, alone.
#[derive(Debug, Parser)]
#[command(name = "server", version)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    /// Serving flags (the engine flags, and the HTTP flags used when no
    /// subcommand is given).
    #[command(flatten)]
    pub serve: ServeArgs,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the OpenAI-compatible HTTP server (the default).
    Serve(HttpArgs),
    /// Generate greedily from one prompt and print the text.
    Generate(GenerateArgs),
}

/// What to run, with every flag in place (see [`Cli::into_action`]).
#[derive(Debug, Clone)]
pub enum Action {
    Serve(ServeArgs),
    Generate(EngineArgs, GenerateArgs),
}

impl Cli {
    /// Parses `argv` (program name first) like `try_parse_from`, and refuses
    /// HTTP flags written before a subcommand (clap's
    /// `args_conflicts_with_subcommands` would refuse the global engine flags
    /// there too).
    pub fn try_parse_checked<I, T>(argv: I) -> Result<Self, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        use clap::parser::ValueSource;
        use clap::{CommandFactory, FromArgMatches};
        let mut cmd = Self::command();
        let m = cmd.try_get_matches_from_mut(argv)?;
        if let Some((sub, _)) = m.subcommand() {
            let http = HttpArgs::augment_args(clap::Command::new("http"));
            for arg in http.get_arguments() {
                if m.value_source(arg.get_id().as_str()) == Some(ValueSource::CommandLine) {
                    let flag = arg.get_long().unwrap_or(arg.get_id().as_str());
                    let hint = if sub == "serve" {
                        format!("write it after `serve`: `server serve --{flag} ...`")
                    } else {
                        format!("it is a `serve` flag; `{sub}` takes none")
                    };
                    return Err(cmd.error(
                        clap::error::ErrorKind::ArgumentConflict,
                        format!("--{flag} cannot come before the `{sub}` subcommand: {hint}"),
                    ));
                }
            }
        }
        Self::from_arg_matches(&m).map_err(|e| e.format(&mut cmd))
    }

    /// [`Cli::try_parse_checked`] on the process's arguments; prints the
    /// error and exits on failure (as clap's `parse` does).
    pub fn parse_checked() -> Self {
        Self::try_parse_checked(std::env::args_os()).unwrap_or_else(|e| e.exit())
    }

    /// Resolves the subcommand: the engine flags (global) and the HTTP flags
    /// of whichever position holds them.
    pub fn into_action(self) -> Action {
        match self.command {
            None => Action::Serve(self.serve),
            Some(Command::Serve(http)) => Action::Serve(ServeArgs {
                engine: self.serve.engine,
                http,
            }),
            Some(Command::Generate(g)) => Action::Generate(self.serve.engine, g),
        }
    }
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

/// `--distributed-executor-backend` (vLLM's names): how the ranks of
/// `--tensor-parallel-size` start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DistBackendArg {
    /// The server starts its N ranks itself on this machine: run as a
    /// plain command it becomes an HTTP front that runs `mpiexec -n N` of
    /// itself (a build with `--features mpi`; MPI must be installed).
    Mp,
    /// Every rank is started by `mpiexec -n N`; rank 0 serves HTTP, the
    /// others only compute (run as a plain command: as `mp`). The form for
    /// ranks on several hosts.
    Mpi,
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

/// `--kv-cache-dtype` (vLLM's flag; its fp8 choices are not offered).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum KvCacheDtypeArg {
    /// CPU: float16 when the weights stay quantized (as llama.cpp), float32
    /// with float32 weights. GPU: the --dtype.
    Auto,
    #[value(alias = "half", alias = "fp16")]
    Float16,
    #[value(alias = "float", alias = "fp32")]
    Float32,
}

/// `--generation-config`: where default sampling parameters come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GenerationConfigArg {
    /// The model's own (GGUF metadata, HF `generation_config.json`).
    Auto,
    /// None: the API's defaults.
    Vllm,
    /// `DIR/generation_config.json`.
    Dir(PathBuf),
}

impl GenerationConfigArg {
    fn parse(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Self::Auto),
            "vllm" => Ok(Self::Vllm),
            dir => {
                let p = PathBuf::from(dir);
                if p.join("generation_config.json").is_file() {
                    Ok(Self::Dir(p))
                } else {
                    Err(format!(
                        "expected auto, vllm or a folder holding generation_config.json; \
                         {dir}/generation_config.json is not a file"
                    ))
                }
            }
        }
    }
}

/// Largest `--block-size`. Both executors read K/V through the block table
/// by division, so any size in `1..=MAX_BLOCK_SIZE` works on either (vLLM's
/// GPU choices 8, 16, 32, 64, 128 are all in it); beyond 256 a sequence
/// wastes up to a block of slots and paging loses its point.
pub const MAX_BLOCK_SIZE: usize = 256;

/// Value parsers: each error text states the accepted range, and clap puts
/// the flag's name in front of it.
mod range {
    use super::MAX_BLOCK_SIZE;

    fn int(s: &str) -> Result<usize, String> {
        s.trim()
            .parse::<usize>()
            .map_err(|_| format!("`{s}` is not a whole number"))
    }

    fn float(s: &str) -> Result<f64, String> {
        match s.trim().parse::<f64>() {
            Ok(v) if v.is_finite() => Ok(v),
            _ => Err(format!("`{s}` is not a finite number")),
        }
    }

    /// `>= 1`.
    pub fn positive(s: &str) -> Result<usize, String> {
        match int(s) {
            Ok(v) if v >= 1 => Ok(v),
            Ok(_) => Err("must be >= 1".into()),
            Err(e) => Err(format!("{e}; must be >= 1")),
        }
    }

    /// `1..=256`.
    pub fn block_size(s: &str) -> Result<usize, String> {
        let range = format!("must be in 1..={MAX_BLOCK_SIZE}");
        match int(s) {
            Ok(v) if (1..=MAX_BLOCK_SIZE).contains(&v) => Ok(v),
            Ok(_) => Err(range),
            Err(e) => Err(format!("{e}; {range}")),
        }
    }

    /// `(0, 1]`.
    pub fn fraction(s: &str) -> Result<f64, String> {
        match float(s) {
            Ok(v) if v > 0.0 && v <= 1.0 => Ok(v),
            Ok(_) => Err("must be in (0, 1]".into()),
            Err(e) => Err(format!("{e}; must be in (0, 1]")),
        }
    }

    /// `> 0`, finite, at most a day (seconds).
    pub fn positive_secs(s: &str) -> Result<f64, String> {
        match float(s) {
            Ok(v) if v > 0.0 && v <= 86_400.0 => Ok(v),
            Ok(_) => Err("must be > 0 (and at most 86400)".into()),
            Err(e) => Err(format!("{e}; must be > 0")),
        }
    }

    /// `>= 0`, finite.
    pub fn non_negative(s: &str) -> Result<f64, String> {
        match float(s) {
            Ok(v) if v >= 0.0 => Ok(v),
            Ok(_) => Err("must be >= 0".into()),
            Err(e) => Err(format!("{e}; must be >= 0")),
        }
    }
}

/// Model and engine flags shared by `serve` and `generate`; global, so they
/// may be written before or after the subcommand.
#[derive(Debug, Clone, Args)]
pub struct EngineArgs {
    /// Model: a .gguf file or a Hugging Face model directory (default: the
    /// SmolLM2-135M-Instruct GGUF fetched by `cargo xtask fetch-model`).
    #[arg(long, global = true)]
    pub model: Option<PathBuf>,
    /// Tokens per KV cache block. Range: 1..=256, on the
    /// CPU and the GPU.
    #[arg(long, global = true, value_name = "N", default_value_t = 16, value_parser = range::block_size)]
    pub block_size: usize,
    /// Most sequences in one engine step. Range: >= 1.
    #[arg(long, global = true, value_name = "N", default_value_t = 256, value_parser = range::positive)]
    pub max_num_seqs: usize,
    /// Most tokens (prefill chunks + decodes) in one engine step. Range: >= 1.
    #[arg(long, global = true, value_name = "N", default_value_t = 2048, value_parser = range::positive)]
    pub max_num_batched_tokens: usize,
    /// Most tokens (prompt + output) per sequence (default: the model's
    /// context length, capped at 8192). Range: >= 1.
    #[arg(long, global = true, value_name = "N", value_parser = range::positive)]
    pub max_model_len: Option<usize>,
    /// CPU swap space for preempted sequences, in GiB. Range: >= 0.
    #[arg(long, global = true, value_name = "GIB", default_value_t = 1.0, value_parser = range::non_negative)]
    pub swap_space: f64,
    /// CPU executor: memory for the KV cache pool, in GiB (ignored with
    /// --num-gpu-blocks-override; the GPU sizes its pool by
    /// --gpu-memory-utilization). Range: >= 0.
    #[arg(long, global = true, value_name = "GIB", default_value_t = 1.0, value_parser = range::non_negative)]
    pub kv_cache_memory: f64,
    /// Sampling defaults for the fields a request leaves out, as vLLM's
    /// flag: `auto` takes the model's own (a GGUF's `general.sampling.*`
    /// keys, an HF directory's `generation_config.json`), `vllm` none (the
    /// API's defaults), or a folder holding a `generation_config.json`.
    #[arg(long, global = true, value_name = "auto|vllm|DIR", default_value = "auto", value_parser = GenerationConfigArg::parse)]
    pub generation_config: GenerationConfigArg,
    /// Exact number of KV cache blocks, overriding --kv-cache-memory. Range: >= 1.
    #[arg(long, global = true, value_name = "N", value_parser = range::positive)]
    pub num_gpu_blocks_override: Option<usize>,
    /// Automatic prefix caching (on by default; `--enable-prefix-caching false` to turn off).
    #[arg(long, global = true, default_value_t = true, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub enable_prefix_caching: bool,
    /// Chunked prefill (on by default; `--enable-chunked-prefill false` to turn off).
    #[arg(long, global = true, default_value_t = true, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub enable_chunked_prefill: bool,
    /// How to preempt when KV blocks run out.
    #[arg(long, global = true, value_enum, default_value_t = PreemptionArg::Auto)]
    pub preemption_mode: PreemptionArg,
    /// Schedule the next step while the executor runs the current one
    /// (outputs unchanged; beam search, n > 1 forks, prompt_logprobs,
    /// structured output and speculative steps fall back to a synchronous
    /// step).
    #[arg(long, global = true)]
    pub async_scheduling: bool,
    /// Which executor runs the model.
    #[arg(long, global = true, value_enum, default_value_t = DeviceArg::Auto)]
    pub device: DeviceArg,
    /// GPU only: fraction of GPU memory for weights, activations and the KV
    /// cache (the KV pool gets what a profile run leaves of it). Range: (0, 1].
    #[arg(long, global = true, value_name = "F", default_value_t = 0.9, value_parser = range::fraction)]
    pub gpu_memory_utilization: f64,
    /// GPU only: run every step eagerly, without CUDA graphs (by default a
    /// decode-only step of up to min(512, --max-num-seqs) sequences is padded
    /// to a batch-size bucket and replayed as that bucket's graph).
    #[arg(long, global = true)]
    pub enforce_eager: bool,
    /// CPU only: batch-invariant kernels, so a request's logprobs are the
    /// same bits whatever shares its batch (and a span of several tokens
    /// scores each position as a decode step would). Costs batched and
    /// prefill speed: quantized weights take the direct kernels' offset
    /// arithmetic in the tile kernels (and no AVX2 lane kernel);
    /// `--dtype float32` takes its own f32 kernel instead of `gemm`.
    #[arg(long, global = true)]
    pub batch_invariant: bool,
    /// Element type of weights, activations and KV cache on the GPU; on the
    /// CPU, `auto` keeps quantized GGUF weights quantized, `float32`
    /// dequantizes them at load.
    #[arg(long, global = true, value_enum, default_value_t = DtypeArg::Auto)]
    pub dtype: DtypeArg,
    /// Element type of the KV cache. `auto`: on the CPU float16 for
    /// quantized weights (half the bytes attention reads per token) and
    /// float32 otherwise; on the GPU the --dtype, which is the only value
    /// the GPU accepts.
    #[arg(long, global = true, value_enum, default_value_t = KvCacheDtypeArg::Auto)]
    pub kv_cache_dtype: KvCacheDtypeArg,
    /// Worker threads for the forward pass (default: all cores). Range: >= 1.
    #[arg(long, global = true, value_name = "N", value_parser = range::positive)]
    pub threads: Option<usize>,
    /// Tensor parallelism: every layer split over N ranks (heads by KV
    /// group, FFN columns by whole quant blocks, vocabulary rows; uneven
    /// sizes allowed), partial sums added by all-reduce. N > 1 needs a
    /// build with `--features mpi`: the server starts its N ranks itself,
    /// or they are started by `mpiexec -n N` (see
    /// --distributed-executor-backend). Range: >= 1.
    #[arg(long, global = true, value_name = "N", default_value_t = 1, value_parser = range::positive)]
    pub tensor_parallel_size: usize,
    /// How the ranks of --tensor-parallel-size start: `mp` (the server
    /// starts them itself, through `mpiexec`) or `mpi` (each started by
    /// `mpiexec` by hand; rank 0 serves HTTP). CPU ranks, or with --device
    /// cuda one GPU per rank, all-reducing over NCCL.
    #[arg(long, global = true, value_enum, default_value_t = DistBackendArg::Mp)]
    pub distributed_executor_backend: DistBackendArg,
    /// KV cache events for KV-aware routers, as vLLM's KVEventsConfig JSON:
    /// `'{"enable_kv_cache_events": true}'` publishes on a ZeroMQ PUB socket
    /// at tcp://*:5557. Fields (vLLM's defaults): enable_kv_cache_events
    /// (false), publisher ("zmq" when enabled, else "null"), endpoint
    /// ("tcp://*:5557"; `*` or `::` binds, another host is connected to),
    /// replay_endpoint (none; e.g. "tcp://*:5558"), buffer_steps (10000),
    /// hwm (100000), max_queue_size (100000, >= 1), topic (""). An unknown
    /// field, a bad value or an endpoint that cannot be bound stops startup.
    #[arg(long, global = true, value_name = "JSON", value_parser = KvEventsConfig::parse)]
    pub kv_events_config: Option<KvEventsConfig>,
    /// Speculative decoding, as vLLM's SpeculativeConfig JSON: prompt
    /// lookup `'{"method": "ngram", "num_speculative_tokens": 4,
    /// "prompt_lookup_max": 4, "prompt_lookup_min": 2}'`, or a draft model
    /// with the same vocabulary `'{"method": "draft_model", "model":
    /// "PATH", "num_speculative_tokens": 4}'`. Also `disable_by_batch_size`
    /// (no speculation while that many requests are running or waiting)
    /// and, ours, `adaptive` (true: speculate only while it measures
    /// faster per token than plain decoding).
    /// num_speculative_tokens: 1..=16. Outputs are those without it
    /// (greedy and seeded sampling alike); beam search requests are
    /// refused with 400. An unknown field or a bad value stops startup.
    #[arg(long, global = true, value_name = "JSON", value_parser = crate::spec_config::parse)]
    pub speculative_config: Option<engine::spec::SpecConfig>,
    #[command(flatten)]
    pub lora: lora::LoraArgs,
}

/// What `serve` runs with: the engine flags and the HTTP flags.
#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub engine: EngineArgs,
    #[command(flatten)]
    pub http: HttpArgs,
}

/// HTTP server flags (`serve`, or no subcommand).
#[derive(Debug, Clone, Args)]
pub struct HttpArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on (0: any free port; the log says which). Range: 0..=65535.
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// Model name in the API (default: the model file's stem).
    #[arg(long)]
    pub served_model_name: Option<String>,
    /// Require `Authorization: Bearer <KEY>` on every endpoint but /health
    /// (compared in constant time).
    #[arg(long)]
    pub api_key: Option<String>,
    /// Requests allowed to wait for admission; beyond it new ones get 429. Range: >= 1.
    #[arg(long, value_name = "N", default_value_t = 1024, value_parser = range::positive)]
    pub max_waiting_requests: usize,
    /// Outputs (engine steps) a streaming request may have queued for a client
    /// that reads slower than the engine generates; beyond it the engine holds
    /// its newer tokens in one merged output. Range: >= 1.
    #[arg(long, value_name = "N", default_value_t = 64, value_parser = range::positive)]
    pub stream_buffer: usize,
    /// Seconds a request's output queue may stay full (the client stopped
    /// reading) before the request is aborted and its KV blocks freed.
    /// Range: > 0.
    #[arg(long, value_name = "SECS", default_value_t = 30.0, value_parser = range::positive_secs)]
    pub stream_stall_timeout: f64,
    /// CORS: origins allowed to call the API, as a JSON list
    /// (`'["https://a.example"]'`) or a comma list; `*` for any. CORS is off
    /// (no CORS headers, OPTIONS is 405) unless this is given.
    #[arg(long, value_name = "LIST", value_parser = CorsList::parse)]
    pub allowed_origins: Option<CorsList>,
    /// CORS: methods allowed (JSON or comma list; default `*` once CORS is on).
    #[arg(long, value_name = "LIST", value_parser = CorsList::parse)]
    pub allowed_methods: Option<CorsList>,
    /// CORS: request headers allowed (JSON or comma list; default `*` once CORS is on).
    #[arg(long, value_name = "LIST", value_parser = CorsList::parse)]
    pub allowed_headers: Option<CorsList>,
    /// Largest accepted request body, in bytes. Range: >= 1.
    #[arg(long, value_name = "BYTES", default_value_t = crate::http::DEFAULT_MAX_BODY_BYTES, value_parser = range::positive)]
    pub max_body_bytes: usize,
}

/// `generate` flags (the engine flags are global).
#[derive(Debug, Clone, Args)]
pub struct GenerateArgs {
    /// The prompt.
    #[arg(long)]
    pub prompt: String,
    /// Wrap the prompt as a user message with the model's chat template.
    #[arg(long)]
    pub chat: bool,
    /// Most tokens to generate. Range: >= 1.
    #[arg(long, value_name = "N", default_value_t = 64, value_parser = range::positive)]
    pub max_tokens: usize,
}

#[cfg(test)]
mod tests;
