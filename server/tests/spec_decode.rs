//! `--speculative-config` through the real server on the default model:
//! greedy completions equal those of a server without it (prompt lookup,
//! and the model as its own draft, where every proposal is accepted), on
//! the float32 path and the default quantized path; vLLM's
//! `vllm:spec_decode_*` counters on `/metrics`; beam search refused with
//! a 400 naming the parameter; a draft file that does not load stops
//! startup with a message naming the field.

mod common;

use clap::Parser;
use common::{get, metric, metric_where, post, start};
use serde_json::json;

const PROMPTS: [&str; 4] = [
    "Repeat this list exactly: apples, pears, plums, apples, pears, plums, apples,",
    "def add(a, b):\n    return a + b\n\n\ndef add(a, b):\n    return",
    "The capital of France is",
    "One two three four five. One two three four five. One two",
];

/// Each prompt's greedy completion text and token count.
fn completions(s: &common::TestServer) -> Vec<(String, u64)> {
    PROMPTS
        .iter()
        .map(|p| {
            let r = post(
                s.addr,
                "/v1/completions",
                &json!({"prompt": p, "max_tokens": 24, "temperature": 0}),
            );
            assert_eq!(r.status, 200, "{}", r.body);
            let v = r.json();
            (
                v["choices"][0]["text"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
                v["usage"]["completion_tokens"].as_u64().unwrap_or_default(),
            )
        })
        .collect()
}

fn ngram() -> &'static str {
    r#"{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3, "prompt_lookup_min": 1}"#
}

#[test]
fn greedy_completions_equal_those_without_speculation() {
    let model = model_loader::paths::default_model_path();
    let model = model.to_str().expect("utf-8 path").to_string();
    let draft = format!(r#"{{"model": "{model}", "num_speculative_tokens": 3}}"#);
    for dtype in ["float32", "auto"] {
        let plain = completions(&start(&["--dtype", dtype]));
        for (name, cfg) in [("ngram", ngram()), ("draft", draft.as_str())] {
            let s = start(&["--dtype", dtype, "--speculative-config", cfg]);
            assert_eq!(completions(&s), plain, "{name}, --dtype {dtype}");
            let m = get(s.addr, "/metrics").body;
            let drafts = metric(&m, "vllm:spec_decode_num_drafts_total");
            let proposed = metric(&m, "vllm:spec_decode_num_draft_tokens_total");
            let accepted = metric(&m, "vllm:spec_decode_num_accepted_tokens_total");
            let first = metric_where(
                &m,
                "vllm:spec_decode_num_accepted_tokens_per_pos_total",
                "position=\"0\"",
            );
            assert!(drafts > 0.0 && proposed >= drafts, "{name}: {m}");
            assert!(accepted > 0.0 && accepted <= proposed, "{name}: {m}");
            assert!(first <= drafts && first > 0.0, "{name}: {m}");
            if name == "draft" && dtype == "float32" {
                // The model as its own draft agrees with itself.
                assert_eq!(accepted, proposed, "{m}");
            }
            // Every block is back once the requests are done.
            let total = metric(&m, "vllm:kv_cache_total_blocks");
            assert_eq!(metric(&m, "vllm:kv_cache_free_blocks"), total);
        }
    }
}

#[test]
fn beam_search_is_refused_and_metrics_are_absent_without_speculation() {
    let s = start(&["--speculative-config", ngram()]);
    let r = post(
        s.addr,
        "/v1/completions",
        &json!({"prompt": "Hi", "max_tokens": 4, "use_beam_search": true, "n": 2}),
    );
    assert_eq!(r.status, 400, "{}", r.body);
    assert_eq!(r.json()["error"]["param"], "use_beam_search", "{}", r.body);
    let plain = start(&[]);
    let m = get(plain.addr, "/metrics").body;
    assert!(!m.contains("spec_decode"), "{m}");
}

#[test]
fn a_draft_that_does_not_load_stops_startup() {
    let cfg = r#"{"method": "draft_model", "model": "/nonexistent/draft.gguf", "num_speculative_tokens": 2}"#;
    let cli = server::cli::Cli::try_parse_from([
        "server",
        "--max-model-len",
        "512",
        "--speculative-config",
        cfg,
    ])
    .expect("the flag parses");
    let e = server::app::build_state(&cli.serve)
        .err()
        .expect("startup refused");
    let msg = format!("{e:#}");
    assert!(msg.contains("speculative config: `model`"), "{msg}");
    assert!(msg.contains("/nonexistent/draft.gguf"), "{msg}");
    // A bad field is refused by the flag's parser, naming it.
    let e = server::cli::Cli::try_parse_from([
        "server",
        "--speculative-config",
        r#"{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 3, "prompt_lookup_max": 2}"#,
    ])
    .expect_err("refused");
    assert!(e.to_string().contains("prompt_lookup_min"), "{e}");
}
