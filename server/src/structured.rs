//! Structured outputs and tool calls at the HTTP edge: which constraint a
//! request asks for (`response_format`, `structured_outputs`, the older
//! `guided_*` names, `tool_choice`), compiled once per request with the
//! engine's [`GrammarCompiler`]; the Hermes-style tool-call text form; and
//! parsing tool calls out of generated text.
//!
//! Tool-call form (SmolLM2's chat template has no tool syntax, so every
//! model is served this way): the tool definitions go into a system message
//! (inside `<tools></tools>`), an assistant call is written as
//! `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, and a `tool`
//! message's content as `<tool_response>...</tool_response>`. With
//! `tool_choice` "required" the output is constrained to one or more such
//! calls; with a named function, to that function's arguments (as vLLM
//! does); with "auto" the output is free and the calls are parsed out of it.
//!
//! Invariants: at most one constraint per request (two are a 400 naming
//! both); a constraint that does not compile is a 400 whose message is the
//! compiler's reason; the compiler is built once per server, on first use.
//! Cost: building the token trie once (O(vocabulary bytes), ~100 ms for
//! SmolLM2); compiling a grammar per request (milliseconds).

use crate::error::ApiError;
use crate::protocol::{ChatRequest, CommonParams, StructuredOutputsIn, ToolIn};
use engine::grammar::{CompiledGrammar, GrammarCompiler, GrammarError, GrammarSpec};
use model_loader::Tokenizer;
use serde_json::{json, Value};
use std::sync::{Arc, OnceLock};

/// The grammar compiler for the served tokenizer, built on first use.
#[derive(Default)]
pub struct GrammarCache {
    cell: OnceLock<Result<Arc<GrammarCompiler>, GrammarError>>,
}

impl GrammarCache {
    /// The compiler (built now if this is the first constrained request).
    pub fn get(&self, tokenizer: &Tokenizer) -> Result<Arc<GrammarCompiler>, ApiError> {
        self.cell
            .get_or_init(|| {
                let eos = tokenizer.eos_token_ids().first().copied().unwrap_or(0);
                GrammarCompiler::new(Arc::new(tokenizer.clone()), eos).map(Arc::new)
            })
            .clone()
            .map_err(ApiError::Grammar)
    }
}

/// How a chat request uses its tools.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum ToolMode {
    /// No tools, or `tool_choice: "none"`.
    #[default]
    None,
    /// Free output; `<tool_call>` blocks in it become tool calls.
    Auto,
    /// Output constrained to one or more `<tool_call>` blocks.
    Required,
    /// Output constrained to this function's arguments.
    Named(String),
}

/// A schema given as an object or as its JSON text.
fn schema_text(param: &str, v: &Value) -> Result<String, ApiError> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Object(_) | Value::Bool(_) => Ok(v.to_string()),
        other => Err(ApiError::invalid(
            param,
            format!("{param} must be a JSON schema object, got {other}"),
        )),
    }
}

fn from_structured_outputs(so: &StructuredOutputsIn) -> Result<Vec<GrammarSpec>, ApiError> {
    let p = "structured_outputs";
    let mut out = Vec::new();
    if let Some(j) = &so.json {
        out.push(GrammarSpec::JsonSchema(schema_text(p, j)?));
    }
    if let Some(r) = &so.regex {
        out.push(GrammarSpec::Regex(r.clone()));
    }
    if let Some(c) = &so.choice {
        out.push(GrammarSpec::Choice(c.clone()));
    }
    if let Some(g) = &so.grammar {
        out.push(GrammarSpec::Lark(g.clone()));
    }
    if so.json_object == Some(true) {
        out.push(GrammarSpec::JsonObject);
    }
    if out.is_empty() {
        return Err(ApiError::invalid(
            p,
            "structured_outputs needs one of json, regex, choice, grammar, json_object",
        ));
    }
    Ok(out)
}

/// The constraint asked by the shared fields, with the parameter it came
/// from; `None` for free output.
pub fn requested_spec(c: &CommonParams) -> Result<Option<(GrammarSpec, &'static str)>, ApiError> {
    let mut found: Vec<(GrammarSpec, &'static str)> = Vec::new();
    if let Some(rf) = &c.response_format {
        match rf.kind.as_str() {
            "text" => {}
            "json_object" => found.push((GrammarSpec::JsonObject, "response_format")),
            "json_schema" => {
                let schema = rf
                    .json_schema
                    .as_ref()
                    .and_then(|j| j.schema.as_ref())
                    .ok_or_else(|| {
                        ApiError::invalid(
                            "response_format",
                            "response_format json_schema needs json_schema.schema",
                        )
                    })?;
                found.push((
                    GrammarSpec::JsonSchema(schema_text("response_format", schema)?),
                    "response_format",
                ));
            }
            other => {
                return Err(ApiError::invalid(
                    "response_format",
                    format!(
                    "response_format type must be text, json_object or json_schema, got {other:?}"
                ),
                ))
            }
        }
    }
    if let Some(so) = &c.structured_outputs {
        found.extend(
            from_structured_outputs(so)?
                .into_iter()
                .map(|s| (s, "structured_outputs")),
        );
    }
    if let Some(j) = &c.guided_json {
        found.push((
            GrammarSpec::JsonSchema(schema_text("guided_json", j)?),
            "guided_json",
        ));
    }
    if let Some(r) = &c.guided_regex {
        found.push((GrammarSpec::Regex(r.clone()), "guided_regex"));
    }
    if let Some(ch) = &c.guided_choice {
        found.push((GrammarSpec::Choice(ch.clone()), "guided_choice"));
    }
    if let Some(g) = &c.guided_grammar {
        found.push((GrammarSpec::Lark(g.clone()), "guided_grammar"));
    }
    match found.len() {
        0 | 1 => Ok(found.pop()),
        _ => Err(ApiError::invalid(
            found[1].1,
            format!(
                "only one structured output constraint per request; got {} ({} and {})",
                found.len(),
                found[0].0.kind(),
                found[1].0.kind()
            ),
        )),
    }
}

/// Compiles `spec`; a grammar that does not compile is a 400 naming `param`.
pub fn compile(
    cache: &GrammarCache,
    tokenizer: &Tokenizer,
    spec: &GrammarSpec,
    param: &str,
) -> Result<CompiledGrammar, ApiError> {
    cache
        .get(tokenizer)?
        .compile(spec)
        .map_err(|e| ApiError::invalid(param, e.to_string()))
}

/// The tool mode of a chat request (validated against `tools`).
pub fn tool_mode(r: &ChatRequest) -> Result<ToolMode, ApiError> {
    let tools = r.tools.as_deref().unwrap_or(&[]);
    for t in tools {
        if t.kind != "function" {
            return Err(ApiError::invalid(
                "tools",
                format!("tool type must be \"function\", got {:?}", t.kind),
            ));
        }
        if t.function.name.is_empty() {
            return Err(ApiError::invalid("tools", "a function needs a name"));
        }
    }
    let mode = match &r.tool_choice {
        None if tools.is_empty() => ToolMode::None,
        None => ToolMode::Auto,
        Some(Value::String(s)) => match s.as_str() {
            "none" => ToolMode::None,
            "auto" => ToolMode::Auto,
            "required" => ToolMode::Required,
            other => {
                return Err(ApiError::invalid(
                    "tool_choice",
                    format!(
                    "tool_choice must be none, auto, required or a named function, got {other:?}"
                ),
                ))
            }
        },
        Some(v) => {
            let name = v
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .filter(|_| v.get("type").and_then(Value::as_str) == Some("function"))
                .ok_or_else(|| {
                    ApiError::invalid(
                        "tool_choice",
                        "a named tool_choice is {\"type\": \"function\", \"function\": {\"name\": ...}}",
                    )
                })?;
            ToolMode::Named(name.to_string())
        }
    };
    if mode != ToolMode::None && tools.is_empty() {
        return Err(ApiError::invalid("tool_choice", "tool_choice needs tools"));
    }
    if let ToolMode::Named(n) = &mode {
        if !tools.iter().any(|t| &t.function.name == n) {
            return Err(ApiError::invalid(
                "tool_choice",
                format!("tool_choice names {n:?}, which is not in tools"),
            ));
        }
    }
    Ok(mode)
}

fn parameters_of(t: &ToolIn) -> Value {
    t.function
        .parameters
        .clone()
        .unwrap_or_else(|| json!({"type": "object", "properties": {}}))
}

/// The constraint a tool mode imposes (`None` for none / auto).
pub fn tool_spec(mode: &ToolMode, tools: &[ToolIn]) -> Option<GrammarSpec> {
    match mode {
        ToolMode::None | ToolMode::Auto => None,
        ToolMode::Named(n) => tools
            .iter()
            .find(|t| &t.function.name == n)
            .map(|t| GrammarSpec::JsonSchema(parameters_of(t).to_string())),
        ToolMode::Required => {
            let calls: Vec<String> = tools
                .iter()
                .map(|t| {
                    let call = json!({
                        "type": "object",
                        "properties": {
                            "name": {"const": t.function.name},
                            "arguments": parameters_of(t),
                        },
                        "required": ["name", "arguments"],
                        "additionalProperties": false,
                        "x-guidance": {"whitespace_flexible": false,
                                        "item_separator": ", ", "key_separator": ": "},
                    });
                    format!("call_{}: %json {}", lark_id(&t.function.name), call)
                })
                .collect();
            let names: Vec<String> = tools
                .iter()
                .map(|t| format!("call_{}", lark_id(&t.function.name)))
                .collect();
            Some(GrammarSpec::Lark(format!(
                "start: block+\nblock: \"<tool_call>\\n\" body \"\\n</tool_call>\" \"\\n\"?\nbody: {}\n{}\n",
                names.join(" | "),
                calls.join("\n")
            )))
        }
    }
}

/// A Lark rule name from a function name (letters, digits, `_`).
fn lark_id(name: &str) -> String {
    let mut s: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '_'
            }
        })
        .collect();
    // Distinct names could collide after the mapping: add a hash.
    let h = name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    s.push_str(&format!("_{:x}", h & 0xffff_ffff));
    s
}

/// The system text that lists the tools (Hermes style).
pub fn tools_system_text(tools: &[ToolIn]) -> String {
    let defs: Vec<String> = tools
        .iter()
        .map(|t| {
            json!({"type": "function", "function": {
                "name": t.function.name,
                "description": t.function.description.clone().unwrap_or_default(),
                "parameters": parameters_of(t),
            }})
            .to_string()
        })
        .collect();
    format!(
        "You are a function calling AI model. You may call one or more functions to assist with \
         the user query. The function signatures are within <tools></tools> XML tags:\n<tools>\n{}\n</tools>\n\
         For each function call, return a JSON object with the function name and arguments within \
         <tool_call></tool_call> XML tags:\n<tool_call>\n{{\"name\": <function-name>, \"arguments\": <args-json-object>}}\n</tool_call>",
        defs.join("\n")
    )
}

/// An assistant message's tool calls in the Hermes text form.
pub fn tool_calls_text(calls: &[(String, String)]) -> String {
    calls
        .iter()
        .map(|(name, args)| {
            let args: Value = serde_json::from_str(args).unwrap_or(Value::String(args.clone()));
            format!(
                "<tool_call>\n{}\n</tool_call>",
                json!({"name": name, "arguments": args})
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// One parsed tool call: function name and its arguments as JSON text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedCall {
    pub name: String,
    pub arguments: String,
}

/// Tool calls in `text` per `mode`, and the text left outside them.
/// `None`: no tool call (the text is ordinary content).
pub fn parse_tool_calls(mode: &ToolMode, text: &str) -> Option<(Option<String>, Vec<ParsedCall>)> {
    match mode {
        ToolMode::None => None,
        ToolMode::Named(name) => Some((
            None,
            vec![ParsedCall {
                name: name.clone(),
                arguments: text.trim().to_string(),
            }],
        )),
        ToolMode::Auto | ToolMode::Required => {
            let mut calls = Vec::new();
            let mut rest = String::new();
            let mut s = text;
            while let Some(start) = s.find("<tool_call>") {
                rest.push_str(&s[..start]);
                let after = &s[start + "<tool_call>".len()..];
                let (body, next) = match after.find("</tool_call>") {
                    Some(end) => (&after[..end], &after[end + "</tool_call>".len()..]),
                    None => (after, ""),
                };
                let v: Value = serde_json::from_str(body.trim()).ok()?;
                let name = v.get("name")?.as_str()?.to_string();
                let args = v.get("arguments").cloned().unwrap_or(json!({}));
                calls.push(ParsedCall {
                    name,
                    arguments: args.to_string(),
                });
                s = next;
            }
            rest.push_str(s);
            if calls.is_empty() {
                return None;
            }
            let rest = rest.trim();
            Some(((!rest.is_empty()).then(|| rest.to_string()), calls))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hermes_calls_parse_out_of_free_text() {
        let text = "Sure.\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 1}}\n</tool_call>";
        let (rest, calls) = parse_tool_calls(&ToolMode::Auto, text).expect("a call");
        assert_eq!(rest.as_deref(), Some("Sure."));
        assert_eq!(calls.len(), 1);
        assert_eq!(calls[0].name, "f");
        assert_eq!(calls[0].arguments, r#"{"x":1}"#);
        assert!(parse_tool_calls(&ToolMode::Auto, "no calls here").is_none());
        assert!(parse_tool_calls(&ToolMode::Auto, "<tool_call>{oops</tool_call>").is_none());
    }

    #[test]
    fn lark_ids_are_distinct_and_plain() {
        let (a, b) = (lark_id("get-weather"), lark_id("get_weather"));
        assert_ne!(a, b);
        assert!(a.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'));
    }
}
