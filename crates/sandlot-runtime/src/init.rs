//! The `sandlot __init` helper: builds one sandbox and becomes its PID 1.
//!
//! It is exec'd fresh by the host (so it is single-threaded and may fork freely) and
//! runs as host root. The process tree it builds:
//!
//! ```text
//! helper (host root, host namespaces)   joins the cgroup, binds the agent socket,
//!  |                                     clones PID 1, writes its uid/gid maps,
//!  |                                     idmaps the rootfs
//!  +- PID 1 (new user, mount, pid, uts,  becomes root of its user namespace, mounts
//!     ipc, net, cgroup namespaces)       the root, pivots, confines itself and
//!                                        serves the guest protocol
//! ```
//!
//! The helper exits once PID 1 is running; PID 1 is re-parented to the host process,
//! which is a child subreaper.

use std::io::{self, Read};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixListener;
use std::path::Path;

use crate::plan::{fds, AgentSetup, InitStatus, SandboxPlan, Trace, ID_RANGE};
use crate::{mounts, seccomp, security, sys};

/// What PID 1 hands to the agent once the sandbox is built.
pub struct AgentStart {
    pub listener: UnixListener,
    pub setup: AgentSetup,
    /// The plan's command to start at once ([`SandboxPlan::first_exec`]).
    pub first_exec: Option<sandlot_proto::guest::ExecRequest>,
    pub lifeline: Option<OwnedFd>,
    /// PID 1's own `oom_score_adj`, opened read-write while PID 1 still had the
    /// host's ids (once it is the sandbox's root and non-dumpable it may not open
    /// it): lets the agent start its processes at 0 and keep its own score.
    pub oom_score_adj: Option<OwnedFd>,
}

/// The agent's entry point, supplied by the binary (keeps this crate free of the agent).
pub type AgentMain = fn(AgentStart) -> io::Result<()>;

fn status(s: &InitStatus) {
    // SAFETY: fd 1 is the status pipe for the helper's whole life; borrowing it here
    // does not close it.
    s.write_line(unsafe { BorrowedFd::borrow_raw(fds::STATUS) });
}

fn fail(stage: &str, e: impl std::fmt::Display) -> ! {
    status(&InitStatus::Error {
        message: format!("{stage}: {e}"),
    });
    sys::exit_now(1)
}

/// Entry point of `sandlot __init`. Never returns.
pub fn main(agent: AgentMain) -> ! {
    // PID 1 shows the entry it was started as: `__init`, or `__zygote` when the
    // fork server made it.
    let entry = std::env::args_os()
        .nth(1)
        .map(|a| a.to_string_lossy().into_owned())
        .unwrap_or_default();
    main_as(&entry, agent)
}

/// [`main`] with the entry name PID 1's command line shows (`sandlot ENTRY`).
pub(crate) fn main_as(entry: &str, agent: AgentMain) -> ! {
    // Whatever the caller blocked (a supervisor blocking SIGCHLD or SIGTERM) would
    // reach PID 1 and its reaping: the helper starts with no signal blocked,
    // forked or exec'd alike.
    if let Err(e) = sys::unblock_all_signals() {
        fail("unblock signals", e);
    }
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
    run_helper(&plan, entry, agent)
}

/// [`main_as`] in a helper forked with its plan in memory: the plan pipe (fd 0)
/// carries nothing and is closed unread.
pub(crate) fn main_with_plan(plan: &SandboxPlan, entry: &str, agent: AgentMain) -> ! {
    if let Err(e) = sys::unblock_all_signals() {
        fail("unblock signals", e);
    }
    // SAFETY: fd 0 is the plan pipe handed to us by the host; we take ownership.
    drop(unsafe { OwnedFd::from_raw_fd(fds::PLAN) });
    run_helper(plan, entry, agent)
}

fn run_helper(plan: &SandboxPlan, entry: &str, agent: AgentMain) -> ! {
    match helper(plan, entry, agent) {
        Ok(()) => sys::exit_now(0),
        Err(e) => fail("start sandbox", e),
    }
}

fn helper(plan: &SandboxPlan, entry: &str, agent: AgentMain) -> io::Result<()> {
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
    // PID 1 inherits this process's argument strings, which sandbox processes can read
    // in `/proc/1/cmdline`: the binary's host path and, from the fork server, its run
    // directory (from `sandlot run`, the CLI's arguments). They become `sandlot
    // __init` (or `__zygote`, how it was started).
    sys::set_cmdline(&["sandlot", entry])
        .map_err(|e| io::Error::new(e.kind(), format!("rewrite the command line: {e}")))?;
    let (mine, theirs) = sys::socketpair()?;
    // A prepared network namespace is joined here, as host root, so that PID 1
    // inherits it and its new user namespace does not own it.
    let mut netns_flag = libc::CLONE_NEWNET;
    if plan.netns {
        // SAFETY: the host passed the prepared network namespace as fd 6; we own it.
        let ns = unsafe { OwnedFd::from_raw_fd(fds::NETNS) };
        sys::setns_net(ns.as_fd()).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("join the prepared network namespace: {e}"),
            )
        })?;
        drop(ns);
        netns_flag = 0;
        tr.mark("netns joined");
    }
    // PID 1 is created directly in its new namespaces: the user namespace first, the
    // others owned by it (clone(2) orders them so).
    let pid = match sys::clone_into_namespaces(
        libc::CLONE_NEWUSER
            | libc::CLONE_NEWNS
            | libc::CLONE_NEWUTS
            | libc::CLONE_NEWIPC
            | netns_flag
            | libc::CLONE_NEWCGROUP
            | libc::CLONE_NEWPID,
    )? {
        sys::Fork::Child => {
            drop(mine);
            if let Err(e) = become_pid1(plan, theirs.as_fd(), listener, agent) {
                if let Some(refused) = InitStatus::refusal_of(&e) {
                    status(&refused);
                    sys::exit_now(1);
                }
                fail("sandbox init", e);
            }
            sys::exit_now(0);
        }
        sys::Fork::Parent(pid) => pid,
    };
    drop(theirs);
    drop(listener);
    tr.mark("pid 1 cloned");

    write_id_maps(pid, plan.id_base)?;
    tr.mark("ids mapped");
    send_idmapped(mine.as_fd(), &plan.mounts, pid)?;
    status(&InitStatus::Pid { pid });
    Ok(())
}

/// Maps process `pid`'s user namespace: ids 0..65535 inside are the range from
/// `id_base` on the host.
pub(crate) fn write_id_maps(pid: i32, id_base: u32) -> io::Result<()> {
    let map = format!("0 {id_base} {ID_RANGE}\n");
    std::fs::write(format!("/proc/{pid}/uid_map"), &map)?;
    std::fs::write(format!("/proc/{pid}/gid_map"), &map)
}

/// Sends process `pid` (root of its mapped user namespace) over `sock` what it
/// mounts idmapped into that namespace: an overlay root's lower directory
/// (`b'g'`, or no descriptor), then each of [`mounts::MountPlan::idmap_sources`]
/// (`b'm'`). [`recv_idmapped`] is the other end.
pub(crate) fn send_idmapped(
    sock: BorrowedFd<'_>,
    plan: &mounts::MountPlan,
    pid: i32,
) -> io::Result<()> {
    // An idmapped copy of the rootfs, so that its root-owned files are owned by the
    // sandbox's root. Kernels or filesystems without idmapped mounts fall back to a
    // plain bind (the files then appear as nobody).
    let idmapped = match &plan.root {
        // The pinned directory, reached without a link (or PID 1's fallback bind
        // refuses it too).
        mounts::RootFs::Overlay {
            lower, lower_id, ..
        } => crate::host_path::reopen(lower, *lower_id)
            .and_then(|(fd, _)| sys::open_tree_clone_fd(fd.as_fd(), true))
            .and_then(|tree| idmap(tree, pid))
            .ok(),
        mounts::RootFs::Tmpfs { .. } | mounts::RootFs::Layers { .. } => None,
    };
    sys::send_with_fd(sock, b'g', idmapped.as_ref().map(|f| f.as_fd()))?;
    drop(idmapped);
    // Image layers, the writable layer directory and volumes, each idmapped the same
    // way (a failed idmap is sent as no descriptor: PID 1 binds the plain path). A
    // volume whose filesystem refuses idmaps (a FUSE collection mount) is sent as a
    // plain copy of its tree instead: PID 1, root of its own user namespace only,
    // could not reach it by path under the daemon's root-only data directory.
    let sources = plan.idmap_sources();
    let volumes = plan
        .ops
        .iter()
        .filter(|op| matches!(op, mounts::MountOp::IdmappedBind { .. }))
        .count();
    let first_volume = sources.len().saturating_sub(volumes);
    for (i, src) in sources.iter().enumerate() {
        let mut tree = idmap_tree(src, pid).ok();
        if tree.is_none() && i >= first_volume {
            tree = sys::cstr(src).and_then(|c| sys::open_tree_clone(&c)).ok();
        }
        sys::send_with_fd(sock, b'm', tree.as_ref().map(|f| f.as_fd()))?;
    }
    Ok(())
}

/// An overlay root's idmapped lower directory, if any, and the trees of
/// [`mounts::MountPlan::idmap_sources`] (`None` where the idmap failed).
pub(crate) type Idmapped = (Option<OwnedFd>, Vec<Option<OwnedFd>>);

/// Receives what [`send_idmapped`] sent.
pub(crate) fn recv_idmapped(
    sock: BorrowedFd<'_>,
    plan: &mounts::MountPlan,
) -> io::Result<Idmapped> {
    let idmapped = match sys::recv_with_fd(sock)? {
        Some((b'g', fd)) => fd,
        _ => return Err(io::Error::other("helper died before mapping ids")),
    };
    let mut trees = Vec::new();
    for _ in plan.idmap_sources() {
        match sys::recv_with_fd(sock)? {
            Some((b'm', fd)) => trees.push(fd),
            _ => return Err(io::Error::other("helper died while idmapping layers")),
        }
    }
    Ok((idmapped, trees))
}

fn idmap_tree(lower: &Path, pid1: i32) -> io::Result<OwnedFd> {
    idmap(sys::open_tree_clone(&sys::cstr(lower)?)?, pid1)
}

/// Makes the detached tree idmapped into PID 1's user namespace.
fn idmap(tree: OwnedFd, pid1: i32) -> io::Result<OwnedFd> {
    let userns = std::fs::File::open(format!("/proc/{pid1}/ns/user"))?;
    sys::mount_setattr(
        Some(tree.as_fd()),
        c"",
        false,
        sys::MOUNT_ATTR_IDMAP,
        Some(userns.as_fd()),
    )?;
    Ok(tree)
}

/// In the new namespaces: wait for the id maps, become root of the user namespace,
/// then build the sandbox as its PID 1.
fn become_pid1(
    plan: &SandboxPlan,
    sock: BorrowedFd<'_>,
    listener: UnixListener,
    agent: AgentMain,
) -> io::Result<()> {
    let (idmapped, trees) = recv_idmapped(sock, &plan.mounts)?;
    // Still the host's ids here: the file is ours to open (best effort; without
    // it the agent's children try to reset their own scores).
    let oom_score_adj = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/proc/self/oom_score_adj")
        .ok()
        .map(OwnedFd::from);
    sys::setresgid(0)?;
    sys::setgroups_empty()?;
    sys::setresuid(0)?;
    pid1(plan, idmapped, trees, listener, agent, oom_score_adj)
}

fn set_cloexec(fd: i32) {
    // SAFETY: F_SETFD on a descriptor number; harmless if it is not open.
    unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
}

fn pid1(
    plan: &SandboxPlan,
    idmapped: Option<OwnedFd>,
    mut trees: Vec<Option<OwnedFd>>,
    listener: UnixListener,
    agent: AgentMain,
    oom_score_adj: Option<OwnedFd>,
) -> io::Result<()> {
    let tr = Trace::new(plan.trace, "pid1  ");
    // Our mounts must never propagate back to the host.
    sys::mount(None, c"/", None, libc::MS_REC | libc::MS_PRIVATE, None)?;
    let root = match &plan.mounts.root {
        r @ mounts::RootFs::Layers { .. } => {
            mounts::mount_layers(r, &plan.root_dir, &mut trees, true)
        }
        r => mounts::mount_root(r, &plan.root_dir, idmapped),
    }
    .map_err(io::Error::other)?;
    tr.mark("root mounted");
    let etc_view = plan.etc_view.then(|| {
        // SAFETY: the fork server passed its /etc view as fd 7 (`plan.etc_view`); it
        // is ours alone from here and closed once attached.
        unsafe { OwnedFd::from_raw_fd(fds::ETC_VIEW) }
    });
    mounts::apply_with_trees(&plan.root_dir, &plan.mounts.ops, &mut trees, etc_view)
        .map_err(io::Error::other)?;
    tr.mark("mount plan applied");
    sys::sethostname(&plan.hostname)?;
    if !plan.netns {
        // A prepared namespace is not ours to configure (its `lo` is already up).
        sys::loopback_up()?;
    }
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
        first_exec: plan.first_exec.clone(),
        lifeline,
        oom_score_adj,
    })
}
