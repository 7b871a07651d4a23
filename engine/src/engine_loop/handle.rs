//! The async handle: a dedicated engine thread runs the loop; callers add
//! requests and read per-request output streams (tokio mpsc receivers).
//!
//! Invariants:
//! - the waiting count the overload check uses (`queued` commands not yet
//!   seen by the thread + the scheduler's waiting queue after the last step)
//!   never exceeds `max_waiting` by more than the number of racing callers;
//! - a dropped [`RequestStream`] aborts its request (freeing its blocks) at
//!   the engine thread's next command poll, at most one step later;
//! - output streams are bounded: a request's channel holds at most
//!   [`HandleConfig::stream_capacity`] outputs. When it is full, the engine
//!   parks the request's newer outputs in one merged output (tokens in
//!   order, nothing lost) and retries every loop turn; a stream that stays
//!   full for [`HandleConfig::stall_timeout`] (its reader stopped reading)
//!   has its request aborted and its blocks freed, and its channel closed
//!   (the reader sees the outputs already queued, then the end). What one
//!   request holds is thus at most `stream_capacity` outputs plus the tokens
//!   generated during one stall timeout;
//! - after [`EngineHandle::shutdown`] returns, the thread has exited and no
//!   new request is accepted.

use super::{EngineStats, LlmEngine, RequestOutput};
use crate::error::EngineError;
use crate::scheduler::{
    validate_request, FinishReason, RequestId, RequestParams, SchedulerConfig, ValidRequest,
};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender, TryRecvError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tokio::sync::mpsc::error::TrySendError;
use tokio::sync::mpsc::{channel, Receiver as StreamRx, Sender as StreamTx};

/// One item of a request's stream.
pub type StreamItem = Result<RequestOutput, EngineError>;

/// Options of the handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HandleConfig {
    /// Most requests waiting for admission before `Overloaded` is returned.
    pub max_waiting: usize,
    /// Outputs a request's stream holds before the engine parks newer ones
    /// (at least 1; one output is one step's new tokens).
    pub stream_capacity: usize,
    /// How long a stream may stay full (its reader not reading) before its
    /// request is aborted and its blocks freed.
    pub stall_timeout: Duration,
}

impl Default for HandleConfig {
    fn default() -> Self {
        Self {
            max_waiting: 1024,
            stream_capacity: 64,
            stall_timeout: Duration::from_secs(30),
        }
    }
}

/// How often parked outputs are retried while the engine is otherwise idle.
const PARK_POLL: Duration = Duration::from_millis(5);

/// What happens to unfinished requests at shutdown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShutdownMode {
    /// Finish every accepted request, then stop.
    Drain,
    /// Abort every request (their streams end with `ShutDown`), then stop.
    Abort,
}

enum Command {
    Add {
        id: RequestId,
        request: Box<ValidRequest>,
        tx: StreamTx<StreamItem>,
    },
    Abort(RequestId),
    Shutdown(ShutdownMode),
}

struct Shared {
    queued: AtomicUsize,
    waiting: AtomicUsize,
    accepting: AtomicBool,
    stats: Mutex<EngineStats>,
    /// Requests aborted because their stream stayed full too long.
    stall_aborts: AtomicU64,
    /// LoRA adapter names of running and of waiting requests, as of the
    /// last step (see [`EngineHandle::lora_names`]).
    lora_names: Mutex<super::lora::LoraNames>,
}

struct Inner {
    tx: Sender<Command>,
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
    next_id: AtomicU64,
    config: HandleConfig,
    scheduler: SchedulerConfig,
    capacity_tokens: usize,
}

/// Cloneable handle to the engine thread.
#[derive(Clone)]
pub struct EngineHandle {
    inner: Arc<Inner>,
}

impl EngineHandle {
    /// Starts the engine thread.
    pub fn spawn(engine: LlmEngine, config: HandleConfig) -> Result<Self, EngineError> {
        let (tx, rx) = mpsc::channel();
        let shared = Arc::new(Shared {
            queued: AtomicUsize::new(0),
            waiting: AtomicUsize::new(0),
            accepting: AtomicBool::new(true),
            stats: Mutex::new(engine.stats()),
            stall_aborts: AtomicU64::new(0),
            lora_names: Mutex::new(engine.lora_names()),
        });
        let scheduler = engine.scheduler_config().clone();
        let capacity_tokens = engine.kv_capacity_tokens();
        let thread_shared = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("engine".into())
            .spawn(move || EngineThread::new(engine, rx, thread_shared, config).run())
            .map_err(|e| EngineError::Thread {
                what: "engine",
                source: crate::error::cause(e),
            })?;
        Ok(Self {
            inner: Arc::new(Inner {
                tx,
                shared,
                thread: Mutex::new(Some(thread)),
                next_id: AtomicU64::new(0),
                config,
                scheduler,
                capacity_tokens,
            }),
        })
    }

    /// Queues a request. Refuses at once an invalid or never-fitting request,
    /// and returns `Overloaded` beyond the waiting limit.
    pub fn add_request(
        &self,
        prompt: Vec<u32>,
        params: RequestParams,
    ) -> Result<RequestStream, EngineError> {
        let inner = &self.inner;
        if !inner.shared.accepting.load(Ordering::Acquire) {
            return Err(EngineError::ShutDown);
        }
        let request = validate_request(&inner.scheduler, inner.capacity_tokens, prompt, params)?;
        let queued = inner.shared.queued.fetch_add(1, Ordering::AcqRel) + 1;
        let waiting = queued + inner.shared.waiting.load(Ordering::Acquire);
        if waiting > inner.config.max_waiting {
            inner.shared.queued.fetch_sub(1, Ordering::AcqRel);
            return Err(EngineError::Overloaded {
                waiting: waiting - 1,
                limit: inner.config.max_waiting,
            });
        }
        let id = RequestId(inner.next_id.fetch_add(1, Ordering::Relaxed));
        let (tx, rx) = channel(inner.config.stream_capacity.max(1));
        let cmd = Command::Add {
            id,
            request: Box::new(request),
            tx,
        };
        if inner.tx.send(cmd).is_err() {
            inner.shared.queued.fetch_sub(1, Ordering::AcqRel);
            return Err(EngineError::ShutDown);
        }
        Ok(RequestStream {
            id,
            rx,
            tx: inner.tx.clone(),
            done: false,
        })
    }

    /// Runs the validation [`EngineHandle::add_request`] runs, without
    /// queueing anything.
    pub fn validate(&self, prompt: Vec<u32>, params: RequestParams) -> Result<(), EngineError> {
        let inner = &self.inner;
        validate_request(&inner.scheduler, inner.capacity_tokens, prompt, params)?;
        Ok(())
    }

    /// Aborts a request; its stream ends with a `finish_reason` of abort.
    pub fn abort(&self, id: RequestId) {
        let _ = self.inner.tx.send(Command::Abort(id));
    }

    /// Requests aborted so far because their reader stopped reading for
    /// longer than [`HandleConfig::stall_timeout`].
    pub fn stream_stall_aborts(&self) -> u64 {
        self.inner.shared.stall_aborts.load(Ordering::Relaxed)
    }

    /// The LoRA adapter names of running and of waiting requests as of the
    /// last step (`vllm:lora_requests_info`).
    pub fn lora_names(&self) -> super::lora::LoraNames {
        match self.inner.shared.lora_names.lock() {
            Ok(n) => n.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// The counters as of the last step.
    pub fn stats(&self) -> EngineStats {
        match self.inner.shared.stats.lock() {
            Ok(s) => *s,
            Err(poisoned) => *poisoned.into_inner(),
        }
    }

    /// Stops accepting requests, drains or aborts the rest, and waits for the
    /// engine thread to exit. Blocking: call it from a blocking context.
    pub fn shutdown(&self, mode: ShutdownMode) {
        self.inner.shutdown(mode);
    }
}

impl Inner {
    fn shutdown(&self, mode: ShutdownMode) {
        self.shared.accepting.store(false, Ordering::Release);
        let _ = self.tx.send(Command::Shutdown(mode));
        let thread = match self.thread.lock() {
            Ok(mut t) => t.take(),
            Err(poisoned) => poisoned.into_inner().take(),
        };
        if let Some(t) = thread {
            if t.join().is_err() {
                tracing::error!("the engine thread panicked");
            }
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.shutdown(ShutdownMode::Abort);
    }
}

/// A request's outputs. Dropping it aborts the request.
pub struct RequestStream {
    id: RequestId,
    rx: StreamRx<StreamItem>,
    tx: Sender<Command>,
    done: bool,
}

impl RequestStream {
    pub fn request_id(&self) -> RequestId {
        self.id
    }

    /// The next output; `None` after the last one.
    pub async fn recv(&mut self) -> Option<StreamItem> {
        let item = self.rx.recv().await;
        self.track(item)
    }

    /// Like [`RequestStream::recv`] for threads outside an async runtime.
    pub fn blocking_recv(&mut self) -> Option<StreamItem> {
        let item = self.rx.blocking_recv();
        self.track(item)
    }

    fn track(&mut self, item: Option<StreamItem>) -> Option<StreamItem> {
        match &item {
            None | Some(Err(_)) => self.done = true,
            Some(Ok(o)) if o.finished => self.done = true,
            Some(Ok(_)) => {}
        }
        item
    }
}

impl Drop for RequestStream {
    fn drop(&mut self) {
        if !self.done {
            let _ = self.tx.send(Command::Abort(self.id));
        }
    }
}

/// What became of an output offered to a stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Offer {
    Sent,
    /// The channel is full; the output waits in [`Slot::parked`].
    Parked,
    /// The reader is gone.
    Gone,
}

/// The engine thread's end of one request's stream.
struct Slot {
    tx: StreamTx<StreamItem>,
    /// Outputs that did not fit, merged into one (an error is final).
    parked: Option<StreamItem>,
    /// When the channel was first found full since the last successful send.
    stalled_since: Option<Instant>,
    /// The engine has finished the request (its blocks are free).
    finished: bool,
}

impl Slot {
    fn new(tx: StreamTx<StreamItem>) -> Self {
        Self {
            tx,
            parked: None,
            stalled_since: None,
            finished: false,
        }
    }

    /// Queues `item` behind whatever is parked, then tries to send.
    fn offer(&mut self, item: StreamItem, now: Instant) -> Offer {
        let item = match (self.parked.take(), item) {
            (Some(Ok(mut p)), Ok(o)) => {
                merge(&mut p, o);
                Ok(p)
            }
            (Some(p), _) => p,
            (None, i) => i,
        };
        self.try_send(item, now)
    }

    /// Retries the parked output.
    fn flush(&mut self, now: Instant) -> Offer {
        match self.parked.take() {
            Some(item) => self.try_send(item, now),
            None => Offer::Sent,
        }
    }

    fn try_send(&mut self, item: StreamItem, now: Instant) -> Offer {
        match self.tx.try_send(item) {
            Ok(()) => {
                self.stalled_since = None;
                Offer::Sent
            }
            Err(TrySendError::Full(item)) => {
                self.parked = Some(item);
                self.stalled_since.get_or_insert(now);
                Offer::Parked
            }
            Err(TrySendError::Closed(_)) => Offer::Gone,
        }
    }
}

/// Appends `later` to `into` (same request, `later` produced after `into`).
fn merge(into: &mut RequestOutput, later: RequestOutput) {
    for s in later.seqs {
        let d = into.seq_mut(s.index);
        d.new_token_ids.extend(s.new_token_ids);
        d.new_logprobs.extend(s.new_logprobs);
        d.new_top_logprobs.extend(s.new_top_logprobs);
        if s.finish_reason.is_some() {
            d.finish_reason = s.finish_reason;
        }
    }
    into.finished |= later.finished;
    into.num_cached_tokens = later.num_cached_tokens;
    if into.prompt_logprobs.is_none() {
        into.prompt_logprobs = later.prompt_logprobs;
    }
}

/// State of the engine thread.
struct EngineThread {
    engine: LlmEngine,
    rx: Receiver<Command>,
    shared: Arc<Shared>,
    streams: HashMap<RequestId, Slot>,
    shutdown: Option<ShutdownMode>,
    stall_timeout: Duration,
}

impl EngineThread {
    fn new(
        engine: LlmEngine,
        rx: Receiver<Command>,
        shared: Arc<Shared>,
        config: HandleConfig,
    ) -> Self {
        Self {
            engine,
            rx,
            shared,
            streams: HashMap::new(),
            shutdown: None,
            stall_timeout: config.stall_timeout,
        }
    }

    fn run(mut self) {
        loop {
            if !self.poll_commands() {
                self.shutdown = Some(ShutdownMode::Abort);
            }
            match self.shutdown {
                Some(ShutdownMode::Abort) => {
                    self.abort_all();
                    break;
                }
                Some(ShutdownMode::Drain)
                    if !self.engine.has_unfinished() && !self.has_parked() =>
                {
                    break
                }
                _ => {}
            }
            if self.engine.has_unfinished() {
                let outputs = self.engine.step();
                // Stats first: a caller who sees an output sees stats at
                // least as new as the step that made it.
                self.publish();
                self.dispatch(outputs);
            }
            self.flush_parked();
            self.publish();
        }
        self.publish();
    }

    fn has_parked(&self) -> bool {
        self.streams.values().any(|s| s.parked.is_some())
    }

    /// Handles pending commands; blocks for one when idle (for at most
    /// [`PARK_POLL`] while outputs are parked). False when every sender is
    /// gone.
    fn poll_commands(&mut self) -> bool {
        if !self.engine.has_unfinished() {
            if self.has_parked() {
                match self.rx.recv_timeout(PARK_POLL) {
                    Ok(cmd) => self.handle(cmd),
                    Err(RecvTimeoutError::Timeout) => {}
                    Err(RecvTimeoutError::Disconnected) => return false,
                }
            } else if self.shutdown.is_none() {
                match self.rx.recv() {
                    Ok(cmd) => self.handle(cmd),
                    Err(_) => return false,
                }
            }
        }
        loop {
            match self.rx.try_recv() {
                Ok(cmd) => self.handle(cmd),
                Err(TryRecvError::Empty) => return true,
                Err(TryRecvError::Disconnected) => return false,
            }
        }
    }

    fn handle(&mut self, cmd: Command) {
        match cmd {
            Command::Add { id, request, tx } => {
                self.shared.queued.fetch_sub(1, Ordering::AcqRel);
                if self.shutdown.is_some() {
                    let _ = tx.try_send(Err(EngineError::ShutDown));
                    return;
                }
                match self.engine.add_valid_request(id, *request) {
                    Ok(()) => {
                        self.streams.insert(id, Slot::new(tx));
                    }
                    Err(e) => {
                        let _ = tx.try_send(Err(e));
                    }
                }
            }
            Command::Abort(id) => {
                self.engine.abort_request(id);
                if let Some(mut slot) = self.streams.remove(&id) {
                    let mut out = RequestOutput::new(id);
                    out.finished = true;
                    out.seq_mut(0).finish_reason = Some(FinishReason::Abort);
                    // Best effort: a full channel just closes.
                    let _ = slot.offer(Ok(out), Instant::now());
                }
            }
            Command::Shutdown(mode) => {
                // Abort wins over drain.
                if self.shutdown != Some(ShutdownMode::Abort) {
                    self.shutdown = Some(mode);
                }
            }
        }
    }

    fn dispatch(&mut self, outputs: Vec<RequestOutput>) {
        let now = Instant::now();
        for out in outputs {
            let id = out.request_id;
            let finished = out.finished;
            let item = match out.error.clone() {
                Some(e) => Err(e),
                None => Ok(out),
            };
            let Some(slot) = self.streams.get_mut(&id) else {
                continue;
            };
            slot.finished |= finished;
            match slot.offer(item, now) {
                Offer::Gone => {
                    // The reader is gone: free its blocks now.
                    self.engine.abort_request(id);
                    self.streams.remove(&id);
                }
                Offer::Sent if finished => {
                    self.streams.remove(&id);
                }
                Offer::Sent | Offer::Parked => {}
            }
        }
    }

    /// Retries parked outputs; aborts the requests whose stream stayed full
    /// longer than the stall timeout.
    fn flush_parked(&mut self) {
        let now = Instant::now();
        let timeout = self.stall_timeout;
        let mut drop_ids = Vec::new();
        for (&id, slot) in self.streams.iter_mut() {
            if slot.parked.is_none() {
                continue;
            }
            match slot.flush(now) {
                Offer::Sent if slot.finished => drop_ids.push((id, false)),
                Offer::Sent => {}
                Offer::Gone => drop_ids.push((id, !slot.finished)),
                Offer::Parked => {
                    if slot
                        .stalled_since
                        .is_some_and(|t| now.duration_since(t) >= timeout)
                    {
                        if !slot.finished {
                            self.shared.stall_aborts.fetch_add(1, Ordering::Relaxed);
                            tracing::warn!(
                                request = id.0,
                                "output stream full for {timeout:?}: request aborted"
                            );
                        }
                        drop_ids.push((id, !slot.finished));
                    }
                }
            }
        }
        for (id, abort) in drop_ids {
            if abort {
                self.engine.abort_request(id);
            }
            // Dropping the sender closes the stream after what is queued.
            self.streams.remove(&id);
        }
    }

    fn abort_all(&mut self) {
        for (id, slot) in self.streams.drain() {
            self.engine.abort_request(id);
            let _ = slot.tx.try_send(Err(EngineError::ShutDown));
        }
    }

    fn publish(&self) {
        let stats = self.engine.stats();
        self.shared
            .waiting
            .store(stats.scheduler.num_waiting, Ordering::Release);
        if let Ok(mut s) = self.shared.stats.lock() {
            *s = stats;
        }
        if self.engine.lora_enabled() {
            if let Ok(mut n) = self.shared.lora_names.lock() {
                *n = self.engine.lora_names();
            }
        }
    }
}
