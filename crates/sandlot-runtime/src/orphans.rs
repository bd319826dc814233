//! Reaping what a child subreaper adopts.
//!
//! The daemon is a child subreaper so that sandbox PID 1s are re-parented to it when their
//! `__init` helper exits. The same makes it the parent of every other orphan among its
//! descendants: a program one of its helpers started and left behind (a daemonized
//! background job, a child of a crashed tool). Nobody waits for those, and each would stay a
//! zombie for the daemon's lifetime, a slot of the host's PID table apiece.
//!
//! [`start`] runs a thread that reaps them. Zombies the daemon waits for itself are never
//! touched: the pids registered with [`protect`] (sandbox PID 1s, whose exit status the
//! sandbox's owner reads, and long-lived helpers held as `std::process::Child`), and any
//! zombie younger than one scan interval (a child that a `Command::output()` or `wait()`
//! is about to reap; such a wait is already blocked in `waitpid` and reaps within
//! microseconds). The common case costs one `waitid(WNOWAIT)` a second.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use crate::sys;

/// How often zombies are looked for; a zombie is reaped once seen in two looks in a row.
const INTERVAL: Duration = Duration::from_secs(1);

fn protected() -> &'static Mutex<HashSet<i32>> {
    static P: OnceLock<Mutex<HashSet<i32>>> = OnceLock::new();
    P.get_or_init(|| Mutex::new(HashSet::new()))
}

static REAPED: AtomicU64 = AtomicU64::new(0);

/// Marks `pid`, a child this process waits for itself, as never to be reaped here.
pub fn protect(pid: i32) {
    protected()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(pid);
}

/// Undoes [`protect`] once the child has been waited for.
pub fn unprotect(pid: i32) {
    protected()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .remove(&pid);
}

/// Orphans reaped so far by this process.
pub fn reaped() -> u64 {
    REAPED.load(Ordering::Relaxed)
}

/// Starts the reaping thread (once per process; later calls do nothing).
pub fn start() -> std::io::Result<()> {
    static STARTED: Mutex<bool> = Mutex::new(false);
    let mut started = STARTED.lock().unwrap_or_else(|e| e.into_inner());
    if !*started {
        std::thread::Builder::new()
            .name("orphan-reaper".into())
            .spawn(|| {
                let mut seen = HashSet::new();
                loop {
                    std::thread::sleep(INTERVAL);
                    seen = reap_once(&seen);
                }
            })?;
        *started = true;
    }
    Ok(())
}

/// One look: reaps the unprotected zombies already in `seen`; returns those to reap next time.
fn reap_once(seen: &HashSet<i32>) -> HashSet<i32> {
    // Cheap first: is any child a zombie at all? (WNOWAIT leaves it in place.)
    match sys::peek_zombie_child() {
        Ok(None) | Err(_) => return HashSet::new(),
        Ok(Some(_)) => {}
    }
    let guard = protected().lock().unwrap_or_else(|e| e.into_inner());
    let candidates: Vec<i32> = zombie_children()
        .into_iter()
        .filter(|p| !guard.contains(p))
        .collect();
    drop(guard);
    let mut next = HashSet::new();
    for pid in candidates {
        if !seen.contains(&pid) {
            next.insert(pid);
            continue;
        }
        // Protected meanwhile? Then its owner waits for it.
        if protected()
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(&pid)
        {
            continue;
        }
        if let Ok(Some(_)) = sys::try_waitpid(pid) {
            REAPED.fetch_add(1, Ordering::Relaxed);
        }
    }
    next
}

/// This process's children that are zombies.
fn zombie_children() -> Vec<i32> {
    let mut out = Vec::new();
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return out;
    };
    for t in tasks.flatten() {
        let Ok(s) = std::fs::read_to_string(t.path().join("children")) else {
            continue;
        };
        for pid in s.split_whitespace().filter_map(|p| p.parse::<i32>().ok()) {
            if is_zombie(&std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default())
            {
                out.push(pid);
            }
        }
    }
    out
}

/// Whether a `/proc/PID/stat` line says the process is a zombie (the state follows the
/// command name, which is in parentheses and may itself contain them).
fn is_zombie(stat: &str) -> bool {
    stat.rfind(')')
        .and_then(|i| stat[i + 1..].split_whitespace().next())
        == Some("Z")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_state_is_read_after_the_last_parenthesis_of_the_name() {
        assert!(is_zombie("42 (git) Z 1 42 42 0"));
        assert!(is_zombie("42 (a) b) Z) Z 1 42"));
        assert!(!is_zombie("42 (x Z) S 1 42"));
        assert!(!is_zombie(""));
    }
}
