//! CpuExecutor: block operations move exactly the right bytes (all layers,
//! K and V), bad ids move nothing, and greedy generation through the
//! executor agrees with step-by-step forward passes.

use super::generate::{argmax, generate_greedy, ContiguousLayout};
use super::CpuExecutor;
use crate::executor::test_run::Run;
use crate::executor::{BlockOps, ExecError, Executor, ForwardBatch};
use crate::kv::{BlockCopy, BlockId};
use crate::model::{CpuModel, KvCache, KvDtype, LayerKv};
use model_loader::{Architecture, LayerWeights, ModelConfig, ModelWeights, Tensor};

fn config() -> ModelConfig {
    ModelConfig {
        architecture: Architecture::Llama,
        vocab_size: 50,
        hidden_size: 32,
        intermediate_size: 48,
        num_hidden_layers: 3,
        num_attention_heads: 4,
        num_key_value_heads: 2,
        head_dim: 8,
        rms_norm_eps: 1e-5,
        rope_theta: 10000.0,
        rope_scaling: None,
        max_position_embeddings: 256,
        tie_word_embeddings: true,
        attention_bias: false,
    }
}

/// Deterministic, non-trivial weights (a hash of the element index).
fn weights(c: &ModelConfig) -> ModelWeights {
    let mut seed = 0u32;
    let mut t = |shape: &[usize], scale: f32, offset: f32| {
        let n: usize = shape.iter().product();
        let data = (0..n)
            .map(|_| {
                seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                offset + scale * ((seed >> 8) as f32 / (1u32 << 24) as f32 - 0.5)
            })
            .collect();
        Tensor::new(shape.to_vec(), data)
    };
    let (h, i, hd) = (c.hidden_size, c.intermediate_size, c.head_dim);
    let (qd, kvd) = (c.num_attention_heads * hd, c.num_key_value_heads * hd);
    let layers = (0..c.num_hidden_layers)
        .map(|_| LayerWeights {
            attn_norm: t(&[h], 0.2, 1.0),
            wq: t(&[qd, h], 0.8, 0.0),
            wk: t(&[kvd, h], 0.8, 0.0),
            wv: t(&[kvd, h], 0.5, 0.0),
            wo: t(&[h, qd], 0.5, 0.0),
            bq: None,
            bk: None,
            bv: None,
            ffn_norm: t(&[h], 0.2, 1.0),
            w_gate: t(&[i, h], 0.5, 0.0),
            w_up: t(&[i, h], 0.5, 0.0),
            w_down: t(&[h, i], 0.5, 0.0),
            gemma: None,
        })
        .collect();
    ModelWeights {
        token_embedding: t(&[c.vocab_size, h], 2.0, 0.0),
        layers,
        final_norm: t(&[h], 0.2, 1.0),
        lm_head: None,
    }
}

fn executor(num_blocks: usize, num_cpu_blocks: usize, block_size: usize) -> CpuExecutor {
    let c = config();
    let model = CpuModel::new(c.clone(), weights(&c)).expect("model");
    CpuExecutor::new(model, num_blocks, num_cpu_blocks, block_size).expect("executor")
}

/// Fills every element of a pool with a value unique to (pool tag, layer, K/V, index).
fn fill(pool: &mut KvCache, tag: f32) {
    for l in 0..pool.geometry().num_layers {
        let LayerKv::F32(lk) = pool.layer_mut(l) else {
            panic!("the test model's pools are f32");
        };
        for (i, v) in lk.k.iter_mut().enumerate() {
            *v = tag + (l * 1_000_000 + i) as f32;
        }
        for (i, v) in lk.v.iter_mut().enumerate() {
            *v = -(tag + (l * 1_000_000 + i) as f32);
        }
    }
}

/// Block `b` of every layer, K then V, flattened.
fn block(pool: &KvCache, b: usize) -> Vec<f32> {
    let e = pool.geometry().block_elems();
    let mut out = Vec::new();
    for l in 0..pool.geometry().num_layers {
        let (k, v) = pool.layer(l).read(b * e..(b + 1) * e);
        out.extend(k);
        out.extend(v);
    }
    out
}

fn all_blocks(pool: &KvCache) -> Vec<Vec<f32>> {
    (0..pool.geometry().num_blocks)
        .map(|b| block(pool, b))
        .collect()
}

#[test]
fn swap_out_swap_in_and_copies_move_exactly_the_right_blocks() {
    let mut ex = executor(8, 5, 4);
    assert_eq!(ex.num_blocks(), (8, 5));
    fill(ex.device_pool_mut(), 0.5);
    fill(ex.cpu_pool_mut(), 0.25);
    let dev0 = all_blocks(ex.device_pool());
    let host0 = all_blocks(ex.cpu_pool());

    let c = |s, d| BlockCopy {
        src: BlockId(s),
        dst: BlockId(d),
    };
    let ops = BlockOps {
        swap_out: vec![c(2, 0), c(5, 3)],
        swap_in: vec![c(3, 7), c(1, 6)],
        copies: vec![c(1, 4)],
    };
    ex.apply_block_ops(&ops).expect("ops");
    let dev = all_blocks(ex.device_pool());
    let host = all_blocks(ex.cpu_pool());
    // Host: 0 <- dev 2, 3 <- dev 5, others unchanged.
    for b in 0..5 {
        let want = match b {
            0 => &dev0[2],
            3 => &dev0[5],
            _ => &host0[b],
        };
        assert_eq!(&host[b], want, "host block {b}");
    }
    // Device: 7 <- host 3 (= old dev 5, swapped out first), 6 <- old host 1, 4 <- dev 1.
    for b in 0..8 {
        let want = match b {
            7 => &dev0[5],
            6 => &host0[1],
            4 => &dev0[1],
            _ => &dev0[b],
        };
        assert_eq!(&dev[b], want, "device block {b}");
    }
}

#[test]
fn out_of_range_block_ops_move_nothing() {
    let mut ex = executor(4, 2, 4);
    fill(ex.device_pool_mut(), 1.0);
    let before = all_blocks(ex.device_pool());
    let c = |s, d| BlockCopy {
        src: BlockId(s),
        dst: BlockId(d),
    };
    for ops in [
        BlockOps {
            swap_out: vec![c(0, 2)],
            ..Default::default()
        },
        BlockOps {
            swap_in: vec![c(0, 1), c(2, 0)],
            ..Default::default()
        },
        BlockOps {
            copies: vec![c(0, 1), c(0, 4)],
            ..Default::default()
        },
    ] {
        let err = ex.logits(&ops, &ForwardBatch::default());
        assert!(matches!(err, Err(ExecError::BlockOutOfRange(_))), "{ops:?}");
        assert_eq!(all_blocks(ex.device_pool()), before);
    }
}

#[test]
fn memory_budget_sizes_pools_in_whole_blocks() {
    let c = config();
    let model = CpuModel::new(c.clone(), weights(&c)).expect("model");
    // 2 (K,V) * 3 layers * 4 tokens * 2 heads * 8 dims * 4 bytes.
    let per = 2 * 3 * 4 * 2 * 8 * 4;
    assert_eq!(CpuExecutor::bytes_per_block(&model, 4, KvDtype::F32), per);
    assert_eq!(
        CpuExecutor::bytes_per_block(&model, 4, KvDtype::F16),
        per / 2
    );
    let ex = CpuExecutor::with_memory_budget(model, per * 10 + per / 2, per * 3, 4, KvDtype::F32)
        .expect("ex");
    assert_eq!(ex.num_blocks(), (10, 3));
    let model = CpuModel::new(c.clone(), weights(&c)).expect("model");
    assert!(CpuExecutor::with_memory_budget(model, per - 1, 0, 4, KvDtype::F32).is_err());
}

#[test]
fn greedy_generation_matches_full_recompute() {
    let mut ex = executor(16, 0, 4);
    let prompt = [3u32, 14, 15, 9, 26, 5];
    let got = generate_greedy(&mut ex, &prompt, 10, &[], |_| {}).expect("generate");
    assert_eq!(got.len(), 10);
    // Reference: recompute the whole sequence from scratch for every token.
    let c = config();
    let model = CpuModel::new(c.clone(), weights(&c)).expect("model");
    let mut seq = prompt.to_vec();
    for _ in 0..10 {
        let mut cache = KvCache::new(model.kv_geometry(16, 4));
        let mut batch = ForwardBatch::default();
        ContiguousLayout {
            block_size: 4,
            blocks_per_seq: 16,
        }
        .push(&mut batch, 0, 0, &seq, true);
        let logits = model.forward(&batch, &mut cache).expect("forward");
        seq.push(argmax(logits.row(0)));
    }
    assert_eq!(got, seq[prompt.len()..].to_vec());
    // Stops at (and includes) an EOS id.
    let stop = got[3];
    let first = got.iter().position(|&t| t == stop).expect("present");
    let short = generate_greedy(&mut ex, &prompt, 10, &[stop], |_| {}).expect("generate");
    assert_eq!(short, got[..=first].to_vec());
    // Too long for the pool.
    assert!(generate_greedy(&mut ex, &prompt, 100, &[], |_| {}).is_err());
}

#[test]
fn argmax_picks_first_maximum() {
    assert_eq!(argmax(&[1.0, 3.0, 3.0, f32::NAN, -1.0]), 1);
}
