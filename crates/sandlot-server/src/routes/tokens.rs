//! `/v1/tokens`: API tokens, managed by the operator (the Unix socket or an
//! operator token, not acting as a tenant) through the daemon, so a token is
//! written to the database the daemon reads and works at once. A token's secret is
//! shown once, when it is created; the database keeps its sha256 only. A tenant
//! token acts as its tenant; an operator token as the operator, and only the
//! operator on the Unix socket mints or revokes one.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use axum::Json;
use serde::{Deserialize, Serialize};

use super::images::blocking;
use super::{json_status, JsonBody};
use crate::auth::Principal;
use crate::error::{ApiError, ApiResult, ErrorCode};
use crate::state::AppState;
use crate::store::{Revoke, TokenKind, TokenRecord};

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateToken {
    /// The tenant the token acts as: 1 to 64 letters, digits, '-', '_' or '.'.
    /// Required for a tenant token; absent for an operator token.
    #[serde(default)]
    pub tenant: Option<String>,
    /// A label for listings.
    #[serde(default)]
    pub name: Option<String>,
    /// An operator token (every tenant, over TCP too) instead of a tenant's:
    /// only the operator on the Unix socket may ask for one.
    #[serde(default)]
    pub operator: bool,
}

/// A token as listings show it (never its secret).
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct TokenView {
    /// `tok_...`: what `DELETE /v1/tokens/{id}` takes.
    pub id: String,
    /// `tenant` or `operator`.
    #[schema(value_type = String, example = "tenant")]
    pub kind: TokenKind,
    /// The tenant a tenant token acts as; `*` for an operator token.
    pub tenant: String,
    pub name: Option<String>,
    pub created_at: String,
    pub last_used_at: Option<String>,
    pub revoked_at: Option<String>,
    /// Who minted it: the minting operator token's id (`tok_...`), or `socket`
    /// (the Unix socket, or `sandlot token create --data-dir`); null for a
    /// token made before tokens recorded their maker. Revoking an operator
    /// token revokes every token it minted.
    #[schema(example = "socket")]
    pub created_by: Option<String>,
}

/// A new token: the view and its secret, shown this once.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct NewToken {
    #[serde(flatten)]
    pub view: TokenView,
    /// `sl_...`: the bearer token.
    pub token: String,
    /// `e2b_...`: the same token in the shape E2B's SDKs expect of an API key
    /// (`E2B_API_KEY`); the E2B front door accepts either form. A tenant
    /// token's only: the E2B front door takes no operator token.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub e2b_api_key: Option<String>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct TokenList {
    pub tokens: Vec<TokenView>,
}

fn view(t: &TokenRecord) -> TokenView {
    let at = crate::timefmt::rfc3339;
    TokenView {
        id: t.id.clone(),
        kind: t.kind,
        tenant: t.tenant.clone(),
        name: t.name.clone(),
        created_at: at(t.created_at),
        last_used_at: t.last_used_at.map(at),
        revoked_at: t.revoked_at.map(at),
        created_by: t.created_by.clone(),
    }
}

/// Tokens are the operator's: a tenant (a token, or the operator acting as one)
/// may not make more of them. 403 `permission_denied`, as documented for
/// `/v1/tokens` since before operator tokens.
fn operator_only(p: &Principal) -> ApiResult<()> {
    crate::auth::require_operator(p, "managing tokens").map_err(permission_denied)
}

/// Operator tokens are the socket's: an operator token may not mint or revoke
/// one (a stolen operator token cannot make itself a successor, nor lock out
/// the operator's other tokens). 403 `permission_denied`, as documented.
fn socket_only(p: &Principal, what: &str) -> ApiResult<()> {
    crate::auth::require_socket(p, what).map_err(permission_denied)
}

fn permission_denied(e: ApiError) -> ApiError {
    ApiError::of(ErrorCode::PermissionDenied, e.message)
}

/// What a create body asks for, checked: the kind and the tenant it names.
fn plan(b: &CreateToken) -> ApiResult<TokenKind> {
    if let Some(n) = &b.name {
        if n.len() > 256 || n.chars().any(char::is_control) {
            return Err(ApiError::invalid(
                "name",
                "at most 256 bytes, no control characters",
            ));
        }
    }
    match (&b.tenant, b.operator) {
        (Some(_), true) => Err(ApiError::invalid(
            "tenant",
            "an operator token names no tenant (leave out `tenant`, or `operator`)",
        )),
        (None, true) => Ok(TokenKind::Operator),
        (None, false) => Err(ApiError::invalid(
            "tenant",
            "required: the tenant the token acts as (or `\"operator\": true`)",
        )),
        (Some(t), false) if !crate::config::valid_tenant(t) => Err(ApiError::invalid(
            "tenant",
            format!("{t:?}: {}", crate::config::TENANT_RULE),
        )),
        (Some(_), false) => Ok(TokenKind::Tenant),
    }
}

#[utoipa::path(post, path = "/v1/tokens", tag = "tokens",
    request_body = CreateToken,
    responses((status = 201, body = NewToken),
        (status = 400, description = "not a tenant name, or a tenant named for an operator token", body = crate::error::ErrorEnvelope),
        (status = 403, description = "not the operator, or an operator token asked for by other than the Unix socket", body = crate::error::ErrorEnvelope)))]
pub async fn create(
    State(state): State<Arc<AppState>>,
    p: Principal,
    JsonBody(b): JsonBody<CreateToken>,
) -> ApiResult<Response> {
    operator_only(&p)?;
    let kind = plan(&b)?;
    let (rec, secret, hash) = match kind {
        TokenKind::Operator => {
            socket_only(&p, "creating an operator token")?;
            crate::auth::new_operator_token(b.name)
        }
        TokenKind::Tenant => {
            crate::auth::new_token(b.tenant.as_deref().unwrap_or_default(), b.name)
        }
    };
    // Who minted it: revoking that operator token revokes this one too.
    let rec = TokenRecord {
        created_by: Some(p.minter()),
        ..rec
    };
    state
        .store
        .insert_token(&rec, &hash)
        .map_err(ApiError::internal)?;
    state.tenants.invalidate();
    tracing::info!(token = %rec.id, kind = rec.kind.as_str(), tenant = %rec.tenant, by = ?p.credential, "token created");
    Ok(json_status(
        StatusCode::CREATED,
        &NewToken {
            view: view(&rec),
            e2b_api_key: match rec.kind {
                TokenKind::Tenant => crate::auth::e2b_api_key(&secret),
                TokenKind::Operator => None,
            },
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
        (status = 403, description = "not the operator, or an operator token revoked by other than the Unix socket", body = crate::error::ErrorEnvelope),
        (status = 404, description = "no such token, or already revoked", body = crate::error::ErrorEnvelope)))]
pub async fn revoke(
    State(state): State<Arc<AppState>>,
    p: Principal,
    Path(id): Path<String>,
) -> ApiResult<StatusCode> {
    operator_only(&p)?;
    let st = state.clone();
    let socket = p.is_socket_operator();
    let id2 = id.clone();
    let r = blocking(move || {
        st.store
            .revoke_token(&id2, socket)
            .map_err(ApiError::internal)
    })
    .await?;
    state.tenants.invalidate();
    let minted = match r {
        Revoke::Revoked { minted } => minted,
        Revoke::NotFound => return Err(ApiError::not_found(format!("no active token {id}"))),
        Revoke::OperatorToken => {
            return Err(socket_only(&p, "revoking an operator token").unwrap_err());
        }
    };
    tracing::info!(token = %id, minted, by = ?p.credential, "token revoked");
    Ok(StatusCode::NO_CONTENT)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(tenant: Option<&str>, operator: bool) -> CreateToken {
        CreateToken {
            tenant: tenant.map(str::to_string),
            name: None,
            operator,
        }
    }

    #[test]
    fn a_create_body_is_a_tenant_token_or_an_operator_token_never_both() {
        assert_eq!(plan(&body(Some("acme"), false)).unwrap(), TokenKind::Tenant);
        assert_eq!(plan(&body(None, true)).unwrap(), TokenKind::Operator);
        for (b, field) in [
            (body(Some("acme"), true), "tenant"),
            (body(None, false), "tenant"),
            (body(Some("*"), false), "tenant"),
        ] {
            let e = plan(&b).unwrap_err();
            assert_eq!(e.field.as_deref(), Some(field));
        }
    }
}
