//! Our tokenizers against the reference ids transformers produced: the one we
//! rebuild from GGUF metadata, and loading transformers' exported
//! `tokenizer.json`. Also the chat template against transformers' rendering.

use integration_tests::{default_model_path, fixture_path, load_golden};
use model_loader::{ChatMessage, Tokenizer};

fn check(tok: &Tokenizer, what: &str) {
    let golden = load_golden("smollm2_golden.json");
    let mut cases: Vec<(&str, &[u32])> = golden
        .tokenizer
        .iter()
        .map(|c| (c.text.as_str(), c.ids.as_slice()))
        .collect();
    cases.extend(
        golden
            .cases
            .iter()
            .map(|c| (c.rendered.as_str(), c.prompt_ids.as_slice())),
    );
    for (text, want) in cases {
        let got = tok
            .encode(text, false)
            .unwrap_or_else(|e| panic!("{what}: encode {text:?}: {e}"));
        assert_eq!(got, want, "{what}: ids for {text:?}");
        let back = tok
            .decode(&got, false)
            .unwrap_or_else(|e| panic!("{what}: decode: {e}"));
        assert_eq!(back, text, "{what}: round trip");
    }
}

#[test]
fn gguf_tokenizer_matches_reference() {
    let info = model_loader::load_config_and_tokenizer(&default_model_path()).expect("load");
    check(&info.tokenizer, "GGUF tokenizer");
}

#[test]
fn hf_tokenizer_json_matches_reference() {
    let dir = tempfile::tempdir().expect("tempdir");
    let zip = std::fs::File::open(fixture_path("smollm2_hf_tokenizer.zip")).expect("fixture");
    let mut archive = zip::ZipArchive::new(zip).expect("zip");
    archive.extract(dir.path()).expect("extract");
    let tok = Tokenizer::from_hf_dir(dir.path()).expect("load tokenizer.json");
    check(&tok, "HF tokenizer.json");
}

#[test]
fn chat_template_matches_reference() {
    let info = model_loader::load_config_and_tokenizer(&default_model_path()).expect("load");
    let tmpl = info.chat_template.expect("template");
    let golden = load_golden("smollm2_golden.json");
    for case in golden.cases.iter().filter(|c| c.chat) {
        let got = tmpl
            .render(&[ChatMessage::new("user", case.text.clone())], true)
            .expect("render");
        assert_eq!(got, case.rendered);
    }
}
