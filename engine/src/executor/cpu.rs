//! The CPU executor: the model, the accelerator KV pool and the CPU swap
//! pool, each pool its own memory region of the configured size.
//!
//! A step runs the block operations in the contract's order (swap out,
//! swap in, copy-on-write copies; every layer, K and V), then the forward
//! pass. All block ids of a step are checked before anything moves, so a
//! bad id leaves both pools untouched. A block move costs
//! O(layers x block_size x kv_heads x head_dim).

pub mod generate;

use super::{BlockOps, Capabilities, ExecError, Executor, ForwardBatch, Sampling, StepOutput};
use crate::kv::{BlockCopy, BlockId};
use crate::model::cpu_backend::CpuLora;
use crate::model::lora::kernel::{Prepared, RowGroups};
use crate::model::lora::{LoraId, LoraStep};
use crate::model::tp::TpRank;
use crate::model::{CpuModel, KvCache, KvDtype};
use std::sync::Arc;

/// Runs a [`CpuModel`] on the CPU over a paged KV cache.
pub struct CpuExecutor {
    model: CpuModel,
    device: KvCache,
    host: KvCache,
    /// Each LoRA slot's adapter in the kernel's layout, keyed by its id.
    lora: Vec<Option<(LoraId, Arc<Prepared>)>>,
    /// Tensor parallelism: `model` is this rank's shard (see [`crate::model::tp`]).
    tp: Option<TpRank>,
}

impl CpuExecutor {
    /// An executor with `num_blocks` accelerator blocks and `num_cpu_blocks`
    /// swap blocks of `block_size` tokens, K/V in [`KvDtype::auto`]'s type
    /// for the model (f16 when its weights stay quantized, else f32).
    pub fn new(
        model: CpuModel,
        num_blocks: usize,
        num_cpu_blocks: usize,
        block_size: usize,
    ) -> Result<Self, ExecError> {
        let dtype = KvDtype::auto(model.is_quantized());
        Self::with_kv_dtype(model, num_blocks, num_cpu_blocks, block_size, dtype)
    }

    /// [`CpuExecutor::new`] with K/V kept in `dtype`. Pools are zeroed;
    /// memory is `(num_blocks + num_cpu_blocks) * bytes_per_block`.
    pub fn with_kv_dtype(
        model: CpuModel,
        num_blocks: usize,
        num_cpu_blocks: usize,
        block_size: usize,
        dtype: KvDtype,
    ) -> Result<Self, ExecError> {
        if block_size == 0 || num_blocks == 0 {
            return Err(ExecError::InvalidBatch(
                "block_size and num_blocks must be positive".into(),
            ));
        }
        let device = KvCache::with_dtype(model.kv_geometry(num_blocks, block_size), dtype);
        let host = KvCache::with_dtype(model.kv_geometry(num_cpu_blocks, block_size), dtype);
        Ok(Self {
            model,
            device,
            host,
            lora: Vec::new(),
            tp: None,
        })
    }

    /// This executor as one tensor-parallel rank: its model is the rank's
    /// shard and every forward pass communicates through `tp`.
    pub fn with_tp(mut self, tp: TpRank) -> Self {
        self.tp = Some(tp);
        self
    }

    /// Makes the executor's prepared slots match the step's slot table:
    /// a slot whose adapter id changed is prepared again (a slot fill).
    /// Under tensor parallelism a slot holds this rank's slice of the
    /// adapter ([`TpRank::shard_adapter`]).
    fn fill_lora_slots(&mut self, step: &LoraStep) {
        self.lora.resize(step.slots.len(), None);
        for (mine, theirs) in self.lora.iter_mut().zip(&step.slots) {
            match theirs {
                None => *mine = None,
                Some(e) if mine.as_ref().is_some_and(|(id, _)| *id == e.id) => {}
                Some(e) => {
                    let prepared = match &self.tp {
                        Some(tp) => Prepared::new(&tp.shard_adapter(&e.adapter)),
                        None => Prepared::new(&e.adapter),
                    };
                    *mine = Some((e.id, Arc::new(prepared)));
                }
            }
        }
    }

    /// Sizes both pools from byte budgets (`--kv-cache-memory`, `--swap-space`):
    /// as many whole blocks of `dtype` as fit.
    pub fn with_memory_budget(
        model: CpuModel,
        kv_cache_bytes: usize,
        swap_bytes: usize,
        block_size: usize,
        dtype: KvDtype,
    ) -> Result<Self, ExecError> {
        let per_block = Self::bytes_per_block(&model, block_size, dtype);
        if per_block == 0 || kv_cache_bytes < per_block {
            return Err(ExecError::InvalidBatch(format!(
                "KV cache budget of {kv_cache_bytes} bytes holds no block of {per_block} bytes"
            )));
        }
        Self::with_kv_dtype(
            model,
            kv_cache_bytes / per_block,
            swap_bytes / per_block,
            block_size,
            dtype,
        )
    }

    /// Bytes one block takes for `model` in `dtype` (all layers, K and V).
    pub fn bytes_per_block(model: &CpuModel, block_size: usize, dtype: KvDtype) -> usize {
        model
            .kv_geometry(1, block_size)
            .bytes_per_block(dtype.size())
    }

    /// The element type of both pools.
    pub fn kv_dtype(&self) -> KvDtype {
        self.device.dtype()
    }

    /// The model.
    pub fn model(&self) -> &CpuModel {
        &self.model
    }

    /// The accelerator pool.
    pub fn device_pool(&self) -> &KvCache {
        &self.device
    }

    /// The accelerator pool, mutable (tests, warm-up).
    pub fn device_pool_mut(&mut self) -> &mut KvCache {
        &mut self.device
    }

    /// The CPU swap pool.
    pub fn cpu_pool(&self) -> &KvCache {
        &self.host
    }

    /// The CPU swap pool, mutable (tests).
    pub fn cpu_pool_mut(&mut self) -> &mut KvCache {
        &mut self.host
    }

    /// Performs swap out, swap in, then copy-on-write copies. Checks every id
    /// first: on error nothing has moved.
    pub fn apply_block_ops(&mut self, ops: &BlockOps) -> Result<(), ExecError> {
        let (nd, nh) = (
            self.device.geometry().num_blocks,
            self.host.geometry().num_blocks,
        );
        let check = |copies: &[BlockCopy], src_n: usize, dst_n: usize| -> Result<(), ExecError> {
            for c in copies {
                in_range(c.src, src_n)?;
                in_range(c.dst, dst_n)?;
            }
            Ok(())
        };
        check(&ops.swap_out, nd, nh)?;
        check(&ops.swap_in, nh, nd)?;
        check(&ops.copies, nd, nd)?;
        for c in &ops.swap_out {
            self.host.copy_block_from(&self.device, c.src, c.dst)?;
        }
        for c in &ops.swap_in {
            self.device.copy_block_from(&self.host, c.src, c.dst)?;
        }
        for c in &ops.copies {
            self.device.copy_block(c.src, c.dst)?;
        }
        Ok(())
    }
}

fn in_range(b: BlockId, n: usize) -> Result<(), ExecError> {
    if (b.0 as usize) < n {
        Ok(())
    } else {
        Err(ExecError::BlockOutOfRange(b))
    }
}

impl Executor for CpuExecutor {
    fn capabilities(&self) -> Capabilities {
        // The host draws from the logits the forward pass leaves in host
        // memory: nothing to gain from a second path.
        Capabilities::default()
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
        true
    }

    fn execute_lora(
        &mut self,
        ops: &BlockOps,
        batch: &ForwardBatch,
        lora: &LoraStep,
        sampling: &Sampling,
    ) -> Result<StepOutput, ExecError> {
        if *sampling != Sampling::Host {
            return Err(ExecError::InvalidConfig(
                "the CPU executor returns logits; the host draws".into(),
            ));
        }
        lora.validate(batch.seqs.len())?;
        self.apply_block_ops(ops)?;
        if lora.is_empty() {
            return Ok(StepOutput::Logits(self.model.forward_with(
                batch,
                &mut self.device,
                None,
                self.tp.as_ref(),
            )?));
        }
        self.fill_lora_slots(lora);
        let prepared: Vec<Option<Arc<Prepared>>> = self
            .lora
            .iter()
            .map(|s| s.as_ref().map(|(_, p)| Arc::clone(p)))
            .collect();
        let groups = RowGroups::new(lora, batch.seqs.iter().map(|s| s.query_len));
        let run = CpuLora {
            prepared: &prepared,
            groups: &groups,
        };
        Ok(StepOutput::Logits(self.model.forward_with(
            batch,
            &mut self.device,
            Some(run),
            self.tp.as_ref(),
        )?))
    }

    fn vocab_size(&self) -> usize {
        self.model.config().vocab_size
    }

    fn num_blocks(&self) -> (usize, usize) {
        (
            self.device.geometry().num_blocks,
            self.host.geometry().num_blocks,
        )
    }

    fn block_size(&self) -> usize {
        self.device.geometry().block_size
    }
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_smollm2;
