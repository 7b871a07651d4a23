//! Request lifecycle: refusals that never hold the queue, aborts in every
//! state, and finishing on EOS / stop tokens / max_model_len.

mod common;

use common::{assert_pools_full, collect, engine, params, prompts, run_to_end, Setup};
use engine::error::{EngineError, RequestError};
use engine::scheduler::{FinishReason, PreemptionMode, RequestId, RequestParams};
use std::collections::HashMap;

#[test]
fn oversized_requests_are_refused_while_others_complete() {
    common::on_each_executor(|| {
        let setup = Setup {
            device_blocks: 20,
            watermark: 0.25,
            ..Setup::default()
        };
        let capacity = 20 * setup.block_size;
        let mut eng = engine(&setup);
        let ps = prompts(3, 4, 5, 20);

        // Could grow beyond the whole cache: refused at once.
        let err = eng
            .add_request(RequestId(99), ps[0].clone(), params(capacity))
            .expect_err("must be refused");
        assert!(
            matches!(err, EngineError::Request(RequestError::NeverFits { .. })),
            "{err:?}"
        );

        // Fits the cache, but not above the watermark once grown to its full
        // length (as a recompute would readmit it): refused at once too.
        let err = eng
            .add_request(RequestId(98), ps[1][..5].to_vec(), params(70))
            .expect_err("must be refused");
        assert!(
            matches!(err, EngineError::Request(RequestError::NeverFits { .. })),
            "{err:?}"
        );

        // A long prompt that barely fits, queued first: the others behind it
        // still complete.
        let long: Vec<u32> = (0..56).map(|i| 3 + i as u32).collect();
        eng.add_request(RequestId(0), long, params(2))
            .expect("queued");
        for (i, p) in ps.iter().enumerate() {
            eng.add_request(RequestId(1 + i as u64), p.clone(), params(8))
                .expect("accepted");
        }
        let mut got = HashMap::new();
        run_to_end(&mut eng, &mut got);
        assert_eq!(got[&RequestId(0)].tokens.len(), 2);
        for i in 1..=ps.len() as u64 {
            let c = &got[&RequestId(i)];
            assert!(c.finished && c.error.is_none(), "{c:?}");
            assert_eq!(c.tokens.len(), 8);
        }
        assert!(!got.contains_key(&RequestId(98)));
        assert!(!got.contains_key(&RequestId(99)));
        assert_pools_full(&eng);
    });
}

#[test]
fn bad_requests_get_typed_errors() {
    common::on_each_executor(|| {
        let mut eng = engine(&Setup::default());
        let max_len = Setup::default().sched.max_model_len;
        let refusal = |r: Result<(), EngineError>| match r {
            Err(EngineError::Request(e)) => e,
            other => panic!("not a request error: {other:?}"),
        };
        assert_eq!(
            refusal(eng.add_request(RequestId(1), vec![], params(4))),
            RequestError::EmptyPrompt
        );
        // The one context-length rule: prompt + max_tokens <= max_model_len.
        assert_eq!(
            refusal(eng.add_request(RequestId(2), vec![5; max_len - 3], params(4))),
            RequestError::ContextTooLong {
                prompt_len: max_len - 3,
                max_tokens: 4,
                max_model_len: max_len
            }
        );
        eng.add_request(RequestId(5), vec![5; max_len - 4], params(4))
            .expect("exactly max_model_len");
        assert!(matches!(
            refusal(eng.add_request(RequestId(3), vec![5; 4], params(0))),
            RequestError::InvalidParam {
                param: "max_tokens",
                ..
            }
        ));
        eng.add_request(RequestId(4), vec![5; 4], params(2))
            .expect("ok");
        assert_eq!(
            refusal(eng.add_request(RequestId(4), vec![5; 4], params(2))),
            RequestError::DuplicateRequest(RequestId(4))
        );
    });
}

#[test]
fn aborts_free_blocks_in_every_state() {
    common::on_each_executor(|| {
        // A tight pool with swap space: some requests run, some get swapped,
        // some wait; abort one of each kind mid-way.
        let mut setup = Setup {
            device_blocks: 24,
            cpu_blocks: 64,
            ..Setup::default()
        };
        setup.sched.preemption_mode = PreemptionMode::Swap;
        let mut eng = engine(&setup);
        let ps = prompts(11, 8, 10, 30);
        for (i, p) in ps.iter().enumerate() {
            eng.add_request(RequestId(i as u64), p.clone(), params(30))
                .expect("ok");
        }
        let mut got = HashMap::new();
        let mut aborted = Vec::new();
        for _ in 0..10_000 {
            if !eng.has_unfinished() {
                break;
            }
            let s = eng.stats().scheduler;
            // Abort the newest live request whenever some are swapped or waiting.
            if aborted.len() < 3 && (s.num_swapped > 0 || (s.num_waiting > 0 && s.num_running > 0))
            {
                let victim = (0..ps.len() as u64).rev().map(RequestId).find(|id| {
                    !aborted.contains(id)
                        && !got.get(id).is_some_and(|c: &common::Collected| c.finished)
                });
                if let Some(id) = victim {
                    assert!(eng.abort_request(id));
                    aborted.push(id);
                }
            }
            collect(&mut got, eng.step());
        }
        assert!(!aborted.is_empty());
        assert!(!eng.abort_request(RequestId(1000)));
        for i in 0..ps.len() as u64 {
            let id = RequestId(i);
            if !aborted.contains(&id) {
                assert!(got[&id].finished, "request {i} unfinished");
                assert_eq!(got[&id].tokens.len(), 30);
            }
        }
        assert!(eng.stats().scheduler.preemptions_swap > 0);
        assert_pools_full(&eng);
    });
}

#[test]
fn sequences_stop_on_stop_tokens_eos_and_max_model_len() {
    common::on_each_executor(|| {
        let p = prompts(5, 1, 8, 8).remove(0);
        // Learn what the model says, then stop on its third token.
        let (free_run, _) = common::run_batch(&Setup::default(), std::slice::from_ref(&p), &[6]);
        let stop = free_run[0][2];
        let mut eng = engine(&Setup::default());
        let stop_params = RequestParams {
            stop_token_ids: vec![stop],
            ..params(6)
        };
        eng.add_request(RequestId(0), p.clone(), stop_params)
            .expect("ok");
        let outs = drain(&mut eng);
        let first_stop = free_run[0].iter().position(|&t| t == stop).unwrap_or(2);
        assert_eq!(outs.tokens, free_run[0][..=first_stop].to_vec());
        assert_eq!(outs.reason, Some(FinishReason::Stop));

        // max_model_len caps prompt + output.
        let mut setup = Setup::default();
        setup.sched.max_model_len = p.len() + 3;
        let mut eng = engine(&setup);
        eng.add_request(
            RequestId(0),
            p.clone(),
            RequestParams {
                max_tokens: None,
                ..params(1)
            },
        )
        .expect("ok");
        let outs = drain(&mut eng);
        assert_eq!(outs.tokens, free_run[0][..3].to_vec());
        assert_eq!(outs.reason, Some(FinishReason::Length));
        assert_pools_full(&eng);
    });
}

struct One {
    tokens: Vec<u32>,
    reason: Option<FinishReason>,
}

/// Runs a single request (id 0) to the end and keeps its finish reason.
fn drain(eng: &mut engine::LlmEngine) -> One {
    let mut one = One {
        tokens: Vec::new(),
        reason: None,
    };
    while eng.has_unfinished() {
        for o in eng.step() {
            for s in &o.seqs {
                one.tokens.extend_from_slice(&s.new_token_ids);
                one.reason = one.reason.or(s.finish_reason);
            }
        }
    }
    one
}
