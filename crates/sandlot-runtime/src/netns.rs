//! Network namespaces made by the runtime: new ones for the network service
//! (`sandlot-net`), which builds each sandbox's network ahead of time, and a stock
//! of loopback-only ones for sandboxes with network `none` ([`NetnsStock`]). The
//! unsafe `unshare` and `setns` stay in this crate.

use std::io;
use std::os::fd::{BorrowedFd, OwnedFd};

use crate::stock::Stock;

/// Runs `f` on a fresh thread that has just moved into a new, empty network
/// namespace (only a down `lo`), and returns what it returns. The namespace lives
/// as long as something holds it: `f` typically bind-mounts
/// `/proc/thread-self/ns/net` somewhere or opens sockets in it. The calling thread's
/// namespace is untouched.
pub fn in_new_network_namespace<T, F>(f: F) -> io::Result<T>
where
    F: FnOnce() -> T + Send,
    T: Send,
{
    std::thread::scope(|s| {
        s.spawn(|| -> io::Result<T> {
            crate::sys::unshare_network()?;
            Ok(f())
        })
        .join()
        .unwrap_or_else(|_| Err(io::Error::other("network namespace thread panicked")))
    })
}

/// Runs `f` on a fresh thread that has joined the network namespace `ns`.
pub fn in_network_namespace<T, F>(ns: BorrowedFd<'_>, f: F) -> io::Result<T>
where
    F: FnOnce() -> T + Send,
    T: Send,
{
    std::thread::scope(|s| {
        s.spawn(|| -> io::Result<T> {
            crate::sys::setns_net(ns)?;
            Ok(f())
        })
        .join()
        .unwrap_or_else(|_| Err(io::Error::other("network namespace thread panicked")))
    })
}

/// Sysctls of a stocked namespace: its owner is the host's user namespace, so the
/// sandbox's root holds no capability over it; binding a port below 1024 must then
/// need none (as in a namespace of the sandbox's own, where root may).
const LOOPBACK_SYSCTLS: &[(&str, &str)] = &[("net/ipv4/ip_unprivileged_port_start", "0")];

/// A new network namespace with only `lo`, up; the returned descriptor holds it.
pub fn loopback_namespace() -> io::Result<OwnedFd> {
    in_new_network_namespace(|| -> io::Result<OwnedFd> {
        for (k, v) in LOOPBACK_SYSCTLS {
            std::fs::write(format!("/proc/sys/{k}"), v)?;
        }
        crate::sys::loopback_up()?;
        Ok(std::fs::File::open("/proc/thread-self/ns/net")?.into())
    })?
}

/// A small stock of loopback-only network namespaces made ahead of time.
///
/// A sandbox with network `none` used to get its namespace from `clone(CLONE_NEWNET)`
/// on the create path: about 1 ms of kernel work per create on the development
/// machine, the dearest namespace. A background thread keeps a few ready; a create
/// takes one (its init joins it, as with the network service's slots), and falls
/// back to `CLONE_NEWNET` when the stock is empty. A namespace is never reused:
/// a stocked one has held no process, and each is handed out once. Nothing of the
/// stock is visible on the host (no `/run/netns` name): the descriptors are its only
/// references, so the namespaces go with the stock or the process.
pub struct NetnsStock {
    stock: Stock<OwnedFd>,
}

impl NetnsStock {
    /// Starts a stock of `want` namespaces, or `None` for `want` 0.
    pub fn start(want: usize) -> Option<NetnsStock> {
        let stock = Stock::start("netns-stock", want, || loopback_namespace().ok())?;
        Some(NetnsStock { stock })
    }

    /// A stocked namespace, or `None` if the stock is empty right now.
    pub fn take(&self) -> Option<OwnedFd> {
        self.stock.take()
    }

    /// Namespaces ready now.
    pub fn ready(&self) -> usize {
        self.stock.ready()
    }
}

/// The inode of the network namespace `ns` (to tell namespaces apart).
pub fn namespace_inode(ns: BorrowedFd<'_>) -> io::Result<u64> {
    use std::os::unix::fs::MetadataExt;
    let f = std::fs::File::from(ns.try_clone_to_owned()?);
    Ok(f.metadata()?.ino())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn no_stock_when_not_wanted() {
        assert!(NetnsStock::start(0).is_none());
    }

    #[test]
    fn namespace_inode_reads_an_fd() {
        let f = std::fs::File::open("/proc/self/ns/net").unwrap();
        assert!(namespace_inode(f.as_fd()).unwrap() > 0);
    }
}
