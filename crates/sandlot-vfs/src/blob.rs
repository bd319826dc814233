//! Content-addressed store of document bodies (BLAKE3), one file per blob.

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// Errors from the content store.
#[derive(Debug, thiserror::Error)]
pub enum BlobError {
    /// Reading a blob failed (missing or unreadable).
    #[error("read blob {hash} at {path}")]
    Read {
        hash: String,
        path: PathBuf,
        source: io::Error,
    },
    /// Writing a blob failed.
    #[error("write blob {hash} at {path}")]
    Write {
        hash: String,
        path: PathBuf,
        source: io::Error,
    },
    /// A hash is not 64 lowercase hex digits.
    #[error("invalid blob hash {0:?}")]
    InvalidHash(String),
}

/// The content store of one collection.
#[derive(Debug, Clone)]
pub struct BlobStore {
    dir: PathBuf,
}

/// BLAKE3 hex digest of `data`.
pub fn hash_bytes(data: &[u8]) -> String {
    blake3::hash(data).to_hex().to_string()
}

fn check_hash(hash: &str) -> Result<(), BlobError> {
    if hash.len() == 64
        && hash
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        Ok(())
    } else {
        Err(BlobError::InvalidHash(hash.to_string()))
    }
}

impl BlobStore {
    /// A store rooted at `dir` (created on first write).
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        BlobStore { dir: dir.into() }
    }

    /// Where the blob with `hash` lives, with `ext` appended to its name if non-empty.
    pub fn path_of(&self, hash: &str, ext: &str) -> PathBuf {
        let mut name = hash.to_string();
        if !ext.is_empty() {
            name.push('.');
            name.push_str(ext);
        }
        self.dir.join(&hash[..2.min(hash.len())]).join(name)
    }

    /// Whether the blob is present.
    pub fn contains(&self, hash: &str) -> bool {
        check_hash(hash).is_ok() && self.path_of(hash, "").is_file()
    }

    /// Store `data`, returning its hash. Idempotent.
    pub fn put(&self, data: &[u8]) -> Result<String, BlobError> {
        let hash = hash_bytes(data);
        self.put_sidecar(&hash, "", data)?;
        Ok(hash)
    }

    /// Store auxiliary data next to a blob (e.g. its trigram set), atomically.
    pub fn put_sidecar(&self, hash: &str, ext: &str, data: &[u8]) -> Result<(), BlobError> {
        check_hash(hash)?;
        let path = self.path_of(hash, ext);
        if path.is_file() {
            return Ok(());
        }
        let werr = |source| BlobError::Write {
            hash: hash.to_string(),
            path: path.clone(),
            source,
        };
        write_atomic(&path, data).map_err(werr)
    }

    /// Read a blob.
    pub fn get(&self, hash: &str) -> Result<Vec<u8>, BlobError> {
        self.get_sidecar(hash, "")
    }

    /// Read auxiliary data stored with [`BlobStore::put_sidecar`].
    pub fn get_sidecar(&self, hash: &str, ext: &str) -> Result<Vec<u8>, BlobError> {
        check_hash(hash)?;
        let path = self.path_of(hash, ext);
        fs::read(&path).map_err(|source| BlobError::Read {
            hash: hash.to_string(),
            path,
            source,
        })
    }
}

/// Write `data` to `path` via a temporary file and rename, creating parents.
/// Durability is the caller's job: ingest calls [`sync_filesystem`] once before
/// publishing a version that refers to new blobs.
pub(crate) fn write_atomic(path: &Path, data: &[u8]) -> io::Result<()> {
    let parent = path.parent().unwrap_or(Path::new("."));
    fs::create_dir_all(parent)?;
    let tmp = parent.join(format!(
        ".tmp-{}-{}",
        std::process::id(),
        path.file_name().and_then(|n| n.to_str()).unwrap_or("x")
    ));
    let mut f = fs::File::create(&tmp)?;
    let res = f.write_all(data);
    drop(f);
    if let Err(e) = res {
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }
    fs::rename(&tmp, path).inspect_err(|_| {
        let _ = fs::remove_file(&tmp);
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn put_get_roundtrip() {
        let d = tempfile::tempdir().unwrap();
        let s = BlobStore::new(d.path());
        let h = s.put(b"hello").unwrap();
        assert_eq!(h, hash_bytes(b"hello"));
        assert!(s.contains(&h));
        assert_eq!(s.get(&h).unwrap(), b"hello");
        assert_eq!(s.put(b"hello").unwrap(), h);
        assert!(matches!(s.get("zz"), Err(BlobError::InvalidHash(_))));
        let missing = hash_bytes(b"other");
        assert!(matches!(s.get(&missing), Err(BlobError::Read { .. })));
    }
}
