//! A small stock of empty cgroups made ahead of time (cgroup v1 only).
//!
//! Creating a sandbox's cgroup means a `mkdir` in each of five v1 hierarchies, and
//! the kernel allocates every controller's state for each (memory is the dearest):
//! about 0.9 ms of CPU per create on the development machine, most of the cgroup
//! work on the create path. A background thread keeps a few fresh, never-used
//! cgroups named `.stock-<pid>-<n>` under the sandboxes' parent; a create renames
//! one to the sandbox's id (v1 allows a rename within the parent) and writes its
//! limits. A cgroup is never reused: a stocked one has held no process, so no
//! accounting carries over. cgroup v2 cannot rename cgroups, so it has no stock.
//!
//! Stocked cgroups are removed when the stock is dropped; those of a process that
//! died (a daemon killed with `kill -9`) are removed by [`sweep_dead`], which every
//! runtime runs as it starts. An owner is the pid and start time in the name, so a
//! reused pid does not keep a dead owner's stock, and an owner that is a zombie or
//! still in `exit(2)` (a daemon restarted the instant it was killed) counts as gone:
//! it runs no more code that could take or add a stocked cgroup.

use std::fs;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::cgroup::{Cgroup, CgroupError, CgroupLayout, CgroupLimits, CgroupParent};
use crate::stock::Stock;

const PREFIX: &str = ".stock-";

/// The stock and its refill thread.
pub struct CgroupStock {
    stock: Stock<String>,
    layout: CgroupLayout,
    parent: String,
}

/// Who made a stocked cgroup: a pid and that process's start time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Owner {
    pid: i32,
    /// Clock ticks after boot (`/proc/PID/stat` field 22); `None` in the names of
    /// earlier versions (`.stock-<pid>-<n>`).
    start: Option<u64>,
}

impl Owner {
    fn me() -> Owner {
        Owner {
            pid: std::process::id() as i32,
            start: crate::sys::ProcStat::read(None)
                .and_then(|s| s.start_time())
                .ok(),
        }
    }

    /// Whether the owner still runs: its pid exists, is not a zombie or exiting,
    /// and (when the name has it) started when the owner did.
    fn alive(&self) -> bool {
        let Ok(st) = crate::sys::ProcStat::read(Some(self.pid)) else {
            return false;
        };
        !st.exiting() && self.start.is_none_or(|t| st.start_time().ok() == Some(t))
    }
}

/// `.stock-<pid>-<start>-<n>`: the owner, so that a later process tells debris from
/// a live stock.
fn stock_name(owner: &Owner, seq: u64) -> String {
    match owner.start {
        Some(t) => format!("{PREFIX}{}-{t}-{seq}", owner.pid),
        None => format!("{PREFIX}{}-{seq}", owner.pid),
    }
}

/// The owner of a stock name, if `name` is one.
fn owner_of(name: &str) -> Option<Owner> {
    let parts: Vec<&str> = name.strip_prefix(PREFIX)?.split('-').collect();
    let num = |s: &str| s.parse::<u64>().ok();
    match parts[..] {
        [pid, seq] => {
            num(seq)?;
            Some(Owner {
                pid: pid.parse().ok()?,
                start: None,
            })
        }
        [pid, start, seq] => {
            num(seq)?;
            Some(Owner {
                pid: pid.parse().ok()?,
                start: Some(num(start)?),
            })
        }
        _ => None,
    }
}

impl CgroupStock {
    /// Starts a stock of `want` cgroups under `parent`, or `None` where it cannot
    /// help (cgroup v2, or `want` 0).
    pub fn start(layout: &CgroupLayout, parent: &CgroupParent, want: usize) -> Option<CgroupStock> {
        if layout.version() != 1 {
            return None;
        }
        let (l, p) = (layout.clone(), parent.clone());
        let seq = AtomicU64::new(0);
        let me = Owner::me();
        let stock = Stock::start("cgroup-stock", want, move || {
            let name = stock_name(&me, seq.fetch_add(1, Ordering::Relaxed));
            Cgroup::make_dirs(&l, &p, &name).ok().map(|_| name)
        })?;
        Some(CgroupStock {
            stock,
            layout: layout.clone(),
            parent: parent.name.clone(),
        })
    }

    /// The sandbox `id`'s cgroup with `limits` written: a stocked one renamed, or
    /// `None` if the stock is empty or the rename failed (the caller creates one).
    pub fn take(&self, id: &str, limits: &CgroupLimits) -> Option<Result<Cgroup, CgroupError>> {
        let name = self.stock.take()?;
        let from = Cgroup::plan(&self.layout, &self.parent, &name);
        let to = Cgroup::plan(&self.layout, &self.parent, id);
        let mut renamed = 0;
        for ((_, a), (_, b)) in from.dirs.iter().zip(&to.dirs) {
            if fs::rename(a, b).is_err() {
                break;
            }
            renamed += 1;
        }
        if renamed < from.dirs.len() {
            // Give back what moved and drop the rest: a fresh mkdir follows.
            for ((_, a), (_, b)) in from.dirs.iter().zip(&to.dirs).take(renamed) {
                let _ = fs::rename(b, a);
            }
            let _ = from.remove(Duration::from_millis(100));
            return None;
        }
        Some(to.write_limits(&self.layout, limits).map(|()| to))
    }

    /// Stocked cgroups ready now.
    pub fn ready(&self) -> usize {
        self.stock.ready()
    }
}

impl Drop for CgroupStock {
    fn drop(&mut self) {
        let mut last = None;
        for name in self.stock.stop() {
            let cg = Cgroup::plan(&self.layout, &self.parent, &name);
            let _ = cg.remove(Duration::from_millis(500));
            last = Some(cg);
        }
        // The stock kept the parent busy after the last sandbox went (terminate's
        // `remove_parent_if_empty` found it so): remove it now unless sandboxes
        // still use it.
        if let Some(cg) = last {
            cg.remove_parent_if_empty();
        }
    }
}

/// Removes stocked cgroups under `parent` whose owner process is gone or going
/// (see the module comment). Returns the paths removed.
pub fn sweep_dead(layout: &CgroupLayout, parent: &str) -> Vec<PathBuf> {
    let mut removed = Vec::new();
    for dir in parent_dirs(layout, parent) {
        let Ok(rd) = fs::read_dir(&dir) else { continue };
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let Some(owner) = owner_of(&name) else {
                continue;
            };
            if owner.alive() {
                continue;
            }
            if fs::remove_dir(e.path()).is_ok() {
                removed.push(e.path());
            }
        }
    }
    removed
}

fn parent_dirs(layout: &CgroupLayout, parent: &str) -> Vec<PathBuf> {
    Cgroup::plan(layout, parent, "")
        .dirs
        .into_iter()
        .map(|(_, d)| d)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stock_names_carry_their_owner() {
        let me = Owner::me();
        assert!(me.start.is_some());
        let n = stock_name(&me, 7);
        assert_eq!(owner_of(&n), Some(me));
        assert!(n.ends_with("-7"));
        assert_eq!(
            owner_of(".stock-12-3"),
            Some(Owner {
                pid: 12,
                start: None
            })
        );
        assert_eq!(owner_of("sb-0123"), None);
        assert_eq!(owner_of(".stock-x-1"), None);
        assert_eq!(owner_of(".stock-1-2-x"), None);
        assert_eq!(owner_of(".stock-1-2-3-4"), None);
    }

    #[test]
    fn an_owner_is_alive_only_as_the_process_that_made_it() {
        let me = Owner::me();
        assert!(me.alive());
        // The same pid, started at another time: a reused pid.
        let reused = Owner {
            start: me.start.map(|t| t + 1),
            ..me
        };
        assert!(!reused.alive());
        // A zombie (killed, not yet reaped) is gone.
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        let start = crate::sys::ProcStat::read(Some(pid))
            .unwrap()
            .start_time()
            .ok();
        let owner = Owner { pid, start };
        assert!(owner.alive());
        child.kill().unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while owner.alive() {
            assert!(
                std::time::Instant::now() < deadline,
                "still alive after SIGKILL"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(
            std::path::Path::new(&format!("/proc/{pid}")).exists(),
            "a zombie until reaped"
        );
        child.wait().unwrap();
        assert!(!owner.alive());
    }

    #[test]
    fn no_stock_on_cgroup_v2_or_when_not_wanted() {
        let v2 = CgroupLayout::V2 {
            root: PathBuf::from("/nonexistent"),
        };
        assert!(CgroupStock::start(&v2, &CgroupParent::named("p"), 4).is_none());
        let v1 = CgroupLayout::V1 {
            controllers: vec![("memory".into(), PathBuf::from("/nonexistent"))],
        };
        assert!(CgroupStock::start(&v1, &CgroupParent::named("p"), 0).is_none());
    }
}
