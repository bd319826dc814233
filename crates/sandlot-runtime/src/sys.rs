//! Typed wrappers over the Linux syscalls the namespace backend needs.
//!
//! Every function owns or borrows its file descriptors through `OwnedFd`/`BorrowedFd`
//! and turns `-1` into `io::Error`. This is the only module of the crate that calls
//! `libc` directly.

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, IntoRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

fn cvt_long(r: libc::c_long) -> io::Result<libc::c_long> {
    if r == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

pub fn cstr(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains a NUL byte"))
}

/// `mount(2)`. `fstype` and `data` are optional.
pub fn mount(
    source: Option<&CStr>,
    target: &CStr,
    fstype: Option<&CStr>,
    flags: libc::c_ulong,
    data: Option<&CStr>,
) -> io::Result<()> {
    let p = |o: Option<&CStr>| o.map_or(std::ptr::null(), |c| c.as_ptr());
    // SAFETY: all pointers are either null or point to NUL-terminated strings that
    // outlive the call; the kernel copies them.
    cvt(unsafe { libc::mount(p(source), target.as_ptr(), p(fstype), flags, p(data).cast()) })?;
    Ok(())
}

pub fn umount2(target: &CStr, flags: libc::c_int) -> io::Result<()> {
    // SAFETY: target is a valid C string.
    cvt(unsafe { libc::umount2(target.as_ptr(), flags) })?;
    Ok(())
}

/// `pivot_root(".", ".")` followed by a lazy unmount of the old root, which the
/// kernel stacks under the new one: the trick runc uses to avoid a put_old dir.
pub fn pivot_root_here() -> io::Result<()> {
    let dot = c".";
    // SAFETY: both arguments are valid C strings; the syscall has no other inputs.
    cvt_long(unsafe { libc::syscall(libc::SYS_pivot_root, dot.as_ptr(), dot.as_ptr()) })?;
    umount2(dot, libc::MNT_DETACH)?;
    Ok(())
}

#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

pub const MOUNT_ATTR_RDONLY: u64 = 0x1;
pub const MOUNT_ATTR_NOSUID: u64 = 0x2;
pub const MOUNT_ATTR_NODEV: u64 = 0x4;
pub const MOUNT_ATTR_NOEXEC: u64 = 0x8;
pub const MOUNT_ATTR_IDMAP: u64 = 0x0010_0000;

/// `mount_setattr(2)` on the mount at `dirfd`/`path` (recursively if `recursive`).
pub fn mount_setattr(
    dirfd: Option<BorrowedFd<'_>>,
    path: &CStr,
    recursive: bool,
    set: u64,
    userns: Option<BorrowedFd<'_>>,
) -> io::Result<()> {
    let mut attr = MountAttr {
        attr_set: set,
        attr_clr: 0,
        propagation: 0,
        userns_fd: userns.map_or(0, |f| f.as_raw_fd() as u64),
    };
    let mut flags = 0;
    if recursive {
        flags |= libc::AT_RECURSIVE as libc::c_uint;
    }
    if path.is_empty() {
        flags |= libc::AT_EMPTY_PATH as libc::c_uint;
    }
    let fd = dirfd.map_or(libc::AT_FDCWD, |f| f.as_raw_fd());
    // SAFETY: `attr` is a properly laid out `struct mount_attr` that lives for the
    // call; `path` is a valid C string.
    cvt_long(unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            fd,
            path.as_ptr(),
            flags,
            &mut attr as *mut MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    })?;
    Ok(())
}

/// `open_tree(path, OPEN_TREE_CLONE | AT_RECURSIVE | OPEN_TREE_CLOEXEC)`: a detached copy
/// of the mount tree at `path`.
pub fn open_tree_clone(path: &CStr) -> io::Result<OwnedFd> {
    const OPEN_TREE_CLONE: libc::c_uint = 1;
    let flags =
        OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_uint | libc::AT_RECURSIVE as libc::c_uint;
    // SAFETY: path is a valid C string; the returned fd is owned by us.
    let fd = cvt_long(unsafe {
        libc::syscall(libc::SYS_open_tree, libc::AT_FDCWD, path.as_ptr(), flags)
    })?;
    // SAFETY: the kernel returned a fresh fd that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// `open_tree(fd, "", OPEN_TREE_CLONE | AT_EMPTY_PATH | OPEN_TREE_CLOEXEC)`: a
/// detached bind of the file or directory `fd` refers to; with `recursive`
/// (`AT_RECURSIVE`) the mounts below it come along.
pub fn open_tree_clone_fd(fd: BorrowedFd<'_>, recursive: bool) -> io::Result<OwnedFd> {
    const OPEN_TREE_CLONE: libc::c_uint = 1;
    let mut flags =
        OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_uint | libc::AT_EMPTY_PATH as libc::c_uint;
    if recursive {
        flags |= libc::AT_RECURSIVE as libc::c_uint;
    }
    // SAFETY: fd is borrowed for the call; the path is an empty C string; the
    // returned fd is owned by us.
    let fd = cvt_long(unsafe {
        libc::syscall(libc::SYS_open_tree, fd.as_raw_fd(), c"".as_ptr(), flags)
    })?;
    // SAFETY: the kernel returned a fresh fd that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// `unlinkat(dir, name, AT_REMOVEDIR)`: removes an empty directory.
pub fn rmdirat(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<()> {
    // SAFETY: valid fd and C string.
    cvt(unsafe { libc::unlinkat(dir.as_raw_fd(), name.as_ptr(), libc::AT_REMOVEDIR) })?;
    Ok(())
}

/// `unlinkat(dir, name, 0)`: removes a file or a link (never follows it).
pub fn unlinkat(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<()> {
    // SAFETY: valid fd and C string.
    cvt(unsafe { libc::unlinkat(dir.as_raw_fd(), name.as_ptr(), 0) })?;
    Ok(())
}

const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 4;
const MOVE_MOUNT_T_EMPTY_PATH: libc::c_uint = 0x40;

/// `move_mount(fd, "", to_dir, to_path, flags)` of the detached tree `fd`; `to_dir`
/// is a descriptor number or `AT_FDCWD`.
fn move_tree(
    fd: BorrowedFd<'_>,
    to_dir: RawFd,
    to_path: &CStr,
    flags: libc::c_uint,
) -> io::Result<()> {
    // SAFETY: valid C strings; `fd` is borrowed for the call and the callers pass a
    // borrowed descriptor's number or AT_FDCWD as `to_dir`.
    cvt_long(unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            fd.as_raw_fd(),
            c"".as_ptr(),
            to_dir,
            to_path.as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH | flags,
        )
    })?;
    Ok(())
}

/// `move_mount(fd, "", AT_FDCWD, target, MOVE_MOUNT_F_EMPTY_PATH)`: attach a detached tree.
pub fn move_mount_to(fd: BorrowedFd<'_>, target: &CStr) -> io::Result<()> {
    move_tree(fd, libc::AT_FDCWD, target, 0)
}

/// `move_mount(fd, "", to, "", F_EMPTY_PATH | T_EMPTY_PATH)`: attach a detached tree
/// onto the directory `to` (an `O_PATH` descriptor, e.g. resolved in the new root).
pub fn move_mount_onto(fd: BorrowedFd<'_>, to: BorrowedFd<'_>) -> io::Result<()> {
    move_tree(fd, to.as_raw_fd(), c"", MOVE_MOUNT_T_EMPTY_PATH)
}

/// `move_mount(fd, "", dir, name, F_EMPTY_PATH)`: attach a detached tree onto the
/// entry `name` of the directory `dir`, not following a trailing symlink.
pub fn move_mount_at(fd: BorrowedFd<'_>, dir: BorrowedFd<'_>, name: &CStr) -> io::Result<()> {
    move_tree(fd, dir.as_raw_fd(), name, 0)
}

/// `renameat2(RENAME_NOREPLACE)`: fails with `EEXIST` instead of replacing `to`.
pub fn rename_noreplace(from: &Path, to: &Path) -> io::Result<()> {
    let (f, t) = (cstr(from)?, cstr(to)?);
    // SAFETY: valid C strings; AT_FDCWD-relative absolute paths.
    cvt(unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            f.as_ptr(),
            libc::AT_FDCWD,
            t.as_ptr(),
            libc::RENAME_NOREPLACE,
        )
    })?;
    Ok(())
}

pub enum Fork {
    Child,
    Parent(libc::pid_t),
}

/// `clone(flags | SIGCHLD)` with fork semantics (no shared memory, no new stack):
/// the child starts in the new namespaces `flags` asks for. Only call from a
/// single-threaded process.
pub fn clone_into_namespaces(flags: libc::c_int) -> io::Result<Fork> {
    // SAFETY: without CLONE_VM the child gets a copy of the address space, exactly as
    // with fork(2); the caller is single-threaded, so no lock is held by another thread.
    let pid = cvt_long(unsafe {
        libc::syscall(
            libc::SYS_clone,
            (flags | libc::SIGCHLD) as libc::c_ulong,
            0usize,
            0usize,
            0usize,
            0usize,
        )
    })?;
    Ok(if pid == 0 {
        Fork::Child
    } else {
        Fork::Parent(pid as libc::pid_t)
    })
}

/// `unshare(CLONE_NEWNET)`: moves the calling thread alone into a new network namespace.
pub fn unshare_network() -> io::Result<()> {
    // SAFETY: CLONE_NEWNET changes only the calling thread's network namespace. Unlike
    // CLONE_FILES or CLONE_FS it does not split state other threads share, so no other
    // thread can observe a changed descriptor table or working directory.
    cvt(unsafe { libc::unshare(libc::CLONE_NEWNET) }).map(|_| ())
}

/// `unshare(CLONE_NEWNS)`: moves the calling process into a copy of its mount namespace.
/// Only for single-threaded processes (the fork server): the kernel refuses it when
/// the filesystem context is shared with another thread.
pub fn unshare_mount_ns() -> io::Result<()> {
    // SAFETY: no pointers; changes only this process's mount namespace, root and cwd.
    cvt(unsafe { libc::unshare(libc::CLONE_NEWNS) }).map(|_| ())
}

/// `setns(fd, CLONE_NEWNS)`: joins the mount namespace `fd` refers to (single-threaded
/// callers only, as for [`unshare_mount_ns`]); root and cwd become that namespace's root.
pub fn setns_mnt(fd: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: no pointers; the kernel checks that fd is a mount namespace.
    cvt(unsafe { libc::setns(fd.as_raw_fd(), libc::CLONE_NEWNS) }).map(|_| ())
}

/// Exits immediately without running destructors or atexit handlers (for forked children).
pub fn exit_now(code: i32) -> ! {
    // SAFETY: _exit never returns and takes no pointers.
    unsafe { libc::_exit(code) }
}

pub fn waitpid(pid: libc::pid_t) -> io::Result<libc::c_int> {
    let mut status = 0;
    loop {
        // SAFETY: status is a valid out-pointer.
        match cvt(unsafe { libc::waitpid(pid, &mut status, 0) }) {
            Ok(_) => return Ok(status),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
}

/// Non-blocking wait for a child; `Ok(None)` if it is still running.
pub fn try_waitpid(pid: libc::pid_t) -> io::Result<Option<libc::c_int>> {
    let mut status = 0;
    // SAFETY: status is a valid out-pointer.
    let r = cvt(unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) })?;
    Ok(if r == 0 { None } else { Some(status) })
}

/// A child that is a zombie, left in place (`waitid(P_ALL, WEXITED|WNOHANG|WNOWAIT)`):
/// `Ok(None)` when no child has exited.
pub fn peek_zombie_child() -> io::Result<Option<libc::pid_t>> {
    // SAFETY: an all-zero siginfo_t is a valid value of this plain C struct.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: info is a valid out-pointer for the call.
    cvt(unsafe {
        libc::waitid(
            libc::P_ALL,
            0,
            &mut info,
            libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
        )
    })?;
    // SAFETY: waitid filled info (or left it zeroed when no child had exited).
    let pid = unsafe { info.si_pid() };
    Ok((pid != 0).then_some(pid))
}

pub fn pidfd_open(pid: libc::pid_t) -> io::Result<OwnedFd> {
    // SAFETY: no pointers; the returned fd is new and owned by us.
    let fd = cvt_long(unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) })?;
    // SAFETY: fresh fd from the kernel.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

pub fn pidfd_send_signal(pidfd: BorrowedFd<'_>, sig: libc::c_int) -> io::Result<()> {
    // SAFETY: null siginfo is allowed; fd borrowed for the call.
    cvt_long(unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            sig,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    })?;
    Ok(())
}

pub fn kill(pid: libc::pid_t, sig: libc::c_int) -> io::Result<()> {
    // SAFETY: no pointers.
    cvt(unsafe { libc::kill(pid, sig) })?;
    Ok(())
}

pub fn prctl(op: libc::c_int, a: libc::c_ulong, b: libc::c_ulong) -> io::Result<libc::c_int> {
    // SAFETY: the prctl operations used by this crate take integer arguments only.
    cvt(unsafe { libc::prctl(op, a, b, 0 as libc::c_ulong, 0 as libc::c_ulong) })
}

pub fn sethostname(name: &str) -> io::Result<()> {
    // SAFETY: pointer and length describe `name`'s bytes.
    cvt(unsafe { libc::sethostname(name.as_ptr().cast(), name.len()) })?;
    Ok(())
}

pub fn setresuid(uid: u32) -> io::Result<()> {
    // SAFETY: no pointers.
    cvt(unsafe { libc::setresuid(uid, uid, uid) })?;
    Ok(())
}

pub fn setresgid(gid: u32) -> io::Result<()> {
    // SAFETY: no pointers.
    cvt(unsafe { libc::setresgid(gid, gid, gid) })?;
    Ok(())
}

pub fn setgroups_empty() -> io::Result<()> {
    // SAFETY: a zero-length list with a null pointer is valid.
    cvt(unsafe { libc::setgroups(0, std::ptr::null()) })?;
    Ok(())
}

pub fn chdir(p: &CStr) -> io::Result<()> {
    // SAFETY: valid C string.
    cvt(unsafe { libc::chdir(p.as_ptr()) })?;
    Ok(())
}

/// Changes the owner of what an (`O_PATH`) fd refers to.
pub fn fchown_fd(fd: BorrowedFd<'_>, uid: u32, gid: u32) -> io::Result<()> {
    // SAFETY: valid fd; the empty path with AT_EMPTY_PATH names the fd itself.
    cvt(unsafe { libc::fchownat(fd.as_raw_fd(), c"".as_ptr(), uid, gid, libc::AT_EMPTY_PATH) })?;
    Ok(())
}

pub fn umask(mask: libc::mode_t) {
    // SAFETY: umask cannot fail.
    unsafe { libc::umask(mask) };
}

pub fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: fds is a valid 2-element out array.
    cvt(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) })?;
    // SAFETY: both fds are fresh and owned by us.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

pub fn socketpair() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: fds is a valid 2-element out array.
    cvt(unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    })?;
    // SAFETY: fresh fds owned by us.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Sends one byte and, optionally, one file descriptor over a Unix socket.
pub fn send_with_fd(sock: BorrowedFd<'_>, byte: u8, fd: Option<BorrowedFd<'_>>) -> io::Result<()> {
    match fd {
        Some(fd) => send_fds(sock, &[byte], &[fd]),
        None => send_fds(sock, &[byte], &[]),
    }
}

/// Receives one byte and an optional file descriptor. `Ok(None)` at end of stream.
pub fn recv_with_fd(sock: BorrowedFd<'_>) -> io::Result<Option<(u8, Option<OwnedFd>)>> {
    let mut b = [0u8];
    Ok(recv_fds(sock, &mut b)?
        .filter(|(n, _)| *n > 0)
        .map(|(_, fds)| (b[0], fds.into_iter().next())))
}

pub fn write_all_fd(fd: BorrowedFd<'_>, mut buf: &[u8]) -> io::Result<()> {
    while !buf.is_empty() {
        // SAFETY: buf is valid for buf.len() bytes.
        let n = unsafe { libc::write(fd.as_raw_fd(), buf.as_ptr().cast(), buf.len()) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        buf = &buf[n as usize..];
    }
    Ok(())
}

/// Lowers the calling thread's priority to nice value `nice` unless it already runs
/// at that or lower (Linux nice values are per thread).
pub fn nice_this_thread(nice: i32) -> io::Result<()> {
    // SAFETY: no pointers; who = 0 is the calling thread. A -1 that is an error
    // rather than a nice value only makes the set below run.
    let now = unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) };
    if now >= nice {
        return Ok(());
    }
    // SAFETY: no pointers; who = 0 is the calling thread.
    cvt(unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, nice) })?;
    Ok(())
}

/// `flock(fd, op)`, blocking (`LOCK_EX`, `LOCK_SH`) or releasing (`LOCK_UN`).
pub fn flock(fd: BorrowedFd<'_>, op: libc::c_int) -> io::Result<()> {
    loop {
        // SAFETY: no pointers.
        match cvt(unsafe { libc::flock(fd.as_raw_fd(), op) }) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            r => return r.map(drop),
        }
    }
}

/// The file system type (`f_type`, a `*_MAGIC` number) of the file system holding `p`.
pub fn statfs_type(p: &CStr) -> io::Result<i64> {
    let mut st = std::mem::MaybeUninit::<libc::statfs>::uninit();
    // SAFETY: p is a valid C string; st points to writable memory of the struct's
    // size, which the kernel fills on success.
    cvt(unsafe { libc::statfs(p.as_ptr(), st.as_mut_ptr()) })?;
    #[allow(clippy::unnecessary_cast)] // f_type is i32 on some targets
    // SAFETY: statfs succeeded, so the struct is initialized.
    Ok(unsafe { st.assume_init() }.f_type as i64)
}

/// Takes an exclusive `flock` without blocking. `Ok(false)` if someone else holds it.
pub fn try_flock_exclusive(fd: BorrowedFd<'_>) -> io::Result<bool> {
    // SAFETY: no pointers.
    match cvt(unsafe { libc::flock(fd.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) }) {
        Ok(_) => Ok(true),
        Err(e) if e.raw_os_error() == Some(libc::EWOULDBLOCK) => Ok(false),
        Err(e) => Err(e),
    }
}

/// `setns(fd, CLONE_NEWNET)`: moves the calling thread into a network namespace.
pub fn setns_net(fd: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: no pointers; the kernel checks that fd is a network namespace.
    cvt(unsafe { libc::setns(fd.as_raw_fd(), libc::CLONE_NEWNET) })?;
    Ok(())
}

/// A non-blocking, close-on-exec TCP socket (IPv6 when `v6`) in the calling
/// thread's network namespace, not yet connected.
pub fn tcp_socket(v6: bool) -> io::Result<OwnedFd> {
    let family = if v6 { libc::AF_INET6 } else { libc::AF_INET };
    // SAFETY: socket() has no pointer args; the fd is wrapped immediately.
    let s = cvt(unsafe {
        libc::socket(
            family,
            libc::SOCK_STREAM | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
            0,
        )
    })?;
    // SAFETY: fresh fd, owned here.
    Ok(unsafe { OwnedFd::from_raw_fd(s) })
}

/// Brings the loopback interface up in the current network namespace.
pub fn loopback_up() -> io::Result<()> {
    // SAFETY: socket() has no pointer args; the fd is wrapped immediately.
    let s = cvt(unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) })?;
    // SAFETY: fresh fd, owned here.
    let sock = unsafe { OwnedFd::from_raw_fd(s) };
    // SAFETY: ifreq is plain old data.
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    for (i, b) in b"lo\0".iter().enumerate() {
        ifr.ifr_name[i] = *b as libc::c_char;
    }
    // SAFETY: ifr is a valid ifreq for the duration of both ioctls.
    unsafe {
        cvt(libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut ifr))?;
        ifr.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
        cvt(libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &ifr))?;
    }
    Ok(())
}

/// Opens a path with `O_PATH | O_CLOEXEC` (and `O_NOFOLLOW` if asked).
pub fn open_path(p: &CStr, nofollow: bool) -> io::Result<OwnedFd> {
    let mut flags = libc::O_PATH | libc::O_CLOEXEC;
    if nofollow {
        flags |= libc::O_NOFOLLOW;
    }
    // SAFETY: valid C string; fd wrapped immediately.
    let fd = cvt(unsafe { libc::open(p.as_ptr(), flags) })?;
    // SAFETY: fresh fd.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The fields of `/proc/PID/stat` (`proc_pid_stat(5)`), read once.
pub struct ProcStat {
    /// Fields 3 onwards: those after the command name, which is in parentheses and
    /// may hold anything.
    rest: Vec<String>,
}

/// `PF_EXITING` in the flags of `/proc/PID/stat`: the task is in `exit(2)` (it runs
/// no more user code).
pub const PF_EXITING: u64 = 0x4;

impl ProcStat {
    /// `/proc/PID/stat` of `pid`, or of this process.
    pub fn read(pid: Option<i32>) -> io::Result<ProcStat> {
        let path = match pid {
            Some(p) => format!("/proc/{p}/stat"),
            None => "/proc/self/stat".to_string(),
        };
        ProcStat::parse(&std::fs::read_to_string(path)?)
    }

    fn parse(stat: &str) -> io::Result<ProcStat> {
        let rest = stat
            .rsplit_once(')')
            .map(|(_, r)| r)
            .ok_or_else(|| io::Error::other("/proc/PID/stat without a command name"))?;
        Ok(ProcStat {
            rest: rest.split_whitespace().map(str::to_string).collect(),
        })
    }

    /// Field `n` (1-based, as `proc_pid_stat(5)` numbers them; 3 or more).
    pub fn field(&self, n: usize) -> io::Result<u64> {
        n.checked_sub(3)
            .and_then(|i| self.rest.get(i))
            .and_then(|f| f.parse().ok())
            .ok_or_else(|| io::Error::other(format!("/proc/PID/stat has no field {n}")))
    }

    /// The state letter (`R`, `S`, `Z`, ...).
    pub fn state(&self) -> char {
        self.rest
            .first()
            .and_then(|s| s.chars().next())
            .unwrap_or('?')
    }

    /// Start time after boot, in clock ticks (field 22): with the pid, names one
    /// process for the host's uptime, whatever pids are reused.
    pub fn start_time(&self) -> io::Result<u64> {
        self.field(22)
    }

    /// Whether the process is gone or going: a zombie, dead, or in `exit(2)`.
    pub fn exiting(&self) -> bool {
        matches!(self.state(), 'Z' | 'X' | 'x') || self.field(9).is_ok_and(|f| f & PF_EXITING != 0)
    }
}

/// Where this process's argument strings are (`arg_start` and `arg_end`, fields 48
/// and 49 of `/proc/self/stat`).
fn arg_area(st: &ProcStat) -> io::Result<(u64, u64)> {
    Ok((st.field(48)?, st.field(49)?))
}

/// The bytes `/proc/PID/cmdline` should show for `args` in an argument area of `len`
/// bytes: the arguments NUL-terminated, cut to fit, the rest zeros (a final NUL
/// makes the kernel show exactly this area).
pub fn cmdline_bytes(args: &[&str], len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len);
    for a in args {
        out.extend_from_slice(a.as_bytes());
        out.push(0);
    }
    out.resize(len, 0);
    if let Some(last) = out.last_mut() {
        *last = 0;
    }
    out
}

/// Rewrites this process's argument strings in place (what `/proc/PID/cmdline` and
/// `ps` show for it and for children forked afterwards) to `args`. The area keeps its
/// size, so `args` is cut if it is longer than the original arguments.
///
/// Where it may (host root), the area's end then moves to the
/// end of `args`, so `/proc/PID/cmdline` is `args` and nothing more: not the
/// length of the original arguments (a CLI's, with the secrets it was given).
pub fn set_cmdline(args: &[&str]) -> io::Result<()> {
    use std::os::unix::fs::FileExt;
    let st = ProcStat::read(None)?;
    let (start, end) = arg_area(&st)?;
    let len = usize::try_from(end.saturating_sub(start)).map_err(io::Error::other)?;
    if len == 0 {
        return Ok(());
    }
    let mem = std::fs::OpenOptions::new()
        .write(true)
        .open("/proc/self/mem")?;
    let bytes = cmdline_bytes(args, len);
    mem.write_all_at(&bytes, start)?;
    let used: u64 = args.iter().map(|a| a.len() as u64 + 1).sum();
    if used < len as u64 {
        // Refused to a process without the capability: the area then stays,
        // zero-padded.
        let _ = set_mm(&st, libc::PR_SET_MM_ARG_END, start + used);
    }
    Ok(())
}

/// The kernel's `struct prctl_mm_map` (`PR_SET_MM_MAP`).
#[repr(C)]
struct MmMap {
    start_code: u64,
    end_code: u64,
    start_data: u64,
    end_data: u64,
    start_brk: u64,
    brk: u64,
    start_stack: u64,
    arg_start: u64,
    arg_end: u64,
    env_start: u64,
    env_end: u64,
    auxv: u64,
    auxv_size: u32,
    exe_fd: u32,
}

/// Moves the end of this process's argument area (`PR_SET_MM_ARG_END`) or of
/// its environment (`PR_SET_MM_ENV_END`) to `addr`: what `/proc/PID/cmdline` and
/// `environ` show. Through `PR_SET_MM_MAP`, which host root may use without
/// `CAP_SYS_RESOURCE` (`CAP_SYS_ADMIN` or `CAP_CHECKPOINT_RESTORE` do), the
/// other fields as they are.
/// `st` is this process's `/proc/self/stat`, read by the caller.
fn set_mm(st: &ProcStat, what: libc::c_int, addr: u64) -> io::Result<()> {
    let auxv = std::fs::read("/proc/self/auxv")?;
    // SAFETY: sbrk(0) only reads the current program break.
    let brk = unsafe { libc::sbrk(0) } as u64;
    let mut m = MmMap {
        start_code: st.field(26)?,
        end_code: st.field(27)?,
        start_data: st.field(45)?,
        end_data: st.field(46)?,
        start_brk: st.field(47)?,
        brk,
        start_stack: st.field(28)?,
        arg_start: st.field(48)?,
        arg_end: st.field(49)?,
        env_start: st.field(50)?,
        env_end: st.field(51)?,
        auxv: auxv.as_ptr() as u64,
        auxv_size: u32::try_from(auxv.len()).map_err(io::Error::other)?,
        // Keep the executable link as it is.
        exe_fd: u32::MAX,
    };
    match what {
        libc::PR_SET_MM_ARG_END => m.arg_end = addr,
        libc::PR_SET_MM_ENV_END => m.env_end = addr,
        _ => return Err(io::Error::from_raw_os_error(libc::EINVAL)),
    }
    // SAFETY: `m` is a valid prctl_mm_map and `auxv` outlives the call; the
    // kernel checks every address against the process's mappings and only
    // records them (and copies the auxv bytes); no memory is written.
    let r = unsafe {
        libc::prctl(
            libc::PR_SET_MM,
            libc::PR_SET_MM_MAP as libc::c_ulong,
            &m as *const MmMap as libc::c_ulong,
            std::mem::size_of::<MmMap>() as libc::c_ulong,
            0 as libc::c_ulong,
        )
    };
    cvt(r).map(drop)
}

/// Unblocks every signal of this thread (`pthread_sigmask(SIG_SETMASK, {})`).
pub fn unblock_all_signals() -> io::Result<()> {
    let mut set = std::mem::MaybeUninit::<libc::sigset_t>::uninit();
    // SAFETY: `set` is a writable sigset_t that sigemptyset initialises; the mask
    // call reads it and writes no old mask (null).
    unsafe {
        cvt(libc::sigemptyset(set.as_mut_ptr()))?;
        let r = libc::pthread_sigmask(libc::SIG_SETMASK, set.as_ptr(), std::ptr::null_mut());
        if r != 0 {
            return Err(io::Error::from_raw_os_error(r));
        }
    }
    Ok(())
}

/// Empties this process's environment and overwrites the strings it started with
/// (`env_start` to `env_end`, fields 50 and 51 of `/proc/self/stat`) with zeros, so
/// neither `getenv` nor `/proc/PID/environ` of it, or of a child forked afterwards,
/// shows them. Only call from a single-threaded process.
pub fn clear_environment() -> io::Result<()> {
    use std::os::unix::fs::FileExt;
    // SAFETY: the caller is single-threaded, so no other thread reads `environ`
    // while glibc clears it.
    if unsafe { libc::clearenv() } != 0 {
        return Err(io::Error::other("clearenv failed"));
    }
    let st = ProcStat::read(None)?;
    let (start, end) = (st.field(50)?, st.field(51)?);
    let len = usize::try_from(end.saturating_sub(start)).map_err(io::Error::other)?;
    if len == 0 {
        return Ok(());
    }
    let mem = std::fs::OpenOptions::new()
        .write(true)
        .open("/proc/self/mem")?;
    mem.write_all_at(&vec![0u8; len], start)?;
    // Nor its length, where allowed (host root).
    let _ = set_mm(&st, libc::PR_SET_MM_ENV_END, start);
    Ok(())
}

/// Whether this process runs one thread only (`/proc/self/task` has one entry):
/// then a `fork` copies no lock that another thread holds.
pub fn single_threaded() -> bool {
    std::fs::read_dir("/proc/self/task").is_ok_and(|d| d.take(2).count() == 1)
}

/// Reads at most `limit` bytes of the regular file `path` resolved inside `root` (as
/// [`open_in_root`] does). Opened non-blocking and refused unless it is a regular
/// file, so a FIFO or device an image put there cannot stall or feed the caller.
pub fn read_in_root(root: BorrowedFd<'_>, path: &CStr, limit: u64) -> io::Result<Vec<u8>> {
    use std::io::Read;
    let fd = openat2_with(
        root.as_raw_fd(),
        path,
        libc::O_RDONLY | libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC,
        RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS,
    )?;
    let file = std::fs::File::from(fd);
    if !file.metadata()?.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a regular file",
        ));
    }
    let mut out = Vec::new();
    file.take(limit).read_to_end(&mut out)?;
    Ok(out)
}

const RESOLVE_NO_MAGICLINKS: u64 = 0x02;
const RESOLVE_NO_SYMLINKS: u64 = 0x04;
const RESOLVE_BENEATH: u64 = 0x08;
const RESOLVE_IN_ROOT: u64 = 0x10;

/// `openat2(dirfd, path, O_PATH|O_CLOEXEC, resolve)`.
fn openat2_path(dirfd: RawFd, path: &CStr, resolve: u64) -> io::Result<OwnedFd> {
    openat2_with(dirfd, path, libc::O_PATH | libc::O_CLOEXEC, resolve)
}

/// `openat2(dirfd, path, flags, resolve)`.
fn openat2_with(dirfd: RawFd, path: &CStr, flags: i32, resolve: u64) -> io::Result<OwnedFd> {
    #[repr(C)]
    struct OpenHow {
        flags: u64,
        mode: u64,
        resolve: u64,
    }
    let how = OpenHow {
        flags: flags as u64,
        mode: 0,
        resolve,
    };
    // SAFETY: `how` is a valid open_how; path is a valid C string; dirfd is a
    // descriptor the caller borrows for the call, or AT_FDCWD.
    let fd = cvt_long(unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dirfd,
            path.as_ptr(),
            &how as *const OpenHow,
            std::mem::size_of::<OpenHow>(),
        )
    })?;
    // SAFETY: fresh fd.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// `openat2(dirfd, path, O_PATH|O_CLOEXEC, RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)`: resolves
/// `path` as if `dirfd` were `/`, so symlinks in an untrusted rootfs cannot escape it.
pub fn open_in_root(root: BorrowedFd<'_>, path: &CStr) -> io::Result<OwnedFd> {
    openat2_path(
        root.as_raw_fd(),
        path,
        RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS,
    )
}

/// `openat2(dir, path, O_PATH|O_CLOEXEC, RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)`,
/// plus `RESOLVE_BENEATH` with a `dir` (without one, `path` is resolved from the
/// current directory, or `/` when absolute): a symbolic link anywhere on the way,
/// the last component included, is `ELOOP`; leaving `dir` is `EXDEV`.
pub fn open_no_symlinks(dir: Option<BorrowedFd<'_>>, path: &CStr) -> io::Result<OwnedFd> {
    match dir {
        Some(d) => openat2_path(
            d.as_raw_fd(),
            path,
            RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS,
        ),
        None => openat2_path(
            libc::AT_FDCWD,
            path,
            RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS,
        ),
    }
}

/// `openat2(dir, path, O_PATH|O_CLOEXEC, RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)`:
/// symbolic links that stay beneath `dir` are followed; one that would leave it (an
/// absolute target, `..` past `dir`) is `EXDEV` before anything outside is looked at.
pub fn open_beneath(dir: BorrowedFd<'_>, path: &CStr) -> io::Result<OwnedFd> {
    openat2_path(
        dir.as_raw_fd(),
        path,
        RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS,
    )
}

/// What `fstat(fd)` says of the file: (device, inode, mode).
pub fn fstat_id(fd: BorrowedFd<'_>) -> io::Result<(u64, u64, u32)> {
    // SAFETY: an all-zero `stat` is a valid value of a plain C struct.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: valid fd and a pointer to a `stat` we own.
    cvt(unsafe { libc::fstat(fd.as_raw_fd(), &mut st) })?;
    Ok((st.st_dev, st.st_ino, st.st_mode))
}

/// Opens directory `name` in `dir` for reading, refusing a symlink (`ELOOP`) or a
/// non-directory (`ENOTDIR`).
pub fn open_dir_nofollow(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<OwnedFd> {
    // SAFETY: valid fd and C string; the fd is wrapped immediately.
    let fd = cvt(unsafe {
        libc::openat(
            dir.as_raw_fd(),
            name.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    })?;
    // SAFETY: fresh fd.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `fstatat(dir, name, AT_SYMLINK_NOFOLLOW)`: what `name` in `dir` is, a link
/// itself rather than what it points to.
pub fn lstatat(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<libc::stat> {
    // SAFETY: an all-zero `stat` is a valid value of a plain C struct.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: valid fd and C string, and a pointer to a `stat` we own.
    cvt(unsafe {
        libc::fstatat(
            dir.as_raw_fd(),
            name.as_ptr(),
            &mut st,
            libc::AT_SYMLINK_NOFOLLOW,
        )
    })?;
    Ok(st)
}

/// `fstat(fd)`, the whole `stat`.
pub fn fstat(fd: BorrowedFd<'_>) -> io::Result<libc::stat> {
    // SAFETY: an all-zero `stat` is a valid value of a plain C struct.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: valid fd and a pointer to a `stat` we own.
    cvt(unsafe { libc::fstat(fd.as_raw_fd(), &mut st) })?;
    Ok(st)
}

/// `openat(dir, name, flags | O_CLOEXEC | O_NOFOLLOW, mode)`: never follows a
/// link as the last component (`name` is one component).
pub fn openat_nofollow(
    dir: BorrowedFd<'_>,
    name: &CStr,
    flags: libc::c_int,
    mode: libc::mode_t,
) -> io::Result<OwnedFd> {
    // SAFETY: valid fd and C string; the fd is wrapped immediately.
    let fd = cvt(unsafe {
        libc::openat(
            dir.as_raw_fd(),
            name.as_ptr(),
            flags | libc::O_CLOEXEC | libc::O_NOFOLLOW,
            mode as libc::c_uint,
        )
    })?;
    // SAFETY: fresh fd.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The names in directory `dir` (without `.` and `..`), read through a new
/// descriptor of that same directory (`openat(dir, ".")`), so no path is looked
/// up again.
pub fn read_dir_names(dir: BorrowedFd<'_>) -> io::Result<Vec<CString>> {
    let own = openat_nofollow(dir, c".", libc::O_RDONLY | libc::O_DIRECTORY, 0)?;
    let raw = own.into_raw_fd();
    // SAFETY: `raw` is an open directory descriptor we own; on success the
    // stream owns it (closedir closes it).
    let d = unsafe { libc::fdopendir(raw) };
    if d.is_null() {
        let e = io::Error::last_os_error();
        // SAFETY: fdopendir failed, so `raw` is still ours to close.
        drop(unsafe { OwnedFd::from_raw_fd(raw) });
        return Err(e);
    }
    let mut names = Vec::new();
    let result = loop {
        // SAFETY: errno is thread-local; zeroing it tells an error from the end.
        unsafe { *libc::__errno_location() = 0 };
        // SAFETY: `d` is an open directory stream.
        let e = unsafe { libc::readdir64(d) };
        if e.is_null() {
            let err = io::Error::last_os_error();
            break match err.raw_os_error() {
                Some(0) | None => Ok(()),
                Some(_) => Err(err),
            };
        }
        // SAFETY: readdir returned an entry whose `d_name` is NUL-terminated and
        // valid until the next readdir on `d`; it is copied out at once.
        let name = unsafe { CStr::from_ptr((*e).d_name.as_ptr()) };
        if name != c"." && name != c".." {
            names.push(name.to_owned());
        }
    };
    // SAFETY: `d` is open and closed once here.
    unsafe { libc::closedir(d) };
    result.map(|()| names)
}

/// `readlinkat(dir, name)`: the target of link `name` in `dir`.
pub fn readlinkat(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<CString> {
    let mut buf = vec![0u8; libc::PATH_MAX as usize + 1];
    // SAFETY: valid fd and C string; `buf` is writable for its length.
    let n = unsafe {
        libc::readlinkat(
            dir.as_raw_fd(),
            name.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let n = n as usize;
    if n >= buf.len() {
        return Err(io::Error::from_raw_os_error(libc::ENAMETOOLONG));
    }
    buf.truncate(n);
    CString::new(buf).map_err(|_| io::ErrorKind::InvalidData.into())
}

/// `symlinkat(target, dir, name)`.
pub fn symlinkat(target: &CStr, dir: BorrowedFd<'_>, name: &CStr) -> io::Result<()> {
    // SAFETY: valid C strings and fd.
    cvt(unsafe { libc::symlinkat(target.as_ptr(), dir.as_raw_fd(), name.as_ptr()) })?;
    Ok(())
}

/// `linkat(fd, "", dir, name, AT_EMPTY_PATH)`: a new name for the file `fd`
/// refers to (needs `CAP_DAC_READ_SEARCH`).
pub fn link_fd_at(fd: BorrowedFd<'_>, dir: BorrowedFd<'_>, name: &CStr) -> io::Result<()> {
    // SAFETY: valid fds and C strings; the empty path with AT_EMPTY_PATH names
    // the file `fd` refers to.
    cvt(unsafe {
        libc::linkat(
            fd.as_raw_fd(),
            c"".as_ptr(),
            dir.as_raw_fd(),
            name.as_ptr(),
            libc::AT_EMPTY_PATH,
        )
    })?;
    Ok(())
}

/// `fchownat(dir, name, uid, gid, AT_SYMLINK_NOFOLLOW)`.
pub fn lchownat(dir: BorrowedFd<'_>, name: &CStr, uid: u32, gid: u32) -> io::Result<()> {
    // SAFETY: valid fd and C string.
    cvt(unsafe {
        libc::fchownat(
            dir.as_raw_fd(),
            name.as_ptr(),
            uid,
            gid,
            libc::AT_SYMLINK_NOFOLLOW,
        )
    })?;
    Ok(())
}

/// `utimensat(dir, name, times, AT_SYMLINK_NOFOLLOW)`, or of `dir` itself
/// (`futimens`) when `name` is `None`: access and modification times.
pub fn set_times_at(
    dir: BorrowedFd<'_>,
    name: Option<&CStr>,
    times: &[libc::timespec; 2],
) -> io::Result<()> {
    match name {
        // SAFETY: valid fd and C string; `times` is two valid timespecs.
        Some(n) => cvt(unsafe {
            libc::utimensat(
                dir.as_raw_fd(),
                n.as_ptr(),
                times.as_ptr(),
                libc::AT_SYMLINK_NOFOLLOW,
            )
        })?,
        // SAFETY: valid fd; `times` is two valid timespecs.
        None => cvt(unsafe { libc::futimens(dir.as_raw_fd(), times.as_ptr()) })?,
    };
    Ok(())
}

/// `lseek(fd, offset, whence)` for `SEEK_DATA`/`SEEK_HOLE`: `None` when there
/// is no data at or past `offset` (`ENXIO`).
pub fn seek_data_or_hole(
    fd: BorrowedFd<'_>,
    offset: u64,
    whence: libc::c_int,
) -> io::Result<Option<u64>> {
    let off = libc::off64_t::try_from(offset)
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: valid fd; no pointers.
    let r = unsafe { libc::lseek64(fd.as_raw_fd(), off, whence) };
    if r < 0 {
        let e = io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::ENXIO) => Ok(None),
            _ => Err(e),
        };
    }
    Ok(Some(r as u64))
}

/// `fchmod(fd, mode)`.
pub fn fchmod(fd: BorrowedFd<'_>, mode: u32) -> io::Result<()> {
    // SAFETY: no pointers.
    cvt(unsafe { libc::fchmod(fd.as_raw_fd(), mode as libc::mode_t) })?;
    Ok(())
}

/// `mknodat` of an overlay whiteout (a character device 0:0) relative to an fd,
/// then its mode set (the umask left out).
pub fn mknod_whiteout_at(dir: BorrowedFd<'_>, name: &CStr, mode: u32) -> io::Result<()> {
    // SAFETY: valid fd and C string; device number 0 (a whiteout).
    cvt(unsafe {
        libc::mknodat(
            dir.as_raw_fd(),
            name.as_ptr(),
            libc::S_IFCHR | (mode & 0o7777),
            0,
        )
    })?;
    // SAFETY: valid fd and C string; the node was just made by this call's caller
    // in its own directory (not a link: fchmodat follows none here).
    cvt(unsafe { libc::fchmodat(dir.as_raw_fd(), name.as_ptr(), mode & 0o7777, 0) })?;
    Ok(())
}

/// The `user.` extended attributes of `from` set on `to` (both open files or
/// directories): at most `max_names` names, values of at most 64 KiB each.
pub fn copy_user_xattrs(
    from: BorrowedFd<'_>,
    to: BorrowedFd<'_>,
    max_names: usize,
) -> io::Result<usize> {
    let mut list = vec![0u8; 64 << 10];
    // SAFETY: valid fd; `list` is writable for its length.
    let n = unsafe { libc::flistxattr(from.as_raw_fd(), list.as_mut_ptr().cast(), list.len()) };
    let n = match cvt_size(n) {
        Ok(n) => n,
        Err(e) if e.raw_os_error() == Some(libc::ENOTSUP) => return Ok(0),
        Err(e) => return Err(e),
    };
    let mut value = vec![0u8; 64 << 10];
    let mut copied = 0;
    for name in list[..n]
        .split(|b| *b == 0)
        .filter(|n| n.starts_with(b"user."))
    {
        if copied == max_names {
            return Err(io::Error::other("too many extended attributes"));
        }
        let c = CString::new(name).map_err(io::Error::other)?;
        // SAFETY: valid fd and C string; `value` is writable for its length.
        let len = unsafe {
            libc::fgetxattr(
                from.as_raw_fd(),
                c.as_ptr(),
                value.as_mut_ptr().cast(),
                value.len(),
            )
        };
        let len = cvt_size(len)?;
        // SAFETY: valid fd and C string; `value[..len]` is initialized.
        cvt(unsafe { libc::fsetxattr(to.as_raw_fd(), c.as_ptr(), value.as_ptr().cast(), len, 0) })?;
        copied += 1;
    }
    Ok(copied)
}

fn cvt_size(n: libc::ssize_t) -> io::Result<usize> {
    usize::try_from(n).map_err(|_| io::Error::last_os_error())
}

/// `mkdirat` relative to an fd.
pub fn mkdirat(dir: BorrowedFd<'_>, name: &CStr, mode: libc::mode_t) -> io::Result<()> {
    // SAFETY: valid fd and C string.
    cvt(unsafe { libc::mkdirat(dir.as_raw_fd(), name.as_ptr(), mode) })?;
    Ok(())
}

/// Creates an empty regular file relative to an fd (no-op if it exists).
pub fn touchat(dir: BorrowedFd<'_>, name: &CStr, mode: libc::mode_t) -> io::Result<()> {
    // SAFETY: valid fd and C string; the returned fd is closed right away.
    let fd = cvt(unsafe {
        libc::openat(
            dir.as_raw_fd(),
            name.as_ptr(),
            libc::O_CREAT | libc::O_WRONLY | libc::O_CLOEXEC | libc::O_NOFOLLOW,
            mode as libc::c_uint,
        )
    })?;
    // SAFETY: fresh fd.
    drop(unsafe { OwnedFd::from_raw_fd(fd) });
    Ok(())
}

/// Creates an empty regular file relative to an fd; `EEXIST` if anything (a link
/// included) is there already.
pub fn create_file_at(dir: BorrowedFd<'_>, name: &CStr, mode: libc::mode_t) -> io::Result<()> {
    // SAFETY: valid fd and C string; the returned fd is closed right away.
    let fd = cvt(unsafe {
        libc::openat(
            dir.as_raw_fd(),
            name.as_ptr(),
            libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY | libc::O_CLOEXEC | libc::O_NOFOLLOW,
            mode as libc::c_uint,
        )
    })?;
    // SAFETY: fresh fd.
    drop(unsafe { OwnedFd::from_raw_fd(fd) });
    Ok(())
}

/// `/proc/self/fd/N`: a path that refers to an open `O_PATH` descriptor.
pub fn fd_path(fd: BorrowedFd<'_>) -> CString {
    CString::new(format!("/proc/self/fd/{}", fd.as_raw_fd())).expect("no NUL")
}

/// Most descriptors one [`send_fds`] message carries.
pub const MAX_PASSED_FDS: usize = 8;

/// Sends `payload` and the descriptors `fds` (at most [`MAX_PASSED_FDS`]) as one
/// message over a Unix socket.
pub fn send_fds(sock: BorrowedFd<'_>, payload: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    if fds.len() > MAX_PASSED_FDS || payload.is_empty() {
        return Err(io::ErrorKind::InvalidInput.into());
    }
    let mut iov = libc::iovec {
        iov_base: payload.as_ptr() as *mut libc::c_void,
        iov_len: payload.len(),
    };
    // Room for MAX_PASSED_FDS descriptors in one control message (8-byte aligned).
    let mut cbuf = [0u64; 8];
    // SAFETY: msghdr is plain old data; zeroed is a valid initial state.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if !fds.is_empty() {
        let data = std::mem::size_of_val(fds) as u32;
        // SAFETY: CMSG_SPACE is a pure computation.
        let space = unsafe { libc::CMSG_SPACE(data) } as usize;
        debug_assert!(space <= std::mem::size_of_val(&cbuf));
        msg.msg_control = cbuf.as_mut_ptr().cast();
        msg.msg_controllen = space;
        // SAFETY: msg_control points to a buffer of at least `space` bytes (64 >= 16 +
        // 8 * 4), so the header and its data fit; the kernel only reads iov_base.
        unsafe {
            let cmsg = libc::CMSG_FIRSTHDR(&msg);
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = libc::SCM_RIGHTS;
            (*cmsg).cmsg_len = libc::CMSG_LEN(data) as usize;
            let dst = libc::CMSG_DATA(cmsg).cast::<RawFd>();
            for (i, fd) in fds.iter().enumerate() {
                std::ptr::write_unaligned(dst.add(i), fd.as_raw_fd());
            }
        }
    }
    loop {
        // SAFETY: msg and everything it points to live for the call.
        let r = unsafe { libc::sendmsg(sock.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
        if r >= 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Receives one message into `buf` with the descriptors it carries (close-on-exec).
/// `Ok(None)` at end of stream.
pub fn recv_fds(sock: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<Option<(usize, Vec<OwnedFd>)>> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let mut cbuf = [0u64; 8];
    // SAFETY: zeroed msghdr is valid.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&cbuf);
    let n = loop {
        // SAFETY: msg points to live buffers.
        let n = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        break n as usize;
    };
    let mut got = Vec::new();
    // SAFETY: we walk the control messages the kernel filled in, within
    // msg_controllen; each SCM_RIGHTS entry is a fresh descriptor now ours.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let count =
                    ((*cmsg).cmsg_len - libc::CMSG_LEN(0) as usize) / std::mem::size_of::<RawFd>();
                let src = libc::CMSG_DATA(cmsg).cast::<RawFd>();
                for i in 0..count {
                    got.push(OwnedFd::from_raw_fd(std::ptr::read_unaligned(src.add(i))));
                }
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
    }
    if n == 0 && got.is_empty() {
        return Ok(None);
    }
    Ok(Some((n, got)))
}

/// `fork(2)`. Only call from a single-threaded process.
pub fn fork() -> io::Result<Fork> {
    // SAFETY: the caller is single-threaded, so the child's copy of the address space
    // holds no lock another thread owned.
    let pid = cvt(unsafe { libc::fork() })?;
    Ok(if pid == 0 {
        Fork::Child
    } else {
        Fork::Parent(pid)
    })
}

/// `dup2(from, to)` without close-on-exec on `to`.
pub fn dup2(from: RawFd, to: RawFd) -> io::Result<()> {
    // SAFETY: no pointers; the kernel validates both numbers.
    cvt(unsafe { libc::dup2(from, to) })?;
    Ok(())
}

/// Sets `FD_CLOEXEC` on descriptor `fd` (one this process was given by number).
pub fn set_cloexec(fd: RawFd) -> io::Result<()> {
    // SAFETY: fcntl on a descriptor number takes no pointers; an invalid one is EBADF.
    let flags = cvt(unsafe { libc::fcntl(fd, libc::F_GETFD) })?;
    // SAFETY: as above.
    cvt(unsafe { libc::fcntl(fd, libc::F_SETFD, flags | libc::FD_CLOEXEC) })?;
    Ok(())
}

/// Sets `O_NONBLOCK` on `fd`.
pub fn set_nonblocking(fd: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: fcntl on a borrowed, open descriptor; no pointers.
    let flags = cvt(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) })?;
    // SAFETY: as above.
    cvt(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK) })?;
    Ok(())
}

/// `fcntl(F_DUPFD_CLOEXEC, min)`: a copy of `fd` numbered at least `min`.
pub fn dup_above(fd: BorrowedFd<'_>, min: RawFd) -> io::Result<OwnedFd> {
    // SAFETY: no pointers; the returned fd is new and owned by us.
    let n = cvt(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, min) })?;
    // SAFETY: fresh fd from the kernel.
    Ok(unsafe { OwnedFd::from_raw_fd(n) })
}

/// Closes every descriptor numbered `first..=last`.
pub fn close_range(first: u32, last: u32) -> io::Result<()> {
    // SAFETY: no pointers; the caller no longer uses any descriptor in the range.
    cvt_long(unsafe { libc::syscall(libc::SYS_close_range, first, last, 0u32) })?;
    Ok(())
}

/// Whether the disposition of `sig` is to ignore it (as `nohup` leaves `SIGHUP`).
pub fn signal_ignored(sig: libc::c_int) -> io::Result<bool> {
    let mut old = std::mem::MaybeUninit::<libc::sigaction>::zeroed();
    // SAFETY: a null new action only reads the current one into `old`, a valid,
    // writable `sigaction`.
    cvt(unsafe { libc::sigaction(sig, std::ptr::null(), old.as_mut_ptr()) })?;
    // SAFETY: sigaction succeeded and filled `old` (it was zeroed too).
    Ok(unsafe { old.assume_init() }.sa_sigaction == libc::SIG_IGN)
}

/// Sets the disposition of `sig` to ignore (`ignore`) or the default.
pub fn set_signal_ignored(sig: libc::c_int, ignore: bool) -> io::Result<()> {
    let h = if ignore { libc::SIG_IGN } else { libc::SIG_DFL };
    // SAFETY: SIG_IGN and SIG_DFL are valid dispositions; no handler code runs.
    if unsafe { libc::signal(sig, h) } == libc::SIG_ERR {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The user and system CPU time of this process's children that it has waited
/// for, and of their own waited-for descendants (`getrusage(RUSAGE_CHILDREN)`).
pub fn reaped_children_cpu() -> io::Result<std::time::Duration> {
    rusage_cpu(libc::RUSAGE_CHILDREN)
}

/// The user and system CPU time of this process, all its threads
/// (`getrusage(RUSAGE_SELF)`).
pub fn own_cpu() -> io::Result<std::time::Duration> {
    rusage_cpu(libc::RUSAGE_SELF)
}

fn rusage_cpu(who: libc::c_int) -> io::Result<std::time::Duration> {
    let mut ru = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: `ru` is a valid, writable `rusage`; the kernel fills it in.
    cvt(unsafe { libc::getrusage(who, ru.as_mut_ptr()) })?;
    // SAFETY: getrusage succeeded, so the struct is initialised (it was zeroed too).
    let ru = unsafe { ru.assume_init() };
    let tv = |t: libc::timeval| {
        std::time::Duration::from_secs(t.tv_sec as u64)
            + std::time::Duration::from_micros(t.tv_usec as u64)
    };
    Ok(tv(ru.ru_utime) + tv(ru.ru_stime))
}

/// A new eventfd (close-on-exec, non-blocking), counter 0.
pub fn eventfd() -> io::Result<OwnedFd> {
    // SAFETY: eventfd takes no pointers; a non-negative result is a new descriptor
    // only this call owns.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh descriptor nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Waits up to `timeout_ms` for `events` on `fd`; the events that came (empty on
/// timeout or an interruption).
pub fn poll_one(
    fd: BorrowedFd<'_>,
    events: libc::c_short,
    timeout_ms: i32,
) -> io::Result<libc::c_short> {
    let mut p = libc::pollfd {
        fd: fd.as_raw_fd(),
        events,
        revents: 0,
    };
    // SAFETY: `p` is one valid pollfd for the call's duration; `fd` is borrowed,
    // so open throughout.
    let r = unsafe { libc::poll(&mut p, 1, timeout_ms) };
    if r < 0 {
        let e = io::Error::last_os_error();
        return if e.kind() == io::ErrorKind::Interrupted {
            Ok(0)
        } else {
            Err(e)
        };
    }
    Ok(if r == 0 { 0 } else { p.revents })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rewritten_command_line_fits_the_area_and_ends_in_nul() {
        assert_eq!(
            cmdline_bytes(&["sandlot", "__init"], 20),
            b"sandlot\0__init\0\0\0\0\0\0"
        );
        // Cut to the area, still NUL-terminated.
        assert_eq!(cmdline_bytes(&["sandlot", "__init"], 10), b"sandlot\0_\0");
        assert_eq!(cmdline_bytes(&["x"], 1), b"\0");
    }

    #[test]
    fn proc_stat_fields_survive_odd_command_names() {
        let line = "42 (a) b (c) S 1 42 42 0 -1 4194624 100 0 0 0 1 2 0 0 20 0 1 0 12345 1000 50";
        let st = ProcStat::parse(line).unwrap();
        assert_eq!(st.state(), 'S');
        assert_eq!(st.field(4).unwrap(), 1);
        assert_eq!(st.field(9).unwrap(), 4194624);
        assert_eq!(st.start_time().unwrap(), 12345);
        assert!(!st.exiting());
        let exiting = line.replace("4194624", &(4194624 | PF_EXITING).to_string());
        assert!(ProcStat::parse(&exiting).unwrap().exiting());
        assert!(ProcStat::parse(&line.replace(") S ", ") Z "))
            .unwrap()
            .exiting());
        assert!(st.field(60).is_err());
        let me = ProcStat::read(None).unwrap();
        assert!(!me.exiting());
        assert!(me.start_time().unwrap() > 0);
    }

    #[test]
    fn the_argument_area_is_found() {
        let (start, end) = arg_area(&ProcStat::read(None).unwrap()).unwrap();
        let mem = std::fs::read(format!("/proc/{}/cmdline", std::process::id())).unwrap();
        assert_eq!((end - start) as usize, mem.len());
    }
}
