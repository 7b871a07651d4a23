//! `cargo xtask bench-paper`: the PagedAttention paper's memory results on
//! our engine, same model and same KV budget for every policy: `paged` (ours)
//! against the contiguous-reservation baselines `orca-max`, `orca-pow2`,
//! `orca-oracle` behind the same `KvCacheManager` trait.
//!
//! Default mode runs the real model (whole engine, CPU, wall clock) on small
//! traces. `--simulate` runs the real scheduler and KV managers with a
//! step-time model instead of the forward pass (see [`drivers`]), for
//! paper-sized traces. The mode is printed with every table.

mod drivers;
mod hint;
mod sharing;
mod table;

use crate::bench_serve::arrival_offsets;
use crate::plot::{self, Series};
use crate::workloads::{self, Dataset, WorkItem};
use anyhow::{Context, Result};
use drivers::{RunStats, StepModel, TraceRequest};
use engine::scheduler::SchedulerConfig;
use hint::{KvSetup, Policy};
use model_loader::Tokenizer;
use std::path::{Path, PathBuf};

/// Arguments of `bench-paper`.
#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// Memory-only simulation: real scheduler + KV managers, step-time model.
    #[arg(long)]
    pub simulate: bool,
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Requests in the ShareGPT trace (default: 12 real, 1000 simulated).
    #[arg(long)]
    pub num_prompts: Option<usize>,
    /// Poisson rate of the fixed-rate trace, req/s (default: 2 real, 8 simulated: memory-bound).
    #[arg(long)]
    pub rate: Option<f64>,
    /// Rates of the normalized-latency curves (default: "1,3" real, "1,2,3,4,6,8" simulated; "none" skips them).
    #[arg(long)]
    pub rates: Option<String>,
    /// KV budget in token slots, the same for every policy (default: 3072 real, 16384 simulated).
    #[arg(long)]
    pub kv_tokens: Option<usize>,
    /// Caps reference outputs (default: 64 real, none simulated).
    #[arg(long)]
    pub max_output: Option<usize>,
    #[arg(long, default_value_t = 16)]
    pub block_size: usize,
    /// Block size of the Orca baselines in simulation (1: the paper's token granularity).
    #[arg(long, default_value_t = 1)]
    pub orca_block_size: usize,
    /// Requests of the shared-prefix runs (default: 16 real, 200 simulated; 0 skips them).
    #[arg(long)]
    pub prefix_prompts: Option<usize>,
    /// Step time model of `--simulate`: fixed part, ms.
    #[arg(long, default_value_t = 20.0)]
    pub step_base_ms: f64,
    /// Step time model of `--simulate`: per batched token, ms.
    #[arg(long, default_value_t = 0.1)]
    pub step_token_ms: f64,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Prompts per workload (ShareGPT, Alpaca-like) of the parallel-sampling /
    /// beam-search memory runs (always the real model; 0 skips them).
    #[arg(long, default_value_t = 4)]
    pub sharing_prompts: usize,
    /// Group sizes of those runs: n of parallel sampling and beam width.
    #[arg(long, default_value = "2,4,6")]
    pub sharing_widths: String,
    /// Longest prompt (tokens) taken into those runs; longer ones are skipped.
    #[arg(long, default_value_t = 512)]
    pub sharing_max_prompt: usize,
    /// Runs only the parallel-sampling / beam-search memory section.
    #[arg(long)]
    pub sharing_only: bool,
    /// Markdown table output (default: bench-paper[-sim].md); the plot goes next to it as .svg.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// Resolved settings.
struct Setup {
    simulate: bool,
    model: PathBuf,
    n: usize,
    rate: f64,
    rates: Vec<f64>,
    kv_tokens: usize,
    max_output: Option<usize>,
    prefix_n: usize,
    sched: SchedulerConfig,
    step: StepModel,
}

impl Setup {
    fn new(a: &Args) -> Result<Self> {
        let sim = a.simulate;
        let rates = a
            .rates
            .clone()
            .unwrap_or_else(|| if sim { "1,2,3,4,6,8" } else { "1,3" }.into());
        let max_output = if sim {
            a.max_output
        } else {
            Some(a.max_output.unwrap_or(64))
        };
        let max_model_len = max_output.map_or(2048, |c| 1024 + c);
        Ok(Self {
            simulate: sim,
            model: a
                .model
                .clone()
                .unwrap_or_else(model_loader::paths::default_model_path),
            n: a.num_prompts.unwrap_or(if sim { 1000 } else { 12 }),
            rate: a.rate.unwrap_or(if sim { 8.0 } else { 2.0 }),
            rates: rates
                .split(',')
                .filter(|r| !r.trim().is_empty() && r.trim() != "none")
                .map(|r| {
                    r.trim()
                        .parse::<f64>()
                        .with_context(|| format!("bad rate {r:?}"))
                })
                .collect::<Result<_>>()?,
            kv_tokens: a.kv_tokens.unwrap_or(if sim { 16384 } else { 3072 }),
            max_output,
            prefix_n: a.prefix_prompts.unwrap_or(if sim { 200 } else { 16 }),
            sched: SchedulerConfig {
                max_model_len,
                ..SchedulerConfig::default()
            },
            step: StepModel {
                base_s: a.step_base_ms / 1000.0,
                per_token_s: a.step_token_ms / 1000.0,
            },
        })
    }

    fn mode(&self) -> String {
        if self.simulate {
            format!(
                "SIMULATED: real scheduler + real KV managers, no forward pass; step time = {:.1} ms + {:.3} ms x batched tokens (virtual clock)",
                self.step.base_s * 1e3,
                self.step.per_token_s * 1e3
            )
        } else {
            format!(
                "REAL MODEL: whole engine, {} on the CPU executor, wall clock",
                self.model.display()
            )
        }
    }

    fn run(&self, trace: &[TraceRequest], kv: &KvSetup) -> Result<RunStats> {
        if self.simulate {
            drivers::run_simulated(trace, kv, &self.sched, self.step)
        } else {
            drivers::run_real(trace, kv, &self.sched, &self.model)
        }
    }
}

fn tokenize(
    tok: &Tokenizer,
    items: &[WorkItem],
    rate: f64,
    seed: u64,
    cap: Option<usize>,
) -> Result<Vec<TraceRequest>> {
    let offsets = arrival_offsets(items.len(), rate, seed);
    items
        .iter()
        .zip(offsets)
        .map(|(w, arrival)| {
            Ok(TraceRequest {
                prompt: tok.encode(&w.prompt, false)?,
                output_len: cap.map_or(w.output_len, |c| w.output_len.min(c)),
                arrival,
            })
        })
        .collect()
}

/// Runs the task.
pub fn run(args: Args) -> Result<()> {
    let s = Setup::new(&args)?;
    let tok = model_loader::load_config_and_tokenizer(&s.model)?.tokenizer;
    eprintln!("{}", s.mode());
    let kv = |policy, prefix_caching| KvSetup {
        policy,
        budget_tokens: s.kv_tokens,
        paged_block_size: args.block_size,
        orca_block_size: if s.simulate {
            args.orca_block_size
        } else {
            args.block_size
        },
        prefix_caching,
        max_model_len: s.sched.max_model_len,
    };
    let sharing_rows = run_sharing(&args, &s, &tok)?;
    if args.sharing_only {
        let md = table::render_sharing(&sharing_rows);
        print!("{md}");
        let out = args
            .out
            .clone()
            .unwrap_or_else(|| PathBuf::from("bench-paper-sharing.md"));
        write(&out, &md)?;
        eprintln!("wrote {}", out.display());
        return Ok(());
    }
    let items = workloads::load(Dataset::Sharegpt, &s.model, s.n, args.seed)?;
    let trace = tokenize(&tok, &items, s.rate, args.seed, s.max_output)?;
    let mut fixed = Vec::new();
    for p in Policy::ALL {
        eprintln!("ShareGPT trace at {} req/s: {}", s.rate, p.name());
        fixed.push((p, s.run(&trace, &kv(p, false))?));
    }
    let mut prefix = Vec::new();
    let prefix_runs: &[(usize, Dataset)] = if s.prefix_n == 0 {
        &[]
    } else {
        &[(1, Dataset::Prefix), (5, Dataset::Prefix5)]
    };
    for &(shots, ds) in prefix_runs {
        let items = workloads::load(ds, &s.model, s.prefix_n, args.seed)?;
        let trace = tokenize(&tok, &items, f64::INFINITY, args.seed, None)?;
        eprintln!("shared prefix ({shots}-shot): caching off, on");
        let off = s.run(&trace, &kv(Policy::Paged, false))?;
        let on = s.run(&trace, &kv(Policy::Paged, true))?;
        prefix.push((shots, off, on));
    }
    let mut curves: Vec<Series> = Policy::ALL
        .iter()
        .map(|p| Series {
            label: p.name().into(),
            points: Vec::new(),
        })
        .collect();
    for &r in &s.rates {
        let trace = tokenize(&tok, &items, r, args.seed, s.max_output)?;
        for (i, p) in Policy::ALL.iter().enumerate() {
            eprintln!("curve: {} req/s, {}", r, p.name());
            let st = s.run(&trace, &kv(*p, false))?;
            curves[i].points.push((r, st.normalized_latency()));
        }
    }
    let md = table::render(
        &s.mode(),
        &table::Inputs {
            n: s.n,
            rate: s.rate,
            kv_tokens: s.kv_tokens,
            max_output: s.max_output,
            fixed: &fixed,
            prefix: &prefix,
            curves: &curves,
            sharing: &sharing_rows,
        },
    );
    print!("{md}");
    let out = args.out.clone().unwrap_or_else(|| {
        PathBuf::from(if s.simulate {
            "bench-paper-sim.md"
        } else {
            "bench-paper.md"
        })
    });
    write(&out, &md)?;
    let title = if s.simulate {
        "Normalized latency vs rate (simulated)"
    } else {
        "Normalized latency vs rate (real model)"
    };
    let svg = plot::line_plot(
        title,
        "request rate (req/s)",
        "normalized latency (s/token)",
        &curves,
    );
    write(&out.with_extension("svg"), &svg)?;
    eprintln!(
        "wrote {} and {}",
        out.display(),
        out.with_extension("svg").display()
    );
    Ok(())
}

/// The parallel-sampling / beam-search memory runs on both workloads (real
/// model, outputs capped at `--max-output`, default 64, in both modes).
fn run_sharing(args: &Args, s: &Setup, tok: &Tokenizer) -> Result<Vec<sharing::Row>> {
    if args.sharing_prompts == 0 {
        return Ok(Vec::new());
    }
    let widths: Vec<usize> = args
        .sharing_widths
        .split(',')
        .map(|w| {
            w.trim()
                .parse::<usize>()
                .ok()
                .filter(|&k| k >= 1)
                .with_context(|| format!("bad sharing width {w:?}"))
        })
        .collect::<Result<_>>()?;
    let cap = s.max_output.unwrap_or(64);
    let loaded = model_loader::load_model(&s.model)
        .with_context(|| format!("loading {}", s.model.display()))?;
    let model = sharing::Model {
        eos: loaded.tokenizer.eos_token_ids().to_vec(),
        config: loaded.config,
        weights: loaded.weights,
    };
    let max_model_len = args.sharing_max_prompt + cap;
    let mut rows = Vec::new();
    for (name, ds) in [
        ("ShareGPT", Dataset::Sharegpt),
        ("Alpaca-like", Dataset::Alpaca),
    ] {
        // Draw extra items so that skipping long prompts still leaves enough.
        let items = workloads::load(ds, &s.model, args.sharing_prompts * 4, args.seed)
            .or_else(|_| workloads::load(ds, &s.model, args.sharing_prompts, args.seed))?;
        let mut trace = tokenize(tok, &items, f64::INFINITY, args.seed, Some(cap))?;
        trace.retain(|r| r.prompt.len() <= args.sharing_max_prompt && r.output_len >= 1);
        trace.truncate(args.sharing_prompts);
        for mode in sharing::Mode::ALL {
            for &k in &widths {
                eprintln!("sharing: {name}, {} k={k}", mode.name());
                let row = sharing::measure_row(
                    &model,
                    name,
                    &trace,
                    mode,
                    k,
                    args.block_size,
                    max_model_len,
                )?;
                eprintln!("{}", table::sharing_line(&row));
                rows.push(row);
            }
        }
    }
    Ok(rows)
}

fn write(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}
