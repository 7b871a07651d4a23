//! SentencePiece GGUF vocabularies (`tokenizer.ggml.model = llama`) on a tiny
//! hand-made vocabulary, so it runs without downloads. The expected ids are
//! worked out by hand from SentencePiece BPE's rule (repeatedly join the
//! adjacent pair whose joined piece is best; bytes no piece covers become
//! `<0xNN>` pieces), not produced by the code under test. The real Gemma-3
//! file is checked against transformers in tests/tests/golden_models.rs.

use model_loader::gguf::writer::GgufWriter;
use model_loader::gguf::{GgufFile, MetaValue};
use model_loader::tokenizer::gguf::tokenizer_from_gguf;
use model_loader::Tokenizer;

const NORMAL: i32 = 1;
const CONTROL: i32 = 3;
const BYTE: i32 = 6;
/// Id of `<0x00>`; byte `b` is `BYTE0 + b`.
const BYTE0: u32 = 4;
const FIRST_PIECE: u32 = BYTE0 + 256;
/// Pieces after the byte tokens, best first (score = -id), except `bc`.
const PIECES: &[&str] = &[
    "\u{2581}",
    "h",
    "e",
    "l",
    "o",
    "w",
    "r",
    "d",
    "he",
    "ll",
    "hell",
    "hello",
    "\u{2581}w",
    "or",
    "\u{2581}wor",
    "lo",
    "1",
    "2",
    "a",
    "b",
    "c",
    "ab",
    "bc",
];

fn piece(p: &str) -> u32 {
    FIRST_PIECE + PIECES.iter().position(|x| *x == p).expect("piece") as u32
}

/// A GGUF holding only the tokenizer of architecture `arch`.
fn spm_tokenizer(arch: &str, add_bos: Option<bool>) -> Tokenizer {
    let mut tokens: Vec<String> = ["<pad>", "<eos>", "<bos>", "<unk>"]
        .map(String::from)
        .to_vec();
    let mut types = vec![CONTROL, CONTROL, CONTROL, 2];
    tokens.extend((0..=255u32).map(|b| format!("<0x{b:02X}>")));
    types.extend([BYTE; 256]);
    tokens.extend(PIECES.iter().map(|p| p.to_string()));
    types.extend(PIECES.iter().map(|_| NORMAL));
    let scores: Vec<f32> = tokens
        .iter()
        .enumerate()
        .map(|(id, t)| match t.as_str() {
            // Best by score, last by position: tells the two rankings apart.
            "bc" => 10.0,
            _ if id < FIRST_PIECE as usize => 0.0,
            _ => -(id as f32),
        })
        .collect();
    let strs = |v: Vec<String>| MetaValue::Array(v.into_iter().map(MetaValue::String).collect());
    let mut g = GgufWriter::new();
    g.meta("general.architecture", MetaValue::String(arch.into()))
        .meta("tokenizer.ggml.model", MetaValue::String("llama".into()))
        .meta("tokenizer.ggml.tokens", strs(tokens))
        .meta(
            "tokenizer.ggml.scores",
            MetaValue::Array(scores.into_iter().map(MetaValue::F32).collect()),
        )
        .meta(
            "tokenizer.ggml.token_type",
            MetaValue::Array(types.into_iter().map(MetaValue::I32).collect()),
        )
        .meta("tokenizer.ggml.bos_token_id", MetaValue::U32(2))
        .meta("tokenizer.ggml.eos_token_id", MetaValue::U32(1))
        .meta("tokenizer.ggml.unknown_token_id", MetaValue::U32(3));
    if let Some(b) = add_bos {
        g.meta("tokenizer.ggml.add_bos_token", MetaValue::Bool(b));
    }
    if arch == "gemma3" {
        g.meta("tokenizer.ggml.add_space_prefix", MetaValue::Bool(false));
    }
    let file = GgufFile::parse(g.to_bytes().expect("serialize")).expect("parse");
    tokenizer_from_gguf(&file).expect("tokenizer")
}

fn enc(t: &Tokenizer, text: &str) -> Vec<u32> {
    t.encode(text, false).expect("encode")
}

#[test]
fn gemma_style_merges_by_position_and_marks_spaces() {
    let t = spm_tokenizer("gemma3", None);
    // he, ll, hell, hello, then ▁w, or, ▁wor; "l" "d" stay apart (no "ld").
    let want = vec![piece("hello"), piece("\u{2581}wor"), piece("l"), piece("d")];
    assert_eq!(enc(&t, "hello world"), want);
    // No space is prepended; a leading space is its own ▁.
    assert_eq!(enc(&t, " hello"), vec![piece("\u{2581}"), piece("hello")]);
    // Ranked by position: "ab" (earlier) beats "bc" (higher score).
    assert_eq!(enc(&t, "abc"), vec![piece("ab"), piece("c")]);
    // Digits without a joined piece stay single.
    assert_eq!(enc(&t, "12"), vec![piece("1"), piece("2")]);
    for text in ["hello world", " hello", "abc", "12", "h\u{e9}llo \u{1F980}"] {
        assert_eq!(
            t.decode(&enc(&t, text), false).expect("decode"),
            text,
            "{text:?}"
        );
    }
}

#[test]
fn byte_fallback_for_uncovered_characters() {
    let t = spm_tokenizer("gemma3", None);
    // é = C3 A9, 🦀 = F0 9F A6 80.
    let b = |x: u32| BYTE0 + x;
    assert_eq!(enc(&t, "\u{e9}"), vec![b(0xC3), b(0xA9)]);
    assert_eq!(
        enc(&t, "h\u{1F980}"),
        vec![piece("h"), b(0xF0), b(0x9F), b(0xA6), b(0x80)]
    );
    assert_eq!(t.token_bytes(b(0xC3)), Some(vec![0xC3]));
    assert_eq!(t.token_bytes(piece("\u{2581}wor")), Some(b" wor".to_vec()));
}

#[test]
fn bos_added_by_default_and_control_tokens_whole() {
    let t = spm_tokenizer("gemma3", None);
    assert!(t.add_bos_token());
    assert_eq!(t.bos_token_id(), Some(2));
    assert_eq!(t.eos_token_ids(), &[1]);
    assert_eq!(
        t.encode("hello", true).expect("encode"),
        vec![2, piece("hello")]
    );
    assert_eq!(enc(&t, "<eos>hello"), vec![1, piece("hello")]);
    assert!(t.is_special(1) && !t.is_special(piece("hello")));
    assert_eq!(
        t.decode(&[2, piece("hello"), 1], true).expect("decode"),
        "hello"
    );
    // The file can turn BOS off.
    let off = spm_tokenizer("gemma3", Some(false));
    assert_eq!(
        off.encode("hello", true).expect("encode"),
        vec![piece("hello")]
    );
}

#[test]
fn llama_style_prefix_space_and_score_ranking() {
    let t = spm_tokenizer("llama", None);
    // "▁hello▁world": the prepended ▁ has no piece to join with.
    assert_eq!(
        enc(&t, "hello world"),
        vec![
            piece("\u{2581}"),
            piece("hello"),
            piece("\u{2581}wor"),
            piece("l"),
            piece("d")
        ]
    );
    // Ranked by score: "bc" (score 10) beats "ab".
    assert_eq!(
        enc(&t, "abc"),
        vec![piece("\u{2581}"), piece("a"), piece("bc")]
    );
    // The decoder drops the prepended space.
    assert_eq!(
        t.decode(&enc(&t, "hello world"), false).expect("decode"),
        "hello world"
    );
}
