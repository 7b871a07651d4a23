//! A paged KV cache with shuffled physical blocks and the f64 attention reference.

use super::{poisoned, TestRng, BF16};
use gpu_kernels::attention::paged_attention_v2_reduce;
use gpu_kernels::decode::paged_attention_v2;
use gpu_kernels::device::emu::launch;
use gpu_kernels::launch::{self as geom, LaunchConfig};
use gpu_kernels::prefill_mma::prefill_attention_mma;
use gpu_kernels::Storage;

/// A paged KV cache with ragged sequences placed in shuffled physical blocks.
pub struct Paged<T> {
    pub block_size: usize,
    pub kv_heads: usize,
    pub max_blocks: usize,
    pub k: Vec<T>,
    pub v: Vec<T>,
    pub tables: Vec<u32>,
    pub ctx: Vec<u32>,
}

impl<T: Storage> Paged<T> {
    pub fn new(
        r: &mut TestRng,
        ctx: &[u32],
        block_size: usize,
        kv_heads: usize,
        d: usize,
        max_blocks: usize,
    ) -> Self {
        let used: usize = ctx.iter().map(|&c| (c as usize).div_ceil(block_size)).sum();
        let num_blocks = used + 3;
        let perm = r.shuffled(num_blocks);
        let mut next = 0;
        let mut tables = Vec::with_capacity(ctx.len() * max_blocks);
        for &c in ctx {
            let need = (c as usize).div_ceil(block_size);
            assert!(need <= max_blocks);
            for j in 0..max_blocks {
                // Entries past the context point at random (valid, wrong) blocks.
                tables.push(if j < need {
                    next += 1;
                    perm[next - 1]
                } else {
                    r.range(0, num_blocks - 1) as u32
                });
            }
        }
        let n = num_blocks * block_size * kv_heads * d;
        Self {
            block_size,
            kv_heads,
            max_blocks,
            k: r.vec(n, -1.0, 1.0),
            v: r.vec(n, -1.0, 1.0),
            tables,
            ctx: ctx.to_vec(),
        }
    }

    pub fn row(&self, s: usize, t: usize, kvh: usize, d: usize) -> usize {
        let blk = self.tables[s * self.max_blocks + t / self.block_size] as usize;
        ((blk * self.block_size + t % self.block_size) * self.kv_heads + kvh) * d
    }

    /// f64 softmax attention of query row `q` over tokens `0..len` of seq `s`.
    #[allow(clippy::too_many_arguments)] // mirrors the kernel's problem description
    pub fn reference(
        &self,
        q: &[T],
        s: usize,
        head: usize,
        heads: usize,
        len: usize,
        scale: f64,
        d: usize,
    ) -> Vec<f64> {
        self.reference_range(q, s, head, heads, 0, len, scale, d)
    }

    /// f64 softmax attention of query row `q` over tokens `lo..len` of seq `s` (a
    /// sliding window: see [`window_lo`]).
    #[allow(clippy::too_many_arguments)] // mirrors the kernel's problem description
    pub fn reference_range(
        &self,
        q: &[T],
        s: usize,
        head: usize,
        heads: usize,
        lo: usize,
        len: usize,
        scale: f64,
        d: usize,
    ) -> Vec<f64> {
        assert!(lo < len, "empty key range {lo}..{len}");
        let kvh = head / (heads / self.kv_heads);
        let logits: Vec<f64> = (lo..len)
            .map(|t| {
                let k = &self.k[self.row(s, t, kvh, d)..][..d];
                scale
                    * q.iter()
                        .zip(k)
                        .map(|(a, b)| a.to_f32() as f64 * b.to_f32() as f64)
                        .sum::<f64>()
            })
            .collect();
        let m = logits.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let p: Vec<f64> = logits.iter().map(|l| (l - m).exp()).collect();
        let z: f64 = p.iter().sum();
        (0..d)
            .map(|i| {
                (lo..len)
                    .map(|t| p[t - lo] * self.v[self.row(s, t, kvh, d) + i].to_f32() as f64)
                    .sum::<f64>()
                    / z
            })
            .collect()
    }
}

/// The first key a query at position `pos` sees with sliding window `window` (0: no
/// window): `max(0, pos + 1 - window)`, as the CPU engine's attention.
pub fn window_lo(pos: usize, window: u32) -> usize {
    if window == 0 {
        0
    } else {
        (pos + 1).saturating_sub(window as usize)
    }
}

/// A split-K decode plan's launch geometry and partitioning.
pub struct V2Plan {
    pub attention: LaunchConfig,
    pub reduce: LaunchConfig,
    pub partition_size: u32,
    pub max_partitions: u32,
}

/// Launches `paged_attention_v2` then its reduce on the emulator, as an
/// executor would for `plan`, over bf16 `kv` and `q` (`[seqs, heads, D]`);
/// the scratch starts as NaN and the output poisoned, so a slot the kernels
/// skip shows. Returns the output.
pub fn run_v2<const D: usize>(
    kv: &Paged<BF16>,
    q: &[BF16],
    heads: usize,
    scale: f32,
    plan: &V2Plan,
    window: u32,
) -> Vec<BF16> {
    let seqs = kv.ctx.len();
    let slots = seqs * heads * plan.max_partitions as usize;
    let (mut tmp, mut ml, mut es) = (
        vec![f32::NAN; slots * D],
        vec![f32::NAN; slots],
        vec![f32::NAN; slots],
    );
    let mut out = poisoned::<BF16>(seqs * heads * D);
    let (tp, mp, ep, o) = (
        tmp.as_mut_ptr(),
        ml.as_mut_ptr(),
        es.as_mut_ptr(),
        out.as_mut_ptr(),
    );
    let (qp, kp, vp, bt, cl) = (
        q.as_ptr(),
        kv.k.as_ptr(),
        kv.v.as_ptr(),
        kv.tables.as_ptr(),
        kv.ctx.as_ptr(),
    );
    let (ps, mps) = (plan.partition_size, plan.max_partitions);
    // SAFETY: buffers sized for the plan; they outlive both launches.
    unsafe {
        launch(plan.attention, || {
            paged_attention_v2::<BF16, D>(
                tp,
                mp,
                ep,
                qp,
                kp,
                vp,
                bt,
                cl,
                heads as u32,
                kv.kv_heads as u32,
                scale,
                kv.block_size as u32,
                kv.max_blocks as u32,
                ps,
                window,
            )
        });
        launch(plan.reduce, || {
            paged_attention_v2_reduce::<BF16, D>(o, tp, mp, ep, cl, ps, mps)
        });
    }
    out
}

/// Launches the tensor-core prefill (`prefill_attention_mma`) on the
/// emulator over `kv` and the query rows `q` (`[tokens, heads, D]`, sequence
/// `s`'s rows from `query_start_loc[s]`), `threads` per block; returns the
/// output, poisoned where the kernel writes nothing.
pub fn run_prefill_mma<T: Storage, const D: usize>(
    kv: &Paged<T>,
    q: &[T],
    query_start_loc: &[u32],
    heads: usize,
    scale: f32,
    threads: u32,
    window: u32,
) -> Vec<T> {
    let (tokens, seqs) = (q.len() / (heads * D), kv.ctx.len());
    let mut out = poisoned::<T>(tokens * heads * D);
    let (o, qp, kp, vp, bt, cl, ql) = (
        out.as_mut_ptr(),
        q.as_ptr(),
        kv.k.as_ptr(),
        kv.v.as_ptr(),
        kv.tables.as_ptr(),
        kv.ctx.as_ptr(),
        query_start_loc.as_ptr(),
    );
    let cfg = geom::prefill_mma(tokens as u32, seqs as u32, heads as u32, D as u32, threads);
    // SAFETY: buffers sized as the kernel's contract requires; they outlive the launch.
    unsafe {
        launch(cfg, || {
            prefill_attention_mma::<T, D>(
                o,
                qp,
                kp,
                vp,
                bt,
                cl,
                ql,
                seqs as u32,
                kv.kv_heads as u32,
                scale,
                kv.block_size as u32,
                kv.max_blocks as u32,
                window,
            )
        })
    };
    out
}
