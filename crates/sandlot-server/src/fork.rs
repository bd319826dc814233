//! Forks: new sandboxes of a sandbox's tenant that continue from one of its
//! checkpoints (`checkpoint.rs`), or from a fresh one.
//!
//! Each fork is admitted, with all its siblings or none (`Store::admit_forks`:
//! the tenant's sandbox and memory quotas count every one), as a sandbox
//! `resuming` from what its checkpoint saved: gVisor, a checkpoint directory of
//! its own made from the checkpoint's copy (its root a tmpfs of its own, never
//! shared; a store image's sandbox gets a writable layer of its own, a copy of
//! the checkpoint's, over the image the fork leases); namespace, the
//! checkpoint's image, on which it gets a writable layer of its own. Then each resumes as a paused sandbox does (`pause.rs`), with a
//! network slot of its own, the parent's spec and network policy. If one cannot
//! start, every fork of the request is ended and what it held removed.

use std::sync::Arc;

use sandlot_proto::api::checkpoint::{ForkRequest, Forked};
use sandlot_proto::api::{PauseKind, Sandbox};

use crate::auth::Principal;
use crate::checkpoint::Busy;
use crate::error::{ApiError, ApiResult};
use crate::state::AppState;
use crate::store::{
    now_ms, Admission, CheckpointRecord, EndReason, PauseRecord, SandboxRecord, SandboxState,
    UsageRecord,
};

/// Forks the caller's sandbox `id` as `req` asks.
pub async fn fork(
    state: &Arc<AppState>,
    p: &Principal,
    id: &str,
    req: &ForkRequest,
) -> ApiResult<Forked> {
    // On a task of its own: a caller that goes away mid-way would leave the
    // parent held `resuming` and forks half made.
    let (st, p, id, req) = (state.clone(), p.clone(), id.to_string(), req.clone());
    crate::error::to_completion(async move { fork_attached(&st, &p, &id, &req).await }).await
}

async fn fork_attached(
    state: &Arc<AppState>,
    p: &Principal,
    id: &str,
    req: &ForkRequest,
) -> ApiResult<Forked> {
    if state.is_shutting_down() {
        return Err(ApiError::unavailable("the daemon is shutting down"));
    }
    let max = state.cfg.limits.max_fork_count.max(1);
    if req.count == 0 || req.count > max {
        return Err(ApiError::invalid(
            "count",
            format!("use 1 to {max} (limits.max_fork_count)"),
        ));
    }
    let parent = crate::services::sandboxes::lookup(state, p, id)?;
    let busy = Busy::take(&parent.id)?;
    // From a fresh checkpoint: taken for the fork, removed after it.
    let (c, fresh) = match &req.checkpoint {
        Some(cp) => (crate::checkpoint::find(state, p, &parent.id, cp)?.1, false),
        None => (
            crate::checkpoint::take(state, p, &parent, None, true).await?,
            true,
        ),
    };
    // The sandbox's turn is held until every fork has its own copy, and the
    // checkpoint's copy is read under a lease: neither a delete of the
    // checkpoint nor the sandbox's end removes it under a fork.
    let read = crate::checkpoint::CopyRead::take(state, &c);
    let remaining = remaining_ms(state, &parent, now_ms());
    let r = fork_from(state, &parent, &c, req.count, remaining).await;
    if fresh {
        // Removed by the fork itself, which holds the sandbox's turn.
        if let Err(e) = crate::checkpoint::remove(state, &c).await {
            tracing::warn!(checkpoint = %c.id, "remove the checkpoint a fork took: {}", e.message);
        }
    }
    read.end().await;
    drop(busy);
    let sandboxes = r?;
    Ok(Forked {
        checkpoint: c.id,
        kind: c.kind,
        sandboxes,
    })
}

/// The records of `count` forks of `parent` (admitted `resuming`).
fn plan(state: &AppState, parent: &SandboxRecord, count: u32, now: i64) -> Vec<SandboxRecord> {
    (0..count)
        .map(|_| SandboxRecord {
            id: crate::sandbox::new_id(&state.cfg.id_prefix),
            tenant: parent.tenant.clone(),
            name: None,
            spec: parent.spec.clone(),
            tags: parent.tags.clone(),
            metadata: parent.metadata.clone(),
            state: SandboxState::Resuming,
            end_reason: None,
            exit_code: None,
            exit_signal: None,
            error: None,
            pid: None,
            memory_bytes: parent.memory_bytes,
            created_at: now,
            started_at: None,
            ended_at: None,
            expires_at: now,
            idle_timeout_ms: parent.idle_timeout_ms,
            usage: UsageRecord::default(),
            // The parent's policy: a fork idles, times out and wakes as it would.
            lifecycle: parent.lifecycle,
            timeout_ms: parent.timeout_ms,
        })
        .collect()
}

/// What is left of `parent`'s lifetime: each fork gets as much (a paused
/// parent's clock stands still).
fn remaining_ms(state: &AppState, parent: &SandboxRecord, now: i64) -> i64 {
    let paused = state
        .store
        .pause_of(&parent.id)
        .ok()
        .flatten()
        .filter(|_| parent.state == SandboxState::Paused);
    match paused {
        Some(p) => p.remaining_ms,
        None => (parent.expires_at - now).max(0),
    }
}

/// Starts `count` forks of `parent` from checkpoint `c` (whose copy the
/// caller reads under a [`crate::checkpoint::CopyRead`]), each with
/// `remaining` ms of lifetime: a fork, or a sandbox started from a snapshot
/// (`snapshot.rs`, whose `parent` is the one the snapshot keeps).
pub(crate) async fn fork_from(
    state: &Arc<AppState>,
    parent: &SandboxRecord,
    c: &CheckpointRecord,
    count: u32,
    remaining: i64,
) -> ApiResult<Vec<Sandbox>> {
    let now = now_ms();
    let recs = plan(state, parent, count, now);
    let pause = PauseRecord {
        kind: c.kind,
        paused_at: now,
        remaining_ms: remaining,
        saved: c.saved.clone(),
    };
    let quota = state.cfg.quota(&parent.tenant);
    // Each namespace fork holds the checkpoint's image from its admission on,
    // as a paused sandbox holds its own: a removal of the checkpoint meanwhile
    // leaves it. A gVisor fork of a store image's sandbox holds the image its
    // writable layer goes over alike.
    let image: Option<sandlot_store::Digest> = match c.kind {
        PauseKind::Filesystem => c.saved.image.as_deref().and_then(|i| i.parse().ok()),
        PauseKind::Memory => c.saved.layer_image.as_deref().and_then(|i| i.parse().ok()),
    };
    let unlease = |state: &AppState| {
        for r in &recs {
            if let Err(e) = state.images.store.release(&r.id) {
                tracing::warn!(sandbox_id = %r.id, "release a fork's image: {e}");
            }
        }
    };
    if let Some(img) = &image {
        for r in &recs {
            if let Err(e) = state.images.store.lease(&r.id, img) {
                unlease(state);
                return Err(crate::images::store_error(e));
            }
        }
    }
    let admitted = state
        .store
        .admit_forks(
            &recs,
            &pause,
            &c.id,
            quota.max_sandboxes,
            quota.max_memory.bytes(),
        )
        .map_err(ApiError::internal);
    if !matches!(admitted, Ok(Admission::Admitted)) {
        unlease(state);
    }
    match admitted? {
        Admission::Admitted => {}
        Admission::TooManySandboxes(n) => {
            return Err(ApiError::quota(format!(
                "tenant {} has {n} sandboxes, {count} forks would pass its quota of {}; none was made",
                parent.tenant, quota.max_sandboxes
            )))
        }
        Admission::TooMuchMemory { used } => {
            return Err(ApiError::quota(format!(
                "tenant {}: {} of memory in live sandboxes plus {count} forks of {} each exceeds the quota of {}; none was made",
                parent.tenant,
                sandlot_proto::units::ByteSize(used),
                sandlot_proto::units::ByteSize(parent.memory_bytes),
                quota.max_memory
            )))
        }
        Admission::NameTaken => return Err(ApiError::internal("a fork was admitted by name")),
    }
    // Started side by side: each restore is a process of its own.
    let results = futures_util::future::join_all(recs.iter().map(|r| start_one(state, r, c))).await;
    if let Some(e) = results.iter().find_map(|r| r.as_ref().err()).cloned() {
        tracing::warn!("a fork failed to start: {} ({:?})", e.message, e.internal);
        for r in &recs {
            end(state, &r.id).await;
        }
        return Err(e);
    }
    let started: Vec<SandboxRecord> = results.into_iter().flatten().collect();
    Ok(started
        .iter()
        .map(|r| crate::services::sandboxes::view(state, r))
        .collect())
}

/// Starts fork `rec` (admitted `resuming`) from checkpoint `c`.
async fn start_one(
    state: &Arc<AppState>,
    rec: &SandboxRecord,
    c: &CheckpointRecord,
) -> ApiResult<SandboxRecord> {
    if c.kind == PauseKind::Memory {
        let (st, id, cp) = (state.clone(), rec.id.clone(), c.id.clone());
        let layer = match c.saved.layer_image {
            Some(_) => Some(crate::checkpoint::writable_size(rec)?),
            None => None,
        };
        tokio::task::spawn_blocking(move || -> ApiResult<()> {
            let dir = crate::pause::checkpoint_dir(&st, &id);
            let copy = crate::checkpoint::copy_dir(&st, &cp);
            crate::pause::make_private_dir(&crate::pause::checkpoints(&st))
                .map_err(ApiError::internal)?;
            // Its own writable layer, a copy of the checkpoint's: nothing of it
            // is shared with its siblings or its parent.
            if let Some(size) = layer {
                st.images.restore_writable_layer(&id, size, &copy)?;
            }
            sandlot_runtime::gvisor::kept_copy::materialize(&copy, &dir)
                .map_err(crate::checkpoint::copy_error)
        })
        .await
        .map_err(ApiError::internal)??;
    }
    let restored = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let t0 = std::time::Instant::now();
    crate::pause::resume_started(state, rec, &restored).await?;
    tracing::info!(
        sandbox_id = %rec.id,
        checkpoint = %c.id,
        elapsed_ms = t0.elapsed().as_secs_f64() * 1e3,
        "fork started"
    );
    state
        .store
        .get_sandbox(&rec.id)
        .map_err(ApiError::internal)?
        .ok_or_else(|| ApiError::internal(format!("fork {} has no record", rec.id)))
}

/// Ends fork `id` of a failed request, whatever state it reached: stopped
/// (`create_failed`), with what it held on the host removed.
async fn end(state: &Arc<AppState>, id: &str) {
    if let Some(h) = state.handle(id) {
        h.request_stop(EndReason::CreateFailed);
        h.stopped().await;
        return;
    }
    let Ok(Some(rec)) = state.store.get_sandbox(id) else {
        return;
    };
    match rec.state {
        SandboxState::Resuming => {
            // Never started, or its start failed before it ran: back to paused,
            // then discarded as a paused sandbox is.
            let _ = state
                .store
                .abort_resume(id, "another fork of its request failed");
            if let Ok(Some(rec)) = state.store.get_sandbox(id) {
                let _ = crate::pause::discard(state, &rec, EndReason::CreateFailed).await;
            }
        }
        SandboxState::Paused => {
            let _ = crate::pause::discard(state, &rec, EndReason::CreateFailed).await;
        }
        _ => {}
    }
}
