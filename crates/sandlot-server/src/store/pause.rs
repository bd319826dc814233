//! The records of paused sandboxes: each state change of a pause or resume is one
//! commit that succeeds only from the state it leaves (`running` to `pausing`,
//! `paused` to `resuming`, ...), so that two requests never both act on one
//! sandbox, and the `pauses` row says what the pause saved.

use rusqlite::{params, OptionalExtension};
use serde::{Deserialize, Serialize};

use super::{insert_event, sql, update_usage, Store, StoreError, UsageRecord};
use sandlot_proto::api::PauseKind;

/// One file of a memory image as the daemon found it once `runsc` had written it:
/// what a resume checks before it hands the image to `runsc` again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SavedFile {
    /// Its name in the checkpoint directory (no `/`).
    pub name: String,
    pub size: u64,
    /// Hex SHA-256 of its contents.
    pub sha256: String,
}

/// What a pause saved.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Saved {
    /// The memory image's files (kind `memory`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<SavedFile>,
    /// The image the sandbox's files were committed to (kind `filesystem`): a
    /// resume starts the sandbox from it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// The store image a gVisor checkpoint's saved writable layer goes over
    /// (kind `memory`, a sandbox of a store image): the checkpoint, snapshot or
    /// fork leases it under its own id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layer_image: Option<String>,
    /// The network policy it had (a `PUT .../network` may have changed the
    /// spec's): its resume gets it again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<serde_json::Value>,
}

/// A paused sandbox's `pauses` row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PauseRecord {
    pub kind: PauseKind,
    pub paused_at: i64,
    /// What was left of its lifetime at the pause (the clock stops meanwhile).
    pub remaining_ms: i64,
    pub saved: Saved,
}

/// What [`Store::begin_pause`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BeginPause {
    /// Recorded pausing.
    Begun,
    /// Not running: nothing changed.
    NotRunning,
    /// Its tenant has this many sandboxes paused already, the cap: nothing changed.
    Full(u64),
}

impl Store {
    /// `running` to `pausing`, if it is running and its tenant has fewer than
    /// `max_paused` sandboxes paused, pausing or resuming (0: no cap), counted and
    /// changed in one transaction: pauses at once never pass the cap together.
    pub fn begin_pause(&self, id: &str, max_paused: u32) -> Result<BeginPause, StoreError> {
        let mut c = self.lock();
        let tx = c.transaction().map_err(sql("begin pause"))?;
        let row: Option<(String, i64)> = tx
            .query_row(
                "SELECT s.state, (SELECT COUNT(*) FROM sandboxes o WHERE o.tenant = s.tenant
                     AND o.state IN ('paused', 'pausing', 'resuming'))
                 FROM sandboxes s WHERE s.id = ?1",
                [id],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()
            .map_err(sql("begin pause"))?;
        let Some((state, paused)) = row else {
            return Ok(BeginPause::NotRunning);
        };
        if state != "running" {
            return Ok(BeginPause::NotRunning);
        }
        let paused = paused.max(0) as u64;
        if max_paused > 0 && paused >= u64::from(max_paused) {
            return Ok(BeginPause::Full(paused));
        }
        tx.execute(
            "UPDATE sandboxes SET state = 'pausing' WHERE id = ?1 AND state = 'running'",
            [id],
        )
        .map_err(sql("begin pause"))?;
        tx.commit().map_err(sql("begin pause"))?;
        Ok(BeginPause::Begun)
    }

    /// `pausing` back to `running`: a pause that backed out before it did
    /// anything (no event).
    pub fn undo_begin_pause(&self, id: &str) -> Result<(), StoreError> {
        let c = self.lock();
        c.execute(
            "UPDATE sandboxes SET state = 'running' WHERE id = ?1 AND state = 'pausing'",
            [id],
        )
        .map_err(sql("undo begin pause"))?;
        Ok(())
    }

    /// `pausing` back to `running` (a pause that failed and left it running).
    pub fn abort_pause(&self, id: &str, why: &str) -> Result<(), StoreError> {
        let mut c = self.lock();
        let tx = c.transaction().map_err(sql("abort pause"))?;
        tx.execute(
            "UPDATE sandboxes SET state = 'running' WHERE id = ?1 AND state = 'pausing'",
            [id],
        )
        .map_err(sql("abort pause"))?;
        insert_event(&tx, id, super::now_ms(), "pause_failed", why)?;
        tx.commit().map_err(sql("abort pause"))
    }

    /// `pausing` to `paused` with what was saved and its usage so far (one commit).
    pub fn mark_paused(
        &self,
        id: &str,
        p: &PauseRecord,
        usage: &UsageRecord,
    ) -> Result<(), StoreError> {
        let mut c = self.lock();
        let tx = c.transaction().map_err(sql("mark sandbox paused"))?;
        update_usage(&tx, id, usage)?;
        let n = tx
            .execute(
                "UPDATE sandboxes SET state = 'paused', pid = NULL WHERE id = ?1 AND state = 'pausing'",
                [id],
            )
            .map_err(sql("mark sandbox paused"))?;
        if n != 1 {
            return Err(StoreError::Corrupt {
                op: "mark sandbox paused",
                message: format!("sandbox {id} is no longer pausing"),
            });
        }
        tx.execute(
            "INSERT OR REPLACE INTO pauses (sandbox_id, kind, paused_at, remaining_ms, saved)
             VALUES (?1, ?2, ?3, ?4, ?5)",
            params![
                id,
                p.kind.as_str(),
                p.paused_at,
                p.remaining_ms,
                serde_json::to_string(&p.saved).expect("json")
            ],
        )
        .map_err(sql("mark sandbox paused"))?;
        insert_event(&tx, id, p.paused_at, "paused", p.kind.as_str())?;
        tx.commit().map_err(sql("mark sandbox paused"))
    }

    /// What the pause of `id` saved, if it is paused (or resuming).
    pub fn pause_of(&self, id: &str) -> Result<Option<PauseRecord>, StoreError> {
        let c = self.lock();
        let row: Option<(String, i64, i64, String)> = c
            .query_row(
                "SELECT kind, paused_at, remaining_ms, saved FROM pauses WHERE sandbox_id = ?1",
                [id],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
            )
            .optional()
            .map_err(sql("read pause"))?;
        let Some((kind, paused_at, remaining_ms, saved)) = row else {
            return Ok(None);
        };
        let corrupt = |m: String| StoreError::Corrupt {
            op: "read pause",
            message: m,
        };
        Ok(Some(PauseRecord {
            kind: PauseKind::parse(&kind).ok_or_else(|| corrupt(format!("kind {kind:?}")))?,
            paused_at,
            remaining_ms,
            saved: serde_json::from_str(&saved).map_err(|e| corrupt(e.to_string()))?,
        }))
    }

    /// Replaces what the pause of sandbox `id` saved (a restore to a checkpoint,
    /// which holds it `resuming`); false if it is not resuming.
    pub fn set_pause_saved(&self, id: &str, saved: &Saved) -> Result<bool, StoreError> {
        let c = self.lock();
        let n = c
            .execute(
                "UPDATE pauses SET saved = ?2 WHERE sandbox_id = ?1
                 AND EXISTS (SELECT 1 FROM sandboxes WHERE id = ?1 AND state = 'resuming')",
                params![id, serde_json::to_string(saved).expect("json")],
            )
            .map_err(sql("replace what a pause saved"))?;
        Ok(n == 1)
    }

    /// How many sandboxes of `tenant` are paused, pausing or resuming.
    pub fn count_paused(&self, tenant: &str) -> Result<u64, StoreError> {
        let c = self.lock();
        c.query_row(
            "SELECT COUNT(*) FROM sandboxes WHERE tenant = ?1
             AND state IN ('paused', 'pausing', 'resuming')",
            [tenant],
            |r| r.get::<_, i64>(0),
        )
        .map(|n| n.max(0) as u64)
        .map_err(sql("count paused sandboxes"))
    }

    /// The ids of the sandboxes paused before `cutoff_ms` and paused still.
    pub fn paused_before(&self, cutoff_ms: i64) -> Result<Vec<String>, StoreError> {
        let c = self.lock();
        let mut q = c
            .prepare(
                "SELECT p.sandbox_id FROM pauses p JOIN sandboxes s ON s.id = p.sandbox_id
                 WHERE s.state = 'paused' AND p.paused_at < ?1",
            )
            .map_err(sql("list old pauses"))?;
        let rows = q
            .query_map([cutoff_ms], |r| r.get::<_, String>(0))
            .map_err(sql("list old pauses"))?;
        rows.collect::<Result<_, _>>()
            .map_err(sql("list old pauses"))
    }

    /// `paused` to `resuming`, if it is paused and the tenant's live sandboxes
    /// leave room for its memory (`max_memory`). `Ok(Err(used))`: they do not.
    pub fn begin_resume(
        &self,
        id: &str,
        tenant: &str,
        max_memory: u64,
    ) -> Result<Result<bool, u64>, StoreError> {
        let mut c = self.lock();
        let tx = c.transaction().map_err(sql("begin resume"))?;
        let (used, mine): (i64, Option<i64>) = tx
            .query_row(
                "SELECT COALESCE(SUM(memory_bytes), 0),
                        (SELECT memory_bytes FROM sandboxes WHERE id = ?2 AND state = 'paused')
                 FROM sandboxes WHERE tenant = ?1
                 AND state IN ('creating', 'running', 'pausing', 'resuming', 'stopping')",
                params![tenant, id],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .map_err(sql("begin resume"))?;
        let Some(mine) = mine else {
            return Ok(Ok(false));
        };
        if (used as u64).saturating_add(mine as u64) > max_memory {
            return Ok(Err(used as u64));
        }
        tx.execute(
            "UPDATE sandboxes SET state = 'resuming' WHERE id = ?1 AND state = 'paused'",
            [id],
        )
        .map_err(sql("begin resume"))?;
        tx.commit().map_err(sql("begin resume"))?;
        Ok(Ok(true))
    }

    /// `resuming` back to `paused` (a resume that failed: what was saved is kept).
    pub fn abort_resume(&self, id: &str, why: &str) -> Result<(), StoreError> {
        let mut c = self.lock();
        let tx = c.transaction().map_err(sql("abort resume"))?;
        tx.execute(
            "UPDATE sandboxes SET state = 'paused', pid = NULL WHERE id = ?1 AND state = 'resuming'",
            [id],
        )
        .map_err(sql("abort resume"))?;
        insert_event(&tx, id, super::now_ms(), "resume_failed", why)?;
        tx.commit().map_err(sql("abort resume"))
    }

    /// `resuming` to `running` with its new PID 1 and lifetime; its pause is
    /// forgotten (one commit).
    pub fn mark_resumed(
        &self,
        id: &str,
        pid: i32,
        expires_at: i64,
        at: i64,
    ) -> Result<(), StoreError> {
        let mut c = self.lock();
        let tx = c.transaction().map_err(sql("mark sandbox resumed"))?;
        let n = tx
            .execute(
                "UPDATE sandboxes SET state = 'running', pid = ?2, expires_at = ?3
                 WHERE id = ?1 AND state = 'resuming'",
                params![id, pid, expires_at],
            )
            .map_err(sql("mark sandbox resumed"))?;
        if n != 1 {
            return Err(StoreError::Corrupt {
                op: "mark sandbox resumed",
                message: format!("sandbox {id} is no longer resuming"),
            });
        }
        tx.execute("DELETE FROM pauses WHERE sandbox_id = ?1", [id])
            .map_err(sql("mark sandbox resumed"))?;
        insert_event(&tx, id, at, "resumed", "")?;
        tx.commit().map_err(sql("mark sandbox resumed"))
    }

    /// `paused` to `stopping` for `reason`, if it is paused; false otherwise.
    pub fn begin_stop_paused(
        &self,
        id: &str,
        reason: super::EndReason,
    ) -> Result<bool, StoreError> {
        let c = self.lock();
        let n = c
            .execute(
                "UPDATE sandboxes SET state = 'stopping', end_reason = COALESCE(end_reason, ?2)
                 WHERE id = ?1 AND state = 'paused'",
                params![id, reason.as_str()],
            )
            .map_err(sql("stop paused sandbox"))?;
        Ok(n == 1)
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::store::{SandboxRecord, SandboxState};

    /// A running sandbox's record of tenant `t` (the store's unit tests share it).
    pub(in crate::store) fn rec(id: &str, memory: u64) -> SandboxRecord {
        SandboxRecord {
            id: id.into(),
            tenant: "t".into(),
            name: None,
            spec: serde_json::json!({}),
            tags: Default::default(),
            metadata: Default::default(),
            state: SandboxState::Running,
            end_reason: None,
            exit_code: None,
            exit_signal: None,
            error: None,
            pid: Some(7),
            memory_bytes: memory,
            created_at: 1,
            started_at: Some(1),
            ended_at: None,
            expires_at: 1_000,
            idle_timeout_ms: None,
            usage: UsageRecord::default(),
            lifecycle: Default::default(),
            timeout_ms: 1_000,
        }
    }

    fn paused(kind: PauseKind) -> PauseRecord {
        PauseRecord {
            kind,
            paused_at: 10,
            remaining_ms: 500,
            saved: Saved {
                files: vec![SavedFile {
                    name: "checkpoint.img".into(),
                    size: 3,
                    sha256: "ab".into(),
                }],
                image: None,
                layer_image: None,
                network: None,
            },
        }
    }

    #[test]
    fn each_pause_and_resume_step_happens_once_and_only_from_the_state_it_leaves() {
        let s = Store::in_memory().unwrap();
        s.admit_sandbox(&rec("a", 1 << 20), 10, 1 << 30).unwrap();
        assert_eq!(s.begin_pause("a", 0).unwrap(), BeginPause::Begun);
        assert_eq!(
            s.begin_pause("a", 0).unwrap(),
            BeginPause::NotRunning,
            "a second pause finds it pausing"
        );
        s.mark_paused("a", &paused(PauseKind::Memory), &UsageRecord::default())
            .unwrap();
        let r = s.get_sandbox("a").unwrap().unwrap();
        assert_eq!((r.state, r.pid), (SandboxState::Paused, None));
        assert_eq!(s.pause_of("a").unwrap(), Some(paused(PauseKind::Memory)));
        assert_eq!(s.begin_pause("a", 0).unwrap(), BeginPause::NotRunning);
        assert_eq!(s.begin_resume("a", "t", 1 << 30).unwrap(), Ok(true));
        assert_eq!(s.begin_resume("a", "t", 1 << 30).unwrap(), Ok(false));
        s.abort_resume("a", "damaged").unwrap();
        assert_eq!(
            s.get_sandbox("a").unwrap().unwrap().state,
            SandboxState::Paused
        );
        assert_eq!(s.begin_resume("a", "t", 1 << 30).unwrap(), Ok(true));
        s.mark_resumed("a", 9, 2_000, 20).unwrap();
        let r = s.get_sandbox("a").unwrap().unwrap();
        assert_eq!(
            (r.state, r.pid, r.expires_at),
            (SandboxState::Running, Some(9), 2_000)
        );
        assert_eq!(s.pause_of("a").unwrap(), None);
    }

    #[test]
    fn a_paused_sandbox_counts_as_a_sandbox_but_holds_no_memory_until_it_resumes() {
        let s = Store::in_memory().unwrap();
        let gib = 1u64 << 30;
        s.admit_sandbox(&rec("a", gib), 10, gib).unwrap();
        assert_eq!(s.begin_pause("a", 0).unwrap(), BeginPause::Begun);
        s.mark_paused("a", &paused(PauseKind::Filesystem), &UsageRecord::default())
            .unwrap();
        // Its memory is free for another sandbox...
        assert_eq!(
            s.admit_sandbox(&rec("b", gib), 10, gib).unwrap(),
            crate::store::Admission::Admitted
        );
        // ...which then leaves none for its resume.
        assert_eq!(s.begin_resume("a", "t", gib).unwrap(), Err(gib));
        // It still counts against the number of sandboxes.
        assert_eq!(
            s.admit_sandbox(&rec("c", 1), 2, 4 * gib).unwrap(),
            crate::store::Admission::TooManySandboxes(2)
        );
    }

    #[test]
    fn a_pause_past_the_tenants_paused_cap_is_refused_counting_pauses_under_way() {
        let s = Store::in_memory().unwrap();
        for id in ["a", "b", "c"] {
            s.admit_sandbox(&rec(id, 1), 10, 1 << 30).unwrap();
        }
        assert_eq!(s.begin_pause("a", 2).unwrap(), BeginPause::Begun);
        assert_eq!(s.begin_pause("b", 2).unwrap(), BeginPause::Begun);
        // Two are pausing, none paused yet: the cap holds all the same.
        assert_eq!(s.begin_pause("c", 2).unwrap(), BeginPause::Full(2));
        assert_eq!(
            s.get_sandbox("c").unwrap().unwrap().state,
            SandboxState::Running
        );
        s.abort_pause("b", "failed").unwrap();
        assert_eq!(s.begin_pause("c", 2).unwrap(), BeginPause::Begun);
        assert_eq!(s.begin_pause("zz", 2).unwrap(), BeginPause::NotRunning);
    }

    #[test]
    fn deleting_a_paused_sandbox_forgets_its_pause() {
        let s = Store::in_memory().unwrap();
        s.admit_sandbox(&rec("a", 1), 10, 1 << 30).unwrap();
        assert_eq!(s.begin_pause("a", 0).unwrap(), BeginPause::Begun);
        s.mark_paused("a", &paused(PauseKind::Memory), &UsageRecord::default())
            .unwrap();
        assert!(s
            .begin_stop_paused("a", crate::store::EndReason::Deleted)
            .unwrap());
        assert!(!s
            .begin_stop_paused("a", crate::store::EndReason::Deleted)
            .unwrap());
        s.mark_stopped(
            "a",
            crate::store::EndReason::Deleted,
            (None, None),
            None,
            30,
        )
        .unwrap();
        assert_eq!(s.pause_of("a").unwrap(), None);
    }
}
