//! Code contexts: create, list, inspect, restart, interrupt, delete, and run code
//! (JSON, NDJSON stream or WebSocket). See `code/mod.rs`.

use std::sync::Arc;
use std::time::Duration;

use crate::code::output::RunEvent;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Extension, Path, RawQuery, State};
use axum::http::StatusCode;
use axum::response::Response;
use axum::Json;
use futures_util::{SinkExt, StreamExt};
use sandlot_proto::api::code::{
    CodeEvent, ContextList, ContextView, CreateContextBody, Execution, RunCodeBody,
};
use serde_json::Value;
use tokio::sync::mpsc;

use super::exec::stream_requested;
use super::stream::{held_body, held_channel_body, line};
use super::{json_status, parse_json, JsonBody, RequestId};
use crate::auth::Principal;
use crate::code::{self, Context, ContextParams, Language, RunItem, RunRequest, RunTicket};
use crate::error::{ApiError, ApiResult};
use crate::sandbox::SandboxHandle;
use crate::services::parse_duration;
use crate::state::AppState;

fn params(b: CreateContextBody) -> ApiResult<ContextParams> {
    let language = Language::parse(b.language.as_deref().unwrap_or("python"))?;
    if let Some(cwd) = &b.cwd {
        if !cwd.starts_with('/') || cwd.contains('\0') {
            return Err(ApiError::invalid(
                "cwd",
                format!("{cwd:?} is not an absolute path"),
            ));
        }
    }
    check_env(&b.env)?;
    Ok(ContextParams {
        cwd: b.cwd,
        env: b.env,
        ..ContextParams::of(language)
    })
}

fn check_env(env: &std::collections::BTreeMap<String, String>) -> ApiResult<()> {
    for (k, v) in env {
        if k.is_empty() || k.contains(['=', '\0']) {
            return Err(ApiError::invalid(
                "env",
                format!("{k:?} is not a variable name"),
            ));
        }
        if v.contains('\0') {
            return Err(ApiError::invalid(format!("env.{k}"), "contains a NUL byte"));
        }
    }
    Ok(())
}

fn context(h: &SandboxHandle, ctx: &str) -> ApiResult<Arc<Context>> {
    h.contexts
        .get(ctx)
        .ok_or_else(|| ApiError::not_found(format!("no code context {ctx} in sandbox {}", h.id)))
}

#[utoipa::path(post, path = "/v1/sandboxes/{id}/contexts", tag = "code",
    params(("id" = String, Path)), request_body = CreateContextBody,
    responses((status = 201, body = ContextView), (status = 400, body = crate::error::ErrorEnvelope),
        (status = 404, body = crate::error::ErrorEnvelope), (status = 429, body = crate::error::ErrorEnvelope)))]
pub async fn create(
    State(state): State<Arc<AppState>>,
    p: Principal,
    Path(id): Path<String>,
    JsonBody(b): JsonBody<CreateContextBody>,
) -> ApiResult<Response> {
    let h = crate::autopause::live(&state, &p, &id).await?;
    let params = params(b)?;
    let _active = h.active();
    let ctx = h.contexts.create(&h.guest, None, params).await?;
    Ok(json_status(StatusCode::CREATED, &ctx.view()))
}

#[utoipa::path(get, path = "/v1/sandboxes/{id}/contexts", tag = "code",
    params(("id" = String, Path)),
    responses((status = 200, body = ContextList), (status = 404, body = crate::error::ErrorEnvelope)))]
pub async fn list(
    State(state): State<Arc<AppState>>,
    p: Principal,
    Path(id): Path<String>,
) -> ApiResult<Json<ContextList>> {
    let h = crate::autopause::live(&state, &p, &id).await?;
    Ok(Json(ContextList {
        contexts: h.contexts.all().iter().map(|c| c.view()).collect(),
    }))
}

#[utoipa::path(get, path = "/v1/sandboxes/{id}/contexts/{ctx}", tag = "code",
    params(("id" = String, Path), ("ctx" = String, Path)),
    responses((status = 200, body = ContextView), (status = 404, body = crate::error::ErrorEnvelope)))]
pub async fn get_one(
    State(state): State<Arc<AppState>>,
    p: Principal,
    Path((id, ctx)): Path<(String, String)>,
) -> ApiResult<Json<ContextView>> {
    let h = crate::autopause::live(&state, &p, &id).await?;
    Ok(Json(context(&h, &ctx)?.view()))
}

#[utoipa::path(delete, path = "/v1/sandboxes/{id}/contexts/{ctx}", tag = "code",
    params(("id" = String, Path), ("ctx" = String, Path)),
    responses((status = 204), (status = 404, body = crate::error::ErrorEnvelope)))]
pub async fn remove(
    State(state): State<Arc<AppState>>,
    p: Principal,
    Path((id, ctx)): Path<(String, String)>,
) -> ApiResult<StatusCode> {
    let h = crate::autopause::live(&state, &p, &id).await?;
    h.touch();
    h.contexts.remove(&h.guest, &ctx).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(post, path = "/v1/sandboxes/{id}/contexts/{ctx}/restart", tag = "code",
    params(("id" = String, Path), ("ctx" = String, Path)),
    responses((status = 200, body = ContextView), (status = 404, body = crate::error::ErrorEnvelope)))]
pub async fn restart(
    State(state): State<Arc<AppState>>,
    p: Principal,
    Path((id, ctx)): Path<(String, String)>,
) -> ApiResult<Json<ContextView>> {
    let h = crate::autopause::live(&state, &p, &id).await?;
    let c = context(&h, &ctx)?;
    let _active = h.active();
    c.restart(&h.guest).await?;
    Ok(Json(c.view()))
}

#[utoipa::path(post, path = "/v1/sandboxes/{id}/contexts/{ctx}/interrupt", tag = "code",
    params(("id" = String, Path), ("ctx" = String, Path)),
    responses((status = 204), (status = 404, body = crate::error::ErrorEnvelope)))]
pub async fn interrupt(
    State(state): State<Arc<AppState>>,
    p: Principal,
    Path((id, ctx)): Path<(String, String)>,
) -> ApiResult<StatusCode> {
    let h = crate::autopause::live(&state, &p, &id).await?;
    h.touch();
    context(&h, &ctx)?.interrupt(&h.guest).await;
    Ok(StatusCode::NO_CONTENT)
}

/// The run request as the context layer takes it.
pub(crate) fn run_request(b: RunCodeBody) -> ApiResult<RunRequest> {
    let timeout = match &b.timeout {
        None | Some(Value::Null) => code::DEFAULT_TIMEOUT,
        Some(v) => {
            let t = parse_duration("timeout", v)?;
            if t.is_zero() || t > code::MAX_TIMEOUT {
                return Err(ApiError::invalid(
                    "timeout",
                    format!("must be more than 0s and at most {:?}", code::MAX_TIMEOUT),
                ));
            }
            t
        }
    };
    check_env(&b.env)?;
    Ok(RunRequest {
        code: b.code,
        env: b.env,
        timeout,
    })
}

/// Looks the context up (creating the default one) and starts the run.
pub(crate) async fn start_run(
    h: &Arc<SandboxHandle>,
    ctx: &str,
    req: RunRequest,
) -> ApiResult<(mpsc::Receiver<RunItem>, RunTicket)> {
    let c = h.contexts.get_or_default(&h.guest, ctx).await?;
    h.touch();
    h.contexts
        .spawn_run(c, h.guest.clone(), req, code::oom_probe(h))
}

#[utoipa::path(post, path = "/v1/sandboxes/{id}/contexts/{ctx}/run", tag = "code",
    params(("id" = String, Path), ("ctx" = String, Path, description = "A context id, or `default` (Python, created on first use)"),
        ("stream" = Option<String>, Query, description = "`ndjson`: answer 200 with the events as they happen (first line `started`, last `end`)")),
    request_body = RunCodeBody,
    responses((status = 200, body = Execution), (status = 400, body = crate::error::ErrorEnvelope), (status = 404, body = crate::error::ErrorEnvelope)))]
pub async fn run(
    State(state): State<Arc<AppState>>,
    p: Principal,
    Path((id, ctx)): Path<(String, String)>,
    RawQuery(q): RawQuery,
    Extension(rid): Extension<RequestId>,
    JsonBody(b): JsonBody<RunCodeBody>,
) -> ApiResult<Response> {
    let stream = stream_requested(q.as_deref())?;
    let h = crate::autopause::live(&state, &p, &id).await?;
    let req = run_request(b)?;
    let guard = h.active();
    let (mut rx, _ticket) = start_run(&h, &ctx, req).await?;
    if !stream {
        let mut x = code::collect(rx).await?;
        drop(guard);
        // What the run holds stays counted until the answer is written.
        let held = std::mem::take(&mut x.held);
        let mut body = serde_json::to_vec(&x).expect("a run's output serializes");
        drop(x);
        body.shrink_to_fit();
        return Ok(held_body(
            StatusCode::OK,
            "application/json",
            body.into(),
            held,
        ));
    }
    // The first item decides the status: a run that could not start is an error
    // answer, not a stream.
    let (first, first_held) = match rx.recv().await {
        Some(item) => (item.event?, item.held),
        None => return Err(ApiError::internal("a code run ended before it started")),
    };
    let (tx, resp) = held_channel_body("application/x-ndjson");
    tokio::spawn(async move {
        let _guard = guard;
        if tx.send(Ok((line(&first), first_held))).await.is_err() {
            return;
        }
        while let Some(item) = rx.recv().await {
            let ev = item
                .event
                .unwrap_or_else(|e| event_of_error(&e, &rid.0).into());
            if tx.send(Ok((line(&ev), item.held))).await.is_err() {
                return;
            }
        }
    });
    Ok(resp)
}

fn event_of_error(e: &ApiError, rid: &str) -> CodeEvent {
    if e.status.is_server_error() {
        tracing::error!(
            request_id = rid,
            detail = e.internal.as_deref().unwrap_or(""),
            "code run failed"
        );
    }
    CodeEvent::Error {
        error: e.body(rid).error,
    }
}

/// Client messages on a run WebSocket after the request.
#[derive(serde::Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
enum WsControl {
    Interrupt,
}

#[utoipa::path(get, path = "/v1/sandboxes/{id}/contexts/{ctx}/run/ws", tag = "code",
    params(("id" = String, Path), ("ctx" = String, Path)),
    responses((status = 101, description = "WebSocket: send the RunCodeBody as the first text message; each CodeEvent comes as a text message; send {\"type\":\"interrupt\"} to interrupt")))]
pub async fn run_ws(
    State(state): State<Arc<AppState>>,
    p: Principal,
    Path((id, ctx)): Path<(String, String)>,
    Extension(rid): Extension<RequestId>,
    ws: WebSocketUpgrade,
) -> ApiResult<Response> {
    let h = crate::autopause::live(&state, &p, &id).await?;
    Ok(super::bounded_ws(ws, &state)
        .protocols([crate::auth::WS_PROTOCOL])
        .on_upgrade(move |sock| ws_session(sock, h, ctx, rid.0)))
}

async fn ws_session(mut sock: WebSocket, h: Arc<SandboxHandle>, ctx: String, rid: String) {
    let _guard = h.active();
    let text = |v: &RunEvent| Message::Text(serde_json::to_string(v).expect("serializes").into());
    let first = match tokio::time::timeout(Duration::from_secs(30), sock.recv()).await {
        Ok(Some(Ok(Message::Text(t)))) => t,
        _ => {
            let e = ApiError::bad_request("the first message must be the run request as JSON text");
            let _ = sock.send(text(&event_of_error(&e, &rid).into())).await;
            return;
        }
    };
    let started = async {
        let b: RunCodeBody = parse_json(first.as_bytes())?;
        start_run(&h, &ctx, run_request(b)?).await
    }
    .await;
    let (mut rx, ticket) = match started {
        Ok(x) => x,
        Err(e) => {
            let _ = sock.send(text(&event_of_error(&e, &rid).into())).await;
            return;
        }
    };
    let (mut tx, mut inbound) = sock.split();
    let out = async move {
        while let Some(item) = rx.recv().await {
            let ev = item
                .event
                .unwrap_or_else(|e| event_of_error(&e, &rid).into());
            if tx.send(text(&ev)).await.is_err() {
                return;
            }
            drop(item.held);
        }
        let _ = tx.send(Message::Close(None)).await;
    };
    let input = async move {
        while let Some(Ok(m)) = inbound.next().await {
            match m {
                Message::Text(t) => match serde_json::from_str::<WsControl>(t.as_str()) {
                    Ok(WsControl::Interrupt) => ticket.interrupt(),
                    Err(e) => tracing::debug!("ignoring a malformed run WebSocket message: {e}"),
                },
                Message::Close(_) => break,
                _ => {}
            }
        }
    };
    tokio::select! {
        _ = out => {}
        _ = async { input.await; std::future::pending::<()>().await } => {}
    }
}
