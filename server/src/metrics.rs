//! Prometheus metrics in the text exposition format (version 0.0.4), with
//! vLLM's current (V1) names, types, HELP texts and labels
//! (`vllm/v1/metrics/loggers.py`), so dashboards and the routers that score
//! replicas from them (the Gateway API Inference Extension's endpoint
//! picker, llm-d, smg, vLLM's production-stack router) read us as they read
//! vLLM. Every sample carries vLLM's `engine="0"` and `model_name` labels.
//!
//! vLLM's families: the gauges `vllm:num_requests_running`,
//! `vllm:num_requests_waiting`, `vllm:kv_cache_usage_perc` (0..1); the info
//! gauge `vllm:cache_config_info` (value 1, the cache configuration in its
//! labels, Python's spelling: `True`, `None`, `0.9`); the counters
//! `vllm:prefix_cache_queries_total` / `_hits_total` (tokens, as vLLM
//! counts them), `vllm:num_preemptions_total`, `vllm:prompt_tokens_total`,
//! `vllm:generation_tokens_total`, `vllm:request_success_total` by
//! `finished_reason` (stop, length, abort); the histograms
//! `vllm:time_to_first_token_seconds`, `vllm:inter_token_latency_seconds`,
//! `vllm:e2e_request_latency_seconds` with vLLM's buckets.
//!
//! Ours beyond vLLM's list (same prefix and labels):
//! `vllm:num_requests_swapped` (vLLM V1 has no swapping),
//! `vllm:num_preemptions_by_mode_total{mode}`, the block counts of both
//! pools, `vllm:request_rejected_total` (refused at admission, e.g. 429),
//! and with `--kv-events-config` the publisher's
//! `vllm:kv_events_published_batches_total` / `_dropped_batches_total`.
//!
//! Why not the `prometheus-client` crate: it writes OpenMetrics (a counter's
//! `# TYPE` names the family without `_total`, a closing `# EOF`), which is
//! not what vLLM serves nor what every router's parser expects from a
//! `text/plain; version=0.0.4` scrape. The format here is small, and the
//! tests parse the whole of `/metrics` with the reference Python parser.
//!
//! Gauges and engine counters come from [`BackendStats`] at scrape time; the
//! server records its own latency histograms and request counters.
//!
//! Invariant: a histogram's bucket counts are cumulative and its `+Inf`
//! bucket equals `_count`. Observing is O(buckets) under an uncontended
//! mutex; rendering is O(buckets).

use crate::backend::{BackendStats, SpecMetrics};
use crate::kv_events::publisher::PublisherStats;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

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

    fn snapshot(&self) -> HistState {
        match self.inner.lock() {
            Ok(s) => s.clone(),
            Err(p) => p.into_inner().clone(),
        }
    }
}

/// vLLM's buckets for `vllm:time_to_first_token_seconds`.
const TTFT_BUCKETS: [f64; 22] = [
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];
/// vLLM's buckets for `vllm:inter_token_latency_seconds`.
const ITL_BUCKETS: [f64; 19] = [
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
];
/// vLLM's request latency buckets (`vllm:e2e_request_latency_seconds`).
const E2E_BUCKETS: [f64; 21] = [
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
];

/// The cache configuration `vllm:cache_config_info` states, fixed at
/// startup. vLLM puts every field of its `CacheConfig` in labels; these are
/// the ones with a meaning here, under vLLM's names.
#[derive(Debug, Clone, PartialEq)]
pub struct CacheConfigInfo {
    pub block_size: usize,
    pub num_gpu_blocks: usize,
    pub num_cpu_blocks: usize,
    /// `--num-gpu-blocks-override`.
    pub num_gpu_blocks_override: Option<usize>,
    pub enable_prefix_caching: bool,
    /// `--kv-cache-dtype` as given (`auto`, `float16`, `float32`).
    pub cache_dtype: &'static str,
    pub gpu_memory_utilization: f64,
    /// `--swap-space`, GiB.
    pub swap_space: f64,
}

impl CacheConfigInfo {
    /// The labels, values spelled as Python's `str()` spells them.
    fn labels(&self) -> Vec<(&'static str, String)> {
        let py_bool = |b: bool| if b { "True" } else { "False" }.to_string();
        vec![
            ("block_size", self.block_size.to_string()),
            ("cache_dtype", self.cache_dtype.to_string()),
            ("enable_prefix_caching", py_bool(self.enable_prefix_caching)),
            (
                "gpu_memory_utilization",
                format!("{:?}", self.gpu_memory_utilization),
            ),
            ("num_cpu_blocks", self.num_cpu_blocks.to_string()),
            ("num_gpu_blocks", self.num_gpu_blocks.to_string()),
            (
                "num_gpu_blocks_override",
                self.num_gpu_blocks_override
                    .map_or_else(|| "None".to_string(), |n| n.to_string()),
            ),
            ("swap_space", format!("{:?}", self.swap_space)),
        ]
    }
}

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
    /// Set once at startup (`vllm:cache_config_info`).
    cache_config: OnceLock<CacheConfigInfo>,
    /// The KV event publisher's counters, with `--kv-events-config`.
    kv_events: OnceLock<Arc<PublisherStats>>,
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
            cache_config: OnceLock::new(),
            kv_events: OnceLock::new(),
        }
    }
}

/// Label value escaping of the text format: backslash, double quote, newline.
pub(crate) fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// A `/metrics` body being written: families in the text format, each
/// sample with the labels every vLLM metric carries.
struct Text {
    out: String,
    /// `engine="0",model_name="..."`, sorted as Python's client sorts them.
    base: String,
}

impl Text {
    fn new(model: &str) -> Self {
        Self {
            out: String::new(),
            base: format!("engine=\"0\",model_name=\"{}\"", escape(model)),
        }
    }

    fn family(&mut self, name: &str, help: &str, kind: &str) {
        let _ = writeln!(self.out, "# HELP {name} {help}\n# TYPE {name} {kind}");
    }

    /// One sample; `extra` labels come after the base ones.
    fn sample(&mut self, name: &str, extra: &[(&str, &str)], v: impl std::fmt::Display) {
        let mut labels = self.base.clone();
        for (k, val) in extra {
            let _ = write!(labels, ",{k}=\"{}\"", escape(val));
        }
        let _ = writeln!(self.out, "{name}{{{labels}}} {v}");
    }

    fn gauge(&mut self, name: &str, help: &str, v: impl std::fmt::Display) {
        self.family(name, help, "gauge");
        self.sample(name, &[], v);
    }

    /// A counter; `name` ends in `_total`, as vLLM's exposition names it.
    fn counter(&mut self, name: &str, help: &str, v: u64) {
        self.family(name, help, "counter");
        self.sample(name, &[], v);
    }

    /// A counter with one more label, a sample per value.
    fn counter_by(&mut self, name: &str, help: &str, label: &str, values: &[(&str, u64)]) {
        self.family(name, help, "counter");
        for (l, v) in values {
            self.sample(name, &[(label, l)], v);
        }
    }

    fn histogram(&mut self, name: &str, help: &str, h: &Histogram) {
        let s = h.snapshot();
        self.family(name, help, "histogram");
        let bucket = format!("{name}_bucket");
        let mut cum = 0;
        for (b, c) in h.bounds.iter().zip(&s.counts) {
            cum += c;
            self.sample(&bucket, &[("le", &format!("{b:?}"))], cum);
        }
        self.sample(&bucket, &[("le", "+Inf")], s.count);
        self.sample(&format!("{name}_sum"), &[], s.sum);
        self.sample(&format!("{name}_count"), &[], s.count);
    }

    /// An info gauge (value 1, the facts in labels, sorted by name with
    /// vLLM's `engine` among them; no `model_name`, as vLLM's).
    fn info(&mut self, name: &str, help: &str, labels: &[(&'static str, String)]) {
        self.family(name, help, "gauge");
        let mut all: Vec<(&str, &str)> = labels.iter().map(|(k, v)| (*k, v.as_str())).collect();
        all.push(("engine", "0"));
        all.sort();
        let body: Vec<String> = all
            .iter()
            .map(|(k, v)| format!("{k}=\"{}\"", escape(v)))
            .collect();
        let _ = writeln!(self.out, "{name}{{{}}} 1", body.join(","));
    }
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

    /// States the cache configuration (`vllm:cache_config_info`); the
    /// first call wins.
    pub fn set_cache_config(&self, info: CacheConfigInfo) {
        let _ = self.cache_config.set(info);
    }

    /// Reports the KV event publisher's counters; the first call wins.
    pub fn set_kv_events(&self, stats: Arc<PublisherStats>) {
        let _ = self.kv_events.set(stats);
    }

    /// The `/metrics` body.
    pub fn render(&self, s: &BackendStats, model: &str) -> String {
        let mut t = Text::new(model);
        t.gauge(
            "vllm:num_requests_running",
            "Number of requests in model execution batches.",
            s.num_running,
        );
        t.gauge(
            "vllm:num_requests_waiting",
            "Number of requests waiting to be processed.",
            s.num_waiting,
        );
        t.gauge(
            "vllm:kv_cache_usage_perc",
            "KV-cache usage. 1 means 100 percent usage.",
            s.kv_usage,
        );
        if let Some(c) = self.cache_config.get() {
            t.info(
                "vllm:cache_config_info",
                "Information of the LLMEngine CacheConfig",
                &c.labels(),
            );
        }
        t.counter(
            "vllm:prefix_cache_queries_total",
            "Prefix cache queries, in terms of number of queried tokens.",
            s.prefix_cache_queries,
        );
        t.counter(
            "vllm:prefix_cache_hits_total",
            "Prefix cache hits, in terms of number of cached tokens.",
            s.prefix_cache_hits,
        );
        t.counter(
            "vllm:num_preemptions_total",
            "Cumulative number of preemption from the engine.",
            s.preemptions_swap + s.preemptions_recompute,
        );
        t.counter(
            "vllm:prompt_tokens_total",
            "Number of prefill tokens processed.",
            s.prompt_tokens,
        );
        t.counter(
            "vllm:generation_tokens_total",
            "Number of generation tokens processed.",
            s.generation_tokens,
        );
        t.counter_by(
            "vllm:request_success_total",
            "Count of successfully processed requests.",
            "finished_reason",
            &[
                ("stop", self.requests_ok.load(Ordering::Relaxed)),
                ("length", self.requests_length.load(Ordering::Relaxed)),
                ("abort", self.requests_aborted.load(Ordering::Relaxed)),
            ],
        );
        t.histogram(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            &self.ttft,
        );
        t.histogram(
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            &self.itl,
        );
        t.histogram(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            &self.e2e,
        );
        // Ours, beyond vLLM's list.
        t.gauge(
            "vllm:num_requests_swapped",
            "Number of requests swapped to the CPU pool.",
            s.num_swapped,
        );
        t.counter_by(
            "vllm:num_preemptions_by_mode_total",
            "Preemptions, by how the preempted request was set aside.",
            "mode",
            &[
                ("swap", s.preemptions_swap),
                ("recompute", s.preemptions_recompute),
            ],
        );
        t.gauge(
            "vllm:kv_cache_total_blocks",
            "Blocks in the KV cache pool.",
            s.kv_total_blocks,
        );
        t.gauge(
            "vllm:kv_cache_free_blocks",
            "Free blocks in the KV cache pool.",
            s.kv_free_blocks,
        );
        t.gauge(
            "vllm:cpu_cache_total_blocks",
            "Blocks in the CPU swap pool.",
            s.cpu_total_blocks,
        );
        t.gauge(
            "vllm:cpu_cache_free_blocks",
            "Free blocks in the CPU swap pool.",
            s.cpu_free_blocks,
        );
        t.counter(
            "vllm:request_rejected_total",
            "Requests refused at admission (e.g. 429: too many waiting).",
            self.requests_rejected.load(Ordering::Relaxed),
        );
        if let Some(spec) = &s.spec {
            spec_counters(&mut t, spec);
        }
        if let Some(k) = self.kv_events.get() {
            t.counter(
                "vllm:kv_events_published_batches_total",
                "KV cache event batches sent on the publisher's socket.",
                k.published.load(Ordering::Relaxed),
            );
            t.counter(
                "vllm:kv_events_dropped_batches_total",
                "KV cache event batches dropped because the publisher's queue was full \
                 (their sequence numbers are skipped).",
                k.dropped.load(Ordering::Relaxed),
            );
        }
        t.out
    }
}

/// vLLM's speculative decoding counters (present only while it is on).
fn spec_counters(t: &mut Text, spec: &SpecMetrics) {
    let s = &spec.stats;
    t.counter(
        "vllm:spec_decode_num_drafts_total",
        "Number of spec decoding drafts.",
        s.drafts,
    );
    t.counter(
        "vllm:spec_decode_num_draft_tokens_total",
        "Number of draft tokens.",
        s.draft_tokens,
    );
    t.counter(
        "vllm:spec_decode_num_accepted_tokens_total",
        "Number of accepted tokens.",
        s.accepted_tokens,
    );
    let positions: Vec<(String, u64)> = s
        .accepted_per_pos
        .iter()
        .take(spec.num_speculative_tokens)
        .enumerate()
        .map(|(i, &n)| (i.to_string(), n))
        .collect();
    let labels: Vec<(&str, u64)> = positions.iter().map(|(p, n)| (p.as_str(), *n)).collect();
    t.counter_by(
        "vllm:spec_decode_num_accepted_tokens_per_pos_total",
        "Accepted tokens per draft position.",
        "position",
        &labels,
    );
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
        let mut t = Text::new("m");
        t.histogram("x", "help", &h);
        let out = t.out;
        let l = "engine=\"0\",model_name=\"m\"";
        assert!(
            out.contains(&format!("x_bucket{{{l},le=\"0.1\"}} 2\n")),
            "{out}"
        );
        assert!(
            out.contains(&format!("x_bucket{{{l},le=\"1.0\"}} 3\n")),
            "{out}"
        );
        assert!(
            out.contains(&format!("x_bucket{{{l},le=\"+Inf\"}} 4\n")),
            "{out}"
        );
        assert!(out.contains(&format!("x_sum{{{l}}} 3.65\n")), "{out}");
        assert!(out.contains(&format!("x_count{{{l}}} 4\n")), "{out}");
    }

    #[test]
    fn render_lists_engine_numbers_with_vllm_labels() {
        let m = Metrics::default();
        let s = BackendStats {
            num_running: 3,
            kv_free_blocks: 17,
            preemptions_swap: 5,
            preemptions_recompute: 2,
            ..BackendStats::default()
        };
        let out = m.render(&s, "a \"b\"\\c");
        let l = "engine=\"0\",model_name=\"a \\\"b\\\"\\\\c\"";
        assert!(
            out.contains(&format!("\nvllm:num_requests_running{{{l}}} 3\n")),
            "{out}"
        );
        assert!(
            out.contains(&format!("\nvllm:kv_cache_free_blocks{{{l}}} 17\n")),
            "{out}"
        );
        assert!(
            out.contains(&format!("\nvllm:num_preemptions_total{{{l}}} 7\n")),
            "{out}"
        );
        assert!(out.contains(&format!(
            "vllm:num_preemptions_by_mode_total{{{l},mode=\"swap\"}} 5\n"
        )));
        assert!(out.contains("# TYPE vllm:time_to_first_token_seconds histogram"));
        assert!(
            out.contains(&format!("\nvllm:kv_cache_usage_perc{{{l}}} 0\n")),
            "{out}"
        );
        assert!(!out.contains("gpu_cache_usage_perc"), "{out}");
        // Not stated until startup sets it.
        assert!(!out.contains("cache_config_info"), "{out}");
    }

    #[test]
    fn cache_config_info_spells_values_as_python() {
        let m = Metrics::default();
        m.set_cache_config(CacheConfigInfo {
            block_size: 16,
            num_gpu_blocks: 1024,
            num_cpu_blocks: 0,
            num_gpu_blocks_override: None,
            enable_prefix_caching: true,
            cache_dtype: "auto",
            gpu_memory_utilization: 0.9,
            swap_space: 4.0,
        });
        let out = m.render(&BackendStats::default(), "m");
        let want = "vllm:cache_config_info{block_size=\"16\",cache_dtype=\"auto\",\
                    enable_prefix_caching=\"True\",engine=\"0\",gpu_memory_utilization=\"0.9\",\
                    num_cpu_blocks=\"0\",num_gpu_blocks=\"1024\",num_gpu_blocks_override=\"None\",\
                    swap_space=\"4.0\"} 1\n";
        assert!(out.contains(want), "{want} in {out}");
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
            let line = format!(
                "vllm:request_success_total{{engine=\"0\",model_name=\"m\",finished_reason=\"{reason}\"}} {n}\n"
            );
            assert!(out.contains(&line), "{line} in {out}");
        }
    }
}
