//! The Llama-family forward pass on the CPU.
