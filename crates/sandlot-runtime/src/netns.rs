//! Network namespaces made by the runtime: new ones for the network service
//! (`sandlot-net`), which builds each sandbox's network ahead of time, and a stock
//! of loopback-only ones for sandboxes with network `none` ([`NetnsStock`]). The
//! unsafe `unshare` and `setns` stay in this crate.

use std::io;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

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
    shared: Arc<Shared>,
    thread: Option<std::thread::JoinHandle<()>>,
}

struct Shared {
    want: usize,
    ready: Mutex<Vec<OwnedFd>>,
    wake: Condvar,
    stop: AtomicBool,
}

impl NetnsStock {
    /// Starts a stock of `want` namespaces, or `None` for `want` 0.
    pub fn start(want: usize) -> Option<NetnsStock> {
        if want == 0 {
            return None;
        }
        let shared = Arc::new(Shared {
            want,
            ready: Mutex::new(Vec::new()),
            wake: Condvar::new(),
            stop: AtomicBool::new(false),
        });
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("netns-stock".into())
            .spawn(move || s.refill_loop())
            .ok()?;
        Some(NetnsStock {
            shared,
            thread: Some(thread),
        })
    }

    /// A stocked namespace, or `None` if the stock is empty right now.
    pub fn take(&self) -> Option<OwnedFd> {
        let ns = self.shared.lock().pop();
        self.shared.wake.notify_one();
        ns
    }

    /// Namespaces ready now.
    pub fn ready(&self) -> usize {
        self.shared.lock().len()
    }
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<OwnedFd>> {
        self.ready.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn refill_loop(&self) {
        loop {
            {
                let mut ready = self.lock();
                while ready.len() >= self.want && !self.stop.load(Ordering::SeqCst) {
                    ready = self.wake.wait(ready).unwrap_or_else(|e| e.into_inner());
                }
            }
            if self.stop.load(Ordering::SeqCst) {
                return;
            }
            match loopback_namespace() {
                Ok(ns) => self.lock().push(ns),
                // A host that refuses is served by CLONE_NEWNET, which reports the
                // error itself; try again later.
                Err(_) => std::thread::sleep(Duration::from_secs(1)),
            }
        }
    }
}

impl Drop for NetnsStock {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.shared.wake.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.shared.lock().clear();
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
