//! Load-time benchmarks: the default SmolLM2-135M Q4_1 GGUF (dequantized to
//! f32 on all cores), the same weights read a layer at a time through
//! `WeightReader` (each dropped after reading, as a streaming consumer does),
//! and the tokenizer alone. Needs `cargo xtask fetch-model`.

use criterion::{criterion_group, criterion_main, Criterion};
use model_loader::{load_config_and_tokenizer, load_model, paths, WeightReader, WeightTypes};

fn bench_load(c: &mut Criterion) {
    let path = paths::default_model_path();
    if !path.is_file() {
        eprintln!("{} missing: run `cargo xtask fetch-model`", path.display());
        return;
    }
    let mut g = c.benchmark_group("load");
    g.sample_size(10);
    g.bench_function("smollm2_q4_1_gguf_full", |b| {
        b.iter(|| load_model(&path).expect("load"))
    });
    g.bench_function("smollm2_q4_1_reader_layer_by_layer_f32", |b| {
        b.iter(|| {
            let r = WeightReader::open(&path).expect("open");
            let mut bytes = r.token_embedding(WeightTypes::F32).expect("embd").nbytes();
            for i in 0..r.num_layers() {
                bytes += r.layer(i, WeightTypes::F32).expect("layer").wq.nbytes();
            }
            bytes
        })
    });
    g.bench_function("smollm2_config_and_tokenizer", |b| {
        b.iter(|| load_config_and_tokenizer(&path).expect("load"))
    });
    g.finish();
}

criterion_group!(benches, bench_load);
criterion_main!(benches);
