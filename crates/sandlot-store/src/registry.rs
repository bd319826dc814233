//! Pulling from and pushing to OCI registries (Distribution API v2).
//!
//! Manifests: OCI image manifests and Docker v2 schema 2, behind OCI image indexes
//! or Docker manifest lists (the `linux/<host arch>` entry is taken). Every
//! manifest and blob is verified against its digest (and size) before it is used;
//! layers are verified again against the config's `rootfs.diff_ids` while they are
//! unpacked. Blobs and layers already in the store are not downloaded again. The
//! image is recorded only when every layer is stored, so a failed pull leaves no
//! image behind (the layers it completed stay, unreferenced, for the next attempt
//! or `prune`).
//!
//! Authentication: anonymous, Basic, and the Bearer token flow (a `401` with
//! `WWW-Authenticate: Bearer realm=...,service=...,scope=...` sends the client to
//! the realm for a token for that scope, with Basic credentials when it has any).
//! Credentials come from the caller or from a docker-style `config.json`
//! (`auths.<host>.auth`); they are never logged, and `Debug` redacts them.
//!
//! Transport: HTTPS with certificates verified against the host's trust store;
//! plain HTTP only for registries the operator lists as insecure.
//!
//! Blocking (ureq): the daemon runs pulls and pushes on its blocking pool.

use std::fs;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;

use crate::digest::HashingWriter;
use crate::oci::{self, host_arch, Descriptor, Manifest, Progress};
use crate::{media, Digest, ImageInfo, ImageName, ImageStore, LayerInfo, StoreError};

/// Largest manifest, index or config accepted.
const MAX_JSON: u64 = 8 << 20;

/// Errors of registry operations.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("invalid image reference {reference:?}: {problem}")]
    BadReference { reference: String, problem: String },
    #[error("{op} {url}: {detail}")]
    Transport {
        op: &'static str,
        url: String,
        detail: String,
    },
    #[error("{op} {url}: registry answered {status}{detail}")]
    Status {
        op: &'static str,
        url: String,
        status: u16,
        detail: String,
    },
    #[error("registry {registry} refused the credentials or requires some: {detail}")]
    Unauthorized { registry: String, detail: String },
    #[error("{what}: {problem}")]
    Manifest { what: String, problem: String },
    #[error("{reference} has no image for linux/{arch} (it has: {available})")]
    NoPlatform {
        reference: String,
        arch: String,
        available: String,
    },
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: String,
        #[source]
        source: io::Error,
    },
    #[error("registry credentials file {path}: {problem}")]
    AuthFile { path: String, problem: String },
}

fn manifest_err(what: impl Into<String>, problem: impl Into<String>) -> RegistryError {
    RegistryError::Manifest {
        what: what.into(),
        problem: problem.into(),
    }
}

/// A registry image reference: `HOST[:PORT]/PATH[:TAG][@sha256:...]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reference {
    /// `host` or `host:port`.
    pub registry: String,
    /// The repository path on the registry (`team/app`).
    pub repository: String,
    pub tag: Option<String>,
    pub digest: Option<Digest>,
}

impl Reference {
    /// Parses `reference`. Without a registry host, `default_registry` is used; a
    /// reference naming no registry when there is no default is refused (Sandlot
    /// knows no registry by itself).
    pub fn parse(
        reference: &str,
        default_registry: Option<&str>,
    ) -> Result<Reference, RegistryError> {
        let bad = |problem: &str| RegistryError::BadReference {
            reference: reference.to_string(),
            problem: problem.to_string(),
        };
        let (name, digest) = match reference.split_once('@') {
            Some((n, d)) => (
                n,
                Some(d.parse::<Digest>().map_err(|_| {
                    bad("the part after '@' must be sha256:<64 lowercase hex digits>")
                })?),
            ),
            None => (reference, None),
        };
        let parsed = ImageName::parse(name).map_err(|e| bad(e.problem))?;
        let explicit_tag = {
            let slash = name.rfind('/').map_or(0, |i| i + 1);
            name[slash..].contains(':')
        };
        let (registry, repository) = match parsed.registry() {
            Some(r) => (r.to_string(), parsed.path().to_string()),
            None => match default_registry {
                Some(d) => (d.to_string(), parsed.repo.clone()),
                None => {
                    return Err(bad(
                        "it names no registry host: write HOST[:PORT]/PATH[:TAG] (or set images.default_registry in the daemon's config)",
                    ))
                }
            },
        };
        let tag = if explicit_tag || digest.is_none() {
            Some(parsed.tag)
        } else {
            None
        };
        Ok(Reference {
            registry,
            repository,
            tag,
            digest,
        })
    }

    /// What manifests are fetched by: the digest when given, else the tag.
    fn manifest_ref(&self) -> String {
        match (&self.digest, &self.tag) {
            (Some(d), _) => d.to_string(),
            (None, Some(t)) => t.clone(),
            (None, None) => "latest".into(),
        }
    }

    /// The local name an image pulled by this reference gets (none for a pull by
    /// digest alone).
    pub fn local_name(&self) -> Option<ImageName> {
        let t = self.tag.as_ref()?;
        ImageName::parse(&format!("{}/{}:{}", self.registry, self.repository, t)).ok()
    }
}

impl std::fmt::Display for Reference {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.registry, self.repository)?;
        if let Some(t) = &self.tag {
            write!(f, ":{t}")?;
        }
        if let Some(d) = &self.digest {
            write!(f, "@{d}")?;
        }
        Ok(())
    }
}

/// A username and password (or identity token). `Debug` shows neither.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    pub username: String,
    pub password: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Credentials(<redacted>)")
    }
}

/// How the daemon talks to registries (from its config).
#[derive(Debug, Clone, Default)]
pub struct RegistryConfig {
    /// `host[:port]` entries reached over plain HTTP (no TLS).
    pub insecure: Vec<String>,
    /// A docker-style `config.json` to take credentials from.
    pub auth_file: Option<PathBuf>,
    /// The registry of references that name none.
    pub default_registry: Option<String>,
    /// Extra CA certificates (PEM) trusted besides the host's.
    pub ca_file: Option<PathBuf>,
}

/// What a pull or push reports as it goes.
#[derive(Debug, Clone)]
pub enum Event {
    /// The manifest the reference resolved to.
    Manifest { digest: Digest, layers: usize },
    /// Per-layer progress (the layer is named by its blob digest).
    Layer(Progress),
}

/// Docker `config.json` credentials for `registry`.
pub fn credentials_from_file(
    path: &Path,
    registry: &str,
) -> Result<Option<Credentials>, RegistryError> {
    #[derive(Deserialize)]
    struct Entry {
        #[serde(default)]
        auth: Option<String>,
        #[serde(default)]
        username: Option<String>,
        #[serde(default)]
        password: Option<String>,
        #[serde(default)]
        identitytoken: Option<String>,
    }
    #[derive(Deserialize)]
    struct File {
        #[serde(default)]
        auths: std::collections::BTreeMap<String, Entry>,
    }
    let bad = |problem: String| RegistryError::AuthFile {
        path: path.display().to_string(),
        problem,
    };
    let b = match fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(bad(e.to_string())),
    };
    // The parse error names a position, never the content (it holds secrets).
    let f: File = serde_json::from_slice(&b).map_err(|e| {
        bad(format!(
            "not valid JSON (line {}, column {})",
            e.line(),
            e.column()
        ))
    })?;
    let key_host = |k: &str| -> String {
        let k = k
            .strip_prefix("https://")
            .or_else(|| k.strip_prefix("http://"))
            .unwrap_or(k);
        k.split('/').next().unwrap_or(k).to_string()
    };
    for (k, e) in f.auths {
        if key_host(&k) != registry {
            continue;
        }
        if let Some(a) = e.auth.filter(|a| !a.is_empty()) {
            use base64::Engine;
            let raw = base64::engine::general_purpose::STANDARD
                .decode(a.trim())
                .map_err(|_| bad(format!("auths.{k}.auth is not base64")))?;
            let s =
                String::from_utf8(raw).map_err(|_| bad(format!("auths.{k}.auth is not UTF-8")))?;
            let (u, p) = s
                .split_once(':')
                .ok_or_else(|| bad(format!("auths.{k}.auth is not USER:PASSWORD")))?;
            return Ok(Some(Credentials {
                username: u.to_string(),
                password: p.to_string(),
            }));
        }
        if let (Some(u), Some(p)) = (e.username, e.password) {
            return Ok(Some(Credentials {
                username: u,
                password: p,
            }));
        }
        if let Some(t) = e.identitytoken {
            return Ok(Some(Credentials {
                username: "<token>".into(),
                password: t,
            }));
        }
    }
    Ok(None)
}

/// A `WWW-Authenticate` challenge.
#[derive(Debug, Default, PartialEq, Eq)]
struct Challenge {
    scheme: String,
    params: Vec<(String, String)>,
}

impl Challenge {
    fn param(&self, k: &str) -> Option<&str> {
        self.params
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(k))
            .map(|(_, v)| v.as_str())
    }
}

/// Parses `Scheme k="v", k2=v2` (quoted values may hold commas).
fn parse_challenge(h: &str) -> Challenge {
    let h = h.trim();
    let (scheme, mut rest) = h.split_once(' ').unwrap_or((h, ""));
    let mut params = Vec::new();
    loop {
        rest = rest.trim_start_matches([' ', ',']);
        let Some(eq) = rest.find('=') else { break };
        let key = rest[..eq].trim().to_string();
        rest = &rest[eq + 1..];
        let value;
        if let Some(r) = rest.strip_prefix('"') {
            let mut v = String::new();
            let mut chars = r.char_indices();
            let mut end = r.len();
            while let Some((i, c)) = chars.next() {
                match c {
                    '\\' => {
                        if let Some((_, n)) = chars.next() {
                            v.push(n);
                        }
                    }
                    '"' => {
                        end = i + 1;
                        break;
                    }
                    c => v.push(c),
                }
            }
            value = v;
            rest = &r[end.min(r.len())..];
        } else {
            let end = rest.find(',').unwrap_or(rest.len());
            value = rest[..end].trim().to_string();
            rest = &rest[end..];
        }
        params.push((key, value));
    }
    Challenge {
        scheme: scheme.to_string(),
        params,
    }
}

/// Roots for TLS: the host's trust store plus the operator's extra CAs.
fn tls_roots(ca_file: Option<&Path>) -> Result<ureq::tls::RootCerts, RegistryError> {
    let mut certs: Vec<ureq::tls::Certificate<'static>> = Vec::new();
    let native = rustls_native_certs::load_native_certs();
    for c in native.certs {
        certs.push(ureq::tls::Certificate::from_der(c.as_ref()).to_owned());
    }
    if let Some(p) = ca_file {
        let pem = fs::read(p).map_err(|source| RegistryError::Io {
            op: "read CA file",
            path: p.display().to_string(),
            source,
        })?;
        for item in ureq::tls::parse_pem(&pem) {
            if let Ok(ureq::tls::PemItem::Certificate(c)) = item {
                certs.push(c.to_owned());
            }
        }
    }
    if certs.is_empty() {
        // No host trust store: the built-in Mozilla roots.
        return Ok(ureq::tls::RootCerts::WebPki);
    }
    Ok(ureq::tls::RootCerts::Specific(Arc::new(certs)))
}

/// A request body that can be sent again (after a new token).
enum Payload<'a> {
    Empty,
    Bytes(&'a [u8]),
    File {
        path: &'a Path,
        size: u64,
        progress: Option<(&'a dyn Fn(Event), Digest)>,
    },
}

/// A reader that reports how far it got.
struct Counting<'a, R> {
    inner: R,
    done: u64,
    last: u64,
    report: Option<(&'a dyn Fn(Event), Digest)>,
}

impl<R: Read> Read for Counting<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.done += n as u64;
        if let Some((f, d)) = &self.report {
            if self.done - self.last >= 1 << 20 || (n == 0 && self.done != self.last) {
                self.last = self.done;
                f(Event::Layer(Progress::Advance {
                    layer: *d,
                    done: self.done,
                }));
            }
        }
        Ok(n)
    }
}

/// A connection to one repository of one registry, with its auth state.
pub struct Session {
    agent: ureq::Agent,
    base: String,
    registry: String,
    repository: String,
    scope: String,
    creds: Option<Credentials>,
    insecure: bool,
    /// `Authorization` header value, once known.
    auth: Option<String>,
}

impl Session {
    /// Opens a session for `reference` (`push`: also ask for push rights).
    pub fn new(
        cfg: &RegistryConfig,
        reference: &Reference,
        creds: Option<Credentials>,
        push: bool,
    ) -> Result<Session, RegistryError> {
        let insecure = cfg.insecure.iter().any(|h| h == &reference.registry);
        let creds = match creds {
            Some(c) => Some(c),
            None => match &cfg.auth_file {
                Some(p) => credentials_from_file(p, &reference.registry)?,
                None => None,
            },
        };
        let tls = ureq::tls::TlsConfig::builder()
            .provider(ureq::tls::TlsProvider::Rustls)
            .root_certs(tls_roots(cfg.ca_file.as_deref())?)
            .build();
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .https_only(!insecure)
            .tls_config(tls)
            .timeout_connect(Some(Duration::from_secs(30)))
            .timeout_recv_response(Some(Duration::from_secs(120)))
            .max_redirects(5)
            .user_agent(concat!("sandlot/", env!("CARGO_PKG_VERSION")))
            .build()
            .into();
        Ok(Session {
            agent,
            base: format!(
                "{}://{}",
                if insecure { "http" } else { "https" },
                reference.registry
            ),
            registry: reference.registry.clone(),
            repository: reference.repository.clone(),
            scope: format!(
                "repository:{}:{}",
                reference.repository,
                if push { "pull,push" } else { "pull" }
            ),
            creds,
            insecure,
            auth: None,
        })
    }

    fn url(&self, tail: &str) -> String {
        format!("{}/v2/{}/{}", self.base, self.repository, tail)
    }

    fn transport(op: &'static str, url: &str, e: ureq::Error) -> RegistryError {
        RegistryError::Transport {
            op,
            url: url.to_string(),
            detail: e.to_string(),
        }
    }

    fn send_once(
        &self,
        method: &str,
        url: &str,
        headers: &[(&str, &str)],
        body: &Payload<'_>,
        op: &'static str,
    ) -> Result<ureq::http::Response<ureq::Body>, RegistryError> {
        let mut b = ureq::http::Request::builder().method(method).uri(url);
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        if let Some(a) = &self.auth {
            b = b.header("authorization", a.as_str());
        }
        let bad = |e: ureq::http::Error| RegistryError::Transport {
            op,
            url: url.to_string(),
            detail: e.to_string(),
        };
        let r = match body {
            Payload::Empty => self.agent.run(b.body(()).map_err(bad)?),
            Payload::Bytes(d) => self.agent.run(b.body(*d).map_err(bad)?),
            Payload::File {
                path,
                size,
                progress,
            } => {
                let f = fs::File::open(path).map_err(|source| RegistryError::Io {
                    op: "open",
                    path: path.display().to_string(),
                    source,
                })?;
                let reader = Counting {
                    inner: io::BufReader::with_capacity(256 << 10, f),
                    done: 0,
                    last: 0,
                    report: *progress,
                };
                let req = b
                    .header("content-length", size.to_string())
                    .body(())
                    .map_err(bad)?;
                // A body of known length, read (and reported) as it is sent.
                let (parts, ()) = req.into_parts();
                let mut reader = reader;
                let req = ureq::http::Request::from_parts(
                    parts,
                    ureq::SendBody::from_reader(&mut reader),
                );
                self.agent.run(req)
            }
        };
        r.map_err(|e| Self::transport(op, url, e))
    }

    /// Sends a request; on `401`, authenticates from the challenge and sends it
    /// once more.
    fn send(
        &mut self,
        method: &str,
        url: &str,
        headers: &[(&str, &str)],
        body: Payload<'_>,
        op: &'static str,
    ) -> Result<ureq::http::Response<ureq::Body>, RegistryError> {
        let r = self.send_once(method, url, headers, &body, op)?;
        if r.status().as_u16() != 401 {
            return Ok(r);
        }
        let challenge = r
            .headers()
            .get("www-authenticate")
            .and_then(|v| v.to_str().ok())
            .map(parse_challenge)
            .unwrap_or_default();
        self.authenticate(&challenge)?;
        let r = self.send_once(method, url, headers, &body, op)?;
        if r.status().as_u16() == 401 {
            return Err(RegistryError::Unauthorized {
                registry: self.registry.clone(),
                detail: format!(
                    "{op} {url} is still refused after authenticating{}",
                    if self.creds.is_none() {
                        " anonymously (give credentials)"
                    } else {
                        ""
                    }
                ),
            });
        }
        Ok(r)
    }

    fn basic(&self) -> Option<String> {
        use base64::Engine;
        self.creds.as_ref().map(|c| {
            format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD
                    .encode(format!("{}:{}", c.username, c.password))
            )
        })
    }

    fn authenticate(&mut self, ch: &Challenge) -> Result<(), RegistryError> {
        let unauthorized = |detail: String| RegistryError::Unauthorized {
            registry: self.registry.clone(),
            detail,
        };
        if ch.scheme.eq_ignore_ascii_case("basic") {
            let Some(b) = self.basic() else {
                return Err(unauthorized(
                    "it asks for Basic credentials and none were given".into(),
                ));
            };
            self.auth = Some(b);
            return Ok(());
        }
        if !ch.scheme.eq_ignore_ascii_case("bearer") {
            return Err(unauthorized(format!(
                "unsupported authentication scheme {:?}",
                ch.scheme
            )));
        }
        let realm = ch
            .param("realm")
            .ok_or_else(|| unauthorized("Bearer challenge without a realm".into()))?;
        if realm.starts_with("http://") && !self.insecure {
            return Err(unauthorized(format!(
                "token realm {realm} is plain HTTP: allowed only for registries listed in images.insecure_registries"
            )));
        }
        if !realm.starts_with("https://") && !realm.starts_with("http://") {
            return Err(unauthorized(format!(
                "token realm {realm:?} is not an http(s) URL"
            )));
        }
        let scope = ch
            .param("scope")
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .unwrap_or_else(|| self.scope.clone());
        // Ask for our scope too (a challenge from `/v2/` names none).
        let mut q = form_urlencoded::Serializer::new(String::new());
        if let Some(s) = ch.param("service") {
            q.append_pair("service", s);
        }
        q.append_pair("scope", &scope);
        if scope != self.scope {
            q.append_pair("scope", &self.scope);
        }
        let url = format!(
            "{realm}{}{}",
            if realm.contains('?') { '&' } else { '?' },
            q.finish()
        );
        let mut b = ureq::http::Request::builder().method("GET").uri(&url);
        if let Some(basic) = self.basic() {
            b = b.header("authorization", basic);
        }
        let req = b.body(()).map_err(|e| RegistryError::Transport {
            op: "request a token",
            url: realm.to_string(),
            detail: e.to_string(),
        })?;
        // The realm may be another host: a separate agent keeps the registry's
        // plain-HTTP allowance only when the realm is plain HTTP by the check above.
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .https_only(!realm.starts_with("http://"))
            .tls_config(self.agent.config().tls_config().clone())
            .timeout_connect(Some(Duration::from_secs(30)))
            .timeout_recv_response(Some(Duration::from_secs(60)))
            .build()
            .into();
        let r = agent
            .run(req)
            .map_err(|e| Self::transport("request a token", realm, e))?;
        let status = r.status().as_u16();
        if status == 401 || status == 403 {
            return Err(unauthorized(format!(
                "the token service {realm} refused {} (HTTP {status})",
                if self.creds.is_some() {
                    "the credentials"
                } else {
                    "an anonymous request"
                }
            )));
        }
        if status != 200 {
            return Err(RegistryError::Status {
                op: "request a token",
                url: realm.to_string(),
                status,
                detail: String::new(),
            });
        }
        let body = r
            .into_body()
            .with_config()
            .limit(1 << 20)
            .read_to_vec()
            .map_err(|e| Self::transport("read the token", realm, e))?;
        #[derive(Deserialize)]
        struct Tok {
            #[serde(default)]
            token: Option<String>,
            #[serde(default)]
            access_token: Option<String>,
        }
        let t: Tok = serde_json::from_slice(&body).map_err(|_| {
            unauthorized(format!("the token service {realm} answered no JSON token"))
        })?;
        let tok = t
            .token
            .or(t.access_token)
            .filter(|t| !t.is_empty())
            .ok_or_else(|| unauthorized(format!("the token service {realm} answered no token")))?;
        self.auth = Some(format!("Bearer {tok}"));
        Ok(())
    }

    fn status_err(
        op: &'static str,
        url: &str,
        r: ureq::http::Response<ureq::Body>,
    ) -> RegistryError {
        let status = r.status().as_u16();
        let mut body = r.into_body();
        let text = body
            .with_config()
            .limit(4096)
            .read_to_string()
            .unwrap_or_default();
        // Registries answer {"errors":[{"code","message"}]}.
        let detail = serde_json::from_str::<Value>(&text)
            .ok()
            .and_then(|v| {
                v["errors"].as_array().map(|a| {
                    a.iter()
                        .map(|e| {
                            format!(
                                "{}: {}",
                                e["code"].as_str().unwrap_or("?"),
                                e["message"].as_str().unwrap_or("")
                            )
                        })
                        .collect::<Vec<_>>()
                        .join("; ")
                })
            })
            .map(|d| format!(" ({d})"))
            .unwrap_or_default();
        if status == 401 || status == 403 {
            return RegistryError::Unauthorized {
                registry: url.split('/').nth(2).unwrap_or_default().to_string(),
                detail: format!("{op} {url}: HTTP {status}{detail}"),
            };
        }
        RegistryError::Status {
            op,
            url: url.to_string(),
            status,
            detail,
        }
    }

    /// Fetches a manifest (or index) by tag or digest; verifies it against
    /// `expected`, and against the registry's `Docker-Content-Digest`.
    fn manifest(
        &mut self,
        reference: &str,
        expected: Option<&Digest>,
    ) -> Result<(Vec<u8>, String, Digest), RegistryError> {
        let url = self.url(&format!("manifests/{reference}"));
        let accept = [
            media::OCI_MANIFEST,
            media::OCI_INDEX,
            media::DOCKER_MANIFEST,
            media::DOCKER_LIST,
        ]
        .join(", ");
        let r = self.send(
            "GET",
            &url,
            &[("accept", &accept)],
            Payload::Empty,
            "fetch manifest",
        )?;
        if r.status().as_u16() != 200 {
            return Err(Self::status_err("fetch manifest", &url, r));
        }
        let ctype = r
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .map(|s| s.split(';').next().unwrap_or(s).trim().to_string())
            .unwrap_or_default();
        let header_digest = r
            .headers()
            .get("docker-content-digest")
            .and_then(|v| v.to_str().ok())
            .and_then(|s| s.parse::<Digest>().ok());
        let body = r
            .into_body()
            .with_config()
            .limit(MAX_JSON)
            .read_to_vec()
            .map_err(|e| Self::transport("read manifest", &url, e))?;
        let got = Digest::of(&body);
        for e in expected.into_iter().chain(header_digest.as_ref()) {
            if *e != got {
                return Err(StoreError::DigestMismatch {
                    what: format!("manifest {reference} of {}", self.repository),
                    expected: *e,
                    actual: got,
                }
                .into());
            }
        }
        Ok((body, ctype, got))
    }

    /// Downloads a blob into `to`, verifying size and digest on the way.
    fn fetch_blob(
        &mut self,
        d: &Descriptor,
        to: &Path,
        progress: &dyn Fn(Event),
    ) -> Result<(), RegistryError> {
        let url = self.url(&format!("blobs/{}", d.digest));
        let r = self.send("GET", &url, &[], Payload::Empty, "fetch blob")?;
        if r.status().as_u16() != 200 {
            return Err(Self::status_err("fetch blob", &url, r));
        }
        let io_err = |op, source| RegistryError::Io {
            op,
            path: to.display().to_string(),
            source,
        };
        let f = fs::File::create(to).map_err(|e| io_err("create", e))?;
        let mut w = HashingWriter::new(io::BufWriter::with_capacity(256 << 10, f));
        let mut body = r.into_body();
        let mut rd = body.as_reader();
        let mut buf = vec![0u8; 256 << 10];
        let mut last = 0u64;
        loop {
            let n = rd.read(&mut buf).map_err(|e| RegistryError::Transport {
                op: "download blob",
                url: url.clone(),
                detail: e.to_string(),
            })?;
            if n == 0 {
                break;
            }
            w.write_all(&buf[..n]).map_err(|e| io_err("write", e))?;
            let count = w.count();
            if count > d.size {
                return Err(manifest_err(
                    format!("blob {}", d.digest),
                    format!(
                        "the registry sent more than the {} bytes the manifest gives",
                        d.size
                    ),
                ));
            }
            if count - last >= 1 << 20 {
                last = count;
                progress(Event::Layer(Progress::Advance {
                    layer: d.digest,
                    done: count,
                }));
            }
        }
        let (inner, got, n) = w.finish();
        inner
            .into_inner()
            .map_err(|e| io_err("write", e.into_error()))?
            .sync_all()
            .map_err(|e| io_err("sync", e))?;
        if n != d.size {
            return Err(manifest_err(
                format!("blob {}", d.digest),
                format!("the registry sent {n} bytes, the manifest gives {}", d.size),
            ));
        }
        if got != d.digest {
            return Err(StoreError::DigestMismatch {
                what: format!("blob {} of {}", d.digest, self.repository),
                expected: d.digest,
                actual: got,
            }
            .into());
        }
        progress(Event::Layer(Progress::Advance {
            layer: d.digest,
            done: n,
        }));
        Ok(())
    }

    fn fetch_small_blob(&mut self, d: &Descriptor, what: &str) -> Result<Vec<u8>, RegistryError> {
        if d.size > MAX_JSON {
            return Err(manifest_err(what, format!("{} bytes is too large", d.size)));
        }
        let url = self.url(&format!("blobs/{}", d.digest));
        let r = self.send("GET", &url, &[], Payload::Empty, "fetch blob")?;
        if r.status().as_u16() != 200 {
            return Err(Self::status_err("fetch blob", &url, r));
        }
        let b = r
            .into_body()
            .with_config()
            .limit(MAX_JSON)
            .read_to_vec()
            .map_err(|e| Self::transport("read blob", &url, e))?;
        let got = Digest::of(&b);
        if got != d.digest {
            return Err(StoreError::DigestMismatch {
                what: what.to_string(),
                expected: d.digest,
                actual: got,
            }
            .into());
        }
        Ok(b)
    }

    fn blob_exists(&mut self, d: &Digest) -> Result<bool, RegistryError> {
        let url = self.url(&format!("blobs/{d}"));
        let r = self.send("HEAD", &url, &[], Payload::Empty, "check blob")?;
        match r.status().as_u16() {
            200 => Ok(true),
            404 => Ok(false),
            _ => Err(Self::status_err("check blob", &url, r)),
        }
    }

    /// Uploads a blob (monolithic: one POST, one PUT).
    fn upload_blob(&mut self, d: &Digest, body: Payload<'_>) -> Result<(), RegistryError> {
        let url = self.url("blobs/uploads/");
        let r = self.send(
            "POST",
            &url,
            &[("content-length", "0")],
            Payload::Empty,
            "start upload",
        )?;
        if r.status().as_u16() != 202 {
            return Err(Self::status_err("start upload", &url, r));
        }
        let loc = r
            .headers()
            .get("location")
            .and_then(|v| v.to_str().ok())
            .ok_or_else(|| {
                manifest_err(
                    format!("upload of {d}"),
                    "the registry gave no upload location",
                )
            })?
            .to_string();
        let loc = if loc.starts_with("http://") || loc.starts_with("https://") {
            loc
        } else {
            format!("{}{}", self.base, loc)
        };
        let put = format!(
            "{loc}{}digest={}",
            if loc.contains('?') { '&' } else { '?' },
            form_urlencoded::byte_serialize(d.to_string().as_bytes()).collect::<String>()
        );
        let r = self.send(
            "PUT",
            &put,
            &[("content-type", "application/octet-stream")],
            body,
            "upload blob",
        )?;
        if r.status().as_u16() != 201 {
            return Err(Self::status_err("upload blob", &put, r));
        }
        Ok(())
    }
}

/// The manifest (and its digest) for this host's platform, following an index.
fn resolve_manifest(
    s: &mut Session,
    reference: &Reference,
) -> Result<(Manifest, Digest), RegistryError> {
    let (mut body, mut ctype, mut digest) =
        s.manifest(&reference.manifest_ref(), reference.digest.as_ref())?;
    for _ in 0..3 {
        let v: Value = serde_json::from_slice(&body)
            .map_err(|e| manifest_err(format!("manifest {digest}"), e.to_string()))?;
        let mt = v["mediaType"]
            .as_str()
            .map(str::to_string)
            .unwrap_or(ctype.clone());
        if v["schemaVersion"].as_u64() == Some(1) {
            return Err(manifest_err(
                format!("manifest {digest}"),
                "Docker schema 1 manifests are not supported (push the image again with a current tool)",
            ));
        }
        let is_index = mt == media::OCI_INDEX
            || mt == media::DOCKER_LIST
            || (v.get("manifests").is_some() && v.get("layers").is_none());
        if !is_index {
            let m: Manifest = serde_json::from_value(v)
                .map_err(|e| manifest_err(format!("manifest {digest}"), e.to_string()))?;
            return Ok((m, digest));
        }
        let descs: Vec<Descriptor> = serde_json::from_value(v["manifests"].clone())
            .map_err(|e| manifest_err(format!("index {digest}"), e.to_string()))?;
        let plat = |d: &Descriptor| -> (String, String) {
            let p = d.platform.clone().unwrap_or(Value::Null);
            (
                p["os"].as_str().unwrap_or("?").to_string(),
                p["architecture"].as_str().unwrap_or("?").to_string(),
            )
        };
        let pick = descs
            .iter()
            .find(|d| plat(d) == ("linux".to_string(), host_arch().to_string()))
            .cloned();
        let Some(pick) = pick else {
            return Err(RegistryError::NoPlatform {
                reference: reference.to_string(),
                arch: host_arch().to_string(),
                available: descs
                    .iter()
                    .map(|d| {
                        let (o, a) = plat(d);
                        format!("{o}/{a}")
                    })
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        };
        (body, ctype, digest) = s.manifest(&pick.digest.to_string(), Some(&pick.digest))?;
    }
    Err(manifest_err(
        reference.to_string(),
        "indexes nested too deep",
    ))
}

/// Pulls `reference` into the store; tags it `tag` (default: the reference's
/// own name). Returns the image.
pub fn pull(
    store: &ImageStore,
    cfg: &RegistryConfig,
    reference: &Reference,
    creds: Option<Credentials>,
    tag: Option<&ImageName>,
    progress: &dyn Fn(Event),
) -> Result<ImageInfo, RegistryError> {
    let mut s = Session::new(cfg, reference, creds, false)?;
    let (m, mdigest) = resolve_manifest(&mut s, reference)?;
    progress(Event::Manifest {
        digest: mdigest,
        layers: m.layers.len(),
    });
    if m.config.media_type != media::OCI_CONFIG && m.config.media_type != media::DOCKER_CONFIG {
        return Err(manifest_err(
            format!("manifest {mdigest}"),
            format!("config type {} is not an image config", m.config.media_type),
        ));
    }
    let cfg_bytes = s.fetch_small_blob(&m.config, &format!("config {}", m.config.digest))?;
    let diff_ids = oci::diff_ids_of(&cfg_bytes)?;
    if diff_ids.len() != m.layers.len() {
        return Err(manifest_err(
            format!("manifest {mdigest}"),
            format!(
                "{} layers, {} diff ids in the config",
                m.layers.len(),
                diff_ids.len()
            ),
        ));
    }
    let mut layers: Vec<LayerInfo> = Vec::new();
    for (d, diff_id) in m.layers.iter().zip(&diff_ids) {
        let ok_type = [
            media::OCI_LAYER,
            media::OCI_LAYER_GZIP,
            media::DOCKER_LAYER,
            media::DOCKER_LAYER_GZIP,
        ]
        .contains(&d.media_type.as_str());
        if !ok_type {
            return Err(manifest_err(
                format!("layer {}", d.digest),
                format!(
                    "media type {} is not supported (plain or gzip tar layers are)",
                    d.media_type
                ),
            ));
        }
        if let Some(l) = store.layer(diff_id)? {
            if store.layer_dir(diff_id).is_dir() {
                progress(Event::Layer(Progress::Done {
                    layer: d.digest,
                    cached: true,
                }));
                layers.push(l);
                continue;
            }
        }
        progress(Event::Layer(Progress::Start {
            layer: d.digest,
            size: d.size,
        }));
        if !store.blob_path(&d.digest).is_file() {
            let staged = store.tmp_path("pull");
            let r = s.fetch_blob(d, &staged, progress);
            if let Err(e) = r {
                let _ = fs::remove_file(&staged);
                return Err(e);
            }
            store.adopt_blob(&staged, &d.digest)?;
        }
        let l = store.add_layer(&d.digest, &d.media_type, Some(diff_id))?;
        progress(Event::Layer(Progress::Done {
            layer: d.digest,
            cached: false,
        }));
        layers.push(l);
    }
    let name = tag.cloned().or_else(|| reference.local_name());
    Ok(store.add_image_raw(&cfg_bytes, &layers, None, "pull", name.as_ref())?)
}

/// Pushes a stored image to `reference` (a tag). Blobs the registry already has
/// are not sent. Returns the manifest's digest.
pub fn push(
    store: &ImageStore,
    cfg: &RegistryConfig,
    img: &ImageInfo,
    reference: &Reference,
    creds: Option<Credentials>,
    progress: &dyn Fn(Event),
) -> Result<Digest, RegistryError> {
    if reference.digest.is_some() {
        return Err(RegistryError::BadReference {
            reference: reference.to_string(),
            problem: "push to a tag, not a digest".into(),
        });
    }
    let tag = reference.tag.clone().unwrap_or_else(|| "latest".into());
    let mut s = Session::new(cfg, reference, creds, true)?;
    let manifest = oci::manifest_json(store, img)?;
    let mdigest = Digest::of(&manifest);
    progress(Event::Manifest {
        digest: mdigest,
        layers: img.layers.len(),
    });
    let mut seen = std::collections::HashSet::new();
    for l in &img.layers {
        if !seen.insert(l.blob) {
            continue;
        }
        if s.blob_exists(&l.blob)? {
            progress(Event::Layer(Progress::Done {
                layer: l.blob,
                cached: true,
            }));
            continue;
        }
        progress(Event::Layer(Progress::Start {
            layer: l.blob,
            size: l.blob_size,
        }));
        let path = store.blob_path(&l.blob);
        s.upload_blob(
            &l.blob,
            Payload::File {
                path: &path,
                size: l.blob_size,
                progress: Some((progress, l.blob)),
            },
        )?;
        progress(Event::Layer(Progress::Done {
            layer: l.blob,
            cached: false,
        }));
    }
    let cfg_bytes = store.config_bytes(&img.id)?;
    if !s.blob_exists(&img.id)? {
        s.upload_blob(&img.id, Payload::Bytes(&cfg_bytes))?;
    }
    let url = s.url(&format!("manifests/{tag}"));
    let r = s.send(
        "PUT",
        &url,
        &[("content-type", media::OCI_MANIFEST)],
        Payload::Bytes(&manifest),
        "put manifest",
    )?;
    if r.status().as_u16() != 201 {
        return Err(Session::status_err("put manifest", &url, r));
    }
    if let Some(d) = r
        .headers()
        .get("docker-content-digest")
        .and_then(|v| v.to_str().ok())
        .and_then(|s| s.parse::<Digest>().ok())
    {
        if d != mdigest {
            return Err(StoreError::DigestMismatch {
                what: format!("manifest pushed to {reference}"),
                expected: mdigest,
                actual: d,
            }
            .into());
        }
    }
    Ok(mdigest)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_parse() {
        let r = Reference::parse("127.0.0.1:5000/team/app:1.0", None).unwrap();
        assert_eq!(r.registry, "127.0.0.1:5000");
        assert_eq!(r.repository, "team/app");
        assert_eq!(r.tag.as_deref(), Some("1.0"));
        assert_eq!(
            r.local_name().unwrap().to_string(),
            "127.0.0.1:5000/team/app:1.0"
        );
        let r = Reference::parse("localhost/app", None).unwrap();
        assert_eq!(r.tag.as_deref(), Some("latest"));
        let d = Digest::of(b"x");
        let r = Reference::parse(&format!("reg.example.invalid/app@{d}"), None).unwrap();
        assert_eq!(r.digest, Some(d));
        assert_eq!(r.tag, None);
        assert_eq!(r.manifest_ref(), d.to_string());
        // No registry and no default: refused, naming the fix.
        let e = Reference::parse("team/app", None).unwrap_err().to_string();
        assert!(e.contains("names no registry host"), "{e}");
        let r = Reference::parse("team/app", Some("mirror.invalid:443")).unwrap();
        assert_eq!(r.registry, "mirror.invalid:443");
        for bad in [
            "",
            "UPPER/x",
            "127.0.0.1:5000/app@sha256:abc",
            "a b",
            "127.0.0.1:5000/app:",
        ] {
            assert!(Reference::parse(bad, None).is_err(), "{bad}");
        }
    }

    #[test]
    fn challenges_parse() {
        let c = parse_challenge(
            r#"Bearer realm="https://auth.invalid/token",service="reg",scope="repository:a/b:pull,push""#,
        );
        assert_eq!(c.scheme, "Bearer");
        assert_eq!(c.param("realm"), Some("https://auth.invalid/token"));
        assert_eq!(c.param("service"), Some("reg"));
        assert_eq!(c.param("scope"), Some("repository:a/b:pull,push"));
        let c = parse_challenge(r#"Basic realm="basic-realm""#);
        assert_eq!(c.scheme, "Basic");
        assert_eq!(c.param("realm"), Some("basic-realm"));
        let c = parse_challenge("Bearer realm=x, service=y");
        assert_eq!(c.param("service"), Some("y"));
    }

    #[test]
    fn docker_config_credentials() {
        let dir = std::env::temp_dir().join(format!("sandlot-auth-test-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let p = dir.join("config.json");
        use base64::Engine;
        let a = base64::engine::general_purpose::STANDARD.encode("alice:s3cret");
        fs::write(
            &p,
            format!(r#"{{"auths":{{"https://127.0.0.1:5000":{{"auth":"{a}"}},"other:1":{{"username":"u","password":"p"}}}}}}"#),
        )
        .unwrap();
        let c = credentials_from_file(&p, "127.0.0.1:5000")
            .unwrap()
            .unwrap();
        assert_eq!(
            (c.username.as_str(), c.password.as_str()),
            ("alice", "s3cret")
        );
        assert_eq!(format!("{c:?}"), "Credentials(<redacted>)");
        let c = credentials_from_file(&p, "other:1").unwrap().unwrap();
        assert_eq!(c.username, "u");
        assert!(credentials_from_file(&p, "nobody:1").unwrap().is_none());
        fs::write(&p, "{not json s3cret").unwrap();
        let e = credentials_from_file(&p, "x").unwrap_err().to_string();
        assert!(!e.contains("s3cret"), "{e}");
        fs::remove_dir_all(&dir).unwrap();
    }
}
