//! Serving metrics as the field defines them (vLLM `benchmark_serving`):
//! pure functions over per-request traces.
//!
//! - TTFT: arrival -> first output token.
//! - TPOT (per request): `(e2e - ttft) / (output_tokens - 1)`, for requests
//!   with more than one output token.
//! - ITL: every gap between consecutive streamed chunks, over all requests.
//! - E2E: arrival -> last token.
//! - Normalized latency (the paper's): mean over requests of e2e / output tokens.
//! - Goodput: requests per second that completed and met every SLO given.
//!
//! Percentiles use linear interpolation between closest ranks (numpy's default).
//! Cost: O(n log n) for n samples (sorting).

use serde::{Deserialize, Serialize};

/// What one request did, times in seconds from its send time.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct RequestTrace {
    pub success: bool,
    pub prompt_len: usize,
    /// Output tokens generated (from the usage report when given).
    pub output_len: usize,
    /// Time to first token.
    pub ttft: f64,
    /// Gaps between consecutive streamed chunks after the first.
    pub itl: Vec<f64>,
    /// End-to-end latency.
    pub e2e: f64,
    pub error: Option<String>,
}

/// Mean, median, p99 (and more) of one distribution, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, Default)]
pub struct Dist {
    pub mean: f64,
    pub median: f64,
    pub p99: f64,
    pub std: f64,
}

/// Service-level objectives for goodput, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, Default)]
pub struct Slo {
    pub ttft_ms: Option<f64>,
    pub tpot_ms: Option<f64>,
    pub e2el_ms: Option<f64>,
}

/// The whole summary of a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct Summary {
    pub completed: usize,
    pub failed: usize,
    pub duration_s: f64,
    pub total_input_tokens: usize,
    pub total_output_tokens: usize,
    pub request_throughput: f64,
    pub output_throughput: f64,
    pub total_token_throughput: f64,
    /// Seconds per output token, averaged over requests.
    pub normalized_latency_s: f64,
    pub goodput: Option<f64>,
    pub ttft_ms: Dist,
    pub tpot_ms: Dist,
    pub itl_ms: Dist,
    pub e2el_ms: Dist,
}

/// Percentile `p` in 0..=100 of sorted data, linear interpolation.
pub fn percentile_sorted(sorted: &[f64], p: f64) -> f64 {
    match sorted.len() {
        0 => 0.0,
        1 => sorted[0],
        n => {
            let rank = p.clamp(0.0, 100.0) / 100.0 * (n - 1) as f64;
            let lo = rank.floor() as usize;
            let hi = rank.ceil() as usize;
            sorted[lo] + (sorted[hi] - sorted[lo]) * (rank - lo as f64)
        }
    }
}

/// Summary of `values` (seconds) in milliseconds; zeros when empty.
pub fn dist_ms(values: &[f64]) -> Dist {
    if values.is_empty() {
        return Dist::default();
    }
    let mut v: Vec<f64> = values.iter().map(|x| x * 1000.0).collect();
    v.sort_by(f64::total_cmp);
    let n = v.len() as f64;
    let mean = v.iter().sum::<f64>() / n;
    let var = v.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / n;
    Dist {
        mean,
        median: percentile_sorted(&v, 50.0),
        p99: percentile_sorted(&v, 99.0),
        std: var.sqrt(),
    }
}

/// TPOT of one request in seconds; `None` with fewer than two output tokens.
pub fn tpot(t: &RequestTrace) -> Option<f64> {
    (t.output_len > 1).then(|| (t.e2e - t.ttft) / (t.output_len - 1) as f64)
}

/// The paper's normalized latency: mean over successful requests with
/// output of e2e / output tokens (seconds per token).
pub fn normalized_latency(traces: &[RequestTrace]) -> f64 {
    let v: Vec<f64> = traces
        .iter()
        .filter(|t| t.success && t.output_len > 0)
        .map(|t| t.e2e / t.output_len as f64)
        .collect();
    if v.is_empty() {
        0.0
    } else {
        v.iter().sum::<f64>() / v.len() as f64
    }
}

/// Whether a successful request met every given SLO. A request with one
/// output token has TPOT 0 for this purpose (vLLM's convention).
pub fn meets_slo(t: &RequestTrace, slo: &Slo) -> bool {
    let ok = |limit: Option<f64>, v_s: f64| limit.is_none_or(|l| v_s * 1000.0 <= l);
    t.success
        && ok(slo.ttft_ms, t.ttft)
        && ok(slo.tpot_ms, tpot(t).unwrap_or(0.0))
        && ok(slo.e2el_ms, t.e2e)
}

/// Summarizes a run that lasted `duration_s` seconds (first send to last
/// completion). Failed requests count only in `failed`.
pub fn summarize(traces: &[RequestTrace], duration_s: f64, slo: Option<&Slo>) -> Summary {
    let ok: Vec<&RequestTrace> = traces.iter().filter(|t| t.success).collect();
    let d = duration_s.max(f64::MIN_POSITIVE);
    let total_in: usize = ok.iter().map(|t| t.prompt_len).sum();
    let total_out: usize = ok.iter().map(|t| t.output_len).sum();
    let ttfts: Vec<f64> = ok.iter().map(|t| t.ttft).collect();
    let tpots: Vec<f64> = ok.iter().filter_map(|t| tpot(t)).collect();
    let itls: Vec<f64> = ok.iter().flat_map(|t| t.itl.iter().copied()).collect();
    let e2es: Vec<f64> = ok.iter().map(|t| t.e2e).collect();
    Summary {
        completed: ok.len(),
        failed: traces.len() - ok.len(),
        duration_s,
        total_input_tokens: total_in,
        total_output_tokens: total_out,
        request_throughput: ok.len() as f64 / d,
        output_throughput: total_out as f64 / d,
        total_token_throughput: (total_in + total_out) as f64 / d,
        normalized_latency_s: normalized_latency(traces),
        goodput: slo.map(|s| traces.iter().filter(|t| meets_slo(t, s)).count() as f64 / d),
        ttft_ms: dist_ms(&ttfts),
        tpot_ms: dist_ms(&tpots),
        itl_ms: dist_ms(&itls),
        e2el_ms: dist_ms(&e2es),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trace(out: usize, ttft: f64, e2e: f64, itl: Vec<f64>) -> RequestTrace {
        RequestTrace {
            success: true,
            prompt_len: 10,
            output_len: out,
            ttft,
            itl,
            e2e,
            error: None,
        }
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn percentiles_interpolate_like_numpy() {
        let v = [1.0, 2.0, 3.0, 4.0];
        assert!(close(percentile_sorted(&v, 50.0), 2.5));
        assert!(close(percentile_sorted(&v, 99.0), 3.97));
        assert!(close(percentile_sorted(&v, 0.0), 1.0));
        assert!(close(percentile_sorted(&[7.0], 99.0), 7.0));
        assert!(close(percentile_sorted(&[], 50.0), 0.0));
    }

    #[test]
    fn tpot_excludes_first_token() {
        // 5 tokens: first at 0.2 s, last at 1.0 s: 4 gaps of 0.2 s.
        let t = trace(5, 0.2, 1.0, vec![0.2; 4]);
        assert!(close(tpot(&t).unwrap(), 0.2));
        assert_eq!(tpot(&trace(1, 0.2, 0.2, vec![])), None);
    }

    #[test]
    fn summary_on_a_hand_made_trace() {
        let a = trace(5, 0.2, 1.0, vec![0.2, 0.2, 0.2, 0.2]);
        let b = trace(3, 0.4, 1.0, vec![0.1, 0.5]);
        let mut failed = trace(0, 0.0, 0.0, vec![]);
        failed.success = false;
        let s = summarize(&[a, b, failed], 2.0, None);
        assert_eq!(s.completed, 2);
        assert_eq!(s.failed, 1);
        assert_eq!(s.total_input_tokens, 20);
        assert_eq!(s.total_output_tokens, 8);
        assert!(close(s.request_throughput, 1.0));
        assert!(close(s.output_throughput, 4.0));
        assert!(close(s.total_token_throughput, 14.0));
        // TTFT 200 and 400 ms.
        assert!(close(s.ttft_ms.mean, 300.0));
        assert!(close(s.ttft_ms.median, 300.0));
        assert!(close(s.ttft_ms.p99, 398.0));
        // TPOT: a = 0.8/4 = 200 ms, b = 0.6/2 = 300 ms.
        assert!(close(s.tpot_ms.mean, 250.0));
        // ITL over all gaps: 100,200,200,200,200,500 -> mean 233.33, median 200.
        assert!(close(s.itl_ms.mean, 1400.0 / 6.0));
        assert!(close(s.itl_ms.median, 200.0));
        assert!(close(s.e2el_ms.mean, 1000.0));
        // Normalized latency: (1.0/5 + 1.0/3) / 2.
        assert!(close(s.normalized_latency_s, (0.2 + 1.0 / 3.0) / 2.0));
        assert_eq!(s.goodput, None);
    }

    #[test]
    fn goodput_counts_only_requests_meeting_every_slo() {
        let fast = trace(5, 0.1, 0.5, vec![0.1; 4]); // ttft 100, tpot 100
        let slow_first = trace(5, 0.9, 1.3, vec![0.1; 4]); // ttft 900, tpot 100
        let slow_decode = trace(5, 0.1, 2.1, vec![0.5; 4]); // ttft 100, tpot 500
        let all = [fast, slow_first, slow_decode];
        let slo = Slo {
            ttft_ms: Some(500.0),
            tpot_ms: Some(200.0),
            e2el_ms: None,
        };
        let s = summarize(&all, 4.0, Some(&slo));
        assert!(close(s.goodput.unwrap(), 0.25));
        let ttft_only = Slo {
            ttft_ms: Some(500.0),
            ..Slo::default()
        };
        assert!(close(
            summarize(&all, 4.0, Some(&ttft_only)).goodput.unwrap(),
            0.5
        ));
    }
}
