//! Turns wire requests into a typed, validated [`GenerateRequest`], once, at
//! the edge: ranges checked, prompts tokenized (chat template applied),
//! `prompt + max_tokens <= max_model_len` enforced. Nothing past this module
//! re-checks a parameter.
//!
//! Ranges follow OpenAI and vLLM: temperature in [0, 2], top_p in (0, 1],
//! n in [1, 128], best_of >= n, penalties in [-2, 2], repetition_penalty in
//! (0, 2], min_p in [0, 1], top_k -1 (off) or >= 1, logprobs in [0, 20],
//! prompt_logprobs in [0, 20], early_stopping a boolean (vLLM's "never" is
//! refused), at most 4 stop strings (OpenAI's limit), none empty.
//! With `echo` and `logprobs`, the prompt's logprobs are asked for too (as
//! vLLM does), with `max(logprobs, prompt_logprobs)` alternatives.
//! Cost: O(prompt length) for tokenization plus O(number of fields).

use crate::backend::{BackendLimits, SamplingParams};
use crate::error::ApiError;
use crate::protocol::{
    ChatMessageIn, ChatRequest, CommonParams, CompletionRequest, ContentPart, MessageContent,
    PromptInput, StopInput,
};
use model_loader::{ChatMessage, ChatTemplate, Tokenizer};

/// Most prompts in one batch request.
pub const MAX_BATCH_PROMPTS: usize = 256;
/// Most stop strings.
pub const MAX_STOP_STRINGS: usize = 4;
/// Most top logprobs per token.
pub const MAX_LOGPROBS: usize = 20;

/// Which endpoint a request came from (shapes the response).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Completions,
    Chat,
}

/// One prompt, tokenized.
#[derive(Debug, Clone, PartialEq)]
pub struct Prompt {
    /// The prompt as text (decoded from ids when it came as ids).
    pub text: String,
    pub token_ids: Vec<u32>,
}

/// A validated generation request.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerateRequest {
    pub endpoint: Endpoint,
    pub model: String,
    pub prompts: Vec<Prompt>,
    /// Engine parameters; `max_tokens` is resolved per prompt in
    /// [`GenerateRequest::max_tokens_for`].
    pub params: SamplingParams,
    /// `max_tokens` as asked (`None`: fill the context).
    pub max_tokens: Option<usize>,
    pub stop: Vec<String>,
    pub stream: bool,
    pub include_usage: bool,
    pub echo: bool,
    pub return_token_ids: bool,
}

impl GenerateRequest {
    /// The output budget of a prompt of `prompt_len` tokens.
    pub fn max_tokens_for(&self, prompt_len: usize, max_model_len: usize) -> usize {
        self.max_tokens
            .unwrap_or_else(|| max_model_len.saturating_sub(prompt_len))
    }
}

/// What validation needs to know about the served model.
pub struct ValidationContext<'a> {
    pub served_model_name: &'a str,
    pub tokenizer: &'a Tokenizer,
    pub chat_template: Option<&'a ChatTemplate>,
    pub limits: BackendLimits,
}

pub(crate) fn check_model(
    ctx: &ValidationContext<'_>,
    model: &Option<String>,
) -> Result<String, ApiError> {
    match model {
        None => Ok(ctx.served_model_name.to_string()),
        Some(m) if m == ctx.served_model_name => Ok(m.clone()),
        Some(m) => Err(ApiError::ModelNotFound(m.clone())),
    }
}

fn range_f(name: &str, v: Option<f64>, lo: f64, hi: f64, default: f64) -> Result<f32, ApiError> {
    let v = v.unwrap_or(default);
    if !(lo..=hi).contains(&v) {
        return Err(ApiError::invalid(
            name,
            format!("{name} must be in [{lo}, {hi}], got {v}"),
        ));
    }
    Ok(v as f32)
}

fn nonneg(name: &str, v: Option<i64>) -> Result<Option<usize>, ApiError> {
    match v {
        None => Ok(None),
        Some(x) if x < 0 => Err(ApiError::invalid(
            name,
            format!("{name} must be >= 0, got {x}"),
        )),
        Some(x) => Ok(Some(x as usize)),
    }
}

pub(crate) fn token_id(ctx: &ValidationContext<'_>, name: &str, id: i64) -> Result<u32, ApiError> {
    let vocab = ctx.tokenizer.vocab_size();
    if id < 0 || id as u64 >= vocab as u64 {
        return Err(ApiError::invalid(
            name,
            format!("token id {id} is outside the vocabulary [0, {vocab})"),
        ));
    }
    Ok(id as u32)
}

fn stops(stop: &Option<StopInput>) -> Result<Vec<String>, ApiError> {
    let list = match stop {
        None => Vec::new(),
        Some(StopInput::One(s)) => vec![s.clone()],
        Some(StopInput::Many(v)) => v.clone(),
    };
    if list.len() > MAX_STOP_STRINGS {
        return Err(ApiError::invalid(
            "stop",
            format!(
                "at most {MAX_STOP_STRINGS} stop strings, got {}",
                list.len()
            ),
        ));
    }
    if list.iter().any(String::is_empty) {
        return Err(ApiError::invalid("stop", "stop strings must not be empty"));
    }
    Ok(list)
}

/// Parameters common to both endpoints; `logprobs` is endpoint-specific.
fn sampling(
    ctx: &ValidationContext<'_>,
    c: &CommonParams,
    logprobs: Option<usize>,
) -> Result<SamplingParams, ApiError> {
    let n = nonneg("n", c.n)?.unwrap_or(1);
    if !(1..=128).contains(&n) {
        return Err(ApiError::invalid(
            "n",
            format!("n must be in [1, 128], got {n}"),
        ));
    }
    let best_of = nonneg("best_of", c.best_of)?.unwrap_or(n);
    if best_of < n || best_of > 128 {
        return Err(ApiError::invalid(
            "best_of",
            format!("best_of must be >= n ({n}) and <= 128, got {best_of}"),
        ));
    }
    let top_k = match c.top_k {
        None | Some(-1) | Some(0) => None,
        Some(k) if k >= 1 => Some(k as usize),
        Some(k) => {
            return Err(ApiError::invalid(
                "top_k",
                format!("top_k must be -1 or >= 1, got {k}"),
            ))
        }
    };
    let top_p = range_f("top_p", c.top_p, 0.0, 1.0, 1.0)?;
    if top_p <= 0.0 {
        return Err(ApiError::invalid("top_p", "top_p must be in (0, 1]"));
    }
    let repetition_penalty = range_f("repetition_penalty", c.repetition_penalty, 0.0, 2.0, 1.0)?;
    if repetition_penalty <= 0.0 {
        return Err(ApiError::invalid(
            "repetition_penalty",
            "repetition_penalty must be in (0, 2]",
        ));
    }
    if let Some(bias) = &c.logit_bias {
        if !bias.is_empty() {
            return Err(ApiError::invalid(
                "logit_bias",
                "logit_bias is not supported",
            ));
        }
    }
    let use_beam_search = c.use_beam_search.unwrap_or(false);
    let prompt_logprobs = nonneg("prompt_logprobs", c.prompt_logprobs)?;
    if prompt_logprobs.is_some_and(|k| k > MAX_LOGPROBS) {
        return Err(ApiError::invalid(
            "prompt_logprobs",
            format!("prompt_logprobs must be in [0, {MAX_LOGPROBS}]"),
        ));
    }
    let early_stopping = match &c.early_stopping {
        None | Some(serde_json::Value::Null) => false,
        Some(serde_json::Value::Bool(b)) => *b,
        Some(other) => {
            return Err(ApiError::invalid(
                "early_stopping",
                format!("early_stopping must be true or false, got {other}"),
            ))
        }
    };
    let stop_token_ids = c
        .stop_token_ids
        .iter()
        .flatten()
        .map(|&t| token_id(ctx, "stop_token_ids", t))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(SamplingParams {
        n,
        best_of,
        max_tokens: 0,
        min_tokens: nonneg("min_tokens", c.min_tokens)?.unwrap_or(0),
        temperature: range_f("temperature", c.temperature, 0.0, 2.0, 1.0)?,
        top_p,
        top_k,
        min_p: range_f("min_p", c.min_p, 0.0, 1.0, 0.0)?,
        presence_penalty: range_f("presence_penalty", c.presence_penalty, -2.0, 2.0, 0.0)?,
        frequency_penalty: range_f("frequency_penalty", c.frequency_penalty, -2.0, 2.0, 0.0)?,
        repetition_penalty,
        seed: c.seed.map(|s| s as u64),
        ignore_eos: c.ignore_eos.unwrap_or(false),
        stop_token_ids,
        logprobs,
        use_beam_search,
        length_penalty: c.length_penalty.unwrap_or(1.0) as f32,
        early_stopping,
        prompt_logprobs,
    })
}

/// Builds the request once prompts are tokenized: checks lengths.
fn finish(
    ctx: &ValidationContext<'_>,
    endpoint: Endpoint,
    model: String,
    prompts: Vec<Prompt>,
    c: &CommonParams,
    mut params: SamplingParams,
    echo: bool,
) -> Result<GenerateRequest, ApiError> {
    let max_tokens = nonneg("max_tokens", c.max_tokens)?;
    if max_tokens == Some(0) && !echo {
        return Err(ApiError::invalid(
            "max_tokens",
            "max_tokens must be at least 1",
        ));
    }
    if let Some(m) = max_tokens {
        if params.min_tokens > m {
            return Err(ApiError::invalid(
                "min_tokens",
                format!(
                    "min_tokens ({}) must be <= max_tokens ({m})",
                    params.min_tokens
                ),
            ));
        }
    }
    let max_len = ctx.limits.max_model_len;
    for p in &prompts {
        if p.token_ids.is_empty() {
            return Err(ApiError::invalid("prompt", "the prompt is empty"));
        }
        let want = max_tokens.unwrap_or(1).max(1);
        if p.token_ids.len() + want > max_len {
            return Err(ApiError::ContextTooLong(format!(
                "This model's maximum context length is {max_len} tokens. However, you requested \
                 {} tokens ({} in the prompt, {want} for the completion). Please reduce the length \
                 of the prompt or max_tokens.",
                p.token_ids.len() + want,
                p.token_ids.len()
            )));
        }
    }
    params.max_tokens = max_tokens.unwrap_or(0);
    let stream = c.stream.unwrap_or(false);
    let include_usage = c
        .stream_options
        .as_ref()
        .and_then(|o| o.include_usage)
        .unwrap_or(false);
    if c.stream_options.is_some() && !stream {
        return Err(ApiError::invalid(
            "stream_options",
            "stream_options is only allowed with stream: true",
        ));
    }
    if stream && params.best_of > params.n {
        return Err(ApiError::invalid(
            "best_of",
            "best_of > n is not allowed with stream: true",
        ));
    }
    Ok(GenerateRequest {
        endpoint,
        model,
        prompts,
        params,
        max_tokens,
        stop: stops(&c.stop)?,
        stream,
        include_usage,
        echo,
        return_token_ids: c.return_token_ids.unwrap_or(false),
    })
}

pub(crate) fn encode(
    ctx: &ValidationContext<'_>,
    text: &str,
    special: bool,
) -> Result<Vec<u32>, ApiError> {
    ctx.tokenizer
        .encode(text, special)
        .map_err(|e| ApiError::invalid("prompt", format!("cannot tokenize the prompt: {e}")))
}

fn prompt_from_ids(ctx: &ValidationContext<'_>, ids: &[i64]) -> Result<Prompt, ApiError> {
    let token_ids = ids
        .iter()
        .map(|&t| token_id(ctx, "prompt", t))
        .collect::<Result<Vec<_>, _>>()?;
    let text = ctx
        .tokenizer
        .decode(&token_ids, false)
        .map_err(|e| ApiError::invalid("prompt", e.to_string()))?;
    Ok(Prompt { text, token_ids })
}

fn completion_prompts(
    ctx: &ValidationContext<'_>,
    p: &PromptInput,
) -> Result<Vec<Prompt>, ApiError> {
    let text_prompt = |t: &String| -> Result<Prompt, ApiError> {
        Ok(Prompt {
            text: t.clone(),
            token_ids: encode(ctx, t, true)?,
        })
    };
    let prompts = match p {
        PromptInput::Text(t) => vec![text_prompt(t)?],
        PromptInput::Texts(ts) => ts.iter().map(text_prompt).collect::<Result<_, _>>()?,
        PromptInput::Tokens(ids) => vec![prompt_from_ids(ctx, ids)?],
        PromptInput::TokenBatch(b) => b
            .iter()
            .map(|ids| prompt_from_ids(ctx, ids))
            .collect::<Result<_, _>>()?,
    };
    if prompts.is_empty() {
        return Err(ApiError::invalid("prompt", "the prompt list is empty"));
    }
    if prompts.len() > MAX_BATCH_PROMPTS {
        return Err(ApiError::invalid(
            "prompt",
            format!("at most {MAX_BATCH_PROMPTS} prompts per request"),
        ));
    }
    Ok(prompts)
}

/// Validates a `/v1/completions` body.
pub fn completion(
    ctx: &ValidationContext<'_>,
    r: &CompletionRequest,
) -> Result<GenerateRequest, ApiError> {
    let model = check_model(ctx, &r.model)?;
    if r.suffix.as_deref().is_some_and(|s| !s.is_empty()) {
        return Err(ApiError::invalid("suffix", "suffix is not supported"));
    }
    let logprobs = nonneg("logprobs", r.logprobs)?;
    if logprobs.is_some_and(|k| k > MAX_LOGPROBS) {
        return Err(ApiError::invalid(
            "logprobs",
            format!("logprobs must be in [0, {MAX_LOGPROBS}]"),
        ));
    }
    let mut c = r.common();
    // OpenAI's completions default; chat fills the context instead.
    c.max_tokens = c.max_tokens.or(Some(16));
    let mut params = sampling(ctx, &c, logprobs)?;
    let echo = r.echo.unwrap_or(false);
    if echo {
        if let Some(k) = logprobs {
            params.prompt_logprobs = Some(params.prompt_logprobs.map_or(k, |p| p.max(k)));
        }
    }
    let prompts = completion_prompts(ctx, &r.prompt)?;
    finish(ctx, Endpoint::Completions, model, prompts, &c, params, echo)
}

/// Checks chat `messages` and renders them with the model's chat template
/// (shared by chat completions and `/tokenize`).
pub(crate) fn render_chat(
    ctx: &ValidationContext<'_>,
    messages: &[ChatMessageIn],
    add_generation_prompt: bool,
) -> Result<String, ApiError> {
    if messages.is_empty() {
        return Err(ApiError::invalid("messages", "messages must not be empty"));
    }
    const ROLES: [&str; 5] = ["system", "user", "assistant", "tool", "developer"];
    let mut msgs = Vec::with_capacity(messages.len());
    for m in messages {
        if !ROLES.contains(&m.role.as_str()) {
            return Err(ApiError::invalid(
                "messages",
                format!("unknown role {:?}", m.role),
            ));
        }
        let role = if m.role == "developer" {
            "system"
        } else {
            m.role.as_str()
        };
        msgs.push(ChatMessage::new(role, message_text(m)?));
    }
    let template = ctx
        .chat_template
        .ok_or_else(|| ApiError::invalid("messages", "this model has no chat template"))?;
    template
        .render(&msgs, add_generation_prompt)
        .map_err(|e| ApiError::invalid("messages", format!("chat template failed: {e}")))
}

fn message_text(m: &ChatMessageIn) -> Result<String, ApiError> {
    match &m.content {
        None => Ok(String::new()),
        Some(MessageContent::Text(t)) => Ok(t.clone()),
        Some(MessageContent::Parts(parts)) => parts
            .iter()
            .map(|p: &ContentPart| match (p.kind.as_str(), &p.text) {
                ("text", Some(t)) => Ok(t.as_str()),
                (kind, _) => Err(ApiError::invalid(
                    "messages",
                    format!("content part of type {kind:?} is not supported (text only)"),
                )),
            })
            .collect::<Result<Vec<_>, _>>()
            .map(|v| v.concat()),
    }
}

/// Validates a `/v1/chat/completions` body; applies the chat template.
pub fn chat(ctx: &ValidationContext<'_>, r: &ChatRequest) -> Result<GenerateRequest, ApiError> {
    let model = check_model(ctx, &r.model)?;
    let text = render_chat(ctx, &r.messages, r.add_generation_prompt.unwrap_or(true))?;
    // The template writes BOS itself where the model wants it.
    let token_ids = encode(ctx, &text, false)?;
    let logprobs = match (r.logprobs.unwrap_or(false), r.top_logprobs) {
        (_, Some(k)) if !(0..=MAX_LOGPROBS as i64).contains(&k) => {
            return Err(ApiError::invalid(
                "top_logprobs",
                format!("top_logprobs must be in [0, {MAX_LOGPROBS}]"),
            ))
        }
        (false, Some(_)) => {
            return Err(ApiError::invalid(
                "top_logprobs",
                "top_logprobs requires logprobs: true",
            ))
        }
        (true, k) => Some(k.unwrap_or(0) as usize),
        (false, None) => None,
    };
    let c = r.common();
    let params = sampling(ctx, &c, logprobs)?;
    let prompts = vec![Prompt { text, token_ids }];
    finish(ctx, Endpoint::Chat, model, prompts, &c, params, false)
}
