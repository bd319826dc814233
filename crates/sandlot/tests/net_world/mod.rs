//! The simulated internet of the network tests, and a daemon that uses it as its
//! uplink. Everything lives in network namespaces this module creates; no packet
//! goes anywhere else.
//!
//! ```text
//!   netns <p>-inet  (world.py: DNS 10.99.0.53, HTTP/HTTPS/UDP on each name's address)
//!        | veth 10.99.0.2/16 + one address per name
//!        | veth 10.99.0.1/16
//!   netns <p>-host  (sandlot serve runs here: its slots' veths, nftables table,
//!                    resolver and proxy all live in this namespace)
//!        | veth per slot (100.96.x.y/30)
//!   sandbox slots
//! ```

#![allow(dead_code)]

use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use sandlot_client::{Client, ListFilter};

pub const HOST_ADDR: &str = "10.99.0.1";
pub const DNS_ADDR: &str = "10.99.0.53";

/// Names the world's DNS knows, and their addresses.
pub const RECORDS: &[(&str, &str)] = &[
    ("ns.test", DNS_ADDR),
    ("allowed.test", "10.99.1.10"),
    ("denied.test", "10.99.1.20"),
    ("a.wild.test", "10.99.1.30"),
    ("b.a.wild.test", "10.99.1.31"),
    ("wild.test", "10.99.1.32"),
    ("notwild.test", "10.99.1.33"),
];

pub fn addr_of(name: &str) -> &'static str {
    RECORDS.iter().find(|r| r.0 == name).unwrap().1
}

static SEQ: AtomicU32 = AtomicU32::new(0);

fn sh(args: &[&str]) {
    let o = Command::new(args[0]).args(&args[1..]).output().unwrap();
    assert!(
        o.status.success(),
        "{}: {}",
        args.join(" "),
        String::from_utf8_lossy(&o.stderr)
    );
}

pub fn require_root() {
    assert!(
        rustix::process::geteuid().is_root(),
        "privileged test: run as root (creates network namespaces, runs the daemon)"
    );
    assert!(
        Command::new("nft").arg("--version").output().is_ok(),
        "the nft binary is missing: apt-get install nftables (scripts/setup.sh)"
    );
}

/// The world: two namespaces, certificates, the world server.
pub struct World {
    pub tag: String,
    pub dir: PathBuf,
    pub host_ns: String,
    pub inet_ns: String,
    server: Option<Child>,
}

impl World {
    pub fn new() -> World {
        require_root();
        let n = SEQ.fetch_add(1, Ordering::Relaxed);
        let tag = format!("tw{}x{n}", std::process::id() % 100_000);
        let dir = std::env::temp_dir().join(format!("sandlot-net-world-{tag}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let w = World {
            host_ns: format!("{tag}-host"),
            inet_ns: format!("{tag}-inet"),
            tag,
            dir,
            server: None,
        };
        w.certificates();
        w.namespaces();
        let mut w = w;
        w.start_server();
        w
    }

    fn certificates(&self) {
        let d = |f: &str| self.dir.join(f).display().to_string();
        let names: Vec<String> = RECORDS.iter().map(|r| format!("DNS:{}", r.0)).collect();
        std::fs::write(
            self.dir.join("san.ext"),
            format!("subjectAltName={}\n", names.join(",")),
        )
        .unwrap();
        let ec = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ];
        let mut ca = vec!["openssl", "req", "-x509"];
        ca.extend(ec);
        let (cak, cap) = (d("ca.key"), d("ca.pem"));
        ca.extend([
            "-keyout",
            &cak,
            "-out",
            &cap,
            "-days",
            "2",
            "-subj",
            "/CN=sandlot test CA",
        ]);
        sh(&ca);
        let mut csr = vec!["openssl", "req"];
        csr.extend(ec);
        let (sk, sc) = (d("server.key"), d("server.csr"));
        csr.extend(["-keyout", &sk, "-out", &sc, "-subj", "/CN=allowed.test"]);
        sh(&csr);
        let (sp, ext) = (d("server.pem"), d("san.ext"));
        sh(&[
            "openssl",
            "x509",
            "-req",
            "-in",
            &sc,
            "-CA",
            &cap,
            "-CAkey",
            &cak,
            "-CAcreateserial",
            "-out",
            &sp,
            "-days",
            "2",
            "-extfile",
            &ext,
        ]);
    }

    fn namespaces(&self) {
        let (h, i) = (&self.host_ns, &self.inet_ns);
        let (hv, iv) = (format!("{}h", self.tag), format!("{}i", self.tag));
        sh(&["ip", "netns", "add", h]);
        sh(&["ip", "netns", "add", i]);
        sh(&[
            "ip", "link", "add", &hv, "netns", h, "type", "veth", "peer", "name", &iv, "netns", i,
        ]);
        sh(&[
            "ip",
            "-n",
            h,
            "addr",
            "add",
            &format!("{HOST_ADDR}/16"),
            "dev",
            &hv,
        ]);
        sh(&["ip", "-n", i, "addr", "add", "10.99.0.2/16", "dev", &iv]);
        for (_, a) in RECORDS {
            sh(&["ip", "-n", i, "addr", "add", &format!("{a}/16"), "dev", &iv]);
        }
        for ns in [h, i] {
            sh(&["ip", "-n", ns, "link", "set", "lo", "up"]);
        }
        sh(&["ip", "-n", h, "link", "set", &hv, "up"]);
        sh(&["ip", "-n", i, "link", "set", &iv, "up"]);
    }

    fn start_server(&mut self) {
        let records: serde_json::Map<String, serde_json::Value> = RECORDS
            .iter()
            .map(|(n, a)| (n.to_string(), serde_json::Value::from(*a)))
            .collect();
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/net_world/world.py");
        let child = Command::new("ip")
            .args(["netns", "exec", &self.inet_ns, "/usr/bin/python3"])
            .arg(script)
            .arg(&self.dir)
            .arg(serde_json::Value::Object(records).to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(
                std::fs::File::create(self.dir.join("world.err")).unwrap(),
            ))
            .spawn()
            .unwrap();
        self.server = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        while !self.dir.join("ready").exists() {
            assert!(
                Instant::now() < deadline,
                "the world server did not start: {}",
                std::fs::read_to_string(self.dir.join("world.err")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Lines the world server logged under `kind` (`dns`, `http`, `udp`).
    pub fn log(&self, kind: &str) -> Vec<String> {
        std::fs::read_to_string(self.dir.join(format!("{kind}.log")))
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }

    pub fn ca_pem(&self) -> Vec<u8> {
        std::fs::read(self.dir.join("ca.pem")).unwrap()
    }

    /// `nft list tables` inside the daemon's namespace.
    pub fn host_tables(&self) -> String {
        let o = Command::new("ip")
            .args(["netns", "exec", &self.host_ns, "nft", "list", "tables"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    /// Links of the daemon's namespace other than `lo` and the uplink.
    pub fn host_links(&self) -> Vec<String> {
        let o = Command::new("ip")
            .args(["-n", &self.host_ns, "-o", "link", "show"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .filter_map(|l| l.split(": ").nth(1))
            .map(|n| n.split('@').next().unwrap_or(n).to_string())
            .filter(|n| n != "lo" && *n != format!("{}h", self.tag))
            .collect()
    }
}

impl Drop for World {
    fn drop(&mut self) {
        if let Some(mut c) = self.server.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        for ns in [&self.host_ns, &self.inet_ns] {
            let _ = Command::new("ip").args(["netns", "del", ns]).output();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
        if !std::thread::panicking() {
            let left: Vec<String> = std::fs::read_dir("/run/netns")
                .map(|rd| {
                    rd.flatten()
                        .map(|e| e.file_name().to_string_lossy().into_owned())
                        .filter(|n| n.starts_with(&self.tag))
                        .collect()
                })
                .unwrap_or_default();
            assert!(left.is_empty(), "world namespaces left: {left:?}");
        }
    }
}

/// Slot name prefix of a daemon id prefix (as `sandlot_net::slot_prefix`).
pub fn slot_prefix(id_prefix: &str) -> String {
    let mut h: u32 = 0x811c9dc5;
    for b in id_prefix.bytes() {
        h ^= b as u32;
        h = h.wrapping_mul(0x01000193);
    }
    format!("sn{:06x}", h & 0xffffff)
}

/// `sandlot serve` running in the world's host namespace.
pub struct NetDaemon {
    child: Option<Child>,
    pub dir: PathBuf,
    pub socket: PathBuf,
    pub prefix: String,
    pub listen: String,
    host_ns: String,
}

impl NetDaemon {
    pub fn start(world: &World, extra_config: &str) -> NetDaemon {
        let dir = world.dir.join("daemon");
        std::fs::create_dir_all(&dir).unwrap();
        let config = dir.join("sandlot.toml");
        std::fs::write(
            &config,
            format!(
                "[network]\nupstream_dns = [\"{DNS_ADDR}:53\"]\nallow_private = [\"10.99.1.0/24\"]\n{}{extra_config}",
                if extra_config.contains("pool_size") { "" } else { "pool_size = 2\n" }
            ),
        )
        .unwrap();
        let prefix = format!("{}-", world.tag);
        let socket = dir.join("api.sock");
        let listen = format!("{HOST_ADDR}:7990");
        let ns = std::fs::File::open(format!("/run/netns/{}", world.host_ns)).unwrap();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_sandlot"));
        cmd.arg("serve")
            .arg("--data-dir")
            .arg(dir.join("data"))
            .arg("--socket")
            .arg(&socket)
            .arg("--listen")
            .arg(&listen)
            .arg("--id-prefix")
            .arg(&prefix)
            .arg("--config")
            .arg(&config)
            .env("SANDLOT_LOG", "info,sandlot_net=debug")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(
                std::fs::File::create(dir.join("daemon.log")).unwrap(),
            ));
        let fd = ns.as_raw_fd();
        // SAFETY: setns is async-signal-safe; it moves only the child into the
        // world's host namespace before exec.
        unsafe {
            cmd.pre_exec(move || {
                if libc::setns(fd, libc::CLONE_NEWNET) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd.spawn().expect("spawn sandlot serve");
        drop(ns);
        let mut d = NetDaemon {
            child: Some(child),
            dir,
            socket,
            prefix,
            listen,
            host_ns: world.host_ns.clone(),
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::os::unix::net::UnixStream::connect(&d.socket).is_err() {
            if let Some(st) = d.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("sandlot serve exited with {st}; log:\n{}", d.log());
            }
            assert!(
                Instant::now() < deadline,
                "daemon did not start:\n{}",
                d.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        d
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("daemon.log")).unwrap_or_default()
    }

    /// The daemon's pid.
    pub fn pid(&self) -> i32 {
        self.child.as_ref().expect("the daemon runs").id() as i32
    }

    /// Descriptors the daemon has open now.
    pub fn open_files(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.pid()))
            .map(|d| d.count())
            .unwrap_or(0)
    }

    /// What the daemon's descriptors are (for failure messages).
    pub fn open_file_targets(&self) -> Vec<String> {
        let dir = format!("/proc/{}/fd", self.pid());
        let mut v: Vec<String> = std::fs::read_dir(&dir)
            .map(|d| {
                d.flatten()
                    .filter_map(|e| std::fs::read_link(e.path()).ok())
                    .map(|p| p.display().to_string())
                    .collect()
            })
            .unwrap_or_default();
        v.sort();
        v
    }

    pub fn client(&self) -> Client {
        Client::new(&format!("unix://{}", self.socket.display()), None).unwrap()
    }

    pub fn slot_prefix(&self) -> String {
        slot_prefix(&self.prefix)
    }

    /// `sandlot ARGS` against this daemon: (code, stdout, stderr).
    pub fn cli(&self, args: &[&str]) -> (i32, String, String) {
        let o = Command::new(env!("CARGO_BIN_EXE_sandlot"))
            .args(args)
            .env("SANDLOT_HOST", format!("unix://{}", self.socket.display()))
            .stdin(Stdio::null())
            .output()
            .unwrap();
        (
            o.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&o.stdout).into_owned(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    }

    /// Slot namespaces of this daemon still present.
    pub fn slot_namespaces(&self) -> Vec<String> {
        let p = self.slot_prefix();
        std::fs::read_dir("/run/netns")
            .map(|rd| {
                rd.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| n.starts_with(&p))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Kills the daemon (SIGKILL): its sandboxes, slots and table stay.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Deletes every sandbox and stops the daemon (SIGTERM, graceful).
    pub fn stop(&mut self, rt: &tokio::runtime::Runtime) {
        if let Some(mut c) = self.child.take() {
            let client = self.client();
            rt.block_on(async {
                if let Ok(list) = client.list_sandboxes(&ListFilter::default()).await {
                    for s in list {
                        let _ = client.delete_sandbox(&s.id).await;
                    }
                }
            });
            let _ = rustix::process::kill_process(
                rustix::process::Pid::from_raw(c.id() as i32).unwrap(),
                rustix::process::Signal::TERM,
            );
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                if c.try_wait().unwrap().is_some() {
                    break;
                }
                if Instant::now() > deadline {
                    let _ = c.kill();
                    let _ = c.wait();
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

impl Drop for NetDaemon {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("daemon log:\n{}", self.log());
        }
        if self.child.is_some() {
            // A failed test: delete its sandboxes (they would outlive the daemon)
            // and stop the daemon gracefully.
            if let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                self.stop(&rt);
            }
        }
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        // Slots of a killed daemon: delete them so the host stays clean.
        for n in self.slot_namespaces() {
            let _ = Command::new("ip").args(["netns", "del", &n]).output();
        }
    }
}

pub fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}
