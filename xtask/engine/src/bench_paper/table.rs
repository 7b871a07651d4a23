//! The markdown report of `bench-paper`: our figures beside the paper's.

use super::drivers::RunStats;
use super::hint::Policy;
use super::sharing::{self, Mode, Row};
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
    /// Parallel-sampling / beam-search memory rows.
    pub sharing: &'a [Row],
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
    s.push_str(&sharing_figures(i.sharing));
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
    if !i.sharing.is_empty() {
        s.push('\n');
        s.push_str(&render_sharing(i.sharing));
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

fn pct(x: Option<f64>) -> String {
    x.map_or("n/a".into(), |v| format!("{:.1}%", 100.0 * v))
}

/// Range "lo-hi%" of the time-averaged savings of `rows`; `None` if empty.
pub fn saving_range<'a>(rows: impl Iterator<Item = &'a Row>) -> Option<String> {
    let v: Vec<f64> = rows.filter_map(Row::avg_saving).collect();
    if v.is_empty() {
        return None;
    }
    let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    Some(format!("{:.1}-{:.1}%", 100.0 * lo, 100.0 * hi))
}

/// Rows of the figures table: our saving range beside the paper's, per
/// workload and mode.
fn sharing_figures(rows: &[Row]) -> String {
    let mut s = String::new();
    if rows.is_empty() {
        let _ = writeln!(s, "| memory saving, parallel sampling / beam search | not run | Alpaca 6.1-9.8% / 37.6-55.2%; ShareGPT 16.2-30.5% / 44.3-66.3% |");
        return s;
    }
    for w in ["ShareGPT", "Alpaca-like"] {
        for m in Mode::ALL {
            if let Some(r) = saving_range(rows.iter().filter(|r| r.workload == w && r.mode == m)) {
                let _ = writeln!(
                    s,
                    "| memory saving, {}, {w} (time-averaged blocks, real model) | {r} | {} |",
                    m.name(),
                    sharing::paper_range(w, m)
                );
            }
        }
    }
    s
}

/// One row of the sharing table (also printed as progress).
pub fn sharing_line(r: &Row) -> String {
    format!(
        "| {} | {} | {} | {:.1} | {:.1} | {} | {} | {} | {} | {} |",
        r.workload,
        r.mode.name(),
        r.k,
        r.shared.0,
        r.indep.0,
        r.shared.1,
        r.indep.1,
        pct(r.avg_saving()),
        pct(r.peak_saving()),
        sharing::paper_range(r.workload, r.mode)
    )
}

/// The parallel-sampling / beam-search table on its own.
pub fn render_sharing(rows: &[Row]) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "Memory saving of parallel sampling and beam search (real model, paged KV, prefix caching off, every sequence runs to its capped reference length; KV blocks in use, one group of k vs k independent requests):\n");
    let _ = writeln!(s, "| workload | mode | k | avg blocks, shared | avg blocks, independent | peak, shared | peak, independent | saving (avg) | saving (peak) | paper (saving range) |");
    let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|---|");
    for r in rows {
        let _ = writeln!(s, "{}", sharing_line(r));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(workload: &'static str, mode: Mode, shared: f64, indep: f64) -> Row {
        Row {
            workload,
            mode,
            k: 2,
            shared: (shared, shared as usize),
            indep: (indep, indep as usize),
        }
    }

    #[test]
    fn saving_range_spans_min_and_max() {
        let rows = [
            row("ShareGPT", Mode::Beam, 50.0, 100.0),
            row("ShareGPT", Mode::Beam, 80.0, 100.0),
        ];
        assert_eq!(saving_range(rows.iter()).as_deref(), Some("20.0-50.0%"));
        assert_eq!(saving_range([].iter()), None);
    }

    #[test]
    fn figures_put_ours_beside_the_papers() {
        let rows = [row("Alpaca-like", Mode::Parallel, 90.0, 100.0)];
        let f = sharing_figures(&rows);
        assert!(f.contains("parallel sampling, Alpaca-like"), "{f}");
        assert!(f.contains("| 10.0-10.0% | 6.1-9.8% |"), "{f}");
        assert!(!f.contains("beam search"), "{f}");
    }
}
