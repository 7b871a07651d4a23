//! `cargo run --release -p model-loader --example inspect [-- PATH]`: loads a
//! model (default: SmolLM2 GGUF), prints its config and how long each part
//! of loading took.

use model_loader::{gguf, gguf_model, tokenizer};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args().nth(1).map_or_else(
        model_loader::paths::default_model_path,
        std::path::PathBuf::from,
    );
    let t0 = std::time::Instant::now();
    let m = model_loader::load_model(&path)?;
    println!(
        "load_model {} in {:.3} s",
        path.display(),
        t0.elapsed().as_secs_f64()
    );
    if path.extension().is_some_and(|e| e == "gguf") {
        let t = std::time::Instant::now();
        let g = gguf::GgufFile::open(&path)?;
        println!("  parse header: {:.3} s", t.elapsed().as_secs_f64());
        let t = std::time::Instant::now();
        let vocab = tokenizer::gguf::GgufVocab::from_gguf(&g)?;
        let json = serde_json::to_string(&vocab.to_tokenizer_json()?)?;
        println!("  tokenizer json: {:.3} s", t.elapsed().as_secs_f64());
        let t = std::time::Instant::now();
        let _tok = tokenizer::Tokenizer::from_json(json, vocab.special_tokens())?;
        println!("  tokenizer build: {:.3} s", t.elapsed().as_secs_f64());
        let t = std::time::Instant::now();
        let _w = gguf_model::weights_from_gguf(&g, &m.config)?;
        println!("  weights: {:.3} s", t.elapsed().as_secs_f64());
    }
    println!("{:#?}", m.config);
    println!("{:?}", m.tokenizer);
    Ok(())
}
