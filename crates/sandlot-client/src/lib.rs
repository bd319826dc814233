//! Typed async client of the Sandlot HTTP API v1, over the daemon's Unix socket
//! or TCP (with a bearer token). Used by the `sandlot` CLI.
//!
//! ```no_run
//! # async fn f() -> Result<(), sandlot_client::Error> {
//! use sandlot_client::{Client, CreateSandbox};
//! let c = Client::from_env()?;
//! let sb = c.create_sandbox(&CreateSandbox::default()).await?;
//! let out = c.run(&sb.id, &["echo", "hi"]).await?;
//! assert_eq!(out.stdout, b"hi\n");
//! c.delete_sandbox(&sb.id).await?;
//! # Ok(()) }
//! ```

#![forbid(unsafe_code)]

pub mod api;
pub mod checkpoint;
pub mod code;
mod conn;
pub mod network;
pub mod ports;
pub mod snapshot;
pub mod stream;
pub mod vfs;

use std::path::PathBuf;

use bytes::Bytes;
use http::{Method, StatusCode};
use serde::de::DeserializeOwned;
use serde::Serialize;

pub use api::*;
pub use code::CodeStream;
pub use conn::{BoxError, Dispatch, ReqBody, RespBody, Target};
pub use network::{NetLog, NetLogEntry};
pub use ports::{PortList, PublishPort, PublishedPort};
pub use stream::{ByteStream, OutputStream, WsSession};

/// Default daemon address: the operator's Unix socket.
pub const DEFAULT_HOST: &str = "unix:///run/sandlot/sandlot.sock";

/// Errors of the client.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The daemon answered with an error.
    #[error("{}{} ({} {})", .body.message, .body.field.as_ref().map(|_| "").unwrap_or(""), .status.as_u16(), .body.code)]
    Api {
        status: StatusCode,
        body: ApiErrorBody,
    },
    #[error("invalid daemon address {0:?} (SANDLOT_URL): use unix:///path.sock, /path.sock, http://HOST:PORT or HOST:PORT")]
    BadHost(String),
    #[error("cannot reach the daemon at {target}: {message}")]
    Connect { target: String, message: String },
    #[error("talking to the daemon: {0}")]
    Transport(String),
    #[error("unexpected answer from the daemon: {0}")]
    Decode(String),
}

impl Error {
    /// The API error code (`not_found`, `quota_exceeded`, ...), for API errors.
    pub fn code(&self) -> Option<&str> {
        match self {
            Error::Api { body, .. } => Some(&body.code),
            _ => None,
        }
    }

    /// The API error code as the shared enum; `None` for other errors and for
    /// a code newer than this client (then [`Error::code`] has its text).
    pub fn error_code(&self) -> Option<api::ErrorCode> {
        self.code().and_then(|c| c.parse().ok())
    }

    pub fn status(&self) -> Option<StatusCode> {
        match self {
            Error::Api { status, .. } => Some(*status),
            _ => None,
        }
    }
}

/// A sandbox to create: the typed request ([`CreateSandboxRequest`], the one
/// type the daemon parses a create body into, so every field it accepts is
/// here) plus top-level keys as JSON (a spec file passed through, or a body
/// built by hand), which override the request's fields of the same name.
///
/// ```
/// use sandlot_client::{CreateSandbox, CreateSandboxRequest};
/// let body = CreateSandbox::from(CreateSandboxRequest {
///     name: Some("worker".into()),
///     ..Default::default()
/// })
/// .with_spec(serde_json::Map::from_iter([(
///     "resources".to_string(),
///     serde_json::json!({"memory": "1G"}),
/// )]));
/// let sent = serde_json::to_value(&body).unwrap();
/// assert_eq!(sent, serde_json::json!({"name": "worker", "resources": {"memory": "1G"}}));
/// ```
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CreateSandbox {
    /// The typed fields.
    pub request: CreateSandboxRequest,
    /// Top-level keys sent as they are (`{"resources": {"memory": "1G"}}`),
    /// over the request's.
    pub spec: serde_json::Map<String, serde_json::Value>,
}

impl From<CreateSandboxRequest> for CreateSandbox {
    fn from(request: CreateSandboxRequest) -> CreateSandbox {
        CreateSandbox {
            request,
            spec: serde_json::Map::new(),
        }
    }
}

impl CreateSandbox {
    /// Adds the top-level keys of `spec` (a spec file's object, a body built
    /// by hand), over those added before.
    ///
    /// These raw keys override the typed fields of the same name when the body
    /// is sent, whole: a `"resources"` here replaces the request's `resources`
    /// (it is not merged into it), and a `"tags"` here replaces those of
    /// [`Self::with_tag`], whichever was called first.
    pub fn with_spec(mut self, spec: serde_json::Map<String, serde_json::Value>) -> CreateSandbox {
        self.spec.extend(spec);
        self
    }

    /// Names the sandbox (unique among the tenant's live ones).
    pub fn with_name(mut self, name: impl Into<String>) -> CreateSandbox {
        self.request.name = Some(name.into());
        self
    }

    /// Adds the tag `key` = `value`.
    pub fn with_tag(mut self, key: impl Into<String>, value: impl Into<String>) -> CreateSandbox {
        let tags = self.request.tags.get_or_insert_with(Default::default);
        tags.insert(key.into(), value.into());
        self
    }

    /// Adds the metadata entry `key` = `value`.
    pub fn with_metadata(
        mut self,
        key: impl Into<String>,
        value: impl Into<String>,
    ) -> CreateSandbox {
        let m = self.request.metadata.get_or_insert_with(Default::default);
        m.insert(key.into(), value.into());
        self
    }

    /// The body sent: the request's fields, then the JSON keys over them.
    pub fn to_json(&self) -> serde_json::Map<String, serde_json::Value> {
        let mut body = match serde_json::to_value(&self.request) {
            Ok(serde_json::Value::Object(m)) => m,
            // A struct of plain data serializes to an object.
            _ => serde_json::Map::new(),
        };
        body.extend(self.spec.iter().map(|(k, v)| (k.clone(), v.clone())));
        body
    }
}

impl Serialize for CreateSandbox {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.to_json().serialize(s)
    }
}

/// Filter of [`Client::list_sandboxes`].
#[derive(Debug, Clone, Default)]
pub struct ListFilter {
    /// e.g. `["running"]`, `["all"]`; empty: live sandboxes.
    pub states: Vec<String>,
    /// `(key, Some(value))` or `(key, None)` for "has the tag".
    pub tags: Vec<(String, Option<String>)>,
    pub name: Option<String>,
}

/// Collected result of [`Client::run`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunOutput {
    pub exit: ProcessExit,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

/// A client. Cheap to clone; clones share the connections kept for reuse.
#[derive(Debug, Clone)]
pub struct Client {
    conns: conn::Conns,
    token: Option<String>,
    tenant: Option<String>,
    agent: Option<String>,
}

/// Percent-encodes `s` for a URL path or query value: everything but ASCII letters,
/// digits and `-_.~/` (`/` is kept: memory keys and file paths are paths).
pub fn encode_path(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~/".contains(&b) {
            o.push(b as char);
        } else {
            o.push_str(&format!("%{b:02X}"));
        }
    }
    o
}

use encode_path as enc;

impl Client {
    /// A client of the daemon at `host` (see [`Target::parse`]).
    pub fn new(host: &str, token: Option<String>) -> Result<Client, Error> {
        Ok(Client {
            conns: conn::Conns::new(Target::parse(host)?),
            token: token.filter(|t| !t.is_empty()),
            tenant: None,
            agent: None,
        })
    }

    /// A client whose requests go to `dispatch` in this process (the daemon's own
    /// router), as the holder of `token`: the API's every check applies to them as
    /// to the same requests over TCP. WebSocket calls are not available.
    pub fn in_process(dispatch: std::sync::Arc<dyn Dispatch>, token: String) -> Client {
        Client {
            conns: conn::Conns::in_process(dispatch),
            token: Some(token).filter(|t| !t.is_empty()),
            tenant: None,
            agent: None,
        }
    }

    /// From `SANDLOT_URL` (default: the operator socket; `SANDLOT_HOST`, its old
    /// name, is still read) and `SANDLOT_TOKEN`, like the Python SDK.
    pub fn from_env() -> Result<Client, Error> {
        let host = std::env::var("SANDLOT_URL")
            .or_else(|_| std::env::var("SANDLOT_HOST"))
            .unwrap_or_else(|_| DEFAULT_HOST.to_string());
        Client::new(&host, std::env::var("SANDLOT_TOKEN").ok())
    }

    /// On the operator socket: act as this tenant (header `x-sandlot-tenant`).
    pub fn with_tenant(mut self, tenant: Option<String>) -> Client {
        self.tenant = tenant;
        self
    }

    /// Memory store writes: attribute commits to this agent (header `x-sandlot-agent`).
    pub fn with_agent(mut self, agent: Option<String>) -> Client {
        self.agent = agent;
        self
    }

    pub fn target(&self) -> &Target {
        self.conns.target()
    }

    /// Connections this client (and its clones) keep open for reuse.
    pub fn kept_connections(&self) -> usize {
        self.conns.kept_count()
    }

    fn headers(&self) -> Vec<(&'static str, String)> {
        let mut h = Vec::new();
        if let Some(t) = &self.token {
            h.push(("authorization", format!("Bearer {t}")));
        }
        if let Some(t) = &self.tenant {
            h.push(("x-sandlot-tenant", t.clone()));
        }
        if let Some(a) = &self.agent {
            h.push(("x-sandlot-agent", a.clone()));
        }
        h
    }

    async fn send(
        &self,
        method: Method,
        path: &str,
        ctype: Option<&str>,
        body: conn::ReqBody,
    ) -> Result<http::Response<RespBody>, Error> {
        let resp = self
            .conns
            .request(method, path, &self.headers(), ctype, body)
            .await?;
        if resp.status().is_success() {
            return Ok(resp);
        }
        Err(stream::error_of(resp).await)
    }

    async fn json<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<&impl Serialize>,
    ) -> Result<T, Error> {
        let b = match body {
            Some(b) => conn::full(serde_json::to_vec(b).map_err(|e| Error::Decode(e.to_string()))?),
            None => conn::empty(),
        };
        let resp = self
            .send(method, path, body.map(|_| "application/json"), b)
            .await?;
        let bytes = stream::collect(resp).await?;
        serde_json::from_slice(&bytes).map_err(|e| Error::Decode(format!("{path}: {e}")))
    }

    async fn no_content(
        &self,
        method: Method,
        path: &str,
        body: Option<&impl Serialize>,
    ) -> Result<(), Error> {
        let b = match body {
            Some(b) => conn::full(serde_json::to_vec(b).map_err(|e| Error::Decode(e.to_string()))?),
            None => conn::empty(),
        };
        let resp = self
            .send(method, path, body.map(|_| "application/json"), b)
            .await?;
        stream::collect(resp).await.map(|_| ())
    }

    // ---- images, volumes, secrets (untyped: see docs/api.md) ----

    /// A JSON request to any API path (`method`: `GET`, `POST`, `DELETE`...).
    /// Returns the answer's JSON (`null` for an empty body).
    pub async fn call_json(
        &self,
        method: &str,
        path: &str,
        body: Option<&serde_json::Value>,
    ) -> Result<serde_json::Value, Error> {
        let m = Method::from_bytes(method.as_bytes())
            .map_err(|e| Error::Transport(format!("method {method}: {e}")))?;
        let b = match body {
            Some(b) => conn::full(serde_json::to_vec(b).map_err(|e| Error::Decode(e.to_string()))?),
            None => conn::empty(),
        };
        let resp = self
            .send(m, path, body.map(|_| "application/json"), b)
            .await?;
        let bytes = stream::collect(resp).await?;
        if bytes.is_empty() {
            return Ok(serde_json::Value::Null);
        }
        serde_json::from_slice(&bytes).map_err(|e| Error::Decode(format!("{path}: {e}")))
    }

    /// Uploads a byte stream (POST, `application/x-tar`), JSON answer.
    pub async fn upload<S>(&self, path: &str, body: S) -> Result<serde_json::Value, Error>
    where
        S: futures_util::Stream<Item = Result<Bytes, std::io::Error>> + Send + Sync + 'static,
    {
        let resp = self
            .send(
                Method::POST,
                path,
                Some("application/x-tar"),
                conn::streaming(body),
            )
            .await?;
        let b = stream::collect(resp).await?;
        serde_json::from_slice(&b).map_err(|e| Error::Decode(e.to_string()))
    }

    /// POSTs a JSON body and returns the answer as a byte stream (NDJSON progress
    /// of pulls, pushes and builds).
    pub async fn post_stream(
        &self,
        path: &str,
        body: &serde_json::Value,
    ) -> Result<ByteStream, Error> {
        let b = conn::full(serde_json::to_vec(body).map_err(|e| Error::Decode(e.to_string()))?);
        let resp = self
            .send(Method::POST, path, Some("application/json"), b)
            .await?;
        Ok(ByteStream::new(resp))
    }

    /// POSTs a byte stream (`content_type`) and returns the answer as a byte stream.
    pub async fn upload_stream<S>(
        &self,
        path: &str,
        content_type: &str,
        body: S,
    ) -> Result<ByteStream, Error>
    where
        S: futures_util::Stream<Item = Result<Bytes, std::io::Error>> + Send + Sync + 'static,
    {
        let resp = self
            .send(
                Method::POST,
                path,
                Some(content_type),
                conn::streaming(body),
            )
            .await?;
        Ok(ByteStream::new(resp))
    }

    /// Downloads a byte stream (GET).
    pub async fn download(&self, path: &str) -> Result<ByteStream, Error> {
        let resp = self.send(Method::GET, path, None, conn::empty()).await?;
        Ok(ByteStream::new(resp))
    }

    pub async fn health(&self) -> Result<Health, Error> {
        self.json(Method::GET, "/v1/health", None::<&()>).await
    }

    pub async fn metrics(&self) -> Result<String, Error> {
        let resp = self
            .send(Method::GET, "/metrics", None, conn::empty())
            .await?;
        let b = stream::collect(resp).await?;
        Ok(String::from_utf8_lossy(&b).into_owned())
    }

    // ---- sandboxes ----

    pub async fn create_sandbox(&self, req: &CreateSandbox) -> Result<Sandbox, Error> {
        self.json(Method::POST, "/v1/sandboxes", Some(req)).await
    }

    /// [`Client::create_sandbox`] with an `Idempotency-Key`: safe to retry after a
    /// lost answer. A repeat with the same key and request gets the sandbox the
    /// first one made (for 24 h); the same key with another request is refused.
    pub async fn create_sandbox_with_key(
        &self,
        req: &CreateSandbox,
        key: &str,
    ) -> Result<Sandbox, Error> {
        let mut h = self.headers();
        h.push(("idempotency-key", key.to_string()));
        let b = conn::full(serde_json::to_vec(req).map_err(|e| Error::Decode(e.to_string()))?);
        let resp = self
            .conns
            .request(
                Method::POST,
                "/v1/sandboxes",
                &h,
                Some("application/json"),
                b,
            )
            .await?;
        if !resp.status().is_success() {
            return Err(stream::error_of(resp).await);
        }
        let bytes = stream::collect(resp).await?;
        serde_json::from_slice(&bytes).map_err(|e| Error::Decode(format!("/v1/sandboxes: {e}")))
    }

    pub async fn list_sandboxes(&self, f: &ListFilter) -> Result<Vec<Sandbox>, Error> {
        let mut q = Vec::new();
        if !f.states.is_empty() {
            q.push(format!("state={}", enc(&f.states.join(","))));
        }
        for (k, v) in &f.tags {
            match v {
                Some(v) => q.push(format!("tag={}", enc(&format!("{k}={v}")))),
                None => q.push(format!("tag={}", enc(k))),
            }
        }
        if let Some(n) = &f.name {
            q.push(format!("name={}", enc(n)));
        }
        let path = if q.is_empty() {
            "/v1/sandboxes".to_string()
        } else {
            format!("/v1/sandboxes?{}", q.join("&"))
        };
        let l: SandboxList = self.json(Method::GET, &path, None::<&()>).await?;
        Ok(l.sandboxes)
    }

    pub async fn get_sandbox(&self, id: &str) -> Result<Sandbox, Error> {
        self.json(
            Method::GET,
            &format!("/v1/sandboxes/{}", enc(id)),
            None::<&()>,
        )
        .await
    }

    /// Stops and removes a sandbox (idempotent); returns its final record.
    pub async fn delete_sandbox(&self, id: &str) -> Result<Sandbox, Error> {
        self.json(
            Method::DELETE,
            &format!("/v1/sandboxes/{}", enc(id)),
            None::<&()>,
        )
        .await
    }

    /// Pauses a running sandbox: its memory and files are saved (gVisor; `pause`
    /// is `memory`), or its files only (namespace backend: `filesystem`), and
    /// nothing of it runs until [`resume_sandbox`](Self::resume_sandbox).
    pub async fn pause_sandbox(&self, id: &str) -> Result<Sandbox, Error> {
        self.json(
            Method::POST,
            &format!("/v1/sandboxes/{}/pause", enc(id)),
            None::<&()>,
        )
        .await
    }

    /// Starts a paused sandbox again from what its pause saved.
    pub async fn resume_sandbox(&self, id: &str) -> Result<Sandbox, Error> {
        self.json(
            Method::POST,
            &format!("/v1/sandboxes/{}/resume", enc(id)),
            None::<&()>,
        )
        .await
    }

    /// The sandbox now ends `timeout` from now (seconds or `"10m"`).
    pub async fn set_timeout(
        &self,
        id: &str,
        timeout: serde_json::Value,
    ) -> Result<Sandbox, Error> {
        self.json(
            Method::POST,
            &format!("/v1/sandboxes/{}/timeout", enc(id)),
            Some(&SetTimeout { timeout }),
        )
        .await
    }

    pub async fn events(&self, id: &str) -> Result<Vec<SandboxEvent>, Error> {
        let l: EventList = self
            .json(
                Method::GET,
                &format!("/v1/sandboxes/{}/events", enc(id)),
                None::<&()>,
            )
            .await?;
        Ok(l.events)
    }

    /// Sandbox `id`'s CPU and memory over time, from `start_ms` to `end_ms` (Unix
    /// milliseconds; None: open), oldest first; none while it does not run.
    pub async fn sandbox_metrics(
        &self,
        id: &str,
        start_ms: Option<i64>,
        end_ms: Option<i64>,
    ) -> Result<sandlot_proto::api::metrics::MetricsHistory, Error> {
        let q: Vec<String> = [("start_ms", start_ms), ("end_ms", end_ms)]
            .into_iter()
            .filter_map(|(k, v)| v.map(|v| format!("{k}={v}")))
            .collect();
        self.json(
            Method::GET,
            &format!("/v1/sandboxes/{}/metrics?{}", enc(id), q.join("&")),
            None::<&()>,
        )
        .await
    }

    // ---- processes ----

    /// Starts a process; read its output with [`Client::output`].
    pub async fn exec(&self, id: &str, req: &ExecBody) -> Result<ProcessView, Error> {
        self.json(
            Method::POST,
            &format!("/v1/sandboxes/{}/exec", enc(id)),
            Some(req),
        )
        .await
    }

    /// Starts a process and streams its output (lossless, from the start).
    pub async fn exec_stream(
        &self,
        id: &str,
        req: &ExecBody,
    ) -> Result<(ProcessView, OutputStream), Error> {
        let body = conn::full(serde_json::to_vec(req).map_err(|e| Error::Decode(e.to_string()))?);
        let resp = self
            .send(
                Method::POST,
                &format!("/v1/sandboxes/{}/exec?stream=ndjson", enc(id)),
                Some("application/json"),
                body,
            )
            .await?;
        let mut s = OutputStream::new(resp);
        match s.next_event().await? {
            Some(StreamEvent::Started { process }) => Ok((process, s)),
            other => Err(Error::Decode(format!(
                "expected a started line, got {other:?}"
            ))),
        }
    }

    /// Runs a command to completion and collects its output.
    pub async fn run(&self, id: &str, argv: &[&str]) -> Result<RunOutput, Error> {
        let req = ExecBody {
            argv: argv.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        };
        let (_, mut s) = self.exec_stream(id, &req).await?;
        s.collect().await
    }

    /// Output of process `pid` from byte offsets (0, 0 = from the start).
    pub async fn output(
        &self,
        id: &str,
        pid: u64,
        stdout_from: u64,
        stderr_from: u64,
    ) -> Result<OutputStream, Error> {
        let resp = self
            .send(
                Method::GET,
                &format!("/v1/sandboxes/{}/processes/{pid}/output?stdout_from={stdout_from}&stderr_from={stderr_from}", enc(id)),
                None,
                conn::empty(),
            )
            .await?;
        Ok(OutputStream::new(resp))
    }

    pub async fn list_processes(&self, id: &str) -> Result<Vec<ProcessView>, Error> {
        let l: ProcessList = self
            .json(
                Method::GET,
                &format!("/v1/sandboxes/{}/processes", enc(id)),
                None::<&()>,
            )
            .await?;
        Ok(l.processes)
    }

    pub async fn process(&self, id: &str, pid: u64) -> Result<ProcessView, Error> {
        self.json(
            Method::GET,
            &format!("/v1/sandboxes/{}/processes/{pid}", enc(id)),
            None::<&()>,
        )
        .await
    }

    /// Waits up to `timeout_secs` for the process to exit.
    pub async fn wait(&self, id: &str, pid: u64, timeout_secs: f64) -> Result<WaitResult, Error> {
        self.json(
            Method::GET,
            &format!(
                "/v1/sandboxes/{}/processes/{pid}/wait?timeout={timeout_secs}",
                enc(id)
            ),
            None::<&()>,
        )
        .await
    }

    pub async fn write_stdin(
        &self,
        id: &str,
        pid: u64,
        data: Vec<u8>,
        close: bool,
    ) -> Result<(), Error> {
        let resp = self
            .send(
                Method::POST,
                &format!(
                    "/v1/sandboxes/{}/processes/{pid}/stdin?close={close}",
                    enc(id)
                ),
                Some("application/octet-stream"),
                conn::full(data),
            )
            .await?;
        stream::collect(resp).await.map(|_| ())
    }

    pub async fn close_stdin(&self, id: &str, pid: u64) -> Result<(), Error> {
        self.no_content(
            Method::POST,
            &format!("/v1/sandboxes/{}/processes/{pid}/stdin/close", enc(id)),
            None::<&()>,
        )
        .await
    }

    /// Sends a signal (a name like `TERM` or a number).
    pub async fn signal(&self, id: &str, pid: u64, signal: &str) -> Result<(), Error> {
        let v = match signal.parse::<i64>() {
            Ok(n) => serde_json::Value::from(n),
            Err(_) => serde_json::Value::from(signal),
        };
        self.no_content(
            Method::POST,
            &format!("/v1/sandboxes/{}/processes/{pid}/signal", enc(id)),
            Some(&SignalBody { signal: v }),
        )
        .await
    }

    pub async fn resize(&self, id: &str, pid: u64, rows: u16, cols: u16) -> Result<(), Error> {
        self.no_content(
            Method::POST,
            &format!("/v1/sandboxes/{}/processes/{pid}/resize", enc(id)),
            Some(&ResizeBody { rows, cols }),
        )
        .await
    }

    /// Starts a process over a WebSocket (stdin, resize and signals in band).
    pub async fn exec_ws(&self, id: &str, req: &ExecBody) -> Result<WsSession, Error> {
        let mut ws = stream::ws_connect(
            self.target(),
            &format!("/v1/sandboxes/{}/exec/ws", enc(id)),
            &self.headers(),
        )
        .await?;
        ws.send_json(req).await?;
        Ok(ws)
    }

    /// Attaches to a process over a WebSocket from the given offsets.
    pub async fn attach_ws(
        &self,
        id: &str,
        pid: u64,
        stdout_from: u64,
        stderr_from: u64,
    ) -> Result<WsSession, Error> {
        stream::ws_connect(
            self.target(),
            &format!("/v1/sandboxes/{}/processes/{pid}/ws?stdout_from={stdout_from}&stderr_from={stderr_from}", enc(id)),
            &self.headers(),
        )
        .await
    }

    // ---- files ----

    pub async fn read_file(&self, id: &str, path: &str) -> Result<ByteStream, Error> {
        let resp = self
            .send(
                Method::GET,
                &format!("/v1/sandboxes/{}/files?path={}", enc(id), enc(path)),
                None,
                conn::empty(),
            )
            .await?;
        Ok(ByteStream::new(resp))
    }

    /// Writes a file from a stream of chunks (parents are created).
    pub async fn write_file<S>(
        &self,
        id: &str,
        path: &str,
        mode: Option<u32>,
        body: S,
    ) -> Result<WriteResult, Error>
    where
        S: futures_util::Stream<Item = Result<Bytes, std::io::Error>> + Send + Sync + 'static,
    {
        let mut p = format!("/v1/sandboxes/{}/files?path={}", enc(id), enc(path));
        if let Some(m) = mode {
            p.push_str(&format!("&mode={m:o}"));
        }
        self.put_stream(&p, "application/octet-stream", body).await
    }

    /// PUTs a streamed body and decodes the JSON answer.
    async fn put_stream<S, T>(&self, path: &str, content_type: &str, body: S) -> Result<T, Error>
    where
        S: futures_util::Stream<Item = Result<Bytes, std::io::Error>> + Send + Sync + 'static,
        T: DeserializeOwned,
    {
        let resp = self
            .send(Method::PUT, path, Some(content_type), conn::streaming(body))
            .await?;
        let b = stream::collect(resp).await?;
        serde_json::from_slice(&b).map_err(|e| Error::Decode(e.to_string()))
    }

    pub async fn write_file_bytes(
        &self,
        id: &str,
        path: &str,
        data: Vec<u8>,
    ) -> Result<WriteResult, Error> {
        let s = futures_util::stream::iter(vec![Ok(Bytes::from(data))]);
        self.write_file(id, path, None, s).await
    }

    pub async fn stat(&self, id: &str, path: &str) -> Result<FileInfo, Error> {
        self.json(
            Method::GET,
            &format!("/v1/sandboxes/{}/files/stat?path={}", enc(id), enc(path)),
            None::<&()>,
        )
        .await
    }

    pub async fn list_dir(&self, id: &str, path: &str, depth: u32) -> Result<DirListing, Error> {
        self.json(
            Method::GET,
            &format!(
                "/v1/sandboxes/{}/files/list?path={}&depth={depth}",
                enc(id),
                enc(path)
            ),
            None::<&()>,
        )
        .await
    }

    pub async fn mkdir(&self, id: &str, path: &str, parents: bool) -> Result<(), Error> {
        let b = MkdirBody {
            path: path.into(),
            parents,
            mode: None,
        };
        self.no_content(
            Method::POST,
            &format!("/v1/sandboxes/{}/files/mkdir", enc(id)),
            Some(&b),
        )
        .await
    }

    pub async fn remove(&self, id: &str, path: &str, recursive: bool) -> Result<(), Error> {
        self.no_content(
            Method::DELETE,
            &format!(
                "/v1/sandboxes/{}/files?path={}&recursive={recursive}",
                enc(id),
                enc(path)
            ),
            None::<&()>,
        )
        .await
    }

    pub async fn rename(&self, id: &str, from: &str, to: &str) -> Result<(), Error> {
        let b = RenameBody {
            from: from.into(),
            to: to.into(),
            overwrite: true,
        };
        self.no_content(
            Method::POST,
            &format!("/v1/sandboxes/{}/files/rename", enc(id)),
            Some(&b),
        )
        .await
    }

    /// A tar archive of a directory.
    pub async fn tar_download(&self, id: &str, path: &str) -> Result<ByteStream, Error> {
        let resp = self
            .send(
                Method::GET,
                &format!("/v1/sandboxes/{}/files/tar?path={}", enc(id), enc(path)),
                None,
                conn::empty(),
            )
            .await?;
        Ok(ByteStream::new(resp))
    }

    /// Extracts a tar archive into a directory (created).
    pub async fn tar_upload<S>(&self, id: &str, path: &str, body: S) -> Result<TarResult, Error>
    where
        S: futures_util::Stream<Item = Result<Bytes, std::io::Error>> + Send + Sync + 'static,
    {
        let p = format!("/v1/sandboxes/{}/files/tar?path={}", enc(id), enc(path));
        self.put_stream(&p, "application/x-tar", body).await
    }

    /// A watch stream of filesystem events.
    pub async fn watch(
        &self,
        id: &str,
        path: &str,
        recursive: bool,
    ) -> Result<stream::WatchStream, Error> {
        let resp = self
            .send(
                Method::GET,
                &format!(
                    "/v1/sandboxes/{}/files/watch?path={}&recursive={recursive}",
                    enc(id),
                    enc(path)
                ),
                None,
                conn::empty(),
            )
            .await?;
        Ok(stream::WatchStream::new(resp))
    }
}

/// Where the socket of a local daemon is by default.
pub fn default_socket() -> PathBuf {
    PathBuf::from("/run/sandlot/sandlot.sock")
}

#[cfg(test)]
mod create_tests {
    use super::*;
    use sandlot_proto::api::lifecycle::OnExpiry;
    use sandlot_proto::units::Seconds;
    use serde_json::json;

    #[test]
    fn a_create_body_is_the_typed_request_with_json_keys_over_it() {
        let body = CreateSandbox::from(CreateSandboxRequest {
            name: Some("a".into()),
            image: Some("host".into()),
            idle_timeout: Some(Some(Seconds::secs(2))),
            on_idle: Some(OnExpiry::Pause),
            ..Default::default()
        })
        .with_spec(object(
            json!({"image": "team/app:1", "resources": {"memory": "1G"}}),
        ))
        .with_tag("user", "u1")
        .with_metadata("purpose", "test");
        let sent = serde_json::to_value(&body).unwrap();
        assert_eq!(
            sent,
            json!({"name": "a", "image": "team/app:1", "idle_timeout": 2,
                "on_idle": "pause", "resources": {"memory": "1G"},
                "tags": {"user": "u1"}, "metadata": {"purpose": "test"}})
        );
        // What is sent is what the daemon parses.
        let back: CreateSandboxRequest = serde_json::from_value(sent).unwrap();
        assert_eq!(back.image.as_deref(), Some("team/app:1"));
        assert_eq!(back.idle_timeout, Some(Some(Seconds::secs(2))));
        assert_eq!(
            serde_json::to_value(CreateSandbox::default()).unwrap(),
            json!({})
        );
    }
    fn object(v: serde_json::Value) -> serde_json::Map<String, serde_json::Value> {
        match v {
            serde_json::Value::Object(m) => m,
            other => panic!("not an object: {other}"),
        }
    }

    #[test]
    fn raw_keys_override_the_typed_fields_whole_whichever_came_first() {
        let body = CreateSandbox::default()
            .with_tag("a", "1")
            .with_spec(object(json!({"tags": {"b": "2"}, "env": {"X": "y"}})))
            .with_tag("c", "3");
        let request = CreateSandboxRequest {
            env: Some([("X".to_string(), "typed".to_string())].into()),
            ..Default::default()
        };
        let body = CreateSandbox { request, ..body };
        assert_eq!(
            serde_json::to_value(&body).unwrap(),
            json!({"tags": {"b": "2"}, "env": {"X": "y"}})
        );
    }
}
