//! E2B's host-name routing: `PORT-SANDBOX.DOMAIN` (what `get_host(port)` builds,
//! with `DOMAIN` the `[e2b] domain` the create answer names). Port 49983 is envd
//! and 49999 the code interpreter (the request goes on as if it named the sandbox
//! in `E2b-Sandbox-Id`); any other
//! port goes to Sandlot's port proxy into the sandbox (`routes/ports.rs`), for a
//! caller holding the sandbox's traffic access token (`e2b-traffic-access-token`)
//! or its tenant's API key, or for anyone when the sandbox's ports are public
//! (`ports.public`, allowed by the operator; never envd's or the interpreter's).

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, Uri};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::envd::{AccessError, ENVD_PORT, SANDBOX_ID_HEADER, SANDBOX_PORT_HEADER};
use super::E2b;
use crate::auth::Principal;

pub const TRAFFIC_TOKEN_HEADER: &str = "e2b-traffic-access-token";

/// `(port, sandbox id)` of a `Host` of the form `PORT-ID.DOMAIN[:listener port]`.
pub fn route_of(host: &str, domain: &str) -> Option<(u16, String)> {
    let name = match host.rsplit_once(':') {
        Some((n, p)) if p.bytes().all(|b| b.is_ascii_digit()) => n,
        _ => host,
    };
    let first = name.strip_suffix(domain)?.strip_suffix('.')?;
    if first.contains('.') {
        return None;
    }
    let (port, id) = first.split_once('-')?;
    let port: u16 = port.parse().ok().filter(|p| *p > 0)?;
    (!id.is_empty()).then(|| (port, id.to_string()))
}

/// The middleware in front of the E2B router.
pub async fn route(State(e2b): State<Arc<E2b>>, mut req: Request, next: Next) -> Response {
    let Some(domain) = e2b.cfg.domain.clone() else {
        return next.run(req).await;
    };
    let host = req
        .headers()
        .get(axum::http::header::HOST)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_ascii_lowercase();
    let Some((port, id)) = route_of(&host, &domain) else {
        return next.run(req).await;
    };
    if port == ENVD_PORT || port == super::code::JUPYTER_PORT {
        let h = req.headers_mut();
        if let (Ok(i), Ok(p)) = (
            HeaderValue::from_str(&id),
            HeaderValue::from_str(&port.to_string()),
        ) {
            h.insert(SANDBOX_ID_HEADER, i);
            h.insert(SANDBOX_PORT_HEADER, p);
        }
        return next.run(req).await;
    }
    match to_port(&e2b, &id, port, req).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

/// A request for `port` of sandbox `id`, through the native port proxy.
async fn to_port(
    e2b: &Arc<E2b>,
    id: &str,
    port: u16,
    mut req: Request,
) -> Result<Response, AccessError> {
    let deny = |status, m: String| AccessError { status, message: m };
    let h = req.headers();
    let token = h
        .get(TRAFFIC_TOKEN_HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let rec = e2b.app.store.get_sandbox(id).ok().flatten();
    let principal = if !token.is_empty() {
        if !super::envd::constant_time_eq(token.as_bytes(), e2b.traffic_token(id).as_bytes()) {
            return Err(deny(
                StatusCode::UNAUTHORIZED,
                format!("invalid traffic access token for sandbox {id}"),
            ));
        }
        match &rec {
            Some(r) => Principal::tenant(r.tenant.clone()),
            None => {
                return Err(deny(
                    StatusCode::BAD_GATEWAY,
                    format!("The sandbox {id} was not found"),
                ))
            }
        }
    } else if h.contains_key("x-api-key") {
        super::rest::principal(e2b, h).map_err(|e| deny(e.status, e.message))?
    } else if let Some(r) = rec
        .as_ref()
        .filter(|r| crate::ports::is_public(&e2b.app.cfg.ports, &r.spec, port))
    {
        Principal::tenant(r.tenant.clone())
    } else {
        return Err(deny(
            StatusCode::UNAUTHORIZED,
            format!("port {port} of sandbox {id} needs its traffic access token ({TRAFFIC_TOKEN_HEADER}) or the API key"),
        ));
    };
    for n in [
        TRAFFIC_TOKEN_HEADER,
        "x-api-key",
        SANDBOX_ID_HEADER,
        SANDBOX_PORT_HEADER,
    ] {
        req.headers_mut().remove(n);
    }
    let rest = req
        .uri()
        .path_and_query()
        .map(|p| p.as_str().trim_start_matches('/').to_string())
        .unwrap_or_default();
    let uri: Uri = format!("/v1/sandboxes/{id}/ports/{port}/{rest}")
        .parse()
        .map_err(|_| {
            deny(
                StatusCode::BAD_REQUEST,
                "the request's path is not a valid URI".into(),
            )
        })?;
    *req.uri_mut() = uri;
    Ok(
        match crate::routes::ports::proxy(State(e2b.app.clone()), principal, req).await {
            Ok(r) => r,
            // The sandbox's own errors (not found, nothing listening) as E2B's proxy
            // shapes them.
            Err(e) => deny(
                if e.status == StatusCode::NOT_FOUND {
                    StatusCode::BAD_GATEWAY
                } else {
                    e.status
                },
                e.message,
            )
            .into_response(),
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_name_a_port_and_a_sandbox_under_the_domain() {
        let d = "sandlot.test";
        assert_eq!(
            route_of("8000-sb-1a2b.sandlot.test", d),
            Some((8000, "sb-1a2b".into()))
        );
        assert_eq!(
            route_of("49983-sb-x.sandlot.test:49983", d),
            Some((49983, "sb-x".into()))
        );
        assert_eq!(route_of("8000-sb-x.other.test", d), None);
        assert_eq!(route_of("8000-sb-x.evil.sandlot.test", d), None);
        assert_eq!(route_of("sandlot.test", d), None);
        assert_eq!(route_of("x-sb.sandlot.test", d), None);
        assert_eq!(route_of("0-sb.sandlot.test", d), None);
        assert_eq!(route_of("8000-.sandlot.test", d), None);
        assert_eq!(route_of("127.0.0.1:49983", d), None);
    }
}
