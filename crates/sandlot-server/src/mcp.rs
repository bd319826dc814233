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
//!
//! A tenant holds at most [`MAX_SESSIONS_PER_TENANT`] sessions (a slot is reserved
//! before rmcp opens one) and has at most [`MAX_CALLS_PER_TENANT`] tool calls in
//! flight (each session at most [`sandlot_mcp::MAX_CALLS_PER_SESSION`]). A tool call
//! whose HTTP response goes away (the client disconnected) is cancelled.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Router};
use bytes::Bytes;
use http_body_util::BodyExt;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::session::SessionManager;
use rmcp::transport::streamable_http_server::StreamableHttpService;
use sandlot_client::{BoxError, Client, Dispatch, ReqBody, RespBody};
use sandlot_mcp::{ResponseGone, SandlotMcp, TenantCalls};
use tokio::sync::Semaphore;
use tokio_util::sync::{CancellationToken, DropGuard};
use tower::ServiceExt;

use crate::auth::{hash_token, Principal};
use crate::error::ApiError;
use crate::routes::ports::Proxied;

/// The header naming an MCP session.
const SESSION_HEADER: &str = "mcp-session-id";
/// Open MCP sessions a tenant may hold at once (each holds a task and buffers in
/// the daemon until it ends or is idle for five minutes).
pub const MAX_SESSIONS_PER_TENANT: usize = 32;
/// Tool calls a tenant may have in flight at once over all its sessions.
pub const MAX_CALLS_PER_TENANT: usize = 32;

/// The MCP front: the tools' HTTP service and the sessions' owners.
pub struct McpFront {
    service: StreamableHttpService<SandlotMcp, LocalSessionManager>,
    sessions: Arc<LocalSessionManager>,
    max_request_body: usize,
    books: Mutex<Books>,
}

#[derive(Default)]
struct Books {
    /// Session id → who opened it.
    owners: HashMap<String, Owner>,
    /// Tenant → initializes admitted whose session is not recorded yet.
    reserved: HashMap<String, usize>,
    /// Tenant → its tool calls in flight.
    calls: HashMap<String, Arc<Semaphore>>,
}

impl Books {
    fn held(&self, tenant: &str) -> usize {
        self.owners.values().filter(|o| o.tenant == tenant).count()
            + self.reserved.get(tenant).copied().unwrap_or(0)
    }

    fn unreserve(&mut self, tenant: &str) {
        if let Some(n) = self.reserved.get_mut(tenant) {
            *n -= 1;
            if *n == 0 {
                self.reserved.remove(tenant);
            }
        }
    }
}

/// A reserved session slot: [`Reservation::fulfil`] turns it into the session
/// it was for, and dropping it unfulfilled gives the slot back (no session was
/// opened).
struct Reservation {
    front: Arc<McpFront>,
    tenant: String,
    fulfilled: bool,
}

impl Reservation {
    /// Records session `id` as `owner`'s in the step that gives the reservation
    /// back: a session is never counted twice, as reserved and as open, by an
    /// initialize looking at the books in between.
    fn fulfil(mut self, id: String, owner: Owner) {
        let mut books = self.front.books();
        books.unreserve(&self.tenant);
        books.owners.insert(id, owner);
        self.fulfilled = true;
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if !self.fulfilled {
            self.front.books().unreserve(&self.tenant);
        }
    }
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
    /// `max_request_body`: the largest body of a request (`limits.max_request_body`).
    pub fn new(api: Router, max_request_body: usize) -> Arc<McpFront> {
        let dispatch: Arc<dyn Dispatch> = Arc::new(ApiDispatch(api));
        let (service, sessions) = sandlot_mcp::http_service(
            Arc::new(move |parts| {
                bearer(&parts.headers).map(|t| Client::in_process(dispatch.clone(), t))
            }),
            max_request_body,
        );
        Arc::new(McpFront {
            service,
            sessions,
            max_request_body,
            books: Mutex::new(Books::default()),
        })
    }

    fn books(&self) -> std::sync::MutexGuard<'_, Books> {
        self.books.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn tenant_calls(&self, tenant: &str) -> TenantCalls {
        let permits = self
            .books()
            .calls
            .entry(tenant.to_string())
            .or_insert_with(|| Arc::new(Semaphore::new(MAX_CALLS_PER_TENANT)))
            .clone();
        TenantCalls {
            permits,
            max: MAX_CALLS_PER_TENANT,
        }
    }

    /// Forgets the owners of sessions that ended (closed, or idle past their
    /// keep-alive).
    async fn forget_ended(&self) {
        let ids: Vec<String> = self.books().owners.keys().cloned().collect();
        for id in ids {
            let live = self
                .sessions
                .has_session(&Arc::<str>::from(id.as_str()))
                .await
                .unwrap_or(false);
            if !live {
                self.books().owners.remove(&id);
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
    if p.credential != crate::auth::Credential::Tenant {
        // Its tools are an agent's: an operator token (every tenant) is refused.
        return Err(ApiError::of(
            crate::error::ErrorCode::Forbidden,
            "/mcp takes a tenant's token, not an operator token",
        ));
    }
    let me = Owner {
        token_hash,
        tenant: p.tenant.clone(),
    };
    let session = req
        .headers()
        .get(SESSION_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let mut req = req;
    let mut reservation = None;
    match &session {
        Some(id) if front.books().owners.get(id) != Some(&me) => return Ok(session_not_found()),
        Some(_) => {}
        None if req.method() == Method::POST => {
            // Only an initialize opens a session: the cap applies to it alone.
            let (parts, body) = req.into_parts();
            let bytes = crate::body::read_limited(body, front.max_request_body as u64).await?;
            let initialize = is_initialize(&bytes);
            req = Request::from_parts(parts, Body::from(bytes));
            if initialize {
                front.forget_ended().await;
                let mut books = front.books();
                let held = books.held(&me.tenant);
                if held >= MAX_SESSIONS_PER_TENANT {
                    return Err(ApiError::quota(format!(
                        "tenant {} holds {held} MCP sessions, the most it may (end one with DELETE /mcp, or let it idle out)",
                        me.tenant
                    )));
                }
                *books.reserved.entry(me.tenant.clone()).or_default() += 1;
                drop(books);
                reservation = Some(Reservation {
                    front: front.clone(),
                    tenant: me.tenant.clone(),
                    fulfilled: false,
                });
            }
        }
        None => {}
    }
    let gone = CancellationToken::new();
    req.extensions_mut().insert(front.tenant_calls(&me.tenant));
    req.extensions_mut().insert(ResponseGone(gone.clone()));
    let resp = match reservation {
        // An initialize runs to its end in a task of its own: a client gone
        // meanwhile (this future dropped) cannot leave a session rmcp opened but
        // the books never recorded, uncounted for its whole idle time.
        Some(r) => {
            let f = front.clone();
            tokio::spawn(async move {
                let resp = f.service.handle(req).await;
                // Without a session opened, the reservation's drop gives the
                // slot back.
                if let Some(id) = opened_session(&resp) {
                    r.fulfil(id, me);
                }
                resp
            })
            .await
            .map_err(ApiError::internal)?
        }
        None => {
            let resp = front.service.handle(req).await;
            if let (None, Some(id)) = (&session, opened_session(&resp)) {
                // rmcp opened a session for a request not taken for an
                // initialize: never left open uncounted.
                tracing::warn!(
                    "closing an MCP session opened by a request not seen as an initialize"
                );
                let _ = front
                    .sessions
                    .close_session(&Arc::<str>::from(id.as_str()))
                    .await;
                return Err(ApiError::internal(
                    "an MCP session was opened outside the cap",
                ));
            }
            resp
        }
    };
    // An ended session (DELETE, or idle) stays recorded until the next initialize
    // finds rmcp no longer has it: a request naming it meanwhile gets rmcp's 404.
    let mut resp = resp.map(|b| {
        Body::new(Guarded {
            inner: b,
            _gone: gone.drop_guard(),
        })
    });
    // rmcp's own 4xx answers (406, 415, 404 for a session) are the protocol's:
    // the error middleware leaves them as they are.
    resp.extensions_mut().insert(Proxied);
    Ok(resp)
}

/// The session an answer of rmcp names (a new one, for an initialize).
fn opened_session<B>(resp: &http::Response<B>) -> Option<String> {
    resp.headers()
        .get(SESSION_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}

/// Whether a request body is an `initialize` request (alone or in a batch).
fn is_initialize(body: &[u8]) -> bool {
    let is = |v: &serde_json::Value| v.get("method").and_then(|m| m.as_str()) == Some("initialize");
    match serde_json::from_slice::<serde_json::Value>(body) {
        Ok(serde_json::Value::Array(a)) => a.iter().any(is),
        Ok(v) => is(&v),
        Err(_) => false,
    }
}

/// A response body that cancels its request's tool call when dropped (the
/// response was sent, or its client went away).
struct Guarded<B> {
    inner: B,
    _gone: DropGuard,
}

impl<B> http_body::Body for Guarded<B>
where
    B: http_body::Body<Data = Bytes> + Unpin,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, B::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// The answer to a request naming a session its caller did not open: the same as
/// for one that does not exist.
fn session_not_found() -> Response {
    let mut r = (StatusCode::NOT_FOUND, "Not Found: Session not found").into_response();
    r.extensions_mut().insert(Proxied);
    r
}
