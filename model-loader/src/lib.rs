//! Everything needed to turn model files on disk into typed, validated data:
//! a [`ModelConfig`], dequantized f32 [`ModelWeights`], a [`Tokenizer`] and a
//! [`ChatTemplate`].
//!
//! Invariant: this crate does no model compute and no GPU work. It reads,
//! validates, dequantizes and reorders; numbers leave it as plain `f32` rows,
//! or, under [`WeightTypes::File`], as the file's quantized blocks.
//!
//! Entry points: [`load_model`] takes a `.gguf` file or an HF model
//! directory; [`WeightReader`] reads the same weights a layer at a time
//! (what [`load_model_with`] reads through, all at once);
//! [`load_config_and_tokenizer`] reads no tensor.

pub mod chat;
pub mod config;
pub mod dequant;
pub mod error;
pub mod generation;
pub mod gguf;
pub mod gguf_model;
pub mod hf;
pub mod lora;
pub mod lora_gen;
pub mod memory;
pub mod quant;
pub mod reader;
pub mod safetensors_io;
pub mod tiny;
pub mod tokenizer;
pub mod weights;

/// Where fetched and generated artifacts live (the `model-paths` crate, which
/// `xtask` uses without this one).
pub use model_paths as paths;

use std::path::Path;

pub use chat::{ChatMessage, ChatTemplate};
pub use config::{Architecture, Gemma3Params, ModelConfig, RopeScaling};
pub use error::LoaderError;
pub use generation::GenerationDefaults;
pub use quant::QuantType;
pub use reader::{WeightReader, WeightTypes};
pub use tokenizer::Tokenizer;
pub use weights::{GemmaNorms, LayerWeights, ModelWeights, QuantTensor, Tensor, Weight};

/// Which on-disk layout a model came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelFormat {
    Gguf,
    HfDir,
}

/// A fully loaded model (f32 matrices by default; see [`load_model_with`]).
#[derive(Debug)]
pub struct LoadedModel<W = Tensor> {
    pub config: ModelConfig,
    pub weights: ModelWeights<W>,
    pub tokenizer: Tokenizer,
    pub chat_template: Option<ChatTemplate>,
    pub format: ModelFormat,
}

/// Everything but the weights (cheap: no tensor is read).
#[derive(Debug)]
pub struct ModelInfo {
    pub config: ModelConfig,
    pub tokenizer: Tokenizer,
    pub chat_template: Option<ChatTemplate>,
    pub format: ModelFormat,
    /// The sampling defaults the model states (GGUF `general.sampling.*`,
    /// or the HF directory's `generation_config.json`).
    pub generation_defaults: GenerationDefaults,
}

fn format_of(path: &Path) -> Result<ModelFormat, LoaderError> {
    if path.is_dir() {
        if path.join("config.json").is_file() {
            return Ok(ModelFormat::HfDir);
        }
    } else if path.is_file() {
        return Ok(ModelFormat::Gguf);
    } else if !path.exists() {
        return Err(LoaderError::io(
            path,
            std::io::Error::new(std::io::ErrorKind::NotFound, "no such file or directory"),
        ));
    }
    Err(LoaderError::UnknownFormat {
        path: path.to_path_buf(),
    })
}

fn gguf_template(g: &gguf::GgufFile, tok: &Tokenizer) -> Result<Option<ChatTemplate>, LoaderError> {
    let Some(src) = g.get_opt("tokenizer.chat_template", "string", |v| {
        v.as_str().map(str::to_string)
    })?
    else {
        return Ok(None);
    };
    let name = |id: Option<u32>| id.and_then(|i| tok.id_to_token(i)).unwrap_or_default();
    let eos = name(tok.eos_token_ids().first().copied());
    ChatTemplate::new(&src, &name(tok.bos_token_id()), &eos).map(Some)
}

/// Loads a `.gguf` file or an HF model directory (config.json, safetensors,
/// tokenizer.json): config, f32 weights, tokenizer and chat template.
pub fn load_model(path: &Path) -> Result<LoadedModel, LoaderError> {
    let m = load_model_with(path, WeightTypes::F32)?;
    Ok(LoadedModel {
        config: m.config,
        weights: m.weights.map(Weight::into_f32),
        tokenizer: m.tokenizer,
        chat_template: m.chat_template,
        format: m.format,
    })
}

/// Like [`load_model`], the large matrices kept as `types` says (a GGUF's
/// block-quantized matrices stay quantized under [`WeightTypes::File`]; HF
/// directories are always f32): [`WeightReader::weights`], with the
/// tokenizer built meanwhile on another thread.
pub fn load_model_with(
    path: &Path,
    types: WeightTypes,
) -> Result<LoadedModel<Weight>, LoaderError> {
    let reader = WeightReader::open(path)?;
    let (tokenizer, weights) = std::thread::scope(|s| {
        let tok = s.spawn(|| tokenizer_and_template(&reader));
        let weights = reader.weights(types);
        let tok = tok
            .join()
            .unwrap_or_else(|_| Err(LoaderError::Tokenizer("tokenizer thread panicked".into())));
        (tok, weights)
    });
    let ((tokenizer, chat_template), weights) = (tokenizer?, weights?);
    let format = reader.format();
    Ok(LoadedModel {
        config: reader.config().clone(),
        weights,
        tokenizer,
        chat_template,
        format,
    })
}

/// The tokenizer and chat template of the model a reader opened.
fn tokenizer_and_template(
    reader: &WeightReader,
) -> Result<(Tokenizer, Option<ChatTemplate>), LoaderError> {
    match reader.gguf() {
        Some(g) => {
            let tokenizer = tokenizer::gguf::tokenizer_from_gguf(g)?;
            let template = gguf_template(g, &tokenizer)?;
            Ok((tokenizer, template))
        }
        None => hf::tokenizer_and_template(reader.path()),
    }
}

/// Like [`load_model`] without reading any tensor.
pub fn load_config_and_tokenizer(path: &Path) -> Result<ModelInfo, LoaderError> {
    match format_of(path)? {
        ModelFormat::Gguf => {
            let g = gguf::GgufFile::open(path)?;
            let config = gguf_model::config_from_gguf(&g)?;
            let tokenizer = tokenizer::gguf::tokenizer_from_gguf(&g)?;
            let chat_template = gguf_template(&g, &tokenizer)?;
            Ok(ModelInfo {
                config,
                tokenizer,
                chat_template,
                format: ModelFormat::Gguf,
                generation_defaults: GenerationDefaults::from_gguf(&g)?,
            })
        }
        ModelFormat::HfDir => {
            let config = hf::read_config(path)?;
            let (tokenizer, chat_template) = hf::tokenizer_and_template(path)?;
            Ok(ModelInfo {
                config,
                tokenizer,
                chat_template,
                format: ModelFormat::HfDir,
                generation_defaults: GenerationDefaults::from_dir(path)?,
            })
        }
    }
}
