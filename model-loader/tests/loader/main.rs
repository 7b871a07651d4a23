//! model-loader integration tests (one binary, several modules).

mod chat;
mod common;
mod gguf;
mod hf;
mod reader;
mod smollm2;
mod spm;
mod tiny;
