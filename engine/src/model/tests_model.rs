//! Whole-model tests: a naive reference forward pass, batching invariance,
//! chunked prefill, and batch validation.

use super::kv_cache::KvCache;
use super::test_util::{random_weights, tiny_config};
use super::CpuModel;
use engine_core::BlockId;
use engine_core::{ContiguousLayout, ExecError, ForwardBatch, Logits};
use model_loader::{ModelConfig, ModelWeights, RopeScaling};

fn matvec(w: &[f32], rows: usize, x: &[f64]) -> Vec<f64> {
    let k = x.len();
    (0..rows)
        .map(|r| {
            w[r * k..(r + 1) * k]
                .iter()
                .zip(x)
                .map(|(a, b)| *a as f64 * b)
                .sum()
        })
        .collect()
}

fn norm(x: &[f64], w: &[f32], eps: f64) -> Vec<f64> {
    let ms = x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64;
    x.iter()
        .zip(w)
        .map(|(v, g)| v / (ms + eps).sqrt() * *g as f64)
        .collect()
}

fn rope(x: &mut [f64], pos: usize, hd: usize, theta: f64) {
    for head in x.chunks_mut(hd) {
        let old = head.to_vec();
        for j in 0..hd {
            let i = j % (hd / 2);
            let a = pos as f64 / theta.powf(2.0 * i as f64 / hd as f64);
            let rot = if j < hd / 2 {
                -old[j + hd / 2]
            } else {
                old[j - hd / 2]
            };
            head[j] = old[j] * a.cos() + rot * a.sin();
        }
    }
}

fn add_bias(x: &mut [f64], b: &Option<model_loader::Tensor>) {
    if let Some(b) = b {
        x.iter_mut()
            .zip(&b.data)
            .for_each(|(v, bb)| *v += *bb as f64);
    }
}

/// A plain f64 Llama forward over one whole sequence; logits of every position.
fn naive_forward(c: &ModelConfig, w: &ModelWeights, tokens: &[u32]) -> Vec<Vec<f64>> {
    let (h, hd, nh, kvh) = (
        c.hidden_size,
        c.head_dim,
        c.num_attention_heads,
        c.num_key_value_heads,
    );
    let eps = c.rms_norm_eps as f64;
    let mut xs: Vec<Vec<f64>> = tokens
        .iter()
        .map(|&t| {
            w.token_embedding.data[t as usize * h..][..h]
                .iter()
                .map(|v| *v as f64)
                .collect()
        })
        .collect();
    for l in &w.layers {
        let mut ks = Vec::new();
        let mut vs = Vec::new();
        let mut qs = Vec::new();
        for (p, x) in xs.iter().enumerate() {
            let n = norm(x, &l.attn_norm.data, eps);
            let mut q = matvec(&l.wq.data, nh * hd, &n);
            let mut k = matvec(&l.wk.data, kvh * hd, &n);
            let mut v = matvec(&l.wv.data, kvh * hd, &n);
            add_bias(&mut q, &l.bq);
            add_bias(&mut k, &l.bk);
            add_bias(&mut v, &l.bv);
            rope(&mut q, p, hd, c.rope_theta as f64);
            rope(&mut k, p, hd, c.rope_theta as f64);
            qs.push(q);
            ks.push(k);
            vs.push(v);
        }
        let window = match c.architecture {
            model_loader::Architecture::Mistral { sliding_window } => sliding_window,
            _ => None,
        };
        for (p, x) in xs.iter_mut().enumerate() {
            let mut att = vec![0.0f64; nh * hd];
            // Keys p - w + 1 ..= p under a window of w.
            let lo = window.map_or(0, |w| (p + 1).saturating_sub(w));
            for hh in 0..nh {
                let g = hh / (nh / kvh);
                let s: Vec<f64> = (lo..=p)
                    .map(|j| {
                        (0..hd)
                            .map(|d| qs[p][hh * hd + d] * ks[j][g * hd + d])
                            .sum::<f64>()
                            / (hd as f64).sqrt()
                    })
                    .collect();
                let m = s.iter().cloned().fold(f64::MIN, f64::max);
                let z: f64 = s.iter().map(|v| (v - m).exp()).sum();
                for j in lo..=p {
                    for d in 0..hd {
                        att[hh * hd + d] += (s[j - lo] - m).exp() / z * vs[j][g * hd + d];
                    }
                }
            }
            let o = matvec(&l.wo.data, h, &att);
            x.iter_mut().zip(&o).for_each(|(a, b)| *a += b);
            let n = norm(x, &l.ffn_norm.data, eps);
            let gt = matvec(&l.w_gate.data, c.intermediate_size, &n);
            let up = matvec(&l.w_up.data, c.intermediate_size, &n);
            let act: Vec<f64> = gt
                .iter()
                .zip(&up)
                .map(|(g, u)| g / (1.0 + (-g).exp()) * u)
                .collect();
            let d = matvec(&l.w_down.data, h, &act);
            x.iter_mut().zip(&d).for_each(|(a, b)| *a += b);
        }
    }
    xs.iter()
        .map(|x| {
            matvec(
                &w.output_weight().data,
                c.vocab_size,
                &norm(x, &w.final_norm.data, eps),
            )
        })
        .collect()
}

fn assert_close(ours: &[f32], want: &[f32], tol: f32, what: &str) {
    for (i, (a, b)) in ours.iter().zip(want).enumerate() {
        assert!(
            (a - b).abs() <= tol * (1.0 + b.abs()),
            "{what}: logit {i}: {a} vs {b}"
        );
    }
}

fn tokens(n: usize, seed: u32) -> Vec<u32> {
    (0..n as u32)
        .map(|i| (i * 31 + seed * 17 + 5) % 97)
        .collect()
}

/// Runs one sequence in one pass, logits of every row.
fn all_rows_alone(model: &CpuModel, toks: &[u32]) -> Logits {
    let layout = ContiguousLayout {
        block_size: 4,
        blocks_per_seq: 16,
    };
    let mut cache = KvCache::new(model.kv_geometry(16, 4));
    let mut batch = ForwardBatch::default();
    layout.push(&mut batch, 0, 0, toks, false);
    batch.logits_rows = (0..toks.len()).collect();
    model.forward(&batch, &mut cache).expect("forward")
}

#[test]
fn forward_matches_naive_reference_llama_and_qwen2() {
    for bias in [false, true] {
        let c = tiny_config(bias, None);
        let w = random_weights(&c, 42);
        let toks = tokens(11, 1);
        let want = naive_forward(&c, &w, &toks);
        let model = CpuModel::new(c, w).expect("model");
        let got = all_rows_alone(&model, &toks);
        for (r, row) in want.iter().enumerate() {
            let row: Vec<f32> = row.iter().map(|v| *v as f32).collect();
            assert_close(got.row(r), &row, 2e-4, &format!("bias={bias} row {r}"));
        }
    }
}

#[test]
fn mistral_sliding_window_matches_the_windowed_reference() {
    let mut c = tiny_config(false, None);
    c.architecture = model_loader::Architecture::Mistral {
        sliding_window: Some(4),
    };
    let w = random_weights(&c, 7);
    let toks = tokens(11, 3);
    let want = naive_forward(&c, &w, &toks);
    let full = naive_forward(&tiny_config(false, None), &w, &toks);
    let model = CpuModel::new(c.clone(), w).expect("model");
    let got = all_rows_alone(&model, &toks);
    for (r, row) in want.iter().enumerate() {
        let row: Vec<f32> = row.iter().map(|v| *v as f32).collect();
        assert_close(got.row(r), &row, 2e-4, &format!("windowed row {r}"));
        // The window only bites once a query has more than 4 keys.
        let moved = row
            .iter()
            .zip(&full[r])
            .any(|(a, b)| (f64::from(*a) - b).abs() > 1e-3);
        assert_eq!(moved, r >= 4, "row {r}");
    }
    // Chunked and batched through paged blocks, the same logits.
    check_batching_invariance(c);
}

/// Sequence lengths and the chunk schedule of the mixed run: each step
/// lists (sequence, tokens to process); sequences join and leave at will.
fn check_batching_invariance(config: ModelConfig) {
    let lens = [9usize, 14, 3, 21];
    let model = CpuModel::new(config.clone(), random_weights(&config, 9)).expect("model");
    let seqs: Vec<Vec<u32>> = lens
        .iter()
        .enumerate()
        .map(|(i, &n)| tokens(n, i as u32))
        .collect();
    let alone: Vec<Logits> = seqs.iter().map(|s| all_rows_alone(&model, s)).collect();
    let steps: &[&[(usize, usize)]] = &[
        &[(0, 5), (1, 14), (2, 1)],
        &[(0, 4), (1, 0), (2, 1), (3, 7)],
        &[(2, 1), (3, 6), (0, 0)],
        &[(3, 8)],
    ];
    let layout = ContiguousLayout {
        block_size: 4,
        blocks_per_seq: 8,
    };
    let mut cache = KvCache::new(model.kv_geometry(32, 4));
    let mut done = [0usize; 4];
    for step in steps {
        let mut batch = ForwardBatch::default();
        let mut expect = Vec::new();
        for &(s, n) in step.iter().filter(|(_, n)| *n > 0) {
            let first = batch.token_ids.len();
            layout.push(
                &mut batch,
                s,
                done[s],
                &seqs[s][done[s]..done[s] + n],
                false,
            );
            for i in 0..n {
                expect.push((first + i, s, done[s] + i));
            }
            done[s] += n;
        }
        // Ask for every row, in reverse order, to check row selection too.
        expect.reverse();
        batch.logits_rows = expect.iter().map(|e| e.0).collect();
        let got = model.forward(&batch, &mut cache).expect("forward");
        for (k, &(_, s, pos)) in expect.iter().enumerate() {
            assert_close(
                got.row(k),
                alone[s].row(pos),
                1e-4,
                &format!("seq {s} pos {pos}"),
            );
        }
    }
    assert_eq!(done.to_vec(), lens.to_vec());
}

#[test]
fn batching_invariance_mixed_prefill_decode_and_chunks() {
    check_batching_invariance(tiny_config(false, None));
    let scaling = RopeScaling::Llama3 {
        factor: 8.0,
        low_freq_factor: 1.0,
        high_freq_factor: 4.0,
        original_max_position_embeddings: 64,
    };
    check_batching_invariance(tiny_config(true, Some(scaling)));
}

#[test]
fn logits_only_for_requested_rows() {
    let c = tiny_config(false, None);
    let model = CpuModel::new(c.clone(), random_weights(&c, 3)).expect("model");
    let toks = tokens(6, 2);
    let all = all_rows_alone(&model, &toks);
    let mut cache = KvCache::new(model.kv_geometry(16, 4));
    let mut batch = ForwardBatch::default();
    ContiguousLayout {
        block_size: 4,
        blocks_per_seq: 4,
    }
    .push(&mut batch, 1, 0, &toks, true);
    let last = model.forward(&batch, &mut cache).expect("forward");
    assert_eq!((last.rows, last.vocab, last.data.len()), (1, 97, 97));
    assert_close(last.row(0), all.row(5), 1e-5, "last row");
}

#[test]
fn malformed_batches_are_typed_errors() {
    let c = tiny_config(false, None);
    let model = CpuModel::new(c.clone(), random_weights(&c, 3)).expect("model");
    let mut cache = KvCache::new(model.kv_geometry(8, 4));
    let layout = ContiguousLayout {
        block_size: 4,
        blocks_per_seq: 2,
    };
    let mut good = ForwardBatch::default();
    layout.push(&mut good, 0, 0, &[1, 2, 3], true);
    assert!(model.forward(&good, &mut cache).is_ok());

    let mut cases: Vec<(&str, ForwardBatch)> = Vec::new();
    let mut b = good.clone();
    b.positions.pop();
    cases.push(("positions short", b));
    let mut b = good.clone();
    b.token_ids[0] = 97;
    cases.push(("token out of vocab", b));
    let mut b = good.clone();
    b.logits_rows = vec![3];
    cases.push(("logits row", b));
    let mut b = good.clone();
    b.seqs[0].query_len = 2;
    cases.push(("span sum", b));
    let mut b = good.clone();
    b.seqs[0].context_len = 2;
    cases.push(("context < query", b));
    let mut b = good.clone();
    b.slot_mapping[1] = 30;
    cases.push(("slot off table", b));
    let mut b = good.clone();
    b.positions[2] = 7;
    cases.push(("position", b));
    let mut b = good.clone();
    b.seqs[0].block_table.clear();
    cases.push(("short table", b));
    for (what, b) in cases {
        assert!(
            matches!(
                model.forward(&b, &mut cache),
                Err(ExecError::InvalidBatch(_))
            ),
            "{what}"
        );
    }
    let mut b = good.clone();
    b.seqs[0].block_table[0] = BlockId(8);
    assert!(matches!(
        model.forward(&b, &mut cache),
        Err(ExecError::BlockOutOfRange(BlockId(8)))
    ));
    let mut wrong = KvCache::new(super::kv_cache::KvGeometry {
        head_dim: 8,
        ..model.kv_geometry(8, 4)
    });
    assert!(model.forward(&good, &mut wrong).is_err());
}

#[test]
fn bad_weight_shapes_are_typed_errors() {
    let c = tiny_config(false, None);
    let mut w = random_weights(&c, 1);
    w.layers[1].wk.shape = vec![3, 3];
    assert!(matches!(
        CpuModel::new(c.clone(), w),
        Err(super::ModelError::ShapeMismatch { .. })
    ));
    let mut bad = c.clone();
    bad.num_key_value_heads = 3;
    assert!(CpuModel::new(bad.clone(), random_weights(&c, 1)).is_err());
}
