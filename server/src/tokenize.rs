//! vLLM's `POST /tokenize` and `POST /detokenize`.
//!
//! `/tokenize` takes either a completion-style `{"prompt", "add_special_tokens"
//! (default true)}` or a chat-style `{"messages", "add_generation_prompt"
//! (default true), "add_special_tokens" (default false)}` body (both with an
//! optional `model` and `return_token_strs`), and answers
//! `{"count", "max_model_len", "tokens", "token_strs"}`. Chat messages are
//! rendered by the same code as chat completions. `/detokenize` takes
//! `{"tokens": [ids]}` and answers `{"prompt": text}` (special tokens kept,
//! as vLLM's decode does); an id outside the vocabulary is a 400.
//!
//! Invariants: a prompt longer than the context is not an error here (the
//! answer carries `max_model_len` for the client to compare); nothing
//! reaches the engine.
//!
//! Cost: one tokenizer pass over the text (or the ids).

use crate::error::ApiError;
use crate::protocol::ChatMessageIn;
use crate::validate::{self, ValidationContext};
use serde::Deserialize;
use serde_json::{json, Value};

/// A `/tokenize` body: the chat form (with `messages`) or the prompt form.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum TokenizeRequest {
    Chat(TokenizeChat),
    Completion(TokenizeCompletion),
}

/// `/tokenize` with a prompt.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenizeCompletion {
    #[serde(default)]
    pub model: Option<String>,
    pub prompt: String,
    #[serde(default)]
    pub add_special_tokens: Option<bool>,
    #[serde(default)]
    pub return_token_strs: Option<bool>,
}

/// `/tokenize` with chat messages.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenizeChat {
    #[serde(default)]
    pub model: Option<String>,
    pub messages: Vec<ChatMessageIn>,
    #[serde(default)]
    pub add_generation_prompt: Option<bool>,
    #[serde(default)]
    pub add_special_tokens: Option<bool>,
    #[serde(default)]
    pub return_token_strs: Option<bool>,
}

/// A `/detokenize` body.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DetokenizeRequest {
    #[serde(default)]
    pub model: Option<String>,
    pub tokens: Vec<i64>,
}

/// Parses a `/tokenize` body; the untagged enum's own error says nothing,
/// so the form is picked by its key and parsed again for serde's message.
pub fn parse_tokenize(body: &[u8]) -> Result<TokenizeRequest, ApiError> {
    let v: Value = serde_json::from_slice(body).map_err(ApiError::from_json)?;
    let chat = v.get("messages").is_some();
    if chat {
        serde_json::from_value(v).map(TokenizeRequest::Chat)
    } else if v.get("prompt").is_some() {
        serde_json::from_value(v).map(TokenizeRequest::Completion)
    } else {
        return Err(ApiError::invalid(
            "prompt",
            "the body needs `prompt` (a string) or `messages` (a list)",
        ));
    }
    .map_err(ApiError::from_json)
}

/// The `/tokenize` answer.
pub fn tokenize(ctx: &ValidationContext<'_>, r: &TokenizeRequest) -> Result<Value, ApiError> {
    let (tokens, strs) = match r {
        TokenizeRequest::Completion(c) => {
            validate::check_model(ctx, &c.model)?;
            let ids = validate::encode(ctx, &c.prompt, c.add_special_tokens.unwrap_or(true))?;
            (ids, c.return_token_strs.unwrap_or(false))
        }
        TokenizeRequest::Chat(c) => {
            validate::check_model(ctx, &c.model)?;
            let text =
                validate::render_chat(ctx, &c.messages, c.add_generation_prompt.unwrap_or(true))?;
            let ids = validate::encode(ctx, &text, c.add_special_tokens.unwrap_or(false))?;
            (ids, c.return_token_strs.unwrap_or(false))
        }
    };
    let token_strs = strs.then(|| {
        tokens
            .iter()
            .map(|&t| ctx.tokenizer.id_to_token(t).unwrap_or_default())
            .collect::<Vec<_>>()
    });
    Ok(json!({
        "count": tokens.len(),
        "max_model_len": ctx.limits.max_model_len,
        "tokens": tokens,
        "token_strs": token_strs,
    }))
}

/// The `/detokenize` answer.
pub fn detokenize(ctx: &ValidationContext<'_>, r: &DetokenizeRequest) -> Result<Value, ApiError> {
    validate::check_model(ctx, &r.model)?;
    let ids = r
        .tokens
        .iter()
        .map(|&t| validate::token_id(ctx, "tokens", t))
        .collect::<Result<Vec<_>, _>>()?;
    let prompt = ctx
        .tokenizer
        .decode(&ids, false)
        .map_err(|e| ApiError::invalid("tokens", engine::error::Report(&e).to_string()))?;
    Ok(json!({ "prompt": prompt }))
}
