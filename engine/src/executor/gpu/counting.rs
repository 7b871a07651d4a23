//! [`CountingDevice`]: a [`Device`] that records what the executor asks of
//! it (launches, GEMMs, bytes uploaded and downloaded, host synchronizations)
//! and computes nothing. It measures the GPU executor's host side without a
//! GPU: `cargo bench -p engine --bench gpu_host` drives it with the real
//! scheduler, and tests assert on its counters (how many bytes a step
//! downloads, how many launches it makes).
//!
//! Invariants: allocations get distinct, 256-byte aligned fake addresses that
//! are never dereferenced; uploads are counted and dropped; downloads leave
//! the destination as it is (the caller's bytes, usually zeros); every other
//! call only counts. Launches and GEMMs issued while capturing a graph are
//! counted as `captured_ops`, not as launches; a replay counts one graph
//! launch (what the host pays for on CUDA). Kernel names are still checked against
//! `gpu_kernels::KERNELS` when resolved, so an executor that would resolve an
//! unknown kernel on CUDA fails here too.
//!
//! Cost: O(1) per call.

use super::device::{DevBuf, DevPtr, Device, Gemm, GraphId, HostBuf, Kernel, ThreadsFor};
use super::GpuError;
use gpu_kernels::{KernelArg, LaunchConfig};

/// What a [`CountingDevice`] has been asked to do so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// Kernel launches (not counting GEMMs).
    pub launches: u64,
    /// GEMM calls.
    pub gemms: u64,
    /// Host-to-device copies on the compute stream, and their bytes.
    pub uploads: u64,
    pub upload_bytes: u64,
    /// Device-to-host copies that wait for compute, and their bytes.
    pub downloads: u64,
    pub download_bytes: u64,
    /// Swap-stream copies (either direction), and their bytes.
    pub swap_copies: u64,
    pub swap_bytes: u64,
    /// Explicit `synchronize` calls (each download is a synchronization too).
    pub syncs: u64,
    /// Device allocations and frees.
    pub allocs: u64,
    pub frees: u64,
    /// Graphs captured, launches and GEMMs recorded into them, graph launches.
    pub captures: u64,
    pub captured_ops: u64,
    pub graph_launches: u64,
}

impl Counters {
    /// `self - earlier`, field by field (counters only grow).
    pub fn since(&self, earlier: &Counters) -> Counters {
        Counters {
            launches: self.launches - earlier.launches,
            gemms: self.gemms - earlier.gemms,
            uploads: self.uploads - earlier.uploads,
            upload_bytes: self.upload_bytes - earlier.upload_bytes,
            downloads: self.downloads - earlier.downloads,
            download_bytes: self.download_bytes - earlier.download_bytes,
            swap_copies: self.swap_copies - earlier.swap_copies,
            swap_bytes: self.swap_bytes - earlier.swap_bytes,
            syncs: self.syncs - earlier.syncs,
            allocs: self.allocs - earlier.allocs,
            frees: self.frees - earlier.frees,
            captures: self.captures - earlier.captures,
            captured_ops: self.captured_ops - earlier.captured_ops,
            graph_launches: self.graph_launches - earlier.graph_launches,
        }
    }

    /// Host synchronizations: explicit ones plus downloads (which wait).
    pub fn host_waits(&self) -> u64 {
        self.syncs + self.downloads
    }
}

/// A device that counts and computes nothing. See the module docs.
pub struct CountingDevice {
    counters: std::sync::Arc<std::sync::Mutex<Counters>>,
    next_addr: u64,
    next_slot: usize,
    total_bytes: usize,
    capturing: bool,
    graphs: usize,
}

impl CountingDevice {
    /// A device reporting `total_bytes` of memory, all of it free.
    pub fn new(total_bytes: usize) -> Self {
        Self {
            counters: Default::default(),
            next_addr: 1 << 32,
            next_slot: 0,
            total_bytes,
            capturing: false,
            graphs: 0,
        }
    }

    /// A handle on the counters that stays readable after the device moved
    /// into an executor.
    pub fn counters(&self) -> CountersHandle {
        CountersHandle(self.counters.clone())
    }

    fn count(&self, f: impl FnOnce(&mut Counters)) {
        // A poisoned lock only means another thread panicked while counting;
        // the numbers are still the best we have.
        let mut c = self.counters.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut c);
    }
}

/// Shared read access to a [`CountingDevice`]'s counters.
#[derive(Clone, Debug)]
pub struct CountersHandle(std::sync::Arc<std::sync::Mutex<Counters>>);

impl CountersHandle {
    /// The counters now.
    pub fn get(&self) -> Counters {
        *self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Device for CountingDevice {
    fn describe(&self) -> String {
        "counting device (computes nothing)".into()
    }

    fn threads(&self, family: ThreadsFor) -> u32 {
        match family {
            ThreadsFor::Attention => 128,
            ThreadsFor::Rows => 256,
            ThreadsFor::Lora => 128,
        }
    }

    fn max_shared_bytes(&self) -> usize {
        227 * 1024
    }

    fn sm_count(&self) -> u32 {
        // An H200, the machine the host benchmark stands in for.
        132
    }

    fn mem_info(&self) -> Option<(usize, usize)> {
        Some((self.total_bytes, self.total_bytes))
    }

    fn alloc(&mut self, bytes: usize) -> Result<DevBuf, GpuError> {
        let ptr = DevPtr(self.next_addr);
        self.next_addr += (bytes.max(1) as u64).div_ceil(256) * 256;
        self.next_slot += 1;
        self.count(|c| c.allocs += 1);
        Ok(DevBuf {
            slot: self.next_slot - 1,
            ptr,
            bytes,
        })
    }

    fn free(&mut self, _buf: DevBuf) -> Result<(), GpuError> {
        self.count(|c| c.frees += 1);
        Ok(())
    }

    fn alloc_host(&mut self, bytes: usize) -> Result<HostBuf, GpuError> {
        self.next_slot += 1;
        Ok(HostBuf {
            slot: self.next_slot - 1,
            bytes,
        })
    }

    fn upload(&mut self, _dst: DevPtr, src: &[u8]) -> Result<(), GpuError> {
        self.count(|c| {
            c.uploads += 1;
            c.upload_bytes += src.len() as u64;
        });
        Ok(())
    }

    fn download(&mut self, _src: DevPtr, dst: &mut [u8]) -> Result<(), GpuError> {
        self.count(|c| {
            c.downloads += 1;
            c.download_bytes += dst.len() as u64;
        });
        Ok(())
    }

    fn copy_to_host(
        &mut self,
        _src: DevPtr,
        _host: &HostBuf,
        _host_offset: usize,
        bytes: usize,
    ) -> Result<(), GpuError> {
        self.count(|c| {
            c.swap_copies += 1;
            c.swap_bytes += bytes as u64;
        });
        Ok(())
    }

    fn copy_from_host(
        &mut self,
        _host: &HostBuf,
        _host_offset: usize,
        _dst: DevPtr,
        bytes: usize,
    ) -> Result<(), GpuError> {
        self.count(|c| {
            c.swap_copies += 1;
            c.swap_bytes += bytes as u64;
        });
        Ok(())
    }

    fn swap_fence(&mut self) -> Result<(), GpuError> {
        Ok(())
    }

    fn kernel(&mut self, name: &str) -> Result<Kernel, GpuError> {
        Kernel::find(name)
    }

    unsafe fn launch(
        &mut self,
        _kernel: Kernel,
        _cfg: LaunchConfig,
        _args: &[KernelArg],
    ) -> Result<(), GpuError> {
        match self.capturing {
            true => self.count(|c| c.captured_ops += 1),
            false => self.count(|c| c.launches += 1),
        }
        Ok(())
    }

    unsafe fn gemm(&mut self, _g: &Gemm) -> Result<(), GpuError> {
        match self.capturing {
            true => self.count(|c| c.captured_ops += 1),
            false => self.count(|c| c.gemms += 1),
        }
        Ok(())
    }

    fn synchronize(&mut self) -> Result<(), GpuError> {
        self.count(|c| c.syncs += 1);
        Ok(())
    }

    fn begin_capture(&mut self) -> Result<(), GpuError> {
        if self.capturing {
            return Err(GpuError::Device("counting: nested capture".into()));
        }
        self.capturing = true;
        Ok(())
    }

    fn end_capture(&mut self) -> Result<GraphId, GpuError> {
        if !self.capturing {
            return Err(GpuError::Device(
                "counting: end_capture without begin".into(),
            ));
        }
        self.capturing = false;
        self.graphs += 1;
        self.count(|c| c.captures += 1);
        Ok(GraphId(self.graphs - 1))
    }

    unsafe fn launch_graph(&mut self, _graph: GraphId) -> Result<(), GpuError> {
        self.count(|c| c.graph_launches += 1);
        Ok(())
    }

    fn drop_graph(&mut self, _graph: GraphId) -> Result<(), GpuError> {
        Ok(())
    }
}
