//! The agent's own `/proc` entries are not the files API's to serve.
//!
//! The files API runs in the agent, and a process may read everything of its own in
//! `/proc/<pid>`: `maps` and `exe` name the host path of the binary the agent runs
//! from, `fd/*` lead to the host files it holds open (its locks), `environ` is its
//! start-up environment. Sandbox processes cannot read them (the agent is
//! non-dumpable), so without this the files API would be a way around that.
//!
//! Every object the files API hands out or lists is opened first and checked by its
//! descriptor (not by the path asked for, which symlinks, `/proc/self`, a thread's
//! `/proc/<tid>` or a race could redirect): an object on procfs whose path starts
//! with one of the agent's pids or thread ids is refused. Paths are resolved without
//! magic links (`/proc/<pid>/fd/*`, `exe`, `cwd`, `root`), which would otherwise lead
//! from procfs to files outside it, so a check of the object found is complete.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

use rustix::fs::{Mode, OFlags, ResolveFlags, CWD};

/// `Err(PermissionDenied)` when `fd` is the agent's own `/proc/<pid>` directory or
/// something beneath it (through any of its thread ids).
pub(crate) fn refuse_own(fd: BorrowedFd<'_>) -> io::Result<()> {
    let fs = rustix::fs::fstatfs(fd)?;
    if fs.f_type != rustix::fs::PROC_SUPER_MAGIC {
        return Ok(());
    }
    let at = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))?;
    match pid_of(&at) {
        Some(pid) if is_own(pid) => Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            "the sandbox agent's own /proc entries are not served",
        )),
        _ => Ok(()),
    }
}

/// The pid or tid a procfs path is under (`/proc/42/maps` → 42).
fn pid_of(p: &Path) -> Option<u32> {
    let mut c = p.components();
    if c.next() != Some(Component::RootDir) || c.next() != Some(Component::Normal("proc".as_ref()))
    {
        return None;
    }
    match c.next()? {
        Component::Normal(n) => n.to_str()?.parse().ok(),
        _ => None,
    }
}

/// Whether `pid` is the agent's process or one of its threads.
fn is_own(pid: u32) -> bool {
    pid == std::process::id() || Path::new("/proc/self/task").join(pid.to_string()).exists()
}

/// Opens `path` with `flags` (and `O_NOFOLLOW` unless `follow`), without following
/// magic links, and refuses the agent's own `/proc` entries.
pub(crate) fn open(path: &Path, flags: OFlags, follow: bool) -> io::Result<OwnedFd> {
    let mut flags = flags | OFlags::CLOEXEC;
    if !follow {
        flags |= OFlags::NOFOLLOW;
    }
    let fd = match rustix::fs::openat2(CWD, path, flags, Mode::empty(), ResolveFlags::NO_MAGICLINKS)
    {
        // A kernel without openat2 (gVisor's before 2023): see `open_plain`.
        Err(rustix::io::Errno::NOSYS) => open_plain(path, flags)?,
        r => r?,
    };
    refuse_own(fd.as_fd())?;
    Ok(fd)
}

/// [`open`] where the kernel has no openat2, so magic links cannot be refused
/// while the path is resolved: the object found is refused instead when it is one
/// that only a magic link leads to (a pipe, socket or anonymous inode, which has
/// no path of its own). A file or directory a magic link leads to has a path the
/// caller could name, and reaching it through another process's `/proc` entries
/// takes the same permission over that process as in the kernel itself.
fn open_plain(path: &Path, flags: OFlags) -> io::Result<OwnedFd> {
    let fd = rustix::fs::open(path, flags, Mode::empty())?;
    let at = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))?;
    if !at.is_absolute() {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            "pipes, sockets and other objects without a path are not served",
        ));
    }
    Ok(fd)
}

/// A directory opened (and checked) once, whose entries are then reached through
/// the descriptor, so that nothing swapped in along its path later changes which
/// directory they are in.
pub(crate) struct PinnedDir {
    fd: OwnedFd,
}

impl PinnedDir {
    /// Opens the directory at `path` (following a final symlink only if `follow`).
    pub fn open(path: &Path, follow: bool) -> io::Result<PinnedDir> {
        Ok(PinnedDir {
            fd: open(path, OFlags::PATH | OFlags::DIRECTORY, follow)?,
        })
    }

    /// The parent directory of `path` and the last component of `path` (for `/`,
    /// `/` itself and `.`).
    pub fn parent_of(path: &Path) -> io::Result<(PinnedDir, std::ffi::OsString)> {
        let Some(name) = path.file_name() else {
            return Ok((PinnedDir::open(path, true)?, ".".into()));
        };
        let parent = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("/"),
        };
        Ok((PinnedDir::open(parent, true)?, name.to_owned()))
    }

    /// Subdirectory `name` of this one (not through a symlink).
    pub fn child(&self, name: &std::ffi::OsStr) -> io::Result<PinnedDir> {
        let fd = rustix::fs::openat(
            self.fd.as_fd(),
            name,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        refuse_own(fd.as_fd())?;
        Ok(PinnedDir { fd })
    }

    /// Regular file `name` of this directory, for reading (not through a symlink).
    pub fn open_file(&self, name: &std::ffi::OsStr) -> io::Result<OwnedFd> {
        let fd = rustix::fs::openat(
            self.fd.as_fd(),
            name,
            OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        refuse_own(fd.as_fd())?;
        Ok(fd)
    }

    /// A path that reaches this very directory (through the agent's own descriptor).
    pub fn path(&self) -> PathBuf {
        PathBuf::from(format!("/proc/self/fd/{}", self.fd.as_raw_fd()))
    }

    /// A path that reaches entry `name` of this very directory.
    pub fn entry(&self, name: &std::ffi::OsStr) -> PathBuf {
        self.path().join(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn procfs_paths_name_their_pid() {
        assert_eq!(pid_of(Path::new("/proc/42/maps")), Some(42));
        assert_eq!(pid_of(Path::new("/proc/1/task/7/fd")), Some(1));
        assert_eq!(pid_of(Path::new("/proc/1")), Some(1));
        assert_eq!(pid_of(Path::new("/proc/meminfo")), None);
        assert_eq!(pid_of(Path::new("/proc/sys/kernel/hostname")), None);
        assert_eq!(pid_of(Path::new("/tmp/1/maps")), None);
    }

    #[test]
    fn own_proc_entries_are_refused_by_every_route() {
        let me = std::process::id();
        let tid = rustix::thread::gettid().as_raw_pid();
        for p in [
            format!("/proc/{me}/maps"),
            "/proc/self/maps".to_string(),
            "/proc/thread-self/status".to_string(),
            format!("/proc/{tid}/environ"),
            format!("/proc/{me}/task/{tid}/maps"),
        ] {
            let e = open(Path::new(&p), OFlags::RDONLY, true).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{p}");
        }
        // A symlink elsewhere that leads there is checked where it leads.
        let dir = std::env::temp_dir().join(format!("own-proc-{me}-{tid}"));
        std::fs::create_dir_all(&dir).unwrap();
        let link = dir.join("maps");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(format!("/proc/{me}/maps"), &link).unwrap();
        let e = open(&link, OFlags::RDONLY, true).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied);
        // Magic links are not followed at all (they lead out of procfs).
        let e = open(Path::new("/proc/self/exe"), OFlags::RDONLY, true).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ELOOP));
        std::fs::remove_dir_all(&dir).unwrap();
        // Another process's entries and the rest of procfs stay readable.
        assert!(open(Path::new("/proc/meminfo"), OFlags::RDONLY, true).is_ok());
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        let p = format!("/proc/{}/status", child.id());
        let other = open(Path::new(&p), OFlags::RDONLY, true);
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(other.is_ok(), "{p}: {other:?}");
        // `/` is its own parent.
        let (root, name) = PinnedDir::parent_of(Path::new("/")).unwrap();
        assert_eq!(name, ".");
        assert!(std::fs::symlink_metadata(root.entry(&name))
            .unwrap()
            .is_dir());
        // Pinned directories refuse the same.
        assert!(PinnedDir::open(Path::new("/proc/self"), true).is_err());
        let proc = PinnedDir::open(Path::new("/proc"), true).unwrap();
        assert!(proc.child(me.to_string().as_ref()).is_err());
        assert!(proc.child("sys".as_ref()).is_ok());
    }
}
