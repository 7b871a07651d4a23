//! Parallel sampling, best_of, seeded reproducibility and beam search on
//! the real tiny model, paged KV cache and CPU executor.

mod common;

use common::{assert_pools_full, engine, prompts, Setup};
use engine::sampler::SamplingParams;
use engine::scheduler::{PreemptionMode, RequestId, RequestParams};
use engine::LlmEngine;
use std::collections::HashMap;

/// Per request: each sequence's tokens and logprobs; and the finish flag.
type Seqs = HashMap<RequestId, (Vec<(Vec<u32>, Vec<f32>)>, bool)>;

fn run(eng: &mut LlmEngine) -> Seqs {
    let mut got: Seqs = HashMap::new();
    let mut peak = 0;
    for _ in 0..100_000 {
        if !eng.has_unfinished() {
            return got;
        }
        for o in eng.step() {
            assert!(o.error.is_none(), "{:?}", o.error);
            let e = got.entry(o.request_id).or_default();
            for s in o.seqs {
                if e.0.len() <= s.index {
                    e.0.resize(s.index + 1, (Vec::new(), Vec::new()));
                }
                e.0[s.index].0.extend(s.new_token_ids);
                e.0[s.index].1.extend(s.new_logprobs);
            }
            e.1 |= o.finished;
        }
        let kv = eng.stats().kv;
        peak = peak.max(kv.total_blocks - kv.free_blocks);
    }
    panic!("no end (peak {peak})");
}

fn sampled(seed: u64, n: usize, best_of: Option<usize>, max_tokens: usize) -> RequestParams {
    RequestParams {
        max_tokens: Some(max_tokens),
        ignore_eos: true,
        sampling: SamplingParams {
            n,
            best_of,
            temperature: 1.0,
            top_k: Some(50),
            seed: Some(seed),
            ..SamplingParams::default()
        },
        ..RequestParams::default()
    }
}

fn tokens_of(s: &Seqs, id: u64) -> Vec<Vec<u32>> {
    let (seqs, finished) = &s[&RequestId(id)];
    assert!(finished);
    seqs.iter().map(|x| x.0.clone()).collect()
}

#[test]
fn seeded_sampling_is_independent_of_batch_and_preemption() {
    common::on_each_executor(|| {
        let ps = prompts(11, 6, 5, 40);
        let alone: Vec<Vec<u32>> = ps
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let mut eng = engine(&Setup::default());
                eng.add_request(RequestId(0), p.clone(), sampled(i as u64, 1, None, 20))
                    .expect("ok");
                tokens_of(&run(&mut eng), 0).remove(0)
            })
            .collect();
        for (mode, cpu) in [
            (PreemptionMode::Swap, 0usize),
            (PreemptionMode::Swap, 256),
            (PreemptionMode::Recompute, 256),
        ] {
            let mut setup = Setup::default();
            if cpu > 0 {
                setup.device_blocks = 24;
                setup.cpu_blocks = cpu;
                setup.sched.preemption_mode = mode;
            }
            let mut eng = engine(&setup);
            for (i, p) in ps.iter().enumerate() {
                eng.add_request(
                    RequestId(i as u64),
                    p.clone(),
                    sampled(i as u64, 1, None, 20),
                )
                .expect("ok");
            }
            let got = run(&mut eng);
            for (i, want) in alone.iter().enumerate() {
                assert_eq!(
                    &tokens_of(&got, i as u64)[0],
                    want,
                    "request {i} {mode:?} {cpu}"
                );
            }
            let s = eng.stats().scheduler;
            if cpu > 0 {
                assert!(s.preemptions_swap + s.preemptions_recompute > 0, "{s:?}");
            }
            assert_pools_full(&eng);
        }
    });
}

#[test]
fn parallel_samples_share_the_prompt_and_differ() {
    common::on_each_executor(|| {
        let prompt = prompts(3, 1, 37, 37).remove(0);
        let mut eng = engine(&Setup::default());
        eng.add_request(RequestId(0), prompt.clone(), sampled(5, 4, None, 12))
            .expect("ok");
        // The prompt is computed once: 37 prompt tokens, then 4 x 12 samples.
        let got = run(&mut eng);
        let seqs = tokens_of(&got, 0);
        assert_eq!(seqs.len(), 4);
        assert!(seqs.iter().all(|s| s.len() == 12));
        let distinct: std::collections::HashSet<_> = seqs.iter().collect();
        assert!(distinct.len() > 1, "all samples equal: {seqs:?}");
        let s = eng.stats().scheduler;
        assert_eq!(s.prompt_tokens, 37, "prompt computed more than once: {s:?}");
        assert_eq!(s.generation_tokens, 4 * 12, "{s:?}");
        assert_pools_full(&eng);

        // Sequence 0 of the group is the same draw as a lone request (stream 0).
        let mut lone = engine(&Setup::default());
        lone.add_request(RequestId(0), prompt, sampled(5, 1, None, 12))
            .expect("ok");
        assert_eq!(tokens_of(&run(&mut lone), 0)[0], seqs[0]);
    });
}

#[test]
fn best_of_returns_the_best_n_by_cumulative_logprob() {
    common::on_each_executor(|| {
        let prompt = prompts(4, 1, 9, 9).remove(0);
        let mut all = engine(&Setup::default());
        all.add_request(RequestId(0), prompt.clone(), sampled(9, 5, None, 10))
            .expect("ok");
        let everything = run(&mut all).remove(&RequestId(0)).expect("out").0;
        let mut ranked: Vec<(f64, Vec<u32>)> = everything
            .iter()
            .map(|(t, l)| (l.iter().map(|&x| f64::from(x)).sum(), t.clone()))
            .collect();
        ranked.sort_by(|a, b| b.0.partial_cmp(&a.0).unwrap());

        let mut best = engine(&Setup::default());
        best.add_request(RequestId(0), prompt, sampled(9, 2, Some(5), 10))
            .expect("ok");
        let got = tokens_of(&run(&mut best), 0);
        assert_eq!(got, vec![ranked[0].1.clone(), ranked[1].1.clone()]);
        assert_pools_full(&best);
    });
}

#[test]
fn invalid_sampling_params_are_refused_with_their_name() {
    common::on_each_executor(|| {
        let mut eng = engine(&Setup::default());
        let mut p = sampled(0, 1, None, 4);
        p.sampling.top_p = 0.0;
        match eng.add_request(RequestId(0), vec![5, 6], p) {
            Err(engine::EngineError::Request(engine::error::RequestError::InvalidParam {
                param,
                ..
            })) => assert_eq!(param, "top_p"),
            other => panic!("{other:?}"),
        }
    });
}
