//! E2B wire-protocol compatibility: a second front door onto the same sandboxes,
//! so the unmodified `e2b` SDK works against `sandlot serve` (see
//! `docs/e2b-compat.md`). One optional listener (`--e2b-listen`, `[e2b] listen`)
//! serves both E2B's REST API (`rest.rs`) and envd, the in-sandbox agent API
//! (`envd.rs`: Connect-RPC `process.Process` and `filesystem.Filesystem`, plus
//! `/files` and `/health`). Requests carrying `E2b-Sandbox-Id` go to envd.
//!
//! Nothing here owns sandboxes: creation, exec, timeouts, quotas and tenants are
//! the native API's code paths, so a sandbox created through E2B is an ordinary
//! Sandlot sandbox of the API key's tenant.

pub mod code;
pub mod connect;
pub mod encoding;
pub mod envd;
pub mod files;
pub mod fork;
pub mod hosts;
pub mod lifecycle;
pub mod multipart;
pub mod network;
pub mod process;
pub mod rest;
pub mod snapshots;
pub mod templates;

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use serde::Deserialize;
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::state::AppState;

/// The envd version this server claims. It selects the SDK's code paths:
/// octet-stream and gzip uploads, stdin close, the default user, file metadata
/// (`X-Metadata-*` headers, 0.6.2), entry info in watch events and network-mount
/// watches (0.6.4).
pub const ENVD_VERSION: &str = "0.6.4";
/// The `clientID` of sandboxes (E2B's node id).
pub const CLIENT_ID: &str = "sandlot";
/// Tag recording the E2B template a sandbox was created from.
pub const TEMPLATE_TAG: &str = "e2b.template";
/// The SDK's default template.
pub const DEFAULT_TEMPLATE: &str = "base";
/// The template the `e2b-code-interpreter` SDK creates by default: the same
/// sandbox as `base` unless the operator defines it (every sandbox serves the
/// code interpreter API).
pub const CODE_INTERPRETER_TEMPLATE: &str = "code-interpreter-v1";

/// `[e2b]` in the operator configuration.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default)]
pub struct E2bConfig {
    /// Address of the E2B listener (REST API and envd). Absent: off.
    pub listen: Option<SocketAddr>,
    /// The domain under which `PORT-SANDBOX.DOMAIN` names reach this listener
    /// (wildcard DNS, usually through a TLS proxy): the create answer's `domain`,
    /// so that the SDK's `get_host(port)` and envd URLs use it. Absent: host names
    /// are not routed.
    pub domain: Option<String>,
    /// Template name → the sandbox it creates: any keys of the native create
    /// body's spec (`image`, `rootfs`, `user`, `workdir`, `env`, `resources`, ...).
    /// `user` is the template's default user (E2B's `base` runs as `user`).
    pub templates: BTreeMap<String, Value>,
}

impl Default for E2bConfig {
    fn default() -> Self {
        E2bConfig {
            listen: None,
            domain: None,
            templates: default_templates(),
        }
    }
}

fn default_templates() -> BTreeMap<String, Value> {
    let mut m = BTreeMap::new();
    for name in [DEFAULT_TEMPLATE, CODE_INTERPRETER_TEMPLATE] {
        m.insert(
            name.to_string(),
            serde_json::json!({"image": "host", "user": "user"}),
        );
    }
    m
}

impl E2bConfig {
    /// Checks the domain (a lowercase DNS name) and the templates (tables of
    /// native spec keys that make a valid spec).
    pub fn check(&self) -> Result<(), String> {
        if let Some(d) = &self.domain {
            let ok = !d.is_empty()
                && d.len() <= 200
                && d.split('.').all(|l| {
                    !l.is_empty()
                        && l.bytes()
                            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                });
            if !ok {
                return Err(format!(
                    "e2b.domain: {d:?} is not a lowercase DNS name (sandboxes.example.com)"
                ));
            }
        }
        for (name, v) in &self.templates {
            let Value::Object(o) = v else {
                return Err(format!(
                    "e2b.templates.{name}: expected a table of spec keys"
                ));
            };
            let keys = sandlot_proto::api::create::spec_keys();
            for k in o.keys() {
                if !keys.contains(&k.as_str()) || k == "timeout" {
                    let usable: Vec<&str> =
                        keys.iter().copied().filter(|k| *k != "timeout").collect();
                    return Err(format!(
                        "e2b.templates.{name}.{k}: not a sandbox spec key (use {})",
                        usable.join(", ")
                    ));
                }
            }
            let spec: sandlot_proto::spec::SandboxSpec = serde_json::from_value(v.clone())
                .map_err(|e| format!("e2b.templates.{name}: {e}"))?;
            spec.validate()
                .map_err(|e| format!("e2b.templates.{name}.{e}"))?;
        }
        Ok(())
    }

    /// The templates, with `base` and `code-interpreter-v1` added when the
    /// operator left them out.
    pub fn with_base(mut self) -> E2bConfig {
        for (name, spec) in default_templates() {
            self.templates.entry(name).or_insert(spec);
        }
        self
    }
}

/// State of the E2B front door.
pub struct E2b {
    pub app: Arc<AppState>,
    pub cfg: E2bConfig,
    /// Key of the per-sandbox envd access tokens (`data_dir/e2b.key`, 0600).
    key: Vec<u8>,
    /// Default user of each sandbox (its spec's `user`), cached.
    users: Mutex<HashMap<String, String>>,
    pub procs: process::ProcMeta,
    pub watchers: files::Watchers,
    /// Template builds (`templates.rs`).
    pub templates: templates::Builds,
    /// Becomes true when the daemon stops: open streams end so that the
    /// listener's graceful shutdown completes.
    stop: tokio::sync::watch::Receiver<bool>,
}

impl E2b {
    /// Loads (or creates) the token key under the data directory. `stop` turns
    /// true when the daemon shuts down.
    pub fn new(
        app: Arc<AppState>,
        cfg: E2bConfig,
        stop: tokio::sync::watch::Receiver<bool>,
    ) -> std::io::Result<Arc<E2b>> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let path = app.cfg.data_dir.join("e2b.key");
        let key = match std::fs::read(&path) {
            Ok(k) if k.len() >= 32 => k,
            _ => {
                let k = crate::auth::random_hex(32).into_bytes();
                let mut f = std::fs::OpenOptions::new()
                    .write(true)
                    .create(true)
                    .truncate(true)
                    .mode(0o600)
                    .open(&path)?;
                f.write_all(&k)?;
                k
            }
        };
        templates::move_unowned_start_files(&app);
        Ok(Arc::new(E2b {
            app,
            cfg: cfg.with_base(),
            key,
            users: Mutex::new(HashMap::new()),
            procs: process::ProcMeta::default(),
            watchers: files::Watchers::default(),
            templates: templates::Builds::default(),
            stop,
        }))
    }

    /// Resolves when the daemon shuts down.
    pub fn stopping(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut rx = self.stop.clone();
        async move {
            let _ = rx.wait_for(|s| *s).await;
        }
    }

    /// The error that ends a stream when the daemon shuts down.
    pub fn shutdown_error() -> connect::ConnectError {
        connect::ConnectError::new(
            connect::Code::Unavailable,
            "the Sandlot daemon is shutting down; the sandbox keeps running (reconnect when it is back)",
        )
    }

    /// The envd access token of a sandbox (`X-Access-Token`): a keyed hash of its
    /// id, so it needs no storage and survives daemon restarts.
    pub fn access_token(&self, sandbox_id: &str) -> String {
        let mut h = Sha256::new();
        h.update(&self.key);
        h.update(b"\0envd\0");
        h.update(sandbox_id.as_bytes());
        crate::auth::hex(&h.finalize())
    }

    /// The traffic access token of a sandbox (`e2b-traffic-access-token`, for its
    /// ports reached by host name): a keyed hash of its id, like the envd token.
    pub fn traffic_token(&self, sandbox_id: &str) -> String {
        let mut h = Sha256::new();
        h.update(&self.key);
        h.update(b"\0traffic\0");
        h.update(sandbox_id.as_bytes());
        crate::auth::hex(&h.finalize())
    }

    /// A text field of a sandbox's recorded spec.
    fn spec_text(&self, sandbox_id: &str, key: &str) -> Option<String> {
        let rec = self.app.store.get_sandbox(sandbox_id).ok().flatten()?;
        rec.spec.get(key).and_then(|v| v.as_str()).map(String::from)
    }

    /// The directory a sandbox's programs start in ([`start_dir`]).
    pub fn start_dir(&self, sandbox_id: &str) -> String {
        let workdir = self.spec_text(sandbox_id, "workdir");
        start_dir(workdir.as_deref(), &self.default_user(sandbox_id))
    }

    /// The default user of a sandbox's processes and file operations.
    pub fn default_user(&self, sandbox_id: &str) -> String {
        if let Some(u) = self
            .users
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(sandbox_id)
        {
            return u.clone();
        }
        let u = self
            .spec_text(sandbox_id, "user")
            .unwrap_or_else(|| "root".to_string());
        let mut m = self.users.lock().unwrap_or_else(|e| e.into_inner());
        // Forget sandboxes that are gone, so the cache stays as big as the live set.
        if m.len() > 4096 {
            m.retain(|id, _| self.app.handle(id).is_some());
        }
        m.insert(sandbox_id.to_string(), u.clone());
        u
    }
}

/// The router of the E2B listener. envd's routes (`/process.Process/*`,
/// `/filesystem.Filesystem/*`, `/files`) and the REST API's do not overlap;
/// `/health` and unknown routes go to envd when the request names a sandbox
/// (`E2b-Sandbox-Id`), to the REST API otherwise.
pub fn router(e2b: Arc<E2b>) -> Router {
    let names_sandbox = |h: &HeaderMap| h.contains_key(envd::SANDBOX_ID_HEADER);
    let routes = Router::new()
        .merge(envd::routes())
        .merge(code::routes())
        .merge(rest::routes())
        .merge(fork::routes())
        .merge(snapshots::routes())
        .merge(templates::routes())
        .route(
            "/health",
            get(move |s: State<Arc<E2b>>, h: HeaderMap| async move {
                if names_sandbox(&h) {
                    envd::health(s, h).await
                } else {
                    StatusCode::OK.into_response()
                }
            }),
        )
        .fallback(move |req: Request| async move {
            if names_sandbox(req.headers()) {
                envd::AccessError {
                    status: StatusCode::NOT_FOUND,
                    message: format!("no such envd route: {} {}", req.method(), req.uri().path()),
                }
                .into_response()
            } else {
                rest::unsupported(req).await.into_response()
            }
        })
        .layer(axum::middleware::from_fn_with_state(
            e2b.clone(),
            lifecycle::resume_on_demand,
        ))
        .layer(axum::extract::DefaultBodyLimit::disable())
        .with_state(e2b.clone());
    // Host names are routed before the routes are matched (a layer of a router
    // runs after its routing: this one wraps the whole inner router).
    Router::new()
        .fallback_service(routes)
        .layer(axum::middleware::from_fn_with_state(e2b, hosts::route))
        .layer(axum::middleware::from_fn(
            crate::request_body::finish_unread,
        ))
}

/// Binds the E2B listener if configured.
pub async fn bind(cfg: &E2bConfig) -> std::io::Result<Option<tokio::net::TcpListener>> {
    match cfg.listen {
        Some(a) => tokio::net::TcpListener::bind(a).await.map(Some),
        None => Ok(None),
    }
}

/// The user an envd request acts as: HTTP Basic `user:` (E2B sends the name with
/// an empty password), else None (the sandbox's default user).
pub fn basic_user(headers: &HeaderMap) -> Result<Option<String>, String> {
    let Some(v) = headers.get(axum::http::header::AUTHORIZATION) else {
        return Ok(None);
    };
    let v = v.to_str().map_err(|_| "malformed Authorization header")?;
    let Some(enc) = v
        .strip_prefix("Basic ")
        .or_else(|| v.strip_prefix("basic "))
    else {
        return Err("the Authorization header must be `Basic base64(user:)`".into());
    };
    use base64::Engine;
    let dec = base64::engine::general_purpose::STANDARD
        .decode(enc.trim())
        .map_err(|_| "Authorization: invalid base64")?;
    let s = String::from_utf8(dec).map_err(|_| "Authorization: the user is not UTF-8")?;
    let user = s.split(':').next().unwrap_or("").to_string();
    Ok((!user.is_empty()).then_some(user))
}

/// The directory a sandbox's programs start in when they name none: its spec's
/// `workdir`, else its default user's home where Sandlot's images define one
/// (`root`, `user`), else `/` (a template's user may have no home).
pub fn start_dir(workdir: Option<&str>, user: &str) -> String {
    if let Some(w) = workdir.filter(|w| w.starts_with('/')) {
        return w.to_string();
    }
    match user {
        "root" | "0" | "user" | "1000" => home_of(user),
        _ => "/".to_string(),
    }
}

/// The home directory of a user as Sandlot's images define them.
pub fn home_of(user: &str) -> String {
    match user {
        "root" | "0" => "/root".to_string(),
        "user" | "1000" => "/home/user".to_string(),
        other => format!("/home/{other}"),
    }
}

/// Resolves a path as envd does: `~` and relative paths are relative to the
/// user's home; the result is normalized (`.` and `..` resolved lexically, never
/// above `/`).
pub fn resolve_path(path: &str, user: &str) -> Result<String, String> {
    if path.is_empty() {
        return Err("path must not be empty".into());
    }
    if path.contains('\0') {
        return Err("path must not contain NUL bytes".into());
    }
    let home = home_of(user);
    let joined = if path == "~" {
        home
    } else if let Some(rest) = path.strip_prefix("~/") {
        format!("{home}/{rest}")
    } else if path.starts_with('/') {
        path.to_string()
    } else {
        format!("{home}/{path}")
    };
    let mut parts: Vec<&str> = Vec::new();
    for c in joined.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            c => parts.push(c),
        }
    }
    Ok(format!("/{}", parts.join("/")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn programs_start_in_the_workdir_else_a_home_the_images_define_else_the_root() {
        assert_eq!(start_dir(Some("/srv/app"), "user"), "/srv/app");
        assert_eq!(start_dir(None, "user"), "/home/user");
        assert_eq!(start_dir(None, "1000"), "/home/user");
        assert_eq!(start_dir(None, "root"), "/root");
        // A template's user whose home nobody made, or a uid:gid.
        assert_eq!(start_dir(None, "nobody"), "/");
        assert_eq!(start_dir(None, "1001:1001"), "/");
        assert_eq!(start_dir(Some("relative"), "root"), "/root");
    }

    fn with_template(t: Value) -> E2bConfig {
        let mut c = E2bConfig::default();
        c.templates.insert("t".into(), t);
        c
    }

    #[test]
    fn a_template_takes_spec_keys_but_the_lifetime_and_the_daemons_own() {
        let ok = serde_json::json!({"image": "host", "user": "user", "network": {"mode": "none"},
            "isolation": "namespace", "env": {"A": "b"}});
        with_template(ok).check().unwrap();
        for k in ["timeout", "name", "tags", "idle_timeout", "colour"] {
            let e = with_template(serde_json::json!({ k: null }))
                .check()
                .unwrap_err();
            assert!(e.starts_with(&format!("e2b.templates.t.{k}: ")), "{e}");
            assert!(e.contains("image, rootfs"), "the spec keys are listed: {e}");
            assert!(
                !e.contains("timeout, network"),
                "timeout is not offered: {e}"
            );
        }
    }

    #[test]
    fn paths_resolve_like_envd() {
        assert_eq!(resolve_path("a.txt", "user").unwrap(), "/home/user/a.txt");
        assert_eq!(resolve_path("~/x/y", "root").unwrap(), "/root/x/y");
        assert_eq!(resolve_path("~", "user").unwrap(), "/home/user");
        assert_eq!(
            resolve_path("/tmp//a/./b/../c", "user").unwrap(),
            "/tmp/a/c"
        );
        assert_eq!(resolve_path("/../../etc", "user").unwrap(), "/etc");
        assert_eq!(resolve_path("/", "user").unwrap(), "/");
        assert!(resolve_path("", "user").is_err());
        assert!(resolve_path("a\0b", "user").is_err());
    }

    #[test]
    fn basic_auth_names_the_user() {
        let mut h = HeaderMap::new();
        assert_eq!(basic_user(&h).unwrap(), None);
        // base64("root:")
        h.insert("authorization", "Basic cm9vdDo=".parse().unwrap());
        assert_eq!(basic_user(&h).unwrap().as_deref(), Some("root"));
        h.insert("authorization", "Bearer x".parse().unwrap());
        assert!(basic_user(&h).is_err());
        h.insert("authorization", "Basic !!!".parse().unwrap());
        assert!(basic_user(&h).is_err());
    }

    #[test]
    fn templates_validate_and_base_is_always_there() {
        let mut c = E2bConfig {
            listen: None,
            domain: None,
            templates: BTreeMap::new(),
        };
        c.templates.insert(
            "py".into(),
            serde_json::json!({"image": "host", "user": "root", "resources": {"memory": "1G"}}),
        );
        c.check().unwrap();
        assert!(c.clone().with_base().templates.contains_key("base"));
        c.templates
            .insert("bad".into(), serde_json::json!({"colour": "blue"}));
        assert!(c.check().unwrap_err().contains("e2b.templates.bad.colour"));
        c.templates.remove("bad");
        c.templates
            .insert("bad".into(), serde_json::json!({"user": "x y"}));
        assert!(c.check().unwrap_err().contains("e2b.templates.bad"));
        c.templates.remove("bad");
        c.templates
            .insert("t".into(), serde_json::json!({"timeout": 5}));
        assert!(c.check().is_err());
        c.templates.remove("t");
        c.domain = Some("sandboxes.example.com".into());
        c.check().unwrap();
        c.domain = Some("Bad_Domain".into());
        assert!(c.check().unwrap_err().contains("e2b.domain"));
    }

    #[test]
    fn config_parses_from_toml() {
        #[derive(Deserialize)]
        struct W {
            e2b: E2bConfig,
        }
        let w: W = toml::from_str(
            "[e2b]\nlisten = \"127.0.0.1:49983\"\n[e2b.templates.base]\nimage = \"host\"\nuser = \"root\"\n",
        )
        .unwrap();
        assert_eq!(w.e2b.listen, Some("127.0.0.1:49983".parse().unwrap()));
        assert_eq!(w.e2b.templates["base"]["user"], "root");
    }
}
