//! The ZeroMQ publisher: vLLM's `ZmqEventPublisher` on the pure-Rust
//! `zeromq` crate.
//!
//! The engine thread holds a [`ZmqSink`]: `publish` stamps the batch with
//! the next sequence number and the time, and `try_send`s it into a bounded
//! queue (`max_queue_size` batches). It never blocks: when the queue is
//! full the batch is dropped, counted ([`PublisherStats::dropped`]) and
//! logged, and its sequence number is not reused, so subscribers see the
//! gap (and can ask the replay socket, which will not have it either).
//!
//! The publisher thread (`kv-events`, its own single-threaded tokio
//! runtime) owns the sockets. Per batch: encode (`wire`), send
//! `[topic, seq as 8 bytes big-endian, payload]` on the PUB socket, keep
//! `(seq, payload)` in a ring of the last `buffer_steps` batches. Between
//! batches it answers replay requests on the ROUTER socket: a request
//! `[identity, "", start_seq (big-endian)]` gets every buffered batch with
//! `seq >= start_seq` as `[identity, "", seq, payload]`, then the end marker
//! `[identity, "", -1 as 8 bytes, ""]` (vLLM's `END_SEQ`).
//!
//! Invariants: sequence numbers start at 0 and increase by one per batch
//! handed to the sink, published or dropped; batches leave in sequence
//! order; the engine thread only ever does a `try_send`.
//!
//! Cost on the engine thread: one clock read, one channel push. Off it:
//! encoding O(hashes + tokens), one copy of the payload into the replay
//! ring (a reference count: `Bytes`), the PUB socket's fan-out per
//! subscriber (zeromq-rs queues up to 100,000 messages per subscriber and
//! drops beyond, PUB's slow-subscriber rule).

use super::wire;
use anyhow::Context;
use bytes::Bytes;
use engine::kv::{KvEvent, KvEventSink};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::sync::mpsc;
use zeromq::{PubSocket, RouterSocket, Socket, SocketRecv, SocketSend, ZmqMessage};

/// vLLM's end-of-replay sequence number.
pub const END_SEQ: [u8; 8] = (-1i64).to_be_bytes();

/// Where a socket goes: bound here (vLLM binds when the endpoint has `*`
/// or `::`), or connected out to a collector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attach {
    /// Listen on this address (`*` becomes `0.0.0.0`).
    Bind(String),
    /// Connect to this `tcp://host:port`.
    Connect(String),
}

/// What the publisher needs from the configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublisherConfig {
    pub endpoint: Attach,
    /// Always bound (vLLM binds the replay socket whatever its form).
    pub replay: Option<String>,
    pub buffer_steps: usize,
    pub max_queue_size: usize,
    pub topic: String,
    pub data_parallel_rank: i64,
}

/// Counters of the publisher (shared by the sink and the thread).
#[derive(Debug, Default)]
pub struct PublisherStats {
    /// Batches handed to the sink (= the next sequence number).
    pub batches: AtomicU64,
    /// Events in those batches.
    pub events: AtomicU64,
    /// Batches dropped because the queue was full (their numbers skipped).
    pub dropped: AtomicU64,
    /// Batches sent on the PUB socket.
    pub published: AtomicU64,
    /// Replay requests answered.
    pub replays: AtomicU64,
}

/// One batch on its way to the publisher thread.
struct Queued {
    seq: u64,
    ts: f64,
    events: Vec<KvEvent>,
}

/// The engine-side end: see the module docs.
pub struct ZmqSink {
    tx: mpsc::Sender<Queued>,
    next_seq: u64,
    stats: Arc<PublisherStats>,
}

impl ZmqSink {
    pub fn stats(&self) -> Arc<PublisherStats> {
        Arc::clone(&self.stats)
    }
}

impl KvEventSink for ZmqSink {
    fn publish(&mut self, events: Vec<KvEvent>) {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.stats.batches.fetch_add(1, Ordering::Relaxed);
        self.stats
            .events
            .fetch_add(events.len() as u64, Ordering::Relaxed);
        let ts = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        if let Err(e) = self.tx.try_send(Queued { seq, ts, events }) {
            let dropped = self.stats.dropped.fetch_add(1, Ordering::Relaxed) + 1;
            // Log the 1st, 2nd, 4th, 8th, ... drop: visible, never a flood.
            if dropped.is_power_of_two() {
                let why = match e {
                    mpsc::error::TrySendError::Full(_) => "the queue is full",
                    mpsc::error::TrySendError::Closed(_) => "the publisher thread stopped",
                };
                tracing::warn!(
                    seq,
                    dropped_total = dropped,
                    "KV events: batch dropped ({why}); subscribers will see a gap"
                );
            }
        }
    }
}

/// Starts the publisher thread; returns once its sockets are bound (or
/// with the error naming the endpoint that could not be).
pub fn start(cfg: PublisherConfig) -> anyhow::Result<ZmqSink> {
    let (tx, rx) = mpsc::channel(cfg.max_queue_size.max(1));
    let stats = Arc::new(PublisherStats::default());
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<anyhow::Result<()>>();
    let thread_stats = Arc::clone(&stats);
    std::thread::Builder::new()
        .name("kv-events".into())
        .spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    let _ = ready_tx.send(Err(e.into()));
                    return;
                }
            };
            rt.block_on(async move {
                let sockets = match open(&cfg).await {
                    Ok(s) => {
                        let _ = ready_tx.send(Ok(()));
                        s
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                run(sockets, &cfg, rx, &thread_stats).await;
            });
        })
        .context("spawning the KV events thread")?;
    ready_rx
        .recv()
        .context("the KV events thread stopped before it was ready")??;
    Ok(ZmqSink {
        tx,
        next_seq: 0,
        stats,
    })
}

struct Sockets {
    publ: PubSocket,
    /// Set in connect mode: the collector to connect to once running.
    connect: Option<String>,
    router: Option<RouterSocket>,
}

/// A std listener bound to `addr` (`host:port`, `*` for every interface),
/// so that a bind error is reported here, synchronously, with its address.
fn listen(addr: &str, field: &str) -> anyhow::Result<std::net::TcpListener> {
    let host_port = addr.replacen('*', "0.0.0.0", 1);
    std::net::TcpListener::bind(host_port.as_str())
        .with_context(|| format!("--kv-events-config: `{field}` tcp://{addr} cannot be bound"))
}

async fn open(cfg: &PublisherConfig) -> anyhow::Result<Sockets> {
    let mut publ = PubSocket::new();
    let mut connect = None;
    match &cfg.endpoint {
        Attach::Bind(addr) => {
            let l = listen(addr, "endpoint")?;
            let bound = publ
                .bind_listener(l)
                .await
                .with_context(|| format!("--kv-events-config: `endpoint` tcp://{addr}"))?;
            tracing::info!(endpoint = %bound, "KV events: publishing");
        }
        Attach::Connect(ep) => connect = Some(ep.clone()),
    }
    let router = match &cfg.replay {
        Some(addr) => {
            let l = listen(addr, "replay_endpoint")?;
            let mut r = RouterSocket::new();
            let bound = r
                .bind_listener(l)
                .await
                .with_context(|| format!("--kv-events-config: `replay_endpoint` tcp://{addr}"))?;
            tracing::info!(endpoint = %bound, "KV events: replay socket");
            Some(r)
        }
        None => None,
    };
    Ok(Sockets {
        publ,
        connect,
        router,
    })
}

/// The next replay request, or never when there is no replay socket.
async fn next_request(router: &mut Option<RouterSocket>) -> zeromq::ZmqResult<ZmqMessage> {
    match router {
        Some(r) => r.recv().await,
        None => std::future::pending().await,
    }
}

enum Wake {
    Batch(Option<Queued>),
    Replay(zeromq::ZmqResult<ZmqMessage>),
}

async fn run(
    sockets: Sockets,
    cfg: &PublisherConfig,
    mut rx: mpsc::Receiver<Queued>,
    stats: &PublisherStats,
) {
    let Sockets {
        mut publ,
        connect,
        mut router,
    } = sockets;
    if let Some(ep) = connect {
        // zeromq-rs connects once (retrying until it works); batches wait in
        // the queue meanwhile, and are dropped if it fills.
        match publ.connect(&ep).await {
            Ok(()) => tracing::info!(endpoint = %ep, "KV events: publishing (connected)"),
            Err(e) => tracing::error!(endpoint = %ep, error = %e, "KV events: cannot connect"),
        }
    }
    let topic = Bytes::from(cfg.topic.clone().into_bytes());
    let mut ring: VecDeque<(u64, Bytes)> = VecDeque::new();
    loop {
        let wake = tokio::select! {
            q = rx.recv() => Wake::Batch(q),
            r = next_request(&mut router) => Wake::Replay(r),
        };
        match wake {
            Wake::Batch(None) => break,
            Wake::Batch(Some(q)) => {
                let payload = Bytes::from(wire::encode_batch(
                    q.ts,
                    &q.events,
                    Some(cfg.data_parallel_rank),
                ));
                let seq = Bytes::copy_from_slice(&q.seq.to_be_bytes());
                let frames = vec![topic.clone(), seq, payload.clone()];
                let sent = match ZmqMessage::try_from(frames) {
                    Ok(msg) => publ.send(msg).await.map_err(|e| e.to_string()),
                    Err(e) => Err(e.to_string()),
                };
                match sent {
                    Ok(()) => {
                        stats.published.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => tracing::warn!(seq = q.seq, error = %e, "KV events: send failed"),
                }
                if cfg.buffer_steps > 0 {
                    if ring.len() == cfg.buffer_steps {
                        ring.pop_front();
                    }
                    ring.push_back((q.seq, payload));
                }
            }
            Wake::Replay(Err(e)) => {
                tracing::warn!(error = %e, "KV events: replay socket error");
            }
            Wake::Replay(Ok(req)) => {
                if let Some(r) = router.as_mut() {
                    replay(r, req, &ring).await;
                    stats.replays.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }
    // Give the socket's writer tasks a moment to flush the last batches.
    tokio::time::sleep(Duration::from_millis(200)).await;
}

/// Parses a replay request's start number: 1 to 8 bytes, big-endian.
fn start_seq(frame: &[u8]) -> Option<u64> {
    if frame.is_empty() || frame.len() > 8 {
        return None;
    }
    Some(frame.iter().fold(0u64, |acc, &b| (acc << 8) | u64::from(b)))
}

async fn replay(router: &mut RouterSocket, req: ZmqMessage, ring: &VecDeque<(u64, Bytes)>) {
    let frames = req.into_vec();
    let [identity, _empty, start] = frames.as_slice() else {
        tracing::warn!(frames = frames.len(), "KV events: invalid replay request");
        return;
    };
    let Some(from) = start_seq(start) else {
        tracing::warn!(
            bytes = start.len(),
            "KV events: invalid replay start number"
        );
        return;
    };
    let replies = ring
        .iter()
        .filter(|(seq, _)| *seq >= from)
        .map(|(seq, payload)| (Bytes::copy_from_slice(&seq.to_be_bytes()), payload.clone()))
        .chain(std::iter::once((
            Bytes::from_static(&END_SEQ),
            Bytes::new(),
        )));
    for (seq, payload) in replies {
        let frames = vec![identity.clone(), Bytes::new(), seq, payload];
        let res = match ZmqMessage::try_from(frames) {
            Ok(msg) => router.send(msg).await.map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        if let Err(e) = res {
            tracing::warn!(error = %e, "KV events: replay send failed");
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_numbers_are_big_endian() {
        assert_eq!(start_seq(&7u64.to_be_bytes()), Some(7));
        assert_eq!(start_seq(&[1, 0]), Some(256));
        assert_eq!(start_seq(&[]), None);
        assert_eq!(start_seq(&[0; 9]), None);
        assert_eq!(END_SEQ, [0xff; 8]);
    }

    /// A full queue drops the batch, counts it, and skips its number.
    #[test]
    fn a_full_queue_drops_and_the_numbers_show_the_gap() {
        let (tx, mut rx) = mpsc::channel(2);
        let stats = Arc::new(PublisherStats::default());
        let mut sink = ZmqSink {
            tx,
            next_seq: 0,
            stats: Arc::clone(&stats),
        };
        for _ in 0..5 {
            sink.publish(vec![KvEvent::AllBlocksCleared]);
        }
        assert_eq!(stats.dropped.load(Ordering::Relaxed), 3);
        assert_eq!(stats.batches.load(Ordering::Relaxed), 5);
        let seqs: Vec<u64> = std::iter::from_fn(|| rx.try_recv().ok().map(|q| q.seq)).collect();
        assert_eq!(seqs, vec![0, 1]);
        sink.publish(vec![KvEvent::AllBlocksCleared]);
        assert_eq!(rx.try_recv().map(|q| q.seq).ok(), Some(5));
        drop(rx);
        sink.publish(vec![KvEvent::AllBlocksCleared]);
        assert_eq!(
            stats.dropped.load(Ordering::Relaxed),
            4,
            "a stopped thread counts too"
        );
    }
}
