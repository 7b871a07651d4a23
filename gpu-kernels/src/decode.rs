//! Decode attention designed for memory bandwidth: single pass ([`paged_attention_v1`])
//! and split-K ([`paged_attention_v2`], finished by
//! [`crate::attention::paged_attention_v2_reduce`]).
//!
//! Decode reads every cached K and V element of the batch once and does two FMAs per
//! element and query head, so it is bound by HBM bandwidth: the kernel is built so that
//! the bytes are read once, in 16-byte vectors, with many loads in flight.
//!
//! Thread mapping. One thread block per (KV head group slice, sequence, partition):
//! grid `(num_kv_heads * slices, num_seqs, partitions)` (see
//! [`crate::launch::decode_v1`] / [`crate::launch::decode_v2`]). A block
//! serves `hpb <= MAX_GROUP` query heads of one KV head (the whole GQA group when it has
//! at most 8 heads: SmolLM2 3, Llama 3 8), so each K/V vector is read from memory once for
//! all of them. Inside the block:
//! - a warp takes whole KV blocks of the block table (`w, w + warps, ...`, counted
//!   from the block of the first attended token);
//! - within a warp, a *thread group* of `G` lanes reads one token's K (and V) row as
//!   16-byte vectors (`ld.global.nc.v4.u32`: 8 bf16/f16 or 4 f32), `G = min(32,
//!   next_pow2(head_dim / VEC))`; the warp handles `32 / G` tokens per step and prefetches
//!   [`CHUNK_VECS`] vectors of K and of V per lane before computing on them;
//! - the dot products of a token with the `hpb` queries (query staged in shared memory,
//!   scaled, `f32`) are reduced over the group with butterfly shuffles;
//! - each thread group keeps its own online softmax (running max, sum, and `f32` V
//!   accumulators for its vector slots), rescaling only when the max grows: no barrier
//!   and no shared memory per token;
//! - at the end the groups of a warp merge by shuffles, and the warps merge once through
//!   shared memory (one `sync_threads`).
//!
//! Sliding window (`window > 0`, Gemma 3's local layers): the query at position
//! `context_len - 1` attends tokens `max(0, context_len - window) .. context_len`. The
//! token range of a block simply starts there: KV blocks wholly before it are never
//! touched (no table read, no load), the tokens of the window's first block that lie
//! before it are masked per token like the tail of the last block (not loaded either).
//! v2 cuts its partitions from the window's start, so a windowed batch needs only
//! `ceil(min(context_len, window) / partition_size)` of them. `window == 0` costs two
//! integer ops per block.
//!
//! Shared memory: static `f32[MAX_GROUP * 256]` (queries) and dynamic
//! `warps * (MAX_GROUP * head_dim + 2 * MAX_GROUP) * 4` bytes (the per-warp partial
//! states; [`crate::launch::decode_shared_bytes`]). Nothing scales with the context.
//!
//! Cost per call: bytes `2 * sum(n_s) * num_kv_heads * head_dim * sizeof(T)` (K and V)
//! plus `q`/`out`, with `n_s` the attended tokens of sequence `s` (`context_len`, or
//! `min(context_len, window)`); FLOPs `4 * sum(n_s) * num_heads * head_dim`. The floor is
//! the bytes over the HBM bandwidth (vLLM's shape, batch 8 x 4096 tokens, 8 KV heads,
//! h128, bf16: 134 MB, about 33 us at 4 TB/s). Invariants: accumulation in `f32`; every
//! attended K/V element is loaded exactly once per block, and no other.

// Parallel register arrays indexed by constant-bounded loops (which LLVM unrolls into
// registers) read more plainly than zipped iterators here.
#![allow(clippy::needless_range_loop)]

use crate::device::{
    block_dim_x, block_idx_x, block_idx_y, block_idx_z, dynamic_shared_mem, exp_fast,
    ld_global_nc_v4, shfl_xor_f32, sync_threads, thread_idx_x,
};
use crate::Storage;

/// Most query heads one block serves; larger GQA groups are split in slices.
pub const MAX_GROUP: usize = 8;
/// Per-lane K (and V) vectors loaded before the first use (bytes in flight).
pub const CHUNK_VECS: usize = 4;
/// Per-lane elements of one token row at most (`32 * 8 = 256 = MAX_HEAD_DIM`).
const LANE: usize = 8;

/// Static geometry of one instance, all compile-time constants after inlining.
#[derive(Clone, Copy)]
struct Geo {
    /// Elements per 16-byte vector.
    vec: usize,
    /// Vectors per row.
    nv: usize,
    /// Lanes per token (thread group).
    g: usize,
    /// Tokens per warp step.
    tpi: usize,
    /// Vectors per lane per row.
    npl: usize,
    /// Warp steps per prefetched chunk.
    steps: usize,
}

#[inline(always)]
const fn geo<T: Storage, const D: usize>() -> Geo {
    let vec = T::VEC;
    let nv = D / vec;
    let g = if nv >= 32 { 32 } else { nv.next_power_of_two() };
    let npl = nv.div_ceil(g);
    let steps = if CHUNK_VECS / npl == 0 {
        1
    } else {
        CHUNK_VECS / npl
    };
    Geo {
        vec,
        nv,
        g,
        tpi: 32 / g,
        npl,
        steps,
    }
}

/// How a block's query heads map to the launch: `(slices per KV head, heads per block)`.
/// `slices = ceil(group / MAX_GROUP)`, `heads per block = ceil(group / slices)`.
#[inline(always)]
pub const fn group_split(num_heads: u32, num_kv_heads: u32) -> (u32, u32) {
    let group = num_heads / num_kv_heads;
    let slices = group.div_ceil(MAX_GROUP as u32);
    (slices, group.div_ceil(slices))
}

/// What one block attends: its sequence's block table, its KV head and query heads.
#[derive(Clone, Copy)]
pub(crate) struct Work<T> {
    /// The first served query row (`D` elements).
    pub q: *const T,
    /// Elements between consecutive served query rows (`D` for the heads of one token,
    /// `num_heads * D` for one head of consecutive tokens).
    pub q_stride: usize,
    /// Causal limit (with `ROW_MASK`, see [`attend_group`]): served row `r` sees tokens
    /// `t <= causal + r`.
    pub causal: usize,
    /// Keys per row (with `ROW_MASK`): served row `r` sees tokens `causal + r + 1 - span
    /// ..= causal + r`, tested as `(causal + r).wrapping_sub(t) < span` (the causal and
    /// the window test in one compare); [`NO_WINDOW`] for no window.
    pub span: usize,
    pub k_cache: *const T,
    pub v_cache: *const T,
    /// The sequence's row of the block table.
    pub block_table: *const u32,
    pub num_kv_heads: usize,
    pub kv_head: usize,
    pub block_size: usize,
    /// First query head served (global head index).
    pub head0: usize,
    /// Query rows served (`1..=MAX_GROUP`): heads of a GQA group, or tokens of a tile.
    pub hpb: usize,
}

/// [`Work::span`] without a window: `(causal + r) - t` is below it for every `t <=
/// causal + r` (positions are `u32`, so at most `u32::MAX + MAX_GROUP`), and a `t >
/// causal + r` wraps to above it.
pub(crate) const NO_WINDOW: usize = usize::MAX - u32::MAX as usize;
const _: () = assert!(NO_WINDOW > u32::MAX as usize + MAX_GROUP);

/// The first key a query at position `end - 1` sees with sliding window `window` (0:
/// none): `max(0, end - window)`.
#[inline(always)]
pub(crate) fn window_start(end: usize, window: u32) -> usize {
    if window == 0 {
        0
    } else {
        end.saturating_sub(window as usize)
    }
}

/// [`Work::span`] of a sliding window `window` (0: none).
#[inline(always)]
pub(crate) fn window_span(window: u32) -> usize {
    if window == 0 {
        NO_WINDOW
    } else {
        window as usize
    }
}

/// One thread group's online-softmax state over the tokens it has seen.
struct State {
    m: [f32; MAX_GROUP],
    l: [f32; MAX_GROUP],
    acc: [[f32; LANE]; MAX_GROUP],
}

impl State {
    #[inline(always)]
    fn new() -> Self {
        Self {
            m: [f32::NEG_INFINITY; MAX_GROUP],
            l: [0.0; MAX_GROUP],
            acc: [[0.0; LANE]; MAX_GROUP],
        }
    }

    /// Adds one token with logit `s` and value row slice `v` to head `h`.
    #[inline(always)]
    fn push(&mut self, h: usize, s: f32, v: &[f32; LANE], n: usize) {
        if s > self.m[h] {
            // m = -inf at the start: exp(-inf) = 0 clears nothing that is not zero.
            let a = exp_fast(self.m[h] - s);
            self.l[h] *= a;
            for e in 0..n {
                self.acc[h][e] *= a;
            }
            self.m[h] = s;
        }
        let p = exp_fast(s - self.m[h]);
        self.l[h] += p;
        for e in 0..n {
            self.acc[h][e] += p * v[e];
        }
    }

    /// Merges the state of lane `lane ^ mask` into this one (all lanes call it).
    #[inline(always)]
    fn merge_shfl(&mut self, mask: u32, hpb: usize, n: usize) {
        for h in 0..MAX_GROUP {
            if h < hpb {
                let (m2, l2) = (shfl_xor_f32(self.m[h], mask), shfl_xor_f32(self.l[h], mask));
                let m = self.m[h].max(m2);
                let (a, b) = (weight(self.m[h], m), weight(m2, m));
                self.l[h] = self.l[h] * a + l2 * b;
                for e in 0..n {
                    let o = shfl_xor_f32(self.acc[h][e], mask);
                    self.acc[h][e] = self.acc[h][e] * a + o * b;
                }
                self.m[h] = m;
            }
        }
    }
}

/// `exp(m - max)`, 0 for an empty state (`m = -inf`, also when `max = -inf`).
#[inline(always)]
fn weight(m: f32, max: f32) -> f32 {
    if m == f32::NEG_INFINITY {
        0.0
    } else {
        exp_fast(m - max)
    }
}

/// Softmax attention of the block's `hpb` query heads over tokens `start..end` (non-empty)
/// of one sequence; calls `emit(h, d, value, max, sum)` for each (served head, dim) owned
/// by the thread after the block-wide merge, `value` normalised. With `ROW_MASK` (prefill:
/// the rows are consecutive positions) row `r` sees only the tokens of
/// [`Work::causal`] / [`Work::span`]; without it (decode: the rows are heads of one
/// position) every row sees `start..end`, and a window is the range's start.
///
/// # Safety
/// Block-uniform call; pointers valid as in [`paged_attention_v1`]; dynamic shared memory
/// of [`crate::launch::decode_shared_bytes`]; `D <= 256`, `D * sizeof(T) % 16 == 0`.
#[inline(always)]
pub(crate) unsafe fn attend_group<T: Storage, const D: usize, const ROW_MASK: bool>(
    w: Work<T>,
    start: usize,
    end: usize,
    scale: f32,
    mut emit: impl FnMut(usize, usize, f32, f32, f32),
) {
    let geo = geo::<T, D>();
    let tid = thread_idx_x() as usize;
    let threads = block_dim_x() as usize;
    let (lane, warp, warps) = (tid % 32, tid / 32, threads / 32);
    let (gl, grp) = (lane % geo.g, lane / geo.g);
    let n = geo.npl * geo.vec;
    let qs = crate::shared_array!(GK_DEC_Q: [f32; MAX_GROUP * 256]);
    let bs = w.block_size;
    let row_stride = w.num_kv_heads * D;
    // SAFETY: indices stay inside the shapes of the function contract; shared memory is
    // written and read on opposite sides of `sync_threads`.
    unsafe {
        let mut i = tid;
        while i < w.hpb * D {
            *qs.add(i) = (*w.q.add((i / D) * w.q_stride + i % D)).to_f32() * scale;
            i += threads;
        }
        sync_threads();
        let mut st = State::new();
        let mut b = start / bs + warp;
        while b * bs < end {
            let phys = *w.block_table.add(b) as usize;
            let base = (phys * bs * w.num_kv_heads + w.kv_head) * D;
            let lo = start.max(b * bs);
            let hi = end.min(b * bs + bs);
            let mut step0 = 0;
            while step0 * geo.tpi < bs {
                chunk::<T, D, ROW_MASK>(
                    &w,
                    &mut st,
                    qs,
                    base,
                    row_stride,
                    b * bs,
                    lo,
                    hi,
                    step0,
                    gl,
                    grp,
                );
                step0 += geo.steps;
            }
            b += warps;
        }
        let mut mask = geo.g as u32;
        while mask < 32 {
            st.merge_shfl(mask, w.hpb, n);
            mask <<= 1;
        }
        merge_warps::<D>(&st, w.hpb, warp, warps, lane, gl, grp, geo, &mut emit);
    }
}

/// One prefetched chunk of `geo.steps` warp steps of one KV block: load every K and V
/// vector of the chunk, then compute.
///
/// # Safety
/// As [`attend_group`]; `base` is the element offset of the block's first row.
#[inline(always)]
unsafe fn chunk<T: Storage, const D: usize, const ROW_MASK: bool>(
    w: &Work<T>,
    st: &mut State,
    qs: *const f32,
    base: usize,
    row_stride: usize,
    block_start: usize,
    lo: usize,
    hi: usize,
    step0: usize,
    gl: usize,
    grp: usize,
) {
    let geo = geo::<T, D>();
    let mut kr = [[[0u32; 4]; 2]; CHUNK_VECS];
    let mut vr = [[[0u32; 4]; 2]; CHUNK_VECS];
    let mut valid = [false; CHUNK_VECS];
    // SAFETY: loads only rows of tokens in `lo..hi` of this block and vector slots inside
    // the row; 16-byte offsets as `D * sizeof(T) % 16 == 0`.
    unsafe {
        for s in 0..geo.steps {
            let t = block_start + (step0 + s) * geo.tpi + grp;
            valid[s] = t >= lo && t < hi;
            if valid[s] {
                let row = base + (t - block_start) * row_stride;
                for k in 0..geo.npl {
                    let j = gl + k * geo.g;
                    if j < geo.nv {
                        let off = row + j * geo.vec;
                        kr[s][k] = ld_global_nc_v4(w.k_cache.add(off).cast::<u32>());
                        vr[s][k] = ld_global_nc_v4(w.v_cache.add(off).cast::<u32>());
                    }
                }
            }
        }
        for s in 0..geo.steps {
            let mut kf = [0.0f32; LANE];
            let mut vf = [0.0f32; LANE];
            for k in 0..geo.npl {
                let (a, b) = (T::unpack(kr[s][k]), T::unpack(vr[s][k]));
                for e in 0..geo.vec {
                    kf[k * geo.vec + e] = a[e];
                    vf[k * geo.vec + e] = b[e];
                }
            }
            let mut dots = [0.0f32; MAX_GROUP];
            for (h, dot) in dots.iter_mut().enumerate() {
                if h < w.hpb {
                    let qh = qs.add(h * D);
                    for k in 0..geo.npl {
                        let j = gl + k * geo.g;
                        if j < geo.nv {
                            for e in 0..geo.vec {
                                *dot += *qh.add(j * geo.vec + e) * kf[k * geo.vec + e];
                            }
                        }
                    }
                    let mut mask = geo.g as u32 / 2;
                    while mask > 0 {
                        *dot += shfl_xor_f32(*dot, mask);
                        mask >>= 1;
                    }
                }
            }
            if valid[s] {
                let t = block_start + (step0 + s) * geo.tpi + grp;
                for (h, &dot) in dots.iter().enumerate() {
                    if h < w.hpb && (!ROW_MASK || (w.causal + h).wrapping_sub(t) < w.span) {
                        st.push(h, dot, &vf, geo.npl * geo.vec);
                    }
                }
            }
        }
    }
}

/// Merges the warps' states through shared memory (one barrier) and emits the result.
///
/// # Safety
/// Block-uniform call with dynamic shared memory of
/// [`crate::launch::decode_shared_bytes`] for `D` and the block size.
#[inline(always)]
unsafe fn merge_warps<const D: usize>(
    st: &State,
    hpb: usize,
    warp: usize,
    warps: usize,
    lane: usize,
    gl: usize,
    grp: usize,
    geo: Geo,
    emit: &mut impl FnMut(usize, usize, f32, f32, f32),
) {
    let per_warp = MAX_GROUP * D + 2 * MAX_GROUP;
    let sm = dynamic_shared_mem() as *mut f32;
    // SAFETY: warp `w` writes only its own `per_warp` slice; reads follow the barrier.
    unsafe {
        let mine = sm.add(warp * per_warp);
        for h in 0..MAX_GROUP {
            if h < hpb {
                if lane == 0 {
                    *mine.add(MAX_GROUP * D + h) = st.m[h];
                    *mine.add(MAX_GROUP * D + MAX_GROUP + h) = st.l[h];
                }
                if grp == 0 {
                    for k in 0..geo.npl {
                        let j = gl + k * geo.g;
                        if j < geo.nv {
                            for e in 0..geo.vec {
                                *mine.add(h * D + j * geo.vec + e) = st.acc[h][k * geo.vec + e];
                            }
                        }
                    }
                }
            }
        }
        sync_threads();
        let threads = warps * 32;
        let mut i = thread_idx_x() as usize;
        while i < hpb * D {
            let (h, d) = (i / D, i % D);
            let mut m = f32::NEG_INFINITY;
            for w in 0..warps {
                m = m.max(*sm.add(w * per_warp + MAX_GROUP * D + h));
            }
            let (mut l, mut a) = (0.0f32, 0.0f32);
            for w in 0..warps {
                let p = sm.add(w * per_warp);
                let f = weight(*p.add(MAX_GROUP * D + h), m);
                l += *p.add(MAX_GROUP * D + MAX_GROUP + h) * f;
                a += *p.add(h * D + d) * f;
            }
            emit(h, d, a / l, m, l);
            i += threads;
        }
    }
}

/// The block's work: KV head, first query head and head count from grid x.
#[inline(always)]
unsafe fn work<T, const D: usize>(
    q: *const T,
    k_cache: *const T,
    v_cache: *const T,
    block_table: *const u32,
    num_heads: u32,
    num_kv_heads: u32,
    block_size: u32,
) -> Work<T> {
    let (slices, hpb) = group_split(num_heads, num_kv_heads);
    let group = (num_heads / num_kv_heads) as usize;
    let bx = block_idx_x();
    let (kv_head, slice) = ((bx / slices) as usize, (bx % slices) as usize);
    let first = slice * hpb as usize;
    let head0 = kv_head * group + first;
    Work {
        // SAFETY: the caller's `q` holds the token's `num_heads` rows.
        q: unsafe { q.add(head0 * D) },
        q_stride: D,
        // No row mask in decode (`attend_group::<_, _, false>`).
        causal: 0,
        span: NO_WINDOW,
        k_cache,
        v_cache,
        block_table,
        num_kv_heads: num_kv_heads as usize,
        kv_head,
        block_size: block_size as usize,
        head0,
        hpb: (hpb as usize).min(group - first),
    }
}

/// Decode attention, single pass: `out[s, h] = softmax(q[s, h] . K^T * scale) V` over the
/// `context_lens[s]` cached tokens of sequence `s` (the query sits at position
/// `context_len - 1`), for the query heads of the block's KV group slice (see the module
/// docs for the mapping).
///
/// Sliding window: with `window > 0` only tokens `max(0, context_len - window) ..
/// context_len` are attended; the KV blocks wholly before them are never read (the warps
/// start at the window's first block, whose earlier tokens are masked). `window == 0`:
/// the whole context.
///
/// Grid `(num_kv_heads * slices, num_seqs)` from [`crate::launch::decode_v1`].
/// Shapes: `out`, `q`: `[num_seqs, num_heads, D]`; caches `[num_blocks, block_size,
/// num_kv_heads, D]`; `block_tables`: `[num_seqs, max_blocks_per_seq]`; `context_lens`:
/// `[num_seqs]`. A zero-length context yields zeros. Any context length runs (nothing in
/// shared memory scales with it).
///
/// # Safety
/// All pointers valid for those shapes, K/V caches 16-byte aligned and not written during
/// the launch; `num_heads % num_kv_heads == 0`; every block id in the table entries of
/// the attended tokens (`window_start / block_size .. ceil(context_len / block_size)`) is
/// `< num_blocks` (entries before the window are not read); dynamic shared memory of
/// [`crate::launch::decode_shared_bytes`]; `D <= 256`.
pub unsafe fn paged_attention_v1<T: Storage, const D: usize>(
    out: *mut T,
    q: *const T,
    k_cache: *const T,
    v_cache: *const T,
    block_tables: *const u32,
    context_lens: *const u32,
    num_heads: u32,
    num_kv_heads: u32,
    scale: f32,
    block_size: u32,
    max_blocks_per_seq: u32,
    window: u32,
) {
    let seq = block_idx_y() as usize;
    // SAFETY: per the function contract.
    unsafe {
        let q = q.add(seq * num_heads as usize * D);
        let table = block_tables.add(seq * max_blocks_per_seq as usize);
        let w = work::<T, D>(
            q,
            k_cache,
            v_cache,
            table,
            num_heads,
            num_kv_heads,
            block_size,
        );
        let o = out.add((seq * num_heads as usize + w.head0) * D);
        let ctx = *context_lens.add(seq) as usize;
        if ctx == 0 {
            let mut i = thread_idx_x() as usize;
            while i < w.hpb * D {
                *o.add(i) = T::from_f32(0.0);
                i += block_dim_x() as usize;
            }
            return;
        }
        let start = window_start(ctx, window);
        attend_group::<T, D, false>(w, start, ctx, scale, |h, d, v, _, _| {
            *o.add(h * D + d) = T::from_f32(v)
        });
    }
}

/// Decode attention, split-K pass: the attended tokens `lo .. context_len` (`lo =
/// max(0, context_len - window)` with a sliding window, else 0) are cut in partitions
/// from `lo`: partition `p` (grid z) covers tokens `lo + p * partition_size ..
/// min(lo + (p + 1) * partition_size, context_len)` and writes, per served head, its
/// normalised partial output, its max logit and its sum of exp. So a window needs only
/// `ceil(min(context_len, window) / partition_size)` partitions (the grid of
/// [`crate::launch::plan_decode_window`]), and no block loads a KV block wholly before
/// the window. A partition past the attended tokens that the reduce still reads (`p *
/// partition_size < context_len`, only with a window) writes max logit `-inf` and sum 0
/// (no partial output: the reduce skips it); the others write nothing. Finish with
/// [`crate::attention::paged_attention_v2_reduce`].
///
/// Grid `(num_kv_heads * slices, num_seqs, max_partitions)` from
/// [`crate::launch::decode_v2`]. `tmp_out`: `f32[num_seqs, num_heads,
/// max_partitions, D]`; `max_logits`, `exp_sums`: `f32[num_seqs, num_heads,
/// max_partitions]`; other shapes as [`paged_attention_v1`].
///
/// # Safety
/// As [`paged_attention_v1`], with `partition_size > 0` and `max_partitions` (the grid's
/// z) at least `ceil(n / partition_size)` for the longest attended range `n` of the batch
/// (`min(context_len, window)`, or `context_len` without a window).
pub unsafe fn paged_attention_v2<T: Storage, const D: usize>(
    tmp_out: *mut f32,
    max_logits: *mut f32,
    exp_sums: *mut f32,
    q: *const T,
    k_cache: *const T,
    v_cache: *const T,
    block_tables: *const u32,
    context_lens: *const u32,
    num_heads: u32,
    num_kv_heads: u32,
    scale: f32,
    block_size: u32,
    max_blocks_per_seq: u32,
    partition_size: u32,
    window: u32,
) {
    let (seq, part) = (block_idx_y() as usize, block_idx_z() as usize);
    let parts = crate::device::grid_dim_z() as usize;
    // SAFETY: per the function contract.
    unsafe {
        let ctx = *context_lens.add(seq) as usize;
        let offset = part * partition_size as usize;
        let start = window_start(ctx, window) + offset;
        let q = q.add(seq * num_heads as usize * D);
        let table = block_tables.add(seq * max_blocks_per_seq as usize);
        let w = work::<T, D>(
            q,
            k_cache,
            v_cache,
            table,
            num_heads,
            num_kv_heads,
            block_size,
        );
        let slot0 = seq * num_heads as usize + w.head0;
        if start >= ctx {
            // Past the attended tokens. The reduce reads the first ceil(context_len /
            // partition_size) partitions (at most the grid's): mark those empty.
            let h = thread_idx_x() as usize;
            if offset < ctx && h < w.hpb {
                let slot = (slot0 + h) * parts + part;
                *max_logits.add(slot) = f32::NEG_INFINITY;
                *exp_sums.add(slot) = 0.0;
            }
            return;
        }
        let end = ctx.min(start + partition_size as usize);
        attend_group::<T, D, false>(w, start, end, scale, |h, d, v, m, l| {
            let slot = (slot0 + h) * parts + part;
            *tmp_out.add(slot * D + d) = v;
            if d == 0 {
                *max_logits.add(slot) = m;
                *exp_sums.add(slot) = l;
            }
        });
    }
}
