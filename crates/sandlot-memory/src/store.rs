//! A memory store: a git work tree of Markdown memories plus its index cache.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use serde::Serialize;

use crate::chunk::{chunk_body, sha256_hex};
use crate::doc::{self, DocError, Document, FrontMatter};
use crate::embed::{EmbedError, Embedder};
use crate::git::{Author, Commit, Content, Git, GitError};
use crate::index::{FileRow, Index, IndexError};
use crate::tree::{Kind, TreeError, WorkTree, MAX_FILE_BYTES};

/// Folder under the store root holding the index (git-ignored).
pub const INDEX_DIR: &str = ".sandlot";
/// Files larger than this are not indexed (status reports them).
pub const MAX_INDEXED_BYTES: u64 = 4 * 1024 * 1024;

/// Errors from store operations.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("open store {root}: {reason}")]
    Open { root: PathBuf, reason: String },
    #[error("invalid memory path {path:?}: {reason}")]
    BadPath { path: String, reason: &'static str },
    #[error("memory {key:?} not found in store {root}")]
    NotFound { key: String, root: PathBuf },
    #[error("memory {path} already exists")]
    Exists { path: String },
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is not UTF-8 text")]
    NotText { path: String },
    #[error("invalid request: {0}")]
    Invalid(String),
    #[error(transparent)]
    Doc(#[from] DocError),
    #[error(transparent)]
    Git(#[from] GitError),
    #[error(transparent)]
    Tree(#[from] TreeError),
    #[error(transparent)]
    Index(#[from] IndexError),
    #[error(transparent)]
    Embed(#[from] EmbedError),
}

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// A new memory.
#[derive(Debug, Clone, Default, serde::Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct NewMemory {
    pub title: String,
    #[serde(default)]
    pub body: String,
    /// Entity class folder, e.g. `people`. Ignored when `path` is given.
    #[serde(default)]
    pub folder: Option<String>,
    /// Explicit store-relative path (must end in `.md`).
    #[serde(default)]
    pub path: Option<String>,
    /// Explicit id; default: the path without `.md`.
    #[serde(default)]
    pub id: Option<String>,
    #[serde(default, rename = "type")]
    pub kind: Option<String>,
    #[serde(default)]
    pub tags: Vec<String>,
    #[serde(default)]
    pub links: Vec<String>,
    #[serde(default)]
    pub valid_from: Option<String>,
    #[serde(default)]
    pub valid_to: Option<String>,
}

/// Changes to a memory's fields; `None` leaves a field as it is.
#[derive(Debug, Clone, Default, serde::Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct MemoryPatch {
    #[serde(default)]
    pub title: Option<String>,
    #[serde(default)]
    pub body: Option<String>,
    #[serde(default, rename = "type")]
    pub kind: Option<String>,
    #[serde(default)]
    pub tags: Option<Vec<String>>,
    #[serde(default)]
    pub add_tags: Vec<String>,
    #[serde(default)]
    pub remove_tags: Vec<String>,
    #[serde(default)]
    pub links: Option<Vec<String>>,
    #[serde(default)]
    pub add_links: Vec<String>,
    /// `Some("")` clears the field.
    #[serde(default)]
    pub valid_from: Option<String>,
    /// `Some("")` clears the field.
    #[serde(default)]
    pub valid_to: Option<String>,
}

/// A memory as read from the store.
#[derive(Debug, Clone, Serialize)]
pub struct Memory {
    pub path: String,
    pub id: String,
    pub title: String,
    pub folder: String,
    #[serde(rename = "type")]
    pub kind: Option<String>,
    pub tags: Vec<String>,
    pub links: Vec<String>,
    pub relations: Vec<String>,
    pub created: Option<String>,
    pub updated: Option<String>,
    pub valid_from: Option<String>,
    pub valid_to: Option<String>,
    pub superseded_by: Option<String>,
    pub supersedes: Option<String>,
    pub body: String,
    /// The whole file as stored.
    pub text: String,
}

/// Result of a write: where it landed and the commit that recorded it.
#[derive(Debug, Clone, Serialize)]
pub struct WriteOutcome {
    pub path: String,
    pub id: String,
    /// `None` when the write changed nothing.
    pub commit: Option<String>,
}

/// Freshness of one file's index rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Freshness {
    /// Indexed rows match the file.
    Fresh,
    /// The file changed since it was indexed.
    Stale,
    /// The file is not indexed yet.
    Unindexed,
    /// The index has rows for a file that no longer exists.
    Deleted,
    /// Skipped: not UTF-8 or larger than [`MAX_INDEXED_BYTES`].
    Skipped,
}

/// Status of one file.
#[derive(Debug, Clone, Serialize)]
pub struct FileStatus {
    pub path: String,
    pub index: Freshness,
    /// Chunks whose vector of the active model is still missing (re-embedding pending).
    pub missing_vectors: usize,
    /// Uncommitted change in git (porcelain code, e.g. `M`, `??`, `D`), if any.
    pub git: Option<String>,
    /// Front matter problem, if any (the file is indexed as plain text then).
    pub error: Option<String>,
}

impl FileStatus {
    /// Whether a status listing shows the file without being asked for every file: its index
    /// is not fresh, it has an uncommitted change, vectors are missing or its front matter
    /// is bad.
    pub fn needs_attention(&self) -> bool {
        self.index != Freshness::Fresh
            || self.git.is_some()
            || self.missing_vectors > 0
            || self.error.is_some()
    }
}

/// What a [`Store::sync`] did.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct SyncReport {
    pub indexed: Vec<String>,
    pub removed: Vec<String>,
    pub unchanged: usize,
    pub skipped: Vec<String>,
    pub texts_embedded: usize,
}

impl SyncReport {
    pub fn changed(&self) -> bool {
        !self.indexed.is_empty() || !self.removed.is_empty()
    }
}

/// A memory store. `Send + Sync`: share it in an `Arc` between request handlers and the watcher.
pub struct Store {
    root: PathBuf,
    git: Git,
    /// Every file operation of the work tree goes through it (descriptors, no links).
    tree: WorkTree,
    pub(crate) index: Mutex<Index>,
    pub(crate) embedder: Arc<dyn Embedder>,
    /// Serialises writes (file + git commit + index) so commits never interleave.
    writes: Mutex<()>,
    /// [`crate::search::TextSide::PerTermFts`] selected (the benchmark's peer).
    pub(crate) per_term_fts: std::sync::atomic::AtomicBool,
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding the lock leaves SQLite consistent (transactions roll back).
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Checks a store-relative path: no absolute paths, `..`, empty segments or reserved folders.
pub fn validate_rel_path(path: &str) -> Result<String> {
    let bad = |reason| StoreError::BadPath {
        path: path.to_string(),
        reason,
    };
    let p = path.trim().trim_start_matches("./");
    if p.is_empty() {
        return Err(bad("empty"));
    }
    if p.starts_with('/') {
        return Err(bad("must be relative to the store root"));
    }
    if p.contains('\0') || p.contains('\\') {
        return Err(bad("contains NUL or backslash"));
    }
    for seg in p.split('/') {
        if seg.is_empty() || seg == "." {
            return Err(bad("has an empty or '.' segment"));
        }
        if seg == ".." {
            return Err(bad("'..' is not allowed"));
        }
        if seg.starts_with('.') {
            return Err(bad(
                "hidden files and folders (.git, .sandlot, ...) are not memories",
            ));
        }
    }
    Ok(p.to_string())
}

/// Scanned state of one file on disk.
struct DiskFile {
    size: u64,
    mtime_ns: i64,
}

impl Store {
    /// Creates a store at `root` (an existing empty or non-git directory, or a new one): runs
    /// `git init` if needed, writes `.gitignore` for the index, commits it, and opens the store.
    pub fn init(root: &Path, embedder: Arc<dyn Embedder>, author: &Author) -> Result<Store> {
        std::fs::create_dir_all(root).map_err(|source| StoreError::Io {
            op: "create store directory",
            path: root.display().to_string(),
            source,
        })?;
        let git = Git::new(root);
        if !git.is_repo() {
            git.init()?;
        }
        let tree = WorkTree::new(root);
        let existing = tree
            .read(".gitignore", MAX_FILE_BYTES)
            .ok()
            .and_then(|b| String::from_utf8(b).ok())
            .unwrap_or_default();
        let entry = format!("/{INDEX_DIR}/");
        if !existing.lines().any(|l| l.trim() == entry) {
            let mut text = existing;
            if !text.is_empty() && !text.ends_with('\n') {
                text.push('\n');
            }
            text.push_str(&entry);
            text.push('\n');
            tree.write_atomic(".gitignore", text.as_bytes())?;
            git.commit_paths(&[".gitignore"], "init memory store", author)?;
        }
        Store::open(root, embedder)
    }

    /// Opens an existing store and brings its index up to date with the files.
    pub fn open(root: &Path, embedder: Arc<dyn Embedder>) -> Result<Store> {
        let store = Store::open_unsynced(root, embedder)?;
        store.sync()?;
        Ok(store)
    }

    /// Opens an existing store without reconciling the index (for `status`, or when a watcher
    /// will reconcile in the background).
    pub fn open_unsynced(root: &Path, embedder: Arc<dyn Embedder>) -> Result<Store> {
        let root = root.canonicalize().map_err(|e| StoreError::Open {
            root: root.to_path_buf(),
            reason: e.to_string(),
        })?;
        let git = Git::new(&root);
        if !git.is_repo() {
            return Err(StoreError::Open {
                root,
                reason: "not a git repository; run `sandlot memory init` first".into(),
            });
        }
        let dir = root.join(INDEX_DIR);
        std::fs::create_dir_all(&dir).map_err(|source| StoreError::Io {
            op: "create index directory",
            path: dir.display().to_string(),
            source,
        })?;
        let index = Index::open(
            &dir.join("index.sqlite"),
            embedder.model_id(),
            embedder.dim(),
        )?;
        let store = Store {
            tree: WorkTree::new(&root),
            root,
            git,
            index: Mutex::new(index),
            embedder,
            writes: Mutex::new(()),
            per_term_fts: std::sync::atomic::AtomicBool::new(false),
        };
        Ok(store)
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn embedder(&self) -> &Arc<dyn Embedder> {
        &self.embedder
    }

    /// Selects how vector search scans the matrix (the int8 scan by default; the exact
    /// single-threaded f32 scan is the benchmark's peer).
    pub fn set_vector_scan(&self, scan: crate::index::VectorScan) {
        lock(&self.index).set_vector_scan(scan);
    }

    /// Selects how hybrid search computes its text side ([`crate::search::TextSide::Tokenized`]
    /// by default; the previous path is the benchmark's peer).
    pub fn set_text_side(&self, side: crate::search::TextSide) {
        self.per_term_fts.store(
            side == crate::search::TextSide::PerTermFts,
            std::sync::atomic::Ordering::Relaxed,
        );
    }

    /// The work tree, for the memory tool's listings.
    pub(crate) fn tree(&self) -> &WorkTree {
        &self.tree
    }

    /// What `rel` is (without following a link), `None` when it does not exist.
    fn kind(&self, rel: &str) -> Option<Kind> {
        self.tree.kind(rel)
    }

    /// Refuses a store-relative path with a symbolic link in it: a store can be mounted into
    /// a sandbox, and a link planted there must not point the daemon at host files.
    pub(crate) fn guard(&self, rel: &str) -> Result<()> {
        let mut p = self.root.clone();
        for c in rel.split('/').filter(|c| !c.is_empty()) {
            p.push(c);
            match std::fs::symlink_metadata(&p) {
                Ok(m) if m.file_type().is_symlink() => {
                    return Err(StoreError::BadPath {
                        path: rel.to_string(),
                        reason: "a path component is a symbolic link",
                    })
                }
                Ok(_) => {}
                // Does not exist (yet): nothing below it can be a link.
                Err(_) => break,
            }
        }
        Ok(())
    }

    /// A regular file, reached without symbolic links.
    fn is_plain_file(&self, rel: &str) -> bool {
        self.guard(rel).is_ok() && self.kind(rel) == Some(Kind::File)
    }

    /// Resolves a key (store-relative path or memory id) to a path that exists.
    pub fn resolve(&self, key: &str) -> Result<String> {
        let k = key.trim().trim_start_matches("./");
        if let Ok(p) = validate_rel_path(k) {
            if self.is_plain_file(&p) {
                return Ok(p);
            }
            let with_md = format!("{p}.md");
            if !p.ends_with(".md") && self.is_plain_file(&with_md) {
                return Ok(with_md);
            }
        }
        if let Some(p) = lock(&self.index).path_of_id(k)? {
            if self.is_plain_file(&p) {
                return Ok(p);
            }
        }
        Err(StoreError::NotFound {
            key: key.to_string(),
            root: self.root.clone(),
        })
    }

    fn read_text(&self, rel: &str) -> Result<String> {
        let bytes = self.read_bytes(rel)?;
        String::from_utf8(bytes).map_err(|_| StoreError::NotText {
            path: rel.to_string(),
        })
    }

    /// A file's bytes, read beneath the root without following any symbolic link (a sandbox
    /// that mounts the store may swap a folder for a link between a check and the read).
    fn read_bytes(&self, rel: &str) -> Result<Vec<u8>> {
        self.guard(rel)?;
        Ok(self.tree.read(rel, MAX_FILE_BYTES)?)
    }

    /// Reads a memory by path or id.
    pub fn get(&self, key: &str) -> Result<Memory> {
        let path = self.resolve(key)?;
        let text = self.read_text(&path)?;
        Ok(memory_of(&path, &text)?)
    }

    /// Reads a file's raw text by store-relative path (any file, front matter or not).
    pub fn read_file(&self, path: &str) -> Result<String> {
        let p = validate_rel_path(path)?;
        if !self.is_plain_file(&p) {
            return Err(StoreError::NotFound {
                key: path.to_string(),
                root: self.root.clone(),
            });
        }
        self.read_text(&p)
    }

    fn unique_path(&self, folder: &str, slug: &str) -> String {
        let base = if folder.is_empty() {
            slug.to_string()
        } else {
            format!("{folder}/{slug}")
        };
        let mut candidate = format!("{base}.md");
        let mut n = 2;
        while self.kind(&candidate).is_some() {
            candidate = format!("{base}-{n}.md");
            n += 1;
        }
        candidate
    }

    /// Adds a memory, commits it as `author`, and indexes it (searchable on return).
    pub fn add(&self, new: NewMemory, author: &Author) -> Result<WriteOutcome> {
        let _w = lock(&self.writes);
        let (path, text, id) = self.plan_add(&new)?;
        let msg = format!("add {path}: {}", new.title.trim());
        self.write_and_commit(&[(path.clone(), Some(text.into_bytes()))], &msg, author)
            .map(|commit| WriteOutcome { path, id, commit })
    }

    fn plan_add(&self, new: &NewMemory) -> Result<(String, String, String)> {
        if new.title.trim().is_empty() {
            return Err(StoreError::Invalid(
                "a memory needs a non-empty title".into(),
            ));
        }
        let path = match &new.path {
            Some(p) => {
                let p = validate_rel_path(p)?;
                if !p.ends_with(".md") {
                    return Err(StoreError::BadPath {
                        path: p,
                        reason: "memory files end in .md",
                    });
                }
                if self.kind(&p).is_some() {
                    return Err(StoreError::Exists { path: p });
                }
                p
            }
            None => {
                let folder = match &new.folder {
                    Some(f) if !f.trim_matches('/').is_empty() => {
                        validate_rel_path(f.trim_matches('/'))?
                    }
                    _ => String::new(),
                };
                self.unique_path(&folder, &doc::slugify(&new.title))
            }
        };
        let id = new.id.clone().unwrap_or_else(|| doc::id_from_path(&path));
        if new.id.is_some() && lock(&self.index).path_of_id(&id)?.is_some() {
            return Err(StoreError::Invalid(format!(
                "memory id {id:?} is already used"
            )));
        }
        for (field, v) in [("valid_from", &new.valid_from), ("valid_to", &new.valid_to)] {
            if let Some(v) = v {
                if doc::parse_time(v).is_none() {
                    return Err(StoreError::Invalid(format!(
                        "{field} {v:?} is not RFC 3339 or YYYY-MM-DD"
                    )));
                }
            }
        }
        let now = doc::now_rfc3339();
        let mut body = new.body.clone();
        if !body.is_empty() && !body.ends_with('\n') {
            body.push('\n');
        }
        let d = Document {
            front: Some(FrontMatter {
                id: Some(id.clone()),
                title: Some(new.title.trim().to_string()),
                kind: new.kind.clone(),
                tags: new.tags.clone(),
                links: new.links.clone(),
                created: Some(now.clone()),
                updated: Some(now),
                valid_from: new.valid_from.clone(),
                valid_to: new.valid_to.clone(),
                ..Default::default()
            }),
            body,
            body_line: 1,
        };
        Ok((path.clone(), d.render(&path)?, id))
    }

    /// Applies `patch` to a memory and commits.
    pub fn edit(&self, key: &str, patch: MemoryPatch, author: &Author) -> Result<WriteOutcome> {
        let _w = lock(&self.writes);
        let path = self.resolve(key)?;
        let text = self.read_text(&path)?;
        let mut d = Document::parse(&path, &text)?;
        let id = d.id_or_path(&path);
        let f = d.front.get_or_insert_with(FrontMatter::default);
        if let Some(t) = patch.title {
            if t.trim().is_empty() {
                return Err(StoreError::Invalid("title cannot be empty".into()));
            }
            f.title = Some(t.trim().to_string());
        }
        if let Some(k) = patch.kind {
            f.kind = if k.is_empty() { None } else { Some(k) };
        }
        if let Some(t) = patch.tags {
            f.tags = t;
        }
        for t in patch.add_tags {
            if !f.tags.contains(&t) {
                f.tags.push(t);
            }
        }
        f.tags.retain(|t| !patch.remove_tags.contains(t));
        if let Some(l) = patch.links {
            f.links = l;
        }
        for l in patch.add_links {
            if !f.links.contains(&l) {
                f.links.push(l);
            }
        }
        for (field, v, slot) in [
            ("valid_from", patch.valid_from, &mut f.valid_from),
            ("valid_to", patch.valid_to, &mut f.valid_to),
        ] {
            match v {
                None => {}
                Some(s) if s.is_empty() => *slot = None,
                Some(s) => {
                    if doc::parse_time(&s).is_none() {
                        return Err(StoreError::Invalid(format!(
                            "{field} {s:?} is not RFC 3339 or YYYY-MM-DD"
                        )));
                    }
                    *slot = Some(s);
                }
            }
        }
        if f.id.is_none() {
            f.id = Some(id.clone());
        }
        f.updated = Some(doc::now_rfc3339());
        if let Some(b) = patch.body {
            d.body = b;
            if !d.body.is_empty() && !d.body.ends_with('\n') {
                d.body.push('\n');
            }
        }
        let out = d.render(&path)?;
        let msg = format!("edit {path}: {}", d.title(&path));
        let commit =
            self.write_and_commit(&[(path.clone(), Some(out.into_bytes()))], &msg, author)?;
        Ok(WriteOutcome { path, id, commit })
    }

    /// Writes a file's full text (creating it if needed) and commits with `message`.
    /// Used by the memory tool and editors; front matter is optional, and a file whose front
    /// matter does not parse is still stored and indexed as plain text (`status` reports it).
    pub fn write_file(
        &self,
        path: &str,
        text: &str,
        message: &str,
        author: &Author,
    ) -> Result<WriteOutcome> {
        let _w = lock(&self.writes);
        let path = validate_rel_path(path)?;
        self.guard(&path)?;
        if self.kind(&path) == Some(Kind::Dir) {
            return Err(StoreError::Exists { path });
        }
        let id = Document::parse(&path, text)
            .map(|d| d.id_or_path(&path))
            .unwrap_or_else(|_| doc::id_from_path(&path));
        let commit = self.write_and_commit(
            &[(path.clone(), Some(text.as_bytes().to_vec()))],
            message,
            author,
        )?;
        Ok(WriteOutcome { path, id, commit })
    }

    /// Moves a memory (or, with the memory tool, any file or folder) and commits. The index
    /// rows follow without re-embedding: vectors are keyed by content, not path.
    pub fn rename(&self, from: &str, to: &str, author: &Author) -> Result<WriteOutcome> {
        let _w = lock(&self.writes);
        let from_p = validate_rel_path(from)?;
        let from_p = if self.kind(&from_p).is_some() {
            from_p
        } else {
            self.resolve(from)?
        };
        let to_p = validate_rel_path(to)?;
        if self.kind(&to_p).is_some() {
            return Err(StoreError::Exists { path: to_p });
        }
        self.guard(&from_p)?;
        self.guard(&to_p)?;
        if let Some((parent, _)) = to_p.rsplit_once('/') {
            self.tree.create_dirs(parent)?;
        }
        self.tree.rename_new(&from_p, &to_p)?;
        let msg = format!("move {from_p} -> {to_p}");
        let commit = match self.git.commit_paths(&[&from_p, &to_p], &msg, author) {
            Ok(c) => c,
            Err(e) => {
                let _ = self.tree.rename_new(&to_p, &from_p);
                return Err(e.into());
            }
        };
        self.sync_paths(&[from_p.as_str(), to_p.as_str()])?;
        let id = match self.get(&to_p) {
            Ok(m) => m.id,
            Err(_) => doc::id_from_path(&to_p),
        };
        Ok(WriteOutcome {
            path: to_p,
            id,
            commit,
        })
    }

    /// Deletes a memory (or, for the memory tool, a file or folder) and commits.
    pub fn remove(&self, key: &str, author: &Author) -> Result<WriteOutcome> {
        let _w = lock(&self.writes);
        let p = validate_rel_path(key)?;
        let path = if self.kind(&p).is_some() {
            p
        } else {
            self.resolve(key)?
        };
        self.guard(&path)?;
        let id = self
            .get(&path)
            .map(|m| m.id)
            .unwrap_or_else(|_| doc::id_from_path(&path));
        // Parked in the index folder (the daemon's own; read-only in sandboxes) until the
        // commit is made, so a failed commit can put it back.
        let backup = self.root.join(INDEX_DIR).join("trash");
        let _ = std::fs::remove_dir_all(&backup);
        std::fs::create_dir_all(&backup).map_err(|source| StoreError::Io {
            op: "prepare delete of",
            path: path.clone(),
            source,
        })?;
        let parked = format!("{INDEX_DIR}/trash/item");
        self.tree.rename_new(&path, &parked)?;
        let msg = format!("remove {path}");
        match self.git.commit_paths(&[&path], &msg, author) {
            Ok(commit) => {
                let _ = std::fs::remove_dir_all(&backup);
                self.sync()?;
                Ok(WriteOutcome { path, id, commit })
            }
            Err(e) => {
                let _ = self.tree.rename_new(&parked, &path);
                Err(e.into())
            }
        }
    }

    /// Records a correction: `new` becomes a memory valid from now (or its `valid_from`), and the
    /// memory `old` gets `valid_to` and `superseded_by`/`links` pointing to its successor. One commit.
    pub fn supersede(
        &self,
        old: &str,
        mut new: NewMemory,
        author: &Author,
    ) -> Result<WriteOutcome> {
        let _w = lock(&self.writes);
        let old_path = self.resolve(old)?;
        let old_text = self.read_text(&old_path)?;
        let mut od = Document::parse(&old_path, &old_text)?;
        let old_id = od.id_or_path(&old_path);
        if od
            .front
            .as_ref()
            .and_then(|f| f.superseded_by.as_ref())
            .is_some()
        {
            return Err(StoreError::Invalid(format!(
                "memory {old_id} is already superseded"
            )));
        }
        let from = new.valid_from.clone().unwrap_or_else(doc::now_rfc3339);
        new.valid_from = Some(from.clone());
        if new.folder.is_none() && new.path.is_none() {
            let folder = old_path.rsplit_once('/').map(|(d, _)| d.to_string());
            new.folder = folder;
        }
        let (new_path, mut new_text, new_id) = self.plan_add(&new)?;
        let mut nd = Document::parse(&new_path, &new_text)?;
        if let Some(f) = nd.front.as_mut() {
            f.supersedes = Some(old_id.clone());
            if !f.links.contains(&old_id) {
                f.links.push(old_id.clone());
            }
        }
        new_text = nd.render(&new_path)?;
        let f = od.front.get_or_insert_with(FrontMatter::default);
        if f.id.is_none() {
            f.id = Some(old_id.clone());
        }
        f.valid_to = Some(from);
        f.superseded_by = Some(new_id.clone());
        if !f.links.contains(&new_id) {
            f.links.push(new_id.clone());
        }
        f.updated = Some(doc::now_rfc3339());
        let old_out = od.render(&old_path)?;
        let msg = format!("supersede {old_path} with {new_path}: {}", new.title.trim());
        let commit = self.write_and_commit(
            &[
                (old_path, Some(old_out.into_bytes())),
                (new_path.clone(), Some(new_text.into_bytes())),
            ],
            &msg,
            author,
        )?;
        Ok(WriteOutcome {
            path: new_path,
            id: new_id,
            commit,
        })
    }

    /// Writes (or deletes, for `None`) files, commits them, then indexes them. On a failed
    /// commit the files are restored, so nothing is half-done.
    fn write_and_commit(
        &self,
        files: &[(String, Option<Vec<u8>>)],
        message: &str,
        author: &Author,
    ) -> Result<Option<String>> {
        let mut previous: Vec<(&str, Option<Vec<u8>>)> = Vec::new();
        let restore = |previous: &[(&str, Option<Vec<u8>>)]| {
            for (rel, old) in previous {
                let _ = match old {
                    Some(b) => self.tree.write_atomic(rel, b),
                    None => self.tree.remove(rel, false),
                };
            }
        };
        for (rel, _) in files {
            self.guard(rel)?;
        }
        for (rel, text) in files {
            let old = match self.read_bytes(rel) {
                Ok(b) => Some(b),
                Err(StoreError::Tree(e)) if e.is_not_found() => None,
                Err(e) => {
                    restore(&previous);
                    return Err(e);
                }
            };
            previous.push((rel.as_str(), old));
            let res = match text {
                Some(t) => self.tree.write_atomic(rel, t),
                None => self.tree.remove(rel, false),
            };
            if let Err(e) = res {
                restore(&previous);
                return Err(e.into());
            }
        }
        let rels: Vec<&str> = files.iter().map(|(p, _)| p.as_str()).collect();
        let commit = match self.git.commit_paths(&rels, message, author) {
            Ok(c) => c,
            Err(e) => {
                restore(&previous);
                return Err(e.into());
            }
        };
        self.sync_paths(&rels)?;
        Ok(commit)
    }

    // ----- history -----

    /// Commits of the store, or of one memory (following renames), newest first.
    pub fn log(&self, key: Option<&str>, limit: usize) -> Result<Vec<Commit>> {
        let path = match key {
            Some(k) => Some(self.resolve_historic(k)?),
            None => None,
        };
        Ok(self.git.log(path.as_deref(), limit)?)
    }

    /// Resolves a key that may name a file that no longer exists (for history).
    fn resolve_historic(&self, key: &str) -> Result<String> {
        match self.resolve(key) {
            Ok(p) => Ok(p),
            Err(StoreError::NotFound { .. }) => validate_rel_path(key),
            Err(e) => Err(e),
        }
    }

    /// Unified diff from `from` to `to` (default: the work tree), of the store or one memory.
    pub fn diff(&self, from: &str, to: Option<&str>, key: Option<&str>) -> Result<String> {
        let path = match key {
            Some(k) => Some(self.resolve_historic(k)?),
            None => None,
        };
        let from = self.git.resolve(from)?;
        let to = match to {
            Some(t) => Some(self.git.resolve(t)?),
            None => None,
        };
        Ok(self.git.diff(&from, to.as_deref(), path.as_deref())?)
    }

    /// A memory's text at revision `rev`.
    pub fn show(&self, key: &str, rev: &str) -> Result<String> {
        let path = self.resolve_historic(key)?;
        let rev = self.git.resolve(rev)?;
        if !self.git.exists_at(&rev, &path)? {
            return Err(StoreError::NotFound {
                key: format!("{path} at {rev}"),
                root: self.root.clone(),
            });
        }
        Ok(self.git.show(&rev, &path)?)
    }

    /// Undoes a whole commit of the store (`git revert`), as a new commit by `author`.
    pub fn revert_commit(&self, rev: &str, author: &Author) -> Result<WriteOutcome> {
        let _w = lock(&self.writes);
        let rev = self.git.resolve(rev)?;
        let reverted = self.git.reverted_contents(&rev)?;
        // Like `git revert`: refused when a file it would change has uncommitted changes.
        let head = self.git.head()?.unwrap_or_default();
        let mut files = Vec::new();
        for (path, content) in reverted {
            let committed = self.git.content_at(&head, &path)?;
            let on_disk = match self.read_bytes(&path) {
                Ok(b) => Content::File(b),
                Err(StoreError::Io { source, .. })
                    if source.kind() == std::io::ErrorKind::NotFound =>
                {
                    Content::Gone
                }
                Err(e) => return Err(e),
            };
            if on_disk != committed {
                return Err(StoreError::Invalid(format!(
                    "revert {rev}: {path} has uncommitted changes; commit or undo them first"
                )));
            }
            files.push((
                path,
                match content {
                    Content::File(b) => Some(b),
                    Content::Gone => None,
                },
            ));
        }
        let msg = self.git.revert_message(&rev)?;
        let commit = self.write_and_commit(&files, &msg, author)?;
        Ok(WriteOutcome {
            path: String::new(),
            id: String::new(),
            commit,
        })
    }

    /// Restores one memory to its content at `rev` (under its current name, following
    /// renames; deleting it if it did not exist then), as a new commit.
    pub fn revert_memory(&self, key: &str, rev: &str, author: &Author) -> Result<WriteOutcome> {
        let _w = lock(&self.writes);
        let path = self.resolve_historic(key)?;
        let full = self.git.resolve(rev)?;
        let short: String = full.chars().take(12).collect();
        // The memory may have had another name then: follow its renames back to `rev`.
        let then = if self.git.exists_at(&full, &path)? {
            Some(path.clone())
        } else {
            let mut found = None;
            for c in self.git.log(Some(&path), 10_000)? {
                if self.git.is_ancestor(&c.rev, &full)? {
                    found = c
                        .paths
                        .first()
                        .filter(|p| self.git.exists_at(&full, p).unwrap_or(false))
                        .cloned();
                    break;
                }
            }
            found
        };
        let content = if let Some(old) = &then {
            Some(self.git.show(&full, old)?.into_bytes())
        } else if self.kind(&path).is_some() {
            None
        } else {
            return Err(StoreError::NotFound {
                key: format!("{path} at {rev} or in the work tree"),
                root: self.root.clone(),
            });
        };
        let msg = format!("revert {path} to {short}");
        let commit = self.write_and_commit(&[(path.clone(), content)], &msg, author)?;
        let id = doc::id_from_path(&path);
        Ok(WriteOutcome { path, id, commit })
    }

    // ----- index maintenance -----

    fn scan(&self) -> Result<HashMap<String, DiskFile>> {
        let mut out = HashMap::new();
        let mut stack = vec![String::new()];
        while let Some(rel) = stack.pop() {
            let entries = match self.tree.list(&rel) {
                Ok((entries, _)) => entries,
                Err(e) if e.is_not_found() => continue,
                // A folder swapped for a link meanwhile: not part of the store.
                Err(e) if e.is_link_on_the_way() => continue,
                Err(e) => return Err(e.into()),
            };
            for (name, e) in entries {
                if name.starts_with('.') {
                    continue;
                }
                let child = crate::tree::join(&rel, &name);
                match e.kind {
                    Kind::Dir => stack.push(child),
                    Kind::File => {
                        out.insert(
                            child,
                            DiskFile {
                                size: e.size,
                                mtime_ns: e.mtime_ns,
                            },
                        );
                    }
                    Kind::Link | Kind::Other => {}
                }
            }
        }
        Ok(out)
    }

    /// Reconciles the index with the files: indexes new and changed files, drops rows of
    /// deleted ones, then frees vectors no chunk uses. Cheap when nothing changed (stat only).
    pub fn sync(&self) -> Result<SyncReport> {
        let disk = self.scan()?;
        let known: HashMap<String, FileRow> = lock(&self.index)
            .files()?
            .into_iter()
            .map(|r| (r.path.clone(), r))
            .collect();
        let mut report = SyncReport::default();
        let mut paths: Vec<&String> = disk.keys().collect();
        paths.sort();
        for p in paths {
            let f = &disk[p];
            if let Some(row) = known.get(p) {
                if row.size == f.size && row.mtime_ns == f.mtime_ns {
                    report.unchanged += 1;
                    continue;
                }
            }
            self.sync_one(p, &mut report)?;
        }
        let mut idx = lock(&self.index);
        for p in known.keys() {
            if !disk.contains_key(p) {
                idx.remove_file(p)?;
                report.removed.push(p.clone());
            }
        }
        if report.changed() {
            idx.gc_vectors()?;
        }
        report.removed.sort();
        Ok(report)
    }

    /// Reconciles just `paths` (after a write through the store).
    pub fn sync_paths(&self, paths: &[&str]) -> Result<SyncReport> {
        let mut report = SyncReport::default();
        for p in paths {
            if self.guard(p).is_ok() && self.kind(p) == Some(Kind::Dir) {
                // A moved or removed folder: fall back to a full reconcile.
                return self.sync();
            }
            if self.is_plain_file(p) {
                self.sync_one(p, &mut report)?;
            } else {
                let mut idx = lock(&self.index);
                let had_rows = idx.file(p)?.is_some();
                if had_rows {
                    idx.remove_file(p)?;
                    report.removed.push(p.to_string());
                } else {
                    // Maybe a folder that went away: drop anything under it.
                    drop(idx);
                    return self.sync();
                }
            }
        }
        if report.changed() {
            lock(&self.index).gc_vectors()?;
        }
        Ok(report)
    }

    fn sync_one(&self, rel: &str, report: &mut SyncReport) -> Result<()> {
        // Opened once, through the work tree's descriptors: a regular file reached without
        // links, its size and time from that very file, read only when small enough.
        let (size, mtime, bytes) = match self.tree.open_file(rel, u64::MAX) {
            Ok((f, e)) => {
                let bytes = if e.size > MAX_INDEXED_BYTES {
                    None
                } else {
                    let mut b = Vec::with_capacity(e.size as usize);
                    std::io::Read::read_to_end(
                        &mut std::io::Read::take(f, MAX_INDEXED_BYTES + 1),
                        &mut b,
                    )
                    .map_err(|source| StoreError::Io {
                        op: "read",
                        path: rel.to_string(),
                        source,
                    })?;
                    (b.len() as u64 <= MAX_INDEXED_BYTES).then_some(b)
                };
                (e.size, e.mtime_ns, bytes)
            }
            Err(e) if e.is_not_found() => return Ok(()),
            // Not a regular file reached without links (any more): nothing to index.
            Err(TreeError::NotAFile { .. }) => (0, 0, None),
            Err(e) if e.is_link_on_the_way() => (0, 0, None),
            Err(e) => return Err(e.into()),
        };
        let text = bytes.and_then(|b| String::from_utf8(b).ok());
        let Some(text) = text else {
            // Not indexable: make sure no old rows remain.
            let mut idx = lock(&self.index);
            if idx.file(rel)?.is_some() {
                idx.remove_file(rel)?;
                report.removed.push(rel.to_string());
            }
            report.skipped.push(rel.to_string());
            return Ok(());
        };
        let hash = sha256_hex(text.as_bytes());
        {
            let mut idx = lock(&self.index);
            if let Some(row) = idx.file(rel)? {
                if row.hash == hash {
                    idx.touch_file(rel, size, mtime)?;
                    report.unchanged += 1;
                    return Ok(());
                }
            }
        }
        let (row, chunks) = plan_file_rows(rel, &text, hash, size, mtime);
        let hashes: Vec<&str> = chunks.iter().map(|c| c.hash.as_str()).collect();
        let missing = lock(&self.index).missing_vectors(&hashes)?;
        let mut to_embed: Vec<(&str, &str)> = Vec::new();
        let mut seen = HashSet::new();
        for c in &chunks {
            if missing.contains(&c.hash) && seen.insert(c.hash.as_str()) {
                to_embed.push((c.hash.as_str(), c.embed_text.as_str()));
            }
        }
        let mut new_vectors = HashMap::new();
        if !to_embed.is_empty() {
            let texts: Vec<&str> = to_embed.iter().map(|(_, t)| *t).collect();
            let vecs = self.embedder.embed(&texts)?;
            report.texts_embedded += texts.len();
            for ((h, _), v) in to_embed.iter().zip(vecs) {
                new_vectors.insert(h.to_string(), v);
            }
        }
        lock(&self.index).put_file(&row, &chunks, &new_vectors)?;
        report.indexed.push(rel.to_string());
        Ok(())
    }

    /// Embeds up to `batch` chunks that lack a vector of the active model (after a model
    /// change). Returns how many were embedded; 0 means the index is complete. Call repeatedly
    /// from a background thread: the index lock is released between batches.
    pub fn embed_pending(&self, batch: usize) -> Result<usize> {
        let todo = lock(&self.index).chunks_without_vectors(batch)?;
        if todo.is_empty() {
            return Ok(0);
        }
        let texts: Vec<&str> = todo.iter().map(|(_, t)| t.as_str()).collect();
        let vecs = self.embedder.embed(&texts)?;
        let map: HashMap<String, Vec<f32>> =
            todo.iter().map(|(h, _)| h.clone()).zip(vecs).collect();
        lock(&self.index).put_vectors(&map)?;
        Ok(todo.len())
    }

    /// Drops the index and rebuilds it from the files. With `keep_vectors`, stored vectors are
    /// reused (nothing is re-embedded unless content or model changed).
    pub fn reindex(&self, keep_vectors: bool) -> Result<SyncReport> {
        let _w = lock(&self.writes);
        lock(&self.index).clear(keep_vectors)?;
        self.sync()
    }

    /// Per-file index freshness (and git state) without changing anything.
    pub fn status(&self) -> Result<Vec<FileStatus>> {
        let disk = self.scan()?;
        let idx = lock(&self.index);
        let known: HashMap<String, FileRow> = idx
            .files()?
            .into_iter()
            .map(|r| (r.path.clone(), r))
            .collect();
        let git_state: HashMap<String, String> = self.git.status().unwrap_or_default();
        let missing_by_path = |p: &str| -> Result<usize> {
            let chunks = idx.chunks_of(p)?;
            let hashes: Vec<&str> = chunks.iter().map(|c| c.hash.as_str()).collect();
            let missing = idx.missing_vectors(&hashes)?;
            Ok(chunks.iter().filter(|c| missing.contains(&c.hash)).count())
        };
        let mut out = Vec::new();
        let mut paths: Vec<&String> = disk
            .keys()
            .chain(known.keys())
            .chain(git_state.keys())
            .collect();
        paths.sort();
        paths.dedup();
        for p in paths {
            let (index, error) = match (disk.get(p), known.get(p)) {
                (Some(f), Some(row)) => {
                    if row.size == f.size && row.mtime_ns == f.mtime_ns {
                        (Freshness::Fresh, row.error.clone())
                    } else {
                        let same = self
                            .tree
                            .read(p, MAX_INDEXED_BYTES)
                            .map(|b| sha256_hex(&b) == row.hash)
                            .unwrap_or(false);
                        let state = if same {
                            Freshness::Fresh
                        } else {
                            Freshness::Stale
                        };
                        (state, row.error.clone())
                    }
                }
                (Some(f), None) => {
                    let indexable = f.size <= MAX_INDEXED_BYTES
                        && self
                            .tree
                            .read(p, MAX_INDEXED_BYTES)
                            .map(|b| std::str::from_utf8(&b).is_ok())
                            .unwrap_or(false);
                    if indexable {
                        (Freshness::Unindexed, None)
                    } else {
                        (Freshness::Skipped, None)
                    }
                }
                (None, Some(_)) => (Freshness::Deleted, None),
                // Gone from disk and from the index, but git still tracks it.
                (None, None) if p.starts_with('.') || p.contains("/.") => continue,
                (None, None) => (Freshness::Fresh, None),
            };
            let missing_vectors = if known.contains_key(p) {
                missing_by_path(p)?
            } else {
                0
            };
            out.push(FileStatus {
                path: p.clone(),
                index,
                missing_vectors,
                git: git_state.get(p).cloned(),
                error,
            });
        }
        Ok(out)
    }

    /// Index counts: (files, chunks, chunks with a vector of the active model).
    pub fn counts(&self) -> Result<(usize, usize, usize)> {
        Ok(lock(&self.index).counts()?)
    }
}

/// The file row and chunks for `text` at `rel` (pure: no I/O).
fn plan_file_rows(
    rel: &str,
    text: &str,
    hash: String,
    size: u64,
    mtime_ns: i64,
) -> (FileRow, Vec<crate::chunk::Chunk>) {
    let (d, error) = match Document::parse(rel, text) {
        Ok(d) => (d, None),
        Err(e) => (
            Document {
                front: None,
                body: text.to_string(),
                body_line: 1,
            },
            Some(e.to_string()),
        ),
    };
    let mut error = error;
    let front = d.front.clone().unwrap_or_default();
    let mut time = |field: &'static str, v: Option<&str>| match doc::parse_time_field(rel, field, v)
    {
        Ok(t) => t,
        Err(e) => {
            error.get_or_insert(e.to_string());
            None
        }
    };
    let valid_from = time("valid_from", front.valid_from.as_deref());
    let valid_to = time("valid_to", front.valid_to.as_deref());
    let title = d.title(rel).trim().to_string();
    let fm_title = front
        .title
        .as_deref()
        .map(str::trim)
        .filter(|t| !t.is_empty());
    let chunks = chunk_body(&d.body, d.body_line, fm_title);
    let row = FileRow {
        path: rel.to_string(),
        hash,
        size,
        mtime_ns,
        mem_id: d.id_or_path(rel),
        title,
        kind: front.kind.clone(),
        folder: rel
            .rsplit_once('/')
            .map(|(f, _)| f.to_string())
            .unwrap_or_default(),
        tags: front.tags.clone(),
        relations: d.relations(rel),
        valid_from,
        valid_to,
        error,
    };
    (row, chunks)
}

fn memory_of(path: &str, text: &str) -> Result<Memory, DocError> {
    let d = Document::parse(path, text)?;
    let f = d.front.clone().unwrap_or_default();
    Ok(Memory {
        path: path.to_string(),
        id: d.id_or_path(path),
        title: d.title(path),
        folder: path
            .rsplit_once('/')
            .map(|(f, _)| f.to_string())
            .unwrap_or_default(),
        kind: f.kind,
        tags: f.tags,
        links: f.links,
        relations: d.relations(path),
        created: f.created,
        updated: f.updated,
        valid_from: f.valid_from,
        valid_to: f.valid_to,
        superseded_by: f.superseded_by,
        supersedes: f.supersedes,
        body: d.body,
        text: text.to_string(),
    })
}

/// Writes via a temporary file in the same folder and a rename, so readers (and the watcher)
/// never see a partial file.
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deleted_content_frees_its_vectors_and_renames_reuse_them() {
        let dir = std::env::temp_dir().join(format!("sandlot-memory-unit-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let e = Arc::new(crate::embed::HashingEmbedder::new(64));
        let a = Author::default();
        let store = Store::init(&dir, e.clone(), &a).unwrap();
        let w = store
            .add(
                NewMemory {
                    title: "T".into(),
                    body: "alpha beta".into(),
                    ..Default::default()
                },
                &a,
            )
            .unwrap();
        let n = e.texts_embedded();
        assert_eq!(n, 1);
        store.rename(&w.path, "moved.md", &a).unwrap();
        assert_eq!(e.texts_embedded(), n);
        assert_eq!(lock(&store.index).vector_rows().unwrap(), 1);
        store.remove("moved.md", &a).unwrap();
        assert_eq!(lock(&store.index).vector_rows().unwrap(), 0);
        assert_eq!(store.counts().unwrap(), (0, 0, 0));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn paths_are_validated() {
        assert_eq!(
            validate_rel_path("people/alice.md").unwrap(),
            "people/alice.md"
        );
        assert_eq!(validate_rel_path("./a.md").unwrap(), "a.md");
        for bad in [
            "",
            "/etc/passwd",
            "../x.md",
            "a//b.md",
            ".git/config",
            "a/.sandlot/x",
            "a\\b",
        ] {
            assert!(validate_rel_path(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn plan_rows_degrades_bad_front_matter_to_text() {
        let (row, chunks) = plan_file_rows("a.md", "---\ntags: [x\n---\nbody\n", "h".into(), 1, 1);
        assert!(row.error.as_deref().unwrap().contains("a.md"));
        assert!(!chunks.is_empty());
        let (row, _) = plan_file_rows(
            "p/b.md",
            "---\nid: b1\ntitle: B\ntags: [t]\nvalid_from: 2026-01-01\nvalid_to: nonsense\n---\nx\n",
            "h".into(),
            1,
            1,
        );
        assert_eq!(row.mem_id, "b1");
        assert_eq!(row.folder, "p");
        assert_eq!(row.valid_from, Some(1767225600));
        assert!(row.valid_to.is_none());
        assert!(row.error.as_deref().unwrap().contains("valid_to"));
    }
}
