//! Paged attention kernels on the emulator against an f64 reference.
mod common;

use common::paged::{run_v2, Paged, V2Plan};
use common::{assert_close, poisoned, TestRng, BF16, F16, THREADS};
use gpu_kernels::attention::{paged_attention_v2_reduce, prefill_attention};
use gpu_kernels::decode::{paged_attention_v1, paged_attention_v2};
use gpu_kernels::device::emu::launch;
use gpu_kernels::{launch as geom, Storage};

/// Context lengths: ragged, one exactly at a block boundary, one at the maximum, one of 1.
fn contexts(r: &mut TestRng, block_size: usize, max_blocks: usize) -> Vec<u32> {
    let max = block_size * max_blocks;
    vec![
        r.range(2, max - 1) as u32,
        (block_size * r.range(1, max_blocks)) as u32,
        max as u32,
        1,
    ]
}

/// `block_size` 0 picks one of 8, 16, 32 at random.
fn decode_case<T: Storage, const D: usize>(
    r: &mut TestRng,
    block_size: usize,
    heads: usize,
    kv_heads: usize,
) {
    let block_size = if block_size == 0 {
        [8, 16, 32][r.range(0, 2)]
    } else {
        block_size
    };
    let max_blocks = 40usize.div_ceil(block_size).max(2);
    let ctx = contexts(r, block_size, max_blocks);
    let seqs = ctx.len();
    let kv = Paged::<T>::new(r, &ctx, block_size, kv_heads, D, max_blocks);
    let q: Vec<T> = r.vec(seqs * heads * D, -1.0, 1.0);
    let scale = 1.0 / (D as f32).sqrt();
    let want: Vec<f64> = (0..seqs)
        .flat_map(|s| (0..heads).map(move |h| (s, h)))
        .flat_map(|(s, h)| {
            kv.reference(
                &q[(s * heads + h) * D..][..D],
                s,
                h,
                heads,
                ctx[s] as usize,
                scale as f64,
                D,
            )
        })
        .collect();
    let what = format!("D={D} bs={block_size} heads={heads}/{kv_heads} ctx={ctx:?}");
    let max_ctx = *ctx.iter().max().unwrap_or(&1);

    // Single pass.
    let mut out = poisoned::<T>(seqs * heads * D);
    let (o, qp, kp, vp, bt, cl) = (
        out.as_mut_ptr(),
        q.as_ptr(),
        kv.k.as_ptr(),
        kv.v.as_ptr(),
        kv.tables.as_ptr(),
        kv.ctx.as_ptr(),
    );
    let (h32, kvh32) = (heads as u32, kv_heads as u32);
    let cfg = geom::decode_v1(seqs as u32, h32, kvh32, D as u32, THREADS);
    // SAFETY: buffers sized as the kernel's contract requires; they outlive the launch.
    unsafe {
        launch(cfg, || {
            paged_attention_v1::<T, D>(
                o,
                qp,
                kp,
                vp,
                bt,
                cl,
                h32,
                kvh32,
                scale,
                block_size as u32,
                max_blocks as u32,
                0,
            )
        })
    };
    assert_close(&format!("v1 {what}"), r.seed, &out, &want);

    // Split-K with a partition smaller than the longest context.
    let part = [8u32, 16, 24][r.range(0, 2)];
    let parts = geom::num_partitions(max_ctx, part) as usize;
    let mut tmp = vec![f32::NAN; seqs * heads * parts * D];
    let mut ml = vec![f32::NAN; seqs * heads * parts];
    let mut es = vec![f32::NAN; seqs * heads * parts];
    let mut out2 = poisoned::<T>(seqs * heads * D);
    let (tp, mp, ep, o2) = (
        tmp.as_mut_ptr(),
        ml.as_mut_ptr(),
        es.as_mut_ptr(),
        out2.as_mut_ptr(),
    );
    let cfg = geom::decode_v2(seqs as u32, h32, kvh32, D as u32, max_ctx, part, THREADS);
    let cfg_r = geom::paged_attention_v2_reduce(seqs as u32, heads as u32, THREADS);
    // SAFETY: as above; the reduce reads only partitions the first launch wrote.
    unsafe {
        launch(cfg, || {
            paged_attention_v2::<T, D>(
                tp,
                mp,
                ep,
                qp,
                kp,
                vp,
                bt,
                cl,
                h32,
                kvh32,
                scale,
                block_size as u32,
                max_blocks as u32,
                part,
                0,
            )
        });
        launch(cfg_r, || {
            paged_attention_v2_reduce::<T, D>(o2, tp, mp, ep, cl, part, parts as u32)
        });
    }
    assert_close(&format!("v2 partition {part} {what}"), r.seed, &out2, &want);
}

fn decode_all_heads<T: Storage>(name: &str) {
    let mut r = TestRng::new(name);
    // Every head size; block size (random) and GQA shape vary with it (MHA, GQA, MQA).
    decode_case::<T, 16>(&mut r, 0, 2, 1);
    decode_case::<T, 64>(&mut r, 0, 4, 2);
    decode_case::<T, 80>(&mut r, 0, 2, 1);
    decode_case::<T, 96>(&mut r, 0, 2, 2);
    decode_case::<T, 128>(&mut r, 0, 4, 1);
    decode_case::<T, 256>(&mut r, 0, 2, 1);
}

#[test]
fn decode_f32() {
    decode_all_heads::<f32>("decode_f32");
}

#[test]
fn decode_f16() {
    decode_all_heads::<F16>("decode_f16");
}

#[test]
fn decode_bf16() {
    decode_all_heads::<BF16>("decode_bf16");
}

#[test]
fn decode_gqa_groups() {
    let mut r = TestRng::new("decode_gqa_groups");
    // SmolLM2 (9:3), Llama 3 (8:1), and a group over MAX_GROUP split in two slices (12:1).
    decode_case::<BF16, 64>(&mut r, 0, 9, 3);
    decode_case::<BF16, 128>(&mut r, 0, 8, 1);
    decode_case::<F16, 64>(&mut r, 0, 12, 1);
}

#[test]
fn decode_every_block_size() {
    let mut r = TestRng::new("decode_every_block_size");
    for bs in [8, 16, 32] {
        decode_case::<f32, 64>(&mut r, bs, 2, 1);
    }
}

fn prefill_case<T: Storage, const D: usize>(name: &str) {
    let mut r = TestRng::new(name);
    let bs = [8usize, 16, 32][r.range(0, 2)];
    let (heads, kv_heads, max_blocks) = (2usize, 1usize, 40usize.div_ceil(bs).max(2));
    let max = bs * max_blocks;
    // (context, new query tokens): plain prefill, chunked prefill over a cached prefix
    // ending at a block boundary, a chunk reaching the maximum length, a decode-like 1;
    // the second spans several query tiles.
    let prefix = bs * r.range(1, max_blocks - 1);
    let shapes = [
        (r.range(1, 6), 0usize),
        (r.range(9, 30), 0usize),
        (prefix + r.range(1, 4), prefix),
        (max, max - r.range(1, 4)),
        (1, 0),
    ];
    let ctx: Vec<u32> = shapes.iter().map(|&(c, _)| c as u32).collect();
    let qlens: Vec<usize> = shapes.iter().map(|&(c, p)| c - p).collect();
    let mut qsl = vec![0u32];
    for &l in &qlens {
        qsl.push(qsl[qsl.len() - 1] + l as u32);
    }
    let tokens = qsl[qsl.len() - 1] as usize;
    let kv = Paged::<T>::new(&mut r, &ctx, bs, kv_heads, D, max_blocks);
    let q: Vec<T> = r.vec(tokens * heads * D, -1.0, 1.0);
    let scale = 1.0 / (D as f32).sqrt();
    let mut want = Vec::new();
    for (s, &l) in qlens.iter().enumerate() {
        for i in 0..l {
            let tok = qsl[s] as usize + i;
            let pos = ctx[s] as usize - l + i;
            for h in 0..heads {
                want.extend(kv.reference(
                    &q[(tok * heads + h) * D..][..D],
                    s,
                    h,
                    heads,
                    pos + 1,
                    scale as f64,
                    D,
                ));
            }
        }
    }
    let mut out = poisoned::<T>(tokens * heads * D);
    let (o, qp, kp, vp, bt, cl, ql) = (
        out.as_mut_ptr(),
        q.as_ptr(),
        kv.k.as_ptr(),
        kv.v.as_ptr(),
        kv.tables.as_ptr(),
        kv.ctx.as_ptr(),
        qsl.as_ptr(),
    );
    let cfg = geom::prefill_attention(tokens as u32, heads as u32, max as u32, THREADS);
    // SAFETY: buffers sized as the kernel's contract requires; they outlive the launch.
    unsafe {
        launch(cfg, || {
            prefill_attention::<T, D>(
                o,
                qp,
                kp,
                vp,
                bt,
                cl,
                ql,
                ctx.len() as u32,
                kv_heads as u32,
                scale,
                bs as u32,
                max_blocks as u32,
                0,
            )
        })
    };
    assert_close(
        &format!("prefill D={D} bs={bs} ctx={ctx:?} q={qlens:?}"),
        r.seed,
        &out,
        &want,
    );
}

#[test]
fn prefill_f32() {
    prefill_case::<f32, 64>("prefill_f32");
}

#[test]
fn prefill_f32_h16() {
    prefill_case::<f32, 16>("prefill_f32_h16");
}

#[test]
fn prefill_f16() {
    prefill_case::<F16, 80>("prefill_f16");
}

#[test]
fn prefill_bf16() {
    prefill_case::<BF16, 128>("prefill_bf16");
}

fn shape(seqs: u32, heads: u32, kv_heads: u32, d: u32, ctx: u32, bs: u32) -> geom::DecodeShape {
    geom::DecodeShape {
        num_seqs: seqs,
        num_heads: heads,
        num_kv_heads: kv_heads,
        head_dim: d,
        max_context_len: ctx,
        total_context_len: seqs as u64 * ctx as u64,
        block_size: bs,
        sm_count: 132,
        threads: 128,
    }
}

#[test]
fn planner_splits_small_batches_and_keeps_large_ones_whole() {
    // vLLM's shape: 8 KV groups x 8 sequences = 64 blocks, far from filling 132 SMs.
    match geom::plan_decode(shape(8, 64, 8, 128, 4096, 16)) {
        geom::DecodePlan::V2 {
            attention,
            partition_size,
            max_partitions,
            ..
        } => {
            assert_eq!(partition_size % 16, 0);
            assert!(partition_size >= geom::MIN_PARTITION);
            assert_eq!(max_partitions, 4096u32.div_ceil(partition_size));
            assert_eq!(attention.grid, geom::Dim3::xyz(8, 8, max_partitions));
            assert!(attention.grid.count() >= 132 * geom::DECODE_BLOCKS_PER_SM as usize);
        }
        p => panic!("vLLM's shape should split: {p:?}"),
    }
    // SmolLM2 at batch 256: 3 groups x 256 sequences fill the device in one pass.
    let p = geom::plan_decode(shape(256, 9, 3, 64, 1024, 16));
    assert_eq!(
        p,
        geom::DecodePlan::V1(geom::decode_v1(256, 9, 3, 64, 128)),
        "SmolLM2 batch 256"
    );
    // Short contexts never split.
    assert!(matches!(
        geom::plan_decode(shape(1, 32, 8, 128, 200, 16)),
        geom::DecodePlan::V1(_)
    ));
    // A block size that does not divide 256 still gets whole blocks per partition.
    if let geom::DecodePlan::V2 { partition_size, .. } =
        geom::plan_decode(shape(1, 8, 8, 128, 8192, 48))
    {
        assert_eq!(partition_size % 48, 0);
    } else {
        panic!("one sequence of 8192 tokens should split");
    }
}

/// The planner's choice, launched as an executor would, matches the reference.
#[test]
fn planned_decode_runs() {
    const D: usize = 64;
    let mut r = TestRng::new("planned_decode_runs");
    let (bs, heads, kv_heads, max_blocks) = (16usize, 4usize, 2usize, 40usize);
    let ctx = vec![r.range(300, 640) as u32, r.range(1, 40) as u32];
    let kv = Paged::<BF16>::new(&mut r, &ctx, bs, kv_heads, D, max_blocks);
    let q: Vec<BF16> = r.vec(ctx.len() * heads * D, -1.0, 1.0);
    let scale = 1.0 / (D as f32).sqrt();
    let mut want = Vec::new();
    for (s, &c) in ctx.iter().enumerate() {
        for h in 0..heads {
            let qh = &q[(s * heads + h) * D..][..D];
            want.extend(kv.reference(qh, s, h, heads, c as usize, scale as f64, D));
        }
    }
    let mut s = shape(
        2,
        heads as u32,
        kv_heads as u32,
        D as u32,
        ctx[0],
        bs as u32,
    );
    (s.sm_count, s.threads, s.total_context_len) = (4, THREADS, (ctx[0] + ctx[1]) as u64);
    let geom::DecodePlan::V2 {
        attention,
        reduce,
        partition_size,
        max_partitions,
    } = geom::plan_decode(s)
    else {
        panic!("2 sequences on 4 SMs should split");
    };
    let plan = V2Plan {
        attention,
        reduce,
        partition_size,
        max_partitions,
    };
    let out = run_v2::<D>(&kv, &q, heads, scale, &plan, 0);
    assert_close(
        &format!("planned v2 partition {partition_size} ctx={ctx:?}"),
        r.seed,
        &out,
        &want,
    );
}
