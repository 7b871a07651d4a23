//! The tensor-core ceiling of the prefill figures: a cuBLAS bf16 GEMM (`cublasGemmEx`,
//! bf16 in and out, `f32` compute) at M = N = K = 8192, timed with the same CUDA events
//! in the same run. Validated first on a 64 x 64 x 64 product against an f64 reference.
//!
//! cuBLAS is opened by cudarc's dynamic loader under its usual names
//! (`libcublas.so.13` / `.so`); where none is found (the wheels keep it in
//! `site-packages/nvidia/cu13/lib`: put that on `LD_LIBRARY_PATH`) the figure is
//! skipped with a `SKIP` line, the rest of the benchmark still runs.

use crate::cuda::{Gpu, GpuError};
use crate::problem::{check_close, BenchRng};
use cudarc::cublas::{self, CudaBlas};
use cudarc::driver::{CudaSlice, DevicePtr};
use half::bf16;

/// Edge of the timed square GEMM.
const N: usize = 8192;

fn blas_err(e: cublas::result::CublasError) -> GpuError {
    GpuError::Ptx(format!("cuBLAS: {e:?}"))
}

/// Row-major `C[m, n] = A[m, k] B[k, n]` in bf16 with `f32` accumulation: column-major
/// `C^T = B^T A^T`, so cuBLAS gets B first, both untransposed.
fn gemm(
    gpu: &Gpu,
    blas: &CudaBlas,
    (m, n, k): (usize, usize, usize),
    a: &CudaSlice<bf16>,
    b: &CudaSlice<bf16>,
    c: &mut CudaSlice<bf16>,
) -> Result<(), GpuError> {
    let bf = cublas::sys::cudaDataType::CUDA_R_16BF;
    let (alpha, beta) = (1.0f32, 0.0f32);
    let (ap, _ra) = a.device_ptr(&gpu.stream);
    let (bp, _rb) = b.device_ptr(&gpu.stream);
    let (cp, _rc) = c.device_ptr(&gpu.stream);
    // SAFETY: A, B, C hold m*k, k*n and m*n elements on the handle's stream; the
    // scalars live across the (host-pointer-mode) call.
    unsafe {
        cublas::result::gemm_ex(
            *blas.handle(),
            cublas::sys::cublasOperation_t::CUBLAS_OP_N,
            cublas::sys::cublasOperation_t::CUBLAS_OP_N,
            n as i32,
            m as i32,
            k as i32,
            (&alpha as *const f32).cast(),
            bp as *const _,
            bf,
            n as i32,
            ap as *const _,
            bf,
            k as i32,
            (&beta as *const f32).cast(),
            cp as *mut _,
            bf,
            n as i32,
            cublas::sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            cublas::sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
        )
    }
    .map_err(blas_err)
}

/// Validates the GEMM at 64^3, then prints the TFLOP/s (`2 N^3` FLOPs) of the timed one.
pub fn bench(gpu: &Gpu, r: &mut BenchRng) -> Result<(), GpuError> {
    // SAFETY: only dlopens cuBLAS's candidate names.
    if !unsafe { cublas::sys::is_culib_present() } {
        println!(
            "SKIP cuBLAS bf16 GEMM: none of {:?} found by the dynamic linker \
             (LD_LIBRARY_PATH=<site-packages>/nvidia/cu13/lib)",
            cudarc::get_lib_name_candidates("cublas")
        );
        return Ok(());
    }
    let blas = CudaBlas::new(gpu.stream.clone()).map_err(blas_err)?;
    let s = 64;
    let (a, b) = (r.vec(s * s, -1.0, 1.0), r.vec(s * s, -1.0, 1.0));
    let (ad, bd) = (gpu.upload(&a)?, gpu.upload(&b)?);
    let mut cd = gpu.upload(&vec![bf16::ZERO; s * s])?;
    gemm(gpu, &blas, (s, s, s), &ad, &bd, &mut cd)?;
    let want: Vec<f64> = (0..s * s)
        .map(|i| {
            let (row, col) = (i / s, i % s);
            (0..s)
                .map(|k| f64::from(a[row * s + k].to_f32()) * f64::from(b[k * s + col].to_f32()))
                .sum()
        })
        .collect();
    check_close("cuBLAS bf16 GEMM 64^3", r.seed, &gpu.download(&cd)?, &want)?;
    let (a, b) = (r.vec(N * N, -1.0, 1.0), r.vec(N * N, -1.0, 1.0));
    let (ad, bd) = (gpu.upload(&a)?, gpu.upload(&b)?);
    let mut cd = gpu.upload(&vec![bf16::ZERO; N * N])?;
    let ms = gpu.time(2, 10, || gemm(gpu, &blas, (N, N, N), &ad, &bd, &mut cd))?;
    let flops = 2.0 * (N as f64).powi(3);
    println!(
        "cuBLAS bf16 GEMM {N}^3 (the tensor-core ceiling): {:>9.1} us  {:>7.2} TFLOP/s",
        ms * 1e3,
        flops / (ms * 1e-3) / 1e12
    );
    Ok(())
}
