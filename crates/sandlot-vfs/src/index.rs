//! Trigram search index: a coarse candidate filter for `grep`/`rg`/`find`-free
//! content search. Trigrams are taken over raw bytes with ASCII letters folded
//! to lowercase, so one index serves case-sensitive and `-i` searches alike.
//! The exact regular-expression match always runs on the candidates.

use std::collections::BTreeSet;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use regex_syntax::hir::{Class, Hir, HirKind};

/// Errors from loading or saving an index.
#[derive(Debug, thiserror::Error)]
pub enum IndexError {
    /// I/O on the index file failed.
    #[error("{op} search index {path}")]
    Io {
        op: &'static str,
        path: PathBuf,
        source: io::Error,
    },
    /// The index file is not in the expected format.
    #[error("search index {path} is corrupt: {reason}")]
    Corrupt { path: PathBuf, reason: &'static str },
}

const MAGIC: &[u8; 8] = b"SLVIDX01";

/// Pack three bytes (ASCII-lowercased) into a trigram key.
fn key(a: u8, b: u8, c: u8) -> u32 {
    (u32::from(a.to_ascii_lowercase()) << 16)
        | (u32::from(b.to_ascii_lowercase()) << 8)
        | u32::from(c.to_ascii_lowercase())
}

/// The sorted, distinct trigrams of a document.
pub fn doc_trigrams(data: &[u8]) -> Vec<u32> {
    if data.len() < 3 {
        return Vec::new();
    }
    // Dense bitmap over the 2^24 key space would be 2 MiB per call; documents are
    // usually small, so collect and sort instead.
    let mut v: Vec<u32> = data.windows(3).map(|w| key(w[0], w[1], w[2])).collect();
    v.sort_unstable();
    v.dedup();
    v
}

/// Encode a trigram list for the blob sidecar cache.
pub fn encode_trigrams(t: &[u32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(t.len() * 3);
    for k in t {
        out.extend_from_slice(&k.to_le_bytes()[..3]);
    }
    out
}

/// Decode a sidecar trigram list; `None` if malformed.
pub fn decode_trigrams(b: &[u8]) -> Option<Vec<u32>> {
    if !b.len().is_multiple_of(3) {
        return None;
    }
    Some(
        b.chunks_exact(3)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], 0]))
            .collect(),
    )
}

/// Inverted index from trigram to the documents (manifest indices) containing it.
#[derive(Debug, Clone, Default)]
pub struct SearchIndex {
    n_docs: u32,
    keys: Vec<u32>,
    offsets: Vec<u32>,
    postings: Vec<u32>,
}

/// A boolean condition over trigrams that every matching document satisfies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Query {
    /// Any document may match.
    All,
    /// No document can match.
    Nothing,
    /// The document contains all these trigrams.
    Trigrams(Vec<u32>),
    /// All sub-queries hold.
    And(Vec<Query>),
    /// At least one sub-query holds.
    Or(Vec<Query>),
}

impl SearchIndex {
    /// Build from per-document trigram lists (`lists[i]` belongs to document `i`).
    pub fn build(lists: &[Vec<u32>]) -> SearchIndex {
        let mut counts = vec![0u32; 1 << 24];
        for l in lists {
            for &k in l {
                counts[k as usize] += 1;
            }
        }
        let mut keys = Vec::new();
        let mut offsets = vec![0u32];
        let mut slot = vec![0u32; 0];
        slot.resize(1 << 24, u32::MAX);
        let mut total = 0u32;
        for (k, &c) in counts.iter().enumerate() {
            if c > 0 {
                slot[k] = keys.len() as u32;
                keys.push(k as u32);
                total += c;
                offsets.push(total);
            }
        }
        drop(counts);
        let mut fill: Vec<u32> = offsets[..keys.len()].to_vec();
        let mut postings = vec![0u32; total as usize];
        for (doc, l) in lists.iter().enumerate() {
            for &k in l {
                let s = slot[k as usize] as usize;
                postings[fill[s] as usize] = doc as u32;
                fill[s] += 1;
            }
        }
        SearchIndex {
            n_docs: lists.len() as u32,
            keys,
            offsets,
            postings,
        }
    }

    /// Number of documents indexed.
    pub fn doc_count(&self) -> u32 {
        self.n_docs
    }

    fn posting(&self, k: u32) -> &[u32] {
        match self.keys.binary_search(&k) {
            Ok(i) => &self.postings[self.offsets[i] as usize..self.offsets[i + 1] as usize],
            Err(_) => &[],
        }
    }

    /// Documents that may satisfy `q`: `None` means "all of them".
    pub fn candidates(&self, q: &Query) -> Option<Vec<bool>> {
        match q {
            Query::All => None,
            _ => {
                let mut out = vec![false; self.n_docs as usize];
                for d in self.eval(q) {
                    out[d as usize] = true;
                }
                Some(out)
            }
        }
    }

    fn eval(&self, q: &Query) -> Vec<u32> {
        match q {
            Query::All => (0..self.n_docs).collect(),
            Query::Nothing => Vec::new(),
            Query::Trigrams(ts) => {
                let mut lists: Vec<&[u32]> = ts.iter().map(|t| self.posting(*t)).collect();
                lists.sort_by_key(|l| l.len());
                let Some((first, rest)) = lists.split_first() else {
                    return (0..self.n_docs).collect();
                };
                let mut acc = first.to_vec();
                for l in rest {
                    acc = intersect(&acc, l);
                    if acc.is_empty() {
                        break;
                    }
                }
                acc
            }
            Query::And(qs) => {
                let mut acc: Option<Vec<u32>> = None;
                for q in qs {
                    if *q == Query::All {
                        continue;
                    }
                    let r = self.eval(q);
                    acc = Some(match acc {
                        None => r,
                        Some(a) => intersect(&a, &r),
                    });
                }
                acc.unwrap_or_else(|| (0..self.n_docs).collect())
            }
            Query::Or(qs) => {
                let mut set = BTreeSet::new();
                for q in qs {
                    set.extend(self.eval(q));
                }
                set.into_iter().collect()
            }
        }
    }

    /// Save to `path` (atomically).
    pub fn save(&self, path: &Path) -> Result<(), IndexError> {
        let mut out = Vec::with_capacity(
            24 + 4 * (self.keys.len() + self.offsets.len() + self.postings.len()),
        );
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&self.n_docs.to_le_bytes());
        out.extend_from_slice(&(self.keys.len() as u32).to_le_bytes());
        out.extend_from_slice(&(self.postings.len() as u32).to_le_bytes());
        for v in self.keys.iter().chain(&self.offsets).chain(&self.postings) {
            out.extend_from_slice(&v.to_le_bytes());
        }
        crate::blob::write_atomic(path, &out).map_err(|source| IndexError::Io {
            op: "write",
            path: path.to_path_buf(),
            source,
        })
    }

    /// Load from `path`.
    pub fn load(path: &Path) -> Result<SearchIndex, IndexError> {
        let data = fs::read(path).map_err(|source| IndexError::Io {
            op: "read",
            path: path.to_path_buf(),
            source,
        })?;
        let corrupt = |reason| IndexError::Corrupt {
            path: path.to_path_buf(),
            reason,
        };
        if data.len() < 20 || &data[..8] != MAGIC {
            return Err(corrupt("bad header"));
        }
        let rd = |i: usize| u32::from_le_bytes([data[i], data[i + 1], data[i + 2], data[i + 3]]);
        let n_docs = rd(8);
        let n_keys = rd(12) as usize;
        let n_post = rd(16) as usize;
        let expect = 20 + 4 * (n_keys + n_keys + 1 + n_post);
        if data.len() != expect {
            return Err(corrupt("wrong length"));
        }
        let words: Vec<u32> = data[20..]
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        let keys = words[..n_keys].to_vec();
        let offsets = words[n_keys..2 * n_keys + 1].to_vec();
        let postings = words[2 * n_keys + 1..].to_vec();
        if offsets.last().copied() != Some(n_post as u32)
            || postings.iter().any(|d| *d >= n_docs)
            || offsets.windows(2).any(|w| w[0] > w[1])
        {
            return Err(corrupt("inconsistent tables"));
        }
        Ok(SearchIndex {
            n_docs,
            keys,
            offsets,
            postings,
        })
    }
}

fn intersect(a: &[u32], b: &[u32]) -> Vec<u32> {
    let (mut i, mut j) = (0, 0);
    let mut out = Vec::new();
    while i < a.len() && j < b.len() {
        match a[i].cmp(&b[j]) {
            std::cmp::Ordering::Less => i += 1,
            std::cmp::Ordering::Greater => j += 1,
            std::cmp::Ordering::Equal => {
                out.push(a[i]);
                i += 1;
                j += 1;
            }
        }
    }
    out
}

/// Exact-string sets are dropped beyond this size (then only a query is kept).
const MAX_EXACT: usize = 64;

/// What the analysis knows about a sub-expression.
struct Info {
    /// Every string it can match (lowercased), if a small set.
    exact: Option<BTreeSet<Vec<u8>>>,
    /// A condition implied by any match.
    query: Query,
}

impl Info {
    fn exact(set: BTreeSet<Vec<u8>>) -> Info {
        Info {
            exact: Some(set),
            query: Query::All,
        }
    }

    fn any() -> Info {
        Info {
            exact: None,
            query: Query::All,
        }
    }

    /// The query including what the exact set implies.
    fn into_query(self) -> Query {
        match self.exact {
            Some(set) => and(self.query, exact_query(&set)),
            None => self.query,
        }
    }
}

fn exact_query(set: &BTreeSet<Vec<u8>>) -> Query {
    if set.is_empty() {
        return Query::Nothing;
    }
    let mut alts = Vec::new();
    for s in set {
        if s.len() < 3 {
            return Query::All;
        }
        let mut t: Vec<u32> = s.windows(3).map(|w| key(w[0], w[1], w[2])).collect();
        t.sort_unstable();
        t.dedup();
        alts.push(Query::Trigrams(t));
    }
    if alts.len() == 1 {
        alts.pop().unwrap_or(Query::All)
    } else {
        Query::Or(alts)
    }
}

fn and(a: Query, b: Query) -> Query {
    match (a, b) {
        (Query::All, q) | (q, Query::All) => q,
        (Query::Nothing, _) | (_, Query::Nothing) => Query::Nothing,
        (Query::And(mut x), Query::And(y)) => {
            x.extend(y);
            Query::And(x)
        }
        (Query::And(mut x), q) | (q, Query::And(mut x)) => {
            x.push(q);
            Query::And(x)
        }
        (a, b) => Query::And(vec![a, b]),
    }
}

fn or(a: Query, b: Query) -> Query {
    match (a, b) {
        (Query::All, _) | (_, Query::All) => Query::All,
        (Query::Nothing, q) | (q, Query::Nothing) => q,
        (Query::Or(mut x), Query::Or(y)) => {
            x.extend(y);
            Query::Or(x)
        }
        (Query::Or(mut x), q) | (q, Query::Or(mut x)) => {
            x.push(q);
            Query::Or(x)
        }
        (a, b) => Query::Or(vec![a, b]),
    }
}

fn lower(b: &[u8]) -> Vec<u8> {
    b.iter().map(|c| c.to_ascii_lowercase()).collect()
}

fn class_strings(c: &Class) -> Option<BTreeSet<Vec<u8>>> {
    let mut set = BTreeSet::new();
    match c {
        Class::Unicode(u) => {
            let mut n = 0u32;
            for r in u.ranges() {
                n += r.end() as u32 - r.start() as u32 + 1;
                if n > 8 {
                    return None;
                }
                for ch in r.start()..=r.end() {
                    let mut buf = [0u8; 4];
                    set.insert(lower(ch.encode_utf8(&mut buf).as_bytes()));
                }
            }
        }
        Class::Bytes(b) => {
            let mut n = 0u32;
            for r in b.ranges() {
                n += u32::from(r.end()) - u32::from(r.start()) + 1;
                if n > 8 {
                    return None;
                }
                for byte in r.start()..=r.end() {
                    set.insert(vec![byte.to_ascii_lowercase()]);
                }
            }
        }
    }
    Some(set)
}

fn cross(a: &BTreeSet<Vec<u8>>, b: &BTreeSet<Vec<u8>>) -> Option<BTreeSet<Vec<u8>>> {
    if a.len() * b.len() > MAX_EXACT {
        return None;
    }
    let mut out = BTreeSet::new();
    for x in a {
        for y in b {
            let mut s = x.clone();
            s.extend_from_slice(y);
            out.insert(s);
        }
    }
    Some(out)
}

fn analyze(h: &Hir) -> Info {
    match h.kind() {
        HirKind::Empty | HirKind::Look(_) => Info::exact(BTreeSet::from([Vec::new()])),
        HirKind::Literal(l) => Info::exact(BTreeSet::from([lower(&l.0)])),
        HirKind::Class(c) => match class_strings(c) {
            Some(set) => Info::exact(set),
            None => Info::any(),
        },
        HirKind::Capture(c) => analyze(&c.sub),
        HirKind::Repetition(r) => {
            if r.min == 0 {
                Info::any()
            } else {
                let inner = analyze(&r.sub);
                if r.min == 1 && r.max == Some(1) {
                    inner
                } else {
                    Info {
                        exact: None,
                        query: inner.into_query(),
                    }
                }
            }
        }
        HirKind::Concat(parts) => {
            let mut query = Query::All;
            let mut cur: Option<BTreeSet<Vec<u8>>> = Some(BTreeSet::from([Vec::new()]));
            for p in parts {
                let info = analyze(p);
                match (cur.take(), info.exact) {
                    (Some(c), Some(e)) => match cross(&c, &e) {
                        Some(x) => cur = Some(x),
                        None => {
                            query = and(query, exact_query(&c));
                            query = and(query, exact_query(&e));
                            cur = Some(BTreeSet::from([Vec::new()]));
                        }
                    },
                    (Some(c), None) => {
                        query = and(query, exact_query(&c));
                        cur = Some(BTreeSet::from([Vec::new()]));
                    }
                    (None, Some(e)) => cur = Some(e),
                    (None, None) => {}
                }
                query = and(query, info.query);
            }
            Info { exact: cur, query }
        }
        HirKind::Alternation(alts) => {
            let infos: Vec<Info> = alts.iter().map(analyze).collect();
            if infos
                .iter()
                .all(|i| i.exact.is_some() && i.query == Query::All)
            {
                let mut set = BTreeSet::new();
                for i in &infos {
                    if let Some(e) = &i.exact {
                        set.extend(e.iter().cloned());
                    }
                }
                if set.len() <= MAX_EXACT {
                    return Info::exact(set);
                }
            }
            let mut q = Query::Nothing;
            for i in infos {
                q = or(q, i.into_query());
            }
            Info {
                exact: None,
                query: q,
            }
        }
    }
}

/// The trigram condition implied by a match of `hir` anywhere in a document.
pub fn query_for_hir(hir: &Hir) -> Query {
    analyze(hir).into_query()
}

/// The condition for any of several patterns.
pub fn query_any(queries: impl IntoIterator<Item = Query>) -> Query {
    queries.into_iter().fold(Query::Nothing, or)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(re: &str) -> Query {
        let hir = regex_syntax::ParserBuilder::new()
            .build()
            .parse(re)
            .unwrap();
        query_for_hir(&hir)
    }

    fn cands(idx: &SearchIndex, re: &str) -> Option<Vec<usize>> {
        idx.candidates(&q(re)).map(|v| {
            v.iter()
                .enumerate()
                .filter(|(_, b)| **b)
                .map(|(i, _)| i)
                .collect()
        })
    }

    #[test]
    fn filters_candidates() {
        let docs: Vec<&[u8]> = vec![
            b"the rate limit is 10",
            b"Rate Limit docs",
            b"nothing",
            b"ratelimit",
        ];
        let lists: Vec<Vec<u32>> = docs.iter().map(|d| doc_trigrams(d)).collect();
        let idx = SearchIndex::build(&lists);
        assert_eq!(cands(&idx, "rate limit"), Some(vec![0, 1]));
        assert_eq!(cands(&idx, "(?i)RATE"), Some(vec![0, 1, 3]));
        assert_eq!(cands(&idx, "rate( |)limit"), Some(vec![0, 1, 3]));
        assert_eq!(cands(&idx, "noth|docs"), Some(vec![1, 2]));
        assert_eq!(cands(&idx, "a.c"), None);
        assert_eq!(cands(&idx, "zzz"), Some(vec![]));
        assert_eq!(cands(&idx, "lim[i]t"), Some(vec![0, 1, 3]));
        assert_eq!(cands(&idx, "x*"), None);
        assert_eq!(cands(&idx, "(rate)+ is"), Some(vec![0]));
    }

    #[test]
    fn unicode_casefold_is_a_superset() {
        // (?i)k also matches KELVIN SIGN; a document spelling it that way must stay a candidate.
        let docs: Vec<&[u8]> = vec!["\u{212A}ey".as_bytes(), b"key", b"other"];
        let lists: Vec<Vec<u32>> = docs.iter().map(|d| doc_trigrams(d)).collect();
        let idx = SearchIndex::build(&lists);
        assert_eq!(cands(&idx, "(?i)key"), Some(vec![0, 1]));
    }

    #[test]
    fn save_load_roundtrip() {
        let d = tempfile::tempdir().unwrap();
        let lists = vec![doc_trigrams(b"hello world"), doc_trigrams(b"world peace")];
        let idx = SearchIndex::build(&lists);
        let p = d.path().join("i.idx");
        idx.save(&p).unwrap();
        let back = SearchIndex::load(&p).unwrap();
        assert_eq!(back.eval(&q("world")), vec![0, 1]);
        assert_eq!(back.eval(&q("peace")), vec![1]);
        fs::write(&p, b"garbage").unwrap();
        assert!(matches!(
            SearchIndex::load(&p),
            Err(IndexError::Corrupt { .. })
        ));
        assert_eq!(
            decode_trigrams(&encode_trigrams(&lists[0])).unwrap(),
            lists[0]
        );
    }
}
