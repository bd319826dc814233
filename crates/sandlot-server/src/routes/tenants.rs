//! `GET /v1/tenants`: the operator's list of tenants with their quotas and
//! usage (`services/tenants.rs`).

use std::sync::Arc;

use axum::extract::State;
use axum::Json;
use sandlot_proto::api::tenants::TenantList;

use crate::auth::Principal;
use crate::error::ApiResult;
use crate::state::AppState;

#[utoipa::path(get, path = "/v1/tenants", tag = "system",
    responses((status = 200, body = TenantList),
        (status = 401, body = crate::error::ErrorEnvelope),
        (status = 403, description = "not the operator (a tenant's token, or the operator acting as a tenant)", body = crate::error::ErrorEnvelope)))]
pub async fn list(State(state): State<Arc<AppState>>, p: Principal) -> ApiResult<Json<TenantList>> {
    crate::services::tenants::list(&state, &p).await.map(Json)
}
