//! The on-disk store of collections, their versions, and per-principal views.
//!
//! Layout under the store directory:
//! ```text
//! collections/NAME/collection.json   source and ingest options
//! collections/NAME/HEAD              current version number
//! collections/NAME/versions/N.json   immutable manifest of version N
//! collections/NAME/versions/N.idx    trigram index of version N
//! collections/NAME/blobs/xx/HASH     document bodies (+ HASH.tri trigram sets)
//! collections/NAME/lock              held while ingesting or removing
//! audit.jsonl                        audit log of session commands
//! ```

use std::collections::HashMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

use crate::acl::Principal;
use crate::audit::{AuditLog, AuditSink};
use crate::blob::{BlobError, BlobStore};
use crate::index::{decode_trigrams, IndexError, Query, SearchIndex};
use crate::ingest::{self, IngestError, IngestLimits, IngestOptions, IngestReport, Source};
use crate::manifest::{DocEntry, Manifest, ManifestError, NodeId, Tree};
use crate::shell::{Limits, Session};

/// Errors from the collection store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// A collection name is not acceptable.
    #[error("invalid collection name {name:?}: use 1-64 characters from [A-Za-z0-9._-], not starting with '.'")]
    InvalidName { name: String },
    /// The collection does not exist.
    #[error("collection {name:?} does not exist")]
    NotFound { name: String },
    /// The collection already exists.
    #[error("collection {name:?} already exists")]
    AlreadyExists { name: String },
    /// The requested version does not exist.
    #[error("collection {name:?} has no version {version}")]
    NoSuchVersion { name: String, version: u64 },
    /// Filesystem I/O failed.
    #[error("{op} {path}")]
    Io {
        op: &'static str,
        path: PathBuf,
        source: io::Error,
    },
    /// A stored file is not in the expected format.
    #[error("corrupt {path}: {reason}")]
    Corrupt { path: PathBuf, reason: String },
    /// Ingest failed; the collection is unchanged.
    #[error("ingest into {name:?}")]
    Ingest {
        name: String,
        #[source]
        source: IngestError,
    },
    /// Index load/save failed.
    #[error(transparent)]
    Index(#[from] IndexError),
    /// Blob I/O failed.
    #[error(transparent)]
    Blob(#[from] BlobError),
    /// A manifest is inconsistent.
    #[error(transparent)]
    Manifest(#[from] ManifestError),
}

fn io_err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> StoreError + 'a {
    move |source| StoreError::Io {
        op,
        path: path.to_path_buf(),
        source,
    }
}

/// Persistent per-collection configuration (`collection.json`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CollectionConfig {
    /// Collection name.
    pub name: String,
    /// Where documents come from (re-used by `update` without a new source).
    pub source: Source,
    /// Ingest options (ACL policy).
    pub options: IngestOptions,
    /// Creation time, seconds since the Unix epoch.
    pub created: i64,
}

/// Summary of one collection.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CollectionInfo {
    /// Name.
    pub name: String,
    /// Head version.
    pub version: u64,
    /// Documents in the head version.
    pub documents: usize,
    /// Bytes in the head version.
    pub bytes: u64,
    /// Source description.
    pub source: String,
    /// When the head version was published, seconds since the Unix epoch.
    pub updated: i64,
}

/// One immutable version: manifest plus search index.
#[derive(Debug)]
pub struct Version {
    /// The manifest.
    pub manifest: Manifest,
    /// The trigram index over `manifest.docs`.
    pub index: SearchIndex,
}

/// What one principal sees of one version: the pruned tree and the content.
/// Shared (`Arc`) by every session and mount for principals with the same groups.
#[derive(Debug)]
pub struct View {
    collection: String,
    version: Arc<Version>,
    tree: Tree,
    blobs: BlobStore,
    /// False for a view loaded without its search index ([`View::load_unindexed`]):
    /// every document is then a candidate.
    indexed: bool,
}

impl View {
    /// The view of `version` of collection `name` in the store at `store_root` for
    /// `principal`, loaded for a reader that only browses and reads (the FUSE mount
    /// helper): the manifest alone, without the trigram index (every document is a
    /// search candidate, so searches stay correct, only slower), and without opening
    /// the store for writing. Nothing is cached.
    pub fn load_unindexed(
        store_root: &Path,
        name: &str,
        version: u64,
        principal: &Principal,
    ) -> Result<View, StoreError> {
        validate_name(name)?;
        let dir = store_root.join("collections").join(name);
        let mp = dir.join("versions").join(format!("{version}.json"));
        let manifest = read_manifest(&mp, name, version)?;
        let tree = Tree::for_principal(&manifest, principal)?;
        Ok(View {
            collection: name.to_string(),
            version: Arc::new(Version {
                manifest,
                // Empty, and free: `build` would allocate its 16M-entry tables.
                index: SearchIndex::default(),
            }),
            tree,
            blobs: BlobStore::new(dir.join("blobs")),
            indexed: false,
        })
    }

    /// Collection name.
    pub fn collection(&self) -> &str {
        &self.collection
    }

    /// Version number.
    pub fn version(&self) -> u64 {
        self.version.manifest.version
    }

    /// The pruned path tree.
    pub fn tree(&self) -> &Tree {
        &self.tree
    }

    /// Manifest entry of a file node.
    pub fn doc(&self, node: NodeId) -> Option<&DocEntry> {
        self.tree
            .doc(node)
            .map(|d| &self.version.manifest.docs[d as usize])
    }

    /// Content of a file node.
    pub fn read(&self, node: NodeId) -> Result<Vec<u8>, BlobError> {
        match self.doc(node) {
            Some(d) => self.blobs.get(&d.hash),
            None => Ok(Vec::new()),
        }
    }

    /// The stored file holding exactly the content of a file node (None for a
    /// directory). Readers that serve byte ranges (the FUSE mount) read it in place.
    pub fn blob_path(&self, node: NodeId) -> Option<PathBuf> {
        self.doc(node).map(|d| self.blobs.path_of(&d.hash, ""))
    }

    /// Whether the file node may match `q` (always true when `cands` is None).
    pub(crate) fn is_candidate(&self, node: NodeId, cands: &Option<Vec<bool>>) -> bool {
        match (cands, self.tree.doc(node)) {
            (None, _) => true,
            (Some(c), Some(d)) => c[d as usize],
            (Some(_), None) => false,
        }
    }

    /// Candidate documents for a trigram query.
    pub(crate) fn candidates(&self, q: &Query) -> Option<Vec<bool>> {
        if !self.indexed {
            return None;
        }
        self.version.index.candidates(q)
    }
}

/// A collection: versions on disk plus cached views.
pub struct Collection {
    name: String,
    dir: PathBuf,
    blobs: BlobStore,
    audit: Arc<dyn AuditSink>,
    head: Mutex<Option<Arc<Version>>>,
    views: Mutex<HashMap<(u64, String), Arc<View>>>,
}

impl std::fmt::Debug for Collection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Collection")
            .field("name", &self.name)
            .field("dir", &self.dir)
            .finish()
    }
}

const MAX_CACHED_VIEWS: usize = 256;

impl Collection {
    /// Name.
    pub fn name(&self) -> &str {
        &self.name
    }

    fn head_version_on_disk(&self) -> Result<u64, StoreError> {
        let p = self.dir.join("HEAD");
        let s = fs::read_to_string(&p).map_err(|e| {
            if e.kind() == io::ErrorKind::NotFound {
                StoreError::NotFound {
                    name: self.name.clone(),
                }
            } else {
                StoreError::Io {
                    op: "read",
                    path: p.clone(),
                    source: e,
                }
            }
        })?;
        s.trim().parse().map_err(|_| StoreError::Corrupt {
            path: p,
            reason: format!("bad version {:?}", s.trim()),
        })
    }

    fn load_version(&self, v: u64) -> Result<Version, StoreError> {
        let mp = self.dir.join("versions").join(format!("{v}.json"));
        let manifest = read_manifest(&mp, &self.name, v)?;
        let index = SearchIndex::load(&self.dir.join("versions").join(format!("{v}.idx")))?;
        if index.doc_count() as usize != manifest.docs.len() {
            return Err(StoreError::Corrupt {
                path: mp,
                reason: "index and manifest disagree".into(),
            });
        }
        Ok(Version { manifest, index })
    }

    /// The current head version (reloaded if another process published a newer one).
    pub fn head(&self) -> Result<Arc<Version>, StoreError> {
        let v = self.head_version_on_disk()?;
        let mut guard = self.head.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(h) = &*guard {
            if h.manifest.version == v {
                return Ok(h.clone());
            }
        }
        let loaded = Arc::new(self.load_version(v)?);
        *guard = Some(loaded.clone());
        Ok(loaded)
    }

    /// A specific version.
    pub fn version(&self, v: u64) -> Result<Arc<Version>, StoreError> {
        let head = self.head()?;
        if head.manifest.version == v {
            return Ok(head);
        }
        Ok(Arc::new(self.load_version(v)?))
    }

    /// The pruned view of `version` (head if None) for `principal`, cached.
    pub fn view_at(
        &self,
        principal: &Principal,
        version: Option<u64>,
    ) -> Result<Arc<View>, StoreError> {
        let ver = match version {
            Some(v) => self.version(v)?,
            None => self.head()?,
        };
        let key = (ver.manifest.version, principal.view_key());
        if let Some(v) = self
            .views
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&key)
        {
            return Ok(v.clone());
        }
        let tree = Tree::for_principal(&ver.manifest, principal)?;
        let view = Arc::new(View {
            collection: self.name.clone(),
            version: ver,
            tree,
            blobs: self.blobs.clone(),
            indexed: true,
        });
        let mut views = self.views.lock().unwrap_or_else(|p| p.into_inner());
        if views.len() >= MAX_CACHED_VIEWS {
            views.clear();
        }
        views.insert(key, view.clone());
        Ok(view)
    }

    /// The head view for `principal`.
    pub fn view(&self, principal: &Principal) -> Result<Arc<View>, StoreError> {
        self.view_at(principal, None)
    }

    /// Open a shell session on the head version for `principal`.
    pub fn open_session(
        &self,
        principal: Principal,
        limits: Limits,
    ) -> Result<Session, StoreError> {
        let view = self.view(&principal)?;
        Ok(Session::new(view, principal, limits, self.audit.clone()))
    }

    /// Open a shell session on a specific version.
    pub fn open_session_at(
        &self,
        version: u64,
        principal: Principal,
        limits: Limits,
    ) -> Result<Session, StoreError> {
        let view = self.view_at(&principal, Some(version))?;
        Ok(Session::new(view, principal, limits, self.audit.clone()))
    }

    /// Stored configuration.
    pub fn config(&self) -> Result<CollectionConfig, StoreError> {
        read_config(&self.dir)
    }

    /// Summary of the head version.
    pub fn info(&self) -> Result<CollectionInfo, StoreError> {
        let h = self.head()?;
        Ok(CollectionInfo {
            name: self.name.clone(),
            version: h.manifest.version,
            documents: h.manifest.docs.len(),
            bytes: h.manifest.docs.iter().map(|d| d.size).sum(),
            source: h.manifest.source.clone(),
            updated: h.manifest.created,
        })
    }
}

fn read_config(dir: &Path) -> Result<CollectionConfig, StoreError> {
    let p = dir.join("collection.json");
    let data = fs::read(&p).map_err(io_err("read", &p))?;
    serde_json::from_slice(&data).map_err(|e| StoreError::Corrupt {
        path: p,
        reason: e.to_string(),
    })
}

/// The collection store.
pub struct Store {
    root: PathBuf,
    audit: Arc<AuditLog>,
    sink: Arc<dyn AuditSink>,
    cache: Mutex<HashMap<String, Arc<Collection>>>,
    limits: IngestLimits,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("root", &self.root).finish()
    }
}

/// Check a collection name.
pub fn validate_name(name: &str) -> Result<(), StoreError> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(StoreError::InvalidName {
            name: name.to_string(),
        })
    }
}

fn now_secs() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

fn sync_filesystem(dir: &Path) -> Result<(), StoreError> {
    let f = fs::File::open(dir).map_err(io_err("open", dir))?;
    rustix::fs::syncfs(&f).map_err(|e| StoreError::Io {
        op: "syncfs",
        path: dir.to_path_buf(),
        source: e.into(),
    })
}

/// Held while a collection is being written.
struct CollectionLock {
    _file: fs::File,
}

fn lock_collection(dir: &Path) -> Result<CollectionLock, StoreError> {
    fs::create_dir_all(dir).map_err(io_err("create", dir))?;
    let p = dir.join("lock");
    let f = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&p)
        .map_err(io_err("open", &p))?;
    f.lock().map_err(io_err("lock", &p))?;
    Ok(CollectionLock { _file: f })
}

/// How [`Store::ingest`] treats an existing collection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IngestMode {
    /// Fail if the collection exists.
    Create,
    /// Fail if it does not exist.
    Update,
    /// Create or update.
    Upsert,
}

impl Store {
    /// Open (creating if needed) a store rooted at `dir`.
    pub fn open(dir: impl Into<PathBuf>) -> Result<Store, StoreError> {
        let root: PathBuf = dir.into();
        let cdir = root.join("collections");
        fs::create_dir_all(&cdir).map_err(io_err("create", &cdir))?;
        let audit = Arc::new(AuditLog::new(root.join("audit.jsonl")));
        Ok(Store {
            sink: audit.clone(),
            audit,
            root,
            cache: Mutex::new(HashMap::new()),
            limits: IngestLimits::default(),
        })
    }

    /// The same store, reading local sources within `limits`.
    pub fn with_ingest_limits(mut self, limits: IngestLimits) -> Store {
        self.limits = limits;
        self
    }

    /// Open with a custom audit sink (the daemon's), instead of `audit.jsonl`.
    pub fn open_with_audit(
        dir: impl Into<PathBuf>,
        sink: Arc<dyn AuditSink>,
    ) -> Result<Store, StoreError> {
        let mut s = Store::open(dir)?;
        s.sink = sink;
        Ok(s)
    }

    /// Store directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The store's own audit log (`audit.jsonl`).
    pub fn audit_log(&self) -> &AuditLog {
        &self.audit
    }

    fn dir_of(&self, name: &str) -> PathBuf {
        self.root.join("collections").join(name)
    }

    /// Open a collection (cached).
    pub fn collection(&self, name: &str) -> Result<Arc<Collection>, StoreError> {
        validate_name(name)?;
        if let Some(c) = self
            .cache
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(name)
        {
            if c.dir.join("HEAD").exists() {
                return Ok(c.clone());
            }
        }
        let dir = self.dir_of(name);
        if !dir.join("HEAD").is_file() {
            return Err(StoreError::NotFound {
                name: name.to_string(),
            });
        }
        let c = Arc::new(Collection {
            name: name.to_string(),
            blobs: BlobStore::new(dir.join("blobs")),
            dir,
            audit: self.sink.clone(),
            head: Mutex::new(None),
            views: Mutex::new(HashMap::new()),
        });
        c.head()?;
        self.cache
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(name.to_string(), c.clone());
        Ok(c)
    }

    /// All collections, sorted by name.
    pub fn list(&self) -> Result<Vec<CollectionInfo>, StoreError> {
        let cdir = self.root.join("collections");
        let mut names = Vec::new();
        for ent in fs::read_dir(&cdir).map_err(io_err("list", &cdir))? {
            let ent = ent.map_err(io_err("list", &cdir))?;
            if let Some(n) = ent.file_name().to_str() {
                if validate_name(n).is_ok() && ent.path().join("HEAD").is_file() {
                    names.push(n.to_string());
                }
            }
        }
        names.sort();
        names.iter().map(|n| self.collection(n)?.info()).collect()
    }

    /// Create a collection from `source`.
    pub fn create(
        &self,
        name: &str,
        source: Source,
        options: IngestOptions,
    ) -> Result<IngestReport, StoreError> {
        self.ingest(name, Some(source), Some(options), IngestMode::Create)
    }

    /// Re-ingest a collection from its stored source (or a new one), publishing
    /// a new version only if something changed.
    pub fn update(
        &self,
        name: &str,
        source: Option<Source>,
        options: Option<IngestOptions>,
    ) -> Result<IngestReport, StoreError> {
        self.ingest(name, source, options, IngestMode::Update)
    }

    /// Ingest with explicit mode. `source`/`options` default to the stored ones.
    pub fn ingest(
        &self,
        name: &str,
        source: Option<Source>,
        options: Option<IngestOptions>,
        mode: IngestMode,
    ) -> Result<IngestReport, StoreError> {
        validate_name(name)?;
        let dir = self.dir_of(name);
        let existed_before = dir.exists();
        let lock = lock_collection(&dir)?;
        let res = self.ingest_locked(name, &dir, source, options, mode);
        drop(lock);
        if res.is_err() && !existed_before && !dir.join("HEAD").exists() {
            // Leave nothing half-created behind.
            let _ = fs::remove_dir_all(&dir);
        }
        res
    }

    fn ingest_locked(
        &self,
        name: &str,
        dir: &Path,
        source: Option<Source>,
        options: Option<IngestOptions>,
        mode: IngestMode,
    ) -> Result<IngestReport, StoreError> {
        let exists = dir.join("HEAD").is_file();
        match (mode, exists) {
            (IngestMode::Create, true) => {
                return Err(StoreError::AlreadyExists { name: name.into() })
            }
            (IngestMode::Update, false) => return Err(StoreError::NotFound { name: name.into() }),
            _ => {}
        }
        let old_cfg = if exists {
            Some(read_config(dir)?)
        } else {
            None
        };
        let source = match (source, &old_cfg) {
            (Some(s), _) => s,
            (None, Some(c)) => c.source.clone(),
            (None, None) => {
                return Err(StoreError::Ingest {
                    name: name.into(),
                    source: IngestError::BadSpec {
                        spec: String::new(),
                        reason: "a new collection needs a source".into(),
                    },
                })
            }
        };
        let options = options
            .or_else(|| old_cfg.as_ref().map(|c| c.options.clone()))
            .unwrap_or_default();
        let coll = if exists {
            Some(self.collection(name)?)
        } else {
            None
        };
        let prev = match &coll {
            Some(c) => Some(c.head()?),
            None => None,
        };
        let blobs = BlobStore::new(dir.join("blobs"));
        let applied = ingest::run(
            name,
            &source,
            &options,
            self.limits,
            prev.as_ref().map(|v| &v.manifest),
            &blobs,
        )
        .map_err(|e| StoreError::Ingest {
            name: name.into(),
            source: e,
        })?;
        let mut report = applied.report;
        let new_cfg = CollectionConfig {
            name: name.to_string(),
            source: source.without_secrets(),
            options: options.clone(),
            created: old_cfg.as_ref().map(|c| c.created).unwrap_or_else(now_secs),
        };
        let unchanged = prev
            .as_ref()
            .is_some_and(|p| p.manifest.docs == applied.docs && p.manifest.dirs == applied.dirs)
            && old_cfg.as_ref() == Some(&new_cfg);
        if unchanged {
            report.changed = false;
            return Ok(report);
        }
        let version = prev.as_ref().map(|p| p.manifest.version + 1).unwrap_or(1);
        let manifest = Manifest {
            collection: name.to_string(),
            version,
            created: now_secs(),
            source: source.describe(),
            docs: applied.docs,
            dirs: applied.dirs,
        };
        // Validate the tree shape before publishing anything.
        Tree::build(&manifest, |_| true)?;
        let mut lists = Vec::with_capacity(manifest.docs.len());
        for d in &manifest.docs {
            let tri = match blobs
                .get_sidecar(&d.hash, "tri")
                .ok()
                .and_then(|b| decode_trigrams(&b))
            {
                Some(t) => t,
                None => {
                    let t = crate::index::doc_trigrams(&blobs.get(&d.hash)?);
                    blobs.put_sidecar(&d.hash, "tri", &crate::index::encode_trigrams(&t))?;
                    t
                }
            };
            lists.push(tri);
        }
        let index = SearchIndex::build(&lists);
        drop(lists);
        let vdir = dir.join("versions");
        fs::create_dir_all(&vdir).map_err(io_err("create", &vdir))?;
        index.save(&vdir.join(format!("{version}.idx")))?;
        let mp = vdir.join(format!("{version}.json"));
        let mjson = serde_json::to_vec(&manifest).expect("manifest serializes");
        crate::blob::write_atomic(&mp, &mjson).map_err(io_err("write", &mp))?;
        let cp = dir.join("collection.json");
        let cjson = serde_json::to_vec_pretty(&new_cfg).expect("config serializes");
        crate::blob::write_atomic(&cp, &cjson).map_err(io_err("write", &cp))?;
        sync_filesystem(dir)?;
        let hp = dir.join("HEAD");
        crate::blob::write_atomic(&hp, format!("{version}\n").as_bytes())
            .map_err(io_err("write", &hp))?;
        sync_filesystem(dir)?;
        report.version = version;
        report.changed = true;
        Ok(report)
    }

    /// Remove a collection and all its versions and content.
    pub fn remove(&self, name: &str) -> Result<(), StoreError> {
        validate_name(name)?;
        let dir = self.dir_of(name);
        if !dir.join("HEAD").is_file() {
            return Err(StoreError::NotFound { name: name.into() });
        }
        let lock = lock_collection(&dir)?;
        // Rename first so readers never see a half-deleted collection.
        let tomb = self
            .root
            .join("collections")
            .join(format!(".removing-{name}-{}", std::process::id()));
        fs::rename(&dir, &tomb).map_err(io_err("rename", &dir))?;
        drop(lock);
        self.cache
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(name);
        fs::remove_dir_all(&tomb).map_err(io_err("remove", &tomb))
    }
}

/// Reads and parses the manifest of `name` at `version` from `mp`.
fn read_manifest(mp: &Path, name: &str, version: u64) -> Result<Manifest, StoreError> {
    let data = fs::read(mp).map_err(|e| {
        if e.kind() == io::ErrorKind::NotFound {
            StoreError::NoSuchVersion {
                name: name.to_string(),
                version,
            }
        } else {
            StoreError::Io {
                op: "read",
                path: mp.to_path_buf(),
                source: e,
            }
        }
    })?;
    serde_json::from_slice(&data).map_err(|e| StoreError::Corrupt {
        path: mp.to_path_buf(),
        reason: e.to_string(),
    })
}
