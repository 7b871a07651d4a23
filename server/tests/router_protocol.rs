//! What routers in front of replicas read from us: the model-server
//! protocol's metrics (checked against `fixtures/model_server_protocol.txt`
//! and parsed whole by the Prometheus Python client's parser), and two real
//! replicas behind the real `smg` router (SGLang's model gateway, the wheel
//! from PyPI that `.ci/run` installs, pinned).
//!
//! The Python parts print `SKIP` and pass where `python3`,
//! `prometheus_client` or `smg` is missing; `.ci/run` installs them, so CI
//! runs them.

mod common;

use common::{get, metric, metric_where, post, start_open, TestServer};
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::net::{SocketAddr, TcpListener};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A prompt of more than two full blocks (16 tokens each) around `topic`.
fn long_prompt(topic: &str, tail: usize) -> String {
    format!(
        "You are a careful assistant. Explain {topic} to a curious student, step by step, \
         with one example and one common mistake, in plain words and short sentences. \
         Question number {tail}:"
    )
}

/// The protocol's rows: (sample name, type, labels every sample carries).
fn protocol_rows() -> Vec<(String, String, Vec<String>)> {
    include_str!("fixtures/model_server_protocol.txt")
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .map(|l| {
            let mut w = l.split_whitespace().map(str::to_string);
            let name = w.next().expect("name");
            let kind = w.next().expect("type");
            (name, kind, w.collect())
        })
        .collect()
}

/// One sample line of the text format: name, labels, value.
fn parse_sample(line: &str) -> (String, BTreeMap<String, String>, f64) {
    let (head, value) = line.rsplit_once(' ').expect("a sample has a value");
    let value: f64 = value.parse().unwrap_or_else(|e| panic!("{line}: {e}"));
    let Some((name, labels)) = head.split_once('{') else {
        return (head.to_string(), BTreeMap::new(), value);
    };
    let labels = labels.strip_suffix('}').expect("closing brace");
    let mut out = BTreeMap::new();
    // Values in these tests hold no `",` sequence.
    for pair in labels.split("\",") {
        let (k, v) = pair.split_once("=\"").expect("key=\"value\"");
        out.insert(k.to_string(), v.trim_end_matches('"').to_string());
    }
    (name.to_string(), out, value)
}

/// Checks the structure a scraper relies on without any Python: every
/// sample belongs to a family with `# HELP` and `# TYPE`, declared once;
/// returns each family's type by sample name.
fn check_structure(body: &str) -> BTreeMap<String, (String, Vec<BTreeMap<String, String>>)> {
    let mut types: BTreeMap<String, String> = BTreeMap::new();
    let mut helps = BTreeSet::new();
    let mut samples: BTreeMap<String, (String, Vec<BTreeMap<String, String>>)> = BTreeMap::new();
    for line in body.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').expect("TYPE name kind");
            assert!(
                types.insert(name.to_string(), kind.to_string()).is_none(),
                "{name} declared twice"
            );
        } else if let Some(rest) = line.strip_prefix("# HELP ") {
            helps.insert(rest.split_once(' ').expect("HELP name text").0.to_string());
        } else if !line.is_empty() {
            assert!(!line.starts_with('#'), "unexpected comment line {line}");
            let (name, labels, _) = parse_sample(line);
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| {
                    name.strip_suffix(s)
                        .filter(|f| types.get(*f).is_some_and(|k| k == "histogram"))
                })
                .unwrap_or(&name)
                .to_string();
            let kind = types
                .get(&family)
                .unwrap_or_else(|| panic!("{name}: no # TYPE before it"));
            assert!(helps.contains(&family), "{family}: no # HELP");
            samples
                .entry(name)
                .or_insert_with(|| (kind.clone(), Vec::new()))
                .1
                .push(labels);
        }
    }
    samples
}

/// Runs `tests/python/parse_metrics.py` over `body`; `None` when Python or
/// its Prometheus client is missing.
fn python_parse(body: &str) -> Option<Vec<Value>> {
    let probe = Command::new("python3")
        .args(["-c", "import prometheus_client"])
        .output();
    match probe {
        Ok(o) if o.status.success() => {}
        _ => {
            eprintln!("SKIP the Python parse: python3 cannot import prometheus_client");
            return None;
        }
    }
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/python/parse_metrics.py");
    let mut child = Command::new("python3")
        .arg(script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3 runs");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(body.as_bytes())
        .expect("write body");
    let out = child.wait_with_output().expect("parser finishes");
    assert!(
        out.status.success(),
        "the Prometheus parser refused /metrics: {}\n{body}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(
        String::from_utf8(out.stdout)
            .expect("utf-8")
            .lines()
            .map(|l| serde_json::from_str(l).expect("json line"))
            .collect(),
    )
}

#[test]
fn metrics_follow_the_model_server_protocol() {
    let TestServer { addr, state } = start_open(&["--num-gpu-blocks-override", "96"]);
    // The same long prompt twice: the second finds the first's full blocks.
    for _ in 0..2 {
        let r = post(
            addr,
            "/v1/completions",
            &json!({"prompt": long_prompt("photosynthesis", 0), "max_tokens": 2}),
        );
        assert_eq!(r.status, 200, "{}", r.body);
    }
    let body = get(addr, "/metrics").body;
    let samples = check_structure(&body);
    let model = state.served_model_name.clone();
    for (name, kind, labels) in protocol_rows() {
        let (got_kind, all) = samples
            .get(&name)
            .unwrap_or_else(|| panic!("{name} missing from /metrics:\n{body}"));
        assert_eq!(got_kind, &kind, "{name}'s type");
        for l in all {
            for key in &labels {
                assert!(l.contains_key(key), "{name} lacks label {key}: {l:?}");
            }
            if labels.iter().any(|k| k == "model_name") {
                assert_eq!(l["model_name"], model, "{name}");
            }
            assert_eq!(l["engine"], "0", "{name}");
        }
    }
    // The values a prefix-aware router reads.
    let info = &samples["vllm:cache_config_info"].1[0];
    assert_eq!(info["block_size"], "16");
    assert_eq!(info["num_gpu_blocks"], "96");
    assert_eq!(info["num_gpu_blocks_override"], "96");
    assert_eq!(info["enable_prefix_caching"], "True");
    let queries = metric(&body, "vllm:prefix_cache_queries_total");
    let hits = metric(&body, "vllm:prefix_cache_hits_total");
    assert!(
        hits >= 32.0 && hits % 16.0 == 0.0 && queries > hits,
        "token counts: {hits} hits of {queries} queried"
    );
    let usage = metric(&body, "vllm:kv_cache_usage_perc");
    assert!((0.0..=1.0).contains(&usage), "{usage}");

    let Some(parsed) = python_parse(&body) else {
        return;
    };
    // The reference parser saw every family we wrote, with our types, and
    // the prefix-cache counters say they count tokens.
    for (name, kind, _) in protocol_rows() {
        let s = parsed
            .iter()
            .find(|s| s["name"] == name.as_str())
            .unwrap_or_else(|| panic!("the parser did not see {name}"));
        assert_eq!(s["type"], kind.as_str(), "{name}");
        if name.starts_with("vllm:prefix_cache_") {
            let help = s["help"].as_str().unwrap_or_default();
            assert!(help.contains("tokens"), "{name}: {help}");
        }
    }
    let seen: BTreeSet<&str> = parsed.iter().filter_map(|s| s["name"].as_str()).collect();
    assert_eq!(
        seen.len(),
        samples.len(),
        "every sample name parsed: {seen:?}"
    );
}

/// A free loopback port (bound, read, released).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// Kills the router when the test ends, however it ends.
struct Router(Child);

impl Drop for Router {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Finished requests a replica has counted (any reason).
fn finished(addr: SocketAddr) -> f64 {
    let body = get(addr, "/metrics").body;
    ["stop", "length", "abort"]
        .iter()
        .map(|r| {
            metric_where(
                &body,
                "vllm:request_success_total",
                &format!("finished_reason=\"{r}\""),
            )
        })
        .sum()
}

#[test]
fn two_replicas_behind_smg_keep_each_prefix_on_one_replica() {
    if Command::new("smg").arg("--help").output().is_err() {
        eprintln!("SKIP two replicas behind smg: no `smg` on PATH (pip install smg==1.13.0)");
        return;
    }
    let replicas = [start_open(&[]), start_open(&[])];
    let port = free_port();
    let urls: Vec<String> = replicas
        .iter()
        .map(|r| format!("http://{}", r.addr))
        .collect();
    let mut cmd = Command::new("smg");
    cmd.args(["launch", "--host", "127.0.0.1", "--port", &port.to_string()])
        .arg("--worker-urls")
        .args(&urls)
        .args(["--policy", "cache_aware"])
        .args(["--prometheus-port", &free_port().to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let _router = Router(cmd.spawn().expect("smg starts"));
    let router: SocketAddr = format!("127.0.0.1:{port}").parse().expect("addr");

    // Up when it answers a completion (it health-checks the replicas first).
    let model = replicas[0].state.served_model_name.clone();
    let ask = |prompt: &str| {
        post(
            router,
            "/v1/completions",
            &json!({"model": model, "prompt": prompt, "max_tokens": 2}),
        )
    };
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let listening = std::net::TcpStream::connect(router).is_ok();
        let up =
            listening && std::panic::catch_unwind(|| ask("Hello").status == 200).unwrap_or(false);
        if up {
            break;
        }
        assert!(Instant::now() < deadline, "smg never served a request");
        std::thread::sleep(Duration::from_millis(500));
    }
    // Both replicas in rotation: smg health-checks them one by one, and a
    // replica it has not yet marked healthy gets nothing. A prompt with no
    // cached prefix goes to the least-loaded replica (ties to the first), so
    // only concurrent requests reach the second: send pairs until both have
    // finished one.
    let mut i = 0;
    while finished(replicas[0].addr) == 0.0 || finished(replicas[1].addr) == 0.0 {
        assert!(Instant::now() < deadline, "smg never used both replicas");
        std::thread::scope(|s| {
            let pair: Vec<_> = ["a", "b"]
                .iter()
                .map(|w| {
                    let prompt = format!("{w}{i} warm-up");
                    let body = json!({"model": model, "prompt": prompt, "max_tokens": 16});
                    s.spawn(move || post(router, "/v1/completions", &body).status)
                })
                .collect();
            for h in pair {
                assert_eq!(h.join().expect("warm-up thread"), 200);
            }
        });
        i += 1;
        std::thread::sleep(Duration::from_millis(200));
    }

    // 4 shared prefixes, 6 requests each, interleaved in an order that
    // rotates every round (so round-robin would move every prefix); one at
    // a time, so each replica's finished count says which one served.
    let topics = [
        "photosynthesis",
        "plate tectonics",
        "compound interest",
        "the TCP handshake",
    ];
    let mut served_by: BTreeMap<&str, BTreeSet<usize>> = BTreeMap::new();
    let mut before = [finished(replicas[0].addr), finished(replicas[1].addr)];
    for round in 0..6 {
        for k in 0..topics.len() {
            let topic = topics[(k + round) % topics.len()];
            let r = ask(&long_prompt(topic, round));
            assert_eq!(r.status, 200, "{topic} #{round}: {}", r.body);
            let after = [finished(replicas[0].addr), finished(replicas[1].addr)];
            let which: Vec<usize> = (0..2).filter(|&i| after[i] > before[i]).collect();
            assert_eq!(
                which.len(),
                1,
                "exactly one replica served: {before:?} -> {after:?}"
            );
            served_by.entry(topic).or_default().insert(which[0]);
            before = after;
        }
    }
    for (topic, replicas) in &served_by {
        assert_eq!(replicas.len(), 1, "{topic} went to replicas {replicas:?}");
    }
    // Which replica a new prefix lands on is smg's tie-break (load and
    // cached-tree size at that moment; CI once saw all four on replica 0),
    // not a property of ours, so it is reported, not asserted. The warm-up above proved both
    // replicas were in rotation, so round-robin or random routing would
    // have split prefixes and failed the check above.
    eprintln!("prefixes by replica: {served_by:?}");
}
