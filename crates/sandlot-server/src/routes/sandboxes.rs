//! `/v1/sandboxes`: create, list, inspect, delete, extend the lifetime, events.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use axum::response::Response;
use axum::Json;
use sandlot_proto::api::{EventList, Health, Sandbox, SandboxEvent, SandboxList, SetTimeout};
use serde_json::Value;

use super::{json_status, lookup, parse_json, read_limited, JsonBody};
use crate::auth::Principal;
use crate::error::{ApiError, ApiResult};
use crate::sandbox;
use crate::services::parse_duration;
pub use crate::services::sandboxes::view;
use crate::state::AppState;
use crate::store::{SandboxFilter, SandboxState};
use crate::timefmt::rfc3339;

#[utoipa::path(get, path = "/v1/health", tag = "system",
    responses((status = 200, body = Health), (status = 401, body = crate::error::ErrorEnvelope)))]
pub async fn health(p: Principal) -> Json<Health> {
    Json(Health {
        status: "ok".into(),
        version: env!("CARGO_PKG_VERSION").into(),
        tenant: p.scope.unwrap_or_else(|| "*".into()),
    })
}

#[utoipa::path(post, path = "/v1/sandboxes", tag = "sandboxes",
    params(("Idempotency-Key" = Option<String>, Header, description = "Retry-safe create: a repeated request with the same key and body (within 24 h) answers with the sandbox the first one made, header `Idempotent-Replayed: true`, instead of making a second")),
    request_body(content = sandlot_proto::api::CreateSandboxRequest, description = "The sandbox spec plus name, tags, metadata and idle_timeout"),
    responses((status = 201, body = Sandbox), (status = 400, body = crate::error::ErrorEnvelope),
        (status = 409, description = "name taken, or a create with the same Idempotency-Key still running", body = crate::error::ErrorEnvelope),
        (status = 422, description = "Idempotency-Key reused with another body", body = crate::error::ErrorEnvelope),
        (status = 413, body = crate::error::ErrorEnvelope), (status = 429, description = "quota", body = crate::error::ErrorEnvelope),
        (status = 503, description = "`host_exhausted`: the host is out of file descriptors, memory or disk space (the message names which; nothing of the sandbox is left, retry later); `unavailable`: no free sandbox slot or network slot, or the daemon is stopping", body = crate::error::ErrorEnvelope)))]
pub async fn create(
    State(state): State<Arc<AppState>>,
    p: Principal,
    headers: axum::http::HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    let bytes = read_limited(body, state.cfg.limits.max_request_body.bytes()).await?;
    let v: Value = parse_json(&bytes)?;
    let key = headers
        .get("idempotency-key")
        .map(|k| sandbox::IdempotencyKey::parse(k.as_bytes(), &v))
        .transpose()?;
    let params = crate::services::create::parse(&state, &p, v)?;
    let (rec, replayed) = sandbox::create_idempotent(&state, params, key).await?;
    let mut resp = json_status(StatusCode::CREATED, &view(&state, &rec));
    if replayed {
        resp.headers_mut().insert(
            "idempotent-replayed",
            axum::http::HeaderValue::from_static("true"),
        );
    }
    Ok(resp)
}

/// Parses `state=running,stopped&tag=k=v&tag=k&name=x&limit=10`.
pub fn parse_list_query(q: Option<&str>, tenant: Option<String>) -> ApiResult<SandboxFilter> {
    let mut f = SandboxFilter {
        tenant,
        ..Default::default()
    };
    for (k, v) in form_urlencoded::parse(q.unwrap_or("").as_bytes()) {
        match k.as_ref() {
            "state" => {
                for s in v.split(',').filter(|s| !s.is_empty()) {
                    if s == "all" {
                        f.states = SandboxState::LIVE.to_vec();
                        f.states.push(SandboxState::Stopped);
                        continue;
                    }
                    if s == "live" {
                        f.states.extend(SandboxState::LIVE);
                        continue;
                    }
                    let st = SandboxState::parse(s).ok_or_else(|| {
                        ApiError::invalid(
                            "state",
                            format!(
                                "{s:?}: expected creating, running, pausing, paused, resuming, stopping, stopped, live or all"
                            ),
                        )
                    })?;
                    f.states.push(st);
                }
            }
            "tag" => match v.split_once('=') {
                Some((k, v)) => f.tags.push((k.to_string(), Some(v.to_string()))),
                None => f.tags.push((v.to_string(), None)),
            },
            "name" => f.name = Some(v.into_owned()),
            "limit" => {
                f.limit = v
                    .parse()
                    .map_err(|_| ApiError::invalid("limit", format!("{v:?} is not a number")))?
            }
            other => {
                return Err(ApiError::invalid(
                    other,
                    "unknown query parameter, expected state, tag, name or limit",
                ))
            }
        }
    }
    Ok(f)
}

#[utoipa::path(get, path = "/v1/sandboxes", tag = "sandboxes",
    params(("state" = Option<String>, Query, description = "Comma-separated states, `live` (default) or `all`"),
        ("tag" = Option<String>, Query, description = "`KEY=VALUE` or `KEY`; repeatable, all must match"),
        ("name" = Option<String>, Query), ("limit" = Option<usize>, Query)),
    responses((status = 200, body = SandboxList), (status = 400, body = crate::error::ErrorEnvelope)))]
pub async fn list(
    State(state): State<Arc<AppState>>,
    p: Principal,
    RawQuery(q): RawQuery,
) -> ApiResult<Json<SandboxList>> {
    let f = parse_list_query(q.as_deref(), p.scope.clone())?;
    let recs = state.store.list_sandboxes(&f).map_err(ApiError::internal)?;
    Ok(Json(SandboxList {
        sandboxes: recs.iter().map(|r| view(&state, r)).collect(),
    }))
}

#[utoipa::path(get, path = "/v1/sandboxes/{id}", tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id or name")),
    responses((status = 200, body = Sandbox), (status = 404, body = crate::error::ErrorEnvelope)))]
pub async fn get_one(
    State(state): State<Arc<AppState>>,
    p: Principal,
    Path(id): Path<String>,
) -> ApiResult<Json<Sandbox>> {
    let rec = lookup(&state, &p, &id)?;
    Ok(Json(view(&state, &rec)))
}

#[utoipa::path(delete, path = "/v1/sandboxes/{id}", tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id or name")),
    responses((status = 200, description = "Stopped (idempotent); a sandbox being paused or resumed is deleted once that is done", body = Sandbox), (status = 404, body = crate::error::ErrorEnvelope),
        (status = 409, description = "invalid_state: a pause or resume under way did not finish within 2 minutes", body = crate::error::ErrorEnvelope)))]
pub async fn delete(
    State(state): State<Arc<AppState>>,
    p: Principal,
    Path(id): Path<String>,
) -> ApiResult<Json<Sandbox>> {
    let rec = crate::services::sandboxes::delete(&state, &p, &id).await?;
    Ok(Json(view(&state, &rec)))
}

#[utoipa::path(post, path = "/v1/sandboxes/{id}/pause", tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id or name")),
    responses((status = 200, description = "Paused: `state` is `paused`, `pause` says what was kept (`memory` on gVisor, `filesystem` on the namespace backend)", body = Sandbox),
        (status = 404, body = crate::error::ErrorEnvelope),
        (status = 409, description = "invalid_state: the sandbox is not running; pause_refused: gVisor cannot save it as it is (it runs on)", body = crate::error::ErrorEnvelope),
        (status = 413, description = "too_large: a namespace sandbox's files expand past its disk limit (it runs on)", body = crate::error::ErrorEnvelope),
        (status = 503, description = "host_exhausted: no room for what the pause saves (it runs on)", body = crate::error::ErrorEnvelope)))]
pub async fn pause(
    State(state): State<Arc<AppState>>,
    p: Principal,
    Path(id): Path<String>,
) -> ApiResult<Json<Sandbox>> {
    let rec = crate::pause::request(&state, &p, &id).await?;
    Ok(Json(view(&state, &rec)))
}

#[utoipa::path(post, path = "/v1/sandboxes/{id}/resume", tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id or name")),
    responses((status = 200, description = "Running again", body = Sandbox),
        (status = 404, body = crate::error::ErrorEnvelope),
        (status = 409, description = "invalid_state: the sandbox is not paused; checkpoint_damaged: its saved memory image is not what was saved (it stays paused); lifetime_exceeded: it has reached the operator's maximum lifetime (it stays paused)", body = crate::error::ErrorEnvelope),
        (status = 429, description = "quota_exceeded: the tenant's memory quota has no room for it", body = crate::error::ErrorEnvelope)))]
pub async fn resume(
    State(state): State<Arc<AppState>>,
    p: Principal,
    Path(id): Path<String>,
) -> ApiResult<Json<Sandbox>> {
    let rec = crate::pause::resume(&state, &p, &id).await?;
    Ok(Json(view(&state, &rec)))
}

#[utoipa::path(post, path = "/v1/sandboxes/{id}/timeout", tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id or name")),
    request_body = SetTimeout,
    responses((status = 200, body = Sandbox), (status = 400, body = crate::error::ErrorEnvelope),
        (status = 404, body = crate::error::ErrorEnvelope), (status = 409, body = crate::error::ErrorEnvelope)))]
pub async fn set_timeout(
    State(state): State<Arc<AppState>>,
    p: Principal,
    Path(id): Path<String>,
    JsonBody(b): JsonBody<SetTimeout>,
) -> ApiResult<Json<Sandbox>> {
    let d = parse_duration("timeout", &b.timeout)?;
    let rec = crate::services::sandboxes::set_timeout(&state, &p, &id, d)?;
    Ok(Json(view(&state, &rec)))
}

#[utoipa::path(get, path = "/v1/sandboxes/{id}/events", tag = "sandboxes",
    params(("id" = String, Path), ("after" = Option<i64>, Query, description = "Only events after this sequence number")),
    responses((status = 200, body = EventList), (status = 404, body = crate::error::ErrorEnvelope)))]
pub async fn events(
    State(state): State<Arc<AppState>>,
    p: Principal,
    Path(id): Path<String>,
    RawQuery(q): RawQuery,
) -> ApiResult<Json<EventList>> {
    let rec = lookup(&state, &p, &id)?;
    let mut after = 0i64;
    for (k, v) in form_urlencoded::parse(q.unwrap_or_default().as_bytes()) {
        match k.as_ref() {
            "after" => {
                after = v
                    .parse()
                    .map_err(|_| ApiError::invalid("after", "not a number"))?
            }
            other => {
                return Err(ApiError::invalid(
                    other,
                    "unknown query parameter, expected after",
                ))
            }
        }
    }
    let ev = state
        .store
        .events(&rec.id, after, 1000)
        .map_err(ApiError::internal)?;
    Ok(Json(EventList {
        events: ev
            .into_iter()
            .map(|e| SandboxEvent {
                seq: e.seq,
                at: rfc3339(e.at),
                kind: e.kind,
                message: e.message,
            })
            .collect(),
    }))
}
