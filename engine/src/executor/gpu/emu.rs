//! [`EmuDevice`]: the GPU executor's device on the host. Memory is host
//! memory, kernels run on the `gpu-kernels` host emulator (the very source
//! that becomes the PTX), GEMMs widen the stored element types to `f32` and run
//! the CPU backend's GEMM. Streams are trivially ordered: everything runs
//! synchronously in call order, which satisfies the device ordering contract.
//!
//! It exists so that the executor's orchestration (buffer layouts, kernel
//! arguments, launch geometry, block copies, swap) is tested on every machine;
//! it is far too slow to serve with (one OS thread per emulated GPU thread).
//!
//! Graphs: capture records each launch (entry, geometry, argument values) and
//! GEMM without running it; a replay runs the recorded list in order, so a
//! test can check that a replayed step equals the eager one, including after
//! the inputs changed in place. Every other call while capturing is an error
//! (CUDA's stream capture would refuse or mis-record it), except the
//! device all-reduce of [`EmuDevice::with_collective`], which is recorded
//! and replayed as NCCL's is in a CUDA graph.

use super::device::{DType, DevBuf, DevPtr, Device, Gemm, GraphId, HostBuf, Kernel, ThreadsFor};
use super::GpuError;
use crate::dist::Collective;
use gpu_kernels::{KernelArg, LaunchConfig};
use std::sync::Arc;

/// Threads per block on the emulator (one warp keeps it quick).
const EMU_THREADS: u32 = 32;

/// One recorded operation of a graph.
#[derive(Clone, Debug)]
enum Op {
    Launch(Kernel, LaunchConfig, Vec<KernelArg>),
    Gemm(Gemm),
    AllReduce(DevPtr, usize, DType),
}

/// The host-emulated device. See the module docs.
#[derive(Default)]
pub struct EmuDevice {
    /// Device allocations; `u128` elements give 16-byte alignment.
    mem: Vec<Option<Vec<u128>>>,
    host: Vec<Vec<u8>>,
    /// Kernel launches run so far, replayed ones included (tests read it).
    pub launches: usize,
    /// Graphs captured and graph launches so far (tests read them).
    pub captures: usize,
    pub graph_launches: usize,
    /// The graph being recorded.
    capture: Option<Vec<Op>>,
    graphs: Vec<Option<Vec<Op>>>,
    /// The device's own all-reduce across tensor-parallel ranks
    /// ([`EmuDevice::with_collective`]).
    comm: Option<Arc<dyn Collective>>,
}

impl EmuDevice {
    /// An empty emulated device.
    pub fn new() -> Self {
        Self::default()
    }

    /// A device whose own all-reduce ([`Device::all_reduce_sum`]) sums over
    /// `comm`'s ranks: it stands for NCCL on a GPU, so that the executor's
    /// path with a device collective (the all-reduces inside a captured
    /// graph included) runs without one.
    pub fn with_collective(mut self, comm: Arc<dyn Collective>) -> Self {
        self.comm = Some(comm);
        self
    }

    /// Sums `count` values of `t` at `p` over the ranks, now.
    fn run_all_reduce(&mut self, p: DevPtr, count: usize, t: DType) -> Result<(), GpuError> {
        let comm = self
            .comm
            .clone()
            .ok_or_else(|| GpuError::Unsupported("a device all-reduce without ranks".into()))?;
        let mut values = self.read(p, count, t)?;
        comm.all_reduce_sum(&mut values)
            .map_err(|e| GpuError::Collective(engine_core::Report(&e).to_string()))?;
        self.region(p, count * t.size())?
            .copy_from_slice(&t.encode(&values));
        Ok(())
    }

    /// The allocation holding `[p, p + bytes)`, as a byte slice, or an error.
    fn region(&mut self, p: DevPtr, bytes: usize) -> Result<&mut [u8], GpuError> {
        for buf in self.mem.iter_mut().flatten() {
            let base = buf.as_ptr() as u64;
            let len = (buf.len() * 16) as u64;
            if p.0 >= base && p.0 + bytes as u64 <= base + len {
                let off = (p.0 - base) as usize;
                // SAFETY: `buf` is a live Vec<u128> of `len` bytes; viewing its
                // storage as bytes is valid (u8 has no alignment or validity
                // requirements) and the borrow of `buf` covers the slice's life.
                let all = unsafe {
                    std::slice::from_raw_parts_mut(buf.as_mut_ptr().cast::<u8>(), len as usize)
                };
                return Ok(&mut all[off..off + bytes]);
            }
        }
        Err(GpuError::Device(format!(
            "emulator: {bytes} bytes at {:#x} are outside every allocation",
            p.0
        )))
    }

    fn host_region(
        &mut self,
        h: &HostBuf,
        off: usize,
        bytes: usize,
    ) -> Result<&mut [u8], GpuError> {
        let buf = self
            .host
            .get_mut(h.slot)
            .ok_or_else(|| GpuError::Device("emulator: unknown host buffer".into()))?;
        buf.get_mut(off..off + bytes).ok_or_else(|| {
            GpuError::Device(format!(
                "emulator: host copy of {bytes} bytes at {off} past a {}-byte buffer",
                h.bytes
            ))
        })
    }

    /// An error if a graph is being captured (`what` may not be recorded).
    fn not_capturing(&self, what: &str) -> Result<(), GpuError> {
        match self.capture {
            Some(_) => Err(GpuError::Device(format!(
                "emulator: {what} while capturing a graph"
            ))),
            None => Ok(()),
        }
    }

    /// Runs one launch now.
    ///
    /// # Safety
    /// As [`Device::launch`].
    unsafe fn run_launch(
        &mut self,
        kernel: Kernel,
        cfg: LaunchConfig,
        args: &[KernelArg],
    ) -> Result<(), GpuError> {
        self.launches += 1;
        let name = kernel.name;
        // SAFETY: forwarded from the caller: every pointer argument addresses
        // one of this device's live host allocations, sized for the launch.
        unsafe { gpu_kernels::entries::emulate(name, cfg, args) }
            .map_err(|e| GpuError::Device(format!("emulator launch of {name}: {e:?}")))
    }

    fn run_gemm(&mut self, g: &Gemm) -> Result<(), GpuError> {
        let a = self.read(g.a, g.m * g.k, g.ab)?;
        let b = self.read(g.b, g.n * g.k, g.ab)?;
        let mut c = if g.accumulate {
            self.read(g.c, g.m * g.n, g.c_type)?
        } else {
            vec![0.0; g.m * g.n]
        };
        // A plain GEMM on the widened values with f32 accumulation, as cuBLAS's
        // CUBLAS_COMPUTE_32F (the summation order differs from the CPU
        // backend's, as it would on a GPU).
        for (i, c_row) in c.chunks_exact_mut(g.n).enumerate() {
            let a_row = &a[i * g.k..(i + 1) * g.k];
            for (j, out) in c_row.iter_mut().enumerate() {
                let b_row = &b[j * g.k..(j + 1) * g.k];
                *out += a_row.iter().zip(b_row).map(|(x, y)| x * y).sum::<f32>();
            }
        }
        let bytes = g.c_type.encode(&c);
        self.region(g.c, bytes.len())?.copy_from_slice(&bytes);
        Ok(())
    }

    fn read(&mut self, p: DevPtr, elems: usize, t: DType) -> Result<Vec<f32>, GpuError> {
        Ok(t.decode(self.region(p, elems * t.size())?))
    }
}

impl Device for EmuDevice {
    fn describe(&self) -> String {
        "gpu-kernels host emulator".into()
    }

    fn threads(&self, _family: ThreadsFor) -> u32 {
        EMU_THREADS
    }

    fn max_shared_bytes(&self) -> usize {
        // The emulator's shared memory is a heap buffer; mirror a CUDA
        // device's opt-in limit so the same inputs fail the same way.
        227 * 1024
    }

    fn sm_count(&self) -> u32 {
        // A small device, so that the planner's split-K path runs in the
        // emulated tests as often as the single pass.
        4
    }

    fn mem_info(&self) -> Option<(usize, usize)> {
        None
    }

    fn alloc(&mut self, bytes: usize) -> Result<DevBuf, GpuError> {
        self.not_capturing("alloc")?;
        let v = vec![0u128; bytes.div_ceil(16).max(1)];
        let ptr = DevPtr(v.as_ptr() as u64);
        self.mem.push(Some(v));
        Ok(DevBuf {
            slot: self.mem.len() - 1,
            ptr,
            bytes,
        })
    }

    fn free(&mut self, buf: DevBuf) -> Result<(), GpuError> {
        self.not_capturing("free")?;
        match self.mem.get_mut(buf.slot) {
            Some(s @ Some(_)) => {
                *s = None;
                Ok(())
            }
            _ => Err(GpuError::Device("emulator: double free".into())),
        }
    }

    fn alloc_host(&mut self, bytes: usize) -> Result<HostBuf, GpuError> {
        self.host.push(vec![0u8; bytes]);
        Ok(HostBuf {
            slot: self.host.len() - 1,
            bytes,
        })
    }

    fn upload(&mut self, dst: DevPtr, src: &[u8]) -> Result<(), GpuError> {
        self.not_capturing("upload")?;
        self.region(dst, src.len())?.copy_from_slice(src);
        Ok(())
    }

    fn download(&mut self, src: DevPtr, dst: &mut [u8]) -> Result<(), GpuError> {
        self.not_capturing("download")?;
        dst.copy_from_slice(self.region(src, dst.len())?);
        Ok(())
    }

    fn copy_to_host(
        &mut self,
        src: DevPtr,
        host: &HostBuf,
        host_offset: usize,
        bytes: usize,
    ) -> Result<(), GpuError> {
        self.not_capturing("copy_to_host")?;
        let data = self.region(src, bytes)?.to_vec();
        self.host_region(host, host_offset, bytes)?
            .copy_from_slice(&data);
        Ok(())
    }

    fn copy_from_host(
        &mut self,
        host: &HostBuf,
        host_offset: usize,
        dst: DevPtr,
        bytes: usize,
    ) -> Result<(), GpuError> {
        self.not_capturing("copy_from_host")?;
        let data = self.host_region(host, host_offset, bytes)?.to_vec();
        self.region(dst, bytes)?.copy_from_slice(&data);
        Ok(())
    }

    fn swap_fence(&mut self) -> Result<(), GpuError> {
        self.not_capturing("swap_fence")
    }

    fn kernel(&mut self, name: &str) -> Result<Kernel, GpuError> {
        Kernel::find(name)
    }

    unsafe fn launch(
        &mut self,
        kernel: Kernel,
        cfg: LaunchConfig,
        args: &[KernelArg],
    ) -> Result<(), GpuError> {
        if let Some(ops) = &mut self.capture {
            ops.push(Op::Launch(kernel, cfg, args.to_vec()));
            return Ok(());
        }
        // SAFETY: forwarded from the caller.
        unsafe { self.run_launch(kernel, cfg, args) }
    }

    unsafe fn gemm(&mut self, g: &Gemm) -> Result<(), GpuError> {
        if let Some(ops) = &mut self.capture {
            ops.push(Op::Gemm(*g));
            return Ok(());
        }
        self.run_gemm(g)
    }

    fn synchronize(&mut self) -> Result<(), GpuError> {
        self.not_capturing("synchronize")
    }

    fn begin_capture(&mut self) -> Result<(), GpuError> {
        self.not_capturing("begin_capture")?;
        self.capture = Some(Vec::new());
        Ok(())
    }

    fn end_capture(&mut self) -> Result<GraphId, GpuError> {
        let ops = self
            .capture
            .take()
            .ok_or_else(|| GpuError::Device("emulator: end_capture without begin".into()))?;
        self.captures += 1;
        self.graphs.push(Some(ops));
        Ok(GraphId(self.graphs.len() - 1))
    }

    unsafe fn launch_graph(&mut self, graph: GraphId) -> Result<(), GpuError> {
        self.not_capturing("launch_graph")?;
        let ops = self
            .graphs
            .get(graph.0)
            .and_then(Option::as_ref)
            .ok_or_else(|| GpuError::Device("emulator: unknown graph".into()))?
            .clone();
        self.graph_launches += 1;
        for op in &ops {
            match op {
                // SAFETY: the caller guarantees every buffer the graph
                // addresses is live and as large as at capture, when the
                // launch's own contract held.
                Op::Launch(k, cfg, args) => unsafe { self.run_launch(*k, *cfg, args) }?,
                Op::Gemm(g) => self.run_gemm(g)?,
                Op::AllReduce(p, count, t) => self.run_all_reduce(*p, *count, *t)?,
            }
        }
        Ok(())
    }

    fn drop_graph(&mut self, graph: GraphId) -> Result<(), GpuError> {
        match self.graphs.get_mut(graph.0) {
            Some(g @ Some(_)) => {
                *g = None;
                Ok(())
            }
            _ => Err(GpuError::Device("emulator: unknown graph".into())),
        }
    }

    fn has_all_reduce(&self) -> bool {
        self.comm.is_some()
    }

    fn all_reduce_sum(&mut self, buf: DevPtr, count: usize, dtype: DType) -> Result<(), GpuError> {
        if let Some(ops) = &mut self.capture {
            ops.push(Op::AllReduce(buf, count, dtype));
            return Ok(());
        }
        self.run_all_reduce(buf, count, dtype)
    }
}
