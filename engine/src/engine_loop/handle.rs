//! The async handle: a dedicated engine thread runs the loop; callers add
//! requests and read per-request output streams (tokio mpsc receivers).
//!
//! Invariants:
//! - the waiting count the overload check uses (`queued` commands not yet
//!   seen by the thread + the scheduler's waiting queue after the last step)
//!   never exceeds `max_waiting` by more than the number of racing callers;
//! - a dropped [`RequestStream`] aborts its request (freeing its blocks) at
//!   the engine thread's next command poll, at most one step later;
//! - after [`EngineHandle::shutdown`] returns, the thread has exited and no
//!   new request is accepted.

use super::{EngineStats, LlmEngine, RequestOutput};
use crate::error::EngineError;
use crate::scheduler::{validate_request, FinishReason, RequestId, RequestParams, SchedulerConfig};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, Sender, TryRecvError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};

/// One item of a request's stream.
pub type StreamItem = Result<RequestOutput, EngineError>;

/// Options of the handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HandleConfig {
    /// Most requests waiting for admission before `Overloaded` is returned.
    pub max_waiting: usize,
}

impl Default for HandleConfig {
    fn default() -> Self {
        Self { max_waiting: 1024 }
    }
}

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
        prompt: Vec<u32>,
        params: Box<RequestParams>,
        tx: UnboundedSender<StreamItem>,
    },
    Abort(RequestId),
    Shutdown(ShutdownMode),
}

struct Shared {
    queued: AtomicUsize,
    waiting: AtomicUsize,
    accepting: AtomicBool,
    stats: Mutex<EngineStats>,
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
        });
        let scheduler = engine.scheduler_config().clone();
        let capacity_tokens = engine.kv_capacity_tokens();
        let thread_shared = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("engine".into())
            .spawn(move || EngineThread::new(engine, rx, thread_shared).run())
            .map_err(|e| EngineError::InvalidConfig(format!("cannot start engine thread: {e}")))?;
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
        validate_request(&inner.scheduler, inner.capacity_tokens, &prompt, &params)?;
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
        let (tx, rx) = unbounded_channel();
        let cmd = Command::Add {
            id,
            prompt,
            params: Box::new(params),
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

    /// Aborts a request; its stream ends with a `finish_reason` of abort.
    pub fn abort(&self, id: RequestId) {
        let _ = self.inner.tx.send(Command::Abort(id));
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
    rx: UnboundedReceiver<StreamItem>,
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

/// State of the engine thread.
struct EngineThread {
    engine: LlmEngine,
    rx: Receiver<Command>,
    shared: Arc<Shared>,
    streams: HashMap<RequestId, UnboundedSender<StreamItem>>,
    shutdown: Option<ShutdownMode>,
}

impl EngineThread {
    fn new(engine: LlmEngine, rx: Receiver<Command>, shared: Arc<Shared>) -> Self {
        Self {
            engine,
            rx,
            shared,
            streams: HashMap::new(),
            shutdown: None,
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
                Some(ShutdownMode::Drain) if !self.engine.has_unfinished() => break,
                _ => {}
            }
            if self.engine.has_unfinished() {
                let outputs = self.engine.step();
                self.dispatch(outputs);
            }
            self.publish();
        }
        self.publish();
    }

    /// Handles pending commands; blocks for one when idle. False when every
    /// sender is gone.
    fn poll_commands(&mut self) -> bool {
        if !self.engine.has_unfinished() && self.shutdown.is_none() {
            match self.rx.recv() {
                Ok(cmd) => self.handle(cmd),
                Err(_) => return false,
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
            Command::Add {
                id,
                prompt,
                params,
                tx,
            } => {
                self.shared.queued.fetch_sub(1, Ordering::AcqRel);
                if self.shutdown.is_some() {
                    let _ = tx.send(Err(EngineError::ShutDown));
                    return;
                }
                match self.engine.add_request(id, prompt, *params) {
                    Ok(()) => {
                        self.streams.insert(id, tx);
                    }
                    Err(e) => {
                        let _ = tx.send(Err(e));
                    }
                }
            }
            Command::Abort(id) => {
                self.engine.abort_request(id);
                if let Some(tx) = self.streams.remove(&id) {
                    let mut out = RequestOutput::new(id);
                    out.finished = true;
                    out.seq_mut(0).finish_reason = Some(FinishReason::Abort);
                    let _ = tx.send(Ok(out));
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
        for out in outputs {
            let id = out.request_id;
            let finished = out.finished;
            let item = match out.error.clone() {
                Some(e) => Err(e),
                None => Ok(out),
            };
            let Some(tx) = self.streams.get(&id) else {
                continue;
            };
            if tx.send(item).is_err() {
                // The reader is gone: free its blocks now.
                self.engine.abort_request(id);
                self.streams.remove(&id);
            } else if finished {
                self.streams.remove(&id);
            }
        }
    }

    fn abort_all(&mut self) {
        for (id, tx) in self.streams.drain() {
            self.engine.abort_request(id);
            let _ = tx.send(Err(EngineError::ShutDown));
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
    }
}
