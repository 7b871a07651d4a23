//! HF model directories: config.json variants, safetensors (single, sharded,
//! f32/f16/bf16), tokenizer files, and their error paths.

use std::path::Path;

use half::{bf16, f16};
use model_loader::gguf::{GgmlType, GgufFile};
use model_loader::hf::parse_config;
use model_loader::{load_model, Architecture, LoaderError, RopeScaling, Tensor};
use serde_json::json;

use crate::common::{self, small_gguf};

/// GGUF name -> HF name for the small test model.
fn hf_name(gguf: &str) -> String {
    let map = [
        ("token_embd.weight", "model.embed_tokens.weight"),
        ("output_norm.weight", "model.norm.weight"),
        ("attn_norm.weight", "input_layernorm.weight"),
        ("attn_q.weight", "self_attn.q_proj.weight"),
        ("attn_k.weight", "self_attn.k_proj.weight"),
        ("attn_v.weight", "self_attn.v_proj.weight"),
        ("attn_q.bias", "self_attn.q_proj.bias"),
        ("attn_k.bias", "self_attn.k_proj.bias"),
        ("attn_v.bias", "self_attn.v_proj.bias"),
        ("attn_output.weight", "self_attn.o_proj.weight"),
        ("ffn_norm.weight", "post_attention_layernorm.weight"),
        ("ffn_gate.weight", "mlp.gate_proj.weight"),
        ("ffn_up.weight", "mlp.up_proj.weight"),
        ("ffn_down.weight", "mlp.down_proj.weight"),
    ];
    let (prefix, rest) = match gguf.strip_prefix("blk.0.") {
        Some(rest) => ("model.layers.0.", rest),
        None => ("", gguf),
    };
    let mapped = map
        .iter()
        .find(|(g, _)| *g == rest)
        .map(|(_, h)| *h)
        .unwrap_or(rest);
    format!("{prefix}{mapped}")
}

/// Writes a safetensors file by hand: (name, dtype, shape, raw bytes).
fn write_st(path: &Path, tensors: &[(String, &str, Vec<usize>, Vec<u8>)]) {
    let mut header = serde_json::Map::new();
    let mut off = 0;
    for (name, dtype, shape, b) in tensors {
        header.insert(
            name.clone(),
            json!({"dtype": dtype, "shape": shape, "data_offsets": [off, off + b.len()]}),
        );
        off += b.len();
    }
    let h = serde_json::to_vec(&header).unwrap();
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend(h);
    for t in tensors {
        out.extend(&t.3);
    }
    std::fs::write(path, out).unwrap();
}

fn encode(dtype: &str, data: &[f32]) -> Vec<u8> {
    match dtype {
        "F32" => data.iter().flat_map(|v| v.to_le_bytes()).collect(),
        "F16" => data
            .iter()
            .flat_map(|v| f16::from_f32(*v).to_le_bytes())
            .collect(),
        "BF16" => data
            .iter()
            .flat_map(|v| bf16::from_f32(*v).to_le_bytes())
            .collect(),
        _ => data.iter().map(|v| (*v * 100.0) as i8 as u8).collect(),
    }
}

fn config_json(arch: &str) -> serde_json::Value {
    json!({
        "architectures": [arch], "vocab_size": common::vocab_size(), "hidden_size": common::HIDDEN,
        "intermediate_size": common::FF, "num_hidden_layers": 1, "num_attention_heads": common::HEADS,
        "num_key_value_heads": common::KV_HEADS, "rms_norm_eps": 1e-6, "rope_theta": 500.0,
        "max_position_embeddings": 64, "tie_word_embeddings": true,
    })
}

/// An HF dir for the small model; `dtype_of` picks each tensor's dtype,
/// `shards` splits the tensors over that many files.
pub(crate) fn hf_dir(
    arch: &str,
    dtype_of: impl Fn(&str) -> &'static str,
    shards: usize,
) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let gg_arch = if arch == "Qwen2ForCausalLM" {
        "qwen2"
    } else {
        "llama"
    };
    std::fs::write(d.join("config.json"), config_json(arch).to_string()).unwrap();
    let g = GgufFile::parse(
        small_gguf("llama", "smollm", GgmlType::F32)
            .to_bytes()
            .unwrap(),
    )
    .unwrap();
    let tok = model_loader::tokenizer::gguf::tokenizer_from_gguf(&g).unwrap();
    tok.save(&d.join("tokenizer.json")).unwrap();
    let tcfg = json!({"add_bos_token": true, "bos_token": {"content": "<|im_start|>"}, "eos_token": "<|im_end|>",
                      "chat_template": [{"name": "default", "template": "{{ bos_token }}{{ messages[0].content }}"}]});
    std::fs::write(d.join("tokenizer_config.json"), tcfg.to_string()).unwrap();
    std::fs::write(
        d.join("generation_config.json"),
        r#"{"eos_token_id": [2, 0]}"#,
    )
    .unwrap();
    let tensors: Vec<_> = common::hf_tensors(gg_arch)
        .into_iter()
        .map(|(n, s, data)| {
            let name = hf_name(&n);
            let dt = dtype_of(&name);
            (name, dt, s, encode(dt, &data))
        })
        .collect();
    if shards == 1 {
        write_st(&d.join("model.safetensors"), &tensors);
    } else {
        let mut map = serde_json::Map::new();
        for (i, chunk) in tensors.chunks(tensors.len().div_ceil(shards)).enumerate() {
            let file = format!("model-{:05}-of-{shards:05}.safetensors", i + 1);
            for t in chunk {
                map.insert(t.0.clone(), json!(file));
            }
            write_st(&d.join(&file), chunk);
        }
        let index = json!({"metadata": {}, "weight_map": map});
        std::fs::write(d.join("model.safetensors.index.json"), index.to_string()).unwrap();
    }
    dir
}

fn source(gg_arch: &str, hf: &str) -> Vec<f32> {
    common::hf_tensors(gg_arch)
        .into_iter()
        .find(|t| hf_name(&t.0) == hf)
        .unwrap()
        .2
}

fn max_err(t: &Tensor, want: &[f32]) -> f32 {
    t.data
        .iter()
        .zip(want)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max)
}

#[test]
fn llama_single_file_f32() {
    let dir = hf_dir("LlamaForCausalLM", |_| "F32", 1);
    let m = load_model(dir.path()).unwrap();
    assert_eq!(m.config.architecture, Architecture::Llama);
    assert_eq!((m.config.head_dim, m.config.rope_theta), (16, 500.0));
    let l = &m.weights.layers[0];
    assert_eq!(
        l.wq.data,
        source("llama", "model.layers.0.self_attn.q_proj.weight")
    );
    assert_eq!(
        l.w_down.data,
        source("llama", "model.layers.0.mlp.down_proj.weight")
    );
    assert!(m.weights.lm_head.is_none());
    let t = &m.tokenizer;
    assert_eq!(
        (t.bos_token_id(), t.eos_token_ids()),
        (Some(1), &[2u32, 0][..])
    );
    assert_eq!(
        t.encode(" the", true).unwrap(),
        vec![1, t.token_to_id("Ġthe").unwrap()]
    );
    let tmpl = m.chat_template.unwrap();
    assert_eq!(
        tmpl.render(&[model_loader::ChatMessage::new("user", "x")], false)
            .unwrap(),
        "<|im_start|>x"
    );
}

#[test]
fn sharded_f16_bf16_qwen2() {
    let dir = hf_dir(
        "Qwen2ForCausalLM",
        |n| if n.contains("mlp") { "BF16" } else { "F16" },
        3,
    );
    let m = load_model(dir.path()).unwrap();
    assert!(m.config.attention_bias && m.config.architecture == Architecture::Qwen2);
    let l = &m.weights.layers[0];
    let e = max_err(
        &l.wq,
        &source("qwen2", "model.layers.0.self_attn.q_proj.weight"),
    );
    assert!(e > 0.0 && e < 1e-3, "f16 error {e}");
    let e = max_err(
        &l.w_up,
        &source("qwen2", "model.layers.0.mlp.up_proj.weight"),
    );
    assert!(e > 0.0 && e < 1e-2, "bf16 error {e}");
    let e = max_err(
        l.bv.as_ref().unwrap(),
        &source("qwen2", "model.layers.0.self_attn.v_proj.bias"),
    );
    assert!(e < 1e-3);
}

#[test]
fn safetensors_writer_is_readable_by_the_safetensors_crate() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("w.safetensors");
    let a = Tensor::new(vec![2, 3], vec![1., 2., 3., 4., 5., 6.]);
    let b = Tensor::new(vec![1], vec![-1.5]);
    model_loader::safetensors_io::write_f32(&path, &[("b".into(), &b), ("a".into(), &a)]).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let view = st.tensor("a").unwrap();
    assert_eq!(view.shape(), &[2, 3]);
    assert_eq!(view.dtype(), safetensors::Dtype::F32);
    assert_eq!(view.data(), encode("F32", &a.data));
    assert_eq!(st.tensor("b").unwrap().data(), (-1.5f32).to_le_bytes());
}

#[test]
fn config_variants() {
    let mut v = config_json("MistralForCausalLM");
    v["rope_scaling"] = json!({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                               "high_freq_factor": 4.0, "original_max_position_embeddings": 8192});
    v["head_dim"] = json!(8);
    v["tie_word_embeddings"] = json!(false);
    let c = parse_config(&v).unwrap();
    assert_eq!(
        c.architecture,
        Architecture::Mistral {
            sliding_window: None
        }
    );
    v["sliding_window"] = json!(4096);
    assert_eq!(
        parse_config(&v).unwrap().architecture,
        Architecture::Mistral {
            sliding_window: Some(4096)
        }
    );
    assert_eq!(c.head_dim, 8);
    assert!(!c.tie_word_embeddings);
    assert_eq!(
        c.rope_scaling,
        Some(RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192
        })
    );
    v["rope_scaling"] = json!({"type": "yarn", "factor": 4.0});
    assert!(matches!(parse_config(&v), Err(LoaderError::UnsupportedRopeScaling(t)) if t == "yarn"));
    v["rope_scaling"] = json!(null);
    v["architectures"] = json!(["GPT2LMHeadModel"]);
    assert!(
        matches!(parse_config(&v), Err(LoaderError::UnsupportedArchitecture(a)) if a == "GPT2LMHeadModel")
    );
    v["architectures"] = json!(["LlamaForCausalLM"]);
    v["num_key_value_heads"] = json!(3);
    assert!(matches!(
        parse_config(&v),
        Err(LoaderError::InvalidConfig(_))
    ));
    v["num_key_value_heads"] = json!("two");
    assert!(
        matches!(parse_config(&v), Err(LoaderError::InvalidConfig(m)) if m.contains("num_key_value_heads"))
    );
}

#[test]
fn error_paths() {
    // Bad JSON.
    let dir = hf_dir("LlamaForCausalLM", |_| "F32", 1);
    std::fs::write(dir.path().join("config.json"), "{\"architectures\": [").unwrap();
    assert!(matches!(
        load_model(dir.path()),
        Err(LoaderError::BadJson { .. })
    ));
    // Unsupported dtype, named.
    let dir = hf_dir(
        "LlamaForCausalLM",
        |n| if n.contains("v_proj") { "I8" } else { "F32" },
        1,
    );
    let err = load_model(dir.path()).unwrap_err();
    assert!(
        matches!(&err, LoaderError::UnsupportedDtype { dtype, tensor } if dtype == "I8" && tensor.contains("v_proj")),
        "{err}"
    );
    // Untied config: lm_head.weight is missing.
    let dir = hf_dir("LlamaForCausalLM", |_| "F32", 1);
    let mut v = config_json("LlamaForCausalLM");
    v["tie_word_embeddings"] = json!(false);
    std::fs::write(dir.path().join("config.json"), v.to_string()).unwrap();
    assert!(
        matches!(load_model(dir.path()), Err(LoaderError::MissingTensor(n)) if n == "lm_head.weight")
    );
    // Shape mismatch: config says a bigger FFN.
    v["tie_word_embeddings"] = json!(true);
    v["intermediate_size"] = json!(96);
    std::fs::write(dir.path().join("config.json"), v.to_string()).unwrap();
    assert!(matches!(
        load_model(dir.path()),
        Err(LoaderError::ShapeMismatch { .. })
    ));
    // Truncated safetensors.
    let dir = hf_dir("LlamaForCausalLM", |_| "F32", 1);
    let p = dir.path().join("model.safetensors");
    let b = std::fs::read(&p).unwrap();
    std::fs::write(&p, &b[..b.len() - 4]).unwrap();
    assert!(matches!(
        load_model(dir.path()),
        Err(LoaderError::Truncated { .. })
    ));
    std::fs::write(&p, &b[..5]).unwrap();
    assert!(matches!(
        load_model(dir.path()),
        Err(LoaderError::Truncated { .. })
    ));
    // Neither a file nor a model dir.
    let empty = tempfile::tempdir().unwrap();
    assert!(matches!(
        load_model(empty.path()),
        Err(LoaderError::UnknownFormat { .. })
    ));
    assert!(matches!(
        load_model(&empty.path().join("nope.gguf")),
        Err(LoaderError::Io { .. })
    ));
}
