//! The real `server` binary on a model other than the default (the tiny
//! random-weight model): engine flags written before and after the
//! subcommand both reach the engine, for `generate` and `serve`, and a bad
//! flag value is refused before any model loads.

mod common;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_server");

/// The tiny model, written once per test process.
fn tiny_model() -> &'static PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("cli-tiny");
        model_loader::tiny::write_tiny_model(&dir)
            .expect("tiny model (needs the default model: `cargo xtask fetch-model`)")
            .gguf
    })
}

fn server(args: &[&str]) -> Command {
    let mut c = Command::new(BIN);
    c.args(args)
        .env("NO_COLOR", "1")
        .env("RUST_LOG", "info")
        .stdin(Stdio::null());
    c
}

fn run(args: &[&str]) -> Output {
    server(args).output().expect("the server binary runs")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn generate_uses_the_model_flag_before_and_after_the_subcommand() {
    let tiny = tiny_model().to_str().expect("utf-8 path");
    let common = ["--threads", "1", "--kv-cache-memory", "0.05"];
    let gen = ["generate", "--prompt", "Hello there", "--max-tokens", "8"];
    let before: Vec<&str> = ["--model", tiny]
        .iter()
        .chain(&common)
        .chain(&gen)
        .copied()
        .collect();
    let after: Vec<&str> = gen
        .iter()
        .chain(&["--model", tiny])
        .chain(&common)
        .copied()
        .collect();
    let default: Vec<&str> = common.iter().chain(&gen).copied().collect();
    let mut outs = Vec::new();
    for (how, argv) in [
        ("before", &before),
        ("after", &after),
        ("default", &default),
    ] {
        let o = run(argv);
        let (stdout, stderr) = (text(&o.stdout), text(&o.stderr));
        assert!(o.status.success(), "{how}: {stderr}");
        let loaded_tiny = stderr.contains(tiny);
        assert_eq!(
            loaded_tiny,
            how != "default",
            "{how}: which model was loaded? log:\n{stderr}"
        );
        outs.push(stdout);
    }
    assert!(!outs[0].trim().is_empty(), "tiny generated nothing");
    assert_eq!(outs[0], outs[1], "the same model and prompt, greedy");
    assert_ne!(
        outs[0], outs[2],
        "the tiny model answers differently from SmolLM2"
    );
}

/// A child server process, killed on drop.
struct Served {
    child: Child,
    addr: std::net::SocketAddr,
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts the binary with `--port 0` somewhere in `args` and reads the
/// address it logs.
fn serve(args: &[&str]) -> Served {
    let mut child = server(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let stderr = child.stderr.take().expect("stderr");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut log = String::new();
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            log.push_str(&line);
            log.push('\n');
            if let Some(rest) = line.split("at http://").nth(1) {
                let addr = rest.trim_end_matches("/v1").trim().to_string();
                let _ = tx.send(Ok(addr));
            }
        }
        let _ = tx.send(Err(log));
    });
    let addr = match rx.recv_timeout(Duration::from_secs(120)) {
        Ok(Ok(a)) => a.parse().expect("address"),
        Ok(Err(log)) => panic!("the server exited:\n{log}"),
        Err(_) => panic!("the server did not start in time"),
    };
    Served { child, addr }
}

#[test]
fn serve_uses_the_model_flag_before_and_after_the_subcommand() {
    let tiny = tiny_model().to_str().expect("utf-8 path");
    let common = ["--threads", "1", "--kv-cache-memory", "0.05"];
    let cases: [(&str, Vec<&str>); 3] = [
        (
            "before serve",
            ["--model", tiny]
                .iter()
                .chain(&common)
                .chain(&["serve", "--port", "0"])
                .copied()
                .collect(),
        ),
        (
            "after serve",
            ["serve", "--port", "0", "--model", tiny]
                .iter()
                .chain(&common)
                .copied()
                .collect(),
        ),
        (
            "no subcommand",
            ["--port", "0", "--model", tiny]
                .iter()
                .chain(&common)
                .copied()
                .collect(),
        ),
    ];
    for (how, argv) in &cases {
        let srv = serve(argv);
        let models = common::get(srv.addr, "/v1/models");
        assert_eq!(models.status, 200, "{how}: {}", models.body);
        let m = &models.json()["data"][0];
        // The tiny model: named after its file, 512 positions (SmolLM2 has 8192).
        assert_eq!(m["id"], "tiny", "{how}: {m}");
        assert_eq!(m["max_model_len"], 512, "{how}: {m}");
        let r = common::post(
            srv.addr,
            "/v1/completions",
            &serde_json::json!({"prompt": "Hello", "max_tokens": 3, "temperature": 0}),
        );
        assert_eq!(r.status, 200, "{how}: {}", r.body);
        assert_eq!(r.json()["model"], "tiny", "{how}");
    }
}

#[test]
fn bad_values_are_refused_before_the_model_loads() {
    // A model path that does not exist: a refusal that names the flag comes
    // from the parser, not from loading.
    for (argv, flag, range) in [
        (
            &["--gpu-memory-utilization", "7"][..],
            "--gpu-memory-utilization",
            "(0, 1]",
        ),
        (
            &["generate", "--prompt", "p", "--block-size", "0"][..],
            "--block-size",
            "1..=256",
        ),
        (
            &["--max-num-seqs", "0", "serve"][..],
            "--max-num-seqs",
            ">= 1",
        ),
    ] {
        let mut full = vec!["--model", "/nonexistent/model.gguf"];
        full.extend_from_slice(argv);
        let o = run(&full);
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{argv:?}: a usage error: {err}");
        assert!(err.contains(flag) && err.contains(range), "{argv:?}: {err}");
        assert!(!err.contains("no model at"), "{argv:?}: {err}");
    }
}
