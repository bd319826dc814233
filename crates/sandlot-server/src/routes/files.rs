//! Files of a sandbox over HTTP: streamed read and write (parents created),
//! stat, list, mkdir, remove, rename, watch, and tar download/upload of a
//! directory. The operations are `services::files`; this module parses the
//! queries and bodies and shapes the answers.

use std::collections::HashMap;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Extension, Path, RawQuery, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::Response;
use axum::Json;
use futures_util::StreamExt;
use sandlot_guest::client::{FileKind, FileStat, WatchEventKind};
use sandlot_proto::api::{
    DirEntry as ApiDirEntry, DirListing, FileInfo, MkdirBody, RenameBody, TarResult, WatchEvent,
    WriteResult,
};
use sandlot_proto::spec::{check_sandbox_path, normalize_sandbox_path};
use serde_json::Value;

use super::exec::parse_bool;
use super::stream::{channel_body, fallible_channel_body, line};
use super::{json_status, JsonBody, RequestId};
use crate::auth::Principal;
use crate::error::{ApiError, ApiResult, ErrorCode};
use crate::services::files::{ReadRange, SandboxFiles, UploadKind, WriteSpec};
use crate::state::AppState;
use crate::tarstream::{self, EntryKind, TarReader};
use crate::timefmt::rfc3339;
use sandlot_store::Budget;

/// How deep a directory's archive goes.
const TAR_DEPTH: u32 = 64;

/// Query parameters as a map; unknown names are refused.
fn query(q: Option<&str>, allowed: &[&str]) -> ApiResult<HashMap<String, String>> {
    let mut m = HashMap::new();
    for (k, v) in form_urlencoded::parse(q.unwrap_or_default().as_bytes()) {
        if !allowed.contains(&k.as_ref()) {
            return Err(ApiError::invalid(
                k.as_ref(),
                format!("unknown query parameter, expected {}", allowed.join(", ")),
            ));
        }
        m.insert(k.into_owned(), v.into_owned());
    }
    Ok(m)
}

fn sandbox_path(field: &str, p: Option<&String>) -> ApiResult<String> {
    let p = p.ok_or_else(|| ApiError::invalid(field, "required"))?;
    check_sandbox_path(field, p)
        .map_err(|e| ApiError::invalid(field, crate::sandbox::spec_problem(&e)))?;
    Ok(normalize_sandbox_path(p))
}

fn num(m: &HashMap<String, String>, k: &str) -> ApiResult<Option<u64>> {
    m.get(k)
        .map(|v| {
            v.parse::<u64>()
                .map_err(|_| ApiError::invalid(k, format!("{v:?} is not a number")))
        })
        .transpose()
}

fn flag(m: &HashMap<String, String>, k: &str) -> ApiResult<bool> {
    m.get(k)
        .map(|v| parse_bool(k, v))
        .transpose()
        .map(|b| b.unwrap_or(false))
}

/// Permission bits: a number, or an octal string (`"0755"`, `"755"`).
fn parse_mode(field: &str, v: &Value) -> ApiResult<u32> {
    let m = match v {
        Value::Number(n) => n.as_u64().and_then(|n| u32::try_from(n).ok()),
        Value::String(s) => u32::from_str_radix(s.trim_start_matches("0o"), 8).ok(),
        _ => None,
    };
    match m {
        Some(m) if m <= 0o7777 => Ok(m),
        _ => Err(ApiError::invalid(
            field,
            format!("{v} is not a mode (e.g. \"0644\")"),
        )),
    }
}

pub fn file_info(s: &FileStat) -> FileInfo {
    FileInfo {
        path: s.path.clone(),
        kind: match s.kind {
            FileKind::File => "file",
            FileKind::Dir => "dir",
            FileKind::Symlink => "symlink",
            FileKind::Other => "other",
        }
        .into(),
        size: s.size,
        mode: s.mode,
        uid: s.uid,
        gid: s.gid,
        mtime: rfc3339(s.mtime * 1000 + i64::from(s.mtime_nsec / 1_000_000)),
        symlink_target: s.symlink_target.clone(),
    }
}

#[utoipa::path(get, path = "/v1/sandboxes/{id}/files", tag = "files",
    params(("id" = String, Path), ("path" = String, Query), ("offset" = Option<u64>, Query), ("length" = Option<u64>, Query)),
    responses((status = 200, description = "The file's bytes, streamed", content_type = "application/octet-stream", body = Vec<u8>),
        (status = 404, body = crate::error::ErrorEnvelope), (status = 409, description = "a directory", body = crate::error::ErrorEnvelope),
        (status = 413, description = "too_large: more than the sandbox's disk limit would be read", body = crate::error::ErrorEnvelope)))]
pub async fn read(
    State(state): State<Arc<AppState>>,
    p: Principal,
    Path(id): Path<String>,
    RawQuery(q): RawQuery,
    Extension(rid): Extension<RequestId>,
) -> ApiResult<Response> {
    let m = query(q.as_deref(), &["path", "offset", "length"])?;
    let path = sandbox_path("path", m.get("path"))?;
    let offset = num(&m, "offset")?.unwrap_or(0);
    let length = num(&m, "length")?;
    let files = SandboxFiles::of_tenant(&state, &p, &id).await?;
    let dl = files
        .read(&path, ReadRange::From { offset, length })
        .await?;
    let (tx, mut resp) = fallible_channel_body("application/octet-stream");
    resp.headers_mut()
        .insert("x-sandlot-file-size", HeaderValue::from(dl.stat().size));
    tokio::spawn(async move {
        if let Some(err) = dl.relay(tx).await {
            tracing::warn!(request_id = rid.0, "file download cut: {err}");
        }
    });
    Ok(resp)
}

/// 413 `too_large` for a read past its limit.
fn too_large(e: sandlot_store::layer::LayerError) -> ApiError {
    crate::images::store_error(e.into())
}

#[utoipa::path(put, path = "/v1/sandboxes/{id}/files", tag = "files",
    params(("id" = String, Path), ("path" = String, Query), ("mode" = Option<String>, Query, description = "Octal, e.g. 0644"),
        ("append" = Option<bool>, Query)),
    request_body(content = Vec<u8>, content_type = "application/octet-stream"),
    responses((status = 201, body = WriteResult), (status = 413, body = crate::error::ErrorEnvelope), (status = 507, body = crate::error::ErrorEnvelope)))]
pub async fn write(
    State(state): State<Arc<AppState>>,
    p: Principal,
    Path(id): Path<String>,
    RawQuery(q): RawQuery,
    body: Body,
) -> ApiResult<Response> {
    let m = query(q.as_deref(), &["path", "mode", "append"])?;
    let path = sandbox_path("path", m.get("path"))?;
    let mode = m
        .get("mode")
        .map(|v| parse_mode("mode", &Value::String(v.clone())))
        .transpose()?;
    let append = flag(&m, "append")?;
    let files = SandboxFiles::of_tenant(&state, &p, &id).await?;
    let _guard = files.handle().active();
    let mut up = files
        .write(WriteSpec {
            mode,
            append,
            ..WriteSpec::new(&path)
        })
        .await?;
    let mut budget = files.upload_budget(UploadKind::Files);
    let mut body = body.into_data_stream();
    while let Some(chunk) = body.next().await {
        let chunk =
            chunk.map_err(|e| ApiError::bad_request(format!("reading the request body: {e}")))?;
        up.write(&mut budget, &chunk).await?;
    }
    let n = up.finish().await?;
    Ok(json_status(
        StatusCode::CREATED,
        &WriteResult { path, bytes: n },
    ))
}

#[utoipa::path(get, path = "/v1/sandboxes/{id}/files/stat", tag = "files",
    params(("id" = String, Path), ("path" = String, Query), ("follow" = Option<bool>, Query, description = "Follow a final symlink")),
    responses((status = 200, body = FileInfo), (status = 404, body = crate::error::ErrorEnvelope)))]
pub async fn stat(
    State(state): State<Arc<AppState>>,
    p: Principal,
    Path(id): Path<String>,
    RawQuery(q): RawQuery,
) -> ApiResult<Json<FileInfo>> {
    let m = query(q.as_deref(), &["path", "follow"])?;
    let path = sandbox_path("path", m.get("path"))?;
    let follow = flag(&m, "follow")?;
    let files = SandboxFiles::of_tenant(&state, &p, &id).await?;
    Ok(Json(file_info(&files.stat(&path, follow).await?)))
}

#[utoipa::path(get, path = "/v1/sandboxes/{id}/files/list", tag = "files",
    params(("id" = String, Path), ("path" = String, Query), ("depth" = Option<u32>, Query, description = "1 (default): entries only")),
    responses((status = 200, body = DirListing), (status = 404, body = crate::error::ErrorEnvelope)))]
pub async fn list(
    State(state): State<Arc<AppState>>,
    p: Principal,
    Path(id): Path<String>,
    RawQuery(q): RawQuery,
) -> ApiResult<Json<DirListing>> {
    let m = query(q.as_deref(), &["path", "depth"])?;
    let path = sandbox_path("path", m.get("path"))?;
    let depth = num(&m, "depth")?.unwrap_or(1);
    if depth == 0 || depth > 64 {
        return Err(ApiError::invalid("depth", "must be between 1 and 64"));
    }
    let files = SandboxFiles::of_tenant(&state, &p, &id).await?;
    let (entries, truncated) = files.list(&path, depth as u32).await?.collect().await?;
    let entries = entries
        .into_iter()
        .map(|e| ApiDirEntry {
            info: file_info(&e.stat),
            depth: e.depth,
            error: e.error,
        })
        .collect();
    Ok(Json(DirListing {
        path,
        entries,
        truncated,
    }))
}

#[utoipa::path(post, path = "/v1/sandboxes/{id}/files/mkdir", tag = "files",
    params(("id" = String, Path)), request_body = MkdirBody,
    responses((status = 204), (status = 409, body = crate::error::ErrorEnvelope)))]
pub async fn mkdir(
    State(state): State<Arc<AppState>>,
    p: Principal,
    Path(id): Path<String>,
    JsonBody(b): JsonBody<MkdirBody>,
) -> ApiResult<StatusCode> {
    let path = sandbox_path("path", Some(&b.path))?;
    let mode = b.mode.as_ref().map(|v| parse_mode("mode", v)).transpose()?;
    SandboxFiles::of_tenant(&state, &p, &id)
        .await?
        .mkdir(&path, b.parents, mode)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(delete, path = "/v1/sandboxes/{id}/files", tag = "files",
    params(("id" = String, Path), ("path" = String, Query), ("recursive" = Option<bool>, Query)),
    responses((status = 204), (status = 404, body = crate::error::ErrorEnvelope), (status = 409, body = crate::error::ErrorEnvelope)))]
pub async fn remove(
    State(state): State<Arc<AppState>>,
    p: Principal,
    Path(id): Path<String>,
    RawQuery(q): RawQuery,
) -> ApiResult<StatusCode> {
    let m = query(q.as_deref(), &["path", "recursive"])?;
    let path = sandbox_path("path", m.get("path"))?;
    if path == "/" {
        return Err(ApiError::invalid("path", "refusing to remove /"));
    }
    let recursive = flag(&m, "recursive")?;
    SandboxFiles::of_tenant(&state, &p, &id)
        .await?
        .remove(&path, recursive)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(post, path = "/v1/sandboxes/{id}/files/rename", tag = "files",
    params(("id" = String, Path)), request_body = RenameBody,
    responses((status = 204), (status = 404, body = crate::error::ErrorEnvelope), (status = 409, body = crate::error::ErrorEnvelope)))]
pub async fn rename(
    State(state): State<Arc<AppState>>,
    p: Principal,
    Path(id): Path<String>,
    JsonBody(b): JsonBody<RenameBody>,
) -> ApiResult<StatusCode> {
    let from = sandbox_path("from", Some(&b.from))?;
    let to = sandbox_path("to", Some(&b.to))?;
    SandboxFiles::of_tenant(&state, &p, &id)
        .await?
        .rename(&from, &to, b.overwrite)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(get, path = "/v1/sandboxes/{id}/files/watch", tag = "files",
    params(("id" = String, Path), ("path" = String, Query), ("recursive" = Option<bool>, Query)),
    responses((status = 200, description = "NDJSON stream of WatchEvent", content_type = "application/x-ndjson", body = WatchEvent),
        (status = 404, body = crate::error::ErrorEnvelope)))]
pub async fn watch(
    State(state): State<Arc<AppState>>,
    p: Principal,
    Path(id): Path<String>,
    RawQuery(q): RawQuery,
) -> ApiResult<Response> {
    let m = query(q.as_deref(), &["path", "recursive"])?;
    let path = sandbox_path("path", m.get("path"))?;
    let recursive = flag(&m, "recursive")?;
    let files = SandboxFiles::of_tenant(&state, &p, &id).await?;
    let mut w = files.watch(&path, recursive).await?;
    let (tx, resp) = channel_body("application/x-ndjson");
    tokio::spawn(async move {
        loop {
            // A client that goes away ends the watch at once (dropping `w` cancels
            // it in the agent), not at the next event: until then it held an
            // inotify instance and counted as activity against the idle timeout.
            let e = tokio::select! {
                e = w.next_event() => match e {
                    Ok(Some(e)) => e,
                    _ => return,
                },
                _ = tx.closed() => return,
            };
            let ev = WatchEvent {
                kind: match e.kind {
                    WatchEventKind::Create => "create",
                    WatchEventKind::Modify => "modify",
                    WatchEventKind::Delete => "delete",
                    WatchEventKind::Rename => "rename",
                    WatchEventKind::Overflow => "overflow",
                }
                .into(),
                path: e.path,
                from: e.from,
                dir: e.dir,
            };
            if tx.send(line(&ev)).await.is_err() {
                return;
            }
        }
    });
    Ok(resp)
}

#[utoipa::path(get, path = "/v1/sandboxes/{id}/files/tar", tag = "files",
    params(("id" = String, Path), ("path" = String, Query, description = "Directory to archive")),
    responses((status = 200, description = "A tar archive (ustar + PAX) of the directory, streamed", content_type = "application/x-tar", body = Vec<u8>),
        (status = 404, body = crate::error::ErrorEnvelope),
        (status = 413, description = "too_large: the archive would be larger than the sandbox's disk limit", body = crate::error::ErrorEnvelope)))]
pub async fn tar_download(
    State(state): State<Arc<AppState>>,
    p: Principal,
    Path(id): Path<String>,
    RawQuery(q): RawQuery,
    Extension(rid): Extension<RequestId>,
) -> ApiResult<Response> {
    let m = query(q.as_deref(), &["path"])?;
    let root = sandbox_path("path", m.get("path"))?;
    let files = SandboxFiles::of_tenant(&state, &p, &id).await?;
    let guard = files.handle().active();
    let st = files.stat(&root, true).await?;
    if st.kind != FileKind::Dir {
        return Err(ApiError::of(
            ErrorCode::NotADirectory,
            format!("{root} is not a directory"),
        ));
    }
    // What the archive expands to (every entry's headers, every file at its
    // apparent size, each hard link in full: the archive holds no links) is
    // bounded by the sandbox's disk limit. It is measured before the answer, so
    // that past the limit the answer is 413 and nothing is sent; what changes
    // meanwhile is counted again while streaming, and cuts the archive.
    let limit = files.read_limit();
    let what = format!("the archive of {root}");
    let prefix = if root == "/" {
        "/".to_string()
    } else {
        format!("{root}/")
    };
    {
        let mut budget = Budget::new(Some(&limit), &what);
        budget
            .charge(tarstream::trailer().len() as u64)
            .map_err(too_large)?;
        let mut listing = files.list(&root, TAR_DEPTH).await?;
        while let Some(e) = listing.next_entry().await? {
            if let Some((rel, kind)) = tar_entry(&prefix, &e.stat) {
                budget
                    .charge(entry_bytes(&rel, &kind, &e.stat))
                    .map_err(too_large)?;
            }
        }
    }
    let mut listing = files.list(&root, TAR_DEPTH).await?;
    let (tx, mut resp) = fallible_channel_body("application/x-tar");
    let name = root
        .rsplit('/')
        .find(|s| !s.is_empty())
        .unwrap_or("root")
        .to_string();
    if let Ok(v) = HeaderValue::from_str(&format!("attachment; filename=\"{name}.tar\"")) {
        resp.headers_mut().insert(header::CONTENT_DISPOSITION, v);
    }
    tokio::spawn(async move {
        let _guard = guard;
        let mut budget = Budget::new(Some(&limit), &what);
        let res: Result<(), String> = async {
            budget
                .charge(tarstream::trailer().len() as u64)
                .map_err(|e| e.to_string())?;
            while let Some(e) = listing.next_entry().await.map_err(|e| e.message)? {
                let Some((rel, kind)) = tar_entry(&prefix, &e.stat) else {
                    continue;
                };
                let s = &e.stat;
                budget
                    .charge(entry_bytes(&rel, &kind, s))
                    .map_err(|e| e.to_string())?;
                let mtime = s.mtime.max(0) as u64;
                let size = if kind == EntryKind::File { s.size } else { 0 };
                send(
                    &tx,
                    tarstream::header(&rel, &kind, size, s.mode & 0o7777, mtime).into(),
                )
                .await?;
                if kind != EntryKind::File {
                    continue;
                }
                // Exactly `size` bytes: a file that changed meanwhile is cut or
                // zero-padded so that the archive stays well-formed.
                let mut sent = 0u64;
                match files.read_exact(&s.path, size).await {
                    Ok(mut dl) => {
                        while let Some(c) = dl.chunk().await.map_err(|e| e.to_string())? {
                            sent += c.len() as u64;
                            send(&tx, c).await?;
                        }
                    }
                    Err(err) => tracing::warn!(
                        request_id = rid.0,
                        "tar: {}: {}; zero-filled",
                        s.path,
                        err.message
                    ),
                }
                while sent < size {
                    let n = (size - sent).min(64 * 1024);
                    send(&tx, bytes::Bytes::from(vec![0u8; n as usize])).await?;
                    sent += n;
                }
                send(&tx, bytes::Bytes::from(vec![0u8; tarstream::padding(size)])).await?;
            }
            send(&tx, bytes::Bytes::copy_from_slice(&tarstream::trailer())).await
        }
        .await;
        if let Err(e) = res {
            tracing::warn!(request_id = rid.0, "tar download ended early: {e}");
            let _ = tx.send(Err(std::io::Error::other(e))).await;
        }
    });
    Ok(resp)
}

/// The archive path (relative to `prefix`) and kind of a listed entry, or `None`
/// for what an archive leaves out (the root itself, sockets, devices).
fn tar_entry(prefix: &str, s: &FileStat) -> Option<(String, EntryKind)> {
    let rel = match s.path.strip_prefix(prefix) {
        Some(r) if !r.is_empty() => r.to_string(),
        _ => return None,
    };
    let kind = match s.kind {
        FileKind::Dir => EntryKind::Dir,
        FileKind::File => EntryKind::File,
        FileKind::Symlink => EntryKind::Symlink(s.symlink_target.clone().unwrap_or_default()),
        FileKind::Other => return None,
    };
    Some((rel, kind))
}

/// The bytes one entry takes in the archive: its header blocks and its data.
fn entry_bytes(rel: &str, kind: &EntryKind, s: &FileStat) -> u64 {
    let size = if *kind == EntryKind::File { s.size } else { 0 };
    tarstream::header(rel, kind, size, 0, 0).len() as u64
        + size.saturating_add(tarstream::padding(size) as u64)
}

async fn send(
    tx: &tokio::sync::mpsc::Sender<Result<bytes::Bytes, std::io::Error>>,
    b: bytes::Bytes,
) -> Result<(), String> {
    if b.is_empty() {
        return Ok(());
    }
    tx.send(Ok(b))
        .await
        .map_err(|_| "the client went away".to_string())
}

#[utoipa::path(put, path = "/v1/sandboxes/{id}/files/tar", tag = "files",
    params(("id" = String, Path), ("path" = String, Query, description = "Directory to extract into (created)")),
    request_body(content = Vec<u8>, content_type = "application/x-tar"),
    responses((status = 201, body = TarResult), (status = 400, body = crate::error::ErrorEnvelope), (status = 413, body = crate::error::ErrorEnvelope)))]
pub async fn tar_upload(
    State(state): State<Arc<AppState>>,
    p: Principal,
    Path(id): Path<String>,
    RawQuery(q): RawQuery,
    body: Body,
) -> ApiResult<Response> {
    let m = query(q.as_deref(), &["path"])?;
    let root = sandbox_path("path", m.get("path"))?;
    let files = SandboxFiles::of_tenant(&state, &p, &id).await?;
    let _guard = files.handle().active();
    files.mkdir(&root, true, None).await?;
    let mut r = TarReader::new(body.into_data_stream());
    let mut res = TarResult {
        path: root.clone(),
        files: 0,
        dirs: 0,
        bytes: 0,
        skipped: Vec::new(),
    };
    let mut budget = files.upload_budget(UploadKind::Archive);
    let mut skipped = Skipped::default();
    loop {
        let e = match r.next_entry().await {
            Ok(Some(e)) => e,
            Ok(None) => break,
            Err(e) => return Err(ApiError::invalid("body", e)),
        };
        let Some(rel) = e.path else { continue };
        let target = if root == "/" {
            format!("/{rel}")
        } else {
            format!("{root}/{rel}")
        };
        match e.kind {
            EntryKind::Dir => {
                files.mkdir(&target, true, Some(e.mode)).await?;
                res.dirs += 1;
            }
            EntryKind::File => {
                let mut up = files
                    .write(WriteSpec {
                        mode: Some(e.mode),
                        ..WriteSpec::new(&target)
                    })
                    .await?;
                loop {
                    match r.next_data().await {
                        Ok(Some(c)) => {
                            res.bytes += c.len() as u64;
                            up.write(&mut budget, &c).await?;
                        }
                        Ok(None) => break,
                        Err(err) => return Err(ApiError::invalid("body", err)),
                    }
                }
                up.finish().await?;
                res.files += 1;
            }
            EntryKind::Symlink(t) => skipped.note(|| {
                format!(
                    "{}: symbolic link to {} (not supported)",
                    shortened(&rel),
                    shortened(&t)
                )
            }),
            EntryKind::Other(c) => {
                skipped.note(|| format!("{}: entry type {c:?} (not supported)", shortened(&rel)))
            }
        }
        files.handle().touch();
    }
    res.skipped = skipped.into_lines();
    Ok(json_status(StatusCode::CREATED, &res))
}

/// The entries of a tar upload that were not extracted, as the answer lists
/// them: the first [`SKIPPED_LISTED`], then how many more (an archive of
/// endless links would otherwise grow the daemon's memory with every header).
#[derive(Default)]
pub(super) struct Skipped {
    lines: Vec<String>,
    more: u64,
}

/// How many skipped entries an answer names one by one.
const SKIPPED_LISTED: usize = 100;

impl Skipped {
    pub(super) fn note(&mut self, line: impl FnOnce() -> String) {
        if self.lines.len() < SKIPPED_LISTED {
            self.lines.push(line());
        } else {
            self.more += 1;
        }
    }

    pub(super) fn into_lines(mut self) -> Vec<String> {
        if self.more > 0 {
            self.lines
                .push(format!("... and {} more entries not extracted", self.more));
        }
        self.lines
    }
}

/// A name from an archive as a skipped line shows it: at most 256 bytes (a tar
/// header may carry a name of a megabyte).
pub(super) fn shortened(s: &str) -> std::borrow::Cow<'_, str> {
    const MAX: usize = 256;
    if s.len() <= MAX {
        return s.into();
    }
    let mut end = MAX;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &s[..end]).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tar_upload_lists_at_most_a_hundred_skipped_entries_and_counts_the_rest() {
        let mut s = Skipped::default();
        for i in 0..100_000 {
            s.note(|| format!("l{i}: symbolic link"));
        }
        let lines = s.into_lines();
        assert_eq!(lines.len(), SKIPPED_LISTED + 1);
        assert_eq!(lines[0], "l0: symbolic link");
        assert_eq!(
            lines[SKIPPED_LISTED],
            "... and 99900 more entries not extracted"
        );
        let mut few = Skipped::default();
        few.note(|| "a".into());
        assert_eq!(few.into_lines(), ["a"]);
    }

    #[test]
    fn skipped_names_are_cut_on_a_character_boundary() {
        assert_eq!(shortened("short"), "short");
        let long = "é".repeat(1000);
        let s = shortened(&long);
        assert!(s.len() <= 256 + 3 && s.ends_with("..."), "{}", s.len());
        assert!(s.trim_end_matches("...").chars().all(|c| c == 'é'));
    }
}
