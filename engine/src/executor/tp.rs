//! Tensor-parallel executors (see [`crate::dist`] and [`crate::model::tp`]): rank 0's [`TpDriver`],
//! which the engine drives like any executor, and the loop the other
//! ranks run ([`run_worker`]).
//!
//! One scheduler: rank 0 runs HTTP, the scheduler, the KV block manager
//! and sampling. Each step, the driver broadcasts the step (block moves and
//! the batch: ids, positions, slots, block tables) to every rank, then
//! runs its own shard; the ranks meet in the forward pass's collectives
//! and rank 0 alone gets the logits. Each rank's pools have the same block
//! count, so rank 0's block ids hold on every rank.
//!
//! Invariants: the driver refuses whatever rank 0 would refuse before it
//! broadcasts (device sampling; adapters where the executor takes none),
//! so a broadcast step runs on every rank or fails on every rank in
//! validation, before any collective; every rank holds the adapters of the
//! last slot table rank 0 sent; dropping the driver tells the other ranks
//! to stop.
//!
//! Cost per step: one broadcast of O(tokens + block-table entries) bytes,
//! plus the forward pass's collectives (two all-reduces of `[tokens,
//! hidden]` per layer, one for the embedding, one gather of the logits).

use super::gpu::{Device, GpuExecutor};
use super::select::{
    cpu_sized, cuda_unavailable_reason, gpu_options, DeviceKind, ExecutorRequest, WeightInput,
};
use super::{
    BlockOps, BuildError, BuiltExecutor, Capabilities, ExecError, Executor, ForwardBatch, Sampling,
    StepOutput,
};
use crate::dist::wire::{encode_adapter, encode_step, Command, LoraIds};
use crate::dist::Collective;
use crate::model::lora::{LoraAdapter, LoraId, LoraStep, SlotEntry};
use crate::model::tp::{ShardSource, TpPlan, TpRank};
use crate::model::{CpuModel, CpuSink, Dims};
use engine_core::GpuError;
use model_loader::{ModelConfig, WeightTypes};
use std::sync::Arc;

/// Rank 0's executor: broadcasts each step, then runs its own shard.
pub struct TpDriver {
    inner: Box<dyn Executor>,
    comm: Arc<dyn Collective>,
    /// The adapters the other ranks hold: those of the last slot table
    /// sent (each rank keeps the same set, see [`run_worker`]).
    sent: Vec<LoraId>,
}

impl Drop for TpDriver {
    fn drop(&mut self) {
        if let Err(e) = self.comm.broadcast(&mut Command::Shutdown.encode()) {
            tracing::warn!(error = %e, "could not tell the tensor-parallel ranks to stop");
        }
    }
}

impl Executor for TpDriver {
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    fn execute(
        &mut self,
        ops: &BlockOps,
        batch: &ForwardBatch,
        sampling: &Sampling,
    ) -> Result<StepOutput, ExecError> {
        self.execute_lora(ops, batch, &LoraStep::default(), sampling)
    }

    fn supports_lora(&self) -> bool {
        self.inner.supports_lora()
    }

    /// Adapters new to the other ranks go first, each once (by id); then
    /// the step, naming its adapters by id.
    fn execute_lora(
        &mut self,
        ops: &BlockOps,
        batch: &ForwardBatch,
        lora: &LoraStep,
        sampling: &Sampling,
    ) -> Result<StepOutput, ExecError> {
        if *sampling != Sampling::Host {
            return Err(ExecError::InvalidConfig(
                "tensor-parallel ranks return logits; the host draws".into(),
            ));
        }
        if !lora.is_empty() {
            if !self.inner.supports_lora() {
                return Err(ExecError::InvalidConfig(
                    "this executor takes no LoRA adapters under tensor parallelism".into(),
                ));
            }
            lora.validate(batch.seqs.len())?;
            for e in lora.slots.iter().flatten() {
                if !self.sent.contains(&e.id) {
                    self.comm.broadcast(&mut encode_adapter(e.id, &e.adapter))?;
                }
            }
            self.sent = lora.slots.iter().flatten().map(|e| e.id).collect();
        }
        self.comm
            .broadcast(&mut encode_step(ops, batch, &lora_ids(lora)))?;
        self.inner.execute_lora(ops, batch, lora, sampling)
    }

    fn vocab_size(&self) -> usize {
        self.inner.vocab_size()
    }

    fn num_blocks(&self) -> (usize, usize) {
        self.inner.num_blocks()
    }

    fn block_size(&self) -> usize {
        self.inner.block_size()
    }
}

/// The loop of a rank other than 0: runs each step rank 0 broadcasts until
/// it says stop. A step that fails validation fails on every rank alike
/// (logged here; rank 0 reports it); a failed collective ends the loop.
/// Adapters are kept by id as rank 0 sends them, and, as rank 0 does, only
/// those of the last slot table once a step names one.
pub fn run_worker(exec: &mut dyn Executor, comm: &dyn Collective) -> Result<(), ExecError> {
    let mut adapters: Vec<(LoraId, Arc<LoraAdapter>)> = Vec::new();
    loop {
        let mut bytes = Vec::new();
        comm.broadcast(&mut bytes)?;
        let (ops, batch, ids) = match Command::decode(&bytes)? {
            Command::Shutdown => return Ok(()),
            Command::Adapter { id, adapter } => {
                adapters.push((id, Arc::new(adapter)));
                continue;
            }
            Command::Step { ops, batch, lora } => (ops, batch, lora),
        };
        let lora = step_adapters(&ids, &mut adapters)?;
        match exec.execute_lora(&ops, &batch, &lora, &Sampling::Host) {
            Ok(_) => {}
            Err(e @ (ExecError::Collective(_) | ExecError::Gpu(GpuError::Collective(_)))) => {
                return Err(e)
            }
            Err(e) => tracing::warn!(error = %e, "step refused on this rank"),
        }
    }
}

/// The ids of `step`'s adapters (nothing when no sequence uses one).
fn lora_ids(step: &LoraStep) -> LoraIds {
    if step.is_empty() {
        return LoraIds::default();
    }
    LoraIds {
        slots: step
            .slots
            .iter()
            .map(|s| s.as_ref().map(|e| e.id))
            .collect(),
        seq_slot: step.seq_slot.clone(),
    }
}

/// A step's [`LoraStep`] from its ids and the adapters rank 0 sent; keeps
/// only the slot table's adapters when the step names one (rank 0's rule).
fn step_adapters(
    ids: &LoraIds,
    adapters: &mut Vec<(LoraId, Arc<LoraAdapter>)>,
) -> Result<LoraStep, ExecError> {
    if ids.slots.is_empty() {
        return Ok(LoraStep::default());
    }
    let slots = ids
        .slots
        .iter()
        .map(|slot| {
            slot.map(|id| {
                adapters
                    .iter()
                    .find(|(have, _)| *have == id)
                    .map(|(_, a)| SlotEntry {
                        id,
                        adapter: Arc::clone(a),
                    })
                    .ok_or_else(|| {
                        ExecError::Collective(format!("rank 0 never sent adapter {id:?}"))
                    })
            })
            .transpose()
        })
        .collect::<Result<Vec<_>, _>>()?;
    adapters.retain(|(id, _)| ids.slots.contains(&Some(*id)));
    Ok(LoraStep {
        slots,
        seq_slot: ids.seq_slot.clone(),
    })
}

/// Fails on every rank unless all ranks were started with the same
/// `fingerprint` (model file and flags): `mpiexec` ranks that disagree
/// would otherwise load different shards and compute nonsense.
pub fn check_agreement(comm: &dyn Collective, fingerprint: &str) -> Result<(), ExecError> {
    let mut theirs = fingerprint.as_bytes().to_vec();
    comm.broadcast(&mut theirs)?;
    let same = theirs == fingerprint.as_bytes();
    let mut agree = [f32::from(u8::from(same))];
    comm.all_reduce_sum(&mut agree)?;
    if agree[0] as usize == comm.world() {
        return Ok(());
    }
    Err(ExecError::Collective(if same {
        "another rank was started with a different model or flags (see its log)".into()
    } else {
        let theirs = String::from_utf8_lossy(&theirs);
        let (mine, zero) = differing(fingerprint, &theirs);
        format!(
            "rank {} was started with {mine}, rank 0 with {zero}",
            comm.rank()
        )
    }))
}

/// The parts of two `, `-separated descriptions that differ (whole
/// descriptions when they do not line up part for part).
fn differing(a: &str, b: &str) -> (String, String) {
    let (pa, pb): (Vec<&str>, Vec<&str>) = (a.split(", ").collect(), b.split(", ").collect());
    if pa.len() != pb.len() {
        return (a.to_string(), b.to_string());
    }
    let (da, db): (Vec<&str>, Vec<&str>) = pa.iter().zip(&pb).filter(|(x, y)| x != y).unzip();
    (da.join(", "), db.join(", "))
}

/// This rank's executor for `config`'s model split over `comm.world()`
/// ranks: rank 0 gets a [`TpDriver`], the others the plain executor that
/// [`run_worker`] drives. On the CPU, or on CUDA (`--device cuda`, or
/// `auto` where every rank has a GPU): one GPU per rank, all-reducing over
/// NCCL where it loads, else through the host collective.
pub fn build_tp_executor(
    config: ModelConfig,
    input: WeightInput<'_>,
    req: &ExecutorRequest,
    comm: Arc<dyn Collective>,
) -> Result<BuiltExecutor, BuildError> {
    let plan = Arc::new(TpPlan::new(&Dims::of(&config)?, comm.world())?);
    let cuda = match req.device {
        DeviceKind::Cpu => false,
        DeviceKind::Cuda => true,
        DeviceKind::Auto => {
            let here = cuda_unavailable_reason().is_none();
            let mut count = [f32::from(u8::from(here))];
            comm.all_reduce_sum(&mut count)?;
            let with = count[0] as usize;
            if with != 0 && with != comm.world() {
                return Err(ExecError::InvalidConfig(format!(
                    "--device auto: {with} of {} ranks have a usable GPU; pass --device cpu \
                     or --device cuda so that all ranks run alike",
                    comm.world()
                ))
                .into());
            }
            here
        }
    };
    if cuda {
        return cuda_rank(config, input, req, comm, plan);
    }
    let rank = comm.rank();
    let local = plan.local_config(&config, rank);
    let mut input = input;
    let types = input.cpu_types();
    let mut whole = input.source(types);
    let mut shard = ShardSource::new(&mut *whole, plan.ranks[rank].clone(), plan.head_dim);
    let model = CpuModel::load(local, &mut shard, &mut CpuSink)?;
    let layout = plan.describe(rank, comm.library());
    let (exec, description) = cpu_sized(model, req, format!("cpu, {layout}"), plan.max_kv_heads())?;
    let exec = exec.with_tp(TpRank {
        comm: Arc::clone(&comm),
        plan,
    });
    Ok(BuiltExecutor {
        executor: for_rank(Box::new(exec), comm),
        description,
    })
}

/// Rank 0's executor behind a [`TpDriver`]; the others' as they are.
fn for_rank(exec: Box<dyn Executor>, comm: Arc<dyn Collective>) -> Box<dyn Executor> {
    if comm.rank() == 0 {
        Box::new(TpDriver {
            inner: exec,
            comm,
            sent: Vec::new(),
        })
    } else {
        exec
    }
}

/// This rank's GPU executor on `dev`: the shard's weights (a GGUF's
/// quantized tensors converted on their way, as for one GPU), pools agreed
/// across ranks (see [`GpuExecutor::load_sharded`]). `library` names what
/// the all-reduce runs on, for the startup log.
pub fn gpu_rank<D: Device + 'static>(
    dev: D,
    config: ModelConfig,
    input: WeightInput<'_>,
    req: &ExecutorRequest,
    (comm, plan): (Arc<dyn Collective>, Arc<TpPlan>),
    library: &str,
) -> Result<BuiltExecutor, BuildError> {
    let description = format!(
        "{}, {}",
        dev.describe(),
        plan.describe(comm.rank(), library)
    );
    let exec = gpu_shard(dev, config, input, req, (Arc::clone(&comm), plan))?;
    Ok(BuiltExecutor {
        executor: for_rank(Box::new(exec), comm),
        description,
    })
}

/// [`gpu_rank`]'s executor itself, not yet behind a [`TpDriver`].
pub fn gpu_shard<D: Device>(
    dev: D,
    config: ModelConfig,
    mut input: WeightInput<'_>,
    req: &ExecutorRequest,
    (comm, plan): (Arc<dyn Collective>, Arc<TpPlan>),
) -> Result<GpuExecutor<D>, BuildError> {
    let rank = comm.rank();
    let local = plan.local_config(&config, rank);
    let opts = gpu_options(&local, req)?;
    let mut whole = input.source(WeightTypes::File);
    let mut shard = ShardSource::new(&mut *whole, plan.ranks[rank].clone(), plan.head_dim);
    let tp = TpRank { comm, plan };
    Ok(GpuExecutor::load_sharded(dev, local, &mut shard, opts, tp)?
        .with_cuda_graphs(req.max_num_seqs, req.enforce_eager))
}

/// The GPU of this rank: the node-local rank's (MPICH's `MPI_LOCALRANKID`,
/// Open MPI's `OMPI_COMM_WORLD_LOCAL_RANK`, else the rank) modulo the
/// node's GPU count; NCCL joined where every rank has it.
fn cuda_rank(
    config: ModelConfig,
    input: WeightInput<'_>,
    req: &ExecutorRequest,
    comm: Arc<dyn Collective>,
    plan: Arc<TpPlan>,
) -> Result<BuiltExecutor, BuildError> {
    #[cfg(not(feature = "cuda"))]
    {
        let _ = (config, input, req, comm, plan);
        Err(super::select::no_cuda_build())
    }
    #[cfg(feature = "cuda")]
    {
        use super::gpu::cuda::{probe, CudaDevice};
        use super::gpu::GpuError;
        probe(0)?;
        let count = cudarc::driver::CudaContext::device_count()
            .map_err(GpuError::driver("cuDeviceGetCount"))?
            .max(1) as usize;
        let local = ["MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK"]
            .iter()
            .find_map(|v| std::env::var(v).ok()?.parse::<usize>().ok())
            .unwrap_or(comm.rank());
        let ordinal = local % count;
        let mut dev = CudaDevice::new(ordinal)?;
        let library = match dev.join_nccl(&*comm) {
            Ok(()) => format!(
                "NCCL (all-reduce; bootstrap, gather and broadcast on {})",
                comm.library()
            ),
            Err(e) => {
                tracing::warn!(error = %engine_core::Report(&e), "NCCL unavailable: all-reduce through the host");
                format!(
                    "{} (all-reduce staged through the host: NCCL unavailable)",
                    comm.library()
                )
            }
        };
        let description = format!("cuda {ordinal}: ");
        let mut built = gpu_rank(dev, config, input, req, (comm, plan), &library)?;
        built.description.insert_str(0, &description);
        Ok(built)
    }
}
