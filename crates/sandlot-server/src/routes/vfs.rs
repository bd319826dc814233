//! `/v1/vfs`: document collections of the caller's tenant and virtual shell
//! sessions over them (see `crate::vfs` and docs/vfs.md).

use std::collections::HashMap;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, RawQuery, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::Response;
use axum::Json;
use futures_util::StreamExt;
use sandlot_proto::api::vfs::{
    AuditList, CollectionList, CollectionView, CreateCollection, IngestAnswer, IngestCollection,
    OpenSession, RunCommand, RunResult, VfsAcl, VfsAclRule, VfsSession,
};

use super::{json_status, parse_json, read_limited};
use crate::auth::Principal;
use crate::error::{ApiError, ApiResult, ErrorCode};
use crate::state::AppState;
use crate::tarstream::{EntryKind, TarReader};
use crate::vfs::{IngestPlan, VfsService};

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> ApiResult<T> + Send + 'static,
) -> ApiResult<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(ApiError::internal)?
}

/// The body kind of a create or ingest request.
enum BodyKind {
    Json,
    Tar,
    Jsonl,
}

fn body_kind(headers: &HeaderMap) -> ApiResult<BodyKind> {
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    match ct.as_str() {
        "" | "application/json" => Ok(BodyKind::Json),
        "application/x-tar" | "application/tar" => Ok(BodyKind::Tar),
        "application/x-ndjson" | "application/jsonl" | "application/jsonlines" => {
            Ok(BodyKind::Jsonl)
        }
        other => Err(ApiError::of(ErrorCode::UnsupportedMediaType, format!("Content-Type {other}: expected application/json (a daemon-side source), application/x-tar (a directory archive) or application/x-ndjson (a JSONL chunk export)"),
        )),
    }
}

/// `name`, `acl_default` and repeated `acl=GLOB=ACL` of an upload's query.
fn upload_query(q: Option<String>) -> ApiResult<(Option<String>, Option<VfsAcl>)> {
    let mut name = None;
    let mut acl = VfsAcl::default();
    let mut any_acl = false;
    for (k, v) in form_urlencoded::parse(q.unwrap_or_default().as_bytes()).into_owned() {
        match k.as_str() {
            "name" => name = Some(v),
            "acl_default" => {
                acl.default = Some(v);
                any_acl = true;
            }
            "acl" => {
                let (pattern, a) = v.rsplit_once('=').ok_or_else(|| {
                    ApiError::invalid(
                        "acl",
                        format!("{v:?}: expected GLOB=ACL, e.g. internal/**=group:eng"),
                    )
                })?;
                acl.rules.push(VfsAclRule {
                    pattern: pattern.to_string(),
                    acl: a.to_string(),
                });
                any_acl = true;
            }
            other => {
                return Err(ApiError::invalid(
                    other,
                    "unknown query parameter (expected name, acl_default, acl)",
                ))
            }
        }
    }
    Ok((name, any_acl.then_some(acl)))
}

/// Stages an uploaded tar archive as a directory: regular files and directories
/// only (links and devices are skipped and reported), at most `vfs.max_upload`.
async fn stage_tar(dest: std::path::PathBuf, body: Body, limit: u64) -> ApiResult<Vec<String>> {
    let _ = tokio::fs::remove_dir_all(&dest).await;
    tokio::fs::create_dir_all(&dest)
        .await
        .map_err(|e| ApiError::internal(format!("stage upload in {}: {e}", dest.display())))?;
    let res = stage_tar_into(&dest, body, limit).await;
    if res.is_err() {
        let _ = tokio::fs::remove_dir_all(&dest).await;
    }
    res
}

async fn stage_tar_into(dest: &std::path::Path, body: Body, limit: u64) -> ApiResult<Vec<String>> {
    use tokio::io::AsyncWriteExt;
    let mut tr = TarReader::new(body.into_data_stream());
    let mut total = 0u64;
    let mut skipped = super::files::Skipped::default();
    let bad = |e: crate::tarstream::TarError| ApiError::invalid("body", e);
    let too_large = || {
        ApiError::too_large(format!(
            "the archive holds more than {} of files and entries (vfs.max_upload; 512 bytes an entry)",
            sandlot_proto::units::ByteSize(limit)
        ))
    };
    while let Some(entry) = tr.next_entry().await.map_err(bad)? {
        // Every entry counts (a directory or an empty file is an inode staged
        // on the daemon's disk), at a tar header's size.
        total = total.saturating_add(512);
        if total > limit {
            return Err(too_large());
        }
        let Some(rel) = entry.path.clone() else {
            continue;
        };
        if rel.split('/').any(|c| c == ".git") {
            continue;
        }
        let target = dest.join(&rel);
        match entry.kind {
            EntryKind::Dir => {
                tokio::fs::create_dir_all(&target)
                    .await
                    .map_err(|e| ApiError::invalid("body", format!("tar entry {rel:?}: {e}")))?;
            }
            EntryKind::File => {
                total = total.saturating_add(entry.size);
                if total > limit {
                    return Err(too_large());
                }
                if let Some(parent) = target.parent() {
                    tokio::fs::create_dir_all(parent).await.map_err(|e| {
                        ApiError::invalid("body", format!("tar entry {rel:?}: {e}"))
                    })?;
                }
                // create_new: no entry overwrites (or follows) an earlier one.
                let mut f = tokio::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .open(&target)
                    .await
                    .map_err(|e| ApiError::invalid("body", format!("tar entry {rel:?}: {e}")))?;
                while let Some(chunk) = tr.next_data().await.map_err(bad)? {
                    f.write_all(&chunk)
                        .await
                        .map_err(|e| ApiError::internal(format!("stage {rel}: {e}")))?;
                }
                f.flush()
                    .await
                    .map_err(|e| ApiError::internal(format!("stage {rel}: {e}")))?;
                let f = f.into_std().await;
                if let Some(mtime) = entry.mtime {
                    let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(mtime);
                    let _ = f.set_times(std::fs::FileTimes::new().set_modified(t));
                }
            }
            EntryKind::Symlink(_) => {
                skipped.note(|| format!("{}: symbolic link", super::files::shortened(&rel)))
            }
            EntryKind::Other(c) => {
                skipped.note(|| format!("{}: tar entry type {c:?}", super::files::shortened(&rel)))
            }
        }
    }
    Ok(skipped.into_lines())
}

/// Stages an uploaded JSONL export as a file, at most `vfs.max_upload`.
async fn stage_file(dest: std::path::PathBuf, body: Body, limit: u64) -> ApiResult<()> {
    use tokio::io::AsyncWriteExt;
    if let Some(parent) = dest.parent() {
        tokio::fs::create_dir_all(parent)
            .await
            .map_err(|e| ApiError::internal(format!("stage upload: {e}")))?;
    }
    let res = async {
        let mut f = tokio::fs::File::create(&dest)
            .await
            .map_err(|e| ApiError::internal(format!("stage upload: {e}")))?;
        let mut s = body.into_data_stream();
        let mut total = 0u64;
        while let Some(c) = s.next().await {
            let c = c.map_err(|e| ApiError::bad_request(format!("reading the upload: {e}")))?;
            total += c.len() as u64;
            if total > limit {
                return Err(ApiError::too_large(format!(
                    "the upload is larger than {} (vfs.max_upload)",
                    sandlot_proto::units::ByteSize(limit)
                )));
            }
            f.write_all(&c)
                .await
                .map_err(|e| ApiError::internal(format!("stage upload: {e}")))?;
        }
        f.flush()
            .await
            .map_err(|e| ApiError::internal(format!("stage upload: {e}")))
    }
    .await;
    if res.is_err() {
        let _ = tokio::fs::remove_file(&dest).await;
    }
    res
}

/// Stages an upload and returns the plan to ingest it (with the skipped entries).
async fn staged_plan(
    state: &AppState,
    tenant: &str,
    name: &str,
    kind: BodyKind,
    acl: Option<VfsAcl>,
    body: Body,
) -> ApiResult<(IngestPlan, Vec<String>)> {
    let svc = &state.vfs;
    let limit = svc.config().max_upload.0;
    let options = acl.as_ref().map(VfsService::options).transpose()?;
    let (source, path, skipped) = match kind {
        BodyKind::Tar => {
            let p = svc.upload_path(tenant, name, false)?;
            let skipped = stage_tar(p.clone(), body, limit).await?;
            (sandlot_vfs::Source::Dir { path: p.clone() }, p, skipped)
        }
        BodyKind::Jsonl => {
            let p = svc.upload_path(tenant, name, true)?;
            stage_file(p.clone(), body, limit).await?;
            (
                sandlot_vfs::Source::Jsonl { path: p.clone() },
                p,
                Vec::new(),
            )
        }
        BodyKind::Json => unreachable!("JSON bodies are not staged"),
    };
    Ok((
        IngestPlan {
            source: Some(source),
            options,
            staged: Some(path),
        },
        skipped,
    ))
}

fn answer(
    status: StatusCode,
    (collection, mut ingest): (CollectionView, sandlot_proto::api::vfs::IngestResult),
    skipped: Vec<String>,
) -> Response {
    ingest.skipped.extend(skipped);
    json_status(status, &IngestAnswer { collection, ingest })
}

#[utoipa::path(post, path = "/v1/vfs", tag = "vfs",
    description = "Create a collection. A JSON body names a daemon-side source (a host directory, git work tree or JSONL file under `vfs.allowed_source_paths`, or an S3 bucket at an endpoint in `vfs.allowed_s3_endpoints`). An `application/x-tar` body is a directory archive and an `application/x-ndjson` body a JSONL chunk export; their query names the collection (`name`) and its ACL policy (`acl_default`, repeated `acl=GLOB=ACL`).",
    params(("name" = Option<String>, Query, description = "uploads: the collection name"),
        ("acl_default" = Option<String>, Query, description = "uploads: `public`, `none` or `group:NAME,...`"),
        ("acl" = Option<String>, Query, description = "uploads: a rule `GLOB=ACL`, repeatable")),
    request_body(content(
        (CreateCollection = "application/json"),
        (String = "application/x-tar"),
        (String = "application/x-ndjson"))),
    responses((status = 201, body = IngestAnswer), (status = 400, body = crate::error::ErrorEnvelope),
        (status = 403, description = "the source is not one the operator allows", body = crate::error::ErrorEnvelope),
        (status = 409, description = "the collection exists", body = crate::error::ErrorEnvelope),
        (status = 422, description = "reading the source failed", body = crate::error::ErrorEnvelope)))]
pub async fn create(
    State(state): State<Arc<AppState>>,
    p: Principal,
    headers: HeaderMap,
    RawQuery(q): RawQuery,
    body: Body,
) -> ApiResult<Response> {
    let tenant = p.tenant.clone();
    match body_kind(&headers)? {
        BodyKind::Json => {
            if q.as_deref().is_some_and(|q| !q.is_empty()) {
                return Err(ApiError::bad_request(
                    "query parameters are for uploads; a JSON body carries name, source and acl",
                ));
            }
            let bytes = read_limited(body, state.cfg.limits.max_request_body.bytes()).await?;
            let b: CreateCollection = parse_json(&bytes)?;
            let source = state.vfs.source(&b.source)?;
            let options = VfsService::options(&b.acl.unwrap_or_default())?;
            let _busy = state.vfs.begin(&tenant, &b.name)?;
            let st = state.clone();
            let r = blocking(move || {
                st.vfs.ingest(
                    &tenant,
                    &b.name,
                    IngestPlan {
                        source: Some(source),
                        options: Some(options),
                        staged: None,
                    },
                    true,
                )
            })
            .await?;
            Ok(answer(StatusCode::CREATED, r, Vec::new()))
        }
        kind => {
            let (name, acl) = upload_query(q)?;
            let name = name.ok_or_else(|| {
                ApiError::invalid("name", "an upload names its collection: ?name=NAME")
            })?;
            sandlot_vfs::store::validate_name(&name).map_err(crate::vfs::store_error)?;
            if state.vfs.store(&tenant)?.collection(&name).is_ok() {
                return Err(ApiError::of(
                    ErrorCode::AlreadyExists,
                    format!("collection {name:?} already exists"),
                ));
            }
            let _busy = state.vfs.begin(&tenant, &name)?;
            let (mut plan, skipped) = staged_plan(
                &state,
                &tenant,
                &name,
                kind,
                Some(acl.unwrap_or_default()),
                body,
            )
            .await?;
            if plan.options.is_none() {
                plan.options = Some(sandlot_vfs::IngestOptions::default());
            }
            let st = state.clone();
            let r = blocking(move || st.vfs.ingest(&tenant, &name, plan, true)).await?;
            Ok(answer(StatusCode::CREATED, r, skipped))
        }
    }
}

#[utoipa::path(post, path = "/v1/vfs/{collection}/ingest", tag = "vfs",
    description = "Re-ingest: from the stored source (empty JSON object), a new source or ACL policy (JSON), or a new upload (`application/x-tar` / `application/x-ndjson`, ACL policy in the query). Only what changed is fetched; a new version is published only if something changed. Open sessions keep the version they started on.",
    params(("collection" = String, Path)),
    request_body(content(
        (IngestCollection = "application/json"),
        (String = "application/x-tar"),
        (String = "application/x-ndjson"))),
    responses((status = 200, body = IngestAnswer), (status = 404, body = crate::error::ErrorEnvelope),
        (status = 409, description = "an upload's collection re-ingested without an upload, or an ingest is running", body = crate::error::ErrorEnvelope)))]
pub async fn ingest(
    State(state): State<Arc<AppState>>,
    p: Principal,
    Path(name): Path<String>,
    headers: HeaderMap,
    RawQuery(q): RawQuery,
    body: Body,
) -> ApiResult<Response> {
    let tenant = p.tenant.clone();
    // 404 before reading any upload.
    state.vfs.view(&tenant, &name)?;
    let kind = body_kind(&headers)?;
    let _busy = state.vfs.begin(&tenant, &name)?;
    let (plan, skipped) = match kind {
        BodyKind::Json => {
            let bytes = read_limited(body, state.cfg.limits.max_request_body.bytes()).await?;
            let b: IngestCollection = if bytes.iter().all(u8::is_ascii_whitespace) {
                IngestCollection::default()
            } else {
                parse_json(&bytes)?
            };
            let source = b.source.as_ref().map(|s| state.vfs.source(s)).transpose()?;
            let options = b.acl.as_ref().map(VfsService::options).transpose()?;
            (
                IngestPlan {
                    source,
                    options,
                    staged: None,
                },
                Vec::new(),
            )
        }
        kind => {
            let (n, acl) = upload_query(q)?;
            if n.is_some() {
                return Err(ApiError::invalid(
                    "name",
                    "the collection is named by the path",
                ));
            }
            staged_plan(&state, &tenant, &name, kind, acl, body).await?
        }
    };
    let st = state.clone();
    let r = blocking(move || st.vfs.ingest(&tenant, &name, plan, false)).await?;
    Ok(answer(StatusCode::OK, r, skipped))
}

#[utoipa::path(get, path = "/v1/vfs", tag = "vfs",
    responses((status = 200, body = CollectionList)))]
pub async fn list(
    State(state): State<Arc<AppState>>,
    p: Principal,
) -> ApiResult<Json<CollectionList>> {
    let st = state.clone();
    blocking(move || st.vfs.list(&p.tenant))
        .await
        .map(|collections| Json(CollectionList { collections }))
}

#[utoipa::path(get, path = "/v1/vfs/{collection}", tag = "vfs",
    params(("collection" = String, Path)),
    responses((status = 200, body = CollectionView), (status = 404, body = crate::error::ErrorEnvelope)))]
pub async fn get_one(
    State(state): State<Arc<AppState>>,
    p: Principal,
    Path(name): Path<String>,
) -> ApiResult<Json<CollectionView>> {
    let st = state.clone();
    blocking(move || st.vfs.view(&p.tenant, &name))
        .await
        .map(Json)
}

#[utoipa::path(delete, path = "/v1/vfs/{collection}", tag = "vfs",
    description = "Remove a collection, its versions and content; its open sessions are closed. Refused (409) while a live sandbox mounts it.",
    params(("collection" = String, Path)),
    responses((status = 200, body = CollectionView), (status = 404, body = crate::error::ErrorEnvelope),
        (status = 409, description = "a live sandbox mounts it, or an ingest is running", body = crate::error::ErrorEnvelope)))]
pub async fn remove(
    State(state): State<Arc<AppState>>,
    p: Principal,
    Path(name): Path<String>,
) -> ApiResult<Json<CollectionView>> {
    let users = crate::mount_users::live_sandboxes_mounting(
        &state,
        &p.tenant,
        crate::mount_users::MountedKind::Collection,
        &name,
    );
    if !users.is_empty() {
        return Err(ApiError::conflict(format!(
            "collection {name} is mounted by sandbox {}: delete it first",
            users.join(", ")
        )));
    }
    let st = state.clone();
    blocking(move || st.vfs.remove(&p.tenant, &name))
        .await
        .map(Json)
}

#[utoipa::path(post, path = "/v1/vfs/{collection}/sessions", tag = "vfs",
    description = "Open a shell session for a principal. Documents the principal may not read are pruned from its tree before the session starts: it cannot list, read or grep them by any path. With `scratch: true` the session gets a private, in-memory copy-on-write scratch area that writes go to (freed when the session closes or expires); `scratch_max_bytes` above the operator's `vfs.scratch_max_size` is a 400.",
    params(("collection" = String, Path)),
    request_body = OpenSession,
    responses((status = 201, body = VfsSession), (status = 404, body = crate::error::ErrorEnvelope),
        (status = 429, description = "vfs.max_sessions reached", body = crate::error::ErrorEnvelope)))]
pub async fn open_session(
    State(state): State<Arc<AppState>>,
    p: Principal,
    Path(name): Path<String>,
    super::JsonBody(b): super::JsonBody<OpenSession>,
) -> ApiResult<Response> {
    let st = state.clone();
    let v = blocking(move || {
        let scratch = st.vfs.scratch_limits(b.scratch, b.scratch_max_bytes)?;
        let s = st.vfs.open_session_with(
            &p.tenant,
            &name,
            &b.principal,
            &b.groups,
            b.all_access,
            b.version,
            scratch,
        )?;
        Ok(st.vfs.session_view(&s))
    })
    .await?;
    Ok(json_status(StatusCode::CREATED, &v))
}

#[utoipa::path(get, path = "/v1/vfs/{collection}/sessions/{sid}", tag = "vfs",
    params(("collection" = String, Path), ("sid" = String, Path)),
    responses((status = 200, body = VfsSession), (status = 404, body = crate::error::ErrorEnvelope)))]
pub async fn get_session(
    State(state): State<Arc<AppState>>,
    p: Principal,
    Path((name, sid)): Path<(String, String)>,
) -> ApiResult<Json<VfsSession>> {
    let s = state.vfs.session(&p.tenant, &name, &sid)?;
    Ok(Json(state.vfs.session_view(&s)))
}

#[utoipa::path(delete, path = "/v1/vfs/{collection}/sessions/{sid}", tag = "vfs",
    params(("collection" = String, Path), ("sid" = String, Path)),
    responses((status = 204, description = "closed"), (status = 404, body = crate::error::ErrorEnvelope)))]
pub async fn close_session(
    State(state): State<Arc<AppState>>,
    p: Principal,
    Path((name, sid)): Path<(String, String)>,
) -> ApiResult<StatusCode> {
    state.vfs.close(&p.tenant, &name, &sid)?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(post, path = "/v1/vfs/{collection}/sessions/{sid}/run", tag = "vfs",
    description = "Run one command line. The working directory and variables carry over to the next run. Writes fail with `Read-only file system`, unless the session has a scratch area (then they change only that session's overlay; past its size, `No space left on device`). A command line that ends badly is still a 200 with its exit code; 429 once the session has run `vfs.max_commands` command lines.",
    params(("collection" = String, Path), ("sid" = String, Path)),
    request_body = RunCommand,
    responses((status = 200, body = RunResult), (status = 404, body = crate::error::ErrorEnvelope),
        (status = 409, description = "the session is running another command line", body = crate::error::ErrorEnvelope),
        (status = 429, description = "the session's command limit is reached", body = crate::error::ErrorEnvelope)))]
pub async fn run(
    State(state): State<Arc<AppState>>,
    p: Principal,
    Path((name, sid)): Path<(String, String)>,
    super::JsonBody(b): super::JsonBody<RunCommand>,
) -> ApiResult<Json<RunResult>> {
    let slot = state.vfs.session(&p.tenant, &name, &sid)?;
    slot.touch();
    let r = blocking(move || {
        let mut sh = slot.shell.try_lock().map_err(|_| {
            ApiError::conflict(format!(
                "session {sid} is running another command line; runs of one session are sequential"
            ))
        })?;
        let out = sh.run(&b.command);
        let cwd = sh.cwd().to_string();
        drop(sh);
        slot.touch();
        use sandlot_vfs::SessionError as E;
        let out = out.map_err(|e| match e {
            E::CommandLimit { .. } => ApiError::of(
                ErrorCode::Limit,
                format!("{e} (vfs.max_commands); open a new session"),
            ),
            E::CommandTooLong { .. } => ApiError::invalid("command", e.to_string()),
            other => ApiError::internal(crate::vfs::chain(&other)),
        })?;
        Ok(RunResult {
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            exit_code: out.exit_code,
            truncated: out.truncated,
            duration_ms: out.duration.as_secs_f64() * 1000.0,
            cwd,
        })
    })
    .await?;
    Ok(Json(r))
}

#[utoipa::path(get, path = "/v1/vfs/{collection}/audit", tag = "vfs",
    description = "Every command line run in a session on the collection, oldest first.",
    params(("collection" = String, Path),
        ("principal" = Option<String>, Query, description = "only this principal"),
        ("last" = Option<usize>, Query, description = "only the last N records")),
    responses((status = 200, body = AuditList), (status = 404, body = crate::error::ErrorEnvelope)))]
pub async fn audit(
    State(state): State<Arc<AppState>>,
    p: Principal,
    Path(name): Path<String>,
    RawQuery(q): RawQuery,
) -> ApiResult<Json<AuditList>> {
    let q: HashMap<String, String> = form_urlencoded::parse(q.unwrap_or_default().as_bytes())
        .into_owned()
        .collect();
    for k in q.keys() {
        if k != "principal" && k != "last" {
            return Err(ApiError::invalid(
                k.as_str(),
                "unknown query parameter (expected principal, last)",
            ));
        }
    }
    let last = q
        .get("last")
        .map(|v| {
            v.parse::<usize>()
                .map_err(|_| ApiError::invalid("last", "a number of records"))
        })
        .transpose()?;
    let principal = q.get("principal").cloned();
    let st = state.clone();
    blocking(move || st.vfs.audit(&p.tenant, &name, principal, last))
        .await
        .map(|records| Json(AuditList { records }))
}

/// Closes idle sessions periodically until the daemon stops.
pub fn start_sweeper(state: &Arc<AppState>) {
    let st = Arc::downgrade(state);
    let every = state.vfs.sweep_interval();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(every).await;
            let Some(s) = st.upgrade() else { return };
            let n = s.vfs.sweep();
            if n > 0 {
                tracing::info!(closed = n, "closed idle vfs sessions");
            }
        }
    });
}
