//! Random in-memory models for tests.

use model_loader::{Architecture, LayerWeights, ModelConfig, ModelWeights, RopeScaling, Tensor};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// A tiny Llama config: 2 layers, hidden 64, 4 heads / 2 KV heads of 16.
pub fn tiny_config(bias: bool, scaling: Option<RopeScaling>) -> ModelConfig {
    ModelConfig {
        architecture: if bias {
            Architecture::Qwen2
        } else {
            Architecture::Llama
        },
        vocab_size: 97,
        hidden_size: 64,
        intermediate_size: 96,
        num_hidden_layers: 2,
        num_attention_heads: 4,
        num_key_value_heads: 2,
        head_dim: 16,
        rms_norm_eps: 1e-5,
        rope_theta: 10000.0,
        rope_scaling: scaling,
        max_position_embeddings: 512,
        tie_word_embeddings: true,
        attention_bias: bias,
    }
}

fn rand_tensor(rng: &mut ChaCha8Rng, shape: &[usize], scale: f32, offset: f32) -> Tensor {
    let n = shape.iter().product();
    Tensor::new(
        shape.to_vec(),
        (0..n)
            .map(|_| offset + rng.gen_range(-scale..scale))
            .collect(),
    )
}

/// Random weights of the shapes `c` asks for.
pub fn random_weights(c: &ModelConfig, seed: u64) -> ModelWeights {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let (h, hd, i) = (c.hidden_size, c.head_dim, c.intermediate_size);
    let (qd, kvd) = (c.num_attention_heads * hd, c.num_key_value_heads * hd);
    let s = 1.0 / (h as f32).sqrt();
    let layers = (0..c.num_hidden_layers)
        .map(|_| LayerWeights {
            attn_norm: rand_tensor(&mut rng, &[h], 0.2, 1.0),
            wq: rand_tensor(&mut rng, &[qd, h], s * 2.0, 0.0),
            wk: rand_tensor(&mut rng, &[kvd, h], s * 2.0, 0.0),
            wv: rand_tensor(&mut rng, &[kvd, h], s, 0.0),
            wo: rand_tensor(&mut rng, &[h, qd], s, 0.0),
            bq: c
                .attention_bias
                .then(|| rand_tensor(&mut rng, &[qd], 0.5, 0.0)),
            bk: c
                .attention_bias
                .then(|| rand_tensor(&mut rng, &[kvd], 0.5, 0.0)),
            bv: c
                .attention_bias
                .then(|| rand_tensor(&mut rng, &[kvd], 0.5, 0.0)),
            ffn_norm: rand_tensor(&mut rng, &[h], 0.2, 1.0),
            w_gate: rand_tensor(&mut rng, &[i, h], s, 0.0),
            w_up: rand_tensor(&mut rng, &[i, h], s, 0.0),
            w_down: rand_tensor(&mut rng, &[h, i], 1.0 / (i as f32).sqrt(), 0.0),
            gemma: None,
        })
        .collect();
    ModelWeights {
        token_embedding: rand_tensor(&mut rng, &[c.vocab_size, h], 1.0, 0.0),
        layers,
        final_norm: rand_tensor(&mut rng, &[h], 0.2, 1.0),
        lm_head: None,
    }
}

/// Random vector of `n` values in `[-1, 1)`.
pub fn rand_vec(rng: &mut ChaCha8Rng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.gen_range(-1.0..1.0)).collect()
}
