//! Decode tokens/s of SmolLM2-135M (the default GGUF, weights kept
//! quantized as served) at batch 32 with a context of 128: the base model,
//! every row on one LoRA adapter, and four different adapters mixed (8 rows
//! each), side by side in one run, the three rounds interleaved so that
//! machine noise hits them alike. Adapters: rank 16 on all seven targets
//! (the worst case `--max-lora-rank 16` allows), seeded random.
//!
//! `cargo bench -p engine --bench lora` (needs `cargo xtask fetch-model`).

use engine::executor::{ContiguousLayout, ForwardBatch};
use engine::model::cpu_backend::CpuLora;
use engine::model::lora::kernel::{Prepared, RowGroups};
use engine::model::lora::slots::LoraSlots;
use engine::model::lora::LoraId;
use engine::model::{CpuModel, KvCache};
use model_loader::lora::{load_lora, LoraTarget};
use model_loader::lora_gen::{write_random_peft, RandomLora};
use model_loader::WeightTypes;
use std::sync::Arc;
use std::time::Instant;

const BLOCK: usize = 16;
const CTX: usize = 128;
const SEQS: usize = 32;
const ROUNDS: usize = 5;
const STEPS: usize = 10;

fn main() {
    let path = model_loader::paths::default_model_path();
    let m = match model_loader::load_model_with(&path, WeightTypes::File) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("SKIP lora bench: cannot load {} ({e})", path.display());
            return;
        }
    };
    let config = m.config.clone();
    let model = CpuModel::new(m.config, m.weights).expect("model");
    let tmp = tempfile::tempdir().expect("tempdir");
    let adapters: Vec<_> = (0..4u32)
        .map(|i| {
            let dir = tmp.path().join(format!("a{i}"));
            let spec = RandomLora {
                seed: 100 + u64::from(i),
                rank: 16,
                alpha: 16.0,
                targets: LoraTarget::ALL.to_vec(),
                zero: false,
                b_magnitude: 0.02,
                use_rslora: false,
            };
            write_random_peft(&dir, &config, &spec).expect("adapter");
            (
                LoraId(i + 1),
                Arc::new(load_lora(&dir, &config, 16).expect("load")),
            )
        })
        .collect();
    let layout = ContiguousLayout {
        block_size: BLOCK,
        blocks_per_seq: CTX.div_ceil(BLOCK) + 1,
    };
    let mut cache = KvCache::new(model.kv_geometry(SEQS * layout.blocks_per_seq, BLOCK));
    let mut pre = ForwardBatch::default();
    let mut batch = ForwardBatch::default();
    for s in 0..SEQS {
        let prompt: Vec<u32> = (0..CTX as u32)
            .map(|i| (i * 7919 + s as u32 * 104_729) % 49152)
            .collect();
        layout.push(&mut pre, s, 0, &prompt, false);
        layout.push(&mut batch, s, CTX, &[(s as u32 * 13) % 49152], true);
    }
    model.forward(&pre, &mut cache).expect("prefill");
    // The three modes' slot tables and row groups.
    let one: Vec<_> = (0..SEQS).map(|_| Some(adapters[0].clone())).collect();
    let four: Vec<_> = (0..SEQS).map(|s| Some(adapters[s % 4].clone())).collect();
    let mode = |seqs: &[Option<(LoraId, Arc<model_loader::lora::LoraAdapter>)>]| {
        let mut slots = LoraSlots::new(4);
        let step = slots.place(seqs).expect("place");
        let prepared: Vec<Option<Arc<Prepared>>> = step
            .slots
            .iter()
            .map(|s| s.as_ref().map(|e| Arc::new(Prepared::new(&e.adapter))))
            .collect();
        let groups = RowGroups::new(&step, batch.seqs.iter().map(|s| s.query_len));
        (prepared, groups)
    };
    let (p1, g1) = mode(&one);
    let (p4, g4) = mode(&four);
    let mut secs = [0.0f64; 3];
    for _ in 0..ROUNDS {
        for (i, lora) in [
            None,
            Some(CpuLora {
                prepared: &p1,
                groups: &g1,
            }),
            Some(CpuLora {
                prepared: &p4,
                groups: &g4,
            }),
        ]
        .into_iter()
        .enumerate()
        {
            let t = Instant::now();
            for _ in 0..STEPS {
                model
                    .forward_lora(&batch, &mut cache, lora)
                    .expect("forward");
            }
            secs[i] += t.elapsed().as_secs_f64();
        }
    }
    let tokens = (ROUNDS * STEPS * SEQS) as f64;
    let base = tokens / secs[0];
    println!(
        "decode batch {SEQS}, ctx {CTX}, SmolLM2-135M quantized, {} threads",
        engine::model::par::threads()
    );
    for (name, s) in [
        "base only",
        "1 adapter (r16, all targets)",
        "4 adapters mixed",
    ]
    .iter()
    .zip(secs)
    {
        let tps = tokens / s;
        println!(
            "{name:32} {tps:8.1} tok/s  ({:+.1}% vs base)",
            (tps / base - 1.0) * 100.0
        );
    }
}
