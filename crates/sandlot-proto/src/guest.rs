//! The guest protocol: framed, versioned messages between the host (its client is
//! `sandlot-guest`) and the in-sandbox agent (`sandlot-agent`), over any reliable
//! byte stream (a Unix socket today; vsock or stdio for other backends). See `docs/protocol.md` for the full specification.
//!
//! This module holds the frame layout (header encoding and validation, binary
//! payloads of the data-plane frames) and every JSON message. It does no I/O.
//!
//! Compatibility rules: requests are strict (`deny_unknown_fields`, so a typo is an
//! error, not a silently ignored option); replies and [`Hello`] are tolerant, so a
//! newer agent may add reply fields without a protocol version bump.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::units::Seconds;

/// Value of [`Hello::protocol`]: identifies the peer as speaking this protocol.
pub const PROTOCOL_NAME: &str = "sandlot-guest";
/// Highest protocol version this build speaks.
pub const PROTOCOL_VERSION: u32 = 1;
/// Lowest protocol version this build speaks.
pub const MIN_PROTOCOL_VERSION: u32 = 1;

/// Bytes before the payload: `length: u32`, `kind: u8`, `channel: u32` (big-endian).
pub const HEADER_LEN: usize = 9;
/// Bytes counted by the length field besides the payload (kind and channel).
pub const LENGTH_OVERHEAD: u32 = 5;
/// Largest payload either side accepts in protocol version 1 (1 MiB).
pub const MAX_PAYLOAD: usize = 1 << 20;
/// Largest DATA chunk a sender should put in one frame. Receivers accept up to
/// [`MAX_PAYLOAD`] - 1.
pub const DATA_CHUNK: usize = 64 * 1024;
/// Largest credit a receiver may have outstanding on one stream.
pub const MAX_WINDOW: u64 = (1 << 31) - 1;

/// Stream numbers inside a channel (first payload byte of DATA, EOF and WINDOW).
pub mod stream {
    /// Client to agent: a process's stdin, the content of a file being written.
    pub const INPUT: u8 = 0;
    /// Agent to client: a process's stdout (or its terminal), a file's content,
    /// NDJSON records of a directory listing or a watch.
    pub const OUTPUT: u8 = 1;
    /// Agent to client: a process's stderr (empty and at EOF for terminals).
    pub const STDERR: u8 = 2;
}

/// The frame kinds. Anything else is a protocol error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum FrameKind {
    /// JSON [`Hello`]; the first frame each way, on channel 0.
    Hello = 1,
    /// JSON [`Request`], client to agent; opens the channel it names.
    Request = 2,
    /// JSON [`Reply`], agent to client.
    Reply = 3,
    /// `stream: u8` then raw bytes; consumes credit.
    Data = 4,
    /// `stream: u8`: no more DATA on that stream.
    Eof = 5,
    /// `stream: u8`, `increment: u32`: grants credit for DATA on that stream.
    Window = 6,
    /// Agent to client, empty: the channel is finished and its number may be reused.
    End = 7,
    /// Client to agent, empty: abandon the channel's operation; the agent answers END.
    Cancel = 8,
    /// JSON [`ErrorBody`] on channel 0: the sender closes the connection after it.
    GoAway = 9,
}

impl FrameKind {
    pub fn from_u8(b: u8) -> Option<FrameKind> {
        Some(match b {
            1 => FrameKind::Hello,
            2 => FrameKind::Request,
            3 => FrameKind::Reply,
            4 => FrameKind::Data,
            5 => FrameKind::Eof,
            6 => FrameKind::Window,
            7 => FrameKind::End,
            8 => FrameKind::Cancel,
            9 => FrameKind::GoAway,
            _ => return None,
        })
    }
}

/// Frame-level violations. Each is fatal to the connection (the receiver answers
/// GOAWAY with code [`ErrorCode::Protocol`] and closes).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("frame length {len} is shorter than the 5-byte kind and channel")]
    TooShort { len: u32 },
    #[error("frame payload of {len} bytes exceeds the maximum of {max}")]
    TooLarge { len: u64, max: usize },
    #[error("unknown frame kind {0}")]
    UnknownKind(u8),
    #[error("{kind:?} frame on channel {channel}: {problem}")]
    BadPayload {
        kind: FrameKind,
        channel: u32,
        problem: String,
    },
}

/// A decoded frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    pub kind: FrameKind,
    pub channel: u32,
    /// Payload length (the length field minus 5).
    pub payload_len: usize,
}

impl FrameHeader {
    /// Decodes and validates a header against `max_payload`.
    pub fn decode(b: &[u8; HEADER_LEN], max_payload: usize) -> Result<FrameHeader, FrameError> {
        let len = u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
        if len < LENGTH_OVERHEAD {
            return Err(FrameError::TooShort { len });
        }
        let payload_len = (len - LENGTH_OVERHEAD) as usize;
        if payload_len > max_payload {
            return Err(FrameError::TooLarge {
                len: payload_len as u64,
                max: max_payload,
            });
        }
        let kind = FrameKind::from_u8(b[4]).ok_or(FrameError::UnknownKind(b[4]))?;
        let channel = u32::from_be_bytes([b[5], b[6], b[7], b[8]]);
        Ok(FrameHeader {
            kind,
            channel,
            payload_len,
        })
    }

    /// Encodes a header. Panics if `payload_len` exceeds `u32::MAX - 5` (callers
    /// keep payloads under [`MAX_PAYLOAD`]).
    pub fn encode(kind: FrameKind, channel: u32, payload_len: usize) -> [u8; HEADER_LEN] {
        let len = u32::try_from(payload_len)
            .ok()
            .and_then(|l| l.checked_add(LENGTH_OVERHEAD))
            .expect("frame payload fits in u32");
        let l = len.to_be_bytes();
        let c = channel.to_be_bytes();
        [l[0], l[1], l[2], l[3], kind as u8, c[0], c[1], c[2], c[3]]
    }
}

fn bad(kind: FrameKind, channel: u32, problem: impl Into<String>) -> FrameError {
    FrameError::BadPayload {
        kind,
        channel,
        problem: problem.into(),
    }
}

fn check_stream(kind: FrameKind, channel: u32, s: u8) -> Result<u8, FrameError> {
    if s > stream::STDERR {
        return Err(bad(kind, channel, format!("unknown stream {s}")));
    }
    Ok(s)
}

/// Splits a DATA payload into its stream and bytes.
pub fn parse_data(channel: u32, payload: &[u8]) -> Result<(u8, &[u8]), FrameError> {
    match payload.split_first() {
        Some((&s, rest)) if !rest.is_empty() => {
            Ok((check_stream(FrameKind::Data, channel, s)?, rest))
        }
        Some(_) => Err(bad(FrameKind::Data, channel, "no data bytes")),
        None => Err(bad(FrameKind::Data, channel, "empty payload")),
    }
}

/// Parses an EOF payload (one stream byte).
pub fn parse_eof(channel: u32, payload: &[u8]) -> Result<u8, FrameError> {
    match payload {
        [s] => check_stream(FrameKind::Eof, channel, *s),
        _ => Err(bad(
            FrameKind::Eof,
            channel,
            format!("payload must be 1 byte, got {}", payload.len()),
        )),
    }
}

/// Encodes a WINDOW payload.
pub fn encode_window(stream: u8, increment: u32) -> [u8; 5] {
    let i = increment.to_be_bytes();
    [stream, i[0], i[1], i[2], i[3]]
}

/// Parses a WINDOW payload into its stream and (non-zero) increment.
pub fn parse_window(channel: u32, payload: &[u8]) -> Result<(u8, u32), FrameError> {
    match payload {
        [s, a, b, c, d] => {
            let s = check_stream(FrameKind::Window, channel, *s)?;
            let inc = u32::from_be_bytes([*a, *b, *c, *d]);
            if inc == 0 || u64::from(inc) > MAX_WINDOW {
                return Err(bad(
                    FrameKind::Window,
                    channel,
                    format!("increment {inc} outside 1..={MAX_WINDOW}"),
                ));
            }
            Ok((s, inc))
        }
        _ => Err(bad(
            FrameKind::Window,
            channel,
            format!("payload must be 5 bytes, got {}", payload.len()),
        )),
    }
}

/// Capabilities an agent of this build announces in its [`Hello`].
pub const AGENT_CAPABILITIES: &[&str] = &["exec", "pty", "attach", "files", "watch", "quiesce"];

/// First frame each way. Tolerant of unknown fields so that any future version can
/// still be told apart and refused cleanly.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    /// Always [`PROTOCOL_NAME`].
    pub protocol: String,
    /// Highest protocol version the sender speaks.
    pub version: u32,
    /// Lowest protocol version the sender speaks.
    pub min_version: u32,
    /// Sender software and version, for diagnostics (`sandlot-guest 0.1.0`).
    pub software: String,
    #[serde(default)]
    pub capabilities: Vec<String>,
    /// Largest payload the sender accepts.
    pub max_payload: u32,
}

impl Hello {
    /// The hello of this build, with the given software string and capabilities.
    pub fn current(software: impl Into<String>, capabilities: &[&str]) -> Hello {
        Hello {
            protocol: PROTOCOL_NAME.to_string(),
            version: PROTOCOL_VERSION,
            min_version: MIN_PROTOCOL_VERSION,
            software: software.into(),
            capabilities: capabilities.iter().map(|s| s.to_string()).collect(),
            max_payload: MAX_PAYLOAD as u32,
        }
    }

    /// The version both sides will speak, or a message saying why there is none.
    pub fn negotiate(&self, peer: &Hello) -> Result<u32, String> {
        if peer.protocol != PROTOCOL_NAME {
            return Err(format!(
                "peer speaks protocol {:?}, not {PROTOCOL_NAME:?}",
                peer.protocol
            ));
        }
        if peer.min_version > peer.version {
            return Err(format!(
                "peer announced an empty version range {}..={}",
                peer.min_version, peer.version
            ));
        }
        let v = self.version.min(peer.version);
        if v < self.min_version.max(peer.min_version) {
            return Err(format!(
                "no common protocol version: we speak {}..={}, {} speaks {}..={}",
                self.min_version, self.version, peer.software, peer.min_version, peer.version
            ));
        }
        Ok(v)
    }
}

/// The id of the command an agent starts as it starts, before any connection
/// (`sandlot run` hands its command over with the sandbox's plan): clients attach
/// to it from offset 0. Until the first attach its output is kept, never dropped.
pub const FIRST_PROCESS: ProcessId = ProcessId(1);

/// Agent-assigned identifier of a process, unique for the agent's lifetime.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ProcessId(pub u64);

impl fmt::Display for ProcessId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Terminal window size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PtySize {
    pub rows: u16,
    pub cols: u16,
}

impl Default for PtySize {
    fn default() -> Self {
        PtySize { rows: 24, cols: 80 }
    }
}

/// Limits on exec requests.
pub mod exec_limits {
    pub const MAX_ARGS: usize = 65_536;
    pub const MAX_ENV: usize = 4_096;
    /// Total bytes of argv and env.
    pub const MAX_ARG_BYTES: usize = 512 * 1024;
    pub const MAX_TAG: usize = 256;
}

/// Starts a process.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct ExecRequest {
    /// Program and arguments; the program is looked up in `PATH` unless it has a `/`.
    pub argv: Vec<String>,
    /// Variables set over the agent's base environment.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Working directory (absolute). Default: the agent's default, else the user's home.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// `root`, `user`, `UID[:GID]` or a name in the sandbox's `/etc/passwd`.
    /// Default: the agent's default user.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// Run on a new pseudo-terminal of this size (stdout carries the terminal,
    /// stderr is empty).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pty: Option<PtySize>,
    /// Kill the process group with SIGKILL after this long and report `timed_out`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<Seconds>,
    /// Keep stdin open for the client to write to; otherwise it is `/dev/null`
    /// (a terminal always has an input side).
    #[serde(default)]
    pub stdin: bool,
    /// Do not stream output on this channel: reply `started` and end. Output is
    /// retained for a later `attach`.
    #[serde(default)]
    pub detached: bool,
    /// Free-form label shown in process listings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
}

impl ExecRequest {
    /// A request running `argv` with every option at its default.
    pub fn new<I, S>(argv: I) -> ExecRequest
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        ExecRequest {
            argv: argv.into_iter().map(Into::into).collect(),
            ..ExecRequest::default()
        }
    }

    /// Checks what serde cannot. The message names the field.
    pub fn validate(&self) -> Result<(), String> {
        if self.argv.is_empty() {
            return Err("argv: must not be empty".into());
        }
        if self.argv[0].is_empty() {
            return Err("argv[0]: must not be empty".into());
        }
        if self.argv.len() > exec_limits::MAX_ARGS {
            return Err(format!("argv: at most {} arguments", exec_limits::MAX_ARGS));
        }
        if self.env.len() > exec_limits::MAX_ENV {
            return Err(format!("env: at most {} variables", exec_limits::MAX_ENV));
        }
        let mut total = 0usize;
        for (i, a) in self.argv.iter().enumerate() {
            if a.contains('\0') {
                return Err(format!("argv[{i}]: contains a NUL byte"));
            }
            total += a.len() + 1;
        }
        for (k, v) in &self.env {
            if !valid_env_name(k) {
                return Err(format!(
                    "env: {k:?} is not a valid variable name (non-empty, no '=' or NUL)"
                ));
            }
            if v.contains('\0') {
                return Err(format!("env.{k}: value contains a NUL byte"));
            }
            total += k.len() + v.len() + 2;
        }
        if total > exec_limits::MAX_ARG_BYTES {
            return Err(format!(
                "argv and env: {total} bytes exceed the limit of {}",
                exec_limits::MAX_ARG_BYTES
            ));
        }
        if let Some(c) = &self.cwd {
            if !c.starts_with('/') || c.contains('\0') {
                return Err(format!("cwd: {c:?} must be an absolute path"));
            }
        }
        if let Some(u) = &self.user {
            if u.is_empty() || u.contains('\0') || u.contains('\n') {
                return Err(format!("user: {u:?} is not a user name or UID[:GID]"));
            }
        }
        if let Some(p) = &self.pty {
            if p.rows == 0 || p.cols == 0 {
                return Err(format!(
                    "pty: rows and cols must be positive, got {}x{}",
                    p.rows, p.cols
                ));
            }
        }
        if let Some(t) = &self.timeout {
            if t.0.is_zero() {
                return Err("timeout: must be positive".into());
            }
        }
        if let Some(t) = &self.tag {
            if t.len() > exec_limits::MAX_TAG {
                return Err(format!("tag: longer than {} bytes", exec_limits::MAX_TAG));
            }
        }
        Ok(())
    }
}

/// Environment variable names accepted in requests: non-empty, no `=` and no NUL.
pub fn valid_env_name(k: &str) -> bool {
    !k.is_empty() && !k.contains('=') && !k.contains('\0')
}

/// Re-attaches to a process's output (and stdin, if still open).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AttachRequest {
    pub id: ProcessId,
    /// Byte offset in stdout to start from; absent = only output produced from now
    /// on. Offsets older than the retained output start at the oldest retained byte.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdout_from: Option<u64>,
    /// Same for stderr.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stderr_from: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SignalRequest {
    pub id: ProcessId,
    /// Signal number (1..=64), sent to the process group.
    pub signal: i32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResizeRequest {
    pub id: ProcessId,
    pub rows: u16,
    pub cols: u16,
}

/// Streams a file's content as DATA on stream 1.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReadFileRequest {
    pub path: String,
    #[serde(default)]
    pub offset: u64,
    /// Read at most this many bytes; absent = to the end.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub length: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
}

impl ReadFileRequest {
    /// The whole file, as the default user.
    pub fn new(path: impl Into<String>) -> ReadFileRequest {
        ReadFileRequest {
            path: path.into(),
            offset: 0,
            length: None,
            user: None,
        }
    }
}

fn yes() -> bool {
    true
}

/// Writes a file from DATA on stream 0, finished by EOF on stream 0.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WriteFileRequest {
    pub path: String,
    /// Permission bits of the file. Default: those of the file it replaces, else
    /// 0644 (subject to nothing: no umask is applied to an explicit mode).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<u32>,
    /// Append to the file (created if missing) instead of replacing it atomically.
    #[serde(default)]
    pub append: bool,
    /// Create missing parent directories (mode 0755, owned by the user).
    #[serde(default = "yes")]
    pub create_parents: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// Extended attributes set on the new file before it appears (names in the
    /// `user.` namespace; at most [`MAX_XATTRS`], each value at most
    /// [`MAX_XATTR_VALUE`] bytes). Not with `append`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub xattrs: BTreeMap<String, String>,
}

/// Most extended attributes a write sets, or a stat reports.
pub const MAX_XATTRS: usize = 64;
/// Longest extended attribute value a write sets, or a stat reports (bytes).
pub const MAX_XATTR_VALUE: usize = 4096;

impl WriteFileRequest {
    pub fn new(path: impl Into<String>) -> WriteFileRequest {
        WriteFileRequest {
            path: path.into(),
            mode: None,
            append: false,
            create_parents: true,
            user: None,
            xattrs: BTreeMap::new(),
        }
    }
}

fn one() -> u32 {
    1
}

/// Lists a directory tree as NDJSON [`DirEntry`] records on stream 1.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListDirRequest {
    pub path: String,
    /// 1 = the directory's entries only; 2 = also their children; and so on.
    #[serde(default = "one")]
    pub depth: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
}

impl ListDirRequest {
    pub fn new(path: impl Into<String>, depth: u32) -> ListDirRequest {
        ListDirRequest {
            path: path.into(),
            depth,
            user: None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StatRequest {
    pub path: String,
    /// Follow a final symlink (stat) instead of describing it (lstat).
    #[serde(default)]
    pub follow: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
}

impl StatRequest {
    pub fn new(path: impl Into<String>) -> StatRequest {
        StatRequest {
            path: path.into(),
            follow: false,
            user: None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MkdirRequest {
    pub path: String,
    /// Create missing parents, and succeed if the directory already exists.
    #[serde(default)]
    pub parents: bool,
    /// Permission bits (default 0755; no umask applied to an explicit mode).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
}

impl MkdirRequest {
    pub fn new(path: impl Into<String>, parents: bool) -> MkdirRequest {
        MkdirRequest {
            path: path.into(),
            parents,
            mode: None,
            user: None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RemoveRequest {
    pub path: String,
    /// Remove a directory and everything under it (symlinks are not followed).
    #[serde(default)]
    pub recursive: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
}

impl RemoveRequest {
    pub fn new(path: impl Into<String>, recursive: bool) -> RemoveRequest {
        RemoveRequest {
            path: path.into(),
            recursive,
            user: None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RenameRequest {
    pub from: String,
    pub to: String,
    /// Replace an existing `to` (default true); false fails with `already_exists`.
    #[serde(default = "yes")]
    pub overwrite: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
}

impl RenameRequest {
    pub fn new(from: impl Into<String>, to: impl Into<String>) -> RenameRequest {
        RenameRequest {
            from: from.into(),
            to: to.into(),
            overwrite: true,
            user: None,
        }
    }
}

/// Streams filesystem events as NDJSON [`WatchEvent`] records on stream 1.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WatchRequest {
    pub path: String,
    /// Also watch every directory below `path`, including ones created later.
    #[serde(default)]
    pub recursive: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
}

impl WatchRequest {
    pub fn new(path: impl Into<String>, recursive: bool) -> WatchRequest {
        WatchRequest {
            path: path.into(),
            recursive,
            user: None,
        }
    }
}

/// Every request, tagged by `op`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    /// Liveness check; replies `ok`. (Field-less ops are empty structs so that
    /// unknown fields are refused like everywhere else.)
    Ping {},
    Exec(ExecRequest),
    Attach(AttachRequest),
    ListProcesses {},
    Signal(SignalRequest),
    Resize(ResizeRequest),
    /// Kill every process and stop the agent.
    Shutdown {},
    ReadFile(ReadFileRequest),
    WriteFile(WriteFileRequest),
    ListDir(ListDirRequest),
    Stat(StatRequest),
    Mkdir(MkdirRequest),
    Remove(RemoveRequest),
    Rename(RenameRequest),
    Watch(WatchRequest),
    /// Replace the defaults of processes started from now on (base environment,
    /// default user and working directory). Lets a host hand a pre-started sandbox
    /// to a caller with the caller's settings.
    Configure(ConfigureRequest),
    /// Replies `ok`, then closes every connection and the listening socket and
    /// listens again (at the same path) once the agent receives `SIGUSR1`:
    /// processes keep running meanwhile. A gVisor checkpoint cannot save a socket
    /// bound to the host, which the agent's are.
    Quiesce {},
    /// The sandbox's memory use passed its declared limit (a host watcher saw it
    /// in the sandbox's cgroup): the agent SIGKILLs the sandbox process with the
    /// largest resident set by its own view of `/proc` (never itself, never PID 1)
    /// and replies `relieved`, naming it. gVisor has no OOM killer of its own;
    /// this is it.
    RelieveMemory {},
}

/// New process defaults; see [`Request::Configure`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct ConfigureRequest {
    /// Base environment of every process (replaces the previous one).
    #[serde(default)]
    pub env: Vec<(String, String)>,
    /// `root`, `UID[:GID]` or a name in the sandbox's `/etc/passwd`.
    pub default_user: String,
    /// Absent: the user's home if it exists, else `/`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_cwd: Option<String>,
}

impl Request {
    /// The `op` name, for messages.
    pub fn op(&self) -> &'static str {
        match self {
            Request::Ping {} => "ping",
            Request::Exec(_) => "exec",
            Request::Attach(_) => "attach",
            Request::ListProcesses {} => "list_processes",
            Request::Signal(_) => "signal",
            Request::Resize(_) => "resize",
            Request::Shutdown {} => "shutdown",
            Request::ReadFile(_) => "read_file",
            Request::WriteFile(_) => "write_file",
            Request::ListDir(_) => "list_dir",
            Request::Stat(_) => "stat",
            Request::Mkdir(_) => "mkdir",
            Request::Remove(_) => "remove",
            Request::Rename(_) => "rename",
            Request::Watch(_) => "watch",
            Request::Configure(_) => "configure",
            Request::Quiesce {} => "quiesce",
            Request::RelieveMemory {} => "relieve_memory",
        }
    }
}

/// How a process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct ExitStatus {
    /// Exit code, if the process exited normally.
    #[serde(default)]
    pub code: Option<i32>,
    /// Signal number, if a signal killed it.
    #[serde(default)]
    pub signal: Option<i32>,
    #[serde(default)]
    pub core_dumped: bool,
    /// The exec's timeout expired and the agent killed the process group.
    #[serde(default)]
    pub timed_out: bool,
}

impl ExitStatus {
    pub fn success(&self) -> bool {
        self.code == Some(0)
    }
}

/// Position of a process output stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct StreamInfo {
    /// Offset of the oldest byte still retained for re-attach.
    pub retained_from: u64,
    /// Bytes produced so far (offset of the next byte).
    pub produced: u64,
    /// The stream is closed (no process holds its write end).
    pub eof: bool,
}

/// A process the agent started and has not yet forgotten.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessInfo {
    pub id: ProcessId,
    /// Pid inside the sandbox's pid namespace (also its process group and session).
    pub pid: i32,
    pub argv: Vec<String>,
    #[serde(default)]
    pub tag: Option<String>,
    pub uid: u32,
    pub gid: u32,
    pub pty: bool,
    /// Start time, milliseconds since the Unix epoch.
    pub started_at_ms: u64,
    /// Absent while running.
    #[serde(default)]
    pub exit: Option<ExitStatus>,
    pub stdout: StreamInfo,
    pub stderr: StreamInfo,
    /// Its stdin is open for writing.
    pub stdin_open: bool,
    /// Channels currently streaming its output.
    pub attached: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FileKind {
    File,
    Dir,
    Symlink,
    Other,
}

/// Metadata of a file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileStat {
    pub path: String,
    pub kind: FileKind,
    pub size: u64,
    /// Permission bits, including setuid, setgid and sticky (`st_mode & 0o7777`).
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    /// Modification time, seconds since the Unix epoch, and nanoseconds.
    pub mtime: i64,
    pub mtime_nsec: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub symlink_target: Option<String>,
    /// The entry's extended attributes in the `user.` namespace whose values are
    /// UTF-8 (at most [`MAX_XATTRS`], values at most [`MAX_XATTR_VALUE`] bytes).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub xattrs: BTreeMap<String, String>,
}

/// One NDJSON record of a directory listing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirEntry {
    #[serde(flatten)]
    pub stat: FileStat,
    /// 1 for the listed directory's own entries, 2 for their children, ...
    pub depth: u32,
    /// Set when this directory could not be descended into.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WatchEventKind {
    Create,
    Modify,
    Delete,
    /// `from` was renamed to `path` (both inside the watched tree).
    Rename,
    /// Events were dropped (the kernel queue overflowed); rescan if you need state.
    Overflow,
}

/// One NDJSON record of a watch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WatchEvent {
    pub kind: WatchEventKind,
    /// The affected path (absent for `overflow`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// Old path of a rename.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    /// The path is a directory.
    #[serde(default)]
    pub dir: bool,
}

/// Machine-readable error codes. Unknown codes from a newer peer read as `Other`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// Malformed or invalid request (bad JSON, unknown field, failed validation).
    BadRequest,
    /// Frame-level violation; the connection is closed.
    Protocol,
    /// No common protocol version; the connection is closed.
    UnsupportedVersion,
    NotFound,
    PermissionDenied,
    AlreadyExists,
    NotADirectory,
    IsADirectory,
    DirectoryNotEmpty,
    /// No process with that id (never existed, or already collected).
    NoSuchProcess,
    /// The process has exited (e.g. signal or resize after exit).
    ProcessExited,
    /// The user could not be resolved.
    InvalidUser,
    /// The process could not be started (the message says why).
    SpawnFailed,
    /// A limit was reached (channels, processes).
    Limit,
    /// The agent is shutting down.
    ShuttingDown,
    /// Any other I/O failure.
    Io,
    #[serde(other)]
    Other,
}

impl ErrorCode {
    pub fn as_str(&self) -> &'static str {
        match self {
            ErrorCode::BadRequest => "bad_request",
            ErrorCode::Protocol => "protocol",
            ErrorCode::UnsupportedVersion => "unsupported_version",
            ErrorCode::NotFound => "not_found",
            ErrorCode::PermissionDenied => "permission_denied",
            ErrorCode::AlreadyExists => "already_exists",
            ErrorCode::NotADirectory => "not_a_directory",
            ErrorCode::IsADirectory => "is_a_directory",
            ErrorCode::DirectoryNotEmpty => "directory_not_empty",
            ErrorCode::NoSuchProcess => "no_such_process",
            ErrorCode::ProcessExited => "process_exited",
            ErrorCode::InvalidUser => "invalid_user",
            ErrorCode::SpawnFailed => "spawn_failed",
            ErrorCode::Limit => "limit",
            ErrorCode::ShuttingDown => "shutting_down",
            ErrorCode::Io => "io",
            ErrorCode::Other => "other",
        }
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Body of an `error` reply and of GOAWAY.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub code: ErrorCode,
    pub message: String,
}

impl ErrorBody {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> ErrorBody {
        ErrorBody {
            code,
            message: message.into(),
        }
    }
}

/// Every agent reply, tagged by `type`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Reply {
    /// The request succeeded and has no other result.
    Ok,
    /// The process started. Output follows unless the exec was detached.
    Started {
        id: ProcessId,
        pid: i32,
        pty: bool,
        stdin: bool,
    },
    /// Attached to a process: output follows from these offsets.
    Attached {
        id: ProcessId,
        pid: i32,
        pty: bool,
        /// Stdin is open: the agent grants credit on stream 0.
        stdin: bool,
        stdout_from: u64,
        stderr_from: u64,
    },
    /// The process ended. Every byte it wrote before ending precedes this reply on
    /// the channel (`stdout_end` and `stderr_end` are the stream offsets at exit);
    /// descendants still holding the streams may write more before EOF.
    Exit {
        status: ExitStatus,
        stdout_end: u64,
        stderr_end: u64,
    },
    /// A batch of processes; `list_processes` sends one or more, then END.
    Processes { processes: Vec<ProcessInfo> },
    /// Metadata (stat; also the first reply of read_file and list_dir).
    Stat { stat: FileStat },
    /// write_file: the file is open; send DATA within the granted credit, then EOF.
    Ready,
    /// write_file finished: the file is in place.
    Written { bytes: u64 },
    /// The watch is set up; events follow on stream 1.
    Watching,
    /// `relieve_memory` answered: the process killed (`None`: none was left to
    /// kill but the agent and PID 1).
    Relieved { victim: Option<MemoryVictim> },
    /// The request failed. END follows.
    Error(ErrorBody),
}

/// The process `relieve_memory` killed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryVictim {
    /// Its pid in the sandbox.
    pub pid: i32,
    /// Its resident set when chosen.
    pub rss_bytes: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trips_and_validates() {
        let h = FrameHeader::encode(FrameKind::Data, 7, 100);
        let d = FrameHeader::decode(&h, MAX_PAYLOAD).unwrap();
        assert_eq!(
            d,
            FrameHeader {
                kind: FrameKind::Data,
                channel: 7,
                payload_len: 100
            }
        );
        let mut big = FrameHeader::encode(FrameKind::Data, 1, MAX_PAYLOAD + 1);
        assert!(matches!(
            FrameHeader::decode(&big, MAX_PAYLOAD),
            Err(FrameError::TooLarge { .. })
        ));
        big[0..4].copy_from_slice(&3u32.to_be_bytes());
        assert_eq!(
            FrameHeader::decode(&big, MAX_PAYLOAD),
            Err(FrameError::TooShort { len: 3 })
        );
        let mut unk = FrameHeader::encode(FrameKind::Data, 1, 0);
        unk[4] = 42;
        assert_eq!(
            FrameHeader::decode(&unk, MAX_PAYLOAD),
            Err(FrameError::UnknownKind(42))
        );
    }

    #[test]
    fn binary_payloads_parse_strictly() {
        assert_eq!(parse_data(1, &[1, b'x']).unwrap(), (1, &b"x"[..]));
        assert!(parse_data(1, &[]).is_err());
        assert!(parse_data(1, &[1]).is_err());
        assert!(parse_data(1, &[3, b'x']).is_err());
        assert_eq!(parse_eof(1, &[2]).unwrap(), 2);
        assert!(parse_eof(1, &[2, 0]).is_err());
        assert_eq!(
            parse_window(1, &encode_window(1, 65536)).unwrap(),
            (1, 65536)
        );
        assert!(parse_window(1, &encode_window(1, 0)).is_err());
        assert!(parse_window(1, &encode_window(1, u32::MAX)).is_err());
        assert!(parse_window(1, &[1, 0, 0]).is_err());
    }

    #[test]
    fn version_negotiation_picks_highest_common() {
        let ours = Hello::current("a", &[]);
        let mut peer = Hello::current("b", &[]);
        assert_eq!(ours.negotiate(&peer), Ok(PROTOCOL_VERSION));
        peer.version = 9;
        peer.min_version = 1;
        assert_eq!(ours.negotiate(&peer), Ok(PROTOCOL_VERSION));
        peer.min_version = 2;
        let e = ours.negotiate(&peer).unwrap_err();
        assert!(e.contains("no common protocol version"), "{e}");
        peer.protocol = "http".into();
        assert!(ours.negotiate(&peer).unwrap_err().contains("\"http\""));
        // Unknown hello fields are tolerated.
        let h: Hello = serde_json::from_str(
            r#"{"protocol":"sandlot-guest","version":3,"min_version":2,"software":"x","max_payload":10,"future":1}"#,
        )
        .unwrap();
        assert_eq!(h.version, 3);
    }

    #[test]
    fn requests_are_strict() {
        let r: Request =
            serde_json::from_str(r#"{"op":"exec","argv":["true"],"timeout":"2s"}"#).unwrap();
        match r {
            Request::Exec(e) => {
                assert_eq!(e.argv, vec!["true"]);
                assert_eq!(e.timeout, Some(Seconds::secs(2)));
            }
            other => panic!("{other:?}"),
        }
        let e = serde_json::from_str::<Request>(r#"{"op":"exec","argv":["true"],"bogus":1}"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("bogus"), "{e}");
        assert!(serde_json::from_str::<Request>(r#"{"op":"nope"}"#).is_err());
        assert!(serde_json::from_str::<Request>(r#"{"op":"ping","x":1}"#).is_err());
        let r: Request = serde_json::from_str(r#"{"op":"ping"}"#).unwrap();
        assert_eq!(r, Request::Ping {});
        let w: Request = serde_json::from_str(r#"{"op":"write_file","path":"/a"}"#).unwrap();
        assert_eq!(w, Request::WriteFile(WriteFileRequest::new("/a")));
        // Round trip of every shape through JSON.
        let all = vec![
            Request::Exec(ExecRequest::new(["sh", "-c", "x"])),
            Request::Signal(SignalRequest {
                id: ProcessId(3),
                signal: 15,
            }),
            Request::Attach(AttachRequest {
                id: ProcessId(1),
                stdout_from: Some(0),
                stderr_from: None,
            }),
            Request::Shutdown {},
        ];
        for r in all {
            let s = serde_json::to_string(&r).unwrap();
            assert_eq!(serde_json::from_str::<Request>(&s).unwrap(), r, "{s}");
        }
    }

    #[test]
    fn exec_validation_names_the_field() {
        let mut e = ExecRequest::new(Vec::<String>::new());
        assert!(e.validate().unwrap_err().starts_with("argv"));
        e.argv = vec!["a\0b".into()];
        assert!(e.validate().unwrap_err().contains("argv[0]"));
        e.argv = vec!["ls".into()];
        e.env.insert("A=B".into(), "x".into());
        assert!(e.validate().unwrap_err().starts_with("env"));
        e.env.clear();
        e.cwd = Some("rel".into());
        assert!(e.validate().unwrap_err().starts_with("cwd"));
        e.cwd = None;
        e.pty = Some(PtySize { rows: 0, cols: 80 });
        assert!(e.validate().unwrap_err().starts_with("pty"));
        e.pty = Some(PtySize::default());
        assert!(e.validate().is_ok());
    }

    #[test]
    fn replies_are_tolerant_and_codes_forward_compatible() {
        let r: Reply =
            serde_json::from_str(r#"{"type":"error","code":"brand_new","message":"m","extra":1}"#)
                .unwrap();
        assert_eq!(r, Reply::Error(ErrorBody::new(ErrorCode::Other, "m")));
        let r: Reply = serde_json::from_str(
            r#"{"type":"exit","status":{"code":null,"signal":9,"timed_out":true},"stdout_end":5,"stderr_end":0}"#,
        )
        .unwrap();
        match r {
            Reply::Exit { status, .. } => {
                assert_eq!(status.signal, Some(9));
                assert!(status.timed_out);
            }
            other => panic!("{other:?}"),
        }
        let d = DirEntry {
            stat: FileStat {
                path: "/a".into(),
                kind: FileKind::Dir,
                size: 0,
                mode: 0o755,
                uid: 0,
                gid: 0,
                mtime: 1,
                mtime_nsec: 2,
                symlink_target: None,
                xattrs: BTreeMap::new(),
            },
            depth: 1,
            error: None,
        };
        let s = serde_json::to_string(&d).unwrap();
        assert_eq!(serde_json::from_str::<DirEntry>(&s).unwrap(), d);
    }
}
