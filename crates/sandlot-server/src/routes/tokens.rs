//! `/v1/tokens`: tenants' API tokens, managed by the operator (the Unix socket, not
//! acting as a tenant) through the daemon, so a token is written to the database
//! the daemon reads and works at once. A token's secret is shown once, when it is
//! created; the database keeps its sha256 only.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use axum::Json;
use serde::{Deserialize, Serialize};

use super::{json_status, JsonBody};
use crate::auth::Principal;
use crate::error::{ApiError, ApiResult, ErrorCode};
use crate::state::AppState;
use crate::store::TokenRecord;

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateToken {
    /// The tenant the token acts as: 1 to 64 letters, digits, '-', '_' or '.'.
    pub tenant: String,
    /// A label for listings.
    #[serde(default)]
    pub name: Option<String>,
}

/// A token as listings show it (never its secret).
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct TokenView {
    /// `tok_...`: what `DELETE /v1/tokens/{id}` takes.
    pub id: String,
    pub tenant: String,
    pub name: Option<String>,
    pub created_at: String,
    pub last_used_at: Option<String>,
    pub revoked_at: Option<String>,
}

/// A new token: the view and its secret, shown this once.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct NewToken {
    #[serde(flatten)]
    pub view: TokenView,
    /// `sl_...`: the bearer token.
    pub token: String,
    /// `e2b_...`: the same token in the shape E2B's SDKs expect of an API key
    /// (`E2B_API_KEY`); the E2B front door accepts either form.
    pub e2b_api_key: String,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct TokenList {
    pub tokens: Vec<TokenView>,
}

fn view(t: &TokenRecord) -> TokenView {
    let at = crate::timefmt::rfc3339;
    TokenView {
        id: t.id.clone(),
        tenant: t.tenant.clone(),
        name: t.name.clone(),
        created_at: at(t.created_at),
        last_used_at: t.last_used_at.map(at),
        revoked_at: t.revoked_at.map(at),
    }
}

/// Tokens are the operator's: a tenant (a token, or the operator acting as one)
/// may not make more of them.
fn operator_only(p: &Principal) -> ApiResult<()> {
    match p.scope {
        None => Ok(()),
        Some(_) => Err(ApiError::of(
            ErrorCode::PermissionDenied,
            "tokens are managed by the operator (the daemon's Unix socket, not acting as a tenant)",
        )),
    }
}

#[utoipa::path(post, path = "/v1/tokens", tag = "tokens",
    request_body = CreateToken,
    responses((status = 201, body = NewToken),
        (status = 400, description = "not a tenant name", body = crate::error::ErrorEnvelope),
        (status = 403, description = "not the operator", body = crate::error::ErrorEnvelope)))]
pub async fn create(
    State(state): State<Arc<AppState>>,
    p: Principal,
    JsonBody(b): JsonBody<CreateToken>,
) -> ApiResult<Response> {
    operator_only(&p)?;
    if !crate::config::valid_tenant(&b.tenant) {
        return Err(ApiError::invalid(
            "tenant",
            format!("{:?}: {}", b.tenant, crate::config::TENANT_RULE),
        ));
    }
    if let Some(n) = &b.name {
        if n.len() > 256 || n.chars().any(char::is_control) {
            return Err(ApiError::invalid(
                "name",
                "at most 256 bytes, no control characters",
            ));
        }
    }
    let (rec, secret, hash) = crate::auth::new_token(&b.tenant, b.name);
    state
        .store
        .insert_token(&rec, &hash)
        .map_err(ApiError::internal)?;
    tracing::info!(token = %rec.id, tenant = %rec.tenant, "token created");
    Ok(json_status(
        StatusCode::CREATED,
        &NewToken {
            view: view(&rec),
            e2b_api_key: crate::auth::e2b_api_key(&secret).unwrap_or_default(),
            token: secret,
        },
    ))
}

#[utoipa::path(get, path = "/v1/tokens", tag = "tokens",
    responses((status = 200, body = TokenList),
        (status = 403, description = "not the operator", body = crate::error::ErrorEnvelope)))]
pub async fn list(State(state): State<Arc<AppState>>, p: Principal) -> ApiResult<Json<TokenList>> {
    operator_only(&p)?;
    let tokens = state.store.list_tokens().map_err(ApiError::internal)?;
    Ok(Json(TokenList {
        tokens: tokens.iter().map(view).collect(),
    }))
}

#[utoipa::path(delete, path = "/v1/tokens/{id}", tag = "tokens",
    params(("id" = String, Path, description = "The token's id (`tok_...`)")),
    responses((status = 204, description = "revoked: requests with it are 401 from now on"),
        (status = 403, description = "not the operator", body = crate::error::ErrorEnvelope),
        (status = 404, description = "no such token, or already revoked", body = crate::error::ErrorEnvelope)))]
pub async fn revoke(
    State(state): State<Arc<AppState>>,
    p: Principal,
    Path(id): Path<String>,
) -> ApiResult<StatusCode> {
    operator_only(&p)?;
    if !state.store.revoke_token(&id).map_err(ApiError::internal)? {
        return Err(ApiError::not_found(format!("no active token {id}")));
    }
    tracing::info!(token = %id, "token revoked");
    Ok(StatusCode::NO_CONTENT)
}
