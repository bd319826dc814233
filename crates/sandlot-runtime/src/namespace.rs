//! The namespace backend, host side: allocates ids, creates the cgroup, runs the
//! `__init` helper, and tears everything down.

use std::fs;
use std::io::{self, BufRead, BufReader, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use sandlot_proto::spec::SandboxSpec;

use crate::cgroup::{self, Cgroup, CgroupLayout, CgroupLimits};
use crate::cgroup_stock::CgroupStock;
use crate::hostimage::HostFacts;
use crate::mounts::{self, PlanInput};
use crate::netns::NetnsStock;
use crate::plan::{agent_setup, fds, sandbox_hostname, InitStatus, SandboxPlan, Trace, ID_RANGE};
use crate::run_dir::{self, RunDirFs, RunDirLock};
use crate::{
    sys, Backend, CreateOptions, Instance, Leftovers, PortSockets, PortSocketsReply, RuntimeError,
    SnapshotSource, Stillness, StockLevels,
};

/// Operator settings of the namespace backend.
#[derive(Debug, Clone)]
pub struct RuntimeConfig {
    /// Runtime state: agent sockets, locks. Default `/run/sandlot`.
    pub run_dir: PathBuf,
    /// Parent cgroup of all sandboxes, relative to each hierarchy's root.
    pub cgroup_parent: String,
    /// The `sandlot` binary, exec'd as `sandlot __init`.
    pub init_exe: PathBuf,
    /// First host uid/gid handed to sandboxes; each gets [`ID_RANGE`] ids.
    pub id_base: u32,
    /// Number of id ranges, i.e. the maximum number of concurrent sandboxes.
    pub id_slots: u32,
    /// Fork each sandbox's `__init` helper from one `sandlot __zygote` process (see
    /// [`crate::zygote`]) instead of exec'ing the binary per create. For long-lived
    /// hosts (the daemon); falls back to exec if the fork server cannot be used.
    pub fork_server: bool,
    /// Empty cgroups kept made ahead of time (cgroup v1; see
    /// [`crate::cgroup_stock`]), so a create renames one instead of a `mkdir` per
    /// hierarchy. 0: none. For long-lived hosts (the daemon).
    pub cgroup_stock: usize,
    /// Keep this many loopback-only network namespaces ready (see
    /// [`crate::netns::NetnsStock`]) for sandboxes with network `none`, instead of
    /// creating one with `CLONE_NEWNET` on the create path. 0: none kept.
    pub netns_stock: usize,
    /// Mount a tmpfs of the runtime's own on `run_dir/sandboxes` when that is on a
    /// disk file system and no sandbox lives there (see [`crate::run_dir`]).
    pub run_dir_tmpfs: bool,
    /// CPU quota, in cores, of sandboxes whose spec gives no `resources.cpus`.
    /// `None`: no quota.
    pub default_cpus: Option<f64>,
    /// CPU weight of the sandboxes' parent cgroup as a whole (see
    /// [`crate::cgroup::CgroupParent::cpu_weight`]). `None`: left alone.
    pub cgroup_cpu_weight: Option<u32>,
    /// Fork each `__init` helper from the calling process itself, running this
    /// agent, while that process is single-threaded (see
    /// [`crate::zygote::fork_helper_here`]), instead of exec'ing `init_exe`. For a
    /// process that makes one sandbox (`sandlot run`); the exec remains the
    /// fallback. Without `fork_server`.
    pub fork_helper_here: Option<crate::init::AgentMain>,
}

impl RuntimeConfig {
    /// Defaults for a host: `/run/sandlot`, cgroup `sandlot`, ids from 2^20.
    pub fn new(init_exe: PathBuf) -> RuntimeConfig {
        RuntimeConfig {
            run_dir: PathBuf::from("/run/sandlot"),
            cgroup_parent: "sandlot".into(),
            init_exe,
            id_base: crate::plan::DEFAULT_ID_BASE,
            id_slots: crate::plan::DEFAULT_ID_SLOTS,
            fork_server: false,
            cgroup_stock: 0,
            netns_stock: 0,
            run_dir_tmpfs: false,
            default_cpus: None,
            cgroup_cpu_weight: None,
            fork_helper_here: None,
        }
    }
}

/// The Linux namespace backend.
pub struct NamespaceBackend {
    cfg: RuntimeConfig,
    layout: CgroupLayout,
    host: HostFacts,
    /// The fork server, started on first use (`RuntimeConfig::fork_server`).
    zygote: std::sync::Mutex<Option<crate::zygote::Zygote>>,
    /// Cgroups made ahead of time (`RuntimeConfig::cgroup_stock`).
    stock: std::sync::Mutex<Option<CgroupStock>>,
    /// Network namespaces made ahead of time (`RuntimeConfig::netns_stock`).
    netns_stock: std::sync::Mutex<Option<NetnsStock>>,
    /// Where `run_dir/sandboxes` lives (settled in [`NamespaceBackend::new`]).
    run_dir_fs: RunDirFs,
}

fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> RuntimeError {
    let what = what.into();
    move |source| RuntimeError::Io { what, source }
}

impl NamespaceBackend {
    /// Checks the host (root, cgroups), creates the run directories, and makes the
    /// calling process a child subreaper so that sandbox PID 1s are re-parented to it.
    pub fn new(cfg: RuntimeConfig) -> Result<NamespaceBackend, RuntimeError> {
        // SAFETY: geteuid cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            return Err(RuntimeError::NotRoot);
        }
        let layout = CgroupLayout::detect()?;
        for d in ["", "sandboxes", "slots", "root"] {
            let p = cfg.run_dir.join(d);
            fs::create_dir_all(&p).map_err(io_err(format!("create {}", p.display())))?;
        }
        fs::set_permissions(
            &cfg.run_dir,
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .map_err(io_err("chmod run dir"))?;
        sys::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0).map_err(io_err("become child subreaper"))?;
        // Stocked cgroups of a process that died (a daemon killed with -9).
        crate::cgroup_stock::sweep_dead(&layout, &cfg.cgroup_parent);
        let mut b = NamespaceBackend {
            host: HostFacts::probe(Path::new("/")),
            cfg,
            layout,
            zygote: std::sync::Mutex::new(None),
            stock: std::sync::Mutex::new(None),
            netns_stock: std::sync::Mutex::new(None),
            run_dir_fs: RunDirFs::Memory,
        };
        b.run_dir_fs = b.settle_run_dir_fs()?;
        // A parent that exists already (sandboxes that outlived a daemon, another
        // runtime's) gets this runtime's settings; one made later gets them then.
        let _ = cgroup::write_parent_settings(&b.layout, &b.cgroup_parent());
        let stock = CgroupStock::start(&b.layout, &b.cgroup_parent(), b.cfg.cgroup_stock);
        *b.stock.get_mut().unwrap_or_else(|e| e.into_inner()) = stock;
        *b.netns_stock.get_mut().unwrap_or_else(|e| e.into_inner()) =
            NetnsStock::start(b.cfg.netns_stock);
        Ok(b)
    }

    /// The sandboxes' parent cgroup and its settings.
    fn cgroup_parent(&self) -> cgroup::CgroupParent {
        cgroup::CgroupParent {
            name: self.cfg.cgroup_parent.clone(),
            cpu_weight: self.cfg.cgroup_cpu_weight,
        }
    }

    /// Mounts a tmpfs on `run_dir/sandboxes` if wanted, needed and safe (see
    /// [`crate::run_dir`]); says where it lives.
    fn settle_run_dir_fs(&self) -> Result<RunDirFs, RuntimeError> {
        let dir = self.cfg.run_dir.join("sandboxes");
        let err = |what: &str| io_err(format!("{what} {}", dir.display()));
        if run_dir::is_memory_fs(&dir).map_err(err("statfs"))? {
            return Ok(RunDirFs::Memory);
        }
        if !self.cfg.run_dir_tmpfs {
            return Ok(RunDirFs::Disk(run_dir::NOT_WANTED.into()));
        }
        let _lock = RunDirLock::take(&self.cfg.run_dir, true).map_err(err("lock the parent of"))?;
        // Dead sandboxes' leftovers first: a mount would hide them from later sweeps.
        self.sweep();
        let facts = run_dir::facts(&dir).map_err(err("inspect"))?;
        match run_dir::decide(&facts, true) {
            run_dir::Decision::Keep(fs) => Ok(fs),
            // A host that refuses the mount (no CAP_SYS_ADMIN in its user namespace,
            // say) keeps the disk: slower, not broken.
            run_dir::Decision::Mount => Ok(match run_dir::mount_tmpfs(&dir) {
                Ok(()) => RunDirFs::Mounted,
                Err(e) => RunDirFs::Disk(format!("mounting a tmpfs there failed: {e}")),
            }),
        }
    }

    /// Where `run_dir/sandboxes` lives: a memory file system, one this process
    /// mounted, or a disk (with the reason).
    pub fn run_dir_fs(&self) -> &RunDirFs {
        &self.run_dir_fs
    }

    pub fn config(&self) -> &RuntimeConfig {
        &self.cfg
    }

    /// Stops the cgroup and network namespace stocks and removes what they hold
    /// (at shutdown; creates go on without them).
    pub fn release_stock(&self) {
        let stock = self.stock.lock().unwrap_or_else(|e| e.into_inner()).take();
        drop(stock);
        let netns = self
            .netns_stock
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        drop(netns);
    }

    /// Network namespaces in stock right now.
    pub fn stocked_netns(&self) -> usize {
        self.netns_stock
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map_or(0, |s| s.ready())
    }

    /// Cgroups in stock right now.
    pub fn stocked_cgroups(&self) -> usize {
        self.stock
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map_or(0, |s| s.ready())
    }

    pub fn cgroup_layout(&self) -> &CgroupLayout {
        &self.layout
    }

    fn sandbox_dir(&self, id: &str) -> PathBuf {
        self.cfg.run_dir.join("sandboxes").join(id)
    }

    /// Takes a free id range; the returned lock is held until the sandbox's PID 1
    /// exits (it inherits the descriptor).
    fn take_slot(&self) -> Result<(u32, OwnedFd), RuntimeError> {
        take_id_slot(&self.cfg.run_dir, self.cfg.id_slots)
    }

    fn plan(
        &self,
        id: &str,
        spec: &SandboxSpec,
        id_base: u32,
        lifeline: bool,
        cg: &Cgroup,
        opts: &CreateOptions,
    ) -> Result<SandboxPlan, RuntimeError> {
        let hostname = sandbox_hostname(id, spec);
        let mut mounts = mounts::plan_mounts(&PlanInput {
            spec,
            hostname: &hostname,
            host: &self.host,
            image: opts.image.as_ref(),
            shared: &opts.volumes,
            secret_files: &opts.secrets.files,
            pinned: opts.pinned.as_deref(),
        })?;
        if let Some(ns) = opts.nameserver {
            for op in &mut mounts.ops {
                if let mounts::MountOp::File { path, contents, .. } = op {
                    if path == "/etc/resolv.conf" {
                        *contents = format!("nameserver {ns}\noptions ndots:0\n");
                    }
                }
            }
        }
        Ok(SandboxPlan {
            id: id.to_string(),
            id_base,
            mounts,
            cgroup_dirs: cg.dirs.iter().map(|(_, d)| d.clone()).collect(),
            root_dir: self.cfg.run_dir.join("root"),
            socket_path: self.sandbox_dir(id).join("agent.sock"),
            agent: agent_setup(&hostname, spec, opts.image.as_ref(), &opts.secrets),
            first_exec: opts.first_exec.clone(),
            hostname,
            lifeline,
            netns: opts.netns.is_some(),
            etc_view: false,
            trace: Trace::enabled(),
        })
    }

    fn spawn_init(
        &self,
        plan: &mut SandboxPlan,
        slot: &OwnedFd,
        alive: &OwnedFd,
        opts: &mut CreateOptions,
        tr: &Trace,
    ) -> Result<i32, RuntimeError> {
        let (plan_r, plan_w) = sys::pipe().map_err(io_err("pipe"))?;
        let (status_r, status_w) = sys::pipe().map_err(io_err("pipe"))?;
        let lifeline = opts.lifeline.take();
        // (source, target) pairs; a fixed array so that the pre-exec hook allocates nothing.
        let netns = opts.netns.take();
        let inherit: [(RawFd, RawFd); 4] = [
            (slot.as_raw_fd(), fds::SLOT_LOCK),
            (alive.as_raw_fd(), fds::ALIVE_LOCK),
            (
                lifeline.as_ref().map_or(-1, |l| l.as_raw_fd()),
                fds::LIFELINE,
            ),
            (netns.as_ref().map_or(-1, |n| n.as_raw_fd()), fds::NETNS),
        ];
        let stderr = match opts.stderr.take() {
            Some(fd) => Some(fd),
            None if plan.trace => sys::dup_above(io::stderr().as_fd(), 3).ok(),
            None => None,
        };
        let forked = if self.cfg.fork_server {
            self.fork_helper(
                &plan_r,
                &status_w,
                stderr.as_ref(),
                slot,
                alive,
                &lifeline,
                &netns,
                plan.mounts
                    .ops
                    .iter()
                    .any(|op| matches!(op, crate::mounts::MountOp::HostEtc { use_view: true, .. })),
                plan.mounts.needs_host_mounts(),
            )
        } else {
            None
        };
        let here = match (forked, self.cfg.fork_helper_here) {
            (None, Some(agent)) => {
                let null = fs::File::options()
                    .write(true)
                    .open("/dev/null")
                    .map_err(io_err("open /dev/null"))?;
                let f = crate::zygote::HelperFds {
                    plan: plan_r.as_fd(),
                    status: status_w.as_fd(),
                    stderr: stderr.as_ref().map_or(null.as_fd(), |s| s.as_fd()),
                    slot: slot.as_fd(),
                    alive: alive.as_fd(),
                    lifeline: lifeline.as_ref().map(|l| l.as_fd()),
                    netns: netns.as_ref().map(|n| n.as_fd()),
                    wants_etc_view: false,
                    host_mounts: plan.mounts.needs_host_mounts(),
                };
                crate::zygote::fork_helper_here(&f, plan, agent)
                    .map_err(io_err("fork the sandbox init helper"))?
            }
            _ => None,
        };
        if let Some(pid) = here {
            crate::orphans::protect(pid);
        }
        tr.mark("helper started");
        // Written after the fork: whether the helper holds the fork server's view.
        plan.etc_view = forked.is_some_and(|(_, view)| view);
        // A helper forked here has the plan in its memory already.
        let plan_json = match here {
            Some(_) => Vec::new(),
            None => serde_json::to_vec(&*plan).expect("plan serializes"),
        };
        let forked = forked.map(|(pid, _)| pid);
        let mut child = None;
        if forked.is_none() && here.is_none() {
            let mut cmd = Command::new(&self.cfg.init_exe);
            cmd.arg("__init")
                .env_clear()
                .stdin(Stdio::from(plan_r))
                .stdout(Stdio::from(status_w));
            match stderr {
                Some(fd) => cmd.stderr(Stdio::from(fd)),
                None => cmd.stderr(Stdio::null()),
            };
            // SAFETY: the closure only calls dup2 and fcntl, which are async-signal-safe,
            // and allocates nothing. Sources are first copied above the targets' range so
            // that one dup2 cannot clobber a source needed by another.
            unsafe {
                cmd.pre_exec(move || {
                    let mut moved = [-1; 4];
                    for (i, (src, _)) in inherit.iter().enumerate() {
                        if *src >= 0 {
                            moved[i] = libc::fcntl(*src, libc::F_DUPFD_CLOEXEC, 100);
                            if moved[i] < 0 {
                                return Err(io::Error::last_os_error());
                            }
                        }
                    }
                    for (i, (_, dst)) in inherit.iter().enumerate() {
                        if moved[i] >= 0 && libc::dup2(moved[i], *dst) < 0 {
                            return Err(io::Error::last_os_error());
                        }
                    }
                    Ok(())
                });
            }
            let c = cmd.spawn().map_err(io_err(format!(
                "spawn {} __init",
                self.cfg.init_exe.display()
            )))?;
            crate::orphans::protect(c.id() as i32);
            child = Some(c);
        } else {
            drop((plan_r, status_w, stderr));
        }
        drop(lifeline);
        drop(netns);
        if here.is_none() {
            let mut w = fs::File::from(plan_w);
            w.write_all(&plan_json).map_err(io_err("send plan"))?;
            tr.mark("plan sent");
        } else {
            drop(plan_w);
        }
        let mut pid = None;
        let mut err = None;
        let mut refused = None;
        let mut ready = false;
        for line in BufReader::new(fs::File::from(status_r)).lines() {
            let Ok(line) = line else { break };
            match serde_json::from_str::<InitStatus>(&line) {
                // The helper's `pid` line and PID 1's `ready` line race: wait for both.
                Ok(InitStatus::Pid { pid: p }) => {
                    tr.mark("pid 1 reported");
                    pid = Some(p)
                }
                Ok(InitStatus::Ready { .. }) => {
                    tr.mark("pid 1 ready");
                    ready = true
                }
                Ok(InitStatus::Error { message }) => {
                    err = Some(message);
                    break;
                }
                Ok(r @ InitStatus::Refused { .. }) => {
                    refused = r.into_refusal();
                    break;
                }
                Err(_) => {}
            }
            if ready && pid.is_some() {
                break;
            }
        }
        let helper = match (child.as_mut(), forked, here) {
            (Some(c), _, _) => {
                let st = c.wait();
                crate::orphans::unprotect(c.id() as i32);
                st.map(|s| s.to_string()).unwrap_or_else(|e| e.to_string())
            }
            (None, Some(p), _) => format!("pid {p}, forked by the fork server"),
            (None, None, Some(p)) => {
                let st = sys::waitpid(p);
                crate::orphans::unprotect(p);
                match st {
                    Ok(st) => describe_wait(st),
                    Err(e) => e.to_string(),
                }
            }
            (None, None, None) => "never started".into(),
        };
        tr.mark("helper reaped");
        match (ready, pid, err) {
            (true, Some(pid), _) => Ok(pid),
            (_, pid, e) => {
                let mut fate = String::from("never started");
                if let Some(p) = pid {
                    // Reap PID 1 (ours, as subreaper) and say how it ended.
                    fate = match sys::try_waitpid(p) {
                        Ok(Some(st)) => describe_wait(st),
                        _ => {
                            let _ = sys::kill(p, libc::SIGKILL);
                            let _ = sys::waitpid(p);
                            "killed after reporting nothing".into()
                        }
                    };
                }
                if let Some(r) = refused {
                    return Err(r);
                }
                Err(RuntimeError::Init(e.unwrap_or_else(|| {
                    format!(
                        "sandbox init exited without reporting (pid 1: {fate}; helper: {helper})"
                    )
                })))
            }
        }
    }

    /// Forks the `__init` helper from the fork server (started on first use, and
    /// once more if it died). `None`: no fork server; the caller execs instead.
    #[allow(clippy::too_many_arguments)]
    fn fork_helper(
        &self,
        plan_r: &OwnedFd,
        status_w: &OwnedFd,
        stderr: Option<&OwnedFd>,
        slot: &OwnedFd,
        alive: &OwnedFd,
        lifeline: &Option<OwnedFd>,
        netns: &Option<OwnedFd>,
        wants_etc_view: bool,
        host_mounts: bool,
    ) -> Option<(i32, bool)> {
        let null = fs::File::options().write(true).open("/dev/null").ok()?;
        let f = crate::zygote::HelperFds {
            plan: plan_r.as_fd(),
            status: status_w.as_fd(),
            stderr: stderr.map_or(null.as_fd(), |s| s.as_fd()),
            slot: slot.as_fd(),
            alive: alive.as_fd(),
            lifeline: lifeline.as_ref().map(|l| l.as_fd()),
            netns: netns.as_ref().map(|n| n.as_fd()),
            wants_etc_view,
            host_mounts,
        };
        let mut z = self.zygote.lock().unwrap_or_else(|e| e.into_inner());
        for _ in 0..2 {
            if z.is_none() {
                *z = Some(
                    // Its own mount namespace only when no tmpfs can appear later
                    // over `run_dir/sandboxes` (where helpers bind agent sockets).
                    crate::zygote::Zygote::start(
                        &self.cfg.init_exe,
                        Some(&self.cfg.run_dir),
                        !matches!(self.run_dir_fs, RunDirFs::Disk(_)),
                    )
                    .ok()?,
                );
            }
            match z.as_ref().map(|z| z.spawn(&f)) {
                Some(Ok(pid)) => return Some(pid),
                // A dead fork server is replaced once; other errors: exec instead.
                Some(Err(e))
                    if e.kind() == io::ErrorKind::BrokenPipe
                        || e.raw_os_error() == Some(libc::ECONNRESET)
                        || e.raw_os_error() == Some(libc::EPIPE) =>
                {
                    *z = None;
                }
                _ => return None,
            }
        }
        None
    }

    /// Re-attaches to a sandbox created earlier (by this or a previous process, e.g.
    /// before a daemon restart), given the host pid of its PID 1 as recorded then.
    /// Fails if that sandbox is gone or `pid` is no longer its PID 1.
    fn adopt_instance(&self, id: &str, pid: i32) -> Result<NamespaceInstance, RuntimeError> {
        let dir = self.sandbox_dir(id);
        let gone = || RuntimeError::Gone(id.to_string());
        let alive = fs::File::open(dir.join("alive")).map_err(|_| gone())?;
        // Somebody (its PID 1) must hold the alive lock.
        if sys::try_flock_exclusive(alive.as_fd()).map_err(io_err("probe alive lock"))? {
            return Err(gone());
        }
        let pidfd = sys::pidfd_open(pid).map_err(|_| gone())?;
        let cgroup = Cgroup::plan(&self.layout, &self.cfg.cgroup_parent, id);
        // The pid must still be the sandbox's PID 1, not a recycled pid.
        let own = fs::read_to_string(format!("/proc/{pid}/cgroup")).map_err(|_| gone())?;
        if !own.contains(&format!("/{}/{id}", self.cfg.cgroup_parent)) {
            return Err(gone());
        }
        let id_base = fs::read_to_string(format!("/proc/{pid}/uid_map"))
            .ok()
            .and_then(|m| m.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
            .ok_or_else(gone)?;
        Ok(NamespaceInstance {
            id: id.to_string(),
            pid,
            pidfd,
            socket: dir.join("agent.sock"),
            cgroup,
            dir,
            id_base,
        })
    }

    /// Ids of sandboxes that have a run directory (alive or not).
    pub fn list_ids(&self) -> Vec<String> {
        fs::read_dir(self.cfg.run_dir.join("sandboxes"))
            .map(|rd| {
                rd.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Creates `sandboxes/<id>/` holding a locked `alive` file: built under a hidden
    /// temporary name, locked, then renamed into place (failing if the id exists).
    fn publish_sandbox_dir(&self, id: &str) -> Result<OwnedFd, RuntimeError> {
        let base = self.cfg.run_dir.join("sandboxes");
        let tmp = base.join(format!(".new-{id}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&tmp);
        fs::create_dir(&tmp).map_err(io_err(format!("create {}", tmp.display())))?;
        let publish = || -> Result<OwnedFd, RuntimeError> {
            let alive = OwnedFd::from(
                fs::File::create(tmp.join("alive")).map_err(io_err("create alive lock"))?,
            );
            sys::try_flock_exclusive(alive.as_fd()).map_err(io_err("lock alive"))?;
            match sys::rename_noreplace(&tmp, &base.join(id)) {
                Ok(()) => Ok(alive),
                Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {
                    Err(RuntimeError::Exists(id.to_string()))
                }
                Err(e) => Err(RuntimeError::Io {
                    what: format!("publish sandbox dir {id}"),
                    source: e,
                }),
            }
        };
        let r = publish();
        if r.is_err() {
            remove_run_dir(&tmp);
        }
        r
    }

    /// Run directories and cgroups still on the host of sandboxes whose id starts
    /// with `prefix` (after a clean stop there must be none): the leak check of
    /// tests and benchmarks.
    pub fn host_traces(&self, prefix: &str) -> Vec<PathBuf> {
        host_traces(&self.cfg.run_dir, &self.cfg.cgroup_parent, prefix)
    }

    /// Removes leftovers of sandboxes whose PID 1 is gone (e.g. after a crash of the
    /// process that owned them). Returns the ids cleaned up.
    pub fn sweep(&self) -> Vec<String> {
        let mut cleaned = Vec::new();
        let Ok(rd) = fs::read_dir(self.cfg.run_dir.join("sandboxes")) else {
            return cleaned;
        };
        for e in rd.flatten() {
            let id = e.file_name().to_string_lossy().into_owned();
            // A temporary dir being published gets its lock file, then its lock,
            // within microseconds of its creation; one older than a minute is
            // debris. (Judging a young one by its lock alone races with the
            // publisher between creating the file and locking it.)
            let old = e
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|d| d > Duration::from_secs(60));
            // Its publisher (named in it) is gone, or is this process, which
            // publishes nothing while it sweeps: debris whatever its age.
            let orphaned = publisher_pid(&id).is_some_and(|p| {
                p == std::process::id() as i32
                    || matches!(sys::kill(p, 0), Err(e) if e.raw_os_error() == Some(libc::ESRCH))
            });
            let Ok(f) = fs::File::open(e.path().join("alive")) else {
                if old || orphaned {
                    remove_run_dir(&e.path());
                }
                continue;
            };
            if id.starts_with('.') {
                if (old || orphaned) && matches!(sys::try_flock_exclusive(f.as_fd()), Ok(true)) {
                    drop(f);
                    remove_run_dir(&e.path());
                }
                continue;
            }
            if matches!(sys::try_flock_exclusive(f.as_fd()), Ok(true)) {
                let cg = Cgroup::plan(&self.layout, &self.cfg.cgroup_parent, &id);
                cg.kill_all(Duration::from_secs(2));
                let _ = cg.remove(Duration::from_secs(2));
                drop(f);
                remove_run_dir(&e.path());
                cleaned.push(id);
            }
        }
        cleaned
    }
}

/// The pid of the process that is publishing a run directory under the temporary
/// name `.new-<id>-<pid>`; `None` for any other name.
pub fn publisher_pid(name: &str) -> Option<i32> {
    let rest = name.strip_prefix(".new-")?;
    let (_, pid) = rest.rsplit_once('-')?;
    pid.parse().ok().filter(|p| *p > 0)
}

/// Removes a sandbox's run directory (or one being published) without opening
/// it: its known entries and then the directory by path, which takes no
/// descriptor, since a create most often fails when the process is out of them
/// (a recursive removal opens every directory, and then failed and left it).
/// Anything else inside falls back to a recursive removal.
pub fn remove_run_dir(dir: &Path) {
    for f in ["alive", "agent.sock"] {
        let _ = fs::remove_file(dir.join(f));
    }
    match fs::remove_dir(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(_) => {
            let _ = fs::remove_dir_all(dir);
        }
    }
}

impl Backend for NamespaceBackend {
    fn name(&self) -> &'static str {
        "namespace"
    }

    fn create(
        &self,
        id: &str,
        spec: &SandboxSpec,
        opts: CreateOptions,
    ) -> Result<Box<dyn Instance>, RuntimeError> {
        self.create_instance(id, spec, opts)
            .map(|i| Box::new(i) as Box<dyn Instance>)
    }

    fn adopt(&self, id: &str, pid: i32) -> Result<Box<dyn Instance>, RuntimeError> {
        self.adopt_instance(id, pid)
            .map(|i| Box::new(i) as Box<dyn Instance>)
    }

    fn reap_leftovers(&self, prefix: &str, live: &[String]) -> Leftovers {
        let mut killed = Vec::new();
        for id in self.list_ids() {
            if !id.starts_with(prefix) || live.contains(&id) {
                continue;
            }
            let cg = Cgroup::plan(&self.layout, &self.cfg.cgroup_parent, &id);
            cg.kill_all(Duration::from_secs(5));
            killed.push(id);
        }
        // PID 1 of each is dead now; sweep removes their cgroups and run dirs.
        let swept = self.sweep();
        Leftovers { killed, swept }
    }

    fn host_traces(&self, prefix: &str) -> Vec<PathBuf> {
        host_traces(&self.cfg.run_dir, &self.cfg.cgroup_parent, prefix)
    }

    fn stock(&self) -> StockLevels {
        StockLevels {
            cgroups: self.stocked_cgroups(),
            netns: self.stocked_netns(),
        }
    }

    fn release_stock(&self) {
        NamespaceBackend::release_stock(self)
    }
}

impl NamespaceBackend {
    /// [`Backend::create`] with this backend's own instance type.
    pub fn create_instance(
        &self,
        id: &str,
        spec: &SandboxSpec,
        mut opts: CreateOptions,
    ) -> Result<NamespaceInstance, RuntimeError> {
        spec.validate()?;
        if spec.image != sandlot_proto::spec::HOST_IMAGE && opts.image.is_none() {
            return Err(RuntimeError::Spec(
                sandlot_proto::spec::SpecError::Invalid {
                    field: "image".into(),
                    problem: format!(
                        "image {:?} must be resolved from an image store before create",
                        spec.image
                    ),
                },
            ));
        }
        if spec.network.mode != sandlot_proto::spec::NetworkMode::None && opts.netns.is_none() {
            return Err(RuntimeError::Spec(sandlot_proto::spec::SpecError::Invalid {
                field: "network.mode".into(),
                problem: format!(
                    "mode {:?} needs the daemon's network slots (sandlot serve); sandlot run supports \"none\"",
                    spec.network.mode.as_str()
                ),
            }));
        }
        if id.is_empty()
            || id.len() > 64
            || !id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return Err(RuntimeError::BadId(id.to_string()));
        }
        let tr = Trace::new(Trace::enabled(), "host  ");
        let dir = self.sandbox_dir(id);
        // The run directory appears atomically with its alive lock already held, so a
        // concurrent `sweep` (another CLI, the daemon) never mistakes it for a dead one.
        let alive = {
            // On a disk, a shared lock keeps another process from mounting a tmpfs
            // over `sandboxes/` while this directory is being published.
            let _publishing = match (&self.run_dir_fs, self.cfg.run_dir_tmpfs) {
                (RunDirFs::Disk(_), true) => Some(
                    RunDirLock::take(&self.cfg.run_dir, false)
                        .map_err(io_err("lock the run dir"))?,
                ),
                _ => None,
            };
            self.publish_sandbox_dir(id)?
        };
        let mut cgroup: Option<Cgroup> = None;
        let r = (|| {
            let (slot, slot_fd) = self.take_slot()?;
            let id_base = self.cfg.id_base + slot * ID_RANGE;
            let limits = CgroupLimits {
                memory_bytes: spec.resources.memory.bytes(),
                memory_high: None,
                pids: spec.resources.pids,
                cpus: spec.resources.cpus.or(self.cfg.default_cpus),
            };
            tr.mark("run directory and id range");
            let stocked = self
                .stock
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .as_ref()
                .and_then(|s| s.take(id, &limits));
            let cg = match stocked {
                Some(cg) => {
                    // Renamed to the id already: removed like any on failure.
                    cgroup = Some(Cgroup::plan(&self.layout, &self.cfg.cgroup_parent, id));
                    cg?
                }
                None => Cgroup::create(&self.layout, &self.cgroup_parent(), id, &limits)?,
            };
            cgroup = Some(cg.clone());
            tr.mark("cgroup created");
            if opts.netns.is_none() {
                // Network `none` (checked above): a stocked loopback namespace if
                // one is ready, else PID 1 gets a new one from CLONE_NEWNET.
                opts.netns = self
                    .netns_stock
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .as_ref()
                    .and_then(|s| s.take());
            }
            let mut plan = self.plan(id, spec, id_base, opts.lifeline.is_some(), &cg, &opts)?;
            tr.mark("planned");
            let pid = self.spawn_init(&mut plan, &slot_fd, &alive, &mut opts, &tr)?;
            // Re-parented to this process (a subreaper): its exit status is read by
            // `wait_exit`, never by the orphan reaper.
            crate::orphans::protect(pid);
            tr.mark("ready");
            let pidfd = sys::pidfd_open(pid).map_err(io_err("pidfd_open"))?;
            Ok(NamespaceInstance {
                id: id.to_string(),
                pid,
                pidfd,
                socket: plan.socket_path.clone(),
                cgroup: cg,
                dir: dir.clone(),
                id_base,
            })
        })();
        if r.is_err() {
            if let Some(cg) = cgroup {
                cg.kill_all(Duration::from_secs(2));
                let _ = cg.remove(Duration::from_secs(2));
            }
            // The alive lock first: a file this process holds open is fine to
            // unlink, but the descriptor is better back before the next create.
            drop(alive);
            remove_run_dir(&dir);
        }
        r
    }
}

/// Takes a free id range slot among `id_slots` (the slot's number and its lock,
/// an exclusive `flock` of `run_dir/slots/<slot>`, which whoever keeps the
/// sandbox alive holds). Both backends take their ranges here, from the same
/// `run_dir`, so no two sandboxes of either share host ids.
pub(crate) fn take_id_slot(run_dir: &Path, id_slots: u32) -> Result<(u32, OwnedFd), RuntimeError> {
    let dir = run_dir.join("slots");
    // Start at a pseudo-random slot so concurrent creators rarely collide.
    let start = (std::process::id() ^ Instant::now().elapsed().subsec_nanos()) % id_slots;
    for i in 0..id_slots {
        let slot = (start + i) % id_slots;
        let f = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.join(slot.to_string()))
            .map_err(io_err("open slot lock"))?;
        let fd = OwnedFd::from(f);
        if sys::try_flock_exclusive(fd.as_fd()).map_err(io_err("lock slot"))? {
            return Ok((slot, fd));
        }
    }
    Err(RuntimeError::Exhausted("id ranges (sandbox slots)"))
}

/// A sandbox of the namespace backend: its PID 1 (the agent), cgroup(s) and run
/// directory.
#[derive(Debug)]
pub struct NamespaceInstance {
    id: String,
    /// Host pid of the sandbox's PID 1 (the agent).
    pid: i32,
    pidfd: OwnedFd,
    /// The agent's socket.
    socket: PathBuf,
    cgroup: Cgroup,
    /// Runtime directory on the host.
    dir: PathBuf,
    /// Host uid of root in the sandbox.
    id_base: u32,
}

impl NamespaceInstance {
    /// Host uid of root in the sandbox.
    pub fn id_base(&self) -> u32 {
        self.id_base
    }

    pub fn cgroup(&self) -> &Cgroup {
        &self.cgroup
    }
}

impl Instance for NamespaceInstance {
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

    /// Reaps PID 1 when this process is its (subreaper) parent, otherwise polls
    /// its pidfd.
    fn wait_exit(&self, timeout: Duration) -> Option<i32> {
        crate::instance::wait_child(self.pid, &self.pidfd, timeout)
    }

    /// SIGKILLs PID 1 (its pid namespace, so every process of the sandbox, dies
    /// with it) and waits for it.
    fn kill(&self, timeout: Duration) -> Option<i32> {
        let _ = sys::pidfd_send_signal(self.pidfd.as_fd(), libc::SIGKILL);
        self.wait_exit(timeout)
    }

    fn terminate(&self) -> Result<(), RuntimeError> {
        // Killing PID 1 kills the whole pid namespace; its mount namespace (root,
        // writable layer, every mount) goes with its last process.
        let tr = Trace::new(Trace::enabled(), "stop  ");
        let _ = sys::pidfd_send_signal(self.pidfd.as_fd(), libc::SIGKILL);
        self.wait_exit(Duration::from_secs(10));
        tr.mark("pid 1 gone");
        if !self.cgroup.kill_all(Duration::from_secs(5)) {
            return Err(RuntimeError::Stuck(self.id.clone()));
        }
        tr.mark("cgroup empty");
        self.cgroup.remove(Duration::from_secs(5))?;
        // The shared parent goes too once the last sandbox is gone (EBUSY otherwise).
        self.cgroup.remove_parent_if_empty();
        tr.mark("cgroup removed");
        remove_run_dir(&self.dir);
        tr.mark("run directory removed");
        Ok(())
    }

    fn usage(&self) -> Option<crate::cgroup::Usage> {
        self.cgroup.exists().then(|| self.cgroup.usage())
    }

    /// A short-lived thread enters the network namespace of PID 1 (`setns` on
    /// its pidfd), creates the sockets there and ends: the namespace of a socket
    /// is fixed when it is created, so they can be used from any thread.
    fn port_sockets(&self, reply: PortSocketsReply) {
        let pidfd = match self.pidfd.try_clone() {
            Ok(fd) => fd,
            Err(e) => return reply(Err(e)),
        };
        let spawned = std::thread::Builder::new()
            .name("sandlot-port-dial".into())
            .spawn(move || {
                let r = (|| -> io::Result<PortSockets> {
                    // setns(2) takes a pidfd for the namespaces of its process.
                    sys::setns_net(pidfd.as_fd())?;
                    let v4 = sys::tcp_socket(false)?;
                    let v6 = sys::tcp_socket(true).ok();
                    Ok(PortSockets { v4, v6 })
                })();
                // This thread ends here, so its namespace never leaks to other work.
                reply(r);
            });
        // A thread that could not start drops `reply` unanswered, which its
        // receiver sees as a failure.
        drop(spawned);
    }

    fn hold_still(&self, timeout: Duration) -> Result<Stillness<'_>, RuntimeError> {
        self.cgroup.freeze(true, timeout)?;
        Ok(Stillness::new(move || {
            self.cgroup
                .freeze(false, timeout)
                .map_err(RuntimeError::from)
        }))
    }

    /// Reads PID 1's mount table and id maps and opens its root, all while its
    /// pidfd says it has not exited: they are this sandbox's even if the pid is
    /// reused later.
    fn snapshot_source(&self) -> Result<SnapshotSource, RuntimeError> {
        let gone = || RuntimeError::Gone(self.id.clone());
        let proc = |name: &str| format!("/proc/{}/{name}", self.pid);
        let dir = std::fs::File::open(proc("root")).map_err(|_| gone())?;
        let text = std::fs::read_to_string(proc("mountinfo")).map_err(|_| gone())?;
        let uid_map = std::fs::read_to_string(proc("uid_map")).map_err(|_| gone())?;
        let gid_map = std::fs::read_to_string(proc("gid_map")).map_err(|_| gone())?;
        if crate::instance::has_exited(&self.pidfd) {
            return Err(gone());
        }
        let mount_points = crate::mounts::mount_points_under(&text, Path::new("/"))
            .into_iter()
            .filter_map(|p| p.strip_prefix("/").ok().map(Path::to_path_buf))
            .filter(|p| !p.as_os_str().is_empty())
            .collect();
        Ok(SnapshotSource {
            mount_points,
            live_root: Some(crate::LiveRoot {
                dir,
                id_maps: Some((uid_map, gid_map)),
            }),
        })
    }

    fn add_helper(&self, pid: i32) -> io::Result<()> {
        self.cgroup.attach(pid).map_err(io::Error::other)
    }
}

/// "exit code N" or "killed by signal N" for a wait status.
fn describe_wait(st: i32) -> String {
    if libc::WIFSIGNALED(st) {
        format!("killed by signal {}", libc::WTERMSIG(st))
    } else {
        format!("exit code {}", libc::WEXITSTATUS(st))
    }
}

/// [`NamespaceBackend::host_traces`] without a backend: run directories under
/// `run_dir/sandboxes` and cgroups `<hierarchy>/<cgroup_parent>/<id>` (v1 and v2).
pub fn host_traces(run_dir: &Path, cgroup_parent: &str, prefix: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut scan = |dir: &Path| {
        if let Ok(rd) = fs::read_dir(dir) {
            out.extend(
                rd.flatten()
                    .filter(|e| e.file_name().to_string_lossy().starts_with(prefix))
                    .map(|e| e.path()),
            );
        }
    };
    scan(&run_dir.join("sandboxes"));
    let cg = Path::new("/sys/fs/cgroup");
    if let Ok(rd) = fs::read_dir(cg) {
        for e in rd.flatten() {
            scan(&e.path().join(cgroup_parent));
        }
    }
    scan(&cg.join(cgroup_parent));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_being_published_names_its_publisher() {
        assert_eq!(publisher_pid(".new-sb-12ab-4242"), Some(4242));
        assert_eq!(publisher_pid(".new-a-b-c-17"), Some(17));
        assert_eq!(publisher_pid("sb-12ab"), None);
        assert_eq!(publisher_pid(".new-sb-x"), None);
        assert_eq!(publisher_pid(".new-sb-0"), None);
        assert_eq!(publisher_pid(".new-4242"), None);
    }

    #[test]
    fn a_run_directory_is_removed_with_whatever_is_in_it() {
        let d = std::env::temp_dir().join(format!("sandlot-rundir-{}", std::process::id()));
        fs::create_dir_all(&d).unwrap();
        fs::write(d.join("alive"), "").unwrap();
        fs::write(d.join("agent.sock"), "").unwrap();
        remove_run_dir(&d);
        assert!(!d.exists(), "left {}", d.display());
        // Something unexpected inside: removed all the same.
        fs::create_dir_all(d.join("sub")).unwrap();
        fs::write(d.join("sub/x"), "").unwrap();
        remove_run_dir(&d);
        assert!(!d.exists());
    }
}
