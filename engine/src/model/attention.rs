//! Paged attention on the CPU: K/V writes through the slot mapping and
//! causal attention reading K/V through each sequence's block table.
//!
//! Invariants (checked by `batch::validate` before anything runs): each
//! sequence's tokens are consecutive in the batch, token `i` of a sequence
//! with `query_len` q and `context_len` c sits at position `c - q + i`, its
//! K/V slot lies in the block its block table names for that position, and
//! the block table covers `c` tokens. A query at position `p` attends to
//! positions `0..=p` of its own sequence (causal mask), or to
//! `p + 1 - w ..= p` with a sliding window `w` (Gemma 3's local layers; the
//! blocks before the window stay allocated, they are only masked). Query
//! head `h` reads KV head `h / (num_heads / num_kv_heads)` (GQA).
//!
//! Work is split over (sequence, group of query heads sharing one KV head,
//! chunk of `QUERY_CHUNK` query tokens) tasks on the [`par`] pool; each
//! task writes a disjoint part of the output. A group holds up to
//! [`attn_rows::MAX_HEADS`] heads, fewer when a batch would otherwise give
//! the pool too few tasks (batch 1 on a model with one KV head). Its heads
//! read each key and value once (`attn_rows`). Where there are many tasks
//! (a decode batch), each claim on the pool takes a run of consecutive
//! ones, so a sequence's KV heads, which share pages, go to one thread.
//! Cost per query: O(p x head_dim) flops per head and O(p) scratch per
//! head (thread-local, reused). Softmax is the max-subtracted form with f32
//! accumulation.

use super::attn_rows;
use super::kv_cache::{Kv, KvElem, KvGeometry, LayerKv};
use super::ops::softmax_in_place;
use super::par;
use engine_core::SeqSpan;
use std::cell::RefCell;

/// Query tokens per attention task (balances long prefills over cores).
const QUERY_CHUNK: usize = 16;

/// Claims per thread the attention tasks are grouped into (see
/// `run_tasks`); fewer tasks than `threads * RUNS_PER_THREAD` run one per
/// claim.
const RUNS_PER_THREAD: usize = 8;

/// One unit of attention work.
#[derive(Debug, Clone, Copy)]
pub struct AttnTask {
    seq: usize,
    /// Row of the sequence's first token in the batch.
    first_row: usize,
    /// First query head; the task's heads are `head..head + heads`, all
    /// reading one KV head.
    head: usize,
    heads: usize,
    /// Query range inside the sequence.
    q_begin: usize,
    q_end: usize,
}

/// The task list for a batch; built once per forward pass, used by every
/// layer. `num_heads` must be a multiple of `num_kv_heads` (checked at
/// model load).
pub fn plan(seqs: &[SeqSpan], num_heads: usize, num_kv_heads: usize) -> Vec<AttnTask> {
    let group = num_heads / num_kv_heads.max(1);
    let chunks: usize = seqs.iter().map(|s| s.query_len.div_ceil(QUERY_CHUNK)).sum();
    // Heads per task: the whole group up to MAX_HEADS, halved while the
    // pool would get fewer than two tasks per thread.
    let mut per = group.clamp(1, attn_rows::MAX_HEADS);
    let want = 2 * par::threads();
    while per > 1 && chunks * num_kv_heads * group.div_ceil(per) < want {
        per = per.div_ceil(2);
    }
    let mut tasks = Vec::new();
    let mut first_row = 0;
    for (seq, span) in seqs.iter().enumerate() {
        for kv in 0..num_kv_heads {
            let group_end = (kv + 1) * group;
            for head in (kv * group..group_end).step_by(per) {
                let heads = per.min(group_end - head);
                let mut q = 0;
                while q < span.query_len {
                    let q_end = (q + QUERY_CHUNK).min(span.query_len);
                    tasks.push(AttnTask {
                        seq,
                        first_row,
                        head,
                        heads,
                        q_begin: q,
                        q_end,
                    });
                    q = q_end;
                }
            }
        }
        first_row += span.query_len;
    }
    tasks
}

#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: each task writes only the `head_dim` elements of the (row, head)
// pairs it owns; tasks own disjoint pairs (see `plan`).
unsafe impl Send for OutPtr {}
// SAFETY: as above; the pointer value itself is only read concurrently.
unsafe impl Sync for OutPtr {}

impl OutPtr {
    /// The pointer (a method, so closures capture the `Send` wrapper whole).
    fn get(self) -> *mut f32 {
        self.0
    }
}

/// Per-layer attention settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttnParams {
    /// Multiplies `q . k` (usually `head_dim ^ -0.5`).
    pub scale: f32,
    /// Sliding window: a query at `p` sees keys `p + 1 - w ..= p`; `None` = all.
    pub window: Option<usize>,
    /// Lets the 512-bit loops run where the CPU has them (the same bits;
    /// see [`attn_rows::scores`]): the model's kernel family decides, so
    /// forcing AVX2 measures the AVX2 path whole.
    pub wide: bool,
}

impl AttnParams {
    /// Full causal attention scaled by `head_dim ^ -0.5`.
    pub fn causal(head_dim: usize) -> Self {
        Self {
            scale: 1.0 / (head_dim as f32).sqrt(),
            window: None,
            wide: true,
        }
    }
}

/// Per-thread scratch of one query row: its keys' pool addresses and
/// scores.
#[derive(Default)]
struct RowScratch {
    addrs: Vec<usize>,
    scores: Vec<f32>,
}

thread_local! {
    static SCRATCH: RefCell<RowScratch> = RefCell::new(RowScratch::default());
}

/// Causal paged attention for one layer.
///
/// `q` holds each token's query heads (`num_heads * head_dim`) at the start
/// of rows `q_stride` apart (rotary already applied); `out` is
/// `[tokens, num_heads * head_dim]`.
#[allow(clippy::too_many_arguments)]
pub fn paged_attention(
    params: AttnParams,
    q: &[f32],
    q_stride: usize,
    layer: &LayerKv,
    geom: &KvGeometry,
    seqs: &[SeqSpan],
    tasks: &[AttnTask],
    num_heads: usize,
    out: &mut [f32],
) {
    let hd = geom.head_dim;
    let out_stride = num_heads * hd;
    let rows = seqs.iter().map(|s| s.query_len).sum::<usize>();
    assert!(
        out.len() >= rows * out_stride && q.len() >= rows.saturating_sub(1) * q_stride + out_stride
    );
    let out_ptr = OutPtr(out.as_mut_ptr());
    match layer {
        LayerKv::F32(kv) => run_tasks(
            params, q, q_stride, kv, geom, seqs, tasks, num_heads, out_ptr,
        ),
        LayerKv::F16(kv) => run_tasks(
            params, q, q_stride, kv, geom, seqs, tasks, num_heads, out_ptr,
        ),
    }
}

/// [`paged_attention`] on a pool of one element type.
#[allow(clippy::too_many_arguments)]
fn run_tasks<E: KvElem>(
    params: AttnParams,
    q: &[f32],
    q_stride: usize,
    layer: &Kv<E>,
    geom: &KvGeometry,
    seqs: &[SeqSpan],
    tasks: &[AttnTask],
    num_heads: usize,
    out_ptr: OutPtr,
) {
    let out_stride = num_heads * geom.head_dim;
    // Runs of consecutive tasks per claim where there are many: a
    // sequence's KV heads share the pool's pages (a slot holds them side
    // by side), so one thread walking them in turn finds the lines the
    // hardware fetched for the previous head.
    let run = (tasks.len() / (par::threads() * RUNS_PER_THREAD)).max(1);
    par::for_each(tasks.len().div_ceil(run), |r| {
        SCRATCH.with(|cell| {
            let mut scratch = cell.borrow_mut();
            for task in &tasks[r * run..((r + 1) * run).min(tasks.len())] {
                attend_task(
                    params,
                    q,
                    q_stride,
                    layer,
                    geom,
                    &seqs[task.seq],
                    task,
                    num_heads,
                    out_ptr,
                    out_stride,
                    &mut scratch,
                );
            }
        });
    });
}

#[allow(clippy::too_many_arguments)]
fn attend_task<E: KvElem>(
    params: AttnParams,
    q: &[f32],
    q_stride: usize,
    layer: &Kv<E>,
    geom: &KvGeometry,
    span: &SeqSpan,
    task: &AttnTask,
    num_heads: usize,
    out_ptr: OutPtr,
    out_stride: usize,
    scratch: &mut RowScratch,
) {
    let hd = geom.head_dim;
    let bs = geom.block_size;
    let te = geom.token_elems();
    let kv_head = task.head / (num_heads / geom.num_kv_heads);
    let past = span.context_len - span.query_len;
    let keys = KeyWalk {
        table: &span.block_table,
        bs,
        te,
        head_off: kv_head * hd,
    };
    let width = task.heads * hd;
    for i in task.q_begin..task.q_end {
        let row = task.first_row + i;
        let n_keys = past + i + 1;
        let first = params.window.map_or(0, |w| n_keys.saturating_sub(w));
        let qv = &q[row * q_stride + task.head * hd..][..width];
        let RowScratch { addrs, scores } = scratch;
        addrs.clear();
        keys.each(first, n_keys, |_, at| addrs.push(at));
        scores.resize(task.heads * addrs.len(), 0.0);
        attn_rows::scores(qv, hd, &layer.k, addrs, params.scale, scores, params.wide);
        // The first values' lines arrive during the softmax.
        attn_rows::prefetch_first(&layer.v, addrs, hd);
        for head_scores in scores.chunks_exact_mut(addrs.len().max(1)) {
            softmax_in_place(head_scores);
        }
        // SAFETY: (row, task.head..task.head + task.heads) is owned by this
        // task alone (tasks are disjoint in (sequence row, head)); the
        // range lies inside `out` (asserted in `paged_attention`), which is
        // exclusively borrowed for the duration of the parallel section.
        let o = unsafe {
            std::slice::from_raw_parts_mut(
                out_ptr.get().add(row * out_stride + task.head * hd),
                width,
            )
        };
        attn_rows::weighted_sum(scores, &layer.v, addrs, hd, o, params.wide);
    }
}

/// Walks the pool addresses of one KV head's keys (or values) through a
/// block table, block by block (no division per key).
struct KeyWalk<'a> {
    table: &'a [engine_core::BlockId],
    bs: usize,
    te: usize,
    /// Offset of the KV head inside a token's slot.
    head_off: usize,
}

impl KeyWalk<'_> {
    /// Calls `f(j, address)` for positions `first..end`, in order.
    fn each(&self, first: usize, end: usize, mut f: impl FnMut(usize, usize)) {
        let mut j = first;
        let mut b = first / self.bs.max(1);
        while j < end {
            let start = b * self.bs;
            let base = self.table[b].0 as usize * self.bs * self.te + self.head_off;
            let stop = (start + self.bs).min(end);
            for jj in j..stop {
                f(jj, base + (jj - start) * self.te);
            }
            j = stop;
            b += 1;
        }
    }
}
