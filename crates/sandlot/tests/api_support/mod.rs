//! Shared helpers of the API end-to-end tests: a real `sandlot serve` on a temporary
//! data directory, socket and TCP port, with its own sandbox id prefix, torn down
//! (every sandbox deleted, leftovers asserted absent) when dropped.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use sandlot_client::{Client, ListFilter};

pub mod counter;
pub mod vfs;

pub fn sandlot() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_sandlot"))
}

pub fn require_root() {
    assert!(
        rustix::process::geteuid().is_root(),
        "privileged test: run as root (the daemon creates namespaces, cgroups and mounts); CI runs as root"
    );
}

static SEQ: AtomicU32 = AtomicU32::new(0);

/// The isolation test daemons give a sandbox that names none:
/// `SANDLOT_TEST_ISOLATION` (`namespace`, the default, or `gvisor`). The whole
/// API suite runs on gVisor with `SANDLOT_TEST_ISOLATION=gvisor` (see
/// CONTRIBUTING.md); the tests that run on both backends in every run take
/// the isolation as a parameter ([`Daemon::start_isolated`]).
pub fn suite_isolation() -> String {
    std::env::var("SANDLOT_TEST_ISOLATION").unwrap_or_else(|_| "namespace".into())
}

/// `config` with `[isolation] default = isolation` added (unless it has an
/// `[isolation]` section of its own).
fn with_isolation(config: Option<&str>, isolation: &str) -> Option<String> {
    match config {
        Some(c) if c.contains("[isolation]") => Some(c.to_string()),
        _ if isolation == "namespace" => config.map(str::to_string),
        c => Some(format!(
            "{}\n[isolation]\ndefault = \"{isolation}\"\n",
            c.unwrap_or("")
        )),
    }
}

/// A running daemon.
pub struct Daemon {
    pub child: Option<Child>,
    pub dir: PathBuf,
    pub socket: PathBuf,
    pub port: u16,
    pub prefix: String,
    pub config: Option<PathBuf>,
    /// The daemon's own `oom_score_adj`, set before it starts (`None`: inherited).
    pub oom_score_adj: Option<i32>,
    /// The daemon's open-file limit (soft and hard), set before it starts (`None`:
    /// inherited).
    pub open_file_limit: Option<u64>,
}

/// Loopback ports that tests publishing sandbox ports on fixed host ranges own
/// (`api_ports.rs`): `free_port` never draws from them, so no other test's server
/// listens there while those tests count the listeners in their ranges.
pub const PUBLISHING_TESTS_PORTS: std::ops::RangeInclusive<u16> = 31_000..=31_999;

/// A loopback port free right now, for a server this test starts. It is drawn
/// below the kernel's ephemeral range, so that no outgoing connection (the suite
/// makes thousands) takes it between this check and the server's bind, and
/// outside `PUBLISHING_TESTS_PORTS`; the draw is random, so that tests running at
/// once rarely draw the same one.
pub fn free_port() -> u16 {
    use std::hash::{BuildHasher, Hasher};
    let ephemeral_start = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    const LOW: u16 = 10_000;
    if ephemeral_start > LOW + 1000 {
        let span = u64::from(ephemeral_start - LOW);
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u32(std::process::id());
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
                .as_nanos(),
        );
        let seed = h.finish();
        for k in 0..span {
            let port = LOW + ((seed.wrapping_add(k.wrapping_mul(7919))) % span) as u16;
            if PUBLISHING_TESTS_PORTS.contains(&port) {
                continue;
            }
            if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
                return port;
            }
        }
    }
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl Daemon {
    /// Starts a daemon with an optional TOML configuration; sandboxes that name no
    /// isolation get [`suite_isolation`].
    pub fn start(config: Option<&str>) -> Daemon {
        Daemon::start_isolated(config, &suite_isolation())
    }

    /// Starts a daemon whose sandboxes get `isolation` (`namespace` or `gvisor`)
    /// unless they name one.
    pub fn start_isolated(config: Option<&str>, isolation: &str) -> Daemon {
        Daemon::start_with(with_isolation(config, isolation).as_deref(), None, None)
    }

    /// Starts a daemon whose process runs at `oom_score_adj` (raising it needs no
    /// privilege; lowering it below 0 does).
    pub fn start_with_oom_score_adj(config: Option<&str>, oom_score_adj: i32) -> Daemon {
        let config = with_isolation(config, &suite_isolation());
        Daemon::start_with(config.as_deref(), Some(oom_score_adj), None)
    }

    /// Starts a daemon whose open-file limit (soft and hard) is `limit`.
    pub fn start_with_open_file_limit(config: Option<&str>, limit: u64) -> Daemon {
        let config = with_isolation(config, &suite_isolation());
        Daemon::start_with(config.as_deref(), None, Some(limit))
    }

    fn start_with(
        config: Option<&str>,
        oom_score_adj: Option<i32>,
        open_file_limit: Option<u64>,
    ) -> Daemon {
        require_root();
        let n = SEQ.fetch_add(1, Ordering::Relaxed);
        let prefix = format!("t{}x{n}-", std::process::id());
        let dir = std::env::temp_dir().join(format!("sandlot-api-test-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let config = config.map(|c| {
            let p = dir.join("sandlot.toml");
            std::fs::write(&p, c).unwrap();
            p
        });
        let mut d = Daemon {
            child: None,
            socket: dir.join("api.sock"),
            dir,
            port: free_port(),
            prefix,
            config,
            oom_score_adj,
            open_file_limit,
        };
        d.spawn();
        d
    }

    pub fn data_dir(&self) -> PathBuf {
        self.dir.join("data")
    }

    /// (Re)starts the process on the same data directory, socket, port and prefix,
    /// and waits for its socket and API port.
    pub fn spawn(&mut self) {
        self.launch();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if std::os::unix::net::UnixStream::connect(&self.socket).is_ok()
                && std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok()
            {
                return;
            }
            self.assert_starting(deadline);
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Panics with the log if the process exited or `deadline` passed.
    pub fn assert_starting(&mut self, deadline: Instant) {
        if let Some(st) = self.child.as_mut().unwrap().try_wait().unwrap() {
            panic!("sandlot serve exited with {st}; log:\n{}", self.log());
        }
        assert!(
            Instant::now() < deadline,
            "the daemon did not start; log:\n{}",
            self.log()
        );
    }

    /// Starts the process as [`Daemon::spawn`] does, without waiting for it.
    pub fn launch(&mut self) {
        let mut cmd = match (self.oom_score_adj, self.open_file_limit) {
            (None, None) => Command::new(sandlot()),
            // The shell sets its own score and limit and execs the daemon (same pid).
            (score, limit) => {
                let mut c = Command::new("/bin/sh");
                c.args([
                    "-c",
                    r#"if [ -n "$0" ]; then echo "$0" > /proc/self/oom_score_adj; fi &&
                       if [ -n "$1" ]; then ulimit -n "$1"; fi && shift && exec "$@""#,
                ])
                .arg(score.map(|s| s.to_string()).unwrap_or_default())
                .arg(limit.map(|l| l.to_string()).unwrap_or_default())
                .arg(sandlot());
                c
            }
        };
        cmd.arg("serve")
            .arg("--data-dir")
            .arg(self.data_dir())
            .arg("--socket")
            .arg(&self.socket)
            .arg("--listen")
            .arg(format!("127.0.0.1:{}", self.port))
            .arg("--id-prefix")
            .arg(&self.prefix)
            .env("SANDLOT_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(self.dir.join("daemon.log"))
                    .unwrap(),
            ));
        if let Some(c) = &self.config {
            cmd.arg("--config").arg(c);
        }
        let child = cmd.spawn().expect("spawn sandlot serve");
        self.child = Some(child);
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("daemon.log")).unwrap_or_default()
    }

    pub fn pid(&self) -> i32 {
        self.child.as_ref().unwrap().id() as i32
    }

    /// The operator's client (Unix socket).
    pub fn client(&self) -> Client {
        Client::new(&format!("unix://{}", self.socket.display()), None).unwrap()
    }

    /// A tenant's client over TCP.
    pub fn tcp(&self, token: Option<&str>) -> Client {
        Client::new(
            &format!("127.0.0.1:{}", self.port),
            token.map(str::to_string),
        )
        .unwrap()
    }

    /// A raw HTTP request on the operator socket, to send bodies the typed client would
    /// not: (status, the JSON object of the body, or null).
    pub fn raw(&self, method: &str, path: &str, body: &str) -> (u16, serde_json::Value) {
        use std::io::{Read, Write};
        let mut s = std::os::unix::net::UnixStream::connect(&self.socket).unwrap();
        // The daemon may answer (413) and close before the whole body is written.
        let _ = write!(
            s,
            "{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        let mut buf = Vec::new();
        let _ = s.read_to_end(&mut buf);
        let out = String::from_utf8_lossy(&buf).into_owned();
        let status: u16 = out[9..12].parse().unwrap();
        let b = out.split("\r\n\r\n").nth(1).unwrap_or("");
        // Chunked or not: find the JSON object.
        let j = b
            .find('{')
            .map(|i| &b[i..b.rfind('}').unwrap() + 1])
            .unwrap_or("null");
        (
            status,
            serde_json::from_str(j).unwrap_or(serde_json::Value::Null),
        )
    }

    /// A raw HTTP request over TCP as the holder of `token` (a tenant): (status, the
    /// whole body as text, de-chunked). For checks on exactly what a tenant is sent.
    pub fn tcp_raw(
        &self,
        token: &str,
        method: &str,
        path: &str,
        content_type: &str,
        body: &[u8],
    ) -> (u16, String) {
        let auth = format!("Bearer {token}");
        http(
            self.port,
            method,
            path,
            &[("Authorization", &auth), ("Content-Type", content_type)],
            body,
        )
    }

    /// `sandlot token create --tenant T` through this daemon: the secret.
    pub fn token(&self, tenant: &str) -> String {
        let (code, out, err) = self.cli(&["token", "create", "--tenant", tenant]);
        assert_eq!(code, 0, "{err}");
        out.trim().to_string()
    }

    /// `sandlot ARGS` against this daemon's socket: (code, stdout, stderr).
    pub fn cli(&self, args: &[&str]) -> (i32, String, String) {
        let o = Command::new(sandlot())
            .args(args)
            .env("SANDLOT_URL", format!("unix://{}", self.socket.display()))
            .env_remove("SANDLOT_TOKEN")
            .stdin(Stdio::null())
            .output()
            .unwrap();
        (
            o.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&o.stdout).into_owned(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    }

    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGKILL without waiting: the process is a zombie until the caller reaps the
    /// child returned (as under a supervisor that restarts before it waits).
    pub fn kill9_unreaped(&mut self) -> Child {
        let c = self.child.take().expect("the daemon runs");
        rustix::process::kill_process(
            rustix::process::Pid::from_raw(c.id() as i32).unwrap(),
            rustix::process::Signal::KILL,
        )
        .unwrap();
        c
    }

    pub fn terminate(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = rustix::process::kill_process(
                rustix::process::Pid::from_raw(c.id() as i32).unwrap(),
                rustix::process::Signal::TERM,
            );
            let _ = c.wait();
        }
    }

    /// Run dirs and cgroups of this daemon's sandboxes still on the host, and
    /// gVisor's directories and processes of them.
    pub fn leftovers(&self) -> Vec<String> {
        leftovers_of(&self.prefix)
    }

    /// Deletes every sandbox, stops the daemon and checks nothing is left.
    pub fn shutdown(&mut self) {
        if self.child.is_some() {
            let c = self.client();
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                if let Ok(list) = c.list_sandboxes(&ListFilter::default()).await {
                    for s in list {
                        let _ = c.delete_sandbox(&s.id).await;
                    }
                }
            });
            self.terminate();
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while !self.leftovers().is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        let left = self.leftovers();
        let _ = std::fs::remove_dir_all(&self.dir);
        assert!(left.is_empty(), "leftovers after the test: {left:?}");
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("daemon log:\n{}", self.log());
        }
        if self.child.is_some() || self.dir.exists() {
            if std::thread::panicking() {
                // Clean up without asserting again.
                let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.shutdown()));
            } else {
                self.shutdown();
            }
        }
    }
}

/// A raw HTTP/1.1 request to `127.0.0.1:port` (one connection, closed after it):
/// (status, the whole body as text, de-chunked).
pub fn http(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> (u16, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: x\r\n");
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str(&format!(
        "Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    ));
    // The daemon may answer and close before the whole body is written.
    let _ = s.write_all(head.as_bytes());
    let _ = s.write_all(body);
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf);
    let end = buf
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("an HTTP answer");
    let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
    let status: u16 = head[9..12].parse().unwrap();
    let mut rest = &buf[end + 4..];
    if !head.contains("transfer-encoding: chunked") {
        return (status, String::from_utf8_lossy(rest).into_owned());
    }
    let mut out = Vec::new();
    while let Some(i) = rest.windows(2).position(|w| w == b"\r\n") {
        let size = std::str::from_utf8(&rest[..i]).unwrap().trim();
        let n = usize::from_str_radix(size, 16).unwrap();
        if n == 0 {
            break;
        }
        let data = &rest[i + 2..];
        let n = n.min(data.len());
        out.extend_from_slice(&data[..n]);
        rest = data.get(n + 2..).unwrap_or_default();
    }
    (status, String::from_utf8_lossy(&out).into_owned())
}

/// Waits for `child` to exit, for at most `within`; `None` if it is still running.
pub fn wait_exit(child: &mut Child, within: Duration) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + within;
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return Some(st);
        }
        if Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The host-wide lock file a daemon with `prefix` holds while it runs.
pub fn prefix_lock(prefix: &str) -> PathBuf {
    Path::new(sandlot_server::ID_PREFIX_LOCK_DIR).join(format!("{prefix}.lock"))
}

/// A create body whose spec is the JSON object `spec`.
pub fn spec_body(spec: serde_json::Value) -> sandlot_client::CreateSandbox {
    let serde_json::Value::Object(spec) = spec else {
        panic!("a spec is a JSON object: {spec}")
    };
    sandlot_client::CreateSandbox {
        spec,
        ..Default::default()
    }
}

pub fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Waits until `f` is true or panics after `secs`.
pub async fn eventually<F, Fut>(secs: u64, what: &str, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !f().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The kinds of sandbox `id`'s lifecycle events, in order.
pub async fn event_kinds(c: &Client, id: &str) -> Vec<String> {
    c.events(id)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.kind)
        .collect()
}

/// Runs a test's body on a fresh runtime and fails it, naming `what`, if it takes
/// longer than `secs` (a hang then fails with a message instead of running into
/// the harness's timeout).
pub fn block_on_within<F: std::future::Future>(secs: u64, what: &str, f: F) -> F::Output {
    rt().block_on(async {
        match tokio::time::timeout(Duration::from_secs(secs), f).await {
            Ok(v) => v,
            Err(_) => panic!("{what} did not finish within {secs} s"),
        }
    })
}

/// Mounts under `dir` in the host's mount namespace.
pub fn mounts_under(dir: &std::path::Path) -> Vec<String> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    info.lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|mp| std::path::Path::new(mp).starts_with(dir))
        .map(str::to_string)
        .collect()
}

/// Host traces of the sandboxes whose ids start with `prefix`: run directories
/// and cgroups (both backends), gVisor's sandbox directories and its sandbox and
/// gofer processes.
pub fn leftovers_of(prefix: &str) -> Vec<String> {
    let defaults = sandlot_runtime::RuntimeConfig::new(PathBuf::new());
    let mut out: Vec<String> =
        sandlot_runtime::namespace::host_traces(&defaults.run_dir, &defaults.cgroup_parent, prefix)
            .into_iter()
            .map(|p| p.display().to_string())
            .collect();
    let gvisor = defaults.run_dir.join("gvisor");
    if let Ok(rd) = std::fs::read_dir(&gvisor) {
        out.extend(
            rd.flatten()
                .filter(|e| e.file_name().to_string_lossy().starts_with(prefix))
                .map(|e| e.path().display().to_string()),
        );
    }
    // runsc makes the sandbox's cgroup in every hierarchy, not only the runtime's.
    let parent = &defaults.cgroup_parent;
    let mut parents = vec![PathBuf::from("/sys/fs/cgroup").join(parent)];
    for h in std::fs::read_dir("/sys/fs/cgroup")
        .into_iter()
        .flatten()
        .flatten()
    {
        parents.push(h.path().join(parent));
    }
    for p in parents {
        for e in std::fs::read_dir(&p).into_iter().flatten().flatten() {
            let path = e.path().display().to_string();
            if e.file_name().to_string_lossy().starts_with(prefix) && !out.contains(&path) {
                out.push(path);
            }
        }
    }
    let root = format!("--root={}/{prefix}", gvisor.display());
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let cmd = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
        if cmd.starts_with("runsc-") && cmd.contains(&root) {
            out.push(format!(
                "process {}: {cmd}",
                e.file_name().to_string_lossy()
            ));
        }
    }
    out
}
