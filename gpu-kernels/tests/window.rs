//! Sliding-window attention (Gemma 3's local layers) on the emulator against the f64
//! reference: a query at position `p` sees keys `max(0, p + 1 - window) ..= p`.
//!
//! Every attention kernel (decode v1, split-K v2 + reduce, streaming prefill, tensor-core
//! prefill) with windows smaller than, equal to and larger than the contexts, windows
//! that are not a multiple of the block size, window 1, ragged contexts, shuffled block
//! tables, GQA, head sizes up to 256, f32 / f16 / bf16; chunked prefill whose cached
//! prefix is longer than the window; v2 with partitions entirely outside the window,
//! launched both with the partitions of the whole context and with the planner's
//! windowed (fewer) partitions.
mod common;

use common::paged::{run_prefill_mma, run_v2, window_lo, Paged, V2Plan};
use common::{assert_close, poisoned, TestRng, BF16, F16, THREADS};
use gpu_kernels::attention::{paged_attention_v2_reduce, prefill_attention};
use gpu_kernels::decode::{paged_attention_v1, paged_attention_v2};
use gpu_kernels::device::emu::launch;
use gpu_kernels::{launch as geom, Storage};

/// Windows for contexts up to `max` with block size `bs`: 1, one that is not a multiple
/// of the block size (smaller than most contexts), one equal to a context (`ctx0`), and
/// one larger than every context.
fn windows(bs: usize, max: usize, ctx0: u32) -> Vec<u32> {
    vec![1, (bs + 3) as u32, ctx0, (max + 5) as u32]
}

/// Decode: v1, and v2 + reduce twice (grid of the whole longest context, and grid of
/// the windowed plan: `ceil(min(max_ctx, window) / partition)` partitions), per window.
fn decode_window_case<T: Storage, const D: usize>(
    r: &mut TestRng,
    bs: usize,
    heads: usize,
    kv_heads: usize,
) {
    let max_blocks = 40usize.div_ceil(bs).max(3);
    let max = bs * max_blocks;
    // Ragged, a block boundary, the maximum, 1, and one just past a block boundary.
    let ctx: Vec<u32> = vec![
        r.range(2, max - 1) as u32,
        (bs * r.range(1, max_blocks)) as u32,
        max as u32,
        1,
        (bs + 1) as u32,
    ];
    let seqs = ctx.len();
    let kv = Paged::<T>::new(r, &ctx, bs, kv_heads, D, max_blocks);
    let q: Vec<T> = r.vec(seqs * heads * D, -1.0, 1.0);
    let scale = 1.0 / (D as f32).sqrt();
    let max_ctx = *ctx.iter().max().unwrap_or(&1);
    let (h32, kvh32) = (heads as u32, kv_heads as u32);
    for window in windows(bs, max, ctx[0]) {
        let want: Vec<f64> = (0..seqs)
            .flat_map(|s| (0..heads).map(move |h| (s, h)))
            .flat_map(|(s, h)| {
                let len = ctx[s] as usize;
                kv.reference_range(
                    &q[(s * heads + h) * D..][..D],
                    s,
                    h,
                    heads,
                    window_lo(len - 1, window),
                    len,
                    scale as f64,
                    D,
                )
            })
            .collect();
        let what = format!(
            "{} D={D} bs={bs} heads={heads}/{kv_heads} ctx={ctx:?} window={window}",
            T::NAME
        );
        let mut out = poisoned::<T>(seqs * heads * D);
        let (o, qp, kp, vp, bt, cl) = (
            out.as_mut_ptr(),
            q.as_ptr(),
            kv.k.as_ptr(),
            kv.v.as_ptr(),
            kv.tables.as_ptr(),
            kv.ctx.as_ptr(),
        );
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
                    bs as u32,
                    max_blocks as u32,
                    window,
                )
            })
        };
        assert_close(&format!("v1 {what}"), r.seed, &out, &want);

        // Small partitions, so most of them lie wholly outside short windows.
        let part = [8u32, 16, 24][r.range(0, 2)];
        let eff_max = if window == 0 {
            max_ctx
        } else {
            max_ctx.min(window)
        };
        for grid_ctx in [max_ctx, eff_max] {
            let parts = geom::num_partitions(grid_ctx, part);
            let slots = seqs * heads * parts as usize;
            let mut tmp = vec![f32::NAN; slots * D];
            let mut ml = vec![f32::NAN; slots];
            let mut es = vec![f32::NAN; slots];
            let mut out2 = poisoned::<T>(seqs * heads * D);
            let (tp, mp, ep, o2) = (
                tmp.as_mut_ptr(),
                ml.as_mut_ptr(),
                es.as_mut_ptr(),
                out2.as_mut_ptr(),
            );
            let cfg = geom::decode_v2(seqs as u32, h32, kvh32, D as u32, grid_ctx, part, THREADS);
            let cfg_r = geom::paged_attention_v2_reduce(seqs as u32, h32, THREADS);
            // SAFETY: as above; scratch sized for `parts` partitions, as the grid writes.
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
                        bs as u32,
                        max_blocks as u32,
                        part,
                        window,
                    )
                });
                launch(cfg_r, || {
                    paged_attention_v2_reduce::<T, D>(o2, tp, mp, ep, cl, part, parts)
                });
            }
            assert_close(
                &format!("v2 partition {part} x {parts} {what}"),
                r.seed,
                &out2,
                &want,
            );
        }
    }
}

#[test]
fn window_decode_f32() {
    let mut r = TestRng::new("window_decode_f32");
    decode_window_case::<f32, 16>(&mut r, 8, 2, 1);
    decode_window_case::<f32, 256>(&mut r, 16, 2, 1);
}

#[test]
fn window_decode_f16() {
    let mut r = TestRng::new("window_decode_f16");
    decode_window_case::<F16, 80>(&mut r, 8, 2, 2);
    decode_window_case::<F16, 128>(&mut r, 16, 4, 2);
}

#[test]
fn window_decode_bf16() {
    let mut r = TestRng::new("window_decode_bf16");
    // Gemma-3-270M's shape (4 query heads on 1 KV head, head 256) and SmolLM2's 9:3.
    decode_window_case::<BF16, 256>(&mut r, 16, 4, 1);
    decode_window_case::<BF16, 64>(&mut r, 16, 9, 3);
}

/// (context, new query tokens) per sequence for the prefill kernels with window
/// `window`: the reference for every query row.
#[allow(clippy::too_many_arguments)]
fn prefill_reference<T: Storage>(
    kv: &Paged<T>,
    q: &[T],
    ctx: &[u32],
    qlens: &[usize],
    qsl: &[u32],
    heads: usize,
    d: usize,
    window: u32,
) -> Vec<f64> {
    let scale = 1.0 / (d as f64).sqrt();
    let mut want = Vec::new();
    for (s, &l) in qlens.iter().enumerate() {
        for i in 0..l {
            let tok = qsl[s] as usize + i;
            let pos = ctx[s] as usize - l + i;
            for h in 0..heads {
                want.extend(kv.reference_range(
                    &q[(tok * heads + h) * d..][..d],
                    s,
                    h,
                    heads,
                    window_lo(pos, window),
                    pos + 1,
                    scale,
                    d,
                ));
            }
        }
    }
    want
}

/// Query start offsets of `qlens`.
fn starts(qlens: &[usize]) -> Vec<u32> {
    let mut qsl = vec![0u32];
    for &l in qlens {
        qsl.push(qsl[qsl.len() - 1] + l as u32);
    }
    qsl
}

/// Streaming prefill over `shapes` = (context, new query tokens), per window.
fn prefill_window_case<T: Storage, const D: usize>(
    name: &str,
    bs: usize,
    heads: usize,
    kv_heads: usize,
    shapes: &[(usize, usize)],
    windows: &[u32],
) {
    let mut r = TestRng::new(name);
    let max = shapes.iter().map(|&(c, _)| c).max().unwrap_or(1);
    let max_blocks = max.div_ceil(bs) + 1;
    let ctx: Vec<u32> = shapes.iter().map(|&(c, _)| c as u32).collect();
    let qlens: Vec<usize> = shapes.iter().map(|&(_, q)| q).collect();
    let qsl = starts(&qlens);
    let tokens = qsl[qsl.len() - 1] as usize;
    let kv = Paged::<T>::new(&mut r, &ctx, bs, kv_heads, D, max_blocks);
    let q: Vec<T> = r.vec(tokens * heads * D, -1.0, 1.0);
    let scale = 1.0 / (D as f32).sqrt();
    for &window in windows {
        let want = prefill_reference(&kv, &q, &ctx, &qlens, &qsl, heads, D, window);
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
                    window,
                )
            })
        };
        assert_close(
            &format!(
                "prefill {} D={D} bs={bs} heads={heads}/{kv_heads} shapes={shapes:?} window={window}",
                T::NAME
            ),
            r.seed,
            &out,
            &want,
        );
    }
}

/// Prefill shapes: a prompt over several 8-row tiles, a chunk after a cached prefix far
/// longer than the small windows (whole blocks skipped), a chunk reaching a block
/// boundary, a decode-like row, a one-token prompt.
fn prefill_shapes(bs: usize) -> Vec<(usize, usize)> {
    vec![
        (19, 19),
        (3 * bs + 7, 10),
        (2 * bs, 9),
        (2 * bs + 3, 1),
        (1, 1),
    ]
}

#[test]
fn window_prefill_f32() {
    let bs = 8;
    prefill_window_case::<f32, 64>(
        "window_prefill_f32",
        bs,
        2,
        1,
        &prefill_shapes(bs),
        &[1, 3, 19, 100],
    );
}

#[test]
fn window_prefill_f16_h256() {
    let bs = 16;
    prefill_window_case::<F16, 256>(
        "window_prefill_f16_h256",
        bs,
        2,
        1,
        &prefill_shapes(bs),
        &[1, 19, 80],
    );
}

#[test]
fn window_prefill_bf16() {
    let bs = 32;
    prefill_window_case::<BF16, 80>(
        "window_prefill_bf16",
        bs,
        2,
        2,
        &prefill_shapes(bs),
        &[2, 9, 45, 300],
    );
}

/// Tolerance of the tensor-core prefill: the storage's usual one plus the rounding of P
/// to `T` before the PV product (as `tests/prefill_mma.rs`).
fn mma_tol<T: Storage>() -> (f64, f64) {
    match T::NAME {
        "f16" => (1e-3 + 2f64.powi(-11), 1e-3),
        _ => (1e-3 + 2f64.powi(-9), 1.6e-2),
    }
}

/// Tensor-core prefill over `shapes` = (context, new query tokens), per window.
fn mma_window_case<T: Storage, const D: usize>(
    name: &str,
    bs: usize,
    heads: usize,
    kv_heads: usize,
    shapes: &[(usize, usize)],
    windows: &[u32],
) {
    let threads = geom::ATTN_THREADS;
    let mut r = TestRng::new(name);
    let max = shapes.iter().map(|&(c, _)| c).max().unwrap_or(1);
    let max_blocks = max.div_ceil(bs) + 1;
    let ctx: Vec<u32> = shapes.iter().map(|&(c, _)| c as u32).collect();
    let qlens: Vec<usize> = shapes.iter().map(|&(_, q)| q).collect();
    let qsl = starts(&qlens);
    let tokens = qsl[qsl.len() - 1] as usize;
    let kv = Paged::<T>::new(&mut r, &ctx, bs, kv_heads, D, max_blocks);
    let q: Vec<T> = r.vec(tokens * heads * D, -1.0, 1.0);
    let scale = 1.0 / (D as f32).sqrt();
    let (atol, rtol) = mma_tol::<T>();
    for &window in windows {
        let want = prefill_reference(&kv, &q, &ctx, &qlens, &qsl, heads, D, window);
        let out = run_prefill_mma::<T, D>(&kv, &q, &qsl, heads, scale, threads, window);
        let what = format!(
            "prefill_mma {} D={D} bs={bs} heads={heads}/{kv_heads} shapes={shapes:?} window={window}",
            T::NAME
        );
        for (i, (g, w)) in out.iter().zip(&want).enumerate() {
            let g = g.to_f32() as f64;
            let (tok, h, d) = (i / (heads * D), i / D % heads, i % D);
            assert!(
                (g - w).abs() <= atol + rtol * w.abs(),
                "{what}: token {tok} head {h} dim {d}: got {g}, want {w} (seed {})",
                r.seed
            );
        }
    }
}

#[test]
fn window_mma_bf16_h256_gemma() {
    // Gemma-3-270M's head 256 (KV tiles of 32) with GQA. A 70-token prompt (two query
    // tiles), a 40-token chunk after a 150-token prefix (whole KV tiles before the
    // window skipped), a decode-like row; windows 1, one equal to the prompt, Gemma's
    // 512 (larger than every context), and 13 (not a multiple of the KV tile or block):
    // in the prompt's first query tile, warp 2 (rows 32..48) computes KV tile 0..32 for
    // row 32's window 20..=32 while rows 45..48 see no key in it yet (their softmax must
    // stay finite).
    mma_window_case::<BF16, 256>(
        "window_mma_bf16_h256",
        16,
        2,
        1,
        &[(70, 70), (190, 40), (37, 1)],
        &[1, 13, 70, 512],
    );
}

#[test]
fn window_mma_f16_h64_block8() {
    // KV tiles of 64: a window of 1 leaves most rows of a query tile with no key in the
    // tile's first KV tile (the softmax must stay finite for them).
    mma_window_case::<F16, 64>(
        "window_mma_f16_h64",
        8,
        2,
        1,
        &[(70, 70), (150, 66), (9, 9)],
        &[1, 13, 64, 65, 100],
    );
}

#[test]
fn window_mma_bf16_h128_gqa() {
    mma_window_case::<BF16, 128>(
        "window_mma_bf16_h128",
        32,
        4,
        2,
        &[(130, 130), (100, 3)],
        &[1, 33, 1000],
    );
}

#[test]
fn window_mma_f16_h16_and_h96() {
    mma_window_case::<F16, 16>(
        "window_mma_f16_h16",
        16,
        2,
        1,
        &[(80, 80), (40, 5)],
        &[3, 17],
    );
    mma_window_case::<F16, 96>("window_mma_f16_h96", 16, 3, 1, &[(106, 66)], &[1, 24, 40]);
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
fn window_planner_uses_the_attended_tokens() {
    // Window 0 is exactly the plain planner.
    for s in [
        shape(8, 64, 8, 128, 4096, 16),
        shape(256, 9, 3, 64, 1024, 16),
        shape(1, 4, 1, 256, 8192, 16),
    ] {
        assert_eq!(
            geom::plan_decode_window(s, 0),
            geom::plan_decode(s),
            "{s:?}"
        );
    }
    // Gemma-3-270M, one sequence of 8192 tokens: the plain plan cuts 8192 tokens, the
    // windowed one only the 512 attended (at most 2 partitions of >= 256).
    let s = shape(1, 4, 1, 256, 8192, 16);
    let geom::DecodePlan::V2 {
        max_partitions: plain,
        ..
    } = geom::plan_decode(s)
    else {
        panic!("8192 tokens on one block should split");
    };
    match geom::plan_decode_window(s, 512) {
        geom::DecodePlan::V2 {
            attention,
            partition_size,
            max_partitions,
            ..
        } => {
            assert_eq!(max_partitions, 512u32.div_ceil(partition_size));
            assert!(
                max_partitions <= 2 && max_partitions < plain,
                "{max_partitions}"
            );
            assert_eq!(attention.grid, geom::Dim3::xyz(1, 1, max_partitions));
        }
        p => panic!("a 512-token window on one block should still split: {p:?}"),
    }
    // A window no longer than the smallest partition never splits.
    assert!(matches!(
        geom::plan_decode_window(s, geom::MIN_PARTITION),
        geom::DecodePlan::V1(_)
    ));
    // A window longer than every context changes nothing.
    assert_eq!(geom::plan_decode_window(s, 10_000), geom::plan_decode(s));
}

/// The windowed planner's choice, launched as an executor would, matches the reference.
#[test]
fn window_planned_decode_runs() {
    const D: usize = 64;
    let mut r = TestRng::new("window_planned_decode_runs");
    let (bs, heads, kv_heads, max_blocks) = (16usize, 4usize, 2usize, 40usize);
    let window = r.range(260, 299) as u32;
    let ctx = vec![r.range(520, 640) as u32, r.range(1, 40) as u32];
    let kv = Paged::<BF16>::new(&mut r, &ctx, bs, kv_heads, D, max_blocks);
    let q: Vec<BF16> = r.vec(ctx.len() * heads * D, -1.0, 1.0);
    let scale = 1.0 / (D as f32).sqrt();
    let mut want = Vec::new();
    for (s, &c) in ctx.iter().enumerate() {
        let (c, lo) = (c as usize, window_lo(c as usize - 1, window));
        for h in 0..heads {
            let qh = &q[(s * heads + h) * D..][..D];
            want.extend(kv.reference_range(qh, s, h, heads, lo, c, scale as f64, D));
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
    } = geom::plan_decode_window(s, window)
    else {
        panic!("2 sequences on 4 SMs should split");
    };
    // Fewer partitions than the longest context has: the reduce must not read past them.
    assert!(max_partitions < geom::num_partitions(ctx[0], partition_size));
    let plan = V2Plan {
        attention,
        reduce,
        partition_size,
        max_partitions,
    };
    let out = run_v2::<D>(&kv, &q, heads, scale, &plan, window);
    assert_close(
        &format!(
            "planned windowed v2 partition {partition_size} x {max_partitions} ctx={ctx:?} window={window}"
        ),
        r.seed,
        &out,
        &want,
    );
}
