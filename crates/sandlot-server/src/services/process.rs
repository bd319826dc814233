//! The processes of a sandbox.
//!
//! * Starting one: the request checked and turned into the agent's, the process
//!   started through the agent and handed to its supervisor (`process.rs`), which
//!   keeps its output for readers; counted in the sandbox's and the daemon's exec
//!   counters. Callers: the native exec routes (JSON, NDJSON and WebSocket),
//!   E2B's `process.Process/Start`, image build steps and E2B template start and
//!   ready commands.
//! * Listing them (the daemon's and the agent's others), signals, terminal
//!   resizes, stdin writes (counted) and closes: the native process routes and
//!   E2B's `process.Process` methods, which only find the process and shape the
//!   answer.
//! * Reading one's output from any offset (`open_output`): from its supervisor,
//!   from the agent, or from what the daemon kept after its exit was delivered.

use std::fmt::Display;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use sandlot_guest::client::{AttachRequest, ExecRequest, Process, ProcessId, ProcessInfo, PtySize};
use sandlot_proto::api::{ExecBody, StreamEvent};
use sandlot_proto::units::Seconds;
use serde_json::Value;
use tokio::sync::mpsc;

use super::parse_duration;
use crate::error::{ApiError, ApiResult, ErrorCode};
use crate::process::{convert_attached, keep_output_of, supervise, OutEvent, ProcEntry};
use crate::sandbox::SandboxHandle;
use crate::state::AppState;

/// The agent's request for `b`; a bad field is a 400 naming it.
fn guest_request(b: &ExecBody) -> ApiResult<ExecRequest> {
    let timeout = match &b.timeout {
        None | Some(Value::Null) => None,
        Some(v) => Some(Seconds(parse_duration("timeout", v)?)),
    };
    let req = ExecRequest {
        argv: b.argv.clone(),
        env: b.env.clone(),
        cwd: b.cwd.clone(),
        user: b.user.clone(),
        pty: b.pty.map(|p| PtySize {
            rows: p.rows,
            cols: p.cols,
        }),
        timeout,
        stdin: b.stdin,
        // Background output never waits for a reader; with stdin the daemon keeps
        // the channel (stdin lives on it) and drains.
        detached: b.background && !b.stdin,
        tag: b.tag.clone(),
    };
    req.validate().map_err(|m| match m.split_once(": ") {
        Some((f, problem)) if !f.contains(' ') => ApiError::invalid(f, problem),
        _ => ApiError::bad_request(m),
    })?;
    Ok(req)
}

/// Starts a process through the agent and its supervisor.
pub async fn start(
    state: &Arc<AppState>,
    h: &Arc<SandboxHandle>,
    b: &ExecBody,
) -> ApiResult<Arc<ProcEntry>> {
    let req = guest_request(b)?;
    h.touch();
    let p = h.guest.exec(req).await.map_err(|e| {
        use sandlot_guest::client::ErrorCode as C;
        match e.code() {
            // The command itself could not be run: the caller's problem (400), not a
            // missing API resource.
            Some(C::NotFound | C::PermissionDenied | C::SpawnFailed) => {
                ApiError::of(ErrorCode::SpawnFailed, e.to_string())
            }
            _ => ApiError::from_guest(
                e,
                &format!("exec {:?}", b.argv.first().cloned().unwrap_or_default()),
            ),
        }
    })?;
    h.counters.exec.fetch_add(1, Ordering::Relaxed);
    state.metrics.exec_total.fetch_add(1, Ordering::Relaxed);
    let span = tracing::info_span!(parent: &h.span, "process", process = p.id().0);
    span.in_scope(|| tracing::debug!(argv = ?b.argv, "process started"));
    Ok(supervise(
        &h.procs,
        p,
        b.argv.clone(),
        b.tag.clone(),
        b.background,
        h.counters.clone(),
        state.supervisor_settings(),
        span,
        h.exit_poll.clone(),
    ))
}

/// The processes of a sandbox: those started through this daemon (newest
/// last) and the agent's others (started before a restart of the daemon), with
/// what the agent says of the daemon's.
pub struct Listing {
    pub known: Vec<Arc<ProcEntry>>,
    pub agent: Vec<ProcessInfo>,
}

impl Listing {
    /// The agent's processes this daemon did not start.
    pub fn others(&self) -> impl Iterator<Item = &ProcessInfo> {
        self.agent
            .iter()
            .filter(|i| !self.known.iter().any(|e| e.id == i.id.0))
    }

    /// Whether process `e` runs: the agent's view wins for one whose exit the
    /// daemon has not learnt yet.
    pub fn running(&self, e: &ProcEntry) -> bool {
        e.exit().is_none()
            && !self
                .agent
                .iter()
                .any(|i| i.id.0 == e.id && i.exit.is_some())
    }
}

/// Every process of sandbox `h`.
pub async fn list(h: &SandboxHandle) -> ApiResult<Listing> {
    let known = h.procs.lock().unwrap_or_else(|e| e.into_inner()).all();
    let agent = h
        .guest
        .list_processes()
        .await
        .map_err(|e| ApiError::from_guest(e, "list processes"))?;
    Ok(Listing { known, agent })
}

/// Sends signal `sig` to process `id` (the agent's id) of sandbox `h`; errors
/// name the process as `shown` (the caller's name for it).
pub async fn signal(h: &SandboxHandle, id: u64, shown: impl Display, sig: i32) -> ApiResult<()> {
    h.touch();
    h.guest
        .signal(ProcessId(id), sig)
        .await
        .map_err(|e| ApiError::from_guest(e, &format!("process {shown}")))
}

/// Resizes the terminal of process `id` of sandbox `h`.
pub async fn resize(
    h: &SandboxHandle,
    id: u64,
    shown: impl Display,
    rows: u16,
    cols: u16,
) -> ApiResult<()> {
    if rows == 0 || cols == 0 {
        return Err(ApiError::invalid("rows", "rows and cols must be positive"));
    }
    h.touch();
    h.guest
        .resize(ProcessId(id), rows, cols)
        .await
        .map_err(|e| ApiError::from_guest(e, &format!("process {shown}")))
}

/// Writes `data` to the stdin of process `e` of sandbox `h`; 409 when its stdin
/// is closed or was never asked for.
pub async fn write_stdin(h: &SandboxHandle, e: &ProcEntry, data: &[u8]) -> ApiResult<()> {
    let mut g = e.stdin.lock().await;
    let s = g.as_mut().ok_or_else(|| {
        ApiError::conflict(format!(
            "stdin of process {} (pid {}) is closed (or it was started without stdin)",
            e.id, e.pid
        ))
    })?;
    s.write(data).await.map_err(|err| {
        ApiError::from_guest(err, &format!("stdin of process {} (pid {})", e.id, e.pid))
    })?;
    h.counters
        .stdin
        .fetch_add(data.len() as u64, Ordering::Relaxed);
    Ok(())
}

/// Closes the stdin of process `e` (nothing if it is closed already).
pub async fn close_stdin(h: &SandboxHandle, e: &ProcEntry) {
    h.touch();
    if let Some(mut s) = e.stdin.lock().await.take() {
        s.close();
    }
    e.mark_stdin_closed();
}

/// A process not started through this daemon: its stdin is not reachable.
pub fn stdin_unreachable(pid: i32) -> ApiError {
    ApiError::conflict(format!(
        "process {pid} was not started through this daemon: its stdin is not reachable"
    ))
}

/// Output events buffered between a supervisor and a reader.
pub const READER_CAPACITY: usize = 8;

/// Where a reader's output comes from.
pub enum Source {
    /// The process's supervisor (from offset 0, lossless).
    Sup(mpsc::Receiver<OutEvent>),
    /// The reader's own agent channel (any offset within what is retained), and the
    /// daemon's record of the process (to record an exit seen here).
    Attached(
        Box<Process>,
        Option<std::sync::Arc<crate::process::ProcEntry>>,
    ),
}

impl Source {
    pub async fn next(&mut self) -> Result<Option<OutEvent>, ApiError> {
        match self {
            Source::Sup(rx) => Ok(rx.recv().await),
            Source::Attached(p, entry) => match p.next_event().await {
                Ok(Some(ev)) => {
                    let ev = convert_attached(p, ev);
                    if let (OutEvent::Exit(x), Some(e)) = (&ev, entry) {
                        e.set_exit(*x);
                    }
                    Ok(Some(ev))
                }
                Ok(None) => Ok(None),
                Err(e) => Err(ApiError::from_guest(e, &format!("process {}", p.id()))),
            },
        }
    }
}

/// Opens a reader of process `pid` from the given offsets.
pub async fn open_output(
    h: &Arc<SandboxHandle>,
    pid: u64,
    from: (u64, u64),
) -> ApiResult<(StreamEvent, Source)> {
    let entry = h.procs.lock().unwrap_or_else(|e| e.into_inner()).get(pid);
    if let Some(e) = &entry {
        if from == (0, 0) {
            if let Some(rx) = e.subscribe_from_start(READER_CAPACITY).await {
                return Ok((
                    StreamEvent::Attached {
                        id: pid,
                        stdout_from: 0,
                        stderr_from: 0,
                    },
                    Source::Sup(rx),
                ));
            }
        }
        // Its exit was delivered (so the agent forgot it): the output kept since.
        if let Some(r) = kept(pid, e, from) {
            return Ok(r);
        }
    }
    let req = AttachRequest {
        id: ProcessId(pid),
        stdout_from: Some(from.0),
        stderr_from: Some(from.1),
    };
    match h.guest.attach_with(req).await {
        Ok(mut proc_) => {
            if let Some(e) = &entry {
                // If the exit reaches this reader, the agent forgets the process.
                keep_output_of(&mut proc_, e);
            }
            let (o, e) = proc_.offsets();
            Ok((
                StreamEvent::Attached {
                    id: pid,
                    stdout_from: o,
                    stderr_from: e,
                },
                Source::Attached(Box::new(proc_), entry.clone()),
            ))
        }
        Err(err) => {
            if let Some(e) = entry.as_ref().filter(|e| e.exit().is_some()) {
                // The agent forgot it (its exit was delivered, maybe meanwhile): the
                // daemon may still keep the output from these offsets.
                if let Some(r) = kept(pid, e, from) {
                    return Ok(r);
                }
                return Err(ApiError::of(
                    ErrorCode::Gone,
                    format!("process {pid} has exited and its output is no longer retained"),
                ));
            }
            Err(ApiError::from_guest(err, &format!("process {pid}")))
        }
    }
}

/// A reader of the output kept of a process whose exit was delivered, if it still
/// covers the offsets.
fn kept(pid: u64, e: &ProcEntry, from: (u64, u64)) -> Option<(StreamEvent, Source)> {
    let ((o, e), rx) = e.replay_kept(from, READER_CAPACITY)?;
    Some((
        StreamEvent::Attached {
            id: pid,
            stdout_from: o,
            stderr_from: e,
        },
        Source::Sup(rx),
    ))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use axum::http::StatusCode;

    fn body(argv: &[&str]) -> ExecBody {
        ExecBody {
            argv: argv.iter().map(|s| s.to_string()).collect(),
            ..ExecBody::default()
        }
    }

    #[test]
    fn a_background_process_is_detached_unless_it_keeps_stdin() {
        let bg = ExecBody {
            background: true,
            ..body(&["sleep", "1"])
        };
        assert!(guest_request(&bg).unwrap().detached);
        let with_stdin = ExecBody {
            stdin: true,
            ..bg.clone()
        };
        assert!(!guest_request(&with_stdin).unwrap().detached);
        assert!(!guest_request(&body(&["true"])).unwrap().detached);
    }

    #[test]
    fn an_exec_timeout_is_seconds_or_a_duration_string() {
        let t = |v: Value| {
            guest_request(&ExecBody {
                timeout: Some(v),
                ..body(&["true"])
            })
        };
        assert_eq!(t(json!(30)).unwrap().timeout.unwrap().0.as_secs(), 30);
        assert_eq!(t(json!("2m")).unwrap().timeout.unwrap().0.as_secs(), 120);
        assert!(t(Value::Null).unwrap().timeout.is_none());
        let e = t(json!(0)).unwrap_err();
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert_eq!(e.field.as_deref(), Some("timeout"));
    }

    #[test]
    fn a_bad_exec_field_is_a_400_naming_it() {
        let e = guest_request(&body(&[])).unwrap_err();
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert_eq!(e.field.as_deref(), Some("argv"));
        let e = guest_request(&ExecBody {
            env: [("A=B".to_string(), "x".to_string())].into(),
            ..body(&["true"])
        })
        .unwrap_err();
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert_eq!(e.field.as_deref(), Some("env"));
    }
}
