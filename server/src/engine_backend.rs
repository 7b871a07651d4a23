//! The adapter from the real engine (`engine::EngineHandle`) to the server's
//! [`Backend`] trait, and the construction of the engine from a loaded model.
//!
//! Requests carry the engine's own `RequestParams` (validated once, by the
//! engine's `SamplingParams::validate`, at the HTTP edge).
//! A request with `n > 1` (or `best_of`, or beam search) is one engine
//! group whose sequences share the prompt's blocks; its outputs carry the
//! sequence index. Top logprobs come from the engine per token; prompt
//! logprobs once per request.
//!
//! Invariant: dropping the returned stream drops every `RequestStream`,
//! which aborts the requests in the engine and frees their blocks.

use crate::backend::{
    Backend, BackendLimits, BackendStats, EngineRequest, FinishReason, OutputStream,
    PromptTokenLogprob, SeqDelta, SpecMetrics, StepOutput, TokenOut,
};
use anyhow::Context;
use engine::dist::Collective;
use engine::engine_loop::{DraftProposer, EngineStats, HandleConfig, ShutdownMode};
use engine::executor::tp::build_tp_executor;
use engine::executor::{build_executor, ExecutorRequest, WeightInput};
use engine::kv::{KvEventSink, PagedKvCacheManager, PagedKvConfig};
use engine::scheduler::{self, SchedulerConfig};
use engine::spec::SpecMethod;
use engine::{EngineConfig, EngineError, EngineHandle, LlmEngine, RequestOutput, RequestStream};
use futures_util::StreamExt;
use std::sync::Arc;

/// How to size and configure the engine (from the CLI).
#[derive(Debug, Clone, PartialEq)]
pub struct EngineOptions {
    pub scheduler: SchedulerConfig,
    pub block_size: usize,
    /// Which executor and how its pools are sized.
    pub executor: ExecutorRequest,
    pub enable_prefix_caching: bool,
    /// Waiting limit and output-stream bounds of the engine handle.
    pub handle: HandleConfig,
    /// `--enable-lora`: the `--max-loras` slots (`None`: adapters off).
    pub max_loras: Option<usize>,
}

/// [`Backend`] over the real engine.
pub struct EngineBackend {
    handle: EngineHandle,
    limits: BackendLimits,
    /// `num_speculative_tokens` when speculative decoding is on.
    spec_k: Option<usize>,
}

/// The draft model of `--speculative-config` on its own executor (the
/// target's device request, no swap pool). A file that does not load, or a
/// vocabulary that differs from the target's, stops startup.
fn draft_proposer(
    path: &std::path::Path,
    cpu_types: model_loader::WeightTypes,
    opts: &EngineOptions,
    target_vocab: usize,
) -> anyhow::Result<DraftProposer> {
    let what = || format!("speculative config: `model` {}", path.display());
    let reader = model_loader::WeightReader::open(path).with_context(what)?;
    let req = ExecutorRequest {
        swap_bytes: 0,
        ..opts.executor
    };
    let input = WeightInput::File {
        reader: &reader,
        cpu_types,
    };
    let built = build_executor(reader.config().clone(), input, &req).with_context(what)?;
    tracing::info!(draft = %path.display(), executor = %built.description, "draft model ready");
    Ok(DraftProposer::new(built.executor, target_vocab)?)
}

impl EngineBackend {
    /// Builds the engine from the model file `reader` reads (the executor
    /// takes the weights a layer at a time into its own formats; the CPU's
    /// matrices in `cpu_types`) and starts its thread. With `kv_events` the
    /// engine records its KV cache events and hands them to it every step.
    /// With `tp` this process is rank 0 of a tensor-parallel group: the
    /// executor holds rank 0's shard and drives the other ranks.
    pub fn start(
        reader: &model_loader::WeightReader,
        cpu_types: model_loader::WeightTypes,
        eos_token_ids: Vec<u32>,
        opts: &EngineOptions,
        kv_events: Option<Box<dyn KvEventSink>>,
        tp: Option<Arc<dyn Collective>>,
    ) -> anyhow::Result<Self> {
        let input = WeightInput::File { reader, cpu_types };
        let config = reader.config().clone();
        let built = match tp {
            None => build_executor(config, input, &opts.executor),
            Some(comm) => build_tp_executor(config, input, &opts.executor, comm),
        }
        .context("building the executor")?;
        let executor = built.executor;
        let (gpu_blocks, cpu_blocks) = executor.num_blocks();
        tracing::info!(executor = %built.description, gpu_blocks, cpu_blocks, "executor ready");
        let mut kv_cfg = PagedKvConfig::new(opts.block_size, gpu_blocks, cpu_blocks);
        kv_cfg.enable_prefix_caching = opts.enable_prefix_caching;
        let kv = PagedKvCacheManager::new(kv_cfg).context("building the KV cache manager")?;
        let mut engine = LlmEngine::new(
            EngineConfig {
                scheduler: opts.scheduler.clone(),
                eos_token_ids,
            },
            Box::new(kv),
            executor,
        )?;
        if let Some(sink) = kv_events {
            engine.set_kv_event_sink(sink);
        }
        if let Some(SpecMethod::DraftModel { model }) =
            opts.scheduler.speculative.as_ref().map(|s| &s.method)
        {
            let vocab = reader.config().vocab_size;
            engine.set_proposer(Box::new(draft_proposer(model, cpu_types, opts, vocab)?));
        }
        if let Some(n) = opts.max_loras {
            engine.enable_lora(n).context("--enable-lora")?;
        }
        let handle = EngineHandle::spawn(engine, opts.handle)?;
        Ok(Self {
            handle,
            spec_k: opts
                .scheduler
                .speculative
                .as_ref()
                .map(|s| s.num_speculative_tokens),
            limits: BackendLimits {
                max_model_len: opts.scheduler.max_model_len,
                block_size: opts.block_size,
                num_gpu_blocks: gpu_blocks,
                num_cpu_blocks: cpu_blocks,
            },
        })
    }
}

fn map_reason(r: scheduler::FinishReason) -> FinishReason {
    match r {
        scheduler::FinishReason::Stop => FinishReason::Stop,
        scheduler::FinishReason::Length => FinishReason::Length,
        scheduler::FinishReason::Abort => FinishReason::Abort,
    }
}

/// One engine output as a server step.
fn convert(out: RequestOutput, n: usize) -> StepOutput {
    let seqs = out
        .seqs
        .into_iter()
        .map(|s| SeqDelta {
            index: s.index,
            tokens: s
                .new_token_ids
                .iter()
                .zip(&s.new_logprobs)
                .enumerate()
                .map(|(i, (&token_id, &logprob))| TokenOut {
                    token_id,
                    logprob,
                    top_logprobs: s.new_top_logprobs.get(i).cloned().unwrap_or_default(),
                })
                .collect(),
            finish_reason: s.finish_reason.map(map_reason),
        })
        .collect();
    let prompt_logprobs = out.prompt_logprobs.map(|list| {
        list.into_iter()
            .map(|e| {
                e.map(|e| PromptTokenLogprob {
                    token_id: e.token,
                    logprob: e.logprob,
                    rank: e.rank,
                    top_logprobs: e.top,
                })
            })
            .collect()
    });
    let mut step = StepOutput {
        seqs,
        num_cached_tokens: out.num_cached_tokens,
        prompt_logprobs,
    };
    if out.finished && step.seqs.is_empty() {
        // An abort notice: close every sequence.
        step.seqs.extend((0..n).map(|index| SeqDelta {
            index,
            tokens: Vec::new(),
            finish_reason: Some(FinishReason::Abort),
        }));
    }
    step
}

/// The request's outputs until (and including) the finished one (`n`:
/// the request's returned sequences).
fn output_stream(rs: RequestStream, n: usize) -> OutputStream {
    futures_util::stream::unfold(Some(rs), move |state| async move {
        let mut rs = state?;
        match rs.recv().await? {
            Ok(out) => {
                let finished = out.finished;
                let step = convert(out, n);
                Some((Ok(step), (!finished).then_some(rs)))
            }
            Err(e) => Some((Err(e), None)),
        }
    })
    .boxed()
}

impl Backend for EngineBackend {
    fn submit(&self, req: EngineRequest) -> Result<OutputStream, EngineError> {
        let n = req.params.sampling.n.max(1);
        let rs = self.handle.add_request(req.prompt_token_ids, req.params)?;
        Ok(output_stream(rs, n))
    }

    fn validate(&self, req: &EngineRequest) -> Result<(), EngineError> {
        self.handle
            .validate(req.prompt_token_ids.clone(), req.params.clone())
    }

    fn lora_names(&self) -> engine::engine_loop::LoraNames {
        self.handle.lora_names()
    }

    fn stats(&self) -> BackendStats {
        let EngineStats { scheduler: s, kv } = self.handle.stats();
        BackendStats {
            num_running: s.num_running,
            num_waiting: s.num_waiting,
            num_swapped: s.num_swapped,
            kv_total_blocks: kv.total_blocks,
            kv_free_blocks: kv.free_blocks,
            cpu_total_blocks: kv.cpu_total_blocks,
            cpu_free_blocks: kv.cpu_free_blocks,
            kv_usage: f64::from(kv.usage),
            prefix_cache_queries: kv.prefix_cache_queries,
            prefix_cache_hits: kv.prefix_cache_hits,
            preemptions_swap: s.preemptions_swap,
            preemptions_recompute: s.preemptions_recompute,
            prompt_tokens: s.prompt_tokens,
            generation_tokens: s.generation_tokens,
            spec: self.spec_k.map(|k| SpecMetrics {
                num_speculative_tokens: k,
                stats: s.spec,
            }),
        }
    }

    fn limits(&self) -> BackendLimits {
        self.limits
    }

    fn shutdown(&self) {
        self.handle.shutdown(ShutdownMode::Abort);
    }
}
