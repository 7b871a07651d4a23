//! Startup: model loading, engine construction, the listener, signals, and
//! the `generate` command.

use crate::cli::{
    DeviceArg, DtypeArg, EngineArgs, GenerateArgs, GenerationConfigArg, KvCacheDtypeArg,
    PreemptionArg, ServeArgs,
};
use crate::engine_backend::{EngineBackend, EngineOptions};
use crate::http::{self, AppState};
use crate::kv_events::publisher::PublisherStats;
use crate::metrics::CacheConfigInfo;
use anyhow::{bail, Context};
use engine::dist::Collective;
use engine::engine_loop::HandleConfig;
use engine::executor::gpu::DType;
use engine::executor::tp::{build_tp_executor, check_agreement, run_worker};
use engine::executor::{DeviceKind, ExecutorRequest, WeightInput};
use engine::model::KvDtype;
use engine::scheduler::{PreemptionMode, SchedulerConfig};
use model_loader::{ChatMessage, GenerationDefaults, ModelInfo, WeightReader};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

const GIB: f64 = (1u64 << 30) as f64;

/// The model path from `--model` or the default; explains how to fetch
/// the default model when it is missing.
pub fn model_path(args: &EngineArgs) -> anyhow::Result<PathBuf> {
    let path = args
        .model
        .clone()
        .unwrap_or_else(model_loader::paths::default_model_path);
    if !path.exists() {
        if args.model.is_none() {
            bail!(
                "the default model is missing at {}; run `cargo xtask fetch-model` first, or pass --model",
                path.display()
            );
        }
        bail!("no model at {}", path.display());
    }
    Ok(path)
}

/// Engine options from the flags, for a model with `context_len` positions.
pub fn engine_options(
    args: &EngineArgs,
    context_len: usize,
    handle: HandleConfig,
) -> EngineOptions {
    let max_model_len = args.max_model_len.unwrap_or(context_len.min(8192));
    EngineOptions {
        scheduler: SchedulerConfig {
            max_num_seqs: args.max_num_seqs,
            max_num_batched_tokens: args.max_num_batched_tokens,
            max_model_len,
            enable_chunked_prefill: args.enable_chunked_prefill,
            preemption_mode: match args.preemption_mode {
                PreemptionArg::Auto => PreemptionMode::Auto,
                PreemptionArg::Swap => PreemptionMode::Swap,
                PreemptionArg::Recompute => PreemptionMode::Recompute,
            },
            async_scheduling: args.async_scheduling,
            speculative: args.speculative_config.clone(),
        },
        block_size: args.block_size,
        max_loras: args.lora.enable_lora.then_some(args.lora.max_loras),
        executor: ExecutorRequest {
            device: match args.device {
                DeviceArg::Auto => DeviceKind::Auto,
                DeviceArg::Cpu => DeviceKind::Cpu,
                DeviceArg::Cuda => DeviceKind::Cuda,
            },
            block_size: args.block_size,
            num_gpu_blocks: args.num_gpu_blocks_override,
            cpu_kv_cache_bytes: (args.kv_cache_memory.max(0.0) * GIB) as usize,
            swap_bytes: (args.swap_space.max(0.0) * GIB) as usize,
            gpu_memory_utilization: args.gpu_memory_utilization,
            max_num_batched_tokens: args.max_num_batched_tokens,
            dtype: match args.dtype {
                DtypeArg::Auto | DtypeArg::Bfloat16 => DType::Bf16,
                DtypeArg::Float16 => DType::F16,
                DtypeArg::Float32 => DType::F32,
            },
            kv_cache_dtype: match args.kv_cache_dtype {
                KvCacheDtypeArg::Auto => None,
                KvCacheDtypeArg::Float16 => Some(KvDtype::F16),
                KvCacheDtypeArg::Float32 => Some(KvDtype::F32),
            },
            max_num_seqs: args.max_num_seqs,
            enforce_eager: args.enforce_eager,
            batch_invariant: args.batch_invariant,
        },
        enable_prefix_caching: args.enable_prefix_caching,
        handle,
    }
}

/// `--dtype auto` keeps a GGUF's quantized weights on the CPU; the other
/// values load float32 there. (The GPU executor converts a GGUF's
/// quantized blocks to its dtype as it uploads them, whatever this says.)
fn weight_types(dtype: DtypeArg) -> model_loader::WeightTypes {
    match dtype {
        DtypeArg::Auto => model_loader::WeightTypes::File,
        _ => model_loader::WeightTypes::F32,
    }
}

/// A model opened for serving: its file, its tensors (checked, none read
/// yet), its tokenizer and chat template.
struct Opened {
    path: PathBuf,
    reader: WeightReader,
    info: ModelInfo,
}

/// Sizes the thread pools, then opens the model `engine` names.
fn open_model(engine: &EngineArgs) -> anyhow::Result<Opened> {
    set_threads(engine.threads);
    let path = model_path(engine)?;
    if let Some(comm) = crate::tp::collective(engine)? {
        check_agreement(&*comm, &crate::tp::fingerprint(engine, &path))
            .context("tensor-parallel ranks")?;
    }
    tracing::info!(model = %path.display(), "loading model");
    let reader =
        WeightReader::open(&path).with_context(|| format!("loading {}", path.display()))?;
    let info = model_loader::load_config_and_tokenizer(&path)
        .with_context(|| format!("loading the tokenizer of {}", path.display()))?;
    Ok(Opened { path, reader, info })
}

/// Starts the engine on an opened model; the reader (and its mapping of
/// the file) goes once the weights are loaded.
fn start_engine(
    engine: &EngineArgs,
    reader: WeightReader,
    info: &ModelInfo,
    handle: HandleConfig,
) -> anyhow::Result<(EngineBackend, Option<Arc<PublisherStats>>)> {
    let opts = engine_options(engine, info.config.max_position_embeddings, handle);
    let eos = info.tokenizer.eos_token_ids().to_vec();
    let kv_events = match &engine.kv_events_config {
        Some(cfg) => crate::kv_events::start(cfg)?,
        None => None,
    };
    if kv_events.is_some() && !engine.enable_prefix_caching {
        tracing::warn!("KV events are on but prefix caching is off: no block will be reported");
    }
    let stats = kv_events.as_ref().map(|s| s.stats());
    let sink = kv_events.map(|s| Box::new(s) as Box<dyn engine::kv::KvEventSink>);
    let tp = crate::tp::collective(engine)?;
    let backend = EngineBackend::start(&reader, weight_types(engine.dtype), eos, &opts, sink, tp)
        .context("cannot start the engine")?;
    Ok((backend, stats))
}

/// The sampling defaults `--generation-config` asks for.
fn generation_defaults(
    arg: &GenerationConfigArg,
    info: &ModelInfo,
) -> anyhow::Result<GenerationDefaults> {
    let d = match arg {
        GenerationConfigArg::Auto => info.generation_defaults,
        GenerationConfigArg::Vllm => GenerationDefaults::default(),
        GenerationConfigArg::Dir(dir) => GenerationDefaults::from_dir(dir)
            .with_context(|| format!("--generation-config {}", dir.display()))?,
    };
    if !d.is_empty() {
        tracing::info!(
            ?d,
            "default sampling parameters from the model's generation config \
             (a request's own values win; --generation-config vllm turns this off)"
        );
    }
    Ok(d)
}

/// Sizes the forward pass's pool and rayon's (sampling, grammar masks).
fn set_threads(threads: Option<usize>) {
    if let Some(n) = threads {
        if !engine::model::par::set_threads(n) {
            tracing::warn!(threads = n, "the forward-pass pool was already sized");
        }
        if let Err(e) = rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .build_global()
        {
            tracing::warn!(error = %e, "could not size the worker pool");
        }
    }
}

/// Loads the model and builds the application state.
pub fn build_state(args: &ServeArgs) -> anyhow::Result<AppState> {
    let Opened { path, reader, info } = open_model(&args.engine)?;
    let handle = HandleConfig {
        max_waiting: args.http.max_waiting_requests,
        stream_capacity: args.http.stream_buffer,
        stall_timeout: Duration::from_secs_f64(args.http.stream_stall_timeout),
    };
    let (backend, kv_event_stats) = start_engine(&args.engine, reader, &info, handle)?;
    let defaults = generation_defaults(&args.engine.generation_config, &info)?;
    let lora_config = info.config.clone();
    let ModelInfo {
        tokenizer,
        chat_template,
        ..
    } = info;
    // What the pools reserve is on the "executor ready" line; what is
    // resident is the process as a whole, before any request (the CPU
    // executor's pools add only what blocks are written).
    let resident = model_loader::memory::status_kib("VmRSS").map_or_else(
        || "unknown".to_string(),
        |kib| format!("{} MiB", kib / 1024),
    );
    let limits = crate::backend::Backend::limits(&backend);
    tracing::info!(
        blocks = limits.num_gpu_blocks,
        tokens = limits.num_gpu_blocks * limits.block_size,
        swap_blocks = limits.num_cpu_blocks,
        block_size = limits.block_size,
        max_model_len = limits.max_model_len,
        resident = %resident,
        "KV cache: {} blocks = {} tokens (+ {} swap blocks); process resident now {resident}",
        limits.num_gpu_blocks,
        limits.num_gpu_blocks * limits.block_size,
        limits.num_cpu_blocks,
    );
    let name = args.http.served_model_name.clone().unwrap_or_else(|| {
        path.file_stem()
            .map_or_else(|| "model".to_string(), |s| s.to_string_lossy().into_owned())
    });
    let mut state = AppState::new(
        Arc::new(backend),
        Arc::new(tokenizer),
        chat_template,
        name,
        args.http.api_key.clone(),
    );
    state.metrics.set_cache_config(CacheConfigInfo {
        block_size: limits.block_size,
        num_gpu_blocks: limits.num_gpu_blocks,
        num_cpu_blocks: limits.num_cpu_blocks,
        num_gpu_blocks_override: args.engine.num_gpu_blocks_override,
        enable_prefix_caching: args.engine.enable_prefix_caching,
        cache_dtype: match args.engine.kv_cache_dtype {
            KvCacheDtypeArg::Auto => "auto",
            KvCacheDtypeArg::Float16 => "float16",
            KvCacheDtypeArg::Float32 => "float32",
        },
        gpu_memory_utilization: args.engine.gpu_memory_utilization,
        swap_space: args.engine.swap_space,
    });
    state.generation_defaults = defaults;
    if let Some(stats) = kv_event_stats {
        state.metrics.set_kv_events(stats);
    }
    state.max_body_bytes = args.http.max_body_bytes;
    crate::lora::setup(&mut state, &args.engine.lora, lora_config)?;
    state.cors = crate::cors::Cors::from_flags(
        args.http.allowed_origins.clone(),
        args.http.allowed_methods.clone(),
        args.http.allowed_headers.clone(),
    );
    Ok(state)
}

pub(crate) async fn shutdown_signal() {
    let ctrl_c = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
    tracing::info!("shutdown signal received");
}

/// The HTTP side's runtime (two workers: the engine has threads of its own).
pub(crate) fn http_runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
}

/// Listens on `--host`/`--port`.
pub(crate) async fn listen(http: &crate::cli::HttpArgs) -> anyhow::Result<tokio::net::TcpListener> {
    let addr = format!("{}:{}", http.host, http.port);
    tokio::net::TcpListener::bind(&addr)
        .await
        .with_context(|| format!("cannot listen on {addr}"))
}

/// `server serve`: runs until SIGINT/SIGTERM.
pub fn run_serve(args: ServeArgs) -> anyhow::Result<()> {
    // Tensor parallelism started as a plain command (`mp`, the default,
    // or `mpi`): this process becomes the HTTP front and starts the ranks
    // itself, through MPI's launcher.
    if args.engine.tensor_parallel_size > 1
        && cfg!(feature = "mpi")
        && !crate::tp_front::started_by_mpiexec()
    {
        return crate::tp_front::run_front(&args);
    }
    if let Some(comm) = crate::tp::collective(&args.engine)? {
        if comm.rank() != 0 {
            return run_rank(&args.engine, &comm);
        }
    }
    let state = Arc::new(build_state(&args)?);
    http_runtime()?.block_on(async {
        let listener = listen(&args.http).await?;
        tracing::info!(
            "serving {} at http://{}/v1",
            state.served_model_name,
            listener.local_addr()?
        );
        http::serve(
            listener,
            Arc::clone(&state),
            shutdown_signal(),
            Duration::from_secs(10),
        )
        .await?;
        anyhow::Ok(())
    })?;
    let backend = Arc::clone(&state.backend);
    backend.shutdown();
    tracing::info!("engine stopped");
    Ok(())
}

/// `server generate`: a quick greedy completion printed to stdout, through
/// the same engine the server uses.
pub fn run_generate(engine: &EngineArgs, args: GenerateArgs) -> anyhow::Result<()> {
    if let Some(comm) = crate::tp::collective(engine)? {
        if comm.rank() != 0 {
            return run_rank(engine, &comm);
        }
    }
    let Opened { reader, info, .. } = open_model(engine)?;
    let ModelInfo {
        tokenizer,
        chat_template,
        ..
    } = &info;
    let text = if args.chat {
        let t = chat_template
            .as_ref()
            .context("this model has no chat template")?;
        t.render(&[ChatMessage::new("user", args.prompt.clone())], true)?
    } else {
        args.prompt.clone()
    };
    let prompt = tokenizer.encode(&text, !args.chat)?;
    let handle = HandleConfig {
        max_waiting: 16,
        ..HandleConfig::default()
    };
    let (backend, _) = start_engine(engine, reader, &info, handle)?;
    let out = generate_text(&backend, tokenizer, prompt, args.max_tokens)?;
    println!("{out}");
    crate::backend::Backend::shutdown(&backend);
    Ok(())
}

/// A tensor-parallel rank other than 0: loads its shard, then runs the
/// steps rank 0 broadcasts until rank 0 stops. It serves no HTTP.
fn run_rank(engine: &EngineArgs, comm: &Arc<dyn Collective>) -> anyhow::Result<()> {
    let Opened { reader, info, .. } = open_model(engine)?;
    let max_len = info.config.max_position_embeddings;
    let opts = engine_options(engine, max_len, HandleConfig::default());
    let input = WeightInput::File {
        reader: &reader,
        cpu_types: weight_types(engine.dtype),
    };
    let config = reader.config().clone();
    let built = build_tp_executor(config, input, &opts.executor, Arc::clone(comm))
        .context("building this rank's shard")?;
    drop(reader);
    tracing::info!(executor = %built.description, "tensor-parallel rank ready");
    let mut exec = built.executor;
    run_worker(&mut *exec, &**comm).context("tensor-parallel rank")?;
    tracing::info!("rank 0 stopped; this rank exits");
    Ok(())
}

/// Greedy generation of up to `max_tokens` tokens after `prompt`; returns
/// the generated text (complete UTF-8, special tokens left out).
pub fn generate_text(
    backend: &dyn crate::backend::Backend,
    tokenizer: &model_loader::Tokenizer,
    prompt: Vec<u32>,
    max_tokens: usize,
) -> anyhow::Result<String> {
    use futures_util::StreamExt;
    let params = crate::backend::RequestParams {
        max_tokens: Some(max_tokens),
        ..Default::default()
    };
    let mut stream = backend
        .submit(crate::backend::EngineRequest {
            prompt_token_ids: prompt,
            params,
        })
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let rt = tokio::runtime::Builder::new_current_thread().build()?;
    let mut detok = crate::detok::IncrementalDetokenizer::new();
    let mut text = String::new();
    rt.block_on(async {
        while let Some(step) = stream.next().await {
            let step = step.map_err(|e| anyhow::anyhow!("{e}"))?;
            for t in step.seqs.iter().flat_map(|s| &s.tokens) {
                text.push_str(&detok.push(tokenizer, t.token_id));
            }
        }
        anyhow::Ok(())
    })?;
    text.push_str(&detok.flush());
    Ok(text)
}
