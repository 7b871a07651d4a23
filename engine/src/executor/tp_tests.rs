//! Tensor parallelism in one process: ranks on threads ([`crate::dist::threads`]),
//! each building its shard through [`build_tp_executor`] exactly as an
//! `mpiexec` rank does, rank 0 driven like any executor.

use crate::dist::threads;
use crate::dist::Collective;
use crate::executor::gpu::{DType, EmuDevice};
use crate::executor::tp::{build_tp_executor, check_agreement, gpu_rank, gpu_shard, run_worker};
use crate::executor::{
    generate_greedy, BlockOps, DeviceKind, ExecError, Executor, ExecutorRequest, ForwardBatch,
    Sampling, SeqSpan, WeightInput,
};
use crate::kv::{BlockCopy, BlockId};
use crate::model::lora::{LoraId, LoraStep, SlotEntry};
use crate::model::test_util::{random_weights, tiny_config};
use crate::model::tp::TpPlan;
use crate::model::{Dims, InMemory};
use model_loader::lora::{LoraAdapter, LoraFormat, LoraLayer, LoraPair};
use model_loader::{ModelConfig, WeightReader, WeightTypes};
use std::sync::Arc;

fn request() -> ExecutorRequest {
    ExecutorRequest {
        device: DeviceKind::Cpu,
        block_size: 4,
        num_gpu_blocks: Some(64),
        cpu_kv_cache_bytes: 0,
        swap_bytes: 0,
        gpu_memory_utilization: 0.9,
        max_num_batched_tokens: 64,
        dtype: DType::F32,
        kv_cache_dtype: None,
        max_num_seqs: 8,
        enforce_eager: false,
        batch_invariant: false,
    }
}

/// Runs `drive` on rank 0 of `world` thread ranks, each rank's executor
/// built by `build`; the other ranks serve until rank 0's executor drops.
fn with_ranks<T>(
    world: usize,
    build: impl Fn(Arc<dyn Collective>) -> Box<dyn Executor> + Sync,
    drive: impl FnOnce(&mut dyn Executor) -> T,
) -> T {
    let mut ranks = threads::group(world).into_iter();
    let zero: Arc<dyn Collective> = Arc::new(ranks.next().expect("rank 0"));
    std::thread::scope(|s| {
        let workers: Vec<_> = ranks
            .map(|r| {
                let build = &build;
                s.spawn(move || {
                    let comm: Arc<dyn Collective> = Arc::new(r);
                    let mut exec = build(Arc::clone(&comm));
                    run_worker(&mut *exec, &*comm)
                })
            })
            .collect();
        let mut exec = build(zero);
        let out = drive(&mut *exec);
        drop(exec);
        for w in workers {
            w.join().expect("worker thread").expect("worker loop");
        }
        out
    })
}

fn tiny(comm: Arc<dyn Collective>, c: &ModelConfig) -> Box<dyn Executor> {
    let input = WeightInput::Memory(InMemory::from(random_weights(c, 7)));
    build_tp_executor(c.clone(), input, &request(), comm)
        .expect("shard")
        .executor
}

/// Two prompts prefilled together (the first step of [`steps`]).
fn steps_prefill() -> ForwardBatch {
    ForwardBatch {
        token_ids: vec![3, 14, 15, 92, 65, 35, 89, 79, 32],
        positions: vec![0, 1, 2, 3, 4, 0, 1, 2, 3],
        slot_mapping: vec![0, 1, 2, 3, 4, 8, 9, 10, 11],
        seqs: vec![
            SeqSpan {
                query_len: 5,
                context_len: 5,
                block_table: vec![BlockId(0), BlockId(1)],
            },
            SeqSpan {
                query_len: 4,
                context_len: 4,
                block_table: vec![BlockId(2)],
            },
        ],
        logits_rows: vec![4, 8],
    }
}

/// Two prompts prefilled together, then a decode step after a
/// copy-on-write block copy: every logit row of every step.
fn steps(exec: &mut dyn Executor) -> Vec<Vec<f32>> {
    let prefill = steps_prefill();
    let decode = ForwardBatch {
        token_ids: vec![46, 26],
        positions: vec![5, 4],
        slot_mapping: vec![5, 12],
        seqs: vec![
            SeqSpan {
                query_len: 1,
                context_len: 6,
                block_table: vec![BlockId(0), BlockId(1)],
            },
            SeqSpan {
                query_len: 1,
                context_len: 5,
                block_table: vec![BlockId(2), BlockId(3)],
            },
        ],
        logits_rows: vec![0, 1],
    };
    let copy = BlockOps {
        copies: vec![BlockCopy {
            src: BlockId(2),
            dst: BlockId(5),
        }],
        ..BlockOps::default()
    };
    [(BlockOps::default(), prefill), (copy, decode)]
        .iter()
        .map(|(ops, b)| {
            let l = exec
                .execute(ops, b, &Sampling::Host)
                .and_then(|o| o.into_logits())
                .expect("step");
            assert_eq!((l.rows, l.vocab), (b.logits_rows.len(), 97));
            l.data
        })
        .collect()
}

#[test]
fn sharded_logits_equal_the_whole_model() {
    for bias in [false, true] {
        let c = tiny_config(bias, None);
        let want = with_ranks(1, |comm| tiny(comm, &c), steps);
        for world in [2, 3] {
            let got = with_ranks(world, |comm| tiny(comm, &c), steps);
            for (g, w) in got.iter().flatten().zip(want.iter().flatten()) {
                assert!((g - w).abs() < 1e-4, "tp {world} bias {bias}: {g} vs {w}");
            }
        }
    }
}

#[test]
fn ranks_that_disagree_all_fail_with_the_difference() {
    let ranks = threads::group(2);
    let results: Vec<Result<(), ExecError>> = std::thread::scope(|s| {
        let handles: Vec<_> = ranks
            .iter()
            .map(|r| {
                let flags = if r.rank() == 0 {
                    "model.gguf, block_size: 16, max_num_seqs: 8"
                } else {
                    "model.gguf, block_size: 32, max_num_seqs: 8"
                };
                s.spawn(move || check_agreement(r, flags))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("rank"))
            .collect()
    });
    let e1 = results[1].as_ref().expect_err("rank 1 differs").to_string();
    assert!(
        e1.ends_with("started with block_size: 32, rank 0 with block_size: 16"),
        "{e1}"
    );
    assert!(results[0].is_err(), "rank 0 fails too");
    let same = threads::group(2);
    std::thread::scope(|s| {
        for r in &same {
            s.spawn(move || check_agreement(r, "same").expect("agree"));
        }
    });
}

/// Greedy sampling on the device is refused with the reason (the host
/// draws under tensor parallelism).
fn refuses_device_sampling(exec: &mut dyn Executor) {
    let e = exec
        .execute(
            &BlockOps::default(),
            &ForwardBatch::default(),
            &Sampling::Greedy,
        )
        .expect_err("greedy on the device");
    assert!(e.to_string().contains("host draws"), "{e}");
}

/// CPU ranks take adapters (see `sharded_adapters_give_the_whole_models_logits`);
/// device sampling is refused before anything is sent.
#[test]
fn device_sampling_is_refused_before_any_broadcast() {
    let c = tiny_config(false, None);
    with_ranks(
        2,
        |comm| tiny(comm, &c),
        |exec| {
            assert!(exec.supports_lora());
            refuses_device_sampling(exec);
            // The ranks still serve a step afterwards (nothing was sent).
            steps(exec);
        },
    );
}

/// The default model, quantized (Q4_1 blocks kept) and as f32: greedy
/// tokens over 2 and 3 ranks equal one rank's.
#[test]
fn smollm2_greedy_tokens_match_one_rank() {
    let path = model_loader::paths::default_model_path();
    if !path.is_file() {
        eprintln!("SKIP: {} missing (cargo xtask fetch-model)", path.display());
        return;
    }
    let reader = WeightReader::open(&path).expect("open");
    let prompt: Vec<u32> = vec![1, 9690, 314, 253, 5354, 30, 6121, 523, 1535, 282, 4195, 30];
    for types in [WeightTypes::File, WeightTypes::F32] {
        let build = |comm: Arc<dyn Collective>| {
            let input = WeightInput::File {
                reader: &reader,
                cpu_types: types,
            };
            let mut req = request();
            req.block_size = 16;
            build_tp_executor(reader.config().clone(), input, &req, comm)
                .expect("shard")
                .executor
        };
        let run = |exec: &mut dyn Executor| {
            generate_greedy(exec, &prompt, 12, &[], |_| {}).expect("generate")
        };
        let want = with_ranks(1, build, run);
        for world in [2, 3] {
            assert_eq!(with_ranks(world, build, run), want, "{types:?} tp {world}");
        }
    }
}

/// Rank `comm.rank()` of the tiny model on the emulated GPU, as
/// `build_tp_executor` builds a CUDA rank (the all-reduce staged through
/// the host collective: the emulator has no NCCL).
fn tiny_gpu(comm: Arc<dyn Collective>, c: &ModelConfig, dtype: DType) -> Box<dyn Executor> {
    let plan = Arc::new(TpPlan::new(&Dims::of(c).expect("dims"), comm.world()).expect("plan"));
    let input = WeightInput::Memory(InMemory::from(random_weights(c, 7)));
    let mut req = request();
    req.device = DeviceKind::Cuda;
    req.dtype = dtype;
    let built = gpu_rank(
        EmuDevice::new(),
        c.clone(),
        input,
        &req,
        (comm, plan),
        "threads",
    )
    .expect("gpu shard");
    assert!(
        built.description.contains("tensor parallel size"),
        "{}",
        built.description
    );
    built.executor
}

/// The GPU executor's shards (vocabulary-split embedding and head,
/// row-parallel o/down projections with their all-reduces, KV heads
/// replicated over 3 ranks) give the whole model's logits: the CPU
/// executor's on one rank, to f32 rounding (bf16: its tolerance).
#[test]
fn sharded_gpu_logits_equal_the_whole_model() {
    for bias in [false, true] {
        let c = tiny_config(bias, None);
        let want = with_ranks(1, |comm| tiny(comm, &c), steps);
        // bf16 keeps 8 significant bits: after 2 layers the logits may
        // drift by a few of those steps relative to their scale (the GPU
        // tests' bound), whatever the number of ranks.
        for (dtype, tol) in [(DType::F32, 1e-4), (DType::Bf16, 0.05)] {
            for world in [1, 2, 3] {
                let got = with_ranks(world, |comm| tiny_gpu(comm, &c, dtype), steps);
                assert_eq!(got.len(), want.len());
                for (g, w) in got.iter().zip(&want) {
                    let scale = w.iter().fold(1f32, |a, v| a.max(v.abs()));
                    for (g, w) in g.iter().zip(w) {
                        assert!(
                            (g - w).abs() < tol * scale,
                            "gpu tp {world} {dtype:?} bias {bias}: {g} vs {w}"
                        );
                    }
                }
            }
        }
    }
}

/// Ranks holding different numbers of KV heads need different bytes per
/// block; they agree on the fewest blocks, so block ids mean the same on
/// every rank. And the GPU ranks answer with logits only.
#[test]
fn gpu_ranks_agree_on_pool_sizes_and_refuse_device_sampling() {
    let mut c = tiny_config(false, None);
    c.num_attention_heads = 6;
    c.num_key_value_heads = 3;
    let plan = Arc::new(TpPlan::new(&Dims::of(&c).expect("dims"), 2).expect("plan"));
    assert_ne!(plan.ranks[0].kv_heads.len(), plan.ranks[1].kv_heads.len());
    let ranks = threads::group(2);
    let counts: Vec<(usize, usize)> = std::thread::scope(|s| {
        let handles: Vec<_> = ranks
            .into_iter()
            .map(|r| {
                let (c, plan) = (&c, Arc::clone(&plan));
                s.spawn(move || {
                    let comm: Arc<dyn Collective> = Arc::new(r);
                    let input = WeightInput::Memory(InMemory::from(random_weights(c, 7)));
                    let mut req = request();
                    req.device = DeviceKind::Cuda;
                    req.swap_bytes = 1 << 20;
                    let mut exec = gpu_rank(
                        EmuDevice::new(),
                        c.clone(),
                        input,
                        &req,
                        (Arc::clone(&comm), plan),
                        "threads",
                    )
                    .expect("gpu shard")
                    .executor;
                    let blocks = exec.num_blocks();
                    if comm.rank() == 0 {
                        assert!(!exec.capabilities().greedy && !exec.capabilities().sampled);
                        assert!(exec.supports_lora());
                        refuses_device_sampling(&mut *exec);
                    } else {
                        // The rank itself refuses too, before any
                        // collective (nothing is waiting to meet it).
                        let e = exec
                            .execute(&BlockOps::default(), &steps_prefill(), &Sampling::Greedy)
                            .expect_err("greedy on a rank");
                        assert!(e.to_string().contains("host draws"), "{e}");
                        run_worker(&mut *exec, &*comm).expect("worker");
                    }
                    blocks
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("rank"))
            .collect()
    });
    assert_eq!(counts[0], counts[1], "pool sizes differ between ranks");
    // The swap pool is 1 MiB over the larger shard's bytes per block.
    let big = plan
        .ranks
        .iter()
        .map(|r| r.kv_heads.len())
        .max()
        .expect("ranks");
    let per_block = 2 * c.num_hidden_layers * 4 * big * c.head_dim * 4;
    assert_eq!(counts[0], (64, (1 << 20) / per_block));
}

/// A decode step of the two sequences of [`steps_prefill`]: `tokens` at
/// positions `a` (sequence 0, blocks 0-1) and `b` (sequence 1, blocks
/// 2-3), both in their second block (block size 4: positions 4-7).
fn two_decodes(tokens: [u32; 2], a: usize, b: usize) -> ForwardBatch {
    ForwardBatch {
        token_ids: tokens.to_vec(),
        positions: vec![a, b],
        slot_mapping: vec![a, 8 + b],
        seqs: vec![
            SeqSpan {
                query_len: 1,
                context_len: a + 1,
                block_table: vec![BlockId(0), BlockId(1)],
            },
            SeqSpan {
                query_len: 1,
                context_len: b + 1,
                block_table: vec![BlockId(2), BlockId(3)],
            },
        ],
        logits_rows: vec![0, 1],
    }
}

/// Two sequences prefilled, then 3 decode steps of both (the same graph
/// bucket each time): every logit row of every step.
fn decode_steps(exec: &mut dyn Executor) -> Vec<Vec<f32>> {
    let mut out = vec![
        exec.execute(&BlockOps::default(), &steps_prefill(), &Sampling::Host)
            .and_then(|o| o.into_logits())
            .expect("prefill")
            .data,
    ];
    for i in 0..3 {
        let decode = two_decodes([40 + i as u32, 60 + i as u32], 5 + i, 4 + i);
        let l = exec
            .execute(&BlockOps::default(), &decode, &Sampling::Host)
            .and_then(|o| o.into_logits())
            .expect("decode");
        assert_eq!((l.rows, l.vocab), (2, 97));
        out.push(l.data);
    }
    out
}

/// With a device collective (the emulator's stands for NCCL) the decode
/// steps run as captured graphs with the all-reduces inside, replayed on
/// every rank; the logits equal the host-staged ranks' (which run eager)
/// and the whole model's on the CPU.
#[test]
fn gpu_ranks_with_a_device_all_reduce_replay_graphs_and_match() {
    let c = tiny_config(true, None);
    let want = with_ranks(1, |comm| tiny(comm, &c), decode_steps);
    let plan_of = |world| Arc::new(TpPlan::new(&Dims::of(&c).expect("dims"), world).expect("plan"));
    let mut req = request();
    req.device = DeviceKind::Cuda;
    for world in [2, 3] {
        let staged = with_ranks(world, |comm| tiny_gpu(comm, &c, DType::F32), decode_steps);
        let ranks = threads::group(world);
        let (got, replays) = std::thread::scope(|s| {
            let mut ranks = ranks.into_iter();
            let zero: Arc<dyn Collective> = Arc::new(ranks.next().expect("rank 0"));
            let workers: Vec<_> = ranks
                .map(|r| {
                    let (c, req, plan) = (&c, &req, plan_of(world));
                    s.spawn(move || {
                        let comm: Arc<dyn Collective> = Arc::new(r);
                        let dev = EmuDevice::new().with_collective(Arc::clone(&comm));
                        let input = WeightInput::Memory(InMemory::from(random_weights(c, 7)));
                        let mut exec =
                            gpu_shard(dev, c.clone(), input, req, (Arc::clone(&comm), plan))
                                .expect("gpu shard");
                        run_worker(&mut exec, &*comm).expect("worker");
                        exec.device().graph_launches
                    })
                })
                .collect();
            let dev = EmuDevice::new().with_collective(Arc::clone(&zero));
            let input = WeightInput::Memory(InMemory::from(random_weights(&c, 7)));
            let mut exec = gpu_rank(
                dev,
                c.clone(),
                input,
                &req,
                (zero, plan_of(world)),
                "emulated",
            )
            .expect("rank 0")
            .executor;
            let got = decode_steps(&mut *exec);
            drop(exec);
            let replays: Vec<usize> = workers
                .into_iter()
                .map(|w| w.join().expect("worker thread"))
                .collect();
            (got, replays)
        });
        // The first decode step runs eager and captures; the other two
        // replay the graph.
        assert!(
            replays.iter().all(|&n| n == 2),
            "graph replays per rank: {replays:?}"
        );
        for (step, ((g, s), w)) in got.iter().zip(&staged).zip(&want).enumerate() {
            for ((g, s), w) in g.iter().zip(s).zip(w) {
                assert!(
                    (g - w).abs() < 1e-4,
                    "tp {world} step {step}: {g} vs {w} (cpu)"
                );
                assert!(
                    (g - s).abs() < 1e-4,
                    "tp {world} step {step}: {g} vs {s} (staged)"
                );
            }
        }
    }
}

/// Builds a rank's executor from its collectives.
type Build<'a> = dyn Fn(Arc<dyn Collective>) -> Box<dyn Executor> + Sync + 'a;

/// A random adapter of `rank` on every target of every layer of `c`.
fn random_adapter(c: &ModelConfig, seed: u64, rank: usize) -> LoraAdapter {
    use rand::{Rng, SeedableRng};
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let (h, hd, i) = (c.hidden_size, c.head_dim, c.intermediate_size);
    let (q, kv) = (c.num_attention_heads * hd, c.num_key_value_heads * hd);
    let mut rand = |n: usize| -> Vec<f32> { (0..n).map(|_| rng.gen_range(-0.3..0.3)).collect() };
    let shapes = [(q, h), (kv, h), (kv, h), (h, q), (i, h), (i, h), (h, i)];
    let layers = (0..c.num_hidden_layers)
        .map(|_| {
            let mut l = LoraLayer::default();
            for (pair, &(out, inp)) in l.pairs.iter_mut().zip(&shapes) {
                *pair = Some(LoraPair {
                    a: rand(rank * inp),
                    b: rand(out * rank),
                });
            }
            l
        })
        .collect();
    LoraAdapter {
        format: LoraFormat::Peft,
        rank,
        alpha: rank as f32,
        scale: 1.0,
        base_model: None,
        layers,
    }
}

/// The prefill and decodes of [`decode_steps`] with adapters: two in the
/// slots, then slot 0 refilled by a third (sent to the ranks then, the
/// first dropped), a step with none, and one with the base model beside an
/// adapter.
fn lora_steps(exec: &mut dyn Executor, c: &ModelConfig) -> Vec<Vec<f32>> {
    let a: Vec<Arc<LoraAdapter>> = [(1, 4), (2, 8), (3, 2)]
        .iter()
        .map(|&(seed, r)| Arc::new(random_adapter(c, seed, r)))
        .collect();
    let slot = |i: usize| {
        Some(SlotEntry {
            id: LoraId(i as u32 + 10),
            adapter: Arc::clone(&a[i]),
        })
    };
    let steps = [
        (vec![slot(0), slot(1)], vec![Some(0), Some(1)]),
        (vec![slot(2), slot(1)], vec![Some(1), Some(0)]),
        (vec![], vec![]),
        (vec![slot(2), slot(1)], vec![None, Some(0)]),
    ];
    let mut out = Vec::new();
    for (i, (slots, seq_slot)) in steps.into_iter().enumerate() {
        let batch = match i {
            0 => steps_prefill(),
            i => two_decodes([20 + i as u32, 30 + i as u32], 4 + i, 3 + i),
        };
        let lora = LoraStep { slots, seq_slot };
        let l = exec
            .execute_lora(&BlockOps::default(), &batch, &lora, &Sampling::Host)
            .and_then(|o| o.into_logits())
            .expect("step with adapters");
        out.push(l.data);
    }
    out
}

/// LoRA under tensor parallelism: each rank holds its slice of every
/// adapter (B's rows for q/k/v and gate/up, A's columns for o and down),
/// adapters reach the ranks once and follow the slot table; the logits
/// over 2 and 3 CPU ranks and 1-3 emulated GPU ranks equal one CPU rank's,
/// and differ from the base model's.
#[test]
fn sharded_adapters_give_the_whole_models_logits() {
    for bias in [false, true] {
        let c = tiny_config(bias, None);
        let want = with_ranks(1, |comm| tiny(comm, &c), |e| lora_steps(e, &c));
        let base = with_ranks(1, |comm| tiny(comm, &c), decode_steps);
        let moved = want[0]
            .iter()
            .zip(&base[0])
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(moved > 1e-2, "the adapters change nothing ({moved})");
        let cpu = |comm: Arc<dyn Collective>| tiny(comm, &c);
        let gpu = |comm: Arc<dyn Collective>| tiny_gpu(comm, &c, DType::F32);
        let runs: [(&str, usize, &Build<'_>); 5] = [
            ("cpu", 2, &cpu),
            ("cpu", 3, &cpu),
            ("gpu", 1, &gpu),
            ("gpu", 2, &gpu),
            ("gpu", 3, &gpu),
        ];
        for (kind, world, build) in runs {
            let got = with_ranks(world, build, |e| lora_steps(e, &c));
            for (step, (g, w)) in got.iter().zip(&want).enumerate() {
                for (g, w) in g.iter().zip(w) {
                    assert!(
                        (g - w).abs() < 1e-4,
                        "{kind} tp {world} bias {bias} step {step}: {g} vs {w}"
                    );
                }
            }
        }
    }
}
