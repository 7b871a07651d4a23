//! The paged KV cache in host memory.
//!
//! Layout (fixed; the GPU kernels use the same): for every layer, one K and
//! one V array of shape `[num_blocks, block_size, num_kv_heads, head_dim]`,
//! row-major f32. Token slot `s = block * block_size + offset` therefore
//! starts at element `s * num_kv_heads * head_dim`, and one block of one
//! layer is a contiguous run of `block_size * num_kv_heads * head_dim`
//! elements, so block copies and swaps are `memcpy`s.
//!
//! A pool is one [`KvCache`]; the accelerator pool and the CPU swap pool are
//! two separate instances of the same geometry.

use crate::executor::ExecError;
use crate::kv::BlockId;

pub use crate::executor::types::KvGeometry;

/// K and V of one layer, each `[num_blocks, block_size, num_kv_heads, head_dim]`.
#[derive(Debug, Clone)]
pub struct LayerKv {
    pub k: Vec<f32>,
    pub v: Vec<f32>,
}

/// One pool of KV blocks (all layers).
#[derive(Debug, Clone)]
pub struct KvCache {
    geometry: KvGeometry,
    layers: Vec<LayerKv>,
}

impl KvCache {
    /// A zeroed pool. Memory: `geometry.num_blocks * bytes_per_block()`.
    pub fn new(geometry: KvGeometry) -> Self {
        let n = geometry.num_blocks * geometry.block_elems();
        let layers = (0..geometry.num_layers)
            .map(|_| LayerKv {
                k: vec![0.0; n],
                v: vec![0.0; n],
            })
            .collect();
        Self { geometry, layers }
    }

    /// The pool's shape.
    pub fn geometry(&self) -> KvGeometry {
        self.geometry
    }

    /// K and V of one layer.
    pub fn layer(&self, layer: usize) -> &LayerKv {
        &self.layers[layer]
    }

    /// K and V of one layer, mutable.
    pub fn layer_mut(&mut self, layer: usize) -> &mut LayerKv {
        &mut self.layers[layer]
    }

    fn check(&self, block: BlockId) -> Result<usize, ExecError> {
        let b = block.0 as usize;
        if b < self.geometry.num_blocks {
            Ok(b)
        } else {
            Err(ExecError::BlockOutOfRange(block))
        }
    }

    /// Copies block `src` to block `dst` inside this pool, all layers, K and V
    /// (copy-on-write).
    pub fn copy_block(&mut self, src: BlockId, dst: BlockId) -> Result<(), ExecError> {
        let (s, d) = (self.check(src)?, self.check(dst)?);
        if s == d {
            return Ok(());
        }
        let e = self.geometry.block_elems();
        for l in &mut self.layers {
            l.k.copy_within(s * e..(s + 1) * e, d * e);
            l.v.copy_within(s * e..(s + 1) * e, d * e);
        }
        Ok(())
    }

    /// Copies block `src` of `from` into block `dst` of `self`, all layers,
    /// K and V (swap in or out). Both pools must share layers and block shape.
    pub fn copy_block_from(
        &mut self,
        from: &KvCache,
        src: BlockId,
        dst: BlockId,
    ) -> Result<(), ExecError> {
        let (g, h) = (self.geometry, from.geometry);
        if g.num_layers != h.num_layers || g.block_elems() != h.block_elems() {
            return Err(ExecError::InvalidBatch(
                "swap between pools of different block shapes".into(),
            ));
        }
        let (s, d) = (from.check(src)?, self.check(dst)?);
        let e = g.block_elems();
        for (to, fr) in self.layers.iter_mut().zip(&from.layers) {
            to.k[d * e..(d + 1) * e].copy_from_slice(&fr.k[s * e..(s + 1) * e]);
            to.v[d * e..(d + 1) * e].copy_from_slice(&fr.v[s * e..(s + 1) * e]);
        }
        Ok(())
    }
}
