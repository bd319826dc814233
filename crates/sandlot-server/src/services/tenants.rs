//! The operator's view of tenants (`GET /v1/tenants`): the configuration's
//! quotas joined with what the database and the live sandboxes hold. Planned
//! as data ([`tenant_list`]) from the three sources, read in one place
//! ([`list`]).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sandlot_proto::api::tenants::{Tenant, TenantList, TenantQuota, TenantUsage};

use crate::auth::Principal;
use crate::config::ServerConfig;
use crate::error::{ApiError, ApiResult};
use crate::state::AppState;
use crate::store::TenantLoad;

/// What the running sandboxes of one tenant hold now.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LiveUse {
    pub memory_bytes: u64,
    pub cpu_seconds: f64,
}

/// Every tenant the daemon knows (configured ones, then those of the
/// database's records), by name, with its quota and usage.
pub fn tenant_list(
    cfg: &ServerConfig,
    loads: &BTreeMap<String, TenantLoad>,
    live: &BTreeMap<String, LiveUse>,
) -> TenantList {
    let names: BTreeSet<&String> = cfg
        .tenants
        .keys()
        .chain(loads.keys())
        .chain(live.keys())
        .collect();
    let tenants = names
        .into_iter()
        .map(|name| {
            let q = cfg.quota(name);
            let load = loads.get(name).cloned().unwrap_or_default();
            let now = live.get(name).copied().unwrap_or_default();
            Tenant {
                name: name.clone(),
                configured: cfg.tenants.contains_key(name),
                quota: TenantQuota {
                    max_sandboxes: q.max_sandboxes,
                    max_memory_bytes: q.max_memory.bytes(),
                    max_snapshots: q.max_snapshots,
                    max_saved_disk_bytes: q.max_saved_disk.bytes(),
                },
                usage: TenantUsage {
                    sandboxes_live: load.live,
                    sandboxes_paused: load.paused,
                    memory_limit_bytes: load.memory_bytes,
                    memory_in_use_bytes: now.memory_bytes,
                    cpu_seconds: now.cpu_seconds,
                    snapshots: load.snapshots,
                    saved_bytes: load.saved_bytes,
                    active_tokens: load.active_tokens,
                },
            }
        })
        .collect();
    TenantList { tenants }
}

/// How long an answer of `GET /v1/tenants` is served again (the console polls
/// it every few seconds; each answer scans the store and samples every live
/// sandbox's cgroup).
pub const CACHE_FOR: Duration = Duration::from_secs(3);

/// The daemon's last answer of `GET /v1/tenants` and when it was made; a
/// sandbox registered or unregistered, or a token created or revoked, drops it.
#[derive(Default)]
pub struct Cache(Mutex<Option<(Instant, TenantList)>>);

impl Cache {
    fn slot(&self) -> std::sync::MutexGuard<'_, Option<(Instant, TenantList)>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The cached answer if it was made less than [`CACHE_FOR`] before `now`.
    pub fn fresh_at(&self, now: Instant) -> Option<TenantList> {
        self.slot()
            .as_ref()
            .filter(|(at, _)| now.saturating_duration_since(*at) < CACHE_FOR)
            .map(|(_, l)| l.clone())
    }

    pub fn put(&self, at: Instant, l: TenantList) {
        *self.slot() = Some((at, l));
    }

    pub fn invalidate(&self) {
        *self.slot() = None;
    }
}

/// `GET /v1/tenants`: the operator's (the socket or an operator token, not
/// acting as a tenant); a tenant is refused. Made off the async workers (it
/// holds the store's lock for its scans) and served from [`Cache`] for
/// [`CACHE_FOR`].
pub async fn list(state: &Arc<AppState>, p: &Principal) -> ApiResult<TenantList> {
    crate::auth::require_operator(p, "listing tenants")?;
    if let Some(l) = state.tenants.fresh_at(Instant::now()) {
        return Ok(l);
    }
    let st = state.clone();
    let l = tokio::task::spawn_blocking(move || compute(&st))
        .await
        .map_err(ApiError::internal)??;
    state.tenants.put(Instant::now(), l.clone());
    Ok(l)
}

fn compute(state: &AppState) -> ApiResult<TenantList> {
    let loads = state.store.tenant_loads().map_err(ApiError::internal)?;
    let mut live: BTreeMap<String, LiveUse> = BTreeMap::new();
    for h in state.all_live() {
        let (u, mem) = h.usage();
        let l = live.entry(h.tenant.clone()).or_default();
        l.memory_bytes = l.memory_bytes.saturating_add(mem);
        l.cpu_seconds += u.cpu_usec as f64 / 1e6;
    }
    Ok(tenant_list(&state.cfg, &loads, &live))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Quota;

    #[test]
    fn the_tenant_list_is_served_from_the_cache_for_a_few_seconds_then_made_again() {
        let c = Cache::default();
        let t0 = Instant::now();
        assert_eq!(c.fresh_at(t0), None);
        let l = TenantList { tenants: vec![] };
        c.put(t0, l.clone());
        assert_eq!(c.fresh_at(t0 + Duration::from_secs(1)), Some(l.clone()));
        assert_eq!(c.fresh_at(t0 + CACHE_FOR), None);
        c.invalidate();
        assert_eq!(c.fresh_at(t0), None);
    }

    #[test]
    fn configured_tenants_are_listed_with_their_quota_and_others_with_the_default() {
        let mut cfg = ServerConfig::default();
        cfg.tenants.insert(
            "acme".into(),
            Quota {
                max_sandboxes: 3,
                ..Quota::default()
            },
        );
        let loads = BTreeMap::from([(
            "beta".to_string(),
            TenantLoad {
                live: 2,
                paused: 1,
                memory_bytes: 1 << 30,
                active_tokens: 1,
                ..TenantLoad::default()
            },
        )]);
        let live = BTreeMap::from([(
            "beta".to_string(),
            LiveUse {
                memory_bytes: 5 << 20,
                cpu_seconds: 1.5,
            },
        )]);
        let list = tenant_list(&cfg, &loads, &live);
        let names: Vec<&str> = list.tenants.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["acme", "beta"]);
        let acme = &list.tenants[0];
        assert!(acme.configured);
        assert_eq!(acme.quota.max_sandboxes, 3);
        assert_eq!(acme.usage.sandboxes_live, 0);
        let beta = &list.tenants[1];
        assert!(!beta.configured);
        assert_eq!(beta.quota.max_sandboxes, Quota::default().max_sandboxes);
        assert_eq!(beta.usage.sandboxes_live, 2);
        assert_eq!(beta.usage.sandboxes_paused, 1);
        assert_eq!(beta.usage.memory_limit_bytes, 1 << 30);
        assert_eq!(beta.usage.memory_in_use_bytes, 5 << 20);
        assert_eq!(beta.usage.cpu_seconds, 1.5);
        assert_eq!(beta.usage.active_tokens, 1);
    }
}
