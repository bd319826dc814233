//! SQLite state: tokens, sandboxes (spec, tags, state, exit, pid for re-adoption),
//! events and usage. One connection behind a mutex; every statement is short.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Mutex, MutexGuard};

use rusqlite::{params, Connection, OptionalExtension, Row};
use serde::{Deserialize, Serialize};

/// Errors of the store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("open database {path}: {source}")]
    Open {
        path: String,
        #[source]
        source: rusqlite::Error,
    },
    #[error("database {op}: {source}")]
    Sql {
        op: &'static str,
        #[source]
        source: rusqlite::Error,
    },
    #[error("database {op}: corrupt value: {message}")]
    Corrupt { op: &'static str, message: String },
    #[error("start the checkpoint thread of database {path}: {source}")]
    Checkpointer {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

mod checkpoint;
mod lifecycle;
mod pause;
mod snapshot;
mod tenants;
mod tokens;

pub use checkpoint::{CheckpointRecord, CheckpointRefusal};
use lifecycle::{insert_lifecycle, lifecycle_from_row};
pub use pause::{BeginPause, PauseRecord, Saved, SavedFile};
pub use sandlot_proto::api::lifecycle::{Lifecycle, OnExpiry};
pub use snapshot::{Promotion, SnapshotAdmission, SnapshotRecord, SnapshotSource};
pub use tenants::TenantLoad;
use tokens::{add_token_created_by, add_token_kind};
pub use tokens::{Grant, Revoke, TokenKind, TokenRecord, OPERATOR_TOKEN_TENANT};

fn sql(op: &'static str) -> impl FnOnce(rusqlite::Error) -> StoreError {
    move |source| StoreError::Sql { op, source }
}

/// Lifecycle state of a sandbox (the API's type, stored as its `as_str`).
pub use sandlot_proto::api::SandboxState;

/// Why a sandbox stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EndReason {
    /// Deleted through the API.
    Deleted,
    /// Its lifetime ran out.
    Timeout,
    /// No exec or file activity for its idle timeout.
    IdleTimeout,
    /// Its PID 1 (the guest agent) exited on its own (e.g. killed by the OOM killer).
    Exited,
    /// The runtime failed to create it.
    CreateFailed,
    /// It died while the daemon was not running.
    Lost,
    /// The daemon shut down and was configured to stop its sandboxes.
    Shutdown,
    /// The operator's isolation policy no longer allows it: found running at a
    /// daemon start below `[isolation] minimum` or above the ceiling.
    Policy,
}

impl EndReason {
    pub fn as_str(self) -> &'static str {
        match self {
            EndReason::Deleted => "deleted",
            EndReason::Timeout => "timeout",
            EndReason::IdleTimeout => "idle_timeout",
            EndReason::Exited => "exited",
            EndReason::CreateFailed => "create_failed",
            EndReason::Lost => "lost",
            EndReason::Shutdown => "shutdown",
            EndReason::Policy => "policy",
        }
    }

    fn parse(s: &str) -> Option<EndReason> {
        Some(match s {
            "deleted" => EndReason::Deleted,
            "timeout" => EndReason::Timeout,
            "idle_timeout" => EndReason::IdleTimeout,
            "exited" => EndReason::Exited,
            "create_failed" => EndReason::CreateFailed,
            "lost" => EndReason::Lost,
            "shutdown" => EndReason::Shutdown,
            "policy" => EndReason::Policy,
            _ => return None,
        })
    }
}

/// Metered usage of one sandbox.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsageRecord {
    pub cpu_usec: u64,
    pub memory_peak_bytes: u64,
    pub exec_count: u64,
    pub stdin_bytes: u64,
    pub stdout_bytes: u64,
    pub stderr_bytes: u64,
    pub file_bytes_in: u64,
    pub file_bytes_out: u64,
}

/// One sandbox row.
#[derive(Debug, Clone, PartialEq)]
pub struct SandboxRecord {
    pub id: String,
    pub tenant: String,
    pub name: Option<String>,
    /// The spec as JSON (as accepted, normalized by serde).
    pub spec: serde_json::Value,
    pub tags: BTreeMap<String, String>,
    pub metadata: BTreeMap<String, String>,
    pub state: SandboxState,
    pub end_reason: Option<EndReason>,
    /// Wait status details of PID 1 when it exited on its own.
    pub exit_code: Option<i32>,
    pub exit_signal: Option<i32>,
    /// Failure message shown to the client (never internal details).
    pub error: Option<String>,
    /// Host pid of PID 1, for re-adoption after a restart.
    pub pid: Option<i32>,
    pub memory_bytes: u64,
    /// Milliseconds since the Unix epoch.
    pub created_at: i64,
    pub started_at: Option<i64>,
    pub ended_at: Option<i64>,
    pub expires_at: i64,
    pub idle_timeout_ms: Option<i64>,
    pub usage: UsageRecord,
    /// What its timeouts do and whether a call resumes it (`store/lifecycle.rs`).
    pub lifecycle: Lifecycle,
    /// The lifetime it was created with, in ms: what a resume after an auto-pause
    /// gives it again.
    pub timeout_ms: i64,
}

/// An event of a sandbox's life.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventRecord {
    pub seq: i64,
    pub sandbox_id: String,
    pub at: i64,
    pub kind: String,
    pub message: String,
}

/// Filter of a sandbox listing.
#[derive(Debug, Clone, Default)]
pub struct SandboxFilter {
    /// None: every tenant (admin).
    pub tenant: Option<String>,
    /// Empty: the live states.
    pub states: Vec<SandboxState>,
    /// Every (key, value) must match; a None value means "has the key".
    pub tags: Vec<(String, Option<String>)>,
    pub name: Option<String>,
    pub limit: usize,
}

const SCHEMA: &str = r#"
CREATE TABLE IF NOT EXISTS tokens (
    id TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
    name TEXT,
    hash TEXT NOT NULL UNIQUE,
    created_at INTEGER NOT NULL,
    last_used_at INTEGER,
    revoked_at INTEGER,
    kind TEXT NOT NULL DEFAULT 'tenant',
    created_by TEXT
);
CREATE TABLE IF NOT EXISTS sandboxes (
    id TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
    name TEXT,
    spec TEXT NOT NULL,
    tags TEXT NOT NULL,
    metadata TEXT NOT NULL,
    state TEXT NOT NULL,
    end_reason TEXT,
    exit_code INTEGER,
    exit_signal INTEGER,
    error TEXT,
    pid INTEGER,
    memory_bytes INTEGER NOT NULL,
    created_at INTEGER NOT NULL,
    started_at INTEGER,
    ended_at INTEGER,
    expires_at INTEGER NOT NULL,
    idle_timeout_ms INTEGER
);
CREATE INDEX IF NOT EXISTS sandboxes_tenant_state ON sandboxes (tenant, state);
CREATE UNIQUE INDEX IF NOT EXISTS sandboxes_live_name ON sandboxes (tenant, name)
    WHERE name IS NOT NULL AND state != 'stopped';
CREATE TABLE IF NOT EXISTS usage (
    sandbox_id TEXT PRIMARY KEY REFERENCES sandboxes (id),
    cpu_usec INTEGER NOT NULL DEFAULT 0,
    memory_peak_bytes INTEGER NOT NULL DEFAULT 0,
    exec_count INTEGER NOT NULL DEFAULT 0,
    stdin_bytes INTEGER NOT NULL DEFAULT 0,
    stdout_bytes INTEGER NOT NULL DEFAULT 0,
    stderr_bytes INTEGER NOT NULL DEFAULT 0,
    file_bytes_in INTEGER NOT NULL DEFAULT 0,
    file_bytes_out INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS events (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    sandbox_id TEXT NOT NULL,
    at INTEGER NOT NULL,
    kind TEXT NOT NULL,
    message TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS events_sandbox ON events (sandbox_id, seq);
CREATE TABLE IF NOT EXISTS pauses (
    sandbox_id TEXT PRIMARY KEY REFERENCES sandboxes (id),
    kind TEXT NOT NULL,
    paused_at INTEGER NOT NULL,
    remaining_ms INTEGER NOT NULL,
    saved TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS lifecycles (
    sandbox_id TEXT PRIMARY KEY REFERENCES sandboxes (id),
    on_idle TEXT NOT NULL,
    on_timeout TEXT NOT NULL,
    auto_resume INTEGER NOT NULL,
    timeout_ms INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS checkpoints (
    id TEXT PRIMARY KEY,
    sandbox_id TEXT NOT NULL,
    tenant TEXT NOT NULL,
    name TEXT,
    parent TEXT,
    kind TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    size INTEGER NOT NULL,
    saved TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS checkpoints_sandbox ON checkpoints (sandbox_id, created_at);
CREATE INDEX IF NOT EXISTS checkpoints_tenant ON checkpoints (tenant);
CREATE TABLE IF NOT EXISTS snapshots (
    id TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
    name TEXT,
    sandbox_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    size INTEGER NOT NULL,
    saved TEXT NOT NULL,
    source TEXT NOT NULL,
    ready INTEGER NOT NULL,
    checkpoint_id TEXT,
    checkpoint_fresh INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS snapshots_tenant ON snapshots (tenant, created_at);
CREATE TABLE IF NOT EXISTS checkpoint_heads (
    sandbox_id TEXT PRIMARY KEY,
    checkpoint_id TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS idempotency_keys (
    tenant TEXT NOT NULL,
    key TEXT NOT NULL,
    request_hash TEXT NOT NULL,
    sandbox_id TEXT,
    created_at INTEGER NOT NULL,
    PRIMARY KEY (tenant, key)
);
"#;

/// How long an `Idempotency-Key` of a create is remembered.
pub const IDEMPOTENCY_TTL_MS: i64 = 24 * 3600 * 1000;

/// What [`Store::reserve_idempotency_key`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyReservation {
    /// The key is now ours: create, then bind or release it.
    Reserved,
    /// Somebody used it already: the request they sent (its hash) and the sandbox
    /// it made (None while that create is still running).
    Taken {
        request_hash: String,
        sandbox_id: Option<String>,
    },
}

/// The database.
pub struct Store {
    conn: Mutex<Connection>,
    /// Stops the WAL checkpointer (see [`Checkpointer`]) when the store is dropped.
    _checkpointer: Option<Checkpointer>,
}

/// How often the checkpointer copies the write-ahead log into the database.
const CHECKPOINT_EVERY: std::time::Duration = std::time::Duration::from_millis(500);

/// Copies the write-ahead log into the database file from a thread and a
/// connection of its own. SQLite otherwise checkpoints inside the commit that
/// fills the log, with an `fsync` of the database file, on whichever request made
/// that commit, holding the store's lock (up to 14 ms seen on a disk), and on an
/// async runtime thread.
struct Checkpointer {
    stop: Option<std::sync::mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Checkpointer {
    fn start(path: &Path) -> Result<Checkpointer, StoreError> {
        let open_err = |source| StoreError::Open {
            path: path.display().to_string(),
            source,
        };
        let conn = Connection::open(path).map_err(open_err)?;
        conn.busy_timeout(std::time::Duration::from_secs(5))
            .map_err(open_err)?;
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("db-checkpoint".into())
            .spawn(move || loop {
                let last = matches!(
                    stopped.recv_timeout(CHECKPOINT_EVERY),
                    Err(std::sync::mpsc::RecvTimeoutError::Disconnected)
                );
                // PASSIVE: copies what it can without waiting for, or blocking,
                // the daemon's connection.
                if let Err(e) = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(())) {
                    tracing::warn!("checkpoint the database's write-ahead log: {e}");
                }
                if last {
                    return;
                }
            })
            .map_err(|source| StoreError::Checkpointer {
                path: path.display().to_string(),
                source,
            })?;
        Ok(Checkpointer {
            stop: Some(stop),
            thread: Some(thread),
        })
    }
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

pub use sandlot_proto::clock::now_ms;

const SANDBOX_COLS: &str = "s.id, s.tenant, s.name, s.spec, s.tags, s.metadata, s.state, s.end_reason, \
    s.exit_code, s.exit_signal, s.error, s.pid, s.memory_bytes, s.created_at, s.started_at, s.ended_at, \
    s.expires_at, s.idle_timeout_ms, u.cpu_usec, u.memory_peak_bytes, u.exec_count, u.stdin_bytes, \
    u.stdout_bytes, u.stderr_bytes, u.file_bytes_in, u.file_bytes_out, \
    l.on_idle, l.on_timeout, l.auto_resume, l.timeout_ms";

/// The tables [`SANDBOX_COLS`] reads.
const SANDBOX_FROM: &str = "sandboxes s LEFT JOIN usage u ON u.sandbox_id = s.id \
    LEFT JOIN lifecycles l ON l.sandbox_id = s.id";

fn corrupt(op: &'static str, m: impl Into<String>) -> StoreError {
    StoreError::Corrupt {
        op,
        message: m.into(),
    }
}

fn sandbox_from_row(r: &Row<'_>) -> rusqlite::Result<Result<SandboxRecord, StoreError>> {
    let spec: String = r.get(3)?;
    let tags: String = r.get(4)?;
    let metadata: String = r.get(5)?;
    let state: String = r.get(6)?;
    let end: Option<String> = r.get(7)?;
    let u =
        |i: usize| -> rusqlite::Result<u64> { Ok(r.get::<_, Option<i64>>(i)?.unwrap_or(0) as u64) };
    let usage = UsageRecord {
        cpu_usec: u(18)?,
        memory_peak_bytes: u(19)?,
        exec_count: u(20)?,
        stdin_bytes: u(21)?,
        stdout_bytes: u(22)?,
        stderr_bytes: u(23)?,
        file_bytes_in: u(24)?,
        file_bytes_out: u(25)?,
    };
    let id: String = r.get(0)?;
    let parsed = (|| {
        Ok(SandboxRecord {
            spec: serde_json::from_str(&spec)
                .map_err(|e| corrupt("read sandbox", format!("{id}.spec: {e}")))?,
            tags: serde_json::from_str(&tags)
                .map_err(|e| corrupt("read sandbox", format!("{id}.tags: {e}")))?,
            metadata: serde_json::from_str(&metadata)
                .map_err(|e| corrupt("read sandbox", format!("{id}.metadata: {e}")))?,
            state: SandboxState::parse(&state)
                .ok_or_else(|| corrupt("read sandbox", format!("{id}.state {state:?}")))?,
            end_reason: match end {
                None => None,
                Some(e) => Some(
                    EndReason::parse(&e)
                        .ok_or_else(|| corrupt("read sandbox", format!("{id}.end_reason {e:?}")))?,
                ),
            },
            id: id.clone(),
            tenant: r.get(1).map_err(sql("read sandbox"))?,
            name: r.get(2).map_err(sql("read sandbox"))?,
            exit_code: r.get(8).map_err(sql("read sandbox"))?,
            exit_signal: r.get(9).map_err(sql("read sandbox"))?,
            error: r.get(10).map_err(sql("read sandbox"))?,
            pid: r.get(11).map_err(sql("read sandbox"))?,
            memory_bytes: r.get::<_, i64>(12).map_err(sql("read sandbox"))? as u64,
            created_at: r.get(13).map_err(sql("read sandbox"))?,
            started_at: r.get(14).map_err(sql("read sandbox"))?,
            ended_at: r.get(15).map_err(sql("read sandbox"))?,
            expires_at: r.get(16).map_err(sql("read sandbox"))?,
            idle_timeout_ms: r.get(17).map_err(sql("read sandbox"))?,
            usage,
            lifecycle: lifecycle_from_row(r, 26)
                .map_err(|e| corrupt("read sandbox", format!("{id}.lifecycle: {e}")))?,
            timeout_ms: r
                .get::<_, Option<i64>>(29)
                .map_err(sql("read sandbox"))?
                .unwrap_or_else(|| {
                    let created: i64 = r.get(13).unwrap_or(0);
                    let expires: i64 = r.get(16).unwrap_or(created);
                    (expires - created).max(0)
                }),
        })
    })();
    Ok(parsed)
}

/// The result of an admission attempt.
#[derive(Debug, PartialEq, Eq)]
pub enum Admission {
    Admitted,
    /// The tenant already has this many live sandboxes.
    TooManySandboxes(u32),
    /// Memory of the live sandboxes plus the new one would exceed the quota.
    TooMuchMemory {
        used: u64,
    },
    /// A live sandbox of the tenant already has this name.
    NameTaken,
}

impl Store {
    /// Opens (creating if needed) the database at `path`.
    pub fn open(path: &Path) -> Result<Store, StoreError> {
        let open_err = |source| StoreError::Open {
            path: path.display().to_string(),
            source,
        };
        let conn = Connection::open(path).map_err(open_err)?;
        let mut store = Store::init(conn).map_err(|e| match e {
            StoreError::Sql { source, .. } => open_err(source),
            e => e,
        })?;
        // Requests' commits no longer checkpoint; the checkpointer does.
        store
            .lock()
            .pragma_update(None, "wal_autocheckpoint", 0)
            .map_err(open_err)?;
        store._checkpointer = Some(Checkpointer::start(path)?);
        Ok(store)
    }

    /// An in-memory database (tests).
    pub fn in_memory() -> Result<Store, StoreError> {
        Store::init(Connection::open_in_memory().map_err(sql("open"))?)
    }

    fn init(conn: Connection) -> Result<Store, StoreError> {
        conn.busy_timeout(std::time::Duration::from_secs(5))
            .map_err(sql("set busy timeout"))?;
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(sql("enable WAL"))?;
        conn.pragma_update(None, "synchronous", "NORMAL")
            .map_err(sql("set synchronous"))?;
        conn.pragma_update(None, "foreign_keys", "ON")
            .map_err(sql("enable foreign keys"))?;
        conn.execute_batch(SCHEMA).map_err(sql("create schema"))?;
        add_token_kind(&conn)?;
        add_token_created_by(&conn)?;
        // The create, exec and delete paths keep their statements prepared (parsing
        // them was a third of the daemon's SQLite time per create).
        conn.set_prepared_statement_cache_capacity(64);
        Ok(Store {
            conn: Mutex::new(conn),
            _checkpointer: None,
        })
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, Connection> {
        self.conn.lock().unwrap_or_else(|e| e.into_inner())
    }

    // ---- sandboxes ----

    /// Inserts a new sandbox if the tenant's quota admits it, atomically with the
    /// quota check. The record is stored as given: `creating` for a sandbox the
    /// runtime has yet to start, or `running` (with its pid and start time, and the
    /// "started" event in the same commit) for a claimed pooled sandbox, whose
    /// processes already exist; that saves the claim a second commit
    /// ([`Store::mark_running`]).
    pub fn admit_sandbox(
        &self,
        rec: &SandboxRecord,
        max_sandboxes: u32,
        max_memory: u64,
    ) -> Result<Admission, StoreError> {
        let mut c = self.lock();
        let tx = c.transaction().map_err(sql("admit sandbox"))?;
        let (count, mem) = tenant_load(&tx, &rec.tenant)?;
        if count as u64 >= u64::from(max_sandboxes) {
            return Ok(Admission::TooManySandboxes(count as u32));
        }
        if (mem as u64).saturating_add(rec.memory_bytes) > max_memory {
            return Ok(Admission::TooMuchMemory { used: mem as u64 });
        }
        if let Some(n) = &rec.name {
            let taken: bool = tx
                .query_row(
                    "SELECT EXISTS (SELECT 1 FROM sandboxes WHERE tenant = ?1 AND name = ?2
                     AND state != 'stopped')",
                    params![rec.tenant, n],
                    |r| r.get(0),
                )
                .map_err(sql("admit sandbox"))?;
            if taken {
                return Ok(Admission::NameTaken);
            }
        }
        insert_sandbox(&tx, rec)?;
        tx.commit().map_err(sql("admit sandbox"))?;
        Ok(Admission::Admitted)
    }

    pub fn get_sandbox(&self, id: &str) -> Result<Option<SandboxRecord>, StoreError> {
        let c = self.lock();
        let q = format!("SELECT {SANDBOX_COLS} FROM {SANDBOX_FROM} WHERE s.id = ?1");
        let r = c
            .prepare_cached(&q)
            .and_then(|mut st| st.query_row([id], sandbox_from_row).optional())
            .map_err(sql("read sandbox"))?;
        r.transpose()
    }

    /// Sandboxes matching `f`, newest first.
    pub fn list_sandboxes(&self, f: &SandboxFilter) -> Result<Vec<SandboxRecord>, StoreError> {
        let c = self.lock();
        let states: Vec<&str> = if f.states.is_empty() {
            SandboxState::LIVE.iter().map(|s| s.as_str()).collect()
        } else {
            f.states.iter().map(|s| s.as_str()).collect()
        };
        let placeholders = (0..states.len())
            .map(|i| format!("?{}", i + 3))
            .collect::<Vec<_>>()
            .join(", ");
        let q = format!(
            "SELECT {SANDBOX_COLS} FROM {SANDBOX_FROM}
             WHERE (?1 IS NULL OR s.tenant = ?1) AND (?2 IS NULL OR s.name = ?2) AND s.state IN ({placeholders})
             ORDER BY s.created_at DESC, s.id"
        );
        let mut st = c.prepare(&q).map_err(sql("list sandboxes"))?;
        let mut args: Vec<&dyn rusqlite::ToSql> = vec![&f.tenant, &f.name];
        for s in &states {
            args.push(s);
        }
        let rows = st
            .query_map(args.as_slice(), sandbox_from_row)
            .map_err(sql("list sandboxes"))?;
        let mut out = Vec::new();
        for r in rows {
            let rec = r.map_err(sql("list sandboxes"))??;
            let tags_ok = f.tags.iter().all(|(k, v)| match (rec.tags.get(k), v) {
                (Some(have), Some(want)) => have == want,
                (Some(_), None) => true,
                (None, _) => false,
            });
            if tags_ok {
                out.push(rec);
                if f.limit > 0 && out.len() >= f.limit {
                    break;
                }
            }
        }
        Ok(out)
    }

    /// Records that the sandbox runs, with the host pid of its PID 1 (one commit).
    pub fn mark_running(&self, id: &str, pid: i32, at: i64) -> Result<(), StoreError> {
        let mut c = self.lock();
        let tx = c.transaction().map_err(sql("mark sandbox running"))?;
        tx.prepare_cached(
            "UPDATE sandboxes SET state = 'running', pid = ?2, started_at = ?3 WHERE id = ?1",
        )
        .and_then(|mut st| st.execute(params![id, pid, at]))
        .map_err(sql("mark sandbox running"))?;
        insert_event(&tx, id, at, "started", &format!("pid {pid}"))?;
        tx.commit().map_err(sql("mark sandbox running"))
    }

    pub fn mark_stopping(&self, id: &str, reason: EndReason) -> Result<(), StoreError> {
        let c = self.lock();
        c.prepare_cached(
            "UPDATE sandboxes SET state = 'stopping', end_reason = COALESCE(end_reason, ?2) WHERE id = ?1 AND state != 'stopped'",
        )
        .and_then(|mut st| st.execute(params![id, reason.as_str()]))
        .map_err(sql("mark sandbox stopping"))?;
        Ok(())
    }

    /// Final state. Keeps the first recorded reason.
    pub fn mark_stopped(
        &self,
        id: &str,
        reason: EndReason,
        exit: (Option<i32>, Option<i32>),
        error: Option<&str>,
        at: i64,
    ) -> Result<(), StoreError> {
        self.finish(id, None, reason, exit, error, at)
    }

    /// [`Store::mark_stopped`] with the final usage, in one commit.
    pub fn mark_stopped_with_usage(
        &self,
        id: &str,
        usage: &UsageRecord,
        reason: EndReason,
        exit: (Option<i32>, Option<i32>),
        at: i64,
    ) -> Result<(), StoreError> {
        self.finish(id, Some(usage), reason, exit, None, at)
    }

    fn finish(
        &self,
        id: &str,
        usage: Option<&UsageRecord>,
        reason: EndReason,
        exit: (Option<i32>, Option<i32>),
        error: Option<&str>,
        at: i64,
    ) -> Result<(), StoreError> {
        let mut c = self.lock();
        let tx = c.transaction().map_err(sql("mark sandbox stopped"))?;
        if let Some(u) = usage {
            update_usage(&tx, id, u)?;
        }
        tx.prepare_cached(
            "UPDATE sandboxes SET state = 'stopped', end_reason = COALESCE(end_reason, ?2), exit_code = ?3,
             exit_signal = ?4, error = COALESCE(error, ?5), ended_at = ?6 WHERE id = ?1",
        )
        .and_then(|mut st| st.execute(params![id, reason.as_str(), exit.0, exit.1, error, at]))
        .map_err(sql("mark sandbox stopped"))?;
        let msg = match error {
            Some(e) => format!("{}: {e}", reason.as_str()),
            None => reason.as_str().to_string(),
        };
        insert_event(&tx, id, at, "stopped", &msg)?;
        tx.execute("DELETE FROM pauses WHERE sandbox_id = ?1", [id])
            .map_err(sql("mark sandbox stopped"))?;
        tx.commit().map_err(sql("mark sandbox stopped"))
    }

    /// Records that the host clean-up after a stop failed (the record is already
    /// stopped; the error shows in the sandbox's view and events).
    pub fn record_teardown_error(&self, id: &str, error: &str) -> Result<(), StoreError> {
        let c = self.lock();
        c.execute(
            "UPDATE sandboxes SET error = COALESCE(error, ?2) WHERE id = ?1",
            params![id, error],
        )
        .map_err(sql("record teardown error"))?;
        c.execute(
            "INSERT INTO events (sandbox_id, at, kind, message) VALUES (?1, ?2, 'teardown_failed', ?3)",
            params![id, now_ms(), error],
        )
        .map_err(sql("insert event"))?;
        Ok(())
    }

    pub fn set_expiry(&self, id: &str, expires_at: i64) -> Result<(), StoreError> {
        let c = self.lock();
        c.execute(
            "UPDATE sandboxes SET expires_at = ?2 WHERE id = ?1",
            params![id, expires_at],
        )
        .map_err(sql("set expiry"))?;
        c.execute(
            "INSERT INTO events (sandbox_id, at, kind, message) VALUES (?1, ?2, 'timeout_set', ?3)",
            params![id, now_ms(), format!("expires at {expires_at}")],
        )
        .map_err(sql("insert event"))?;
        Ok(())
    }

    /// Overwrites the usage counters (they only grow; the caller holds totals).
    /// Deletes the records (with their usage, events and idempotency keys) of
    /// sandboxes that stopped before `ended_before` (ms since the epoch); returns how
    /// many went. Live sandboxes are never touched.
    pub fn prune_stopped(&self, ended_before: i64) -> Result<usize, StoreError> {
        let mut c = self.lock();
        let tx = c.transaction().map_err(sql("prune stopped sandboxes"))?;
        let old = "SELECT id FROM sandboxes WHERE state = 'stopped' AND ended_at < ?1";
        for table in ["usage", "events", "lifecycles"] {
            tx.execute(
                &format!("DELETE FROM {table} WHERE sandbox_id IN ({old})"),
                [ended_before],
            )
            .map_err(sql("prune stopped sandboxes"))?;
        }
        tx.execute(
            &format!("DELETE FROM idempotency_keys WHERE sandbox_id IN ({old})"),
            [ended_before],
        )
        .map_err(sql("prune stopped sandboxes"))?;
        let n = tx
            .execute(
                "DELETE FROM sandboxes WHERE state = 'stopped' AND ended_at < ?1",
                [ended_before],
            )
            .map_err(sql("prune stopped sandboxes"))?;
        tx.commit().map_err(sql("prune stopped sandboxes"))?;
        Ok(n)
    }

    pub fn save_usage(&self, id: &str, u: &UsageRecord) -> Result<(), StoreError> {
        update_usage(&self.lock(), id, u)
    }

    pub fn add_event(&self, id: &str, kind: &str, message: &str) -> Result<(), StoreError> {
        insert_event(&self.lock(), id, now_ms(), kind, message)
    }

    pub fn events(
        &self,
        id: &str,
        after: i64,
        limit: usize,
    ) -> Result<Vec<EventRecord>, StoreError> {
        let c = self.lock();
        let mut st = c
            .prepare("SELECT seq, sandbox_id, at, kind, message FROM events WHERE sandbox_id = ?1 AND seq > ?2 ORDER BY seq LIMIT ?3")
            .map_err(sql("list events"))?;
        let rows = st
            .query_map(params![id, after, limit as i64], |r| {
                Ok(EventRecord {
                    seq: r.get(0)?,
                    sandbox_id: r.get(1)?,
                    at: r.get(2)?,
                    kind: r.get(3)?,
                    message: r.get(4)?,
                })
            })
            .map_err(sql("list events"))?;
        rows.collect::<Result<_, _>>().map_err(sql("list events"))
    }

    // ---- idempotency keys of creates ----

    /// Takes `key` of `tenant` for a create whose request hashes to `hash`, unless
    /// a create already took it. Keys older than [`IDEMPOTENCY_TTL_MS`] are
    /// forgotten first.
    pub fn reserve_idempotency_key(
        &self,
        tenant: &str,
        key: &str,
        hash: &str,
        now: i64,
    ) -> Result<KeyReservation, StoreError> {
        let mut c = self.lock();
        let tx = c.transaction().map_err(sql("reserve idempotency key"))?;
        tx.execute(
            "DELETE FROM idempotency_keys WHERE created_at < ?1",
            [now - IDEMPOTENCY_TTL_MS],
        )
        .map_err(sql("expire idempotency keys"))?;
        let found = tx
            .query_row(
                "SELECT request_hash, sandbox_id FROM idempotency_keys WHERE tenant = ?1 AND key = ?2",
                params![tenant, key],
                |r| Ok((r.get::<_, String>(0)?, r.get::<_, Option<String>>(1)?)),
            )
            .optional()
            .map_err(sql("reserve idempotency key"))?;
        if let Some((request_hash, sandbox_id)) = found {
            return Ok(KeyReservation::Taken {
                request_hash,
                sandbox_id,
            });
        }
        tx.execute(
            "INSERT INTO idempotency_keys (tenant, key, request_hash, created_at) VALUES (?1, ?2, ?3, ?4)",
            params![tenant, key, hash, now],
        )
        .map_err(sql("reserve idempotency key"))?;
        tx.commit().map_err(sql("reserve idempotency key"))?;
        Ok(KeyReservation::Reserved)
    }

    /// Records the sandbox a reserved key's create made.
    pub fn bind_idempotency_key(
        &self,
        tenant: &str,
        key: &str,
        id: &str,
    ) -> Result<(), StoreError> {
        self.lock()
            .execute(
                "UPDATE idempotency_keys SET sandbox_id = ?3 WHERE tenant = ?1 AND key = ?2",
                params![tenant, key, id],
            )
            .map_err(sql("bind idempotency key"))?;
        Ok(())
    }

    /// Forgets a key (its create failed: a retry tries again).
    pub fn release_idempotency_key(&self, tenant: &str, key: &str) -> Result<(), StoreError> {
        self.lock()
            .execute(
                "DELETE FROM idempotency_keys WHERE tenant = ?1 AND key = ?2",
                params![tenant, key],
            )
            .map_err(sql("release idempotency key"))?;
        Ok(())
    }

    /// Forgets keys whose create never finished (on start: no create is running).
    pub fn release_unbound_idempotency_keys(&self) -> Result<usize, StoreError> {
        self.lock()
            .execute("DELETE FROM idempotency_keys WHERE sandbox_id IS NULL", [])
            .map_err(sql("release unbound idempotency keys"))
    }

    /// Sandboxes not yet stopped (for reconciliation on start).
    pub fn unfinished(&self) -> Result<Vec<SandboxRecord>, StoreError> {
        self.list_sandboxes(&SandboxFilter::default())
    }
}

fn map_json(m: &BTreeMap<String, String>) -> String {
    serde_json::to_string(m).expect("string maps serialize")
}

/// Raises the recorded usage of `id` to `u` (counters never go down).
fn update_usage(c: &Connection, id: &str, u: &UsageRecord) -> Result<(), StoreError> {
    c.prepare_cached(
        "UPDATE usage SET cpu_usec = MAX(cpu_usec, ?2), memory_peak_bytes = MAX(memory_peak_bytes, ?3),
         exec_count = MAX(exec_count, ?4), stdin_bytes = MAX(stdin_bytes, ?5), stdout_bytes = MAX(stdout_bytes, ?6),
         stderr_bytes = MAX(stderr_bytes, ?7), file_bytes_in = MAX(file_bytes_in, ?8),
         file_bytes_out = MAX(file_bytes_out, ?9) WHERE sandbox_id = ?1",
    )
    .and_then(|mut st| {
        st.execute(params![
            id,
            u.cpu_usec as i64,
            u.memory_peak_bytes as i64,
            u.exec_count as i64,
            u.stdin_bytes as i64,
            u.stdout_bytes as i64,
            u.stderr_bytes as i64,
            u.file_bytes_in as i64,
            u.file_bytes_out as i64
        ])
    })
    .map_err(sql("save usage"))?;
    Ok(())
}

/// How many sandboxes `tenant` has (paused ones included) and the memory of its
/// live ones (a paused sandbox holds none).
fn tenant_load(c: &Connection, tenant: &str) -> Result<(i64, i64), StoreError> {
    let (count, mem): (i64, i64) = c
        .prepare_cached(
            // IN over the states holding memory: a seek of the (tenant, state)
            // index each, however many stopped records the tenant has.
            "SELECT COUNT(*), COALESCE(SUM(memory_bytes), 0) FROM sandboxes
             WHERE tenant = ?1 AND state IN ('creating', 'running', 'pausing', 'resuming', 'stopping')",
        )
        .and_then(|mut st| st.query_row([tenant], |r| Ok((r.get(0)?, r.get(1)?))))
        .map_err(sql("admit sandbox"))?;
    let paused: i64 = c
        .prepare_cached("SELECT COUNT(*) FROM sandboxes WHERE tenant = ?1 AND state = 'paused'")
        .and_then(|mut st| st.query_row([tenant], |r| r.get(0)))
        .map_err(sql("admit sandbox"))?;
    Ok((count + paused, mem))
}

/// Inserts sandbox `rec` with its usage row and events (within an admission).
fn insert_sandbox(c: &Connection, rec: &SandboxRecord) -> Result<(), StoreError> {
    c.prepare_cached(
        "INSERT INTO sandboxes (id, tenant, name, spec, tags, metadata, state, memory_bytes, created_at, expires_at, idle_timeout_ms, pid, started_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)",
    )
    .and_then(|mut st| {
        st.execute(params![
            rec.id,
            rec.tenant,
            rec.name,
            rec.spec.to_string(),
            map_json(&rec.tags),
            map_json(&rec.metadata),
            rec.state.as_str(),
            rec.memory_bytes as i64,
            rec.created_at,
            rec.expires_at,
            rec.idle_timeout_ms,
            rec.pid,
            rec.started_at
        ])
    })
    .map_err(sql("insert sandbox"))?;
    c.prepare_cached("INSERT INTO usage (sandbox_id) VALUES (?1)")
        .and_then(|mut st| st.execute([&rec.id]))
        .map_err(sql("insert usage"))?;
    insert_lifecycle(c, rec)?;
    insert_event(c, &rec.id, rec.created_at, "created", "")?;
    if let (SandboxState::Running, Some(pid)) = (rec.state, rec.pid) {
        let at = rec.started_at.unwrap_or(rec.created_at);
        insert_event(c, &rec.id, at, "started", &format!("pid {pid}"))?;
    }
    Ok(())
}

fn insert_event(
    c: &Connection,
    id: &str,
    at: i64,
    kind: &str,
    message: &str,
) -> Result<(), StoreError> {
    c.prepare_cached("INSERT INTO events (sandbox_id, at, kind, message) VALUES (?1, ?2, ?3, ?4)")
        .and_then(|mut st| st.execute(params![id, at, kind, message]))
        .map_err(sql("insert event"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(id: &str, tenant: &str, mem: u64) -> SandboxRecord {
        SandboxRecord {
            id: id.into(),
            tenant: tenant.into(),
            name: None,
            spec: serde_json::json!({"image": "host"}),
            tags: BTreeMap::from([("user".to_string(), "u1".to_string())]),
            metadata: BTreeMap::new(),
            state: SandboxState::Creating,
            end_reason: None,
            exit_code: None,
            exit_signal: None,
            error: None,
            pid: None,
            memory_bytes: mem,
            created_at: now_ms(),
            started_at: None,
            ended_at: None,
            expires_at: now_ms() + 1000,
            idle_timeout_ms: None,
            usage: UsageRecord::default(),
            lifecycle: Default::default(),
            timeout_ms: 1_000,
        }
    }

    #[test]
    fn tenant_loads_count_live_and_paused_sandboxes_and_live_memory_only() {
        let s = Store::in_memory().unwrap();
        let mut running = rec("r1", "acme", 100);
        running.state = SandboxState::Running;
        let mut paused = rec("p1", "acme", 40);
        paused.state = SandboxState::Paused;
        let mut stopped = rec("s1", "old", 7);
        stopped.state = SandboxState::Stopped;
        for r in [&running, &paused, &stopped, &rec("c1", "acme", 1)] {
            assert_eq!(s.admit_sandbox(r, 10, 1000).unwrap(), Admission::Admitted);
        }
        let loads = s.tenant_loads().unwrap();
        assert_eq!(loads["acme"].live, 2);
        assert_eq!(loads["acme"].paused, 1);
        assert_eq!(loads["acme"].memory_bytes, 101);
        // A tenant whose sandboxes all ended is still listed, with nothing live.
        assert_eq!(loads["old"], TenantLoad::default());
    }

    /// A checkpoint (an `fsync` of the database file) ran inside whichever
    /// request's commit filled the write-ahead log. The daemon's connection no
    /// longer checkpoints; a thread with its own connection does.
    #[test]
    fn wal_checkpoints_run_on_their_own_thread() {
        let dir = std::env::temp_dir().join(format!("sandlot-store-ckpt-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("db.sqlite");
        let s = Store::open(&path).unwrap();
        let auto: i64 = s
            .lock()
            .query_row("PRAGMA wal_autocheckpoint", [], |r| r.get(0))
            .unwrap();
        assert_eq!(auto, 0, "the daemon's connection does not checkpoint");
        let db_len = || std::fs::metadata(&path).unwrap().len();
        let before = db_len();
        for i in 0..400 {
            s.admit_sandbox(&rec(&format!("sb{i:04}"), "t", 1), 10_000, u64::MAX)
                .unwrap();
        }
        // The records reach the database file without a checkpoint by the daemon's
        // connection (about 400 records of a few hundred bytes each).
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while db_len() < before + 64 * 1024 {
            assert!(
                std::time::Instant::now() < deadline,
                "nothing checkpointed the log: the database file is {} bytes",
                db_len()
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        drop(s);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn quotas_are_checked_atomically_with_insert() {
        let s = Store::in_memory().unwrap();
        assert_eq!(
            s.admit_sandbox(&rec("a", "t", 100), 2, 250).unwrap(),
            Admission::Admitted
        );
        assert_eq!(
            s.admit_sandbox(&rec("b", "t", 100), 2, 250).unwrap(),
            Admission::Admitted
        );
        assert_eq!(
            s.admit_sandbox(&rec("c", "t", 10), 2, 250).unwrap(),
            Admission::TooManySandboxes(2)
        );
        assert_eq!(
            s.admit_sandbox(&rec("c", "t", 100), 3, 250).unwrap(),
            Admission::TooMuchMemory { used: 200 }
        );
        // Another tenant has its own budget.
        assert_eq!(
            s.admit_sandbox(&rec("d", "u", 100), 2, 250).unwrap(),
            Admission::Admitted
        );
        // Stopped sandboxes do not count.
        s.mark_stopped("a", EndReason::Deleted, (None, None), None, now_ms())
            .unwrap();
        assert_eq!(
            s.admit_sandbox(&rec("c", "t", 100), 2, 250).unwrap(),
            Admission::Admitted
        );
    }

    #[test]
    fn lifecycle_and_filters() {
        let s = Store::in_memory().unwrap();
        let mut r = rec("a", "t", 1);
        r.name = Some("web".into());
        s.admit_sandbox(&r, 10, 100).unwrap();
        let mut r2 = rec("b", "t", 1);
        r2.name = Some("web".into());
        assert_eq!(s.admit_sandbox(&r2, 10, 100).unwrap(), Admission::NameTaken);
        s.mark_running("a", 42, now_ms()).unwrap();
        let got = s.get_sandbox("a").unwrap().unwrap();
        assert_eq!(got.state, SandboxState::Running);
        assert_eq!(got.pid, Some(42));
        let f = |tenant: Option<&str>,
                 tags: Vec<(&str, Option<&str>)>,
                 states: Vec<SandboxState>| SandboxFilter {
            tenant: tenant.map(String::from),
            states,
            tags: tags
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.map(String::from)))
                .collect(),
            name: None,
            limit: 0,
        };
        assert_eq!(
            s.list_sandboxes(&f(Some("t"), vec![], vec![]))
                .unwrap()
                .len(),
            1
        );
        assert_eq!(
            s.list_sandboxes(&f(Some("x"), vec![], vec![]))
                .unwrap()
                .len(),
            0
        );
        assert_eq!(
            s.list_sandboxes(&f(None, vec![("user", Some("u1"))], vec![]))
                .unwrap()
                .len(),
            1
        );
        assert_eq!(
            s.list_sandboxes(&f(None, vec![("user", Some("u2"))], vec![]))
                .unwrap()
                .len(),
            0
        );
        assert_eq!(
            s.list_sandboxes(&f(None, vec![("user", None)], vec![]))
                .unwrap()
                .len(),
            1
        );
        s.save_usage(
            "a",
            &UsageRecord {
                cpu_usec: 5,
                stdout_bytes: 7,
                ..Default::default()
            },
        )
        .unwrap();
        s.mark_stopping("a", EndReason::Timeout).unwrap();
        // The final usage and the stopped record go in together; counters never
        // go down (stdout_bytes stays 7).
        s.mark_stopped_with_usage(
            "a",
            &UsageRecord {
                cpu_usec: 9,
                stdout_bytes: 3,
                ..Default::default()
            },
            EndReason::Deleted,
            (Some(0), None),
            now_ms(),
        )
        .unwrap();
        let got = s.get_sandbox("a").unwrap().unwrap();
        assert_eq!(got.state, SandboxState::Stopped);
        assert_eq!(got.exit_code, Some(0));
        // The first reason wins.
        assert_eq!(got.end_reason, Some(EndReason::Timeout));
        assert_eq!(got.usage.cpu_usec, 9);
        assert_eq!(got.usage.stdout_bytes, 7);
        assert!(s
            .list_sandboxes(&f(Some("t"), vec![], vec![]))
            .unwrap()
            .is_empty());
        assert_eq!(
            s.list_sandboxes(&f(Some("t"), vec![], vec![SandboxState::Stopped]))
                .unwrap()
                .len(),
            1
        );
        let ev = s.events("a", 0, 100).unwrap();
        let kinds: Vec<&str> = ev.iter().map(|e| e.kind.as_str()).collect();
        assert_eq!(kinds, ["created", "started", "stopped"]);
        // The name is free again once stopped.
        assert_eq!(s.admit_sandbox(&r2, 10, 100).unwrap(), Admission::Admitted);
    }

    #[test]
    fn a_claimed_sandbox_is_admitted_running_in_one_commit() {
        let s = Store::in_memory().unwrap();
        let mut r = rec("warm", "t", 100);
        r.state = SandboxState::Running;
        r.pid = Some(4242);
        r.started_at = Some(r.created_at + 1);
        assert_eq!(s.admit_sandbox(&r, 10, 1000).unwrap(), Admission::Admitted);
        let got = s.get_sandbox("warm").unwrap().unwrap();
        assert_eq!(got.state, SandboxState::Running);
        assert_eq!(got.pid, Some(4242));
        assert_eq!(got.started_at, Some(r.created_at + 1));
        let ev = s.events("warm", 0, 100).unwrap();
        let got: Vec<(&str, &str, i64)> = ev
            .iter()
            .map(|e| (e.kind.as_str(), e.message.as_str(), e.at))
            .collect();
        assert_eq!(
            got,
            [
                ("created", "", r.created_at),
                ("started", "pid 4242", r.created_at + 1)
            ]
        );
        // It counts against the quota like any live sandbox.
        assert_eq!(
            s.admit_sandbox(&rec("next", "t", 950), 10, 1000).unwrap(),
            Admission::TooMuchMemory { used: 100 }
        );
        // A sandbox the runtime has yet to start is admitted as creating, no pid.
        assert_eq!(
            s.admit_sandbox(&rec("cold", "t", 1), 10, 1000).unwrap(),
            Admission::Admitted
        );
        let cold = s.get_sandbox("cold").unwrap().unwrap();
        assert_eq!(
            (cold.state, cold.pid, cold.started_at),
            (SandboxState::Creating, None, None)
        );
        let kinds: Vec<String> = s
            .events("cold", 0, 10)
            .unwrap()
            .into_iter()
            .map(|e| e.kind)
            .collect();
        assert_eq!(kinds, ["created"]);
    }

    #[test]
    fn stopped_records_are_pruned_after_retention_and_live_ones_never() {
        let s = Store::in_memory().unwrap();
        for id in ["old", "new", "live"] {
            assert_eq!(
                s.admit_sandbox(&rec(id, "t", 1), 10, 100).unwrap(),
                Admission::Admitted
            );
            s.mark_running(id, 1, 1).unwrap();
        }
        s.mark_stopped("old", EndReason::Deleted, (Some(0), None), None, 1_000)
            .unwrap();
        s.mark_stopped("new", EndReason::Deleted, (Some(0), None), None, 5_000)
            .unwrap();
        assert_eq!(s.prune_stopped(2_000).unwrap(), 1);
        assert!(s.get_sandbox("old").unwrap().is_none());
        assert!(s.events("old", 0, 100).unwrap().is_empty());
        assert!(s.get_sandbox("new").unwrap().is_some());
        assert!(!s.events("new", 0, 100).unwrap().is_empty());
        // A live sandbox stays whatever the cutoff.
        assert_eq!(s.prune_stopped(i64::MAX).unwrap(), 1);
        assert!(s.get_sandbox("live").unwrap().is_some());
        let leftover: i64 = s
            .lock()
            .query_row(
                "SELECT COUNT(*) FROM usage WHERE sandbox_id != 'live'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(leftover, 0);
    }
}
