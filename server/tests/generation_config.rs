//! `--generation-config`: the model's sampling defaults fill what a request
//! leaves out, the request's own values win, and a folder without
//! `generation_config.json` is refused naming the flag.

mod common;

use clap::Parser;
use common::{post, start};
use serde_json::json;

/// A fresh folder holding `generation_config.json` with `body`.
fn config_dir(name: &str, body: &serde_json::Value) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("gen-config-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    std::fs::write(dir.join("generation_config.json"), body.to_string()).expect("write");
    dir
}

#[test]
fn defaults_fill_what_the_request_leaves_out() {
    let dir = config_dir("greedy5", &json!({"temperature": 0.0, "max_new_tokens": 5}));
    let server = start(&["--generation-config", dir.to_str().expect("utf-8 path")]);
    let ask = |extra: serde_json::Value| {
        let mut body = json!({
            "messages": [{"role": "user", "content": "Name three colors."}],
            "ignore_eos": true,
        });
        for (k, v) in extra.as_object().expect("object") {
            body[k] = v.clone();
        }
        let r = post(server.addr, "/v1/chat/completions", &body);
        assert_eq!(r.status, 200, "{}", r.body);
        r.json()
    };
    // No temperature, no max_tokens: greedy, 5 tokens, from the folder.
    let a = ask(json!({}));
    assert_eq!(a["usage"]["completion_tokens"], 5, "{a}");
    assert_eq!(a["choices"][0]["finish_reason"], "length");
    let b = ask(json!({"temperature": 0.0, "max_tokens": 5}));
    assert_eq!(
        a["choices"][0]["message"]["content"],
        b["choices"][0]["message"]["content"]
    );
    // The request's own max_tokens wins.
    let c = ask(json!({"max_tokens": 2}));
    assert_eq!(c["usage"]["completion_tokens"], 2, "{c}");
}

#[test]
fn a_folder_without_the_file_is_refused_naming_the_flag() {
    let empty = std::env::temp_dir().join(format!("gen-config-empty-{}", std::process::id()));
    std::fs::create_dir_all(&empty).expect("temp dir");
    let err = server::cli::Cli::try_parse_from([
        "server",
        "--generation-config",
        empty.to_str().expect("utf-8 path"),
    ])
    .expect_err("a folder without generation_config.json");
    let msg = err.to_string();
    assert!(msg.contains("--generation-config"), "{msg}");
    assert!(msg.contains("generation_config.json"), "{msg}");
}
