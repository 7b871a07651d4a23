//! GGUF reader, writer, dequantization, permutation and error paths.

use model_loader::gguf::writer::{permute_qk, GgufWriter};
use model_loader::gguf::{GgmlType, GgufFile, MetaValue};
use model_loader::gguf_model::unpermute_qk;
use model_loader::tokenizer::gguf::tokenizer_from_gguf;
use model_loader::{load_model, Architecture, LoaderError};

use crate::common::{self, small_gguf, write_temp};

fn bytes(g: &GgufWriter) -> Vec<u8> {
    g.to_bytes().expect("serialize")
}

#[test]
fn metadata_of_every_type_round_trips() {
    let vals = [
        MetaValue::U8(7),
        MetaValue::I8(-7),
        MetaValue::U16(65535),
        MetaValue::I16(-300),
        MetaValue::U32(1 << 31),
        MetaValue::I32(-5),
        MetaValue::F32(1.5),
        MetaValue::Bool(true),
        MetaValue::String("héllo".into()),
        MetaValue::U64(1 << 40),
        MetaValue::I64(-(1 << 40)),
        MetaValue::F64(-2.25),
        MetaValue::Array(vec![MetaValue::I32(1), MetaValue::I32(2)]),
        MetaValue::Array(vec![
            MetaValue::Array(vec![MetaValue::String("a".into())]),
            MetaValue::Array(vec![
                MetaValue::String("b".into()),
                MetaValue::String("c".into()),
            ]),
        ]),
    ];
    let mut g = GgufWriter::new();
    for (i, v) in vals.iter().enumerate() {
        g.meta(&format!("k{i}"), v.clone());
    }
    let f = GgufFile::parse(bytes(&g)).unwrap();
    assert_eq!(f.version, 3);
    for (i, v) in vals.iter().enumerate() {
        assert_eq!(f.get(&format!("k{i}")), Some(v), "key k{i}");
    }
}

#[test]
fn unpermute_matches_the_reshape_formula_by_hand() {
    // One head, head_dim 4, one column: GGUF rows [r0 r1 r2 r3] hold HF rows
    // interleaved; w.reshape(1, 2, 2, 1).swapaxes(1, 2) gives [r0 r2 r1 r3].
    assert_eq!(
        unpermute_qk(&[0., 1., 2., 3.], 1, 4, 1),
        vec![0., 2., 1., 3.]
    );
    // Two heads of head_dim 4, two columns.
    let w: Vec<f32> = (0..16).map(|x| x as f32).collect();
    let expected = [
        0., 1., 4., 5., 2., 3., 6., 7., 8., 9., 12., 13., 10., 11., 14., 15.,
    ];
    assert_eq!(unpermute_qk(&w, 2, 8, 2), expected);
    let w: Vec<f32> = (0..96).map(|x| x as f32).collect();
    assert_eq!(unpermute_qk(&permute_qk(&w, 3, 12, 8), 3, 12, 8), w);
}

#[test]
fn llama_f32_loads_in_hf_order() {
    let (_d, path) = write_temp(
        "m.gguf",
        &bytes(&small_gguf("llama", "smollm", GgmlType::F32)),
    );
    let m = load_model(&path).unwrap();
    let c = &m.config;
    assert_eq!(c.architecture, Architecture::Llama);
    assert_eq!(
        (c.hidden_size, c.num_attention_heads, c.num_key_value_heads),
        (32, 2, 1)
    );
    assert_eq!(
        (c.head_dim, c.intermediate_size, c.max_position_embeddings),
        (16, 64, 64)
    );
    assert_eq!(c.vocab_size, common::vocab_size());
    assert_eq!((c.rope_theta, c.rms_norm_eps), (500.0, 1e-6));
    assert!(c.tie_word_embeddings && !c.attention_bias);
    let want = common::hf_tensors("llama");
    let get = |n: &str| &want.iter().find(|t| t.0 == n).unwrap().2;
    let l = &m.weights.layers[0];
    assert_eq!(&l.wq.data, get("blk.0.attn_q.weight"));
    assert_eq!(&l.wk.data, get("blk.0.attn_k.weight"));
    assert_eq!(&l.w_down.data, get("blk.0.ffn_down.weight"));
    assert_eq!(l.w_down.shape, vec![32, 64]);
    assert_eq!(&m.weights.token_embedding.data, get("token_embd.weight"));
    assert!(m.weights.lm_head.is_none() && l.bq.is_none());
}

#[test]
fn q8_0_and_f16_dequantize_close_to_the_source() {
    let want = common::hf_tensors("llama");
    let get = |n: &str| &want.iter().find(|t| t.0 == n).unwrap().2;
    for (ty, tol) in [(GgmlType::Q8_0, 1.0 / 127.0), (GgmlType::F16, 1e-3)] {
        let (_d, path) = write_temp("m.gguf", &bytes(&small_gguf("llama", "smollm", ty)));
        let m = load_model(&path).unwrap();
        for (got, name) in [
            (&m.weights.layers[0].wq.data, "blk.0.attn_q.weight"),
            (&m.weights.layers[0].w_gate.data, "blk.0.ffn_gate.weight"),
        ] {
            let max = got
                .iter()
                .zip(get(name))
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            assert!(max > 0.0 && max <= tol, "{ty:?} {name}: max error {max}");
        }
    }
}

#[test]
fn qwen2_has_biases_and_no_permutation() {
    let (_d, path) = write_temp(
        "m.gguf",
        &bytes(&small_gguf("qwen2", "qwen2", GgmlType::F32)),
    );
    let m = load_model(&path).unwrap();
    assert_eq!(m.config.architecture, Architecture::Qwen2);
    assert!(m.config.attention_bias);
    let want = common::hf_tensors("qwen2");
    let get = |n: &str| &want.iter().find(|t| t.0 == n).unwrap().2;
    let l = &m.weights.layers[0];
    assert_eq!(&l.wq.data, get("blk.0.attn_q.weight"));
    assert_eq!(&l.bk.as_ref().unwrap().data, get("blk.0.attn_k.bias"));
}

#[test]
fn output_weight_unties() {
    let mut g = small_gguf("llama", "smollm", GgmlType::F32);
    let n = common::vocab_size() * common::HIDDEN;
    g.tensor(
        "output.weight",
        vec![common::vocab_size(), common::HIDDEN],
        GgmlType::F32,
        common::values(99, n),
    );
    let (_d, path) = write_temp("m.gguf", &bytes(&g));
    let m = load_model(&path).unwrap();
    assert!(!m.config.tie_word_embeddings);
    assert_eq!(m.weights.output_weight().data, common::values(99, n));
}

#[test]
fn tokenizer_from_metadata() {
    let f = GgufFile::parse(bytes(&small_gguf("llama", "smollm", GgmlType::F32))).unwrap();
    let t = tokenizer_from_gguf(&f).unwrap();
    let id = |s: &str| t.token_to_id(s).unwrap();
    // add_bos_token is true in this file.
    assert_eq!(
        t.encode(" the the", true).unwrap(),
        vec![1, id("Ġthe"), id("Ġthe")]
    );
    assert_eq!(t.encode("the", false).unwrap(), vec![id("t"), id("he")]);
    assert_eq!(t.encode("<|im_end|>x", false).unwrap(), vec![2, id("x")]);
    assert_eq!(t.decode(&[1, id("Ġthe"), 2], true).unwrap(), " the");
    assert_eq!(t.token_bytes(id("Ġthe")).unwrap(), b" the");
    assert!(t.is_special(0) && !t.is_special(id("x")));
    // The saved tokenizer.json reloads to the same tokenizer.
    let again =
        model_loader::Tokenizer::from_json(t.to_json().to_string(), Default::default()).unwrap();
    assert_eq!(
        again.encode("the 12345 the", false).unwrap(),
        t.encode("the 12345 the", false).unwrap()
    );
}

#[test]
fn pre_tokenizers_split_digits_their_own_way() {
    // Merges: "1 2" -> 12, "12 3" -> 123, "4 5" -> 45.
    let cases: [(&str, &[&str]); 4] = [
        ("smollm", &["4", "5", "1", "2"]),
        ("gpt2", &["45", "12"]),
        ("llama-bpe", &["45", "1", "2"]),
        ("qwen2", &["4", "5", "1", "2"]),
    ];
    for (pre, want) in cases {
        let f = GgufFile::parse(bytes(&small_gguf("llama", pre, GgmlType::F32))).unwrap();
        let t = tokenizer_from_gguf(&f).unwrap();
        let got: Vec<String> = t
            .encode("4512", false)
            .unwrap()
            .iter()
            .map(|&i| t.id_to_token(i).unwrap())
            .collect();
        assert_eq!(got, want, "pre-tokenizer {pre}");
    }
}

fn err_of(g: &GgufWriter) -> LoaderError {
    let (_d, path) = write_temp("m.gguf", &bytes(g));
    load_model(&path).expect_err("must fail")
}

#[test]
fn bad_magic_and_version() {
    let mut b = bytes(&small_gguf("llama", "smollm", GgmlType::F32));
    b[0] = b'X';
    assert!(matches!(
        GgufFile::parse(b.clone()),
        Err(LoaderError::BadMagic { .. })
    ));
    b[0] = b'G';
    b[4] = 2;
    assert!(matches!(
        GgufFile::parse(b),
        Err(LoaderError::UnsupportedVersion(2))
    ));
}

#[test]
fn every_truncation_is_an_error_never_a_panic() {
    let b = bytes(&small_gguf("llama", "smollm", GgmlType::Q8_0));
    let step = (b.len() / 997).max(1);
    for cut in (0..b.len()).step_by(step).chain([b.len() - 1]) {
        match GgufFile::parse(b[..cut].to_vec()) {
            Err(LoaderError::Truncated { .. }) => {}
            other => panic!("cut at {cut}: expected Truncated, got {other:?}"),
        }
    }
}

#[test]
fn huge_counts_are_refused_without_allocating() {
    let mut b = Vec::new();
    b.extend_from_slice(b"GGUF");
    b.extend_from_slice(&3u32.to_le_bytes());
    b.extend_from_slice(&0u64.to_le_bytes());
    b.extend_from_slice(&1u64.to_le_bytes());
    b.extend_from_slice(&1u64.to_le_bytes());
    b.push(b'k');
    b.extend_from_slice(&9u32.to_le_bytes()); // array
    b.extend_from_slice(&4u32.to_le_bytes()); // of u32
    b.extend_from_slice(&(1u64 << 60).to_le_bytes());
    assert!(matches!(
        GgufFile::parse(b),
        Err(LoaderError::Truncated { .. })
    ));
}

#[test]
fn unknown_tensor_type_is_named() {
    let mut b = bytes(&small_gguf("llama", "smollm", GgmlType::F32));
    // Patch blk.0.ffn_up.weight's type id to IQ2_XXS (16): name, n_dims, 2 dims, type.
    let name = b"blk.0.ffn_up.weight";
    let pos = b.windows(name.len()).position(|w| w == name).unwrap() + name.len();
    let ty_pos = pos + 4 + 16;
    assert_eq!(
        u32::from_le_bytes(b[ty_pos..ty_pos + 4].try_into().unwrap()),
        0
    );
    b[ty_pos..ty_pos + 4].copy_from_slice(&16u32.to_le_bytes());
    let (_d, path) = write_temp("m.gguf", &b);
    let err = load_model(&path).unwrap_err();
    assert!(
        matches!(&err, LoaderError::UnsupportedTensorType { name: "IQ2_XXS", tensor, .. } if tensor == "blk.0.ffn_up.weight"),
        "{err}"
    );
}

#[test]
fn missing_tensor_and_shape_mismatch() {
    let mut g = GgufWriter::new();
    common::meta(&mut g, "llama", "smollm");
    for (name, shape, data) in common::hf_tensors("llama") {
        match name.as_str() {
            "blk.0.ffn_up.weight" => {}
            _ => {
                g.tensor(&name, shape, GgmlType::F32, data);
            }
        }
    }
    let err = err_of(&g);
    assert!(
        matches!(&err, LoaderError::MissingTensor(n) if n == "blk.0.ffn_up.weight"),
        "{err}"
    );

    let mut g = GgufWriter::new();
    common::meta(&mut g, "llama", "smollm");
    for (name, shape, data) in common::hf_tensors("llama") {
        let shape = if name == "blk.0.attn_v.weight" {
            vec![shape[1], shape[0]]
        } else {
            shape
        };
        g.tensor(&name, shape, GgmlType::F32, data);
    }
    let err = err_of(&g);
    assert!(
        matches!(&err, LoaderError::ShapeMismatch { tensor, .. } if tensor == "blk.0.attn_v.weight"),
        "{err}"
    );
}

#[test]
fn unsupported_architecture_pre_tokenizer_and_missing_key() {
    let g = small_gguf("falcon", "smollm", GgmlType::F32);
    assert!(matches!(err_of(&g), LoaderError::UnsupportedArchitecture(a) if a == "falcon"));
    let g = small_gguf("llama", "deepseek-llm", GgmlType::F32);
    assert!(matches!(err_of(&g), LoaderError::UnsupportedPreTokenizer(p) if p == "deepseek-llm"));
    let mut g = GgufWriter::new();
    g.meta("general.architecture", MetaValue::String("llama".into()));
    assert!(matches!(err_of(&g), LoaderError::MissingMetadata(k) if k == "llama.embedding_length"));
    let mut g = GgufWriter::new();
    g.meta("general.architecture", MetaValue::U32(1));
    assert!(
        matches!(err_of(&g), LoaderError::MetadataType { key, .. } if key == "general.architecture")
    );
}
