//! The tokenizer: a thin wrapper over the `tokenizers` crate that adds what
//! the engine needs (BOS/EOS ids, special-token set, raw token bytes for an
//! incremental UTF-8-safe detokenizer).
//!
//! Two sources: an HF `tokenizer.json` (+ `tokenizer_config.json`), or a
//! GGUF file's `tokenizer.ggml.*` metadata, which [`gguf`] turns into the
//! same `tokenizer.json` form (so it can also be saved and reloaded).
//!
//! Invariants: `token_bytes(id)` concatenated over a sequence equals the
//! UTF-8 bytes of `decode(ids, false)` for byte-level BPE (special tokens
//! give their literal text); every id in `eos_token_ids` and `bos_token_id`
//! is inside the vocabulary. Construction is O(vocab); encode/decode are the
//! `tokenizers` crate's.

pub mod gguf;
pub mod spm;

use std::collections::HashSet;
use std::path::Path;

use crate::error::{LoaderError, Result};

/// A loaded tokenizer.
#[derive(Clone)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    /// The `tokenizer.json` text this was built from.
    json: String,
    bos: Option<u32>,
    eos: Vec<u32>,
    special: HashSet<u32>,
    /// Raw bytes of every id below the vocabulary size.
    bytes: Vec<Option<Vec<u8>>>,
    add_bos: bool,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.vocab_size())
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .field("add_bos", &self.add_bos)
            .finish()
    }
}

/// Special-token settings that do not live in `tokenizer.json`.
#[derive(Debug, Clone, Default)]
pub struct SpecialTokens {
    pub bos: Option<u32>,
    pub eos: Vec<u32>,
    /// Whether encoding with special tokens adds BOS (informational: the
    /// post-processor in the JSON is what actually adds it).
    pub add_bos: bool,
}

fn tok_err(e: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> LoaderError {
    LoaderError::TokenizerLib(e.into())
}

impl Tokenizer {
    /// Builds from `tokenizer.json` text and the special-token settings.
    pub fn from_json(json: String, special: SpecialTokens) -> Result<Self> {
        let inner: tokenizers::Tokenizer = json.parse().map_err(tok_err)?;
        let value: serde_json::Value = serde_json::from_str(&json).map_err(tok_err)?;
        let byte_level = value
            .get("decoder")
            .is_some_and(|d| d.to_string().contains("\"ByteLevel\""));
        let vocab_size = inner.get_vocab_size(true);
        let added = inner.get_added_tokens_decoder();
        let special_ids: HashSet<u32> = added
            .iter()
            .filter(|(_, t)| t.special)
            .map(|(id, _)| *id)
            .collect();
        let max_id = inner
            .get_vocab(true)
            .values()
            .copied()
            .max()
            .map_or(0, |m| m as usize + 1)
            .max(vocab_size);
        let bytes = (0..max_id as u32)
            .map(|id| {
                if let Some(t) = added.get(&id) {
                    return Some(t.content.as_bytes().to_vec());
                }
                let tok = inner.id_to_token(id)?;
                Some(if byte_level {
                    byte_level_decode(&tok)
                } else {
                    sentencepiece_decode(&tok)
                })
            })
            .collect();
        for id in special.bos.iter().chain(&special.eos) {
            if *id as usize >= max_id {
                return Err(LoaderError::Tokenizer(format!(
                    "special token id {id} outside the vocabulary ({max_id})"
                )));
            }
        }
        Ok(Self {
            inner,
            json,
            bos: special.bos,
            eos: special.eos,
            special: special_ids,
            bytes,
            add_bos: special.add_bos,
        })
    }

    /// Loads `tokenizer.json` (+ `tokenizer_config.json` and
    /// `generation_config.json` when present) from an HF model directory.
    pub fn from_hf_dir(dir: &Path) -> Result<Self> {
        let (tok, _) = crate::hf::tokenizer_and_template(dir)?;
        Ok(tok)
    }

    /// Encodes `text`; special tokens written in the text (e.g.
    /// `<|im_start|>`) always map to their ids. `add_special_tokens` runs
    /// the post-processor (adds BOS where the model wants it).
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        let enc = self
            .inner
            .encode(text, add_special_tokens)
            .map_err(tok_err)?;
        Ok(enc.get_ids().to_vec())
    }

    /// Decodes ids to text.
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String> {
        if let Some(bad) = ids.iter().find(|&&id| id as usize >= self.bytes.len()) {
            return Err(LoaderError::Tokenizer(format!(
                "token id {bad} out of range"
            )));
        }
        self.inner.decode(ids, skip_special_tokens).map_err(tok_err)
    }

    /// The raw bytes token `id` stands for (byte-level decoded; special
    /// tokens give their text). `None` for ids outside the vocabulary.
    pub fn token_bytes(&self, id: u32) -> Option<Vec<u8>> {
        self.bytes.get(id as usize).cloned().flatten()
    }

    /// Whether `id` is a special (control) token.
    pub fn is_special(&self, id: u32) -> bool {
        self.special.contains(&id)
    }

    /// Number of ids, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.bytes.len()
    }

    /// BOS id, if the model has one.
    pub fn bos_token_id(&self) -> Option<u32> {
        self.bos
    }

    /// Ids that end generation.
    pub fn eos_token_ids(&self) -> &[u32] {
        &self.eos
    }

    /// Whether `encode(.., true)` is expected to add BOS.
    pub fn add_bos_token(&self) -> bool {
        self.add_bos
    }

    /// The token string of `id` (byte-level form for BPE tokens).
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// The id of a token string.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// The `tokenizer.json` text (reloadable with [`Tokenizer::from_json`]).
    pub fn to_json(&self) -> &str {
        &self.json
    }

    /// Writes `tokenizer.json` to `path`.
    pub fn save(&self, path: &Path) -> Result<()> {
        std::fs::write(path, &self.json).map_err(|e| LoaderError::io(path, e))
    }

    /// The underlying `tokenizers` object.
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }
}

/// GPT-2's byte -> printable-char table (`bytes_to_unicode`).
pub fn byte_to_char_table() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut n = 0u32;
    for b in 0..256u32 {
        let printable =
            (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
        let c = if printable {
            b
        } else {
            n += 1;
            255 + n
        };
        table[b as usize] = char::from_u32(c).unwrap_or('\0');
    }
    table
}

/// Inverse of [`byte_to_char_table`] applied to a token string; chars
/// outside the table keep their UTF-8 bytes.
pub fn byte_level_decode(token: &str) -> Vec<u8> {
    static REVERSE: std::sync::OnceLock<[Option<u8>; 324]> = std::sync::OnceLock::new();
    let rev = REVERSE.get_or_init(|| {
        let mut rev = [None; 324];
        for (b, c) in byte_to_char_table().iter().enumerate() {
            if let Some(slot) = rev.get_mut(*c as usize) {
                *slot = Some(b as u8);
            }
        }
        rev
    });
    let mut out = Vec::with_capacity(token.len());
    for ch in token.chars() {
        match rev.get(ch as usize).copied().flatten() {
            Some(b) => out.push(b),
            None => out.extend_from_slice(ch.to_string().as_bytes()),
        }
    }
    out
}

/// SentencePiece-style token text: `▁` is a space, `<0xNN>` a raw byte.
fn sentencepiece_decode(token: &str) -> Vec<u8> {
    if let Some(hex) = token.strip_prefix("<0x").and_then(|t| t.strip_suffix('>')) {
        if let Ok(b) = u8::from_str_radix(hex, 16) {
            return vec![b];
        }
    }
    token.replace('\u{2581}', " ").into_bytes()
}
