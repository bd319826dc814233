//! `/v1/secrets`: named secrets of the caller's tenant. Values go in once and
//! never come out through the API; sandboxes get them at create.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use axum::Json;
use serde::{Deserialize, Serialize};

use super::{json_status, JsonBody};
use crate::auth::Principal;
use crate::error::ApiResult;
use crate::images::SecretInfo;
use crate::state::AppState;

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateSecret {
    pub name: String,
    /// UTF-8, at most 64K. Never returned.
    pub value: String,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct SecretList {
    pub secrets: Vec<SecretInfo>,
}

#[utoipa::path(post, path = "/v1/secrets", tag = "secrets",
    request_body = CreateSecret,
    responses((status = 201, body = SecretInfo), (status = 409, description = "exists", body = crate::error::ErrorEnvelope)))]
pub async fn create(
    State(state): State<Arc<AppState>>,
    p: Principal,
    JsonBody(b): JsonBody<CreateSecret>,
) -> ApiResult<Response> {
    let info = state.images.create_secret(&p.tenant, &b.name, &b.value)?;
    Ok(json_status(StatusCode::CREATED, &info))
}

#[utoipa::path(get, path = "/v1/secrets", tag = "secrets",
    responses((status = 200, body = SecretList)))]
pub async fn list(State(state): State<Arc<AppState>>, p: Principal) -> Json<SecretList> {
    Json(SecretList {
        secrets: state.images.list_secrets(p.scope.as_deref()),
    })
}

#[utoipa::path(delete, path = "/v1/secrets/{name}", tag = "secrets",
    params(("name" = String, Path)),
    responses((status = 204), (status = 404, body = crate::error::ErrorEnvelope)))]
pub async fn remove(
    State(state): State<Arc<AppState>>,
    p: Principal,
    Path(name): Path<String>,
) -> ApiResult<StatusCode> {
    state.images.remove_secret(&p.tenant, &name)?;
    Ok(StatusCode::NO_CONTENT)
}
