//! CUDA graphs on the emulated device: a replay equals the eager launches
//! (also after the inputs changed in place), and an executor with graphs
//! gives the same greedy ids as one with `--enforce-eager` while sequences
//! join and leave across several buckets with padding.

use super::super::device::{Device, Gemm, ThreadsFor};
use super::*;
use crate::executor::test_run::Run;
use gpu_kernels::{launch as geom, KernelArg};

/// `c = rms_norm(x) * w` then `c2 = c W^T`, on `rows` rows of `h`: one
/// launch and one GEMM, as a graph body.
#[test]
fn a_replayed_graph_equals_the_eager_launches_after_inputs_change() {
    let (rows, h, n) = (3usize, 32usize, 5usize);
    let mut dev = EmuDevice::new();
    let norm = dev.kernel("rms_norm_f32").expect("kernel");
    let alloc = |dev: &mut EmuDevice, elems: usize| dev.alloc(4 * elems).expect("alloc").ptr;
    let (x, w, y, mat, out) = (
        alloc(&mut dev, rows * h),
        alloc(&mut dev, h),
        alloc(&mut dev, rows * h),
        alloc(&mut dev, n * h),
        alloc(&mut dev, rows * n),
    );
    let f = |v: Vec<f32>| DType::F32.encode(&v);
    dev.upload(w, &f((0..h).map(|i| 0.5 + i as f32 / 64.0).collect()))
        .expect("w");
    dev.upload(
        mat,
        &f((0..n * h).map(|i| (i as f32 * 0.37).sin()).collect()),
    )
    .expect("W");
    let input = |salt: f32| f((0..rows * h).map(|i| (i as f32 * salt).cos()).collect());
    let cfg = geom::per_row(rows as u32, dev.threads(ThreadsFor::Rows));
    let args = [
        y.arg(),
        x.arg(),
        w.arg(),
        KernelArg::F32(1e-5),
        KernelArg::U32(h as u32),
    ];
    let g = Gemm {
        m: rows,
        n,
        k: h,
        a: y,
        b: mat,
        c: out,
        ab: DType::F32,
        c_type: DType::F32,
        accumulate: false,
    };
    let body = |dev: &mut EmuDevice| {
        // SAFETY: `x`, `y` hold `rows * h` f32, `w` `h`, `mat` `n * h`, `out`
        // `rows * n`; one block per row.
        unsafe {
            dev.launch(norm, cfg, &args).expect("launch");
            dev.gemm(&g).expect("gemm");
        }
    };
    let read = |dev: &mut EmuDevice| {
        let mut b = vec![0u8; 4 * rows * n];
        dev.download(out, &mut b).expect("download");
        DType::F32.decode(&b)
    };
    let zero = f(vec![0.0; rows * n]);
    // Eager results for two inputs.
    let mut eager = Vec::new();
    for salt in [0.11, 0.73] {
        dev.upload(x, &input(salt)).expect("x");
        body(&mut dev);
        eager.push(read(&mut dev));
    }
    assert_ne!(eager[0], eager[1]);
    // Capture records and runs nothing; copies are refused while capturing.
    dev.upload(out, &zero).expect("zero");
    dev.upload(x, &input(0.11)).expect("x");
    let launches = dev.launches;
    dev.begin_capture().expect("begin");
    body(&mut dev);
    assert!(
        dev.upload(x, &input(0.5)).is_err(),
        "an upload was recorded"
    );
    let graph = dev.end_capture().expect("end");
    assert_eq!(dev.launches, launches, "capture ran a launch");
    assert!(
        read(&mut dev).iter().all(|&v| v == 0.0),
        "capture ran the GEMM"
    );
    // Replays equal the eager steps exactly, before and after an in-place
    // change of the input.
    for (salt, want) in [(0.11, &eager[0]), (0.73, &eager[1])] {
        dev.upload(out, &zero).expect("zero");
        dev.upload(x, &input(salt)).expect("x");
        // SAFETY: every buffer the graph addresses is still allocated.
        unsafe { dev.launch_graph(graph) }.expect("replay");
        assert_eq!(&read(&mut dev), want, "salt {salt}");
    }
    assert_eq!(dev.graph_launches, 2);
    dev.drop_graph(graph).expect("drop");
    // SAFETY: a dropped graph is refused before anything runs.
    assert!(unsafe { dev.launch_graph(graph) }.is_err());
}

/// One running sequence of the schedule below.
struct Seq {
    tokens: Vec<u32>,
    table: Vec<BlockId>,
}

/// A simple block allocator over blocks `0..BLOCKS` (never reused here, so
/// blocks past `next` must stay untouched).
struct Alloc {
    next: u32,
}

impl Alloc {
    fn grow(&mut self, s: &mut Seq, context: usize) {
        while s.table.len() * BS < context {
            s.table.push(BlockId(self.next));
            self.next += 1;
        }
    }
}

/// One step on both executors; each row's greedy token, asserted equal on
/// both (logprobs to rounding: a graph's decode plan may split differently).
fn run_step(
    eager: &mut GpuExecutor<EmuDevice>,
    graphs: &mut GpuExecutor<EmuDevice>,
    b: &ForwardBatch,
) -> Vec<u32> {
    let none = BlockOps::default();
    let want = eager.greedy(&none, b).expect("eager");
    let got = graphs.greedy(&none, b).expect("graph");
    assert_eq!(want.len(), got.len());
    for (i, (w, g)) in want.iter().zip(&got).enumerate() {
        assert_eq!(w.token, g.token, "row {i}");
        assert!(
            (w.logprob - g.logprob).abs() < 1e-4,
            "row {i}: {} vs {}",
            w.logprob,
            g.logprob
        );
    }
    got.iter().map(|r| r.token).collect()
}

fn decode_batch(seqs: &[Seq]) -> ForwardBatch {
    let parts: Vec<Part<'_>> = seqs
        .iter()
        .map(|s| Part {
            ids: &s.tokens[s.tokens.len() - 1..],
            past: s.tokens.len() - 1,
            table: &s.table,
            want: &[0],
        })
        .collect();
    batch(&parts)
}

#[test]
fn graph_decode_gives_the_eager_ids_as_sequences_join_and_leave() {
    let c = config(16);
    let v = c.vocab_size;
    let opts = GpuOptions {
        dtype: DType::F32,
        block_size: BS,
        kv: KvSizing::Blocks {
            gpu: BLOCKS,
            cpu: 0,
        },
    };
    let exec = |eager: bool| {
        GpuExecutor::new(EmuDevice::new(), c.clone(), random_weights(&c, 5), opts)
            .expect("gpu executor")
            .with_cuda_graphs(16, eager)
    };
    let (mut eager, mut graphs) = (exec(true), exec(false));
    let mut alloc = Alloc { next: 0 };
    let mut running: Vec<Seq> = Vec::new();
    // (sequences joining by prefill, indices leaving, decode steps after).
    let schedule: [(usize, &[usize], usize); 5] = [
        (3, &[], 2),     // k = 3: bucket 4, one padding row
        (5, &[], 2),     // k = 8: bucket 8, no padding
        (0, &[1, 4], 2), // k = 6: bucket 8, rows shifted, two padding rows
        (3, &[], 2),     // k = 9: bucket 16, seven padding rows
        (0, &[0], 2),    // k = 8 again: the bucket-8 graph replayed
    ];
    for (round, &(join, leave, decodes)) in schedule.iter().enumerate() {
        for &i in leave.iter().rev() {
            running.remove(i);
        }
        if join > 0 {
            let mut new: Vec<Seq> = (0..join)
                .map(|j| Seq {
                    tokens: ids(3 + (round + j) % 4, (round * 10 + j) as u32, v),
                    table: Vec::new(),
                })
                .collect();
            for s in &mut new {
                alloc.grow(s, s.tokens.len());
            }
            let lasts: Vec<[usize; 1]> = new.iter().map(|s| [s.tokens.len() - 1]).collect();
            let parts: Vec<Part<'_>> = new
                .iter()
                .zip(&lasts)
                .map(|(s, last)| Part {
                    ids: &s.tokens,
                    past: 0,
                    table: &s.table,
                    want: last,
                })
                .collect();
            let first = run_step(&mut eager, &mut graphs, &batch(&parts));
            for (s, t) in new.iter_mut().zip(first) {
                s.tokens.push(t);
            }
            running.extend(new);
        }
        for _ in 0..decodes {
            for s in &mut running {
                let context = s.tokens.len();
                alloc.grow(s, context);
            }
            let next = run_step(&mut eager, &mut graphs, &decode_batch(&running));
            for (s, t) in running.iter_mut().zip(next) {
                s.tokens.push(t);
            }
        }
    }
    let (e, g) = (eager.device(), graphs.device());
    assert_eq!((e.captures, e.graph_launches), (0, 0));
    // Every one of the 10 decode steps either captured its bucket's graph
    // (4, 8 and 16 at least once each; again when a buffer grew) or
    // replayed it.
    assert!(g.captures >= 3, "captures: {}", g.captures);
    assert_eq!(g.captures + g.graph_launches, 10, "decode steps");
    assert!(g.graph_launches >= 4, "replays: {}", g.graph_launches);
    // Padding rows wrote only the padding slots: blocks no sequence ever had
    // are still zero.
    for b in alloc.next as usize..BLOCKS {
        let block = graphs.read_block(b, false).expect("read");
        assert!(
            block.iter().flatten().all(|&x| x == 0.0),
            "block {b} was written"
        );
    }
}

#[test]
fn a_graph_decode_step_is_one_launch_and_uploads_only_what_changed() {
    use super::super::CountingDevice;
    let c = config(64);
    let opts = GpuOptions {
        dtype: DType::Bf16,
        block_size: BS,
        kv: KvSizing::Blocks {
            gpu: BLOCKS,
            cpu: 0,
        },
    };
    let dev = CountingDevice::new(1 << 30);
    let counters = dev.counters();
    let mut gpu =
        GpuExecutor::new(dev, c.clone(), random_weights(&c, 3), opts).expect("gpu executor");
    // Five sequences decoding at `past`, sequence 0's table `blocks0` long.
    let step = |gpu: &mut GpuExecutor<CountingDevice>, past: usize, blocks0: usize| {
        let parts: Vec<(Vec<u32>, Vec<BlockId>)> = (0..5)
            .map(|s| {
                let n = if s == 0 { blocks0 } else { 2 };
                (vec![(s * 7) as u32 + 1], table(n, s as u32))
            })
            .collect();
        let b = batch(
            &parts
                .iter()
                .map(|(ids, t)| Part {
                    ids,
                    past: if t.len() == 3 { past + 3 } else { past },
                    table: t,
                    want: &[0],
                })
                .collect::<Vec<_>>(),
        );
        let before = counters.get();
        let rows = gpu.greedy(&BlockOps::default(), &b).expect("step");
        assert_eq!(rows.len(), 5);
        counters.get().since(&before)
    };
    let first = step(&mut gpu, 4, 2);
    assert_eq!(first.captures, 1, "bucket 8 captured on first use");
    // Same tables, one position on: one graph launch, nothing launched
    // eagerly, one upload of the step words: 8 rows of ids, positions,
    // slots, logits rows and context lengths, 9 query starts (49 words).
    let same = step(&mut gpu, 5, 2);
    assert_eq!(
        (
            same.graph_launches,
            same.launches,
            same.gemms,
            same.captures
        ),
        (1, 0, 0, 0)
    );
    assert_eq!((same.uploads, same.upload_bytes), (1, 49 * 4));
    assert_eq!((same.downloads, same.download_bytes), (1, 5 * 12));
    // Sequence 0 gains a third block (context 9): that one table word goes
    // up too.
    let grown = step(&mut gpu, 5, 3);
    assert_eq!((grown.graph_launches, grown.launches), (1, 0));
    assert_eq!((grown.uploads, grown.upload_bytes), (2, 49 * 4 + 4));
}
