//! Ranking quality of memory search: recall@5 and MRR@10 of BM25 alone, vectors alone and
//! hybrid search over an agent's memories (`memories.jsonl`: 165 short notes about a project,
//! its people, incidents, commands and the user's preferences), with the real
//! all-MiniLM-L6-v2 embedder (`bash scripts/setup.d/40-memory.sh` installs it).
//!
//! The questions (`queries.jsonl`) come in two sets: **paraphrase** questions, which mostly do
//! not use the words of the memory they ask about, and **lexical** ones, which do (names,
//! commands, product words). Each set is split in two halves by position (even lines of a set
//! are the "dev" half, odd ones "held-out"), so that a change tuned on one half is checked on
//! the other.
//!
//! ```sh
//! cargo run -p sandlot-memory --example ranking            # the table
//! cargo run -p sandlot-memory --example ranking -- -v      # and each query's ranks
//! ```
//!
//! "worse than best" counts the questions where hybrid ranks the first relevant memory lower
//! than the better of the two single retrievers (a memory outside the top 10 counts as 11).

use std::sync::Arc;

use sandlot_memory::{Author, Embedder, MiniLmEmbedder, SearchMode, SearchQuery, Store};

const MEMORIES: &str = include_str!("memories.jsonl");
const QUERIES: &str = include_str!("queries.jsonl");

#[derive(serde::Deserialize)]
struct Memory {
    id: String,
    title: String,
    tags: Vec<String>,
    body: String,
}

#[derive(serde::Deserialize)]
struct Question {
    set: String,
    q: String,
    relevant: Vec<String>,
}

/// One question's outcome under one mode.
struct Outcome {
    /// Share of the relevant memories in the top 5.
    recall5: f64,
    /// 1-based rank of the first relevant memory within the top 10.
    first: Option<usize>,
}

fn run(store: &Store, q: &Question, mode: SearchMode) -> Outcome {
    let mut sq = SearchQuery::new(q.q.as_str());
    sq.mode = mode;
    sq.limit = 10;
    let hits = store
        .search(&sq)
        .unwrap_or_else(|e| panic!("search {:?}: {e}", q.q));
    let ids: Vec<&str> = hits.iter().map(|h| h.id.as_str()).collect();
    let found5 = q
        .relevant
        .iter()
        .filter(|r| ids.iter().take(5).any(|id| id == r))
        .count();
    Outcome {
        recall5: found5 as f64 / q.relevant.len() as f64,
        first: ids
            .iter()
            .position(|id| q.relevant.iter().any(|r| r == id))
            .map(|p| p + 1),
    }
}

const MODES: [(SearchMode, &str); 3] = [
    (SearchMode::Bm25, "BM25"),
    (SearchMode::Vector, "vector"),
    (SearchMode::Hybrid, "hybrid"),
];

fn main() {
    let verbose = std::env::args().any(|a| a == "-v");
    let memories: Vec<Memory> = MEMORIES
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("memories.jsonl: {e}: {l}")))
        .collect();
    let questions: Vec<Question> = QUERIES
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("queries.jsonl: {e}: {l}")))
        .collect();
    for q in &questions {
        for r in &q.relevant {
            assert!(
                memories.iter().any(|m| &m.id == r),
                "question {:?} names unknown memory {r}",
                q.q
            );
        }
    }

    let embedder: Arc<dyn Embedder> = match MiniLmEmbedder::load_default() {
        Ok(m) => Arc::new(m),
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(1);
        }
    };
    let dir = std::env::temp_dir().join(format!("sandlot-ranking-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let store = Store::init(&dir, embedder, &Author::default()).expect("create the store");
    std::fs::create_dir_all(dir.join("notes")).expect("create notes/");
    for m in &memories {
        // JSON strings and arrays are YAML flow scalars and sequences.
        let text = format!(
            "---\nid: {}\ntitle: {}\ntags: {}\n---\n{}\n",
            m.id,
            serde_json::to_string(&m.title).expect("title"),
            serde_json::to_string(&m.tags).expect("tags"),
            m.body
        );
        std::fs::write(dir.join(format!("notes/{}.md", m.id)), text).expect("write a memory");
    }
    store.sync().expect("index the memories");
    let (files, chunks, _) = store.counts().expect("counts");
    println!(
        "{files} memories ({chunks} chunks), {} questions",
        questions.len()
    );

    // (set, half) -> per mode outcomes.
    let mut rows: Vec<(String, &str, Vec<Vec<Outcome>>)> = Vec::new();
    let mut position: std::collections::HashMap<&str, usize> = Default::default();
    for q in &questions {
        let n = position.entry(q.set.as_str()).or_default();
        let half = if n.is_multiple_of(2) {
            "dev"
        } else {
            "held-out"
        };
        *n += 1;
        let outcomes: Vec<Outcome> = MODES.iter().map(|(m, _)| run(&store, q, *m)).collect();
        if verbose {
            let r = |o: &Outcome| o.first.map_or("-".to_string(), |f| f.to_string());
            println!(
                "{:<10} {:<8} bm25 {:>2} vector {:>2} hybrid {:>2}  {}",
                q.set,
                half,
                r(&outcomes[0]),
                r(&outcomes[1]),
                r(&outcomes[2]),
                q.q
            );
        }
        let row = match rows.iter_mut().find(|(s, h, _)| *s == q.set && *h == half) {
            Some(row) => row,
            None => {
                rows.push((
                    q.set.clone(),
                    half,
                    (0..MODES.len()).map(|_| Vec::new()).collect(),
                ));
                rows.last_mut().expect("just pushed")
            }
        };
        for (i, o) in outcomes.into_iter().enumerate() {
            row.2[i].push(o);
        }
    }
    rows.sort_by(|a, b| (a.0.as_str(), a.1).cmp(&(b.0.as_str(), b.1)));

    println!();
    println!("| set | half | n | BM25 R@5 | BM25 MRR@10 | vector R@5 | vector MRR@10 | hybrid R@5 | hybrid MRR@10 | hybrid worse than best |");
    println!("|---|---|---|---|---|---|---|---|---|---|");
    let print = |set: &str, half: &str, per_mode: &[Vec<&Outcome>]| {
        let n = per_mode[0].len();
        let mut cells = Vec::new();
        for outs in per_mode {
            let r5 = outs.iter().map(|o| o.recall5).sum::<f64>() / n as f64;
            let mrr = outs
                .iter()
                .map(|o| o.first.map_or(0.0, |f| 1.0 / f as f64))
                .sum::<f64>()
                / n as f64;
            cells.push(format!("{r5:.3} | {mrr:.3}"));
        }
        let rank = |o: &Outcome| o.first.unwrap_or(11);
        let worse = (0..n)
            .filter(|&i| rank(per_mode[2][i]) > rank(per_mode[0][i]).min(rank(per_mode[1][i])))
            .count();
        println!("| {set} | {half} | {n} | {} | {worse} |", cells.join(" | "));
    };
    let sets: Vec<String> = {
        let mut s: Vec<String> = rows.iter().map(|r| r.0.clone()).collect();
        s.dedup();
        s
    };
    for set in &sets {
        for (s, half, per_mode) in rows.iter().filter(|r| &r.0 == set) {
            let refs: Vec<Vec<&Outcome>> = per_mode.iter().map(|v| v.iter().collect()).collect();
            print(s, half, &refs);
        }
        let all: Vec<Vec<&Outcome>> = (0..MODES.len())
            .map(|m| {
                rows.iter()
                    .filter(|r| &r.0 == set)
                    .flat_map(|r| r.2[m].iter())
                    .collect()
            })
            .collect();
        print(set, "all", &all);
    }
    let _ = std::fs::remove_dir_all(&dir);
}
