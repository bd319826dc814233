//! What each tenant the database knows holds now: the tenants of its sandboxes
//! (stopped records included), snapshots and tenant tokens, for the operator's
//! `GET /v1/tenants`.

use std::collections::BTreeMap;

use super::{sql, Store, StoreError};

/// One tenant's load, as the quotas count it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TenantLoad {
    /// Sandboxes creating, running, pausing, resuming or stopping.
    pub live: u64,
    /// Paused sandboxes (they count against `max_sandboxes` too).
    pub paused: u64,
    /// Sum of the memory limits of the live sandboxes (what `max_memory` bounds).
    pub memory_bytes: u64,
    /// Snapshots kept (those being made included).
    pub snapshots: u64,
    /// Bytes its snapshots and checkpoints hold (what `max_saved_disk` bounds).
    pub saved_bytes: u64,
    /// Tokens not revoked.
    pub active_tokens: u64,
}

impl Store {
    /// Every tenant the database knows, by name, with its load.
    pub fn tenant_loads(&self) -> Result<BTreeMap<String, TenantLoad>, StoreError> {
        let c = self.lock();
        let mut out: BTreeMap<String, TenantLoad> = BTreeMap::new();
        let mut st = c
            .prepare(
                "SELECT tenant,
                   SUM(state IN ('creating', 'running', 'pausing', 'resuming', 'stopping')),
                   SUM(state = 'paused'),
                   SUM(CASE WHEN state IN ('creating', 'running', 'pausing', 'resuming', 'stopping')
                       THEN memory_bytes ELSE 0 END)
                 FROM sandboxes GROUP BY tenant",
            )
            .map_err(sql("count tenants' sandboxes"))?;
        let rows = st
            .query_map([], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, i64>(1)?,
                    r.get::<_, i64>(2)?,
                    r.get::<_, i64>(3)?,
                ))
            })
            .map_err(sql("count tenants' sandboxes"))?;
        for row in rows {
            let (tenant, live, paused, mem) = row.map_err(sql("count tenants' sandboxes"))?;
            let l = out.entry(tenant).or_default();
            l.live = live.max(0) as u64;
            l.paused = paused.max(0) as u64;
            l.memory_bytes = mem.max(0) as u64;
        }
        // Snapshots and saved bytes as the quota counts them (`tenant_use`: a
        // snapshot being made and its checkpoint once).
        let mut st = c
            .prepare("SELECT tenant FROM snapshots UNION SELECT tenant FROM checkpoints")
            .map_err(sql("list tenants' snapshots"))?;
        let saving: Vec<String> = st
            .query_map([], |r| r.get(0))
            .map_err(sql("list tenants' snapshots"))?
            .collect::<Result<_, _>>()
            .map_err(sql("list tenants' snapshots"))?;
        for tenant in saving {
            let (snapshots, saved_bytes) = super::snapshot::tenant_use(&c, &tenant)?;
            let l = out.entry(tenant).or_default();
            l.snapshots = snapshots;
            l.saved_bytes = saved_bytes;
        }
        let mut st = c
            .prepare(
                "SELECT tenant, SUM(revoked_at IS NULL) FROM tokens
                 WHERE kind = 'tenant' GROUP BY tenant",
            )
            .map_err(sql("count tenants' tokens"))?;
        let rows = st
            .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))
            .map_err(sql("count tenants' tokens"))?;
        for row in rows {
            let (tenant, n) = row.map_err(sql("count tenants' tokens"))?;
            out.entry(tenant).or_default().active_tokens = n.max(0) as u64;
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{now_ms, TokenKind, TokenRecord, OPERATOR_TOKEN_TENANT};

    #[test]
    fn the_checkpoints_scan_by_tenant_uses_an_index() {
        let s = Store::in_memory().unwrap();
        let plan: Vec<String> = {
            let c = s.lock();
            let mut st = c
                .prepare(
                    "EXPLAIN QUERY PLAN SELECT tenant FROM snapshots UNION SELECT tenant FROM checkpoints",
                )
                .unwrap();
            let rows = st.query_map([], |r| r.get::<_, String>(3)).unwrap();
            rows.map(Result::unwrap).collect()
        };
        assert!(
            plan.iter().any(|l| l.contains("checkpoints_tenant")),
            "{plan:?}"
        );
    }

    #[test]
    fn tenants_come_from_tokens_and_operator_tokens_name_none() {
        let s = Store::in_memory().unwrap();
        let tok = |id: &str, kind, tenant: &str| TokenRecord {
            id: id.into(),
            kind,
            tenant: tenant.into(),
            name: None,
            created_at: now_ms(),
            last_used_at: None,
            revoked_at: None,
            created_by: None,
        };
        s.insert_token(&tok("t1", TokenKind::Tenant, "acme"), "h1")
            .unwrap();
        s.insert_token(&tok("t2", TokenKind::Tenant, "acme"), "h2")
            .unwrap();
        s.insert_token(&tok("t3", TokenKind::Tenant, "beta"), "h3")
            .unwrap();
        s.insert_token(&tok("t4", TokenKind::Operator, OPERATOR_TOKEN_TENANT), "h4")
            .unwrap();
        s.revoke_token("t3", false).unwrap();
        let loads = s.tenant_loads().unwrap();
        assert_eq!(loads.keys().collect::<Vec<_>>(), ["acme", "beta"]);
        assert_eq!(loads["acme"].active_tokens, 2);
        assert_eq!(loads["beta"].active_tokens, 0);
    }
}
