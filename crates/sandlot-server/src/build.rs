//! Image builds in the daemon (`POST /v1/images/build`): the context arrives as a
//! tar, the spec (TOML or the Dockerfile subset, parsed by `sandlot_store::build`)
//! inside it. Each step produces an image cached by its key: `run` steps run in a
//! real sandbox started from the previous step's image (network only when the
//! build asks for it) and their writable layer becomes the new layer, as a
//! snapshot does; `copy` steps pack the context files into a layer; `env`,
//! `workdir` and `user` change the config only. A failed step leaves the images
//! of the steps before it cached and tags nothing.

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

use crate::error::ApiError;
use crate::images::store_error;
use crate::process::OutEvent;
use crate::sandbox::{self, CreateParams};
use crate::state::AppState;
use crate::store::EndReason;

/// The writable layer of a run step's sandbox (what its layer may expand to).
const STEP_DISK: sandlot_proto::units::ByteSize = sandlot_proto::units::ByteSize(8 << 30);

/// Extracts a build context tar into `dir` (regular files, directories and
/// symlinks; anything escaping `dir` is refused). What it expands to (a sparse
/// entry at its full size) is bounded by `limit`: every copy step reads it.
pub fn extract_context(
    tar_path: &Path,
    dir: &Path,
    limit: &sandlot_store::SizeLimit,
) -> Result<(), ApiError> {
    let mut budget = Budget::new(Some(limit), "the build context");
    let f =
        fs::File::open(tar_path).map_err(|e| ApiError::internal(format!("open context: {e}")))?;
    let mut ar = tar::Archive::new(std::io::BufReader::new(f));
    ar.set_preserve_permissions(true);
    ar.set_overwrite(true);
    let entries = ar
        .entries()
        .map_err(|e| ApiError::bad_request(format!("build context is not a tar: {e}")))?;
    for e in entries {
        let mut e = e.map_err(|e| ApiError::bad_request(format!("build context tar: {e}")))?;
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
        let ty = e.header().entry_type();
        if !(ty.is_file() || ty.is_dir() || ty.is_symlink() || ty.is_gnu_sparse()) {
            continue;
        }
        budget
            .charge(sandlot_store::layer::entry_cost(
                p.as_os_str().len(),
                0,
                e.size(),
            ))
            .map_err(|err| crate::images::store_error(err.into()))?;
        // unpack_in refuses paths that leave `dir` through symlinks.
        e.unpack_in(dir).map_err(|err| {
            ApiError::bad_request(format!("build context entry {}: {err}", p.display()))
        })?;
    }
    Ok(())
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

fn resolve_base(state: &AppState, from: &str, log: &dyn Fn(Value)) -> Result<ImageInfo, ApiError> {
    match state.images.store.resolve(from) {
        Ok(i) => Ok(i),
        Err(sandlot_store::StoreError::NotFound(_)) if from.starts_with("debian:") => {
            debian_base(state, &from["debian:".len()..], log)
        }
        Err(e) => Err(ApiError::invalid("from", e.to_string())),
    }
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
    tenant: String,
    spec: BuildSpec,
    ctx: std::path::PathBuf,
    tag: Option<ImageName>,
    send: Arc<dyn Fn(Value) + Send + Sync>,
) -> Result<ImageInfo, ApiError> {
    let t0 = Instant::now();
    let (st, from, s2) = (state.clone(), spec.from.clone(), send.clone());
    let mut cur = blocking(move || resolve_base(&st, &from, &*s2)).await?;
    let total = spec.steps.len();
    for (i, (origin, step)) in spec.steps.iter().enumerate() {
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
        let key = build::step_key(&cur.id, step, spec.network, copied.as_ref());
        let st = state.clone();
        let k2 = key.clone();
        if let Some(hit) =
            blocking(move || st.images.store.cached_step(&k2).map_err(store_error)).await?
        {
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
                let (st, base) = (state.clone(), cur.clone());
                blocking(move || {
                    st.images
                        .store
                        .add_image(&base.layers, &cfg, &text, Some(base.id), "build", None)
                        .map_err(store_error)
                })
                .await?
            }
            Step::Copy { src, dest } => {
                let (st, base, c, o, s, d) = (
                    state.clone(),
                    cur.clone(),
                    ctx.clone(),
                    origin.clone(),
                    src.clone(),
                    dest.clone(),
                );
                blocking(move || {
                    let store = &st.images.store;
                    let layer = store.tmp_path("copy");
                    fs::create_dir(&layer)
                        .map_err(|e| ApiError::internal(format!("stage copy: {e}")))?;
                    let limit = st.images.limit(None);
                    let what = format!("{o} ({text})");
                    let r =
                        build::stage_copy(&c, &o, &s, &d, base.config.workdir.as_deref(), &layer)
                            .map_err(|e| ApiError::invalid("context", e.to_string()))
                            .and_then(|_| {
                                store
                                    .pack_dir(&layer, &mut Budget::new(Some(&limit), &what))
                                    .map_err(store_error)
                            })
                            .and_then(|p| {
                                store
                                    .commit_packed(
                                        &base,
                                        p,
                                        &Commit {
                                            config: &base.config,
                                            comment: &text,
                                            source: "build",
                                            tag: None,
                                            owner: None,
                                        },
                                    )
                                    .map_err(store_error)
                            });
                    let _ = fs::remove_dir_all(&layer);
                    r
                })
                .await?
            }
            _ => run_step(&state, &tenant, &cur, origin, step, spec.network, &send).await?,
        };
        send(
            json!({"type": "log", "line": format!("  -> {} ({:.2}s)", short(&next.id.to_string()), ts.elapsed().as_secs_f64())}),
        );
        let (st, id) = (state.clone(), next.id);
        blocking(move || st.images.store.cache_step(&key, &id).map_err(store_error)).await?;
        cur = next;
    }
    if let Some(t) = tag {
        let (st, id) = (state.clone(), cur.id);
        cur = blocking(move || {
            st.images
                .store
                .tag(&id.to_string(), &t)
                .map_err(store_error)
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
async fn run_step(
    state: &Arc<AppState>,
    tenant: &str,
    base: &ImageInfo,
    origin: &str,
    step: &Step,
    network: bool,
    send: &Arc<dyn Fn(Value) + Send + Sync>,
) -> Result<ImageInfo, ApiError> {
    let argv = step.argv().expect("a running step");
    let mut spec = SandboxSpec {
        image: base.id.to_string(),
        ..Default::default()
    };
    spec.resources.disk = STEP_DISK;
    spec.resources.memory = sandlot_proto::units::ByteSize::mib(2048);
    if network {
        spec.network.mode = NetworkMode::Open;
    }
    let mut tags = BTreeMap::new();
    tags.insert("sandlot.build".to_string(), "1".to_string());
    let rec = sandbox::create(
        state,
        CreateParams {
            tenant: tenant.to_string(),
            // The operator's build: its base is named by id.
            scope: None,
            name: None,
            spec,
            tags,
            metadata: BTreeMap::new(),
            timeout: Duration::from_secs(3600),
            idle_timeout: None,
        },
    )
    .await?;
    let r = run_in(state, &rec.id, base, origin, step, argv, send).await;
    if let Some(h) = state.handle(&rec.id) {
        h.request_stop(EndReason::Deleted);
        h.stopped().await;
    }
    r
}

async fn run_in(
    state: &Arc<AppState>,
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
        user: Some(base.config.user.clone().unwrap_or_else(|| "root".into())),
        pty: None,
        timeout: None,
        stdin: false,
        tag: Some("build".into()),
        background: false,
    };
    let entry = crate::routes::exec::start_process(state, &h, &body).await?;
    let mut rx = entry
        .subscribe_from_start(256)
        .await
        .ok_or_else(|| ApiError::internal("build step output unavailable"))?;
    let mut pending = String::new();
    let mut exit = None;
    while let Some(ev) = rx.recv().await {
        match ev {
            OutEvent::Stdout(_, b) | OutEvent::Stderr(_, b) => {
                pending.push_str(&String::from_utf8_lossy(&b));
                while let Some(i) = pending.find('\n') {
                    let line: String = pending.drain(..=i).collect();
                    send(json!({"type": "log", "line": line.trim_end()}));
                }
            }
            OutEvent::Exit(x) => {
                exit = Some(x);
                break;
            }
        }
    }
    if !pending.is_empty() {
        send(json!({"type": "log", "line": pending}));
    }
    let exit = match exit {
        Some(x) => x,
        None => entry
            .wait()
            .await
            .ok_or_else(|| ApiError::internal("build step ended without an exit status"))?,
    };
    if exit.code != Some(0) {
        // The spec was fine: the step's own command failed (a build failure, like
        // `docker build`'s, not a bad request).
        return Err(ApiError::new(
            axum::http::StatusCode::UNPROCESSABLE_ENTITY,
            "build_failed",
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
    let (st, hid, text) = (state.clone(), h.clone(), step.text());
    blocking(move || {
        st.images
            .snapshot_as(
                &hid.id,
                &hid.inst.cgroup,
                STEP_DISK.bytes(),
                Commit {
                    config: &Default::default(),
                    comment: &text,
                    source: "build",
                    tag: None,
                    owner: None,
                },
            )
            .map(|(img, _)| img)
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

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
