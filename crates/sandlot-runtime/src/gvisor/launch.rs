//! `sandlot __gvisor`: the helper the gVisor backend execs per sandbox. In a
//! mount namespace of its own (a slave of the host's: nothing it mounts is seen
//! on the host, and it dies with gVisor's gofer, the last process using it) it
//! builds the sandbox's root filesystem from the [`LaunchPlan`] with the
//! namespace backend's own code ([`crate::mounts`]), hides `/proc/sys/net`, and
//! execs `runsc`.
//!
//! `/proc/sys/net` is hidden because older `runsc` releases take its presence for
//! "this is the host's network namespace" and refuse gVisor's own network stack
//! there; on kernels that show it in every network namespace (6.x) they refuse
//! every sandbox. `/proc/sys` becomes a small tmpfs holding only `kernel`, `vm`
//! and `fs`, bound back from the real one.
//!
//! Descriptors: 0 the agent's standard input (its setup line, then its lifeline
//! or end of file), 1 and 2 where `runsc` (and the sandbox's PID 1) write, 3 the
//! plan (JSON, read to its end), 4 the network namespace of a network slot.

use std::ffi::CString;
use std::io::{self, Read};
use std::os::fd::{AsFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;

use super::bundle::LaunchPlan;
use crate::mounts::{self, RootFs};
use crate::sys;

/// The hidden argument that selects this entry.
pub const LAUNCH_ARG: &str = "__gvisor";
/// The plan's descriptor.
pub(crate) const PLAN_FD: i32 = 3;
/// The network namespace's descriptor (`/proc/self/fd/4` in `config.json`).
pub(crate) const NETNS_FD: i32 = 4;

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

fn launch(plan: &LaunchPlan) -> io::Result<std::convert::Infallible> {
    let ctx = |what: &str| {
        let what = what.to_string();
        move |e: io::Error| io::Error::new(e.kind(), format!("{what}: {e}"))
    };
    sys::unshare_mount_ns().map_err(ctx("unshare the mount namespace"))?;
    // Mounts and unmounts of the host still reach this namespace (a writable
    // layer the daemon unmounts is not kept alive here); none go the other way.
    sys::mount(None, c"/", None, libc::MS_REC | libc::MS_SLAVE, None)
        .map_err(ctx("make / a slave"))?;
    if !plan.root_mounted {
        match &plan.mounts.root {
            r @ RootFs::Layers { .. } => mounts::mount_layers(r, &plan.root_dir, &mut [], false),
            r => mounts::mount_root(r, &plan.root_dir, None),
        }
        .map_err(io::Error::other)?;
    }
    mounts::apply_with_trees(&plan.root_dir, &plan.mounts.ops, &mut [], None)
        .map_err(io::Error::other)?;
    hide_proc_sys_net().map_err(ctx("hide /proc/sys/net"))?;
    let (prog, args) = plan
        .argv
        .split_first()
        .ok_or_else(|| io::Error::other("the plan names no runsc"))?;
    Err(std::process::Command::new(prog).args(args).exec())
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
