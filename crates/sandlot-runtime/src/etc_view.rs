//! The `host` image's `/etc` view: the allow-listed host `/etc` entries
//! ([`crate::hostimage::ETC_ALLOW`]), bound read-only once into a small read-only
//! tmpfs by the fork server, then handed to each sandbox as one detached copy of that
//! tree ([`EtcView::clone_tree`]).
//!
//! Why: binding some thirty entries one by one costs four syscalls and a mount
//! attach each in every create (about a third of a cold create's mount work). A
//! recursive clone of a prepared tree is one syscall, and attaching it one more; the
//! sandbox's `/etc` stays a writable directory of its own whose entries are symlinks
//! into the view ([`crate::mounts::MountOp::HostEtc`]).
//!
//! Where it lives: in a private mount namespace of the fork server's own making,
//! mounted over a directory there (the runtime's run directory), so nothing appears
//! on the host and nothing outlives the fork server: the namespace is held only by
//! a descriptor and dies with it. The fork server joins that namespace only for the
//! `open_tree` of each clone and returns to the host's at once, so the helpers it
//! forks see the host's mounts as they are now.
//!
//! Freshness: a bound file whose inode the host replaced (`ldconfig` renames a new
//! `ld.so.cache` into place) would stay visible through the old bind. Before each
//! clone the fork server compares the device and inode of every bound host entry
//! ([`EtcView::is_current`], ~30 `stat`s) and rebuilds the view when one changed.
//!
//! Safety of sharing: every sandbox's copy is a mount of the same tmpfs superblock,
//! so that superblock is remounted read-only after it is populated. Making it
//! writable again needs `CAP_SYS_ADMIN` in the user namespace that owns it, the
//! host's, which no sandbox has; the binds inside are read-only host files as before.

use std::ffi::CString;
use std::fs;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use crate::hostimage::{HostEntry, HostFacts};
use crate::{mounts, sys};

/// A prepared `/etc` view (see the module docs).
pub struct EtcView {
    host_ns: OwnedFd,
    view_ns: OwnedFd,
    at: CString,
    /// `(host path, device, inode)` of each bound entry, as bound.
    bound: Vec<(String, u64, u64)>,
}

fn own_mount_ns() -> io::Result<OwnedFd> {
    Ok(fs::File::open("/proc/self/ns/mnt")?.into())
}

impl EtcView {
    /// Builds the view of the host's `/etc` entries in a new private mount namespace,
    /// over the directory `at` there. The caller must be single-threaded and host
    /// root; it is back in its own mount namespace when this returns.
    pub fn build(at: &Path) -> io::Result<EtcView> {
        let at_c = sys::cstr(at)?;
        let host_ns = own_mount_ns()?;
        sys::unshare_mount_ns()?;
        let built = populate(&at_c).and_then(|bound| Ok((own_mount_ns()?, bound)));
        return_home(host_ns.as_fd());
        let (view_ns, bound) = built?;
        Ok(EtcView {
            host_ns,
            view_ns,
            at: at_c,
            bound,
        })
    }

    /// Whether every bound host entry is still the file or directory that was bound.
    pub fn is_current(&self) -> bool {
        self.bound.iter().all(|(path, dev, ino)| {
            fs::metadata(path).is_ok_and(|m| m.dev() == *dev && m.ino() == *ino)
        })
    }

    /// A detached, read-only copy of the view, ready for `move_mount`.
    pub fn clone_tree(&self) -> io::Result<OwnedFd> {
        sys::setns_mnt(self.view_ns.as_fd())?;
        let tree = sys::open_tree_clone(&self.at);
        return_home(self.host_ns.as_fd());
        tree
    }
}

/// Joins the host's mount namespace again. A process left in the view's namespace
/// would fork helpers that miss the host's later mounts, so failing that (which
/// takes memory exhaustion: we were just there) ends the process; the host starts a
/// new fork server.
fn return_home(host_ns: std::os::fd::BorrowedFd<'_>) {
    if sys::setns_mnt(host_ns).is_err() {
        sys::exit_now(1);
    }
}

/// In the new mount namespace: a tmpfs over `at`, each allow-listed host entry bound
/// read-only into it, then the tmpfs itself made read-only.
fn populate(at: &CString) -> io::Result<Vec<(String, u64, u64)>> {
    // Nothing done here may propagate to the host.
    sys::mount(None, c"/", None, libc::MS_REC | libc::MS_PRIVATE, None)?;
    let flags = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
    sys::mount(
        Some(c"tmpfs"),
        at,
        Some(c"tmpfs"),
        flags,
        Some(c"size=64k,nr_inodes=1024,mode=755"),
    )?;
    let root = sys::open_path(at, false)?;
    let mut bound = Vec::new();
    for (name, kind) in HostFacts::probe(Path::new("/")).etc {
        if matches!(kind, HostEntry::Symlink(_)) {
            continue;
        }
        let host = format!("/etc/{name}");
        let Ok(md) = fs::metadata(&host) else {
            continue;
        };
        let kind = if md.is_dir() {
            mounts::Kind::Dir
        } else {
            mounts::Kind::File
        };
        mounts::bind_in(
            &root,
            Path::new(&host),
            &format!("/{name}"),
            true,
            kind,
            false,
        )
        .map_err(io::Error::other)?;
        bound.push((host, md.dev(), md.ino()));
    }
    // The superblock read-only: no sandbox can make it writable (see the module docs).
    sys::mount(
        None,
        at,
        None,
        libc::MS_REMOUNT | libc::MS_RDONLY | flags,
        None,
    )?;
    Ok(bound)
}
