//! Choosing and building the executor (`--device auto|cpu|cuda`).
//!
//! `auto` takes CUDA when this build has the `cuda` feature and a driver and
//! device answer, and otherwise the CPU, saying why in the returned
//! description. `cuda` never falls back: without the feature or a driver it is
//! an [`ExecError::Gpu`] naming the reason. Pool sizes: on the CPU from
//! byte budgets (or an exact block count); on CUDA from vLLM's
//! `gpu_memory_utilization` profile (or an exact block count).

use super::gpu::DType;
use super::{BuildError, CpuExecutor, ExecError, Executor};
use crate::model::{CpuModel, CpuSink, FileSource, InMemory, KvDtype, WeightSource};
use model_loader::{ModelConfig, WeightReader, WeightTypes};

/// Which executor runs the model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum DeviceKind {
    /// CUDA when available, else the CPU.
    #[default]
    Auto,
    Cpu,
    Cuda,
}

/// What the caller wants of the executor.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ExecutorRequest {
    pub device: DeviceKind,
    pub block_size: usize,
    /// Exact accelerator pool size in blocks (overrides the budgets below).
    pub num_gpu_blocks: Option<usize>,
    /// CPU executor: bytes of the KV pool.
    pub cpu_kv_cache_bytes: usize,
    /// Host swap pool, bytes (both executors).
    pub swap_bytes: usize,
    /// CUDA: fraction of device memory for weights, activations and KV cache.
    pub gpu_memory_utilization: f64,
    /// CUDA: the profile run's batch size in tokens.
    pub max_num_batched_tokens: usize,
    /// CUDA: element type of weights, activations and KV cache.
    pub dtype: DType,
    /// `--kv-cache-dtype`: the KV pools' element type; `None` (auto) is
    /// [`KvDtype::auto`] on the CPU and `dtype` on CUDA, where any other
    /// choice is refused.
    pub kv_cache_dtype: Option<KvDtype>,
    /// CUDA: decode steps of up to `min(512, max_num_seqs)` sequences run as
    /// CUDA graphs (one per batch-size bucket) unless `enforce_eager`.
    pub max_num_seqs: usize,
    pub enforce_eager: bool,
    /// CPU: batch-invariant kernels ([`CpuModel::set_batch_invariant`]):
    /// a request's logits the same bits whatever shares its batch.
    pub batch_invariant: bool,
}

/// The built executor and a line saying what it is (for the startup log).
pub struct BuiltExecutor {
    pub executor: Box<dyn Executor>,
    pub description: String,
}

/// Where the model's weights come from.
pub enum WeightInput<'a> {
    /// A model file being read: the CPU takes its matrices in `cpu_types`
    /// (`File`: a GGUF's quantized blocks kept), the GPU takes a GGUF's
    /// quantized blocks and converts them a row range at a time.
    File {
        reader: &'a WeightReader,
        cpu_types: WeightTypes,
    },
    /// Weights already in memory (tests, benchmarks).
    Memory(InMemory),
}

impl WeightInput<'_> {
    /// The source for an executor that takes a file's matrices in `types`.
    pub(super) fn source(&mut self, types: WeightTypes) -> Box<dyn WeightSource + '_> {
        match self {
            WeightInput::File { reader, .. } => Box::new(FileSource { reader, types }),
            WeightInput::Memory(m) => Box::new(m),
        }
    }

    /// The types the CPU executor takes a file's matrices in.
    pub(super) fn cpu_types(&self) -> WeightTypes {
        match self {
            WeightInput::File { cpu_types, .. } => *cpu_types,
            WeightInput::Memory(_) => WeightTypes::File,
        }
    }
}

/// Builds the executor `req` asks for (see the module docs), reading
/// `config`'s model from `input` into the executor's own formats (a layer
/// at a time: the GPU executor keeps no host copy).
pub fn build_executor(
    config: ModelConfig,
    mut input: WeightInput<'_>,
    req: &ExecutorRequest,
) -> Result<BuiltExecutor, BuildError> {
    let cpu_types = input.cpu_types();
    match req.device {
        DeviceKind::Cpu => {
            let description = "cpu (--device cpu)".into();
            cpu(config, &mut *input.source(cpu_types), req, description)
        }
        DeviceKind::Cuda => cuda(config, &mut *input.source(WeightTypes::File), req),
        DeviceKind::Auto => match cuda_unavailable_reason() {
            None => cuda(config, &mut *input.source(WeightTypes::File), req),
            Some(why) => {
                let description = format!("cpu (--device auto: {why})");
                cpu(config, &mut *input.source(cpu_types), req, description)
            }
        },
    }
}

fn cpu(
    config: ModelConfig,
    source: &mut dyn WeightSource,
    req: &ExecutorRequest,
    description: String,
) -> Result<BuiltExecutor, BuildError> {
    let model = CpuModel::load(config, source, &mut CpuSink)?;
    cpu_executor(model, req, description)
}

const MIB: f64 = 1024.0 * 1024.0;

/// The CPU executor of a loaded model, its pools sized by `req`.
pub fn cpu_executor(
    model: CpuModel,
    req: &ExecutorRequest,
    description: String,
) -> Result<BuiltExecutor, BuildError> {
    let kv_heads = model.config().num_key_value_heads;
    let (executor, description) = cpu_sized(model, req, description, kv_heads)?;
    Ok(BuiltExecutor {
        executor: Box::new(executor),
        description,
    })
}

/// [`cpu_executor`] unboxed, its pools sized as if the model had
/// `sizing_kv_heads` KV heads (tensor-parallel ranks size for the largest
/// shard, so every rank holds the same number of blocks).
pub(super) fn cpu_sized(
    mut model: CpuModel,
    req: &ExecutorRequest,
    description: String,
    sizing_kv_heads: usize,
) -> Result<(CpuExecutor, String), BuildError> {
    model.set_batch_invariant(req.batch_invariant);
    let kv_dtype = req
        .kv_cache_dtype
        .unwrap_or_else(|| KvDtype::auto(model.is_quantized()));
    let mut geom = model.kv_geometry(1, req.block_size);
    geom.num_kv_heads = sizing_kv_heads;
    let per_block = geom.bytes_per_block(kv_dtype.size()).max(1);
    let gpu_blocks = req
        .num_gpu_blocks
        .unwrap_or(req.cpu_kv_cache_bytes / per_block);
    let cpu_blocks = req.swap_bytes / per_block;
    let executor =
        CpuExecutor::with_kv_dtype(model, gpu_blocks, cpu_blocks, req.block_size, kv_dtype)?;
    Ok((
        executor,
        format!(
            "{description}, KV cache {}: pool {:.0} MiB and swap pool {:.0} MiB reserved, \
             resident only as blocks are written",
            kv_dtype.name(),
            (gpu_blocks * per_block) as f64 / MIB,
            (cpu_blocks * per_block) as f64 / MIB,
        ),
    ))
}

/// `None` when a CUDA executor can be tried, else why not.
pub fn cuda_unavailable_reason() -> Option<String> {
    #[cfg(feature = "cuda")]
    {
        super::gpu::cuda::probe(0).err().map(|e| e.to_string())
    }
    #[cfg(not(feature = "cuda"))]
    {
        Some("this build has no CUDA support (build with `--features cuda`)".into())
    }
}

/// The GPU executor's options from `req` for `config`'s model (a
/// tensor-parallel rank's local configuration under tensor parallelism):
/// KV pools from an exact block count or vLLM's utilization profile. The
/// GPU keeps its KV cache in `--dtype`: any other `--kv-cache-dtype` is
/// refused.
pub(super) fn gpu_options(
    config: &ModelConfig,
    req: &ExecutorRequest,
) -> Result<super::gpu::GpuOptions, ExecError> {
    use super::gpu::{blocks::KvPools, GpuOptions, KvSizing};
    let kv_matches = match req.kv_cache_dtype {
        None => true,
        Some(KvDtype::F32) => req.dtype == DType::F32,
        Some(KvDtype::F16) => req.dtype == DType::F16,
    };
    if !kv_matches {
        return Err(ExecError::InvalidConfig(format!(
            "--kv-cache-dtype {} differs from --dtype {:?}: the GPU keeps its KV cache in \
             --dtype (leave --kv-cache-dtype at auto)",
            req.kv_cache_dtype.map_or("auto", KvDtype::name),
            req.dtype
        )));
    }
    let kv = match req.num_gpu_blocks {
        Some(gpu) => {
            let geom = crate::model::kv_geometry(config, 1, req.block_size);
            let per_block = KvPools::bytes_per_block(&geom, req.dtype).max(1);
            KvSizing::Blocks {
                gpu,
                cpu: req.swap_bytes / per_block,
            }
        }
        None => KvSizing::Utilization {
            fraction: req.gpu_memory_utilization,
            swap_bytes: req.swap_bytes,
            max_num_batched_tokens: req.max_num_batched_tokens,
        },
    };
    Ok(GpuOptions {
        dtype: req.dtype,
        block_size: req.block_size,
        kv,
    })
}

#[cfg(feature = "cuda")]
fn cuda(
    config: ModelConfig,
    source: &mut dyn WeightSource,
    req: &ExecutorRequest,
) -> Result<BuiltExecutor, BuildError> {
    use super::gpu::{cuda::CudaDevice, GpuExecutor};
    let opts = gpu_options(&config, req)?;
    let dev = CudaDevice::new(0)?;
    let description = format!("cuda: {}", super::gpu::Device::describe(&dev));
    // The GPU runs f32/f16/bf16 matrices: quantized tensors are converted
    // a row range at a time on their way to the device.
    let exec = GpuExecutor::load(dev, config, source, opts)?
        .with_cuda_graphs(req.max_num_seqs, req.enforce_eager);
    Ok(BuiltExecutor {
        executor: Box::new(exec),
        description,
    })
}

#[cfg(not(feature = "cuda"))]
fn cuda(
    _: ModelConfig,
    _: &mut dyn WeightSource,
    _: &ExecutorRequest,
) -> Result<BuiltExecutor, BuildError> {
    Err(no_cuda_build())
}

/// `--device cuda` in a build without the `cuda` feature.
#[cfg(not(feature = "cuda"))]
pub(super) fn no_cuda_build() -> BuildError {
    ExecError::from(super::gpu::GpuError::unavailable(
        "--device cuda: this build has no CUDA support; rebuild with `cargo build --release --features cuda`",
    ))
    .into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::test_util::{random_weights, tiny_config};

    fn req(device: DeviceKind) -> ExecutorRequest {
        ExecutorRequest {
            device,
            block_size: 4,
            num_gpu_blocks: Some(8),
            cpu_kv_cache_bytes: 0,
            swap_bytes: 0,
            gpu_memory_utilization: 0.9,
            max_num_batched_tokens: 64,
            dtype: DType::Bf16,
            kv_cache_dtype: None,
            max_num_seqs: 8,
            enforce_eager: false,
            batch_invariant: false,
        }
    }

    fn model() -> CpuModel {
        let c = tiny_config(false, None);
        CpuModel::new(c.clone(), random_weights(&c, 2)).expect("model")
    }

    /// Builds from the tiny model's weights in memory.
    fn build(r: &ExecutorRequest) -> Result<BuiltExecutor, BuildError> {
        let c = tiny_config(false, None);
        let source = InMemory::from(random_weights(&c, 2));
        build_executor(c, WeightInput::Memory(source), r)
    }

    #[test]
    fn cpu_is_built_as_asked_and_auto_says_why_it_fell_back() {
        let b = build(&req(DeviceKind::Cpu)).expect("cpu");
        assert_eq!(b.executor.num_blocks(), (8, 0));
        match cuda_unavailable_reason() {
            Some(why) => {
                let b = build(&req(DeviceKind::Auto)).expect("auto");
                assert!(b.description.contains(&why), "{}", b.description);
                // Explicit CUDA never falls back.
                let e = build(&req(DeviceKind::Cuda)).err().expect("refused");
                assert!(
                    matches!(
                        e,
                        BuildError::Exec(ExecError::Gpu(
                            super::super::gpu::GpuError::Unavailable { .. }
                        ))
                    ),
                    "{e}"
                );
                println!("SKIP cuda executor: {why}");
            }
            None => {
                let b = build(&req(DeviceKind::Cuda)).expect("cuda");
                assert!(b.description.starts_with("cuda"), "{}", b.description);
            }
        }
    }

    #[test]
    fn cpu_kv_cache_dtype_sizes_the_pool_from_the_byte_budget() {
        let m = model();
        let per_f32 = CpuExecutor::bytes_per_block(&m, 4, KvDtype::F32);
        let mut r = req(DeviceKind::Cpu);
        r.num_gpu_blocks = None;
        r.cpu_kv_cache_bytes = 4 * per_f32;
        // An f32 model: auto is f32.
        let b = build(&r).expect("auto");
        assert_eq!(b.executor.num_blocks().0, 4);
        assert!(
            b.description.contains("KV cache float32: pool"),
            "{}",
            b.description
        );
        r.kv_cache_dtype = Some(KvDtype::F16);
        let b = cpu_executor(m, &r, "cpu".into()).expect("f16");
        assert_eq!(b.executor.num_blocks().0, 8);
        assert!(
            b.description.contains("KV cache float16: pool"),
            "{}",
            b.description
        );
    }
}
