//! The collection mount helper: the process (`sandlot __vfs-serve MOUNTPOINT`) that
//! serves one read-only FUSE mount of a collection view into one sandbox. The
//! daemon starts it, sends it a [`ServeRequest`] on its standard input and reads
//! `ready` (or `error: ...`) on its standard output; the helper confines itself
//! (no capabilities, an empty network namespace, Landlock, a seccomp allow-list)
//! before it serves a byte, and outlives the daemon with the sandbox it serves.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// The hidden subcommand of the `sandlot` binary that serves one mount.
pub const SERVE_ARG: &str = "__vfs-serve";

/// What a helper serves, sent as JSON on its standard input.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServeRequest {
    /// The tenant's collection store directory.
    pub store: PathBuf,
    pub collection: String,
    pub version: u64,
    pub principal: String,
    pub groups: Vec<String>,
    pub all_access: bool,
}

/// Entry point of `sandlot __vfs-serve MOUNTPOINT`: reads a [`ServeRequest`] on
/// standard input, mounts on MOUNTPOINT, confines itself (see [`confine`]), answers
/// `ready` (or `error: ...`) on standard output, then loads the view (requests that
/// arrive meanwhile wait for it) and serves until it is unmounted or receives
/// SIGTERM, SIGINT or SIGHUP. It then exits without unmounting (it no longer may):
/// the daemon unmounts. Never returns.
pub fn serve_main() -> ! {
    let code = match serve() {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("sandlot __vfs-serve: {e}");
            let mut out = std::io::stdout();
            let _ = writeln!(out, "error: {}", e.replace('\n', " "));
            let _ = out.flush();
            1
        }
    };
    std::process::exit(code)
}

fn serve() -> Result<(), String> {
    let t0 = Instant::now();
    // It outlives the daemon: it must hold none of the daemon's descriptors (a
    // listening socket, the data directory's lock) should one lack close-on-exec.
    // Nothing in this process owns a descriptor above 2 yet.
    sandlot_runtime::helper_process::close_inherited_descriptors()
        .map_err(|e| format!("close inherited descriptors: {e}"))?;
    let mountpoint = std::env::args_os()
        .nth(2)
        .map(PathBuf::from)
        .ok_or_else(|| format!("usage: sandlot {SERVE_ARG} MOUNTPOINT (request on stdin)"))?;
    let mut input = Vec::new();
    std::io::stdin()
        .take(1 << 20)
        .read_to_end(&mut input)
        .map_err(|e| format!("read the request: {e}"))?;
    let req: ServeRequest =
        serde_json::from_slice(&input).map_err(|e| format!("bad request: {e}"))?;
    // One plain path component (Landlock grants reads beneath this directory).
    let mut comps = Path::new(&req.collection).components();
    if !matches!(
        (comps.next(), comps.next()),
        (Some(std::path::Component::Normal(_)), None)
    ) {
        return Err(format!("bad collection name {:?}", req.collection));
    }
    let collection_dir = req.store.join("collections").join(&req.collection);
    // Signals are taken synchronously below; block them before the serving threads
    // start so that they inherit the mask.
    let signals = sandlot_runtime::helper_process::StopSignals::block()
        .map_err(|e| format!("block stop signals: {e}"))?;
    // Mount first and answer: the daemon builds the sandbox while the view loads
    // (the daemon has resolved the same view when it pinned the version).
    let slot = crate::fuse::ViewSlot::new();
    let pending = crate::fuse::mount_slot(
        &req.collection,
        slot.clone(),
        &mountpoint,
        &crate::fuse::MountOptions { allow_other: true },
    )
    .map_err(|e| crate::error_chain(&e))?;
    // Opened before confinement, which forbids opening it.
    let null = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/null")
        .map_err(|e| format!("open /dev/null: {e}"))?;
    let confined = confine(&collection_dir)?;
    let mounted_ms = t0.elapsed().as_secs_f64() * 1000.0;
    {
        let mut out = std::io::stdout();
        writeln!(out, "ready").map_err(|e| format!("answer: {e}"))?;
        out.flush().map_err(|e| format!("answer: {e}"))?;
    }
    // The daemon stops reading; later writes must not fail on a closed pipe.
    let _ = rustix::stdio::dup2_stdout(&null);
    drop(null);
    eprintln!(
        "mounted {} in {mounted_ms:.1} ms; {confined}",
        mountpoint.display()
    );
    let mut principal = crate::Principal::new(&req.principal, req.groups.iter().cloned());
    principal.all_access = req.all_access;
    match crate::View::load_unindexed(&req.store, &req.collection, req.version, &principal) {
        Ok(view) => {
            eprintln!(
                "serving collection {} version {} for {} at {} (view loaded in {:.1} ms)",
                req.collection,
                req.version,
                req.principal,
                mountpoint.display(),
                t0.elapsed().as_secs_f64() * 1000.0 - mounted_ms
            );
            slot.fill(Ok(Arc::new(view)));
        }
        Err(e) => {
            // Every request fails with EIO; the daemon validated this view when it
            // pinned the version, so only a disk error or a race gets here.
            let e = crate::error_chain(&e);
            eprintln!("load the view: {e}: every request fails with EIO");
            slot.fill(Err(e));
        }
    }
    // The serving threads start confined (credentials are per thread; new threads
    // copy them), once the view is loaded: the load runs single-threaded (measured
    // markedly faster than with the request threads alive), and requests made
    // meanwhile wait in the kernel's queue.
    let mount = pending.serve().map_err(|e| crate::error_chain(&e))?;
    loop {
        if let Some(sig) = signals.wait(Duration::from_millis(500)) {
            eprintln!("signal {sig}: exiting (the daemon unmounts)");
            break;
        }
        if !mount.is_alive() {
            eprintln!("unmounted: exiting");
            break;
        }
    }
    // No unmount (the capability is gone): the session ends with the process.
    std::mem::forget(mount);
    Ok(())
}

/// What [`confine`] applied, for the helper's log.
struct Confinement {
    landlock: Option<i64>,
}

impl std::fmt::Display for Confinement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "confined: no capabilities (bounding, ambient, effective, permitted and inheritable sets empty), no_new_privs, an empty network namespace, a seccomp allow-list")?;
        match self.landlock {
            Some(abi) => write!(
                f,
                ", landlock ABI {abi} (the filesystem: read-only, the collection's directory only)"
            ),
            None => write!(f, ", landlock unavailable on this kernel"),
        }
    }
}

/// Drops what the helper does not need once its mount is up, for itself and the
/// threads it starts afterwards (credentials, namespaces and seccomp filters are per
/// thread: call it while the process has one thread). It keeps uid 0 (it reads the
/// daemon's root-owned store as their owner) but: leaves the daemon's network
/// namespace for an empty one of its own (no abstract socket or port of the host's
/// is reachable), loses every capability, may not gain privileges on exec, under
/// Landlock may open nothing but files and directories under `collection_dir`,
/// read-only (nor bind or connect TCP sockets, where the kernel can restrict
/// those), and last is held to a seccomp allow-list of what serving takes (no
/// socket at all: a path-named one such as the operator socket is reachable from
/// any network namespace, and Landlock does not cover `connect`). Descriptors
/// already open (`/dev/fuse`, the log, the standard streams) stay usable.
fn confine(collection_dir: &Path) -> Result<Confinement, String> {
    use rustix::thread::{
        clear_ambient_capability_set, remove_capability_from_bounding_set, set_capabilities,
        set_no_new_privs, CapabilitySet, CapabilitySets,
    };
    sandlot_runtime::helper_process::leave_network()
        .map_err(|e| format!("leave the daemon's network namespace: {e}"))?;
    set_no_new_privs(true).map_err(|e| format!("set no_new_privs: {e}"))?;
    let landlock = sandlot_runtime::security::landlock_read_only_beneath(collection_dir)
        .map_err(|e| e.to_string())?;
    // The bounding set, one capability at a time, up to the kernel's last (EINVAL).
    for cap in 0..64u32 {
        match remove_capability_from_bounding_set(CapabilitySet::from_bits_retain(1u64 << cap)) {
            Ok(()) => {}
            Err(rustix::io::Errno::INVAL) => break,
            Err(e) => return Err(format!("drop capability {cap} from the bounding set: {e}")),
        }
    }
    clear_ambient_capability_set().map_err(|e| format!("clear the ambient capabilities: {e}"))?;
    set_capabilities(
        None,
        CapabilitySets {
            effective: CapabilitySet::empty(),
            permitted: CapabilitySet::empty(),
            inheritable: CapabilitySet::empty(),
        },
    )
    .map_err(|e| format!("drop capabilities: {e}"))?;
    sandlot_runtime::helper_process::restrict_syscalls()
        .map_err(|e| format!("install the seccomp filter: {e}"))?;
    Ok(Confinement { landlock })
}
