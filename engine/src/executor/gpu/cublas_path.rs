//! Finding cuBLAS 12 or 13 ourselves (issue 14, item 6).
//!
//! cudarc's dynamic loading opens cuBLAS by bare file names
//! (`cudarc::get_lib_name_candidates`: `libcublas.so`, `libcublas.so.<major>`,
//! `.so.12`, `.so.11`, ... where `<major>` is the CUDA version cudarc was built
//! for), so only the dynamic linker's search path is looked at: the PyTorch
//! wheels' folder (`.../site-packages/nvidia/cu13/lib/`, where a CUDA 13
//! machine keeps `libcublas.so.13`) is not. The engine therefore searches
//! itself, in this order, and the CUDA device opens the first hit by its
//! absolute path before cudarc asks for it: glibc then hands cudarc's
//! bare-name request (`libcublas.so.13` or `.so.12`) the already-loaded
//! object whose SONAME matches.
//!
//! 1. `PAGED_ENGINE_CUBLAS` (a file, or a folder to look in): when set, it is
//!    the only place looked at, and a miss is an error.
//! 2. Every folder of `LD_LIBRARY_PATH`.
//! 3. The Python wheels of every site-packages / dist-packages folder found
//!    under `VIRTUAL_ENV`, `CONDA_PREFIX`, `/usr/local/lib`, `/usr/lib` and
//!    `~/.local/lib`: `nvidia/cu13/lib` (CUDA 13 wheels) and
//!    `nvidia/cublas/lib` (CUDA 12 wheels).
//! 4. `CUDA_HOME`/`CUDA_PATH` `lib64`, `/usr/local/cuda/lib64` and the
//!    system library folders.
//!
//! In each folder the names tried are `libcublas.so.13`, `libcublas.so.12`,
//! then `libcublas.so`. A miss is a [`GpuError::Unavailable`] naming every
//! path tried.
//!
//! Invariants: the search only looks at file names (nothing is loaded here),
//! so it is unit-tested with empty files in temporary folders.
//! Cost: one `stat` per candidate path, once at start.

use super::GpuError;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// The environment variable that names cuBLAS explicitly.
pub const CUBLAS_ENV: &str = "PAGED_ENGINE_CUBLAS";

/// File names tried in every folder, newest first.
pub const CUBLAS_NAMES: [&str; 3] = ["libcublas.so.13", "libcublas.so.12", "libcublas.so"];

/// Where to look: the process's environment, or a test's.
#[derive(Clone, Debug, Default)]
pub struct SearchEnv {
    /// `PAGED_ENGINE_CUBLAS`.
    pub explicit: Option<PathBuf>,
    /// `LD_LIBRARY_PATH`.
    pub ld_library_path: Option<OsString>,
    /// Folders that may hold `python3.*/site-packages` (or `dist-packages`).
    pub python_roots: Vec<PathBuf>,
    /// CUDA toolkit and system library folders, in order.
    pub system_dirs: Vec<PathBuf>,
}

impl SearchEnv {
    /// This process's environment (see the module docs for the folders).
    pub fn from_process() -> Self {
        let var = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
        let mut python_roots = Vec::new();
        for k in ["VIRTUAL_ENV", "CONDA_PREFIX"] {
            if let Some(v) = var(k) {
                python_roots.push(PathBuf::from(v).join("lib"));
            }
        }
        python_roots.extend(["/usr/local/lib", "/usr/lib"].map(PathBuf::from));
        if let Some(home) = var("HOME") {
            python_roots.push(PathBuf::from(home).join(".local/lib"));
        }
        let mut system_dirs = Vec::new();
        for k in ["CUDA_HOME", "CUDA_PATH"] {
            if let Some(v) = var(k) {
                system_dirs.push(PathBuf::from(v).join("lib64"));
            }
        }
        system_dirs.extend(
            [
                "/usr/local/cuda/lib64",
                "/usr/lib/x86_64-linux-gnu",
                "/usr/lib/aarch64-linux-gnu",
                "/usr/lib64",
                "/usr/lib",
            ]
            .map(PathBuf::from),
        );
        Self {
            explicit: var(CUBLAS_ENV).map(PathBuf::from),
            ld_library_path: var("LD_LIBRARY_PATH"),
            python_roots,
            system_dirs,
        }
    }

    /// Every folder to look in, in order (the explicit override alone when set).
    fn folders(&self) -> Vec<PathBuf> {
        let mut out = Vec::new();
        if let Some(ld) = &self.ld_library_path {
            out.extend(std::env::split_paths(ld).filter(|p| !p.as_os_str().is_empty()));
        }
        for root in &self.python_roots {
            for site in site_packages(root) {
                out.push(site.join("nvidia/cu13/lib"));
                out.push(site.join("nvidia/cublas/lib"));
            }
        }
        out.extend(self.system_dirs.iter().cloned());
        out
    }
}

/// `root/python3*/{site,dist}-packages` and `root/python3/dist-packages`,
/// sorted for a stable order.
fn site_packages(root: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(root) else {
        return Vec::new();
    };
    let mut pythons: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with("python3"))
        .map(|e| e.path())
        .collect();
    pythons.sort();
    pythons
        .into_iter()
        .flat_map(|p| [p.join("site-packages"), p.join("dist-packages")])
        .filter(|p| p.is_dir())
        .collect()
}

/// The cuBLAS library to open, or an error naming every path tried.
pub fn find_cublas(env: &SearchEnv) -> Result<PathBuf, GpuError> {
    let mut tried = Vec::new();
    if let Some(explicit) = &env.explicit {
        let candidates: Vec<PathBuf> = if explicit.is_dir() {
            CUBLAS_NAMES.iter().map(|n| explicit.join(n)).collect()
        } else {
            vec![explicit.clone()]
        };
        for c in candidates {
            if c.is_file() {
                return Ok(c);
            }
            tried.push(c);
        }
        return Err(not_found(&tried, &format!("{CUBLAS_ENV} is set: ")));
    }
    for folder in env.folders() {
        for name in CUBLAS_NAMES {
            let c = folder.join(name);
            if c.is_file() {
                return Ok(c);
            }
            tried.push(c);
        }
    }
    Err(not_found(&tried, ""))
}

fn not_found(tried: &[PathBuf], prefix: &str) -> GpuError {
    let list: Vec<String> = tried.iter().map(|p| p.display().to_string()).collect();
    GpuError::unavailable(format!(
        "{prefix}cuBLAS 12 or 13 was not found; tried {}. Set {CUBLAS_ENV} to the \
         libcublas.so.* file (or its folder), or add its folder to LD_LIBRARY_PATH",
        list.join(", ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn touch(p: &Path) {
        std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
        std::fs::write(p, b"").expect("write");
    }

    #[test]
    fn finds_the_pytorch_cu13_wheel_folder() {
        let root = tempfile::tempdir().expect("tmp");
        let lib = root.path().join("python3.12/site-packages/nvidia/cu13/lib");
        touch(&lib.join("libcublas.so.13"));
        let env = SearchEnv {
            python_roots: vec![root.path().to_path_buf()],
            ..SearchEnv::default()
        };
        assert_eq!(
            find_cublas(&env).expect("found"),
            lib.join("libcublas.so.13")
        );
    }

    #[test]
    fn ld_library_path_comes_first_and_13_before_12() {
        let a = tempfile::tempdir().expect("tmp");
        let b = tempfile::tempdir().expect("tmp");
        touch(&a.path().join("libcublas.so.12"));
        touch(&b.path().join("libcublas.so.13"));
        touch(&b.path().join("libcublas.so.12"));
        let sys = tempfile::tempdir().expect("tmp");
        touch(&sys.path().join("libcublas.so.13"));
        let ld = std::env::join_paths([a.path(), b.path()]).expect("join");
        let env = SearchEnv {
            ld_library_path: Some(ld),
            system_dirs: vec![sys.path().to_path_buf()],
            ..SearchEnv::default()
        };
        // First folder wins even with only .so.12 in it.
        assert_eq!(
            find_cublas(&env).expect("found"),
            a.path().join("libcublas.so.12")
        );
        let env = SearchEnv {
            ld_library_path: Some(b.path().as_os_str().to_owned()),
            ..env
        };
        assert_eq!(
            find_cublas(&env).expect("found"),
            b.path().join("libcublas.so.13")
        );
        // Nothing on LD_LIBRARY_PATH: the system folder.
        let env = SearchEnv {
            ld_library_path: None,
            ..env
        };
        assert_eq!(
            find_cublas(&env).expect("found"),
            sys.path().join("libcublas.so.13")
        );
    }

    #[test]
    fn the_explicit_override_is_the_only_place_looked_at() {
        let dir = tempfile::tempdir().expect("tmp");
        let file = dir.path().join("custom/libcublas.so.13.1.0.3");
        touch(&file);
        let other = tempfile::tempdir().expect("tmp");
        touch(&other.path().join("libcublas.so.12"));
        let env = SearchEnv {
            explicit: Some(file.clone()),
            system_dirs: vec![other.path().to_path_buf()],
            ..SearchEnv::default()
        };
        assert_eq!(find_cublas(&env).expect("file"), file);
        let env = SearchEnv {
            explicit: Some(file.parent().expect("dir").to_path_buf()),
            ..env
        };
        // A folder holding none of the names: an error, no fallback.
        let e = find_cublas(&env).expect_err("no fallback").to_string();
        assert!(
            e.contains(CUBLAS_ENV) && e.contains("custom/libcublas.so.13"),
            "{e}"
        );
    }

    #[test]
    fn a_miss_names_every_path_tried() {
        let root = tempfile::tempdir().expect("tmp");
        std::fs::create_dir_all(root.path().join("python3.11/dist-packages")).expect("mkdir");
        let sys = tempfile::tempdir().expect("tmp");
        let env = SearchEnv {
            python_roots: vec![root.path().to_path_buf()],
            system_dirs: vec![sys.path().to_path_buf()],
            ..SearchEnv::default()
        };
        let e = find_cublas(&env).expect_err("nothing there").to_string();
        for want in [
            root.path()
                .join("python3.11/dist-packages/nvidia/cu13/lib/libcublas.so.13"),
            root.path()
                .join("python3.11/dist-packages/nvidia/cublas/lib/libcublas.so.12"),
            sys.path().join("libcublas.so"),
        ] {
            assert!(
                e.contains(&want.display().to_string()),
                "{want:?} missing: {e}"
            );
        }
    }
}
