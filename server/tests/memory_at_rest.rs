//! Memory at rest: the real `server` binary on the default model with the
//! default KV flags (a 1 GiB pool and a 1 GiB swap pool) reserves its pools
//! but holds only what it has used: its resident memory before the first
//! request, and its peak while starting, stay far below the pools' size.
//! A writing pass over the pools at startup (`vec![f16::ZERO; n]`, a
//! warm-up or profiling forward over every block) fails this test. Then one
//! completion is served, to show the lazily mapped pools work.
//!
//! Linux only (it reads `/proc/PID/status`); skips when the default model is
//! missing (`cargo xtask fetch-model`).

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_server");
const MIB: u64 = 1024;
const GIB: u64 = 1024 * MIB;

/// The pools' default size (`--kv-cache-memory 1 --swap-space 1`), KiB.
const POOLS_KIB: u64 = 2 * GIB;
/// Resident memory the idle server may hold, KiB: the model (98 MB file,
/// ~165 MB resident in release) with room to spare, well below the pools.
const IDLE_LIMIT_KIB: u64 = 600 * MIB;

/// A child server, killed on drop.
struct Served {
    child: Child,
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A `kB` field of `/proc/PID/status`, in KiB.
fn status_kib(pid: u32, field: &str) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc/PID/status");
    text.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("{field} in /proc/{pid}/status"))
}

#[test]
fn default_server_idles_far_below_its_reserved_kv_pools() {
    if !std::path::Path::new("/proc/self/status").exists() {
        eprintln!("SKIP memory_at_rest: no /proc/PID/status to read (not Linux)");
        return;
    }
    let model = model_loader::paths::default_model_path();
    if !model.exists() {
        eprintln!(
            "SKIP memory_at_rest: no default model at {} (`cargo xtask fetch-model`)",
            model.display()
        );
        return;
    }
    let t0 = Instant::now();
    // Only the port is set: the KV pools, threads and model are the defaults.
    let mut child = Command::new(BIN)
        .args(["--port", "0"])
        .env("NO_COLOR", "1")
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the server binary");
    let stderr = child.stderr.take().expect("stderr");
    let srv = Served { child };
    let pid = srv.child.id();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        // Drains the log for the server's whole life (a full pipe would
        // block it); the lines up to the address go to the test.
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let mut log = String::new();
    let addr: std::net::SocketAddr = loop {
        match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(line) => {
                log.push_str(&line);
                log.push('\n');
                if let Some(rest) = line.split("at http://").nth(1) {
                    break rest
                        .trim_end_matches("/v1")
                        .trim()
                        .parse()
                        .expect("address");
                }
            }
            Err(e) => panic!("the server did not start ({e}):\n{log}"),
        }
    };
    let health = common::get(addr, "/health");
    assert_eq!(health.status, 200, "{}", health.body);
    let started = t0.elapsed();

    let (size, rss, peak) = (
        status_kib(pid, "VmSize"),
        status_kib(pid, "VmRSS"),
        status_kib(pid, "VmHWM"),
    );
    eprintln!(
        "idle server after {started:.1?}: VmSize {} MiB, VmRSS {} MiB, VmHWM {} MiB",
        size / MIB,
        rss / MIB,
        peak / MIB
    );
    // The pools are there (address space) ...
    assert!(
        size >= POOLS_KIB,
        "VmSize {size} KiB: are the default 2 GiB of pools reserved?\n{log}"
    );
    // ... and not resident, now or at any point of startup.
    assert!(
        rss < IDLE_LIMIT_KIB,
        "idle VmRSS {rss} KiB of {POOLS_KIB} KiB reserved: pools touched at startup?\n{log}"
    );
    assert!(
        peak < IDLE_LIMIT_KIB,
        "VmHWM {peak} KiB during startup: pools touched, then released?\n{log}"
    );
    // The startup log states both.
    assert!(
        log.contains("reserved") && log.contains("process resident now"),
        "the startup log states what is reserved and what is resident:\n{log}"
    );

    let r = common::post(
        addr,
        "/v1/completions",
        &serde_json::json!({
            "prompt": "The capital of France is",
            "max_tokens": 16,
            "temperature": 0
        }),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let j = r.json();
    let text = j["choices"][0]["text"].as_str().unwrap_or_default();
    assert!(!text.trim().is_empty(), "{j}");
    assert!(
        j["usage"]["completion_tokens"]
            .as_u64()
            .is_some_and(|n| n > 0),
        "{j}"
    );
    let after = status_kib(pid, "VmRSS");
    eprintln!(
        "after one completion ({:.1?} in all): VmRSS {} MiB",
        t0.elapsed(),
        after / MIB
    );
    assert!(
        after < IDLE_LIMIT_KIB,
        "VmRSS {after} KiB after one short completion"
    );
}
