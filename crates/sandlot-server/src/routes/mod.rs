//! The HTTP API v1: router, request context (request ids, error rendering,
//! metrics), and strict body extractors. Handlers are thin: they validate, look
//! the sandbox up for the caller, and call the sandbox, process or guest layer.

use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use tracing::Instrument;

use crate::auth::{Principal, Transport};
pub use crate::body::{from_value, parse_json, read_limited, JsonBody};
use crate::error::{for_status, ApiError, ApiResult, ErrorCode, PendingError};
use crate::state::AppState;

pub use crate::services::sandboxes::{live, lookup};

pub mod checkpoints;
pub mod code;
pub mod exec;
pub mod files;
pub mod images;
pub mod memory;
pub mod metrics;
pub mod network;
pub mod ports;
pub mod sandboxes;
pub mod secrets;
pub mod snapshots;
pub mod stream;
pub mod tenants;
pub mod tokens;
pub mod vfs;
pub mod volumes;

/// The id of the current request.
#[derive(Debug, Clone)]
pub struct RequestId(pub String);

/// Builds the router for one listener. The TCP listener's also serves `/mcp`
/// (`crate::mcp`), whose tools call the same router without it.
pub fn router(state: Arc<AppState>, transport: Transport) -> Router {
    let mcp = match transport {
        Transport::Tcp => Some(crate::mcp::McpFront::new(
            api_router(state.clone(), transport, None),
            state.cfg.limits.max_request_body.bytes() as usize,
        )),
        Transport::Unix => None,
    };
    let api = api_router(state, transport, mcp.clone());
    match mcp {
        // The web console (`crate::console`) is served where its browser signs in
        // with a token: the TCP listener.
        Some(_) => crate::console::router().merge(api),
        None => api,
    }
}

fn api_router(
    state: Arc<AppState>,
    transport: Transport,
    mcp: Option<Arc<crate::mcp::McpFront>>,
) -> Router {
    let sb = "/v1/sandboxes/{id}";
    let mut r = Router::new();
    if let Some(front) = mcp {
        r = r.route(
            "/mcp",
            axum::routing::any(crate::mcp::handle).layer(axum::Extension(front)),
        );
    }
    r.route("/v1/health", get(sandboxes::health))
        .route("/v1/openapi.json", get(openapi_json))
        .route("/metrics", get(metrics))
        .route(
            "/v1/sandboxes",
            post(sandboxes::create).get(sandboxes::list),
        )
        .route(sb, get(sandboxes::get_one).delete(sandboxes::delete))
        .route(&format!("{sb}/timeout"), post(sandboxes::set_timeout))
        .route(&format!("{sb}/pause"), post(sandboxes::pause))
        .route(&format!("{sb}/resume"), post(sandboxes::resume))
        .route(
            &format!("{sb}/checkpoints"),
            post(checkpoints::create).get(checkpoints::list),
        )
        .route(
            &format!("{sb}/checkpoints/{{cp}}"),
            axum::routing::delete(checkpoints::delete),
        )
        .route(
            &format!("{sb}/checkpoints/{{cp}}/restore"),
            post(checkpoints::restore),
        )
        .route(
            &format!("{sb}/checkpoints/{{cp}}/diff"),
            get(checkpoints::diff),
        )
        .route(&format!("{sb}/fork"), post(checkpoints::fork))
        .route(&format!("{sb}/snapshots"), post(snapshots::create))
        .route("/v1/snapshots", get(snapshots::list))
        .route(
            "/v1/snapshots/{sn}",
            get(snapshots::get_one).delete(snapshots::delete),
        )
        .route("/v1/snapshots/{sn}/sandboxes", post(snapshots::start))
        .route(&format!("{sb}/events"), get(sandboxes::events))
        .route(&format!("{sb}/metrics"), get(metrics::get))
        .route(&format!("{sb}/exec"), post(exec::start))
        .route(&format!("{sb}/exec/ws"), get(exec::start_ws))
        .route(&format!("{sb}/processes"), get(exec::list))
        .route(&format!("{sb}/processes/{{pid}}"), get(exec::get_one))
        .route(&format!("{sb}/processes/{{pid}}/output"), get(exec::output))
        .route(&format!("{sb}/processes/{{pid}}/ws"), get(exec::attach_ws))
        .route(&format!("{sb}/processes/{{pid}}/stdin"), post(exec::stdin))
        .route(
            &format!("{sb}/processes/{{pid}}/stdin/close"),
            post(exec::stdin_close),
        )
        .route(
            &format!("{sb}/processes/{{pid}}/signal"),
            post(exec::signal),
        )
        .route(
            &format!("{sb}/processes/{{pid}}/resize"),
            post(exec::resize),
        )
        .route(&format!("{sb}/processes/{{pid}}/wait"), get(exec::wait))
        .route(
            &format!("{sb}/files"),
            get(files::read).put(files::write).delete(files::remove),
        )
        .route(&format!("{sb}/files/stat"), get(files::stat))
        .route(&format!("{sb}/files/list"), get(files::list))
        .route(&format!("{sb}/files/mkdir"), post(files::mkdir))
        .route(&format!("{sb}/files/rename"), post(files::rename))
        .route(&format!("{sb}/files/watch"), get(files::watch))
        .route(
            &format!("{sb}/files/tar"),
            get(files::tar_download).put(files::tar_upload),
        )
        .merge(code_router())
        .merge(images_router())
        .merge(network_router())
        .merge(memory::router())
        .merge(ports_router())
        .merge(vfs_router())
        .fallback(fallback)
        .layer(DefaultBodyLimit::disable())
        .layer(middleware::from_fn_with_state(
            state.clone(),
            request_context,
        ))
        .layer(axum::Extension(transport))
        .layer(middleware::from_fn(crate::request_body::finish_unread))
        .with_state(state)
}

/// Code contexts (`code.rs`).
fn code_router() -> Router<Arc<AppState>> {
    let c = "/v1/sandboxes/{id}/contexts";
    Router::new()
        .route(c, post(code::create).get(code::list))
        .route(
            &format!("{c}/{{ctx}}"),
            get(code::get_one).delete(code::remove),
        )
        .route(&format!("{c}/{{ctx}}/restart"), post(code::restart))
        .route(&format!("{c}/{{ctx}}/interrupt"), post(code::interrupt))
        .route(&format!("{c}/{{ctx}}/run"), post(code::run))
        .route(&format!("{c}/{{ctx}}/run/ws"), get(code::run_ws))
}

/// Network policy and egress audit log (`network.rs`).
fn network_router() -> Router<Arc<AppState>> {
    Router::new()
        .route(
            "/v1/sandboxes/{id}/network",
            get(network::get_policy).put(network::put_policy),
        )
        .route("/v1/sandboxes/{id}/network/log", get(network::get_log))
}

/// Inbound: the HTTP/WebSocket proxy and published TCP ports (`ports.rs`).
fn ports_router() -> Router<Arc<AppState>> {
    use axum::routing::any;
    let p = "/v1/sandboxes/{id}/ports";
    Router::new()
        .route(p, get(ports::list).post(ports::publish))
        .route(
            &format!("{p}/{{port}}"),
            axum::routing::delete(ports::unpublish).fallback(ports::add_slash),
        )
        .route(&format!("{p}/{{port}}/"), any(ports::proxy))
        .route(&format!("{p}/{{port}}/{{*path}}"), any(ports::proxy))
}

/// Virtual filesystem collections and shell sessions (`vfs.rs`).
fn vfs_router() -> Router<Arc<AppState>> {
    let c = "/v1/vfs/{collection}";
    let s = "/v1/vfs/{collection}/sessions/{sid}";
    Router::new()
        .route("/v1/vfs", post(vfs::create).get(vfs::list))
        .route(c, get(vfs::get_one).delete(vfs::remove))
        .route(&format!("{c}/ingest"), post(vfs::ingest))
        .route(&format!("{c}/audit"), get(vfs::audit))
        .route(&format!("{c}/sessions"), post(vfs::open_session))
        .route(s, get(vfs::get_session).delete(vfs::close_session))
        .route(&format!("{s}/run"), post(vfs::run))
}

/// Images, snapshots, volumes, secrets and tokens (`images.rs`, `volumes.rs`,
/// `secrets.rs`, `tokens.rs`).
fn images_router() -> Router<Arc<AppState>> {
    use axum::routing::delete;
    Router::new()
        .route("/v1/images", get(images::list))
        .route("/v1/images/prune", post(images::prune))
        .route("/v1/images/import", post(images::import))
        .route("/v1/images/export", get(images::export))
        .route("/v1/images/diff", get(images::diff))
        .route("/v1/images/pull", post(images::pull))
        .route("/v1/images/build", post(images::build))
        .route(
            "/v1/images/{*reference}",
            get(images::inspect)
                .delete(images::remove)
                .post(images::post_on_image),
        )
        .route("/v1/sandboxes/{id}/snapshot", post(images::snapshot))
        .route("/v1/volumes", post(volumes::create).get(volumes::list))
        .route(
            "/v1/volumes/{name}",
            get(volumes::get_one).delete(volumes::remove),
        )
        .route("/v1/secrets", post(secrets::create).get(secrets::list))
        .route("/v1/secrets/{name}", delete(secrets::remove))
        .route("/v1/tokens", post(tokens::create).get(tokens::list))
        .route("/v1/tenants", get(tenants::list))
        .route("/v1/tokens/{id}", delete(tokens::revoke))
}

async fn fallback() -> ApiError {
    ApiError::not_found("no such route")
}

async fn openapi_json() -> Response {
    (
        [(header::CONTENT_TYPE, "application/json")],
        crate::openapi::json(),
    )
        .into_response()
}

/// `GET /metrics`: the daemon's series cover every tenant (sandboxes, creates,
/// errors, pools), so they are the operator's: a tenant (a token, or the operator
/// acting as a tenant) is refused.
async fn metrics(State(state): State<Arc<AppState>>, p: Principal) -> ApiResult<Response> {
    // 403 `permission_denied`, as documented for `/metrics` (a Prometheus
    // scraper has the metrics_listen address instead).
    crate::auth::require_operator(&p, "/metrics (it covers every tenant)")
        .map_err(|e| ApiError::of(ErrorCode::PermissionDenied, e.message))?;
    Ok(metrics_response(&state))
}

/// The Prometheus text of the whole daemon.
fn metrics_response(state: &AppState) -> Response {
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], {
        let mut text = state.metrics.render();
        state.pools.render(&mut text);
        crate::metrics::render_teardowns(&mut text, state.teardowns.pending());
        let (cgroups, netns) = state.backends.available().fold((0, 0), |(c, n), b| {
            let s = b.stock();
            (c + s.cgroups, n + s.netns)
        });
        crate::metrics::render_stocks(&mut text, cgroups, netns);
        state.inbound.render(&mut text);
        let egress = match state.net.get() {
            Some(Ok(svc)) => svc.stats(),
            _ => sandlot_net::EgressSnapshot {
                descriptors_cap: state.egress_descriptors.cap(),
                ..Default::default()
            },
        };
        crate::metrics::render_egress(&mut text, &egress);
        crate::metrics::render_descriptors(
            &mut text,
            &state.descriptors,
            state.inbound.descriptors().0,
            egress.descriptors_held,
        );
        text
    })
        .into_response()
}

/// The router of `metrics_listen`: `GET /metrics` and nothing else, without
/// authentication (the operator binds it where only the scraper reaches).
pub fn metrics_router(state: Arc<AppState>) -> Router {
    Router::new()
        .route(
            "/metrics",
            get(|State(state): State<Arc<AppState>>| async move { metrics_response(&state) }),
        )
        .fallback(|| async { (StatusCode::NOT_FOUND, "only /metrics is served here\n") })
        .with_state(state)
}

/// A new request id (`req_` and hex digits).
pub(crate) fn request_id() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::OnceLock;
    static PREFIX: OnceLock<String> = OnceLock::new();
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let p = PREFIX.get_or_init(|| crate::auth::random_hex(4));
    format!("req_{p}{:08x}", SEQ.fetch_add(1, Ordering::Relaxed))
}

/// Gives every request an id (header `x-request-id`, log span), renders errors in
/// the API's JSON shape, logs 5xx details, and counts errors by code.
async fn request_context(
    State(state): State<Arc<AppState>>,
    mut req: Request,
    next: Next,
) -> Response {
    let rid = request_id();
    req.extensions_mut().insert(RequestId(rid.clone()));
    let span = tracing::info_span!("request", request_id = %rid, method = %req.method(), path = %req.uri().path());
    let mut resp = next.run(req).instrument(span.clone()).await;
    state
        .metrics
        .requests_total
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let pending = resp.extensions_mut().remove::<PendingError>();
    let status = resp.status();
    let proxied = resp.extensions().get::<ports::Proxied>().is_some();
    let err = match pending {
        // The proxied application's own answer, whatever its status.
        None if proxied => None,
        Some(PendingError(e)) => Some((*e).clone()),
        None if status.is_client_error() || status.is_server_error() => {
            let is_json = resp
                .headers()
                .get(header::CONTENT_TYPE)
                .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
            (!is_json).then(|| for_status(status))
        }
        None => None,
    };
    if let Some(e) = err {
        state.metrics.error(e.code.as_str());
        span.in_scope(|| {
            if e.status.is_server_error() {
                tracing::error!(
                    status = e.status.as_u16(),
                    code = e.code.as_str(),
                    detail = %one_line(e.internal.as_deref().unwrap_or("")),
                    "{}",
                    one_line(&e.message)
                );
            } else if let Some(detail) = &e.internal {
                tracing::info!(status = e.status.as_u16(), code = e.code.as_str(), detail = %one_line(detail), "{}", one_line(&e.message));
            } else {
                // Every answered error has a line with its request id: the id a
                // client reports finds what the daemon said and why.
                tracing::info!(status = e.status.as_u16(), code = e.code.as_str(), "{}", one_line(&e.message));
            }
        });
        let body = serde_json::to_vec(&e.body(&rid)).expect("error bodies serialize");
        let mut r = (e.status, [(header::CONTENT_TYPE, "application/json")], body).into_response();
        for h in [header::RETRY_AFTER, header::ALLOW] {
            if let Some(v) = resp.headers().get(&h) {
                r.headers_mut().insert(h, v.clone());
            }
        }
        resp = r;
    }
    if let Ok(v) = HeaderValue::from_str(&rid) {
        resp.headers_mut().insert("x-request-id", v);
    }
    resp
}

/// A JSON response with a status.
pub fn json_status<T: serde::Serialize>(status: StatusCode, v: &T) -> Response {
    (status, axum::Json(v)).into_response()
}

/// A WebSocket upgrade whose messages (a run or exec request, a chunk of stdin)
/// and frames are no larger than a request body (`limits.max_request_body`), or
/// 64 KiB where that is smaller (the Rust client's stdin messages): the daemon
/// buffers a message whole before it reads it.
pub(crate) fn bounded_ws(
    ws: axum::extract::ws::WebSocketUpgrade,
    state: &AppState,
) -> axum::extract::ws::WebSocketUpgrade {
    let limit = usize::try_from(state.cfg.limits.max_request_body.bytes())
        .unwrap_or(usize::MAX)
        .max(64 * 1024);
    ws.max_message_size(limit).max_frame_size(limit)
}

/// `s` with its control characters escaped (`\n` as the two characters `\` `n`):
/// an error message may carry a request's decoded path segment, and a text log
/// line must stay one line (a `%0A` in a path would otherwise write a line of
/// its own choosing into the daemon's log).
pub(crate) fn one_line(s: &str) -> std::borrow::Cow<'_, str> {
    if !s.chars().any(char::is_control) {
        return s.into();
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out.into()
}

#[cfg(test)]
mod one_line_tests {
    use super::one_line;

    #[test]
    fn an_error_logged_from_a_request_stays_on_one_line() {
        assert_eq!(one_line("no sandbox x"), "no sandbox x");
        let forged = one_line("no sandbox x\nINFO forged line\r\u{1b}[2J");
        assert!(!forged.contains(['\n', '\r', '\u{1b}']), "{forged}");
        assert_eq!(forged, "no sandbox x\\nINFO forged line\\r\\u{1b}[2J");
        assert_eq!(one_line("é ü"), "é ü");
    }
}
