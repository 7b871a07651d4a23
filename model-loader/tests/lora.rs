//! LoRA adapter loading: PEFT folders and llama.cpp GGUF adapters give the
//! same f32 adapter (B's q/k rows un-permuted from llama.cpp's order), and
//! every refusal names its problem.

use model_loader::gguf::writer::{permute_qk, GgufWriter};
use model_loader::gguf::{GgmlType, MetaValue};
use model_loader::lora::{load_lora, LoraTarget};
use model_loader::lora_gen::{write_random_peft, RandomLora};
use model_loader::tiny::tiny_config;
use model_loader::LoaderError;

fn spec(rank: usize, targets: &[LoraTarget]) -> RandomLora {
    RandomLora {
        seed: 9,
        rank,
        alpha: 16.0,
        targets: targets.to_vec(),
        zero: false,
        b_magnitude: 0.5,
        use_rslora: false,
    }
}

#[test]
fn peft_loads_with_its_scale_and_shapes() {
    let c = tiny_config();
    let tmp = tempfile::tempdir().unwrap();
    write_random_peft(tmp.path(), &c, &spec(4, &LoraTarget::ALL)).unwrap();
    let a = load_lora(tmp.path(), &c, 16).unwrap();
    assert_eq!((a.rank, a.scale), (4, 4.0));
    assert_eq!(a.targets(), LoraTarget::ALL.to_vec());
    for l in &a.layers {
        for t in LoraTarget::ALL {
            let p = l.pairs[t.index()].as_ref().unwrap();
            let (out, inp) = t.shape(&c);
            assert_eq!((p.a.len(), p.b.len()), (4 * inp, out * 4));
        }
    }
    // rsLoRA: alpha / sqrt(r).
    let mut s = spec(4, &[LoraTarget::Q]);
    s.use_rslora = true;
    write_random_peft(tmp.path(), &c, &s).unwrap();
    assert_eq!(load_lora(tmp.path(), &c, 16).unwrap().scale, 8.0);
}

#[test]
fn refusals_name_the_problem() {
    let c = tiny_config();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("a");
    // Missing folder, missing weights file.
    let e = load_lora(&dir, &c, 16).unwrap_err();
    assert!(matches!(e, LoaderError::LoraMissingFile { .. }), "{e}");
    write_random_peft(&dir, &c, &spec(8, &[LoraTarget::Q])).unwrap();
    // Rank above the limit.
    let e = load_lora(&dir, &c, 4).unwrap_err();
    assert!(
        e.to_string().contains("rank 8 is above the maximum 4"),
        "{e}"
    );
    // Unknown target module.
    let cfg = dir.join("adapter_config.json");
    let text = std::fs::read_to_string(&cfg).unwrap();
    std::fs::write(&cfg, text.replace("\"q_proj\"", "\"lm_head\"")).unwrap();
    let e = load_lora(&dir, &c, 16).unwrap_err();
    assert!(e.to_string().contains("\"lm_head\""), "{e}");
    // Shape mismatch: the adapter of another model's width.
    let mut other = c.clone();
    other.hidden_size *= 2;
    let d2 = tmp.path().join("b");
    write_random_peft(&d2, &other, &spec(8, &[LoraTarget::V])).unwrap();
    let e = load_lora(&d2, &c, 16).unwrap_err();
    assert!(matches!(e, LoaderError::ShapeMismatch { .. }), "{e}");
    std::fs::remove_file(d2.join("adapter_model.safetensors")).unwrap();
    let e = load_lora(&d2, &c, 16).unwrap_err();
    assert!(e.to_string().contains("adapter_model.safetensors"), "{e}");
}

#[test]
fn gguf_adapter_equals_peft_after_unpermuting() {
    let c = tiny_config();
    let tmp = tempfile::tempdir().unwrap();
    write_random_peft(tmp.path(), &c, &spec(4, &LoraTarget::ALL)).unwrap();
    let peft = load_lora(tmp.path(), &c, 16).unwrap();
    // The same adapter as convert_lora_to_gguf.py writes it for `llama`.
    let mut w = GgufWriter::new();
    w.meta("general.architecture", MetaValue::String("llama".into()))
        .meta("general.type", MetaValue::String("adapter".into()))
        .meta("adapter.type", MetaValue::String("lora".into()))
        .meta("adapter.lora.alpha", MetaValue::F32(16.0));
    for (i, l) in peft.layers.iter().enumerate() {
        for t in LoraTarget::ALL {
            let p = l.pairs[t.index()].as_ref().unwrap();
            let (out, inp) = t.shape(&c);
            let b = match t {
                LoraTarget::Q => permute_qk(&p.b, c.num_attention_heads, out, 4),
                LoraTarget::K => permute_qk(&p.b, c.num_key_value_heads, out, 4),
                _ => p.b.clone(),
            };
            let stem = format!("blk.{i}.{}.weight", t.gguf_name());
            w.tensor(
                &format!("{stem}.lora_a"),
                vec![4, inp],
                GgmlType::F32,
                p.a.clone(),
            );
            w.tensor(&format!("{stem}.lora_b"), vec![out, 4], GgmlType::F32, b);
        }
    }
    let path = tmp.path().join("adapter.gguf");
    std::fs::write(&path, w.to_bytes().unwrap()).unwrap();
    let gguf = load_lora(&path, &c, 16).unwrap();
    assert_eq!(gguf.scale, peft.scale);
    assert_eq!(gguf.layers, peft.layers);
}
