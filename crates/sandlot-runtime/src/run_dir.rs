//! The file system under the runtime directory's `sandboxes/`.
//!
//! Every create and delete makes and removes a directory, an `alive` lock file and
//! the agent's socket under `run_dir/sandboxes`. On a tmpfs (what `/run` is on
//! systemd hosts) that costs microseconds; on a disk file system it is journalled
//! metadata work: about 0.8 ms per sandbox on an ext4 `/run` mounted with `discard`,
//! measured on the build machine. `/run` is also meant to be emptied at boot, which a
//! disk does not do.
//!
//! When asked (`RuntimeConfig::run_dir_tmpfs`), the backend mounts a small tmpfs of its
//! own on `run_dir/sandboxes` if that directory is on a disk file system and no
//! sandbox lives in it. The mount stays after the process exits, like `/run` itself
//! (or `/run/netns` after `ip netns add`): a daemon restarted later and a `sandlot
//! run` beside it find the sandboxes' sockets there. The uid-range slot locks stay on
//! the disk (`run_dir/slots`): they are opened, never created, after first use, so
//! they cost nothing there, and no mount can ever hide a held one.
//!
//! Races: the decision and the mount happen under an exclusive `flock` of `run_dir`
//! itself (which is never mounted over); a backend that left `sandboxes/` on the disk
//! holds a shared lock on it while it publishes a new sandbox directory, so a mount
//! never hides a directory being published. Dead sandboxes' leftovers are swept first
//! (their cgroups would otherwise be orphaned under the mount).

use std::fs;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use crate::sys;

/// Source name of the tmpfs in `/proc/mounts`.
pub const TMPFS_SOURCE: &str = "sandlot-run";
/// Mount options of the tmpfs: its files are empty (locks, sockets), so a few
/// megabytes of directory entries are room for tens of thousands of sandboxes.
const TMPFS_OPTIONS: &str = "mode=0755,size=16m";

const TMPFS_MAGIC: i64 = 0x0102_1994;
const RAMFS_MAGIC: i64 = 0x8584_58f6;

/// Where `run_dir/sandboxes` lives, as settled when the backend started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunDirFs {
    /// Already on a memory file system (tmpfs or ramfs).
    Memory,
    /// This process mounted a tmpfs on it.
    Mounted,
    /// Left on a disk file system, for the reason given.
    Disk(String),
}

/// Why a disk was kept when mounting was not asked for.
pub(crate) const NOT_WANTED: &str = "mounting a tmpfs there is turned off";

/// What was found about `run_dir/sandboxes`, under the lock.
#[derive(Debug, Clone, Default)]
pub(crate) struct SandboxesDirFacts {
    /// It is on tmpfs or ramfs.
    pub memory: bool,
    /// It is the root of a mount (an operator's choice of file system).
    pub mount_root: bool,
    /// Entries left after sweeping the dead: live sandboxes, or directories being
    /// published by a process that does not take the lock.
    pub live: Vec<String>,
}

/// What to do about `run_dir/sandboxes`.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Decision {
    Keep(RunDirFs),
    Mount,
}

/// Decides from `facts` whether to mount a tmpfs on `run_dir/sandboxes`.
pub(crate) fn decide(facts: &SandboxesDirFacts, wanted: bool) -> Decision {
    use Decision::Keep;
    if facts.memory {
        return Keep(RunDirFs::Memory);
    }
    if !wanted {
        return Keep(RunDirFs::Disk(NOT_WANTED.into()));
    }
    if facts.mount_root {
        return Keep(RunDirFs::Disk(
            "it is the root of another file system mount, which is left alone".into(),
        ));
    }
    if !facts.live.is_empty() {
        let mut names: Vec<&str> = facts.live.iter().map(String::as_str).take(3).collect();
        if facts.live.len() > 3 {
            names.push("...");
        }
        return Keep(RunDirFs::Disk(format!(
            "{} live sandbox(es) keep their directories there ({}); a tmpfs is mounted once none is left",
            facts.live.len(),
            names.join(", ")
        )));
    }
    Decision::Mount
}

/// `true` if `p` is on tmpfs or ramfs.
pub fn is_memory_fs(p: &Path) -> io::Result<bool> {
    let t = sys::statfs_type(&sys::cstr(p)?)?;
    Ok(t == TMPFS_MAGIC || t == RAMFS_MAGIC)
}

/// `true` if `p` is the root of a mount (its device differs from its parent's).
fn is_mount_root(p: &Path) -> io::Result<bool> {
    let own = fs::metadata(p)?.dev();
    let parent = fs::metadata(p.join(".."))?.dev();
    Ok(own != parent)
}

/// Facts about `sandboxes` (sweep the dead before calling).
pub(crate) fn facts(sandboxes: &Path) -> io::Result<SandboxesDirFacts> {
    let memory = is_memory_fs(sandboxes)?;
    Ok(SandboxesDirFacts {
        memory,
        mount_root: !memory && is_mount_root(sandboxes)?,
        live: fs::read_dir(sandboxes)?
            .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
            .collect::<io::Result<_>>()?,
    })
}

/// Mounts this module's tmpfs on `sandboxes` (private: nothing propagates in or out).
pub(crate) fn mount_tmpfs(sandboxes: &Path) -> io::Result<()> {
    let target = sys::cstr(sandboxes)?;
    let source = std::ffi::CString::new(TMPFS_SOURCE).expect("no NUL");
    let options = std::ffi::CString::new(TMPFS_OPTIONS).expect("no NUL");
    sys::mount(
        Some(&source),
        &target,
        Some(c"tmpfs"),
        libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
        Some(&options),
    )?;
    if let Err(e) = sys::mount(None, &target, None, libc::MS_PRIVATE, None) {
        let _ = sys::umount2(&target, libc::MNT_DETACH);
        return Err(e);
    }
    Ok(())
}

/// An `flock` of the runtime directory, released on drop.
pub(crate) struct RunDirLock(OwnedFd);

impl RunDirLock {
    /// Blocks until the lock is held: `exclusive` to decide and mount, shared to
    /// publish a sandbox directory on the disk.
    pub fn take(run_dir: &Path, exclusive: bool) -> io::Result<RunDirLock> {
        let fd = OwnedFd::from(fs::File::open(run_dir)?);
        let op = if exclusive {
            libc::LOCK_EX
        } else {
            libc::LOCK_SH
        };
        sys::flock(fd.as_fd(), op)?;
        Ok(RunDirLock(fd))
    }
}

impl Drop for RunDirLock {
    fn drop(&mut self) {
        let _ = sys::flock(self.0.as_fd(), libc::LOCK_UN);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(memory: bool, mount_root: bool, live: &[&str]) -> SandboxesDirFacts {
        SandboxesDirFacts {
            memory,
            mount_root,
            live: live.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn a_memory_file_system_is_kept_even_when_mounting_is_off() {
        let memory = Decision::Keep(RunDirFs::Memory);
        assert_eq!(decide(&facts(true, true, &["a"]), false), memory);
        assert_eq!(decide(&facts(true, false, &[]), true), memory);
    }

    #[test]
    fn an_empty_disk_directory_gets_a_tmpfs_when_wanted() {
        assert_eq!(decide(&facts(false, false, &[]), true), Decision::Mount);
        match decide(&facts(false, false, &[]), false) {
            Decision::Keep(RunDirFs::Disk(why)) => assert!(why.contains("turned off"), "{why}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn live_sandboxes_or_an_operator_mount_keep_the_disk() {
        match decide(&facts(false, false, &["a", "b", "c", "d"]), true) {
            Decision::Keep(RunDirFs::Disk(why)) => {
                assert!(why.starts_with("4 live sandbox(es)"), "{why}");
                assert!(why.contains("(a, b, c, ...)"), "{why}");
            }
            other => panic!("{other:?}"),
        }
        match decide(&facts(false, true, &[]), true) {
            Decision::Keep(RunDirFs::Disk(why)) => {
                assert!(why.contains("another file system"), "{why}")
            }
            other => panic!("{other:?}"),
        }
    }
}
