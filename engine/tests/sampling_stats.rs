//! Statistical tests of the sampler on fixed logits: empirical frequencies
//! over many seeded draws against the exact truncated distribution,
//! computed here plainly (f64, full sort) from the definitions; penalties
//! checked against hand-computed logits. The GPU sampler (the sampling
//! kernel on the host emulator, `engine::sampler::device`) is checked the
//! same way with fewer draws (the emulator runs a thread per GPU thread).

use engine::executor::Logits;
use engine::sampler::device::{
    emulate_draws, emulate_rows, DeviceDraws, DeviceRow, Fill, Processing,
};
use engine::sampler::{ops, sample_row, SamplingParams, SeqContext};

const LOGITS: [f32; 8] = [2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -3.0];
const DRAWS: u64 = 40_000;

/// Exact probabilities after temperature, top-k, top-p, min-p (reference).
fn reference(logits: &[f32], t: f64, top_k: usize, top_p: f64, min_p: f64) -> Vec<f64> {
    let mut idx: Vec<usize> = (0..logits.len()).collect();
    idx.sort_by(|&a, &b| logits[b].partial_cmp(&logits[a]).unwrap().then(a.cmp(&b)));
    idx.truncate(top_k);
    let w: Vec<f64> = idx
        .iter()
        .map(|&i| (f64::from(logits[i]) / t).exp())
        .collect();
    let z: f64 = w.iter().sum();
    let probs: Vec<f64> = w.iter().map(|x| x / z).collect();
    let mut kept = 0;
    let mut mass = 0.0;
    while kept < probs.len() && (kept == 0 || mass < top_p) {
        mass += probs[kept];
        kept += 1;
    }
    let kept = (0..kept).filter(|&j| probs[j] >= min_p * probs[0]).count();
    let z2: f64 = probs[..kept].iter().sum();
    let mut out = vec![0.0; logits.len()];
    for j in 0..kept {
        out[idx[j]] = probs[j] / z2;
    }
    out
}

/// Frequencies of `draws` draws by the emulated sampling kernel (seeds
/// `0..draws`, one row each).
fn gpu_frequencies(p: &SamplingParams, draws: u64) -> Vec<f64> {
    let rows: Vec<DeviceRow> = (0..draws)
        .map(|seed| DeviceRow::of(p, seed, 0, 0))
        .collect();
    let logits = Logits {
        rows: rows.len(),
        vocab: LOGITS.len(),
        data: LOGITS.repeat(rows.len()),
    };
    let mut counts = vec![0u64; LOGITS.len()];
    for s in emulate_rows(&logits, &rows) {
        counts[s.token as usize] += 1;
    }
    counts.iter().map(|&c| c as f64 / draws as f64).collect()
}

fn frequencies(p: &SamplingParams) -> Vec<f64> {
    let tokens = [0u32];
    let mut counts = vec![0u64; LOGITS.len()];
    for seed in 0..DRAWS {
        let ctx = SeqContext {
            params: p,
            tokens: &tokens,
            prompt_len: 1,
            seed,
            seq_index: 0,
            stop_ids: &[],
        };
        counts[sample_row(&LOGITS, &ctx).token as usize] += 1;
    }
    counts.iter().map(|&c| c as f64 / DRAWS as f64).collect()
}

/// Every token within 4.5 standard deviations of its exact probability,
/// and tokens outside the truncation never drawn.
fn check(p: SamplingParams, want: Vec<f64>) {
    check_freqs(&p, &frequencies(&p), &want, DRAWS);
}

fn check_freqs(p: &SamplingParams, got: &[f64], want: &[f64], draws: u64) {
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        if w == 0.0 {
            assert_eq!(g, 0.0, "token {i} is outside the truncation: {p:?}");
        } else {
            let sd = (w * (1.0 - w) / draws as f64).sqrt();
            assert!(
                (g - w).abs() < 4.5 * sd + 1e-9,
                "token {i}: got {g}, want {w} ({p:?})"
            );
        }
    }
}

fn params(t: f32) -> SamplingParams {
    SamplingParams {
        temperature: t,
        ..SamplingParams::default()
    }
}

#[test]
fn temperature_matches_softmax() {
    for t in [0.5f32, 1.0, 1.7] {
        check(params(t), reference(&LOGITS, f64::from(t), 8, 1.0, 0.0));
    }
}

#[test]
fn top_k_truncates_to_k() {
    for k in [1usize, 3, 5] {
        let p = SamplingParams {
            top_k: Some(k),
            ..params(1.0)
        };
        check(p, reference(&LOGITS, 1.0, k, 1.0, 0.0));
    }
}

#[test]
fn top_p_keeps_the_nucleus() {
    for top_p in [0.3f32, 0.6, 0.9] {
        let p = SamplingParams {
            top_p,
            ..params(0.8)
        };
        check(p, reference(&LOGITS, 0.8, 8, f64::from(top_p), 0.0));
    }
}

#[test]
fn min_p_drops_unlikely_tokens() {
    for min_p in [0.05f32, 0.2, 0.5] {
        let p = SamplingParams {
            min_p,
            ..params(1.0)
        };
        check(p, reference(&LOGITS, 1.0, 8, 1.0, f64::from(min_p)));
    }
}

#[test]
fn combined_truncations() {
    let p = SamplingParams {
        top_k: Some(6),
        top_p: 0.9,
        min_p: 0.1,
        ..params(1.3)
    };
    check(p, reference(&LOGITS, 1.3, 6, 0.9, 0.1));
}

#[test]
fn penalties_change_logits_as_defined() {
    let mut logits = vec![2.0f32, -1.0, 0.5, 3.0, -2.0];
    // prompt [0, 1], output [3, 3, 1]
    let tokens = [0u32, 1, 3, 3, 1];
    let p = SamplingParams {
        repetition_penalty: 2.0,
        frequency_penalty: 0.5,
        presence_penalty: 0.25,
        ..SamplingParams::default()
    };
    ops::apply_penalties(&mut logits, &tokens, 2, &p);
    // token 0: prompt only, positive -> 2/2 = 1
    // token 1: prompt+output once, negative -> -1*2 = -2, then -0.5*1 - 0.25
    // token 2: unseen -> 0.5
    // token 3: output twice, positive -> 3/2 = 1.5, then -0.5*2 - 0.25
    // token 4: unseen -> -2
    assert_eq!(logits, vec![1.0, -2.75, 0.5, 0.25, -2.0]);
}

#[test]
fn greedy_with_penalty_switches_choice_and_logprob_stays_raw() {
    let row = [1.0f32, 0.9, -5.0];
    let tokens = [7u32, 0];
    let p = SamplingParams {
        frequency_penalty: 1.0,
        logprobs: Some(2),
        ..SamplingParams::default()
    };
    let ctx = SeqContext {
        params: &p,
        tokens: &tokens,
        prompt_len: 1,
        seed: 0,
        seq_index: 0,
        stop_ids: &[],
    };
    let s = sample_row(&row, &ctx);
    assert_eq!(s.token, 1);
    let lse = (1.0f64.exp() + 0.9f64.exp() + (-5.0f64).exp()).ln();
    assert!((f64::from(s.logprob) - (0.9 - lse)).abs() < 1e-5);
    assert_eq!(s.top_logprobs.len(), 2);
    assert_eq!(s.top_logprobs[0].0, 0);
    assert!((f64::from(s.top_logprobs[0].1) - (1.0 - lse)).abs() < 1e-5);
}

#[test]
fn min_tokens_suppresses_stop_ids() {
    let row = [0.0f32, 10.0, 0.0];
    let p = SamplingParams {
        min_tokens: 2,
        ..SamplingParams::default()
    };
    let mk = |tokens: &'static [u32]| SeqContext {
        params: &p,
        tokens,
        prompt_len: 1,
        seed: 0,
        seq_index: 0,
        stop_ids: &[1],
    };
    assert_ne!(sample_row(&row, &mk(&[5, 6])).token, 1);
    assert_eq!(sample_row(&row, &mk(&[5, 6, 7])).token, 1);
}

#[test]
fn draws_depend_only_on_seed_stream_step_and_token() {
    let a = ops::uniform(42, 3, 7, 5);
    assert_eq!(a, ops::uniform(42, 3, 7, 5));
    assert_ne!(a, ops::uniform(42, 4, 7, 5));
    assert_ne!(a, ops::uniform(42, 3, 8, 5));
    assert_ne!(a, ops::uniform(43, 3, 7, 5));
    assert_ne!(a, ops::uniform(42, 3, 7, 6));
}

/// The GPU sampler's frequencies (emulated kernel) against the same exact
/// distributions: temperature alone, then every truncation at once.
#[test]
fn gpu_sampler_matches_the_exact_distribution() {
    const GPU_DRAWS: u64 = 400;
    let t = params(0.7);
    let want = reference(&LOGITS, 0.7, 8, 1.0, 0.0);
    check_freqs(&t, &gpu_frequencies(&t, GPU_DRAWS), &want, GPU_DRAWS);
    let all = SamplingParams {
        top_k: Some(6),
        top_p: 0.9,
        min_p: 0.1,
        ..params(1.3)
    };
    let want = reference(&LOGITS, 1.3, 6, 0.9, 0.1);
    check_freqs(&all, &gpu_frequencies(&all, GPU_DRAWS), &want, GPU_DRAWS);
}

/// The same logits rows to the CPU sampler and to the emulated GPU sampler,
/// every parameter combination cycled over many seeds, streams and steps:
/// the drawn ids must be identical, the logprobs and top logprobs equal up
/// to rounding. Fails if either side changes its key (seed, stream, step,
/// token) or its kept-set rule.
#[test]
fn cpu_and_gpu_samplers_draw_the_same_token_from_the_same_logits() {
    const ROWS: usize = 96;
    const VOCAB: usize = 256;
    let mut lcg = 0x2545_f491u32;
    let data: Vec<f32> = (0..ROWS * VOCAB)
        .map(|_| {
            lcg = lcg.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            ((lcg >> 8) as f32 / (1u32 << 24) as f32 - 0.5) * 14.0
        })
        .collect();
    let logits = Logits {
        rows: ROWS,
        vocab: VOCAB,
        data,
    };
    let temps = [0.0f32, 0.3, 0.8, 1.0, 1.9];
    let top_ps = [1.0f32, 0.95, 0.6, 0.3];
    let top_ks = [None, Some(1), Some(3), Some(40), Some(255), Some(1000)];
    let min_ps = [0.0f32, 0.02, 0.3];
    let logprobs = [None, Some(0), Some(3), Some(20)];
    let params: Vec<SamplingParams> = (0..ROWS)
        .map(|r| SamplingParams {
            temperature: temps[r % temps.len()],
            top_p: top_ps[(r / 2) % top_ps.len()],
            top_k: top_ks[(r / 3) % top_ks.len()],
            min_p: min_ps[(r / 5) % min_ps.len()],
            logprobs: logprobs[(r / 7) % logprobs.len()],
            ..SamplingParams::default()
        })
        .collect();
    let seed = |r: usize| (r as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    let (seq_index, prompt_len) = (|r: usize| r % 4, 3);
    let output_len = |r: usize| (r * 13) % 50;
    let rows: Vec<DeviceRow> = (0..ROWS)
        .map(|r| DeviceRow::of(&params[r], seed(r), seq_index(r), output_len(r)))
        .collect();
    let gpu = emulate_rows(&logits, &rows);
    assert_eq!(gpu.len(), ROWS);
    let mut random_draws = 0;
    for (r, p) in params.iter().enumerate() {
        let tokens = vec![1u32; prompt_len + output_len(r)];
        let ctx = SeqContext {
            params: p,
            tokens: &tokens,
            prompt_len,
            seed: seed(r),
            seq_index: seq_index(r),
            stop_ids: &[],
        };
        let cpu = sample_row(logits.row(r), &ctx);
        assert_eq!(gpu[r].token, cpu.token, "row {r}: {p:?}");
        assert!(
            (gpu[r].logprob - cpu.logprob).abs() < 1e-5,
            "row {r} logprob"
        );
        let ids = |v: &[(u32, f32)]| v.iter().map(|x| x.0).collect::<Vec<_>>();
        assert_eq!(ids(&gpu[r].top_logprobs), ids(&cpu.top_logprobs), "row {r}");
        for (g, c) in gpu[r].top_logprobs.iter().zip(&cpu.top_logprobs) {
            assert!((g.1 - c.1).abs() < 1e-5, "row {r} top logprob");
        }
        if p.temperature > 0.0 && p.top_k != Some(1) {
            random_draws += 1;
        }
    }
    assert!(random_draws > 45, "{random_draws} random draws");
}

/// Sequences with penalties, `min_tokens` suppression and `logit_bias`
/// drawn step after step by the CPU sampler (from each sequence's history)
/// and by the emulated device draw (from token counts filled once at the
/// first step, then updated on the device by each draw): the same token at
/// every step, logprobs equal up to rounding, and at the end the device's
/// counts equal the histories'. Fails if the count update, a penalty's
/// definition or the processing order differs.
#[test]
fn penalized_rows_draw_the_same_tokens_on_cpu_and_gpu_step_after_step() {
    const ROWS: usize = 8;
    const VOCAB: usize = 48;
    const STEPS: usize = 14;
    let d = SamplingParams::default;
    let params: [SamplingParams; ROWS] = [
        SamplingParams {
            repetition_penalty: 1.8,
            ..d()
        },
        SamplingParams {
            frequency_penalty: 1.5,
            presence_penalty: 0.5,
            ..d()
        },
        SamplingParams {
            temperature: 0.9,
            top_p: 0.9,
            repetition_penalty: 1.3,
            frequency_penalty: 0.4,
            logprobs: Some(3),
            ..d()
        },
        SamplingParams {
            min_tokens: 5,
            ..d()
        },
        SamplingParams {
            temperature: 1.0,
            logit_bias: vec![(7, 5.0), (3, -100.0), (7, 1.0)],
            logprobs: Some(2),
            ..d()
        },
        SamplingParams {
            repetition_penalty: 1.5,
            logit_bias: vec![(11, 2.5)],
            min_tokens: 3,
            ..d()
        },
        SamplingParams {
            temperature: 0.7,
            ..d()
        },
        SamplingParams {
            temperature: 1.2,
            top_k: Some(10),
            min_p: 0.05,
            presence_penalty: 1.0,
            frequency_penalty: 0.3,
            ..d()
        },
    ];
    let mut lcg = 0x1234_5678u32;
    let mut next = move || {
        lcg = lcg.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
        (lcg >> 8) as f32 / (1u32 << 24) as f32 - 0.5
    };
    // A steep base row per sequence (greedy would repeat its argmax),
    // plus a little noise per step.
    let base: Vec<f32> = (0..ROWS * VOCAB).map(|_| next() * 8.0).collect();
    // Prompts of 5 tokens (with each row's best token, so repetition bites
    // at once); sequence 1 starts with 3 output tokens already.
    let mut hist: Vec<Vec<u32>> = (0..ROWS)
        .map(|r| {
            let row = &base[r * VOCAB..(r + 1) * VOCAB];
            let best = (0..VOCAB).fold(0, |b, i| if row[i] > row[b] { i } else { b });
            vec![best as u32, 2, 9, (r * 5 % VOCAB) as u32, 2]
        })
        .collect();
    let prompt_len = 5;
    hist[1].extend([4, 4, 30]);
    let stop_ids: Vec<Vec<u32>> = (0..ROWS).map(|r| vec![hist[r][0], 40]).collect();
    let seed = |r: usize| 1000 + r as u64;
    let mut counts = Vec::new();
    let mut moved_by_processing = 0;
    for step in 0..STEPS {
        let data: Vec<f32> = base.iter().map(|&b| b + next() * 0.5).collect();
        let mut draws = DeviceDraws {
            slots: ROWS as u32,
            ..DeviceDraws::default()
        };
        for (r, p) in params.iter().enumerate() {
            let out_len = hist[r].len() - prompt_len;
            let mut proc = Processing::of(p, out_len, &stop_ids[r]);
            if p.has_penalties() {
                if let Some(q) = proc.as_mut() {
                    q.slot = Some(r as u32);
                }
                if step == 0 {
                    draws
                        .fills
                        .push(Fill::from_tokens(r as u32, &hist[r], prompt_len));
                }
            }
            draws.push(DeviceRow::of(p, seed(r), 0, out_len), proc);
        }
        let mut logits = Logits {
            rows: ROWS,
            vocab: VOCAB,
            data: data.clone(),
        };
        let gpu = emulate_draws(&mut logits, &draws, &mut counts)
            .expect("emulated draw")
            .rows;
        assert_eq!(gpu.len(), ROWS);
        for (r, p) in params.iter().enumerate() {
            // The engine's CPU path: bias a copy (postprocess), then sample.
            let mut row = data[r * VOCAB..(r + 1) * VOCAB].to_vec();
            for &(t, b) in &p.logit_bias {
                row[t as usize] += b;
            }
            let ctx = SeqContext {
                params: p,
                tokens: &hist[r],
                prompt_len,
                seed: seed(r),
                seq_index: 0,
                stop_ids: &stop_ids[r],
            };
            let cpu = sample_row(&row, &ctx);
            assert_eq!(gpu[r].token, cpu.token, "step {step} row {r}: {p:?}");
            assert!(
                (gpu[r].logprob - cpu.logprob).abs() < 1e-5,
                "step {step} row {r} logprob"
            );
            let ids = |v: &[(u32, f32)]| v.iter().map(|x| x.0).collect::<Vec<_>>();
            assert_eq!(ids(&gpu[r].top_logprobs), ids(&cpu.top_logprobs));
            if p.is_greedy() && cpu.token != engine::sampler::Sampler.greedy(&row).token {
                moved_by_processing += 1;
            }
            hist[r].push(cpu.token);
        }
    }
    assert!(
        moved_by_processing > 10,
        "processing changed only {moved_by_processing} greedy picks"
    );
    for (r, p) in params.iter().enumerate() {
        if !p.has_penalties() {
            continue;
        }
        let mut want = [0u32; VOCAB];
        for (t, e) in Fill::from_tokens(0, &hist[r], prompt_len).entries {
            want[t as usize] = e;
        }
        assert_eq!(
            &counts[r * VOCAB..(r + 1) * VOCAB],
            &want[..],
            "row {r}: the device's counts"
        );
    }
}
