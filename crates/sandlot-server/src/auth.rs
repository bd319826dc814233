//! Who is calling: the operator on the Unix socket (root only, sees every tenant),
//! the operator by an operator token (TCP: every tenant, short of what stays on
//! the socket), or a tenant identified by a bearer token (TCP, or the socket with
//! a token).

use std::io::Read;
use std::sync::Arc;

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, HeaderValue};
use sha2::{Digest, Sha256};

use crate::error::{ApiError, ErrorCode};
use crate::state::AppState;
use crate::store::{now_ms, Grant, TokenKind, TokenRecord, OPERATOR_TOKEN_TENANT};

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
    /// What admitted the caller.
    pub credential: Credential,
    /// The id of the operator token that admitted the caller (None for the
    /// socket and for tenants): what a token it mints records as its maker.
    pub token: Option<String>,
}

/// What admitted a caller: what the operator's few socket-only acts check
/// (`scope` alone says whose sandboxes it sees).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Credential {
    /// The daemon's Unix socket without a token (root on the host).
    Socket,
    /// An operator token (`sandlot token create --operator`), on either listener.
    OperatorToken,
    /// A tenant's token, or a sandbox's own access token (E2B's envd and traffic).
    Tenant,
}

impl Principal {
    /// A tenant's principal: sees and creates in `tenant` only.
    pub fn tenant(tenant: impl Into<String>) -> Principal {
        let tenant = tenant.into();
        Principal {
            scope: Some(tenant.clone()),
            tenant,
            credential: Credential::Tenant,
            token: None,
        }
    }

    /// The principal a valid token grants, before any tenant header: a tenant
    /// token its tenant; an operator token every tenant, creating in
    /// [`DEFAULT_TENANT`] like the socket.
    pub fn of_token(kind: TokenKind, tenant: &str, id: &str) -> Principal {
        match kind {
            TokenKind::Tenant => Principal::tenant(tenant),
            TokenKind::Operator => Principal {
                scope: None,
                tenant: DEFAULT_TENANT.to_string(),
                credential: Credential::OperatorToken,
                token: Some(id.to_string()),
            },
        }
    }

    /// The operator acting as `tenant` (the tenant header): that tenant's view,
    /// keeping what admitted it.
    fn acting_as(self, tenant: &str) -> Principal {
        Principal {
            scope: Some(tenant.to_string()),
            tenant: tenant.to_string(),
            credential: self.credential,
            token: self.token,
        }
    }

    /// Whether the caller came in on the Unix socket without a token: what the
    /// operator's socket-only acts (minting operator tokens, revoking them,
    /// pulling and pushing images) require.
    pub fn is_socket_operator(&self) -> bool {
        self.scope.is_none() && self.credential == Credential::Socket
    }

    /// Who made a token this caller mints, as `created_by` records it: the
    /// minting operator token's id, or `socket`.
    pub fn minter(&self) -> String {
        self.token
            .clone()
            .unwrap_or_else(|| CREATED_BY_SOCKET.to_string())
    }

    /// Whether the caller may see a sandbox of `tenant`.
    pub fn sees(&self, tenant: &str) -> bool {
        self.scope.as_deref().is_none_or(|s| s == tenant)
    }
}

/// `created_by` of a token minted on the Unix socket.
pub const CREATED_BY_SOCKET: &str = "socket";

/// The operator's acts (every tenant's view, tokens, tenants, `/metrics`, image
/// removal): the socket or an operator token, not acting as a tenant. `what`
/// names the act in the 403 `forbidden`.
pub fn require_operator(p: &Principal, what: &str) -> Result<(), ApiError> {
    if p.scope.is_none() {
        return Ok(());
    }
    Err(ApiError::of(
        ErrorCode::Forbidden,
        format!(
            "{what} is for the operator (the daemon's Unix socket or an operator token), \
             not a tenant nor the operator acting as one"
        ),
    ))
}

/// The acts that stay on the Unix socket (minting and revoking operator tokens,
/// every write to the shared image namespace, pulls and pushes): what a stolen
/// operator token must not do, since it would outlive its revocation or turn
/// the daemon into its network client. 403 `forbidden` otherwise.
pub fn require_socket(p: &Principal, what: &str) -> Result<(), ApiError> {
    if p.is_socket_operator() {
        return Ok(());
    }
    Err(ApiError::of(
        ErrorCode::Forbidden,
        format!(
            "{what} is for the operator on the daemon's Unix socket only \
             (not an operator token, nor acting as a tenant)"
        ),
    ))
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
        // The token's grant, looked up when one is presented; a token presented
        // and not found is refused whatever else the request carries.
        let grant = match bearer {
            Some(token) => Some(
                state
                    .store
                    .token_grant(&hash_token(&token))
                    .map_err(ApiError::internal)?
                    .ok_or_else(|| ApiError::unauthorized("invalid or revoked token"))?,
            ),
            None => None,
        };
        let header = parts
            .headers
            .get(TENANT_HEADER)
            .map(|v| v.to_str().unwrap_or_default());
        principal_of(transport, grant, header)
    }
}

/// Who a request is, from its listener, the grant of the token it presented
/// (kind and tenant) and its tenant header: a tenant token is its tenant
/// whatever the header says; the operator (the socket without a token, or an
/// operator token) is every tenant, or the one the header names; TCP without a
/// token is no one.
pub fn principal_of(
    transport: Transport,
    grant: Option<Grant>,
    tenant_header: Option<&str>,
) -> Result<Principal, ApiError> {
    let operator = match grant {
        Some(g) => {
            let p = Principal::of_token(g.kind, &g.tenant, &g.id);
            if p.scope.is_some() {
                // A tenant's token: a tenant header changes nothing.
                return Ok(p);
            }
            p
        }
        None if transport == Transport::Unix => Principal {
            scope: None,
            tenant: DEFAULT_TENANT.to_string(),
            credential: Credential::Socket,
            token: None,
        },
        None => {
            return Err(ApiError::unauthorized(
                "a bearer token is required over TCP (Authorization: Bearer TOKEN)",
            ))
        }
    };
    match tenant_header {
        Some(t) if !crate::config::valid_tenant(t) => {
            Err(ApiError::invalid(TENANT_HEADER, crate::config::TENANT_RULE))
        }
        Some(t) => Ok(operator.acting_as(t)),
        None => Ok(operator),
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
    minted(TokenKind::Tenant, tenant, name)
}

/// A new operator token: returns the record and the secret (shown once).
/// Only the operator on the Unix socket mints one (`routes/tokens.rs`).
pub fn new_operator_token(name: Option<String>) -> (TokenRecord, String, String) {
    minted(TokenKind::Operator, OPERATOR_TOKEN_TENANT, name)
}

fn minted(kind: TokenKind, tenant: &str, name: Option<String>) -> (TokenRecord, String, String) {
    let secret = format!("sl_{}", random_hex(24));
    let rec = TokenRecord {
        id: format!("tok_{}", random_hex(6)),
        kind,
        tenant: tenant.to_string(),
        name,
        created_at: now_ms(),
        last_used_at: None,
        revoked_at: None,
        created_by: None,
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
            credential: Credential::Socket,
            token: None,
        };
        let t = Principal::tenant("a");
        assert!(op.sees("a") && op.sees("b"));
        assert!(t.sees("a") && !t.sees("b"));
    }

    #[test]
    fn an_operator_token_yields_every_tenant_but_not_the_socket() {
        let p = Principal::of_token(TokenKind::Operator, OPERATOR_TOKEN_TENANT, "tok_op");
        assert_eq!(p.scope, None);
        assert!(p.sees("a") && p.sees("b"));
        assert_eq!(p.tenant, DEFAULT_TENANT);
        assert_eq!(p.credential, Credential::OperatorToken);
        assert!(!p.is_socket_operator());
        // Acting as a tenant narrows it to that tenant, still an operator token.
        let a = p.acting_as("a");
        assert_eq!(a.scope.as_deref(), Some("a"));
        assert!(!a.sees("b"));
        assert_eq!(a.credential, Credential::OperatorToken);
    }

    #[test]
    fn a_tenant_token_yields_its_tenant_whatever_its_records_tenant_says() {
        // A tenant token's record naming `*` (the operator's mark) grants the
        // tenant `*`, which sees no other tenant: the kind decides, never the name.
        let p = Principal::of_token(TokenKind::Tenant, OPERATOR_TOKEN_TENANT, "tok_t");
        assert_eq!(p.scope.as_deref(), Some("*"));
        assert!(!p.sees("a"));
        assert_eq!(p.credential, Credential::Tenant);
        let acme = Principal::of_token(TokenKind::Tenant, "acme", "tok_a");
        assert_eq!(acme, Principal::tenant("acme"));
        assert!(!acme.is_socket_operator());
    }

    #[test]
    fn the_principal_follows_the_listener_the_tokens_kind_and_the_tenant_header() {
        let grant = |kind, tenant: &str| Grant {
            id: "tok_x".into(),
            kind,
            tenant: tenant.into(),
        };
        let op = || Some(grant(TokenKind::Operator, OPERATOR_TOKEN_TENANT));
        let acme = || Some(grant(TokenKind::Tenant, "acme"));
        // TCP without a token is no one; with a tenant token, its tenant, and a
        // tenant header from it changes nothing.
        assert_eq!(
            principal_of(Transport::Tcp, None, None).unwrap_err().status,
            axum::http::StatusCode::UNAUTHORIZED
        );
        for header in [None, Some("beta"), Some("no/such")] {
            assert_eq!(
                principal_of(Transport::Tcp, acme(), header).unwrap(),
                Principal::tenant("acme"),
                "{header:?}"
            );
        }
        // An operator token: every tenant, or the one the header names, on
        // either listener, never the socket's credential.
        for transport in [Transport::Tcp, Transport::Unix] {
            let p = principal_of(transport, op(), None).unwrap();
            assert_eq!((p.scope, p.credential), (None, Credential::OperatorToken));
            let a = principal_of(transport, op(), Some("beta")).unwrap();
            assert_eq!(
                (a.scope.as_deref(), a.credential),
                (Some("beta"), Credential::OperatorToken)
            );
            let bad = principal_of(transport, op(), Some("no/such")).unwrap_err();
            assert_eq!(bad.field.as_deref(), Some(TENANT_HEADER));
        }
        // The socket without a token is the socket's operator.
        let s = principal_of(Transport::Unix, None, None).unwrap();
        assert!(s.is_socket_operator());
        let s = principal_of(Transport::Unix, None, Some("beta")).unwrap();
        assert_eq!(s.scope.as_deref(), Some("beta"));
        assert!(!s.is_socket_operator());
    }

    #[test]
    fn the_operator_rule_admits_the_socket_and_operator_tokens_and_the_socket_rule_the_socket_only()
    {
        let socket = principal_of(Transport::Unix, None, None).unwrap();
        let op = Principal::of_token(TokenKind::Operator, OPERATOR_TOKEN_TENANT, "tok_op");
        let tenant = Principal::tenant("a");
        let acting = socket.clone().acting_as("a");
        let rules = |p: &Principal| {
            (
                require_operator(p, "x").is_ok(),
                require_socket(p, "x").is_ok(),
            )
        };
        assert_eq!(rules(&socket), (true, true));
        assert_eq!(rules(&op), (true, false));
        assert_eq!(rules(&tenant), (false, false));
        assert_eq!(rules(&acting), (false, false));
        let e = require_socket(&op, "importing images").unwrap_err();
        assert_eq!(e.code, ErrorCode::Forbidden);
        assert!(e.message.contains("Unix socket only"), "{}", e.message);
        // What an operator token mints records it; the socket's, `socket`.
        assert_eq!(op.minter(), "tok_op");
        assert_eq!(socket.minter(), CREATED_BY_SOCKET);
    }

    #[test]
    fn only_the_socket_without_a_tenant_is_the_socket_operator() {
        let socket = Principal {
            scope: None,
            tenant: DEFAULT_TENANT.into(),
            credential: Credential::Socket,
            token: None,
        };
        assert!(socket.is_socket_operator());
        assert!(!socket.acting_as("a").is_socket_operator());
    }

    #[test]
    fn operator_tokens_are_minted_as_the_operators_kind_naming_no_tenant() {
        let (rec, secret, hash) = new_operator_token(Some("console".into()));
        assert_eq!(rec.kind, TokenKind::Operator);
        assert_eq!(rec.tenant, OPERATOR_TOKEN_TENANT);
        assert!(!crate::config::valid_tenant(&rec.tenant));
        assert_eq!(hash_token(&secret), hash);
        assert_eq!(new_token("a", None).0.kind, TokenKind::Tenant);
    }
}
