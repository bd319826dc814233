//! The fork server: one `sandlot __zygote` process, exec'd once by a long-lived host
//! process (the daemon), forks a fresh `__init` helper for each sandbox instead of the
//! host exec'ing the `sandlot` binary every time.
//!
//! Why: exec'ing a large position-independent binary makes the dynamic loader write
//! every relocated pointer of its read-only-after-relocation data, about 0.7 MiB of
//! private memory in each sandbox's PID 1 and ~1 ms of work per create. Forked from a
//! process that did that once, the pages stay shared (they are never written again).
//!
//! The zygote is single-threaded, holds nothing but its socket to the host, and exits
//! when the host closes it (host exit or crash included). Per create, the host sends
//! one message: a flags byte and the helper's descriptors (see [`HelperFds`]); the
//! zygote forks, the child puts them where `sandlot __init` expects them
//! ([`crate::plan::fds`]) and runs [`crate::init::main`]; the zygote answers with the
//! child's pid. Children are reaped by the kernel (`SIGCHLD` ignored); a sandbox's
//! PID 1, orphaned when its helper exits, is re-parented to the host, the subreaper.
//!
//! Its own mount namespace (`own_mount_ns`): `CLONE_NEWNS` copies every mount of
//! the namespace it is called in, and PID 1 detaches them all again after
//! `pivot_root`: about 8 µs per host mount and create, measured here. The host
//! holds one bind mount per network slot under `/run/netns`, so with a thousand
//! `allow` sandboxes every create copied a thousand mounts (7.9 → 15.9 ms per
//! create). The fork server therefore works in a copy of the host's mount
//! namespace, made when it starts, without `/run/netns` (a slave copy: our unmount
//! does not reach the host, and on hosts whose mounts are shared, later host mounts
//! still arrive). A sandbox whose plan uses host paths that may be mounts made
//! since (an image's writable layer, spec mounts, volumes, collections: see
//! [`crate::mounts::MountPlan::needs_host_mounts`]) gets a helper in the host's own
//! namespace, so a mount made on the host since the fork server started is seen.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, FromRawFd, OwnedFd};
use std::path::Path;
use std::process::{Child, Command, Stdio};

use crate::etc_view::EtcView;
use crate::init::AgentMain;
use crate::plan::fds;
use crate::sys;

const HAS_LIFELINE: u8 = 1;
const HAS_NETNS: u8 = 2;
/// The sandbox uses the `host` image's `/etc` view: clone one for its helper.
const WANTS_ETC_VIEW: u8 = 4;
/// The plan uses host mounts: run the helper in the host's mount namespace.
const HOST_MOUNTS: u8 = 8;
/// The argument that gives the fork server a mount namespace of its own.
const OWN_MOUNT_NS: &str = "--own-mount-ns";

/// The descriptors of one `__init` helper.
pub struct HelperFds<'a> {
    pub plan: BorrowedFd<'a>,
    pub status: BorrowedFd<'a>,
    pub stderr: BorrowedFd<'a>,
    pub slot: BorrowedFd<'a>,
    pub alive: BorrowedFd<'a>,
    pub lifeline: Option<BorrowedFd<'a>>,
    pub netns: Option<BorrowedFd<'a>>,
    /// Pass the fork server's `/etc` view, if it has one (the plan has a
    /// [`crate::mounts::MountOp::HostEtc`]); a copy nobody attaches would cost
    /// an unmount of the whole copy when it is closed.
    pub wants_etc_view: bool,
    /// The plan uses host mounts (an image's writable layer, binds of host paths
    /// beyond the `host` image's): the helper joins the host's mount namespace (see
    /// the module documentation).
    pub host_mounts: bool,
}

/// The host's handle on its fork server.
pub struct Zygote {
    /// `None` only while dropping.
    sock: Option<OwnedFd>,
    child: Child,
}

impl Zygote {
    /// Starts `exe __zygote`. With `etc_view_at` (a directory, normally the run
    /// directory), the fork server prepares the `host` image's `/etc` view over it
    /// in a private mount namespace (see [`crate::etc_view`]).
    pub fn start(exe: &Path, etc_view_at: Option<&Path>, own_mount_ns: bool) -> io::Result<Zygote> {
        let (mine, theirs) = sys::socketpair()?;
        let mut cmd = Command::new(exe);
        cmd.arg("__zygote");
        if own_mount_ns {
            cmd.arg(OWN_MOUNT_NS);
        }
        if let Some(at) = etc_view_at {
            cmd.arg(at);
        }
        let child = cmd
            .env_clear()
            .stdin(Stdio::from(theirs))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        crate::orphans::protect(child.id() as i32);
        Ok(Zygote {
            sock: Some(mine),
            child,
        })
    }

    /// Has it fork a helper with these descriptors; returns the helper's pid and
    /// whether the helper holds the `/etc` view at [`fds::ETC_VIEW`].
    pub fn spawn(&self, f: &HelperFds<'_>) -> io::Result<(i32, bool)> {
        let mut flags = 0;
        let mut list = vec![f.plan, f.status, f.stderr, f.slot, f.alive];
        if let Some(l) = f.lifeline {
            flags |= HAS_LIFELINE;
            list.push(l);
        }
        if let Some(n) = f.netns {
            flags |= HAS_NETNS;
            list.push(n);
        }
        if f.wants_etc_view {
            flags |= WANTS_ETC_VIEW;
        }
        if f.host_mounts {
            flags |= HOST_MOUNTS;
        }
        let sock = self.sock.as_ref().expect("open until dropped").as_fd();
        sys::send_fds(sock, &[flags], &list)?;
        let mut buf = [0u8; 512];
        let Some((n, _)) = sys::recv_fds(sock, &mut buf)? else {
            return Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "the fork server exited",
            ));
        };
        match buf[..n].split_first() {
            Some((b'p', rest)) if rest.len() == 5 => Ok((
                i32::from_le_bytes(rest[..4].try_into().expect("4 bytes")),
                rest[4] == 1,
            )),
            Some((b'e', msg)) => Err(io::Error::other(format!(
                "fork server: {}",
                String::from_utf8_lossy(msg)
            ))),
            _ => Err(io::Error::other("fork server: malformed answer")),
        }
    }
}

impl Drop for Zygote {
    fn drop(&mut self) {
        // Closing our end makes it exit; reap it (unless the host reaped it already).
        drop(self.sock.take());
        let _ = self.child.wait();
        crate::orphans::unprotect(self.child.id() as i32);
    }
}

/// Entry point of `sandlot __zygote [ETC_VIEW_DIR]`: fd 0 is the host's socket.
/// Never returns.
pub fn main(agent: AgentMain) -> ! {
    // SAFETY: the host passed its socket as fd 0; nothing else owns it.
    let sock = unsafe { OwnedFd::from_raw_fd(0) };
    if sys::set_signal_ignored(libc::SIGCHLD, true).is_err() {
        sys::exit_now(1);
    }
    let mut args: Vec<std::ffi::OsString> = std::env::args_os().skip(2).collect();
    // The host's namespace, kept for helpers that bind host paths; `None` when the
    // fork server stays in it (not asked to leave, or leaving failed).
    let host_ns = if args.first().is_some_and(|a| a == OWN_MOUNT_NS) {
        args.remove(0);
        leave_host_mount_ns()
    } else {
        None
    };
    let view_at = args.first().map(std::path::PathBuf::from);
    // Without a view (an old kernel, no directory given) each sandbox binds the
    // entries itself, as `sandlot run` does.
    let mut view = view_at.as_deref().and_then(|at| EtcView::build(at).ok());
    loop {
        let mut buf = [0u8; 4];
        let (n, fds) = match sys::recv_fds(sock.as_fd(), &mut buf) {
            Ok(Some(m)) => m,
            // The host is gone.
            Ok(None) | Err(_) => sys::exit_now(0),
        };
        let wants_view = buf[..n].first().is_some_and(|f| f & WANTS_ETC_VIEW != 0);
        if wants_view && view.as_ref().is_some_and(|v| !v.is_current()) {
            // The host replaced a bound entry: rebuild (or fall back to binds).
            view = view_at.as_deref().and_then(|at| EtcView::build(at).ok());
        }
        let tree = view
            .as_ref()
            .filter(|_| wants_view)
            .and_then(|v| v.clone_tree().ok());
        let has_view = u8::from(tree.is_some());
        let answer = match fork_helper(&buf[..n], fds, tree, host_ns.as_ref(), agent) {
            Ok(pid) => [&[b'p'][..], &pid.to_le_bytes(), &[has_view]].concat(),
            Err(e) => [&[b'e'][..], e.to_string().as_bytes()].concat(),
        };
        if sys::send_fds(sock.as_fd(), &answer, &[]).is_err() {
            sys::exit_now(0);
        }
    }
}

/// Where each received descriptor goes in the helper.
fn targets(flags: u8) -> Vec<i32> {
    let mut t = vec![fds::PLAN, fds::STATUS, 2, fds::SLOT_LOCK, fds::ALIVE_LOCK];
    if flags & HAS_LIFELINE != 0 {
        t.push(fds::LIFELINE);
    }
    if flags & HAS_NETNS != 0 {
        t.push(fds::NETNS);
    }
    t
}

/// Moves the fork server into a slave copy of the host's mount namespace without
/// `/run/netns` (see the module documentation). Returns the host's namespace, or
/// `None` (still in the host's) if any step fails.
fn leave_host_mount_ns() -> Option<OwnedFd> {
    let host: OwnedFd = std::fs::File::open("/proc/self/ns/mnt").ok()?.into();
    sys::unshare_mount_ns().ok()?;
    // Slave first: unmounting a copy of a shared mount must not unmount the host's.
    let own = sys::mount(None, c"/", None, libc::MS_REC | libc::MS_SLAVE, None)
        .and_then(|()| leave_stacked_mounts(c"/run/netns"));
    match own {
        Ok(()) => Some(host),
        Err(_) => {
            if sys::setns_mnt(host.as_fd()).is_err() {
                sys::exit_now(1);
            }
            None
        }
    }
}

/// Unmounts every mount stacked on `path` (two `ip netns add` or daemons racing to
/// make it a mount point each bind it onto itself, and one unmount takes off only
/// the top one). Bounded: a path that stays a mount point after that many is an
/// error.
fn leave_stacked_mounts(path: &std::ffi::CStr) -> io::Result<()> {
    const MOST: usize = 64;
    for _ in 0..MOST {
        match sys::umount2(path, libc::MNT_DETACH) {
            Ok(()) => {}
            // Not a mount point (any more), or not there: nothing left behind.
            Err(e) if matches!(e.raw_os_error(), Some(libc::EINVAL | libc::ENOENT)) => {
                return Ok(())
            }
            Err(e) => return Err(e),
        }
    }
    Err(io::Error::other("more than 64 mounts stacked on one path"))
}

fn fork_helper(
    msg: &[u8],
    mut received: Vec<OwnedFd>,
    view: Option<OwnedFd>,
    host_ns: Option<&OwnedFd>,
    agent: AgentMain,
) -> io::Result<i32> {
    let [flags] = msg else {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "bad request"));
    };
    let mut targets = targets(*flags);
    if received.len() != targets.len() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "expected {} descriptors, got {}",
                targets.len(),
                received.len()
            ),
        ));
    }
    if let Some(v) = view {
        received.push(v);
        targets.push(fds::ETC_VIEW);
    }
    match sys::fork()? {
        sys::Fork::Child => {
            let to_host = host_ns.filter(|_| flags & HOST_MOUNTS != 0);
            if to_host.is_some_and(|ns| sys::setns_mnt(ns.as_fd()).is_err()) {
                sys::exit_now(1);
            }
            let received: Vec<BorrowedFd<'_>> = received.iter().map(|f| f.as_fd()).collect();
            if become_helper(&received, &targets).is_err() {
                sys::exit_now(1);
            }
            crate::init::main(agent)
        }
        sys::Fork::Parent(pid) => Ok(pid),
    }
}

/// Forks the `__init` helper from this process itself, the way the fork server
/// forks it from its own: for a process that makes one sandbox and then only
/// serves it (`sandlot run`), where starting a fork server would cost the exec it
/// saves. The exec of the binary that this replaces loads and relocates it again
/// (see the module documentation). The child clears its environment and overwrites
/// the strings it inherited ([`sys::clear_environment`]), so PID 1 holds none of
/// the caller's environment, as an exec'd helper's cleared one; it then runs
/// exactly the code an exec'd helper runs, under the name `sandlot __init`, with
/// `plan` as the child's copy of this process's memory holds it instead of read
/// back from the plan pipe (no serializing, no parsing).
///
/// `Ok(None)`: this process runs more than one thread, so a fork is unsafe; the
/// caller execs the helper instead. An `/etc` view is never passed (`f` asking
/// for one is refused the same way): only the fork server has one.
pub(crate) fn fork_helper_here(
    f: &HelperFds<'_>,
    plan: &crate::plan::SandboxPlan,
    agent: AgentMain,
) -> io::Result<Option<i32>> {
    // A helper forked here is in this process's mount namespace, as an exec'd one
    // would be, so `host_mounts` needs nothing.
    if f.wants_etc_view || !sys::single_threaded() {
        return Ok(None);
    }
    let mut flags = 0;
    let mut list = vec![f.plan, f.status, f.stderr, f.slot, f.alive];
    if let Some(l) = f.lifeline {
        flags |= HAS_LIFELINE;
        list.push(l);
    }
    if let Some(n) = f.netns {
        flags |= HAS_NETNS;
        list.push(n);
    }
    let targets = targets(flags);
    match sys::fork()? {
        sys::Fork::Child => {
            // Nothing of the caller's may run in the child: a panic ends it here
            // instead of unwinding into the caller's code.
            let _ = std::panic::catch_unwind(|| {
                if become_helper(&list, &targets).is_err() || sys::clear_environment().is_err() {
                    sys::exit_now(1);
                }
                crate::init::main_with_plan(plan, "__init", agent)
            });
            sys::exit_now(1)
        }
        sys::Fork::Parent(pid) => Ok(Some(pid)),
    }
}

/// In the forked child: the descriptors at their numbers, nothing else open, the
/// signal dispositions of a fresh exec.
fn become_helper(received: &[BorrowedFd<'_>], targets: &[i32]) -> io::Result<()> {
    sys::set_signal_ignored(libc::SIGCHLD, false)?;
    // First out of the way (received numbers may collide with targets), then in place.
    let moved: Vec<OwnedFd> = received
        .iter()
        .map(|f| sys::dup_above(f.as_fd(), 100))
        .collect::<io::Result<_>>()?;
    sys::close_range(3, 99)?;
    for (m, t) in moved.iter().zip(targets) {
        sys::dup2(std::os::fd::AsRawFd::as_raw_fd(m), *t)?;
    }
    sys::close_range(100, u32::MAX)?;
    // Closed just above (the received ones by the first close_range).
    std::mem::forget(moved);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptors_land_where_init_expects_them() {
        assert_eq!(targets(0), vec![0, 1, 2, 4, 5]);
        assert_eq!(targets(HAS_LIFELINE | HAS_NETNS), vec![0, 1, 2, 4, 5, 3, 6]);
        assert_eq!(targets(HAS_NETNS), vec![0, 1, 2, 4, 5, 6]);
    }
}
