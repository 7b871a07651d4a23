//! Benchmark workloads: one [`WorkItem`] per request (prompt text, its
//! length in the served model's tokens, and the reference output length).
//!
//! - `sharegpt`: read from the JSONL that `cargo xtask fetch-data` writes.
//! - `alpaca`: synthetic short instructions whose lengths follow Alpaca's
//!   published averages (input ~19.3 tokens, output ~58.5 tokens).
//! - `prefix`: a fixed few-shot prefix (1 or 5 examples) and a short query,
//!   as the paper's shared-prefix experiment.
//!
//! Every generator is seeded (ChaCha8), so a seed names one workload.
//! Cost: O(items x tokenizer cost).

use anyhow::{bail, Context, Result};
use model_loader::tokenizer::Tokenizer;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};

/// One request of a workload.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkItem {
    pub prompt: String,
    /// Prompt length in the served model's tokens (no special tokens).
    pub prompt_len: usize,
    /// Reference output length in tokens (becomes `max_tokens`).
    pub output_len: usize,
}

/// Which workload to build.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Dataset {
    Sharegpt,
    Alpaca,
    /// Shared prefix of 1 few-shot example.
    Prefix,
    /// Shared prefix of 5 few-shot examples.
    Prefix5,
}

/// Alpaca's published mean input length in tokens.
pub const ALPACA_MEAN_INPUT: f64 = 19.31;
/// Alpaca's published mean output length in tokens.
pub const ALPACA_MEAN_OUTPUT: f64 = 58.45;

/// Path of the ShareGPT workload for a model file (by its file stem).
pub fn sharegpt_path(model: &Path) -> PathBuf {
    let stem = model
        .file_stem()
        .map_or_else(|| "model".to_string(), |s| s.to_string_lossy().into_owned());
    model_loader::paths::cache_dir()
        .join("datasets")
        .join(format!("sharegpt-{stem}.jsonl"))
}

/// Writes items as JSON lines.
pub fn write_jsonl(path: &Path, items: &[WorkItem]) -> Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let file =
        std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let mut out = std::io::BufWriter::new(file);
    for item in items {
        serde_json::to_writer(&mut out, item)?;
        out.write_all(b"\n")?;
    }
    out.flush()?;
    Ok(())
}

/// Reads JSON lines written by [`write_jsonl`].
pub fn read_jsonl(path: &Path) -> Result<Vec<WorkItem>> {
    let file = std::fs::File::open(path).with_context(|| {
        format!(
            "opening {} (run `cargo xtask fetch-data` first)",
            path.display()
        )
    })?;
    let mut items = Vec::new();
    for (i, line) in std::io::BufReader::new(file).lines().enumerate() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let item: WorkItem = serde_json::from_str(&line)
            .with_context(|| format!("{}:{}: bad workload line", path.display(), i + 1))?;
        items.push(item);
    }
    Ok(items)
}

/// Builds `n` requests of `dataset`, seeded. ShareGPT items are a seeded
/// shuffle of the fetched file (itself already shuffled).
pub fn load(dataset: Dataset, model: &Path, n: usize, seed: u64) -> Result<Vec<WorkItem>> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    match dataset {
        Dataset::Sharegpt => {
            let mut items = read_jsonl(&sharegpt_path(model))?;
            if items.len() < n {
                bail!("the ShareGPT file holds {} pairs, {n} asked", items.len());
            }
            items.shuffle(&mut rng);
            items.truncate(n);
            Ok(items)
        }
        Dataset::Alpaca | Dataset::Prefix | Dataset::Prefix5 => {
            let info = model_loader::load_config_and_tokenizer(model)
                .with_context(|| format!("loading the tokenizer of {}", model.display()))?;
            let tok = &info.tokenizer;
            match dataset {
                Dataset::Alpaca => alpaca(tok, n, &mut rng),
                Dataset::Prefix => shared_prefix(tok, 1, n, &mut rng),
                _ => shared_prefix(tok, 5, n, &mut rng),
            }
        }
    }
}

/// A length with the given mean and a floor of `min`: `min` plus an
/// exponential draw of mean `mean - min` (long-tailed like real requests).
pub fn draw_len(rng: &mut impl Rng, mean: f64, min: usize, max: usize) -> usize {
    let u: f64 = rng.gen_range(f64::EPSILON..1.0);
    let extra = -(mean - min as f64) * u.ln();
    (min + extra.round() as usize).min(max)
}

const VERBS: &[&str] = &[
    "Explain",
    "Describe",
    "Summarize",
    "List",
    "Write",
    "Give",
    "Suggest",
    "Compare",
    "Classify",
    "Rewrite",
    "Translate",
    "Generate",
    "Identify",
    "Outline",
    "Evaluate",
];
const TOPICS: &[&str] = &[
    "the water cycle",
    "a healthy breakfast",
    "the causes of inflation",
    "photosynthesis",
    "a short poem about autumn",
    "three tips for staying productive",
    "the history of the bicycle",
    "how a compiler works",
    "the benefits of exercise",
    "the plot of a famous novel",
    "renewable energy sources",
    "a recipe for pancakes",
    "the rules of chess",
    "machine learning",
    "the French revolution",
    "good password habits",
    "the solar system",
    "a job interview",
];
const FILLERS: &[&str] = &[
    "in simple terms",
    "for a child",
    "in one paragraph",
    "with an example",
    "step by step",
    "briefly",
    "using bullet points",
    "for a beginner",
    "in a formal tone",
    "and why it matters",
];

/// Synthetic Alpaca-like workload: each prompt is grown from instruction
/// fragments until it reaches a drawn length (mean [`ALPACA_MEAN_INPUT`]);
/// outputs draw from mean [`ALPACA_MEAN_OUTPUT`].
pub fn alpaca(tok: &Tokenizer, n: usize, rng: &mut ChaCha8Rng) -> Result<Vec<WorkItem>> {
    let mut items = Vec::with_capacity(n);
    for _ in 0..n {
        let target = draw_len(rng, ALPACA_MEAN_INPUT, 4, 256);
        let mut prompt = format!(
            "{} {}",
            VERBS[rng.gen_range(0..VERBS.len())],
            TOPICS[rng.gen_range(0..TOPICS.len())]
        );
        let mut len = tok.encode(&prompt, false)?.len();
        while len < target {
            let frag = if rng.gen_bool(0.5) {
                FILLERS[rng.gen_range(0..FILLERS.len())]
            } else {
                TOPICS[rng.gen_range(0..TOPICS.len())]
            };
            prompt.push_str(if rng.gen_bool(0.5) { ", " } else { " and " });
            prompt.push_str(frag);
            len = tok.encode(&prompt, false)?.len();
        }
        prompt.push('.');
        let prompt_len = tok.encode(&prompt, false)?.len();
        let output_len = draw_len(rng, ALPACA_MEAN_OUTPUT, 4, 1024);
        items.push(WorkItem {
            prompt,
            prompt_len,
            output_len,
        });
    }
    Ok(items)
}

const FEW_SHOT: &[(&str, &str)] = &[
    ("The house is wonderful.", "Das Haus ist wunderbar."),
    (
        "I would like a cup of coffee, please.",
        "Ich hätte gerne eine Tasse Kaffee, bitte.",
    ),
    (
        "The train to Berlin leaves at eight o'clock.",
        "Der Zug nach Berlin fährt um acht Uhr ab.",
    ),
    (
        "We are meeting our friends in the park tomorrow.",
        "Wir treffen morgen unsere Freunde im Park.",
    ),
    (
        "Could you tell me where the station is?",
        "Können Sie mir sagen, wo der Bahnhof ist?",
    ),
];
const QUERIES: &[&str] = &[
    "The weather is nice today.",
    "My brother works in a hospital.",
    "Where is the nearest bank?",
    "She reads a book every week.",
    "The children are playing in the garden.",
    "This restaurant serves excellent food.",
    "He forgot his umbrella at home.",
    "The museum opens at ten in the morning.",
    "We need to buy bread and milk.",
    "The meeting has been moved to Friday.",
];

/// The fixed few-shot prefix with `shots` examples (1..=5).
pub fn few_shot_prefix(shots: usize) -> String {
    let mut s = String::from("Translate English to German.\n\n");
    for (en, de) in FEW_SHOT.iter().take(shots.clamp(1, FEW_SHOT.len())) {
        s.push_str(&format!("English: {en}\nGerman: {de}\n\n"));
    }
    s
}

/// Shared-prefix workload: the same few-shot prefix, then a short query.
/// Outputs are short (a translated sentence: 8..=24 tokens).
pub fn shared_prefix(
    tok: &Tokenizer,
    shots: usize,
    n: usize,
    rng: &mut ChaCha8Rng,
) -> Result<Vec<WorkItem>> {
    let prefix = few_shot_prefix(shots);
    let mut items = Vec::with_capacity(n);
    for _ in 0..n {
        let q = QUERIES[rng.gen_range(0..QUERIES.len())];
        let prompt = format!("{prefix}English: {q}\nGerman:");
        let prompt_len = tok.encode(&prompt, false)?.len();
        items.push(WorkItem {
            prompt,
            prompt_len,
            output_len: rng.gen_range(8..=24),
        });
    }
    Ok(items)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draw_len_mean_is_close_to_alpaca() {
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let n = 20_000;
        let sum: usize = (0..n)
            .map(|_| draw_len(&mut rng, ALPACA_MEAN_OUTPUT, 4, 100_000))
            .sum();
        let mean = sum as f64 / n as f64;
        assert!((mean - 58.45).abs() < 1.5, "mean {mean}");
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        assert!((0..1000).all(|_| draw_len(&mut rng, 19.3, 4, 30) >= 4));
    }

    #[test]
    fn prefix_grows_with_shots_and_is_shared() {
        let one = few_shot_prefix(1);
        let five = few_shot_prefix(5);
        assert!(five.starts_with(&one));
        assert_eq!(five.matches("German:").count(), 5);
        assert_eq!(one.matches("German:").count(), 1);
    }

    #[test]
    fn jsonl_round_trip() {
        let dir = std::env::temp_dir().join(format!("xtask-wl-{}", std::process::id()));
        let path = dir.join("w.jsonl");
        let items = vec![
            WorkItem {
                prompt: "a \"q\"\nb".into(),
                prompt_len: 5,
                output_len: 9,
            },
            WorkItem {
                prompt: "c".into(),
                prompt_len: 4,
                output_len: 4,
            },
        ];
        write_jsonl(&path, &items).unwrap();
        assert_eq!(read_jsonl(&path).unwrap(), items);
        std::fs::remove_dir_all(dir).unwrap();
    }
}
