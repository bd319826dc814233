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
//! * v2: `memory.high` is the line, and `memory.events` (whose `high` counter
//!   rises while the use is past it) is polled for a change.
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
            notice: Notice::Events {
                events: d.join("memory.events"),
            },
        })
    } else {
        let d = cg.dir_of("memory")?;
        Some(WatchPlan {
            usage_file: d.join("memory.usage_in_bytes"),
            notice: Notice::Threshold {
                control: d.join("cgroup.event_control"),
            },
        })
    }
}

/// A sandbox's memory use against its line.
#[derive(Debug)]
pub struct MemoryWatch {
    line: u64,
    usage: File,
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
        let (notice, why_not) = match arm(&plan.notice, &usage, line) {
            Ok(a) => (Some(a), None),
            Err(e) => (None, Some(format!("{}: {e}", plan.notice.what()))),
        };
        Ok((
            MemoryWatch {
                line,
                usage,
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
    pub fn usage(&self) -> Option<u64> {
        let mut f = &self.usage;
        let mut s = String::new();
        f.rewind().ok()?;
        f.read_to_string(&mut s).ok()?;
        s.trim().parse().ok()
    }

    /// Whether the use is past the line now.
    pub fn over(&self) -> bool {
        self.usage().is_some_and(|u| u > self.line)
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
    use super::{watch_plan, Notice, WatchPlan};
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
}
