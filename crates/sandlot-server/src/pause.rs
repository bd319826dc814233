//! Pausing and resuming sandboxes.
//!
//! A pause happens on the sandbox's owner task (`sandbox::own`), which it asks
//! through [`SandboxHandle::request_pause`]; what it saves depends on the backend:
//!
//! * gVisor (`memory`): the agent closes its host-bound sockets (`Quiesce`), the
//!   instance checkpoints into `<data>/checkpoints/<id>.partial/` (0700), which is
//!   renamed `<data>/checkpoints/<id>/` once whole, the root tmpfs of a `host`
//!   sandbox is kept there too ([`sandlot_runtime::Instance::keep_root`]), and the
//!   size and SHA-256 of every file of the image go into the record. A store
//!   image's writable layer (`<data>/rw/<id>/`) and its lease stay. A resume
//!   checks the image against the record before `runsc` reads it.
//! * namespace (`filesystem`): the sandbox's files are committed to an image of
//!   the tenant's (as a snapshot is), which the sandbox leases; its processes end.
//!   A resume creates it again from that image, under the same id.
//!
//! Either way its network slot, collection-mount helpers, published ports and
//! code contexts end at the pause; a resume claims a new slot and starts the
//! helpers again. Each step of the record is a commit from the state it leaves
//! (`store/pause.rs`), and a daemon start finishes or undoes one that a crash
//! interrupted ([`reconcile`]).

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sandlot_guest::client::GuestClient;
use sandlot_proto::api::PauseKind;
use sandlot_proto::spec::{Isolation, SandboxSpec};
use sandlot_runtime::{Backend, Instance, RuntimeError};
use tokio::sync::oneshot;
use tracing::Instrument;

use crate::error::{ApiError, ApiResult, ErrorCode, Exhausted};
use crate::sandbox::SandboxHandle;
use crate::state::AppState;
use crate::store::{
    now_ms, BeginPause, EndReason, PauseRecord, SandboxRecord, SandboxState, Saved, SavedFile,
};

/// Where the owner answers a pause request.
pub type PauseReply = oneshot::Sender<ApiResult<PauseKind>>;

/// How long a woken agent may take to listen again after a failed checkpoint.
const WAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// 409 `invalid_state`: sandbox `id` is in `state`, where this cannot happen.
pub fn wrong_state(id: &str, state: SandboxState) -> ApiError {
    ApiError::of(
        ErrorCode::InvalidState,
        format!("sandbox {id} is {}", state.as_str()),
    )
}

fn wrong_state_for(id: &str, state: SandboxState, rule: &str) -> ApiError {
    let mut e = wrong_state(id, state);
    e.message = format!("{}: {rule}", e.message);
    e
}

/// The directory of the daemon's checkpoints.
pub(crate) fn checkpoints(state: &AppState) -> PathBuf {
    state.cfg.data_dir.join("checkpoints")
}

pub(crate) fn checkpoint_dir(state: &AppState, id: &str) -> PathBuf {
    checkpoints(state).join(id)
}

pub(crate) fn partial_dir(state: &AppState, id: &str) -> PathBuf {
    checkpoints(state).join(format!("{id}.partial"))
}

/// What a pause on the owner came to.
pub enum Outcome {
    /// Paused: the owner's work is done.
    Paused(PauseKind),
    /// Not paused; the sandbox runs on under this owner.
    Running(ApiError),
    /// Not paused; the sandbox runs on under a new handle and owner.
    Replaced(ApiError),
    /// Not paused, and the sandbox ended: the owner tears it down.
    Ended(ApiError),
}

/// Asks `id`'s owner to pause it and waits for the answer. 409 `invalid_state`
/// unless it is running.
pub async fn request(
    state: &Arc<AppState>,
    p: &crate::auth::Principal,
    id: &str,
) -> ApiResult<SandboxRecord> {
    let rec = crate::services::sandboxes::lookup(state, p, id)?;
    let Some(h) = state.handle(&rec.id) else {
        return Err(wrong_state_for(
            &rec.id,
            rec.state,
            "only a running sandbox pauses",
        ));
    };
    if h.is_stopping() {
        return Err(wrong_state_for(
            &rec.id,
            SandboxState::Stopping,
            "only a running sandbox pauses",
        ));
    }
    let max = state.cfg.limits.max_paused_per_tenant;
    if max > 0 {
        let n = state
            .store
            .count_paused(&rec.tenant)
            .map_err(ApiError::internal)?;
        if n >= u64::from(max) {
            return Err(paused_cap(&rec.tenant, n, max));
        }
    }
    let (tx, rx) = oneshot::channel();
    h.request_pause(tx)?;
    // The owner (or, as it ends, its handle) answers; unanswered, the record says
    // what came of the sandbox.
    let answered = match rx.await {
        Ok(answer) => answer.map(|_| true)?,
        Err(_) => false,
    };
    let now = crate::services::sandboxes::lookup(state, p, &rec.id)?;
    if !answered && now.state != SandboxState::Paused {
        return Err(wrong_state_for(
            &now.id,
            now.state,
            "the pause did not happen",
        ));
    }
    Ok(now)
}

/// 429 `quota_exceeded`: `tenant` has `n` sandboxes paused, the cap `max`.
fn paused_cap(tenant: &str, n: u64, max: u32) -> ApiError {
    ApiError::quota(format!(
        "tenant {tenant}: {n} sandboxes paused, limits.max_paused_per_tenant is {max} (resume or delete one first)"
    ))
}

/// The code of [`Outcome::Running`] when an auto-pause for idleness finds,
/// once new requests wait for it, that one came since it was decided.
pub const BUSY: ErrorCode = ErrorCode::Busy;

/// Pauses `h` (on its owner task). With `while_idle` (an auto-pause for
/// idleness), it backs out, error [`BUSY`], unless `h` is idle still once the
/// pause is marked under way (from then on a request waits for it).
pub async fn pause(state: &Arc<AppState>, h: &Arc<SandboxHandle>, while_idle: bool) -> Outcome {
    let rec = match state.store.get_sandbox(&h.id) {
        Ok(Some(r)) => r,
        Ok(None) => return Outcome::Running(ApiError::not_found(format!("no sandbox {}", h.id))),
        Err(e) => return Outcome::Running(ApiError::internal(e)),
    };
    // The cap is checked again where the state changes: pauses at once (expiries,
    // requests) do not pass it together.
    let max = state.cfg.limits.max_paused_per_tenant;
    match state.store.begin_pause(&h.id, max) {
        Ok(BeginPause::Begun) => {}
        Ok(BeginPause::NotRunning) => {
            return Outcome::Running(wrong_state_for(
                &h.id,
                rec.state,
                "only a running sandbox pauses",
            ))
        }
        Ok(BeginPause::Full(n)) => return Outcome::Running(paused_cap(&rec.tenant, n, max)),
        Err(e) => return Outcome::Running(ApiError::internal(e)),
    }
    h.set_pausing(true);
    if while_idle && !h.is_idle() {
        h.set_pausing(false);
        if let Err(e) = state.store.undo_begin_pause(&h.id) {
            tracing::error!("record the pause not done: {e}");
        }
        return Outcome::Running(ApiError::of(
            BUSY,
            format!("sandbox {} is in use again", h.id),
        ));
    }
    let t0 = Instant::now();
    let isolation = crate::isolation::of_record(&rec.spec);
    let out = match isolation {
        Isolation::Gvisor => pause_memory(state, h, &rec).await,
        Isolation::Namespace => pause_filesystem(state, h, &rec).await,
    };
    match &out {
        Outcome::Paused(kind) => tracing::info!(
            kind = kind.as_str(),
            elapsed_ms = t0.elapsed().as_secs_f64() * 1e3,
            "sandbox paused"
        ),
        Outcome::Running(e) | Outcome::Replaced(e) | Outcome::Ended(e) => {
            tracing::warn!("pause failed: {} ({:?})", e.message, e.internal)
        }
    }
    match &out {
        Outcome::Running(e) => {
            h.set_pausing(false);
            if let Err(e) = state.store.abort_pause(&h.id, &e.message) {
                tracing::error!("record the failed pause: {e}");
            }
        }
        Outcome::Ended(_) => {
            let why = "its pause failed and ended it (details in the daemon log)";
            if let Err(e) = state.store.record_teardown_error(&h.id, why) {
                tracing::error!("record the failed pause: {e}");
            }
        }
        _ => {}
    }
    out
}

/// What is left of `h`'s lifetime now (its clock stops while it is paused).
fn remaining_ms(h: &SandboxHandle) -> i64 {
    (h.expires_at_ms() - now_ms()).max(0)
}

/// What a resume needs besides the recorded spec: the network policy it had.
pub(crate) fn saved_network(state: &AppState, rec: &SandboxRecord) -> Option<serde_json::Value> {
    serde_json::to_value(crate::network::current(state, &rec.id, &rec.spec)).ok()
}

/// gVisor: checkpoint the sandbox's kernel.
async fn pause_memory(
    state: &Arc<AppState>,
    h: &Arc<SandboxHandle>,
    rec: &SandboxRecord,
) -> Outcome {
    let Ok(backend) = state.backends.get(Isolation::Gvisor).cloned() else {
        return Outcome::Running(ApiError::conflict(format!(
            "sandbox {}: gVisor is not available on this daemon",
            h.id
        )));
    };
    if let Some(why) = unkept_files(&rec.spec) {
        return Outcome::Running(ApiError::of(ErrorCode::PauseRefused, format!(
                "sandbox {} cannot be paused: {why}, whose files a gVisor pause does not keep; the sandbox runs on",
                h.id
            ),
        ));
    }
    let remaining = remaining_ms(h);
    let network = saved_network(state, rec);
    let (partial, dir) = (partial_dir(state, &h.id), checkpoint_dir(state, &h.id));
    // `runsc checkpoint` that fails ends the sandbox: what is known to make it
    // fail is refused before, while its code contexts still run.
    // Held until the checkpoint is written: the disk room it counted on.
    let _room = match preflight(state, h).await {
        Ok(room) => room,
        Err(e) => return Outcome::Running(e),
    };
    // Its code contexts' drivers talk over connections the quiesce closes.
    for c in h.contexts.all() {
        c.end(&h.guest).await;
    }
    let prepared = {
        let (b, partial, dir, root) = (
            backend.clone(),
            partial.clone(),
            dir.clone(),
            checkpoints(state),
        );
        tokio::task::spawn_blocking(move || -> Result<(), RuntimeError> {
            make_private_dir(&root)?;
            // What an interrupted pause left.
            b.remove_checkpoint(&partial)?;
            b.remove_checkpoint(&dir)?;
            make_private_dir(&partial)
        })
        .await
        .unwrap_or_else(|e| Err(RuntimeError::Init(format!("prepare task: {e}"))))
    };
    if let Err(e) = prepared {
        return Outcome::Running(ApiError::internal(e).or_exhausted());
    }
    if let Err(e) = h.guest.quiesce().await {
        // It may have closed its connections all the same: wake it.
        return wake_after_failure(state, h, ApiError::internal(format!("quiesce: {e}"))).await;
    }
    quiesced(h).await;
    let saved = {
        let (h2, partial2) = (h.clone(), partial.clone());
        tokio::task::spawn_blocking(move || h2.inst.checkpoint(&partial2))
            .await
            .unwrap_or_else(|e| Err(RuntimeError::Init(format!("checkpoint task: {e}"))))
    };
    if let Err(e) = saved {
        let b = backend.clone();
        let _ = tokio::task::spawn_blocking(move || b.remove_checkpoint(&partial)).await;
        return wake_after_failure(state, h, checkpoint_error(&h.id, &e)).await;
    }
    // Whole: it has its final name, the root it kept, and its files' sums.
    let kept = {
        let (h2, dir2) = (h.clone(), dir.clone());
        tokio::task::spawn_blocking(move || -> Result<Vec<SavedFile>, RuntimeError> {
            std::fs::rename(&partial, &dir2).map_err(|e| RuntimeError::Io {
                what: format!("rename {} to {}", partial.display(), dir2.display()),
                source: e,
            })?;
            // The image's files only: what the kept root adds is the runtime's.
            let files = sum_files(&dir2)?;
            h2.inst.keep_root(&dir2)?;
            Ok(files)
        })
        .await
        .unwrap_or_else(|e| Err(RuntimeError::Init(format!("checkpoint task: {e}"))))
    };
    let files = match kept {
        Ok(f) => f,
        Err(e) => {
            // The checkpoint ended the sandbox: it cannot run on.
            let b = backend.clone();
            let _ = tokio::task::spawn_blocking(move || b.remove_checkpoint(&dir)).await;
            return Outcome::Ended(ApiError::internal(format!("keep the checkpoint: {e}")));
        }
    };
    let record = PauseRecord {
        kind: PauseKind::Memory,
        paused_at: now_ms(),
        remaining_ms: remaining,
        saved: Saved {
            files,
            image: None,
            layer_image: None,
            network,
        },
    };
    finish_pause(state, h, &record, false).await
}

/// What of a gVisor sandbox's files a memory pause would lose, in words: a
/// spec `tmpfs` mount, or the scratch layer over a spec `rootfs` (only an image's
/// writable layer and the `host` image's root are kept).
fn unkept_files(spec: &serde_json::Value) -> Option<String> {
    let spec: SandboxSpec = serde_json::from_value(spec.clone()).ok()?;
    if let Some(t) = spec.mounts.iter().find_map(|m| match m {
        sandlot_proto::spec::MountSpec::Tmpfs { target, .. } => Some(target),
        _ => None,
    }) {
        return Some(format!("it has a tmpfs mount at {t:?}"));
    }
    spec.rootfs
        .is_some()
        .then(|| "its root is a host directory (rootfs) under a scratch layer".to_string())
}

/// Namespace backend: commit the sandbox's files to an image, end its processes.
async fn pause_filesystem(
    state: &Arc<AppState>,
    h: &Arc<SandboxHandle>,
    rec: &SandboxRecord,
) -> Outcome {
    let remaining = remaining_ms(h);
    let network = saved_network(state, rec);
    let (st, h2) = (state.clone(), h.clone());
    let (spec, rec2) = (rec.spec.clone(), rec.clone());
    let committed = tokio::task::spawn_blocking(move || -> ApiResult<String> {
        let previous = st.images.image_of(&h2.id);
        let img = commit_files(&st, &h2, &spec, &rec2.tenant)?;
        // The sandbox holds its files' image from now on.
        st.images
            .store
            .lease(&h2.id, &img.id)
            .map_err(crate::images::store_error)?;
        // The image an earlier pause committed (the sandbox was resumed from it,
        // not created from it) is superseded.
        if let Some(old) = previous.filter(|o| *o != img.id) {
            let original = spec
                .get("image")
                .and_then(|v| v.as_str())
                .and_then(|r| st.images.store.resolve(r).ok())
                .map(|i| i.id);
            if original.as_ref() != Some(&old) {
                forget_commit(&st, &old.to_string());
            }
        }
        Ok(img.id.to_string())
    })
    .await
    .unwrap_or_else(|e| Err(ApiError::internal(format!("commit task: {e}"))));
    let image = match committed {
        Ok(i) => i,
        Err(e) => return Outcome::Running(e),
    };
    let record = PauseRecord {
        kind: PauseKind::Filesystem,
        paused_at: now_ms(),
        remaining_ms: remaining,
        saved: Saved {
            files: Vec::new(),
            image: Some(image),
            layer_image: None,
            network,
        },
    };
    finish_pause(state, h, &record, true).await
}

/// Commits the files of sandbox `h` (of `spec`) to an untagged image of
/// `tenant`'s, as a snapshot does; it runs on. Blocking.
pub(crate) fn commit_files(
    st: &AppState,
    h: &SandboxHandle,
    spec: &serde_json::Value,
    tenant: &str,
) -> ApiResult<sandlot_store::ImageInfo> {
    let hostname = match spec.get("hostname").and_then(|h| h.as_str()) {
        Some(n) => n.to_string(),
        None => sandlot_runtime::plan::sandbox_hostname(&h.id, &Default::default()),
    };
    let leased = st.images.image_of(&h.id).is_some();
    let rootfs = spec.get("rootfs").is_some_and(|r| !r.is_null());
    let (img, took) = if !leased && !rootfs {
        st.images
            .snapshot_host(&h.id, &*h.inst, tenant, Some(tenant), None, h.disk_limit)?
    } else {
        st.images.snapshot(
            &h.id,
            &*h.inst,
            &hostname,
            tenant,
            Some(tenant),
            None,
            h.disk_limit,
        )?
    };
    tracing::info!(image = %img.id, frozen_ms = took.as_secs_f64() * 1e3, "files committed");
    Ok(img)
}

/// Records the pause, then ends what is left of the sandbox on the host (its
/// processes when `kill`, its cgroups and run directory, network slot,
/// collection-mount helpers and published ports); a filesystem pause's writable
/// layer goes too (its image holds the files).
async fn finish_pause(
    state: &Arc<AppState>,
    h: &Arc<SandboxHandle>,
    record: &PauseRecord,
    kill: bool,
) -> Outcome {
    let (usage, _) = h.usage();
    if let Err(e) = state.store.mark_paused(&h.id, record, &usage) {
        // Its processes are gone (a checkpoint) or its files are saved (a
        // commit): nothing can resume it without the record.
        return Outcome::Ended(ApiError::internal(format!("record the pause: {e}")));
    }
    crate::ports::close_sandbox(state, &h.id).await;
    let (st, h2) = (state.clone(), h.clone());
    let filesystem = record.kind == PauseKind::Filesystem;
    let term = tokio::task::spawn_blocking(move || {
        if kill {
            h2.inst.kill(Duration::from_secs(10));
        }
        let term = h2.inst.terminate();
        crate::network::release(&st, &h2.id);
        st.collection_mounts.release(&h2.id);
        if filesystem {
            st.images.drop_writable_layer(&h2.id);
        }
        term
    })
    .await
    .unwrap_or_else(|e| Err(RuntimeError::Init(format!("teardown task: {e}"))));
    if let Err(e) = term {
        tracing::error!("tear down the paused sandbox: {e}");
    }
    state.unregister(&h.id);
    state.metrics.live_sandboxes.fetch_sub(1, Ordering::Relaxed);
    h.retire();
    Outcome::Paused(record.kind)
}

/// After a failed checkpoint (or quiesce): the agent listens again and a new
/// handle talks to it; the sandbox runs on as before. If it ended meanwhile, the
/// owner tears it down.
async fn wake_after_failure(
    state: &Arc<AppState>,
    h: &Arc<SandboxHandle>,
    err: ApiError,
) -> Outcome {
    let guest = wake(&h.inst).await;
    let Some(guest) = guest else {
        let _ = state.store.abort_pause(&h.id, &err.message);
        // The failed checkpoint took the sandbox with it: say that, not what
        // the error said of a sandbox that runs on.
        return Outcome::Ended(ApiError::internal(format!(
            "the checkpoint of sandbox {} failed and ended it: {} ({:?})",
            h.id, err.message, err.internal
        )));
    };
    if let Err(e) = state.store.abort_pause(&h.id, &err.message) {
        tracing::error!("record the failed pause: {e}");
    }
    let next = Arc::new(h.successor(guest));
    state.register(next.clone());
    crate::sandbox::start_owner(state, &next, true);
    h.retire();
    Outcome::Replaced(err)
}

/// Waits (up to [`QUIESCE_TIMEOUT`]) until the agent has closed the daemon's
/// connection: only then does it wait for the signal that wakes it. A
/// checkpoint taken before would restore an agent that misses every signal sent
/// to wake it, and never listens again.
async fn quiesced(h: &SandboxHandle) {
    let deadline = Instant::now() + QUIESCE_TIMEOUT;
    while Instant::now() < deadline {
        if h.guest.ping().await.is_err() {
            // From its last connection gone to waiting for the signal, the agent
            // runs a few steps of its own.
            tokio::time::sleep(Duration::from_millis(20)).await;
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tracing::warn!("the agent did not close its connections after the quiesce");
}

/// How long a quiesced agent may take to close its connections.
const QUIESCE_TIMEOUT: Duration = Duration::from_secs(3);

/// Slack over a sandbox's memory use that a checkpoint directory must have free.
const IMAGE_SLACK: u64 = 16 << 20;

/// How long each step of the socket check before a checkpoint may take (start
/// `cat`, read its output): the sandbox controls both.
const SOCKET_CHECK_TIMEOUT: Duration = Duration::from_secs(5);

/// The most of a sandbox's socket table the check reads.
const SOCKET_TABLE_CAP: u64 = 1 << 20;

/// What would make a checkpoint of `h` fail, found before it starts: a Unix
/// socket bound at a path of its files (a host socket, `--host-uds=all`), which
/// gVisor cannot save (409 `pause_refused`), or a disk without room for its
/// memory image (503 `host_exhausted`).
async fn preflight(state: &Arc<AppState>, h: &Arc<SandboxHandle>) -> ApiResult<DiskRoom> {
    // Read by `cat` in the sandbox (the agent's file API does not serve gVisor's
    // `/proc/<pid>/net`: ENOSYS), which the sandbox may have replaced: bounded in
    // time and size, and a table that cannot be read is not checked (a
    // checkpoint that then fails ends only this sandbox).
    let table = match socket_table_by_cat(&h.guest).await {
        Ok(t) => t,
        Err(why) => {
            tracing::info!("no socket check before the checkpoint: {why}");
            String::new()
        }
    };
    let bound = bound_socket_paths(&table);
    // The code contexts' kernels' sockets go with them before the checkpoint.
    if let Some(path) = bound.iter().find(|p| !is_context_socket(p)) {
        return Err(ApiError::of(ErrorCode::PauseRefused, format!(
                "sandbox {} cannot be paused: a program in it listens on the Unix socket {path:?}, bound in its files, which gVisor cannot save (close it, or bind it in /dev/shm or the abstract namespace, and pause again); the sandbox runs on",
                h.id
            ),
        ));
    }
    let (_, memory) = h.usage();
    let dir = checkpoints(state);
    make_private_dir(&dir).map_err(ApiError::internal)?;
    claim_disk(
        &dir,
        memory,
        &format!("sandbox {} uses {memory} bytes of memory", h.id),
    )
}

/// Claims `bytes` (and [`IMAGE_SLACK`]) of free room on `dir`'s file system for
/// files about to be written there, counting the claims under way (pauses,
/// checkpoints); 503 `host_exhausted` without room. `what` says what needs it,
/// for the log.
pub(crate) fn claim_disk(dir: &Path, bytes: u64, what: &str) -> ApiResult<DiskRoom> {
    let free = rustix::fs::statvfs(dir)
        .map(|v| v.f_bavail.saturating_mul(v.f_frsize))
        .map_err(|e| ApiError::internal(format!("statvfs {}: {e}", dir.display())))?;
    let need = bytes.saturating_add(IMAGE_SLACK);
    let claimed = CLAIMED_ROOM.fetch_add(need, Ordering::SeqCst);
    let room = DiskRoom(need);
    if free < claimed.saturating_add(need) {
        return Err(
            ApiError::host_exhausted(Exhausted::Disk).with_detail(format!(
                "{} has {free} bytes free, pauses and checkpoints under way claim {claimed}, {what}",
                dir.display(),
            )),
        );
    }
    Ok(room)
}

/// Disk room the checkpoints under way count on (their images are being
/// written, so free space does not show them yet). One count for the process:
/// daemons sharing it (tests) only count each other's too.
static CLAIMED_ROOM: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// A claim on [`CLAIMED_ROOM`], given back when dropped.
pub(crate) struct DiskRoom(u64);

impl Drop for DiskRoom {
    fn drop(&mut self) {
        CLAIMED_ROOM.fetch_sub(self.0, Ordering::SeqCst);
    }
}

/// Paths of the Unix sockets a `/proc/net/unix` table lists as bound, but for
/// gVisor's own `/dev` (the agent's socket, which its quiesce closes, and
/// `/dev/shm`, gVisor's memory): every other path is of the sandbox's files,
/// where its sockets are host sockets. Abstract ones (`@...`) are gVisor's.
pub fn bound_socket_paths(table: &str) -> Vec<String> {
    table
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().nth(7))
        .filter(|p| p.starts_with('/') && !p.starts_with("/dev/"))
        .map(str::to_string)
        .collect()
}

/// Wakes a quiesced agent and connects to it once it listens again; `None` if
/// the sandbox ended or its agent did not listen within [`WAKE_TIMEOUT`]. The
/// agent answers only a signal sent once it waits for one: it is sent again
/// while the agent does not listen.
pub(crate) async fn wake(inst: &Arc<dyn Instance>) -> Option<GuestClient> {
    let deadline = Instant::now() + WAKE_TIMEOUT;
    let mut next_signal = Instant::now();
    loop {
        if Instant::now() >= next_signal {
            let i = inst.clone();
            let woken = tokio::task::spawn_blocking(move || i.wake_agent())
                .await
                .unwrap_or_else(|e| Err(RuntimeError::Init(format!("wake task: {e}"))));
            if let Err(e) = woken {
                tracing::debug!("wake the agent: {e}");
            }
            next_signal = Instant::now() + Duration::from_millis(200);
        }
        if let Ok(g) = GuestClient::connect(inst.agent_socket()).await {
            return Some(g);
        }
        let i = inst.clone();
        let ended =
            tokio::task::spawn_blocking(move || i.wait_exit(Duration::from_millis(20)).is_some())
                .await
                .unwrap_or(true);
        if ended || Instant::now() >= deadline {
            return None;
        }
    }
}

/// The Unix socket table as `cat /proc/net/unix` in the sandbox prints it, for
/// at most [`SOCKET_CHECK_TIMEOUT`] and [`SOCKET_TABLE_CAP`] bytes, after which
/// the process is killed; its stderr is dropped.
async fn socket_table_by_cat(guest: &GuestClient) -> Result<String, String> {
    use sandlot_guest::client::ProcessEvent;
    let mut p = tokio::time::timeout(
        SOCKET_CHECK_TIMEOUT,
        guest.exec(sandlot_proto::guest::ExecRequest::new([
            "cat",
            "/proc/net/unix",
        ])),
    )
    .await
    .map_err(|_| "the agent did not start cat in time".to_string())?
    .map_err(|e| format!("start cat: {e}"))?;
    let mut buf = Vec::new();
    let read = tokio::time::timeout(SOCKET_CHECK_TIMEOUT, async {
        loop {
            match p.next_event().await {
                Ok(Some(ProcessEvent::Stdout(b))) => {
                    let room = (SOCKET_TABLE_CAP as usize).saturating_sub(buf.len());
                    buf.extend_from_slice(&b[..b.len().min(room)]);
                    if buf.len() as u64 >= SOCKET_TABLE_CAP {
                        let whole = buf.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
                        buf.truncate(whole);
                        return Err("cat printed more than the table can hold".to_string());
                    }
                }
                Ok(Some(ProcessEvent::Stderr(_))) => {}
                Ok(Some(ProcessEvent::Exit(st))) if st.code == Some(0) => return Ok(()),
                Ok(Some(ProcessEvent::Exit(st))) => return Err(format!("cat ended with {st:?}")),
                Ok(None) => return Err("cat's output ended without its exit".to_string()),
                Err(e) => return Err(format!("read cat's output: {e}")),
            }
        }
    })
    .await;
    match read {
        Ok(Ok(())) => Ok(String::from_utf8_lossy(&buf).into_owned()),
        Ok(Err(why)) => {
            let _ = tokio::time::timeout(SOCKET_CHECK_TIMEOUT, p.signal(libc::SIGKILL)).await;
            Err(why)
        }
        Err(_) => {
            let _ = tokio::time::timeout(SOCKET_CHECK_TIMEOUT, p.signal(libc::SIGKILL)).await;
            Err(format!("cat did not end within {SOCKET_CHECK_TIMEOUT:?}"))
        }
    }
}

/// Whether `path` is a socket of a code context's kernel (`driver.py` binds them
/// in a directory `sandlot-kernel-*`): the pause ends the contexts first. A
/// socket a program names so itself makes only its own sandbox's checkpoint fail.
fn is_context_socket(path: &str) -> bool {
    let p = Path::new(path);
    p.parent()
        .and_then(|d| d.file_name())
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.starts_with("sandlot-kernel-"))
}

/// A failed checkpoint as the API says it (the sandbox runs on).
fn checkpoint_error(id: &str, e: &RuntimeError) -> ApiError {
    let text = e.to_string();
    let lower = text.to_ascii_lowercase();
    if let Some(what) = Exhausted::in_text(&text) {
        return ApiError::host_exhausted(what).with_detail(text);
    }
    if lower.contains("socket") || lower.contains("uds") {
        return ApiError::of(ErrorCode::PauseRefused, format!(
                "sandbox {id} cannot be paused: a program in it has a Unix socket bound in its root filesystem or /tmp, whose host side gVisor cannot save (close it, or bind it elsewhere, and pause again); the sandbox runs on"
            ),
        )
        .with_detail(text);
    }
    ApiError::internal(format!("checkpoint sandbox {id}: {text}"))
}

pub(crate) fn make_private_dir(dir: &Path) -> Result<(), RuntimeError> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    let r = std::fs::DirBuilder::new().mode(0o700).create(dir);
    match r {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => Err(RuntimeError::Io {
            what: format!("create {}", dir.display()),
            source: e,
        }),
        _ => std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(|e| {
            RuntimeError::Io {
                what: format!("set the mode of {}", dir.display()),
                source: e,
            }
        }),
    }
}

/// Size and SHA-256 of each regular file directly in `dir` (the memory image
/// `runsc` wrote; the kept root, a directory, is not one).
pub(crate) fn sum_files(dir: &Path) -> Result<Vec<SavedFile>, RuntimeError> {
    let io = |what: String| move |source| RuntimeError::Io { what, source };
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).map_err(io(format!("read {}", dir.display())))? {
        let e = e.map_err(io(format!("read {}", dir.display())))?;
        let ft = e
            .file_type()
            .map_err(io(format!("stat {}", e.path().display())))?;
        if !ft.is_file() {
            continue;
        }
        let name = e.file_name().to_string_lossy().into_owned();
        let (size, sha256) = sum_file(&e.path())?;
        out.push(SavedFile { name, size, sha256 });
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

fn sum_file(path: &Path) -> Result<(u64, String), RuntimeError> {
    use sha2::Digest;
    use std::io::Read;
    let mut f = std::fs::File::open(path).map_err(|e| RuntimeError::Io {
        what: format!("open {}", path.display()),
        source: e,
    })?;
    let mut h = sha2::Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut size = 0u64;
    loop {
        let n = f.read(&mut buf).map_err(|e| RuntimeError::Io {
            what: format!("read {}", path.display()),
            source: e,
        })?;
        if n == 0 {
            break;
        }
        size += n as u64;
        h.update(&buf[..n]);
    }
    Ok((size, crate::auth::hex(&h.finalize())))
}

/// What is wrong with checkpoint `dir` against the record `files`, in words
/// naming no host path; `None` when every file is as it was saved.
pub fn damage(dir: &Path, files: &[SavedFile]) -> Option<String> {
    if files.is_empty() {
        return Some("no memory image was recorded".into());
    }
    for f in files {
        if f.name.contains('/') {
            return Some(format!("the record names a file {:?}", f.name));
        }
        let path = dir.join(&f.name);
        match sum_file(&path) {
            Err(_) => return Some(format!("{} is missing or unreadable", f.name)),
            Ok((size, _)) if size != f.size => {
                return Some(format!(
                    "{} has {size} bytes, {} were saved",
                    f.name, f.size
                ))
            }
            Ok((_, sum)) if sum != f.sha256 => {
                return Some(format!(
                    "{} is not what was saved (its SHA-256 differs)",
                    f.name
                ))
            }
            Ok(_) => {}
        }
    }
    None
}

/// Resumes paused sandbox `id`: 409 `invalid_state` unless it is paused, 409
/// `checkpoint_damaged` when its memory image is not what was saved and 409
/// `lifetime_exceeded` when it has reached `limits.max_timeout` (it stays paused
/// either way), 429 when the tenant's memory quota has no room for it.
pub async fn resume(
    state: &Arc<AppState>,
    p: &crate::auth::Principal,
    id: &str,
) -> ApiResult<SandboxRecord> {
    // On a task of its own: a caller that goes away between the sandbox's
    // registration and its owner's start would leave it running without one.
    let (st, p, id) = (state.clone(), p.clone(), id.to_string());
    crate::error::to_completion(async move { resume_attached(&st, &p, &id).await }).await
}

async fn resume_attached(
    state: &Arc<AppState>,
    p: &crate::auth::Principal,
    id: &str,
) -> ApiResult<SandboxRecord> {
    if state.is_shutting_down() {
        return Err(ApiError::unavailable("the daemon is shutting down"));
    }
    let rec = crate::services::sandboxes::lookup(state, p, id)?;
    if rec.state != SandboxState::Paused {
        return Err(wrong_state_for(
            &rec.id,
            rec.state,
            "only a paused sandbox resumes",
        ));
    }
    // Past its maximum lifetime, a resume would restore it only to end it (and
    // its checkpoint with it): it stays paused, until limits.paused_retention.
    let max = state.cfg.limits.max_timeout.duration();
    let latest = rec.created_at.saturating_add(max.as_millis() as i64);
    if now_ms() >= latest {
        return Err(ApiError::of(ErrorCode::LifetimeExceeded, format!(
                "sandbox {} has reached the operator's maximum lifetime ({}s from its creation, until {}): a resume would end it at once, so it stays paused and can only be deleted",
                rec.id,
                max.as_secs(),
                crate::timefmt::rfc3339(latest)
            ),
        ));
    }
    begin_resume(state, p, &rec)?;
    resume_begun(state, p, &rec).await
}

/// Paused sandbox `rec` to `resuming`, if the tenant's memory quota has room
/// for it (429 otherwise; 409 `invalid_state` if it is no longer paused). From
/// here on nothing else resumes, pauses or deletes it: [`resume_begun`] (or
/// `Store::abort_resume`) follows.
pub(crate) fn begin_resume(
    state: &Arc<AppState>,
    p: &crate::auth::Principal,
    rec: &SandboxRecord,
) -> ApiResult<()> {
    let quota = state.cfg.quota(&rec.tenant);
    match state
        .store
        .begin_resume(&rec.id, &rec.tenant, quota.max_memory.bytes())
        .map_err(ApiError::internal)?
    {
        Ok(true) => Ok(()),
        Ok(false) => {
            let now = crate::services::sandboxes::lookup(state, p, &rec.id)?;
            Err(wrong_state_for(
                &rec.id,
                now.state,
                "only a paused sandbox resumes",
            ))
        }
        Err(used) => Err(ApiError::quota(format!(
            "tenant {}: {} of memory in live sandboxes plus {} for this one exceeds the quota of {}",
            rec.tenant,
            sandlot_proto::units::ByteSize(used),
            sandlot_proto::units::ByteSize(rec.memory_bytes),
            quota.max_memory
        ))),
    }
}

/// Resumes sandbox `rec`, recorded `resuming` ([`begin_resume`]), from what its
/// pause saved; on a failure it is paused again, or ended once a restore started.
pub(crate) async fn resume_begun(
    state: &Arc<AppState>,
    p: &crate::auth::Principal,
    rec: &SandboxRecord,
) -> ApiResult<SandboxRecord> {
    let t0 = Instant::now();
    let span = tracing::info_span!("sandbox", sandbox_id = %rec.id, tenant = %rec.tenant);
    let restored = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let r = resume_started(state, rec, &restored)
        .instrument(span.clone())
        .await;
    match r {
        Ok(()) => {
            span.in_scope(|| {
                tracing::info!(
                    elapsed_ms = t0.elapsed().as_secs_f64() * 1e3,
                    "sandbox resumed"
                )
            });
            crate::services::sandboxes::lookup(state, p, &rec.id)
        }
        Err(e) => {
            span.in_scope(|| tracing::warn!("resume failed: {} ({:?})", e.message, e.internal));
            if restored.load(Ordering::SeqCst) {
                return Err(end_after_restore(state, rec, e).await);
            }
            if let Err(e2) = state.store.abort_resume(&rec.id, &e.message) {
                tracing::error!("record the failed resume: {e2}");
            }
            Err(e)
        }
    }
}

/// Ends sandbox `rec`, whose resume failed after `runsc restore` had started:
/// its restored processes may have changed the files its pause kept, which then
/// no longer match its memory image, so it is not paused again. What its pause
/// saved is removed and it is recorded stopped (`lost`) with the reason.
pub(crate) async fn end_after_restore(
    state: &Arc<AppState>,
    rec: &SandboxRecord,
    e: ApiError,
) -> ApiError {
    let why = "its resume failed after its memory image had started to be restored, \
               which may have changed the files it kept: it was ended (details in the daemon log)";
    let (st, id) = (state.clone(), rec.id.clone());
    let _ = tokio::task::spawn_blocking(move || remove_saved(&st, &id, Isolation::Gvisor)).await;
    match state
        .store
        .mark_stopped(&rec.id, EndReason::Lost, (None, None), Some(why), now_ms())
    {
        Ok(()) => state.metrics.stopped(EndReason::Lost.as_str()),
        Err(e2) => tracing::error!("record the failed resume: {e2}"),
    }
    ApiError::internal(format!(
        "sandbox {} ended: {why}: {} ({:?})",
        rec.id, e.message, e.internal
    ))
}

/// The resume of `rec`, recorded as resuming. On a failure before `restored` is
/// set nothing of it runs and what its pause saved is as it was; once a memory
/// restore has started (`restored`), its kept files may have changed.
pub(crate) async fn resume_started(
    state: &Arc<AppState>,
    rec: &SandboxRecord,
    restored: &Arc<std::sync::atomic::AtomicBool>,
) -> ApiResult<()> {
    let pause = state
        .store
        .pause_of(&rec.id)
        .map_err(ApiError::internal)?
        .ok_or_else(|| {
            ApiError::internal(format!("sandbox {} is paused without a record", rec.id))
        })?;
    let mut spec: SandboxSpec =
        serde_json::from_value(rec.spec.clone()).map_err(ApiError::internal)?;
    if let Some(n) = pause
        .saved
        .network
        .clone()
        .and_then(|n| serde_json::from_value(n).ok())
    {
        spec.network = n;
    }
    let dir = checkpoint_dir(state, &rec.id);
    if pause.kind == PauseKind::Memory {
        let (d, files) = (dir.clone(), pause.saved.files.clone());
        let damaged = tokio::task::spawn_blocking(move || damage(&d, &files))
            .await
            .map_err(ApiError::internal)?;
        if let Some(what) = damaged {
            return Err(ApiError::of(ErrorCode::CheckpointDamaged, format!(
                    "sandbox {}'s saved memory image is damaged ({what}); it stays paused and can only be deleted",
                    rec.id
                ),
            ));
        }
    }
    let backend = state
        .backends
        .get(spec.isolation)
        .map_err(|why| crate::isolation::unavailable(spec.isolation, why))?
        .clone();
    let (st, id, tenant) = (state.clone(), rec.id.clone(), rec.tenant.clone());
    let (kind, saved_image) = (pause.kind, pause.saved.image.clone());
    let restored2 = restored.clone();
    let started = tokio::task::spawn_blocking(move || {
        start_again(
            &st,
            &backend,
            &id,
            &tenant,
            spec,
            kind,
            saved_image,
            &dir,
            &restored2,
        )
    })
    .await
    .map_err(ApiError::internal)??;
    let inst: Arc<dyn Instance> = Arc::from(started);
    let undo = |state: &Arc<AppState>, inst: Arc<dyn Instance>, kind: PauseKind| {
        let st = state.clone();
        tokio::task::spawn_blocking(move || {
            let _ = inst.terminate();
            crate::network::release(&st, inst.id());
            st.collection_mounts.release(inst.id());
            if kind == PauseKind::Filesystem {
                st.images.drop_writable_layer(inst.id());
            }
        })
    };
    let guest = match GuestClient::connect(inst.agent_socket()).await {
        Ok(g) => g,
        Err(e) => {
            let _ = undo(state, inst, pause.kind).await;
            return Err(ApiError::internal(format!("connect to the agent: {e}")));
        }
    };
    let now = now_ms();
    // The rest of its lifetime, never past its creation's `max_timeout` (a POST
    // .../timeout is bounded alike).
    let max_timeout_ms = state.cfg.limits.max_timeout.duration().as_millis() as i64;
    let expires_at = (now + pause.remaining_ms).min(rec.created_at.saturating_add(max_timeout_ms));
    if let Err(e) = state
        .store
        .mark_resumed(&rec.id, inst.pid(), expires_at, now)
    {
        let _ = undo(state, inst, pause.kind).await;
        return Err(ApiError::internal(e));
    }
    let mut rec = rec.clone();
    rec.state = SandboxState::Running;
    rec.pid = Some(inst.pid());
    rec.expires_at = expires_at;
    // Registered as soon as it is recorded running: a DELETE from now on finds
    // its handle, and its owner, started below, stops it.
    let h = Arc::new(SandboxHandle::new(inst, guest, &rec, &state.code_output));
    state.register(h.clone());
    state.metrics.live_sandboxes.fetch_add(1, Ordering::Relaxed);
    if pause.kind == PauseKind::Memory {
        let (b, d) = (
            state.backends.get(Isolation::Gvisor).ok().cloned(),
            checkpoint_dir(state, &rec.id),
        );
        if let Some(b) = b {
            let _ = tokio::task::spawn_blocking(move || {
                if let Err(e) = b.remove_checkpoint(&d) {
                    tracing::warn!("remove the used checkpoint: {e}");
                }
            })
            .await;
        }
    }
    crate::sandbox::start_owner(state, &h, false);
    Ok(())
}

/// Starts paused sandbox `id` again on `backend` (blocking): from its checkpoint
/// at `dir` (memory) or from the image its files were committed to (filesystem).
/// On failure, what it claimed is released; what its pause saved is kept as it
/// was unless `restored` is set (a restore started).
#[allow(clippy::too_many_arguments)]
fn start_again(
    state: &Arc<AppState>,
    backend: &Arc<dyn Backend>,
    id: &str,
    tenant: &str,
    mut spec: SandboxSpec,
    kind: PauseKind,
    saved_image: Option<String>,
    dir: &Path,
    restored: &std::sync::atomic::AtomicBool,
) -> ApiResult<Box<dyn Instance>> {
    let viewer = sandlot_store::Viewer::Operator;
    let kept = kind == PauseKind::Memory;
    if kept && state.images.image_of(id).is_some() && !state.images.writable_layer_mounted(id) {
        return Err(files_lost(id));
    }
    if let (PauseKind::Filesystem, Some(img)) = (kind, &saved_image) {
        spec.image = img.clone();
        spec.rootfs = None;
        // A layer an interrupted pause or resume left.
        state.images.drop_writable_layer(id);
    }
    // What the operator allows may have changed while it was paused.
    crate::isolation::permitted(state, spec.isolation)?;
    crate::network::admit(state, &mut spec, true)?;
    let relock = |state: &AppState| {
        // A failed prepare drops the lease: the saved image is the sandbox's still.
        if let Some(d) = saved_image.as_deref().and_then(|s| s.parse().ok()) {
            let _ = state.images.store.lease(id, &d);
        }
    };
    let mut opts = match state.images.prepare_resume(id, tenant, viewer, &spec, kept) {
        Ok(o) => o,
        Err(e) => {
            relock(state);
            return Err(e);
        }
    };
    let release = |state: &AppState| {
        crate::network::release(state, id);
        state.collection_mounts.release(id);
        if !kept {
            state.images.drop_writable_layer(id);
        }
    };
    let prepared = crate::memory::add_mounts(&state.memory, tenant, &spec, &mut opts)
        .and_then(|()| crate::network::prepare(state, id, tenant, &spec, &mut opts))
        .and_then(|()| {
            state
                .collection_mounts
                .prepare(&state.vfs, id, tenant, &spec, &mut opts)
        });
    if let Err(e) = prepared {
        release(state);
        return Err(e);
    }
    let started = match kind {
        PauseKind::Memory => {
            restored.store(true, Ordering::SeqCst);
            backend.restore(id, &spec, opts, dir)
        }
        PauseKind::Filesystem => backend.create(id, &spec, opts),
    };
    match started {
        Ok(i) => {
            state.collection_mounts.attach(id, &*i);
            Ok(i)
        }
        Err(e) => {
            release(state);
            tracing::warn!(
                "start the paused sandbox again: {}",
                crate::routes::one_line(&e.to_string())
            );
            if matches!(e, RuntimeError::FilesLost(_) | RuntimeError::Refused { .. }) {
                // Found before `runsc restore` ran: nothing changed.
                restored.store(false, Ordering::SeqCst);
            }
            // What the sandbox made of its own files: the tenant's to read (its
            // text never read for signs of the host's exhaustion).
            if let RuntimeError::Refused { detail, .. } = &e {
                return Err(ApiError::of(
                    ErrorCode::InvalidState,
                    format!("sandbox {id} cannot start again: {e}"),
                )
                .with_detail(detail));
            }
            Err(match (&e, crate::error::Exhausted::in_error(&e)) {
                (RuntimeError::FilesLost(_), _) => files_lost(id).with_detail(&e),
                (_, Some(what)) => ApiError::host_exhausted(what).with_detail(&e),
                _ => ApiError::internal(format!("start the paused sandbox again: {e}")),
            })
        }
    }
}

/// 409 `checkpoint_damaged`: what a memory pause kept is gone or incomplete.
pub(crate) fn files_lost(id: &str) -> ApiError {
    ApiError::of(ErrorCode::CheckpointDamaged, format!(
            "sandbox {id}'s saved files are gone or incomplete (kept in memory, they do not survive a restart of the host; a fork's copy of them is incomplete when the daemon stopped while making it); it stays paused and can only be deleted"
        ),
    )
}

/// Deletes paused sandbox `rec` (or ends it for `reason`): its checkpoint, kept
/// root, writable layer and image lease go. 409 `invalid_state` if it is no longer
/// paused.
pub async fn discard(
    state: &Arc<AppState>,
    rec: &SandboxRecord,
    reason: EndReason,
) -> ApiResult<()> {
    if !state
        .store
        .begin_stop_paused(&rec.id, reason)
        .map_err(ApiError::internal)?
    {
        let now = state
            .store
            .get_sandbox(&rec.id)
            .map_err(ApiError::internal)?
            .map_or(SandboxState::Stopped, |r| r.state);
        if now == SandboxState::Stopped {
            return Ok(());
        }
        return Err(wrong_state_for(
            &rec.id,
            now,
            "try again once it is paused or running",
        ));
    }
    let (st, id) = (state.clone(), rec.id.clone());
    let isolation = crate::isolation::of_record(&rec.spec);
    tokio::task::spawn_blocking(move || remove_saved(&st, &id, isolation))
        .await
        .map_err(ApiError::internal)?;
    state
        .store
        .mark_stopped(&rec.id, reason, (None, None), None, now_ms())
        .map_err(ApiError::internal)?;
    state.metrics.stopped(reason.as_str());
    Ok(())
}

/// Removes what a pause of sandbox `id` saved on the host: its checkpoint (and
/// kept root), writable layer and image lease. Blocking.
fn remove_saved(state: &AppState, id: &str, isolation: Isolation) {
    let committed = state
        .store
        .pause_of(id)
        .ok()
        .flatten()
        .and_then(|p| p.saved.image);
    let backend = state.backends.get(isolation).ok().cloned();
    for d in [checkpoint_dir(state, id), partial_dir(state, id)] {
        let r = match &backend {
            Some(b) => b.remove_checkpoint(&d),
            None => state
                .backends
                .get(Isolation::Namespace)
                .map_or(Ok(()), |b| b.remove_checkpoint(&d)),
        };
        if let Err(e) = r {
            tracing::warn!(sandbox_id = id, "remove the checkpoint: {e}");
        }
    }
    state.images.release(id);
    if let Some(img) = committed {
        forget_commit(state, &img);
    }
    crate::checkpoint::remove_all_of(state, id);
}

/// Removes image `reference` that the daemon committed (a pause, a tenant's
/// build whose template was deleted), once nothing holds it: not if it has a tag
/// (someone names it), and after the last sandbox leasing it lets it go. Blocking.
pub(crate) fn forget_commit(state: &AppState, reference: &str) {
    let untagged = state
        .images
        .store
        .resolve(reference)
        .is_ok_and(|i| i.tags.is_empty() && i.tenant_tags.is_empty());
    if !untagged {
        return;
    }
    match state.images.remove_committed(reference) {
        Ok(_) => tracing::info!(
            image = reference,
            "removed an untagged image the daemon committed"
        ),
        // Sandboxes started from it (forks, sandboxes of a snapshot) hold it:
        // it goes when the last of them lets it go.
        Err(sandlot_store::StoreError::InUse { .. }) => state.images.orphan(reference),
        Err(e) => tracing::debug!(
            image = reference,
            "keep an untagged image the daemon committed: {e}"
        ),
    }
}

/// Deletes, at start and then hourly, the sandboxes paused for longer than
/// `limits.paused_retention` (end reason `timeout`), with what their pause saved.
pub fn start_paused_expiry(state: &Arc<AppState>) {
    let keep = state.cfg.limits.paused_retention.0;
    if keep.is_zero() {
        return;
    }
    let st = state.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(3600));
        loop {
            tick.tick().await;
            let cutoff = now_ms() - keep.as_millis() as i64;
            let ids = match st.store.paused_before(cutoff) {
                Ok(ids) => ids,
                Err(e) => {
                    tracing::warn!("list the expired paused sandboxes: {e}");
                    continue;
                }
            };
            for id in ids {
                let Ok(Some(rec)) = st.store.get_sandbox(&id) else {
                    continue;
                };
                match discard(&st, &rec, EndReason::Timeout).await {
                    Ok(()) => {
                        tracing::info!(sandbox_id = %id, "deleted a sandbox paused past limits.paused_retention")
                    }
                    Err(e) => {
                        tracing::warn!(sandbox_id = %id, "delete an expired paused sandbox: {}", e.message)
                    }
                }
            }
        }
    });
}

/// What [`reconcile`] found of paused sandboxes.
#[derive(Default)]
pub struct Reconciled {
    /// Sandboxes paused (those whose resume a crash interrupted among them).
    pub paused: Vec<String>,
}

/// On start, before the running sandboxes are re-adopted: a sandbox found
/// `resuming` is paused again (whatever its resume started is not adopted, and
/// goes with the leftovers); one found `pausing` is left to the re-adoption, its
/// unfinished checkpoint removed (re-adopted, it runs on; gone, it is lost). The
/// checkpoints no paused sandbox owns are removed.
pub async fn reconcile(state: &Arc<AppState>) -> Result<Reconciled, crate::store::StoreError> {
    let mut out = Reconciled::default();
    for rec in state.store.unfinished()? {
        match rec.state {
            SandboxState::Resuming => {
                state
                    .store
                    .abort_resume(&rec.id, "the daemon stopped while the sandbox resumed")?;
                out.paused.push(rec.id.clone());
            }
            SandboxState::Paused => out.paused.push(rec.id.clone()),
            _ => {}
        }
    }
    let (st, keep) = (state.clone(), out.paused.clone());
    let _ = tokio::task::spawn_blocking(move || {
        let Ok(rd) = std::fs::read_dir(checkpoints(&st)) else {
            return;
        };
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if keep.contains(&name) {
                continue;
            }
            let b = st
                .backends
                .get(Isolation::Gvisor)
                .or_else(|_| st.backends.get(Isolation::Namespace))
                .ok()
                .cloned();
            if let Some(b) = b {
                if let Err(err) = b.remove_checkpoint(&e.path()) {
                    tracing::warn!(checkpoint = %name, "remove a leftover checkpoint: {err}");
                } else {
                    tracing::info!(checkpoint = %name, "removed a leftover checkpoint");
                }
            }
        }
    })
    .await;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_sockets_bound_in_the_sandboxs_files_stop_a_checkpoint() {
        let table = "Num       RefCount Protocol Flags    Type St Inode Path
ffff0001: 00000002 00000000 00010000 0001 01 101 /dev/.sandlot/run/agent.sock
ffff0002: 00000002 00000000 00010000 0001 01 102 /tmp/held.sock
ffff0003: 00000002 00000000 00010000 0001 01 103 @abstract
ffff0004: 00000003 00000000 00000000 0001 03 104
ffff0005: 00000002 00000000 00010000 0001 01 105 /dev/shm/ok.sock
ffff0006: 00000002 00000000 00010000 0005 01 106 /root/with space
";
        assert_eq!(
            bound_socket_paths(table),
            vec!["/tmp/held.sock".to_string(), "/root/with".to_string()]
        );
        assert!(bound_socket_paths("Num RefCount Protocol Flags Type St Inode Path\n").is_empty());
    }

    #[test]
    fn a_gvisor_pause_is_refused_for_a_tmpfs_mount_or_a_rootfs_scratch_layer() {
        let tmpfs = serde_json::json!({"isolation": "gvisor", "mounts": [{"type": "tmpfs", "target": "/scratch"}]});
        assert!(unkept_files(&tmpfs).unwrap().contains("/scratch"));
        let rootfs = serde_json::json!({"isolation": "gvisor", "rootfs": "/srv/root"});
        assert!(unkept_files(&rootfs).unwrap().contains("rootfs"));
        assert!(!unkept_files(&rootfs).unwrap().contains("/srv/root"));
        assert_eq!(
            unkept_files(&serde_json::json!({"isolation": "gvisor"})),
            None
        );
    }

    #[test]
    fn only_a_code_contexts_kernel_socket_is_left_to_the_context_ending() {
        assert!(is_context_socket("/tmp/sandlot-kernel-ab12/k-1"));
        assert!(!is_context_socket("/tmp/held.sock"));
        assert!(!is_context_socket("/tmp/sandlot-kernel-ab12"));
        assert!(!is_context_socket("/sandlot-kernel-x"));
    }

    #[test]
    fn a_memory_image_is_damaged_when_a_file_is_missing_shorter_or_altered() {
        let dir = std::env::temp_dir().join(format!("sandlot-damage-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("checkpoint.img"), b"abcdef").unwrap();
        let files = sum_files(&dir).unwrap();
        assert_eq!(files.len(), 1);
        assert_eq!(damage(&dir, &files), None);
        std::fs::write(dir.join("checkpoint.img"), b"abcdeX").unwrap();
        assert!(damage(&dir, &files).unwrap().contains("SHA-256"));
        std::fs::write(dir.join("checkpoint.img"), b"abc").unwrap();
        assert!(damage(&dir, &files)
            .unwrap()
            .contains("3 bytes, 6 were saved"));
        std::fs::remove_file(dir.join("checkpoint.img")).unwrap();
        assert!(damage(&dir, &files).unwrap().contains("missing"));
        assert!(damage(&dir, &[]).is_some(), "no record is no image");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
