//! `cargo xtask build-ptx`: compiles `gpu-kernels` to PTX for each architecture and
//! checks it with `ptxas`, without a GPU (DESIGN.md, settled decision 1).
//!
//! Per architecture (default `sm_80` and `sm_90`):
//! 1. `rustup run nightly cargo rustc --release -p gpu-kernels --target
//!    nvptx64-nvidia-cuda -Zbuild-std=core -- --emit=asm` with
//!    `RUSTFLAGS="-Ctarget-cpu=<arch> -Zunstable-options -Cpanic=immediate-abort"`, one
//!    codegen unit and no debug info, in its own target dir `target/ptx/<arch>` (a flag
//!    change rebuilds `core`; host builds are never touched);
//! 2. copies the `.s` to `target/ptx/<arch>/gpu_kernels.ptx` and fails if any
//!    `.extern .func` (an unresolved call, e.g. a panic path) remains;
//! 3. runs `ptxas -arch=<arch> -v`, fails on an error or any spill, and writes the
//!    per-kernel register / shared-memory report to `target/ptx/<arch>/ptxas-report.txt`
//!    (raw log in `ptxas.log`).
//!
//! `ptxas` comes from the PyPI wheel `nvidia-cuda-nvcc-cu12` (pinned version and
//! sha256), fetched with pip into `<cache>/ptxas/` on first use; `--ptxas` overrides.
//! The nightly's `rust-src` component is added if missing.

use anyhow::{bail, Context, Result};
use sha2::{Digest, Sha256};
use std::fmt::Write as _;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::Command;

const NVCC_WHEEL_SPEC: &str = "nvidia-cuda-nvcc-cu12==12.9.86";
const NVCC_WHEEL_FILE: &str =
    "nvidia_cuda_nvcc_cu12-12.9.86-py3-none-manylinux2010_x86_64.manylinux_2_12_x86_64.whl";
const NVCC_WHEEL_SHA256: &str = "5d6a0d32fdc7ea39917c20065614ae93add6f577d840233237ff08e9a38f58f0";
const PTXAS_IN_WHEEL: &str = "nvidia/cuda_nvcc/bin/ptxas";
const TOOLCHAIN: &str = "nightly";

/// Arguments of `build-ptx`.
#[derive(clap::Args)]
pub struct Args {
    /// Target architectures (repeatable).
    #[arg(long = "arch", default_values_t = ["sm_80".to_string(), "sm_90".to_string()])]
    archs: Vec<String>,
    /// Use this `ptxas` instead of the one fetched from PyPI.
    #[arg(long)]
    ptxas: Option<PathBuf>,
    /// Only compile and check for `.extern .func`; skip ptxas.
    #[arg(long)]
    no_ptxas: bool,
}

/// One kernel's line of the ptxas report.
#[derive(Debug, Default, Clone, PartialEq)]
struct KernelUsage {
    name: String,
    registers: u32,
    smem_bytes: u32,
    stack_bytes: u32,
    spill_stores: u32,
    spill_loads: u32,
}

/// Runs the task.
pub fn run(args: Args) -> Result<()> {
    let root = workspace_root()?;
    ensure_rust_src()?;
    let ptxas = if args.no_ptxas {
        None
    } else {
        Some(match &args.ptxas {
            Some(p) => p.clone(),
            None => fetch_ptxas()?,
        })
    };
    for arch in &args.archs {
        if !arch.starts_with("sm_") {
            bail!("architecture {arch:?} is not of the form sm_NN");
        }
        let dir = root.join("target").join("ptx").join(arch);
        let ptx = build_ptx(&root, &dir, arch)?;
        let text =
            std::fs::read_to_string(&ptx).with_context(|| format!("reading {}", ptx.display()))?;
        check_no_extern_func(&text, &ptx)?;
        let entries = text.lines().filter(|l| l.contains(".entry ")).count();
        println!("{arch}: {} ({entries} entry points)", ptx.display());
        if let Some(ptxas) = &ptxas {
            let usage = run_ptxas(ptxas, &ptx, &dir, arch)?;
            if usage.len() != entries {
                bail!(
                    "{arch}: ptxas reported {} kernels, the PTX has {entries} entries",
                    usage.len()
                );
            }
            let report = dir.join("ptxas-report.txt");
            std::fs::write(&report, format_report(arch, &usage))
                .with_context(|| format!("writing {}", report.display()))?;
            let spilled: Vec<&str> = usage
                .iter()
                .filter(|u| u.spill_stores + u.spill_loads > 0)
                .map(|u| u.name.as_str())
                .collect();
            let max_regs = usage.iter().map(|u| u.registers).max().unwrap_or(0);
            let max_smem = usage.iter().map(|u| u.smem_bytes).max().unwrap_or(0);
            println!("{arch}: ptxas ok, max {max_regs} registers, max {max_smem} bytes static smem; report {}", report.display());
            if !spilled.is_empty() {
                bail!("{arch}: register spills in {}", spilled.join(", "));
            }
        }
    }
    Ok(())
}

/// The workspace folder (the parent of `xtask/`).
pub fn workspace_root() -> Result<PathBuf> {
    let here = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    here.parent()
        .map(Path::to_path_buf)
        .context("xtask has no parent folder")
}

fn ensure_rust_src() -> Result<()> {
    let out = Command::new("rustup")
        .args(["component", "list", "--installed", "--toolchain", TOOLCHAIN])
        .output()
        .context("running rustup (is the nightly toolchain installed?)")?;
    if !out.status.success() {
        bail!(
            "`rustup component list --toolchain {TOOLCHAIN}` failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    if String::from_utf8_lossy(&out.stdout)
        .lines()
        .any(|l| l.trim().starts_with("rust-src"))
    {
        return Ok(());
    }
    eprintln!("adding rust-src to the {TOOLCHAIN} toolchain ...");
    let status = Command::new("rustup")
        .args(["component", "add", "rust-src", "--toolchain", TOOLCHAIN])
        .status()
        .context("running rustup component add")?;
    if !status.success() {
        bail!("`rustup component add rust-src --toolchain {TOOLCHAIN}` failed with {status}");
    }
    Ok(())
}

/// Compiles the crate for `arch` and returns the path of the copied PTX.
fn build_ptx(root: &Path, dir: &Path, arch: &str) -> Result<PathBuf> {
    eprintln!("{arch}: compiling gpu-kernels for nvptx64-nvidia-cuda ...");
    let status = Command::new("rustup")
        .args([
            "run",
            TOOLCHAIN,
            "cargo",
            "rustc",
            "--release",
            "-p",
            "gpu-kernels",
        ])
        .args([
            "--target",
            "nvptx64-nvidia-cuda",
            "-Zbuild-std=core",
            "--",
            "--emit=asm",
            // The kernels keep per-thread state in small arrays (decode attention: K/V
            // vectors in flight, softmax state per query head) that stay in registers
            // only when their loops are fully unrolled; LLVM's default threshold leaves
            // them in local memory (a 616-byte stack frame). Only this crate, so `core`
            // is not rebuilt.
            "-Cllvm-args=-unroll-threshold=20000",
        ])
        .current_dir(root)
        .env("CARGO_TARGET_DIR", dir)
        .env(
            "RUSTFLAGS",
            format!("-Ctarget-cpu={arch} -Zunstable-options -Cpanic=immediate-abort"),
        )
        .env("CARGO_PROFILE_RELEASE_CODEGEN_UNITS", "1")
        .env("CARGO_PROFILE_RELEASE_DEBUG", "false")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .env_remove("RUSTUP_TOOLCHAIN")
        .env_remove("RUSTC")
        .env_remove("RUSTC_WRAPPER")
        .env_remove("CARGO_BUILD_TARGET_DIR")
        .status()
        .context("running `rustup run nightly cargo rustc`")?;
    if !status.success() {
        bail!("{arch}: nvptx build failed with {status}");
    }
    // The newest whole-crate `.s` (one codegen unit) is this build's output.
    let deps = dir.join("nvptx64-nvidia-cuda").join("release").join("deps");
    let mut newest: Option<(std::time::SystemTime, PathBuf)> = None;
    for e in std::fs::read_dir(&deps).with_context(|| format!("listing {}", deps.display()))? {
        let p = e?.path();
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if name.starts_with("gpu_kernels-") && name.ends_with(".s") && !name.contains(".rcgu.") {
            let t = p.metadata()?.modified()?;
            if newest.as_ref().is_none_or(|(nt, _)| t > *nt) {
                newest = Some((t, p));
            }
        }
    }
    let (_, src) = newest.with_context(|| format!("no gpu_kernels-*.s in {}", deps.display()))?;
    let dst = dir.join("gpu_kernels.ptx");
    std::fs::copy(&src, &dst)
        .with_context(|| format!("copying {} to {}", src.display(), dst.display()))?;
    Ok(dst)
}

fn check_no_extern_func(text: &str, path: &Path) -> Result<()> {
    let externs: Vec<&str> = text
        .lines()
        .filter(|l| l.contains(".extern .func"))
        .collect();
    if !externs.is_empty() {
        bail!(
            "{} has {} unresolved `.extern .func` (first: {}); ptxas would refuse it",
            path.display(),
            externs.len(),
            externs[0].trim()
        );
    }
    Ok(())
}

/// The cached `ptxas` from the pinned `nvidia-cuda-nvcc-cu12` wheel, fetched on first use.
fn fetch_ptxas() -> Result<PathBuf> {
    let dir = model_paths::cache_dir().join("ptxas");
    let exe = dir.join("12.9.86").join("ptxas");
    if exe.exists() {
        return Ok(exe);
    }
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let wheel = dir.join(NVCC_WHEEL_FILE);
    if !wheel.exists() || sha256_file(&wheel)? != NVCC_WHEEL_SHA256 {
        eprintln!("downloading {NVCC_WHEEL_SPEC} from PyPI (about 40 MB) for ptxas ...");
        let status = Command::new("python3")
            .args([
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--only-binary=:all:",
                NVCC_WHEEL_SPEC,
                "-d",
            ])
            .arg(&dir)
            .status()
            .context("running `python3 -m pip download` (is python3 with pip installed?)")?;
        if !status.success() {
            bail!("`python3 -m pip download {NVCC_WHEEL_SPEC}` failed with {status}");
        }
    }
    let got = sha256_file(&wheel)?;
    if got != NVCC_WHEEL_SHA256 {
        bail!(
            "{} has sha256 {got}, expected {NVCC_WHEEL_SHA256}",
            wheel.display()
        );
    }
    let file = File::open(&wheel).with_context(|| format!("opening {}", wheel.display()))?;
    let mut archive =
        zip::ZipArchive::new(file).context("reading the nvcc wheel as a zip archive")?;
    let mut entry = archive
        .by_name(PTXAS_IN_WHEEL)
        .with_context(|| format!("{PTXAS_IN_WHEEL} not in the wheel"))?;
    let parent = exe.parent().context("ptxas path has no parent")?;
    std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    let partial = exe.with_extension("partial");
    let mut out =
        File::create(&partial).with_context(|| format!("creating {}", partial.display()))?;
    std::io::copy(&mut entry, &mut out).context("unpacking ptxas")?;
    drop(out);
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&partial, std::fs::Permissions::from_mode(0o755))?;
    }
    std::fs::rename(&partial, &exe)
        .with_context(|| format!("moving ptxas to {}", exe.display()))?;
    Ok(exe)
}

fn sha256_file(path: &Path) -> Result<String> {
    let mut f = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut h = Sha256::new();
    std::io::copy(&mut f, &mut h).with_context(|| format!("reading {}", path.display()))?;
    Ok(hex::encode(h.finalize()))
}

fn run_ptxas(ptxas: &Path, ptx: &Path, dir: &Path, arch: &str) -> Result<Vec<KernelUsage>> {
    let out = Command::new(ptxas)
        .arg(format!("-arch={arch}"))
        .arg("-v")
        .arg(ptx)
        .arg("-o")
        .arg(dir.join("gpu_kernels.cubin"))
        .output()
        .with_context(|| format!("running {}", ptxas.display()))?;
    let log =
        String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    let log_path = dir.join("ptxas.log");
    std::fs::write(&log_path, &log).with_context(|| format!("writing {}", log_path.display()))?;
    if !out.status.success() {
        bail!(
            "{arch}: ptxas rejected the PTX ({}); log in {}",
            out.status,
            log_path.display()
        );
    }
    parse_ptxas_log(&log)
}

/// Parses `ptxas -v` output into one record per entry function.
fn parse_ptxas_log(log: &str) -> Result<Vec<KernelUsage>> {
    let mut out: Vec<KernelUsage> = Vec::new();
    for line in log.lines() {
        if let Some(rest) = line.split("Compiling entry function '").nth(1) {
            let name = rest.split('\'').next().context("malformed ptxas line")?;
            out.push(KernelUsage {
                name: name.to_string(),
                ..Default::default()
            });
        } else if let Some(cur) = out.last_mut() {
            if line.contains("bytes stack frame") {
                cur.stack_bytes = number_before(line, "bytes stack frame").unwrap_or(0);
                cur.spill_stores = number_before(line, "bytes spill stores").unwrap_or(0);
                cur.spill_loads = number_before(line, "bytes spill loads").unwrap_or(0);
            } else if line.contains("Used ") && line.contains("registers") {
                cur.registers = number_before(line, "registers").unwrap_or(0);
                cur.smem_bytes = number_before(line, "bytes smem").unwrap_or(0);
            }
        }
    }
    Ok(out)
}

/// The integer right before `marker` in `line`.
fn number_before(line: &str, marker: &str) -> Option<u32> {
    let head = &line[..line.find(marker)?];
    head.split(|c: char| !c.is_ascii_digit())
        .rfind(|s| !s.is_empty())?
        .parse()
        .ok()
}

fn format_report(arch: &str, usage: &[KernelUsage]) -> String {
    let mut s = format!("# ptxas -arch={arch} -v: per-kernel resources (static smem; dynamic smem is set at launch)\n");
    let _ = writeln!(
        s,
        "{:<40} {:>9} {:>10} {:>7} {:>13} {:>12}",
        "kernel", "registers", "smem_bytes", "stack", "spill_stores", "spill_loads"
    );
    for u in usage {
        let _ = writeln!(
            s,
            "{:<40} {:>9} {:>10} {:>7} {:>13} {:>12}",
            u.name, u.registers, u.smem_bytes, u.stack_bytes, u.spill_stores, u.spill_loads
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_ptxas_verbose_output() {
        let log = "ptxas info    : 0 bytes gmem\n\
ptxas info    : Compiling entry function 'rms_norm_f32' for 'sm_80'\n\
ptxas info    : Function properties for rms_norm_f32\n\
    8 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads\n\
ptxas info    : Used 21 registers, used 1 barriers, 128 bytes smem, 372 bytes cmem[0]\n\
ptxas info    : Compiling entry function 'silu_and_mul_f32' for 'sm_90'\n\
ptxas info    : Function properties for silu_and_mul_f32\n\
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n\
ptxas info    : Used 17 registers, used 0 barriers, 368 bytes cmem[0]\n";
        let got = parse_ptxas_log(log).expect("parse");
        assert_eq!(
            got,
            vec![
                KernelUsage {
                    name: "rms_norm_f32".into(),
                    registers: 21,
                    smem_bytes: 128,
                    stack_bytes: 8,
                    spill_stores: 4,
                    spill_loads: 12
                },
                KernelUsage {
                    name: "silu_and_mul_f32".into(),
                    registers: 17,
                    smem_bytes: 0,
                    stack_bytes: 0,
                    spill_stores: 0,
                    spill_loads: 0
                },
            ]
        );
    }

    #[test]
    fn extern_func_is_refused() {
        let p = Path::new("x.ptx");
        assert!(check_no_extern_func(".visible .entry k(\n)", p).is_ok());
        assert!(check_no_extern_func(".extern .func _ZN4core9panicking5panic\n", p).is_err());
    }
}
