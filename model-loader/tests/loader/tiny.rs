//! The tiny model generator: both layouts load to the same weights and the
//! same token ids; the truncated tokenizer still encodes arbitrary text.

use model_loader::tiny::{tiny_config, write_tiny_model, TINY_VOCAB};
use model_loader::{load_model, paths, ChatMessage};

const TEXTS: &[&str] = &[
    "Hello, world! 12345",
    "The quick brown fox jumps over the lazy dog.",
    "  whitespace   runs\t\tand\n\nnewlines  ",
    "naïve café — 日本語 🦀🚀",
    "fn main() { println!(\"{}\", 40 + 2); }",
    "<|im_start|>user\nHi<|im_end|>\n",
];

#[test]
fn both_layouts_agree() {
    assert!(
        paths::default_model_path().is_file(),
        "run `cargo xtask fetch-model`"
    );
    let dir = tempfile::tempdir().unwrap();
    let files = write_tiny_model(dir.path()).unwrap();
    let g = load_model(&files.gguf).unwrap();
    let h = load_model(&files.hf_dir).unwrap();
    assert_eq!(g.config, tiny_config());
    assert_eq!(h.config, tiny_config());
    let (a, b) = (&g.weights, &h.weights);
    assert_eq!(a.token_embedding, b.token_embedding);
    assert_eq!(a.final_norm, b.final_norm);
    assert!(a.lm_head.is_none() && b.lm_head.is_none());
    for (x, y) in a.layers.iter().zip(&b.layers) {
        for (p, q) in [
            (&x.wq, &y.wq),
            (&x.wk, &y.wk),
            (&x.wv, &y.wv),
            (&x.wo, &y.wo),
        ] {
            assert_eq!(p, q);
        }
        for (p, q) in [
            (&x.w_gate, &y.w_gate),
            (&x.w_up, &y.w_up),
            (&x.w_down, &y.w_down),
        ] {
            assert_eq!(p, q);
        }
        assert_eq!((&x.attn_norm, &x.ffn_norm), (&y.attn_norm, &y.ffn_norm));
    }
    // The GGUF really holds permuted Q rows (so the inverse is exercised).
    let raw = model_loader::gguf::GgufFile::open(&files.gguf).unwrap();
    let q = raw.tensor_info("blk.0.attn_q.weight").unwrap();
    assert_ne!(raw.read_f32(q).unwrap(), a.layers[0].wq.data);

    let (tg, th) = (&g.tokenizer, &h.tokenizer);
    assert_eq!((tg.bos_token_id(), th.bos_token_id()), (Some(1), Some(1)));
    assert_eq!(
        (tg.eos_token_ids(), th.eos_token_ids()),
        (&[2u32][..], &[2u32][..])
    );
    for text in TEXTS {
        let ids = tg.encode(text, true).unwrap();
        assert_eq!(ids, th.encode(text, true).unwrap(), "{text:?}");
        assert!(ids.iter().all(|&i| (i as usize) < TINY_VOCAB));
        assert_eq!(tg.decode(&ids, false).unwrap(), *text);
        let bytes: Vec<u8> = ids
            .iter()
            .flat_map(|&i| tg.token_bytes(i).unwrap())
            .collect();
        assert_eq!(bytes, text.as_bytes());
    }
    // Same ids as the full SmolLM2 tokenizer where its tokens fit below 1024.
    let full = model_loader::load_config_and_tokenizer(&paths::default_model_path()).unwrap();
    let ids = full
        .tokenizer
        .encode("<|im_start|>\n1 2 3<|im_end|>", false)
        .unwrap();
    assert!(ids.iter().all(|&i| (i as usize) < TINY_VOCAB), "{ids:?}");
    assert_eq!(
        tg.encode("<|im_start|>\n1 2 3<|im_end|>", false).unwrap(),
        ids
    );

    let msgs = [ChatMessage::new("user", "Hi")];
    let rg = g.chat_template.unwrap().render(&msgs, true).unwrap();
    let rh = h.chat_template.unwrap().render(&msgs, true).unwrap();
    assert_eq!(rg, rh);
    assert!(rg.ends_with("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"));
}

#[test]
fn generator_is_deterministic() {
    let (d1, d2) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let f1 = write_tiny_model(d1.path()).unwrap();
    let f2 = write_tiny_model(d2.path()).unwrap();
    assert_eq!(
        std::fs::read(&f1.gguf).unwrap(),
        std::fs::read(&f2.gguf).unwrap()
    );
    let st = |d: &std::path::Path| std::fs::read(d.join("model.safetensors")).unwrap();
    assert_eq!(st(&f1.hf_dir), st(&f2.hf_dir));
}

#[test]
fn missing_source_model_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let err =
        model_loader::tiny::write_tiny_model_from(&dir.path().join("absent.gguf"), dir.path())
            .unwrap_err();
    assert!(err.to_string().contains("fetch-model"), "{err}");
}
