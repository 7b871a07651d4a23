//! Our block decoders and encoders against the `gguf` Python package.
//!
//! `fixtures/quant_gguf.json` holds an input vector, the blocks our encoders
//! made of it, and `gguf.quants.dequantize`'s values for those blocks (made
//! by `fixtures/quant_gguf_reference.py`; the expected values come from gguf,
//! not from this crate). Every readable type but Q8_K (gguf has no reader
//! for it) is covered.

use model_loader::dequant::{dequantize, encode};
use model_loader::gguf::GgmlType;
use serde_json::Value;

fn fixture() -> Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/quant_gguf.json"
    );
    let text = std::fs::read_to_string(path).expect("fixture present");
    serde_json::from_str(&text).expect("fixture is JSON")
}

fn floats(v: &Value) -> Vec<f32> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|x| x.as_f64().expect("number") as f32)
        .collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect()
}

const ALL: [&str; 13] = [
    "F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K",
    "Q6_K",
];

#[test]
fn our_dequantization_equals_gguf_for_every_type() {
    let f = fixture();
    let types = f["types"].as_object().expect("types");
    for name in ALL {
        let t = &types[name];
        let ty = GgmlType::from_id(t["id"].as_u64().expect("id") as u32);
        assert_eq!(ty.name(), name);
        let blocks = unhex(t["blocks"].as_str().expect("hex"));
        let want = floats(&t["gguf"]);
        let got = dequantize(ty, &blocks, want.len(), name).expect("readable");
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            // Bit-exact up to the sign of zero (0 * d may be -0 in numpy).
            assert!(g == w, "{name}[{i}]: ours {g} vs gguf {w}");
        }
    }
}

#[test]
fn our_encoders_still_write_the_fixture_blocks() {
    // The fixture's blocks were written by these encoders; a change of
    // encoder output must come with a regenerated (and re-checked) fixture.
    let f = fixture();
    let input = floats(&f["input"]);
    for name in ALL {
        let t = &f["types"][name];
        let ty = GgmlType::from_id(t["id"].as_u64().expect("id") as u32);
        let ours = encode(ty, &input, name).expect("encodable");
        assert!(
            ours == unhex(t["blocks"].as_str().expect("hex")),
            "{name}: encoder output differs from the fixture"
        );
    }
}
