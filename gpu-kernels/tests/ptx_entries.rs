//! Golden PTX entry points: the `.entry` symbols and parameter lists of the PTX built by
//! `cargo xtask build-ptx` must equal `gpu_kernels::KERNELS`, which the host side
//! launches by. Skips (with the reason printed) when the PTX has not been built.

use gpu_kernels::KERNELS;
use std::collections::BTreeMap;
use std::path::PathBuf;

/// `.entry` name -> list of PTX param types (`.u64`, `.u32`, `.f32`, ...).
fn parse_entries(ptx: &str) -> BTreeMap<String, Vec<String>> {
    let mut out = BTreeMap::new();
    let mut lines = ptx.lines();
    while let Some(line) = lines.next() {
        let Some(rest) = line.split(".entry ").nth(1) else {
            continue;
        };
        let name = rest.split('(').next().unwrap_or("").trim().to_string();
        let mut params = Vec::new();
        if rest.contains(')') {
            out.insert(name, params);
            continue;
        }
        for l in lines.by_ref() {
            let l = l.trim();
            if l.starts_with(')') {
                break;
            }
            if let Some(p) = l.strip_prefix(".param ") {
                params.push(p.split_whitespace().next().unwrap_or("").to_string());
            }
        }
        out.insert(name, params);
    }
    out
}

#[test]
fn parser_reads_entries_and_param_types() {
    let ptx = "\t// .globl\tk1\n.visible .entry k1(\n\t.param .u64 .ptr .align 1 k1_param_0,\n\t.param .u32 k1_param_1,\n\t.param .f32 k1_param_2\n)\n{\n}\n.visible .entry k2()\n{\n}\n";
    let got = parse_entries(ptx);
    assert_eq!(got.len(), 2);
    assert_eq!(got["k1"], vec![".u64", ".u32", ".f32"]);
    assert!(got["k2"].is_empty());
}

#[test]
fn ptx_entry_points_match_the_host_table() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("target")
        .join("ptx");
    let mut checked = 0;
    for arch in ["sm_80", "sm_90"] {
        let path = root.join(arch).join("gpu_kernels.ptx");
        let Ok(ptx) = std::fs::read_to_string(&path) else {
            eprintln!(
                "SKIP {arch}: {} not built (run `cargo xtask build-ptx`)",
                path.display()
            );
            continue;
        };
        let entries = parse_entries(&ptx);
        let hint = "(stale PTX? rerun `cargo xtask build-ptx`)";
        for k in KERNELS {
            let Some(params) = entries.get(k.name) else {
                panic!("{arch}: no .entry {} in the PTX {hint}", k.name)
            };
            let want: Vec<&str> = k.params.iter().map(|p| p.kind.ptx_type()).collect();
            assert_eq!(params, &want, "{arch}: parameters of {} {hint}", k.name);
        }
        for name in entries.keys() {
            assert!(
                KERNELS.iter().any(|k| k.name == name),
                "{arch}: .entry {name} is not in KERNELS {hint}"
            );
        }
        checked += 1;
    }
    eprintln!(
        "checked {} kernels against {checked} PTX file(s)",
        KERNELS.len()
    );
}

#[test]
fn kernel_table_has_every_family_dtype_and_head_size() {
    assert_eq!(
        KERNELS.len(),
        4 * 3 * gpu_kernels::attention::HEAD_SIZES.len()
            + 2 * gpu_kernels::attention::HEAD_SIZES.len() // prefill_attention_mma (f16, bf16)
            + 12 * 3 // the per-dtype row kernels
            + 4 * 3 // the LoRA kernels (BGMV and SGMV, shrink and expand)
            + 4 // + greedy_rows_f32, sample_rows_f32, fill_counts, penalize_rows
    );
    for dt in ["f16", "bf16"] {
        for h in gpu_kernels::attention::HEAD_SIZES {
            let name = format!("prefill_attention_mma_{dt}_h{h}");
            assert!(KERNELS.iter().any(|k| k.name == name), "missing {name}");
        }
    }
    for dt in ["f32", "f16", "bf16"] {
        for h in gpu_kernels::attention::HEAD_SIZES {
            for fam in [
                "paged_attention_v1",
                "paged_attention_v2",
                "paged_attention_v2_reduce",
                "prefill_attention",
            ] {
                let name = format!("{fam}_{dt}_h{h}");
                assert!(KERNELS.iter().any(|k| k.name == name), "missing {name}");
            }
        }
    }
    for dt in ["f32", "f16", "bf16"] {
        for fam in [
            "rms_norm_heads",
            "add_rms_norm",
            "gelu_tanh_and_mul",
            "scale_rows",
        ] {
            let name = format!("{fam}_{dt}");
            assert!(KERNELS.iter().any(|k| k.name == name), "missing {name}");
        }
    }
    for dt in ["f32", "f16", "bf16"] {
        for fam in [
            "lora_bgmv_shrink",
            "lora_bgmv_expand",
            "lora_sgmv_shrink",
            "lora_sgmv_expand",
        ] {
            let name = format!("{fam}_{dt}");
            assert!(KERNELS.iter().any(|k| k.name == name), "missing {name}");
        }
    }
    // Every attention family takes the sliding window as its last parameter.
    for k in KERNELS {
        let windowed = [
            "paged_attention_v1_",
            "paged_attention_v2_",
            "prefill_attention_",
        ]
        .iter()
        .any(|f| k.name.starts_with(f))
            && !k.name.starts_with("paged_attention_v2_reduce");
        if windowed {
            let last = k.params.last().map(|p| p.name);
            assert_eq!(last, Some("window"), "{}: last parameter", k.name);
        }
    }
    let mut names: Vec<&str> = KERNELS.iter().map(|k| k.name).collect();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), KERNELS.len(), "duplicate entry names");
}
