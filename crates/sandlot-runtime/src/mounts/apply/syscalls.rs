//! The system calls mount application makes ([`MountSyscalls`]), and the real
//! implementation, [`Kernel`], over the typed wrappers of [`crate::sys`]. The
//! unit tests drive the same code through a fake that records the calls.

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;

use crate::host_path::{self, HostId};
use crate::sys;

/// Every system call [`super`] makes. `Fd` is an open descriptor: an [`OwnedFd`] in
/// [`Kernel`], a plain name in the unit tests' fake. Paths under the root are
/// resolved with `openat2(RESOLVE_IN_ROOT)`.
pub(crate) trait MountSyscalls {
    type Fd;

    /// `open(O_PATH)` of a host path; `nofollow` refuses a final symlink.
    fn open_path(&self, path: &CStr, nofollow: bool) -> io::Result<Self::Fd>;
    /// `openat2(O_PATH, RESOLVE_IN_ROOT)` of `path` under `root`.
    fn open_in_root(&self, root: &Self::Fd, path: &CStr) -> io::Result<Self::Fd>;
    /// Reads at most `limit` bytes of the file `path` under `root`.
    fn read_in_root(&self, root: &Self::Fd, path: &CStr, limit: u64) -> io::Result<Vec<u8>>;
    /// Opens the directory `name` in `dir`, refusing a symlink.
    fn open_dir_nofollow(&self, dir: &Self::Fd, name: &CStr) -> io::Result<Self::Fd>;
    /// Reopens the host path `source` pinned to the file `id` ([`host_path::reopen`]);
    /// returns it and its `st_mode`.
    fn reopen_pinned(&self, source: &Path, id: HostId) -> io::Result<(Self::Fd, u32)>;
    /// The `/proc/self/fd/N` path of `fd`, for the calls that take a path.
    fn fd_path(&self, fd: &Self::Fd) -> CString;
    /// Whether the host path `path` is a character or block device.
    fn is_device(&self, path: &Path) -> bool;

    /// `mkdir(2)` of a host path (the root's overlay directories).
    fn create_dir(&self, path: &Path) -> io::Result<()>;
    fn mkdirat(&self, dir: &Self::Fd, name: &CStr, mode: u32) -> io::Result<()>;
    /// Creates an empty file `name` in `dir` if there is none.
    fn touchat(&self, dir: &Self::Fd, name: &CStr, mode: u32) -> io::Result<()>;
    /// Creates an empty file `name` in `dir`; `EEXIST` if anything is there.
    fn create_file_at(&self, dir: &Self::Fd, name: &CStr, mode: u32) -> io::Result<()>;
    fn symlinkat(&self, dir: &Self::Fd, name: &CStr, target: &CStr) -> io::Result<()>;
    fn rmdirat(&self, dir: &Self::Fd, name: &CStr) -> io::Result<()>;
    /// Removes the link or file `name` in `dir` (never what a link names).
    fn unlinkat(&self, dir: &Self::Fd, name: &CStr) -> io::Result<()>;
    /// Creates or truncates the file `name` in `dir` (no symlink followed), with
    /// `mode` if it is new, and writes `data`. `ELOOP` for a link there, `ENXIO`
    /// for anything else that is no regular file (a FIFO), never waiting on it.
    fn write_at(&self, dir: &Self::Fd, name: &CStr, data: &[u8], mode: u32) -> io::Result<()>;
    /// Creates `name` in `dir` with no access for anyone, writes `data`, then sets
    /// the owner and `mode` (in that order: a chown clears set-id bits, and until the
    /// chmod nobody but root could open the file). Refuses an existing file or a link.
    fn write_owned_at(
        &self,
        dir: &Self::Fd,
        name: &CStr,
        data: &[u8],
        mode: u32,
        uid: u32,
        gid: u32,
    ) -> io::Result<()>;
    fn fchmod(&self, fd: &Self::Fd, mode: u32) -> io::Result<()>;
    /// `chmod` through [`MountSyscalls::fd_path`] (an `O_PATH` descriptor refuses `fchmod`).
    fn chmod_fd_path(&self, fd: &Self::Fd, mode: u32) -> io::Result<()>;
    fn fchown(&self, fd: &Self::Fd, uid: u32, gid: u32) -> io::Result<()>;

    /// `mount(2)`.
    fn mount(
        &self,
        source: Option<&CStr>,
        target: &CStr,
        fstype: Option<&CStr>,
        flags: libc::c_ulong,
        data: Option<&CStr>,
    ) -> io::Result<()>;
    /// A detached recursive copy of the mount tree at the host path `path`.
    fn open_tree_clone(&self, path: &CStr) -> io::Result<Self::Fd>;
    /// A detached copy of the mount tree at `fd` (recursive or not).
    fn open_tree_clone_fd(&self, fd: &Self::Fd, recursive: bool) -> io::Result<Self::Fd>;
    /// Attaches the detached tree `tree` at the path `target`.
    fn move_mount_to(&self, tree: &Self::Fd, target: &CStr) -> io::Result<()>;
    /// Attaches the detached tree `tree` onto the directory or file `target`.
    fn move_mount_onto(&self, tree: &Self::Fd, target: &Self::Fd) -> io::Result<()>;
    /// Attaches the detached tree `tree` onto the entry `name` of the directory `dir`
    /// (a trailing symlink is not followed).
    fn move_mount_at(&self, tree: &Self::Fd, dir: &Self::Fd, name: &CStr) -> io::Result<()>;
    /// Sets the `MOUNT_ATTR_*` flags `set` on the mount at `fd` (and, with
    /// `recursive`, those below it).
    fn mount_setattr(&self, fd: &Self::Fd, recursive: bool, set: u64) -> io::Result<()>;
}

/// The real system calls.
pub(crate) struct Kernel;

impl MountSyscalls for Kernel {
    type Fd = OwnedFd;

    fn open_path(&self, path: &CStr, nofollow: bool) -> io::Result<OwnedFd> {
        sys::open_path(path, nofollow)
    }

    fn open_in_root(&self, root: &OwnedFd, path: &CStr) -> io::Result<OwnedFd> {
        sys::open_in_root(root.as_fd(), path)
    }

    fn read_in_root(&self, root: &OwnedFd, path: &CStr, limit: u64) -> io::Result<Vec<u8>> {
        sys::read_in_root(root.as_fd(), path, limit)
    }

    fn open_dir_nofollow(&self, dir: &OwnedFd, name: &CStr) -> io::Result<OwnedFd> {
        sys::open_dir_nofollow(dir.as_fd(), name)
    }

    fn reopen_pinned(&self, source: &Path, id: HostId) -> io::Result<(OwnedFd, u32)> {
        host_path::reopen(source, id)
    }

    fn fd_path(&self, fd: &OwnedFd) -> CString {
        sys::fd_path(fd.as_fd())
    }

    fn is_device(&self, path: &Path) -> bool {
        use std::os::unix::fs::FileTypeExt;
        std::fs::metadata(path)
            .is_ok_and(|m| m.file_type().is_char_device() || m.file_type().is_block_device())
    }

    fn create_dir(&self, path: &Path) -> io::Result<()> {
        std::fs::create_dir(path)
    }

    fn mkdirat(&self, dir: &OwnedFd, name: &CStr, mode: u32) -> io::Result<()> {
        sys::mkdirat(dir.as_fd(), name, mode)
    }

    fn touchat(&self, dir: &OwnedFd, name: &CStr, mode: u32) -> io::Result<()> {
        sys::touchat(dir.as_fd(), name, mode)
    }

    fn create_file_at(&self, dir: &OwnedFd, name: &CStr, mode: u32) -> io::Result<()> {
        sys::create_file_at(dir.as_fd(), name, mode)
    }

    fn symlinkat(&self, dir: &OwnedFd, name: &CStr, target: &CStr) -> io::Result<()> {
        // SAFETY: valid C strings and an fd we own.
        let rc = unsafe { libc::symlinkat(target.as_ptr(), dir.as_raw_fd(), name.as_ptr()) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    fn rmdirat(&self, dir: &OwnedFd, name: &CStr) -> io::Result<()> {
        sys::rmdirat(dir.as_fd(), name)
    }

    fn unlinkat(&self, dir: &OwnedFd, name: &CStr) -> io::Result<()> {
        sys::unlinkat(dir.as_fd(), name)
    }

    fn write_at(&self, dir: &OwnedFd, name: &CStr, data: &[u8], mode: u32) -> io::Result<()> {
        // Non-blocking: a FIFO (or socket) the image has there is ENXIO at once,
        // never an open that waits for a reader.
        // SAFETY: valid dir fd and C string; the fd is wrapped right away.
        let fd = unsafe {
            libc::openat(
                dir.as_raw_fd(),
                name.as_ptr(),
                libc::O_CREAT
                    | libc::O_WRONLY
                    | libc::O_TRUNC
                    | libc::O_CLOEXEC
                    | libc::O_NOFOLLOW
                    | libc::O_NONBLOCK,
                mode as libc::c_uint,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fresh fd.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let file = std::fs::File::from(fd);
        if !file.metadata()?.is_file() {
            return Err(io::Error::from_raw_os_error(libc::ENXIO));
        }
        sys::write_all_fd(file.as_fd(), data)
    }

    fn write_owned_at(
        &self,
        dir: &OwnedFd,
        name: &CStr,
        data: &[u8],
        mode: u32,
        uid: u32,
        gid: u32,
    ) -> io::Result<()> {
        // SAFETY: valid dir fd and C string; the fd is wrapped right away.
        let fd = unsafe {
            libc::openat(
                dir.as_raw_fd(),
                name.as_ptr(),
                libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY | libc::O_CLOEXEC | libc::O_NOFOLLOW,
                0 as libc::c_uint,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fresh fd.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        sys::write_all_fd(fd.as_fd(), data)?;
        let file = std::fs::File::from(fd);
        std::os::unix::fs::fchown(&file, Some(uid), Some(gid))?;
        file.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(mode & 0o777))
    }

    fn fchmod(&self, fd: &OwnedFd, mode: u32) -> io::Result<()> {
        sys::fchmod(fd.as_fd(), mode)
    }

    fn chmod_fd_path(&self, fd: &OwnedFd, mode: u32) -> io::Result<()> {
        let p = sys::fd_path(fd.as_fd());
        std::fs::set_permissions(
            std::str::from_utf8(p.as_bytes()).unwrap_or_default(),
            std::os::unix::fs::PermissionsExt::from_mode(mode),
        )
    }

    fn fchown(&self, fd: &OwnedFd, uid: u32, gid: u32) -> io::Result<()> {
        sys::fchown_fd(fd.as_fd(), uid, gid)
    }

    fn mount(
        &self,
        source: Option<&CStr>,
        target: &CStr,
        fstype: Option<&CStr>,
        flags: libc::c_ulong,
        data: Option<&CStr>,
    ) -> io::Result<()> {
        sys::mount(source, target, fstype, flags, data)
    }

    fn open_tree_clone(&self, path: &CStr) -> io::Result<OwnedFd> {
        sys::open_tree_clone(path)
    }

    fn open_tree_clone_fd(&self, fd: &OwnedFd, recursive: bool) -> io::Result<OwnedFd> {
        sys::open_tree_clone_fd(fd.as_fd(), recursive)
    }

    fn move_mount_to(&self, tree: &OwnedFd, target: &CStr) -> io::Result<()> {
        sys::move_mount_to(tree.as_fd(), target)
    }

    fn move_mount_onto(&self, tree: &OwnedFd, target: &OwnedFd) -> io::Result<()> {
        sys::move_mount_onto(tree.as_fd(), target.as_fd())
    }

    fn move_mount_at(&self, tree: &OwnedFd, dir: &OwnedFd, name: &CStr) -> io::Result<()> {
        sys::move_mount_at(tree.as_fd(), dir.as_fd(), name)
    }

    fn mount_setattr(&self, fd: &OwnedFd, recursive: bool, set: u64) -> io::Result<()> {
        sys::mount_setattr(Some(fd.as_fd()), c"", recursive, set, None)
    }
}
