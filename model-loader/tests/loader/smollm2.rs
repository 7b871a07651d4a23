//! Tests against the real default model (SmolLM2-135M-Instruct Q4_1 GGUF).
//! `cargo xtask fetch-model` must have run.

use model_loader::{load_config_and_tokenizer, load_model, paths, Architecture, ChatMessage};

fn model_path() -> std::path::PathBuf {
    let p = paths::default_model_path();
    assert!(
        p.is_file(),
        "{} missing: run `cargo xtask fetch-model`",
        p.display()
    );
    p
}

#[test]
fn smollm2_config() {
    let info = load_config_and_tokenizer(&model_path()).unwrap();
    let c = info.config;
    assert_eq!(c.architecture, Architecture::Llama);
    assert_eq!(
        (
            c.vocab_size,
            c.hidden_size,
            c.intermediate_size,
            c.num_hidden_layers
        ),
        (49152, 576, 1536, 30)
    );
    assert_eq!(
        (c.num_attention_heads, c.num_key_value_heads, c.head_dim),
        (9, 3, 64)
    );
    assert_eq!(c.rope_theta, 100000.0);
    assert!((c.rms_norm_eps - 1e-5).abs() < 1e-9);
    assert_eq!(c.max_position_embeddings, 8192);
    assert!(c.tie_word_embeddings);
    assert!(!c.attention_bias);
}

#[test]
fn smollm2_tokenizer_basics() {
    let info = load_config_and_tokenizer(&model_path()).unwrap();
    let t = info.tokenizer;
    assert_eq!(t.vocab_size(), 49152);
    assert_eq!(t.bos_token_id(), Some(1));
    assert_eq!(t.eos_token_ids(), &[2]);
    assert!(!t.add_bos_token());
    let ids = t.encode("Hello, world! 12345", true).unwrap();
    let toks: Vec<String> = ids.iter().map(|&i| t.id_to_token(i).unwrap()).collect();
    // Byte-level BPE with digits split one by one; no BOS for SmolLM2.
    assert_eq!(
        toks,
        ["Hello", ",", "Ġworld", "!", "Ġ", "1", "2", "3", "4", "5"]
    );
    assert_eq!(t.decode(&ids, false).unwrap(), "Hello, world! 12345");
    let ids = t.encode("<|im_start|>user\nhi<|im_end|>", false).unwrap();
    assert_eq!(ids[0], 1);
    assert_eq!(*ids.last().unwrap(), 2);
    assert!(t.is_special(1) && t.is_special(2) && !t.is_special(ids[1]));
    assert_eq!(t.decode(&ids, true).unwrap(), "user\nhi");
    // token_bytes concatenates to the UTF-8 text, even mid-character.
    let text = "naïve café 🦀 — ok";
    let ids = t.encode(text, false).unwrap();
    let bytes: Vec<u8> = ids
        .iter()
        .flat_map(|&i| t.token_bytes(i).unwrap())
        .collect();
    assert_eq!(bytes, text.as_bytes());
    assert_eq!(t.token_bytes(1).unwrap(), b"<|im_start|>");
    assert_eq!(t.token_bytes(49152), None);
}

#[test]
fn smollm2_chat_template() {
    let info = load_config_and_tokenizer(&model_path()).unwrap();
    let tmpl = info.chat_template.expect("SmolLM2 ships a chat template");
    let out = tmpl
        .render(&[ChatMessage::new("user", "What is 2+2?")], true)
        .unwrap();
    assert_eq!(
        out,
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n\
         <|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"
    );
}

#[test]
fn smollm2_weights_match_gguf_py() {
    // Reference made by llama.cpp's gguf-py (tests/fixtures/gguf_reference.py).
    let text = include_str!("../fixtures/smollm2_reference.json");
    let reference: serde_json::Value = serde_json::from_str(text).unwrap();
    let m = load_model(&model_path()).unwrap();
    let w = &m.weights;
    assert_eq!(w.layers.len(), 30);
    assert!(w.lm_head.is_none());
    let ours = [
        ("token_embd.weight", &w.token_embedding),
        ("blk.0.attn_q.weight", &w.layers[0].wq),
        ("blk.0.attn_k.weight", &w.layers[0].wk),
        ("blk.7.attn_v.weight", &w.layers[7].wv),
        ("blk.29.ffn_down.weight", &w.layers[29].w_down),
        ("output_norm.weight", &w.final_norm),
    ];
    for (name, t) in ours {
        let r = &reference[name];
        let shape: Vec<usize> = serde_json::from_value(r["shape"].clone()).unwrap();
        assert_eq!(t.shape, shape, "{name}");
        let close = |a: f64, b: f64, what: &str| {
            assert!(
                (a - b).abs() <= 1e-6 * b.abs().max(1.0) * 10.0,
                "{name} {what}: {a} vs {b}"
            );
        };
        let sum: f64 = t.data.iter().map(|&v| f64::from(v)).sum();
        let weighted: f64 = t
            .data
            .iter()
            .enumerate()
            .map(|(i, &v)| f64::from(v) * ((i % 97) + 1) as f64)
            .sum();
        close(sum, r["sum"].as_f64().unwrap(), "sum");
        close(
            weighted,
            r["weighted_sum"].as_f64().unwrap(),
            "weighted sum",
        );
        for (row, vals) in r["rows"].as_object().unwrap() {
            let row: usize = row.parse().unwrap();
            let cols = t.shape[1];
            for (j, v) in vals.as_array().unwrap().iter().enumerate() {
                // serde_json's float parsing may be one ulp off; values are f32 exact.
                let (a, b) = (f64::from(t.data[row * cols + j]), v.as_f64().unwrap());
                assert!((a - b).abs() <= 1e-12, "{name}[{row}][{j}]: {a} vs {b}");
            }
        }
    }
}
