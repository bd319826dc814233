//! `/v1/images`: list, inspect, remove, prune, import (an OCI layout or `docker
//! save` tar as the body), export (the same format), diff; and
//! `POST /v1/sandboxes/{id}/snapshot`. Changing the image set (import, remove,
//! prune) is the operator's (Unix socket); tenants list, inspect, export, diff
//! and snapshot their sandboxes. Each principal sees images and names through its
//! [`Viewer`](sandlot_store::Viewer) (`crate::images::viewer`): a tenant its own
//! tags and the operator's, the operator the shared tags (and every tenant's
//! under `tenant_tags`).

use std::collections::HashMap;
use std::io::Write;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, RawQuery, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use bytes::Bytes;
use sandlot_store::{oci, ImageInfo, ImageName, PruneReport, StoreError, TreeDiff, Viewer};
use serde::{Deserialize, Serialize};

use super::{json_status, live, parse_json, read_limited};
use crate::auth::Principal;
use crate::error::{ApiError, ApiResult, ErrorCode};
use crate::images::{store_error, viewer};
use crate::state::AppState;

/// An image as the API shows it.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ImageView {
    /// `sha256:...` of the OCI config.
    pub id: String,
    /// The names the caller finds it by: a tenant's own tags and the operator's
    /// (those its own do not hide); for the operator, the operator's (shared) tags.
    pub tags: Vec<String>,
    /// For the operator only: tags in tenants' namespaces.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tenant_tags: Vec<TenantTagView>,
    /// The tenant a snapshot belongs to (absent: the shared set).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// Bottom first.
    pub layers: Vec<LayerView>,
    pub env: Vec<String>,
    pub workdir: Option<String>,
    pub user: Option<String>,
    pub entrypoint: Vec<String>,
    pub cmd: Vec<String>,
    /// The image a snapshot or build step started from.
    pub parent: Option<String>,
    /// `host` for an image whose layers go on top of the built-in `host` image
    /// (a snapshot of a `host` sandbox: its sandboxes get this host's `/usr` and
    /// `/etc` entries); absent for a self-contained image.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub base: Option<String>,
    /// `import`, `snapshot`, `directory`, `build`, `pull`.
    pub source: String,
    pub created_at: String,
    /// Bytes of the layer blobs.
    pub size: u64,
    /// For a snapshot just taken: how long the sandbox was frozen, in milliseconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub frozen_ms: Option<f64>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct TenantTagView {
    pub tenant: String,
    pub name: String,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct LayerView {
    pub diff_id: String,
    pub digest: String,
    pub media_type: String,
    pub size: u64,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ImageList {
    pub images: Vec<ImageView>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct PruneView {
    pub layers_removed: usize,
    pub blobs_removed: usize,
    pub bytes_freed: u64,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct DiffView {
    pub added: Vec<String>,
    pub changed: Vec<String>,
    pub removed: Vec<String>,
}

/// `POST /v1/sandboxes/{id}/snapshot` body (optional).
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SnapshotBody {
    /// Tag the new image (`NAME[:TAG]`).
    #[serde(default)]
    pub tag: Option<String>,
}

/// The view of `i` for `viewer`: its names as the viewer finds it by them.
pub fn view_for(state: &AppState, viewer: Viewer, i: &ImageInfo) -> ApiResult<ImageView> {
    let mut v = view(i);
    v.tags = state
        .images
        .store
        .tags_seen_by(viewer, i)
        .map_err(store_error)?;
    if viewer != Viewer::Operator {
        v.tenant_tags.clear();
    }
    Ok(v)
}

/// The operator's view of `i` (see [`view_for`]).
pub fn view(i: &ImageInfo) -> ImageView {
    ImageView {
        id: i.id.to_string(),
        tags: i.tags.clone(),
        tenant_tags: i
            .tenant_tags
            .iter()
            .map(|t| TenantTagView {
                tenant: t.tenant.clone(),
                name: t.name.clone(),
            })
            .collect(),
        owner: i.owner.clone(),
        layers: i
            .layers
            .iter()
            .map(|l| LayerView {
                diff_id: l.diff_id.to_string(),
                digest: l.blob.to_string(),
                media_type: l.media_type.clone(),
                size: l.blob_size,
            })
            .collect(),
        env: i.config.env.clone(),
        workdir: i.config.workdir.clone(),
        user: i.config.user.clone(),
        entrypoint: i.config.entrypoint.clone(),
        cmd: i.config.cmd.clone(),
        parent: i.parent.map(|p| p.to_string()),
        base: i
            .config
            .host_base
            .then(|| sandlot_proto::spec::HOST_IMAGE.to_string()),
        source: i.source.clone(),
        created_at: crate::timefmt::rfc3339(i.created_at),
        size: i.size,
        frozen_ms: None,
    }
}

fn query(q: Option<String>) -> HashMap<String, String> {
    form_urlencoded::parse(q.unwrap_or_default().as_bytes())
        .into_owned()
        .collect()
}

/// Every write to the shared image namespace (the names every tenant falls back
/// to and warm pools start from) stays on the Unix socket: imports, removals,
/// prunes, a build or snapshot naming a shared image, pulls and pushes (which
/// also make the daemon connect to whatever host a request names). A stolen
/// operator token must leave nothing behind that outlives its revocation.
fn socket_only(p: &Principal, what: &str) -> ApiResult<()> {
    crate::auth::require_socket(p, what)
}

/// A build or snapshot by `p` tagging `tag`: a shared name when `p` is not
/// acting as a tenant, which only the socket writes.
fn shared_tag_is_socket_only(p: &Principal, tag: Option<&ImageName>, what: &str) -> ApiResult<()> {
    if p.scope.is_none() && tag.is_some() {
        socket_only(p, what)?;
    }
    Ok(())
}

fn parse_tag(field: &str, t: Option<&String>) -> ApiResult<Option<ImageName>> {
    t.map(|t| ImageName::parse(t).map_err(|e| ApiError::invalid(field, e)))
        .transpose()
}

pub(super) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> ApiResult<T> + Send + 'static,
) -> ApiResult<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(ApiError::internal)?
}

#[utoipa::path(get, path = "/v1/images", tag = "images",
    responses((status = 200, body = ImageList)))]
pub async fn list(State(state): State<Arc<AppState>>, p: Principal) -> ApiResult<Json<ImageList>> {
    let st = state.clone();
    let images = blocking(move || {
        let v = viewer(p.scope.as_deref());
        st.images
            .store
            .list()
            .map_err(store_error)?
            .iter()
            .filter(|i| v.sees(i))
            .map(|i| view_for(&st, v, i))
            .collect::<ApiResult<Vec<_>>>()
    })
    .await?;
    Ok(Json(ImageList { images }))
}

#[utoipa::path(get, path = "/v1/images/{reference}", tag = "images",
    params(("reference" = String, Path, description = "NAME[:TAG], sha256:ID or an id prefix (12+ hex digits)")),
    responses((status = 200, body = ImageView), (status = 404, body = crate::error::ErrorEnvelope)))]
pub async fn inspect(
    State(state): State<Arc<AppState>>,
    p: Principal,
    Path(reference): Path<String>,
) -> ApiResult<Json<ImageView>> {
    let st = state.clone();
    let v = blocking(move || {
        let v = viewer(p.scope.as_deref());
        let img = st.images.resolve_for(v, &reference).map_err(store_error)?;
        view_for(&st, v, &img)
    })
    .await?;
    Ok(Json(v))
}

/// How long a removal waits for the clean-ups of stopped sandboxes that still
/// hold the image.
const HOLDER_TEARDOWN_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

#[utoipa::path(delete, path = "/v1/images/{reference}", tag = "images",
    params(("reference" = String, Path, description = "A name removes that tag (and the image with its last tag); an id removes the image")),
    responses((status = 200, body = ImageView), (status = 404, body = crate::error::ErrorEnvelope),
        (status = 409, description = "a sandbox or a snapshot holds the image", body = crate::error::ErrorEnvelope)))]
pub async fn remove(
    State(state): State<Arc<AppState>>,
    p: Principal,
    Path(reference): Path<String>,
) -> ApiResult<Json<ImageView>> {
    socket_only(&p, "removing images")?;
    let remove = || {
        let st = state.clone();
        let reference = reference.clone();
        blocking(move || Ok(st.images.store.remove(&reference)))
    };
    let ended = state.teardowns.ended();
    let mut r = remove().await?;
    // A sandbox whose delete has answered lets its image go in its clean-up,
    // which runs on after the answer (its checkpoints' leases too): the removal
    // waits for the clean-ups running of its holders and asks again (also if
    // one ended since it asked), so that it is refused only for holders that
    // stay (a live sandbox, a snapshot).
    if let Err(StoreError::InUse { holders, .. }) = &r {
        if state.teardowns.any_running(holders) || state.teardowns.ended() != ended {
            state
                .teardowns
                .wait_for(holders, HOLDER_TEARDOWN_WAIT)
                .await;
            r = remove().await?;
        }
    }
    let r = r.map_err(store_error)?;
    Ok(Json(view(&r.image)))
}

#[utoipa::path(post, path = "/v1/images/prune", tag = "images",
    responses((status = 200, body = PruneView)))]
pub async fn prune(State(state): State<Arc<AppState>>, p: Principal) -> ApiResult<Json<PruneView>> {
    socket_only(&p, "pruning images")?;
    let st = state.clone();
    let r: PruneReport = blocking(move || {
        let _alone = st.images.pruning();
        st.images.store.prune().map_err(store_error)
    })
    .await?;
    Ok(Json(PruneView {
        layers_removed: r.layers.len(),
        blobs_removed: r.blobs.len(),
        bytes_freed: r.bytes,
    }))
}

#[utoipa::path(post, path = "/v1/images/import", tag = "images",
    params(("tag" = Option<String>, Query, description = "Name the imported image (single-image archives)")),
    request_body(content = Vec<u8>, description = "An OCI layout or docker save tar (optionally gzip)", content_type = "application/x-tar"),
    responses((status = 201, body = ImageList), (status = 400, body = crate::error::ErrorEnvelope)))]
pub async fn import(
    State(state): State<Arc<AppState>>,
    p: Principal,
    RawQuery(q): RawQuery,
    body: Body,
) -> ApiResult<Response> {
    socket_only(&p, "importing images")?;
    let q = query(q);
    let tag = parse_tag("tag", q.get("tag"))?;
    let tmp = state.images.store.tmp_path("upload");
    stage_body(body, &tmp, 0, "upload").await?;
    let st = state.clone();
    let t2 = tmp.clone();
    let r = blocking(move || {
        oci::import(&st.images.store, &t2, tag.as_ref(), &|_| {}).map_err(store_error)
    })
    .await;
    let _ = tokio::fs::remove_file(&tmp).await;
    let imgs = r?;
    Ok(json_status(
        StatusCode::CREATED,
        &ImageList {
            images: imgs.iter().map(view).collect(),
        },
    ))
}

/// A `Write` that sends chunks to an async body.
struct ChannelWriter(tokio::sync::mpsc::Sender<Result<Bytes, std::io::Error>>);

impl Write for ChannelWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .blocking_send(Ok(Bytes::copy_from_slice(buf)))
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::BrokenPipe, "client went away"))?;
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[utoipa::path(get, path = "/v1/images/export", tag = "images",
    params(("ref" = String, Query, description = "The image"),
        ("tag" = Option<String>, Query, description = "Name recorded in the archive (default: the caller's tags of the image)")),
    responses((status = 200, description = "OCI layout + docker save tar", content_type = "application/x-tar"),
        (status = 404, body = crate::error::ErrorEnvelope),
        (status = 413, description = "too_large: the image expands past images.max_expanded_size", body = crate::error::ErrorEnvelope)))]
pub async fn export(
    State(state): State<Arc<AppState>>,
    p: Principal,
    RawQuery(q): RawQuery,
) -> ApiResult<Response> {
    let q = query(q);
    let reference = q
        .get("ref")
        .cloned()
        .ok_or_else(|| ApiError::invalid("ref", "the image to export is required"))?;
    let tag = parse_tag("tag", q.get("tag"))?;
    let st = state.clone();
    // Found before the answer: an unknown image is 404, one that expands past the
    // operator's limit 413 (the archive is then never started).
    let (img, seen) = blocking(move || {
        let v = viewer(p.scope.as_deref());
        let img = st.images.resolve_for(v, &reference).map_err(store_error)?;
        let limit = st.images.limit(None);
        st.images
            .store
            .expanded_size(&img, Some(&limit))
            .map_err(store_error)?;
        let seen = st.images.store.tags_seen_by(v, &img).map_err(store_error)?;
        Ok((img, seen))
    })
    .await?;
    let names: Vec<ImageName> = match tag {
        Some(t) => vec![t],
        None => seen
            .iter()
            .filter_map(|t| ImageName::parse(t).ok())
            .collect(),
    };
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(16);
    let st = state.clone();
    tokio::task::spawn_blocking(move || {
        let w = std::io::BufWriter::with_capacity(256 << 10, ChannelWriter(tx.clone()));
        match oci::export(&st.images.store, &img, &names, w, &|_| {}) {
            Ok(mut w) => {
                let _ = w.flush();
            }
            Err(e) => {
                tracing::warn!("export: {e}");
                let _ = tx.blocking_send(Err(std::io::Error::other(e.to_string())));
            }
        }
    });
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    });
    Ok((
        [(header::CONTENT_TYPE, "application/x-tar")],
        Body::from_stream(stream),
    )
        .into_response())
}

#[utoipa::path(get, path = "/v1/images/diff", tag = "images",
    params(("a" = String, Query), ("b" = String, Query)),
    responses((status = 200, body = DiffView), (status = 404, body = crate::error::ErrorEnvelope),
        (status = 413, description = "too_large: the diff reads past images.max_expanded_size", body = crate::error::ErrorEnvelope)))]
pub async fn diff(
    State(state): State<Arc<AppState>>,
    p: Principal,
    RawQuery(q): RawQuery,
) -> ApiResult<Json<DiffView>> {
    let q = query(q);
    let (Some(a), Some(b)) = (q.get("a").cloned(), q.get("b").cloned()) else {
        return Err(ApiError::invalid("a", "give two images: ?a=...&b=..."));
    };
    let st = state.clone();
    let d: TreeDiff = blocking(move || {
        let v = viewer(p.scope.as_deref());
        let ia = st.images.resolve_for(v, &a).map_err(store_error)?;
        let ib = st.images.resolve_for(v, &b).map_err(store_error)?;
        let limit = st.images.limit(None);
        st.images
            .store
            .diff(&ia, &ib, Some(&limit))
            .map_err(store_error)
    })
    .await?;
    Ok(Json(DiffView {
        added: d.added,
        changed: d.changed,
        removed: d.removed,
    }))
}

#[utoipa::path(post, path = "/v1/sandboxes/{id}/snapshot", tag = "images",
    params(("id" = String, Path, description = "Sandbox id or name")),
    request_body(content = SnapshotBody, description = "Optional: a tag for the new image (in the caller's namespace)"),
    responses((status = 201, body = ImageView),
        (status = 409, description = "a sandbox of a rootfs directory, or stopping", body = crate::error::ErrorEnvelope),
        (status = 413, description = "too_large: the writable layer expands past the sandbox's disk limit", body = crate::error::ErrorEnvelope)))]
pub async fn snapshot(
    State(state): State<Arc<AppState>>,
    p: Principal,
    Path(id): Path<String>,
    body: Body,
) -> ApiResult<Response> {
    let bytes = read_limited(body, state.cfg.limits.max_request_body.bytes()).await?;
    let b: SnapshotBody = if bytes.iter().all(u8::is_ascii_whitespace) {
        SnapshotBody::default()
    } else {
        parse_json(&bytes)?
    };
    let tag = parse_tag("tag", b.tag.as_ref())?;
    shared_tag_is_socket_only(&p, tag.as_ref(), "naming a shared image by a snapshot")?;
    let h = live(&state, &p, &id)?;
    h.touch();
    let st = state.clone();
    let h2 = h.clone();
    let (mut v, took) = blocking(move || {
        let scope = p.scope.as_deref();
        let (host, hostname) = host_image_and_hostname(&st, &h2.id)?;
        let (img, took) = if host {
            st.images.snapshot_host(
                &h2.id,
                &*h2.inst,
                &h2.tenant,
                scope,
                tag.as_ref(),
                h2.disk_limit,
            )?
        } else {
            st.images.snapshot(
                &h2.id,
                &*h2.inst,
                &hostname,
                &h2.tenant,
                scope,
                tag.as_ref(),
                h2.disk_limit,
            )?
        };
        tracing::info!(sandbox_id = %h2.id, image = %img.id, frozen_ms = took.as_secs_f64() * 1e3, "snapshot");
        Ok((view_for(&st, viewer(scope), &img)?, took))
    })
    .await?;
    v.frozen_ms = Some(took.as_secs_f64() * 1e3);
    Ok(json_status(StatusCode::CREATED, &v))
}

/// Whether sandbox `id`'s spec is the built-in `host` image without a rootfs
/// directory (its writable layer is its root tmpfs, not a store image's upper),
/// and its host name.
fn host_image_and_hostname(state: &AppState, id: &str) -> ApiResult<(bool, String)> {
    let rec = state
        .store
        .get_sandbox(id)
        .map_err(|e| ApiError::internal(format!("read sandbox {id}: {e}")))?
        .ok_or_else(|| ApiError::not_found(format!("no sandbox {id}")))?;
    let spec = &rec.spec;
    let image = spec
        .get("image")
        .and_then(|i| i.as_str())
        .unwrap_or(sandlot_proto::spec::HOST_IMAGE);
    let hostname = match spec.get("hostname").and_then(|h| h.as_str()) {
        Some(h) => h.to_string(),
        None => sandlot_runtime::plan::sandbox_hostname(id, &Default::default()),
    };
    Ok((
        image == sandlot_proto::spec::HOST_IMAGE && spec.get("rootfs").is_none_or(|r| r.is_null()),
        hostname,
    ))
}

// ---- registries: pull and push (NDJSON progress streams) ----

/// Credentials for a registry (used for this request only, never stored or logged).
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RegistryAuthBody {
    pub username: String,
    pub password: String,
}

impl std::fmt::Debug for RegistryAuthBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RegistryAuthBody(<redacted>)")
    }
}

/// `POST /v1/images/pull` body.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PullBody {
    /// `HOST[:PORT]/PATH[:TAG]` or `HOST[:PORT]/PATH@sha256:...`.
    pub reference: String,
    /// Local name (default: the reference itself).
    #[serde(default)]
    pub tag: Option<String>,
    /// Registry credentials (default: the daemon's `images.auth_file`, else anonymous).
    #[serde(default)]
    pub auth: Option<RegistryAuthBody>,
}

/// `POST /v1/images/{name}/push` body.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PushBody {
    /// Where to: `HOST[:PORT]/PATH[:TAG]`.
    pub reference: String,
    #[serde(default)]
    pub auth: Option<RegistryAuthBody>,
}

/// One line of a pull, push or build progress stream (`application/x-ndjson`).
/// `type`: `manifest` (`digest`, `layers`), `layer` (`digest`, `status`: `start`
/// with `size`, `progress` with `done`, `done` with `cached`), `log` (`line`, a
/// build's output), `step` (a build step: `index`, `text`, `cached`), `done`
/// (`image` for pulls and builds, `digest` of the manifest for pushes), `error`
/// (`code`, `message`; the last line).
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ProgressLine {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(flatten)]
    #[schema(value_type = Object)]
    pub fields: serde_json::Map<String, serde_json::Value>,
}

pub(crate) fn registry_config(state: &AppState) -> sandlot_store::registry::RegistryConfig {
    let c = &state.cfg.images;
    sandlot_store::registry::RegistryConfig {
        insecure: c.insecure_registries.clone(),
        auth_file: c.auth_file.clone(),
        default_registry: c.default_registry.clone(),
        ca_file: c.ca_file.clone(),
    }
}

pub(crate) fn event_line(e: &sandlot_store::registry::Event) -> serde_json::Value {
    use sandlot_store::oci::Progress;
    use sandlot_store::registry::Event;
    match e {
        Event::Manifest { digest, layers } => {
            serde_json::json!({"type": "manifest", "digest": digest.to_string(), "layers": layers})
        }
        Event::Layer(Progress::Start { layer, size }) => {
            serde_json::json!({"type": "layer", "digest": layer.to_string(), "status": "start", "size": size})
        }
        Event::Layer(Progress::Advance { layer, done }) => {
            serde_json::json!({"type": "layer", "digest": layer.to_string(), "status": "progress", "done": done})
        }
        Event::Layer(Progress::Done { layer, cached }) => {
            serde_json::json!({"type": "layer", "digest": layer.to_string(), "status": "done", "cached": cached})
        }
    }
}

pub(crate) fn registry_error_line(e: &sandlot_store::registry::RegistryError) -> serde_json::Value {
    use sandlot_store::registry::RegistryError as R;
    let code = match e {
        R::BadReference { .. } => "invalid_reference",
        R::Unauthorized { .. } => "registry_unauthorized",
        R::Store(sandlot_store::StoreError::DigestMismatch { .. }) => "digest_mismatch",
        R::Manifest { .. } | R::NoPlatform { .. } => "bad_manifest",
        R::Status { status: 404, .. } => "registry_not_found",
        R::Transport { .. } | R::Status { .. } => "registry_unreachable",
        _ => "internal",
    };
    serde_json::json!({"type": "error", "code": code, "message": e.to_string()})
}

/// Runs `work` on the blocking pool, streaming the JSON lines it sends.
pub(crate) fn ndjson_stream(
    work: impl FnOnce(&dyn Fn(serde_json::Value)) + Send + 'static,
) -> Response {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<serde_json::Value>();
    tokio::task::spawn_blocking(move || {
        let send = |v: serde_json::Value| {
            let _ = tx.send(v);
        };
        work(&send);
    });
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|v| {
            let mut line = serde_json::to_vec(&v).unwrap_or_default();
            line.push(b'\n');
            (Ok::<_, std::io::Error>(Bytes::from(line)), rx)
        })
    });
    (
        [(header::CONTENT_TYPE, "application/x-ndjson")],
        Body::from_stream(stream),
    )
        .into_response()
}

fn creds(a: Option<RegistryAuthBody>) -> Option<sandlot_store::registry::Credentials> {
    a.map(|a| sandlot_store::registry::Credentials {
        username: a.username,
        password: a.password,
    })
}

#[utoipa::path(post, path = "/v1/images/pull", tag = "images",
    request_body = PullBody,
    responses((status = 200, description = "NDJSON progress; the last line is `done` (with `image`) or `error`", content_type = "application/x-ndjson", body = ProgressLine),
        (status = 400, description = "malformed reference or tag", body = crate::error::ErrorEnvelope)))]
pub async fn pull(
    State(state): State<Arc<AppState>>,
    p: Principal,
    body: Body,
) -> ApiResult<Response> {
    socket_only(&p, "pulling images")?;
    let bytes = read_limited(body, state.cfg.limits.max_request_body.bytes()).await?;
    let b: PullBody = parse_json(&bytes)?;
    let cfg = registry_config(&state);
    let reference =
        sandlot_store::registry::Reference::parse(&b.reference, cfg.default_registry.as_deref())
            .map_err(|e| ApiError::invalid("reference", e))?;
    let tag = parse_tag("tag", b.tag.as_ref())?;
    let creds = creds(b.auth);
    tracing::info!(reference = %reference, "pull");
    Ok(ndjson_stream(move |send| {
        let t0 = std::time::Instant::now();
        let r = sandlot_store::registry::pull(
            &state.images.store,
            &cfg,
            &reference,
            creds,
            tag.as_ref(),
            &|e| send(event_line(&e)),
        );
        match r {
            Ok(img) => {
                tracing::info!(reference = %reference, image = %img.id, secs = t0.elapsed().as_secs_f64(), "pulled");
                send(serde_json::json!({"type": "done", "image": view(&img)}))
            }
            Err(e) => {
                tracing::warn!(reference = %reference, "pull failed: {e}");
                send(registry_error_line(&e))
            }
        }
    }))
}

/// `POST /v1/images/{name}/push` (the only POST under an image reference).
pub async fn post_on_image(
    State(state): State<Arc<AppState>>,
    p: Principal,
    Path(rest): Path<String>,
    body: Body,
) -> ApiResult<Response> {
    let Some(name) = rest.strip_suffix("/push") else {
        return Err(ApiError::not_found(format!(
            "no route POST /v1/images/{rest} (images take POST .../push)"
        )));
    };
    push(state, p, name.to_string(), body).await
}

#[utoipa::path(post, path = "/v1/images/{reference}/push", tag = "images",
    params(("reference" = String, Path, description = "The local image: NAME[:TAG] or id")),
    request_body = PushBody,
    responses((status = 200, description = "NDJSON progress; the last line is `done` (with the manifest `digest`) or `error`", content_type = "application/x-ndjson", body = ProgressLine),
        (status = 400, body = crate::error::ErrorEnvelope), (status = 404, body = crate::error::ErrorEnvelope)))]
pub async fn push(
    state: Arc<AppState>,
    p: Principal,
    name: String,
    body: Body,
) -> ApiResult<Response> {
    socket_only(&p, "pushing images")?;
    let bytes = read_limited(body, state.cfg.limits.max_request_body.bytes()).await?;
    let b: PushBody = parse_json(&bytes)?;
    let cfg = registry_config(&state);
    let reference =
        sandlot_store::registry::Reference::parse(&b.reference, cfg.default_registry.as_deref())
            .map_err(|e| ApiError::invalid("reference", e))?;
    if reference.digest.is_some() {
        return Err(ApiError::invalid(
            "reference",
            "push to a tag, not a digest",
        ));
    }
    let st = state.clone();
    // The operator's names: the shared tags (a tenant's never).
    let img = blocking(move || st.images.store.resolve(&name).map_err(store_error)).await?;
    let creds = creds(b.auth);
    tracing::info!(reference = %reference, image = %img.id, "push");
    Ok(ndjson_stream(move |send| {
        let r = sandlot_store::registry::push(
            &state.images.store,
            &cfg,
            &img,
            &reference,
            creds,
            &|e| send(event_line(&e)),
        );
        match r {
            Ok(d) => send(
                serde_json::json!({"type": "done", "digest": d.to_string(), "reference": reference.to_string(), "image": img.id.to_string()}),
            ),
            Err(e) => {
                tracing::warn!(reference = %reference, "push failed: {e}");
                send(registry_error_line(&e))
            }
        }
    }))
}

// ---- builds ----

#[utoipa::path(post, path = "/v1/images/build", tag = "images",
    params(("file" = String, Query, description = "Path of the spec inside the context: `*.toml` is a Sandlot build spec, anything else the Dockerfile subset"),
        ("tag" = Option<String>, Query, description = "Name the result NAME[:TAG]"),
        ("network" = Option<bool>, Query, description = "Let run steps use the network (package helpers need it)")),
    request_body(content = Vec<u8>, description = "The build context as a tar (holding the spec)", content_type = "application/x-tar"),
    responses((status = 200, description = "NDJSON progress (`step`, `log`); the last line is `done` (with `image`) or `error`", content_type = "application/x-ndjson", body = ProgressLine),
        (status = 400, description = "malformed spec, unsupported instruction, bad context", body = crate::error::ErrorEnvelope)))]
pub async fn build(
    State(state): State<Arc<AppState>>,
    p: Principal,
    RawQuery(q): RawQuery,
    body: Body,
) -> ApiResult<Response> {
    let q = query(q);
    let file = q
        .get("file")
        .cloned()
        .unwrap_or_else(|| "Dockerfile".to_string());
    let tag = parse_tag("tag", q.get("tag"))?;
    shared_tag_is_socket_only(&p, tag.as_ref(), "naming a shared image by a build")?;
    let network = match q.get("network").map(String::as_str) {
        None | Some("false") | Some("0") => false,
        Some("true") | Some("1") => true,
        Some(o) => {
            return Err(ApiError::invalid(
                "network",
                format!("{o:?}: expected true or false"),
            ))
        }
    };
    // Builds in flight are capped per tenant (an operator token's count as its
    // default tenant's), the socket's only not: each stages its context on the
    // daemon's disk and runs sandboxes. The lease goes with the build's task.
    let lease = match p.is_socket_operator() {
        false => Some(state.builds.try_take(&p.tenant).map_err(|held| {
            ApiError::of(
                ErrorCode::QuotaExceeded,
                format!(
                    "tenant {} runs {held} builds already (images.max_builds_per_tenant = {})",
                    p.tenant,
                    state.builds.cap()
                ),
            )
        })?),
        true => None,
    };
    // Stage the context tar, extract it, read the spec: all before answering, so
    // a bad spec or context is a plain 400. The tar is no larger than what it may
    // expand to (`images.max_expanded_size`), nor than `limits.max_upload`.
    let tmp = state.images.store.tmp_path("context-upload");
    let expanded = state.cfg.images.max_expanded_size.bytes();
    let (limit, limit_name) = match state.cfg.limits.max_upload.bytes() {
        n if n > 0 && n <= expanded => (n, "limits.max_upload"),
        _ => (expanded, "images.max_expanded_size"),
    };
    crate::body::stage_within(body, &tmp, limit, limit_name, "context").await?;
    let ctx = state.images.store.tmp_path("context");
    let (t2, c2) = (tmp.clone(), ctx.clone());
    let limit = state.images.limit(None);
    let spec = blocking(move || {
        std::fs::create_dir(&c2).map_err(|e| ApiError::internal(format!("stage context: {e}")))?;
        crate::build::extract_context(&t2, &c2, &limit)?;
        crate::build::take_spec(&c2, &file, network)
    })
    .await;
    let _ = tokio::fs::remove_file(&tmp).await;
    // Build steps are sandboxes: the operator's network ceiling applies to them
    // as to any other (run steps with the network are `open`), but for the
    // socket's own builds.
    let spec = spec.and_then(|s| {
        let ceiling = state.cfg.network.ceiling;
        if !p.is_socket_operator() && s.network && ceiling < sandlot_proto::spec::NetworkMode::Open {
            return Err(ApiError::invalid(
                "network",
                format!(
                    "build steps with the network run in mode \"open\", above the operator's ceiling {:?}",
                    ceiling.as_str()
                ),
            ));
        }
        Ok(s)
    });
    let spec = match spec {
        Ok(s) => s,
        Err(e) => {
            let _ = tokio::fs::remove_dir_all(&ctx).await;
            return Err(e);
        }
    };
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<serde_json::Value>();
    let send: Arc<dyn Fn(serde_json::Value) + Send + Sync> = Arc::new(move |v| {
        let _ = tx.send(v);
    });
    let who = crate::build::Builder {
        tenant: p.tenant.clone(),
        owner: p.scope.clone(),
        fresh_from: None,
    };
    let viewer_scope = p.scope.clone();
    tokio::spawn(async move {
        let _lease = lease;
        let r = crate::build::run(state.clone(), who, spec, ctx.clone(), tag, send.clone()).await;
        let _ = tokio::fs::remove_dir_all(&ctx).await;
        // The image as the builder sees it (a tenant: its own names only).
        let r = r
            .and_then(|img| view_for(&state, crate::images::viewer(viewer_scope.as_deref()), &img));
        match r {
            Ok(v) => send(serde_json::json!({"type": "done", "image": v})),
            Err(e) => {
                tracing::warn!("build failed: {}", e.message);
                send(serde_json::json!({"type": "error", "code": e.code, "message": e.message}))
            }
        }
    });
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|v| {
            let mut line = serde_json::to_vec(&v).unwrap_or_default();
            line.push(b'\n');
            (Ok::<_, std::io::Error>(Bytes::from(line)), rx)
        })
    });
    Ok((
        [(header::CONTENT_TYPE, "application/x-ndjson")],
        Body::from_stream(stream),
    )
        .into_response())
}

/// Streams a request body into the file `tmp` (removed again on failure).
/// `limit` > 0 caps its size (`limits.max_upload`); `what` names it in errors
/// (`upload`, `context`).
async fn stage_body(body: Body, tmp: &std::path::Path, limit: u64, what: &str) -> ApiResult<()> {
    crate::body::stage_within(body, tmp, limit, "limits.max_upload", what).await
}
