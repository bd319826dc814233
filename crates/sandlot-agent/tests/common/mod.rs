//! Test harness: runs the agent binary on a socket in a temporary directory and
//! checks, at the end of each test, that nothing it started is left behind.

#![allow(dead_code)]

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use sandlot_guest::client::{ExecRequest, GuestClient, Output, Process};

/// Fails the test loudly unless it runs as root (CI does). Every test here runs an
/// agent, which starts processes as root unless told otherwise and switches users
/// for them, as it does as PID 1 of a sandbox.
pub fn require_root() {
    assert!(
        rustix::process::geteuid().is_root(),
        "privileged test: run as root (the agent starts processes as root and switches users); CI runs as root"
    );
}

/// A directory removed (recursively) on drop.
pub struct TempDir(PathBuf);

static COUNTER: AtomicU64 = AtomicU64::new(0);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        let p = std::env::temp_dir().join(format!(
            "sandlot-guest-{tag}-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    pub fn join(&self, s: &str) -> PathBuf {
        self.0.join(s)
    }

    pub fn str(&self, s: &str) -> String {
        self.join(s).to_string_lossy().into_owned()
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The agent as a child process of the test.
pub struct TestAgent {
    child: Option<Child>,
    pub dir: TempDir,
    pub socket: PathBuf,
    /// Sessions (pids of started processes) to check for leftovers.
    sessions: std::sync::Mutex<HashSet<i32>>,
}

impl TestAgent {
    pub fn start() -> TestAgent {
        TestAgent::start_with(&[])
    }

    pub fn start_with(args: &[&str]) -> TestAgent {
        TestAgent::start_wrapped(&[], args)
    }

    /// Starts the agent through `wrapper` (a command that execs its arguments).
    pub fn start_wrapped(wrapper: &[&str], args: &[&str]) -> TestAgent {
        require_root();
        let dir = TempDir::new("agent");
        let socket = dir.join("agent.sock");
        let bin = env!("CARGO_BIN_EXE_sandlot-guest-agent");
        let mut cmd = match wrapper.split_first() {
            Some((w, rest)) => {
                let mut c = Command::new(w);
                c.args(rest).arg(bin);
                c
            }
            None => Command::new(bin),
        };
        let child = cmd
            .arg("--listen")
            .arg(&socket)
            .args(args)
            .spawn()
            .expect("start the agent binary");
        TestAgent {
            child: Some(child),
            dir,
            socket,
            sessions: Default::default(),
        }
    }

    pub fn pid(&self) -> i32 {
        self.child.as_ref().unwrap().id() as i32
    }

    pub async fn client(&self) -> GuestClient {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match GuestClient::connect(&self.socket).await {
                Ok(c) => return c,
                Err(e) if Instant::now() < deadline => {
                    let _ = e;
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                Err(e) => panic!("connecting to the test agent: {e}"),
            }
        }
    }

    /// Remembers a process's session for the leftover check.
    pub fn track(&self, p: &Process) {
        self.sessions.lock().unwrap().insert(p.pid());
    }

    pub fn track_pid(&self, pid: i32) {
        self.sessions.lock().unwrap().insert(pid);
    }

    /// Private memory of the agent in KiB (RssAnon).
    pub fn rss_anon_kib(&self) -> u64 {
        status_field(self.pid(), "RssAnon:").unwrap_or(0)
    }

    /// Shuts the agent down through the protocol and checks that it exits and that
    /// no process of any tracked session survives.
    pub async fn finish(mut self, c: &GuestClient) {
        for p in c.list_processes().await.expect("list before shutdown") {
            self.track_pid(p.pid);
        }
        c.shutdown().await.expect("shutdown");
        let mut child = self.child.take().unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break s;
            }
            assert!(
                Instant::now() < deadline,
                "agent did not exit after shutdown"
            );
            std::thread::sleep(Duration::from_millis(5));
        };
        assert!(status.success(), "agent exit status {status:?}");
        let sessions = self.sessions.lock().unwrap().clone();
        assert_no_leftovers(&sessions);
    }
}

impl Drop for TestAgent {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

pub fn status_field(pid: i32, field: &str) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let l = s.lines().find(|l| l.starts_with(field))?;
    l[field.len()..].split_whitespace().next()?.parse().ok()
}

/// (state, ppid, session) of a process.
pub fn proc_stat(pid: i32) -> Option<(char, i32, i32)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &s[s.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split(' ').collect();
    Some((f[0].chars().next()?, f[1].parse().ok()?, f[3].parse().ok()?))
}

/// Asserts that no process (zombies included) belongs to any of `sessions`.
pub fn assert_no_leftovers(sessions: &HashSet<i32>) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let mut left = Vec::new();
        for e in std::fs::read_dir("/proc").unwrap().flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
                continue;
            };
            if let Some((state, _, sid)) = proc_stat(pid) {
                if sessions.contains(&sid) {
                    left.push((pid, state));
                }
            }
        }
        if left.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "processes left behind (pid, state): {left:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

pub fn sh(script: &str) -> ExecRequest {
    ExecRequest::new(["/bin/sh", "-c", script])
}

/// Runs a request to completion and collects its output.
pub async fn run(agent: &TestAgent, c: &GuestClient, req: ExecRequest) -> Output {
    let p = c.exec(req).await.expect("exec");
    agent.track(&p);
    p.output().await.expect("output")
}
