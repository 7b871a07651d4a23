//! OpenAI request bodies as serde sees them (wire types, not yet validated).
//! [`crate::validate`] turns them into typed requests exactly once.
//!
//! Unknown fields: the top-level request objects use
//! `#[serde(deny_unknown_fields)]`, because OpenAI answers 400
//! "Unrecognized request argument supplied" for them; nested objects that
//! OpenAI extends often (chat messages, content parts, `stream_options`)
//! tolerate unknown fields. Numbers are read as `i64`/`f64` so that negative
//! or fractional values reach validation and get a 400 with the parameter
//! name; a value of the wrong JSON type (a string for `max_tokens`) is a 400
//! from serde, as OpenAI and vLLM answer.

use serde::Deserialize;
use std::collections::HashMap;

/// `prompt`: a string, strings, token ids, or lists of token ids.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(untagged)]
pub enum PromptInput {
    Text(String),
    Texts(Vec<String>),
    Tokens(Vec<i64>),
    TokenBatch(Vec<Vec<i64>>),
}

/// `stop`: one string or several.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(untagged)]
pub enum StopInput {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Clone, Deserialize, PartialEq, Default)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: Option<bool>,
    #[serde(default)]
    pub continuous_usage_stats: Option<bool>,
}

/// A chat message's `content`: a string or a list of parts.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(untagged)]
pub enum MessageContent {
    Text(String),
    Parts(Vec<ContentPart>),
}

/// One content part; only `{"type": "text", "text": ...}` is served.
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub text: Option<String>,
}

/// One chat message (unknown fields are tolerated).
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct ChatMessageIn {
    pub role: String,
    #[serde(default)]
    pub content: Option<MessageContent>,
    #[serde(default)]
    pub name: Option<String>,
    /// An assistant message's tool calls.
    #[serde(default)]
    pub tool_calls: Option<Vec<ToolCallIn>>,
    /// A `tool` message's answer to this call id.
    #[serde(default)]
    pub tool_call_id: Option<String>,
}

/// A tool call in an assistant message of the history.
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct ToolCallIn {
    #[serde(default)]
    pub id: Option<String>,
    #[serde(rename = "type", default)]
    pub kind: Option<String>,
    pub function: FunctionCallIn,
}

/// `{"name", "arguments"}`; `arguments` is a JSON text (OpenAI's form).
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct FunctionCallIn {
    pub name: String,
    #[serde(default)]
    pub arguments: Option<String>,
}

/// One entry of `tools`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ToolIn {
    #[serde(rename = "type")]
    pub kind: String,
    pub function: FunctionDefIn,
}

/// A function the model may call.
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct FunctionDefIn {
    pub name: String,
    #[serde(default)]
    pub description: Option<String>,
    /// The arguments' JSON schema.
    #[serde(default)]
    pub parameters: Option<serde_json::Value>,
    #[serde(default)]
    pub strict: Option<bool>,
}

/// `response_format`: `{"type": "text" | "json_object" | "json_schema",
/// "json_schema": {"name", "schema", "strict", "description"}}`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ResponseFormat {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub json_schema: Option<JsonSchemaFormat>,
}

/// `response_format.json_schema`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct JsonSchemaFormat {
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub description: Option<String>,
    #[serde(default)]
    pub schema: Option<serde_json::Value>,
    #[serde(default)]
    pub strict: Option<bool>,
}

/// vLLM's `structured_outputs`: exactly one of the constraints.
#[derive(Debug, Clone, Deserialize, PartialEq, Default)]
#[serde(deny_unknown_fields)]
pub struct StructuredOutputsIn {
    /// A JSON schema (an object, or its JSON text).
    #[serde(default)]
    pub json: Option<serde_json::Value>,
    #[serde(default)]
    pub regex: Option<String>,
    #[serde(default)]
    pub choice: Option<Vec<String>>,
    /// A Lark grammar (as `llguidance` reads it).
    #[serde(default)]
    pub grammar: Option<String>,
    #[serde(default)]
    pub json_object: Option<bool>,
}

/// Declares [`CommonParams`] and both request types from one list of the
/// fields the endpoints share, and `common()` to copy them out. serde's
/// `flatten` does not combine with `deny_unknown_fields`, so the shared
/// fields are spelled once here and expanded into each request.
macro_rules! requests_with_shared_fields {
    ($($(#[$doc:meta])* $f:ident: $t:ty,)*) => {
        /// Fields shared by both endpoints: what validation reads.
        #[derive(Debug, Clone, Default, PartialEq)]
        pub struct CommonParams {
            /// `max_tokens` (chat: `max_completion_tokens` first).
            pub max_tokens: Option<i64>,
            $($(#[$doc])* pub $f: $t,)*
        }

        /// `POST /v1/completions`.
        #[derive(Debug, Clone, Deserialize, PartialEq)]
        #[serde(deny_unknown_fields)]
        pub struct CompletionRequest {
            #[serde(default)]
            pub model: Option<String>,
            pub prompt: PromptInput,
            #[serde(default)]
            pub suffix: Option<String>,
            #[serde(default)]
            pub echo: Option<bool>,
            #[serde(default)]
            pub logprobs: Option<i64>,
            #[serde(default)]
            pub user: Option<String>,
            #[serde(default)]
            pub max_tokens: Option<i64>,
            $($(#[$doc])* #[serde(default)] pub $f: $t,)*
        }

        /// `POST /v1/chat/completions`.
        #[derive(Debug, Clone, Deserialize, PartialEq)]
        #[serde(deny_unknown_fields)]
        pub struct ChatRequest {
            #[serde(default)]
            pub model: Option<String>,
            pub messages: Vec<ChatMessageIn>,
            #[serde(default)]
            pub logprobs: Option<bool>,
            #[serde(default)]
            pub top_logprobs: Option<i64>,
            #[serde(default)]
            pub max_completion_tokens: Option<i64>,
            #[serde(default)]
            pub add_generation_prompt: Option<bool>,
            #[serde(default)]
            pub tools: Option<Vec<ToolIn>>,
            /// "none" | "auto" | "required" | {"type": "function",
            /// "function": {"name": ...}}.
            #[serde(default)]
            pub tool_choice: Option<serde_json::Value>,
            #[serde(default)]
            pub parallel_tool_calls: Option<bool>,
            #[serde(default)]
            pub user: Option<String>,
            #[serde(default)]
            pub max_tokens: Option<i64>,
            $($(#[$doc])* #[serde(default)] pub $f: $t,)*
        }

        impl CompletionRequest {
            /// The shared parameters.
            pub fn common(&self) -> CommonParams {
                CommonParams { max_tokens: self.max_tokens, $($f: copied(&self.$f),)* }
            }
        }

        impl ChatRequest {
            /// The shared parameters (`max_completion_tokens` wins over the
            /// deprecated `max_tokens`).
            pub fn common(&self) -> CommonParams {
                CommonParams {
                    max_tokens: self.max_completion_tokens.or(self.max_tokens),
                    $($f: copied(&self.$f),)*
                }
            }
        }
    };
}

fn copied<T: Clone>(v: &T) -> T {
    v.clone()
}

requests_with_shared_fields! {
    temperature: Option<f64>,
    top_p: Option<f64>,
    n: Option<i64>,
    best_of: Option<i64>,
    stop: Option<StopInput>,
    stream: Option<bool>,
    stream_options: Option<StreamOptions>,
    seed: Option<i64>,
    presence_penalty: Option<f64>,
    frequency_penalty: Option<f64>,
    logit_bias: Option<HashMap<String, f64>>,
    ignore_eos: Option<bool>,
    min_tokens: Option<i64>,
    top_k: Option<i64>,
    min_p: Option<f64>,
    repetition_penalty: Option<f64>,
    stop_token_ids: Option<Vec<i64>>,
    return_token_ids: Option<bool>,
    use_beam_search: Option<bool>,
    length_penalty: Option<f64>,
    /// vLLM's extra parameter: top-k per prompt token (0..=20).
    prompt_logprobs: Option<i64>,
    /// vLLM's beam-search `early_stopping`: any JSON value here, so that a
    /// non-boolean is a 400 naming the parameter (see validation).
    early_stopping: Option<serde_json::Value>,
    /// OpenAI's `response_format` (json_object / json_schema / text).
    response_format: Option<ResponseFormat>,
    /// vLLM's `structured_outputs`.
    structured_outputs: Option<StructuredOutputsIn>,
    /// vLLM's older names for the same constraints.
    guided_json: Option<serde_json::Value>,
    guided_regex: Option<String>,
    guided_choice: Option<Vec<String>>,
    guided_grammar: Option<String>,
    /// Accepted for compatibility; the backend is always llguidance.
    guided_decoding_backend: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompt_shapes_parse() {
        let p = |s: &str| serde_json::from_str::<PromptInput>(s).expect("parses");
        assert_eq!(p("\"hi\""), PromptInput::Text("hi".into()));
        assert_eq!(
            p("[\"a\",\"b\"]"),
            PromptInput::Texts(vec!["a".into(), "b".into()])
        );
        assert_eq!(p("[1,2]"), PromptInput::Tokens(vec![1, 2]));
        assert_eq!(
            p("[[1],[2,3]]"),
            PromptInput::TokenBatch(vec![vec![1], vec![2, 3]])
        );
        assert!(serde_json::from_str::<PromptInput>("{}").is_err());
    }

    #[test]
    fn unknown_top_level_field_is_refused() {
        let r = serde_json::from_str::<CompletionRequest>(r#"{"prompt":"x","frobnicate":1}"#);
        assert!(r.is_err());
        let ok = serde_json::from_str::<ChatRequest>(
            r#"{"messages":[{"role":"user","content":"x","tool_call_id":"t"}],
                "stream_options":{"include_usage":true,"other":1}}"#,
        );
        assert!(ok.is_ok(), "{ok:?}");
    }

    #[test]
    fn vllm_extra_parameters_parse() {
        let r = serde_json::from_str::<CompletionRequest>(
            r#"{"prompt":"x","prompt_logprobs":3,"early_stopping":"never"}"#,
        )
        .expect("parses");
        assert_eq!(r.common().prompt_logprobs, Some(3));
        assert_eq!(r.common().early_stopping, Some(serde_json::json!("never")));
        let c = serde_json::from_str::<ChatRequest>(
            r#"{"messages":[],"prompt_logprobs":-1,"early_stopping":true}"#,
        )
        .expect("parses");
        assert_eq!(c.common().prompt_logprobs, Some(-1));
        assert_eq!(c.common().early_stopping, Some(serde_json::json!(true)));
    }
}
