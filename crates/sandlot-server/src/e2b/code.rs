//! E2B's code interpreter API (what the `e2b-code-interpreter` SDK calls on port
//! 49999 of a sandbox): `POST /execute` (NDJSON), `/contexts` (create, list),
//! `DELETE /contexts/{id}`, `POST /contexts/{id}/restart`, served for every sandbox
//! by the native code contexts (`crate::code`). A request names its sandbox like
//! an envd request (`E2b-Sandbox-Id`, or the `49999-ID.DOMAIN` host name) and
//! carries the sandbox's traffic access token or its envd access token.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, post};
use axum::{Json, Router};
use bytes::Bytes;
use sandlot_proto::api::code::{CodeError, CodeEvent, RunStatus};
use serde::de::IgnoredAny;
use serde::ser::{SerializeMap, Serializer};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::{json, Value};

use super::envd::{
    constant_time_eq, AccessError, ACCESS_TOKEN_HEADER, SANDBOX_ID_HEADER, SANDBOX_PORT_HEADER,
};
use super::hosts::TRAFFIC_TOKEN_HEADER;
use super::E2b;
use crate::code::output::{Held, RunEvent, RunResult};
use crate::code::{self, Context, ContextParams, Language, RunRequest};
use crate::error::ApiError;
use crate::routes::stream::{held_channel_body, line};
use crate::sandbox::SandboxHandle;

/// The port of E2B's code interpreter server in a sandbox.
pub const JUPYTER_PORT: u16 = 49999;

pub fn routes() -> Router<Arc<E2b>> {
    Router::new()
        .route("/execute", post(execute))
        .route("/contexts", post(create).get(list))
        .route("/contexts/{id}", delete(remove))
        .route("/contexts/{id}/restart", post(restart))
}

/// Authorizes a code interpreter request for its sandbox.
fn access(e2b: &Arc<E2b>, headers: &HeaderMap) -> Result<Arc<SandboxHandle>, AccessError> {
    let err = |status, m: String| AccessError { status, message: m };
    let header = |n: &str| {
        headers
            .get(n)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .trim()
            .to_string()
    };
    let id = header(SANDBOX_ID_HEADER);
    if id.is_empty() {
        return Err(err(
            StatusCode::BAD_REQUEST,
            "E2b-Sandbox-Id header is empty".into(),
        ));
    }
    let port = header(SANDBOX_PORT_HEADER);
    if !port.is_empty() && port != JUPYTER_PORT.to_string() {
        return Err(err(
            StatusCode::BAD_GATEWAY,
            format!("The sandbox {id} is running but port {port} is not open (the code interpreter is on {JUPYTER_PORT})"),
        ));
    }
    let traffic = header(TRAFFIC_TOKEN_HEADER);
    let envd = header(ACCESS_TOKEN_HEADER);
    let ok = (!traffic.is_empty()
        && constant_time_eq(traffic.as_bytes(), e2b.traffic_token(&id).as_bytes()))
        || (!envd.is_empty()
            && constant_time_eq(envd.as_bytes(), e2b.access_token(&id).as_bytes()));
    if !ok {
        return Err(err(
            StatusCode::UNAUTHORIZED,
            format!("the code interpreter of sandbox {id} needs its traffic access token ({TRAFFIC_TOKEN_HEADER}) or its envd access token"),
        ));
    }
    match e2b.app.handle(&id) {
        Some(h) if !h.is_stopping() => Ok(h),
        _ => {
            let (status, message) = gone(&id);
            Err(AccessError { status, message })
        }
    }
}

/// An API error as the code interpreter server answers one (plain text).
fn plain(e: ApiError) -> Response {
    if e.status.is_server_error() {
        tracing::error!(
            detail = %crate::routes::one_line(e.internal.as_deref().unwrap_or("")),
            "e2b code interpreter: {}",
            crate::routes::one_line(&e.message)
        );
    }
    (e.status, e.message).into_response()
}

/// A failure of work on a sandbox's interpreter: when the sandbox is ending (it
/// was killed or timed out meanwhile), what E2B's proxy answers for a sandbox
/// that is gone, which the SDK raises as a timeout of the sandbox.
fn failed(h: &SandboxHandle, e: ApiError) -> Response {
    if h.is_stopping() {
        return gone(&h.id).into_response();
    }
    plain(e)
}

/// What E2B's proxy answers for a sandbox that is not running.
fn gone(id: &str) -> (StatusCode, String) {
    (
        StatusCode::BAD_GATEWAY,
        format!("The sandbox {id} was not found"),
    )
}

/// The user E2B's code interpreter runs its kernels as: its Jupyter server runs as
/// root, so cells may write anywhere in the sandbox (`pip install`, `/root`).
const KERNEL_USER: &str = "root";

/// The languages whose default context E2B's server starts with the sandbox, in
/// the order its list names them.
const LISTED_DEFAULTS: [Language; 2] = [Language::Python, Language::Javascript];

/// The id of the code interpreter's default context of a language. Its own, not
/// the native API's `default`: made as E2B makes its contexts (below), whatever
/// the native API or a pool started before.
fn e2b_default(l: Language) -> String {
    format!("e2b-{}", code::default_context(l))
}

/// The language of one of the code interpreter's default context ids.
fn e2b_default_language(id: &str) -> Option<Language> {
    code::default_language(id.strip_prefix("e2b-")?)
}

/// A context as the code interpreter makes it: as root, in `dir` (the sandbox's
/// start directory unless the caller names one), showing images that cells save,
/// as E2B's template does.
fn e2b_params(language: Language, dir: String) -> ContextParams {
    ContextParams {
        cwd: Some(dir),
        user: Some(KERNEL_USER.into()),
        show_saved_images: true,
        ..ContextParams::of(language)
    }
}

fn context_json(id: &str, language: Language, cwd: &str) -> Value {
    json!({"id": id, "language": language.as_str(), "cwd": cwd})
}

/// A context as E2B lists it; `dir` is where one made without a `cwd` works.
fn json_of(c: &Context, dir: &str) -> Value {
    context_json(
        &c.id,
        c.params.language,
        c.params.cwd.as_deref().unwrap_or(dir),
    )
}

/// The context a run names: one that exists, else a default one made on first
/// use (the code interpreter's as E2B makes them, the native API's as it does).
async fn context_for(
    e2b: &E2b,
    h: &SandboxHandle,
    id: &str,
) -> crate::error::ApiResult<Arc<Context>> {
    if let Some(c) = h.contexts.get(id) {
        return Ok(c);
    }
    match e2b_default_language(id) {
        Some(l) => {
            let params = e2b_params(l, e2b.start_dir(&h.id));
            h.contexts.get_or_make(&h.guest, id, params).await
        }
        None => h.contexts.get_or_default(&h.guest, id).await,
    }
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct CreateBody {
    language: Option<String>,
    cwd: Option<String>,
}

async fn create(
    State(e2b): State<Arc<E2b>>,
    headers: HeaderMap,
    body: axum::body::Body,
) -> Response {
    let h = match access(&e2b, &headers) {
        Ok(x) => x,
        Err(e) => return e.into_response(),
    };
    // Read only once the caller is known, and no more than any request body.
    let body =
        match crate::body::read_limited(body, e2b.app.cfg.limits.max_request_body.bytes()).await {
            Ok(b) => b,
            Err(e) => return plain(e),
        };
    let b: CreateBody = if body.is_empty() {
        CreateBody::default()
    } else {
        match serde_json::from_slice(&body) {
            Ok(b) => b,
            Err(e) => {
                return (StatusCode::BAD_REQUEST, format!("invalid JSON: {e}")).into_response()
            }
        }
    };
    let language = match Language::parse(b.language.as_deref().unwrap_or("python")) {
        Ok(l) => l,
        Err(e) => return plain(e),
    };
    if let Some(c) = &b.cwd {
        if !c.starts_with('/') {
            return (
                StatusCode::BAD_REQUEST,
                format!("cwd: {c:?} is not an absolute path"),
            )
                .into_response();
        }
    }
    let params = e2b_params(language, b.cwd.unwrap_or_else(|| e2b.start_dir(&h.id)));
    let _active = h.active();
    match h.contexts.create(&h.guest, None, params).await {
        Ok(c) => Json(json_of(&c, "/")).into_response(),
        Err(e) => failed(&h, e),
    }
}

async fn list(State(e2b): State<Arc<E2b>>, headers: HeaderMap) -> Response {
    let h = match access(&e2b, &headers) {
        Ok(x) => x,
        Err(e) => return e.into_response(),
    };
    // E2B's server starts a Python and a JavaScript context with the sandbox and
    // lists them first; here a default context starts at its first run and is
    // listed before as it will be made (the JavaScript one where the sandbox has
    // Node). Listing is not activity: it neither resumes nor keeps a sandbox up.
    let dir = e2b.start_dir(&h.id);
    let made = h.contexts.all();
    let mut all = Vec::new();
    let defaults: Vec<String> = LISTED_DEFAULTS.iter().map(|&l| e2b_default(l)).collect();
    for (&language, id) in LISTED_DEFAULTS.iter().zip(&defaults) {
        match made.iter().find(|c| &c.id == id) {
            Some(c) => all.push(json_of(c, &dir)),
            None if language == Language::Javascript && !code::runs_javascript(&h.guest).await => {}
            None => all.push(context_json(id, language, &dir)),
        }
    }
    all.extend(
        made.iter()
            .filter(|c| !defaults.contains(&c.id))
            .map(|c| json_of(c, &dir)),
    );
    Json(all).into_response()
}

async fn remove(
    State(e2b): State<Arc<E2b>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    let h = match access(&e2b, &headers) {
        Ok(x) => x,
        Err(e) => return e.into_response(),
    };
    match h.contexts.remove(&h.guest, &id).await {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        // A default context listed but not made yet: nothing to end.
        Err(_) if e2b_default_language(&id).is_some() => StatusCode::NO_CONTENT.into_response(),
        Err(e) => plain(e),
    }
}

async fn restart(
    State(e2b): State<Arc<E2b>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    let h = match access(&e2b, &headers) {
        Ok(x) => x,
        Err(e) => return e.into_response(),
    };
    let Some(c) = h.contexts.get(&id) else {
        // A default context listed but not made yet starts afresh anyway.
        if e2b_default_language(&id).is_some() {
            return StatusCode::NO_CONTENT.into_response();
        }
        return (StatusCode::NOT_FOUND, format!("no code context {id}")).into_response();
    };
    let _active = h.active();
    match c.restart(&h.guest).await {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => failed(&h, e),
    }
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct ExecuteBody {
    code: String,
    context_id: Option<String>,
    language: Option<String>,
    env_vars: Option<BTreeMap<String, String>>,
}

async fn execute(
    State(e2b): State<Arc<E2b>>,
    headers: HeaderMap,
    body: axum::body::Body,
) -> Response {
    let h = match access(&e2b, &headers) {
        Ok(x) => x,
        Err(e) => return e.into_response(),
    };
    // Read only once the caller is known, and no more than any request body.
    let body =
        match crate::body::read_limited(body, e2b.app.cfg.limits.max_request_body.bytes()).await {
            Ok(b) => b,
            Err(e) => return plain(e),
        };
    let b: ExecuteBody = match serde_json::from_slice(&body) {
        Ok(b) => b,
        Err(e) => return (StatusCode::BAD_REQUEST, format!("invalid JSON: {e}")).into_response(),
    };
    let ctx_id = match (&b.context_id, &b.language) {
        (Some(c), _) => c.clone(),
        (None, Some(l)) => match Language::parse(l) {
            Ok(l) => e2b_default(l),
            Err(e) => return plain(e),
        },
        (None, None) => e2b_default(Language::Python),
    };
    let guard = h.active();
    let ctx = match context_for(&e2b, &h, &ctx_id).await {
        Ok(c) => c,
        Err(e) => return failed(&h, e),
    };
    let req = RunRequest {
        code: b.code,
        env: b.env_vars.unwrap_or_default(),
        timeout: code::DEFAULT_TIMEOUT,
    };
    h.touch();
    let (mut rx, ticket) =
        match h
            .contexts
            .spawn_run(ctx, h.guest.clone(), req, code::oom_probe(&h))
        {
            Ok(x) => x,
            Err(e) => return failed(&h, e),
        };
    let (tx, resp) = held_channel_body("application/x-ndjson");
    let sandbox = h.clone();
    tokio::spawn(async move {
        let _guard = guard;
        let mut raised = false;
        loop {
            let item = tokio::select! {
                item = rx.recv() => item,
                // The client left: stop this run's cell, as E2B's server does
                // (a run still waiting for the context never starts; another
                // caller's cell is never touched).
                _ = tx.closed() => {
                    ticket.abandon();
                    return;
                }
            };
            let Some(item) = item else { return };
            // A run its sandbox's end cut short (killed, timed out) is a
            // connection cut, as behind E2B's proxy: the SDK then finds the
            // sandbox gone and says it was killed during the request.
            if ends_with_its_sandbox(&item.event) && sandbox.is_stopping() {
                let cut = std::io::Error::other("the sandbox ended during the run");
                // Bounded: a client that stops reading does not keep the ended
                // sandbox's handle.
                let _ = tokio::time::timeout(CUT_WAIT, tx.send(Err(cut))).await;
                return;
            }
            // The item's share of the pool goes with its last line.
            let mut held = item.held;
            let mut lines = lines_of(item.event, &mut raised).into_iter().peekable();
            while let Some(l) = lines.next() {
                let h = match lines.peek() {
                    None => std::mem::take(&mut held),
                    Some(_) => Held::default(),
                };
                if tx.send(Ok((l, h))).await.is_err() {
                    ticket.abandon();
                    return;
                }
            }
        }
    });
    resp
}

/// How long the cut of a run whose sandbox ended waits for its client to take it.
const CUT_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// Whether a run event is one a run ends with when its interpreter is gone (the
/// run crashed, or failed).
fn ends_with_its_sandbox(item: &Result<RunEvent, ApiError>) -> bool {
    match item {
        Err(_) => true,
        Ok(RunEvent::Code(CodeEvent::End { status, .. })) => *status == RunStatus::Crashed,
        Ok(RunEvent::Code(CodeEvent::Error { .. })) => true,
        Ok(_) => false,
    }
}

fn now_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0)
}

fn error_line(e: &CodeError) -> Bytes {
    line(&json!({"type": "error", "name": e.name, "value": e.value, "traceback": e.traceback}))
}

/// The E2B lines of one run event.
fn lines_of(item: Result<RunEvent, ApiError>, raised: &mut bool) -> Vec<Bytes> {
    let ev = match item {
        Ok(RunEvent::Code(ev)) => ev,
        Ok(RunEvent::Result(r)) => return vec![line(&E2bResult(&r))],
        Err(e) => {
            return vec![line(
                &json!({"type": "error", "name": "SandlotError", "value": e.message, "traceback": ""}),
            )]
        }
    };
    match ev {
        CodeEvent::Stdout { text } => {
            vec![line(
                &json!({"type": "stdout", "text": text, "timestamp": now_ns()}),
            )]
        }
        CodeEvent::Stderr { text } => {
            vec![line(
                &json!({"type": "stderr", "text": text, "timestamp": now_ns()}),
            )]
        }
        // Results come as `RunEvent::Result`.
        CodeEvent::Result { .. } => Vec::new(),
        CodeEvent::Exception { error } => {
            *raised = true;
            vec![error_line(&error)]
        }
        CodeEvent::End {
            status,
            execution_count,
            error,
            ..
        } => {
            let mut out = Vec::new();
            if let (false, Some(e), RunStatus::TimedOut | RunStatus::Crashed) =
                (*raised, &error, status)
            {
                out.push(error_line(e));
            }
            if let Some(n) = execution_count {
                out.push(line(
                    &json!({"type": "number_of_executions", "execution_count": n}),
                ));
            }
            out
        }
        CodeEvent::Started { .. } => Vec::new(),
        CodeEvent::Error { error } => {
            vec![line(
                &json!({"type": "error", "name": "SandlotError", "value": error.message, "traceback": ""}),
            )]
        }
    }
}

/// A MIME bundle as E2B's result: its formats by name (`text`, `html`, `png`,
/// ...), a chart's data as `chart` (when it is one the E2B SDK reads), a DataFrame's data as `data`, other MIME
/// types in `extra`. Written from the bundle's JSON text, never parsed whole.
pub struct E2bResult<'a>(pub &'a RunResult);

/// The keys of a DataFrame's data (`split` orientation), read without keeping them.
#[derive(Deserialize)]
struct FrameKeys {
    #[allow(dead_code)]
    columns: IgnoredAny,
    #[allow(dead_code)]
    index: IgnoredAny,
    #[allow(dead_code)]
    data: IgnoredAny,
}

/// The chart types the E2B SDK reads (its `ChartType`).
const CHART_TYPES: [&str; 7] = [
    "line",
    "scatter",
    "bar",
    "pie",
    "box_and_whisker",
    "superchart",
    "unknown",
];

/// What every chart the E2B SDK reads has, read without keeping it.
#[derive(Deserialize)]
struct ChartHead {
    #[serde(rename = "type")]
    kind: String,
    #[allow(dead_code)]
    title: IgnoredAny,
    #[allow(dead_code)]
    elements: IgnoredAny,
}

/// Whether `v` (what the sandbox wrote as its chart data) is a chart the E2B
/// SDK reads: an object with a title, elements and a type it knows.
fn is_e2b_chart(v: &RawValue) -> bool {
    serde_json::from_str::<ChartHead>(v.get()).is_ok_and(|h| CHART_TYPES.contains(&h.kind.as_str()))
}

/// `text` without the quotes around it, as E2B's server gives a result's
/// `text/plain` (the repr of a string, `'abc'`, is `abc`).
fn unquoted(text: &str) -> &str {
    let quoted = |q: char| text.starts_with(q) && text.ends_with(q);
    if quoted('\'') || quoted('"') {
        text.get(1..text.len().saturating_sub(1)).unwrap_or("")
    } else {
        text
    }
}

/// A DataFrame's data (`split` orientation: columns, index, rows) as E2B gives
/// it: each column's name and its values (pandas' `orient="list"`; a column
/// named twice keeps its last). `None` when the rows do not fit the columns.
fn by_column(split: &str) -> Option<serde_json::Map<String, Value>> {
    #[derive(Deserialize)]
    struct Split {
        columns: Vec<Value>,
        data: Vec<Vec<Value>>,
    }
    let f: Split = serde_json::from_str(split).ok()?;
    if f.data.iter().any(|row| row.len() != f.columns.len()) {
        return None;
    }
    let mut values: Vec<Vec<Value>> = vec![Vec::with_capacity(f.data.len()); f.columns.len()];
    for row in f.data {
        for (i, v) in row.into_iter().enumerate() {
            values[i].push(v);
        }
    }
    let mut out = serde_json::Map::new();
    for (name, column) in f.columns.into_iter().zip(values) {
        let name = match name {
            Value::String(s) => s,
            other => other.to_string(),
        };
        out.insert(name, Value::Array(column));
    }
    Some(out)
}

/// Formats E2B has no key for, as a map.
struct Extra<'a>(Vec<(&'a str, &'a RawValue)>);

impl Serialize for Extra<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(self.0.len()))?;
        for (k, v) in &self.0 {
            m.serialize_entry(k, v)?;
        }
        m.end()
    }
}

impl Serialize for E2bResult<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let data = &self.0.data;
        let mut m = s.serialize_map(None)?;
        m.serialize_entry("type", "result")?;
        let mut extra = Vec::new();
        for (mime, v) in data.iter() {
            let key = match mime {
                "text/plain" => "text",
                "text/html" => "html",
                "text/markdown" => "markdown",
                "image/svg+xml" => "svg",
                "image/png" => "png",
                "image/jpeg" => "jpeg",
                "application/pdf" => "pdf",
                "text/latex" => "latex",
                "application/json" => "json",
                "application/javascript" => "javascript",
                code::CHART_MIME if is_e2b_chart(v) => "chart",
                _ => {
                    extra.push((mime, v));
                    continue;
                }
            };
            if key == "text" {
                // E2B's server answers a string's repr without its quotes.
                if let Ok(text) = serde_json::from_str::<String>(v.get()) {
                    m.serialize_entry(key, unquoted(&text))?;
                    continue;
                }
            }
            if key == "png" || key == "jpeg" {
                if let Ok(b64) = serde_json::from_str::<String>(v.get()) {
                    m.serialize_entry(key, b64.trim())?;
                    continue;
                }
            }
            m.serialize_entry(key, v)?;
        }
        let frame = data.get("application/json").filter(|j| {
            data.contains("text/html") && serde_json::from_str::<FrameKeys>(j.get()).is_ok()
        });
        if let Some(columns) = frame.and_then(|f| by_column(f.get())) {
            m.serialize_entry("data", &columns)?;
        }
        if !extra.is_empty() {
            m.serialize_entry("extra", &Extra(extra))?;
        }
        m.serialize_entry("is_main_result", &self.0.is_main_result)?;
        m.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_code_interpreters_default_contexts_have_ids_of_their_own() {
        assert_eq!(e2b_default(Language::Python), "e2b-default");
        assert_eq!(e2b_default(Language::Javascript), "e2b-default-javascript");
        for l in [Language::Python, Language::Bash, Language::Javascript] {
            assert_eq!(e2b_default_language(&e2b_default(l)), Some(l));
            // The native API's defaults are not the code interpreter's.
            assert_eq!(e2b_default_language(&code::default_context(l)), None);
        }
        assert_eq!(e2b_default_language("e2b-ctx_1"), None);
        let p = e2b_params(Language::Bash, "/w".into());
        assert_eq!(
            (p.cwd.as_deref(), p.user.as_deref(), p.show_saved_images),
            (Some("/w"), Some("root"), true)
        );
    }

    #[test]
    fn a_bundle_maps_to_e2b_result_keys() {
        let r = RunResult {
            is_main_result: true,
            data: serde_json::from_value(json!({
                "text/plain": "   a\n0  1",
                "text/html": "<table/>",
                "image/png": "iVBO\n",
                "application/json": {"columns": ["a"], "index": [0], "data": [[1]]},
                "application/vnd.sandlot.chart+json": {"type": "line", "title": null, "elements": []},
                "application/vnd.custom": 1,
            }))
            .unwrap(),
        };
        let l: Value = serde_json::from_slice(&line(&E2bResult(&r))).unwrap();
        assert_eq!(l["type"], "result");
        assert_eq!(l["text"], "   a\n0  1");
        assert_eq!(l["html"], "<table/>");
        assert_eq!(l["png"], "iVBO");
        assert_eq!(l["data"], json!({"a": [1]}));
        assert_eq!(l["chart"]["type"], "line");
        assert_eq!(l["extra"]["application/vnd.custom"], 1);
        assert_eq!(l["is_main_result"], true);
        // JSON that is no DataFrame's data is no `data`.
        let r = RunResult {
            is_main_result: false,
            data: serde_json::from_value(json!({"text/html": "x", "application/json": [1]}))
                .unwrap(),
        };
        let l: Value = serde_json::from_slice(&line(&E2bResult(&r))).unwrap();
        assert_eq!((l.get("data"), &l["json"]), (None, &json!([1])));
    }

    #[test]
    fn a_strings_text_comes_without_its_quotes_and_a_frames_data_by_column() {
        assert_eq!(unquoted("'bar'"), "bar");
        assert_eq!(unquoted("\"it's\""), "it's");
        assert_eq!(unquoted("'"), "");
        assert_eq!(unquoted("'a\""), "'a\"");
        assert_eq!(unquoted("42"), "42");
        let cols =
            by_column(r#"{"columns": ["a", 1], "index": [0, 1], "data": [[1, "x"], [2, null]]}"#)
                .unwrap();
        assert_eq!(Value::Object(cols), json!({"a": [1, 2], "1": ["x", null]}));
        assert!(by_column(r#"{"columns": ["a"], "index": [0], "data": [[1, 2]]}"#).is_none());
    }

    #[test]
    fn chart_data_the_e2b_sdk_cannot_read_is_no_chart() {
        let chart = |c: Value| {
            let r = RunResult {
                is_main_result: true,
                data: serde_json::from_value(json!({ code::CHART_MIME: c })).unwrap(),
            };
            serde_json::from_slice::<Value>(&line(&E2bResult(&r))).unwrap()
        };
        for bad in [
            json!([1]),
            json!("line"),
            json!({"type": "pie3d", "title": null, "elements": []}),
            json!({"type": 1, "title": null, "elements": []}),
            json!({"type": "line"}),
        ] {
            let l = chart(bad.clone());
            assert_eq!(l.get("chart"), None, "{bad}");
            assert_eq!(l["extra"][code::CHART_MIME], bad);
        }
        let good = json!({"type": "box_and_whisker", "title": "t", "elements": []});
        assert_eq!(chart(good.clone())["chart"], good);
    }
}
