//! `/v1/memory/...`: the caller's tenant's memory stores (Markdown files in git with a hybrid
//! search index; see docs/memory.md). Handlers turn the request into a [`MemoryOp`] and
//! [`Memories::run`](crate::memory::Memories) applies it; writes are commits authored by the
//! tenant, or by the agent named in `X-Sandlot-Agent`.

use std::sync::Arc;

use axum::extract::{FromRequestParts, Path, Query};
use axum::http::request::Parts;
use axum::http::HeaderMap;
use axum::response::Response;
use serde::Deserialize;
use serde_json::Value;

use super::{json_status, JsonBody};
use crate::auth::Principal;
use crate::error::{ApiError, ApiResult};
use crate::memory::{valid_agent_name, MemoryOp, Writer};
use crate::mount_users::{live_sandboxes_mounting, MountedKind};
use crate::state::AppState;

/// Header naming the agent a write is attributed to (default: the tenant).
pub const AGENT_HEADER: &str = "x-sandlot-agent";

fn writer(p: &Principal, headers: &HeaderMap) -> ApiResult<Writer> {
    let agent = match headers.get(AGENT_HEADER) {
        Some(v) => {
            let a = v
                .to_str()
                .map_err(|_| ApiError::invalid(AGENT_HEADER, "must be printable ASCII"))?;
            if !valid_agent_name(a) {
                return Err(ApiError::invalid(
                    AGENT_HEADER,
                    "agent names are 1 to 64 characters without control characters, '<' or '>'",
                ));
            }
            Some(a.trim().to_string())
        }
        None => None,
    };
    Ok(Writer {
        tenant: p.tenant.clone(),
        agent,
    })
}

/// The caller of a memory route, extracted before the path, query and body: the daemon,
/// who calls (authentication fails first) and the request headers. Every handler turns
/// its request into a [`MemoryOp`] and hands it to [`MemoryCall::run`].
pub struct MemoryCall {
    state: Arc<AppState>,
    principal: Principal,
    headers: HeaderMap,
}

impl FromRequestParts<Arc<AppState>> for MemoryCall {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &Arc<AppState>,
    ) -> Result<Self, Self::Rejection> {
        let principal = Principal::from_request_parts(parts, state).await?;
        Ok(MemoryCall {
            state: state.clone(),
            principal,
            headers: parts.headers.clone(),
        })
    }
}

impl MemoryCall {
    /// Applies `op` to the caller's tenant's store `store` (`None`: the tenant's stores), as
    /// the tenant or the agent of `X-Sandlot-Agent` (checked here, after the body), and
    /// answers its status and JSON.
    async fn run(self, store: Option<&str>, op: MemoryOp) -> ApiResult<Response> {
        let p = &self.principal;
        let w = writer(p, &self.headers)?;
        let (status, v) = self.state.memory.run(&p.tenant, store, op, w).await?;
        Ok(json_status(status, &v))
    }
}

/// `POST /v1/memory`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateMemoryStore {
    /// 1 to 64 letters, digits, '-', '_' or '.', not starting with '.'.
    pub name: String,
}

/// A memory store (counts only where the store was opened).
#[derive(utoipa::ToSchema)]
#[allow(dead_code)]
pub struct MemoryStoreDoc {
    name: String,
    tenant: String,
    files: Option<u64>,
    chunks: Option<u64>,
    vectors: Option<u64>,
    /// Embedding model id.
    model: Option<String>,
}

/// `POST /v1/memory/{store}/memories`: a new memory (Markdown with front matter).
#[derive(utoipa::ToSchema)]
#[allow(dead_code)]
pub struct NewMemoryDoc {
    title: String,
    body: Option<String>,
    /// Entity class folder (`people`); ignored when `path` is given.
    folder: Option<String>,
    /// Store-relative path ending in `.md`.
    path: Option<String>,
    /// Default: the path without `.md`.
    id: Option<String>,
    r#type: Option<String>,
    tags: Option<Vec<String>>,
    /// Memory ids or store-relative paths.
    links: Option<Vec<String>>,
    /// RFC 3339 time or date.
    valid_from: Option<String>,
    valid_to: Option<String>,
    /// Key of a memory this one supersedes (it gets `valid_to` and a link here).
    supersedes: Option<String>,
}

/// `PATCH /v1/memory/{store}/memories/{key}`: fields to change.
#[derive(utoipa::ToSchema)]
#[allow(dead_code)]
pub struct MemoryPatchDoc {
    title: Option<String>,
    body: Option<String>,
    r#type: Option<String>,
    /// Replaces the tags.
    tags: Option<Vec<String>>,
    add_tags: Option<Vec<String>>,
    remove_tags: Option<Vec<String>>,
    /// Replaces the links.
    links: Option<Vec<String>>,
    add_links: Option<Vec<String>>,
    valid_from: Option<String>,
    valid_to: Option<String>,
}

/// `POST /v1/memory/{store}/search`.
#[derive(utoipa::ToSchema)]
#[allow(dead_code)]
pub struct SearchDoc {
    text: String,
    /// Default 10, at most 1000.
    limit: Option<u32>,
    /// All must be present.
    tags: Option<Vec<String>>,
    r#type: Option<String>,
    /// Folder including sub-folders.
    folder: Option<String>,
    /// `"now"` (default), `{"at": UNIX_SECONDS}` or `"any"`.
    #[schema(value_type = Option<Object>)]
    valid: Option<Value>,
    /// `hybrid` (default), `bm25` or `vector`.
    mode: Option<String>,
    /// Add the memories each hit links to (one hop).
    expand: Option<bool>,
}

/// The result of a write.
#[derive(utoipa::ToSchema)]
#[allow(dead_code)]
pub struct WriteOutcomeDoc {
    path: String,
    id: String,
    /// Absent when the write changed nothing.
    commit: Option<String>,
}

/// Result of a memory tool call: the text for the model and whether it is an error.
#[derive(utoipa::ToSchema)]
#[allow(dead_code)]
pub struct ToolOutputDoc {
    text: String,
    is_error: bool,
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MoveBody {
    pub from: String,
    pub to: String,
}

/// Exactly one of `commit` (undo a store commit) or `key` with `to` (restore one memory to a
/// revision); both as a new commit.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RevertBody {
    #[serde(default)]
    pub commit: Option<String>,
    #[serde(default)]
    pub key: Option<String>,
    #[serde(default)]
    pub to: Option<String>,
}

#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReindexBody {
    /// Drop the stored vectors too (re-embed everything).
    #[serde(default)]
    pub fresh: bool,
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
pub struct GetParams {
    /// A revision: the memory as it was then.
    pub rev: Option<String>,
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
pub struct LogParams {
    /// One memory's history (follows renames).
    pub key: Option<String>,
    /// Default 20.
    pub limit: Option<usize>,
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
pub struct DiffParams {
    /// Default `HEAD~1`.
    pub from: Option<String>,
    /// Default: the work tree.
    pub to: Option<String>,
    pub key: Option<String>,
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
pub struct StatusParams {
    /// List fresh files too.
    #[serde(default)]
    pub all: bool,
}

type Err404 = crate::error::ErrorEnvelope;

#[utoipa::path(get, path = "/v1/memory", tag = "memory",
    responses((status = 200, description = "`{\"stores\": [...]}`", body = Object),
        (status = 501, description = "built without the memory feature", body = Err404)))]
pub async fn list(call: MemoryCall) -> ApiResult<Response> {
    call.run(None, MemoryOp::List).await
}

#[utoipa::path(post, path = "/v1/memory", tag = "memory", request_body = CreateMemoryStore,
    responses((status = 201, body = MemoryStoreDoc), (status = 409, body = Err404),
        (status = 503, description = "the embedding model is not installed", body = Err404)))]
pub async fn create(
    call: MemoryCall,
    JsonBody(b): JsonBody<CreateMemoryStore>,
) -> ApiResult<Response> {
    call.run(Some(&b.name), MemoryOp::Init).await
}

#[utoipa::path(get, path = "/v1/memory/{store}", tag = "memory", params(("store" = String, Path)),
    responses((status = 200, body = MemoryStoreDoc), (status = 404, body = Err404)))]
pub async fn info(call: MemoryCall, Path(store): Path<String>) -> ApiResult<Response> {
    call.run(Some(&store), MemoryOp::Info).await
}

#[utoipa::path(delete, path = "/v1/memory/{store}", tag = "memory", params(("store" = String, Path)),
    responses((status = 200, body = Object), (status = 404, body = Err404),
        (status = 409, description = "a live sandbox mounts it", body = Err404)))]
pub async fn delete(call: MemoryCall, Path(store): Path<String>) -> ApiResult<Response> {
    let users = live_sandboxes_mounting(
        &call.state,
        &call.principal.tenant,
        MountedKind::Memory,
        &store,
    );
    if !users.is_empty() {
        return Err(ApiError::conflict(format!(
            "memory store {store} is mounted by sandbox {}",
            users.join(", ")
        )));
    }
    call.run(Some(&store), MemoryOp::Delete).await
}

#[utoipa::path(post, path = "/v1/memory/{store}/memories", tag = "memory",
    params(("store" = String, Path), ("x-sandlot-agent" = Option<String>, Header, description = "commit author (default: the tenant)")),
    request_body = NewMemoryDoc,
    responses((status = 201, body = WriteOutcomeDoc), (status = 400, body = Err404), (status = 409, body = Err404)))]
pub async fn add(
    call: MemoryCall,
    Path(store): Path<String>,
    JsonBody(b): JsonBody<Value>,
) -> ApiResult<Response> {
    call.run(Some(&store), MemoryOp::Add(b)).await
}

#[utoipa::path(get, path = "/v1/memory/{store}/memories/{key}", tag = "memory",
    params(("store" = String, Path), ("key" = String, Path, description = "store-relative path or memory id (may contain '/')"), GetParams),
    responses((status = 200, description = "the memory (front matter fields, body, text); with `rev`: `{path, rev, text}`", body = Object),
        (status = 404, body = Err404)))]
pub async fn get_one(
    call: MemoryCall,
    Path((store, key)): Path<(String, String)>,
    Query(q): Query<GetParams>,
) -> ApiResult<Response> {
    let op = MemoryOp::Get { key, rev: q.rev };
    call.run(Some(&store), op).await
}

#[utoipa::path(patch, path = "/v1/memory/{store}/memories/{key}", tag = "memory",
    params(("store" = String, Path), ("key" = String, Path)), request_body = MemoryPatchDoc,
    responses((status = 200, body = WriteOutcomeDoc), (status = 404, body = Err404)))]
pub async fn edit(
    call: MemoryCall,
    Path((store, key)): Path<(String, String)>,
    JsonBody(patch): JsonBody<Value>,
) -> ApiResult<Response> {
    call.run(Some(&store), MemoryOp::Edit { key, patch }).await
}

#[utoipa::path(delete, path = "/v1/memory/{store}/memories/{key}", tag = "memory",
    params(("store" = String, Path), ("key" = String, Path)),
    responses((status = 200, body = WriteOutcomeDoc), (status = 404, body = Err404)))]
pub async fn remove(
    call: MemoryCall,
    Path((store, key)): Path<(String, String)>,
) -> ApiResult<Response> {
    call.run(Some(&store), MemoryOp::Remove { key }).await
}

#[utoipa::path(post, path = "/v1/memory/{store}/move", tag = "memory",
    params(("store" = String, Path)), request_body = MoveBody,
    responses((status = 200, body = WriteOutcomeDoc), (status = 404, body = Err404), (status = 409, body = Err404)))]
pub async fn move_memory(
    call: MemoryCall,
    Path(store): Path<String>,
    JsonBody(b): JsonBody<MoveBody>,
) -> ApiResult<Response> {
    let op = MemoryOp::Move {
        from: b.from,
        to: b.to,
    };
    call.run(Some(&store), op).await
}

#[utoipa::path(post, path = "/v1/memory/{store}/search", tag = "memory",
    params(("store" = String, Path)), request_body = SearchDoc,
    responses((status = 200, description = "`{\"hits\": [{path, id, title, line, chunk_lines, score, snippet, bm25_rank, vector_rank, similarity, related}]}`", body = Object)))]
pub async fn search(
    call: MemoryCall,
    Path(store): Path<String>,
    JsonBody(b): JsonBody<Value>,
) -> ApiResult<Response> {
    call.run(Some(&store), MemoryOp::Search(b)).await
}

#[utoipa::path(get, path = "/v1/memory/{store}/log", tag = "memory",
    params(("store" = String, Path), LogParams),
    responses((status = 200, description = "`{\"commits\": [{rev, author, email, time, message, paths}]}`", body = Object)))]
pub async fn log(
    call: MemoryCall,
    Path(store): Path<String>,
    Query(q): Query<LogParams>,
) -> ApiResult<Response> {
    let op = MemoryOp::Log {
        key: q.key,
        limit: q.limit.unwrap_or(20).clamp(1, 10_000),
    };
    call.run(Some(&store), op).await
}

#[utoipa::path(get, path = "/v1/memory/{store}/diff", tag = "memory",
    params(("store" = String, Path), DiffParams),
    responses((status = 200, description = "`{\"diff\": \"unified diff\"}`", body = Object)))]
pub async fn diff(
    call: MemoryCall,
    Path(store): Path<String>,
    Query(q): Query<DiffParams>,
) -> ApiResult<Response> {
    let op = MemoryOp::Diff {
        from: q.from,
        to: q.to,
        key: q.key,
    };
    call.run(Some(&store), op).await
}

#[utoipa::path(post, path = "/v1/memory/{store}/revert", tag = "memory",
    params(("store" = String, Path)), request_body = RevertBody,
    responses((status = 200, body = WriteOutcomeDoc), (status = 400, body = Err404)))]
pub async fn revert(
    call: MemoryCall,
    Path(store): Path<String>,
    JsonBody(b): JsonBody<RevertBody>,
) -> ApiResult<Response> {
    let op = match (b.commit, b.key, b.to) {
        (Some(commit), None, None) => MemoryOp::RevertCommit { commit },
        (None, Some(key), Some(to)) => MemoryOp::RevertMemory { key, to },
        (None, Some(_), None) => {
            return Err(ApiError::invalid("to", "`key` needs `to` (a revision)"))
        }
        (None, None, _) => {
            return Err(ApiError::invalid(
                "commit",
                "give `commit`, or `key` and `to`",
            ))
        }
        (Some(_), _, _) => {
            return Err(ApiError::invalid(
                "commit",
                "give either `commit` or `key` and `to`, not both",
            ))
        }
    };
    call.run(Some(&store), op).await
}

#[utoipa::path(get, path = "/v1/memory/{store}/status", tag = "memory",
    params(("store" = String, Path), StatusParams),
    responses((status = 200, description = "`{files: [{path, index, missing_vectors, git, error}], indexed_files, chunks, vectors}`", body = Object)))]
pub async fn status(
    call: MemoryCall,
    Path(store): Path<String>,
    Query(q): Query<StatusParams>,
) -> ApiResult<Response> {
    call.run(Some(&store), MemoryOp::Status { all: q.all })
        .await
}

#[utoipa::path(post, path = "/v1/memory/{store}/reindex", tag = "memory",
    params(("store" = String, Path)), request_body(content = Option<ReindexBody>),
    responses((status = 200, description = "`{indexed, removed, unchanged, skipped, texts_embedded}`", body = Object)))]
pub async fn reindex(
    call: MemoryCall,
    Path(store): Path<String>,
    body: axum::body::Bytes,
) -> ApiResult<Response> {
    let b: ReindexBody = if body.iter().all(u8::is_ascii_whitespace) {
        ReindexBody::default()
    } else {
        super::parse_json(&body)?
    };
    let op = MemoryOp::Reindex { fresh: b.fresh };
    call.run(Some(&store), op).await
}

#[utoipa::path(post, path = "/v1/memory/{store}/tool", tag = "memory",
    params(("store" = String, Path), ("x-sandlot-agent" = Option<String>, Header, description = "commit author (default: the tenant)")),
    request_body(content = Object, description = "the input of one Anthropic memory tool call (`memory_20250818`): `{\"command\": \"view\"|\"create\"|\"str_replace\"|\"insert\"|\"delete\"|\"rename\", ...}` over `/memories`, forwarded verbatim"),
    responses((status = 200, description = "the tool result; `is_error` marks a failed command (still HTTP 200)", body = ToolOutputDoc)))]
pub async fn tool(
    call: MemoryCall,
    Path(store): Path<String>,
    JsonBody(b): JsonBody<Value>,
) -> ApiResult<Response> {
    if !b.is_object() {
        return Err(ApiError::invalid(
            "body",
            "a memory tool call is a JSON object",
        ));
    }
    call.run(Some(&store), MemoryOp::Tool(b)).await
}

/// Routes of this module.
pub fn router() -> axum::Router<Arc<AppState>> {
    use axum::routing::{get, post};
    let s = "/v1/memory/{store}";
    axum::Router::new()
        .route("/v1/memory", get(list).post(create))
        .route(s, get(info).delete(delete))
        .route(&format!("{s}/memories"), post(add))
        .route(
            &format!("{s}/memories/{{*key}}"),
            get(get_one).patch(edit).delete(remove),
        )
        .route(&format!("{s}/move"), post(move_memory))
        .route(&format!("{s}/search"), post(search))
        .route(&format!("{s}/log"), get(log))
        .route(&format!("{s}/diff"), get(diff))
        .route(&format!("{s}/revert"), post(revert))
        .route(&format!("{s}/status"), get(status))
        .route(&format!("{s}/reindex"), post(reindex))
        .route(&format!("{s}/tool"), post(tool))
}
