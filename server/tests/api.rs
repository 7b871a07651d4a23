//! The API over real HTTP on loopback, with the real model (SmolLM2-135M
//! at the default path) and the real engine: both endpoints streaming and
//! not, n = 3, stop strings, logprobs, usage, echo, batches, token ids,
//! 64 concurrent streams, and /metrics.

mod common;

use common::{get, post, start, TestServer};
use serde_json::{json, Value};
use std::sync::OnceLock;

fn server() -> &'static TestServer {
    static S: OnceLock<TestServer> = OnceLock::new();
    S.get_or_init(|| start(&["--num-gpu-blocks-override", "1024"]))
}

/// The tokenizer, loaded on its own from the model file (not through the
/// server), to check the server's token counts and text.
fn tokenizer() -> &'static model_loader::Tokenizer {
    static T: OnceLock<model_loader::Tokenizer> = OnceLock::new();
    T.get_or_init(|| {
        model_loader::load_config_and_tokenizer(&model_loader::paths::default_model_path())
            .expect("tokenizer loads")
            .tokenizer
    })
}

/// Parses a stream's events: JSON chunks then `[DONE]`.
fn chunks(resp: &common::Resp) -> Vec<Value> {
    assert_eq!(resp.status, 200, "{}", resp.body);
    assert_eq!(resp.header("content-type"), Some("text/event-stream"));
    let events = resp.sse_events();
    assert_eq!(
        events.last().map(String::as_str),
        Some("[DONE]"),
        "{events:?}"
    );
    events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap_or_else(|err| panic!("bad chunk {e}: {err}")))
        .collect()
}

/// Concatenated text per choice index, and finish reasons.
fn stream_text(chunks: &[Value], chat: bool) -> (Vec<String>, Vec<Option<String>>) {
    let mut texts = Vec::new();
    let mut reasons = Vec::new();
    for c in chunks {
        for ch in c["choices"].as_array().expect("choices") {
            let i = ch["index"].as_u64().expect("index") as usize;
            if texts.len() <= i {
                texts.resize(i + 1, String::new());
                reasons.resize(i + 1, None);
            }
            let t = if chat {
                &ch["delta"]["content"]
            } else {
                &ch["text"]
            };
            texts[i].push_str(t.as_str().unwrap_or(""));
            if let Some(r) = ch["finish_reason"].as_str() {
                assert!(reasons[i].is_none(), "choice {i} finished twice");
                reasons[i] = Some(r.to_string());
            }
        }
    }
    (texts, reasons)
}

const PROMPT: &str = "The capital of France is";

#[test]
fn completion_non_streaming_usage_and_token_ids() {
    let addr = server().addr;
    let r = post(
        addr,
        "/v1/completions",
        &json!({
            "prompt": PROMPT, "max_tokens": 8, "temperature": 0, "ignore_eos": true, "return_token_ids": true,
        }),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["object"], "text_completion");
    let ch = &v["choices"][0];
    assert_eq!(ch["finish_reason"], "length");
    let ids: Vec<u32> = serde_json::from_value(ch["token_ids"].clone()).expect("token ids");
    assert_eq!(ids.len(), 8);
    let expect_text = tokenizer().decode(&ids, true).expect("decode");
    assert_eq!(ch["text"].as_str(), Some(expect_text.as_str()));
    let prompt_ids = tokenizer().encode(PROMPT, true).expect("encode");
    assert_eq!(ch["prompt_token_ids"], json!(prompt_ids));
    assert_eq!(v["usage"]["prompt_tokens"], prompt_ids.len());
    assert_eq!(v["usage"]["completion_tokens"], 8);
    assert_eq!(v["usage"]["total_tokens"], prompt_ids.len() + 8);
}

#[test]
fn completion_streaming_matches_non_streaming_and_reports_usage() {
    let addr = server().addr;
    let body = json!({"prompt": PROMPT, "max_tokens": 12, "temperature": 0, "ignore_eos": true});
    let full = post(addr, "/v1/completions", &body).json();
    let mut sbody = body.clone();
    sbody["stream"] = json!(true);
    sbody["stream_options"] = json!({"include_usage": true});
    let cs = chunks(&post(addr, "/v1/completions", &sbody));
    let (texts, reasons) = stream_text(&cs, false);
    assert_eq!(texts[0], full["choices"][0]["text"].as_str().expect("text"));
    assert_eq!(reasons[0].as_deref(), Some("length"));
    let last = cs.last().expect("usage chunk");
    assert_eq!(last["choices"], json!([]));
    assert_eq!(last["usage"]["completion_tokens"], 12);
    assert_eq!(last["usage"], full["usage"]);
    assert!(cs
        .iter()
        .all(|c| c["object"] == "text_completion" && c["id"] == cs[0]["id"]));
}

#[test]
fn chat_non_streaming_and_streaming_agree() {
    let addr = server().addr;
    let body = json!({
        "messages": [{"role": "system", "content": "You are brief."}, {"role": "user", "content": "What is 2+2?"}],
        "max_tokens": 10, "temperature": 0,
    });
    let r = post(addr, "/v1/chat/completions", &body);
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["object"], "chat.completion");
    let msg = &v["choices"][0]["message"];
    assert_eq!(msg["role"], "assistant");
    let text = msg["content"].as_str().expect("content");
    assert!(!text.is_empty());
    assert!(
        !text.contains("<|im_end|>"),
        "special tokens are not in the text"
    );
    let reason = v["choices"][0]["finish_reason"].as_str().expect("reason");
    assert!(reason == "stop" || reason == "length");
    let completion = v["usage"]["completion_tokens"].as_u64().expect("usage");
    assert!((1..=10).contains(&completion));

    let mut sbody = body.clone();
    sbody["stream"] = json!(true);
    let cs = chunks(&post(addr, "/v1/chat/completions", &sbody));
    assert_eq!(cs[0]["choices"][0]["delta"]["role"], "assistant");
    assert!(cs.iter().all(|c| c["object"] == "chat.completion.chunk"));
    let (texts, reasons) = stream_text(&cs, true);
    assert_eq!(texts[0], text);
    assert_eq!(reasons[0].as_deref(), Some(reason));
}

#[test]
fn n_equals_three_gives_three_choices_both_ways() {
    let addr = server().addr;
    let body = json!({"prompt": "Once upon a time", "max_tokens": 5, "n": 3, "temperature": 0, "ignore_eos": true});
    let v = post(addr, "/v1/completions", &body).json();
    let choices = v["choices"].as_array().expect("choices");
    assert_eq!(choices.len(), 3);
    for (i, c) in choices.iter().enumerate() {
        assert_eq!(c["index"], i);
        assert_eq!(c["finish_reason"], "length");
    }
    assert_eq!(v["usage"]["completion_tokens"], 15);
    let mut sbody = body.clone();
    sbody["stream"] = json!(true);
    let (texts, reasons) = stream_text(&chunks(&post(addr, "/v1/completions", &sbody)), false);
    assert_eq!(texts.len(), 3);
    assert!(reasons.iter().all(|r| r.as_deref() == Some("length")));
    // Greedy: every choice equals the non-streamed one.
    for (i, t) in texts.iter().enumerate() {
        assert_eq!(Some(t.as_str()), choices[i]["text"].as_str());
    }
}

#[test]
fn stop_strings_cut_the_text_and_are_never_streamed() {
    let addr = server().addr;
    let base =
        json!({"prompt": "1, 2, 3, 4, 5,", "max_tokens": 24, "temperature": 0, "ignore_eos": true});
    let full = post(addr, "/v1/completions", &base).json();
    let text = full["choices"][0]["text"]
        .as_str()
        .expect("text")
        .to_string();
    // A stop string from the middle of the greedy output.
    let chars: Vec<char> = text.chars().collect();
    assert!(chars.len() >= 8, "need some output: {text:?}");
    let stop: String = chars[4..7].iter().collect();
    let cut = &text[..text.find(&stop).expect("present")];

    let mut body = base.clone();
    body["stop"] = json!([stop.clone(), "never-appears-xyz"]);
    let v = post(addr, "/v1/completions", &body).json();
    assert_eq!(v["choices"][0]["text"].as_str(), Some(cut));
    assert_eq!(v["choices"][0]["finish_reason"], "stop");

    body["stream"] = json!(true);
    let cs = chunks(&post(addr, "/v1/completions", &body));
    let (texts, reasons) = stream_text(&cs, false);
    assert_eq!(texts[0], cut);
    assert_eq!(reasons[0].as_deref(), Some("stop"));
    assert!(!texts[0].contains(&stop));
}

#[test]
fn logprobs_in_each_endpoints_format() {
    let addr = server().addr;
    let v = post(
        addr,
        "/v1/completions",
        &json!({
            "prompt": PROMPT, "max_tokens": 4, "temperature": 0, "logprobs": 1, "ignore_eos": true,
        }),
    )
    .json();
    let lp = &v["choices"][0]["logprobs"];
    let lps = lp["token_logprobs"].as_array().expect("token_logprobs");
    assert_eq!(lps.len(), 4);
    assert!(lps
        .iter()
        .all(|x| x.as_f64().is_some_and(|f| f <= 0.0 && f.is_finite())));
    assert_eq!(lp["tokens"].as_array().map(Vec::len), Some(4));
    assert_eq!(lp["text_offset"].as_array().map(Vec::len), Some(4));
    assert_eq!(lp["text_offset"][0], 0);
    let joined: String = lp["tokens"]
        .as_array()
        .expect("tokens")
        .iter()
        .filter_map(|t| t.as_str())
        .collect();
    assert_eq!(Some(joined.as_str()), v["choices"][0]["text"].as_str());

    let v = post(
        addr,
        "/v1/chat/completions",
        &json!({
            "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3, "temperature": 0,
            "logprobs": true, "top_logprobs": 1, "ignore_eos": true,
        }),
    )
    .json();
    let content = v["choices"][0]["logprobs"]["content"]
        .as_array()
        .expect("content");
    assert_eq!(content.len(), 3);
    for e in content {
        assert!(e["token"].as_str().is_some());
        assert!(e["logprob"].as_f64().is_some_and(|f| f <= 0.0));
        assert!(e["bytes"].as_array().is_some());
        assert_eq!(e["top_logprobs"][0]["token"], e["token"]);
    }
}

#[test]
fn batch_prompts_token_prompts_and_echo() {
    let addr = server().addr;
    let ids = tokenizer().encode(PROMPT, true).expect("encode");
    let v = post(
        addr,
        "/v1/completions",
        &json!({
            "prompt": [PROMPT, "Hello"], "max_tokens": 4, "temperature": 0, "ignore_eos": true,
        }),
    )
    .json();
    assert_eq!(v["choices"].as_array().map(Vec::len), Some(2));
    let by_ids = post(
        addr,
        "/v1/completions",
        &json!({
            "prompt": [ids.clone()], "max_tokens": 4, "temperature": 0, "ignore_eos": true,
        }),
    )
    .json();
    assert_eq!(by_ids["choices"][0]["text"], v["choices"][0]["text"]);
    assert_eq!(by_ids["usage"]["prompt_tokens"], ids.len());
    let echo = post(
        addr,
        "/v1/completions",
        &json!({
            "prompt": PROMPT, "max_tokens": 4, "temperature": 0, "ignore_eos": true, "echo": true,
        }),
    )
    .json();
    let expect = format!(
        "{PROMPT}{}",
        v["choices"][0]["text"].as_str().expect("text")
    );
    assert_eq!(echo["choices"][0]["text"].as_str(), Some(expect.as_str()));
}

#[test]
fn sixty_four_concurrent_streams_complete() {
    let addr = server().addr;
    let handles: Vec<_> = (0..64)
        .map(|i| {
            std::thread::spawn(move || {
                let body = json!({
                    "prompt": format!("Request number {i}:"), "max_tokens": 6, "temperature": 0,
                    "ignore_eos": true, "stream": true,
                });
                let cs = chunks(&post(addr, "/v1/completions", &body));
                let (texts, reasons) = stream_text(&cs, false);
                assert_eq!(texts.len(), 1);
                assert_eq!(reasons[0].as_deref(), Some("length"), "request {i}");
            })
        })
        .collect();
    for h in handles {
        h.join().expect("client thread");
    }
}

#[test]
fn models_and_metrics() {
    let addr = server().addr;
    let m = get(addr, "/v1/models").json();
    assert_eq!(m["object"], "list");
    assert_eq!(m["data"][0]["id"], "SmolLM2-135M-Instruct.Q4_1");
    assert_eq!(m["data"][0]["max_model_len"], 512);
    let r = post(
        addr,
        "/v1/completions",
        &json!({"prompt": "Hi", "max_tokens": 2, "ignore_eos": true}),
    );
    assert_eq!(r.status, 200);
    let body = get(addr, "/metrics").body;
    assert_eq!(common::metric(&body, "vllm:kv_cache_total_blocks"), 1024.0);
    assert!(common::metric(&body, "vllm:generation_tokens_total") >= 2.0);
    assert!(common::metric(&body, "vllm:prompt_tokens_total") >= 1.0);
    assert!(common::metric(&body, "vllm:time_to_first_token_seconds_count") >= 1.0);
    assert!(common::metric(&body, "vllm:e2e_request_latency_seconds_count") >= 1.0);
    for name in [
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:num_requests_swapped",
        "vllm:kv_cache_usage_perc",
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
        "vllm:inter_token_latency_seconds_count",
    ] {
        common::metric(&body, name);
    }
    common::metric_where(&body, "vllm:num_preemptions_by_mode_total", "mode=\"swap\"");
    common::metric_where(
        &body,
        "vllm:num_preemptions_by_mode_total",
        "mode=\"recompute\"",
    );
    common::metric(&body, "vllm:num_preemptions_total");
}
