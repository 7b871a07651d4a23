//! Where fetched and generated artifacts live: one cache folder outside git.
//!
//! `$PAGED_ENGINE_CACHE` when set, else `$XDG_CACHE_HOME/paged-engine`, else
//! `~/.cache/paged-engine`. `cargo xtask fetch-model` fills it; the server and
//! the tests read from it.
//!
//! Its own crate with no dependencies (re-exported as `model_loader::paths`) so
//! that `xtask`, which downloads into it, builds without the model loader or the
//! engine: a newcomer's first `cargo xtask fetch-model` compiles only xtask's
//! few dependencies.

use std::path::PathBuf;

/// File name of the default model inside [`models_dir`].
pub const DEFAULT_MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
/// Qwen2.5-Coder-0.5B-Instruct Q4_K_M (`cargo xtask fetch-model --model qwen2.5-coder-0.5b`).
pub const QWEN25_CODER_FILE: &str = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf";
/// Gemma-3-270M (base) Q4_K_M (`cargo xtask fetch-model --model gemma-3-270m`).
pub const GEMMA3_270M_FILE: &str = "gemma-3-270m-q4_k_m.gguf";

/// The project's cache root.
pub fn cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("PAGED_ENGINE_CACHE") {
        return PathBuf::from(dir);
    }
    if let Some(dir) = std::env::var_os("XDG_CACHE_HOME") {
        return PathBuf::from(dir).join("paged-engine");
    }
    let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("."), PathBuf::from);
    home.join(".cache").join("paged-engine")
}

/// Folder holding fetched model files.
pub fn models_dir() -> PathBuf {
    cache_dir().join("models")
}

/// Path of the default model (SmolLM2-135M-Instruct, Q4_1 GGUF).
pub fn default_model_path() -> PathBuf {
    models_dir().join(DEFAULT_MODEL_FILE)
}
