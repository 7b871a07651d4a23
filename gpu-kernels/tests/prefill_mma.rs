//! The tensor-core prefill (`prefill_attention_mma`) on the emulator against the f64
//! reference: ragged lengths, several 64-row query tiles and KV tiles per sequence,
//! chunked prefill over a cached prefix, decode-like single rows, shuffled block tables,
//! block sizes 8/16/32, GQA, head sizes 16/64/80/96/128/256, bf16 and f16.
mod common;

use common::paged::{run_prefill_mma, Paged};
use common::{TestRng, BF16, F16};
use gpu_kernels::{launch as geom, Storage};

/// 4 warps: 64-row query tiles, as on the GPU.
const THREADS: u32 = geom::ATTN_THREADS;

/// Tolerance: the storage's usual one plus the rounding of P to `T` before the PV
/// product (relative 2^-9 for bf16, 2^-12 for f16 per weight, so at most that times
/// max |v| = 1 on the output).
fn tol<T: Storage>() -> (f64, f64) {
    match T::NAME {
        "f16" => (1e-3 + 2f64.powi(-11), 1e-3),
        _ => (1e-3 + 2f64.powi(-9), 1.6e-2),
    }
}

/// One launch over `shapes` = (context length, new query tokens) per sequence.
fn mma_case<T: Storage, const D: usize>(
    name: &str,
    bs: usize,
    heads: usize,
    kv_heads: usize,
    shapes: &[(usize, usize)],
) {
    let mut r = TestRng::new(name);
    let max = shapes.iter().map(|&(c, _)| c).max().unwrap_or(1);
    let max_blocks = max.div_ceil(bs) + 1;
    let ctx: Vec<u32> = shapes.iter().map(|&(c, _)| c as u32).collect();
    let qlens: Vec<usize> = shapes.iter().map(|&(_, q)| q).collect();
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
                let qrow = &q[(tok * heads + h) * D..][..D];
                want.extend(kv.reference(qrow, s, h, heads, pos + 1, scale as f64, D));
            }
        }
    }
    let out = run_prefill_mma::<T, D>(&kv, &q, &qsl, heads, scale, THREADS, 0);
    let (atol, rtol) = tol::<T>();
    let what = format!(
        "prefill_mma {} D={D} bs={bs} heads={heads}/{kv_heads} shapes={shapes:?}",
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

/// Ragged prefill: one sequence over two query tiles and two KV tiles (70 tokens), a
/// chunk of 5 new tokens after a cached prefix that ends mid-block, a decode-like row,
/// a short prompt.
fn ragged(bs: usize) -> Vec<(usize, usize)> {
    vec![(70, 70), (3 * bs + 5, 5), (37, 1), (9, 9)]
}

#[test]
fn mma_bf16_h128_ragged_gqa() {
    mma_case::<BF16, 128>("mma_bf16_h128", 16, 4, 2, &ragged(16));
}

#[test]
fn mma_f16_h64_ragged_block8() {
    mma_case::<F16, 64>("mma_f16_h64", 8, 2, 1, &ragged(8));
}

#[test]
fn mma_bf16_h80_block32() {
    mma_case::<BF16, 80>("mma_bf16_h80", 32, 2, 2, &ragged(32));
}

#[test]
fn mma_f16_h96_chunk_spans_tiles() {
    // A 66-token chunk after a 40-token prefix: the chunk's two query tiles start mid KV
    // tile and the diagonal crosses a KV tile boundary.
    mma_case::<F16, 96>("mma_f16_h96", 16, 3, 1, &[(106, 66), (2, 2)]);
}

#[test]
fn mma_bf16_h256_block8() {
    // KV tiles of 32 tokens at head 256: three of them for 70 tokens.
    mma_case::<BF16, 256>("mma_bf16_h256", 8, 2, 1, &[(70, 70), (40, 3)]);
}

#[test]
fn mma_f16_h256_and_h16() {
    mma_case::<F16, 256>("mma_f16_h256", 32, 1, 1, &[(35, 20)]);
    mma_case::<F16, 16>("mma_f16_h16", 16, 2, 1, &ragged(16));
}
