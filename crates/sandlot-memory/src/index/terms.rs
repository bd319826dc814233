//! Which query terms chunks contain, and how many chunks contain each: the lexical evidence
//! hybrid search weighs (see [`crate::fusion`]).

use std::collections::{HashMap, HashSet};

use rusqlite::OptionalExtension;

use super::{read, sql, Index, IndexError};

impl Index {
    /// For each of `candidates`, which of `terms` (single FTS5 terms, tokenised and stemmed like
    /// the index) it contains, in the order of `terms`: the FTS answer, computed from the
    /// candidates' indexed text (title, body, tags) with the index's tokenizer re-done in Rust,
    /// in one query. Terms that are not one token, and chunks whose text that tokenizer cannot
    /// vouch for (see [`crate::fts_tokens`]), are asked of FTS itself
    /// ([`Index::matched_terms_fts`]).
    pub fn matched_terms(
        &self,
        terms: &[String],
        candidates: &[i64],
    ) -> Result<HashMap<i64, Vec<bool>>, IndexError> {
        let mut matched: HashMap<i64, Vec<bool>> = candidates
            .iter()
            .map(|&id| (id, vec![false; terms.len()]))
            .collect();
        if candidates.is_empty() || terms.is_empty() {
            return Ok(matched);
        }
        // Each term as the index stores it (with its position in `terms`); a term that is not
        // one covered token goes to FTS.
        let mut stems: Vec<(usize, Vec<u8>)> = Vec::new();
        let mut fts_terms: Vec<(usize, String)> = Vec::new();
        for (i, t) in terms.iter().enumerate() {
            match crate::fts_tokens::tokens(t) {
                // Two terms with one stem ("state", "states") each count, as in FTS.
                Ok(mut tok) if tok.len() == 1 => stems.push((i, tok.pop().unwrap_or_default())),
                _ => fts_terms.push((i, t.clone())),
            }
        }
        let mut fts_ids: Vec<i64> = Vec::new();
        let op = || format!("read the text of {} chunks", candidates.len());
        for part in candidates.chunks(500) {
            let list = part
                .iter()
                .map(|i| i.to_string())
                .collect::<Vec<_>>()
                .join(",");
            let mut st = self
                .conn
                .prepare(&format!(
                    "SELECT c.id, c.text, f.title, f.tags FROM chunks c JOIN files f ON f.path = c.path
                     WHERE c.id IN ({list})"
                ))
                .map_err(sql(op()))?;
            let mut rows = st.query([]).map_err(sql(op()))?;
            let mut seen: HashSet<i64> = HashSet::with_capacity(part.len());
            while let Some(r) = rows.next().map_err(sql(op()))? {
                let id: i64 = r.get(0).map_err(sql(op()))?;
                seen.insert(id);
                let text = r
                    .get_ref(1)
                    .and_then(|v| Ok(v.as_str()?))
                    .map_err(sql(op()))?;
                let title = r
                    .get_ref(2)
                    .and_then(|v| Ok(v.as_str()?))
                    .map_err(sql(op()))?;
                let tags = r
                    .get_ref(3)
                    .and_then(|v| Ok(v.as_str()?))
                    .map_err(sql(op()))?;
                let tags: Vec<String> = serde_json::from_str(tags).unwrap_or_default();
                // Which of the terms occur.
                let mut found = vec![false; stems.len()];
                let mut mark = |tok: &[u8]| {
                    for (f, (_, s)) in found.iter_mut().zip(&stems) {
                        if s.as_slice() == tok {
                            *f = true;
                        }
                    }
                };
                let covered = crate::fts_tokens::for_each_token(title, &mut mark)
                    .and_then(|()| crate::fts_tokens::for_each_token(text, &mut mark))
                    .and_then(|()| crate::fts_tokens::for_each_token(&tags.join(" "), &mut mark));
                if covered.is_err() {
                    fts_ids.push(id);
                    continue;
                }
                if let Some(m) = matched.get_mut(&id) {
                    for (f, (i, _)) in found.iter().zip(&stems) {
                        m[*i] |= *f;
                    }
                }
            }
            // Candidates without a chunk row: FTS decides (it has no row for them either).
            fts_ids.extend(part.iter().filter(|id| !seen.contains(id)));
        }
        // Terms the Rust tokenizer does not cover, for every candidate; all terms for the
        // candidates whose text it does not cover.
        let fts_set: HashSet<i64> = fts_ids.iter().copied().collect();
        let covered: Vec<i64> = candidates
            .iter()
            .copied()
            .filter(|id| !fts_set.contains(id))
            .collect();
        let all: Vec<(usize, String)> = terms.iter().cloned().enumerate().collect();
        for (ts, ids) in [(fts_terms, &covered), (all, &fts_ids)] {
            if ts.is_empty() || ids.is_empty() {
                continue;
            }
            let names: Vec<String> = ts.iter().map(|(_, t)| t.clone()).collect();
            for (id, found) in self.matched_terms_fts(&names, ids)? {
                if let Some(m) = matched.get_mut(&id) {
                    for (f, (i, _)) in found.iter().zip(&ts) {
                        m[*i] |= *f;
                    }
                }
            }
        }
        Ok(matched)
    }

    /// [`Index::matched_terms`] by one FTS query per term (the reference, and the fallback for
    /// text the Rust tokenizer does not cover).
    pub fn matched_terms_fts(
        &self,
        terms: &[String],
        candidates: &[i64],
    ) -> Result<HashMap<i64, Vec<bool>>, IndexError> {
        let mut matched: HashMap<i64, Vec<bool>> = candidates
            .iter()
            .map(|&id| (id, vec![false; terms.len()]))
            .collect();
        if candidates.is_empty() {
            return Ok(matched);
        }
        let ids = candidates
            .iter()
            .map(|i| i.to_string())
            .collect::<Vec<_>>()
            .join(",");
        let q =
            format!("SELECT rowid FROM chunks_fts WHERE chunks_fts MATCH ?1 AND rowid IN ({ids})");
        let mut st = self.conn.prepare(&q).map_err(sql("count matched terms"))?;
        for (i, t) in terms.iter().enumerate() {
            let quoted = format!("\"{}\"", t.replace('"', "\"\""));
            let rows = st
                .query_map([quoted], |r| r.get::<_, i64>(0))
                .map_err(sql(format!("count matches of {t:?}")))?;
            for id in rows {
                let id = id.map_err(sql(format!("count matches of {t:?}")))?;
                if let Some(m) = matched.get_mut(&id) {
                    m[i] = true;
                }
            }
        }
        Ok(matched)
    }

    /// How many chunks there are and how many of them contain each of `terms` (single FTS5
    /// terms, as in [`Index::matched_terms`]): the document frequencies behind BM25's weights.
    /// A term is looked up in the full-text index's vocabulary, or counted by FTS itself when
    /// it is not one token the Rust tokenizer covers.
    pub fn term_frequencies(
        &mut self,
        terms: &[String],
    ) -> Result<(usize, Vec<usize>), IndexError> {
        self.ensure_cache()?;
        let chunks = read(&self.cache).ids.len();
        let mut docs = Vec::with_capacity(terms.len());
        for t in terms {
            let n: i64 = match crate::fts_tokens::tokens(t) {
                Ok(tok) if tok.len() == 1 => {
                    let stem = String::from_utf8_lossy(&tok[0]).into_owned();
                    self.conn
                        .prepare_cached("SELECT doc FROM temp.chunks_fts_vocab WHERE term = ?1")
                        .and_then(|mut st| st.query_row([stem], |r| r.get(0)).optional())
                        .map_err(sql(format!("look up {t:?} in the vocabulary")))?
                        .unwrap_or(0)
                }
                _ => {
                    let quoted = format!("\"{}\"", t.replace('"', "\"\""));
                    self.conn
                        .prepare_cached("SELECT count(*) FROM chunks_fts WHERE chunks_fts MATCH ?1")
                        .and_then(|mut st| st.query_row([quoted], |r| r.get(0)))
                        .map_err(sql(format!("count chunks with {t:?}")))?
                }
            };
            docs.push(n.max(0) as usize);
        }
        let most = docs.iter().copied().max().unwrap_or(0);
        Ok((chunks.max(most), docs))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::FileRow;
    use std::path::PathBuf;

    struct TempIndex(PathBuf);
    impl Drop for TempIndex {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn file(path: &str, title: &str, tags: &[&str]) -> FileRow {
        FileRow {
            path: path.into(),
            hash: format!("h-{path}"),
            size: 1,
            mtime_ns: 0,
            mem_id: path.into(),
            title: title.into(),
            kind: None,
            folder: String::new(),
            tags: tags.iter().map(|t| t.to_string()).collect(),
            relations: Vec::new(),
            valid_from: None,
            valid_to: None,
            error: None,
        }
    }

    #[test]
    fn matched_terms_and_term_frequencies_equal_the_fts_answer() {
        let dir = TempIndex(std::env::temp_dir().join(format!(
            "sandlot-memory-matched-terms-{}",
            std::process::id()
        )));
        std::fs::create_dir_all(&dir.0).unwrap();
        let mut idx = Index::open(&dir.0.join("index.sqlite"), "test-model", 4).unwrap();
        let files = [
            // Stemming: "running"/"runs"/"run", "philosophies"/"philosophy".
            (
                "a.md",
                "Running notes",
                &["ops"][..],
                "She runs the philosophies club.\nCafé owners.",
            ),
            // Case and diacritics: "CAFÉ", "Naïve", "résumé".
            (
                "b.md",
                "CAFÉ",
                &[][..],
                "A naïve RÉSUMÉ of the state of things",
            ),
            // Terms only in the title or the tags.
            (
                "c.md",
                "Philosophy of the state",
                &["run", "naive"][..],
                "nothing else here",
            ),
            // Beyond Latin-1: Greek capitals, a combining accent.
            (
                "d.md",
                "Ωmega",
                &[][..],
                "the state runs on Ωmega; cafe\u{301} naive",
            ),
            (
                "e.md",
                "plain",
                &["café"][..],
                "unrelated words only; states, stating",
            ),
        ];
        let mut ids = Vec::new();
        for (path, title, tags, body) in files {
            let chunks = crate::chunk::chunk_body(body, 1, None);
            idx.put_file(&file(path, title, tags), &chunks, &HashMap::new())
                .unwrap();
            ids.extend(idx.chunks_of(path).unwrap().iter().map(|c| c.id));
        }
        ids.push(999_999); // no such chunk
        let term_sets: &[&[&str]] = &[
            &["run", "philosophy", "cafe", "state"],
            &["running", "café", "naïve", "résumé"],
            &["CAFE", "Naive", "states", "ops"],
            &["ωmega", "cafe", "runs"],
            &["zzz", "the", "of"],
            &["state", "states", "stating"],
        ];
        let mut nonzero = 0;
        for terms in term_sets {
            let terms: Vec<String> = terms.iter().map(|t| t.to_string()).collect();
            let got = idx.matched_terms(&terms, &ids).unwrap();
            let want = idx.matched_terms_fts(&terms, &ids).unwrap();
            assert_eq!(got, want, "terms {terms:?}");
            nonzero += want.values().filter(|m| m.contains(&true)).count();
        }
        assert!(nonzero > 10, "the cases match something: {nonzero}");
        // Spot checks of what FTS treats as equal.
        let got = idx
            .matched_terms(&["running".into(), "café".into()], &ids[..2])
            .unwrap();
        assert_eq!(got[&ids[0]], [true, true], "runs ~ running, Café ~ café");
        let got = idx
            .matched_terms(&["zzz".into(), "philosophy".into()], &ids[2..3])
            .unwrap();
        assert_eq!(got[&ids[2]], [false, true], "in the order of the terms");
        // Document frequencies from the vocabulary are the chunks FTS finds for each term.
        for terms in term_sets {
            let terms: Vec<String> = terms.iter().map(|t| t.to_string()).collect();
            let (chunks, docs) = idx.term_frequencies(&terms).unwrap();
            let want: Vec<usize> = terms
                .iter()
                .map(|t| {
                    idx.matched_terms_fts(std::slice::from_ref(t), &ids)
                        .unwrap()
                })
                .map(|m| m.values().filter(|v| v[0]).count())
                .collect();
            assert_eq!(docs, want, "terms {terms:?}");
            assert!(chunks >= docs.iter().copied().max().unwrap_or(0));
        }
        let (_, docs) = idx
            .term_frequencies(&["state".into(), "zzz".into()])
            .unwrap();
        assert_eq!(docs, [4, 0], "state, states and stating share a stem");
    }
}
