//! Processes: start (JSON, NDJSON stream or WebSocket), list, inspect, output
//! (NDJSON or WebSocket, from the start or any offset), stdin, signals, resize, wait.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Extension, Path, RawQuery, State};
use axum::http::StatusCode;
use axum::response::Response;
use axum::Json;
use futures_util::{SinkExt, StreamExt};
use sandlot_guest::client::{ProcessId, ProcessInfo, ProcessStdin};
use sandlot_proto::api::{
    ExecBody, ProcessList, ProcessView, ResizeBody, SignalBody, StreamEvent, WaitResult,
};
use serde_json::Value;

use super::stream::{event_json, ndjson_output};
use super::{json_status, parse_json, JsonBody, RequestId};
use crate::auth::Principal;
use crate::error::{ApiError, ApiResult};
use crate::process::{process_exit, OutEvent, ProcEntry};
use crate::sandbox::SandboxHandle;
use crate::services::process::{open_output, Source, READER_CAPACITY};
use crate::services::{parse_duration, process};
use crate::state::AppState;
use crate::timefmt::rfc3339;

/// Longest `wait`.
const MAX_WAIT: Duration = Duration::from_secs(3600);

fn pid_of(s: &str) -> ApiResult<u64> {
    s.parse()
        .map_err(|_| ApiError::invalid("pid", format!("{s:?} is not a process id")))
}

/// Whether the query asks for an NDJSON stream (`?stream=ndjson`); any other
/// parameter is a 400 naming it.
pub(crate) fn stream_requested(q: Option<&str>) -> ApiResult<bool> {
    let mut stream = false;
    for (k, v) in form_urlencoded::parse(q.unwrap_or_default().as_bytes()) {
        match (k.as_ref(), v.as_ref()) {
            ("stream", "ndjson") => stream = true,
            ("stream", "none" | "") => stream = false,
            ("stream", other) => {
                return Err(ApiError::invalid(
                    "stream",
                    format!("{other:?}: expected ndjson"),
                ))
            }
            (other, _) => {
                return Err(ApiError::invalid(
                    other,
                    "unknown query parameter, expected stream",
                ))
            }
        }
    }
    Ok(stream)
}

#[utoipa::path(post, path = "/v1/sandboxes/{id}/exec", tag = "processes",
    params(("id" = String, Path), ("stream" = Option<String>, Query, description = "`ndjson`: answer 200 with the output stream (first line `started`)")),
    request_body = ExecBody,
    responses((status = 201, body = ProcessView), (status = 200, description = "NDJSON stream of StreamEvent", content_type = "application/x-ndjson", body = StreamEvent),
        (status = 400, body = crate::error::ErrorEnvelope), (status = 404, body = crate::error::ErrorEnvelope), (status = 409, body = crate::error::ErrorEnvelope)))]
pub async fn start(
    State(state): State<Arc<AppState>>,
    p: Principal,
    Path(id): Path<String>,
    RawQuery(q): RawQuery,
    Extension(rid): Extension<RequestId>,
    JsonBody(b): JsonBody<ExecBody>,
) -> ApiResult<Response> {
    let stream = stream_requested(q.as_deref())?;
    let h = crate::autopause::live(&state, &p, &id).await?;
    let entry = process::start(&state, &h, &b).await?;
    if !stream {
        return Ok(json_status(StatusCode::CREATED, &entry.view()));
    }
    let rx = entry
        .subscribe_from_start(READER_CAPACITY)
        .await
        .ok_or_else(|| ApiError::internal("a fresh process refused its first reader"))?;
    Ok(ndjson_output(
        StreamEvent::Started {
            process: entry.view(),
        },
        Source::Sup(rx),
        h.active(),
        rid.0,
    ))
}

fn info_view(i: &ProcessInfo) -> ProcessView {
    ProcessView {
        id: i.id.0,
        pid: i.pid,
        argv: i.argv.clone(),
        tag: i.tag.clone(),
        pty: i.pty,
        stdin: i.stdin_open,
        background: false,
        started_at: rfc3339(i.started_at_ms as i64),
        state: if i.exit.is_some() {
            "exited"
        } else {
            "running"
        }
        .into(),
        exit: i
            .exit
            .map(|s| process_exit(&s, (i.stdout.produced, i.stderr.produced))),
    }
}

#[utoipa::path(get, path = "/v1/sandboxes/{id}/processes", tag = "processes",
    params(("id" = String, Path)),
    responses((status = 200, body = ProcessList), (status = 404, body = crate::error::ErrorEnvelope)))]
pub async fn list(
    State(state): State<Arc<AppState>>,
    p: Principal,
    Path(id): Path<String>,
) -> ApiResult<Json<ProcessList>> {
    let h = crate::autopause::live(&state, &p, &id).await?;
    let l = process::list(&h).await?;
    let mut out: Vec<ProcessView> = l.known.iter().map(|e| e.view()).collect();
    // Processes the agent runs that this daemon did not start (e.g. before a
    // restart of the daemon).
    out.extend(l.others().map(info_view));
    out.sort_by_key(|v| v.id);
    Ok(Json(ProcessList { processes: out }))
}

#[utoipa::path(get, path = "/v1/sandboxes/{id}/processes/{pid}", tag = "processes",
    params(("id" = String, Path), ("pid" = u64, Path)),
    responses((status = 200, body = ProcessView), (status = 404, body = crate::error::ErrorEnvelope)))]
pub async fn get_one(
    State(state): State<Arc<AppState>>,
    p: Principal,
    Path((id, pid)): Path<(String, String)>,
) -> ApiResult<Json<ProcessView>> {
    let h = crate::autopause::live(&state, &p, &id).await?;
    let pid = pid_of(&pid)?;
    if let Some(e) = h.procs.lock().unwrap_or_else(|e| e.into_inner()).get(pid) {
        return Ok(Json(e.view()));
    }
    process::list(&h)
        .await?
        .others()
        .find(|i| i.id.0 == pid)
        .map(|i| Json(info_view(i)))
        .ok_or_else(|| ApiError::not_found(format!("no process {pid} in sandbox {}", h.id)))
}

/// `stdout_from`, `stderr_from` (or `from` for both). Absent: 0.
fn parse_offsets(q: Option<&str>) -> ApiResult<(u64, u64)> {
    let (mut o, mut e) = (0u64, 0u64);
    for (k, v) in form_urlencoded::parse(q.unwrap_or_default().as_bytes()) {
        let n = || {
            v.parse::<u64>()
                .map_err(|_| ApiError::invalid(k.as_ref(), format!("{v:?} is not a byte offset")))
        };
        match k.as_ref() {
            "from" => {
                o = n()?;
                e = o;
            }
            "stdout_from" => o = n()?,
            "stderr_from" => e = n()?,
            other => {
                return Err(ApiError::invalid(
                    other,
                    "unknown query parameter, expected from, stdout_from or stderr_from",
                ))
            }
        }
    }
    Ok((o, e))
}

#[utoipa::path(get, path = "/v1/sandboxes/{id}/processes/{pid}/output", tag = "processes",
    params(("id" = String, Path), ("pid" = u64, Path),
        ("from" = Option<u64>, Query, description = "Byte offset for both streams (default 0: the start, within what is retained)"),
        ("stdout_from" = Option<u64>, Query), ("stderr_from" = Option<u64>, Query)),
    responses((status = 200, description = "NDJSON stream of StreamEvent (first line `attached`)", content_type = "application/x-ndjson", body = StreamEvent),
        (status = 404, body = crate::error::ErrorEnvelope), (status = 410, body = crate::error::ErrorEnvelope)))]
pub async fn output(
    State(state): State<Arc<AppState>>,
    p: Principal,
    Path((id, pid)): Path<(String, String)>,
    RawQuery(q): RawQuery,
    Extension(rid): Extension<RequestId>,
) -> ApiResult<Response> {
    let h = crate::autopause::live(&state, &p, &id).await?;
    let pid = pid_of(&pid)?;
    let from = parse_offsets(q.as_deref())?;
    let (first, src) = open_output(&h, pid, from).await?;
    Ok(ndjson_output(first, src, h.active(), rid.0))
}

/// Where a WebSocket's stdin goes.
enum StdinTarget {
    Entry(Arc<ProcEntry>),
    Own(Option<ProcessStdin>),
}

#[utoipa::path(get, path = "/v1/sandboxes/{id}/exec/ws", tag = "processes",
    params(("id" = String, Path)),
    responses((status = 101, description = "WebSocket: send the ExecBody as the first text message; see docs/api.md for frames")))]
pub async fn start_ws(
    State(state): State<Arc<AppState>>,
    p: Principal,
    Path(id): Path<String>,
    Extension(rid): Extension<RequestId>,
    ws: WebSocketUpgrade,
) -> ApiResult<Response> {
    let h = crate::autopause::live(&state, &p, &id).await?;
    Ok(super::bounded_ws(ws, &state)
        .protocols([crate::auth::WS_PROTOCOL])
        .on_upgrade(move |mut sock| async move {
            let first = match tokio::time::timeout(Duration::from_secs(30), sock.recv()).await {
                Ok(Some(Ok(Message::Text(t)))) => t,
                _ => {
                    let e = ApiError::bad_request(
                        "the first message must be the exec request as JSON text",
                    );
                    let _ = sock.send(ws_error(&e, &rid.0)).await;
                    return;
                }
            };
            let started = async {
                let b: ExecBody = parse_json(first.as_bytes())?;
                let entry = process::start(&state, &h, &b).await?;
                let rx = entry
                    .subscribe_from_start(READER_CAPACITY)
                    .await
                    .ok_or_else(|| {
                        ApiError::internal("a fresh process refused its first reader")
                    })?;
                Ok::<_, ApiError>((entry, rx))
            }
            .await;
            match started {
                Ok((entry, rx)) => {
                    let first = StreamEvent::Started {
                        process: entry.view(),
                    };
                    ws_session(
                        sock,
                        h,
                        first,
                        Source::Sup(rx),
                        StdinTarget::Entry(entry),
                        rid.0,
                    )
                    .await
                }
                Err(e) => {
                    let _ = sock.send(ws_error(&e, &rid.0)).await;
                }
            }
        }))
}

#[utoipa::path(get, path = "/v1/sandboxes/{id}/processes/{pid}/ws", tag = "processes",
    params(("id" = String, Path), ("pid" = u64, Path), ("from" = Option<u64>, Query), ("stdout_from" = Option<u64>, Query), ("stderr_from" = Option<u64>, Query)),
    responses((status = 101, description = "WebSocket attached to the process; see docs/api.md for frames")))]
pub async fn attach_ws(
    State(state): State<Arc<AppState>>,
    p: Principal,
    Path((id, pid)): Path<(String, String)>,
    RawQuery(q): RawQuery,
    Extension(rid): Extension<RequestId>,
    ws: WebSocketUpgrade,
) -> ApiResult<Response> {
    let h = crate::autopause::live(&state, &p, &id).await?;
    let pid = pid_of(&pid)?;
    let from = parse_offsets(q.as_deref())?;
    let (first, src) = open_output(&h, pid, from).await?;
    let entry = h.procs.lock().unwrap_or_else(|e| e.into_inner()).get(pid);
    let (src, stdin) = match (src, entry) {
        (Source::Attached(mut pr, e), None) => {
            let s = pr.take_stdin();
            (Source::Attached(pr, e), StdinTarget::Own(s))
        }
        (src, Some(e)) => (src, StdinTarget::Entry(e)),
        (src, None) => (src, StdinTarget::Own(None)),
    };
    Ok(super::bounded_ws(ws, &state)
        .protocols([crate::auth::WS_PROTOCOL])
        .on_upgrade(move |sock| ws_session(sock, h, first, src, stdin, rid.0)))
}

fn ws_error(e: &ApiError, rid: &str) -> Message {
    Message::Text(
        serde_json::to_string(&StreamEvent::Error {
            error: e.body(rid).error,
        })
        .expect("serializes")
        .into(),
    )
}

/// Client messages on a process WebSocket (text frames).
#[derive(serde::Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
enum WsControl {
    StdinClose,
    Resize { rows: u16, cols: u16 },
    Signal { signal: Value },
}

/// Output: binary frames `[1|2] ++ bytes` (stdout, stderr) and JSON text frames
/// (`started`/`attached` first, `exit`, `error`). Input: binary frames are stdin;
/// text frames are `{"type":"stdin_close"}`, `{"type":"resize",...}`,
/// `{"type":"signal","signal":"INT"}`.
async fn ws_session(
    sock: WebSocket,
    h: Arc<SandboxHandle>,
    first: StreamEvent,
    mut src: Source,
    stdin: StdinTarget,
    rid: String,
) {
    let guard = h.active();
    let pid = match &first {
        StreamEvent::Started { process } => process.id,
        StreamEvent::Attached { id, .. } => *id,
        _ => 0,
    };
    let (mut tx, mut rx) = sock.split();
    let out = async move {
        let text =
            |v: &StreamEvent| Message::Text(serde_json::to_string(v).expect("serializes").into());
        if tx.send(text(&first)).await.is_err() {
            return;
        }
        loop {
            match src.next().await {
                Ok(Some(OutEvent::Stdout(_, b))) => {
                    let mut f = Vec::with_capacity(b.len() + 1);
                    f.push(1u8);
                    f.extend_from_slice(&b);
                    if tx.send(Message::Binary(f.into())).await.is_err() {
                        return;
                    }
                }
                Ok(Some(OutEvent::Stderr(_, b))) => {
                    let mut f = Vec::with_capacity(b.len() + 1);
                    f.push(2u8);
                    f.extend_from_slice(&b);
                    if tx.send(Message::Binary(f.into())).await.is_err() {
                        return;
                    }
                }
                Ok(Some(ev @ OutEvent::Exit(_))) => {
                    if tx.send(text(&event_json(&ev))).await.is_err() {
                        return;
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    let _ = tx.send(ws_error(&e, &rid)).await;
                    break;
                }
            }
        }
        let _ = tx.send(Message::Close(None)).await;
    };
    let h2 = h.clone();
    let input = async move {
        let mut stdin = stdin;
        while let Some(Ok(m)) = rx.next().await {
            h2.touch();
            match m {
                Message::Binary(b) => {
                    // A closed stdin is not an error: keep reading control messages.
                    let _ = write_stdin(&h2, &mut stdin, &b).await;
                }
                Message::Text(t) => match serde_json::from_str::<WsControl>(t.as_str()) {
                    Ok(WsControl::StdinClose) => close_stdin(&h2, &mut stdin).await,
                    Ok(WsControl::Resize { rows, cols }) => {
                        let _ = process::resize(&h2, pid, pid, rows, cols).await;
                    }
                    Ok(WsControl::Signal { signal }) => {
                        if let Ok(n) = parse_signal(&signal) {
                            let _ = process::signal(&h2, pid, pid, n).await;
                        }
                    }
                    Err(e) => {
                        tracing::debug!("ignoring a malformed WebSocket control message: {e}")
                    }
                },
                Message::Close(_) => break,
                _ => {}
            }
        }
    };
    // The session ends when the output ends; input stops with it.
    tokio::select! {
        _ = out => {}
        _ = async { input.await; std::future::pending::<()>().await } => {}
    }
    drop(guard);
}

async fn write_stdin(h: &SandboxHandle, t: &mut StdinTarget, data: &[u8]) -> Result<(), ApiError> {
    match t {
        StdinTarget::Entry(e) => process::write_stdin(h, e, data).await,
        StdinTarget::Own(s) => {
            let s = s.as_mut().ok_or_else(|| {
                ApiError::conflict("stdin is closed (or the exec did not ask for stdin)")
            })?;
            s.write(data)
                .await
                .map_err(|err| ApiError::from_guest(err, "stdin"))?;
            h.counters
                .stdin
                .fetch_add(data.len() as u64, Ordering::Relaxed);
            Ok(())
        }
    }
}

async fn close_stdin(h: &SandboxHandle, t: &mut StdinTarget) {
    match t {
        StdinTarget::Entry(e) => process::close_stdin(h, e).await,
        StdinTarget::Own(s) => {
            if let Some(mut s) = s.take() {
                s.close();
            }
        }
    }
}

fn known_entry(h: &SandboxHandle, pid: u64) -> ApiResult<Arc<ProcEntry>> {
    h.procs.lock().unwrap_or_else(|e| e.into_inner()).get(pid).ok_or_else(|| {
        ApiError::not_found(format!(
            "no process {pid} started through this daemon in sandbox {} (stdin is only reachable for those)",
            h.id
        ))
    })
}

#[utoipa::path(post, path = "/v1/sandboxes/{id}/processes/{pid}/stdin", tag = "processes",
    params(("id" = String, Path), ("pid" = u64, Path), ("close" = Option<bool>, Query, description = "Close stdin after writing the body")),
    request_body(content = Vec<u8>, content_type = "application/octet-stream"),
    responses((status = 204), (status = 404, body = crate::error::ErrorEnvelope), (status = 409, body = crate::error::ErrorEnvelope)))]
pub async fn stdin(
    State(state): State<Arc<AppState>>,
    p: Principal,
    Path((id, pid)): Path<(String, String)>,
    RawQuery(q): RawQuery,
    body: Body,
) -> ApiResult<StatusCode> {
    let h = crate::autopause::live(&state, &p, &id).await?;
    let pid = pid_of(&pid)?;
    let mut close = false;
    for (k, v) in form_urlencoded::parse(q.unwrap_or_default().as_bytes()) {
        match k.as_ref() {
            "close" => close = parse_bool("close", &v)?,
            other => {
                return Err(ApiError::invalid(
                    other,
                    "unknown query parameter, expected close",
                ))
            }
        }
    }
    let entry = known_entry(&h, pid)?;
    let _active = h.active();
    let mut t = StdinTarget::Entry(entry);
    let mut s = body.into_data_stream();
    while let Some(chunk) = s.next().await {
        let chunk =
            chunk.map_err(|e| ApiError::bad_request(format!("reading the request body: {e}")))?;
        write_stdin(&h, &mut t, &chunk).await?;
    }
    if close {
        close_stdin(&h, &mut t).await;
    }
    Ok(StatusCode::NO_CONTENT)
}

pub fn parse_bool(field: &str, v: &str) -> ApiResult<bool> {
    match v {
        "" | "1" | "true" | "yes" => Ok(true),
        "0" | "false" | "no" => Ok(false),
        other => Err(ApiError::invalid(
            field,
            format!("{other:?}: expected true or false"),
        )),
    }
}

#[utoipa::path(post, path = "/v1/sandboxes/{id}/processes/{pid}/stdin/close", tag = "processes",
    params(("id" = String, Path), ("pid" = u64, Path)),
    responses((status = 204), (status = 404, body = crate::error::ErrorEnvelope)))]
pub async fn stdin_close(
    State(state): State<Arc<AppState>>,
    p: Principal,
    Path((id, pid)): Path<(String, String)>,
) -> ApiResult<StatusCode> {
    let h = crate::autopause::live(&state, &p, &id).await?;
    let entry = known_entry(&h, pid_of(&pid)?)?;
    process::close_stdin(&h, &entry).await;
    Ok(StatusCode::NO_CONTENT)
}

/// A signal number or name (`TERM`, `SIGTERM`, `15`).
pub fn parse_signal(v: &Value) -> ApiResult<i32> {
    const NAMES: &[(&str, i32)] = &[
        ("HUP", 1),
        ("INT", 2),
        ("QUIT", 3),
        ("ILL", 4),
        ("TRAP", 5),
        ("ABRT", 6),
        ("BUS", 7),
        ("FPE", 8),
        ("KILL", 9),
        ("USR1", 10),
        ("SEGV", 11),
        ("USR2", 12),
        ("PIPE", 13),
        ("ALRM", 14),
        ("TERM", 15),
        ("CHLD", 17),
        ("CONT", 18),
        ("STOP", 19),
        ("TSTP", 20),
        ("TTIN", 21),
        ("TTOU", 22),
        ("URG", 23),
        ("XCPU", 24),
        ("XFSZ", 25),
        ("VTALRM", 26),
        ("PROF", 27),
        ("WINCH", 28),
        ("IO", 29),
        ("PWR", 30),
        ("SYS", 31),
    ];
    let n = match v {
        Value::Number(n) => n.as_i64().unwrap_or(-1),
        Value::String(s) => {
            let u = s.to_ascii_uppercase();
            let u = u.strip_prefix("SIG").unwrap_or(&u);
            match NAMES.iter().find(|(n, _)| *n == u) {
                Some((_, n)) => i64::from(*n),
                None => u.parse().unwrap_or(-1),
            }
        }
        _ => -1,
    };
    if !(1..=64).contains(&n) {
        return Err(ApiError::invalid(
            "signal",
            format!("{v} is not a signal (a name like TERM, or 1..64)"),
        ));
    }
    Ok(n as i32)
}

#[utoipa::path(post, path = "/v1/sandboxes/{id}/processes/{pid}/signal", tag = "processes",
    params(("id" = String, Path), ("pid" = u64, Path)), request_body = SignalBody,
    responses((status = 204), (status = 400, body = crate::error::ErrorEnvelope), (status = 404, body = crate::error::ErrorEnvelope), (status = 409, body = crate::error::ErrorEnvelope)))]
pub async fn signal(
    State(state): State<Arc<AppState>>,
    p: Principal,
    Path((id, pid)): Path<(String, String)>,
    JsonBody(b): JsonBody<SignalBody>,
) -> ApiResult<StatusCode> {
    let h = crate::autopause::live(&state, &p, &id).await?;
    let pid = pid_of(&pid)?;
    let sig = parse_signal(&b.signal)?;
    process::signal(&h, pid, pid, sig).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(post, path = "/v1/sandboxes/{id}/processes/{pid}/resize", tag = "processes",
    params(("id" = String, Path), ("pid" = u64, Path)), request_body = ResizeBody,
    responses((status = 204), (status = 400, body = crate::error::ErrorEnvelope), (status = 404, body = crate::error::ErrorEnvelope)))]
pub async fn resize(
    State(state): State<Arc<AppState>>,
    p: Principal,
    Path((id, pid)): Path<(String, String)>,
    JsonBody(b): JsonBody<ResizeBody>,
) -> ApiResult<StatusCode> {
    let h = crate::autopause::live(&state, &p, &id).await?;
    let pid = pid_of(&pid)?;
    process::resize(&h, pid, pid, b.rows, b.cols).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(get, path = "/v1/sandboxes/{id}/processes/{pid}/wait", tag = "processes",
    params(("id" = String, Path), ("pid" = u64, Path), ("timeout" = Option<String>, Query, description = "How long to wait (default 60s, at most 1h)")),
    responses((status = 200, body = WaitResult), (status = 404, body = crate::error::ErrorEnvelope)))]
pub async fn wait(
    State(state): State<Arc<AppState>>,
    p: Principal,
    Path((id, pid)): Path<(String, String)>,
    RawQuery(q): RawQuery,
) -> ApiResult<Json<WaitResult>> {
    let h = crate::autopause::live(&state, &p, &id).await?;
    let pid = pid_of(&pid)?;
    let mut timeout = Duration::from_secs(60);
    for (k, v) in form_urlencoded::parse(q.unwrap_or_default().as_bytes()) {
        match k.as_ref() {
            "timeout" => {
                let val = match v.parse::<f64>() {
                    Ok(n) => Value::from(n),
                    Err(_) => Value::from(v.to_string()),
                };
                timeout = parse_duration("timeout", &val)?.min(MAX_WAIT);
            }
            other => {
                return Err(ApiError::invalid(
                    other,
                    "unknown query parameter, expected timeout",
                ))
            }
        }
    }
    let _active = h.active();
    let entry = h.procs.lock().unwrap_or_else(|e| e.into_inner()).get(pid);
    let exit = match entry {
        Some(e) => {
            tokio::select! {
                x = tokio::time::timeout(timeout, e.wait()) => match x {
                    Ok(Some(x)) => Some(x),
                    Ok(None) => return Err(ApiError::conflict(format!("process {pid}: the sandbox stopped before it exited"))),
                    Err(_) => None,
                },
                _ = h.stopped() => return Err(ApiError::conflict(format!("process {pid}: the sandbox stopped"))),
            }
        }
        None => {
            // A process this daemon did not start: wait through the agent.
            let mut pr = h
                .guest
                .attach(ProcessId(pid), None)
                .await
                .map_err(|e| ApiError::from_guest(e, &format!("process {pid}")))?;
            match tokio::time::timeout(timeout, pr.wait()).await {
                Ok(Ok(s)) => {
                    let (o, e) = pr.offsets();
                    Some(process_exit(&s, (o, e)))
                }
                Ok(Err(e)) => return Err(ApiError::from_guest(e, &format!("process {pid}"))),
                Err(_) => None,
            }
        }
    };
    Ok(Json(WaitResult {
        exited: exit.is_some(),
        exit,
    }))
}
