//! Image builds in the daemon (`POST /v1/images/build`): the context arrives as a
//! tar, the spec (TOML or the Dockerfile subset, parsed by `sandlot_store::build`)
//! inside it. Each step produces an image cached by its key: `run` steps run in a
//! real sandbox started from the previous step's image (network only when the
//! build asks for it) and their writable layer becomes the new layer, as a
//! snapshot does; `copy` steps pack the context files into a layer; `env`,
//! `workdir` and `user` change the config only. A failed step leaves the images
//! of the steps before it cached and tags nothing.
//!
//! A tenant's build (over TCP) is the tenant's throughout: its base is looked up
//! by the tenant's names, its run steps are the tenant's sandboxes (quotas and the
//! network ceiling apply), every image it makes belongs to the tenant, its cache
//! entries are the tenant's own (another tenant never gets a step image it did
//! not make), and its tag goes in the tenant's namespace. The operator's limits
//! (`[images]` `build_timeout`, `build_disk`, `build_memory`) bound every build.

use std::collections::BTreeMap;
use std::fs;
use std::io::Read;
use std::path::{Component, Path};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sandlot_proto::api::ExecBody;
use sandlot_proto::spec::{NetworkMode, SandboxSpec};
use sandlot_store::build::{self, BuildSpec, Step};
use sandlot_store::{Budget, Commit, ImageConfig, ImageInfo, ImageName};
use serde_json::{json, Value};

use crate::error::{ApiError, ErrorCode};
use crate::images::store_error;
use crate::process::OutEvent;
use crate::sandbox::{self, CreateParams};
use crate::state::AppState;
use crate::store::EndReason;

/// Whom a build is for.
#[derive(Debug, Clone)]
pub struct Builder {
    /// The tenant its run steps' sandboxes belong to.
    pub tenant: String,
    /// The tenant its images belong to; `None`: the operator's (shared) build.
    pub owner: Option<String>,
    /// Steps from this index (0-based) on run again whatever the cache holds
    /// (E2B's `force` and `skip_cache`); `None`: every step may be a cache hit.
    pub fresh_from: Option<usize>,
}

impl Builder {
    fn viewer(&self) -> sandlot_store::Viewer<'_> {
        crate::images::viewer(self.owner.as_deref())
    }

    /// The build cache key of a step for this builder: a tenant's keys are its own.
    fn cache_key(&self, key: String) -> String {
        match &self.owner {
            Some(t) => format!("tenant/{t}/{key}"),
            None => key,
        }
    }

    fn commit<'a>(&'a self, config: &'a ImageConfig, comment: &'a str) -> Commit<'a> {
        Commit {
            config,
            comment,
            source: "build",
            tag: None,
            owner: self.owner.as_deref(),
        }
    }
}

/// The spec of a run step's sandbox on `image`: the operator's `build_memory` and
/// `build_disk`, the network open only when the build asks for it, the operator's
/// default isolation (which is within the minimum and ceiling).
pub fn step_spec(
    image: &str,
    network: bool,
    cfg: &crate::config::ImagesSection,
    isolation: sandlot_proto::spec::Isolation,
) -> SandboxSpec {
    let mut spec = SandboxSpec {
        image: image.to_string(),
        isolation,
        ..Default::default()
    };
    spec.resources.disk = cfg.build_disk;
    spec.resources.memory = cfg.build_memory;
    if network {
        spec.network.mode = NetworkMode::Open;
    }
    spec
}

/// Directories a build context may nest: copy steps walk it recursively.
const MAX_CONTEXT_DEPTH: usize = 128;

/// Why a context entry does not unpack, as far as the tenant needs to know.
const UNPACK_HINT: &str = "a file where a directory is needed, or a path through a link";

/// Extracts a build context tar into `dir` (regular files, directories and
/// symlinks; anything escaping `dir` is refused). What it expands to (a sparse
/// entry at its full size) is bounded by `limit`: every copy step reads it.
pub fn extract_context(
    tar_path: &Path,
    dir: &Path,
    limit: &sandlot_store::SizeLimit,
) -> Result<(), ApiError> {
    let f =
        fs::File::open(tar_path).map_err(|e| ApiError::internal(format!("open context: {e}")))?;
    extract_context_from(std::io::BufReader::new(f), dir, limit)
}

/// [`extract_context`] of a tar read from `reader` (E2B's uploads come gzipped:
/// the caller bounds what the decoder yields).
pub fn extract_context_from<R: Read>(
    reader: R,
    dir: &Path,
    limit: &sandlot_store::SizeLimit,
) -> Result<(), ApiError> {
    let mut budget = Budget::new(Some(limit), "the build context");
    let configure = |ar: &mut tar::Archive<_>| {
        ar.set_preserve_permissions(true);
        ar.set_overwrite(true);
    };
    let unreadable = |e| ApiError::bad_request(format!("build context tar: {e}"));
    sandlot_store::tar_bound::for_each_entry(reader, configure, unreadable, |e| {
        let p = e
            .path()
            .map_err(|e| ApiError::bad_request(format!("build context tar: {e}")))?
            .into_owned();
        if p.components()
            .any(|c| !matches!(c, Component::Normal(_) | Component::CurDir))
        {
            return Err(ApiError::invalid(
                "context",
                format!("entry {} escapes the build context", p.display()),
            ));
        }
        if p.components().count() > MAX_CONTEXT_DEPTH {
            return Err(ApiError::invalid(
                "context",
                format!("entries nest more than {MAX_CONTEXT_DEPTH} directories deep"),
            ));
        }
        let ty = e.header().entry_type();
        if !(ty.is_file() || ty.is_dir() || ty.is_symlink() || ty.is_gnu_sparse()) {
            return Ok(());
        }
        budget
            .charge(sandlot_store::layer::entry_cost(
                p.as_os_str().len(),
                0,
                e.size(),
            ))
            .map_err(|err| crate::images::store_error(err.into()))?;
        // unpack_in refuses paths that leave `dir` through symlinks. Its error
        // names the daemon's staging path: the tenant is told the entry, the log
        // has the rest.
        e.unpack_in(dir).map_err(|err| {
            tracing::info!(entry = %crate::routes::one_line(&p.display().to_string()), "build context entry not unpacked: {}", crate::routes::one_line(&err.to_string()));
            ApiError::bad_request(format!(
                "build context entry {} cannot be unpacked ({UNPACK_HINT})",
                p.display()
            ))
        })?;
        Ok(())
    })
}

/// Reads and removes the spec file the CLI put in the context.
pub fn take_spec(ctx: &Path, name: &str, network: bool) -> Result<BuildSpec, ApiError> {
    let rel = Path::new(name);
    if rel.components().any(|c| !matches!(c, Component::Normal(_))) {
        return Err(ApiError::invalid(
            "file",
            format!("{name:?} must be a path inside the context"),
        ));
    }
    // The context is the client's: the spec is a file of it, not a link to a host
    // file (whose text would come back in the parse error).
    if sandlot_store::link_on_the_way(ctx, rel, true).is_some() {
        return Err(ApiError::invalid(
            "file",
            format!("build spec {name}: a symbolic link in the context, not a file"),
        ));
    }
    let p = ctx.join(rel);
    let mut text = String::new();
    fs::File::open(&p)
        .and_then(|mut f| f.read_to_string(&mut text))
        .map_err(|e| ApiError::invalid("file", format!("build spec {name}: {e}")))?;
    if name.starts_with(".sandlot-build/") {
        let _ = fs::remove_dir_all(ctx.join(".sandlot-build"));
    }
    let toml = name.ends_with(".toml");
    let spec = if toml {
        build::parse_toml(&text).map(|mut s| {
            s.network |= network;
            s
        })
    } else {
        build::parse_dockerfile(&text, network)
    };
    spec.map_err(|e| ApiError::invalid("spec", e.to_string()))
}

/// The host's Debian mirror (from its apt sources: never a built-in hostname).
fn host_debian_mirror() -> Option<String> {
    let mut files = vec![Path::new("/etc/apt/sources.list").to_path_buf()];
    if let Ok(rd) = fs::read_dir("/etc/apt/sources.list.d") {
        let mut v: Vec<_> = rd
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "list" || x == "sources"))
            .collect();
        v.sort();
        files.extend(v);
    }
    for f in files {
        let Ok(t) = fs::read_to_string(&f) else {
            continue;
        };
        for line in t.lines() {
            let l = line.trim();
            if let Some(rest) = l.strip_prefix("deb ") {
                let uri = rest
                    .split_whitespace()
                    .find(|w| w.contains("://"))
                    .map(str::to_string);
                if let Some(u) = uri.filter(|u| !u.contains("security")) {
                    return Some(u);
                }
            }
            if let Some(rest) = l.strip_prefix("URIs:") {
                if let Some(u) = rest.split_whitespace().find(|u| !u.contains("security")) {
                    return Some(u.to_string());
                }
            }
        }
    }
    None
}

/// `debian:SUITE`: built with mmdebstrap from the host's own mirror, cached as
/// the image `debian:SUITE`.
fn debian_base(state: &AppState, suite: &str, log: &dyn Fn(Value)) -> Result<ImageInfo, ApiError> {
    if !suite
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    {
        return Err(ApiError::invalid(
            "from",
            format!("debian suite {suite:?} is not a suite name"),
        ));
    }
    let mirror = host_debian_mirror().ok_or_else(|| {
        ApiError::invalid("from", "debian bases are built from the host's apt sources, and /etc/apt names no Debian mirror")
    })?;
    let store = &state.images.store;
    let dir = store.tmp_path("debootstrap");
    log(
        json!({"type": "log", "line": format!("building debian:{suite} with mmdebstrap from the host's apt sources")}),
    );
    let out = std::process::Command::new("mmdebstrap")
        .args(["--variant=minbase", "--mode=root", "--quiet", suite])
        .arg(&dir)
        .arg(format!("deb {mirror} {suite} main"))
        .output()
        .map_err(|e| {
            ApiError::internal(format!(
                "run mmdebstrap (scripts/setup.d/70-images.sh installs it): {e}"
            ))
        });
    let out = match out {
        Ok(o) => o,
        Err(e) => {
            let _ = fs::remove_dir_all(&dir);
            return Err(e);
        }
    };
    if !out.status.success() {
        let _ = fs::remove_dir_all(&dir);
        return Err(ApiError::internal(format!(
            "mmdebstrap {suite} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    let cfg = ImageConfig {
        env: vec!["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into()],
        ..Default::default()
    };
    let name =
        ImageName::parse(&format!("debian:{suite}")).map_err(|e| ApiError::invalid("from", e))?;
    let r = store
        .import_dir(&dir, &cfg, Some(&name))
        .map_err(store_error);
    let _ = fs::remove_dir_all(&dir);
    r
}

fn resolve_base(
    state: &AppState,
    who: &Builder,
    from: &str,
    log: &dyn Fn(Value),
) -> Result<ImageInfo, ApiError> {
    match state.images.store.resolve_as(who.viewer(), from) {
        Ok(i) => Ok(i),
        // mmdebstrap runs on the host, as root, with the host's network: only for
        // the operator.
        Err(sandlot_store::StoreError::NotFound(_))
            if from.starts_with("debian:") && who.owner.is_none() =>
        {
            debian_base(state, &from["debian:".len()..], log)
        }
        Err(e @ sandlot_store::StoreError::NotFound(_)) if from.starts_with("debian:") => {
            Err(ApiError::invalid(
                "from",
                format!("{e}: the operator makes debian bases (a build of theirs from {from})"),
            ))
        }
        Err(e) => Err(ApiError::invalid("from", e.to_string())),
    }
}

/// An image that is the built-in `host` image with `config` (its user, working
/// directory, variables) for `who`: one empty layer marked to go on top of the
/// `host` image, as a snapshot of a `host` sandbox is. A build from it (E2B's
/// base template) runs its steps in `host` sandboxes. Made once per builder and
/// config, then found in the builder's cache.
pub fn host_base(
    state: &AppState,
    who: &Builder,
    config: &ImageConfig,
) -> Result<ImageInfo, ApiError> {
    let config = ImageConfig {
        host_base: true,
        ..config.clone()
    };
    let text = format!(
        "FROM host {}",
        serde_json::to_string(&config).unwrap_or_default()
    );
    let key = who.cache_key(format!(
        "host-base:{}",
        sandlot_store::Digest::of(text.as_bytes())
    ));
    let store = &state.images.store;
    if let Some(hit) = store
        .cached_step(&key)
        .map_err(store_error)?
        .filter(|hit| who.viewer().sees(hit))
    {
        return Ok(hit);
    }
    let dir = store.tmp_path("host-base");
    fs::create_dir(&dir).map_err(|e| ApiError::internal(format!("stage host base: {e}")))?;
    let limit = state.images.limit(None);
    let r = store
        .pack_dir(&dir, &mut Budget::new(Some(&limit), "the host base"))
        .map_err(store_error)
        .and_then(|p| {
            let _committing = state.images.committing();
            store
                .commit_packed_root(p, &who.commit(&config, "the host image"))
                .map_err(store_error)
        });
    let _ = fs::remove_dir_all(&dir);
    let img = r?;
    store.cache_step(&key, &img.id).map_err(store_error)?;
    Ok(img)
}

/// The error of a build that ran past the operator's `images.build_timeout`.
fn timed_out(limit: Duration) -> ApiError {
    ApiError::of(
        ErrorCode::BuildFailed,
        format!(
            "the build took longer than the operator's limit (images.build_timeout = {})",
            crate::config::fmt_secs(limit)
        ),
    )
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(ApiError::internal)?
}

/// Runs a build; `send` gets the progress lines. Returns the final image.
pub async fn run(
    state: Arc<AppState>,
    who: Builder,
    spec: BuildSpec,
    ctx: std::path::PathBuf,
    tag: Option<ImageName>,
    send: Arc<dyn Fn(Value) + Send + Sync>,
) -> Result<ImageInfo, ApiError> {
    let t0 = Instant::now();
    let limit = state.cfg.images.build_timeout.0;
    let deadline = t0 + limit;
    let (st, w2, from, s2) = (state.clone(), who.clone(), spec.from.clone(), send.clone());
    let mut cur = blocking(move || resolve_base(&st, &w2, &from, &*s2)).await?;
    let total = spec.steps.len();
    for (i, (origin, step)) in spec.steps.iter().enumerate() {
        if Instant::now() >= deadline {
            return Err(timed_out(limit));
        }
        let text = step.text();
        let copied = match step {
            Step::Copy { src, .. } => {
                let (c, o, s) = (ctx.clone(), origin.clone(), src.clone());
                Some(
                    blocking(move || {
                        build::hash_copy_sources(&c, &o, &s)
                            .map_err(|e| ApiError::invalid("context", e.to_string()))
                    })
                    .await?,
                )
            }
            _ => None,
        };
        let key = who.cache_key(build::step_key(
            &cur.id,
            step,
            spec.network,
            copied.as_ref(),
        ));
        let st = state.clone();
        let k2 = key.clone();
        let fresh = who.fresh_from.is_some_and(|f| i >= f);
        let hit = if fresh {
            None
        } else {
            blocking(move || st.images.store.cached_step(&k2).map_err(store_error))
                .await?
                .filter(|hit| who.viewer().sees(hit))
        };
        if let Some(hit) = hit {
            send(
                json!({"type": "step", "index": i + 1, "of": total, "text": text, "cached": true, "image": hit.id.to_string()}),
            );
            cur = hit;
            continue;
        }
        send(json!({"type": "step", "index": i + 1, "of": total, "text": text, "cached": false}));
        let ts = Instant::now();
        let next = match step {
            Step::Env(_) | Step::Workdir(_) | Step::User(_) => {
                let mut cfg = cur.config.clone();
                match step {
                    Step::Env(kv) => {
                        for (k, v) in kv {
                            cfg.env
                                .retain(|e| e.split_once('=').map(|x| x.0) != Some(k.as_str()));
                            cfg.env.push(format!("{k}={v}"));
                        }
                    }
                    Step::Workdir(w) => cfg.workdir = Some(w.clone()),
                    Step::User(u) => cfg.user = Some(u.clone()),
                    _ => {}
                }
                let (st, base, w) = (state.clone(), cur.clone(), who.clone());
                blocking(move || {
                    st.images
                        .store
                        .commit_config(&base, &w.commit(&cfg, &text))
                        .map_err(store_error)
                })
                .await?
            }
            Step::Copy { src, dest } => {
                let (st, base, c, o, s, d, w) = (
                    state.clone(),
                    cur.clone(),
                    ctx.clone(),
                    origin.clone(),
                    src.clone(),
                    dest.clone(),
                    who.clone(),
                );
                blocking(move || {
                    let store = &st.images.store;
                    let layer = store.tmp_path("copy");
                    fs::create_dir(&layer)
                        .map_err(|e| ApiError::internal(format!("stage copy: {e}")))?;
                    let limit = st.images.limit(None);
                    let what = format!("{o} ({text})");
                    let workdir = base.config.workdir.as_deref();
                    let r = build::stage_copy(&c, &o, &s, &d, workdir, &layer)
                        .and_then(|_| {
                            build::inherit_dirs(&layer, &d, workdir, &store.layer_dirs(&base))
                        })
                        .map_err(|e| ApiError::invalid("context", e.to_string()))
                        .and_then(|_| {
                            store
                                .pack_dir(&layer, &mut Budget::new(Some(&limit), &what))
                                .map_err(store_error)
                        })
                        .and_then(|p| {
                            let _committing = st.images.committing();
                            store
                                .commit_packed(&base, p, &w.commit(&base.config, &text))
                                .map_err(store_error)
                        });
                    let _ = fs::remove_dir_all(&layer);
                    r
                })
                .await?
            }
            _ => {
                let r = run_step(
                    &state,
                    &who,
                    deadline,
                    &cur,
                    origin,
                    step,
                    spec.network,
                    &send,
                )
                .await;
                match r {
                    Err(_) if Instant::now() >= deadline => return Err(timed_out(limit)),
                    r => r?,
                }
            }
        };
        send(
            json!({"type": "log", "line": format!("  -> {} ({:.2}s)", short(&next.id.to_string()), ts.elapsed().as_secs_f64())}),
        );
        let (st, id) = (state.clone(), next.id);
        blocking(move || st.images.store.cache_step(&key, &id).map_err(store_error)).await?;
        cur = next;
    }
    if let Some(t) = tag {
        let (st, id, w) = (state.clone(), cur.id, who.clone());
        cur = blocking(move || {
            let tag = sandlot_store::ScopedTag {
                tenant: w.owner.as_deref(),
                name: &t,
            };
            st.images.store.tag_image(&id, tag).map_err(store_error)
        })
        .await?;
    }
    tracing::info!(image = %cur.id, steps = total, secs = t0.elapsed().as_secs_f64(), "build done");
    Ok(cur)
}

fn short(id: &str) -> String {
    id.trim_start_matches("sha256:").chars().take(12).collect()
}

/// A running step: a sandbox from `base`, the command, its output streamed as
/// `log` lines, then its writable layer committed on `base`.
#[allow(clippy::too_many_arguments)]
async fn run_step(
    state: &Arc<AppState>,
    who: &Builder,
    deadline: Instant,
    base: &ImageInfo,
    origin: &str,
    step: &Step,
    network: bool,
    send: &Arc<dyn Fn(Value) + Send + Sync>,
) -> Result<ImageInfo, ApiError> {
    let argv = step.argv().expect("a running step");
    let spec = step_spec(
        &base.id.to_string(),
        network,
        &state.cfg.images,
        state.cfg.isolation.default,
    );
    // The sandbox ends at the build's deadline at the latest.
    let timeout = deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_secs(1));
    let mut tags = BTreeMap::new();
    tags.insert("sandlot.build".to_string(), "1".to_string());
    let rec = sandbox::create(
        state,
        CreateParams {
            tenant: who.tenant.clone(),
            // The base is named by id, looked up as the builder sees images.
            scope: who.owner.clone(),
            name: None,
            spec,
            tags,
            metadata: BTreeMap::new(),
            timeout,
            idle_timeout: None,
            lifecycle: Default::default(),
        },
    )
    .await?;
    let r = run_in(state, who, &rec.id, base, origin, step, argv, send).await;
    if let Some(h) = state.handle(&rec.id) {
        h.request_stop(EndReason::Deleted);
        h.stopped().await;
    }
    r
}

/// Bytes of one line of a step's output kept (the rest of a longer one, up to
/// its newline, is dropped).
const MAX_STEP_LINE: usize = 16 << 10;

/// A step's output split into lines as it arrives: only the new bytes are
/// scanned, and a line is cut at [`MAX_STEP_LINE`] bytes (marked `[cut]`), so
/// output without newlines holds at most that much.
#[derive(Default)]
struct StepLines {
    pending: Vec<u8>,
    cut: bool,
}

impl StepLines {
    /// Takes a chunk of output; `line` gets each line it completes.
    fn push(&mut self, mut chunk: &[u8], mut line: impl FnMut(String)) {
        while let Some(i) = chunk.iter().position(|&b| b == b'\n') {
            self.keep(&chunk[..i]);
            line(self.take());
            chunk = &chunk[i + 1..];
        }
        self.keep(chunk);
    }

    /// The last line when the output did not end with a newline.
    fn finish(mut self) -> Option<String> {
        (!self.pending.is_empty() || self.cut).then(|| self.take())
    }

    fn keep(&mut self, part: &[u8]) {
        if self.cut {
            return;
        }
        let room = MAX_STEP_LINE - self.pending.len();
        if part.len() > room {
            self.pending.extend_from_slice(&part[..room]);
            self.cut = true;
        } else {
            self.pending.extend_from_slice(part);
        }
    }

    fn take(&mut self) -> String {
        let text = String::from_utf8_lossy(&self.pending);
        let mut line = String::with_capacity(text.len() + 6);
        line.push_str(text.trim_end());
        if self.cut {
            line.push_str(" [cut]");
        }
        self.pending.clear();
        self.cut = false;
        line
    }
}

#[allow(clippy::too_many_arguments)]
async fn run_in(
    state: &Arc<AppState>,
    who: &Builder,
    id: &str,
    base: &ImageInfo,
    origin: &str,
    step: &Step,
    argv: Vec<String>,
    send: &Arc<dyn Fn(Value) + Send + Sync>,
) -> Result<ImageInfo, ApiError> {
    let h = state
        .handle(id)
        .ok_or_else(|| ApiError::internal(format!("build sandbox {id} is gone")))?;
    let body = ExecBody {
        argv,
        env: BTreeMap::new(),
        cwd: base.config.workdir.clone(),
        user: Some(
            step.user()
                .map(str::to_string)
                .or_else(|| base.config.user.clone())
                .unwrap_or_else(|| "root".into()),
        ),
        pty: None,
        timeout: None,
        stdin: false,
        tag: Some("build".into()),
        background: false,
    };
    let entry = crate::services::process::start(state, &h, &body).await?;
    let mut rx = entry
        .subscribe_from_start(256)
        .await
        .ok_or_else(|| ApiError::internal("build step output unavailable"))?;
    let mut lines = StepLines::default();
    let mut exit = None;
    // The step's sandbox may end before its command does (its lifetime is the
    // build's deadline): no exit status comes then, so stop waiting with it.
    let ended = h.stopped();
    tokio::pin!(ended);
    let sandbox_ended = || {
        ApiError::of(
            ErrorCode::BuildFailed,
            format!(
                "{origin} ({}) failed: its sandbox ended before the command did",
                step.text()
            ),
        )
    };
    loop {
        let ev = tokio::select! {
            ev = rx.recv() => ev,
            _ = &mut ended => return Err(sandbox_ended()),
        };
        let Some(ev) = ev else { break };
        match ev {
            OutEvent::Stdout(_, b) | OutEvent::Stderr(_, b) => {
                lines.push(&b, |line| send(json!({"type": "log", "line": line})));
            }
            OutEvent::Exit(x) => {
                exit = Some(x);
                break;
            }
        }
    }
    if let Some(line) = lines.finish() {
        send(json!({"type": "log", "line": line}));
    }
    let exit = match exit {
        Some(x) => x,
        None => tokio::select! {
            x = entry.wait() => {
                x.ok_or_else(|| ApiError::internal("build step ended without an exit status"))?
            }
            _ = &mut ended => return Err(sandbox_ended()),
        },
    };
    if exit.code != Some(0) {
        // The spec was fine: the step's own command failed (a build failure, like
        // `docker build`'s, not a bad request).
        return Err(ApiError::of(
            ErrorCode::BuildFailed,
            format!(
                "{origin} ({}) failed: {}",
                step.text(),
                match (exit.code, exit.signal) {
                    (Some(c), _) => format!("exit code {c}"),
                    (_, Some(s)) => format!("killed by signal {s}"),
                    _ => "no exit status".into(),
                }
            ),
        ));
    }
    let (st, hid, text, w) = (state.clone(), h.clone(), step.text(), who.clone());
    blocking(move || {
        let cfg = ImageConfig::default();
        st.images
            .snapshot_as(
                &hid.id,
                &*hid.inst,
                // A step's spec names no host name: the default one.
                &sandlot_runtime::plan::sandbox_hostname(&hid.id, &Default::default()),
                st.cfg.images.build_disk.bytes(),
                w.commit(&cfg, &text),
            )
            .map(|(img, _)| img)
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_line_without_a_newline_is_held_at_the_cap() {
        let mut lines = StepLines::default();
        let chunk = vec![b'x'; 1 << 20];
        let mut got = Vec::new();
        for _ in 0..100 {
            lines.push(&chunk, |l| got.push(l));
            assert!(lines.pending.len() <= MAX_STEP_LINE);
            assert!(lines.pending.capacity() <= 2 * MAX_STEP_LINE);
        }
        assert!(got.is_empty());
        lines.push(b"x\nnext", |l| got.push(l));
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].len(), MAX_STEP_LINE + " [cut]".len());
        assert!(got[0].ends_with("x [cut]"));
        assert_eq!(lines.finish().as_deref(), Some("next"));
    }

    #[test]
    fn step_output_is_split_into_lines_across_chunks() {
        let mut lines = StepLines::default();
        let mut got = Vec::new();
        for chunk in [
            &b"one\ntw"[..],
            b"o  \r\n",
            b"\n",
            "\u{e9}t\u{e9}".as_bytes(),
            b"\n",
        ] {
            lines.push(chunk, |l| got.push(l));
        }
        // A character split between chunks is whole in its line.
        let split = "caf\u{e9}\n".as_bytes();
        lines.push(&split[..4], |l| got.push(l));
        lines.push(&split[4..], |l| got.push(l));
        assert_eq!(got, ["one", "two", "", "\u{e9}t\u{e9}", "caf\u{e9}"]);
        assert_eq!(lines.finish(), None);
    }

    /// Found by probing builds: a spec file that was a link to a host file was read,
    /// and its text came back in the parse error.
    #[test]
    fn a_linked_spec_file_is_refused() {
        let dir = std::env::temp_dir().join(format!("sandlot-spec-link-{}", std::process::id()));
        let ctx = dir.join("ctx");
        fs::create_dir_all(&ctx).unwrap();
        fs::write(dir.join("host.txt"), "TOPSECRET line").unwrap();
        std::os::unix::fs::symlink(dir.join("host.txt"), ctx.join("spec.toml")).unwrap();
        let e = take_spec(&ctx, "spec.toml", false).unwrap_err();
        assert!(e.message.contains("a symbolic link"), "{}", e.message);
        assert!(!e.message.contains("TOPSECRET"), "{}", e.message);
        fs::write(ctx.join("Dockerfile"), "FROM base\nRUN true\n").unwrap();
        assert!(take_spec(&ctx, "Dockerfile", false).is_ok());
        fs::remove_dir_all(&dir).unwrap();
    }
}
