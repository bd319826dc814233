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

use std::fs;
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use rusqlite::{params, Connection, OptionalExtension};
use serde::{Deserialize, Serialize};

pub mod build;
pub mod digest;
pub mod layer;
pub mod oci;
pub mod reference;
pub mod registry;

pub use digest::Digest;
pub use layer::TreeDiff;
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
    #[error("image {image} is in use by {holders}")]
    InUse { image: String, holders: String },
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

/// What a sandbox takes from its image's config.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageConfig {
    /// `KEY=VALUE` pairs.
    pub env: Vec<String>,
    pub workdir: Option<String>,
    pub user: Option<String>,
    pub entrypoint: Vec<String>,
    pub cmd: Vec<String>,
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

/// An image in the store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageInfo {
    /// sha256 of the OCI config.
    pub id: Digest,
    pub tags: Vec<String>,
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

/// A directory packed into a staged layer blob, not yet stored.
#[derive(Debug)]
pub struct PackedLayer {
    staged: PathBuf,
    file: fs::File,
    pub diff_id: Digest,
    pub size: u64,
}

/// What `prune` removed.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize)]
pub struct PruneReport {
    pub layers: Vec<Digest>,
    pub blobs: Vec<Digest>,
    pub bytes: u64,
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// The image store.
pub struct ImageStore {
    root: PathBuf,
    db: Mutex<Connection>,
}

/// An exclusive lock on the store's layer set (released on drop).
pub struct StoreLock(#[allow(dead_code)] fs::File);

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
CREATE TABLE IF NOT EXISTS tags(name TEXT PRIMARY KEY, image_id TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS leases(holder TEXT PRIMARY KEY, image_id TEXT NOT NULL,
  created_at INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS build_cache(key TEXT PRIMARY KEY, image_id TEXT NOT NULL);
";

impl ImageStore {
    /// Opens (creating) the store under `root`.
    pub fn open(root: &Path) -> Result<ImageStore, StoreError> {
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
        c.execute_batch(SCHEMA).map_err(sql("create schema"))?;
        Ok(ImageStore {
            root: root.to_path_buf(),
            db: Mutex::new(c),
        })
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
        let packed = self.pack_dir(dir)?;
        self.finish_layer(packed)
    }

    /// First half of [`layer_from_dir`](Self::layer_from_dir): reads `dir` into a
    /// staged blob (the only part that needs `dir` to hold still, e.g. a frozen
    /// sandbox's writable layer).
    pub fn pack_dir(&self, dir: &Path) -> Result<PackedLayer, StoreError> {
        let tmp_blob = self.tmp_path("blob");
        let f = fs::File::create(&tmp_blob).map_err(io_at("create", &tmp_blob))?;
        let w = HashingWriter::new(BufWriter::new(f));
        let w = match layer::pack(dir, w) {
            Ok(w) => w,
            Err(e) => {
                let _ = fs::remove_file(&tmp_blob);
                return Err(e.into());
            }
        };
        let (bw, diff_id, size) = w.finish();
        let file = bw
            .into_inner()
            .map_err(|e| e.into_error())
            .map_err(io_at("write", &tmp_blob))?;
        Ok(PackedLayer {
            staged: tmp_blob,
            file,
            diff_id,
            size,
        })
    }

    /// Second half: makes a packed directory a stored, unpacked layer.
    pub fn finish_layer(&self, p: PackedLayer) -> Result<LayerInfo, StoreError> {
        let PackedLayer {
            staged: tmp_blob,
            file,
            diff_id,
            size,
        } = p;
        file.sync_all().map_err(io_at("write", &tmp_blob))?;
        drop(file);
        let bp = self.blob_path(&diff_id);
        if bp.exists() {
            let _ = fs::remove_file(&tmp_blob);
        } else {
            fs::rename(&tmp_blob, &bp).map_err(io_at("store blob", &bp))?;
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
        let cfg = oci::config_json(layers, config, history, parent.as_ref());
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
                    "INSERT INTO images(id, config, parent, source, created_at) VALUES(?1,?2,?3,?4,?5)",
                    params![
                        id.to_string(),
                        config_bytes,
                        parent.map(|p| p.to_string()),
                        source,
                        now_ms()
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
                tx.execute(
                    "INSERT INTO tags(name, image_id) VALUES(?1,?2)
                     ON CONFLICT(name) DO UPDATE SET image_id = excluded.image_id",
                    params![t.to_string(), id.to_string()],
                )
                .map_err(sql("tag image"))?;
            }
            tx.commit().map_err(sql("commit image"))?;
        }
        self.get(&id)
    }

    /// Tags an existing image.
    pub fn tag(&self, reference: &str, name: &ImageName) -> Result<ImageInfo, StoreError> {
        let img = self.resolve(reference)?;
        self.db()
            .execute(
                "INSERT INTO tags(name, image_id) VALUES(?1,?2)
                 ON CONFLICT(name) DO UPDATE SET image_id = excluded.image_id",
                params![name.to_string(), img.id.to_string()],
            )
            .map_err(sql("tag image"))?;
        self.get(&img.id)
    }

    /// The image with id `id`.
    pub fn get(&self, id: &Digest) -> Result<ImageInfo, StoreError> {
        let db = self.db();
        let row = db
            .query_row(
                "SELECT config, parent, source, created_at FROM images WHERE id = ?1",
                [id.to_string()],
                |r| {
                    Ok((
                        r.get::<_, Vec<u8>>(0)?,
                        r.get::<_, Option<String>>(1)?,
                        r.get::<_, String>(2)?,
                        r.get::<_, i64>(3)?,
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
            .prepare("SELECT name FROM tags WHERE image_id = ?1 ORDER BY name")
            .map_err(sql("read tags"))?;
        let tags = st
            .query_map([id.to_string()], |r| r.get::<_, String>(0))
            .map_err(sql("read tags"))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(sql("read tags"))?;
        let config = oci::parse_config(&row.0)?;
        Ok(ImageInfo {
            id: *id,
            tags,
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

    /// Finds an image by name (`debian:bookworm`, tag `latest` implied), id
    /// (`sha256:...`) or unique id prefix (at least 12 hex digits).
    pub fn resolve(&self, reference: &str) -> Result<ImageInfo, StoreError> {
        if let Ok(d) = reference.parse::<Digest>() {
            return self.get(&d);
        }
        let hexpart = reference.strip_prefix("sha256:").unwrap_or(reference);
        if hexpart.len() >= 12
            && hexpart.len() < 64
            && hexpart.bytes().all(|b| b.is_ascii_hexdigit())
        {
            let ids: Vec<String> = {
                let db = self.db();
                let mut st = db
                    .prepare("SELECT id FROM images WHERE id LIKE ?1 LIMIT 2")
                    .map_err(sql("find image"))?;
                let r = st
                    .query_map([format!("sha256:{}%", hexpart.to_ascii_lowercase())], |r| {
                        r.get(0)
                    })
                    .map_err(sql("find image"))?
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(sql("find image"))?;
                r
            };
            match ids.len() {
                1 => {
                    return self.get(
                        &ids[0].parse().map_err(|e: digest::BadDigest| {
                            invalid("image record", e.to_string())
                        })?,
                    )
                }
                2 => return Err(StoreError::Ambiguous(reference.to_string())),
                _ => {}
            }
        }
        let name = ImageName::parse(reference)?;
        let id: Option<String> = self
            .db()
            .query_row(
                "SELECT image_id FROM tags WHERE name = ?1",
                [name.to_string()],
                |r| r.get(0),
            )
            .optional()
            .map_err(sql("find tag"))?;
        match id {
            Some(id) => self.get(
                &id.parse()
                    .map_err(|e: digest::BadDigest| invalid("tag record", e.to_string()))?,
            ),
            None => Err(StoreError::NotFound(reference.to_string())),
        }
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
        ids.iter()
            .map(|i| {
                self.get(
                    &i.parse()
                        .map_err(|e: digest::BadDigest| invalid("image record", e.to_string()))?,
                )
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

    /// Records that `holder` (a sandbox id) uses `image`: it cannot be removed and
    /// its layers are not pruned until [`release`](Self::release).
    pub fn lease(&self, holder: &str, image: &Digest) -> Result<(), StoreError> {
        self.db()
            .execute(
                "INSERT INTO leases(holder, image_id, created_at) VALUES(?1,?2,?3)
                 ON CONFLICT(holder) DO UPDATE SET image_id = excluded.image_id",
                params![holder, image.to_string(), now_ms()],
            )
            .map_err(sql("record lease"))?;
        Ok(())
    }

    pub fn release(&self, holder: &str) -> Result<(), StoreError> {
        self.db()
            .execute("DELETE FROM leases WHERE holder = ?1", [holder])
            .map_err(sql("drop lease"))?;
        Ok(())
    }

    /// (holder, image) of every lease.
    pub fn leases(&self) -> Result<Vec<(String, Digest)>, StoreError> {
        let db = self.db();
        let mut st = db
            .prepare("SELECT holder, image_id FROM leases ORDER BY holder")
            .map_err(sql("list leases"))?;
        let rows = st
            .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))
            .map_err(sql("list leases"))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(sql("list leases"))?;
        Ok(rows
            .into_iter()
            .filter_map(|(h, i)| i.parse().ok().map(|d| (h, d)))
            .collect())
    }

    /// Removes a tag, or (given an id, or a name that was the image's last tag)
    /// the image. Layers stay until [`prune`](Self::prune). An image a sandbox
    /// uses is refused.
    pub fn remove(&self, reference: &str) -> Result<ImageInfo, StoreError> {
        let img = self.resolve(reference)?;
        let by_name = ImageName::parse(reference)
            .ok()
            .filter(|n| img.tags.contains(&n.to_string()));
        let _l = self.lock()?;
        let mut db = self.db();
        let tx = db.transaction().map_err(sql("begin"))?;
        if let Some(n) = &by_name {
            tx.execute("DELETE FROM tags WHERE name = ?1", [n.to_string()])
                .map_err(sql("untag"))?;
            if img.tags.len() > 1 {
                tx.commit().map_err(sql("commit"))?;
                return Ok(img);
            }
        }
        let holders: Vec<String> = {
            let mut st = tx
                .prepare("SELECT holder FROM leases WHERE image_id = ?1 ORDER BY holder")
                .map_err(sql("list leases"))?;
            let r = st
                .query_map([img.id.to_string()], |r| r.get(0))
                .map_err(sql("list leases"))?
                .collect::<Result<Vec<_>, _>>()
                .map_err(sql("list leases"))?;
            r
        };
        if !holders.is_empty() {
            return Err(StoreError::InUse {
                image: reference.to_string(),
                holders: holders.join(", "),
            });
        }
        for q in [
            "DELETE FROM tags WHERE image_id = ?1",
            "DELETE FROM image_layers WHERE image_id = ?1",
            "DELETE FROM build_cache WHERE image_id = ?1",
            "DELETE FROM images WHERE id = ?1",
        ] {
            tx.execute(q, [img.id.to_string()])
                .map_err(sql("remove image"))?;
        }
        tx.commit().map_err(sql("commit"))?;
        Ok(img)
    }

    /// Removes layers that no image uses (leased images keep theirs: a lease is on
    /// an image, and a leased image cannot be removed), blobs nothing refers to,
    /// and stale staging files.
    pub fn prune(&self) -> Result<PruneReport, StoreError> {
        let _l = self.lock()?;
        let mut rep = PruneReport::default();
        let (dead_layers, live_blobs) = {
            let db = self.db();
            let mut st = db
                .prepare(
                    "SELECT diff_id FROM layers WHERE diff_id NOT IN (SELECT diff_id FROM image_layers)",
                )
                .map_err(sql("find unused layers"))?;
            let dead: Vec<String> = st
                .query_map([], |r| r.get(0))
                .map_err(sql("find unused layers"))?
                .collect::<Result<_, _>>()
                .map_err(sql("find unused layers"))?;
            let mut st = db
                .prepare(
                    "SELECT blob FROM layers WHERE diff_id IN (SELECT diff_id FROM image_layers)
                     UNION SELECT id FROM images",
                )
                .map_err(sql("find used blobs"))?;
            let live: std::collections::HashSet<String> = st
                .query_map([], |r| r.get(0))
                .map_err(sql("find used blobs"))?
                .collect::<Result<_, _>>()
                .map_err(sql("find used blobs"))?;
            (dead, live)
        };
        for d in dead_layers {
            let Ok(dg) = d.parse::<Digest>() else {
                continue;
            };
            let dir = self.layer_dir(&dg);
            if dir.exists() {
                rep.bytes += dir_size(&dir);
                fs::remove_dir_all(&dir).map_err(io_at("remove layer", &dir))?;
            }
            self.db()
                .execute("DELETE FROM layers WHERE diff_id = ?1", [&d])
                .map_err(sql("forget layer"))?;
            rep.layers.push(dg);
        }
        // Layer directories no record knows (an interrupted commit).
        if let Ok(rd) = fs::read_dir(self.root.join("layers")) {
            for e in rd.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if let Ok(dg) = Digest::from_hex(&name) {
                    if self.layer(&dg)?.is_none() {
                        rep.bytes += dir_size(&e.path());
                        let _ = fs::remove_dir_all(e.path());
                        rep.layers.push(dg);
                    }
                }
            }
        }
        let blobs = self.root.join("blobs/sha256");
        if let Ok(rd) = fs::read_dir(&blobs) {
            for e in rd.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                let Ok(dg) = Digest::from_hex(&name) else {
                    continue;
                };
                if !live_blobs.contains(&dg.to_string()) {
                    rep.bytes += e.metadata().map(|m| m.len()).unwrap_or(0);
                    let _ = fs::remove_file(e.path());
                    rep.blobs.push(dg);
                }
            }
        }
        // Staging older than an hour belongs to a process that died.
        if let Ok(rd) = fs::read_dir(self.root.join("tmp")) {
            for e in rd.flatten() {
                let old = e
                    .metadata()
                    .and_then(|m| m.modified())
                    .ok()
                    .and_then(|t| t.elapsed().ok())
                    .is_some_and(|a| a.as_secs() > 3600);
                if old {
                    let _ = fs::remove_dir_all(e.path()).or_else(|_| fs::remove_file(e.path()));
                }
            }
        }
        Ok(rep)
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
        let packed = self.pack_dir(upper)?;
        self.commit_packed(base, packed, config, comment, source, tag)
    }

    /// [`commit`](Self::commit) of a layer packed earlier with
    /// [`pack_dir`](Self::pack_dir).
    pub fn commit_packed(
        &self,
        base: &ImageInfo,
        packed: PackedLayer,
        config: &ImageConfig,
        comment: &str,
        source: &str,
        tag: Option<&ImageName>,
    ) -> Result<ImageInfo, StoreError> {
        let l = self.finish_layer(packed)?;
        let mut layers = base.layers.clone();
        layers.push(l);
        self.add_image(&layers, config, comment, Some(base.id), source, tag)
    }

    /// Files added, changed and removed from image `a` to image `b`.
    pub fn diff(&self, a: &ImageInfo, b: &ImageInfo) -> Result<TreeDiff, StoreError> {
        let bottom_first = |i: &ImageInfo| -> Vec<PathBuf> {
            i.layers
                .iter()
                .map(|l| self.layer_dir(&l.diff_id))
                .collect()
        };
        let ta = layer::flatten(&bottom_first(a))?;
        let tb = layer::flatten(&bottom_first(b))?;
        Ok(layer::diff(&ta, &tb)?)
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
