//! The LoRA reference: seeded random PEFT adapters and the merged model they
//! stand for. `cargo xtask gen-lora` and the LoRA tests call these, so a
//! test never depends on files made elsewhere.
//!
//! [`write_random_peft`] writes a PEFT folder (`adapter_config.json`,
//! `adapter_model.safetensors`) whose `A` and `B` come from splitmix64
//! seeded per tensor; [`write_merged_gguf`] writes the base GGUF with every
//! tensor dequantized to F32 and `W + scale B A` added to each adapted
//! matrix, re-applying llama.cpp's Q/K row permutation to the delta (a
//! `llama` GGUF stores `attn_q`/`attn_k` permuted), metadata and tokenizer
//! copied, `general.file_type` 0 (all F32). Serving the merged file with f32
//! weights is what an engine applying the adapter at run time must match.
//!
//! Invariants: the same [`RandomLora`] always gives the same bytes; a
//! `zero` adapter (B = 0) merges into exactly the base's dequantized weights.
//!
//! Cost: the merge holds the whole model in f32 twice (tensors and the
//! encoded file: about 1.1 GB for SmolLM2-135M) and is O(parameters +
//! adapted matrices x out x in x r).

use crate::config::Architecture;
use crate::error::{LoaderError, Result};
use crate::gguf::writer::permute_qk;
use crate::gguf::writer::GgufWriter;
use crate::gguf::{GgmlType, GgufFile, MetaValue};
use crate::lora::{LoraAdapter, LoraPair, LoraTarget};
use crate::tiny::SplitMix64;
use crate::weights::Tensor;
use crate::ModelConfig;
use std::path::Path;

/// A seeded random adapter.
#[derive(Debug, Clone)]
pub struct RandomLora {
    pub seed: u64,
    pub rank: usize,
    pub alpha: f32,
    pub targets: Vec<LoraTarget>,
    /// B = 0: the adapter changes nothing (the reference's own check).
    pub zero: bool,
    /// Half-width of B's uniform entries (A's are `1/sqrt(in)` wide).
    pub b_magnitude: f32,
    pub use_rslora: bool,
}

fn uniform(seed: u64, name: &str, n: usize, width: f32) -> Vec<f32> {
    let h = name.bytes().fold(0xcbf2_9ce4_8422_2325u64 ^ seed, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    let mut rng = SplitMix64::new(h);
    (0..n).map(|_| rng.next_signed() * width).collect()
}

fn io_err(path: &Path, e: std::io::Error) -> LoaderError {
    LoaderError::io(path, e)
}

/// Writes the PEFT folder `dir` for `spec` on the base `config`.
pub fn write_random_peft(dir: &Path, config: &ModelConfig, spec: &RandomLora) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| io_err(dir, e))?;
    let modules: Vec<&str> = spec.targets.iter().map(|t| t.hf_name()).collect();
    let cfg = serde_json::json!({
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": "HuggingFaceTB/SmolLM2-135M-Instruct",
        "r": spec.rank,
        "lora_alpha": spec.alpha,
        "lora_dropout": 0.0,
        "use_rslora": spec.use_rslora,
        "bias": "none",
        "target_modules": modules,
        "modules_to_save": null,
    });
    let path = dir.join("adapter_config.json");
    let text = serde_json::to_string_pretty(&cfg).map_err(|e| LoaderError::BadJson {
        path: path.clone(),
        source: e,
    })?;
    std::fs::write(&path, text).map_err(|e| io_err(&path, e))?;
    let mut tensors: Vec<(String, Tensor)> = Vec::new();
    for layer in 0..config.num_hidden_layers {
        for &t in &spec.targets {
            let (out, inp) = t.shape(config);
            let parent = match t {
                LoraTarget::Q | LoraTarget::K | LoraTarget::V | LoraTarget::O => "self_attn",
                _ => "mlp",
            };
            let stem = format!(
                "base_model.model.model.layers.{layer}.{parent}.{}",
                t.hf_name()
            );
            let a_name = format!("{stem}.lora_A.weight");
            let b_name = format!("{stem}.lora_B.weight");
            let a = uniform(
                spec.seed,
                &a_name,
                spec.rank * inp,
                1.0 / (inp as f32).sqrt(),
            );
            let b = if spec.zero {
                vec![0.0; out * spec.rank]
            } else {
                uniform(spec.seed, &b_name, out * spec.rank, spec.b_magnitude)
            };
            tensors.push((a_name, Tensor::new(vec![spec.rank, inp], a)));
            tensors.push((b_name, Tensor::new(vec![out, spec.rank], b)));
        }
    }
    let refs: Vec<(String, &Tensor)> = tensors.iter().map(|(n, t)| (n.clone(), t)).collect();
    crate::safetensors_io::write_f32(&dir.join("adapter_model.safetensors"), &refs)
}

/// `scale * b a` as `[out, in]`.
pub fn delta(pair: &LoraPair, rank: usize, out: usize, inp: usize, scale: f32) -> Vec<f32> {
    let mut d = vec![0.0f32; out * inp];
    for o in 0..out {
        let row = &mut d[o * inp..(o + 1) * inp];
        for k in 0..rank {
            let s = scale * pair.b[o * rank + k];
            if s == 0.0 {
                continue;
            }
            for (x, &a) in row.iter_mut().zip(&pair.a[k * inp..(k + 1) * inp]) {
                *x += s * a;
            }
        }
    }
    d
}

/// Writes the base GGUF at `base` merged with `adapter` as an all-F32 GGUF
/// at `out_path`.
pub fn write_merged_gguf(
    base: &Path,
    config: &ModelConfig,
    adapter: &LoraAdapter,
    out_path: &Path,
) -> Result<()> {
    let g = GgufFile::open(base)?;
    let mut w = GgufWriter::new();
    let mut keys: Vec<&String> = g.metadata.keys().collect();
    keys.sort();
    for k in keys {
        // The writer lays the file out at its own alignment.
        if k == "general.alignment" {
            continue;
        }
        let v = if k == "general.file_type" {
            MetaValue::U32(0)
        } else {
            g.metadata[k].clone()
        };
        w.meta(k, v);
    }
    let permuted = config.architecture == Architecture::Llama;
    for info in &g.tensors {
        let mut data = g.read_f32(info)?;
        let target = parse_base_name(&info.name);
        if let Some((layer, t)) = target {
            if let Some(pair) = adapter
                .layers
                .get(layer)
                .and_then(|l| l.pairs[t.index()].as_ref())
            {
                let (out, inp) = t.shape(config);
                let mut d = delta(pair, adapter.rank, out, inp, adapter.scale);
                if permuted && t == LoraTarget::Q {
                    d = permute_qk(&d, config.num_attention_heads, out, inp);
                } else if permuted && t == LoraTarget::K {
                    d = permute_qk(&d, config.num_key_value_heads, out, inp);
                }
                data.iter_mut().zip(&d).for_each(|(x, y)| *x += y);
            }
        }
        w.tensor(&info.name, info.shape(), GgmlType::F32, data);
    }
    let bytes = w.to_bytes()?;
    std::fs::write(out_path, bytes).map_err(|e| io_err(out_path, e))
}

/// `blk.N.attn_q.weight` -> `(N, Q)`.
fn parse_base_name(name: &str) -> Option<(usize, LoraTarget)> {
    let rest = name.strip_prefix("blk.")?;
    let (layer, module) = rest.split_once('.')?;
    let module = module.strip_suffix(".weight")?;
    let t = LoraTarget::ALL
        .into_iter()
        .find(|t| t.gguf_name() == module)?;
    Some((layer.parse().ok()?, t))
}

/// The reference adapters `cargo xtask gen-lora` writes and the LoRA tests
/// use: `(name, spec)`. `zero` proves the reference; the others differ in
/// targets, rank, scale rule and seed.
pub fn reference_set() -> Vec<(&'static str, RandomLora)> {
    use LoraTarget::*;
    let spec = |seed, rank, targets: &[LoraTarget], zero, rslora| RandomLora {
        seed,
        rank,
        alpha: 16.0,
        targets: targets.to_vec(),
        zero,
        // Large enough that greedy ids change within a few tokens.
        b_magnitude: 0.15,
        use_rslora: rslora,
    };
    vec![
        ("zero", spec(1, 8, &LoraTarget::ALL, true, false)),
        ("qv-r8", spec(2, 8, &[Q, V], false, false)),
        ("all-r16", spec(3, 16, &LoraTarget::ALL, false, false)),
        ("mlp-r4-rslora", spec(4, 4, &[Gate, Up, Down], false, true)),
        ("qko-r8", spec(5, 8, &[Q, K, O], false, false)),
    ]
}

/// Writes the reference adapter `name` as a PEFT folder `out/name` and,
/// with `merged`, its merged model `out/name-merged-f32.gguf`; returns the
/// two paths.
pub fn write_reference(
    base: &Path,
    out: &Path,
    name: &str,
    merged: bool,
) -> Result<(std::path::PathBuf, std::path::PathBuf)> {
    let spec = reference_set()
        .into_iter()
        .find(|(n, _)| *n == name)
        .map(|(_, s)| s)
        .ok_or_else(|| LoaderError::LoraInvalid(format!("no reference adapter {name:?}")))?;
    let g = GgufFile::open(base)?;
    let config = crate::gguf_model::config_from_gguf(&g)?;
    drop(g);
    let dir = out.join(name);
    write_random_peft(&dir, &config, &spec)?;
    let merged_path = out.join(format!("{name}-merged-f32.gguf"));
    if merged {
        let adapter = crate::lora::load_lora(&dir, &config, 64)?;
        write_merged_gguf(base, &config, &adapter, &merged_path)?;
    }
    Ok((dir, merged_path))
}
