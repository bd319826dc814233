//! Resource limits and accounting with cgroups, v1 or v2, chosen at runtime.
//!
//! A sandbox gets one cgroup per hierarchy (v2: one directory; v1: one per controller:
//! memory, pids, cpu, cpuacct, freezer) named `<parent>/<sandbox id>`.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error("no usable cgroup hierarchy: {0}")]
    Unavailable(String),
    #[error("create cgroup {path}: {source}")]
    Create { path: PathBuf, source: io::Error },
    #[error("write {value:?} to {path}: {source}")]
    Write {
        path: PathBuf,
        value: String,
        source: io::Error,
    },
    #[error("remove cgroup {path}: {source}")]
    Remove { path: PathBuf, source: io::Error },
}

/// The v1 controllers Sandlot uses.
pub const V1_CONTROLLERS: &[&str] = &["memory", "pids", "cpu", "cpuacct", "freezer"];

/// Polls (200 µs apart) of a v1 freeze still FREEZING between two asks again.
const V1_FREEZE_ASK_EVERY: u32 = 25;
/// Asks again between two brief thaws.
const V1_FREEZE_THAW_EVERY: u32 = 10;

/// Where the cgroup hierarchies are mounted on this host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum CgroupLayout {
    /// The unified hierarchy with the memory, pids and cpu controllers available.
    V2 { root: PathBuf },
    /// Legacy hierarchies: controller name -> mount point.
    V1 { controllers: Vec<(String, PathBuf)> },
}

impl CgroupLayout {
    /// Reads `/proc/self/mountinfo` to find the hierarchies. Prefers v2 when its
    /// root offers the memory controller; otherwise uses the v1 controllers.
    pub fn detect() -> Result<CgroupLayout, CgroupError> {
        let mi = fs::read_to_string("/proc/self/mountinfo")
            .map_err(|e| CgroupError::Unavailable(format!("read /proc/self/mountinfo: {e}")))?;
        Self::from_mountinfo(&mi, |p| fs::read_to_string(p).ok())
    }

    /// Pure detection over a mountinfo text; `read` reads a file (injected for tests).
    pub fn from_mountinfo(
        mountinfo: &str,
        read: impl Fn(&Path) -> Option<String>,
    ) -> Result<CgroupLayout, CgroupError> {
        let mut v1: Vec<(String, PathBuf)> = Vec::new();
        let mut v2: Option<PathBuf> = None;
        for line in mountinfo.lines() {
            let Some((pre, post)) = line.split_once(" - ") else {
                continue;
            };
            let pre: Vec<&str> = pre.split(' ').collect();
            let post: Vec<&str> = post.split(' ').collect();
            if pre.len() < 5 || post.len() < 3 {
                continue;
            }
            let mount_point = PathBuf::from(pre[4]);
            match post[0] {
                "cgroup2" => {
                    let controllers =
                        read(&mount_point.join("cgroup.controllers")).unwrap_or_default();
                    let has = |c: &str| controllers.split_whitespace().any(|x| x == c);
                    if has("memory") && has("pids") && v2.is_none() {
                        v2 = Some(mount_point);
                    }
                }
                "cgroup" => {
                    for opt in post[2].split(',') {
                        if V1_CONTROLLERS.contains(&opt) && !v1.iter().any(|(c, _)| c == opt) {
                            v1.push((opt.to_string(), mount_point.clone()));
                        }
                    }
                }
                _ => {}
            }
        }
        if let Some(root) = v2 {
            return Ok(CgroupLayout::V2 { root });
        }
        for needed in ["memory", "pids"] {
            if !v1.iter().any(|(c, _)| c == needed) {
                return Err(CgroupError::Unavailable(format!(
                    "neither a cgroup v2 hierarchy with the memory and pids controllers nor a v1 {needed} hierarchy is mounted"
                )));
            }
        }
        Ok(CgroupLayout::V1 { controllers: v1 })
    }

    pub fn version(&self) -> u8 {
        match self {
            CgroupLayout::V2 { .. } => 2,
            CgroupLayout::V1 { .. } => 1,
        }
    }
}

/// The outcome of [`favor_dynamic_modifications`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FavorDynmods {
    /// The unified hierarchy at this path already had `favordynmods`.
    AlreadyOn(PathBuf),
    /// It was remounted with `favordynmods` now.
    Enabled(PathBuf),
    /// No cgroup v2 mount: the option exists only there (v1-only host).
    NoUnifiedHierarchy,
}

/// What to do to turn `favordynmods` on: the cgroup2 mount point, and the mount
/// data to remount it with (its current superblock options plus `favordynmods`),
/// or `None` when the option is already set. `None` overall: no cgroup2 mount.
///
/// Every attach of a process to a cgroup (writing `cgroup.procs`, in each v1
/// hierarchy) takes the kernel's global threadgroup rwsem for writing; by default
/// that waits for an RCU grace period while holding `cgroup_mutex`, so concurrent
/// sandbox creates queue behind each other's grace periods. With `favordynmods`
/// (a flag of the cgroup2 root; the rwsem it switches is shared by every
/// hierarchy, v1 included) the attach no longer waits, at the price of slightly
/// slower fork and exit. The remount must repeat the superblock options because a cgroup2
/// reconfigure sets every flag from the new option list.
pub fn favordynmods_plan(mountinfo: &str) -> Option<(PathBuf, Option<String>)> {
    for line in mountinfo.lines() {
        let Some((pre, post)) = line.split_once(" - ") else {
            continue;
        };
        let pre: Vec<&str> = pre.split(' ').collect();
        let post: Vec<&str> = post.split(' ').collect();
        if pre.len() < 5 || post.len() < 3 || post[0] != "cgroup2" {
            continue;
        }
        let mount_point = PathBuf::from(pre[4]);
        let opts: Vec<&str> = post[2]
            .split(',')
            .filter(|o| !o.is_empty() && *o != "rw" && *o != "ro")
            .collect();
        if opts.contains(&"favordynmods") {
            return Some((mount_point, None));
        }
        let mut data = opts.join(",");
        if !data.is_empty() {
            data.push(',');
        }
        data.push_str("favordynmods");
        return Some((mount_point, Some(data)));
    }
    None
}

/// Turns the cgroup root flag `favordynmods` on (see [`favordynmods_plan`]). A
/// host-wide setting: the daemon applies it at start unless the operator opts out.
pub fn favor_dynamic_modifications() -> Result<FavorDynmods, CgroupError> {
    let mi = fs::read_to_string("/proc/self/mountinfo")
        .map_err(|e| CgroupError::Unavailable(format!("read /proc/self/mountinfo: {e}")))?;
    let Some((mount_point, data)) = favordynmods_plan(&mi) else {
        return Ok(FavorDynmods::NoUnifiedHierarchy);
    };
    let Some(data) = data else {
        return Ok(FavorDynmods::AlreadyOn(mount_point));
    };
    let remount = |source: io::Error| CgroupError::Write {
        path: mount_point.clone(),
        value: format!("remount,{data}"),
        source,
    };
    let target = crate::sys::cstr(&mount_point).map_err(remount)?;
    let cdata = std::ffi::CString::new(data.clone())
        .map_err(|_| remount(io::Error::from(io::ErrorKind::InvalidInput)))?;
    crate::sys::mount(None, &target, None, libc::MS_REMOUNT, Some(&cdata)).map_err(remount)?;
    Ok(FavorDynmods::Enabled(mount_point))
}

/// Limits written into a sandbox's cgroup.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct CgroupLimits {
    /// The hard limit: past it the host kernel's OOM killer acts in the cgroup.
    pub memory_bytes: u64,
    /// A line below the hard limit that a watcher acts on (a gVisor sandbox's
    /// declared limit, its hard limit leaving headroom for gVisor's own processes):
    /// cgroup v2 `memory.high` (reclaim and throttling past it, counted as `high`
    /// in `memory.events`); v1 has no such file, its watcher uses a usage threshold
    /// instead (`crate::memory_watch`). `None`: no line.
    #[serde(default)]
    pub memory_high: Option<u64>,
    pub pids: u32,
    pub cpus: Option<f64>,
}

/// The sandboxes' parent cgroup, and what is set on it whenever the runtime
/// creates it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupParent {
    /// Relative to each hierarchy's root (`sandlot`).
    pub name: String,
    /// The CPU weight of all sandboxes together against the parent's siblings (the
    /// daemon's own cgroup among them): cgroup v2 `cpu.weight` (1 to 10000, the
    /// kernel's default 100); on v1 `cpu.shares`, scaled (100 is 1024). It only
    /// matters when the CPUs are contended. `None`: left as the kernel made it.
    pub cpu_weight: Option<u32>,
}

impl CgroupParent {
    /// A parent with nothing set on it.
    pub fn named(name: &str) -> CgroupParent {
        CgroupParent {
            name: name.to_string(),
            cpu_weight: None,
        }
    }
}

/// The files to write into the parent, as (controller, file, value).
pub fn parent_writes(
    layout: &CgroupLayout,
    p: &CgroupParent,
) -> Vec<(&'static str, &'static str, String)> {
    let Some(w) = p.cpu_weight else {
        return Vec::new();
    };
    let w = w.clamp(1, 10_000);
    match layout {
        CgroupLayout::V2 { .. } => vec![("", "cpu.weight", w.to_string())],
        // v1 shares range from 2 to 262144; 100 is the default 1024.
        CgroupLayout::V1 { .. } => {
            vec![(
                "cpu",
                "cpu.shares",
                (u64::from(w) * 1024 / 100).max(2).to_string(),
            )]
        }
    }
}

/// Writes the parent's settings ([`parent_writes`]) into its directories, if
/// they exist.
pub fn write_parent_settings(layout: &CgroupLayout, p: &CgroupParent) -> Result<(), CgroupError> {
    let dirs = Cgroup::plan(layout, &p.name, "");
    for (ctrl, file, value) in parent_writes(layout, p) {
        let Some(dir) = dirs.dir_of(ctrl) else {
            continue;
        };
        write_file(dir.join(file), &value)?;
    }
    Ok(())
}

/// The files to write, as (controller, file, value): the plan, separate from I/O.
pub fn limit_writes(
    layout: &CgroupLayout,
    l: &CgroupLimits,
) -> Vec<(&'static str, &'static str, String)> {
    const PERIOD: u64 = 100_000;
    let quota = l
        .cpus
        .map(|c| ((c * PERIOD as f64).round() as u64).max(1000));
    match layout {
        CgroupLayout::V2 { .. } => {
            let mut w = vec![
                ("", "memory.max", l.memory_bytes.to_string()),
                ("", "memory.swap.max", "0".to_string()),
                ("", "pids.max", l.pids.to_string()),
            ];
            if let Some(h) = l.memory_high {
                w.push(("", "memory.high", h.min(l.memory_bytes).to_string()));
            }
            if let Some(q) = quota {
                w.push(("", "cpu.max", format!("{q} {PERIOD}")));
            }
            w
        }
        CgroupLayout::V1 { .. } => {
            let mut w = vec![
                (
                    "memory",
                    "memory.limit_in_bytes",
                    l.memory_bytes.to_string(),
                ),
                (
                    "memory",
                    "memory.memsw.limit_in_bytes",
                    l.memory_bytes.to_string(),
                ),
                ("pids", "pids.max", l.pids.to_string()),
            ];
            // A new cgroup's period is the kernel's 100 ms (`PERIOD`): only the quota
            // is written, one write per create.
            if let Some(q) = quota {
                w.push(("cpu", "cpu.cfs_quota_us", q.to_string()));
            }
            w
        }
    }
}

/// Resource usage read from cgroup accounting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Usage {
    pub cpu_usec: u64,
    pub memory_bytes: u64,
    pub memory_peak_bytes: u64,
    pub pids: u64,
    pub oom_kills: u64,
}

/// One sandbox's cgroup(s).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cgroup {
    /// v2: one directory. v1: (controller, directory) per controller.
    pub dirs: Vec<(String, PathBuf)>,
    pub version: u8,
}

fn write_file(path: PathBuf, value: &str) -> Result<(), CgroupError> {
    fs::write(&path, value).map_err(|source| CgroupError::Write {
        path,
        value: value.to_string(),
        source,
    })
}

impl Cgroup {
    /// The directories a sandbox named `name` gets under `parent` (no I/O).
    pub fn plan(layout: &CgroupLayout, parent: &str, name: &str) -> Cgroup {
        match layout {
            CgroupLayout::V2 { root } => Cgroup {
                dirs: vec![(String::new(), root.join(parent).join(name))],
                version: 2,
            },
            CgroupLayout::V1 { controllers } => Cgroup {
                dirs: controllers
                    .iter()
                    .map(|(c, mp)| (c.clone(), mp.join(parent).join(name)))
                    .collect(),
                version: 1,
            },
        }
    }

    /// Creates the directories (and the parent, enabling v2 controllers on the way)
    /// and writes the limits. On failure, whatever was created is removed.
    pub fn create(
        layout: &CgroupLayout,
        parent: &CgroupParent,
        name: &str,
        limits: &CgroupLimits,
    ) -> Result<Cgroup, CgroupError> {
        let cg = Cgroup::make_dirs(layout, parent, name)?;
        if let Err(e) = cg.write_limits(layout, limits) {
            let _ = cg.remove(Duration::from_millis(100));
            return Err(e);
        }
        Ok(cg)
    }

    /// Creates the directories (and the parent, enabling v2 controllers on the way
    /// and writing its settings when this call made it), without limits. On
    /// failure, whatever was created is removed.
    pub fn make_dirs(
        layout: &CgroupLayout,
        parent: &CgroupParent,
        name: &str,
    ) -> Result<Cgroup, CgroupError> {
        let cg = Cgroup::plan(layout, &parent.name, name);
        let r = (|| {
            let mut new_parent = false;
            if let CgroupLayout::V2 { root } = layout {
                new_parent = ensure_v2_parent(root, &parent.name)?;
            }
            for (_, d) in &cg.dirs {
                match fs::create_dir(d) {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {
                        // The parent first (the usual case: this is the only
                        // sandbox), then the directory; not the child again first.
                        let made = match d.parent() {
                            Some(p) => fs::create_dir_all(p),
                            None => Ok(()),
                        };
                        made.and_then(|()| fs::create_dir(d)).map_err(|source| {
                            CgroupError::Create {
                                path: d.clone(),
                                source,
                            }
                        })?;
                        new_parent = true;
                    }
                    Err(source) => {
                        return Err(CgroupError::Create {
                            path: d.clone(),
                            source,
                        })
                    }
                }
            }
            // Only when the parent is new: the create path does not pay for it.
            if new_parent {
                write_parent_settings(layout, parent)?;
            }
            Ok(())
        })();
        if let Err(e) = r {
            let _ = cg.remove(Duration::from_millis(100));
            return Err(e);
        }
        Ok(cg)
    }

    /// Writes `limits` into the cgroup's files (see [`limit_writes`]).
    pub fn write_limits(
        &self,
        layout: &CgroupLayout,
        limits: &CgroupLimits,
    ) -> Result<(), CgroupError> {
        for (ctrl, file, value) in limit_writes(layout, limits) {
            let Some(dir) = self.dir_of(ctrl) else {
                continue;
            };
            let path = dir.join(file);
            // memsw exists only with swap accounting; absent is fine.
            if file == "memory.memsw.limit_in_bytes" && !path.exists() {
                continue;
            }
            if file == "memory.swap.max" && !path.exists() {
                continue;
            }
            write_file(path, &value)?;
        }
        Ok(())
    }

    pub(crate) fn dir_of(&self, ctrl: &str) -> Option<&Path> {
        self.dirs
            .iter()
            .find(|(c, _)| self.version == 2 || c == ctrl)
            .map(|(_, d)| d.as_path())
    }

    /// Freezes (or thaws) every process of the cgroup and, when freezing, waits
    /// until the kernel reports it frozen (v2 `cgroup.freeze` and `cgroup.events`;
    /// v1 `freezer.state`), at most `wait`.
    pub fn freeze(&self, frozen: bool, wait: Duration) -> Result<(), CgroupError> {
        let (file, value, done): (PathBuf, &str, Box<dyn Fn() -> bool>) = if self.version == 2 {
            let d = self
                .dir_of("")
                .ok_or_else(|| CgroupError::Unavailable("no cgroup directory".into()))?
                .to_path_buf();
            let ev = d.join("cgroup.events");
            let want = if frozen { "frozen 1" } else { "frozen 0" };
            (
                d.join("cgroup.freeze"),
                if frozen { "1" } else { "0" },
                Box::new(move || {
                    fs::read_to_string(&ev).is_ok_and(|s| s.lines().any(|l| l.trim() == want))
                }),
            )
        } else {
            let f = self
                .dir_of("freezer")
                .ok_or_else(|| CgroupError::Unavailable("no freezer hierarchy".into()))?
                .join("freezer.state");
            let want = if frozen { "FROZEN" } else { "THAWED" };
            let g = f.clone();
            (
                f,
                want,
                Box::new(move || fs::read_to_string(&g).is_ok_and(|s| s.trim() == want)),
            )
        };
        write_file(file.clone(), value)?;
        let deadline = Instant::now() + wait;
        let mut polls = 0u32;
        // Nothing half frozen is left behind a failure.
        let thaw_after = |e: CgroupError| {
            if frozen {
                let _ = self.freeze(false, Duration::from_millis(0));
            }
            e
        };
        while !done() {
            polls += 1;
            if self.version == 1 && frozen && polls.is_multiple_of(V1_FREEZE_ASK_EVERY) {
                // v1's freezer can stay FREEZING when a task was forking or in
                // the kernel as the freeze began: asking again freezes what has
                // come along since, and now and then a brief thaw lets a task
                // stuck in between move on to where it freezes. Each ask walks
                // the cgroup's tasks under the kernel's freezer lock, so not on
                // every poll.
                if polls.is_multiple_of(V1_FREEZE_ASK_EVERY * V1_FREEZE_THAW_EVERY) {
                    write_file(file.clone(), "THAWED").map_err(thaw_after)?;
                    std::thread::sleep(Duration::from_millis(10));
                }
                write_file(file.clone(), value).map_err(thaw_after)?;
            }
            if Instant::now() >= deadline {
                return Err(thaw_after(CgroupError::Write {
                    path: file,
                    value: value.to_string(),
                    source: io::Error::new(io::ErrorKind::TimedOut, "the cgroup did not settle"),
                }));
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        Ok(())
    }

    /// Moves process `pid` (0 = the caller) into every hierarchy.
    pub fn attach(&self, pid: i32) -> Result<(), CgroupError> {
        for (_, d) in &self.dirs {
            write_file(d.join("cgroup.procs"), &pid.to_string())?;
        }
        Ok(())
    }

    /// Processes currently in the cgroup.
    pub fn pids(&self) -> Vec<i32> {
        let Some((_, d)) = self
            .dirs
            .iter()
            .find(|(c, _)| self.version == 2 || c == "pids" || c == "memory")
        else {
            return Vec::new();
        };
        fs::read_to_string(d.join("cgroup.procs"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    }

    /// Kills every process in the cgroup (v2: `cgroup.kill`; v1: freeze, SIGKILL each
    /// pid, thaw) and waits up to `wait` for it to empty.
    pub fn kill_all(&self, wait: Duration) -> bool {
        // The usual case at teardown on v1: PID 1 has been reaped, and its pid
        // namespace with it, so nothing is left to freeze (two cgroupfs writes saved).
        // v2's `cgroup.kill` is one write and also reaches nested cgroups.
        if self.version == 1 && self.pids().is_empty() {
            return true;
        }
        if self.version == 2 {
            if let Some(d) = self.dir_of("") {
                let _ = fs::write(d.join("cgroup.kill"), "1");
            }
        } else {
            let freezer = self.dir_of("freezer").map(|d| d.join("freezer.state"));
            if let Some(f) = &freezer {
                let _ = fs::write(f, "FROZEN");
            }
            for pid in self.pids() {
                let _ = crate::sys::kill(pid, libc::SIGKILL);
            }
            if let Some(f) = &freezer {
                let _ = fs::write(f, "THAWED");
            }
        }
        let deadline = Instant::now() + wait;
        loop {
            if self.pids().is_empty() {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            for pid in self.pids() {
                let _ = crate::sys::kill(pid, libc::SIGKILL);
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    /// Removes the directories, retrying while the kernel still tears processes down.
    pub fn remove(&self, wait: Duration) -> Result<(), CgroupError> {
        let deadline = Instant::now() + wait;
        for (_, d) in &self.dirs {
            loop {
                match fs::remove_dir(d) {
                    Ok(()) => break,
                    Err(e) if e.kind() == io::ErrorKind::NotFound => break,
                    Err(e)
                        if e.raw_os_error() == Some(libc::EBUSY) && Instant::now() < deadline =>
                    {
                        std::thread::sleep(Duration::from_micros(200));
                    }
                    Err(source) => {
                        return Err(CgroupError::Remove {
                            path: d.clone(),
                            source,
                        })
                    }
                }
            }
        }
        Ok(())
    }

    /// Removes the parent directories if no other sandbox uses them.
    pub fn remove_parent_if_empty(&self) {
        for (_, d) in &self.dirs {
            if let Some(p) = d.parent() {
                let _ = fs::remove_dir(p);
            }
        }
    }

    pub fn exists(&self) -> bool {
        self.dirs.iter().any(|(_, d)| d.exists())
    }

    /// Reads accounting. Missing files read as zero.
    pub fn usage(&self) -> Usage {
        let read = |ctrl: &str, file: &str| -> Option<String> {
            self.dir_of(ctrl)
                .and_then(|d| read_counter_file(&d.join(file)).ok())
        };
        let num = |s: Option<String>| s.and_then(|s| s.trim().parse::<u64>().ok()).unwrap_or(0);
        let key = |s: Option<String>, k: &str| -> u64 {
            s.and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix(k).and_then(|v| v.trim().parse().ok()))
            })
            .unwrap_or(0)
        };
        if self.version == 2 {
            Usage {
                cpu_usec: key(read("", "cpu.stat"), "usage_usec "),
                memory_bytes: num(read("", "memory.current")),
                memory_peak_bytes: num(read("", "memory.peak")),
                pids: num(read("", "pids.current")),
                oom_kills: key(read("", "memory.events"), "oom_kill "),
            }
        } else {
            Usage {
                cpu_usec: num(read("cpuacct", "cpuacct.usage")) / 1000,
                memory_bytes: num(read("memory", "memory.usage_in_bytes")),
                memory_peak_bytes: num(read("memory", "memory.max_usage_in_bytes")),
                pids: num(read("pids", "pids.current")),
                oom_kills: key(read("memory", "memory.oom_control"), "oom_kill "),
            }
        }
    }
}

/// Reads a small cgroup file (a counter, or a few `key value` lines) with one
/// `read` into a stack buffer: API reads of a sandbox sample five of them, and
/// `fs::read_to_string` would add a `statx` and a second `read` to each.
///
/// A cgroup file is generated whole on each read, so a read that leaves room in
/// the buffer has reached its end; a fuller file is read on until its end.
fn read_counter_file(path: &Path) -> io::Result<String> {
    use std::io::Read;
    let mut f = fs::File::open(path)?;
    let mut buf = [0u8; 512];
    let n = f.read(&mut buf)?;
    let mut text = String::from_utf8_lossy(&buf[..n]).into_owned();
    if n == buf.len() {
        f.read_to_string(&mut text)?;
    }
    Ok(text)
}

/// Creates `root/parent` and enables the controllers Sandlot needs on the way down.
/// Whether this call created `parent` itself.
fn ensure_v2_parent(root: &Path, parent: &str) -> Result<bool, CgroupError> {
    let mut dir = root.to_path_buf();
    let enable = |d: &Path| {
        // Best effort: a controller may already be enabled or unavailable at this level.
        for c in ["+memory", "+pids", "+cpu"] {
            let _ = fs::write(d.join("cgroup.subtree_control"), c);
        }
    };
    enable(&dir);
    let mut created = false;
    for comp in Path::new(parent).components() {
        dir.push(comp);
        match fs::create_dir(&dir) {
            Ok(()) => created = true,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => created = false,
            Err(source) => {
                return Err(CgroupError::Create {
                    path: dir.clone(),
                    source,
                })
            }
        }
        enable(&dir);
    }
    Ok(created)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_parent_weight_is_written_in_each_version_s_terms() {
        let v2 = CgroupLayout::V2 {
            root: PathBuf::from("/sys/fs/cgroup"),
        };
        let v1 = CgroupLayout::V1 {
            controllers: vec![("cpu".into(), PathBuf::from("/sys/fs/cgroup/cpu"))],
        };
        let p = |w| CgroupParent {
            name: "sandlot".into(),
            cpu_weight: w,
        };
        assert!(parent_writes(&v2, &p(None)).is_empty());
        assert_eq!(
            parent_writes(&v2, &p(Some(50))),
            [("", "cpu.weight", "50".to_string())]
        );
        assert_eq!(
            parent_writes(&v1, &p(Some(50))),
            [("cpu", "cpu.shares", "512".to_string())]
        );
        assert_eq!(
            parent_writes(&v1, &p(Some(100))),
            [("cpu", "cpu.shares", "1024".to_string())]
        );
        // Out of the kernel's range: clamped.
        assert_eq!(parent_writes(&v2, &p(Some(0)))[0].2, "1",);
        assert_eq!(parent_writes(&v2, &p(Some(20_000)))[0].2, "10000");
        assert_eq!(parent_writes(&v1, &p(Some(0)))[0].2, "10");
    }

    #[test]
    fn counter_files_are_read_whole_whatever_their_size() {
        let dir = std::env::temp_dir().join(format!("sandlot-cg-read-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let small = dir.join("memory.current");
        fs::write(&small, "458752\n").unwrap();
        assert_eq!(read_counter_file(&small).unwrap(), "458752\n");
        // Longer than the one-read buffer, as v2 `cpu.stat` can grow.
        let long: String = (0..100)
            .map(|i| format!("key_{i} {}\n", i * 1000))
            .collect();
        assert!(long.len() > 512);
        let big = dir.join("cpu.stat");
        fs::write(&big, &long).unwrap();
        assert_eq!(read_counter_file(&big).unwrap(), long);
        let exact = dir.join("exact");
        fs::write(&exact, "x".repeat(512)).unwrap();
        assert_eq!(read_counter_file(&exact).unwrap(), "x".repeat(512));
        assert_eq!(
            read_counter_file(&dir.join("missing")).unwrap_err().kind(),
            io::ErrorKind::NotFound
        );
        fs::remove_dir_all(&dir).unwrap();
    }

    const HYBRID: &str = "\
35 24 0:30 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
36 35 0:31 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
37 35 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
38 35 0:33 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
39 35 0:34 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct
40 35 0:35 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer
";

    #[test]
    fn favordynmods_remount_keeps_the_superblock_options() {
        assert_eq!(
            favordynmods_plan(HYBRID),
            Some((
                PathBuf::from("/sys/fs/cgroup/unified"),
                Some("favordynmods".to_string())
            ))
        );
        let unified = "30 24 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot\n";
        assert_eq!(
            favordynmods_plan(unified),
            Some((
                PathBuf::from("/sys/fs/cgroup"),
                Some("nsdelegate,memory_recursiveprot,favordynmods".to_string())
            ))
        );
        let on = "30 24 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw,favordynmods\n";
        assert_eq!(
            favordynmods_plan(on),
            Some((PathBuf::from("/sys/fs/cgroup"), None))
        );
        let v1_only = HYBRID
            .lines()
            .filter(|l| !l.contains("cgroup2"))
            .collect::<Vec<_>>()
            .join("\n");
        assert_eq!(favordynmods_plan(&v1_only), None);
    }

    #[test]
    fn hybrid_host_uses_v1_when_v2_has_no_controllers() {
        let l = CgroupLayout::from_mountinfo(HYBRID, |_| Some("hugetlb\n".into())).unwrap();
        let CgroupLayout::V1 { controllers } = &l else {
            panic!("{l:?}")
        };
        let find = |c: &str| {
            controllers
                .iter()
                .find(|(n, _)| n == c)
                .map(|(_, p)| p.clone())
        };
        assert_eq!(find("memory"), Some(PathBuf::from("/sys/fs/cgroup/memory")));
        assert_eq!(
            find("cpu"),
            Some(PathBuf::from("/sys/fs/cgroup/cpu,cpuacct"))
        );
        assert_eq!(
            find("cpuacct"),
            Some(PathBuf::from("/sys/fs/cgroup/cpu,cpuacct"))
        );
    }

    #[test]
    fn unified_host_uses_v2() {
        let mi = "30 24 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
        let l = CgroupLayout::from_mountinfo(mi, |_| Some("cpuset cpu io memory pids\n".into()))
            .unwrap();
        assert_eq!(
            l,
            CgroupLayout::V2 {
                root: "/sys/fs/cgroup".into()
            }
        );
    }

    #[test]
    fn nothing_usable_is_an_error() {
        let e = CgroupLayout::from_mountinfo("", |_| None).unwrap_err();
        assert!(e.to_string().contains("no usable cgroup"), "{e}");
    }

    #[test]
    fn limits_map_to_files() {
        let l = CgroupLimits {
            memory_bytes: 1 << 20,
            memory_high: None,
            pids: 64,
            cpus: Some(0.5),
        };
        let v2 = limit_writes(&CgroupLayout::V2 { root: "/x".into() }, &l);
        assert!(v2.contains(&("", "cpu.max", "50000 100000".into())));
        assert!(v2.contains(&("", "memory.max", "1048576".into())));
        assert!(!v2.iter().any(|(_, f, _)| *f == "memory.high"), "{v2:?}");
        let v1 = limit_writes(
            &CgroupLayout::V1 {
                controllers: vec![],
            },
            &l,
        );
        assert!(v1.contains(&("cpu", "cpu.cfs_quota_us", "50000".into())));
        assert!(v1.contains(&("pids", "pids.max", "64".into())));
    }

    #[test]
    fn plan_names_one_dir_per_hierarchy() {
        let l = CgroupLayout::from_mountinfo(HYBRID, |_| None).unwrap();
        let cg = Cgroup::plan(&l, "sandlot", "sb1");
        assert_eq!(cg.version, 1);
        assert!(cg
            .dirs
            .iter()
            .any(|(c, d)| c == "pids" && d == Path::new("/sys/fs/cgroup/pids/sandlot/sb1")));
    }
}
