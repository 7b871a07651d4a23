//! Beam search in the engine (forked beams on shared, copy-on-write blocks)
//! against a brute-force reference written plainly here: every candidate
//! sequence's next-token logprobs come from a fresh request of its whole
//! history (full recompute, no block sharing, no prefix cache).

mod common;

use common::{assert_pools_full, engine, prompts, Setup};
use engine::sampler::SamplingParams;
use engine::scheduler::{PreemptionMode, RequestId, RequestParams};
use engine::LlmEngine;

const EOS: u32 = 2;

/// Top `k` raw logprobs of the token after `tokens`, from a fresh request.
fn next_logprobs(eng: &mut LlmEngine, id: &mut u64, tokens: &[u32], k: usize) -> Vec<(u32, f32)> {
    *id += 1;
    let p = RequestParams {
        max_tokens: Some(1),
        ignore_eos: true,
        sampling: SamplingParams {
            logprobs: Some(k),
            ..SamplingParams::default()
        },
        ..RequestParams::default()
    };
    eng.add_request(RequestId(*id), tokens.to_vec(), p)
        .expect("ok");
    let mut top = Vec::new();
    while eng.has_unfinished() {
        for o in eng.step() {
            for s in o.seqs {
                top.extend(s.new_top_logprobs.into_iter().flatten());
            }
        }
    }
    top
}

/// (output tokens, cumulative logprob, score), best first.
type Hyps = Vec<(Vec<u32>, f64, f64)>;

fn score(cum: f64, len: usize, lp: f32) -> f64 {
    cum / (len as f64).powf(f64::from(lp))
}

/// Plain beam search: rank all 2w candidates of all beams by cumulative
/// logprob; stop tokens ranked in the first w finish, others extend.
fn reference(
    prompt: &[u32],
    width: usize,
    n: usize,
    max_tokens: usize,
    stops: &[u32],
    lp: f32,
) -> Hyps {
    reference_with(prompt, width, n, max_tokens, stops, lp, false)
}

/// [`reference`] with `early_stopping`: stop as soon as `width`
/// hypotheses are finished.
fn reference_with(
    prompt: &[u32],
    width: usize,
    n: usize,
    max_tokens: usize,
    stops: &[u32],
    lp: f32,
    early: bool,
) -> Hyps {
    let mut eng = engine(&Setup::default());
    let mut id = 0;
    let mut beams: Vec<(Vec<u32>, f64)> = vec![(Vec::new(), 0.0)];
    let mut hyps: Hyps = Vec::new();
    for step in 1..=max_tokens {
        let mut cands = Vec::new();
        for (b, (out, cum)) in beams.iter().enumerate() {
            let mut all = prompt.to_vec();
            all.extend(out);
            for (t, l) in next_logprobs(&mut eng, &mut id, &all, 2 * width) {
                cands.push((cum + f64::from(l), b, t));
            }
        }
        cands.sort_by(|x, y| {
            y.0.partial_cmp(&x.0)
                .unwrap()
                .then(x.1.cmp(&y.1))
                .then(x.2.cmp(&y.2))
        });
        let mut next = Vec::new();
        for (rank, &(cum, b, t)) in cands.iter().enumerate() {
            let mut out = beams[b].0.clone();
            out.push(t);
            if t == EOS || stops.contains(&t) {
                if rank < width {
                    hyps.push((out, cum, score(cum, step, lp)));
                }
            } else {
                next.push((out, cum));
                if next.len() == width {
                    break;
                }
            }
        }
        if step == max_tokens {
            hyps.extend(
                next.iter()
                    .map(|(o, c)| (o.clone(), *c, score(*c, step, lp))),
            );
            break;
        }
        beams = next;
        let mut s: Vec<f64> = hyps.iter().map(|h| h.2).collect();
        s.sort_by(|a, b| b.partial_cmp(a).unwrap());
        let best_live = beams
            .iter()
            .map(|b| score(b.1, step, lp))
            .fold(f64::NEG_INFINITY, f64::max);
        if beams.is_empty() || (s.len() >= width && (early || best_live <= s[width - 1])) {
            break;
        }
    }
    hyps.sort_by(|a, b| b.2.partial_cmp(&a.2).unwrap());
    hyps.truncate(n);
    hyps
}

fn beam_params(width: usize, n: usize, max_tokens: usize, stops: &[u32], lp: f32) -> RequestParams {
    RequestParams {
        max_tokens: Some(max_tokens),
        ignore_eos: false,
        stop_token_ids: stops.to_vec(),
        sampling: SamplingParams {
            n,
            best_of: Some(width),
            use_beam_search: true,
            length_penalty: lp,
            ..SamplingParams::default()
        },
        ..RequestParams::default()
    }
}

/// The engine's beams: (tokens, cumulative logprob) per returned sequence.
fn run_engine(
    setup: &Setup,
    prompt: &[u32],
    params: RequestParams,
) -> (Vec<(Vec<u32>, f64)>, LlmEngine) {
    let mut eng = engine(setup);
    eng.add_request(RequestId(0), prompt.to_vec(), params)
        .expect("ok");
    let mut seqs: Vec<(Vec<u32>, f64)> = Vec::new();
    let mut outputs = 0;
    while eng.has_unfinished() {
        for o in eng.step() {
            assert!(o.error.is_none(), "{:?}", o.error);
            outputs += 1;
            assert!(o.finished, "beam search streams nothing before the end");
            for s in o.seqs {
                let cum = s.new_logprobs.iter().map(|&l| f64::from(l)).sum();
                seqs.push((s.new_token_ids, cum));
            }
        }
    }
    assert_eq!(outputs, 1);
    (seqs, eng)
}

fn compare(
    setup: &Setup,
    prompt: &[u32],
    width: usize,
    n: usize,
    max_tokens: usize,
    stops: &[u32],
    lp: f32,
) {
    let want = reference(prompt, width, n, max_tokens, stops, lp);
    let (got, eng) = run_engine(setup, prompt, beam_params(width, n, max_tokens, stops, lp));
    assert_eq!(got.len(), want.len(), "width {width}");
    for (g, w) in got.iter().zip(&want) {
        assert_eq!(g.0, w.0, "width {width} len {max_tokens}");
        assert!((g.1 - w.1).abs() < 1e-3, "cum {} vs {}", g.1, w.1);
    }
    assert_pools_full(&eng);
}

#[test]
fn beam_search_matches_brute_force_for_widths_and_lengths() {
    common::on_each_executor(|| {
        let ps = prompts(21, 2, 6, 14);
        for (width, max_tokens) in [(1, 6), (2, 5), (4, 7), (2, 9)] {
            for p in &ps {
                compare(
                    &Setup::default(),
                    p,
                    width,
                    width.min(2),
                    max_tokens,
                    &[],
                    1.0,
                );
            }
        }
    });
}

#[test]
fn beam_search_with_stop_tokens_and_length_penalty() {
    common::on_each_executor(|| {
        let prompt = prompts(22, 1, 10, 10).remove(0);
        // A stop token likely to rank high: the second-best first token.
        let mut eng = engine(&Setup::default());
        let first = next_logprobs(&mut eng, &mut 0, &prompt, 3);
        for (width, lp) in [(2, 1.0f32), (4, 0.5), (4, 2.0)] {
            compare(&Setup::default(), &prompt, width, 2, 6, &[first[1].0], lp);
        }
        // Ranked third with width 2: a stop candidate outside the first `width`
        // is dropped, not finished.
        for lp in [0.0f32, 1.0] {
            compare(&Setup::default(), &prompt, 2, 2, 6, &[first[2].0], lp);
        }
    });
}

#[test]
fn beam_search_survives_swap_and_recompute() {
    common::on_each_executor(|| {
        let prompt = prompts(23, 1, 12, 12).remove(0);
        let want = reference(&prompt, 4, 2, 10, &[], 1.0);
        for mode in [PreemptionMode::Swap, PreemptionMode::Recompute] {
            let mut setup = Setup {
                device_blocks: 40,
                cpu_blocks: 256,
                ..Setup::default()
            };
            setup.sched.preemption_mode = mode;
            let mut eng = engine(&setup);
            // Background load forces the beam group out and back.
            for (i, p) in prompts(24, 5, 20, 30).into_iter().enumerate() {
                eng.add_request(RequestId(100 + i as u64), p, common::params(20))
                    .expect("ok");
            }
            eng.add_request(
                RequestId(0),
                prompt.clone(),
                beam_params(4, 2, 10, &[], 1.0),
            )
            .expect("ok");
            let mut got = Vec::new();
            while eng.has_unfinished() {
                for o in eng.step() {
                    assert!(o.error.is_none(), "{:?}", o.error);
                    if o.request_id == RequestId(0) {
                        got.extend(o.seqs.into_iter().map(|s| s.new_token_ids));
                    }
                }
            }
            let want_tokens: Vec<Vec<u32>> = want.iter().map(|h| h.0.clone()).collect();
            assert_eq!(got, want_tokens, "{mode:?}");
            let s = eng.stats().scheduler;
            assert!(
                s.preemptions_swap + s.preemptions_recompute > 0,
                "{mode:?}: {s:?}"
            );
            assert_pools_full(&eng);
        }
    });
}

#[test]
fn early_stopping_ends_the_search_at_width_hypotheses() {
    common::on_each_executor(|| {
        // Stop tokens: the second-best first token (a hypothesis at step 1),
        // and one of the best beam's step-2 candidates. Among those candidates,
        // find one where the two stopping rules give different results, then
        // check the engine follows each rule.
        let prompt = prompts(25, 1, 9, 9).remove(0);
        let mut eng = engine(&Setup::default());
        let mut id = 0;
        let first = next_logprobs(&mut eng, &mut id, &prompt, 4);
        let mut after = prompt.clone();
        after.push(first[0].0);
        let second = next_logprobs(&mut eng, &mut id, &after, 6);
        let (width, n, max_tokens, lp) = (2, 2, 8, 1.0f32);
        let mut distinguished = 0;
        for &(t2, _) in &second {
            let stops = [first[1].0, t2];
            let want_early = reference_with(&prompt, width, n, max_tokens, &stops, lp, true);
            let want_late = reference_with(&prompt, width, n, max_tokens, &stops, lp, false);
            if want_early == want_late {
                continue;
            }
            distinguished += 1;
            for (early, want) in [(true, &want_early), (false, &want_late)] {
                let mut params = beam_params(width, n, max_tokens, &stops, lp);
                params.sampling.early_stopping = early;
                let (got, eng) = run_engine(&Setup::default(), &prompt, params);
                let got_tokens: Vec<&Vec<u32>> = got.iter().map(|g| &g.0).collect();
                let want_tokens: Vec<&Vec<u32>> = want.iter().map(|h| &h.0).collect();
                assert_eq!(
                    got_tokens, want_tokens,
                    "early_stopping {early}, stops {stops:?}"
                );
                assert_pools_full(&eng);
            }
        }
        assert!(
            distinguished > 0,
            "no stop-token choice separates the two rules on this prompt"
        );
    });
}
