//! The quantized CPU path (weights kept in the GGUF's Q4_1/Q8_0) against the
//! float32 path (the reference, itself checked against HF transformers by
//! `golden_smollm2.rs`) on the golden prompts: greedy ids over 32 tokens
//! must be equal on at least 7 of 8 prompts, and where they differ the
//! first difference must come at a near tie of the float32 path (its
//! logprob of its own pick minus that of the quantized pick < 0.1 nats).
//!
//! With llama.cpp's single 8-bit activation level (`ActPrecision::One8`) only
//! 4 of 8 were equal (differences at 0.05, 0.08, 0.10 and 0.14 nats): the
//! rounding error is spread over every layer (making any one layer kind
//! f32 did not fix it). The default two-level activations pass 8 of 8.

use engine::executor::cpu::CpuExecutor;
use engine::model::CpuModel;
use integration_tests::{default_model_path, greedy_batch, load_golden, Decoded};
use model_loader::WeightTypes;

const NEAR_TIE: f64 = 0.1;

fn decode(types: WeightTypes, prompts: &[Vec<u32>], n: usize) -> (Vec<Decoded>, bool) {
    let loaded = model_loader::load_model_with(&default_model_path(), types).expect("load SmolLM2");
    let model = CpuModel::new(loaded.config, loaded.weights).expect("build model");
    let quantized = model.is_quantized();
    let mut exec = CpuExecutor::new(model, 64, 0, 16).expect("executor");
    (greedy_batch(&mut exec, prompts, n), quantized)
}

#[test]
fn quantized_greedy_ids_match_float32_up_to_near_ties() {
    let golden = load_golden("smollm2_golden.json");
    let prompts: Vec<Vec<u32>> = golden.cases.iter().map(|c| c.prompt_ids.clone()).collect();
    let (reference, ref_q) = decode(WeightTypes::F32, &prompts, golden.new_tokens);
    let (quant, q_q) = decode(WeightTypes::File, &prompts, golden.new_tokens);
    assert!(!ref_q && q_q, "the two paths must differ in weight types");
    let mut equal = 0;
    let mut failures = vec![];
    for ((case, r), q) in golden.cases.iter().zip(&reference).zip(&quant) {
        match r.ids.iter().zip(&q.ids).position(|(a, b)| a != b) {
            None => equal += 1,
            Some(step) => {
                let lp = &r.logprobs[step];
                let margin = lp[r.ids[step] as usize] - lp[q.ids[step] as usize];
                println!(
                    "{:?}: differs at step {step} (float32 {} vs quantized {}), margin {margin:.4} nats",
                    case.text, r.ids[step], q.ids[step]
                );
                if margin >= NEAR_TIE {
                    failures.push(format!(
                        "{:?}: step {step}: margin {margin:.4} nats is not a near tie",
                        case.text
                    ));
                }
            }
        }
    }
    println!(
        "{equal} of {} prompts equal over {} tokens",
        prompts.len(),
        golden.new_tokens
    );
    assert!(
        equal >= 7,
        "only {equal} of {} prompts equal",
        prompts.len()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
