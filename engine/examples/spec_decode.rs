//! Speculative decoding (prompt lookup, `"ngram"`) against plain decoding on
//! the CPU executor, side by side in one process: decode tok/s, the
//! acceptance rate and the mean accepted length, on an input-grounded
//! workload (rewrite code that is in the prompt) at batch 1, 8 and 32,
//! and on varied-topic prompts where the output repeats little of the
//! prompt. Each configuration runs off, on, adaptive, twice (the machine
//! is noisy); every run's tokens are checked equal to the first plain
//! run's. "adaptive" is `"adaptive": true` (`engine::spec::governor`):
//! it needs a few hundred output tokens to probe and settle.
//!
//! `cargo run --release -p engine --example spec_decode [-- MODEL_PATH [OUTPUT] [K] [invariant]]`
//! (defaults: the fetched Qwen2.5-Coder-0.5B Q4_K_M GGUF, weights kept
//! quantized as the server's default `--dtype auto`; 128 output tokens;
//! k = 4, prompt_lookup_min 2, max 4; `invariant` runs the batch-invariant
//! kernels, `--batch-invariant`). Greedy requests. Timings, not a test.
//! `SPEC_BENCH_BATCHES=1,8` runs a subset of the batch sizes.
//! The last column counts requests whose tokens differ from the first
//! plain run's: 0 with `invariant`; the default kernels round a row
//! differently with its batch's size, which can flip a near-tie.

use engine::executor::CpuExecutor;
use engine::kv::{PagedKvCacheManager, PagedKvConfig};
use engine::model::{CpuModel, KvDtype};
use engine::scheduler::{RequestId, RequestParams, SchedulerConfig};
use engine::spec::{SpecConfig, SpecMethod};
use engine::{EngineConfig, LlmEngine};
use model_loader::{Tokenizer, WeightTypes};
use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Instant;

const CODE: [&str; 4] = [
    "def moving_average(values, window):\n    if window <= 0:\n        raise ValueError(\"window must be positive\")\n    out = []\n    total = 0.0\n    for i, v in enumerate(values):\n        total += v\n        if i >= window:\n            total -= values[i - window]\n        if i >= window - 1:\n            out.append(total / window)\n    return out\n\n\ndef normalize(values):\n    lo = min(values)\n    hi = max(values)\n    if hi == lo:\n        return [0.0 for _ in values]\n    return [(v - lo) / (hi - lo) for v in values]\n",
    "fn parse_pairs(input: &str) -> Result<Vec<(String, i64)>, String> {\n    let mut out = Vec::new();\n    for (n, line) in input.lines().enumerate() {\n        let line = line.trim();\n        if line.is_empty() || line.starts_with('#') {\n            continue;\n        }\n        let (key, value) = line\n            .split_once('=')\n            .ok_or_else(|| format!(\"line {}: missing '='\", n + 1))?;\n        let value: i64 = value\n            .trim()\n            .parse()\n            .map_err(|e| format!(\"line {}: {e}\", n + 1))?;\n        out.push((key.trim().to_string(), value));\n    }\n    Ok(out)\n}\n",
    "class Inventory:\n    def __init__(self):\n        self.items = {}\n\n    def add(self, name, count):\n        self.items[name] = self.items.get(name, 0) + count\n\n    def remove(self, name, count):\n        have = self.items.get(name, 0)\n        if count > have:\n            raise KeyError(name)\n        self.items[name] = have - count\n        if self.items[name] == 0:\n            del self.items[name]\n\n    def total(self):\n        return sum(self.items.values())\n",
    "function groupBy(list, keyFn) {\n  const groups = new Map();\n  for (const item of list) {\n    const key = keyFn(item);\n    if (!groups.has(key)) {\n      groups.set(key, []);\n    }\n    groups.get(key).push(item);\n  }\n  return groups;\n}\n\nfunction countBy(list, keyFn) {\n  const counts = {};\n  for (const item of list) {\n    const key = keyFn(item);\n    counts[key] = (counts[key] || 0) + 1;\n  }\n  return counts;\n}\n",
];

const TASKS: [&str; 4] = [
    "Rename the variables in the following code to longer, clearer names and return the whole code:",
    "Add a short comment above every function in the following code and return the whole code:",
    "Fix any bugs in the following code and return the whole corrected code:",
    "Add type hints or type annotations where the language allows, and return the whole code:",
];

const CHAT: [&str; 8] = [
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Explain how vaccines train the immune system, for a twelve-year-old.",
    "What are the trade-offs between renting and buying a home?",
    "Give me a packing list for a week-long hiking trip in autumn.",
    "Summarize the causes of the French Revolution in a few paragraphs.",
    "Compare Python and Go for writing network services.",
    "Suggest five names for a bakery and explain each one.",
    "Describe the water cycle and why it matters for agriculture.",
];

fn arg(i: usize, default: usize) -> usize {
    std::env::args()
        .nth(i)
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

fn prompt(tok: &Tokenizer, text: &str) -> Vec<u32> {
    let chat = format!(
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"
    );
    tok.encode(&chat, false).expect("tokenize")
}

struct Run {
    tok_s: f64,
    /// Milliseconds per timed step.
    step_ms: f64,
    /// Timed steps.
    steps: usize,
    tokens: Vec<Vec<u32>>,
    stats: engine::scheduler::SpecStats,
}

fn run(
    model: &CpuModel,
    eos: &[u32],
    prompts: &[Vec<u32>],
    output: usize,
    spec: Option<SpecConfig>,
) -> Result<Run, Box<dyn std::error::Error>> {
    let block_size = 16;
    let blocks = 4096;
    let exec =
        CpuExecutor::with_kv_dtype(model.clone(), blocks, 0, block_size, KvDtype::auto(true))?;
    let kv = PagedKvCacheManager::new(PagedKvConfig::new(block_size, blocks, 0))?;
    let cfg = EngineConfig {
        scheduler: SchedulerConfig {
            max_num_seqs: 64,
            max_num_batched_tokens: 4096,
            max_model_len: 4096,
            speculative: spec,
            ..SchedulerConfig::default()
        },
        eos_token_ids: eos.to_vec(),
    };
    let mut eng = LlmEngine::new(cfg, Box::new(kv), Box::new(exec))?;
    let params = RequestParams {
        max_tokens: Some(output),
        ignore_eos: true,
        ..RequestParams::default()
    };
    for (i, p) in prompts.iter().enumerate() {
        eng.add_request(RequestId(i as u64), p.clone(), params.clone())?;
    }
    // Prefill first (not timed): decode speed is what speculation changes.
    let mut out: HashMap<RequestId, Vec<u32>> = HashMap::new();
    let absorb = |outs: Vec<engine::RequestOutput>, out: &mut HashMap<RequestId, Vec<u32>>| {
        for o in outs {
            out.entry(o.request_id)
                .or_default()
                .extend_from_slice(o.token_ids());
        }
    };
    while out.len() < prompts.len() && eng.has_unfinished() {
        let o = eng.step();
        absorb(o, &mut out);
    }
    let before: usize = out.values().map(Vec::len).sum();
    let start = Instant::now();
    let mut steps = 0usize;
    while eng.has_unfinished() {
        steps += 1;
        let o = eng.step();
        absorb(o, &mut out);
    }
    let secs = start.elapsed().as_secs_f64();
    let after: usize = out.values().map(Vec::len).sum();
    Ok(Run {
        tok_s: (after - before) as f64 / secs,
        step_ms: 1e3 * secs / steps.max(1) as f64,
        steps,
        tokens: (0..prompts.len())
            .map(|i| out.remove(&RequestId(i as u64)).unwrap_or_default())
            .collect(),
        stats: eng.stats().scheduler.spec,
    })
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args()
        .nth(1)
        .filter(|s| !s.is_empty())
        .map_or_else(
            || model_loader::paths::models_dir().join("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"),
            PathBuf::from,
        );
    let (output, k) = (arg(2, 128), arg(3, 4));
    let loaded = model_loader::load_model_with(&path, WeightTypes::File).map_err(|e| {
        format!(
            "{}: {e} (run `cargo xtask fetch-model --model qwen2.5-coder-0.5b`)",
            path.display()
        )
    })?;
    let eos = loaded.tokenizer.eos_token_ids().to_vec();
    let tok = loaded.tokenizer.clone();
    let mut model = CpuModel::new(loaded.config, loaded.weights)?;
    let invariant = std::env::args().nth(4).as_deref() == Some("invariant");
    model.set_batch_invariant(invariant);
    let spec = SpecConfig {
        method: SpecMethod::Ngram {
            prompt_lookup_min: 2,
            prompt_lookup_max: 4,
        },
        num_speculative_tokens: k,
        disable_by_batch_size: None,
        adaptive: false,
    };
    let grounded = |n: usize| -> Vec<Vec<u32>> {
        (0..n)
            .map(|i| {
                let text = format!("{}\n\n```\n{}```", TASKS[i % 4], CODE[(i / 4 + i) % 4]);
                prompt(&tok, &text)
            })
            .collect()
    };
    let chat = |n: usize| -> Vec<Vec<u32>> { (0..n).map(|i| prompt(&tok, CHAT[i % 8])).collect() };
    println!(
        "{} ({:?}, batch-invariant kernels {invariant}), {output} output tokens, greedy, k = {k}, prompt lookup 2..=4",
        path.display(),
        engine::model::quant::Isa::best()
    );
    println!("| workload | batch | plain tok/s | ngram tok/s | speedup | adaptive tok/s | speedup | acceptance | mean accepted / draft | sequence-steps drafting | ms / step plain, ngram | outputs differing |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    let adaptive = SpecConfig {
        adaptive: true,
        ..spec.clone()
    };
    // SPEC_BENCH_BATCHES=1,8 runs a subset (default 1, 8 and 32).
    let batches: Vec<usize> = std::env::var("SPEC_BENCH_BATCHES")
        .ok()
        .map(|v| v.split(',').filter_map(|b| b.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![1, 8, 32]);
    let workloads = [
        ("rewrite code in prompt", true),
        ("chat, varied topics", false),
    ];
    let (grounded, chat) = (&grounded, &chat);
    for (name, prompts) in workloads.iter().flat_map(|&(name, code)| {
        batches
            .iter()
            .map(move |&b| (name, if code { grounded(b) } else { chat(b) }))
    }) {
        let mut plain = Vec::new();
        let mut fast = Vec::new();
        let mut adapt = Vec::new();
        let mut reference: Option<Vec<Vec<u32>>> = None;
        let mut stats = engine::scheduler::SpecStats::default();
        let mut spec_steps = 0;
        let mut differ = 0;
        let mut step_ms = [0.0f64; 2];
        for _ in 0..2 {
            for mode in 0..3 {
                let cfg = [None, Some(spec.clone()), Some(adaptive.clone())][mode].clone();
                let r = run(&model, &eos, &prompts, output, cfg)?;
                match &reference {
                    None => reference = Some(r.tokens.clone()),
                    Some(want) => {
                        // Bit-exact only with batch-invariant kernels: the
                        // default quantized path rounds a row differently
                        // with what shares its batch (k+1 rows change it).
                        let d = want.iter().zip(&r.tokens).filter(|(a, b)| a != b).count();
                        differ = differ.max(d);
                    }
                }
                match mode {
                    0 => {
                        plain.push(r.tok_s);
                        step_ms[0] += r.step_ms / 2.0;
                    }
                    1 => {
                        fast.push(r.tok_s);
                        step_ms[1] += r.step_ms / 2.0;
                        stats = r.stats;
                        spec_steps = r.steps;
                    }
                    _ => adapt.push(r.tok_s),
                }
            }
        }
        let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
        let (p, f, a) = (mean(&plain), mean(&fast), mean(&adapt));
        println!(
            "| {name} | {} | {p:.1} ({:.1}, {:.1}) | {f:.1} ({:.1}, {:.1}) | {:.2}x | {a:.1} ({:.1}, {:.1}) | {:.2}x | {:.1}% | {:.2} | {:.0}% | {:.1}, {:.1} | {differ} |",
            prompts.len(),
            plain[0],
            plain[1],
            fast[0],
            fast[1],
            f / p,
            adapt[0],
            adapt[1],
            a / p,
            100.0 * stats.accepted_tokens as f64 / stats.draft_tokens.max(1) as f64,
            stats.accepted_tokens as f64 / stats.drafts.max(1) as f64,
            100.0 * stats.drafts as f64 / (spec_steps * prompts.len()).max(1) as f64,
            step_ms[0],
            step_ms[1],
        );
    }
    Ok(())
}
