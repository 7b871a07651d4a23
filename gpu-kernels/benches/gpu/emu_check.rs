//! Runs the GPU benchmark's validation problem on the host emulator, so the problem
//! builder, the f64 reference and the launch parameters the CUDA path uses are checked
//! on every machine, GPU or not. Small shape (4 ragged sequences, 8 query / 2 KV heads,
//! contexts up to 96, split-K partition 32), without and with a sliding window (the
//! windowed reference of the Gemma figure): a few seconds of emulation.

use crate::problem::{check_close, poisoned, BenchRng, DecodeProblem, DecodeShape, D};
use gpu_kernels::attention::paged_attention_v2_reduce;
use gpu_kernels::decode::{paged_attention_v1, paged_attention_v2};
use gpu_kernels::device::emu::launch;
use gpu_kernels::launch as geom;
use half::bf16;

/// Emulated threads per block (two warps, so cross-warp reductions run).
const THREADS: u32 = 64;
/// Split-K partition of the emulator check (smaller than the longest context).
const PARTITION: u32 = 32;

/// Validates v1 and the v2 split-K pair on the emulator against the f64 reference,
/// without a window and with one shorter than most contexts.
pub fn run(r: &mut BenchRng) -> Result<(), String> {
    let shape = DecodeShape::ragged(r, 8, 2, 96);
    let mut p = DecodeProblem::random(r, shape);
    let window = r.range(2, 60) as u32;
    for w in [0, window] {
        p.shape.window = w;
        check(r.seed, &p)?;
    }
    Ok(())
}

fn check(seed: u64, p: &DecodeProblem) -> Result<(), String> {
    let want = p.reference();
    let s = &p.shape;
    let (seqs, heads, max_ctx) = (s.ctx.len() as u32, s.heads as u32, s.max_ctx());
    let (kv_heads, bs, mb) = (
        s.kv_heads as u32,
        s.block_size as u32,
        s.max_blocks() as u32,
    );
    let w = s.window;
    let (qp, kp, vp, bt, cl) = (
        p.q.as_ptr(),
        p.k.as_ptr(),
        p.v.as_ptr(),
        p.tables.as_ptr(),
        s.ctx.as_ptr(),
    );

    let mut out = poisoned(p.q.len());
    let o = out.as_mut_ptr();
    let cfg = geom::decode_v1(seqs, heads, kv_heads, D as u32, THREADS);
    // SAFETY: every buffer is sized for this shape (DecodeProblem's invariants) and
    // outlives the launch, which joins its threads before returning.
    unsafe {
        launch(cfg, || {
            paged_attention_v1::<bf16, D>(
                o, qp, kp, vp, bt, cl, heads, kv_heads, p.scale, bs, mb, w,
            )
        })
    };
    check_close(&format!("emulator v1 window {w}"), seed, &out, &want)?;

    let parts = geom::num_partitions(max_ctx, PARTITION);
    let slots = p.q.len() / D * parts as usize;
    let (mut tmp, mut ml, mut es) = (
        vec![f32::NAN; slots * D],
        vec![f32::NAN; slots],
        vec![f32::NAN; slots],
    );
    let mut out2 = poisoned(p.q.len());
    let (tp, mp, ep, o2) = (
        tmp.as_mut_ptr(),
        ml.as_mut_ptr(),
        es.as_mut_ptr(),
        out2.as_mut_ptr(),
    );
    let cfg = geom::decode_v2(seqs, heads, kv_heads, D as u32, max_ctx, PARTITION, THREADS);
    let cfg_r = geom::paged_attention_v2_reduce(seqs, heads, THREADS);
    // SAFETY: as above; the reduce reads only the partitions the first launch wrote.
    unsafe {
        launch(cfg, || {
            paged_attention_v2::<bf16, D>(
                tp, mp, ep, qp, kp, vp, bt, cl, heads, kv_heads, p.scale, bs, mb, PARTITION, w,
            )
        });
        launch(cfg_r, || {
            paged_attention_v2_reduce::<bf16, D>(o2, tp, mp, ep, cl, PARTITION, parts)
        });
    }
    check_close(&format!("emulator v2 window {w}"), seed, &out2, &want)?;
    println!(
        "emulator check: paged_attention v1 and v2 (partition {PARTITION}) bf16 h{D} match the \
         f64 reference, contexts {:?}, {}/{} heads, window {w}",
        s.ctx, s.heads, s.kv_heads
    );
    Ok(())
}
