//! The NCCL path of tensor parallelism on a real GPU (feature `cuda`; skips
//! without a driver): one GPU cannot hold two NCCL ranks, so this runs a
//! world of one, where every all-reduce of the sharded forward pass still
//! goes through `ncclAllReduce`, and checks its greedy tokens against the
//! plain (unsharded) CUDA executor on the default model's golden prompts.
//! `scripts/gpu-engine-check.sh` runs it with the other engine tests.
#![cfg(feature = "cuda")]

use engine::dist::{Collective, Solo};
use engine::executor::gpu::cuda::CudaDevice;
use engine::executor::select::cuda_unavailable_reason;
use engine::executor::tp::gpu_rank;
use engine::executor::{
    build_executor, generate_greedy, DeviceKind, Executor, ExecutorRequest, WeightInput,
};
use engine::model::tp::TpPlan;
use engine::model::Dims;
use model_loader::{WeightReader, WeightTypes};
use std::sync::Arc;

fn request() -> ExecutorRequest {
    ExecutorRequest {
        device: DeviceKind::Cuda,
        block_size: 16,
        num_gpu_blocks: Some(256),
        cpu_kv_cache_bytes: 0,
        swap_bytes: 0,
        gpu_memory_utilization: 0.9,
        max_num_batched_tokens: 512,
        dtype: engine::executor::gpu::DType::Bf16,
        kv_cache_dtype: None,
        max_num_seqs: 8,
        enforce_eager: false,
        batch_invariant: false,
    }
}

#[test]
fn nccl_world_of_one_gives_the_plain_gpu_tokens() {
    if let Some(why) = cuda_unavailable_reason() {
        println!("SKIP: {why}");
        return;
    }
    let path = model_loader::paths::default_model_path();
    if !path.is_file() {
        println!("SKIP: {} missing (cargo xtask fetch-model)", path.display());
        return;
    }
    let reader = WeightReader::open(&path).expect("open");
    let config = reader.config().clone();
    let input = || WeightInput::File {
        reader: &reader,
        cpu_types: WeightTypes::File,
    };
    let mut plain = build_executor(config.clone(), input(), &request())
        .expect("plain cuda executor")
        .executor;
    let comm: Arc<dyn Collective> = Arc::new(Solo);
    let mut dev = CudaDevice::new(0).expect("cuda device");
    dev.join_nccl(&*comm)
        .expect("NCCL (libnccl.so.2) for a world of one");
    let plan = Arc::new(TpPlan::new(&Dims::of(&config).expect("dims"), 1).expect("plan"));
    let built = gpu_rank(dev, config, input(), &request(), (comm, plan), "NCCL")
        .expect("sharded cuda executor");
    println!("{}", built.description);
    let mut sharded = built.executor;
    for prompt in [
        vec![1, 9690, 314, 253, 5354, 30, 6121, 523, 1535, 282, 4195, 30],
        vec![1, 4093, 418, 30, 1070, 314, 253, 2462, 30],
    ] {
        let run = |exec: &mut dyn Executor| {
            generate_greedy(exec, &prompt, 24, &[], |_| {}).expect("generate")
        };
        assert_eq!(run(&mut *sharded), run(&mut *plain), "prompt {prompt:?}");
    }
}
