//! Cost of grammar masks per decode step, on SmolLM2-135M (real vocabulary
//! of 49152 tokens, real weights) and the CPU executor, with 64 and 256
//! concurrent JSON-schema sequences.
//!
//! For each batch size, all prompts are prefilled, then `STEPS` decode
//! steps are timed. Reported per decode step: the forward pass, the time
//! the mask thread spent computing masks (concurrently with the forward
//! pass), the time the step waited for masks after its forward pass, and
//! the share of mask time hidden behind the forward pass
//! (1 - wait / compute). Then the same masks computed alone, without a
//! forward pass competing for the cores (the uncontended cost).
//!
//! `cargo bench -p engine --bench grammar_mask` (prints SKIP without the
//! fetched model: `cargo xtask fetch-model`).

use engine::engine_loop::StepTimings;
use engine::executor::CpuExecutor;
use engine::grammar::state::{GrammarStates, MaskWork};
use engine::grammar::{GrammarCompiler, GrammarSpec};
use engine::kv::{PagedKvCacheManager, PagedKvConfig};
use engine::model::CpuModel;
use engine::sampler::SamplingParams;
use engine::scheduler::{RequestId, RequestParams, SchedulerConfig};
use engine::{EngineConfig, LlmEngine};
use std::sync::Arc;
use std::time::{Duration, Instant};

const STEPS: usize = 6;
const SCHEMA: &str = r#"{"type":"object","properties":{
    "name":{"type":"string","maxLength":24},
    "age":{"type":"integer","minimum":0,"maximum":120},
    "tags":{"type":"array","items":{"enum":["a","b","c"]},"maxItems":4},
    "address":{"type":"object","properties":{"city":{"type":"string"},"zip":{"type":"string","pattern":"^[0-9]{5}$"}},
               "required":["city","zip"],"additionalProperties":false}},
  "required":["name","age","tags","address"],"additionalProperties":false}"#;

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn diff(a: StepTimings, b: StepTimings) -> StepTimings {
    StepTimings {
        schedule: b.schedule - a.schedule,
        execute: b.execute - a.execute,
        postprocess: b.postprocess - a.postprocess,
        steps: b.steps - a.steps,
        mask_compute: b.mask_compute - a.mask_compute,
        mask_wait: b.mask_wait - a.mask_wait,
        mask_steps: b.mask_steps - a.mask_steps,
    }
}

fn main() {
    let path = model_loader::paths::default_model_path();
    let m = match model_loader::load_model(&path) {
        Ok(m) => m,
        Err(e) => {
            println!(
                "SKIP grammar_mask: cannot load {} ({e}); run `cargo xtask fetch-model`",
                path.display()
            );
            return;
        }
    };
    let tokenizer = Arc::new(m.tokenizer);
    let eos = tokenizer.eos_token_ids().first().copied().unwrap_or(2);
    let t = Instant::now();
    let compiler = GrammarCompiler::new(tokenizer.clone(), eos).expect("compiler");
    println!("token trie + factory: {:.1} ms", ms(t.elapsed()));
    let t = Instant::now();
    let grammar = compiler
        .compile(&GrammarSpec::JsonSchema(SCHEMA.into()))
        .expect("schema compiles");
    println!("schema compile: {:.1} ms", ms(t.elapsed()));
    let prompt = tokenizer
        .encode(
            "<|im_start|>user\nDescribe a person as JSON.<|im_end|>\n<|im_start|>assistant\n",
            false,
        )
        .expect("prompt");
    for n in [64usize, 256] {
        let block = 16;
        let blocks = n * (prompt.len() + 64).div_ceil(block) + 64;
        let model = CpuModel::new(m.config.clone(), m.weights.clone()).expect("model");
        let exec = CpuExecutor::new(model, blocks, 0, block).expect("executor");
        let kv = PagedKvCacheManager::new(PagedKvConfig::new(block, blocks, 0)).expect("kv");
        let cfg = EngineConfig {
            scheduler: SchedulerConfig {
                max_num_seqs: n,
                max_num_batched_tokens: n * prompt.len() + n,
                max_model_len: 2048,
                enable_chunked_prefill: true,
                preemption_mode: Default::default(),
                async_scheduling: false,
                speculative: None,
            },
            eos_token_ids: vec![eos],
        };
        let mut eng = LlmEngine::new(cfg, Box::new(kv), Box::new(exec)).expect("engine");
        for i in 0..n {
            let params = RequestParams {
                max_tokens: Some(64),
                sampling: SamplingParams {
                    temperature: 1.0,
                    seed: Some(i as u64),
                    structured: Some(grammar.clone()),
                    ..SamplingParams::default()
                },
                ..RequestParams::default()
            };
            eng.add_request(RequestId(i as u64), prompt.clone(), params)
                .expect("accepted");
        }
        // Prefill (and the first token) in one step.
        eng.step();
        let before = eng.timings();
        let mut finished = 0;
        for _ in 0..STEPS {
            finished += eng.step().iter().filter(|o| o.finished).count();
        }
        let d = diff(before, eng.timings());
        let steps = d.steps.max(1) as f64;
        let (fwd, comp, wait) = (
            ms(d.execute) / steps,
            ms(d.mask_compute) / steps,
            ms(d.mask_wait) / steps,
        );
        println!(
            "{n} JSON-schema sequences: per decode step forward+masks {fwd:.1} ms, mask compute \
             {comp:.1} ms ({:.2} ms/sequence), waited {wait:.2} ms after the forward pass: \
             {:.0}% of mask time hidden ({finished} finished early)",
            comp / n as f64,
            100.0 * (1.0 - wait / comp.max(1e-9))
        );
        // The same kind of masks alone: each step every matcher consumes
        // one more token of a valid answer and computes a fresh mask.
        let mut states = GrammarStates::default();
        let outputs: Vec<Vec<u32>> = (0..n)
            .map(|i| {
                let text = format!(
                    "{{\"name\": \"Person number {i}\", \"age\": {}, \"tags\": [\"a\", \"c\"], \"address\": {{\"city\": \"Paris\", \"zip\": \"75001\"}}}}",
                    i % 100
                );
                tokenizer.encode(&text, false).expect("encode")
            })
            .collect();
        let shortest = outputs.iter().map(Vec::len).min().unwrap_or(0);
        let reps = shortest.min(12);
        let mut alone = Duration::ZERO;
        for k in 0..reps {
            let work: Vec<MaskWork<'_>> = outputs
                .iter()
                .enumerate()
                .map(|(i, o)| MaskWork {
                    row: i,
                    request_id: RequestId(i as u64),
                    seq_index: 0,
                    grammar: &grammar,
                    output: &o[..k],
                })
                .collect();
            let t = Instant::now();
            states.compute_masks(&work);
            if k > 0 {
                alone += t.elapsed();
            }
        }
        let alone = ms(alone) / (reps.max(2) - 1) as f64;
        println!(
            "{n} sequences, masks alone (no forward pass running): {alone:.1} ms per step \
             ({:.3} ms/sequence, {} rayon threads)",
            alone / n as f64,
            rayon::current_num_threads()
        );
    }
}
