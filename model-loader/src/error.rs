//! The one error type of this crate. Every malformed input maps to a variant
//! that names the problem; nothing in the loader panics on bad files.

use std::path::PathBuf;

/// Everything that can go wrong while reading model files.
#[derive(Debug, thiserror::Error)]
pub enum LoaderError {
    #[error("I/O error on {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is neither a .gguf file nor a directory holding config.json")]
    UnknownFormat { path: PathBuf },
    #[error("truncated file: {what} needs {needed} bytes at offset {offset}, file has {len}")]
    Truncated {
        what: String,
        offset: u64,
        needed: u64,
        len: u64,
    },
    #[error("bad magic {found:#010x}: not a GGUF file")]
    BadMagic { found: u32 },
    #[error("unsupported GGUF version {0} (only 3 is read)")]
    UnsupportedVersion(u32),
    #[error("malformed GGUF: {0}")]
    Malformed(String),
    #[error("unsupported GGUF metadata value type {0}")]
    UnsupportedValueType(u32),
    #[error("unsupported tensor type {name} (id {id}) for tensor {tensor}")]
    UnsupportedTensorType {
        name: &'static str,
        id: u32,
        tensor: String,
    },
    #[error("unsupported dtype {dtype} for tensor {tensor}")]
    UnsupportedDtype { dtype: String, tensor: String },
    #[error("missing metadata key {0}")]
    MissingMetadata(String),
    #[error("metadata key {key} has the wrong type: expected {expected}")]
    MetadataType { key: String, expected: &'static str },
    #[error("missing tensor {0}")]
    MissingTensor(String),
    #[error("shape mismatch for {tensor}: expected {expected:?}, found {found:?}")]
    ShapeMismatch {
        tensor: String,
        expected: Vec<usize>,
        found: Vec<usize>,
    },
    #[error("unsupported architecture {0}")]
    UnsupportedArchitecture(String),
    #[error("unsupported pre-tokenizer {0:?} (known: smollm, llama-bpe, gpt2, qwen2)")]
    UnsupportedPreTokenizer(String),
    #[error("unsupported tokenizer model {0:?} (only byte-level BPE, \"gpt2\")")]
    UnsupportedTokenizerModel(String),
    #[error("unsupported rope scaling type {0:?} (only \"llama3\")")]
    UnsupportedRopeScaling(String),
    #[error("invalid config: {0}")]
    InvalidConfig(String),
    #[error("bad JSON in {path}")]
    BadJson {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("safetensors error in {path}: {message}")]
    Safetensors { path: PathBuf, message: String },
    /// The tokenizer data is not what the loader can build a tokenizer from.
    #[error("tokenizer error: {0}")]
    Tokenizer(String),
    /// The `tokenizers` library (or JSON) refused the tokenizer we built.
    #[error("the tokenizer could not be built or used")]
    TokenizerLib(#[source] Box<dyn std::error::Error + Send + Sync>),
    #[error("chat template error")]
    ChatTemplate(#[source] minijinja::Error),
    #[error("layer {index} out of range: the model has {num_layers} layers")]
    LayerOutOfRange { index: usize, num_layers: usize },
    #[error("rows {start}..{end} of a {rows} x {cols} matrix into a buffer of {out_len} values")]
    RowRange {
        start: usize,
        end: usize,
        rows: usize,
        cols: usize,
        out_len: usize,
    },
    /// A LoRA adapter file the loader needs is not there.
    #[error("LoRA adapter {path}: missing file {file}")]
    LoraMissingFile { path: PathBuf, file: &'static str },
    /// The adapter's rank is above the server's limit (`--max-lora-rank`).
    #[error("LoRA adapter rank {rank} is above the maximum {max} (--max-lora-rank)")]
    LoraRankTooLarge { rank: usize, max: usize },
    /// The adapter targets a module the engine does not adapt.
    #[error("LoRA adapter targets module {module:?}; supported: q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj")]
    LoraUnknownTarget { module: String },
    /// The adapter's configuration or contents are not a LoRA adapter the
    /// engine can apply (the message names what).
    #[error("invalid LoRA adapter: {0}")]
    LoraInvalid(String),
}

impl LoaderError {
    /// Wraps an I/O error with the path it happened on.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Self::Io {
            path: path.into(),
            source,
        }
    }
}

/// Shorthand used across the crate.
pub type Result<T, E = LoaderError> = std::result::Result<T, E>;
