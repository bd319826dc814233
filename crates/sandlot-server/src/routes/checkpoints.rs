//! `/v1/sandboxes/{id}/checkpoints` and `/v1/sandboxes/{id}/fork`
//! (`checkpoint.rs`, `fork.rs`).

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use axum::response::Response;
use axum::Json;
use sandlot_proto::api::checkpoint::{
    CheckpointDiff, CheckpointList, CreateCheckpoint, ForkRequest, Forked, Restored,
};

use super::{json_status, parse_json, read_limited};
use crate::auth::Principal;
use crate::error::ApiResult;
use crate::state::AppState;

/// A body that may be empty (then `T::default()`).
pub(super) async fn optional_body<T: serde::de::DeserializeOwned + Default>(
    state: &AppState,
    body: Body,
) -> ApiResult<T> {
    let bytes = read_limited(body, state.cfg.limits.max_request_body.bytes()).await?;
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    parse_json(&bytes)
}

#[utoipa::path(post, path = "/v1/sandboxes/{id}/checkpoints", tag = "checkpoints",
    params(("id" = String, Path, description = "Sandbox id or name")),
    request_body(content = CreateCheckpoint, description = "Optional: a name, and whether the sandbox runs on (default) or stays paused"),
    responses((status = 201, body = sandlot_proto::api::checkpoint::Checkpoint),
        (status = 400, description = "invalid_request: a bad name", body = crate::error::ErrorEnvelope),
        (status = 404, body = crate::error::ErrorEnvelope),
        (status = 409, description = "invalid_state: not running or paused, or another checkpoint, restore, fork or snapshot of it is under way; checkpoint_damaged: a paused sandbox's saved files are gone or incomplete; pause_refused: gVisor cannot save it as it is", body = crate::error::ErrorEnvelope),
        (status = 413, description = "too_large: the copy of its files is past the disk room claimed for it, or nests past the depth or entry bound", body = crate::error::ErrorEnvelope),
        (status = 429, description = "quota_exceeded: limits.max_checkpoints_per_sandbox, or the tenant's max_saved_disk", body = crate::error::ErrorEnvelope),
        (status = 503, description = "host_exhausted: no disk room for it", body = crate::error::ErrorEnvelope)))]
pub async fn create(
    State(state): State<Arc<AppState>>,
    p: Principal,
    Path(id): Path<String>,
    body: Body,
) -> ApiResult<Response> {
    let b: CreateCheckpoint = optional_body(&state, body).await?;
    let c = crate::checkpoint::create(&state, &p, &id, &b).await?;
    let mut v = crate::checkpoint::view(&c);
    v.sandbox_state = state
        .store
        .get_sandbox(&c.sandbox_id)
        .ok()
        .flatten()
        .map(|r| r.state);
    Ok(json_status(StatusCode::CREATED, &v))
}

#[utoipa::path(get, path = "/v1/sandboxes/{id}/checkpoints", tag = "checkpoints",
    params(("id" = String, Path, description = "Sandbox id or name")),
    responses((status = 200, body = CheckpointList), (status = 404, body = crate::error::ErrorEnvelope)))]
pub async fn list(
    State(state): State<Arc<AppState>>,
    p: Principal,
    Path(id): Path<String>,
) -> ApiResult<Json<CheckpointList>> {
    Ok(Json(CheckpointList {
        checkpoints: crate::checkpoint::list(&state, &p, &id)?,
    }))
}

#[utoipa::path(delete, path = "/v1/sandboxes/{id}/checkpoints/{cp}", tag = "checkpoints",
    params(("id" = String, Path, description = "Sandbox id or name"), ("cp" = String, Path, description = "Checkpoint id")),
    responses((status = 204, description = "Deleted"), (status = 404, body = crate::error::ErrorEnvelope),
        (status = 409, description = "invalid_state: another checkpoint, restore or fork of the sandbox is under way", body = crate::error::ErrorEnvelope)))]
pub async fn delete(
    State(state): State<Arc<AppState>>,
    p: Principal,
    Path((id, cp)): Path<(String, String)>,
) -> ApiResult<StatusCode> {
    crate::checkpoint::delete(&state, &p, &id, &cp).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(post, path = "/v1/sandboxes/{id}/checkpoints/{cp}/restore", tag = "checkpoints",
    params(("id" = String, Path, description = "Sandbox id or name"), ("cp" = String, Path, description = "Checkpoint id")),
    responses((status = 200, description = "Running again from the checkpoint: `kind` `memory` (processes, memory and files) or `filesystem` (files; processes started afresh)", body = Restored),
        (status = 404, body = crate::error::ErrorEnvelope),
        (status = 409, description = "invalid_state: not running or paused; checkpoint_damaged: its memory image is not what was saved", body = crate::error::ErrorEnvelope),
        (status = 429, description = "quota_exceeded: the tenant's memory quota has no room for it", body = crate::error::ErrorEnvelope)))]
pub async fn restore(
    State(state): State<Arc<AppState>>,
    p: Principal,
    Path((id, cp)): Path<(String, String)>,
) -> ApiResult<Json<Restored>> {
    Ok(Json(
        crate::checkpoint::restore(&state, &p, &id, &cp).await?,
    ))
}

#[utoipa::path(post, path = "/v1/sandboxes/{id}/fork", tag = "checkpoints",
    params(("id" = String, Path, description = "Sandbox id or name")),
    request_body(content = ForkRequest, description = "How many, and from which checkpoint (default: a fresh one)"),
    responses((status = 201, description = "The new sandboxes, running: `kind` `memory` (they continue the checkpoint's processes) or `filesystem` (its files; processes started afresh)", body = Forked),
        (status = 400, description = "invalid_request: count out of range", body = crate::error::ErrorEnvelope),
        (status = 404, body = crate::error::ErrorEnvelope),
        (status = 409, body = crate::error::ErrorEnvelope),
        (status = 429, description = "quota_exceeded: the tenant's quotas have no room for all of them (none is made)", body = crate::error::ErrorEnvelope)))]
pub async fn fork(
    State(state): State<Arc<AppState>>,
    p: Principal,
    Path(id): Path<String>,
    body: Body,
) -> ApiResult<Response> {
    let b: ForkRequest = optional_body(&state, body).await?;
    let f: Forked = crate::fork::fork(&state, &p, &id, &b).await?;
    Ok(json_status(StatusCode::CREATED, &f))
}

#[utoipa::path(get, path = "/v1/sandboxes/{id}/checkpoints/{cp}/diff", tag = "checkpoints",
    params(("id" = String, Path, description = "Sandbox id or name"), ("cp" = String, Path, description = "Checkpoint id"),
        ("against" = String, Query, description = "Another checkpoint of the sandbox")),
    responses((status = 200, description = "Paths added, changed and removed from `cp` to `against`", body = CheckpointDiff),
        (status = 400, description = "no `against`", body = crate::error::ErrorEnvelope),
        (status = 404, body = crate::error::ErrorEnvelope),
        (status = 413, description = "too_large: the diff reads past images.max_expanded_size", body = crate::error::ErrorEnvelope)))]
pub async fn diff(
    State(state): State<Arc<AppState>>,
    p: Principal,
    Path((id, cp)): Path<(String, String)>,
    RawQuery(q): RawQuery,
) -> ApiResult<Json<CheckpointDiff>> {
    let against = q
        .as_deref()
        .unwrap_or("")
        .split('&')
        .find_map(|kv| kv.strip_prefix("against="))
        .filter(|v| !v.is_empty())
        .ok_or_else(|| {
            crate::error::ApiError::invalid("against", "name the other checkpoint: ?against=cp-...")
        })?
        .to_string();
    Ok(Json(
        crate::checkpoint::diff(&state, &p, &id, &cp, &against).await?,
    ))
}
