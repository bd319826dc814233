//! Virtual shell sessions: bash-compatible command lines answered from a
//! collection view in-process, without a container.

mod cmd_copy;
mod cmd_files;
mod cmd_sort;
mod cmd_text;
mod cmd_write;
mod exec;
mod find;
mod getopt;
mod grep;
mod overlay;
mod parse;
mod regex_posix;
mod rg;
mod vpath;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::acl::Principal;
use crate::audit::{now_ms, AuditError, AuditRecord, AuditSink};
use crate::manifest::{NodeId, ROOT};
use crate::store::View;

pub use overlay::{ScratchLimits, ScratchUsage};
pub use parse::SyntaxError;

pub(crate) use cmd_files::civil_from_days;

/// Per-session limits.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// Bytes of stdout plus stderr returned per command line; the rest is cut.
    pub max_output_bytes: usize,
    /// Command lines a session may run.
    pub max_commands: u64,
    /// Wall-clock budget per command line.
    pub max_run_time: Duration,
    /// Bytes one pipe between two commands may hold.
    pub max_pipe_bytes: usize,
    /// Simple commands (including loop iterations) per command line.
    pub max_steps: u64,
    /// Longest accepted command line, in bytes.
    pub max_command_line: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_output_bytes: 1 << 20,
            max_commands: 10_000,
            max_run_time: Duration::from_secs(10),
            max_pipe_bytes: 64 << 20,
            max_steps: 100_000,
            max_command_line: 64 << 10,
        }
    }
}

/// The result of one command line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Output {
    /// Standard output bytes.
    pub stdout: Vec<u8>,
    /// Standard error bytes.
    pub stderr: Vec<u8>,
    /// Exit status, as bash would report it (124 on timeout, 141 when output was cut).
    pub exit_code: i32,
    /// Whether output was cut at [`Limits::max_output_bytes`].
    pub truncated: bool,
    /// Wall time.
    pub duration: Duration,
}

/// Errors that end a `run` call without running the command line.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// The session has run its allowed number of command lines.
    #[error("session {session}: command limit of {limit} reached")]
    CommandLimit { session: String, limit: u64 },
    /// The command line is longer than allowed.
    #[error("session {session}: command line of {len} bytes exceeds the limit of {limit}")]
    CommandTooLong {
        session: String,
        len: usize,
        limit: usize,
    },
    /// The audit record could not be written; the output is withheld.
    #[error("session {session}")]
    Audit {
        session: String,
        #[source]
        source: AuditError,
    },
}

/// Mutable shell state carried between command lines of a session.
#[derive(Debug, Clone)]
pub(crate) struct ShellState {
    pub cwd: NodeId,
    pub pwd: String,
    pub oldpwd: Option<String>,
    pub vars: std::collections::BTreeMap<String, String>,
    pub last_status: i32,
}

/// A shell session over one principal's view of a collection version.
/// `Send + Sync`; one command line runs at a time (`&mut self`).
pub struct Session {
    id: String,
    view: Arc<View>,
    principal: Principal,
    limits: Limits,
    audit: Arc<dyn AuditSink>,
    state: ShellState,
    commands: u64,
    /// The copy-on-write scratch area, if the session has one.
    scratch: Option<overlay::Scratch>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("id", &self.id)
            .field("collection", &self.view.collection())
            .field("principal", &self.principal.name)
            .finish()
    }
}

fn new_session_id() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let seed = format!(
        "{}:{}:{:?}",
        std::process::id(),
        n,
        std::time::SystemTime::now()
    );
    blake3::hash(seed.as_bytes()).to_hex()[..16].to_string()
}

impl Session {
    pub(crate) fn new(
        view: Arc<View>,
        principal: Principal,
        limits: Limits,
        audit: Arc<dyn AuditSink>,
    ) -> Session {
        let mut vars = std::collections::BTreeMap::new();
        vars.insert("HOME".to_string(), "/".to_string());
        vars.insert("PWD".to_string(), "/".to_string());
        vars.insert("USER".to_string(), principal.name.clone());
        vars.insert("SHELL".to_string(), "/bin/bash".to_string());
        Session {
            id: new_session_id(),
            view,
            principal,
            limits,
            audit,
            state: ShellState {
                cwd: ROOT,
                pwd: "/".into(),
                oldpwd: None,
                vars,
                last_status: 0,
            },
            commands: 0,
            scratch: None,
        }
    }

    /// Give the session a copy-on-write scratch area: writes (`>`, `mkdir`,
    /// `rm`, `cp`, `mv`, `tee`, ...) then change a private, in-memory overlay of
    /// its tree instead of failing with "Read-only file system". Nothing ever
    /// changes the collection or other sessions; the overlay is freed with the
    /// session. Replaces any scratch area the session had.
    pub fn with_scratch(mut self, limits: ScratchLimits) -> Session {
        self.scratch = Some(overlay::Scratch::new(self.view.tree().len(), limits));
        self
    }

    /// What the scratch area holds (None without one).
    pub fn scratch_usage(&self) -> Option<ScratchUsage> {
        self.scratch.as_ref().map(|s| s.usage())
    }

    /// Session id (recorded in the audit log).
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The principal the session runs as.
    pub fn principal(&self) -> &Principal {
        &self.principal
    }

    /// The view the session browses.
    pub fn view(&self) -> &Arc<View> {
        &self.view
    }

    /// Current working directory.
    pub fn cwd(&self) -> &str {
        &self.state.pwd
    }

    /// Limits in force.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Command lines run so far.
    pub fn commands_run(&self) -> u64 {
        self.commands
    }

    /// Run one command line (bash syntax) and audit it.
    pub fn run(&mut self, command_line: &str) -> Result<Output, SessionError> {
        if self.commands >= self.limits.max_commands {
            return Err(SessionError::CommandLimit {
                session: self.id.clone(),
                limit: self.limits.max_commands,
            });
        }
        if command_line.len() > self.limits.max_command_line {
            return Err(SessionError::CommandTooLong {
                session: self.id.clone(),
                len: command_line.len(),
                limit: self.limits.max_command_line,
            });
        }
        self.commands += 1;
        let start = Instant::now();
        let mut out = exec::run_line(
            &self.view,
            self.scratch.as_mut(),
            &mut self.state,
            &self.limits,
            command_line,
            start,
        );
        out.duration = start.elapsed();
        let rec = AuditRecord {
            ts_ms: now_ms(),
            collection: self.view.collection().to_string(),
            version: self.view.version(),
            session: self.id.clone(),
            principal: self.principal.name.clone(),
            command: command_line.to_string(),
            exit_code: out.exit_code,
            stdout_bytes: out.stdout.len() as u64,
            stderr_bytes: out.stderr.len() as u64,
            truncated: out.truncated,
            duration_us: out.duration.as_micros() as u64,
        };
        self.audit
            .record(&rec)
            .map_err(|source| SessionError::Audit {
                session: self.id.clone(),
                source,
            })?;
        Ok(out)
    }
}
