//! The JSON types of the HTTP API v1 (request and response bodies), shared by the
//! server, the Rust client and the CLI. Sandboxes, processes and files are here; the
//! network, ports and vfs routes have their own modules.
//!
//! Responses are tolerant (unknown fields are ignored, so a newer server may add
//! fields); request bodies are strict on the server (`deny_unknown_fields`). With the
//! `openapi` feature every type derives `utoipa::ToSchema` for the server's OpenAPI
//! document.

pub mod checkpoint;
pub mod code;
pub mod create;
mod error_code;
pub mod lifecycle;
pub mod metrics;
pub mod network;
pub mod ports;
pub mod snapshot;
pub mod tenants;
pub mod vfs;

pub use create::CreateSandboxRequest;
pub use error_code::{ErrorCode, UnknownErrorCode};

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

#[cfg(feature = "openapi")]
use utoipa::ToSchema;

/// Lifecycle state of a sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum SandboxState {
    Creating,
    Running,
    /// Being saved to disk (`POST .../pause`).
    Pausing,
    /// Saved to disk: nothing of it runs (see [`PauseKind`]).
    Paused,
    /// Being started again from what its pause saved (`POST .../resume`).
    Resuming,
    Stopping,
    Stopped,
}

impl SandboxState {
    pub fn as_str(self) -> &'static str {
        match self {
            SandboxState::Creating => "creating",
            SandboxState::Running => "running",
            SandboxState::Pausing => "pausing",
            SandboxState::Paused => "paused",
            SandboxState::Resuming => "resuming",
            SandboxState::Stopping => "stopping",
            SandboxState::Stopped => "stopped",
        }
    }

    /// The state named by [`SandboxState::as_str`].
    pub fn parse(s: &str) -> Option<SandboxState> {
        Some(match s {
            "creating" => SandboxState::Creating,
            "running" => SandboxState::Running,
            "pausing" => SandboxState::Pausing,
            "paused" => SandboxState::Paused,
            "resuming" => SandboxState::Resuming,
            "stopping" => SandboxState::Stopping,
            "stopped" => SandboxState::Stopped,
            _ => return None,
        })
    }

    /// Not stopped yet.
    pub fn live(self) -> bool {
        self != SandboxState::Stopped
    }

    /// Every state but `stopped`: what a listing shows unless asked otherwise.
    pub const LIVE: [SandboxState; 6] = [
        SandboxState::Creating,
        SandboxState::Running,
        SandboxState::Pausing,
        SandboxState::Paused,
        SandboxState::Resuming,
        SandboxState::Stopping,
    ];
}

/// What a pause kept of a sandbox (`Sandbox::pause`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum PauseKind {
    /// Its memory and its files (gVisor: a checkpoint of its kernel): a resume
    /// brings back every process, open file and socket inside as they were.
    Memory,
    /// Its files only (namespace backend): its processes ended at the pause, and a
    /// resume starts it again from the same files.
    Filesystem,
}

impl PauseKind {
    pub fn as_str(self) -> &'static str {
        match self {
            PauseKind::Memory => "memory",
            PauseKind::Filesystem => "filesystem",
        }
    }

    /// The kind named by [`PauseKind::as_str`].
    pub fn parse(s: &str) -> Option<PauseKind> {
        match s {
            "memory" => Some(PauseKind::Memory),
            "filesystem" => Some(PauseKind::Filesystem),
            _ => None,
        }
    }
}

/// Metered usage of a sandbox (cgroup accounting and stream byte counts).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct Usage {
    /// CPU time used by everything in the sandbox.
    pub cpu_seconds: f64,
    /// Current memory use (0 once stopped).
    pub memory_bytes: u64,
    /// Highest memory use seen.
    pub memory_peak_bytes: u64,
    /// From start to end (or to now while running).
    pub wall_seconds: f64,
    pub exec_count: u64,
    pub stdin_bytes: u64,
    pub stdout_bytes: u64,
    pub stderr_bytes: u64,
    /// Bytes uploaded into / downloaded from the sandbox's files.
    pub file_bytes_in: u64,
    pub file_bytes_out: u64,
}

/// How PID 1 of a sandbox ended, when it ended on its own.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct SandboxExit {
    pub code: Option<i32>,
    pub signal: Option<i32>,
}

/// A sandbox.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct Sandbox {
    pub id: String,
    pub name: Option<String>,
    pub tenant: String,
    pub state: SandboxState,
    /// The spec as accepted (defaults filled in).
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub spec: serde_json::Value,
    pub tags: BTreeMap<String, String>,
    pub metadata: BTreeMap<String, String>,
    /// RFC 3339 timestamps (UTC).
    pub created_at: String,
    pub started_at: Option<String>,
    pub ended_at: Option<String>,
    /// When the lifetime timeout ends it (extend with `POST .../timeout`).
    pub expires_at: String,
    /// Idle timeout in seconds (no exec or file activity), if any.
    pub idle_timeout: Option<f64>,
    /// Why it stopped: `deleted`, `timeout`, `idle_timeout`, `exited`,
    /// `create_failed`, `lost`, `shutdown`.
    pub end_reason: Option<String>,
    pub exit: Option<SandboxExit>,
    /// Why it failed, when it did.
    pub error: Option<String>,
    pub usage: Usage,
    /// While paused: what the pause kept (`memory`, or `filesystem` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pause: Option<PauseKind>,
    /// What its idle timeout does: `kill` (the default) or `pause`.
    #[serde(default)]
    pub on_idle: lifecycle::OnExpiry,
    /// What its lifetime timeout does: `kill` (the default) or `pause`.
    #[serde(default)]
    pub on_timeout: lifecycle::OnExpiry,
    /// Work sent to it while paused resumes it first (else 409 `invalid_state`).
    #[serde(default)]
    pub auto_resume: bool,
}

/// `GET /v1/sandboxes`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct SandboxList {
    pub sandboxes: Vec<Sandbox>,
}

/// `POST /v1/sandboxes/{id}/timeout`: the sandbox now ends `timeout` from now.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct SetTimeout {
    /// Seconds (number) or a duration string (`"10m"`).
    #[cfg_attr(feature = "openapi", schema(value_type = String, example = "10m"))]
    pub timeout: serde_json::Value,
}

/// Terminal size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct PtySize {
    pub rows: u16,
    pub cols: u16,
}

/// `POST /v1/sandboxes/{id}/exec`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ExecBody {
    /// Program and arguments (looked up in `PATH` unless it contains a `/`).
    pub argv: Vec<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// `root`, `user`, `UID[:GID]` or a name in the sandbox's `/etc/passwd`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// Run on a pseudo-terminal of this size.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pty: Option<PtySize>,
    /// Kill the process after this long: seconds or `"30s"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>, example = "30s"))]
    pub timeout: Option<serde_json::Value>,
    /// Keep stdin open for `POST .../stdin` or WebSocket binary frames.
    #[serde(default)]
    pub stdin: bool,
    /// Free-form label shown in process listings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
    /// Never hold the process back waiting for a reader of its output: output is
    /// kept in the re-attach buffer (the most recent MiB per stream). Without it,
    /// output waits (with back-pressure) up to the daemon's `exec_grace` for a reader.
    #[serde(default)]
    pub background: bool,
}

/// Exit status of a process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct ProcessExit {
    /// Exit code, when it exited normally.
    pub code: Option<i32>,
    /// Signal number, when a signal killed it.
    pub signal: Option<i32>,
    #[serde(default)]
    pub core_dumped: bool,
    /// Its exec timeout expired.
    #[serde(default)]
    pub timed_out: bool,
    /// Byte offsets of the end of stdout and stderr at exit.
    pub stdout_end: u64,
    pub stderr_end: u64,
}

impl ProcessExit {
    /// The shell convention: the code, or 128 + signal.
    pub fn shell_code(&self) -> i32 {
        match (self.code, self.signal) {
            (Some(c), _) => c,
            (None, Some(s)) => 128 + s,
            (None, None) => 255,
        }
    }
}

/// A process started through the API.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct ProcessView {
    /// Process id for the other process routes (not the pid).
    pub id: u64,
    /// Pid inside the sandbox.
    pub pid: i32,
    pub argv: Vec<String>,
    pub tag: Option<String>,
    pub pty: bool,
    /// Stdin is open for writing.
    pub stdin: bool,
    pub background: bool,
    pub started_at: String,
    /// `running` or `exited`.
    pub state: String,
    pub exit: Option<ProcessExit>,
}

/// `GET /v1/sandboxes/{id}/processes`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct ProcessList {
    pub processes: Vec<ProcessView>,
}

/// `GET .../processes/{pid}/wait`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct WaitResult {
    /// False when the wait timed out with the process still running.
    pub exited: bool,
    pub exit: Option<ProcessExit>,
}

/// One line of an NDJSON output stream (and the text frames of the WebSocket).
/// Byte offsets count from the start of each stream, so a client that lost its
/// connection re-attaches with `stdout_from`/`stderr_from`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum StreamEvent {
    /// First line of `POST .../exec?stream=ndjson`.
    Started {
        process: ProcessView,
    },
    /// First line of an attach: where output resumes.
    Attached {
        id: u64,
        stdout_from: u64,
        stderr_from: u64,
    },
    /// Output; `data` is base64 (standard alphabet, padded).
    Stdout {
        offset: u64,
        data: String,
    },
    Stderr {
        offset: u64,
        data: String,
    },
    Exit {
        exit: ProcessExit,
    },
    /// The stream failed; nothing follows.
    Error {
        error: ApiErrorBody,
    },
}

/// `POST .../processes/{pid}/signal`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct SignalBody {
    /// A number (15) or a name (`TERM`, `SIGTERM`).
    #[cfg_attr(feature = "openapi", schema(value_type = String, example = "TERM"))]
    pub signal: serde_json::Value,
}

/// `POST .../processes/{pid}/resize`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ResizeBody {
    pub rows: u16,
    pub cols: u16,
}

/// Metadata of a file in a sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct FileInfo {
    pub path: String,
    /// `file`, `dir`, `symlink` or `other`.
    pub kind: String,
    pub size: u64,
    /// Permission bits (`st_mode & 0o7777`).
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    /// Modification time, RFC 3339.
    pub mtime: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub symlink_target: Option<String>,
}

/// An entry of a listing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct DirEntry {
    #[serde(flatten)]
    pub info: FileInfo,
    /// 1 for the directory's own entries, 2 for their children, ...
    pub depth: u32,
    /// Set when this directory could not be read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// `GET .../files/list`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct DirListing {
    pub path: String,
    pub entries: Vec<DirEntry>,
    /// The listing stopped at the daemon's entry limit.
    #[serde(default)]
    pub truncated: bool,
}

/// `POST .../files/mkdir`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct MkdirBody {
    pub path: String,
    /// Create missing parents; succeed if it exists.
    #[serde(default)]
    pub parents: bool,
    /// Permission bits, e.g. 493 or `"0755"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>, example = "0755"))]
    pub mode: Option<serde_json::Value>,
}

/// `POST .../files/rename`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct RenameBody {
    pub from: String,
    pub to: String,
    /// Replace an existing `to` (default true).
    #[serde(default = "yes")]
    pub overwrite: bool,
}

fn yes() -> bool {
    true
}

/// Result of a file upload.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct WriteResult {
    pub path: String,
    pub bytes: u64,
}

/// Result of a tar upload.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct TarResult {
    pub path: String,
    pub files: u64,
    pub dirs: u64,
    pub bytes: u64,
    /// Entries not extracted (links, devices), with why: the first 100, each
    /// name cut to 256 bytes, then a line saying how many more.
    pub skipped: Vec<String>,
}

/// One line of a watch stream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct WatchEvent {
    /// `create`, `modify`, `delete`, `rename` or `overflow`.
    pub kind: String,
    pub path: Option<String>,
    /// Old path of a rename.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    #[serde(default)]
    pub dir: bool,
}

/// An event of a sandbox's life.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct SandboxEvent {
    pub seq: i64,
    pub at: String,
    /// `created`, `started`, `timeout_set`, `stopped`, ...
    pub kind: String,
    pub message: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct EventList {
    pub events: Vec<SandboxEvent>,
}

/// `GET /v1/health`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct Health {
    pub status: String,
    pub version: String,
    /// The caller's tenant (`*` for the operator: the Unix socket, or an operator token).
    pub tenant: String,
}

/// The error object of every error response.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct ApiErrorBody {
    /// Machine-readable: one of [`ErrorCode`] (text, so that a client meets a
    /// code newer than itself as text).
    #[cfg_attr(feature = "openapi", schema(value_type = ErrorCode))]
    pub code: String,
    pub message: String,
    /// Also in the `x-request-id` response header; quote it when reporting a problem.
    pub request_id: String,
    /// For validation errors: the offending field (`resources.memory`, `argv[0]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
}

/// `{"error": {...}}`: the body of every error response.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct ErrorEnvelope {
    pub error: ApiErrorBody,
}
