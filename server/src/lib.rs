//! The server: CLI, OpenAI-compatible HTTP API with SSE streaming, and
//! Prometheus metrics, over the engine.
//!
//! Invariant: this is the only crate that knows HTTP and JSON. Requests are
//! parsed ([`protocol`]) and validated ([`validate`]) once at the edge; the
//! engine is reached only through the [`backend::Backend`] trait, whose real
//! implementation is [`engine_backend::EngineBackend`]; errors become HTTP
//! in one place ([`error::ApiError`] via [`http::error_response`]).

pub mod app;
pub mod backend;
pub mod cli;
pub mod cors;
pub mod detok;
pub mod engine_backend;
pub mod error;
pub mod generate;
pub mod http;
pub mod kv_events;
pub mod lora;
pub mod metrics;
pub mod protocol;
pub mod response;
pub mod spec_config;
pub mod structured;
pub mod tokenize;
pub mod tp;
pub mod tp_front;
pub mod validate;
