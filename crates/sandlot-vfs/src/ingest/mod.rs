//! Ingest: enumerate a source, plan what changed against the previous version,
//! fetch only changed documents, and publish a new immutable version.

mod host_files;
mod jsonl;
mod local;
#[cfg(feature = "s3")]
mod s3;

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::acl::{Acl, AclPolicy};
use crate::blob::{BlobError, BlobStore};
use crate::manifest::{validate_path, DocEntry, Manifest, ManifestError};

/// Errors from reading a source or planning an ingest.
#[derive(Debug, thiserror::Error)]
pub enum IngestError {
    /// A source spec string could not be parsed.
    #[error("invalid source {spec:?}: {reason}")]
    BadSpec { spec: String, reason: String },
    /// Reading the source failed.
    #[error("read {what}")]
    Io {
        what: String,
        #[source]
        source: io::Error,
    },
    /// The git index could not be read, or the directory is not a work tree of its own.
    #[error("read the git index of {dir}: {reason}")]
    Git { dir: PathBuf, reason: String },
    /// A file of a local source is not a regular file (a FIFO or a device swapped in).
    #[error("read {what}: not a regular file")]
    NotAFile { what: String },
    /// A file of a local source is larger than [`IngestLimits::max_file_bytes`].
    #[error("read {what}: larger than the largest file allowed ({max} bytes)")]
    TooLarge { what: String, max: u64 },
    /// A JSONL row is malformed.
    #[error("{file}:{line}: {reason}")]
    Jsonl {
        file: PathBuf,
        line: usize,
        reason: String,
    },
    /// The S3 source failed.
    #[error("s3 {op} s3://{bucket}/{key}: {reason}")]
    S3 {
        op: &'static str,
        bucket: String,
        key: String,
        reason: String,
    },
    /// This build has no S3 support.
    #[error("s3 sources are not supported by this build (feature `s3` disabled)")]
    S3Disabled,
    /// A source produced an invalid or conflicting path.
    #[error(transparent)]
    Manifest(#[from] ManifestError),
    /// Storing content failed.
    #[error(transparent)]
    Blob(#[from] BlobError),
}

/// Connection settings for S3-compatible stores. Credentials come from the
/// standard `AWS_*` environment variables; they are never persisted.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct S3Options {
    /// Endpoint URL for non-AWS stores (e.g. `http://127.0.0.1:9000`).
    #[serde(default)]
    pub endpoint: Option<String>,
    /// Region (default: `AWS_REGION`, else `us-east-1`).
    #[serde(default)]
    pub region: Option<String>,
    /// Permit plain `http://` endpoints.
    #[serde(default)]
    pub allow_http: bool,
    /// Explicit credentials (otherwise `AWS_*` environment variables). Never persisted.
    #[serde(skip)]
    pub credentials: Option<S3Credentials>,
    /// Never read credentials from the environment: without explicit ones, requests
    /// are unsigned. The daemon sets it so that API clients never borrow its own.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub no_env_credentials: bool,
}

/// Static S3 credentials.
#[derive(Clone, PartialEq, Eq)]
pub struct S3Credentials {
    /// Access key id.
    pub access_key_id: String,
    /// Secret access key.
    pub secret_access_key: String,
    /// Optional session token.
    pub session_token: Option<String>,
}

impl std::fmt::Debug for S3Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("S3Credentials")
            .field("access_key_id", &self.access_key_id)
            .finish_non_exhaustive()
    }
}

/// Where a collection's documents come from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
pub enum Source {
    /// Every regular file under a local directory (`.git` excluded).
    Dir { path: PathBuf },
    /// The tracked files of a git work tree, as they are on disk.
    Git { path: PathBuf },
    /// Objects under a prefix of an S3-compatible bucket.
    S3 {
        bucket: String,
        prefix: String,
        #[serde(default)]
        options: S3Options,
    },
    /// A vector-database chunk export: one JSON object per line.
    Jsonl { path: PathBuf },
}

impl Source {
    /// Parse `DIR`, `git:DIR`, `s3://bucket/prefix` or `jsonl:FILE`.
    /// Relative local paths are made absolute against the current directory, and an
    /// existing one is resolved to its real path: a local source is read without
    /// following any symbolic link, its own path included.
    pub fn parse(spec: &str, s3: S3Options) -> Result<Source, IngestError> {
        let bad = |reason: &str| IngestError::BadSpec {
            spec: spec.to_string(),
            reason: reason.into(),
        };
        let abs = |p: &str| -> Result<PathBuf, IngestError> {
            if p.is_empty() {
                return Err(bad("empty path"));
            }
            let p = PathBuf::from(p);
            let p = if p.is_absolute() {
                p
            } else {
                std::env::current_dir()
                    .map(|c| c.join(&p))
                    .map_err(|source| IngestError::Io {
                        what: "current directory".into(),
                        source,
                    })?
            };
            Ok(std::fs::canonicalize(&p).unwrap_or(p))
        };
        if let Some(rest) = spec.strip_prefix("s3://") {
            let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
            if bucket.is_empty() {
                return Err(bad("missing bucket name"));
            }
            let prefix = prefix.trim_matches('/').to_string();
            return Ok(Source::S3 {
                bucket: bucket.to_string(),
                prefix,
                options: s3,
            });
        }
        if let Some(p) = spec.strip_prefix("git:") {
            return Ok(Source::Git { path: abs(p)? });
        }
        if let Some(p) = spec.strip_prefix("jsonl:") {
            return Ok(Source::Jsonl { path: abs(p)? });
        }
        if spec.contains("://") {
            return Err(bad(
                "unknown scheme (expected DIR, git:DIR, s3://bucket/prefix or jsonl:FILE)",
            ));
        }
        Ok(Source::Dir { path: abs(spec)? })
    }

    /// The same source with any explicit credentials removed (for persisting).
    pub fn without_secrets(&self) -> Source {
        let mut s = self.clone();
        if let Source::S3 { options, .. } = &mut s {
            options.credentials = None;
        }
        s
    }

    /// Human-readable form, round-trippable through [`Source::parse`].
    pub fn describe(&self) -> String {
        match self {
            Source::Dir { path } => path.display().to_string(),
            Source::Git { path } => format!("git:{}", path.display()),
            Source::S3 { bucket, prefix, .. } => format!("s3://{bucket}/{prefix}"),
            Source::Jsonl { path } => format!("jsonl:{}", path.display()),
        }
    }
}

/// Limits of reading a local source (a directory, a git work tree, a JSONL export).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IngestLimits {
    /// The largest file read: a document (a larger one is skipped with a reason when
    /// listed, and refused if it grew by the time it is read), a JSONL export, a git
    /// index. Default: no limit.
    pub max_file_bytes: u64,
}

impl Default for IngestLimits {
    fn default() -> Self {
        IngestLimits {
            max_file_bytes: u64::MAX,
        }
    }
}

/// Options for one ingest run.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IngestOptions {
    /// How documents get their ACLs.
    #[serde(default)]
    pub acl: AclPolicy,
}

/// What an ingest did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct IngestReport {
    /// Collection name.
    pub collection: String,
    /// The head version after the ingest.
    pub version: u64,
    /// The version before (None for a new collection).
    pub previous_version: Option<u64>,
    /// Whether a new version was published.
    pub changed: bool,
    /// Documents new in this version.
    pub added: usize,
    /// Documents whose content or ACL changed.
    pub updated: usize,
    /// Documents gone since the previous version.
    pub removed: usize,
    /// Documents reused without fetching.
    pub unchanged: usize,
    /// Documents fetched from the source.
    pub fetched: usize,
    /// Bytes fetched from the source.
    pub bytes_fetched: u64,
    /// Total documents and bytes in the version.
    pub documents: usize,
    /// Total bytes.
    pub bytes: u64,
    /// Entries skipped with the reason (symlinks, non-UTF-8 names, ...).
    pub skipped: Vec<String>,
}

/// One document as the source lists it, before its content is fetched.
#[derive(Debug, Clone)]
pub(crate) struct SourceEntry {
    pub path: String,
    /// Fingerprint: equal tags mean equal content.
    pub tag: String,
    pub mtime: i64,
    pub acl: Option<Acl>,
    pub metadata: BTreeMap<String, serde_json::Value>,
    /// Content already in hand (JSONL); otherwise fetched with [`SourceReader::fetch`].
    pub inline: Option<Vec<u8>>,
    /// Source-specific locator for fetching.
    pub locator: String,
}

/// A listed source.
#[derive(Debug)]
pub(crate) struct Listing {
    pub entries: Vec<SourceEntry>,
    pub skipped: Vec<String>,
    /// Directories with no listed document under them: (path, mtime).
    pub empty_dirs: Vec<(String, i64)>,
}

/// Reads one kind of source.
pub(crate) trait SourceReader {
    fn list(&mut self) -> Result<Listing, IngestError>;
    fn fetch(&mut self, entry: &SourceEntry) -> Result<Vec<u8>, IngestError>;
}

fn reader_for(source: &Source, limits: IngestLimits) -> Result<Box<dyn SourceReader>, IngestError> {
    Ok(match source {
        Source::Dir { path } => Box::new(local::DirReader::new(path.clone(), false, limits)),
        Source::Git { path } => Box::new(local::DirReader::new(path.clone(), true, limits)),
        Source::Jsonl { path } => Box::new(jsonl::JsonlReader::new(path.clone(), limits)),
        #[cfg(feature = "s3")]
        Source::S3 {
            bucket,
            prefix,
            options,
        } => Box::new(s3::S3Reader::new(
            bucket.clone(),
            prefix.clone(),
            options.clone(),
        )?),
        #[cfg(not(feature = "s3"))]
        Source::S3 { .. } => return Err(IngestError::S3Disabled),
    })
}

/// What to do with one listed entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Action {
    /// Same content as document `prev` of the previous version.
    Keep { entry: usize, prev: usize },
    /// Fetch (new or changed).
    Fetch { entry: usize, existed: bool },
}

/// The planned ingest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Plan {
    pub actions: Vec<Action>,
    pub removed: Vec<String>,
}

/// Plan against the previous manifest. Pure: no I/O.
pub(crate) fn plan(entries: &[SourceEntry], prev: Option<&Manifest>) -> Result<Plan, IngestError> {
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for (i, e) in entries.iter().enumerate() {
        validate_path(&e.path)?;
        if seen.insert(&e.path, i).is_some() {
            return Err(ManifestError::Duplicate {
                path: e.path.clone(),
            }
            .into());
        }
    }
    let prev_by_path: HashMap<&str, usize> = prev
        .map(|m| {
            m.docs
                .iter()
                .enumerate()
                .map(|(i, d)| (d.path.as_str(), i))
                .collect()
        })
        .unwrap_or_default();
    let mut actions = Vec::with_capacity(entries.len());
    for (i, e) in entries.iter().enumerate() {
        match prev_by_path.get(e.path.as_str()) {
            Some(&p) if prev.map(|m| m.docs[p].source_tag == e.tag).unwrap_or(false) => {
                actions.push(Action::Keep { entry: i, prev: p })
            }
            Some(_) => actions.push(Action::Fetch {
                entry: i,
                existed: true,
            }),
            None => actions.push(Action::Fetch {
                entry: i,
                existed: false,
            }),
        }
    }
    let mut removed: Vec<String> = prev_by_path
        .keys()
        .filter(|p| !seen.contains_key(*p))
        .map(|p| p.to_string())
        .collect();
    removed.sort();
    Ok(Plan { actions, removed })
}

/// Result of applying a plan: the new document list and counters.
pub(crate) struct Applied {
    pub docs: Vec<DocEntry>,
    /// The source's directories without documents.
    pub dirs: Vec<crate::manifest::DirEntry>,
    pub report: IngestReport,
}

/// Apply the plan: fetch, store blobs and trigram sidecars, build the doc list.
pub(crate) fn run(
    collection: &str,
    source: &Source,
    opts: &IngestOptions,
    limits: IngestLimits,
    prev: Option<&Manifest>,
    blobs: &BlobStore,
) -> Result<Applied, IngestError> {
    let mut reader = reader_for(source, limits)?;
    let listing = reader.list()?;
    let plan = plan(&listing.entries, prev)?;
    let mut report = IngestReport {
        collection: collection.to_string(),
        version: prev.map(|m| m.version).unwrap_or(0),
        previous_version: prev.map(|m| m.version),
        changed: false,
        added: 0,
        updated: 0,
        removed: plan.removed.len(),
        unchanged: 0,
        fetched: 0,
        bytes_fetched: 0,
        documents: listing.entries.len(),
        bytes: 0,
        skipped: listing.skipped,
    };
    let mut docs = Vec::with_capacity(listing.entries.len());
    for action in &plan.actions {
        let (e, doc) = match *action {
            Action::Keep { entry, prev: p } => {
                let e = &listing.entries[entry];
                let old = &prev.expect("keep implies a previous manifest").docs[p];
                let mut doc = old.clone();
                doc.acl = e.acl.clone().unwrap_or_else(|| opts.acl.acl_for(&e.path));
                doc.metadata = e.metadata.clone();
                // Same content: keep the recorded time (a rewritten export file
                // or re-uploaded object must not look like a change).
                if doc == *old {
                    report.unchanged += 1;
                } else {
                    report.updated += 1;
                }
                (e, doc)
            }
            Action::Fetch { entry, existed } => {
                let e = &listing.entries[entry];
                let data = match &e.inline {
                    Some(d) => d.clone(),
                    None => reader.fetch(e)?,
                };
                report.fetched += 1;
                report.bytes_fetched += data.len() as u64;
                let hash = blobs.put(&data)?;
                if blobs.get_sidecar(&hash, "tri").is_err() {
                    let tri = crate::index::doc_trigrams(&data);
                    blobs.put_sidecar(&hash, "tri", &crate::index::encode_trigrams(&tri))?;
                }
                let doc = DocEntry {
                    path: e.path.clone(),
                    hash,
                    size: data.len() as u64,
                    mtime: e.mtime,
                    acl: e.acl.clone().unwrap_or_else(|| opts.acl.acl_for(&e.path)),
                    metadata: e.metadata.clone(),
                    source_tag: e.tag.clone(),
                };
                let same_as_before = existed
                    && prev
                        .and_then(|m| m.docs.iter().find(|d| d.path == e.path))
                        .map(|d| {
                            d.hash == doc.hash && d.acl == doc.acl && d.metadata == doc.metadata
                        })
                        .unwrap_or(false);
                if !existed {
                    report.added += 1;
                } else if same_as_before {
                    report.unchanged += 1;
                } else {
                    report.updated += 1;
                }
                (e, doc)
            }
        };
        let _ = e;
        report.bytes += doc.size;
        docs.push(doc);
    }
    docs.sort_by(|a, b| a.path.cmp(&b.path));
    let mut dirs = Vec::with_capacity(listing.empty_dirs.len());
    for (path, mtime) in listing.empty_dirs {
        validate_path(&path)?;
        dirs.push(crate::manifest::DirEntry {
            acl: opts.acl.acl_for(&path),
            path,
            mtime,
        });
    }
    dirs.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(Applied { docs, dirs, report })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(path: &str, tag: &str) -> SourceEntry {
        SourceEntry {
            path: path.into(),
            tag: tag.into(),
            mtime: 0,
            acl: None,
            metadata: BTreeMap::new(),
            inline: None,
            locator: path.into(),
        }
    }

    fn prev(docs: &[(&str, &str)]) -> Manifest {
        Manifest {
            collection: "c".into(),
            version: 3,
            created: 0,
            source: "x".into(),
            docs: docs
                .iter()
                .map(|(p, t)| DocEntry {
                    path: p.to_string(),
                    hash: "h".into(),
                    size: 1,
                    mtime: 0,
                    acl: Acl::public(),
                    metadata: BTreeMap::new(),
                    source_tag: t.to_string(),
                })
                .collect(),
            dirs: Vec::new(),
        }
    }

    #[test]
    fn plans_only_changes() {
        let m = prev(&[("a", "1"), ("b", "1"), ("gone", "1")]);
        let es = vec![entry("a", "1"), entry("b", "2"), entry("new", "1")];
        let p = plan(&es, Some(&m)).unwrap();
        assert_eq!(
            p.actions,
            vec![
                Action::Keep { entry: 0, prev: 0 },
                Action::Fetch {
                    entry: 1,
                    existed: true
                },
                Action::Fetch {
                    entry: 2,
                    existed: false
                },
            ]
        );
        assert_eq!(p.removed, vec!["gone".to_string()]);
    }

    #[test]
    fn rejects_bad_and_duplicate_paths() {
        assert!(plan(&[entry("../x", "1")], None).is_err());
        assert!(plan(&[entry("a", "1"), entry("a", "2")], None).is_err());
    }

    #[test]
    fn parses_specs() {
        let o = S3Options::default();
        assert_eq!(
            Source::parse("s3://bkt/some/prefix/", o.clone()).unwrap(),
            Source::S3 {
                bucket: "bkt".into(),
                prefix: "some/prefix".into(),
                options: o.clone()
            }
        );
        assert_eq!(
            Source::parse("git:/r", o.clone()).unwrap(),
            Source::Git { path: "/r".into() }
        );
        assert_eq!(
            Source::parse("jsonl:/f.jsonl", o.clone()).unwrap(),
            Source::Jsonl {
                path: "/f.jsonl".into()
            }
        );
        assert_eq!(
            Source::parse("/d", o.clone()).unwrap(),
            Source::Dir { path: "/d".into() }
        );
        assert!(Source::parse("http://x", o.clone()).is_err());
        assert!(Source::parse("s3://", o).is_err());
    }
}
