//! Checkpoints of a sandbox: saved states it can be restored to in place, or
//! forked from (`fork.rs`).
//!
//! A checkpoint is made of a pause (`pause.rs`) and what the pause saved:
//!
//! * gVisor (`memory`): the sandbox is paused (its kernel checkpointed into
//!   `<data>/checkpoints/<id>/`), that directory is copied into
//!   `<data>/sandbox-checkpoints/<cp>/` (0700; the memory image, and the root the
//!   pause kept as plain files: `sandlot_runtime::gvisor::kept_copy::save`), and
//!   the sandbox is resumed unless the caller asked to leave it paused. A restore
//!   or a fork makes a checkpoint directory of a pause from the copy
//!   (`kept_copy::materialize`: the image's files linked, the root copied into a
//!   tmpfs of its own) and resumes from it. A sandbox of a store image keeps its
//!   files in its writable layer (`<data>/rw/<id>/upper`, which its pause keeps):
//!   that is copied too (`kept_copy::save_layer`, whiteouts and opaque
//!   directories kept), and the checkpoint leases the image under its own id
//!   (`Saved::layer_image`); a fork gets a writable layer of its own filled from
//!   the copy (`Images::restore_writable_layer`), a restore in place has its
//!   layer replaced (`Images::replace_writable_layer`), each marked incomplete
//!   until whole so that a copy a crash cut short is never resumed.
//! * namespace (`filesystem`): the sandbox's files are committed to an image of
//!   the tenant's, as a snapshot is, which the checkpoint leases (holder: its id);
//!   the sandbox runs on untouched. A restore or a fork starts a sandbox from
//!   that image (its processes start afresh).
//!
//! One checkpoint operation at a time per sandbox ([`Busy`]); a pause, resume or
//! delete meanwhile is serialized by the sandbox's state (`begin_pause`,
//! `begin_resume`, `begin_stop_paused`). A checkpoint's row is recorded only
//! while its sandbox is neither stopping nor stopped, and the sandbox's end
//! removes its checkpoints ([`remove_all_of`]); a daemon start keeps the
//! checkpoints of the sandboxes it keeps and removes the rest ([`reconcile`]).

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use sandlot_proto::api::checkpoint::{Checkpoint, CheckpointDiff, CreateCheckpoint, Restored};
use sandlot_proto::api::PauseKind;
use sandlot_proto::spec::Isolation;

use crate::auth::Principal;
use crate::error::{ApiError, ApiResult, ErrorCode};
use crate::state::AppState;
use crate::store::{
    now_ms, CheckpointRecord, CheckpointRefusal, SandboxRecord, SandboxState, Saved,
};

/// The directory of the daemon's checkpoint copies.
fn copies(state: &AppState) -> PathBuf {
    state.cfg.data_dir.join("sandbox-checkpoints")
}

/// Where checkpoint `cp`'s copy is (only ids the daemon made are joined).
pub(crate) fn copy_dir(state: &AppState, cp: &str) -> PathBuf {
    copies(state).join(cp)
}

fn partial_copy_dir(state: &AppState, cp: &str) -> PathBuf {
    copies(state).join(format!("{cp}.partial"))
}

/// Sandboxes with a checkpoint operation under way.
static BUSY: Mutex<Option<HashSet<String>>> = Mutex::new(None);

/// A sandbox's turn for a checkpoint operation, given back when dropped.
pub(crate) struct Busy(String);

impl Busy {
    /// 409 `invalid_state` while another checkpoint, restore, fork or snapshot of
    /// `id` runs.
    pub(crate) fn take(id: &str) -> ApiResult<Busy> {
        let mut b = BUSY.lock().unwrap_or_else(|e| e.into_inner());
        if !b.get_or_insert_with(HashSet::new).insert(id.to_string()) {
            return Err(ApiError::of(ErrorCode::InvalidState, format!("sandbox {id}: another checkpoint, restore, fork or snapshot of it is under way"),
            ));
        }
        Ok(Busy(id.to_string()))
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        let mut b = BUSY.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(set) = b.as_mut() {
            set.remove(&self.0);
        }
    }
}

/// Checkpoint copies being read (forks made from them), by checkpoint id: how
/// many readers, and the removal asked for meanwhile, left to the last reader.
static READING: Mutex<Option<Readers>> = Mutex::new(None);

/// Checkpoint id → (readers, the removal asked for meanwhile).
type Readers = std::collections::HashMap<String, (usize, Option<CheckpointRecord>)>;

/// A read of a checkpoint's copy under way: its files stay until dropped (a
/// delete of the checkpoint or of its sandbox meanwhile removes its record at
/// once and its files when the last read ends).
pub(crate) struct CopyRead {
    id: String,
    state: Arc<AppState>,
}

impl CopyRead {
    pub(crate) fn take(state: &Arc<AppState>, c: &CheckpointRecord) -> CopyRead {
        CopyRead::take_id(state, &c.id)
    }

    /// A read of the copy of checkpoint or snapshot `id`.
    pub(crate) fn take_id(state: &Arc<AppState>, id: &str) -> CopyRead {
        let mut r = READING.lock().unwrap_or_else(|e| e.into_inner());
        r.get_or_insert_with(Default::default)
            .entry(id.to_string())
            .or_insert((0, None))
            .0 += 1;
        CopyRead {
            id: id.to_string(),
            state: state.clone(),
        }
    }

    /// Whether `c`'s copy is being read: then its removal is left to the last
    /// reader.
    fn defer_removal(c: &CheckpointRecord) -> bool {
        let mut r = READING.lock().unwrap_or_else(|e| e.into_inner());
        match r.as_mut().and_then(|m| m.get_mut(&c.id)) {
            Some(e) => {
                e.1 = Some(c.clone());
                true
            }
            None => false,
        }
    }

    /// Ends the read, removing the copy if it was deleted meanwhile.
    pub(crate) async fn end(self) {
        let (st, id) = (self.state.clone(), self.id.clone());
        std::mem::forget(self);
        let _ = tokio::task::spawn_blocking(move || end_read(&st, &id)).await;
    }
}

fn end_read(state: &AppState, id: &str) {
    let pending = {
        let mut r = READING.lock().unwrap_or_else(|e| e.into_inner());
        let Some(m) = r.as_mut() else { return };
        let Some(e) = m.get_mut(id) else { return };
        e.0 -= 1;
        if e.0 > 0 {
            return;
        }
        m.remove(id).and_then(|e| e.1)
    };
    if let Some(c) = pending {
        remove_files_now(state, &c);
    }
}

impl Drop for CopyRead {
    /// A read dropped on an async task (an early return) removes a deleted copy
    /// on a blocking thread: a removal waits for the daemon's image commits.
    fn drop(&mut self) {
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let (st, id) = (self.state.clone(), std::mem::take(&mut self.id));
            rt.spawn_blocking(move || end_read(&st, &id));
            return;
        }
        end_read(&self.state, &self.id);
    }
}

/// The API's view of checkpoint `c`.
pub fn view(c: &CheckpointRecord) -> Checkpoint {
    Checkpoint {
        id: c.id.clone(),
        sandbox_id: c.sandbox_id.clone(),
        name: c.name.clone(),
        parent: c.parent.clone(),
        created_at: crate::timefmt::rfc3339(c.created_at),
        kind: c.kind,
        memory: c.kind == PauseKind::Memory,
        size: c.size,
        sandbox_state: None,
    }
}

/// A checkpoint's name: 1 to 64 characters, none a control character.
pub fn check_name(name: Option<&str>) -> ApiResult<()> {
    match name {
        Some(n) if n.is_empty() || n.chars().count() > 64 => {
            Err(ApiError::invalid("name", "use 1 to 64 characters"))
        }
        Some(n) if n.chars().any(char::is_control) => Err(ApiError::invalid(
            "name",
            "control characters are not allowed",
        )),
        _ => Ok(()),
    }
}

/// Checkpoint `cp` of the caller's sandbox `id`: 404 for either unknown to them.
pub fn find(
    state: &AppState,
    p: &Principal,
    id: &str,
    cp: &str,
) -> ApiResult<(SandboxRecord, CheckpointRecord)> {
    let rec = crate::services::sandboxes::lookup(state, p, id)?;
    let c = state
        .store
        .checkpoint(&rec.id, cp)
        .map_err(ApiError::internal)?
        .ok_or_else(|| ApiError::not_found(format!("sandbox {} has no checkpoint {cp}", rec.id)))?;
    Ok((rec, c))
}

/// The checkpoints of the caller's sandbox `id`, oldest first.
pub fn list(state: &AppState, p: &Principal, id: &str) -> ApiResult<Vec<Checkpoint>> {
    let rec = crate::services::sandboxes::lookup(state, p, id)?;
    let all = state
        .store
        .checkpoints_of(&rec.id)
        .map_err(ApiError::internal)?;
    Ok(all.iter().map(view).collect())
}

/// Takes a checkpoint of the caller's sandbox `id` (running, or paused), on a
/// task of its own: a caller that goes away leaves it whole or not taken, never
/// the sandbox held half-way.
pub async fn create(
    state: &Arc<AppState>,
    p: &Principal,
    id: &str,
    body: &CreateCheckpoint,
) -> ApiResult<CheckpointRecord> {
    let (st, p, id, body) = (state.clone(), p.clone(), id.to_string(), body.clone());
    crate::error::to_completion(async move { create_attached(&st, &p, &id, &body).await }).await
}

async fn create_attached(
    state: &Arc<AppState>,
    p: &Principal,
    id: &str,
    body: &CreateCheckpoint,
) -> ApiResult<CheckpointRecord> {
    check_name(body.name.as_deref())?;
    let rec = crate::services::sandboxes::lookup(state, p, id)?;
    let _busy = Busy::take(&rec.id)?;
    take(state, p, &rec, body.name.clone(), body.leave_running).await
}

/// [`create`] for sandbox `rec`, whose turn the caller holds.
pub(crate) async fn take(
    state: &Arc<AppState>,
    p: &Principal,
    rec: &SandboxRecord,
    name: Option<String>,
    leave_running: bool,
) -> ApiResult<CheckpointRecord> {
    take_as(state, p, rec, new_id(), name, leave_running).await
}

/// [`take`] under id `cp`, which the caller recorded first (a snapshot's row
/// names the checkpoint it takes before it is taken, so that a crash meanwhile
/// leaves nothing the restart cannot find).
pub(crate) async fn take_as(
    state: &Arc<AppState>,
    p: &Principal,
    rec: &SandboxRecord,
    cp: String,
    name: Option<String>,
    leave_running: bool,
) -> ApiResult<CheckpointRecord> {
    if state.is_shutting_down() {
        return Err(ApiError::unavailable("the daemon is shutting down"));
    }
    let max = state.cfg.limits.max_checkpoints_per_sandbox.max(1);
    let held = state
        .store
        .checkpoints_of(&rec.id)
        .map_err(ApiError::internal)?
        .len();
    if held as u64 >= u64::from(max) {
        return Err(too_many(&rec.id, held as u64, max));
    }
    match crate::isolation::of_record(&rec.spec) {
        Isolation::Gvisor => take_memory(state, p, rec, cp, name, leave_running).await,
        Isolation::Namespace => take_files(state, p, rec, cp, name, leave_running).await,
    }
}

fn too_many(id: &str, n: u64, max: u32) -> ApiError {
    ApiError::quota(format!(
        "sandbox {id} holds {n} checkpoints, limits.max_checkpoints_per_sandbox is {max} (delete one first)"
    ))
}

/// A new checkpoint id.
pub(crate) fn new_id() -> String {
    format!("cp-{}", crate::auth::random_hex(8))
}

/// Records `c`; on refusal its files go (they are nobody's).
async fn record(state: &Arc<AppState>, c: CheckpointRecord) -> ApiResult<CheckpointRecord> {
    let max = state.cfg.limits.max_checkpoints_per_sandbox.max(1);
    let quota = state.cfg.quota(&c.tenant);
    let added = state
        .store
        .add_checkpoint(&c, max, quota.max_saved_disk.bytes())
        .map_err(ApiError::internal);
    let refused = match added {
        Ok(Ok(())) => return Ok(c),
        Ok(Err(CheckpointRefusal::TooMany(n))) => too_many(&c.sandbox_id, n, max),
        Ok(Err(CheckpointRefusal::Ended)) => {
            ApiError::conflict(format!("sandbox {} stopped", c.sandbox_id))
        }
        Ok(Err(CheckpointRefusal::TooLarge { used })) => ApiError::quota(format!(
            "tenant {}: its checkpoints and snapshots hold {} of disk, checkpoint {} of {} bytes would pass its quota max_saved_disk of {} (delete one first)",
            c.tenant,
            sandlot_proto::units::ByteSize(used),
            c.id,
            c.size,
            quota.max_saved_disk
        )),
        Err(e) => e,
    };
    let st = state.clone();
    let _ = tokio::task::spawn_blocking(move || remove_files(&st, &c)).await;
    Err(refused)
}

/// gVisor: pause, copy what the pause saved, resume.
async fn take_memory(
    state: &Arc<AppState>,
    p: &Principal,
    rec: &SandboxRecord,
    cp: String,
    name: Option<String>,
    leave_running: bool,
) -> ApiResult<CheckpointRecord> {
    // A sandbox of a store image: its writable layer is copied too, and the
    // image it goes over is leased under the checkpoint's id.
    let layer_image = state.images.image_of(&rec.id);
    let was_paused = match rec.state {
        SandboxState::Running => false,
        SandboxState::Paused => true,
        s => {
            return Err(crate::pause::wrong_state(&rec.id, s));
        }
    };
    if !was_paused {
        crate::pause::request(state, p, &rec.id).await?;
    }
    let paused = crate::services::sandboxes::lookup(state, p, &rec.id)?;
    if paused.state != SandboxState::Paused {
        return Err(crate::pause::wrong_state(&rec.id, paused.state));
    }
    // Held `resuming` while what its pause saved is copied: nothing resumes,
    // pauses or deletes it meanwhile. Resumed after if it ran before.
    let run_after = !was_paused && leave_running;
    if run_after {
        crate::pause::begin_resume(state, p, &paused)?;
    } else if !state
        .store
        .hold_paused(&rec.id)
        .map_err(ApiError::internal)?
    {
        let now = crate::services::sandboxes::lookup(state, p, &rec.id)?;
        return Err(crate::pause::wrong_state(&rec.id, now.state));
    }
    let finish = |r: ApiResult<CheckpointRecord>| async move {
        if run_after {
            if let Err(e) = crate::pause::resume_begun(state, p, &paused).await {
                // A checkpoint recorded is kept and answered; the sandbox's
                // state in the answer tells the resume failed.
                let Ok(c) = r else { return Err(e) };
                tracing::warn!(
                    sandbox_id = %paused.id,
                    checkpoint = %c.id,
                    "the resume after a checkpoint failed: {} ({:?})",
                    e.message,
                    e.internal
                );
                return Ok(c);
            }
        } else if let Err(e) = state.store.release_paused(&rec.id) {
            tracing::error!("record the sandbox paused again: {e}");
        }
        r
    };
    let pause = match state.store.pause_of(&rec.id) {
        Ok(Some(pause)) => pause,
        Ok(None) => {
            let e = ApiError::internal(format!("sandbox {} is paused without a record", rec.id));
            return finish(Err(e)).await;
        }
        Err(e) => return finish(Err(ApiError::internal(e))).await,
    };
    let (st, id, cp2, layered) = (
        state.clone(),
        rec.id.clone(),
        cp.clone(),
        layer_image.is_some(),
    );
    let copied = tokio::task::spawn_blocking(move || -> ApiResult<(u64, u64)> {
        let from = crate::pause::checkpoint_dir(&st, &id);
        let root = copies(&st);
        crate::pause::make_private_dir(&root).map_err(ApiError::internal)?;
        let upper = st.images.writable_upper(&id);
        if layered && !st.images.writable_layer_mounted(&id) {
            return Err(crate::pause::files_lost(&id));
        }
        // A writable layer, a tmpfs of its own, counts by its use (as a kept
        // root does): holes of its sparse files cost nothing.
        let used = dir_bytes(&from)
            + if layered {
                st.images.writable_layer_bytes(&id)
            } else {
                0
            };
        let _room = crate::pause::claim_disk(
            &root,
            used,
            &format!("checkpoint {cp2} of sandbox {id} needs {used} bytes"),
        )?;
        let partial = partial_copy_dir(&st, &cp2);
        let _ = std::fs::remove_dir_all(&partial);
        // What the copy writes is counted against the room claimed for it.
        let saved = sandlot_runtime::gvisor::kept_copy::save(&from, &partial, used);
        let saved = saved.and_then(|mut s| {
            if layered {
                let left = used.saturating_sub(s.bytes);
                let c = sandlot_runtime::gvisor::kept_copy::save_layer(&upper, &partial, left)?;
                s.bytes += c.bytes;
                s.skipped += c.skipped;
            }
            Ok(s)
        });
        let saved = match saved {
            Ok(s) => s,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&partial);
                return Err(copy_error(e));
            }
        };
        if saved.skipped > 0 {
            tracing::info!(
                skipped = saved.skipped,
                "entries of the root left out of the checkpoint (not a file, directory or link)"
            );
        }
        let whole = copy_dir(&st, &cp2);
        std::fs::rename(&partial, &whole).map_err(|e| {
            let _ = std::fs::remove_dir_all(&partial);
            ApiError::internal(format!("rename {}: {e}", partial.display()))
        })?;
        Ok((saved.bytes, dir_allocated(&whole)))
    })
    .await
    .map_err(ApiError::internal)?;
    let size = match copied {
        Ok((_, on_disk)) => on_disk,
        // The sandbox goes on as before whatever came of its copy.
        Err(e) => return finish(Err(e)).await,
    };
    if let Some(img) = &layer_image {
        // Held from before the checkpoint is recorded (a refused record releases
        // it with its files); a crash in between leaves a lease the restart's
        // reconcile releases (no checkpoint of that id).
        if let Err(e) = state.images.store.lease(&cp, img) {
            let (st, cp2) = (state.clone(), cp.clone());
            let _ = tokio::task::spawn_blocking(move || {
                let _ = std::fs::remove_dir_all(copy_dir(&st, &cp2));
            })
            .await;
            return finish(Err(crate::images::store_error(e))).await;
        }
    }
    let c = CheckpointRecord {
        id: cp,
        sandbox_id: rec.id.clone(),
        tenant: rec.tenant.clone(),
        name,
        parent: state.store.checkpoint_head(&rec.id).ok().flatten(),
        kind: PauseKind::Memory,
        created_at: now_ms(),
        size,
        saved: Saved {
            files: pause.saved.files.clone(),
            image: None,
            layer_image: layer_image.map(|d| d.to_string()),
            network: pause.saved.network.clone(),
        },
    };
    let recorded = record(state, c).await;
    finish(recorded).await
}

/// Namespace backend: commit the files (the sandbox runs on, or is paused after
/// when `leave_running` is false); a paused sandbox's committed image is taken.
async fn take_files(
    state: &Arc<AppState>,
    p: &Principal,
    rec: &SandboxRecord,
    cp: String,
    name: Option<String>,
    leave_running: bool,
) -> ApiResult<CheckpointRecord> {
    let network = crate::pause::saved_network(state, rec);
    let image = match rec.state {
        SandboxState::Running => {
            let h = crate::services::sandboxes::live(state, p, &rec.id)?;
            let (st, h2, spec, tenant) = (
                state.clone(),
                h.clone(),
                rec.spec.clone(),
                rec.tenant.clone(),
            );
            tokio::task::spawn_blocking(move || {
                crate::pause::commit_files(&st, &h2, &spec, &tenant).map(|i| i.id.to_string())
            })
            .await
            .map_err(ApiError::internal)??
        }
        SandboxState::Paused => state
            .store
            .pause_of(&rec.id)
            .map_err(ApiError::internal)?
            .and_then(|p| p.saved.image)
            .ok_or_else(|| {
                ApiError::internal(format!("sandbox {} is paused without an image", rec.id))
            })?,
        s => return Err(crate::pause::wrong_state(&rec.id, s)),
    };
    let digest = image.parse().map_err(ApiError::internal)?;
    state
        .images
        .store
        .lease(&cp, &digest)
        .map_err(crate::images::store_error)?;
    let c = CheckpointRecord {
        id: cp,
        sandbox_id: rec.id.clone(),
        tenant: rec.tenant.clone(),
        name,
        parent: state
            .store
            .checkpoint_head(&rec.id)
            .map_err(ApiError::internal)?,
        kind: PauseKind::Filesystem,
        created_at: now_ms(),
        // What its commit added to the disk (its layer, packed and unpacked):
        // counted against the tenant's max_saved_disk.
        size: state.images.committed_bytes(&image),
        saved: Saved {
            files: Vec::new(),
            image: Some(image),
            layer_image: None,
            network: network.filter(|_| rec.state == SandboxState::Running),
        },
    };
    let c = record(state, c).await?;
    if !leave_running && rec.state == SandboxState::Running {
        // The checkpoint is kept whatever comes of the pause: the sandbox's
        // state in the answer tells.
        if let Err(e) = crate::pause::request(state, p, &rec.id).await {
            tracing::warn!(
                sandbox_id = %rec.id,
                checkpoint = %c.id,
                "the pause after a checkpoint failed: {} ({:?})",
                e.message,
                e.internal
            );
        }
    }
    Ok(c)
}

/// The answer to a failed copy of a checkpoint's files: **413** `too_large`
/// naming the bound it went past, else an opaque 500 (503 when the host ran out
/// of something).
pub(crate) fn copy_error(e: sandlot_runtime::RuntimeError) -> ApiError {
    match e {
        sandlot_runtime::RuntimeError::PastLimit { .. } => ApiError::of(ErrorCode::TooLarge, e.to_string(),
        ),
        // A file of the sandbox's the daemon's disk cannot hold as it is (a
        // sparse file past the file system's largest, more hard links than it
        // allows): the tenant's doing, said without the host's paths.
        sandlot_runtime::RuntimeError::Io { ref source, .. }
            if matches!(source.raw_os_error(), Some(libc::EFBIG | libc::EMLINK)) =>
        {
            ApiError::of(ErrorCode::TooLarge, format!(
                    "a file of the sandbox cannot be kept as it is ({}): a file larger than the daemon's disk holds, or more hard links to one file than it allows",
                    std::io::Error::from_raw_os_error(source.raw_os_error().unwrap_or(0))
                ),
            )
            .with_detail(format!("copy the checkpoint: {e}"))
        }
        e => ApiError::internal(format!("copy the checkpoint: {e}")).or_exhausted(),
    }
}

/// Bytes of the regular files under `dir` (not following links, not crossing
/// into another file system's mount).
fn dir_bytes(dir: &std::path::Path) -> u64 {
    dir_size(dir, false)
}

/// Bytes the entries under `dir` take on its disk: every entry's blocks
/// (directories' included) and [`INODE_BYTES`] for its inode (holes of sparse
/// files and the extra names of hard links cost nothing): a checkpoint's
/// `size`, which the tenant's `max_saved_disk` counts, so that a tree of
/// empty directories or files costs what it takes.
fn dir_allocated(dir: &std::path::Path) -> u64 {
    dir_size(dir, true)
}

/// What one inode of a checkpoint's copy is counted as (an ext4 inode's size).
pub(crate) const INODE_BYTES: u64 = 256;

fn dir_size(dir: &std::path::Path, allocated: bool) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let Ok(top) = std::fs::symlink_metadata(dir) else {
        return 0;
    };
    let mut stack = vec![dir.to_path_buf()];
    let mut n = 0u64;
    let mut seen = HashSet::new();
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let Ok(m) = std::fs::symlink_metadata(e.path()) else {
                continue;
            };
            if m.is_dir() && m.dev() != top.dev() {
                // The kept root, a tmpfs of its own: counted by its use.
                n += rustix::fs::statvfs(e.path())
                    .map(|v| {
                        v.f_blocks
                            .saturating_sub(v.f_bfree)
                            .saturating_mul(v.f_frsize)
                    })
                    .unwrap_or(0);
                continue;
            }
            if m.is_dir() {
                stack.push(e.path());
            }
            if !allocated {
                if m.is_file() {
                    n += m.len();
                }
                continue;
            }
            // An inode once, however many names it has.
            if m.is_dir() || m.nlink() <= 1 || seen.insert((m.dev(), m.ino())) {
                n += INODE_BYTES + m.blocks().saturating_mul(512);
            }
        }
    }
    n
}

/// Deletes checkpoint `cp` of the caller's sandbox `id`.
pub async fn delete(state: &Arc<AppState>, p: &Principal, id: &str, cp: &str) -> ApiResult<()> {
    let (rec, c) = find(state, p, id, cp)?;
    let _busy = Busy::take(&rec.id)?;
    if !remove(state, &c).await? {
        return Err(ApiError::not_found(format!(
            "sandbox {} has no checkpoint {cp}",
            rec.id
        )));
    }
    Ok(())
}

/// Removes checkpoint `c`, its record and its files, by a caller that holds
/// its sandbox's [`Busy`] or needs none (a fork's own fresh checkpoint). False
/// when it was already gone.
pub(crate) async fn remove(state: &Arc<AppState>, c: &CheckpointRecord) -> ApiResult<bool> {
    if !state
        .store
        .remove_checkpoint(&c.id)
        .map_err(ApiError::internal)?
    {
        return Ok(false);
    }
    let (st, c) = (state.clone(), c.clone());
    tokio::task::spawn_blocking(move || remove_files(&st, &c))
        .await
        .map_err(ApiError::internal)?;
    Ok(true)
}

/// Removes what checkpoint `c` holds on the host: its copy, or its image's
/// lease (the image goes too unless something else holds it); a snapshot's
/// alike (`snapshot.rs`). Blocking.
pub(crate) fn remove_files(state: &AppState, c: &CheckpointRecord) {
    if CopyRead::defer_removal(c) {
        return;
    }
    remove_files_now(state, c)
}

fn remove_files_now(state: &AppState, c: &CheckpointRecord) {
    for d in [copy_dir(state, &c.id), partial_copy_dir(state, &c.id)] {
        match std::fs::remove_dir_all(&d) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                tracing::warn!(checkpoint = %c.id, "remove a checkpoint's copy: {e}")
            }
            _ => {}
        }
    }
    if let Some(img) = &c.saved.image {
        if let Err(e) = state.images.store.release(&c.id) {
            tracing::warn!(checkpoint = %c.id, "release a checkpoint's image: {e}");
        }
        crate::pause::forget_commit(state, img);
    }
    if c.saved.layer_image.is_some() {
        // The image its layer went over: an orphan nothing else holds goes too.
        state.images.release_ended(&c.id);
    }
}

/// Removes every checkpoint of sandbox `id` (it ended). Blocking.
pub fn remove_all_of(state: &AppState, id: &str) {
    let all = match state.store.checkpoints_of(id) {
        Ok(a) => a,
        Err(e) => {
            tracing::warn!(
                sandbox_id = id,
                "list the checkpoints of an ended sandbox: {e}"
            );
            return;
        }
    };
    // Newest first: a checkpoint's image may be the parent of a later one's.
    for c in all.iter().rev() {
        match state.store.remove_checkpoint(&c.id) {
            Ok(true) => remove_files(state, c),
            // Promoted to a snapshot meanwhile: its files are the snapshot's.
            Ok(false) => {}
            Err(e) => tracing::warn!(checkpoint = %c.id, "forget a checkpoint: {e}"),
        }
    }
}

/// On start: the snapshots a crash left half made are removed
/// (`snapshot::reconcile`), the checkpoints of sandboxes that are stopped (or
/// unknown) too, and so are copies no checkpoint or snapshot owns (one a crash
/// cut short).
pub async fn reconcile(state: &Arc<AppState>) {
    let st = state.clone();
    let _ = tokio::task::spawn_blocking(move || {
        let snapshots = crate::snapshot::reconcile(&st);
        let all = match st.store.all_checkpoints() {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!("list the checkpoints: {e}");
                return;
            }
        };
        let mut kept = snapshots;
        for c in all {
            let live = st
                .store
                .get_sandbox(&c.sandbox_id)
                .ok()
                .flatten()
                .is_some_and(|r| r.state != SandboxState::Stopped);
            if live {
                kept.insert(c.id.clone());
            } else if st.store.remove_checkpoint(&c.id).is_ok() {
                remove_files(&st, &c);
                tracing::info!(checkpoint = %c.id, "removed the checkpoint of an ended sandbox");
            }
        }
        let Ok(rd) = std::fs::read_dir(copies(&st)) else {
            return;
        };
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if kept.contains(&name) {
                continue;
            }
            match std::fs::remove_dir_all(e.path()) {
                Ok(()) => tracing::info!(checkpoint = %name, "removed a leftover checkpoint copy"),
                Err(err) => {
                    tracing::warn!(checkpoint = %name, "remove a leftover checkpoint copy: {err}")
                }
            }
        }
    })
    .await;
}

/// Restores the caller's sandbox `id` in place to its checkpoint `cp`: paused
/// (if it runs), what its pause saved replaced by the checkpoint's, resumed.
pub async fn restore(
    state: &Arc<AppState>,
    p: &Principal,
    id: &str,
    cp: &str,
) -> ApiResult<Restored> {
    // On a task of its own: a caller that goes away mid-way would leave the
    // sandbox held `resuming`.
    let (st, p, id, cp) = (state.clone(), p.clone(), id.to_string(), cp.to_string());
    crate::error::to_completion(async move { restore_attached(&st, &p, &id, &cp).await }).await
}

async fn restore_attached(
    state: &Arc<AppState>,
    p: &Principal,
    id: &str,
    cp: &str,
) -> ApiResult<Restored> {
    if state.is_shutting_down() {
        return Err(ApiError::unavailable("the daemon is shutting down"));
    }
    let (rec, c) = find(state, p, id, cp)?;
    let _busy = Busy::take(&rec.id)?;
    match rec.state {
        SandboxState::Running => {
            crate::pause::request(state, p, &rec.id).await?;
        }
        SandboxState::Paused => {}
        s => return Err(crate::pause::wrong_state(&rec.id, s)),
    }
    // Held `resuming` from here: no resume, pause or delete of it meanwhile.
    let rec = crate::services::sandboxes::lookup(state, p, &rec.id)?;
    crate::pause::begin_resume(state, p, &rec)?;
    match swap(state, &rec, &c).await {
        Ok(()) => {}
        Err(e) => {
            // What its pause saved is as it was: it is paused again.
            if let Err(e2) = state.store.abort_resume(&rec.id, &e.message) {
                tracing::error!("record the failed restore: {e2}");
            }
            return Err(e);
        }
    }
    state
        .store
        .set_checkpoint_head(&rec.id, &c.id)
        .map_err(ApiError::internal)?;
    let back = crate::pause::resume_begun(state, p, &rec).await?;
    Ok(Restored {
        checkpoint: c.id,
        kind: c.kind,
        sandbox: crate::services::sandboxes::view(state, &back),
    })
}

/// Replaces what the pause of `rec` (held `resuming`) saved by checkpoint `c`'s.
async fn swap(state: &Arc<AppState>, rec: &SandboxRecord, c: &CheckpointRecord) -> ApiResult<()> {
    let pause = state
        .store
        .pause_of(&rec.id)
        .map_err(ApiError::internal)?
        .ok_or_else(|| {
            ApiError::internal(format!("sandbox {} is paused without a record", rec.id))
        })?;
    if pause.kind != c.kind {
        // A sandbox's isolation never changes: its pauses and checkpoints agree.
        return Err(ApiError::internal(format!(
            "sandbox {}: its pause is {}, checkpoint {} is {}",
            rec.id,
            pause.kind.as_str(),
            c.id,
            c.kind.as_str()
        )));
    }
    let (st, id2, c2, rec2) = (state.clone(), rec.id.clone(), c.clone(), rec.clone());
    tokio::task::spawn_blocking(move || -> ApiResult<()> {
        let mut saved = pause.saved.clone();
        let (mut superseded, mut lease) = (None, None);
        match c2.kind {
            PauseKind::Memory => {
                let dir = crate::pause::checkpoint_dir(&st, &id2);
                let backend = st
                    .backends
                    .get(Isolation::Gvisor)
                    .map_err(|why| crate::isolation::unavailable(Isolation::Gvisor, why))?
                    .clone();
                // Made beside what the pause saved, which is replaced only once
                // it is whole: a failure leaves the sandbox paused as it was.
                let next = crate::pause::partial_dir(&st, &id2);
                backend
                    .remove_checkpoint(&next)
                    .map_err(ApiError::internal)?;
                if let Err(e) =
                    sandlot_runtime::gvisor::kept_copy::materialize(&copy_dir(&st, &c2.id), &next)
                {
                    let _ = backend.remove_checkpoint(&next);
                    return Err(copy_error(e));
                }
                // The checkpoint's writable layer, copied in place of the
                // sandbox's: a failure from here leaves the sandbox paused on a
                // layer marked incomplete, which a restore again mends.
                let layer = match &c2.saved.layer_image {
                    Some(img) => {
                        if st.images.image_of(&id2).map(|d| d.to_string()).as_ref() != Some(img) {
                            let _ = backend.remove_checkpoint(&next);
                            return Err(ApiError::internal(format!(
                                "sandbox {id2}: checkpoint {} is of another image",
                                c2.id
                            )));
                        }
                        Some(writable_size(&rec2)?)
                    }
                    None => None,
                };
                if let Some(size) = layer {
                    if let Err(e) =
                        st.images
                            .replace_writable_layer(&id2, size, &copy_dir(&st, &c2.id))
                    {
                        let _ = backend.remove_checkpoint(&next);
                        return Err(e);
                    }
                }
                let replaced = backend
                    .remove_checkpoint(&dir)
                    .map_err(ApiError::internal)
                    .and_then(|()| {
                        std::fs::rename(&next, &dir).map_err(|e| {
                            ApiError::internal(format!("rename {}: {e}", next.display()))
                        })
                    });
                // Its layer stays marked incomplete unless its memory image is
                // the checkpoint's too: a failure or a crash before leaves a
                // sandbox that is never resumed (a restore again mends it).
                replaced?;
                if layer.is_some() {
                    st.images.complete_writable_layer(&id2)?;
                }
                saved.files = c2.saved.files.clone();
            }
            PauseKind::Filesystem => {
                let img: sandlot_store::Digest = c2
                    .saved
                    .image
                    .as_deref()
                    .unwrap_or_default()
                    .parse()
                    .map_err(ApiError::internal)?;
                superseded = saved.image.replace(img.to_string());
                lease = Some(img);
            }
        }
        if c2.saved.network.is_some() {
            saved.network = c2.saved.network.clone();
        }
        match st.store.set_pause_saved(&id2, &saved) {
            Ok(true) => {}
            Ok(false) => {
                return Err(ApiError::conflict(format!(
                    "sandbox {id2} is no longer resuming"
                )))
            }
            Err(e) => return Err(ApiError::internal(e)),
        }
        // The sandbox holds the checkpoint's image now (a resume leases it again).
        if let Some(img) = lease {
            st.images
                .store
                .lease(&id2, &img)
                .map_err(crate::images::store_error)?;
        }
        // The image the pause committed, which nothing names any more.
        if let Some(old) = superseded.filter(|o| Some(o) != saved.image.as_ref()) {
            crate::pause::forget_commit(&st, &old);
        }
        Ok(())
    })
    .await
    .map_err(ApiError::internal)?
}

/// The size of sandbox `rec`'s writable layer (its spec's).
pub(crate) fn writable_size(rec: &SandboxRecord) -> ApiResult<sandlot_proto::spec::TmpfsLimit> {
    let spec: sandlot_proto::spec::SandboxSpec =
        serde_json::from_value(rec.spec.clone()).map_err(ApiError::internal)?;
    Ok(spec.memory_backed().writable)
}

/// The files that differ between checkpoints `a` and `b` of the caller's
/// sandbox `id`, by the image diff: of their images (`filesystem`), or of the
/// roots their copies kept (`memory`). Bounded like an image diff
/// (`images.max_expanded_size`: **413** past it).
pub async fn diff(
    state: &Arc<AppState>,
    p: &Principal,
    id: &str,
    a: &str,
    b: &str,
) -> ApiResult<CheckpointDiff> {
    let (_, ca) = find(state, p, id, a)?;
    let (_, cb) = find(state, p, id, b)?;
    let st = state.clone();
    tokio::task::spawn_blocking(move || -> ApiResult<CheckpointDiff> {
        let limit = st.images.limit(None);
        let d = match (&ca.saved.image, &cb.saved.image) {
            (Some(ia), Some(ib)) => {
                let ia = st.images.store.resolve(ia).map_err(ApiError::internal)?;
                let ib = st.images.store.resolve(ib).map_err(ApiError::internal)?;
                st.images
                    .store
                    .diff(&ia, &ib, Some(&limit))
                    .map_err(crate::images::store_error)?
            }
            _ => {
                let what = format!("the diff of checkpoints {} and {}", ca.id, cb.id);
                let mut budget = sandlot_store::Budget::new(Some(&limit), &what);
                // The kept root, or the image's layers (bottom first) under the
                // writable layer the copy kept.
                let root = |c: &CheckpointRecord| -> Vec<PathBuf> {
                    let copy = copy_dir(&st, &c.id);
                    let r = copy.join(sandlot_runtime::gvisor::kept_copy::SAVED_ROOT);
                    if r.is_dir() {
                        return vec![r];
                    }
                    let image = c
                        .saved
                        .layer_image
                        .as_deref()
                        .and_then(|i| i.parse().ok())
                        .and_then(|d| st.images.store.get(&d).ok());
                    match image {
                        Some(img) if sandlot_runtime::gvisor::kept_copy::has_layer(&copy) => {
                            let mut dirs = st.images.store.layer_dirs(&img);
                            dirs.reverse();
                            dirs.push(copy.join(sandlot_runtime::gvisor::kept_copy::SAVED_LAYER));
                            dirs
                        }
                        _ => Vec::new(),
                    }
                };
                let ta = sandlot_store::layer::flatten(&root(&ca), &mut budget)
                    .map_err(|e| crate::images::store_error(e.into()))?;
                let tb = sandlot_store::layer::flatten(&root(&cb), &mut budget)
                    .map_err(|e| crate::images::store_error(e.into()))?;
                sandlot_store::layer::diff(&ta, &tb, &mut budget)
                    .map_err(|e| crate::images::store_error(e.into()))?
            }
        };
        Ok(CheckpointDiff {
            added: d.added,
            changed: d.changed,
            removed: d.removed,
        })
    })
    .await
    .map_err(ApiError::internal)?
}

#[cfg(test)]
mod tests {
    /// A tree of empty directories and files costs its inodes and blocks: a
    /// tenant cannot fill the disk with entries the quota does not see.
    #[test]
    fn a_copys_size_counts_every_entry_not_only_file_data() {
        let dir = std::env::temp_dir().join(format!("sandlot-size-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        for i in 0..200 {
            std::fs::create_dir_all(dir.join(format!("d{i}/e"))).unwrap();
            std::fs::write(dir.join(format!("d{i}/f")), b"").unwrap();
        }
        std::fs::write(dir.join("one"), b"x").unwrap();
        std::fs::hard_link(dir.join("one"), dir.join("two")).unwrap();
        let size = dir_allocated(&dir);
        let bytes = dir_bytes(&dir);
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(bytes, 2, "plain bytes: the two names of one byte");
        // 600 entries and one file of two names: at least an inode each.
        assert!(size >= 601 * INODE_BYTES, "{size}");
    }

    use super::*;

    #[test]
    fn a_checkpoint_name_is_1_to_64_printable_characters() {
        assert!(check_name(None).is_ok());
        assert!(check_name(Some("before the rm")).is_ok());
        assert!(check_name(Some("")).is_err());
        assert!(check_name(Some(&"x".repeat(65))).is_err());
        assert!(check_name(Some("a\nb")).is_err());
    }

    #[test]
    fn one_checkpoint_operation_at_a_time_per_sandbox() {
        let a = Busy::take("sb-busy-a").unwrap();
        assert_eq!(
            Busy::take("sb-busy-a").err().unwrap().code.as_str(),
            "invalid_state"
        );
        let b = Busy::take("sb-busy-b").unwrap();
        drop(a);
        let _again = Busy::take("sb-busy-a").unwrap();
        drop(b);
    }
}
