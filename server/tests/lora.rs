//! Multi-LoRA serving through the real server over loopback, against the
//! reference (`model_loader::lora_gen`: seeded PEFT adapters and the base
//! GGUF merged with each at F32, written into a temp dir by the test).
//!
//! - `adapters_match_their_merged_models`: greedy ids with an adapter equal
//!   the merged model's (both f32), and the zero adapter's merged model
//!   equals the base (the reference's own proof).
//! - `mixed_batch_runtime_updates_and_cache`: a concurrent batch mixing the
//!   base and three adapters under `--max-loras 2` gives each request its
//!   solo ids; runtime load/unload (vLLM's switch), an unknown name (404),
//!   bad adapters (400) while a request runs, which still gets its ids; the
//!   same prompt under two adapters shares no prefix-cache block; no block
//!   stays in use at the end; `vllm:lora_requests_info`.

mod common;

use common::{get, metric, post, start_open};
use model_loader::lora_gen::write_reference;
use serde_json::json;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

const PROMPTS: [&str; 2] = [
    "The capital of France is",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
];

fn base() -> PathBuf {
    model_loader::paths::default_model_path()
}

fn ids(addr: SocketAddr, model: &str, prompt: &str, max_tokens: usize) -> Vec<u64> {
    let r = post(
        addr,
        "/v1/completions",
        &json!({"model": model, "prompt": prompt, "max_tokens": max_tokens,
                "temperature": 0, "return_token_ids": true, "ignore_eos": true}),
    );
    assert_eq!(r.status, 200, "{model}: {}", r.body);
    r.json()["choices"][0]["token_ids"]
        .as_array()
        .expect("token_ids")
        .iter()
        .map(|v| v.as_u64().expect("id"))
        .collect()
}

fn model_name(addr: SocketAddr) -> String {
    get(addr, "/v1/models").json()["data"][0]["id"]
        .as_str()
        .expect("id")
        .to_string()
}

fn path_str(p: &Path) -> String {
    p.to_str().expect("utf-8 temp path").to_string()
}

#[test]
fn adapters_match_their_merged_models() {
    let tmp = tempfile::tempdir().expect("tempdir");
    // The zero adapter proves the reference; all-r16 adapts all seven
    // targets (fused q/k/v and gate/up by column, o and down accumulated).
    let names = ["zero", "all-r16"];
    let files: Vec<(PathBuf, PathBuf)> = names
        .iter()
        .map(|n| write_reference(&base(), tmp.path(), n, true).expect("reference"))
        .collect();
    let modules: Vec<String> = names
        .iter()
        .zip(&files)
        .map(|(n, (dir, _))| format!("{n}={}", path_str(dir)))
        .collect();
    let mut argv = vec![
        "--dtype",
        "float32",
        "--kv-cache-memory",
        "0.1",
        "--enable-lora",
        "--max-loras",
        "2",
        "--lora-modules",
    ];
    argv.extend(modules.iter().map(String::as_str));
    let served = start_open(&argv);
    let base_name = model_name(served.addr);
    let base_ids: Vec<Vec<u64>> = PROMPTS
        .iter()
        .map(|p| ids(served.addr, &base_name, p, 12))
        .collect();
    let mut changed = 0;
    for (n, (_, merged)) in names.iter().zip(&files) {
        let m = start_open(&[
            "--model",
            &path_str(merged),
            "--dtype",
            "float32",
            "--kv-cache-memory",
            "0.1",
        ]);
        let m_name = model_name(m.addr);
        for (i, p) in PROMPTS.iter().enumerate() {
            let with_adapter = ids(served.addr, n, p, 12);
            let reference = ids(m.addr, &m_name, p, 12);
            assert_eq!(with_adapter, reference, "adapter {n}, prompt {i}");
            if *n == "zero" {
                assert_eq!(
                    reference, base_ids[i],
                    "zero adapter's merged model vs base, prompt {i}"
                );
            } else if reference != base_ids[i] {
                changed += 1;
            }
        }
    }
    // all-r16 changes the ids of at least one prompt (both prompts' ids must
    // still equal the merged model's).
    assert!(
        changed >= 1,
        "the random adapter must change greedy outputs ({changed} changed)"
    );
}

/// A PEFT folder whose rank is above `--max-lora-rank 16`.
fn rank_too_large(dir: &Path) -> PathBuf {
    let d = dir.join("rank64");
    let g = model_loader::gguf::GgufFile::open(&base()).expect("base");
    let config = model_loader::gguf_model::config_from_gguf(&g).expect("config");
    let mut spec = model_loader::lora_gen::reference_set()[1].1.clone();
    spec.rank = 64;
    model_loader::lora_gen::write_random_peft(&d, &config, &spec).expect("write");
    d
}

#[test]
fn mixed_batch_runtime_updates_and_cache() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let names = ["qv-r8", "all-r16", "mlp-r4-rslora", "qko-r8"];
    let dirs: Vec<PathBuf> = names
        .iter()
        .map(|n| {
            write_reference(&base(), tmp.path(), n, false)
                .expect("reference")
                .0
        })
        .collect();
    let modules: Vec<String> = names[..3]
        .iter()
        .zip(&dirs)
        .map(|(n, d)| format!("{n}={}", path_str(d)))
        .collect();
    std::env::set_var(server::lora::RUNTIME_UPDATING_ENV, "True");
    let mut argv = vec!["--enable-lora", "--max-loras", "2", "--lora-modules"];
    argv.extend(modules.iter().map(String::as_str));
    let s = start_open(&argv);
    let addr = s.addr;
    let base_name = model_name(addr);

    // /v1/models: the base, then each adapter with the base as parent.
    let models = get(addr, "/v1/models").json();
    let data = models["data"].as_array().expect("data");
    assert_eq!(data.len(), 4, "{models}");
    for n in &names[..3] {
        let card = data.iter().find(|c| c["id"] == *n).expect("adapter listed");
        assert_eq!(card["parent"], base_name.as_str());
    }

    // Solo ids, then all of them at once, interleaved.
    let models_used: Vec<&str> = vec![&base_name, names[0], names[1], names[2]];
    let mut solo = Vec::new();
    for m in &models_used {
        for p in PROMPTS {
            solo.push(((*m).to_string(), p, ids(addr, m, p, 10)));
        }
    }
    assert_ne!(
        solo[0].2, solo[2].2,
        "an adapter must change the base's greedy ids"
    );
    let handles: Vec<_> = solo
        .iter()
        .map(|(m, p, _)| {
            let (m, p) = (m.clone(), p.to_string());
            std::thread::spawn(move || ids(addr, &m, &p, 10))
        })
        .collect();
    for (h, (m, _, want)) in handles.into_iter().zip(&solo) {
        assert_eq!(&h.join().expect("thread"), want, "{m} in the mixed batch");
    }

    // Runtime updates while a long request runs.
    let long_want = ids(addr, names[1], PROMPTS[1], 48);
    let long = std::thread::spawn(move || ids(addr, "all-r16", PROMPTS[1], 48));
    let load = |name: &str, path: &str| {
        post(
            addr,
            "/v1/load_lora_adapter",
            &json!({"lora_name": name, "lora_path": path}),
        )
    };
    let r = load("qko", &path_str(&dirs[3]));
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(r.body.contains("added successfully"), "{}", r.body);
    let r = load("qko", &path_str(&dirs[3]));
    assert_eq!(r.status, 400, "{}", r.body);
    let r = load("big", &path_str(&rank_too_large(tmp.path())));
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.body.contains("rank 64"), "{}", r.body);
    let r = load("gone", &path_str(&tmp.path().join("no-such-adapter")));
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.body.contains("missing file"), "{}", r.body);
    let r = post(
        addr,
        "/v1/unload_lora_adapter",
        &json!({"lora_name": "nope"}),
    );
    assert_eq!(r.status, 404, "{}", r.body);
    assert_eq!(r.json()["error"]["type"], "NotFoundError");
    let r = post(
        addr,
        "/v1/completions",
        &json!({"model": "nope", "prompt": "x", "max_tokens": 1}),
    );
    assert_eq!(r.status, 404, "{}", r.body);
    assert_eq!(
        r.json()["error"]["message"],
        "The model `nope` does not exist."
    );
    assert_eq!(ids(addr, "qko", PROMPTS[0], 4).len(), 4);
    let r = post(
        addr,
        "/v1/unload_lora_adapter",
        &json!({"lora_name": "qko"}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let r = post(
        addr,
        "/v1/completions",
        &json!({"model": "qko", "prompt": "x", "max_tokens": 1}),
    );
    assert_eq!(r.status, 404, "{}", r.body);
    assert_eq!(
        long.join().expect("long request"),
        long_want,
        "disturbed by the updates"
    );
    // What was loaded before is untouched.
    assert_eq!(ids(addr, names[0], PROMPTS[0], 10), solo[2].2);

    // The prefix cache: the same prompt under another adapter finds nothing,
    // under the same adapter it finds its blocks.
    let prompt = "Once upon a time ".repeat(12);
    let hits = |addr| metric(&get(addr, "/metrics").body, "vllm:prefix_cache_hits_total");
    ids(addr, names[0], &prompt, 1);
    let h0 = hits(addr);
    ids(addr, names[1], &prompt, 1);
    ids(addr, &base_name, &prompt, 1);
    assert_eq!(hits(addr), h0, "a block was shared across adapters");
    ids(addr, names[0], &prompt, 1);
    assert!(
        hits(addr) >= h0 + 32.0,
        "the same adapter must hit its own blocks"
    );

    // Nothing leaked; the LoRA gauge as vLLM writes it.
    let body = get(addr, "/metrics").body;
    assert_eq!(metric(&body, "vllm:kv_cache_usage_perc"), 0.0, "{body}");
    let line = body
        .lines()
        .find(|l| l.starts_with("vllm:lora_requests_info{"))
        .expect("vllm:lora_requests_info");
    assert!(
        line.starts_with(
            "vllm:lora_requests_info{max_lora=\"2\",waiting_lora_adapters=\"\",running_lora_adapters=\"\"} "
        ),
        "{line}"
    );
}
