//! GGUF -> [`ModelConfig`] and [`ModelWeights`].
//!
//! Architectures `llama` (also used for Mistral-style models), `qwen2`
//! (q/k/v biases) and `gemma3` (q/k norms, post-norms; the sliding-window
//! period 6 and the local rotary base 10,000 are not in the file's metadata:
//! they are Gemma 3's constants, as llama.cpp also hard-codes them, unless
//! `gemma3.attention.sliding_window_pattern` / `gemma3.rope.freq_base_swa` say
//! otherwise; the attention scale is `head_dim ^ -0.5`, as llama.cpp uses for
//! every Gemma 3 size but 27B). Tensor names follow llama.cpp (`token_embd`,
//! `blk.N.attn_q`, ..., `output_norm`, `output`; no `output` = tied).
//! GGUF dims are innermost-first, so a `[out, in]` HF weight has
//! `dims = [in, out]`; the data is the same row-major bytes.
//!
//! Invariant: the returned attn_q/attn_k rows are in HF order (llama.cpp's
//! permutation undone, for `llama` only: llama.cpp does not permute qwen2).
//! Dequantization runs on up to `available_parallelism` scoped threads,
//! O(total elements). Under [`WeightTypes::File`] the large block-quantized
//! matrices are copied as they are (rows permuted as whole blocks).

use crate::config::{Architecture, Gemma3Params, ModelConfig};
use crate::error::{LoaderError, Result};
use crate::gguf::{GgufFile, TensorInfo};
use crate::quant::QuantType;
use crate::weights::{GemmaNorms, LayerWeights, ModelWeights, QuantTensor, Tensor, Weight};

/// How the large matrices are kept at load.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WeightTypes {
    /// Block-quantized matrices stay in the file's type (F16/BF16 and F32
    /// become f32); norms and biases are f32.
    #[default]
    File,
    /// Everything dequantized to f32.
    F32,
}

/// Gemma 3's period of global layers (one in six).
const GEMMA3_GLOBAL_EVERY: usize = 6;
/// Gemma 3's rotary base on the local (sliding-window) layers.
const GEMMA3_ROPE_LOCAL_THETA: f32 = 10_000.0;

/// Reads the hyper-parameters from the metadata.
pub fn config_from_gguf(g: &GgufFile) -> Result<ModelConfig> {
    let arch_name = g.get_str("general.architecture")?;
    let key = |k: &str| format!("{arch_name}.{k}");
    let architecture = match arch_name {
        "llama" => Architecture::Llama,
        "qwen2" => Architecture::Qwen2,
        "gemma3" => Architecture::Gemma3(gemma3_params(g, &key)?),
        other => return Err(LoaderError::UnsupportedArchitecture(other.to_string())),
    };
    let hidden_size = g.get_usize(&key("embedding_length"))?;
    let num_attention_heads = g.get_usize(&key("attention.head_count"))?;
    let num_key_value_heads = g
        .get_opt(&key("attention.head_count_kv"), "unsigned integer", |v| {
            v.as_u64()
        })?
        .map_or(num_attention_heads, |v| v as usize);
    if num_attention_heads == 0 || num_key_value_heads == 0 {
        return Err(LoaderError::InvalidConfig("zero attention heads".into()));
    }
    let head_dim = match g.get_opt(&key("attention.key_length"), "unsigned integer", |v| {
        v.as_u64()
    })? {
        Some(v) => v as usize,
        None => hidden_size / num_attention_heads,
    };
    let vocab_size = match g.get_opt(&key("vocab_size"), "unsigned integer", |v| v.as_u64())? {
        Some(v) => v as usize,
        None => match g.get("tokenizer.ggml.tokens").and_then(|v| v.as_array()) {
            Some(a) => a.len(),
            None => g.get_usize(&key("vocab_size"))?,
        },
    };
    let has_output = g.tensor_info("output.weight").is_some();
    let config = ModelConfig {
        architecture,
        vocab_size,
        hidden_size,
        intermediate_size: g.get_usize(&key("feed_forward_length"))?,
        num_hidden_layers: g.get_usize(&key("block_count"))?,
        num_attention_heads,
        num_key_value_heads,
        head_dim,
        rms_norm_eps: g.get_f32(&key("attention.layer_norm_rms_epsilon"))?,
        rope_theta: g
            .get_opt(&key("rope.freq_base"), "number", |v| v.as_f64())?
            .map_or(10_000.0, |v| v as f32),
        rope_scaling: None,
        max_position_embeddings: g.get_usize(&key("context_length"))?,
        tie_word_embeddings: !has_output,
        attention_bias: architecture == Architecture::Qwen2,
    };
    config.validate()?;
    Ok(config)
}

/// Gemma 3's extra hyper-parameters (see the module docs for the defaults).
fn gemma3_params(g: &GgufFile, key: &dyn Fn(&str) -> String) -> Result<Gemma3Params> {
    let uint = |k: &str| g.get_opt(&key(k), "unsigned integer", |v| v.as_u64());
    let num = |k: &str| g.get_opt(&key(k), "number", |v| v.as_f64());
    let head_dim = match uint("attention.key_length")? {
        Some(v) => v as f32,
        None => {
            let h = g.get_usize(&key("embedding_length"))?;
            let n = g.get_usize(&key("attention.head_count"))?.max(1);
            (h / n) as f32
        }
    };
    Ok(Gemma3Params {
        sliding_window: g.get_usize(&key("attention.sliding_window"))?,
        global_every: uint("attention.sliding_window_pattern")?
            .map_or(GEMMA3_GLOBAL_EVERY, |v| v as usize),
        rope_local_theta: num("rope.freq_base_swa")?.map_or(GEMMA3_ROPE_LOCAL_THETA, |v| v as f32),
        query_pre_attn_scalar: head_dim,
    })
}

/// Inverse of llama.cpp's Q/K row permutation on a `[rows, cols]` matrix:
/// `w.reshape(n_head, head_dim/2, 2, cols).swapaxes(1, 2).reshape(rows, cols)`.
pub fn unpermute_qk(w: &[f32], n_head: usize, rows: usize, cols: usize) -> Vec<f32> {
    unpermute_rows(w, n_head, rows, cols)
}

/// [`unpermute_qk`] on rows of any element type (`cols` elements per row:
/// f32 values or the bytes of a quantized row).
fn unpermute_rows<T: Copy + Default>(w: &[T], n_head: usize, rows: usize, cols: usize) -> Vec<T> {
    let hd = rows / n_head;
    let half = hd / 2;
    let mut out = vec![T::default(); w.len()];
    for h in 0..n_head {
        for i in 0..2 {
            for j in 0..half {
                let dst = h * hd + i * half + j;
                let src = h * hd + 2 * j + i;
                out[dst * cols..(dst + 1) * cols].copy_from_slice(&w[src * cols..(src + 1) * cols]);
            }
        }
    }
    out
}

/// What to do with one tensor once read.
#[derive(Clone, Copy)]
enum Post {
    None,
    /// Undo the Q/K permutation with this many heads.
    Unpermute(usize),
}

struct Job<'a> {
    info: &'a TensorInfo,
    shape: Vec<usize>,
    post: Post,
    /// May stay quantized (a large matrix, under [`WeightTypes::File`]).
    keep: bool,
}

/// Reads every weight, dequantized to f32 and in HF layout.
pub fn weights_from_gguf(g: &GgufFile, c: &ModelConfig) -> Result<ModelWeights> {
    Ok(weights_from_gguf_as(g, c, WeightTypes::F32)?.map(Weight::into_f32))
}

/// Reads every weight in HF layout, the large matrices kept as `types` says.
pub fn weights_from_gguf_as(
    g: &GgufFile,
    c: &ModelConfig,
    types: WeightTypes,
) -> Result<ModelWeights<Weight>> {
    let permute = c.architecture == Architecture::Llama;
    let gemma = matches!(c.architecture, Architecture::Gemma3(_));
    let (h, q, kv, ff) = (
        c.hidden_size,
        c.num_attention_heads * c.head_dim,
        c.num_key_value_heads * c.head_dim,
        c.intermediate_size,
    );
    let mut names: Vec<(String, Vec<usize>, Post)> = vec![
        (
            "token_embd.weight".into(),
            vec![c.vocab_size, h],
            Post::None,
        ),
        ("output_norm.weight".into(), vec![h], Post::None),
    ];
    if !c.tie_word_embeddings {
        names.push(("output.weight".into(), vec![c.vocab_size, h], Post::None));
    }
    let qk_post = |n| {
        if permute {
            Post::Unpermute(n)
        } else {
            Post::None
        }
    };
    for l in 0..c.num_hidden_layers {
        let b = |s: &str| format!("blk.{l}.{s}");
        names.extend([
            (b("attn_norm.weight"), vec![h], Post::None),
            (
                b("attn_q.weight"),
                vec![q, h],
                qk_post(c.num_attention_heads),
            ),
            (
                b("attn_k.weight"),
                vec![kv, h],
                qk_post(c.num_key_value_heads),
            ),
            (b("attn_v.weight"), vec![kv, h], Post::None),
            (b("attn_output.weight"), vec![h, q], Post::None),
            (b("ffn_norm.weight"), vec![h], Post::None),
            (b("ffn_gate.weight"), vec![ff, h], Post::None),
            (b("ffn_up.weight"), vec![ff, h], Post::None),
            (b("ffn_down.weight"), vec![h, ff], Post::None),
        ]);
        if c.attention_bias {
            names.extend([
                (b("attn_q.bias"), vec![q], Post::None),
                (b("attn_k.bias"), vec![kv], Post::None),
                (b("attn_v.bias"), vec![kv], Post::None),
            ]);
        }
        if gemma {
            names.extend([
                (b("attn_q_norm.weight"), vec![c.head_dim], Post::None),
                (b("attn_k_norm.weight"), vec![c.head_dim], Post::None),
                (b("post_attention_norm.weight"), vec![h], Post::None),
                (b("post_ffw_norm.weight"), vec![h], Post::None),
            ]);
        }
    }
    let jobs = names
        .into_iter()
        .map(|(name, shape, post)| {
            let info = g
                .tensor_info(&name)
                .ok_or_else(|| LoaderError::MissingTensor(name.clone()))?;
            if info.shape() != shape {
                return Err(LoaderError::ShapeMismatch {
                    tensor: name,
                    expected: shape,
                    found: info.shape(),
                });
            }
            let keep = types == WeightTypes::File && shape.len() == 2;
            Ok(Job {
                info,
                shape,
                post,
                keep,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let mut tensors = read_parallel(g, &jobs)?.into_iter();
    let mut next = || {
        tensors
            .next()
            .ok_or_else(|| LoaderError::Malformed("tensor count".into()))
    };
    let f32 = |w: Weight| w.into_f32();
    let token_embedding = next()?;
    let final_norm = f32(next()?);
    let lm_head = if c.tie_word_embeddings {
        None
    } else {
        Some(next()?)
    };
    let mut layers = Vec::with_capacity(c.num_hidden_layers);
    for _ in 0..c.num_hidden_layers {
        let (attn_norm, wq, wk, wv, wo) = (f32(next()?), next()?, next()?, next()?, next()?);
        let (ffn_norm, w_gate, w_up, w_down) = (f32(next()?), next()?, next()?, next()?);
        let (bq, bk, bv) = if c.attention_bias {
            (Some(f32(next()?)), Some(f32(next()?)), Some(f32(next()?)))
        } else {
            (None, None, None)
        };
        let gemma = if gemma {
            Some(GemmaNorms {
                q_norm: f32(next()?),
                k_norm: f32(next()?),
                post_attn_norm: f32(next()?),
                post_ffn_norm: f32(next()?),
            })
        } else {
            None
        };
        layers.push(LayerWeights {
            attn_norm,
            wq,
            wk,
            wv,
            wo,
            bq,
            bk,
            bv,
            ffn_norm,
            w_gate,
            w_up,
            w_down,
            gemma,
        });
    }
    Ok(ModelWeights {
        token_embedding,
        layers,
        final_norm,
        lm_head,
    })
}

/// Applies `job.post` to rows of `cols` items.
fn post<T: Copy + Default>(job: &Job<'_>, data: Vec<T>, cols: usize) -> Result<Vec<T>> {
    match job.post {
        Post::None => Ok(data),
        Post::Unpermute(n_head) => {
            let rows = job.shape[0];
            if n_head == 0 || !rows.is_multiple_of(n_head) || !(rows / n_head).is_multiple_of(2) {
                return Err(LoaderError::ShapeMismatch {
                    tensor: job.info.name.clone(),
                    expected: vec![n_head, rows / n_head.max(1), job.shape[1]],
                    found: job.shape.clone(),
                });
            }
            Ok(unpermute_rows(&data, n_head, rows, cols))
        }
    }
}

fn run_job(g: &GgufFile, job: &Job<'_>) -> Result<Weight> {
    let name = &job.info.name;
    match QuantType::from_ggml(job.info.ty).filter(|_| job.keep) {
        Some(ty) => {
            let bytes = g.tensor_bytes(job.info)?.to_vec();
            let row_bytes = ty
                .bytes_for(job.shape[1])
                .map_err(|e| LoaderError::Malformed(format!("tensor {name}: {e}")))?;
            let bytes = post(job, bytes, row_bytes)?;
            Ok(Weight::Quantized(QuantTensor::new(
                ty,
                job.shape.clone(),
                bytes,
                name,
            )?))
        }
        None => {
            let cols = job.shape.last().copied().unwrap_or(1);
            let data = post(job, g.read_f32(job.info)?, cols)?;
            Ok(Weight::F32(Tensor::new(job.shape.clone(), data)))
        }
    }
}

/// Runs the jobs on scoped threads, balancing by element count; results in job order.
fn read_parallel(g: &GgufFile, jobs: &[Job<'_>]) -> Result<Vec<Weight>> {
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(8);
    // Greedy assignment of jobs (largest first) to the least-loaded thread.
    let mut order: Vec<usize> = (0..jobs.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(jobs[i].info.n_elements()));
    let mut buckets: Vec<(usize, Vec<usize>)> = vec![(0, Vec::new()); threads];
    for i in order {
        if let Some(b) = buckets.iter_mut().min_by_key(|b| b.0) {
            b.0 += jobs[i].info.n_elements();
            b.1.push(i);
        }
    }
    let mut results: Vec<Option<Result<Weight>>> = (0..jobs.len()).map(|_| None).collect();
    std::thread::scope(|s| {
        let handles: Vec<_> = buckets
            .iter()
            .map(|(_, idx)| {
                s.spawn(move || {
                    idx.iter()
                        .map(|&i| (i, run_job(g, &jobs[i])))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        for h in handles {
            match h.join() {
                Ok(done) => done.into_iter().for_each(|(i, r)| results[i] = Some(r)),
                Err(_) => results.push(Some(Err(LoaderError::Malformed(
                    "dequant thread panicked".into(),
                )))),
            }
        }
    });
    results
        .into_iter()
        .map(|r| r.unwrap_or_else(|| Err(LoaderError::Malformed("tensor not read".into()))))
        .collect()
}
