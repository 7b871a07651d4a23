//! The attention launch of one layer: the decode kernels (single pass or
//! split-K, as `gpu_kernels::launch::plan_decode_window` chooses per step and
//! layer) when every
//! sequence has one query token, else the prefill kernel over the whole mixed
//! batch: the tensor-core FlashAttention-2 kernel (`prefill_attention_mma`) for
//! bf16/f16 at head sizes that are multiples of 16, the streaming one otherwise
//! (`gpu_kernels::launch::choose_prefill`, one rule). Split from `forward.rs` to keep the step's orchestration short.
//!
//! Cost: one launch (v1, prefill) or two (v2 + reduce) per layer; the split-K
//! scratch grows to the largest batch seen and is kept in [`Scratch`].

use super::{ensure, u, Kernels, Meta, Scratch};
use crate::executor::gpu::device::{DevPtr, Device, ThreadsFor};
use crate::executor::gpu::GpuError;
use crate::executor::ForwardBatch;
use crate::model::Dims;
use gpu_kernels::{launch as geom, KernelArg};

/// One layer's attention buffers and settings.
pub(super) struct AttnArgs {
    /// Rotated queries, `[tokens, heads, head_dim]`.
    pub q: DevPtr,
    /// `[tokens, heads, head_dim]`.
    pub out: DevPtr,
    /// The layer's K and V caches.
    pub kc: DevPtr,
    pub vc: DevPtr,
    /// Multiplies `q . k`.
    pub scale: f32,
    /// Sliding window (`None`: all keys up to the query's position).
    pub window: Option<usize>,
}

/// Attention of one layer: decode kernels when every sequence has one query
/// token, else the prefill kernel over the whole (mixed) batch.
///
/// # Safety
/// As [`super::run`]: `a.q`/`a.out` hold the batch's tokens, `a.kc`/`a.vc`
/// a layer's caches.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn attention(
    dev: &mut dyn Device,
    k: &Kernels,
    s: &mut Scratch,
    d: &Dims,
    m: &Meta,
    batch: &ForwardBatch,
    bs: usize,
    a: &AttnArgs,
) -> Result<(), GpuError> {
    let (n, seqs) = (batch.token_ids.len(), batch.seqs.len());
    let (hd, q, out, kc, vc) = (d.head_dim, a.q, a.out, a.kc, a.vc);
    let scale = KernelArg::F32(a.scale);
    // 0: no window (every kernel's convention).
    let window = a.window.unwrap_or(0) as u32;
    let threads = dev.threads(ThreadsFor::Attention);
    let common = [kc.arg(), vc.arg(), m.tables.arg(), m.context_lens.arg()];
    if m.all_decode {
        let shape = geom::DecodeShape {
            num_seqs: seqs as u32,
            num_heads: d.heads as u32,
            num_kv_heads: d.kv_heads as u32,
            head_dim: hd as u32,
            max_context_len: m.max_context as u32,
            total_context_len: m.total_context as u64,
            block_size: bs as u32,
            sm_count: dev.sm_count(),
            threads,
        };
        let plan = geom::plan_decode_window(shape, window);
        let [kc, vc, tables, lens] = common;
        let (cfg, reduce, partition_size, max_partitions) = match plan {
            geom::DecodePlan::V1(cfg) => {
                let args = [
                    out.arg(),
                    q.arg(),
                    kc,
                    vc,
                    tables,
                    lens,
                    u(d.heads),
                    u(d.kv_heads),
                    scale,
                    u(bs),
                    u(m.max_blocks),
                    KernelArg::U32(window),
                ];
                // SAFETY: forwarded to the caller; the plan's geometry and
                // shared memory are the kernel's (no context-length limit).
                return unsafe { dev.launch(k.paged_v1, cfg, &args) };
            }
            geom::DecodePlan::V2 {
                attention,
                reduce,
                partition_size,
                max_partitions,
            } => (
                attention,
                reduce,
                partition_size as usize,
                max_partitions as usize,
            ),
        };
        let slots = seqs * d.heads * max_partitions;
        let tmp = ensure(dev, &mut s.split_out, slots * hd * 4)?;
        let maxl = ensure(dev, &mut s.split_max, slots * 4)?;
        let sums = ensure(dev, &mut s.split_sum, slots * 4)?;
        let args = [
            tmp.arg(),
            maxl.arg(),
            sums.arg(),
            q.arg(),
            kc,
            vc,
            tables,
            lens,
            u(d.heads),
            u(d.kv_heads),
            scale,
            u(bs),
            u(m.max_blocks),
            u(partition_size),
            KernelArg::U32(window),
        ];
        // SAFETY: forwarded; scratch sized for `max_partitions` partitions per
        // (seq, head), as the plan's grid writes.
        unsafe { dev.launch(k.paged_v2, cfg, &args) }?;
        let args = [
            out.arg(),
            tmp.arg(),
            maxl.arg(),
            sums.arg(),
            m.context_lens.arg(),
            u(partition_size),
            u(max_partitions),
        ];
        // SAFETY: as above, reading what v2 wrote.
        return unsafe { dev.launch(k.paged_v2_reduce, reduce, &args) };
    }
    // One rule (`geom::choose_prefill`, applied when the kernels were resolved):
    // tensor cores for bf16/f16 at head sizes that are multiples of 16.
    let cfg = match k.prefill_kind {
        geom::PrefillKernel::Mma => {
            geom::prefill_mma(n as u32, seqs as u32, d.heads as u32, hd as u32, threads)
        }
        geom::PrefillKernel::Streaming => {
            geom::prefill_attention(n as u32, d.heads as u32, m.max_context as u32, threads)
        }
    };
    let [kc, vc, tables, lens] = common;
    let args = [
        out.arg(),
        q.arg(),
        kc,
        vc,
        tables,
        lens,
        m.query_start.arg(),
        u(seqs),
        u(d.kv_heads),
        scale,
        u(bs),
        u(m.max_blocks),
        KernelArg::U32(window),
    ];
    // SAFETY: forwarded; query_start_loc has `seqs + 1` entries from 0, each
    // span's query is its last tokens (validated).
    unsafe { dev.launch(k.prefill, cfg, &args) }
}
