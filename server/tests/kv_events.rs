//! KV cache events end to end: the real server (SmolLM2, the real engine,
//! a 40-block KV cache so that prompts evict each other) publishes with
//! `--kv-events-config`, and `tests/python/kv_events_subscriber.py`
//! subscribes with pyzmq (libzmq) and decodes with msgspec using vLLM's own
//! struct definitions (needs `pip install pyzmq msgspec`; without them it
//! prints SKIP and passes, as the openai-client test does; CI installs them).
//!
//! Checked here, on what the subscriber received: every batch decodes as
//! vLLM's types; the live batches are numbered without gaps and equal the
//! replay socket's copies byte for byte; each prompt's full blocks are
//! stored as a chain from a `None` parent whose token ids, in parent order,
//! are the prompt's; a block completed while decoding is stored under a
//! parent stored before; blocks are removed once the cache is full, only after
//! being stored; applied in order the events never store a present hash
//! nor remove an absent one, and leave at most the pool's 40 blocks.

mod common;

use serde_json::{json, Value};
use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BLOCK: usize = 16;
const BLOCKS: usize = 40;
const PROMPT_LEN: usize = 150;
const PROMPTS: usize = 6;

fn free_ports() -> (u16, u16) {
    // Both bound at once, so they differ.
    let a = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let b = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = |l: &std::net::TcpListener| l.local_addr().expect("addr").port();
    (port(&a), port(&b))
}

fn python_ready() -> bool {
    match Command::new("python3")
        .args(["-c", "import zmq, msgspec"])
        .output()
    {
        Ok(o) if o.status.success() => true,
        Ok(o) => {
            eprintln!(
                "SKIP kv_events: python3 cannot import zmq/msgspec (pip install pyzmq msgspec): {}",
                String::from_utf8_lossy(&o.stderr).trim()
            );
            false
        }
        Err(e) => {
            eprintln!("SKIP kv_events: no python3 ({e})");
            false
        }
    }
}

/// Distinct prompts of token ids (no two share a block).
fn prompts() -> Vec<Vec<u32>> {
    (0..PROMPTS)
        .map(|p| {
            (0..PROMPT_LEN)
                .map(|i| (1000 + p * PROMPT_LEN + i) as u32)
                .collect()
        })
        .collect()
}

/// A stored block: (hash, parent, its token ids).
type Block = (u64, Option<u64>, Vec<u32>);

#[test]
fn events_follow_real_requests() {
    if !python_ready() {
        return;
    }
    let (port, replay_port) = free_ports();
    let topic = "kv-events";
    let config = json!({
        "enable_kv_cache_events": true,
        "publisher": "zmq",
        "endpoint": format!("tcp://*:{port}"),
        "replay_endpoint": format!("tcp://*:{replay_port}"),
        "topic": topic,
    })
    .to_string();
    let server = common::start(&[
        "--num-gpu-blocks-override",
        &BLOCKS.to_string(),
        "--kv-events-config",
        &config,
    ]);

    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/python/kv_events_subscriber.py"
    );
    let mut child = Command::new("python3")
        .args([
            script,
            &format!("tcp://127.0.0.1:{port}"),
            &format!("tcp://127.0.0.1:{replay_port}"),
            topic,
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3 runs");
    let mut out = BufReader::new(child.stdout.take().expect("stdout"));
    let mut line = String::new();
    out.read_line(&mut line).expect("read");
    assert_eq!(line.trim(), "ready", "subscriber did not start");

    let prompts = prompts();
    for p in &prompts {
        let r = common::post(
            server.addr,
            "/v1/completions",
            // 12 tokens: the first 10 written after the prompt complete a
            // 10th block, stored alone with the prompt's last as parent.
            &json!({"prompt": p, "max_tokens": 12, "temperature": 0, "ignore_eos": true}),
        );
        assert_eq!(r.status, 200, "{}", r.body);
    }
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(b"done\n")
        .expect("write");

    // The subscriber stops after a quiet second; bound the wait.
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        if start.elapsed() > Duration::from_secs(120) {
            let _ = child.kill();
            panic!("the subscriber did not finish within 120 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut stdout = String::new();
    out.read_to_string(&mut stdout).expect("read");
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut stderr)
        .expect("read");
    assert!(status.success(), "subscriber failed: {stderr}\n{stdout}");
    let doc: Value = serde_json::from_str(stdout.trim()).expect("one JSON document");
    check(&doc, &prompts);
    // The publisher's counters on /metrics: every batch sent, none dropped.
    let metrics = common::get(server.addr, "/metrics").body;
    let sent = common::metric(&metrics, "vllm:kv_events_published_batches_total");
    let received = doc["live"].as_array().map_or(0, Vec::len) as f64;
    assert!(
        sent >= received && sent > 0.0,
        "{sent} sent, {received} received"
    );
    assert_eq!(
        common::metric(&metrics, "vllm:kv_events_dropped_batches_total"),
        0.0
    );
}

fn u64s(v: &Value) -> Vec<u64> {
    v.as_array()
        .expect("list")
        .iter()
        .map(|x| x.as_u64().expect("uint"))
        .collect()
}

fn check(doc: &Value, prompts: &[Vec<u32>]) {
    assert_eq!(doc["topic_ok"], true, "topic frame");
    assert_eq!(doc["live_equals_replay"], true, "live != replayed bytes");
    let replay = doc["replay"].as_array().expect("replay");
    let live = doc["live"].as_array().expect("live");
    let seqs: Vec<u64> = replay.iter().map(|b| b[0].as_u64().expect("seq")).collect();
    assert_eq!(
        seqs,
        (0..seqs.len() as u64).collect::<Vec<_>>(),
        "replay from 0 holds every batch, numbered without gaps"
    );
    let live_seqs: Vec<u64> = live.iter().map(|b| b[0].as_u64().expect("seq")).collect();
    assert!(!live_seqs.is_empty(), "nothing arrived live");
    let first = live_seqs[0];
    assert_eq!(
        live_seqs,
        (first..seqs.len() as u64).collect::<Vec<_>>(),
        "live batches from the first one on, no gap"
    );

    // Apply every event in order, as a router would.
    let mut present: HashSet<u64> = HashSet::new();
    let mut stored: Vec<Block> = Vec::new();
    let mut removed = 0usize;
    let mut ever: HashSet<u64> = HashSet::new();
    let mut with_parent = 0usize;
    for b in replay {
        let batch = &b[1];
        assert_eq!(batch["data_parallel_rank"], 0);
        assert!(
            batch["ts"].as_f64().expect("ts") > 1.7e9,
            "ts is Unix seconds"
        );
        for ev in batch["events"].as_array().expect("events") {
            match ev["type"].as_str().expect("type") {
                "BlockStored" => {
                    assert_eq!(ev["block_size"], BLOCK);
                    assert_eq!(ev["medium"], "GPU");
                    assert_eq!(ev["lora_id"], Value::Null);
                    assert_eq!(ev["group_idx"], 0);
                    assert_eq!(ev["kv_cache_spec_kind"], "full_attention");
                    let hashes = u64s(&ev["block_hashes"]);
                    let tokens = u64s(&ev["token_ids"]);
                    assert_eq!(tokens.len(), hashes.len() * BLOCK);
                    let mut parent = ev["parent_block_hash"].as_u64();
                    if let Some(p) = parent {
                        assert!(ever.contains(&p), "parent {p} was never stored");
                        with_parent += 1;
                    }
                    for (h, t) in hashes.iter().zip(tokens.chunks(BLOCK)) {
                        ever.insert(*h);
                        assert!(present.insert(*h), "{h} stored while present");
                        stored.push((*h, parent, t.iter().map(|&x| x as u32).collect()));
                        parent = Some(*h);
                    }
                }
                "BlockRemoved" => {
                    assert_eq!(ev["medium"], "GPU");
                    for h in u64s(&ev["block_hashes"]) {
                        assert!(present.remove(&h), "{h} removed but not present");
                        removed += 1;
                    }
                }
                "AllBlocksCleared" => present.clear(),
                other => panic!("unknown event {other}"),
            }
        }
    }
    assert!(
        present.len() <= BLOCKS,
        "{} blocks findable in a {BLOCKS}-block pool",
        present.len()
    );
    let full_blocks = PROMPT_LEN / BLOCK;
    assert!(
        removed >= PROMPTS * full_blocks - BLOCKS,
        "{} prompt blocks through a {BLOCKS}-block pool, only {removed} removed",
        PROMPTS * full_blocks
    );

    assert!(
        with_parent >= PROMPTS,
        "each request's decode completes a block stored under a parent: {with_parent}"
    );
    eprintln!(
        "kv events: {} batches ({} live), {} blocks stored, {removed} removed, {} findable at the end",
        replay.len(),
        live.len(),
        stored.len(),
        present.len()
    );

    // Each prompt: its full blocks chained from a None parent, in order.
    let by_link: HashMap<(Option<u64>, &[u32]), u64> = stored
        .iter()
        .map(|(h, p, t)| ((*p, t.as_slice()), *h))
        .collect();
    for (i, p) in prompts.iter().enumerate() {
        let mut parent = None;
        for (k, chunk) in p.chunks_exact(BLOCK).enumerate() {
            let Some(&h) = by_link.get(&(parent, chunk)) else {
                panic!("prompt {i}: block {k} not stored under parent {parent:?}");
            };
            parent = Some(h);
        }
    }
}
