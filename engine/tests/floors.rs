//! The engine's floors (ARCHITECTURE.md, "Floors"): every module of
//! `engine/src` may import (`crate::<module>`) only from the modules below
//! it. The bottom floor is the `engine-core` crate, kept by the compiler;
//! this test keeps the floors inside `engine`, reading the sources.
//!
//! A top-level module's own files may not reach the crate root through
//! `super::` either (that would bypass the table).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Each module and what it may import (besides itself). `error` re-exports
/// `engine-core`'s error types: it is on the bottom floor with them.
const FLOORS: &[(&str, &[&str])] = &[
    ("error", &[]),
    ("kv", &["error"]),
    ("grammar", &["error"]),
    ("sampler", &["error", "grammar"]),
    ("dist", &["error"]),
    ("model", &["error", "dist"]),
    ("spec", &["error"]),
    ("executor", &["error", "dist", "kv", "model", "sampler"]),
    ("scheduler", &["error", "kv", "grammar", "sampler", "spec"]),
    (
        "engine_loop",
        &[
            "error",
            "kv",
            "grammar",
            "sampler",
            "model",
            "executor",
            "scheduler",
            "spec",
        ],
    ),
];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read_dir").flatten() {
        let p = entry.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

/// The top-level module a source file belongs to (`None`: `lib.rs`).
fn module_of(src: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(src).ok()?;
    let first = rel.components().next()?.as_os_str().to_string_lossy();
    let name = first.trim_end_matches(".rs").to_string();
    (name != "lib").then_some(name)
}

/// Every `crate::<name>` a file's code mentions (comments skipped).
fn crate_refs(text: &str) -> Vec<String> {
    let mut refs = Vec::new();
    for line in text.lines() {
        let code = line.split("//").next().unwrap_or("");
        let mut rest = code;
        while let Some(i) = rest.find("crate::") {
            let after = &rest[i + "crate::".len()..];
            let name: String = after
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if name.is_empty() {
                // `crate::{a, b}`: every name in the braces.
                if let Some(body) = after.strip_prefix('{') {
                    let body = body.split('}').next().unwrap_or("");
                    for part in body.split(',') {
                        let n = part.trim().split("::").next().unwrap_or("").trim();
                        if !n.is_empty() {
                            refs.push(n.to_string());
                        }
                    }
                }
            } else {
                refs.push(name);
            }
            rest = after;
        }
    }
    refs
}

/// Files directly under a top-level module whose `super::` is the crate root
/// (lines inside an inline `mod name {` block, such as the tests, are that
/// block's own business: their `super` is the module).
fn escapes_through_super(src: &Path, file: &Path, text: &str) -> bool {
    let Ok(rel) = file.strip_prefix(src) else {
        return false;
    };
    let depth = rel.components().count();
    let is_root_child = depth == 1 || (depth == 2 && rel.ends_with("mod.rs"));
    is_root_child
        && text
            .lines()
            .map(|l| l.split("//").next().unwrap_or(""))
            .take_while(|code| !(code.trim_start().starts_with("mod ") && code.ends_with('{')))
            .any(|code| code.contains("super::"))
}

#[test]
fn no_module_imports_from_a_floor_above_it() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let allowed: BTreeMap<&str, &[&str]> = FLOORS.iter().copied().collect();
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    let mut violations = Vec::new();
    let mut checked = 0;
    for file in &files {
        let Some(module) = module_of(&src, file) else {
            continue;
        };
        let text = std::fs::read_to_string(file).expect("read");
        let Some(ok) = allowed.get(module.as_str()) else {
            violations.push(format!("{}: module {module} has no floor", file.display()));
            continue;
        };
        for r in crate_refs(&text) {
            checked += 1;
            if r != module && !ok.contains(&r.as_str()) {
                violations.push(format!("{}: {module} imports crate::{r}", file.display()));
            }
        }
        if escapes_through_super(&src, file, &text) {
            violations.push(format!(
                "{}: super:: from a top-level module reaches the crate root",
                file.display()
            ));
        }
    }
    assert!(
        checked > 100,
        "only {checked} imports found: is the parser broken?"
    );
    assert!(
        violations.is_empty(),
        "upward imports:\n{}",
        violations.join("\n")
    );
}

#[test]
fn the_parser_sees_plain_and_grouped_imports() {
    let refs = crate_refs(
        "use crate::kv::BlockId;\nuse crate::{model::Dims, sampler};\n// crate::scheduler\n",
    );
    assert_eq!(refs, ["kv", "model", "sampler"]);
}
