//! Tests of the draw kernel `sample_rows` against a plain-Rust reference.

use super::*;
use crate::entries::emulate;
use crate::launch::per_row;
use crate::philox::token_uniform;
use crate::sig::KernelArg;
use std::vec;
use std::vec::Vec;

#[derive(Clone, Copy, Debug)]
struct P {
    t: f32,
    top_p: f32,
    min_p: f32,
    top_k: u32,
    seed: u64,
    seq: u32,
    step: u32,
}

/// Plain-Rust reference of the draw: thresholds by a full sort, mass in f64.
fn reference_draw(row: &[f32], p: P) -> usize {
    let max = row
        .iter()
        .copied()
        .filter(|v| !v.is_nan())
        .fold(f32::NEG_INFINITY, f32::max);
    if p.t == 0.0 {
        return row.iter().position(|&v| v == max).unwrap_or(0);
    }
    let inv_t = 1.0 / p.t;
    let mut c: Vec<(usize, f32)> = row
        .iter()
        .enumerate()
        .filter(|(_, v)| v.is_finite())
        .map(|(i, &v)| (i, (v - max) * inv_t))
        .collect();
    c.sort_by(|a, b| b.1.partial_cmp(&a.1).unwrap().then(a.0.cmp(&b.0)));
    if p.top_k > 0 && (p.top_k as usize) < c.len() {
        let kth = c[p.top_k as usize - 1].1;
        c.retain(|x| x.1 >= kth);
    }
    if p.top_p < 1.0 {
        let z: f64 = c.iter().map(|x| f64::from(exp_poly(x.1))).sum();
        let mut acc = 0.0;
        let mut cut = f32::NEG_INFINITY;
        for x in &c {
            acc += f64::from(exp_poly(x.1));
            if acc >= f64::from(p.top_p) * z {
                cut = x.1;
                break;
            }
        }
        c.retain(|x| x.1 >= cut);
    }
    c.retain(|x| exp_poly(x.1) >= p.min_p);
    let mut best = (f32::NEG_INFINITY, usize::MAX);
    for &(i, s) in &c {
        let score = race_score(s, token_uniform(p.seed, p.seq, p.step, i as u32));
        if score > best.0 || (score == best.0 && i < best.1) {
            best = (score, i);
        }
    }
    if best.1 == usize::MAX {
        0
    } else {
        best.1
    }
}

fn run(rows: &[Vec<f32>], ps: &[P], n_top: usize) -> Vec<f32> {
    let vocab = rows[0].len();
    let logits: Vec<f32> = rows.concat();
    let params: Vec<u32> = ps
        .iter()
        .flat_map(|p| {
            [
                p.t.to_bits(),
                p.top_p.to_bits(),
                p.min_p.to_bits(),
                p.top_k,
                p.seed as u32,
                (p.seed >> 32) as u32,
                p.seq,
                p.step,
                crate::penalty::NO_SLOT,
                crate::penalty::NO_SLOT,
            ]
        })
        .collect();
    let mut out = vec![f32::NAN; rows.len() * (2 + 2 * n_top)];
    let args = [
        KernelArg::Ptr(out.as_mut_ptr() as u64),
        KernelArg::Ptr(logits.as_ptr() as u64),
        KernelArg::Ptr(logits.as_ptr() as u64),
        KernelArg::Ptr(0),
        KernelArg::Ptr(params.as_ptr() as u64),
        KernelArg::U32(vocab as u32),
        KernelArg::U32(n_top as u32),
    ];
    // SAFETY: logits [rows, vocab], params [rows, 10] (no processed row, no
    // slot: `draw_rows` and `counts` are not read), out [rows, 2 + 2 n_top].
    unsafe { emulate("sample_rows_f32", per_row(rows.len() as u32, 32), &args) }.expect("launch");
    out
}

fn lcg_rows(n: usize, vocab: usize, seed: u32) -> Vec<Vec<f32>> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            (0..vocab)
                .map(|_| {
                    s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                    ((s >> 8) as f32 / (1u32 << 24) as f32 - 0.5) * 12.0
                })
                .collect()
        })
        .collect()
}

#[test]
fn draws_equal_the_sorted_reference() {
    let vocab = 300;
    let rows = lcg_rows(24, vocab, 11);
    let ps: Vec<P> = (0..24u32)
        .map(|r| P {
            t: [0.0, 0.3, 0.8, 1.0, 1.7][r as usize % 5],
            top_p: [1.0, 0.9, 0.5, 0.95][r as usize % 4],
            min_p: [0.0, 0.05, 0.2][r as usize % 3],
            top_k: [0, 1, 5, 50, 299, 400][r as usize % 6],
            seed: 1_000 + u64::from(r) * 7 + (u64::from(r) << 35),
            seq: r % 3,
            step: r * 5,
        })
        .collect();
    let out = run(&rows, &ps, 0);
    for (r, (row, p)) in rows.iter().zip(&ps).enumerate() {
        assert_eq!(
            out[2 * r] as usize,
            reference_draw(row, *p),
            "row {r}: {p:?}"
        );
    }
    // The draws depend on the step (different keys, different tokens).
    let mut moved = ps.clone();
    moved.iter_mut().for_each(|p| p.step += 1);
    let out2 = run(&rows, &moved, 0);
    let differs = (0..24)
        .filter(|&r| ps[r].t > 0.0 && out[2 * r] != out2[2 * r])
        .count();
    assert!(differs > 3, "the step does not key the draw ({differs})");
}

#[test]
fn draw_frequencies_follow_the_softmax() {
    // Four tokens, T = 1: frequencies over many steps vs softmax.
    let row = vec![1.0f32, 0.0, -1.0, 0.5];
    let n = 1000;
    let rows = vec![row.clone(); n];
    let ps: Vec<P> = (0..n as u32)
        .map(|i| P {
            t: 1.0,
            top_p: 1.0,
            min_p: 0.0,
            top_k: 0,
            seed: 5,
            seq: 0,
            step: i,
        })
        .collect();
    let out = run(&rows, &ps, 0);
    let z: f64 = row.iter().map(|&v| f64::from(v).exp()).sum();
    for (tok, &v) in row.iter().enumerate() {
        let want = f64::from(v).exp() / z;
        let got = (0..n).filter(|&r| out[2 * r] as usize == tok).count() as f64 / n as f64;
        let sd = (want * (1.0 - want) / n as f64).sqrt();
        assert!(
            (got - want).abs() < 4.5 * sd,
            "token {tok}: {got} vs {want}"
        );
    }
}

#[test]
fn logprob_and_top_n_come_from_the_raw_row() {
    let mut rows = lcg_rows(3, 100, 3);
    rows[1][7] = f32::NAN;
    rows[1][8] = f32::NEG_INFINITY;
    rows[2] = vec![f32::NAN; 100];
    let ps = vec![
        P {
            t: 0.7,
            top_p: 0.9,
            min_p: 0.0,
            top_k: 10,
            seed: 1,
            seq: 0,
            step: 0
        };
        3
    ];
    let n_top = 20;
    let out = run(&rows, &ps, n_top);
    let stride = 2 + 2 * n_top;
    for (r, row) in rows.iter().enumerate().take(2) {
        let o = &out[r * stride..(r + 1) * stride];
        let max = row
            .iter()
            .copied()
            .filter(|v| !v.is_nan())
            .fold(f32::NEG_INFINITY, f32::max);
        let lse = f64::from(max)
            + row
                .iter()
                .filter(|v| !v.is_nan())
                .map(|&v| f64::from(v - max).exp())
                .sum::<f64>()
                .ln();
        let tok = o[0] as usize;
        assert!((f64::from(o[1]) - (f64::from(row[tok]) - lse)).abs() < 1e-5);
        let mut idx: Vec<usize> = (0..row.len()).filter(|&i| row[i].is_finite()).collect();
        idx.sort_by(|&a, &b| row[b].partial_cmp(&row[a]).unwrap().then(a.cmp(&b)));
        for j in 0..n_top {
            assert_eq!(o[2 + 2 * j] as usize, idx[j], "row {r} top {j}");
            let want = f64::from(row[idx[j]]) - lse;
            assert!((f64::from(o[3 + 2 * j]) - want).abs() < 1e-5);
        }
    }
    // Only NaN: token 0, logprob NaN, no top entries.
    let o = &out[2 * stride..];
    assert_eq!(o[0], 0.0);
    assert!(o[1].is_nan());
    assert_eq!(o[2], -1.0);
}

#[test]
fn scalar_functions_are_accurate() {
    let mut x = 1e-7f32;
    while x < 30.0 {
        let (got, want) = (f64::from(ln_poly(x)), f64::from(x).ln());
        assert!(
            (got - want).abs() <= 2e-7 * want.abs().max(1.0),
            "ln({x}) = {got}, want {want}"
        );
        x *= 1.0137;
    }
    let mut x = -87.0f32;
    while x <= 0.0 {
        let (got, want) = (exp_poly(x), x.exp());
        assert!(((got - want) / want).abs() < 5e-7, "exp({x})");
        x += 0.0137;
    }
    let vals = [
        f32::NEG_INFINITY,
        -3.5,
        -1e-30,
        -0.0,
        0.0,
        1e-30,
        2.0,
        f32::INFINITY,
    ];
    for w in vals.windows(2) {
        assert!(order_key(w[0]) <= order_key(w[1]), "{w:?}");
    }
}
