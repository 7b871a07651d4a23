//! Speculative decoding keeps every output exact: greedy and seeded
//! sampled tokens under n-gram (and deliberately bad) proposals equal the
//! tokens without speculation, under preemption by swap and recompute,
//! prefix caching, small prefill chunks, aborts and asynchronous
//! scheduling; the distribution of sampled tokens is unchanged (a
//! two-sample chi-square against plain sampling with other seeds); every
//! block comes back, and the prefix cache only ever stores blocks of
//! accepted tokens (checked on its KV events).

mod common;

use common::{assert_pools_full, collect, params, run_to_end, Collected, Setup};
use engine::kv::{KvEvent, KvEventSink};
use engine::scheduler::{PreemptionMode, RequestId, RequestParams};
use engine::spec::{ProposeInput, Proposer, SpecConfig, SpecMethod};
use engine::LlmEngine;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

fn ngram(k: usize) -> SpecConfig {
    SpecConfig {
        method: SpecMethod::Ngram {
            prompt_lookup_min: 1,
            prompt_lookup_max: 3,
        },
        num_speculative_tokens: k,
        disable_by_batch_size: None,
        adaptive: false,
    }
}

/// Prompts that repeat a random segment, so prompt lookup has matches.
fn repetitive(seed: u64, count: usize) -> Vec<Vec<u32>> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..count)
        .map(|_| {
            let seg: Vec<u32> = (0..rng.gen_range(4..10))
                .map(|_| rng.gen_range(3..1000))
                .collect();
            let mut p: Vec<u32> = (0..rng.gen_range(1..6))
                .map(|_| rng.gen_range(3..1000))
                .collect();
            for _ in 0..rng.gen_range(2..4) {
                p.extend_from_slice(&seg);
            }
            p
        })
        .collect()
}

/// Proposes random tokens: almost every proposal is rejected.
struct Bad(ChaCha8Rng);

impl Proposer for Bad {
    fn propose(&mut self, inputs: &[ProposeInput<'_>]) -> Vec<Vec<u32>> {
        inputs
            .iter()
            .map(|i| (0..i.max).map(|_| self.0.gen_range(3..1000)).collect())
            .collect()
    }
}

/// Every request of `ps` in one engine; returns each request's result.
fn run(
    setup: &Setup,
    ps: &[Vec<u32>],
    params_of: &dyn Fn(usize) -> RequestParams,
    prepare: &dyn Fn(&mut LlmEngine),
) -> (Vec<Collected>, LlmEngine) {
    let mut eng = common::engine_with(setup, common::async_scheduling());
    prepare(&mut eng);
    for (i, p) in ps.iter().enumerate() {
        eng.add_request(RequestId(i as u64), p.clone(), params_of(i))
            .expect("request accepted");
    }
    let mut got = HashMap::new();
    run_to_end(&mut eng, &mut got);
    let out = (0..ps.len())
        .map(|i| got.remove(&RequestId(i as u64)).unwrap_or_default())
        .collect();
    (out, eng)
}

fn with_spec(setup: &Setup, k: usize) -> Setup {
    let mut s = setup.clone();
    s.sched.speculative = Some(ngram(k));
    s
}

fn setups() -> Vec<(&'static str, Setup)> {
    let pressured = |mode| {
        let mut s = Setup {
            device_blocks: 40,
            cpu_blocks: 256,
            ..Setup::default()
        };
        s.sched.preemption_mode = mode;
        s
    };
    let mut chunks = Setup::default();
    chunks.sched.max_num_batched_tokens = 24;
    vec![
        ("default", Setup::default()),
        ("swap", pressured(PreemptionMode::Swap)),
        ("recompute", pressured(PreemptionMode::Recompute)),
        (
            "prefix caching",
            Setup {
                prefix_caching: true,
                ..Setup::default()
            },
        ),
        ("small chunks", chunks),
    ]
}

fn tokens(c: &[Collected]) -> Vec<Vec<u32>> {
    c.iter()
        .map(|c| {
            assert!(c.finished && c.error.is_none(), "{c:?}");
            c.tokens.clone()
        })
        .collect()
}

#[test]
fn greedy_outputs_equal_those_without_speculation() {
    common::on_each_executor(|| {
        let ps = repetitive(1, 8);
        let greedy = |i: usize| params(12 + 3 * i);
        for (name, setup) in setups() {
            let (plain, _) = run(&setup, &ps, &greedy, &|_| {});
            let (spec, eng) = run(&with_spec(&setup, 4), &ps, &greedy, &|_| {});
            assert_eq!(tokens(&spec), tokens(&plain), "{name}");
            let s = eng.stats().scheduler.spec;
            assert!(s.drafts > 0 && s.accepted_tokens > 0, "{name}: {s:?}");
            assert!(s.accepted_tokens <= s.draft_tokens);
            assert!(s.accepted_per_pos.windows(2).all(|w| w[0] >= w[1]), "{s:?}");
            let generated: usize = plain.iter().map(|c| c.tokens.len()).sum();
            assert_eq!(
                eng.stats().scheduler.generation_tokens as usize,
                generated,
                "{name}"
            );
            assert_pools_full(&eng);
        }
    });
}

/// The adaptive governor switches speculation off and on within these
/// runs (it measures plain steps first, then speculating ones): outputs
/// stay those without speculation and every block comes back.
#[test]
fn adaptive_switching_keeps_outputs_and_blocks() {
    common::on_each_executor(|| {
        let ps = repetitive(2, 6);
        let greedy = |i: usize| params(40 + 5 * i);
        for (name, setup) in setups() {
            let (plain, _) = run(&setup, &ps, &greedy, &|_| {});
            let mut adaptive = with_spec(&setup, 3);
            if let Some(s) = adaptive.sched.speculative.as_mut() {
                s.adaptive = true;
            }
            let (got, eng) = run(&adaptive, &ps, &greedy, &|_| {});
            assert_eq!(tokens(&got), tokens(&plain), "{name}");
            if name == "default" {
                // Plain steps measured first, then speculation probed.
                let s = eng.stats().scheduler.spec;
                assert!(s.drafts > 0, "{name}: {s:?}");
            }
            assert_pools_full(&eng);
        }
    });
}

fn sampled(i: usize) -> RequestParams {
    let mut p = params(14);
    p.sampling.temperature = 0.9;
    p.sampling.top_p = 0.95;
    p.sampling.top_k = Some(50);
    p.sampling.seed = Some(1000 + i as u64);
    if !i.is_multiple_of(2) {
        p.sampling.presence_penalty = 0.4;
        p.sampling.repetition_penalty = 1.1;
    }
    if i.is_multiple_of(3) {
        p.sampling.logit_bias = vec![(7, 2.0)];
        p.sampling.min_tokens = 5;
        p.ignore_eos = false;
    }
    p
}

#[test]
fn seeded_sampling_is_unchanged_by_good_and_bad_proposals() {
    common::on_each_executor(|| {
        let ps = repetitive(2, 8);
        for (name, setup) in setups() {
            let (plain, _) = run(&setup, &ps, &sampled, &|_| {});
            let (spec, eng) = run(&with_spec(&setup, 3), &ps, &sampled, &|_| {});
            assert_eq!(tokens(&spec), tokens(&plain), "{name}: n-gram");
            assert_pools_full(&eng);
            let bad =
                |e: &mut LlmEngine| e.set_proposer(Box::new(Bad(ChaCha8Rng::seed_from_u64(3))));
            let (spec, eng) = run(&with_spec(&setup, 3), &ps, &sampled, &bad);
            assert_eq!(tokens(&spec), tokens(&plain), "{name}: bad proposals");
            assert!(eng.stats().scheduler.spec.draft_tokens > 0);
            assert_pools_full(&eng);
        }
    });
}

/// With asynchronous scheduling, steps run ahead while nothing can
/// speculate (here: while `disable_by_batch_size` requests or more are
/// running) and speculation starts once the load drops; outputs are
/// those without speculation, every block comes back.
#[test]
fn asynchronous_scheduling_runs_ahead_where_nothing_speculates() {
    common::on_each_executor(|| {
        if !common::async_scheduling() {
            return;
        }
        let ps = repetitive(4, 8);
        // Requests end one after another, so the load falls below 4.
        let greedy = |i: usize| params(6 + 6 * i);
        let setup = Setup::default();
        let (plain, _) = run(&setup, &ps, &greedy, &|_| {});
        let mut spec = with_spec(&setup, 3);
        if let Some(s) = spec.sched.speculative.as_mut() {
            s.disable_by_batch_size = Some(4);
        }
        let (got, eng) = run(&spec, &ps, &greedy, &|_| {});
        assert_eq!(tokens(&got), tokens(&plain));
        assert!(
            eng.overlap_stats().steps_ahead > 0,
            "{:?}",
            eng.overlap_stats()
        );
        let s = eng.stats().scheduler.spec;
        assert!(s.drafts > 0 && s.accepted_tokens > 0, "{s:?}");
        assert_pools_full(&eng);
    });
}

/// Records every stored block's tokens.
#[derive(Clone, Default)]
struct Stored(Arc<Mutex<Vec<Vec<u32>>>>);

impl KvEventSink for Stored {
    fn publish(&mut self, events: Vec<KvEvent>) {
        let mut all = self.0.lock().unwrap();
        for e in events {
            if let KvEvent::BlockStored {
                token_ids,
                block_size,
                ..
            } = e
            {
                all.extend(token_ids.chunks(block_size).map(<[u32]>::to_vec));
            }
        }
    }
}

#[test]
fn rejections_preemptions_and_aborts_return_every_block_and_cache_only_accepted_tokens() {
    let ps = repetitive(5, 12);
    let mut setup = Setup {
        device_blocks: 48,
        cpu_blocks: 64,
        prefix_caching: true,
        ..Setup::default()
    };
    setup.sched.preemption_mode = PreemptionMode::Auto;
    let setup = with_spec(&setup, 4);
    for (bad, overlapped) in [(false, false), (true, false), (false, true), (true, true)] {
        let stored = Stored::default();
        let mut eng = common::engine_with(&setup, overlapped);
        eng.set_kv_event_sink(Box::new(stored.clone()));
        if bad {
            eng.set_proposer(Box::new(Bad(ChaCha8Rng::seed_from_u64(9))));
        }
        for (i, p) in ps.iter().enumerate() {
            eng.add_request(RequestId(i as u64), p.clone(), sampled(i))
                .expect("accepted");
        }
        let mut got: HashMap<RequestId, Collected> = HashMap::new();
        for step in 0..100_000 {
            if !eng.has_unfinished() {
                break;
            }
            if step == 6 || step == 11 {
                // Abort two requests mid-flight (one may be speculating).
                eng.abort_request(RequestId(step as u64 % 12));
                eng.abort_request(RequestId(step as u64 % 12 + 1));
            }
            collect(&mut got, eng.step());
        }
        assert!(!eng.has_unfinished());
        assert_pools_full(&eng);
        let s = eng.stats().scheduler;
        assert!(s.spec.drafts > 0, "{s:?}");
        if bad {
            assert!(s.spec.accepted_tokens < s.spec.draft_tokens);
        }
        // Every stored block is a block of some request's accepted tokens
        // (prompt + what it returned), at a block boundary.
        let bs = setup.block_size;
        let finals: Vec<Vec<u32>> = (0..ps.len())
            .map(|i| {
                let mut t = ps[i].clone();
                t.extend(
                    got.get(&RequestId(i as u64))
                        .map_or(&[][..], |c| &c.tokens[..]),
                );
                t
            })
            .collect();
        let stored = stored.0.lock().unwrap();
        assert!(!stored.is_empty());
        for block in stored.iter() {
            let found = finals
                .iter()
                .any(|t| t.chunks_exact(bs).any(|c| c == &block[..]));
            assert!(
                found,
                "a stored block holds tokens no request accepted: {block:?}"
            );
        }
    }
}

/// Tokens 1 and 2 of `n` sampled requests (seeds from `seed0`), as pairs.
fn pairs(spec: bool, seed0: u64, n: usize) -> Vec<(u32, u32)> {
    let prompt: Vec<u32> = vec![11, 12, 13, 14, 11, 12, 13];
    let mut setup = Setup::default();
    if spec {
        setup.sched.speculative = Some(ngram(2));
    }
    let params_of = |i: usize| {
        let mut p = params(2);
        p.sampling.temperature = 1.0;
        p.sampling.top_k = Some(3);
        p.sampling.seed = Some(seed0 + i as u64);
        p
    };
    let ps = vec![prompt; n];
    // Proposes each sequence's likeliest-looking wrong guess: the last
    // token again, then the one before it.
    struct Echo;
    impl Proposer for Echo {
        fn propose(&mut self, inputs: &[ProposeInput<'_>]) -> Vec<Vec<u32>> {
            inputs
                .iter()
                .map(|i| i.tokens.iter().rev().take(i.max).copied().collect())
                .collect()
        }
    }
    let prepare = |e: &mut LlmEngine| {
        if spec {
            e.set_proposer(Box::new(Echo));
        }
    };
    let (got, _) = run(&setup, &ps, &params_of, &prepare);
    got.iter().map(|c| (c.tokens[0], c.tokens[1])).collect()
}

#[test]
fn sampled_distribution_matches_plain_sampling() {
    // Two independent samples (different seeds): plain, and speculative
    // with proposals that are often wrong. A two-sample chi-square over
    // the (token 1, token 2) pairs seen at least 5 times in each.
    let n = 1500;
    let plain = pairs(false, 0, n);
    let spec = pairs(true, 1_000_000, n);
    let mut counts: HashMap<(u32, u32), (f64, f64)> = HashMap::new();
    for p in &plain {
        counts.entry(*p).or_default().0 += 1.0;
    }
    for p in &spec {
        counts.entry(*p).or_default().1 += 1.0;
    }
    let mut chi2 = 0.0;
    let mut cells = 0;
    for (a, b) in counts.values().filter(|(a, b)| a + b >= 10.0) {
        // Equal sample sizes: (a - b)^2 / (a + b).
        chi2 += (a - b) * (a - b) / (a + b);
        cells += 1;
    }
    assert!(cells >= 3, "too few cells: {counts:?}");
    // 99.9% quantile of chi-square with `cells - 1` degrees of freedom
    // (Wilson-Hilferty), so a correct sampler fails once in 1000 runs at
    // most; seeds are fixed, so this run is deterministic.
    let df = (cells - 1) as f64;
    let z = 3.09;
    let q = df * (1.0 - 2.0 / (9.0 * df) + z * (2.0 / (9.0 * df)).sqrt()).powi(3);
    assert!(chi2 < q, "chi2 {chi2:.1} >= {q:.1} over {cells} cells");
}

#[test]
fn beam_search_is_refused_with_speculation() {
    let mut eng = common::engine_with(&with_spec(&Setup::default(), 2), false);
    let mut p = params(4);
    p.sampling.use_beam_search = true;
    p.sampling.n = 2;
    p.sampling.best_of = Some(2);
    let e = eng.add_request(RequestId(0), vec![5, 6, 7], p).unwrap_err();
    assert!(e.to_string().contains("speculative"), "{e}");
}

#[test]
fn the_target_as_its_own_draft_is_always_accepted() {
    use engine::engine_loop::DraftProposer;
    let ps = repetitive(6, 6);
    let greedy = |i: usize| params(10 + 2 * i);
    let mut setup = Setup::default();
    let (plain, _) = run(&setup, &ps, &greedy, &|_| {});
    setup.sched.speculative = Some(SpecConfig {
        method: SpecMethod::DraftModel {
            model: "tiny".into(),
        },
        num_speculative_tokens: 3,
        disable_by_batch_size: None,
        adaptive: false,
    });
    let prepare = |e: &mut LlmEngine| {
        let exec = common::executor(256, 0, setup.block_size);
        let vocab = common::tiny().0.vocab_size;
        e.set_proposer(Box::new(DraftProposer::new(exec, vocab).expect("draft")));
    };
    let (spec, eng) = run(&setup, &ps, &greedy, &prepare);
    assert_eq!(tokens(&spec), tokens(&plain));
    let s = eng.stats().scheduler.spec;
    assert!(s.drafts > 0);
    assert_eq!(
        s.accepted_tokens, s.draft_tokens,
        "a model agrees with itself: {s:?}"
    );
    assert_pools_full(&eng);
}

#[test]
fn a_draft_with_another_vocabulary_is_refused() {
    use engine::engine_loop::DraftProposer;
    let exec = common::executor(16, 0, 4);
    let vocab = common::tiny().0.vocab_size;
    let e = DraftProposer::new(exec, vocab + 1).err().expect("refused");
    assert!(e.to_string().contains("vocabulary"), "{e}");
}
