//! CPU attention's inner loops alone (`engine::model::attn_rows`: the
//! scores of a query row's keys and the probability-weighted sum of their
//! values), in nanoseconds per key and KV head, on one thread, next to a
//! plain read of the same bytes:
//! - `stream`: a batch-32 decode step's keys, laid out as the paged pool
//!   holds them (blocks of 16 slots, each slot the KV heads' values side by
//!   side), a separate pool region per layer: every key comes from memory
//!   once, as in the engine. 120 layers' regions (f16: 540 MiB of keys and
//!   values): past the L3 of a large server socket (260 MB on an Emerald
//!   Rapids host, where SmolLM2's 30 layers, 136 MiB, partly stayed in it
//!   and streamed faster than the plain read of DRAM);
//! - `L2`: the same work on one sequence's keys over and over (~150 KB of
//!   f16: the loops' compute-bound speed).
//!
//! SmolLM2's shape by default (3 KV heads of 64 values, 3 query heads
//! each, 32 sequences of 192 keys); f16 keys and values, or
//! f32 with `--kv-f32`. The AVX2 and 512-bit loops alternate where the CPU
//! has both. Medians of 7 rounds.
//!
//! Run: `cargo run --release -p engine --example attn_bench [-- --kv-f32] [--keys=N]`
//! To compare two builds, copy one binary aside and run both alternately.

use engine::model::attn_rows::{prefetch_first, scores, weighted_sum};
use engine::model::kv_cache::KvElem;
use std::time::Instant;

const ROUNDS: usize = 7;
const HEAD_DIM: usize = 64;
const KV_HEADS: usize = 3;
const GROUP: usize = 3;
/// Layer regions of the pools (4x SmolLM2's 30 layers: see the module doc).
const LAYERS: usize = 120;
const SEQS: usize = 32;
const BLOCK: usize = 16;

/// Which loops a timing runs.
#[derive(Clone, Copy, PartialEq)]
enum Loops {
    Scores,
    Sums,
    Both,
}

/// Milliseconds for one pass over the layers (each its own region of the
/// pools), or with `hot` the same work on sequence 0's keys of layer 0
/// every time (~150 KB of f16: L2).
fn pass<E: KvElem>(k: &[E], v: &[E], keys: usize, hot: bool, wide: bool, loops: Loops) -> f64 {
    let te = KV_HEADS * HEAD_DIM;
    let blocks = keys.div_ceil(BLOCK);
    let layer_elems = SEQS * blocks * BLOCK * te;
    let q = vec![0.01f32; GROUP * HEAD_DIM];
    let mut p = vec![1.0 / keys as f32; GROUP * keys];
    let mut o = vec![0f32; GROUP * HEAD_DIM];
    let mut addrs = Vec::with_capacity(keys);
    let t = Instant::now();
    for l in 0..LAYERS {
        let base = if hot { 0 } else { l * layer_elems };
        for seq in 0..SEQS {
            let s = if hot { 0 } else { seq };
            for h in 0..KV_HEADS {
                addrs.clear();
                addrs.extend((0..keys).map(|j| {
                    let slot = (s * blocks + j / BLOCK) * BLOCK + j % BLOCK;
                    base + slot * te + h * HEAD_DIM
                }));
                if loops != Loops::Sums {
                    scores(&q, HEAD_DIM, k, &addrs, 0.125, &mut p, wide);
                }
                if loops == Loops::Both {
                    // As the engine does between the two (around its softmax).
                    prefetch_first(v, &addrs, HEAD_DIM);
                }
                if loops != Loops::Scores {
                    weighted_sum(&p, v, &addrs, HEAD_DIM, &mut o, wide);
                }
            }
        }
    }
    std::hint::black_box(&o);
    t.elapsed().as_secs_f64() * 1e3
}

/// GB/s of a plain one-thread read of `data`.
fn plain_read<E: KvElem>(data: &[E]) -> f64 {
    let bytes = std::mem::size_of_val(data);
    // SAFETY: `E` is f16 or f32 (sealed, plain data): any bytes read as
    // u64 words are valid; the length covers whole words only.
    let words = unsafe { std::slice::from_raw_parts(data.as_ptr().cast::<u64>(), bytes / 8) };
    let t = Instant::now();
    let sum = words.iter().fold(0u64, |a, &x| a.wrapping_add(x));
    std::hint::black_box(sum);
    bytes as f64 / t.elapsed().as_secs_f64() / 1e9
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn run<E: KvElem>(keys: usize) {
    let n = LAYERS * SEQS * keys.div_ceil(BLOCK) * BLOCK * KV_HEADS * HEAD_DIM;
    let fill = |m: usize| {
        let src: Vec<f32> = (0..n).map(|i| (i % m) as f32 * 0.01).collect();
        let mut dst = vec![E::default(); n];
        E::store(&mut dst, &src);
        dst
    };
    let (k, v) = (fill(7), fill(5));
    let visits = (LAYERS * SEQS * KV_HEADS * keys) as f64;
    // Bytes a visit reads: one key and one value of HEAD_DIM elements.
    let visit_bytes = 2 * HEAD_DIM * std::mem::size_of::<E>();
    let wides: Vec<bool> =
        if engine::model::quant::Isa::best() == engine::model::quant::Isa::Avx512Vnni {
            vec![false, true]
        } else {
            vec![false]
        };
    println!(
        "{} KV, {LAYERS} layers x {SEQS} sequences x {KV_HEADS} KV heads x {keys} keys \
         ({GROUP} query heads each, head dim {HEAD_DIM}); ns per key and KV head, one thread, \
         median of {ROUNDS}",
        if std::mem::size_of::<E>() == 2 {
            "f16"
        } else {
            "f32"
        }
    );
    // This VM's bandwidth swings within minutes: read before and after.
    let read = || median((0..ROUNDS).map(|_| plain_read(&k)).collect::<Vec<_>>());
    let show_read = |when: &str, gbs: f64| {
        println!(
            "plain read of the keys ({:.0} MiB), {when}: {gbs:.1} GB/s = {:.1} ns per key and value",
            (n * std::mem::size_of::<E>()) as f64 / (1 << 20) as f64,
            visit_bytes as f64 / gbs
        )
    };
    show_read("before", read());
    for (loops, name) in [
        (Loops::Scores, "scores"),
        (Loops::Sums, "weighted sums"),
        (Loops::Both, "both"),
    ] {
        for hot in [false, true] {
            let mut ms = vec![Vec::new(); wides.len()];
            for _ in 0..ROUNDS {
                for (i, &wide) in wides.iter().enumerate() {
                    ms[i].push(pass(&k, &v, keys, hot, wide, loops));
                }
            }
            let cols: Vec<String> = wides
                .iter()
                .zip(ms)
                .map(|(&wide, m)| {
                    let ns = median(m) * 1e6 / visits;
                    let what = if wide { "512-bit" } else { "AVX2" };
                    format!("{what} {ns:5.1}")
                })
                .collect();
            let place = if hot { "L2" } else { "stream" };
            println!("{name:<14} {place:<6} {}", cols.join("  "));
        }
    }
    show_read("after", read());
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let keys: usize = args
        .iter()
        .find_map(|a| a.strip_prefix("--keys="))
        .map_or(192, |v| v.parse().expect("--keys=N takes a key count"));
    if args.iter().any(|a| a == "--kv-f32") {
        run::<f32>(keys);
    } else {
        run::<half::f16>(keys);
    }
}
