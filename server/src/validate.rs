//! Turns wire requests into a typed [`GenerateRequest`], once, at the edge:
//! the wire form converted into the engine's own types, prompts tokenized
//! (chat template applied).
//!
//! What is validated is split by owner, each rule in one place. The engine
//! validates the request itself once, when it is submitted
//! (`engine::scheduler::validate_request`: every sampling range, the empty
//! prompt, the one context-length rule `prompt + max_tokens <=
//! max_model_len`); its typed error becomes the 400 in `ApiError::from`.
//! What is checked here is what only the wire form has: JSON types,
//! negative counts, top_k -1 (off), token ids inside the
//! vocabulary (`stop_token_ids`, `logit_bias` keys), early_stopping a boolean
//! (vLLM's "never" is refused), at most 4 stop strings (OpenAI's limit),
//! none empty. Structured outputs and tools: see [`crate::structured`]; a
//! chat message without `content` is a 400 unless it is an assistant
//! message with `tool_calls`.
//! With `echo` and `logprobs`, the prompt's logprobs are asked for too (as
//! vLLM does), with `max(logprobs, prompt_logprobs)` alternatives.
//! Cost: O(prompt length) for tokenization plus O(number of fields).

use crate::backend::{BackendLimits, RequestParams, SamplingParams};
use crate::error::ApiError;
use crate::protocol::{
    ChatMessageIn, ChatRequest, CommonParams, CompletionRequest, ContentPart, MessageContent,
    PromptInput, StopInput,
};
use crate::structured::{GrammarCache, ToolMode};
use engine::error::Report;
use engine::grammar::GrammarSpec;
use engine::sampler::MAX_LOGPROBS;
use model_loader::{ChatMessage, ChatTemplate, GenerationDefaults, Tokenizer};

/// Most prompts in one batch request.
pub const MAX_BATCH_PROMPTS: usize = 256;
/// Most stop strings.
pub const MAX_STOP_STRINGS: usize = 4;

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
    /// Engine parameters (`max_tokens` is set per prompt from the field below).
    pub params: RequestParams,
    /// Chat: how tool calls are returned.
    pub tool_mode: ToolMode,
    /// `max_tokens` as asked (`None`: fill the context).
    pub max_tokens: Option<usize>,
    pub stop: Vec<String>,
    pub stream: bool,
    pub include_usage: bool,
    pub echo: bool,
    pub return_token_ids: bool,
}

/// What validation needs to know about the served model.
pub struct ValidationContext<'a> {
    pub served_model_name: &'a str,
    pub tokenizer: &'a Tokenizer,
    pub chat_template: Option<&'a ChatTemplate>,
    pub limits: BackendLimits,
    /// The grammar compiler (built on the first constrained request).
    pub grammars: &'a GrammarCache,
    /// Sampling defaults for the fields a request leaves out
    /// (`--generation-config`).
    pub defaults: GenerationDefaults,
    /// The served LoRA adapters (`--enable-lora`; `None`: off).
    pub loras: Option<&'a crate::lora::LoraRegistry>,
}

/// The shared fields with the model's defaults filled in where the request
/// left them out (vLLM's `--generation-config auto`: the request wins).
fn with_defaults(mut c: CommonParams, d: &GenerationDefaults) -> CommonParams {
    c.temperature = c.temperature.or(d.temperature);
    c.top_p = c.top_p.or(d.top_p);
    c.top_k = c.top_k.or(d.top_k);
    c.min_p = c.min_p.or(d.min_p);
    c.repetition_penalty = c.repetition_penalty.or(d.repetition_penalty);
    c.max_tokens = c
        .max_tokens
        .or(d.max_tokens.map(|n| i64::try_from(n).unwrap_or(i64::MAX)));
    c
}

pub(crate) fn check_model(
    ctx: &ValidationContext<'_>,
    model: &Option<String>,
) -> Result<String, ApiError> {
    match model {
        None => Ok(ctx.served_model_name.to_string()),
        Some(m) if m == ctx.served_model_name => Ok(m.clone()),
        Some(m) if ctx.loras.is_some_and(|l| l.contains(m)) => Ok(m.clone()),
        Some(m) => Err(ApiError::ModelNotFound(m.clone())),
    }
}

/// The LoRA adapter `model` names (`None`: the base model).
fn lora_for(
    ctx: &ValidationContext<'_>,
    model: &str,
) -> Result<Option<engine::scheduler::LoraRequest>, ApiError> {
    match ctx.loras {
        Some(l) if model != ctx.served_model_name => match l.request(model)? {
            Some(r) => Ok(Some(r)),
            // Unloaded since `check_model`.
            None => Err(ApiError::ModelNotFound(model.to_string())),
        },
        _ => Ok(None),
    }
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

/// `logit_bias`: token id (as a string key) -> bias.
fn logit_bias(ctx: &ValidationContext<'_>, c: &CommonParams) -> Result<Vec<(u32, f32)>, ApiError> {
    let Some(map) = &c.logit_bias else {
        return Ok(Vec::new());
    };
    let mut out = Vec::with_capacity(map.len());
    for (k, &v) in map {
        let id: i64 = k.trim().parse().map_err(|_| {
            ApiError::invalid(
                "logit_bias",
                format!("logit_bias keys must be token ids, got {k:?}"),
            )
        })?;
        out.push((token_id(ctx, "logit_bias", id)?, v as f32));
    }
    out.sort_by_key(|&(t, _)| t);
    Ok(out)
}

/// Parameters common to both endpoints, in the engine's types (checked by
/// the engine's `validate` in [`finish`]); `logprobs` is endpoint-specific.
fn sampling(
    ctx: &ValidationContext<'_>,
    c: &CommonParams,
    logprobs: Option<usize>,
) -> Result<RequestParams, ApiError> {
    let n = nonneg("n", c.n)?.unwrap_or(1);
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
    let use_beam_search = c.use_beam_search.unwrap_or(false);
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
    let f = |v: Option<f64>, default: f32| v.map_or(default, |x| x as f32);
    let sampling = SamplingParams {
        n,
        best_of: Some(nonneg("best_of", c.best_of)?.unwrap_or(n)),
        // Beam search is deterministic (vLLM's older behaviour).
        temperature: if use_beam_search {
            0.0
        } else {
            f(c.temperature, 1.0)
        },
        top_p: f(c.top_p, 1.0),
        top_k,
        min_p: f(c.min_p, 0.0),
        presence_penalty: f(c.presence_penalty, 0.0),
        frequency_penalty: f(c.frequency_penalty, 0.0),
        repetition_penalty: f(c.repetition_penalty, 1.0),
        seed: c.seed.map(|s| s as u64),
        min_tokens: nonneg("min_tokens", c.min_tokens)?.unwrap_or(0),
        logprobs,
        prompt_logprobs: nonneg("prompt_logprobs", c.prompt_logprobs)?,
        use_beam_search,
        length_penalty: f(c.length_penalty, 1.0),
        early_stopping,
        logit_bias: logit_bias(ctx, c)?,
        structured: None,
    };
    Ok(RequestParams {
        max_tokens: None,
        ignore_eos: c.ignore_eos.unwrap_or(false),
        stop_token_ids,
        sampling,
        ..RequestParams::default()
    })
}

/// Compiles the request's constraint (from the shared fields, or `tool`
/// from `tool_choice`) into `params`.
fn constrain(
    ctx: &ValidationContext<'_>,
    c: &CommonParams,
    tool: Option<GrammarSpec>,
    params: &mut RequestParams,
) -> Result<(), ApiError> {
    let asked = crate::structured::requested_spec(c)?;
    let (spec, param) = match (asked, tool) {
        (Some((_, p)), Some(_)) => return Err(ApiError::invalid(
            p,
            "a structured output constraint cannot be combined with tool_choice required or named",
        )),
        (Some((s, p)), None) => (s, p),
        (None, Some(s)) => (s, "tools"),
        (None, None) => return Ok(()),
    };
    params.sampling.structured = Some(crate::structured::compile(
        ctx.grammars,
        ctx.tokenizer,
        &spec,
        param,
    )?);
    Ok(())
}

/// Builds the request once prompts are tokenized.
fn finish(
    endpoint: Endpoint,
    model: String,
    prompts: Vec<Prompt>,
    c: &CommonParams,
    params: RequestParams,
    echo: bool,
) -> Result<GenerateRequest, ApiError> {
    // Ranges, the empty prompt and the context length are the engine's to
    // check, once, when the request is submitted (`scheduler::validate_request`).
    let max_tokens = nonneg("max_tokens", c.max_tokens)?;
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
    if stream && params.sampling.width() > params.sampling.n {
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
        tool_mode: ToolMode::None,
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
    ctx.tokenizer.encode(text, special).map_err(|e| {
        ApiError::invalid(
            "prompt",
            format!("cannot tokenize the prompt: {}", Report(&e)),
        )
    })
}

fn prompt_from_ids(ctx: &ValidationContext<'_>, ids: &[i64]) -> Result<Prompt, ApiError> {
    let token_ids = ids
        .iter()
        .map(|&t| token_id(ctx, "prompt", t))
        .collect::<Result<Vec<_>, _>>()?;
    let text = ctx
        .tokenizer
        .decode(&token_ids, false)
        .map_err(|e| ApiError::invalid("prompt", Report(&e).to_string()))?;
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
    let mut c = with_defaults(r.common(), &ctx.defaults);
    // OpenAI's completions default; chat fills the context instead.
    c.max_tokens = c.max_tokens.or(Some(16));
    let mut params = sampling(ctx, &c, logprobs)?;
    params.lora = lora_for(ctx, &model)?;
    let echo = r.echo.unwrap_or(false);
    if echo {
        if let Some(k) = logprobs {
            let s = &mut params.sampling;
            s.prompt_logprobs = Some(s.prompt_logprobs.map_or(k, |p| p.max(k)));
        }
    }
    let prompts = completion_prompts(ctx, &r.prompt)?;
    constrain(ctx, &c, None, &mut params)?;
    finish(Endpoint::Completions, model, prompts, &c, params, echo)
}

/// Checks chat `messages` and renders them with the model's chat template
/// (shared by chat completions and `/tokenize`).
pub(crate) fn render_chat(
    ctx: &ValidationContext<'_>,
    messages: &[ChatMessageIn],
    add_generation_prompt: bool,
) -> Result<String, ApiError> {
    render_chat_with(ctx, messages, add_generation_prompt, None)
}

/// [`render_chat`] with an optional leading system message (the tools).
fn render_chat_with(
    ctx: &ValidationContext<'_>,
    messages: &[ChatMessageIn],
    add_generation_prompt: bool,
    system: Option<String>,
) -> Result<String, ApiError> {
    if messages.is_empty() {
        return Err(ApiError::invalid("messages", "messages must not be empty"));
    }
    let mut msgs = Vec::with_capacity(messages.len() + 1);
    if let Some(s) = system {
        msgs.push(ChatMessage::new("system", s));
    }
    for (i, m) in messages.iter().enumerate() {
        msgs.push(template_message(i, m)?);
    }
    let template = ctx
        .chat_template
        .ok_or_else(|| ApiError::invalid("messages", "this model has no chat template"))?;
    template
        .render(&msgs, add_generation_prompt)
        .map_err(|e| ApiError::invalid("messages", format!("chat template failed: {}", Report(&e))))
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

/// One history message for the chat template: tool calls and tool results
/// in the Hermes text form (see [`crate::structured`]).
fn template_message(i: usize, m: &ChatMessageIn) -> Result<ChatMessage, ApiError> {
    const ROLES: [&str; 5] = ["system", "user", "assistant", "tool", "developer"];
    if !ROLES.contains(&m.role.as_str()) {
        return Err(ApiError::invalid(
            "messages",
            format!("unknown role {:?}", m.role),
        ));
    }
    let calls = m.tool_calls.as_deref().unwrap_or(&[]);
    if !calls.is_empty() && m.role != "assistant" {
        return Err(ApiError::invalid(
            "messages",
            format!("messages[{i}]: only assistant messages carry tool_calls"),
        ));
    }
    if m.content.is_none() && calls.is_empty() {
        return Err(ApiError::invalid(
            "messages",
            format!(
                "messages[{i}] ({}) has no content (only an assistant message with tool_calls may omit it)",
                m.role
            ),
        ));
    }
    let role = if m.role == "developer" {
        "system"
    } else {
        m.role.as_str()
    };
    let mut text = message_text(m)?;
    if !calls.is_empty() {
        let pairs: Vec<(String, String)> = calls
            .iter()
            .map(|c| {
                (
                    c.function.name.clone(),
                    c.function.arguments.clone().unwrap_or_else(|| "{}".into()),
                )
            })
            .collect();
        if !text.is_empty() {
            text.push('\n');
        }
        text.push_str(&crate::structured::tool_calls_text(&pairs));
    }
    if role == "tool" {
        text = format!("<tool_response>\n{text}\n</tool_response>");
    }
    Ok(ChatMessage::new(role, text))
}

/// Validates a `/v1/chat/completions` body; applies the chat template.
pub fn chat(ctx: &ValidationContext<'_>, r: &ChatRequest) -> Result<GenerateRequest, ApiError> {
    let model = check_model(ctx, &r.model)?;
    let tool_mode = crate::structured::tool_mode(r)?;
    let tools = r.tools.as_deref().unwrap_or(&[]);
    let tools_text =
        (tool_mode != ToolMode::None).then(|| crate::structured::tools_system_text(tools));
    let text = render_chat_with(
        ctx,
        &r.messages,
        r.add_generation_prompt.unwrap_or(true),
        tools_text,
    )?;
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
    let c = with_defaults(r.common(), &ctx.defaults);
    let mut params = sampling(ctx, &c, logprobs)?;
    params.lora = lora_for(ctx, &model)?;
    let tool_spec = crate::structured::tool_spec(&tool_mode, tools);
    constrain(ctx, &c, tool_spec, &mut params)?;
    let prompts = vec![Prompt { text, token_ids }];
    let mut req = finish(Endpoint::Chat, model, prompts, &c, params, false)?;
    req.tool_mode = tool_mode;
    Ok(req)
}
