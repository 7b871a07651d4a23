//! Our CPU forward pass against HF transformers on the default model:
//! greedy ids equal exactly, top-5 logprobs within 1e-3 where ids agree.

use engine::executor::cpu::CpuExecutor;
use engine::model::CpuModel;
use integration_tests::{compare_with_golden, default_model_path, greedy_batch, load_golden};

#[test]
fn smollm2_matches_transformers() {
    let golden = load_golden("smollm2_golden.json");
    let loaded = model_loader::load_model(&default_model_path()).expect("load SmolLM2");
    let model = CpuModel::new(loaded.config, loaded.weights).expect("build model");
    let prompts: Vec<Vec<u32>> = golden.cases.iter().map(|c| c.prompt_ids.clone()).collect();
    let mut exec = CpuExecutor::new(model, 64, 0, 16).expect("executor");
    let ours = greedy_batch(&mut exec, &prompts, golden.new_tokens);
    let mut failures = vec![];
    for (case, got) in golden.cases.iter().zip(&ours) {
        match compare_with_golden(case, got, 1e-3) {
            Ok(worst) => println!("{:?}: ok, worst logprob diff {worst:.2e}", case.text),
            Err(e) => failures.push(e),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
