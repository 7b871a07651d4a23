//! The GPU executor on the emulated device against the CPU executor: the same
//! batches (prefill, chunked prefill over a cached prefix, decode through v1
//! and split-K v2, mixed), the same block operations, the same errors.
//! In f32 the two must agree to rounding; in bf16 to bf16 tolerance.

use super::{DType, EmuDevice, GpuError, GpuExecutor, GpuOptions, KvSizing};
use crate::executor::test_run::Run;
use crate::executor::{
    BlockOps, BuildError, CpuExecutor, ExecError, Executor, ForwardBatch, SeqSpan,
};
use crate::kv::{BlockCopy, BlockId};
use crate::model::test_util::{random_weights, tiny_config};
use crate::model::{CpuModel, Kv, LayerKv};
use model_loader::ModelConfig;

mod graphs;
mod lora;

const BS: usize = 4;
const BLOCKS: usize = 200;
const CPU_BLOCKS: usize = 6;

/// Head size 64 (SmolLM2's), GQA 4:1; and the 16-wide tiny config.
fn config(head_dim: usize) -> ModelConfig {
    let mut c = tiny_config(false, None);
    if head_dim == 64 {
        c.hidden_size = 128;
        c.num_attention_heads = 4;
        c.num_key_value_heads = 1;
        c.head_dim = 64;
        c.max_position_embeddings = 1024;
    }
    c
}

fn pair(head_dim: usize, dtype: DType) -> (CpuExecutor, GpuExecutor<EmuDevice>) {
    pair_of(config(head_dim), dtype)
}

fn pair_of(c: ModelConfig, dtype: DType) -> (CpuExecutor, GpuExecutor<EmuDevice>) {
    let model = CpuModel::new(c.clone(), random_weights(&c, 11)).expect("model");
    let opts = GpuOptions {
        dtype,
        block_size: BS,
        kv: KvSizing::Blocks {
            gpu: BLOCKS,
            cpu: CPU_BLOCKS,
        },
    };
    let gpu = GpuExecutor::new(EmuDevice::new(), c.clone(), random_weights(&c, 11), opts)
        .expect("gpu executor");
    let cpu = CpuExecutor::new(model, BLOCKS, CPU_BLOCKS, BS).expect("cpu executor");
    (cpu, gpu)
}

/// One sequence's tokens for a step: `ids` at positions `past..past + len`
/// over `table`, logits wanted for the rows in `want`.
struct Part<'a> {
    ids: &'a [u32],
    past: usize,
    table: &'a [BlockId],
    want: &'a [usize],
}

fn batch(parts: &[Part<'_>]) -> ForwardBatch {
    let mut b = ForwardBatch::default();
    for p in parts {
        let start = b.token_ids.len();
        for (i, &id) in p.ids.iter().enumerate() {
            let pos = p.past + i;
            b.token_ids.push(id);
            b.positions.push(pos);
            b.slot_mapping
                .push(p.table[pos / BS].0 as usize * BS + pos % BS);
        }
        b.seqs.push(SeqSpan {
            query_len: p.ids.len(),
            context_len: p.past + p.ids.len(),
            block_table: p.table.to_vec(),
        });
        b.logits_rows.extend(p.want.iter().map(|r| start + r));
    }
    b
}

/// A shuffled block table of `n` blocks starting from `salt`.
fn table(n: usize, salt: u32) -> Vec<BlockId> {
    (0..n as u32)
        .map(|i| BlockId((i * 37 + salt * 11) % BLOCKS as u32))
        .collect()
}

fn ids(n: usize, salt: u32, vocab: usize) -> Vec<u32> {
    (0..n as u32)
        .map(|i| (i * 7 + salt * 13 + 3) % vocab as u32)
        .collect()
}

/// Runs `b` on both; returns the largest absolute logit difference and the
/// largest absolute logit.
fn step(
    cpu: &mut CpuExecutor,
    gpu: &mut GpuExecutor<EmuDevice>,
    ops: &BlockOps,
    b: &ForwardBatch,
) -> (f32, f32) {
    let want = cpu.logits(ops, b).expect("cpu step");
    let got = gpu.logits(ops, b).expect("gpu step");
    assert_eq!((got.rows, got.vocab), (want.rows, want.vocab));
    assert!(got.data.iter().all(|v| v.is_finite()), "non-finite logits");
    let diff = got
        .data
        .iter()
        .zip(&want.data)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f32::max);
    let scale = want.data.iter().map(|v| v.abs()).fold(0.0, f32::max);
    (diff, scale)
}

/// The K/V of a CPU pool layer (the f32 test models keep f32 pools).
fn f32_kv(layer: &LayerKv) -> &Kv<f32> {
    match layer {
        LayerKv::F32(kv) => kv,
        LayerKv::F16(_) => panic!("f32 model, f32 pool"),
    }
}

/// Every block of the device pool (and the swap pool) equals the CPU's.
fn pools_equal(cpu: &CpuExecutor, gpu: &mut GpuExecutor<EmuDevice>, tol: f32, blocks: &[usize]) {
    for &b in blocks {
        let got = gpu.read_block(b, false).expect("read block");
        for (i, part) in got.iter().enumerate() {
            let lk = f32_kv(cpu.device_pool().layer(i / 2));
            let src = if i % 2 == 0 { &lk.k } else { &lk.v };
            let e = cpu.device_pool().geometry().block_elems();
            let want = &src[b * e..(b + 1) * e];
            let d = part
                .iter()
                .zip(want)
                .map(|(a, w)| (a - w).abs())
                .fold(0.0, f32::max);
            assert!(d <= tol, "block {b} layer {} kv {}: diff {d}", i / 2, i % 2);
        }
    }
}

/// Prefill of two sequences, chunked prefill of one over its cached prefix,
/// decode of all (v1), and a mixed batch, with f32 and bf16 storage.
fn mixed_steps(head_dim: usize, dtype: DType) -> Vec<(f32, f32)> {
    mixed_steps_of(config(head_dim), dtype)
}

fn mixed_steps_of(c: ModelConfig, dtype: DType) -> Vec<(f32, f32)> {
    let v = c.vocab_size;
    let (mut cpu, mut gpu) = pair_of(c, dtype);
    let none = BlockOps::default();
    let (ta, tb, tc) = (table(8, 1), table(8, 2), table(8, 3));
    let (a, b, c) = (ids(9, 1, v), ids(13, 2, v), ids(11, 3, v));
    let out = vec![
        // Prefill a (all rows) and b (last row).
        step(
            &mut cpu,
            &mut gpu,
            &none,
            &batch(&[
                Part {
                    ids: &a[..7],
                    past: 0,
                    table: &ta,
                    want: &[0, 3, 6],
                },
                Part {
                    ids: &b,
                    past: 0,
                    table: &tb,
                    want: &[12],
                },
            ]),
        ),
        // Chunked prefill of c: 5 tokens, then 6 over the cached 5 (crossing blocks).
        step(
            &mut cpu,
            &mut gpu,
            &none,
            &batch(&[Part {
                ids: &c[..5],
                past: 0,
                table: &tc,
                want: &[4],
            }]),
        ),
        step(
            &mut cpu,
            &mut gpu,
            &none,
            &batch(&[Part {
                ids: &c[5..],
                past: 5,
                table: &tc,
                want: &[0, 5],
            }]),
        ),
        // Decode all three (single-pass decode kernel).
        step(
            &mut cpu,
            &mut gpu,
            &none,
            &batch(&[
                Part {
                    ids: &a[7..8],
                    past: 7,
                    table: &ta,
                    want: &[0],
                },
                Part {
                    ids: &[5],
                    past: 13,
                    table: &tb,
                    want: &[0],
                },
                Part {
                    ids: &[9],
                    past: 11,
                    table: &tc,
                    want: &[0],
                },
            ]),
        ),
        // Mixed: a decodes, b decodes.
        step(
            &mut cpu,
            &mut gpu,
            &none,
            &batch(&[
                Part {
                    ids: &a[8..9],
                    past: 8,
                    table: &ta,
                    want: &[0],
                },
                Part {
                    ids: &[6, 7, 8],
                    past: 14,
                    table: &tb,
                    want: &[1, 2],
                },
            ]),
        ),
    ];
    let used: Vec<usize> = [&ta, &tb, &tc]
        .iter()
        .flat_map(|t| t[..5].iter().map(|b| b.0 as usize))
        .collect();
    let tol = if dtype == DType::F32 { 1e-4 } else { 0.05 };
    pools_equal(&cpu, &mut gpu, tol, &used);
    out
}

#[test]
fn f32_matches_the_cpu_executor_on_mixed_steps() {
    for hd in [16, 64] {
        for (i, (diff, scale)) in mixed_steps(hd, DType::F32).into_iter().enumerate() {
            assert!(scale > 0.5, "degenerate logits");
            assert!(
                diff < 1e-3,
                "head_dim {hd} step {i}: logits differ by {diff}"
            );
        }
    }
}

#[test]
fn qwen2_qkv_biases_match_the_cpu_executor() {
    // The tiny config with attention biases (random, non-zero) on q, k and v.
    let c = tiny_config(true, None);
    for (i, (diff, scale)) in mixed_steps_of(c, DType::F32).into_iter().enumerate() {
        assert!(scale > 0.5, "degenerate logits");
        assert!(diff < 1e-3, "step {i}: logits differ by {diff}");
    }
}

#[test]
fn bf16_stays_within_bf16_tolerance_of_the_cpu() {
    for (i, (diff, scale)) in mixed_steps(64, DType::Bf16).into_iter().enumerate() {
        // bf16 keeps 8 significant bits; after 2 layers the logits may drift
        // by a few of those steps relative to their scale, never more.
        assert!(
            diff < 0.05 * scale.max(1.0),
            "step {i}: logits differ by {diff} (scale {scale})"
        );
    }
}

#[test]
fn long_decode_uses_split_k_and_matches() {
    // 600 cached tokens (written straight into both pools: a 600-token prefill
    // is slow on the emulator), then one decode: two partitions of 512 and few
    // heads -> the split-K v2 + reduce path.
    let (mut cpu, mut gpu) = pair(64, DType::F32);
    let t = table(151, 4);
    fill_both(&mut cpu, &mut gpu, BLOCKS, |l, kv, b, i| {
        ((l * 7 + kv * 3 + b * 13 + i * 5) as f32 * 0.618).sin()
    });
    let none = BlockOps::default();
    let before = gpu.device().launches;
    let (d, scale) = step(
        &mut cpu,
        &mut gpu,
        &none,
        &batch(&[Part {
            ids: &[1],
            past: 600,
            table: &t,
            want: &[0],
        }]),
    );
    assert!(
        scale > 0.5 && d < 1e-3,
        "split-K decode at 601: {d} (scale {scale})"
    );
    // embedding, 2 layers x (2 norms, fused rotary + cache write, silu, v2 + reduce), gather,
    // final norm.
    assert_eq!(gpu.device().launches - before, 1 + 2 * 6 + 2);
}

/// Writes `value(layer, kv, block, index)` into blocks `0..blocks` of both
/// executors' device pools.
fn fill_both(
    cpu: &mut CpuExecutor,
    gpu: &mut GpuExecutor<EmuDevice>,
    blocks: usize,
    value: impl Fn(usize, usize, usize, usize) -> f32,
) {
    let g = cpu.device_pool().geometry();
    let e = g.block_elems();
    for l in 0..g.num_layers {
        for kv in 0..2 {
            for b in 0..blocks {
                let vals: Vec<f32> = (0..e).map(|i| value(l, kv, b, i)).collect();
                let LayerKv::F32(lk) = cpu.device_pool_mut().layer_mut(l) else {
                    panic!("f32 model, f32 pool");
                };
                let dst = if kv == 0 { &mut lk.k } else { &mut lk.v };
                dst[b * e..(b + 1) * e].copy_from_slice(&vals);
                gpu.write_block(l, kv, b, &vals).expect("write block");
            }
        }
    }
}

/// Distinct values per (layer, K/V, block, index), exact in f32.
fn distinct(l: usize, kv: usize, b: usize, i: usize) -> f32 {
    (l * 1000 + kv * 500 + b * 10) as f32 + i as f32 / 64.0
}

#[test]
fn block_operations_move_the_same_bytes_as_on_the_cpu() {
    let (mut cpu, mut gpu) = pair(16, DType::F32);
    fill_both(&mut cpu, &mut gpu, 12, distinct);
    let cp = |s: u32, d: u32| BlockCopy {
        src: BlockId(s),
        dst: BlockId(d),
    };
    let ops = BlockOps {
        swap_out: vec![cp(1, 0), cp(2, 5)],
        swap_in: vec![cp(0, 7), cp(5, 8)],
        copies: vec![cp(3, 9), cp(4, 10), cp(3, 11)],
    };
    let empty = ForwardBatch::default();
    cpu.logits(&ops, &empty).expect("cpu ops");
    gpu.logits(&ops, &empty).expect("gpu ops");
    pools_equal(&cpu, &mut gpu, 0.0, &(0..12).collect::<Vec<_>>());
    for b in [0usize, 5] {
        let got = gpu.read_block(b, true).expect("host block");
        let e = cpu.cpu_pool().geometry().block_elems();
        for (i, part) in got.iter().enumerate() {
            let lk = f32_kv(cpu.cpu_pool().layer(i / 2));
            let src = if i % 2 == 0 { &lk.k } else { &lk.v };
            assert_eq!(part.as_slice(), &src[b * e..(b + 1) * e], "host block {b}");
        }
    }
    // Swapped in where copied: 7 holds what 1 held, 9 and 11 what 3 held.
    let seven = gpu.read_block(7, false).expect("block");
    let one_on_cpu = &f32_kv(cpu.device_pool().layer(0)).k;
    let e = cpu.device_pool().geometry().block_elems();
    assert_eq!(seven[0].as_slice(), &one_on_cpu[7 * e..8 * e]);
    assert_eq!(seven[0][0], 10.0, "block 7 should hold block 1's keys");
}

#[test]
fn a_bad_block_id_moves_nothing() {
    let (mut cpu, mut gpu) = pair(16, DType::F32);
    fill_both(&mut cpu, &mut gpu, 4, distinct);
    let before = gpu.read_block(2, false).expect("block");
    let ops = BlockOps {
        swap_out: vec![],
        swap_in: vec![],
        copies: vec![
            BlockCopy {
                src: BlockId(0),
                dst: BlockId(2),
            },
            BlockCopy {
                src: BlockId(1),
                dst: BlockId(BLOCKS as u32),
            },
        ],
    };
    let err = gpu.logits(&ops, &ForwardBatch::default()).unwrap_err();
    assert!(matches!(err, ExecError::BlockOutOfRange(BlockId(b)) if b == BLOCKS as u32));
    assert_eq!(gpu.read_block(2, false).expect("block"), before);
    let swap = BlockOps {
        swap_out: vec![BlockCopy {
            src: BlockId(0),
            dst: BlockId(CPU_BLOCKS as u32),
        }],
        ..BlockOps::default()
    };
    assert!(gpu.logits(&swap, &ForwardBatch::default()).is_err());
}

#[test]
fn an_invalid_batch_is_refused_before_any_launch() {
    let (_, mut gpu) = pair(16, DType::F32);
    let v = config(16).vocab_size;
    let t = table(2, 1);
    let mut b = batch(&[Part {
        ids: &[1, 2, 3],
        past: 0,
        table: &t,
        want: &[2],
    }]);
    b.token_ids[1] = v as u32;
    let before = gpu.device().launches;
    assert!(matches!(
        gpu.logits(&BlockOps::default(), &b),
        Err(ExecError::InvalidBatch(_))
    ));
    let mut b2 = batch(&[Part {
        ids: &[1, 2, 3],
        past: 0,
        table: &t,
        want: &[2],
    }]);
    b2.slot_mapping[0] += 1;
    assert!(matches!(
        gpu.logits(&BlockOps::default(), &b2),
        Err(ExecError::InvalidBatch(_))
    ));
    assert_eq!(gpu.device().launches, before);
}

#[test]
fn unsupported_models_and_sizes_are_typed_errors() {
    let opts = GpuOptions {
        dtype: DType::F32,
        block_size: BS,
        kv: KvSizing::Blocks { gpu: 4, cpu: 0 },
    };
    let mut c = config(16);
    c.head_dim = 8;
    c.hidden_size = 32;
    let w = random_weights(&c, 1);
    assert!(matches!(
        GpuExecutor::new(EmuDevice::new(), c.clone(), w, opts),
        Err(BuildError::Exec(ExecError::Gpu(GpuError::Unsupported(_))))
    ));
    let c = config(16);
    let util = GpuOptions {
        kv: KvSizing::Utilization {
            fraction: 0.9,
            swap_bytes: 0,
            max_num_batched_tokens: 16,
        },
        ..opts
    };
    // The emulator cannot report memory: sizing by utilization must say so.
    let e = GpuExecutor::new(EmuDevice::new(), c.clone(), random_weights(&c, 1), util)
        .err()
        .expect("refused");
    assert!(
        matches!(
            e,
            BuildError::Exec(ExecError::Gpu(GpuError::Unsupported(_)))
        ),
        "{e}"
    );
}

#[test]
fn utilization_sizing_follows_vllms_formula() {
    use super::blocks_for_fraction;
    // 80 GiB total, 70 GiB free after the profile, 0.9: 62 GiB for blocks.
    let gib = 1usize << 30;
    let n = blocks_for_fraction((70 * gib, 80 * gib), 0.9, gib).expect("blocks");
    assert_eq!(n, 62);
    assert!(matches!(
        blocks_for_fraction((5 * gib, 80 * gib), 0.9, gib),
        Err(GpuError::OutOfMemory { .. })
    ));
    assert!(blocks_for_fraction((70 * gib, 80 * gib), 1.5, gib).is_err());
}

#[test]
fn greedy_rows_on_the_device_equal_the_cpu_sampler() {
    use crate::sampler::Sampler;
    let (mut cpu, mut gpu) = pair(64, DType::F32);
    let b = two_prompts_four_rows(config(64).vocab_size);
    let none = BlockOps::default();
    let logits = cpu.logits(&none, &b).expect("cpu step");
    let rows = gpu
        .greedy(&none, &b)
        .expect("the GPU executor reduces greedy rows");
    assert_eq!(rows.len(), 4);
    for (i, r) in rows.iter().enumerate() {
        let want = Sampler.greedy(logits.row(i));
        assert_eq!(r.token, want.token, "row {i}");
        assert!(
            (r.logprob - want.logprob).abs() < 1e-3,
            "row {i}: logprob {} vs {}",
            r.logprob,
            want.logprob
        );
    }
    // The CPU executor declares no device path and refuses one.
    assert!(!cpu.capabilities().greedy);
    assert!(cpu.greedy(&none, &b).is_err());
}

#[test]
fn a_greedy_step_downloads_twelve_bytes_per_row_not_the_vocabulary() {
    let c = config(64);
    let (mut gpu, counters, b) = counting_five_decode_rows(&c, false);
    let none = BlockOps::default();
    let before = counters.get();
    gpu.greedy(&none, &b).expect("greedy step");
    let greedy = counters.get().since(&before);
    assert_eq!((greedy.downloads, greedy.download_bytes), (1, 5 * 12));
    let before = counters.get();
    gpu.logits(&none, &b).expect("logits step");
    let full = counters.get().since(&before);
    assert_eq!(full.download_bytes, (5 * c.vocab_size * 4) as u64);
    // The greedy step is the logits step plus one reduction launch.
    assert_eq!(greedy.launches, full.launches + 1);
    assert_eq!(greedy.gemms, full.gemms);
    // q/k/v as one GEMM over the fused weight: per layer qkv, o, gate_up and
    // down, then the LM head.
    assert_eq!(full.gemms, (4 * c.num_hidden_layers + 1) as u64);
}

/// Draws with every device parameter, on the device and by the CPU sampler
/// from the CPU executor's logits of the same batch: same tokens (the
/// logits agree to rounding, far from these rows' race margins), logprobs
/// and top logprobs equal to rounding.
#[test]
fn sampled_rows_on_the_device_equal_the_cpu_sampler() {
    use crate::sampler::device::{DeviceDraws, DeviceRow};
    use crate::sampler::{sample_row, SamplingParams, SeqContext};
    let (mut cpu, mut gpu) = pair(64, DType::F32);
    let b = two_prompts_four_rows(config(64).vocab_size);
    let params = [
        SamplingParams {
            logprobs: Some(3),
            ..SamplingParams::default()
        },
        SamplingParams {
            temperature: 0.8,
            top_p: 0.95,
            ..SamplingParams::default()
        },
        SamplingParams {
            temperature: 1.5,
            top_k: Some(5),
            min_p: 0.01,
            logprobs: Some(20),
            ..SamplingParams::default()
        },
        SamplingParams {
            temperature: 1.0,
            ..SamplingParams::default()
        },
    ];
    let rows: Vec<DeviceRow> = params
        .iter()
        .enumerate()
        .map(|(i, p)| DeviceRow::of(p, 1234 + i as u64, i % 2, 3 * i))
        .collect();
    let none = BlockOps::default();
    let logits = cpu.logits(&none, &b).expect("cpu step");
    let got = gpu
        .sampled(&none, &b, &DeviceDraws::plain(rows.clone()))
        .expect("the GPU executor samples on the device")
        .rows;
    assert_eq!(got.len(), 4);
    for (i, (p, r)) in params.iter().zip(&rows).enumerate() {
        let tokens = vec![1u32; 1 + r.step];
        let ctx = SeqContext {
            params: p,
            tokens: &tokens,
            prompt_len: 1,
            seed: r.seed,
            seq_index: r.seq_index,
            stop_ids: &[],
        };
        let want = sample_row(logits.row(i), &ctx);
        assert_eq!(got[i].token, want.token, "row {i}");
        assert!((got[i].logprob - want.logprob).abs() < 1e-3, "row {i}");
        let ids_of = |t: &[(u32, f32)]| t.iter().map(|x| x.0).collect::<Vec<_>>();
        assert_eq!(ids_of(&got[i].top_logprobs), ids_of(&want.top_logprobs));
    }
    // A row count that does not match the logits rows is refused.
    assert!(gpu
        .sampled(&none, &b, &DeviceDraws::plain(rows[..3].to_vec()))
        .is_err());
    // The CPU executor declares no device path and refuses one.
    assert!(!cpu.capabilities().sampled);
    assert!(cpu
        .sampled(&none, &b, &DeviceDraws::plain(rows.clone()))
        .is_err());
    // A mixed step: rows 1 and 3 come back as logits (the CPU's, to
    // rounding), row 2 is biased on the device; rows 0 and 2 are drawn there.
    let mut mixed = DeviceDraws {
        host_rows: vec![1, 3],
        ..DeviceDraws::default()
    };
    let bias = crate::sampler::device::Processing {
        slot: None,
        repetition: 1.0,
        frequency: 0.0,
        presence: 0.0,
        bias: vec![(5, 60.0)],
        suppress: Vec::new(),
    };
    for (i, r) in rows.iter().enumerate() {
        mixed.push(*r, (i == 2).then(|| bias.clone()));
    }
    let out = gpu.sampled(&none, &b, &mixed).expect("mixed step");
    let host = out.logits.expect("host rows' logits");
    assert_eq!((host.rows, out.host_rows), (2, vec![1, 3]));
    for (k, r) in [1, 3].into_iter().enumerate() {
        let worst = host
            .row(k)
            .iter()
            .zip(logits.row(r))
            .map(|(g, c)| (g - c).abs())
            .fold(0f32, f32::max);
        assert!(worst < 1e-3, "host row {r}: off by {worst}");
    }
    assert_eq!(out.rows[0].token, got[0].token);
    // The bias of +60 decides row 2's draw, and its logprob sees it.
    assert_eq!(out.rows[2].token, 5);
    assert!(out.rows[2].logprob > -1e-3, "{:?}", out.rows[2]);
}

/// A mixed step downloads the host rows' logits and every row's draw, in
/// one download.
#[test]
fn a_mixed_step_downloads_only_its_host_rows() {
    use crate::sampler::device::{DeviceDraws, DeviceRow};
    use crate::sampler::SamplingParams;
    let c = config(64);
    let (mut gpu, counters, b) = counting_five_decode_rows(&c, true);
    let row = DeviceRow::of(&SamplingParams::default(), 1, 0, 0);
    let draws = DeviceDraws {
        rows: vec![row; 5],
        host_rows: vec![0, 4],
        ..DeviceDraws::default()
    };
    let none = BlockOps::default();
    gpu.logits(&none, &b).expect("warm-up step");
    let before = counters.get();
    gpu.sampled(&none, &b, &draws).expect("mixed step");
    let step = counters.get().since(&before);
    assert_eq!(
        (step.downloads, step.download_bytes),
        (1, (2 * c.vocab_size * 4 + 5 * 2 * 4) as u64)
    );
    // A host row that is not a row is refused before anything runs.
    let bad = DeviceDraws {
        host_rows: vec![5],
        ..draws
    };
    assert!(gpu.sampled(&none, &b, &bad).is_err());
}

#[test]
fn a_sampled_step_downloads_its_draws_not_the_vocabulary() {
    use crate::sampler::device::{DeviceDraws, DeviceRow};
    use crate::sampler::SamplingParams;
    let c = config(64);
    // Eager, so that the launch and upload counts below compare like with
    // like; the graph path is checked at the end.
    let (mut gpu, counters, b) = counting_five_decode_rows(&c, true);
    let p = SamplingParams {
        temperature: 0.8,
        top_p: 0.95,
        logprobs: Some(2),
        ..SamplingParams::default()
    };
    let rows: Vec<DeviceRow> = (0..5).map(|i| DeviceRow::of(&p, 9, 0, i)).collect();
    let none = BlockOps::default();
    // A first step uploads the block tables (the persistent batch then
    // sends only what changes): both measured steps below start warm.
    gpu.logits(&none, &b).expect("warm-up step");
    let before = counters.get();
    gpu.sampled(&none, &b, &DeviceDraws::plain(rows.clone()))
        .expect("sampled step");
    let sampled = counters.get().since(&before);
    // token, logprob and two (token, logprob) pairs per row.
    assert_eq!((sampled.downloads, sampled.download_bytes), (1, 5 * 6 * 4));
    let before = counters.get();
    gpu.logits(&none, &b).expect("logits step");
    let full = counters.get().since(&before);
    assert_eq!(sampled.launches, full.launches + 1);
    // The step's uploads plus the parameter words (10 per row).
    assert_eq!(sampled.uploads, full.uploads + 1);
    assert_eq!(sampled.upload_bytes, full.upload_bytes + 5 * 10 * 4);
    // Through a CUDA graph (decode step padded to bucket 8) the step still
    // downloads only the 5 real rows' draws, captured or replayed.
    let (mut graphed, counters, _) = counting_five_decode_rows(&c, false);
    for _ in 0..2 {
        let before = counters.get();
        graphed
            .sampled(&none, &b, &DeviceDraws::plain(rows.clone()))
            .expect("sampled graph step");
        let step = counters.get().since(&before);
        assert_eq!((step.downloads, step.download_bytes), (1, 5 * 6 * 4));
    }
    assert!(
        counters.get().graph_launches >= 1,
        "the replay used the graph"
    );
}

/// A bf16 GPU executor on a [`super::CountingDevice`] (CUDA graphs unless
/// `eager`), its counters, and a batch of five sequences decoding one token
/// each at position 4.
fn counting_five_decode_rows(
    c: &ModelConfig,
    eager: bool,
) -> (
    GpuExecutor<super::CountingDevice>,
    super::CountersHandle,
    ForwardBatch,
) {
    let opts = GpuOptions {
        dtype: DType::Bf16,
        block_size: BS,
        kv: KvSizing::Blocks {
            gpu: BLOCKS,
            cpu: 0,
        },
    };
    let dev = super::CountingDevice::new(1 << 30);
    let counters = dev.counters();
    let gpu = GpuExecutor::new(dev, c.clone(), random_weights(c, 3), opts)
        .expect("gpu executor")
        .with_cuda_graphs(8, eager);
    let parts: Vec<(Vec<u32>, Vec<BlockId>)> = (0..5)
        .map(|s| (vec![(s * 7) as u32 + 1], table(2, s as u32)))
        .collect();
    let b = batch(
        &parts
            .iter()
            .map(|(ids, t)| Part {
                ids,
                past: 4,
                table: t,
                want: &[0],
            })
            .collect::<Vec<_>>(),
    );
    (gpu, counters, b)
}

/// Two prompts (9 and 13 tokens) with four logits rows: positions 0, 4 and
/// 8 of the first, the last of the second.
fn two_prompts_four_rows(vocab: usize) -> ForwardBatch {
    let (ta, tb) = (table(8, 1), table(8, 2));
    let (a, b) = (ids(9, 1, vocab), ids(13, 2, vocab));
    batch(&[
        Part {
            ids: &a,
            past: 0,
            table: &ta,
            want: &[0, 4, 8],
        },
        Part {
            ids: &b,
            past: 0,
            table: &tb,
            want: &[12],
        },
    ])
}
