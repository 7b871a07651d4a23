//! `cargo run --release -p model-loader --example load_time -- [PATH] [RUNS] [--stream]`:
//! wall time of `load_model_with(PATH, File | F32)` (default: the SmolLM2
//! GGUF, 3 runs each; min and median printed) and a digest of the loaded
//! weights (every matrix's type, shape and bytes, every norm and bias), so
//! two builds of the loader can be compared for speed and for identical
//! output side by side. The peak resident memory of the process comes last
//! (mapped file pages included).
//!
//! With `--stream` it instead converts the whole model to f32 the way a
//! streaming consumer does, through `WeightReader`: the embedding and head
//! kept quantized and converted 4096 rows at a time, each layer read as f32
//! and dropped (nothing uploaded; one run per process, so the peak is its own).

use std::hash::{Hash, Hasher};
use std::time::Instant;

use model_loader::{load_model_with, LayerWeights, Tensor, Weight, WeightReader, WeightTypes};

fn hash_tensor(h: &mut impl Hasher, t: &Tensor) {
    t.shape.hash(h);
    for v in &t.data {
        v.to_bits().hash(h);
    }
}

fn hash_weight(h: &mut impl Hasher, w: &Weight) {
    match w {
        Weight::F32(t) => {
            0u8.hash(h);
            hash_tensor(h, t);
        }
        Weight::Quantized(q) => {
            q.ty.name().hash(h);
            q.shape.hash(h);
            q.bytes.hash(h);
        }
    }
}

fn hash_layer(h: &mut impl Hasher, l: &LayerWeights<Weight>) {
    for w in [&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down] {
        hash_weight(h, w);
    }
    for t in [&l.attn_norm, &l.ffn_norm] {
        hash_tensor(h, t);
    }
    for t in [&l.bq, &l.bk, &l.bv].into_iter().flatten() {
        hash_tensor(h, t);
    }
    if let Some(g) = &l.gemma {
        for t in [&g.q_norm, &g.k_norm, &g.post_attn_norm, &g.post_ffn_norm] {
            hash_tensor(h, t);
        }
    }
}

fn peak_rss_mib() -> Option<u64> {
    model_loader::memory::status_kib("VmHWM").map(|kib| kib / 1024)
}

/// Every tensor converted to f32 through the reader, in bounded chunks;
/// returns the number of f32 values produced.
fn stream(path: &std::path::Path) -> Result<usize, Box<dyn std::error::Error>> {
    let r = WeightReader::open(path)?;
    let mut n = r.final_norm()?.len();
    let mut chunked = |w: &Weight| -> Result<(), model_loader::LoaderError> {
        let mut buf = vec![0f32; 4096 * w.cols()];
        for start in (0..w.rows()).step_by(4096) {
            let end = (start + 4096).min(w.rows());
            let out = &mut buf[..(end - start) * w.cols()];
            w.to_f32_rows(start..end, out)?;
            n += out.len();
        }
        Ok(())
    };
    chunked(&r.token_embedding(WeightTypes::File)?)?;
    if let Some(head) = r.lm_head(WeightTypes::File)? {
        chunked(&head)?;
    }
    for i in 0..r.num_layers() {
        let l = r.layer(i, WeightTypes::F32)?;
        n += [&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down]
            .iter()
            .map(|w| w.nbytes() / 4)
            .sum::<usize>();
    }
    Ok(n)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let streaming = args.iter().any(|a| a == "--stream");
    let mut args = args.into_iter().filter(|a| a != "--stream");
    let path = args.next().map_or_else(
        model_loader::paths::default_model_path,
        std::path::PathBuf::from,
    );
    let runs: usize = args.next().map_or(Ok(3), |s| s.parse())?;
    println!("{}", path.display());
    if streaming {
        let t = Instant::now();
        let n = stream(&path)?;
        println!(
            "streamed {n} f32 values in {:.3} s, peak RSS {} MiB",
            t.elapsed().as_secs_f64(),
            peak_rss_mib().unwrap_or(0)
        );
        return Ok(());
    }
    for types in [WeightTypes::File, WeightTypes::F32] {
        let mut times = Vec::with_capacity(runs);
        let mut digest = 0u64;
        for run in 0..runs.max(1) {
            let t = Instant::now();
            let m = load_model_with(&path, types)?;
            times.push(t.elapsed().as_secs_f64());
            if run == 0 {
                // Not timed: SipHash with fixed keys, same toolchain on both sides.
                let mut h = std::hash::DefaultHasher::new();
                let w = &m.weights;
                hash_weight(&mut h, &w.token_embedding);
                hash_tensor(&mut h, &w.final_norm);
                if let Some(head) = &w.lm_head {
                    hash_weight(&mut h, head);
                }
                w.layers.iter().for_each(|l| hash_layer(&mut h, l));
                digest = h.finish();
            }
        }
        times.sort_by(f64::total_cmp);
        println!(
            "{types:?}: min {:.3} s, median {:.3} s over {} runs, digest {digest:016x}",
            times[0],
            times[times.len() / 2],
            times.len()
        );
    }
    if let Some(mib) = peak_rss_mib() {
        println!("peak RSS {mib} MiB");
    }
    Ok(())
}
