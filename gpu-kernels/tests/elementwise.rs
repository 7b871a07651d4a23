//! RMSNorm, fused add + RMSNorm, rotary embedding, SiLU-and-mul and embedding gather on
//! the emulator against f64 references.
mod common;

use common::{assert_bits_eq, assert_close, poisoned, round, to_f64, TestRng, BF16, F16, THREADS};
use gpu_kernels::device::emu::launch;
use gpu_kernels::elementwise::{embedding, rotary_embedding, silu_and_mul};
use gpu_kernels::norm::{fused_add_rms_norm, rms_norm};
use gpu_kernels::{launch as geom, Storage};

const EPS: f32 = 1e-5;

fn rms_ref(x: &[f64], w: &[f64]) -> Vec<f64> {
    let inv = 1.0 / (x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64 + EPS as f64).sqrt();
    x.iter().zip(w).map(|(a, b)| a * inv * b).collect()
}

fn norm_case<T: Storage>(name: &str) {
    let mut r = TestRng::new(name);
    // Ragged hidden sizes: not a multiple of the block, smaller than it, SmolLM2's 576;
    // 50 is not a whole number of 16-byte vectors (the scalar path), the others are.
    for hidden in [576usize, 50, 200, 4096] {
        norm_case_hidden::<T>(&mut r, hidden);
    }
}

fn norm_case_hidden<T: Storage>(r: &mut TestRng, hidden: usize) {
    let rows = r.range(1, 4);
    let x: Vec<T> = r.vec(rows * hidden, -2.0, 2.0);
    let w: Vec<T> = r.vec(hidden, 0.5, 1.5);
    let (xf, wf) = (to_f64(&x), to_f64(&w));
    let want: Vec<f64> = xf
        .chunks(hidden)
        .flat_map(|row| rms_ref(row, &wf))
        .collect();
    let mut out = poisoned::<T>(rows * hidden);
    let (o, xp, wp) = (out.as_mut_ptr(), x.as_ptr(), w.as_ptr());
    // SAFETY: buffers sized `[rows, hidden]` and `[hidden]`.
    unsafe {
        launch(geom::per_row(rows as u32, THREADS), || {
            rms_norm::<T>(o, xp, wp, EPS, hidden as u32)
        })
    };
    assert_close(
        &format!("rms_norm rows={rows} hidden={hidden}"),
        r.seed,
        &out,
        &want,
    );

    // Fused: residual += x (rounded to T), x = rms_norm(residual) * w.
    let res: Vec<T> = r.vec(rows * hidden, -2.0, 2.0);
    let sum: Vec<f64> = x
        .iter()
        .zip(&res)
        .map(|(a, b)| round::<T>(a.to_f32() as f64 + b.to_f32() as f64))
        .collect();
    let want_x: Vec<f64> = sum
        .chunks(hidden)
        .flat_map(|row| rms_ref(row, &wf))
        .collect();
    let (mut xi, mut ri) = (x.clone(), res.clone());
    let (xp, rp) = (xi.as_mut_ptr(), ri.as_mut_ptr());
    // SAFETY: as above; `input` and `residual` are distinct buffers.
    unsafe {
        launch(geom::per_row(rows as u32, THREADS), || {
            fused_add_rms_norm::<T>(xp, rp, wp, EPS, hidden as u32)
        })
    };
    assert_close(
        &format!("fused_add_rms_norm residual hidden={hidden}"),
        r.seed,
        &ri,
        &sum,
    );
    assert_close(
        &format!("fused_add_rms_norm out hidden={hidden}"),
        r.seed,
        &xi,
        &want_x,
    );
}

#[test]
fn rms_norms_all_dtypes() {
    norm_case::<f32>("rms_norm_f32");
    norm_case::<F16>("rms_norm_f16");
    norm_case::<BF16>("rms_norm_bf16");
}

fn rotary_case<T: Storage>(name: &str) {
    let mut r = TestRng::new(name);
    let (heads, kv_heads, d) = (r.range(2, 4), 1usize, [64usize, 80, 128][r.range(0, 2)]);
    let rot = if r.range(0, 1) == 0 { d } else { d / 2 };
    let (tokens, max_pos) = (r.range(1, 5), 64usize);
    let positions: Vec<u32> = (0..tokens)
        .map(|_| r.range(0, max_pos - 1) as u32)
        .collect();
    let theta = 10000.0f64;
    let mut cs = vec![0f32; max_pos * rot];
    for p in 0..max_pos {
        for j in 0..rot / 2 {
            let a = p as f64 / theta.powf(2.0 * j as f64 / rot as f64);
            cs[p * rot + j] = a.cos() as f32;
            cs[p * rot + rot / 2 + j] = a.sin() as f32;
        }
    }
    let q: Vec<T> = r.vec(tokens * heads * d, -2.0, 2.0);
    let k: Vec<T> = r.vec(tokens * kv_heads * d, -2.0, 2.0);
    let reference = |x: &[T], nh: usize| -> Vec<f64> {
        let mut y = to_f64(x);
        for (t, &p) in positions.iter().enumerate() {
            let p = p as usize;
            for h in 0..nh {
                let b = (t * nh + h) * d;
                for j in 0..rot / 2 {
                    let (c, s) = (cs[p * rot + j] as f64, cs[p * rot + rot / 2 + j] as f64);
                    let (x1, x2) = (x[b + j].to_f32() as f64, x[b + j + rot / 2].to_f32() as f64);
                    y[b + j] = x1 * c - x2 * s;
                    y[b + j + rot / 2] = x2 * c + x1 * s;
                }
            }
        }
        y
    };
    let (want_q, want_k) = (reference(&q, heads), reference(&k, kv_heads));
    let (mut qo, mut ko) = (q.clone(), k.clone());
    let (pp, qp, kp, cp) = (
        positions.as_ptr(),
        qo.as_mut_ptr(),
        ko.as_mut_ptr(),
        cs.as_ptr(),
    );
    // SAFETY: buffers sized per the kernel contract; positions < max_pos.
    unsafe {
        launch(geom::per_row(tokens as u32, THREADS), || {
            rotary_embedding::<T>(
                pp,
                qp,
                kp,
                cp,
                heads as u32,
                kv_heads as u32,
                d as u32,
                rot as u32,
            )
        })
    };
    let what = format!("rotary heads={heads} d={d} rot={rot}");
    assert_close(&format!("{what} q"), r.seed, &qo, &want_q);
    assert_close(&format!("{what} k"), r.seed, &ko, &want_k);
}

#[test]
fn rotary_all_dtypes() {
    rotary_case::<f32>("rotary_f32");
    rotary_case::<F16>("rotary_f16");
    rotary_case::<BF16>("rotary_bf16");
}

fn silu_case<T: Storage>(name: &str) {
    let mut r = TestRng::new(name);
    let (tokens, d) = (r.range(1, 4), [1536usize, 100, 37][r.range(0, 2)]);
    let x: Vec<T> = r.vec(tokens * 2 * d, -4.0, 4.0);
    let want: Vec<f64> = (0..tokens)
        .flat_map(|t| {
            let x = &x;
            (0..d).map(move |j| {
                let g = x[t * 2 * d + j].to_f32() as f64;
                g / (1.0 + (-g).exp()) * x[t * 2 * d + d + j].to_f32() as f64
            })
        })
        .collect();
    let mut out = poisoned::<T>(tokens * d);
    let (o, xp) = (out.as_mut_ptr(), x.as_ptr());
    // SAFETY: buffers sized `[tokens, 2d]` and `[tokens, d]`.
    unsafe {
        launch(geom::per_row(tokens as u32, THREADS), || {
            silu_and_mul::<T>(o, xp, d as u32)
        })
    };
    assert_close(
        &format!("silu_and_mul tokens={tokens} d={d}"),
        r.seed,
        &out,
        &want,
    );
}

#[test]
fn silu_and_mul_all_dtypes() {
    silu_case::<f32>("silu_f32");
    silu_case::<F16>("silu_f16");
    silu_case::<BF16>("silu_bf16");
}

fn embedding_case<T: Storage>(name: &str) {
    let mut r = TestRng::new(name);
    let (vocab, hidden, tokens) = (r.range(5, 40), [576usize, 70][r.range(0, 1)], r.range(2, 6));
    let table: Vec<T> = r.vec(vocab * hidden, -1.0, 1.0);
    let mut ids: Vec<u32> = (0..tokens).map(|_| r.range(0, vocab - 1) as u32).collect();
    ids[0] = (vocab - 1) as u32;
    // The whole table, then a slice of it (a tensor-parallel rank's rows):
    // ids outside the slice, below or above it, give zero rows.
    let lo = r.range(1, vocab - 2);
    ids[1] = (lo - 1) as u32;
    for (first, rows) in [(0, vocab), (lo, vocab - 1 - lo)] {
        let want: Vec<T> = ids
            .iter()
            .flat_map(|&i| match (i as usize).checked_sub(first) {
                Some(k) if k < rows => table[i as usize * hidden..][..hidden].to_vec(),
                _ => vec![T::from_f32(0.0); hidden],
            })
            .collect();
        let mut out = poisoned::<T>(tokens * hidden);
        let (o, ip, tp) = (
            out.as_mut_ptr(),
            ids.as_ptr(),
            table[first * hidden..].as_ptr(),
        );
        // SAFETY: the table slice holds `rows` rows; buffers sized per the
        // kernel contract.
        unsafe {
            launch(geom::per_row(tokens as u32, THREADS), || {
                embedding::<T>(o, ip, tp, hidden as u32, first as u32, rows as u32)
            })
        };
        assert_bits_eq(
            &format!("embedding ids={ids:?} hidden={hidden} rows {first}+{rows}"),
            r.seed,
            &out,
            &want,
        );
    }
}

#[test]
fn embedding_all_dtypes() {
    embedding_case::<f32>("embedding_f32");
    embedding_case::<F16>("embedding_f16");
    embedding_case::<BF16>("embedding_bf16");
}
