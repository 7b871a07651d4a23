//! Smoke test on the real default model: SmolLM2-135M-Instruct answers the
//! ChatML question "What is the capital of France?" with "Paris".
//! Skipped (with a printed reason) when the GGUF file is not fetched.

use super::generate::generate_greedy;
use super::CpuExecutor;
use crate::model::CpuModel;
use model_loader::ChatMessage;

#[test]
fn smollm2_greedy_answers_paris() {
    let path = model_loader::paths::default_model_path();
    if !path.is_file() {
        eprintln!(
            "skipped: {} missing (run `cargo xtask fetch-model`)",
            path.display()
        );
        return;
    }
    let loaded = model_loader::load_model(&path).expect("load the default model");
    let template = loaded.chat_template.expect("SmolLM2 ships a chat template");
    let text = template
        .render(
            &[ChatMessage::new("user", "What is the capital of France?")],
            true,
        )
        .expect("render");
    let prompt = loaded.tokenizer.encode(&text, false).expect("encode");
    let eos = loaded.tokenizer.eos_token_ids().to_vec();
    let model = CpuModel::new(loaded.config, loaded.weights).expect("model");
    let mut ex = CpuExecutor::new(model, 16, 0, 16).expect("executor");
    let out = generate_greedy(&mut ex, &prompt, 24, &eos, |_| {}).expect("generate");
    let answer = loaded.tokenizer.decode(&out, true).expect("decode");
    assert!(answer.contains("Paris"), "answer: {answer:?}");
}
