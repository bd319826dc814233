//! E2B's pause, resume and connect, its lifecycle options on create (`autoPause`,
//! `autoResume`, `lifecycle`), and resume on demand of envd and code
//! interpreter calls, over the native pause and auto-pause
//! (`crate::pause`, `crate::autopause`).

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{Map, Value};

use super::envd::{constant_time_eq, AccessError, ACCESS_TOKEN_HEADER, SANDBOX_ID_HEADER};
use super::hosts::TRAFFIC_TOKEN_HEADER;
use super::rest::{
    apply_timeout, created_json, extend, json_body, principal, timeout_secs, RestError, RestResult,
};
use super::E2b;
use crate::auth::Principal;
use crate::services::sandboxes::lookup;
use crate::store::{Lifecycle, OnExpiry, SandboxRecord, SandboxState};

/// E2B's default timeout of a resume (`ResumedSandbox.timeout`), in seconds.
const RESUME_TIMEOUT_SECS: u64 = 15;

/// The lifecycle an E2B create body asks for: `autoPause` (bool), `autoResume`
/// (`{"enabled": bool}` or a bool), or `lifecycle` (`{"onTimeout": "pause" |
/// "kill", "autoResume": bool}`), which must agree with them when both are set.
pub fn of_create(body: &Map<String, Value>) -> Result<Lifecycle, String> {
    let flag = |v: Option<&Value>, field: &str| -> Result<Option<bool>, String> {
        match v {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(Value::Object(o)) => match o.get("enabled") {
                Some(Value::Bool(b)) => Ok(Some(*b)),
                None | Some(Value::Null) => Ok(Some(false)),
                Some(other) => Err(format!("{field}.enabled: expected a boolean, got {other}")),
            },
            Some(other) => Err(format!(
                "{field}: expected a boolean or {{\"enabled\": bool}}, got {other}"
            )),
        }
    };
    let auto_pause = flag(body.get("autoPause"), "autoPause")?;
    let mut auto_resume = flag(body.get("autoResume"), "autoResume")?;
    let mut on_timeout = auto_pause.map(|p| if p { OnExpiry::Pause } else { OnExpiry::Kill });
    match body.get("lifecycle") {
        None | Some(Value::Null) => {}
        Some(Value::Object(l)) => {
            if let Some(v) = l.get("onTimeout").filter(|v| !v.is_null()) {
                let action = match v {
                    Value::String(s) => s.as_str(),
                    Value::Object(o) => o.get("action").and_then(Value::as_str).unwrap_or(""),
                    _ => "",
                };
                let p = OnExpiry::parse(action).ok_or_else(|| {
                    format!("lifecycle.onTimeout: expected \"pause\" or \"kill\", got {v}")
                })?;
                if on_timeout.is_some_and(|o| o != p) {
                    return Err("lifecycle.onTimeout and autoPause disagree".into());
                }
                on_timeout = Some(p);
            }
            if let Some(r) = flag(l.get("autoResume"), "lifecycle.autoResume")? {
                if auto_resume.is_some_and(|a| a != r) {
                    return Err("lifecycle.autoResume and autoResume disagree".into());
                }
                auto_resume = Some(r);
            }
        }
        Some(other) => return Err(format!("lifecycle: expected an object, got {other}")),
    }
    Ok(Lifecycle {
        on_idle: OnExpiry::Kill,
        on_timeout: on_timeout.unwrap_or(OnExpiry::Kill),
        auto_resume: auto_resume.unwrap_or(false),
    })
}

/// The caller's sandbox `id` unless it has stopped (E2B: "not found"); a paused
/// one is found.
pub(super) fn known_record(e2b: &E2b, p: &Principal, id: &str) -> RestResult<SandboxRecord> {
    let rec = lookup(&e2b.app, p, id).map_err(|_| RestError::not_found(id))?;
    match rec.state {
        SandboxState::Pausing | SandboxState::Paused | SandboxState::Resuming => Ok(rec),
        _ => super::rest::live_record(e2b, p, id),
    }
}

fn is_paused(s: SandboxState) -> bool {
    matches!(s, SandboxState::Pausing | SandboxState::Paused)
}

/// `POST /sandboxes/{id}/pause`: 204; 409 when it is paused already (the only
/// 409: E2B's SDK reads it as "already paused"). A pause refused for another
/// reason (`pause_refused`, a sandbox stopping) is a 400 the SDK raises; the
/// paused cap a 429, a host without room a 503.
pub async fn pause(
    State(e2b): State<Arc<E2b>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> RestResult<StatusCode> {
    let p = principal(&e2b, &headers)?;
    let rec = known_record(&e2b, &p, &id)?;
    if is_paused(rec.state) {
        return Err(RestError::new(
            StatusCode::CONFLICT,
            format!("sandbox {id} is already paused"),
        ));
    }
    match crate::pause::request(&e2b.app, &p, &rec.id).await {
        Ok(_) => Ok(StatusCode::NO_CONTENT),
        Err(e) if e.status == StatusCode::CONFLICT => {
            // Paused meanwhile by another request (or its own timeout).
            let now = lookup(&e2b.app, &p, &rec.id).map(|r| r.state);
            if now.is_ok_and(is_paused) {
                return Err(RestError::new(
                    StatusCode::CONFLICT,
                    format!("sandbox {id} is already paused"),
                ));
            }
            Err(RestError::new(StatusCode::BAD_REQUEST, e.message))
        }
        Err(e) => Err(e.into()),
    }
}

/// Refuses a resume's `timeout` (seconds; 0 is "now") that would take sandbox
/// `rec` past the operator's maximum lifetime, before anything is resumed.
fn check_timeout(e2b: &E2b, rec: &SandboxRecord, secs: Option<u64>) -> RestResult<()> {
    let Some(secs) = secs.filter(|s| *s > 0) else {
        return Ok(());
    };
    let max = e2b.app.cfg.limits.max_timeout.duration();
    let latest = rec.created_at.saturating_add(max.as_millis() as i64);
    let at = crate::store::now_ms().saturating_add((secs as i64).saturating_mul(1000));
    if at > latest {
        return Err(RestError::bad(format!(
            "timeout: the sandbox would live past the operator's maximum lifetime of {}s (until {})",
            max.as_secs(),
            crate::timefmt::rfc3339(latest)
        )));
    }
    Ok(())
}

/// `POST /sandboxes/{id}/resume` (`{"timeout": seconds}`, default 15): 201 and
/// the sandbox; 409 when it is not paused.
pub async fn resume(
    State(e2b): State<Arc<E2b>>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Body,
) -> RestResult<Response> {
    let p = principal(&e2b, &headers)?;
    let rec = known_record(&e2b, &p, &id)?;
    let b = json_body(&e2b, body).await?;
    let secs = timeout_secs(&b, "timeout")?.unwrap_or(RESUME_TIMEOUT_SECS);
    if b.get("autoPause").and_then(Value::as_bool) == Some(true)
        && rec.lifecycle.on_timeout != OnExpiry::Pause
    {
        return Err(RestError::bad(
            "autoPause: a sandbox's lifecycle is set when it is created (autoPause or lifecycle.onTimeout)",
        ));
    }
    if !is_paused(rec.state) {
        return Err(RestError::new(
            StatusCode::CONFLICT,
            format!("sandbox {id} is already running"),
        ));
    }
    check_timeout(&e2b, &rec, Some(secs))?;
    crate::autopause::resume(&e2b.app, &p, &rec.id).await?;
    apply_timeout(&e2b, &p, &rec.id, secs).await?;
    Ok((StatusCode::CREATED, Json(created_json(&e2b, &rec))).into_response())
}

/// `POST /sandboxes/{id}/connect` (`{"timeout": seconds}`): a paused sandbox is
/// resumed (201) and its timeout set; a running one (200) has its timeout
/// extended to `timeout` from now unless it ends later already.
pub async fn connect(
    State(e2b): State<Arc<E2b>>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Body,
) -> RestResult<Response> {
    let p = principal(&e2b, &headers)?;
    let rec = known_record(&e2b, &p, &id)?;
    let b = json_body(&e2b, body).await?;
    let secs = timeout_secs(&b, "timeout")?;
    let status = if rec.state == SandboxState::Running {
        if let Some(secs) = secs {
            extend(&e2b, &p, &rec, secs).await?;
        }
        StatusCode::OK
    } else {
        check_timeout(&e2b, &rec, secs)?;
        crate::autopause::resume(&e2b.app, &p, &rec.id).await?;
        if let Some(secs) = secs {
            apply_timeout(&e2b, &p, &rec.id, secs).await?;
        }
        StatusCode::CREATED
    };
    Ok((status, Json(created_json(&e2b, &rec))).into_response())
}

/// In front of envd and the code interpreter: a request naming a paused sandbox
/// with `autoResume`, and holding its envd or traffic access token, resumes it
/// first. A resume that fails answers as `POST .../resume` would.
pub async fn resume_on_demand(State(e2b): State<Arc<E2b>>, req: Request, next: Next) -> Response {
    let h = req.headers();
    let Some(id) = h
        .get(SANDBOX_ID_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
    else {
        return next.run(req).await;
    };
    let token = |name: &str| h.get(name).and_then(|v| v.to_str().ok()).unwrap_or("");
    let holds = |given: &str, expected: String| {
        !given.is_empty() && constant_time_eq(given.as_bytes(), expected.as_bytes())
    };
    let authorized = holds(token(ACCESS_TOKEN_HEADER), e2b.access_token(&id))
        || holds(token(TRAFFIC_TOKEN_HEADER), e2b.traffic_token(&id));
    if authorized {
        if let Err(e) = crate::autopause::wake(&e2b.app, &id).await {
            return AccessError {
                status: e.status,
                message: e.message,
            }
            .into_response();
        }
    }
    next.run(req).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn of(v: Value) -> Result<Lifecycle, String> {
        of_create(v.as_object().unwrap())
    }

    #[test]
    fn auto_pause_and_auto_resume_map_to_the_native_lifecycle() {
        let l = of(json!({"autoPause": true, "autoResume": {"enabled": true}})).unwrap();
        assert_eq!(
            (l.on_idle, l.on_timeout, l.auto_resume),
            (OnExpiry::Kill, OnExpiry::Pause, true)
        );
        assert!(of(json!({"autoPause": false})).unwrap().is_default());
        assert!(of(json!({})).unwrap().is_default());
        let l = of(json!({"lifecycle": {"onTimeout": "pause", "autoResume": false}})).unwrap();
        assert_eq!((l.on_timeout, l.auto_resume), (OnExpiry::Pause, false));
        let l = of(json!({"lifecycle": {"onTimeout": {"action": "kill"}}})).unwrap();
        assert_eq!(l.on_timeout, OnExpiry::Kill);
    }

    #[test]
    fn bad_or_contradicting_lifecycle_options_are_refused_by_name() {
        for (v, names) in [
            (json!({"autoPause": "yes"}), "autoPause"),
            (json!({"autoResume": {"enabled": 1}}), "autoResume.enabled"),
            (
                json!({"lifecycle": {"onTimeout": "sleep"}}),
                "lifecycle.onTimeout",
            ),
            (json!({"lifecycle": []}), "lifecycle"),
            (
                json!({"autoPause": false, "lifecycle": {"onTimeout": "pause"}}),
                "autoPause",
            ),
        ] {
            let e = of(v).unwrap_err();
            assert!(e.contains(names), "{e}");
        }
    }
}
