//! The search index: one SQLite file (FTS5 for BM25, vectors as blobs) plus an in-memory
//! vector matrix for exact nearest-neighbour scans.
//!
//! The index is a cache of the store's files: every row can be rebuilt from them. Vectors are
//! keyed by (chunk content hash, model id), so moving a file or reverting to content seen before
//! embeds nothing, and vectors of another model are simply absent until re-embedded.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use rusqlite::{params, Connection, OptionalExtension};

use crate::chunk::Chunk;

mod terms;

/// Errors from the index database.
#[derive(Debug, thiserror::Error)]
pub enum IndexError {
    #[error("open index {path}: {source}")]
    Open {
        path: PathBuf,
        #[source]
        source: rusqlite::Error,
    },
    #[error("index {op}: {source}")]
    Sql {
        op: String,
        #[source]
        source: rusqlite::Error,
    },
    #[error("index schema version {found} in {path} is not {expected}; run reindex")]
    Schema {
        path: PathBuf,
        found: String,
        expected: &'static str,
    },
}

fn sql(op: impl Into<String>) -> impl FnOnce(rusqlite::Error) -> IndexError {
    let op = op.into();
    move |source| IndexError::Sql { op, source }
}

const SCHEMA_VERSION: &str = "1";

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS files(
    path TEXT PRIMARY KEY,
    hash TEXT NOT NULL,
    size INTEGER NOT NULL,
    mtime_ns INTEGER NOT NULL,
    mem_id TEXT NOT NULL,
    title TEXT NOT NULL,
    kind TEXT,
    folder TEXT NOT NULL,
    tags TEXT NOT NULL,
    relations TEXT NOT NULL,
    valid_from INTEGER,
    valid_to INTEGER,
    error TEXT
);
CREATE INDEX IF NOT EXISTS files_mem_id ON files(mem_id);
CREATE TABLE IF NOT EXISTS chunks(
    id INTEGER PRIMARY KEY,
    path TEXT NOT NULL,
    ord INTEGER NOT NULL,
    line INTEGER NOT NULL,
    end_line INTEGER NOT NULL,
    hash TEXT NOT NULL,
    text TEXT NOT NULL,
    titled INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS chunks_path ON chunks(path);
CREATE INDEX IF NOT EXISTS chunks_hash ON chunks(hash);
CREATE VIRTUAL TABLE IF NOT EXISTS chunks_fts USING fts5(title, body, tags, tokenize = 'porter unicode61');
CREATE TABLE IF NOT EXISTS vectors(
    hash TEXT NOT NULL,
    model TEXT NOT NULL,
    vec BLOB NOT NULL,
    PRIMARY KEY(hash, model)
) WITHOUT ROWID;
";

/// What the index knows about one file.
#[derive(Debug, Clone, PartialEq)]
pub struct FileRow {
    pub path: String,
    pub hash: String,
    pub size: u64,
    pub mtime_ns: i64,
    pub mem_id: String,
    pub title: String,
    pub kind: Option<String>,
    pub folder: String,
    pub tags: Vec<String>,
    pub relations: Vec<String>,
    pub valid_from: Option<i64>,
    pub valid_to: Option<i64>,
    /// Why the file's front matter could not be used (it is indexed as plain text then).
    pub error: Option<String>,
}

/// A chunk row as stored.
#[derive(Debug, Clone)]
pub struct ChunkRow {
    pub id: i64,
    pub path: String,
    pub line: usize,
    pub end_line: usize,
    pub hash: String,
    pub text: String,
}

/// Metadata filters shared by both retrievers.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    pub tags: Vec<String>,
    pub kind: Option<String>,
    pub folder: Option<String>,
    /// Only memories valid at this UNIX time.
    pub valid_at: Option<i64>,
}

impl Filter {
    fn is_selective(&self) -> bool {
        !self.tags.is_empty() || self.kind.is_some() || self.folder.is_some()
    }

    /// SQL condition over `files f` and its parameters.
    fn where_sql(&self) -> (String, Vec<rusqlite::types::Value>) {
        use rusqlite::types::Value;
        let mut conds = vec!["1".to_string()];
        let mut ps = Vec::new();
        for t in &self.tags {
            conds.push("EXISTS (SELECT 1 FROM json_each(f.tags) WHERE json_each.value = ?)".into());
            ps.push(Value::Text(t.clone()));
        }
        if let Some(k) = &self.kind {
            conds.push("f.kind = ?".into());
            ps.push(Value::Text(k.clone()));
        }
        if let Some(d) = &self.folder {
            let d = d.trim_matches('/');
            conds.push("(f.folder = ? OR f.folder LIKE ? ESCAPE '\\')".into());
            ps.push(Value::Text(d.to_string()));
            let esc = d
                .replace('\\', "\\\\")
                .replace('%', "\\%")
                .replace('_', "\\_");
            ps.push(Value::Text(format!("{esc}/%")));
        }
        if let Some(t) = self.valid_at {
            conds.push("(f.valid_from IS NULL OR f.valid_from <= ?)".into());
            conds.push("(f.valid_to IS NULL OR f.valid_to > ?)".into());
            ps.push(Value::Integer(t));
            ps.push(Value::Integer(t));
        }
        (conds.join(" AND "), ps)
    }
}

/// Which chunks a search may return.
#[derive(Debug, Clone)]
pub enum ChunkFilter {
    All,
    Include(HashSet<i64>),
    Exclude(HashSet<i64>),
}

impl ChunkFilter {
    #[inline]
    pub fn admits(&self, id: i64) -> bool {
        match self {
            ChunkFilter::All => true,
            ChunkFilter::Include(s) => s.contains(&id),
            ChunkFilter::Exclude(s) => !s.contains(&id),
        }
    }

    fn rejected_len(&self) -> usize {
        match self {
            ChunkFilter::Exclude(s) => s.len(),
            _ => 0,
        }
    }
}

/// The in-memory matrix of the active model's chunk vectors: f32 rows (exact scores) and an
/// int8 copy with one scale per row (the scan reads a quarter of the memory).
#[derive(Default)]
struct VectorCache {
    loaded: bool,
    dim: usize,
    ids: Vec<i64>,
    data: Vec<f32>,
    /// Row-major int8 quantisation of `data`: `q8[i] * scale[row] ~= data[i]`.
    q8: Vec<i8>,
    scale: Vec<f32>,
    pos: HashMap<i64, usize>,
}

/// Symmetric int8 quantisation of `v` into `out`; returns the scale.
pub(crate) fn quantize(v: &[f32], out: &mut [i8]) -> f32 {
    let max = v.iter().fold(0f32, |m, x| m.max(x.abs()));
    if max == 0.0 || !max.is_finite() {
        out.iter_mut().for_each(|o| *o = 0);
        return 0.0;
    }
    let inv = 127.0 / max;
    for (o, x) in out.iter_mut().zip(v) {
        *o = (x * inv).round().clamp(-127.0, 127.0) as i8;
    }
    max / 127.0
}

/// The `cap` best (approximate score, row) of rows `first..` in `q8` (int8 rows of `dim`)
/// that `admit` accepts, best first.
fn scan_q8(
    q: &[i8],
    q8: &[i8],
    scale: &[f32],
    first: usize,
    dim: usize,
    cap: usize,
    admit: &dyn Fn(usize) -> bool,
) -> Vec<(f32, usize)> {
    // A small sorted buffer: most rows are rejected by one comparison with its floor.
    let mut best: Vec<(f32, usize)> = Vec::with_capacity(cap + 1);
    let mut floor = f32::NEG_INFINITY;
    crate::kernels::scan_i8(q, q8, dim, &mut |i, dot| {
        let r = first + i;
        let s = dot as f32 * scale[r];
        if s <= floor || !admit(r) {
            return;
        }
        let at = best.partition_point(|e| e.0 >= s);
        best.insert(at, (s, r));
        if best.len() > cap {
            best.pop();
            floor = best[cap - 1].0;
        }
    });
    best
}

/// The f32 dot product of the path before the int8 scan (portable SSE2, eight accumulators),
/// kept so that the benchmark's peer measures that path.
fn dot_portable(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let ca = a.chunks_exact(8);
    let cb = b.chunks_exact(8);
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for k in 0..8 {
            acc[k] += x[k] * y[k];
        }
    }
    let mut s: f32 = acc.iter().sum();
    for (x, y) in ra.iter().zip(rb) {
        s += x * y;
    }
    s
}

impl VectorCache {
    fn insert(&mut self, id: i64, v: &[f32]) {
        let dim = self.dim;
        if let Some(&p) = self.pos.get(&id) {
            self.data[p * dim..(p + 1) * dim].copy_from_slice(v);
            self.scale[p] = quantize(v, &mut self.q8[p * dim..(p + 1) * dim]);
            return;
        }
        self.pos.insert(id, self.ids.len());
        self.ids.push(id);
        self.data.extend_from_slice(v);
        let at = self.q8.len();
        self.q8.resize(at + dim, 0);
        let s = quantize(v, &mut self.q8[at..]);
        self.scale.push(s);
    }

    fn remove(&mut self, id: i64) {
        let Some(p) = self.pos.remove(&id) else {
            return;
        };
        let dim = self.dim;
        let last = self.ids.len() - 1;
        if p != last {
            let moved = self.ids[last];
            self.ids[p] = moved;
            self.pos.insert(moved, p);
            let (head, tail) = self.data.split_at_mut(last * dim);
            head[p * dim..(p + 1) * dim].copy_from_slice(&tail[..dim]);
            let (head, tail) = self.q8.split_at_mut(last * dim);
            head[p * dim..(p + 1) * dim].copy_from_slice(&tail[..dim]);
            self.scale[p] = self.scale[last];
        }
        self.ids.pop();
        self.data.truncate(last * dim);
        self.q8.truncate(last * dim);
        self.scale.pop();
    }

    /// Exact top `k` (id, cosine) of unit vector `q` among admitted rows: an int8 scan
    /// (split over `threads`) keeps `RERANK_FACTOR * k` candidates, which are then rescored
    /// exactly in f32.
    fn search(&self, q: &[f32], k: usize, filter: &ChunkFilter, threads: usize) -> Vec<(i64, f32)> {
        let dim = self.dim;
        let rows = self.ids.len();
        if rows == 0 || k == 0 {
            return Vec::new();
        }
        let mut qq = vec![0i8; dim];
        quantize(q, &mut qq);
        let cap = (k * RERANK_FACTOR).max(RERANK_MIN);
        let admit = |r: usize| filter.admits(self.ids[r]);
        let parts = if rows >= PARALLEL_MIN_ROWS {
            threads.max(1)
        } else {
            1
        };
        let per = rows.div_ceil(parts);
        let mut cands: Vec<(f32, usize)> = if parts == 1 {
            scan_q8(&qq, &self.q8, &self.scale, 0, dim, cap, &admit)
        } else {
            std::thread::scope(|s| {
                let handles: Vec<_> = (0..parts)
                    .map(|p| {
                        let (lo, hi) = (p * per, ((p + 1) * per).min(rows));
                        let (qq, q8, scale, admit) = (&qq, &self.q8, &self.scale, &admit);
                        s.spawn(move || {
                            scan_q8(qq, &q8[lo * dim..hi * dim], scale, lo, dim, cap, admit)
                        })
                    })
                    .collect();
                handles
                    .into_iter()
                    .flat_map(|h| h.join().unwrap_or_default())
                    .collect()
            })
        };
        // Exact rerank of the candidates.
        let mut out: Vec<(i64, f32)> = cands
            .drain(..)
            .map(|(_, r)| {
                (
                    self.ids[r],
                    crate::embed::dot(q, &self.data[r * dim..(r + 1) * dim]),
                )
            })
            .collect();
        out.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        out.truncate(k);
        out
    }

    /// Exact top `k` by a single-threaded f32 scan of every row (the path before the int8
    /// scan; kept as the benchmark peer and the tests' reference).
    fn search_exact(&self, q: &[f32], k: usize, filter: &ChunkFilter) -> Vec<(i64, f32)> {
        let mut best: Vec<(i64, f32)> = Vec::with_capacity(k + 1);
        let mut floor = f32::NEG_INFINITY;
        for (i, row) in self.data.chunks_exact(self.dim).enumerate() {
            let s = dot_portable(q, row);
            if best.len() >= k && s <= floor {
                continue;
            }
            let id = self.ids[i];
            if !filter.admits(id) {
                continue;
            }
            let at = best.partition_point(|e| e.1 > s || (e.1 == s && e.0 < id));
            best.insert(at, (id, s));
            if best.len() > k {
                best.pop();
            }
            if best.len() >= k {
                floor = best[best.len() - 1].1;
            }
        }
        best
    }
}

/// How the vector retriever scans the matrix.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum VectorScan {
    /// int8 scan over all cores, exact f32 rerank of the best candidates (the default).
    #[default]
    Quantized,
    /// Single-threaded exact f32 scan of every row (the benchmark's peer).
    Exact,
}

/// Candidates kept by the int8 scan per requested neighbour, rescored exactly.
const RERANK_FACTOR: usize = 4;
const RERANK_MIN: usize = 200;
/// Below this many rows the scan runs on the calling thread alone.
const PARALLEL_MIN_ROWS: usize = 16_384;

/// The index of one store.
pub struct Index {
    conn: Connection,
    path: PathBuf,
    model: String,
    dim: usize,
    /// Shared with [`VectorSearcher`]s: a scan runs without holding the index.
    cache: Arc<RwLock<VectorCache>>,
    scan: VectorScan,
}

fn read(c: &RwLock<VectorCache>) -> RwLockReadGuard<'_, VectorCache> {
    c.read().unwrap_or_else(|p| p.into_inner())
}

fn write(c: &RwLock<VectorCache>) -> RwLockWriteGuard<'_, VectorCache> {
    c.write().unwrap_or_else(|p| p.into_inner())
}

/// Vector search over the index's matrix without holding the index, so that a scan can run on
/// one thread while another asks the index full-text queries. Writers to the index wait for a
/// running scan.
pub struct VectorSearcher {
    cache: Arc<RwLock<VectorCache>>,
    scan: VectorScan,
    dim: usize,
}

impl VectorSearcher {
    /// Exact nearest neighbours of unit vector `q`: (chunk id, cosine), best first; the int8
    /// scan is split over `threads` (this one included).
    pub fn search(
        &self,
        q: &[f32],
        k: usize,
        filter: &ChunkFilter,
        threads: usize,
    ) -> Vec<(i64, f32)> {
        if q.len() != self.dim {
            return Vec::new();
        }
        let c = read(&self.cache);
        match self.scan {
            VectorScan::Quantized => c.search(q, k, filter, threads),
            VectorScan::Exact => c.search_exact(q, k, filter),
        }
    }
}

/// Threads a vector scan may use: the cores, at most 4.
pub fn scan_threads() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .min(4)
}

fn blob_of(v: &[f32]) -> Vec<u8> {
    let mut b = Vec::with_capacity(v.len() * 4);
    for x in v {
        b.extend_from_slice(&x.to_le_bytes());
    }
    b
}

fn vec_of(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

impl Index {
    /// Opens (creating if needed) the index file at `path` for vectors of `model` (`dim` wide).
    pub fn open(path: &Path, model: &str, dim: usize) -> Result<Index, IndexError> {
        let open_err = |source| IndexError::Open {
            path: path.to_path_buf(),
            source,
        };
        let conn = Connection::open(path).map_err(open_err)?;
        // Reads through a memory map: a full-text query touches many pages of a large index, and
        // reading each with a system call showed in search profiles.
        conn.execute_batch(
            "PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL; PRAGMA busy_timeout = 5000;
             PRAGMA mmap_size = 1073741824;",
        )
        .map_err(open_err)?;
        conn.execute_batch(SCHEMA).map_err(open_err)?;
        // How many chunks hold each term (hybrid search weighs query terms by it); a view of
        // the full-text index of this connection only, never written.
        conn.execute_batch(
            "CREATE VIRTUAL TABLE IF NOT EXISTS temp.chunks_fts_vocab
             USING fts5vocab(main, chunks_fts, row);",
        )
        .map_err(open_err)?;
        let found: Option<String> = conn
            .query_row("SELECT value FROM meta WHERE key = 'schema'", [], |r| {
                r.get(0)
            })
            .optional()
            .map_err(open_err)?;
        match found {
            None => {
                conn.execute(
                    "INSERT INTO meta(key, value) VALUES ('schema', ?1)",
                    [SCHEMA_VERSION],
                )
                .map_err(open_err)?;
            }
            Some(v) if v == SCHEMA_VERSION => {}
            Some(v) => {
                return Err(IndexError::Schema {
                    path: path.to_path_buf(),
                    found: v,
                    expected: SCHEMA_VERSION,
                })
            }
        }
        Ok(Index {
            conn,
            path: path.to_path_buf(),
            model: model.to_string(),
            dim,
            cache: Arc::new(RwLock::new(VectorCache {
                dim,
                ..Default::default()
            })),
            scan: VectorScan::default(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn model(&self) -> &str {
        &self.model
    }

    pub fn file(&self, path: &str) -> Result<Option<FileRow>, IndexError> {
        self.conn
            .prepare_cached(
                "SELECT path, hash, size, mtime_ns, mem_id, title, kind, folder, tags, relations,
                        valid_from, valid_to, error FROM files WHERE path = ?1",
            )
            .map_err(sql(format!("read file row {path}")))?
            .query_row([path], file_row)
            .optional()
            .map_err(sql(format!("read file row {path}")))
    }

    pub fn files(&self) -> Result<Vec<FileRow>, IndexError> {
        let mut st = self
            .conn
            .prepare_cached(
                "SELECT path, hash, size, mtime_ns, mem_id, title, kind, folder, tags, relations,
                        valid_from, valid_to, error FROM files ORDER BY path",
            )
            .map_err(sql("list files"))?;
        let rows = st.query_map([], file_row).map_err(sql("list files"))?;
        rows.collect::<Result<Vec<_>, _>>()
            .map_err(sql("list files"))
    }

    /// The path of the memory with front matter id (or derived id) `id`.
    pub fn path_of_id(&self, id: &str) -> Result<Option<String>, IndexError> {
        self.conn
            .query_row(
                "SELECT path FROM files WHERE mem_id = ?1 ORDER BY path LIMIT 1",
                [id],
                |r| r.get(0),
            )
            .optional()
            .map_err(sql(format!("look up id {id}")))
    }

    /// Which of `hashes` have no stored vector of the active model.
    pub fn missing_vectors(&self, hashes: &[&str]) -> Result<HashSet<String>, IndexError> {
        let mut st = self
            .conn
            .prepare_cached("SELECT 1 FROM vectors WHERE hash = ?1 AND model = ?2")
            .map_err(sql("look up vectors"))?;
        let mut missing = HashSet::new();
        for h in hashes {
            let found = st
                .exists(params![h, self.model])
                .map_err(sql("look up vectors"))?;
            if !found {
                missing.insert(h.to_string());
            }
        }
        Ok(missing)
    }

    /// Replaces everything indexed for `row.path` with `chunks`; `new_vectors` holds vectors
    /// (hash → vector) for chunk hashes that had none.
    pub fn put_file(
        &mut self,
        row: &FileRow,
        chunks: &[Chunk],
        new_vectors: &HashMap<String, Vec<f32>>,
    ) -> Result<(), IndexError> {
        let op = format!("index {}", row.path);
        let tx = self.conn.transaction().map_err(sql(op.clone()))?;
        let removed = delete_file_rows(&tx, &row.path).map_err(sql(op.clone()))?;
        tx.execute(
            "INSERT INTO files(path, hash, size, mtime_ns, mem_id, title, kind, folder, tags,
                               relations, valid_from, valid_to, error)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)",
            params![
                row.path,
                row.hash,
                row.size as i64,
                row.mtime_ns,
                row.mem_id,
                row.title,
                row.kind,
                row.folder,
                serde_json::to_string(&row.tags).unwrap_or_else(|_| "[]".into()),
                serde_json::to_string(&row.relations).unwrap_or_else(|_| "[]".into()),
                row.valid_from,
                row.valid_to,
                row.error,
            ],
        )
        .map_err(sql(op.clone()))?;
        for (h, v) in new_vectors {
            tx.execute(
                "INSERT OR REPLACE INTO vectors(hash, model, vec) VALUES (?1, ?2, ?3)",
                params![h, self.model, blob_of(v)],
            )
            .map_err(sql(op.clone()))?;
        }
        let tags = row.tags.join(" ");
        let mut inserted = Vec::with_capacity(chunks.len());
        {
            let mut ins = tx
                .prepare_cached(
                    "INSERT INTO chunks(path, ord, line, end_line, hash, text, titled)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                )
                .map_err(sql(op.clone()))?;
            let mut fts = tx
                .prepare_cached(
                    "INSERT INTO chunks_fts(rowid, title, body, tags) VALUES (?1, ?2, ?3, ?4)",
                )
                .map_err(sql(op.clone()))?;
            let mut getv = tx
                .prepare_cached("SELECT vec FROM vectors WHERE hash = ?1 AND model = ?2")
                .map_err(sql(op.clone()))?;
            for (ord, c) in chunks.iter().enumerate() {
                ins.execute(params![
                    row.path,
                    ord as i64,
                    c.line as i64,
                    c.end_line as i64,
                    c.hash,
                    c.text,
                    c.embed_text != c.text
                ])
                .map_err(sql(op.clone()))?;
                let id = tx.last_insert_rowid();
                fts.execute(params![id, row.title, c.text, tags])
                    .map_err(sql(op.clone()))?;
                let v: Option<Vec<u8>> = match new_vectors.get(&c.hash) {
                    Some(v) => Some(blob_of(v)),
                    None => getv
                        .query_row(params![c.hash, self.model], |r| r.get(0))
                        .optional()
                        .map_err(sql(op.clone()))?,
                };
                inserted.push((id, v));
            }
        }
        tx.commit().map_err(sql(op))?;
        let mut cache = write(&self.cache);
        if cache.loaded {
            for id in removed {
                cache.remove(id);
            }
            for (id, v) in inserted {
                if let Some(b) = v {
                    let v = vec_of(&b);
                    if v.len() == self.dim {
                        cache.insert(id, &v);
                    }
                }
            }
        }
        Ok(())
    }

    /// Updates only the stat fields of an unchanged file (after a touch or checkout).
    pub fn touch_file(&mut self, path: &str, size: u64, mtime_ns: i64) -> Result<(), IndexError> {
        self.conn
            .execute(
                "UPDATE files SET size = ?2, mtime_ns = ?3 WHERE path = ?1",
                params![path, size as i64, mtime_ns],
            )
            .map_err(sql(format!("update stat of {path}")))?;
        Ok(())
    }

    /// Removes every row of `path` (its vectors stay until [`Index::gc_vectors`]).
    pub fn remove_file(&mut self, path: &str) -> Result<(), IndexError> {
        let op = format!("remove {path} from index");
        let tx = self.conn.transaction().map_err(sql(op.clone()))?;
        let removed = delete_file_rows(&tx, path).map_err(sql(op.clone()))?;
        tx.commit().map_err(sql(op))?;
        let mut cache = write(&self.cache);
        if cache.loaded {
            for id in removed {
                cache.remove(id);
            }
        }
        Ok(())
    }

    /// Deletes vectors whose content hash no chunk references any more.
    pub fn gc_vectors(&mut self) -> Result<usize, IndexError> {
        self.conn
            .execute(
                "DELETE FROM vectors WHERE hash NOT IN (SELECT hash FROM chunks)",
                [],
            )
            .map_err(sql("collect unreferenced vectors"))
    }

    /// Chunks with no vector of the active model (after a model change), at most `limit`:
    /// (content hash, text to embed).
    pub fn chunks_without_vectors(
        &self,
        limit: usize,
    ) -> Result<Vec<(String, String)>, IndexError> {
        let mut st = self
            .conn
            .prepare_cached(
                "SELECT c.hash, CASE WHEN c.titled THEN f.title || char(10) || c.text ELSE c.text END
                 FROM chunks c JOIN files f ON f.path = c.path
                 WHERE NOT EXISTS (SELECT 1 FROM vectors v WHERE v.hash = c.hash AND v.model = ?1)
                 GROUP BY c.hash LIMIT ?2",
            )
            .map_err(sql("list chunks without vectors"))?;
        let rows = st
            .query_map(params![self.model, limit as i64], |r| {
                Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?))
            })
            .map_err(sql("list chunks without vectors"))?;
        rows.collect::<Result<Vec<_>, _>>()
            .map_err(sql("list chunks without vectors"))
    }

    /// Stores vectors for existing chunks (background re-embedding).
    pub fn put_vectors(&mut self, vectors: &HashMap<String, Vec<f32>>) -> Result<(), IndexError> {
        let tx = self.conn.transaction().map_err(sql("store vectors"))?;
        let mut ids = Vec::new();
        {
            let mut put = tx
                .prepare_cached(
                    "INSERT OR REPLACE INTO vectors(hash, model, vec) VALUES (?1, ?2, ?3)",
                )
                .map_err(sql("store vectors"))?;
            let mut q = tx
                .prepare_cached("SELECT id FROM chunks WHERE hash = ?1")
                .map_err(sql("store vectors"))?;
            for (h, v) in vectors {
                put.execute(params![h, self.model, blob_of(v)])
                    .map_err(sql("store vectors"))?;
                let rows = q
                    .query_map([h], |r| r.get::<_, i64>(0))
                    .map_err(sql("store vectors"))?;
                for id in rows {
                    ids.push((id.map_err(sql("store vectors"))?, h.clone()));
                }
            }
        }
        tx.commit().map_err(sql("store vectors"))?;
        let mut cache = write(&self.cache);
        if cache.loaded {
            for (id, h) in ids {
                cache.insert(id, &vectors[&h]);
            }
        }
        Ok(())
    }

    /// Counts: (files, chunks, chunks with a vector of the active model).
    pub fn counts(&self) -> Result<(usize, usize, usize), IndexError> {
        self.conn
            .query_row(
                "SELECT (SELECT count(*) FROM files), (SELECT count(*) FROM chunks),
                        (SELECT count(*) FROM chunks c WHERE EXISTS
                            (SELECT 1 FROM vectors v WHERE v.hash = c.hash AND v.model = ?1))",
                [&self.model],
                |r| {
                    Ok((
                        r.get::<_, i64>(0)? as usize,
                        r.get::<_, i64>(1)? as usize,
                        r.get::<_, i64>(2)? as usize,
                    ))
                },
            )
            .map_err(sql("count rows"))
    }

    /// Drops every row (the files are the truth; a rebuild follows).
    pub fn clear(&mut self, keep_vectors: bool) -> Result<(), IndexError> {
        let mut batch =
            String::from("DELETE FROM files; DELETE FROM chunks; DELETE FROM chunks_fts;");
        if !keep_vectors {
            batch.push_str("DELETE FROM vectors;");
        }
        self.conn
            .execute_batch(&batch)
            .map_err(sql("clear index"))?;
        *write(&self.cache) = VectorCache {
            dim: self.dim,
            ..Default::default()
        };
        Ok(())
    }

    pub fn begin_bulk(&self) -> Result<(), IndexError> {
        self.conn
            .execute_batch("BEGIN")
            .map_err(sql("begin bulk load"))
    }

    pub fn end_bulk(&self) -> Result<(), IndexError> {
        self.conn
            .execute_batch("COMMIT")
            .map_err(sql("commit bulk load"))
    }

    fn ensure_cache(&mut self) -> Result<(), IndexError> {
        if read(&self.cache).loaded {
            return Ok(());
        }
        let mut cache = VectorCache {
            dim: self.dim,
            loaded: true,
            ..Default::default()
        };
        let mut st = self
            .conn
            .prepare(
                "SELECT c.id, v.vec FROM chunks c JOIN vectors v ON v.hash = c.hash AND v.model = ?1",
            )
            .map_err(sql("load vectors"))?;
        let mut rows = st.query([&self.model]).map_err(sql("load vectors"))?;
        while let Some(r) = rows.next().map_err(sql("load vectors"))? {
            let id: i64 = r.get(0).map_err(sql("load vectors"))?;
            let b = r.get_ref(1).map_err(sql("load vectors"))?;
            let b = b.as_blob().map_err(|e| IndexError::Sql {
                op: "load vectors".into(),
                source: rusqlite::Error::FromSqlConversionFailure(
                    1,
                    rusqlite::types::Type::Blob,
                    Box::new(e),
                ),
            })?;
            if b.len() == self.dim * 4 {
                cache.insert(id, &vec_of(b));
            }
        }
        drop(rows);
        drop(st);
        *write(&self.cache) = cache;
        Ok(())
    }

    /// The chunk ids `filter` admits (`Include`) or rejects (`Exclude`), whichever set is
    /// expected to be smaller: metadata filters admit few, validity alone rejects few.
    pub fn chunk_filter(&self, filter: &Filter) -> Result<ChunkFilter, IndexError> {
        if !filter.is_selective() && filter.valid_at.is_none() {
            return Ok(ChunkFilter::All);
        }
        let (cond, ps) = filter.where_sql();
        let include = filter.is_selective();
        let q = if include {
            format!("SELECT c.id FROM files f CROSS JOIN chunks c ON c.path = f.path WHERE {cond}")
        } else {
            // Validity alone: only files with a bound can fail it, so the scan touches those
            // files' chunks, not every chunk of the store.
            format!(
                "SELECT c.id FROM files f CROSS JOIN chunks c ON c.path = f.path
                 WHERE (f.valid_from IS NOT NULL OR f.valid_to IS NOT NULL) AND NOT ({cond})"
            )
        };
        let mut st = self.conn.prepare_cached(&q).map_err(sql("filter chunks"))?;
        let rows = st
            .query_map(rusqlite::params_from_iter(ps), |r| r.get::<_, i64>(0))
            .map_err(sql("filter chunks"))?;
        let set = rows
            .collect::<Result<HashSet<_>, _>>()
            .map_err(sql("filter chunks"))?;
        Ok(if include {
            ChunkFilter::Include(set)
        } else {
            ChunkFilter::Exclude(set)
        })
    }

    /// Exact nearest neighbours of unit vector `q`: (chunk id, cosine), best first.
    pub fn vector_search(
        &mut self,
        q: &[f32],
        k: usize,
        filter: &ChunkFilter,
    ) -> Result<Vec<(i64, f32)>, IndexError> {
        Ok(self.vector_searcher()?.search(q, k, filter, scan_threads()))
    }

    /// A [`VectorSearcher`] over this index's matrix (loaded into memory first if needed).
    pub fn vector_searcher(&mut self) -> Result<VectorSearcher, IndexError> {
        self.ensure_cache()?;
        Ok(VectorSearcher {
            cache: self.cache.clone(),
            scan: self.scan,
            dim: self.dim,
        })
    }

    /// Selects how vector search scans the matrix.
    pub fn set_vector_scan(&mut self, scan: VectorScan) {
        self.scan = scan;
    }

    /// BM25 over title, body and tags: (chunk id, bm25 score where lower is better), best first.
    pub fn text_search(
        &self,
        fts_query: &str,
        k: usize,
        filter: &Filter,
        chunks: &ChunkFilter,
    ) -> Result<Vec<(i64, f64)>, IndexError> {
        if fts_query.is_empty() || k == 0 {
            return Ok(Vec::new());
        }
        let op = || format!("full-text search {fts_query:?}");
        if filter.is_selective() {
            // Few chunks qualify: let SQLite join and filter.
            let (cond, ps) = filter.where_sql();
            let q = format!(
                "SELECT chunks_fts.rowid, bm25(chunks_fts, 2.0, 1.0, 1.5) AS s FROM chunks_fts
                 JOIN chunks c ON c.id = chunks_fts.rowid JOIN files f ON f.path = c.path
                 WHERE chunks_fts MATCH ? AND {cond} ORDER BY s LIMIT ?"
            );
            let mut all = vec![rusqlite::types::Value::Text(fts_query.to_string())];
            all.extend(ps);
            all.push(rusqlite::types::Value::Integer(k as i64));
            let mut st = self.conn.prepare_cached(&q).map_err(sql(op()))?;
            let rows = st
                .query_map(rusqlite::params_from_iter(all), |r| {
                    Ok((r.get::<_, i64>(0)?, r.get::<_, f64>(1)?))
                })
                .map_err(sql(op()))?;
            return rows.collect::<Result<Vec<_>, _>>().map_err(sql(op()));
        }
        // Otherwise rank in FTS alone and drop the few rejected chunks afterwards, fetching
        // more when too many were dropped.
        let mut st = self
            .conn
            .prepare_cached(
                "SELECT rowid, bm25(chunks_fts, 2.0, 1.0, 1.5) AS s FROM chunks_fts
                 WHERE chunks_fts MATCH ?1 ORDER BY s LIMIT ?2",
            )
            .map_err(sql(op()))?;
        let mut fetch = k + chunks.rejected_len().min(4 * k);
        loop {
            let rows = st
                .query_map(params![fts_query, fetch as i64], |r| {
                    Ok((r.get::<_, i64>(0)?, r.get::<_, f64>(1)?))
                })
                .map_err(sql(op()))?;
            let got = rows.collect::<Result<Vec<_>, _>>().map_err(sql(op()))?;
            let exhausted = got.len() < fetch;
            let mut kept: Vec<(i64, f64)> = got
                .into_iter()
                .filter(|(id, _)| chunks.admits(*id))
                .collect();
            if kept.len() >= k || exhausted {
                kept.truncate(k);
                return Ok(kept);
            }
            fetch *= 4;
        }
    }

    /// Cosine similarity of unit vector `q` to each of the chunks `ids` that has a vector.
    pub fn similarities(
        &mut self,
        q: &[f32],
        ids: &[i64],
    ) -> Result<HashMap<i64, f32>, IndexError> {
        self.ensure_cache()?;
        let c = read(&self.cache);
        if q.len() != c.dim {
            return Ok(HashMap::new());
        }
        Ok(ids
            .iter()
            .filter_map(|id| {
                let p = *c.pos.get(id)?;
                Some((
                    *id,
                    crate::embed::dot(q, &c.data[p * c.dim..(p + 1) * c.dim]),
                ))
            })
            .collect())
    }

    pub fn chunk(&self, id: i64) -> Result<Option<ChunkRow>, IndexError> {
        self.conn
            .prepare_cached("SELECT id, path, line, end_line, hash, text FROM chunks WHERE id = ?1")
            .map_err(sql(format!("read chunk {id}")))?
            .query_row([id], |r| {
                Ok(ChunkRow {
                    id: r.get(0)?,
                    path: r.get(1)?,
                    line: r.get::<_, i64>(2)? as usize,
                    end_line: r.get::<_, i64>(3)? as usize,
                    hash: r.get(4)?,
                    text: r.get(5)?,
                })
            })
            .optional()
            .map_err(sql(format!("read chunk {id}")))
    }

    /// The chunks with these ids (absent ids are skipped), in one query.
    pub fn chunks_by_id(&self, ids: &[i64]) -> Result<HashMap<i64, ChunkRow>, IndexError> {
        let mut out = HashMap::with_capacity(ids.len());
        // Bounded statements: SQLite caps the number of terms in an expression.
        for part in ids.chunks(500) {
            let list = part
                .iter()
                .map(|i| i.to_string())
                .collect::<Vec<_>>()
                .join(",");
            let op = || format!("read {} chunks", part.len());
            let mut st = self
                .conn
                .prepare(&format!(
                    "SELECT id, path, line, end_line, hash, text FROM chunks WHERE id IN ({list})"
                ))
                .map_err(sql(op()))?;
            let rows = st
                .query_map([], |r| {
                    Ok(ChunkRow {
                        id: r.get(0)?,
                        path: r.get(1)?,
                        line: r.get::<_, i64>(2)? as usize,
                        end_line: r.get::<_, i64>(3)? as usize,
                        hash: r.get(4)?,
                        text: r.get(5)?,
                    })
                })
                .map_err(sql(op()))?;
            for row in rows {
                let row = row.map_err(sql(op()))?;
                out.insert(row.id, row);
            }
        }
        Ok(out)
    }

    /// All chunks of `path`, in order.
    pub fn chunks_of(&self, path: &str) -> Result<Vec<ChunkRow>, IndexError> {
        let mut st = self
            .conn
            .prepare_cached(
                "SELECT id, path, line, end_line, hash, text FROM chunks WHERE path = ?1 ORDER BY ord",
            )
            .map_err(sql(format!("read chunks of {path}")))?;
        let rows = st
            .query_map([path], |r| {
                Ok(ChunkRow {
                    id: r.get(0)?,
                    path: r.get(1)?,
                    line: r.get::<_, i64>(2)? as usize,
                    end_line: r.get::<_, i64>(3)? as usize,
                    hash: r.get(4)?,
                    text: r.get(5)?,
                })
            })
            .map_err(sql(format!("read chunks of {path}")))?;
        rows.collect::<Result<Vec<_>, _>>()
            .map_err(sql(format!("read chunks of {path}")))
    }

    /// Number of stored vectors (all models).
    pub fn vector_rows(&self) -> Result<usize, IndexError> {
        self.conn
            .query_row("SELECT count(*) FROM vectors", [], |r| r.get::<_, i64>(0))
            .map(|n| n as usize)
            .map_err(sql("count vectors"))
    }
}

fn delete_file_rows(tx: &rusqlite::Transaction<'_>, path: &str) -> rusqlite::Result<Vec<i64>> {
    let ids: Vec<i64> = {
        let mut st = tx.prepare_cached("SELECT id FROM chunks WHERE path = ?1")?;
        let rows = st.query_map([path], |r| r.get(0))?;
        rows.collect::<Result<_, _>>()?
    };
    {
        let mut del = tx.prepare_cached("DELETE FROM chunks_fts WHERE rowid = ?1")?;
        for id in &ids {
            del.execute([id])?;
        }
    }
    tx.execute("DELETE FROM chunks WHERE path = ?1", [path])?;
    tx.execute("DELETE FROM files WHERE path = ?1", [path])?;
    Ok(ids)
}

fn file_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<FileRow> {
    let tags: String = r.get(8)?;
    let rels: String = r.get(9)?;
    Ok(FileRow {
        path: r.get(0)?,
        hash: r.get(1)?,
        size: r.get::<_, i64>(2)? as u64,
        mtime_ns: r.get(3)?,
        mem_id: r.get(4)?,
        title: r.get(5)?,
        kind: r.get(6)?,
        folder: r.get(7)?,
        tags: serde_json::from_str(&tags).unwrap_or_default(),
        relations: serde_json::from_str(&rels).unwrap_or_default(),
        valid_from: r.get(10)?,
        valid_to: r.get(11)?,
        error: r.get(12)?,
    })
}

#[cfg(test)]
mod scan_tests {
    use super::*;

    fn unit(seed: &mut u64, dim: usize) -> Vec<f32> {
        let mut v: Vec<f32> = (0..dim)
            .map(|_| {
                *seed ^= *seed << 13;
                *seed ^= *seed >> 7;
                *seed ^= *seed << 17;
                (*seed % 2001) as f32 / 1000.0 - 1.0
            })
            .collect();
        let n = v.iter().map(|x| x * x).sum::<f32>().sqrt();
        v.iter_mut().for_each(|x| *x /= n);
        v
    }

    #[test]
    fn quantized_scan_returns_the_exact_neighbours() {
        let (dim, rows) = (384, 20_000);
        let mut seed = 7u64;
        let mut cache = VectorCache {
            dim,
            loaded: true,
            ..Default::default()
        };
        for id in 0..rows as i64 {
            cache.insert(id * 3, &unit(&mut seed, dim));
        }
        // Some removals and an overwrite keep the int8 copy in step with the f32 rows.
        for id in (0..300).map(|i| i * 9) {
            cache.remove(id);
        }
        cache.insert(3, &unit(&mut seed, dim));
        assert_eq!(cache.q8.len(), cache.data.len());
        assert_eq!(cache.scale.len(), cache.ids.len());
        let excluded: HashSet<i64> = (0..2000).map(|i| i * 6).collect();
        for (qi, filter) in [
            ChunkFilter::All,
            ChunkFilter::Exclude(excluded.clone()),
            ChunkFilter::Include(excluded),
        ]
        .iter()
        .enumerate()
        {
            for _ in 0..10 {
                // Queries near a stored row make the top of the list tight.
                let base = cache.data[(qi * 977) * dim..(qi * 977 + 1) * dim].to_vec();
                let noise = unit(&mut seed, dim);
                let q: Vec<f32> = base.iter().zip(&noise).map(|(a, b)| a + 0.5 * b).collect();
                let n = q.iter().map(|x| x * x).sum::<f32>().sqrt();
                let q: Vec<f32> = q.iter().map(|x| x / n).collect();
                for threads in [1, 2, 3] {
                    let got = cache.search(&q, 50, filter, threads);
                    let want = cache.search_exact(&q, 50, filter);
                    let ids = |v: &[(i64, f32)]| v.iter().map(|e| e.0).collect::<Vec<_>>();
                    assert_eq!(ids(&got), ids(&want), "threads {threads}");
                    for (g, w) in got.iter().zip(&want) {
                        assert!((g.1 - w.1).abs() < 1e-6, "scores are exact: {g:?} {w:?}");
                    }
                }
            }
        }
    }

    #[test]
    fn int8_dot_matches_integer_arithmetic() {
        let a: Vec<i8> = (0..390).map(|i| ((i * 37) % 255 - 127) as i8).collect();
        let b: Vec<i8> = (0..390).map(|i| ((i * 91) % 255 - 127) as i8).collect();
        let want: i32 = a
            .iter()
            .zip(&b)
            .map(|(x, y)| i32::from(*x) * i32::from(*y))
            .sum();
        assert_eq!(crate::kernels::dot_i8(&a, &b), want);
        let mut q = [0i8; 4];
        let s = quantize(&[0.5, -0.25, 0.0, 0.125], &mut q);
        assert_eq!(q, [127, -64, 0, 32]);
        assert!((s - 0.5 / 127.0).abs() < 1e-9);
        assert_eq!(quantize(&[0.0; 4], &mut q), 0.0);
    }
}
