//! A streaming client that stops reading (but keeps its connection open):
//! the server does not buffer its tokens without limit. Once the socket,
//! the SSE channel and the engine stream are full for longer than
//! `--stream-stall-timeout`, the request is aborted and /metrics shows every
//! KV block back, while the client is still connected and before the
//! request could have finished. The tiny model generates fast; logprobs
//! make each event large so that the socket buffers fill.

mod common;

use common::{get, metric, post_unread, start};
use serde_json::json;
use std::time::{Duration, Instant};

#[test]
fn a_client_that_stops_reading_has_its_request_aborted_and_blocks_freed() {
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("slow-reader-tiny");
    let tiny = model_loader::tiny::write_tiny_model(&dir).expect("tiny model");
    let tiny = tiny.gguf.to_str().expect("utf-8 path").to_string();
    let srv = start(&[
        "--model",
        &tiny,
        "--enable-prefix-caching",
        "false",
        "--stream-buffer",
        "2",
        "--stream-stall-timeout",
        "0.05",
    ]);
    let addr = srv.addr;
    let (n, max_tokens) = (16u64, 500u64);
    let body = json!({
        "prompt": "Hello", "max_tokens": max_tokens, "n": n, "temperature": 1.0, "seed": 1,
        "ignore_eos": true, "logprobs": 20, "stream": true,
    });
    let client = post_unread(addr, "/v1/completions", &body);
    // The client never reads. Wait for the engine to be idle again.
    let deadline = Instant::now() + Duration::from_secs(120);
    let m = loop {
        let m = get(addr, "/metrics").body;
        let idle = metric(&m, "vllm:num_requests_running") == 0.0
            && metric(&m, "vllm:num_requests_waiting") == 0.0
            && metric(&m, "vllm:generation_tokens_total") > 0.0;
        if idle {
            break m;
        }
        assert!(Instant::now() < deadline, "the request never stopped:\n{m}");
        std::thread::sleep(Duration::from_millis(50));
    };
    let generated = metric(&m, "vllm:generation_tokens_total");
    assert!(
        generated < (n * max_tokens) as f64,
        "the request ran to its end ({generated} tokens): nothing stopped it"
    );
    assert_eq!(
        metric(&m, "vllm:kv_cache_free_blocks"),
        metric(&m, "vllm:kv_cache_total_blocks"),
        "every block is back"
    );
    // The client is still connected; the server still serves others.
    let ok = common::post(
        addr,
        "/v1/completions",
        &json!({"prompt": "Hi", "max_tokens": 2}),
    );
    assert_eq!(ok.status, 200, "{}", ok.body);
    drop(client);
}
