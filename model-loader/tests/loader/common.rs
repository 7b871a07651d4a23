//! Builders of small, well-formed model files that tests then break.

use model_loader::gguf::writer::{permute_qk, GgufWriter};
use model_loader::gguf::{GgmlType, MetaValue};
use model_loader::tiny::SplitMix64;
use model_loader::tokenizer::byte_to_char_table;

pub const HIDDEN: usize = 32;
pub const HEADS: usize = 2;
pub const KV_HEADS: usize = 1;
pub const HEAD_DIM: usize = 16;
pub const FF: usize = 64;

/// Tokens: 3 control tokens, the 256 byte tokens, then merge results.
pub fn vocab() -> (Vec<String>, Vec<i32>, Vec<String>) {
    let mut tokens: Vec<String> = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
        .map(String::from)
        .to_vec();
    tokens.extend(byte_to_char_table().iter().map(|c| c.to_string()));
    let merges = ["Ġ t", "h e", "Ġt he", "1 2", "12 3", "4 5"]
        .map(String::from)
        .to_vec();
    tokens.extend(["Ġt", "he", "Ġthe", "12", "123", "45"].map(String::from));
    let mut types = vec![1i32; tokens.len()];
    types[..3].fill(3);
    (tokens, types, merges)
}

pub fn vocab_size() -> usize {
    vocab().0.len()
}

/// Deterministic values in [-1, 1).
pub fn values(seed: u64, n: usize) -> Vec<f32> {
    let mut rng = SplitMix64::new(seed);
    (0..n).map(|_| rng.next_signed()).collect()
}

/// Row-major HF-order tensors of a 1-layer model: (gguf name, shape, data).
pub fn hf_tensors(arch: &str) -> Vec<(String, Vec<usize>, Vec<f32>)> {
    let v = vocab_size();
    let (q, kv) = (HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM);
    let mut list = vec![
        ("token_embd.weight", vec![v, HIDDEN]),
        ("blk.0.attn_norm.weight", vec![HIDDEN]),
        ("blk.0.attn_q.weight", vec![q, HIDDEN]),
        ("blk.0.attn_k.weight", vec![kv, HIDDEN]),
        ("blk.0.attn_v.weight", vec![kv, HIDDEN]),
        ("blk.0.attn_output.weight", vec![HIDDEN, q]),
        ("blk.0.ffn_norm.weight", vec![HIDDEN]),
        ("blk.0.ffn_gate.weight", vec![FF, HIDDEN]),
        ("blk.0.ffn_up.weight", vec![FF, HIDDEN]),
        ("blk.0.ffn_down.weight", vec![HIDDEN, FF]),
        ("output_norm.weight", vec![HIDDEN]),
    ];
    if arch == "qwen2" {
        list.extend([
            ("blk.0.attn_q.bias", vec![q]),
            ("blk.0.attn_k.bias", vec![kv]),
            ("blk.0.attn_v.bias", vec![kv]),
        ]);
    }
    list.into_iter()
        .enumerate()
        .map(|(i, (n, s))| {
            let len = s.iter().product();
            (n.to_string(), s, values(i as u64 + 1, len))
        })
        .collect()
}

/// Metadata of a small model (`arch` = llama or qwen2) with a tokenizer.
pub fn meta(g: &mut GgufWriter, arch: &str, pre: &str) {
    let (tokens, types, merges) = vocab();
    let k = |s: &str| format!("{arch}.{s}");
    let strs = |v: Vec<String>| MetaValue::Array(v.into_iter().map(MetaValue::String).collect());
    g.meta("general.architecture", MetaValue::String(arch.into()))
        .meta(&k("block_count"), MetaValue::U32(1))
        .meta(&k("context_length"), MetaValue::U64(64))
        .meta(&k("embedding_length"), MetaValue::U32(HIDDEN as u32))
        .meta(&k("feed_forward_length"), MetaValue::I32(FF as i32))
        .meta(&k("attention.head_count"), MetaValue::U32(HEADS as u32))
        .meta(
            &k("attention.head_count_kv"),
            MetaValue::U16(KV_HEADS as u16),
        )
        .meta(&k("rope.freq_base"), MetaValue::F32(500.0))
        .meta(&k("attention.layer_norm_rms_epsilon"), MetaValue::F64(1e-6))
        .meta("tokenizer.ggml.model", MetaValue::String("gpt2".into()))
        .meta("tokenizer.ggml.pre", MetaValue::String(pre.into()))
        .meta("tokenizer.ggml.tokens", strs(tokens))
        .meta(
            "tokenizer.ggml.token_type",
            MetaValue::Array(types.into_iter().map(MetaValue::I32).collect()),
        )
        .meta("tokenizer.ggml.merges", strs(merges))
        .meta("tokenizer.ggml.bos_token_id", MetaValue::U32(1))
        .meta("tokenizer.ggml.eos_token_id", MetaValue::U32(2))
        .meta("tokenizer.ggml.add_bos_token", MetaValue::Bool(true))
        .meta(
            "tokenizer.chat_template",
            MetaValue::String(
                "{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}".into(),
            ),
        );
}

/// A complete small GGUF file; Q/K permuted as llama.cpp does for `llama`.
pub fn small_gguf(arch: &str, pre: &str, ty: GgmlType) -> GgufWriter {
    let mut g = GgufWriter::new();
    meta(&mut g, arch, pre);
    for (name, shape, data) in hf_tensors(arch) {
        let data = match (arch, name.as_str()) {
            ("llama", "blk.0.attn_q.weight") => permute_qk(&data, HEADS, shape[0], shape[1]),
            ("llama", "blk.0.attn_k.weight") => permute_qk(&data, KV_HEADS, shape[0], shape[1]),
            _ => data,
        };
        let t = if shape.len() == 1 { GgmlType::F32 } else { ty };
        g.tensor(&name, shape, t, data);
    }
    g
}

/// Writes bytes into a fresh temp dir and returns (dir, path).
pub fn write_temp(name: &str, bytes: &[u8]) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join(name);
    std::fs::write(&path, bytes).expect("write temp file");
    (dir, path)
}
