//! Who is calling: the operator on the Unix socket (root only, sees every tenant),
//! or a tenant identified by a bearer token (TCP, or the socket with a token).

use std::io::Read;
use std::sync::Arc;

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, HeaderValue};
use sha2::{Digest, Sha256};

use crate::error::ApiError;
use crate::state::AppState;
use crate::store::{now_ms, TokenRecord};

/// The transport a request came in on (set per listener).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    Unix,
    Tcp,
}

/// The caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    /// The tenant whose sandboxes the caller sees; None = every tenant (operator).
    pub scope: Option<String>,
    /// The tenant new sandboxes belong to.
    pub tenant: String,
}

impl Principal {
    /// Whether the caller may see a sandbox of `tenant`.
    pub fn sees(&self, tenant: &str) -> bool {
        self.scope.as_deref().is_none_or(|s| s == tenant)
    }
}

/// Header with which the operator acts as one tenant on the Unix socket.
pub const TENANT_HEADER: &str = "x-sandlot-tenant";
/// Tenant of sandboxes the operator creates without naming one.
pub const DEFAULT_TENANT: &str = "default";

impl FromRequestParts<Arc<AppState>> for Principal {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &Arc<AppState>,
    ) -> Result<Self, Self::Rejection> {
        let transport = parts
            .extensions
            .get::<Transport>()
            .copied()
            .unwrap_or(Transport::Tcp);
        let bearer = match parts.headers.get(axum::http::header::AUTHORIZATION) {
            Some(v) => {
                let v = v
                    .to_str()
                    .map_err(|_| ApiError::unauthorized("malformed Authorization header"))?;
                let t = v
                    .strip_prefix("Bearer ")
                    .or_else(|| v.strip_prefix("bearer "))
                    .ok_or_else(|| {
                        ApiError::unauthorized("the Authorization header must be `Bearer TOKEN`")
                    })?;
                Some(t.trim().to_string())
            }
            None => websocket_bearer(&parts.method, &parts.headers),
        };
        if let Some(token) = bearer {
            let tenant = state
                .store
                .tenant_of_token(&hash_token(&token))
                .map_err(ApiError::internal)?
                .ok_or_else(|| ApiError::unauthorized("invalid or revoked token"))?;
            return Ok(Principal {
                scope: Some(tenant.clone()),
                tenant,
            });
        }
        match transport {
            Transport::Unix => match parts.headers.get(TENANT_HEADER) {
                Some(v) => {
                    let t = v.to_str().unwrap_or_default();
                    if !crate::config::valid_tenant(t) {
                        return Err(ApiError::invalid(TENANT_HEADER, crate::config::TENANT_RULE));
                    }
                    Ok(Principal {
                        scope: Some(t.to_string()),
                        tenant: t.to_string(),
                    })
                }
                None => Ok(Principal {
                    scope: None,
                    tenant: DEFAULT_TENANT.to_string(),
                }),
            },
            Transport::Tcp => Err(ApiError::unauthorized(
                "a bearer token is required over TCP (Authorization: Bearer TOKEN)",
            )),
        }
    }
}

/// The WebSocket subprotocol that carries a bearer token: a browser cannot set
/// `Authorization` on a WebSocket, so the web console offers
/// `sandlot.bearer.TOKEN` beside [`WS_PROTOCOL`], which the server selects.
pub const WS_BEARER_PREFIX: &str = "sandlot.bearer.";
/// The subprotocol the API's WebSockets select when the client offers it.
pub const WS_PROTOCOL: &str = "sandlot.v1";

/// The entries of a request's `Sec-WebSocket-Protocol` headers (as bytes: a
/// value that is not text is split and filtered all the same).
fn offered_subprotocols(headers: &HeaderMap) -> impl Iterator<Item = &[u8]> {
    headers
        .get_all(header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .flat_map(|v| v.as_bytes().split(|b| *b == b','))
        .map(<[u8]>::trim_ascii)
}

/// Whether the request is a WebSocket handshake: a GET asking to upgrade its
/// connection to `websocket`.
fn is_websocket_upgrade(method: &axum::http::Method, headers: &HeaderMap) -> bool {
    let has_token = |name: header::HeaderName, token: &str| {
        headers.get_all(name).iter().any(|v| {
            v.to_str()
                .is_ok_and(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case(token)))
        })
    };
    method == axum::http::Method::GET
        && has_token(header::CONNECTION, "upgrade")
        && has_token(header::UPGRADE, "websocket")
}

/// A bearer token offered as the subprotocol `sandlot.bearer.TOKEN`, read only on a
/// WebSocket handshake (anywhere else the header means nothing).
pub fn websocket_bearer(method: &axum::http::Method, headers: &HeaderMap) -> Option<String> {
    if !is_websocket_upgrade(method, headers) {
        return None;
    }
    offered_subprotocols(headers)
        .filter_map(|p| std::str::from_utf8(p).ok())
        .find_map(|p| p.strip_prefix(WS_BEARER_PREFIX))
        .filter(|t| !t.is_empty())
        .map(str::to_string)
}

/// Removes a `sandlot.bearer.TOKEN` subprotocol from the headers, keeping the
/// others: what the ports proxy forwards to a sandbox's application. Read as
/// bytes, so a header value that is not text hides no token.
pub fn strip_websocket_bearer(headers: &mut HeaderMap) {
    let prefix = WS_BEARER_PREFIX.as_bytes();
    if !offered_subprotocols(headers).any(|p| p.starts_with(prefix)) {
        return;
    }
    let kept: Vec<Vec<u8>> = offered_subprotocols(headers)
        .filter(|p| !p.starts_with(prefix) && !p.is_empty())
        .map(<[u8]>::to_vec)
        .collect();
    headers.remove(header::SEC_WEBSOCKET_PROTOCOL);
    if !kept.is_empty() {
        if let Ok(v) = HeaderValue::from_bytes(&kept.join(&b", "[..])) {
            headers.insert(header::SEC_WEBSOCKET_PROTOCOL, v);
        }
    }
}

/// sha256 of a token, hex.
pub fn hash_token(token: &str) -> String {
    hex(&Sha256::digest(token.as_bytes()))
}

pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// `n` random bytes from the kernel, hex.
pub fn random_hex(n: usize) -> String {
    let mut b = vec![0u8; n];
    if std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .is_err()
    {
        // getrandom(2) via /dev/urandom cannot fail on Linux in practice; fall back
        // to time and pid mixing rather than panicking.
        let seed = (now_ms() as u64) ^ (u64::from(std::process::id()) << 32);
        for (i, x) in b.iter_mut().enumerate() {
            *x = (seed.rotate_left(i as u32 * 7) as u8) ^ (i as u8);
        }
    }
    hex(&b)
}

/// The E2B-shaped form of a token's secret: `e2b_` and the same hex digits
/// (`sl_<hex>` → `e2b_<hex>`). E2B's SDKs that check an API key's shape
/// (`e2b_` then hex) accept it; it authenticates exactly as the token does, so it
/// is as secret as the token. None for a secret of another shape.
pub fn e2b_api_key(secret: &str) -> Option<String> {
    let hex = secret.strip_prefix("sl_")?;
    is_lower_hex(hex).then(|| format!("e2b_{hex}"))
}

/// The token an E2B-shaped API key stands for (`e2b_<hex>` → `sl_<hex>`); None
/// when `key` is not of that shape (then it is looked up as given).
pub fn token_of_e2b_api_key(key: &str) -> Option<String> {
    let hex = key.strip_prefix("e2b_")?;
    is_lower_hex(hex).then(|| format!("sl_{hex}"))
}

fn is_lower_hex(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// A new token for `tenant`: returns the record and the secret (shown once).
pub fn new_token(tenant: &str, name: Option<String>) -> (TokenRecord, String, String) {
    let secret = format!("sl_{}", random_hex(24));
    let rec = TokenRecord {
        id: format!("tok_{}", random_hex(6)),
        tenant: tenant.to_string(),
        name,
        created_at: now_ms(),
        last_used_at: None,
        revoked_at: None,
    };
    let hash = hash_token(&secret);
    (rec, secret, hash)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_hash_stably_and_differ() {
        let (_, s1, h1) = new_token("a", None);
        let (_, s2, _) = new_token("a", None);
        assert_ne!(s1, s2);
        assert!(s1.starts_with("sl_") && s1.len() == 51);
        assert_eq!(hash_token(&s1), h1);
        assert_eq!(
            hash_token("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    fn ws_headers(protocols: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, Upgrade"),
        );
        h.insert(
            header::SEC_WEBSOCKET_PROTOCOL,
            HeaderValue::from_str(protocols).unwrap(),
        );
        h
    }

    #[test]
    fn websocket_bearer_is_read_from_the_offered_subprotocols_of_a_handshake_only() {
        let get = axum::http::Method::GET;
        let h = ws_headers("sandlot.v1, sandlot.bearer.sl_abc");
        assert_eq!(websocket_bearer(&get, &h).as_deref(), Some("sl_abc"));
        let mut plain = h.clone();
        plain.remove(header::UPGRADE);
        assert_eq!(websocket_bearer(&get, &plain), None);
        let mut no_connection = h.clone();
        no_connection.remove(header::CONNECTION);
        assert_eq!(websocket_bearer(&get, &no_connection), None);
        assert_eq!(websocket_bearer(&axum::http::Method::POST, &h), None);
        assert_eq!(
            websocket_bearer(&get, &ws_headers("sandlot.v1, sandlot.bearer.")),
            None
        );
        assert_eq!(websocket_bearer(&get, &ws_headers("chat")), None);
    }

    #[test]
    fn the_bearer_subprotocol_is_stripped_and_the_others_kept() {
        let mut h = ws_headers("chat, sandlot.bearer.sl_abc,sandlot.v1");
        strip_websocket_bearer(&mut h);
        assert_eq!(h[header::SEC_WEBSOCKET_PROTOCOL], "chat, sandlot.v1");
        let mut only = ws_headers("sandlot.bearer.sl_abc");
        strip_websocket_bearer(&mut only);
        assert!(!only.contains_key(header::SEC_WEBSOCKET_PROTOCOL));
        // A value that is not text hides no token.
        let mut raw = ws_headers("chat");
        raw.insert(
            header::SEC_WEBSOCKET_PROTOCOL,
            HeaderValue::from_bytes(b"chat, sandlot.bearer.sl_abc, \xe9").unwrap(),
        );
        strip_websocket_bearer(&mut raw);
        assert_eq!(
            raw[header::SEC_WEBSOCKET_PROTOCOL].as_bytes(),
            b"chat, \xe9"
        );
    }

    #[test]
    fn a_tokens_e2b_shaped_key_maps_back_to_it_and_nothing_else_does() {
        let (_, secret, _) = new_token("a", None);
        let key = e2b_api_key(&secret).unwrap();
        assert!(key.starts_with("e2b_") && key.len() == secret.len() + 1);
        assert_eq!(token_of_e2b_api_key(&key).as_deref(), Some(secret.as_str()));
        for other in [
            "e2b_", "e2b_XYZ", "e2b_00 ", "sl_00", "e2b_0g", "E2B_00", "e2b_AB",
        ] {
            assert_eq!(token_of_e2b_api_key(other), None, "{other}");
        }
        assert_eq!(e2b_api_key("tok_00"), None);
    }

    #[test]
    fn operator_sees_all_and_tenant_only_itself() {
        let op = Principal {
            scope: None,
            tenant: "default".into(),
        };
        let t = Principal {
            scope: Some("a".into()),
            tenant: "a".into(),
        };
        assert!(op.sees("a") && op.sees("b"));
        assert!(t.sees("a") && !t.sees("b"));
    }
}
