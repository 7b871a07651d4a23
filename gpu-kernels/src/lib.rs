//! GPU kernels written in Rust, compiled to PTX with rustc's `nvptx64-nvidia-cuda`
//! target, and run on the CPU by a host emulator so the same source is tested by
//! `cargo test` on the stable toolchain.
//!
//! Layout:
//! - [`device`]: the device API with the shape of `cuda_std` (indices, `sync_threads`,
//!   warp shuffles, shared memory, atomics, fast math). On nvptx it lowers to PTX
//!   instructions; on the host it is the emulator in [`device::emu`].
//! - [`attention`], [`cache`], [`norm`], [`elementwise`]: generic kernel bodies, over the
//!   storage type ([`Storage`]: `f32`, `f16`, `bf16`) and, for attention, the head size.
//! - [`entries`]: the monomorphised entry points (`#[no_mangle] extern "ptx-kernel"` on
//!   nvptx, plain `unsafe fn` on the host) and [`KERNELS`], the table of entry names and
//!   parameter lists a CUDA executor launches by.
//! - [`launch`]: grid/block/shared-memory sizing for every kernel family.
//! - [`lora`]: multi-LoRA deltas (Punica's BGMV for decode, SGMV for prefill segments).
//! - [`prefill_mma`]: FlashAttention-2 prefill on tensor cores (`mma.sync`, bf16/f16).
//! - [`sampling`] and [`philox`]: on-device sampling and the counter-based generator the
//!   CPU sampler shares with it; [`penalty`]: `logit_bias`, the penalties (token counts
//!   kept on the device) and `min_tokens` suppression before that draw.
//!
//! Invariants: the crate is `#![no_std]` and has no host dependencies on nvptx; every
//! kernel is written for any 1-D block whose size is a multiple of 32 (at most 1024),
//! and reaches every `sync_threads` on all threads of a block (block-uniform control flow
//! around barriers). Accumulation is always in `f32`.
#![no_std]
#![cfg_attr(
    target_arch = "nvptx64",
    feature(abi_ptx, asm_experimental_arch, stdarch_nvptx, link_llvm_intrinsics),
    allow(internal_features)
)]
// Kernel ABIs take many scalar and pointer parameters by design.
#![allow(clippy::too_many_arguments)]

#[cfg(not(target_arch = "nvptx64"))]
extern crate std;

pub mod attention;
pub mod cache;
pub mod decode;
pub mod device;
pub mod elementwise;
pub mod entries;
pub mod launch;
pub mod lora;
pub mod norm;
pub mod penalty;
pub mod philox;
pub mod prefill_mma;
mod reduce;
pub mod sampling;
pub mod sig;
mod storage;

pub use entries::KERNELS;
pub use launch::{Dim3, LaunchConfig};
#[cfg(not(target_arch = "nvptx64"))]
pub use sig::{check_args, find_kernel, ArgMismatch, KernelArg};
pub use sig::{KernelSig, ParamKind, ParamSig};
pub use storage::Storage;
