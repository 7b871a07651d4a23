//! `cargo xtask bench-serve`: the field's serving benchmark against any
//! OpenAI-compatible server (ours, llama.cpp's `llama-server`, vLLM).
//!
//! N requests from a workload, Poisson arrivals at `--request-rate` (or all at
//! once with `inf`), optional `--max-concurrency`, streaming completions with
//! `max_tokens` = reference output length and `ignore_eos`. Prints vLLM's
//! result table, writes JSON; `--sweep` runs several rates and draws
//! normalized latency against request rate as SVG.

pub mod client;
pub mod metrics;
mod report;
pub mod spec;

use crate::plot::{self, Series};
use crate::workloads::{self, Dataset};
use anyhow::{bail, Context, Result};
use client::{CompletionRequest, Endpoint};
use metrics::{RequestTrace, Slo, Summary};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Arguments of `bench-serve`.
#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    #[arg(long, default_value = "http://127.0.0.1:8000")]
    pub base_url: String,
    /// Model name sent in each request.
    #[arg(long, default_value = "default")]
    pub model: String,
    /// Model file whose tokenizer builds the synthetic workloads and names
    /// the ShareGPT file (default: the default model).
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    #[arg(long, value_enum, default_value = "sharegpt")]
    pub dataset: Dataset,
    #[arg(long, default_value_t = 100)]
    pub num_prompts: usize,
    /// Requests per second (Poisson), or `inf` for all at once.
    #[arg(long, default_value = "inf")]
    pub request_rate: String,
    #[arg(long)]
    pub max_concurrency: Option<usize>,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// SLOs for goodput, e.g. `ttft:500,tpot:50` (milliseconds; also `e2el`).
    #[arg(long)]
    pub goodput: Option<String>,
    /// Caps every request's output length (for short trial runs).
    #[arg(long)]
    pub max_tokens_cap: Option<usize>,
    /// Label of this configuration in sweep plots.
    #[arg(long, default_value = "server")]
    pub label: String,
    /// JSON results file.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Comma-separated request rates: one run each, then an SVG plot
    /// (written next to `--out`, or `sweep.svg`).
    #[arg(long)]
    pub sweep: Option<String>,
    /// Earlier sweep JSON files whose lines are drawn in the same plot.
    #[arg(long, value_delimiter = ',')]
    pub plot_with: Vec<PathBuf>,
}

/// Results of one run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunResult {
    pub label: String,
    pub dataset: String,
    pub request_rate: f64,
    pub max_concurrency: Option<usize>,
    pub num_prompts: usize,
    pub summary: Summary,
    /// Speculative decoding's figures, when the server reports them.
    #[serde(default)]
    pub spec: Option<spec::SpecSummary>,
    pub traces: Vec<RequestTrace>,
}

/// A sweep: one label, several rates.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SweepResult {
    pub label: String,
    pub runs: Vec<RunResult>,
}

/// Parses `inf` or a positive number.
pub fn parse_rate(s: &str) -> Result<f64> {
    let s = s.trim();
    if s.eq_ignore_ascii_case("inf") {
        return Ok(f64::INFINITY);
    }
    let r: f64 = s
        .parse()
        .with_context(|| format!("bad request rate {s:?}"))?;
    if r.is_nan() || r <= 0.0 {
        bail!("request rate must be positive (got {r})");
    }
    Ok(r)
}

/// Parses `ttft:500,tpot:50,e2el:2000` (milliseconds).
pub fn parse_slo(s: &str) -> Result<Slo> {
    let mut slo = Slo::default();
    for part in s.split(',').filter(|p| !p.trim().is_empty()) {
        let (k, v) = part
            .split_once(':')
            .with_context(|| format!("SLO {part:?} is not name:milliseconds"))?;
        let v: f64 = v
            .trim()
            .parse()
            .with_context(|| format!("bad SLO value in {part:?}"))?;
        if v.is_nan() || v <= 0.0 {
            bail!("SLO {part:?} must be positive");
        }
        match k.trim() {
            "ttft" => slo.ttft_ms = Some(v),
            "tpot" => slo.tpot_ms = Some(v),
            "e2el" => slo.e2el_ms = Some(v),
            other => bail!("unknown SLO {other:?} (ttft, tpot, e2el)"),
        }
    }
    Ok(slo)
}

/// Send offsets (seconds from start) of `n` Poisson arrivals at `rate`;
/// all zero for an infinite rate.
pub fn arrival_offsets(n: usize, rate: f64, seed: u64) -> Vec<f64> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut t = 0.0;
    (0..n)
        .map(|_| {
            if rate.is_finite() {
                let u: f64 = rng.gen_range(f64::EPSILON..1.0);
                t += -u.ln() / rate;
            }
            t
        })
        .collect()
}

/// Runs the task.
pub fn run(args: Args) -> Result<()> {
    let ep = client::parse_base_url(&args.base_url)?;
    let slo = args.goodput.as_deref().map(parse_slo).transpose()?;
    let model_path = args
        .tokenizer
        .clone()
        .unwrap_or_else(model_loader::paths::default_model_path);
    let mut items = workloads::load(args.dataset, &model_path, args.num_prompts, args.seed)?;
    if let Some(cap) = args.max_tokens_cap {
        items
            .iter_mut()
            .for_each(|w| w.output_len = w.output_len.min(cap.max(1)));
    }
    let reqs: Vec<CompletionRequest> = items
        .into_iter()
        .map(|w| CompletionRequest {
            model: args.model.clone(),
            prompt: w.prompt,
            prompt_len: w.prompt_len,
            max_tokens: w.output_len,
            ignore_eos: true,
        })
        .collect();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let rates: Vec<f64> = match &args.sweep {
        Some(list) => list.split(',').map(parse_rate).collect::<Result<_>>()?,
        None => vec![parse_rate(&args.request_rate)?],
    };
    let mut runs = Vec::new();
    for &rate in &rates {
        eprintln!(
            "rate {rate} req/s, {} requests, label {:?}",
            reqs.len(),
            args.label
        );
        // Scraping is best effort: a server without /metrics has no figures.
        let before = rt.block_on(spec::scrape(&ep)).ok().flatten();
        let (traces, duration) =
            rt.block_on(drive(&ep, &reqs, rate, args.max_concurrency, args.seed));
        let after = rt.block_on(spec::scrape(&ep)).ok().flatten();
        let summary = metrics::summarize(&traces, duration, slo.as_ref());
        print!(
            "{}",
            report::table(&summary, rate, args.max_concurrency, slo.as_ref())
        );
        let spec = before.zip(after).map(|(b, a)| spec::summarize(&b, &a));
        if let Some(s) = &spec {
            print!("{}", spec::report(s));
        }
        if let Some(e) = traces.iter().find_map(|t| t.error.as_ref()) {
            eprintln!("first error: {e}");
        }
        runs.push(RunResult {
            label: args.label.clone(),
            dataset: format!("{:?}", args.dataset).to_lowercase(),
            request_rate: rate,
            max_concurrency: args.max_concurrency,
            num_prompts: reqs.len(),
            summary,
            spec,
            traces,
        });
    }
    write_outputs(&args, runs)
}

fn write_outputs(args: &Args, mut runs: Vec<RunResult>) -> Result<()> {
    let out = args.out.clone();
    if args.sweep.is_none() {
        if let (Some(path), Some(run)) = (out, runs.pop()) {
            std::fs::write(&path, serde_json::to_string_pretty(&run)?)?;
            eprintln!("wrote {}", path.display());
        }
        return Ok(());
    }
    let sweep = SweepResult {
        label: args.label.clone(),
        runs,
    };
    let json_path = out.unwrap_or_else(|| PathBuf::from("sweep.json"));
    std::fs::write(&json_path, serde_json::to_string_pretty(&sweep)?)?;
    let mut series = Vec::new();
    for p in &args.plot_with {
        let text =
            std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
        let other: SweepResult = serde_json::from_str(&text)
            .with_context(|| format!("{} is not a sweep", p.display()))?;
        series.push(to_series(&other));
    }
    series.push(to_series(&sweep));
    let svg_path = json_path.with_extension("svg");
    let svg = plot::line_plot(
        "Normalized latency vs request rate",
        "request rate (req/s)",
        "normalized latency (s/token)",
        &series,
    );
    std::fs::write(&svg_path, svg)?;
    eprintln!("wrote {} and {}", json_path.display(), svg_path.display());
    Ok(())
}

fn to_series(s: &SweepResult) -> Series {
    Series {
        label: s.label.clone(),
        points: s
            .runs
            .iter()
            .map(|r| (r.request_rate, r.summary.normalized_latency_s))
            .collect(),
    }
}

/// Sends every request at its arrival time (bounded by `max_concurrency`)
/// and returns the traces in request order and the run's duration.
async fn drive(
    ep: &Endpoint,
    reqs: &[CompletionRequest],
    rate: f64,
    max_concurrency: Option<usize>,
    seed: u64,
) -> (Vec<RequestTrace>, f64) {
    let offsets = arrival_offsets(reqs.len(), rate, seed);
    let limit = Arc::new(tokio::sync::Semaphore::new(
        max_concurrency.unwrap_or(tokio::sync::Semaphore::MAX_PERMITS),
    ));
    let done = Arc::new(AtomicUsize::new(0));
    let total = reqs.len();
    let start = Instant::now();
    let mut tasks = Vec::with_capacity(total);
    for (req, off) in reqs.iter().cloned().zip(offsets) {
        let at = start + Duration::from_secs_f64(off);
        tokio::time::sleep_until(at.into()).await;
        let permit = limit.clone().acquire_owned().await;
        let ep = ep.clone();
        let done = done.clone();
        tasks.push(tokio::spawn(async move {
            let t = client::send(&ep, &req).await;
            drop(permit);
            let n = done.fetch_add(1, Ordering::Relaxed) + 1;
            progress(n, total);
            t
        }));
    }
    let mut traces = Vec::with_capacity(total);
    for t in tasks {
        traces.push(t.await.unwrap_or_else(|e| RequestTrace {
            error: Some(format!("task failed: {e}")),
            ..RequestTrace::default()
        }));
    }
    eprintln!();
    (traces, start.elapsed().as_secs_f64())
}

fn progress(done: usize, total: usize) {
    let width = 40;
    let filled = done * width / total.max(1);
    eprint!(
        "\r[{}{}] {done}/{total}",
        "#".repeat(filled),
        ".".repeat(width - filled)
    );
    let _ = std::io::stderr().flush();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_and_slos_parse() {
        assert!(parse_rate("inf").unwrap().is_infinite());
        assert_eq!(parse_rate("2.5").unwrap(), 2.5);
        assert!(parse_rate("0").is_err() && parse_rate("-1").is_err() && parse_rate("x").is_err());
        let s = parse_slo("ttft:500,tpot:50").unwrap();
        assert_eq!(
            (s.ttft_ms, s.tpot_ms, s.e2el_ms),
            (Some(500.0), Some(50.0), None)
        );
        assert!(parse_slo("ttft=5").is_err());
        assert!(parse_slo("foo:5").is_err());
        assert!(parse_slo("ttft:-5").is_err());
    }

    #[test]
    fn poisson_offsets_have_the_right_rate() {
        let off = arrival_offsets(20_000, 4.0, 3);
        assert!(off.windows(2).all(|w| w[1] >= w[0]));
        let mean_gap = off[off.len() - 1] / off.len() as f64;
        assert!((mean_gap - 0.25).abs() < 0.01, "mean gap {mean_gap}");
        assert!(arrival_offsets(5, f64::INFINITY, 0)
            .iter()
            .all(|&t| t == 0.0));
    }
}
