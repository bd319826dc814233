//! Snapshots: a tenant's saved sandbox states, which outlive their sandbox.
//!
//! A snapshot is a checkpoint (`checkpoint.rs`) promoted out of its sandbox into
//! the tenant's keeping: a fresh one taken for it (the sandbox runs on, or stays
//! paused if it was), or one of the sandbox's the caller names. What it saved
//! moves under the snapshot's id: gVisor (`memory`), the checkpoint's copy
//! (`<data>/sandbox-checkpoints/<sn-id>/`: the memory image and the kept root
//! or the writable layer, whose store image is leased under the snapshot's id);
//! namespace (`filesystem`, files only), the image its files were committed to,
//! leased under the snapshot's id. The checkpoint's row goes in the commit that
//! makes the snapshot ready (`Store::promote_checkpoint`), so a sandbox's end
//! meanwhile removes either the checkpoint (the snapshot is refused) or nothing
//! of the snapshot.
//!
//! A snapshot belongs to its sandbox's tenant (another tenant's id is "not
//! found"), is counted against the tenant's `max_snapshots` from its admission
//! and against `max_saved_disk` from the moment its bytes are known (both in
//! one store commit each: two snapshots at the limit cannot both pass), and is
//! kept across sandbox ends and daemon restarts until deleted. A sandbox started
//! from it is a fork of it (`fork.rs`): gVisor continues its processes and
//! memory; namespace starts afresh on its files. A delete while a start reads
//! it removes its record at once and its files when the start is done
//! (`checkpoint::CopyRead`). A daemon start removes the snapshots a crash left
//! half made, with the checkpoint taken for them ([`reconcile`]).

use std::collections::HashSet;
use std::sync::Arc;

use sandlot_proto::api::snapshot::{CreateSnapshot, Snapshot};
use sandlot_proto::api::{PauseKind, Sandbox};

use crate::auth::Principal;
use crate::checkpoint::{copy_dir, Busy, CopyRead};
use crate::error::{ApiError, ApiResult};
use crate::state::AppState;
use crate::store::{
    now_ms, CheckpointRecord, Promotion, SandboxRecord, SandboxState, Saved, SnapshotAdmission,
    SnapshotRecord, SnapshotSource, UsageRecord,
};

/// The API's view of snapshot `s`.
pub fn view(s: &SnapshotRecord) -> Snapshot {
    Snapshot {
        id: s.id.clone(),
        name: s.name.clone(),
        sandbox_id: s.sandbox_id.clone(),
        created_at: crate::timefmt::rfc3339(s.created_at),
        kind: s.kind,
        memory: s.kind == PauseKind::Memory,
        size: s.size,
    }
}

/// A new snapshot id (never a tenant's word: the only ids joined to a path).
fn new_id() -> String {
    format!("sn-{}", crate::auth::random_hex(8))
}

/// The caller's snapshot `id`: 404 when it has none of that id (another
/// tenant's included).
pub fn find(state: &AppState, p: &Principal, id: &str) -> ApiResult<SnapshotRecord> {
    state
        .store
        .snapshot(id)
        .map_err(ApiError::internal)?
        .filter(|s| p.sees(&s.tenant))
        .ok_or_else(|| ApiError::not_found(format!("no snapshot {id}")))
}

/// The caller's snapshots, oldest first; those of sandbox `sandbox` and named
/// `name` only when given.
pub fn list(
    state: &AppState,
    p: &Principal,
    sandbox: Option<&str>,
    name: Option<&str>,
) -> ApiResult<Vec<SnapshotRecord>> {
    state
        .store
        .snapshots_of(p.scope.as_deref(), sandbox, name)
        .map_err(ApiError::internal)
}

/// What a sandbox started from a snapshot of `rec` is made of besides the
/// saved state.
fn source_of(rec: &SandboxRecord) -> SnapshotSource {
    SnapshotSource {
        spec: rec.spec.clone(),
        tags: rec.tags.clone(),
        metadata: rec.metadata.clone(),
        memory_bytes: rec.memory_bytes,
        idle_timeout_ms: rec.idle_timeout_ms,
        lifecycle: rec.lifecycle,
        timeout_ms: rec.timeout_ms,
    }
}

/// The refusal of a snapshot past the tenant's quotas.
fn refusal(tenant: &str, a: SnapshotAdmission, q: &crate::config::Quota) -> ApiError {
    match a {
        SnapshotAdmission::TooMany(n) => ApiError::quota(format!(
            "tenant {tenant} holds {n} snapshots, its quota max_snapshots is {} (delete one first)",
            q.max_snapshots
        )),
        SnapshotAdmission::TooLarge { used } => ApiError::quota(format!(
            "tenant {tenant}: its checkpoints and snapshots hold {} of disk, this snapshot would pass its quota max_saved_disk of {} (delete one first)",
            sandlot_proto::units::ByteSize(used),
            q.max_saved_disk
        )),
        SnapshotAdmission::Admitted => ApiError::internal("a snapshot admitted was refused"),
    }
}

/// Takes a snapshot of the caller's sandbox `id` (running, or paused). It runs
/// to its end on a task of its own: a caller that goes away (a client cut off)
/// leaves no half-made snapshot, no row counted against the tenant's quota and
/// no image nothing holds.
pub async fn create(
    state: &Arc<AppState>,
    p: &Principal,
    id: &str,
    body: &CreateSnapshot,
) -> ApiResult<SnapshotRecord> {
    let (st, p, id, body) = (state.clone(), p.clone(), id.to_string(), body.clone());
    crate::error::to_completion(async move { create_attached(&st, &p, &id, &body).await }).await
}

async fn create_attached(
    state: &Arc<AppState>,
    p: &Principal,
    id: &str,
    body: &CreateSnapshot,
) -> ApiResult<SnapshotRecord> {
    crate::checkpoint::check_name(body.name.as_deref())?;
    if state.is_shutting_down() {
        return Err(ApiError::unavailable("the daemon is shutting down"));
    }
    let rec = crate::services::sandboxes::lookup(state, p, id)?;
    // No checkpoint, restore or fork of the sandbox meanwhile.
    let _busy = Busy::take(&rec.id)?;
    let quota = state.cfg.quota(&rec.tenant);
    let s = SnapshotRecord {
        id: new_id(),
        tenant: rec.tenant.clone(),
        name: body.name.clone(),
        sandbox_id: rec.id.clone(),
        kind: match crate::isolation::of_record(&rec.spec) {
            sandlot_proto::spec::Isolation::Gvisor => PauseKind::Memory,
            sandlot_proto::spec::Isolation::Namespace => PauseKind::Filesystem,
        },
        created_at: now_ms(),
        size: 0,
        saved: Saved::default(),
        source: source_of(&rec),
        ready: false,
        // A fresh checkpoint's id is recorded before it is taken: a crash
        // between the two leaves the restart a name to remove it by.
        checkpoint: match &body.checkpoint {
            Some(_) => None,
            None => Some((crate::checkpoint::new_id(), true)),
        },
    };
    let admitted = state
        .store
        .begin_snapshot(&s, quota.max_snapshots, quota.max_saved_disk.bytes())
        .map_err(ApiError::internal)?;
    if admitted != SnapshotAdmission::Admitted {
        return Err(refusal(&rec.tenant, admitted, &quota));
    }
    let made = make(state, p, &rec, s.clone(), body.checkpoint.as_deref()).await;
    if made.is_err() {
        if let Err(e) = state.store.remove_snapshot(&s.id) {
            tracing::error!(snapshot = %s.id, "forget a snapshot that failed: {e}");
        }
    }
    made
}

/// Bytes checkpoint `c` holds on the host: its copy, or what its commit added
/// (its image's own layer, packed and unpacked).
fn bytes_of(state: &AppState, c: &CheckpointRecord) -> u64 {
    match c.saved.image.as_deref() {
        Some(img) => state.images.committed_bytes(img),
        None => c.size,
    }
}

/// Moves what checkpoint `c` saved under snapshot `sn`'s id: its copy renamed,
/// or its image leased. Blocking.
fn adopt_files(state: &AppState, sn: &str, c: &CheckpointRecord) -> ApiResult<()> {
    match c.saved.image.as_deref() {
        Some(img) => {
            let digest = img.parse().map_err(ApiError::internal)?;
            state
                .images
                .store
                .lease(sn, &digest)
                .map_err(crate::images::store_error)
        }
        None => {
            // The image a store image's layer goes over: held by the snapshot
            // before its copy moves.
            if let Some(img) = c.saved.layer_image.as_deref() {
                let digest = img.parse().map_err(ApiError::internal)?;
                state
                    .images
                    .store
                    .lease(sn, &digest)
                    .map_err(crate::images::store_error)?;
            }
            let (from, to) = (copy_dir(state, &c.id), copy_dir(state, sn));
            std::fs::rename(&from, &to).map_err(|e| {
                if c.saved.layer_image.is_some() {
                    let _ = state.images.store.release(sn);
                }
                ApiError::internal(format!("rename {}: {e}", from.display()))
            })
        }
    }
}

/// Gives what [`adopt_files`] moved back to checkpoint `c`, which is still
/// recorded. Blocking.
fn give_back(state: &AppState, sn: &str, c: &CheckpointRecord) {
    if c.saved.image.is_some() {
        if let Err(e) = state.images.store.release(sn) {
            tracing::warn!(snapshot = sn, "release a snapshot's image: {e}");
        }
        return;
    }
    let (from, to) = (copy_dir(state, sn), copy_dir(state, &c.id));
    if let Err(e) = std::fs::rename(&from, &to) {
        tracing::warn!(snapshot = sn, checkpoint = %c.id, "give a checkpoint its copy back: {e}");
    }
    if c.saved.layer_image.is_some() {
        if let Err(e) = state.images.store.release(sn) {
            tracing::warn!(snapshot = sn, "release a snapshot's image: {e}");
        }
    }
}

/// Removes what [`adopt_files`] moved (`c` was removed meanwhile). Blocking.
fn drop_adopted(state: &AppState, sn: &str, c: &CheckpointRecord) {
    if let Err(e) = std::fs::remove_dir_all(copy_dir(state, sn)) {
        if e.kind() != std::io::ErrorKind::NotFound {
            tracing::warn!(snapshot = sn, "remove a snapshot's copy: {e}");
        }
    }
    if let Some(img) = &c.saved.image {
        if let Err(e) = state.images.store.release(sn) {
            tracing::warn!(snapshot = sn, "release a snapshot's image: {e}");
        }
        crate::pause::forget_commit(state, img);
    }
    if c.saved.layer_image.is_some() {
        state.images.release_ended(sn);
    }
}

/// Makes admitted snapshot `s` of `rec` (whose turn the caller holds) from a
/// fresh checkpoint or checkpoint `cp`. On failure nothing of it is left on the
/// host but its row, which the caller removes.
async fn make(
    state: &Arc<AppState>,
    p: &Principal,
    rec: &SandboxRecord,
    mut s: SnapshotRecord,
    cp: Option<&str>,
) -> ApiResult<SnapshotRecord> {
    let (c, fresh) = match (cp, s.checkpoint.clone()) {
        (Some(cp), _) => (crate::checkpoint::find(state, p, &rec.id, cp)?.1, false),
        (None, Some((id, _))) => (
            crate::checkpoint::take_as(state, p, rec, id, None, true).await?,
            true,
        ),
        (None, None) => (
            crate::checkpoint::take(state, p, rec, None, true).await?,
            true,
        ),
    };
    let fail = |e: ApiError| async {
        if fresh {
            if let Err(e2) = crate::checkpoint::remove(state, &c).await {
                tracing::warn!(checkpoint = %c.id, "remove the checkpoint a snapshot took: {}", e2.message);
            }
        }
        Err(e)
    };
    let quota = state.cfg.quota(&rec.tenant);
    let size = bytes_of(state, &c);
    let reserved = state
        .store
        .reserve_snapshot(&s.id, &c.id, fresh, size, quota.max_saved_disk.bytes())
        .map_err(ApiError::internal);
    match reserved {
        Ok(SnapshotAdmission::Admitted) => {}
        Ok(a @ SnapshotAdmission::TooLarge { .. }) => {
            return fail(refusal(&rec.tenant, a, &quota)).await
        }
        Ok(SnapshotAdmission::TooMany(_)) => {
            return fail(ApiError::internal(format!(
                "snapshot {} lost its row",
                s.id
            )))
            .await
        }
        Err(e) => return fail(e).await,
    }
    let (st, sn, c2) = (state.clone(), s.id.clone(), c.clone());
    let adopted = tokio::task::spawn_blocking(move || adopt_files(&st, &sn, &c2))
        .await
        .map_err(ApiError::internal)
        .and_then(|r| r);
    if let Err(e) = adopted {
        return fail(e).await;
    }
    let promoted = state
        .store
        .promote_checkpoint(&s.id, &c.id, c.kind, &c.saved)
        .map_err(ApiError::internal);
    let gone = matches!(promoted, Ok(Promotion::CheckpointGone));
    if !matches!(promoted, Ok(Promotion::Ready)) {
        // The checkpoint removed meanwhile left its files to the snapshot, which
        // removes them; one still there gets them back.
        let (st, sn, c2) = (state.clone(), s.id.clone(), c.clone());
        let _ = tokio::task::spawn_blocking(move || {
            if gone {
                drop_adopted(&st, &sn, &c2)
            } else {
                give_back(&st, &sn, &c2)
            }
        })
        .await;
    }
    match promoted {
        Ok(Promotion::Ready) => {}
        Ok(Promotion::CheckpointGone) => {
            return Err(ApiError::conflict(format!(
                "sandbox {} ended while its snapshot was taken",
                rec.id
            )))
        }
        Ok(Promotion::SnapshotGone) => {
            return fail(ApiError::internal(format!(
                "snapshot {} lost its row",
                s.id
            )))
            .await
        }
        Err(e) => return fail(e).await,
    }
    if c.saved.image.is_some() || c.saved.layer_image.is_some() {
        // The snapshot holds the image now.
        if let Err(e) = state.images.store.release(&c.id) {
            tracing::warn!(checkpoint = %c.id, "release a promoted checkpoint's image: {e}");
        }
    }
    s.kind = c.kind;
    s.saved = c.saved.clone();
    s.size = size;
    s.ready = true;
    tracing::info!(snapshot = %s.id, sandbox_id = %rec.id, checkpoint = %c.id, size, "snapshot made");
    Ok(s)
}

/// Snapshot `s` as the checkpoint a fork starts from and a removal removes.
fn as_checkpoint(s: &SnapshotRecord) -> CheckpointRecord {
    CheckpointRecord {
        id: s.id.clone(),
        sandbox_id: s.sandbox_id.clone(),
        tenant: s.tenant.clone(),
        name: s.name.clone(),
        parent: None,
        kind: s.kind,
        created_at: s.created_at,
        size: s.size,
        saved: s.saved.clone(),
    }
}

/// Deletes the caller's snapshot `id`: its record at once, its files (and its
/// image unless something else holds it) once no start reads them.
pub async fn delete(state: &Arc<AppState>, p: &Principal, id: &str) -> ApiResult<()> {
    let s = find(state, p, id)?;
    if !state
        .store
        .remove_ready_snapshot(&s.id)
        .map_err(ApiError::internal)?
    {
        return Err(ApiError::not_found(format!("no snapshot {id}")));
    }
    let (st, c) = (state.clone(), as_checkpoint(&s));
    tokio::task::spawn_blocking(move || crate::checkpoint::remove_files(&st, &c))
        .await
        .map_err(ApiError::internal)?;
    Ok(())
}

/// The lifetime of a sandbox started from a snapshot: `secs`, or the one its
/// sandbox was created with; within `limits.max_timeout`.
fn lifetime_ms(state: &AppState, s: &SnapshotRecord, secs: Option<u64>) -> ApiResult<i64> {
    let max = state.cfg.limits.max_timeout.0.as_secs();
    match secs {
        Some(n) if n == 0 || n > max => Err(ApiError::invalid(
            "timeout",
            format!("use 1 to {max} seconds (limits.max_timeout)"),
        )),
        Some(n) => Ok((n * 1000) as i64),
        None => Ok(s.source.timeout_ms.clamp(1000, (max * 1000) as i64)),
    }
}

/// Starts a sandbox of the caller's from their snapshot `id`: a fork of it.
pub async fn start(
    state: &Arc<AppState>,
    p: &Principal,
    id: &str,
    timeout_secs: Option<u64>,
) -> ApiResult<Sandbox> {
    if state.is_shutting_down() {
        return Err(ApiError::unavailable("the daemon is shutting down"));
    }
    let first = find(state, p, id)?;
    // Read under a lease, then found again: a delete meanwhile either removed
    // it (404 now) or leaves its files to this read's end.
    let read = CopyRead::take_id(state, &first.id);
    let r = start_read(state, p, &first.id, timeout_secs).await;
    read.end().await;
    r
}

async fn start_read(
    state: &Arc<AppState>,
    p: &Principal,
    id: &str,
    timeout_secs: Option<u64>,
) -> ApiResult<Sandbox> {
    let s = find(state, p, id)?;
    let remaining = lifetime_ms(state, &s, timeout_secs)?;
    let now = now_ms();
    let parent = SandboxRecord {
        id: s.sandbox_id.clone(),
        tenant: s.tenant.clone(),
        name: None,
        spec: s.source.spec.clone(),
        tags: s.source.tags.clone(),
        metadata: s.source.metadata.clone(),
        state: SandboxState::Stopped,
        end_reason: None,
        exit_code: None,
        exit_signal: None,
        error: None,
        pid: None,
        memory_bytes: s.source.memory_bytes,
        created_at: now,
        started_at: None,
        ended_at: None,
        expires_at: now + remaining,
        idle_timeout_ms: s.source.idle_timeout_ms,
        usage: UsageRecord::default(),
        lifecycle: s.source.lifecycle,
        timeout_ms: remaining,
    };
    let mut started =
        crate::fork::fork_from(state, &parent, &as_checkpoint(&s), 1, remaining).await?;
    started
        .pop()
        .ok_or_else(|| ApiError::internal(format!("snapshot {id}: no sandbox was started")))
}

/// On start, before the checkpoints' clean-up: removes the snapshots a crash
/// left half made (with the checkpoint taken for one; a checkpoint being
/// promoted gets its copy back) and answers the ids of those kept, whose
/// copies stay. Blocking.
pub fn reconcile(state: &AppState) -> HashSet<String> {
    let mut kept = HashSet::new();
    let all = match state.store.all_snapshots() {
        Ok(a) => a,
        Err(e) => {
            tracing::warn!("list the snapshots: {e}");
            // Nothing of theirs is removed when they cannot be listed.
            return state
                .store
                .snapshots_of(None, None, None)
                .map(|v| v.into_iter().map(|s| s.id).collect())
                .unwrap_or_default();
        }
    };
    for s in all {
        if s.ready {
            kept.insert(s.id);
            continue;
        }
        if let Some((cp, fresh)) = &s.checkpoint {
            let (mine, theirs) = (copy_dir(state, &s.id), copy_dir(state, cp));
            if mine.exists() && !theirs.exists() {
                if let Err(e) = std::fs::rename(&mine, &theirs) {
                    tracing::warn!(snapshot = %s.id, "give a checkpoint its copy back: {e}");
                }
            }
            if *fresh {
                if let Ok(Some(c)) = state.store.checkpoint(&s.sandbox_id, cp) {
                    if state.store.remove_checkpoint(&c.id).unwrap_or(false) {
                        crate::checkpoint::remove_files(state, &c);
                    }
                }
            }
        }
        let _ = std::fs::remove_dir_all(copy_dir(state, &s.id));
        if let Err(e) = state.images.store.release(&s.id) {
            tracing::warn!(snapshot = %s.id, "release a half-made snapshot's image: {e}");
        }
        match state.store.remove_snapshot(&s.id) {
            Ok(_) => tracing::info!(snapshot = %s.id, "removed a snapshot a crash left half made"),
            Err(e) => tracing::warn!(snapshot = %s.id, "forget a half-made snapshot: {e}"),
        }
    }
    kept
}
