//! The runtime benchmark's second peer: bubblewrap doing the isolation work of a
//! `sandlot run --image host` sandbox, so that `sandlot run` is compared with a
//! tool that does what it does, not only with bubblewrap doing less.
//!
//! Matched: every namespace, capabilities dropped, Sandlot's own seccomp filter,
//! the `host` image's mounts (read-only `/usr`, each allowed `/etc` entry, the
//! devices, `/proc` with the same masks, read-only `/sys` with `/sys/firmware`
//! hidden, `/tmp`), and the five cgroup directories (v1; one on v2) made with the
//! same limits under a parent made and removed with them, the command born inside.
//! Not matched (bubblewrap has no such step): Landlock, the agent and its socket,
//! the files Sandlot writes into the root (`/etc/passwd`, `/etc/hosts`, ...).

use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use sandlot_runtime::cgroup::{Cgroup, CgroupLayout, CgroupLimits, CgroupParent};
use sandlot_runtime::hostimage::{HostEntry, HostFacts};

use super::Timed;

/// The parent cgroup of the peer's runs (its own, so that a run never shares one
/// with sandboxes).
const PARENT: &str = "sandlot-bench-peer";

/// Bubblewrap with the work of a `sandlot run --image host` sandbox, ready to run.
pub struct MatchedBwrap {
    etc: Vec<(String, HostEntry)>,
    /// The image's top-level entries besides `/usr` (`/bin`, `/lib64`, ...).
    top: Vec<(String, HostEntry)>,
    filter: Vec<u8>,
    layout: CgroupLayout,
    /// This process's own cgroups, where it goes back after each run.
    home: Cgroup,
    limits: CgroupLimits,
    runs: u64,
}

impl MatchedBwrap {
    pub fn new() -> anyhow::Result<MatchedBwrap> {
        let host = HostFacts::probe(Path::new("/"));
        let layout = CgroupLayout::detect().context("find the cgroup hierarchies")?;
        let own = std::fs::read_to_string("/proc/self/cgroup").context("read /proc/self/cgroup")?;
        let home = own_cgroup(&layout, &own)?;
        // The process comes back here after each run: it must be where it is now
        // (in a container without a cgroup namespace, `/proc/self/cgroup` names
        // paths the mounts do not show).
        let me = std::process::id().to_string();
        for (_, d) in &home.dirs {
            let procs = std::fs::read_to_string(d.join("cgroup.procs")).unwrap_or_default();
            if !procs.lines().any(|l| l.trim() == me) {
                bail!(
                    "the bubblewrap peer needs this process's own cgroups: {} does not list it",
                    d.display()
                );
            }
        }
        let prog = sandlot_runtime::seccomp::compile(&sandlot_runtime::seccomp::default_policy())
            .context("compile the sandbox's seccomp filter")?;
        let filter = prog
            .iter()
            .flat_map(|i| {
                let mut b = Vec::with_capacity(8);
                b.extend_from_slice(&i.code.to_ne_bytes());
                b.push(i.jt);
                b.push(i.jf);
                b.extend_from_slice(&i.k.to_ne_bytes());
                b
            })
            .collect();
        sweep(&layout);
        let spec = sandlot_proto::spec::SandboxSpec::default();
        Ok(MatchedBwrap {
            top: host
                .top_level
                .into_iter()
                .filter(|(name, _)| name != "usr")
                .collect(),
            etc: host.etc,
            filter,
            layout,
            home,
            limits: CgroupLimits {
                memory_bytes: spec.resources.memory.bytes(),
                memory_high: None,
                pids: spec.resources.pids,
                cpus: spec.resources.cpus,
            },
            runs: 0,
        })
    }

    /// One run of `argv` to its exit: its cgroup made, this process moved in so
    /// that bubblewrap is born inside (as Sandlot's helper joins a sandbox's),
    /// the cgroup and its parent removed, all timed; this process's move back
    /// out, which a sandbox has no counterpart of, is not. The CPU is this
    /// process's own (the cgroup work, the spawn) and bubblewrap's.
    pub fn run(&mut self, argv: &[&str]) -> anyhow::Result<Timed> {
        self.runs += 1;
        let name = format!("run-{}-{}", std::process::id(), self.runs);
        let parent = CgroupParent::named(PARENT);
        let cpu0 = super::cpu_so_far()?;
        let t = Instant::now();
        let cg = match Cgroup::create(&self.layout, &parent, &name, &self.limits) {
            Ok(cg) => cg,
            Err(e) => {
                // A parent made on the way goes too.
                Cgroup::plan(&self.layout, PARENT, &name).remove_parent_if_empty();
                return Err(e).with_context(|| format!("create cgroup {PARENT}/{name}"));
            }
        };
        let ran = self.run_in(&cg, argv);
        let (back_cpu0, back_t) = (super::cpu_so_far()?, Instant::now());
        let back = self
            .home
            .attach(0)
            .context("move the benchmark back to its own cgroups");
        let (back_wall, back_cpu) = (
            back_t.elapsed(),
            super::cpu_so_far()?.saturating_sub(back_cpu0),
        );
        let removed = cg
            .remove(Duration::from_secs(5))
            .with_context(|| format!("remove cgroup {PARENT}/{name}"));
        cg.remove_parent_if_empty();
        let wall = t.elapsed().saturating_sub(back_wall);
        let cpu = super::cpu_so_far()?
            .saturating_sub(cpu0)
            .saturating_sub(back_cpu);
        ran?;
        back?;
        removed?;
        Ok(Timed { wall, cpu })
    }

    fn run_in(&self, cg: &Cgroup, argv: &[&str]) -> anyhow::Result<()> {
        cg.attach(0).context("join the run's cgroup")?;
        // bubblewrap reads the filter from a descriptor to its end: a pipe whose
        // write end is closed before the spawn (the filter is far below a pipe's
        // buffer) and whose read end is inherited. Its close-on-exec flag is
        // cleared here, not in the child (this crate has no `unsafe` for a
        // pre-exec hook): the benchmark spawns from one thread, so no other child
        // is started while it is clear, and it is closed right after.
        let (r, w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
            .context("create the filter's pipe")?;
        std::fs::File::from(w)
            .write_all(&self.filter)
            .context("write the seccomp filter")?;
        rustix::io::fcntl_setfd(&r, rustix::io::FdFlags::empty())
            .context("pass the filter's pipe on")?;
        let mut c = Command::new("bwrap");
        c.args(matched_args(&self.top, &self.etc, r.as_raw_fd()))
            .args(argv)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let out = c.output().context("run bwrap")?;
        if !out.status.success() {
            bail!(
                "bwrap with the sandbox's work failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(())
    }
}

/// Removes the run cgroups a killed benchmark left (`run-PID-N` whose PID is
/// gone; a running benchmark's stay), and their parent once empty.
fn sweep(layout: &CgroupLayout) {
    for (_, parent) in Cgroup::plan(layout, PARENT, "").dirs {
        if let Ok(rd) = std::fs::read_dir(&parent) {
            for e in rd.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if run_of_a_gone_process(&name, |pid| Path::new(&format!("/proc/{pid}")).exists()) {
                    let _ = std::fs::remove_dir(e.path());
                }
            }
        }
        let _ = std::fs::remove_dir(&parent);
    }
}

/// Whether cgroup `name` is a run cgroup (`run-PID-N`) of a process that is gone.
fn run_of_a_gone_process(name: &str, alive: impl Fn(u32) -> bool) -> bool {
    name.strip_prefix("run-")
        .and_then(|r| r.split_once('-'))
        .and_then(|(pid, _)| pid.parse::<u32>().ok())
        .is_some_and(|pid| !alive(pid))
}

/// bubblewrap's arguments before the command, for the `host` image's top-level
/// entries besides `/usr` and its `/etc` entries (each bound read-only, or a
/// symlink made), and the filter on descriptor `filter_fd`.
fn matched_args(
    top: &[(String, HostEntry)],
    etc: &[(String, HostEntry)],
    filter_fd: i32,
) -> Vec<String> {
    let mut a: Vec<String> = [
        "--unshare-all",
        "--die-with-parent",
        "--cap-drop",
        "ALL",
        "--ro-bind",
        "/usr",
        "/usr",
    ]
    .map(String::from)
    .to_vec();
    let entries = top
        .iter()
        .map(|(name, e)| (format!("/{name}"), e))
        .chain(etc.iter().map(|(rel, e)| (format!("/etc/{rel}"), e)));
    for (p, e) in entries {
        match e {
            HostEntry::Symlink(t) => a.extend(["--symlink".into(), t.clone(), p]),
            HostEntry::Dir | HostEntry::File => a.extend(["--ro-bind".into(), p.clone(), p]),
        }
    }
    // bubblewrap's `--proc` makes /proc/sys, /proc/irq, /proc/bus (and
    // /proc/sysrq-trigger) read-only itself; the sandbox's other masks follow.
    for x in [
        "--dev",
        "/dev",
        "--proc",
        "/proc",
        "--ro-bind",
        "/dev/null",
        "/proc/keys",
        "--ro-bind",
        "/dev/null",
        "/proc/timer_list",
        "--tmpfs",
        "/proc/acpi",
        "--tmpfs",
        "/proc/fs",
        "--ro-bind",
        "/sys",
        "/sys",
        "--tmpfs",
        "/sys/firmware",
        "--tmpfs",
        "/tmp",
        "--seccomp",
    ] {
        a.push(x.into());
    }
    a.push(filter_fd.to_string());
    a
}

/// The cgroups this process is in (from `/proc/self/cgroup`), one per hierarchy
/// of `layout`.
fn own_cgroup(layout: &CgroupLayout, proc_self_cgroup: &str) -> anyhow::Result<Cgroup> {
    // Lines: `ID:CONTROLLERS:PATH`; v2's is `0::PATH`.
    let path_of = |wanted: &dyn Fn(&str) -> bool| -> Option<PathBuf> {
        proc_self_cgroup.lines().find_map(|l| {
            let mut f = l.splitn(3, ':');
            let (_, ctrls, path) = (f.next()?, f.next()?, f.next()?);
            wanted(ctrls).then(|| PathBuf::from(path.trim_start_matches('/')))
        })
    };
    match layout {
        CgroupLayout::V2 { root } => {
            let p = path_of(&|c| c.is_empty()).context("no cgroup v2 line in /proc/self/cgroup")?;
            Ok(Cgroup {
                dirs: vec![(String::new(), root.join(p))],
                version: 2,
            })
        }
        CgroupLayout::V1 { controllers } => {
            let mut dirs = Vec::with_capacity(controllers.len());
            for (c, mount) in controllers {
                let p = path_of(&|ctrls| ctrls.split(',').any(|x| x == c))
                    .with_context(|| format!("no {c} line in /proc/self/cgroup"))?;
                dirs.push((c.clone(), mount.join(p)));
            }
            Ok(Cgroup { dirs, version: 1 })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_peer_binds_each_etc_entry_links_symlinks_and_reads_the_filter_from_its_descriptor() {
        let etc = vec![
            ("ld.so.cache".to_string(), HostEntry::File),
            ("ssl/certs".to_string(), HostEntry::Dir),
            (
                "os-release".to_string(),
                HostEntry::Symlink("../usr/lib/os-release".into()),
            ),
        ];
        let top = vec![
            ("bin".to_string(), HostEntry::Symlink("usr/bin".into())),
            ("lib32".to_string(), HostEntry::Dir),
        ];
        let a = matched_args(&top, &etc, 7);
        let s = a.join(" ");
        assert!(s.starts_with("--unshare-all --die-with-parent --cap-drop ALL --ro-bind /usr /usr"));
        assert!(s.contains("--symlink usr/bin /bin"));
        assert!(s.contains("--ro-bind /lib32 /lib32"));
        assert!(s.contains("--ro-bind /etc/ld.so.cache /etc/ld.so.cache"));
        assert!(s.contains("--ro-bind /etc/ssl/certs /etc/ssl/certs"));
        assert!(s.contains("--symlink ../usr/lib/os-release /etc/os-release"));
        assert!(s.contains("--ro-bind /dev/null /proc/keys"));
        assert!(s.contains("--tmpfs /sys/firmware"));
        assert_eq!(a[a.len() - 2..], ["--seccomp".to_string(), "7".to_string()]);
        // /etc comes after /usr and before /dev, /proc and /sys, as in the sandbox.
        let pos = |x: &str| a.iter().position(|y| y == x).unwrap();
        assert!(pos("/usr") < pos("/etc/ld.so.cache"));
        assert!(pos("/etc/ld.so.cache") < pos("/dev"));
    }

    #[test]
    fn only_run_cgroups_of_gone_processes_are_swept() {
        let alive = |pid| pid == 42;
        assert!(run_of_a_gone_process("run-7-3", alive));
        assert!(!run_of_a_gone_process("run-42-3", alive));
        assert!(!run_of_a_gone_process("run-x-3", alive));
        assert!(!run_of_a_gone_process("sandbox-7-3", alive));
        assert!(!run_of_a_gone_process("run-7", alive));
    }

    #[test]
    fn the_benchmarks_own_cgroups_come_from_its_proc_self_cgroup_lines() {
        let v1 = CgroupLayout::V1 {
            controllers: vec![
                ("memory".into(), PathBuf::from("/sys/fs/cgroup/memory")),
                ("cpu".into(), PathBuf::from("/sys/fs/cgroup/cpu,cpuacct")),
                (
                    "cpuacct".into(),
                    PathBuf::from("/sys/fs/cgroup/cpu,cpuacct"),
                ),
            ],
        };
        let lines =
            "12:pids:/\n4:cpu,cpuacct:/user.slice\n3:memory:/user.slice/x\n0::/user.slice/x\n";
        let cg = own_cgroup(&v1, lines).unwrap();
        assert_eq!(cg.version, 1);
        assert_eq!(
            cg.dirs,
            vec![
                (
                    "memory".to_string(),
                    PathBuf::from("/sys/fs/cgroup/memory/user.slice/x")
                ),
                (
                    "cpu".to_string(),
                    PathBuf::from("/sys/fs/cgroup/cpu,cpuacct/user.slice")
                ),
                (
                    "cpuacct".to_string(),
                    PathBuf::from("/sys/fs/cgroup/cpu,cpuacct/user.slice")
                ),
            ]
        );
        // A controller the file does not name is an error, not the root.
        assert!(own_cgroup(&v1, "3:memory:/\n").is_err());
        let v2 = CgroupLayout::V2 {
            root: PathBuf::from("/sys/fs/cgroup"),
        };
        let cg = own_cgroup(&v2, "0::/system.slice/ci.service\n").unwrap();
        assert_eq!(
            cg.dirs,
            vec![(
                String::new(),
                PathBuf::from("/sys/fs/cgroup/system.slice/ci.service")
            )]
        );
        assert!(own_cgroup(&v2, "3:memory:/\n").is_err());
    }
}
