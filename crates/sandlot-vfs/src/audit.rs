//! Audit log of every command run in a session: one JSON object per line.

use std::fs::{File, OpenOptions};
use std::io::{self, BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

/// Errors from writing or reading the audit log.
#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    /// I/O on the log file failed.
    #[error("{op} audit log {path}")]
    Io {
        op: &'static str,
        path: PathBuf,
        source: io::Error,
    },
    /// A line of the log is not a valid record.
    #[error("audit log {path}:{line}: {reason}")]
    Corrupt {
        path: PathBuf,
        line: usize,
        reason: String,
    },
}

/// One command run in a session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditRecord {
    /// When the command finished, milliseconds since the Unix epoch.
    pub ts_ms: u64,
    /// Collection name.
    pub collection: String,
    /// Collection version the session was opened on.
    pub version: u64,
    /// Session id.
    pub session: String,
    /// Principal name.
    pub principal: String,
    /// The command line as given.
    pub command: String,
    /// Exit status.
    pub exit_code: i32,
    /// Bytes of standard output returned.
    pub stdout_bytes: u64,
    /// Bytes of standard error returned.
    pub stderr_bytes: u64,
    /// Whether output was cut at the session's limit.
    pub truncated: bool,
    /// Wall time in microseconds.
    pub duration_us: u64,
}

/// Where sessions send audit records. The daemon may supply its own.
pub trait AuditSink: Send + Sync {
    /// Persist one record; an error fails the command that produced it.
    fn record(&self, rec: &AuditRecord) -> Result<(), AuditError>;
}

/// An append-only JSON-lines audit file.
#[derive(Debug)]
pub struct AuditLog {
    path: PathBuf,
    file: Mutex<Option<File>>,
}

/// Which records to read back.
#[derive(Debug, Clone, Default)]
pub struct AuditFilter {
    /// Only this collection.
    pub collection: Option<String>,
    /// Only this principal.
    pub principal: Option<String>,
    /// Only the last N matching records.
    pub last: Option<usize>,
}

impl AuditLog {
    /// A log at `path` (opened lazily, created on first record).
    pub fn new(path: impl Into<PathBuf>) -> Self {
        AuditLog {
            path: path.into(),
            file: Mutex::new(None),
        }
    }

    /// The log file path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Read records, oldest first.
    pub fn read(&self, filter: &AuditFilter) -> Result<Vec<AuditRecord>, AuditError> {
        let f = match File::open(&self.path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(source) => {
                return Err(AuditError::Io {
                    op: "open",
                    path: self.path.clone(),
                    source,
                })
            }
        };
        let mut out = Vec::new();
        for (i, line) in BufReader::new(f).lines().enumerate() {
            let line = line.map_err(|source| AuditError::Io {
                op: "read",
                path: self.path.clone(),
                source,
            })?;
            if line.is_empty() {
                continue;
            }
            let rec: AuditRecord =
                serde_json::from_str(&line).map_err(|e| AuditError::Corrupt {
                    path: self.path.clone(),
                    line: i + 1,
                    reason: e.to_string(),
                })?;
            if filter
                .collection
                .as_ref()
                .is_some_and(|c| *c != rec.collection)
                || filter
                    .principal
                    .as_ref()
                    .is_some_and(|p| *p != rec.principal)
            {
                continue;
            }
            out.push(rec);
        }
        if let Some(n) = filter.last {
            let skip = out.len().saturating_sub(n);
            out.drain(..skip);
        }
        Ok(out)
    }
}

impl AuditSink for AuditLog {
    fn record(&self, rec: &AuditRecord) -> Result<(), AuditError> {
        let ioerr = |op, source| AuditError::Io {
            op,
            path: self.path.clone(),
            source,
        };
        let mut line = serde_json::to_vec(rec).expect("audit record serializes");
        line.push(b'\n');
        let mut guard = self.file.lock().unwrap_or_else(|p| p.into_inner());
        if guard.is_none() {
            if let Some(dir) = self.path.parent() {
                std::fs::create_dir_all(dir).map_err(|e| ioerr("create directory for", e))?;
            }
            let f = OpenOptions::new()
                .create(true)
                .append(true)
                .open(&self.path)
                .map_err(|e| ioerr("open", e))?;
            *guard = Some(f);
        }
        let f = guard.as_mut().expect("opened above");
        // One write call per record: O_APPEND keeps lines whole across processes.
        f.write_all(&line).map_err(|e| ioerr("append to", e))
    }
}

/// Render milliseconds since the epoch as `YYYY-MM-DDTHH:MM:SS.mmmZ`.
pub fn format_utc(ts_ms: u64) -> String {
    let secs = (ts_ms / 1000) as i64;
    let (y, m, d) = crate::shell::civil_from_days(secs.div_euclid(86_400));
    let s = secs.rem_euclid(86_400);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z",
        s / 3600,
        s % 3600 / 60,
        s % 60,
        ts_ms % 1000
    )
}

/// Milliseconds since the Unix epoch.
pub(crate) fn now_ms() -> u64 {
    sandlot_proto::clock::now_ms() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(c: &str, p: &str, cmd: &str) -> AuditRecord {
        AuditRecord {
            ts_ms: 1,
            collection: c.into(),
            version: 1,
            session: "s".into(),
            principal: p.into(),
            command: cmd.into(),
            exit_code: 0,
            stdout_bytes: 3,
            stderr_bytes: 0,
            truncated: false,
            duration_us: 5,
        }
    }

    #[test]
    fn append_and_filter() {
        let d = tempfile::tempdir().unwrap();
        let log = AuditLog::new(d.path().join("sub/audit.jsonl"));
        assert!(log.read(&AuditFilter::default()).unwrap().is_empty());
        log.record(&rec("a", "alice", "ls")).unwrap();
        log.record(&rec("b", "bob", "cat x")).unwrap();
        log.record(&rec("a", "bob", "pwd")).unwrap();
        let all = log.read(&AuditFilter::default()).unwrap();
        assert_eq!(all.len(), 3);
        let f = AuditFilter {
            collection: Some("a".into()),
            last: Some(1),
            ..Default::default()
        };
        assert_eq!(log.read(&f).unwrap(), vec![rec("a", "bob", "pwd")]);
        let f = AuditFilter {
            principal: Some("bob".into()),
            ..Default::default()
        };
        assert_eq!(log.read(&f).unwrap().len(), 2);
    }
}
