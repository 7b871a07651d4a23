//! The device API, with the shape of `cuda_std`: thread/block/grid indices,
//! `sync_threads`, warp shuffles, shared memory (static through [`shared_array!`] and
//! dynamic through [`dynamic_shared_mem`]), `f32` atomics and fast math, and
//! the warp-wide tensor-core instructions (`mma.sync` m16n8k16 bf16/f16, `ldmatrix`).
//!
//! On `nvptx64` every function lowers to one or a few PTX instructions ([`ptx`]); on
//! the host the same names are served by the emulator ([`emu`]), which runs each GPU
//! thread of a block as an OS thread. Kernels are written once against this module.
//!
//! Contract shared by both back ends: `sync_threads` must be reached by every thread of
//! the block; warp shuffles, `mma` and `ldmatrix` must be executed by every thread of the warp (full mask).

#[cfg(not(target_arch = "nvptx64"))]
pub mod emu;
#[cfg(not(target_arch = "nvptx64"))]
pub use emu::{
    atomic_add_f32, block_dim_x, block_dim_y, block_dim_z, block_idx_x, block_idx_y, block_idx_z,
    cp_async_16, cp_async_commit, cp_async_wait_all, cp_async_wait_group_1, dynamic_shared_mem,
    exp2_fast, exp_fast, grid_dim_x, grid_dim_y, grid_dim_z, ld_global_nc_v4, ld_global_v4,
    ld_shared_v4, ldmatrix_x4_b16, ldmatrix_x4_trans_b16, mma_bf16_m16n8k16, mma_f16_m16n8k16,
    shfl_down_f32, shfl_xor_f32, sqrt, st_global_v4, st_shared_v4, sync_threads, thread_idx_x,
    thread_idx_y, thread_idx_z, SmemAddr,
};

#[cfg(target_arch = "nvptx64")]
pub mod ptx;
#[cfg(target_arch = "nvptx64")]
pub use ptx::{
    atomic_add_f32, block_dim_x, block_dim_y, block_dim_z, block_idx_x, block_idx_y, block_idx_z,
    cp_async_16, cp_async_commit, cp_async_wait_all, cp_async_wait_group_1, dynamic_shared_mem,
    exp2_fast, exp_fast, grid_dim_x, grid_dim_y, grid_dim_z, ld_global_nc_v4, ld_global_v4,
    ld_shared_v4, ldmatrix_x4_b16, ldmatrix_x4_trans_b16, mma_bf16_m16n8k16, mma_f16_m16n8k16,
    shfl_down_f32, shfl_xor_f32, sqrt, st_global_v4, st_shared_v4, sync_threads, thread_idx_x,
    thread_idx_y, thread_idx_z, SmemAddr,
};

/// `mma.sync.aligned.m16n8k16.row.col.f32.{T}.{T}.f32` for a 16-bit storage type `T`
/// (bf16 or f16): `D = A B + C` over the warp, in the PTX ISA fragment layout (see
/// `emu::mma_bf16_m16n8k16`). Every lane of the warp must call it.
#[inline(always)]
pub fn mma_m16n8k16<T: crate::Storage>(a: [u32; 4], b: [u32; 2], c: [f32; 4]) -> [f32; 4] {
    if T::BF16 {
        mma_bf16_m16n8k16(a, b, c)
    } else {
        mma_f16_m16n8k16(a, b, c)
    }
}

/// Threads per warp.
pub const WARP_SIZE: u32 = 32;

/// Lane of the calling thread within its warp (1-D blocks).
#[inline(always)]
pub fn lane_id() -> u32 {
    thread_idx_x() % WARP_SIZE
}

/// Warp of the calling thread within its block (1-D blocks).
#[inline(always)]
pub fn warp_id() -> u32 {
    thread_idx_x() / WARP_SIZE
}

/// A statically sized shared-memory array, one per thread block:
/// `let p: *mut f32 = shared_array!(NAME: [f32; 32]);`
///
/// `NAME` must be unique in the crate (it is the PTX symbol) and the length a constant
/// that does not depend on generic parameters. On nvptx the array is declared with
/// `global_asm!(".shared ...")` and its generic address taken with `cvta.shared.u64`;
/// on the host the emulator hands out a per-block buffer keyed by the call site.
/// The contents are uninitialised at block start (the emulator fills them with NaN bytes).
#[macro_export]
macro_rules! shared_array {
    ($name:ident : [$t:ty; $n:expr]) => {{
        #[cfg(target_arch = "nvptx64")]
        let p = {
            core::arch::global_asm!(
                concat!(".shared .align 16 .b8 ", stringify!($name), "[{size}];"),
                size = const ($n * core::mem::size_of::<$t>()),
            );
            let p: u64;
            // SAFETY: takes the generic address of a shared variable; no memory access.
            unsafe {
                core::arch::asm!(
                    concat!("cvta.shared.u64 {p}, ", stringify!($name), ";"),
                    p = out(reg64) p,
                )
            };
            p as usize as *mut $t
        };
        #[cfg(not(target_arch = "nvptx64"))]
        let p = {
            #[allow(non_upper_case_globals)]
            static $name: u8 = 0;
            $crate::device::emu::static_shared(
                core::ptr::addr_of!($name) as usize,
                $n * core::mem::size_of::<$t>(),
            ) as *mut $t
        };
        p
    }};
}
