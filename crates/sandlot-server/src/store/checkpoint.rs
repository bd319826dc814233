//! The records of checkpoints: one row each (what it saved, its parent), the
//! checkpoint each sandbox's state came from (`checkpoint_heads`), and the
//! admission of a fork's sandboxes, all of them or none, in one commit.

use rusqlite::{params, OptionalExtension, Row};

use super::{insert_event, insert_sandbox, sql, tenant_load, Admission, PauseRecord};
use super::{SandboxRecord, SandboxState, Saved, Store, StoreError};
use sandlot_proto::api::PauseKind;

/// Why [`Store::add_checkpoint`] recorded nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CheckpointRefusal {
    /// The sandbox holds this many checkpoints already.
    TooMany(u64),
    /// The sandbox is ending.
    Ended,
    /// The tenant's checkpoints and snapshots hold this many bytes.
    TooLarge { used: u64 },
}

/// A checkpoint's row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointRecord {
    pub id: String,
    pub sandbox_id: String,
    pub tenant: String,
    pub name: Option<String>,
    pub parent: Option<String>,
    pub kind: PauseKind,
    pub created_at: i64,
    /// Bytes of its files on the daemon's disk.
    pub size: u64,
    /// Its memory image's files (`memory`) or the image its files were committed
    /// to (`filesystem`), and the network policy the sandbox had.
    pub saved: Saved,
}

const COLS: &str = "id, sandbox_id, tenant, name, parent, kind, created_at, size, saved";

fn from_row(r: &Row<'_>) -> rusqlite::Result<Result<CheckpointRecord, StoreError>> {
    let kind: String = r.get(5)?;
    let saved: String = r.get(8)?;
    let corrupt = |m: String| StoreError::Corrupt {
        op: "read checkpoint",
        message: m,
    };
    let Some(kind) = PauseKind::parse(&kind) else {
        return Ok(Err(corrupt(format!("kind {kind:?}"))));
    };
    let saved = match serde_json::from_str(&saved) {
        Ok(s) => s,
        Err(e) => return Ok(Err(corrupt(e.to_string()))),
    };
    Ok(Ok(CheckpointRecord {
        id: r.get(0)?,
        sandbox_id: r.get(1)?,
        tenant: r.get(2)?,
        name: r.get(3)?,
        parent: r.get(4)?,
        kind,
        created_at: r.get(6)?,
        size: r.get::<_, i64>(7)?.max(0) as u64,
        saved,
    }))
}

impl Store {
    /// Records checkpoint `cp` if its sandbox has fewer than `max` and is
    /// neither stopping nor stopped (its end removes its checkpoints), and its
    /// tenant's checkpoints and snapshots stay within `max_bytes` with it; the
    /// sandbox's state now comes from it. `Ok(Err(Some(n)))`: it has `n` already;
    /// `Ok(Err(None))`: it is ending; [`CheckpointRefusal::TooLarge`]: past the
    /// tenant's disk quota.
    pub fn add_checkpoint(
        &self,
        cp: &CheckpointRecord,
        max: u32,
        max_bytes: u64,
    ) -> Result<Result<(), CheckpointRefusal>, StoreError> {
        let mut c = self.lock();
        let tx = c.transaction().map_err(sql("add checkpoint"))?;
        let live: bool = tx
            .query_row(
                "SELECT EXISTS (SELECT 1 FROM sandboxes WHERE id = ?1 AND state NOT IN ('stopped', 'stopping'))",
                [&cp.sandbox_id],
                |r| r.get(0),
            )
            .map_err(sql("add checkpoint"))?;
        if !live {
            return Ok(Err(CheckpointRefusal::Ended));
        }
        let n: i64 = tx
            .query_row(
                "SELECT COUNT(*) FROM checkpoints WHERE sandbox_id = ?1",
                [&cp.sandbox_id],
                |r| r.get(0),
            )
            .map_err(sql("add checkpoint"))?;
        if n as u64 >= u64::from(max) {
            return Ok(Err(CheckpointRefusal::TooMany(n as u64)));
        }
        let used = super::snapshot::saved_bytes(&tx, &cp.tenant)?;
        if used.saturating_add(cp.size) > max_bytes {
            return Ok(Err(CheckpointRefusal::TooLarge { used }));
        }
        tx.execute(
            &format!(
                "INSERT INTO checkpoints ({COLS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)"
            ),
            params![
                cp.id,
                cp.sandbox_id,
                cp.tenant,
                cp.name,
                cp.parent,
                cp.kind.as_str(),
                cp.created_at,
                cp.size as i64,
                serde_json::to_string(&cp.saved).expect("json"),
            ],
        )
        .map_err(sql("add checkpoint"))?;
        set_head(&tx, &cp.sandbox_id, &cp.id)?;
        insert_event(&tx, &cp.sandbox_id, cp.created_at, "checkpoint", &cp.id)?;
        tx.commit().map_err(sql("add checkpoint"))?;
        Ok(Ok(()))
    }

    /// The checkpoints of sandbox `id`, oldest first.
    pub fn checkpoints_of(&self, id: &str) -> Result<Vec<CheckpointRecord>, StoreError> {
        let c = self.lock();
        let mut q = c
            .prepare(&format!(
                "SELECT {COLS} FROM checkpoints WHERE sandbox_id = ?1 ORDER BY created_at, id"
            ))
            .map_err(sql("list checkpoints"))?;
        let rows = q
            .query_map([id], from_row)
            .map_err(sql("list checkpoints"))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(sql("list checkpoints"))?;
        rows.into_iter().collect()
    }

    /// Checkpoint `cp` of sandbox `id`, if it has one of that id.
    pub fn checkpoint(&self, id: &str, cp: &str) -> Result<Option<CheckpointRecord>, StoreError> {
        let c = self.lock();
        c.query_row(
            &format!("SELECT {COLS} FROM checkpoints WHERE sandbox_id = ?1 AND id = ?2"),
            [id, cp],
            from_row,
        )
        .optional()
        .map_err(sql("read checkpoint"))?
        .transpose()
    }

    /// Every checkpoint row (the start's clean-up).
    pub fn all_checkpoints(&self) -> Result<Vec<CheckpointRecord>, StoreError> {
        let c = self.lock();
        let mut q = c
            .prepare(&format!("SELECT {COLS} FROM checkpoints"))
            .map_err(sql("list checkpoints"))?;
        let rows = q
            .query_map([], from_row)
            .map_err(sql("list checkpoints"))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(sql("list checkpoints"))?;
        rows.into_iter().collect()
    }

    /// Forgets checkpoint `cp`; true if it was there.
    pub fn remove_checkpoint(&self, cp: &str) -> Result<bool, StoreError> {
        let c = self.lock();
        let n = c
            .execute("DELETE FROM checkpoints WHERE id = ?1", [cp])
            .map_err(sql("remove checkpoint"))?;
        Ok(n == 1)
    }

    /// The checkpoint sandbox `id`'s state came from, if any.
    pub fn checkpoint_head(&self, id: &str) -> Result<Option<String>, StoreError> {
        let c = self.lock();
        c.query_row(
            "SELECT checkpoint_id FROM checkpoint_heads WHERE sandbox_id = ?1",
            [id],
            |r| r.get(0),
        )
        .optional()
        .map_err(sql("read checkpoint head"))
    }

    /// Sandbox `id`'s state now comes from checkpoint `cp` (a restore).
    pub fn set_checkpoint_head(&self, id: &str, cp: &str) -> Result<(), StoreError> {
        let c = self.lock();
        set_head(&c, id, cp)
    }

    /// `paused` to `resuming` without a quota check, if it is paused: held while
    /// what its pause saved is copied (no resume, pause or delete meanwhile),
    /// then [`Store::release_paused`]. A daemon start finds it paused again.
    pub fn hold_paused(&self, id: &str) -> Result<bool, StoreError> {
        let c = self.lock();
        let n = c
            .execute(
                "UPDATE sandboxes SET state = 'resuming' WHERE id = ?1 AND state = 'paused'",
                [id],
            )
            .map_err(sql("hold paused sandbox"))?;
        Ok(n == 1)
    }

    /// `resuming` back to `paused` after [`Store::hold_paused`].
    pub fn release_paused(&self, id: &str) -> Result<(), StoreError> {
        let c = self.lock();
        c.execute(
            "UPDATE sandboxes SET state = 'paused' WHERE id = ?1 AND state = 'resuming'",
            [id],
        )
        .map_err(sql("release paused sandbox"))?;
        Ok(())
    }

    /// Admits the sandboxes of a fork, all of them or none: each `resuming` with
    /// `pause` as what it starts from and `checkpoint` as its head, if the
    /// tenant's quotas have room for every one.
    pub fn admit_forks(
        &self,
        recs: &[SandboxRecord],
        pause: &PauseRecord,
        checkpoint: &str,
        max_sandboxes: u32,
        max_memory: u64,
    ) -> Result<Admission, StoreError> {
        let Some(first) = recs.first() else {
            return Ok(Admission::Admitted);
        };
        let mut c = self.lock();
        let tx = c.transaction().map_err(sql("admit forks"))?;
        let (count, mem) = tenant_load(&tx, &first.tenant)?;
        if (count as u64).saturating_add(recs.len() as u64) > u64::from(max_sandboxes) {
            return Ok(Admission::TooManySandboxes(count as u32));
        }
        let want: u64 = recs.iter().map(|r| r.memory_bytes).sum();
        if (mem as u64).saturating_add(want) > max_memory {
            return Ok(Admission::TooMuchMemory { used: mem as u64 });
        }
        for r in recs {
            let mut r = r.clone();
            r.state = SandboxState::Resuming;
            r.name = None;
            insert_sandbox(&tx, &r)?;
            tx.execute(
                "INSERT INTO pauses (sandbox_id, kind, paused_at, remaining_ms, saved)
                 VALUES (?1, ?2, ?3, ?4, ?5)",
                params![
                    r.id,
                    pause.kind.as_str(),
                    pause.paused_at,
                    pause.remaining_ms,
                    serde_json::to_string(&pause.saved).expect("json")
                ],
            )
            .map_err(sql("admit forks"))?;
            set_head(&tx, &r.id, checkpoint)?;
            insert_event(&tx, &r.id, r.created_at, "forked", checkpoint)?;
        }
        tx.commit().map_err(sql("admit forks"))?;
        Ok(Admission::Admitted)
    }
}

fn set_head(c: &rusqlite::Connection, id: &str, cp: &str) -> Result<(), StoreError> {
    c.execute(
        "INSERT INTO checkpoint_heads (sandbox_id, checkpoint_id) VALUES (?1, ?2)
         ON CONFLICT(sandbox_id) DO UPDATE SET checkpoint_id = excluded.checkpoint_id",
        params![id, cp],
    )
    .map_err(sql("set checkpoint head"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::UsageRecord;

    use crate::store::pause::tests::rec;

    fn cp(id: &str, sandbox: &str, parent: Option<&str>) -> CheckpointRecord {
        CheckpointRecord {
            id: id.into(),
            sandbox_id: sandbox.into(),
            tenant: "t".into(),
            name: None,
            parent: parent.map(str::to_string),
            kind: PauseKind::Memory,
            created_at: 5,
            size: 10,
            saved: Saved::default(),
        }
    }

    #[test]
    fn a_sandbox_holds_at_most_the_limit_of_checkpoints_and_a_stopped_one_none() {
        let s = Store::in_memory().unwrap();
        s.admit_sandbox(&rec("a", 1), 10, 1 << 30).unwrap();
        assert_eq!(
            s.add_checkpoint(&cp("c1", "a", None), 2, 100).unwrap(),
            Ok(())
        );
        assert_eq!(s.checkpoint_head("a").unwrap().as_deref(), Some("c1"));
        assert_eq!(
            s.add_checkpoint(&cp("c2", "a", Some("c1")), 2, 100)
                .unwrap(),
            Ok(())
        );
        assert_eq!(
            s.add_checkpoint(&cp("c3", "a", None), 2, 100).unwrap(),
            Err(CheckpointRefusal::TooMany(2))
        );
        let ids: Vec<_> = s
            .checkpoints_of("a")
            .unwrap()
            .into_iter()
            .map(|c| (c.id, c.parent))
            .collect();
        assert_eq!(
            ids,
            vec![("c1".into(), None), ("c2".into(), Some("c1".into()))]
        );
        assert!(s.checkpoint("b", "c1").unwrap().is_none());
        assert!(s.remove_checkpoint("c2").unwrap());
        assert!(!s.remove_checkpoint("c2").unwrap());
        s.mark_stopped("a", crate::store::EndReason::Deleted, (None, None), None, 9)
            .unwrap();
        assert_eq!(
            s.add_checkpoint(&cp("c4", "a", None), 5, 100).unwrap(),
            Err(CheckpointRefusal::Ended)
        );
    }

    #[test]
    fn a_paused_sandbox_held_for_a_copy_can_be_neither_resumed_nor_deleted() {
        let s = Store::in_memory().unwrap();
        s.admit_sandbox(&rec("a", 1), 10, 1 << 30).unwrap();
        assert!(
            !s.hold_paused("a").unwrap(),
            "only a paused sandbox is held"
        );
        assert_eq!(
            s.begin_pause("a", 0).unwrap(),
            crate::store::BeginPause::Begun
        );
        let pause = PauseRecord {
            kind: PauseKind::Memory,
            paused_at: 1,
            remaining_ms: 100,
            saved: Saved::default(),
        };
        s.mark_paused("a", &pause, &UsageRecord::default()).unwrap();
        assert!(s.hold_paused("a").unwrap());
        assert_eq!(s.begin_resume("a", "t", 1 << 30).unwrap(), Ok(false));
        assert!(!s
            .begin_stop_paused("a", crate::store::EndReason::Deleted)
            .unwrap());
        assert!(s.set_pause_saved("a", &Saved::default()).unwrap());
        s.release_paused("a").unwrap();
        assert_eq!(
            s.get_sandbox("a").unwrap().unwrap().state,
            SandboxState::Paused
        );
        assert!(!s.set_pause_saved("a", &Saved::default()).unwrap());
    }

    #[test]
    fn a_fork_past_the_tenants_quota_admits_none_of_its_sandboxes() {
        let s = Store::in_memory().unwrap();
        s.admit_sandbox(&rec("a", 1), 10, 1 << 30).unwrap();
        let pause = PauseRecord {
            kind: PauseKind::Memory,
            paused_at: 1,
            remaining_ms: 100,
            saved: Saved::default(),
        };
        let forks = [rec("f1", 1), rec("f2", 1), rec("f3", 1)];
        assert_eq!(
            s.admit_forks(&forks, &pause, "c1", 3, 1 << 30).unwrap(),
            Admission::TooManySandboxes(1)
        );
        assert_eq!(
            s.admit_forks(&forks, &pause, "c1", 10, 3).unwrap(),
            Admission::TooMuchMemory { used: 1 }
        );
        assert!(s.get_sandbox("f1").unwrap().is_none());
        assert_eq!(
            s.admit_forks(&forks, &pause, "c1", 4, 1 << 30).unwrap(),
            Admission::Admitted
        );
        let f = s.get_sandbox("f2").unwrap().unwrap();
        assert_eq!(f.state, SandboxState::Resuming);
        assert_eq!(s.pause_of("f2").unwrap(), Some(pause));
        assert_eq!(s.checkpoint_head("f3").unwrap().as_deref(), Some("c1"));
    }
}
