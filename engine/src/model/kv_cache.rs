//! The paged KV cache in host memory.
//!
//! Layout (fixed; the GPU kernels use the same): for every layer, one K and
//! one V array of shape `[num_blocks, block_size, num_kv_heads, head_dim]`,
//! row-major. Token slot `s = block * block_size + offset` therefore
//! starts at element `s * num_kv_heads * head_dim`, and one block of one
//! layer is a contiguous run of `block_size * num_kv_heads * head_dim`
//! elements, so block copies and swaps are `memcpy`s.
//!
//! Element type ([`KvDtype`]): f32, or f16 as llama.cpp keeps its cache
//! (half the bytes per token, so half the memory traffic of attention,
//! which reads every cached token of every sequence each step; values are
//! rounded to nearest once, when written). Every layer of a pool has the
//! same type; [`LayerKv`] is the closed enum the attention code dispatches
//! on once per layer.
//!
//! A pool is one [`KvCache`]; the accelerator pool and the CPU swap pool are
//! two separate instances of the same geometry and type.

use std::ops::Range;

use half::f16;

use engine_core::BlockId;
use engine_core::ExecError;

pub use engine_core::KvGeometry;

/// Element type of a CPU KV pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvDtype {
    F32,
    F16,
}

impl KvDtype {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            KvDtype::F32 => 4,
            KvDtype::F16 => 2,
        }
    }

    /// The `--kv-cache-dtype` value naming this type.
    pub fn name(self) -> &'static str {
        match self {
            KvDtype::F32 => "float32",
            KvDtype::F16 => "float16",
        }
    }

    /// `--kv-cache-dtype auto` on the CPU: f16 (as llama.cpp) for a model
    /// whose weights stay quantized, f32 for the float32 reference path.
    pub fn auto(weights_quantized: bool) -> Self {
        if weights_quantized {
            KvDtype::F16
        } else {
            KvDtype::F32
        }
    }
}

/// A type a pool can hold: `f32` or `f16` (sealed).
pub trait KvElem: Copy + Default + Send + Sync + sealed::Sealed + 'static {
    /// Stores `src` into `dst` (same length), rounding to nearest.
    fn store(dst: &mut [Self], src: &[f32]);
    /// The value as f32 (exact).
    fn to_f32(self) -> f32;
    /// `q . k`, in any order of summation (the portable attention path).
    fn dot(q: &[f32], k: &[Self]) -> f32;
    /// True for f16 (the SIMD attention loops widen such values as they
    /// load them; see `attn_rows`).
    const IS_F16: bool;
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for half::f16 {}
}

impl KvElem for f32 {
    const IS_F16: bool = false;

    fn store(dst: &mut [f32], src: &[f32]) {
        dst.copy_from_slice(src);
    }

    fn to_f32(self) -> f32 {
        self
    }

    fn dot(q: &[f32], k: &[f32]) -> f32 {
        super::ops::dot(q, k)
    }
}

impl KvElem for f16 {
    const IS_F16: bool = true;

    fn store(dst: &mut [f16], src: &[f32]) {
        use half::slice::HalfFloatSliceExt;
        dst.convert_from_f32_slice(src);
    }

    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }

    fn dot(q: &[f32], k: &[f16]) -> f32 {
        q.iter().zip(k).map(|(a, b)| a * b.to_f32()).sum()
    }
}

/// K and V of one layer in one element type, each
/// `[num_blocks, block_size, num_kv_heads, head_dim]`.
#[derive(Debug, Clone)]
pub struct Kv<E> {
    pub k: Vec<E>,
    pub v: Vec<E>,
}

/// `n` zeros of `E`, from the allocator's zeroed memory: a large pool is
/// fresh `mmap`ed pages that become resident only when a block is written
/// (`vec![f16::ZERO; n]` would write, and so touch, every page: `Vec` knows
/// only the primitive types are zero bits).
fn zeroed_vec<E: KvElem>(n: usize) -> Vec<E> {
    if n == 0 {
        return Vec::new();
    }
    let layout = std::alloc::Layout::array::<E>(n).expect("KV pool size overflows");
    // SAFETY: `layout` has a non-zero size: `n > 0` (checked above) and `E` (sealed: f32 or f16) is not zero-sized.
    let ptr = unsafe { std::alloc::alloc_zeroed(layout) }.cast::<E>();
    if ptr.is_null() {
        std::alloc::handle_alloc_error(layout);
    }
    // SAFETY: `ptr` was allocated by the global allocator with the layout of
    // `[E; n]` (so `Vec`'s own dealloc matches); every `E` (sealed: f32 or
    // f16) is valid as all-zero bits, which is `E::default()` (+0.0).
    unsafe { Vec::from_raw_parts(ptr, n, n) }
}

impl<E: KvElem> Kv<E> {
    fn zeroed(n: usize) -> Self {
        Self {
            k: zeroed_vec(n),
            v: zeroed_vec(n),
        }
    }

    /// Stores token `t`'s K and V (rows `row_stride` apart in `k`/`v`,
    /// `token_elems` each) at pool slot `slots[t]`, for every `t`.
    fn write(
        &mut self,
        k: &[f32],
        v: &[f32],
        row_stride: usize,
        slots: &[usize],
        token_elems: usize,
    ) {
        for (t, &slot) in slots.iter().enumerate() {
            let dst = slot * token_elems..(slot + 1) * token_elems;
            let src = t * row_stride..t * row_stride + token_elems;
            E::store(&mut self.k[dst.clone()], &k[src.clone()]);
            E::store(&mut self.v[dst], &v[src]);
        }
    }

    fn copy_within(&mut self, src: Range<usize>, dst: usize) {
        self.k.copy_within(src.clone(), dst);
        self.v.copy_within(src, dst);
    }

    fn copy_from(&mut self, from: &Kv<E>, src: Range<usize>, dst: usize) {
        let n = src.len();
        self.k[dst..dst + n].copy_from_slice(&from.k[src.clone()]);
        self.v[dst..dst + n].copy_from_slice(&from.v[src]);
    }
}

/// K and V of one layer (one type per pool; the attention code matches on
/// it once per layer).
#[derive(Debug, Clone)]
pub enum LayerKv {
    F32(Kv<f32>),
    F16(Kv<f16>),
}

impl LayerKv {
    fn zeroed(dtype: KvDtype, n: usize) -> Self {
        match dtype {
            KvDtype::F32 => LayerKv::F32(Kv::zeroed(n)),
            KvDtype::F16 => LayerKv::F16(Kv::zeroed(n)),
        }
    }

    /// The element type.
    pub fn dtype(&self) -> KvDtype {
        match self {
            LayerKv::F32(_) => KvDtype::F32,
            LayerKv::F16(_) => KvDtype::F16,
        }
    }

    /// Writes this step's K and V (`[tokens, num_kv_heads * head_dim]`,
    /// rows `row_stride` apart) at `slots`, rounding to the pool's type.
    /// Panics if a slot lies outside the pool (callers validate first).
    pub fn write(
        &mut self,
        k: &[f32],
        v: &[f32],
        row_stride: usize,
        slots: &[usize],
        token_elems: usize,
    ) {
        match self {
            LayerKv::F32(kv) => kv.write(k, v, row_stride, slots, token_elems),
            LayerKv::F16(kv) => kv.write(k, v, row_stride, slots, token_elems),
        }
    }

    /// K and V elements `range`, as f32 (tests and inspection).
    pub fn read(&self, range: Range<usize>) -> (Vec<f32>, Vec<f32>) {
        fn f<E: KvElem>(kv: &Kv<E>, r: Range<usize>) -> (Vec<f32>, Vec<f32>) {
            let conv = |x: &[E]| x.iter().map(|e| e.to_f32()).collect();
            (conv(&kv.k[r.clone()]), conv(&kv.v[r]))
        }
        match self {
            LayerKv::F32(kv) => f(kv, range),
            LayerKv::F16(kv) => f(kv, range),
        }
    }

    fn copy_within(&mut self, src: Range<usize>, dst: usize) {
        match self {
            LayerKv::F32(kv) => kv.copy_within(src, dst),
            LayerKv::F16(kv) => kv.copy_within(src, dst),
        }
    }

    /// Copies `from`'s elements `src` to `dst..`; `false` (nothing copied)
    /// when the two types differ.
    fn copy_from(&mut self, from: &LayerKv, src: Range<usize>, dst: usize) -> bool {
        match (self, from) {
            (LayerKv::F32(to), LayerKv::F32(fr)) => to.copy_from(fr, src, dst),
            (LayerKv::F16(to), LayerKv::F16(fr)) => to.copy_from(fr, src, dst),
            _ => return false,
        }
        true
    }
}

/// One pool of KV blocks (all layers, one element type).
#[derive(Debug, Clone)]
pub struct KvCache {
    geometry: KvGeometry,
    dtype: KvDtype,
    layers: Vec<LayerKv>,
}

impl KvCache {
    /// A zeroed f32 pool (the reference type).
    pub fn new(geometry: KvGeometry) -> Self {
        Self::with_dtype(geometry, KvDtype::F32)
    }

    /// A zeroed pool of `dtype`. Memory: `geometry.num_blocks *
    /// geometry.bytes_per_block(dtype.size())`.
    pub fn with_dtype(geometry: KvGeometry, dtype: KvDtype) -> Self {
        let n = geometry.num_blocks * geometry.block_elems();
        let layers = (0..geometry.num_layers)
            .map(|_| LayerKv::zeroed(dtype, n))
            .collect();
        Self {
            geometry,
            dtype,
            layers,
        }
    }

    /// The pool's shape.
    pub fn geometry(&self) -> KvGeometry {
        self.geometry
    }

    /// The element type.
    pub fn dtype(&self) -> KvDtype {
        self.dtype
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
            l.copy_within(s * e..(s + 1) * e, d * e);
        }
        Ok(())
    }

    /// Copies block `src` of `from` into block `dst` of `self`, all layers,
    /// K and V (swap in or out). Both pools must share layers, block shape
    /// and element type.
    pub fn copy_block_from(
        &mut self,
        from: &KvCache,
        src: BlockId,
        dst: BlockId,
    ) -> Result<(), ExecError> {
        let (g, h) = (self.geometry, from.geometry);
        if g.num_layers != h.num_layers
            || g.block_elems() != h.block_elems()
            || self.dtype != from.dtype
        {
            return Err(ExecError::InvalidBatch(
                "swap between pools of different block shapes or element types".into(),
            ));
        }
        let (s, d) = (from.check(src)?, self.check(dst)?);
        let e = g.block_elems();
        for (to, fr) in self.layers.iter_mut().zip(&from.layers) {
            let same_type = to.copy_from(fr, s * e..(s + 1) * e, d * e);
            debug_assert!(same_type, "pool types checked above");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zeroed_pools_read_as_zeros() {
        for n in [0, 1, 7, 1 << 20] {
            let h: Vec<f16> = zeroed_vec(n);
            assert_eq!(h.len(), n);
            assert!(h.iter().all(|&x| x == f16::default() && x.to_bits() == 0));
            let f: Vec<f32> = zeroed_vec(n);
            assert!(f.iter().all(|&x| x.to_bits() == 0));
        }
    }

    /// Resident KiB of exactly the pages under `bytes` (`mincore`), so a
    /// neighbour merged into the same mapping (the V array, another test's
    /// buffer written meanwhile) is not counted.
    #[cfg(target_os = "linux")]
    fn resident_kib(bytes: &[u8]) -> u64 {
        extern "C" {
            fn mincore(addr: *mut std::ffi::c_void, len: usize, vec: *mut u8) -> std::ffi::c_int;
        }
        const PAGE: usize = 4096;
        let start = bytes.as_ptr() as usize / PAGE * PAGE;
        let len = bytes.as_ptr() as usize + bytes.len() - start;
        let mut vec = vec![0u8; len.div_ceil(PAGE)];
        // SAFETY: `start..start + len` covers pages of the live allocation
        // `bytes` (rounded down to its first page, which is mapped too);
        // `vec` has one byte per page of that range, as mincore writes.
        let rc = unsafe { mincore(start as *mut _, len, vec.as_mut_ptr()) };
        assert_eq!(rc, 0, "mincore: {}", std::io::Error::last_os_error());
        vec.iter().filter(|&&b| b & 1 == 1).count() as u64 * PAGE as u64 / 1024
    }

    /// A pool's pages become resident only as blocks are written: a 128 MiB
    /// K array (above any allocator's mmap threshold, so fresh pages)
    /// holds almost nothing after allocation and one written block,
    /// and what was written reads back. A writing pass at allocation
    /// (`vec![f16::ZERO; n]`, a warm-up) would make all of it resident.
    #[cfg(target_os = "linux")]
    #[test]
    fn pools_are_resident_only_where_written() {
        let g = KvGeometry {
            num_layers: 1,
            num_blocks: 16384,
            block_size: 16,
            num_kv_heads: 4,
            head_dim: 64,
        };
        let array_kib = (g.num_blocks * g.block_elems() * 2 / 1024) as u64;
        assert_eq!(array_kib, 128 * 1024);
        let mut pool = KvCache::with_dtype(g, KvDtype::F16);
        let k_bytes = |kv: &LayerKv| match kv {
            // SAFETY: viewing the f16 array's initialised memory as bytes.
            LayerKv::F16(kv) => unsafe {
                std::slice::from_raw_parts(kv.k.as_ptr().cast::<u8>(), kv.k.len() * 2)
            },
            LayerKv::F32(_) => unreachable!("an f16 pool"),
        };
        // Exactly the K array's pages: a transparent huge page (2 MiB) may
        // come in with a touched one, so an eighth of the array is the bound.
        let rss = resident_kib(k_bytes(pool.layer(0)));
        assert!(rss < array_kib / 8, "{rss} KiB resident of {array_kib}");

        let te = g.token_elems();
        let slot = 9000 * g.block_size + 3;
        let k: Vec<f32> = (0..te).map(|i| i as f32 * 0.25).collect();
        let v: Vec<f32> = k.iter().map(|x| x + 1.0).collect();
        pool.layer_mut(0).write(&k, &v, te, &[slot], te);
        let (k1, v1) = pool.layer(0).read(slot * te..(slot + 1) * te);
        assert_eq!((k1, v1), (k, v));
        let (k0, v0) = pool.layer(0).read((slot + 1) * te..(slot + 2) * te);
        assert!(k0.iter().chain(&v0).all(|&x| x.to_bits() == 0));
        let rss = resident_kib(k_bytes(pool.layer(0)));
        assert!(rss < array_kib / 8, "{rss} KiB resident after one block");
    }

    fn geom(num_blocks: usize) -> KvGeometry {
        KvGeometry {
            num_layers: 2,
            num_blocks,
            block_size: 4,
            num_kv_heads: 2,
            head_dim: 8,
        }
    }

    #[test]
    fn f16_pool_stores_rounded_values_and_moves_blocks_whole() {
        let g = geom(3);
        let te = g.token_elems();
        let mut pool = KvCache::with_dtype(g, KvDtype::F16);
        // Two tokens at slots 1 and 6 (blocks 0 and 1), rows 2 te apart.
        let k: Vec<f32> = (0..4 * te).map(|i| 0.1 + i as f32 / 3.0).collect();
        let v: Vec<f32> = k.iter().map(|x| -x).collect();
        pool.layer_mut(1).write(&k, &v, 2 * te, &[1, 6], te);
        let (k1, v1) = pool.layer(1).read(te..2 * te);
        for (i, (a, b)) in k1.iter().zip(&v1).enumerate() {
            let want = f16::from_f32(k[i]).to_f32();
            assert_eq!((*a, *b), (want, -want), "element {i}");
            assert!((a - k[i]).abs() <= k[i].abs() * 2f32.powi(-11));
        }
        assert!(pool
            .layer(0)
            .read(0..g.block_elems())
            .0
            .iter()
            .all(|&x| x == 0.0));

        let before = pool.layer(1).read(4 * te..8 * te);
        pool.copy_block(BlockId(1), BlockId(2)).expect("copy");
        assert_eq!(pool.layer(1).read(8 * te..12 * te), before);

        let mut host = KvCache::with_dtype(geom(2), KvDtype::F16);
        host.copy_block_from(&pool, BlockId(0), BlockId(1))
            .expect("swap");
        assert_eq!(
            host.layer(1).read(4 * te..8 * te),
            pool.layer(1).read(0..4 * te)
        );
        assert_eq!(
            g.bytes_per_block(KvDtype::F16.size()) * 2,
            g.bytes_per_block(4)
        );
    }

    #[test]
    fn swap_between_pools_of_different_types_is_an_error() {
        let mut f32_pool = KvCache::new(geom(2));
        let f16_pool = KvCache::with_dtype(geom(2), KvDtype::F16);
        assert!(matches!(
            f32_pool.copy_block_from(&f16_pool, BlockId(0), BlockId(1)),
            Err(ExecError::InvalidBatch(_))
        ));
        assert!(matches!(
            f32_pool.copy_block(BlockId(0), BlockId(2)),
            Err(ExecError::BlockOutOfRange(BlockId(2)))
        ));
    }
}
