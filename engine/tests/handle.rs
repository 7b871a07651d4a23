//! The async handle: streams carry the same tokens as the synchronous
//! engine, dropping a stream frees its blocks, the waiting limit answers
//! `Overloaded`, and shutdown drains or aborts.

mod common;

use common::{engine, params, prompts, run_batch, Setup};
use engine::engine_loop::{HandleConfig, ShutdownMode};
use engine::error::RequestError;
use engine::scheduler::FinishReason;
use engine::{EngineError, EngineHandle, RequestStream};
use std::time::{Duration, Instant};

/// Reads a stream to its end: tokens, and the error if any.
/// The tokens of a stream, and its error as text if it ended with one.
fn read_all(stream: &mut RequestStream) -> (Vec<u32>, Option<String>) {
    let mut tokens = Vec::new();
    while let Some(item) = stream.blocking_recv() {
        match item {
            Ok(out) => {
                tokens.extend_from_slice(out.token_ids());
                if out.finished {
                    return (tokens, None);
                }
            }
            Err(e) => return (tokens, Some(e.to_string())),
        }
    }
    (tokens, None)
}

/// Polls until `cond` holds or a generous deadline passes.
fn eventually(mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    false
}

#[test]
fn streams_match_the_synchronous_engine() {
    common::on_each_executor(|| {
        let ps = prompts(21, 5, 4, 30);
        let max = [10, 12, 8, 14, 9];
        let (want, _) = run_batch(&Setup::default(), &ps, &max);
        let handle =
            EngineHandle::spawn(engine(&Setup::default()), HandleConfig::default()).expect("spawn");
        let mut streams: Vec<_> = ps
            .iter()
            .zip(max)
            .map(|(p, m)| handle.add_request(p.clone(), params(m)).expect("accepted"))
            .collect();
        for (s, w) in streams.iter_mut().zip(&want) {
            assert_eq!(&read_all(s), &(w.clone(), None));
        }
        // Refusals come back synchronously.
        assert!(matches!(
            handle.add_request(vec![], params(3)).err(),
            Some(EngineError::Request(RequestError::EmptyPrompt))
        ));
        handle.shutdown(ShutdownMode::Drain);
        assert!(matches!(
            handle.add_request(ps[0].clone(), params(3)).err(),
            Some(EngineError::ShutDown)
        ));
    });
}

#[test]
fn dropping_a_stream_frees_its_blocks() {
    common::on_each_executor(|| {
        let handle =
            EngineHandle::spawn(engine(&Setup::default()), HandleConfig::default()).expect("spawn");
        let p = prompts(4, 1, 30, 30).remove(0);
        let mut s = handle.add_request(p, params(200)).expect("accepted");
        // Wait for the first token: the request holds blocks now.
        assert!(matches!(s.blocking_recv(), Some(Ok(_))));
        assert!(handle.stats().kv.free_blocks < handle.stats().kv.total_blocks);
        drop(s);
        assert!(eventually(|| {
            let st = handle.stats();
            st.kv.free_blocks == st.kv.total_blocks && st.scheduler.num_running == 0
        }));
        handle.shutdown(ShutdownMode::Abort);
    });
}

#[test]
fn waiting_limit_answers_overloaded_and_shutdown_drains() {
    common::on_each_executor(|| {
        // One long request fills the pool; the rest must wait.
        let setup = Setup {
            device_blocks: 40,
            ..Setup::default()
        };
        let limit = 4;
        let handle = EngineHandle::spawn(
            engine(&setup),
            HandleConfig {
                max_waiting: limit,
                ..HandleConfig::default()
            },
        )
        .expect("spawn");
        let long = prompts(8, 1, 20, 20).remove(0);
        let mut first = handle.add_request(long, params(130)).expect("accepted");
        assert!(matches!(first.blocking_recv(), Some(Ok(_))));
        let mut accepted = Vec::new();
        let mut overloaded = None;
        for p in prompts(9, 3 * limit, 60, 60) {
            match handle.add_request(p, params(40)) {
                Ok(s) => accepted.push(s),
                Err(e) => {
                    overloaded = Some(e);
                    break;
                }
            }
        }
        // Refused only when at least `limit` requests were waiting. How many
        // were accepted before that can exceed the limit: the engine may
        // admit a waiting request into the running batch between two adds
        // (it did on a loaded machine), so only the lower bound is fixed.
        assert!(
            matches!(overloaded, Some(EngineError::Overloaded { waiting, limit: 4 }) if waiting >= 4),
            "{overloaded:?} after {} accepted",
            accepted.len()
        );
        assert!(accepted.len() >= limit - 1, "{}", accepted.len());
        // Drain: everything accepted still completes.
        let joiner = {
            let h = handle.clone();
            std::thread::spawn(move || h.shutdown(ShutdownMode::Drain))
        };
        let (rest, err) = read_all(&mut first);
        assert_eq!((rest.len(), err), (129, None));
        for s in accepted.iter_mut() {
            let (t, e) = read_all(s);
            assert_eq!((t.len(), e), (40, None));
        }
        joiner.join().expect("shutdown");
        let st = handle.stats();
        assert_eq!(st.kv.free_blocks, st.kv.total_blocks);
    });
}

#[test]
fn abort_shutdown_ends_every_stream() {
    common::on_each_executor(|| {
        let handle =
            EngineHandle::spawn(engine(&Setup::default()), HandleConfig::default()).expect("spawn");
        let mut streams: Vec<_> = prompts(10, 4, 10, 20)
            .into_iter()
            .map(|p| handle.add_request(p, params(230)).expect("accepted"))
            .collect();
        assert!(matches!(streams[0].blocking_recv(), Some(Ok(_))));
        handle.shutdown(ShutdownMode::Abort);
        for s in streams.iter_mut() {
            let (tokens, err) = read_all(s);
            assert!(tokens.len() < 250);
            assert_eq!(err, Some(EngineError::ShutDown.to_string()));
        }
        let st = handle.stats();
        assert_eq!(st.kv.free_blocks, st.kv.total_blocks);
    });
}

#[test]
fn explicit_abort_ends_the_stream_with_reason_abort() {
    common::on_each_executor(|| {
        let handle =
            EngineHandle::spawn(engine(&Setup::default()), HandleConfig::default()).expect("spawn");
        // Company keeps each step busy, so the abort lands long before the
        // request could reach its length.
        let mut company: Vec<_> = prompts(13, 32, 10, 10)
            .into_iter()
            .map(|p| handle.add_request(p, params(240)).expect("accepted"))
            .collect();
        let p = prompts(12, 1, 10, 10).remove(0);
        let mut s = handle.add_request(p, params(240)).expect("accepted");
        assert!(matches!(s.blocking_recv(), Some(Ok(_))));
        handle.abort(s.request_id());
        let mut last = None;
        while let Some(item) = s.blocking_recv() {
            let out = item.expect("no error");
            if out.finished {
                last = Some(out);
                break;
            }
        }
        let last = last.expect("a final output");
        assert!(last
            .seqs
            .iter()
            .any(|o| o.finish_reason == Some(FinishReason::Abort)));
        for c in company.iter_mut() {
            assert_eq!(read_all(c).0.len(), 240);
        }
        assert!(eventually(|| {
            let st = handle.stats();
            st.kv.free_blocks == st.kv.total_blocks
        }));
    });
}

/// A reader slower than the engine loses nothing: outputs that do not fit
/// the bounded stream are merged and delivered in order when it reads.
#[test]
fn a_slow_reader_gets_every_token_through_a_small_stream() {
    common::on_each_executor(|| {
        let ps = prompts(31, 1, 6, 6);
        let (want, _) = run_batch(&Setup::default(), &ps, &[120]);
        let config = HandleConfig {
            stream_capacity: 1,
            ..HandleConfig::default()
        };
        let handle = EngineHandle::spawn(engine(&Setup::default()), config).expect("spawn");
        let mut s = handle
            .add_request(ps[0].clone(), params(120))
            .expect("accepted");
        // Let the engine run ahead of the reader (it finishes meanwhile).
        assert!(eventually(|| {
            let st = handle.stats().scheduler;
            st.generation_tokens >= 120 && st.num_running == 0
        }));
        let (tokens, err) = read_all(&mut s);
        assert_eq!((tokens, err), (want[0].clone(), None));
        assert_eq!(handle.stream_stall_aborts(), 0);
        handle.shutdown(ShutdownMode::Abort);
    });
}

/// A reader that stops reading: after the stall timeout its request is
/// aborted, its blocks return, and its stream ends after what was queued;
/// the others (read) are not disturbed.
#[test]
fn a_stream_nobody_reads_is_aborted_after_the_stall_timeout() {
    common::on_each_executor(|| {
        let config = HandleConfig {
            stream_capacity: 2,
            stall_timeout: Duration::from_millis(20),
            ..HandleConfig::default()
        };
        let handle = EngineHandle::spawn(engine(&Setup::default()), config).expect("spawn");
        // Company, read on other threads, keeps each step busy so the stalled
        // request is far from its length when the timeout strikes.
        let readers: Vec<_> = prompts(41, 16, 10, 10)
            .into_iter()
            .map(|p| {
                let mut s = handle.add_request(p, params(240)).expect("accepted");
                std::thread::spawn(move || read_all(&mut s))
            })
            .collect();
        let p = prompts(42, 1, 10, 10).remove(0);
        let mut stalled = handle.add_request(p, params(240)).expect("accepted");
        assert!(eventually(|| handle.stream_stall_aborts() >= 1));
        let (tokens, err) = read_all(&mut stalled);
        assert!(tokens.len() < 240, "aborted early, got {}", tokens.len());
        assert_eq!(err, None, "the stream just ends");
        // Company readers run on a loaded machine: one starved for longer
        // than the (short) timeout is aborted too, and counted.
        let mut short = 0;
        for r in readers {
            let (t, e) = r.join().expect("reader");
            assert_eq!(e, None);
            short += u64::from(t.len() < 240);
        }
        assert_eq!(short + 1, handle.stream_stall_aborts());
        assert!(eventually(|| {
            let st = handle.stats();
            st.kv.free_blocks == st.kv.total_blocks && st.scheduler.num_running == 0
        }));
        handle.shutdown(ShutdownMode::Abort);
    });
}
