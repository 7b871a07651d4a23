//! nvptx back end of the device API: PTX special registers, `bar.sync`, `shfl.sync`,
//! `atom.add.f32`, `ex2.approx`, `sqrt.rn` and 16-byte read-only loads (`ld.global.nc.v4.u32`).

use core::arch::{asm, global_asm, nvptx};

macro_rules! special_reg {
    ($($name:ident => $intr:ident;)*) => {$(
        /// PTX special register of the same name.
        #[inline(always)]
        pub fn $name() -> u32 {
            // SAFETY: reads a special register.
            unsafe { nvptx::$intr() as u32 }
        }
    )*};
}

special_reg! {
    thread_idx_x => _thread_idx_x; thread_idx_y => _thread_idx_y; thread_idx_z => _thread_idx_z;
    block_idx_x => _block_idx_x; block_idx_y => _block_idx_y; block_idx_z => _block_idx_z;
    block_dim_x => _block_dim_x; block_dim_y => _block_dim_y; block_dim_z => _block_dim_z;
    grid_dim_x => _grid_dim_x; grid_dim_y => _grid_dim_y; grid_dim_z => _grid_dim_z;
}

/// Block-wide barrier (`bar.sync 0`), also a shared-memory fence for the block.
#[inline(always)]
pub fn sync_threads() {
    // SAFETY: convergent barrier intrinsic; callers keep control flow block-uniform.
    unsafe { nvptx::_syncthreads() }
}

extern "C" {
    #[link_name = "llvm.nvvm.shfl.sync.bfly.f32"]
    fn shfl_bfly(mask: u32, v: f32, lane_mask: u32, clamp: u32) -> f32;
    #[link_name = "llvm.nvvm.shfl.sync.down.f32"]
    fn shfl_down(mask: u32, v: f32, delta: u32, clamp: u32) -> f32;
}

/// Butterfly shuffle: the value of lane `lane ^ mask` (full warp).
#[inline(always)]
pub fn shfl_xor_f32(v: f32, mask: u32) -> f32 {
    // SAFETY: convergent warp intrinsic over the full warp.
    unsafe { shfl_bfly(0xffff_ffff, v, mask, 0x1f) }
}

/// Shuffle down: the value of lane `lane + delta`, or `v` past the warp end.
#[inline(always)]
pub fn shfl_down_f32(v: f32, delta: u32) -> f32 {
    // SAFETY: convergent warp intrinsic over the full warp.
    unsafe { shfl_down(0xffff_ffff, v, delta, 0x1f) }
}

global_asm!(".extern .shared .align 16 .b8 __gk_dyn_smem[];");

/// Base of the dynamic shared memory of the block (size given at launch).
#[inline(always)]
pub fn dynamic_shared_mem() -> *mut u8 {
    let p: u64;
    // SAFETY: takes the generic address of the dynamic shared window; no access.
    unsafe { asm!("cvta.shared.u64 {p}, __gk_dyn_smem;", p = out(reg64) p) };
    p as usize as *mut u8
}

/// `atomicAdd` on an `f32` in global or shared memory; returns the old value.
///
/// # Safety
/// `p` must be valid, aligned and only accessed atomically by concurrent threads.
#[inline(always)]
pub unsafe fn atomic_add_f32(p: *mut f32, v: f32) -> f32 {
    let old: f32;
    // SAFETY: the caller guarantees `p` is valid and aligned.
    unsafe {
        asm!("atom.add.f32 {o}, [{p}], {v};", o = out(reg32) old, p = in(reg64) p, v = in(reg32) v)
    };
    old
}

/// `e^x` via `ex2.approx.ftz.f32` (about 2 ulp).
#[inline(always)]
pub fn exp_fast(x: f32) -> f32 {
    let y = x * core::f32::consts::LOG2_E;
    let r: f32;
    // SAFETY: pure arithmetic instruction.
    unsafe { asm!("ex2.approx.ftz.f32 {r}, {y};", r = out(reg32) r, y = in(reg32) y) };
    r
}

/// `2^x` via `ex2.approx.ftz.f32` (about 2 ulp).
#[inline(always)]
pub fn exp2_fast(x: f32) -> f32 {
    let r: f32;
    // SAFETY: pure arithmetic instruction.
    unsafe { asm!("ex2.approx.ftz.f32 {r}, {x};", r = out(reg32) r, x = in(reg32) x) };
    r
}

/// Correctly rounded square root (`sqrt.rn.f32`).
#[inline(always)]
pub fn sqrt(x: f32) -> f32 {
    let r: f32;
    // SAFETY: pure arithmetic instruction.
    unsafe { asm!("sqrt.rn.f32 {r}, {x};", r = out(reg32) r, x = in(reg32) x) };
    r
}

/// One 16-byte load through the read-only path: `ld.global.nc.v4.u32` on the global
/// address of `p` (`cvta.to.global.u64` first, as nvcc does).
///
/// # Safety
/// `p` is a 16-byte aligned address of global memory that no thread writes during the
/// kernel.
#[inline(always)]
pub unsafe fn ld_global_nc_v4(p: *const u32) -> [u32; 4] {
    let (a, b, c, d): (u32, u32, u32, u32);
    // SAFETY: the caller guarantees an aligned, read-only global address.
    unsafe {
        asm!(
            "{{ .reg .u64 g; cvta.to.global.u64 g, {p}; ld.global.nc.v4.u32 {{{a}, {b}, {c}, {d}}}, [g]; }}",
            p = in(reg64) p,
            a = out(reg32) a,
            b = out(reg32) b,
            c = out(reg32) c,
            d = out(reg32) d,
            options(pure, readonly, nostack),
        )
    };
    [a, b, c, d]
}

/// One 16-byte load of global memory that the kernel may also write (`ld.global.v4.u32`).
///
/// # Safety
/// `p` is a 16-byte aligned global address, not written concurrently by another thread.
#[inline(always)]
pub unsafe fn ld_global_v4(p: *const u32) -> [u32; 4] {
    let (a, b, c, d): (u32, u32, u32, u32);
    // SAFETY: the caller guarantees an aligned global address.
    unsafe {
        asm!(
            "{{ .reg .u64 g; cvta.to.global.u64 g, {p}; ld.global.v4.u32 {{{a}, {b}, {c}, {d}}}, [g]; }}",
            p = in(reg64) p,
            a = out(reg32) a,
            b = out(reg32) b,
            c = out(reg32) c,
            d = out(reg32) d,
            options(readonly, nostack),
        )
    };
    [a, b, c, d]
}

/// One 16-byte store to global memory (`st.global.v4.u32`).
///
/// # Safety
/// `p` is a 16-byte aligned global address no other thread accesses concurrently.
#[inline(always)]
pub unsafe fn st_global_v4(p: *mut u32, w: [u32; 4]) {
    // SAFETY: the caller guarantees an aligned global address owned by this thread.
    unsafe {
        asm!(
            "{{ .reg .u64 g; cvta.to.global.u64 g, {p}; st.global.v4.u32 [g], {{{a}, {b}, {c}, {d}}}; }}",
            p = in(reg64) p,
            a = in(reg32) w[0],
            b = in(reg32) w[1],
            c = in(reg32) w[2],
            d = in(reg32) w[3],
            options(nostack),
        )
    };
}

/// One 16-byte store to shared memory (`st.shared.v4.u32` on the shared address of `p`).
///
/// # Safety
/// `p` is a 16-byte aligned address of shared memory no other thread accesses
/// concurrently.
#[inline(always)]
pub unsafe fn st_shared_v4(p: *mut u32, w: [u32; 4]) {
    // SAFETY: the caller guarantees an aligned shared address owned by this thread.
    unsafe {
        asm!(
            "{{ .reg .u64 s; cvta.to.shared.u64 s, {p}; st.shared.v4.u32 [s], {{{a}, {b}, {c}, {d}}}; }}",
            p = in(reg64) p,
            a = in(reg32) w[0],
            b = in(reg32) w[1],
            c = in(reg32) w[2],
            d = in(reg32) w[3],
            options(nostack),
        )
    };
}

/// One 16-byte load from shared memory (`ld.shared.v4.u32` on the shared address of
/// `p`).
///
/// # Safety
/// `p` is a 16-byte aligned address of shared memory not written concurrently.
#[inline(always)]
pub unsafe fn ld_shared_v4(p: *const u32) -> [u32; 4] {
    let (a, b, c, d): (u32, u32, u32, u32);
    // SAFETY: the caller guarantees an aligned shared address.
    unsafe {
        asm!(
            "{{ .reg .u64 s; cvta.to.shared.u64 s, {p}; ld.shared.v4.u32 {{{a}, {b}, {c}, {d}}}, [s]; }}",
            p = in(reg64) p,
            a = out(reg32) a,
            b = out(reg32) b,
            c = out(reg32) c,
            d = out(reg32) d,
            options(readonly, nostack),
        )
    };
    [a, b, c, d]
}

macro_rules! mma_m16n8k16 {
    ($name:ident, $ty:literal) => {
        #[doc = concat!("`mma.sync.aligned.m16n8k16.row.col.f32.", $ty, ".", $ty, ".f32` for the warp (fragment")]
        /// layout: see the emulator's `mma_m16n8k16`). Every lane of the warp must call it.
        #[inline(always)]
        pub fn $name(a: [u32; 4], b: [u32; 2], c: [f32; 4]) -> [f32; 4] {
            let d: [f32; 4];
            let (d0, d1, d2, d3): (f32, f32, f32, f32);
            // SAFETY: register-only warp instruction (sm_80+), executed by the full warp.
            unsafe {
                asm!(
                    concat!(
                        "mma.sync.aligned.m16n8k16.row.col.f32.", $ty, ".", $ty, ".f32 ",
                        "{{{d0}, {d1}, {d2}, {d3}}}, {{{a0}, {a1}, {a2}, {a3}}}, {{{b0}, {b1}}}, ",
                        "{{{c0}, {c1}, {c2}, {c3}}};"
                    ),
                    d0 = out(reg32) d0, d1 = out(reg32) d1, d2 = out(reg32) d2, d3 = out(reg32) d3,
                    a0 = in(reg32) a[0], a1 = in(reg32) a[1], a2 = in(reg32) a[2], a3 = in(reg32) a[3],
                    b0 = in(reg32) b[0], b1 = in(reg32) b[1],
                    c0 = in(reg32) c[0], c1 = in(reg32) c[1], c2 = in(reg32) c[2], c3 = in(reg32) c[3],
                    options(pure, nomem, nostack),
                )
            };
            d = [d0, d1, d2, d3];
            d
        }
    };
}

mma_m16n8k16!(mma_bf16_m16n8k16, "bf16");
mma_m16n8k16!(mma_f16_m16n8k16, "f16");

/// A 32-bit address in the block's shared-memory window (what `ldmatrix` takes).
#[derive(Clone, Copy)]
pub struct SmemAddr(u32);

impl SmemAddr {
    /// The shared-window address of the generic pointer `p` (`cvta.to.shared`, 32 bits).
    #[inline(always)]
    pub fn of<T>(p: *const T) -> Self {
        let a: u32;
        // SAFETY: address conversion only, no access.
        unsafe {
            asm!(
                "{{ .reg .u64 t; cvta.to.shared.u64 t, {p}; cvt.u32.u64 {a}, t; }}",
                a = out(reg32) a,
                p = in(reg64) p,
                options(pure, nomem, nostack)
            )
        };
        Self(a)
    }
    /// `bytes` further on.
    #[inline(always)]
    pub fn offset(self, bytes: usize) -> Self {
        Self(self.0.wrapping_add(bytes as u32))
    }
    /// The same address through an opaque move, so that the compiler does not hoist the
    /// addresses derived from it out of the enclosing loop (they would stay live in
    /// registers across it).
    #[inline(always)]
    pub fn opaque(self) -> Self {
        let a: u32;
        // SAFETY: a register move.
        unsafe {
            asm!("mov.u32 {a}, {b};", a = out(reg32) a, b = in(reg32) self.0, options(nomem, nostack))
        };
        Self(a)
    }
}

macro_rules! ldmatrix_x4 {
    ($name:ident, $trans:literal) => {
        #[doc = concat!("`ldmatrix.sync.aligned.m8n8.x4", $trans, ".shared.b16` (layout: see the emulator's")]
        /// `ldmatrix_x4`). Every lane of the warp must call it.
        ///
        /// # Safety
        /// Every lane's `row` is a 16-byte aligned address of 16 bytes of shared memory not
        /// written concurrently.
        #[inline(always)]
        pub unsafe fn $name(row: SmemAddr) -> [u32; 4] {
            let (a, b, c, d): (u32, u32, u32, u32);
            // SAFETY: the caller guarantees aligned shared rows.
            unsafe {
                asm!(
                    concat!("ldmatrix.sync.aligned.m8n8.x4", $trans, ".shared.b16 {{{a}, {b}, {c}, {d}}}, [{p}];"),
                    p = in(reg32) row.0,
                    a = out(reg32) a,
                    b = out(reg32) b,
                    c = out(reg32) c,
                    d = out(reg32) d,
                    options(readonly, nostack),
                )
            };
            [a, b, c, d]
        }
    };
}

ldmatrix_x4!(ldmatrix_x4_b16, "");
ldmatrix_x4!(ldmatrix_x4_trans_b16, ".trans");

/// Asynchronous 16-byte copy from global to shared memory, bypassing registers and L1
/// (`cp.async.cg.shared.global`, sm_80+). Complete it with [`cp_async_wait_all`] (then
/// `sync_threads` before other threads read it).
///
/// # Safety
/// `dst` is 16 bytes of shared memory and `src` 16 bytes of global memory, both 16-byte
/// aligned, neither accessed by other threads until the copy is waited for.
#[inline(always)]
pub unsafe fn cp_async_16(dst: SmemAddr, src: *const u32) {
    // SAFETY: the caller guarantees aligned shared and global addresses.
    unsafe {
        asm!(
            "{{ .reg .u64 g; cvta.to.global.u64 g, {src}; cp.async.cg.shared.global [{dst}], [g], 16; }}",
            dst = in(reg32) dst.0,
            src = in(reg64) src,
            options(nostack),
        )
    };
}

/// Waits for every `cp.async` of this thread (`cp.async.wait_all`).
#[inline(always)]
pub fn cp_async_wait_all() {
    // SAFETY: waits for this thread's own asynchronous copies.
    unsafe { asm!("cp.async.wait_all;", options(nostack)) };
}

/// Closes this thread's pending `cp.async` copies into a group (`cp.async.commit_group`).
#[inline(always)]
pub fn cp_async_commit() {
    // SAFETY: bookkeeping of this thread's own asynchronous copies.
    unsafe { asm!("cp.async.commit_group;", options(nostack)) };
}

/// Waits until at most one committed group of this thread's `cp.async` copies is still
/// pending (`cp.async.wait_group 1`): all but the latest group are complete.
#[inline(always)]
pub fn cp_async_wait_group_1() {
    // SAFETY: waits for this thread's own asynchronous copies.
    unsafe { asm!("cp.async.wait_group 1;", options(nostack)) };
}
