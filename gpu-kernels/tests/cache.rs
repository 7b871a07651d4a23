//! reshape_and_cache and copy_blocks on the emulator against plain-Rust references.
mod common;

use common::{assert_bits_eq, assert_close, TestRng, BF16, F16, THREADS};
use gpu_kernels::cache::{copy_blocks, reshape_and_cache, rotary_embedding_and_cache};
use gpu_kernels::device::emu::launch;
use gpu_kernels::{launch as geom, Storage};

fn reshape_case<T: Storage>(name: &str) {
    let mut r = TestRng::new(name);
    let (bs, kvh, d) = (
        [8usize, 16, 32][r.range(0, 2)],
        r.range(1, 3),
        [64usize, 80, 128][r.range(0, 2)],
    );
    let num_blocks = r.range(3, 6);
    let row = kvh * d;
    let tokens = r.range(1, num_blocks * bs);
    // Distinct slots in random order, one of them the very last slot.
    let mut slots: Vec<u32> = r.shuffled(num_blocks * bs)[..tokens].to_vec();
    slots[0] = (num_blocks * bs - 1) as u32;
    slots.sort_unstable();
    slots.dedup();
    let perm = r.shuffled(slots.len());
    let slots: Vec<u32> = perm.iter().map(|&i| slots[i as usize]).collect();
    let tokens = slots.len();
    // Key is a view with a larger stride (as into a fused QKV buffer); value is contiguous.
    let key_stride = 3 * row;
    let key: Vec<T> = r.vec(tokens * key_stride, -2.0, 2.0);
    let value: Vec<T> = r.vec(tokens * row, -2.0, 2.0);
    let mut kc: Vec<T> = r.vec(num_blocks * bs * row, -2.0, 2.0);
    let mut vc: Vec<T> = r.vec(num_blocks * bs * row, -2.0, 2.0);
    let (mut want_k, mut want_v) = (kc.clone(), vc.clone());
    for (t, &s) in slots.iter().enumerate() {
        let s = s as usize;
        want_k[s * row..][..row].copy_from_slice(&key[t * key_stride..][..row]);
        want_v[s * row..][..row].copy_from_slice(&value[t * row..][..row]);
    }
    let (kp, vp, kcp, vcp, sp) = (
        key.as_ptr(),
        value.as_ptr(),
        kc.as_mut_ptr(),
        vc.as_mut_ptr(),
        slots.as_ptr(),
    );
    // SAFETY: buffers sized per the kernel contract; slots are distinct and in range.
    unsafe {
        launch(geom::per_row(tokens as u32, THREADS), || {
            reshape_and_cache::<T>(
                kp,
                vp,
                kcp,
                vcp,
                sp,
                kvh as u32,
                d as u32,
                key_stride as u32,
                row as u32,
            )
        })
    };
    let what = format!("reshape_and_cache bs={bs} kvh={kvh} d={d} tokens={tokens}");
    assert_bits_eq(&format!("{what} K"), r.seed, &kc, &want_k);
    assert_bits_eq(&format!("{what} V"), r.seed, &vc, &want_v);
}

#[test]
fn reshape_and_cache_all_dtypes() {
    reshape_case::<f32>("reshape_and_cache_f32");
    reshape_case::<F16>("reshape_and_cache_f16");
    reshape_case::<BF16>("reshape_and_cache_bf16");
}

fn copy_case<T: Storage>(name: &str) {
    let mut r = TestRng::new(name);
    let (layers, num_blocks) = (r.range(1, 3), r.range(4, 10));
    let numel = [8usize, 16, 32][r.range(0, 2)] * r.range(1, 2) * 64;
    // Sources and destinations are disjoint; several pairs may share a source.
    let perm = r.shuffled(num_blocks);
    let (dsts, srcs) = perm.split_at(num_blocks / 2);
    let pairs = r.range(1, dsts.len());
    let mut mapping = Vec::new();
    for &dst in &dsts[..pairs] {
        mapping.push(srcs[r.range(0, srcs.len() - 1)]);
        mapping.push(dst);
    }
    let mut ks: Vec<Vec<T>> = (0..layers)
        .map(|_| r.vec(num_blocks * numel, -2.0, 2.0))
        .collect();
    let mut vs: Vec<Vec<T>> = (0..layers)
        .map(|_| r.vec(num_blocks * numel, -2.0, 2.0))
        .collect();
    let mut want_k = ks.clone();
    let mut want_v = vs.clone();
    for p in mapping.chunks(2) {
        let (s, d) = (p[0] as usize * numel, p[1] as usize * numel);
        for l in 0..layers {
            want_k[l].copy_within(s..s + numel, d);
            want_v[l].copy_within(s..s + numel, d);
        }
    }
    let kptrs: Vec<u64> = ks.iter_mut().map(|v| v.as_mut_ptr() as u64).collect();
    let vptrs: Vec<u64> = vs.iter_mut().map(|v| v.as_mut_ptr() as u64).collect();
    let (kp, vp, mp) = (kptrs.as_ptr(), vptrs.as_ptr(), mapping.as_ptr());
    // SAFETY: every layer buffer holds `num_blocks` blocks; destinations are disjoint
    // from sources and from each other.
    unsafe {
        launch(
            geom::copy_blocks(layers as u32, pairs as u32, THREADS),
            || copy_blocks::<T>(kp, vp, mp, numel as u32),
        )
    };
    let what = format!("copy_blocks layers={layers} pairs={mapping:?} numel={numel}");
    for l in 0..layers {
        assert_bits_eq(&format!("{what} K layer {l}"), r.seed, &ks[l], &want_k[l]);
        assert_bits_eq(&format!("{what} V layer {l}"), r.seed, &vs[l], &want_v[l]);
    }
}

#[test]
fn copy_blocks_all_dtypes() {
    copy_case::<f32>("copy_blocks_f32");
    copy_case::<F16>("copy_blocks_f16");
    copy_case::<BF16>("copy_blocks_bf16");
}

/// Rotate-half of the `rot` first dims of one head row, in f64.
fn rotate(x: &[f64], cs: &[f32], rot: usize) -> Vec<f64> {
    let mut y = x.to_vec();
    for j in 0..rot / 2 {
        let (c, s) = (cs[j] as f64, cs[rot / 2 + j] as f64);
        y[j] = x[j] * c - x[j + rot / 2] * s;
        y[j + rot / 2] = x[j + rot / 2] * c + x[j] * s;
    }
    y
}

fn rotary_cache_case<T: Storage>(name: &str) {
    let mut r = TestRng::new(name);
    let (bs, heads, kvh, d) = (
        [8usize, 16, 32][r.range(0, 2)],
        [3usize, 4, 9][r.range(0, 2)],
        r.range(1, 3),
        [64usize, 80, 128][r.range(0, 2)],
    );
    let rot = if r.range(0, 1) == 0 { d } else { d / 2 };
    let (num_blocks, max_pos) = (r.range(2, 4), 64usize);
    let mut cs = vec![0f32; max_pos * rot];
    for p in 0..max_pos {
        for j in 0..rot / 2 {
            let a = p as f64 / 10000f64.powf(2.0 * j as f64 / rot as f64);
            cs[p * rot + j] = a.cos() as f32;
            cs[p * rot + rot / 2 + j] = a.sin() as f32;
        }
    }
    let tokens = r.range(1, num_blocks * bs);
    let slots: Vec<u32> = r.shuffled(num_blocks * bs)[..tokens].to_vec();
    let positions: Vec<u32> = (0..tokens)
        .map(|_| r.range(0, max_pos - 1) as u32)
        .collect();
    // One fused QKV buffer: q, k, v of a token side by side, as the engine lays it out.
    let (qw, kw) = (heads * d, kvh * d);
    let stride = qw + 2 * kw;
    let qkv: Vec<T> = r.vec(tokens * stride, -2.0, 2.0);
    let row = kvh * d;
    let kc: Vec<T> = r.vec(num_blocks * bs * row, -2.0, 2.0);
    let vc: Vec<T> = r.vec(num_blocks * bs * row, -2.0, 2.0);
    let f = |v: &[T]| v.iter().map(|x| x.to_f32() as f64).collect::<Vec<f64>>();
    let (mut want_q, mut want_k, mut want_v) = (vec![0f64; tokens * qw], f(&kc), f(&vc));
    for t in 0..tokens {
        let c = &cs[positions[t] as usize * rot..][..rot];
        let s = slots[t] as usize;
        for h in 0..heads {
            let o = t * stride + h * d;
            let y = rotate(&f(&qkv[o..o + d]), c, rot);
            want_q[t * qw + h * d..][..d].copy_from_slice(&y);
        }
        for h in 0..kvh {
            let o = t * stride + qw + h * d;
            let y = rotate(&f(&qkv[o..o + d]), c, rot);
            want_k[s * row + h * d..][..d].copy_from_slice(&y);
            let ov = t * stride + qw + kw + h * d;
            want_v[s * row + h * d..][..d].copy_from_slice(&f(&qkv[ov..ov + d]));
        }
    }
    // Rotated q goes to a contiguous `[tokens, heads, d]` buffer (what attention reads).
    let mut q_o: Vec<T> = r.vec(tokens * qw, -2.0, 2.0);
    let (mut kc_o, mut vc_o) = (kc.clone(), vc.clone());
    let (base, qo) = (qkv.as_ptr(), q_o.as_mut_ptr());
    let (pp, sp, cp, kcp, vcp) = (
        positions.as_ptr(),
        slots.as_ptr(),
        cs.as_ptr(),
        kc_o.as_mut_ptr(),
        vc_o.as_mut_ptr(),
    );
    // SAFETY: q, k, v are views of `qkv` at `stride`, read only; `q_o` holds `tokens`
    // rows of `qw`; slots distinct and in range; positions < max_pos.
    unsafe {
        let (kp, vp) = (base.add(qw), base.add(qw + kw));
        launch(geom::per_row(tokens as u32, THREADS), || {
            rotary_embedding_and_cache::<T>(
                pp,
                base,
                qo,
                kp,
                vp,
                kcp,
                vcp,
                sp,
                cp,
                heads as u32,
                kvh as u32,
                d as u32,
                rot as u32,
                stride as u32,
                stride as u32,
                stride as u32,
            )
        })
    };
    let what = format!("rotary+cache heads={heads}/{kvh} d={d} rot={rot} bs={bs}");
    // The fused source buffer is only read.
    assert_close(&format!("{what} q"), r.seed, &q_o, &want_q);
    assert_close(&format!("{what} k cache"), r.seed, &kc_o, &want_k);
    assert_close(&format!("{what} v cache"), r.seed, &vc_o, &want_v);
}

#[test]
fn rotary_embedding_and_cache_all_dtypes() {
    rotary_cache_case::<f32>("rotary_cache_f32");
    rotary_cache_case::<F16>("rotary_cache_f16");
    rotary_cache_case::<BF16>("rotary_cache_bf16");
}
