//! E2B's REST API (the control plane): create, list, inspect, kill, timeouts,
//! metrics and logs, over the native sandbox code paths (pause, resume and
//! connect are in `lifecycle.rs`). Errors are E2B's `{"code": STATUS,
//! "message"}`, which the SDK turns into its typed exceptions; network options
//! and updates become egress policies (`network.rs`); a create from a snapshot
//! is `snapshots.rs`'s; what Sandlot does not have (template updates,
//! volumes) answers 501 with a message naming the call.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, RawQuery, Request, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Json, Router};
use sandlot_proto::api::CreateSandboxRequest;
use sandlot_proto::spec::PortsSpec;
use serde_json::{json, Map, Value};

use super::{E2b, CLIENT_ID, DEFAULT_TEMPLATE, ENVD_VERSION, TEMPLATE_TAG};
use crate::auth::Principal;
use crate::body::read_limited;
use crate::error::ApiError;
use crate::services::sandboxes::{lookup, view};
use crate::store::{SandboxFilter, SandboxRecord, SandboxState};
use crate::timefmt::rfc3339;

/// An error in E2B's REST shape.
#[derive(Debug)]
pub struct RestError {
    pub status: StatusCode,
    pub message: String,
}

impl RestError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> RestError {
        RestError {
            status,
            message: message.into(),
        }
    }
    pub(super) fn bad(message: impl Into<String>) -> RestError {
        RestError::new(StatusCode::BAD_REQUEST, message)
    }
    pub(super) fn not_found(id: &str) -> RestError {
        RestError::new(StatusCode::NOT_FOUND, format!("sandbox {id} was not found"))
    }
}

impl From<ApiError> for RestError {
    fn from(e: ApiError) -> RestError {
        if e.status.is_server_error() {
            tracing::error!(
                code = e.code.as_str(),
                detail = %crate::routes::one_line(e.internal.as_deref().unwrap_or("")),
                "e2b api call failed: {}",
                crate::routes::one_line(&e.message)
            );
        }
        // A quota is E2B's rate limit / concurrency limit: 429.
        RestError::new(e.status, e.message)
    }
}

impl IntoResponse for RestError {
    fn into_response(self) -> Response {
        (
            self.status,
            Json(json!({"code": self.status.as_u16(), "message": self.message})),
        )
            .into_response()
    }
}

pub(super) type RestResult<T> = Result<T, RestError>;

/// The caller: `X-API-Key` (or `Authorization: Bearer`) is a Sandlot token, or
/// its E2B-shaped form (`e2b_` and the token's hex digits, which E2B's SDKs that
/// check a key's shape require).
pub fn principal(e2b: &E2b, headers: &HeaderMap) -> RestResult<Principal> {
    let key = headers
        .get("x-api-key")
        .and_then(|v| v.to_str().ok())
        .map(|s| s.trim().to_string())
        .or_else(|| {
            headers
                .get(axum::http::header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer "))
                .map(|s| s.trim().to_string())
        });
    let Some(key) = key.filter(|k| !k.is_empty()) else {
        return Err(RestError::new(
            StatusCode::UNAUTHORIZED,
            "an API key is required (X-API-Key: a Sandlot token from `sandlot token create`)",
        ));
    };
    let key = crate::auth::token_of_e2b_api_key(&key).unwrap_or(key);
    let tenant = e2b
        .app
        .store
        .tenant_of_token(&crate::auth::hash_token(&key))
        .map_err(ApiError::internal)?
        .ok_or_else(|| RestError::new(StatusCode::UNAUTHORIZED, "invalid or revoked API key"))?;
    Ok(Principal::tenant(tenant))
}

/// The REST API's routes (the E2B router adds `/health` and the fallback).
pub fn routes() -> Router<Arc<E2b>> {
    Router::new()
        .route("/sandboxes", post(create).get(list))
        .route("/v2/sandboxes", post(create).get(list))
        .route("/sandboxes/{id}", get(get_one).delete(kill))
        .route("/sandboxes/{id}/timeout", post(set_timeout))
        .route("/sandboxes/{id}/connect", post(super::lifecycle::connect))
        .route("/sandboxes/{id}/pause", post(super::lifecycle::pause))
        .route("/sandboxes/{id}/resume", post(super::lifecycle::resume))
        .route(
            "/v2/sandboxes/{id}/connect",
            post(super::lifecycle::connect),
        )
        .route("/sandboxes/{id}/refreshes", post(refresh))
        .route("/sandboxes/{id}/metrics", get(metrics))
        .route("/sandboxes/{id}/network", put(update_network))
        .route("/sandboxes/{id}/logs", get(logs_v1))
        .route("/v2/sandboxes/{id}/logs", get(logs_v2))
}

/// Everything else E2B's API has (template updates, volumes, teams...): a
/// clear 501, never a hang.
pub async fn unsupported(req: Request) -> RestError {
    let (m, p) = (req.method().clone(), req.uri().path().to_string());
    let what = if p.ends_with("/pause") {
        "pausing sandboxes"
    } else if p.ends_with("/resume") {
        "resuming sandboxes"
    } else if p.starts_with("/templates")
        || p.starts_with("/v2/templates")
        || p.starts_with("/v3/templates")
    {
        "this template call (builds, their status, tags, Template.exists, listing, showing and deleting templates are)"
    } else if p.starts_with("/volumes") {
        "volumes"
    } else if m == Method::GET && p == "/sandboxes/metrics" {
        "metrics of several sandboxes at once (ask per sandbox)"
    } else {
        "this call"
    };
    RestError::new(
        StatusCode::NOT_IMPLEMENTED,
        format!("{what} is not supported by Sandlot's E2B compatibility ({m} {p})"),
    )
}

fn template_of(rec: &SandboxRecord) -> String {
    rec.tags.get(TEMPLATE_TAG).cloned().unwrap_or_else(|| {
        rec.spec
            .get("image")
            .and_then(Value::as_str)
            .unwrap_or("host")
            .to_string()
    })
}

/// `Sandbox` (create and connect answers).
pub(super) fn created_json(e2b: &E2b, rec: &SandboxRecord) -> Value {
    json!({
        "templateID": template_of(rec),
        "sandboxID": rec.id,
        "clientID": CLIENT_ID,
        "alias": template_of(rec),
        "envdVersion": ENVD_VERSION,
        "envdAccessToken": e2b.access_token(&rec.id),
        "trafficAccessToken": e2b.traffic_token(&rec.id),
        "domain": e2b.cfg.domain,
    })
}

/// `ListedSandbox` (and the base of `SandboxDetail`).
fn listed_json(e2b: &E2b, rec: &SandboxRecord) -> Value {
    let v = view(&e2b.app, rec);
    let res = &rec.spec["resources"];
    let cpus = res["cpus"]
        .as_f64()
        .map(|c| c.ceil().max(1.0) as u64)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get() as u64));
    let mb = |k: &str| res[k].as_u64().unwrap_or(0) >> 20;
    let state = match rec.state {
        SandboxState::Stopped => "killed",
        SandboxState::Paused | SandboxState::Pausing => "paused",
        _ => "running",
    };
    json!({
        "templateID": template_of(rec),
        "alias": template_of(rec),
        "sandboxID": rec.id,
        "clientID": CLIENT_ID,
        "startedAt": v.started_at.unwrap_or(v.created_at),
        "endAt": v.ended_at.unwrap_or(v.expires_at),
        "cpuCount": cpus,
        "memoryMB": mb("memory"),
        "diskSizeMB": mb("disk"),
        "state": state,
        "envdVersion": ENVD_VERSION,
        "metadata": rec.metadata,
    })
}

/// The caller's live sandbox `id` (E2B: a stopped sandbox is "not found").
pub(super) fn live_record(e2b: &E2b, p: &Principal, id: &str) -> RestResult<SandboxRecord> {
    let rec = lookup(&e2b.app, p, id).map_err(|_| RestError::not_found(id))?;
    if rec.state == SandboxState::Stopped || e2b.app.handle(&rec.id).is_none() {
        return Err(RestError::not_found(id));
    }
    Ok(rec)
}

/// Fields of E2B's `NewSandbox`/`NewSandboxV2` that Sandlot cannot honour when set.
pub(super) fn refuse_unsupported(body: &Map<String, Value>) -> RestResult<()> {
    let set = |k: &str| body.get(k).is_some_and(|v| !v.is_null());
    if set("mcp") {
        return Err(RestError::bad(
            "mcp: the MCP gateway is not supported by Sandlot",
        ));
    }
    if body
        .get("volumeMounts")
        .and_then(Value::as_array)
        .is_some_and(|a| !a.is_empty())
    {
        return Err(RestError::bad(
            "volumeMounts: E2B volumes are not supported by Sandlot",
        ));
    }
    if body
        .get("iam")
        .and_then(Value::as_object)
        .is_some_and(|o| !o.is_empty())
    {
        return Err(RestError::bad(
            "iam: workload identity is not supported by Sandlot",
        ));
    }
    Ok(())
}

/// Turns an E2B create body into the native create request. The template is the
/// operator's (`[e2b.templates]`) first, else one `tenant` built (an image it
/// sees by that name).
pub fn native_body(
    e2b: &E2b,
    tenant: &str,
    body: &Map<String, Value>,
) -> RestResult<(String, CreateSandboxRequest)> {
    let template = match body.get("templateID") {
        Some(Value::String(s)) if !s.is_empty() => s.clone(),
        None | Some(Value::Null) => DEFAULT_TEMPLATE.to_string(),
        Some(other) => {
            return Err(RestError::bad(format!(
                "templateID: expected a string, got {other}"
            )))
        }
    };
    // `name:tag` and `team/name` forms select the same operator template name.
    let key = template.rsplit('/').next().unwrap_or(&template);
    let key = key.split(':').next().unwrap_or(key);
    let operators = e2b
        .cfg
        .templates
        .get(key)
        .or_else(|| e2b.cfg.templates.get(&template));
    let built = match operators {
        Some(_) => None,
        None => super::templates::image_template(e2b, tenant, &template),
    };
    let Some(Value::Object(tpl)) = operators.or(built.as_ref()) else {
        let known: Vec<&str> = e2b.cfg.templates.keys().map(String::as_str).collect();
        return Err(RestError::new(
            StatusCode::NOT_FOUND,
            format!(
                "template {template:?} was not found (this server has: {}, and the templates your key built)",
                known.join(", ")
            ),
        ));
    };
    refuse_unsupported(body)?;
    // Spec keys only: checked when the operator's are loaded, and built ones
    // are made by the daemon.
    let mut req: CreateSandboxRequest =
        crate::body::from_value(Value::Object(tpl.clone())).map_err(RestError::from)?;
    if let Some(envs) = body.get("envVars").filter(|v| !v.is_null()) {
        let env = req.env.get_or_insert_with(Default::default);
        env.extend(string_map("envVars", envs)?);
    }
    if let Some(t) = body.get("timeout").filter(|v| !v.is_null()) {
        let t = serde_json::from_value(t.clone())
            .map_err(|e| RestError::bad(format!("timeout: {e}")))?;
        req.timeout = Some(t);
    }
    if let Some(m) = body.get("metadata").filter(|v| !v.is_null()) {
        req.metadata = Some(string_map("metadata", m)?);
    }
    let asked = super::network::policy(body.get("allow_internet_access"), body.get("network"))
        .map_err(RestError::bad)?;
    if let Some(n) = asked {
        req.network = Some(n);
    }
    if super::network::public_ports(body.get("network")).map_err(RestError::bad)? {
        req.ports = Some(PortsSpec { public: true });
    }
    let lifecycle = super::lifecycle::of_create(body).map_err(RestError::bad)?;
    if !lifecycle.is_default() {
        req.on_timeout = Some(lifecycle.on_timeout);
        req.auto_resume = Some(lifecycle.auto_resume);
    }
    req.tags = Some(BTreeMap::from([(
        TEMPLATE_TAG.to_string(),
        template.clone(),
    )]));
    Ok((template, req))
}

/// An E2B object of strings (`envVars`, `metadata`), naming a bad value's key.
fn string_map(field: &str, v: &Value) -> RestResult<BTreeMap<String, String>> {
    let Value::Object(m) = v else {
        return Err(RestError::bad(format!(
            "{field}: expected an object of strings, got {v}"
        )));
    };
    m.iter()
        .map(|(k, v)| match v {
            Value::String(s) => Ok((k.clone(), s.clone())),
            other => Err(RestError::bad(format!(
                "{field}.{k}: values are strings, got {other}"
            ))),
        })
        .collect()
}

async fn create(
    State(e2b): State<Arc<E2b>>,
    headers: HeaderMap,
    body: Body,
) -> RestResult<Response> {
    let p = principal(&e2b, &headers)?;
    let bytes = read_limited(body, e2b.app.cfg.limits.max_request_body.bytes()).await?;
    let v: Value = serde_json::from_slice(&bytes)
        .map_err(|e| RestError::bad(format!("invalid JSON body: {e}")))?;
    let Value::Object(obj) = v else {
        return Err(RestError::bad("the request body must be a JSON object"));
    };
    if let Some(s) = super::snapshots::of_create(&e2b, &p, &obj) {
        return super::snapshots::create_from(&e2b, &p, &s, &obj).await;
    }
    let (_, req) = native_body(&e2b, &p.tenant, &obj)?;
    // A template built with a start command: its sandboxes start with it.
    let start = req
        .image
        .as_deref()
        .and_then(|i| super::templates::start_of(&e2b, &p.tenant, i));
    let user = req.user.clone().unwrap_or_else(|| "root".to_string());
    let params = crate::services::create::resolve(&e2b.app, &p, req)?;
    let lifetime = params.timeout;
    let rec = crate::sandbox::create(&e2b.app, params).await?;
    if let Some(cmd) = start {
        if let Err(e) = super::templates::run_start(&e2b, &rec.id, &user, &cmd, lifetime).await {
            let _ = crate::services::sandboxes::delete(&e2b.app, &p, &rec.id).await;
            return Err(e);
        }
    }
    Ok((StatusCode::CREATED, Json(created_json(&e2b, &rec))).into_response())
}

/// `metadata=k%3Dv%26k2%3Dv2` (a URL-encoded query string of URL-encoded pairs).
fn metadata_filter(v: &str) -> Vec<(String, String)> {
    form_urlencoded::parse(v.as_bytes())
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect()
}

/// Sandboxes a list call returns at most per page when it names no `limit`
/// (E2B's default), and at most in any case.
const DEFAULT_PAGE: usize = 100;
const MAX_PAGE: usize = 1000;

/// A page position: the (start time, id) of the last sandbox returned, opaque to
/// the client (`x-next-token`).
fn next_token(rec: &SandboxRecord) -> String {
    crate::auth::hex(format!("{}:{}", rec.started_at.unwrap_or(rec.created_at), rec.id).as_bytes())
}

fn parse_next_token(t: &str) -> RestResult<(i64, String)> {
    let bad = || {
        RestError::bad(format!(
            "nextToken: {t:?} is not a token this server issued"
        ))
    };
    if !t.len().is_multiple_of(2) || t.len() > 512 {
        return Err(bad());
    }
    let bytes: Vec<u8> = (0..t.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(t.get(i..i + 2).unwrap_or("zz"), 16))
        .collect::<Result<_, _>>()
        .map_err(|_| bad())?;
    let s = String::from_utf8(bytes).map_err(|_| bad())?;
    let (ms, id) = s.split_once(':').ok_or_else(bad)?;
    Ok((ms.parse().map_err(|_| bad())?, id.to_string()))
}

async fn list(
    State(e2b): State<Arc<E2b>>,
    headers: HeaderMap,
    RawQuery(q): RawQuery,
) -> RestResult<Response> {
    let p = principal(&e2b, &headers)?;
    let mut meta = Vec::new();
    let mut limit = DEFAULT_PAGE;
    let mut template = None;
    let (mut running, mut paused) = (true, true);
    let mut asc = false;
    let mut after: Option<(i64, String)> = None;
    let mut started_after = None;
    for (k, v) in form_urlencoded::parse(q.unwrap_or_default().as_bytes()) {
        match k.as_ref() {
            "metadata" | "query" => meta.extend(metadata_filter(&v)),
            "limit" => {
                limit = v.parse().ok().filter(|n| *n > 0).ok_or_else(|| {
                    RestError::bad(format!("limit: {v:?} is not a positive number"))
                })?;
                limit = limit.min(MAX_PAGE);
            }
            "template" => template = Some(v.into_owned()),
            "state" => {
                running = v.split(',').any(|s| s == "running");
                paused = v.split(',').any(|s| s == "paused");
            }
            "order" => asc = v == "asc",
            "nextToken" if !v.is_empty() => after = Some(parse_next_token(&v)?),
            "startedAfter" if !v.is_empty() => {
                started_after = Some(crate::timefmt::parse_rfc3339(&v).ok_or_else(|| {
                    RestError::bad(format!("startedAfter: {v:?} is not an RFC 3339 time"))
                })?)
            }
            _ => {}
        }
    }
    let mut states = Vec::new();
    // Mid-way, a sandbox is listed as what it is becoming: one being paused as
    // paused, one being resumed as running.
    if running {
        states.extend([
            SandboxState::Creating,
            SandboxState::Running,
            SandboxState::Resuming,
        ]);
    }
    if paused {
        states.extend([SandboxState::Paused, SandboxState::Pausing]);
    }
    if states.is_empty() {
        return Ok(Json(json!([])).into_response());
    }
    let f = SandboxFilter {
        tenant: p.scope.clone(),
        states,
        tags: template
            .map(|t| vec![(TEMPLATE_TAG.to_string(), Some(t))])
            .unwrap_or_default(),
        name: None,
        limit: 10_000,
    };
    let mut recs = e2b
        .app
        .store
        .list_sandboxes(&f)
        .map_err(ApiError::internal)?;
    let started = |r: &SandboxRecord| r.started_at.unwrap_or(r.created_at);
    recs.retain(|r| {
        // A paused sandbox (or one between paused and running) may have no
        // handle: its record is what it is.
        (matches!(
            r.state,
            SandboxState::Paused | SandboxState::Pausing | SandboxState::Resuming
        ) || e2b.app.handle(&r.id).is_some_and(|h| !h.is_stopping()))
            && meta.iter().all(|(k, v)| r.metadata.get(k) == Some(v))
            && started_after.is_none_or(|t| started(r) >= t)
    });
    // Newest first (or oldest first with `order=asc`), ties by id: a stable order
    // for the page tokens.
    recs.sort_by(|a, b| (started(b), &b.id).cmp(&(started(a), &a.id)));
    if asc {
        recs.reverse();
    }
    if let Some((ms, id)) = &after {
        let key = (*ms, id.as_str());
        recs.retain(|r| {
            let k = (started(r), r.id.as_str());
            if asc {
                k > key
            } else {
                k < key
            }
        });
    }
    let more = recs.len() > limit;
    recs.truncate(limit);
    let mut resp = Json(Value::Array(
        recs.iter().map(|r| listed_json(&e2b, r)).collect(),
    ))
    .into_response();
    if more {
        if let Some(last) = recs.last() {
            if let Ok(v) = axum::http::HeaderValue::from_str(&next_token(last)) {
                resp.headers_mut().insert("x-next-token", v);
            }
        }
    }
    Ok(resp)
}

async fn get_one(
    State(e2b): State<Arc<E2b>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> RestResult<Json<Value>> {
    let p = principal(&e2b, &headers)?;
    let rec = super::lifecycle::known_record(&e2b, &p, &id)?;
    let mut v = listed_json(&e2b, &rec);
    v["envdAccessToken"] = json!(e2b.access_token(&rec.id));
    v["domain"] = json!(e2b.cfg.domain);
    let (internet, network) =
        super::network::describe(&crate::network::current(&e2b.app, &rec.id, &rec.spec));
    v["allowInternetAccess"] = json!(internet);
    v["network"] = network;
    v["lifecycle"] = json!({
        "onTimeout": rec.lifecycle.on_timeout.as_str(),
        "autoResume": rec.lifecycle.auto_resume,
    });
    Ok(Json(v))
}

/// Replaces a running sandbox's egress policy (E2B's `update_network`): the new
/// rules hold at once and open connections they no longer allow are cut.
async fn update_network(
    State(e2b): State<Arc<E2b>>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Body,
) -> RestResult<StatusCode> {
    let p = principal(&e2b, &headers)?;
    let rec = live_record(&e2b, &p, &id)?;
    let b = json_body(&e2b, body).await?;
    // The update body carries the egress fields at its top level.
    let net = json!({"allowOut": b.get("allowOut"), "denyOut": b.get("denyOut"),
        "egressProxy": b.get("egressProxy"), "rules": b.get("rules")});
    let n = super::network::policy(b.get("allow_internet_access"), Some(&net))
        .map_err(RestError::bad)?
        // No rules at all: E2B's default, everything allowed.
        .unwrap_or_else(super::network::open);
    if crate::network::current(&e2b.app, &rec.id, &rec.spec).mode
        == sandlot_proto::spec::NetworkMode::None
    {
        return Err(RestError::new(
            StatusCode::CONFLICT,
            format!("sandbox {id} was created without a network (the operator's default is loopback only): create it with allow_internet_access or network to change its rules later"),
        ));
    }
    crate::network::update(&e2b.app, &rec.id, &n)?;
    Ok(StatusCode::NO_CONTENT)
}

async fn kill(
    State(e2b): State<Arc<E2b>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> RestResult<StatusCode> {
    let p = principal(&e2b, &headers)?;
    // A paused sandbox is killed too (deleted with what its pause saved), and
    // one being paused or resumed once that is done.
    let rec = super::lifecycle::known_record(&e2b, &p, &id)?;
    crate::services::sandboxes::delete(&e2b.app, &p, &rec.id).await?;
    Ok(StatusCode::NO_CONTENT)
}

pub(super) fn timeout_secs(body: &Value, field: &str) -> RestResult<Option<u64>> {
    match body.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match v
            .as_u64()
            .or_else(|| v.as_f64().filter(|f| *f >= 0.0).map(|f| f.ceil() as u64))
        {
            Some(n) => Ok(Some(n)),
            None => Err(RestError::bad(format!(
                "{field}: expected seconds, got {v}"
            ))),
        },
    }
}

pub(super) async fn json_body(e2b: &E2b, body: Body) -> RestResult<Value> {
    let bytes = read_limited(body, e2b.app.cfg.limits.max_request_body.bytes()).await?;
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(json!({}));
    }
    serde_json::from_slice(&bytes).map_err(|e| RestError::bad(format!("invalid JSON body: {e}")))
}

/// Sets the remaining lifetime through the sandboxes service (the native limits).
pub(super) async fn apply_timeout(e2b: &E2b, p: &Principal, id: &str, secs: u64) -> RestResult<()> {
    if secs == 0 {
        // E2B: a zero timeout is the timeout now: a sandbox whose lifecycle
        // pauses on timeout is auto-paused by its owner (as its timeout would),
        // any other ends now.
        if let Some(h) = e2b.app.handle(id) {
            if h.lifecycle.on_timeout == crate::store::OnExpiry::Pause {
                h.set_expiry(crate::store::now_ms());
                return Ok(());
            }
        }
        crate::services::sandboxes::delete(&e2b.app, p, id).await?;
        return Ok(());
    }
    crate::services::sandboxes::set_timeout(&e2b.app, p, id, std::time::Duration::from_secs(secs))?;
    Ok(())
}

async fn set_timeout(
    State(e2b): State<Arc<E2b>>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Body,
) -> RestResult<StatusCode> {
    let p = principal(&e2b, &headers)?;
    let rec = live_record(&e2b, &p, &id)?;
    let b = json_body(&e2b, body).await?;
    let secs = timeout_secs(&b, "timeout")?
        .ok_or_else(|| RestError::bad("timeout: required (seconds)"))?;
    apply_timeout(&e2b, &p, &rec.id, secs).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Extends the lifetime to `secs` from now unless it already ends later.
pub(super) async fn extend(
    e2b: &E2b,
    p: &Principal,
    rec: &SandboxRecord,
    secs: u64,
) -> RestResult<()> {
    let Some(h) = e2b.app.handle(&rec.id) else {
        return Err(RestError::not_found(&rec.id));
    };
    let wanted = crate::store::now_ms() + (secs as i64) * 1000;
    if wanted > h.expires_at_ms() {
        apply_timeout(e2b, p, &rec.id, secs).await?;
    }
    Ok(())
}

async fn refresh(
    State(e2b): State<Arc<E2b>>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Body,
) -> RestResult<StatusCode> {
    let p = principal(&e2b, &headers)?;
    let rec = live_record(&e2b, &p, &id)?;
    let b = json_body(&e2b, body).await?;
    let secs = timeout_secs(&b, "duration")?.unwrap_or(60);
    extend(&e2b, &p, &rec, secs).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// The sandbox's history of CPU and memory (`usage_history.rs`) in the range
/// asked (Unix seconds, the end's second included), ending with a sample taken
/// now when the range reaches the present; disk use is not measured (0).
async fn metrics(
    State(e2b): State<Arc<E2b>>,
    headers: HeaderMap,
    Path(id): Path<String>,
    RawQuery(q): RawQuery,
) -> RestResult<Json<Value>> {
    let p = principal(&e2b, &headers)?;
    let rec = live_record(&e2b, &p, &id)?;
    let (start, end) = crate::routes::metrics::time_range(q.as_deref())?;
    let Some(h) = e2b.app.handle(&rec.id) else {
        return Ok(Json(json!([])));
    };
    let m = h.metrics(start, end.map(|e| e.saturating_add(999)));
    let cpus = listed_json(&e2b, &rec)["cpuCount"]
        .as_u64()
        .unwrap_or(1)
        .max(1);
    let res = &rec.spec["resources"];
    let totals = (
        res["memory"].as_u64().unwrap_or(0),
        res["disk"].as_u64().unwrap_or(0),
    );
    Ok(Json(Value::Array(
        m.samples
            .iter()
            .map(|s| e2b_sample(s, cpus, totals))
            .collect(),
    )))
}

/// One sample as E2B's `SandboxMetric`: CPU as a percentage of the sandbox's CPUs.
fn e2b_sample(
    s: &sandlot_proto::api::metrics::MetricsSample,
    cpus: u64,
    (mem_total, disk_total): (u64, u64),
) -> Value {
    json!({
        "timestamp": s.at,
        "timestampUnix": s.at_unix_ms / 1000,
        "cpuCount": cpus,
        "cpuUsedPct": (s.cpu_cores / cpus as f64 * 100.0).clamp(0.0, 100.0),
        "memUsed": s.memory_bytes,
        "memTotal": mem_total,
        "memCache": 0,
        "diskUsed": 0,
        "diskTotal": disk_total,
    })
}

/// The sandbox's lifecycle events as log lines.
fn log_entries(e2b: &E2b, id: &str) -> RestResult<Vec<(String, String)>> {
    let ev = e2b
        .app
        .store
        .events(id, 0, 1000)
        .map_err(ApiError::internal)?;
    Ok(ev
        .into_iter()
        .map(|e| (rfc3339(e.at), format!("{}: {}", e.kind, e.message)))
        .collect())
}

async fn logs_v1(
    State(e2b): State<Arc<E2b>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> RestResult<Json<Value>> {
    let p = principal(&e2b, &headers)?;
    let rec = lookup(&e2b.app, &p, &id).map_err(|_| RestError::not_found(&id))?;
    let l = log_entries(&e2b, &rec.id)?;
    Ok(Json(json!({
        "logs": l.iter().map(|(t, m)| json!({"timestamp": t, "line": m})).collect::<Vec<_>>(),
        "logEntries": l.iter().map(|(t, m)| json!({"timestamp": t, "message": m, "level": "info", "fields": {}})).collect::<Vec<_>>(),
    })))
}

async fn logs_v2(
    State(e2b): State<Arc<E2b>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> RestResult<Json<Value>> {
    let p = principal(&e2b, &headers)?;
    let rec = lookup(&e2b.app, &p, &id).map_err(|_| RestError::not_found(&id))?;
    let l = log_entries(&e2b, &rec.id)?;
    Ok(Json(json!({
        "logs": l.iter().map(|(t, m)| json!({"timestamp": t, "message": m, "level": "info", "fields": {}})).collect::<Vec<_>>(),
    })))
}

/// Metadata keys and values as they come (for unit tests of the mapping).
pub fn metadata_pairs(q: &str) -> BTreeMap<String, String> {
    metadata_filter(q).into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_vars_and_metadata_are_objects_of_strings_named_by_key() {
        let m = string_map("envVars", &json!({"A": "1", "B": "2"})).unwrap();
        assert_eq!(m.get("B").map(String::as_str), Some("2"));
        let e = string_map("envVars", &json!({"A": "1", "B": 2})).unwrap_err();
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert!(e.message.starts_with("envVars.B: "), "{}", e.message);
        let e = string_map("metadata", &json!(["x"])).unwrap_err();
        assert!(e.message.starts_with("metadata: "), "{}", e.message);
    }

    #[test]
    fn unsupported_create_fields_are_refused_by_name() {
        let m = |v: Value| refuse_unsupported(v.as_object().unwrap()).map_err(|e| e.message);
        assert!(m(json!({"templateID": "base", "metadata": {}, "envVars": {}})).is_ok());
        assert!(
            m(json!({"autoPause": false, "allow_internet_access": false, "volumeMounts": []}))
                .is_ok()
        );
        assert!(m(json!({"mcp": {"x": 1}})).unwrap_err().contains("mcp"));
        assert!(m(json!({"volumeMounts": [{"name": "v", "path": "/v"}]}))
            .unwrap_err()
            .contains("volumeMounts"));
    }

    #[test]
    fn metadata_query_decodes_twice_encoded_pairs() {
        // The SDK quotes keys and values, urlencodes the pairs, then httpx
        // encodes the whole value as one query parameter.
        let m = metadata_pairs("user=alice%20b&team=a%26b");
        assert_eq!(m["user"], "alice b");
        assert_eq!(m["team"], "a&b");
    }

    #[test]
    fn page_tokens_round_trip_and_foreign_ones_are_refused() {
        let t = crate::auth::hex(b"1764470061250:sb-1");
        assert_eq!(
            parse_next_token(&t).unwrap(),
            (1_764_470_061_250, "sb-1".into())
        );
        for bad in ["xyz", "abc", "6162", &crate::auth::hex(b"x:sb")] {
            assert!(parse_next_token(bad)
                .unwrap_err()
                .message
                .contains("nextToken"));
        }
    }

    #[test]
    fn a_metric_is_e2b_shaped_with_cpu_as_a_share_of_the_sandboxs_cpus() {
        let s = sandlot_proto::api::metrics::MetricsSample {
            at: "2026-01-01T00:00:05Z".into(),
            at_unix_ms: 1_767_225_605_500,
            cpu_seconds: 3.0,
            cpu_cores: 0.5,
            memory_bytes: 7,
        };
        let v = e2b_sample(&s, 2, (8, 9));
        assert_eq!(v["cpuUsedPct"], json!(25.0));
        assert_eq!(v["timestampUnix"], json!(1_767_225_605));
        assert_eq!(
            (
                v["memUsed"].clone(),
                v["memTotal"].clone(),
                v["diskTotal"].clone()
            ),
            (json!(7), json!(8), json!(9))
        );
        let busy = sandlot_proto::api::metrics::MetricsSample {
            cpu_cores: 3.5,
            ..s
        };
        assert_eq!(e2b_sample(&busy, 1, (0, 0))["cpuUsedPct"], json!(100.0));
    }

    #[test]
    fn rest_errors_have_e2b_shape() {
        let r = RestError::new(StatusCode::NOT_IMPLEMENTED, "nope").into_response();
        assert_eq!(r.status(), StatusCode::NOT_IMPLEMENTED);
        let e: RestError = ApiError::quota("too many").into();
        assert_eq!(e.status, StatusCode::TOO_MANY_REQUESTS);
    }
}
