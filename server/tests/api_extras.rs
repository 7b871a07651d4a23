//! vLLM's `/tokenize` and `/detokenize`, CORS (off by default; on with
//! vLLM's flags), over real HTTP on loopback with the real model.

mod common;

use common::{post, raw_request, send_raw, start, Resp, API_KEY};
use serde_json::json;

fn assert_400(r: &Resp, param: &str, case: &str) {
    assert_eq!(r.status, 400, "{case}: {}", r.body);
    assert_eq!(r.json()["error"]["param"], param, "{case}: {}", r.body);
}

#[test]
fn tokenize_and_detokenize() {
    let srv = start(&[]);
    let tok = &srv.state.tokenizer;
    let text = "Hello world, 123!";

    for (special, want) in [
        (None, tok.encode(text, true)),
        (Some(false), tok.encode(text, false)),
    ] {
        let want = want.expect("tokenizer");
        let mut body = json!({"prompt": text});
        if let Some(s) = special {
            body["add_special_tokens"] = json!(s);
        }
        let r = post(srv.addr, "/tokenize", &body);
        assert_eq!(r.status, 200, "{}", r.body);
        let v = r.json();
        assert_eq!(v["tokens"], json!(want), "add_special_tokens {special:?}");
        assert_eq!(v["count"], want.len());
        assert_eq!(v["max_model_len"], 512);
        assert!(v["token_strs"].is_null());
    }

    // Chat form: the template's rendering, starting with <|im_start|>.
    let im_start = tok.token_to_id("<|im_start|>").expect("ChatML");
    let r = post(
        srv.addr,
        "/tokenize",
        &json!({"messages": [{"role": "user", "content": "Hi"}], "return_token_strs": true}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    let ids: Vec<u32> = serde_json::from_value(v["tokens"].clone()).expect("ids");
    assert_eq!(ids[0], im_start, "{v}");
    let rendered = tok.decode(&ids, false).expect("decode");
    assert!(
        rendered.ends_with("<|im_start|>assistant\n"),
        "generation prompt added by default: {rendered:?}"
    );
    assert_eq!(v["token_strs"].as_array().map(Vec::len), Some(ids.len()));
    let no_gen = post(
        srv.addr,
        "/tokenize",
        &json!({"messages": [{"role": "user", "content": "Hi"}], "add_generation_prompt": false}),
    )
    .json();
    assert!(no_gen["count"].as_u64() < v["count"].as_u64(), "{no_gen}");

    // Round trip.
    let ids = tok.encode(text, false).expect("tokenizer");
    let r = post(srv.addr, "/detokenize", &json!({"tokens": ids}));
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json(), json!({"prompt": text}));

    // Refusals.
    let vocab = tok.vocab_size();
    for (case, body) in [
        ("negative id", json!({"tokens": [5, -1]})),
        ("id past the vocabulary", json!({"tokens": [vocab]})),
    ] {
        assert_400(&post(srv.addr, "/detokenize", &body), "tokens", case);
    }
    assert_400(
        &post(srv.addr, "/tokenize", &json!({"text": "x"})),
        "prompt",
        "neither prompt nor messages",
    );
    let r = post(
        srv.addr,
        "/tokenize",
        &json!({"prompt": "x", "model": "other"}),
    );
    assert_eq!(r.status, 404, "{}", r.body);
    let r = send_raw(
        srv.addr,
        &raw_request(
            "GET",
            "/tokenize",
            &[("Authorization", "Bearer test-key")],
            b"",
        ),
    );
    assert_eq!((r.status, r.header("allow")), (405, Some("POST")));
}

fn options(srv: &common::TestServer, origin: &str, method: &str, headers: &str) -> Resp {
    let mut h = vec![
        ("Origin", origin),
        ("Access-Control-Request-Method", method),
    ];
    if !headers.is_empty() {
        h.push(("Access-Control-Request-Headers", headers));
    }
    send_raw(
        srv.addr,
        &raw_request("OPTIONS", "/v1/completions", &h, b""),
    )
}

fn completion_from(srv: &common::TestServer, origin: &str, key: &str) -> Resp {
    let auth = format!("Bearer {key}");
    let body = json!({"prompt": "Hi", "max_tokens": 1}).to_string();
    send_raw(
        srv.addr,
        &raw_request(
            "POST",
            "/v1/completions",
            &[
                ("Origin", origin),
                ("Authorization", &auth),
                ("Content-Type", "application/json"),
            ],
            body.as_bytes(),
        ),
    )
}

const ACAO: &str = "access-control-allow-origin";

#[test]
fn cors_is_off_by_default() {
    let srv = start(&[]);
    let pre = options(&srv, "http://a.example", "POST", "");
    assert_eq!(pre.status, 405, "{}", pre.body);
    assert_eq!(pre.header(ACAO), None);
    let r = completion_from(&srv, "http://a.example", API_KEY);
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(
        r.headers
            .iter()
            .all(|(k, _)| !k.to_ascii_lowercase().starts_with("access-control")),
        "{:?}",
        r.headers
    );
}

#[test]
fn cors_follows_the_allowed_lists() {
    let srv = start(&[
        "--allowed-origins",
        r#"["http://good.example"]"#,
        "--allowed-methods",
        "GET,POST",
        "--allowed-headers",
        "authorization, content-type",
    ]);
    let good = "http://good.example";
    let pre = options(&srv, good, "POST", "Authorization, Content-Type");
    assert_eq!(pre.status, 200, "{}", pre.body);
    assert_eq!(pre.header(ACAO), Some(good));
    assert_eq!(
        pre.header("access-control-allow-methods"),
        Some("GET, POST")
    );
    assert_eq!(
        pre.header("access-control-allow-headers"),
        Some("authorization, content-type")
    );
    for (case, origin, method, headers) in [
        ("origin", "http://evil.example", "POST", ""),
        ("method", good, "DELETE", ""),
        ("headers", good, "POST", "x-custom"),
    ] {
        let r = options(&srv, origin, method, headers);
        assert_eq!(r.status, 400, "{case}: {}", r.body);
        assert!(r.body.contains(case), "{case}: {}", r.body);
        assert_eq!(r.header(ACAO), None, "{case}");
    }
    // Actual requests: the allowed origin sees the header, errors included;
    // another origin does not.
    let ok = completion_from(&srv, good, API_KEY);
    assert_eq!((ok.status, ok.header(ACAO)), (200, Some(good)));
    assert_eq!(ok.header("vary"), Some("Origin"));
    let denied = completion_from(&srv, good, "wrong-key");
    assert_eq!((denied.status, denied.header(ACAO)), (401, Some(good)));
    let other = completion_from(&srv, "http://evil.example", API_KEY);
    assert_eq!((other.status, other.header(ACAO)), (200, None));
}
