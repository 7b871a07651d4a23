//! The Llama-family decoder (Llama, Mistral, Qwen2, Gemma 3) on the CPU.
//!
//! Gemma 3 takes the same path with its branches: embedding scaled by
//! `sqrt(hidden)`, RMSNorm of each q/k head before rotary, local
//! (sliding-window, own rotary base) and global layers, the attention and
//! MLP outputs RMS-normed before their residual adds, GELU-tanh instead of
//! SiLU, scores scaled by `query_pre_attn_scalar ^ -0.5`.
//!
//! Weights are converted once at construction: q/k/v projections fused into
//! one `[q + 2 kv, hidden]` matrix (biases concatenated, Qwen2), gate and up
//! fused into one `[2 * intermediate, hidden]` matrix. Matrices given in a
//! block-quantized type stay in it ([`super::quant`]); the embedding then
//! dequantizes only the looked-up rows. One forward pass runs
//! any mix of prefill chunks and decode tokens; per layer it costs six GEMMs
//! over all batch tokens plus paged attention, and the output projection is
//! applied only to `batch.logits_rows`. Scratch activations are allocated
//! once per call and reused by every layer.

use super::attention::{paged_attention, plan, AttnParams};
use super::batch::validate;
use super::kv_cache::{KvCache, KvGeometry};
use std::borrow::Cow;

use super::linear::{Linear, LinearWeight};
use super::ops::{embed, gelu_tanh_mul, rms_norm, rms_norm_in_place, silu_mul, RopeTables};
use super::quant::{ActPrecision, QMatrix};
use super::ModelError;
use crate::executor::{ExecError, ForwardBatch, Logits};
use model_loader::{Architecture, GemmaNorms, ModelConfig, ModelWeights, Tensor, Weight};

#[derive(Clone)]
struct Layer {
    attn_norm: Vec<f32>,
    qkv: Linear,
    o: Linear,
    ffn_norm: Vec<f32>,
    gate_up: Linear,
    down: Linear,
    /// Gemma 3's extra norms.
    gemma: Option<GemmaLayer>,
    attn: AttnParams,
    /// Rotary from the local tables (Gemma 3's sliding-window layers).
    local_rope: bool,
}

#[derive(Clone)]
struct GemmaLayer {
    q_norm: Vec<f32>,
    k_norm: Vec<f32>,
    post_attn_norm: Vec<f32>,
    post_ffn_norm: Vec<f32>,
}

impl GemmaLayer {
    fn new(g: GemmaNorms, i: usize, h: usize, hd: usize) -> Result<Self, ModelError> {
        let n = |s: &str| format!("layers.{i}.{s}");
        Ok(Self {
            q_norm: take(g.q_norm, &n("q_norm"), &[hd])?,
            k_norm: take(g.k_norm, &n("k_norm"), &[hd])?,
            post_attn_norm: take(g.post_attn_norm, &n("post_attn_norm"), &[h])?,
            post_ffn_norm: take(g.post_ffn_norm, &n("post_ffn_norm"), &[h])?,
        })
    }
}

/// One decoder layer's weights as [`LlamaModel`] keeps them: row-major
/// `[out, in]` f32, q/k/v fused (`[q + 2 kv, hidden]`), gate/up fused
/// (`[2 * intermediate, hidden]`). A quantized matrix shows as an empty
/// slice: call [`LlamaModel::to_f32`] first.
pub struct LayerView<'a> {
    pub attn_norm: &'a [f32],
    pub qkv: &'a [f32],
    /// Qwen2's q/k/v biases, concatenated.
    pub qkv_bias: Option<&'a [f32]>,
    pub o: &'a [f32],
    pub ffn_norm: &'a [f32],
    pub gate_up: &'a [f32],
    pub down: &'a [f32],
}

/// All of a model's weights, read-only (see [`LlamaModel::weights`]).
pub struct WeightsView<'a> {
    /// `[vocab, hidden]`.
    pub embedding: &'a [f32],
    pub final_norm: &'a [f32],
    /// `[vocab, hidden]`; the embedding when tied.
    pub lm_head: &'a [f32],
    pub layers: Vec<LayerView<'a>>,
    pub rope: &'a RopeTables,
}

/// A loaded Llama-family model, ready to run forward passes.
#[derive(Clone)]
pub struct LlamaModel {
    config: ModelConfig,
    /// `[vocab, hidden]`, also the LM head when tied.
    embedding: Linear,
    layers: Vec<Layer>,
    final_norm: Vec<f32>,
    /// `None` when tied to the embedding.
    lm_head: Option<Linear>,
    rope: RopeTables,
    /// Gemma 3's local-layer rotary tables.
    rope_local: Option<RopeTables>,
    /// Multiplies the embedding rows (Gemma: `sqrt(hidden)`).
    embed_scale: Option<f32>,
}

/// An f32 view of a layer (empty when quantized).
fn f(l: &Linear) -> &[f32] {
    l.as_f32().unwrap_or(&[])
}

/// A large matrix as a layer part, shape-checked.
fn take_w(w: Weight, name: &str, shape: &[usize]) -> Result<LinearWeight, ModelError> {
    if w.shape() != shape {
        return Err(ModelError::ShapeMismatch {
            name: name.to_string(),
            expected: shape.to_vec(),
            got: w.shape().to_vec(),
        });
    }
    Ok(match w {
        Weight::F32(t) => LinearWeight::F32(take(t, name, shape)?),
        Weight::Quantized(q) => LinearWeight::Quant(QMatrix::from_tensor(q)),
    })
}

fn take(t: Tensor, name: &str, shape: &[usize]) -> Result<Vec<f32>, ModelError> {
    if t.shape != shape || t.data.len() != shape.iter().product::<usize>() {
        return Err(ModelError::ShapeMismatch {
            name: name.to_string(),
            expected: shape.to_vec(),
            got: t.shape,
        });
    }
    Ok(t.data)
}

fn fuse(parts: Vec<Vec<f32>>) -> Vec<f32> {
    let mut out = Vec::with_capacity(parts.iter().map(Vec::len).sum());
    for p in parts {
        out.extend_from_slice(&p);
    }
    out
}

fn check_config(c: &ModelConfig) -> Result<(), ModelError> {
    let bad = |m: &str| Err(ModelError::InvalidConfig(m.to_string()));
    if c.num_attention_heads == 0 || c.num_key_value_heads == 0 || c.num_hidden_layers == 0 {
        return bad("zero heads or layers");
    }
    if !c.num_attention_heads.is_multiple_of(c.num_key_value_heads) {
        return bad("num_attention_heads is not a multiple of num_key_value_heads");
    }
    if c.head_dim == 0 || !c.head_dim.is_multiple_of(2) {
        return bad("head_dim must be even and non-zero");
    }
    if c.hidden_size == 0
        || c.intermediate_size == 0
        || c.vocab_size == 0
        || c.max_position_embeddings == 0
    {
        return bad("zero-sized dimension");
    }
    Ok(())
}

impl LlamaModel {
    /// Validates shapes and converts the weights (fusing q/k/v and gate/up).
    /// Matrices given as [`Weight::Quantized`] stay quantized.
    pub fn new<W: Into<Weight>>(
        config: ModelConfig,
        weights: ModelWeights<W>,
    ) -> Result<Self, ModelError> {
        check_config(&config)?;
        let weights = weights.map(Into::into);
        let c = &config;
        let (h, hd) = (c.hidden_size, c.head_dim);
        let (qd, kvd, inter) = (
            c.num_attention_heads * hd,
            c.num_key_value_heads * hd,
            c.intermediate_size,
        );
        if weights.layers.len() != c.num_hidden_layers {
            return Err(ModelError::InvalidConfig(format!(
                "{} layers of weights for {} configured layers",
                weights.layers.len(),
                c.num_hidden_layers
            )));
        }
        let gemma = match c.architecture {
            Architecture::Gemma3(g) => Some(g),
            _ => None,
        };
        let mut layers = Vec::with_capacity(weights.layers.len());
        for (i, lw) in weights.layers.into_iter().enumerate() {
            let extra = match (gemma, lw.gemma) {
                (Some(_), Some(g)) => Some(GemmaLayer::new(g, i, h, hd)?),
                (None, None) => None,
                _ => {
                    return Err(ModelError::InvalidConfig(format!(
                        "layers.{i}: Gemma norms present without the gemma3 architecture or missing with it"
                    )))
                }
            };
            let local = gemma.is_some_and(|g| g.is_local(i));
            let attn = match gemma {
                Some(g) => AttnParams {
                    scale: 1.0 / g.query_pre_attn_scalar.sqrt(),
                    window: local.then_some(g.sliding_window),
                },
                None => AttnParams::causal(hd),
            };
            let n = |s: &str| format!("layers.{i}.{s}");
            let bias = match (lw.bq, lw.bk, lw.bv) {
                (None, None, None) => None,
                (Some(bq), Some(bk), Some(bv)) => Some(fuse(vec![
                    take(bq, &n("bq"), &[qd])?,
                    take(bk, &n("bk"), &[kvd])?,
                    take(bv, &n("bv"), &[kvd])?,
                ])),
                _ => {
                    return Err(ModelError::InvalidConfig(n(
                        "q/k/v biases present for some projections only",
                    )))
                }
            };
            let qkv = vec![
                take_w(lw.wq, &n("wq"), &[qd, h])?,
                take_w(lw.wk, &n("wk"), &[kvd, h])?,
                take_w(lw.wv, &n("wv"), &[kvd, h])?,
            ];
            let gate_up = vec![
                take_w(lw.w_gate, &n("w_gate"), &[inter, h])?,
                take_w(lw.w_up, &n("w_up"), &[inter, h])?,
            ];
            layers.push(Layer {
                attn_norm: take(lw.attn_norm, &n("attn_norm"), &[h])?,
                qkv: Linear::stacked(qkv, h, bias),
                o: Linear::stacked(vec![take_w(lw.wo, &n("wo"), &[h, qd])?], qd, None),
                ffn_norm: take(lw.ffn_norm, &n("ffn_norm"), &[h])?,
                gate_up: Linear::stacked(gate_up, h, None),
                down: Linear::stacked(
                    vec![take_w(lw.w_down, &n("w_down"), &[h, inter])?],
                    inter,
                    None,
                ),
                gemma: extra,
                attn,
                local_rope: local,
            });
        }
        let vh = [c.vocab_size, h];
        let embedding = Linear::stacked(
            vec![take_w(weights.token_embedding, "token_embedding", &vh)?],
            h,
            None,
        );
        let lm_head = match weights.lm_head {
            Some(t) => Some(Linear::stacked(vec![take_w(t, "lm_head", &vh)?], h, None)),
            None => None,
        };
        let final_norm = take(weights.final_norm, "final_norm", &[h])?;
        let rope = RopeTables::new(hd, c.rope_theta, c.rope_scaling, c.max_position_embeddings);
        let rope_local =
            gemma.map(|g| RopeTables::new(hd, g.rope_local_theta, None, c.max_position_embeddings));
        let embed_scale = gemma.map(|_| (h as f32).sqrt());
        let model = Self {
            config,
            embedding,
            layers,
            final_norm,
            lm_head,
            rope,
            rope_local,
            embed_scale,
        };
        // The loader's per-tensor copies and the unfused parts freed above
        // stay in the allocator's free lists (about 58 MiB for SmolLM2
        // Q4_1: resident memory 163 MiB for 92 MiB of weights); hand them
        // back to the OS.
        release_free_heap();
        Ok(model)
    }

    /// The model's hyper-parameters.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// The converted weights, read-only (a GPU executor uploads them).
    /// Quantized matrices show as empty slices: use [`LlamaModel::to_f32`]
    /// first when [`LlamaModel::is_quantized`].
    pub fn weights(&self) -> WeightsView<'_> {
        WeightsView {
            embedding: f(&self.embedding),
            final_norm: &self.final_norm,
            lm_head: f(self.lm_head.as_ref().unwrap_or(&self.embedding)),
            layers: self
                .layers
                .iter()
                .map(|l| LayerView {
                    attn_norm: &l.attn_norm,
                    qkv: f(&l.qkv),
                    qkv_bias: l.qkv.bias.as_deref(),
                    o: f(&l.o),
                    ffn_norm: &l.ffn_norm,
                    gate_up: f(&l.gate_up),
                    down: f(&l.down),
                })
                .collect(),
            rope: &self.rope,
        }
    }

    /// True when some matrix is kept block-quantized.
    pub fn is_quantized(&self) -> bool {
        self.linears().any(Linear::is_quantized)
    }

    /// This model with every matrix in f32: borrowed when it already is,
    /// else a dequantized copy (O(parameters)).
    pub fn to_f32(&self) -> Cow<'_, LlamaModel> {
        if !self.is_quantized() {
            return Cow::Borrowed(self);
        }
        let mut m = self.clone();
        m.embedding = m.embedding.to_f32();
        m.lm_head = m.lm_head.as_ref().map(Linear::to_f32);
        for l in &mut m.layers {
            for lin in [&mut l.qkv, &mut l.o, &mut l.gate_up, &mut l.down] {
                *lin = lin.to_f32();
            }
        }
        Cow::Owned(m)
    }

    /// How every quantized layer quantizes its activations (default
    /// [`ActPrecision::Two8`]; `One8` is llama.cpp's scheme, for comparison).
    pub fn set_act_precision(&mut self, p: ActPrecision) {
        self.embedding.act = p;
        if let Some(h) = &mut self.lm_head {
            h.act = p;
        }
        for l in &mut self.layers {
            for lin in [&mut l.qkv, &mut l.o, &mut l.gate_up, &mut l.down] {
                lin.act = p;
            }
        }
    }

    /// Bytes held by the weight matrices (quantized ones at their size).
    pub fn matrix_bytes(&self) -> usize {
        self.linears().map(Linear::nbytes).sum()
    }

    fn linears(&self) -> impl Iterator<Item = &Linear> {
        std::iter::once(&self.embedding)
            .chain(self.lm_head.as_ref())
            .chain(
                self.layers
                    .iter()
                    .flat_map(|l| [&l.qkv, &l.o, &l.gate_up, &l.down]),
            )
    }

    /// The KV pool geometry this model needs for `num_blocks` blocks of `block_size`.
    pub fn kv_geometry(&self, num_blocks: usize, block_size: usize) -> KvGeometry {
        KvGeometry::for_model(&self.config, num_blocks, block_size)
    }

    /// Runs one forward pass: writes this step's K/V into `cache` and returns
    /// the logits of `batch.logits_rows`, in that order.
    pub fn forward(&self, batch: &ForwardBatch, cache: &mut KvCache) -> Result<Logits, ExecError> {
        let c = &self.config;
        let geom = cache.geometry();
        if geom.num_layers != c.num_hidden_layers
            || geom.num_kv_heads != c.num_key_value_heads
            || geom.head_dim != c.head_dim
            || geom.block_size == 0
        {
            return Err(ExecError::InvalidBatch(format!(
                "KV cache geometry {geom:?} does not fit the model"
            )));
        }
        validate(batch, &geom, c.vocab_size, self.rope.max_positions())?;
        let n = batch.token_ids.len();
        if n == 0 {
            // A step with block operations only (validation above guarantees no rows).
            return Ok(Logits {
                rows: 0,
                vocab: c.vocab_size,
                data: Vec::new(),
            });
        }
        let (h, nh, hd) = (c.hidden_size, c.num_attention_heads, c.head_dim);
        let (qd, kvd, inter) = (nh * hd, c.num_key_value_heads * hd, c.intermediate_size);
        let qkv_dim = qd + 2 * kvd;

        let mut x = vec![0.0f32; n * h];
        self.embed(&batch.token_ids, &mut x);
        if let Some(scale) = self.embed_scale {
            x.iter_mut().for_each(|v| *v *= scale);
        }
        let mut hbuf = vec![0.0f32; n * h];
        // Gemma's un-normed branch output before its post-norm.
        let mut branch = if self.embed_scale.is_some() {
            vec![0.0f32; n * h]
        } else {
            Vec::new()
        };
        let mut qkv = vec![0.0f32; n * qkv_dim];
        let mut attn = vec![0.0f32; n * qd];
        let mut gu = vec![0.0f32; n * 2 * inter];
        let mut act = vec![0.0f32; n * inter];
        let tasks = plan(&batch.seqs, nh, c.num_key_value_heads);

        for (li, layer) in self.layers.iter().enumerate() {
            rms_norm(&x, &layer.attn_norm, c.rms_norm_eps, &mut hbuf);
            layer.qkv.forward(&hbuf, n, &mut qkv, false);
            let rope = match (&self.rope_local, layer.local_rope) {
                (Some(local), true) => local,
                _ => &self.rope,
            };
            for (row, &pos) in qkv.chunks_exact_mut(qkv_dim).zip(&batch.positions) {
                let (q, rest) = row.split_at_mut(qd);
                if let Some(g) = &layer.gemma {
                    rms_norm_in_place(q, &g.q_norm, c.rms_norm_eps);
                    rms_norm_in_place(&mut rest[..kvd], &g.k_norm, c.rms_norm_eps);
                }
                rope.apply(q, pos);
                rope.apply(&mut rest[..kvd], pos);
            }
            cache.layer_mut(li).write(
                &qkv[qd..],
                &qkv[qd + kvd..],
                qkv_dim,
                &batch.slot_mapping,
                kvd,
            );
            paged_attention(
                layer.attn,
                &qkv,
                qkv_dim,
                cache.layer(li),
                &geom,
                &batch.seqs,
                &tasks,
                nh,
                &mut attn,
            );
            match &layer.gemma {
                None => layer.o.forward(&attn, n, &mut x, true),
                Some(g) => {
                    layer.o.forward(&attn, n, &mut branch, false);
                    add_normed(
                        &branch,
                        &g.post_attn_norm,
                        c.rms_norm_eps,
                        &mut hbuf,
                        &mut x,
                    );
                }
            }
            rms_norm(&x, &layer.ffn_norm, c.rms_norm_eps, &mut hbuf);
            layer.gate_up.forward(&hbuf, n, &mut gu, false);
            match &layer.gemma {
                None => {
                    silu_mul(&gu, inter, &mut act);
                    layer.down.forward(&act, n, &mut x, true);
                }
                Some(g) => {
                    gelu_tanh_mul(&gu, inter, &mut act);
                    layer.down.forward(&act, n, &mut branch, false);
                    add_normed(&branch, &g.post_ffn_norm, c.rms_norm_eps, &mut hbuf, &mut x);
                }
            }
        }

        let rows = batch.logits_rows.len();
        let mut sel = vec![0.0f32; rows * h];
        for (dst, &r) in sel.chunks_exact_mut(h).zip(&batch.logits_rows) {
            dst.copy_from_slice(&x[r * h..(r + 1) * h]);
        }
        let mut normed = vec![0.0f32; rows * h];
        rms_norm(&sel, &self.final_norm, c.rms_norm_eps, &mut normed);
        let vocab = c.vocab_size;
        let mut data = vec![0.0f32; rows * vocab];
        let head = self.lm_head.as_ref().unwrap_or(&self.embedding);
        head.forward(&normed, rows, &mut data, false);
        Ok(Logits { rows, vocab, data })
    }

    /// Gathers the embedding rows of `ids` (validated `< vocab`) into `out`.
    fn embed(&self, ids: &[u32], out: &mut [f32]) {
        let h = self.config.hidden_size;
        match self.embedding.parts.as_slice() {
            [LinearWeight::F32(table)] => embed(table, h, ids, out),
            parts => {
                for (o, &id) in out.chunks_exact_mut(h).zip(ids) {
                    let mut r = id as usize;
                    for p in parts {
                        let rows = p.rows(h);
                        if r < rows {
                            match p {
                                LinearWeight::F32(t) => o.copy_from_slice(&t[r * h..(r + 1) * h]),
                                LinearWeight::Quant(q) => q.dequantize_row(r, o),
                            }
                            break;
                        }
                        r -= rows;
                    }
                }
            }
        }
    }
}

/// Returns the heap's free pages to the OS (glibc's `malloc_trim`; a no-op
/// elsewhere). Cost: one pass over the allocator's free lists.
fn release_free_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        extern "C" {
            fn malloc_trim(pad: usize) -> std::ffi::c_int;
        }
        // SAFETY: glibc's malloc_trim takes no pointers and only releases
        // pages of free chunks (thread-safe: it locks each arena).
        unsafe {
            malloc_trim(0);
        }
    }
}

/// `x += rms_norm(branch) * weight` (Gemma's post-norms), `tmp` as scratch.
fn add_normed(branch: &[f32], weight: &[f32], eps: f32, tmp: &mut [f32], x: &mut [f32]) {
    rms_norm(branch, weight, eps, tmp);
    x.iter_mut().zip(tmp.iter()).for_each(|(a, b)| *a += b);
}
