//! Tensor parallelism through the real binary under `mpiexec` (feature
//! `mpi`; CI installs MPICH): greedy ids over 2 and 3 ranks equal one
//! rank's on the golden prompts, for SmolLM2 (quantized and float32),
//! Qwen2.5-Coder-0.5B (uneven FFN blocks) and Gemma-3-270M (its one KV
//! head replicated), all through HTTP on rank 0, with LoRA adapters and
//! with chunked prefill, preemption, prefix caching, async scheduling,
//! beam search, structured outputs and speculative decoding (SmolLM2); a
//! rank killed
//! mid-request ends the whole job, bounded, the client getting an error;
//! and started without `mpiexec`, the server is the HTTP front of its own
//! job (`--distributed-executor-backend mp`, the default, or `mpi`): the
//! golden ids again through it, and a killed rank gives its clients a 500
//! or an SSE error event before it exits non-zero.
//!
//! Every server runs `--batch-invariant`, so a prompt's ids do not depend
//! on which prompts share its steps and the prompts can be sent at once.
//! Each model skips, printing why, when its file is missing.
#![cfg(feature = "mpi")]

use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_server");

/// An `mpiexec` job (or one plain server), ended on drop.
struct Job {
    child: Child,
    port: u16,
    log: PathBuf,
}

impl Drop for Job {
    fn drop(&mut self) {
        // SIGTERM: rank 0 shuts down gracefully and tells the other ranks
        // to stop; mpiexec forwards it to every rank.
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

fn mpiexec_available() -> bool {
    Command::new("mpiexec").arg("--version").output().is_ok()
}

/// How the ranks start.
#[derive(Clone, Copy, PartialEq)]
enum Start {
    /// `mpiexec -n N server ...`: rank 0 serves HTTP.
    Mpiexec,
    /// `server ... --distributed-executor-backend mpi` alone: the HTTP
    /// front, which runs `mpiexec` itself.
    Front,
    /// `server --tensor-parallel-size N` alone (the default backend, `mp`):
    /// the same front, as a vLLM user starts it.
    Mp,
}

/// Starts `ranks` ranks (1: the plain server, no MPI) on `model` under
/// `mpiexec`, and waits until rank 0 answers /health.
fn launch(ranks: usize, model: &Path, extra: &[&str]) -> Job {
    launch_as(Start::Mpiexec, ranks, model, extra)
}

/// [`launch`], started as `start` says.
fn launch_as(start: Start, ranks: usize, model: &Path, extra: &[&str]) -> Job {
    let port = free_port();
    let log = std::env::temp_dir().join(format!("tp-{port}.log"));
    let mut cmd = if ranks == 1 {
        Command::new(BIN)
    } else {
        let mut c = match start {
            Start::Mpiexec => {
                let mut c = Command::new("mpiexec");
                c.args(["-n", &ranks.to_string(), BIN]);
                c
            }
            Start::Front | Start::Mp => Command::new(BIN),
        };
        c.args(["--tensor-parallel-size", &ranks.to_string()]);
        if start != Start::Mp {
            c.args(["--distributed-executor-backend", "mpi"]);
        }
        c
    };
    if !extra.contains(&"--swap-space") {
        cmd.args(["--swap-space", "0"]);
    }
    cmd.args(["--model", &model.display().to_string()])
        .args(["--port", &port.to_string(), "--threads", "1"])
        .args(["--max-model-len", "1024", "--kv-cache-memory", "0.25"])
        .args(["--batch-invariant", "--served-model-name", "m"])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log file"));
    let mut job = Job {
        child: cmd
            .spawn()
            .expect("mpiexec (apt-get install mpich) or the server starts"),
        port,
        log,
    };
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        if let Ok(Some(status)) = job.child.try_wait() {
            panic!(
                "{ranks} ranks exited ({status}) before serving:\n{}",
                job.log_text()
            );
        }
        if http(job.addr(), "GET", "/health", None).is_some_and(|(s, _)| s == 200) {
            return job;
        }
        assert!(
            Instant::now() < deadline,
            "not up in 180 s:\n{}",
            job.log_text()
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

impl Job {
    fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// Waits until the job exits, at most `within` from `since`; panics
    /// with `what` and the log past that.
    fn wait_exit(&mut self, since: Instant, within: Duration, what: &str) -> ExitStatus {
        loop {
            if let Some(s) = self.child.try_wait().expect("wait") {
                return s;
            }
            assert!(since.elapsed() < within, "{what}:\n{}", self.log_text());
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// One HTTP/1.1 exchange: `None` when the connection fails or closes
/// before a whole response.
fn http(addr: SocketAddr, method: &str, path: &str, body: Option<&Value>) -> Option<(u16, String)> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(300))).ok()?;
    let body = body.map(Value::to_string).unwrap_or_default();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    let (head, rest) = out.split_once("\r\n\r\n")?;
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    Some((status, rest.to_string()))
}

/// Greedy completions of every prompt (sent at once): each one's tokens.
fn greedy(job: &Job, prompts: &[Vec<u32>], n: usize) -> Vec<Vec<String>> {
    greedy_as(job, "m", prompts, n)
}

/// [`greedy`] with `model` (the base model's name or an adapter's).
fn greedy_as(job: &Job, model: &str, prompts: &[Vec<u32>], n: usize) -> Vec<Vec<String>> {
    let addr = job.addr();
    std::thread::scope(|s| {
        let handles: Vec<_> = prompts
            .iter()
            .map(|p| {
                s.spawn(move || {
                    let body = json!({"model": model, "prompt": p, "max_tokens": n,
                        "temperature": 0, "logprobs": 1, "ignore_eos": true});
                    let (status, text) =
                        http(addr, "POST", "/v1/completions", Some(&body)).expect("response");
                    assert_eq!(status, 200, "{text}");
                    let v: Value = serde_json::from_str(&text).expect("json");
                    v["choices"][0]["logprobs"]["tokens"]
                        .as_array()
                        .expect("tokens")
                        .iter()
                        .map(|t| t.as_str().unwrap_or_default().to_string())
                        .collect::<Vec<String>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("client"))
            .collect()
    })
}

fn fixture(name: &str) -> Vec<Vec<u32>> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures")
        .join(name);
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&path).expect("fixture"))
        .expect("fixture json");
    v["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .map(|c| {
            c["prompt_ids"]
                .as_array()
                .expect("prompt_ids")
                .iter()
                .map(|i| i.as_u64().expect("id") as u32)
                .collect()
        })
        .collect()
}

fn model(file: &str) -> Option<PathBuf> {
    let p = model_loader::paths::models_dir().join(file);
    if p.is_file() {
        Some(p)
    } else {
        eprintln!("SKIP {file}: missing (cargo xtask fetch-model)");
        None
    }
}

/// Greedy tokens over 2 and 3 ranks equal one rank's.
fn same_over_ranks(file: &str, golden: &str, extra: &[&str]) {
    if !mpiexec_available() {
        eprintln!("SKIP tensor parallel: no mpiexec (apt-get install mpich)");
        return;
    }
    let Some(path) = model(file) else { return };
    let prompts = fixture(golden);
    let want = greedy(&launch(1, &path, extra), &prompts, 32);
    for ranks in [2, 3] {
        let got = greedy(&launch(ranks, &path, extra), &prompts, 32);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g, w, "{file} {extra:?}, {ranks} ranks, prompt {i}");
        }
    }
}

/// LoRA adapters over CPU ranks: rank 0 sends each adapter once, each
/// rank adds its slice's delta (B's rows for q/k/v and gate/up, A's
/// columns for o and down); greedy ids with two adapters, over 2 ranks,
/// equal one rank's and differ from the base model's.
#[test]
fn lora_adapters_over_ranks() {
    if !mpiexec_available() {
        eprintln!("SKIP tensor parallel: no mpiexec (apt-get install mpich)");
        return;
    }
    let Some(path) = model("SmolLM2-135M-Instruct.Q4_1.gguf") else {
        return;
    };
    let tmp = tempfile::tempdir().expect("tempdir");
    let names = ["all-r16", "qko-r8"];
    let modules: Vec<String> = names
        .iter()
        .map(|n| {
            let (dir, _) = model_loader::lora_gen::write_reference(&path, tmp.path(), n, false)
                .expect("reference adapter");
            format!("{n}={}", dir.display())
        })
        .collect();
    let mut extra = vec!["--enable-lora", "--max-loras", "2", "--lora-modules"];
    extra.extend(modules.iter().map(String::as_str));
    let prompts = &fixture("smollm2_golden.json")[..4];
    let run = |ranks: usize| {
        let job = launch(ranks, &path, &extra);
        let base = greedy(&job, prompts, 16);
        let adapted: Vec<_> = names
            .iter()
            .map(|n| greedy_as(&job, n, prompts, 16))
            .collect();
        (base, adapted)
    };
    let (base, want) = run(1);
    for (n, w) in names.iter().zip(&want) {
        assert_ne!(w, &base, "adapter {n} changes no token");
    }
    let (base2, got) = run(2);
    assert_eq!(base2, base, "base model over 2 ranks");
    for ((n, g), w) in names.iter().zip(&got).zip(&want) {
        assert_eq!(g, w, "adapter {n} over 2 ranks");
    }
}

/// A counter of rank 0's `/metrics`: the first sample of `name` whose
/// labels contain `label`.
fn counter(job: &Job, name: &str, label: &str) -> f64 {
    let (_, text) = http(job.addr(), "GET", "/metrics", None).expect("metrics");
    text.lines()
        .find(|l| {
            let rest = l.strip_prefix(name).unwrap_or_default();
            (rest.starts_with('{') || rest.starts_with(' ')) && l.contains(label)
        })
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("{name} {label} missing from /metrics:\n{text}"))
}

/// The completions' texts of one request.
fn texts(job: &Job, body: &Value) -> Vec<String> {
    let (status, text) = http(job.addr(), "POST", "/v1/completions", Some(body)).expect("response");
    assert_eq!(status, 200, "{text}");
    let v: Value = serde_json::from_str(&text).expect("json");
    v["choices"]
        .as_array()
        .expect("choices")
        .iter()
        .map(|c| c["text"].as_str().unwrap_or_default().to_string())
        .collect()
}

/// What the scheduler does besides plain decoding keeps working over
/// ranks, 2 answering as 1 does: chunked prefill (32-token chunks of
/// 37-41-token prompts), preemption by recompute and by swapping (12 KV
/// blocks for 4 requests needing 6 each; the swapped blocks move on every
/// rank), prefix-cache hits (the same prompts again), async scheduling,
/// beam search and structured outputs.
#[test]
fn scheduler_features_over_ranks() {
    if !mpiexec_available() {
        eprintln!("SKIP tensor parallel: no mpiexec (apt-get install mpich)");
        return;
    }
    let Some(path) = model("SmolLM2-135M-Instruct.Q4_1.gguf") else {
        return;
    };
    for mode in ["recompute", "swap"] {
        features_over_ranks(&path, mode);
    }
}

fn features_over_ranks(path: &Path, mode: &str) {
    let extra = [
        "--max-num-batched-tokens",
        "32",
        "--num-gpu-blocks-override",
        "12",
        "--preemption-mode",
        mode,
        "--swap-space",
        "0.05",
        "--async-scheduling",
    ];
    let prompts = &fixture("smollm2_golden.json")[..4];
    let beam = json!({"prompt": "The capital of France is", "max_tokens": 8, "n": 2,
        "best_of": 3, "use_beam_search": true, "temperature": 0, "ignore_eos": true});
    let schema = json!({"type": "object", "properties": {"people": {"type": "integer",
        "maximum": 99999999}}, "required": ["people"], "additionalProperties": false});
    let structured = json!({"prompt": "How many people live in Paris? As JSON:",
        "max_tokens": 60, "temperature": 0, "guided_json": schema});
    let run = |ranks: usize| {
        let job = launch(ranks, path, &extra);
        let first = greedy(&job, prompts, 48);
        let again = greedy(&job, prompts, 48);
        let answers = (first, again, texts(&job, &beam), texts(&job, &structured));
        let mode_label = format!("mode=\"{mode}\"");
        let preempted = counter(&job, "vllm:num_preemptions_by_mode_total", &mode_label);
        let hits = counter(&job, "vllm:prefix_cache_hits_total", "");
        (answers, preempted, hits)
    };
    let (want, preempted, hits) = run(1);
    assert!(
        preempted > 0.0,
        "{mode}: no {mode} preemption with 12 blocks"
    );
    assert!(hits > 0.0, "no prefix-cache hit");
    assert_eq!(want.0, want.1, "the same prompts again (prefix-cache hits)");
    let obj: Value = serde_json::from_str(&want.3[0]).expect("structured output is JSON");
    assert!(obj["people"].is_i64(), "{obj}");
    let (got, preempted2, _) = run(2);
    assert!(
        preempted2 > 0.0,
        "{mode}: no {mode} preemption over 2 ranks"
    );
    assert_eq!(got.0, want.0, "{mode}: greedy under preemption, 2 ranks");
    assert_eq!(got.1, want.1, "{mode}: prefix-cache hits, 2 ranks");
    assert_eq!(got.2, want.2, "{mode}: beam search, 2 ranks");
    assert_eq!(got.3, want.3, "{mode}: structured output, 2 ranks");
}

/// Speculative decoding (n-gram proposals, verified k + 1 rows at a time)
/// over 2 ranks: greedy ids equal one rank's without speculation, and
/// proposals were accepted.
#[test]
fn speculative_decoding_over_ranks() {
    if !mpiexec_available() {
        eprintln!("SKIP tensor parallel: no mpiexec (apt-get install mpich)");
        return;
    }
    let Some(path) = model("SmolLM2-135M-Instruct.Q4_1.gguf") else {
        return;
    };
    let prompts = &fixture("smollm2_golden.json")[..4];
    let want = greedy(&launch(1, &path, &[]), prompts, 48);
    let spec = r#"{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 1}"#;
    let job = launch(2, &path, &["--speculative-config", spec]);
    assert_eq!(greedy(&job, prompts, 48), want, "speculative, 2 ranks");
    let accepted = counter(&job, "vllm:spec_decode_num_accepted_tokens_total", "");
    assert!(accepted > 0.0, "no proposal accepted");
}

#[test]
fn smollm2_quantized_over_ranks() {
    same_over_ranks(
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        "smollm2_golden.json",
        &[],
    );
}

#[test]
fn smollm2_float32_over_ranks() {
    same_over_ranks(
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        "smollm2_golden.json",
        &["--dtype", "float32"],
    );
}

#[test]
fn qwen_coder_over_ranks() {
    same_over_ranks(
        "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        "qwen2.5_coder_golden.json",
        &[],
    );
}

#[test]
fn gemma3_replicated_kv_head_over_ranks() {
    same_over_ranks("gemma-3-270m-q4_k_m.gguf", "gemma3_golden.json", &[]);
}

/// Process ids whose command line holds `needle` and whose environment
/// says MPI rank `rank` (MPICH's PMI_RANK).
fn rank_pids(needle: &str, rank: usize) -> Vec<u32> {
    let want = format!("PMI_RANK={rank}");
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let env = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
            String::from_utf8_lossy(&cmd).contains(needle)
                && env.split(|&b| b == 0).any(|v| v == want.as_bytes())
        })
        .collect()
}

#[test]
fn a_killed_rank_ends_the_job_and_the_client_gets_an_error() {
    if !mpiexec_available() {
        eprintln!("SKIP tensor parallel: no mpiexec (apt-get install mpich)");
        return;
    }
    let Some(path) = model("SmolLM2-135M-Instruct.Q4_1.gguf") else {
        return;
    };
    let mut job = launch(2, &path, &[]);
    let port = job.port.to_string();
    let needle = format!("--port\0{port}\0");
    let addr = job.addr();
    let client = std::thread::spawn(move || {
        let body = json!({"model": "m", "prompt": "Tell me a long story.",
            "max_tokens": 800, "temperature": 0, "ignore_eos": true});
        http(addr, "POST", "/v1/completions", Some(&body))
    });
    std::thread::sleep(Duration::from_secs(2));
    let victims = rank_pids(&needle, 1);
    assert_eq!(victims.len(), 1, "rank 1's process: {victims:?}");
    Command::new("kill")
        .args(["-KILL", &victims[0].to_string()])
        .status()
        .expect("kill");
    let killed = Instant::now();
    // The client gets no successful answer: the connection ends without a
    // response or with a server error.
    match client.join().expect("client") {
        None => {}
        Some((status, body)) => assert!(status >= 500, "{status}: {body}"),
    }
    // The whole job ends, non-zero, within a bounded time.
    let status = job.wait_exit(
        killed,
        Duration::from_secs(60),
        "the job still runs 60 s after a rank died",
    );
    assert!(!status.success(), "mpiexec exited {status}");
    assert!(rank_pids(&needle, 0).is_empty(), "rank 0 still runs");
    println!("job ended {:?} after the kill ({status})", killed.elapsed());
}

/// The processes below `pid` (children, their children, ...).
fn descendants(pid: u32) -> Vec<u32> {
    let parents: Vec<(u32, u32)> = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let p: u32 = e.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).ok()?;
            // "pid (comm) state ppid ...": comm may hold spaces.
            let ppid = stat.rsplit_once(')')?.1.split_whitespace().nth(1)?;
            Some((p, ppid.parse().ok()?))
        })
        .collect();
    let mut out = vec![pid];
    let mut i = 0;
    while i < out.len() {
        let parent = out[i];
        out.extend(
            parents
                .iter()
                .filter(|(_, pp)| *pp == parent)
                .map(|(p, _)| *p),
        );
        i += 1;
    }
    out.remove(0);
    out
}

/// Whether `pid` names a process that has not exited (a zombie has).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| Some(s.rsplit_once(')')?.1.split_whitespace().next()? != "Z"))
        .unwrap_or(false)
}

/// Started without `mpiexec` and without a backend flag (`mp`, as a vLLM
/// user starts it), the server is the HTTP front of its own job: the
/// golden ids over 2 ranks through it; then, with rank 1 killed,
/// an open stream gets an SSE error event, a waiting request a 500 with
/// OpenAI's error body, and the front and every rank exit (bounded, the
/// front non-zero).
#[test]
fn through_the_front_a_killed_rank_gives_clients_a_server_error() {
    if !mpiexec_available() {
        eprintln!("SKIP tensor parallel: no mpiexec (apt-get install mpich)");
        return;
    }
    let Some(path) = model("SmolLM2-135M-Instruct.Q4_1.gguf") else {
        return;
    };
    let prompts = fixture("smollm2_golden.json");
    let want = greedy(&launch(1, &path, &[]), &prompts[..4], 16);
    let mut job = launch_as(Start::Mp, 2, &path, &[]);
    assert_eq!(
        greedy(&job, &prompts[..4], 16),
        want,
        "through the front (mp)"
    );
    let addr = job.addr();
    let request = move |stream: bool| {
        std::thread::spawn(move || {
            let body = json!({"model": "m", "prompt": "Tell me a long story.",
                "max_tokens": 800, "temperature": 0, "ignore_eos": true, "stream": stream});
            http(addr, "POST", "/v1/completions", Some(&body))
        })
    };
    let (streamed, waiting) = (request(true), request(false));
    std::thread::sleep(Duration::from_secs(2));
    let ranks = descendants(job.child.id());
    let victim = rank_pids("--served-model-name", 1)
        .into_iter()
        .find(|p| ranks.contains(p))
        .expect("rank 1 below the front");
    Command::new("kill")
        .args(["-KILL", &victim.to_string()])
        .status()
        .expect("kill");
    let killed = Instant::now();
    let (status, body) = streamed.join().expect("client").expect("a streamed answer");
    assert_eq!(status, 200, "{body}");
    assert!(
        body.contains("\"error\"") && body.contains("tensor-parallel"),
        "no error event in the stream: {body}"
    );
    let tail = body.len().saturating_sub(400);
    println!("the stream ended with: {}", &body[tail..]);
    let (status, body) = waiting.join().expect("client").expect("an answer");
    assert_eq!(status, 500, "{body}");
    let err: Value = serde_json::from_str(&body).expect("OpenAI error body");
    assert_eq!(err["error"]["type"], "InternalServerError", "{body}");
    let status = job.wait_exit(
        killed,
        Duration::from_secs(60),
        "the front still runs 60 s after a rank died",
    );
    assert!(!status.success(), "the front exited {status}");
    let left: Vec<u32> = ranks.into_iter().filter(|&p| alive(p)).collect();
    assert!(left.is_empty(), "processes of the job still run: {left:?}");
    println!(
        "front ended {:?} after the kill ({status})",
        killed.elapsed()
    );
    println!("the waiting request got 500: {body}");
}

/// Waits (bounded) until none of `procs` runs.
fn all_gone(procs: &[u32], within: Duration) -> Vec<u32> {
    let start = Instant::now();
    loop {
        let left: Vec<u32> = procs.iter().copied().filter(|&p| alive(p)).collect();
        if left.is_empty() || start.elapsed() > within {
            return left;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// SIGKILL to the front (no clean-up of its own) still ends the job: the
/// launcher gets SIGTERM when its parent dies.
#[test]
fn a_killed_front_leaves_no_rank_behind() {
    if !mpiexec_available() {
        eprintln!("SKIP tensor parallel: no mpiexec (apt-get install mpich)");
        return;
    }
    let Some(path) = model("SmolLM2-135M-Instruct.Q4_1.gguf") else {
        return;
    };
    let job = launch_as(Start::Front, 2, &path, &[]);
    let procs = descendants(job.child.id());
    assert!(
        procs.len() >= 3,
        "mpiexec and two ranks below the front: {procs:?}"
    );
    Command::new("kill")
        .args(["-KILL", &job.child.id().to_string()])
        .status()
        .expect("kill");
    let left = all_gone(&procs, Duration::from_secs(30));
    assert!(
        left.is_empty(),
        "processes of the job still run 30 s after: {left:?}"
    );
}

/// SIGTERM to the front stops the job cleanly: the front exits 0 and no
/// process of the job is left.
#[test]
fn sigterm_to_the_front_stops_every_rank() {
    if !mpiexec_available() {
        eprintln!("SKIP tensor parallel: no mpiexec (apt-get install mpich)");
        return;
    }
    let Some(path) = model("SmolLM2-135M-Instruct.Q4_1.gguf") else {
        return;
    };
    let mut job = launch_as(Start::Front, 2, &path, &[]);
    let procs = descendants(job.child.id());
    assert!(
        procs.len() >= 3,
        "mpiexec and two ranks below the front: {procs:?}"
    );
    Command::new("kill")
        .args(["-TERM", &job.child.id().to_string()])
        .status()
        .expect("kill");
    let sent = Instant::now();
    let status = job.wait_exit(
        sent,
        Duration::from_secs(30),
        "the front still runs 30 s after SIGTERM",
    );
    assert!(status.success(), "{status}:\n{}", job.log_text());
    let left: Vec<u32> = procs.into_iter().filter(|&p| alive(p)).collect();
    assert!(left.is_empty(), "processes of the job still run: {left:?}");
}
