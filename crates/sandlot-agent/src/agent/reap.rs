//! Reaping and killing: as PID 1 every child, otherwise only what the agent
//! started (and orphans of its sessions), so that a host process's other children
//! are never touched.

use nix::errno::Errno;
use nix::unistd::Pid;
use sandlot_proto::guest::ExitStatus;

use super::Agent;

/// Raw wait status of one child, decoded. `None`: nothing (more) to reap.
fn wait_nohang(pid: i32) -> Option<(i32, ExitStatus)> {
    loop {
        let mut status: libc::c_int = 0;
        // SAFETY: waitpid writes one int through a pointer valid for the call.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if r > 0 {
            let es = if libc::WIFEXITED(status) {
                ExitStatus {
                    code: Some(libc::WEXITSTATUS(status)),
                    ..ExitStatus::default()
                }
            } else if libc::WIFSIGNALED(status) {
                ExitStatus {
                    signal: Some(libc::WTERMSIG(status)),
                    core_dumped: libc::WCOREDUMP(status),
                    ..ExitStatus::default()
                }
            } else {
                continue;
            };
            return Some((r, es));
        }
        if r == 0 {
            return None;
        }
        if Errno::last() == Errno::EINTR {
            continue;
        }
        return None;
    }
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
    let _ = nix::sys::signal::killpg(Pid::from_raw(sid), nix::sys::signal::Signal::SIGKILL);
    for pid in all_pids() {
        if let Some((_, _, _, s)) = proc_stat(pid) {
            if s == sid {
                let _ =
                    nix::sys::signal::kill(Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
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
        use nix::sys::wait::{waitid, Id, WaitPidFlag, WaitStatus};
        let flags = WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT;
        loop {
            let pid = match waitid(Id::All, flags) {
                Ok(WaitStatus::StillAlive) | Err(Errno::ECHILD) => return,
                Ok(st) => match st.pid() {
                    Some(p) => p.as_raw(),
                    None => return,
                },
                // A status nix cannot decode: look at the children one by one.
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
            let _ = nix::sys::signal::kill(Pid::from_raw(-1), nix::sys::signal::Signal::SIGKILL);
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
