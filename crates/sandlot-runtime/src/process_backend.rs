//! The fake backend: each "sandbox" is the guest agent running as a plain process
//! of the caller's user, with no isolation, no limits and no root needed. It
//! exists so that the daemon's router, owner tasks and guest protocol are tested
//! without root; `sandlot serve` never uses it.
//!
//! The agent is a command given to [`ProcessBackend::new`] (`sandlot __agent`): it
//! gets `--listen SOCKET --lifeline-stdin`, reads its process defaults
//! ([`crate::plan::AgentSetup`], one JSON line) from its standard input, and ends,
//! killing every process it started, when that input closes. A sandbox ends when
//! its agent does.
//!
//! What would need isolation is refused ([`RuntimeError::Unsupported`]): store
//! images, root filesystems, mounts, volumes, secret files and network modes
//! other than `none`. Environment, user and working directory apply.

use std::ffi::OsString;
use std::fs;
use std::io::{self, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use sandlot_proto::spec::{NetworkMode, SandboxSpec, HOST_IMAGE};

use crate::instance::wait_child;
use crate::plan::{agent_setup, sandbox_hostname};
use crate::{
    sys, Backend, CreateOptions, Instance, Leftovers, PortSocketsReply, RuntimeError,
    SnapshotSource, Stillness,
};

/// How long a new agent may take to listen.
const START_TIMEOUT: Duration = Duration::from_secs(10);

/// The fake backend (see the module's notes).
pub struct ProcessBackend {
    /// Program and leading arguments of the agent.
    agent: Vec<OsString>,
    /// `<run_dir>/<id>/agent.sock`.
    run_dir: PathBuf,
}

fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> RuntimeError {
    let what = what.into();
    move |source| RuntimeError::Io { what, source }
}

fn unsupported(what: &'static str) -> RuntimeError {
    RuntimeError::Unsupported {
        backend: "process",
        what,
    }
}

impl ProcessBackend {
    /// `agent`: the agent's program and leading arguments (e.g. the `sandlot`
    /// binary and `__agent`); `run_dir`: where the agents' sockets live.
    pub fn new(agent: Vec<OsString>, run_dir: PathBuf) -> Result<ProcessBackend, RuntimeError> {
        if agent.is_empty() {
            return Err(RuntimeError::Init(
                "the process backend needs an agent command".into(),
            ));
        }
        fs::create_dir_all(&run_dir).map_err(io_err(format!("create {}", run_dir.display())))?;
        Ok(ProcessBackend { agent, run_dir })
    }

    fn check(spec: &SandboxSpec, opts: &CreateOptions) -> Result<(), RuntimeError> {
        spec.validate()?;
        if spec.image != HOST_IMAGE || opts.image.is_some() {
            return Err(unsupported("run a store image"));
        }
        if spec.rootfs.is_some() {
            return Err(unsupported("use a root filesystem directory"));
        }
        if !spec.mounts.is_empty() || !opts.volumes.is_empty() {
            return Err(unsupported("mount host paths, volumes or stores"));
        }
        if !opts.secrets.files.is_empty() {
            return Err(unsupported("write secret files"));
        }
        if spec.network.mode != NetworkMode::None || opts.netns.is_some() {
            return Err(unsupported("give a sandbox a network other than none"));
        }
        Ok(())
    }

    fn start(
        &self,
        id: &str,
        spec: &SandboxSpec,
        opts: CreateOptions,
    ) -> Result<ProcessInstance, RuntimeError> {
        let dir = self.run_dir.join(id);
        fs::create_dir(&dir).map_err(|e| match e.kind() {
            io::ErrorKind::AlreadyExists => RuntimeError::Exists(id.to_string()),
            _ => RuntimeError::Io {
                what: format!("create {}", dir.display()),
                source: e,
            },
        })?;
        let r = self.spawn(id, spec, opts, &dir);
        if r.is_err() {
            let _ = fs::remove_dir_all(&dir);
        }
        r
    }

    fn spawn(
        &self,
        id: &str,
        spec: &SandboxSpec,
        opts: CreateOptions,
        dir: &Path,
    ) -> Result<ProcessInstance, RuntimeError> {
        let socket = dir.join("agent.sock");
        let mut setup = agent_setup(&sandbox_hostname(id, spec), spec, None, &opts.secrets);
        // SAFETY: geteuid and getegid cannot fail.
        let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
        if uid != 0 {
            // Only root can switch users: everything runs as the caller.
            setup.default_user = format!("{uid}:{gid}");
        }
        let mut line = serde_json::to_vec(&setup).expect("agent setup serializes");
        line.push(b'\n');
        let mut cmd = Command::new(&self.agent[0]);
        cmd.args(&self.agent[1..])
            .arg("--listen")
            .arg(&socket)
            .arg("--lifeline-stdin")
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            // Its own process group: a terminal's signals to the caller's group
            // are not the sandbox's.
            .process_group(0);
        match opts.stderr {
            Some(fd) => cmd.stderr(Stdio::from(fd)),
            None => cmd.stderr(Stdio::null()),
        };
        let mut child = cmd
            .spawn()
            .map_err(io_err(format!("spawn the agent {:?}", self.agent[0])))?;
        let pid = child.id() as i32;
        crate::orphans::protect(pid);
        let pidfd = sys::pidfd_open(pid);
        let mut stdin = child.stdin.take().expect("piped stdin");
        let started = pidfd.map_err(io_err("pidfd_open")).and_then(|pidfd| {
            stdin
                .write_all(&line)
                .map_err(io_err("send the agent its setup"))?;
            wait_listening(&socket, &pidfd)?;
            Ok(pidfd)
        });
        match started {
            Ok(pidfd) => Ok(ProcessInstance {
                id: id.to_string(),
                pid,
                pidfd,
                socket,
                dir: dir.to_path_buf(),
                lifeline: Mutex::new(Some(OwnedFd::from(stdin))),
            }),
            Err(e) => {
                drop(stdin);
                let _ = child.kill();
                let _ = child.wait();
                crate::orphans::unprotect(pid);
                Err(e)
            }
        }
    }
}

/// Waits until the agent accepts connections on `socket`, or has exited.
fn wait_listening(socket: &Path, pidfd: &OwnedFd) -> Result<(), RuntimeError> {
    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        if std::os::unix::net::UnixStream::connect(socket).is_ok() {
            return Ok(());
        }
        let mut pfd = libc::pollfd {
            fd: std::os::fd::AsRawFd::as_raw_fd(pidfd),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd; zero timeout.
        if unsafe { libc::poll(&mut pfd, 1, 0) } > 0 {
            return Err(RuntimeError::Init(
                "the agent exited before it listened".into(),
            ));
        }
        if Instant::now() >= deadline {
            return Err(RuntimeError::Init(format!(
                "the agent did not listen within {}s",
                START_TIMEOUT.as_secs()
            )));
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

impl Backend for ProcessBackend {
    fn name(&self) -> &'static str {
        "process"
    }

    fn create(
        &self,
        id: &str,
        spec: &SandboxSpec,
        opts: CreateOptions,
    ) -> Result<Box<dyn Instance>, RuntimeError> {
        Self::check(spec, &opts)?;
        if id.is_empty()
            || id.len() > 64
            || !id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return Err(RuntimeError::BadId(id.to_string()));
        }
        Ok(Box::new(self.start(id, spec, opts)?))
    }

    /// A plain process cannot be taken over: its agent ended with the lifeline of
    /// the process that started it.
    fn adopt(&self, id: &str, _pid: i32) -> Result<Box<dyn Instance>, RuntimeError> {
        Err(RuntimeError::Gone(id.to_string()))
    }

    fn reap_leftovers(&self, prefix: &str, live: &[String]) -> Leftovers {
        let mut swept = Vec::new();
        for e in fs::read_dir(&self.run_dir).into_iter().flatten().flatten() {
            let id = e.file_name().to_string_lossy().into_owned();
            if id.starts_with(prefix) && !live.contains(&id) {
                let _ = fs::remove_dir_all(e.path());
                swept.push(id);
            }
        }
        Leftovers {
            killed: Vec::new(),
            swept,
        }
    }

    fn host_traces(&self, prefix: &str) -> Vec<PathBuf> {
        fs::read_dir(&self.run_dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with(prefix))
            .map(|e| e.path())
            .collect()
    }
}

/// A sandbox of the fake backend: an agent process and its socket directory.
#[derive(Debug)]
pub struct ProcessInstance {
    id: String,
    pid: i32,
    pidfd: OwnedFd,
    socket: PathBuf,
    dir: PathBuf,
    /// The write end of the agent's standard input: closing it ends the agent and
    /// every process it started.
    lifeline: Mutex<Option<OwnedFd>>,
}

impl Instance for ProcessInstance {
    fn id(&self) -> &str {
        &self.id
    }

    fn pid(&self) -> i32 {
        self.pid
    }

    fn agent_socket(&self) -> &Path {
        &self.socket
    }

    fn exit_watch(&self) -> io::Result<OwnedFd> {
        self.pidfd.try_clone()
    }

    fn wait_exit(&self, timeout: Duration) -> Option<i32> {
        wait_child(self.pid, &self.pidfd, timeout)
    }

    /// Closes the lifeline (the agent kills what it started and exits), and
    /// SIGKILLs the agent if it has not exited within half of `timeout`.
    fn kill(&self, timeout: Duration) -> Option<i32> {
        drop(
            self.lifeline
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take(),
        );
        if let Some(st) = wait_child(self.pid, &self.pidfd, timeout / 2) {
            return Some(st);
        }
        let _ = sys::pidfd_send_signal(self.pidfd.as_fd(), libc::SIGKILL);
        wait_child(self.pid, &self.pidfd, timeout / 2)
    }

    fn terminate(&self) -> Result<(), RuntimeError> {
        self.kill(Duration::from_secs(10));
        let _ = fs::remove_file(&self.socket);
        match fs::remove_dir_all(&self.dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(RuntimeError::Io {
                what: format!("remove {}", self.dir.display()),
                source: e,
            }),
        }
    }

    fn usage(&self) -> Option<crate::cgroup::Usage> {
        None
    }

    fn port_sockets(&self, reply: PortSocketsReply) {
        reply(Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "the process backend has no network of its own to dial",
        )))
    }

    fn hold_still(&self, _timeout: Duration) -> Result<Stillness<'_>, RuntimeError> {
        Err(unsupported("hold a sandbox still"))
    }

    fn snapshot_source(&self) -> Result<SnapshotSource, RuntimeError> {
        Err(unsupported("snapshot a sandbox"))
    }

    fn add_helper(&self, _pid: i32) -> io::Result<()> {
        Ok(())
    }
}
