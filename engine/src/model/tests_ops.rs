//! Each op against a plain, obviously-correct reference.

use super::attention::{paged_attention, plan, AttnParams};
use super::kv_cache::{KvCache, KvDtype, KvGeometry};
use super::ops::{
    dot, exp, gelu_tanh_mul, rms_norm, rms_norm_in_place, rope_inv_freq, silu_mul,
    softmax_in_place, RopeTables,
};
use super::test_util::rand_vec;
use engine_core::BlockId;
use engine_core::SeqSpan;
use model_loader::RopeScaling;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

fn close(a: &[f32], b: &[f32], tol: f32) {
    assert_eq!(a.len(), b.len());
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!(
            (x - y).abs() <= tol * (1.0 + y.abs()),
            "element {i}: {x} vs {y}"
        );
    }
}

#[test]
fn dot_and_softmax_match_reference() {
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    for n in [1, 7, 8, 32, 40, 64, 100, 129] {
        let (a, b) = (rand_vec(&mut rng, n), rand_vec(&mut rng, n));
        let want: f64 = a.iter().zip(&b).map(|(x, y)| *x as f64 * *y as f64).sum();
        assert!((dot(&a, &b) as f64 - want).abs() < 1e-5);
    }
    let mut x = vec![1000.0f32, 1001.0, 999.0];
    softmax_in_place(&mut x);
    let e = [(-1.0f64).exp(), 1.0, (-2.0f64).exp()];
    let s: f64 = e.iter().sum();
    close(&x, &e.map(|v| (v / s) as f32), 1e-6);
}

#[test]
fn vector_exp_is_within_two_ulp_of_f64_exp() {
    let mut worst = 0.0f64;
    let steps = 200_000;
    for i in 0..=steps {
        // The whole clamped range: n from -126 to 127 (the exponent's
        // ends, built from n's bits).
        let x = -87.3 + 175.5 * i as f64 / steps as f64;
        let want = (x as f32 as f64).exp();
        let rel = (exp(x as f32) as f64 - want).abs() / want;
        worst = worst.max(rel);
    }
    // 2 ulp of f32 is 2^-22 relative, about 2.4e-7.
    assert!(worst < 2.4e-7, "worst relative error {worst:e}");
    assert_eq!(exp(0.0), 1.0);
    assert!(exp(-1000.0) < 1e-37 && exp(1000.0).is_finite() && exp(f32::NAN).is_nan());
    for x in [f32::NEG_INFINITY, -87.336_54, 88.3, f32::INFINITY] {
        let y = exp(x);
        assert!(y.is_normal() && y > 0.0, "exp({x}) = {y}");
    }
}

#[test]
fn rms_norm_matches_reference() {
    let mut rng = ChaCha8Rng::seed_from_u64(2);
    let (rows, h) = (3, 40);
    let x = rand_vec(&mut rng, rows * h);
    let w = rand_vec(&mut rng, h);
    let mut out = vec![0.0; rows * h];
    rms_norm(&x, &w, 1e-6, &mut out);
    let mut want = Vec::new();
    for r in 0..rows {
        let row = &x[r * h..(r + 1) * h];
        let ms: f64 = row.iter().map(|v| (*v as f64).powi(2)).sum::<f64>() / h as f64;
        for j in 0..h {
            want.push((row[j] as f64 / (ms + 1e-6).sqrt() * w[j] as f64) as f32);
        }
    }
    close(&out, &want, 1e-5);
}

#[test]
fn silu_mul_matches_reference() {
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let (rows, inter) = (2, 13);
    let gu: Vec<f32> = rand_vec(&mut rng, rows * 2 * inter)
        .iter()
        .map(|v| v * 6.0)
        .collect();
    let mut out = vec![0.0; rows * inter];
    silu_mul(&gu, inter, &mut out);
    let mut want = Vec::new();
    for r in 0..rows {
        for j in 0..inter {
            let g = gu[r * 2 * inter + j] as f64;
            let u = gu[r * 2 * inter + inter + j] as f64;
            want.push((g * (1.0 / (1.0 + (-g).exp())) * u) as f32);
        }
    }
    close(&out, &want, 1e-5);
}

/// HF `_compute_llama3_parameters`, transcribed independently.
fn hf_llama3_freqs(dim: usize, base: f64, factor: f64, low: f64, high: f64, old: f64) -> Vec<f64> {
    let mut out = Vec::new();
    for i in (0..dim).step_by(2) {
        let f = 1.0 / base.powf(i as f64 / dim as f64);
        let wavelen = 2.0 * std::f64::consts::PI / f;
        let scaled = if wavelen > old / low { f / factor } else { f };
        let smooth = (old / wavelen - low) / (high - low);
        let smoothed = (1.0 - smooth) * scaled / factor + smooth * scaled;
        let is_medium = wavelen >= old / high && wavelen <= old / low;
        out.push(if is_medium { smoothed } else { scaled });
    }
    out
}

#[test]
fn rope_inverse_frequencies_plain_and_llama3() {
    let plain = rope_inv_freq(8, 10000.0, None);
    close(
        &plain.iter().map(|v| *v as f32).collect::<Vec<_>>(),
        &[1.0, 0.1, 0.01, 0.001],
        1e-6,
    );
    let scaling = RopeScaling::Llama3 {
        factor: 8.0,
        low_freq_factor: 1.0,
        high_freq_factor: 4.0,
        original_max_position_embeddings: 8192,
    };
    let ours = rope_inv_freq(128, 500000.0, Some(scaling));
    let want = hf_llama3_freqs(128, 500000.0, 8.0, 1.0, 4.0, 8192.0);
    for (a, b) in ours.iter().zip(&want) {
        assert!((a - b).abs() <= 1e-12 + 1e-9 * b.abs(), "{a} vs {b}");
    }
    // Highest frequency untouched, lowest divided by the factor, some smoothed.
    let base = rope_inv_freq(128, 500000.0, None);
    assert_eq!(ours[0], base[0]);
    assert!((ours[63] - base[63] / 8.0).abs() < 1e-15);
    assert!(ours
        .iter()
        .zip(&base)
        .any(|(o, b)| *o < *b && *o > *b / 8.0));
}

#[test]
fn rope_apply_is_rotate_half() {
    let mut rng = ChaCha8Rng::seed_from_u64(4);
    let (hd, heads, theta) = (16usize, 3usize, 5000.0f32);
    let tables = RopeTables::new(hd, theta, None, 64);
    for pos in [0usize, 1, 17, 63] {
        let x = rand_vec(&mut rng, heads * hd);
        let mut ours = x.clone();
        tables.apply(&mut ours, pos);
        let mut want = vec![0.0f32; heads * hd];
        for h in 0..heads {
            let v = &x[h * hd..(h + 1) * hd];
            // rotate_half(v) = [-v[half..], v[..half]]; out = v*cos + rotate_half(v)*sin
            for j in 0..hd {
                let i = j % (hd / 2);
                let ang = pos as f64 / (theta as f64).powf(2.0 * i as f64 / hd as f64);
                let rot = if j < hd / 2 {
                    -v[j + hd / 2]
                } else {
                    v[j - hd / 2]
                };
                want[h * hd + j] = (v[j] as f64 * ang.cos() + rot as f64 * ang.sin()) as f32;
            }
        }
        close(&ours, &want, 1e-5);
    }
}

/// Contiguous, naive causal GQA attention for one sequence:
/// k, v are `[ctx, kv_heads, hd]`, q is `[qlen, heads, hd]` at positions ctx-qlen...
/// With `window = Some(w)`, key `j` is masked for a query at `p` when `p - j >= w`.
#[allow(clippy::too_many_arguments)]
fn naive_attention(
    window: Option<usize>,
    scale: f64,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    qlen: usize,
    ctx: usize,
    heads: usize,
    kvh: usize,
    hd: usize,
) -> Vec<f32> {
    let mut out = vec![0.0f32; qlen * heads * hd];
    for i in 0..qlen {
        let p = ctx - qlen + i;
        for h in 0..heads {
            let g = h / (heads / kvh);
            let qv = &q[(i * heads + h) * hd..][..hd];
            let visible = |j: usize| window.is_none_or(|w| p - j < w);
            let s: Vec<f64> = (0..=p)
                .map(|j| {
                    let kv = &k[(j * kvh + g) * hd..][..hd];
                    qv.iter()
                        .zip(kv)
                        .map(|(a, b)| *a as f64 * *b as f64)
                        .sum::<f64>()
                        * scale
                })
                .collect();
            let m = s.iter().cloned().fold(f64::MIN, f64::max);
            let e: Vec<f64> = s
                .iter()
                .enumerate()
                .map(|(j, x)| if visible(j) { (x - m).exp() } else { 0.0 })
                .collect();
            let z: f64 = e.iter().sum();
            for d in 0..hd {
                let acc: f64 = (0..=p)
                    .map(|j| e[j] / z * v[(j * kvh + g) * hd + d] as f64)
                    .sum();
                out[(i * heads + h) * hd + d] = acc as f32;
            }
        }
    }
    out
}

/// Sequences given as (query_len, context_len); block tables drawn from a
/// shuffled pool; all K/V written through the slot mapping, into an f32
/// pool and into an f16 one (whose reference reads the K/V rounded to f16).
fn check_paged_attention(shapes: &[(usize, usize)], block_size: usize, seed: u64) {
    check_paged_attention_with(shapes, block_size, seed, AttnParams::causal(16));
}

fn check_paged_attention_with(
    shapes: &[(usize, usize)],
    block_size: usize,
    seed: u64,
    params: AttnParams,
) {
    for dtype in [KvDtype::F32, KvDtype::F16] {
        check_paged_attention_in(shapes, block_size, seed, params, dtype, (6, 2));
    }
}

fn check_paged_attention_in(
    shapes: &[(usize, usize)],
    block_size: usize,
    seed: u64,
    params: AttnParams,
    dtype: KvDtype,
    (heads, kvh): (usize, usize),
) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let hd = 16;
    let te = kvh * hd;
    let need: usize = shapes.iter().map(|(_, c)| c.div_ceil(block_size)).sum();
    let geom = KvGeometry {
        num_layers: 1,
        num_blocks: need + 3,
        block_size,
        num_kv_heads: kvh,
        head_dim: hd,
    };
    let mut pool: Vec<u32> = (0..geom.num_blocks as u32).collect();
    pool.shuffle(&mut rng);
    let mut cache = KvCache::with_dtype(geom, dtype);
    let mut seqs = Vec::new();
    let mut q_all = Vec::new();
    let mut want = Vec::new();
    for &(qlen, ctx) in shapes {
        let table: Vec<BlockId> = pool
            .drain(..ctx.div_ceil(block_size))
            .map(BlockId)
            .collect();
        let k = rand_vec(&mut rng, ctx * te);
        let v = rand_vec(&mut rng, ctx * te);
        let slots: Vec<usize> = (0..ctx)
            .map(|p| table[p / block_size].0 as usize * block_size + p % block_size)
            .collect();
        cache.layer_mut(0).write(&k, &v, te, &slots, te);
        let stored = |x: Vec<f32>| match dtype {
            KvDtype::F32 => x,
            KvDtype::F16 => x.iter().map(|&e| half::f16::from_f32(e).to_f32()).collect(),
        };
        let (k, v) = (stored(k), stored(v));
        let q = rand_vec(&mut rng, qlen * heads * hd);
        want.extend(naive_attention(
            params.window,
            params.scale as f64,
            &q,
            &k,
            &v,
            qlen,
            ctx,
            heads,
            kvh,
            hd,
        ));
        q_all.extend(q);
        seqs.push(SeqSpan {
            query_len: qlen,
            context_len: ctx,
            block_table: table,
        });
    }
    let rows: usize = shapes.iter().map(|s| s.0).sum();
    let mut out = vec![f32::NAN; rows * heads * hd];
    let tasks = plan(&seqs, heads, kvh);
    paged_attention(
        params,
        &q_all,
        heads * hd,
        cache.layer(0),
        &geom,
        &seqs,
        &tasks,
        heads,
        &mut out,
    );
    close(&out, &want, 2e-5);
}

#[test]
fn paged_attention_ragged_shuffled_equals_naive() {
    // Prefill, decode, chunk with cached prefix, long chunk over many tasks.
    check_paged_attention(&[(5, 5), (1, 23), (7, 40), (1, 1), (37, 37)], 4, 10);
    check_paged_attention(&[(3, 70), (1, 9), (20, 20)], 16, 11);
}

#[test]
fn paged_attention_at_block_boundaries() {
    // Context exactly a whole number of blocks, and one past it.
    check_paged_attention(&[(1, 16), (16, 16), (1, 17), (2, 32)], 16, 12);
    check_paged_attention(&[(1, 1), (4, 8)], 1, 13);
}

#[test]
fn head_groups_of_every_size_split_across_tasks() {
    // GQA groups of 1 (no sharing), 5 and 8 heads (more than one call of
    // the row kernels serves), one KV head; a single decode row makes
    // `plan` split the group into smaller tasks to feed the pool.
    for (heads, kvh) in [(4, 4), (5, 1), (8, 1), (8, 2)] {
        for shapes in [&[(1, 30)][..], &[(6, 6), (1, 19)][..]] {
            check_paged_attention_in(
                shapes,
                4,
                30,
                AttnParams::causal(16),
                KvDtype::F16,
                (heads, kvh),
            );
        }
    }
}

#[test]
fn sliding_window_attention_equals_masked_naive() {
    // Windows smaller than, equal to and larger than the contexts, across
    // block boundaries, for prefill, chunked prefill and decode rows.
    for (w, seed) in [(1, 20), (3, 21), (5, 22), (8, 23), (64, 24)] {
        let params = AttnParams {
            scale: 0.37,
            window: Some(w),
            wide: true,
        };
        check_paged_attention_with(
            &[(5, 5), (1, 23), (7, 40), (1, 1), (20, 20)],
            4,
            seed,
            params,
        );
    }
}

#[test]
fn gelu_tanh_matches_pytorch() {
    // torch.nn.functional.gelu(x, approximate="tanh") in float64.
    let xs = [-3.0f32, -1.0, -0.5, 0.0, 0.3, 1.0, 2.0, 5.0];
    let want = [
        -0.003_637_392,
        -0.158_808,
        -0.154_286,
        0.0,
        0.185_370_92,
        0.841_192,
        1.954_597_7,
        5.0,
    ];
    // gate = x, up = 2: out = 2 gelu(x).
    let gate_up: Vec<f32> = xs.iter().copied().chain([2.0; 8]).collect();
    let mut out = [0.0f32; 8];
    gelu_tanh_mul(&gate_up, 8, &mut out);
    let want2: Vec<f32> = want.iter().map(|w| 2.0 * w).collect();
    close(&out, &want2, 1e-6);
}

#[test]
fn rms_norm_in_place_normalizes_each_head() {
    let mut rng = ChaCha8Rng::seed_from_u64(30);
    let (heads, hd) = (3, 8);
    let x = rand_vec(&mut rng, heads * hd);
    let w = rand_vec(&mut rng, hd);
    let mut got = x.clone();
    rms_norm_in_place(&mut got, &w, 1e-6);
    let mut want = Vec::new();
    for head in x.chunks(hd) {
        let ms: f64 = head.iter().map(|v| (*v as f64).powi(2)).sum::<f64>() / hd as f64;
        let inv = 1.0 / (ms + 1e-6).sqrt();
        want.extend(
            head.iter()
                .zip(&w)
                .map(|(v, w)| (*v as f64 * inv * *w as f64) as f32),
        );
    }
    close(&got, &want, 1e-5);
}
