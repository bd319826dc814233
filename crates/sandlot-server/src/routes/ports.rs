//! `/v1/sandboxes/{id}/ports`: inbound traffic. The HTTP and WebSocket proxy to
//! a port inside the sandbox (`/ports/{port}/{*path}`, any method, bodies
//! streamed both ways, upgrades tunnelled), and raw TCP ports published on the
//! host (`POST`/`GET /ports`, `DELETE /ports/{port}`). See `crate::ports`.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{ConnectInfo, Path, Request, State};
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, StatusCode, Version};
use axum::response::{IntoResponse, Response};
use axum::Json;
use http_body_util::BodyExt;
use hyper_util::rt::TokioIo;
use sandlot_proto::api::ports::{PortList, PublishPort, PublishedPort};
use tracing::Instrument;

use crate::auth::Principal;
use crate::error::{ApiError, ApiResult, ErrorCode};
use crate::ports::{dial, parse_port_segment};
use crate::routes::{json_status, lookup, JsonBody};
use crate::state::AppState;

/// Marks a response as the sandbox's own: the error middleware leaves a 4xx or
/// 5xx of the proxied application as it is.
#[derive(Debug, Clone, Copy)]
pub struct Proxied;

/// Headers of the connection, not of the message (RFC 9110 7.6.1); never forwarded.
const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// Headers the proxy sets itself or must not forward: the Sandlot credentials
/// and any forwarding headers a client made up (`X-Real-IP` included, which
/// applications behind nginx trust like `X-Forwarded-For`).
const STRIPPED: &[&str] = &[
    "authorization",
    crate::auth::TENANT_HEADER,
    "x-real-ip",
    "x-forwarded-for",
    "x-forwarded-proto",
    "x-forwarded-host",
    "x-forwarded-prefix",
    "x-forwarded-port",
    "forwarded",
    "host",
];

fn param<'a>(params: &'a [(String, String)], name: &str) -> &'a str {
    params
        .iter()
        .find(|(k, _)| k == name)
        .map_or("", |(_, v)| v.as_str())
}

fn port_param(params: &[(String, String)]) -> ApiResult<u16> {
    parse_port_segment("port", param(params, "port"))
}

/// `id` and `port` of `/v1/sandboxes/{id}/ports/{port}...` (percent-decoded).
fn uri_params(path: &str) -> Vec<(String, String)> {
    let seg: Vec<&str> = path.splitn(7, '/').collect();
    let get = |i: usize| seg.get(i).map_or(String::new(), |s| percent_decode(s));
    vec![("id".to_string(), get(3)), ("port".to_string(), get(5))]
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            if let Ok(v) = u8::from_str_radix(&s[i + 1..i + 3], 16) {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn id_param(params: &[(String, String)]) -> String {
    param(params, "id").to_string()
}

/// Removes hop-by-hop headers, including those the `Connection` header names.
fn strip_hop_by_hop(h: &mut HeaderMap, keep_upgrade: bool) {
    let named: Vec<HeaderName> = h
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|t| HeaderName::from_bytes(t.trim().as_bytes()).ok())
        .collect();
    for n in named {
        if !(keep_upgrade && n == header::UPGRADE) {
            h.remove(n);
        }
    }
    for n in HOP_BY_HOP {
        if keep_upgrade && (*n == "upgrade" || *n == "connection") {
            continue;
        }
        h.remove(*n);
    }
}

fn wants_upgrade(h: &HeaderMap) -> bool {
    h.contains_key(header::UPGRADE)
        && h.get_all(header::CONNECTION).iter().any(|v| {
            v.to_str().is_ok_and(|v| {
                v.split(',')
                    .any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
            })
        })
}

/// Counts the data bytes of a body into one of the proxy's metrics as they pass.
fn counted<B>(body: B, state: Arc<AppState>, to_sandbox: bool) -> Body
where
    B: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    B::Error: Into<axum::BoxError>,
{
    Body::new(body.map_frame(move |f| {
        if let Some(d) = f.data_ref() {
            let m = &state.metrics.ports;
            let c = if to_sandbox {
                &m.bytes_to_sandbox
            } else {
                &m.bytes_from_sandbox
            };
            c.fetch_add(d.len() as u64, Ordering::Relaxed);
        }
        f
    }))
}

/// `ANY /v1/sandboxes/{id}/ports/{port}/{*path}`: proxies one HTTP request (or
/// WebSocket) to `port` on the sandbox's loopback.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/ports/{port}/{path}", tag = "ports",
    description = "Any method. Proxies the request to `port` on the sandbox's loopback \
        (in its own network namespace, whatever the network mode), with the query string, \
        streamed bodies and WebSocket upgrades. `Authorization` is stripped; \
        `X-Forwarded-For/Proto/Host/Prefix` are set. The answer is the application's.",
    params(("id" = String, Path, description = "Sandbox id or name"),
        ("port" = u16, Path, description = "Port inside the sandbox (1 to 65535)"),
        ("path" = String, Path, description = "Path forwarded to the application")),
    responses((status = 200, description = "The application's answer (any status)"),
        (status = 400, body = crate::error::ErrorEnvelope, description = "bad port"),
        (status = 404, body = crate::error::ErrorEnvelope),
        (status = 409, body = crate::error::ErrorEnvelope, description = "sandbox not running"),
        (status = 502, body = crate::error::ErrorEnvelope, description = "nothing listening on the port"),
        (status = 504, body = crate::error::ErrorEnvelope, description = "the port did not accept in time")))]
pub async fn proxy(
    State(state): State<Arc<AppState>>,
    p: Principal,
    mut req: Request,
) -> ApiResult<Response> {
    let params = uri_params(req.uri().path());
    let port = port_param(&params)?;
    let id = id_param(&params);
    let h = crate::autopause::live(&state, &p, &id).await?;
    let m = &state.metrics.ports;
    m.http_requests.fetch_add(1, Ordering::Relaxed);
    h.touch();

    // The path after `/ports/{port}` exactly as the client encoded it.
    let raw = req.uri().path().to_string();
    let mut seg = raw.splitn(7, '/');
    let prefix = seg.by_ref().take(6).collect::<Vec<_>>().join("/");
    let rest = seg.next().unwrap_or("");
    let target = match req.uri().query() {
        Some(q) => format!("/{rest}?{q}"),
        None => format!("/{rest}"),
    };

    let upgrade = wants_upgrade(req.headers());
    let client_upgrade = upgrade.then(|| hyper::upgrade::on(&mut req));
    let peer = req
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0.ip());
    let (parts, body) = req.into_parts();
    // The answer goes out in the client's HTTP version, whatever the application's
    // (an HTTP/1.0 status line must not reach an HTTP/1.1 client).
    let client_version = parts.version;
    let orig_host = parts.headers.get(header::HOST).cloned();

    let mut headers = parts.headers;
    strip_hop_by_hop(&mut headers, upgrade);
    for n in STRIPPED {
        headers.remove(*n);
    }
    crate::auth::strip_websocket_bearer(&mut headers);
    let hv = |s: &str| HeaderValue::from_str(s).ok();
    if let Some(v) = hv(&format!("localhost:{port}")) {
        headers.insert(header::HOST, v);
    }
    if let Some(ip) = peer {
        if let Some(v) = hv(&ip.to_string()) {
            headers.insert("x-forwarded-for", v.clone());
            headers.insert("x-real-ip", v);
        }
    }
    headers.insert("x-forwarded-proto", HeaderValue::from_static("http"));
    if let Some(v) = orig_host {
        headers.insert("x-forwarded-host", v);
    }
    if let Some(v) = hv(&prefix) {
        headers.insert("x-forwarded-prefix", v);
    }

    let mut up_req = axum::http::Request::builder()
        .method(parts.method)
        .uri(&target)
        .version(Version::HTTP_11)
        .body(counted(body, state.clone(), true))
        .map_err(|e| ApiError::invalid("path", format!("cannot forward {target:?}: {e}")))?;
    *up_req.headers_mut() = headers;

    let stream = match dial(&h, port).await {
        Ok(s) => s,
        Err(e) => {
            m.dial_failures.fetch_add(1, Ordering::Relaxed);
            return Err(e.to_api(&h.id));
        }
    };
    let _ = stream.set_nodelay(true);
    let (mut sender, conn) = hyper::client::conn::http1::Builder::new()
        .handshake::<_, Body>(TokioIo::new(stream))
        .await
        .map_err(|e| bad_gateway(&h.id, port, &e))?;
    tokio::spawn(
        async move {
            if let Err(e) = conn.with_upgrades().await {
                tracing::debug!("proxied connection: {e}");
            }
        }
        .in_current_span(),
    );
    let mut resp = sender
        .send_request(up_req)
        .await
        .map_err(|e| bad_gateway(&h.id, port, &e))?;

    if resp.status() == StatusCode::SWITCHING_PROTOCOLS {
        let Some(client_upgrade) = client_upgrade else {
            return Err(ApiError::of(
                ErrorCode::BadGateway,
                format!("port {port} of sandbox {} switched protocols unasked", h.id),
            ));
        };
        let app_upgrade = hyper::upgrade::on(&mut resp);
        m.upgrades.fetch_add(1, Ordering::Relaxed);
        let (st, h2) = (state.clone(), h.clone());
        tokio::spawn(
            async move {
                let _active = h2.active();
                let (c, a) = match tokio::try_join!(client_upgrade, app_upgrade) {
                    Ok(v) => v,
                    Err(e) => {
                        tracing::debug!("upgrade through the proxy: {e}");
                        return;
                    }
                };
                let (mut c, mut a) = (TokioIo::new(c), TokioIo::new(a));
                let mut stopped = h2.stopped_signal();
                tokio::select! {
                    r = tokio::io::copy_bidirectional(&mut c, &mut a) => {
                        if let Ok((to, from)) = r {
                            st.metrics.ports.bytes_to_sandbox.fetch_add(to, Ordering::Relaxed);
                            st.metrics.ports.bytes_from_sandbox.fetch_add(from, Ordering::Relaxed);
                        }
                    }
                    _ = async { stopped.wait_for(|s| *s).await.is_ok() } => {}
                }
            }
            .in_current_span(),
        );
        let (mut rp, _) = resp.into_parts();
        rp.version = client_version;
        rp.extensions.clear();
        rp.extensions.insert(Proxied);
        return Ok(Response::from_parts(rp, Body::empty()));
    }

    let (mut rp, body) = resp.into_parts();
    rp.version = client_version;
    strip_hop_by_hop(&mut rp.headers, false);
    confine_to_sandbox_origin(&mut rp.headers);
    rp.extensions.clear();
    rp.extensions.insert(Proxied);
    let body = counted(body, state.clone(), false);
    Ok(Response::from_parts(rp, body))
}

/// What a sandbox's application answers is served on the API's origin (the web
/// console's too). So that nothing it sends acts on that origin in a browser,
/// whatever reaches it (an operator's front proxy adding `Authorization`, an
/// extension), its documents are sandboxed (an opaque origin: no storage, no
/// service worker, no script access to the console), and the headers that act
/// on the whole origin are dropped.
pub fn confine_to_sandbox_origin(headers: &mut axum::http::HeaderMap) {
    for name in ["service-worker-allowed", "clear-site-data"] {
        headers.remove(name);
    }
    headers.insert(
        axum::http::header::CONTENT_SECURITY_POLICY,
        axum::http::HeaderValue::from_static(
            "sandbox allow-scripts allow-forms allow-popups allow-modals allow-downloads",
        ),
    );
}

fn bad_gateway(id: &str, port: u16, e: &hyper::Error) -> ApiError {
    ApiError::of(
        ErrorCode::BadGateway,
        format!("port {port} of sandbox {id} did not answer HTTP: {e}"),
    )
}

/// `/v1/sandboxes/{id}/ports/{port}` without the final slash: a permanent
/// redirect to it, so that relative links of the application resolve.
pub async fn add_slash(
    State(state): State<Arc<AppState>>,
    p: Principal,
    req: Request,
) -> ApiResult<Response> {
    let params = uri_params(req.uri().path());
    port_param(&params)?;
    lookup(&state, &p, &id_param(&params))?;
    let loc = match req.uri().query() {
        Some(q) => format!("{}/?{q}", req.uri().path()),
        None => format!("{}/", req.uri().path()),
    };
    Ok((
        StatusCode::PERMANENT_REDIRECT,
        [(header::LOCATION, loc)],
        Body::empty(),
    )
        .into_response())
}

#[utoipa::path(post, path = "/v1/sandboxes/{id}/ports", tag = "ports",
    params(("id" = String, Path, description = "Sandbox id or name")),
    request_body = PublishPort,
    responses((status = 201, body = PublishedPort),
        (status = 400, body = crate::error::ErrorEnvelope, description = "bad port, host port or bind address (the field is named)"),
        (status = 404, body = crate::error::ErrorEnvelope),
        (status = 409, body = crate::error::ErrorEnvelope, description = "already published, host port in use, publishing disabled, or sandbox not running"),
        (status = 429, body = crate::error::ErrorEnvelope, description = "the tenant's limit of published ports")))]
pub async fn publish(
    State(state): State<Arc<AppState>>,
    p: Principal,
    Path(id): Path<String>,
    JsonBody(req): JsonBody<PublishPort>,
) -> ApiResult<Response> {
    let h = crate::autopause::live(&state, &p, &id).await?;
    let info = crate::ports::publish(&state, &h, &req).await?;
    Ok(json_status(StatusCode::CREATED, &info))
}

#[utoipa::path(get, path = "/v1/sandboxes/{id}/ports", tag = "ports",
    params(("id" = String, Path, description = "Sandbox id or name")),
    responses((status = 200, body = PortList), (status = 404, body = crate::error::ErrorEnvelope)))]
pub async fn list(
    State(state): State<Arc<AppState>>,
    p: Principal,
    Path(id): Path<String>,
) -> ApiResult<Json<PortList>> {
    let rec = lookup(&state, &p, &id)?;
    Ok(Json(PortList {
        ports: state.published.list(&rec.id),
    }))
}

#[utoipa::path(delete, path = "/v1/sandboxes/{id}/ports/{port}", tag = "ports",
    params(("id" = String, Path, description = "Sandbox id or name"),
        ("port" = u16, Path, description = "Port inside the sandbox")),
    responses((status = 204, description = "The host listener is closed"),
        (status = 400, body = crate::error::ErrorEnvelope),
        (status = 404, body = crate::error::ErrorEnvelope, description = "no such sandbox, or the port is not published")))]
pub async fn unpublish(
    State(state): State<Arc<AppState>>,
    p: Principal,
    Path((id, port)): Path<(String, String)>,
) -> ApiResult<StatusCode> {
    let port = port_param(&[("port".to_string(), port)])?;
    let rec = lookup(&state, &p, &id)?;
    if crate::ports::unpublish(&state, &rec.id, Some(port)).await == 0 {
        return Err(ApiError::not_found(format!(
            "port {port} of sandbox {} is not published",
            rec.id
        )));
    }
    let _ = state
        .store
        .add_event(&rec.id, "port", &format!("port {port} unpublished"));
    Ok(StatusCode::NO_CONTENT)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_proxied_answer_is_sandboxed_and_cannot_act_on_the_whole_origin() {
        let mut h = axum::http::HeaderMap::new();
        for (k, v) in [
            ("service-worker-allowed", "/"),
            ("clear-site-data", "\"storage\""),
            ("content-security-policy", "default-src *"),
            ("x-app", "kept"),
        ] {
            h.insert(k, axum::http::HeaderValue::from_static(v));
        }
        confine_to_sandbox_origin(&mut h);
        assert!(h.get("service-worker-allowed").is_none());
        assert!(h.get("clear-site-data").is_none());
        assert_eq!(h.get_all("content-security-policy").iter().count(), 1);
        let csp = h["content-security-policy"].to_str().unwrap();
        assert!(
            csp.starts_with("sandbox ") && !csp.contains("allow-same-origin"),
            "{csp}"
        );
        assert_eq!(h["x-app"], "kept");
    }
}
