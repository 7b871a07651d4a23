//! `cargo bench -p gpu-kernels --features cuda --bench gpu`: times the PTX kernels on a
//! GPU with CUDA events and prints achieved GB/s beside a measured device-to-device copy:
//! decode attention at vLLM's shape (batch 8, context 4096, 64 query / 8 KV heads, head
//! 128), SmolLM2's (batch 256, ragged contexts 256-1024, 9/3 heads, head 64) and
//! Llama-3-8B's (batch 64, context 2048, 32/8 heads, head 128) and a Gemma-3-270M
//! sliding-window layer's (batch 64, context 4096, window 512, 4/1 heads, head 256), each
//! as v1, v2 at vLLM's partition 512, and the run-time planner's choice
//! (`gpu_kernels::launch::plan_decode_window`);
//! prefill attention at 4 x 2048 and 1 x 8192 tokens (32/8 heads, head 64 and 128) in
//! TFLOP/s, the streaming kernel beside the tensor-core one (`prefill_attention_mma`),
//! and a cuBLAS bf16 GEMM (8192^3) measured in the same run as their ceiling; also
//! `rms_norm` and `reshape_and_cache`; the LoRA kernels (BGMV at decode batch 32 with
//! no, 1 and 4 mixed adapters, SGMV over a 4-segment prefill).
//!
//! Every timed kernel is first validated against a CPU reference on a small shape (and
//! the attention figures are spot-checked at the timed shape), so a figure is never of a
//! wrong kernel. The validation problem also runs on the host emulator on every machine,
//! which checks the problem builder and the reference without a GPU.
//!
//! Without the `cuda` feature, or without a CUDA driver or device at run time, it prints
//! `SKIP: ...` with the reason and exits 0. The PTX comes from `cargo xtask build-ptx`
//! (`target/ptx/<arch>/gpu_kernels.ptx`, or the file named by `GK_PTX`). A validation
//! failure or a CUDA error exits 1.

#[path = "gpu/emu_check.rs"]
mod emu_check;
// Parts of the problem builder only the CUDA path uses.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
#[path = "gpu/problem.rs"]
mod problem;

#[cfg(feature = "cuda")]
#[path = "gpu/cuda.rs"]
mod cuda;
#[cfg(feature = "cuda")]
#[path = "gpu/gemm.rs"]
mod gemm;
#[cfg(feature = "cuda")]
#[path = "gpu/gpu_runs.rs"]
mod gpu_runs;
#[cfg(feature = "cuda")]
#[path = "gpu/lora_runs.rs"]
mod lora_runs;

use std::process::ExitCode;

fn main() -> ExitCode {
    // `cargo bench` passes `--bench` (and any filter); this harness takes no options.
    let mut r = problem::BenchRng::new();
    if let Err(e) = emu_check::run(&mut r) {
        eprintln!("FAIL: {e}");
        return ExitCode::FAILURE;
    }
    match gpu(&mut r) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("FAIL: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(feature = "cuda")]
fn gpu(r: &mut problem::BenchRng) -> Result<(), String> {
    cuda::run(r).map_err(|e| e.to_string())
}

#[cfg(not(feature = "cuda"))]
fn gpu(_: &mut problem::BenchRng) -> Result<(), String> {
    println!(
        "SKIP: the GPU benchmark needs `--features cuda` and a CUDA driver \
         (cargo bench -p gpu-kernels --features cuda --bench gpu)"
    );
    Ok(())
}
