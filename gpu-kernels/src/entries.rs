//! Monomorphised entry points and the [`KERNELS`] table.
//!
//! [`define_kernels!`] takes kernel families (a parameter list written over the aliases
//! `T` (storage type) and `D` (head size), and the generic body to call) and, for each
//! instance, emits a module named after the entry point holding `type T`, `const D`,
//! the entry function and its [`KernelSig`]:
//! - on nvptx: `#[no_mangle] pub unsafe extern "ptx-kernel" fn NAME(params)`, the PTX
//!   `.entry NAME`;
//! - on the host: `pub unsafe fn NAME(params)`, run per emulated thread inside
//!   [`crate::device::emu::launch`].
//!
//! [`KERNELS`] lists every instance in order; its parameter kinds come from the Rust
//! parameter types, and the golden test checks them against the compiled PTX.

use crate::sig::{KernelParam, KernelSig, ParamSig};

/// Why [`emulate`] did not run a kernel.
#[cfg(not(target_arch = "nvptx64"))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EmulateError {
    /// No entry point has this name.
    UnknownKernel,
    /// The arguments do not fit the entry point.
    Args(crate::sig::ArgMismatch),
}
#[allow(unused_imports)]
use half::{bf16, f16};

macro_rules! kernel_instance {
    ($name:ident, $t:ty, $d:expr, ($($arg:ident : $ty:ty),* $(,)?), $imp:expr) => {
        #[doc = concat!("Entry point `", stringify!($name), "`.")]
        #[allow(dead_code, unused_imports)]
        pub mod $name {
            use super::*;
            /// Storage type of this instance.
            pub type T = $t;
            /// Head size of this instance (0 where not applicable).
            pub const D: usize = $d;

            #[doc = concat!("`", stringify!($imp), "`.")]
            ///
            /// # Safety
            /// See the generic kernel's `# Safety` section.
            #[cfg(target_arch = "nvptx64")]
            #[no_mangle]
            pub unsafe extern "ptx-kernel" fn $name($($arg: $ty),*) {
                // SAFETY: forwarded contract of the generic kernel.
                unsafe { $imp($($arg),*) }
            }

            #[doc = concat!("`", stringify!($imp), "`, one emulated thread.")]
            ///
            /// # Safety
            /// See the generic kernel's `# Safety` section.
            #[cfg(not(target_arch = "nvptx64"))]
            pub unsafe fn $name($($arg: $ty),*) {
                // SAFETY: forwarded contract of the generic kernel.
                unsafe { $imp($($arg),*) }
            }

            /// Runs this entry point on the host emulator with arguments passed as a
            /// CUDA host would pass them (by kind, in order).
            ///
            /// # Safety
            /// As the generic kernel's `# Safety` section, with `cfg` its launch
            /// geometry and every pointer a host address valid for the kernel's accesses.
            #[cfg(not(target_arch = "nvptx64"))]
            pub unsafe fn emulate(
                cfg: crate::LaunchConfig,
                args: &[crate::sig::KernelArg],
            ) -> Result<(), crate::sig::ArgMismatch> {
                crate::sig::check_args(&SIG, args)?;
                let mut it = args.iter().copied();
                $(
                    let $arg = it
                        .next()
                        .and_then(<$ty as crate::sig::FromKernelArg>::from_arg)
                        .ok_or(crate::sig::ArgMismatch {
                            kernel: SIG.name,
                            index: 0,
                            detail: "wrong argument kind",
                        })?;
                )*
                // SAFETY: forwarded to the caller (see `# Safety`).
                unsafe { crate::device::emu::launch(cfg, || $name($($arg),*)) };
                Ok(())
            }

            /// Signature of this entry point.
            pub const SIG: KernelSig = KernelSig {
                name: stringify!($name),
                params: &[$(ParamSig { name: stringify!($arg), kind: <$ty as KernelParam>::KIND }),*],
            };
        }
    };
}

macro_rules! define_kernels {
    ($( family $args:tt => $imp:expr ; { $( $name:ident : $t:ty , $d:expr ; )* } )*) => {
        $( $( kernel_instance!($name, $t, $d, $args, $imp); )* )*
        /// Every entry point, in definition order.
        pub const KERNELS: &[KernelSig] = &[ $( $( $name::SIG, )* )* ];

        /// Runs entry point `name` on the host emulator (see each entry's `emulate`).
        ///
        /// # Safety
        /// As the named kernel's `# Safety` section, with host addresses as pointers.
        #[cfg(not(target_arch = "nvptx64"))]
        pub unsafe fn emulate(
            name: &str,
            cfg: crate::LaunchConfig,
            args: &[crate::sig::KernelArg],
        ) -> Result<(), EmulateError> {
            $( $(
                if name == stringify!($name) {
                    // SAFETY: forwarded to the caller.
                    return unsafe { $name::emulate(cfg, args) }.map_err(EmulateError::Args);
                }
            )* )*
            Err(EmulateError::UnknownKernel)
        }
    };
}

define_kernels! {
    family (out: *mut T, q: *const T, k_cache: *const T, v_cache: *const T, block_tables: *const u32,
            context_lens: *const u32, num_heads: u32, num_kv_heads: u32, scale: f32, block_size: u32,
            max_blocks_per_seq: u32, window: u32)
        => crate::decode::paged_attention_v1::<T, D>;
    {
        paged_attention_v1_f32_h16: f32, 16; paged_attention_v1_f32_h64: f32, 64; paged_attention_v1_f32_h80: f32, 80;
        paged_attention_v1_f32_h96: f32, 96; paged_attention_v1_f32_h128: f32, 128;
        paged_attention_v1_f32_h256: f32, 256;
        paged_attention_v1_f16_h16: f16, 16; paged_attention_v1_f16_h64: f16, 64; paged_attention_v1_f16_h80: f16, 80;
        paged_attention_v1_f16_h96: f16, 96; paged_attention_v1_f16_h128: f16, 128;
        paged_attention_v1_f16_h256: f16, 256;
        paged_attention_v1_bf16_h16: bf16, 16; paged_attention_v1_bf16_h64: bf16, 64; paged_attention_v1_bf16_h80: bf16, 80;
        paged_attention_v1_bf16_h96: bf16, 96; paged_attention_v1_bf16_h128: bf16, 128;
        paged_attention_v1_bf16_h256: bf16, 256;
    }
    family (tmp_out: *mut f32, max_logits: *mut f32, exp_sums: *mut f32, q: *const T, k_cache: *const T,
            v_cache: *const T, block_tables: *const u32, context_lens: *const u32, num_heads: u32,
            num_kv_heads: u32, scale: f32, block_size: u32, max_blocks_per_seq: u32, partition_size: u32,
            window: u32)
        => crate::decode::paged_attention_v2::<T, D>;
    {
        paged_attention_v2_f32_h16: f32, 16; paged_attention_v2_f32_h64: f32, 64; paged_attention_v2_f32_h80: f32, 80;
        paged_attention_v2_f32_h96: f32, 96; paged_attention_v2_f32_h128: f32, 128;
        paged_attention_v2_f32_h256: f32, 256;
        paged_attention_v2_f16_h16: f16, 16; paged_attention_v2_f16_h64: f16, 64; paged_attention_v2_f16_h80: f16, 80;
        paged_attention_v2_f16_h96: f16, 96; paged_attention_v2_f16_h128: f16, 128;
        paged_attention_v2_f16_h256: f16, 256;
        paged_attention_v2_bf16_h16: bf16, 16; paged_attention_v2_bf16_h64: bf16, 64; paged_attention_v2_bf16_h80: bf16, 80;
        paged_attention_v2_bf16_h96: bf16, 96; paged_attention_v2_bf16_h128: bf16, 128;
        paged_attention_v2_bf16_h256: bf16, 256;
    }
    family (out: *mut T, tmp_out: *const f32, max_logits: *const f32, exp_sums: *const f32,
            context_lens: *const u32, partition_size: u32, max_partitions: u32)
        => crate::attention::paged_attention_v2_reduce::<T, D>;
    {
        paged_attention_v2_reduce_f32_h16: f32, 16; paged_attention_v2_reduce_f32_h64: f32, 64; paged_attention_v2_reduce_f32_h80: f32, 80;
        paged_attention_v2_reduce_f32_h96: f32, 96; paged_attention_v2_reduce_f32_h128: f32, 128;
        paged_attention_v2_reduce_f32_h256: f32, 256;
        paged_attention_v2_reduce_f16_h16: f16, 16; paged_attention_v2_reduce_f16_h64: f16, 64; paged_attention_v2_reduce_f16_h80: f16, 80;
        paged_attention_v2_reduce_f16_h96: f16, 96; paged_attention_v2_reduce_f16_h128: f16, 128;
        paged_attention_v2_reduce_f16_h256: f16, 256;
        paged_attention_v2_reduce_bf16_h16: bf16, 16; paged_attention_v2_reduce_bf16_h64: bf16, 64; paged_attention_v2_reduce_bf16_h80: bf16, 80;
        paged_attention_v2_reduce_bf16_h96: bf16, 96; paged_attention_v2_reduce_bf16_h128: bf16, 128;
        paged_attention_v2_reduce_bf16_h256: bf16, 256;
    }
    family (out: *mut T, q: *const T, k_cache: *const T, v_cache: *const T, block_tables: *const u32,
            context_lens: *const u32, query_start_loc: *const u32, num_seqs: u32, num_kv_heads: u32, scale: f32,
            block_size: u32, max_blocks_per_seq: u32, window: u32)
        => crate::attention::prefill_attention::<T, D>;
    {
        prefill_attention_f32_h16: f32, 16; prefill_attention_f32_h64: f32, 64; prefill_attention_f32_h80: f32, 80;
        prefill_attention_f32_h96: f32, 96; prefill_attention_f32_h128: f32, 128;
        prefill_attention_f32_h256: f32, 256;
        prefill_attention_f16_h16: f16, 16; prefill_attention_f16_h64: f16, 64; prefill_attention_f16_h80: f16, 80;
        prefill_attention_f16_h96: f16, 96; prefill_attention_f16_h128: f16, 128;
        prefill_attention_f16_h256: f16, 256;
        prefill_attention_bf16_h16: bf16, 16; prefill_attention_bf16_h64: bf16, 64; prefill_attention_bf16_h80: bf16, 80;
        prefill_attention_bf16_h96: bf16, 96; prefill_attention_bf16_h128: bf16, 128;
        prefill_attention_bf16_h256: bf16, 256;
    }
    family (out: *mut T, q: *const T, k_cache: *const T, v_cache: *const T, block_tables: *const u32,
            context_lens: *const u32, query_start_loc: *const u32, num_seqs: u32, num_kv_heads: u32, scale: f32,
            block_size: u32, max_blocks_per_seq: u32, window: u32)
        => crate::prefill_mma::prefill_attention_mma::<T, D>;
    {
        prefill_attention_mma_f16_h16: f16, 16; prefill_attention_mma_f16_h64: f16, 64;
        prefill_attention_mma_f16_h80: f16, 80; prefill_attention_mma_f16_h96: f16, 96;
        prefill_attention_mma_f16_h128: f16, 128; prefill_attention_mma_f16_h256: f16, 256;
        prefill_attention_mma_bf16_h16: bf16, 16; prefill_attention_mma_bf16_h64: bf16, 64;
        prefill_attention_mma_bf16_h80: bf16, 80; prefill_attention_mma_bf16_h96: bf16, 96;
        prefill_attention_mma_bf16_h128: bf16, 128; prefill_attention_mma_bf16_h256: bf16, 256;
    }
    family (key: *const T, value: *const T, k_cache: *mut T, v_cache: *mut T, slot_mapping: *const u32,
            num_kv_heads: u32, head_dim: u32, key_stride: u32, value_stride: u32)
        => crate::cache::reshape_and_cache::<T>;
    { reshape_and_cache_f32: f32, 0; reshape_and_cache_f16: f16, 0; reshape_and_cache_bf16: bf16, 0; }
    family (positions: *const u32, query: *const T, query_out: *mut T, key: *const T, value: *const T,
            k_cache: *mut T, v_cache: *mut T, slot_mapping: *const u32, cos_sin_cache: *const f32, num_heads: u32,
            num_kv_heads: u32, head_dim: u32, rot_dim: u32, query_stride: u32, key_stride: u32,
            value_stride: u32)
        => crate::cache::rotary_embedding_and_cache::<T>;
    {
        rotary_embedding_and_cache_f32: f32, 0; rotary_embedding_and_cache_f16: f16, 0;
        rotary_embedding_and_cache_bf16: bf16, 0;
    }
    family (key_cache_ptrs: *const u64, value_cache_ptrs: *const u64, block_mapping: *const u32, numel_per_block: u32)
        => crate::cache::copy_blocks::<T>;
    { copy_blocks_f32: f32, 0; copy_blocks_f16: f16, 0; copy_blocks_bf16: bf16, 0; }
    family (out: *mut T, input: *const T, weight: *const T, eps: f32, hidden: u32)
        => crate::norm::rms_norm::<T>;
    { rms_norm_f32: f32, 0; rms_norm_f16: f16, 0; rms_norm_bf16: bf16, 0; }
    family (input: *mut T, residual: *mut T, weight: *const T, eps: f32, hidden: u32)
        => crate::norm::fused_add_rms_norm::<T>;
    { fused_add_rms_norm_f32: f32, 0; fused_add_rms_norm_f16: f16, 0; fused_add_rms_norm_bf16: bf16, 0; }
    family (x: *mut T, q_weight: *const T, k_weight: *const T, eps: f32, head_dim: u32, num_q_heads: u32,
            num_k_heads: u32, row_stride: u32)
        => crate::norm::rms_norm_heads::<T>;
    { rms_norm_heads_f32: f32, 0; rms_norm_heads_f16: f16, 0; rms_norm_heads_bf16: bf16, 0; }
    family (x: *mut T, input: *const T, weight: *const T, eps: f32, hidden: u32)
        => crate::norm::add_rms_norm::<T>;
    { add_rms_norm_f32: f32, 0; add_rms_norm_f16: f16, 0; add_rms_norm_bf16: bf16, 0; }
    family (positions: *const u32, query: *mut T, key: *mut T, cos_sin_cache: *const f32, num_heads: u32,
            num_kv_heads: u32, head_dim: u32, rot_dim: u32)
        => crate::elementwise::rotary_embedding::<T>;
    { rotary_embedding_f32: f32, 0; rotary_embedding_f16: f16, 0; rotary_embedding_bf16: bf16, 0; }
    family (out: *mut T, input: *const T, d: u32) => crate::elementwise::silu_and_mul::<T>;
    { silu_and_mul_f32: f32, 0; silu_and_mul_f16: f16, 0; silu_and_mul_bf16: bf16, 0; }
    family (out: *mut T, input: *const T, d: u32) => crate::elementwise::gelu_tanh_and_mul::<T>;
    { gelu_tanh_and_mul_f32: f32, 0; gelu_tanh_and_mul_f16: f16, 0; gelu_tanh_and_mul_bf16: bf16, 0; }
    family (x: *mut T, s: f32, width: u32) => crate::elementwise::scale_rows::<T>;
    { scale_rows_f32: f32, 0; scale_rows_f16: f16, 0; scale_rows_bf16: bf16, 0; }
    family (out: *mut T, ids: *const u32, table: *const T, hidden: u32, first: u32, rows: u32)
        => crate::elementwise::embedding::<T>;
    { embedding_f32: f32, 0; embedding_f16: f16, 0; embedding_bf16: bf16, 0; }
    family (t: *mut f32, x: *const T, a: *const T, idx: *const i32, ranks: *const u32, in_dim: u32,
            max_rank: u32)
        => crate::lora::bgmv_shrink::<T>;
    { lora_bgmv_shrink_f32: f32, 0; lora_bgmv_shrink_f16: f16, 0; lora_bgmv_shrink_bf16: bf16, 0; }
    family (y: *mut T, t: *const f32, b: *const T, idx: *const i32, ranks: *const u32, scales: *const f32,
            out_dim: u32, max_rank: u32, y_stride: u32, y_offset: u32)
        => crate::lora::bgmv_expand::<T>;
    { lora_bgmv_expand_f32: f32, 0; lora_bgmv_expand_f16: f16, 0; lora_bgmv_expand_bf16: bf16, 0; }
    family (t: *mut f32, x: *const T, a: *const T, seg_starts: *const u32, seg_idx: *const i32,
            ranks: *const u32, num_segs: u32, in_dim: u32, max_rank: u32)
        => crate::lora::sgmv_shrink::<T>;
    { lora_sgmv_shrink_f32: f32, 0; lora_sgmv_shrink_f16: f16, 0; lora_sgmv_shrink_bf16: bf16, 0; }
    family (y: *mut T, t: *const f32, b: *const T, seg_starts: *const u32, seg_idx: *const i32,
            ranks: *const u32, scales: *const f32, num_segs: u32, out_dim: u32, max_rank: u32,
            y_stride: u32, y_offset: u32)
        => crate::lora::sgmv_expand::<T>;
    { lora_sgmv_expand_f32: f32, 0; lora_sgmv_expand_f16: f16, 0; lora_sgmv_expand_bf16: bf16, 0; }
    family (out: *mut f32, logits: *const T, vocab: u32) => crate::sampling::greedy_rows::<T>;
    { greedy_rows_f32: f32, 0; }
    family (out: *mut f32, logits: *const f32, draw_rows: *const f32, counts: *mut u32,
            params: *const u32, vocab: u32, n_top: u32)
        => crate::sampling::sample_rows;
    { sample_rows_f32: f32, 0; }
    family (counts: *mut u32, fills: *const u32, pairs: *const u32, vocab: u32)
        => crate::penalty::fill_counts;
    { fill_counts: f32, 0; }
    family (out: *mut f32, logits: *mut f32, counts: *const u32, rows: *const u32, lists: *const u32,
            vocab: u32)
        => crate::penalty::penalize_rows;
    { penalize_rows: f32, 0; }
}
