//! The OOM killer of a sandbox whose kernel has none (gVisor): a watcher thread
//! waits on the runtime's [`MemoryWatch`] (the cgroup's use against the declared
//! limit, the cgroup's hard limit leaving headroom above it), and once the use is
//! past the line this task asks the sandbox's agent to kill its largest process
//! (`relieve_memory`; the agent chooses from its own view of the sandbox's
//! processes, the host reads nothing the sandbox writes to choose). A kill counts
//! as an OOM kill of the sandbox ([`Instance::count_memory_kill`]), so the code
//! interpreter says a cell was killed for memory as it does on the namespace
//! backend.
//!
//! The headroom is lent for a moment, not held: a stretch of use past the line
//! ([`Episode`]) that [`MAX_KILLS`] kills do not end, that lasts [`OVER_BOUND`],
//! or that has no process to kill twice, [`RETURN_GRACE`] apart (memory no
//! process holds: files, a memfd in flight on a socket) ends the sandbox as out of memory, as the host kernel
//! does past the hard limit: `end_reason` `exited`, SIGKILL, one more OOM kill
//! counted. So a tenant holds more than its quota counts for seconds at most.
//!
//! [`Instance::count_memory_kill`]: sandlot_runtime::Instance::count_memory_kill

use std::sync::mpsc as std_mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sandlot_runtime::memory_watch::MemoryWatch;
use tracing::Instrument;

use crate::sandbox::SandboxHandle;
use crate::store::EndReason;

/// The longest wait between two reads of the use when the kernel notifies a
/// crossing (a safety net), and when it cannot (the poll).
const NOTIFIED_BOUND: Duration = Duration::from_secs(1);
const POLL_BOUND: Duration = Duration::from_millis(100);
/// After a kill, how long the watcher waits for the killed process's memory to
/// come back before it may ask for another kill (gVisor returns it within a
/// fraction of this; a loaded host is slower, and a kill too many may end the
/// sandbox).
const SETTLE: Duration = Duration::from_secs(1);
/// With nothing to kill, how long the watcher waits for memory of processes
/// that just ended (killed, or gone on their own) to come back before it ends the
/// sandbox: gVisor returns it asynchronously, slower on a loaded host.
const RETURN_GRACE: Duration = Duration::from_secs(2);
/// After a request the agent did not answer, the wait before the next one.
const NO_ANSWER_BACKOFF: Duration = Duration::from_secs(1);
/// How long the agent has to answer.
const AGENT_ANSWER: Duration = Duration::from_secs(5);
/// Kills in one stretch past the line after which the sandbox ends: the largest
/// process is the one that crossed it (one kill brings a single runaway process
/// back under), and three largest gone with the use still past the line means
/// the memory is held where no kill reaches (a memfd passed around, files) or
/// by processes the sandbox starts again.
pub(crate) const MAX_KILLS: u32 = 3;
/// The longest stretch past the line before the sandbox ends, whatever the kills:
/// three kills with their settling take under 4 s; this leaves the agent two
/// unanswered requests ([`AGENT_ANSWER`]).
pub(crate) const OVER_BOUND: Duration = Duration::from_secs(10);
/// At most one line per this long says a process was killed; the next one says
/// how many more were.
const KILL_LOG_EVERY: Duration = Duration::from_secs(60);

/// One stretch of use past the line: from the reading that first sees it past
/// the line to the one that sees it under again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Episode {
    pub since: Instant,
    pub kills: u32,
    /// Whether the agent already had nothing to kill in it.
    pub nothing_to_kill: bool,
}

/// Why the guard ends a sandbox as out of memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EndWhy {
    /// [`MAX_KILLS`] kills left the use past the line.
    Kills(u32),
    /// The use stayed past the line for [`OVER_BOUND`].
    Lasted(Duration),
    /// Past the line with no process to kill.
    NothingToKill,
}

impl std::fmt::Display for EndWhy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EndWhy::Kills(n) => write!(f, "{n} kills left it past its declared limit"),
            EndWhy::Lasted(d) => write!(f, "it stayed past its declared limit for {d:?}"),
            EndWhy::NothingToKill => {
                write!(f, "it is past its declared limit with no process to kill")
            }
        }
    }
}

/// What the watcher does with the use past the line (a plan: no I/O).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Next {
    Kill,
    End(EndWhy),
}

pub(crate) fn next(ep: &Episode, now: Instant) -> Next {
    let lasted = now.saturating_duration_since(ep.since);
    if ep.kills >= MAX_KILLS {
        Next::End(EndWhy::Kills(ep.kills))
    } else if lasted >= OVER_BOUND {
        Next::End(EndWhy::Lasted(lasted))
    } else {
        Next::Kill
    }
}

/// What a request to the agent came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Relief {
    Killed,
    NothingToKill,
    /// An error, or no answer within [`AGENT_ANSWER`].
    NoAnswer,
}

/// What the watcher does after a request, from its outcome (a plan: no I/O).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AfterRequest {
    /// A process died: wait until the use is under the line, at most [`SETTLE`].
    Settle,
    /// Nothing to kill, the first time: wait until the use is under the line, at
    /// most [`RETURN_GRACE`], then ask again.
    AwaitReturn,
    /// The agent did not answer: wait [`NO_ANSWER_BACKOFF`] before asking again
    /// ([`OVER_BOUND`] still runs).
    BackOff,
    End(EndWhy),
}

pub(crate) fn after_request(r: Relief, ep: &Episode) -> AfterRequest {
    match r {
        Relief::Killed => AfterRequest::Settle,
        Relief::NoAnswer => AfterRequest::BackOff,
        Relief::NothingToKill if !ep.nothing_to_kill => AfterRequest::AwaitReturn,
        Relief::NothingToKill => AfterRequest::End(EndWhy::NothingToKill),
    }
}

/// What the watcher thread asks of the task.
#[derive(Debug, Clone, Copy)]
enum Ask {
    Kill,
    End(EndWhy),
}

/// Starts `h`'s memory guard when its instance has a memory watch; the guard ends
/// with the sandbox (its owner's stop, or its cgroup gone).
pub fn start(h: &Arc<SandboxHandle>) {
    let watch = match h.inst.memory_watch(h.memory_limit) {
        None => return,
        Some(Err(e)) => {
            tracing::warn!(
                "the sandbox's memory is not watched (a process past its hard limit ends \
                 the sandbox): {e}"
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
    let (ask_tx, mut ask_rx) = tokio::sync::mpsc::channel::<Ask>(1);
    let (done_tx, done_rx) = std_mpsc::sync_channel::<Relief>(1);
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
            let mut log = KillLog::default();
            loop {
                tokio::select! {
                    _ = h.stopped() => break,
                    asked = ask_rx.recv() => match asked {
                        None => break,
                        Some(Ask::Kill) => {
                            let r = relieve(&h, &mut log).await;
                            if done_tx.send(r).is_err() {
                                break;
                            }
                        }
                        Some(Ask::End(why)) => {
                            end_out_of_memory(&h, why, &log);
                            break;
                        }
                    }
                }
            }
        }
        .instrument(span),
    );
}

/// Ends the sandbox as the host kernel does past its hard limit: its owner
/// SIGKILLs gVisor's sandbox process (`end_reason` `exited`), the end counted as
/// an OOM kill.
fn end_out_of_memory(h: &SandboxHandle, why: EndWhy, log: &KillLog) {
    h.inst.count_memory_kill();
    tracing::warn!(
        kills = log.total,
        "ending the sandbox as out of memory: {why}"
    );
    h.request_stop(EndReason::Exited);
}

/// The kills said in the log: one line per [`KILL_LOG_EVERY`] at most.
#[derive(Debug, Default)]
struct KillLog {
    said_at: Option<Instant>,
    unsaid: u64,
    total: u64,
}

/// Has the agent kill the largest process.
async fn relieve(h: &SandboxHandle, log: &mut KillLog) -> Relief {
    match tokio::time::timeout(AGENT_ANSWER, h.guest.relieve_memory()).await {
        Ok(Ok(Some(v))) => {
            h.inst.count_memory_kill();
            log.total += 1;
            if log.said_at.is_none_or(|t| t.elapsed() >= KILL_LOG_EVERY) {
                tracing::info!(
                    pid = v.pid,
                    rss_bytes = v.rss_bytes,
                    more_kills_since_last_said = log.unsaid,
                    "killed the sandbox's largest process: its memory was past the declared limit"
                );
                log.said_at = Some(Instant::now());
                log.unsaid = 0;
            } else {
                log.unsaid += 1;
            }
            Relief::Killed
        }
        Ok(Ok(None)) => Relief::NothingToKill,
        Ok(Err(e)) => {
            tracing::warn!("relieve the sandbox's memory: {e}");
            Relief::NoAnswer
        }
        Err(_) => {
            tracing::warn!(
                "relieve the sandbox's memory: the agent did not answer within {AGENT_ANSWER:?}"
            );
            Relief::NoAnswer
        }
    }
}

/// The watcher thread: waits for the use to pass the line, asks the task for a
/// kill and waits for its outcome, or for the sandbox's end when the stretch
/// past the line is over its bounds. Ends when the cgroup is gone or the task is.
fn watch_loop(
    w: &MemoryWatch,
    ask: &tokio::sync::mpsc::Sender<Ask>,
    done: &std_mpsc::Receiver<Relief>,
) {
    let mut episode: Option<Episode> = None;
    loop {
        if ask.is_closed() {
            return;
        }
        let Some(r) = w.reading() else { return };
        if r.counted <= w.line() {
            episode = None;
            w.wait(wait_bound(w.notified(), r.total > w.line()));
            continue;
        }
        let now = Instant::now();
        let ep = episode.get_or_insert(Episode {
            since: now,
            kills: 0,
            nothing_to_kill: false,
        });
        if let Next::End(why) = next(ep, now) {
            let _ = ask.blocking_send(Ask::End(why));
            return;
        }
        if ask.blocking_send(Ask::Kill).is_err() {
            return;
        }
        let Ok(relief) = done.recv() else { return };
        let wait_under = |bound: Duration| {
            let until = Instant::now() + bound;
            while w.over() && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(20));
            }
        };
        match after_request(relief, ep) {
            AfterRequest::Settle => {
                ep.kills += 1;
                wait_under(SETTLE);
            }
            AfterRequest::AwaitReturn => {
                ep.nothing_to_kill = true;
                wait_under(RETURN_GRACE);
            }
            AfterRequest::BackOff => std::thread::sleep(NO_ANSWER_BACKOFF),
            AfterRequest::End(why) => {
                let _ = ask.blocking_send(Ask::End(why));
                return;
            }
        }
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
    use super::{
        after_request, next, wait_bound, AfterRequest, EndWhy, Episode, Next, Relief, MAX_KILLS,
        NOTIFIED_BOUND, OVER_BOUND, POLL_BOUND,
    };
    use std::time::{Duration, Instant};

    #[test]
    fn a_kill_waits_for_memory_to_return_and_nothing_to_kill_twice_ends_the_sandbox() {
        let mut ep = Episode {
            since: Instant::now(),
            kills: 1,
            nothing_to_kill: false,
        };
        assert_eq!(after_request(Relief::Killed, &ep), AfterRequest::Settle);
        assert_eq!(after_request(Relief::NoAnswer, &ep), AfterRequest::BackOff);
        // The memory of a process just ended may still be coming back.
        assert_eq!(
            after_request(Relief::NothingToKill, &ep),
            AfterRequest::AwaitReturn
        );
        ep.nothing_to_kill = true;
        assert_eq!(
            after_request(Relief::NothingToKill, &ep),
            AfterRequest::End(EndWhy::NothingToKill)
        );
    }

    #[test]
    fn a_stretch_past_the_line_ends_the_sandbox_after_its_kills_or_its_time() {
        let t0 = Instant::now();
        let ep = |kills| Episode {
            since: t0,
            kills,
            nothing_to_kill: false,
        };
        assert_eq!(next(&ep(0), t0), Next::Kill);
        assert_eq!(
            next(&ep(MAX_KILLS - 1), t0 + Duration::from_secs(2)),
            Next::Kill
        );
        assert_eq!(
            next(&ep(MAX_KILLS), t0 + Duration::from_secs(1)),
            Next::End(EndWhy::Kills(MAX_KILLS))
        );
        // Requests the agent never answers kill nothing: the time still runs.
        assert_eq!(
            next(&ep(0), t0 + OVER_BOUND),
            Next::End(EndWhy::Lasted(OVER_BOUND))
        );
    }

    #[test]
    fn the_watch_polls_without_a_notification_or_with_the_use_past_the_line() {
        assert_eq!(wait_bound(true, false), NOTIFIED_BOUND);
        assert_eq!(wait_bound(true, true), POLL_BOUND);
        assert_eq!(wait_bound(false, false), POLL_BOUND);
    }
}
