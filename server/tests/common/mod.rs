//! Test support: start the real server (real model, real engine) on a
//! loopback port, and a small hand-written HTTP/1.1 client over TcpStream.

#![allow(dead_code)]

use clap::Parser;
use server::cli::Cli;
use server::http::{self, AppState};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::Duration;

pub const API_KEY: &str = "test-key";

/// A running server.
pub struct TestServer {
    pub addr: SocketAddr,
    pub state: Arc<AppState>,
}

/// Starts the server with the default model and `extra` CLI flags; it runs
/// on its own runtime thread until the test process exits.
pub fn start(extra: &[&str]) -> TestServer {
    let mut argv = vec!["--api-key", API_KEY];
    argv.extend_from_slice(extra);
    start_open(&argv)
}

/// As [`start`], without an API key (for clients such as a router that
/// send none).
pub fn start_open(extra: &[&str]) -> TestServer {
    let mut argv = vec!["server", "--max-model-len", "512", "--threads", "2"];
    argv.extend_from_slice(extra);
    let cli = Cli::try_parse_from(argv).expect("test flags parse");
    let state =
        Arc::new(server::app::build_state(&cli.serve).expect(
            "the real model must load (run `cargo xtask fetch-model` for the default model)",
        ));
    let (tx, rx) = std::sync::mpsc::channel();
    let st = Arc::clone(&state);
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind");
            tx.send(listener.local_addr().expect("addr"))
                .expect("send addr");
            http::serve(listener, st, std::future::pending(), Duration::from_secs(1))
                .await
                .expect("serve");
        });
    });
    let addr = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("server started");
    TestServer { addr, state }
}

/// A parsed HTTP response.
#[derive(Debug)]
pub struct Resp {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Resp {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("body is not JSON ({e}): {}", self.body))
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The SSE `data:` payloads, in order.
    pub fn sse_events(&self) -> Vec<String> {
        assert!(
            self.body.ends_with("\n\n"),
            "an SSE body ends with a blank line: {:?}",
            self.body
        );
        self.body
            .split("\n\n")
            .filter(|e| !e.is_empty())
            .map(|e| {
                e.strip_prefix("data: ")
                    .unwrap_or_else(|| panic!("event without `data: `: {e:?}"))
                    .to_string()
            })
            .collect()
    }
}

/// Raw request bytes: method, path, headers, body.
pub fn raw_request(method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Vec<u8> {
    let mut r = format!("{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n");
    for (k, v) in headers {
        r.push_str(&format!("{k}: {v}\r\n"));
    }
    r.push_str(&format!("Content-Length: {}\r\n\r\n", body.len()));
    let mut bytes = r.into_bytes();
    bytes.extend_from_slice(body);
    bytes
}

fn dechunk(mut body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let line_end = body
            .windows(2)
            .position(|w| w == b"\r\n")
            .expect("chunk size line");
        let size_str = std::str::from_utf8(&body[..line_end]).expect("ascii size");
        let size = usize::from_str_radix(size_str.split(';').next().unwrap_or("").trim(), 16)
            .expect("hex chunk size");
        body = &body[line_end + 2..];
        if size == 0 {
            return out;
        }
        out.extend_from_slice(&body[..size]);
        body = &body[size + 2..];
    }
}

/// Parses a complete response (connection closed by the server).
pub fn parse_response(raw: &[u8]) -> Resp {
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("no header end in {:?}", String::from_utf8_lossy(raw)));
    let head = std::str::from_utf8(&raw[..split]).expect("ascii head");
    let mut lines = head.split("\r\n");
    let status_line = lines.next().expect("status line");
    let status: u16 = status_line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("status code");
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    let rest = &raw[split + 4..];
    let chunked = headers
        .iter()
        .any(|(k, v)| k.eq_ignore_ascii_case("transfer-encoding") && v.contains("chunked"));
    let body = if chunked {
        dechunk(rest)
    } else {
        rest.to_vec()
    };
    Resp {
        status,
        headers,
        body: String::from_utf8(body).expect("UTF-8 body"),
    }
}

/// Sends raw bytes, reads the whole response.
pub fn send_raw(addr: SocketAddr, bytes: &[u8]) -> Resp {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(300)))
        .expect("timeout");
    // The server may answer (413, 401, ...) and close before reading a
    // large body: a failed write is fine as long as the response arrives.
    let _ = s.write_all(bytes);
    let mut raw = Vec::new();
    let mut buf = [0u8; 16384];
    loop {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => raw.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset && !raw.is_empty() => break,
            Err(e) => panic!("read failed: {e}"),
        }
    }
    parse_response(&raw)
}

/// A request with the API key and a JSON body.
pub fn post(addr: SocketAddr, path: &str, body: &serde_json::Value) -> Resp {
    let b = body.to_string();
    send_raw(
        addr,
        &raw_request(
            "POST",
            path,
            &[
                ("Authorization", &format!("Bearer {API_KEY}")),
                ("Content-Type", "application/json"),
            ],
            b.as_bytes(),
        ),
    )
}

pub fn get(addr: SocketAddr, path: &str) -> Resp {
    send_raw(
        addr,
        &raw_request(
            "GET",
            path,
            &[("Authorization", &format!("Bearer {API_KEY}"))],
            b"",
        ),
    )
}

/// The value of a metric line `name value` in a `/metrics` body.
pub fn metric(body: &str, name: &str) -> f64 {
    metric_where(body, name, "")
}

/// The value of the first sample of `name` whose labels contain `label`
/// (`key="value"`; empty: any labels).
pub fn metric_where(body: &str, name: &str, label: &str) -> f64 {
    body.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| {
            let rest = l.strip_prefix(name)?;
            let value = match rest.strip_prefix('{') {
                Some(r) => {
                    let (labels, v) = r.split_once("} ")?;
                    if !labels.split(',').any(|p| label.is_empty() || p == label) {
                        return None;
                    }
                    v
                }
                None => rest.strip_prefix(' ')?,
            };
            value.trim().parse().ok()
        })
        .unwrap_or_else(|| panic!("metric {name} {label} missing in:\n{body}"))
}

/// Sends an authorized JSON `POST` on a fresh connection and returns the
/// socket unread (for streaming tests that read slowly, partly or never).
pub fn post_unread(addr: SocketAddr, path: &str, body: &serde_json::Value) -> TcpStream {
    let auth = format!("Bearer {API_KEY}");
    let req = raw_request(
        "POST",
        path,
        &[
            ("Authorization", &auth),
            ("Content-Type", "application/json"),
        ],
        body.to_string().as_bytes(),
    );
    let mut s = TcpStream::connect(addr).expect("connect");
    s.write_all(&req).expect("request sent");
    s
}
