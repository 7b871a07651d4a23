//! Bad input over real HTTP: each case gets its status and an OpenAI-style
//! error body, and the server keeps serving (a good request succeeds after
//! every bad one). The server runs the real model and engine.

mod common;

use common::{post, raw_request, send_raw, start, API_KEY};
use serde_json::json;

fn assert_error(resp: &common::Resp, status: u16, case: &str) {
    assert_eq!(resp.status, status, "{case}: body {}", resp.body);
    let v = resp.json();
    let e = &v["error"];
    assert!(
        e["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{case}: message in {v}"
    );
    assert!(e["type"].as_str().is_some(), "{case}: type in {v}");
    assert!(e.get("param").is_some(), "{case}: param in {v}");
    assert_eq!(e["code"], status, "{case}: code in {v}");
}

#[test]
fn bad_inputs_get_typed_errors_and_the_server_keeps_serving() {
    let srv = start(&["--num-gpu-blocks-override", "256"]);
    let addr = srv.addr;
    let auth = format!("Bearer {API_KEY}");
    let json_headers = [
        ("Authorization", auth.as_str()),
        ("Content-Type", "application/json"),
    ];
    let good = json!({"prompt": "Hello", "max_tokens": 2, "temperature": 0});

    let big = format!("{{\"prompt\": \"{}\"}}", "a".repeat(5 << 20));
    let long_prompt: Vec<u32> = vec![100; 500];
    let raw_cases: Vec<(&str, Vec<u8>, u16)> = vec![
        (
            "malformed JSON",
            raw_request(
                "POST",
                "/v1/completions",
                &json_headers,
                b"{\"prompt\": \"hi\"",
            ),
            400,
        ),
        (
            "empty body",
            raw_request("POST", "/v1/completions", &json_headers, b""),
            400,
        ),
        (
            "not an object",
            raw_request("POST", "/v1/completions", &json_headers, b"[1,2]"),
            400,
        ),
        (
            "body too large",
            raw_request("POST", "/v1/completions", &json_headers, big.as_bytes()),
            413,
        ),
        (
            "wrong method on completions",
            raw_request("GET", "/v1/completions", &json_headers, b""),
            405,
        ),
        (
            "wrong method on models",
            raw_request("POST", "/v1/models", &json_headers, b"{}"),
            405,
        ),
        (
            "unknown path",
            raw_request("GET", "/v1/nope", &json_headers, b""),
            404,
        ),
        (
            "missing API key",
            raw_request(
                "POST",
                "/v1/completions",
                &[("Content-Type", "application/json")],
                good.to_string().as_bytes(),
            ),
            401,
        ),
        (
            "wrong API key",
            raw_request(
                "GET",
                "/v1/models",
                &[("Authorization", "Bearer nope")],
                b"",
            ),
            401,
        ),
        (
            "missing API key on metrics",
            raw_request("GET", "/metrics", &[], b""),
            401,
        ),
        (
            "text/plain body",
            raw_request(
                "POST",
                "/v1/completions",
                &[
                    ("Authorization", auth.as_str()),
                    ("Content-Type", "text/plain"),
                ],
                good.to_string().as_bytes(),
            ),
            415,
        ),
    ];
    let json_cases: Vec<(&str, &str, serde_json::Value, u16)> = vec![
        (
            "max_tokens of wrong type",
            "/v1/completions",
            json!({"prompt": "hi", "max_tokens": "ten"}),
            400,
        ),
        (
            "stream of wrong type",
            "/v1/completions",
            json!({"prompt": "hi", "stream": "yes"}),
            400,
        ),
        (
            "prompt of wrong type",
            "/v1/completions",
            json!({"prompt": {"text": "hi"}}),
            400,
        ),
        (
            "missing prompt",
            "/v1/completions",
            json!({"max_tokens": 3}),
            400,
        ),
        (
            "unknown field",
            "/v1/completions",
            json!({"prompt": "hi", "frobnicate": true}),
            400,
        ),
        (
            "temperature too high",
            "/v1/completions",
            json!({"prompt": "hi", "temperature": 3.0}),
            400,
        ),
        (
            "top_p zero",
            "/v1/completions",
            json!({"prompt": "hi", "top_p": 0}),
            400,
        ),
        (
            "n zero",
            "/v1/completions",
            json!({"prompt": "hi", "n": 0}),
            400,
        ),
        (
            "best_of below n",
            "/v1/completions",
            json!({"prompt": "hi", "n": 3, "best_of": 2}),
            400,
        ),
        (
            "negative max_tokens",
            "/v1/completions",
            json!({"prompt": "hi", "max_tokens": -1}),
            400,
        ),
        (
            "zero max_tokens",
            "/v1/completions",
            json!({"prompt": "hi", "max_tokens": 0}),
            400,
        ),
        (
            "presence_penalty out of range",
            "/v1/completions",
            json!({"prompt": "hi", "presence_penalty": 5}),
            400,
        ),
        (
            "top_k -2",
            "/v1/completions",
            json!({"prompt": "hi", "top_k": -2}),
            400,
        ),
        (
            "logprobs above 20",
            "/v1/completions",
            json!({"prompt": "hi", "logprobs": 21}),
            400,
        ),
        (
            "too many stop strings",
            "/v1/completions",
            json!({"prompt": "hi", "stop": ["a", "b", "c", "d", "e"]}),
            400,
        ),
        (
            "empty stop string",
            "/v1/completions",
            json!({"prompt": "hi", "stop": ""}),
            400,
        ),
        (
            "empty prompt",
            "/v1/completions",
            json!({"prompt": ""}),
            400,
        ),
        (
            "empty prompt list",
            "/v1/completions",
            json!({"prompt": []}),
            400,
        ),
        (
            "token id outside the vocabulary",
            "/v1/completions",
            json!({"prompt": [1, 99999999]}),
            400,
        ),
        (
            "negative token id",
            "/v1/completions",
            json!({"prompt": [[1, -5]]}),
            400,
        ),
        (
            "prompt + max_tokens beyond max_model_len",
            "/v1/completions",
            json!({"prompt": long_prompt, "max_tokens": 64}),
            400,
        ),
        (
            "unknown model",
            "/v1/completions",
            json!({"prompt": "hi", "model": "gpt-9"}),
            404,
        ),
        (
            "stream_options without stream",
            "/v1/completions",
            json!({"prompt": "hi", "stream_options": {"include_usage": true}}),
            400,
        ),
        (
            "chat: empty messages",
            "/v1/chat/completions",
            json!({"messages": []}),
            400,
        ),
        (
            "chat: unknown role",
            "/v1/chat/completions",
            json!({"messages": [{"role": "wizard", "content": "hi"}]}),
            400,
        ),
        (
            "chat: top_logprobs without logprobs",
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2}),
            400,
        ),
        (
            "chat: image content part",
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}),
            400,
        ),
        (
            "chat: messages of wrong type",
            "/v1/chat/completions",
            json!({"messages": "hello"}),
            400,
        ),
        (
            "chat: unknown model",
            "/v1/chat/completions",
            json!({"model": "nope", "messages": [{"role": "user", "content": "hi"}]}),
            404,
        ),
    ];
    let count = raw_cases.len() + json_cases.len();
    assert!(count >= 20, "at least 20 cases, have {count}");

    let check_good = |after: &str| {
        let r = post(addr, "/v1/completions", &good);
        assert_eq!(r.status, 200, "good request after {after}: {}", r.body);
        let v = r.json();
        assert!(v["choices"][0]["finish_reason"].as_str().is_some(), "{v}");
    };
    for (case, bytes, status) in raw_cases {
        assert_error(&send_raw(addr, &bytes), status, case);
        check_good(case);
    }
    for (case, path, body, status) in json_cases {
        assert_error(&post(addr, path, &body), status, case);
        check_good(case);
    }
    // Allow header on 405.
    let r = send_raw(
        addr,
        &raw_request("GET", "/v1/chat/completions", &json_headers, b""),
    );
    assert_eq!(r.header("allow"), Some("POST"));
    // /health needs no key.
    let r = send_raw(addr, &raw_request("GET", "/health", &[], b""));
    assert_eq!(r.status, 200);
}
