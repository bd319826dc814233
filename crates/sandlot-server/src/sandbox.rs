//! Sandboxes owned by the daemon: creation (quota admission, runtime, agent
//! connection), one owner task per sandbox (lifetime and idle timeouts, PID 1
//! exit, usage sampling, teardown), and reconciliation after a restart.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sandlot_guest::client::GuestClient;
use sandlot_proto::api::metrics::MetricsHistory;
use sandlot_proto::spec::SandboxSpec;
use sandlot_runtime::{Instance, RuntimeError};
use tokio::io::unix::AsyncFd;
use tokio::sync::{watch, Notify};
use tracing::Instrument;

use crate::error::{ApiError, ApiResult, ErrorCode};
use crate::pool::ClaimSetup;
use crate::process::ProcTable;
use crate::state::AppState;
use crate::store::{
    now_ms, Admission, EndReason, KeyReservation, SandboxRecord, SandboxState, UsageRecord,
};
use crate::usage_history::{Raw as HistorySample, UsageHistory};

/// How often a live sandbox's cgroup accounting is sampled and saved.
const USAGE_INTERVAL: Duration = Duration::from_secs(5);

/// Byte and call counters of one sandbox.
#[derive(Debug, Default)]
pub struct Counters {
    pub exec: AtomicU64,
    pub stdin: AtomicU64,
    pub stdout: AtomicU64,
    pub stderr: AtomicU64,
    pub file_in: AtomicU64,
    pub file_out: AtomicU64,
}

impl Counters {
    pub fn add_stdout(&self, n: usize) {
        self.stdout.fetch_add(n as u64, Ordering::Relaxed);
    }
    pub fn add_stderr(&self, n: usize) {
        self.stderr.fetch_add(n as u64, Ordering::Relaxed);
    }
    fn from_usage(u: &UsageRecord) -> Counters {
        Counters {
            exec: AtomicU64::new(u.exec_count),
            stdin: AtomicU64::new(u.stdin_bytes),
            stdout: AtomicU64::new(u.stdout_bytes),
            stderr: AtomicU64::new(u.stderr_bytes),
            file_in: AtomicU64::new(u.file_bytes_in),
            file_out: AtomicU64::new(u.file_bytes_out),
        }
    }
}

/// Where a pause asked of a handle's owner waits for it.
#[derive(Debug)]
enum PauseSlot {
    Open(Option<crate::pause::PauseReply>),
    /// The owner has ended: no pause is taken any more.
    Closed,
}

/// Why a pause was not handed to the owner.
#[derive(Debug, PartialEq)]
enum PauseRefused {
    /// Another pause is asked already.
    Asked,
    /// The owner has ended.
    Closed,
}

impl PauseSlot {
    /// Hands `reply` to the owner; refused, it comes back.
    fn ask(
        &mut self,
        reply: crate::pause::PauseReply,
    ) -> Result<(), (PauseRefused, crate::pause::PauseReply)> {
        match self {
            PauseSlot::Open(Some(_)) => Err((PauseRefused::Asked, reply)),
            PauseSlot::Open(slot) => {
                *slot = Some(reply);
                Ok(())
            }
            PauseSlot::Closed => Err((PauseRefused::Closed, reply)),
        }
    }

    fn take(&mut self) -> Option<crate::pause::PauseReply> {
        match self {
            PauseSlot::Open(slot) => slot.take(),
            PauseSlot::Closed => None,
        }
    }

    /// Closes the slot: the pause still asked, which the owner never took (its
    /// asker is answered by the one closing).
    fn close(&mut self) -> Option<crate::pause::PauseReply> {
        match std::mem::replace(self, PauseSlot::Closed) {
            PauseSlot::Open(left) => left,
            PauseSlot::Closed => None,
        }
    }
}

/// A live sandbox.
pub struct SandboxHandle {
    pub id: String,
    pub tenant: String,
    /// `resources.disk` of its spec: what a snapshot or copy-out of it may expand
    /// to (see `Images::limit`).
    pub disk_limit: u64,
    /// `resources.memory` of its spec: the line of its memory guard (gVisor).
    pub memory_limit: u64,
    pub guest: GuestClient,
    pub inst: Arc<dyn Instance>,
    pub counters: Arc<Counters>,
    pub procs: Arc<Mutex<ProcTable>>,
    /// Its code contexts (interpreters that live as long as it does).
    pub contexts: crate::code::Contexts,
    pub exit_poll: Arc<Notify>,
    pub span: tracing::Span,
    expires_at_ms: AtomicI64,
    idle_timeout_ms: Option<i64>,
    /// What its timeouts do (`autopause.rs`).
    pub lifecycle: sandlot_proto::api::lifecycle::Lifecycle,
    /// The lifetime it was created with, and when (ms).
    pub timeout_ms: i64,
    pub created_at: i64,
    last_activity_ms: AtomicI64,
    active_streams: AtomicUsize,
    stopping: AtomicBool,
    stop_reason: Mutex<Option<EndReason>>,
    /// A pause asked of the owner, and where it answers (see `pause.rs`).
    pause_request: Mutex<PauseSlot>,
    /// The owner is pausing it: it takes no new work.
    pausing: AtomicBool,
    wake: Notify,
    stopped: watch::Sender<bool>,
    cpu_usec: AtomicU64,
    memory_bytes: AtomicU64,
    memory_peak: AtomicU64,
    /// CPU and memory over time (`GET .../metrics`), recorded by the owner.
    history: Mutex<UsageHistory>,
}

/// Where a handle's usage history begins: now, with the CPU used so far.
fn history_base(cpu_usec: u64) -> HistorySample {
    HistorySample {
        at_ms: now_ms(),
        cpu_usec,
        memory_bytes: 0,
    }
}

/// `resources.disk` of a recorded spec (the default when it names none).
fn disk_limit_of(spec: &serde_json::Value) -> u64 {
    spec.pointer("/resources/disk")
        .and_then(|d| serde_json::from_value::<sandlot_proto::units::ByteSize>(d.clone()).ok())
        .unwrap_or_else(|| sandlot_proto::spec::Resources::default().disk)
        .bytes()
}

/// `resources.memory` of a recorded spec (the default when it names none).
fn memory_limit_of(spec: &serde_json::Value) -> u64 {
    spec.pointer("/resources/memory")
        .and_then(|d| serde_json::from_value::<sandlot_proto::units::ByteSize>(d.clone()).ok())
        .unwrap_or_else(|| sandlot_proto::spec::Resources::default().memory)
        .bytes()
}

/// Keeps a sandbox from going idle while a stream is open.
pub struct ActiveGuard(Arc<SandboxHandle>);

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        self.0.touch();
        self.0.active_streams.fetch_sub(1, Ordering::Relaxed);
    }
}

impl SandboxHandle {
    pub(crate) fn new(
        inst: Arc<dyn Instance>,
        guest: GuestClient,
        rec: &SandboxRecord,
        code_output: &crate::code::output::TenantPools,
    ) -> SandboxHandle {
        SandboxHandle {
            span: tracing::info_span!(parent: None, "sandbox", sandbox_id = %rec.id, tenant = %rec.tenant),
            id: rec.id.clone(),
            tenant: rec.tenant.clone(),
            disk_limit: disk_limit_of(&rec.spec),
            memory_limit: memory_limit_of(&rec.spec),
            guest,
            inst,
            counters: Arc::new(Counters::from_usage(&rec.usage)),
            procs: Arc::new(Mutex::new(ProcTable::default())),
            contexts: crate::code::Contexts::new(code_output.of(&rec.tenant)),
            exit_poll: Arc::new(Notify::new()),
            expires_at_ms: AtomicI64::new(rec.expires_at),
            idle_timeout_ms: rec.idle_timeout_ms,
            lifecycle: rec.lifecycle,
            timeout_ms: rec.timeout_ms,
            created_at: rec.created_at,
            last_activity_ms: AtomicI64::new(now_ms()),
            active_streams: AtomicUsize::new(0),
            stopping: AtomicBool::new(false),
            stop_reason: Mutex::new(None),
            pause_request: Mutex::new(PauseSlot::Open(None)),
            pausing: AtomicBool::new(false),
            wake: Notify::new(),
            stopped: watch::channel(false).0,
            cpu_usec: AtomicU64::new(rec.usage.cpu_usec),
            memory_bytes: AtomicU64::new(0),
            memory_peak: AtomicU64::new(rec.usage.memory_peak_bytes),
            history: Mutex::new(UsageHistory::new(history_base(rec.usage.cpu_usec))),
        }
    }

    /// Records exec or file activity (resets the idle timer).
    pub fn touch(&self) {
        self.last_activity_ms.store(now_ms(), Ordering::Relaxed);
    }

    /// Marks a stream open until the guard drops.
    pub fn active(self: &Arc<Self>) -> ActiveGuard {
        self.active_streams.fetch_add(1, Ordering::Relaxed);
        self.touch();
        ActiveGuard(self.clone())
    }

    pub fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::Relaxed)
    }

    /// Fails with 409 unless the sandbox accepts work.
    pub fn check_running(&self) -> ApiResult<()> {
        if self.is_stopping() {
            return Err(ApiError::conflict(format!(
                "sandbox {} is stopping",
                self.id
            )));
        }
        if self.is_pausing() {
            return Err(crate::pause::wrong_state(&self.id, SandboxState::Pausing));
        }
        Ok(())
    }

    /// Whether its idle timeout has passed now: no stream open and no activity
    /// for that long (never without an idle timeout).
    pub(crate) fn is_idle(&self) -> bool {
        self.idle_timeout_ms.is_some_and(|i| {
            self.active_streams.load(Ordering::Relaxed) == 0
                && now_ms() >= self.last_activity_ms.load(Ordering::Relaxed) + i
        })
    }

    pub fn is_pausing(&self) -> bool {
        self.pausing.load(Ordering::Relaxed)
    }

    pub(crate) fn set_pausing(&self, on: bool) {
        self.pausing.store(on, Ordering::Relaxed);
    }

    /// Asks the owner to pause the sandbox; it answers on `reply`. 409 when it is
    /// stopping or a pause is under way.
    pub(crate) fn request_pause(&self, reply: crate::pause::PauseReply) -> ApiResult<()> {
        self.check_running()?;
        self.hand_pause(reply).map_err(|(e, _)| e)
    }

    /// [`SandboxHandle::request_pause`], giving the reply back when refused.
    fn hand_pause(
        &self,
        reply: crate::pause::PauseReply,
    ) -> Result<(), (ApiError, crate::pause::PauseReply)> {
        let asked = self
            .pause_request
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .ask(reply);
        match asked {
            Ok(()) => {
                self.wake.notify_one();
                Ok(())
            }
            Err((PauseRefused::Asked, r)) => Err((
                crate::pause::wrong_state(&self.id, SandboxState::Pausing),
                r,
            )),
            // The owner is gone (the sandbox stopped, paused or was handed on
            // meanwhile).
            Err((PauseRefused::Closed, r)) => Err((
                crate::pause::wrong_state(&self.id, SandboxState::Stopping),
                r,
            )),
        }
    }

    fn take_pause_request(&self) -> Option<crate::pause::PauseReply> {
        self.pause_request
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
    }

    /// The owner is done with this handle (`end`; None: it failed): a pause
    /// asked meanwhile, which the owner never took, is answered by how it ended
    /// (paused: done; handed on: asked of the next handle; stopped: refused), and
    /// later ones are refused.
    fn close_pause_requests(&self, state: &AppState, end: Option<OwnerEnd>) {
        let left = self
            .pause_request
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .close();
        let Some(reply) = left else { return };
        let answer = match end {
            Some(OwnerEnd::Paused) => match state.store.pause_of(&self.id) {
                Ok(Some(p)) => Ok(p.kind),
                _ => Err(crate::pause::wrong_state(&self.id, SandboxState::Paused)),
            },
            Some(OwnerEnd::HandedOn) => match state.handle(&self.id) {
                Some(next) if !std::ptr::eq(Arc::as_ptr(&next), self) => {
                    match next.hand_pause(reply) {
                        Ok(()) => return,
                        Err((e, reply)) => {
                            let _ = reply.send(Err(e));
                            return;
                        }
                    }
                }
                _ => Err(crate::pause::wrong_state(&self.id, SandboxState::Stopping)),
            },
            Some(OwnerEnd::Stopped) => {
                Err(crate::pause::wrong_state(&self.id, SandboxState::Stopping))
            }
            None => Err(ApiError::internal(format!(
                "the owner task of sandbox {} failed",
                self.id
            ))),
        };
        let _ = reply.send(answer);
    }

    /// A handle of the same sandbox and instance, talking to its agent through
    /// `guest` (a new connection after a pause that failed once the agent had
    /// closed its old ones): counters, processes and timers carry over.
    pub(crate) fn successor(&self, guest: GuestClient) -> SandboxHandle {
        // A stop asked of this handle (a DELETE during the pause) is asked of
        // the next.
        let stop_reason = *self.stop_reason.lock().unwrap_or_else(|e| e.into_inner());
        SandboxHandle {
            span: self.span.clone(),
            id: self.id.clone(),
            tenant: self.tenant.clone(),
            disk_limit: self.disk_limit,
            memory_limit: self.memory_limit,
            guest,
            inst: self.inst.clone(),
            counters: self.counters.clone(),
            procs: self.procs.clone(),
            contexts: self.contexts.afresh(),
            exit_poll: Arc::new(Notify::new()),
            expires_at_ms: AtomicI64::new(self.expires_at_ms()),
            idle_timeout_ms: self.idle_timeout_ms,
            lifecycle: self.lifecycle,
            timeout_ms: self.timeout_ms,
            created_at: self.created_at,
            last_activity_ms: AtomicI64::new(now_ms()),
            active_streams: AtomicUsize::new(0),
            stopping: AtomicBool::new(stop_reason.is_some()),
            stop_reason: Mutex::new(stop_reason),
            pause_request: Mutex::new(PauseSlot::Open(None)),
            pausing: AtomicBool::new(false),
            wake: Notify::new(),
            stopped: watch::channel(false).0,
            cpu_usec: AtomicU64::new(self.cpu_usec.load(Ordering::Relaxed)),
            memory_bytes: AtomicU64::new(0),
            memory_peak: AtomicU64::new(self.memory_peak.load(Ordering::Relaxed)),
            history: Mutex::new(UsageHistory::new(history_base(
                self.cpu_usec.load(Ordering::Relaxed),
            ))),
        }
    }

    /// Ends this handle's life without ending the sandbox (it was paused, or a
    /// successor took over): its waiters and stream tasks see it stopped.
    pub(crate) fn retire(&self) {
        self.stopped.send_replace(true);
    }

    pub fn expires_at_ms(&self) -> i64 {
        self.expires_at_ms.load(Ordering::Relaxed)
    }

    pub fn set_expiry(&self, at_ms: i64) {
        self.expires_at_ms.store(at_ms, Ordering::Relaxed);
        self.wake.notify_one();
    }

    /// Asks the owner to stop the sandbox (the first reason wins).
    pub fn request_stop(&self, reason: EndReason) {
        let mut r = self.stop_reason.lock().unwrap_or_else(|e| e.into_inner());
        if r.is_none() {
            *r = Some(reason);
        }
        drop(r);
        self.stopping.store(true, Ordering::Relaxed);
        self.wake.notify_one();
    }

    /// Becomes true once the owner has torn the sandbox down.
    pub fn stopped_signal(&self) -> watch::Receiver<bool> {
        self.stopped.subscribe()
    }

    /// Waits until the owner has torn the sandbox down.
    pub async fn stopped(&self) {
        let mut rx = self.stopped.subscribe();
        let _ = rx.wait_for(|s| *s).await;
    }

    /// Usage now: the counters, and cgroup accounting sampled now.
    pub fn usage(&self) -> (UsageRecord, u64) {
        self.sample();
        let c = &self.counters;
        let u = UsageRecord {
            cpu_usec: self.cpu_usec.load(Ordering::Relaxed),
            memory_peak_bytes: self.memory_peak.load(Ordering::Relaxed),
            exec_count: c.exec.load(Ordering::Relaxed),
            stdin_bytes: c.stdin.load(Ordering::Relaxed),
            stdout_bytes: c.stdout.load(Ordering::Relaxed),
            stderr_bytes: c.stderr.load(Ordering::Relaxed),
            file_bytes_in: c.file_in.load(Ordering::Relaxed),
            file_bytes_out: c.file_out.load(Ordering::Relaxed),
        };
        (u, self.memory_bytes.load(Ordering::Relaxed))
    }

    /// Its CPU and memory from `start_ms` to `end_ms` (None: open), with a sample
    /// taken now when the range reaches the present.
    pub fn metrics(&self, start_ms: Option<i64>, end_ms: Option<i64>) -> MetricsHistory {
        let (u, mem) = self.usage();
        let now = HistorySample {
            at_ms: now_ms(),
            cpu_usec: u.cpu_usec,
            memory_bytes: mem,
        };
        let h = self.history.lock().unwrap_or_else(|e| e.into_inner());
        MetricsHistory {
            interval_seconds: h.spacing_seconds(USAGE_INTERVAL.as_secs() as u32),
            samples: h.range(start_ms, end_ms, Some(now)),
        }
    }

    /// One usage interval passed: the history may keep this sample.
    fn record_history(&self, u: &UsageRecord, memory_bytes: u64) {
        self.history
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .tick(HistorySample {
                at_ms: now_ms(),
                cpu_usec: u.cpu_usec,
                memory_bytes,
            });
    }

    fn sample(&self) {
        let Some(u) = self.inst.usage() else {
            return;
        };
        self.cpu_usec.fetch_max(u.cpu_usec, Ordering::Relaxed);
        self.memory_bytes.store(u.memory_bytes, Ordering::Relaxed);
        self.memory_peak
            .fetch_max(u.memory_peak_bytes.max(u.memory_bytes), Ordering::Relaxed);
    }
}

/// What a create request asks for, validated.
pub struct CreateParams {
    pub tenant: String,
    /// Whose names the spec's image is looked up by: `None`, the operator's (the
    /// shared tags, any image); a tenant's own tags first, then the shared ones.
    pub scope: Option<String>,
    pub name: Option<String>,
    pub spec: SandboxSpec,
    pub tags: std::collections::BTreeMap<String, String>,
    pub metadata: std::collections::BTreeMap<String, String>,
    pub timeout: Duration,
    pub idle_timeout: Option<Duration>,
    /// What its timeouts do; whether a call resumes it while paused.
    pub lifecycle: sandlot_proto::api::lifecycle::Lifecycle,
}

/// A random id with the daemon's prefix: 16 hex digits.
pub fn new_id(prefix: &str) -> String {
    format!("{prefix}{}", crate::auth::random_hex(8))
}

/// Creates a sandbox: admission, runtime, agent connection, owner task.
pub async fn create(state: &Arc<AppState>, p: CreateParams) -> ApiResult<SandboxRecord> {
    let t0 = Instant::now();
    if state.is_shutting_down() {
        return Err(ApiError::unavailable("the daemon is shutting down"));
    }
    // Host paths only under the operator's allowed list (`sandlot run` is not
    // restricted: it runs as the local root user).
    let viewer = crate::images::viewer(p.scope.as_deref());
    let image = state.images.precheck(viewer, &p.tenant, &p.spec)?;
    // Collections are resolved and their versions pinned into the recorded spec.
    let mut p = p;
    if crate::collection_mount::has_collection_mounts(&p.spec) {
        let (st, tenant, mut spec) = (state.clone(), p.tenant.clone(), p.spec.clone());
        p.spec = tokio::task::spawn_blocking(move || {
            crate::collection_mount::pin(&st.vfs, &tenant, &mut spec).map(|()| spec)
        })
        .await
        .map_err(ApiError::internal)??;
    }
    let spec_json = serde_json::to_value(&p.spec).map_err(ApiError::internal)?;
    // A ready sandbox of this shape, if a warm pool has one: it keeps its id.
    // From here on it is either claimed or handed back (never dropped). Claims
    // take turns (see `AppState::claim_slots`); a cold create does not hold one.
    let claim_permit = state
        .claim_slots
        .acquire()
        .await
        .map_err(ApiError::internal)?;
    let mut warm = state.pools.take(&p.spec);
    // A pool's sandbox runs the image its shape names in the shared namespace; a
    // tenant whose own tag of that name means another image (or a pool started
    // before the tag moved) goes cold.
    if let Some((pool, w)) = warm.take() {
        if image.is_none() || state.images.image_of(&w.id) == image {
            warm = Some((pool, w));
        } else {
            state.pools.put_back(&pool, w);
        }
    }
    let _claim_permit = warm.is_some().then_some(claim_permit);
    let id = match &warm {
        Some((_, w)) => w.id.clone(),
        None => new_id(&state.cfg.id_prefix),
    };
    let now = now_ms();
    // What a claimed sandbox must change for this request. With nothing to change it
    // is the request's sandbox as it stands, and it runs already: it is admitted as
    // running, in one commit. Otherwise it is recorded as running only once it has
    // taken the request's settings, so a crash in between cannot leave a running
    // record of a sandbox with the pool's.
    let setup = warm.as_ref().map(|(_, w)| ClaimSetup::plan(w, &p.spec));
    let warm_pid = match (&warm, &setup) {
        (Some((_, w)), Some(s)) if s.is_empty() => Some(w.inst.pid()),
        _ => None,
    };
    let rec = SandboxRecord {
        id: id.clone(),
        tenant: p.tenant.clone(),
        name: p.name.clone(),
        spec: spec_json,
        tags: p.tags,
        metadata: p.metadata,
        state: match warm_pid {
            Some(_) => SandboxState::Running,
            None => SandboxState::Creating,
        },
        end_reason: None,
        exit_code: None,
        exit_signal: None,
        error: None,
        pid: warm_pid,
        memory_bytes: p.spec.resources.memory.bytes(),
        created_at: now,
        started_at: warm_pid.map(|_| now),
        ended_at: None,
        expires_at: now + p.timeout.as_millis() as i64,
        idle_timeout_ms: p.idle_timeout.map(|d| d.as_millis() as i64),
        usage: UsageRecord::default(),
        lifecycle: p.lifecycle,
        timeout_ms: p.timeout.as_millis() as i64,
    };
    let quota = state.cfg.quota(&p.tenant);
    let admission = state
        .store
        .admit_sandbox(&rec, quota.max_sandboxes, quota.max_memory.bytes());
    let admission = match admission {
        Ok(a) => a,
        Err(e) => {
            if let Some((pool, w)) = warm {
                state.pools.put_back(&pool, w);
            }
            return Err(ApiError::internal(e));
        }
    };
    let warm = match warm {
        Some((_, w)) if admission == Admission::Admitted => Some(w),
        Some((pool, w)) => {
            state.pools.put_back(&pool, w);
            None
        }
        None => None,
    };
    match admission {
        Admission::Admitted => {}
        Admission::TooManySandboxes(n) => {
            return Err(ApiError::quota(format!(
                "tenant {} has {n} live sandboxes, its quota is {}",
                p.tenant, quota.max_sandboxes
            )))
        }
        Admission::TooMuchMemory { used } => {
            return Err(ApiError::quota(format!(
            "tenant {}: {} of memory in live sandboxes plus {} requested exceeds the quota of {}",
            p.tenant,
            sandlot_proto::units::ByteSize(used),
            p.spec.resources.memory,
            quota.max_memory
        )))
        }
        Admission::NameTaken => {
            return Err(ApiError::conflict(format!(
                "a live sandbox named {:?} already exists",
                p.name.unwrap_or_default()
            )))
        }
    }
    state.metrics.live_sandboxes.fetch_add(1, Ordering::Relaxed);
    let span = tracing::info_span!("sandbox", sandbox_id = %id, tenant = %p.tenant);
    // A pooled sandbox only needs the request's network policy and process
    // defaults; if setting them fails (its agent died while it waited), it is
    // discarded and the create goes cold.
    let mut claimed = None;
    if let (Some(w), Some(setup)) = (warm, setup) {
        match crate::pool::configure(state, &w, setup).await {
            Ok(()) => {
                // Its egress counts against the claiming tenant's caps from now on.
                crate::network::set_tenant(state, &w.id, &p.tenant);
                claimed = Some((w.inst, w.guest, w.code))
            }
            Err(e) => {
                span.in_scope(|| tracing::warn!("pooled sandbox unusable, creating cold: {e}"));
                crate::pool::discard(state, w).await;
            }
        }
    }
    let from_pool = claimed.is_some();
    let (inst, guest, code) = match claimed {
        Some(c) => (c.0, Some(c.1), c.2),
        None => (
            cold_create(state, &id, &p.tenant, p.scope.as_deref(), &p.spec, &span).await?,
            None,
            None,
        ),
    };
    // Record the pid before anything else can fail, so a crash from here on leaves
    // a record that the next start re-adopts or cleans. A claim with nothing to
    // change recorded it at its admission.
    let started_at = match rec.started_at {
        Some(at) if from_pool => at,
        _ => {
            let at = now_ms();
            if let Err(e) = state.store.mark_running(&id, inst.pid(), at) {
                teardown_failed(state, inst, &id, "record the sandbox").await;
                return Err(ApiError::internal(e));
            }
            at
        }
    };
    let guest = match guest {
        Some(g) => g,
        None => match GuestClient::connect(inst.agent_socket()).await {
            Ok(g) => g,
            Err(e) => {
                span.in_scope(|| tracing::error!("connect to the agent: {e}"));
                teardown_failed(state, inst, &id, "connect to the agent").await;
                return Err(
                    ApiError::internal(format!("connect to the agent of {id}: {e}")).or_exhausted(),
                );
            }
        },
    };
    let mut rec = rec;
    rec.state = SandboxState::Running;
    rec.pid = Some(inst.pid());
    rec.started_at = Some(started_at);
    let h = Arc::new(SandboxHandle::new(
        Arc::from(inst),
        guest,
        &rec,
        &state.code_output,
    ));
    if let Some(c) = code {
        h.contexts.adopt(c);
    }
    state.register(h.clone());
    tokio::spawn(own(state.clone(), h.clone(), false).instrument(h.span.clone()));
    state
        .metrics
        .sandboxes_created
        .fetch_add(1, Ordering::Relaxed);
    state.metrics.observe_create(t0.elapsed());
    span.in_scope(|| {
        tracing::info!(
            elapsed_ms = t0.elapsed().as_secs_f64() * 1e3,
            "sandbox created"
        )
    });
    Ok(rec)
}

/// An `Idempotency-Key` of a create, with the hash of the request it came with.
#[derive(Debug, Clone)]
pub struct IdempotencyKey {
    pub key: String,
    pub request_hash: String,
}

impl IdempotencyKey {
    /// Checks the header value: 1 to 255 visible ASCII characters.
    pub fn parse(value: &[u8], request: &serde_json::Value) -> ApiResult<IdempotencyKey> {
        let ok = !value.is_empty()
            && value.len() <= 255
            && value.iter().all(|b| (0x21..=0x7e).contains(b));
        if !ok {
            return Err(ApiError::invalid(
                "Idempotency-Key",
                "use 1 to 255 visible ASCII characters (a UUID is typical)",
            ));
        }
        use sha2::Digest;
        Ok(IdempotencyKey {
            key: String::from_utf8_lossy(value).into_owned(),
            request_hash: crate::auth::hex(&sha2::Sha256::digest(request.to_string().as_bytes())),
        })
    }
}

/// How long a create with a key waits for another create with the same key.
const IDEMPOTENT_WAIT: Duration = Duration::from_secs(120);

/// [`create`] with an optional idempotency key: a repeated request with the same
/// key and body gets the sandbox the first one made (`true`: replayed) instead of
/// a second sandbox; the same key with another body is refused. A failed create
/// forgets its key, so a retry tries again. The create runs in its own task: a
/// client that goes away mid-create does not cancel it (its retry finds it).
pub async fn create_idempotent(
    state: &Arc<AppState>,
    p: CreateParams,
    key: Option<IdempotencyKey>,
) -> ApiResult<(SandboxRecord, bool)> {
    let Some(key) = key else {
        let st = state.clone();
        return crate::error::to_completion(async move { create(&st, p).await })
            .await
            .map(|r| (r, false));
    };
    let deadline = Instant::now() + IDEMPOTENT_WAIT;
    loop {
        let found = state
            .store
            .reserve_idempotency_key(&p.tenant, &key.key, &key.request_hash, now_ms())
            .map_err(ApiError::internal)?;
        let KeyReservation::Taken {
            request_hash,
            sandbox_id,
        } = found
        else {
            break;
        };
        if request_hash != key.request_hash {
            return Err(ApiError::of(
                ErrorCode::IdempotencyMismatch,
                format!(
                    "Idempotency-Key {:?} was used for a create with a different body",
                    key.key
                ),
            ));
        }
        if let Some(id) = sandbox_id {
            match state.store.get_sandbox(&id).map_err(ApiError::internal)? {
                Some(rec) if rec.tenant == p.tenant => return Ok((rec, true)),
                // Its record is gone: the key is stale.
                _ => {
                    let _ = state.store.release_idempotency_key(&p.tenant, &key.key);
                    continue;
                }
            }
        }
        if Instant::now() >= deadline {
            return Err(ApiError::conflict(format!(
                "a create with Idempotency-Key {:?} is still running",
                key.key
            )));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let st = state.clone();
    tokio::spawn(async move {
        let tenant = p.tenant.clone();
        let r = create(&st, p).await;
        let kept = match &r {
            Ok(rec) => st.store.bind_idempotency_key(&tenant, &key.key, &rec.id),
            Err(_) => st.store.release_idempotency_key(&tenant, &key.key),
        };
        if let Err(e) = kept {
            tracing::warn!("idempotency key {:?}: {e}", key.key);
        }
        r.map(|r| (r, false))
    })
    .await
    .map_err(ApiError::internal)?
}

/// Starts a sandbox on the runtime (no pool). On failure the record is closed as
/// `create_failed` and the error mapped for the API.
async fn cold_create(
    state: &Arc<AppState>,
    id: &str,
    tenant: &str,
    scope: Option<&str>,
    spec: &SandboxSpec,
    span: &tracing::Span,
) -> ApiResult<Box<dyn Instance>> {
    let (spec, cid, tenant, scope, st) = (
        spec.clone(),
        id.to_string(),
        tenant.to_string(),
        scope.map(str::to_string),
        state.clone(),
    );
    // Image, volumes and secrets are resolved (and the writable layer mounted)
    // off the async threads; failures are recorded like runtime failures.
    let permit = state
        .create_slots
        .acquire()
        .await
        .map_err(ApiError::internal)?;
    let created = tokio::task::spawn_blocking(move || {
        let viewer = crate::images::viewer(scope.as_deref());
        start_instance(&st, &cid, &tenant, viewer, &spec)
    })
    .await
    .map_err(ApiError::internal)?;
    drop(permit);
    match created {
        Ok((i, _)) => Ok(i),
        Err(e) => {
            let api = match &e {
                Ok(e) => create_error(e),
                Err(api) => api.clone().or_exhausted(),
            };
            let e = match e {
                Ok(e) => e.to_string(),
                Err(api) => api.message,
            };
            span.in_scope(|| tracing::warn!("create failed: {}", crate::routes::one_line(&e)));
            let shown = if api.code == ErrorCode::Internal {
                "the runtime failed to create the sandbox".to_string()
            } else {
                api.message.clone()
            };
            let _ = state.store.mark_stopped(
                id,
                EndReason::CreateFailed,
                (None, None),
                Some(&shown),
                now_ms(),
            );
            state.metrics.live_sandboxes.fetch_sub(1, Ordering::Relaxed);
            state.metrics.stopped(EndReason::CreateFailed.as_str());
            Err(api)
        }
    }
}

/// A failure of [`start_instance`]: the runtime's, or one already mapped for the
/// API (a bad image, volume, secret or network policy).
pub type StartError = Result<RuntimeError, ApiError>;

/// Resolves `spec`'s image (in `viewer`'s view), volumes, secrets and network
/// slot and starts the sandbox on the runtime. Blocking. On failure everything
/// prepared is released. Also returns the resolved image (a pool needs it to
/// configure a claim).
pub fn start_instance(
    state: &Arc<AppState>,
    id: &str,
    tenant: &str,
    viewer: sandlot_store::Viewer,
    spec: &SandboxSpec,
) -> Result<
    (
        Box<dyn Instance>,
        Option<sandlot_runtime::mounts::ImageRoot>,
    ),
    StartError,
> {
    let mut opts = state
        .images
        .prepare(id, tenant, viewer, spec)
        .map_err(Err)?;
    if let Err(e) = crate::memory::add_mounts(&state.memory, tenant, spec, &mut opts) {
        state.images.release(id);
        return Err(Err(e));
    }
    if let Err(e) = crate::network::prepare(state, id, tenant, spec, &mut opts) {
        state.images.release(id);
        return Err(Err(e));
    }
    if let Err(e) = state
        .collection_mounts
        .prepare(&state.vfs, id, tenant, spec, &mut opts)
    {
        state.images.release(id);
        crate::network::release(state, id);
        return Err(Err(e));
    }
    let image = opts.image.clone();
    let allowed = crate::isolation::permitted(state, spec.isolation).and_then(|()| {
        state
            .backends
            .get(spec.isolation)
            .map_err(|why| crate::isolation::unavailable(spec.isolation, why))
    });
    let created = match allowed {
        Ok(b) => b.create(id, spec, opts),
        Err(e) => {
            state.images.release(id);
            crate::network::release(state, id);
            state.collection_mounts.release(id);
            return Err(Err(e));
        }
    };
    match created {
        Ok(i) => {
            state.collection_mounts.attach(id, &*i);
            Ok((i, image))
        }
        Err(e) => {
            state.images.release(id);
            crate::network::release(state, id);
            state.collection_mounts.release(id);
            Err(Ok(e))
        }
    }
}

async fn teardown_failed(state: &Arc<AppState>, inst: Box<dyn Instance>, id: &str, what: &str) {
    let _ = tokio::task::spawn_blocking(move || inst.terminate()).await;
    state.images.release(id);
    crate::network::release(state, id);
    let st = state.clone();
    let cid = id.to_string();
    let _ = tokio::task::spawn_blocking(move || st.collection_mounts.release(&cid)).await;
    let _ = state.store.mark_stopped(
        id,
        EndReason::CreateFailed,
        (None, None),
        Some(&format!("could not {what}")),
        now_ms(),
    );
    state.metrics.live_sandboxes.fetch_sub(1, Ordering::Relaxed);
    state.metrics.stopped(EndReason::CreateFailed.as_str());
}

/// Maps a runtime create error to the API: the caller's mistakes are 400 naming
/// the field (never a host path: the caller knows which path it gave); exhaustion
/// is 503 (`unavailable` for the runtime's own capacity, `host_exhausted` for
/// descriptors, memory or disk of the host); the rest, the daemon's own directories
/// included, is an opaque 500.
fn create_error(e: &RuntimeError) -> ApiError {
    use sandlot_runtime::mounts::MountError;
    // The image's own files (a link at a path the sandbox needs): the path is the
    // sandbox's, never the host's, and its text is the tenant's (never read for
    // signs of the host's exhaustion).
    match e {
        RuntimeError::Refused {
            path,
            problem,
            detail,
        } => return refused(path, problem).with_detail(detail),
        RuntimeError::Mount(
            m @ MountError::InRoot {
                path,
                problem,
                source,
                ..
            },
        ) => return refused(path, problem).with_detail(format!("{m}: {source}")),
        _ => {}
    }
    if let Some(what) = crate::error::Exhausted::in_error(e) {
        return ApiError::host_exhausted(what).with_detail(e);
    }
    match e {
        RuntimeError::Spec(s) => ApiError::invalid(s.field(), spec_problem(s)),
        RuntimeError::Mount(MountError::MissingSource { index, .. }) => ApiError::invalid(
            format!("mounts[{index}].source"),
            "does not exist on the host",
        ),
        RuntimeError::Mount(MountError::MissingRootfs { .. }) => {
            ApiError::invalid("rootfs", "is not a directory on the host")
        }
        RuntimeError::Exhausted(what) => {
            ApiError::unavailable(format!("no free {what} on this host"))
        }
        other => ApiError::internal(other),
    }
}

/// 400 for a path inside the sandbox that its own files (or its secrets) make
/// impossible: on `secrets` for a secret file, else on `image`.
fn refused(path: &str, problem: impl std::fmt::Display) -> ApiError {
    let field = if path.starts_with(&format!("{}/", sandlot_runtime::mounts::SECRETS_DIR)) {
        "secrets"
    } else {
        "image"
    };
    ApiError::invalid(field, format!("{path} in the sandbox {problem}"))
}

pub fn spec_problem(e: &sandlot_proto::spec::SpecError) -> String {
    let s = e.to_string();
    let prefix = format!("{}: ", e.field());
    s.strip_prefix(&prefix).map(str::to_string).unwrap_or(s)
}

/// Starts `h`'s owner task ([`own`]).
pub fn start_owner(state: &Arc<AppState>, h: &Arc<SandboxHandle>, adopted: bool) {
    tokio::spawn(own(state.clone(), h.clone(), adopted).instrument(h.span.clone()));
}

/// The owner task: waits for a stop request, a timeout or the exit of PID 1, then
/// tears the sandbox down and records the outcome (or hands it on, paused or to
/// a successor).
pub async fn own(state: Arc<AppState>, h: Arc<SandboxHandle>, adopted: bool) {
    let mut closer = PauseCloser {
        state: state.clone(),
        h: h.clone(),
        end: None,
    };
    closer.end = Some(own_until_done(state, h, adopted).await);
}

/// How an owner task ended.
#[derive(Debug, Clone, Copy)]
enum OwnerEnd {
    /// The sandbox is paused.
    Paused,
    /// A successor handle took the sandbox over (a pause that failed).
    HandedOn,
    /// The sandbox stopped.
    Stopped,
}

/// Closes a handle's pause slot when its owner task ends, however it ends (a
/// panic included).
struct PauseCloser {
    state: Arc<AppState>,
    h: Arc<SandboxHandle>,
    end: Option<OwnerEnd>,
}

impl Drop for PauseCloser {
    fn drop(&mut self) {
        self.h.close_pause_requests(&self.state, self.end);
    }
}

async fn own_until_done(state: Arc<AppState>, h: Arc<SandboxHandle>, adopted: bool) -> OwnerEnd {
    let exit_watch = h.inst.exit_watch().ok().and_then(|fd| {
        // SAFETY: the AsyncFd owns `fd` (the instance's new exit descriptor), so
        // it stays open and unchanged for as long as it is registered.
        unsafe { AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) }.ok()
    });
    if exit_watch.is_none() {
        tracing::warn!("cannot watch the sandbox's PID 1; relying on timeouts");
    }
    crate::memory_guard::start(&h);
    {
        let hp = h.clone();
        tokio::spawn(
            crate::process::poll_exits(
                h.guest.clone(),
                h.procs.clone(),
                h.exit_poll.clone(),
                async move { hp.stopped().await },
            )
            .instrument(h.span.clone()),
        );
    }
    let mut last_save = Instant::now();
    let (reason, pid1_exited) = loop {
        if let Some(r) = *h.stop_reason.lock().unwrap_or_else(|e| e.into_inner()) {
            break (r, false);
        }
        // A pause happens here, on the owner, like every change of the
        // sandbox's life.
        if let Some(reply) = h.take_pause_request() {
            use crate::pause::Outcome;
            match crate::pause::pause(&state, &h, false).await {
                Outcome::Paused(kind) => {
                    let _ = reply.send(Ok(kind));
                    return OwnerEnd::Paused;
                }
                Outcome::Running(e) => {
                    let _ = reply.send(Err(e));
                    continue;
                }
                Outcome::Replaced(e) => {
                    let _ = reply.send(Err(e));
                    return OwnerEnd::HandedOn;
                }
                Outcome::Ended(e) => {
                    let _ = reply.send(Err(e));
                    break (EndReason::Exited, true);
                }
            }
        }
        let now = now_ms();
        let exp = h.expires_at_ms();
        let idle_deadline = h.idle_timeout_ms.map(|i| {
            if h.active_streams.load(Ordering::Relaxed) > 0 {
                now + i
            } else {
                h.last_activity_ms.load(Ordering::Relaxed) + i
            }
        });
        let clocks = crate::autopause::Clocks {
            now,
            expires_at: exp,
            idle_deadline,
        };
        if let Some(e) = crate::autopause::expiry(&clocks, &h.lifecycle) {
            use crate::autopause::Settled;
            match crate::autopause::on_expiry(&state, &h, e).await {
                Settled::Paused => return OwnerEnd::Paused,
                Settled::Replaced => return OwnerEnd::HandedOn,
                // A request came before the pause began: it runs on.
                Settled::Busy => continue,
                // A stop asked meanwhile (a DELETE during the pause) is why it ends.
                Settled::Stop(reason) => {
                    let asked = *h.stop_reason.lock().unwrap_or_else(|e| e.into_inner());
                    break (asked.unwrap_or(reason), false);
                }
                Settled::Exited => break (EndReason::Exited, true),
            }
        }
        let next = [
            Some(exp),
            idle_deadline,
            Some(now + USAGE_INTERVAL.as_millis() as i64),
        ]
        .into_iter()
        .flatten()
        .min()
        .unwrap_or(exp);
        let sleep = Duration::from_millis((next - now).max(1) as u64);
        tokio::select! {
            r = async {
                match &exit_watch {
                    Some(fd) => fd.readable().await.map(|_| ()),
                    None => std::future::pending().await,
                }
            } => {
                let _ = r;
                break (EndReason::Exited, true);
            }
            _ = h.wake.notified() => {}
            _ = tokio::time::sleep(sleep) => {
                if last_save.elapsed() >= USAGE_INTERVAL {
                    last_save = Instant::now();
                    let (u, mem) = h.usage();
                    h.record_history(&u, mem);
                    if let Err(e) = state.store.save_usage(&h.id, &u) {
                        tracing::warn!("save usage: {e}");
                    }
                }
            }
        }
    };
    // A pause asked from here on is refused at once, not after the teardown.
    h.close_pause_requests(&state, Some(OwnerEnd::Stopped));
    h.request_stop(reason);
    tracing::info!(reason = reason.as_str(), adopted, "stopping sandbox");
    if let Err(e) = state.store.mark_stopping(&h.id, reason) {
        tracing::error!("record stopping: {e}");
    }
    crate::ports::close_sandbox(&state, &h.id).await;
    let (usage, _) = h.usage();
    // First the processes: once PID 1 is gone, its pid namespace is, so nothing of
    // the sandbox runs any more and its record can be final. The caller of a delete
    // waits for this much only.
    let h2 = h.clone();
    let status = tokio::task::spawn_blocking(move || {
        if pid1_exited {
            h2.inst.wait_exit(Duration::from_millis(200))
        } else {
            h2.inst.kill(Duration::from_secs(10))
        }
    })
    .await
    .unwrap_or(None);
    let exit = match status {
        Some(st) if libc::WIFEXITED(st) => (Some(libc::WEXITSTATUS(st)), None),
        Some(st) if libc::WIFSIGNALED(st) => (None, Some(libc::WTERMSIG(st))),
        _ => (None, None),
    };
    if pid1_exited {
        tracing::warn!(code = ?exit.0, signal = ?exit.1, "the sandbox's PID 1 exited on its own");
    }
    // Then the host's side (cgroups, run directory, network slot, image and mount
    // references), off the caller's path; a graceful shutdown waits for it, and the
    // next start's reconcile finishes one a crash interrupted. Counted before the
    // record says stopped: whoever sees that record and waits for the clean-up
    // (an image's removal) finds it running.
    let mut released = vec![h.id.clone()];
    match state.store.checkpoints_of(&h.id) {
        Ok(cps) => released.extend(cps.into_iter().map(|c| c.id)),
        Err(e) => tracing::warn!("list the checkpoints to release: {e}"),
    }
    let cleanup = state.teardowns.begin(released);
    if let Err(e) = state
        .store
        .mark_stopped_with_usage(&h.id, &usage, reason, exit, now_ms())
    {
        tracing::error!("record stopped: {e}");
    }
    state.unregister(&h.id);
    state.metrics.live_sandboxes.fetch_sub(1, Ordering::Relaxed);
    state.metrics.stopped(reason.as_str());
    h.stopped.send_replace(true);
    tracing::info!(reason = reason.as_str(), "sandbox stopped");
    let h2 = h.clone();
    let images = state.images.clone();
    let st = state.clone();
    let term = tokio::task::spawn_blocking(move || {
        let term = h2.inst.terminate();
        images.release_ended(&h2.id);
        crate::network::release(&st, &h2.id);
        st.collection_mounts.release(&h2.id);
        // Last: removing a committed image may wait for every commit in flight.
        crate::checkpoint::remove_all_of(&st, &h2.id);
        term
    })
    .await
    .unwrap_or_else(|e| Err(RuntimeError::Init(format!("teardown task: {e}"))));
    if let Err(e) = term {
        tracing::error!("tear down: {e}");
        if let Err(e) = state.store.record_teardown_error(
            &h.id,
            "teardown failed; the operator has details in the daemon log",
        ) {
            tracing::error!("record teardown error: {e}");
        }
    }
    drop(cleanup);
    tracing::debug!("sandbox cleaned up");
    OwnerEnd::Stopped
}

/// On start: re-adopts sandboxes whose PID 1 survived, records the others as lost,
/// and removes every leftover of this daemon's sandboxes from the host.
///
/// The re-adopted sandboxes are registered but not yet owned: their owner tasks
/// start with [`ReconcileReport::start_owners`], once the network service (and
/// the published ports) have taken over their slots. An owner started before
/// could tear its sandbox down (a timeout that ran out while the daemon was down,
/// a PID 1 that died meanwhile) before the network service exists to release
/// the slot, which then stayed attached to a gone sandbox until the next start.
pub async fn reconcile(state: &Arc<AppState>) -> Result<ReconcileReport, crate::store::StoreError> {
    let mut report = ReconcileReport {
        paused: crate::pause::reconcile(state).await?.paused,
        ..Default::default()
    };
    for rec in state.store.unfinished()? {
        if matches!(rec.state, SandboxState::Paused | SandboxState::Resuming) {
            continue;
        }
        let span = tracing::info_span!("sandbox", sandbox_id = %rec.id, tenant = %rec.tenant);
        let backend = state
            .backends
            .get(crate::isolation::of_record(&rec.spec))
            .ok()
            .cloned();
        let adopted = match (rec.pid, backend) {
            (Some(pid), Some(rt)) => {
                let id = rec.id.clone();
                tokio::task::spawn_blocking(move || rt.adopt(&id, pid))
                    .await
                    .ok()
                    .and_then(Result::ok)
            }
            _ => None,
        };
        let Some(inst) = adopted else {
            // A stop (a delete, a timeout) that the crash interrupted has simply
            // finished: that is no loss.
            if let (SandboxState::Stopping, Some(reason)) = (rec.state, rec.end_reason) {
                span.in_scope(|| tracing::info!("sandbox stopped while the daemon was down"));
                state
                    .store
                    .mark_stopped(&rec.id, reason, (None, None), None, now_ms())?;
                state.metrics.stopped(reason.as_str());
                continue;
            }
            span.in_scope(|| {
                tracing::warn!("sandbox died while the daemon was down: recorded as lost")
            });
            let why = match rec.state {
                SandboxState::Pausing => {
                    "the sandbox ended while it was pausing and the daemon was not running"
                }
                _ => "the sandbox ended while the daemon was not running",
            };
            state.store.mark_stopped(
                &rec.id,
                EndReason::Lost,
                (None, None),
                Some(why),
                now_ms(),
            )?;
            state.metrics.stopped(EndReason::Lost.as_str());
            report.lost.push(rec.id.clone());
            continue;
        };
        let pausing = rec.state == SandboxState::Pausing;
        let connected = if pausing {
            // Its pause never finished: its agent may wait for a checkpoint.
            let inst2: Arc<dyn Instance> = Arc::from(inst);
            let g = match GuestClient::connect(inst2.agent_socket()).await {
                Ok(g) => Ok(g),
                Err(e) => crate::pause::wake(&inst2).await.ok_or(e),
            };
            if g.is_ok() {
                state
                    .store
                    .abort_pause(&rec.id, "the daemon stopped while the sandbox paused")?;
            }
            (inst2, g)
        } else {
            let g = GuestClient::connect(inst.agent_socket()).await;
            (Arc::from(inst), g)
        };
        let (inst, connected) = connected;
        let guest = match connected {
            Ok(g) => g,
            Err(e) => {
                span.in_scope(|| {
                    tracing::warn!("adopted sandbox's agent does not answer ({e}): terminating")
                });
                let _ = tokio::task::spawn_blocking(move || inst.terminate()).await;
                // Its collection mounts go with the reconcile below (it is not live).
                state.store.mark_stopped(
                    &rec.id,
                    EndReason::Lost,
                    (None, None),
                    Some("the sandbox's agent did not answer after a daemon restart"),
                    now_ms(),
                )?;
                report.lost.push(rec.id.clone());
                continue;
            }
        };
        let h = Arc::new(SandboxHandle::new(inst, guest, &rec, &state.code_output));
        // Its code contexts' drivers and kernels belong to no context now: they
        // are ended meanwhile, before any context of it is created.
        h.contexts.end_stale(h.guest.clone(), span.clone());
        state.register(h.clone());
        state.metrics.live_sandboxes.fetch_add(1, Ordering::Relaxed);
        if rec.state == SandboxState::Stopping || rec.state == SandboxState::Creating {
            h.request_stop(rec.end_reason.unwrap_or(EndReason::Deleted));
        }
        // An operator who raised the minimum (or lowered the ceiling) meanwhile:
        // what runs below it now stops.
        let isolation = crate::isolation::of_record(&rec.spec);
        if let Err(why) = state.cfg.isolation.permits(isolation) {
            span.in_scope(|| tracing::warn!("re-adopted sandbox's isolation {why}: stopping it"));
            h.request_stop(EndReason::Policy);
        }
        span.in_scope(|| tracing::info!(pid = h.inst.pid(), "re-adopted sandbox"));
        report.adopted.push(rec.id.clone());
        report.unowned.push(h);
    }
    // Collection mounts: the re-adopted sandboxes' helpers keep serving; everything
    // else (helpers, mounts, directories) goes, before the cgroups are swept.
    let st = state.clone();
    let live = state.live_ids();
    let mounts = tokio::task::spawn_blocking(move || st.collection_mounts.reconcile(&live))
        .await
        .unwrap_or_default();
    if mounts.kept > 0 || !mounts.removed.is_empty() || !mounts.dead.is_empty() {
        tracing::info!(
            kept = mounts.kept,
            removed = mounts.removed.len(),
            dead = mounts.dead.len(),
            "reconciled collection mounts"
        );
    }
    // Leftovers of this daemon's sandboxes that no record claims (e.g. the daemon
    // died between the runtime's create and recording the pid): kill and remove.
    for rt in state.backends.available() {
        let rt = rt.clone();
        let prefix = state.cfg.id_prefix.clone();
        let live: Vec<String> = state.live_ids();
        let left = tokio::task::spawn_blocking(move || rt.reap_leftovers(&prefix, &live))
            .await
            .unwrap_or_default();
        report.orphans.extend(left.killed);
        report.swept.extend(left.swept);
    }
    let images = state.images.clone();
    // A paused sandbox keeps its writable layer and image lease.
    let mut keep = state.live_ids();
    keep.extend(report.paused.iter().cloned());
    // Checkpoints and snapshots hold their images under their own ids (those
    // of ended sandboxes and half-made snapshots are removed later, by
    // `checkpoint::reconcile`, which releases them).
    if let Ok(all) = state.store.all_checkpoints() {
        keep.extend(all.into_iter().map(|c| c.id));
    }
    if let Ok(all) = state.store.all_snapshots() {
        keep.extend(all.into_iter().map(|s| s.id));
    }
    let _ = tokio::task::spawn_blocking(move || images.reconcile(&keep)).await;
    Ok(report)
}

/// What reconciliation did.
#[derive(Default)]
pub struct ReconcileReport {
    pub adopted: Vec<String>,
    /// Paused sandboxes, kept as they were.
    pub paused: Vec<String>,
    pub lost: Vec<String>,
    pub orphans: Vec<String>,
    pub swept: Vec<String>,
    /// The re-adopted sandboxes, registered, whose owner tasks are still to start.
    unowned: Vec<Arc<SandboxHandle>>,
}

impl ReconcileReport {
    /// Starts the owner task of each re-adopted sandbox: call once the network
    /// service and the published ports are up (see [`reconcile`]).
    pub fn start_owners(&mut self, state: &Arc<AppState>) {
        for h in self.unowned.drain(..) {
            tokio::spawn(own(state.clone(), h.clone(), true).instrument(h.span.clone()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandlot_runtime::mounts::MountError;
    use std::path::PathBuf;

    #[test]
    fn a_pause_asked_as_the_owner_ends_is_given_back_to_answer_and_later_ones_are_refused() {
        let mut slot = PauseSlot::Open(None);
        let (tx, mut pending) = tokio::sync::oneshot::channel();
        slot.ask(tx).unwrap();
        let (tx2, _rx2) = tokio::sync::oneshot::channel();
        assert_eq!(slot.ask(tx2).unwrap_err().0, PauseRefused::Asked);
        // The owner ends without taking it: the one closing gets it to answer.
        let left = slot.close().expect("the pause still asked");
        left.send(Err(ApiError::conflict("stopped"))).unwrap();
        assert!(pending.try_recv().unwrap().is_err());
        let (tx3, _rx3) = tokio::sync::oneshot::channel();
        assert_eq!(slot.ask(tx3).unwrap_err().0, PauseRefused::Closed);
        assert!(slot.take().is_none());
        assert!(slot.close().is_none());
    }

    #[test]
    fn create_errors_name_the_field_and_never_a_host_path() {
        let host = PathBuf::from("/var/lib/sandlot/volumes/acme/v/data");
        let e = create_error(&RuntimeError::Mount(MountError::MissingSource {
            index: 2,
            path: host.clone(),
        }));
        assert_eq!(
            (e.status.as_u16(), e.field.as_deref()),
            (400, Some("mounts[2].source"))
        );
        assert!(!e.message.contains("/var/lib"), "{}", e.message);
        let e = create_error(&RuntimeError::Mount(MountError::MissingRootfs {
            path: host.clone(),
        }));
        assert_eq!(
            (e.status.as_u16(), e.field.as_deref()),
            (400, Some("rootfs"))
        );
        assert!(!e.message.contains("/var/lib"), "{}", e.message);
        // The daemon's own directories missing are the daemon's failure.
        for m in [
            MountError::MissingLayer { path: host.clone() },
            MountError::MissingShared { path: host.clone() },
        ] {
            let e = create_error(&RuntimeError::Mount(m));
            assert_eq!(e.status.as_u16(), 500);
            assert!(!e.message.contains("/var/lib"), "{}", e.message);
            assert!(
                e.internal.unwrap().contains("/var/lib"),
                "the log has the path"
            );
        }
        // The image's own files: 400 on `image`, naming the path in the sandbox.
        let e = create_error(&RuntimeError::Refused {
            path: "/tmp".into(),
            problem: "is a symbolic link where none may be, or a loop of links".into(),
            detail: "mkdir /tmp: Too many levels of symbolic links (os error 40)".into(),
        });
        assert_eq!(
            (e.status.as_u16(), e.field.as_deref()),
            (400, Some("image"))
        );
        let s = create_error(&RuntimeError::Refused {
            path: "/run/secrets/big".into(),
            problem: "does not fit".into(),
            detail: String::new(),
        });
        assert_eq!(
            (s.status.as_u16(), s.field.as_deref()),
            (400, Some("secrets"))
        );
        // A path the tenant chose that reads like the host's exhaustion is still
        // the tenant's 400.
        let s = create_error(&RuntimeError::Refused {
            path: "/etc/hostname/No space left on device".into(),
            problem: "is reached through a file where a directory must be".into(),
            detail: String::new(),
        });
        assert_eq!(
            (s.status.as_u16(), s.field.as_deref()),
            (400, Some("image"))
        );
        assert!(
            e.message.contains("/tmp in the sandbox is a symbolic link"),
            "{}",
            e.message
        );
    }
}
