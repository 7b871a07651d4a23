//! Few-row (decode) kernel speed per weight type, in weight bytes streamed
//! per second, next to the machine's plain read bandwidth:
//! - `L2`: a ~256 KiB matrix multiplied over and over on one thread (the
//!   kernel's compute-bound speed: the bytes come from L2);
//! - `DRAM`: a ~96 MiB matrix (over the L3) on 1 and 2 threads (what a
//!   decode step sees: every layer's weights come from memory once).
//!
//! Batch 1 (`m = 1`) with the default two-level activations, and with `-- --one8`
//! llama.cpp's one-level `Q8_0` activations; `--rows=M` multiplies `M`
//! activation rows at once (a small decode batch, speculative verification
//! rows: each weight byte then serves `M` rows). Medians of 7 rounds.
//!
//! Run: `cargo run --release -p engine --example gemv_bench [-- --one8] [--l2] [--rows=M] [--k=K] [TYPE...]`
//! (`--l2`: only the L2 case, e.g. under `perf stat -e cycles:u`, whose
//! cycle count a loaded machine disturbs less than the wall clock)
//! (types as in GGUF: `Q4_1 Q8_0 ...`; default the types the two default
//! files use). To compare two builds, copy one binary aside and run both
//! alternately.

use engine::model::par;
use engine::model::quant::{matmul, ActPrecision, Isa, QMatrix, QuantizedActs};
use model_loader::quant::quantize;
use model_loader::QuantType;
use std::time::Instant;

const ROUNDS: usize = 7;

/// Threads of the "2 threads" columns (the matmuls' pool is sized once).
const THREADS: usize = 2;

/// `rows x k` matrix of `ty` with about `bytes` bytes, built by repeating a
/// 256-row quantized pattern (quantizing ~100 MB of f32 would take long).
fn matrix(ty: QuantType, k: usize, bytes: usize) -> QMatrix {
    let base_rows = 256;
    let vals: Vec<f32> = (0..base_rows * k)
        .map(|i| {
            let h = (i as u32).wrapping_mul(2_654_435_761) >> 8;
            (h as f32 / (1u32 << 24) as f32 - 0.5) * (0.5 + (i / 32 % 5) as f32 * 0.3)
        })
        .collect();
    let pat = quantize(ty, &vals).expect("whole blocks");
    let rb = pat.len() / base_rows;
    let rows = (bytes / rb).max(base_rows) / base_rows * base_rows;
    let reps = rows / base_rows;
    let mut b = Vec::with_capacity(reps * pat.len());
    for _ in 0..reps {
        b.extend_from_slice(&pat);
    }
    QMatrix {
        ty,
        rows,
        cols: k,
        bytes: b,
    }
}

/// This thread's CPU time in seconds (the wall clock where that is not
/// available): a loaded machine's descheduling does not count.
fn thread_seconds() -> f64 {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        #[repr(C)]
        struct Timespec {
            sec: i64,
            nsec: i64,
        }
        extern "C" {
            fn clock_gettime(clock: i32, tp: *mut Timespec) -> i32;
        }
        const CLOCK_THREAD_CPUTIME_ID: i32 = 3;
        let mut ts = Timespec { sec: 0, nsec: 0 };
        // SAFETY: glibc's clock_gettime writes one timespec (two i64 on
        // x86_64/aarch64 Linux) to the pointer, which is valid and ours.
        if unsafe { clock_gettime(CLOCK_THREAD_CPUTIME_ID, &mut ts) } == 0 {
            return ts.sec as f64 + ts.nsec as f64 * 1e-9;
        }
    }
    static T0: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    T0.get_or_init(Instant::now).elapsed().as_secs_f64()
}

/// Weight GB/s of `m`-row products under each of `isas` on `threads` of
/// the forward pass's pool (1, or all [`THREADS`]; one thread: per CPU
/// second of that thread; two: per wall second), the families alternating
/// round by round; medians.
fn rates(
    w: &QMatrix,
    act: &QuantizedActs,
    isas: &[Isa],
    threads: usize,
    min_bytes: usize,
) -> Vec<f64> {
    let mut out = vec![0f32; act.m * w.rows];
    let iters = (min_bytes / w.bytes.len()).max(1);
    let run = |f: &mut dyn FnMut() -> Vec<f64>| {
        if threads == 1 {
            par::serially(f)
        } else {
            f()
        }
    };
    run(&mut || {
        for &isa in isas {
            matmul(act, w, &mut out, w.rows, false, isa);
        }
        let mut r = vec![Vec::new(); isas.len()];
        for _ in 0..ROUNDS {
            for (i, &isa) in isas.iter().enumerate() {
                let (t, c) = (Instant::now(), thread_seconds());
                for _ in 0..iters {
                    matmul(act, w, &mut out, w.rows, false, isa);
                }
                let secs = if threads == 1 {
                    thread_seconds() - c
                } else {
                    t.elapsed().as_secs_f64()
                };
                r[i].push((w.bytes.len() * iters) as f64 / secs / 1e9);
            }
        }
        r.into_iter()
            .map(|mut v| {
                v.sort_by(f64::total_cmp);
                v[ROUNDS / 2]
            })
            .collect()
    })
}

/// GB/s of summing a 96 MiB array (beyond the L3) split over `threads`:
/// the bandwidth a decode step's weight stream can have at best. Median of
/// [`ROUNDS`].
fn read_bandwidth(threads: usize) -> f64 {
    use rayon::prelude::*;
    let words: usize = (96 << 20) / 8;
    let data: Vec<u64> = (0..words as u64).collect();
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .expect("pool");
    let chunk = words.div_ceil(threads);
    let mut r: Vec<f64> = (0..ROUNDS)
        .map(|_| {
            let t = Instant::now();
            let sum: u64 = pool.install(|| {
                data.par_chunks(chunk)
                    .map(|c| c.iter().fold(0u64, |a, &x| a.wrapping_add(x)))
                    .reduce(|| 0, u64::wrapping_add)
            });
            std::hint::black_box(sum);
            (words * 8) as f64 / t.elapsed().as_secs_f64() / 1e9
        })
        .collect();
    r.sort_by(f64::total_cmp);
    r[ROUNDS / 2]
}

fn main() {
    // The matmuls run on the forward pass's pool (`par`), not on rayon's:
    // size it before its first use; one-thread columns run `serially`.
    assert!(par::set_threads(THREADS), "the pool was sized before main");
    let args: Vec<String> = std::env::args().skip(1).collect();
    let prec = if args.iter().any(|a| a == "--one8") {
        ActPrecision::One8
    } else {
        ActPrecision::Two8
    };
    let l2_only = args.iter().any(|a| a == "--l2");
    let m: usize = args
        .iter()
        .find_map(|a| a.strip_prefix("--rows="))
        .map_or(1, |v| v.parse().expect("--rows=M takes a row count"));
    // The row length (default SmolLM2's: 576, K-quants 1536), rounded up
    // to whole blocks.
    let k_arg: Option<usize> = args
        .iter()
        .find_map(|a| a.strip_prefix("--k="))
        .map(|v| v.parse().expect("--k=K takes a row length"));
    // Every vector family this CPU runs, side by side (`--avx2`: only AVX2).
    let isas: Vec<Isa> = if args.iter().any(|a| a == "--avx2") {
        vec![Isa::Avx2]
    } else {
        Isa::available()
            .into_iter()
            .filter(|&i| i != Isa::Scalar)
            .rev()
            .collect()
    };
    let mut types: Vec<QuantType> = QuantType::ALL
        .into_iter()
        .filter(|t| args.iter().any(|a| a == t.name()))
        .collect();
    if types.is_empty() {
        types = vec![
            QuantType::Q4_1,
            QuantType::Q8_0,
            QuantType::Q5_0,
            QuantType::Q4K,
            QuantType::Q6K,
        ];
    }
    println!(
        "kernels {isas:?} (alternating), activations {prec:?}, batch {m}; weight GB/s, median of {ROUNDS}"
    );
    let show = |v: &[f64]| {
        v.iter()
            .zip(&isas)
            .map(|(r, i)| format!("{i:?} {r:6.1}"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    if !l2_only {
        let (one, two) = (read_bandwidth(1), read_bandwidth(2));
        println!(
            "plain read of 96 MiB (the floor's bandwidth): 1 thread {one:.1} GB/s, 2 threads {two:.1} GB/s"
        );
    }
    for ty in types {
        // K-quants need k % 256 == 0 (SmolLM2's ffn_down: k = 1536).
        let k = k_arg
            .map(|k| k.next_multiple_of(ty.block_len()))
            .unwrap_or(if ty.block_len() == 256 { 1536 } else { 576 });
        let x: Vec<f32> = (0..m * k)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 17.0)
            .collect();
        let act = QuantizedActs::with_precision(&x, m, k, prec);
        let small = matrix(ty, k, 256 << 10);
        let l2 = rates(&small, &act, &isas, 1, 256 << 20);
        if l2_only {
            println!("{:<5} k {k:>4}: L2 1 thread {}", ty.name(), show(&l2));
            continue;
        }
        let big = matrix(ty, k, 96 << 20);
        let d1 = rates(&big, &act, &isas, 1, 256 << 20);
        let d2 = rates(&big, &act, &isas, THREADS, 256 << 20);
        println!(
            "{:<5} k {k:>4}: L2 1 thread {}   DRAM 1 thread {}   DRAM 2 threads {}",
            ty.name(),
            show(&l2),
            show(&d1),
            show(&d2)
        );
    }
}
