//! Auto-pause and resume on demand: a sandbox's lifecycle policy (`on_idle`,
//! `on_timeout`, `auto_resume`; `store/lifecycle.rs` keeps it).
//!
//! When a timeout of a sandbox passes, its owner task (`sandbox::own`) asks
//! [`expiry`] what it means and [`plan`] what to do: end it as before, or pause
//! it as `POST .../pause` would ([`crate::pause::pause`], same checks). A pause
//! that `limits.max_paused_per_tenant` or `limits.max_timeout` rules out, or that
//! is refused or fails, ends it instead, with the reason in its `error`.
//!
//! With `auto_resume`, [`live`] (exec, files, code contexts, the port proxy) and
//! [`wake`] (E2B's envd and code interpreter) resume a paused sandbox before the
//! call: concurrent callers share one resume ([`resume_once`]).

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use crate::auth::Principal;
use crate::error::{ApiError, ApiResult, ErrorCode};
use crate::sandbox::SandboxHandle;
use crate::state::AppState;
use crate::store::{now_ms, EndReason, Lifecycle, OnExpiry, SandboxState};

/// The lifecycle a create body asks for (`on_idle`, `on_timeout`,
/// `auto_resume`; absent: kill, kill, false). `on_idle: "pause"` needs an idle
/// timeout (`idle_timeout`, or the operator's default).
pub fn lifecycle_of(
    req: &sandlot_proto::api::CreateSandboxRequest,
    idle_timeout: Option<Duration>,
) -> ApiResult<Lifecycle> {
    let on_idle = req.on_idle.unwrap_or_default();
    if on_idle == OnExpiry::Pause && idle_timeout.is_none() {
        return Err(ApiError::invalid(
            "on_idle",
            "\"pause\" needs an idle_timeout (none is given and the operator sets no default)",
        ));
    }
    Ok(Lifecycle {
        on_idle,
        on_timeout: req.on_timeout.unwrap_or_default(),
        auto_resume: req.auto_resume.unwrap_or(false),
    })
}

/// What the owner's clocks read, in ms since the epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Clocks {
    pub now: i64,
    pub expires_at: i64,
    pub idle_deadline: Option<i64>,
}

/// A timeout that has passed and what the policy says it does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Expiry {
    pub reason: EndReason,
    pub policy: OnExpiry,
}

/// The timeout that has passed, if one has: the lifetime before the idle timeout.
pub fn expiry(c: &Clocks, l: &Lifecycle) -> Option<Expiry> {
    if c.now >= c.expires_at {
        return Some(Expiry {
            reason: EndReason::Timeout,
            policy: l.on_timeout,
        });
    }
    if c.idle_deadline.is_some_and(|d| c.now >= d) {
        return Some(Expiry {
            reason: EndReason::IdleTimeout,
            policy: l.on_idle,
        });
    }
    None
}

/// What bounds an auto-pause: the tenant's paused sandboxes and the lifetime a
/// resume would give back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// The tenant's paused sandboxes now.
    pub paused: u64,
    /// `limits.max_paused_per_tenant` (0: no cap).
    pub max_paused: u32,
    /// The lifetime it was created with.
    pub timeout_ms: i64,
    /// What is left before `created_at + limits.max_timeout`.
    pub left_of_max_ms: i64,
}

/// What the owner does about an [`Expiry`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    /// End it; `why` says why a pause policy was not followed.
    End {
        reason: EndReason,
        why: Option<String>,
    },
    /// Pause it, keeping `remaining_ms` of lifetime for its resume.
    Pause {
        reason: EndReason,
        remaining_ms: i64,
    },
}

/// Decides what an expiry does, as data.
pub fn plan(e: Expiry, b: &Bounds) -> Plan {
    if e.policy == OnExpiry::Kill {
        return Plan::End {
            reason: e.reason,
            why: None,
        };
    }
    let refuse = |why: String| Plan::End {
        reason: e.reason,
        why: Some(format!(
            "its {} passed and it was to be paused, but {why}: it was ended instead",
            what_passed(e.reason)
        )),
    };
    if b.max_paused > 0 && b.paused >= u64::from(b.max_paused) {
        return refuse(format!(
            "its tenant has {} sandboxes paused, limits.max_paused_per_tenant is {}",
            b.paused, b.max_paused
        ));
    }
    let remaining_ms = b.timeout_ms.min(b.left_of_max_ms);
    if remaining_ms <= 0 {
        return refuse("its lifetime has reached limits.max_timeout".into());
    }
    Plan::Pause {
        reason: e.reason,
        remaining_ms,
    }
}

fn what_passed(reason: EndReason) -> &'static str {
    match reason {
        EndReason::IdleTimeout => "idle timeout",
        _ => "lifetime timeout",
    }
}

/// How an expiry settled, for the owner.
pub enum Settled {
    /// Paused: the owner's work is done.
    Paused,
    /// It stops for this reason.
    Stop(EndReason),
    /// The pause failed and its PID 1 is gone: it stops as exited.
    Exited,
    /// The pause failed and a successor handle (with its own owner, asked to
    /// stop) took over: this owner's work is done.
    Replaced,
    /// Not paused: a request came since its idle timeout passed; it runs on.
    Busy,
}

/// Follows an expiry on `h`'s owner task.
pub async fn on_expiry(state: &Arc<AppState>, h: &Arc<SandboxHandle>, e: Expiry) -> Settled {
    let limits = &state.cfg.limits;
    let paused = if e.policy == OnExpiry::Pause && limits.max_paused_per_tenant > 0 {
        match state.store.count_paused(&h.tenant) {
            Ok(n) => n,
            Err(err) => {
                tracing::error!("count paused sandboxes: {err}");
                u64::MAX
            }
        }
    } else {
        0
    };
    let now = now_ms();
    let max_timeout_ms = limits.max_timeout.duration().as_millis() as i64;
    let bounds = Bounds {
        paused,
        max_paused: limits.max_paused_per_tenant,
        timeout_ms: h.timeout_ms,
        left_of_max_ms: h.created_at.saturating_add(max_timeout_ms) - now,
    };
    let (reason, remaining_ms) = match plan(e, &bounds) {
        Plan::End { reason, why } => {
            if let Some(why) = why {
                refused(state, h, &why);
            }
            return Settled::Stop(reason);
        }
        Plan::Pause {
            reason,
            remaining_ms,
        } => (reason, remaining_ms),
    };
    // What the pause keeps as the lifetime its resume gives back.
    let lifetime = h.expires_at_ms();
    h.set_expiry(now + remaining_ms);
    tracing::info!(
        reason = reason.as_str(),
        remaining_ms,
        "auto-pausing the sandbox"
    );
    use crate::pause::Outcome;
    // The idle timeout was read from a snapshot: the pause checks it again once
    // new requests wait for it.
    let while_idle = reason == EndReason::IdleTimeout;
    match crate::pause::pause(state, h, while_idle).await {
        Outcome::Paused(_) => {
            let what = format!("{} passed", what_passed(reason));
            if let Err(err) = state.store.add_event(&h.id, "auto_paused", &what) {
                tracing::warn!("record the auto-pause: {err}");
            }
            Settled::Paused
        }
        Outcome::Running(err) if err.code == crate::pause::BUSY && !h.is_stopping() => {
            tracing::info!("auto-pause not done: the sandbox is in use again");
            h.set_expiry(lifetime);
            Settled::Busy
        }
        Outcome::Running(err) => {
            if h.is_stopping() {
                // Deleted meanwhile: that is why it ends.
                tracing::info!("auto-pause not done ({}); stopping as asked", err.message);
            } else {
                refused(state, h, &pause_failed(reason, &err));
            }
            Settled::Stop(reason)
        }
        Outcome::Replaced(err) => {
            refused(state, h, &pause_failed(reason, &err));
            if let Some(next) = state.handle(&h.id) {
                next.request_stop(reason);
            }
            Settled::Replaced
        }
        Outcome::Ended(_) => Settled::Exited,
    }
}

fn pause_failed(reason: EndReason, e: &ApiError) -> String {
    format!(
        "its {} passed and it was to be paused, but the pause failed ({}): it was ended instead",
        what_passed(reason),
        e.message
    )
}

fn refused(state: &AppState, h: &SandboxHandle, why: &str) {
    tracing::warn!("auto-pause not done: {why}");
    if let Err(e) = state.store.record_teardown_error(&h.id, why) {
        tracing::error!("record the refused auto-pause: {e}");
    }
}

/// How long a call waits for a pause or resume under way to finish before it
/// answers the state it found.
pub(crate) const SETTLE_WAIT: Duration = Duration::from_secs(120);
pub(crate) const SETTLE_POLL: Duration = Duration::from_millis(50);

/// [`crate::services::sandboxes::live`], except that a paused sandbox with `auto_resume` is
/// resumed first (and one being paused or resumed is waited for).
pub async fn live(state: &Arc<AppState>, p: &Principal, id: &str) -> ApiResult<Arc<SandboxHandle>> {
    let first = match crate::services::sandboxes::live(state, p, id) {
        Ok(h) => return Ok(h),
        Err(e) if e.code == ErrorCode::InvalidState => e,
        Err(e) => return Err(e),
    };
    let rec = crate::services::sandboxes::lookup(state, p, id)?;
    if !rec.lifecycle.auto_resume {
        return Err(first);
    }
    settle(state, p, &rec.id).await?;
    crate::services::sandboxes::live(state, p, &rec.id)
}

/// Resumes sandbox `id` (E2B's envd and code interpreter, whose caller holds its
/// access token) if it is paused with `auto_resume`; nothing otherwise.
pub async fn wake(state: &Arc<AppState>, id: &str) -> ApiResult<()> {
    if state.handle(id).is_some_and(|h| !h.is_pausing()) {
        return Ok(());
    }
    let Some(rec) = state.store.get_sandbox(id).map_err(ApiError::internal)? else {
        return Ok(());
    };
    let idle = matches!(
        rec.state,
        SandboxState::Pausing | SandboxState::Paused | SandboxState::Resuming
    );
    if !idle || !rec.lifecycle.auto_resume {
        return Ok(());
    }
    let p = Principal::tenant(rec.tenant.clone());
    settle(state, &p, &rec.id).await
}

/// Resumes paused sandbox `id` (an id, not a name) for `p`, sharing the resume
/// with the calls that resume it on demand; waits out a pause under way first.
pub async fn resume(state: &Arc<AppState>, p: &Principal, id: &str) -> ApiResult<()> {
    settle(state, p, id).await
}

/// Brings sandbox `id` (an id, not a name) to running: waits out a pause or
/// resume under way and resumes it once paused. The error is what `POST
/// .../resume` answers, or 409 `invalid_state` for a state it cannot leave.
async fn settle(state: &Arc<AppState>, p: &Principal, id: &str) -> ApiResult<()> {
    let deadline = tokio::time::Instant::now() + SETTLE_WAIT;
    loop {
        let rec = crate::services::sandboxes::lookup(state, p, id)?;
        let waiting = match rec.state {
            SandboxState::Running => match state.handle(id) {
                Some(h) if h.is_pausing() => true,
                Some(_) => return Ok(()),
                // Recorded running by a resume that registers its handle next.
                None => true,
            },
            SandboxState::Paused => match resume_once(state, p, id).await {
                Ok(()) => return Ok(()),
                // Another call resumed it (or a delete came) meanwhile: look again.
                Err(e) if e.code == ErrorCode::InvalidState => true,
                Err(e) => return Err(e),
            },
            SandboxState::Pausing | SandboxState::Resuming => true,
            _ => return Err(crate::pause::wrong_state(id, rec.state)),
        };
        if waiting && tokio::time::Instant::now() >= deadline {
            return Err(crate::pause::wrong_state(id, rec.state));
        }
        tokio::time::sleep(SETTLE_POLL).await;
    }
}

/// The resume of a sandbox under way on demand, shared by its callers.
type Shared = Arc<tokio::sync::OnceCell<ApiResult<()>>>;

/// Resumes under way on demand, by sandbox id (ids are unique across daemons'
/// states, so one map serves every state of the process). An entry lasts as
/// long as its resume: a later pause's resume never finds an earlier answer.
static RESUMES: LazyLock<Mutex<HashMap<String, Shared>>> = LazyLock::new(Default::default);

/// Resumes paused sandbox `id` once for every caller that asks while it runs:
/// they all get its answer.
async fn resume_once(state: &Arc<AppState>, p: &Principal, id: &str) -> ApiResult<()> {
    let (st, p, owned) = (state.clone(), p.clone(), id.to_string());
    shared(id, move || async move {
        tracing::info!(sandbox_id = %owned, "resuming the sandbox on demand");
        crate::pause::resume(&st, &p, &owned).await.map(|_| ())
    })
    .await
}

/// Runs `work` once for the callers that ask for `id` while it runs (the first
/// one's `work`; the others' are dropped): they all get its answer. It runs on a
/// task of its own, so that a caller that goes away (a dropped connection) does
/// not cut it short for the others, and that task removes the entry once it is
/// done, whichever callers are still reading the answer.
async fn shared<F, W>(id: &str, work: F) -> ApiResult<()>
where
    F: FnOnce() -> W,
    W: std::future::Future<Output = ApiResult<()>> + Send + 'static,
{
    let cell = RESUMES
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .entry(id.to_string())
        .or_default()
        .clone();
    let mine = Arc::downgrade(&cell);
    let guard = Forget {
        id,
        cell: Some(cell),
    };
    let Some(cell) = guard.cell.as_ref() else {
        unreachable!("set above")
    };
    cell.get_or_init(|| async move {
        let (key, run) = (id.to_string(), work());
        tokio::spawn(async move {
            let r = run.await;
            forget_done(&key, &mine);
            r
        })
        .await
        .unwrap_or_else(|e| Err(ApiError::internal(format!("resume task: {e}"))))
    })
    .await
    .clone()
}

/// Removes `id`'s entry of [`RESUMES`] if it is still `done`'s.
fn forget_done(id: &str, done: &std::sync::Weak<tokio::sync::OnceCell<ApiResult<()>>>) {
    let mut m = RESUMES.lock().unwrap_or_else(|e| e.into_inner());
    if m.get(id)
        .is_some_and(|c| std::ptr::eq(Arc::as_ptr(c), done.as_ptr()))
    {
        m.remove(id);
    }
}

/// Removes a sandbox's entry of [`RESUMES`] when its last caller is done (a
/// resume whose task never finished). Its copy of the entry is released under
/// the map's lock, as every copy is taken, so that of two callers finishing
/// together the second sees the first's gone.
struct Forget<'a> {
    id: &'a str,
    cell: Option<Shared>,
}

impl Drop for Forget<'_> {
    fn drop(&mut self) {
        let mut m = RESUMES.lock().unwrap_or_else(|e| e.into_inner());
        let Some(mine) = self.cell.take() else {
            return;
        };
        let same = m.get(self.id).is_some_and(|c| Arc::ptr_eq(c, &mine));
        drop(mine);
        // Held by the map only: no other caller waits.
        if same && m.get(self.id).is_some_and(|c| Arc::strong_count(c) == 1) {
            m.remove(self.id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(v: serde_json::Value) -> sandlot_proto::api::CreateSandboxRequest {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn the_lifecycle_is_read_from_the_create_request() {
        let r = request(serde_json::json!({
            "on_idle": "pause", "on_timeout": "kill", "auto_resume": true, "image": "host"
        }));
        let l = lifecycle_of(&r, Some(Duration::from_secs(5))).unwrap();
        assert_eq!(
            l,
            Lifecycle {
                on_idle: OnExpiry::Pause,
                on_timeout: OnExpiry::Kill,
                auto_resume: true
            }
        );
        let l = lifecycle_of(&request(serde_json::json!({})), None).unwrap();
        assert!(l.is_default());
        let nulls = serde_json::json!({"on_idle": null, "on_timeout": null, "auto_resume": null});
        assert!(lifecycle_of(&request(nulls), None).unwrap().is_default());
    }

    #[test]
    fn pausing_when_idle_needs_an_idle_timeout() {
        let e = lifecycle_of(&request(serde_json::json!({"on_idle": "pause"})), None).unwrap_err();
        assert_eq!(e.field.as_deref(), Some("on_idle"));
        assert!(e.message.contains("idle_timeout"), "{}", e.message);
    }

    #[test]
    fn the_shared_resume_entry_goes_with_its_last_caller() {
        let id = "sb-shared-resume-entry-test";
        let join = || Forget {
            id,
            cell: Some(
                RESUMES
                    .lock()
                    .unwrap()
                    .entry(id.into())
                    .or_default()
                    .clone(),
            ),
        };
        let (first, second) = (join(), join());
        assert!(
            Arc::ptr_eq(first.cell.as_ref().unwrap(), second.cell.as_ref().unwrap()),
            "one resume for both"
        );
        drop(first);
        assert!(RESUMES.lock().unwrap().contains_key(id));
        drop(second);
        assert!(!RESUMES.lock().unwrap().contains_key(id));
    }

    #[tokio::test]
    async fn a_finished_resume_is_never_the_answer_of_a_later_one() {
        const ID: &str = "sb-shared-resume-later-test";
        let (go, wait) = tokio::sync::oneshot::channel::<()>();
        let first = tokio::spawn(shared(ID, move || async move {
            let _ = wait.await;
            Err(ApiError::quota("no room"))
        }));
        while !RESUMES.lock().unwrap().contains_key(ID) {
            tokio::task::yield_now().await;
        }
        // A second caller joins and is not yet done reading the answer when the
        // resume ends (as when two callers finish together).
        let mut second = Box::pin(shared(ID, || async {
            Err(ApiError::conflict("ran again"))
        }));
        tokio::select! {
            biased;
            _ = &mut second => panic!("answered before the resume ended"),
            _ = std::future::ready(()) => {}
        }
        go.send(()).unwrap();
        assert_eq!(
            first.await.unwrap().unwrap_err().code.as_str(),
            "quota_exceeded"
        );
        // The next pause's resume runs again, and does not get the old answer.
        let ran = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let r = ran.clone();
        shared(ID, move || async move {
            r.store(true, std::sync::atomic::Ordering::SeqCst);
            Ok(())
        })
        .await
        .unwrap();
        assert!(ran.load(std::sync::atomic::Ordering::SeqCst));
        assert_eq!(second.await.unwrap_err().code.as_str(), "quota_exceeded");
        assert!(!RESUMES.lock().unwrap().contains_key(ID));
    }

    const PAUSE_BOTH: Lifecycle = Lifecycle {
        on_idle: OnExpiry::Pause,
        on_timeout: OnExpiry::Pause,
        auto_resume: false,
    };

    #[test]
    fn the_lifetime_timeout_wins_over_the_idle_one() {
        let c = Clocks {
            now: 100,
            expires_at: 100,
            idle_deadline: Some(50),
        };
        let e = expiry(&c, &Lifecycle::default()).unwrap();
        assert_eq!((e.reason, e.policy), (EndReason::Timeout, OnExpiry::Kill));
        let c = Clocks {
            expires_at: 200,
            ..c
        };
        let e = expiry(&c, &PAUSE_BOTH).unwrap();
        assert_eq!(
            (e.reason, e.policy),
            (EndReason::IdleTimeout, OnExpiry::Pause)
        );
        let c = Clocks {
            idle_deadline: None,
            ..c
        };
        assert_eq!(expiry(&c, &PAUSE_BOTH), None);
    }

    fn bounds() -> Bounds {
        Bounds {
            paused: 0,
            max_paused: 2,
            timeout_ms: 60_000,
            left_of_max_ms: 3_600_000,
        }
    }

    #[test]
    fn a_pause_policy_pauses_with_the_created_lifetime_to_resume_with() {
        let e = Expiry {
            reason: EndReason::IdleTimeout,
            policy: OnExpiry::Pause,
        };
        assert_eq!(
            plan(e, &bounds()),
            Plan::Pause {
                reason: EndReason::IdleTimeout,
                remaining_ms: 60_000
            }
        );
        let b = Bounds {
            left_of_max_ms: 10_000,
            ..bounds()
        };
        assert_eq!(
            plan(e, &b),
            Plan::Pause {
                reason: EndReason::IdleTimeout,
                remaining_ms: 10_000
            },
            "never past created_at + max_timeout"
        );
    }

    #[test]
    fn kill_policy_ends_without_a_reason_to_explain() {
        let e = Expiry {
            reason: EndReason::Timeout,
            policy: OnExpiry::Kill,
        };
        assert_eq!(
            plan(e, &bounds()),
            Plan::End {
                reason: EndReason::Timeout,
                why: None
            }
        );
    }

    #[test]
    fn an_auto_pause_past_the_paused_cap_or_max_lifetime_ends_it_saying_why() {
        let e = Expiry {
            reason: EndReason::Timeout,
            policy: OnExpiry::Pause,
        };
        let full = Bounds {
            paused: 2,
            ..bounds()
        };
        match plan(e, &full) {
            Plan::End {
                reason: EndReason::Timeout,
                why: Some(why),
            } => assert!(why.contains("max_paused_per_tenant"), "{why}"),
            other => panic!("{other:?}"),
        }
        let old = Bounds {
            left_of_max_ms: 0,
            ..bounds()
        };
        match plan(e, &old) {
            Plan::End { why: Some(why), .. } => assert!(why.contains("max_timeout"), "{why}"),
            other => panic!("{other:?}"),
        }
        let uncapped = Bounds {
            paused: 1_000,
            max_paused: 0,
            ..bounds()
        };
        assert!(matches!(plan(e, &uncapped), Plan::Pause { .. }));
    }
}
