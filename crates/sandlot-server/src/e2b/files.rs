//! envd's `filesystem.Filesystem` service, its polled watchers, and the plain
//! HTTP `GET`/`POST /files` transfers, over the daemon's file service
//! (`services::files`: streamed both ways, parents created, as the user the
//! request names). This module parses envd's requests and shapes its answers.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::extract::{RawQuery, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::StreamExt;
use sandlot_guest::client::{FileKind, FileStat, WatchEvent, WatchEventKind};
use serde::Deserialize;
use serde_json::{json, Value};

use super::connect::{self, Code, ConnectError};
use super::envd::{access, request_message, Ctx};
use super::multipart;
use super::E2b;
use crate::error::ApiError;
use crate::services::files::{
    FileWatch, ReadRange, SandboxFiles, UploadBudget, UploadKind, WriteSpec,
};
use crate::timefmt::rfc3339;

/// Events a polled watcher keeps between polls (older ones are dropped).
const MAX_PENDING_EVENTS: usize = 10_000;
/// Bytes of events (as JSON) a polled watcher keeps between polls (older ones are
/// dropped): a sandbox renaming long names in a loop fills the daemon's memory
/// no further.
const MAX_PENDING_BYTES: usize = 1 << 20;
/// Files (parts) of one multipart upload: each is opened in the sandbox and
/// listed in the answer, empty or not.
const MAX_UPLOAD_PARTS: usize = 10_000;
/// Polled watchers one sandbox may have at once.
pub const MAX_WATCHERS_PER_SANDBOX: usize = 16;

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct FsRequest {
    path: String,
    depth: Option<u32>,
    source: String,
    destination: String,
    recursive: bool,
    #[serde(alias = "include_entry")]
    include_entry: bool,
    #[serde(alias = "allow_network_mounts")]
    allow_network_mounts: bool,
    #[serde(alias = "watcher_id")]
    watcher_id: String,
}

/// The files of the request's sandbox, as its user.
fn files(ctx: &Ctx) -> SandboxFiles {
    SandboxFiles::of_handle(ctx.e2b.app.clone(), ctx.h.clone(), ctx.user.clone())
}

/// A user id as envd shows owners: the names Sandlot's images define, else the number.
fn user_name(uid: u32) -> String {
    match uid {
        0 => "root".into(),
        1000 => "user".into(),
        65534 => "nobody".into(),
        n => n.to_string(),
    }
}

fn group_name(gid: u32) -> String {
    match gid {
        0 => "root".into(),
        1000 => "user".into(),
        65534 => "nogroup".into(),
        n => n.to_string(),
    }
}

/// Go's `FileMode.String()` of the entry ("drwxr-xr-x", "-rw-r--r--", "Lrwxrwxrwx").
fn permissions(kind: FileKind, mode: u32) -> String {
    let mut s = String::with_capacity(10);
    s.push(match kind {
        FileKind::Dir => 'd',
        FileKind::Symlink => 'L',
        _ => '-',
    });
    for (i, c) in "rwxrwxrwx".chars().enumerate() {
        s.push(if mode & (1 << (8 - i)) != 0 { c } else { '-' });
    }
    s
}

fn base_name(path: &str) -> String {
    match path.trim_end_matches('/').rsplit('/').next() {
        Some("") | None => "/".into(),
        Some(n) => n.to_string(),
    }
}

/// The extended attribute namespace of E2B's file metadata: key `k` is
/// `user.e2b.k`.
const METADATA_XATTR_PREFIX: &str = "user.e2b.";
const METADATA_HEADER_PREFIX: &str = "x-metadata-";

/// An upload's file metadata (`X-Metadata-KEY: VALUE` headers; keys lowercased,
/// HTTP token characters; values printable ASCII) as the extended attributes the
/// agent sets on the new file.
fn metadata_xattrs(headers: &HeaderMap) -> Result<BTreeMap<String, String>, String> {
    use sandlot_proto::guest::{MAX_XATTRS, MAX_XATTR_VALUE};
    let mut out = BTreeMap::new();
    for (k, v) in headers {
        let Some(key) = k.as_str().strip_prefix(METADATA_HEADER_PREFIX) else {
            continue;
        };
        if key.is_empty() || key.len() > 200 {
            return Err(format!("file metadata key {key:?}: 1 to 200 characters"));
        }
        let value = v
            .to_str()
            .ok()
            .filter(|s| s.bytes().all(|b| (0x20..0x7f).contains(&b)))
            .ok_or_else(|| format!("file metadata {key:?}: the value must be printable ASCII"))?;
        if value.len() > MAX_XATTR_VALUE {
            return Err(format!(
                "file metadata {key:?}: the value is longer than {MAX_XATTR_VALUE} bytes"
            ));
        }
        out.insert(format!("{METADATA_XATTR_PREFIX}{key}"), value.to_string());
    }
    if out.len() > MAX_XATTRS {
        return Err(format!("at most {MAX_XATTRS} file metadata keys"));
    }
    Ok(out)
}

/// `EntryInfo` of a stat (proto3 JSON: `size` is an int64, so a string).
pub fn entry_info(st: &FileStat) -> Value {
    let kind = match st.kind {
        FileKind::File => "FILE_TYPE_FILE",
        FileKind::Dir => "FILE_TYPE_DIRECTORY",
        FileKind::Symlink => "FILE_TYPE_SYMLINK",
        FileKind::Other => "FILE_TYPE_UNSPECIFIED",
    };
    let ms = st.mtime * 1000 + i64::from(st.mtime_nsec / 1_000_000);
    let mut v = json!({
        "name": base_name(&st.path),
        "type": kind,
        "path": st.path,
        "size": st.size.to_string(),
        "mode": st.mode & 0o777,
        "permissions": permissions(st.kind, st.mode),
        "owner": user_name(st.uid),
        "group": group_name(st.gid),
        "modifiedTime": rfc3339(ms),
    });
    if st.kind == FileKind::Symlink {
        v["isSymlink"] = json!(true);
    }
    if let Some(t) = &st.symlink_target {
        v["symlinkTarget"] = json!(t);
    }
    let metadata: serde_json::Map<String, Value> = st
        .xattrs
        .iter()
        .filter_map(|(k, val)| {
            let key = k.strip_prefix(METADATA_XATTR_PREFIX)?;
            (!key.is_empty()).then(|| (key.to_string(), json!(val)))
        })
        .collect();
    if !metadata.is_empty() {
        v["metadata"] = Value::Object(metadata);
    }
    v
}

/// Whether a path is the agent's temporary file of an upload in progress
/// (`.NAME.sandlot-PID-N.tmp`, renamed over NAME when complete).
fn is_upload_temp(path: &str) -> bool {
    let name = base_name(path);
    let Some(rest) = name.strip_prefix('.').and_then(|n| n.strip_suffix(".tmp")) else {
        return false;
    };
    let Some((_, tail)) = rest.rsplit_once(".sandlot-") else {
        return false;
    };
    let mut it = tail.split('-');
    matches!((it.next(), it.next(), it.next()), (Some(a), Some(b), None)
        if !a.is_empty() && !b.is_empty() && a.bytes().chain(b.bytes()).all(|c| c.is_ascii_digit()))
}

/// The `FilesystemEvent`s of a watch event, named relative to the watched
/// directory; a rename is envd's RENAME of the old name and CREATE of the new.
/// Uploads (written to a hidden temporary file, then renamed into place) show
/// as envd's direct write would: CREATE, CHMOD (the owner is set) and WRITE of
/// the file.
pub fn fs_events(root: &str, e: &WatchEvent) -> Vec<Value> {
    let rel = |p: &str| {
        let r = p
            .strip_prefix(root)
            .map(|r| r.trim_start_matches('/'))
            .unwrap_or(p);
        if r.is_empty() {
            base_name(p)
        } else {
            r.to_string()
        }
    };
    let ev = |name: String, t: &str| json!({"name": name, "type": t});
    let Some(path) = e.path.as_deref() else {
        return Vec::new();
    };
    if e.kind == WatchEventKind::Rename && e.from.as_deref().is_some_and(is_upload_temp) {
        return vec![
            ev(rel(path), "EVENT_TYPE_CREATE"),
            ev(rel(path), "EVENT_TYPE_CHMOD"),
            ev(rel(path), "EVENT_TYPE_WRITE"),
        ];
    }
    if is_upload_temp(path) {
        return Vec::new();
    }
    match e.kind {
        WatchEventKind::Create => vec![ev(rel(path), "EVENT_TYPE_CREATE")],
        WatchEventKind::Modify => vec![ev(rel(path), "EVENT_TYPE_WRITE")],
        WatchEventKind::Delete => vec![ev(rel(path), "EVENT_TYPE_REMOVE")],
        WatchEventKind::Rename => {
            let mut v = Vec::new();
            if let Some(from) = e.from.as_deref() {
                v.push(ev(rel(from), "EVENT_TYPE_RENAME"));
            }
            v.push(ev(rel(path), "EVENT_TYPE_CREATE"));
            v
        }
        WatchEventKind::Overflow => Vec::new(),
    }
}

/// A symbolic link as envd's `Stat` shows it: the type of what it points to
/// (`isSymlink` stays set) and `symlinkTarget` as an absolute path. A link whose
/// target is missing stays a symlink.
async fn link_target(ctx: &Ctx, path: &str, st: &FileStat, entry: &mut Value) {
    let followed = files(ctx).stat(path, true).await;
    let Ok(t) = followed else {
        return;
    };
    entry["type"] = entry_info(&t)["type"].clone();
    if let Some(target) = &st.symlink_target {
        let parent = path.rsplit_once('/').map(|(d, _)| d).unwrap_or("");
        let joined = if target.starts_with('/') {
            target.clone()
        } else {
            format!("{parent}/{target}")
        };
        if let Ok(abs) = super::resolve_path(&joined, "root") {
            entry["symlinkTarget"] = json!(abs);
        }
    }
}

async fn stat(ctx: &Ctx, path: &str) -> Result<FileStat, ConnectError> {
    Ok(files(ctx).stat(path, false).await?)
}

/// Unary methods and the watch stream of `filesystem.Filesystem`.
pub async fn call(
    ctx: Ctx,
    method: &str,
    headers: &HeaderMap,
    body: Body,
) -> Result<Response, ConnectError> {
    let streaming = method == "WatchDir";
    let msg = request_message(&ctx, body, streaming).await?;
    let r: FsRequest = connect::parse_message(&msg)?;
    let ok = |v: Value| Ok(connect::unary_ok(&v));
    match method {
        "Stat" => {
            let p = ctx.path(&r.path)?;
            let st = stat(&ctx, &p).await?;
            let mut entry = entry_info(&st);
            if st.kind == FileKind::Symlink {
                link_target(&ctx, &p, &st, &mut entry).await;
            }
            ok(json!({ "entry": entry }))
        }
        "MakeDir" => {
            let p = ctx.path(&r.path)?;
            match stat(&ctx, &p).await {
                Ok(st) => {
                    return Err(ConnectError::new(
                        Code::AlreadyExists,
                        format!(
                            "{p} already exists ({})",
                            if st.kind == FileKind::Dir {
                                "a directory"
                            } else {
                                "not a directory"
                            }
                        ),
                    ))
                }
                Err(e) if e.code == Code::NotFound => {}
                Err(e) => return Err(e),
            }
            files(&ctx).mkdir(&p, true, None).await?;
            ok(json!({"entry": entry_info(&stat(&ctx, &p).await?)}))
        }
        "Move" => {
            let from = ctx.path(&r.source)?;
            let to = ctx.path(&r.destination)?;
            // envd creates the destination's parent directories.
            let parent = to.rsplit_once('/').map(|(d, _)| d).unwrap_or("");
            if !parent.is_empty() {
                match files(&ctx)
                    .mkdir(parent, true, None)
                    .await
                    .map_err(ConnectError::from)
                {
                    Ok(()) => {}
                    Err(e) if e.code == Code::AlreadyExists => {}
                    Err(e) => return Err(e),
                }
            }
            files(&ctx).rename(&from, &to, true).await?;
            ok(json!({"entry": entry_info(&stat(&ctx, &to).await?)}))
        }
        "Remove" => {
            let p = ctx.path(&r.path)?;
            let r = files(&ctx)
                .remove(&p, true)
                .await
                .map_err(ConnectError::from);
            match r {
                // Like envd (`os.RemoveAll`), removing what is not there succeeds.
                Err(e) if e.code != Code::NotFound => Err(e),
                _ => ok(json!({})),
            }
        }
        "ListDir" => {
            let p = ctx.path(&r.path)?;
            let depth = r.depth.unwrap_or(1).max(1);
            let listing = files(&ctx).list(&p, depth).await?;
            if listing.root().kind != FileKind::Dir {
                return Err(ConnectError::invalid(format!("{p} is not a directory")));
            }
            let (entries, _truncated) = listing.collect().await?;
            let entries: Vec<Value> = entries.iter().map(|e| entry_info(&e.stat)).collect();
            ok(json!({ "entries": entries }))
        }
        "WatchDir" => watch_stream(ctx, r, headers).await,
        "CreateWatcher" => {
            let p = ctx.path(&r.path)?;
            let id = ctx
                .e2b
                .watchers
                .create(&ctx, &p, r.recursive, r.include_entry)
                .await?;
            ok(json!({ "watcherId": id }))
        }
        "GetWatcherEvents" => {
            let events = ctx.e2b.watchers.drain(&ctx.h.id, &r.watcher_id).await?;
            ok(json!({ "events": events }))
        }
        "RemoveWatcher" => {
            ctx.e2b.watchers.remove(&ctx.h.id, &r.watcher_id)?;
            ok(json!({}))
        }
        other => Err(ConnectError::new(
            Code::Unimplemented,
            format!("filesystem.Filesystem/{other} is not a method of envd"),
        )),
    }
}

/// Adds `entry` (the `EntryInfo` of the file as it is now) to events of files
/// that still exist (`include_entry`); a file gone by then has none.
async fn with_entries(files: &SandboxFiles, root: &str, mut events: Vec<Value>) -> Vec<Value> {
    for ev in &mut events {
        if ev["type"] == "EVENT_TYPE_REMOVE" || ev["type"] == "EVENT_TYPE_RENAME" {
            continue;
        }
        let Some(name) = ev["name"].as_str() else {
            continue;
        };
        let path = format!("{}/{name}", root.trim_end_matches('/'));
        if let Ok(st) = files.stat(&path, false).await {
            ev["entry"] = entry_info(&st);
        }
    }
    events
}

async fn open_watch(ctx: &Ctx, path: &str, recursive: bool) -> Result<FileWatch, ConnectError> {
    let st = stat(ctx, path).await?;
    if st.kind != FileKind::Dir {
        return Err(ConnectError::invalid(format!("{path} is not a directory")));
    }
    Ok(files(ctx).watch(path, recursive).await?)
}

async fn watch_stream(
    ctx: Ctx,
    r: FsRequest,
    headers: &HeaderMap,
) -> Result<Response, ConnectError> {
    let p = ctx.path(&r.path)?;
    let mut w = open_watch(&ctx, &p, r.recursive).await?;
    let include_entry = r.include_entry;
    let fs = files(&ctx);
    let (tx, resp) = connect::stream_response();
    let period =
        connect::keepalive_interval(headers).unwrap_or(std::time::Duration::from_secs(3600));
    let stop = ctx.e2b.stopping();
    tokio::spawn(async move {
        tokio::pin!(stop);
        if !tx.send(&json!({"start": {}})).await {
            return;
        }
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        loop {
            tokio::select! {
                e = w.next_event() => match e {
                    Ok(Some(e)) => {
                        let mut evs = fs_events(&p, &e);
                        if include_entry {
                            evs = with_entries(&fs, &p, evs).await;
                        }
                        for ev in evs {
                            if !tx.send(&json!({"filesystem": ev})).await {
                                return;
                            }
                        }
                    }
                    Ok(None) => break,
                    Err(e) => {
                        tx.end(Some(ConnectError::from(ApiError::from_guest(e, &p)))).await;
                        return;
                    }
                },
                _ = tick.tick() => {
                    if !tx.send(&json!({"keepalive": {}})).await {
                        return;
                    }
                }
                _ = tx.closed() => return,
                _ = &mut stop => {
                    tx.end(Some(E2b::shutdown_error())).await;
                    return;
                }
            }
        }
        tx.end(None).await;
    });
    Ok(resp)
}

struct Watcher {
    sandbox: String,
    events: Arc<Mutex<PendingEvents>>,
    /// Told when events arrive.
    arrived: Arc<tokio::sync::Notify>,
    task: tokio::task::AbortHandle,
}

impl Watcher {
    fn ended_and_drained(&self) -> bool {
        self.task.is_finished()
            && self
                .events
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .events
                .is_empty()
    }
}

/// How long a poll that finds no events waits for events still on their way from
/// the sandbox (a file written just before the poll: envd, in the sandbox, has it
/// at once; here the event crosses the guest connection).
const POLL_GRACE: std::time::Duration = std::time::Duration::from_millis(150);
/// How long a poll waits after events for more of them.
const POLL_SETTLE: std::time::Duration = std::time::Duration::from_millis(30);

/// A polled watcher's events since the last poll, oldest first, at most
/// [`MAX_PENDING_EVENTS`] and [`MAX_PENDING_BYTES`] of them (the oldest are
/// dropped to keep within both).
#[derive(Default)]
struct PendingEvents {
    events: std::collections::VecDeque<(Value, usize)>,
    bytes: usize,
}

impl PendingEvents {
    fn extend(&mut self, evs: Vec<Value>) {
        for e in evs {
            let size = e.to_string().len();
            self.bytes += size;
            self.events.push_back((e, size));
            while self.events.len() > MAX_PENDING_EVENTS || self.bytes > MAX_PENDING_BYTES {
                match self.events.pop_front() {
                    Some((_, n)) => self.bytes -= n,
                    None => break,
                }
            }
        }
    }

    fn take(&mut self) -> Vec<Value> {
        self.bytes = 0;
        self.events.drain(..).map(|(e, _)| e).collect()
    }
}

/// Watchers polled with `GetWatcherEvents` (the sync SDK's `watch_dir`).
#[derive(Default)]
pub struct Watchers {
    m: Mutex<HashMap<String, Watcher>>,
}

impl Watchers {
    async fn create(
        &self,
        ctx: &Ctx,
        path: &str,
        recursive: bool,
        include_entry: bool,
    ) -> Result<String, ConnectError> {
        let too_many = |m: &mut HashMap<String, Watcher>| {
            // A watch that has ended (its directory removed, the agent's watch
            // closed) and whose events were all polled holds no place.
            m.retain(|_, w| w.sandbox != ctx.h.id || !w.ended_and_drained());
            let n = m.values().filter(|w| w.sandbox == ctx.h.id).count();
            (n >= MAX_WATCHERS_PER_SANDBOX).then(|| {
                ConnectError::new(
                    Code::ResourceExhausted,
                    format!(
                        "sandbox {} has {n} watchers, the most it may have: remove one first",
                        ctx.h.id
                    ),
                )
            })
        };
        if let Some(e) = too_many(&mut self.m.lock().unwrap_or_else(|e| e.into_inner())) {
            return Err(e);
        }
        let mut w = open_watch(ctx, path, recursive).await?;
        let fs = files(ctx);
        let events: Arc<Mutex<PendingEvents>> = Arc::default();
        let ev = events.clone();
        let arrived: Arc<tokio::sync::Notify> = Arc::default();
        let notify = arrived.clone();
        let root = path.to_string();
        let task = tokio::spawn(async move {
            while let Ok(Some(e)) = w.next_event().await {
                let mut evs = fs_events(&root, &e);
                if include_entry {
                    evs = with_entries(&fs, &root, evs).await;
                }
                ev.lock().unwrap_or_else(|e| e.into_inner()).extend(evs);
                notify.notify_waiters();
            }
        });
        let id = format!("w-{}", crate::auth::random_hex(8));
        let app = ctx.e2b.app.clone();
        let mut m = self.m.lock().unwrap_or_else(|e| e.into_inner());
        // Watchers of sandboxes that are gone are forgotten.
        m.retain(|_, w| {
            let live = app.handle(&w.sandbox).is_some();
            if !live {
                w.task.abort();
            }
            live
        });
        // Another create of the sandbox's may have taken the last place meanwhile.
        if let Some(e) = too_many(&mut m) {
            task.abort();
            return Err(e);
        }
        m.insert(
            id.clone(),
            Watcher {
                sandbox: ctx.h.id.clone(),
                events,
                arrived,
                task: task.abort_handle(),
            },
        );
        Ok(id)
    }

    /// The events since the last poll. Events of changes made just before the
    /// poll may still be on their way: with none yet it waits up to
    /// [`POLL_GRACE`] for the first, and then, while more keep coming within
    /// [`POLL_SETTLE`] of each other, for those (at most [`POLL_GRACE`] in all).
    async fn drain(&self, sandbox: &str, id: &str) -> Result<Vec<Value>, ConnectError> {
        let (events, arrived) = {
            let m = self.m.lock().unwrap_or_else(|e| e.into_inner());
            let w = m
                .get(id)
                .filter(|w| w.sandbox == sandbox)
                .ok_or_else(|| ConnectError::not_found(format!("watcher {id} not found")))?;
            (w.events.clone(), w.arrived.clone())
        };
        let take = || events.lock().unwrap_or_else(|e| e.into_inner()).take();
        let deadline = tokio::time::Instant::now() + POLL_GRACE;
        let mut out = Vec::new();
        loop {
            let notified = arrived.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let got = take();
            let wait = if out.is_empty() && got.is_empty() {
                POLL_GRACE
            } else {
                POLL_SETTLE
            };
            out.extend(got);
            let until = (tokio::time::Instant::now() + wait).min(deadline);
            if tokio::time::timeout_at(until, notified).await.is_err() {
                out.extend(take());
                return Ok(out);
            }
        }
    }

    fn remove(&self, sandbox: &str, id: &str) -> Result<(), ConnectError> {
        let mut m = self.m.lock().unwrap_or_else(|e| e.into_inner());
        match m.get(id) {
            Some(w) if w.sandbox == sandbox => {
                w.task.abort();
                m.remove(id);
                Ok(())
            }
            _ => Err(ConnectError::not_found(format!("watcher {id} not found"))),
        }
    }
}

/// An error of the `/files` routes: `{"code": N, "message"}` as envd answers.
fn http_error(status: StatusCode, message: impl Into<String>) -> Response {
    (
        status,
        Json(json!({"code": status.as_u16(), "message": message.into()})),
    )
        .into_response()
}

fn http_api_error(e: ConnectError) -> Response {
    let status = match e.code {
        Code::NotFound => StatusCode::NOT_FOUND,
        Code::InvalidArgument | Code::FailedPrecondition | Code::AlreadyExists => {
            StatusCode::BAD_REQUEST
        }
        Code::PermissionDenied => StatusCode::FORBIDDEN,
        Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        Code::ResourceExhausted if e.message.contains("disk is full") => {
            StatusCode::INSUFFICIENT_STORAGE
        }
        Code::ResourceExhausted => StatusCode::PAYLOAD_TOO_LARGE,
        Code::Unimplemented => StatusCode::NOT_IMPLEMENTED,
        Code::Unavailable => StatusCode::BAD_GATEWAY,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    http_error(status, e.message)
}

/// The query of a `/files` request: `path`, `username`, and a signed URL's
/// `signature` and `signature_expiration`.
#[derive(Debug, Default, PartialEq)]
struct FileQuery {
    path: Option<String>,
    user: Option<String>,
    signature: Option<String>,
    expiration: Option<String>,
}

fn file_query(q: Option<&str>) -> FileQuery {
    let mut f = FileQuery::default();
    for (k, v) in form_urlencoded::parse(q.unwrap_or_default().as_bytes()) {
        match k.as_ref() {
            "path" => f.path = Some(v.into_owned()),
            "username" if !v.is_empty() => f.user = Some(v.into_owned()),
            "signature" => f.signature = Some(v.into_owned()),
            "signature_expiration" => f.expiration = Some(v.into_owned()),
            _ => {}
        }
    }
    f
}

/// The sandbox of a `/files` request: by its access token, or for a signed URL
/// (which carries neither token nor, with one listener, the sandbox) by the
/// signature.
fn file_access(
    e2b: &Arc<E2b>,
    headers: &HeaderMap,
    q: &FileQuery,
    operation: &str,
) -> Result<Ctx, super::envd::AccessError> {
    match &q.signature {
        Some(sig) if !headers.contains_key(super::envd::ACCESS_TOKEN_HEADER) => {
            super::envd::signed_access(
                e2b,
                headers,
                &super::envd::SignedRequest {
                    path: q.path.as_deref().unwrap_or(""),
                    operation,
                    user: q.user.as_deref().unwrap_or(""),
                    signature: sig,
                    expiration: q.expiration.as_deref(),
                },
            )
        }
        _ => access(e2b, headers),
    }
}

fn for_user(mut ctx: Ctx, user: Option<String>) -> Ctx {
    if let Some(u) = user {
        ctx.effective_user = u.clone();
        ctx.user = Some(u);
    }
    ctx
}

/// `GET /files?path=&username=`: the file's bytes, streamed.
pub async fn download(
    State(e2b): State<Arc<E2b>>,
    RawQuery(q): RawQuery,
    headers: HeaderMap,
) -> Response {
    let fq = file_query(q.as_deref());
    let ctx = match file_access(&e2b, &headers, &fq, "read") {
        Ok(c) => c,
        Err(e) => return e.into_response(),
    };
    let ctx = for_user(ctx, fq.user);
    let Some(path) = fq.path else {
        return http_error(StatusCode::BAD_REQUEST, "path is required");
    };
    let gzip = super::encoding::accepts_gzip(
        headers
            .get(header::ACCEPT_ENCODING)
            .and_then(|v| v.to_str().ok()),
    );
    let path = match ctx.path(&path) {
        Ok(p) => p,
        Err(e) => return http_api_error(e),
    };
    // Bounded like the native read, by the sandbox's disk limit.
    let dl = match files(&ctx).read(&path, ReadRange::Whole).await {
        Ok(d) => d,
        Err(e) => return http_api_error(e.into()),
    };
    if dl.stat().kind == FileKind::Dir {
        return http_error(StatusCode::BAD_REQUEST, format!("{path} is a directory"));
    }
    let stream = async_stream(move |tx| async move {
        if gzip {
            let (raw_tx, raw_rx) = tokio::sync::mpsc::channel(4);
            tokio::join!(dl.relay(raw_tx), deflate(raw_rx, tx));
        } else {
            dl.relay(tx).await;
        }
    });
    let mut resp = Body::from_stream(stream).into_response();
    let h = resp.headers_mut();
    if gzip {
        h.insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
        h.insert(header::VARY, HeaderValue::from_static("accept-encoding"));
    }
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    if let Ok(v) = HeaderValue::from_str(&format!(
        "attachment; filename=\"{}\"",
        base_name(&path).replace(['"', '\\', '\r', '\n'], "_")
    )) {
        h.insert(header::CONTENT_DISPOSITION, v);
    }
    resp
}

type Chunk = Result<bytes::Bytes, std::io::Error>;

/// Compresses a download's chunks as they come (`Accept-Encoding: gzip`).
async fn deflate(mut rx: tokio::sync::mpsc::Receiver<Chunk>, tx: tokio::sync::mpsc::Sender<Chunk>) {
    let mut d = super::encoding::Deflate::default();
    while let Some(item) = rx.recv().await {
        let out = item.and_then(|b| d.chunk(&b));
        let failed = out.is_err();
        let send = match out {
            Ok(b) if b.is_empty() => continue,
            other => tx.send(other).await,
        };
        if send.is_err() || failed {
            return;
        }
    }
    let _ = tx.send(d.finish()).await;
}

/// A request body as it arrives, inflated when it is gzip (`Content-Encoding`),
/// in bounded steps.
struct BodyReader {
    s: axum::body::BodyDataStream,
    inflate: Option<super::encoding::Inflate>,
    rest: bytes::Bytes,
}

impl BodyReader {
    fn new(body: Body, coding: super::encoding::Coding) -> BodyReader {
        BodyReader {
            s: body.into_data_stream(),
            inflate: (coding == super::encoding::Coding::Gzip).then(Default::default),
            rest: bytes::Bytes::new(),
        }
    }

    /// The next piece of the (inflated) body; None at its end.
    async fn next(&mut self) -> Result<Option<bytes::Bytes>, ConnectError> {
        loop {
            if let Some(inf) = self.inflate.as_mut() {
                if !self.rest.is_empty() {
                    let n = self.rest.len().min(super::encoding::INFLATE_STEP);
                    let piece = self.rest.split_to(n);
                    let out = inf.step(&piece).map_err(ConnectError::invalid)?;
                    if !out.is_empty() {
                        return Ok(Some(out.into()));
                    }
                    continue;
                }
            }
            match self.s.next().await {
                Some(chunk) => {
                    let chunk = chunk.map_err(|e| {
                        ConnectError::invalid(format!("reading the request body: {e}"))
                    })?;
                    if self.inflate.is_none() {
                        return Ok(Some(chunk));
                    }
                    self.rest = chunk;
                }
                None => {
                    return match self.inflate.take() {
                        Some(inf) => {
                            let out = inf.finish().map_err(ConnectError::invalid)?;
                            Ok((!out.is_empty()).then(|| out.into()))
                        }
                        None => Ok(None),
                    }
                }
            }
        }
    }
}

/// A body stream fed by a task.
fn async_stream<F, Fut>(
    f: F,
) -> impl futures_util::Stream<Item = Result<bytes::Bytes, std::io::Error>>
where
    F: FnOnce(tokio::sync::mpsc::Sender<Result<bytes::Bytes, std::io::Error>>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tokio::spawn(f(tx));
    futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|b| (b, rx)) })
}

/// One file being written.
struct Upload {
    up: crate::services::files::Upload,
    /// The file's metadata as the answer shows it (keys without the namespace).
    metadata: serde_json::Map<String, Value>,
}

async fn open_upload(
    ctx: &Ctx,
    path: &str,
    metadata: &BTreeMap<String, String>,
) -> Result<Upload, ConnectError> {
    let up = files(ctx)
        .write(WriteSpec {
            xattrs: metadata.clone(),
            ..WriteSpec::new(path)
        })
        .await?;
    Ok(Upload {
        up,
        metadata: metadata
            .iter()
            .filter_map(|(k, v)| {
                Some((k.strip_prefix(METADATA_XATTR_PREFIX)?.to_string(), json!(v)))
            })
            .collect(),
    })
}

impl Upload {
    async fn write(&mut self, budget: &mut UploadBudget, data: &[u8]) -> Result<(), ConnectError> {
        Ok(self.up.write(budget, data).await?)
    }

    async fn finish(self) -> Result<Value, ConnectError> {
        let path = self.up.path().to_string();
        self.up.finish().await?;
        let mut v = json!({"name": base_name(&path), "type": "file", "path": path});
        if !self.metadata.is_empty() {
            v["metadata"] = Value::Object(self.metadata);
        }
        Ok(v)
    }
}

/// `POST /files?path=&username=`: `multipart/form-data` (one part per file,
/// named by `path` for a single file or by each part's file name) or a raw
/// `application/octet-stream` body. Parents are created; each file appears
/// whole when complete. Answers the written files.
pub async fn upload(
    State(e2b): State<Arc<E2b>>,
    RawQuery(q): RawQuery,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let fq = file_query(q.as_deref());
    let ctx = match file_access(&e2b, &headers, &fq, "write") {
        Ok(c) => c,
        Err(e) => return e.into_response(),
    };
    let (path, ctx) = (fq.path, for_user(ctx, fq.user));
    let coding = match super::encoding::content_coding(
        headers
            .get(header::CONTENT_ENCODING)
            .and_then(|v| v.to_str().ok()),
    ) {
        Ok(c) => c,
        Err(m) => return http_error(StatusCode::BAD_REQUEST, m),
    };
    let metadata = match metadata_xattrs(&headers) {
        Ok(m) => m,
        Err(m) => return http_error(StatusCode::BAD_REQUEST, m),
    };
    let _guard = ctx.h.active();
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/octet-stream")
        .to_string();
    let body = BodyReader::new(body, coding);
    let r = match multipart::boundary(&ct) {
        Some(b) => upload_multipart(&ctx, path, &b, body, &metadata).await,
        None => upload_raw(&ctx, path, body, &metadata).await,
    };
    match r {
        Ok(written) => (StatusCode::OK, Json(Value::Array(written))).into_response(),
        Err(e) => http_api_error(e),
    }
}

async fn upload_raw(
    ctx: &Ctx,
    path: Option<String>,
    mut body: BodyReader,
    metadata: &BTreeMap<String, String>,
) -> Result<Vec<Value>, ConnectError> {
    let path =
        path.ok_or_else(|| ConnectError::invalid("path is required for an octet-stream upload"))?;
    let path = ctx.path(&path)?;
    let mut up = open_upload(ctx, &path, metadata).await?;
    let mut budget = files(ctx).upload_budget(UploadKind::Files);
    while let Some(chunk) = body.next().await? {
        up.write(&mut budget, &chunk).await?;
    }
    Ok(vec![up.finish().await?])
}

async fn upload_multipart(
    ctx: &Ctx,
    path: Option<String>,
    boundary: &str,
    mut body: BodyReader,
    metadata: &BTreeMap<String, String>,
) -> Result<Vec<Value>, ConnectError> {
    let mut r = multipart::Reader::new(boundary);
    let mut cur: Option<Upload> = None;
    let mut written = Vec::new();
    let mut budget = files(ctx).upload_budget(UploadKind::Files);
    let mut parts = 0usize;
    loop {
        while let Some(ev) = r.next_event().map_err(ConnectError::invalid)? {
            match ev {
                multipart::Event::Part { filename, .. } => {
                    parts += 1;
                    if parts > MAX_UPLOAD_PARTS {
                        return Err(ConnectError::new(
                            Code::ResourceExhausted,
                            format!(
                                "a multipart upload of more than {MAX_UPLOAD_PARTS} files: send them in several"
                            ),
                        ));
                    }
                    // With `path`, the SDK sends exactly one file; otherwise each part
                    // names its file.
                    let target = match (&path, filename) {
                        (Some(p), _) if parts == 1 => p.clone(),
                        (_, Some(f)) if !f.is_empty() => f,
                        _ => {
                            return Err(ConnectError::invalid(
                                "each multipart part needs a file name (or give ?path= for a single file)",
                            ))
                        }
                    };
                    let target = ctx.path(&target)?;
                    cur = Some(open_upload(ctx, &target, metadata).await?);
                }
                multipart::Event::Data(d) => {
                    if let Some(u) = cur.as_mut() {
                        u.write(&mut budget, &d).await?;
                    }
                }
                multipart::Event::PartEnd => {
                    if let Some(u) = cur.take() {
                        written.push(u.finish().await?);
                    }
                }
                multipart::Event::End => {}
            }
        }
        if r.is_done() {
            break;
        }
        match body.next().await? {
            Some(chunk) => r.push(&chunk),
            None => {
                return Err(ConnectError::invalid(
                    "the multipart body ended before its closing boundary",
                ))
            }
        }
    }
    if written.is_empty() {
        return Err(ConnectError::invalid("the multipart body holds no file"));
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_watchers_pending_events_are_bounded_in_count_and_bytes() {
        let mut q = PendingEvents::default();
        // Long names: the byte bound holds long before the count bound.
        let long = "n".repeat(4096);
        for i in 0..2000 {
            q.extend(vec![json!({"name": format!("{long}{i}"), "type": 1})]);
        }
        assert!(q.bytes <= MAX_PENDING_BYTES, "{}", q.bytes);
        let kept = q.take();
        assert!(kept.len() < 300, "{}", kept.len());
        // The newest are the ones kept.
        assert_eq!(kept.last().unwrap()["name"], format!("{long}1999"));
        assert_eq!((q.bytes, q.take().len()), (0, 0));
        // Short names: the count bound.
        for i in 0..(MAX_PENDING_EVENTS + 5) {
            q.extend(vec![json!({"name": i.to_string()})]);
        }
        let kept = q.take();
        assert_eq!(kept.len(), MAX_PENDING_EVENTS);
        assert_eq!(kept[0]["name"], "5");
    }

    fn st(path: &str, kind: FileKind, mode: u32) -> FileStat {
        FileStat {
            path: path.into(),
            kind,
            size: 12,
            mode,
            uid: 1000,
            gid: 1000,
            mtime: 1_764_470_061,
            mtime_nsec: 250_000_000,
            symlink_target: None,
            xattrs: Default::default(),
        }
    }

    #[test]
    fn entry_info_is_envd_json() {
        let v = entry_info(&st("/home/user/a.txt", FileKind::File, 0o644));
        assert_eq!(v["name"], "a.txt");
        assert_eq!(v["type"], "FILE_TYPE_FILE");
        assert_eq!(v["size"], "12");
        assert_eq!(v["mode"], 0o644);
        assert_eq!(v["permissions"], "-rw-r--r--");
        assert_eq!(v["owner"], "user");
        assert_eq!(v["group"], "user");
        assert!(v["modifiedTime"].as_str().unwrap().ends_with(".250Z"));
        assert!(v.get("isSymlink").is_none());
        let d = entry_info(&st("/", FileKind::Dir, 0o755));
        assert_eq!(d["name"], "/");
        assert_eq!(d["permissions"], "drwxr-xr-x");
        let mut l = st("/tmp/l", FileKind::Symlink, 0o777);
        l.symlink_target = Some("/etc".into());
        let l = entry_info(&l);
        assert_eq!(l["isSymlink"], true);
        assert_eq!(l["symlinkTarget"], "/etc");
        assert_eq!(l["permissions"], "Lrwxrwxrwx");
    }

    #[test]
    fn file_metadata_is_user_e2b_xattrs_both_ways() {
        let mut h = HeaderMap::new();
        h.insert("x-metadata-author", "mish".parse().unwrap());
        h.insert("x-metadata-Kind", "a b".parse().unwrap());
        h.insert("x-other", "no".parse().unwrap());
        let x = metadata_xattrs(&h).unwrap();
        assert_eq!(x.len(), 2);
        assert_eq!(x["user.e2b.author"], "mish");
        assert_eq!(x["user.e2b.kind"], "a b");
        h.insert("x-metadata-bin", HeaderValue::from_bytes(b"\xff").unwrap());
        assert!(metadata_xattrs(&h).unwrap_err().contains("printable"));
        let mut f = st("/a", FileKind::File, 0o644);
        f.xattrs.insert("user.e2b.author".into(), "mish".into());
        f.xattrs.insert("user.other".into(), "hidden".into());
        assert_eq!(entry_info(&f)["metadata"], json!({"author": "mish"}));
        assert!(entry_info(&st("/b", FileKind::File, 0o644))
            .get("metadata")
            .is_none());
    }

    #[test]
    fn watch_events_are_relative_and_renames_split() {
        let e = |kind, path: &str, from: Option<&str>| WatchEvent {
            kind,
            path: Some(path.into()),
            from: from.map(String::from),
            dir: false,
        };
        assert_eq!(
            fs_events("/w", &e(WatchEventKind::Create, "/w/a", None)),
            vec![json!({"name": "a", "type": "EVENT_TYPE_CREATE"})]
        );
        assert_eq!(
            fs_events("/w", &e(WatchEventKind::Modify, "/w/d/b", None)),
            vec![json!({"name": "d/b", "type": "EVENT_TYPE_WRITE"})]
        );
        assert_eq!(
            fs_events("/w", &e(WatchEventKind::Delete, "/w/a", None)),
            vec![json!({"name": "a", "type": "EVENT_TYPE_REMOVE"})]
        );
        assert_eq!(
            fs_events("/w", &e(WatchEventKind::Rename, "/w/b", Some("/w/a"))),
            vec![
                json!({"name": "a", "type": "EVENT_TYPE_RENAME"}),
                json!({"name": "b", "type": "EVENT_TYPE_CREATE"})
            ]
        );
        let tmp = "/w/.f.txt.sandlot-1-99566379.tmp";
        assert!(is_upload_temp(tmp));
        assert!(!is_upload_temp("/w/.f.txt.tmp"));
        assert!(!is_upload_temp("/w/f.sandlot-1-2.tmp"));
        assert!(fs_events("/w", &e(WatchEventKind::Create, tmp, None)).is_empty());
        assert!(fs_events("/w", &e(WatchEventKind::Modify, tmp, None)).is_empty());
        assert_eq!(
            fs_events("/w", &e(WatchEventKind::Rename, "/w/f.txt", Some(tmp))),
            vec![
                json!({"name": "f.txt", "type": "EVENT_TYPE_CREATE"}),
                json!({"name": "f.txt", "type": "EVENT_TYPE_CHMOD"}),
                json!({"name": "f.txt", "type": "EVENT_TYPE_WRITE"})
            ]
        );
        let o = WatchEvent {
            kind: WatchEventKind::Overflow,
            path: None,
            from: None,
            dir: false,
        };
        assert!(fs_events("/w", &o).is_empty());
    }

    #[test]
    fn fs_requests_parse_both_field_spellings() {
        let r: FsRequest = connect::parse_message(br#"{"path":"/a","depth":3}"#).unwrap();
        assert_eq!((r.path.as_str(), r.depth), ("/a", Some(3)));
        let r: FsRequest = connect::parse_message(br#"{"watcherId":"w-1"}"#).unwrap();
        assert_eq!(r.watcher_id, "w-1");
        let r: FsRequest =
            connect::parse_message(br#"{"watcher_id":"w-2","include_entry":true}"#).unwrap();
        assert_eq!(r.watcher_id, "w-2");
        assert!(r.include_entry);
        let r: FsRequest = connect::parse_message(br#"{"source":"a","destination":"b"}"#).unwrap();
        assert_eq!((r.source.as_str(), r.destination.as_str()), ("a", "b"));
    }

    #[test]
    fn file_queries() {
        let q = file_query(Some("path=%2Ftmp%2Fa%20b&username=root"));
        assert_eq!(q.path.as_deref(), Some("/tmp/a b"));
        assert_eq!(q.user.as_deref(), Some("root"));
        assert_eq!(file_query(Some("username=")), FileQuery::default());
        let q = file_query(Some("path=a&signature=v1_x%2By&signature_expiration=17"));
        assert_eq!(q.signature.as_deref(), Some("v1_x+y"));
        assert_eq!(q.expiration.as_deref(), Some("17"));
    }
}
