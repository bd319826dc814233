//! Warm pools: sandboxes started ahead of time, per spec shape, so that a create
//! request only claims one.
//!
//! A *shape* is everything about a sandbox that is fixed once its PID 1 runs: image
//! or rootfs, mounts, hostname, resources, network. The rest of a request (base
//! environment, default user and working directory, lifetime, name, tags) is applied
//! at claim time: the daemon sends the agent a `configure` request and starts the
//! owner task with the caller's timeouts. A request whose shape equals a pool's
//! claims from it; anything else is created cold.
//!
//! Guarantees:
//! * a pooled sandbox is handed out at most once (it leaves the queue under a lock)
//!   and, once claimed, is the caller's alone and torn down like any other;
//! * an unclaimed pooled sandbox has no database record: if the daemon dies, the
//!   next start's reconcile removes it as an orphan of this daemon's id prefix;
//! * the pool refills in the background, one sandbox at a time per pool, so
//!   refilling takes at most one core away from requests, or as many at a time as
//!   there are CPUs once the pool is down to a quarter of its target (the next
//!   claims would otherwise miss and pay a cold create each); failures back off;
//! * while claims keep coming (less than 10 ms apart) the refill waits, unless the
//!   pool is down to a quarter of its target: a cold create costs several claims'
//!   worth of CPU, and the requests come first.

use std::collections::VecDeque;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sandlot_guest::client::GuestClient;
use sandlot_proto::guest::ConfigureRequest;
use sandlot_proto::spec::SandboxSpec;
use sandlot_runtime::mounts::ImageRoot;
use sandlot_runtime::Instance;
use serde::Deserialize;
use tokio::sync::Notify;

use crate::state::AppState;

/// One pool in the operator's configuration (`[[pools]]`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default)]
pub struct PoolConfig {
    /// Name shown in metrics (default: `pool<index>`).
    pub name: Option<String>,
    /// Sandboxes kept ready.
    pub size: usize,
    /// Adaptive pools: each create that finds the pool empty raises its target by
    /// one, up to this (default: `size`, a fixed pool). After `shrink_after` without
    /// such a miss, the target falls back halfway to `size`, and again each period.
    pub max_size: Option<usize>,
    /// See `max_size` (default 60s).
    pub shrink_after: sandlot_proto::units::Seconds,
    /// The shape, in the same schema as the create request body's spec fields.
    /// `env`, `workdir`, `user` and `timeout` are ignored here: requests set them.
    pub spec: SandboxSpec,
    /// Start each ready sandbox's default (Python) code context ahead of time, so
    /// that the first run of code after a claim finds its kernel running. A claim
    /// that changes the process defaults (env, user, working directory) ends it
    /// instead (the next run starts one with the request's).
    pub code_context: bool,
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            name: None,
            size: 1,
            max_size: None,
            shrink_after: sandlot_proto::units::Seconds::secs(60),
            spec: SandboxSpec::default(),
            code_context: false,
        }
    }
}

/// Largest pool size accepted (each ready sandbox holds a uid range slot).
pub const MAX_POOL_SIZE: usize = 1024;

/// The part of a spec a pooled sandbox is made of, as comparable data. The
/// network counts by mode only: a claim replaces the pooled sandbox's policy with
/// the request's (the rules live on the host, not in the sandbox).
pub fn shape(spec: &SandboxSpec) -> serde_json::Value {
    serde_json::to_value(template(spec)).unwrap_or(serde_json::Value::Null)
}

/// `spec` without the fields a claim sets.
fn template(spec: &SandboxSpec) -> SandboxSpec {
    let mut s = spec.clone();
    s.env.clear();
    s.workdir = None;
    s.user = SandboxSpec::default().user;
    s.timeout = None;
    s.network.allow.clear();
    s.network.deny.clear();
    s
}

/// How many sandboxes a pool keeps ready: `min` (the configured size), raised by
/// misses up to `max`, falling back halfway to `min` after each `shrink_after`
/// without a miss. Pure, for tests.
#[derive(Debug, Clone)]
pub struct Sizing {
    min: usize,
    max: usize,
    shrink_after: Duration,
    target: usize,
    /// Last miss, or last shrink step.
    since: Instant,
}

impl Sizing {
    pub fn new(min: usize, max: usize, shrink_after: Duration, now: Instant) -> Sizing {
        let max = max.max(min);
        Sizing {
            min,
            max,
            shrink_after,
            target: min,
            since: now,
        }
    }

    /// A create found the pool empty.
    pub fn on_miss(&mut self, now: Instant) {
        self.target = (self.target + 1).min(self.max);
        self.since = now;
    }

    /// The target at `now`, after any shrink steps due.
    pub fn target(&mut self, now: Instant) -> usize {
        while self.target > self.min && now.duration_since(self.since) >= self.shrink_after {
            self.target -= (self.target - self.min).div_ceil(2);
            self.since += self.shrink_after;
        }
        self.target
    }
}

/// A ready sandbox waiting in a pool.
pub struct Warm {
    pub id: String,
    pub inst: Box<dyn Instance>,
    pub guest: GuestClient,
    /// The image it was started from (its config feeds the claim's defaults).
    image: Option<ImageRoot>,
    /// The process defaults its agent started with (the pool's spec).
    setup: sandlot_runtime::plan::AgentSetup,
    born: Instant,
    /// Its default code context, started ahead (`code_context` pools).
    pub code: Option<Arc<crate::code::Context>>,
}

/// One pool: a queue of ready sandboxes of one shape.
pub struct Pool {
    pub name: String,
    shape: serde_json::Value,
    spec: SandboxSpec,
    code_context: bool,
    sizing: Mutex<Sizing>,
    max: usize,
    ready: Mutex<VecDeque<Warm>>,
    wake: Notify,
    hits: AtomicU64,
    misses: AtomicU64,
    failures: AtomicU64,
    /// Microseconds sandboxes waited in the pool before being claimed (sum).
    waited_us: AtomicU64,
    /// The refill task has sandboxes starting (or is about to check the shutdown).
    filling: std::sync::atomic::AtomicBool,
    /// When a request last claimed a sandbox (see [`refill_delay`]).
    last_hit: Mutex<Option<Instant>>,
}

impl Pool {
    fn queue(&self) -> std::sync::MutexGuard<'_, VecDeque<Warm>> {
        self.ready.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn ready_len(&self) -> usize {
        self.queue().len()
    }

    fn sizing(&self) -> std::sync::MutexGuard<'_, Sizing> {
        self.sizing.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sandboxes it keeps ready now.
    pub fn target(&self) -> usize {
        self.sizing().target(Instant::now())
    }

    fn since_last_hit(&self) -> Option<Duration> {
        self.last_hit
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .map(|t| t.elapsed())
    }
}

/// Quiet time after the last claim before a refill starts.
const REFILL_QUIET: Duration = Duration::from_millis(10);

/// How long a refill waits before starting a sandbox: while claims keep coming (a
/// burst), the CPUs serve them, not the refills they trigger; a cold create costs
/// several claims' worth of CPU. A pool down to a quarter of its target refills at
/// once.
fn refill_delay(since_last_hit: Option<Duration>, ready: usize, target: usize) -> Duration {
    if ready * 4 < target {
        return Duration::ZERO;
    }
    match since_last_hit {
        Some(d) if d < REFILL_QUIET => REFILL_QUIET - d,
        _ => Duration::ZERO,
    }
}

/// Every pool of the daemon.
#[derive(Default)]
pub struct Pools {
    pools: Vec<Arc<Pool>>,
}

impl Pools {
    /// Pools from the configuration; a size of 0 disables a pool.
    pub fn new(cfgs: &[PoolConfig]) -> Pools {
        let pools = cfgs
            .iter()
            .enumerate()
            .filter(|(_, c)| c.size > 0)
            .map(|(i, c)| {
                // The shape decides; the template's per-request fields do not matter.
                let spec = template(&c.spec);
                Arc::new(Pool {
                    name: c.name.clone().unwrap_or_else(|| format!("pool{i}")),
                    shape: shape(&spec),
                    spec,
                    code_context: c.code_context,
                    sizing: Mutex::new(Sizing::new(
                        c.size.min(MAX_POOL_SIZE),
                        c.max_size.unwrap_or(c.size).min(MAX_POOL_SIZE),
                        c.shrink_after.duration(),
                        Instant::now(),
                    )),
                    max: c.max_size.unwrap_or(c.size).max(c.size).min(MAX_POOL_SIZE),
                    ready: Mutex::new(VecDeque::new()),
                    wake: Notify::new(),
                    hits: AtomicU64::new(0),
                    misses: AtomicU64::new(0),
                    failures: AtomicU64::new(0),
                    waited_us: AtomicU64::new(0),
                    filling: std::sync::atomic::AtomicBool::new(false),
                    last_hit: Mutex::new(None),
                })
            })
            .collect();
        Pools { pools }
    }

    pub fn is_empty(&self) -> bool {
        self.pools.is_empty()
    }

    /// The pool serving `spec`'s shape, if any.
    pub fn for_spec(&self, spec: &SandboxSpec) -> Option<Arc<Pool>> {
        if self.pools.is_empty() {
            return None;
        }
        let s = shape(spec);
        self.pools.iter().find(|p| p.shape == s).cloned()
    }

    /// Takes a ready sandbox of `spec`'s shape, counting a hit or (for a pooled
    /// shape with an empty queue) a miss. The refill task is woken either way.
    pub fn take(&self, spec: &SandboxSpec) -> Option<(Arc<Pool>, Warm)> {
        let pool = self.for_spec(spec)?;
        let w = pool.queue().pop_front();
        pool.wake.notify_one();
        match w {
            Some(w) => {
                pool.hits.fetch_add(1, Ordering::Relaxed);
                *pool.last_hit.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
                pool.waited_us
                    .fetch_add(w.born.elapsed().as_micros() as u64, Ordering::Relaxed);
                Some((pool, w))
            }
            None => {
                pool.misses.fetch_add(1, Ordering::Relaxed);
                pool.sizing().on_miss(Instant::now());
                None
            }
        }
    }

    /// Returns an untouched sandbox (its claim was refused, e.g. by a quota).
    pub fn put_back(&self, pool: &Arc<Pool>, w: Warm) {
        pool.hits.fetch_sub(1, Ordering::Relaxed);
        pool.queue().push_front(w);
    }

    /// Starts one refill task per pool.
    pub fn start(state: &Arc<AppState>) {
        for p in &state.pools.pools {
            tokio::spawn(refill(state.clone(), p.clone()));
        }
    }

    /// Tears down every ready sandbox (daemon shutdown). Refill tasks stop on
    /// their own once the daemon is shutting down.
    pub async fn drain(state: &Arc<AppState>) {
        // A refill in flight finishes its sandbox and, seeing the shutdown, tears
        // it down itself: wait for it (bounded), so nothing outlives the daemon.
        let deadline = Instant::now() + Duration::from_secs(30);
        for p in &state.pools.pools {
            p.wake.notify_one();
            while p.filling.load(Ordering::SeqCst) && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            let all: Vec<Warm> = p.queue().drain(..).collect();
            for w in all {
                discard(state, w).await;
            }
        }
    }

    /// Prometheus text for the pools.
    pub fn render(&self, o: &mut String) {
        if self.pools.is_empty() {
            return;
        }
        /// Name, help, type and value of one per-pool metric.
        type PoolMetric = (&'static str, &'static str, &'static str, fn(&Pool) -> u64);
        let metrics: [PoolMetric; 6] = [
            (
                "sandlot_pool_ready",
                "Sandboxes ready in a warm pool.",
                "gauge",
                |p| p.ready_len() as u64,
            ),
            (
                "sandlot_pool_target",
                "Sandboxes a warm pool keeps ready now (adaptive pools move between size and max_size).",
                "gauge",
                |p| p.target() as u64,
            ),
            (
                "sandlot_pool_max",
                "Largest target of a warm pool (max_size).",
                "gauge",
                |p| p.max as u64,
            ),
            (
                "sandlot_pool_hits_total",
                "Creates served from a warm pool.",
                "counter",
                |p| p.hits.load(Ordering::Relaxed),
            ),
            (
                "sandlot_pool_misses_total",
                "Creates of a pooled shape that found the pool empty.",
                "counter",
                |p| p.misses.load(Ordering::Relaxed),
            ),
            (
                "sandlot_pool_refill_failures_total",
                "Failed attempts to start a pooled sandbox.",
                "counter",
                |p| p.failures.load(Ordering::Relaxed),
            ),
        ];
        for (name, help, kind, f) in metrics {
            let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} {kind}");
            for p in &self.pools {
                let _ = writeln!(o, "{name}{{pool=\"{}\"}} {}", p.name, f(p));
            }
        }
    }
}

/// What a claimed sandbox must change to become the request's: its network policy
/// (for a mode with a network slot) and, when they differ from the ones its agent
/// started with, its process defaults (computed exactly as the runtime computes
/// them for a cold start of the request's spec). Planned before the admission: a
/// claim with nothing to change is the request's sandbox as it stands, so it is
/// admitted as running at once (`sandbox::create`).
pub struct ClaimSetup {
    network: Option<sandlot_proto::spec::NetworkSpec>,
    agent: Option<sandlot_runtime::plan::AgentSetup>,
}

impl ClaimSetup {
    pub fn plan(w: &Warm, spec: &SandboxSpec) -> ClaimSetup {
        let network = (spec.network.mode != sandlot_proto::spec::NetworkMode::None)
            .then(|| spec.network.clone());
        let hostname = sandlot_runtime::plan::sandbox_hostname(&w.id, spec);
        let setup = sandlot_runtime::plan::agent_setup(
            &hostname,
            spec,
            w.image.as_ref(),
            &sandlot_runtime::Secrets::default(),
        );
        // The same defaults as the agent's (no env, user or working directory of
        // the request's own): no round trip needed.
        let agent = (setup != w.setup).then_some(setup);
        ClaimSetup { network, agent }
    }

    /// Nothing to change: the pooled sandbox is already what the request asks for.
    pub fn is_empty(&self) -> bool {
        self.network.is_none() && self.agent.is_none()
    }
}

/// Applies `setup` to the claimed sandbox `w`.
pub async fn configure(state: &Arc<AppState>, w: &Warm, setup: ClaimSetup) -> Result<(), String> {
    if let Some(network) = &setup.network {
        // In memory plus one small SQLite update, like the admission before it: run
        // on this task rather than a blocking-pool thread (a burst of `allow`
        // claims started dozens of them).
        crate::network::set_at_claim(state, &w.id, network)
            .map_err(|e| format!("set the network policy: {}", e.message))?;
    }
    let Some(agent) = setup.agent else {
        return Ok(());
    };
    // A pre-started code context has the pool's process defaults, not the request's.
    if let Some(c) = &w.code {
        c.end(&w.guest).await;
    }
    w.guest
        .configure(ConfigureRequest {
            env: agent.env,
            default_user: agent.default_user,
            default_cwd: agent.default_cwd,
        })
        .await
        .map_err(|e| e.to_string())
}

/// Why a spec cannot be a pool's shape, if it cannot: volumes and secrets belong to
/// a tenant, and a pooled sandbox has none until it is claimed.
pub fn unpoolable(spec: &SandboxSpec) -> Option<&'static str> {
    if !spec.volumes.is_empty() {
        Some("volumes belong to a tenant; a pool cannot mount them ahead of a claim")
    } else if !spec.secrets.is_empty() {
        Some("secrets belong to a tenant; a pool cannot inject them ahead of a claim")
    } else if spec.mounts.iter().any(|m| {
        matches!(
            m,
            sandlot_proto::spec::MountSpec::Memory { .. }
                | sandlot_proto::spec::MountSpec::Collection { .. }
        )
    }) {
        Some("memory store and collection mounts belong to a tenant; a pool cannot mount them ahead of a claim")
    } else {
        None
    }
}

/// Terminates a pooled sandbox that will not be used.
pub async fn discard(state: &Arc<AppState>, w: Warm) {
    drop(w.guest);
    discard_instance(state, &w.id, w.inst).await;
}

async fn discard_instance(state: &Arc<AppState>, id: &str, inst: Box<dyn Instance>) {
    match tokio::task::spawn_blocking(move || inst.terminate()).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::warn!(sandbox_id = %id, "tear down pooled sandbox: {e}"),
        Err(e) => tracing::warn!(sandbox_id = %id, "tear down pooled sandbox: {e}"),
    }
    state.images.release(id);
    crate::network::release(state, id);
}

/// Starts one sandbox of the pool's shape.
async fn start_one(state: &Arc<AppState>, pool: &Pool) -> Result<Warm, String> {
    let id = crate::sandbox::new_id(&state.cfg.id_prefix);
    let (st, spec, cid) = (state.clone(), pool.spec.clone(), id.clone());
    // Pooled sandboxes belong to no tenant until claimed; their shapes have no
    // volumes or secrets (checked with the configuration), and their image is a
    // shared one, by a shared name.
    // Refills queue behind requests' cold creates for the same permits.
    let permit = state
        .create_slots
        .acquire()
        .await
        .map_err(|e| format!("create permit: {e}"))?;
    let started = tokio::task::spawn_blocking(move || {
        crate::sandbox::start_instance(&st, &cid, "", sandlot_store::Viewer::Shared, &spec)
    })
    .await;
    drop(permit);
    let (inst, image) = started
        .map_err(|e| format!("create task: {e}"))?
        .map_err(|e| match e {
            Ok(rt) => format!("create {id}: {rt}"),
            Err(api) => format!("create {id}: {}", api.message),
        })?;
    // What the runtime gave the agent (every backend computes it the same way
    // from the same id, spec and image).
    let setup = sandlot_runtime::plan::agent_setup(
        &sandlot_runtime::plan::sandbox_hostname(&id, &pool.spec),
        &pool.spec,
        image.as_ref(),
        &sandlot_runtime::Secrets::default(),
    );
    match GuestClient::connect(inst.agent_socket()).await {
        Ok(guest) => {
            let code = if pool.code_context {
                match crate::code::Contexts::prestart(&guest).await {
                    Ok(c) => Some(c),
                    Err(e) => {
                        // The sandbox is still good; its first run starts the kernel.
                        tracing::warn!(sandbox_id = %id, "pre-starting the code context: {}", e.message);
                        None
                    }
                }
            } else {
                None
            };
            Ok(Warm {
                id,
                inst,
                guest,
                image,
                setup,
                born: Instant::now(),
                code,
            })
        }
        Err(e) => {
            discard_instance(state, &id, inst).await;
            Err(format!("connect to the agent of {id}: {e}"))
        }
    }
}

/// Refills in flight at once for one pool: one, so that refilling takes at most
/// one core from requests; as many as there are CPUs once the pool is down to a
/// quarter of its target, where the next claims would otherwise miss and each pay
/// a cold create on the request path.
fn refill_width(ready: usize, target: usize, cpus: usize) -> usize {
    if ready * 4 < target {
        cpus.max(1)
    } else {
        1
    }
}

/// Keeps `pool` at its target size until the daemon shuts down.
async fn refill(state: Arc<AppState>, pool: Arc<Pool>) {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut backoff = Duration::from_millis(250);
    let mut retry_at: Option<Instant> = None;
    let mut starting: tokio::task::JoinSet<Result<Warm, String>> = tokio::task::JoinSet::new();
    loop {
        // Marked before the shutdown check, so that `drain` either sees this
        // refill in flight or this loop sees the shutdown.
        pool.filling.store(true, Ordering::SeqCst);
        if state.is_shutting_down() {
            // Starts in flight finish their sandboxes: tear them down.
            while let Some(r) = starting.join_next().await {
                if let Ok(Ok(w)) = r {
                    discard(&state, w).await;
                }
            }
            pool.filling.store(false, Ordering::SeqCst);
            return;
        }
        let target = pool.target();
        let ready = pool.ready_len();
        if ready > target {
            // An adaptive pool shrinking: the longest-waiting sandboxes go first.
            let extra = pool.queue().pop_front();
            if let Some(w) = extra {
                discard(&state, w).await;
            }
            continue;
        }
        // Woken by every claim; the timeout re-checks the shutdown flag.
        let mut wait = Duration::from_secs(1);
        if ready + starting.len() < target {
            let backing_off = retry_at
                .map(|t| t.saturating_duration_since(Instant::now()))
                .filter(|d| !d.is_zero());
            let delay = refill_delay(pool.since_last_hit(), ready, target);
            if let Some(b) = backing_off {
                wait = b;
            } else if !delay.is_zero() {
                wait = delay;
            } else if starting.len() < refill_width(ready, target, cpus) {
                let (st, p) = (state.clone(), pool.clone());
                starting.spawn(async move { start_one(&st, &p).await });
                continue;
            }
        }
        pool.filling.store(!starting.is_empty(), Ordering::SeqCst);
        tokio::select! {
            Some(r) = starting.join_next(), if !starting.is_empty() => {
                let started = r.unwrap_or_else(|e| Err(format!("create task: {e}")));
                match started {
                    Ok(w) if state.is_shutting_down() => discard(&state, w).await,
                    Ok(w) => {
                        backoff = Duration::from_millis(250);
                        retry_at = None;
                        pool.queue().push_back(w);
                    }
                    Err(e) => {
                        pool.failures.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(pool = %pool.name, "refill: {e}; retrying in {backoff:?}");
                        retry_at = Some(Instant::now() + backoff);
                        backoff = (backoff * 2).min(Duration::from_secs(30));
                    }
                }
            }
            _ = pool.wake.notified() => {}
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(json: &str) -> SandboxSpec {
        SandboxSpec::from_json(json).unwrap()
    }

    /// Refills wait while claims keep coming (a burst's claims come faster than a
    /// cold create), unless the pool is down to a quarter of its target.
    #[test]
    fn refills_yield_to_a_burst_of_claims_until_the_pool_runs_low() {
        let ms = Duration::from_millis;
        assert_eq!(refill_delay(None, 10, 16), Duration::ZERO, "no claim yet");
        assert_eq!(refill_delay(Some(ms(3)), 10, 16), ms(7));
        assert_eq!(refill_delay(Some(ms(10)), 10, 16), Duration::ZERO);
        assert_eq!(refill_delay(Some(ms(50)), 0, 16), Duration::ZERO);
        // Low water: 3 of 16, 0 of 1 refill at once, however recent the claim.
        assert_eq!(refill_delay(Some(ms(0)), 3, 16), Duration::ZERO);
        assert_eq!(refill_delay(Some(ms(0)), 0, 1), Duration::ZERO);
        assert_eq!(refill_delay(Some(ms(0)), 4, 16), ms(10));
    }

    /// A pool down to a quarter of its target refills on every CPU, otherwise on one
    /// (one at a time, an `allow` pool missed one claim in eight of a sequential run).
    #[test]
    fn a_pool_running_low_refills_on_every_cpu() {
        assert_eq!(refill_width(16, 16, 2), 1);
        assert_eq!(refill_width(4, 16, 2), 1, "a quarter is not yet low");
        assert_eq!(refill_width(3, 16, 2), 2);
        assert_eq!(refill_width(0, 16, 8), 8);
        assert_eq!(refill_width(0, 1, 2), 2);
        assert_eq!(refill_width(0, 16, 0), 1, "at least one");
    }

    #[test]
    fn adaptive_sizing_grows_with_misses_and_shrinks_halfway_when_idle() {
        let t0 = Instant::now();
        let s = Duration::from_secs(60);
        let mut z = Sizing::new(4, 10, s, t0);
        assert_eq!(z.target(t0), 4);
        for _ in 0..20 {
            z.on_miss(t0);
        }
        assert_eq!(z.target(t0), 10, "capped at max");
        assert_eq!(z.target(t0 + Duration::from_secs(59)), 10);
        assert_eq!(z.target(t0 + s), 7, "halfway back: 10 - ceil(6/2)");
        assert_eq!(z.target(t0 + 3 * s), 4, "7 -> 5 -> 4");
        // A fixed pool never moves.
        let mut f = Sizing::new(2, 2, s, t0);
        f.on_miss(t0);
        assert_eq!(f.target(t0 + 10 * s), 2);
        // max below min means fixed.
        let mut g = Sizing::new(3, 1, s, t0);
        g.on_miss(t0);
        assert_eq!(g.target(t0), 3);
    }

    #[test]
    fn tenant_mounts_are_not_poolable() {
        assert!(unpoolable(&spec("{}")).is_none());
        assert!(unpoolable(&spec(r#"{"mounts":[{"type":"tmpfs","target":"/t"}]}"#)).is_none());
        let c = spec(r#"{"mounts":[{"type":"collection","collection":"docs","target":"/d"}]}"#);
        assert!(unpoolable(&c).unwrap().contains("collection"));
        let m = spec(r#"{"mounts":[{"type":"memory","store":"notes","target":"/m"}]}"#);
        assert!(unpoolable(&m).unwrap().contains("memory"));
    }

    #[test]
    fn per_request_fields_do_not_change_the_shape() {
        let base = spec("{}");
        let custom = spec(r#"{"env":{"A":"1"},"workdir":"/tmp","user":"1000","timeout":"10m"}"#);
        assert_eq!(shape(&base), shape(&custom));
        // An allow policy's rules are set at claim; its mode is part of the shape.
        let a = spec(r#"{"network":{"mode":"allow","allow":[{"domain":"a.test"}]}}"#);
        let b = spec(r#"{"network":{"mode":"allow","allow":[{"cidr":"192.0.2.0/24"}]}}"#);
        assert_eq!(shape(&a), shape(&b));
        assert_ne!(shape(&a), shape(&base));
        // So are an open policy's deny rules.
        let open = spec(r#"{"network":{"mode":"open"}}"#);
        let denying = spec(r#"{"network":{"mode":"open","deny":[{"domain":"d.test"}]}}"#);
        assert_eq!(shape(&open), shape(&denying));
    }

    #[test]
    fn fixed_fields_change_the_shape() {
        let base = shape(&spec("{}"));
        for other in [
            r#"{"hostname":"x"}"#,
            r#"{"resources":{"memory":"256M"}}"#,
            r#"{"mounts":[{"type":"tmpfs","target":"/data"}]}"#,
            r#"{"ports":{"public":true}}"#,
        ] {
            assert_ne!(base, shape(&spec(other)), "{other}");
        }
    }

    #[test]
    fn requests_find_the_pool_of_their_shape_only() {
        let pools = Pools::new(&[
            PoolConfig {
                name: Some("small".into()),
                size: 2,
                spec: spec(r#"{"resources":{"memory":"128M"},"env":{"IGNORED":"1"}}"#),
                ..Default::default()
            },
            PoolConfig {
                name: None,
                size: 0,
                spec: spec("{}"),
                ..Default::default()
            },
            PoolConfig {
                name: None,
                size: 3,
                spec: spec(r#"{"hostname":"web"}"#),
                ..Default::default()
            },
        ]);
        assert_eq!(pools.pools.len(), 2, "a size-0 pool is disabled");
        let p = pools
            .for_spec(&spec(r#"{"resources":{"memory":"128M"},"user":"1000"}"#))
            .unwrap();
        assert_eq!(p.name, "small");
        assert_eq!(
            pools.for_spec(&spec(r#"{"hostname":"web"}"#)).unwrap().name,
            "pool2"
        );
        assert!(pools.for_spec(&spec("{}")).is_none());
        // An empty pooled shape is a miss, an unpooled one is neither.
        assert!(pools.take(&spec(r#"{"hostname":"web"}"#)).is_none());
        assert!(pools.take(&spec("{}")).is_none());
        let mut text = String::new();
        pools.render(&mut text);
        assert!(
            text.contains("sandlot_pool_misses_total{pool=\"pool2\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("sandlot_pool_misses_total{pool=\"small\"} 0"),
            "{text}"
        );
        assert!(
            text.contains("sandlot_pool_target{pool=\"pool2\"} 3"),
            "{text}"
        );
    }
}
