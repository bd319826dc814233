//! The direct MiniLM forward pass gives the embeddings of the previous path (candle's generic
//! BERT over padded batches), on the quality test set and on inputs chosen for the edges: both
//! the small-matrix kernel (short inputs) and the GEMM path (long inputs, batches), truncation at
//! 256 tokens, punctuation and non-ASCII text.

#[path = "reference/candle_bert.rs"]
mod candle_bert;
mod common;

use common::*;
use sandlot_memory::embed::{default_model_dir, dot};
use sandlot_memory::Embedder;

fn agreement(texts: &[&str], reference: &[Vec<f32>], got: &[Vec<f32>], how: &str) -> f32 {
    assert_eq!(got.len(), texts.len());
    let mut worst = 1f32;
    for ((t, want), v) in texts.iter().zip(reference).zip(got) {
        assert_eq!(v.len(), 384);
        let cos = dot(v, want);
        assert!(cos >= 0.9999, "{how}: cosine {cos} for {t:?}");
        worst = worst.min(cos);
    }
    worst
}

#[test]
fn forward_pass_matches_candle_bert() {
    let d = data_dir();
    let mut owned: Vec<String> = Vec::new();
    owned.extend(read_lines(d.join("lee.cor")));
    // Long news stories: several exceed the 256-token window and are truncated.
    owned.extend(
        read_lines(d.join("lee_background.cor"))
            .into_iter()
            .step_by(4),
    );
    owned.extend(PARAPHRASES.iter().map(|(_, q)| q.to_string()));
    for s in [
        "",
        "a",
        "churn",
        "What is the churn of ACME?",
        "Zürich's café served crème brûlée — naïvely priced at €12 (≈ $13)!",
        "東京の天気は晴れです",
        "tokens tokens tokens tokens tokens tokens tokens tokens tokens tokens tokens tokens \
         tokens tokens tokens tokens tokens tokens tokens tokens tokens tokens tokens tokens \
         tokens tokens tokens tokens tokens tokens tokens tokens tokens tokens tokens tokens \
         tokens tokens tokens tokens tokens tokens tokens tokens tokens tokens tokens tokens \
         tokens tokens tokens tokens tokens tokens tokens tokens tokens tokens tokens tokens",
    ] {
        owned.push(s.to_string());
    }
    let texts: Vec<&str> = owned.iter().map(String::as_str).collect();
    assert!(texts.len() >= 150, "{} texts", texts.len());
    let reference = candle_bert::CandleBert::load(&default_model_dir())
        .embed(&texts)
        .unwrap();
    let model = minilm();
    // Batched (the GEMM path for the projections of a batch)...
    let batched = model.embed(&texts).unwrap();
    let worst_batched = agreement(&texts, &reference, &batched, "batch");
    // ... and one text at a time (the small-matrix kernel for short texts, GEMM for long ones).
    let single: Vec<Vec<f32>> = texts
        .iter()
        .map(|t| model.embed(&[t]).unwrap().pop().unwrap())
        .collect();
    let worst_single = agreement(&texts, &reference, &single, "single");
    // A short text alone runs through the 16-bit weights, a batch through the f32 ones: the
    // query vector stays within a cosine of 0.99999 of the f32 pass.
    let mut worst_packed = 1f32;
    for ((t, b), s) in texts.iter().zip(&batched).zip(&single) {
        let cos = dot(b, s);
        assert!(cos >= 0.99999, "16-bit weights: cosine {cos} for {t:?}");
        worst_packed = worst_packed.min(cos);
    }
    println!("worst cosine of the 16-bit query pass to the f32 pass: {worst_packed:.7}");
    println!(
        "{} texts: worst cosine to candle's BERT {worst_batched:.7} batched, {worst_single:.7} one at a time",
        texts.len()
    );
}
