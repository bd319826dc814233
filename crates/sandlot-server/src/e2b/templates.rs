//! E2B's template build API (`Template.build`, `build_in_background`,
//! `get_build_status`, `exists`) as a thin adapter over the native image builds
//! (`crate::build`): a template an API key's tenant builds is an image of that
//! tenant, tagged with the template's name in the tenant's tag namespace, and
//! `Sandbox.create(template=NAME)` finds it there (`rest::native_body`).
//!
//! The SDK's calls, in order:
//! 1. `POST /v3/templates` `{name, tags}`: a build is requested; it holds one of
//!    the tenant's `images.max_builds_per_tenant` builds until it ends (or, never
//!    started, until `images.build_timeout` has passed).
//! 2. `GET /templates/{template}/files/{hash}` per `copy` step: an upload URL on
//!    this listener whose random token is bound to that build and files hash.
//! 3. `PUT` of the files as a (gzipped) tar to that URL: staged within the build
//!    context's limits and extracted through the store's bounded tar reader into
//!    the build's context, in a directory named by the hash.
//! 4. `POST /v2/templates/{template}/builds/{build}` with the steps: translated
//!    into a native build spec (bad input is a 400 before anything runs), which
//!    then runs in the background.
//! 5. `GET /templates/{template}/builds/{build}/status?logsOffset=N`: the status,
//!    the log lines from N, and for a failed build the step that failed.
//!
//! Builds are remembered in memory: a daemon restart forgets them (their images
//! stay).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::Read;
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{Path as UrlPath, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Json, Router};
use sandlot_net::admission::KeyLease;
use sandlot_store::build::{BuildSpec, Step};
use sandlot_store::{ImageConfig, ImageInfo, ImageName, ScopedTag, Viewer};
use serde::Deserialize;
use serde_json::{json, Value};

use super::rest::{principal, RestError};
use super::E2b;
use crate::body::read_limited;
use crate::error::ApiError;

pub mod catalog;
mod steps;
use steps::uploaded;
pub use steps::{translate, E2bBuild, E2bStep, Translated};

/// Where the upload URLs point (then the token).
const UPLOAD_PATH: &str = "/e2b-uploads/";
/// Log lines one status answer carries at most (the SDK asks again for more).
const LOG_PAGE: usize = 100;
/// Log lines kept per build; later ones are counted, not kept.
const MAX_LOG_LINES: usize = 10_000;
/// Bytes of one log line kept (a longer one is cut).
const MAX_LOG_LINE: usize = 16 << 10;
/// Bytes of log lines kept per build; past them one line says so, and later
/// ones are counted, not kept.
const MAX_LOG_BYTES: usize = 2 << 20;
/// Tags one request names at most.
const MAX_TAGS: usize = 64;
/// Upload URLs one build hands out (one per `copy` step's files).
const MAX_UPLOADS: usize = 1000;
/// Bytes of a copy step's source, and of each of its components (a file name's
/// limit).
const MAX_COPY_SOURCE: usize = 4096;
const MAX_COPY_SOURCE_NAME: usize = 255;
/// Paths one copy step's wildcards match at most.
const MAX_COPY_MATCHES: usize = 10_000;
/// Builds that ended kept per tenant for their status (a tenant's oldest are
/// forgotten first, so no tenant's builds push out another's).
const KEEP_FINISHED: usize = 32;
/// The image E2B's `from_base_image()` names: the operator's `base` template.
const E2B_BASE_IMAGE: &str = "e2bdev/base";

type RestResult<T> = Result<T, RestError>;

fn bad(message: impl Into<String>) -> RestError {
    RestError::new(StatusCode::BAD_REQUEST, message)
}

/// A native error as E2B's: a too-large upload is bad input like any other.
fn from_api(e: ApiError) -> RestError {
    if e.status == StatusCode::PAYLOAD_TOO_LARGE {
        return bad(e.message);
    }
    e.into()
}

/// The routes of the template build API.
pub fn routes() -> Router<Arc<E2b>> {
    Router::new()
        .route("/v3/templates", post(request_build))
        .route(
            "/templates",
            get(catalog::list).fallback(super::rest::unsupported),
        )
        .route(
            "/v2/templates",
            get(catalog::list_v2).fallback(super::rest::unsupported),
        )
        .route("/templates/{template}/files/{hash}", get(upload_link))
        .route("/v2/templates/{template}/builds/{build}", post(start_build))
        .route(
            "/templates/{template}/builds/{build}/status",
            get(build_status),
        )
        .route("/templates/aliases/{alias}", get(alias))
        .route("/templates/tags", post(assign_tags).delete(remove_tags))
        .route("/templates/{template}/tags", get(template_tags))
        .route(&format!("{UPLOAD_PATH}{{token}}"), put(upload))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Requested: files may be uploaded, the steps not sent yet.
    Waiting,
    Building,
    Ready,
    Error,
}

impl Phase {
    fn as_str(self) -> &'static str {
        match self {
            Phase::Waiting => "waiting",
            Phase::Building => "building",
            Phase::Ready => "ready",
            Phase::Error => "error",
        }
    }
}

#[derive(Debug, Clone)]
struct LogLine {
    at_ms: i64,
    level: &'static str,
    message: String,
    step: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum UploadState {
    Offered,
    Receiving,
    Done,
}

struct Upload {
    token: String,
    state: UploadState,
}

struct Build {
    tenant: String,
    template: String,
    /// The names the result is tagged with, in the tenant's namespace.
    names: Vec<ImageName>,
    phase: Phase,
    logs: Vec<LogLine>,
    dropped_logs: usize,
    /// Bytes of the kept lines' messages.
    log_bytes: usize,
    /// (message, E2B step name) of a failed build.
    reason: Option<(String, Option<String>)>,
    /// By files hash.
    uploads: BTreeMap<String, Upload>,
    /// The build context: each upload extracted in a directory named by its hash.
    ctx: PathBuf,
    /// What the uploads extracted so far expand to (all of them together are
    /// bounded as one native build context is).
    received: u64,
    /// One of the tenant's builds in flight, held until the build ends.
    lease: Option<KeyLease<String>>,
    requested: Instant,
    finished: Option<Instant>,
    /// The E2B step of each native step (`base` for what the base adds).
    step_names: Vec<String>,
    /// The native step running (1-based; 0: none yet).
    current: usize,
    /// What the template's sandboxes start with (`set_start_cmd`).
    start: StartCmd,
    /// The task that plans and runs the build once its steps came.
    task: Option<tokio::task::AbortHandle>,
}

impl Build {
    fn log(&mut self, level: &'static str, mut message: String, step: Option<String>) {
        // Past the byte cap `log_bytes` is one more than it (the line saying so
        // is kept).
        if self.logs.len() >= MAX_LOG_LINES || self.log_bytes > MAX_LOG_BYTES {
            self.dropped_logs += 1;
            return;
        }
        if message.len() > MAX_LOG_LINE {
            let mut end = MAX_LOG_LINE;
            while !message.is_char_boundary(end) {
                end -= 1;
            }
            // A new string of the kept part: a truncated one keeps its allocation.
            message = format!("{} [cut]", &message[..end]);
        }
        if self.log_bytes + message.len() > MAX_LOG_BYTES {
            self.dropped_logs += 1;
            self.log_bytes = MAX_LOG_BYTES + 1;
            message = format!(
                "the build's log passed {} MiB: later lines are not kept",
                MAX_LOG_BYTES >> 20
            );
        } else {
            self.log_bytes += message.len();
        }
        self.logs.push(LogLine {
            at_ms: crate::store::now_ms(),
            level,
            message,
            step,
        });
    }

    fn current_step(&self) -> Option<String> {
        self.current
            .checked_sub(1)
            .and_then(|i| self.step_names.get(i).cloned())
    }
}

/// The template builds this listener knows of, by build id.
#[derive(Default)]
pub struct Builds {
    by_id: Mutex<HashMap<String, Arc<Mutex<Build>>>>,
}

impl Builds {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Mutex<Build>>>> {
        self.by_id.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Forgets builds never started within `stale` (their context and lease go),
    /// ends as failed those building for longer whose task is gone (it ended
    /// without ending them), and forgets each tenant's oldest finished ones past
    /// [`KEEP_FINISHED`]. The contexts to remove are handed back, for the
    /// caller to remove outside the lock request handlers take.
    fn sweep(&self, stale: std::time::Duration) -> Vec<PathBuf> {
        let mut contexts = Vec::new();
        let mut m = self.lock();
        let mut finished: HashMap<String, Vec<(Instant, String)>> = HashMap::new();
        m.retain(|id, b| {
            let mut b = lock(b);
            if b.phase == Phase::Waiting && b.requested.elapsed() > stale {
                contexts.push(b.ctx.clone());
                return false;
            }
            if b.phase == Phase::Building
                && b.requested.elapsed() > stale
                && b.task.as_ref().is_none_or(|t| t.is_finished())
            {
                let message = "the build ended on the server without a result".to_string();
                b.log("error", message.clone(), None);
                b.reason = Some((message, None));
                b.phase = Phase::Error;
                b.finished = Some(Instant::now());
                b.lease = None;
                contexts.push(b.ctx.clone());
            }
            if let Some(t) = b.finished {
                finished
                    .entry(b.tenant.clone())
                    .or_default()
                    .push((t, id.clone()));
            }
            true
        });
        for mut ended in finished.into_values() {
            if ended.len() > KEEP_FINISHED {
                ended.sort();
                for (_, id) in &ended[..ended.len() - KEEP_FINISHED] {
                    m.remove(id);
                }
            }
        }
        contexts
    }

    fn get(&self, id: &str) -> Option<Arc<Mutex<Build>>> {
        self.lock().get(id).cloned()
    }
}

fn lock(b: &Mutex<Build>) -> std::sync::MutexGuard<'_, Build> {
    b.lock().unwrap_or_else(|e| e.into_inner())
}

/// The caller's build `id` of `template` (another tenant's is "not found").
fn tenant_build(
    e2b: &E2b,
    tenant: &str,
    template: &str,
    id: &str,
) -> RestResult<Arc<Mutex<Build>>> {
    e2b.templates
        .get(id)
        .filter(|b| {
            let b = lock(b);
            b.tenant == tenant && b.template == template
        })
        .ok_or_else(|| {
            RestError::new(
                StatusCode::NOT_FOUND,
                format!("build {id} of template {template} was not found"),
            )
        })
}

/// A build id in the form E2B's are (a UUID).
fn new_build_id() -> String {
    let h = crate::auth::random_hex(16);
    format!(
        "{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// A template's name and the image names its build is tagged with: `NAME:TAG`
/// and each of `tags` as `NAME:TAG`, or `NAME` (`NAME:latest`) alone.
fn template_names(name: &str, tags: &[String]) -> RestResult<(String, Vec<ImageName>)> {
    let parsed = ImageName::parse(name).map_err(|e| bad(format!("name: {e}")))?;
    let explicit = name.rsplit('/').next().unwrap_or(name).contains(':');
    let mut names = Vec::new();
    if explicit || tags.is_empty() {
        names.push(parsed.clone());
    }
    for (i, t) in tags.iter().enumerate() {
        let n = ImageName::parse(&format!("{}:{t}", parsed.repo))
            .map_err(|e| bad(format!("tags[{i}]: {e}")))?;
        if !names.contains(&n) {
            names.push(n);
        }
    }
    Ok((parsed.repo, names))
}

async fn json_object(e2b: &E2b, body: Body) -> RestResult<serde_json::Map<String, Value>> {
    let bytes = read_limited(body, e2b.app.cfg.limits.max_request_body.bytes()).await?;
    match serde_json::from_slice(&bytes) {
        Ok(Value::Object(o)) => Ok(o),
        Ok(_) => Err(bad("the request body must be a JSON object")),
        Err(e) => Err(bad(format!("invalid JSON body: {e}"))),
    }
}

/// `POST /v3/templates`: requests a build of the template `name`.
async fn request_build(
    State(e2b): State<Arc<E2b>>,
    headers: HeaderMap,
    body: Body,
) -> RestResult<Response> {
    let p = principal(&e2b, &headers)?;
    let b = json_object(&e2b, body).await?;
    let name = match b.get("name").or_else(|| b.get("alias")) {
        Some(Value::String(s)) if !s.is_empty() => s.clone(),
        _ => {
            return Err(bad(
                "name: required (the template's name, NAME or NAME:TAG)",
            ))
        }
    };
    let tags: Vec<String> = match b.get("tags") {
        None | Some(Value::Null) => Vec::new(),
        Some(v) => serde_json::from_value(v.clone())
            .map_err(|_| bad("tags: expected a list of strings"))?,
    };
    if tags.len() > MAX_TAGS {
        return Err(bad(format!("tags: at most {MAX_TAGS} per request")));
    }
    let (template, names) = template_names(&name, &tags)?;
    let stale = e2b.templates.sweep(e2b.app.cfg.images.build_timeout.0);
    if !stale.is_empty() {
        tokio::task::spawn_blocking(move || {
            stale.iter().for_each(|c| drop(std::fs::remove_dir_all(c)))
        });
    }
    let lease = e2b.app.builds.try_take(&p.tenant).map_err(|held| {
        RestError::new(
            StatusCode::TOO_MANY_REQUESTS,
            format!(
                "tenant {} runs {held} builds already (images.max_builds_per_tenant = {})",
                p.tenant,
                e2b.app.builds.cap()
            ),
        )
    })?;
    let ctx = e2b.app.images.store.tmp_path("e2b-context");
    std::fs::create_dir(&ctx).map_err(|e| ApiError::internal(format!("stage context: {e}")))?;
    let id = new_build_id();
    let tag_names: Vec<String> = names.iter().map(|n| n.tag.clone()).collect();
    let mut build = Build {
        tenant: p.tenant.clone(),
        template: template.clone(),
        names,
        phase: Phase::Waiting,
        logs: Vec::new(),
        dropped_logs: 0,
        log_bytes: 0,
        reason: None,
        uploads: BTreeMap::new(),
        ctx,
        received: 0,
        lease: Some(lease),
        requested: Instant::now(),
        finished: None,
        step_names: Vec::new(),
        current: 0,
        start: StartCmd::default(),
        task: None,
    };
    build.log(
        "info",
        format!("build {id} of template {name} requested"),
        None,
    );
    e2b.templates
        .lock()
        .insert(id.clone(), Arc::new(Mutex::new(build)));
    Ok((
        StatusCode::ACCEPTED,
        Json(json!({
            "templateID": template,
            "buildID": id,
            "public": false,
            "names": [name],
            "tags": tag_names,
            "aliases": [template],
        })),
    )
        .into_response())
}

fn valid_hash(h: &str) -> bool {
    h.len() == 64
        && h.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// `GET /templates/{template}/files/{hash}`: where the files of a `copy` step go
/// (this listener, with a token bound to the template's waiting build and the
/// hash), or `present` when they were uploaded to it already.
async fn upload_link(
    State(e2b): State<Arc<E2b>>,
    headers: HeaderMap,
    UrlPath((template, hash)): UrlPath<(String, String)>,
) -> RestResult<Response> {
    let p = principal(&e2b, &headers)?;
    if !valid_hash(&hash) {
        return Err(bad(format!(
            "files hash {hash:?}: expected a lowercase hex SHA-256"
        )));
    }
    // The newest build of the template that waits for its files.
    let build = {
        let m = e2b.templates.lock();
        m.values()
            .filter(|b| {
                let b = lock(b);
                b.tenant == p.tenant && b.template == template && b.phase == Phase::Waiting
            })
            .max_by_key(|b| lock(b).requested)
            .cloned()
    }
    .ok_or_else(|| {
        RestError::new(
            StatusCode::NOT_FOUND,
            format!("no build of template {template} waits for files (request a build first)"),
        )
    })?;
    let host = headers
        .get(axum::http::header::HOST)
        .and_then(|v| v.to_str().ok())
        .filter(|h| !h.is_empty() && !h.contains(['/', ' ', '@']))
        .ok_or_else(|| bad("a Host header is required (the upload URL names this listener)"))?
        .to_string();
    let scheme = match headers
        .get("x-forwarded-proto")
        .and_then(|v| v.to_str().ok())
    {
        Some("https") => "https",
        _ => "http",
    };
    let mut b = lock(&build);
    if b.uploads.len() >= MAX_UPLOADS && !b.uploads.contains_key(&hash) {
        return Err(bad(format!(
            "a build takes the files of at most {MAX_UPLOADS} copy steps"
        )));
    }
    let up = b.uploads.entry(hash).or_insert_with(|| Upload {
        token: crate::auth::random_hex(32),
        state: UploadState::Offered,
    });
    if up.state == UploadState::Done {
        return Ok((StatusCode::CREATED, Json(json!({"present": true}))).into_response());
    }
    let url = format!("{scheme}://{host}{UPLOAD_PATH}{}", up.token);
    Ok((
        StatusCode::CREATED,
        Json(json!({"present": false, "url": url})),
    )
        .into_response())
}

/// A reader that fails once more than `left` bytes came through: what a gzipped
/// upload inflates to is bounded before the tar reader sees it.
struct Capped<R> {
    inner: R,
    left: u64,
    limit: sandlot_store::SizeLimit,
}

impl<R: Read> Read for Capped<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        if n as u64 > self.left {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("the upload inflates to more than {}", self.limit.name),
            ));
        }
        self.left -= n as u64;
        Ok(n)
    }
}

/// Extracts an uploaded tar (gzipped or not) into `dir` within `limit`: the
/// store's bounded tar reader and the build context's checks (no entry outside
/// `dir`, no path through a link, what it expands to within the limit).
fn extract_upload(
    tar: &Path,
    dir: &Path,
    limit: &sandlot_store::SizeLimit,
) -> Result<(), ApiError> {
    let mut f =
        std::fs::File::open(tar).map_err(|e| ApiError::internal(format!("open upload: {e}")))?;
    let mut magic = [0u8; 2];
    let gz = matches!(f.read_exact(&mut magic), Ok(()) if magic == [0x1f, 0x8b]);
    std::io::Seek::rewind(&mut f).map_err(|e| ApiError::internal(format!("read upload: {e}")))?;
    std::fs::create_dir(dir).map_err(|e| ApiError::internal(format!("stage upload: {e}")))?;
    let f = std::io::BufReader::new(f);
    let r = if gz {
        crate::build::extract_context_from(
            Capped {
                inner: flate2::read::GzDecoder::new(f),
                left: limit.bytes,
                limit: limit.clone(),
            },
            dir,
            limit,
        )
    } else {
        crate::build::extract_context_from(f, dir, limit)
    };
    if r.is_err() {
        let _ = std::fs::remove_dir_all(dir);
    }
    r
}

/// `PUT /e2b-uploads/{token}`: the files of one `copy` step. The token alone
/// names the build and hash (the SDK sends no key here). A build receives one
/// upload at a time (another is a 409), so each is bounded by what the ones
/// before it left of the build's budget.
async fn upload(
    State(e2b): State<Arc<E2b>>,
    UrlPath(token): UrlPath<String>,
    body: Body,
) -> RestResult<StatusCode> {
    let found = {
        let m = e2b.templates.lock();
        m.values().find_map(|b| {
            let mut g = lock(b);
            if g.phase != Phase::Waiting {
                return None;
            }
            let hash = g
                .uploads
                .iter()
                .find(|(_, u)| {
                    u.state == UploadState::Offered
                        && super::envd::constant_time_eq(u.token.as_bytes(), token.as_bytes())
                })
                .map(|(h, _)| h.clone())?;
            if g.uploads
                .values()
                .any(|u| u.state == UploadState::Receiving)
            {
                return Some(Err(RestError::new(
                    StatusCode::CONFLICT,
                    "another upload of this build is being received (a build takes its uploads one at a time)",
                )));
            }
            if let Some(u) = g.uploads.get_mut(&hash) {
                u.state = UploadState::Receiving;
            }
            Some(Ok((b.clone(), hash, g.ctx.clone(), g.received)))
        })
    };
    let Some(found) = found else {
        return Err(RestError::new(
            StatusCode::NOT_FOUND,
            "no upload waits at this URL (it is used, expired, or its build started)",
        ));
    };
    let (build, hash, ctx, received) = found?;
    // Received and settled in a task of its own: a dropped request still
    // leaves the upload done or offered again, never receiving.
    tokio::spawn(async move {
        let r = receive(&e2b, body, &ctx, &hash, received).await;
        let mut b = lock(&build);
        let state = if r.is_ok() {
            UploadState::Done
        } else {
            UploadState::Offered
        };
        if let Some(u) = b.uploads.get_mut(&hash) {
            u.state = state;
        }
        b.received += r.map_err(from_api)?;
        b.log("info", format!("files {} received", &hash[..12]), None);
        Ok(StatusCode::OK)
    })
    .await
    .unwrap_or_else(|e| Err(ApiError::internal(e).into()))
}

/// A staged upload, removed however its receipt ends.
struct Staged(PathBuf);

impl Drop for Staged {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Stages and extracts one upload into the context; what it expands to. The
/// build's uploads together are bounded as one build context is: `received` is
/// what the earlier ones expanded to.
async fn receive(
    e2b: &E2b,
    body: Body,
    ctx: &Path,
    hash: &str,
    received: u64,
) -> Result<u64, ApiError> {
    let app = &e2b.app;
    let tmp = app.images.store.tmp_path("e2b-upload");
    let _staged = Staged(tmp.clone());
    let expanded = app.cfg.images.max_expanded_size.bytes();
    let (limit, limit_name) = match app.cfg.limits.max_upload.bytes() {
        n if n > 0 && n <= expanded => (n, "limits.max_upload"),
        _ => (expanded, "images.max_expanded_size"),
    };
    let left = limit.saturating_sub(received);
    if left == 0 {
        return Err(ApiError::invalid(
            "upload",
            format!("the build's files together are larger than {limit_name} ({limit} bytes)"),
        ));
    }
    crate::body::stage_within(body, &tmp, left, limit_name, "upload").await?;
    let mut lim = app.images.limit(None);
    lim.bytes = lim.bytes.saturating_sub(received);
    let (t2, dir) = (tmp.clone(), ctx.join(hash));
    tokio::task::spawn_blocking(move || {
        extract_upload(&t2, &dir, &lim)?;
        Ok(tree_cost(&dir))
    })
    .await
    .map_err(ApiError::internal)
    .and_then(|r| r)
}

/// What a directory tree expands to as the build context's bound counts it:
/// 512 bytes per entry and each file's size (links are not followed).
fn tree_cost(dir: &Path) -> u64 {
    let mut cost = 0u64;
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let Ok(m) = e.path().symlink_metadata() else {
                continue;
            };
            cost = cost.saturating_add(512);
            if m.is_dir() {
                todo.push(e.path());
            } else if m.is_file() {
                cost = cost.saturating_add(m.len());
            }
        }
    }
    cost
}

/// A store error looking up a base as the tenant sees it: a name that is not
/// there, not a name or ambiguous is a 400 about `what`; anything else goes
/// through the store's filter (its details, which may name host paths, stay in
/// the log).
fn store_refusal(what: &str, e: sandlot_store::StoreError) -> RestError {
    use sandlot_store::StoreError;
    match e {
        StoreError::NotFound(_) | StoreError::BadName(_) | StoreError::Ambiguous(_) => {
            bad(format!("{what}: {e}"))
        }
        e => crate::images::store_error(e).into(),
    }
}

/// The base a build starts from and the config steps it adds: an operator's
/// template (the `host` image with its user, working directory and variables, or
/// its store image), or an image the tenant sees by that name (a template it
/// built). `None`: no such template or image.
fn template_base(
    e2b: &E2b,
    who: &crate::build::Builder,
    name: &str,
) -> RestResult<Option<(ImageInfo, Vec<Step>)>> {
    let app = &e2b.app;
    let key = name.rsplit('/').next().unwrap_or(name);
    let key = key.split(':').next().unwrap_or(key);
    if let Some(Value::Object(t)) = e2b
        .cfg
        .templates
        .get(key)
        .or_else(|| e2b.cfg.templates.get(name))
    {
        if let Some(k) = t
            .keys()
            .find(|k| !["image", "user", "env", "workdir"].contains(&k.as_str()))
        {
            return Err(bad(format!(
                "template {name:?} cannot be a build's base: it sets {k} (only image, user, env and workdir carry into an image)"
            )));
        }
        let image = t.get("image").and_then(Value::as_str).unwrap_or("host");
        let base = if image == sandlot_proto::spec::HOST_IMAGE {
            crate::build::host_base(app, who, &ImageConfig::default()).map_err(RestError::from)?
        } else {
            app.images
                .resolve_for(Viewer::Tenant(&who.tenant), image)
                .map_err(|e| store_refusal(&format!("template {name:?}"), e))?
        };
        let mut steps = Vec::new();
        if let Some(Value::Object(env)) = t.get("env") {
            let kv: Vec<(String, String)> = env
                .iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
                .collect();
            if !kv.is_empty() {
                steps.push(Step::Env(kv));
            }
        }
        if let Some(u) = t.get("user").and_then(Value::as_str) {
            steps.push(Step::User(u.to_string()));
            if t.get("workdir").is_none() {
                steps.push(Step::Workdir(super::home_of(u)));
            }
        }
        if let Some(w) = t.get("workdir").and_then(Value::as_str) {
            steps.push(Step::Workdir(w.to_string()));
        }
        return Ok(Some((base, steps)));
    }
    match app.images.resolve_for(Viewer::Tenant(&who.tenant), name) {
        Ok(img) => Ok(Some((img, Vec::new()))),
        Err(sandlot_store::StoreError::NotFound(_))
        | Err(sandlot_store::StoreError::BadName(_)) => Ok(None),
        Err(e) => Err(store_refusal(name, e)),
    }
}

/// The base of an E2B build body.
fn resolve_from(
    e2b: &E2b,
    who: &crate::build::Builder,
    body: &E2bBuild,
) -> RestResult<(ImageInfo, Vec<Step>)> {
    let set = |o: &Option<String>| o.as_deref().filter(|s| !s.is_empty()).map(str::to_string);
    if body
        .from_image_registry
        .as_ref()
        .is_some_and(|v| !v.is_null())
    {
        return Err(bad(
            "fromImageRegistry: registry credentials are not supported (a tenant's build does not pull images)",
        ));
    }
    match (set(&body.from_image), set(&body.from_template)) {
        (Some(_), Some(_)) | (None, None) => Err(bad(
            "exactly one of fromImage and fromTemplate must be given",
        )),
        (None, Some(t)) => template_base(e2b, who, &t)?
            .ok_or_else(|| bad(format!("fromTemplate: template {t:?} was not found"))),
        (Some(img), None) => {
            let repo = img.split('@').next().unwrap_or(&img);
            let repo = match repo.rfind(':') {
                Some(i) if !repo[i..].contains('/') => &repo[..i],
                _ => repo,
            };
            if repo == E2B_BASE_IMAGE || repo == format!("docker.io/{E2B_BASE_IMAGE}") {
                return template_base(e2b, who, super::DEFAULT_TEMPLATE)?
                    .ok_or_else(|| bad("fromImage: the base template is not configured"));
            }
            match e2b
                .app
                .images
                .resolve_for(Viewer::Tenant(&who.tenant), &img)
            {
                Ok(i) => Ok((i, Vec::new())),
                Err(sandlot_store::StoreError::NotFound(_)) => Err(bad(format!(
                    "fromImage: {img} is not in this server's image store, and a tenant's build does not pull images (the operator pulls them: sandlot image pull)"
                ))),
                Err(e) => Err(store_refusal("fromImage", e)),
            }
        }
    }
}

/// `POST /v2/templates/{template}/builds/{build}`: the steps; the build starts.
async fn start_build(
    State(e2b): State<Arc<E2b>>,
    headers: HeaderMap,
    UrlPath((template, id)): UrlPath<(String, String)>,
    body: Body,
) -> RestResult<StatusCode> {
    let p = principal(&e2b, &headers)?;
    let build = tenant_build(&e2b, &p.tenant, &template, &id)?;
    let raw = json_object(&e2b, body).await?;
    let body: E2bBuild = serde_json::from_value(Value::Object(raw))
        .map_err(|e| bad(format!("invalid build body: {e}")))?;
    let (answer, planned) = tokio::sync::oneshot::channel();
    {
        let mut b = lock(&build);
        if b.phase != Phase::Waiting {
            return Err(RestError::new(
                StatusCode::CONFLICT,
                format!("build {id} has started already"),
            ));
        }
        if b.uploads
            .values()
            .any(|u| u.state == UploadState::Receiving)
        {
            return Err(RestError::new(
                StatusCode::CONFLICT,
                format!("build {id} is still receiving files"),
            ));
        }
        // From here no upload is taken: the context is the build's. What
        // follows runs in a task of its own, so a dropped request still ends
        // the build (refused, or run), never leaves it building.
        b.phase = Phase::Building;
        let task = tokio::spawn(plan_and_run(
            e2b.clone(),
            build.clone(),
            p.tenant.clone(),
            body,
            b.ctx.clone(),
            answer,
        ));
        b.task = Some(task.abort_handle());
    }
    planned
        .await
        .unwrap_or_else(|_| Err(ApiError::internal("a build's start ended unanswered").into()))
}

/// Plans a started build from its body (the answer to the request goes to
/// `answer`), then runs it; a refused body ends it.
async fn plan_and_run(
    e2b: Arc<E2b>,
    build: Arc<Mutex<Build>>,
    tenant: String,
    body: E2bBuild,
    ctx: PathBuf,
    answer: tokio::sync::oneshot::Sender<RestResult<StatusCode>>,
) {
    let nonempty = |c: &Option<String>| c.clone().filter(|c| !c.trim().is_empty());
    lock(&build).start = StartCmd {
        start: nonempty(&body.start_cmd),
        ready: nonempty(&body.ready_cmd),
    };
    let who = crate::build::Builder {
        tenant: tenant.clone(),
        owner: Some(tenant),
        fresh_from: None,
    };
    let (e2, w2, b2, c2) = (e2b.clone(), who.clone(), body.clone(), ctx.clone());
    let planned = tokio::task::spawn_blocking(move || {
        let (base, prelude) = resolve_from(&e2, &w2, &b2)?;
        let sources = |hash: &str, src: &str| uploaded(&c2.join(hash), src);
        let t = translate(
            &b2,
            base.config.user.clone(),
            base.config.workdir.clone().unwrap_or_else(|| "/".into()),
            &sources,
            prelude,
        )?;
        Ok::<_, RestError>((base, t))
    })
    .await
    .unwrap_or_else(|e| Err(RestError::from(ApiError::internal(e))));
    let (base, t) = match planned {
        Ok(x) => x,
        Err(e) => {
            let _ = answer.send(Err(refuse(&build, e)));
            return;
        }
    };
    let spec = BuildSpec {
        from: base.id.to_string(),
        steps: t.steps,
        network: e2b.app.cfg.network.ceiling >= sandlot_proto::spec::NetworkMode::Open,
    };
    if let Err(e) = sandlot_store::build::check(&spec) {
        let _ = answer.send(Err(refuse(&build, bad(e.to_string()))));
        return;
    }
    {
        let mut b = lock(&build);
        b.step_names = t.step_names;
        b.log(
            "info",
            format!(
                "building {} steps from {}",
                spec.steps.len(),
                short(&base.id.to_string())
            ),
            Some("base".into()),
        );
    }
    let who = crate::build::Builder {
        fresh_from: t.fresh_from,
        ..who
    };
    let _ = answer.send(Ok(StatusCode::ACCEPTED));
    run(e2b, build, who, spec, ctx).await;
}

/// Ends a build whose body was refused: it failed with `e` before any step ran
/// (its context and its place among the tenant's builds go).
fn refuse(build: &Mutex<Build>, e: RestError) -> RestError {
    let mut b = lock(build);
    b.log("error", e.message.clone(), Some("base".into()));
    b.reason = Some((e.message.clone(), Some("base".into())));
    b.phase = Phase::Error;
    b.finished = Some(Instant::now());
    b.lease = None;
    let _ = std::fs::remove_dir_all(&b.ctx);
    e
}

fn short(id: &str) -> String {
    id.trim_start_matches("sha256:").chars().take(12).collect()
}

/// Runs a started build to its end: the native build, then the tags.
async fn run(
    e2b: Arc<E2b>,
    build: Arc<Mutex<Build>>,
    who: crate::build::Builder,
    spec: BuildSpec,
    ctx: PathBuf,
) {
    let b2 = build.clone();
    let send: Arc<dyn Fn(Value) + Send + Sync> = Arc::new(move |mut v: Value| {
        let mut b = lock(&b2);
        match v["type"].as_str() {
            Some("step") => {
                b.current = v["index"].as_u64().unwrap_or(0) as usize;
                let step = b.current_step();
                let cached = if v["cached"].as_bool() == Some(true) {
                    " (cached)"
                } else {
                    ""
                };
                let text = v["text"].as_str().unwrap_or_default().to_string();
                let line = format!("[{}/{}] {text}{cached}", b.current, v["of"]);
                b.log("info", line, step);
            }
            Some("log") => {
                let step = b.current_step();
                // The line itself, not a copy of it.
                let line = match v["line"].take() {
                    Value::String(s) => s,
                    _ => String::new(),
                };
                b.log("info", line, step);
            }
            _ => {}
        }
    });
    let tenant = who.tenant.clone();
    let r = crate::build::run(e2b.app.clone(), who, spec, ctx.clone(), None, send).await;
    let (names, start) = {
        let b = lock(&build);
        (b.names.clone(), b.start.clone())
    };
    let r = match r {
        Ok(img) => {
            let app = e2b.app.clone();
            tokio::task::spawn_blocking(move || {
                save_start(&app.cfg.data_dir, &tenant, &img.id, &start)?;
                tag_as(&app, &tenant, &img, &names).map_err(crate::images::store_error)?;
                Ok::<_, ApiError>(img)
            })
            .await
            .unwrap_or_else(|e| Err(ApiError::internal(e)))
            .map_err(|e| (e, Some("finalize".to_string())))
        }
        Err(e) => {
            let step = lock(&build).current_step().or(Some("base".into()));
            Err((e, step))
        }
    };
    let _ = tokio::fs::remove_dir_all(&ctx).await;
    let mut b = lock(&build);
    match r {
        Ok(img) => {
            let names: Vec<String> = b.names.iter().map(ToString::to_string).collect();
            b.log(
                "info",
                format!(
                    "built {} as {}",
                    short(&img.id.to_string()),
                    names.join(", ")
                ),
                Some("finalize".into()),
            );
            b.phase = Phase::Ready;
        }
        Err((e, step)) => {
            let message = if e.status.is_server_error() {
                tracing::error!(
                    detail = e.internal.as_deref().unwrap_or(""),
                    "e2b template build failed: {}",
                    e.message
                );
                "the build failed on the server (see the daemon's log)".to_string()
            } else {
                e.message
            };
            b.log("error", message.clone(), step.clone());
            b.reason = Some((message, step));
            b.phase = Phase::Error;
        }
    }
    b.finished = Some(Instant::now());
    b.lease = None;
}

/// The start and ready commands of a template (E2B's `set_start_cmd`,
/// `set_ready_cmd`), kept per tenant beside the image:
/// `<data>/e2b-templates/t-<tenant in hex>/<id>.json`. Per tenant: a build with
/// no steps yields its base image itself, which other tenants may use too.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, Deserialize)]
pub struct StartCmd {
    pub start: Option<String>,
    pub ready: Option<String>,
}

/// How long a sandbox's create waits for its template's ready command at most
/// (less when the sandbox's lifetime is shorter).
const READY_WAIT: Duration = Duration::from_secs(60);

/// The directory of `tenant`'s start commands (its name in hex: any tenant name
/// gives a directory of its own).
fn start_dir(data_dir: &Path, tenant: &str) -> PathBuf {
    data_dir
        .join("e2b-templates")
        .join(format!("t-{}", crate::auth::hex(tenant.as_bytes())))
}

fn start_file(data_dir: &Path, tenant: &str, image: &sandlot_store::Digest) -> PathBuf {
    let id = image.to_string();
    start_dir(data_dir, tenant).join(format!("{}.json", id.trim_start_matches("sha256:")))
}

/// Start commands kept by image id alone (`e2b-templates/<id>.json`, as an
/// earlier daemon kept them) go to the tenant that owns the image, the one that
/// built it; those of an image no tenant owns (an operator's, which any tenant
/// may build from without steps) or that is gone are removed: whose they were
/// cannot be told, and read by image alone they would start in every tenant's
/// sandboxes.
pub fn move_unowned_start_files(app: &crate::AppState) {
    let dir = app.cfg.data_dir.join("e2b-templates");
    let Ok(rd) = std::fs::read_dir(&dir) else {
        return;
    };
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(hex) = name.strip_suffix(".json") else {
            continue;
        };
        if !e.file_type().is_ok_and(|t| t.is_file()) {
            continue;
        }
        let owner = format!("sha256:{hex}")
            .parse::<sandlot_store::Digest>()
            .ok()
            .and_then(|d| Some((app.images.store.get(&d).ok()?.owner?, d)));
        let moved = owner.and_then(|(tenant, d)| {
            let to = start_file(&app.cfg.data_dir, &tenant, &d);
            let parent = to.parent()?;
            std::fs::create_dir_all(parent).ok()?;
            std::fs::rename(e.path(), &to).ok().map(|()| tenant)
        });
        match moved {
            Some(tenant) => {
                tracing::info!(image = %hex, %tenant, "e2b start commands moved to the tenant that built the image")
            }
            None => {
                let _ = std::fs::remove_file(e.path());
                tracing::warn!(image = %hex, "e2b start commands of an image no tenant owns removed (rebuild the template to set them again)");
            }
        }
    }
}

/// Records `tenant`'s template start commands for `img` (none: removes an
/// earlier build's), written whole or not at all.
fn save_start(
    data_dir: &Path,
    tenant: &str,
    img: &sandlot_store::Digest,
    start: &StartCmd,
) -> Result<(), ApiError> {
    let path = start_file(data_dir, tenant, img);
    if start == &StartCmd::default() {
        return match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(ApiError::internal(format!(
                "remove {}: {e}",
                path.display()
            ))),
            _ => Ok(()),
        };
    }
    let dir = start_dir(data_dir, tenant);
    std::fs::create_dir_all(&dir)
        .map_err(|e| ApiError::internal(format!("create {}: {e}", dir.display())))?;
    let tmp = path.with_extension("tmp");
    let bytes = serde_json::to_vec(start).map_err(ApiError::internal)?;
    std::fs::write(&tmp, bytes)
        .and_then(|_| std::fs::rename(&tmp, &path))
        .map_err(|e| ApiError::internal(format!("write {}: {e}", path.display())))
}

/// The start commands `tenant`'s template builds set for the image a sandbox
/// spec names by id (`sha256:...`).
pub fn start_of(e2b: &E2b, tenant: &str, image: &str) -> Option<StartCmd> {
    read_start(&e2b.app.cfg.data_dir, tenant, image)
}

fn read_start(data_dir: &Path, tenant: &str, image: &str) -> Option<StartCmd> {
    let id: sandlot_store::Digest = image.parse().ok()?;
    let bytes = std::fs::read(start_file(data_dir, tenant, &id)).ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// Starts a template's start command in the new sandbox `id` (in the background,
/// as `user`), then runs its ready command until it succeeds: every 200 ms, for
/// at most [`READY_WAIT`] or `lifetime`, whichever is shorter.
pub async fn run_start(
    e2b: &E2b,
    id: &str,
    user: &str,
    cmd: &StartCmd,
    lifetime: Duration,
) -> RestResult<()> {
    let h = e2b.app.handle(id).ok_or_else(|| {
        RestError::new(StatusCode::NOT_FOUND, format!("sandbox {id} was not found"))
    })?;
    let exec = |c: &str, background: bool, tag: &str| sandlot_proto::api::ExecBody {
        argv: vec!["/bin/bash".into(), "-l".into(), "-c".into(), c.to_string()],
        env: BTreeMap::new(),
        cwd: None,
        user: Some(user.to_string()),
        pty: None,
        timeout: None,
        stdin: false,
        tag: Some(tag.to_string()),
        background,
    };
    if let Some(start) = &cmd.start {
        crate::services::process::start(&e2b.app, &h, &exec(start, true, "e2b-start")).await?;
    }
    let Some(ready) = &cmd.ready else {
        return Ok(());
    };
    // Within the sandbox's lifetime, so that it is still there to answer.
    let wait = READY_WAIT.min(lifetime.mul_f64(0.75));
    let deadline = Instant::now() + wait;
    let not_ready = |why: &str| {
        RestError::new(
            StatusCode::BAD_REQUEST,
            format!(
                "the template's ready command did not succeed within {:.1} s{why} (the sandbox was removed)",
                wait.as_secs_f64()
            ),
        )
    };
    // Its output is not kept: nothing reads it.
    let ready = format!("( {ready} ) >/dev/null 2>&1");
    loop {
        let entry =
            crate::services::process::start(&e2b.app, &h, &exec(&ready, false, "e2b-ready"))
                .await
                .map_err(|e| not_ready(&format!(": {}", e.message)))?;
        let left = deadline.saturating_duration_since(Instant::now());
        let exit = tokio::time::timeout(left, entry.wait())
            .await
            .ok()
            .flatten();
        if exit.and_then(|x| x.code) == Some(0) {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(not_ready(""));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `GET /templates/{template}/builds/{build}/status?logsOffset=N&limit=L`.
async fn build_status(
    State(e2b): State<Arc<E2b>>,
    headers: HeaderMap,
    UrlPath((template, id)): UrlPath<(String, String)>,
    RawQuery(q): RawQuery,
) -> RestResult<Json<Value>> {
    let p = principal(&e2b, &headers)?;
    let build = tenant_build(&e2b, &p.tenant, &template, &id)?;
    let (mut offset, mut limit) = (0usize, LOG_PAGE);
    let mut min_level = 0;
    for (k, v) in form_urlencoded::parse(q.unwrap_or_default().as_bytes()) {
        let n = || {
            v.parse::<usize>()
                .map_err(|_| bad(format!("{k}: {v:?} is not a number")))
        };
        match k.as_ref() {
            "logsOffset" => offset = n()?,
            "limit" => limit = n()?.min(LOG_PAGE),
            "level" => min_level = level_rank(&v),
            _ => {}
        }
    }
    let b = lock(&build);
    let entry = |l: &LogLine| {
        let mut v = json!({
            "timestamp": crate::timefmt::rfc3339(l.at_ms),
            "message": l.message,
            "level": l.level,
        });
        if let Some(s) = &l.step {
            v["step"] = json!(s);
        }
        v
    };
    let entries: Vec<Value> = b
        .logs
        .iter()
        .filter(|l| level_rank(l.level) >= min_level)
        .skip(offset)
        .take(limit)
        .map(entry)
        .collect();
    let mut out = json!({
        "templateID": b.template,
        "buildID": id,
        "status": b.phase.as_str(),
        "logs": [],
        "logEntries": entries,
    });
    if let Some((message, step)) = &b.reason {
        out["reason"] = json!({"message": message});
        if let Some(s) = step {
            out["reason"]["step"] = json!(s);
        }
    }
    Ok(Json(out))
}

fn level_rank(l: &str) -> u8 {
    match l {
        "debug" => 0,
        "info" => 1,
        "warn" => 2,
        "error" => 3,
        _ => 0,
    }
}

/// `GET /templates/aliases/{alias}` (`Template.exists`): an operator's template
/// or an image the caller's tenant sees by that name; another tenant's are
/// "not found".
async fn alias(
    State(e2b): State<Arc<E2b>>,
    headers: HeaderMap,
    UrlPath(alias): UrlPath<String>,
) -> RestResult<Json<Value>> {
    let p = principal(&e2b, &headers)?;
    let not_found = || {
        RestError::new(
            StatusCode::NOT_FOUND,
            format!("template {alias:?} was not found"),
        )
    };
    let key = alias.rsplit('/').next().unwrap_or(&alias);
    let key = key.split(':').next().unwrap_or(key);
    if e2b.cfg.templates.contains_key(key) || e2b.cfg.templates.contains_key(&alias) {
        return Ok(Json(json!({"templateID": key, "public": true})));
    }
    let img = e2b
        .app
        .images
        .resolve_for(Viewer::Tenant(&p.tenant), &alias)
        .map_err(|_| not_found())?;
    Ok(Json(json!({
        "templateID": ImageName::parse(&alias).map(|n| n.repo).unwrap_or(alias.clone()),
        "public": img.owner.is_none(),
    })))
}

/// Gives `img` each of `names` in `tenant`'s namespace.
fn tag_as(
    app: &crate::state::AppState,
    tenant: &str,
    img: &ImageInfo,
    names: &[ImageName],
) -> Result<(), sandlot_store::StoreError> {
    for n in names {
        let tag = ScopedTag {
            tenant: Some(tenant),
            name: n,
        };
        app.images.store.tag_image(&img.id, tag)?;
    }
    Ok(())
}

/// A build id for an image (E2B's are UUIDs): its id's first 128 bits.
fn image_build_id(img: &ImageInfo) -> String {
    let h = img.id.to_string();
    let h = h.trim_start_matches("sha256:");
    format!(
        "{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// A tag request's template, its repository, the tags asked for and their names.
struct TagRequest {
    named: String,
    repo: String,
    tags: Vec<String>,
    names: Vec<ImageName>,
}

/// The body of a tag request: the template named by `field` (`what` says what it
/// must be) and each of `tags` as a name of that template's repository, at most
/// `MAX_TAGS`, none holding a ':'.
fn tag_request(
    b: &serde_json::Map<String, Value>,
    field: &str,
    what: &str,
) -> RestResult<TagRequest> {
    let named = b
        .get(field)
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .ok_or_else(|| bad(format!("{field}: required ({what})")))?
        .to_string();
    let tags: Vec<String> = b
        .get("tags")
        .and_then(|v| serde_json::from_value(v.clone()).ok())
        .filter(|t: &Vec<String>| !t.is_empty())
        .ok_or_else(|| bad("tags: expected a non-empty list of strings"))?;
    if tags.len() > MAX_TAGS {
        return Err(bad(format!("tags: at most {MAX_TAGS} per request")));
    }
    let repo = ImageName::parse(&named)
        .map_err(|e| bad(format!("{field}: {e}")))?
        .repo;
    let names = tags
        .iter()
        .enumerate()
        .map(|(i, t)| {
            if t.contains(':') {
                return Err(bad(format!("tags[{i}]: {t:?} is a tag, without ':'")));
            }
            ImageName::parse(&format!("{repo}:{t}")).map_err(|e| bad(format!("tags[{i}]: {e}")))
        })
        .collect::<RestResult<Vec<_>>>()?;
    Ok(TagRequest {
        named,
        repo,
        tags,
        names,
    })
}

/// `POST /templates/tags` `{target: "NAME:TAG", tags}` (`Template.assign_tags`):
/// the image the tenant names `target` gets `NAME:TAG` for each tag, in the
/// tenant's namespace.
async fn assign_tags(
    State(e2b): State<Arc<E2b>>,
    headers: HeaderMap,
    body: Body,
) -> RestResult<Response> {
    let p = principal(&e2b, &headers)?;
    let b = json_object(&e2b, body).await?;
    let TagRequest {
        named: target,
        tags,
        names,
        ..
    } = tag_request(&b, "target", "NAME:TAG of the template build to tag")?;
    let app = e2b.app.clone();
    let tenant = p.tenant.clone();
    let img = tokio::task::spawn_blocking(move || {
        let img = app
            .images
            .resolve_for(Viewer::Tenant(&tenant), &target)
            .map_err(|_| {
                RestError::new(
                    StatusCode::NOT_FOUND,
                    format!("template {target:?} was not found"),
                )
            })?;
        tag_as(&app, &tenant, &img, &names)
            .map_err(|e| RestError::from(crate::images::store_error(e)))?;
        Ok::<_, RestError>(img)
    })
    .await
    .map_err(|e| RestError::from(ApiError::internal(e)))??;
    Ok((
        StatusCode::CREATED,
        Json(json!({"buildID": image_build_id(&img), "tags": tags})),
    )
        .into_response())
}

/// `DELETE /templates/tags` `{name, tags}` (`Template.remove_tags`): removes the
/// tenant's tags `NAME:TAG` (the images stay).
async fn remove_tags(
    State(e2b): State<Arc<E2b>>,
    headers: HeaderMap,
    body: Body,
) -> RestResult<StatusCode> {
    let p = principal(&e2b, &headers)?;
    let b = json_object(&e2b, body).await?;
    let TagRequest {
        repo, tags, names, ..
    } = tag_request(&b, "name", "the template's name")?;
    let mut removed = 0;
    for n in &names {
        let tag = ScopedTag {
            tenant: Some(&p.tenant),
            name: n,
        };
        if e2b
            .app
            .images
            .store
            .untag(tag)
            .map_err(crate::images::store_error)?
        {
            removed += 1;
        }
    }
    if removed == 0 {
        return Err(RestError::new(
            StatusCode::NOT_FOUND,
            format!("template {repo} has none of the tags {}", tags.join(", ")),
        ));
    }
    Ok(StatusCode::NO_CONTENT)
}

/// `GET /templates/{template}/tags` (`Template.get_tags`): every name of the
/// template's repository the caller's tenant sees (its own tags, and the shared
/// ones its own do not hide), newest image first, each with its image's build id
/// (see [`image_build_id`]) and creation time; 404 when it sees none.
async fn template_tags(
    State(e2b): State<Arc<E2b>>,
    headers: HeaderMap,
    UrlPath(template): UrlPath<String>,
) -> RestResult<Json<Value>> {
    let p = principal(&e2b, &headers)?;
    let named = template
        .rsplit_once('/')
        .map_or(template.as_str(), |(_, n)| n);
    let repo = ImageName::parse(named)
        .map_err(|e| bad(format!("template: {e}")))?
        .repo;
    let app = e2b.app.clone();
    let tenant = p.tenant.clone();
    let wanted = repo.clone();
    let tags = tokio::task::spawn_blocking(move || {
        let store = &app.images.store;
        let viewer = Viewer::Tenant(&tenant);
        let mut out = Vec::new();
        for img in store.list()? {
            if !viewer.sees(&img) {
                continue;
            }
            for name in store.tags_seen_by(Viewer::Tenant(&tenant), &img)? {
                let Ok(n) = ImageName::parse(&name) else {
                    continue;
                };
                if n.repo == wanted {
                    out.push(json!({
                        "tag": n.tag,
                        "buildID": image_build_id(&img),
                        "createdAt": crate::timefmt::rfc3339(img.created_at),
                    }));
                }
            }
        }
        Ok::<_, sandlot_store::StoreError>(out)
    })
    .await
    .map_err(|e| RestError::from(ApiError::internal(e)))?
    .map_err(crate::images::store_error)?;
    if tags.is_empty() {
        return Err(RestError::new(
            StatusCode::NOT_FOUND,
            format!("template {repo:?} was not found"),
        ));
    }
    Ok(Json(Value::Array(tags)))
}

/// The sandbox a template the caller's tenant built (or an image it sees by
/// that name) makes: `None` when there is none. Its default user is the image's
/// (`user` for the base template's), root when it names none.
pub fn image_template(e2b: &E2b, tenant: &str, template: &str) -> Option<Value> {
    let names = [
        template,
        template.rsplit_once('/').map_or(template, |(_, n)| n),
    ];
    let img = names
        .iter()
        .find_map(|n| e2b.app.images.resolve_for(Viewer::Tenant(tenant), n).ok())?;
    Some(json!({
        "image": img.id.to_string(),
        "user": img.config.user.clone().unwrap_or_else(|| "root".into()),
    }))
}

#[cfg(test)]
mod tests;
