//! The LoRA kernels on the GPU (bf16): BGMV and SGMV validated against an f64 reference
//! on a small mixed batch, then timed at decode batch 32 (no adapter, 1 adapter, 4
//! adapters mixed; rank 16) at Llama-3-8B's q_proj (4096 -> 4096) and SmolLM2-135M's
//! gate (576 -> 1536), and SGMV over a prefill of 4 segments of 512 rows at 4096 ->
//! 4096. A figure is shrink plus expand, with GB/s over the distinct bytes (the
//! adapters used, `x`, `y` read and written, `t`).

use crate::cuda::{gbps, Arg, Gpu, GpuError, Kernel};
use crate::problem::BenchRng;
use cudarc::driver::CudaSlice;
use gpu_kernels::launch as geom;
use half::bf16;

/// Timed iterations per figure.
const ITERS: u32 = 50;
/// Untimed warm-up launches per figure.
const WARMUP: u32 = 5;
/// Max rank of the stacks.
const MAX_RANK: usize = 16;

/// Stacked adapters (`[slots, MAX_RANK, in]`, `[slots, out, MAX_RANK]`, zero past each
/// slot's rank) on the host and the device.
struct Lora {
    in_dim: usize,
    out_dim: usize,
    a: Vec<bf16>,
    b: Vec<bf16>,
    ranks: Vec<u32>,
    scales: Vec<f32>,
    a_d: CudaSlice<bf16>,
    b_d: CudaSlice<bf16>,
    ranks_d: CudaSlice<u32>,
    scales_d: CudaSlice<f32>,
}

impl Lora {
    fn new(
        gpu: &Gpu,
        r: &mut BenchRng,
        in_dim: usize,
        out_dim: usize,
        ranks: &[u32],
    ) -> Result<Self, GpuError> {
        let zero = bf16::from_f32(0.0);
        let mut a = vec![zero; ranks.len() * MAX_RANK * in_dim];
        let mut b = vec![zero; ranks.len() * out_dim * MAX_RANK];
        for (s, &rank) in ranks.iter().enumerate() {
            let rank = rank as usize;
            let at = s * MAX_RANK * in_dim;
            a[at..at + rank * in_dim].copy_from_slice(&r.vec(rank * in_dim, -0.5, 0.5));
            for o in 0..out_dim {
                let at = (s * out_dim + o) * MAX_RANK;
                b[at..at + rank].copy_from_slice(&r.vec(rank, -0.5, 0.5));
            }
        }
        let scales: Vec<f32> = (0..ranks.len()).map(|s| 0.5 + s as f32 * 0.25).collect();
        Ok(Self {
            in_dim,
            out_dim,
            a_d: gpu.upload(&a)?,
            b_d: gpu.upload(&b)?,
            ranks_d: gpu.upload(ranks)?,
            scales_d: gpu.upload(&scales)?,
            a,
            b,
            ranks: ranks.to_vec(),
            scales,
        })
    }

    /// Bytes of one slot's `A` and `B` at its rank.
    fn slot_bytes(&self, s: usize) -> u64 {
        (self.ranks[s] as usize * (self.in_dim + self.out_dim) * 2) as u64
    }
}

/// The four entry points (bf16).
struct Kernels {
    bgmv_shrink: Kernel,
    bgmv_expand: Kernel,
    sgmv_shrink: Kernel,
    sgmv_expand: Kernel,
}

impl Kernels {
    fn load(gpu: &Gpu) -> Result<Self, GpuError> {
        Ok(Self {
            bgmv_shrink: gpu.kernel("lora_bgmv_shrink_bf16")?,
            bgmv_expand: gpu.kernel("lora_bgmv_expand_bf16")?,
            sgmv_shrink: gpu.kernel("lora_sgmv_shrink_bf16")?,
            sgmv_expand: gpu.kernel("lora_sgmv_expand_bf16")?,
        })
    }
}

/// One batch on the device: `x`, the `t` scratch, `y` (rows of `stride`, the delta at
/// column `offset`), and either per-row slots (BGMV) or segments (SGMV).
struct Batch {
    rows: usize,
    stride: usize,
    offset: usize,
    x: CudaSlice<bf16>,
    t: CudaSlice<f32>,
    y: CudaSlice<bf16>,
    idx: CudaSlice<i32>,
    seg_starts: CudaSlice<u32>,
    seg_idx: CudaSlice<i32>,
    num_segs: usize,
}

impl Batch {
    fn new(
        gpu: &Gpu,
        x: &[bf16],
        y: &[bf16],
        idx: &[i32],
        segs: &[(u32, i32)],
        stride: usize,
        offset: usize,
    ) -> Result<Self, GpuError> {
        let mut starts = vec![0u32];
        for (len, _) in segs {
            starts.push(starts.last().copied().unwrap_or(0) + len);
        }
        let seg_idx: Vec<i32> = segs.iter().map(|s| s.1).collect();
        Ok(Self {
            rows: idx.len(),
            stride,
            offset,
            x: gpu.upload(x)?,
            t: gpu.stream.alloc_zeros::<f32>(idx.len() * MAX_RANK)?,
            y: gpu.upload(y)?,
            idx: gpu.upload(idx)?,
            seg_starts: gpu.upload(&starts)?,
            seg_idx: gpu.upload(if seg_idx.is_empty() {
                &[-1][..]
            } else {
                &seg_idx[..]
            })?,
            num_segs: segs.len(),
        })
    }

    fn bgmv(&self, gpu: &Gpu, k: &Kernels, l: &Lora) -> Result<(), GpuError> {
        let (rows, mr) = (self.rows as u32, MAX_RANK as u32);
        let shrink = [
            ("t", gpu.ptr(&self.t)),
            ("x", gpu.ptr(&self.x)),
            ("a", gpu.ptr(&l.a_d)),
            ("idx", gpu.ptr(&self.idx)),
            ("ranks", gpu.ptr(&l.ranks_d)),
            ("in_dim", Arg::U32(l.in_dim as u32)),
            ("max_rank", Arg::U32(mr)),
        ];
        let cfg = geom::lora_bgmv_shrink(rows, mr, geom::LORA_THREADS);
        gpu.launch(&k.bgmv_shrink, cfg, &shrink)?;
        let expand = [
            ("y", gpu.ptr(&self.y)),
            ("t", gpu.ptr(&self.t)),
            ("b", gpu.ptr(&l.b_d)),
            ("idx", gpu.ptr(&self.idx)),
            ("ranks", gpu.ptr(&l.ranks_d)),
            ("scales", gpu.ptr(&l.scales_d)),
            ("out_dim", Arg::U32(l.out_dim as u32)),
            ("max_rank", Arg::U32(mr)),
            ("y_stride", Arg::U32(self.stride as u32)),
            ("y_offset", Arg::U32(self.offset as u32)),
        ];
        let cfg = geom::lora_bgmv_expand(rows, l.out_dim as u32, geom::LORA_THREADS);
        gpu.launch(&k.bgmv_expand, cfg, &expand)
    }

    fn sgmv(&self, gpu: &Gpu, k: &Kernels, l: &Lora) -> Result<(), GpuError> {
        let (rows, mr, segs) = (self.rows as u32, MAX_RANK as u32, self.num_segs as u32);
        let shrink = [
            ("t", gpu.ptr(&self.t)),
            ("x", gpu.ptr(&self.x)),
            ("a", gpu.ptr(&l.a_d)),
            ("seg_starts", gpu.ptr(&self.seg_starts)),
            ("seg_idx", gpu.ptr(&self.seg_idx)),
            ("ranks", gpu.ptr(&l.ranks_d)),
            ("num_segs", Arg::U32(segs)),
            ("in_dim", Arg::U32(l.in_dim as u32)),
            ("max_rank", Arg::U32(mr)),
        ];
        let cfg = geom::lora_sgmv_shrink(rows, segs, mr, geom::LORA_THREADS);
        gpu.launch(&k.sgmv_shrink, cfg, &shrink)?;
        let expand = [
            ("y", gpu.ptr(&self.y)),
            ("t", gpu.ptr(&self.t)),
            ("b", gpu.ptr(&l.b_d)),
            ("seg_starts", gpu.ptr(&self.seg_starts)),
            ("seg_idx", gpu.ptr(&self.seg_idx)),
            ("ranks", gpu.ptr(&l.ranks_d)),
            ("scales", gpu.ptr(&l.scales_d)),
            ("num_segs", Arg::U32(segs)),
            ("out_dim", Arg::U32(l.out_dim as u32)),
            ("max_rank", Arg::U32(mr)),
            ("y_stride", Arg::U32(self.stride as u32)),
            ("y_offset", Arg::U32(self.offset as u32)),
        ];
        let cfg = geom::lora_sgmv_expand(rows, segs, l.out_dim as u32, geom::LORA_THREADS);
        gpu.launch(&k.sgmv_expand, cfg, &expand)
    }
}

/// f64 reference of `y0 + delta` and the magnitude the f32 accumulation error scales
/// with (negative where the kernels must leave `y0` as it is).
fn reference(
    l: &Lora,
    x: &[bf16],
    idx: &[i32],
    y0: &[bf16],
    stride: usize,
    offset: usize,
) -> (Vec<f64>, Vec<f64>) {
    let f = |v: bf16| f64::from(v.to_f32());
    let n = l.in_dim;
    let mut want: Vec<f64> = y0.iter().map(|&v| f(v)).collect();
    let mut mag = vec![-1.0; y0.len()];
    for (i, &s) in idx.iter().enumerate() {
        if s < 0 {
            continue;
        }
        let s = s as usize;
        let rank = l.ranks[s] as usize;
        let (mut t, mut ta) = (vec![0.0; rank], vec![0.0; rank]);
        for q in 0..rank {
            for k in 0..n {
                let p = f(x[i * n + k]) * f(l.a[(s * MAX_RANK + q) * n + k]);
                t[q] += p;
                ta[q] += p.abs();
            }
        }
        for o in 0..l.out_dim {
            let br = &l.b[(s * l.out_dim + o) * MAX_RANK..][..rank];
            let d: f64 = (0..rank).map(|q| t[q] * f(br[q])).sum();
            let m: f64 = (0..rank).map(|q| ta[q] * f(br[q]).abs()).sum();
            let at = i * stride + offset + o;
            let scale = f64::from(l.scales[s]);
            mag[at] = want[at].abs() + scale * m;
            want[at] += scale * d;
        }
    }
    (want, mag)
}

/// `|got - want| <= 2^-8 |want| + 2e-5 mag + 1e-6` where touched, bit-equal elsewhere.
fn check(
    what: &str,
    seed: u64,
    got: &[bf16],
    y0: &[bf16],
    want: &[f64],
    mag: &[f64],
) -> Result<(), String> {
    for (e, g) in got.iter().enumerate() {
        if mag[e] < 0.0 {
            if g.to_bits() != y0[e].to_bits() {
                return Err(format!(
                    "{what}: element {e} outside the delta was written (seed {seed})"
                ));
            }
            continue;
        }
        let (g, w) = (f64::from(g.to_f32()), want[e]);
        let tol = w.abs() / 256.0 + 2e-5 * mag[e] + 1e-6;
        if (g - w).abs() > tol || g.is_nan() {
            return Err(format!(
                "{what}: element {e}: got {g}, want {w} (tol {tol}; seed {seed})"
            ));
        }
    }
    Ok(())
}

/// BGMV on 9 rows with mixed, repeated and absent slots, and SGMV on segments of 1, 7,
/// 33 and 5 rows (the last without an adapter), into a column slice of a wider output.
pub fn validate(gpu: &Gpu, r: &mut BenchRng) -> Result<(), GpuError> {
    let k = Kernels::load(gpu)?;
    let l = Lora::new(gpu, r, 576, 1536, &[16, 8, 1, 16])?;
    let (stride, offset) = (1536 + 64, 32);
    let idx = [0, -1, 1, 2, 3, 0, -1, 3, 1];
    let segs = [(1u32, 2i32), (7, 0), (33, 3), (5, -1)];
    let seg_rows: Vec<i32> = segs
        .iter()
        .flat_map(|&(len, s)| std::iter::repeat_n(s, len as usize))
        .collect();
    for (what, rows_idx) in [("bgmv", &idx[..]), ("sgmv", &seg_rows[..])] {
        let rows = rows_idx.len();
        let x = r.vec(rows * l.in_dim, -1.0, 1.0);
        let y0 = r.vec(rows * stride, -2.0, 2.0);
        let (want, mag) = reference(&l, &x, rows_idx, &y0, stride, offset);
        let b = Batch::new(gpu, &x, &y0, rows_idx, &segs, stride, offset)?;
        if what == "bgmv" {
            b.bgmv(gpu, &k, &l)?;
        } else {
            b.sgmv(gpu, &k, &l)?;
        }
        check(
            &format!("gpu lora {what}"),
            r.seed,
            &gpu.download(&b.y)?,
            &y0,
            &want,
            &mag,
        )?;
    }
    println!("validated lora_bgmv_* and lora_sgmv_* (bf16, 576 -> 1536, ranks 16/8/1/16)");
    Ok(())
}

/// Times decode (BGMV) at batch 32 with no, 1 and 4 mixed adapters, and a prefill
/// (SGMV) of 4 segments of 512 rows with 4 adapters; prints beside the copy bandwidth.
pub fn bench(gpu: &Gpu, r: &mut BenchRng) -> Result<(), GpuError> {
    let k = Kernels::load(gpu)?;
    let copy = gpu.copy_bandwidth(64 << 20, ITERS)?;
    println!("LoRA delta (shrink + expand, bf16, rank {MAX_RANK}):");
    for (label, in_dim, out_dim) in [
        ("Llama-3-8B q_proj", 4096, 4096),
        ("SmolLM2 gate", 576, 1536),
    ] {
        let l = Lora::new(gpu, r, in_dim, out_dim, &[16; 4])?;
        let rows = 32usize;
        let x = r.vec(rows * in_dim, -1.0, 1.0);
        let y0 = r.vec(rows * out_dim, -2.0, 2.0);
        for (mix, used) in [
            ("no adapter", 0usize),
            ("1 adapter", 1),
            ("4 adapters mixed", 4),
        ] {
            let idx: Vec<i32> = (0..rows)
                .map(|i| if used == 0 { -1 } else { (i % used) as i32 })
                .collect();
            let b = Batch::new(gpu, &x, &y0, &idx, &[], out_dim, 0)?;
            let ms = gpu.time(WARMUP, ITERS, || b.bgmv(gpu, &k, &l))?;
            let io = if used == 0 {
                0
            } else {
                (rows * (in_dim + 2 * out_dim) * 2 + rows * MAX_RANK * 8) as u64
            };
            let bytes = (0..used).map(|s| l.slot_bytes(s)).sum::<u64>() + io;
            let bw = gbps(bytes, ms);
            println!(
                "  bgmv {label} {in_dim}->{out_dim}, batch {rows}, {mix:<17} {:>7.1} us  {bw:>7.1} GB/s ({:>4.1}% of copy)",
                ms * 1e3,
                100.0 * bw / copy
            );
        }
    }
    let (in_dim, out_dim, seg) = (4096usize, 4096usize, 512u32);
    let l = Lora::new(gpu, r, in_dim, out_dim, &[16; 4])?;
    let segs: Vec<(u32, i32)> = (0..4).map(|s| (seg, s)).collect();
    let rows = 4 * seg as usize;
    let idx: Vec<i32> = segs
        .iter()
        .flat_map(|&(len, s)| std::iter::repeat_n(s, len as usize))
        .collect();
    let x = r.vec(rows * in_dim, -1.0, 1.0);
    let y0 = r.vec(rows * out_dim, -2.0, 2.0);
    let b = Batch::new(gpu, &x, &y0, &idx, &segs, out_dim, 0)?;
    let ms = gpu.time(WARMUP, ITERS, || b.sgmv(gpu, &k, &l))?;
    let flops = 2.0 * rows as f64 * MAX_RANK as f64 * (in_dim + out_dim) as f64;
    println!(
        "  sgmv {in_dim}->{out_dim}, 4 segments x {seg} rows, 4 adapters: {:>7.1} us  {:>6.2} TFLOP/s",
        ms * 1e3,
        flops / (ms * 1e-3) / 1e12
    );
    Ok(())
}
