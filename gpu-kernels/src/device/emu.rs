//! Host emulator of the device API.
//!
//! [`launch`] runs a kernel over a grid: it spawns one OS thread per GPU thread of a
//! block (`std::thread::scope`) and those threads walk the blocks of the grid in order,
//! so blocks run one after another and the threads of a block run concurrently, as on a
//! GPU. Per launch:
//! - `sync_threads` is a block-wide barrier;
//! - a warp shuffle writes the lane's value to a per-warp exchange buffer, waits on a
//!   per-warp barrier, reads the source lane, and waits again;
//! - shared memory (static, keyed by call site, and dynamic, sized by the launch) is one
//!   buffer per block, refilled with `0xff` bytes (NaN for floats) between blocks so that
//!   reads of unwritten shared memory show up;
//! - indices are thread-local.
//!
//! Barriers poll a launch-wide failure flag, so a panic in one emulated thread ends the
//! whole launch (the panic is re-raised by [`launch`]) instead of hanging; a barrier not
//! completed within [`BARRIER_TIMEOUT`] (a kernel that skips `sync_threads` on some
//! threads) panics too. Cost: a barrier is O(threads) context switches, so the emulator
//! is for correctness at small shapes, not for speed.

use std::boxed::Box;
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};
use std::vec::Vec;

use crate::launch::{Dim3, LaunchConfig};

/// A barrier not completed within this time is reported as a deadlock.
pub const BARRIER_TIMEOUT: Duration = Duration::from_secs(60);
const POLL: Duration = Duration::from_millis(50);
const POISON_BYTE: u8 = 0xff;

/// Reusable barrier that gives up when the launch has failed.
struct Barrier {
    n: usize,
    state: Mutex<(usize, u64)>,
    cv: Condvar,
}

impl Barrier {
    fn new(n: usize) -> Self {
        Self {
            n,
            state: Mutex::new((0, 0)),
            cv: Condvar::new(),
        }
    }

    fn wait(&self, failed: &AtomicBool) {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        st.0 += 1;
        if st.0 == self.n {
            st.0 = 0;
            st.1 = st.1.wrapping_add(1);
            self.cv.notify_all();
            return;
        }
        let gen = st.1;
        let start = Instant::now();
        while st.1 == gen {
            if failed.load(Ordering::Relaxed) {
                drop(st);
                panic!("emulated kernel aborted: another thread of the launch panicked");
            }
            if start.elapsed() > BARRIER_TIMEOUT {
                failed.store(true, Ordering::Relaxed);
                drop(st);
                panic!("emulated kernel deadlock: a barrier was not reached by every thread");
            }
            st = self
                .cv
                .wait_timeout(st, POLL)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

/// One warp's shuffle exchange.
struct Warp {
    lanes: u32,
    barrier: Barrier,
    slots: [AtomicU32; 32],
    /// Per-lane words of the warp-wide matrix instructions (`mma`, `ldmatrix`).
    wide: [[AtomicU32; WIDE]; 32],
}

/// Words one lane hands to a warp-wide matrix instruction at most (mma: 4 + 2 + 4).
const WIDE: usize = 10;

/// A shared-memory buffer, 16-byte aligned.
struct SharedBuf {
    words: Box<[AtomicU32]>,
}

impl SharedBuf {
    fn new(bytes: usize) -> Self {
        let words = bytes.div_ceil(16) * 4;
        let mut v = Vec::with_capacity(words.max(4));
        v.resize_with(words.max(4), || {
            AtomicU32::new(u32::from_ne_bytes([POISON_BYTE; 4]))
        });
        let words = v.into_boxed_slice();
        Self { words }
    }
    fn ptr(&self) -> *mut u8 {
        self.words.as_ptr() as *mut u8
    }
    fn poison(&self) {
        for w in self.words.iter() {
            w.store(u32::from_ne_bytes([POISON_BYTE; 4]), Ordering::Relaxed);
        }
    }
}

struct Launch {
    grid: Dim3,
    block: Dim3,
    failed: AtomicBool,
    block_barrier: Barrier,
    warps: Vec<Warp>,
    dynamic: SharedBuf,
    statics: Mutex<Vec<(usize, SharedBuf)>>,
}

#[derive(Clone, Copy)]
struct Ctx {
    launch: *const Launch,
    tid: Dim3,
    bid: Dim3,
    linear: u32,
}

std::thread_local! {
    static CTX: Cell<Option<Ctx>> = const { Cell::new(None) };
}

fn ctx() -> Ctx {
    match CTX.with(Cell::get) {
        Some(c) => c,
        None => panic!("device function called outside an emulated kernel launch"),
    }
}

fn launch_ref<'a>(c: &Ctx) -> &'a Launch {
    // SAFETY: `launch` sets the context only on threads of its own scope, and the
    // `Launch` outlives that scope.
    unsafe { &*c.launch }
}

/// Clears the thread's context when the kernel thread ends, and flags the launch as
/// failed if it ends by panicking.
struct Guard<'a>(&'a Launch);

impl Drop for Guard<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.failed.store(true, Ordering::Relaxed);
        }
        CTX.with(|c| c.set(None));
    }
}

/// Wrapper asserting the kernel closure may be shared between emulated threads.
struct AssertSync<F>(F);
// SAFETY: `launch`'s contract makes the caller responsible for the closure's captured
// pointers being used data-race free, exactly as on a GPU.
unsafe impl<F> Sync for AssertSync<F> {}

/// Runs `kernel` once per GPU thread over `cfg.grid` x `cfg.block`.
///
/// Panics if the configuration is empty or has more than 1024 threads per block, or if
/// any emulated thread panics or deadlocks.
///
/// # Safety
/// Same as launching the kernel on a GPU: every pointer the closure captures must be
/// valid for the accesses the kernel makes, and concurrent threads must not race (other
/// than through [`atomic_add_f32`]). `cfg.shared_mem_bytes` must cover the kernel's
/// dynamic shared memory use.
pub unsafe fn launch<F: Fn()>(cfg: LaunchConfig, kernel: F) {
    let threads = cfg.block.count();
    assert!(threads > 0 && threads <= 1024, "block of {threads} threads");
    assert!(cfg.grid.count() > 0, "empty grid");
    let warps = (0..threads.div_ceil(32))
        .map(|w| {
            let lanes = (threads - w * 32).min(32) as u32;
            Warp {
                lanes,
                barrier: Barrier::new(lanes as usize),
                slots: std::array::from_fn(|_| AtomicU32::new(0)),
                wide: std::array::from_fn(|_| std::array::from_fn(|_| AtomicU32::new(0))),
            }
        })
        .collect();
    let l = Launch {
        grid: cfg.grid,
        block: cfg.block,
        failed: AtomicBool::new(false),
        block_barrier: Barrier::new(threads),
        warps,
        dynamic: SharedBuf::new(cfg.shared_mem_bytes as usize),
        statics: Mutex::new(Vec::new()),
    };
    let kernel = AssertSync(kernel);
    let (l, kernel) = (&l, &kernel);
    std::thread::scope(|s| {
        for linear in 0..threads as u32 {
            let tid = cfg.block.unflatten(linear);
            let spawned = std::thread::Builder::new()
                .stack_size(1 << 20)
                .spawn_scoped(s, move || run_thread(l, &kernel.0, tid, linear));
            if let Err(e) = spawned {
                l.failed.store(true, Ordering::Relaxed);
                panic!("cannot spawn emulated thread: {e}");
            }
        }
    });
}

fn run_thread(l: &Launch, kernel: &dyn Fn(), tid: Dim3, linear: u32) {
    let _guard = Guard(l);
    for b in 0..l.grid.count() as u32 {
        let bid = l.grid.unflatten(b);
        CTX.with(|c| {
            c.set(Some(Ctx {
                launch: l,
                tid,
                bid,
                linear,
            }))
        });
        kernel();
        l.block_barrier.wait(&l.failed);
        if linear == 0 {
            l.dynamic.poison();
            let statics = l.statics.lock().unwrap_or_else(|e| e.into_inner());
            statics.iter().for_each(|(_, b)| b.poison());
        }
        l.block_barrier.wait(&l.failed);
    }
}

macro_rules! index_fns {
    ($($name:ident => $field:ident . $c:ident;)*) => {$(
        /// Emulated special register of the same name.
        pub fn $name() -> u32 {
            let c = ctx();
            index_fns!(@get c, $field, $c)
        }
    )*};
    (@get $c:ident, tid, $x:ident) => { $c.tid.$x };
    (@get $c:ident, bid, $x:ident) => { $c.bid.$x };
    (@get $c:ident, bdim, $x:ident) => { launch_ref(&$c).block.$x };
    (@get $c:ident, gdim, $x:ident) => { launch_ref(&$c).grid.$x };
}

index_fns! {
    thread_idx_x => tid.x; thread_idx_y => tid.y; thread_idx_z => tid.z;
    block_idx_x => bid.x; block_idx_y => bid.y; block_idx_z => bid.z;
    block_dim_x => bdim.x; block_dim_y => bdim.y; block_dim_z => bdim.z;
    grid_dim_x => gdim.x; grid_dim_y => gdim.y; grid_dim_z => gdim.z;
}

/// Block-wide barrier.
pub fn sync_threads() {
    let c = ctx();
    let l = launch_ref(&c);
    l.block_barrier.wait(&l.failed);
}

fn shuffle(v: f32, src: impl Fn(u32) -> u32) -> f32 {
    let c = ctx();
    let l = launch_ref(&c);
    let w = &l.warps[(c.linear / 32) as usize];
    let lane = c.linear % 32;
    w.slots[lane as usize].store(v.to_bits(), Ordering::Relaxed);
    w.barrier.wait(&l.failed);
    let s = src(lane);
    let r = if s < w.lanes {
        f32::from_bits(w.slots[s as usize].load(Ordering::Relaxed))
    } else {
        v
    };
    w.barrier.wait(&l.failed);
    r
}

/// Butterfly shuffle: the value of lane `lane ^ mask`.
pub fn shfl_xor_f32(v: f32, mask: u32) -> f32 {
    shuffle(v, |lane| lane ^ mask)
}

/// Shuffle down: the value of lane `lane + delta`, or `v` past the warp end.
pub fn shfl_down_f32(v: f32, delta: u32) -> f32 {
    shuffle(v, |lane| lane + delta)
}

/// Every lane of the warp hands in `N` words; once all have, `f` reads word `i` of lane
/// `l` as `get(l, i)` and computes this lane's result. A full warp is required.
fn warp_exchange<const N: usize, R>(
    words: [u32; N],
    f: impl FnOnce(u32, &dyn Fn(u32, usize) -> u32) -> R,
) -> R {
    const { assert!(N <= WIDE) };
    let c = ctx();
    let l = launch_ref(&c);
    let w = &l.warps[(c.linear / 32) as usize];
    assert_eq!(
        w.lanes, 32,
        "warp-wide matrix instructions need a full warp"
    );
    let lane = c.linear % 32;
    for (slot, v) in w.wide[lane as usize].iter().zip(words) {
        slot.store(v, Ordering::Relaxed);
    }
    w.barrier.wait(&l.failed);
    let get = |src: u32, i: usize| w.wide[src as usize][i].load(Ordering::Relaxed);
    let r = f(lane, &get);
    w.barrier.wait(&l.failed);
    r
}

/// `mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32` for the whole warp:
/// `D = A B + C`, A 16x16, B 16x8, C and D 16x8 in `f32`, in the PTX ISA fragment layout
/// (`g = lane / 4`, `t = lane % 4`; each `u32` holds two elements, the lower index in
/// the low half):
/// - A: `a[0]` = row g, cols 2t..2t+1; `a[1]` = row g+8, same cols; `a[2]` = row g,
///   cols 2t+8..2t+9; `a[3]` = row g+8, cols 2t+8..2t+9;
/// - B: `b[0]` = rows (k) 2t..2t+1 of col (n) g; `b[1]` = rows 2t+8..2t+9 of col g;
/// - C, D: `c[0..2]` = row g, cols 2t, 2t+1; `c[2..4]` = row g+8, cols 2t, 2t+1.
///
/// Products of two 16-bit floats are exact in `f32`; the 16 products are summed onto C
/// in `f32` in k order. `widen` turns a 16-bit pattern into its `f32` value.
fn mma_m16n8k16(a: [u32; 4], b: [u32; 2], c: [f32; 4], widen: fn(u16) -> f32) -> [f32; 4] {
    let mut words = [0u32; 10];
    words[..4].copy_from_slice(&a);
    words[4..6].copy_from_slice(&b);
    for (w, v) in words[6..].iter_mut().zip(c) {
        *w = v.to_bits();
    }
    warp_exchange(words, |lane, get| {
        let half = |word: u32, hi: bool| widen(if hi { (word >> 16) as u16 } else { word as u16 });
        // Element (row, k) of A and (k, col) of B, fetched from the lane that holds it.
        let a_at = |row: u32, k: u32| {
            let (g, hi8) = (row % 8, row >= 8);
            let (t, khi) = ((k % 8) / 2, k >= 8);
            let reg = hi8 as usize + 2 * khi as usize;
            half(get(g * 4 + t, reg), k % 2 == 1)
        };
        let b_at = |k: u32, col: u32| {
            let (t, khi) = ((k % 8) / 2, k >= 8);
            half(get(col * 4 + t, 4 + khi as usize), k % 2 == 1)
        };
        let (g, t) = (lane / 4, lane % 4);
        let mut d = c;
        for (i, acc) in d.iter_mut().enumerate() {
            let row = g + 8 * (i as u32 / 2);
            let col = 2 * t + i as u32 % 2;
            for k in 0..16 {
                *acc += a_at(row, k) * b_at(k, col);
            }
        }
        d
    })
}

/// `mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32` (layout: see [`mma_m16n8k16`]).
pub fn mma_bf16_m16n8k16(a: [u32; 4], b: [u32; 2], c: [f32; 4]) -> [f32; 4] {
    mma_m16n8k16(a, b, c, |h| f32::from_bits((h as u32) << 16))
}

/// `mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32` (layout: see [`mma_m16n8k16`]).
pub fn mma_f16_m16n8k16(a: [u32; 4], b: [u32; 2], c: [f32; 4]) -> [f32; 4] {
    mma_m16n8k16(a, b, c, |h| half::f16::from_bits(h).to_f32())
}

/// An address in the block's shared memory (on the host: the pointer itself).
#[derive(Clone, Copy)]
pub struct SmemAddr(usize);

impl SmemAddr {
    /// The shared-memory address of `p`.
    pub fn of<T>(p: *const T) -> Self {
        Self(p as usize)
    }
    /// `bytes` further on.
    pub fn offset(self, bytes: usize) -> Self {
        Self(self.0 + bytes)
    }
    /// The same address (on the device: through an opaque move against loop hoisting).
    pub fn opaque(self) -> Self {
        self
    }
}

/// `ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16`: lane `l` gives the address of row
/// `l % 8` of 8x8 matrix `l / 8` (16 bytes, 16-byte aligned); result word `i` is this
/// lane's fragment of matrix `i`: row `lane / 4`, cols `2 (lane % 4)..+1`, or with
/// `trans` col `lane / 4`, rows `2 (lane % 4)..+1` (lower index in the low half).
///
/// # Safety
/// Every lane's `row` points to 16 readable bytes of shared memory not written
/// concurrently.
unsafe fn ldmatrix_x4(row: SmemAddr, trans: bool) -> [u32; 4] {
    let p = row.0 as u64;
    warp_exchange([p as u32, (p >> 32) as u32], |lane, get| {
        let row_ptr = |m: u32, r: u32| {
            let src = m * 8 + r;
            (get(src, 0) as u64 | (get(src, 1) as u64) << 32) as usize as *const u16
        };
        // SAFETY: the caller guarantees each lane's row is 16 readable bytes.
        let at = |m: u32, r: u32, c: u32| unsafe { row_ptr(m, r).add(c as usize).read_unaligned() }
            as u32;
        let (g, t) = (lane / 4, lane % 4);
        std::array::from_fn(|m| {
            let m = m as u32;
            if trans {
                at(m, 2 * t, g) | at(m, 2 * t + 1, g) << 16
            } else {
                at(m, g, 2 * t) | at(m, g, 2 * t + 1) << 16
            }
        })
    })
}

/// `ldmatrix.sync.aligned.m8n8.x4.shared.b16` (see [`ldmatrix_x4`] for the layout).
///
/// # Safety
/// Every lane's `row` points to 16 bytes of shared memory not written concurrently.
pub unsafe fn ldmatrix_x4_b16(row: SmemAddr) -> [u32; 4] {
    // SAFETY: forwarded.
    unsafe { ldmatrix_x4(row, false) }
}

/// `ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16` (see [`ldmatrix_x4`]).
///
/// # Safety
/// Every lane's `row` points to 16 bytes of shared memory not written concurrently.
pub unsafe fn ldmatrix_x4_trans_b16(row: SmemAddr) -> [u32; 4] {
    // SAFETY: forwarded.
    unsafe { ldmatrix_x4(row, true) }
}

/// Base of the block's dynamic shared memory.
pub fn dynamic_shared_mem() -> *mut u8 {
    launch_ref(&ctx()).dynamic.ptr()
}

/// The block's static shared buffer for call site `key` (see [`crate::shared_array!`]).
pub fn static_shared(key: usize, bytes: usize) -> *mut u8 {
    let l = launch_ref(&ctx());
    let mut statics = l.statics.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, b)) = statics.iter().find(|(k, _)| *k == key) {
        return b.ptr();
    }
    let b = SharedBuf::new(bytes);
    let p = b.ptr();
    statics.push((key, b));
    p
}

/// `atomicAdd` on an `f32`; returns the old value.
///
/// # Safety
/// `p` must be valid, 4-byte aligned, and only accessed atomically by concurrent threads.
pub unsafe fn atomic_add_f32(p: *mut f32, v: f32) -> f32 {
    // SAFETY: the caller guarantees `p` is valid and aligned; `AtomicU32` has the same
    // size and alignment as `f32`.
    let a = unsafe { AtomicU32::from_ptr(p.cast::<u32>()) };
    let mut cur = a.load(Ordering::Relaxed);
    loop {
        let new = (f32::from_bits(cur) + v).to_bits();
        match a.compare_exchange_weak(cur, new, Ordering::AcqRel, Ordering::Relaxed) {
            Ok(_) => return f32::from_bits(cur),
            Err(c) => cur = c,
        }
    }
}

/// `e^x`, computed as on the device: `2^(x * log2 e)`.
pub fn exp_fast(x: f32) -> f32 {
    (x * core::f32::consts::LOG2_E).exp2()
}

/// `2^x`.
pub fn exp2_fast(x: f32) -> f32 {
    x.exp2()
}

/// Square root.
pub fn sqrt(x: f32) -> f32 {
    x.sqrt()
}

/// A 16-byte load (`ld.global.nc.v4.u32` on the device).
///
/// # Safety
/// `p` is valid for 16 bytes of reads that no thread writes during the launch. The device
/// also needs 16-byte alignment; the emulator reads unaligned so host test buffers
/// (`Vec<bf16>`) need not be over-aligned, and kernels keep offsets multiples of 16 bytes.
pub unsafe fn ld_global_nc_v4(p: *const u32) -> [u32; 4] {
    // SAFETY: the caller guarantees 16 readable bytes.
    unsafe { p.cast::<[u32; 4]>().read_unaligned() }
}

/// A 16-byte load (`ld.global.v4.u32` on the device); unaligned on the host as
/// [`ld_global_nc_v4`].
///
/// # Safety
/// `p` is valid for 16 bytes of reads not written concurrently.
pub unsafe fn ld_global_v4(p: *const u32) -> [u32; 4] {
    // SAFETY: the caller guarantees 16 readable bytes.
    unsafe { p.cast::<[u32; 4]>().read_unaligned() }
}

/// A 16-byte store (`st.global.v4.u32` on the device); unaligned on the host.
///
/// # Safety
/// `p` is valid for 16 bytes of writes no other thread accesses concurrently.
pub unsafe fn st_global_v4(p: *mut u32, w: [u32; 4]) {
    // SAFETY: the caller guarantees 16 writable bytes.
    unsafe { p.cast::<[u32; 4]>().write_unaligned(w) }
}

/// A 16-byte store to shared memory (`st.shared.v4.u32` on the device); unaligned on
/// the host.
///
/// # Safety
/// `p` is valid for 16 bytes of writes no other thread accesses concurrently.
pub unsafe fn st_shared_v4(p: *mut u32, w: [u32; 4]) {
    // SAFETY: the caller guarantees 16 writable bytes.
    unsafe { p.cast::<[u32; 4]>().write_unaligned(w) }
}

/// A 16-byte load from shared memory (`ld.shared.v4.u32` on the device); unaligned on
/// the host.
///
/// # Safety
/// `p` is valid for 16 bytes of reads not written concurrently.
pub unsafe fn ld_shared_v4(p: *const u32) -> [u32; 4] {
    // SAFETY: the caller guarantees 16 readable bytes.
    unsafe { p.cast::<[u32; 4]>().read_unaligned() }
}

/// A 16-byte global-to-shared copy (`cp.async.cg.shared.global` on the device, where it
/// is asynchronous until [`cp_async_wait_all`]); done at once on the host.
///
/// # Safety
/// `dst` and `src` are valid for 16 bytes, not accessed by other threads until the wait.
pub unsafe fn cp_async_16(dst: SmemAddr, src: *const u32) {
    // SAFETY: the caller guarantees 16 readable and 16 writable bytes.
    unsafe { (dst.0 as *mut [u32; 4]).write_unaligned(src.cast::<[u32; 4]>().read_unaligned()) }
}

/// Waits for this thread's `cp.async` copies (nothing to wait for on the host).
pub fn cp_async_wait_all() {}

/// Closes this thread's pending `cp.async` copies into a group (nothing on the host).
pub fn cp_async_commit() {}

/// Waits for all but the latest `cp.async` group (nothing to wait for on the host).
pub fn cp_async_wait_group_1() {}
