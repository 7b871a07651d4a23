//! Quantized weights (the default: activations at two levels, f16 KV
//! cache; then with an f32 KV cache, and with activations at one level)
//! against f32 weights and KV cache on a GGUF (default: SmolLM2-135M Q4_1),
//! side by side in one process: decode tokens/s at batch 1 and 32 (context 192, the
//! mean of llama-batched-bench's `-npp 128 -ntg 128`), prompt-processing
//! tokens/s (one 128-token prompt, and four 512-token prompts in one
//! forward, a chunked-prefill step), and the resident memory each model
//! adds when loaded.
//!
//! The four variants alternate round by round (A, B, A, B, ...) and the median
//! round of each is reported with the ratio, so load from other processes on
//! a shared machine hits both alike. Needs the fetched model
//! (`cargo xtask fetch-model`); says so and exits otherwise.
//!
//! Run: `cargo bench -p engine --bench quant [-- FILE.gguf]`
//!
//! On an AVX-512 machine an `avx2` variant (the default with the AVX2
//! kernels) runs beside the others; `-- --variants default,avx2` runs only
//! the named variants. `PAGED_ENGINE_ISA=avx2` forces a family for the
//! whole process (e.g. with `--profile`).
//!
//! For a profiler: `-- [FILE.gguf] --profile WORK` (WORK: `decode1`,
//! `decode32`, `prefill` or `prefill2048`) loops the default (two-level) model on that one
//! workload for about 20 seconds (`--kv-f32` for an f32 KV cache) and prints its rate, e.g. under
//! `perf record`.

use engine::executor::{ContiguousLayout, ForwardBatch};
use engine::model::quant::ActPrecision;
use engine::model::{CpuModel, KvCache, KvDtype};
use model_loader::WeightTypes;
use std::time::Instant;

const BLOCK: usize = 16;
/// Prompt length of the prefill workload.
const CTX: usize = 128;
/// Context of the decode workloads: the mean context of
/// `llama-batched-bench -npp 128 -ntg 128` (decoding from 129 to 256), so
/// the two read the same amount of KV cache per token.
const DECODE_CTX: usize = 192;
const ROUNDS: usize = 7;

fn rss_bytes() -> usize {
    model_loader::memory::status_kib("VmRSS").map_or(0, |kib| kib as usize * 1024)
}

/// Returns freed heap pages to the OS (glibc's `malloc_trim`), so resident
/// memory shows what is live. False where there is no glibc.
fn trim_heap() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        extern "C" {
            fn malloc_trim(pad: usize) -> i32;
        }
        // SAFETY: glibc's malloc_trim takes no pointers and only releases
        // free memory; it is safe to call at any time from any thread.
        unsafe { malloc_trim(0) };
        true
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    false
}

fn prompt(seq: usize, n: usize) -> Vec<u32> {
    (0..n as u32)
        .map(|i| (i * 7919 + seq as u32 * 104_729) % 49152)
        .collect()
}

/// A prepared workload: a batch, a cache, and how many tokens one forward is.
struct Work {
    batch: ForwardBatch,
    cache: KvCache,
    tokens: usize,
}

/// One side of the comparison: a model and its KV cache's element type.
struct Variant<'a> {
    name: &'static str,
    model: &'a CpuModel,
    kv: KvDtype,
}

fn decode_work(model: &CpuModel, kv: KvDtype, seqs: usize) -> Work {
    let layout = ContiguousLayout {
        block_size: BLOCK,
        blocks_per_seq: DECODE_CTX.div_ceil(BLOCK) + 1,
    };
    let geom = model.kv_geometry(seqs * layout.blocks_per_seq, BLOCK);
    let mut cache = KvCache::with_dtype(geom, kv);
    let (mut pre, mut batch) = (ForwardBatch::default(), ForwardBatch::default());
    for s in 0..seqs {
        layout.push(&mut pre, s, 0, &prompt(s, DECODE_CTX), false);
        layout.push(&mut batch, s, DECODE_CTX, &[(s as u32 * 13) % 49152], true);
    }
    model.forward(&pre, &mut cache).expect("prefill");
    Work {
        batch,
        cache,
        tokens: seqs,
    }
}

/// `seqs` prompts of `len` tokens in one forward (a chunked-prefill step
/// of `seqs * len` tokens).
fn prefill_work(model: &CpuModel, kv: KvDtype, seqs: usize, len: usize) -> Work {
    let layout = ContiguousLayout {
        block_size: BLOCK,
        blocks_per_seq: len.div_ceil(BLOCK) + 1,
    };
    let cache = KvCache::with_dtype(model.kv_geometry(seqs * layout.blocks_per_seq, BLOCK), kv);
    let mut batch = ForwardBatch::default();
    for s in 0..seqs {
        layout.push(&mut batch, s, 0, &prompt(s, len), true);
    }
    Work {
        batch,
        cache,
        tokens: seqs * len,
    }
}

fn model_forward(model: &CpuModel, w: &mut Work) {
    model.forward(&w.batch, &mut w.cache).expect("forward");
}

/// The value of `--profile WORK`, if given.
fn profile_arg() -> Option<String> {
    arg_value("--profile")
}

/// The argument after `flag`, if given (empty when it is last).
fn arg_value(flag: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    let i = args.iter().position(|a| a == flag)?;
    Some(args.get(i + 1).cloned().unwrap_or_default())
}

/// Tokens/s of `iters` forwards.
fn time(model: &CpuModel, w: &mut Work, iters: usize) -> f64 {
    let t = Instant::now();
    for _ in 0..iters {
        model_forward(model, w);
    }
    (w.tokens * iters) as f64 / t.elapsed().as_secs_f64()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Runs `make`'s workload on every variant, alternating, and prints the
/// medians and their ratios to the first (the default) variant.
fn side_by_side(
    name: &str,
    variants: &[Variant],
    make: impl Fn(&CpuModel, KvDtype) -> Work,
    iters: usize,
) {
    let mut works: Vec<Work> = variants.iter().map(|v| make(v.model, v.kv)).collect();
    for (v, w) in variants.iter().zip(works.iter_mut()) {
        time(v.model, w, 1); // warm-up
    }
    let mut rates = vec![Vec::new(); variants.len()];
    for _ in 0..ROUNDS {
        for (i, r) in rates.iter_mut().enumerate() {
            r.push(time(variants[i].model, &mut works[i], iters));
        }
    }
    let r: Vec<f64> = rates.into_iter().map(median).collect();
    let rates: Vec<String> = variants
        .iter()
        .zip(&r)
        .map(|(v, x)| format!("{} {x:7.1}", v.name))
        .collect();
    let ratios: Vec<String> = variants[1..]
        .iter()
        .zip(&r[1..])
        .map(|(v, x)| format!("/{} {:.2}x", v.name, r[0] / x))
        .collect();
    println!(
        "{name:<16} {} tok/s   {}: {}",
        rates.join("  "),
        variants[0].name,
        ratios.join(" ")
    );
}

fn main() {
    // `cargo bench -p engine --bench quant -- FILE.gguf` (default: SmolLM2 Q4_1).
    let path = std::env::args()
        .skip(1)
        .scan(false, |after_profile, a| {
            let skip = *after_profile;
            *after_profile = a == "--profile" || a == "--variants";
            Some((skip, a))
        })
        .find(|(skip, a)| !skip && !a.starts_with("--"))
        .map(|(_, a)| a)
        .map_or_else(model_loader::paths::default_model_path, Into::into);
    if !path.is_file() {
        println!(
            "quant bench: {} is missing (cargo xtask fetch-model)",
            path.display()
        );
        return;
    }
    let file_size = std::fs::metadata(&path).map_or(0, |m| m.len() as usize);
    let r0 = rss_bytes();
    let q = model_loader::load_model_with(&path, WeightTypes::File).expect("load");
    let r_loaded = rss_bytes();
    let quant = CpuModel::new(q.config, q.weights).expect("model");
    let r_model = rss_bytes();
    drop(q.tokenizer);
    let r_no_tok = rss_bytes();
    let r_trim = trim_heap().then(rss_bytes);
    let r1 = rss_bytes();
    let f = model_loader::load_model(&path).expect("load");
    let float = CpuModel::new(f.config, f.weights).expect("model");
    let r2 = rss_bytes();
    let mut one = quant.clone();
    one.set_act_precision(ActPrecision::One8);
    let mib = |b: usize| b as f64 / (1 << 20) as f64;
    println!(
        "{}: file {:.1} MiB; weights held: quantized {:.1} MiB, float32 {:.1} MiB; \
         resident memory added by loading: quantized {:.1} MiB, float32 {:.1} MiB",
        path.display(),
        mib(file_size),
        mib(quant.matrix_bytes()),
        mib(float.matrix_bytes()),
        mib(r1.saturating_sub(r0)),
        mib(r2.saturating_sub(r1)),
    );
    println!(
        "quantized load, resident memory: after the loader {:.1} MiB, after CpuModel::new \
         (which returns freed heap to the OS) {:.1} MiB, after dropping the tokenizer {:.1} MiB, \
         after malloc_trim again {}",
        mib(r_loaded.saturating_sub(r0)),
        mib(r_model.saturating_sub(r0)),
        mib(r_no_tok.saturating_sub(r0)),
        r_trim.map_or("(not glibc)".into(), |r| format!(
            "{:.1} MiB",
            mib(r.saturating_sub(r0))
        )),
    );
    println!(
        "threads {}, kernels {:?}, {ROUNDS} alternating rounds, medians; quantized activations \
         two-level (8+8 bit) or one-level (llama.cpp's 8 bit), KV cache f16 or f32; \
         default = quantized weights, two-level, f16 KV",
        rayon::current_num_threads(),
        engine::model::quant::Isa::best()
    );
    if let Some(work) = profile_arg() {
        let make: fn(&CpuModel, KvDtype) -> Work = match work.as_str() {
            "decode1" => |m, kv| decode_work(m, kv, 1),
            "decode32" => |m, kv| decode_work(m, kv, 32),
            "prefill" => |m, kv| prefill_work(m, kv, 1, CTX),
            "prefill2048" => |m, kv| prefill_work(m, kv, 4, 512),
            other => {
                println!(
                    "quant bench: unknown --profile {other} (decode1, decode32, prefill, prefill2048)"
                );
                return;
            }
        };
        let kv = if std::env::args().any(|a| a == "--kv-f32") {
            KvDtype::F32
        } else {
            KvDtype::F16
        };
        let mut w = make(&quant, kv);
        time(&quant, &mut w, 1);
        let (t, mut n, mut best) = (Instant::now(), 0, f64::INFINITY);
        while t.elapsed().as_secs_f64() < 20.0 {
            let one = Instant::now();
            model_forward(&quant, &mut w);
            best = best.min(one.elapsed().as_secs_f64());
            n += 1;
        }
        let rate = (w.tokens * n) as f64 / t.elapsed().as_secs_f64();
        // The fastest forward is the least disturbed by other load on a
        // shared machine: compare it for small changes.
        println!(
            "profile {work}: two-level, KV {kv:?}: {rate:.1} tok/s over {n} forwards; \
             fastest forward {:.2} ms ({:.1} tok/s)",
            best * 1e3,
            w.tokens as f64 / best
        );
        return;
    }
    // On an AVX-512 machine the AVX2 kernels run beside the default too.
    let avx2 =
        (engine::model::quant::Isa::best() == engine::model::quant::Isa::Avx512Vnni).then(|| {
            let mut m = quant.clone();
            m.set_isa(engine::model::quant::Isa::Avx2);
            m
        });
    let v = |name, model, kv| Variant { name, model, kv };
    let mut variants = vec![
        v("default", &quant, KvDtype::F16),
        v("kv-f32", &quant, KvDtype::F32),
        v("one-level", &one, KvDtype::F16),
        v("float32", &float, KvDtype::F32),
    ];
    if let Some(m) = &avx2 {
        variants.push(v("avx2", m, KvDtype::F16));
    }
    // `--variants a,b`: only those (names as printed; `default` first).
    if let Some(only) = arg_value("--variants") {
        let only: Vec<&str> = only.split(',').collect();
        variants.retain(|v| only.contains(&v.name));
        if variants.is_empty() {
            println!(
                "quant bench: --variants names none of default, kv-f32, one-level, float32, avx2"
            );
            return;
        }
    }
    side_by_side(
        "decode batch 1",
        &variants,
        |m, kv| decode_work(m, kv, 1),
        20,
    );
    side_by_side(
        "decode batch 32",
        &variants,
        |m, kv| decode_work(m, kv, 32),
        4,
    );
    side_by_side(
        "prefill 1x128",
        &variants,
        |m, kv| prefill_work(m, kv, 1, CTX),
        2,
    );
    side_by_side(
        "prefill 4x512",
        &variants,
        |m, kv| prefill_work(m, kv, 4, 512),
        1,
    );
}
