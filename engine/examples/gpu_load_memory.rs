//! Peak host memory while loading a model for the GPU executor: the model
//! file read a layer at a time (`WeightReader`) and uploaded in bf16 to the
//! counting device, which keeps no host copy of device buffers, so the
//! figure is the load path's own.
//!
//! Run: `cargo run --release -p engine --example gpu_load_memory -- FILE.gguf`
//! (default: the fetched SmolLM2). Prints the peak resident set (VmHWM) and
//! the bytes uploaded.

use engine::executor::gpu::{CountingDevice, DType, GpuExecutor, GpuOptions, KvSizing};
use engine::model::FileSource;
use model_loader::{WeightReader, WeightTypes};

/// A field of /proc/self/status in MiB (Linux; NaN elsewhere).
fn status_mib(field: &str) -> f64 {
    model_loader::memory::status_kib(field).map_or(f64::NAN, |kib| kib as f64 / 1024.0)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args()
        .nth(1)
        .map(std::path::PathBuf::from)
        .unwrap_or_else(model_loader::paths::default_model_path);
    let t = std::time::Instant::now();
    let reader = WeightReader::open(&path)?;
    let dev = CountingDevice::new(141 << 30);
    let counters = dev.counters();
    let opts = GpuOptions {
        dtype: DType::Bf16,
        block_size: 16,
        kv: KvSizing::Blocks { gpu: 16, cpu: 0 },
    };
    let mut source = FileSource {
        reader: &reader,
        types: WeightTypes::File,
    };
    let exec = GpuExecutor::load(dev, reader.config().clone(), &mut source, opts)?;
    println!(
        "{}: loaded for the GPU (bf16) in {:.2} s; uploaded {:.1} MiB; peak resident {:.1} MiB (VmHWM), now {:.1} MiB",
        path.display(),
        t.elapsed().as_secs_f64(),
        counters.get().upload_bytes as f64 / (1 << 20) as f64,
        status_mib("VmHWM"),
        status_mib("VmRSS"),
    );
    drop(exec);
    Ok(())
}
