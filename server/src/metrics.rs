//! Prometheus metrics in the text exposition format, with vLLM's current
//! (V1) names (`vllm:` prefix) so existing dashboards work:
//! `vllm:kv_cache_usage_perc` (which replaced `vllm:gpu_cache_usage_perc`),
//! `vllm:num_requests_running` / `_waiting`, `vllm:prefix_cache_queries_total`
//! / `_hits_total`, `vllm:num_preemptions_total`, `vllm:prompt_tokens_total`,
//! `vllm:generation_tokens_total`, `vllm:request_success_total` by
//! `finished_reason` (stop, length, abort), and the histograms
//! `vllm:time_to_first_token_seconds`, `vllm:inter_token_latency_seconds`,
//! `vllm:e2e_request_latency_seconds`. Ours beyond vLLM's list (kept under
//! the prefix): `vllm:num_requests_swapped` (vLLM V1 has no swapping),
//! the `mode` label of preemptions, the block counts of both pools, and
//! `vllm:request_rejected_total` (refused at admission, e.g. 429).
//!
//! Gauges and engine counters come from [`BackendStats`] at scrape time; the
//! server records its own latency histograms (time to first token,
//! inter-token latency, end-to-end latency) and request counters.
//!
//! Invariant: a histogram's bucket counts are cumulative and its `+Inf`
//! bucket equals `_count`. Observing is O(buckets) under an uncontended
//! mutex; rendering is O(buckets).

use crate::backend::BackendStats;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// A fixed-bucket histogram of seconds.
#[derive(Debug)]
pub struct Histogram {
    bounds: Vec<f64>,
    inner: Mutex<HistState>,
}

#[derive(Debug, Clone, Default)]
struct HistState {
    /// Per-bucket (not cumulative) counts; the last slot is `+Inf`.
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    /// `bounds` must be increasing.
    pub fn new(bounds: &[f64]) -> Self {
        Self {
            bounds: bounds.to_vec(),
            inner: Mutex::new(HistState {
                counts: vec![0; bounds.len() + 1],
                sum: 0.0,
                count: 0,
            }),
        }
    }

    pub fn observe(&self, v: f64) {
        let i = self
            .bounds
            .iter()
            .position(|&b| v <= b)
            .unwrap_or(self.bounds.len());
        let mut s = match self.inner.lock() {
            Ok(s) => s,
            Err(p) => p.into_inner(),
        };
        s.counts[i] += 1;
        s.sum += v;
        s.count += 1;
    }

    /// Number of observations.
    pub fn count(&self) -> u64 {
        match self.inner.lock() {
            Ok(s) => s.count,
            Err(p) => p.into_inner().count,
        }
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let s = match self.inner.lock() {
            Ok(s) => s.clone(),
            Err(p) => p.into_inner().clone(),
        };
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut cum = 0;
        for (b, c) in self.bounds.iter().zip(&s.counts) {
            cum += c;
            let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"}} {cum}");
        }
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {}", s.count);
        let _ = writeln!(out, "{name}_sum {}\n{name}_count {}", s.sum, s.count);
    }
}

const TTFT_BUCKETS: [f64; 15] = [
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0,
];
const ITL_BUCKETS: [f64; 14] = [
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
];
const E2E_BUCKETS: [f64; 14] = [
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 60.0,
];

/// The server's own metrics.
#[derive(Debug)]
pub struct Metrics {
    pub ttft: Histogram,
    pub itl: Histogram,
    pub e2e: Histogram,
    /// Finished requests whose choices all stopped (EOS, stop token or string).
    pub requests_ok: AtomicU64,
    /// Finished requests with a choice cut by `max_tokens` / the context.
    pub requests_length: AtomicU64,
    pub requests_aborted: AtomicU64,
    pub requests_rejected: AtomicU64,
}

impl Default for Metrics {
    fn default() -> Self {
        Self {
            ttft: Histogram::new(&TTFT_BUCKETS),
            itl: Histogram::new(&ITL_BUCKETS),
            e2e: Histogram::new(&E2E_BUCKETS),
            requests_ok: AtomicU64::new(0),
            requests_length: AtomicU64::new(0),
            requests_aborted: AtomicU64::new(0),
            requests_rejected: AtomicU64::new(0),
        }
    }
}

fn gauge(out: &mut String, name: &str, help: &str, v: impl std::fmt::Display) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
}

fn counter(out: &mut String, name: &str, help: &str, v: u64) {
    let _ = writeln!(
        out,
        "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}"
    );
}

impl Metrics {
    /// Counts a finished request by its choices' finish reasons: abort if
    /// any aborted, else length if any hit a length limit, else stop.
    pub fn record_finished<'a>(&self, reasons: impl IntoIterator<Item = &'a str>) {
        let (mut abort, mut length) = (false, false);
        for r in reasons {
            abort |= r == "abort";
            length |= r == "length";
        }
        let counter = if abort {
            &self.requests_aborted
        } else if length {
            &self.requests_length
        } else {
            &self.requests_ok
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// The `/metrics` body.
    pub fn render(&self, s: &BackendStats, model: &str) -> String {
        let mut o = String::new();
        let _ = writeln!(o, "# served model: {model}");
        gauge(
            &mut o,
            "vllm:num_requests_running",
            "Requests running on the engine.",
            s.num_running,
        );
        gauge(
            &mut o,
            "vllm:num_requests_waiting",
            "Requests waiting to be admitted.",
            s.num_waiting,
        );
        gauge(
            &mut o,
            "vllm:num_requests_swapped",
            "Requests swapped to the CPU pool.",
            s.num_swapped,
        );
        gauge(
            &mut o,
            "vllm:kv_cache_usage_perc",
            "KV cache usage (fraction of blocks, 0..1).",
            s.kv_usage,
        );
        gauge(
            &mut o,
            "vllm:kv_cache_total_blocks",
            "Blocks in the KV cache pool.",
            s.kv_total_blocks,
        );
        gauge(
            &mut o,
            "vllm:kv_cache_free_blocks",
            "Free blocks in the KV cache pool.",
            s.kv_free_blocks,
        );
        gauge(
            &mut o,
            "vllm:cpu_cache_total_blocks",
            "Blocks in the CPU swap pool.",
            s.cpu_total_blocks,
        );
        gauge(
            &mut o,
            "vllm:cpu_cache_free_blocks",
            "Free blocks in the CPU swap pool.",
            s.cpu_free_blocks,
        );
        counter(
            &mut o,
            "vllm:prefix_cache_queries_total",
            "Prefix cache block lookups.",
            s.prefix_cache_queries,
        );
        counter(
            &mut o,
            "vllm:prefix_cache_hits_total",
            "Prefix cache block hits.",
            s.prefix_cache_hits,
        );
        let _ = writeln!(
            o,
            "# HELP vllm:num_preemptions_total Preemptions, by mode.\n# TYPE vllm:num_preemptions_total counter\n\
             vllm:num_preemptions_total{{mode=\"swap\"}} {}\nvllm:num_preemptions_total{{mode=\"recompute\"}} {}",
            s.preemptions_swap, s.preemptions_recompute
        );
        counter(
            &mut o,
            "vllm:prompt_tokens_total",
            "Prompt tokens processed.",
            s.prompt_tokens,
        );
        counter(
            &mut o,
            "vllm:generation_tokens_total",
            "Tokens generated.",
            s.generation_tokens,
        );
        let _ = writeln!(
            o,
            "# HELP vllm:request_success_total Finished requests, by finish reason.\n# TYPE vllm:request_success_total counter\n\
             vllm:request_success_total{{finished_reason=\"stop\"}} {}\nvllm:request_success_total{{finished_reason=\"length\"}} {}\n\
             vllm:request_success_total{{finished_reason=\"abort\"}} {}",
            self.requests_ok.load(Ordering::Relaxed),
            self.requests_length.load(Ordering::Relaxed),
            self.requests_aborted.load(Ordering::Relaxed),
        );
        counter(
            &mut o,
            "vllm:request_rejected_total",
            "Requests refused at admission (e.g. 429: too many waiting).",
            self.requests_rejected.load(Ordering::Relaxed),
        );
        self.ttft.render(
            &mut o,
            "vllm:time_to_first_token_seconds",
            "Time to first token.",
        );
        self.itl.render(
            &mut o,
            "vllm:inter_token_latency_seconds",
            "Time between output deltas of a sequence.",
        );
        self.e2e.render(
            &mut o,
            "vllm:e2e_request_latency_seconds",
            "Request latency, arrival to last token.",
        );
        o
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative() {
        let h = Histogram::new(&[0.1, 1.0]);
        for v in [0.05, 0.1, 0.5, 3.0] {
            h.observe(v);
        }
        let mut out = String::new();
        h.render(&mut out, "x", "help");
        assert!(out.contains("x_bucket{le=\"0.1\"} 2\n"), "{out}");
        assert!(out.contains("x_bucket{le=\"1\"} 3\n"), "{out}");
        assert!(out.contains("x_bucket{le=\"+Inf\"} 4\n"), "{out}");
        assert!(out.contains("x_sum 3.65\n"), "{out}");
        assert!(out.contains("x_count 4\n"), "{out}");
    }

    #[test]
    fn render_lists_engine_numbers() {
        let m = Metrics::default();
        let s = BackendStats {
            num_running: 3,
            kv_free_blocks: 17,
            preemptions_swap: 5,
            ..BackendStats::default()
        };
        let out = m.render(&s, "m");
        assert!(out.contains("\nvllm:num_requests_running 3\n"));
        assert!(out.contains("\nvllm:kv_cache_free_blocks 17\n"));
        assert!(out.contains("vllm:num_preemptions_total{mode=\"swap\"} 5\n"));
        assert!(out.contains("# TYPE vllm:time_to_first_token_seconds histogram"));
        assert!(out.contains("\nvllm:kv_cache_usage_perc 0\n"), "{out}");
        assert!(!out.contains("gpu_cache_usage_perc"), "{out}");
    }

    #[test]
    fn finished_requests_are_counted_by_reason() {
        let m = Metrics::default();
        m.record_finished(["stop", "stop"]);
        m.record_finished(["stop", "length"]);
        m.record_finished(["length", "abort"]);
        m.record_finished(["length"]);
        let out = m.render(&BackendStats::default(), "m");
        for (reason, n) in [("stop", 1), ("length", 2), ("abort", 1)] {
            let line = format!("vllm:request_success_total{{finished_reason=\"{reason}\"}} {n}\n");
            assert!(out.contains(&line), "{line} in {out}");
        }
    }
}
