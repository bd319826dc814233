//! `/v1/sandboxes/{id}/snapshots` and `/v1/snapshots` (`snapshot.rs`).

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use axum::response::Response;
use axum::Json;
use sandlot_proto::api::snapshot::{CreateSnapshot, Snapshot, SnapshotList, StartFromSnapshot};

use super::checkpoints::optional_body;
use super::json_status;
use crate::auth::Principal;
use crate::error::{ApiError, ApiResult};
use crate::state::AppState;

#[utoipa::path(post, path = "/v1/sandboxes/{id}/snapshots", tag = "snapshots",
    params(("id" = String, Path, description = "Sandbox id or name")),
    request_body(content = CreateSnapshot, description = "Optional: a name, and a checkpoint of the sandbox to promote (default: a fresh one; the sandbox runs on)"),
    responses((status = 201, description = "The snapshot, the tenant's until deleted (it outlives the sandbox)", body = Snapshot),
        (status = 400, description = "invalid_request: a bad name", body = crate::error::ErrorEnvelope),
        (status = 404, description = "no such sandbox, or no such checkpoint of it", body = crate::error::ErrorEnvelope),
        (status = 409, description = "invalid_state: not running or paused, or another checkpoint, restore, fork or snapshot of it is under way; checkpoint_damaged: a paused sandbox's saved files are gone or incomplete; conflict: the sandbox ended meanwhile", body = crate::error::ErrorEnvelope),
        (status = 413, description = "too_large: the copy of its files is past the disk room claimed for it", body = crate::error::ErrorEnvelope),
        (status = 429, description = "quota_exceeded: the tenant's max_snapshots or max_saved_disk, or limits.max_checkpoints_per_sandbox (a fresh snapshot is taken through a checkpoint)", body = crate::error::ErrorEnvelope),
        (status = 503, description = "host_exhausted: no disk room for it", body = crate::error::ErrorEnvelope)))]
pub async fn create(
    State(state): State<Arc<AppState>>,
    p: Principal,
    Path(id): Path<String>,
    body: Body,
) -> ApiResult<Response> {
    let b: CreateSnapshot = optional_body(&state, body).await?;
    let s = crate::snapshot::create(&state, &p, &id, &b).await?;
    Ok(json_status(StatusCode::CREATED, &crate::snapshot::view(&s)))
}

/// `sandbox_id=` and `name=` of a snapshot listing.
fn list_filter(q: Option<&str>) -> ApiResult<(Option<String>, Option<String>)> {
    let (mut sandbox, mut name) = (None, None);
    for (k, v) in form_urlencoded::parse(q.unwrap_or("").as_bytes()) {
        match k.as_ref() {
            "sandbox_id" => sandbox = Some(v.into_owned()),
            "name" => name = Some(v.into_owned()),
            other => {
                return Err(ApiError::invalid(
                    other.to_string(),
                    "unknown query parameter, expected sandbox_id or name",
                ))
            }
        }
    }
    Ok((sandbox, name))
}

#[utoipa::path(get, path = "/v1/snapshots", tag = "snapshots",
    params(("sandbox_id" = Option<String>, Query, description = "Only those taken of this sandbox"),
        ("name" = Option<String>, Query, description = "Only those of this name")),
    responses((status = 200, description = "The caller's snapshots, oldest first", body = SnapshotList),
        (status = 400, description = "an unknown query parameter", body = crate::error::ErrorEnvelope)))]
pub async fn list(
    State(state): State<Arc<AppState>>,
    p: Principal,
    RawQuery(q): RawQuery,
) -> ApiResult<Json<SnapshotList>> {
    let (sandbox, name) = list_filter(q.as_deref())?;
    let all = crate::snapshot::list(&state, &p, sandbox.as_deref(), name.as_deref())?;
    Ok(Json(SnapshotList {
        snapshots: all.iter().map(crate::snapshot::view).collect(),
    }))
}

#[utoipa::path(get, path = "/v1/snapshots/{sn}", tag = "snapshots",
    params(("sn" = String, Path, description = "Snapshot id")),
    responses((status = 200, body = Snapshot), (status = 404, body = crate::error::ErrorEnvelope)))]
pub async fn get_one(
    State(state): State<Arc<AppState>>,
    p: Principal,
    Path(sn): Path<String>,
) -> ApiResult<Json<Snapshot>> {
    let s = crate::snapshot::find(&state, &p, &sn)?;
    Ok(Json(crate::snapshot::view(&s)))
}

#[utoipa::path(delete, path = "/v1/snapshots/{sn}", tag = "snapshots",
    params(("sn" = String, Path, description = "Snapshot id")),
    responses((status = 204, description = "Deleted; its disk is freed once no start reads it"),
        (status = 404, body = crate::error::ErrorEnvelope)))]
pub async fn delete(
    State(state): State<Arc<AppState>>,
    p: Principal,
    Path(sn): Path<String>,
) -> ApiResult<StatusCode> {
    crate::snapshot::delete(&state, &p, &sn).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(post, path = "/v1/snapshots/{sn}/sandboxes", tag = "snapshots",
    params(("sn" = String, Path, description = "Snapshot id")),
    request_body(content = StartFromSnapshot, description = "Optional: the new sandbox's lifetime"),
    responses((status = 201, description = "A new sandbox, running from the snapshot: `memory` (it continues the snapshot's processes) or `filesystem` (its files; processes started afresh)", body = sandlot_proto::api::Sandbox),
        (status = 400, description = "invalid_request: timeout out of range", body = crate::error::ErrorEnvelope),
        (status = 404, body = crate::error::ErrorEnvelope),
        (status = 429, description = "quota_exceeded: the tenant's sandbox or memory quota", body = crate::error::ErrorEnvelope)))]
pub async fn start(
    State(state): State<Arc<AppState>>,
    p: Principal,
    Path(sn): Path<String>,
    body: Body,
) -> ApiResult<Response> {
    let b: StartFromSnapshot = optional_body(&state, body).await?;
    let sb = crate::snapshot::start(&state, &p, &sn, b.timeout).await?;
    Ok(json_status(StatusCode::CREATED, &sb))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_snapshot_listing_filters_by_sandbox_and_name_and_refuses_other_parameters() {
        assert_eq!(list_filter(None).unwrap(), (None, None));
        assert_eq!(
            list_filter(Some("sandbox_id=sb-1&name=a%20b")).unwrap(),
            (Some("sb-1".into()), Some("a b".into()))
        );
        assert!(list_filter(Some("tenant=other")).is_err());
    }
}
