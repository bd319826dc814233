//! The in-sandbox agent of the guest protocol: it runs as PID 1 of a sandbox (or as
//! an ordinary process, for tests) and serves processes with optional terminals,
//! output retention and re-attach, stdin, signals, timeouts, file operations and
//! watches to the host's client (`sandlot-guest`), with whose framing it speaks.
//!
//! It runs on the sandbox's side of the trust line: what it is asked comes from the
//! host, and everything it does is within the sandbox.

use std::os::fd::OwnedFd;

mod agent;

/// How the agent runs processes.
#[derive(Debug)]
pub struct AgentConfig {
    /// Base environment of every process; exec requests override and add. `HOME`,
    /// `USER`, `LOGNAME` (from the user) and `PATH` are set when absent from both.
    pub env: Vec<(String, String)>,
    /// `root`, `user`, `UID[:GID]` or a name in the sandbox's `/etc/passwd`.
    pub default_user: String,
    /// Default working directory. Absent: the user's home from `/etc/passwd` if it
    /// exists, else `/`.
    pub default_cwd: Option<String>,
    /// Read end of a pipe: on EOF or HUP the agent kills every process and returns.
    pub lifeline: Option<OwnedFd>,
    /// Bytes of recent output kept per stream for re-attach (at least 64 KiB). It is
    /// also how far a process may run ahead of its slowest attached reader.
    pub output_retention: usize,
    /// The agent's own `oom_score_adj`, opened read-write by the runtime before the
    /// agent became non-dumpable (after that neither the agent nor its children may
    /// open it). With it, every process starts at 0 while the agent keeps its own
    /// score. Without it, each child writes 0 to its own file, which only works
    /// where the agent is dumpable.
    pub oom_score_adj: Option<OwnedFd>,
    /// A command to start before serving any connection, as
    /// [`sandlot_proto::guest::FIRST_PROCESS`]; its output is kept from its first
    /// byte until a client attaches (the process waits when the retention is full),
    /// and a start that fails is the answer to that attach.
    pub first_exec: Option<sandlot_proto::guest::ExecRequest>,
}

impl Default for AgentConfig {
    fn default() -> Self {
        AgentConfig {
            env: Vec::new(),
            default_user: "root".to_string(),
            default_cwd: None,
            lifeline: None,
            output_retention: 1 << 20,
            oom_score_adj: None,
            first_exec: None,
        }
    }
}

/// Serves forever on `listener` (already bound and listening).
///
/// Returns only on a fatal error (of the listener, or of the epoll instance it
/// waits on its processes' pipes and its watches through), on a `shutdown`
/// request or when the lifeline closes, after killing every process it started.
///
/// As PID 1 of a pid namespace it reaps every child, orphans included. Otherwise it
/// makes its process a child subreaper and reaps only the processes it started and
/// orphaned zombies of the sessions it created, so it never steals the exit status of
/// another child of its host process (tests may run several agents in one process).
/// It creates a single-threaded runtime on the calling thread.
pub fn run_agent(
    listener: std::os::unix::net::UnixListener,
    config: AgentConfig,
) -> std::io::Result<()> {
    agent::run(listener, config)
}
