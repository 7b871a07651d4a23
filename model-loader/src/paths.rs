//! Where fetched and generated artifacts live: one cache folder outside git.
//!
//! `$PAGED_ENGINE_CACHE` when set, else `$XDG_CACHE_HOME/paged-engine`, else
//! `~/.cache/paged-engine`. `cargo xtask fetch-model` fills it; the server and
//! the tests read from it.

use std::path::PathBuf;

/// File name of the default model inside [`models_dir`].
pub const DEFAULT_MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

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
