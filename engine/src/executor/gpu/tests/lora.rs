//! LoRA on the GPU executor (emulated device) against the CPU executor with
//! the same adapters: a mixed prefill (base rows, two adapters, two
//! sequences of one adapter side by side: SGMV over merged runs), decode
//! steps (BGMV), a slot refilled with a higher-rank adapter (the stacks
//! reallocated and the other slot uploaded again), in f32 (to rounding) and
//! bf16 (to bf16 tolerance); the launches a step with adapters adds, and
//! none on the base path.

use super::*;
use crate::executor::{Sampling, StepOutput};
use crate::model::lora::{LoraAdapter, LoraId, LoraStep, LoraTarget, SlotEntry};
use model_loader::lora::{LoraFormat, LoraLayer, LoraPair};
use rand::{Rng, SeedableRng};
use std::sync::Arc;

/// A seeded adapter of `rank` on `targets` of every layer of `c`, with
/// deltas large enough to move the logits visibly.
fn adapter(c: &ModelConfig, seed: u64, rank: usize, targets: &[LoraTarget]) -> Arc<LoraAdapter> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let mut uniform =
        |n: usize, w: f32| -> Vec<f32> { (0..n).map(|_| rng.gen_range(-w..w)).collect() };
    let layers = (0..c.num_hidden_layers)
        .map(|_| {
            let mut l = LoraLayer::default();
            for &t in targets {
                let (out, inp) = t.shape(c);
                l.pairs[t.index()] = Some(LoraPair {
                    a: uniform(rank * inp, 1.0 / (inp as f32).sqrt()),
                    b: uniform(out * rank, 0.4),
                });
            }
            l
        })
        .collect();
    Arc::new(LoraAdapter {
        format: LoraFormat::Peft,
        rank,
        alpha: 2.0 * rank as f32,
        scale: 2.0,
        base_model: None,
        layers,
    })
}

fn slot(id: u32, a: &Arc<LoraAdapter>) -> Option<SlotEntry> {
    Some(SlotEntry {
        id: LoraId(id),
        adapter: Arc::clone(a),
    })
}

fn logits_of(
    e: &mut dyn Executor,
    b: &ForwardBatch,
    lora: &LoraStep,
) -> Result<crate::executor::Logits, ExecError> {
    match e.execute_lora(&BlockOps::default(), b, lora, &Sampling::Host)? {
        StepOutput::Logits(l) => Ok(l),
        StepOutput::Drawn(_) => Err(ExecError::WrongAnswer("draws".into())),
    }
}

/// Largest absolute difference of `rows` of two logits sets, and the
/// largest absolute logit of `want`.
fn diff_rows(got: &crate::executor::Logits, want: &crate::executor::Logits) -> (f32, f32) {
    assert_eq!((got.rows, got.vocab), (want.rows, want.vocab));
    assert!(got.data.iter().all(|v| v.is_finite()), "non-finite logits");
    let d = got
        .data
        .iter()
        .zip(&want.data)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f32::max);
    let s = want.data.iter().map(|v| v.abs()).fold(0.0, f32::max);
    (d, s)
}

/// The steps of the module docs on both executors; per step the largest
/// logit difference and scale. Also checks the slot fills and that the
/// adapters change the rows they apply to (against the base model on the
/// CPU).
fn lora_steps(dtype: DType) -> Vec<(f32, f32)> {
    use LoraTarget::*;
    let c = config(64);
    let v = c.vocab_size;
    let (mut cpu, mut gpu) = pair(64, dtype);
    let model = CpuModel::new(c.clone(), random_weights(&c, 11)).expect("model");
    let mut base_cpu = CpuExecutor::new(model, BLOCKS, CPU_BLOCKS, BS).expect("cpu executor");
    // X: attention q/v and the MLP's down (rank 4); Y: every target (rank 8);
    // Z: k, o, gate, up at rank 16 (grows the stacks).
    let x = adapter(&c, 1, 4, &[Q, V, Down]);
    let y = adapter(&c, 2, 8, &LoraTarget::ALL);
    let z = adapter(&c, 3, 16, &[K, O, Gate, Up]);
    let t: Vec<Vec<BlockId>> = (1..=5).map(|s| table(8, s)).collect();
    let p: Vec<Vec<u32>> = (1..=5).map(|s| ids(9, s as u32, v)).collect();
    let mut out = Vec::new();
    // Prefill: base (7 rows), X (5), X (3), Y (6); logits of every row of
    // the X and Y sequences and the last base row.
    let prefill = batch(&[
        Part {
            ids: &p[0][..7],
            past: 0,
            table: &t[0],
            want: &[6],
        },
        Part {
            ids: &p[1][..5],
            past: 0,
            table: &t[1],
            want: &[0, 1, 2, 3, 4],
        },
        Part {
            ids: &p[2][..3],
            past: 0,
            table: &t[2],
            want: &[0, 2],
        },
        Part {
            ids: &p[3][..6],
            past: 0,
            table: &t[3],
            want: &[0, 5],
        },
    ]);
    let step = LoraStep {
        slots: vec![slot(10, &x), slot(11, &y)],
        seq_slot: vec![None, Some(0), Some(0), Some(1)],
    };
    let want = logits_of(&mut cpu, &prefill, &step).expect("cpu prefill");
    let got = logits_of(&mut gpu, &prefill, &step).expect("gpu prefill");
    out.push(diff_rows(&got, &want));
    assert_eq!(gpu.lora_fills(), 2);
    // Base row equal to the base model's; adapted rows clearly not.
    let base = logits_of(&mut base_cpu, &prefill, &LoraStep::default()).expect("base");
    let row_diff = |r: usize| {
        want.row(r)
            .iter()
            .zip(base.row(r))
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f32::max)
    };
    assert!(row_diff(0) < 1e-5, "the base row moved: {}", row_diff(0));
    for r in 1..want.rows {
        assert!(row_diff(r) > 0.05, "row {r}: the adapter changed nothing");
    }
    // Decode: every sequence one token (BGMV), the same slots (no fill).
    let decode = batch(&[
        Part {
            ids: &p[0][7..8],
            past: 7,
            table: &t[0],
            want: &[0],
        },
        Part {
            ids: &p[1][5..6],
            past: 5,
            table: &t[1],
            want: &[0],
        },
        Part {
            ids: &p[2][3..4],
            past: 3,
            table: &t[2],
            want: &[0],
        },
        Part {
            ids: &p[3][6..7],
            past: 6,
            table: &t[3],
            want: &[0],
        },
    ]);
    let want = logits_of(&mut cpu, &decode, &step).expect("cpu decode");
    let got = logits_of(&mut gpu, &decode, &step).expect("gpu decode");
    out.push(diff_rows(&got, &want));
    assert_eq!(gpu.lora_fills(), 2, "slots reused");
    // Slot 0 now holds Z (rank 16: the stacks grow, Y is uploaded again);
    // a new sequence on Z, Y and the base decode.
    let step = LoraStep {
        slots: vec![slot(12, &z), slot(11, &y)],
        seq_slot: vec![Some(1), Some(0), None],
    };
    let decode = batch(&[
        Part {
            ids: &p[3][7..8],
            past: 7,
            table: &t[3],
            want: &[0],
        },
        Part {
            ids: &p[4][..1],
            past: 0,
            table: &t[4],
            want: &[0],
        },
        Part {
            ids: &p[0][8..9],
            past: 8,
            table: &t[0],
            want: &[0],
        },
    ]);
    let want = logits_of(&mut cpu, &decode, &step).expect("cpu refill");
    let got = logits_of(&mut gpu, &decode, &step).expect("gpu refill");
    out.push(diff_rows(&got, &want));
    assert_eq!(
        gpu.lora_fills(),
        4,
        "Z filled, Y uploaded again into the grown stacks"
    );
    out
}

#[test]
fn f32_lora_steps_match_the_cpu_executor() {
    for (i, (diff, scale)) in lora_steps(DType::F32).into_iter().enumerate() {
        println!("step {i}: largest logit difference {diff:.2e} (scale {scale:.1})");
        assert!(scale > 0.5, "degenerate logits");
        assert!(diff < 1e-3, "step {i}: logits differ by {diff}");
    }
}

#[test]
fn bf16_lora_steps_stay_within_bf16_tolerance_of_the_cpu() {
    for (i, (diff, scale)) in lora_steps(DType::Bf16).into_iter().enumerate() {
        assert!(
            diff < 0.05 * scale.max(1.0),
            "step {i}: logits differ by {diff} (scale {scale})"
        );
    }
}

/// On the counting device: a step with adapters adds one shrink and one
/// expand per adapted target and layer, and an upload for its row index;
/// the base path afterwards launches, uploads and allocates exactly what it
/// did before any adapter.
#[test]
fn adapters_add_two_launches_per_adapted_target_and_nothing_to_the_base_path() {
    use LoraTarget::*;
    let c = config(64);
    let (mut gpu, counters, b) = counting_five_decode_rows(&c, true);
    let none = BlockOps::default();
    // Warm: the scratch sized, the block tables up.
    gpu.logits(&none, &b).expect("base step");
    let before = counters.get();
    gpu.logits(&none, &b).expect("base step");
    let base = counters.get().since(&before);
    let (x, y) = (adapter(&c, 1, 4, &[Q, V]), adapter(&c, 2, 8, &[Down]));
    // Rows 0, 3 on X, row 1 on Y, rows 2 and 4 base.
    let step = LoraStep {
        slots: vec![slot(1, &x), slot(2, &y), None],
        seq_slot: vec![Some(0), Some(1), None, Some(0), None],
    };
    let before = counters.get();
    logits_of(&mut gpu, &b, &step).expect("first adapter step");
    let first = counters.get().since(&before);
    let before = counters.get();
    logits_of(&mut gpu, &b, &step).expect("adapter step");
    let again = counters.get().since(&before);
    let layers = c.num_hidden_layers as u64;
    // X: q and v; Y: down.
    assert_eq!(again.launches, base.launches + 2 * 3 * layers);
    assert_eq!(again.gemms, base.gemms);
    assert_eq!((again.uploads, again.allocs), (base.uploads + 1, 0));
    // The first one also uploaded X (q, v) and Y (down): A and B each, then
    // the rank table.
    assert_eq!(first.uploads, again.uploads + 2 * 3 * layers + 1);
    // Only Y in use: X's sites launch nothing.
    let step = LoraStep {
        seq_slot: vec![None, Some(1), None, None, None],
        ..step
    };
    let before = counters.get();
    logits_of(&mut gpu, &b, &step).expect("adapter step");
    let y_only = counters.get().since(&before);
    assert_eq!(y_only.launches, base.launches + 2 * layers);
    let before = counters.get();
    gpu.logits(&none, &b).expect("base step");
    assert_eq!(counters.get().since(&before), base);
    // With CUDA graphs: the plain decode step replays its graph, the same
    // step with adapters runs eagerly.
    let (mut gpu, counters, b) = counting_five_decode_rows(&c, false);
    gpu.logits(&none, &b).expect("capture");
    let before = counters.get();
    gpu.logits(&none, &b).expect("replay");
    assert_eq!(counters.get().since(&before).graph_launches, 1);
    let before = counters.get();
    logits_of(&mut gpu, &b, &step).expect("adapter step");
    let eager = counters.get().since(&before);
    assert_eq!(eager.graph_launches, 0);
    assert_eq!(eager.launches, base.launches + 2 * layers);
}

/// A step naming an empty slot is refused before anything runs; an
/// executor that never saw an adapter holds no LoRA state.
#[test]
fn a_step_naming_an_empty_slot_is_refused() {
    let c = config(64);
    let (_, mut gpu) = pair(64, DType::F32);
    let b = two_prompts_four_rows(c.vocab_size);
    let before = gpu.device().launches;
    let step = LoraStep {
        slots: vec![slot(1, &adapter(&c, 1, 2, &[LoraTarget::Q])), None],
        seq_slot: vec![Some(1), None],
    };
    let err = logits_of(&mut gpu, &b, &step).expect_err("empty slot");
    assert!(matches!(err, ExecError::InvalidBatch(_)), "{err}");
    assert_eq!(gpu.device().launches, before);
    assert_eq!(gpu.lora_fills(), 0);
    assert!(gpu.supports_lora());
}
