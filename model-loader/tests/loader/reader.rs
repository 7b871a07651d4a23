//! `WeightReader` (a layer at a time) against `load_model_with` (all at
//! once), for both `WeightTypes`: on the tiny model (GGUF and HF layouts),
//! on small synthetic files (quantized and permuted, separate head, Qwen2
//! biases, GGUF and HF), and on the three real GGUFs when present (Gemma's
//! norms, Qwen's biases and separate head included; `SKIP <reason>` when a
//! file is missing). Also: out-of-range layers, refusal at `open`,
//! concurrent reads, and `to_f32_rows` on every quant type against
//! `into_f32`.

use std::ops::Range;
use std::path::{Path, PathBuf};

use model_loader::gguf::writer::GgufWriter;
use model_loader::gguf::{GgmlType, GgufFile, MetaValue};
use model_loader::quant::{self, QuantType};
use model_loader::{
    load_model_with, paths, LayerWeights, LoaderError, ModelFormat, QuantTensor, Tensor, Weight,
    WeightReader, WeightTypes,
};

use crate::common::{self, small_gguf, write_temp};

const BOTH: [WeightTypes; 2] = [WeightTypes::File, WeightTypes::F32];

/// A real model file, or `None` after printing why the test skips it.
fn real_model(file: &str, fetch_name: &str) -> Option<PathBuf> {
    let p = paths::models_dir().join(file);
    if p.is_file() {
        Some(p)
    } else {
        println!(
            "SKIP {}: missing (run `cargo xtask fetch-model --model {fetch_name}`)",
            p.display()
        );
        None
    }
}

/// Panics naming `what` when the two differ (no dump of the tensors).
fn same<T: PartialEq>(what: &str, a: &T, b: &T) {
    assert!(a == b, "{what}: the reader differs from load_model_with");
}

fn same_layer(i: usize, a: &LayerWeights<Weight>, b: &LayerWeights<Weight>) {
    let w = |n: &str| format!("layer {i} {n}");
    same(&w("wq"), &a.wq, &b.wq);
    same(&w("wk"), &a.wk, &b.wk);
    same(&w("wv"), &a.wv, &b.wv);
    same(&w("wo"), &a.wo, &b.wo);
    same(&w("w_gate"), &a.w_gate, &b.w_gate);
    same(&w("w_up"), &a.w_up, &b.w_up);
    same(&w("w_down"), &a.w_down, &b.w_down);
    same(&w("attn_norm"), &a.attn_norm, &b.attn_norm);
    same(&w("ffn_norm"), &a.ffn_norm, &b.ffn_norm);
    same(&w("bq"), &a.bq, &b.bq);
    same(&w("bk"), &a.bk, &b.bk);
    same(&w("bv"), &a.bv, &b.bv);
    same(&w("gemma norms"), &a.gemma, &b.gemma);
    // Catches a field forgotten above.
    same(&w("(all)"), a, b);
}

/// What a model must look like beyond equality.
#[derive(Default)]
struct Expect {
    untied: bool,
    biases: bool,
    gemma: bool,
    /// Matrices stay quantized under `WeightTypes::File`.
    quantized: bool,
}

/// Every tensor the reader gives equals `load_model_with`'s, for both
/// types; a layer index past the end is refused.
fn check_reader(path: &Path, expect: Expect) {
    for types in BOTH {
        let m = load_model_with(path, types).expect("load_model_with");
        let r = WeightReader::open(path).expect("open reader");
        same("config", r.config(), &m.config);
        assert_eq!(r.format(), m.format);
        assert_eq!(r.num_layers(), m.weights.layers.len());
        same(
            "token_embd",
            &r.token_embedding(types).unwrap(),
            &m.weights.token_embedding,
        );
        same("lm_head", &r.lm_head(types).unwrap(), &m.weights.lm_head);
        same(
            "final_norm",
            &r.final_norm().unwrap(),
            &m.weights.final_norm,
        );
        assert_eq!(m.weights.lm_head.is_some(), expect.untied, "{types:?} head");
        let n = r.num_layers();
        for (i, l) in m.weights.layers.into_iter().enumerate() {
            let got = r.layer(i, types).unwrap();
            same_layer(i, &got, &l);
            assert_eq!(got.bq.is_some() && got.bv.is_some(), expect.biases);
            assert_eq!(got.gemma.is_some(), expect.gemma);
            let quantized = matches!(got.w_gate, Weight::Quantized(_));
            assert_eq!(
                quantized,
                expect.quantized && types == WeightTypes::File,
                "layer {i} {types:?}"
            );
        }
        for bad in [n, n + 1, usize::MAX] {
            match r.layer(bad, types) {
                Err(LoaderError::LayerOutOfRange { index, num_layers }) => {
                    assert_eq!((index, num_layers), (bad, n));
                }
                other => panic!("layer {bad} of {n}: {:?}", other.map(|_| ())),
            }
        }
    }
}

fn tiny() -> (tempfile::TempDir, model_loader::tiny::TinyModelFiles) {
    assert!(
        paths::default_model_path().is_file(),
        "the tiny model needs the default model: run `cargo xtask fetch-model`"
    );
    let dir = tempfile::tempdir().unwrap();
    let files = model_loader::tiny::write_tiny_model(dir.path()).unwrap();
    (dir, files)
}

#[test]
fn reader_matches_load_on_the_tiny_model() {
    let (_d, files) = tiny();
    check_reader(&files.gguf, Expect::default());
    check_reader(&files.hf_dir, Expect::default());
    let r = WeightReader::open(&files.hf_dir).unwrap();
    assert_eq!(r.format(), ModelFormat::HfDir);
    // GGUF and HF layouts hold the same weights, a layer at a time too.
    let g = WeightReader::open(&files.gguf).unwrap();
    for i in 0..g.num_layers() {
        same_layer(
            i,
            &g.layer(i, WeightTypes::F32).unwrap(),
            &r.layer(i, WeightTypes::F32).unwrap(),
        );
    }
}

#[test]
fn reader_matches_load_on_small_files() {
    // Q8_0, Q/K rows permuted, separate output head.
    let mut g = small_gguf("llama", "smollm", GgmlType::Q8_0);
    let (v, h) = (common::vocab_size(), common::HIDDEN);
    g.tensor(
        "output.weight",
        vec![v, h],
        GgmlType::Q8_0,
        common::values(99, v * h),
    );
    let (_d, path) = write_temp("m.gguf", &g.to_bytes().unwrap());
    let expect = Expect {
        untied: true,
        quantized: true,
        ..Expect::default()
    };
    check_reader(&path, expect);
    // Qwen2: biases, no permutation.
    let g = small_gguf("qwen2", "qwen2", GgmlType::Q8_0);
    let (_d, path) = write_temp("m.gguf", &g.to_bytes().unwrap());
    let expect = Expect {
        biases: true,
        quantized: true,
        ..Expect::default()
    };
    check_reader(&path, expect);
    // An HF Qwen2 directory, sharded, f16/bf16.
    let dir = crate::hf::hf_dir(
        "Qwen2ForCausalLM",
        |n| if n.contains("mlp") { "BF16" } else { "F16" },
        3,
    );
    let expect = Expect {
        biases: true,
        ..Expect::default()
    };
    check_reader(dir.path(), expect);
}

#[test]
fn real_smollm2_reader_matches_load() {
    let Some(p) = real_model(paths::DEFAULT_MODEL_FILE, "smollm2-135m") else {
        return;
    };
    let expect = Expect {
        quantized: true,
        ..Expect::default()
    };
    check_reader(&p, expect);
}

#[test]
fn real_qwen_reader_matches_load() {
    let Some(p) = real_model(paths::QWEN25_CODER_FILE, "qwen2.5-coder-0.5b") else {
        return;
    };
    let expect = Expect {
        untied: true,
        biases: true,
        quantized: true,
        ..Expect::default()
    };
    check_reader(&p, expect);
}

#[test]
fn real_gemma_reader_matches_load() {
    let Some(p) = real_model(paths::GEMMA3_270M_FILE, "gemma-3-270m") else {
        return;
    };
    let expect = Expect {
        gemma: true,
        quantized: true,
        ..Expect::default()
    };
    check_reader(&p, expect);
}

#[test]
fn open_refuses_a_malformed_model_before_reading() {
    // A tensor of the last layer missing: refused at open, not mid-stream.
    let mut g = GgufWriter::new();
    common::meta(&mut g, "llama", "smollm");
    for (name, shape, data) in common::hf_tensors("llama") {
        if name != "blk.0.ffn_down.weight" {
            g.tensor(&name, shape, GgmlType::F32, data);
        }
    }
    let (_d, path) = write_temp("m.gguf", &g.to_bytes().unwrap());
    let err = WeightReader::open(&path).unwrap_err();
    assert!(
        matches!(&err, LoaderError::MissingTensor(n) if n == "blk.0.ffn_down.weight"),
        "{err}"
    );
    // A layer count far past the tensors: the first missing one is named,
    // nothing is allocated for the count.
    let mut g = small_gguf("llama", "smollm", GgmlType::F32);
    g.meta("llama.block_count", MetaValue::U64(1 << 40));
    let (_d, path) = write_temp("m.gguf", &g.to_bytes().unwrap());
    for err in [
        WeightReader::open(&path).unwrap_err(),
        load_model_with(&path, WeightTypes::File).unwrap_err(),
    ] {
        assert!(
            matches!(&err, LoaderError::MissingTensor(n) if n == "blk.1.attn_norm.weight"),
            "{err}"
        );
    }
    // An HF directory whose config is untied but has no lm_head.weight.
    let dir = crate::hf::hf_dir("LlamaForCausalLM", |_| "F32", 1);
    let cfg = dir.path().join("config.json");
    let text = std::fs::read_to_string(&cfg).unwrap();
    let untied = text.replace(
        "\"tie_word_embeddings\":true",
        "\"tie_word_embeddings\":false",
    );
    assert_ne!(text, untied);
    std::fs::write(&cfg, untied).unwrap();
    let err = WeightReader::open(dir.path()).unwrap_err();
    assert!(
        matches!(&err, LoaderError::MissingTensor(n) if n == "lm_head.weight"),
        "{err}"
    );
    // Neither a file nor a model directory.
    let empty = tempfile::tempdir().unwrap();
    assert!(matches!(
        WeightReader::open(empty.path()),
        Err(LoaderError::UnknownFormat { .. })
    ));
}

#[test]
fn layers_read_concurrently_equal_layers_read_in_turn() {
    let (_d, files) = tiny();
    let r = WeightReader::open(&files.gguf).unwrap();
    let n = r.num_layers();
    let in_turn: Vec<_> = (0..n)
        .map(|i| r.layer(i, WeightTypes::File).unwrap())
        .collect();
    let r = &r;
    let concurrent: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|i| s.spawn(move || r.layer(i, WeightTypes::File).unwrap()))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (i, (a, b)) in in_turn.iter().zip(&concurrent).enumerate() {
        same_layer(i, a, b);
    }
}

/// `w.to_f32_rows` in chunks of `chunk` rows (plus an empty range) equals
/// `into_f32`, bit for bit.
fn check_rows(what: &str, w: &Weight, chunk: usize) {
    let full = w.clone().into_f32();
    let (rows, cols) = (w.rows(), w.cols());
    assert_eq!(full.data.len(), rows * cols, "{what}");
    let mut buf = vec![f32::NAN; chunk * cols];
    let mut start = 0;
    while start < rows {
        let end = (start + chunk).min(rows);
        let out = &mut buf[..(end - start) * cols];
        w.to_f32_rows(start..end, out).unwrap();
        let want = &full.data[start * cols..end * cols];
        let same_bits = out
            .iter()
            .zip(want)
            .all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(
            same_bits,
            "{what}: rows {start}..{end} differ from into_f32"
        );
        start = end;
    }
    w.to_f32_rows(rows..rows, &mut []).unwrap();
}

fn row_range_err(w: &Weight, rows: Range<usize>, out_len: usize) {
    let mut out = vec![0f32; out_len];
    match w.to_f32_rows(rows.clone(), &mut out) {
        Err(LoaderError::RowRange { start, end, .. }) => {
            assert_eq!((start, end), (rows.start, rows.end));
        }
        other => panic!("{rows:?} into {out_len}: {other:?}"),
    }
}

#[test]
fn to_f32_rows_equals_into_f32_on_every_quant_type() {
    let (rows, cols) = (13, 512);
    let values = common::values(7, rows * cols);
    for ty in QuantType::ALL {
        let bytes = quant::quantize(ty, &values).unwrap();
        let q = QuantTensor::new(ty, vec![rows, cols], bytes, "t").unwrap();
        let w = Weight::Quantized(q);
        for chunk in [1, 5, rows, rows + 3] {
            check_rows(ty.name(), &w, chunk);
        }
        row_range_err(&w, 12..14, 2 * cols);
        #[allow(clippy::reversed_empty_ranges)]
        row_range_err(&w, 5..3, 0);
        row_range_err(&w, 0..2, 2 * cols - 1);
        row_range_err(&w, 0..2, 2 * cols + 1);
    }
    let w = Weight::F32(Tensor::new(vec![rows, cols], values));
    check_rows("F32", &w, 4);
    row_range_err(&w, 0..14, 14 * cols);
}

#[test]
fn to_f32_rows_on_every_quant_type_of_the_real_files() {
    let files = [
        (paths::DEFAULT_MODEL_FILE, "smollm2-135m"),
        (paths::QWEN25_CODER_FILE, "qwen2.5-coder-0.5b"),
        (paths::GEMMA3_270M_FILE, "gemma-3-270m"),
    ];
    for (file, fetch) in files {
        let Some(p) = real_model(file, fetch) else {
            continue;
        };
        let g = GgufFile::open(&p).unwrap();
        // The smallest matrix of each quantized type in the file.
        let mut by_type: Vec<(QuantType, &model_loader::gguf::TensorInfo)> = Vec::new();
        for t in g.tensors.iter().filter(|t| t.dims.len() == 2) {
            let Some(ty) = QuantType::from_ggml(t.ty) else {
                continue;
            };
            match by_type.iter_mut().find(|(q, _)| *q == ty) {
                Some(e) if e.1.n_elements() > t.n_elements() => e.1 = t,
                Some(_) => {}
                None => by_type.push((ty, t)),
            }
        }
        assert!(!by_type.is_empty(), "{file}: no quantized matrix");
        for (ty, t) in &by_type {
            let bytes = g.tensor_bytes(t).unwrap().to_vec();
            let q = QuantTensor::new(*ty, t.shape(), bytes, &t.name).unwrap();
            check_rows(
                &format!("{file} {} ({})", t.name, ty.name()),
                &Weight::Quantized(q),
                97,
            );
        }
        let names: Vec<&str> = by_type.iter().map(|(q, _)| q.name()).collect();
        println!("{file}: to_f32_rows checked on {names:?}");
    }
    // The case it is for: Qwen's 151936 x 896 embedding in bounded chunks.
    if let Some(p) = real_model(paths::QWEN25_CODER_FILE, "qwen2.5-coder-0.5b") {
        let r = WeightReader::open(&p).unwrap();
        let emb = r.token_embedding(WeightTypes::File).unwrap();
        assert!(matches!(emb, Weight::Quantized(_)));
        assert_eq!(emb.shape(), [151_936, 896]);
        check_rows("qwen token_embd", &emb, 4096);
    }
}
