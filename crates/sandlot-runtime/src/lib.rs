//! The sandbox runtime: the [`Backend`] trait and the Linux namespace backend.
//!
//! A backend turns a [`SandboxSpec`] into a running sandbox whose PID 1 is the guest
//! agent, listening on a Unix socket on the host, and tears it down leaving nothing
//! behind. See `docs/ARCHITECTURE.md` for the flow and `docs/threat-model.md` for the
//! security decisions.

use std::os::fd::OwnedFd;
use std::path::PathBuf;

use sandlot_proto::spec::{SandboxSpec, SpecError};

pub mod cgroup;
pub mod cgroup_stock;
pub mod etc_view;
pub mod gvisor;
pub mod helper_process;
pub mod host_lock;
pub mod host_path;
pub mod hostimage;
pub mod init;
mod instance;
pub mod memory_watch;
pub mod mounts;
pub mod namespace;
pub mod netns;
pub mod orphans;
pub mod plan;
pub mod process_backend;
pub mod run_dir;
pub mod seccomp;
pub mod security;
mod stock;
mod sys;
pub mod zygote;

pub use instance::{
    Instance, Leftovers, LiveRoot, PortAccess, PortSockets, PortSocketsReply, SnapshotSource,
    Stillness, StockLevels, PORT_RELAY_REFUSED,
};
pub use namespace::{NamespaceBackend, RuntimeConfig};

/// Gives `SIGPIPE` its default action back (Rust starts programs ignoring it): a
/// command-line tool whose reader went away (`sandlot image ls | head -1`) then ends
/// quietly, as Unix tools do, instead of panicking on its next write. Never for the
/// daemon, which must outlive its clients' sockets.
pub fn default_sigpipe() -> std::io::Result<()> {
    sys::set_signal_ignored(libc::SIGPIPE, false)
}

/// Whether signal `sig` is ignored by this process (`SIGHUP` under `nohup`).
pub fn signal_ignored(sig: i32) -> std::io::Result<bool> {
    sys::signal_ignored(sig)
}

/// Gives signal `sig` its default action back, whatever handled it before: a
/// benchmark cleaning up after a first Ctrl-C ends at once on a second one.
pub fn default_signal_action(sig: i32) -> std::io::Result<()> {
    sys::set_signal_ignored(sig, false)
}

/// The CPU time (user and system) of the children this process has waited for,
/// and of their waited-for descendants: what a finished command cost, by
/// difference (benchmarks).
pub fn reaped_children_cpu() -> std::io::Result<std::time::Duration> {
    sys::reaped_children_cpu()
}

/// The CPU time (user and system) of this process so far (benchmarks).
pub fn own_cpu() -> std::io::Result<std::time::Duration> {
    sys::own_cpu()
}

/// Errors of the runtime.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("invalid sandbox spec: {0}")]
    Spec(#[from] SpecError),
    #[error("the namespace backend needs root")]
    NotRoot,
    #[error("invalid sandbox id {0:?}: use 1 to 64 letters, digits, '-' or '_'")]
    BadId(String),
    #[error("sandbox {0} already exists")]
    Exists(String),
    #[error("no free {0}")]
    Exhausted(&'static str),
    #[error(transparent)]
    Cgroup(#[from] cgroup::CgroupError),
    #[error(transparent)]
    Mount(#[from] mounts::MountError),
    #[error("sandbox init failed: {0}")]
    Init(String),
    /// The sandbox's own files (its image, its writable layer) make its root
    /// impossible to build: `path` is inside the sandbox.
    #[error("{path} in the sandbox {problem}")]
    Refused {
        path: String,
        problem: String,
        /// The step and what the kernel said, for the daemon's log.
        detail: String,
    },
    #[error("sandbox {0} is gone")]
    Gone(String),
    #[error("processes of sandbox {0} did not die")]
    Stuck(String),
    /// What a restore needs of a sandbox's files is no longer there.
    #[error("{0} is gone")]
    FilesLost(String),
    /// A copy of a sandbox's files stopped at one of its bounds (nothing of it
    /// is kept).
    #[error("{what} is past its limit of {limit} {unit}")]
    PastLimit {
        what: &'static str,
        limit: u64,
        unit: &'static str,
    },
    #[error("the {backend} backend cannot {what}")]
    Unsupported {
        backend: &'static str,
        what: &'static str,
    },
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
}

/// Per-create options that are not part of the spec.
#[derive(Debug, Default)]
pub struct CreateOptions {
    /// Read end of a pipe: when every write end is closed, the sandbox ends. Used by
    /// `sandlot run`, whose sandbox must not outlive it. The daemon passes none, so
    /// its sandboxes survive a daemon restart.
    pub lifeline: Option<OwnedFd>,
    /// Where the sandbox's init writes diagnostics (default: nowhere).
    pub stderr: Option<OwnedFd>,
    /// A network namespace prepared by the caller (an open `/proc/PID/ns/net` or
    /// `/run/netns/NAME`). When set, PID 1 joins it instead of getting a fresh one,
    /// so the sandbox's user namespace does not own its network namespace and root
    /// inside has no `CAP_NET_ADMIN` over it: it cannot change addresses, routes or
    /// rules. The caller brings `lo` up and sets what else it needs. Required for a
    /// spec whose network mode is not `none`.
    pub netns: Option<OwnedFd>,
    /// A command for the agent to start as soon as it runs, before any connection
    /// ([`sandlot_proto::guest::FIRST_PROCESS`]): no exec round trip after the
    /// create. `sandlot run` hands its command over so.
    pub first_exec: Option<sandlot_proto::guest::ExecRequest>,
    /// The nameserver written to the `host` image's `/etc/resolv.conf` (with
    /// `netns`).
    pub nameserver: Option<std::net::IpAddr>,
    /// A store image resolved by the caller (layer directories, writable layer,
    /// config), used when the spec names an image other than `host`.
    pub image: Option<mounts::ImageRoot>,
    /// Named volumes: host directories bound with the identity idmap.
    pub volumes: Vec<mounts::SharedDir>,
    /// Secret values to inject (environment variables and files under
    /// `/run/secrets`). Its `Debug` output names them without their values.
    pub secrets: Secrets,
    /// The spec's host paths (bind sources, the rootfs) as the caller resolved and
    /// checked them against its policy ([`host_path::pin`]); the mounts are made
    /// from exactly these. `None`: the runtime resolves them itself (`sandlot run`,
    /// which has no policy).
    pub pinned: Option<Vec<host_path::PinnedPath>>,
}

/// Secret values for a sandbox, redacted in `Debug` output.
#[derive(Default, Clone)]
pub struct Secrets {
    /// (variable, value)
    pub env: Vec<(String, String)>,
    /// Files under `/run/secrets`.
    pub files: Vec<SecretFile>,
}

/// A secret file: its value, path, mode and owner. `Debug` leaves the value out.
#[derive(Clone)]
pub struct SecretFile {
    /// Under `/run/secrets`.
    pub path: String,
    pub contents: String,
    /// Permission bits (no set-id or sticky bits).
    pub mode: u32,
    /// Owner and group; `None` is the sandbox user's (the uid and primary gid its
    /// commands run as, resolved in the sandbox's `/etc/passwd`).
    pub uid: Option<u32>,
    pub gid: Option<u32>,
}

impl std::fmt::Debug for Secrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Secrets")
            .field("env", &self.env.iter().map(|(k, _)| k).collect::<Vec<_>>())
            .field(
                "files",
                &self.files.iter().map(|f| &f.path).collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl std::fmt::Debug for SecretFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SecretFile")
            .field("path", &self.path)
            .field("mode", &format_args!("{:04o}", self.mode))
            .field("uid", &self.uid)
            .field("gid", &self.gid)
            .finish_non_exhaustive()
    }
}

/// A way to run sandboxes: the Linux namespace backend ([`NamespaceBackend`]), and
/// for tests without root a plain process ([`process_backend::ProcessBackend`]).
/// The daemon reaches isolation only through this trait and [`Instance`].
pub trait Backend: Send + Sync {
    fn name(&self) -> &'static str;
    /// Builds and starts a sandbox; its agent is listening when this returns.
    fn create(
        &self,
        id: &str,
        spec: &SandboxSpec,
        opts: CreateOptions,
    ) -> Result<Box<dyn Instance>, RuntimeError>;
    /// Re-attaches to a sandbox created earlier (by this or a previous process,
    /// e.g. before a daemon restart), given the pid [`Instance::pid`] reported
    /// then. Fails with [`RuntimeError::Gone`] if that sandbox is gone or `pid` is
    /// no longer its own.
    fn adopt(&self, id: &str, pid: i32) -> Result<Box<dyn Instance>, RuntimeError>;

    /// Starts sandbox `id` again from a checkpoint in `image`
    /// ([`Instance::checkpoint`]) of a sandbox of the same spec: its processes,
    /// memory and open files as they were, and the root its checkpoint kept
    /// ([`Instance::keep_root`]), if any, as its root (bound: the kept mount stays
    /// for its owner to remove); its agent is listening when this returns.
    fn restore(
        &self,
        id: &str,
        spec: &SandboxSpec,
        opts: CreateOptions,
        image: &std::path::Path,
    ) -> Result<Box<dyn Instance>, RuntimeError> {
        let _ = (id, spec, opts, image);
        Err(RuntimeError::Unsupported {
            backend: self.name(),
            what: "restore a sandbox from a checkpoint",
        })
    }
    /// Removes a checkpoint directory given to [`Instance::checkpoint`], the root
    /// it kept included ([`Instance::keep_root`]). Blocking.
    fn remove_checkpoint(&self, dir: &std::path::Path) -> Result<(), RuntimeError> {
        match std::fs::remove_dir_all(dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(RuntimeError::Io {
                what: format!("remove {}", dir.display()),
                source: e,
            }),
            _ => Ok(()),
        }
    }
    /// Kills every sandbox whose id starts with `prefix` and is not in `live`, and
    /// removes the host traces of every sandbox that no longer runs (a crashed
    /// owner's leftovers). Blocking.
    fn reap_leftovers(&self, prefix: &str, live: &[String]) -> Leftovers;
    /// Host traces (run directories, cgroups, state) of sandboxes whose id starts
    /// with `prefix`: after a clean stop there are none. The leak check of tests
    /// and benchmarks.
    fn host_traces(&self, prefix: &str) -> Vec<PathBuf>;
    /// What the backend keeps made ahead of time, ready now.
    fn stock(&self) -> StockLevels {
        StockLevels::default()
    }
    /// Stops making items ahead of time and removes those kept (at shutdown).
    fn release_stock(&self) {}
}
