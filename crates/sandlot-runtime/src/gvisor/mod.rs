//! The gVisor backend: each sandbox is a `runsc` sandbox whose PID 1 is the guest
//! agent (`sandlot __agent`), speaking the same protocol on a Unix socket the
//! daemon connects to. gVisor's kernel, in user space, answers the sandbox's
//! system calls; the host kernel sees only gVisor's own, filtered ones.
//!
//! Each sandbox takes an id range from the namespace backend's slots: root inside
//! is host uid `id_base`, for gVisor's gofer (which `runsc` starts in a user
//! namespace of that mapping) and for everything the launcher builds.
//!
//! Per sandbox, in `<run_dir>/gvisor/<id>/` (0710, group the range's root, so that
//! the gofer reaches `root/` and `agent/` and nothing else): `config.json` (the
//! OCI bundle, [`bundle::oci_config`]), `root/` (the mount point of the root
//! filesystem, which exists only in the launcher's mount namespace), `proc/` (the
//! launcher's spare `/proc`, likewise), `state/` (`runsc --root`), `agent/` (the
//! agent's socket, bound into the sandbox; the range's root's), `sandbox.pid` and
//! `runsc.log`. The root filesystem is built from the namespace backend's own
//! mount plan ([`bundle::host_side`]) by `sandlot __gvisor` ([`launch`]), which
//! then execs `runsc run --detach`.
//!
//! Every process of the sandbox (gVisor's sandbox and gofer processes and their
//! helpers) is in its cgroup, which the runtime creates with the sandbox's limits
//! before `runsc` starts: usage, freezing (snapshots), killing (delete, a crashed
//! `runsc`, leftovers of a killed daemon) all work on it. Teardown never needs
//! `runsc` itself: the cgroup is emptied and removed, with the ones `runsc` made in
//! other hierarchies, and the sandbox's directory goes.

pub mod bundle;
pub mod kept_copy;
mod kept_root;
pub mod launch;
pub mod memory;
pub mod runsc;
pub mod tree_copy;

use std::collections::BTreeSet;
use std::fs;
use std::io::{self, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use sandlot_proto::spec::{NetworkMode, SandboxSpec, HOST_IMAGE};

use crate::cgroup::{self, Cgroup, CgroupLayout, CgroupParent};
use crate::hostimage::HostFacts;
use crate::instance::{has_exited, wait_child};
use crate::memory_watch::MemoryWatch;
use crate::mounts::{self, PlanInput, RootFs};
use crate::plan::{agent_setup, sandbox_hostname};
use crate::{
    sys, Backend, CreateOptions, Instance, Leftovers, PortAccess, PortSocketsReply, RuntimeError,
    SnapshotSource, Stillness,
};
pub use runsc::{Runsc, Unavailable};

/// How long a new sandbox's agent may take to listen once `runsc` started it.
const AGENT_TIMEOUT: Duration = Duration::from_secs(20);
/// How long `runsc run` may take.
const RUNSC_TIMEOUT: Duration = Duration::from_secs(30);

/// Operator settings of the gVisor backend.
#[derive(Debug, Clone)]
pub struct GvisorConfig {
    /// `runsc`: a path, or a name looked up on `PATH`.
    pub runsc: PathBuf,
    /// `auto`, `ptrace`, `systrap` or `kvm`.
    pub platform: String,
    /// Sandboxes live in `<run_dir>/gvisor/<id>/`.
    pub run_dir: PathBuf,
    /// Parent cgroup of all sandboxes (shared with the namespace backend).
    pub cgroup_parent: String,
    /// CPU weight of that parent (see [`CgroupParent::cpu_weight`]).
    pub cgroup_cpu_weight: Option<u32>,
    /// The `sandlot` binary: exec'd as `sandlot __gvisor`, and bound into each
    /// sandbox, where PID 1 runs it as `sandlot __agent`.
    pub sandlot_exe: PathBuf,
    /// CPU quota, in cores, of sandboxes whose spec gives no `resources.cpus`.
    pub default_cpus: Option<f64>,
    /// First host uid/gid of the sandboxes' id ranges and how many there are: the
    /// namespace backend's (`RuntimeConfig::id_base`, `id_slots`), whose slots in
    /// `<run_dir>/slots` both backends take ranges from.
    pub id_base: u32,
    pub id_slots: u32,
}

/// The gVisor backend.
pub struct GvisorBackend {
    cfg: GvisorConfig,
    runsc: Runsc,
    layout: CgroupLayout,
    host: HostFacts,
    /// Mount points of every cgroup hierarchy (`runsc` makes the sandbox's cgroup
    /// in all of them, not only in those the runtime uses).
    hierarchies: Vec<PathBuf>,
    /// How the `sandlot` binary runs inside a sandbox.
    agent: bundle::AgentRuntime,
}

fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> RuntimeError {
    let what = what.into();
    move |source| RuntimeError::Io { what, source }
}

impl GvisorBackend {
    /// Finds `runsc` and checks what it can do (see [`Runsc::probe`]), the host
    /// (root, cgroups), creates the run directory, and makes the calling process
    /// a child subreaper (gVisor's processes are re-parented to it when `runsc`
    /// exits). `Err(Ok(_))`: gVisor cannot be used here, and why.
    pub fn new(cfg: GvisorConfig) -> Result<GvisorBackend, Result<Unavailable, RuntimeError>> {
        // SAFETY: geteuid cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            return Err(Ok(Unavailable::NotRoot));
        }
        let runsc = Runsc::probe(&cfg.runsc, &cfg.platform).map_err(Ok)?;
        let layout = CgroupLayout::detect().map_err(|e| Err(e.into()))?;
        let dir = cfg.run_dir.join("gvisor");
        // Searchable, not listable: each sandbox's gofer, in its range's ids,
        // reaches its own directory below (0710, group the range's root).
        fs::create_dir_all(&dir)
            .and_then(|()| {
                fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o711))
            })
            .map_err(|e| Err(io_err(format!("create {}", dir.display()))(e)))?;
        let slots = cfg.run_dir.join("slots");
        fs::create_dir_all(&slots)
            .map_err(|e| Err(io_err(format!("create {}", slots.display()))(e)))?;
        sys::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0)
            .map_err(|e| Err(io_err("become child subreaper")(e)))?;
        let agent = agent_runtime(&cfg.sandlot_exe).map_err(Err)?;
        Ok(GvisorBackend {
            agent,
            hierarchies: cgroup_mounts(),
            host: HostFacts::probe(Path::new("/")),
            runsc,
            layout,
            cfg,
        })
    }

    /// What `runsc` is and the platform sandboxes run on.
    pub fn runsc(&self) -> &Runsc {
        &self.runsc
    }

    /// The port relay's command line inside a sandbox (the port is appended).
    fn relay_argv(&self) -> Vec<String> {
        self.agent.argv([bundle::PORT_RELAY_ARG.to_string()])
    }

    fn sandbox_dir(&self, id: &str) -> PathBuf {
        self.cfg.run_dir.join("gvisor").join(id)
    }

    fn cgroup_parent(&self) -> CgroupParent {
        CgroupParent {
            name: self.cfg.cgroup_parent.clone(),
            cpu_weight: self.cfg.cgroup_cpu_weight,
        }
    }

    /// [`Backend::create`] with this backend's own instance type.
    pub fn create_instance(
        &self,
        id: &str,
        spec: &SandboxSpec,
        opts: CreateOptions,
    ) -> Result<GvisorInstance, RuntimeError> {
        self.start_instance(id, spec, opts, None)
    }

    /// Creates sandbox `id`, or with `image` restores it from a checkpoint
    /// ([`Instance::checkpoint`]) taken of a sandbox of the same spec.
    fn start_instance(
        &self,
        id: &str,
        spec: &SandboxSpec,
        opts: CreateOptions,
        image: Option<&Path>,
    ) -> Result<GvisorInstance, RuntimeError> {
        check(id, spec, &opts)?;
        let dir = self.sandbox_dir(id);
        fs::create_dir(&dir).map_err(|e| match e.kind() {
            io::ErrorKind::AlreadyExists => RuntimeError::Exists(id.to_string()),
            _ => RuntimeError::Io {
                what: format!("create {}", dir.display()),
                source: e,
            },
        })?;
        let mut cgroup = None;
        let r = self.start(id, spec, opts, &dir, &mut cgroup, image);
        if r.is_err() {
            let cg = cgroup.unwrap_or_else(|| self.plan_cgroup(id));
            remove_traces(&cg, &self.hierarchies, &self.cfg.cgroup_parent, id, &dir);
        }
        r
    }

    fn plan_cgroup(&self, id: &str) -> Cgroup {
        Cgroup::plan(&self.layout, &self.cfg.cgroup_parent, id)
    }

    fn start(
        &self,
        id: &str,
        spec: &SandboxSpec,
        opts: CreateOptions,
        dir: &Path,
        cgroup: &mut Option<Cgroup>,
        image: Option<&Path>,
    ) -> Result<GvisorInstance, RuntimeError> {
        let (root, state, agent_run) = (dir.join("root"), dir.join("state"), dir.join("agent"));
        for d in [&root, &state, &agent_run] {
            fs::create_dir(d).map_err(io_err(format!("create {}", d.display())))?;
        }
        // The sandbox's id range: root inside gVisor is host uid `id_base`, and so
        // is gVisor's gofer, which opens the sandbox's files on the host.
        let (slot, slot_lock) =
            crate::namespace::take_id_slot(&self.cfg.run_dir, self.cfg.id_slots)?;
        let id_base = self.cfg.id_base + slot * crate::plan::ID_RANGE;
        // The gofer reaches the root and the agent's socket directory (where it
        // creates the socket) as the range's root; nothing else of the directory.
        let owned = |p: &Path, uid: Option<u32>, mode: u32| {
            std::os::unix::fs::chown(p, uid, Some(id_base))
                .and_then(|()| {
                    fs::set_permissions(p, std::os::unix::fs::PermissionsExt::from_mode(mode))
                })
                .map_err(io_err(format!("hand {} to the sandbox's ids", p.display())))
        };
        owned(dir, None, 0o710)?;
        mount_agent_run(&agent_run)?;
        owned(&agent_run, Some(id_base), 0o700)?;
        // The hard limit leaves headroom above the declared one for gVisor's own
        // processes; the declared one is the watcher's line (`memory`).
        let limits = memory::limits(
            spec.resources.memory.bytes(),
            spec.resources.pids,
            spec.resources.cpus.or(self.cfg.default_cpus),
        );
        let cg = Cgroup::create(&self.layout, &self.cgroup_parent(), id, &limits)?;
        *cgroup = Some(cg.clone());
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
        let setup = agent_setup(&hostname, spec, opts.image.as_ref(), &opts.secrets);
        let netns_path = format!("/proc/self/fd/{}", launch::NETNS_FD);
        let config = bundle::oci_config(&bundle::BundleInput {
            hostname: &hostname,
            root: &root,
            agent_exe: &self.cfg.sandlot_exe,
            agent_runtime: &self.agent,
            agent_run: &agent_run,
            netns: opts.netns.as_ref().map(|_| netns_path.as_str()),
            // Absolute: a relative path is taken below runsc's own cgroup in each
            // hierarchy, which is not the runtime's where the daemon runs in one.
            cgroups_path: &format!("/{}/{id}", self.cfg.cgroup_parent),
            limits: &limits,
            lifeline: opts.lifeline.is_some(),
            tmp_in_root: bundle::plan_has_tmp(&mounts),
            id_base,
        });
        let config_path = dir.join("config.json");
        fs::write(
            &config_path,
            serde_json::to_vec_pretty(&config).expect("json"),
        )
        .map_err(io_err(format!("write {}", config_path.display())))?;
        let pid_file = dir.join("sandbox.pid");
        let mut runsc = vec![self.runsc.path.to_string_lossy().into_owned()];
        runsc.extend(self.runsc.global_args(&state, opts.netns.is_some()));
        let mut argv = runsc.clone();
        match image {
            None => argv.push("run".into()),
            Some(image) => argv.extend([
                "restore".to_string(),
                format!("--image-path={}", image.display()),
            ]),
        }
        argv.extend([
            "--detach".to_string(),
            format!("--bundle={}", dir.display()),
            format!("--pid-file={}", pid_file.display()),
            id.to_string(),
        ]);
        // runsc makes the destinations of the bundle's mounts in the root (the
        // agent's binds under `/dev`): stubs too.
        let mut mount_points = mounts.mount_targets();
        mount_points.extend(bundle::mount_destinations(&config));
        write_mount_points(dir, &mount_points)?;
        // A tmpfs root (the `host` image's) is mounted here, on the host, so that
        // the daemon reads it for a snapshot and it outlives gVisor's processes
        // until the teardown; the launcher applies the plan on it in its own
        // namespace, whose mounts never reach the host's.
        // A restore takes back the root its checkpoint kept (see `kept_root`).
        let kept = match image {
            Some(i) => kept_root::kept(i)?,
            None => None,
        };
        let root_mounted = kept.is_some() || matches!(mounts.root, RootFs::Tmpfs { .. });
        if let Some((kept, from)) = &kept {
            kept_root::take_back(kept, *from, &root, id_base)?;
        } else if root_mounted {
            mounts::mount_root(&mounts.root, &root, None)?;
            // Root of the sandbox's range owns it, as its PID 1 would on the
            // namespace backend; the launcher's builder makes the rest as that root.
            std::os::unix::fs::chown(&root, Some(id_base), Some(id_base)).map_err(io_err(
                format!("hand {} to the sandbox's ids", root.display()),
            ))?;
        }
        let plan = bundle::LaunchPlan {
            root_dir: root,
            root_mounted,
            id_base,
            cgroup_dirs: cg.dirs.iter().map(|(_, d)| d.clone()).collect(),
            mounts: bundle::host_side(&mounts),
            argv,
        };
        let lifeline = self.run_launcher(dir, &plan, &setup, slot_lock, opts)?;
        let pid = read_pid(&pid_file)?;
        // gVisor's sandbox process is this process's child now (a subreaper):
        // its exit status is read by `wait_exit`, never by the orphan reaper.
        crate::orphans::protect(pid);
        let inst = GvisorInstance {
            id: id.to_string(),
            pid,
            pidfd: sys::pidfd_open(pid).map_err(io_err("pidfd_open"))?,
            socket: agent_run.join("agent.sock"),
            cgroup: cg,
            dir: dir.to_path_buf(),
            hierarchies: self.hierarchies.clone(),
            cgroup_parent: self.cfg.cgroup_parent.clone(),
            relay: self.relay_argv(),
            lifeline: Mutex::new(lifeline),
            mount_points,
            runsc,
            id_base,
            memory_kills: AtomicU64::new(0),
        };
        if !in_cgroup(pid, &self.cfg.cgroup_parent, id) {
            return Err(RuntimeError::Init(format!(
                "gVisor's sandbox process {pid} is not in the sandbox's cgroup"
            )));
        }
        if image.is_some() {
            // The restored agent waits for this to listen again (it closed its
            // host-bound sockets before the checkpoint). It answers only a signal
            // sent once it waits for one, and the checkpoint may have caught it
            // just before: the signal is sent again until it listens.
            // `runsc kill` may also find no process to signal while the restore
            // is still under way: it is tried again as well.
            let deadline = Instant::now() + AGENT_TIMEOUT;
            loop {
                let woken = inst.wake_agent();
                match wait_listening_for(&inst.socket, &inst.pidfd, WAKE_AGAIN) {
                    Ok(()) => break,
                    Err(_) if Instant::now() >= deadline => {
                        return Err(woken.err().unwrap_or_else(|| {
                            RuntimeError::Init(format!(
                                "the restored agent did not listen within {} s",
                                AGENT_TIMEOUT.as_secs()
                            ))
                        }))
                    }
                    Err(_) if has_exited(&inst.pidfd) => {
                        return Err(RuntimeError::Init(
                            "gVisor's sandbox exited before its agent listened".into(),
                        ))
                    }
                    Err(_) => {}
                }
            }
        }
        wait_listening(&inst.socket, &inst.pidfd)?;
        Ok(inst)
    }

    /// Runs `sandlot __gvisor` (which execs `runsc run --detach`) to its end.
    /// Returns the write end of the agent's standard input when it is the
    /// sandbox's lifeline.
    fn run_launcher(
        &self,
        dir: &Path,
        plan: &bundle::LaunchPlan,
        setup: &crate::plan::AgentSetup,
        slot_lock: OwnedFd,
        mut opts: CreateOptions,
    ) -> Result<Option<OwnedFd>, RuntimeError> {
        let (stdin_r, stdin_w) = sys::pipe().map_err(io_err("pipe"))?;
        let (plan_r, plan_w) = sys::pipe().map_err(io_err("pipe"))?;
        let (refusal_r, refusal_w) = sys::pipe().map_err(io_err("pipe"))?;
        let log_path = dir.join("runsc.log");
        let log = fs::File::create(&log_path)
            .map_err(io_err(format!("create {}", log_path.display())))?;
        let netns = opts.netns.take();
        // (source, target) pairs; a fixed array so that the pre-exec hook allocates nothing.
        let inherit: [(RawFd, RawFd); 4] = [
            (plan_r.as_raw_fd(), launch::PLAN_FD),
            (
                netns.as_ref().map_or(-1, |n| n.as_raw_fd()),
                launch::NETNS_FD,
            ),
            (slot_lock.as_raw_fd(), launch::SLOT_FD),
            (refusal_w.as_raw_fd(), launch::REFUSAL_FD),
        ];
        let mut cmd = Command::new(&self.cfg.sandlot_exe);
        cmd.arg(launch::LAUNCH_ARG)
            .env_clear()
            .env(
                "PATH",
                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            )
            .stdin(Stdio::from(stdin_r))
            .stdout(Stdio::null())
            .stderr(Stdio::from(log));
        // SAFETY: the closure only calls fcntl and dup2, which are
        // async-signal-safe, and allocates nothing. Sources are first copied above
        // the targets' range so that one dup2 cannot clobber another's source.
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
        let mut child = cmd.spawn().map_err(io_err(format!(
            "spawn {} {}",
            self.cfg.sandlot_exe.display(),
            launch::LAUNCH_ARG
        )))?;
        crate::orphans::protect(child.id() as i32);
        // The keeper the launcher forks holds the range's lock from here.
        drop((plan_r, netns, slot_lock, refusal_w));
        // The launcher reads the plan to its end before it does anything.
        let sent = fs::File::from(plan_w).write_all(&serde_json::to_vec(plan).expect("json"));
        let status = wait_timeout(&mut child, RUNSC_TIMEOUT);
        crate::orphans::unprotect(child.id() as i32);
        let log = || {
            let text = fs::read_to_string(&log_path).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(8).collect();
            tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
        };
        // The sandbox's own files made its root impossible: the builder said which.
        if status.is_some_and(|s| !s.success()) {
            if let Some(r) = read_refusal(refusal_r) {
                return Err(r);
            }
        }
        match status {
            Some(s) if s.success() => {}
            Some(s) => {
                return Err(RuntimeError::Init(format!(
                    "runsc run failed ({s}): {}",
                    log()
                )));
            }
            None => {
                return Err(RuntimeError::Init(format!(
                    "runsc run did not finish within {}s: {}",
                    RUNSC_TIMEOUT.as_secs(),
                    log()
                )));
            }
        }
        sent.map_err(io_err("send the launcher its plan"))?;
        // PID 1 runs and reads its setup now (written only now: a setup larger
        // than a pipe's buffer would otherwise block before `runsc` ran).
        fs::File::from(stdin_w.try_clone().map_err(io_err("dup"))?)
            .write_all(&bundle::setup_line(setup))
            .map_err(io_err("send the agent its setup"))?;
        // A daemon's sandbox outlives the daemon: its agent's input ends now.
        Ok(opts.lifeline.is_some().then_some(stdin_w))
    }
}

/// The refusal the launcher's builder wrote (an [`InitStatus::Refused`] line),
/// once every writer has exited. Read without blocking: a writer still alive
/// (none should be) cannot hold the create.
fn read_refusal(r: OwnedFd) -> Option<RuntimeError> {
    use std::io::Read;
    sys::set_nonblocking(r.as_fd()).ok()?;
    let mut line = Vec::new();
    let _ = fs::File::from(r).take(64 * 1024).read_to_end(&mut line);
    serde_json::from_slice::<crate::plan::InitStatus>(line.trim_ascii_end())
        .ok()?
        .into_refusal()
}

/// What the gVisor backend refuses before doing anything.
fn check(id: &str, spec: &SandboxSpec, opts: &CreateOptions) -> Result<(), RuntimeError> {
    spec.validate()?;
    if spec.image != HOST_IMAGE && opts.image.is_none() {
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
    if spec.network.mode != NetworkMode::None && opts.netns.is_none() {
        return Err(RuntimeError::Spec(sandlot_proto::spec::SpecError::Invalid {
            field: "network.mode".into(),
            problem: format!(
                "mode {:?} needs the daemon's network slots (sandlot serve); sandlot run supports \"none\"",
                spec.network.mode.as_str()
            ),
        }));
    }
    if id.is_empty()
        || id.starts_with('-')
        || id.len() > 64
        || !id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    {
        return Err(RuntimeError::BadId(id.to_string()));
    }
    Ok(())
}

fn wait_timeout(
    child: &mut std::process::Child,
    timeout: Duration,
) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        match child.try_wait() {
            Ok(Some(s)) => return Some(s),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(1)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
        }
    }
}

fn read_pid(path: &Path) -> Result<i32, RuntimeError> {
    fs::read_to_string(path)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .filter(|p: &i32| *p > 0)
        .ok_or_else(|| RuntimeError::Init("runsc wrote no sandbox pid".into()))
}

/// Whether process `pid` is in the sandbox's cgroup `/<parent>/<id>` in every
/// hierarchy it is listed in.
fn in_cgroup(pid: i32, parent: &str, id: &str) -> bool {
    fs::read_to_string(format!("/proc/{pid}/cgroup"))
        .is_ok_and(|s| cgroup_file_places_in(&s, &format!("/{parent}/{id}")))
}

/// Whether a `/proc/PID/cgroup` text puts its process at `want` in every v1
/// hierarchy (`N:controllers:path`), or in the v2 one (`0::path`) when there are
/// no v1 hierarchies.
fn cgroup_file_places_in(text: &str, want: &str) -> bool {
    let entries: Vec<(&str, &str)> = text
        .lines()
        .filter_map(|l| {
            let mut f = l.splitn(3, ':');
            let (_, ctrls, path) = (f.next()?, f.next()?, f.next()?);
            Some((ctrls, path))
        })
        .collect();
    let v1: Vec<&str> = entries
        .iter()
        .filter(|(c, _)| !c.is_empty())
        .map(|(_, p)| *p)
        .collect();
    if v1.is_empty() {
        entries.iter().any(|(c, p)| c.is_empty() && *p == want)
    } else {
        v1.iter().all(|p| *p == want)
    }
}

/// How long a restore waits for a woken agent to listen before it sends the
/// signal again.
const WAKE_AGAIN: Duration = Duration::from_millis(200);

/// Waits until the agent accepts connections on `socket`, or gVisor's sandbox
/// process has exited.
fn wait_listening(socket: &Path, pidfd: &OwnedFd) -> Result<(), RuntimeError> {
    wait_listening_for(socket, pidfd, AGENT_TIMEOUT)
}

/// Whether the agent's socket at `socket` takes a connection. The socket is
/// opened without following a link and connected to through that descriptor: the
/// sandbox can write the socket's directory (a restored sandbox's processes run
/// before its agent listens again), and a link it put there is never followed to a
/// host socket.
fn agent_listens(socket: &Path) -> bool {
    use std::os::unix::fs::FileTypeExt;
    let Ok(path) = sys::cstr(socket) else {
        return false;
    };
    let Ok(fd) = sys::open_path(&path, true) else {
        return false;
    };
    let f = fs::File::from(fd);
    if !f.metadata().is_ok_and(|m| m.file_type().is_socket()) {
        return false;
    }
    std::os::unix::net::UnixStream::connect(format!("/proc/self/fd/{}", f.as_raw_fd())).is_ok()
}

/// [`wait_listening`] for at most `timeout`.
fn wait_listening_for(
    socket: &Path,
    pidfd: &OwnedFd,
    timeout: Duration,
) -> Result<(), RuntimeError> {
    let deadline = Instant::now() + timeout;
    loop {
        if agent_listens(socket) {
            return Ok(());
        }
        let mut pfd = libc::pollfd {
            fd: pidfd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd that outlives the call; 1 ms timeout.
        if unsafe { libc::poll(&mut pfd, 1, 1) } > 0 {
            return Err(RuntimeError::Init(
                "gVisor's sandbox exited before its agent listened".into(),
            ));
        }
        if Instant::now() >= deadline {
            return Err(RuntimeError::Init(format!(
                "the agent did not listen within {} ms",
                timeout.as_millis()
            )));
        }
    }
}

/// How `sandlot_exe` runs inside a sandbox: through its loader (`PT_INTERP`) and
/// the directories of the libraries this process, the same binary, runs with.
fn agent_runtime(sandlot_exe: &Path) -> Result<bundle::AgentRuntime, RuntimeError> {
    use std::os::unix::fs::FileExt;
    let exe =
        fs::File::open(sandlot_exe).map_err(io_err(format!("open {}", sandlot_exe.display())))?;
    let interpreter = bundle::elf_interpreter(|off, len| {
        let mut b = vec![0; len];
        match exe.read_exact_at(&mut b, off) {
            Ok(()) => Ok(Some(b)),
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Ok(None),
            Err(e) => Err(e),
        }
    })
    .map_err(io_err(format!("read {}", sandlot_exe.display())))?;
    let Some(loader) = interpreter else {
        return Ok(bundle::AgentRuntime::default());
    };
    let loader =
        fs::canonicalize(&loader).map_err(io_err(format!("resolve {}", loader.display())))?;
    let maps = fs::read_to_string("/proc/self/maps").map_err(io_err("read /proc/self/maps"))?;
    let lib_dirs = bundle::library_dirs(&maps, &loader)
        .into_iter()
        .filter_map(|d| fs::canonicalize(d).ok())
        .fold(Vec::new(), |mut v: Vec<PathBuf>, d| {
            if !v.contains(&d) {
                v.push(d);
            }
            v
        });
    Ok(bundle::AgentRuntime {
        loader: Some(loader),
        lib_dirs,
    })
}

/// Mount points of the cgroup hierarchies (v1 and v2) in this mount namespace.
fn cgroup_mounts() -> Vec<PathBuf> {
    let mi = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    mi.lines()
        .filter_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            let fstype = right.split_whitespace().next()?;
            (fstype == "cgroup" || fstype == "cgroup2")
                .then(|| left.split_whitespace().nth(4).map(PathBuf::from))
                .flatten()
        })
        .collect()
}

/// Kills every process of the sandbox's cgroup, removes it (and what `runsc`
/// made of it in other hierarchies, and their parents when empty) and the
/// sandbox's directory. True if nothing of it is left.
/// What the agent's directory holds at most: its socket and whatever a sandbox
/// process writes there (it is bound writable into the sandbox), never more of the
/// host's `/run`.
const AGENT_RUN_TMPFS: &std::ffi::CStr = c"size=16k,nr_inodes=16,mode=0700";

/// Mounts a tiny tmpfs of its own on the agent's directory (in the host's mount
/// namespace: the daemon connects to the socket there).
fn mount_agent_run(dir: &Path) -> Result<(), RuntimeError> {
    let target = sys::cstr(dir).map_err(io_err(format!("mount on {}", dir.display())))?;
    sys::mount(
        Some(c"sandlot-agent"),
        &target,
        Some(c"tmpfs"),
        libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
        Some(AGENT_RUN_TMPFS),
    )
    .map_err(io_err(format!("mount a tmpfs on {}", dir.display())))
}

fn remove_traces(cg: &Cgroup, hierarchies: &[PathBuf], parent: &str, id: &str, dir: &Path) -> bool {
    let emptied = cg.kill_all(Duration::from_secs(5));
    let removed = cg.remove(Duration::from_secs(5)).is_ok();
    // The agent directory's and the root's tmpfs (absent when the create failed
    // before them, or the root is not a tmpfs).
    for sub in ["agent", "root"] {
        if let Ok(path) = sys::cstr(&dir.join(sub)) {
            let _ = sys::umount2(&path, libc::MNT_DETACH);
        }
    }
    for h in hierarchies {
        let d = h.join(parent).join(id);
        if d.exists() {
            let _ = fs::remove_dir(&d);
        }
        let _ = fs::remove_dir(h.join(parent));
    }
    let _ = fs::remove_dir_all(dir);
    emptied && removed && !dir.exists()
}

impl Backend for GvisorBackend {
    fn name(&self) -> &'static str {
        "gvisor"
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

    fn restore(
        &self,
        id: &str,
        spec: &SandboxSpec,
        opts: CreateOptions,
        image: &Path,
    ) -> Result<Box<dyn Instance>, RuntimeError> {
        self.start_instance(id, spec, opts, Some(image))
            .map(|i| Box::new(i) as Box<dyn Instance>)
    }

    fn remove_checkpoint(&self, dir: &Path) -> Result<(), RuntimeError> {
        kept_root::remove_checkpoint(dir)
    }

    /// The sandbox's directory must still be there, and `pid` still gVisor's
    /// sandbox process in the sandbox's cgroup.
    fn adopt(&self, id: &str, pid: i32) -> Result<Box<dyn Instance>, RuntimeError> {
        let gone = || RuntimeError::Gone(id.to_string());
        let dir = self.sandbox_dir(id);
        if !dir.join("config.json").is_file() {
            return Err(gone());
        }
        let pidfd = sys::pidfd_open(pid).map_err(|_| gone())?;
        // Checked after the pidfd pins the process: not a recycled pid.
        let cmdline = fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        if !in_cgroup(pid, &self.cfg.cgroup_parent, id) || !cmdline.starts_with(b"runsc-sandbox") {
            return Err(gone());
        }
        let mount_points = read_mount_points(&dir);
        let id_base = fs::read(dir.join("config.json"))
            .ok()
            .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
            .and_then(|c| bundle::id_base_of(&c))
            .ok_or_else(gone)?;
        let mut runsc = vec![self.runsc.path.to_string_lossy().into_owned()];
        let networked = fs::read(dir.join("config.json"))
            .ok()
            .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
            .is_some_and(|c| bundle::has_network_path(&c));
        runsc.extend(self.runsc.global_args(&dir.join("state"), networked));
        let cgroup = self.plan_cgroup(id);
        Ok(Box::new(GvisorInstance {
            id: id.to_string(),
            pid,
            pidfd,
            socket: dir.join("agent").join("agent.sock"),
            cgroup,
            dir,
            hierarchies: self.hierarchies.clone(),
            cgroup_parent: self.cfg.cgroup_parent.clone(),
            relay: self.relay_argv(),
            lifeline: Mutex::new(None),
            mount_points,
            runsc,
            id_base,
            memory_kills: AtomicU64::new(0),
        }))
    }

    fn reap_leftovers(&self, prefix: &str, live: &[String]) -> Leftovers {
        let mut left = Leftovers::default();
        let Ok(rd) = fs::read_dir(self.cfg.run_dir.join("gvisor")) else {
            return left;
        };
        for e in rd.flatten() {
            let id = e.file_name().to_string_lossy().into_owned();
            if !id.starts_with(prefix) || live.contains(&id) {
                continue;
            }
            let cg = self.plan_cgroup(&id);
            if !cg.pids().is_empty() {
                left.killed.push(id.clone());
            }
            remove_traces(
                &cg,
                &self.hierarchies,
                &self.cfg.cgroup_parent,
                &id,
                &e.path(),
            );
            left.swept.push(id);
        }
        left
    }

    fn host_traces(&self, prefix: &str) -> Vec<PathBuf> {
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
        scan(&self.cfg.run_dir.join("gvisor"));
        for h in &self.hierarchies {
            scan(&h.join(&self.cfg.cgroup_parent));
        }
        out
    }
}

impl GvisorBackend {
    /// Removes what sandboxes of `sandlot run` left when their CLI was killed: the
    /// directories (older than a minute: younger ones may be starting) whose
    /// cgroup holds no process. Returns their ids.
    pub fn sweep(&self) -> Vec<String> {
        let mut cleaned = Vec::new();
        let Ok(rd) = fs::read_dir(self.cfg.run_dir.join("gvisor")) else {
            return cleaned;
        };
        for e in rd.flatten() {
            let id = e.file_name().to_string_lossy().into_owned();
            let old = e
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|d| d > Duration::from_secs(60));
            let cg = self.plan_cgroup(&id);
            if old && cg.pids().is_empty() {
                remove_traces(
                    &cg,
                    &self.hierarchies,
                    &self.cfg.cgroup_parent,
                    &id,
                    &e.path(),
                );
                cleaned.push(id);
            }
        }
        cleaned
    }
}

/// A gVisor sandbox: its sandbox process (the one `runsc` reports; it exits with
/// the sandbox's PID 1 and its status), cgroup and directory.
#[derive(Debug)]
pub struct GvisorInstance {
    id: String,
    pid: i32,
    pidfd: OwnedFd,
    socket: PathBuf,
    cgroup: Cgroup,
    dir: PathBuf,
    hierarchies: Vec<PathBuf>,
    cgroup_parent: String,
    /// The port relay's command line inside (see [`Instance::port_access`]).
    relay: Vec<String>,
    /// The write end of the agent's standard input when it is the sandbox's
    /// lifeline (`sandlot run`).
    lifeline: Mutex<Option<OwnedFd>>,
    /// Where the plan mounted something over the root (see
    /// [`SnapshotSource::mount_points`]).
    mount_points: BTreeSet<PathBuf>,
    /// `runsc` and its global flags for this sandbox (state root, platform,
    /// network), for `checkpoint` and `kill`.
    runsc: Vec<String>,
    /// First host uid/gid of the sandbox's range (root inside).
    id_base: u32,
    /// Processes the agent killed for memory ([`Instance::count_memory_kill`]),
    /// counted with the kernel's OOM kills in [`Instance::usage`].
    memory_kills: AtomicU64,
}

/// The hard memory limit written in `cg` (v2 `memory.max`, v1
/// `memory.limit_in_bytes`).
fn hard_memory_limit(cg: &Cgroup) -> Option<u64> {
    let (ctrl, file) = if cg.version == 2 {
        ("", "memory.max")
    } else {
        ("memory", "memory.limit_in_bytes")
    };
    let d = cg.dirs.iter().find(|(c, _)| cg.version == 2 || c == ctrl)?;
    fs::read_to_string(d.1.join(file)).ok()?.trim().parse().ok()
}

/// The file of a sandbox's directory that keeps its mount points for an owner
/// that adopts it after a restart. The daemon's own: nothing of the sandbox
/// reaches the directory.
const MOUNT_POINTS_FILE: &str = "mount-points.json";

fn write_mount_points(dir: &Path, points: &BTreeSet<PathBuf>) -> Result<(), RuntimeError> {
    let path = dir.join(MOUNT_POINTS_FILE);
    fs::write(&path, serde_json::to_vec(points).expect("json"))
        .map_err(io_err(format!("write {}", path.display())))
}

/// The recorded mount points; none when the file is gone or unreadable (a
/// snapshot then keeps the stubs, which is all it can get wrong).
fn read_mount_points(dir: &Path) -> BTreeSet<PathBuf> {
    fs::read(dir.join(MOUNT_POINTS_FILE))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default()
}

impl Instance for GvisorInstance {
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

    /// Every process of the cgroup (gVisor's sandbox, gofer and helpers) is
    /// SIGKILLed: nothing of the sandbox runs any more once the sandbox process
    /// is reaped.
    fn kill(&self, timeout: Duration) -> Option<i32> {
        drop(
            self.lifeline
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take(),
        );
        let _ = sys::pidfd_send_signal(self.pidfd.as_fd(), libc::SIGKILL);
        self.cgroup.kill_all(timeout);
        self.wait_exit(timeout)
    }

    fn terminate(&self) -> Result<(), RuntimeError> {
        self.kill(Duration::from_secs(10));
        if !remove_traces(
            &self.cgroup,
            &self.hierarchies,
            &self.cgroup_parent,
            &self.id,
            &self.dir,
        ) {
            return Err(RuntimeError::Stuck(self.id.clone()));
        }
        Ok(())
    }

    fn usage(&self) -> Option<cgroup::Usage> {
        self.cgroup.exists().then(|| {
            let mut u = self.cgroup.usage();
            u.oom_kills += self.memory_kills.load(Ordering::Relaxed);
            u
        })
    }

    /// gVisor has no OOM killer: the agent kills for it when the use passes the
    /// declared limit, the cgroup's hard limit leaving headroom above it. A
    /// cgroup without headroom (a sandbox started before the memory guard, taken
    /// back after a restart) is not watched: the host kernel ends the sandbox at
    /// its limit, as it did when it started.
    fn memory_watch(&self, declared: u64) -> Option<io::Result<(MemoryWatch, Option<String>)>> {
        let hard = hard_memory_limit(&self.cgroup)?;
        if !memory::leaves_headroom(declared, hard) {
            return Some(Err(io::Error::other(format!(
                "its cgroup's hard limit ({hard} bytes) leaves no headroom above its declared \
                 limit ({declared} bytes): it was started before the memory guard"
            ))));
        }
        Some(MemoryWatch::open(&self.cgroup, declared))
    }

    fn count_memory_kill(&self) {
        self.memory_kills.fetch_add(1, Ordering::Relaxed);
    }

    /// gVisor's own network stack holds the sandbox's sockets: no host socket
    /// reaches its loopback. A relay started through the agent does.
    fn port_access(&self) -> PortAccess {
        PortAccess::Relay(self.relay.clone())
    }

    fn port_sockets(&self, reply: PortSocketsReply) {
        reply(Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "ports of a gVisor sandbox are reached through its agent",
        )))
    }

    fn hold_still(&self, timeout: Duration) -> Result<Stillness<'_>, RuntimeError> {
        self.cgroup.freeze(true, timeout)?;
        Ok(Stillness::new(move || {
            self.cgroup
                .freeze(false, timeout)
                .map_err(RuntimeError::from)
        }))
    }

    /// `runsc checkpoint`: gVisor saves its kernel (memory, processes, open files,
    /// in-sandbox sockets) into `dir`, and the sandbox ends. The agent must have
    /// been quiesced first: a socket bound to the host cannot be saved. (Its
    /// `--leave-running` destroys and restores the sandbox in place, which a
    /// restore by the owner does as well.)
    fn checkpoint(&self, dir: &Path) -> Result<(), RuntimeError> {
        let args = [
            "checkpoint".to_string(),
            format!("--image-path={}", dir.display()),
            self.id.clone(),
        ];
        self.runsc_call(&args, "checkpoint", self.runsc_timeout())
    }

    /// The `host` image's root tmpfs, mounted on the host, is bound into `dir`.
    fn keep_root(&self, dir: &Path) -> Result<bool, RuntimeError> {
        kept_root::keep(&self.dir.join("root"), self.id_base, dir)
    }

    fn wake_agent(&self) -> Result<(), RuntimeError> {
        self.runsc_call(
            &["kill".into(), self.id.clone(), "USR1".into()],
            "wake the agent",
            self.runsc_timeout(),
        )
    }

    /// A store image's writable layer is the daemon's directory; a tmpfs root
    /// (the `host` image's) is mounted on the host in the sandbox's directory, with
    /// only what the plan made in it and the sandbox's own files (the plan's
    /// mounts are the launcher's namespace's).
    fn snapshot_source(&self) -> Result<SnapshotSource, RuntimeError> {
        let root = self.dir.join("root");
        let live_root = match fs::read_to_string("/proc/self/mountinfo") {
            Ok(info) if !mounts::mount_points_under(&info, &root).is_empty() => {
                let dir = fs::File::open(&root).map_err(|_| RuntimeError::Gone(self.id.clone()))?;
                let map = format!("0 {} {}\n", self.id_base, crate::plan::ID_RANGE);
                Some(crate::LiveRoot {
                    dir,
                    id_maps: Some((map.clone(), map)),
                })
            }
            _ => None,
        };
        Ok(SnapshotSource {
            mount_points: self.mount_points.clone(),
            live_root,
        })
    }

    fn add_helper(&self, pid: i32) -> io::Result<()> {
        self.cgroup.attach(pid).map_err(io::Error::other)
    }
}

impl GvisorInstance {
    /// How long a `runsc` command on this sandbox may take: a minute, and ten
    /// seconds more per GiB of its memory limit (what a checkpoint writes).
    fn runsc_timeout(&self) -> Duration {
        let limit = self
            .cgroup
            .dirs
            .iter()
            .find_map(|(controller, dir)| {
                let file = match controller.as_str() {
                    "" => "memory.max",
                    "memory" => "memory.limit_in_bytes",
                    _ => return None,
                };
                fs::read_to_string(dir.join(file))
                    .ok()?
                    .trim()
                    .parse::<u64>()
                    .ok()
            })
            .unwrap_or_else(|| self.cgroup.usage().memory_bytes);
        runsc_timeout_for(limit)
    }

    /// Runs `runsc` with this sandbox's global flags and `args`, to its end or
    /// for `timeout`: then `runsc` and the sandbox are killed (a stuck
    /// checkpoint must not hold its owner for ever) and the error says so.
    fn runsc_call(
        &self,
        args: &[String],
        what: &str,
        timeout: Duration,
    ) -> Result<(), RuntimeError> {
        let (prog, global) = self.runsc.split_first().expect("runsc has a path");
        let mut cmd = Command::new(prog);
        cmd.args(global)
            .args(args)
            .env_clear()
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        // SAFETY: the closure only calls prctl, which is async-signal-safe, and
        // allocates nothing. The command dies with its caller: a checkpoint the
        // owner no longer waits for (it was killed) must not change the
        // sandbox's state directory after the next owner swept it.
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut child = cmd
            .spawn()
            .map_err(io_err(format!("run runsc to {what}")))?;
        // Its first 64 KiB of errors, read aside so a full pipe cannot stall it.
        let stderr = child.stderr.take().map(|e| {
            std::thread::spawn(move || {
                use std::io::Read;
                let mut buf = Vec::new();
                let _ = e.take(64 << 10).read_to_end(&mut buf);
                buf
            })
        });
        let deadline = std::time::Instant::now() + timeout;
        let status = loop {
            match child.try_wait() {
                Ok(Some(st)) => break st,
                Ok(None) if std::time::Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                Ok(None) | Err(_) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    self.kill(Duration::from_secs(10));
                    return Err(RuntimeError::Init(format!(
                        "runsc could not {what} sandbox {} within {}s: it and the sandbox were killed",
                        self.id,
                        timeout.as_secs()
                    )));
                }
            }
        };
        let out = std::process::Output {
            status,
            stdout: Vec::new(),
            // A grandchild that keeps the pipe open is not waited for.
            stderr: stderr
                .filter(|t| {
                    let until = std::time::Instant::now() + Duration::from_secs(1);
                    while !t.is_finished() && std::time::Instant::now() < until {
                        std::thread::sleep(Duration::from_millis(10));
                    }
                    t.is_finished()
                })
                .and_then(|t| t.join().ok())
                .unwrap_or_default(),
        };
        if out.status.success() {
            return Ok(());
        }
        let err = String::from_utf8_lossy(&out.stderr);
        // runsc answers a failed save with a Go stack: its first line says why.
        let first = err
            .lines()
            .next()
            .unwrap_or("")
            .chars()
            .take(400)
            .collect::<String>();
        Err(RuntimeError::Init(format!(
            "runsc could not {what} sandbox {} ({}): {first}",
            self.id, out.status
        )))
    }
}

/// A minute, and ten seconds more per GiB of `memory_limit` bytes.
fn runsc_timeout_for(memory_limit: u64) -> Duration {
    let gib = memory_limit.div_ceil(1 << 30).min(1 << 20);
    Duration::from_secs(60 + 10 * gib)
}

#[cfg(test)]
mod tests {
    use super::{cgroup_file_places_in, runsc_timeout_for};
    use std::time::Duration;

    #[test]
    fn a_runsc_command_gets_a_minute_and_ten_seconds_per_gib_of_memory() {
        assert_eq!(runsc_timeout_for(0), Duration::from_secs(60));
        assert_eq!(runsc_timeout_for(512 << 20), Duration::from_secs(70));
        assert_eq!(runsc_timeout_for(4 << 30), Duration::from_secs(100));
        // "max" (no limit) does not parse; u64::MAX is capped, not overflowed.
        assert!(runsc_timeout_for(u64::MAX) > Duration::from_secs(60));
    }

    #[test]
    fn a_sandbox_process_is_in_the_sandbox_cgroup_only_if_every_hierarchy_says_so() {
        let want = "/sandlot/x";
        let good = "9:name=systemd:/sandlot/x\n4:memory:/sandlot/x\n1:cpu:/sandlot/x\n0::/\n";
        assert!(cgroup_file_places_in(good, want));
        // runsc given a relative cgroups path, started from a process in a memory
        // cgroup of its own: the memory limit would apply to a cgroup nobody reads.
        let nested = "4:memory:/process_api/ab/sandlot/x\n1:cpu:/sandlot/x\n0::/\n";
        assert!(!cgroup_file_places_in(nested, want));
        assert!(cgroup_file_places_in("0::/sandlot/x\n", want));
        assert!(!cgroup_file_places_in("0::/other/sandlot/x\n", want));
    }
}
