//! The tiny random-weight model against HF transformers (fixture made from
//! its GGUF file), loaded from both layouts the generator writes: the GGUF
//! file (Q/K rows permuted as llama.cpp does) and the HF directory.

use engine::executor::cpu::CpuExecutor;
use engine::model::CpuModel;
use integration_tests::{compare_with_golden, default_model_path, greedy_batch, load_golden};
use std::path::Path;

fn check_layout(path: &Path) {
    let golden = load_golden("tiny_golden.json");
    let loaded = model_loader::load_model(path).expect("load tiny model");
    for case in &golden.cases {
        let ids = loaded
            .tokenizer
            .encode(&case.rendered, false)
            .expect("encode");
        assert_eq!(ids, case.prompt_ids, "tokenizer of {}", path.display());
    }
    let model = CpuModel::new(loaded.config, loaded.weights).expect("build model");
    let prompts: Vec<Vec<u32>> = golden.cases.iter().map(|c| c.prompt_ids.clone()).collect();
    let mut exec = CpuExecutor::new(model, 64, 0, 16).expect("executor");
    let ours = greedy_batch(&mut exec, &prompts, golden.new_tokens);
    let failures: Vec<String> = golden
        .cases
        .iter()
        .zip(&ours)
        .filter_map(|(case, got)| compare_with_golden(case, got, 1e-3).err())
        .collect();
    assert!(
        failures.is_empty(),
        "{}: {}",
        path.display(),
        failures.join("\n")
    );
}

#[test]
fn tiny_model_matches_transformers_from_both_layouts() {
    let dir = tempfile::tempdir().expect("tempdir");
    let files = model_loader::tiny::write_tiny_model_from(&default_model_path(), dir.path())
        .expect("generate");
    check_layout(&files.gguf);
    check_layout(&files.hf_dir);
}
