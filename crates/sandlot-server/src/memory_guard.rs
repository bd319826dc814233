//! The OOM killer of a sandbox whose kernel has none (gVisor): a watcher thread
//! waits on the runtime's [`MemoryWatch`] (the cgroup's use against the declared
//! limit, the cgroup's hard limit leaving headroom above it), and once the use is
//! past the line this task asks the sandbox's agent to kill its largest process
//! (`relieve_memory`; the agent chooses from its own view of the sandbox's
//! processes, the host reads nothing the sandbox writes to choose). A kill counts
//! as an OOM kill of the sandbox ([`Instance::count_memory_kill`]), so the code
//! interpreter says a cell was killed for memory as it does on the namespace
//! backend. Past the hard limit the host kernel kills gVisor's sentry and the
//! sandbox ends, out of memory, as before.

use std::sync::mpsc as std_mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sandlot_runtime::memory_watch::MemoryWatch;
use tracing::Instrument;

use crate::sandbox::SandboxHandle;

/// The longest wait between two reads of the use when the kernel notifies a
/// crossing (a safety net), and when it cannot (the poll).
const NOTIFIED_BOUND: Duration = Duration::from_secs(1);
const POLL_BOUND: Duration = Duration::from_millis(100);
/// After a kill, how long the watcher waits for the killed process's memory to
/// come back before it may ask for another kill (gVisor returns it within a
/// fraction of this).
const SETTLE: Duration = Duration::from_millis(500);
/// After a request that killed nothing, the wait before the next one.
const NOTHING_TO_KILL_BACKOFF: Duration = Duration::from_secs(2);
/// How long the agent has to answer.
const AGENT_ANSWER: Duration = Duration::from_secs(5);

/// What the watcher does after a request, from its outcome (a plan: no I/O).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AfterRequest {
    /// A process died: wait until the use is under the line, at most [`SETTLE`].
    Settle,
    /// Nothing was killed (none to kill, or the agent did not answer): wait
    /// [`NOTHING_TO_KILL_BACKOFF`] before asking again.
    BackOff,
}

pub(crate) fn after_request(killed: bool) -> AfterRequest {
    if killed {
        AfterRequest::Settle
    } else {
        AfterRequest::BackOff
    }
}

/// Starts `h`'s memory guard when its instance has a memory watch; the guard ends
/// with the sandbox (its owner's stop, or its cgroup gone).
pub fn start(h: &Arc<SandboxHandle>) {
    let watch = match h.inst.memory_watch() {
        None => return,
        Some(Err(e)) => {
            tracing::warn!(
                "cannot watch the sandbox's memory (a process past its limit ends the sandbox): {e}"
            );
            return;
        }
        Some(Ok((w, why_poll))) => {
            if let Some(why) = why_poll {
                tracing::warn!(
                    "the sandbox's memory watch polls every {POLL_BOUND:?}: no notification ({why})"
                );
            }
            w
        }
    };
    let (ask_tx, mut ask_rx) = tokio::sync::mpsc::channel::<()>(1);
    let (done_tx, done_rx) = std_mpsc::sync_channel::<bool>(1);
    let span = h.span.clone();
    let thread = std::thread::Builder::new()
        .name("memory-watch".into())
        .spawn(move || {
            let _g = span.entered();
            watch_loop(&watch, &ask_tx, &done_rx)
        });
    if let Err(e) = thread {
        tracing::warn!("cannot start the sandbox's memory watch: {e}");
        return;
    }
    let (h, span) = (h.clone(), h.span.clone());
    tokio::spawn(
        async move {
            let mut quiet_until = None;
            loop {
                tokio::select! {
                    _ = h.stopped() => break,
                    asked = ask_rx.recv() => {
                        if asked.is_none() {
                            break;
                        }
                        let killed = relieve(&h, &mut quiet_until).await;
                        if done_tx.send(killed).is_err() {
                            break;
                        }
                    }
                }
            }
        }
        .instrument(span),
    );
}

/// Has the agent kill the largest process; whether one was killed.
async fn relieve(h: &SandboxHandle, quiet_until: &mut Option<Instant>) -> bool {
    match tokio::time::timeout(AGENT_ANSWER, h.guest.relieve_memory()).await {
        Ok(Ok(Some(v))) => {
            h.inst.count_memory_kill();
            tracing::info!(
                pid = v.pid,
                rss_bytes = v.rss_bytes,
                "killed the sandbox's largest process: its memory was past the declared limit"
            );
            true
        }
        Ok(Ok(None)) => {
            // Memory no process holds (its tmpfs files): said once a minute at
            // most, however long it lasts.
            if quiet_until.is_none_or(|t| Instant::now() >= t) {
                *quiet_until = Some(Instant::now() + Duration::from_secs(60));
                tracing::warn!(
                    "the sandbox's memory is past its declared limit with no process to kill"
                );
            }
            false
        }
        Ok(Err(e)) => {
            tracing::warn!("relieve the sandbox's memory: {e}");
            false
        }
        Err(_) => {
            tracing::warn!(
                "relieve the sandbox's memory: the agent did not answer within {AGENT_ANSWER:?}"
            );
            false
        }
    }
}

/// The watcher thread: waits for the use to pass the line, asks the task for a
/// kill and waits for its outcome. Ends when the cgroup is gone or the task is.
fn watch_loop(
    w: &MemoryWatch,
    ask: &tokio::sync::mpsc::Sender<()>,
    done: &std_mpsc::Receiver<bool>,
) {
    loop {
        if ask.is_closed() {
            return;
        }
        let Some(r) = w.reading() else { return };
        if r.counted > w.line() {
            if ask.blocking_send(()).is_err() {
                return;
            }
            let Ok(killed) = done.recv() else { return };
            match after_request(killed) {
                AfterRequest::Settle => {
                    let until = Instant::now() + SETTLE;
                    while w.over() && Instant::now() < until {
                        std::thread::sleep(Duration::from_millis(20));
                    }
                }
                AfterRequest::BackOff => std::thread::sleep(NOTHING_TO_KILL_BACKOFF),
            }
            continue;
        }
        w.wait(wait_bound(w.notified(), r.total > w.line()));
    }
}

/// How long the watcher may sleep: long while the kernel would notify it of a
/// crossing, short (a poll) when it cannot, or when the whole use is already past
/// the line (the page cache there; the kernel notifies crossings only).
pub(crate) fn wait_bound(notified: bool, total_past_line: bool) -> Duration {
    if notified && !total_past_line {
        NOTIFIED_BOUND
    } else {
        POLL_BOUND
    }
}

#[cfg(test)]
mod tests {
    use super::{after_request, wait_bound, AfterRequest, NOTIFIED_BOUND, POLL_BOUND};

    #[test]
    fn a_kill_waits_for_memory_to_return_and_no_kill_backs_off() {
        assert_eq!(after_request(true), AfterRequest::Settle);
        assert_eq!(after_request(false), AfterRequest::BackOff);
    }

    #[test]
    fn the_watch_polls_without_a_notification_or_with_the_use_past_the_line() {
        assert_eq!(wait_bound(true, false), NOTIFIED_BOUND);
        assert_eq!(wait_bound(true, true), POLL_BOUND);
        assert_eq!(wait_bound(false, false), POLL_BOUND);
    }
}
