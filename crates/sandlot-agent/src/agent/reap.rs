//! Reaping and killing: as PID 1 every child, otherwise only what the agent
//! started (and orphans of its sessions), so that a host process's other children
//! are never touched.

use std::io;

use rustix::io::Errno;
use rustix::process::{Pid, Signal, WaitOptions};
use sandlot_proto::guest::ExitStatus;

use super::Agent;

/// A pid as rustix's type: `None` unless positive.
fn pid_of(raw: i32) -> Option<Pid> {
    if raw > 0 {
        Pid::from_raw(raw)
    } else {
        None
    }
}

/// Wait status of one child (`pid`, or any child for -1), decoded. `None`: nothing
/// (more) to reap.
fn wait_nohang(pid: i32) -> Option<(i32, ExitStatus)> {
    // rustix's `waitpid(None)` is waitpid(0), the caller's process group only; any
    // child is `wait`.
    let target = match pid {
        -1 => None,
        p => Some(pid_of(p)?),
    };
    loop {
        let reaped = match target {
            None => rustix::process::wait(WaitOptions::NOHANG),
            Some(p) => rustix::process::waitpid(Some(p), WaitOptions::NOHANG),
        };
        let (child, status) = match reaped {
            Ok(Some(reaped)) => reaped,
            Ok(None) => return None,
            Err(Errno::INTR) => continue,
            Err(_) => return None,
        };
        let es = if let Some(code) = status.exit_status() {
            ExitStatus {
                code: Some(code),
                ..ExitStatus::default()
            }
        } else if let Some(signal) = status.terminating_signal() {
            ExitStatus {
                signal: Some(signal),
                core_dumped: libc::WCOREDUMP(status.as_raw()),
                ..ExitStatus::default()
            }
        } else {
            continue;
        };
        return Some((child.as_raw_pid(), es));
    }
}

/// The pid of a child that has exited, left unreaped (`waitid(P_ALL, WEXITED |
/// WNOHANG | WNOWAIT)`); `None` when no child has. rustix's `waitid` does not
/// give the pid.
fn peek_exited_child() -> io::Result<Option<i32>> {
    // SAFETY: siginfo_t is plain data, valid when zeroed.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: waitid writes one siginfo_t through a pointer valid for the call.
    let r = unsafe {
        libc::waitid(
            libc::P_ALL,
            0,
            &mut info,
            libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: waitid filled in a SIGCHLD siginfo (or left it zeroed: pid 0).
    let pid = unsafe { info.si_pid() };
    Ok((pid != 0).then_some(pid))
}

/// SIGKILLs every process this one may signal but itself (`kill(-1, SIGKILL)`),
/// which rustix's `Pid` cannot name.
fn kill_all_others() {
    // SAFETY: kill(2) takes no memory; -1 is every process the caller may signal.
    unsafe { libc::kill(-1, libc::SIGKILL) };
}

/// Fields after the command name of /proc/PID/stat: (state, ppid, pgrp, session).
pub(super) fn proc_stat(pid: i32) -> Option<(char, i32, i32, i32)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &s[s.rfind(')')? + 2..];
    let mut f = rest.split(' ');
    let state = f.next()?.chars().next()?;
    let ppid = f.next()?.parse().ok()?;
    let pgrp = f.next()?.parse().ok()?;
    let session = f.next()?.parse().ok()?;
    Some((state, ppid, pgrp, session))
}

fn all_pids() -> Vec<i32> {
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    rd.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect()
}

/// SIGKILLs the process group `pgid` and every process in session `sid`
/// (descendants that made their own process group included).
pub(super) fn kill_tree(sid: i32) {
    if let Some(pgid) = pid_of(sid) {
        let _ = rustix::process::kill_process_group(pgid, Signal::KILL);
    }
    for pid in all_pids() {
        if let Some((_, _, _, s)) = proc_stat(pid) {
            if s == sid {
                if let Some(pid) = pid_of(pid) {
                    let _ = rustix::process::kill_process(pid, Signal::KILL);
                }
            }
        }
    }
}

/// Direct children of this process (all threads), from /proc.
fn my_children() -> Vec<i32> {
    let mut out = Vec::new();
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return out;
    };
    for t in tasks.flatten() {
        if let Ok(s) = std::fs::read_to_string(t.path().join("children")) {
            out.extend(s.split_whitespace().filter_map(|p| p.parse::<i32>().ok()));
        }
    }
    out
}

impl Agent {
    /// Reaps exited children (SIGCHLD).
    pub fn reap(&mut self) {
        if self.pid1 {
            while let Some((pid, st)) = wait_nohang(-1) {
                self.on_reaped(pid, st);
            }
            return;
        }
        let known: Vec<i32> = self.by_pid.keys().copied().collect();
        for pid in known {
            if let Some((pid, st)) = wait_nohang(pid) {
                self.on_reaped(pid, st);
            }
        }
        // Orphans re-parented to us (we are a subreaper): only zombies of sessions we
        // started, so that other children of a host process are never touched.
        // Peek at zombies without reaping them (WNOWAIT); the common case costs one
        // system call.
        loop {
            let pid = match peek_exited_child() {
                Ok(Some(pid)) => pid,
                Ok(None) => return,
                Err(e) if e.raw_os_error() == Some(libc::ECHILD) => return,
                // Look at the children one by one.
                Err(_) => break,
            };
            if self.by_pid.contains_key(&pid) {
                if let Some((pid, st)) = wait_nohang(pid) {
                    self.on_reaped(pid, st);
                }
                continue;
            }
            match proc_stat(pid) {
                Some((_, _, _, sid)) if self.sessions.contains(&sid) => {
                    let _ = wait_nohang(pid);
                }
                // Not ours (a host process's child): it hides the zombies behind
                // it from waitid, so scan.
                _ => break,
            }
        }
        for pid in my_children() {
            if self.by_pid.contains_key(&pid) {
                continue;
            }
            if let Some(('Z', _, _, sid)) = proc_stat(pid) {
                if self.sessions.contains(&sid) {
                    let _ = wait_nohang(pid);
                }
            }
        }
    }

    /// Kills every process (shutdown, lifeline lost) and reaps what it can.
    pub fn kill_everything(&mut self) {
        self.shutting_down = true;
        if self.pid1 {
            // From PID 1 this reaches every other process of the namespace.
            kill_all_others();
        }
        let sids: Vec<i32> = self
            .procs
            .values()
            .map(|p| p.pid)
            .chain(self.sessions.iter().copied())
            .collect();
        for sid in &sids {
            kill_tree(*sid);
        }
        // Reap: our children die promptly after SIGKILL (unless stuck in the kernel,
        // which the bounded wait tolerates).
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
        loop {
            self.reap();
            let alive = if self.pid1 {
                !my_children().is_empty()
            } else {
                !self.by_pid.is_empty()
                    || my_children().into_iter().any(|c| {
                        proc_stat(c).is_some_and(|(_, _, _, s)| self.sessions.contains(&s))
                    })
            };
            if !alive || std::time::Instant::now() >= deadline {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let ids: Vec<u64> = self.procs.keys().copied().collect();
        for id in ids {
            self.remove_proc(id);
        }
    }
}
