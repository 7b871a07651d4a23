//! Multi-LoRA deltas over one base model (Punica's BGMV and SGMV): for token row `i`
//! with adapter slot `s`, `y[i, :] += scale[s] * (x[i, :] A[s]^T) B[s]^T`, computed as
//! two kernels per projection, *shrink* (`t[i, r] = x[i, :] . A[s][r, :]`, `f32`) and
//! *expand* (`y[i, o] += scale[s] * sum_r t[i, r] B[s][o, r]`), as Punica and vLLM do.
//!
//! Adapter weights live in slot-major stacks in the activations' dtype `T`:
//! `a: [slots, max_rank, in_dim]` (PEFT's `lora_A.weight` per slot, `[r, in]`) and
//! `b: [slots, out_dim, max_rank]` (`lora_B.weight`, `[out, r]`), with per-slot
//! `ranks: u32[slots]` (`<= max_rank`; larger values are clamped to `max_rank`) and
//! `scales: f32[slots]` (`lora_alpha / r`, or `/ sqrt(r)` with rsLoRA). Only ranks
//! `r < ranks[s]` are read: the padding of a smaller adapter (`A` rows, `B` columns and
//! `t` columns past its rank) may hold anything. The intermediate
//! `t: f32[rows, max_rank]` is the caller's scratch; shrink writes `t[i, r]` for `r <
//! ranks[s]` of the rows that have an adapter and nothing else, expand reads exactly
//! those. Accumulation is in `f32`; `y` is rounded to `T` once, `T(y + scale * acc)`.
//!
//! `y` may be a column slice of a wider (fused q|k|v or gate|up) output: row `i`'s
//! outputs are `y[i * y_stride + y_offset .. + out_dim]`; nothing else of `y` is touched,
//! nor are the rows without an adapter.
//!
//! Two launch shapes:
//! - **BGMV** (decode, [`bgmv_shrink`], [`bgmv_expand`]): every row names its slot,
//!   `idx: i32[rows]` (negative: no adapter, the row is untouched), in any order and
//!   repeated freely. Shrink: one warp per (row, rank), a vectorised dot product over
//!   `in_dim` (each lane 16-byte vectors `lane, lane + 32, ...`, [`SHRINK_VECS`] of them
//!   in flight) and a shuffle reduction; grid (rows, rank chunks of `warps` ranks), no
//!   shared memory, no barrier. Expand: one thread per (row, output), the output's `B`
//!   row read as 16-byte vectors, `t` broadcast through L1; grid (rows, output chunks of
//!   `threads`), no shared memory. A row re-reads its adapter's `A`/`B` (from L2 when
//!   rows share a slot): Punica's BGMV.
//! - **SGMV** (prefill, [`sgmv_shrink`], [`sgmv_expand`]): rows come in contiguous
//!   segments `seg_starts[g] .. seg_starts[g + 1]` that share slot `seg_idx[g]`
//!   (negative: untouched). One block per (tile of `SGMV_WARP_ROWS * warps` rows of one
//!   segment, 16 with [`crate::launch::LORA_THREADS`]; chunk of [`SGMV_COLS`] output
//!   columns: ranks for shrink, outputs for expand); both are the same `NT` tile
//!   product `C = X W^T` over `k` (`in_dim` for shrink, the rank for expand): per
//!   [`SGMV_K`]-wide step the block stages the row tile of `X` and the adapter tile of
//!   `W` (`A[s]` rows, or `B[s]` rows) in shared memory as `f32` (16-byte global loads
//!   when the operand's rows are whole aligned vectors), then lane `c` of warp `w`
//!   accumulates column `c` of the tile's rows `w * SGMV_WARP_ROWS ..` (its `W` row held
//!   in registers for the step, the `X` values broadcast). Each adapter tile is loaded
//!   once per row tile and used by all of its rows. Blocks map to tiles as
//!   [`crate::prefill_mma`]'s: grid x is the bound `ceil(rows / tile rows) + segments`
//!   ([`crate::launch::lora_sgmv_tiles`]), blocks past the last tile return at once.
//!
//! Shared memory: BGMV none; SGMV dynamic, [`sgmv_shared_bytes`]: `f32[SGMV_COLS *
//! (SGMV_K + 4) + tile rows * SGMV_K]` (6.5 KB with 4 warps: the `W` tile's rows padded
//! by 4 words so the lanes' 16-byte row reads hit distinct banks; the `X` tile
//! unpadded, read by broadcasts), read with 16-byte `ld.shared.v4` loads, two
//! `sync_threads` per `k` step.
//!
//! Cost per projection (rows `n`, rank `r`, `T` bytes `e`): shrink reads `n r in_dim e`
//! bytes of `A` (BGMV: per row, so from L2 after a slot's first row; SGMV: per row tile,
//! so `ceil(n / 16) r in_dim e`) and `x` once per rank chunk, `2 n r in_dim` FLOPs;
//! expand reads `n out_dim r e` bytes of `B` (SGMV: per row tile), reads and writes `y`'s
//! slice once, `2 n r out_dim` FLOPs. The HBM floor is the distinct adapters' weights
//! plus `x`, `y` and `t`; these CUDA-core kernels sit between that and the L2 traffic
//! above (SGMV's tile product runs on CUDA cores, not tensor cores).
//!
//! Calling them (per adapted projection, e.g. q, k and v of a fused QKV): shrink with
//! the projection's `A` stack into `t` (`f32[rows, max_rank]`, no initialisation
//! needed), then expand with its `B` stack into the projection's columns of the base
//! output (`y_stride` the fused row width, `y_offset` the projection's first column),
//! after the base GEMM has written them. Launch geometry: [`crate::launch`]'s
//! `lora_bgmv_shrink`, `lora_bgmv_expand`, `lora_sgmv_shrink`, `lora_sgmv_expand` (with
//! [`crate::launch::LORA_THREADS`]); `max_rank`, `rows` and `out_dim` must be at least 1
//! (an empty grid is not a launch).

// Parallel register arrays indexed by constant-bounded loops (which LLVM unrolls into
// registers) read more plainly than zipped iterators here.
#![allow(clippy::needless_range_loop)]

use crate::device::{
    block_dim_x, block_idx_x, block_idx_y, dynamic_shared_mem, ld_global_nc_v4, ld_shared_v4,
    sync_threads, thread_idx_x,
};
use crate::reduce::warp_sum;
use crate::Storage;

/// 16-byte vectors of `x` and of `A` each lane of [`bgmv_shrink`] loads before using
/// them (bytes in flight per lane: `2 * 16 * SHRINK_VECS`).
pub const SHRINK_VECS: usize = 4;
/// Rows of a segment's tile per warp of an SGMV block (the tile has `SGMV_WARP_ROWS *
/// warps` rows; each lane keeps one accumulator per row).
pub const SGMV_WARP_ROWS: usize = 4;
/// Output columns per SGMV block (one per lane): ranks for shrink, outputs for expand.
pub const SGMV_COLS: usize = 32;
/// Width of one staged `k` step of the SGMV tile product.
pub const SGMV_K: usize = 32;
/// Row pitch of the staged `X` tile, words: its rows are read by whole warps at one
/// address (broadcasts), so no padding.
const X_PITCH: usize = SGMV_K;
/// Row pitch of the staged `W` tile, words: lane `c` reads row `c` as 16-byte vectors;
/// four words of padding put the 8 lanes of each quarter-warp phase on distinct banks.
const W_PITCH: usize = SGMV_K + 4;

/// Rows of the SGMV tile of a block of `threads` threads.
pub const fn sgmv_tile_rows(threads: u32) -> u32 {
    SGMV_WARP_ROWS as u32 * (threads / 32)
}

/// Dynamic shared memory of the SGMV kernels for a block of `threads` threads: the `W`
/// tile (`SGMV_COLS` rows of `SGMV_K + 4` words) and the `X` tile (tile rows of
/// `SGMV_K` words). 6.5 KB at 4 warps, 20.5 KB at 32.
pub const fn sgmv_shared_bytes(threads: u32) -> u32 {
    ((SGMV_COLS * W_PITCH) as u32 + sgmv_tile_rows(threads) * SGMV_K as u32) * 4
}

/// Whether `p` is 16-byte aligned (the vector paths' requirement).
#[inline(always)]
fn aligned16<T>(p: *const T) -> bool {
    (p as usize).is_multiple_of(16)
}

/// The adapter of slot `slot` (negative: none): `Some((slot, rank))`, the rank clamped
/// to `max_rank`; `None` for no adapter or rank 0.
///
/// # Safety
/// `slot` negative or a valid index of `ranks`.
#[inline(always)]
unsafe fn adapter(slot: i32, ranks: *const u32, max_rank: u32) -> Option<(usize, usize)> {
    if slot < 0 {
        return None;
    }
    // SAFETY: per the function contract.
    let rank = unsafe { *ranks.add(slot as usize) }.min(max_rank) as usize;
    (rank > 0).then_some((slot as usize, rank))
}

/// BGMV shrink (decode): `t[i, r] = sum_k x[i, k] * a[idx[i], r, k]` in `f32` for every
/// row `i` with `idx[i] >= 0` and `r < ranks[idx[i]]`.
///
/// Thread mapping: block (row `i` = grid x, rank chunk = grid y), warp `w` computes rank
/// `r = grid_y * warps + w` (warps past the rank return); lane `l` reads the 16-byte
/// vectors `l, l + 32, ...` of the `x` row and of `A`'s row `r` ([`SHRINK_VECS`] per
/// lane in flight; element-wise when `in_dim * sizeof(T) % 16 != 0` or a base is not
/// 16-byte aligned), then a butterfly warp sum; lane 0 writes. No shared memory, no
/// `sync_threads`. Launch with [`crate::launch::lora_bgmv_shrink`].
///
/// # Safety
/// `x`: `[rows, in_dim]`; `a`: `[slots, max_rank, in_dim]`; `idx`: `i32[rows]`, each
/// negative or `< slots`; `ranks`: `u32[slots]`; `t`: `f32[rows, max_rank]`, not
/// overlapping the inputs; none of `x`, `a`, `idx`, `ranks` written during the launch;
/// grid (rows, `>= ceil(max_rank / warps)`).
pub unsafe fn bgmv_shrink<T: Storage>(
    t: *mut f32,
    x: *const T,
    a: *const T,
    idx: *const i32,
    ranks: *const u32,
    in_dim: u32,
    max_rank: u32,
) {
    let i = block_idx_x() as usize;
    let (tid, warps) = (thread_idx_x(), block_dim_x() / 32);
    let (lane, r) = (
        (tid % 32) as usize,
        (block_idx_y() * warps + tid / 32) as usize,
    );
    let (n, mr) = (in_dim as usize, max_rank as usize);
    // SAFETY: per the function contract; the early returns are warp-uniform (they depend
    // on the row and the warp's rank only), so every lane of a summing warp shuffles.
    unsafe {
        let Some((slot, rank)) = adapter(*idx.add(i), ranks, max_rank) else {
            return;
        };
        if r >= rank {
            return;
        }
        let xr = x.add(i * n);
        let ar = a.add((slot * mr + r) * n);
        let mut acc = 0.0f32;
        if n.is_multiple_of(T::VEC) && aligned16(x) && aligned16(a) {
            let (vec, nv) = (T::VEC, n / T::VEC);
            let mut j0 = lane;
            while j0 < nv {
                let mut xv = [[0u32; 4]; SHRINK_VECS];
                let mut av = [[0u32; 4]; SHRINK_VECS];
                for u in 0..SHRINK_VECS {
                    let j = j0 + 32 * u;
                    if j < nv {
                        xv[u] = ld_global_nc_v4(xr.add(j * vec).cast());
                        av[u] = ld_global_nc_v4(ar.add(j * vec).cast());
                    }
                }
                for u in 0..SHRINK_VECS {
                    let (xf, af) = (T::unpack(xv[u]), T::unpack(av[u]));
                    for e in 0..vec {
                        acc += xf[e] * af[e];
                    }
                }
                j0 += 32 * SHRINK_VECS;
            }
        } else {
            let mut k = lane;
            while k < n {
                acc += (*xr.add(k)).to_f32() * (*ar.add(k)).to_f32();
                k += 32;
            }
        }
        let acc = warp_sum(acc);
        if lane == 0 {
            *t.add(i * mr + r) = acc;
        }
    }
}

/// BGMV expand (decode): `y[i, y_offset + o] = T(y + scales[s] * sum_{r < ranks[s]}
/// t[i, r] * b[s, o, r])` with `s = idx[i]`, for every row with `s >= 0` and `o <
/// out_dim`; row `i` of `y` starts at `i * y_stride`.
///
/// Thread mapping: block (row `i` = grid x, output chunk = grid y), thread `j` owns
/// output `o = grid_y * threads + j`: it reads `B[s]`'s row `o` as 16-byte vectors (when
/// `max_rank * sizeof(T) % 16 == 0` and `b` is 16-byte aligned; element-wise otherwise)
/// and the `t` row's values (the same address across the warp: one broadcast), then
/// updates its one element of `y`. No shared memory, no `sync_threads`. Launch with
/// [`crate::launch::lora_bgmv_expand`].
///
/// # Safety
/// `y`: rows of `y_stride` elements with `y_offset + out_dim <= y_stride`, read and
/// written by this kernel only; `t`: `f32[rows, max_rank]` holding [`bgmv_shrink`]'s
/// values for the same `idx`; `b`: `[slots, out_dim, max_rank]`; `idx`, `ranks`, `scales`
/// as [`bgmv_shrink`] (`scales`: `f32[slots]`); grid (rows, `>= ceil(out_dim /
/// threads)`).
pub unsafe fn bgmv_expand<T: Storage>(
    y: *mut T,
    t: *const f32,
    b: *const T,
    idx: *const i32,
    ranks: *const u32,
    scales: *const f32,
    out_dim: u32,
    max_rank: u32,
    y_stride: u32,
    y_offset: u32,
) {
    let i = block_idx_x() as usize;
    let o = (block_idx_y() * block_dim_x() + thread_idx_x()) as usize;
    let mr = max_rank as usize;
    // SAFETY: per the function contract; each element of `y` is read and written by one
    // thread.
    unsafe {
        let Some((slot, rank)) = adapter(*idx.add(i), ranks, max_rank) else {
            return;
        };
        if o >= out_dim as usize {
            return;
        }
        let tr = t.add(i * mr);
        let br = b.add((slot * out_dim as usize + o) * mr);
        let mut acc = 0.0f32;
        if mr.is_multiple_of(T::VEC) && aligned16(b) {
            let vec = T::VEC;
            for v in 0..rank.div_ceil(vec) {
                let bv = T::unpack(ld_global_nc_v4(br.add(v * vec).cast()));
                for e in 0..vec {
                    let r = v * vec + e;
                    if r < rank {
                        acc += *tr.add(r) * bv[e];
                    }
                }
            }
        } else {
            for r in 0..rank {
                acc += *tr.add(r) * (*br.add(r)).to_f32();
            }
        }
        let p = y.add(i * y_stride as usize + y_offset as usize + o);
        *p = T::from_f32((*p).to_f32() + *scales.add(slot) * acc);
    }
}

/// The SGMV tile a block serves: rows `row0 .. row0 + rows` (at most the tile's) of one
/// segment, whose adapter is `slot` with rank `rank`.
struct SegTile {
    row0: usize,
    rows: usize,
    slot: usize,
    rank: usize,
}

/// Maps `block_idx_x` to (segment, row tile of `tm` rows), segments in order; `None`
/// past the last tile or for a segment without an adapter (negative slot, or rank 0).
///
/// # Safety
/// `seg_starts`: `num_segs + 1` non-decreasing entries; `seg_idx`: `num_segs` entries,
/// each negative or a valid index of `ranks`.
#[inline(always)]
unsafe fn seg_tile(
    seg_starts: *const u32,
    seg_idx: *const i32,
    ranks: *const u32,
    num_segs: u32,
    max_rank: u32,
    tm: usize,
) -> Option<SegTile> {
    let mut b = block_idx_x() as usize;
    // SAFETY: per the function contract.
    unsafe {
        for g in 0..num_segs as usize {
            let start = *seg_starts.add(g) as usize;
            let len = *seg_starts.add(g + 1) as usize - start;
            let n = len.div_ceil(tm);
            if b < n {
                let (slot, rank) = adapter(*seg_idx.add(g), ranks, max_rank)?;
                let row0 = start + b * tm;
                return Some(SegTile {
                    row0,
                    rows: (start + len - row0).min(tm),
                    slot,
                    rank,
                });
            }
            b -= n;
        }
    }
    None
}

/// Stages `src[row, k0 .. k0 + SGMV_K]` of rows `0 .. tile_rows` (row pitch `stride`
/// elements) into `dst` (`f32`, row pitch `pitch`), zeros for rows `>= valid_rows` and
/// for `k >= k_len`. Thread `i` of the block takes the 16-byte vectors (`vec_ok`) or the
/// elements `i, i + threads, ...` of the tile, `k` fastest (coalesced).
///
/// # Safety
/// Rows `< valid_rows` of `src` hold `k_len` readable elements, none written during the
/// launch; `vec_ok` only when `stride * sizeof(S) % 16 == 0`, `src` is 16-byte aligned
/// and `k_len <= stride`; `dst` holds `tile_rows * pitch` words that no thread reads
/// until the next `sync_threads`.
#[inline(always)]
unsafe fn stage<S: Storage>(
    dst: *mut f32,
    pitch: usize,
    tile_rows: usize,
    src: *const S,
    stride: usize,
    valid_rows: usize,
    k0: usize,
    k_len: usize,
    vec_ok: bool,
) {
    let (tid, threads) = (thread_idx_x() as usize, block_dim_x() as usize);
    // SAFETY: per the function contract: a vector is loaded only when its first element
    // is `< k_len <= stride` and `stride` is whole vectors, so the whole vector is inside
    // the row.
    unsafe {
        if vec_ok {
            let vec = S::VEC;
            let per_row = SGMV_K / vec;
            let mut q = tid;
            while q < tile_rows * per_row {
                let (row, kk) = (q / per_row, (q % per_row) * vec);
                let k = k0 + kk;
                let mut v = [0.0f32; 8];
                if row < valid_rows && k < k_len {
                    v = S::unpack(ld_global_nc_v4(src.add(row * stride + k).cast()));
                }
                for e in 0..vec {
                    *dst.add(row * pitch + kk + e) = if k + e < k_len { v[e] } else { 0.0 };
                }
                q += threads;
            }
        } else {
            let mut q = tid;
            while q < tile_rows * SGMV_K {
                let (row, kk) = (q / SGMV_K, q % SGMV_K);
                let k = k0 + kk;
                *dst.add(row * pitch + kk) = if row < valid_rows && k < k_len {
                    (*src.add(row * stride + k)).to_f32()
                } else {
                    0.0
                };
                q += threads;
            }
        }
    }
}

/// The SGMV tile product `C = X W^T` over `k < k_len`: `X` the `rows` (at most the
/// tile's `SGMV_WARP_ROWS * warps`) rows at `x` (pitch `x_stride`), `W` the `cols` (`<=
/// SGMV_COLS`) rows at `w` (pitch `w_stride`). Returns lane `c`'s column of the warp's
/// rows: entry `j` is `C[warp * SGMV_WARP_ROWS + j, c]` (zero past `cols`; rows past
/// `rows` are not computed). Every thread of the block must call it (block-uniform
/// arguments): two `sync_threads` per [`SGMV_K`] step.
///
/// # Safety
/// As [`stage`] for both operands (`x`: `rows` rows, `w`: `cols` rows, `k_len`
/// elements each); dynamic shared memory of [`sgmv_shared_bytes`].
#[inline(always)]
unsafe fn tile_nt<X: Storage, W: Storage>(
    x: *const X,
    x_stride: usize,
    rows: usize,
    w: *const W,
    w_stride: usize,
    cols: usize,
    k_len: usize,
) -> [f32; SGMV_WARP_ROWS] {
    let tid = thread_idx_x() as usize;
    let (lane, warp, warps) = (tid % 32, tid / 32, block_dim_x() as usize / 32);
    let tm = SGMV_WARP_ROWS * warps;
    let ws = dynamic_shared_mem() as *mut f32;
    // SAFETY: the dynamic shared memory holds the `W` tile then the `X` tile.
    let xs = unsafe { ws.add(SGMV_COLS * W_PITCH) };
    let x_vec = x_stride.is_multiple_of(X::VEC) && aligned16(x) && k_len <= x_stride;
    let w_vec = w_stride.is_multiple_of(W::VEC) && aligned16(w) && k_len <= w_stride;
    let mut acc = [0.0f32; SGMV_WARP_ROWS];
    let mut k0 = 0;
    // SAFETY: per the function contract; the tiles are written and read on opposite
    // sides of `sync_threads`, all reads inside the tiles (`lane < SGMV_COLS`, rows
    // `< tm`, `kk < SGMV_K`; 16-byte aligned: the pitches are multiples of 4 words).
    unsafe {
        while k0 < k_len {
            stage(xs, X_PITCH, tm, x, x_stride, rows, k0, k_len, x_vec);
            stage(ws, W_PITCH, SGMV_COLS, w, w_stride, cols, k0, k_len, w_vec);
            sync_threads();
            // Lane `c`'s `W` row in registers, then each of the warp's rows (its `X`
            // values the same address across the warp: broadcasts), 16-byte shared
            // loads throughout: four FMAs per `X` load.
            let mut wr = [0.0f32; SGMV_K];
            for q in 0..SGMV_K / 4 {
                let v = ld_shared_v4(ws.add(lane * W_PITCH + 4 * q).cast());
                for e in 0..4 {
                    wr[4 * q + e] = f32::from_bits(v[e]);
                }
            }
            for j in 0..SGMV_WARP_ROWS {
                let row = warp * SGMV_WARP_ROWS + j;
                if row < rows {
                    let xr = xs.add(row * X_PITCH);
                    let mut sum = acc[j];
                    for q in 0..SGMV_K / 4 {
                        let v = ld_shared_v4(xr.add(4 * q).cast());
                        for e in 0..4 {
                            sum += f32::from_bits(v[e]) * wr[4 * q + e];
                        }
                    }
                    acc[j] = sum;
                }
            }
            sync_threads();
            k0 += SGMV_K;
        }
    }
    acc
}

/// SGMV shrink (prefill): for every segment `g` with `s = seg_idx[g] >= 0` and its rows
/// `i` in `seg_starts[g] .. seg_starts[g + 1]`: `t[i, r] = sum_k x[i, k] * a[s, r, k]`
/// in `f32` for `r < ranks[s]`.
///
/// Thread mapping: the module's SGMV mapping with columns = ranks: block (row tile of a
/// segment = grid x, rank chunk `SGMV_COLS * grid_y ..` = grid y); the `A` rows of the
/// chunk are staged once per [`SGMV_K`] step and used by all the tile's rows. Dynamic
/// shared memory ([`sgmv_shared_bytes`]), two `sync_threads` per step. Launch with
/// [`crate::launch::lora_sgmv_shrink`].
///
/// # Safety
/// `x`: `[rows, in_dim]` with `rows = seg_starts[num_segs]`; `a`, `ranks`, `t` as
/// [`bgmv_shrink`]; `seg_starts`: `u32[num_segs + 1]`, non-decreasing; `seg_idx`:
/// `i32[num_segs]`, each negative or `< slots`; inputs not written during the launch;
/// grid ([`crate::launch::lora_sgmv_tiles`] or more, `>= ceil(max_rank / SGMV_COLS)`),
/// dynamic shared memory of [`sgmv_shared_bytes`].
pub unsafe fn sgmv_shrink<T: Storage>(
    t: *mut f32,
    x: *const T,
    a: *const T,
    seg_starts: *const u32,
    seg_idx: *const i32,
    ranks: *const u32,
    num_segs: u32,
    in_dim: u32,
    max_rank: u32,
) {
    let (n, mr) = (in_dim as usize, max_rank as usize);
    let tid = thread_idx_x() as usize;
    let (lane, warp, warps) = (tid % 32, tid / 32, block_dim_x() as usize / 32);
    let c0 = block_idx_y() as usize * SGMV_COLS;
    // SAFETY: per the function contract; the early returns are block-uniform (before
    // any barrier); each `t` element is written by one thread.
    unsafe {
        let Some(tile) = seg_tile(
            seg_starts,
            seg_idx,
            ranks,
            num_segs,
            max_rank,
            SGMV_WARP_ROWS * warps,
        ) else {
            return;
        };
        if c0 >= tile.rank {
            return;
        }
        let cols = (tile.rank - c0).min(SGMV_COLS);
        let acc = tile_nt(
            x.add(tile.row0 * n),
            n,
            tile.rows,
            a.add((tile.slot * mr + c0) * n),
            n,
            cols,
            n,
        );
        if lane < cols {
            for j in 0..SGMV_WARP_ROWS {
                let row = warp * SGMV_WARP_ROWS + j;
                if row < tile.rows {
                    *t.add((tile.row0 + row) * mr + c0 + lane) = acc[j];
                }
            }
        }
    }
}

/// SGMV expand (prefill): for every segment `g` with `s = seg_idx[g] >= 0` and its rows
/// `i`: `y[i, y_offset + o] = T(y + scales[s] * sum_{r < ranks[s]} t[i, r] * b[s, o,
/// r])` for `o < out_dim`; row `i` of `y` starts at `i * y_stride`.
///
/// Thread mapping: the module's SGMV mapping with columns = outputs: block (row tile of
/// a segment = grid x, output chunk `SGMV_COLS * grid_y ..` = grid y); the chunk's `B`
/// rows (`[SGMV_COLS, rank]`) are staged once per [`SGMV_K`] ranks and used by all the
/// tile's rows; each `y` element is read and written by one lane. Dynamic shared memory
/// ([`sgmv_shared_bytes`]), two `sync_threads` per step (one step for ranks up to 32). Launch with
/// [`crate::launch::lora_sgmv_expand`].
///
/// # Safety
/// `y`, `t`, `b`, `ranks`, `scales` as [`bgmv_expand`] (`t` holding [`sgmv_shrink`]'s
/// values for the same segments); `seg_starts`, `seg_idx` as [`sgmv_shrink`]; grid
/// ([`crate::launch::lora_sgmv_tiles`] or more, `>= ceil(out_dim / SGMV_COLS)`), dynamic
/// shared memory of [`sgmv_shared_bytes`].
pub unsafe fn sgmv_expand<T: Storage>(
    y: *mut T,
    t: *const f32,
    b: *const T,
    seg_starts: *const u32,
    seg_idx: *const i32,
    ranks: *const u32,
    scales: *const f32,
    num_segs: u32,
    out_dim: u32,
    max_rank: u32,
    y_stride: u32,
    y_offset: u32,
) {
    let (out, mr) = (out_dim as usize, max_rank as usize);
    let tid = thread_idx_x() as usize;
    let (lane, warp, warps) = (tid % 32, tid / 32, block_dim_x() as usize / 32);
    let c0 = block_idx_y() as usize * SGMV_COLS;
    // SAFETY: per the function contract; the early returns are block-uniform (before
    // any barrier); each `y` element is read and written by one thread.
    unsafe {
        let Some(tile) = seg_tile(
            seg_starts,
            seg_idx,
            ranks,
            num_segs,
            max_rank,
            SGMV_WARP_ROWS * warps,
        ) else {
            return;
        };
        if c0 >= out {
            return;
        }
        let cols = (out - c0).min(SGMV_COLS);
        let acc = tile_nt(
            t.add(tile.row0 * mr),
            mr,
            tile.rows,
            b.add((tile.slot * out + c0) * mr),
            mr,
            cols,
            tile.rank,
        );
        if lane < cols {
            let scale = *scales.add(tile.slot);
            for j in 0..SGMV_WARP_ROWS {
                let row = warp * SGMV_WARP_ROWS + j;
                if row < tile.rows {
                    let p = y
                        .add((tile.row0 + row) * y_stride as usize + y_offset as usize + c0 + lane);
                    *p = T::from_f32((*p).to_f32() + scale * acc[j]);
                }
            }
        }
    }
}
