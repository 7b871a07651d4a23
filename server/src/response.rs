//! OpenAI response bodies and stream chunks, built from a [`Generation`]'s
//! state. Shapes follow OpenAI (and vLLM's `token_ids` / `prompt_token_ids`
//! extension under `return_token_ids`).
//!
//! Logprobs: completions use the legacy format (`tokens`,
//! `token_logprobs`, `top_logprobs`, `text_offset`); chat uses
//! `{"content": [{token, logprob, bytes, top_logprobs}]}`.
//!
//! Prompt logprobs (vLLM's format): a list with one entry per prompt token,
//! `null` for the first, then objects keyed by token id (as a string) ->
//! `{logprob, rank, decoded_token}` holding the prompt token and its top
//! alternatives. Completions put it on each choice (`prompt_logprobs`),
//! chat on the response object, as vLLM does. Streaming: on the first chunk
//! of each choice that carries generated text (top level for chat).
//! Completions with `echo` and `logprobs` also fill the prompt part of the
//! legacy `logprobs` (first token's logprob and alternatives `null`). In a
//! stream the echoed prompt then waits for the prompt's values: it goes out
//! with the choice's first generated text in one chunk (as vLLM does)
//! instead of in an opening chunk.
//!
//! Tool calls (chat with `tools`, see [`crate::structured`]): the message
//! carries `tool_calls` (`content` is what is left outside the calls, or
//! null) and `finish_reason` "tool_calls" when the output ended normally.
//! Streaming: a named `tool_choice` streams its arguments as
//! `delta.tool_calls[0].function.arguments` pieces (the first with id and
//! name); "required" sends its calls whole in the last delta (the text in
//! between is not sent as content); "auto" streams content as usual and,
//! when the finished text holds calls, adds them to the last delta.

use crate::backend::{PromptLogprobs, TokenOut};
use crate::generate::{ChoiceDelta, Generation};
use crate::structured::{parse_tool_calls, ParsedCall, ToolMode};
use crate::validate::Endpoint;
use model_loader::Tokenizer;
use serde_json::{json, Map, Value};

/// Fixed fields of every chunk / response of one request.
#[derive(Debug, Clone)]
pub struct ResponseMeta {
    pub id: String,
    pub created: u64,
    pub model: String,
    pub endpoint: Endpoint,
}

impl ResponseMeta {
    fn object(&self, chunk: bool) -> &'static str {
        match (self.endpoint, chunk) {
            (Endpoint::Completions, _) => "text_completion",
            (Endpoint::Chat, false) => "chat.completion",
            (Endpoint::Chat, true) => "chat.completion.chunk",
        }
    }
}

fn token_text(tok: &Tokenizer, id: u32) -> String {
    tok.token_bytes(id)
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default()
}

/// Legacy completions logprobs for `tokens`, text offsets from `offset`.
fn completion_logprobs(tok: &Tokenizer, tokens: &[TokenOut], offset: usize) -> Value {
    legacy_logprobs(tok, None, tokens, offset)
}

/// The prompt part of echoed legacy logprobs: alternatives per token, the
/// prompt's ids and its logprobs list.
type EchoPrompt<'a> = (usize, &'a [u32], &'a PromptLogprobs);

/// Legacy logprobs: the echoed prompt's tokens (offsets from 0; the first
/// token's logprob and alternatives `null`) when given, then `tokens`
/// (offsets from `offset`).
fn legacy_logprobs(
    tok: &Tokenizer,
    prompt: Option<EchoPrompt<'_>>,
    tokens: &[TokenOut],
    mut offset: usize,
) -> Value {
    let mut texts = Vec::new();
    let mut lps: Vec<Value> = Vec::new();
    let mut tops = Vec::new();
    let mut offsets = Vec::new();
    if let Some((k, ids, list)) = prompt {
        let mut at = 0;
        for (i, &id) in ids.iter().enumerate() {
            let s = token_text(tok, id);
            offsets.push(at);
            at += s.len();
            match list.get(i).and_then(Option::as_ref) {
                Some(e) => {
                    let mut top = Map::new();
                    top.insert(s.clone(), json!(e.logprob));
                    for &(alt, lp) in e.top_logprobs.iter().take(k) {
                        top.entry(token_text(tok, alt)).or_insert(json!(lp));
                    }
                    lps.push(json!(e.logprob));
                    tops.push(Value::Object(top));
                }
                None => {
                    lps.push(Value::Null);
                    tops.push(Value::Null);
                }
            }
            texts.push(s);
        }
    }
    for t in tokens {
        let s = token_text(tok, t.token_id);
        offsets.push(offset);
        offset += s.len();
        let mut top = Map::new();
        top.insert(s.clone(), json!(t.logprob));
        for &(id, lp) in &t.top_logprobs {
            top.insert(token_text(tok, id), json!(lp));
        }
        texts.push(s);
        lps.push(json!(t.logprob));
        tops.push(Value::Object(top));
    }
    json!({"tokens": texts, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets})
}

/// Chat logprobs for `tokens` (`top` alternatives each).
fn chat_logprobs(tok: &Tokenizer, tokens: &[TokenOut], top: usize) -> Value {
    let entry = |id: u32, lp: f32| {
        let bytes = tok.token_bytes(id).unwrap_or_default();
        json!({"token": String::from_utf8_lossy(&bytes), "logprob": lp, "bytes": bytes})
    };
    let content: Vec<Value> = tokens
        .iter()
        .map(|t| {
            let mut e = entry(t.token_id, t.logprob);
            let mut alts = vec![entry(t.token_id, t.logprob)];
            alts.extend(
                t.top_logprobs
                    .iter()
                    .filter(|(id, _)| *id != t.token_id)
                    .map(|&(id, lp)| entry(id, lp)),
            );
            alts.truncate(top);
            e["top_logprobs"] = Value::Array(alts);
            e
        })
        .collect();
    json!({ "content": content })
}

fn logprobs_value(g: &Generation, tokens: &[TokenOut], offset: usize) -> Value {
    match g.req.params.sampling.logprobs {
        None => Value::Null,
        Some(k) => match g.req.endpoint {
            Endpoint::Completions => completion_logprobs(g.tokenizer(), tokens, offset),
            Endpoint::Chat => chat_logprobs(g.tokenizer(), tokens, k),
        },
    }
}

/// A whole completions choice's logprobs: with `echo`, the prompt's part
/// first (when the engine sent the prompt's logprobs).
fn choice_logprobs(g: &Generation, index: usize, tokens: &[TokenOut], offset: usize) -> Value {
    let pi = index / g.req.params.sampling.n;
    let echo = match (
        g.req.echo,
        g.req.params.sampling.logprobs,
        &g.prompt_logprobs[pi],
    ) {
        (true, Some(k), Some(list)) => Some((k, g.req.prompts[pi].token_ids.as_slice(), list)),
        _ => None,
    };
    match (g.req.endpoint, echo) {
        (Endpoint::Completions, Some(e)) => legacy_logprobs(g.tokenizer(), Some(e), tokens, offset),
        _ => logprobs_value(g, tokens, offset),
    }
}

/// vLLM's `prompt_logprobs` value: `null` for the first token, then
/// `{"<id>": {logprob, rank, decoded_token}}` with the prompt token and its
/// alternatives (ranked 1.. in order).
fn prompt_logprobs_value(tok: &Tokenizer, list: &PromptLogprobs) -> Value {
    let entry = |id: u32, lp: f32, rank: usize| json!({"logprob": lp, "rank": rank, "decoded_token": token_text(tok, id)});
    Value::Array(
        list.iter()
            .map(|e| match e {
                None => Value::Null,
                Some(e) => {
                    let mut m = Map::new();
                    m.insert(e.token_id.to_string(), entry(e.token_id, e.logprob, e.rank));
                    for (i, &(id, lp)) in e.top_logprobs.iter().enumerate() {
                        m.entry(id.to_string()).or_insert(entry(id, lp, i + 1));
                    }
                    Value::Object(m)
                }
            })
            .collect(),
    )
}

/// The prompt logprobs of prompt `pi` as JSON, when the engine sent them.
fn prompt_logprobs_of(g: &Generation, pi: usize) -> Option<Value> {
    g.prompt_logprobs
        .get(pi)?
        .as_ref()
        .map(|l| prompt_logprobs_value(g.tokenizer(), l))
}

/// The `usage` object.
pub fn usage(g: &Generation) -> Value {
    let p = g.prompt_tokens();
    let c = g.completion_tokens();
    let mut u = json!({"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c});
    if g.num_cached_tokens > 0 {
        u["prompt_tokens_details"] = json!({"cached_tokens": g.num_cached_tokens});
    }
    u
}

fn prompt_of(g: &Generation, index: usize) -> &crate::validate::Prompt {
    &g.req.prompts[index / g.req.params.sampling.n]
}

/// The non-streaming response.
pub fn full_response(meta: &ResponseMeta, g: &Generation) -> Value {
    let choices: Vec<Value> = g
        .choices
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let prompt = prompt_of(g, i);
            let echo = if g.req.echo { prompt.text.as_str() } else { "" };
            let lp = choice_logprobs(g, i, &c.tokens, echo.len());
            let mut v = match meta.endpoint {
                Endpoint::Completions => json!({
                    "index": i, "text": format!("{echo}{}", c.text), "logprobs": lp,
                    "finish_reason": c.finish_reason, "stop_reason": Value::Null,
                }),
                Endpoint::Chat => {
                    let mut message = json!({"role": "assistant", "content": c.text});
                    let mut finish = c.finish_reason;
                    if let Some((content, calls)) = parse_tool_calls(&g.req.tool_mode, &c.text) {
                        message["content"] = json!(content);
                        message["tool_calls"] = tool_calls_value(meta, i, &calls, true);
                        finish = tool_finish(finish);
                    }
                    json!({
                        "index": i, "message": message,
                        "logprobs": lp, "finish_reason": finish, "stop_reason": Value::Null,
                    })
                }
            };
            if g.req.return_token_ids {
                v["token_ids"] = json!(c.tokens.iter().map(|t| t.token_id).collect::<Vec<_>>());
                v["prompt_token_ids"] = json!(prompt.token_ids);
            }
            if meta.endpoint == Endpoint::Completions {
                if let Some(p) = prompt_logprobs_of(g, i / g.req.params.sampling.n) {
                    v["prompt_logprobs"] = p;
                }
            }
            v
        })
        .collect();
    let mut r = json!({
        "id": meta.id, "object": meta.object(false), "created": meta.created,
        "model": meta.model, "choices": choices, "usage": usage(g),
    });
    if meta.endpoint == Endpoint::Chat {
        if let Some(p) = prompt_logprobs_of(g, 0) {
            r["prompt_logprobs"] = p;
        }
    }
    r
}

/// "tool_calls" replaces a normal end ("stop"); "length" and "abort" stay.
fn tool_finish(f: Option<&'static str>) -> Option<&'static str> {
    match f {
        Some("stop") => Some("tool_calls"),
        other => other,
    }
}

/// OpenAI's `tool_calls` list (`whole`: with id, type and name, as in a
/// full message or a first stream delta).
fn tool_calls_value(
    meta: &ResponseMeta,
    choice: usize,
    calls: &[ParsedCall],
    whole: bool,
) -> Value {
    Value::Array(
        calls
            .iter()
            .enumerate()
            .map(|(k, c)| {
                if whole {
                    json!({
                        "index": k, "id": format!("call_{}_{choice}_{k}", meta.id),
                        "type": "function",
                        "function": {"name": c.name, "arguments": c.arguments},
                    })
                } else {
                    json!({"index": k, "function": {"arguments": c.arguments}})
                }
            })
            .collect(),
    )
}

/// A chat delta under a tool mode; `None`: the plain content delta.
fn tool_delta(
    meta: &ResponseMeta,
    g: &Generation,
    d: &ChoiceDelta,
    offset: usize,
) -> Option<Value> {
    let finished = d.finish_reason.is_some();
    match &g.req.tool_mode {
        ToolMode::None => None,
        ToolMode::Named(name) => {
            let call = [ParsedCall {
                name: name.clone(),
                arguments: d.text.clone(),
            }];
            let delta = if d.text.is_empty() && offset > 0 {
                json!({})
            } else {
                json!({"tool_calls": tool_calls_value(meta, d.index, &call, offset == 0)})
            };
            Some(delta)
        }
        ToolMode::Required | ToolMode::Auto => {
            let text = g.choices.get(d.index).map_or("", |c| c.text.as_str());
            let parsed = finished
                .then(|| parse_tool_calls(&g.req.tool_mode, text))
                .flatten();
            match (parsed, &g.req.tool_mode) {
                (Some((_, calls)), _) => Some(json!({
                    "tool_calls": tool_calls_value(meta, d.index, &calls, true)
                })),
                (None, ToolMode::Required) => Some(json!({})),
                (None, _) => None,
            }
        }
    }
}

fn chunk(meta: &ResponseMeta, choices: Vec<Value>, usage: Value) -> Value {
    json!({
        "id": meta.id, "object": meta.object(true), "created": meta.created,
        "model": meta.model, "choices": choices, "usage": usage,
    })
}

/// Whether a stream's echo waits for the first generated text (completions
/// with `echo` and `logprobs`: the prompt's logprobs come with it).
pub fn echo_waits_for_output(g: &Generation) -> bool {
    g.req.endpoint == Endpoint::Completions
        && g.req.echo
        && g.req.params.sampling.logprobs.is_some()
}

/// The first chunk of each choice: the chat role, or the echoed prompt.
/// `None` when nothing needs saying (or the echo waits, see
/// [`echo_waits_for_output`]).
pub fn opening_chunk(meta: &ResponseMeta, g: &Generation, index: usize) -> Option<Value> {
    if echo_waits_for_output(g) {
        return None;
    }
    let prompt = prompt_of(g, index);
    let echo_text = if g.req.echo { prompt.text.as_str() } else { "" };
    let mut c = match meta.endpoint {
        Endpoint::Chat => json!({
            "index": index, "delta": {"role": "assistant", "content": ""},
            "logprobs": Value::Null, "finish_reason": Value::Null,
        }),
        Endpoint::Completions if g.req.echo || g.req.return_token_ids => json!({
            "index": index, "text": echo_text,
            "logprobs": Value::Null, "finish_reason": Value::Null,
        }),
        Endpoint::Completions => return None,
    };
    if g.req.return_token_ids {
        c["prompt_token_ids"] = json!(prompt.token_ids);
    }
    Some(chunk(meta, vec![c], Value::Null))
}

/// One stream chunk for a choice's delta. `offset` is the choice's text
/// length before this delta (for completions' `text_offset`).
pub fn delta_chunk(meta: &ResponseMeta, g: &Generation, d: &ChoiceDelta, offset: usize) -> Value {
    let lp = logprobs_value(g, &d.tokens, offset);
    let mut c = match meta.endpoint {
        Endpoint::Completions => json!({
            "index": d.index, "text": d.text, "logprobs": lp, "finish_reason": d.finish_reason,
        }),
        Endpoint::Chat => {
            let mut finish = d.finish_reason;
            let delta = match tool_delta(meta, g, d, offset) {
                Some(t) => {
                    let called = t.get("tool_calls").is_some() || g.req.tool_mode != ToolMode::Auto;
                    if called && d.finish_reason.is_some() {
                        let text = g.choices.get(d.index).map_or("", |c| c.text.as_str());
                        if parse_tool_calls(&g.req.tool_mode, text).is_some() {
                            finish = tool_finish(finish);
                        }
                    }
                    t
                }
                None if d.text.is_empty() && d.finish_reason.is_some() => json!({}),
                None => json!({"content": d.text}),
            };
            json!({"index": d.index, "delta": delta, "logprobs": lp, "finish_reason": finish})
        }
    };
    if g.req.return_token_ids {
        c["token_ids"] = json!(d.tokens.iter().map(|t| t.token_id).collect::<Vec<_>>());
    }
    let prompt_lp = d
        .prompt_logprobs
        .then(|| prompt_logprobs_of(g, d.index / g.req.params.sampling.n))
        .flatten();
    match (meta.endpoint, prompt_lp) {
        (Endpoint::Completions, Some(p)) => {
            c["prompt_logprobs"] = p;
            chunk(meta, vec![c], Value::Null)
        }
        (Endpoint::Chat, Some(p)) => {
            let mut v = chunk(meta, vec![c], Value::Null);
            v["prompt_logprobs"] = p;
            v
        }
        (_, None) => chunk(meta, vec![c], Value::Null),
    }
}

/// A choice's first delta when its echo waited for it: the prompt's text,
/// token ids and legacy logprobs followed by the delta's. Returns the chunk
/// and the choice's text length after it (for later `text_offset`s).
pub fn echo_and_delta_chunk(
    meta: &ResponseMeta,
    g: &Generation,
    d: &ChoiceDelta,
) -> (Value, usize) {
    let prompt = prompt_of(g, d.index);
    let mut v = delta_chunk(meta, g, d, prompt.text.len());
    let c = &mut v["choices"][0];
    c["text"] = json!(format!("{}{}", prompt.text, d.text));
    c["logprobs"] = choice_logprobs(g, d.index, &d.tokens, prompt.text.len());
    if g.req.return_token_ids {
        c["prompt_token_ids"] = json!(prompt.token_ids);
    }
    (v, prompt.text.len() + d.text.len())
}

/// The final usage chunk (`stream_options.include_usage`).
pub fn usage_chunk(meta: &ResponseMeta, g: &Generation) -> Value {
    chunk(meta, Vec::new(), usage(g))
}

/// `GET /v1/models`.
pub fn models(model: &str, created: u64, max_model_len: usize) -> Value {
    json!({
        "object": "list",
        "data": [{
            "id": model, "object": "model", "created": created, "owned_by": "paged-engine",
            "root": model, "parent": Value::Null, "max_model_len": max_model_len,
        }],
    })
}

/// One SSE event.
pub fn sse(v: &Value) -> bytes::Bytes {
    bytes::Bytes::from(format!("data: {v}\n\n"))
}

/// The stream's last event.
pub const SSE_DONE: &[u8] = b"data: [DONE]\n\n";

/// An error inside an already started stream (status is already 200).
pub fn sse_error(body: &str) -> bytes::Bytes {
    bytes::Bytes::from(format!("data: {body}\n\n"))
}
