//! What the GPU benchmark runs: validation of each timed kernel against the f64 / exact
//! CPU references on small shapes, then CUDA-event timings at vLLM's decode shape
//! (batch 8, context 4096, 64 query / 8 KV heads, head 128, block 16, bf16), printed as
//! achieved GB/s beside a measured device-to-device copy of the same size.
//!
//! Byte counts are the minimum a kernel must move (see
//! [`crate::problem::DecodeShape::bytes_moved`]); split-K scratch traffic is not counted,
//! so v2's figure is comparable with v1's.

use crate::cuda::{gbps, Arg, Gpu, GpuError, Kernel};
use crate::problem::{
    check_close, check_close_atol, poisoned, rms_norm_reference, BenchRng, CacheWrite,
    DecodeProblem, DecodeShape, D,
};
use cudarc::driver::CudaSlice;
use gpu_kernels::launch as geom;
use half::bf16;

/// Split-K partition size (vLLM's `PARTITION_SIZE`).
const PARTITION: u32 = 512;
/// Timed iterations per figure.
const ITERS: u32 = 50;
/// Untimed warm-up launches per figure.
const WARMUP: u32 = 5;
/// RMSNorm epsilon.
const EPS: f32 = 1e-6;
/// Hidden size of the RMSNorm figures (Llama-70B).
const HIDDEN: usize = 8192;

/// The decode attention entry points of one head size.
struct AttnKernels {
    v1: Kernel,
    v2: Kernel,
    reduce: Kernel,
}

impl AttnKernels {
    fn load(gpu: &Gpu, d: usize) -> Result<Self, GpuError> {
        Ok(Self {
            v1: gpu.kernel(&format!("paged_attention_v1_bf16_h{d}"))?,
            v2: gpu.kernel(&format!("paged_attention_v2_bf16_h{d}"))?,
            reduce: gpu.kernel(&format!("paged_attention_v2_reduce_bf16_h{d}"))?,
        })
    }
}

/// How a decode figure is launched.
#[derive(Clone, Copy, Debug)]
enum Decode {
    V1,
    V2 { partition: u32 },
}

/// A [`DecodeProblem`] in device memory, with its output and split-K scratch (sized for
/// the smallest partition any launch uses).
struct AttnDevice {
    shape: DecodeShape,
    scale: f32,
    q: CudaSlice<bf16>,
    k: CudaSlice<bf16>,
    v: CudaSlice<bf16>,
    tables: CudaSlice<u32>,
    ctx: CudaSlice<u32>,
    out: CudaSlice<bf16>,
    tmp: CudaSlice<f32>,
    max_logits: CudaSlice<f32>,
    exp_sums: CudaSlice<f32>,
}

impl AttnDevice {
    fn upload(gpu: &Gpu, p: &DecodeProblem, min_partition: u32) -> Result<Self, GpuError> {
        let d = p.shape.d;
        let parts = geom::num_partitions(p.shape.max_ctx(), min_partition);
        let slots = p.q.len() / d * parts as usize;
        Ok(Self {
            shape: p.shape.clone(),
            scale: p.scale,
            q: gpu.upload(&p.q)?,
            k: gpu.upload(&p.k)?,
            v: gpu.upload(&p.v)?,
            tables: gpu.upload(&p.tables)?,
            ctx: gpu.upload(&p.shape.ctx)?,
            out: gpu.upload(&poisoned(p.q.len()))?,
            tmp: gpu.upload(&vec![f32::NAN; slots * d])?,
            max_logits: gpu.upload(&vec![f32::NAN; slots])?,
            exp_sums: gpu.upload(&vec![f32::NAN; slots])?,
        })
    }

    fn dims(&self) -> (u32, u32, u32, u32) {
        let s = &self.shape;
        (
            s.ctx.len() as u32,
            s.heads as u32,
            s.kv_heads as u32,
            s.d as u32,
        )
    }

    /// The planner's input for this batch on a device of `sm_count` SMs.
    fn plan_shape(&self, sm_count: u32) -> geom::DecodeShape {
        let s = &self.shape;
        let (num_seqs, num_heads, num_kv_heads, head_dim) = self.dims();
        geom::DecodeShape {
            num_seqs,
            num_heads,
            num_kv_heads,
            head_dim,
            max_context_len: s.max_ctx(),
            total_context_len: s.ctx.iter().map(|&c| u64::from(c)).sum(),
            block_size: s.block_size as u32,
            sm_count,
            threads: geom::ATTN_THREADS,
        }
    }

    /// The parameters shared by v1 and v2 after the outputs and `q`, in KERNELS order.
    fn kv_args(&self, gpu: &Gpu) -> [(&'static str, Arg); 9] {
        let s = &self.shape;
        [
            ("k_cache", gpu.ptr(&self.k)),
            ("v_cache", gpu.ptr(&self.v)),
            ("block_tables", gpu.ptr(&self.tables)),
            ("context_lens", gpu.ptr(&self.ctx)),
            ("num_heads", Arg::U32(s.heads as u32)),
            ("num_kv_heads", Arg::U32(s.kv_heads as u32)),
            ("scale", Arg::F32(self.scale)),
            ("block_size", Arg::U32(s.block_size as u32)),
            ("max_blocks_per_seq", Arg::U32(s.max_blocks() as u32)),
        ]
    }

    fn launch(&self, gpu: &Gpu, k: &AttnKernels, how: Decode) -> Result<(), GpuError> {
        match how {
            Decode::V1 => self.launch_v1(gpu, k),
            Decode::V2 { partition } => self.launch_v2(gpu, k, partition),
        }
    }

    fn launch_v1(&self, gpu: &Gpu, k: &AttnKernels) -> Result<(), GpuError> {
        let (seqs, heads, kvh, d) = self.dims();
        let mut args = vec![("out", gpu.ptr(&self.out)), ("q", gpu.ptr(&self.q))];
        args.extend(self.kv_args(gpu));
        args.push(("window", Arg::U32(self.shape.window)));
        let cfg = geom::decode_v1(seqs, heads, kvh, d, geom::ATTN_THREADS);
        gpu.launch(&k.v1, cfg, &args)
    }

    fn launch_v2(&self, gpu: &Gpu, k: &AttnKernels, partition: u32) -> Result<(), GpuError> {
        let (seqs, heads, kvh, d) = self.dims();
        let max_ctx = self.shape.max_ctx();
        let parts = geom::num_partitions(max_ctx, partition);
        let (tmp, ml, es) = (
            gpu.ptr(&self.tmp),
            gpu.ptr(&self.max_logits),
            gpu.ptr(&self.exp_sums),
        );
        let mut args = vec![
            ("tmp_out", tmp),
            ("max_logits", ml),
            ("exp_sums", es),
            ("q", gpu.ptr(&self.q)),
        ];
        args.extend(self.kv_args(gpu));
        args.push(("partition_size", Arg::U32(partition)));
        args.push(("window", Arg::U32(self.shape.window)));
        let threads = geom::ATTN_THREADS;
        let cfg = geom::decode_v2(seqs, heads, kvh, d, max_ctx, partition, threads);
        gpu.launch(&k.v2, cfg, &args)?;
        let args = [
            ("out", gpu.ptr(&self.out)),
            ("tmp_out", tmp),
            ("max_logits", ml),
            ("exp_sums", es),
            ("context_lens", gpu.ptr(&self.ctx)),
            ("partition_size", Arg::U32(partition)),
            ("max_partitions", Arg::U32(parts)),
        ];
        let cfg = geom::paged_attention_v2_reduce(seqs, heads, threads);
        gpu.launch(&k.reduce, cfg, &args)
    }

    /// Re-poisons the output so the next launch must write every element.
    fn poison(&mut self, gpu: &Gpu) -> Result<(), GpuError> {
        let n = self.out.len();
        gpu.stream.memcpy_htod(&poisoned(n), &mut self.out)?;
        Ok(())
    }
}

/// Validates v1, v2 (3 partitions), rms_norm and reshape_and_cache on small shapes.
pub fn validate(gpu: &Gpu, r: &mut BenchRng) -> Result<(), GpuError> {
    let k = AttnKernels::load(gpu, D)?;
    let shape = DecodeShape::ragged(r, 64, 8, 3 * PARTITION as usize);
    let p = DecodeProblem::random(r, shape);
    let want = p.reference();
    let mut dev = AttnDevice::upload(gpu, &p, PARTITION)?;
    dev.launch_v1(gpu, &k)?;
    check_close("gpu v1", r.seed, &gpu.download(&dev.out)?, &want)?;
    dev.poison(gpu)?;
    dev.launch_v2(gpu, &k, PARTITION)?;
    check_close("gpu v2", r.seed, &gpu.download(&dev.out)?, &want)?;
    println!(
        "validated paged_attention v1 and v2 (partition {PARTITION}) bf16 h{D}, contexts {:?}, \
         64/8 heads",
        p.shape.ctx
    );

    let (rows, x, w) = (
        4usize,
        r.vec(4 * HIDDEN, -2.0, 2.0),
        r.vec(HIDDEN, 0.5, 1.5),
    );
    let (xd, wd, od) = (
        gpu.upload(&x)?,
        gpu.upload(&w)?,
        gpu.upload(&poisoned(x.len()))?,
    );
    launch_rms_norm(gpu, &gpu.kernel("rms_norm_bf16")?, &od, &xd, &wd, rows)?;
    let want = rms_norm_reference(&x, &w, f64::from(EPS));
    check_close("gpu rms_norm", r.seed, &gpu.download(&od)?, &want)?;

    let fill = bf16::from_f32(-7.0);
    let cw = CacheWrite::random(r, 100, 8, 40 * 16);
    let kc = gpu.upload(&vec![fill; cw.num_slots * cw.row])?;
    let vc = gpu.upload(&vec![fill; cw.num_slots * cw.row])?;
    let kernel = gpu.kernel("reshape_and_cache_bf16")?;
    launch_reshape(
        gpu,
        &kernel,
        &cw,
        &CacheWriteDevice::upload(gpu, &cw)?,
        &kc,
        &vc,
    )?;
    cw.check(&gpu.download(&kc)?, &gpu.download(&vc)?, fill)?;
    println!("validated rms_norm_bf16 ({rows}x{HIDDEN}) and reshape_and_cache_bf16 (100 tokens)");
    Ok(())
}

fn launch_rms_norm(
    gpu: &Gpu,
    k: &Kernel,
    out: &CudaSlice<bf16>,
    x: &CudaSlice<bf16>,
    w: &CudaSlice<bf16>,
    rows: usize,
) -> Result<(), GpuError> {
    let args = [
        ("out", gpu.ptr(out)),
        ("input", gpu.ptr(x)),
        ("weight", gpu.ptr(w)),
        ("eps", Arg::F32(EPS)),
        ("hidden", Arg::U32(w.len() as u32)),
    ];
    gpu.launch(k, geom::per_row(rows as u32, geom::ROW_THREADS), &args)
}

/// The new rows and slot mapping of a [`CacheWrite`] on the device.
struct CacheWriteDevice {
    key: CudaSlice<bf16>,
    value: CudaSlice<bf16>,
    slots: CudaSlice<u32>,
}

impl CacheWriteDevice {
    fn upload(gpu: &Gpu, cw: &CacheWrite) -> Result<Self, GpuError> {
        Ok(Self {
            key: gpu.upload(&cw.key)?,
            value: gpu.upload(&cw.value)?,
            slots: gpu.upload(&cw.slots)?,
        })
    }
}

fn launch_reshape(
    gpu: &Gpu,
    k: &Kernel,
    cw: &CacheWrite,
    d: &CacheWriteDevice,
    k_cache: &CudaSlice<bf16>,
    v_cache: &CudaSlice<bf16>,
) -> Result<(), GpuError> {
    let row = cw.row as u32;
    let args = [
        ("key", gpu.ptr(&d.key)),
        ("value", gpu.ptr(&d.value)),
        ("k_cache", gpu.ptr(k_cache)),
        ("v_cache", gpu.ptr(v_cache)),
        ("slot_mapping", gpu.ptr(&d.slots)),
        ("num_kv_heads", Arg::U32(row / D as u32)),
        ("head_dim", Arg::U32(D as u32)),
        ("key_stride", Arg::U32(row)),
        ("value_stride", Arg::U32(row)),
    ];
    let cfg = geom::per_row(cw.slots.len() as u32, geom::ROW_THREADS);
    gpu.launch(k, cfg, &args)
}

/// Prints one figure line.
fn report(what: &str, ms: f64, bytes: u64, copy: f64) {
    let bw = gbps(bytes, ms);
    println!(
        "{what:<44} {:>9.1} us  {:>8.1} MiB  {bw:>7.1} GB/s  ({:>5.1}% of D2D copy)",
        ms * 1e3,
        bytes as f64 / (1 << 20) as f64,
        100.0 * bw / copy
    );
}

/// Times decode attention at vLLM's, SmolLM2's, Llama-3-8B's and a Gemma-3 sliding-window
/// layer's shapes (v1, v2 at vLLM's partition, and the planner's choice), then rms_norm
/// and reshape_and_cache. Prefill runs without a window (0).
pub fn bench(gpu: &Gpu, r: &mut BenchRng) -> Result<(), GpuError> {
    let sm = gpu.ctx.attribute(
        cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
    )? as u32;
    let vllm = DecodeShape::vllm();
    let bytes = vllm.bytes_moved();
    let copy = gpu.copy_bandwidth(bytes as usize, ITERS)?;
    println!(
        "D2D copy of {:.1} MiB: {copy:.1} GB/s (read + write); {sm} SMs",
        bytes as f64 / (1 << 20) as f64
    );
    let shapes = [
        ("vLLM: batch 8, ctx 4096, 64/8 heads, h128", vllm),
        (
            "SmolLM2: batch 256, ctx 256-1024, 9/3 heads, h64",
            DecodeShape::smollm2(r),
        ),
        (
            "Llama-3-8B: batch 64, ctx 2048, 32/8 heads, h128",
            DecodeShape::llama3_8b(),
        ),
        (
            "Gemma-3-270M local: batch 64, ctx 4096, window 512, 4/1 heads, h256",
            DecodeShape::gemma3_local(),
        ),
    ];
    for (label, shape) in shapes {
        bench_decode(gpu, r, label, shape, sm, copy)?;
    }
    println!("prefill attention (causal, whole prompt as the query), 32/8 heads, bf16:");
    for (seqs, ctx) in [(4usize, 2048u32), (1, 8192)] {
        for d in [64usize, 128] {
            bench_prefill(gpu, r, seqs, ctx, d)?;
        }
    }
    crate::gemm::bench(gpu, r)?;
    bench_rows(gpu, r, copy)
}

/// One decode shape: v1, v2 (partition 512) and the planner's choice, each spot-checked
/// against the f64 reference on its first and last (sequence, head) rows after timing.
fn bench_decode(
    gpu: &Gpu,
    r: &mut BenchRng,
    label: &str,
    shape: DecodeShape,
    sm: u32,
    copy: f64,
) -> Result<(), GpuError> {
    let p = DecodeProblem::random(r, shape);
    let (d, bytes) = (p.shape.d, p.shape.bytes_moved());
    let k = AttnKernels::load(gpu, d)?;
    let mut dev = AttnDevice::upload(gpu, &p, geom::MIN_PARTITION)?;
    let plan = geom::plan_decode_window(dev.plan_shape(sm), p.shape.window);
    let planned = match plan {
        geom::DecodePlan::V1(_) => Decode::V1,
        geom::DecodePlan::V2 { partition_size, .. } => Decode::V2 {
            partition: partition_size,
        },
    };
    println!("decode attention, {label}, block 16, bf16; planner: {planned:?}");
    let last = (p.shape.ctx.len() - 1, p.shape.heads - 1);
    let rows = [(0usize, 0usize), last];
    let want = p.reference_rows(&rows);
    let runs = [
        ("v1".to_string(), Decode::V1),
        (
            format!("v2 (partition {PARTITION}) + reduce"),
            Decode::V2 {
                partition: PARTITION,
            },
        ),
        (format!("planner's choice {planned:?}"), planned),
    ];
    for (name, how) in runs {
        dev.poison(gpu)?;
        let devr = &dev;
        let ms = gpu.time(WARMUP, ITERS, || devr.launch(gpu, &k, how))?;
        let out = gpu.download(&dev.out)?;
        let got: Vec<bf16> = rows
            .iter()
            .flat_map(|&(s, h)| out[(s * p.shape.heads + h) * d..][..d].to_vec())
            .collect();
        check_close(&format!("{name} at {label}"), r.seed, &got, &want)?;
        report(&format!("  {name}"), ms, bytes, copy);
    }
    Ok(())
}

/// Prefill of `seqs` prompts of `ctx` tokens each (32 query / 8 KV heads, head `d`), in
/// TFLOP/s (`4 * heads * d * sum(position + 1)`: the causal half), the streaming kernel
/// and the tensor-core kernel on the same problem one after the other, each
/// spot-checked on three query rows after timing.
fn bench_prefill(
    gpu: &Gpu,
    r: &mut BenchRng,
    seqs: usize,
    ctx: u32,
    d: usize,
) -> Result<(), GpuError> {
    let (heads, kv_heads) = (32usize, 8usize);
    let shape = DecodeShape {
        ctx: vec![ctx; seqs],
        heads,
        kv_heads,
        block_size: 16,
        d,
        window: 0,
    };
    let p = DecodeProblem::random(r, shape);
    let tokens = seqs * ctx as usize;
    let q = r.vec(tokens * heads * d, -1.0, 1.0);
    let qsl: Vec<u32> = (0..=seqs as u32).map(|i| i * ctx).collect();
    let (qd, kd, vd) = (gpu.upload(&q)?, gpu.upload(&p.k)?, gpu.upload(&p.v)?);
    let (td, cd, sd) = (
        gpu.upload(&p.tables)?,
        gpu.upload(&p.shape.ctx)?,
        gpu.upload(&qsl)?,
    );
    // (token, head): the first row, a row in the middle of the last prompt, the last row.
    let checks = [
        (0usize, 0usize),
        (tokens - ctx as usize / 2, 5),
        (tokens - 1, heads - 1),
    ];
    let mut want = Vec::new();
    for (t, h) in checks {
        let (s, pos) = (t / ctx as usize, t % ctx as usize);
        let row = &q[(t * heads + h) * d..][..d];
        want.extend(p.reference_prefix(row, s, h / (heads / kv_heads), pos + 1));
    }
    let rows_sum = seqs as f64 * ctx as f64 * (ctx as f64 + 1.0) / 2.0;
    let flops = 4.0 * (heads * d) as f64 * rows_sum;
    let threads = geom::ATTN_THREADS;
    let runs = [
        (
            format!("prefill_attention_bf16_h{d}"),
            geom::prefill_attention(tokens as u32, heads as u32, ctx, threads),
            1e-3,
        ),
        (
            format!("prefill_attention_mma_bf16_h{d}"),
            geom::prefill_mma(tokens as u32, seqs as u32, heads as u32, d as u32, threads),
            1e-3 + 2f64.powi(-9),
        ),
    ];
    for (name, cfg, atol) in runs {
        let kernel = gpu.kernel(&name)?;
        let od = gpu.upload(&poisoned(q.len()))?;
        let args = [
            ("out", gpu.ptr(&od)),
            ("q", gpu.ptr(&qd)),
            ("k_cache", gpu.ptr(&kd)),
            ("v_cache", gpu.ptr(&vd)),
            ("block_tables", gpu.ptr(&td)),
            ("context_lens", gpu.ptr(&cd)),
            ("query_start_loc", gpu.ptr(&sd)),
            ("num_seqs", Arg::U32(seqs as u32)),
            ("num_kv_heads", Arg::U32(kv_heads as u32)),
            ("scale", Arg::F32(p.scale)),
            ("block_size", Arg::U32(16)),
            ("max_blocks_per_seq", Arg::U32(p.shape.max_blocks() as u32)),
            ("window", Arg::U32(0)),
        ];
        let ms = gpu.time(1, 5, || gpu.launch(&kernel, cfg, &args))?;
        let out = gpu.download(&od)?;
        let got: Vec<bf16> = checks
            .iter()
            .flat_map(|&(t, h)| out[(t * heads + h) * d..][..d].to_vec())
            .collect();
        check_close_atol(&format!("{name} {seqs}x{ctx}"), r.seed, &got, &want, atol)?;
        println!(
            "  {name:<34} {seqs}x{ctx}: {:>9.1} us  {:>7.2} TFLOP/s",
            ms * 1e3,
            flops / (ms * 1e-3) / 1e12
        );
    }
    Ok(())
}

/// rms_norm over a 4096-token prefill chunk and reshape_and_cache of 4096 tokens.
fn bench_rows(gpu: &Gpu, r: &mut BenchRng, copy: f64) -> Result<(), GpuError> {
    let rows = 4096usize;
    let (x, w) = (r.vec(rows * HIDDEN, -2.0, 2.0), r.vec(HIDDEN, 0.5, 1.5));
    let (xd, wd) = (gpu.upload(&x)?, gpu.upload(&w)?);
    let od = gpu.stream.alloc_zeros::<bf16>(x.len())?;
    let kernel = gpu.kernel("rms_norm_bf16")?;
    let ms = gpu.time(WARMUP, ITERS, || {
        launch_rms_norm(gpu, &kernel, &od, &xd, &wd, rows)
    })?;
    let bytes = (2 * x.len() + w.len()) as u64 * 2;
    report(&format!("rms_norm_bf16 {rows}x{HIDDEN}"), ms, bytes, copy);

    let slots = 2048 * 16;
    let cw = CacheWrite::random(r, rows, 8, slots);
    let kc = gpu.stream.alloc_zeros::<bf16>(slots * cw.row)?;
    let vc = gpu.stream.alloc_zeros::<bf16>(slots * cw.row)?;
    let d = CacheWriteDevice::upload(gpu, &cw)?;
    let kernel = gpu.kernel("reshape_and_cache_bf16")?;
    let ms = gpu.time(WARMUP, ITERS, || {
        launch_reshape(gpu, &kernel, &cw, &d, &kc, &vc)
    })?;
    report(
        &format!("reshape_and_cache_bf16 {rows} tokens 8x128"),
        ms,
        cw.bytes_moved(),
        copy,
    );
    Ok(())
}
