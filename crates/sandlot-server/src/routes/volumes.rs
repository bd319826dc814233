//! `/v1/volumes`: named persistent volumes of the caller's tenant.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use axum::Json;
use serde::{Deserialize, Serialize};

use super::{json_status, JsonBody};
use crate::auth::Principal;
use crate::error::{ApiError, ApiResult};
use crate::images::Volume;
use crate::state::AppState;

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateVolume {
    /// 1 to 64 letters, digits, '-', '_' or '.'.
    pub name: String,
    /// Optional size limit (`"1G"` or bytes, at least 8M): the volume is then a
    /// filesystem of that size.
    #[serde(default)]
    #[schema(value_type = Option<String>, example = "1G")]
    pub size_limit: Option<sandlot_proto::units::ByteSize>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct VolumeList {
    pub volumes: Vec<Volume>,
}

#[utoipa::path(post, path = "/v1/volumes", tag = "volumes",
    request_body = CreateVolume,
    responses((status = 201, body = Volume), (status = 409, body = crate::error::ErrorEnvelope)))]
pub async fn create(
    State(state): State<Arc<AppState>>,
    p: Principal,
    JsonBody(b): JsonBody<CreateVolume>,
) -> ApiResult<Response> {
    let st = state.clone();
    let tenant = p.tenant.clone();
    let v = tokio::task::spawn_blocking(move || {
        st.images
            .create_volume(&tenant, &b.name, b.size_limit.map(|s| s.bytes()))
    })
    .await
    .map_err(ApiError::internal)??;
    Ok(json_status(StatusCode::CREATED, &v))
}

#[utoipa::path(get, path = "/v1/volumes", tag = "volumes",
    responses((status = 200, body = VolumeList)))]
pub async fn list(State(state): State<Arc<AppState>>, p: Principal) -> Json<VolumeList> {
    Json(VolumeList {
        volumes: state.images.list_volumes(p.scope.as_deref()),
    })
}

#[utoipa::path(get, path = "/v1/volumes/{name}", tag = "volumes",
    params(("name" = String, Path)),
    responses((status = 200, body = Volume), (status = 404, body = crate::error::ErrorEnvelope)))]
pub async fn get_one(
    State(state): State<Arc<AppState>>,
    p: Principal,
    Path(name): Path<String>,
) -> ApiResult<Json<Volume>> {
    state
        .images
        .get_volume(&p.tenant, &name)
        .map(Json)
        .ok_or_else(|| ApiError::not_found(format!("no volume {name}")))
}

/// Live sandboxes of `tenant` whose spec mounts volume `name`.
fn users(state: &AppState, tenant: &str, name: &str) -> Vec<String> {
    let mut out = Vec::new();
    for h in state.all_live() {
        if h.tenant != tenant {
            continue;
        }
        if let Ok(Some(rec)) = state.store.get_sandbox(&h.id) {
            let uses = rec.spec["volumes"]
                .as_array()
                .is_some_and(|vs| vs.iter().any(|v| v["name"] == name));
            if uses {
                out.push(h.id.clone());
            }
        }
    }
    out
}

#[utoipa::path(delete, path = "/v1/volumes/{name}", tag = "volumes",
    params(("name" = String, Path)),
    responses((status = 200, body = Volume), (status = 404, body = crate::error::ErrorEnvelope),
        (status = 409, description = "a live sandbox mounts it", body = crate::error::ErrorEnvelope)))]
pub async fn remove(
    State(state): State<Arc<AppState>>,
    p: Principal,
    Path(name): Path<String>,
) -> ApiResult<Json<Volume>> {
    let using = users(&state, &p.tenant, &name);
    let st = state.clone();
    let tenant = p.tenant.clone();
    tokio::task::spawn_blocking(move || st.images.remove_volume(&tenant, &name, &using))
        .await
        .map_err(ApiError::internal)?
        .map(Json)
}
