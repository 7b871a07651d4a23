//! What the GPU executor needs from a device: memory, copies, kernel launches
//! by name, and GEMMs. Two implementations: [`super::emu::EmuDevice`] (host
//! memory, the `gpu-kernels` host emulator, a plain GEMM; always built, so the
//! executor's orchestration is tested on every machine) and, behind the
//! `cuda` feature, [`super::cuda::CudaDevice`] (cudarc, the PTX, cuBLAS).
//!
//! Addresses are plain `u64`s ([`DevPtr`]): device addresses on CUDA, host
//! addresses on the emulator. A [`DevBuf`] is owned by the device that made it
//! and stays valid until [`Device::free`] or the device is dropped.
//!
//! Ordering contract: operations run in call order on one compute stream,
//! except the swap copies ([`Device::copy_to_host`], [`Device::copy_from_host`]),
//! which run in call order on a swap stream that first waits for all compute
//! issued before them; [`Device::swap_fence`] makes later compute wait for
//! every swap copy issued so far. [`Device::download`] returns only once the
//! data is on the host (so it also waits for earlier compute).
//!
//! Graphs: between [`Device::begin_capture`] and [`Device::end_capture`] the
//! compute stream's launches and GEMMs are recorded, not run (CUDA stream
//! capture); [`Device::launch_graph`] replays them in order with the
//! arguments they had at capture. Nothing else may be called while capturing
//! (no allocation, free, copy or synchronization): a device refuses it with
//! an error rather than recording something it cannot replay.

use super::GpuError;
use gpu_kernels::{KernelArg, LaunchConfig};

/// A device (or emulated) address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct DevPtr(pub u64);

impl DevPtr {
    /// The address `bytes` further on.
    pub fn offset(self, bytes: usize) -> DevPtr {
        DevPtr(self.0 + bytes as u64)
    }

    /// As a pointer kernel argument.
    pub fn arg(self) -> KernelArg {
        KernelArg::Ptr(self.0)
    }
}

/// A device allocation: its slot in the device's table, address and size.
#[derive(Debug, PartialEq, Eq)]
pub struct DevBuf {
    pub(crate) slot: usize,
    /// First byte.
    pub ptr: DevPtr,
    /// Size in bytes.
    pub bytes: usize,
}

/// A host allocation for the swap pool (page-locked on CUDA).
#[derive(Debug, PartialEq, Eq)]
pub struct HostBuf {
    pub(crate) slot: usize,
    /// Size in bytes.
    pub bytes: usize,
}

/// Element type of weights, activations and the KV cache on the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DType {
    F32,
    F16,
    Bf16,
}

impl DType {
    /// Bytes per element.
    pub const fn size(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F16 | DType::Bf16 => 2,
        }
    }

    /// The suffix of the kernel entry points for this type.
    pub const fn kernel_suffix(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::Bf16 => "bf16",
        }
    }

    /// `values` in this type's little-endian bytes (round to nearest even).
    pub fn encode(self, values: &[f32]) -> Vec<u8> {
        let mut out = Vec::with_capacity(values.len() * self.size());
        for &v in values {
            match self {
                DType::F32 => out.extend_from_slice(&v.to_le_bytes()),
                DType::F16 => out.extend_from_slice(&half::f16::from_f32(v).to_le_bytes()),
                DType::Bf16 => out.extend_from_slice(&half::bf16::from_f32(v).to_le_bytes()),
            }
        }
        out
    }

    /// Little-endian bytes of this type back to `f32` (exact).
    pub fn decode(self, bytes: &[u8]) -> Vec<f32> {
        match self {
            DType::F32 => bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
            DType::F16 => bytes
                .chunks_exact(2)
                .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
            DType::Bf16 => bytes
                .chunks_exact(2)
                .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
        }
    }
}

/// `c[m, n] = a[m, k] * b[n, k]^T` (`+ c` with `accumulate`), row-major, `a`
/// and `b` of type `ab`, `c` of type `c_type`, accumulated in `f32`. This is
/// `x W^T` with `W` stored `[out, in]` as the model loader gives it.
#[derive(Clone, Copy, Debug)]
pub struct Gemm {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub a: DevPtr,
    pub b: DevPtr,
    pub c: DevPtr,
    pub ab: DType,
    pub c_type: DType,
    pub accumulate: bool,
}

/// A kernel entry point resolved once by [`Device::kernel`]: launches go by
/// this handle, with no name formatting or lookup per launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Kernel {
    /// Index in `gpu_kernels::KERNELS`.
    pub(crate) index: usize,
    /// The entry point's name.
    pub name: &'static str,
}

impl Kernel {
    /// The entry point `name` of `gpu_kernels::KERNELS`, or an error.
    pub fn find(name: &str) -> Result<Kernel, GpuError> {
        gpu_kernels::KERNELS
            .iter()
            .position(|k| k.name == name)
            .map(|index| Kernel {
                index,
                name: gpu_kernels::KERNELS[index].name,
            })
            .ok_or_else(|| GpuError::ptx(format!("{name} is not a kernel entry point")))
    }
}

/// A captured graph of a [`Device`] (an index in its table of graphs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GraphId(pub(crate) usize);

/// Which launch geometry family a kernel belongs to (threads per block).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ThreadsFor {
    /// Attention kernels.
    Attention,
    /// Row-wise kernels (norms, rotary, cache writes, copies, gathers).
    Rows,
    /// The multi-LoRA kernels (`gpu_kernels::lora`: BGMV and SGMV).
    Lora,
}

/// A device the GPU executor runs on. See the module docs for the ordering
/// contract. Every method returns a typed error instead of panicking.
pub trait Device: Send {
    /// A short description for logs (`"NVIDIA H200 (sm_90)"`, `"emulator"`).
    fn describe(&self) -> String;

    /// Threads per block for a kernel family (a multiple of 32).
    fn threads(&self, family: ThreadsFor) -> u32;

    /// Most dynamic shared memory one block may use, in bytes.
    fn max_shared_bytes(&self) -> usize;

    /// Streaming multiprocessors, for the decode planner
    /// (`gpu_kernels::launch::plan_decode`): 132 on an H200.
    fn sm_count(&self) -> u32;

    /// `(free, total)` device memory in bytes, where the device can tell.
    fn mem_info(&self) -> Option<(usize, usize)>;

    /// A zeroed device allocation of `bytes` (at least 256-byte aligned).
    fn alloc(&mut self, bytes: usize) -> Result<DevBuf, GpuError>;

    /// Returns an allocation.
    fn free(&mut self, buf: DevBuf) -> Result<(), GpuError>;

    /// A zeroed host allocation for swapped-out blocks.
    fn alloc_host(&mut self, bytes: usize) -> Result<HostBuf, GpuError>;

    /// Copies `src` to device address `dst` (compute stream; `src` may be
    /// reused when this returns).
    fn upload(&mut self, dst: DevPtr, src: &[u8]) -> Result<(), GpuError>;

    /// Copies device bytes at `src` into `dst`, after all earlier compute.
    fn download(&mut self, src: DevPtr, dst: &mut [u8]) -> Result<(), GpuError>;

    /// Swap stream: `bytes` from device `src` to `host` at `host_offset`.
    fn copy_to_host(
        &mut self,
        src: DevPtr,
        host: &HostBuf,
        host_offset: usize,
        bytes: usize,
    ) -> Result<(), GpuError>;

    /// Swap stream: `bytes` from `host` at `host_offset` to device `dst`.
    fn copy_from_host(
        &mut self,
        host: &HostBuf,
        host_offset: usize,
        dst: DevPtr,
        bytes: usize,
    ) -> Result<(), GpuError>;

    /// Later compute waits for every swap copy issued so far.
    fn swap_fence(&mut self) -> Result<(), GpuError>;

    /// Resolves entry point `name` (checked against `gpu_kernels::KERNELS`;
    /// loaded from the PTX on CUDA). Called once per kernel at start.
    fn kernel(&mut self, name: &str) -> Result<Kernel, GpuError>;

    /// Launches a kernel resolved by [`Device::kernel`].
    ///
    /// # Safety
    /// The kernel's `# Safety` section: every pointer argument addresses a
    /// live allocation of this device large enough for the accesses `cfg`
    /// and the scalars imply.
    unsafe fn launch(
        &mut self,
        kernel: Kernel,
        cfg: LaunchConfig,
        args: &[KernelArg],
    ) -> Result<(), GpuError>;

    /// Runs one GEMM (see [`Gemm`]).
    ///
    /// # Safety
    /// `a`, `b` and `c` address live allocations of this device holding at
    /// least `m*k`, `n*k` and `m*n` elements of their types.
    unsafe fn gemm(&mut self, g: &Gemm) -> Result<(), GpuError>;

    /// Waits for all work issued so far.
    fn synchronize(&mut self) -> Result<(), GpuError>;

    /// Starts recording the compute stream's launches and GEMMs instead of
    /// running them (see the module docs).
    fn begin_capture(&mut self) -> Result<(), GpuError>;

    /// Stops recording and returns the recorded work as a graph.
    fn end_capture(&mut self) -> Result<GraphId, GpuError>;

    /// Runs a captured graph on the compute stream (one launch).
    ///
    /// # Safety
    /// Every buffer the graph's launches and GEMMs address is still live and
    /// as large as at capture (the executor replays only while its buffers'
    /// addresses and sizes are those the graph was captured with).
    unsafe fn launch_graph(&mut self, graph: GraphId) -> Result<(), GpuError>;

    /// Releases a captured graph.
    fn drop_graph(&mut self, graph: GraphId) -> Result<(), GpuError>;

    /// Whether [`Device::all_reduce_sum`] works here: a collective library
    /// of the device's own is attached (NCCL on CUDA). Without one, the
    /// executor sums through the host.
    fn has_all_reduce(&self) -> bool {
        false
    }

    /// Tensor parallelism: sums `count` values of `dtype` at `buf` over the
    /// ranks, in place, on the compute stream (recorded while capturing a
    /// graph, as NCCL's calls are). Only where [`Device::has_all_reduce`].
    fn all_reduce_sum(&mut self, buf: DevPtr, count: usize, dtype: DType) -> Result<(), GpuError> {
        let _ = (buf, count, dtype);
        Err(GpuError::Unsupported(
            "a device all-reduce (no collective library attached)".into(),
        ))
    }
}
