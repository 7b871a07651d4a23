//! Structured outputs, tool calls and the remaining request checks over
//! real HTTP, SmolLM2 and the real engine.
//!
//! `official_openai_client_structured_outputs` runs
//! `tests/python/structured_openai.py` with the official `openai` client
//! (needs `pip install openai jsonschema`; without them it prints SKIP and
//! passes). The other tests use the hand-written client of `common`.

mod common;

use common::{post, start, TestServer, API_KEY};
use serde_json::{json, Value};
use std::process::Command;
use std::sync::OnceLock;

fn server() -> &'static TestServer {
    static S: OnceLock<TestServer> = OnceLock::new();
    S.get_or_init(|| start(&["--num-gpu-blocks-override", "2048"]))
}

fn chat(body: Value) -> common::Resp {
    post(server().addr, "/v1/chat/completions", &body)
}

#[test]
fn official_openai_client_structured_outputs() {
    let probe = Command::new("python3")
        .args(["-c", "import openai, jsonschema"])
        .output();
    match probe {
        Ok(o) if o.status.success() => {}
        Ok(o) => {
            eprintln!(
                "SKIP official_openai_client_structured_outputs: python3 cannot import openai/jsonschema \
                 (pip install openai jsonschema): {}",
                String::from_utf8_lossy(&o.stderr).trim()
            );
            return;
        }
        Err(e) => {
            eprintln!("SKIP official_openai_client_structured_outputs: no python3 ({e})");
            return;
        }
    }
    let s = server();
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/python/structured_openai.py"
    );
    // STRUCTURED_SECTIONS=tools,invalid runs a subset (while debugging).
    let sections = std::env::var("STRUCTURED_SECTIONS").unwrap_or_default();
    let mut args = vec![
        script.to_string(),
        format!("http://{}/v1", s.addr),
        API_KEY.to_string(),
        s.state.served_model_name.clone(),
    ];
    if !sections.is_empty() {
        args.push(sections);
    }
    let out = Command::new("python3")
        .args(&args)
        .output()
        .expect("python3 runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!("{stdout}");
    assert!(
        out.status.success(),
        "the openai-client checks failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("all structured-output checks passed"));
}

#[test]
fn logit_bias_forces_and_forbids_tokens() {
    let tok = &server().state.tokenizer;
    let id = |t: &str| {
        let ids = tok.encode(t, false).expect("encode");
        assert_eq!(ids.len(), 1, "{t:?} is one token");
        ids[0]
    };
    let (x, y) = (id(" banana"), id(" apple"));
    let body = json!({"prompt": "My favourite fruit is", "max_tokens": 4, "temperature": 0,
        "logit_bias": {x.to_string(): 100}});
    let r = post(server().addr, "/v1/completions", &body);
    assert_eq!(r.status, 200, "{}", r.body);
    let ids: Vec<u64> = {
        let mut b = body.clone();
        b["return_token_ids"] = json!(true);
        let v = post(server().addr, "/v1/completions", &b).json();
        v["choices"][0]["token_ids"]
            .as_array()
            .expect("ids")
            .iter()
            .map(|v| v.as_u64().expect("id"))
            .collect()
    };
    assert!(ids.iter().all(|&t| t == u64::from(x)), "{ids:?}");
    // -100 on the greedy choice removes it: first compute it unbiased.
    let plain = json!({"messages": [{"role": "user", "content": "Name a fruit."}],
        "max_tokens": 1, "temperature": 0, "return_token_ids": true});
    let first = chat(plain.clone()).json()["choices"][0]["token_ids"][0]
        .as_u64()
        .expect("id");
    let mut biased = plain;
    biased["logit_bias"] = json!({first.to_string(): -100, y.to_string(): 0.5});
    let second = chat(biased).json()["choices"][0]["token_ids"][0]
        .as_u64()
        .expect("id");
    assert_ne!(first, second, "a -100 bias must remove the greedy token");
}

#[test]
fn bad_requests_name_their_parameter() {
    let cases = [
        (
            json!({"messages": [{"role": "user"}]}),
            "messages",
            "no content",
        ),
        (json!({"messages": "hi"}), "", "invalid type"),
        (
            json!({"messages": [{"role": "user", "content": "x"}], "logit_bias": {"5": 101}}),
            "logit_bias",
            "[-100, 100]",
        ),
        (
            json!({"messages": [{"role": "user", "content": "x"}], "logit_bias": {"999999": 1}}),
            "logit_bias",
            "vocabulary",
        ),
        (
            json!({"messages": [{"role": "user", "content": "x"}], "temperature": 2.5}),
            "temperature",
            "[0, 2]",
        ),
        (
            json!({"messages": [{"role": "user", "content": "x"}],
                "response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "frobnicate"}}}}),
            "response_format",
            "invalid json_schema",
        ),
        (
            json!({"messages": [{"role": "user", "content": "x"}], "guided_regex": "[a-"}),
            "guided_regex",
            "invalid regex",
        ),
    ];
    for (body, param, needle) in cases {
        let r = chat(body.clone());
        assert_eq!(r.status, 400, "{body}: {}", r.body);
        let e = &r.json()["error"];
        let msg = e["message"].as_str().unwrap_or_default();
        assert!(msg.contains(needle), "{body}: {msg}");
        if !param.is_empty() {
            assert_eq!(e["param"], param, "{body}");
        }
    }
    // An assistant message with tool_calls may omit content.
    let ok = chat(json!({"messages": [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "tool_calls": [{"id": "c", "type": "function",
            "function": {"name": "w", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c", "content": "sunny"}],
        "max_tokens": 2}));
    assert_eq!(ok.status, 200, "{}", ok.body);
}
