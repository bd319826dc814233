//! Watching a sandbox's memory use against a line below its cgroup's hard limit:
//! a gVisor sandbox's declared limit, its cgroup holding headroom above it for
//! gVisor's own processes (see `gvisor::memory`). The watcher tells its owner when
//! the use is past the line; the owner has the sandbox's agent kill its largest
//! process. Nothing read here is written by the sandbox: only the kernel's
//! accounting of the cgroup.
//!
//! How a crossing is noticed, planned per cgroup version ([`WatchPlan`]):
//! * v1: a `memory.usage_in_bytes` threshold at the line, registered through
//!   `cgroup.event_control` with an eventfd the kernel signals on each crossing;
//! * v2: no file notifies a crossing of an arbitrary line; `memory.events`
//!   (whose `high` counter rises while the use is past `memory.high`, half way up
//!   the headroom, see `gvisor::memory`) is polled for a change, so a fast
//!   allocation is noticed at `memory.high` at the latest, a slow one by the
//!   watcher's bounded wait.
//!
//! The use compared with the line is the cgroup's use less its file-backed page
//! cache ([`reclaimable_file`]): the kernel reclaims that cache itself (gVisor's
//! gofer reading the sandbox's files fills it), and killing a process for it
//! would kill for memory nobody is short of. gVisor's own memory (a memfd,
//! `shmem`) is not on the file lists, so all of it counts.
//!
//! Either way the wait is bounded ([`MemoryWatch::wait`]), so a notification
//! that cannot be armed (or is missed) leaves a poll of the usage file.

use std::fs::File;
use std::io::{self, Read, Seek};
use std::os::fd::{AsFd, AsRawFd};
use std::path::PathBuf;
use std::time::Duration;

use crate::cgroup::Cgroup;
use crate::sys;

/// How the watcher learns of a crossing, and where it reads the use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchPlan {
    /// The cgroup's current memory use.
    pub usage_file: PathBuf,
    /// Its `memory.stat` (the page cache to leave out, [`reclaimable_file`]).
    pub stat_file: PathBuf,
    /// The keys of `memory.stat` that count the file-backed page cache.
    pub file_keys: [&'static str; 2],
    pub notice: Notice,
}

/// What wakes the watcher early (else its bounded poll).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Notice {
    /// v1: write `<eventfd> <usage fd> <line>` into this `cgroup.event_control`.
    Threshold { control: PathBuf },
    /// v2: a change of this `memory.events` (`POLLPRI`).
    Events { events: PathBuf },
}

/// The plan for `cg` (no I/O); `None` without a memory controller.
pub fn watch_plan(cg: &Cgroup) -> Option<WatchPlan> {
    if cg.version == 2 {
        let d = cg.dir_of("")?;
        Some(WatchPlan {
            usage_file: d.join("memory.current"),
            stat_file: d.join("memory.stat"),
            file_keys: ["active_file", "inactive_file"],
            notice: Notice::Events {
                events: d.join("memory.events"),
            },
        })
    } else {
        let d = cg.dir_of("memory")?;
        Some(WatchPlan {
            usage_file: d.join("memory.usage_in_bytes"),
            stat_file: d.join("memory.stat"),
            // Hierarchical: runsc may make cgroups below the sandbox's.
            file_keys: ["total_active_file", "total_inactive_file"],
            notice: Notice::Threshold {
                control: d.join("cgroup.event_control"),
            },
        })
    }
}

/// A cgroup's memory use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryReading {
    /// All of it (what the kernel's threshold and `memory.high` see).
    pub total: u64,
    /// Less the file-backed page cache: what is compared with the line.
    pub counted: u64,
}

/// A sandbox's memory use against its line.
#[derive(Debug)]
pub struct MemoryWatch {
    line: u64,
    usage: File,
    stat: File,
    file_keys: [&'static str; 2],
    /// The eventfd (v1) or `memory.events` (v2); `None`: poll only.
    notice: Option<Armed>,
}

#[derive(Debug)]
enum Armed {
    /// The eventfd, as a file to read its counter.
    EventFd(File),
    Events(File),
}

impl MemoryWatch {
    /// Opens the watch of `cg`'s use against `line` bytes. The second value says
    /// why no notification is armed (the watch polls), when none is.
    pub fn open(cg: &Cgroup, line: u64) -> io::Result<(MemoryWatch, Option<String>)> {
        let plan = watch_plan(cg)
            .ok_or_else(|| io::Error::other("the sandbox's cgroup has no memory controller"))?;
        let usage = File::open(&plan.usage_file)?;
        let stat = File::open(&plan.stat_file)?;
        let (notice, why_not) = match arm(&plan.notice, &usage, line) {
            Ok(a) => (Some(a), None),
            Err(e) => (None, Some(format!("{}: {e}", plan.notice.what()))),
        };
        Ok((
            MemoryWatch {
                line,
                usage,
                stat,
                file_keys: plan.file_keys,
                notice,
            },
            why_not,
        ))
    }

    /// Whether the kernel notifies a crossing (else the watch only polls).
    pub fn notified(&self) -> bool {
        self.notice.is_some()
    }

    /// The line, in bytes.
    pub fn line(&self) -> u64 {
        self.line
    }

    /// The cgroup's memory use now (`None` once the cgroup is gone).
    pub fn reading(&self) -> Option<MemoryReading> {
        let read = |mut f: &File| -> Option<String> {
            let mut s = String::new();
            f.rewind().ok()?;
            f.read_to_string(&mut s).ok()?;
            Some(s)
        };
        let total: u64 = read(&self.usage)?.trim().parse().ok()?;
        let cache = reclaimable_file(&read(&self.stat)?, self.file_keys);
        Some(MemoryReading {
            total,
            counted: total.saturating_sub(cache),
        })
    }

    /// Whether the counted use ([`MemoryReading::counted`]) is past the line now.
    pub fn over(&self) -> bool {
        self.reading().is_some_and(|r| r.counted > self.line)
    }

    /// Waits for a notification, at most `bound`.
    pub fn wait(&self, bound: Duration) {
        let ms = bound.as_millis().min(i32::MAX as u128) as i32;
        match &self.notice {
            Some(Armed::EventFd(efd)) => {
                if sys::poll_one(efd.as_fd(), libc::POLLIN, ms).unwrap_or(0) != 0 {
                    // Reset the counter (non-blocking: nothing to read is fine).
                    let mut n = [0u8; 8];
                    let _ = (&*efd).read(&mut n);
                }
            }
            Some(Armed::Events(f)) => {
                if sys::poll_one(f.as_fd(), libc::POLLPRI, ms).unwrap_or(0) != 0 {
                    // Reading the file again re-arms its notification.
                    let mut g = f;
                    let mut s = String::new();
                    let _ = g.rewind().and_then(|()| g.read_to_string(&mut s));
                }
            }
            None => std::thread::sleep(bound),
        }
    }
}

/// The file-backed page cache a `memory.stat` text counts under `keys` (its
/// active and inactive file lists), in bytes.
pub fn reclaimable_file(stat: &str, keys: [&str; 2]) -> u64 {
    stat.lines()
        .filter_map(|l| l.split_once(' '))
        .filter(|(k, _)| keys.contains(k))
        .filter_map(|(_, v)| v.trim().parse::<u64>().ok())
        .fold(0u64, u64::saturating_add)
}

impl Notice {
    fn what(&self) -> &'static str {
        match self {
            Notice::Threshold { .. } => "a memory usage threshold (cgroup.event_control)",
            Notice::Events { .. } => "a poll of memory.events",
        }
    }
}

fn arm(n: &Notice, usage: &File, line: u64) -> io::Result<Armed> {
    match n {
        Notice::Threshold { control } => {
            let efd = sys::eventfd()?;
            std::fs::write(
                control,
                format!("{} {} {line}", efd.as_raw_fd(), usage.as_raw_fd()),
            )?;
            Ok(Armed::EventFd(File::from(efd)))
        }
        Notice::Events { events } => {
            let mut f = File::open(events)?;
            let mut s = String::new();
            f.read_to_string(&mut s)?;
            Ok(Armed::Events(f))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{reclaimable_file, watch_plan, Notice, WatchPlan};
    use crate::cgroup::{Cgroup, CgroupLayout};
    use std::path::PathBuf;

    #[test]
    fn v2_watches_memory_current_and_polls_memory_events() {
        let l = CgroupLayout::V2 {
            root: "/sys/fs/cgroup".into(),
        };
        let cg = Cgroup::plan(&l, "sandlot", "sb");
        assert_eq!(
            watch_plan(&cg),
            Some(WatchPlan {
                usage_file: PathBuf::from("/sys/fs/cgroup/sandlot/sb/memory.current"),
                stat_file: PathBuf::from("/sys/fs/cgroup/sandlot/sb/memory.stat"),
                file_keys: ["active_file", "inactive_file"],
                notice: Notice::Events {
                    events: PathBuf::from("/sys/fs/cgroup/sandlot/sb/memory.events"),
                },
            })
        );
    }

    #[test]
    fn v1_sets_a_usage_threshold_in_the_memory_hierarchy() {
        let l = CgroupLayout::V1 {
            controllers: vec![
                ("pids".into(), "/sys/fs/cgroup/pids".into()),
                ("memory".into(), "/sys/fs/cgroup/memory".into()),
            ],
        };
        let cg = Cgroup::plan(&l, "sandlot", "sb");
        assert_eq!(
            watch_plan(&cg),
            Some(WatchPlan {
                usage_file: PathBuf::from("/sys/fs/cgroup/memory/sandlot/sb/memory.usage_in_bytes"),
                stat_file: PathBuf::from("/sys/fs/cgroup/memory/sandlot/sb/memory.stat"),
                file_keys: ["total_active_file", "total_inactive_file"],
                notice: Notice::Threshold {
                    control: PathBuf::from("/sys/fs/cgroup/memory/sandlot/sb/cgroup.event_control"),
                },
            })
        );
        // Without a memory hierarchy there is nothing to watch.
        let none = Cgroup::plan(
            &CgroupLayout::V1 {
                controllers: vec![("pids".into(), "/p".into())],
            },
            "sandlot",
            "sb",
        );
        assert_eq!(watch_plan(&none), None);
    }

    #[test]
    fn the_page_cache_on_the_file_lists_is_left_out_and_shmem_counts() {
        // v1: the sandbox's own and hierarchical keys; only the latter count.
        let v1 = "cache 900\nshmem 500\nactive_file 1\ninactive_file 2\n\
                  total_shmem 500\ntotal_active_file 100\ntotal_inactive_file 300\n";
        assert_eq!(
            reclaimable_file(v1, ["total_active_file", "total_inactive_file"]),
            400
        );
        // v2: `file` includes shmem (gVisor's memory), the lists do not.
        let v2 = "anon 10\nfile 900\nshmem 500\nactive_file 150\ninactive_file 250\n";
        assert_eq!(reclaimable_file(v2, ["active_file", "inactive_file"]), 400);
        assert_eq!(reclaimable_file("", ["active_file", "inactive_file"]), 0);
    }
}
