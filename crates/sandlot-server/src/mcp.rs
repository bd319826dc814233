//! `/mcp` on the API's TCP listener: the MCP tools of `sandlot-mcp` over streamable
//! HTTP. A request is admitted with a tenant's bearer token, as every API request
//! is; the tools then call the API in this process, through the same router as a
//! TCP request and with the caller's own `Authorization` header, so every rule of
//! the API (tenant scope, quotas, limits, audit) applies to them unchanged. They
//! never go through the operator's socket, whose callers are the operator.
//!
//! An MCP session is bound to the token that opened it: a request naming a session
//! opened with another token is answered as for an unknown session (404), so a
//! session id seen by someone else lets them neither read its stream nor end it.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Router};
use http_body_util::BodyExt;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::session::SessionManager;
use rmcp::transport::streamable_http_server::StreamableHttpService;
use sandlot_client::{BoxError, Client, Dispatch, ReqBody, RespBody};
use sandlot_mcp::SandlotMcp;
use tower::ServiceExt;

use crate::auth::{hash_token, Principal};
use crate::error::ApiError;
use crate::routes::ports::Proxied;

/// The header naming an MCP session.
const SESSION_HEADER: &str = "mcp-session-id";
/// Open MCP sessions a tenant may hold at once (each holds a task and buffers in
/// the daemon until it ends or is idle for five minutes).
pub const MAX_SESSIONS_PER_TENANT: usize = 32;

/// The MCP front: the tools' HTTP service and the sessions' owners.
pub struct McpFront {
    service: StreamableHttpService<SandlotMcp, LocalSessionManager>,
    sessions: Arc<LocalSessionManager>,
    /// Session id → who opened it.
    owners: Mutex<HashMap<String, Owner>>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Owner {
    token_hash: String,
    tenant: String,
}

/// The API router, called in this process.
struct ApiDispatch(Router);

impl Dispatch for ApiDispatch {
    fn dispatch(
        &self,
        req: http::Request<ReqBody>,
    ) -> Pin<Box<dyn Future<Output = http::Response<RespBody>> + Send>> {
        let router = self.0.clone();
        Box::pin(async move {
            let resp = match router.oneshot(req).await {
                Ok(r) => r,
                Err(never) => match never {},
            };
            resp.map(|b| b.map_err(|e| Box::new(e) as BoxError).boxed_unsync())
        })
    }
}

/// The bearer token of a request head, if any.
fn bearer(headers: &HeaderMap) -> Option<String> {
    let v = headers
        .get(axum::http::header::AUTHORIZATION)?
        .to_str()
        .ok()?;
    let t = v
        .strip_prefix("Bearer ")
        .or_else(|| v.strip_prefix("bearer "))?;
    Some(t.trim().to_string()).filter(|t| !t.is_empty())
}

impl McpFront {
    /// The front over `api`: the API router of the TCP listener (without `/mcp`).
    pub fn new(api: Router) -> Arc<McpFront> {
        let dispatch: Arc<dyn Dispatch> = Arc::new(ApiDispatch(api));
        let (service, sessions) = sandlot_mcp::http_service(Arc::new(move |parts| {
            bearer(&parts.headers).map(|t| Client::in_process(dispatch.clone(), t))
        }));
        Arc::new(McpFront {
            service,
            sessions,
            owners: Mutex::new(HashMap::new()),
        })
    }

    fn owners(&self) -> std::sync::MutexGuard<'_, HashMap<String, Owner>> {
        self.owners.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Forgets the owners of sessions that ended (closed, or idle past their
    /// keep-alive).
    async fn forget_ended(&self) {
        let ids: Vec<String> = self.owners().keys().cloned().collect();
        for id in ids {
            let live = self
                .sessions
                .has_session(&Arc::<str>::from(id.as_str()))
                .await
                .unwrap_or(false);
            if !live {
                self.owners().remove(&id);
            }
        }
    }
}

/// `GET`, `POST` and `DELETE /mcp`.
pub async fn handle(
    Extension(front): Extension<Arc<McpFront>>,
    p: Principal,
    req: Request,
) -> Result<Response, ApiError> {
    let token_hash = bearer(req.headers())
        .map(|t| hash_token(&t))
        .ok_or_else(|| ApiError::unauthorized("/mcp takes a tenant's bearer token"))?;
    let me = Owner {
        token_hash,
        tenant: p.tenant.clone(),
    };
    let session = req
        .headers()
        .get(SESSION_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    match &session {
        Some(id) if front.owners().get(id) != Some(&me) => return Ok(session_not_found()),
        Some(_) => {}
        None if req.method() == Method::POST => {
            front.forget_ended().await;
            let held = front
                .owners()
                .values()
                .filter(|o| o.tenant == me.tenant)
                .count();
            if held >= MAX_SESSIONS_PER_TENANT {
                return Err(ApiError::quota(format!(
                    "tenant {} holds {held} MCP sessions, the most it may (end one with DELETE /mcp, or let it idle out)",
                    me.tenant
                )));
            }
        }
        None => {}
    }
    let method = req.method().clone();
    let resp = front.service.handle(req).await;
    let opened = resp
        .headers()
        .get(SESSION_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    if let (None, Some(id)) = (&session, opened) {
        front.owners().insert(id, me);
    }
    if let (true, Some(id)) = (method == Method::DELETE, &session) {
        if resp.status().is_success() {
            front.owners().remove(id);
        }
    }
    let mut resp = resp.map(Body::new);
    // rmcp's own 4xx answers (406, 415, 404 for a session) are the protocol's:
    // the error middleware leaves them as they are.
    resp.extensions_mut().insert(Proxied);
    Ok(resp)
}

/// The answer to a request naming a session its caller did not open: the same as
/// for one that does not exist.
fn session_not_found() -> Response {
    let mut r = (StatusCode::NOT_FOUND, "Not Found: Session not found").into_response();
    r.extensions_mut().insert(Proxied);
    r
}
