//! New network namespaces for the network service (`sandlot-net`), which builds each
//! sandbox's network ahead of time: the unsafe `unshare` stays in this crate.

use std::io;

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
