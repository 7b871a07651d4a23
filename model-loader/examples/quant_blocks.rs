//! Writes, as JSON on stdout, test inputs and the blocks our encoders make of
//! them for every GGUF type; `tests/fixtures/quant_gguf_reference.py` adds
//! the `gguf` Python package's dequantization of those blocks and saves the
//! fixture `tests/fixtures/quant_gguf.json` that `tests/quant_gguf.rs` reads.
//!
//! Run: `cargo run -p model-loader --example quant_blocks > /tmp/blocks.json`

use model_loader::dequant::encode;
use model_loader::gguf::GgmlType;

/// 512 deterministic values: signed with magnitudes varying per 16, then
/// positive-only, with a run of zeros and an outlier (covers the min/offset
/// paths, the zero-scale path and sign handling).
fn input() -> Vec<f32> {
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 40) as f32 / (1u64 << 24) as f32
    };
    let mut v = Vec::with_capacity(512);
    for i in 0..256 {
        let mag = 0.01 + (i / 16) as f32 * 0.3;
        v.push((next() * 2.0 - 1.0) * mag);
    }
    for i in 0..256 {
        v.push(match i {
            64..96 => 0.0,
            200 => 9.5,
            _ => next() * 0.7 + 0.05,
        });
    }
    v
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let x = input();
    let types = [
        "F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K",
        "Q5_K", "Q6_K", "Q8_K",
    ];
    let mut entries = Vec::new();
    for id in 0..40u32 {
        let ty = GgmlType::from_id(id);
        if !types.contains(&ty.name()) {
            continue;
        }
        let bytes = encode(ty, &x, ty.name())?;
        let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        entries.push(format!(
            "\"{}\": {{\"id\": {id}, \"blocks\": \"{hex}\"}}",
            ty.name()
        ));
    }
    let input: Vec<String> = x.iter().map(|v| format!("{v:e}")).collect();
    println!(
        "{{\"input\": [{}], \"types\": {{{}}}}}",
        input.join(", "),
        entries.join(", ")
    );
    Ok(())
}
