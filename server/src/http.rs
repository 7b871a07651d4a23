//! HTTP: hyper 1 connections on a tokio listener, routing, auth, body
//! limits, and the endpoint handlers. Every failure goes through
//! [`error_response`], the one place an [`ApiError`] becomes a response.
//!
//! Routes ([`ROUTES`]): `POST /v1/completions`, `POST /v1/chat/completions`,
//! `GET /v1/models`, `GET /health`, `GET /metrics`, `POST /tokenize`,
//! `POST /detokenize`; CORS preflights when CORS is on ([`crate::cors`]). A known path with the
//! wrong method is 405 (with `Allow`), an unknown path 404.
//!
//! Invariants: the body is read at most `max_body_bytes` (413 beyond);
//! with an API key set, every route but `/health` checks it before reading
//! the body; a streaming response's generation lives in a task that ends
//! (dropping, hence aborting, its engine streams) as soon as the client is
//! gone.

use crate::backend::Backend;
use crate::cors::Cors;
use crate::error::ApiError;
use crate::generate::Generation;
use crate::metrics::Metrics;
use crate::protocol::{ChatRequest, CompletionRequest};
use crate::response::{self, ResponseMeta};
use crate::tokenize;
use crate::validate::{self, GenerateRequest, ValidationContext};
use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Body as _, Frame, Incoming};
use hyper::header::{HeaderValue, ALLOW, AUTHORIZATION, CONTENT_TYPE};
use hyper::http::request::Parts;
use hyper::{Method, Request, Response, StatusCode};
use model_loader::{ChatTemplate, Tokenizer};
use std::convert::Infallible;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;

/// Response body type.
pub type Body = UnsyncBoxBody<Bytes, Infallible>;

/// Default body limit: 4 MiB, ample for long prompts and batches.
pub const DEFAULT_MAX_BODY_BYTES: usize = 4 << 20;

/// Everything the handlers share.
pub struct AppState {
    pub backend: Arc<dyn Backend>,
    pub tokenizer: Arc<Tokenizer>,
    pub chat_template: Option<ChatTemplate>,
    pub served_model_name: String,
    pub api_key: Option<String>,
    pub max_body_bytes: usize,
    /// CORS policy; `None`: off.
    pub cors: Option<Cors>,
    pub metrics: Arc<Metrics>,
    pub started: u64,
    /// Grammar compiler for structured outputs (built on first use).
    pub grammars: crate::structured::GrammarCache,
    next_id: AtomicU64,
    /// Sampling defaults for fields a request leaves out
    /// (`--generation-config`; none unless startup sets them).
    pub generation_defaults: model_loader::GenerationDefaults,
    /// The served LoRA adapters (`--enable-lora`; `None`: off).
    pub loras: Option<Arc<crate::lora::LoraRegistry>>,
    /// vLLM's `VLLM_ALLOW_RUNTIME_LORA_UPDATING`: the load/unload routes exist.
    pub runtime_lora_updating: bool,
}

impl AppState {
    pub fn new(
        backend: Arc<dyn Backend>,
        tokenizer: Arc<Tokenizer>,
        chat_template: Option<ChatTemplate>,
        served_model_name: String,
        api_key: Option<String>,
    ) -> Self {
        Self {
            backend,
            tokenizer,
            chat_template,
            served_model_name,
            api_key,
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            cors: None,
            metrics: Arc::new(Metrics::default()),
            started: Generation::created_secs(),
            grammars: Default::default(),
            next_id: AtomicU64::new(0),
            generation_defaults: Default::default(),
            loras: None,
            runtime_lora_updating: false,
        }
    }

    fn validation(&self) -> ValidationContext<'_> {
        ValidationContext {
            served_model_name: &self.served_model_name,
            tokenizer: &self.tokenizer,
            chat_template: self.chat_template.as_ref(),
            limits: self.backend.limits(),
            grammars: &self.grammars,
            defaults: self.generation_defaults,
            loras: self.loras.as_deref(),
        }
    }
}

fn full(status: StatusCode, content_type: &'static str, body: impl Into<Bytes>) -> Response<Body> {
    let mut r = Response::new(Full::new(body.into()).boxed_unsync());
    *r.status_mut() = status;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}

fn json_response(v: &serde_json::Value) -> Response<Body> {
    full(StatusCode::OK, "application/json", v.to_string())
}

/// The one mapping of [`ApiError`] to a response.
pub fn error_response(e: &ApiError) -> Response<Body> {
    let mut r = full(e.status(), "application/json", e.to_body());
    if let ApiError::MethodNotAllowed { path, .. } = e {
        let allow = match ROUTES.iter().find(|(p, ..)| p == path) {
            Some((_, m, _)) if *m == Method::POST => "POST",
            _ => "GET, HEAD",
        };
        r.headers_mut()
            .insert(ALLOW, HeaderValue::from_static(allow));
    }
    r
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Route {
    Completions,
    Chat,
    Models,
    Health,
    Metrics,
    Tokenize,
    Detokenize,
    LoadLora,
    UnloadLora,
}

/// Every route: path, method (GET also answers HEAD), handler.
const ROUTES: [(&str, Method, Route); 9] = [
    ("/v1/completions", Method::POST, Route::Completions),
    ("/v1/chat/completions", Method::POST, Route::Chat),
    ("/v1/models", Method::GET, Route::Models),
    ("/health", Method::GET, Route::Health),
    ("/metrics", Method::GET, Route::Metrics),
    ("/tokenize", Method::POST, Route::Tokenize),
    ("/detokenize", Method::POST, Route::Detokenize),
    ("/v1/load_lora_adapter", Method::POST, Route::LoadLora),
    ("/v1/unload_lora_adapter", Method::POST, Route::UnloadLora),
];

fn route(method: &Method, path: &str) -> Result<Route, ApiError> {
    let Some((_, want, r)) = ROUTES.iter().find(|(p, ..)| *p == path) else {
        return Err(ApiError::NotFound(path.to_string()));
    };
    if method == want || (*method == Method::HEAD && *want == Method::GET) {
        Ok(*r)
    } else {
        Err(ApiError::MethodNotAllowed {
            method: method.to_string(),
            path: path.to_string(),
        })
    }
}

fn check_auth(state: &AppState, req: &Parts) -> Result<(), ApiError> {
    let Some(key) = &state.api_key else {
        return Ok(());
    };
    let given = req
        .headers
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    match given {
        Some(g) if constant_time_eq(g.trim().as_bytes(), key.as_bytes()) => Ok(()),
        _ => Err(ApiError::Unauthorized),
    }
}

/// Compares a presented token with the key in time that depends only on the
/// token's length, never on where the first differing byte is (the key's
/// length may show; its content does not).
pub fn constant_time_eq(given: &[u8], key: &[u8]) -> bool {
    let mut diff = u8::from(given.len() != key.len());
    for (i, &g) in given.iter().enumerate() {
        let k = if key.is_empty() {
            0
        } else {
            key[i % key.len()]
        };
        diff |= std::hint::black_box(g ^ k);
    }
    std::hint::black_box(diff) == 0
}

async fn read_body(
    state: &AppState,
    req: &Parts,
    slot: &mut Option<Incoming>,
) -> Result<Bytes, ApiError> {
    let limit = state.max_body_bytes;
    let declared = req
        .headers
        .get(hyper::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|n| n > limit) {
        return Err(ApiError::PayloadTooLarge { limit });
    }
    if let Some(ct) = req.headers.get(CONTENT_TYPE).and_then(|v| v.to_str().ok()) {
        if !ct.to_ascii_lowercase().starts_with("application/json") {
            return Err(ApiError::UnsupportedMediaType);
        }
    }
    let Some(mut body) = slot.take() else {
        return Err(ApiError::Internal("the body was read twice".into()));
    };
    let mut buf = Vec::with_capacity(declared.unwrap_or(0));
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| ApiError::BodyRead(std::sync::Arc::new(e)))?;
        if let Ok(data) = frame.into_data() {
            if buf.len() + data.len() > limit {
                // Left for `handle` to drain after the answer.
                *slot = Some(body);
                return Err(ApiError::PayloadTooLarge { limit });
            }
            buf.extend_from_slice(&data);
        }
    }
    Ok(Bytes::from(buf))
}

/// Most bytes of an unread request body (refused with 413, 401, 415, ...)
/// read and discarded after the answer, so that a client that sends its
/// whole body before reading still gets the answer instead of a reset.
pub const DRAIN_MAX_BYTES: usize = 128 << 20;
/// Longest time spent draining one refused body.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

/// Reads and discards what is left of `body` (at most [`DRAIN_MAX_BYTES`]
/// within [`DRAIN_TIMEOUT`]) while the connection writes the answer; the
/// connection closes once this ends.
fn drain_in_background(mut body: Incoming) {
    tokio::spawn(async move {
        let drain = async {
            let mut n = 0usize;
            while let Some(Ok(frame)) = body.frame().await {
                if let Some(d) = frame.data_ref() {
                    n += d.len();
                    if n > DRAIN_MAX_BYTES {
                        break;
                    }
                }
            }
        };
        let _ = tokio::time::timeout(DRAIN_TIMEOUT, drain).await;
    });
}

fn parse<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::EmptyBody);
    }
    serde_json::from_slice(body).map_err(ApiError::from_json)
}

/// Serves one request; never fails (errors become responses). A body the
/// handler left unread is drained after the answer ([`drain_in_background`]).
pub async fn handle(
    state: Arc<AppState>,
    req: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    let (parts, body) = req.into_parts();
    if let Some(r) = preflight(&state, &parts) {
        return Ok(r);
    }
    let mut body = Some(body);
    let result = dispatch(&state, &parts, &mut body).await;
    if let Some(b) = body.take() {
        if !b.is_end_stream() {
            drain_in_background(b);
        }
    }
    let mut response = match result {
        Ok(r) => r,
        Err(e) => {
            if e.status().is_server_error() {
                tracing::error!(error = %e, "request failed");
            } else {
                tracing::debug!(error = %e, "request refused");
            }
            error_response(&e)
        }
    };
    if let Some(cors) = &state.cors {
        if let Some(origin) = cors.allowed_origin(&parts.headers) {
            cors.decorate(origin, response.headers_mut());
        }
    }
    Ok(response)
}

/// A CORS preflight's answer (before routing and authentication), when CORS
/// is on and `req` is one.
fn preflight(state: &AppState, req: &Parts) -> Option<Response<Body>> {
    if req.method != Method::OPTIONS {
        return None;
    }
    match state.cors.as_ref()?.preflight(&req.headers)? {
        Ok(headers) => {
            let mut r = full(StatusCode::OK, "text/plain", "OK");
            r.headers_mut().extend(headers);
            Some(r)
        }
        Err(reason) => Some(full(StatusCode::BAD_REQUEST, "text/plain", reason)),
    }
}

async fn dispatch(
    state: &Arc<AppState>,
    req: &Parts,
    body: &mut Option<Incoming>,
) -> Result<Response<Body>, ApiError> {
    let r = route(&req.method, req.uri.path())?;
    if r != Route::Health {
        check_auth(state, req)?;
    }
    match r {
        Route::Health => Ok(full(StatusCode::OK, "text/plain", "")),
        Route::Models => {
            let mut v = response::models(
                &state.served_model_name,
                state.started,
                state.backend.limits().max_model_len,
            );
            if let (Some(l), Some(data)) = (&state.loras, v["data"].as_array_mut()) {
                data.extend(crate::lora::model_cards(l, state.started));
            }
            Ok(json_response(&v))
        }
        Route::LoadLora | Route::UnloadLora => {
            let (Some(loras), true) = (&state.loras, state.runtime_lora_updating) else {
                return Err(ApiError::NotFound(req.uri.path().to_string()));
            };
            let body = read_body(state, req, body).await?;
            let msg = if r == Route::LoadLora {
                let wire: crate::lora::LoadLoraRequest = parse(&body)?;
                let loras = Arc::clone(loras);
                tokio::task::spawn_blocking(move || crate::lora::load(&loras, &wire))
                    .await
                    .map_err(|e| ApiError::Internal(format!("adapter loading task: {e}")))??
            } else {
                let wire: crate::lora::UnloadLoraRequest = parse(&body)?;
                crate::lora::unload(loras, &wire)?
            };
            Ok(full(StatusCode::OK, "text/plain; charset=utf-8", msg))
        }
        Route::Metrics => Ok(full(
            StatusCode::OK,
            "text/plain; version=0.0.4",
            state
                .metrics
                .render(&state.backend.stats(), &state.served_model_name)
                + &crate::lora::metric(state),
        )),
        Route::Completions => {
            let body = read_body(state, req, body).await?;
            let wire: CompletionRequest = parse(&body)?;
            let typed = validate::completion(&state.validation(), &wire)?;
            generate(state, typed, "cmpl").await
        }
        Route::Chat => {
            let body = read_body(state, req, body).await?;
            let wire: ChatRequest = parse(&body)?;
            let typed = validate::chat(&state.validation(), &wire)?;
            generate(state, typed, "chatcmpl").await
        }
        Route::Tokenize => {
            let body = read_body(state, req, body).await?;
            let wire = tokenize::parse_tokenize(&body)?;
            Ok(json_response(&tokenize::tokenize(
                &state.validation(),
                &wire,
            )?))
        }
        Route::Detokenize => {
            let body = read_body(state, req, body).await?;
            let wire: tokenize::DetokenizeRequest = parse(&body)?;
            Ok(json_response(&tokenize::detokenize(
                &state.validation(),
                &wire,
            )?))
        }
    }
}

async fn generate(
    state: &Arc<AppState>,
    req: GenerateRequest,
    prefix: &str,
) -> Result<Response<Body>, ApiError> {
    let meta = ResponseMeta {
        id: format!("{prefix}-{}", state.next_id.fetch_add(1, Ordering::Relaxed)),
        created: Generation::created_secs(),
        model: req.model.clone(),
        endpoint: req.endpoint,
    };
    let stream = req.stream;
    let mut g = Generation::start(
        state.backend.as_ref(),
        req,
        Arc::clone(&state.tokenizer),
        Arc::clone(&state.metrics),
    )?;
    if !stream {
        g.run_to_end().await?;
        return Ok(json_response(&response::full_response(&meta, &g)));
    }
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(64);
    tokio::spawn(stream_task(meta, g, tx));
    let body = StreamBody::new(futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|b| (Ok::<_, Infallible>(Frame::data(b)), rx))
    }));
    let mut r = Response::new(body.boxed_unsync());
    let h = r.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    h.insert("cache-control", HeaderValue::from_static("no-cache"));
    Ok(r)
}

/// Produces the SSE events of one request. Returns (dropping the
/// generation, hence aborting its engine requests) when the client is gone.
async fn stream_task(meta: ResponseMeta, mut g: Generation, tx: tokio::sync::mpsc::Sender<Bytes>) {
    for i in 0..g.choices.len() {
        if let Some(c) = response::opening_chunk(&meta, &g, i) {
            if tx.send(response::sse(&c)).await.is_err() {
                return;
            }
        }
    }
    let mut offsets = vec![0usize; g.choices.len()];
    let mut echo_pending = vec![response::echo_waits_for_output(&g); g.choices.len()];
    loop {
        let item = tokio::select! {
            item = g.next() => item,
            _ = tx.closed() => return,
        };
        match item {
            None => break,
            Some(Ok(deltas)) => {
                for d in deltas {
                    let c = if echo_pending[d.index] {
                        echo_pending[d.index] = false;
                        let (c, len) = response::echo_and_delta_chunk(&meta, &g, &d);
                        offsets[d.index] = len;
                        c
                    } else {
                        let c = response::delta_chunk(&meta, &g, &d, offsets[d.index]);
                        offsets[d.index] += d.text.len();
                        c
                    };
                    if tx.send(response::sse(&c)).await.is_err() {
                        return;
                    }
                }
            }
            Some(Err(e)) => {
                let _ = tx.send(response::sse_error(&e.to_body())).await;
                break;
            }
        }
    }
    if g.req.include_usage {
        let _ = tx
            .send(response::sse(&response::usage_chunk(&meta, &g)))
            .await;
    }
    let _ = tx.send(Bytes::from_static(response::SSE_DONE)).await;
}

/// Accepts connections until `shutdown` resolves, then waits (at most
/// `grace`) for open connections to finish.
pub async fn serve(
    listener: TcpListener,
    state: Arc<AppState>,
    shutdown: impl Future<Output = ()>,
    grace: Duration,
) -> std::io::Result<()> {
    let handler = move |req| handle(Arc::clone(&state), req);
    serve_with(listener, handler, shutdown, grace).await
}

/// [`serve`]'s connection loop around any request handler (the
/// tensor-parallel front's forwarding: `crate::tp_front`).
pub async fn serve_with<H, F>(
    listener: TcpListener,
    handler: H,
    shutdown: impl Future<Output = ()>,
    grace: Duration,
) -> std::io::Result<()>
where
    H: Fn(Request<Incoming>) -> F + Clone + Send + 'static,
    F: Future<Output = Result<Response<Body>, Infallible>> + Send + 'static,
{
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut builder = hyper::server::conn::http1::Builder::new();
    // Slow or idle clients cannot hold a connection open without headers.
    builder
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(Duration::from_secs(30));
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, _) = match accepted {
                    Ok(s) => s,
                    Err(e) => {
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                let svc = hyper::service::service_fn(handler.clone());
                let conn = builder.serve_connection(hyper_util::rt::TokioIo::new(stream), svc);
                let conn = graceful.watch(conn);
                tokio::spawn(async move {
                    if let Err(e) = conn.await {
                        tracing::debug!(error = %e, "connection ended with an error");
                    }
                });
            }
            () = &mut shutdown => break,
        }
    }
    drop(listener);
    tokio::select! {
        () = graceful.shutdown() => tracing::info!("all connections closed"),
        () = tokio::time::sleep(grace) => tracing::warn!("grace period over; closing open connections"),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::constant_time_eq;

    #[test]
    fn constant_time_eq_is_equality() {
        assert!(constant_time_eq(b"secret-key", b"secret-key"));
        for other in [
            &b"secret-kez"[..],
            b"secret-ke",
            b"secret-keyy",
            b"",
            b"Secret-key",
        ] {
            assert!(!constant_time_eq(other, b"secret-key"), "{other:?}");
        }
        assert!(constant_time_eq(b"", b""));
        assert!(!constant_time_eq(b"x", b""));
    }
}
