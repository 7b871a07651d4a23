//! Drives one validated request through the backend: submits one engine
//! request per prompt, merges their output streams, detokenizes each choice
//! incrementally, applies stop strings and yields per-choice deltas.
//!
//! Choice `prompt_index * n + seq_index` is the OpenAI `index`.
//!
//! Invariants:
//! - every choice ends with exactly one delta carrying a finish reason;
//! - a prompt's engine stream is dropped (aborting it in the engine) as soon
//!   as all its choices are finished, e.g. by stop strings, and all streams
//!   are dropped when the [`Generation`] is (client gone);
//! - latency metrics: TTFT once per request at its first token, ITL between
//!   successive token-carrying deltas, e2e at the end;
//! - a prompt's logprobs (when asked) are kept per prompt, and flagged on
//!   the deltas of the step that brought them: each choice's first delta.
//!   `echo` with `max_tokens: 0` and logprobs asked still runs the prompt
//!   (one token, discarded) so that its logprobs exist.

use crate::backend::{
    Backend, EngineError, EngineRequest, OutputStream, PromptLogprobs, SeqDelta, StepOutput,
    TokenOut,
};
use crate::detok::{IncrementalDetokenizer, StopMatcher};
use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::validate::GenerateRequest;
use futures_util::Stream;
use model_loader::Tokenizer;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

/// One item of an engine stream.
type StepItem = Result<StepOutput, EngineError>;

/// New output of one choice.
#[derive(Debug, Clone, PartialEq)]
pub struct ChoiceDelta {
    pub index: usize,
    pub text: String,
    pub tokens: Vec<TokenOut>,
    pub finish_reason: Option<&'static str>,
    /// This delta is the first after its prompt's logprobs arrived (they
    /// are in [`Generation::prompt_logprobs`]).
    pub prompt_logprobs: bool,
}

/// Accumulated state of one choice.
#[derive(Debug, Default)]
pub struct ChoiceState {
    detok: IncrementalDetokenizer,
    stop: StopMatcher,
    pub text: String,
    pub tokens: Vec<TokenOut>,
    pub finish_reason: Option<&'static str>,
}

impl ChoiceState {
    pub fn new(stops: Vec<String>) -> Self {
        Self {
            stop: StopMatcher::new(stops),
            ..Self::default()
        }
    }

    pub fn is_finished(&self) -> bool {
        self.finish_reason.is_some()
    }

    /// Applies an engine delta; `None` when the choice had already finished.
    pub fn apply(&mut self, tok: &Tokenizer, index: usize, d: &SeqDelta) -> Option<ChoiceDelta> {
        if self.is_finished() {
            return None;
        }
        let mut out = ChoiceDelta {
            index,
            text: String::new(),
            tokens: Vec::new(),
            finish_reason: None,
            prompt_logprobs: false,
        };
        for t in &d.tokens {
            out.tokens.push(t.clone());
            let piece = self.detok.push(tok, t.token_id);
            let o = self.stop.push(&piece);
            out.text.push_str(&o.text);
            if o.stopped {
                out.finish_reason = Some("stop");
                break;
            }
        }
        if out.finish_reason.is_none() {
            if let Some(reason) = d.finish_reason {
                let o = self.stop.push(&self.detok.flush());
                out.text.push_str(&o.text);
                if o.stopped {
                    out.finish_reason = Some("stop");
                } else {
                    out.text.push_str(&self.stop.flush());
                    out.finish_reason = Some(reason.as_str());
                }
            }
        }
        self.text.push_str(&out.text);
        self.tokens.extend(out.tokens.iter().cloned());
        self.finish_reason = out.finish_reason;
        Some(out)
    }

    /// Ends a choice whose stream stopped without a finish reason.
    pub fn abort(&mut self, index: usize) -> Option<ChoiceDelta> {
        self.finish_empty(index, "abort")
    }

    /// Ends a prompt-only choice (`echo` with `max_tokens: 0`).
    fn finish_prompt_only(&mut self, index: usize) -> Option<ChoiceDelta> {
        self.finish_empty(index, "length")
    }

    /// Ends an unfinished choice with `reason` and no further text.
    fn finish_empty(&mut self, index: usize, reason: &'static str) -> Option<ChoiceDelta> {
        if self.is_finished() {
            return None;
        }
        self.finish_reason = Some(reason);
        Some(ChoiceDelta {
            index,
            text: String::new(),
            tokens: Vec::new(),
            finish_reason: self.finish_reason,
            prompt_logprobs: false,
        })
    }
}

/// One request in flight.
pub struct Generation {
    pub req: GenerateRequest,
    pub choices: Vec<ChoiceState>,
    streams: Vec<Option<OutputStream>>,
    tokenizer: Arc<Tokenizer>,
    metrics: Arc<Metrics>,
    arrival: Instant,
    last_token: Option<Instant>,
    next_poll: usize,
    done: bool,
    pub num_cached_tokens: usize,
    /// Per prompt: its logprobs once the engine sent them.
    pub prompt_logprobs: Vec<Option<PromptLogprobs>>,
    /// Per prompt: run only for its logprobs; generated tokens are dropped.
    prompt_only: Vec<bool>,
}

impl Generation {
    /// Submits every prompt; on a refusal the already submitted ones are
    /// dropped (aborted).
    pub fn start(
        backend: &dyn Backend,
        req: GenerateRequest,
        tokenizer: Arc<Tokenizer>,
        metrics: Arc<Metrics>,
    ) -> Result<Self, ApiError> {
        let arrival = Instant::now();
        let mut streams = Vec::with_capacity(req.prompts.len());
        let mut prompt_only = vec![false; req.prompts.len()];
        let refused = |e: EngineError| {
            metrics.requests_rejected.fetch_add(1, Ordering::Relaxed);
            ApiError::from(e)
        };
        for (i, p) in req.prompts.iter().enumerate() {
            let mut request = EngineRequest {
                prompt_token_ids: p.token_ids.clone(),
                params: req.params.clone(),
            };
            // `None` asks the engine to fill the context.
            request.params.max_tokens = req.max_tokens;
            if req.max_tokens == Some(0) && req.echo {
                // `echo` with max_tokens 0: only the prompt comes back (the
                // engine still validates the prompt, with one token asked).
                request.params.max_tokens = Some(1);
                if request.params.sampling.prompt_logprobs.is_none() {
                    backend.validate(&request).map_err(refused)?;
                    streams.push(None);
                    continue;
                }
                // The prompt must run for its logprobs; its token is dropped.
                prompt_only[i] = true;
            }
            streams.push(Some(backend.submit(request).map_err(refused)?));
        }
        let n = req.params.sampling.n;
        let mut choices: Vec<ChoiceState> = (0..req.prompts.len() * n)
            .map(|_| ChoiceState::new(req.stop.clone()))
            .collect();
        for (i, s) in streams.iter().enumerate() {
            if s.is_none() {
                (i * n..(i + 1) * n).for_each(|c| choices[c].finish_reason = Some("length"));
            }
        }
        Ok(Self {
            req,
            choices,
            streams,
            tokenizer,
            metrics,
            arrival,
            last_token: None,
            next_poll: 0,
            done: false,
            num_cached_tokens: 0,
            prompt_logprobs: vec![None; prompt_only.len()],
            prompt_only,
        })
    }

    pub fn created_secs() -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs())
    }

    /// Polls the prompt streams round-robin for the next item.
    fn poll_any(&mut self, cx: &mut Context<'_>) -> Poll<Option<(usize, Option<StepItem>)>> {
        let k = self.streams.len();
        let mut any_open = false;
        for j in 0..k {
            let i = (self.next_poll + j) % k;
            let Some(s) = self.streams[i].as_mut() else {
                continue;
            };
            any_open = true;
            match Pin::new(s).poll_next(cx) {
                Poll::Ready(item) => {
                    self.next_poll = (i + 1) % k;
                    if item.is_none() {
                        self.streams[i] = None;
                    }
                    return Poll::Ready(Some((i, item)));
                }
                Poll::Pending => {}
            }
        }
        if any_open {
            Poll::Pending
        } else {
            Poll::Ready(None)
        }
    }

    /// The next batch of choice deltas; `None` when every choice finished.
    pub async fn next(&mut self) -> Option<Result<Vec<ChoiceDelta>, ApiError>> {
        loop {
            if self.choices.iter().all(ChoiceState::is_finished) {
                self.streams.iter_mut().for_each(|s| *s = None);
                self.finish_metrics();
                return None;
            }
            let (i, item) = futures_util::future::poll_fn(|cx| self.poll_any(cx)).await?;
            let deltas = match item {
                Some(Ok(out)) => self.apply(i, &out),
                Some(Err(e)) => {
                    self.streams[i] = None;
                    self.metrics
                        .requests_aborted
                        .fetch_add(1, Ordering::Relaxed);
                    return Some(Err(e.into()));
                }
                None => self.abort_prompt(i),
            };
            if !deltas.is_empty() {
                return Some(Ok(deltas));
            }
        }
    }

    fn apply(&mut self, prompt: usize, out: &StepOutput) -> Vec<ChoiceDelta> {
        let n = self.req.params.sampling.n;
        self.num_cached_tokens = self.num_cached_tokens.max(out.num_cached_tokens);
        let mut deltas = Vec::new();
        if self.prompt_only[prompt] {
            if out.prompt_logprobs.is_some() || out.seqs.iter().any(|d| d.finish_reason.is_some()) {
                deltas.extend(
                    (prompt * n..(prompt + 1) * n)
                        .filter_map(|i| self.choices[i].finish_prompt_only(i)),
                );
            }
        } else {
            for d in out.seqs.iter().filter(|d| d.index < n) {
                let index = prompt * n + d.index;
                if let Some(delta) = self.choices[index].apply(&self.tokenizer, index, d) {
                    deltas.push(delta);
                }
            }
        }
        if let Some(list) = &out.prompt_logprobs {
            self.prompt_logprobs[prompt] = Some(list.clone());
            deltas.iter_mut().for_each(|d| d.prompt_logprobs = true);
        }
        if deltas.iter().any(|d| !d.tokens.is_empty()) {
            let now = Instant::now();
            match self.last_token {
                None => self
                    .metrics
                    .ttft
                    .observe((now - self.arrival).as_secs_f64()),
                Some(t) => self.metrics.itl.observe((now - t).as_secs_f64()),
            }
            self.last_token = Some(now);
        }
        if (0..n).all(|s| self.choices[prompt * n + s].is_finished()) {
            // Done early (stop strings): abort the rest in the engine.
            self.streams[prompt] = None;
        }
        deltas
    }

    fn abort_prompt(&mut self, prompt: usize) -> Vec<ChoiceDelta> {
        let n = self.req.params.sampling.n;
        (prompt * n..(prompt + 1) * n)
            .filter_map(|i| self.choices[i].abort(i))
            .collect()
    }

    /// Records e2e latency once, when every choice has finished.
    fn finish_metrics(&mut self) {
        if !self.done {
            self.done = true;
            self.metrics
                .e2e
                .observe(self.arrival.elapsed().as_secs_f64());
            self.metrics
                .record_finished(self.choices.iter().filter_map(|c| c.finish_reason));
        }
    }

    /// Prompt tokens over all prompts.
    pub fn prompt_tokens(&self) -> usize {
        self.req.prompts.iter().map(|p| p.token_ids.len()).sum()
    }

    /// Generated tokens over all choices.
    pub fn completion_tokens(&self) -> usize {
        self.choices.iter().map(|c| c.tokens.len()).sum()
    }

    /// Runs to the end (non-streaming).
    pub async fn run_to_end(&mut self) -> Result<(), ApiError> {
        while let Some(item) = self.next().await {
            item?;
        }
        Ok(())
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }
}

impl Drop for Generation {
    fn drop(&mut self) {
        if !self.done {
            self.metrics
                .requests_aborted
                .fetch_add(1, Ordering::Relaxed);
        }
    }
}
