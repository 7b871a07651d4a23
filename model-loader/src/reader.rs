//! Tensors on demand: [`WeightReader`] reads one layer (or the embedding,
//! the head, the final norm) at a time from the memory-mapped GGUF file or
//! HF safetensors files, so a consumer can convert and upload a model layer
//! by layer without ever holding all of it in host memory.
//!
//! This is the loader's one path from files to weights: every tensor is
//! named, shape-checked, read and reordered here ([`crate::load_model_with`]
//! is [`WeightReader::weights`], the same per-tensor reads and the same
//! layer assembly as [`WeightReader::layer`], run over the whole model at
//! once). Tensor names: llama.cpp's in a GGUF (`token_embd`,
//! `blk.N.attn_q`, ..., `output_norm`, `output`), transformers' in an HF
//! directory (`model.embed_tokens`, `model.layers.N.self_attn.q_proj`, ...,
//! `model.norm`, `lm_head`). Matrices leave as [`WeightTypes`] says (a
//! GGUF's block-quantized ones kept under [`WeightTypes::File`]), norms and
//! biases as f32; a GGUF `llama` model's Q/K rows are un-permuted to HF order
//! (llama.cpp does not permute `qwen2` or `gemma3`); Gemma 3's q/k norms and
//! post-norms and Qwen2's q/k/v biases come with their layer.
//!
//! Invariants: [`WeightReader::open`] checks every tensor the model needs
//! (present, expected shape, readable type, Q/K heads dividing the rows)
//! before any is read, so a malformed file is refused before a consumer has
//! uploaded half of it; every later failure (a layer index out of range
//! included) is still a [`LoaderError`], never a panic. The reader is `Send`
//! and `Sync` and reads through `&self`: the next layer can be read on
//! another thread while one is uploaded.
//!
//! Cost: opening maps the file(s) and parses the headers (O(header), no
//! tensor data touched). A read touches only the bytes of the tensors asked
//! for and is O(their elements); a layer's (or the whole model's) tensors are
//! read on up to `min(available_parallelism, 8)` scoped threads, balanced by
//! element count (inline when the work is small). Under
//! [`WeightTypes::File`] a quantized matrix is one copy of its file bytes;
//! to convert a large one in bounded memory use [`Weight::to_f32_rows`].

use std::path::{Path, PathBuf};

use crate::config::{Architecture, ModelConfig};
use crate::error::{LoaderError, Result};
use crate::gguf::{GgufFile, TensorInfo};
use crate::gguf_model::unpermute_rows;
use crate::quant::QuantType;
use crate::safetensors_io::{SafetensorsSet, StTensor};
use crate::weights::{GemmaNorms, LayerWeights, ModelWeights, QuantTensor, Tensor, Weight};
use crate::{format_of, ModelFormat};

/// How the large matrices are kept when read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WeightTypes {
    /// Block-quantized matrices stay in the file's type (F16/BF16 and F32
    /// become f32; an HF directory is always f32); norms and biases are f32.
    #[default]
    File,
    /// Everything dequantized to f32.
    F32,
}

/// Reads a model's tensors on demand from its memory-mapped file(s).
///
/// ```no_run
/// # fn main() -> Result<(), model_loader::LoaderError> {
/// use model_loader::{WeightReader, WeightTypes};
/// let r = WeightReader::open(std::path::Path::new("model.gguf"))?;
/// for i in 0..r.num_layers() {
///     let layer = r.layer(i, WeightTypes::File)?;
///     // convert and upload `layer`, then drop it
/// #   drop(layer);
/// }
/// # Ok(()) }
/// ```
pub struct WeightReader {
    path: PathBuf,
    files: Files,
    config: ModelConfig,
}

impl std::fmt::Debug for WeightReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WeightReader")
            .field("path", &self.path)
            .field("format", &self.format())
            .field("layers", &self.num_layers())
            .finish()
    }
}

/// The mapped files behind a reader.
enum Files {
    Gguf(GgufFile),
    Hf(SafetensorsSet),
}

// The engine reads the next layer on another thread while it uploads one.
const _: () = {
    const fn send_sync<T: Send + Sync>() {}
    send_sync::<WeightReader>();
};

impl WeightReader {
    /// Opens a `.gguf` file or an HF model directory (config.json and
    /// safetensors), reads the config, and checks every tensor the model
    /// needs without reading any tensor data.
    pub fn open(path: &Path) -> Result<Self> {
        let (files, config) = match format_of(path)? {
            ModelFormat::Gguf => {
                let g = GgufFile::open(path)?;
                let config = crate::gguf_model::config_from_gguf(&g)?;
                (Files::Gguf(g), config)
            }
            ModelFormat::HfDir => {
                let config = crate::hf::read_config(path)?;
                (Files::Hf(SafetensorsSet::open(path)?), config)
            }
        };
        let reader = Self {
            path: path.to_path_buf(),
            files,
            config,
        };
        reader.source().check_all()?;
        Ok(reader)
    }

    /// The model's hyper-parameters.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// GGUF file or HF directory.
    pub fn format(&self) -> ModelFormat {
        match self.files {
            Files::Gguf(_) => ModelFormat::Gguf,
            Files::Hf(_) => ModelFormat::HfDir,
        }
    }

    /// The path it was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Decoder layers (`config().num_hidden_layers`).
    pub fn num_layers(&self) -> usize {
        self.config.num_hidden_layers
    }

    /// The parsed GGUF file (its metadata holds the tokenizer), if a GGUF.
    pub(crate) fn gguf(&self) -> Option<&GgufFile> {
        match &self.files {
            Files::Gguf(g) => Some(g),
            Files::Hf(_) => None,
        }
    }

    fn source(&self) -> Source<'_> {
        let files = match &self.files {
            Files::Gguf(g) => FilesRef::Gguf(g),
            Files::Hf(s) => FilesRef::Hf(s),
        };
        Source {
            files,
            config: &self.config,
        }
    }

    /// Layer `i`'s tensors, matrices as `types` says; a
    /// [`LoaderError::LayerOutOfRange`] when `i >= num_layers()`.
    pub fn layer(&self, i: usize, types: WeightTypes) -> Result<LayerWeights<Weight>> {
        self.source().layer(i, types)
    }

    /// `[vocab, hidden]` token embedding.
    pub fn token_embedding(&self, types: WeightTypes) -> Result<Weight> {
        self.source().read(Part::Embedding, types)
    }

    /// `[vocab, hidden]` output projection; `None` when tied to the embedding.
    pub fn lm_head(&self, types: WeightTypes) -> Result<Option<Weight>> {
        if self.config.tie_word_embeddings {
            return Ok(None);
        }
        self.source().read(Part::Head, types).map(Some)
    }

    /// `[hidden]` final RMSNorm weight.
    pub fn final_norm(&self) -> Result<Tensor> {
        Ok(self
            .source()
            .read(Part::FinalNorm, WeightTypes::F32)?
            .into_f32())
    }

    /// Every tensor at once, read in parallel (what [`crate::load_model_with`]
    /// returns): equal to the embedding, each [`Self::layer`], the final norm
    /// and the head read one by one.
    pub fn weights(&self, types: WeightTypes) -> Result<ModelWeights<Weight>> {
        self.source().weights(types)
    }
}

/// Borrowed files: a [`WeightReader`]'s, or a GGUF file parsed by a caller.
#[derive(Clone, Copy)]
enum FilesRef<'a> {
    Gguf(&'a GgufFile),
    Hf(&'a SafetensorsSet),
}

/// Files plus the config that says which tensors they must hold: where
/// every tensor is read. [`WeightReader`] is an owned one of these;
/// `gguf_model::weights_from_gguf_as` and `hf::read_weights` build one over
/// files their caller opened.
#[derive(Clone, Copy)]
pub(crate) struct Source<'a> {
    files: FilesRef<'a>,
    config: &'a ModelConfig,
}

/// One tensor of the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Part {
    Embedding,
    FinalNorm,
    Head,
    Layer(usize, LayerPart),
}

/// One tensor of a layer; the discriminant indexes [`LayerParts`]'s slots.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LayerPart {
    AttnNorm,
    Wq,
    Wk,
    Wv,
    Wo,
    FfnNorm,
    Gate,
    Up,
    Down,
    Bq,
    Bk,
    Bv,
    QNorm,
    KNorm,
    PostAttnNorm,
    PostFfnNorm,
}

const NUM_LAYER_PARTS: usize = 16;

impl LayerPart {
    /// llama.cpp's name after `blk.N.`.
    fn gguf_name(self) -> &'static str {
        match self {
            Self::AttnNorm => "attn_norm.weight",
            Self::Wq => "attn_q.weight",
            Self::Wk => "attn_k.weight",
            Self::Wv => "attn_v.weight",
            Self::Wo => "attn_output.weight",
            Self::FfnNorm => "ffn_norm.weight",
            Self::Gate => "ffn_gate.weight",
            Self::Up => "ffn_up.weight",
            Self::Down => "ffn_down.weight",
            Self::Bq => "attn_q.bias",
            Self::Bk => "attn_k.bias",
            Self::Bv => "attn_v.bias",
            Self::QNorm => "attn_q_norm.weight",
            Self::KNorm => "attn_k_norm.weight",
            Self::PostAttnNorm => "post_attention_norm.weight",
            Self::PostFfnNorm => "post_ffw_norm.weight",
        }
    }

    /// transformers' name after `model.layers.N.`; `None` for Gemma 3's
    /// norms, which an HF directory cannot give here (its config is refused,
    /// and transformers stores `w` where the forward pass wants `1 + w`).
    fn hf_name(self) -> Option<&'static str> {
        Some(match self {
            Self::AttnNorm => "input_layernorm.weight",
            Self::Wq => "self_attn.q_proj.weight",
            Self::Wk => "self_attn.k_proj.weight",
            Self::Wv => "self_attn.v_proj.weight",
            Self::Wo => "self_attn.o_proj.weight",
            Self::FfnNorm => "post_attention_layernorm.weight",
            Self::Gate => "mlp.gate_proj.weight",
            Self::Up => "mlp.up_proj.weight",
            Self::Down => "mlp.down_proj.weight",
            Self::Bq => "self_attn.q_proj.bias",
            Self::Bk => "self_attn.k_proj.bias",
            Self::Bv => "self_attn.v_proj.bias",
            Self::QNorm | Self::KNorm | Self::PostAttnNorm | Self::PostFfnNorm => return None,
        })
    }

    /// The parts a layer of `c` has, in reading order.
    fn all(c: &ModelConfig) -> Vec<LayerPart> {
        use LayerPart::*;
        let mut parts = vec![AttnNorm, Wq, Wk, Wv, Wo, FfnNorm, Gate, Up, Down];
        if c.attention_bias {
            parts.extend([Bq, Bk, Bv]);
        }
        if matches!(c.architecture, Architecture::Gemma3(_)) {
            parts.extend([QNorm, KNorm, PostAttnNorm, PostFfnNorm]);
        }
        parts
    }
}

/// What reading one tensor means: its name in the files, its expected
/// (row-major, HF) shape, whether it is a matrix (may stay quantized), and
/// the head count whose Q/K row permutation to undo.
struct Spec {
    name: String,
    shape: Vec<usize>,
    matrix: bool,
    unpermute: Option<usize>,
}

/// A checked tensor, its bytes not read yet.
enum Located<'a> {
    Gguf(&'a GgufFile, &'a TensorInfo),
    Hf(StTensor<'a>),
}

/// Undoes the Q/K row permutation `spec` asks for, on rows of `cols` items
/// (f32 values or the bytes of quantized rows).
fn unpermute<T: Copy + Default>(spec: &Spec, data: Vec<T>, cols: usize) -> Vec<T> {
    match spec.unpermute {
        Some(n_head) => unpermute_rows(&data, n_head, spec.shape[0], cols),
        None => data,
    }
}

/// Layer tensors read so far, one slot per [`LayerPart`].
struct LayerParts([Option<Weight>; NUM_LAYER_PARTS]);

impl LayerParts {
    fn take(&mut self, part: LayerPart) -> Result<Weight> {
        self.0[part as usize]
            .take()
            .ok_or_else(|| LoaderError::Malformed(format!("{part:?} was not read")))
    }

    fn take_f32(&mut self, part: LayerPart) -> Result<Tensor> {
        self.take(part).map(Weight::into_f32)
    }

    fn take_opt(&mut self, part: LayerPart) -> Option<Tensor> {
        self.0[part as usize].take().map(Weight::into_f32)
    }

    fn into_layer(mut self, c: &ModelConfig) -> Result<LayerWeights<Weight>> {
        use LayerPart::*;
        let gemma = if matches!(c.architecture, Architecture::Gemma3(_)) {
            Some(GemmaNorms {
                q_norm: self.take_f32(QNorm)?,
                k_norm: self.take_f32(KNorm)?,
                post_attn_norm: self.take_f32(PostAttnNorm)?,
                post_ffn_norm: self.take_f32(PostFfnNorm)?,
            })
        } else {
            None
        };
        Ok(LayerWeights {
            attn_norm: self.take_f32(AttnNorm)?,
            wq: self.take(Wq)?,
            wk: self.take(Wk)?,
            wv: self.take(Wv)?,
            wo: self.take(Wo)?,
            bq: self.take_opt(Bq),
            bk: self.take_opt(Bk),
            bv: self.take_opt(Bv),
            ffn_norm: self.take_f32(FfnNorm)?,
            w_gate: self.take(Gate)?,
            w_up: self.take(Up)?,
            w_down: self.take(Down)?,
            gemma,
        })
    }
}

impl<'a> Source<'a> {
    pub(crate) fn gguf(g: &'a GgufFile, config: &'a ModelConfig) -> Self {
        Self {
            files: FilesRef::Gguf(g),
            config,
        }
    }

    pub(crate) fn hf(set: &'a SafetensorsSet, config: &'a ModelConfig) -> Self {
        Self {
            files: FilesRef::Hf(set),
            config,
        }
    }

    /// Every part of the model, in reading order: embedding, final norm,
    /// head (when untied), then each layer's parts. Lazy, so a layer count
    /// from a malformed file is never allocated for.
    fn all_parts(&self) -> impl Iterator<Item = Part> + 'a {
        let c = self.config;
        let head = (!c.tie_word_embeddings).then_some(Part::Head);
        let layer = LayerPart::all(c);
        [Part::Embedding, Part::FinalNorm]
            .into_iter()
            .chain(head)
            .chain(
                (0..c.num_hidden_layers)
                    .flat_map(move |i| layer.clone().into_iter().map(move |p| Part::Layer(i, p))),
            )
    }

    /// Checks every part (no tensor data read); the first problem in
    /// reading order is returned. O(tensors).
    fn check_all(&self) -> Result<()> {
        for part in self.all_parts() {
            self.locate(&self.spec(part)?)?;
        }
        Ok(())
    }

    /// Name, shape and treatment of one part.
    fn spec(&self, part: Part) -> Result<Spec> {
        let c = self.config;
        let gguf = matches!(self.files, FilesRef::Gguf(_));
        // Saturating: absurd metadata gives a shape no file holds, not an overflow.
        let (h, q, kv, ff) = (
            c.hidden_size,
            c.num_attention_heads.saturating_mul(c.head_dim),
            c.num_key_value_heads.saturating_mul(c.head_dim),
            c.intermediate_size,
        );
        let fixed = |g: &str, f: &str, shape: Vec<usize>, matrix: bool| Spec {
            name: if gguf { g } else { f }.to_string(),
            shape,
            matrix,
            unpermute: None,
        };
        let (i, lp) = match part {
            Part::Embedding => {
                return Ok(fixed(
                    "token_embd.weight",
                    "model.embed_tokens.weight",
                    vec![c.vocab_size, h],
                    true,
                ))
            }
            Part::FinalNorm => {
                return Ok(fixed(
                    "output_norm.weight",
                    "model.norm.weight",
                    vec![h],
                    false,
                ))
            }
            Part::Head => {
                return Ok(fixed(
                    "output.weight",
                    "lm_head.weight",
                    vec![c.vocab_size, h],
                    true,
                ))
            }
            Part::Layer(i, lp) => (i, lp),
        };
        use LayerPart::*;
        let shape = match lp {
            AttnNorm | FfnNorm | PostAttnNorm | PostFfnNorm => vec![h],
            QNorm | KNorm => vec![c.head_dim],
            Wq => vec![q, h],
            Wk | Wv => vec![kv, h],
            Wo => vec![h, q],
            Gate | Up => vec![ff, h],
            Down => vec![h, ff],
            Bq => vec![q],
            Bk | Bv => vec![kv],
        };
        let name = if gguf {
            format!("blk.{i}.{}", lp.gguf_name())
        } else {
            let rest = lp.hf_name().ok_or_else(|| {
                LoaderError::UnsupportedArchitecture(format!(
                    "{:?} from an HF directory",
                    c.architecture
                ))
            })?;
            format!("model.layers.{i}.{rest}")
        };
        // llama.cpp permutes Q/K rows for `llama` only; HF files are never permuted.
        let permuted = gguf && c.architecture == Architecture::Llama;
        let unpermute = match lp {
            Wq if permuted => Some(c.num_attention_heads),
            Wk if permuted => Some(c.num_key_value_heads),
            _ => None,
        };
        Ok(Spec {
            name,
            matrix: shape.len() == 2,
            shape,
            unpermute,
        })
    }

    /// Finds and checks one tensor: present, of the expected shape, of a
    /// readable type, rows whole heads of even size when un-permuted.
    fn locate(&self, spec: &Spec) -> Result<Located<'a>> {
        if let Some(n_head) = spec.unpermute {
            let rows = spec.shape[0];
            if n_head == 0 || !rows.is_multiple_of(n_head) || !(rows / n_head).is_multiple_of(2) {
                return Err(LoaderError::ShapeMismatch {
                    tensor: spec.name.clone(),
                    expected: vec![n_head, rows / n_head.max(1), spec.shape[1]],
                    found: spec.shape.clone(),
                });
            }
        }
        match self.files {
            FilesRef::Gguf(g) => {
                let info = g
                    .tensor_info(&spec.name)
                    .ok_or_else(|| LoaderError::MissingTensor(spec.name.clone()))?;
                if info.shape() != spec.shape {
                    return Err(LoaderError::ShapeMismatch {
                        tensor: spec.name.clone(),
                        expected: spec.shape.clone(),
                        found: info.shape(),
                    });
                }
                if info.ty.block_layout().is_none() {
                    return Err(info.ty.unsupported(&info.name));
                }
                Ok(Located::Gguf(g, info))
            }
            FilesRef::Hf(set) => set.tensor(&spec.name, &spec.shape).map(Located::Hf),
        }
    }

    /// Reads one checked tensor: a quantized matrix kept as its (row-
    /// reordered) blocks when `types` is [`WeightTypes::File`], else f32.
    fn read_spec(&self, spec: &Spec, types: WeightTypes) -> Result<Weight> {
        let cols = spec.shape.last().copied().unwrap_or(1);
        match self.locate(spec)? {
            Located::Gguf(g, info) => {
                let keep = types == WeightTypes::File && spec.matrix;
                match QuantType::from_ggml(info.ty).filter(|_| keep) {
                    Some(ty) => {
                        let row_bytes = ty.bytes_for(cols).map_err(|e| {
                            LoaderError::Malformed(format!("tensor {}: {e}", spec.name))
                        })?;
                        let bytes = unpermute(spec, g.tensor_bytes(info)?.to_vec(), row_bytes);
                        let q = QuantTensor::new(ty, spec.shape.clone(), bytes, &spec.name)?;
                        Ok(Weight::Quantized(q))
                    }
                    None => {
                        let data = unpermute(spec, g.read_f32(info)?, cols);
                        Ok(Weight::F32(Tensor::new(spec.shape.clone(), data)))
                    }
                }
            }
            Located::Hf(t) => {
                let t = t.to_f32();
                let data = unpermute(spec, t.data, cols);
                Ok(Weight::F32(Tensor::new(t.shape, data)))
            }
        }
    }

    fn read(&self, part: Part, types: WeightTypes) -> Result<Weight> {
        self.read_spec(&self.spec(part)?, types)
    }

    /// Reads `parts` in parallel, results in the order of `parts`; all are
    /// checked before any is read.
    fn read_many(&self, parts: &[Part], types: WeightTypes) -> Result<Vec<Weight>> {
        let specs = parts
            .iter()
            .map(|&p| self.spec(p))
            .collect::<Result<Vec<_>>>()?;
        for spec in &specs {
            self.locate(spec)?;
        }
        let sizes: Vec<usize> = specs.iter().map(|s| s.shape.iter().product()).collect();
        par_map(&sizes, |i| self.read_spec(&specs[i], types))?
            .into_iter()
            .collect()
    }

    fn layer(&self, i: usize, types: WeightTypes) -> Result<LayerWeights<Weight>> {
        let num_layers = self.config.num_hidden_layers;
        if i >= num_layers {
            return Err(LoaderError::LayerOutOfRange {
                index: i,
                num_layers,
            });
        }
        let parts: Vec<Part> = LayerPart::all(self.config)
            .into_iter()
            .map(|p| Part::Layer(i, p))
            .collect();
        let tensors = self.read_many(&parts, types)?;
        assemble_layer(&parts, tensors, self.config)
    }

    /// The whole model: every part read in one parallel pass, then each
    /// layer assembled as [`Self::layer`] assembles it.
    pub(crate) fn weights(&self, types: WeightTypes) -> Result<ModelWeights<Weight>> {
        self.check_all()?;
        let parts: Vec<Part> = self.all_parts().collect();
        let mut tensors = self.read_many(&parts, types)?.into_iter();
        let mut next = || {
            tensors
                .next()
                .ok_or_else(|| LoaderError::Malformed("tensor count".into()))
        };
        let token_embedding = next()?;
        let final_norm = next()?.into_f32();
        let lm_head = if self.config.tie_word_embeddings {
            None
        } else {
            Some(next()?)
        };
        let per_layer = LayerPart::all(self.config).len();
        let layer_parts = &parts[parts.len() - per_layer * self.config.num_hidden_layers..];
        let layers = layer_parts
            .chunks(per_layer)
            .map(|chunk| {
                let tensors = (0..per_layer).map(|_| next()).collect::<Result<Vec<_>>>()?;
                assemble_layer(chunk, tensors, self.config)
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(ModelWeights {
            token_embedding,
            layers,
            final_norm,
            lm_head,
        })
    }
}

/// One layer from its parts and their tensors (same order).
fn assemble_layer(
    parts: &[Part],
    tensors: Vec<Weight>,
    c: &ModelConfig,
) -> Result<LayerWeights<Weight>> {
    let mut slots = LayerParts(Default::default());
    for (&part, t) in parts.iter().zip(tensors) {
        match part {
            Part::Layer(_, lp) => slots.0[lp as usize] = Some(t),
            other => return Err(LoaderError::Malformed(format!("{other:?} in a layer"))),
        }
    }
    slots.into_layer(c)
}

/// Below this many elements per extra thread, work stays on fewer threads.
const MIN_ELEMENTS_PER_THREAD: usize = 1 << 18;

/// Runs `f(i)` for every job `i` (of `sizes[i]` elements) on scoped
/// threads, largest jobs first, each to the least-loaded thread; results
/// in job order. A panicking job is reported, not propagated.
fn par_map<T: Send>(sizes: &[usize], f: impl Fn(usize) -> T + Sync) -> Result<Vec<T>> {
    let total: usize = sizes.iter().sum();
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(8)
        .min(total.div_ceil(MIN_ELEMENTS_PER_THREAD))
        .min(sizes.len())
        .max(1);
    if threads == 1 {
        return Ok((0..sizes.len()).map(f).collect());
    }
    let mut order: Vec<usize> = (0..sizes.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(sizes[i]));
    let mut buckets: Vec<(usize, Vec<usize>)> = vec![(0, Vec::new()); threads];
    for i in order {
        if let Some(b) = buckets.iter_mut().min_by_key(|b| b.0) {
            b.0 += sizes[i];
            b.1.push(i);
        }
    }
    let mut results: Vec<Option<T>> = (0..sizes.len()).map(|_| None).collect();
    let f = &f;
    let panicked = std::thread::scope(|s| {
        let handles: Vec<_> = buckets
            .iter()
            .map(|(_, idx)| s.spawn(move || idx.iter().map(|&i| (i, f(i))).collect::<Vec<_>>()))
            .collect();
        let mut panicked = false;
        for h in handles {
            match h.join() {
                Ok(done) => done.into_iter().for_each(|(i, r)| results[i] = Some(r)),
                Err(_) => panicked = true,
            }
        }
        panicked
    });
    if panicked {
        return Err(LoaderError::Malformed(
            "tensor reading thread panicked".into(),
        ));
    }
    results
        .into_iter()
        .map(|r| r.ok_or_else(|| LoaderError::Malformed("tensor not read".into())))
        .collect()
}
