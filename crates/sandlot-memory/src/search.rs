//! Hybrid search over a store: BM25 (SQLite FTS5) and exact vector neighbours, each memory
//! scored by both retrievers' evidence (see [`crate::fusion`]), metadata and validity filters,
//! link expansion.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use serde::Serialize;

use crate::index::{ChunkFilter, VectorSearcher};
use crate::store::{lock, Result, Store, StoreError};

/// Validity filter of a search.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Validity {
    /// Memories valid now (superseded ones are hidden). The default.
    #[default]
    Now,
    /// Memories valid at this UNIX time.
    At(i64),
    /// Everything, including superseded and expired memories.
    Any,
}

/// Which retrievers to use.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SearchMode {
    /// BM25 and vectors: cosine similarity plus a bonus for the share of the query's terms a
    /// memory contains (see [`crate::fusion`]).
    #[default]
    Hybrid,
    Bm25,
    Vector,
}

/// A search request.
#[derive(Debug, Clone, serde::Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SearchQuery {
    pub text: String,
    #[serde(default = "default_limit")]
    pub limit: usize,
    #[serde(default)]
    pub tags: Vec<String>,
    #[serde(default, rename = "type")]
    pub kind: Option<String>,
    #[serde(default)]
    pub folder: Option<String>,
    #[serde(default)]
    pub valid: Validity,
    #[serde(default)]
    pub mode: SearchMode,
    /// Follow links of each hit one hop.
    #[serde(default)]
    pub expand: bool,
}

fn default_limit() -> usize {
    10
}

impl SearchQuery {
    pub fn new(text: impl Into<String>) -> SearchQuery {
        SearchQuery {
            text: text.into(),
            limit: 10,
            tags: Vec::new(),
            kind: None,
            folder: None,
            valid: Validity::Now,
            mode: SearchMode::Hybrid,
            expand: false,
        }
    }
}

/// A memory reached from a hit through a link.
#[derive(Debug, Clone, Serialize)]
pub struct Related {
    pub path: String,
    pub id: String,
    pub title: String,
    /// The link as written (id or path).
    pub via: String,
}

/// One search result: the best-matching chunk of a memory.
#[derive(Debug, Clone, Serialize)]
pub struct SearchHit {
    pub path: String,
    pub id: String,
    pub title: String,
    /// 1-based line of the snippet in the file.
    pub line: usize,
    /// Lines of the matching chunk.
    pub chunk_lines: (usize, usize),
    /// Ranking score, higher is better: in hybrid mode the cosine similarity plus the lexical
    /// bonus ([`crate::fusion::hybrid_score`]), in vector mode the cosine similarity, in BM25
    /// mode FTS5's bm25 negated.
    pub score: f64,
    pub snippet: String,
    /// Rank (1-based) of this memory in the BM25 list, if present there.
    pub bm25_rank: Option<usize>,
    /// Rank (1-based) of this memory in the vector list, if present there.
    pub vector_rank: Option<usize>,
    /// Cosine similarity of the chunk to the query, if the vector retriever saw it.
    pub similarity: Option<f32>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub related: Vec<Related>,
}

/// How hybrid search computes its text side; both give the same results.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum TextSide {
    /// Which query terms a BM25 candidate contains is read from the candidates' text with the
    /// index's tokenizer re-done in Rust (one query), and the query embedder takes the second
    /// core only once BM25 is done. The default.
    #[default]
    Tokenized,
    /// One FTS query per query term, and the query embedder on both cores from the start,
    /// competing with BM25 (the path before; the benchmark's peer).
    PerTermFts,
}

/// Vector hits: (chunk id, cosine), best first.
type Neighbours = Vec<(i64, f32)>;

/// Query words for FTS5: alphanumeric tokens, stop words dropped, OR-ed, each quoted.
pub(crate) fn fts_query(text: &str) -> String {
    // A common English stop list (function words only).
    const STOP: &[&str] = &[
        "a", "about", "after", "again", "all", "also", "am", "an", "and", "any", "are", "as", "at",
        "be", "because", "been", "before", "being", "between", "both", "but", "by", "can", "could",
        "did", "do", "does", "doing", "during", "each", "few", "for", "from", "further", "had",
        "has", "have", "having", "he", "her", "here", "hers", "him", "his", "how", "i", "if", "in",
        "into", "is", "it", "its", "itself", "just", "me", "more", "most", "my", "no", "nor",
        "not", "now", "of", "off", "on", "once", "only", "or", "other", "our", "ours", "out",
        "over", "own", "same", "she", "should", "so", "some", "such", "than", "that", "the",
        "their", "them", "then", "there", "these", "they", "this", "those", "through", "to", "too",
        "under", "until", "up", "us", "very", "was", "we", "were", "what", "when", "where",
        "which", "while", "who", "whom", "why", "will", "with", "would", "you", "your", "yours",
    ];
    let mut seen = HashSet::new();
    let mut terms = Vec::new();
    for w in text.split(|c: char| !c.is_alphanumeric()) {
        let w = w.to_lowercase();
        if w.is_empty() || STOP.contains(&w.as_str()) || !seen.insert(w.clone()) {
            continue;
        }
        terms.push(format!("\"{w}\""));
    }
    terms.join(" OR ")
}

impl Store {
    /// Hybrid search (see [`SearchQuery`]).
    pub fn search(&self, q: &SearchQuery) -> Result<Vec<SearchHit>> {
        if q.text.trim().is_empty() {
            return Err(StoreError::Invalid("search text is empty".into()));
        }
        let limit = q.limit.clamp(1, 1000);
        let filter = crate::index::Filter {
            tags: q.tags.clone(),
            kind: q.kind.clone(),
            folder: q.folder.clone(),
            valid_at: match q.valid {
                Validity::Now => Some(chrono::Utc::now().timestamp()),
                Validity::At(t) => Some(t),
                Validity::Any => None,
            },
        };
        // Candidates per retriever: enough that de-duplicating per file still fills `limit`.
        let k = (limit * 5).max(50);
        let fq = fts_query(&q.text);
        let terms: Vec<String> = fq
            .split(" OR ")
            .map(|t| t.trim_matches('"').to_string())
            .filter(|t| !t.is_empty())
            .collect();
        // The query is embedded on a second thread while BM25 runs on this one; the embedder
        // takes the second core for itself only once BM25 is done (no two threads per core),
        // and then scans the vector matrix on that thread, without waiting for BM25 (on one
        // core while BM25 still runs, on all once it is done).
        let embedder = &self.embedder;
        let lexical_done = AtomicBool::new(false);
        let per_term_fts = self.per_term_fts.load(Ordering::Relaxed);
        let (embedded, lexical) = std::thread::scope(|s| {
            // The matrix and the filter, handed over by this thread once it has them.
            let (to_vector, from_lexical) =
                std::sync::mpsc::channel::<(VectorSearcher, Arc<ChunkFilter>)>();
            let emb = (q.mode != SearchMode::Bm25).then(|| {
                let lexical_done = &lexical_done;
                s.spawn(move || -> Result<(Vec<f32>, Option<Neighbours>)> {
                    if per_term_fts {
                        let v = embedder.embed(&[q.text.as_str()])?.pop();
                        return Ok((v.unwrap_or_default(), None));
                    }
                    let v = embedder.embed_query(q.text.as_str(), lexical_done)?;
                    let Ok((searcher, admitted)) = from_lexical.recv() else {
                        // The text side failed before the scan could start; it reports why.
                        return Ok((v, None));
                    };
                    let threads = if lexical_done.load(Ordering::Acquire) {
                        crate::index::scan_threads()
                    } else {
                        1
                    };
                    let hits = searcher.search(&v, k, &admitted, threads);
                    Ok((v, Some(hits)))
                })
            });
            let lexical = (|| -> Result<_> {
                let mut idx = lock(&self.index);
                let admitted = Arc::new(idx.chunk_filter(&filter)?);
                if emb.is_some() && !per_term_fts {
                    // A send fails only if the embedding thread has ended (with an error).
                    let _ = to_vector.send((idx.vector_searcher()?, admitted.clone()));
                }
                let text_hits = if q.mode != SearchMode::Vector {
                    idx.text_search(&fq, k, &filter, &admitted)?
                } else {
                    Vec::new()
                };
                // Hybrid search weighs a lexical match by the share of the query's information
                // it holds: which terms each candidate contains, and how rare each term is.
                let mut coverage: HashMap<i64, f64> = HashMap::new();
                if q.mode == SearchMode::Hybrid && !text_hits.is_empty() {
                    let ids: Vec<i64> = text_hits.iter().map(|(id, _)| *id).collect();
                    let matched = if per_term_fts {
                        idx.matched_terms_fts(&terms, &ids)?
                    } else {
                        idx.matched_terms(&terms, &ids)?
                    };
                    let (chunks, docs) = idx.term_frequencies(&terms)?;
                    let idf: Vec<f64> = docs
                        .iter()
                        .map(|&d| crate::fusion::idf(d, chunks))
                        .collect();
                    coverage = matched
                        .into_iter()
                        .map(|(id, present)| (id, crate::fusion::coverage(&idf, &present)))
                        .collect();
                }
                Ok((idx, text_hits, coverage, admitted))
            })();
            drop(to_vector);
            // This thread's work is done: the embedder may use the second core now.
            lexical_done.store(true, Ordering::Release);
            let embedded = emb.map(|h| {
                h.join()
                    .map_err(|_| StoreError::Invalid("the query embedder panicked".into()))
            });
            (embedded, lexical)
        });
        let (mut idx, text_hits, coverage, admitted) = lexical?;
        let (query_vector, vec_hits) = match embedded {
            None => (Vec::new(), Vec::new()),
            Some(r) => match r?? {
                (v, Some(hits)) => (v, hits),
                (v, None) => {
                    let hits = idx.vector_search(&v, k, &admitted)?;
                    (v, hits)
                }
            },
        };
        // Each retriever ranks memories by their best chunk, so a memory found by both lists
        // gains from both even when different chunks matched. Both candidate lists' chunks in
        // one query.
        let mut ids: Vec<i64> = text_hits
            .iter()
            .map(|(id, _)| *id)
            .chain(vec_hits.iter().map(|(id, _)| *id))
            .collect();
        ids.sort_unstable();
        ids.dedup();
        let chunks = idx.chunks_by_id(&ids)?;
        let per_file = |ids: &mut dyn Iterator<Item = (i64, Option<f32>)>| {
            let mut seen = HashSet::new();
            let mut out = Vec::new();
            for (id, sim) in ids {
                let Some(c) = chunks.get(&id) else { continue };
                if seen.insert(c.path.as_str()) {
                    out.push((c.path.clone(), id, sim));
                }
            }
            out
        };
        let text_files = per_file(&mut text_hits.iter().map(|(id, _)| (*id, None)));
        let vec_files = per_file(&mut vec_hits.iter().map(|(id, s)| (*id, Some(*s))));
        let bm25_of: HashMap<i64, f64> = text_hits.iter().copied().collect();
        #[derive(Default)]
        struct Fused {
            score: f64,
            bm25_rank: Option<usize>,
            vector_rank: Option<usize>,
            similarity: Option<f32>,
            /// Coverage of the query by the memory's best BM25 chunk (hybrid mode).
            coverage: f64,
            chunk: i64,
        }
        let mut fused: HashMap<String, Fused> = HashMap::new();
        for (r, (path, id, _)) in text_files.into_iter().enumerate() {
            let e = fused.entry(path).or_default();
            e.bm25_rank = Some(r + 1);
            e.coverage = coverage.get(&id).copied().unwrap_or(0.0);
            e.score = -bm25_of.get(&id).copied().unwrap_or(0.0);
            e.chunk = id;
        }
        for (r, (path, id, sim)) in vec_files.into_iter().enumerate() {
            let e = fused.entry(path).or_default();
            e.vector_rank = Some(r + 1);
            e.similarity = sim;
            // The snippet comes from whichever retriever ranked the memory higher.
            if e.bm25_rank.is_none_or(|b| r + 1 < b) {
                e.chunk = id;
            }
        }
        match q.mode {
            SearchMode::Bm25 => {}
            SearchMode::Vector => {
                for e in fused.values_mut() {
                    e.score = e.similarity.map_or(f64::NEG_INFINITY, f64::from);
                }
            }
            SearchMode::Hybrid => {
                // A memory only the lexical list has is scored by its BM25 chunk's similarity.
                let missing: Vec<i64> = fused
                    .values()
                    .filter(|e| e.similarity.is_none())
                    .map(|e| e.chunk)
                    .collect();
                let sims = idx.similarities(&query_vector, &missing)?;
                for e in fused.values_mut() {
                    if e.similarity.is_none() {
                        e.similarity = sims.get(&e.chunk).copied();
                    }
                    e.score = crate::fusion::hybrid_score(e.similarity.unwrap_or(0.0), e.coverage);
                }
            }
        }
        let mut ranked: Vec<(String, Fused)> = fused.into_iter().collect();
        ranked.sort_by(|a, b| b.1.score.total_cmp(&a.1.score).then_with(|| a.0.cmp(&b.0)));
        ranked.truncate(limit);
        let mut hits: Vec<SearchHit> = Vec::new();
        for (path, f) in ranked {
            let Some(c) = chunks.get(&f.chunk) else {
                continue;
            };
            let Some(row) = idx.file(&path)? else {
                continue;
            };
            let (line, snippet) = snippet_of(&c.text, c.line, &terms);
            hits.push(SearchHit {
                path,
                id: row.mem_id,
                title: row.title,
                line,
                chunk_lines: (c.line, c.end_line),
                score: f.score,
                snippet,
                bm25_rank: f.bm25_rank,
                vector_rank: f.vector_rank,
                similarity: f.similarity,
                related: Vec::new(),
            });
        }
        if q.expand {
            for h in &mut hits {
                let Some(row) = idx.file(&h.path)? else {
                    continue;
                };
                for rel in &row.relations {
                    let target = if idx.file(rel)?.is_some() {
                        Some(rel.clone())
                    } else if idx.file(&format!("{rel}.md"))?.is_some() {
                        Some(format!("{rel}.md"))
                    } else {
                        idx.path_of_id(rel)?
                    };
                    let Some(t) = target else { continue };
                    if t == h.path {
                        continue;
                    }
                    if let Some(tr) = idx.file(&t)? {
                        h.related.push(Related {
                            path: tr.path,
                            id: tr.mem_id,
                            title: tr.title,
                            via: rel.clone(),
                        });
                    }
                }
            }
        }
        Ok(hits)
    }
}

/// The line of `text` (starting at file line `first`) best showing `terms`, trimmed to ~240
/// characters; the chunk's opening otherwise.
fn snippet_of(text: &str, first: usize, terms: &[String]) -> (usize, String) {
    let lines: Vec<&str> = text.lines().collect();
    let mut best = (0usize, 0usize);
    for (i, l) in lines.iter().enumerate() {
        let ll = l.to_lowercase();
        let n = terms.iter().filter(|t| ll.contains(t.as_str())).count();
        if n > best.1 {
            best = (i, n);
        }
    }
    // Skip blank/heading-only openings when nothing matched.
    if best.1 == 0 {
        if let Some(i) = lines
            .iter()
            .position(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
        {
            best.0 = i;
        }
    }
    let mut s = String::new();
    for l in lines.iter().skip(best.0) {
        if !s.is_empty() {
            s.push(' ');
        }
        s.push_str(l.trim());
        if s.chars().count() >= 240 {
            break;
        }
    }
    if s.chars().count() > 240 {
        s = s.chars().take(239).collect::<String>() + "…";
    }
    (first + best.0, s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fts_query_drops_stop_words_and_quotes() {
        assert_eq!(
            fts_query("What is the churn of ACME?"),
            "\"churn\" OR \"acme\""
        );
        assert_eq!(fts_query("\"; DROP"), "\"drop\"");
        assert_eq!(fts_query("the of"), "");
    }

    #[test]
    fn snippet_prefers_matching_line() {
        let (line, s) = snippet_of("# T\nfirst\nthe churn rose\nlast", 10, &["churn".into()]);
        assert_eq!(line, 12);
        assert!(s.starts_with("the churn rose"), "{s}");
        let (line, _) = snippet_of("# T\nfirst", 10, &["zzz".into()]);
        assert_eq!(line, 11);
    }

    /// A bag-of-concepts embedder: the words of each group below share one dimension (the
    /// synonyms and paraphrases a sentence model knows), every other word of three letters or
    /// more has a hashed dimension of its own. Vectors thus find a paraphrase that shares no
    /// word with its memory, as all-MiniLM-L6-v2 does, without the model in a unit test.
    struct ConceptEmbedder;

    const CONCEPTS: &[&[&str]] = &[
        &["car", "automobile", "vehicle", "drive"],
        &["leave", "park", "parking", "garage"],
        &["office", "work", "workplace"],
        &["cost", "costs", "price", "euros", "charge"],
        &["meet", "meets", "meeting", "together"],
    ];
    const DIM: usize = 64;

    impl crate::Embedder for ConceptEmbedder {
        fn model_id(&self) -> &str {
            "test-concepts"
        }
        fn dim(&self) -> usize {
            DIM
        }
        fn embed(&self, texts: &[&str]) -> std::result::Result<Vec<Vec<f32>>, crate::EmbedError> {
            Ok(texts
                .iter()
                .map(|t| {
                    let mut v = vec![0f32; DIM];
                    for w in t.split(|c: char| !c.is_alphanumeric()) {
                        let w = w.to_lowercase();
                        if w.chars().count() < 3 {
                            continue;
                        }
                        let slot = match CONCEPTS.iter().position(|g| g.contains(&w.as_str())) {
                            Some(c) => c,
                            None => {
                                let h = w.bytes().fold(0xcbf29ce484222325u64, |h, b| {
                                    (h ^ b as u64).wrapping_mul(0x100000001b3)
                                });
                                CONCEPTS.len() + (h % (DIM - CONCEPTS.len()) as u64) as usize
                            }
                        };
                        v[slot] += 1.0;
                    }
                    crate::embed::normalize(v)
                })
                .collect())
        }
    }

    struct TempStore(std::path::PathBuf, Store);

    impl Drop for TempStore {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// A store of `(id, title, body)` memories embedded by [`ConceptEmbedder`].
    fn store_of(tag: &str, memories: &[(&str, &str, &str)]) -> TempStore {
        let dir = std::env::temp_dir().join(format!(
            "sandlot-memory-ranking-{tag}-{}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        let store = Store::init(&dir, Arc::new(ConceptEmbedder), &crate::Author::default())
            .expect("create a store");
        std::fs::create_dir_all(dir.join("notes")).unwrap();
        for (id, title, body) in memories {
            std::fs::write(
                dir.join(format!("notes/{id}.md")),
                format!("---\nid: {id}\ntitle: {title}\n---\n{body}\n"),
            )
            .unwrap();
        }
        store.sync().unwrap();
        TempStore(dir, store)
    }

    /// 1-based rank of memory `id` for `text` searched in `mode`.
    fn rank_of(store: &Store, text: &str, mode: SearchMode, id: &str) -> Option<usize> {
        let mut q = SearchQuery::new(text);
        q.mode = mode;
        let hits = store.search(&q).unwrap();
        hits.iter().position(|h| h.id == id).map(|p| p + 1)
    }

    /// Memories of an agent about a team; `parking` answers the paraphrased question below
    /// without sharing a word with it, and the question's common words ("leave", "work") are in
    /// half of the others, as in a real store.
    const TEAM: &[(&str, &str, &str)] = &[
        (
            "parking",
            "Parking near the office",
            "The nearest garage for a car is on Rua do Comercio, 18 euros a day.",
        ),
        (
            "remote",
            "Remote work",
            "Everyone may work from home; the team meets at the office on Wednesdays.",
        ),
        (
            "leave-policy",
            "Holiday leave",
            "Leave requests go to the manager two weeks ahead; work is handed over first.",
        ),
        (
            "errors",
            "Error codes",
            "Every API error has a stable code like E1042 documented in the errors page.",
        ),
        (
            "expenses",
            "Expense policy",
            "Expenses under 100 euros need no approval; receipts within 30 days.",
        ),
        (
            "standup",
            "Standup",
            "The standup is at 09:45 before work starts; leave a written update when away.",
        ),
        (
            "on-call",
            "On-call",
            "The on-call engineer may leave work early the day after a night page.",
        ),
        (
            "laptop",
            "Laptop",
            "Work laptops run Fedora; never leave one unlocked in the office.",
        ),
    ];

    #[test]
    fn hybrid_keeps_a_paraphrase_the_vectors_rank_first_on_top() {
        let s = store_of("paraphrase", TEAM);
        let question = "where do I leave the automobile at work?";
        let vector = rank_of(&s.1, question, SearchMode::Vector, "parking");
        // The premise: the words are not the memory's, its meaning is.
        assert_eq!(vector, Some(1), "the vectors find the paraphrase");
        assert_eq!(rank_of(&s.1, question, SearchMode::Bm25, "parking"), None);
        // Memories sharing the question's generic words ("leave", "work") must not pass it.
        assert_eq!(
            rank_of(&s.1, question, SearchMode::Hybrid, "parking"),
            Some(1),
            "hybrid ranks the memory lower than the vectors alone"
        );
    }

    #[test]
    fn hybrid_keeps_an_exact_keyword_match_on_top() {
        let s = store_of("lexical", TEAM);
        for (question, id) in [
            ("error E1042", "errors"),
            ("garage Rua do Comercio", "parking"),
            ("leave requests manager", "leave-policy"),
            ("Fedora laptops unlocked", "laptop"),
        ] {
            assert_eq!(
                rank_of(&s.1, question, SearchMode::Bm25, id),
                Some(1),
                "{question}"
            );
            assert_eq!(
                rank_of(&s.1, question, SearchMode::Hybrid, id),
                Some(1),
                "hybrid ranks the keyword match of {question:?} lower than BM25"
            );
        }
    }
}
