//! Hybrid search over a store: BM25 (SQLite FTS5) and exact vector neighbours fused with
//! reciprocal rank fusion per memory, metadata and validity filters, link expansion.

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
    /// BM25 and vectors fused with reciprocal rank fusion.
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
    /// Fused score (higher is better).
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

/// Reciprocal rank fusion constant.
pub const RRF_K: f64 = 60.0;
/// Distinct query terms a chunk must contain to count as a lexical match in hybrid search:
/// 30% of them rounded up, at least one (1 of 3, 2 of 4, 3 of 8, 4 of 11).
pub fn min_should_match(terms: usize) -> usize {
    (terms * 3).div_ceil(10).max(1)
}

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
                let mut text_hits = if q.mode != SearchMode::Vector {
                    idx.text_search(&fq, k, &filter, &admitted)?
                } else {
                    Vec::new()
                };
                if q.mode == SearchMode::Hybrid {
                    // Minimum-should-match for the lexical list: a chunk sharing one word with
                    // a long natural-language query is not a keyword match, and in rank fusion
                    // such noise would crowd out the semantic matches.
                    let need = min_should_match(terms.len());
                    if need > 1 {
                        let ids: Vec<i64> = text_hits.iter().map(|(id, _)| *id).collect();
                        let counts = if per_term_fts {
                            idx.matched_terms_fts(&terms, &ids)?
                        } else {
                            idx.matched_terms(&terms, &ids)?
                        };
                        text_hits.retain(|(id, _)| counts.get(id).copied().unwrap_or(0) >= need);
                    }
                }
                Ok((idx, text_hits, admitted))
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
        let (mut idx, text_hits, admitted) = lexical?;
        let vec_hits = match embedded {
            None => Vec::new(),
            Some(r) => match r?? {
                (_, Some(hits)) => hits,
                (v, None) => idx.vector_search(&v, k, &admitted)?,
            },
        };
        // Reciprocal rank fusion over memories: each retriever ranks files by their best chunk,
        // so a memory found by both lists gains from both even when different chunks matched.
        // Both candidate lists' chunks in one query.
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
        #[derive(Default)]
        struct Fused {
            score: f64,
            bm25_rank: Option<usize>,
            vector_rank: Option<usize>,
            similarity: Option<f32>,
            chunk: i64,
        }
        let mut fused: HashMap<String, Fused> = HashMap::new();
        for (r, (path, id, _)) in text_files.into_iter().enumerate() {
            let e = fused.entry(path).or_default();
            e.score += 1.0 / (RRF_K + (r + 1) as f64);
            e.bm25_rank = Some(r + 1);
            e.chunk = id;
        }
        for (r, (path, id, sim)) in vec_files.into_iter().enumerate() {
            let e = fused.entry(path).or_default();
            e.score += 1.0 / (RRF_K + (r + 1) as f64);
            e.vector_rank = Some(r + 1);
            e.similarity = sim;
            // The snippet comes from whichever retriever ranked the memory higher.
            if e.bm25_rank.is_none_or(|b| r + 1 < b) {
                e.chunk = id;
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
    fn min_should_match_grows_with_query_length() {
        let got: Vec<usize> = [0, 1, 2, 3, 4, 8, 11]
            .iter()
            .map(|&n| min_should_match(n))
            .collect();
        assert_eq!(got, vec![1, 1, 1, 1, 2, 3, 4]);
    }

    #[test]
    fn snippet_prefers_matching_line() {
        let (line, s) = snippet_of("# T\nfirst\nthe churn rose\nlast", 10, &["churn".into()]);
        assert_eq!(line, 12);
        assert!(s.starts_with("the churn rose"), "{s}");
        let (line, _) = snippet_of("# T\nfirst", 10, &["zzz".into()]);
        assert_eq!(line, 11);
    }
}
