//! KV cache events over ZeroMQ, as vLLM publishes them
//! (`--kv-events-config`), so KV-aware routers (llm-d, Dynamo, SGLang's
//! router, the Gateway API Inference Extension) can follow which prefixes
//! this replica holds.
//!
//! - [`KvEventsConfig`]: vLLM's `KVEventsConfig` JSON, its fields, names
//!   and defaults (`enable_kv_cache_events` false, `publisher` "zmq" when
//!   enabled else "null", `endpoint` `tcp://*:5557`, `replay_endpoint`
//!   none, `buffer_steps` 10000, `hwm` 100000, `max_queue_size` 100000,
//!   `topic` ""). Unknown fields, a bad type or an unknown publisher are
//!   errors that name the field, before anything loads.
//! - `wire`: the msgpack payload, byte for byte vLLM's positional
//!   ("array_like") `KVEventBatch`.
//! - `publisher`: the sink the engine loop calls once per step (a
//!   non-blocking push into a bounded queue) and the thread that owns the
//!   PUB and ROUTER (replay) sockets.
//!
//! The engine knows none of this: it records typed `KvEvent`s
//! (`engine::kv`) and hands them to an `engine::kv::KvEventSink`.
//!
//! Which ZeroMQ: the pure-Rust `zeromq` crate (zmq.rs), not the `zmq`
//! bindings. `zmq` needs libzmq: a system package (`libzmq3-dev`) on every
//! developer machine and in CI, or a vendored C++ build of libzmq in every
//! clean build; `zeromq` builds with cargo alone, so `cargo test` works on a
//! fresh machine, and it runs on the tokio the server already has. It speaks
//! ZMTP 3, so libzmq peers (pyzmq, the routers) talk to it: the integration
//! test subscribes with pyzmq. What it lacks, and what that changes:
//! - no `ZMQ_SNDHWM`: its PUB queue per subscriber is fixed at 100,000
//!   messages (vLLM's default `hwm`), beyond which it drops, as libzmq does
//!   at the HWM; another `hwm` is accepted and logged as not applied;
//! - no `inproc://`, and `ipc://` is left out of this build: endpoints must
//!   be `tcp://` (an error otherwise);
//! - `*` is not a host to it: we bind `0.0.0.0` for `tcp://*:PORT`, as
//!   libzmq does;
//! - connect mode (vLLM connects when the endpoint has no `*` or `::`)
//!   connects once, retrying until the collector answers, without libzmq's
//!   reconnect after a drop.
//!
//! Messages: `[topic, seq (8 bytes, big-endian), payload]`; replay as in
//! vLLM (see `publisher`).
//!
//! Block hashes are ours (chained SipHash, `engine::kv::hash_block`), not
//! vLLM's (sha256 over CBOR by default): consistent within this replica's
//! stream and across our replicas, so a router that keys on the published
//! hashes and token ids (Dynamo's does) follows us, but one that recomputes
//! vLLM's hash from a prompt's tokens to look blocks up will not match.
//!
//! Wire format choice: vLLM switched its *events* from arrays to tagged
//! maps in mid-2026 (vllm-project/vllm#42892; the outer batch stays an
//! array). Every router that reads the maps also reads the arrays (they
//! kept the old path for older vLLM), while older consumers read only
//! arrays, so we publish the arrays. `wire::encode_batch` is the one
//! place to change if that stops being true.

pub mod publisher;
pub mod wire;

use serde::Deserialize;

/// vLLM's `KVEventsConfig` (the JSON of `--kv-events-config`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KvEventsConfig {
    /// Record and publish KV cache events.
    #[serde(default)]
    pub enable_kv_cache_events: bool,
    /// `"zmq"` or `"null"`; vLLM's default: "zmq" when enabled, else "null".
    #[serde(default)]
    pub publisher: Option<PublisherKind>,
    /// PUB socket: `tcp://*:PORT` (or with `::`) binds, any other
    /// `tcp://HOST:PORT` connects out.
    #[serde(default = "default_endpoint")]
    pub endpoint: String,
    /// ROUTER socket for replay requests (always bound), e.g. `tcp://*:5558`.
    #[serde(default)]
    pub replay_endpoint: Option<String>,
    /// Batches kept for replay. Range: >= 0 (0: replay answers only the end
    /// marker).
    #[serde(default = "default_buffer_steps")]
    pub buffer_steps: usize,
    /// ZeroMQ high-water mark of the PUB socket. Range: >= 0. Not settable
    /// with zeromq-rs (fixed at 100000, the default); another value is
    /// logged.
    #[serde(default = "default_hwm")]
    pub hwm: usize,
    /// Batches queued between the engine and the publisher thread; a batch
    /// that does not fit is dropped and counted. Range: >= 1.
    #[serde(default = "default_max_queue_size")]
    pub max_queue_size: usize,
    /// First frame of every message (subscribers filter on its prefix).
    #[serde(default)]
    pub topic: String,
}

/// `publisher`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PublisherKind {
    Null,
    Zmq,
}

/// vLLM's `hwm` default, and zeromq-rs's fixed per-subscriber queue.
pub const DEFAULT_HWM: usize = 100_000;

fn default_endpoint() -> String {
    "tcp://*:5557".into()
}
fn default_buffer_steps() -> usize {
    10_000
}
fn default_hwm() -> usize {
    DEFAULT_HWM
}
fn default_max_queue_size() -> usize {
    100_000
}

impl Default for KvEventsConfig {
    fn default() -> Self {
        Self {
            enable_kv_cache_events: false,
            publisher: None,
            endpoint: default_endpoint(),
            replay_endpoint: None,
            buffer_steps: default_buffer_steps(),
            hwm: default_hwm(),
            max_queue_size: default_max_queue_size(),
            topic: String::new(),
        }
    }
}

/// `host:port` of a `tcp://host:port` endpoint, or why not (naming `field`).
fn tcp_address<'a>(field: &str, endpoint: &'a str) -> Result<&'a str, String> {
    let Some(addr) = endpoint.strip_prefix("tcp://") else {
        return Err(format!(
            "`{field}`: `{endpoint}` is not supported: only tcp:// endpoints (e.g. tcp://*:5557)"
        ));
    };
    let port = addr
        .rsplit_once(':')
        .map(|(host, port)| (host, port.parse::<u16>()));
    match port {
        Some((host, Ok(_))) if !host.is_empty() => Ok(addr),
        _ => Err(format!(
            "`{field}`: `{endpoint}` is not tcp://HOST:PORT (port 0..=65535)"
        )),
    }
}

impl KvEventsConfig {
    /// Parses and checks the flag's JSON. Errors name the offending field
    /// (clap puts the flag's name in front).
    pub fn parse(s: &str) -> Result<Self, String> {
        // serde would take a JSON list as the fields in order: refuse it.
        if !s.trim_start().starts_with('{') {
            return Err(format!(
                "expected a JSON object such as {{\"enable_kv_cache_events\": true}}, got `{s}`"
            ));
        }
        let mut de = serde_json::Deserializer::from_str(s);
        let cfg: Self = serde_path_to_error::deserialize(&mut de).map_err(|e| {
            let path = e.path().to_string();
            // `.` is the root, `?` a place serde_path_to_error cannot name.
            if path.is_empty() || path == "." || path == "?" {
                e.inner().to_string()
            } else {
                format!("`{path}`: {}", e.inner())
            }
        })?;
        de.end().map_err(|e| e.to_string())?;
        cfg.check()?;
        Ok(cfg)
    }

    fn check(&self) -> Result<(), String> {
        if self.max_queue_size == 0 {
            return Err("`max_queue_size`: must be >= 1".into());
        }
        tcp_address("endpoint", &self.endpoint)?;
        if let Some(r) = &self.replay_endpoint {
            tcp_address("replay_endpoint", r)?;
        }
        Ok(())
    }

    /// The publisher in effect (vLLM's rule for a missing `publisher`).
    pub fn publisher_kind(&self) -> PublisherKind {
        self.publisher.unwrap_or(if self.enable_kv_cache_events {
            PublisherKind::Zmq
        } else {
            PublisherKind::Null
        })
    }

    /// Whether events are recorded and sent at all (vLLM's factory: a
    /// disabled config, or the null publisher, publishes nothing).
    pub fn active(&self) -> bool {
        self.enable_kv_cache_events && self.publisher_kind() == PublisherKind::Zmq
    }

    /// The publisher's settings (after [`Self::parse`]'s checks).
    pub fn publisher_config(&self) -> Result<publisher::PublisherConfig, String> {
        let addr = tcp_address("endpoint", &self.endpoint)?;
        // vLLM's rule: bind when the endpoint has a wildcard, else connect.
        let endpoint = if self.endpoint.contains('*') || self.endpoint.contains("::") {
            publisher::Attach::Bind(addr.to_string())
        } else {
            publisher::Attach::Connect(self.endpoint.clone())
        };
        let replay = match &self.replay_endpoint {
            Some(r) => Some(tcp_address("replay_endpoint", r)?.to_string()),
            None => None,
        };
        Ok(publisher::PublisherConfig {
            endpoint,
            replay,
            buffer_steps: self.buffer_steps,
            max_queue_size: self.max_queue_size,
            topic: self.topic.clone(),
            data_parallel_rank: 0,
        })
    }
}

/// Starts the publisher when the configuration asks for one; the sink goes
/// to the engine. Fails (naming the field) when a socket cannot be bound.
pub fn start(cfg: &KvEventsConfig) -> anyhow::Result<Option<publisher::ZmqSink>> {
    if !cfg.active() {
        if cfg.enable_kv_cache_events {
            tracing::info!("KV events enabled with the null publisher: nothing is published");
        }
        return Ok(None);
    }
    if cfg.hwm != DEFAULT_HWM {
        tracing::warn!(
            hwm = cfg.hwm,
            "KV events: `hwm` is not applied (zeromq-rs queues {DEFAULT_HWM} messages per subscriber)"
        );
    }
    let pc = cfg
        .publisher_config()
        .map_err(|e| anyhow::anyhow!("--kv-events-config: {e}"))?;
    Ok(Some(publisher::start(pc)?))
}

#[cfg(test)]
mod tests;
