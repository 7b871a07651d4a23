//! The result table, laid out like vLLM's `benchmark_serving`.

use super::metrics::{Dist, Slo, Summary};
use std::fmt::Write;

fn row(s: &mut String, name: &str, v: impl std::fmt::Display) {
    let _ = writeln!(s, "{name:<40}{v:<10}");
}

fn section(s: &mut String, title: &str) {
    let _ = writeln!(s, "{title:-^50}");
}

fn dist(s: &mut String, short: &str, d: &Dist) {
    row(s, &format!("Mean {short} (ms):"), format!("{:.2}", d.mean));
    row(
        s,
        &format!("Median {short} (ms):"),
        format!("{:.2}", d.median),
    );
    row(s, &format!("P99 {short} (ms):"), format!("{:.2}", d.p99));
}

/// Renders the table for one run.
pub fn table(m: &Summary, rate: f64, max_conc: Option<usize>, slo: Option<&Slo>) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "{:=^50}", " Serving Benchmark Result ");
    row(
        &mut s,
        "Request rate (req/s):",
        if rate.is_finite() {
            format!("{rate}")
        } else {
            "inf".into()
        },
    );
    row(
        &mut s,
        "Max concurrency:",
        max_conc.map_or("none".into(), |c| c.to_string()),
    );
    row(&mut s, "Successful requests:", m.completed);
    row(&mut s, "Failed requests:", m.failed);
    row(
        &mut s,
        "Benchmark duration (s):",
        format!("{:.2}", m.duration_s),
    );
    row(&mut s, "Total input tokens:", m.total_input_tokens);
    row(&mut s, "Total generated tokens:", m.total_output_tokens);
    row(
        &mut s,
        "Request throughput (req/s):",
        format!("{:.2}", m.request_throughput),
    );
    if let (Some(g), Some(slo)) = (m.goodput, slo) {
        let _ = slo;
        row(&mut s, "Request goodput (req/s):", format!("{g:.2}"));
    }
    row(
        &mut s,
        "Output token throughput (tok/s):",
        format!("{:.2}", m.output_throughput),
    );
    row(
        &mut s,
        "Total Token throughput (tok/s):",
        format!("{:.2}", m.total_token_throughput),
    );
    row(
        &mut s,
        "Normalized latency (s/token):",
        format!("{:.4}", m.normalized_latency_s),
    );
    section(&mut s, "Time to First Token");
    dist(&mut s, "TTFT", &m.ttft_ms);
    section(&mut s, "Time per Output Token (excl. 1st token)");
    dist(&mut s, "TPOT", &m.tpot_ms);
    section(&mut s, "Inter-token Latency");
    dist(&mut s, "ITL", &m.itl_ms);
    section(&mut s, "End-to-end Latency");
    dist(&mut s, "E2EL", &m.e2el_ms);
    let _ = writeln!(s, "{:=^50}", "");
    s
}
