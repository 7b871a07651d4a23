//! Constrained decoding on the real engine: the tiny random-weight model
//! (its output is noise, so only the grammar can make it well-formed), the
//! real SmolLM2 tokenizer truncated to its vocabulary, the paged KV cache,
//! seeded random draws, forks (n), and preemption.

mod common;

use common::{assert_pools_full, engine, prompts, Setup};
use engine::grammar::{CompiledGrammar, GrammarCompiler, GrammarError, GrammarSpec};
use engine::sampler::SamplingParams;
use engine::scheduler::{FinishReason, PreemptionMode, RequestId, RequestParams};
use engine::LlmEngine;
use std::collections::HashMap;
use std::sync::OnceLock;

fn compiler() -> &'static GrammarCompiler {
    static C: OnceLock<GrammarCompiler> = OnceLock::new();
    C.get_or_init(|| GrammarCompiler::new(common::tiny_tokenizer(), 2).expect("compiler"))
}

fn compile(spec: GrammarSpec) -> CompiledGrammar {
    compiler().compile(&spec).expect("compiles")
}

fn params(g: &CompiledGrammar, seed: u64, n: usize) -> RequestParams {
    RequestParams {
        max_tokens: Some(120),
        sampling: SamplingParams {
            n,
            temperature: 1.0,
            seed: Some(seed),
            structured: Some(g.clone()),
            ..SamplingParams::default()
        },
        ..RequestParams::default()
    }
}

/// Per request, per sequence: (tokens, finish reason).
type Out = HashMap<RequestId, Vec<(Vec<u32>, Option<FinishReason>)>>;

fn run(eng: &mut LlmEngine) -> Out {
    let mut got: Out = HashMap::new();
    for _ in 0..100_000 {
        if !eng.has_unfinished() {
            return got;
        }
        for o in eng.step() {
            assert!(o.error.is_none(), "{:?}", o.error);
            let e = got.entry(o.request_id).or_default();
            for s in o.seqs {
                if e.len() <= s.index {
                    e.resize(s.index + 1, (Vec::new(), None));
                }
                e[s.index].0.extend(s.new_token_ids);
                e[s.index].1 = e[s.index].1.or(s.finish_reason);
            }
        }
    }
    panic!("no end");
}

fn text(tokens: &[u32]) -> String {
    common::tiny_tokenizer()
        .decode(tokens, true)
        .expect("decode")
}

/// Every sequence ended at EOS (the grammar was complete), and its text.
fn texts(out: &Out, id: u64) -> Vec<String> {
    out[&RequestId(id)]
        .iter()
        .map(|(toks, reason)| {
            assert_eq!(*reason, Some(FinishReason::Stop), "{:?}", text(toks));
            assert_eq!(toks.last(), Some(&2), "ends at EOS");
            text(toks)
        })
        .collect()
}

fn is_match(re: &str, s: &str) -> bool {
    // The test's own tiny matcher for `[0-9]{3}-[a-z]{2}(x|yy)`.
    assert_eq!(re, "[0-9]{3}-[a-z]{2}(x|yy)");
    let b = s.as_bytes();
    let tail = &s.get(6..).unwrap_or("");
    b.len() >= 7
        && b[..3].iter().all(u8::is_ascii_digit)
        && b[3] == b'-'
        && b[4..6].iter().all(u8::is_ascii_lowercase)
        && (*tail == "x" || *tail == "yy")
}

#[test]
fn regex_choice_and_schema_are_obeyed_by_noise() {
    let re = "[0-9]{3}-[a-z]{2}(x|yy)";
    let regex = compile(GrammarSpec::Regex(re.into()));
    let choices = vec!["alpha".to_string(), "beta gamma".into(), "δ\"q".into()];
    let choice = compile(GrammarSpec::Choice(choices.clone()));
    let schema = compile(GrammarSpec::JsonSchema(
        r#"{"type":"object","properties":{
            "id":{"type":"integer","minimum":0,"maximum":999},
            "tag":{"enum":["red","green"]},
            "ok":{"type":"boolean"}},
          "required":["id","tag","ok"],"additionalProperties":false}"#
            .into(),
    ));
    let mut eng = engine(&Setup::default());
    let ps = prompts(3, 6, 4, 12);
    for (i, p) in ps.iter().enumerate() {
        let g = [&regex, &choice, &schema][i % 3];
        eng.add_request(RequestId(i as u64), p.clone(), params(g, i as u64, 3))
            .expect("accepted");
    }
    let out = run(&mut eng);
    for i in 0..ps.len() as u64 {
        let t = texts(&out, i);
        assert_eq!(t.len(), 3, "n = 3 forks");
        for s in t {
            match i % 3 {
                0 => assert!(is_match(re, &s), "{s:?}"),
                1 => assert!(choices.contains(&s), "{s:?}"),
                _ => {
                    let v: serde_json::Value = serde_json::from_str(&s).expect(&s);
                    let id = v["id"].as_i64().expect("id");
                    assert!((0..=999).contains(&id), "{s}");
                    assert!(["red", "green"].contains(&v["tag"].as_str().expect("tag")));
                    assert!(v["ok"].is_boolean());
                    assert_eq!(v.as_object().map(|o| o.len()), Some(3), "{s}");
                }
            }
        }
    }
    assert_pools_full(&eng);
    assert_eq!(eng.timings().mask_steps, eng.timings().steps);
}

#[test]
fn unconstrained_noise_does_not_follow_the_grammar() {
    // The control: without the mask the same draws are not JSON.
    let mut eng = engine(&Setup::default());
    let ps = prompts(3, 3, 4, 12);
    for (i, p) in ps.iter().enumerate() {
        let mut rp = params(&compile(GrammarSpec::JsonObject), i as u64, 1);
        rp.sampling.structured = None;
        rp.max_tokens = Some(20);
        eng.add_request(RequestId(i as u64), p.clone(), rp)
            .expect("accepted");
    }
    let out = run(&mut eng);
    for i in 0..ps.len() as u64 {
        let toks = &out[&RequestId(i)][0].0;
        assert!(serde_json::from_str::<serde_json::Value>(&text(toks)).is_err());
    }
}

#[test]
fn preemption_keeps_matchers_on_their_tokens() {
    let schema = compile(GrammarSpec::JsonSchema(
        r#"{"type":"object","properties":{"words":{"type":"array",
            "items":{"type":"string","maxLength":6},"minItems":2,"maxItems":4}},
            "required":["words"],"additionalProperties":false}"#
            .into(),
    ));
    let ps = prompts(9, 8, 6, 14);
    let go = |setup: &Setup| {
        let mut eng = engine(setup);
        for (i, p) in ps.iter().enumerate() {
            eng.add_request(
                RequestId(i as u64),
                p.clone(),
                params(&schema, 40 + i as u64, 2),
            )
            .expect("accepted");
        }
        let out = run(&mut eng);
        assert_pools_full(&eng);
        (out, eng.stats().scheduler)
    };
    let (roomy, _) = go(&Setup::default());
    for mode in [PreemptionMode::Recompute, PreemptionMode::Swap] {
        let mut tight = Setup {
            device_blocks: 80,
            cpu_blocks: 200,
            ..Setup::default()
        };
        tight.sched.preemption_mode = mode;
        let (out, stats) = go(&tight);
        assert!(
            stats.preemptions_swap + stats.preemptions_recompute > 0,
            "{mode:?}: no preemption happened"
        );
        assert_eq!(out, roomy, "{mode:?}: same seeded draws, same outputs");
    }
    for i in 0..ps.len() as u64 {
        for s in texts(&roomy, i) {
            let v: serde_json::Value = serde_json::from_str(&s).expect(&s);
            let words = v["words"].as_array().expect("words");
            assert!((2..=4).contains(&words.len()), "{s}");
        }
    }
}

#[test]
fn bad_grammars_say_why() {
    let cases = [
        (GrammarSpec::JsonSchema("{not json".into()), "json_schema"),
        (
            GrammarSpec::JsonSchema(r#"{"type":"frobnicate"}"#.into()),
            "json_schema",
        ),
        (GrammarSpec::Regex("[a-".into()), "regex"),
        (GrammarSpec::Lark("start: missing_rule".into()), "grammar"),
        (GrammarSpec::Choice(vec![]), "choice"),
    ];
    let with_min_tokens = SamplingParams {
        min_tokens: 3,
        structured: Some(compile(GrammarSpec::JsonObject)),
        ..SamplingParams::default()
    };
    assert!(matches!(
        with_min_tokens.validate(Some(16)),
        Err(engine::error::RequestError::InvalidParam {
            param: "min_tokens",
            ..
        })
    ));
    for (spec, kind) in cases {
        match compiler().compile(&spec) {
            Err(GrammarError::Invalid { kind: k, reason }) => {
                assert_eq!(k, kind);
                assert!(!reason.is_empty());
            }
            other => panic!("{spec:?}: {other:?}"),
        }
    }
}
