//! The markdown report of `bench-paper`: our figures beside the paper's.

use super::drivers::RunStats;
use super::hint::Policy;
use crate::plot::Series;
use std::fmt::Write;

/// What the report shows.
pub struct Inputs<'a> {
    pub n: usize,
    pub rate: f64,
    pub kv_tokens: usize,
    pub max_output: Option<usize>,
    pub fixed: &'a [(Policy, RunStats)],
    /// (shots, caching off, caching on).
    pub prefix: &'a [(usize, RunStats, RunStats)],
    pub curves: &'a [Series],
}

fn ratio(a: f64, b: f64) -> String {
    if b > 0.0 {
        format!("{:.2}x", a / b)
    } else {
        "n/a".into()
    }
}

/// Renders the report.
pub fn render(mode: &str, i: &Inputs) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "# bench-paper\n\nMode: {mode}\n");
    let cap = i.max_output.map_or("none".into(), |c| c.to_string());
    let _ = writeln!(
        s,
        "ShareGPT trace: {} requests, Poisson {} req/s, KV budget {} token slots for every policy, output cap {cap}.\n",
        i.n, i.rate, i.kv_tokens
    );
    let _ = writeln!(s, "| policy | avg running requests | allocated KV slots holding token states | whole KV budget holding token states | finished | refused | preemptions | throughput (req/s) | normalized latency (s/token) |");
    let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|");
    for (p, r) in i.fixed {
        let _ = writeln!(
            s,
            "| {} | {:.2} | {:.1}% | {:.1}% | {} | {} | {} | {:.3} | {:.4} |",
            p.name(),
            r.avg_running(),
            100.0 * r.used_share(),
            100.0 * r.budget_share(),
            r.finished.len(),
            r.refused,
            r.preemptions,
            r.throughput(),
            r.normalized_latency()
        );
    }
    let get = |p: Policy| i.fixed.iter().find(|(q, _)| *q == p).map(|(_, r)| r);
    let run = |p| get(p).map_or(0.0, RunStats::avg_running);
    let share = |p| get(p).map_or(0.0, RunStats::used_share);
    let orca = [Policy::OrcaMax, Policy::OrcaPow2, Policy::OrcaOracle];
    let lo = orca.iter().map(|&p| share(p)).fold(f64::INFINITY, f64::min);
    let hi = orca.iter().map(|&p| share(p)).fold(0.0, f64::max);
    let _ = writeln!(
        s,
        "\n| figure | ours | paper (OPT-13B, A100) |\n|---|---|---|"
    );
    let _ = writeln!(
        s,
        "| running requests, paged / orca-oracle | {} | 2.2x |",
        ratio(run(Policy::Paged), run(Policy::OrcaOracle))
    );
    let _ = writeln!(
        s,
        "| running requests, paged / orca-max | {} | 4.3x |",
        ratio(run(Policy::Paged), run(Policy::OrcaMax))
    );
    let _ = writeln!(
        s,
        "| KV share holding token states, paged | {:.1}% | 96.3% |",
        100.0 * share(Policy::Paged)
    );
    let _ = writeln!(
        s,
        "| KV share holding token states, Orca variants | {:.1}-{:.1}% | 20.4-38.2% |",
        100.0 * lo,
        100.0 * hi
    );
    for (shots, off, on) in i.prefix {
        let _ = writeln!(
            s,
            "| shared prefix {shots}-shot, throughput caching on / off ({:.3} / {:.3} req/s) | {} | {} (vLLM over Orca-Oracle) |",
            on.throughput(),
            off.throughput(),
            ratio(on.throughput(), off.throughput()),
            if *shots == 1 { "1.67x" } else { "3.58x" }
        );
    }
    let _ = writeln!(s, "| memory saving, parallel sampling / beam search | see issue 5 | Alpaca 6.1-9.8% / 37.6-55.2%; ShareGPT 16.2-30.5% / 44.3-66.3% |");
    for (p, r) in i.fixed {
        if let Some(e) = &r.first_refusal {
            let _ = writeln!(
                s,
                "\n{}: {} refused; first reason: {e}",
                p.name(),
                r.refused
            );
        }
    }
    let _ = writeln!(s, "\nNormalized latency (s/token) vs request rate:\n");
    let rates: Vec<f64> = i
        .curves
        .first()
        .map(|c| c.points.iter().map(|p| p.0).collect())
        .unwrap_or_default();
    let _ = write!(s, "| policy |");
    for r in &rates {
        let _ = write!(s, " {r} req/s |");
    }
    let _ = writeln!(s, "\n|---|{}", "---|".repeat(rates.len()));
    for c in i.curves {
        let _ = write!(s, "| {} |", c.label);
        for p in &c.points {
            let _ = write!(s, " {:.4} |", p.1);
        }
        let _ = writeln!(s);
    }
    s
}
