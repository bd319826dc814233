//! The platform harness's peers: the same work on the host without isolation,
//! under bubblewrap and under crun, timed the way the sandboxes are.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde_json::json;

/// `argv` on the host without any isolation, with the environment the `host` image
/// gives a sandbox's processes (its `LANG` decides how many locale files a program
/// opens): the floor under the contenders.
pub(super) fn host_command(argv: &[&str]) -> Command {
    let mut c = Command::new(argv[0]);
    c.args(&argv[1..])
        .env_clear()
        .envs(sandlot_runtime::hostimage::base_env("bench"));
    c
}

/// Spawns `argv` on the host `n` times ([`host_command`]) and returns each
/// spawn-to-exit time with the output read: the floor for an exec round trip.
pub(super) fn host_spawn(argv: &[&str], n: usize) -> anyhow::Result<Vec<Duration>> {
    (0..n)
        .map(|_| {
            if super::platform::STOP_REQUESTED.load(std::sync::atomic::Ordering::SeqCst) {
                bail!("stopped");
            }
            let t = Instant::now();
            let out = host_command(argv)
                .stdin(Stdio::null())
                .output()
                .with_context(|| format!("spawn {} on the host", argv[0]))?;
            let d = t.elapsed();
            if !out.status.success() {
                bail!("{} on the host: {}", argv[0], out.status);
            }
            Ok(d)
        })
        .collect()
}

/// Runs `cmd` (which prints `hi`) and returns the time to its first output byte.
pub(super) fn first_byte(mut cmd: Command) -> anyhow::Result<Duration> {
    use std::io::Read;
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let t = Instant::now();
    let mut child = cmd
        .spawn()
        .with_context(|| format!("run {:?}", cmd.get_program()))?;
    let mut out = child.stdout.take().expect("piped");
    let mut b = [0u8; 8];
    let n = out.read(&mut b)?;
    let d = t.elapsed();
    let st = child.wait()?;
    if n == 0 || !st.success() {
        let mut e = String::new();
        if let Some(mut se) = child.stderr.take() {
            let _ = se.read_to_string(&mut e);
        }
        bail!("{:?} failed ({st}): {}", cmd.get_program(), e.trim());
    }
    Ok(d)
}

pub(super) fn bwrap_echo() -> Command {
    super::bwrap_command(&["/bin/echo", "hi"])
}

pub(super) fn host_echo() -> Command {
    host_command(&["/bin/echo", "hi"])
}

/// A crun bundle: read-only root with the host's /usr, /bin, /lib, /lib64 bound,
/// fresh namespaces, the default resources. Debian's crun refuses this host's
/// hybrid cgroup layout, so each run is wrapped in `unshare -m` with the empty v2
/// hierarchy unmounted; the wrapper's own cost is measured separately.
pub(super) struct CrunBundle {
    dir: PathBuf,
}

impl CrunBundle {
    pub(super) fn new() -> anyhow::Result<CrunBundle> {
        let dir = std::env::temp_dir().join(format!("sandlot-bench-crun-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("rootfs"))?;
        let st = Command::new("crun")
            .arg("spec")
            .current_dir(&dir)
            .status()
            .context("crun spec (Debian package crun)")?;
        if !st.success() {
            bail!("crun spec failed");
        }
        let p = dir.join("config.json");
        let mut cfg: serde_json::Value = serde_json::from_slice(&std::fs::read(&p)?)?;
        cfg["process"]["args"] = json!(["/bin/echo", "hi"]);
        cfg["process"]["terminal"] = json!(false);
        cfg["root"] = json!({"path": "rootfs", "readonly": true});
        let mounts = cfg["mounts"].as_array_mut().context("crun spec mounts")?;
        for d in ["usr", "bin", "lib", "lib64"] {
            if Path::new("/").join(d).exists() {
                std::fs::create_dir_all(dir.join("rootfs").join(d))?;
                mounts.push(json!({"destination": format!("/{d}"), "type": "bind",
                    "source": format!("/{d}"), "options": ["rbind", "ro"]}));
            }
        }
        std::fs::write(&p, serde_json::to_vec_pretty(&cfg)?)?;
        Ok(CrunBundle { dir })
    }

    pub(super) fn command(&self, n: usize) -> Command {
        let mut c = Command::new("unshare");
        c.args(["-m", "--propagation", "slave", "sh", "-c"])
            .arg(format!(
            "umount -l /sys/fs/cgroup/unified 2>/dev/null; exec crun run --bundle {} bench-{}-{n}",
            self.dir.display(),
            std::process::id()
        ));
        c
    }

    pub(super) fn wrapper_only() -> Command {
        let mut c = Command::new("unshare");
        c.args(["-m", "--propagation", "slave", "sh", "-c"])
            .arg("umount -l /sys/fs/cgroup/unified 2>/dev/null; exec echo hi");
        c
    }
}

impl Drop for CrunBundle {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

pub(super) fn peer_seq(
    n: usize,
    mut make: impl FnMut(usize) -> Command,
) -> anyhow::Result<Vec<Duration>> {
    (0..n).map(|i| first_byte(make(i))).collect()
}

pub(super) fn peer_burst(
    k: usize,
    make: impl Fn(usize) -> Command + Sync,
) -> anyhow::Result<Vec<Duration>> {
    std::thread::scope(|s| {
        let make = &make;
        let hs: Vec<_> = (0..k)
            .map(|i| s.spawn(move || first_byte(make(i))))
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("peer thread"))
            .collect()
    })
}
