//! The sandbox plan: everything the in-sandbox init needs, computed on the host from the
//! spec, serialized to the `sandlot __init` helper, and applied there.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::mounts::MountPlan;

/// Width of each sandbox's uid/gid range: ids 0..65535 inside.
pub const ID_RANGE: u32 = 65536;
/// First host uid/gid handed to sandboxes of either backend (2^20).
pub const DEFAULT_ID_BASE: u32 = 1 << 20;
/// Number of id ranges: the most sandboxes of both backends together.
pub const DEFAULT_ID_SLOTS: u32 = 8192;

/// Defaults of the processes the agent starts. `Debug` shows the variables' names only:
/// a value may be a secret.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentSetup {
    pub env: Vec<(String, String)>,
    pub default_user: String,
    pub default_cwd: Option<String>,
}

impl std::fmt::Debug for AgentSetup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.env.iter().map(|(k, _)| k.as_str()).collect();
        f.debug_struct("AgentSetup")
            .field("env_names", &names)
            .field("default_user", &self.default_user)
            .field("default_cwd", &self.default_cwd)
            .finish()
    }
}

/// What the `__init` helper does, as data.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SandboxPlan {
    pub id: String,
    pub hostname: String,
    /// First host uid/gid of the sandbox's range (inside 0 maps here).
    pub id_base: u32,
    pub mounts: MountPlan,
    /// Directories of the sandbox's cgroup(s) (`cgroup.procs` in each is joined).
    pub cgroup_dirs: Vec<PathBuf>,
    /// Mount point for the new root, in the helper's own mount namespace.
    pub root_dir: PathBuf,
    /// Where the agent listens, on the host.
    pub socket_path: PathBuf,
    pub agent: AgentSetup,
    /// The command the agent starts as it starts, as
    /// [`sandlot_proto::guest::FIRST_PROCESS`] (`sandlot run`'s).
    #[serde(default)]
    pub first_exec: Option<sandlot_proto::guest::ExecRequest>,
    /// Fd 3 is a pipe whose write end the supervisor holds; the sandbox ends on EOF.
    pub lifeline: bool,
    /// Fd 6 is a prepared network namespace to join instead of creating one.
    #[serde(default)]
    pub netns: bool,
    /// Fd 7 is the fork server's prepared `/etc` view ([`crate::etc_view`]), for
    /// [`crate::mounts::MountOp::HostEtc`].
    #[serde(default)]
    pub etc_view: bool,
    /// Write per-phase timings to stderr (host env `SANDLOT_TRACE_INIT=1`), for profiling.
    #[serde(default)]
    pub trace: bool,
}

/// Descriptor numbers in the `__init` helper.
pub mod fds {
    /// The plan, as JSON, until end of file.
    pub const PLAN: i32 = 0;
    /// Status lines (JSON) to the host.
    pub const STATUS: i32 = 1;
    /// Optional lifeline pipe.
    pub const LIFELINE: i32 = 3;
    /// flock of the sandbox's uid range slot, held for the sandbox's lifetime.
    pub const SLOT_LOCK: i32 = 4;
    /// flock of the sandbox's run directory, held for the sandbox's lifetime.
    pub const ALIVE_LOCK: i32 = 5;
    /// Optional prepared network namespace (`SandboxPlan::netns`).
    pub const NETNS: i32 = 6;
    /// Optional prepared `/etc` view (`SandboxPlan::etc_view`).
    pub const ETC_VIEW: i32 = 7;
}

/// Status lines written by the helper (`pid`, once) and by the sandbox's PID 1
/// (`ready` or `error`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InitStatus {
    Pid {
        pid: i32,
    },
    Ready {
        idmapped_root: bool,
        landlock_abi: u32,
    },
    Error {
        message: String,
    },
    /// The sandbox's own files make its root impossible to build
    /// ([`crate::mounts::MountError::InRoot`]): `path` inside the sandbox.
    Refused {
        path: String,
        problem: String,
        /// The step and what the kernel said, for the daemon's log.
        #[serde(default)]
        detail: String,
    },
}

impl InitStatus {
    /// Writes the status as one JSON line to `fd` (a status or refusal pipe);
    /// a failed write is not reported (the reader sees the writer's exit).
    pub(crate) fn write_line(&self, fd: std::os::fd::BorrowedFd<'_>) {
        let mut line = serde_json::to_vec(self).unwrap_or_default();
        line.push(b'\n');
        let _ = crate::sys::write_all_fd(fd, &line);
    }

    /// The runtime error a [`InitStatus::Refused`] reports; `None` for any
    /// other status.
    pub(crate) fn into_refusal(self) -> Option<crate::RuntimeError> {
        match self {
            InitStatus::Refused {
                path,
                problem,
                detail,
            } => Some(crate::RuntimeError::Refused {
                path,
                problem,
                detail,
            }),
            _ => None,
        }
    }

    /// The status that reports `e`: [`InitStatus::Refused`] when it carries a
    /// [`crate::mounts::MountError::InRoot`], else `None`.
    pub(crate) fn refusal_of(e: &std::io::Error) -> Option<InitStatus> {
        match e.get_ref()?.downcast_ref::<crate::mounts::MountError>()? {
            crate::mounts::MountError::InRoot {
                op,
                path,
                problem,
                source,
            } => Some(InitStatus::Refused {
                path: path.clone(),
                problem: problem.to_string(),
                detail: format!("{op} {path}: {source}"),
            }),
            _ => None,
        }
    }
}

/// Per-phase timing printed to stderr when `SANDLOT_TRACE_INIT=1` (see
/// `SandboxPlan::trace`): the helper, PID 1 and the host's create and terminate.
pub(crate) struct Trace {
    on: bool,
    start: std::time::Instant,
    who: &'static str,
}

impl Trace {
    pub(crate) fn new(on: bool, who: &'static str) -> Trace {
        Trace {
            on,
            start: std::time::Instant::now(),
            who,
        }
    }

    /// Whether `SANDLOT_TRACE_INIT=1` is set in this process's environment.
    pub(crate) fn enabled() -> bool {
        std::env::var_os("SANDLOT_TRACE_INIT").is_some_and(|v| v == "1")
    }

    pub(crate) fn mark(&self, what: &str) {
        if self.on {
            eprintln!(
                "sandlot-init {} +{:>7.3} ms {what} @{:.3}",
                self.who,
                self.start.elapsed().as_secs_f64() * 1e3,
                monotonic_ms()
            );
        }
    }
}

/// `CLOCK_MONOTONIC` in milliseconds: the one clock every process of a create
/// shares, so that their traces line up.
pub fn monotonic_ms() -> f64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `t` is a valid, writable timespec; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t) };
    t.tv_sec as f64 * 1e3 + t.tv_nsec as f64 / 1e6
}

/// The sandbox's hostname: the spec's, or `sandlot-` and the start of its id.
pub fn sandbox_hostname(id: &str, spec: &sandlot_proto::spec::SandboxSpec) -> String {
    spec.hostname
        .clone()
        .unwrap_or_else(|| format!("sandlot-{}", &id[..id.len().min(12)]))
}

/// Defaults of the agent's processes. Environment: the base (`PATH`, `LANG`,
/// `HOSTNAME`), then the image's, the spec's, then secrets (later wins). User: the
/// spec's, or the image's when the spec says `root` (the default). Working
/// directory: the spec's, else the image's. Also what a daemon sends a pooled
/// sandbox's agent (`configure`) when it hands the sandbox to a request.
pub fn agent_setup(
    hostname: &str,
    spec: &sandlot_proto::spec::SandboxSpec,
    image: Option<&crate::mounts::ImageRoot>,
    secrets: &crate::Secrets,
) -> AgentSetup {
    let mut env = crate::hostimage::base_env(hostname);
    let mut set = |k: &str, v: &str| {
        env.retain(|(ek, _)| ek != k);
        env.push((k.to_string(), v.to_string()));
    };
    if let Some(img) = image {
        for kv in &img.env {
            if let Some((k, v)) = kv.split_once('=') {
                set(k, v);
            }
        }
    }
    for (k, v) in &spec.env {
        set(k, v);
    }
    for (k, v) in &secrets.env {
        set(k, v);
    }
    let default_user = crate::mounts::sandbox_user(spec, image);
    let default_cwd = spec
        .workdir
        .clone()
        .or_else(|| image.and_then(|i| i.workdir.clone()));
    AgentSetup {
        env,
        default_user,
        default_cwd,
    }
}
