//! Property tests of the scheduler alone over the real paged KV cache (no
//! forward pass: a sampled token is a fixed function of the sequence), under
//! random budgets, pool sizes, preemption modes and arrivals. Every step:
//! budgets hold, each scheduled sequence's block table covers exactly its
//! context, the KV cache agrees with `num_computed_tokens`, and the cache's
//! own invariants hold. At the end every request has its full length and
//! both pools are whole.

use engine::kv::{KvCacheManager, PagedKvCacheManager, PagedKvConfig};
use engine::sampler::SampleOut;
use engine::scheduler::{
    validate_request, Ahead, FinishReason, Outputs, PreemptionMode, RequestId, RequestParams,
    Scheduler, SchedulerConfig, SeqStatus, StepOutcome,
};
use proptest::prelude::*;

/// The "model": next token from the last one.
fn next_token(last: u32) -> u32 {
    (last * 31 + 7) % 997 + 3
}

#[derive(Debug, Clone)]
struct Case {
    block_size: usize,
    device_blocks: usize,
    cpu_blocks: usize,
    max_num_seqs: usize,
    max_batched: usize,
    mode: PreemptionMode,
    prefix_caching: bool,
    /// (prompt, max_tokens, arrival step)
    requests: Vec<(Vec<u32>, usize, usize)>,
}

fn case() -> impl Strategy<Value = Case> {
    (
        prop::sample::select(vec![1usize, 2, 4, 16]),
        0usize..8,
        0usize..40,
        1usize..6,
        1usize..40,
        prop::sample::select(vec![
            PreemptionMode::Auto,
            PreemptionMode::Swap,
            PreemptionMode::Recompute,
        ]),
        any::<bool>(),
        prop::collection::vec(
            (
                prop::collection::vec(3u32..40, 1..30),
                1usize..20,
                0usize..30,
            ),
            1..25,
        ),
    )
        .prop_map(|(bs, extra, cpu, seqs, batched, mode, pc, requests)| {
            let longest = requests
                .iter()
                .map(|(p, m, _)| p.len() + m)
                .max()
                .unwrap_or(1);
            Case {
                block_size: bs,
                device_blocks: longest.div_ceil(bs) + extra,
                cpu_blocks: cpu,
                max_num_seqs: seqs,
                max_batched: batched,
                mode,
                prefix_caching: pc,
                requests,
            }
        })
}

fn run(c: &Case) -> Result<(), TestCaseError> {
    let mut kv_cfg = PagedKvConfig::new(c.block_size, c.device_blocks, c.cpu_blocks);
    kv_cfg.watermark = 0.0;
    kv_cfg.enable_prefix_caching = c.prefix_caching;
    let mut kv =
        PagedKvCacheManager::new(kv_cfg).map_err(|e| TestCaseError::fail(e.to_string()))?;
    let config = SchedulerConfig {
        max_num_seqs: c.max_num_seqs,
        max_num_batched_tokens: c.max_batched,
        max_model_len: 64,
        enable_chunked_prefill: true,
        preemption_mode: c.mode,
        async_scheduling: false,
        speculative: None,
    };
    let mut sched = Scheduler::new(config).map_err(|e| TestCaseError::fail(e.to_string()))?;
    let mut outputs: Vec<Vec<u32>> = vec![Vec::new(); c.requests.len()];
    let mut done = vec![false; c.requests.len()];
    for step in 0..20_000usize {
        for (i, (p, m, at)) in c.requests.iter().enumerate() {
            if *at == step {
                // The engine refuses prompt + max_tokens beyond max_model_len.
                let params = RequestParams {
                    max_tokens: Some((*m).min(64 - p.len())),
                    ignore_eos: true,
                    ..RequestParams::default()
                };
                let capacity = kv.stats().total_blocks * kv.block_size();
                let valid = validate_request(sched.config(), capacity, p.clone(), params)
                    .map_err(|e| TestCaseError::fail(format!("invalid {i}: {e}")))?;
                sched
                    .add_request(&kv, RequestId(i as u64), valid)
                    .map_err(|e| TestCaseError::fail(format!("refused {i}: {e}")))?;
            }
        }
        let last_arrival = c.requests.iter().map(|r| r.2).max().unwrap_or(0);
        if step > last_arrival && !sched.has_unfinished() {
            break;
        }
        let out = sched.schedule(&mut kv);
        prop_assert!(out.refused.is_empty(), "{:?}", out.refused);
        prop_assert!(out.batch.token_ids.len() <= c.max_batched);
        let st = sched.stats();
        prop_assert!(st.num_running <= c.max_num_seqs);
        let mut row = 0;
        for span in &out.batch.seqs {
            prop_assert_eq!(
                span.block_table.len(),
                span.context_len.div_ceil(c.block_size)
            );
            let first = out.batch.positions[row];
            prop_assert_eq!(first + span.query_len, span.context_len);
            for k in 0..span.query_len {
                prop_assert_eq!(out.batch.positions[row + k], first + k);
                let pos = first + k;
                let slot = span.block_table[pos / c.block_size].0 as usize * c.block_size
                    + pos % c.block_size;
                prop_assert_eq!(out.batch.slot_mapping[row + k], slot);
            }
            row += span.query_len;
        }
        // "Sample" each logits row, and apply the step as the engine does.
        let mut rows = Vec::new();
        for t in &out.targets {
            let g = sched.group(t.request_id).expect("live group");
            let last = *g.seqs[t.seq_index].tokens.last().expect("non-empty");
            rows.push(SampleOut {
                token: next_token(last),
                logprob: 0.0,
                top_logprobs: Vec::new(),
            });
        }
        let mut news = Outputs::default();
        sched.update_from_output(
            &mut kv,
            &out,
            StepOutcome::Device {
                rows,
                spec: Vec::new(),
            },
            &Ahead::none(),
            &mut news,
        );
        for o in news.into_list() {
            let i = o.request_id.0 as usize;
            outputs[i].extend_from_slice(o.token_ids());
            if o.finished {
                prop_assert_eq!(o.seqs[0].finish_reason, Some(FinishReason::Length));
                done[i] = true;
            }
        }
        // The cache holds exactly the computed tokens of resident sequences.
        for i in 0..c.requests.len() {
            if let Some(g) = sched.group(RequestId(i as u64)) {
                for s in &g.seqs {
                    match s.status {
                        SeqStatus::Running | SeqStatus::Swapped => {
                            prop_assert_eq!(kv.num_tokens(s.id), Ok(s.num_computed_tokens));
                        }
                        SeqStatus::Waiting => prop_assert!(kv.num_tokens(s.id).is_err()),
                        SeqStatus::Finished(_) => {}
                    }
                }
            }
        }
        kv.check_invariants().map_err(TestCaseError::fail)?;
    }
    prop_assert!(!sched.has_unfinished(), "livelock");
    for (i, (p, m, _)) in c.requests.iter().enumerate() {
        prop_assert!(done[i]);
        // Same tokens as an unscheduled run of the "model".
        let mut last = *p.last().expect("non-empty");
        let want: Vec<u32> = (0..*m)
            .take(64 - p.len())
            .map(|_| {
                last = next_token(last);
                last
            })
            .collect();
        prop_assert_eq!(&outputs[i], &want);
    }
    if std::env::var_os("SCHED_PROPS_VERBOSE").is_some() {
        eprintln!("STATS {:?}", sched.stats());
    }
    let s = kv.stats();
    prop_assert_eq!(s.free_blocks, s.total_blocks);
    prop_assert_eq!(s.cpu_free_blocks, s.cpu_total_blocks);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]
    #[test]
    fn scheduler_keeps_budgets_and_cache_consistent(c in case()) {
        run(&c)?;
    }
}
