//! The server's one error type, and the one place it becomes HTTP: status
//! code plus OpenAI's body `{"error": {"message", "type", "param", "code"}}`.
//!
//! Invariant: every handler failure is an [`ApiError`]; [`ApiError::status`]
//! and [`ApiError::to_body`] are the only mapping to HTTP.

use engine::error::{EngineError, Report, RequestError};
use hyper::StatusCode;
use serde::Serialize;
use std::sync::Arc;
use thiserror::Error;

/// Everything a request can fail with.
#[derive(Debug, Clone, Error)]
pub enum ApiError {
    /// The body is not JSON (syntax, end of input).
    #[error("Malformed JSON body: {0}")]
    BadJson(Arc<serde_json::Error>),
    /// The body is empty.
    #[error("The request body is empty")]
    EmptyBody,
    /// The body could not be read from the connection.
    #[error("Cannot read the body: {0}")]
    BodyRead(Arc<hyper::Error>),
    /// A field has a value of the wrong type (serde's "invalid type").
    #[error("Invalid request body: {0}")]
    WrongType(Arc<serde_json::Error>),
    /// A field is missing or unknown, or its value does not fit its type.
    #[error("Invalid request body: {0}")]
    BadField(Arc<serde_json::Error>),
    /// A value is out of range or inconsistent with another one.
    #[error("{message}")]
    InvalidValue {
        message: String,
        param: Option<String>,
    },
    /// The prompt (plus max_tokens) does not fit the model's context.
    #[error("{0}")]
    ContextTooLong(String),
    /// The `model` field names no served model.
    #[error("The model `{0}` does not exist.")]
    ModelNotFound(String),
    /// The path is unknown.
    #[error("Not found: {0}")]
    NotFound(String),
    /// `/v1/unload_lora_adapter` names no loaded adapter (vLLM's message).
    #[error("The lora adapter '{0}' cannot be found.")]
    LoraNotFound(String),
    /// `/v1/load_lora_adapter` names an adapter already loaded (vLLM's message).
    #[error("The lora adapter '{0}' has already been loaded.")]
    LoraAlreadyLoaded(String),
    /// The adapter's files are missing or not an adapter for the base model.
    #[error("Failed to load LoRA adapter '{name}': {reason}")]
    LoraInvalid { name: String, reason: String },
    /// The path exists with other methods.
    #[error("Method {method} not allowed for {path}")]
    MethodNotAllowed { method: String, path: String },
    /// The body is larger than the limit.
    #[error("Request body exceeds the limit of {limit} bytes")]
    PayloadTooLarge { limit: usize },
    /// The body's content type is not JSON.
    #[error("Content-Type must be application/json")]
    UnsupportedMediaType,
    /// `--api-key` is set and the request has no or a wrong bearer token.
    #[error("Invalid or missing API key (send `Authorization: Bearer <key>`)")]
    Unauthorized,
    /// Too many requests are waiting.
    #[error("{0}")]
    Overloaded(String),
    /// The server is shutting down.
    #[error("The server is shutting down")]
    ShuttingDown,
    /// The engine cannot take requests (yet, or any more), with why.
    #[error("{0}")]
    Unavailable(String),
    /// The engine failed (its typed chain, printed whole).
    #[error("Internal server error: {}", Report(.0))]
    Engine(EngineError),
    /// The grammar compiler could not be built for this tokenizer.
    #[error("Internal server error: {}", Report(.0))]
    Grammar(engine::grammar::GrammarError),
    /// A broken invariant of the server itself.
    #[error("Internal server error: {0}")]
    Internal(String),
}

#[derive(Serialize)]
struct ErrorBody<'a> {
    error: ErrorDetail<'a>,
}

#[derive(Serialize)]
struct ErrorDetail<'a> {
    message: String,
    #[serde(rename = "type")]
    kind: &'a str,
    param: Option<&'a str>,
    code: Option<u16>,
}

impl ApiError {
    /// A 400 for a bad value of `param`.
    pub fn invalid(param: &str, message: impl Into<String>) -> Self {
        ApiError::InvalidValue {
            message: message.into(),
            param: Some(param.to_string()),
        }
    }

    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::BadJson(_)
            | ApiError::EmptyBody
            | ApiError::BodyRead(_)
            | ApiError::WrongType(_)
            | ApiError::BadField(_)
            | ApiError::InvalidValue { .. }
            | ApiError::ContextTooLong(_)
            | ApiError::LoraAlreadyLoaded(_)
            | ApiError::LoraInvalid { .. } => StatusCode::BAD_REQUEST,
            ApiError::ModelNotFound(_) | ApiError::NotFound(_) | ApiError::LoraNotFound(_) => {
                StatusCode::NOT_FOUND
            }
            ApiError::MethodNotAllowed { .. } => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ApiError::Unauthorized => StatusCode::UNAUTHORIZED,
            ApiError::Overloaded(_) => StatusCode::TOO_MANY_REQUESTS,
            ApiError::ShuttingDown | ApiError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Engine(_) | ApiError::Grammar(_) | ApiError::Internal(_) => {
                StatusCode::INTERNAL_SERVER_ERROR
            }
        }
    }

    /// OpenAI's error `type`.
    fn kind(&self) -> &'static str {
        match self {
            ApiError::ModelNotFound(_) | ApiError::NotFound(_) | ApiError::LoraNotFound(_) => {
                "NotFoundError"
            }
            ApiError::Unauthorized => "AuthenticationError",
            ApiError::Overloaded(_) => "RateLimitError",
            ApiError::ShuttingDown | ApiError::Unavailable(_) => "ServiceUnavailableError",
            ApiError::Engine(_) | ApiError::Grammar(_) | ApiError::Internal(_) => {
                "InternalServerError"
            }
            ApiError::PayloadTooLarge { .. } => "RequestTooLargeError",
            ApiError::MethodNotAllowed { .. } => "MethodNotAllowedError",
            _ => "BadRequestError",
        }
    }

    fn param(&self) -> Option<&str> {
        match self {
            ApiError::InvalidValue { param, .. } => param.as_deref(),
            ApiError::ModelNotFound(_) => Some("model"),
            ApiError::ContextTooLong(_) => Some("messages_or_prompt"),
            _ => None,
        }
    }

    /// The JSON body.
    pub fn to_body(&self) -> String {
        let body = ErrorBody {
            error: ErrorDetail {
                message: self.to_string(),
                kind: self.kind(),
                param: self.param(),
                code: Some(self.status().as_u16()),
            },
        };
        serde_json::to_string(&body).unwrap_or_else(|_| {
            r#"{"error":{"message":"error","type":"InternalServerError","param":null,"code":500}}"#
                .to_string()
        })
    }

    /// Maps a serde_json failure: syntax/EOF, wrong type (`"messages":
    /// "hi"`), missing/unknown field or bad value -> 400, as OpenAI and
    /// vLLM answer.
    pub fn from_json(e: serde_json::Error) -> Self {
        use serde_json::error::Category;
        let wrong_type = e.to_string().starts_with("invalid type");
        match e.classify() {
            Category::Data if wrong_type => ApiError::WrongType(Arc::new(e)),
            Category::Data => ApiError::BadField(Arc::new(e)),
            _ => ApiError::BadJson(Arc::new(e)),
        }
    }
}

/// The one mapping of the engine's errors to HTTP. No wildcard arm: a new
/// engine error variant does not compile until it is given a status here.
/// 5xx bodies carry the whole typed chain (`executor failure: GPU
/// executor: cuLaunchKernel failed: ...`).
impl From<EngineError> for ApiError {
    fn from(e: EngineError) -> Self {
        match e {
            EngineError::Request(r) => match r {
                RequestError::ContextTooLong { .. } => ApiError::ContextTooLong(r.to_string()),
                RequestError::InvalidParam { param, .. } => ApiError::invalid(param, r.to_string()),
                RequestError::EmptyPrompt
                | RequestError::NeverFits { .. }
                | RequestError::DuplicateRequest(_) => ApiError::InvalidValue {
                    message: r.to_string(),
                    param: r.param().map(str::to_string),
                },
            },
            EngineError::Overloaded { .. } => ApiError::Overloaded(e.to_string()),
            EngineError::ShutDown => ApiError::ShuttingDown,
            EngineError::InvalidConfig(_)
            | EngineError::Thread { .. }
            | EngineError::Kv(_)
            | EngineError::Executor(_)
            | EngineError::Inconsistent(_) => {
                tracing::error!(error = %Report(&e), "engine failure");
                ApiError::Engine(e)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn body_has_openai_shape() {
        let e = ApiError::invalid("temperature", "temperature must be in [0, 2]");
        assert_eq!(e.status(), StatusCode::BAD_REQUEST);
        let v: serde_json::Value = serde_json::from_str(&e.to_body()).expect("json");
        assert_eq!(v["error"]["message"], "temperature must be in [0, 2]");
        assert_eq!(v["error"]["type"], "BadRequestError");
        assert_eq!(v["error"]["param"], "temperature");
        assert_eq!(v["error"]["code"], 400);
    }

    #[test]
    fn json_errors_are_classified() {
        let syntax = serde_json::from_str::<serde_json::Value>("{").expect_err("bad");
        assert_eq!(
            ApiError::from_json(syntax).status(),
            StatusCode::BAD_REQUEST
        );
        let wrong = serde_json::from_str::<u32>("\"x\"").expect_err("bad");
        assert_eq!(ApiError::from_json(wrong).status(), StatusCode::BAD_REQUEST);
    }

    #[test]
    fn engine_errors_map_once() {
        let overloaded = EngineError::Overloaded {
            waiting: 3,
            limit: 2,
        };
        assert_eq!(
            ApiError::from(overloaded).status(),
            StatusCode::TOO_MANY_REQUESTS
        );
        assert_eq!(
            ApiError::from(EngineError::ShutDown).status(),
            StatusCode::SERVICE_UNAVAILABLE
        );
        let param = EngineError::from(RequestError::InvalidParam {
            param: "top_k",
            reason: "must be -1 or at least 1".into(),
        });
        let e = ApiError::from(param);
        assert_eq!(e.status(), StatusCode::BAD_REQUEST);
        let v: serde_json::Value = serde_json::from_str(&e.to_body()).expect("json");
        assert_eq!(v["error"]["param"], "top_k");
        assert_eq!(v["error"]["message"], "top_k must be -1 or at least 1");
        // A 5xx names the typed cause under the engine's error.
        let gpu = engine::error::GpuError::Device("double free".into());
        let e = ApiError::from(EngineError::from(gpu));
        assert_eq!(e.status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert!(
            e.to_string()
                .contains("executor failure: GPU executor: device error: double free"),
            "{e}"
        );
    }
}
