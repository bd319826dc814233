//! Network egress of the daemon's sandboxes (see `docs/networking.md`): the
//! `sandlot-net` service (slot pool, nftables table, resolver, proxy) started with
//! the daemon, a slot claimed per `allow`/`open` sandbox at create and released at
//! teardown, the operator's default and ceiling, and the egress audit log in the
//! daemon's SQLite database (tables `net_slots` and `net_log`).

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use rusqlite::{params, OptionalExtension};
use sandlot_net::{AuditEvent, AuditSink, NetService, Survivor};
use sandlot_proto::api::network::NetLogEntry;
use sandlot_proto::spec::{NetworkMode, NetworkSpec, SandboxSpec};
use sandlot_runtime::CreateOptions;

use crate::error::{ApiError, ApiResult};
use crate::state::AppState;
use crate::store::Store;

/// The daemon's network service, or why it is unavailable.
pub type NetSlot = OnceLock<Result<Arc<NetService>, String>>;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS net_slots (
    sandbox_id TEXT PRIMARY KEY,
    slot TEXT NOT NULL,
    spec TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS net_log (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    sandbox_id TEXT NOT NULL,
    at INTEGER NOT NULL,
    kind TEXT NOT NULL,
    name TEXT,
    addr TEXT,
    port INTEGER,
    decision TEXT NOT NULL,
    reason TEXT NOT NULL,
    bytes_out INTEGER NOT NULL,
    bytes_in INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS net_log_sandbox ON net_log (sandbox_id, seq);
";

/// Most entries one log request returns.
pub const MAX_LOG_PAGE: u32 = 10_000;

struct SqliteAudit {
    store: Arc<Store>,
}

impl AuditSink for SqliteAudit {
    fn record(&self, ev: AuditEvent) {
        let r = self.store.lock().execute(
            "INSERT INTO net_log (sandbox_id, at, kind, name, addr, port, decision, reason, bytes_out, bytes_in)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
            params![
                ev.sandbox,
                ev.at_ms,
                ev.kind.as_str(),
                ev.name,
                ev.addr.map(|a| a.to_string()),
                ev.port,
                ev.decision.as_str(),
                ev.reason,
                ev.bytes_out as i64,
                ev.bytes_in as i64
            ],
        );
        if let Err(e) = r {
            tracing::error!(sandbox_id = %ev.sandbox, "record egress audit event: {e}");
        }
    }
}

/// Starts the network service after sandbox reconciliation: the slots of
/// re-adopted sandboxes are kept, every other slot of this daemon is deleted. A
/// failure (no `nft`, not root) is logged; sandboxes then get `none` only.
pub async fn start(state: &Arc<AppState>) {
    let r = start_inner(state).await;
    if let Err(e) = &r {
        tracing::error!("network egress unavailable (only network mode \"none\" works): {e}");
    }
    let _ = state.net.set(r);
}

async fn start_inner(state: &Arc<AppState>) -> Result<Arc<NetService>, String> {
    let rows: Vec<(String, String, String)> = {
        let c = state.store.lock();
        c.execute_batch(SCHEMA)
            .map_err(|e| format!("create network tables: {e}"))?;
        let mut st = c
            .prepare("SELECT sandbox_id, slot, spec FROM net_slots")
            .map_err(|e| e.to_string())?;
        let rows = st
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .map_err(|e| e.to_string())?
            .flatten()
            .collect();
        rows
    };
    let mut survivors = Vec::new();
    for (id, slot, spec) in rows {
        let parsed = serde_json::from_str(&slot)
            .ok()
            .zip(serde_json::from_str::<NetworkSpec>(&spec).ok());
        match (state.handle(&id), parsed) {
            (Some(h), Some((slot, spec))) => survivors.push(Survivor {
                sandbox: id,
                tenant: h.tenant.clone(),
                slot,
                spec,
            }),
            _ => forget(&state.store, &id),
        }
    }
    let audit = Arc::new(SqliteAudit {
        store: state.store.clone(),
    });
    let svc = NetService::start(
        state.cfg.network.clone(),
        &state.cfg.id_prefix,
        audit,
        survivors,
        state.egress_descriptors.clone(),
    )
    .await
    .map_err(|e| e.to_string())?;
    Ok(Arc::new(svc))
}

fn forget(store: &Store, id: &str) {
    let _ = store
        .lock()
        .execute("DELETE FROM net_slots WHERE sandbox_id = ?1", params![id]);
}

/// The network service, or 503 saying why there is none.
pub fn service(state: &AppState) -> ApiResult<Arc<NetService>> {
    match state.net.get() {
        Some(Ok(s)) => Ok(s.clone()),
        // Why is the operator's business (the daemon's log has it): it names host
        // files and commands.
        Some(Err(e)) => Err(ApiError::unavailable(
            "network egress is unavailable on this daemon; only network mode \"none\" works",
        )
        .with_detail(e)),
        None => Err(ApiError::unavailable("network egress is starting")),
    }
}

/// Create-time checks of a spec's network: the operator's ceiling and off-limits
/// ranges (400 naming the field). Applies the operator's default when the request
/// has no `network` (`given` false).
pub fn admit(state: &AppState, spec: &mut SandboxSpec, given: bool) -> ApiResult<()> {
    if !given {
        spec.network = state.cfg.network.default.clone();
    }
    check(state, &spec.network)
}

fn check(state: &AppState, n: &NetworkSpec) -> ApiResult<()> {
    let bad = |e: sandlot_proto::spec::SpecError| {
        ApiError::invalid(e.field(), crate::sandbox::spec_problem(&e))
    };
    n.validate().map_err(bad)?;
    if n.mode > state.cfg.network.ceiling {
        return Err(ApiError::invalid(
            "network.mode",
            format!(
                "mode {:?} is above the operator's ceiling {:?}",
                n.mode.as_str(),
                state.cfg.network.ceiling.as_str()
            ),
        ));
    }
    if n.mode == NetworkMode::None {
        return Ok(());
    }
    service(state)?.check(n).map_err(bad)
}

/// Claims a slot for a sandbox about to be created (blocking; call off the async
/// threads) and points the runtime at it. No-op for mode `none`.
pub fn prepare(
    state: &AppState,
    id: &str,
    tenant: &str,
    spec: &SandboxSpec,
    opts: &mut CreateOptions,
) -> ApiResult<()> {
    if spec.network.mode == NetworkMode::None {
        return Ok(());
    }
    let svc = service(state)?;
    let a =
        svc.attach(id, tenant, &spec.network).map_err(
            |e| match crate::error::Exhausted::in_error(&e) {
                Some(what) => {
                    ApiError::host_exhausted(what).with_detail(format!("claim a network slot: {e}"))
                }
                None => match e {
                    sandlot_net::NetError::Exhausted | sandlot_net::NetError::Stopping => {
                        ApiError::unavailable(format!("no network slot for the sandbox: {e}"))
                    }
                    // A host failure: its account names host paths and commands.
                    e => ApiError::unavailable("no network slot for the sandbox").with_detail(e),
                },
            },
        )?;
    let saved = state.store.lock().execute(
        "INSERT OR REPLACE INTO net_slots (sandbox_id, slot, spec) VALUES (?1, ?2, ?3)",
        params![
            id,
            serde_json::to_string(&a.slot).unwrap_or_default(),
            serde_json::to_string(&spec.network).unwrap_or_default()
        ],
    );
    if let Err(e) = saved {
        svc.detach(id);
        return Err(ApiError::internal(format!("record network slot: {e}")));
    }
    opts.netns = Some(a.netns);
    opts.nameserver = Some(a.nameserver);
    Ok(())
}

/// Gives a claimed pooled sandbox's slot its tenant (in memory). No-op without one.
pub fn set_tenant(state: &AppState, id: &str, tenant: &str) {
    if let Some(Ok(svc)) = state.net.get() {
        if let Some(a) = svc.attached(id) {
            a.set_tenant(tenant);
        }
    }
}

/// Releases a sandbox's slot (after its processes are gone). No-op without one.
pub fn release(state: &AppState, id: &str) {
    if let Some(Ok(svc)) = state.net.get() {
        if svc.attached(id).is_some() {
            svc.detach(id);
        }
    }
    forget(&state.store, id);
}

/// The current network of a sandbox: its live policy, or the one it was created with.
pub fn current(state: &AppState, id: &str, created: &serde_json::Value) -> NetworkSpec {
    if let Some(Ok(svc)) = state.net.get() {
        if let Some(s) = svc.spec(id) {
            return s;
        }
    }
    serde_json::from_value(created["network"].clone()).unwrap_or_default()
}

/// Replaces a running sandbox's policy (`PUT .../network`), recorded as an event.
pub fn update(state: &AppState, id: &str, n: &NetworkSpec) -> ApiResult<()> {
    apply_policy(state, id, n)?;
    let _ = state.store.add_event(
        id,
        "network",
        &format!(
            "network policy changed: mode {}, {} rules",
            n.mode.as_str(),
            n.allow.len()
        ),
    );
    Ok(())
}

/// Gives a pooled sandbox, just claimed, the policy of the create request: for
/// the caller this is the policy it was created with, not a change (no event).
pub fn set_at_claim(state: &AppState, id: &str, n: &NetworkSpec) -> ApiResult<()> {
    apply_policy(state, id, n)
}

fn apply_policy(state: &AppState, id: &str, n: &NetworkSpec) -> ApiResult<()> {
    check(state, n)?;
    let svc = match state.net.get() {
        Some(Ok(s)) => Some(s.clone()),
        _ => None,
    };
    let attached = svc.as_ref().is_some_and(|s| s.attached(id).is_some());
    if !attached {
        if n.mode == NetworkMode::None {
            return Ok(());
        }
        return Err(ApiError::conflict(format!(
            "sandbox {id} was created with network mode \"none\" and has no network slot; \
             create it with mode \"allow\" (an empty list denies everything) to change its policy later"
        )));
    }
    let svc = svc.expect("attached implies a service");
    if n.mode == NetworkMode::None {
        // Keep the slot: "none" is an allow policy with no rules.
        svc.set_policy(
            id,
            &NetworkSpec {
                mode: NetworkMode::Allow,
                ..NetworkSpec::default()
            },
        )
    } else {
        svc.set_policy(id, n)
    }
    .map_err(ApiError::internal)?;
    state
        .store
        .lock()
        .prepare_cached("UPDATE net_slots SET spec = ?2 WHERE sandbox_id = ?1")
        .and_then(|mut st| st.execute(params![id, serde_json::to_string(n).unwrap_or_default()]))
        .map_err(ApiError::internal)?;
    Ok(())
}

/// Audit entries of a sandbox with `seq > after`, oldest first.
pub fn log(store: &Store, id: &str, after: i64, limit: u32) -> ApiResult<Vec<NetLogEntry>> {
    let c = store.lock();
    let has_table: Option<String> = c
        .query_row(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name = 'net_log'",
            [],
            |r| r.get(0),
        )
        .optional()
        .map_err(ApiError::internal)?;
    if has_table.is_none() {
        return Ok(Vec::new());
    }
    let mut st = c
        .prepare(
            "SELECT seq, at, kind, name, addr, port, decision, reason, bytes_out, bytes_in
             FROM net_log WHERE sandbox_id = ?1 AND seq > ?2 ORDER BY seq LIMIT ?3",
        )
        .map_err(ApiError::internal)?;
    let rows = st
        .query_map(params![id, after, limit.min(MAX_LOG_PAGE)], |r| {
            Ok(NetLogEntry {
                seq: r.get(0)?,
                at: crate::timefmt::rfc3339(r.get(1)?),
                kind: r.get(2)?,
                name: r.get(3)?,
                addr: r.get(4)?,
                port: r.get(5)?,
                decision: r.get(6)?,
                reason: r.get(7)?,
                bytes_out: r.get::<_, i64>(8)? as u64,
                bytes_in: r.get::<_, i64>(9)? as u64,
            })
        })
        .map_err(ApiError::internal)?;
    rows.collect::<Result<Vec<_>, _>>()
        .map_err(ApiError::internal)
}

/// On daemon stop: deletes unclaimed slots and, when no sandbox holds one, the
/// nftables table.
pub async fn shutdown(state: &Arc<AppState>) {
    if let Some(Ok(svc)) = state.net.get() {
        let svc = svc.clone();
        let _ = tokio::task::spawn_blocking(move || svc.shutdown(Duration::from_secs(10))).await;
    }
}
