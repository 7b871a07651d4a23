//! A small HTTP/1.1 client for OpenAI-compatible `/v1/completions` with
//! streaming (Server-Sent Events), over a tokio `TcpStream`. One connection
//! per request (`Connection: close`), plain `http://` only.
//!
//! Timing follows vLLM's `benchmark_serving`: every SSE chunk carrying
//! `choices` is a token event (first one = TTFT, the rest give ITL); the
//! usage chunk gives the output token count.
//! Cost: O(response bytes) per request.

use super::metrics::RequestTrace;
use anyhow::{bail, Context, Result};
use std::time::Instant;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Where the server is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub host: String,
    pub port: u16,
    /// Path prefix before `/v1/...` (usually empty).
    pub prefix: String,
}

/// Parses `http://host[:port][/prefix]`.
pub fn parse_base_url(url: &str) -> Result<Endpoint> {
    let Some(rest) = url.strip_prefix("http://") else {
        bail!("base URL must start with http:// (got {url:?})");
    };
    let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
    let (host, port) = match authority.rsplit_once(':') {
        Some((h, p)) => (
            h,
            p.parse::<u16>()
                .with_context(|| format!("bad port in {url:?}"))?,
        ),
        None => (authority, 80),
    };
    if host.is_empty() {
        bail!("base URL has no host: {url:?}");
    }
    let prefix = path.trim_end_matches('/');
    Ok(Endpoint {
        host: host.to_string(),
        port,
        prefix: if prefix.is_empty() {
            String::new()
        } else {
            format!("/{prefix}")
        },
    })
}

/// Incremental decoder of `Transfer-Encoding: chunked`.
#[derive(Debug, Default)]
pub struct ChunkedDecoder {
    raw: Vec<u8>,
    pub done: bool,
}

impl ChunkedDecoder {
    /// Feeds raw bytes; appends every complete chunk's payload to `out`.
    pub fn feed(&mut self, bytes: &[u8], out: &mut Vec<u8>) -> Result<()> {
        self.raw.extend_from_slice(bytes);
        loop {
            if self.done {
                return Ok(());
            }
            let Some(eol) = find(&self.raw, b"\r\n") else {
                return Ok(());
            };
            let line = std::str::from_utf8(&self.raw[..eol]).context("chunk size line")?;
            let size_hex = line.split(';').next().unwrap_or("").trim();
            let size = usize::from_str_radix(size_hex, 16)
                .with_context(|| format!("bad chunk size {size_hex:?}"))?;
            if size == 0 {
                self.done = true;
                return Ok(());
            }
            let start = eol + 2;
            if self.raw.len() < start + size + 2 {
                return Ok(());
            }
            out.extend_from_slice(&self.raw[start..start + size]);
            self.raw.drain(..start + size + 2);
        }
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Takes every complete SSE event out of `buf`; returns their `data:` payloads.
pub fn take_sse_data(buf: &mut Vec<u8>) -> Vec<String> {
    let mut out = Vec::new();
    loop {
        let (end, sep) = match (find(buf, b"\n\n"), find(buf, b"\r\n\r\n")) {
            (Some(a), Some(b)) if b < a => (b, 4),
            (Some(a), _) => (a, 2),
            (None, Some(b)) => (b, 4),
            (None, None) => return out,
        };
        let event = String::from_utf8_lossy(&buf[..end]).into_owned();
        buf.drain(..end + sep);
        let data: Vec<&str> = event
            .lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .map(str::trim_start)
            .collect();
        if !data.is_empty() {
            out.push(data.join("\n"));
        }
    }
}

/// One completion request to send.
#[derive(Debug, Clone)]
pub struct CompletionRequest {
    pub model: String,
    pub prompt: String,
    pub prompt_len: usize,
    pub max_tokens: usize,
    pub ignore_eos: bool,
}

/// Sends one streaming completion and times it. Never fails: errors land in
/// the trace (`success = false`).
pub async fn send(ep: &Endpoint, req: &CompletionRequest) -> RequestTrace {
    let start = Instant::now();
    let mut trace = RequestTrace {
        prompt_len: req.prompt_len,
        ..RequestTrace::default()
    };
    match stream_completion(ep, req, start, &mut trace).await {
        Ok(()) => {
            trace.e2e = start.elapsed().as_secs_f64();
            trace.success = trace.output_len > 0;
            if !trace.success {
                trace.error = Some("no output token".into());
            }
        }
        Err(e) => {
            trace.success = false;
            trace.error = Some(format!("{e:#}"));
        }
    }
    trace
}

async fn stream_completion(
    ep: &Endpoint,
    req: &CompletionRequest,
    start: Instant,
    trace: &mut RequestTrace,
) -> Result<()> {
    let body = serde_json::json!({
        "model": req.model,
        "prompt": req.prompt,
        "max_tokens": req.max_tokens,
        "temperature": 0.0,
        "ignore_eos": req.ignore_eos,
        "stream": true,
        "stream_options": {"include_usage": true},
    })
    .to_string();
    let head = format!(
        "POST {}/v1/completions HTTP/1.1\r\nHost: {}:{}\r\nContent-Type: application/json\r\n\
         Accept: text/event-stream\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        ep.prefix,
        ep.host,
        ep.port,
        body.len()
    );
    let mut sock = TcpStream::connect((ep.host.as_str(), ep.port))
        .await
        .with_context(|| format!("connecting to {}:{}", ep.host, ep.port))?;
    sock.set_nodelay(true)?;
    sock.write_all(head.as_bytes()).await?;
    sock.write_all(body.as_bytes()).await?;
    let mut raw = Vec::new();
    let mut buf = vec![0u8; 16 * 1024];
    let header_end = loop {
        if let Some(p) = find(&raw, b"\r\n\r\n") {
            break p;
        }
        let n = sock.read(&mut buf).await?;
        if n == 0 {
            bail!("connection closed before the response headers");
        }
        raw.extend_from_slice(&buf[..n]);
    };
    let headers = String::from_utf8_lossy(&raw[..header_end]).to_ascii_lowercase();
    let status = headers.split_whitespace().nth(1).unwrap_or("");
    let chunked = headers.contains("transfer-encoding: chunked");
    let rest = raw.split_off(header_end + 4);
    let mut sse = Vec::new();
    let mut dec = ChunkedDecoder::default();
    let mut feed = |bytes: &[u8], sse: &mut Vec<u8>| -> Result<()> {
        if chunked {
            dec.feed(bytes, sse)
        } else {
            sse.extend_from_slice(bytes);
            Ok(())
        }
    };
    feed(&rest, &mut sse)?;
    if status != "200" {
        loop {
            let n = sock.read(&mut buf).await?;
            if n == 0 {
                break;
            }
            feed(&buf[..n], &mut sse)?;
        }
        bail!("HTTP {status}: {}", String::from_utf8_lossy(&sse));
    }
    let mut last = 0.0;
    let mut chunks = 0usize;
    let mut usage_tokens = None;
    loop {
        for data in take_sse_data(&mut sse) {
            let now = start.elapsed().as_secs_f64();
            if data == "[DONE]" {
                continue;
            }
            let v: serde_json::Value =
                serde_json::from_str(&data).with_context(|| format!("bad SSE data {data:?}"))?;
            if let Some(err) = v.get("error") {
                bail!("server error: {err}");
            }
            if v.get("choices")
                .and_then(|c| c.as_array())
                .is_some_and(|c| !c.is_empty())
            {
                if chunks == 0 {
                    trace.ttft = now;
                } else {
                    trace.itl.push(now - last);
                }
                last = now;
                chunks += 1;
            }
            if let Some(n) = v
                .pointer("/usage/completion_tokens")
                .and_then(|n| n.as_u64())
            {
                usage_tokens = Some(n as usize);
            }
        }
        let n = sock.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        feed(&buf[..n], &mut sse)?;
    }
    // Without a usage report, each content chunk counts as one token.
    trace.output_len = usage_tokens.unwrap_or(chunks);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_urls() {
        let e = parse_base_url("http://127.0.0.1:8000").unwrap();
        assert_eq!(
            (e.host.as_str(), e.port, e.prefix.as_str()),
            ("127.0.0.1", 8000, "")
        );
        let e = parse_base_url("http://h/api/").unwrap();
        assert_eq!(
            (e.host.as_str(), e.port, e.prefix.as_str()),
            ("h", 80, "/api")
        );
        assert!(parse_base_url("https://h").is_err());
        assert!(parse_base_url("http://h:x").is_err());
        assert!(parse_base_url("http://:80").is_err());
    }

    #[test]
    fn chunked_decoding_across_splits() {
        let wire = b"5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\n\r\n";
        for split in 0..wire.len() {
            let mut d = ChunkedDecoder::default();
            let mut out = Vec::new();
            d.feed(&wire[..split], &mut out).unwrap();
            d.feed(&wire[split..], &mut out).unwrap();
            assert_eq!(out, b"hello world", "split at {split}");
            assert!(d.done);
        }
        let mut d = ChunkedDecoder::default();
        assert!(d.feed(b"zz\r\n", &mut Vec::new()).is_err());
    }

    #[test]
    fn sse_events_are_split_and_partial_kept() {
        let mut buf = b"data: {\"a\":1}\n\ndata: [DONE]\r\n\r\n: comment\n\ndata: {\"b\"".to_vec();
        let got = take_sse_data(&mut buf);
        assert_eq!(got, vec!["{\"a\":1}".to_string(), "[DONE]".to_string()]);
        assert_eq!(buf, b"data: {\"b\"");
    }
}
