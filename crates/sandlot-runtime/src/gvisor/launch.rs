//! `sandlot __gvisor`: the helper the gVisor backend execs per sandbox.
//!
//! ```text
//! launcher (host root)          forks the keeper; in a mount namespace of its own
//!  |                            (a slave of the host's) hides /proc/sys/net and
//!  |                            mounts a spare /proc; clones the builder, writes its
//!  |                            id maps, idmaps layers, writable layer, volumes;
//!  |                            then joins the builder's mount namespace and execs
//!  |                            `runsc run --detach`
//!  +- keeper (host root)        in the sandbox's cgroup, holds the id range's lock
//!  |                            until the cgroup is killed (teardown)
//!  +- builder (root of a user   builds the root filesystem from the [`LaunchPlan`]
//!     namespace mapped to the   with the namespace backend's own code
//!     sandbox's range, in a     ([`crate::mounts`]), exactly as a namespace sandbox's
//!     mount namespace it owns)  PID 1 does, and exits
//! ```
//!
//! So everything the root is made of is owned by the sandbox's range (its tmpfs,
//! the files the plan writes) or seen through an idmapped mount (image layers,
//! the writable layer, volumes), as in a namespace sandbox; `runsc` starts its
//! gofer in a user namespace of the same mapping (`config.json`), which therefore
//! acts on host files as the range's ids and never as host root. The mount
//! namespace dies with gVisor's gofer, the last process using it; nothing mounted
//! in it is seen on the host.
//!
//! The spare `/proc` (a fresh instance at `<sandbox dir>/proc`, which no sandbox
//! process sees: the gofer pivots and the Sentry chroots away) is what lets the
//! gofer, root of its user namespace only, mount its own `/proc`: the kernel
//! allows that only where a `/proc` is already fully visible, and the hidden
//! `/proc/sys/net` below makes the one at `/proc` not so.
//!
//! `/proc/sys/net` is hidden because older `runsc` releases take its presence for
//! "this is the host's network namespace" and refuse gVisor's own network stack
//! there; on kernels that show it in every network namespace (6.x) they refuse
//! every sandbox. `/proc/sys` becomes a small tmpfs holding only `kernel`, `vm`
//! and `fs`, bound back from the real one.
//!
//! Descriptors: 0 the agent's standard input (its setup line, then its lifeline
//! or end of file), 1 and 2 where `runsc` (and the sandbox's PID 1) write, 3 the
//! plan (JSON, read to its end), 4 the network namespace of a network slot, 5 the
//! lock of the sandbox's id range (kept by the keeper only), 6 where the builder
//! reports a root the sandbox's own files make impossible (closed on exec: never
//! `runsc`'s).

use std::ffi::CString;
use std::io::{self, Read};
use std::os::fd::{AsFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;

use super::bundle::LaunchPlan;
use crate::init::{recv_idmapped, send_idmapped, write_id_maps};
use crate::mounts::{self, RootFs};
use crate::plan::InitStatus;
use crate::sys;

/// The hidden argument that selects this entry.
pub const LAUNCH_ARG: &str = "__gvisor";
/// The plan's descriptor.
pub(crate) const PLAN_FD: i32 = 3;
/// The network namespace's descriptor (`/proc/self/fd/4` in `config.json`).
pub(crate) const NETNS_FD: i32 = 4;
/// The id range's lock (an open file holding an exclusive `flock`).
pub(crate) const SLOT_FD: i32 = 5;
/// Where the builder reports that the sandbox's own files make its root
/// impossible to build (an [`InitStatus::Refused`] line); closed on exec, so
/// `runsc` never has it.
pub(crate) const REFUSAL_FD: i32 = 6;

/// Runs the helper; never returns (it execs `runsc` or exits 125).
pub fn main() -> ! {
    let err = match read_plan().and_then(|p| launch(&p)) {
        Ok(never) => match never {},
        Err(e) => e,
    };
    eprintln!("sandlot {LAUNCH_ARG}: {err}");
    std::process::exit(125)
}

fn read_plan() -> io::Result<LaunchPlan> {
    // SAFETY: the backend passes the plan's pipe as fd 3; this process owns it
    // from here and closes it once read.
    let mut f = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(PLAN_FD) });
    let mut raw = String::new();
    f.read_to_string(&mut raw)?;
    serde_json::from_str(&raw).map_err(|e| io::Error::other(format!("parse the plan: {e}")))
}

fn ctx(what: &str) -> impl FnOnce(io::Error) -> io::Error {
    let what = what.to_string();
    move |e: io::Error| io::Error::new(e.kind(), format!("{what}: {e}"))
}

fn launch(plan: &LaunchPlan) -> io::Result<std::convert::Infallible> {
    // The builder (a clone, not an exec) keeps the refusal pipe; `runsc` must not.
    sys::set_cloexec(REFUSAL_FD).map_err(ctx("keep the refusal pipe from runsc"))?;
    keep_id_range(plan).map_err(ctx("keep the id range"))?;
    sys::unshare_mount_ns().map_err(ctx("unshare the mount namespace"))?;
    // Mounts and unmounts of the host still reach this namespace (a writable
    // layer the daemon unmounts is not kept alive here); none go the other way.
    sys::mount(None, c"/", None, libc::MS_REC | libc::MS_SLAVE, None)
        .map_err(ctx("make / a slave"))?;
    hide_proc_sys_net().map_err(ctx("hide /proc/sys/net"))?;
    let spare = plan.root_dir.with_file_name("proc");
    match std::fs::create_dir(&spare) {
        Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return Err(ctx("mkdir")(e)),
        _ => {}
    }
    sys::mount(
        Some(c"proc"),
        &sys::cstr(&spare)?,
        Some(c"proc"),
        libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
        None,
    )
    .map_err(ctx("mount the spare /proc"))?;
    let builder_ns = build_root(plan)?;
    // runsc runs as host root in the builder's mount namespace (owned by the
    // builder's user namespace, which host root may enter).
    sys::setns_mnt(builder_ns.as_fd()).map_err(ctx("join the root's mount namespace"))?;
    drop(builder_ns);
    let (prog, args) = plan
        .argv
        .split_first()
        .ok_or_else(|| io::Error::other("the plan names no runsc"))?;
    Err(std::process::Command::new(prog).args(args).exec())
}

/// Forks the keeper: it joins the sandbox's cgroup, keeps only the id range's
/// lock (fd 5) and waits to be killed with the cgroup, so that the range stays
/// taken while anything of the sandbox lives, across restarts of the daemon. The
/// launcher closes its own copy of the lock.
fn keep_id_range(plan: &LaunchPlan) -> io::Result<()> {
    let (ready_r, ready_w) = sys::pipe()?;
    match sys::fork()? {
        sys::Fork::Child => {
            drop(ready_r);
            for d in &plan.cgroup_dirs {
                if std::fs::write(d.join("cgroup.procs"), "0").is_err() {
                    sys::exit_now(1);
                }
            }
            if sys::write_all_fd(ready_w.as_fd(), b"k").is_err() {
                sys::exit_now(1);
            }
            drop(ready_w);
            // Everything but the lock: the agent's input, runsc's log, the plan.
            let _ = sys::close_range(0, SLOT_FD as u32 - 1);
            let _ = sys::close_range(SLOT_FD as u32 + 1, u32::MAX);
            loop {
                std::thread::park();
            }
        }
        sys::Fork::Parent(pid) => {
            drop(ready_w);
            let mut b = [0u8; 1];
            let got = std::fs::File::from(ready_r).read(&mut b)?;
            if got != 1 {
                let _ = sys::waitpid(pid);
                return Err(io::Error::other(
                    "the keeper could not join the sandbox's cgroup",
                ));
            }
            // SAFETY: the backend passed the lock as fd 5; the keeper holds it now,
            // and this process closes its copy (runsc must not inherit it).
            drop(unsafe { OwnedFd::from_raw_fd(SLOT_FD) });
            Ok(())
        }
    }
}

/// Clones the builder into a new user and mount namespace, maps it to the
/// sandbox's range and hands it the idmapped trees; it builds the root as root
/// of that user namespace. Returns its mount namespace once it is done.
fn build_root(plan: &LaunchPlan) -> io::Result<OwnedFd> {
    let (mine, theirs) = sys::socketpair()?;
    let pid = match sys::clone_into_namespaces(libc::CLONE_NEWUSER | libc::CLONE_NEWNS)? {
        sys::Fork::Child => {
            drop(mine);
            match builder(plan, theirs.as_fd()) {
                Ok(()) => sys::exit_now(0),
                Err(e) => {
                    eprintln!("sandlot {LAUNCH_ARG}: build the root: {e}");
                    if let Some(refused) = InitStatus::refusal_of(&e) {
                        // SAFETY: the backend passed the refusal pipe as fd 6; the
                        // builder only borrows it, once, before it exits.
                        refused.write_line(unsafe { BorrowedFd::borrow_raw(REFUSAL_FD) });
                    }
                    sys::exit_now(1)
                }
            }
        }
        sys::Fork::Parent(pid) => pid,
    };
    drop(theirs);
    let ns = (|| {
        write_id_maps(pid, plan.id_base).map_err(ctx("map the builder's ids"))?;
        send_idmapped(mine.as_fd(), &plan.mounts, pid).map_err(ctx("idmap the layers"))?;
        match sys::recv_with_fd(mine.as_fd())? {
            Some((b'd', _)) => {}
            _ => return Err(io::Error::other("the builder failed")),
        }
        std::fs::File::open(format!("/proc/{pid}/ns/mnt"))
            .map(OwnedFd::from)
            .map_err(ctx("open the builder's mount namespace"))
    })();
    // The builder exits once this end closes.
    drop(mine);
    let status = sys::waitpid(pid)?;
    let ns = ns?;
    if status != 0 {
        return Err(io::Error::other(format!(
            "the builder exited with {status}"
        )));
    }
    Ok(ns)
}

/// The builder: root of a user namespace mapped to the sandbox's range, in a
/// mount namespace it owns, builds the root as a namespace sandbox's PID 1 does.
fn builder(plan: &LaunchPlan, sock: BorrowedFd<'_>) -> io::Result<()> {
    let (idmapped, mut trees) = recv_idmapped(sock, &plan.mounts)?;
    sys::setresgid(0)?;
    sys::setgroups_empty()?;
    sys::setresuid(0)?;
    if !plan.root_mounted {
        match &plan.mounts.root {
            r @ RootFs::Layers { .. } => mounts::mount_layers(r, &plan.root_dir, &mut trees, true),
            r => mounts::mount_root(r, &plan.root_dir, idmapped),
        }
        .map_err(io::Error::other)?;
    }
    mounts::apply_with_trees(&plan.root_dir, &plan.mounts.ops, &mut trees, None)
        .map_err(io::Error::other)?;
    // The bundle binds `<root>/tmp` over gVisor's own /tmp, and `runsc` mounts a
    // bind's source as a host path: a link there (made in an image, followed by
    // the plan only inside the root) would lead it to a host directory.
    if super::bundle::plan_has_tmp(&plan.mounts) {
        let root = std::fs::File::open(&plan.root_dir).map_err(ctx("open the root"))?;
        match sys::open_dir_nofollow(root.as_fd(), c"tmp") {
            Ok(_) => {}
            Err(e) if matches!(e.raw_os_error(), Some(libc::ELOOP | libc::ENOTDIR)) => {
                return Err(io::Error::other(mounts::MountError::InRoot {
                    op: "bind /tmp",
                    path: "/tmp".into(),
                    problem: "is a symbolic link or no directory, which a gVisor sandbox cannot \
                              use: /tmp must be a directory",
                    source: e,
                }))
            }
            Err(e) => return Err(ctx("open the root's /tmp")(e)),
        }
    }
    sys::send_with_fd(sock, b'd', None)?;
    // Alive until the launcher holds the mount namespace.
    let _ = sys::recv_with_fd(sock);
    Ok(())
}

/// `/proc/sys` as a tmpfs holding `kernel`, `vm` and `fs` of the real one.
fn hide_proc_sys_net() -> io::Result<()> {
    let mut kept = Vec::new();
    for d in ["kernel", "vm", "fs"] {
        let path = CString::new(format!("/proc/sys/{d}")).expect("no NUL");
        kept.push((d, sys::open_tree_clone(&path)?));
    }
    sys::mount(
        Some(c"sandlot"),
        c"/proc/sys",
        Some(c"tmpfs"),
        libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
        Some(c"size=64k,mode=0555"),
    )?;
    for (d, tree) in kept {
        let path = CString::new(format!("/proc/sys/{d}")).expect("no NUL");
        std::fs::create_dir(format!("/proc/sys/{d}"))?;
        sys::move_mount_to(tree.as_fd(), &path)?;
    }
    Ok(())
}
