//! SentencePiece vocabularies from GGUF (`tokenizer.ggml.model == "llama"`)
//! as an HF `tokenizer.json`: a BPE model with byte fallback whose merges are
//! recovered from the vocabulary, the `▁` space marker, and BOS added by the
//! post-processor (built in [`super::gguf`]).
//!
//! A SentencePiece BPE vocabulary has no merge list; the tokenizer repeatedly
//! joins the adjacent pair whose joined piece is best (highest score, which
//! for these files is also the earliest id). The equivalent merge list, built
//! here exactly as transformers builds it for GGUF files: every split `l + r`
//! of every piece where both halves are pieces, ranked best piece first, then
//! longer left half, then longer right half. Characters no piece covers fall
//! back to their UTF-8 bytes (`<0xNN>` pieces).
//!
//! Two text front ends:
//! - Gemma (`gemma`, `gemma2`, `gemma3`): spaces become `▁`, no space is
//!   prepended; pieces made only of spaces are stored as real spaces in the
//!   file and are respelled with `▁`; merges ranked by file position.
//! - Llama style (every other architecture): `▁` replaces spaces and one is
//!   prepended to the text when `tokenizer.ggml.add_space_prefix` (default
//!   true); merges ranked by score; the decoder strips that leading space.
//!
//! Invariants: every merge's halves and result are vocabulary pieces; the
//! vocabulary maps a piece to its last id, as a Python dict built in id order.
//! Cost: O(sum of piece lengths) hash lookups plus an O(m log m) sort of the
//! m merges (about 0.5 M for Gemma's 262,144 pieces).

use std::collections::HashMap;

use serde_json::{json, Value};

use super::gguf::{TOKEN_TYPE_CONTROL, TOKEN_TYPE_USER_DEFINED};

/// Which SentencePiece front end a GGUF architecture uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpmFlavor {
    /// Gemma 1-3: no prefix space, merges ranked by file position.
    Gemma,
    /// Llama 2, Mistral v0.1, TinyLlama...: merges ranked by score.
    Llama {
        /// Prepend `▁` to the text (`tokenizer.ggml.add_space_prefix`).
        add_space_prefix: bool,
    },
}

impl SpmFlavor {
    /// The flavor for a `general.architecture` name.
    pub fn for_architecture(arch: &str, add_space_prefix: Option<bool>) -> Self {
        match arch {
            "gemma" | "gemma2" | "gemma3" => Self::Gemma,
            _ => Self::Llama {
                add_space_prefix: add_space_prefix.unwrap_or(true),
            },
        }
    }
}

const SPACE_MARK: char = '\u{2581}';

/// The pieces as the tokenizer sees them (Gemma's all-space pieces respelled).
pub fn respell(tokens: &[String], flavor: SpmFlavor) -> Vec<String> {
    tokens
        .iter()
        .map(|t| {
            if flavor == SpmFlavor::Gemma && t.contains(' ') && t.trim().is_empty() {
                SPACE_MARK.to_string().repeat(t.chars().count())
            } else {
                t.clone()
            }
        })
        .collect()
}

/// The merge list a SentencePiece BPE vocabulary implies (see the module docs).
/// `rank_score[i]` is the goodness of piece `i` (higher merges first).
pub fn derive_merges(pieces: &[String], rank_score: &[f64]) -> Vec<(String, String)> {
    let mut vocab: HashMap<&str, usize> = HashMap::with_capacity(pieces.len());
    // Python-dict semantics: the first occurrence fixes the iteration order,
    // the last one the value.
    let mut order: Vec<&str> = Vec::with_capacity(pieces.len());
    let mut score: HashMap<&str, f64> = HashMap::with_capacity(pieces.len());
    for (id, p) in pieces.iter().enumerate() {
        if vocab.insert(p.as_str(), id).is_none() {
            order.push(p.as_str());
        }
        score.insert(p.as_str(), rank_score.get(id).copied().unwrap_or(0.0));
    }
    struct Merge<'a> {
        l: &'a str,
        r: &'a str,
        score: f64,
        l_chars: usize,
        r_chars: usize,
    }
    let mut merges: Vec<Merge<'_>> = Vec::new();
    for piece in order {
        let s = score.get(piece).copied().unwrap_or(0.0);
        let mut local: Vec<(usize, usize, Merge<'_>)> = Vec::new();
        for (k, (split, _)) in piece.char_indices().enumerate().skip(1) {
            let (l, r) = piece.split_at(split);
            if let (Some(&il), Some(&ir)) = (vocab.get(l), vocab.get(r)) {
                let r_chars = piece.chars().count() - k;
                local.push((
                    il,
                    ir,
                    Merge {
                        l,
                        r,
                        score: s,
                        l_chars: k,
                        r_chars,
                    },
                ));
            }
        }
        local.sort_by_key(|(il, ir, _)| (*il, *ir));
        merges.extend(local.into_iter().map(|(_, _, m)| m));
    }
    // Descending and stable, as Python's `sorted(..., reverse=True)`.
    merges.sort_by(|a, b| {
        b.score
            .partial_cmp(&a.score)
            .unwrap_or(std::cmp::Ordering::Equal)
            .then(b.l_chars.cmp(&a.l_chars))
            .then(b.r_chars.cmp(&a.r_chars))
    });
    merges
        .into_iter()
        .map(|m| (m.l.to_string(), m.r.to_string()))
        .collect()
}

/// Inputs of [`spm_tokenizer_json`].
pub struct SpmVocab<'a> {
    pub tokens: &'a [String],
    pub token_types: &'a [i64],
    pub scores: &'a [f32],
    pub unk: Option<u32>,
    pub flavor: SpmFlavor,
}

/// The `tokenizer.json` value, without the post-processor (the caller adds
/// BOS handling).
pub fn spm_tokenizer_json(v: &SpmVocab<'_>) -> Value {
    let pieces = respell(v.tokens, v.flavor);
    let rank: Vec<f64> = match v.flavor {
        SpmFlavor::Gemma => (0..pieces.len()).map(|i| -(i as f64)).collect(),
        SpmFlavor::Llama { .. } => v.scores.iter().map(|&s| f64::from(s)).collect(),
    };
    let merges: Vec<Value> = derive_merges(&pieces, &rank)
        .into_iter()
        .map(|(l, r)| json!([l, r]))
        .collect();
    let mut vocab = serde_json::Map::with_capacity(pieces.len());
    for (id, p) in pieces.iter().enumerate() {
        vocab.insert(p.clone(), json!(id));
    }
    // Control pieces are special; user-defined ones are matched whole but
    // are not special (only those the vocabulary spells as written).
    let added: Vec<Value> = v
        .tokens
        .iter()
        .zip(v.token_types)
        .enumerate()
        .filter(|(_, (tok, t))| {
            **t == TOKEN_TYPE_CONTROL
                || (**t == TOKEN_TYPE_USER_DEFINED && vocab.contains_key(tok.as_str()))
        })
        .map(|(id, (content, t))| {
            json!({
                "id": id, "content": content, "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": *t == TOKEN_TYPE_CONTROL,
            })
        })
        .collect();
    let unk = v
        .unk
        .and_then(|id| pieces.get(id as usize))
        .map_or(Value::Null, |s| json!(s));
    let replace_space =
        json!({"type": "Replace", "pattern": {"String": " "}, "content": "\u{2581}"});
    let mut decoders = vec![
        json!({"type": "Replace", "pattern": {"String": "\u{2581}"}, "content": " "}),
        json!({"type": "ByteFallback"}),
        json!({"type": "Fuse"}),
    ];
    let (normalizer, pre_tokenizer) = match v.flavor {
        SpmFlavor::Gemma => (
            replace_space,
            json!({"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithPrevious", "invert": false}),
        ),
        SpmFlavor::Llama { add_space_prefix } => {
            if add_space_prefix {
                decoders.push(json!({"type": "Strip", "content": " ", "start": 1, "stop": 0}));
            }
            (
                Value::Null,
                json!({"type": "Metaspace", "replacement": "\u{2581}",
                       "prepend_scheme": if add_space_prefix { "first" } else { "never" },
                       "split": false}),
            )
        }
    };
    json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": normalizer,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": null,
        "decoder": {"type": "Sequence", "decoders": decoders},
        "model": {
            "type": "BPE", "dropout": null, "unk_token": unk, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": true, "byte_fallback": true,
            "ignore_merges": false, "vocab": vocab, "merges": merges,
        },
    })
}
