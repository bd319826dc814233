//! The `sandlot __init` helper: builds one sandbox and becomes its PID 1.
//!
//! It is exec'd fresh by the host (so it is single-threaded and may fork freely) and
//! runs as host root. The process tree it builds:
//!
//! ```text
//! helper (host root, host namespaces)      joins the cgroup, binds the agent socket,
//!  |                                        writes the uid/gid maps, idmaps the rootfs
//!  +- stage1 (new user namespace)           becomes root of that namespace, unshares
//!      |                                    mount, pid, uts, ipc, net and cgroup namespaces
//!      +- PID 1 (new pid namespace)         mounts the root, pivots, confines itself and
//!                                           serves the guest protocol
//! ```
//!
//! The helper and stage1 exit once PID 1 is running; PID 1 is re-parented to the host
//! process, which is a child subreaper.

use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixListener;
use std::path::Path;

use crate::plan::{fds, AgentSetup, InitStatus, SandboxPlan, ID_RANGE};
use crate::{mounts, seccomp, security, sys};

/// What PID 1 hands to the agent once the sandbox is built.
pub struct AgentStart {
    pub listener: UnixListener,
    pub setup: AgentSetup,
    pub lifeline: Option<OwnedFd>,
}

/// The agent's entry point, supplied by the binary (keeps this crate free of the agent).
pub type AgentMain = fn(AgentStart) -> io::Result<()>;

fn status(s: &InitStatus) {
    // SAFETY: fd 1 is the status pipe for the helper's whole life; borrowing it here
    // does not close it.
    let fd = unsafe { BorrowedFd::borrow_raw(fds::STATUS) };
    let mut line = serde_json::to_vec(s).unwrap_or_default();
    line.push(b'\n');
    let _ = sys::write_all_fd(fd, &line);
}

/// Per-phase timing for `SandboxPlan::trace`.
struct Trace {
    on: bool,
    start: std::time::Instant,
    who: &'static str,
}

impl Trace {
    fn new(on: bool, who: &'static str) -> Trace {
        Trace {
            on,
            start: std::time::Instant::now(),
            who,
        }
    }
    fn mark(&self, what: &str) {
        if self.on {
            eprintln!(
                "sandlot-init {} +{:>7.3} ms {what}",
                self.who,
                self.start.elapsed().as_secs_f64() * 1e3
            );
        }
    }
}

fn fail(stage: &str, e: impl std::fmt::Display) -> ! {
    status(&InitStatus::Error {
        message: format!("{stage}: {e}"),
    });
    sys::exit_now(1)
}

/// Entry point of `sandlot __init`. Never returns.
pub fn main(agent: AgentMain) -> ! {
    let mut raw = String::new();
    // SAFETY: fd 0 is the plan pipe handed to us by the host; we take ownership.
    let mut plan_in = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fds::PLAN) });
    if let Err(e) = plan_in.read_to_string(&mut raw) {
        fail("read plan", e);
    }
    drop(plan_in);
    let plan: SandboxPlan = match serde_json::from_str(&raw) {
        Ok(p) => p,
        Err(e) => fail("parse plan", e),
    };
    match helper(&plan, agent) {
        Ok(()) => sys::exit_now(0),
        Err(e) => fail("start sandbox", e),
    }
}

fn helper(plan: &SandboxPlan, agent: AgentMain) -> io::Result<()> {
    let tr = Trace::new(plan.trace, "helper");
    // Everything this process and its descendants do is accounted to the sandbox.
    for d in &plan.cgroup_dirs {
        std::fs::write(d.join("cgroup.procs"), "0")
            .map_err(|e| io::Error::new(e.kind(), format!("join cgroup {}: {e}", d.display())))?;
    }
    tr.mark("cgroup joined");
    // Best effort: the agent should be the OOM killer's last choice. Hosts without
    // CAP_SYS_RESOURCE refuse; the agent is small either way.
    let _ = std::fs::write("/proc/self/oom_score_adj", "-999");

    let _ = std::fs::remove_file(&plan.socket_path);
    let listener = UnixListener::bind(&plan.socket_path).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("bind {}: {e}", plan.socket_path.display()),
        )
    })?;
    std::fs::set_permissions(
        &plan.socket_path,
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )?;

    tr.mark("socket bound");
    let (mine, theirs) = sys::socketpair()?;
    let (pid_r, pid_w) = sys::pipe()?;
    let stage1 = match sys::fork()? {
        sys::Fork::Child => {
            drop(mine);
            drop(pid_r);
            let r = stage1(plan, theirs.as_fd(), pid_w, listener, agent);
            if let Err(e) = r {
                fail("stage1", e);
            }
            sys::exit_now(0);
        }
        sys::Fork::Parent(pid) => pid,
    };
    drop(theirs);
    drop(pid_w);
    drop(listener);

    // 1. stage1 has a user namespace: map its ids.
    match sys::recv_with_fd(mine.as_fd())? {
        Some((b'u', _)) => {}
        _ => {
            return Err(io::Error::other(
                "stage1 died before creating its user namespace",
            ))
        }
    }
    let map = format!("0 {} {}\n", plan.id_base, ID_RANGE);
    std::fs::write(format!("/proc/{stage1}/uid_map"), &map)?;
    std::fs::write(format!("/proc/{stage1}/gid_map"), &map)?;
    tr.mark("ids mapped");

    // 2. An idmapped copy of the rootfs, so that its root-owned files are owned by the
    //    sandbox's root. Kernels or filesystems without idmapped mounts fall back to a
    //    plain bind (the files then appear as nobody).
    let idmapped = match &plan.mounts.root {
        mounts::RootFs::Overlay { lower, .. } => idmap_tree(lower, stage1).ok(),
        mounts::RootFs::Tmpfs { .. } => None,
    };
    sys::send_with_fd(mine.as_fd(), b'g', idmapped.as_ref().map(|f| f.as_fd()))?;
    drop(idmapped);

    // 3. stage1 reports the host pid of PID 1, then exits.
    let mut pid_buf = String::new();
    std::fs::File::from(pid_r).read_to_string(&mut pid_buf)?;
    let st = sys::waitpid(stage1)?;
    let pid: i32 = pid_buf
        .trim()
        .parse()
        .map_err(|_| io::Error::other(format!("stage1 failed (wait status {st:#x})")))?;
    tr.mark("pid 1 forked");
    status(&InitStatus::Pid { pid });
    Ok(())
}

fn idmap_tree(lower: &Path, stage1: i32) -> io::Result<OwnedFd> {
    let userns = std::fs::File::open(format!("/proc/{stage1}/ns/user"))?;
    let tree = sys::open_tree_clone(&sys::cstr(lower)?)?;
    sys::mount_setattr(
        Some(tree.as_fd()),
        c"",
        false,
        sys::MOUNT_ATTR_IDMAP,
        Some(userns.as_fd()),
    )?;
    Ok(tree)
}

fn stage1(
    plan: &SandboxPlan,
    sock: BorrowedFd<'_>,
    pid_w: OwnedFd,
    listener: UnixListener,
    agent: AgentMain,
) -> io::Result<()> {
    sys::unshare(libc::CLONE_NEWUSER)?;
    sys::send_with_fd(sock, b'u', None)?;
    let idmapped = match sys::recv_with_fd(sock)? {
        Some((b'g', fd)) => fd,
        _ => return Err(io::Error::other("helper died before mapping ids")),
    };
    sys::setresgid(0)?;
    sys::setgroups_empty()?;
    sys::setresuid(0)?;
    sys::unshare(
        libc::CLONE_NEWNS
            | libc::CLONE_NEWUTS
            | libc::CLONE_NEWIPC
            | libc::CLONE_NEWNET
            | libc::CLONE_NEWCGROUP
            | libc::CLONE_NEWPID,
    )?;
    match sys::fork()? {
        sys::Fork::Child => {
            drop(pid_w);
            if let Err(e) = pid1(plan, idmapped, listener, agent) {
                fail("sandbox init", e);
            }
            sys::exit_now(0);
        }
        sys::Fork::Parent(pid) => {
            let mut w = std::fs::File::from(pid_w);
            w.write_all(pid.to_string().as_bytes())?;
            Ok(())
        }
    }
}

fn set_cloexec(fd: i32) {
    // SAFETY: F_SETFD on a descriptor number; harmless if it is not open.
    unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
}

fn pid1(
    plan: &SandboxPlan,
    idmapped: Option<OwnedFd>,
    listener: UnixListener,
    agent: AgentMain,
) -> io::Result<()> {
    let tr = Trace::new(plan.trace, "pid1  ");
    // Our mounts must never propagate back to the host.
    sys::mount(None, c"/", None, libc::MS_REC | libc::MS_PRIVATE, None)?;
    let root = mounts::mount_root(&plan.mounts.root, &plan.root_dir, idmapped)
        .map_err(io::Error::other)?;
    tr.mark("root mounted");
    mounts::apply(&plan.root_dir, &plan.mounts.ops).map_err(io::Error::other)?;
    tr.mark("mount plan applied");
    sys::sethostname(&plan.hostname)?;
    sys::loopback_up()?;
    sys::chdir(&sys::cstr(&plan.root_dir)?)?;
    sys::pivot_root_here()?;
    sys::chdir(c"/")?;
    sys::umask(0o022);
    tr.mark("pivoted");

    security::set_non_dumpable().map_err(io::Error::other)?;
    security::drop_capabilities().map_err(io::Error::other)?;
    let ll = security::apply_landlock().map_err(io::Error::other)?;
    let prog = seccomp::compile(&seccomp::default_policy()).map_err(io::Error::other)?;
    seccomp::install(&prog).map_err(io::Error::other)?;
    tr.mark("confined (caps, landlock, seccomp)");

    // Descriptors inherited from the host stay open (the locks are held by this
    // process for the sandbox's lifetime) but must not leak into user processes.
    for fd in [
        fds::LIFELINE,
        fds::SLOT_LOCK,
        fds::ALIVE_LOCK,
        listener.as_raw_fd(),
    ] {
        set_cloexec(fd);
    }
    let lifeline = if plan.lifeline {
        // SAFETY: the host passed the lifeline read end as fd 3; we own it from here.
        Some(unsafe { OwnedFd::from_raw_fd(fds::LIFELINE) })
    } else {
        None
    };
    status(&InitStatus::Ready {
        idmapped_root: root.idmapped,
        landlock_abi: ll.abi,
    });
    // Done with the status pipe; stdout now goes nowhere.
    let null = std::fs::OpenOptions::new().write(true).open("/dev/null")?;
    // SAFETY: dup2 onto fd 1, which we own; `null` stays valid during the call.
    unsafe { libc::dup2(null.as_raw_fd(), fds::STATUS) };
    agent(AgentStart {
        listener,
        setup: plan.agent.clone(),
        lifeline,
    })
}
