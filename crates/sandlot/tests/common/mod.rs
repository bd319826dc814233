//! Shared helpers of the privileged end-to-end tests: run the real `sandlot` binary and
//! check that a sandbox left nothing behind.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

pub fn sandlot() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_sandlot"))
}

/// Fails the test loudly unless it runs as root (CI does).
pub fn require_root() {
    assert!(
        rustix::process::geteuid().is_root(),
        "privileged test: run as root (namespaces, cgroups and mounts need it); CI runs as root"
    );
}

static SEQ: AtomicU32 = AtomicU32::new(0);

/// A sandbox id unique to this test process and call.
pub fn unique_id(tag: &str) -> String {
    format!(
        "t{}-{}-{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed),
        tag
    )
}

/// `sandlot run --id ID ARGS...`, capturing output.
pub fn run(id: &str, args: &[&str]) -> Output {
    run_with_stdin(id, args, &[])
}

pub fn run_with_stdin(id: &str, args: &[&str], stdin: &[u8]) -> Output {
    require_root();
    let mut child = Command::new(sandlot())
        .arg("run")
        .arg("--id")
        .arg(id)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn sandlot run");
    let mut sin = child.stdin.take().unwrap();
    let data = stdin.to_vec();
    let writer = std::thread::spawn(move || {
        use std::io::Write;
        let _ = sin.write_all(&data);
    });
    let out = child.wait_with_output().expect("wait sandlot run");
    writer.join().unwrap();
    assert_no_leftovers(id);
    out
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Runs a shell snippet in a fresh sandbox and returns (exit code, stdout, stderr).
pub fn sh(id: &str, flags: &[&str], script: &str) -> (i32, String, String) {
    let mut args: Vec<&str> = flags.to_vec();
    args.extend(["--", "/bin/sh", "-c", script]);
    let o = run(id, &args);
    (o.status.code().unwrap_or(-1), stdout(&o), stderr(&o))
}

fn cgroup_dirs(id: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for root in ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"] {
        let p = Path::new(root).join("sandlot").join(id);
        out.push(p);
    }
    if let Ok(rd) = std::fs::read_dir("/sys/fs/cgroup") {
        for e in rd.flatten() {
            out.push(e.path().join("sandlot").join(id));
        }
    }
    out
}

/// Asserts that sandbox `id` left no cgroup, run directory, mount or process.
pub fn assert_no_leftovers(id: &str) {
    for d in cgroup_dirs(id) {
        assert!(!d.exists(), "leftover cgroup {}", d.display());
    }
    for dir in ["/run/sandlot/sandboxes", "/run/sandlot/gvisor"] {
        let run_dir = Path::new(dir).join(id);
        assert!(!run_dir.exists(), "leftover run dir {}", run_dir.display());
    }
    let runsc = host_processes_matching(&format!("/run/sandlot/gvisor/{id}/"));
    assert!(runsc.is_empty(), "leftover gVisor processes: {runsc:?}");
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mounts.contains(id), "leftover mount mentioning {id}");
    assert!(
        !mounts.contains("/run/sandlot/root"),
        "a sandbox root leaked into the host mount namespace"
    );
}

/// Processes on the host whose command line contains `needle`.
pub fn host_processes_matching(needle: &str) -> Vec<String> {
    let mut v = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let name = e.file_name();
        let Some(pid) = name.to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        if pid == std::process::id() {
            continue;
        }
        if let Ok(c) = std::fs::read(e.path().join("cmdline")) {
            let c = String::from_utf8_lossy(&c).replace('\0', " ");
            if c.contains(needle) {
                v.push(format!("{pid}: {c}"));
            }
        }
    }
    v
}
