//! The KV pools of the GPU executor and the block operations on them.
//!
//! Device pool: one allocation; the K (then V) cache of layer `l` is the
//! region `(2 l + kv) * (num_blocks + pad) * block_bytes`, each laid out `[num_blocks,
//! block_size, num_kv_heads, head_dim]`, so one block of one layer's K is
//! `block_bytes` contiguous bytes. Past the `num_blocks` blocks the scheduler
//! owns, each layer's region has [`pad_blocks`] more that no sequence ever
//! gets: the padding rows of a CUDA-graph decode step write their K and V
//! there (vLLM's padding slot), so a padded row never touches a real block.
//! The host swap pool (page-locked on CUDA)
//! has the same layout with its own block count.
//!
//! A step's block operations run in the contract's order: swap out, swap in
//! (both as per-(block, layer, K/V) copies on the swap stream), a fence, then
//! every copy-on-write copy of every layer in one `copy_blocks` launch. All ids
//! are checked first: on error nothing has moved. Cost O(blocks x layers)
//! copies of `block_bytes`.

use super::device::{DType, DevBuf, DevPtr, Device, HostBuf, ThreadsFor};
use super::GpuError;
use crate::executor::KvGeometry;
use crate::executor::{BlockOps, ExecError};
use crate::kv::{BlockCopy, BlockId};
use gpu_kernels::{launch as geom, KernelArg};

/// Padding rows a graph bucket may add (buckets are 1, 2, 4, 8 then
/// multiples of 8: at most 7 rows of padding).
pub const MAX_PAD_ROWS: usize = 7;

/// Blocks past the pool for padding rows' slots: one distinct slot per row.
pub fn pad_blocks(block_size: usize) -> usize {
    MAX_PAD_ROWS.div_ceil(block_size.max(1))
}

/// Device and host KV pools.
pub struct KvPools {
    geom: KvGeometry,
    dtype: DType,
    device: DevBuf,
    host: HostBuf,
    num_cpu_blocks: usize,
    /// `u64[layers]` device addresses of each layer's K / V cache (for `copy_blocks`).
    key_ptrs: DevBuf,
    value_ptrs: DevBuf,
    /// `u32[2 * pairs]` copy-on-write mapping, grown on demand.
    mapping: Option<DevBuf>,
}

impl KvPools {
    /// Bytes of one block across all layers, K and V, in `dtype`.
    pub fn bytes_per_block(g: &KvGeometry, dtype: DType) -> usize {
        g.bytes_per_block(dtype.size())
    }

    /// Allocates both pools (zeroed) and the per-layer address tables.
    pub fn new(
        dev: &mut dyn Device,
        geom: KvGeometry,
        num_cpu_blocks: usize,
        dtype: DType,
    ) -> Result<Self, GpuError> {
        let block_bytes = geom.block_elems() * dtype.size();
        let stride = geom.num_blocks + pad_blocks(geom.block_size);
        let device = dev.alloc(2 * geom.num_layers * stride * block_bytes)?;
        let host = dev.alloc_host(2 * geom.num_layers * num_cpu_blocks * block_bytes)?;
        let layer = |l: usize, kv: usize| device.ptr.offset((2 * l + kv) * stride * block_bytes);
        let table = |kv: usize| -> Vec<u8> {
            (0..geom.num_layers)
                .flat_map(|l| layer(l, kv).0.to_le_bytes())
                .collect()
        };
        let (k_table, v_table) = (table(0), table(1));
        let key_ptrs = dev.alloc(k_table.len())?;
        dev.upload(key_ptrs.ptr, &k_table)?;
        let value_ptrs = dev.alloc(v_table.len())?;
        dev.upload(value_ptrs.ptr, &v_table)?;
        Ok(Self {
            geom,
            dtype,
            device,
            host,
            num_cpu_blocks,
            key_ptrs,
            value_ptrs,
            mapping: None,
        })
    }

    /// Returns the device allocations (the host pool lives until the device drops).
    pub fn release(self, dev: &mut dyn Device) -> Result<(), GpuError> {
        dev.free(self.device)?;
        dev.free(self.key_ptrs)?;
        dev.free(self.value_ptrs)?;
        if let Some(m) = self.mapping {
            dev.free(m)?;
        }
        Ok(())
    }

    /// The device pool's geometry.
    pub fn geometry(&self) -> KvGeometry {
        self.geom
    }

    /// Device blocks.
    pub fn num_blocks(&self) -> usize {
        self.geom.num_blocks
    }

    /// Host swap blocks.
    pub fn num_cpu_blocks(&self) -> usize {
        self.num_cpu_blocks
    }

    fn block_bytes(&self) -> usize {
        self.geom.block_elems() * self.dtype.size()
    }

    /// Start of layer `l`'s K (`kv == 0`) or V cache.
    pub fn layer_ptr(&self, l: usize, kv: usize) -> DevPtr {
        let stride = self.geom.num_blocks + pad_blocks(self.geom.block_size);
        self.device
            .ptr
            .offset((2 * l + kv) * stride * self.block_bytes())
    }

    /// The cache slot of padding row `j` (`j < MAX_PAD_ROWS`): in the padding
    /// blocks past the pool, distinct per row.
    pub fn pad_slot(&self, j: usize) -> usize {
        self.geom.num_blocks * self.geom.block_size + j
    }

    fn device_block(&self, l: usize, kv: usize, b: BlockId) -> DevPtr {
        self.layer_ptr(l, kv)
            .offset(b.0 as usize * self.block_bytes())
    }

    fn host_offset(&self, l: usize, kv: usize, b: BlockId) -> usize {
        ((2 * l + kv) * self.num_cpu_blocks + b.0 as usize) * self.block_bytes()
    }

    /// Runs `ops` (see the module docs). Checks every id before moving anything.
    pub fn apply(&mut self, dev: &mut dyn Device, ops: &BlockOps) -> Result<(), ExecError> {
        let (nd, nh) = (self.geom.num_blocks, self.num_cpu_blocks);
        let check = |copies: &[BlockCopy], src_n: usize, dst_n: usize| {
            copies.iter().try_for_each(|c| {
                for (b, n) in [(c.src, src_n), (c.dst, dst_n)] {
                    if b.0 as usize >= n {
                        return Err(ExecError::BlockOutOfRange(b));
                    }
                }
                Ok(())
            })
        };
        check(&ops.swap_out, nd, nh)?;
        check(&ops.swap_in, nh, nd)?;
        check(&ops.copies, nd, nd)?;
        let bytes = self.block_bytes();
        for c in &ops.swap_out {
            for (l, kv) in self.layers_kv() {
                let off = self.host_offset(l, kv, c.dst);
                dev.copy_to_host(self.device_block(l, kv, c.src), &self.host, off, bytes)?;
            }
        }
        for c in &ops.swap_in {
            for (l, kv) in self.layers_kv() {
                let off = self.host_offset(l, kv, c.src);
                dev.copy_from_host(&self.host, off, self.device_block(l, kv, c.dst), bytes)?;
            }
        }
        if !ops.swap_out.is_empty() || !ops.swap_in.is_empty() {
            dev.swap_fence()?;
        }
        if !ops.copies.is_empty() {
            self.copy_blocks(dev, &ops.copies)?;
        }
        Ok(())
    }

    fn layers_kv(&self) -> impl Iterator<Item = (usize, usize)> {
        (0..self.geom.num_layers).flat_map(|l| [(l, 0), (l, 1)])
    }

    /// Copy-on-write copies, every layer, one launch.
    fn copy_blocks(&mut self, dev: &mut dyn Device, copies: &[BlockCopy]) -> Result<(), GpuError> {
        let mapping: Vec<u8> = copies
            .iter()
            .flat_map(|c| [c.src.0, c.dst.0])
            .flat_map(u32::to_le_bytes)
            .collect();
        let ptr = super::forward::ensure(dev, &mut self.mapping, mapping.len())?;
        dev.upload(ptr, &mapping)?;
        let cfg = geom::copy_blocks(
            self.geom.num_layers as u32,
            copies.len() as u32,
            dev.threads(ThreadsFor::Rows),
        );
        // Resolved here, not at start: copy-on-write copies are rare.
        let kernel = dev.kernel(&format!("copy_blocks_{}", self.dtype.kernel_suffix()))?;
        let args = [
            self.key_ptrs.ptr.arg(),
            self.value_ptrs.ptr.arg(),
            ptr.arg(),
            KernelArg::U32(self.geom.block_elems() as u32),
        ];
        // SAFETY: the address tables hold `num_layers` caches of `num_blocks`
        // blocks of `block_elems` elements; every id was checked in range by
        // `apply`; the scheduler's copy-on-write destinations are freshly
        // allocated blocks, never a source or another pair's destination.
        unsafe { dev.launch(kernel, cfg, &args) }
    }

    /// One block of every layer, K and V, as f32 (tests).
    pub fn read_block(
        &self,
        dev: &mut dyn Device,
        block: usize,
        host: bool,
    ) -> Result<Vec<Vec<f32>>, GpuError> {
        let b = BlockId(block as u32);
        let bytes = self.block_bytes();
        let mut out = Vec::new();
        for (l, kv) in self.layers_kv() {
            let mut raw = vec![0u8; bytes];
            if host {
                if block >= self.num_cpu_blocks {
                    return Err(GpuError::Device(format!("no host block {block}")));
                }
                // Bounce through a device scratch: the host pool is only
                // reachable through the swap copies.
                let tmp = dev.alloc(bytes)?;
                dev.copy_from_host(&self.host, self.host_offset(l, kv, b), tmp.ptr, bytes)?;
                dev.swap_fence()?;
                dev.download(tmp.ptr, &mut raw)?;
                dev.free(tmp)?;
            } else {
                if block >= self.geom.num_blocks {
                    return Err(GpuError::Device(format!("no device block {block}")));
                }
                dev.download(self.device_block(l, kv, b), &mut raw)?;
            }
            out.push(self.dtype.decode(&raw));
        }
        Ok(out)
    }

    /// Overwrites one device block of one layer's K or V (tests).
    pub fn write_block(
        &self,
        dev: &mut dyn Device,
        layer: usize,
        kv: usize,
        block: usize,
        values: &[f32],
    ) -> Result<(), GpuError> {
        if layer >= self.geom.num_layers
            || kv > 1
            || block >= self.geom.num_blocks
            || values.len() != self.geom.block_elems()
        {
            return Err(GpuError::Device("write_block out of range".into()));
        }
        let p = self.device_block(layer, kv, BlockId(block as u32));
        dev.upload(p, &self.dtype.encode(values))
    }
}
