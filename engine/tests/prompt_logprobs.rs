//! `prompt_logprobs` on the real tiny model, paged KV cache and CPU
//! executor, against a reference computed here: one plain forward pass over
//! the whole prompt on a fresh executor with every logits row requested,
//! and a log-softmax / rank / top-k written out in f64.
//!
//! Covered: prompts of 1..40 tokens, chunked prefill forced small, several
//! requests batched, prefix caching (a repeated prompt still gets every
//! entry, and takes no cache hit), recompute and swap preemption (entries
//! neither lost nor duplicated), and the buffered paths (best_of, beam
//! search) which report them on their final output.

mod common;

use common::{assert_pools_full, engine, prompts, tiny, Setup};
use engine::executor::{
    ContiguousLayout, CpuExecutor, Executor, ForwardBatch, Sampling, StepOutput,
};
use engine::model::CpuModel;
use engine::sampler::{PromptLogprob, SamplingParams};
use engine::scheduler::{PreemptionMode, RequestId, RequestParams};
use engine::LlmEngine;
use std::collections::HashMap;

/// Logprob tolerance between the engine (chunked, batched) and one pass.
const TOL: f64 = 2e-3;

/// Reference logits rows of every prompt position, in f64.
fn reference_rows(prompt: &[u32]) -> Vec<Vec<f64>> {
    let (config, weights) = tiny();
    let model = CpuModel::new(config.clone(), weights.clone()).expect("tiny model");
    let block_size = 4;
    let blocks = prompt.len().div_ceil(block_size);
    let mut exec = CpuExecutor::new(model, blocks, 0, block_size).expect("executor");
    let layout = ContiguousLayout {
        block_size,
        blocks_per_seq: blocks,
    };
    let mut batch = ForwardBatch::default();
    layout.push(&mut batch, 0, 0, prompt, false);
    batch.logits_rows = (0..prompt.len()).collect();
    let logits = exec
        .execute(&Default::default(), &batch, &Sampling::Host)
        .and_then(StepOutput::into_logits)
        .expect("forward pass");
    assert_eq!(logits.rows, prompt.len());
    (0..prompt.len())
        .map(|r| logits.row(r).iter().map(|&v| f64::from(v)).collect())
        .collect()
}

fn log_softmax(row: &[f64]) -> Vec<f64> {
    let max = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let lse = max + row.iter().map(|v| (v - max).exp()).sum::<f64>().ln();
    row.iter().map(|v| v - lse).collect()
}

/// Checks the engine's list against the reference for `prompt` with `k`
/// alternatives.
fn check(prompt: &[u32], got: &[Option<PromptLogprob>], k: usize, what: &str) {
    assert_eq!(
        got.len(),
        prompt.len(),
        "{what}: one entry per prompt token"
    );
    assert!(got[0].is_none(), "{what}: the first token has no logprob");
    let rows = reference_rows(prompt);
    for pos in 1..prompt.len() {
        let e = got[pos]
            .as_ref()
            .unwrap_or_else(|| panic!("{what}: position {pos} missing"));
        let lp = log_softmax(&rows[pos - 1]);
        let token = prompt[pos];
        assert_eq!(e.token, token, "{what}: position {pos}");
        let want = lp[token as usize];
        assert!(
            (f64::from(e.logprob) - want).abs() < TOL,
            "{what}: position {pos}: logprob {} vs {want}",
            e.logprob
        );
        // Rank within what float noise allows.
        let lo = 1 + lp.iter().filter(|&&v| v > want + TOL).count();
        let hi = 1 + lp.iter().filter(|&&v| v > want - TOL).count();
        assert!(
            (lo..=hi).contains(&e.rank),
            "{what}: position {pos}: rank {} not in {lo}..={hi}",
            e.rank
        );
        // Top-k: k entries, best first, each its own reference logprob, and
        // together the k best values.
        assert_eq!(e.top.len(), k, "{what}: position {pos}");
        let mut sorted = lp.clone();
        sorted.sort_by(|a, b| b.partial_cmp(a).expect("finite"));
        for (i, &(id, l)) in e.top.iter().enumerate() {
            assert!(
                (f64::from(l) - lp[id as usize]).abs() < TOL,
                "{what}: position {pos} top {i}"
            );
            assert!(
                (f64::from(l) - sorted[i]).abs() < TOL,
                "{what}: position {pos} top {i}: {l} vs {}",
                sorted[i]
            );
        }
    }
}

fn with_prompt_logprobs(k: usize, max_tokens: usize) -> RequestParams {
    RequestParams {
        max_tokens: Some(max_tokens),
        ignore_eos: true,
        sampling: SamplingParams {
            prompt_logprobs: Some(k),
            ..SamplingParams::default()
        },
        ..RequestParams::default()
    }
}

/// What one request produced.
#[derive(Default, Debug)]
struct Got {
    prompt_logprobs: Option<Vec<Option<PromptLogprob>>>,
    /// Outputs that carried prompt logprobs.
    times: usize,
    tokens: Vec<u32>,
    finished: bool,
    cached: usize,
}

fn run(eng: &mut LlmEngine) -> HashMap<RequestId, Got> {
    let mut got: HashMap<RequestId, Got> = HashMap::new();
    for _ in 0..100_000 {
        if !eng.has_unfinished() {
            return got;
        }
        for o in eng.step() {
            assert!(o.error.is_none(), "{:?}", o.error);
            let g = got.entry(o.request_id).or_default();
            assert!(!g.finished, "output after the end");
            if let Some(p) = o.prompt_logprobs.clone() {
                g.times += 1;
                g.prompt_logprobs = Some(p);
            }
            g.tokens.extend_from_slice(o.token_ids());
            g.finished |= o.finished;
            g.cached = g.cached.max(o.num_cached_tokens);
        }
    }
    panic!("engine did not finish");
}

fn entries(g: &Got, what: &str) -> Vec<Option<PromptLogprob>> {
    assert!(g.finished, "{what}: not finished");
    assert_eq!(g.times, 1, "{what}: prompt logprobs must come exactly once");
    g.prompt_logprobs.clone().expect("prompt logprobs")
}

#[test]
fn prompt_logprobs_match_a_plain_forward_pass() {
    common::on_each_executor(|| {
        let mut ps = prompts(31, 3, 5, 40);
        ps.push(vec![17]); // a one-token prompt: [None]
        let mut eng = engine(&Setup::default());
        for (i, p) in ps.iter().enumerate() {
            eng.add_request(
                RequestId(i as u64),
                p.clone(),
                with_prompt_logprobs(i % 4, 3),
            )
            .expect("ok");
        }
        // A request without prompt_logprobs gets none.
        eng.add_request(RequestId(99), ps[0].clone(), common::params(3))
            .expect("ok");
        let got = run(&mut eng);
        for (i, p) in ps.iter().enumerate() {
            let g = &got[&RequestId(i as u64)];
            check(p, &entries(g, "batched"), i % 4, &format!("request {i}"));
            assert_eq!(g.tokens.len(), 3);
        }
        assert_eq!(got[&RequestId(99)].times, 0);
        assert_pools_full(&eng);
    });
}

#[test]
fn chunked_prefill_collects_every_chunk() {
    common::on_each_executor(|| {
        let ps = prompts(32, 3, 25, 45);
        for budget in [3usize, 8, 16] {
            let mut setup = Setup::default();
            setup.sched.max_num_batched_tokens = budget;
            let mut eng = engine(&setup);
            for (i, p) in ps.iter().enumerate() {
                eng.add_request(RequestId(i as u64), p.clone(), with_prompt_logprobs(5, 4))
                    .expect("ok");
            }
            let got = run(&mut eng);
            for (i, p) in ps.iter().enumerate() {
                let what = format!("budget {budget} request {i}");
                check(p, &entries(&got[&RequestId(i as u64)], &what), 5, &what);
            }
            assert_pools_full(&eng);
        }
    });
}

#[test]
fn prefix_cache_hits_are_not_taken_for_prompt_logprobs() {
    common::on_each_executor(|| {
        let prompt = prompts(33, 1, 30, 30).remove(0);
        let setup = Setup {
            prefix_caching: true,
            ..Setup::default()
        };
        let mut eng = engine(&setup);
        // Fills the cache with the prompt's blocks.
        eng.add_request(RequestId(0), prompt.clone(), common::params(2))
            .expect("ok");
        run(&mut eng);
        // Same prompt with prompt_logprobs: every entry, and no cache hit.
        eng.add_request(RequestId(1), prompt.clone(), with_prompt_logprobs(2, 2))
            .expect("ok");
        let got = run(&mut eng);
        let g = &got[&RequestId(1)];
        assert_eq!(g.cached, 0, "a prompt_logprobs request took a cache hit");
        check(
            &prompt,
            &entries(g, "after cache fill"),
            2,
            "after cache fill",
        );
        // The cache does hold the prompt: a plain request hits it.
        eng.add_request(RequestId(2), prompt.clone(), common::params(2))
            .expect("ok");
        let got = run(&mut eng);
        assert!(got[&RequestId(2)].cached > 0, "the cache was not filled");
        assert_eq!(got[&RequestId(2)].times, 0);
        // And two prompt_logprobs requests of that prompt at once, both full.
        for id in [3, 4] {
            eng.add_request(RequestId(id), prompt.clone(), with_prompt_logprobs(1, 2))
                .expect("ok");
        }
        let got = run(&mut eng);
        for id in [3, 4] {
            let what = format!("concurrent {id}");
            check(&prompt, &entries(&got[&RequestId(id)], &what), 1, &what);
        }
        assert_pools_full(&eng);
    });
}

#[test]
fn preemption_neither_loses_nor_duplicates_prompt_logprobs() {
    common::on_each_executor(|| {
        // Two decoders grow in a small pool while two low-priority long prompts
        // are prefilled in small chunks: the long ones are the victims each time
        // a decoder needs a block, in the middle of their prefill.
        let decoders = prompts(34, 2, 12, 12);
        let long = prompts(35, 2, 36, 44);
        for mode in [PreemptionMode::Recompute, PreemptionMode::Swap] {
            let mut setup = Setup {
                device_blocks: 28,
                cpu_blocks: if mode == PreemptionMode::Swap { 256 } else { 0 },
                ..Setup::default()
            };
            setup.sched.preemption_mode = mode;
            setup.sched.max_num_batched_tokens = 4;
            let mut eng = engine(&setup);
            for (i, p) in decoders.iter().enumerate() {
                eng.add_request(RequestId(i as u64), p.clone(), common::params(70))
                    .expect("ok");
            }
            let mut early = Vec::new();
            for _ in 0..8 {
                early.extend(eng.step());
            }
            assert!(early.iter().all(|o| o.prompt_logprobs.is_none()));
            for (i, p) in long.iter().enumerate() {
                let params = RequestParams {
                    priority: 1,
                    ..with_prompt_logprobs(3, 8)
                };
                eng.add_request(RequestId(10 + i as u64), p.clone(), params)
                    .expect("ok");
            }
            let got = run(&mut eng);
            for (i, p) in long.iter().enumerate() {
                let what = format!("{mode:?} request {i}");
                check(
                    p,
                    &entries(&got[&RequestId(10 + i as u64)], &what),
                    3,
                    &what,
                );
            }
            let s = eng.stats().scheduler;
            match mode {
                PreemptionMode::Recompute => assert!(s.preemptions_recompute > 0, "{s:?}"),
                _ => assert!(s.preemptions_swap > 0, "{s:?}"),
            }
            // Recomputed prompt tokens count again: the long prompts were
            // (partly) computed more than once.
            let long_tokens: usize = long.iter().map(Vec::len).sum();
            let decoder_tokens: usize = decoders.iter().map(Vec::len).sum();
            if mode == PreemptionMode::Recompute {
                assert!(
                    s.prompt_tokens as usize > long_tokens + decoder_tokens,
                    "no prompt was recomputed: {s:?}"
                );
            }
            assert_pools_full(&eng);
        }
    });
}

#[test]
fn buffered_groups_report_prompt_logprobs_on_their_final_output() {
    common::on_each_executor(|| {
        let prompt = prompts(36, 1, 14, 14).remove(0);
        let best_of = RequestParams {
            sampling: SamplingParams {
                n: 1,
                best_of: Some(3),
                temperature: 1.0,
                seed: Some(5),
                prompt_logprobs: Some(2),
                ..SamplingParams::default()
            },
            ..with_prompt_logprobs(2, 5)
        };
        let beam = RequestParams {
            sampling: SamplingParams {
                n: 2,
                best_of: Some(3),
                use_beam_search: true,
                prompt_logprobs: Some(2),
                ..SamplingParams::default()
            },
            ..with_prompt_logprobs(2, 5)
        };
        let parallel = RequestParams {
            sampling: SamplingParams {
                n: 3,
                temperature: 1.0,
                seed: Some(6),
                prompt_logprobs: Some(2),
                ..SamplingParams::default()
            },
            ..with_prompt_logprobs(2, 5)
        };
        for (name, params) in [("best_of", best_of), ("beam", beam), ("n=3", parallel)] {
            let mut eng = engine(&Setup::default());
            eng.add_request(RequestId(0), prompt.clone(), params)
                .expect("ok");
            let mut carried_by_final = false;
            let mut times = 0;
            let mut list = None;
            while eng.has_unfinished() {
                for o in eng.step() {
                    assert!(o.error.is_none(), "{name}: {:?}", o.error);
                    if let Some(p) = o.prompt_logprobs {
                        times += 1;
                        carried_by_final = o.finished;
                        // Never ahead of the tokens: the output carries them.
                        assert!(!o.seqs.is_empty(), "{name}");
                        list = Some(p);
                    }
                }
            }
            assert_eq!(times, 1, "{name}");
            if name != "n=3" {
                assert!(carried_by_final, "{name}: buffered output");
            }
            check(&prompt, &list.expect("list"), 2, name);
            assert_pools_full(&eng);
        }
    });
}
