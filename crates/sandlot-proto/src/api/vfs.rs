//! Virtual filesystem collections and shell sessions: `/v1/vfs`.

use serde::{Deserialize, Serialize};

/// Where a collection's documents come from, on the daemon's side.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
pub enum VfsSource {
    /// Every regular file under a host directory (the operator must allow it:
    /// `vfs.allowed_source_paths`).
    Dir { path: String },
    /// The tracked files of a git work tree on the host (allowed like `dir`).
    Git { path: String },
    /// A vector-database chunk export (JSON lines) on the host (allowed like `dir`).
    Jsonl { path: String },
    /// Objects under a prefix of an S3-compatible bucket; the endpoint must be one
    /// the operator allows (`vfs.allowed_s3_endpoints`). Credentials are used for
    /// this ingest only and never stored: a re-ingest needs them again.
    S3 {
        bucket: String,
        #[serde(default)]
        prefix: String,
        endpoint: String,
        #[serde(default)]
        region: Option<String>,
        #[serde(default)]
        access_key_id: Option<String>,
        #[serde(default)]
        secret_access_key: Option<String>,
        #[serde(default)]
        session_token: Option<String>,
    },
}

/// One ACL rule: documents whose path matches `pattern` get `acl`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct VfsAclRule {
    /// Wildcard over the document path (no leading `/`); `**` spans directories.
    #[cfg_attr(feature = "openapi", schema(example = "internal/**"))]
    pub pattern: String,
    /// `public`, `none`, or a comma list of `group:NAME`.
    #[cfg_attr(feature = "openapi", schema(example = "group:eng"))]
    pub acl: String,
}

/// How ingest gives documents their ACLs: `default`, then `rules` in order (the
/// last match wins); an ACL in a JSONL row's metadata overrides both.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct VfsAcl {
    /// ACL of documents no rule matches (default `public`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rules: Vec<VfsAclRule>,
}

/// `POST /v1/vfs` with a JSON body: a collection from a daemon-side source.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct CreateCollection {
    /// 1-64 characters from `[A-Za-z0-9._-]`, not starting with `.`.
    pub name: String,
    pub source: VfsSource,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acl: Option<VfsAcl>,
}

/// `POST /v1/vfs/{collection}/ingest` with a JSON body: re-ingest from the stored
/// source (or a new one), optionally with a new ACL policy.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct IngestCollection {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<VfsSource>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acl: Option<VfsAcl>,
}

/// A collection of the caller's tenant.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CollectionView {
    pub name: String,
    /// Head version (every ingest that changes something publishes a new one).
    pub version: u64,
    pub documents: usize,
    pub bytes: u64,
    /// `upload:tar`, `upload:jsonl`, a host path, `git:PATH`, `jsonl:PATH` or `s3://bucket/prefix`.
    pub source: String,
    /// RFC 3339.
    pub created_at: String,
    /// When the head version was published, RFC 3339.
    pub updated_at: String,
    /// Open shell sessions on it.
    pub sessions: usize,
}

/// `GET /v1/vfs`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CollectionList {
    pub collections: Vec<CollectionView>,
}

/// What one ingest did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct IngestResult {
    /// Head version after the ingest.
    pub version: u64,
    pub previous_version: Option<u64>,
    /// Whether a new version was published.
    pub changed: bool,
    pub added: usize,
    pub updated: usize,
    pub removed: usize,
    pub unchanged: usize,
    /// Documents and bytes read from the source (unchanged ones are not).
    pub fetched: usize,
    pub bytes_fetched: u64,
    pub documents: usize,
    pub bytes: u64,
    /// Entries left out, with the reason (symlinks, non-UTF-8 names, ...).
    pub skipped: Vec<String>,
}

/// Answer of a create or an ingest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct IngestAnswer {
    pub collection: CollectionView,
    pub ingest: IngestResult,
}

/// `POST /v1/vfs/{collection}/sessions`: a shell session for a principal. What the
/// principal may not read is pruned from the tree before the session starts.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct OpenSession {
    /// Recorded in the audit log.
    pub principal: String,
    /// Groups the principal belongs to: it sees public documents and those of
    /// these groups.
    #[serde(default)]
    pub groups: Vec<String>,
    /// Collection version (default: the head).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<u64>,
    /// See every document regardless of ACLs (the collection's owner browsing it).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub all_access: bool,
    /// Give the session a private copy-on-write scratch area: `>`, `>>`,
    /// `mkdir`, `touch`, `rm`, `cp`, `mv`, `tee`, ... then change an in-memory
    /// overlay of its tree (never the collection or other sessions), freed
    /// when the session closes or expires. Without it writes fail with
    /// "Read-only file system".
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub scratch: bool,
    /// Bytes of file content the scratch area may hold (default and maximum:
    /// the operator's `vfs.scratch_default_size` / `vfs.scratch_max_size`);
    /// past it writes fail with "No space left on device". Needs `scratch`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scratch_max_bytes: Option<u64>,
}

/// Limits of a session (from the operator's `[vfs]` configuration).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SessionLimits {
    /// Bytes of stdout plus stderr per command line; the rest is cut (`truncated`).
    pub max_output_bytes: u64,
    /// Command lines the session may run.
    pub max_commands: u64,
    /// Seconds one command line may take (exit 124 past it).
    pub command_timeout_secs: f64,
    /// Seconds without a command after which the session is closed.
    pub idle_timeout_secs: f64,
}

/// A session's copy-on-write scratch area.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct VfsScratch {
    /// Bytes of file content it holds (files created, copied or modified).
    pub used_bytes: u64,
    /// Files and directories created in it.
    pub entries: u64,
    /// Its size limit in bytes.
    pub max_bytes: u64,
    /// Files and directories it may hold.
    pub max_entries: u64,
}

/// A shell session.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct VfsSession {
    pub id: String,
    pub collection: String,
    /// The collection version the session browses (fixed for its life).
    pub version: u64,
    pub principal: String,
    pub groups: Vec<String>,
    pub all_access: bool,
    /// Documents the principal can see.
    pub documents: usize,
    /// Working directory (kept across runs).
    pub cwd: String,
    pub commands_run: u64,
    pub created_at: String,
    pub last_used_at: String,
    /// When the session closes unless used before.
    pub expires_at: String,
    pub limits: SessionLimits,
    /// The scratch area, if the session was opened with `scratch: true`
    /// (null while a command line is running).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scratch: Option<VfsScratch>,
}

/// `POST /v1/vfs/{collection}/sessions/{sid}/run`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct RunCommand {
    /// One bash command line: pipes, `&&`, `||`, `;`, globs, `cd`.
    #[cfg_attr(
        feature = "openapi",
        schema(example = "grep -rn 'rate limit' / | head")
    )]
    pub command: String,
}

/// The result of one command line. Output that is not UTF-8 is decoded lossily
/// (U+FFFD); byte counts in the audit log are of the raw output.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RunResult {
    pub stdout: String,
    pub stderr: String,
    /// As bash reports it: 124 past the time limit, 141 when output was cut.
    pub exit_code: i32,
    /// Output was cut at the session's limit.
    pub truncated: bool,
    /// Wall time of the command line in milliseconds.
    pub duration_ms: f64,
    /// Working directory after the command line.
    pub cwd: String,
}

/// One audited command line.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AuditEntry {
    /// RFC 3339, when the command finished.
    pub at: String,
    pub collection: String,
    pub version: u64,
    pub session: String,
    pub principal: String,
    pub command: String,
    pub exit_code: i32,
    pub stdout_bytes: u64,
    pub stderr_bytes: u64,
    pub truncated: bool,
    pub duration_ms: f64,
}

/// `GET /v1/vfs/{collection}/audit`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AuditList {
    pub records: Vec<AuditEntry>,
}
