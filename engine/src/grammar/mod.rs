//! Constrained decoding ("structured outputs") with `llguidance`: a JSON
//! schema, a regex, a list of choices or a Lark grammar restricts which
//! tokens a sequence may draw next.
//!
//! - [`GrammarCompiler`] is built once per tokenizer: `llguidance`'s token
//!   trie over the vocabulary's raw bytes (special tokens under the
//!   `0xff` marker, as `toktrie` expects) and its `ParserFactory`.
//! - [`GrammarCompiler::compile`] turns a [`GrammarSpec`] into a
//!   [`CompiledGrammar`] (or a [`GrammarError`] saying why it does not
//!   compile); it rides in `SamplingParams::structured`.
//! - [`state::GrammarStates`] (engine loop) holds one matcher per live
//!   sequence, computes the batch's allowed-token masks and consumes each
//!   sampled token.
//!
//! Schemas travel as text; this module parses them (serde_json) only to
//! hand them to `llguidance` with the layout options below. JSON output is
//! compact (`{"a": 1, "b": [2, 3]}`): see [`compact_json`].
//!
//! Invariants:
//! - a sequence's matcher has consumed exactly its output tokens (it follows
//!   `Sequence::tokens`, not steps): preemption by swap or recompute leaves
//!   it as is, a fork starts from a copy of its parent's state, and a
//!   matcher that fell out of step is rebuilt from the tokens;
//! - the mask allows only EOS once the grammar is complete and nothing can
//!   follow, so a constrained sequence ends with `stop` at EOS, as in vLLM;
//! - a mask is a packed bitmask, bit `t % 32` of word `t / 32` set when
//!   token `t` is allowed ([`Mask::packed`]): the form a GPU sampling kernel
//!   reads; tokens past the tokenizer's vocabulary (padding rows of the
//!   logits) are never allowed.
//!
//! Cost: building the trie is O(total vocabulary bytes) once. Compiling a
//! grammar is done by the caller (the server, off the engine thread) and
//! costs what `llguidance` needs (milliseconds for usual schemas). Per step
//! and constrained sequence, one mask: `llguidance` walks the token trie
//! against the lexer (typically tens to hundreds of microseconds for JSON,
//! see `benches/grammar_mask.rs`), plus O(vocab / 32) to apply it.

pub mod state;

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{self, TokEnv, TokRxInfo, TokTrie};
use llguidance::{Matcher, ParserFactory};
use model_loader::Tokenizer;
use std::sync::Arc;
use thiserror::Error;

/// What the output must follow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GrammarSpec {
    /// A JSON schema, as JSON text.
    JsonSchema(String),
    /// Any JSON object (`response_format: {"type": "json_object"}`).
    JsonObject,
    /// A regular expression (Rust `regex` syntax) the whole output matches.
    Regex(String),
    /// Exactly one of these strings.
    Choice(Vec<String>),
    /// A Lark grammar as `llguidance` reads it.
    Lark(String),
}

impl GrammarSpec {
    /// The kind's name, for logs and errors.
    pub fn kind(&self) -> &'static str {
        match self {
            GrammarSpec::JsonSchema(_) => "json_schema",
            GrammarSpec::JsonObject => "json_object",
            GrammarSpec::Regex(_) => "regex",
            GrammarSpec::Choice(_) => "choice",
            GrammarSpec::Lark(_) => "grammar",
        }
    }

    fn to_top_level(&self) -> Result<TopLevelGrammar, GrammarError> {
        let invalid = |reason: String| GrammarError::Invalid {
            kind: self.kind(),
            reason,
        };
        match self {
            GrammarSpec::JsonSchema(s) => {
                let schema: serde_json::Value = serde_json::from_str(s)
                    .map_err(|e| invalid(format!("the schema is not JSON: {e}")))?;
                if !schema.is_object() && !schema.is_boolean() {
                    return Err(invalid("a schema must be an object or a boolean".into()));
                }
                Ok(TopLevelGrammar::from_json_schema(compact_json(schema)))
            }
            GrammarSpec::JsonObject => Ok(TopLevelGrammar::from_json_schema(compact_json(
                serde_json::json!({"type": "object"}),
            ))),
            GrammarSpec::Regex(r) => Ok(TopLevelGrammar::from_regex(r)),
            GrammarSpec::Lark(g) => Ok(TopLevelGrammar::from_lark(g.clone())),
            GrammarSpec::Choice(list) => {
                if list.is_empty() {
                    return Err(invalid("the choice list is empty".into()));
                }
                let alts: Vec<String> = list.iter().map(|c| lark_string(c)).collect();
                Ok(TopLevelGrammar::from_lark(format!(
                    "start: {}",
                    alts.join(" | ")
                )))
            }
        }
    }
}

/// Fixed JSON layout (`", "` between items, `": "` after keys, no other
/// whitespace) unless the schema sets its own `x-guidance` options: with
/// free whitespace a small model can fill its whole budget with blanks.
fn compact_json(mut schema: serde_json::Value) -> serde_json::Value {
    if let Some(obj) = schema.as_object_mut() {
        if !obj.contains_key("x-guidance") {
            let opts = llguidance::JsonCompileOptions {
                item_separator: ", ".into(),
                key_separator: ": ".into(),
                whitespace_flexible: false,
                ..Default::default()
            };
            if let Ok(v) = serde_json::to_value(&opts) {
                obj.insert("x-guidance".into(), v);
            }
        }
    }
    schema
}

/// `s` as a Lark string literal (JSON-style escapes).
fn lark_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Why a grammar cannot be used.
#[derive(Debug, Clone, Error)]
pub enum GrammarError {
    /// The schema, regex, choice list or grammar does not compile.
    #[error("invalid {kind}: {reason}")]
    Invalid { kind: &'static str, reason: String },
    /// The tokenizer could not be turned into a token trie.
    #[error("cannot build the token trie")]
    Tokenizer(#[source] crate::error::Cause),
    /// The end-of-sequence id is not a token of the vocabulary.
    #[error("EOS id {eos} is outside the vocabulary of {vocab_size}")]
    EosOutsideVocab { eos: u32, vocab_size: usize },
}

/// A grammar compiled against one tokenizer: the matcher every sequence of
/// the request starts from. Cloning shares it; equality is identity.
#[derive(Clone)]
pub struct CompiledGrammar {
    inner: Arc<CompiledInner>,
}

struct CompiledInner {
    kind: &'static str,
    start: Matcher,
    /// Bits of a mask row (the tokenizer's vocabulary size).
    vocab_size: usize,
    /// What the mask allows once the grammar is complete.
    eos: u32,
}

impl CompiledGrammar {
    /// A fresh matcher at the grammar's start.
    pub(crate) fn start_matcher(&self) -> Matcher {
        self.inner.start.deep_clone()
    }

    /// The spec's kind (`json_schema`, `regex`, ...).
    pub fn kind(&self) -> &'static str {
        self.inner.kind
    }

    /// Tokens a mask covers.
    pub fn vocab_size(&self) -> usize {
        self.inner.vocab_size
    }

    /// The token allowed once the grammar is complete.
    pub fn eos(&self) -> u32 {
        self.inner.eos
    }
}

impl std::fmt::Debug for CompiledGrammar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CompiledGrammar({})", self.inner.kind)
    }
}

impl PartialEq for CompiledGrammar {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}

/// `llguidance`'s view of our tokenizer: the trie, and tokenization for
/// the (rare) places it re-tokenizes text.
struct TokenizerEnv {
    trie: TokTrie,
    tokenizer: Arc<Tokenizer>,
}

impl toktrie::TokenizerEnv for TokenizerEnv {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<u32> {
        match std::str::from_utf8(s) {
            Ok(text) => self
                .tokenizer
                .encode(text, false)
                .unwrap_or_else(|_| self.trie.greedy_tokenize(s)),
            Err(_) => self.trie.greedy_tokenize(s),
        }
    }
}

/// Compiles grammars for one tokenizer (build once, share).
pub struct GrammarCompiler {
    factory: ParserFactory,
    vocab_size: usize,
    eos: u32,
}

impl GrammarCompiler {
    /// Builds the token trie from the tokenizer's vocabulary bytes; `eos`
    /// is the token the mask allows when the grammar is complete.
    pub fn new(tokenizer: Arc<Tokenizer>, eos: u32) -> Result<Self, GrammarError> {
        let vocab_size = tokenizer.vocab_size();
        if eos as usize >= vocab_size {
            return Err(GrammarError::EosOutsideVocab { eos, vocab_size });
        }
        let words: Vec<Vec<u8>> = (0..vocab_size as u32)
            .map(|id| {
                let bytes = tokenizer.token_bytes(id).unwrap_or_default();
                if tokenizer.is_special(id) {
                    let mut w = vec![TokTrie::SPECIAL_TOKEN_MARKER];
                    w.extend_from_slice(&bytes);
                    w
                } else {
                    bytes
                }
            })
            .collect();
        let info = TokRxInfo::new(vocab_size as u32, eos);
        let trie = TokTrie::from(&info, &words);
        let env: TokEnv = Arc::new(TokenizerEnv { trie, tokenizer });
        let mut factory = ParserFactory::new_simple(&env).map_err(|e| {
            let e: Box<dyn std::error::Error + Send + Sync> = e.into();
            GrammarError::Tokenizer(e.into())
        })?;
        factory.quiet();
        Ok(Self {
            factory,
            vocab_size,
            eos,
        })
    }

    /// Compiles `spec`; the error says why it does not compile.
    pub fn compile(&self, spec: &GrammarSpec) -> Result<CompiledGrammar, GrammarError> {
        let top = spec.to_top_level()?;
        let parser = self
            .factory
            .create_parser(top)
            .map_err(|e| GrammarError::Invalid {
                kind: spec.kind(),
                reason: first_line(&format!("{e:#}")),
            })?;
        let mut start = Matcher::new(Ok(parser));
        if let Some(e) = start.get_error() {
            return Err(GrammarError::Invalid {
                kind: spec.kind(),
                reason: first_line(&e),
            });
        }
        // A grammar that admits nothing at all is refused now rather than
        // producing an empty mask later.
        match start.compute_mask() {
            Ok(m) if !m.is_zero() => {}
            Ok(_) => {
                return Err(GrammarError::Invalid {
                    kind: spec.kind(),
                    reason: "the grammar admits no output".into(),
                })
            }
            Err(e) => {
                return Err(GrammarError::Invalid {
                    kind: spec.kind(),
                    reason: first_line(&format!("{e:#}")),
                })
            }
        }
        Ok(CompiledGrammar {
            inner: Arc::new(CompiledInner {
                kind: spec.kind(),
                start,
                vocab_size: self.vocab_size,
                eos: self.eos,
            }),
        })
    }
}

/// `llguidance`'s verbose errors append the grammar and parser state; the
/// first line says what is wrong.
fn first_line(s: &str) -> String {
    s.lines().next().unwrap_or(s).trim().to_string()
}

/// One row's allowed tokens, packed 32 per word.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mask {
    words: Vec<u32>,
}

impl Mask {
    /// The packed bitmask: bit `t % 32` of word `t / 32` allows token `t`.
    /// This is the hook for a GPU sampling kernel (upload one row per
    /// constrained sequence).
    pub fn packed(&self) -> &[u32] {
        &self.words
    }

    /// Whether token `t` is allowed.
    pub fn allows(&self, t: u32) -> bool {
        self.words
            .get(t as usize / 32)
            .is_some_and(|w| w >> (t % 32) & 1 == 1)
    }

    /// Sets every disallowed logit to `-inf`.
    pub fn apply(&self, row: &mut [f32]) {
        for (w, chunk) in row.chunks_mut(32).enumerate() {
            let bits = self.words.get(w).copied().unwrap_or(0);
            if bits == u32::MAX {
                continue;
            }
            for (b, v) in chunk.iter_mut().enumerate() {
                if bits >> b & 1 == 0 {
                    *v = f32::NEG_INFINITY;
                }
            }
        }
    }

    pub(crate) fn from_vob(v: &toktrie::SimpleVob, vocab_size: usize) -> Self {
        let mut words = v.as_slice().to_vec();
        words.resize(vocab_size.div_ceil(32), 0);
        // Bits past the vocabulary stay clear.
        let tail = vocab_size % 32;
        if tail > 0 {
            if let Some(last) = words.last_mut() {
                *last &= (1u32 << tail) - 1;
            }
        }
        Self { words }
    }

    /// A mask allowing only `token` (within `vocab_size`).
    pub(crate) fn only(token: u32, vocab_size: usize) -> Self {
        let mut words = vec![0u32; vocab_size.div_ceil(32)];
        if let Some(w) = words.get_mut(token as usize / 32) {
            *w |= 1 << (token % 32);
        }
        Self { words }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lark_strings_escape() {
        assert_eq!(lark_string("a\"b\\c\nd"), r#""a\"b\\c\nd""#);
        assert_eq!(lark_string("\u{1}"), r#""\u0001""#);
    }

    #[test]
    fn mask_packs_and_applies() {
        let m = Mask::only(33, 40);
        assert_eq!(m.packed(), &[0, 2]);
        assert!(m.allows(33) && !m.allows(32) && !m.allows(64));
        let mut row = vec![1.0f32; 40];
        m.apply(&mut row);
        let finite: Vec<usize> = (0..40).filter(|&i| row[i].is_finite()).collect();
        assert_eq!(finite, vec![33]);
    }

    #[test]
    fn rows_longer_than_the_mask_are_cut() {
        let m = Mask::only(1, 2);
        let mut row = vec![0.0f32; 70];
        m.apply(&mut row);
        assert!(row[1].is_finite());
        assert!(row[2..].iter().all(|v| *v == f32::NEG_INFINITY));
    }
}
