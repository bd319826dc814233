//! The sandbox's OOM killer where its kernel has none (gVisor): on the host
//! watcher's word that the sandbox's memory passed its declared limit, the agent
//! SIGKILLs the process with the largest resident set, as the Linux OOM killer
//! would. The choice is made here, inside the sandbox, from the agent's own view of
//! `/proc`; the host reads nothing the sandbox writes to choose.

use std::fs;

use sandlot_proto::guest::MemoryVictim;

/// The process to kill among `procs` (pid, resident bytes): the largest, never
/// `own` (the agent) nor PID 1 (the sandbox's init, the agent itself on gVisor);
/// the lowest pid among equals. `None` when nothing else holds memory.
pub(crate) fn choose_victim(procs: &[(i32, u64)], own: i32) -> Option<MemoryVictim> {
    procs
        .iter()
        .filter(|&&(pid, rss)| pid != own && pid > 1 && rss > 0)
        .max_by(|a, b| a.1.cmp(&b.1).then(b.0.cmp(&a.0)))
        .map(|&(pid, rss_bytes)| MemoryVictim { pid, rss_bytes })
}

/// Every process of the agent's `/proc` with its resident bytes (`statm`'s second
/// field, in pages). Processes that end meanwhile are left out.
fn resident_sets() -> Vec<(i32, u64)> {
    let page = rustix::param::page_size() as u64;
    let Ok(dir) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| {
            let pid: i32 = e.file_name().to_str()?.parse().ok()?;
            let statm = fs::read_to_string(e.path().join("statm")).ok()?;
            let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
            Some((pid, pages.saturating_mul(page)))
        })
        .collect()
}

/// Kills the largest process (see [`choose_victim`]); the one killed.
pub(crate) fn relieve() -> Option<MemoryVictim> {
    let own = std::process::id() as i32;
    // A process may end between the choice and the kill (ESRCH): choose again,
    // a few times at most.
    for _ in 0..4 {
        let v = choose_victim(&resident_sets(), own)?;
        // `v.pid` is neither the agent nor PID 1 (so above 1).
        let pid = rustix::process::Pid::from_raw(v.pid)?;
        if rustix::process::kill_process(pid, rustix::process::Signal::KILL).is_ok() {
            return Some(v);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::choose_victim;

    #[test]
    fn the_largest_process_is_chosen_never_the_agent_nor_pid_1() {
        let procs = [(1, 900), (7, 800), (12, 300), (40, 500)];
        assert_eq!(choose_victim(&procs, 7).map(|v| v.pid), Some(40));
        assert_eq!(
            choose_victim(&procs, 3).map(|v| (v.pid, v.rss_bytes)),
            Some((7, 800))
        );
        // Only the agent and init: nothing to kill.
        assert_eq!(choose_victim(&[(1, 900), (7, 800)], 7), None);
        // A process without resident memory (a zombie) is never chosen.
        assert_eq!(choose_victim(&[(1, 5), (9, 0)], 1), None);
        // Equals: the lowest pid, the same choice on every call.
        assert_eq!(
            choose_victim(&[(30, 10), (20, 10)], 1).map(|v| v.pid),
            Some(20)
        );
    }
}
