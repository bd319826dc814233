//! Memory stores in the daemon (`/v1/memory/...`): one directory per store under
//! `data_dir/memory/<tenant>/<name>/`, opened on first use with a watcher that indexes direct
//! edits (a sandbox that mounts the store, a person with an editor), and one embedder shared by
//! every store, loaded on first use.
//!
//! Handlers build a [`MemoryOp`] (the request as data) and [`Memories::run`] applies it. Without
//! the `memory` feature (no ML runtime in the build) every operation answers 501.

use axum::http::StatusCode;
use serde_json::Value;

use crate::error::{ApiError, ApiResult, ErrorCode};

/// One operation on the memory stores of a tenant, as parsed from the request.
#[derive(Debug, Clone)]
pub enum MemoryOp {
    List,
    Init,
    Info,
    Delete,
    /// A `NewMemory` body, plus `supersedes` (key of the memory it replaces).
    Add(Value),
    Get {
        key: String,
        rev: Option<String>,
    },
    Edit {
        key: String,
        patch: Value,
    },
    Move {
        from: String,
        to: String,
    },
    Remove {
        key: String,
    },
    Search(Value),
    Log {
        key: Option<String>,
        limit: usize,
    },
    Diff {
        from: Option<String>,
        to: Option<String>,
        key: Option<String>,
    },
    RevertCommit {
        commit: String,
    },
    RevertMemory {
        key: String,
        to: String,
    },
    Status {
        all: bool,
    },
    Reindex {
        fresh: bool,
    },
    /// One Anthropic memory tool call, verbatim.
    Tool(Value),
}

impl MemoryOp {
    /// Whether the operation writes (and so needs an author).
    pub fn writes(&self) -> bool {
        matches!(
            self,
            MemoryOp::Init
                | MemoryOp::Delete
                | MemoryOp::Add(_)
                | MemoryOp::Edit { .. }
                | MemoryOp::Move { .. }
                | MemoryOp::Remove { .. }
                | MemoryOp::RevertCommit { .. }
                | MemoryOp::RevertMemory { .. }
                | MemoryOp::Tool(_)
        )
    }
}

/// Who writes: the tenant, or an agent named in the request (`X-Sandlot-Agent`).
#[derive(Debug, Clone)]
pub struct Writer {
    pub tenant: String,
    pub agent: Option<String>,
}

impl Writer {
    pub fn name(&self) -> &str {
        self.agent.as_deref().unwrap_or(&self.tenant)
    }

    pub fn email(&self) -> String {
        let local: String = self
            .name()
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || "-_.".contains(c) {
                    c
                } else {
                    '-'
                }
            })
            .collect();
        format!("{local}@{}.sandlot", self.tenant)
    }
}

/// Store names: 1 to 64 letters, digits, '-', '_' or '.', not starting with '.'.
pub const STORE_RULE: &str =
    "store names are 1 to 64 letters, digits, '-', '_' or '.', not starting with '.'";

pub fn valid_store_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && !name.starts_with('.')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// Agent names (commit authors): 1 to 64 printable characters, no `<`, `>` or control
/// characters (they would break the author line).
pub fn valid_agent_name(name: &str) -> bool {
    !name.trim().is_empty()
        && name.chars().count() <= 64
        && !name.chars().any(|c| c.is_control() || c == '<' || c == '>')
}

#[cfg_attr(feature = "memory", allow(dead_code))]
fn not_built() -> ApiError {
    ApiError::of(
        ErrorCode::NotImplemented,
        "memory stores are not available: this sandlot was built without the `memory` feature",
    )
}

#[cfg(feature = "memory")]
pub use enabled::Memories;

#[cfg(not(feature = "memory"))]
pub use disabled::Memories;

#[cfg(not(feature = "memory"))]
mod disabled {
    use super::*;

    /// Memory stores are not compiled in: every operation is a 501.
    pub struct Memories;

    impl Memories {
        pub fn new(_data_dir: &std::path::Path) -> Memories {
            Memories
        }

        pub async fn run(
            &self,
            _tenant: &str,
            _store: Option<&str>,
            _op: MemoryOp,
            _writer: Writer,
        ) -> ApiResult<(StatusCode, Value)> {
            Err(not_built())
        }

        /// The host directory of a tenant's store for a sandbox mount.
        pub fn mount_source(&self, _tenant: &str, _store: &str) -> ApiResult<MountDirs> {
            Err(not_built())
        }
    }
}

/// Adds the spec's memory store mounts to the runtime options: the store's work tree at the
/// target, then its `.git` and `.sandlot` read-only over it (a sandbox may rewrite memories but
/// not the history, hooks, config or index). 400 naming `mounts[i].store` for an unknown store.
pub fn add_mounts(
    memories: &Memories,
    tenant: &str,
    spec: &sandlot_proto::spec::SandboxSpec,
    opts: &mut sandlot_runtime::CreateOptions,
) -> ApiResult<()> {
    use sandlot_proto::spec::{normalize_sandbox_path, MountSpec};
    use sandlot_runtime::mounts::SharedDir;
    for (i, m) in spec.mounts.iter().enumerate() {
        let MountSpec::Memory {
            store,
            target,
            readonly,
        } = m
        else {
            continue;
        };
        let dirs = memories.mount_source(tenant, store).map_err(|e| {
            if e.status == StatusCode::NOT_FOUND {
                ApiError::invalid(
                    format!("mounts[{i}].store"),
                    format!("no memory store {store:?}"),
                )
            } else {
                e
            }
        })?;
        let t = normalize_sandbox_path(target);
        opts.volumes.push(SharedDir {
            source: dirs.root.clone(),
            target: t.clone(),
            readonly: *readonly,
        });
        for p in dirs.protected {
            opts.volumes.push(SharedDir {
                source: dirs.root.join(p),
                target: format!("{}/{p}", t.trim_end_matches('/')),
                readonly: true,
            });
        }
    }
    Ok(())
}

/// What a sandbox mount of a store binds: the work tree read-write (or read-only), and the
/// git and index directories over it read-only.
#[derive(Debug, Clone)]
pub struct MountDirs {
    pub root: std::path::PathBuf,
    pub protected: Vec<&'static str>,
}

#[cfg(feature = "memory")]
mod enabled {
    use std::collections::HashMap;
    use std::path::{Path, PathBuf};
    use std::sync::{Arc, Mutex, OnceLock};

    use sandlot_memory::{
        Author, Embedder, GitError, MemoryPatch, MiniLmEmbedder, NewMemory, SearchQuery, Store,
        StoreError, TreeError, WatchOptions, Watcher,
    };
    use serde::Deserialize;

    use super::*;
    use crate::body::from_value;

    struct Open {
        store: Arc<Store>,
        _watcher: Watcher,
    }

    /// The daemon's memory stores.
    pub struct Memories {
        root: PathBuf,
        embedder: OnceLock<Arc<dyn Embedder>>,
        /// Loading the model happens once; concurrent first requests wait here.
        loading: Mutex<()>,
        open: Mutex<HashMap<(String, String), Arc<Open>>>,
        /// Serialises init/delete/open of stores.
        admin: Mutex<()>,
    }

    fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
        m.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `NewMemory` plus the key of a memory it supersedes.
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct AddBody {
        title: String,
        #[serde(default)]
        body: String,
        #[serde(default)]
        folder: Option<String>,
        #[serde(default)]
        path: Option<String>,
        #[serde(default)]
        id: Option<String>,
        #[serde(default, rename = "type")]
        kind: Option<String>,
        #[serde(default)]
        tags: Vec<String>,
        #[serde(default)]
        links: Vec<String>,
        #[serde(default)]
        valid_from: Option<String>,
        #[serde(default)]
        valid_to: Option<String>,
        #[serde(default)]
        supersedes: Option<String>,
    }

    fn json<T: serde::Serialize>(v: &T) -> Value {
        serde_json::to_value(v).unwrap_or(Value::Null)
    }

    fn store_error(e: StoreError) -> ApiError {
        match &e {
            StoreError::NotFound { key, .. } => ApiError::not_found(format!("no memory {key:?}")),
            StoreError::Exists { .. } => ApiError::conflict(e.to_string()),
            StoreError::BadPath { .. } => ApiError::invalid("path", e.to_string()),
            StoreError::Invalid(m) => ApiError::bad_request(m.clone()),
            StoreError::NotText { .. } | StoreError::Doc(_) => ApiError::bad_request(e.to_string()),
            // The caller's mistakes: a revision that does not resolve, a folder holding a
            // repository of its own, text that is not UTF-8, a revert that conflicts. These
            // messages name store-relative paths and revisions only.
            StoreError::Git(
                GitError::BadRevision { .. }
                | GitError::NestedRepository { .. }
                | GitError::NotUtf8 { .. },
            ) => ApiError::bad_request(e.to_string()),
            StoreError::Git(GitError::Revert { .. }) => ApiError::conflict(e.to_string()),
            // What the work tree holds (a sandbox may have put it there): a file too large
            // or not a regular file, a path through a link. Store-relative paths only.
            StoreError::Tree(t) | StoreError::Git(GitError::Tree(t)) => match t {
                TreeError::TooLarge { .. } => ApiError::of(ErrorCode::TooLarge, t.to_string()),
                TreeError::NotAFile { .. } => ApiError::bad_request(t.to_string()),
                TreeError::Io { rel, .. } if t.is_link_on_the_way() => ApiError::invalid(
                    "path",
                    format!("{rel}: a folder on the way is a symbolic link"),
                ),
                _ => ApiError::internal(crate::vfs::chain(&e)),
            },
            // The model's location is the host's: logged, not shown.
            StoreError::Embed(_) => ApiError::unavailable("embedding failed on the daemon")
                .with_detail(crate::vfs::chain(&e)),
            _ => ApiError::internal(crate::vfs::chain(&e)),
        }
    }

    impl Memories {
        pub fn new(data_dir: &Path) -> Memories {
            Memories {
                root: data_dir.join("memory"),
                embedder: OnceLock::new(),
                loading: Mutex::new(()),
                open: Mutex::new(HashMap::new()),
                admin: Mutex::new(()),
            }
        }

        /// The shared embedder (all-MiniLM-L6-v2 from `SANDLOT_MODEL_DIR` or the cache the
        /// set-up script fills), loaded on first use.
        fn embedder(&self) -> ApiResult<Arc<dyn Embedder>> {
            if let Some(e) = self.embedder.get() {
                return Ok(e.clone());
            }
            let _g = lock(&self.loading);
            if let Some(e) = self.embedder.get() {
                return Ok(e.clone());
            }
            let m = MiniLmEmbedder::load_default().map_err(|e| {
                ApiError::unavailable(
                    "the embedding model is not installed on the daemon's host; the operator \
                     runs scripts/setup.d/40-memory.sh",
                )
                .with_detail(e)
            })?;
            let m: Arc<dyn Embedder> = Arc::new(m);
            let _ = self.embedder.set(m.clone());
            Ok(m)
        }

        fn tenant_dir(&self, tenant: &str) -> PathBuf {
            // Tenant names are validated at the edge (config, header, tokens); this keeps a
            // path component even for an odd one.
            self.root.join(crate::config::tenant_path_component(tenant))
        }

        fn dir(&self, tenant: &str, name: &str) -> ApiResult<PathBuf> {
            if !valid_store_name(name) {
                return Err(ApiError::invalid("store", STORE_RULE));
            }
            Ok(self.tenant_dir(tenant).join(name))
        }

        fn exists(dir: &Path) -> bool {
            dir.join(".git").is_dir()
        }

        fn store(&self, tenant: &str, name: &str) -> ApiResult<Arc<Store>> {
            let key = (tenant.to_string(), name.to_string());
            if let Some(o) = lock(&self.open).get(&key) {
                return Ok(o.store.clone());
            }
            let _g = lock(&self.admin);
            if let Some(o) = lock(&self.open).get(&key) {
                return Ok(o.store.clone());
            }
            let dir = self.dir(tenant, name)?;
            if !Self::exists(&dir) {
                return Err(ApiError::not_found(format!("no memory store {name}")));
            }
            let store = Arc::new(Store::open(&dir, self.embedder()?).map_err(store_error)?);
            self.register(key, store.clone())?;
            Ok(store)
        }

        fn register(&self, key: (String, String), store: Arc<Store>) -> ApiResult<()> {
            let watcher = sandlot_memory::watch(store.clone(), WatchOptions::default())
                .map_err(|e| ApiError::internal(format!("watch memory store {}: {e}", key.1)))?;
            lock(&self.open).insert(
                key,
                Arc::new(Open {
                    store,
                    _watcher: watcher,
                }),
            );
            Ok(())
        }

        fn info(&self, tenant: &str, name: &str, store: Option<&Store>) -> ApiResult<Value> {
            let mut v = serde_json::json!({ "name": name, "tenant": tenant });
            if let Some(s) = store {
                let (files, chunks, vectors) = s.counts().map_err(store_error)?;
                v["files"] = files.into();
                v["chunks"] = chunks.into();
                v["vectors"] = vectors.into();
                v["model"] = s.embedder().model_id().into();
            }
            Ok(v)
        }

        fn list(&self, tenant: &str) -> ApiResult<Value> {
            let mut names: Vec<String> = std::fs::read_dir(self.tenant_dir(tenant))
                .map(|rd| {
                    rd.filter_map(|e| e.ok())
                        .filter(|e| Self::exists(&e.path()))
                        .filter_map(|e| e.file_name().into_string().ok())
                        .filter(|n| valid_store_name(n))
                        .collect()
                })
                .unwrap_or_default();
            names.sort();
            let stores: Vec<Value> = names
                .iter()
                .map(|n| serde_json::json!({ "name": n, "tenant": tenant }))
                .collect();
            Ok(serde_json::json!({ "stores": stores }))
        }

        fn init(&self, tenant: &str, name: &str, author: &Author) -> ApiResult<Value> {
            let dir = self.dir(tenant, name)?;
            let embedder = self.embedder()?;
            let _g = lock(&self.admin);
            if Self::exists(&dir) {
                return Err(ApiError::conflict(format!("memory store {name} exists")));
            }
            let parent = self.tenant_dir(tenant);
            std::fs::create_dir_all(&parent)
                .map_err(|e| ApiError::internal(format!("create {}: {e}", parent.display())))?;
            let store = match Store::init(&dir, embedder, author) {
                Ok(s) => Arc::new(s),
                Err(e) => {
                    let _ = std::fs::remove_dir_all(&dir);
                    return Err(store_error(e));
                }
            };
            self.register((tenant.to_string(), name.to_string()), store.clone())?;
            self.info(tenant, name, Some(&store))
        }

        fn delete(&self, tenant: &str, name: &str) -> ApiResult<Value> {
            let dir = self.dir(tenant, name)?;
            let _g = lock(&self.admin);
            if !Self::exists(&dir) {
                return Err(ApiError::not_found(format!("no memory store {name}")));
            }
            // Dropping the entry stops its watcher before the files go.
            lock(&self.open).remove(&(tenant.to_string(), name.to_string()));
            std::fs::remove_dir_all(&dir)
                .map_err(|e| ApiError::internal(format!("remove {}: {e}", dir.display())))?;
            Ok(serde_json::json!({ "name": name, "tenant": tenant, "deleted": true }))
        }

        /// The work tree of a tenant's store, for a sandbox mount.
        pub fn mount_source(&self, tenant: &str, name: &str) -> ApiResult<MountDirs> {
            let dir = self.dir(tenant, name)?;
            if !Self::exists(&dir) {
                return Err(ApiError::not_found(format!("no memory store {name}")));
            }
            // Open it so that its watcher indexes what the sandbox writes.
            self.store(tenant, name)?;
            Ok(MountDirs {
                root: dir,
                protected: vec![".git", ".sandlot"],
            })
        }

        /// Applies `op` to store `name` of `tenant` (blocking work runs off the async runtime).
        pub async fn run(
            self: &Arc<Self>,
            tenant: &str,
            name: Option<&str>,
            op: MemoryOp,
            writer: Writer,
        ) -> ApiResult<(StatusCode, Value)> {
            let this = self.clone();
            let tenant = tenant.to_string();
            let name = name.map(str::to_string);
            tokio::task::spawn_blocking(move || {
                this.run_blocking(&tenant, name.as_deref(), op, &writer)
            })
            .await
            .map_err(ApiError::internal)?
        }

        fn run_blocking(
            &self,
            tenant: &str,
            name: Option<&str>,
            op: MemoryOp,
            writer: &Writer,
        ) -> ApiResult<(StatusCode, Value)> {
            let author = Author::new(writer.name(), writer.email());
            let ok = |v: Value| Ok((StatusCode::OK, v));
            let Some(name) = name else {
                return match op {
                    MemoryOp::List => ok(self.list(tenant)?),
                    _ => Err(ApiError::bad_request("no store named")),
                };
            };
            match op {
                MemoryOp::List => ok(self.list(tenant)?),
                MemoryOp::Init => Ok((StatusCode::CREATED, self.init(tenant, name, &author)?)),
                MemoryOp::Delete => ok(self.delete(tenant, name)?),
                MemoryOp::Info => {
                    let s = self.store(tenant, name)?;
                    ok(self.info(tenant, name, Some(&s))?)
                }
                op => {
                    let s = self.store(tenant, name)?;
                    let e = store_error;
                    match op {
                        MemoryOp::Add(body) => {
                            let b: AddBody = from_value(body)?;
                            let new = NewMemory {
                                title: b.title,
                                body: b.body,
                                folder: b.folder,
                                path: b.path,
                                id: b.id,
                                kind: b.kind,
                                tags: b.tags,
                                links: b.links,
                                valid_from: b.valid_from,
                                valid_to: b.valid_to,
                            };
                            let out = match b.supersedes {
                                Some(old) => s.supersede(&old, new, &author),
                                None => s.add(new, &author),
                            }
                            .map_err(e)?;
                            Ok((StatusCode::CREATED, json(&out)))
                        }
                        MemoryOp::Get { key, rev: None } => ok(json(&s.get(&key).map_err(e)?)),
                        MemoryOp::Get {
                            key,
                            rev: Some(rev),
                        } => {
                            let path = s.resolve(&key).or_else(|_| {
                                // A memory deleted since: the key is then a path.
                                Ok::<_, ApiError>(key.clone())
                            })?;
                            let text = s.show(&path, &rev).map_err(e)?;
                            ok(serde_json::json!({ "path": path, "rev": rev, "text": text }))
                        }
                        MemoryOp::Edit { key, patch } => {
                            let p: MemoryPatch = from_value(patch)?;
                            ok(json(&s.edit(&key, p, &author).map_err(e)?))
                        }
                        MemoryOp::Move { from, to } => {
                            ok(json(&s.rename(&from, &to, &author).map_err(e)?))
                        }
                        MemoryOp::Remove { key } => ok(json(&s.remove(&key, &author).map_err(e)?)),
                        MemoryOp::Search(body) => {
                            let q: SearchQuery = from_value(body)?;
                            let hits = s.search(&q).map_err(e)?;
                            ok(serde_json::json!({ "hits": hits }))
                        }
                        MemoryOp::Log { key, limit } => {
                            let commits = s.log(key.as_deref(), limit).map_err(e)?;
                            ok(serde_json::json!({ "commits": commits }))
                        }
                        MemoryOp::Diff { from, to, key } => {
                            let from = from.unwrap_or_else(|| "HEAD~1".into());
                            let d = s.diff(&from, to.as_deref(), key.as_deref()).map_err(e)?;
                            ok(serde_json::json!({ "diff": d }))
                        }
                        MemoryOp::RevertCommit { commit } => {
                            ok(json(&s.revert_commit(&commit, &author).map_err(e)?))
                        }
                        MemoryOp::RevertMemory { key, to } => {
                            ok(json(&s.revert_memory(&key, &to, &author).map_err(e)?))
                        }
                        MemoryOp::Status { all } => {
                            let files = s.status().map_err(e)?;
                            let files: Vec<_> = files
                                .into_iter()
                                .filter(|f| all || f.needs_attention())
                                .collect();
                            let (nf, nc, nv) = s.counts().map_err(e)?;
                            ok(serde_json::json!({
                                "files": files, "indexed_files": nf, "chunks": nc, "vectors": nv
                            }))
                        }
                        MemoryOp::Reindex { fresh } => ok(json(&s.reindex(!fresh).map_err(e)?)),
                        MemoryOp::Tool(input) => {
                            let out =
                                sandlot_memory::memory_tool::execute_json(&s, &input, &author);
                            ok(json(&out))
                        }
                        MemoryOp::List | MemoryOp::Init | MemoryOp::Delete | MemoryOp::Info => {
                            unreachable!("handled above")
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_and_agent_names() {
        assert!(valid_store_name("notes") && valid_store_name("a.b-c_1"));
        for bad in ["", ".git", "a/b", "..", "x y", &"n".repeat(65)] {
            assert!(!valid_store_name(bad), "{bad:?}");
        }
        assert!(valid_agent_name("planner agent"));
        for bad in ["", "  ", "a<b", "x\ny"] {
            assert!(!valid_agent_name(bad), "{bad:?}");
        }
        let w = Writer {
            tenant: "acme".into(),
            agent: Some("planner bot".into()),
        };
        assert_eq!(w.name(), "planner bot");
        assert_eq!(w.email(), "planner-bot@acme.sandlot");
    }
}
