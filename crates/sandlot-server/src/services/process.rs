//! Starting a process in a sandbox: the request checked and turned into the
//! agent's, the process started through the agent and handed to its supervisor
//! (`process.rs`), which keeps its output for readers; counted in the sandbox's
//! and the daemon's exec counters. Callers: the native exec routes (JSON, NDJSON
//! and WebSocket), E2B's `process.Process/Start`, image build steps and E2B
//! template start and ready commands.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::http::StatusCode;
use sandlot_guest::client::{ExecRequest, PtySize};
use sandlot_proto::api::ExecBody;
use sandlot_proto::units::Seconds;
use serde_json::Value;

use super::parse_duration;
use crate::error::{ApiError, ApiResult};
use crate::process::{supervise, ProcEntry};
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
                ApiError::new(StatusCode::BAD_REQUEST, "spawn_failed", e.to_string())
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

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

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
