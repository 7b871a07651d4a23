//! A client that disconnects mid-stream aborts its request: /metrics shows
//! the KV blocks back in the pool shortly after. Own server, so no other
//! test's requests hold blocks.

mod common;

use common::{get, metric, metric_where, post_unread, start};
use serde_json::json;
use std::io::Read;
use std::net::TcpStream;
use std::time::{Duration, Instant};

fn free_blocks(addr: std::net::SocketAddr) -> (f64, f64) {
    let body = get(addr, "/metrics").body;
    (
        metric(&body, "vllm:kv_cache_free_blocks"),
        metric(&body, "vllm:kv_cache_total_blocks"),
    )
}

#[test]
fn disconnect_mid_stream_frees_blocks() {
    // Prefix caching off: freed blocks go straight back to the free count.
    let srv = start(&[
        "--num-gpu-blocks-override",
        "128",
        "--enable-prefix-caching",
        "false",
    ]);
    let addr = srv.addr;
    let (free0, total) = free_blocks(addr);
    assert_eq!(free0, total, "idle server holds no block");

    let body = json!({
        "prompt": "Tell me a very long story about a dragon.", "max_tokens": 400,
        "temperature": 0, "ignore_eos": true, "stream": true,
    });
    let mut s = post_unread(addr, "/v1/completions", &body);
    // Read until a few events have arrived.
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while got.windows(6).filter(|w| w == b"data: ").count() < 4 {
        let n = s.read(&mut buf).expect("read");
        assert!(
            n > 0,
            "stream ended early: {}",
            String::from_utf8_lossy(&got)
        );
        got.extend_from_slice(&buf[..n]);
    }
    let (free_during, _) = free_blocks(addr);
    assert!(
        free_during < total,
        "the running request holds blocks ({free_during} of {total} free)"
    );
    drop(s);

    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (free, _) = free_blocks(addr);
        if free == total {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "blocks not freed after disconnect: {free} of {total}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let body = get(addr, "/metrics").body;
    assert_eq!(metric(&body, "vllm:num_requests_running"), 0.0);
    assert_eq!(
        metric_where(
            &body,
            "vllm:request_success_total",
            "finished_reason=\"abort\""
        ),
        1.0
    );
}

/// Opens a streaming request and waits for its response headers; the
/// returned socket keeps the request alive until dropped.
fn open_stream(addr: std::net::SocketAddr, prompt: &str) -> TcpStream {
    let body = json!({
        "prompt": prompt, "max_tokens": 400, "temperature": 0, "ignore_eos": true, "stream": true,
    });
    let mut s = post_unread(addr, "/v1/completions", &body);
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        assert_eq!(s.read(&mut byte).expect("read"), 1, "headers");
        head.push(byte[0]);
    }
    assert!(
        head.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&head)
    );
    s
}

#[test]
fn overload_answers_429_and_the_server_recovers() {
    // One running sequence at a time and one waiting request allowed.
    let srv = start(&[
        "--num-gpu-blocks-override",
        "128",
        "--max-num-seqs",
        "1",
        "--max-waiting-requests",
        "1",
    ]);
    let addr = srv.addr;
    let running = open_stream(addr, "First request");
    // The first request must be running (not waiting) before the second
    // arrives, or the second finds the one waiting place taken.
    wait_for_metric(addr, "vllm:num_requests_running", 1.0);
    let waiting = open_stream(addr, "Second request");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let body = get(addr, "/metrics").body;
        if metric(&body, "vllm:num_requests_waiting") == 1.0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "second request never waited:\n{body}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let r = common::post(
        addr,
        "/v1/completions",
        &json!({"prompt": "Third", "max_tokens": 2}),
    );
    assert_eq!(r.status, 429, "{}", r.body);
    assert_eq!(r.json()["error"]["code"], 429);
    drop(running);
    drop(waiting);
    // Once the aborts land, a new request is served.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let r = common::post(
            addr,
            "/v1/completions",
            &json!({"prompt": "Fourth", "max_tokens": 2}),
        );
        if r.status == 200 {
            assert_eq!(r.json()["usage"]["completion_tokens"], 2);
            break;
        }
        assert_eq!(r.status, 429, "{}", r.body);
        assert!(
            Instant::now() < deadline,
            "still overloaded after the clients left"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Polls `/metrics` until `name` reads `value` (30 s at most).
fn wait_for_metric(addr: std::net::SocketAddr, name: &str, value: f64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let body = get(addr, "/metrics").body;
        if metric(&body, name) == value {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{name} never reached {value}:\n{body}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}
