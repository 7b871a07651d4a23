//! Speculative decoding's figures for the report, from the server's
//! `/metrics` (vLLM's `vllm:spec_decode_*` counters) read before and after
//! a run: drafts, draft and accepted tokens, the acceptance rate, the mean
//! acceptance length (`1 + accepted / drafts`: tokens a verifying step
//! yields) and the acceptance rate by draft position, as vLLM's benchmark
//! prints them. Absent when the server exposes no such counters.

use super::client::{ChunkedDecoder, Endpoint};
use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The counters at one moment.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Counters {
    pub drafts: f64,
    pub draft_tokens: f64,
    pub accepted: f64,
    /// Accepted tokens by draft position.
    pub per_pos: Vec<f64>,
}

/// A run's speculative decoding figures.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SpecSummary {
    pub drafts: u64,
    pub draft_tokens: u64,
    pub accepted_tokens: u64,
    /// Accepted / draft tokens.
    pub acceptance_rate: f64,
    /// `1 + accepted / drafts`.
    pub mean_acceptance_length: f64,
    /// Per draft position: accepted at that position / drafts.
    pub per_position: Vec<f64>,
}

/// The first sample's value of `name` (any labels) whose labels contain
/// `label` (empty: any).
fn sample(body: &str, name: &str, label: &str) -> Option<f64> {
    body.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        let rest = l.strip_prefix(name)?;
        let value = match rest.strip_prefix('{') {
            Some(r) => {
                let (labels, v) = r.split_once("} ")?;
                if !label.is_empty() && !labels.split(',').any(|p| p == label) {
                    return None;
                }
                v
            }
            None => rest.strip_prefix(' ')?,
        };
        value.trim().parse().ok()
    })
}

/// The counters in a `/metrics` body, or `None` without them.
pub fn parse(body: &str) -> Option<Counters> {
    let drafts = sample(body, "vllm:spec_decode_num_drafts_total", "")?;
    let per_pos = (0..)
        .map_while(|i| {
            sample(
                body,
                "vllm:spec_decode_num_accepted_tokens_per_pos_total",
                &format!("position=\"{i}\""),
            )
        })
        .collect();
    Some(Counters {
        drafts,
        draft_tokens: sample(body, "vllm:spec_decode_num_draft_tokens_total", "")?,
        accepted: sample(body, "vllm:spec_decode_num_accepted_tokens_total", "")?,
        per_pos,
    })
}

/// The figures of the run between `before` and `after`.
pub fn summarize(before: &Counters, after: &Counters) -> SpecSummary {
    let drafts = (after.drafts - before.drafts).max(0.0);
    let draft_tokens = (after.draft_tokens - before.draft_tokens).max(0.0);
    let accepted = (after.accepted - before.accepted).max(0.0);
    let per_position = after
        .per_pos
        .iter()
        .enumerate()
        .map(|(i, a)| {
            let b = before.per_pos.get(i).copied().unwrap_or(0.0);
            if drafts > 0.0 {
                (a - b) / drafts
            } else {
                0.0
            }
        })
        .collect();
    SpecSummary {
        drafts: drafts as u64,
        draft_tokens: draft_tokens as u64,
        accepted_tokens: accepted as u64,
        acceptance_rate: if draft_tokens > 0.0 {
            accepted / draft_tokens
        } else {
            0.0
        },
        mean_acceptance_length: if drafts > 0.0 {
            1.0 + accepted / drafts
        } else {
            1.0
        },
        per_position,
    }
}

/// The report's lines for `s`.
pub fn report(s: &SpecSummary) -> String {
    let pos: Vec<String> = s.per_position.iter().map(|r| format!("{r:.3}")).collect();
    format!(
        "{:<40}{:<10}\n{:<40}{:<10}\n{:<40}{:<10}\n{:<40}{:<10.2}\n{:<40}{:<10.2}\n{:<40}{}\n",
        "Spec decode drafts:",
        s.drafts,
        "Draft tokens:",
        s.draft_tokens,
        "Accepted tokens:",
        s.accepted_tokens,
        "Acceptance rate (%):",
        100.0 * s.acceptance_rate,
        "Mean acceptance length:",
        s.mean_acceptance_length,
        "Acceptance rate per position:",
        pos.join(" "),
    )
}

/// GETs `/metrics` and parses the counters (`None`: the server has none,
/// or no metrics endpoint).
pub async fn scrape(ep: &Endpoint) -> Result<Option<Counters>> {
    let mut sock = TcpStream::connect((ep.host.as_str(), ep.port))
        .await
        .with_context(|| format!("connecting to {}:{}", ep.host, ep.port))?;
    let head = format!(
        "GET {}/metrics HTTP/1.1\r\nHost: {}:{}\r\nConnection: close\r\n\r\n",
        ep.prefix, ep.host, ep.port
    );
    sock.write_all(head.as_bytes()).await?;
    let mut raw = Vec::new();
    sock.read_to_end(&mut raw).await?;
    let Some(end) = raw.windows(4).position(|w| w == b"\r\n\r\n") else {
        bail!("no HTTP response from /metrics");
    };
    let headers = String::from_utf8_lossy(&raw[..end]).to_ascii_lowercase();
    if headers.split_whitespace().nth(1) != Some("200") {
        return Ok(None);
    }
    let body = &raw[end + 4..];
    let text = if headers.contains("transfer-encoding: chunked") {
        let mut dec = ChunkedDecoder::default();
        let mut out = Vec::new();
        dec.feed(body, &mut out)?;
        out
    } else {
        body.to_vec()
    };
    Ok(parse(&String::from_utf8_lossy(&text)))
}

#[cfg(test)]
mod tests {
    use super::*;

    const BEFORE: &str = "# HELP x\n\
        vllm:spec_decode_num_drafts_total{engine=\"0\",model_name=\"m\"} 10\n\
        vllm:spec_decode_num_draft_tokens_total{engine=\"0\",model_name=\"m\"} 40\n\
        vllm:spec_decode_num_accepted_tokens_total{engine=\"0\",model_name=\"m\"} 20\n\
        vllm:spec_decode_num_accepted_tokens_per_pos_total{engine=\"0\",model_name=\"m\",position=\"0\"} 8\n\
        vllm:spec_decode_num_accepted_tokens_per_pos_total{engine=\"0\",model_name=\"m\",position=\"1\"} 6\n";

    #[test]
    fn parses_and_summarizes_the_counters() {
        let before = parse(BEFORE).expect("counters");
        assert_eq!(before.per_pos, vec![8.0, 6.0]);
        let after_text = BEFORE
            .replace("} 10\n", "} 30\n")
            .replace("} 40\n", "} 120\n")
            .replace("} 20\n", "} 50\n")
            .replace("} 8\n", "} 24\n")
            .replace("} 6\n", "} 12\n");
        let after = parse(&after_text).expect("counters");
        let s = summarize(&before, &after);
        assert_eq!((s.drafts, s.draft_tokens, s.accepted_tokens), (20, 80, 30));
        assert!((s.acceptance_rate - 0.375).abs() < 1e-12);
        assert!((s.mean_acceptance_length - 2.5).abs() < 1e-12);
        assert_eq!(s.per_position, vec![16.0 / 20.0, 6.0 / 20.0]);
        assert!(report(&s).contains("Mean acceptance length:"));
        assert!(parse("vllm:num_requests_running 1\n").is_none());
    }
}
