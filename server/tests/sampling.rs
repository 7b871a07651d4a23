//! Sampling parameters over real HTTP with the real model and engine:
//! seeded sampling is reproducible, n with temperature gives distinct
//! choices from one engine group, beam search and best_of answer, and top
//! logprobs come back in the completions format.

mod common;

use common::{post, start, TestServer};
use serde_json::{json, Value};
use std::sync::OnceLock;

fn server() -> &'static TestServer {
    static S: OnceLock<TestServer> = OnceLock::new();
    S.get_or_init(|| start(&["--num-gpu-blocks-override", "1024"]))
}

fn texts(v: &Value) -> Vec<String> {
    v["choices"]
        .as_array()
        .expect("choices")
        .iter()
        .map(|c| c["text"].as_str().expect("text").to_string())
        .collect()
}

#[test]
fn seeded_sampling_is_reproducible_over_http() {
    let addr = server().addr;
    let body = json!({"prompt": "The weather today is", "max_tokens": 12, "temperature": 1.0,
        "seed": 1234, "ignore_eos": true});
    let a = post(addr, "/v1/completions", &body).json();
    let b = post(addr, "/v1/completions", &body).json();
    assert_eq!(texts(&a), texts(&b));
    let mut other = body.clone();
    other["seed"] = json!(99);
    let c = post(addr, "/v1/completions", &other).json();
    assert_ne!(
        texts(&a),
        texts(&c),
        "a different seed drew the same 12 tokens"
    );
}

#[test]
fn n_with_temperature_gives_distinct_choices() {
    let addr = server().addr;
    let body = json!({"prompt": "Once upon a time", "max_tokens": 10, "n": 3,
        "temperature": 1.2, "seed": 7, "ignore_eos": true});
    let v = post(addr, "/v1/completions", &body).json();
    let t = texts(&v);
    assert_eq!(t.len(), 3);
    assert!(
        t[0] != t[1] || t[1] != t[2],
        "three identical samples: {t:?}"
    );
    assert_eq!(v["usage"]["completion_tokens"], 30);
}

#[test]
fn beam_search_and_best_of_requests_work() {
    let addr = server().addr;
    let body = json!({"prompt": "The capital of France is", "max_tokens": 6, "n": 2,
        "best_of": 3, "use_beam_search": true, "temperature": 0, "ignore_eos": true});
    let v = post(addr, "/v1/completions", &body).json();
    let t = texts(&v);
    assert_eq!(t.len(), 2, "{v}");
    assert_ne!(t[0], t[1], "beams must differ");
    let best = json!({"prompt": "The capital of France is", "max_tokens": 6, "n": 1,
        "best_of": 3, "temperature": 1.0, "seed": 3, "ignore_eos": true});
    let v = post(addr, "/v1/completions", &best).json();
    assert_eq!(texts(&v).len(), 1, "{v}");
}

#[test]
fn top_logprobs_are_returned() {
    let addr = server().addr;
    let body = json!({"prompt": "Hello", "max_tokens": 3, "temperature": 0,
        "logprobs": 5, "ignore_eos": true});
    let v = post(addr, "/v1/completions", &body).json();
    let tops = v["choices"][0]["logprobs"]["top_logprobs"]
        .as_array()
        .expect("top_logprobs");
    assert_eq!(tops.len(), 3);
    for t in tops {
        let m = t.as_object().expect("object");
        assert_eq!(m.len(), 5, "{t}");
        let lps: Vec<f64> = m.values().map(|x| x.as_f64().expect("number")).collect();
        assert!(lps.iter().all(|&x| x <= 0.0));
    }
}
