//! The CUDA side of the GPU benchmark (`--features cuda`): loads the PTX that
//! `cargo xtask build-ptx` wrote, launches entry points by name with their parameters
//! checked against [`gpu_kernels::KERNELS`] (names, order and kinds), and times launches
//! with CUDA events.
//!
//! Invariants: `is_culib_present()` is checked before any other CUDA call (without a
//! driver, `cudarc`'s dynamic loader would panic); a kernel is launched only after its
//! argument list matched its [`KernelSig`]; one stream (the context's default stream)
//! orders every copy, launch and event, so device pointers taken once stay valid while
//! their `CudaSlice` lives.

use crate::problem::BenchRng;
use cudarc::driver::{
    sys, CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, DevicePtr, DeviceRepr,
    DriverError, LaunchConfig as CuLaunchConfig, PushKernelArg,
};
use cudarc::nvrtc::Ptx;
use gpu_kernels::{KernelSig, LaunchConfig, KERNELS};
use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

/// What went wrong on the GPU path.
#[derive(Debug)]
pub enum GpuError {
    /// A CUDA driver call failed.
    Driver(DriverError),
    /// The PTX file is missing or unreadable.
    Ptx(String),
    /// An entry point is missing from `KERNELS` or an argument list does not match it.
    Signature(String),
    /// A kernel's output differs from the CPU reference.
    Mismatch(String),
}

impl fmt::Display for GpuError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GpuError::Driver(e) => write!(f, "CUDA driver: {e}"),
            GpuError::Ptx(m) => write!(f, "PTX: {m}"),
            GpuError::Signature(m) => write!(f, "kernel signature: {m}"),
            GpuError::Mismatch(m) => write!(f, "validation failed: {m}"),
        }
    }
}

impl From<DriverError> for GpuError {
    fn from(e: DriverError) -> Self {
        GpuError::Driver(e)
    }
}

impl From<String> for GpuError {
    fn from(m: String) -> Self {
        GpuError::Mismatch(m)
    }
}

/// A kernel argument, as its PTX `.param` kind (the library's type).
pub use gpu_kernels::KernelArg as Arg;

/// A loaded entry point and its signature.
pub struct Kernel {
    sig: KernelSig,
    func: CudaFunction,
}

/// One CUDA context with the kernels' PTX loaded.
pub struct Gpu {
    /// The context (device 0).
    pub ctx: Arc<CudaContext>,
    /// The stream everything runs on.
    pub stream: Arc<CudaStream>,
    module: Arc<CudaModule>,
}

/// Why the GPU part did not run.
pub enum Availability {
    /// A device is there; its context.
    Ready(Arc<CudaContext>),
    /// No driver or no usable device, with the reason.
    Skip(String),
}

/// Finds a CUDA driver and device 0 without touching CUDA if the driver is absent.
pub fn probe() -> Availability {
    // SAFETY: only tries to dlopen the driver library's candidate names; calls nothing
    // in it.
    if !unsafe { sys::is_culib_present() } {
        return Availability::Skip("libcuda not found by the dynamic loader".into());
    }
    match CudaContext::new(0) {
        Ok(ctx) => Availability::Ready(ctx),
        Err(e) => Availability::Skip(format!("driver present but device 0 unusable: {e}")),
    }
}

/// The PTX of `arch`: the file `GK_PTX` if set, else `$GK_PTX_DIR/<arch>/gpu_kernels.ptx`,
/// else where `cargo xtask build-ptx` writes it (`target/ptx/<arch>/gpu_kernels.ptx`).
pub fn ptx_path(arch: &str) -> PathBuf {
    if let Some(p) = std::env::var_os("GK_PTX") {
        return PathBuf::from(p);
    }
    let dir = match std::env::var_os("GK_PTX_DIR") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("..")
            .join("target")
            .join("ptx"),
    };
    dir.join(arch).join("gpu_kernels.ptx")
}

impl Gpu {
    /// Loads the PTX of `arch` into `ctx` once.
    pub fn load(ctx: Arc<CudaContext>, arch: &str) -> Result<Self, GpuError> {
        let path = ptx_path(arch);
        let text = std::fs::read_to_string(&path).map_err(|e| {
            GpuError::Ptx(format!(
                "{}: {e} (run `cargo xtask build-ptx` first, or set GK_PTX / GK_PTX_DIR)",
                path.display()
            ))
        })?;
        let module = ctx.load_module(Ptx::from_src(text))?;
        println!("loaded {}", path.display());
        Ok(Self {
            stream: ctx.default_stream(),
            ctx,
            module,
        })
    }

    /// The entry point `name`, which must be listed in [`KERNELS`].
    pub fn kernel(&self, name: &str) -> Result<Kernel, GpuError> {
        let sig = KERNELS
            .iter()
            .find(|k| k.name == name)
            .copied()
            .ok_or_else(|| GpuError::Signature(format!("{name} is not in KERNELS")))?;
        Ok(Kernel {
            sig,
            func: self.module.load_function(name)?,
        })
    }

    /// Copies `host` to a new device buffer.
    pub fn upload<T: DeviceRepr>(&self, host: &[T]) -> Result<CudaSlice<T>, GpuError> {
        Ok(self.stream.clone_htod(host)?)
    }

    /// Copies `dev` back to the host (synchronous).
    pub fn download<T: DeviceRepr>(&self, dev: &CudaSlice<T>) -> Result<Vec<T>, GpuError> {
        Ok(self.stream.clone_dtoh(dev)?)
    }

    /// The device address of `s`, as a pointer argument.
    pub fn ptr<T>(&self, s: &CudaSlice<T>) -> Arg {
        let (p, _record) = s.device_ptr(&self.stream);
        Arg::Ptr(p)
    }

    /// Launches `k` with `args`, which must match its signature name for name, in order
    /// and kind.
    pub fn launch(
        &self,
        k: &Kernel,
        cfg: LaunchConfig,
        args: &[(&str, Arg)],
    ) -> Result<(), GpuError> {
        check_args(&k.sig, args)?;
        let mut b = self.stream.launch_builder(&k.func);
        for (_, a) in args {
            match a {
                Arg::Ptr(p) => b.arg(p),
                Arg::U32(v) => b.arg(v),
                Arg::F32(v) => b.arg(v),
            };
        }
        let cu = CuLaunchConfig {
            grid_dim: (cfg.grid.x, cfg.grid.y, cfg.grid.z),
            block_dim: (cfg.block.x, cfg.block.y, cfg.block.z),
            shared_mem_bytes: cfg.shared_mem_bytes,
        };
        // SAFETY: the argument list matches the entry point's parameters (checked above
        // against KERNELS, which the golden PTX test ties to the PTX); callers pass
        // buffers sized for `cfg` as the kernel's `# Safety` section requires.
        unsafe { b.launch(cu) }?;
        Ok(())
    }

    /// Mean milliseconds of one `step` over `iters` runs, after `warmup` untimed runs,
    /// measured with CUDA events on the stream.
    pub fn time(
        &self,
        warmup: u32,
        iters: u32,
        mut step: impl FnMut() -> Result<(), GpuError>,
    ) -> Result<f64, GpuError> {
        for _ in 0..warmup {
            step()?;
        }
        self.stream.synchronize()?;
        let flags = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
        let (start, end) = (self.ctx.new_event(flags)?, self.ctx.new_event(flags)?);
        start.record(&self.stream)?;
        for _ in 0..iters {
            step()?;
        }
        end.record(&self.stream)?;
        let ms = start.elapsed_ms(&end)?;
        Ok(f64::from(ms) / f64::from(iters.max(1)))
    }

    /// Device-to-device copy bandwidth of a `bytes`-sized buffer, GB/s counting the read
    /// and the write (as CUDA's bandwidthTest does).
    pub fn copy_bandwidth(&self, bytes: usize, iters: u32) -> Result<f64, GpuError> {
        let src = self.stream.alloc_zeros::<u8>(bytes)?;
        let mut dst = self.stream.alloc_zeros::<u8>(bytes)?;
        let ms = self.time(3, iters, || Ok(self.stream.memcpy_dtod(&src, &mut dst)?))?;
        Ok(gbps(2 * bytes as u64, ms))
    }
}

/// Checks an argument list against a signature: same length, names and kinds in order.
pub fn check_args(sig: &KernelSig, args: &[(&str, Arg)]) -> Result<(), GpuError> {
    let values: Vec<Arg> = args.iter().map(|(_, a)| *a).collect();
    gpu_kernels::check_args(sig, &values).map_err(|e| GpuError::Signature(e.to_string()))?;
    match sig
        .params
        .iter()
        .zip(args)
        .position(|(p, (name, _))| p.name != *name)
    {
        Some(i) => Err(GpuError::Signature(format!(
            "{}: argument {i} is named {}, the entry point's is {}",
            sig.name, args[i].0, sig.params[i].name
        ))),
        None => Ok(()),
    }
}

/// GB/s (10^9 bytes per second) of `bytes` moved in `ms` milliseconds.
pub fn gbps(bytes: u64, ms: f64) -> f64 {
    bytes as f64 / (ms * 1e-3) / 1e9
}

/// Picks the PTX architecture for a compute capability: sm_90 for 9.x and newer (the
/// driver JITs PTX forward), sm_80 for 8.x; older devices are not targeted.
pub fn arch_for(major: i32) -> Option<&'static str> {
    match major {
        9.. => Some("sm_90"),
        8 => Some("sm_80"),
        _ => None,
    }
}

/// Runs validation and timings on device 0, or says why it cannot.
pub fn run(r: &mut BenchRng) -> Result<(), GpuError> {
    let ctx = match probe() {
        Availability::Ready(ctx) => ctx,
        Availability::Skip(why) => {
            println!("SKIP: no CUDA driver ({why}); the GPU benchmark needs one");
            return Ok(());
        }
    };
    let (major, minor) = ctx.compute_capability()?;
    let Some(arch) = arch_for(major) else {
        println!("SKIP: compute capability {major}.{minor} is below the sm_80 the PTX targets");
        return Ok(());
    };
    println!(
        "device 0: {} (compute {major}.{minor}), PTX {arch}",
        ctx.name()?
    );
    let gpu = Gpu::load(ctx, arch)?;
    crate::gpu_runs::validate(&gpu, r)?;
    crate::lora_runs::validate(&gpu, r)?;
    crate::gpu_runs::bench(&gpu, r)?;
    crate::lora_runs::bench(&gpu, r)
}
