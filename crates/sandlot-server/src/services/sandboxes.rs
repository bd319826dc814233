//! The tenant's view of sandboxes, which every operation on one goes through: a
//! sandbox by id or name, another tenant's "not found" (never "forbidden"), and
//! the live handle of a running one; and the API view of a sandbox (`view`).

use std::sync::Arc;

use sandlot_proto::api::{Sandbox, SandboxExit, Usage};

use crate::auth::Principal;
use crate::config::fmt_secs;
use crate::error::{ApiError, ApiResult};
use crate::sandbox::SandboxHandle;
use crate::state::AppState;
use crate::store::{now_ms, EndReason, SandboxRecord, SandboxState};
use crate::timefmt::rfc3339;

/// The sandbox record `id` (or, failing that, the live sandbox named `id`), if
/// the caller may see it. Others' sandboxes are "not found", never "forbidden".
pub fn lookup(state: &AppState, p: &Principal, id: &str) -> ApiResult<SandboxRecord> {
    let not_found = || ApiError::not_found(format!("no sandbox {id}"));
    if let Some(r) = state.store.get_sandbox(id).map_err(ApiError::internal)? {
        return if p.sees(&r.tenant) {
            Ok(r)
        } else {
            Err(not_found())
        };
    }
    let f = crate::store::SandboxFilter {
        tenant: p.scope.clone(),
        name: Some(id.to_string()),
        limit: 2,
        ..Default::default()
    };
    let mut found = state.store.list_sandboxes(&f).map_err(ApiError::internal)?;
    match found.len() {
        1 => Ok(found.remove(0)),
        0 => Err(not_found()),
        _ => Err(ApiError::conflict(format!(
            "several sandboxes are named {id}: use the id"
        ))),
    }
}

/// The live sandbox `id` for the caller: 404 if unknown to them, 409 if stopped.
pub fn live(state: &AppState, p: &Principal, id: &str) -> ApiResult<Arc<SandboxHandle>> {
    if let Some(h) = state.handle(id) {
        if p.sees(&h.tenant) {
            h.check_running()?;
            return Ok(h);
        }
        return Err(ApiError::not_found(format!("no sandbox {id}")));
    }
    let rec = lookup(state, p, id)?;
    match state.handle(&rec.id) {
        Some(h) => {
            h.check_running()?;
            Ok(h)
        }
        None if matches!(
            rec.state,
            SandboxState::Pausing | SandboxState::Paused | SandboxState::Resuming
        ) =>
        {
            Err(crate::pause::wrong_state(&rec.id, rec.state))
        }
        None => Err(ApiError::conflict(format!(
            "sandbox {} is {}",
            rec.id,
            rec.state.as_str()
        ))),
    }
}

/// Deletes sandbox `id` of the caller's: a running one is stopped, a paused one
/// discarded with what its pause saved, one being paused or resumed once that
/// is done (it never runs on). The final record.
pub async fn delete(state: &Arc<AppState>, p: &Principal, id: &str) -> ApiResult<SandboxRecord> {
    let id = id.to_string();
    // A live sandbox is found in memory; the database is read once, for the
    // final record.
    let (id, mut h) = match state.handle(&id) {
        Some(h) if p.sees(&h.tenant) => (id, Some(h)),
        _ => {
            let rec = lookup(state, p, &id)?;
            let h = state.handle(&rec.id);
            (rec.id, h)
        }
    };
    // A resume under way (on demand, or asked) is waited out, then what it
    // came to is deleted: it never runs on, nor is paused again.
    let deadline = tokio::time::Instant::now() + crate::autopause::SETTLE_WAIT;
    loop {
        if let Some(mut live) = h.take() {
            loop {
                live.request_stop(EndReason::Deleted);
                live.stopped().await;
                // A pause that failed meanwhile handed the sandbox, running, to
                // a new handle: stop that one too.
                match state.handle(&id) {
                    Some(next) if !Arc::ptr_eq(&next, &live) => live = next,
                    _ => break,
                }
            }
        }
        let rec = lookup(state, p, &id)?;
        match rec.state {
            // A pause that finished meanwhile leaves it paused: delete that.
            SandboxState::Paused => {
                crate::pause::discard(state, &rec, EndReason::Deleted).await?;
                break;
            }
            // Between a resume's record and its handle, or a pause's steps.
            SandboxState::Resuming | SandboxState::Pausing | SandboxState::Running => {
                h = state.handle(&id);
                if h.is_some() {
                    continue;
                }
                if tokio::time::Instant::now() >= deadline {
                    return Err(crate::pause::wrong_state(&id, rec.state));
                }
                tokio::time::sleep(crate::autopause::SETTLE_POLL).await;
            }
            _ => break,
        }
    }
    lookup(state, p, &id)
}

/// Sets running sandbox `id`'s remaining lifetime to `d`, within the operator's
/// maximum lifetime from its creation. The record.
pub fn set_timeout(
    state: &AppState,
    p: &Principal,
    id: &str,
    d: std::time::Duration,
) -> ApiResult<SandboxRecord> {
    let h = live(state, p, id)?;
    let rec = lookup(state, p, &h.id)?;
    let at = now_ms() + d.as_millis() as i64;
    let max = state.cfg.limits.max_timeout.duration();
    let latest = rec.created_at + max.as_millis() as i64;
    if at > latest {
        return Err(ApiError::invalid(
            "timeout",
            format!(
                "the sandbox would live past the operator's maximum lifetime of {} (until {})",
                fmt_secs(max),
                rfc3339(latest)
            ),
        ));
    }
    state
        .store
        .set_expiry(&h.id, at)
        .map_err(ApiError::internal)?;
    h.set_expiry(at);
    h.touch();
    Ok(rec)
}

/// The API view of a record, with live usage when the sandbox runs.
pub fn view(state: &AppState, rec: &SandboxRecord) -> Sandbox {
    let handle = state.handle(&rec.id);
    let (usage, mem_now, expires) = match &handle {
        Some(h) => {
            let (u, m) = h.usage();
            (u, m, h.expires_at_ms())
        }
        None => (rec.usage, 0, rec.expires_at),
    };
    let state_now = match &handle {
        Some(h) if h.is_stopping() => SandboxState::Stopping,
        Some(h) if h.is_pausing() => SandboxState::Pausing,
        _ => rec.state,
    };
    let pause = match rec.state {
        SandboxState::Paused | SandboxState::Resuming => {
            state.store.pause_of(&rec.id).ok().flatten().map(|p| p.kind)
        }
        _ => None,
    };
    let wall_ms = match rec.started_at {
        Some(s) => rec.ended_at.unwrap_or_else(now_ms) - s,
        None => 0,
    };
    Sandbox {
        id: rec.id.clone(),
        name: rec.name.clone(),
        tenant: rec.tenant.clone(),
        state: state_now,
        spec: rec.spec.clone(),
        tags: rec.tags.clone(),
        metadata: rec.metadata.clone(),
        created_at: rfc3339(rec.created_at),
        started_at: rec.started_at.map(rfc3339),
        ended_at: rec.ended_at.map(rfc3339),
        expires_at: rfc3339(expires),
        idle_timeout: rec.idle_timeout_ms.map(|ms| ms as f64 / 1000.0),
        end_reason: rec.end_reason.map(|r| r.as_str().to_string()),
        exit: (rec.exit_code.is_some() || rec.exit_signal.is_some()).then_some(SandboxExit {
            code: rec.exit_code,
            signal: rec.exit_signal,
        }),
        error: rec.error.clone(),
        usage: Usage {
            cpu_seconds: usage.cpu_usec as f64 / 1e6,
            memory_bytes: mem_now,
            memory_peak_bytes: usage.memory_peak_bytes,
            wall_seconds: wall_ms.max(0) as f64 / 1000.0,
            exec_count: usage.exec_count,
            stdin_bytes: usage.stdin_bytes,
            stdout_bytes: usage.stdout_bytes,
            stderr_bytes: usage.stderr_bytes,
            file_bytes_in: usage.file_bytes_in,
            file_bytes_out: usage.file_bytes_out,
        },
        pause,
        on_idle: rec.lifecycle.on_idle,
        on_timeout: rec.lifecycle.on_timeout,
        auto_resume: rec.lifecycle.auto_resume,
    }
}
