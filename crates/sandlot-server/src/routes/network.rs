//! `/v1/sandboxes/{id}/network`: the policy of a sandbox (read, replace while it
//! runs) and its egress audit log.

use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::Json;
use sandlot_proto::api::network::NetLog;
use sandlot_proto::spec::NetworkSpec;
use serde::Deserialize;

use crate::auth::Principal;
use crate::error::{ApiError, ApiResult};
use crate::routes::{live, lookup, JsonBody};
use crate::state::AppState;

#[utoipa::path(get, path = "/v1/sandboxes/{id}/network", tag = "network",
    params(("id" = String, Path, description = "Sandbox id or name")),
    responses((status = 200, body = sandlot_proto::api::create::NetworkDoc),
        (status = 404, body = crate::error::ErrorEnvelope)))]
pub async fn get_policy(
    State(state): State<Arc<AppState>>,
    p: Principal,
    Path(id): Path<String>,
) -> ApiResult<Json<NetworkSpec>> {
    let rec = lookup(&state, &p, &id)?;
    Ok(Json(crate::network::current(&state, &rec.id, &rec.spec)))
}

#[utoipa::path(put, path = "/v1/sandboxes/{id}/network", tag = "network",
    params(("id" = String, Path, description = "Sandbox id or name")),
    request_body = sandlot_proto::api::create::NetworkDoc,
    responses((status = 200, body = sandlot_proto::api::create::NetworkDoc),
        (status = 400, body = crate::error::ErrorEnvelope),
        (status = 404, body = crate::error::ErrorEnvelope),
        (status = 409, body = crate::error::ErrorEnvelope, description = "stopped, or created with mode none")))]
pub async fn put_policy(
    State(state): State<Arc<AppState>>,
    p: Principal,
    Path(id): Path<String>,
    JsonBody(n): JsonBody<NetworkSpec>,
) -> ApiResult<Json<NetworkSpec>> {
    let h = live(&state, &p, &id)?;
    crate::network::update(&state, &h.id, &n)?;
    Ok(Json(n))
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
pub struct LogQuery {
    /// Only entries with a larger `seq` (paging).
    pub after: Option<i64>,
    /// At most this many (default 1000, at most 10000).
    pub limit: Option<u32>,
}

#[utoipa::path(get, path = "/v1/sandboxes/{id}/network/log", tag = "network",
    params(("id" = String, Path, description = "Sandbox id or name"), LogQuery),
    responses((status = 200, body = NetLog), (status = 404, body = crate::error::ErrorEnvelope)))]
pub async fn get_log(
    State(state): State<Arc<AppState>>,
    p: Principal,
    Path(id): Path<String>,
    q: Result<Query<LogQuery>, axum::extract::rejection::QueryRejection>,
) -> ApiResult<Json<NetLog>> {
    let Query(q) = q.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let rec = lookup(&state, &p, &id)?;
    let entries = crate::network::log(
        &state.store,
        &rec.id,
        q.after.unwrap_or(0),
        q.limit.unwrap_or(1000),
    )?;
    Ok(Json(NetLog { entries }))
}
