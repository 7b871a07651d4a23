//! Host-side problems of the GPU benchmark: a paged bf16 KV cache with shuffled block
//! tables, the f64 references the kernels are validated against, and the byte counts
//! that turn a time into achieved bandwidth.
//!
//! Invariants: every context fits the block table (`ceil(ctx / block_size) <=
//! max_blocks`); every table entry is a valid block (entries past a context point at
//! random valid blocks, so a kernel reading past the context reads wrong data, not out
//! of bounds); the blocks used by the contexts are distinct. The attention reference is
//! O(seqs * heads * ctx * D).

use half::bf16;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Head size of the validation problems and vLLM's shape (the common Llama head).
pub const D: usize = 128;

/// A seeded RNG; the seed goes into every mismatch message (`GK_SEED` replays it).
pub struct BenchRng {
    /// The seed.
    pub seed: u64,
    rng: StdRng,
}

impl BenchRng {
    /// Seeds from `GK_SEED` or the clock.
    pub fn new() -> Self {
        let seed = std::env::var("GK_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap_or_default();
                now.as_nanos() as u64 ^ (u64::from(std::process::id()) << 32)
            });
        println!("seed {seed} (replay with GK_SEED={seed})");
        Self {
            seed,
            rng: StdRng::seed_from_u64(seed),
        }
    }

    /// `n` values uniform in `[lo, hi)`, rounded to bf16.
    pub fn vec(&mut self, n: usize, lo: f32, hi: f32) -> Vec<bf16> {
        (0..n)
            .map(|_| bf16::from_f32(self.rng.gen_range(lo..hi)))
            .collect()
    }

    /// A random permutation of `0..n`.
    pub fn shuffled(&mut self, n: usize) -> Vec<u32> {
        let mut v: Vec<u32> = (0..n as u32).collect();
        for i in (1..n).rev() {
            let j = self.rng.gen_range(0..=i);
            v.swap(i, j);
        }
        v
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: usize, hi: usize) -> usize {
        self.rng.gen_range(lo..=hi)
    }
}

/// Shape of a decode-attention problem.
#[derive(Clone, Debug)]
pub struct DecodeShape {
    /// Context length of each sequence.
    pub ctx: Vec<u32>,
    /// Query heads.
    pub heads: usize,
    /// KV heads (divides `heads`).
    pub kv_heads: usize,
    /// Tokens per KV block.
    pub block_size: usize,
    /// Head size.
    pub d: usize,
    /// Sliding window (0: none): the query at position `ctx - 1` attends the last
    /// `min(ctx, window)` tokens.
    pub window: u32,
}

impl DecodeShape {
    /// vLLM's benchmark shape: batch 8, context 4096, 64 query / 8 KV heads, block 16.
    pub fn vllm() -> Self {
        Self {
            ctx: vec![4096; 8],
            heads: 64,
            kv_heads: 8,
            block_size: 16,
            d: D,
            window: 0,
        }
    }

    /// SmolLM2-135M at batch 256: 9 query / 3 KV heads, head 64, ragged contexts
    /// 256..=1024.
    pub fn smollm2(r: &mut BenchRng) -> Self {
        Self {
            ctx: (0..256).map(|_| r.range(256, 1024) as u32).collect(),
            heads: 9,
            kv_heads: 3,
            block_size: 16,
            d: 64,
            window: 0,
        }
    }

    /// Llama-3-8B at batch 64, context 2048: 32 query / 8 KV heads, head 128.
    pub fn llama3_8b() -> Self {
        Self {
            ctx: vec![2048; 64],
            heads: 32,
            kv_heads: 8,
            block_size: 16,
            d: 128,
            window: 0,
        }
    }

    /// A Gemma-3-270M sliding-window layer at batch 64, context 4096: 4 query / 1 KV
    /// heads, head 256, window 512.
    pub fn gemma3_local() -> Self {
        Self {
            ctx: vec![4096; 64],
            heads: 4,
            kv_heads: 1,
            block_size: 16,
            d: 256,
            window: 512,
        }
    }

    /// A small validation shape with ragged contexts: one of length 1, one exactly at a
    /// block boundary, one random, one at `max_ctx` (a multiple of the block size).
    pub fn ragged(r: &mut BenchRng, heads: usize, kv_heads: usize, max_ctx: usize) -> Self {
        let block_size = 16;
        let max_blocks = max_ctx / block_size;
        Self {
            ctx: vec![
                1,
                (block_size * r.range(1, max_blocks - 1)) as u32,
                r.range(2, max_ctx - 1) as u32,
                max_ctx as u32,
            ],
            heads,
            kv_heads,
            block_size,
            d: D,
            window: 0,
        }
    }

    /// Tokens a decode query with context `ctx` attends: `ctx`, or `min(ctx, window)`.
    pub fn attended(&self, ctx: u32) -> u32 {
        if self.window == 0 {
            ctx
        } else {
            ctx.min(self.window)
        }
    }

    /// Longest context.
    pub fn max_ctx(&self) -> u32 {
        self.ctx.iter().copied().max().unwrap_or(0)
    }

    /// Block-table width: blocks of the longest context.
    pub fn max_blocks(&self) -> usize {
        (self.max_ctx() as usize).div_ceil(self.block_size).max(1)
    }

    /// Bytes a decode step must move at least: each sequence's attended K and V rows
    /// once (all query heads of a KV head share them), the query and the output.
    pub fn bytes_moved(&self) -> u64 {
        let elem = std::mem::size_of::<bf16>() as u64;
        let tokens: u64 = self.ctx.iter().map(|&c| u64::from(self.attended(c))).sum();
        let kv = 2 * tokens * (self.kv_heads * self.d) as u64 * elem;
        let q_out = 2 * (self.ctx.len() * self.heads * self.d) as u64 * elem;
        kv + q_out
    }
}

/// A decode-attention problem in host memory.
pub struct DecodeProblem {
    /// The shape.
    pub shape: DecodeShape,
    /// `[seqs, heads, D]`.
    pub q: Vec<bf16>,
    /// `[num_blocks, block_size, kv_heads, D]`.
    pub k: Vec<bf16>,
    /// Same layout as `k`.
    pub v: Vec<bf16>,
    /// `[seqs, max_blocks]`.
    pub tables: Vec<u32>,
    /// `1 / sqrt(D)`.
    pub scale: f32,
}

impl DecodeProblem {
    /// Random q/K/V in `[-1, 1)`, blocks placed through a shuffled block table.
    pub fn random(r: &mut BenchRng, shape: DecodeShape) -> Self {
        let (bs, max_blocks) = (shape.block_size, shape.max_blocks());
        let used: usize = shape.ctx.iter().map(|&c| (c as usize).div_ceil(bs)).sum();
        let num_blocks = used + 3;
        let perm = r.shuffled(num_blocks);
        let mut next = 0;
        let mut tables = Vec::with_capacity(shape.ctx.len() * max_blocks);
        for &c in &shape.ctx {
            let need = (c as usize).div_ceil(bs);
            for j in 0..max_blocks {
                tables.push(if j < need {
                    next += 1;
                    perm[next - 1]
                } else {
                    r.range(0, num_blocks - 1) as u32
                });
            }
        }
        let n = num_blocks * bs * shape.kv_heads * shape.d;
        let q = r.vec(shape.ctx.len() * shape.heads * shape.d, -1.0, 1.0);
        Self {
            k: r.vec(n, -1.0, 1.0),
            v: r.vec(n, -1.0, 1.0),
            q,
            tables,
            scale: 1.0 / (shape.d as f32).sqrt(),
            shape,
        }
    }

    fn row(&self, s: usize, t: usize, kvh: usize) -> usize {
        let (bs, kv_heads) = (self.shape.block_size, self.shape.kv_heads);
        let blk = self.tables[s * self.shape.max_blocks() + t / bs] as usize;
        ((blk * bs + t % bs) * kv_heads + kvh) * self.shape.d
    }

    /// f64 softmax attention of every (sequence, head): `[seqs, heads, D]`.
    pub fn reference(&self) -> Vec<f64> {
        let heads = self.shape.heads;
        let rows: Vec<(usize, usize)> = (0..self.shape.ctx.len())
            .flat_map(|s| (0..heads).map(move |h| (s, h)))
            .collect();
        self.reference_rows(&rows)
    }

    /// f64 softmax attention of the listed (sequence, head) rows, concatenated
    /// (`D` values each), over each sequence's attended tokens (the shape's window).
    /// O(rows * ctx * D).
    pub fn reference_rows(&self, rows: &[(usize, usize)]) -> Vec<f64> {
        let (heads, kv_heads, d) = (self.shape.heads, self.shape.kv_heads, self.shape.d);
        let mut out = Vec::with_capacity(rows.len() * d);
        for &(s, h) in rows {
            let q = &self.q[(s * heads + h) * d..][..d];
            let kvh = h / (heads / kv_heads);
            let len = self.shape.ctx[s];
            let lo = (len - self.shape.attended(len)) as usize;
            out.extend(self.attend(q, s, kvh, lo, len as usize));
        }
        out
    }

    /// f64 softmax attention of query row `q` over tokens `0..len` of sequence `s`, KV
    /// head `kvh` (a causal prefill row at position `len - 1`, no window).
    pub fn reference_prefix(&self, q: &[bf16], s: usize, kvh: usize, len: usize) -> Vec<f64> {
        self.attend(q, s, kvh, 0, len)
    }

    /// Attention over tokens `lo..len`.
    fn attend(&self, q: &[bf16], s: usize, kvh: usize, lo: usize, len: usize) -> Vec<f64> {
        let d = self.shape.d;
        if len == 0 {
            return vec![0.0; d];
        }
        let logits: Vec<f64> = (lo..len)
            .map(|t| {
                let k = &self.k[self.row(s, t, kvh)..][..d];
                f64::from(self.scale)
                    * q.iter()
                        .zip(k)
                        .map(|(a, b)| f64::from(a.to_f32()) * f64::from(b.to_f32()))
                        .sum::<f64>()
            })
            .collect();
        let m = logits.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let p: Vec<f64> = logits.iter().map(|l| (l - m).exp()).collect();
        let z: f64 = p.iter().sum();
        (0..d)
            .map(|i| {
                (lo..len)
                    .map(|t| p[t - lo] * f64::from(self.v[self.row(s, t, kvh) + i].to_f32()))
                    .sum::<f64>()
                    / z
            })
            .collect()
    }
}

/// f64 RMSNorm of `[rows, hidden]` with weight `[hidden]`.
pub fn rms_norm_reference(x: &[bf16], w: &[bf16], eps: f64) -> Vec<f64> {
    let hidden = w.len();
    x.chunks_exact(hidden)
        .flat_map(|row| {
            let ms = row
                .iter()
                .map(|v| f64::from(v.to_f32()).powi(2))
                .sum::<f64>()
                / hidden as f64;
            let inv = 1.0 / (ms + eps).sqrt();
            row.iter()
                .zip(w)
                .map(move |(v, g)| f64::from(v.to_f32()) * inv * f64::from(g.to_f32()))
        })
        .collect()
}

/// Checks `|got - want| <= atol + rtol * |want|` element-wise with vLLM's bf16
/// tolerances (atol 1e-3, rtol 1.6e-2); NaN fails. Reports the first mismatch.
pub fn check_close(what: &str, seed: u64, got: &[bf16], want: &[f64]) -> Result<(), String> {
    check_close_atol(what, seed, got, want, 1e-3)
}

/// [`check_close`] with absolute tolerance `atol` (the tensor-core prefill adds 2^-9 for
/// P rounded to bf16 before the PV product).
pub fn check_close_atol(
    what: &str,
    seed: u64,
    got: &[bf16],
    want: &[f64],
    atol: f64,
) -> Result<(), String> {
    const RTOL: f64 = 1.6e-2;
    if got.len() != want.len() {
        return Err(format!(
            "{what}: {} elements, want {} (seed {seed})",
            got.len(),
            want.len()
        ));
    }
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let g = f64::from(g.to_f32());
        if (g - w).abs() > atol + RTOL * w.abs() || g.is_nan() {
            return Err(format!(
                "{what}: element {i}: got {g}, want {w} (atol {atol}, rtol {RTOL}; seed {seed})"
            ));
        }
    }
    Ok(())
}

/// `n` bf16 NaNs: an output buffer whose unwritten elements fail [`check_close`].
pub fn poisoned(n: usize) -> Vec<bf16> {
    vec![bf16::from_f32(f32::NAN); n]
}

/// `reshape_and_cache` problem: `tokens` new K/V rows written to distinct random slots
/// of a cache of `num_blocks * block_size` slots.
pub struct CacheWrite {
    /// `[tokens, kv_heads * D]`.
    pub key: Vec<bf16>,
    /// Same layout as `key`.
    pub value: Vec<bf16>,
    /// Destination slot of each token (distinct).
    pub slots: Vec<u32>,
    /// Row width `kv_heads * D`.
    pub row: usize,
    /// Slots in the cache.
    pub num_slots: usize,
}

impl CacheWrite {
    /// Random rows into the first `tokens` slots of a random permutation.
    pub fn random(r: &mut BenchRng, tokens: usize, kv_heads: usize, num_slots: usize) -> Self {
        let row = kv_heads * D;
        let mut slots = r.shuffled(num_slots);
        slots.truncate(tokens);
        Self {
            key: r.vec(tokens * row, -1.0, 1.0),
            value: r.vec(tokens * row, -1.0, 1.0),
            slots,
            row,
            num_slots,
        }
    }

    /// Bytes moved: each row read once and written once, in K and in V.
    pub fn bytes_moved(&self) -> u64 {
        4 * (self.key.len() * std::mem::size_of::<bf16>()) as u64
    }

    /// Checks the caches bit for bit: written slots hold the rows, others are untouched
    /// (still `fill`).
    pub fn check(&self, k_cache: &[bf16], v_cache: &[bf16], fill: bf16) -> Result<(), String> {
        let mut want_k = vec![fill; self.num_slots * self.row];
        let mut want_v = want_k.clone();
        for (t, &s) in self.slots.iter().enumerate() {
            let (dst, src) = (s as usize * self.row, t * self.row);
            want_k[dst..dst + self.row].copy_from_slice(&self.key[src..src + self.row]);
            want_v[dst..dst + self.row].copy_from_slice(&self.value[src..src + self.row]);
        }
        for (name, got, want) in [("k", k_cache, &want_k), ("v", v_cache, &want_v)] {
            if got.len() != want.len() {
                return Err(format!(
                    "reshape_and_cache {name}_cache: {} elements, want {}",
                    got.len(),
                    want.len()
                ));
            }
            if let Some(i) = (0..want.len()).find(|&i| got[i].to_bits() != want[i].to_bits()) {
                return Err(format!(
                    "reshape_and_cache {name}_cache element {i}: got {}, want {}",
                    got[i], want[i]
                ));
            }
        }
        Ok(())
    }
}
