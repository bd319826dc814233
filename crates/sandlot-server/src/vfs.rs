//! Virtual filesystem collections and shell sessions in the daemon.
//!
//! Each tenant has its own `sandlot_vfs::Store` (collections, content, audit log)
//! under `data_dir/vfs/tenants/TENANT/`; another tenant's collections are simply
//! not in its store, so they are "not found". Sessions live in memory: a session
//! is closed on `DELETE`, when it has been idle for `vfs.session_idle_timeout`,
//! when its collection is removed, and when the daemon stops.
//!
//! ```text
//! data_dir/vfs/tenants/TENANT/collections/...   the tenant's store
//! data_dir/vfs/tenants/TENANT/audit.jsonl       its audit log
//! data_dir/vfs/uploads/TENANT/NAME[.jsonl]      an upload while it is ingested
//! ```

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sandlot_proto::api::vfs::{
    AuditEntry, CollectionView, IngestResult, SessionLimits, VfsAcl, VfsScratch, VfsSession,
    VfsSource,
};
use sandlot_runtime::host_path::{self, PinError};
use sandlot_vfs::{
    Acl, AclPolicy, AclRule, AuditFilter, AuditRecord, IngestOptions, IngestReport, Limits,
    Principal, S3Credentials, S3Options, ScratchLimits, Source, Store, StoreError,
};

use crate::config::VfsSection;
use crate::error::{ApiError, ApiResult, ErrorCode};
use crate::timefmt::rfc3339;

fn now_ms() -> u64 {
    crate::store::now_ms() as u64
}

pub use sandlot_vfs::error_chain as chain;

/// The API error of a store error. An ingest error's source is called "the source"
/// here; [`VfsService::ingest`] names it better (see [`ingest_error`]).
pub fn store_error(e: StoreError) -> ApiError {
    ingest_error(e, None)
}

/// Where an ingest read, as a tenant may be told: the host path of the source
/// (`root`: a staged upload or a daemon-side source) is never shown, only `label`
/// ("the upload", "source.path") and paths inside it.
#[derive(Debug, Clone, Copy)]
pub struct SourceLabel<'a> {
    pub root: &'a Path,
    pub label: &'a str,
}

impl SourceLabel<'_> {
    fn name(this: Option<Self>, p: &Path) -> String {
        let Some(s) = this else {
            return "the source".into();
        };
        match p.strip_prefix(s.root) {
            Ok(rel) if rel.as_os_str().is_empty() => s.label.to_string(),
            Ok(rel) => format!("{:?} in {}", rel.display().to_string(), s.label),
            Err(_) => s.label.to_string(),
        }
    }
}

/// [`store_error`] with the ingest's source named by `source`. Messages never
/// carry a host path (the tenant never gave one for an upload, and the daemon's
/// own directories are none of its business); the full chain is kept for the log.
pub fn ingest_error(e: StoreError, source: Option<SourceLabel<'_>>) -> ApiError {
    use sandlot_vfs::IngestError as I;
    match &e {
        StoreError::InvalidName { .. } => ApiError::invalid("name", e.to_string()),
        StoreError::NotFound { name } => ApiError::not_found(format!("no collection {name}")),
        StoreError::NoSuchVersion { .. } => ApiError::not_found(e.to_string()),
        StoreError::AlreadyExists { .. } => ApiError::of(ErrorCode::AlreadyExists, e.to_string()),
        StoreError::Ingest { name, source: ie } => {
            let bad = |m: String| ApiError::of(ErrorCode::BadRequest, m);
            let failed = |m: String| ApiError::of(ErrorCode::IngestFailed, m);
            let at = |p: &Path| SourceLabel::name(source, p);
            let api = match ie {
                I::BadSpec { reason, .. } => bad(format!("invalid source: {reason}")),
                I::Jsonl {
                    file,
                    line: 0,
                    reason,
                } => bad(format!("{}: {reason}", at(file))),
                I::Jsonl { file, line, reason } => {
                    bad(format!("{}, line {line}: {reason}", at(file)))
                }
                I::Manifest(m) => bad(m.to_string()),
                I::S3Disabled => bad(ie.to_string()),
                I::S3 { .. } => failed(ie.to_string()),
                I::Io { what, source: io } => failed(format!("read {}: {io}", at(Path::new(what)))),
                I::NotAFile { what } => {
                    failed(format!("read {}: not a regular file", at(Path::new(what))))
                }
                I::TooLarge { what, max } => failed(format!(
                    "read {}: larger than the largest file allowed ({max} bytes)",
                    at(Path::new(what))
                )),
                I::Git { dir, .. } => failed(format!(
                    "reading the git index of {} failed (is it a git work tree?)",
                    at(dir)
                )),
                // The collection's content store: the daemon's, not the source's.
                I::Blob(_) => return ApiError::internal(chain(&e)),
            };
            let mut api = api.with_detail(chain(&e));
            api.message = format!("ingest into {name:?}: {}", api.message);
            api
        }
        _ => ApiError::internal(chain(&e)),
    }
}

/// One open shell session.
pub struct SessionSlot {
    pub id: String,
    pub tenant: String,
    pub collection: String,
    pub principal: String,
    pub groups: Vec<String>,
    pub all_access: bool,
    pub version: u64,
    pub documents: usize,
    pub created_ms: u64,
    last_used_ms: AtomicU64,
    /// The shell; `try_lock` so that a second concurrent run is refused, not queued.
    pub shell: Mutex<sandlot_vfs::Session>,
}

impl SessionSlot {
    pub fn last_used_ms(&self) -> u64 {
        self.last_used_ms.load(Ordering::Relaxed)
    }

    pub fn touch(&self) {
        self.last_used_ms.store(now_ms(), Ordering::Relaxed);
    }
}

/// Collections and sessions of every tenant.
pub struct VfsService {
    root: PathBuf,
    cfg: VfsSection,
    stores: Mutex<HashMap<String, Arc<Store>>>,
    sessions: Mutex<HashMap<String, Arc<SessionSlot>>>,
    /// Tenant → sessions admitted and still opening (their views being built):
    /// counted with the open ones, always locked after `sessions`.
    opening: Mutex<HashMap<String, usize>>,
    /// (tenant, collection) with an ingest or removal running.
    busy: Mutex<HashSet<(String, String)>>,
}

/// A session admitted under `vfs.max_sessions` and still opening: it becomes
/// the session with [`Opening::record`]; dropped before, it gives its place back
/// (the session failed to open).
struct Opening<'a> {
    svc: &'a VfsService,
    tenant: String,
    recorded: bool,
}

impl Opening<'_> {
    /// Records `slot` as open in the step that gives the admission back: a
    /// session is never counted twice, as opening and as open.
    fn record(mut self, slot: &Arc<SessionSlot>) {
        let mut sessions = self.svc.sessions();
        sessions.insert(slot.id.clone(), slot.clone());
        unreserve(&mut self.svc.opening(), &self.tenant);
        self.recorded = true;
    }
}

impl Drop for Opening<'_> {
    fn drop(&mut self) {
        if !self.recorded {
            unreserve(&mut self.svc.opening(), &self.tenant);
        }
    }
}

fn unreserve(opening: &mut HashMap<String, usize>, tenant: &str) {
    if let Some(n) = opening.get_mut(tenant) {
        *n -= 1;
        if *n == 0 {
            opening.remove(tenant);
        }
    }
}

/// Marks a collection busy until dropped.
pub struct BusyGuard<'a> {
    svc: &'a VfsService,
    key: (String, String),
}

impl Drop for BusyGuard<'_> {
    fn drop(&mut self) {
        self.svc
            .busy
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.key);
    }
}

/// Validated ingest input.
pub struct IngestPlan {
    pub source: Option<Source>,
    pub options: Option<IngestOptions>,
    /// The upload staged for this ingest (removed afterwards).
    pub staged: Option<PathBuf>,
}

impl VfsService {
    pub fn new(data_dir: &Path, cfg: VfsSection) -> VfsService {
        // The real path: sources are read without following links, uploads included.
        let data_dir = std::fs::canonicalize(data_dir).unwrap_or_else(|_| data_dir.to_path_buf());
        VfsService {
            root: data_dir.join("vfs"),
            cfg,
            stores: Mutex::new(HashMap::new()),
            sessions: Mutex::new(HashMap::new()),
            opening: Mutex::new(HashMap::new()),
            busy: Mutex::new(HashSet::new()),
        }
    }

    pub fn config(&self) -> &VfsSection {
        &self.cfg
    }

    fn sessions(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<SessionSlot>>> {
        self.sessions.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn opening(&self) -> std::sync::MutexGuard<'_, HashMap<String, usize>> {
        self.opening.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Admits one more session of `tenant` under `vfs.max_sessions`, counting
    /// those still opening: concurrent opens never pass the cap together.
    fn admit_session(&self, tenant: &str) -> ApiResult<Opening<'_>> {
        let sessions = self.sessions();
        let mut opening = self.opening();
        let open = sessions.values().filter(|s| s.tenant == tenant).count()
            + opening.get(tenant).copied().unwrap_or(0);
        if open >= self.cfg.max_sessions {
            return Err(ApiError::quota(format!(
                "tenant {tenant} has {open} open sessions, the most allowed (vfs.max_sessions)"
            )));
        }
        *opening.entry(tenant.to_string()).or_default() += 1;
        Ok(Opening {
            svc: self,
            tenant: tenant.to_string(),
            recorded: false,
        })
    }

    fn check_tenant(tenant: &str) -> ApiResult<()> {
        if crate::config::valid_tenant(tenant) && !tenant.starts_with('.') {
            Ok(())
        } else {
            Err(ApiError::invalid(
                "tenant",
                "collections need a tenant name that does not start with '.'",
            ))
        }
    }

    /// The store of `tenant` (opened on first use).
    pub fn store(&self, tenant: &str) -> ApiResult<Arc<Store>> {
        Self::check_tenant(tenant)?;
        let mut m = self.stores.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = m.get(tenant) {
            return Ok(s.clone());
        }
        // A document (or JSONL export) read from a host source is held to the same
        // limit as an upload.
        let limits = sandlot_vfs::IngestLimits {
            max_file_bytes: self.cfg.max_upload.0,
        };
        let s = Arc::new(
            Store::open(self.root.join("tenants").join(tenant))
                .map_err(store_error)?
                .with_ingest_limits(limits),
        );
        m.insert(tenant.to_string(), s.clone());
        Ok(s)
    }

    /// Where an upload for `tenant`/`name` is staged (deterministic, so that a
    /// re-upload of the same content is recognised as unchanged).
    pub fn upload_path(&self, tenant: &str, name: &str, jsonl: bool) -> ApiResult<PathBuf> {
        Self::check_tenant(tenant)?;
        sandlot_vfs::store::validate_name(name).map_err(store_error)?;
        let dir = self.root.join("uploads").join(tenant);
        Ok(if jsonl {
            dir.join(format!("{name}.jsonl"))
        } else {
            dir.join(name)
        })
    }

    fn uploads_dir(&self) -> PathBuf {
        self.root.join("uploads")
    }

    /// The collections of `tenant` with an ingest or removal running.
    fn busy_names(&self, tenant: &str) -> Vec<String> {
        let b = self.busy.lock().unwrap_or_else(|e| e.into_inner());
        b.iter()
            .filter(|(t, _)| t == tenant)
            .map(|(_, n)| n.clone())
            .collect()
    }

    /// Marks `tenant`/`name` busy (409 if an ingest or removal is running).
    pub fn begin(&self, tenant: &str, name: &str) -> ApiResult<BusyGuard<'_>> {
        let key = (tenant.to_string(), name.to_string());
        let mut b = self.busy.lock().unwrap_or_else(|e| e.into_inner());
        if !b.insert(key.clone()) {
            return Err(ApiError::conflict(format!(
                "collection {name}: an ingest or removal is already running"
            )));
        }
        Ok(BusyGuard { svc: self, key })
    }

    /// A host path an API client names as a source, checked against
    /// `vfs.allowed_source_paths`: its real path, which the ingest then reads without
    /// following any link.
    fn allowed_host_path(&self, path: &str) -> ApiResult<PathBuf> {
        let field = "source.path";
        let p = PathBuf::from(path);
        if !p.is_absolute() || p.components().any(|c| c == std::path::Component::ParentDir) {
            return Err(ApiError::invalid(
                field,
                format!("{path:?} must be an absolute path without '..'"),
            ));
        }
        if self.cfg.allowed_source_paths.is_empty() {
            return Err(ApiError::of(ErrorCode::Forbidden, "source.path: the operator allows no daemon-side sources (vfs.allowed_source_paths); upload a tar archive or a JSONL export instead",
            ));
        }
        let forbidden = || {
            ApiError::of(ErrorCode::Forbidden, format!("source.path: {path} is not under a path the operator allows (vfs.allowed_source_paths)"),
            )
        };
        // Lexically under an allowed path first (as configured, or as resolved), then
        // resolved beneath it: a path elsewhere, or a link that leads out, is refused
        // the same whether what it names exists or not, so the answer tells nothing
        // about the host's files outside the allowed paths.
        for a in &self.cfg.allowed_source_paths {
            let Ok(root) = std::fs::canonicalize(a) else {
                continue;
            };
            let Some(rel) = p.strip_prefix(a).or_else(|_| p.strip_prefix(&root)).ok() else {
                continue;
            };
            let requested = root.join(rel);
            match host_path::pin(&requested.to_string_lossy(), Some(&root)) {
                Ok(pin) if pin.path.starts_with(&self.root) => return Err(forbidden()),
                Ok(pin) => return Ok(pin.path),
                Err(PinError::Outside { .. }) => continue,
                Err(PinError::Missing { .. }) => {
                    return Err(ApiError::invalid(
                        field,
                        format!("{path}: no such file or directory"),
                    ))
                }
                Err(e @ PinError::Changed { .. }) => {
                    return Err(ApiError::invalid(
                        field,
                        format!("{path}: changed while it was being checked"),
                    )
                    .with_detail(e))
                }
                Err(PinError::Io { source, .. }) => {
                    return Err(ApiError::invalid(field, format!("{path}: {source}")))
                }
            }
        }
        Err(forbidden())
    }

    /// An S3 endpoint an API client names, checked against `vfs.allowed_s3_endpoints`.
    fn allowed_s3_endpoint<'a>(&self, endpoint: &'a str) -> ApiResult<&'a str> {
        let ep = endpoint.trim_end_matches('/');
        if self
            .cfg
            .allowed_s3_endpoints
            .iter()
            .any(|a| a.trim_end_matches('/') == ep)
        {
            Ok(ep)
        } else {
            Err(ApiError::of(ErrorCode::Forbidden, format!("source.endpoint: {endpoint} is not an S3 endpoint the operator allows (vfs.allowed_s3_endpoints)"),
            ))
        }
    }

    /// A collection's stored source, checked again against the operator's current
    /// policy before a re-ingest reads it (a path or endpoint the operator no longer
    /// allows is refused, 403, as for a new source).
    fn recheck(&self, stored: &Source) -> ApiResult<Source> {
        let path = |p: &Path| self.allowed_host_path(&p.to_string_lossy());
        Ok(match stored {
            Source::Dir { path: p } => Source::Dir { path: path(p)? },
            Source::Git { path: p } => Source::Git { path: path(p)? },
            Source::Jsonl { path: p } => Source::Jsonl { path: path(p)? },
            Source::S3 { options, .. } => {
                self.allowed_s3_endpoint(options.endpoint.as_deref().unwrap_or_default())?;
                stored.clone()
            }
        })
    }

    /// Turns the API's source into a store source, enforcing the operator's policy.
    pub fn source(&self, s: &VfsSource) -> ApiResult<Source> {
        let host_path = |path: &str| self.allowed_host_path(path);
        Ok(match s {
            VfsSource::Dir { path } => Source::Dir {
                path: host_path(path)?,
            },
            VfsSource::Git { path } => Source::Git {
                path: host_path(path)?,
            },
            VfsSource::Jsonl { path } => Source::Jsonl {
                path: host_path(path)?,
            },
            VfsSource::S3 {
                bucket,
                prefix,
                endpoint,
                region,
                access_key_id,
                secret_access_key,
                session_token,
            } => {
                let ep = self.allowed_s3_endpoint(endpoint)?;
                if bucket.is_empty() {
                    return Err(ApiError::invalid("source.bucket", "must not be empty"));
                }
                let credentials =
                    match (access_key_id, secret_access_key) {
                        (Some(id), Some(secret)) => Some(S3Credentials {
                            access_key_id: id.clone(),
                            secret_access_key: secret.clone(),
                            session_token: session_token.clone(),
                        }),
                        (None, None) => None,
                        _ => return Err(ApiError::invalid(
                            "source.access_key_id",
                            "give both access_key_id and secret_access_key, or neither (anonymous)",
                        )),
                    };
                Source::S3 {
                    bucket: bucket.clone(),
                    prefix: prefix.trim_matches('/').to_string(),
                    options: S3Options {
                        endpoint: Some(ep.to_string()),
                        region: region.clone(),
                        allow_http: ep.starts_with("http://"),
                        credentials,
                        no_env_credentials: true,
                    },
                }
            }
        })
    }

    /// Turns the API's ACL policy into ingest options (400 naming the field).
    pub fn options(acl: &VfsAcl) -> ApiResult<IngestOptions> {
        let default = match &acl.default {
            Some(d) => Acl::parse(d).map_err(|e| ApiError::invalid("acl.default", e))?,
            None => Acl::public(),
        };
        let mut rules = Vec::with_capacity(acl.rules.len());
        for (i, r) in acl.rules.iter().enumerate() {
            if r.pattern.is_empty() {
                return Err(ApiError::invalid(
                    format!("acl.rules[{i}].pattern"),
                    "must not be empty",
                ));
            }
            rules.push(AclRule {
                pattern: r.pattern.clone(),
                acl: Acl::parse(&r.acl)
                    .map_err(|e| ApiError::invalid(format!("acl.rules[{i}].acl"), e))?,
            });
        }
        Ok(IngestOptions {
            acl: AclPolicy { default, rules },
        })
    }

    /// Runs an ingest (blocking). `create` fails on an existing collection.
    pub fn ingest(
        &self,
        tenant: &str,
        name: &str,
        plan: IngestPlan,
        create: bool,
    ) -> ApiResult<(CollectionView, IngestResult)> {
        let store = self.store(tenant)?;
        let mut plan = plan;
        let res = (|| {
            if create {
                if store.collection(name).is_ok() {
                    return Err(store_error(StoreError::AlreadyExists { name: name.into() }));
                }
                // The tenant's collections and those being created (each holds its
                // name busy, this one's too): concurrent creates never pass the cap
                // together.
                let mut names: HashSet<String> = store
                    .list()
                    .map_err(store_error)?
                    .into_iter()
                    .map(|c| c.name)
                    .collect();
                names.extend(self.busy_names(tenant));
                names.insert(name.to_string());
                if names.len() > self.cfg.max_collections {
                    return Err(ApiError::quota(format!(
                        "tenant {tenant} has {} collections, the most allowed (vfs.max_collections)",
                        self.cfg.max_collections
                    )));
                }
            } else if plan.source.is_none() {
                // The stored source of an uploaded collection is gone.
                let c = store.collection(name).map_err(store_error)?;
                let cfg = c.config().map_err(store_error)?;
                if self.is_upload(&cfg.source) {
                    return Err(ApiError::conflict(format!(
                        "collection {name} was created from an upload: re-ingest it with a new upload"
                    )));
                }
                plan.source = Some(self.recheck(&cfg.source)?);
            }
            let mode = if create {
                sandlot_vfs::IngestMode::Create
            } else {
                sandlot_vfs::IngestMode::Update
            };
            let stored;
            let source = match &plan.source {
                Some(s) => s,
                None => {
                    stored = store
                        .collection(name)
                        .and_then(|c| c.config())
                        .map_err(store_error)?
                        .source;
                    &stored
                }
            };
            let root = match source {
                Source::Dir { path } | Source::Git { path } | Source::Jsonl { path } => {
                    Some(path.as_path())
                }
                _ => None,
            };
            let label = root.map(|root| SourceLabel {
                root,
                label: if self.is_upload(source) {
                    "the upload"
                } else {
                    "source.path"
                },
            });
            let report = store
                .ingest(name, plan.source.clone(), plan.options.clone(), mode)
                .map_err(|e| ingest_error(e, label))?;
            Ok(report)
        })();
        if let Some(p) = &plan.staged {
            let _ = if p.is_dir() {
                std::fs::remove_dir_all(p)
            } else {
                std::fs::remove_file(p)
            };
        }
        let report = res?;
        Ok((self.view(tenant, name)?, ingest_result(report)))
    }

    fn is_upload(&self, s: &Source) -> bool {
        match s {
            Source::Dir { path } | Source::Jsonl { path } => path.starts_with(self.uploads_dir()),
            _ => false,
        }
    }

    fn describe(&self, s: &Source) -> String {
        match s {
            Source::Dir { .. } if self.is_upload(s) => "upload:tar".into(),
            Source::Jsonl { .. } if self.is_upload(s) => "upload:jsonl".into(),
            s => s.describe(),
        }
    }

    /// The API view of a collection.
    pub fn view(&self, tenant: &str, name: &str) -> ApiResult<CollectionView> {
        let store = self.store(tenant)?;
        let c = store.collection(name).map_err(store_error)?;
        let info = c.info().map_err(store_error)?;
        let cfg = c.config().map_err(store_error)?;
        let now = now_ms();
        let sessions = self
            .sessions()
            .values()
            .filter(|s| s.tenant == tenant && s.collection == name && !self.expired(s, now))
            .count();
        Ok(CollectionView {
            name: info.name,
            version: info.version,
            documents: info.documents,
            bytes: info.bytes,
            source: self.describe(&cfg.source),
            created_at: rfc3339(cfg.created * 1000),
            updated_at: rfc3339(info.updated * 1000),
            sessions,
        })
    }

    pub fn list(&self, tenant: &str) -> ApiResult<Vec<CollectionView>> {
        let store = self.store(tenant)?;
        let infos = store.list().map_err(store_error)?;
        infos.iter().map(|i| self.view(tenant, &i.name)).collect()
    }

    /// Removes a collection and closes its sessions.
    pub fn remove(&self, tenant: &str, name: &str) -> ApiResult<CollectionView> {
        let view = self.view(tenant, name)?;
        let _busy = self.begin(tenant, name)?;
        self.sessions()
            .retain(|_, s| !(s.tenant == tenant && s.collection == name));
        self.store(tenant)?.remove(name).map_err(store_error)?;
        Ok(view)
    }

    fn limits(&self) -> Limits {
        Limits {
            max_output_bytes: usize::try_from(self.cfg.max_output.0).unwrap_or(usize::MAX),
            max_commands: self.cfg.max_commands,
            max_run_time: self.cfg.command_timeout.0,
            ..Limits::default()
        }
    }

    /// The scratch area a session request asks for, within the operator's
    /// limits (`vfs.scratch_*`); 400 naming the field otherwise.
    pub fn scratch_limits(
        &self,
        scratch: bool,
        max_bytes: Option<u64>,
    ) -> ApiResult<Option<ScratchLimits>> {
        let max = self.cfg.scratch_max_size.0;
        match (scratch, max_bytes) {
            (false, None) => Ok(None),
            (false, Some(_)) => Err(ApiError::invalid(
                "scratch_max_bytes",
                "needs \"scratch\": true",
            )),
            (true, Some(0)) => Err(ApiError::invalid("scratch_max_bytes", "must be positive")),
            (true, Some(b)) if b > max => Err(ApiError::invalid(
                "scratch_max_bytes",
                format!("{b} exceeds the operator's maximum of {max} bytes (vfs.scratch_max_size)"),
            )),
            (true, b) => Ok(Some(ScratchLimits {
                max_bytes: b.unwrap_or(self.cfg.scratch_default_size.0.min(max)),
                max_entries: self.cfg.scratch_max_entries,
            })),
        }
    }

    /// Opens a session for `principal` with `groups` (blocking: builds the pruned view).
    pub fn open_session(
        &self,
        tenant: &str,
        collection: &str,
        principal: &str,
        groups: &[String],
        all_access: bool,
        version: Option<u64>,
    ) -> ApiResult<Arc<SessionSlot>> {
        self.open_session_with(
            tenant, collection, principal, groups, all_access, version, None,
        )
    }

    /// Opens a session, with a copy-on-write scratch area if `scratch` is given.
    #[allow(clippy::too_many_arguments)]
    pub fn open_session_with(
        &self,
        tenant: &str,
        collection: &str,
        principal: &str,
        groups: &[String],
        all_access: bool,
        version: Option<u64>,
        scratch: Option<ScratchLimits>,
    ) -> ApiResult<Arc<SessionSlot>> {
        check_principal(principal, groups)?;
        let store = self.store(tenant)?;
        let c = store.collection(collection).map_err(store_error)?;
        self.sweep();
        let admitted = self.admit_session(tenant)?;
        let mut p = Principal::new(principal, groups.iter().cloned());
        p.all_access = all_access;
        let shell = match version {
            Some(v) => c.open_session_at(v, p, self.limits()),
            None => c.open_session(p, self.limits()),
        }
        .map_err(store_error)?;
        let shell = match scratch {
            Some(l) => shell.with_scratch(l),
            None => shell,
        };
        let now = now_ms();
        let mut groups: Vec<String> = groups.to_vec();
        groups.sort();
        groups.dedup();
        let slot = Arc::new(SessionSlot {
            id: format!("vs_{}", shell.id()),
            tenant: tenant.to_string(),
            collection: collection.to_string(),
            principal: principal.to_string(),
            groups,
            all_access,
            version: shell.view().version(),
            documents: shell.view().tree().doc_count(),
            created_ms: now,
            last_used_ms: AtomicU64::new(now),
            shell: Mutex::new(shell),
        });
        admitted.record(&slot);
        Ok(slot)
    }

    fn idle(&self) -> Duration {
        self.cfg.session_idle_timeout.0
    }

    fn expired(&self, s: &SessionSlot, now: u64) -> bool {
        now.saturating_sub(s.last_used_ms()) >= self.idle().as_millis() as u64
    }

    /// The session `sid` of `tenant` on `collection` (404 otherwise, or once expired).
    pub fn session(
        &self,
        tenant: &str,
        collection: &str,
        sid: &str,
    ) -> ApiResult<Arc<SessionSlot>> {
        let nf = || ApiError::not_found(format!("no session {sid} on collection {collection}"));
        let mut m = self.sessions();
        let s = m.get(sid).cloned().ok_or_else(nf)?;
        if s.tenant != tenant || s.collection != collection {
            return Err(nf());
        }
        if self.expired(&s, now_ms()) && s.shell.try_lock().is_ok() {
            m.remove(sid);
            return Err(ApiError::not_found(format!(
                "session {sid} expired after {} idle",
                crate::config::fmt_secs(self.idle())
            )));
        }
        Ok(s)
    }

    /// Closes a session (404 if unknown).
    pub fn close(&self, tenant: &str, collection: &str, sid: &str) -> ApiResult<()> {
        self.session(tenant, collection, sid)?;
        self.sessions().remove(sid);
        Ok(())
    }

    /// Closes idle sessions; returns how many.
    pub fn sweep(&self) -> usize {
        let now = now_ms();
        let mut m = self.sessions();
        let before = m.len();
        // A session running a command (locked) is not idle.
        m.retain(|_, s| !(self.expired(s, now) && s.shell.try_lock().is_ok()));
        before - m.len()
    }

    /// How often the sweeper runs.
    pub fn sweep_interval(&self) -> Duration {
        (self.idle() / 4).clamp(Duration::from_millis(250), Duration::from_secs(30))
    }

    /// The API view of a session.
    pub fn session_view(&self, s: &SessionSlot) -> VfsSession {
        let (cwd, commands_run, scratch) = match s.shell.try_lock() {
            Ok(sh) => (
                sh.cwd().to_string(),
                sh.commands_run(),
                sh.scratch_usage().map(|u| VfsScratch {
                    used_bytes: u.bytes,
                    entries: u.entries,
                    max_bytes: u.limits.max_bytes,
                    max_entries: u.limits.max_entries,
                }),
            ),
            Err(_) => ("(running)".to_string(), 0, None),
        };
        let last = s.last_used_ms();
        VfsSession {
            id: s.id.clone(),
            collection: s.collection.clone(),
            version: s.version,
            principal: s.principal.clone(),
            groups: s.groups.clone(),
            all_access: s.all_access,
            documents: s.documents,
            cwd,
            commands_run,
            created_at: rfc3339(s.created_ms as i64),
            last_used_at: rfc3339(last as i64),
            expires_at: rfc3339((last + self.idle().as_millis() as u64) as i64),
            limits: SessionLimits {
                max_output_bytes: self.cfg.max_output.0,
                max_commands: self.cfg.max_commands,
                command_timeout_secs: self.cfg.command_timeout.0.as_secs_f64(),
                idle_timeout_secs: self.idle().as_secs_f64(),
            },
            scratch,
        }
    }

    /// Audit records of a collection.
    pub fn audit(
        &self,
        tenant: &str,
        collection: &str,
        principal: Option<String>,
        last: Option<usize>,
    ) -> ApiResult<Vec<AuditEntry>> {
        let store = self.store(tenant)?;
        // The collection must exist for the caller (another tenant's is 404).
        store.collection(collection).map_err(store_error)?;
        let recs = store
            .audit_log()
            .read(&AuditFilter {
                collection: Some(collection.to_string()),
                principal,
                last,
            })
            .map_err(|e| ApiError::internal(chain(&e)))?;
        Ok(recs.into_iter().map(audit_entry).collect())
    }

    /// Removes uploads left staged by a daemon that died mid-ingest.
    pub fn sweep_uploads(&self) {
        let _ = std::fs::remove_dir_all(self.uploads_dir());
    }
}

/// Checks a session's principal name and groups.
pub fn check_principal(principal: &str, groups: &[String]) -> ApiResult<()> {
    let ok = |s: &str| {
        !s.is_empty()
            && s.len() <= 128
            && !s
                .chars()
                .any(|c| c.is_control() || c.is_whitespace() || c == ',')
    };
    if !ok(principal) {
        return Err(ApiError::invalid(
            "principal",
            "1 to 128 characters without spaces, commas or control characters",
        ));
    }
    for (i, g) in groups.iter().enumerate() {
        if !ok(g) {
            return Err(ApiError::invalid(
                format!("groups[{i}]"),
                "1 to 128 characters without spaces, commas or control characters",
            ));
        }
    }
    Ok(())
}

/// The API's account of an audit record (the daemon's answer; `sandlot vfs --local log`
/// prints it too).
pub fn audit_entry(r: AuditRecord) -> AuditEntry {
    AuditEntry {
        at: rfc3339(r.ts_ms as i64),
        collection: r.collection,
        version: r.version,
        session: format!("vs_{}", r.session),
        principal: r.principal,
        command: r.command,
        exit_code: r.exit_code,
        stdout_bytes: r.stdout_bytes,
        stderr_bytes: r.stderr_bytes,
        truncated: r.truncated,
        duration_ms: r.duration_us as f64 / 1000.0,
    }
}

/// The API's account of an ingest (the daemon's answer; `sandlot vfs --local` prints it too).
pub fn ingest_result(r: IngestReport) -> IngestResult {
    IngestResult {
        version: r.version,
        previous_version: r.previous_version,
        changed: r.changed,
        added: r.added,
        updated: r.updated,
        removed: r.removed,
        unchanged: r.unchanged,
        fetched: r.fetched,
        bytes_fetched: r.bytes_fetched,
        documents: r.documents,
        bytes: r.bytes,
        skipped: r.skipped,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::StatusCode;

    fn svc(dir: &Path, cfg: VfsSection) -> VfsService {
        VfsService::new(dir, cfg)
    }

    #[test]
    fn ingest_errors_never_name_the_sources_host_path() {
        use sandlot_vfs::IngestError as I;
        let ingest = |source| StoreError::Ingest {
            name: "kb".into(),
            source,
        };
        let upload = Path::new("/var/lib/sandlot/vfs/uploads/acme/kb.jsonl");
        let label = Some(SourceLabel {
            root: upload,
            label: "the upload",
        });
        let e = ingest_error(
            ingest(I::Jsonl {
                file: upload.to_path_buf(),
                line: 3,
                reason: "invalid JSON".into(),
            }),
            label,
        );
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert_eq!(
            e.message,
            "ingest into \"kb\": the upload, line 3: invalid JSON"
        );
        assert!(
            e.internal.unwrap().contains("/var/lib"),
            "the log has the path"
        );
        let dir = Path::new("/srv/site");
        let e = ingest_error(
            ingest(I::Io {
                what: "/srv/site/a/b.txt".into(),
                source: std::io::Error::from(std::io::ErrorKind::PermissionDenied),
            }),
            Some(SourceLabel {
                root: dir,
                label: "source.path",
            }),
        );
        assert_eq!(e.status, StatusCode::UNPROCESSABLE_ENTITY);
        assert!(
            e.message.contains("\"a/b.txt\" in source.path"),
            "{}",
            e.message
        );
        assert!(!e.message.contains("/srv"), "{}", e.message);
        // Without a label (no source known), still no path.
        let e = store_error(ingest(I::Git {
            dir: dir.to_path_buf(),
            reason: "fatal: not a git repository: /srv/site".into(),
        }));
        assert!(!e.message.contains("/srv"), "{}", e.message);
        // The collection's own content store is the daemon's business.
        let e = store_error(ingest(I::Blob(sandlot_vfs::blob::BlobError::InvalidHash(
            "x".into(),
        ))));
        assert_eq!(e.status, StatusCode::INTERNAL_SERVER_ERROR);
    }

    #[test]
    fn acl_policy_errors_name_the_field() {
        let e = VfsService::options(&VfsAcl {
            default: Some("group:a b".into()),
            rules: vec![],
        })
        .unwrap_err();
        assert_eq!(e.field.as_deref(), Some("acl.default"), "{e}");
        let e = VfsService::options(&VfsAcl {
            default: None,
            rules: vec![sandlot_proto::api::vfs::VfsAclRule {
                pattern: String::new(),
                acl: "public".into(),
            }],
        })
        .unwrap_err();
        assert_eq!(e.field.as_deref(), Some("acl.rules[0].pattern"), "{e}");
        let o = VfsService::options(&VfsAcl {
            default: Some("none".into()),
            rules: vec![sandlot_proto::api::vfs::VfsAclRule {
                pattern: "internal/**".into(),
                acl: "group:eng".into(),
            }],
        })
        .unwrap();
        assert!(!o.acl.default.public && o.acl.default.groups.is_empty());
        assert_eq!(o.acl.rules[0].acl.groups, vec!["eng".to_string()]);
    }

    /// A create or an open still in progress counts: the caps hold for requests
    /// that run at once, not only one after the other.
    #[test]
    fn creates_and_opens_in_progress_count_against_the_tenant_caps() {
        let tmp = std::env::temp_dir().join(format!("vfs-caps-{}", std::process::id()));
        let docs = tmp.join("docs");
        std::fs::create_dir_all(&docs).unwrap();
        std::fs::write(docs.join("a.md"), "alpha").unwrap();
        let s = svc(
            &tmp.join("data"),
            VfsSection {
                allowed_source_paths: vec![docs.clone()],
                max_collections: 2,
                max_sessions: 2,
                ..Default::default()
            },
        );
        let plan = || IngestPlan {
            source: Some(
                s.source(&VfsSource::Dir {
                    path: docs.display().to_string(),
                })
                .unwrap(),
            ),
            options: None,
            staged: None,
        };
        s.ingest("t", "kb", plan(), true).unwrap();
        // Another create of the tenant is running: a third collection is refused.
        let running = s.begin("t", "other").unwrap();
        let e = s.ingest("t", "kb2", plan(), true).unwrap_err();
        assert_eq!(e.status, StatusCode::TOO_MANY_REQUESTS, "{e}");
        assert!(e.message.contains("vfs.max_collections"), "{e}");
        // Another tenant's creates are not counted.
        let theirs = s.begin("u", "x").unwrap();
        drop(running);
        s.ingest("t", "kb2", plan(), true).unwrap();
        drop(theirs);

        let open = || s.open_session("t", "kb", "alice", &[], false, None);
        let refused = || match open() {
            Ok(_) => panic!("a session opened past the cap"),
            Err(e) => e,
        };
        let first = open().unwrap();
        // A second open is building its view: a third is refused meanwhile.
        let opening = s.admit_session("t").unwrap();
        let e = refused();
        assert_eq!(e.status, StatusCode::TOO_MANY_REQUESTS, "{e}");
        assert!(e.message.contains("2 open sessions"), "{e}");
        // Another tenant's sessions are counted apart: its own open succeeds.
        s.ingest("u", "kb", plan(), true).unwrap();
        let _theirs = s
            .open_session("u", "kb", "alice", &[], false, None)
            .unwrap();
        let _theirs_opening = s.admit_session("u").unwrap();
        // Given back (that open failed), its place is free again; then full.
        drop(opening);
        let second = open().unwrap();
        assert_ne!(first.id, second.id);
        let e = refused();
        assert!(e.message.contains("2 open sessions"), "{e}");
        let _ = std::fs::remove_dir_all(&tmp);
    }

    #[test]
    fn daemon_side_sources_follow_the_operator_policy() {
        let tmp = std::env::temp_dir().join(format!("vfs-svc-{}", std::process::id()));
        let allowed = tmp.join("allowed");
        let other = tmp.join("other");
        std::fs::create_dir_all(&allowed).unwrap();
        std::fs::create_dir_all(&other).unwrap();
        let closed = svc(&tmp.join("data"), VfsSection::default());
        let e = closed
            .source(&VfsSource::Dir {
                path: allowed.display().to_string(),
            })
            .unwrap_err();
        assert_eq!(e.status, StatusCode::FORBIDDEN, "{e}");
        let open = svc(
            &tmp.join("data"),
            VfsSection {
                allowed_source_paths: vec![allowed.clone()],
                allowed_s3_endpoints: vec!["http://127.0.0.1:9000".into()],
                ..Default::default()
            },
        );
        assert!(open
            .source(&VfsSource::Dir {
                path: allowed.display().to_string()
            })
            .is_ok());
        let e = open
            .source(&VfsSource::Dir {
                path: other.display().to_string(),
            })
            .unwrap_err();
        assert_eq!(e.status, StatusCode::FORBIDDEN, "{e}");
        // `..` cannot climb out of an allowed path.
        let e = open
            .source(&VfsSource::Git {
                path: format!("{}/../other", allowed.display()),
            })
            .unwrap_err();
        assert_eq!(e.field.as_deref(), Some("source.path"), "{e}");
        // A symlink inside the allowed path to outside it is refused too.
        std::os::unix::fs::symlink(&other, allowed.join("link")).unwrap();
        let e = open
            .source(&VfsSource::Dir {
                path: allowed.join("link").display().to_string(),
            })
            .unwrap_err();
        assert_eq!(e.status, StatusCode::FORBIDDEN, "{e}");
        let s3 = |ep: &str| VfsSource::S3 {
            bucket: "b".into(),
            prefix: "p/".into(),
            endpoint: ep.into(),
            region: None,
            access_key_id: None,
            secret_access_key: None,
            session_token: None,
        };
        assert_eq!(
            open.source(&s3("http://10.0.0.1:9000")).unwrap_err().status,
            StatusCode::FORBIDDEN
        );
        match open.source(&s3("http://127.0.0.1:9000/")).unwrap() {
            Source::S3 {
                options, prefix, ..
            } => {
                assert!(options.no_env_credentials && options.allow_http);
                assert_eq!(prefix, "p");
            }
            s => panic!("{s:?}"),
        }
        std::fs::remove_dir_all(&tmp).unwrap();
    }

    #[test]
    fn scratch_requests_stay_within_the_operator_limits() {
        let v = svc(
            Path::new("/nonexistent"),
            VfsSection {
                scratch_default_size: sandlot_proto::units::ByteSize(1000),
                scratch_max_size: sandlot_proto::units::ByteSize(5000),
                scratch_max_entries: 7,
                ..Default::default()
            },
        );
        assert_eq!(v.scratch_limits(false, None).unwrap(), None);
        assert_eq!(
            v.scratch_limits(true, None).unwrap(),
            Some(ScratchLimits {
                max_bytes: 1000,
                max_entries: 7
            })
        );
        assert_eq!(
            v.scratch_limits(true, Some(5000))
                .unwrap()
                .unwrap()
                .max_bytes,
            5000
        );
        for (scratch, bytes) in [(true, Some(5001)), (true, Some(0)), (false, Some(10))] {
            let e = v.scratch_limits(scratch, bytes).unwrap_err();
            assert_eq!(e.field.as_deref(), Some("scratch_max_bytes"), "{e}");
            assert_eq!(e.status, StatusCode::BAD_REQUEST, "{e}");
        }
    }

    #[test]
    fn principals_are_checked() {
        assert!(check_principal("alice", &["eng".into()]).is_ok());
        assert_eq!(
            check_principal("", &[]).unwrap_err().field.as_deref(),
            Some("principal")
        );
        assert_eq!(
            check_principal("a", &["ok".into(), "a,b".into()])
                .unwrap_err()
                .field
                .as_deref(),
            Some("groups[1]")
        );
    }
}
