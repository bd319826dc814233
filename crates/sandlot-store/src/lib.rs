//! Sandlot's image store: content-addressed, in the daemon's data directory.
//!
//! ```text
//! <root>/
//!   images.db            SQLite: layers, images, tags, leases, build cache
//!   store.lock           flock held while the metadata and layer set change
//!   blobs/sha256/<hex>   layer tarballs (as imported: gzip or plain) and configs
//!   layers/<diff-id>/    each layer unpacked once, in overlayfs format
//!   tmp/                 staging (same filesystem, so commits are renames)
//! ```
//!
//! An image is an ordered list of layers (bottom first) plus an OCI image config
//! (env, workdir, user, entrypoint); its id is the sha256 of that config. Layers are
//! keyed by their diff id (sha256 of the uncompressed tar), so a layer shared by
//! several images is stored and unpacked once. Sandboxes stack layer directories
//! as overlayfs lower layers; nothing is copied per sandbox.
//!
//! Tenants: an image may belong to a tenant (its `owner`: a snapshot holds that
//! tenant's data), and tags live in namespaces, the shared one (the operator's)
//! and one per tenant. A [`Viewer`] says whose view a lookup takes: the operator
//! sees every image and names the shared tags; a tenant sees the shared images and
//! its own, and a name is its own tag first, then a shared one, never another
//! tenant's.

#![forbid(unsafe_code)]

use std::fs;
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use rusqlite::{params, Connection, OptionalExtension};
use sandlot_proto::clock::now_ms;
use serde::{Deserialize, Serialize};

pub mod build;
pub mod digest;
mod gc;
pub mod layer;
pub mod oci;
pub mod reference;
pub mod registry;
pub mod tar_bound;

pub use digest::Digest;
pub use layer::{Budget, IdMap, PackSource, SizeLimit, TreeDiff};
pub use reference::ImageName;

use digest::{HashingReader, HashingWriter};

/// Media types of layers and configs.
pub mod media {
    pub const OCI_LAYER: &str = "application/vnd.oci.image.layer.v1.tar";
    pub const OCI_LAYER_GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
    pub const DOCKER_LAYER: &str = "application/vnd.docker.image.rootfs.diff.tar";
    pub const DOCKER_LAYER_GZIP: &str = "application/vnd.docker.image.rootfs.diff.tar.gzip";
    pub const OCI_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
    pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
    pub const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
    pub const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
    pub const DOCKER_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
    pub const DOCKER_CONFIG: &str = "application/vnd.docker.container.image.v1+json";
}

/// Errors of the image store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("no image {0}")]
    NotFound(String),
    #[error("image reference {0} is ambiguous: give more of the id")]
    Ambiguous(String),
    /// `holders`: the sandboxes and snapshots that lease it.
    #[error("image {image} is in use by {}", .holders.join(", "))]
    InUse { image: String, holders: Vec<String> },
    #[error(transparent)]
    BadName(#[from] reference::BadName),
    #[error("digest mismatch for {what}: expected {expected}, got {actual}")]
    DigestMismatch {
        what: String,
        expected: Digest,
        actual: Digest,
    },
    #[error("invalid image {what}: {problem}")]
    Invalid { what: String, problem: String },
    #[error(transparent)]
    Layer(#[from] layer::LayerError),
    #[error("image database {op}: {source}")]
    Sql {
        op: &'static str,
        #[source]
        source: rusqlite::Error,
    },
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: String,
        #[source]
        source: io::Error,
    },
}

fn sql(op: &'static str) -> impl FnOnce(rusqlite::Error) -> StoreError {
    move |source| StoreError::Sql { op, source }
}

pub(crate) fn io_at<'a>(
    op: &'static str,
    path: &'a Path,
) -> impl FnOnce(io::Error) -> StoreError + 'a {
    move |source| StoreError::Io {
        op,
        path: path.display().to_string(),
        source,
    }
}

/// The first symbolic link on the way from `root` down `rel` (the last component
/// too when `last`), relative to `root`. What a client or an archive supplied (a
/// build context, an unpacked archive) must not lead the daemon out of itself.
pub fn link_on_the_way(root: &Path, rel: &Path, last: bool) -> Option<PathBuf> {
    let mut p = root.to_path_buf();
    let n = rel.components().count();
    for (i, c) in rel.components().enumerate() {
        p.push(c);
        if (last || i + 1 < n) && fs::symlink_metadata(&p).is_ok_and(|m| m.file_type().is_symlink())
        {
            return Some(p.strip_prefix(root).unwrap_or(&p).to_path_buf());
        }
    }
    None
}

pub(crate) fn invalid(what: impl Into<String>, problem: impl Into<String>) -> StoreError {
    StoreError::Invalid {
        what: what.into(),
        problem: problem.into(),
    }
}

/// Points a tag at image `id` in its namespace.
fn set_tag(db: &Connection, tag: ScopedTag, id: &Digest) -> Result<(), StoreError> {
    db.execute(
        "INSERT INTO image_tags(scope, name, image_id) VALUES(?1,?2,?3)
         ON CONFLICT(scope, name) DO UPDATE SET image_id = excluded.image_id",
        params![
            tag.tenant.unwrap_or(""),
            tag.name.to_string(),
            id.to_string()
        ],
    )
    .map_err(sql("tag image"))?;
    Ok(())
}

/// What a sandbox takes from its image's config.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageConfig {
    /// `KEY=VALUE` pairs.
    pub env: Vec<String>,
    pub workdir: Option<String>,
    pub user: Option<String>,
    pub entrypoint: Vec<String>,
    pub cmd: Vec<String>,
    /// Its layers go on top of the built-in `host` image (a snapshot of a `host`
    /// sandbox): a sandbox of it gets the host's `/usr` and `/etc` entries as the
    /// `host` image does (label `org.sandlot.base=host`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub host_base: bool,
}

/// One layer of an image.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayerInfo {
    /// sha256 of the uncompressed tar.
    pub diff_id: Digest,
    /// sha256 of the stored blob (compressed or not).
    pub blob: Digest,
    pub media_type: String,
    pub blob_size: u64,
}

/// Whose view of the image set a lookup takes (see the crate's notes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Viewer<'a> {
    /// Every image; names are the shared tags.
    Operator,
    /// The shared images only, by the shared tags (what belongs to no tenant yet,
    /// e.g. a warm pool's sandboxes).
    Shared,
    /// The shared images and the tenant's own; a name is the tenant's tag first,
    /// then a shared one.
    Tenant(&'a str),
}

impl Viewer<'_> {
    /// Whether this viewer may see `img`.
    pub fn sees(&self, img: &ImageInfo) -> bool {
        match (self, img.owner.as_deref()) {
            (Viewer::Operator, _) | (_, None) => true,
            (Viewer::Shared, Some(_)) => false,
            (Viewer::Tenant(t), Some(o)) => *t == o,
        }
    }

    /// The tag namespace this viewer names first (`""`: the shared one).
    fn namespace(&self) -> &str {
        match self {
            Viewer::Tenant(t) => t,
            _ => "",
        }
    }
}

/// A tag in a namespace.
#[derive(Debug, Clone, Copy)]
pub struct ScopedTag<'a> {
    /// The tenant whose namespace it is in; `None`: the shared (operator's) one.
    pub tenant: Option<&'a str>,
    pub name: &'a ImageName,
}

impl<'a> ScopedTag<'a> {
    /// A tag in the shared namespace.
    pub fn shared(name: &'a ImageName) -> ScopedTag<'a> {
        ScopedTag { tenant: None, name }
    }
}

/// A tag of an image in a tenant's namespace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TenantTag {
    pub tenant: String,
    pub name: String,
}

/// What [`ImageStore::remove`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Removal {
    pub image: ImageInfo,
    /// The image went (not only a tag of it), with its owner and every tag.
    pub image_removed: bool,
}

/// Owner records of a store from before owners lived in its database: one file
/// per image (`<dir>/<hex id>` holding the tenant), read into the database and
/// removed when the store is opened.
#[derive(Debug, Clone, Copy)]
pub struct LegacyOwners<'a> {
    pub dir: &'a Path,
    /// The tenant of the operator's own sandboxes: tags of its images stay shared
    /// (the operator tagged them), every other owner's move to its namespace.
    pub operator_tenant: &'a str,
}

/// An image in the store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageInfo {
    /// sha256 of the OCI config.
    pub id: Digest,
    /// Tags in the shared (operator's) namespace.
    pub tags: Vec<String>,
    /// Tags in tenants' namespaces.
    pub tenant_tags: Vec<TenantTag>,
    /// The tenant it belongs to (a snapshot); `None`: the shared set.
    pub owner: Option<String>,
    /// Bottom first.
    pub layers: Vec<LayerInfo>,
    pub config: ImageConfig,
    /// The image a snapshot or build step started from.
    pub parent: Option<Digest>,
    /// `import`, `snapshot`, `build`, `pull`, `directory`.
    pub source: String,
    /// Milliseconds since the epoch.
    pub created_at: i64,
    /// Sum of the layer blobs.
    pub size: u64,
}

/// A directory packed into a staged layer blob, not yet stored (the staged file
/// is removed if it is dropped unstored).
#[derive(Debug)]
pub struct PackedLayer {
    staged: Staged,
    file: fs::File,
    pub diff_id: Digest,
    pub size: u64,
}

/// A staging file under `tmp/`, removed on drop unless it was moved into place.
#[derive(Debug)]
struct Staged(Option<PathBuf>);

impl Staged {
    fn path(&self) -> &Path {
        self.0.as_deref().expect("a staged file")
    }

    /// Moves it to `to` (kept from then on).
    fn rename_to(mut self, to: &Path) -> io::Result<()> {
        let from = self.0.take().expect("a staged file");
        fs::rename(&from, to).inspect_err(|_| {
            let _ = fs::remove_file(&from);
        })
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        if let Some(p) = self.0.take() {
            let _ = fs::remove_file(p);
        }
    }
}

/// What a new image records besides its layers (see
/// [`ImageStore::commit_packed`]).
#[derive(Debug, Clone, Copy)]
pub struct Commit<'a> {
    pub config: &'a ImageConfig,
    /// Its history entry.
    pub comment: &'a str,
    /// `snapshot`, `build`, ...
    pub source: &'a str,
    pub tag: Option<ScopedTag<'a>>,
    /// The tenant it belongs to (a snapshot of that tenant's sandbox).
    pub owner: Option<&'a str>,
}

/// What `prune` removed.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize)]
pub struct PruneReport {
    pub layers: Vec<Digest>,
    pub blobs: Vec<Digest>,
    pub bytes: u64,
}

/// The image store.
pub struct ImageStore {
    root: PathBuf,
    db: Mutex<Connection>,
}

/// An exclusive lock on the store's layer set (released on drop).
pub struct StoreLock(#[allow(dead_code)] fs::File);

// `images.owner` (added by `migrate`): the tenant an image belongs to (NULL: shared).
// `image_tags.scope`: the tenant whose namespace a tag is in ('': shared).
const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS layers(
  diff_id TEXT PRIMARY KEY, blob TEXT NOT NULL, media_type TEXT NOT NULL,
  blob_size INTEGER NOT NULL, created_at INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS images(
  id TEXT PRIMARY KEY, config BLOB NOT NULL, parent TEXT, source TEXT NOT NULL,
  created_at INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS image_layers(
  image_id TEXT NOT NULL, pos INTEGER NOT NULL, diff_id TEXT NOT NULL,
  PRIMARY KEY(image_id, pos));
CREATE TABLE IF NOT EXISTS image_tags(scope TEXT NOT NULL, name TEXT NOT NULL,
  image_id TEXT NOT NULL, PRIMARY KEY(scope, name));
CREATE INDEX IF NOT EXISTS image_tags_by_image ON image_tags(image_id);
CREATE TABLE IF NOT EXISTS leases(holder TEXT PRIMARY KEY, image_id TEXT NOT NULL,
  created_at INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS build_cache(key TEXT PRIMARY KEY, image_id TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS orphans(reference TEXT PRIMARY KEY);
";

/// Brings a store of an earlier schema up to date (under the store lock): images
/// gain their `owner` (from `legacy` records), and the single tag namespace
/// (`tags`) becomes the shared one, but for tags of images that belong to a tenant
/// (other than the operator's own), which move to that tenant's namespace.
fn migrate(c: &mut Connection, legacy: Option<LegacyOwners>) -> Result<(), StoreError> {
    let has_owner: bool = c
        .prepare("SELECT 1 FROM pragma_table_info('images') WHERE name = 'owner'")
        .and_then(|mut st| st.exists([]))
        .map_err(sql("read schema"))?;
    if !has_owner {
        c.execute_batch("ALTER TABLE images ADD COLUMN owner TEXT")
            .map_err(sql("add image owners"))?;
    }
    let records: Vec<(PathBuf, Option<(Digest, String)>)> = match legacy {
        Some(l) => fs::read_dir(l.dir)
            .map(|rd| {
                rd.flatten()
                    .map(|e| {
                        let id = Digest::from_hex(&e.file_name().to_string_lossy()).ok();
                        let tenant = fs::read_to_string(e.path()).ok();
                        (e.path(), id.zip(tenant))
                    })
                    .collect()
            })
            .unwrap_or_default(),
        None => Vec::new(),
    };
    let tx = c.transaction().map_err(sql("begin"))?;
    for (_, r) in &records {
        if let Some((id, tenant)) = r {
            tx.execute(
                "UPDATE images SET owner = ?1 WHERE id = ?2 AND owner IS NULL",
                params![tenant, id.to_string()],
            )
            .map_err(sql("record image owner"))?;
        }
    }
    let old_tags: bool = tx
        .prepare("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'tags'")
        .and_then(|mut st| st.exists([]))
        .map_err(sql("read schema"))?;
    if old_tags {
        let operator = legacy.map_or("", |l| l.operator_tenant);
        tx.execute(
            "INSERT OR REPLACE INTO image_tags(scope, name, image_id)
             SELECT CASE WHEN i.owner IS NULL OR i.owner = ?1 THEN '' ELSE i.owner END,
                    t.name, t.image_id
             FROM tags t LEFT JOIN images i ON i.id = t.image_id",
            [operator],
        )
        .map_err(sql("move tags"))?;
        tx.execute_batch("DROP TABLE tags")
            .map_err(sql("drop the old tags"))?;
    }
    tx.commit().map_err(sql("commit migration"))?;
    // The records are in the database now (those of removed images were stale:
    // a later image with the same id must not inherit them).
    for (p, _) in records {
        let _ = fs::remove_file(p);
    }
    if let Some(l) = legacy {
        let _ = fs::remove_dir(l.dir);
    }
    Ok(())
}

impl ImageStore {
    /// Opens (creating) the store under `root`.
    pub fn open(root: &Path) -> Result<ImageStore, StoreError> {
        ImageStore::open_with(root, None)
    }

    /// [`open`](Self::open), reading owner records an earlier version kept beside
    /// the store (see [`LegacyOwners`]).
    pub fn open_with(root: &Path, legacy: Option<LegacyOwners>) -> Result<ImageStore, StoreError> {
        for d in ["", "blobs/sha256", "layers", "tmp"] {
            let p = root.join(d);
            fs::create_dir_all(&p).map_err(io_at("create", &p))?;
        }
        let dbp = root.join("images.db");
        let c = Connection::open(&dbp).map_err(sql("open"))?;
        c.busy_timeout(std::time::Duration::from_secs(10))
            .map_err(sql("set busy timeout"))?;
        c.pragma_update(None, "journal_mode", "WAL")
            .map_err(sql("enable WAL"))?;
        // WAL with NORMAL stays consistent on power loss (it may lose the last
        // transactions, e.g. a lease) and saves an fsync per commit.
        c.pragma_update(None, "synchronous", "NORMAL")
            .map_err(sql("set synchronous"))?;
        let store = ImageStore {
            root: root.to_path_buf(),
            db: Mutex::new(c),
        };
        {
            let _l = store.lock()?;
            let mut c = store.db();
            c.execute_batch(SCHEMA).map_err(sql("create schema"))?;
            migrate(&mut c, legacy)?;
        }
        Ok(store)
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    fn db(&self) -> MutexGuard<'_, Connection> {
        self.db.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes the store lock (other processes, e.g. the CLI next to the daemon, too).
    pub fn lock(&self) -> Result<StoreLock, StoreError> {
        let p = self.root.join("store.lock");
        let f = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&p)
            .map_err(io_at("open", &p))?;
        rustix::fs::flock(&f, rustix::fs::FlockOperation::LockExclusive).map_err(|e| {
            StoreError::Io {
                op: "lock",
                path: p.display().to_string(),
                source: e.into(),
            }
        })?;
        Ok(StoreLock(f))
    }

    pub fn blob_path(&self, d: &Digest) -> PathBuf {
        self.root.join("blobs/sha256").join(d.hex())
    }

    pub fn layer_dir(&self, diff_id: &Digest) -> PathBuf {
        self.root.join("layers").join(diff_id.hex())
    }

    /// A fresh staging path under `tmp/`.
    pub fn tmp_path(&self, what: &str) -> PathBuf {
        use std::sync::atomic::{AtomicU64, Ordering};
        static SEQ: AtomicU64 = AtomicU64::new(0);
        self.root.join("tmp").join(format!(
            "{what}-{}-{}-{}",
            std::process::id(),
            now_ms(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ))
    }

    /// Stores `data` as a blob; returns its digest.
    pub fn put_blob_bytes(&self, data: &[u8]) -> Result<Digest, StoreError> {
        let d = Digest::of(data);
        let p = self.blob_path(&d);
        if !p.exists() {
            let tmp = self.tmp_path("blob");
            fs::write(&tmp, data).map_err(io_at("write", &tmp))?;
            fs::rename(&tmp, &p).map_err(io_at("store blob", &p))?;
        }
        Ok(d)
    }

    /// Moves a staged file into the blob store, verifying it against `expected`.
    pub fn put_blob_file(
        &self,
        staged: &Path,
        expected: Option<&Digest>,
    ) -> Result<(Digest, u64), StoreError> {
        let f = fs::File::open(staged).map_err(io_at("open", staged))?;
        let (d, n) = HashingReader::new(BufReader::new(f))
            .finish()
            .map_err(io_at("read", staged))?;
        if let Some(e) = expected {
            if *e != d {
                let _ = fs::remove_file(staged);
                return Err(StoreError::DigestMismatch {
                    what: format!("blob {e}"),
                    expected: *e,
                    actual: d,
                });
            }
        }
        let p = self.blob_path(&d);
        if p.exists() {
            let _ = fs::remove_file(staged);
        } else {
            fs::rename(staged, &p).map_err(io_at("store blob", &p))?;
        }
        Ok((d, n))
    }

    /// Moves a staged file whose digest the caller computed while writing it
    /// into the blob store (no second hashing pass).
    pub(crate) fn adopt_blob(&self, staged: &Path, digest: &Digest) -> Result<(), StoreError> {
        let p = self.blob_path(digest);
        if p.exists() {
            let _ = fs::remove_file(staged);
        } else {
            fs::rename(staged, &p).map_err(io_at("store blob", &p))?;
        }
        Ok(())
    }

    /// Unpacks a stored layer blob (gzip or plain tar), verifying its diff id when
    /// one is expected, and records the layer. Unpacks only once per diff id.
    pub fn add_layer(
        &self,
        blob: &Digest,
        media_type: &str,
        expected_diff_id: Option<&Digest>,
    ) -> Result<LayerInfo, StoreError> {
        let bp = self.blob_path(blob);
        let blob_size = fs::metadata(&bp).map_err(io_at("stat", &bp))?.len();
        if let Some(d) = expected_diff_id {
            if let Some(l) = self.layer(d)? {
                if self.layer_dir(d).is_dir() {
                    return Ok(l);
                }
            }
        }
        let gz = media_type.ends_with("gzip") || media_type.ends_with("+gzip") || {
            let mut m = [0u8; 2];
            fs::File::open(&bp)
                .and_then(|mut f| f.read_exact(&mut m))
                .is_ok()
                && m == [0x1f, 0x8b]
        };
        if media_type.ends_with("zstd") {
            return Err(invalid(
                format!("layer {blob}"),
                "zstd-compressed layers are not supported (gzip and plain tar are)",
            ));
        }
        let f = BufReader::new(fs::File::open(&bp).map_err(io_at("open", &bp))?);
        let dec: Box<dyn Read> = if gz {
            Box::new(flate2::read::MultiGzDecoder::new(f))
        } else {
            Box::new(f)
        };
        let tmp = self.tmp_path("layer");
        fs::create_dir(&tmp).map_err(io_at("create", &tmp))?;
        let mut hr = HashingReader::new(dec);
        let res = layer::unpack(&mut hr, &tmp)
            .map_err(StoreError::from)
            .and_then(|_| hr.finish().map_err(io_at("read layer", &bp)));
        let (diff_id, _) = match res {
            Ok(v) => v,
            Err(e) => {
                let _ = fs::remove_dir_all(&tmp);
                return Err(e);
            }
        };
        if let Some(e) = expected_diff_id {
            if *e != diff_id {
                let _ = fs::remove_dir_all(&tmp);
                return Err(StoreError::DigestMismatch {
                    what: format!("uncompressed layer {blob}"),
                    expected: *e,
                    actual: diff_id,
                });
            }
        }
        self.commit_layer_dir(&tmp, diff_id, *blob, media_type, blob_size)
    }

    /// Moves an unpacked layer into place and records it (keeps an existing copy).
    fn commit_layer_dir(
        &self,
        tmp: &Path,
        diff_id: Digest,
        blob: Digest,
        media_type: &str,
        blob_size: u64,
    ) -> Result<LayerInfo, StoreError> {
        let _l = self.lock()?;
        let dst = self.layer_dir(&diff_id);
        if dst.is_dir() {
            let _ = fs::remove_dir_all(tmp);
        } else {
            fs::rename(tmp, &dst).map_err(io_at("store layer", &dst))?;
        }
        let info = LayerInfo {
            diff_id,
            blob,
            media_type: media_type.to_string(),
            blob_size,
        };
        self.db()
            .execute(
                "INSERT INTO layers(diff_id, blob, media_type, blob_size, created_at)
                 VALUES(?1,?2,?3,?4,?5) ON CONFLICT(diff_id) DO NOTHING",
                params![
                    diff_id.to_string(),
                    blob.to_string(),
                    media_type,
                    blob_size as i64,
                    now_ms()
                ],
            )
            .map_err(sql("record layer"))?;
        Ok(self.layer(&diff_id)?.unwrap_or(info))
    }

    /// Packs a directory in overlay format (a sandbox's writable layer, or any
    /// directory tree) into a new layer: blob, diff id, unpacked copy.
    pub fn layer_from_dir(&self, dir: &Path) -> Result<LayerInfo, StoreError> {
        let packed = self.pack_dir(dir, &mut Budget::unlimited())?;
        self.finish_layer(packed)
    }

    /// First half of [`layer_from_dir`](Self::layer_from_dir): reads `dir` into a
    /// staged blob (the only part that needs `dir` to hold still, e.g. a frozen
    /// sandbox's writable layer). What the layer expands to counts against
    /// `budget`: past its limit, nothing is left staged.
    pub fn pack_dir(&self, dir: &Path, budget: &mut Budget) -> Result<PackedLayer, StoreError> {
        self.pack_dir_from(dir, &PackSource::default(), budget)
    }

    /// [`pack_dir`](Self::pack_dir) of a tree read as `source` says (a running
    /// sandbox's root seen from the host: its own filesystem only, its ids mapped
    /// back to the sandbox's).
    pub fn pack_dir_from(
        &self,
        dir: &Path,
        source: &PackSource,
        budget: &mut Budget,
    ) -> Result<PackedLayer, StoreError> {
        let staged = Staged(Some(self.tmp_path("blob")));
        let f = fs::File::create(staged.path()).map_err(io_at("create", staged.path()))?;
        let w = HashingWriter::new(BufWriter::new(f));
        let w = layer::pack_from(dir, source, w, budget)?;
        let (bw, diff_id, size) = w.finish();
        let file = bw
            .into_inner()
            .map_err(|e| e.into_error())
            .map_err(io_at("write", staged.path()))?;
        Ok(PackedLayer {
            staged,
            file,
            diff_id,
            size,
        })
    }

    /// Second half: makes a packed directory a stored, unpacked layer.
    pub fn finish_layer(&self, p: PackedLayer) -> Result<LayerInfo, StoreError> {
        let PackedLayer {
            staged,
            file,
            diff_id,
            size,
        } = p;
        file.sync_all().map_err(io_at("write", staged.path()))?;
        drop(file);
        let bp = self.blob_path(&diff_id);
        if !bp.exists() {
            staged.rename_to(&bp).map_err(io_at("store blob", &bp))?;
        }
        if let Some(l) = self.layer(&diff_id)? {
            if self.layer_dir(&diff_id).is_dir() {
                return Ok(l);
            }
        }
        let tmp = self.tmp_path("layer");
        fs::create_dir(&tmp).map_err(io_at("create", &tmp))?;
        let f = BufReader::new(fs::File::open(&bp).map_err(io_at("open", &bp))?);
        if let Err(e) = layer::unpack(f, &tmp) {
            let _ = fs::remove_dir_all(&tmp);
            return Err(e.into());
        }
        self.commit_layer_dir(&tmp, diff_id, diff_id, media::OCI_LAYER, size)
    }

    pub fn layer(&self, diff_id: &Digest) -> Result<Option<LayerInfo>, StoreError> {
        self.db()
            .query_row(
                "SELECT blob, media_type, blob_size FROM layers WHERE diff_id = ?1",
                [diff_id.to_string()],
                |r| {
                    Ok((
                        r.get::<_, String>(0)?,
                        r.get::<_, String>(1)?,
                        r.get::<_, i64>(2)?,
                    ))
                },
            )
            .optional()
            .map_err(sql("read layer"))?
            .map(|(b, m, s)| {
                Ok(LayerInfo {
                    diff_id: *diff_id,
                    blob: b
                        .parse()
                        .map_err(|e: digest::BadDigest| invalid("layer record", e.to_string()))?,
                    media_type: m,
                    blob_size: s as u64,
                })
            })
            .transpose()
    }

    /// Records an image made of `layers` (bottom first) with `config`; tags it.
    /// Returns the stored image (an identical config yields the same id).
    pub fn add_image(
        &self,
        layers: &[LayerInfo],
        config: &ImageConfig,
        history: &str,
        parent: Option<Digest>,
        source: &str,
        tag: Option<&ImageName>,
    ) -> Result<ImageInfo, StoreError> {
        let cfg = oci::config_json(layers, config, history, parent.as_ref(), None);
        self.add_image_raw(&cfg, layers, parent, source, tag)
    }

    /// Records an image from its exact config bytes (as imported: the id must not
    /// change).
    pub fn add_image_raw(
        &self,
        config_bytes: &[u8],
        layers: &[LayerInfo],
        parent: Option<Digest>,
        source: &str,
        tag: Option<&ImageName>,
    ) -> Result<ImageInfo, StoreError> {
        self.record_image(
            config_bytes,
            layers,
            parent,
            source,
            tag.map(ScopedTag::shared),
            None,
        )
    }

    /// Records an image (an existing one keeps its owner) and tags it, in one
    /// transaction: a tenant's image is never seen without its owner.
    fn record_image(
        &self,
        config_bytes: &[u8],
        layers: &[LayerInfo],
        parent: Option<Digest>,
        source: &str,
        tag: Option<ScopedTag>,
        owner: Option<&str>,
    ) -> Result<ImageInfo, StoreError> {
        if let Some(t) = tag.and_then(|t| t.tenant).filter(|t| t.is_empty()) {
            return Err(invalid(format!("tag namespace {t:?}"), "not a tenant"));
        }
        let id = self.put_blob_bytes(config_bytes)?;
        let _l = self.lock()?;
        {
            let mut db = self.db();
            let tx = db.transaction().map_err(sql("begin"))?;
            let exists: bool = tx
                .query_row(
                    "SELECT 1 FROM images WHERE id = ?1",
                    [id.to_string()],
                    |_| Ok(()),
                )
                .optional()
                .map_err(sql("read image"))?
                .is_some();
            if !exists {
                tx.execute(
                    "INSERT INTO images(id, config, parent, source, created_at, owner)
                     VALUES(?1,?2,?3,?4,?5,?6)",
                    params![
                        id.to_string(),
                        config_bytes,
                        parent.map(|p| p.to_string()),
                        source,
                        now_ms(),
                        owner
                    ],
                )
                .map_err(sql("record image"))?;
                for (i, l) in layers.iter().enumerate() {
                    tx.execute(
                        "INSERT INTO image_layers(image_id, pos, diff_id) VALUES(?1,?2,?3)",
                        params![id.to_string(), i as i64, l.diff_id.to_string()],
                    )
                    .map_err(sql("record image layers"))?;
                }
            }
            if let Some(t) = tag {
                set_tag(&tx, t, &id)?;
            }
            tx.commit().map_err(sql("commit image"))?;
        }
        self.get(&id)
    }

    /// Tags an existing image in the shared namespace (`reference` as the
    /// operator names it).
    pub fn tag(&self, reference: &str, name: &ImageName) -> Result<ImageInfo, StoreError> {
        let img = self.resolve(reference)?;
        self.tag_image(&img.id, ScopedTag::shared(name))
    }

    /// Tags image `id` in the tag's namespace (moving the name there if it named
    /// another image).
    pub fn tag_image(&self, id: &Digest, tag: ScopedTag) -> Result<ImageInfo, StoreError> {
        if let Some(t) = tag.tenant.filter(|t| t.is_empty()) {
            return Err(invalid(format!("tag namespace {t:?}"), "not a tenant"));
        }
        set_tag(&self.db(), tag, id)?;
        self.get(id)
    }

    /// Removes the tag from its namespace (the image stays, untagged if it was
    /// its last name). Whether there was such a tag.
    pub fn untag(&self, tag: ScopedTag) -> Result<bool, StoreError> {
        let n = self
            .db()
            .execute(
                "DELETE FROM image_tags WHERE scope = ?1 AND name = ?2",
                params![tag.tenant.unwrap_or(""), tag.name.to_string()],
            )
            .map_err(sql("untag"))?;
        Ok(n > 0)
    }

    /// The image with id `id`.
    pub fn get(&self, id: &Digest) -> Result<ImageInfo, StoreError> {
        let db = self.db();
        let row = db
            .query_row(
                "SELECT config, parent, source, created_at, owner FROM images WHERE id = ?1",
                [id.to_string()],
                |r| {
                    Ok((
                        r.get::<_, Vec<u8>>(0)?,
                        r.get::<_, Option<String>>(1)?,
                        r.get::<_, String>(2)?,
                        r.get::<_, i64>(3)?,
                        r.get::<_, Option<String>>(4)?,
                    ))
                },
            )
            .optional()
            .map_err(sql("read image"))?
            .ok_or_else(|| StoreError::NotFound(id.to_string()))?;
        let mut st = db
            .prepare(
                "SELECT l.diff_id, l.blob, l.media_type, l.blob_size FROM image_layers il
                 JOIN layers l ON l.diff_id = il.diff_id WHERE il.image_id = ?1 ORDER BY il.pos",
            )
            .map_err(sql("read image layers"))?;
        let layers = st
            .query_map([id.to_string()], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, String>(2)?,
                    r.get::<_, i64>(3)?,
                ))
            })
            .map_err(sql("read image layers"))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(sql("read image layers"))?;
        let layers = layers
            .into_iter()
            .map(|(d, b, m, s)| {
                Ok(LayerInfo {
                    diff_id: d
                        .parse()
                        .map_err(|e: digest::BadDigest| invalid("layer record", e.to_string()))?,
                    blob: b
                        .parse()
                        .map_err(|e: digest::BadDigest| invalid("layer record", e.to_string()))?,
                    media_type: m,
                    blob_size: s as u64,
                })
            })
            .collect::<Result<Vec<_>, StoreError>>()?;
        let mut st = db
            .prepare("SELECT scope, name FROM image_tags WHERE image_id = ?1 ORDER BY scope, name")
            .map_err(sql("read tags"))?;
        let scoped = st
            .query_map([id.to_string()], |r| {
                Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?))
            })
            .map_err(sql("read tags"))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(sql("read tags"))?;
        let mut tags = Vec::new();
        let mut tenant_tags = Vec::new();
        for (scope, name) in scoped {
            if scope.is_empty() {
                tags.push(name);
            } else {
                tenant_tags.push(TenantTag {
                    tenant: scope,
                    name,
                });
            }
        }
        let config = oci::parse_config(&row.0)?;
        Ok(ImageInfo {
            id: *id,
            tags,
            tenant_tags,
            owner: row.4,
            size: layers.iter().map(|l| l.blob_size).sum(),
            layers,
            config,
            parent: row.1.and_then(|p| p.parse().ok()),
            source: row.2,
            created_at: row.3,
        })
    }

    /// The raw OCI config of an image.
    pub fn config_bytes(&self, id: &Digest) -> Result<Vec<u8>, StoreError> {
        self.db()
            .query_row(
                "SELECT config FROM images WHERE id = ?1",
                [id.to_string()],
                |r| r.get(0),
            )
            .optional()
            .map_err(sql("read image"))?
            .ok_or_else(|| StoreError::NotFound(id.to_string()))
    }

    /// Finds an image as the operator names it: by name (`debian:bookworm`, tag
    /// `latest` implied; a shared tag), id (`sha256:...`) or unique id prefix (at
    /// least 12 hex digits).
    pub fn resolve(&self, reference: &str) -> Result<ImageInfo, StoreError> {
        self.resolve_as(Viewer::Operator, reference)
    }

    /// [`resolve`](Self::resolve) in `viewer`'s view: an image it may not see is
    /// "not found", as if it did not exist, and a tenant's name is its own tag
    /// first, then a shared one.
    pub fn resolve_as(&self, viewer: Viewer, reference: &str) -> Result<ImageInfo, StoreError> {
        let not_found = || StoreError::NotFound(reference.to_string());
        let seen = |img: ImageInfo| {
            if viewer.sees(&img) {
                Ok(img)
            } else {
                Err(not_found())
            }
        };
        if let Ok(d) = reference.parse::<Digest>() {
            return match self.get(&d) {
                Err(StoreError::NotFound(_)) => Err(not_found()),
                r => seen(r?),
            };
        }
        let hexpart = reference.strip_prefix("sha256:").unwrap_or(reference);
        if hexpart.len() >= 12
            && hexpart.len() < 64
            && hexpart.bytes().all(|b| b.is_ascii_hexdigit())
        {
            // Only among the images the viewer sees: another tenant's image makes
            // no prefix ambiguous.
            let (all, tenant) = match viewer {
                Viewer::Operator => (true, ""),
                Viewer::Shared => (false, ""),
                Viewer::Tenant(t) => (false, t),
            };
            let ids: Vec<String> = {
                let db = self.db();
                let mut st = db
                    .prepare(
                        "SELECT id FROM images WHERE id LIKE ?1
                         AND (?2 OR owner IS NULL OR (?3 != '' AND owner = ?3)) LIMIT 2",
                    )
                    .map_err(sql("find image"))?;
                let r = st
                    .query_map(
                        params![
                            format!("sha256:{}%", hexpart.to_ascii_lowercase()),
                            all,
                            tenant
                        ],
                        |r| r.get(0),
                    )
                    .map_err(sql("find image"))?
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(sql("find image"))?;
                r
            };
            match ids.len() {
                1 => {
                    return seen(self.get(&ids[0].parse().map_err(|e: digest::BadDigest| {
                        invalid("image record", e.to_string())
                    })?)?)
                }
                2 => return Err(StoreError::Ambiguous(reference.to_string())),
                _ => {}
            }
        }
        let name = ImageName::parse(reference)?.to_string();
        // The viewer's own namespace first, then the shared one.
        let id: Option<String> = self
            .db()
            .query_row(
                "SELECT image_id FROM image_tags WHERE name = ?1 AND scope IN (?2, '')
                 ORDER BY scope = '' LIMIT 1",
                params![name, viewer.namespace()],
                |r| r.get(0),
            )
            .optional()
            .map_err(sql("find tag"))?;
        match id {
            Some(id) => seen(
                self.get(
                    &id.parse()
                        .map_err(|e: digest::BadDigest| invalid("tag record", e.to_string()))?,
                )?,
            ),
            None => Err(not_found()),
        }
    }

    /// The names by which `viewer` finds `img`: the operator's and a pool's are
    /// the shared tags; a tenant's are its own tags and the shared ones its own
    /// do not hide.
    pub fn tags_seen_by(&self, viewer: Viewer, img: &ImageInfo) -> Result<Vec<String>, StoreError> {
        let Viewer::Tenant(t) = viewer else {
            return Ok(img.tags.clone());
        };
        let mut out: Vec<String> = img
            .tenant_tags
            .iter()
            .filter(|tt| tt.tenant == t)
            .map(|tt| tt.name.clone())
            .collect();
        for name in &img.tags {
            let hidden = self
                .db()
                .query_row(
                    "SELECT 1 FROM image_tags WHERE scope = ?1 AND name = ?2",
                    params![t, name],
                    |_| Ok(()),
                )
                .optional()
                .map_err(sql("read tags"))?
                .is_some();
            if !hidden {
                out.push(name.clone());
            }
        }
        out.sort();
        out.dedup();
        Ok(out)
    }

    /// Every image, newest first.
    pub fn list(&self) -> Result<Vec<ImageInfo>, StoreError> {
        let ids: Vec<String> = {
            let db = self.db();
            let mut st = db
                .prepare("SELECT id FROM images ORDER BY created_at DESC, id")
                .map_err(sql("list images"))?;
            let r = st
                .query_map([], |r| r.get(0))
                .map_err(sql("list images"))?
                .collect::<Result<Vec<_>, _>>()
                .map_err(sql("list images"))?;
            r
        };
        // An image removed between the two reads is left out: the list is of
        // the store as it was, not a failure.
        ids.iter()
            .filter_map(|i| {
                let id = match i.parse() {
                    Ok(id) => id,
                    Err(e) => {
                        let e: digest::BadDigest = e;
                        return Some(Err(invalid("image record", e.to_string())));
                    }
                };
                match self.get(&id) {
                    Err(StoreError::NotFound(_)) => None,
                    r => Some(r),
                }
            })
            .collect()
    }

    /// Overlay lower directories of an image, **top first** (overlayfs order).
    pub fn layer_dirs(&self, img: &ImageInfo) -> Vec<PathBuf> {
        img.layers
            .iter()
            .rev()
            .map(|l| self.layer_dir(&l.diff_id))
            .collect()
    }

    /// Makes an image from a directory tree (one layer, packed as is).
    pub fn import_dir(
        &self,
        dir: &Path,
        config: &ImageConfig,
        tag: Option<&ImageName>,
    ) -> Result<ImageInfo, StoreError> {
        if !dir.is_dir() {
            return Err(invalid(dir.display().to_string(), "not a directory"));
        }
        let l = self.layer_from_dir(dir)?;
        self.add_image(
            &[l],
            config,
            &format!("sandlot image import-dir {}", dir.display()),
            None,
            "directory",
            tag,
        )
    }

    /// Commits a sandbox's writable layer (a directory in overlay format) on top of
    /// `base` as a new image recording `base` as its parent.
    pub fn commit(
        &self,
        base: &ImageInfo,
        upper: &Path,
        config: &ImageConfig,
        comment: &str,
        source: &str,
        tag: Option<&ImageName>,
    ) -> Result<ImageInfo, StoreError> {
        let packed = self.pack_dir(upper, &mut Budget::unlimited())?;
        self.commit_packed(
            base,
            packed,
            &Commit {
                config,
                comment,
                source,
                tag: tag.map(ScopedTag::shared),
                owner: None,
            },
        )
    }

    /// [`commit`](Self::commit) of a layer packed earlier with
    /// [`pack_dir`](Self::pack_dir).
    pub fn commit_packed(
        &self,
        base: &ImageInfo,
        packed: PackedLayer,
        c: &Commit,
    ) -> Result<ImageInfo, StoreError> {
        let l = self.finish_layer(packed)?;
        let mut layers = base.layers.clone();
        layers.push(l);
        let cfg = oci::config_json(&layers, c.config, c.comment, Some(&base.id), c.owner);
        self.record_image(&cfg, &layers, Some(base.id), c.source, c.tag, c.owner)
    }

    /// A new image of one packed layer and no parent: `c.config` as it is (a
    /// snapshot of a `host` sandbox, whose base is no image of the store).
    pub fn commit_packed_root(
        &self,
        packed: PackedLayer,
        c: &Commit,
    ) -> Result<ImageInfo, StoreError> {
        let layers = vec![self.finish_layer(packed)?];
        let cfg = oci::config_json(&layers, c.config, c.comment, None, c.owner);
        self.record_image(&cfg, &layers, None, c.source, c.tag, c.owner)
    }

    /// A new image of `base`'s layers with the settings `c.config`, recording
    /// `base` as its parent (a build's `ENV`, `WORKDIR` or `USER` step).
    pub fn commit_config(&self, base: &ImageInfo, c: &Commit) -> Result<ImageInfo, StoreError> {
        let cfg = oci::config_json(&base.layers, c.config, c.comment, Some(&base.id), c.owner);
        self.record_image(&cfg, &base.layers, Some(base.id), c.source, c.tag, c.owner)
    }

    /// Files added, changed and removed from image `a` to image `b`. Every path
    /// read and every byte compared counts against `limit`.
    pub fn diff(
        &self,
        a: &ImageInfo,
        b: &ImageInfo,
        limit: Option<&SizeLimit>,
    ) -> Result<TreeDiff, StoreError> {
        let bottom_first = |i: &ImageInfo| -> Vec<PathBuf> {
            i.layers
                .iter()
                .map(|l| self.layer_dir(&l.diff_id))
                .collect()
        };
        let what = format!("the diff of {} and {}", a.id, b.id);
        let mut budget = Budget::new(limit, &what);
        let ta = layer::flatten(&bottom_first(a), &mut budget)?;
        let tb = layer::flatten(&bottom_first(b), &mut budget)?;
        Ok(layer::diff(&ta, &tb, &mut budget)?)
    }

    /// What `img` expands to when its layers are read by a tool that ignores holes
    /// (see [`layer::expanded_size`]); an error once past `limit`.
    pub fn expanded_size(
        &self,
        img: &ImageInfo,
        limit: Option<&SizeLimit>,
    ) -> Result<u64, StoreError> {
        let what = format!("image {}", img.id);
        let mut budget = Budget::new(limit, &what);
        let mut seen = std::collections::HashSet::new();
        for l in &img.layers {
            if seen.insert(l.diff_id) {
                layer::expanded_size(&self.layer_dir(&l.diff_id), &mut budget)?;
            }
        }
        Ok(budget.used())
    }

    /// Build cache: the image a step produced, by its cache key.
    pub fn cached_step(&self, key: &str) -> Result<Option<ImageInfo>, StoreError> {
        let id: Option<String> = self
            .db()
            .query_row(
                "SELECT image_id FROM build_cache WHERE key = ?1",
                [key],
                |r| r.get(0),
            )
            .optional()
            .map_err(sql("read build cache"))?;
        match id.and_then(|i| i.parse::<Digest>().ok()) {
            Some(d) => match self.get(&d) {
                Ok(i) => Ok(Some(i)),
                Err(StoreError::NotFound(_)) => Ok(None),
                Err(e) => Err(e),
            },
            None => Ok(None),
        }
    }

    pub fn cache_step(&self, key: &str, image: &Digest) -> Result<(), StoreError> {
        self.db()
            .execute(
                "INSERT INTO build_cache(key, image_id) VALUES(?1,?2)
                 ON CONFLICT(key) DO UPDATE SET image_id = excluded.image_id",
                params![key, image.to_string()],
            )
            .map_err(sql("write build cache"))?;
        Ok(())
    }
}

/// Bytes of regular files under `dir`.
pub fn dir_size(dir: &Path) -> u64 {
    let mut n = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        if let Ok(rd) = fs::read_dir(&d) {
            for e in rd.flatten() {
                if let Ok(m) = e.path().symlink_metadata() {
                    if m.is_dir() {
                        stack.push(e.path());
                    } else {
                        n += m.len();
                    }
                }
            }
        }
    }
    n
}

/// Writes `data` to `w` and flushes (small helper for exports).
pub(crate) fn write_all(w: &mut dyn Write, data: &[u8]) -> io::Result<()> {
    w.write_all(data)?;
    w.flush()
}
