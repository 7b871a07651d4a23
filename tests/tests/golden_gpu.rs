//! The GPU executor on SmolLM2 against the CPU executor (whose greedy ids
//! equal HF transformers', see `golden_smollm2`).
//!
//! - Emulated device (the kernels' own source, the launches a GPU gets), on
//!   SmolLM2's first two layers: float32 must agree with the CPU to 1e-3 in
//!   logprobs with equal ids; bfloat16 within bf16 tolerance, ids differing
//!   only at near ties.
//! - CUDA, when this package is built with `--features cuda` and a driver
//!   answers (else a printed SKIP): the whole model, every golden prompt, 32
//!   tokens, in bfloat16; the test prints per prompt the step where the ids
//!   first differ from the CPU's.
//!
//! `PAGED_ENGINE_MODEL` overrides the model of the CUDA test (a GGUF file or
//! an HF directory), for GPU machines that hold SmolLM2 in another form.

use engine::executor::gpu::{DType, Device, EmuDevice, GpuExecutor, GpuOptions, KvSizing};
use engine::executor::CpuExecutor;
use engine::model::CpuModel;
use integration_tests::{default_model_path, greedy_batch, load_golden, Decoded};
use model_loader::{ModelConfig, ModelWeights};

/// bf16 has 8 significant bits: logprobs after 30 layers drift by a few tenths
/// of a nat at most where the prediction is confident.
const BF16_LOGPROB_TOL: f64 = 0.5;
/// A divergence is acceptable only where the reference's top two logprobs
/// are closer than this (a near tie that bf16 rounding can flip).
const NEAR_TIE: f64 = 0.5;

#[cfg(feature = "cuda")]
fn model() -> Weights {
    let path = std::env::var_os("PAGED_ENGINE_MODEL")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(default_model_path);
    load(&path)
}

#[cfg(feature = "cuda")]
fn load(path: &std::path::Path) -> Weights {
    let loaded = model_loader::load_model(path).expect("load SmolLM2");
    (loaded.config, loaded.weights)
}

/// A model's config and f32 weights (each executor builds its own copy).
type Weights = (ModelConfig, ModelWeights);

/// The CPU model of `w`.
fn cpu_model(w: &Weights) -> CpuModel {
    CpuModel::new(w.0.clone(), w.1.clone()).expect("build model")
}

fn opts(dtype: DType) -> GpuOptions {
    GpuOptions {
        dtype,
        block_size: 16,
        kv: KvSizing::Blocks { gpu: 64, cpu: 0 },
    }
}

/// `prompts` greedily on the CPU executor (float32), `new_tokens` each: the
/// reference of the GPU executor's checks.
fn cpu_reference(model: CpuModel, prompts: &[Vec<u32>], new_tokens: usize) -> Vec<Decoded> {
    let mut exec = CpuExecutor::new(model, 64, 0, 16).expect("cpu executor");
    greedy_batch(&mut exec, prompts, new_tokens)
}

/// The five best ids of a log-softmax row, best first.
fn top5(row: &[f64]) -> Vec<(u32, f64)> {
    let mut idx: Vec<usize> = (0..row.len()).collect();
    idx.sort_by(|&a, &b| row[b].total_cmp(&row[a]));
    idx.into_iter()
        .take(5)
        .map(|i| (i as u32, row[i]))
        .collect()
}

/// Runs `prompts` on `dev` and checks them against the CPU `reference`:
/// every step before the first differing id has its top-5 logprobs within
/// `tol`, and a differing id only comes where the CPU's top two are within
/// `NEAR_TIE`. Returns one report line per prompt.
fn check_against_cpu<D: Device>(
    reference: &[Decoded],
    prompts: &[Vec<u32>],
    model: &Weights,
    dev: D,
    dtype: DType,
    tol: f64,
) -> Vec<String> {
    let new_tokens = reference.first().map_or(0, |r| r.ids.len());
    let (config, weights) = model.clone();
    let mut exec = GpuExecutor::new(dev, config, weights, opts(dtype)).expect("gpu executor");
    let ours = greedy_batch(&mut exec, prompts, new_tokens);
    let mut report = vec![];
    for (i, (want, got)) in reference.iter().zip(&ours).enumerate() {
        let diverge = want.ids.iter().zip(&got.ids).position(|(a, b)| a != b);
        let mut worst: f64 = 0.0;
        for step in 0..diverge.unwrap_or(new_tokens) {
            for (id, lp) in top5(&want.logprobs[step]) {
                worst = worst.max((got.logprobs[step][id as usize] - lp).abs());
            }
        }
        assert!(
            worst <= tol,
            "prompt {i}: top-5 logprobs off by {worst} (tolerance {tol})"
        );
        match diverge {
            Some(step) => {
                let top = top5(&want.logprobs[step]);
                let margin = top[0].1 - top[1].1;
                assert!(
                    margin < NEAR_TIE,
                    "prompt {i}: diverged at step {step} where the CPU was sure (margin {margin:.3})"
                );
                report.push(format!(
                    "prompt {i}: equal for {step} of {new_tokens} tokens, then a near tie (margin {margin:.3}); worst logprob diff before {worst:.2e}"
                ));
            }
            None => report.push(format!(
                "prompt {i}: all {new_tokens} ids equal; worst top-5 logprob diff {worst:.2e}"
            )),
        }
    }
    report
}

/// SmolLM2's real weights and dimensions (head 64, GQA 9:3, hidden 576,
/// vocab 49152) cut to its first two layers: the emulator runs one OS thread
/// per GPU thread, so the full 30 layers would take tens of minutes here.
fn smollm2_two_layers() -> Weights {
    let mut loaded = model_loader::load_model(&default_model_path()).expect("load SmolLM2");
    loaded.config.num_hidden_layers = 2;
    loaded.weights.layers.truncate(2);
    (loaded.config, loaded.weights)
}

/// A fetched K-quant model's first `layers` layers in f32, or `None` (with
/// a printed SKIP) when the file is absent.
fn k_quant_layers(file: &str, name: &str, layers: usize) -> Option<Weights> {
    let path = model_loader::paths::models_dir().join(file);
    if !path.is_file() {
        say(&format!(
            "SKIP {name} on the emulated GPU: {} is missing (cargo xtask fetch-model --model {name})",
            path.display()
        ));
        return None;
    }
    let mut loaded = model_loader::load_model(&path).expect("load");
    loaded.config.num_hidden_layers = layers;
    loaded.weights.layers.truncate(layers);
    Some((loaded.config, loaded.weights))
}

/// Runs `prompts` for `new_tokens` on the CPU and the emulated GPU in f32
/// and asserts every greedy id equal (and the top-5 logprobs within 1e-3).
fn f32_ids_equal(name: &str, model: &Weights, prompts: &[Vec<u32>], new_tokens: usize) {
    let reference = cpu_reference(cpu_model(model), prompts, new_tokens);
    let lines = check_against_cpu(
        &reference,
        prompts,
        model,
        EmuDevice::new(),
        DType::F32,
        1e-3,
    );
    for line in &lines {
        println!("emulated f32 {name} {line}");
    }
    assert!(
        lines.iter().all(|l| l.contains("ids equal")),
        "{name}: the emulated GPU's greedy ids differ from the CPU's: {lines:?}"
    );
}

/// Qwen2.5-Coder-0.5B's real weights (q/k/v biases, untied head, vocab
/// 151,936, head 64, GQA 14:2) cut to two layers, on its golden prompts.
#[test]
fn qwen_layers_on_the_emulated_gpu_match_the_cpu() {
    let Some(model) = k_quant_layers(
        "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        "qwen2.5-coder-0.5b",
        2,
    ) else {
        return;
    };
    f32_ids_equal(
        "qwen2.5",
        &model,
        &short_prompts_of("qwen2.5_coder_golden.json"),
        4,
    );
}

/// Gemma-3-270M's real weights (scaled embedding, q/k norms, post-norms,
/// GELU-tanh, head 256, one KV head, vocab 262,144) cut to its first six
/// layers: five sliding-window local layers and the first global one. The
/// window is shrunk to 5 tokens so that it binds on these short prompts
/// (both executors run the same config: the GPU kernels' window against
/// the CPU's masking).
#[test]
fn gemma_layers_with_a_binding_window_on_the_emulated_gpu_match_the_cpu() {
    let Some((mut config, weights)) = k_quant_layers("gemma-3-270m-q4_k_m.gguf", "gemma-3-270m", 6)
    else {
        return;
    };
    let model_loader::Architecture::Gemma3(mut g) = config.architecture else {
        panic!("not gemma3: {:?}", config.architecture);
    };
    assert!(
        g.is_local(0) && !g.is_local(5),
        "layers 0-4 local, 5 global"
    );
    g.sliding_window = 5;
    config.architecture = model_loader::Architecture::Gemma3(g);
    let model = (config, weights);
    f32_ids_equal("gemma3", &model, &short_prompts_of("gemma3_golden.json"), 4);
}

/// Short golden prompts (chat and raw) for the emulated runs.
fn short_prompts() -> Vec<Vec<u32>> {
    short_prompts_of("smollm2_golden.json")
}

/// Every third golden prompt of `fixture`, cut to its last 12 tokens.
fn short_prompts_of(fixture: &str) -> Vec<Vec<u32>> {
    let golden = load_golden(fixture);
    golden
        .cases
        .iter()
        .step_by(3)
        .map(|c| c.prompt_ids.iter().rev().take(12).rev().copied().collect())
        .collect()
}

#[test]
fn smollm2_layers_in_f32_on_the_emulated_gpu_match_the_cpu() {
    let prompts = short_prompts();
    let model = smollm2_two_layers();
    let reference = cpu_reference(cpu_model(&model), &prompts, 4);
    for line in check_against_cpu(
        &reference,
        &prompts,
        &model,
        EmuDevice::new(),
        DType::F32,
        1e-3,
    ) {
        println!("emulated f32 {line}");
    }
}

#[test]
fn smollm2_layers_in_bf16_on_the_emulated_gpu_stay_within_bf16_tolerance() {
    let prompts = short_prompts();
    let model = smollm2_two_layers();
    let reference = cpu_reference(cpu_model(&model), &prompts, 4);
    let dev = EmuDevice::new();
    for line in check_against_cpu(
        &reference,
        &prompts,
        &model,
        dev,
        DType::Bf16,
        BF16_LOGPROB_TOL,
    ) {
        println!("emulated bf16 {line}");
    }
}

/// The whole model, every golden prompt, 32 tokens: CUDA bf16 against the CPU
/// executor, and the CPU's ids are the transformers goldens (checked by
/// `golden_smollm2`) when the default GGUF is used.
#[cfg(feature = "cuda")]
#[test]
fn smollm2_bf16_on_cuda_diverges_from_the_cpu_only_at_near_ties() {
    use engine::executor::gpu::cuda::CudaDevice;
    let dev = match CudaDevice::new(0) {
        Ok(d) => d,
        Err(e) => {
            say(&format!("SKIP cuda golden: {e}"));
            return;
        }
    };
    let golden = load_golden("smollm2_golden.json");
    let prompts: Vec<Vec<u32>> = golden.cases.iter().map(|c| c.prompt_ids.clone()).collect();
    let weights = model();
    let reference = cpu_reference(cpu_model(&weights), &prompts, golden.new_tokens);
    for line in check_against_cpu(
        &reference,
        &prompts,
        &weights,
        dev,
        DType::Bf16,
        BF16_LOGPROB_TOL,
    ) {
        println!("cuda bf16 {line}");
    }
}

#[cfg(not(feature = "cuda"))]
#[test]
fn smollm2_on_cuda_needs_the_cuda_feature() {
    say("SKIP cuda golden: built without the `cuda` feature \
         (cargo test -p integration-tests --features cuda --test golden_gpu)");
}

/// Writes straight to stderr: libtest captures `println!`, so a skip would be silent.
fn say(msg: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "{msg}");
}
