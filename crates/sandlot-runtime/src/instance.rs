//! What a running sandbox offers its owner, whatever isolates it: the [`Instance`]
//! trait. The daemon reaches a sandbox only through it (and its [`crate::Backend`]),
//! never through a backend's own types.

use std::collections::BTreeSet;
use std::fmt;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::cgroup::Usage;
use crate::RuntimeError;

/// Sockets made inside a sandbox's network, for the host to connect to a port
/// listening on the sandbox's loopback: IPv4, and IPv6 when the sandbox has it.
/// Both are non-blocking and close-on-exec, not yet connected.
#[derive(Debug)]
pub struct PortSockets {
    pub v4: OwnedFd,
    pub v6: Option<OwnedFd>,
}

/// How the host reaches a port listening inside a sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PortAccess {
    /// Through sockets made inside the sandbox's network
    /// ([`Instance::port_sockets`]).
    Sockets,
    /// Through a process started in the sandbox (through its agent) that connects
    /// to the port on the sandbox's loopback and relays that one connection over
    /// its standard input and output: this command, with the port as its last
    /// argument. It writes `+` once connected, or exits with
    /// [`PORT_RELAY_REFUSED`] when nothing listens.
    Relay(Vec<String>),
}

/// The exit code of a port relay ([`PortAccess::Relay`]) when nothing listens
/// on the port.
pub const PORT_RELAY_REFUSED: i32 = 3;

/// Where [`Instance::port_sockets`] delivers its sockets (on a thread of the
/// backend's choosing).
pub type PortSocketsReply = Box<dyn FnOnce(io::Result<PortSockets>) + Send>;

/// What a snapshot of a sandbox's files reads besides the writable layer the
/// daemon keeps for it ([`Instance::snapshot_source`]).
#[derive(Debug)]
pub struct SnapshotSource {
    /// Where something is mounted over the sandbox's root filesystem, relative
    /// to its root: the runtime made stubs there to mount on.
    pub mount_points: BTreeSet<PathBuf>,
    /// For a sandbox whose root filesystem is no directory of the daemon's (the
    /// `host` image's root tmpfs): that root, as the host reaches it.
    pub live_root: Option<LiveRoot>,
}

/// A sandbox's root filesystem as the host reads it ([`SnapshotSource`]).
#[derive(Debug)]
pub struct LiveRoot {
    /// The root directory, opened while it was known to be the sandbox's.
    pub dir: File,
    /// The sandbox's user namespace maps (`uid_map`, `gid_map` text) when its
    /// files carry host ids of its range; `None` when they carry the ids as the
    /// sandbox sees them.
    pub id_maps: Option<(String, String)>,
}

/// A sandbox held still, so that its writable layer can be read as one state.
/// Dropping it lets the sandbox run again; [`Stillness::release`] says whether
/// that worked.
pub struct Stillness<'a> {
    release: Option<Box<dyn FnOnce() -> Result<(), RuntimeError> + 'a>>,
}

impl<'a> Stillness<'a> {
    /// A hold that `release` ends.
    pub fn new(release: impl FnOnce() -> Result<(), RuntimeError> + 'a) -> Stillness<'a> {
        Stillness {
            release: Some(Box::new(release)),
        }
    }

    /// Lets the sandbox run again.
    pub fn release(mut self) -> Result<(), RuntimeError> {
        match self.release.take() {
            Some(f) => f(),
            None => Ok(()),
        }
    }
}

impl Drop for Stillness<'_> {
    fn drop(&mut self) {
        if let Some(f) = self.release.take() {
            let _ = f();
        }
    }
}

impl fmt::Debug for Stillness<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Stillness")
            .field("held", &self.release.is_some())
            .finish()
    }
}

/// A running sandbox, as its owner on the host sees it. Made by a
/// [`crate::Backend`] (`create`, or `adopt` after a restart of the owner).
///
/// Blocking methods are meant for threads that may block (the daemon calls them
/// on its blocking pool).
pub trait Instance: Send + Sync + fmt::Debug {
    /// The sandbox's id.
    fn id(&self) -> &str;

    /// The host pid the owner records to find the sandbox again after a restart
    /// ([`crate::Backend::adopt`]): the namespace backend's PID 1.
    fn pid(&self) -> i32;

    /// The agent's stream: a Unix socket on the host where the guest agent accepts
    /// connections of the guest protocol.
    fn agent_socket(&self) -> &Path;

    /// A new descriptor that becomes readable once the sandbox has ended on its
    /// own or been killed (a pidfd), for an event loop to watch.
    fn exit_watch(&self) -> io::Result<OwnedFd>;

    /// Waits up to `timeout` for the sandbox to end; its wait status (as
    /// `waitpid` reports it) when the owner learned it. Blocking.
    fn wait_exit(&self, timeout: Duration) -> Option<i32>;

    /// Kills every process of the sandbox and waits up to `timeout` for it to end;
    /// the wait status when the owner learned it. Once this returns a status,
    /// nothing of the sandbox runs any more. Blocking.
    fn kill(&self, timeout: Duration) -> Option<i32>;

    /// Kills whatever is left and removes every trace of the sandbox on the host
    /// (cgroups, run directory, the backend's state). Blocking.
    fn terminate(&self) -> Result<(), RuntimeError>;

    /// Resource accounting now; `None` when the sandbox has none (any more).
    fn usage(&self) -> Option<Usage>;

    /// How the host reaches the sandbox's ports.
    fn port_access(&self) -> PortAccess {
        PortAccess::Sockets
    }

    /// Makes sockets inside the sandbox's network for dialling one of its ports
    /// and hands them to `reply`, on a thread of its own (creating them can mean
    /// entering the sandbox's network namespace, which a thread does not leave).
    fn port_sockets(&self, reply: PortSocketsReply);

    /// Holds every process of the sandbox still (a cgroup freeze) until the
    /// returned value is dropped or released, at most `timeout` to take effect:
    /// what a snapshot reads from the writable layer is then one state. Blocking.
    fn hold_still(&self, timeout: Duration) -> Result<Stillness<'_>, RuntimeError>;

    /// Saves the sandbox's whole state (memory, processes, open files) into the
    /// empty directory `dir`, for [`crate::Backend::restore`]; the sandbox ends
    /// once saved. Its agent must have been quiesced first (`Request::Quiesce`).
    /// Blocking.
    fn checkpoint(&self, dir: &Path) -> Result<(), RuntimeError> {
        let _ = dir;
        Err(RuntimeError::Unsupported {
            backend: "namespace",
            what: "checkpoint a sandbox's memory",
        })
    }

    /// Keeps the sandbox's root filesystem, where the runtime mounted it on the
    /// host (the `host` image's root tmpfs on gVisor), at `dir/root` once the
    /// sandbox has ended, so that its terminate leaves it and a
    /// [`crate::Backend::restore`] from `dir` takes it back as the root. False
    /// when the sandbox has no such root (a store image's writable layer is its
    /// owner's). Call after [`Instance::checkpoint`] into `dir`. Blocking.
    fn keep_root(&self, dir: &Path) -> Result<bool, RuntimeError> {
        let _ = dir;
        Ok(false)
    }

    /// Lets a quiesced agent listen again. Blocking.
    fn wake_agent(&self) -> Result<(), RuntimeError> {
        Err(RuntimeError::Unsupported {
            backend: "namespace",
            what: "wake a quiesced agent",
        })
    }

    /// What a snapshot of the sandbox's files reads besides its writable layer
    /// (see [`SnapshotSource`]). Blocking.
    fn snapshot_source(&self) -> Result<SnapshotSource, RuntimeError>;

    /// A watch of the sandbox's memory use against its declared limit
    /// (`declared`, the spec's `resources.memory`: the owner's record, never the
    /// cgroup's), for a sandbox whose kernel has no OOM killer of its own (gVisor): its cgroup's
    /// hard limit leaves headroom above the declared one, and the owner has the
    /// sandbox's agent kill its largest process once the use passes the line
    /// (`Request::RelieveMemory`), then calls [`Instance::count_memory_kill`].
    /// `None`: the kernel's OOM killer acts inside the sandbox (namespace backend).
    /// The second value says why the watch polls (no notification armed).
    fn memory_watch(
        &self,
        _declared: u64,
    ) -> Option<io::Result<(crate::memory_watch::MemoryWatch, Option<String>)>> {
        None
    }

    /// Counts a process the agent killed for memory in [`Usage::oom_kills`].
    fn count_memory_kill(&self) {}

    /// Counts a helper process of the host (a collection mount's server) against
    /// the sandbox's resources, so that it also ends with the sandbox.
    fn add_helper(&self, pid: i32) -> io::Result<()>;
}

/// What [`crate::Backend::reap_leftovers`] removed.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Leftovers {
    /// Sandboxes of the prefix that still ran with no owner: killed.
    pub killed: Vec<String>,
    /// Sandboxes whose host traces (run directory, cgroups, state) were removed.
    pub swept: Vec<String>,
}

/// Items a backend keeps made ahead of time (cgroups, network namespaces).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct StockLevels {
    pub cgroups: usize,
    pub netns: usize,
}

/// Waits up to `timeout` for process `pid` (watched through `pidfd`) to exit:
/// reaps it when it is a child of this process (a subreaper's adopted orphans
/// included) and returns its wait status; otherwise waits for the pidfd and
/// returns `None`.
pub(crate) fn wait_child(pid: i32, pidfd: &OwnedFd, timeout: Duration) -> Option<i32> {
    let deadline = Instant::now() + timeout;
    loop {
        match crate::sys::try_waitpid(pid) {
            Ok(Some(st)) => {
                crate::orphans::unprotect(pid);
                return Some(st);
            }
            Ok(None) => {}
            // Not our child (e.g. adopted after a restart): watch the pidfd instead.
            Err(_) => {
                crate::orphans::unprotect(pid);
                poll_readable(pidfd, deadline.saturating_duration_since(Instant::now()));
                return None;
            }
        }
        if Instant::now() >= deadline {
            return None;
        }
        // A short timeout bounds the loop.
        poll_readable(pidfd, Duration::from_millis(50));
    }
}

/// Whether the process behind `pidfd` has exited (its pidfd is readable then,
/// reaped or not).
pub(crate) fn has_exited(pidfd: &OwnedFd) -> bool {
    let mut pfd = libc::pollfd {
        fd: pidfd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd that outlives the call; a zero timeout.
    let n = unsafe { libc::poll(&mut pfd, 1, 0) };
    n != 0
}

/// Waits up to `timeout` for `fd` to become readable.
pub(crate) fn poll_readable(fd: &OwnedFd, timeout: Duration) {
    let mut pfd = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
    // SAFETY: one valid pollfd that outlives the call.
    unsafe { libc::poll(&mut pfd, 1, ms) };
}
