//! A sandbox's lifecycle policy (`on_idle`, `on_timeout`, `auto_resume`) and the
//! lifetime it was created with: a row of `lifecycles`, written with its record
//! at admission when the policy is not the default, read with it by a join.

use rusqlite::{params, Connection, Row};

use super::{sql, Lifecycle, OnExpiry, SandboxRecord, StoreError};

/// Writes `rec`'s policy in its admission's transaction (nothing for the
/// default one).
pub(super) fn insert_lifecycle(tx: &Connection, rec: &SandboxRecord) -> Result<(), StoreError> {
    if rec.lifecycle.is_default() {
        return Ok(());
    }
    let l = rec.lifecycle;
    tx.prepare_cached(
        "INSERT INTO lifecycles (sandbox_id, on_idle, on_timeout, auto_resume, timeout_ms)
         VALUES (?1, ?2, ?3, ?4, ?5)",
    )
    .and_then(|mut st| {
        st.execute(params![
            rec.id,
            l.on_idle.as_str(),
            l.on_timeout.as_str(),
            l.auto_resume,
            rec.timeout_ms
        ])
    })
    .map_err(sql("insert lifecycle"))?;
    Ok(())
}

/// The policy in columns `at..at + 3` of a sandbox row (the default without a
/// row of `lifecycles`).
pub(super) fn lifecycle_from_row(r: &Row<'_>, at: usize) -> Result<Lifecycle, String> {
    let on_idle: Option<String> = r.get(at).map_err(|e| e.to_string())?;
    let on_timeout: Option<String> = r.get(at + 1).map_err(|e| e.to_string())?;
    let auto_resume: Option<bool> = r.get(at + 2).map_err(|e| e.to_string())?;
    let policy = |v: Option<String>| match v {
        None => Ok(OnExpiry::Kill),
        Some(s) => OnExpiry::parse(&s).ok_or(format!("unknown policy {s:?}")),
    };
    Ok(Lifecycle {
        on_idle: policy(on_idle)?,
        on_timeout: policy(on_timeout)?,
        auto_resume: auto_resume.unwrap_or(false),
    })
}

#[cfg(test)]
mod tests {
    use super::super::*;

    fn rec(id: &str, lifecycle: Lifecycle) -> SandboxRecord {
        SandboxRecord {
            id: id.into(),
            tenant: "t".into(),
            name: None,
            spec: serde_json::json!({}),
            tags: Default::default(),
            metadata: Default::default(),
            state: SandboxState::Creating,
            end_reason: None,
            exit_code: None,
            exit_signal: None,
            error: None,
            pid: None,
            memory_bytes: 1,
            created_at: 1_000,
            started_at: None,
            ended_at: None,
            expires_at: 61_000,
            idle_timeout_ms: Some(5_000),
            usage: UsageRecord::default(),
            lifecycle,
            timeout_ms: 60_000,
        }
    }

    #[test]
    fn a_sandboxs_lifecycle_is_read_back_with_its_record() {
        let s = Store::in_memory().unwrap();
        let l = Lifecycle {
            on_idle: OnExpiry::Pause,
            on_timeout: OnExpiry::Kill,
            auto_resume: true,
        };
        s.admit_sandbox(&rec("a", l), 10, u64::MAX).unwrap();
        s.admit_sandbox(&rec("b", Lifecycle::default()), 10, u64::MAX)
            .unwrap();
        let a = s.get_sandbox("a").unwrap().unwrap();
        assert_eq!((a.lifecycle, a.timeout_ms), (l, 60_000));
        let b = s.get_sandbox("b").unwrap().unwrap();
        assert_eq!((b.lifecycle, b.timeout_ms), (Lifecycle::default(), 60_000));
        let listed = s
            .list_sandboxes(&SandboxFilter {
                limit: 10,
                ..Default::default()
            })
            .unwrap();
        assert!(listed.iter().any(|r| r.id == "a" && r.lifecycle == l));
    }
}
