//! Microbenchmarks of the kernels on the host emulator, at small shapes.
//!
//! On the CPU this times the emulator (one OS thread per GPU thread, so the figures
//! measure the emulation, not the kernels). Timing the PTX with CUDA events at vLLM's
//! shapes is the `gpu` bench (`cargo bench -p gpu-kernels --features cuda --bench gpu`).

use criterion::{criterion_group, criterion_main, Criterion};
use gpu_kernels::decode::paged_attention_v1;
use gpu_kernels::device::emu::launch;
use gpu_kernels::launch as geom;
use gpu_kernels::norm::rms_norm;
use half::bf16;

fn bench_attention(c: &mut Criterion) {
    const D: usize = 128;
    let (seqs, heads, kv_heads, bs, ctx) = (2usize, 4usize, 1usize, 16usize, 64usize);
    let blocks_per_seq = ctx / bs;
    let num_blocks = seqs * blocks_per_seq;
    let k = vec![bf16::from_f32(0.01); num_blocks * bs * kv_heads * D];
    let v = k.clone();
    let q = vec![bf16::from_f32(0.02); seqs * heads * D];
    let tables: Vec<u32> = (0..num_blocks as u32).rev().collect();
    let lens = vec![ctx as u32; seqs];
    let mut out = vec![bf16::ZERO; seqs * heads * D];
    let (o, qp, kp, vp, bt, cl) = (
        out.as_mut_ptr(),
        q.as_ptr(),
        k.as_ptr(),
        v.as_ptr(),
        tables.as_ptr(),
        lens.as_ptr(),
    );
    let cfg = geom::decode_v1(
        seqs as u32,
        heads as u32,
        kv_heads as u32,
        D as u32,
        geom::ATTN_THREADS,
    );
    c.bench_function("emu paged_attention_v1 bf16 h128 2x4 heads ctx64", |b| {
        b.iter(|| {
            // SAFETY: buffers sized for the launch and alive for its duration.
            unsafe {
                launch(cfg, || {
                    paged_attention_v1::<bf16, D>(
                        o,
                        qp,
                        kp,
                        vp,
                        bt,
                        cl,
                        heads as u32,
                        kv_heads as u32,
                        0.088,
                        bs as u32,
                        blocks_per_seq as u32,
                        0,
                    )
                })
            }
        })
    });
}

fn bench_rms_norm(c: &mut Criterion) {
    let (rows, hidden) = (4usize, 576usize);
    let x = vec![bf16::from_f32(0.5); rows * hidden];
    let w = vec![bf16::from_f32(1.0); hidden];
    let mut out = vec![bf16::ZERO; rows * hidden];
    let (o, xp, wp) = (out.as_mut_ptr(), x.as_ptr(), w.as_ptr());
    let cfg = geom::per_row(rows as u32, geom::ROW_THREADS);
    c.bench_function("emu rms_norm bf16 4x576", |b| {
        b.iter(|| {
            // SAFETY: buffers sized for the launch and alive for its duration.
            unsafe { launch(cfg, || rms_norm::<bf16>(o, xp, wp, 1e-5, hidden as u32)) }
        })
    });
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(10);
    targets = bench_attention, bench_rms_norm
}
criterion_main!(benches);
