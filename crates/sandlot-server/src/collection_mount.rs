//! Collections mounted into sandboxes (`MountSpec::Collection`): each mount is the
//! ACL-pruned view of one collection version for one principal, served read-only over
//! FUSE by a helper process of its own (`sandlot __vfs-serve`, `sandlot_vfs::mount_helper`) at a host directory the
//! daemon owns, and bound read-only into the sandbox.
//!
//! ```text
//! data_dir/vfs-mounts/                 0700: no host user but root reaches the mounts
//! data_dir/vfs-mounts/ID/N/            the FUSE mount of the sandbox's mounts[N]
//! data_dir/vfs-mounts/ID/N.log         its helper's diagnostics
//! ```
//!
//! Lifecycle:
//! * **create**: [`pin`] resolves each collection for the tenant and pins its version
//!   into the spec (before admission: an unknown collection is a 400 naming
//!   `mounts[i].collection`); [`CollectionMounts::prepare`] starts the helpers and
//!   waits until each mount answers, then hands their directories to the runtime as
//!   read-only binds. Once the sandbox exists, [`CollectionMounts::attach`] moves the
//!   helpers into its cgroup: their memory and CPU count against the sandbox, and the
//!   runtime's teardown (`cgroup.kill`) takes them with it.
//! * **create failure, delete, reap**: [`CollectionMounts::release`] unmounts, kills
//!   what is left of the helpers and removes the directories.
//! * **daemon stop or crash**: helpers are not the daemon's: they keep serving the
//!   sandboxes, which keep running. On start, [`CollectionMounts::reconcile`] keeps
//!   the helpers of re-adopted sandboxes and removes every other helper, mount and
//!   directory (found by their command lines and `/proc/self/mountinfo`, so nothing a
//!   crash left half-recorded escapes). A mount whose helper died is unmounted on the
//!   host: no `ENOTCONN` mount stays behind.

use std::collections::HashMap;
use std::io::{BufRead, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use sandlot_proto::spec::{normalize_sandbox_path, MountSpec, SandboxSpec, ANONYMOUS_PRINCIPAL};
use sandlot_runtime::mounts::{mount_points_under, SharedDir};

use crate::error::{ApiError, ApiResult};
pub use sandlot_vfs::mount_helper::{ServeRequest, SERVE_ARG};

/// How long a helper may take to mount (open the collection, build the view).
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a killed helper may take to exit.
const EXIT_WAIT: Duration = Duration::from_secs(5);

/// One collection mount of a sandbox, planned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedMount {
    /// Index in `spec.mounts`.
    pub index: usize,
    /// The host directory the helper mounts on.
    pub mountpoint: PathBuf,
    /// Where it appears in the sandbox.
    pub target: String,
    pub request: ServeRequest,
}

/// Resolves every collection mount of `spec` for `tenant` and pins its version (the
/// head, unless the spec names one). Blocking (opens the collections). Errors are 400s
/// naming `mounts[i].collection` / `mounts[i].version`; another tenant's collections
/// are not in this tenant's store, so they are unknown here.
pub fn pin(vfs: &crate::vfs::VfsService, tenant: &str, spec: &mut SandboxSpec) -> ApiResult<()> {
    use sandlot_vfs::StoreError;
    for (i, m) in spec.mounts.iter_mut().enumerate() {
        let MountSpec::Collection {
            collection,
            version,
            principal,
            groups,
            all_access,
            ..
        } = m
        else {
            continue;
        };
        let store = vfs.store(tenant).map_err(|e| {
            if e.field.as_deref() == Some("tenant") {
                ApiError::invalid(format!("mounts[{i}].collection"), e.message)
            } else {
                e
            }
        })?;
        let coll = store.collection(collection).map_err(|e| match e {
            StoreError::NotFound { .. } | StoreError::InvalidName { .. } => ApiError::invalid(
                format!("mounts[{i}].collection"),
                format!("no collection {collection:?}"),
            ),
            e => crate::vfs::store_error(e),
        })?;
        let head = coll.head().map_err(crate::vfs::store_error)?;
        let head = head.manifest.version;
        let v = version.unwrap_or(head);
        coll.version(v).map_err(|e| match e {
            StoreError::NoSuchVersion { .. } => ApiError::invalid(
                format!("mounts[{i}].version"),
                format!("collection {collection:?} has no version {v} (its head is {head})"),
            ),
            e => crate::vfs::store_error(e),
        })?;
        *version = Some(v);
        // The view the helper will serve, resolved here (and cached for the next
        // create): its errors fail the create, while the helper loads its own copy
        // after it has mounted, in parallel with the sandbox's start.
        let mut p = sandlot_vfs::Principal::new(
            principal.as_deref().unwrap_or(ANONYMOUS_PRINCIPAL),
            groups.iter().cloned(),
        );
        p.all_access = *all_access;
        coll.view_at(&p, Some(v)).map_err(crate::vfs::store_error)?;
    }
    Ok(())
}

/// The collection mounts of sandbox `id`, from a spec [`pin`] has resolved. Pure.
pub fn plan(
    root: &Path,
    store: &Path,
    id: &str,
    spec: &SandboxSpec,
) -> Result<Vec<PlannedMount>, String> {
    let mut out = Vec::new();
    for (i, m) in spec.mounts.iter().enumerate() {
        let MountSpec::Collection {
            collection,
            target,
            principal,
            groups,
            all_access,
            version,
        } = m
        else {
            continue;
        };
        let version = version.ok_or_else(|| format!("mounts[{i}]: version not pinned"))?;
        let mut groups = groups.clone();
        groups.sort();
        groups.dedup();
        out.push(PlannedMount {
            index: i,
            mountpoint: root.join(id).join(i.to_string()),
            target: normalize_sandbox_path(target),
            request: ServeRequest {
                store: store.to_path_buf(),
                collection: collection.clone(),
                version,
                principal: principal
                    .clone()
                    .unwrap_or_else(|| ANONYMOUS_PRINCIPAL.to_string()),
                groups,
                all_access: *all_access,
            },
        });
    }
    Ok(out)
}

/// Whether a spec has collection mounts.
pub fn has_collection_mounts(spec: &SandboxSpec) -> bool {
    spec.mounts
        .iter()
        .any(|m| matches!(m, MountSpec::Collection { .. }))
}

/// The helpers and mounts of every sandbox.
pub struct CollectionMounts {
    root: PathBuf,
    exe: PathBuf,
    /// Helpers this daemon started, by sandbox id, until reaped.
    children: Mutex<HashMap<String, Vec<Child>>>,
}

/// What [`CollectionMounts::reconcile`] did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct ReconcileReport {
    /// Mounts of re-adopted sandboxes still served.
    pub kept: usize,
    /// Sandboxes whose helpers, mounts and directories were removed.
    pub removed: Vec<String>,
    /// Mounts of re-adopted sandboxes whose helper had died (unmounted on the host).
    pub dead: Vec<PathBuf>,
}

impl CollectionMounts {
    /// `exe` is the `sandlot` binary (it has the `__vfs-serve` subcommand).
    pub fn new(data_dir: &Path, exe: PathBuf) -> CollectionMounts {
        // Canonical, as /proc/self/mountinfo shows mount points.
        let data_dir = std::fs::canonicalize(data_dir).unwrap_or_else(|_| data_dir.to_path_buf());
        CollectionMounts {
            root: data_dir.join("vfs-mounts"),
            exe,
            children: Mutex::new(HashMap::new()),
        }
    }

    fn children(&self) -> std::sync::MutexGuard<'_, HashMap<String, Vec<Child>>> {
        self.children.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts a helper per collection mount of `spec` and adds the mounts to `opts` as
    /// read-only binds. Blocking. On failure nothing is left (see [`Self::release`]).
    pub fn prepare(
        &self,
        vfs: &crate::vfs::VfsService,
        id: &str,
        tenant: &str,
        spec: &SandboxSpec,
        opts: &mut sandlot_runtime::CreateOptions,
    ) -> ApiResult<()> {
        if !has_collection_mounts(spec) {
            return Ok(());
        }
        if !Path::new("/dev/fuse").exists() {
            return Err(ApiError::unavailable(
                "collection mounts need FUSE, and this host has no /dev/fuse (load the fuse module)",
            ));
        }
        let store = vfs.store(tenant)?;
        // The helper runs in `/`: give it an absolute path.
        let store_dir =
            std::fs::canonicalize(store.root()).unwrap_or_else(|_| store.root().to_path_buf());
        let planned = plan(&self.root, &store_dir, id, spec).map_err(ApiError::internal)?;
        let res = (|| {
            self.make_dirs(id)?;
            // All helpers start at once; then each is waited for.
            let mut waits = Vec::with_capacity(planned.len());
            for p in &planned {
                waits.push(self.start(id, p)?);
            }
            for (p, rx) in planned.iter().zip(waits) {
                await_ready(p, rx)?;
            }
            Ok(())
        })();
        if let Err(e) = res {
            self.release(id);
            return Err(e);
        }
        for p in planned {
            opts.volumes.push(SharedDir {
                source: p.mountpoint,
                target: p.target,
                readonly: true,
            });
        }
        Ok(())
    }

    fn make_dirs(&self, id: &str) -> ApiResult<()> {
        use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
        let err = |what: &str, p: &Path, e: std::io::Error| {
            ApiError::internal(format!("{what} {}: {e}", p.display()))
        };
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.root)
            .map_err(|e| err("create", &self.root, e))?;
        // Existing from an older daemon with another mode: no host user but root may
        // reach a mount (they are served with `allow_other`).
        std::fs::set_permissions(&self.root, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| err("chmod", &self.root, e))?;
        let dir = self.root.join(id);
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .map_err(|e| err("create", &dir, e))
    }

    /// Starts the helper of one mount; [`await_ready`] waits until it serves.
    fn start(&self, id: &str, p: &PlannedMount) -> ApiResult<ReadyLine> {
        let fail = |what: String| serve_error(p, what);
        std::fs::create_dir(&p.mountpoint)
            .map_err(|e| fail(format!("create {}: {e}", p.mountpoint.display())))?;
        let log = std::fs::File::create(p.mountpoint.with_extension("log"))
            .map_err(|e| fail(format!("create its log: {e}")))?;
        let mut cmd = Command::new(&self.exe);
        cmd.arg(SERVE_ARG)
            .arg(&p.mountpoint)
            .env_clear()
            .current_dir("/")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log));
        // Its own process group: a signal to the daemon's group does not reach it.
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        let mut child = cmd
            .spawn()
            .map_err(|e| fail(format!("start {}: {e}", self.exe.display())))?;
        // Waited for by `release`, never by the orphan reaper.
        sandlot_runtime::orphans::protect(child.id() as i32);
        let request = serde_json::to_vec(&p.request).map_err(ApiError::internal)?;
        let stdin = child.stdin.take();
        let stdout = child.stdout.take();
        self.children()
            .entry(id.to_string())
            .or_default()
            .push(child);
        let mut stdin = stdin.ok_or_else(|| fail("no stdin".into()))?;
        stdin
            .write_all(&request)
            .map_err(|e| fail(format!("send the request: {e}")))?;
        drop(stdin);
        let stdout = stdout.ok_or_else(|| fail("no stdout".into()))?;
        // The first line is `ready` or `error: ...`; read it on a thread so that a
        // helper that hangs is given up on (and killed by the caller's release).
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let r = std::io::BufReader::new(stdout)
                .take(64 * 1024)
                .read_line(&mut line);
            let _ = tx.send(r.map(|_| line));
        });
        Ok(rx)
    }

    /// Moves the helpers of sandbox `id` into its cgroup (their memory and CPU count
    /// against it; its teardown kills them). A failure is logged: the helpers then stay
    /// the daemon's and are removed by [`Self::release`] all the same.
    pub fn attach(&self, id: &str, inst: &dyn sandlot_runtime::Instance) {
        for c in self.children().get(id).into_iter().flatten() {
            if let Err(e) = inst.add_helper(c.id() as i32) {
                tracing::warn!(sandbox_id = %id, "move collection mount helper {} into the sandbox's cgroup: {e}", c.id());
            }
        }
    }

    /// Unmounts, stops the helpers of and removes everything of sandbox `id`
    /// (idempotent; a sandbox without collection mounts costs one `stat`).
    pub fn release(&self, id: &str) {
        let dir = self.root.join(id);
        let children = self.children().remove(id).unwrap_or_default();
        if children.is_empty() && !dir.exists() {
            return;
        }
        // Unmount first: the helper's session ends; a dead helper's mount goes too.
        for m in mounts_under(&dir) {
            unmount(&m);
        }
        let mut children = children;
        for (pid, _) in helpers_under(&self.root, &dir) {
            let ours = children.iter().position(|c| c.id() as i32 == pid);
            kill_helper(pid, &self.root, &dir);
            if let Some(i) = ours {
                let mut c = children.swap_remove(i);
                let _ = c.wait();
                sandlot_runtime::orphans::unprotect(c.id() as i32);
            }
        }
        for mut c in children {
            // Already exited (or never got to mount): reap it.
            let _ = c.kill();
            let _ = c.wait();
            sandlot_runtime::orphans::unprotect(c.id() as i32);
        }
        remove_dir(&dir);
    }

    /// On daemon start: keeps the mounts of the re-adopted sandboxes `live` whose
    /// helpers still serve, unmounts those whose helper died, and removes every
    /// helper, mount and directory of any other sandbox.
    pub fn reconcile(&self, live: &[String]) -> ReconcileReport {
        let mut rep = ReconcileReport::default();
        let mut ids: Vec<String> = std::fs::read_dir(&self.root)
            .map(|rd| {
                rd.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        // Helpers or mounts whose directory is gone still name their sandbox.
        let helpers = helpers_under(&self.root, &self.root);
        let mounts = mounts_under(&self.root);
        for p in helpers.iter().map(|(_, p)| p).chain(mounts.iter()) {
            if let Some(id) = sandbox_of(&self.root, p) {
                if !ids.contains(&id) {
                    ids.push(id);
                }
            }
        }
        for id in ids {
            if !live.contains(&id) {
                self.release(&id);
                rep.removed.push(id);
                continue;
            }
            let dir = self.root.join(&id);
            for m in mounts.iter().filter(|m| m.starts_with(&dir)) {
                if helpers.iter().any(|(_, p)| p == m) {
                    rep.kept += 1;
                } else {
                    tracing::warn!(sandbox_id = %id, mount = %m.display(),
                        "the helper serving this collection mount died while the daemon was down: \
                         unmounted; reads in the sandbox there fail until it is recreated");
                    unmount(m);
                    rep.dead.push(m.clone());
                }
            }
            // A helper whose mount is gone serves nothing.
            for (pid, p) in helpers.iter().filter(|(_, p)| p.starts_with(&dir)) {
                if !mounts.contains(p) {
                    kill_helper(*pid, &self.root, &dir);
                }
            }
        }
        rep
    }
}

/// The first line a helper answers, once read.
type ReadyLine = std::sync::mpsc::Receiver<std::io::Result<String>>;

fn serve_error(p: &PlannedMount, what: String) -> ApiError {
    ApiError::internal(format!(
        "mounts[{}]: serve collection {:?}: {what}",
        p.index, p.request.collection
    ))
}

/// Waits (blocking on the helper's answer, no polling) until the helper of `p`
/// has mounted, or fails.
fn await_ready(p: &PlannedMount, rx: ReadyLine) -> ApiResult<()> {
    let fail = |what: String| serve_error(p, what);
    match rx.recv_timeout(READY_TIMEOUT) {
        Ok(Ok(line)) => match line.trim_end() {
            "ready" => Ok(()),
            "" => Err(fail(format!(
                "the helper exited without mounting; see {}",
                p.mountpoint.with_extension("log").display()
            ))),
            l => match l.strip_prefix("error: ") {
                Some(msg) => Err(fail(msg.to_string())),
                None => Err(fail(format!("unexpected answer {l:?}"))),
            },
        },
        Ok(Err(e)) => Err(fail(format!("read its answer: {e}"))),
        Err(_) => Err(fail(format!(
            "not mounted after {}s",
            READY_TIMEOUT.as_secs()
        ))),
    }
}

/// The sandbox id of a path under `root` (`root/ID/...`).
fn sandbox_of(root: &Path, p: &Path) -> Option<String> {
    let rel = p.strip_prefix(root).ok()?;
    let first = rel.components().next()?;
    Some(first.as_os_str().to_string_lossy().into_owned())
}

/// Mount points at or under `dir` (host mount namespace), deepest first.
fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut v = mount_points_under(&info, dir);
    v.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    v
}

/// Helpers (`sandlot __vfs-serve MOUNTPOINT`) serving a mount point at or under `dir`,
/// `dir` being under `root`: (pid, mount point).
fn helpers_under(root: &Path, dir: &Path) -> Vec<(i32, PathBuf)> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return out;
    };
    for e in rd.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        if let Some(mp) = helper_mountpoint(pid) {
            if mp.starts_with(root) && mp.starts_with(dir) {
                out.push((pid, mp));
            }
        }
    }
    out
}

/// The mount point a process serves, if it is a `__vfs-serve` helper.
fn helper_mountpoint(pid: i32) -> Option<PathBuf> {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    parse_helper_cmdline(&cmdline)
}

/// `EXE\0__vfs-serve\0MOUNTPOINT\0` → MOUNTPOINT. Pure.
pub fn parse_helper_cmdline(cmdline: &[u8]) -> Option<PathBuf> {
    use std::os::unix::ffi::OsStrExt;
    let mut args = cmdline.split(|b| *b == 0);
    args.next()?;
    if args.next()? != SERVE_ARG.as_bytes() {
        return None;
    }
    let mp = args.next()?;
    if mp.is_empty() || !mp.starts_with(b"/") {
        return None;
    }
    Some(PathBuf::from(std::ffi::OsStr::from_bytes(mp)))
}

/// Kills helper `pid` if it still serves under `dir` (checked through a pidfd, so a
/// recycled pid is never signalled), and waits for it to exit.
fn kill_helper(pid: i32, root: &Path, dir: &Path) {
    use rustix::process::{pidfd_open, pidfd_send_signal, Pid, PidfdFlags, Signal};
    let Some(p) = Pid::from_raw(pid) else {
        return;
    };
    let Ok(fd) = pidfd_open(p, PidfdFlags::empty()) else {
        return;
    };
    // Re-checked after the pidfd pins the process.
    if !helper_mountpoint(pid).is_some_and(|m| m.starts_with(root) && m.starts_with(dir)) {
        return;
    }
    let _ = pidfd_send_signal(&fd, Signal::KILL);
    let deadline = Instant::now() + EXIT_WAIT;
    // The pidfd becomes readable when the process exits (reaped or not).
    while Instant::now() < deadline {
        let mut fds = [rustix::event::PollFd::new(
            &fd,
            rustix::event::PollFlags::IN,
        )];
        let t = rustix::event::Timespec {
            tv_sec: 0,
            tv_nsec: 100_000_000,
        };
        if rustix::event::poll(&mut fds, Some(&t)).unwrap_or(0) > 0 {
            return;
        }
    }
    tracing::warn!(
        pid,
        "collection mount helper did not exit within {EXIT_WAIT:?} of SIGKILL"
    );
}

/// Lazily unmounts `p` (every mount stacked there).
fn unmount(p: &Path) {
    for _ in 0..8 {
        match rustix::mount::unmount(p, rustix::mount::UnmountFlags::DETACH) {
            Ok(()) => {}
            Err(rustix::io::Errno::INVAL) | Err(rustix::io::Errno::NOENT) => return,
            Err(e) => {
                tracing::warn!(mount = %p.display(), "unmount collection mount: {e}");
                return;
            }
        }
    }
}

/// Removes a sandbox's directory: logs and (unmounted) mount points, never
/// recursing into a mount that is still there.
fn remove_dir(dir: &Path) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let p = e.path();
        let is_dir = e.file_type().map(|t| t.is_dir()).unwrap_or(false);
        let r = if is_dir {
            std::fs::remove_dir(&p)
        } else {
            std::fs::remove_file(&p)
        };
        if let Err(err) = r {
            tracing::warn!(path = %p.display(), "remove collection mount leftover: {err}");
        }
    }
    if let Err(e) = std::fs::remove_dir(dir) {
        tracing::warn!(path = %dir.display(), "remove collection mount directory: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(json: &str) -> SandboxSpec {
        SandboxSpec::from_json(json).unwrap()
    }

    #[test]
    fn plan_numbers_mounts_by_spec_index_and_defaults_to_anonymous() {
        let s = spec(
            r#"{"mounts": [
                {"type": "tmpfs", "target": "/t"},
                {"type": "collection", "collection": "docs", "target": "/docs/", "version": 4},
                {"type": "collection", "collection": "kb", "target": "/kb", "version": 1,
                 "principal": "alice", "groups": ["ops", "eng", "ops"]}
            ]}"#,
        );
        let p = plan(
            Path::new("/d/vfs-mounts"),
            Path::new("/d/vfs/t/x"),
            "sb-1",
            &s,
        )
        .unwrap();
        assert_eq!(p.len(), 2);
        assert_eq!(p[0].index, 1);
        assert_eq!(p[0].mountpoint, Path::new("/d/vfs-mounts/sb-1/1"));
        assert_eq!(p[0].target, "/docs");
        assert_eq!(p[0].request.principal, ANONYMOUS_PRINCIPAL);
        assert_eq!(p[0].request.version, 4);
        assert!(p[0].request.groups.is_empty() && !p[0].request.all_access);
        assert_eq!(p[1].mountpoint, Path::new("/d/vfs-mounts/sb-1/2"));
        assert_eq!(p[1].request.principal, "alice");
        assert_eq!(p[1].request.groups, vec!["eng", "ops"]);
        assert_eq!(p[1].request.store, Path::new("/d/vfs/t/x"));
        // An unpinned version is a bug of the caller, not a default.
        let unpinned =
            spec(r#"{"mounts": [{"type": "collection", "collection": "d", "target": "/d"}]}"#);
        assert!(plan(Path::new("/r"), Path::new("/s"), "x", &unpinned).is_err());
        assert!(!has_collection_mounts(&spec("{}")));
        assert!(has_collection_mounts(&unpinned));
    }

    #[test]
    fn helpers_are_recognised_by_their_command_line_only() {
        assert_eq!(
            parse_helper_cmdline(b"/usr/bin/sandlot\0__vfs-serve\0/d/vfs-mounts/sb/0\0"),
            Some(PathBuf::from("/d/vfs-mounts/sb/0"))
        );
        assert_eq!(parse_helper_cmdline(b"/usr/bin/sandlot\0serve\0/x\0"), None);
        assert_eq!(parse_helper_cmdline(b"/bin/sh\0__vfs-serve\0rel\0"), None);
        assert_eq!(parse_helper_cmdline(b"sandlot\0__vfs-serve\0"), None);
        assert_eq!(parse_helper_cmdline(b""), None);
    }

    #[test]
    fn mount_points_are_found_under_a_directory_with_escapes() {
        let info = "\
36 35 98:0 / /mnt1 rw,noatime master:1 - ext3 /dev/root rw
100 36 0:50 / /data/vfs-mounts/sb-1/0 ro,nosuid,nodev - fuse.sandlot sandlot-vfs:docs ro
101 36 0:51 / /data/vfs-mounts/sb-1/1 ro - fuse.sandlot sandlot-vfs:kb ro
102 36 0:52 / /data/vfs-mounts/sb-2/0 ro - fuse.sandlot sandlot-vfs:kb ro
103 36 0:53 / /data/vfs-mounts/sb\\0401/0 ro - fuse.sandlot x ro
104 36 0:54 / /data/vfs-mounts-other/sb-1/0 ro - fuse.sandlot x ro
";
        let root = Path::new("/data/vfs-mounts");
        let sb1 = mount_points_under(info, &root.join("sb-1"));
        assert_eq!(
            sb1,
            vec![
                PathBuf::from("/data/vfs-mounts/sb-1/0"),
                PathBuf::from("/data/vfs-mounts/sb-1/1")
            ]
        );
        let all = mount_points_under(info, root);
        assert_eq!(all.len(), 4, "{all:?}");
        assert!(all.contains(&PathBuf::from("/data/vfs-mounts/sb 1/0")));
        assert_eq!(
            sandbox_of(root, Path::new("/data/vfs-mounts/sb-2/0")).as_deref(),
            Some("sb-2")
        );
        assert_eq!(sandbox_of(root, Path::new("/elsewhere")), None);
    }
}
