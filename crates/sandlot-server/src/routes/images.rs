//! `/v1/images`: list, inspect, remove, prune, import (an OCI layout or `docker
//! save` tar as the body), export (the same format), diff; and
//! `POST /v1/sandboxes/{id}/snapshot`. Changing the image set (import, remove,
//! prune) is the operator's (Unix socket); tenants list, inspect, export, diff
//! and snapshot their sandboxes.

use std::collections::HashMap;
use std::io::Write;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, RawQuery, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use bytes::Bytes;
use futures_util::StreamExt;
use sandlot_store::{oci, ImageInfo, ImageName, PruneReport, TreeDiff};
use serde::{Deserialize, Serialize};

use super::{json_status, live, parse_json, read_limited};
use crate::auth::Principal;
use crate::error::{ApiError, ApiResult};
use crate::images::store_error;
use crate::state::AppState;

/// An image as the API shows it.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ImageView {
    /// `sha256:...` of the OCI config.
    pub id: String,
    pub tags: Vec<String>,
    /// Bottom first.
    pub layers: Vec<LayerView>,
    pub env: Vec<String>,
    pub workdir: Option<String>,
    pub user: Option<String>,
    pub entrypoint: Vec<String>,
    pub cmd: Vec<String>,
    /// The image a snapshot or build step started from.
    pub parent: Option<String>,
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

pub fn view(i: &ImageInfo) -> ImageView {
    ImageView {
        id: i.id.to_string(),
        tags: i.tags.clone(),
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

fn operator_only(p: &Principal, what: &str) -> ApiResult<()> {
    if p.scope.is_some() {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            format!("{what} is for the operator (the daemon's Unix socket)"),
        ));
    }
    Ok(())
}

fn parse_tag(field: &str, t: Option<&String>) -> ApiResult<Option<ImageName>> {
    t.map(|t| ImageName::parse(t).map_err(|e| ApiError::invalid(field, e)))
        .transpose()
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> ApiResult<T> + Send + 'static,
) -> ApiResult<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(ApiError::internal)?
}

#[utoipa::path(get, path = "/v1/images", tag = "images",
    responses((status = 200, body = ImageList)))]
pub async fn list(State(state): State<Arc<AppState>>, _p: Principal) -> ApiResult<Json<ImageList>> {
    let st = state.clone();
    let imgs = blocking(move || st.images.store.list().map_err(store_error)).await?;
    Ok(Json(ImageList {
        images: imgs.iter().map(view).collect(),
    }))
}

#[utoipa::path(get, path = "/v1/images/{reference}", tag = "images",
    params(("reference" = String, Path, description = "NAME[:TAG], sha256:ID or an id prefix (12+ hex digits)")),
    responses((status = 200, body = ImageView), (status = 404, body = crate::error::ErrorEnvelope)))]
pub async fn inspect(
    State(state): State<Arc<AppState>>,
    _p: Principal,
    Path(reference): Path<String>,
) -> ApiResult<Json<ImageView>> {
    let st = state.clone();
    let img = blocking(move || st.images.store.resolve(&reference).map_err(store_error)).await?;
    Ok(Json(view(&img)))
}

#[utoipa::path(delete, path = "/v1/images/{reference}", tag = "images",
    params(("reference" = String, Path, description = "A name removes that tag (and the image with its last tag); an id removes the image")),
    responses((status = 200, body = ImageView), (status = 404, body = crate::error::ErrorEnvelope),
        (status = 409, description = "a live sandbox uses the image", body = crate::error::ErrorEnvelope)))]
pub async fn remove(
    State(state): State<Arc<AppState>>,
    p: Principal,
    Path(reference): Path<String>,
) -> ApiResult<Json<ImageView>> {
    operator_only(&p, "removing images")?;
    let st = state.clone();
    let img = blocking(move || st.images.store.remove(&reference).map_err(store_error)).await?;
    Ok(Json(view(&img)))
}

#[utoipa::path(post, path = "/v1/images/prune", tag = "images",
    responses((status = 200, body = PruneView)))]
pub async fn prune(State(state): State<Arc<AppState>>, p: Principal) -> ApiResult<Json<PruneView>> {
    operator_only(&p, "pruning images")?;
    let st = state.clone();
    let r: PruneReport = blocking(move || st.images.store.prune().map_err(store_error)).await?;
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
    operator_only(&p, "importing images")?;
    let q = query(q);
    let tag = parse_tag("tag", q.get("tag"))?;
    let tmp = state.images.store.tmp_path("upload");
    let mut f = tokio::fs::File::create(&tmp)
        .await
        .map_err(|e| ApiError::internal(format!("stage upload: {e}")))?;
    let mut stream = body.into_data_stream();
    let mut failed = None;
    while let Some(chunk) = stream.next().await {
        match chunk {
            Ok(c) => {
                if let Err(e) = tokio::io::AsyncWriteExt::write_all(&mut f, &c).await {
                    failed = Some(ApiError::internal(format!("stage upload: {e}")));
                    break;
                }
            }
            Err(e) => {
                failed = Some(ApiError::bad_request(format!("reading the upload: {e}")));
                break;
            }
        }
    }
    drop(f);
    if let Some(e) = failed {
        let _ = tokio::fs::remove_file(&tmp).await;
        return Err(e);
    }
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
        ("tag" = Option<String>, Query, description = "Name recorded in the archive (default: the image's tags)")),
    responses((status = 200, description = "OCI layout + docker save tar", content_type = "application/x-tar"),
        (status = 404, body = crate::error::ErrorEnvelope)))]
pub async fn export(
    State(state): State<Arc<AppState>>,
    _p: Principal,
    RawQuery(q): RawQuery,
) -> ApiResult<Response> {
    let q = query(q);
    let reference = q
        .get("ref")
        .cloned()
        .ok_or_else(|| ApiError::invalid("ref", "the image to export is required"))?;
    let tag = parse_tag("tag", q.get("tag"))?;
    let st = state.clone();
    let img = blocking(move || st.images.store.resolve(&reference).map_err(store_error)).await?;
    let names: Vec<ImageName> = match tag {
        Some(t) => vec![t],
        None => img
            .tags
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
    responses((status = 200, body = DiffView), (status = 404, body = crate::error::ErrorEnvelope)))]
pub async fn diff(
    State(state): State<Arc<AppState>>,
    _p: Principal,
    RawQuery(q): RawQuery,
) -> ApiResult<Json<DiffView>> {
    let q = query(q);
    let (Some(a), Some(b)) = (q.get("a").cloned(), q.get("b").cloned()) else {
        return Err(ApiError::invalid("a", "give two images: ?a=...&b=..."));
    };
    let st = state.clone();
    let d: TreeDiff = blocking(move || {
        let s = &st.images.store;
        let ia = s.resolve(&a).map_err(store_error)?;
        let ib = s.resolve(&b).map_err(store_error)?;
        s.diff(&ia, &ib).map_err(store_error)
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
    request_body(content = SnapshotBody, description = "Optional: a tag for the new image"),
    responses((status = 201, body = ImageView),
        (status = 409, description = "not created from a store image, or stopping", body = crate::error::ErrorEnvelope)))]
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
    let h = live(&state, &p, &id)?;
    h.touch();
    let st = state.clone();
    let h2 = h.clone();
    let (img, took) =
        blocking(move || st.images.snapshot(&h2.id, &h2.inst.cgroup, tag.as_ref())).await?;
    tracing::info!(sandbox_id = %h.id, image = %img.id, frozen_ms = took.as_secs_f64() * 1e3, "snapshot");
    let mut v = view(&img);
    v.frozen_ms = Some(took.as_secs_f64() * 1e3);
    Ok(json_status(StatusCode::CREATED, &v))
}
