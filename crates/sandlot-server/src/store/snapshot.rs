//! The records of snapshots: a tenant's saved sandbox states, kept after their
//! sandbox ends. A snapshot is admitted `making` (its tenant's count checked),
//! its bytes are reserved once known (its tenant's disk quota checked), and it
//! becomes `ready` in the commit that removes the checkpoint it was promoted
//! from. A start finds the `making` ones a crash cut short (`snapshot.rs`).

use std::collections::BTreeMap;

use rusqlite::{params, OptionalExtension, Row};
use serde::{Deserialize, Serialize};

use super::{sql, Lifecycle, Saved, Store, StoreError};
use sandlot_proto::api::PauseKind;

/// What a sandbox started from a snapshot is made of besides the saved state:
/// the spec and policies its sandbox had.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SnapshotSource {
    pub spec: serde_json::Value,
    #[serde(default)]
    pub tags: BTreeMap<String, String>,
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
    pub memory_bytes: u64,
    #[serde(default)]
    pub idle_timeout_ms: Option<i64>,
    #[serde(default)]
    pub lifecycle: Lifecycle,
    pub timeout_ms: i64,
}

/// A snapshot's row.
#[derive(Debug, Clone, PartialEq)]
pub struct SnapshotRecord {
    pub id: String,
    pub tenant: String,
    pub name: Option<String>,
    /// The sandbox it was taken of.
    pub sandbox_id: String,
    pub kind: PauseKind,
    pub created_at: i64,
    /// Bytes counted against the tenant's disk quota (reserved while `making`).
    pub size: u64,
    pub saved: Saved,
    pub source: SnapshotSource,
    /// False while it is being made.
    pub ready: bool,
    /// While `making`: the checkpoint it is promoted from, and whether that
    /// checkpoint was taken for it (then a crash's clean-up removes it too).
    pub checkpoint: Option<(String, bool)>,
}

/// What [`Store::begin_snapshot`] and [`Store::reserve_snapshot`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SnapshotAdmission {
    Admitted,
    /// The tenant holds this many snapshots (those being made included).
    TooMany(u64),
    /// The tenant's snapshots hold this many bytes (reservations included).
    TooLarge {
        used: u64,
    },
}

/// What [`Store::promote_checkpoint`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Promotion {
    /// The checkpoint's row is gone and the snapshot is ready.
    Ready,
    /// The checkpoint was removed meanwhile (its sandbox ended): nothing changed.
    CheckpointGone,
    /// The snapshot's row is gone: nothing changed.
    SnapshotGone,
}

const COLS: &str = "id, tenant, name, sandbox_id, kind, created_at, size, saved, source, ready, checkpoint_id, checkpoint_fresh";

fn from_row(r: &Row<'_>) -> rusqlite::Result<Result<SnapshotRecord, StoreError>> {
    let corrupt = |m: String| StoreError::Corrupt {
        op: "read snapshot",
        message: m,
    };
    let kind: String = r.get(4)?;
    let Some(kind) = PauseKind::parse(&kind) else {
        return Ok(Err(corrupt(format!("kind {kind:?}"))));
    };
    let saved: String = r.get(7)?;
    let saved = match serde_json::from_str(&saved) {
        Ok(s) => s,
        Err(e) => return Ok(Err(corrupt(e.to_string()))),
    };
    let source: String = r.get(8)?;
    let source = match serde_json::from_str(&source) {
        Ok(s) => s,
        Err(e) => return Ok(Err(corrupt(e.to_string()))),
    };
    let cp: Option<String> = r.get(10)?;
    let fresh: bool = r.get(11)?;
    Ok(Ok(SnapshotRecord {
        id: r.get(0)?,
        tenant: r.get(1)?,
        name: r.get(2)?,
        sandbox_id: r.get(3)?,
        kind,
        created_at: r.get(5)?,
        size: r.get::<_, i64>(6)?.max(0) as u64,
        saved,
        source,
        ready: r.get(9)?,
        checkpoint: cp.map(|c| (c, fresh)),
    }))
}

/// The tenant's snapshot count (those being made included) and the bytes its
/// snapshots (reservations included) and checkpoints hold.
pub(super) fn tenant_use(
    tx: &rusqlite::Connection,
    tenant: &str,
) -> Result<(u64, u64), StoreError> {
    let n: i64 = tx
        .query_row(
            "SELECT COUNT(*) FROM snapshots WHERE tenant = ?1",
            [tenant],
            |r| r.get(0),
        )
        .map_err(sql("count snapshots"))?;
    Ok((n.max(0) as u64, saved_bytes(tx, tenant)?))
}

/// Bytes of the daemon's disk `tenant`'s snapshots (reservations included)
/// and checkpoints hold: what `max_saved_disk` bounds. A snapshot being made
/// from a checkpoint becomes that checkpoint when it is promoted (the files
/// move, the two rows become one): until then the pair counts once, the larger
/// of the checkpoint's size and the snapshot's reservation (none yet: the
/// checkpoint's). A deleted sandbox's checkpoints count until its clean-up has
/// removed them.
pub(super) fn saved_bytes(tx: &rusqlite::Connection, tenant: &str) -> Result<u64, StoreError> {
    let bytes: i64 = tx
        .query_row(
            "SELECT (SELECT COALESCE(SUM(n.size), 0) FROM snapshots n WHERE n.tenant = ?1
                     AND NOT (n.ready = 0 AND n.checkpoint_id IS NOT NULL
                              AND EXISTS (SELECT 1 FROM checkpoints c
                                          WHERE c.id = n.checkpoint_id AND c.tenant = ?1)))
                  + (SELECT COALESCE(SUM(MAX(c.size,
                        COALESCE((SELECT MAX(n.size) FROM snapshots n
                                  WHERE n.tenant = ?1 AND n.ready = 0 AND n.checkpoint_id = c.id),
                                 0))), 0)
                     FROM checkpoints c WHERE c.tenant = ?1)",
            [tenant],
            |r| r.get(0),
        )
        .map_err(sql("count saved bytes"))?;
    Ok(bytes.max(0) as u64)
}

impl Store {
    /// Admits snapshot `s` as `making` if its tenant holds fewer than
    /// `max_count` snapshots and less than `max_bytes` bytes of them.
    pub fn begin_snapshot(
        &self,
        s: &SnapshotRecord,
        max_count: u32,
        max_bytes: u64,
    ) -> Result<SnapshotAdmission, StoreError> {
        let mut c = self.lock();
        let tx = c.transaction().map_err(sql("begin snapshot"))?;
        let (n, bytes) = tenant_use(&tx, &s.tenant)?;
        if n >= u64::from(max_count) {
            return Ok(SnapshotAdmission::TooMany(n));
        }
        if bytes >= max_bytes {
            return Ok(SnapshotAdmission::TooLarge { used: bytes });
        }
        let (cp, fresh) = match &s.checkpoint {
            Some((c, f)) => (Some(c.as_str()), *f),
            None => (None, false),
        };
        tx.execute(
            &format!(
                "INSERT INTO snapshots ({COLS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, 0, ?10, ?11)"
            ),
            params![
                s.id,
                s.tenant,
                s.name,
                s.sandbox_id,
                s.kind.as_str(),
                s.created_at,
                s.size as i64,
                serde_json::to_string(&s.saved).expect("json"),
                serde_json::to_string(&s.source).expect("json"),
                cp,
                fresh,
            ],
        )
        .map_err(sql("begin snapshot"))?;
        tx.commit().map_err(sql("begin snapshot"))?;
        Ok(SnapshotAdmission::Admitted)
    }

    /// Reserves `size` bytes for snapshot `id` (being made from checkpoint
    /// `cp`, `fresh` if taken for it) if its tenant's snapshots, with every
    /// other reservation, stay within `max_bytes`.
    pub fn reserve_snapshot(
        &self,
        id: &str,
        cp: &str,
        fresh: bool,
        size: u64,
        max_bytes: u64,
    ) -> Result<SnapshotAdmission, StoreError> {
        let mut c = self.lock();
        let mut tx = c.transaction().map_err(sql("reserve snapshot"))?;
        let tenant: Option<String> = tx
            .query_row(
                "SELECT tenant FROM snapshots WHERE id = ?1 AND ready = 0",
                [id],
                |r| r.get(0),
            )
            .optional()
            .map_err(sql("reserve snapshot"))?;
        let Some(tenant) = tenant else {
            return Ok(SnapshotAdmission::TooMany(0));
        };
        // What the tenant holds but this snapshot and the checkpoint it is
        // promoted from (which it becomes): counted without the two rows, which
        // the savepoint's rollback then puts back as they were.
        let others = {
            let mut without = tx.savepoint().map_err(sql("reserve snapshot"))?;
            without
                .execute(
                    "UPDATE snapshots SET size = 0, checkpoint_id = NULL WHERE id = ?1",
                    [id],
                )
                .map_err(sql("reserve snapshot"))?;
            without
                .execute("DELETE FROM checkpoints WHERE id = ?1", [cp])
                .map_err(sql("reserve snapshot"))?;
            let others = saved_bytes(&without, &tenant)?;
            without.rollback().map_err(sql("reserve snapshot"))?;
            others
        };
        if others.saturating_add(size) > max_bytes {
            return Ok(SnapshotAdmission::TooLarge { used: others });
        }
        tx.execute(
            "UPDATE snapshots SET size = ?2, checkpoint_id = ?3, checkpoint_fresh = ?4 WHERE id = ?1",
            params![id, size as i64, cp, fresh],
        )
        .map_err(sql("reserve snapshot"))?;
        tx.commit().map_err(sql("reserve snapshot"))?;
        Ok(SnapshotAdmission::Admitted)
    }

    /// In one commit: removes checkpoint `cp`'s row and makes snapshot `id`
    /// ready with what the checkpoint saved (`kind`, `saved`).
    pub fn promote_checkpoint(
        &self,
        id: &str,
        cp: &str,
        kind: PauseKind,
        saved: &Saved,
    ) -> Result<Promotion, StoreError> {
        let mut c = self.lock();
        let tx = c.transaction().map_err(sql("promote checkpoint"))?;
        let n = tx
            .execute(
                "UPDATE snapshots SET ready = 1, kind = ?2, saved = ?3, checkpoint_id = NULL, checkpoint_fresh = 0
                 WHERE id = ?1 AND ready = 0",
                params![id, kind.as_str(), serde_json::to_string(saved).expect("json")],
            )
            .map_err(sql("promote checkpoint"))?;
        if n != 1 {
            return Ok(Promotion::SnapshotGone);
        }
        let n = tx
            .execute("DELETE FROM checkpoints WHERE id = ?1", [cp])
            .map_err(sql("promote checkpoint"))?;
        if n != 1 {
            return Ok(Promotion::CheckpointGone);
        }
        tx.commit().map_err(sql("promote checkpoint"))?;
        Ok(Promotion::Ready)
    }

    /// Ready snapshot `id` (the caller checks whose it is).
    pub fn snapshot(&self, id: &str) -> Result<Option<SnapshotRecord>, StoreError> {
        let c = self.lock();
        c.query_row(
            &format!("SELECT {COLS} FROM snapshots WHERE id = ?1 AND ready = 1"),
            [id],
            from_row,
        )
        .optional()
        .map_err(sql("read snapshot"))?
        .transpose()
    }

    /// The ready snapshots of `tenant` (None: every tenant's), oldest first;
    /// only those of sandbox `sandbox` and named `name` when given.
    pub fn snapshots_of(
        &self,
        tenant: Option<&str>,
        sandbox: Option<&str>,
        name: Option<&str>,
    ) -> Result<Vec<SnapshotRecord>, StoreError> {
        let c = self.lock();
        let mut q = c
            .prepare(&format!(
                "SELECT {COLS} FROM snapshots WHERE (?1 IS NULL OR tenant = ?1) AND ready = 1
                 AND (?2 IS NULL OR sandbox_id = ?2) AND (?3 IS NULL OR name = ?3)
                 ORDER BY created_at, id"
            ))
            .map_err(sql("list snapshots"))?;
        let rows = q
            .query_map(params![tenant, sandbox, name], from_row)
            .map_err(sql("list snapshots"))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(sql("list snapshots"))?;
        rows.into_iter().collect()
    }

    /// Every snapshot row, being made or ready (the start's clean-up).
    pub fn all_snapshots(&self) -> Result<Vec<SnapshotRecord>, StoreError> {
        let c = self.lock();
        let mut q = c
            .prepare(&format!("SELECT {COLS} FROM snapshots"))
            .map_err(sql("list snapshots"))?;
        let rows = q
            .query_map([], from_row)
            .map_err(sql("list snapshots"))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(sql("list snapshots"))?;
        rows.into_iter().collect()
    }

    /// Forgets snapshot `id`; true if it was there.
    pub fn remove_snapshot(&self, id: &str) -> Result<bool, StoreError> {
        let c = self.lock();
        let n = c
            .execute("DELETE FROM snapshots WHERE id = ?1", [id])
            .map_err(sql("remove snapshot"))?;
        Ok(n == 1)
    }

    /// Forgets ready snapshot `id`; true if it was there (a snapshot being
    /// made is its maker's to remove).
    pub fn remove_ready_snapshot(&self, id: &str) -> Result<bool, StoreError> {
        let c = self.lock();
        let n = c
            .execute("DELETE FROM snapshots WHERE id = ?1 AND ready = 1", [id])
            .map_err(sql("remove snapshot"))?;
        Ok(n == 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::CheckpointRecord;

    fn snap(id: &str, tenant: &str) -> SnapshotRecord {
        SnapshotRecord {
            id: id.into(),
            tenant: tenant.into(),
            name: Some("n".into()),
            sandbox_id: "a".into(),
            kind: PauseKind::Memory,
            created_at: 1,
            size: 0,
            saved: Saved::default(),
            source: SnapshotSource {
                spec: serde_json::json!({}),
                tags: BTreeMap::new(),
                metadata: BTreeMap::new(),
                memory_bytes: 1,
                idle_timeout_ms: None,
                lifecycle: Lifecycle::default(),
                timeout_ms: 1000,
            },
            ready: false,
            checkpoint: None,
        }
    }

    fn cp(id: &str) -> CheckpointRecord {
        CheckpointRecord {
            id: id.into(),
            sandbox_id: "a".into(),
            tenant: "t".into(),
            name: None,
            parent: None,
            kind: PauseKind::Memory,
            created_at: 5,
            size: 10,
            saved: Saved::default(),
        }
    }

    #[test]
    fn a_tenant_holds_at_most_its_count_of_snapshots_those_being_made_included() {
        let s = Store::in_memory().unwrap();
        assert_eq!(
            s.begin_snapshot(&snap("s1", "t"), 2, 100).unwrap(),
            SnapshotAdmission::Admitted
        );
        assert_eq!(
            s.begin_snapshot(&snap("s2", "t"), 2, 100).unwrap(),
            SnapshotAdmission::Admitted
        );
        assert_eq!(
            s.begin_snapshot(&snap("s3", "t"), 2, 100).unwrap(),
            SnapshotAdmission::TooMany(2)
        );
        assert_eq!(
            s.begin_snapshot(&snap("s4", "u"), 2, 100).unwrap(),
            SnapshotAdmission::Admitted,
            "another tenant's snapshots do not count"
        );
    }

    #[test]
    fn two_reservations_past_the_disk_quota_admit_only_the_first() {
        let s = Store::in_memory().unwrap();
        s.begin_snapshot(&snap("s1", "t"), 10, 100).unwrap();
        s.begin_snapshot(&snap("s2", "t"), 10, 100).unwrap();
        assert_eq!(
            s.reserve_snapshot("s1", "c1", true, 60, 100).unwrap(),
            SnapshotAdmission::Admitted
        );
        assert_eq!(
            s.reserve_snapshot("s2", "c2", true, 60, 100).unwrap(),
            SnapshotAdmission::TooLarge { used: 60 }
        );
        assert_eq!(
            s.reserve_snapshot("s2", "c2", true, 40, 100).unwrap(),
            SnapshotAdmission::Admitted
        );
        assert_eq!(
            s.begin_snapshot(&snap("s3", "t"), 10, 100).unwrap(),
            SnapshotAdmission::TooLarge { used: 100 }
        );
    }

    #[test]
    fn a_promotion_moves_the_checkpoint_into_a_ready_snapshot_of_the_tenant_only() {
        let s = Store::in_memory().unwrap();
        s.admit_sandbox(&crate::store::pause::tests::rec("a", 1), 10, 1 << 30)
            .unwrap();
        s.add_checkpoint(&cp("c1"), 5, 100).unwrap().unwrap();
        s.begin_snapshot(&snap("s1", "t"), 10, 100).unwrap();
        assert!(
            s.snapshot("s1").unwrap().is_none(),
            "a snapshot being made is not seen"
        );
        assert!(
            !s.remove_ready_snapshot("s1").unwrap(),
            "nor removed but by its maker"
        );
        assert_eq!(
            s.promote_checkpoint("s1", "gone", PauseKind::Memory, &Saved::default())
                .unwrap(),
            Promotion::CheckpointGone
        );
        assert!(s.snapshot("s1").unwrap().is_none());
        assert_eq!(
            s.promote_checkpoint("s1", "c1", PauseKind::Memory, &Saved::default())
                .unwrap(),
            Promotion::Ready
        );
        assert!(s.checkpoint("a", "c1").unwrap().is_none());
        assert!(s.snapshot("s1").unwrap().is_some_and(|r| r.ready));
        assert_eq!(s.snapshots_of(Some("t"), None, Some("n")).unwrap().len(), 1);
        assert_eq!(s.snapshots_of(Some("u"), None, None).unwrap().len(), 0);
        assert_eq!(s.snapshots_of(Some("t"), Some("b"), None).unwrap().len(), 0);
        assert!(s.remove_ready_snapshot("s1").unwrap());
        assert!(!s.remove_ready_snapshot("s1").unwrap());
    }

    #[test]
    fn checkpoints_and_snapshots_share_the_tenants_disk_quota_and_a_promotion_counts_once() {
        let s = Store::in_memory().unwrap();
        s.admit_sandbox(&crate::store::pause::tests::rec("a", 1), 10, 1 << 30)
            .unwrap();
        assert_eq!(s.add_checkpoint(&cp("c1"), 5, 15).unwrap(), Ok(()));
        assert_eq!(
            s.add_checkpoint(&cp("c2"), 5, 15).unwrap(),
            Err(crate::store::CheckpointRefusal::TooLarge { used: 10 })
        );
        assert_eq!(
            s.begin_snapshot(&snap("s1", "t"), 10, 15).unwrap(),
            SnapshotAdmission::Admitted
        );
        assert_eq!(
            s.reserve_snapshot("s1", "c1", false, 10, 15).unwrap(),
            SnapshotAdmission::Admitted,
            "the checkpoint it is promoted from is not counted twice"
        );
        // Between the reservation and the promotion, the checkpoint's bytes are
        // counted once, as the snapshot's: another checkpoint or snapshot of the
        // tenant is not refused for a double count meanwhile.
        assert_eq!(
            s.begin_snapshot(&snap("s2", "t"), 10, 15).unwrap(),
            SnapshotAdmission::Admitted
        );
        assert_eq!(
            s.begin_snapshot(&snap("s3", "t"), 10, 10).unwrap(),
            SnapshotAdmission::TooLarge { used: 10 }
        );
        assert_eq!(s.add_checkpoint(&cp("c3"), 5, 25).unwrap(), Ok(()));
        assert_eq!(
            s.add_checkpoint(&cp("c4"), 5, 25).unwrap(),
            Err(crate::store::CheckpointRefusal::TooLarge { used: 20 })
        );
    }

    /// A snapshot admitted to be made from a checkpoint taken for it has
    /// reserved nothing yet: the checkpoint counts with its own size until then,
    /// and a deleted sandbox's checkpoints count until they are removed.
    #[test]
    fn a_checkpoint_counts_until_its_snapshot_reserves_and_until_it_is_removed() {
        let s = Store::in_memory().unwrap();
        s.admit_sandbox(&crate::store::pause::tests::rec("a", 1), 10, 1 << 30)
            .unwrap();
        assert_eq!(s.add_checkpoint(&cp("c1"), 5, 25).unwrap(), Ok(()));
        let fresh = SnapshotRecord {
            checkpoint: Some(("c1".into(), true)),
            ..snap("s1", "t")
        };
        s.begin_snapshot(&fresh, 10, 25).unwrap();
        assert_eq!(
            s.add_checkpoint(&cp("c2"), 5, 15).unwrap(),
            Err(crate::store::CheckpointRefusal::TooLarge { used: 10 }),
            "c1 counts while its snapshot has reserved nothing"
        );
        // Reserved larger than the checkpoint: the pair counts as the larger.
        assert_eq!(
            s.reserve_snapshot("s1", "c1", true, 12, 25).unwrap(),
            SnapshotAdmission::Admitted
        );
        assert_eq!(
            s.tenant_loads().unwrap()["t"].saved_bytes,
            12,
            "the operator's figure counts as the quota does"
        );
        assert_eq!(
            s.begin_snapshot(&snap("s2", "t"), 10, 12).unwrap(),
            SnapshotAdmission::TooLarge { used: 12 }
        );
        // The sandbox stopped, its clean-up not yet run: c1 still holds its bytes.
        s.mark_stopped("a", crate::store::EndReason::Deleted, (None, None), None, 9)
            .unwrap();
        assert_eq!(
            s.begin_snapshot(&snap("s2", "t"), 10, 12).unwrap(),
            SnapshotAdmission::TooLarge { used: 12 }
        );
        assert!(s.remove_checkpoint("c1").unwrap());
        assert_eq!(
            s.begin_snapshot(&snap("s2", "t"), 10, 13).unwrap(),
            SnapshotAdmission::Admitted,
            "the snapshot's reservation alone, once its checkpoint is gone"
        );
    }
}
