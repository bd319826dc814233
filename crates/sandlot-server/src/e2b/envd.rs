//! envd, E2B's in-sandbox agent API, answered by the daemon for every sandbox on
//! one listener: the sandbox is named by `E2b-Sandbox-Id` and authorized by its
//! access token (`X-Access-Token`); the user by HTTP Basic `user:`. Connect-RPC
//! methods of `process.Process` and `filesystem.Filesystem`, plus `/files` and
//! `/health`.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};

use serde_json::json;

use super::connect::{self, Code, ConnectError};
use super::{files, process, E2b};
use crate::sandbox::SandboxHandle;

pub const SANDBOX_ID_HEADER: &str = "e2b-sandbox-id";
pub const SANDBOX_PORT_HEADER: &str = "e2b-sandbox-port";
pub const ACCESS_TOKEN_HEADER: &str = "x-access-token";
/// The port envd listens on in an E2B sandbox; the SDK always names it.
pub const ENVD_PORT: u16 = 49983;

/// Why an envd request cannot reach a sandbox. Rendered as E2B's edge proxy
/// does (a plain JSON `{"code": N, "message"}`), which the SDK maps for RPCs and
/// HTTP alike: 502 with "was not found" is `SandboxNotRunningException`.
#[derive(Debug)]
pub struct AccessError {
    pub status: StatusCode,
    pub message: String,
}

impl IntoResponse for AccessError {
    fn into_response(self) -> Response {
        (
            self.status,
            Json(json!({"code": self.status.as_u16(), "message": self.message})),
        )
            .into_response()
    }
}

/// One envd request's sandbox and user.
pub struct Ctx {
    pub e2b: Arc<E2b>,
    pub h: Arc<SandboxHandle>,
    /// The user named by the request, if any.
    pub user: Option<String>,
    /// The user the request acts as (named, or the sandbox's default).
    pub effective_user: String,
}

impl Ctx {
    /// A path of the request resolved for its user (relative to the home).
    pub fn path(&self, p: &str) -> Result<String, ConnectError> {
        super::resolve_path(p, &self.effective_user).map_err(ConnectError::invalid)
    }
}

/// Authorizes an envd request for its sandbox.
pub fn access(e2b: &Arc<E2b>, headers: &HeaderMap) -> Result<Ctx, AccessError> {
    let err = |status, m: String| AccessError { status, message: m };
    let id = headers
        .get(SANDBOX_ID_HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .trim()
        .to_string();
    if id.is_empty() {
        return Err(err(
            StatusCode::BAD_REQUEST,
            "E2b-Sandbox-Id header is empty".into(),
        ));
    }
    if let Some(port) = headers
        .get(SANDBOX_PORT_HEADER)
        .and_then(|v| v.to_str().ok())
    {
        if port.trim() != ENVD_PORT.to_string() {
            return Err(err(
                StatusCode::BAD_GATEWAY,
                format!("The sandbox {id} is running but port {} is not open (only envd, {ENVD_PORT}, is served)", port.trim()),
            ));
        }
    }
    let token = headers
        .get(ACCESS_TOKEN_HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if token.is_empty() {
        return Err(err(
            StatusCode::UNAUTHORIZED,
            "X-Access-Token is required (the envdAccessToken of the sandbox)".into(),
        ));
    }
    if !constant_time_eq(token.as_bytes(), e2b.access_token(&id).as_bytes()) {
        return Err(err(
            StatusCode::UNAUTHORIZED,
            format!("invalid access token for sandbox {id}"),
        ));
    }
    let h = match e2b.app.handle(&id) {
        Some(h) if !h.is_stopping() => h,
        _ => {
            return Err(err(
                StatusCode::BAD_GATEWAY,
                format!("The sandbox {id} was not found"),
            ))
        }
    };
    let user = super::basic_user(headers).map_err(|m| err(StatusCode::UNAUTHORIZED, m))?;
    let effective_user = match &user {
        Some(u) => u.clone(),
        None => e2b.default_user(&id),
    };
    Ok(Ctx {
        e2b: e2b.clone(),
        h,
        user,
        effective_user,
    })
}

/// A `/files` request made through a signed URL (`download_url`, `upload_url`).
pub struct SignedRequest<'a> {
    /// `path` and `username` exactly as in the URL (`username` empty if absent).
    pub path: &'a str,
    /// `read` (download) or `write` (upload).
    pub operation: &'a str,
    pub user: &'a str,
    /// `v1_` and the unpadded base64 of the SHA-256 below.
    pub signature: &'a str,
    /// `signature_expiration`: Unix seconds, if the URL expires.
    pub expiration: Option<&'a str>,
}

/// E2B's URL signature: `v1_` + base64(sha256("path:operation:user:token[:exp]")),
/// computed by the SDK with the sandbox's access token, which is the secret.
pub fn url_signature(
    path: &str,
    operation: &str,
    user: &str,
    token: &str,
    expiration: Option<&str>,
) -> String {
    use base64::Engine;
    use sha2::Digest;
    let mut h = sha2::Sha256::new();
    h.update(format!("{path}:{operation}:{user}:{token}").as_bytes());
    if let Some(e) = expiration {
        h.update(format!(":{e}").as_bytes());
    }
    let d = h.finalize();
    format!(
        "v1_{}",
        base64::engine::general_purpose::STANDARD_NO_PAD.encode(d)
    )
}

/// Most live sandboxes a signed URL is checked against when it does not name its
/// sandbox (each costs two SHA-256 of a few hundred bytes, before any credential is
/// known: 100,000 made each unauthenticated request cost about 100 ms of a worker).
/// Past it, the URL must name its sandbox (the `E2b-Sandbox-Id` header, or the
/// `[e2b] domain` host name).
const MAX_SIGNED_SCAN: usize = 1_000;

/// Authorizes a signed-URL request: the signature must be the one the sandbox's
/// access token makes for this path, operation, user and expiry (compared in
/// constant time), and the expiry, if any, must not have passed. The sandbox is
/// the one `E2b-Sandbox-Id` names, or else the live sandbox whose token the
/// signature was made with. The URL's user is the request's user.
pub fn signed_access(
    e2b: &Arc<E2b>,
    headers: &HeaderMap,
    r: &SignedRequest<'_>,
) -> Result<Ctx, AccessError> {
    let err = |status, m: &str| AccessError {
        status,
        message: m.to_string(),
    };
    let exp = match r.expiration.filter(|e| !e.is_empty()) {
        None => None,
        Some(e) => Some(e.parse::<i64>().map(|_| e).map_err(|_| {
            err(
                StatusCode::BAD_REQUEST,
                "signature_expiration is not a number",
            )
        })?),
    };
    // The signed string is `path:operation:user:token[:expiry]`: a user with a
    // colon could shift the fields (a read URL for an odd path passing for a write
    // of another); no user name has one.
    if r.user.contains(':') {
        return Err(err(StatusCode::UNAUTHORIZED, "invalid signature"));
    }
    let named = headers
        .get(SANDBOX_ID_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty());
    let candidates = match named {
        Some(id) => vec![id],
        None => e2b.app.live_ids(),
    };
    let found = candidates.into_iter().take(MAX_SIGNED_SCAN).find(|id| {
        let want = url_signature(r.path, r.operation, r.user, &e2b.access_token(id), exp);
        constant_time_eq(want.as_bytes(), r.signature.as_bytes())
    });
    let Some(id) = found else {
        return Err(err(StatusCode::UNAUTHORIZED, "invalid signature"));
    };
    if let Some(e) = exp {
        let e: i64 = e.parse().unwrap_or(0);
        if e < crate::store::now_ms() / 1000 {
            return Err(err(
                StatusCode::UNAUTHORIZED,
                "signature is already expired",
            ));
        }
    }
    let h = match e2b.app.handle(&id) {
        Some(h) if !h.is_stopping() => h,
        _ => {
            return Err(AccessError {
                status: StatusCode::BAD_GATEWAY,
                message: format!("The sandbox {id} was not found"),
            })
        }
    };
    let user = (!r.user.is_empty()).then(|| r.user.to_string());
    let effective_user = user.clone().unwrap_or_else(|| e2b.default_user(&id));
    Ok(Ctx {
        e2b: e2b.clone(),
        h,
        user,
        effective_user,
    })
}

pub(crate) fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// envd's routes (the E2B router adds `/health`).
pub fn routes() -> Router<Arc<E2b>> {
    Router::new()
        .route("/files", get(files::download).post(files::upload))
        .route("/process.Process/{method}", post(process_rpc))
        .route("/filesystem.Filesystem/{method}", post(filesystem_rpc))
}

pub async fn health(State(e2b): State<Arc<E2b>>, headers: HeaderMap) -> Response {
    match access(&e2b, &headers) {
        Ok(_) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => e.into_response(),
    }
}

async fn process_rpc(
    s: State<Arc<E2b>>,
    Path(method): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    rpc(s, "process.Process", method, headers, body).await
}

async fn filesystem_rpc(
    s: State<Arc<E2b>>,
    Path(method): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    rpc(s, "filesystem.Filesystem", method, headers, body).await
}

/// Whether a method streams its response (server streams) or its request
/// (client streams); both use enveloped frames.
fn is_streaming(service: &str, method: &str) -> bool {
    matches!(
        (service, method),
        ("process.Process", "Start" | "Connect" | "StreamInput")
            | ("filesystem.Filesystem", "WatchDir")
    )
}

async fn rpc(
    State(e2b): State<Arc<E2b>>,
    service: &str,
    method: String,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let streaming = is_streaming(service, &method);
    let fail = |e: ConnectError| {
        if streaming {
            connect::stream_error(e)
        } else {
            e.into_response()
        }
    };
    let ctx = match access(&e2b, &headers) {
        Ok(c) => c,
        Err(e) => return e.into_response(),
    };
    if let Err(e) = connect::check_request(&headers, streaming) {
        return fail(e);
    }
    ctx.h.touch();
    let r = match (service, method.as_str()) {
        ("process.Process", "StreamInput") => process::stream_input(ctx, body).await,
        ("process.Process", m) => process::call(ctx, m, &headers, body).await,
        ("filesystem.Filesystem", m) => files::call(ctx, m, &headers, body).await,
        _ => Err(ConnectError::new(
            Code::Unimplemented,
            format!("{service}/{method} is not a method of envd"),
        )),
    };
    r.unwrap_or_else(fail)
}

/// Reads a unary request's message, or a server stream's single message.
pub async fn request_message(
    ctx: &Ctx,
    body: Body,
    streaming: bool,
) -> Result<bytes::Bytes, ConnectError> {
    let limit = ctx.e2b.app.cfg.limits.max_request_body.bytes();
    let bytes = crate::body::read_limited(body, limit.max(connect::MAX_FRAME as u64))
        .await
        .map_err(|e| ConnectError::new(Code::ResourceExhausted, e.message))?;
    if streaming {
        connect::single_frame(&bytes)
    } else {
        Ok(bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streaming_methods_are_known() {
        assert!(is_streaming("process.Process", "Start"));
        assert!(is_streaming("process.Process", "StreamInput"));
        assert!(is_streaming("filesystem.Filesystem", "WatchDir"));
        assert!(!is_streaming("process.Process", "List"));
        assert!(!is_streaming("filesystem.Filesystem", "GetWatcherEvents"));
    }

    #[test]
    fn url_signatures_are_e2b_v1() {
        // sha256("a.txt:read:user:tok") and with ":17" appended, base64 unpadded.
        use base64::Engine;
        use sha2::Digest;
        let want = |s: &str| {
            format!(
                "v1_{}",
                base64::engine::general_purpose::STANDARD_NO_PAD.encode(sha2::Sha256::digest(s))
            )
        };
        assert_eq!(
            url_signature("a.txt", "read", "user", "tok", None),
            want("a.txt:read:user:tok")
        );
        assert_eq!(
            url_signature("a.txt", "write", "", "tok", Some("17")),
            want("a.txt:write::tok:17")
        );
        assert!(!url_signature("a.txt", "read", "", "tok", None).ends_with('='));
    }

    #[test]
    fn token_comparison() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"ab"));
    }
}
