//! A client that sends a whole oversized body before reading still gets
//! its 413 (the server answers, then drains the rest), over a raw TCP
//! socket on loopback; and the server keeps serving afterwards.

mod common;

use common::{parse_response, post, start, API_KEY};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

const BODY: usize = 64 << 20;

/// Writes `head` and then `BODY` bytes in full (any write error fails the
/// test: the server must not reset the connection), then reads the answer.
fn send_all_then_read(addr: SocketAddr, head: &str, chunked: bool) -> common::Resp {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(120)))
        .expect("timeout");
    s.write_all(head.as_bytes()).expect("head");
    let block = vec![b'a'; 1 << 20];
    for _ in 0..BODY / block.len() {
        if chunked {
            s.write_all(format!("{:x}\r\n", block.len()).as_bytes())
                .expect("chunk size sent");
        }
        s.write_all(&block)
            .expect("the whole body is sent without a reset");
        if chunked {
            s.write_all(b"\r\n").expect("chunk end sent");
        }
    }
    if chunked {
        s.write_all(b"0\r\n\r\n").expect("last chunk sent");
    }
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).expect("the answer arrives");
    parse_response(&raw)
}

#[test]
fn oversized_bodies_get_413_after_the_client_sent_everything() {
    let srv = start(&[]);
    let auth = format!("Authorization: Bearer {API_KEY}\r\n");
    let base = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{auth}Content-Type: application/json\r\n"
    );
    let cases = [
        (
            "declared length",
            format!("{base}Content-Length: {BODY}\r\n\r\n"),
            false,
        ),
        (
            "chunked",
            format!("{base}Transfer-Encoding: chunked\r\n\r\n"),
            true,
        ),
    ];
    for (case, head, chunked) in cases {
        let r = send_all_then_read(srv.addr, &head, chunked);
        assert_eq!(r.status, 413, "{case}: {}", r.body);
        assert_eq!(r.json()["error"]["code"], 413, "{case}");
    }
    // Refused for another reason (no API key) with a large body: same care.
    let head = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {BODY}\r\n\r\n"
    );
    let r = send_all_then_read(srv.addr, &head, false);
    assert_eq!(r.status, 401, "{}", r.body);
    let ok = post(
        srv.addr,
        "/v1/completions",
        &serde_json::json!({"prompt": "Hi", "max_tokens": 1}),
    );
    assert_eq!(ok.status, 200, "{}", ok.body);
}
