//! [`CudaDevice`] (feature `cuda`): the GPU executor's device on a real GPU
//! through `cudarc` with dynamic loading, so this compiles on machines without
//! CUDA and fails at run time with [`GpuError::Unavailable`] instead.
//!
//! - Kernels: the PTX `cargo xtask build-ptx` writes
//!   (`target/ptx/<sm_80|sm_90>/gpu_kernels.ptx`, or `$PAGED_ENGINE_PTX_DIR/<arch>/`),
//!   loaded once; each entry is loaded when the executor resolves it
//!   ([`Device::kernel`], once at start) into a table indexed like
//!   `gpu_kernels::KERNELS`; a launch indexes that table (no name lookup) and
//!   checks its arguments against the entry's signature (a slice compare).
//! - cuBLAS: found by [`super::cublas_path`] (CUDA 12 or 13, wheel folders
//!   included) and opened before cudarc asks for it.
//! - GEMMs: cuBLAS `GemmEx`, f32 accumulation (`CUBLAS_COMPUTE_32F`).
//! - Context binding: once per thread. [`CudaDevice`] remembers, per thread
//!   (a thread-local), which context it last made current there; a call on a
//!   thread where it is already current costs one thread-local read and no
//!   driver call. Whichever thread calls (the engine may move the executor to
//!   a worker thread) binds on its first call. The hot path (launches, GEMMs,
//!   copies, synchronizations, graph launches) uses cudarc's raw `result`
//!   calls, which do not re-bind as cudarc's safe wrappers do at every call.
//!   Assumes nothing else in the process makes another context current on
//!   that thread (nothing does: the engine has one device).
//! - Graphs: [`Device::begin_capture`] is cudarc's stream capture of the
//!   compute stream (thread-local mode); cuBLAS gets a fixed 32 MiB workspace
//!   so that no GEMM allocates while captured. Everything but launches and
//!   GEMMs is refused while capturing.
//! - Streams: one compute stream (cuBLAS is bound to it) and one swap stream
//!   for the host<->device block copies, ordered by events as the
//!   [`Device`] contract says. Host swap memory is page-locked (`cuMemHostAlloc`).
//!
//! NOTE: written and compiled without a GPU (none was lent to this task);
//! the orchestration it serves is tested on [`super::EmuDevice`], but this
//! file's driver calls have not yet run on hardware.

use super::device::GraphId;
use super::device::{DType, DevBuf, DevPtr, Device, Gemm, HostBuf, Kernel, ThreadsFor};
use super::GpuError;
use cudarc::cublas::{self, CudaBlas};
use cudarc::driver::{result, sys, CudaContext, CudaFunction, CudaGraph, CudaModule, CudaStream};
use cudarc::nvrtc::Ptx;
use gpu_kernels::{check_args, KernelArg, KernelSig, LaunchConfig};
use std::cell::Cell;
use std::path::PathBuf;
use std::sync::Arc;

/// Page-locked staging for small uploads (a 256-sequence step's metadata is
/// about 75 KB).
const STAGING_BYTES: usize = 4 << 20;

/// cuBLAS workspace, set once so that captured GEMMs never allocate
/// (NVIDIA's advice for Hopper is 32 MiB).
const CUBLAS_WORKSPACE_BYTES: usize = 32 << 20;

thread_local! {
    /// The `CUcontext` (as an address) a [`CudaDevice`] last made current on
    /// this thread; 0 when none.
    static BOUND: Cell<usize> = const { Cell::new(0) };
}

/// Finds a CUDA driver and device `ordinal` without touching CUDA when the
/// driver library is absent (cudarc's loader would panic otherwise).
pub fn probe(ordinal: usize) -> Result<Arc<CudaContext>, GpuError> {
    // SAFETY: only tries to dlopen the driver library's candidate names.
    if !unsafe { sys::is_culib_present() } {
        return Err(GpuError::unavailable(
            "the CUDA driver library (libcuda) was not found",
        ));
    }
    CudaContext::new(ordinal).map_err(|e| GpuError::Unavailable {
        reason: format!("CUDA device {ordinal} unusable"),
        source: Some(engine_core::cause(e)),
    })
}

/// Where the PTX for `arch` is: `$PAGED_ENGINE_PTX_DIR/<arch>/gpu_kernels.ptx`,
/// else the workspace's `target/ptx/<arch>/gpu_kernels.ptx`.
pub fn ptx_path(arch: &str) -> PathBuf {
    let dir = std::env::var_os("PAGED_ENGINE_PTX_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/ptx"));
    dir.join(arch).join("gpu_kernels.ptx")
}

/// Page-locked host memory.
struct Pinned {
    ptr: *mut u8,
    bytes: usize,
}

/// A GPU. See the module docs.
pub struct CudaDevice {
    ctx: Arc<CudaContext>,
    compute: Arc<CudaStream>,
    swap: Arc<CudaStream>,
    module: Arc<CudaModule>,
    /// Loaded entry points, indexed like `gpu_kernels::KERNELS`.
    funcs: Vec<Option<(KernelSig, CudaFunction)>>,
    blas: CudaBlas,
    mem: Vec<Option<(sys::CUdeviceptr, usize)>>,
    host: Vec<Option<Pinned>>,
    /// The swap stream must wait for compute issued since the last swap copy.
    swap_stale: bool,
    /// Page-locked staging of small uploads (see [`CudaDevice::upload`]);
    /// bytes `..staged` are in flight until the next compute synchronization.
    staging: Option<Pinned>,
    staged: usize,
    describe: String,
    max_shared: usize,
    /// Streaming multiprocessors (the decode planner's input).
    sm_count: u32,
    /// cuBLAS's fixed workspace (device memory, freed on drop).
    blas_workspace: sys::CUdeviceptr,
    /// Captured graphs (indexed by [`GraphId`]) and whether one is recording.
    graphs: Vec<Option<CudaGraph>>,
    capturing: bool,
    /// The tensor-parallel communicator, once [`CudaDevice::join_nccl`] ran.
    nccl: Option<super::nccl::Nccl>,
}

// SAFETY: the raw host pointers are page-locked allocations owned by this
// device and only touched through `&mut self`; the CUDA handles (graphs
// included, which CUDA requires be used by one thread at a time: `&mut self`
// serializes them) are usable from any thread once the context is bound
// there (every method binds it first, once per thread).
unsafe impl Send for CudaDevice {}

impl CudaDevice {
    /// Opens device `ordinal`, loads the PTX for its architecture and cuBLAS.
    pub fn new(ordinal: usize) -> Result<Self, GpuError> {
        let ctx = probe(ordinal)?;
        let (major, minor) = ctx
            .compute_capability()
            .map_err(GpuError::driver("cuDeviceComputeCapability"))?;
        if major < 8 {
            return Err(GpuError::Unsupported(format!(
                "compute capability {major}.{minor}: the kernels need sm_80 or newer (bf16)"
            )));
        }
        let arch = if major >= 9 { "sm_90" } else { "sm_80" };
        let path = ptx_path(arch);
        let text = std::fs::read_to_string(&path).map_err(|e| GpuError::Ptx {
            what: format!(
                "{} (run `cargo xtask build-ptx`, or set PAGED_ENGINE_PTX_DIR)",
                path.display()
            ),
            source: Some(engine_core::cause(e)),
        })?;
        let module = ctx
            .load_module(Ptx::from_src(text))
            .map_err(|e| GpuError::Ptx {
                what: path.display().to_string(),
                source: Some(engine_core::cause(e)),
            })?;
        preload_cublas()?;
        let compute = ctx
            .new_stream()
            .map_err(GpuError::driver("cuStreamCreate"))?;
        let swap = ctx
            .new_stream()
            .map_err(GpuError::driver("cuStreamCreate"))?;
        let blas = CudaBlas::new(compute.clone()).map_err(GpuError::driver("cublasCreate"))?;
        // SAFETY: a plain allocation, owned by the device until drop.
        let blas_workspace =
            unsafe { result::malloc_sync(CUBLAS_WORKSPACE_BYTES) }.map_err(|e| {
                GpuError::OutOfMemory {
                    what: "cuBLAS workspace".into(),
                    source: Some(engine_core::cause(e)),
                }
            })?;
        // SAFETY: the handle is live; the workspace is a device allocation of
        // the size given, kept until the device (and the handle) drop. Set
        // after the handle's stream, since setting a stream resets it.
        let status = unsafe {
            cublas::sys::cublasSetWorkspace_v2(
                *blas.handle(),
                blas_workspace as *mut _,
                CUBLAS_WORKSPACE_BYTES,
            )
        };
        if status != cublas::sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
            return Err(GpuError::Device(format!("cublasSetWorkspace: {status:?}")));
        }
        let optin = ctx
            .attribute(
                sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
            )
            .map_err(GpuError::driver("cuDeviceGetAttribute"))? as usize;
        let sm_count = ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(GpuError::driver("cuDeviceGetAttribute"))?
            .max(1) as u32;
        let name = ctx.name().map_err(GpuError::driver("cuDeviceGetName"))?;
        Ok(Self {
            describe: format!("{name} ({arch}, {})", path.display()),
            ctx,
            compute,
            swap,
            module,
            funcs: vec![None; gpu_kernels::KERNELS.len()],
            blas,
            mem: Vec::new(),
            host: Vec::new(),
            swap_stale: true,
            staging: None,
            staged: 0,
            // The attention kernels' static shared memory is about 1.2 KB.
            max_shared: optin.saturating_sub(2048),
            sm_count,
            blas_workspace,
            graphs: Vec::new(),
            capturing: false,
            nccl: None,
        })
    }

    /// Joins the NCCL communicator of the tensor-parallel ranks `comm`
    /// connects (every rank at the same point; see [`super::nccl`]); from
    /// then on [`Device::all_reduce_sum`] runs on NCCL. An error leaves the
    /// device without it (the executor then sums through the host).
    pub fn join_nccl(&mut self, comm: &dyn crate::dist::Collective) -> Result<(), GpuError> {
        self.bind()?;
        self.nccl = Some(super::nccl::Nccl::join(comm)?);
        Ok(())
    }

    /// Makes the context current on the calling thread, once per thread (see
    /// the module docs).
    fn bind(&self) -> Result<(), GpuError> {
        let ctx = self.ctx.cu_ctx() as usize;
        if BOUND.with(Cell::get) == ctx {
            return Ok(());
        }
        self.ctx
            .bind_to_thread()
            .map_err(GpuError::driver("cuCtxSetCurrent"))?;
        BOUND.with(|b| b.set(ctx));
        Ok(())
    }

    /// An error while a graph is being captured (`what` cannot be recorded).
    fn not_capturing(&self, what: &str) -> Result<(), GpuError> {
        if self.capturing {
            return Err(GpuError::Device(format!("{what} while capturing a graph")));
        }
        Ok(())
    }

    /// Waits for the compute stream (bound already).
    fn sync_compute(&mut self) -> Result<(), GpuError> {
        // SAFETY: the stream is live for the device's life.
        unsafe { result::stream::synchronize(self.compute.cu_stream()) }
            .map_err(GpuError::driver("cuStreamSynchronize"))?;
        self.staged = 0;
        Ok(())
    }

    fn host_slice(&mut self, h: &HostBuf, off: usize, bytes: usize) -> Result<&mut [u8], GpuError> {
        let p = self
            .host
            .get(h.slot)
            .and_then(Option::as_ref)
            .ok_or_else(|| GpuError::Device("unknown host buffer".into()))?;
        if off + bytes > p.bytes {
            return Err(GpuError::Device(format!(
                "host copy of {bytes} bytes at {off} past a {}-byte buffer",
                p.bytes
            )));
        }
        // SAFETY: `[off, off + bytes)` lies inside the live page-locked
        // allocation, borrowed mutably through `&mut self`.
        Ok(unsafe { std::slice::from_raw_parts_mut(p.ptr.add(off), bytes) })
    }

    fn swap_after_compute(&mut self) -> Result<(), GpuError> {
        if self.swap_stale {
            self.swap
                .join(&self.compute)
                .map_err(GpuError::driver("cuStreamWaitEvent"))?;
            self.swap_stale = false;
        }
        Ok(())
    }
}

/// Opens the cuBLAS that [`super::cublas_path::find_cublas`] finds by its
/// absolute path and keeps it loaded for the life of the process, so that
/// cudarc's bare-name `dlopen` (`libcublas.so.13` / `.so.12`, see that module)
/// gets this object through its SONAME. When our search finds nothing,
/// cudarc's own search through the dynamic linker is the last try; if that
/// fails too, the error names every path we tried.
fn preload_cublas() -> Result<(), GpuError> {
    use super::cublas_path::{find_cublas, SearchEnv};
    match find_cublas(&SearchEnv::from_process()) {
        Ok(path) => {
            // SAFETY: loading cuBLAS runs only its own initializers, which
            // have no preconditions on this process.
            let lib =
                unsafe { libloading::Library::new(&path) }.map_err(|e| GpuError::Unavailable {
                    reason: format!("cuBLAS at {}", path.display()),
                    source: Some(engine_core::cause(e)),
                })?;
            // Stays loaded for the process: cudarc's handle refers to it.
            std::mem::forget(lib);
            // SAFETY: only dlopens cuBLAS's candidate names.
            if unsafe { cublas::sys::is_culib_present() } {
                tracing::info!(path = %path.display(), "cuBLAS loaded");
                Ok(())
            } else {
                Err(GpuError::unavailable(format!(
                    "loaded cuBLAS from {}, but its SONAME is none of the names cudarc asks for ({:?})",
                    path.display(),
                    cudarc::get_lib_name_candidates("cublas")
                )))
            }
        }
        // SAFETY: only dlopens cuBLAS's candidate names.
        Err(e) if !unsafe { cublas::sys::is_culib_present() } => Err(e),
        Err(_) => Ok(()),
    }
}

fn cuda_type(t: DType) -> cublas::sys::cudaDataType {
    match t {
        DType::F32 => cublas::sys::cudaDataType::CUDA_R_32F,
        DType::F16 => cublas::sys::cudaDataType::CUDA_R_16F,
        DType::Bf16 => cublas::sys::cudaDataType::CUDA_R_16BF,
    }
}

impl Device for CudaDevice {
    fn describe(&self) -> String {
        self.describe.clone()
    }

    fn threads(&self, family: ThreadsFor) -> u32 {
        match family {
            ThreadsFor::Attention => gpu_kernels::launch::ATTN_THREADS,
            ThreadsFor::Rows => gpu_kernels::launch::ROW_THREADS,
            ThreadsFor::Lora => gpu_kernels::launch::LORA_THREADS,
        }
    }

    fn max_shared_bytes(&self) -> usize {
        self.max_shared
    }

    fn sm_count(&self) -> u32 {
        self.sm_count
    }

    fn mem_info(&self) -> Option<(usize, usize)> {
        self.ctx.mem_get_info().ok()
    }

    fn alloc(&mut self, bytes: usize) -> Result<DevBuf, GpuError> {
        self.not_capturing("alloc")?;
        self.bind()?;
        let n = bytes.max(1);
        // SAFETY: a plain allocation, zeroed before use.
        let ptr = unsafe { result::malloc_sync(n) }.map_err(|e| GpuError::OutOfMemory {
            what: format!("{n} bytes"),
            source: Some(engine_core::cause(e)),
        })?;
        // SAFETY: `ptr` is a fresh allocation of `n` bytes.
        unsafe { result::memset_d8_sync(ptr, 0, n) }.map_err(GpuError::driver("cuMemsetD8"))?;
        self.mem.push(Some((ptr, n)));
        Ok(DevBuf {
            slot: self.mem.len() - 1,
            ptr: DevPtr(ptr),
            bytes,
        })
    }

    fn free(&mut self, buf: DevBuf) -> Result<(), GpuError> {
        self.not_capturing("free")?;
        self.bind()?;
        self.synchronize()?;
        let (ptr, _) = self
            .mem
            .get_mut(buf.slot)
            .and_then(Option::take)
            .ok_or_else(|| GpuError::Device("double free".into()))?;
        // SAFETY: `ptr` came from `malloc_sync` and no work uses it any more
        // (synchronized above).
        unsafe { result::free_sync(ptr) }.map_err(GpuError::driver("cuMemFree"))
    }

    fn alloc_host(&mut self, bytes: usize) -> Result<HostBuf, GpuError> {
        self.bind()?;
        let n = bytes.max(1);
        // SAFETY: page-locked allocation of `n` bytes, zeroed right after.
        let ptr = unsafe { result::malloc_host(n, 0) }.map_err(|e| GpuError::OutOfMemory {
            what: format!("{n} bytes of pinned host memory"),
            source: Some(engine_core::cause(e)),
        })? as *mut u8;
        // SAFETY: `ptr` addresses `n` writable bytes.
        unsafe { std::ptr::write_bytes(ptr, 0, n) };
        self.host.push(Some(Pinned { ptr, bytes: n }));
        Ok(HostBuf {
            slot: self.host.len() - 1,
            bytes,
        })
    }

    /// Small uploads (a step's metadata) are copied into a page-locked staging
    /// buffer and sent asynchronously on the compute stream, no host wait;
    /// the buffer is bump-allocated and reclaimed at the next compute
    /// synchronization (the step's download), or by a synchronization here
    /// when full. Large uploads (weights at load) stay synchronous.
    fn upload(&mut self, dst: DevPtr, src: &[u8]) -> Result<(), GpuError> {
        self.not_capturing("upload")?;
        self.bind()?;
        self.swap_stale = true;
        let n = src.len();
        if n == 0 {
            return Ok(());
        }
        if n > STAGING_BYTES / 4 {
            // SAFETY: `dst` addresses a live allocation of at least `n` bytes
            // (callers' contract); the stream is synchronized before `src`
            // can move.
            unsafe { result::memcpy_htod_async(dst.0, src, self.compute.cu_stream()) }
                .map_err(GpuError::driver("cuMemcpyHtoDAsync"))?;
            return self.sync_compute();
        }
        if self.staging.is_none() {
            // SAFETY: page-locked allocation of STAGING_BYTES bytes.
            let ptr = unsafe { result::malloc_host(STAGING_BYTES, 0) }.map_err(|e| {
                GpuError::OutOfMemory {
                    what: format!("{STAGING_BYTES} bytes of pinned staging"),
                    source: Some(engine_core::cause(e)),
                }
            })? as *mut u8;
            self.staging = Some(Pinned {
                ptr,
                bytes: STAGING_BYTES,
            });
        }
        let start = self.staged.next_multiple_of(256);
        let start = if start + n > STAGING_BYTES {
            // Full: wait until every staged copy has landed, then reuse.
            self.sync_compute()?;
            0
        } else {
            start
        };
        let Some(stage) = self.staging.as_ref() else {
            return Err(GpuError::Device("staging buffer vanished".into()));
        };
        // SAFETY: `[start, start + n)` lies inside the page-locked buffer and
        // no copy in flight reads it (bytes before `start` may be in flight;
        // everything was reclaimed only after a synchronization).
        let staged = unsafe {
            let p = stage.ptr.add(start);
            std::ptr::copy_nonoverlapping(src.as_ptr(), p, n);
            std::slice::from_raw_parts(p, n)
        };
        // SAFETY: `dst` addresses a live allocation of at least `n` bytes;
        // `staged` stays untouched until the stream passes this copy.
        unsafe { result::memcpy_htod_async(dst.0, staged, self.compute.cu_stream()) }
            .map_err(GpuError::driver("cuMemcpyHtoDAsync"))?;
        self.staged = start + n;
        Ok(())
    }

    fn download(&mut self, src: DevPtr, dst: &mut [u8]) -> Result<(), GpuError> {
        self.not_capturing("download")?;
        self.bind()?;
        // SAFETY: `src` addresses at least `dst.len()` device bytes (callers'
        // contract); the stream is synchronized before `dst` can move.
        unsafe { result::memcpy_dtoh_async(dst, src.0, self.compute.cu_stream()) }
            .map_err(GpuError::driver("cuMemcpyDtoHAsync"))?;
        self.sync_compute()
    }

    fn copy_to_host(
        &mut self,
        src: DevPtr,
        host: &HostBuf,
        host_offset: usize,
        bytes: usize,
    ) -> Result<(), GpuError> {
        self.not_capturing("a swap copy")?;
        self.bind()?;
        self.swap_after_compute()?;
        let stream = self.swap.cu_stream();
        let dst = self.host_slice(host, host_offset, bytes)?;
        // SAFETY: page-locked destination inside its allocation (checked);
        // `src` addresses a device block; ordered on the swap stream.
        unsafe { result::memcpy_dtoh_async(dst, src.0, stream) }
            .map_err(GpuError::driver("cuMemcpyDtoHAsync"))
    }

    fn copy_from_host(
        &mut self,
        host: &HostBuf,
        host_offset: usize,
        dst: DevPtr,
        bytes: usize,
    ) -> Result<(), GpuError> {
        self.not_capturing("a swap copy")?;
        self.bind()?;
        self.swap_after_compute()?;
        let stream = self.swap.cu_stream();
        let src = self.host_slice(host, host_offset, bytes)?;
        // SAFETY: as `copy_to_host`, in the other direction; page-locked memory
        // stays put until the device drops.
        unsafe { result::memcpy_htod_async(dst.0, src, stream) }
            .map_err(GpuError::driver("cuMemcpyHtoDAsync"))
    }

    fn swap_fence(&mut self) -> Result<(), GpuError> {
        self.not_capturing("swap_fence")?;
        self.bind()?;
        self.compute
            .join(&self.swap)
            .map_err(GpuError::driver("cuStreamWaitEvent"))
    }

    fn kernel(&mut self, name: &str) -> Result<Kernel, GpuError> {
        let k = Kernel::find(name)?;
        if self.funcs[k.index].is_none() {
            self.bind()?;
            let f = self
                .module
                .load_function(k.name)
                .map_err(|e| GpuError::Ptx {
                    what: name.to_string(),
                    source: Some(engine_core::cause(e)),
                })?;
            f.set_attribute(
                sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                self.max_shared as i32,
            )
            .map_err(GpuError::driver("cuFuncSetAttribute"))?;
            self.funcs[k.index] = Some((gpu_kernels::KERNELS[k.index], f));
        }
        Ok(k)
    }

    unsafe fn launch(
        &mut self,
        kernel: Kernel,
        cfg: LaunchConfig,
        args: &[KernelArg],
    ) -> Result<(), GpuError> {
        const MAX_ARGS: usize = 16;
        if args.len() > MAX_ARGS {
            return Err(GpuError::ptx(format!(
                "{}: {} arguments (at most {MAX_ARGS})",
                kernel.name,
                args.len()
            )));
        }
        self.bind()?;
        let stream = self.compute.cu_stream();
        let (sig, f) = self
            .funcs
            .get(kernel.index)
            .and_then(Option::as_ref)
            .ok_or_else(|| GpuError::ptx(format!("{} was not resolved", kernel.name)))?;
        check_args(sig, args).map_err(|e| GpuError::ptx(e.to_string()))?;
        // Fixed arrays, no allocation: the builder borrows each value.
        let (mut ptrs, mut u32s, mut f32s) = ([0u64; MAX_ARGS], [0u32; MAX_ARGS], [0f32; MAX_ARGS]);
        for (i, a) in args.iter().enumerate() {
            match *a {
                KernelArg::Ptr(p) => ptrs[i] = p,
                KernelArg::U32(v) => u32s[i] = v,
                KernelArg::F32(v) => f32s[i] = v,
            }
        }
        let mut params = [std::ptr::null_mut::<std::ffi::c_void>(); MAX_ARGS];
        for (i, a) in args.iter().enumerate() {
            params[i] = match a {
                KernelArg::Ptr(_) => (&mut ptrs[i] as *mut u64).cast(),
                KernelArg::U32(_) => (&mut u32s[i] as *mut u32).cast(),
                KernelArg::F32(_) => (&mut f32s[i] as *mut f32).cast(),
            };
        }
        let g = cfg.grid;
        let b = cfg.block;
        // SAFETY: the argument list matches the entry point (checked above
        // against KERNELS, which a test ties to the PTX), each parameter
        // points at a value that lives until the call returns (the driver
        // copies them at launch); buffer sizes are the caller's contract (see
        // `# Safety`); the context is bound on this thread.
        unsafe {
            result::launch_kernel(
                f.cu_function(),
                (g.x, g.y, g.z),
                (b.x, b.y, b.z),
                cfg.shared_mem_bytes,
                stream,
                &mut params[..args.len()],
            )
        }
        .map_err(GpuError::driver("cuLaunchKernel"))?;
        self.swap_stale = true;
        Ok(())
    }

    unsafe fn gemm(&mut self, g: &Gemm) -> Result<(), GpuError> {
        self.bind()?;
        let (alpha, beta) = (1.0f32, if g.accumulate { 1.0f32 } else { 0.0 });
        // Row-major C[m,n] = A[m,k] B[n,k]^T is column-major C^T[n,m] = B^T' A':
        // cuBLAS sees B as a k x n column-major matrix (transposed) and A as k x m.
        // SAFETY: pointers and sizes per the caller's contract; scalars live
        // across the (host-pointer-mode) call.
        unsafe {
            cublas::result::gemm_ex(
                *self.blas.handle(),
                cublas::sys::cublasOperation_t::CUBLAS_OP_T,
                cublas::sys::cublasOperation_t::CUBLAS_OP_N,
                g.n as i32,
                g.m as i32,
                g.k as i32,
                (&alpha as *const f32).cast(),
                g.b.0 as *const _,
                cuda_type(g.ab),
                g.k as i32,
                g.a.0 as *const _,
                cuda_type(g.ab),
                g.k as i32,
                (&beta as *const f32).cast(),
                g.c.0 as *mut _,
                cuda_type(g.c_type),
                g.n as i32,
                cublas::sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                cublas::sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(GpuError::driver("cublasGemmEx"))?;
        self.swap_stale = true;
        Ok(())
    }

    fn synchronize(&mut self) -> Result<(), GpuError> {
        self.not_capturing("synchronize")?;
        self.bind()?;
        self.sync_compute()?;
        // SAFETY: the stream is live for the device's life.
        unsafe { result::stream::synchronize(self.swap.cu_stream()) }
            .map_err(GpuError::driver("cuStreamSynchronize"))
    }

    fn begin_capture(&mut self) -> Result<(), GpuError> {
        self.not_capturing("begin_capture")?;
        self.bind()?;
        self.compute
            .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(GpuError::driver("cuStreamBeginCapture"))?;
        self.capturing = true;
        Ok(())
    }

    fn end_capture(&mut self) -> Result<GraphId, GpuError> {
        if !self.capturing {
            return Err(GpuError::Device("end_capture without begin_capture".into()));
        }
        self.capturing = false;
        self.bind()?;
        let graph = self
            .compute
            .end_capture(sys::CUgraphInstantiate_flags(0))
            .map_err(GpuError::driver("cuStreamEndCapture"))?
            .ok_or_else(|| GpuError::Device("stream capture recorded no graph".into()))?;
        self.graphs.push(Some(graph));
        Ok(GraphId(self.graphs.len() - 1))
    }

    unsafe fn launch_graph(&mut self, graph: GraphId) -> Result<(), GpuError> {
        self.not_capturing("launch_graph")?;
        self.bind()?;
        let g = self
            .graphs
            .get(graph.0)
            .and_then(Option::as_ref)
            .ok_or_else(|| GpuError::Device("unknown graph".into()))?;
        // SAFETY: the graph and the stream are live; the buffers it addresses
        // are the caller's contract.
        unsafe { result::graph::launch(g.cu_graph_exec(), self.compute.cu_stream()) }
            .map_err(GpuError::driver("cuGraphLaunch"))?;
        self.swap_stale = true;
        Ok(())
    }

    fn drop_graph(&mut self, graph: GraphId) -> Result<(), GpuError> {
        self.bind()?;
        match self.graphs.get_mut(graph.0).and_then(Option::take) {
            Some(_) => Ok(()),
            None => Err(GpuError::Device("unknown graph".into())),
        }
    }

    fn has_all_reduce(&self) -> bool {
        self.nccl.is_some()
    }

    fn all_reduce_sum(&mut self, buf: DevPtr, count: usize, dtype: DType) -> Result<(), GpuError> {
        let Some(nccl) = &self.nccl else {
            return Err(GpuError::Unsupported(
                "an all-reduce before join_nccl".into(),
            ));
        };
        self.bind()?;
        let end = buf.0 + (count * dtype.size()) as u64;
        let inside = self
            .mem
            .iter()
            .flatten()
            .any(|&(p, n)| buf.0 >= p && end <= p + n as u64);
        if !inside {
            return Err(GpuError::Device(
                "all-reduce outside the device's allocations".into(),
            ));
        }
        // SAFETY: `buf` lies in a live allocation of this device (checked
        // above); the compute stream is live for the device's life.
        unsafe { nccl.all_reduce_sum(buf, count, dtype, self.compute.cu_stream()) }
    }
}

impl Drop for CudaDevice {
    fn drop(&mut self) {
        if self.capturing {
            // SAFETY: ends the capture this device began; the partial graph
            // it returns is destroyed right away.
            if let Ok(g) = unsafe { result::stream::end_capture(self.compute.cu_stream()) } {
                if !g.is_null() {
                    // SAFETY: `g` is the graph just returned, used nowhere else.
                    let _ = unsafe { result::graph::destroy(g) };
                }
            }
            self.capturing = false;
        }
        if self.bind().is_err() || self.synchronize().is_err() {
            return;
        }
        self.graphs.clear();
        // SAFETY: from `malloc_sync`; all work finished above.
        let _ = unsafe { result::free_sync(self.blas_workspace) };
        for (ptr, _) in self.mem.drain(..).flatten() {
            // SAFETY: from `malloc_sync`; all work finished above.
            let _ = unsafe { result::free_sync(ptr) };
        }
        for p in self.host.drain(..).flatten().chain(self.staging.take()) {
            // SAFETY: from `malloc_host`; all copies finished above.
            let _ = unsafe { result::free_host(p.ptr.cast()) };
        }
    }
}
