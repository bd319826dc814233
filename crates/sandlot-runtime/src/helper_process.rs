//! Process set-up for the daemon's long-lived helper processes (the collection mount
//! helper, `sandlot __vfs-serve`): descriptors they must not inherit, and the stop
//! signals they take synchronously. The unsafe calls stay in this crate.

use std::io;
use std::time::Duration;

/// Closes every descriptor above 2: a helper that outlives the daemon must hold none
/// of its descriptors (a listening socket, the data directory's lock) should one lack
/// close-on-exec. Call it before the process opens anything of its own.
pub fn close_inherited_descriptors() -> io::Result<()> {
    crate::sys::close_range(3, u32::MAX)
}

/// SIGTERM, SIGINT and SIGHUP, blocked in the thread that made this (and in the
/// threads it starts afterwards, which inherit the mask), to be taken with
/// [`StopSignals::wait`].
pub struct StopSignals {
    set: libc::sigset_t,
}

impl StopSignals {
    /// Blocks the stop signals in the calling thread.
    pub fn block() -> io::Result<StopSignals> {
        // SAFETY: sigset_t is plain data; sigemptyset initialises it before any use.
        let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
        // SAFETY: `set` is a valid sigset_t owned by this frame and the signal
        // numbers are valid; pthread_sigmask only reads `set` and changes this
        // thread's mask.
        let r = unsafe {
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGTERM);
            libc::sigaddset(&mut set, libc::SIGINT);
            libc::sigaddset(&mut set, libc::SIGHUP);
            libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut())
        };
        if r != 0 {
            return Err(io::Error::from_raw_os_error(r));
        }
        Ok(StopSignals { set })
    }

    /// A stop signal, if one arrives within `timeout`.
    pub fn wait(&self, timeout: Duration) -> Option<i32> {
        let ts = libc::timespec {
            tv_sec: timeout.as_secs() as libc::time_t,
            tv_nsec: timeout.subsec_nanos() as libc::c_long,
        };
        // SAFETY: `set` and `ts` are valid for the call; a null siginfo is allowed.
        let r = unsafe { libc::sigtimedwait(&self.set, std::ptr::null_mut(), &ts) };
        (r > 0).then_some(r)
    }
}

/// Moves the calling process (single-threaded) into a new, empty network namespace
/// (only a loopback interface, down): abstract Unix sockets and TCP and UDP ports of
/// the host's namespace, the daemon's among them, are out of its reach. Needs
/// `CAP_SYS_ADMIN`: call it before dropping capabilities.
pub fn leave_network() -> io::Result<()> {
    crate::sys::unshare_network()
}

/// Installs the collection mount helper's seccomp allow-list
/// ([`crate::seccomp::fuse_helper_policy`]) for the calling thread and the threads it
/// starts afterwards: call it while the process has one thread.
pub fn restrict_syscalls() -> io::Result<()> {
    let prog =
        crate::seccomp::compile(&crate::seccomp::fuse_helper_policy()).map_err(io::Error::other)?;
    crate::seccomp::install(&prog).map_err(io::Error::other)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_blocked_stop_signal_is_taken_by_wait() {
        // On a thread of its own: the mask is per thread.
        let got = std::thread::spawn(|| {
            let s = StopSignals::block().unwrap();
            assert_eq!(s.wait(Duration::from_millis(10)), None);
            // SAFETY: tgkill to this very thread, of a signal it blocks.
            unsafe {
                libc::syscall(
                    libc::SYS_tgkill,
                    libc::getpid(),
                    libc::gettid(),
                    libc::SIGHUP,
                )
            };
            s.wait(Duration::from_secs(5))
        })
        .join()
        .unwrap();
        assert_eq!(got, Some(libc::SIGHUP));
    }
}
